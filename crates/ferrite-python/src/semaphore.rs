//! `HalSemaphore`: a timeline semaphore, with waits that release the GIL.

use crate::status::{to_py_err, PyContext};
use ferrite_base::{Deadline, Status, StatusCode, Timeout};
use ferrite_hal::semaphore::Semaphore;
use ferrite_vm::Ref;
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::vm::PyVmRef;

/// A HAL timeline semaphore.
#[pyclass(name = "HalSemaphore", module = "ferrite._ferrite", frozen, weakref)]
pub struct PyHalSemaphore {
    pub semaphore: Arc<Semaphore>,
}

/// Upstream's `timeout=` (relative ns) / `deadline=` (absolute ns of the
/// monotonic clock, as `time.monotonic_ns()`) pair as one [`Timeout`];
/// neither means wait forever.
pub fn timeout_of(
    py: Python<'_>,
    timeout: Option<i64>,
    deadline: Option<i64>,
) -> PyResult<Timeout> {
    match (timeout, deadline) {
        (Some(_), Some(_)) => Err(PyValueError::new_err(
            "timeout and deadline cannot both be set",
        )),
        (None, None) => Ok(Timeout::INFINITE),
        (Some(t), None) if t == i64::MAX => Ok(Timeout::INFINITE),
        (Some(t), None) => Ok(Timeout::Relative(t.max(0) as u64)),
        (None, Some(d)) if d == i64::MAX => Ok(Timeout::INFINITE),
        (None, Some(d)) => {
            let now: i64 = py.import("time")?.call_method0("monotonic_ns")?.extract()?;
            if d <= now {
                return Ok(Timeout::IMMEDIATE);
            }
            let left = Duration::from_nanos((d - now) as u64);
            Ok(Timeout::Absolute(
                Instant::now()
                    .checked_add(left)
                    .map_or(Deadline::InfiniteFuture, Deadline::At),
            ))
        }
    }
}

/// The status `fail(message)` records: UNKNOWN with the caller's message.
pub fn failure_status(message: &str) -> Status {
    Status::new(StatusCode::Unknown, message)
}

#[pymethods]
impl PyHalSemaphore {
    fn query(&self) -> PyResult<u64> {
        self.semaphore.query().py_context("querying semaphore")
    }

    fn signal(&self, new_value: &Bound<'_, PyAny>) -> PyResult<()> {
        let new_value: u64 = crate::args::uint(new_value, "new_value")?;
        self.semaphore
            .signal(new_value)
            .py_context("signaling semaphore")
    }

    fn fail(&self, message: &str) {
        self.semaphore.fail(failure_status(message));
    }

    /// True once the payload reaches `payload`, False on timeout; raises the
    /// semaphore's failure. The GIL is released while blocked.
    #[pyo3(signature = (payload, timeout = None, deadline = None))]
    fn wait(
        &self,
        py: Python<'_>,
        payload: &Bound<'_, PyAny>,
        timeout: Option<i64>,
        deadline: Option<i64>,
    ) -> PyResult<bool> {
        let payload: u64 = crate::args::uint(payload, "payload")?;
        let t = timeout_of(py, timeout, deadline)?;
        let sem = self.semaphore.clone();
        match py.allow_threads(move || sem.wait(payload, t)) {
            Ok(()) => {}
            Err(e) if e.code() == StatusCode::DeadlineExceeded => return Ok(false),
            Err(e) => {
                let status = self.semaphore.failure().unwrap_or(e);
                return Err(to_py_err("synchronous semaphore failure", &status));
            }
        }
        self.semaphore
            .query()
            .py_context("asynchronous semaphore failure")?;
        Ok(true)
    }

    #[getter]
    fn r#ref(&self) -> PyVmRef {
        PyVmRef(Ref::from_arc(self.semaphore.clone()))
    }

    #[getter]
    fn __iree_vm_ref__(&self) -> PyVmRef {
        self.r#ref()
    }

    fn __eq__(&self, other: &Bound<'_, PyAny>) -> bool {
        match other.downcast::<PyHalSemaphore>() {
            Ok(o) => Arc::ptr_eq(&o.get().semaphore, &self.semaphore),
            Err(_) => false,
        }
    }

    fn __hash__(&self) -> u64 {
        Arc::as_ptr(&self.semaphore) as usize as u64
    }

    /// Exports timepoint `value` into `out_external_timepoint` (see
    /// `HalExternalTimepoint`).
    fn export_timepoint(
        &self,
        value: u64,
        requested_type: &Bound<'_, PyAny>,
        requested_flags: &Bound<'_, PyAny>,
        out_external_timepoint: &Bound<'_, crate::external_timepoint::PyHalExternalTimepoint>,
    ) -> PyResult<()> {
        crate::external_timepoint::export_timepoint(
            self,
            value,
            requested_type,
            requested_flags,
            out_external_timepoint,
        )
    }

    /// Imports an external timepoint as `value` of this semaphore.
    fn import_timepoint(
        &self,
        value: u64,
        timepoint: PyRef<'_, crate::external_timepoint::PyHalExternalTimepoint>,
    ) -> PyResult<()> {
        crate::external_timepoint::import_timepoint(self, value, &timepoint)
    }

    fn __repr__(&self) -> String {
        match self.semaphore.query() {
            Ok(v) => format!("<HalSemaphore value={v}>"),
            Err(e) => format!("<HalSemaphore failed: {e}>"),
        }
    }
}
