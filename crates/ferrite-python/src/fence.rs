//! `HalFence`: a set of semaphore timepoints, usable as a VM ref (so fences
//! pass into `hal` module functions such as async-external entry points).

use crate::semaphore::{failure_status, timeout_of, PyHalSemaphore};
use crate::status::{to_py_err, PyContext};
use crate::vm::PyVmRef;
use ferrite_base::StatusCode;
use ferrite_hal::fence::Fence;
use ferrite_vm::Ref;
use pyo3::exceptions::{PyRuntimeError, PyTypeError};
use pyo3::prelude::*;
use pyo3::types::PyTuple;
use std::sync::Arc;

/// A HAL fence.
#[pyclass(name = "HalFence", module = "ferrite._ferrite", frozen, weakref)]
pub struct PyHalFence {
    pub fence: Arc<Fence>,
    /// Distinct semaphores this fence may hold: upstream's fences have a
    /// fixed capacity and refuse more (RESOURCE_EXHAUSTED); Ferrite's
    /// core fences grow, and the Python class enforces the same limit.
    capacity: usize,
}

/// Largest capacity upstream's fence storage takes.
const MAX_CAPACITY: u64 = 65534;

impl PyHalFence {
    /// A fence made elsewhere (e.g. returned by a program): no limit.
    pub fn wrap(fence: Arc<Fence>) -> PyHalFence {
        PyHalFence {
            fence,
            capacity: usize::MAX,
        }
    }

    /// Semaphores of `incoming` that this fence does not hold yet.
    fn new_semaphores(&self, incoming: &[(Arc<ferrite_hal::Semaphore>, u64)]) -> usize {
        let held = self.fence.timepoints();
        let mut fresh: Vec<&Arc<ferrite_hal::Semaphore>> = Vec::new();
        for (s, _) in incoming {
            if !held.iter().any(|(h, _)| Arc::ptr_eq(h, s))
                && !fresh.iter().any(|f| Arc::ptr_eq(f, s))
            {
                fresh.push(s);
            }
        }
        fresh.len()
    }

    fn check_room(
        &self,
        what: &str,
        incoming: &[(Arc<ferrite_hal::Semaphore>, u64)],
    ) -> PyResult<()> {
        if self.fence.timepoint_count() + self.new_semaphores(incoming) > self.capacity {
            return Err(PyRuntimeError::new_err(format!(
                "{what}: RESOURCE_EXHAUSTED; fence unique semaphore capacity {} reached",
                self.capacity
            )));
        }
        Ok(())
    }
}

/// Upstream's `HalSemaphoreList` argument: a `HalFence`, or a sequence of
/// `(HalSemaphore, payload)` pairs, as one fence.
pub fn fence_of(obj: &Bound<'_, PyAny>, what: &str) -> PyResult<Arc<Fence>> {
    if let Ok(f) = obj.downcast::<PyHalFence>() {
        return Ok(f.get().fence.clone());
    }
    let bad = || {
        PyTypeError::new_err(format!(
            "{what} must be a HalFence or a list of (HalSemaphore, int) tuples, got {}",
            obj.get_type()
                .name()
                .map(|n| n.to_string())
                .unwrap_or_default()
        ))
    };
    let fence = Fence::new();
    for (i, item) in obj.try_iter().map_err(|_| bad())?.enumerate() {
        let item = item?;
        let pair = item.downcast::<PyTuple>().ok().filter(|t| t.len() == 2);
        let Some(pair) = pair else {
            return Err(PyTypeError::new_err(format!(
                "{what}[{i}] must be a (HalSemaphore, int) tuple"
            )));
        };
        let sem = pair.get_item(0)?;
        let sem = sem.downcast::<PyHalSemaphore>().map_err(|_| {
            PyTypeError::new_err(format!(
                "{what}[{i}][0] must be a HalSemaphore, got {}",
                sem.get_type()
                    .name()
                    .map(|n| n.to_string())
                    .unwrap_or_default()
            ))
        })?;
        let value: u64 = pair.get_item(1)?.extract().map_err(|_| {
            PyTypeError::new_err(format!("{what}[{i}][1] must be a non-negative int"))
        })?;
        fence.insert(sem.get().semaphore.clone(), value);
    }
    Ok(Arc::new(fence))
}

