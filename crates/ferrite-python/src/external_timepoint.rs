//! `HalExternalTimepoint`: a semaphore timepoint exported to (or imported
//! from) a wait primitive outside the HAL.
//!
//! The CPU devices export `ASYNC_PRIMITIVE` timepoints: a host event set when
//! the semaphore reaches the value (HOST_ONLY compatibility, as upstream's
//! CPU drivers report), which another semaphore may import (it is then
//! signalled when the event fires). Device events (CUDA, HIP) are not theirs
//! to export or import: UNIMPLEMENTED, as upstream's CPU drivers answer.

use crate::semaphore::PyHalSemaphore;
use crate::status::PyContext;
use crate::vm::int_of;
use ferrite_base::{Status, StatusCode};
use ferrite_hal::semaphore::ExportedTimepoint;
use pyo3::prelude::*;
use std::sync::Arc;

/// `ExternalTimepointType` values.
pub const TYPE_NONE: u32 = 0;
/// An async (host) wait primitive.
pub const TYPE_ASYNC_PRIMITIVE: u32 = 1;
/// `SemaphoreCompatibility.HOST_ONLY`: host wait and host signal.
pub const COMPATIBILITY_HOST_ONLY: u32 = 5;

/// An external timepoint: its type, flags and compatibility, and for an
/// exported async primitive the event behind it.
#[pyclass(name = "HalExternalTimepoint", module = "ferrite._ferrite")]
#[derive(Default)]
pub struct PyHalExternalTimepoint {
    kind: u32,
    flags: u32,
    compatibility: u32,
    exported: Option<Arc<ExportedTimepoint>>,
}

/// Python-visible attributes return upstream's enum members when the enum
/// module is importable, else plain ints.
fn enum_member(py: Python<'_>, enum_name: &str, value: u32) -> PyResult<PyObject> {
    let binding = py.import("ferrite.runtime._binding")?;
    let cls = binding.getattr(enum_name)?;
    Ok(cls.call1((value,))?.unbind())
}

#[pymethods]
impl PyHalExternalTimepoint {
    #[new]
    fn new() -> Self {
        PyHalExternalTimepoint::default()
    }

    #[getter]
    fn r#type(&self, py: Python<'_>) -> PyResult<PyObject> {
        enum_member(py, "ExternalTimepointType", self.kind)
    }

    #[getter]
    fn flags(&self, py: Python<'_>) -> PyResult<PyObject> {
        enum_member(py, "ExternalTimepointFlags", self.flags)
    }

    #[getter]
    fn compatibility(&self, py: Python<'_>) -> PyResult<PyObject> {
        enum_member(py, "SemaphoreCompatibility", self.compatibility)
    }

    /// The CUDA event handle; 0 (the CPU devices export none).
    #[getter]
    fn cuda_event(&self) -> u64 {
        0
    }

    /// The HIP event handle; 0 (the CPU devices export none).
    #[getter]
    fn hip_event(&self) -> u64 {
        0
    }

    /// Beyond upstream: for an exported async primitive, True once the
    /// timepoint is reached; raises the semaphore's failure. None when this
    /// timepoint holds no primitive.
    fn is_reached(&self) -> PyResult<Option<bool>> {
        use ferrite_base::wait::WaitSource;
        match &self.exported {
            None => Ok(None),
            Some(t) => t
                .event()
                .poll()
                .py_context("querying external timepoint")
                .map(Some),
        }
    }

    fn __repr__(&self) -> String {
        format!(
            "<HalExternalTimepoint type={} flags={} compatibility={}>",
            self.kind, self.flags, self.compatibility
        )
    }
}

/// `HalSemaphore.export_timepoint`.
pub fn export_timepoint(
    semaphore: &PyHalSemaphore,
    value: u64,
    requested_type: &Bound<'_, PyAny>,
    requested_flags: &Bound<'_, PyAny>,
    out: &Bound<'_, PyHalExternalTimepoint>,
) -> PyResult<()> {
    let kind = int_of::<u32>(requested_type)?;
    let flags = int_of::<u32>(requested_flags)?;
    if kind != TYPE_ASYNC_PRIMITIVE {
        return Err(Status::new(
            StatusCode::Unimplemented,
            format!(
                "timepoint export of type {kind} is not supported by the CPU devices \
                 (only ASYNC_PRIMITIVE, {TYPE_ASYNC_PRIMITIVE})"
            ),
        ))
        .py_context("exporting timepoint");
    }
    let exported = semaphore.semaphore.export_timepoint(value);
    let mut o = out.borrow_mut();
    o.kind = kind;
    o.flags = flags;
    o.compatibility = COMPATIBILITY_HOST_ONLY;
    o.exported = Some(Arc::new(exported));
    Ok(())
}

/// `HalSemaphore.import_timepoint`: an async primitive exported by a CPU
/// device's semaphore signals `semaphore` to `value` once reached; other
/// timepoints are UNIMPLEMENTED, as upstream's CPU drivers answer.
pub fn import_timepoint(
    semaphore: &PyHalSemaphore,
    value: u64,
    timepoint: &PyHalExternalTimepoint,
) -> PyResult<()> {
    match (&timepoint.exported, timepoint.kind) {
        (Some(t), TYPE_ASYNC_PRIMITIVE) => {
            semaphore.semaphore.import_timepoint(value, t);
            Ok(())
        }
        (_, TYPE_NONE) => Err(Status::new(
            StatusCode::Unimplemented,
            "an empty timepoint (type NONE) cannot be imported",
        ))
        .py_context("importing timepoint"),
        (_, kind) => Err(Status::new(
            StatusCode::Unimplemented,
            format!("timepoint import of type {kind} is not supported by the CPU devices"),
        ))
        .py_context("importing timepoint"),
    }
}
