//! `HalModuleDebugSink`: receives the `hal.buffer_view.trace` calls of the
//! `hal` module it is given to (`create_hal_module(..., debug_sink=)`).

use crate::hal::PyHalBufferView;
use ferrite_base::{Status, StatusCode};
use ferrite_hal::buffer_view::BufferView;
use ferrite_hal_module::TraceSink;
use pyo3::prelude::*;
use pyo3::types::PyList;
use pyo3::{PyTraverseError, PyVisit};
use std::sync::{Arc, Mutex};

/// Holds the Python callback `callback(key: str, views: list[HalBufferView])`.
#[pyclass(
    name = "HalModuleDebugSink",
    module = "ferrite._ferrite",
    frozen,
    weakref
)]
pub struct PyHalModuleDebugSink {
    /// Cleared by the garbage collector when it breaks a cycle through it.
    callback: Mutex<Option<PyObject>>,
}

impl PyHalModuleDebugSink {
    /// The trace sink the `hal` module calls: it takes the GIL and calls
    /// the callback; an exception becomes an UNKNOWN status that fails the
    /// program's call.
    pub fn trace_sink(sink: Py<PyHalModuleDebugSink>) -> Arc<TraceSink> {
        Arc::new(move |key: &str, views: &[BufferView]| {
            Python::with_gil(|py| {
                let callback = sink
                    .get()
                    .callback
                    .lock()
                    .ok()
                    .and_then(|c| c.as_ref().map(|c| c.clone_ref(py)));
                let Some(callback) = callback else {
                    return Ok(());
                };
                let call = || -> PyResult<()> {
                    let objs = views
                        .iter()
                        .map(|v| {
                            Py::new(
                                py,
                                PyHalBufferView {
                                    view: Arc::new(v.clone()),
                                },
                            )
                        })
                        .collect::<PyResult<Vec<_>>>()?;
                    callback.call1(py, (key, PyList::new(py, objs)?))?;
                    Ok(())
                };
                call().map_err(|e| Status::new(StatusCode::Unknown, e.to_string()))
            })
        })
    }
}

#[pymethods]
impl PyHalModuleDebugSink {
    #[new]
    #[pyo3(signature = (buffer_view_trace_callback = None))]
    fn new(buffer_view_trace_callback: Option<PyObject>) -> Self {
        PyHalModuleDebugSink {
            callback: Mutex::new(buffer_view_trace_callback),
        }
    }

    #[getter]
    fn buffer_view_trace_callback(&self, py: Python<'_>) -> Option<PyObject> {
        self.callback
            .lock()
            .ok()
            .and_then(|c| c.as_ref().map(|c| c.clone_ref(py)))
    }

    fn __traverse__(&self, visit: PyVisit<'_>) -> Result<(), PyTraverseError> {
        if let Ok(c) = self.callback.try_lock() {
            if let Some(c) = c.as_ref() {
                visit.call(c)?;
            }
        }
        Ok(())
    }

    fn __clear__(&self) {
        if let Ok(mut c) = self.callback.try_lock() {
            c.take();
        }
    }
}