#[pymethods]
impl PyHalFence {
    /// An empty fence for at most `capacity` distinct semaphores (at most
    /// 65534, as upstream's storage).
    #[new]
    fn new(capacity: &Bound<'_, PyAny>) -> PyResult<Self> {
        let capacity: u64 = crate::args::uint(capacity, "HalFence capacity")?;
        if capacity > MAX_CAPACITY {
            return Err(PyRuntimeError::new_err(format!(
                "creating fence: RESOURCE_EXHAUSTED; capacity {capacity} is too large for \
                 fence storage (at most {MAX_CAPACITY})"
            )));
        }
        Ok(PyHalFence {
            fence: Arc::new(Fence::new()),
            capacity: capacity as usize,
        })
    }

    #[staticmethod]
    fn create_at(sem: &PyHalSemaphore, value: u64) -> Self {
        PyHalFence {
            fence: Arc::new(Fence::create_at(sem.semaphore.clone(), value)),
            capacity: 1,
        }
    }

    /// The union of `fences` (per semaphore the largest value), sized to
    /// what it holds. `join([])` is an empty fence, already reached
    /// (upstream returns a null object there that fails on first use).
    #[staticmethod]
    fn join(fences: Vec<PyRef<'_, PyHalFence>>) -> Self {
        let refs: Vec<&Fence> = fences.iter().map(|f| &*f.fence).collect();
        let fence = Fence::join(&refs);
        let capacity = fence.timepoint_count();
        PyHalFence {
            fence: Arc::new(fence),
            capacity,
        }
    }

    #[getter]
    fn timepoint_count(&self) -> usize {
        self.fence.timepoint_count()
    }

    fn insert(&self, sem: &PyHalSemaphore, value: u64) -> PyResult<()> {
        self.check_room("inserting into fence", &[(sem.semaphore.clone(), value)])?;
        self.fence.insert(sem.semaphore.clone(), value);
        Ok(())
    }

    fn extend(&self, from_fence: &PyHalFence) -> PyResult<()> {
        self.check_room("extending fence", &from_fence.fence.timepoints())?;
        self.fence.extend(&from_fence.fence);
        Ok(())
    }

    fn fail(&self, message: &str) {
        self.fence.fail(failure_status(message));
    }

    fn signal(&self) -> PyResult<()> {
        self.fence.signal().py_context("signalling fence")
    }

    /// True once every timepoint is reached, False on timeout; raises a
    /// semaphore's failure. The GIL is released while blocked.
    #[pyo3(signature = (timeout = None, deadline = None))]
    fn wait(&self, py: Python<'_>, timeout: Option<i64>, deadline: Option<i64>) -> PyResult<bool> {
        let t = timeout_of(py, timeout, deadline)?;
        let fence = self.fence.clone();
        match py.allow_threads(move || fence.wait(t)) {
            Ok(true) => {}
            Ok(false) => return Ok(false),
            Err(e) if e.code() == StatusCode::DeadlineExceeded => return Ok(false),
            Err(e) => return Err(to_py_err("synchronous fence failure", &e)),
        }
        self.fence
            .query()
            .py_context("asynchronous fence failure")?;
        Ok(true)
    }

    #[getter]
    fn r#ref(&self) -> PyVmRef {
        PyVmRef(Ref::from_arc(self.fence.clone()))
    }

    #[getter]
    fn __iree_vm_ref__(&self) -> PyVmRef {
        self.r#ref()
    }

    fn __eq__(&self, other: &Bound<'_, PyAny>) -> bool {
        match other.downcast::<PyHalFence>() {
            Ok(o) => Arc::ptr_eq(&o.get().fence, &self.fence),
            Err(_) => false,
        }
    }

    fn __hash__(&self) -> u64 {
        Arc::as_ptr(&self.fence) as usize as u64
    }

    fn __repr__(&self) -> String {
        let tps: Vec<String> = self
            .fence
            .timepoints()
            .iter()
            .map(|(s, v)| match s.query() {
                Ok(cur) => format!("{cur}/{v}"),
                Err(_) => format!("failed/{v}"),
            })
            .collect();
        format!("<HalFence [{}]>", tps.join(", "))
    }
}
