//! Maps Ferrite statuses onto the exceptions upstream raises for each code,
//! with upstream's message shape: `<context>: <CODE>; <message>`.

use ferrite_base::status::{Status, StatusCode};
use pyo3::exceptions::{PyIndexError, PyNotImplementedError, PyRuntimeError, PyValueError};
use pyo3::{PyErr, Python};
use std::cell::RefCell;

thread_local! {
    /// The last exception a Python module function raised on this thread,
    /// with the text it was reported under.
    static PYTHON_CAUSE: RefCell<Option<(String, PyErr)>> = const { RefCell::new(None) };
}

/// Keeps `e`, raised by Python code the VM called, so that the error the
/// VM returns for it carries it as `__cause__` (upstream reports only its
/// text).
pub fn stash_python_cause(e: PyErr) {
    let text = Python::with_gil(|py| e.value(py).to_string());
    PYTHON_CAUSE.with(|c| *c.borrow_mut() = Some((text, e)));
}

/// The Python exception for `status`, its message prefixed by `context`.
pub fn to_py_err(context: &str, status: &Status) -> PyErr {
    let message = format!("{context}: {status}");
    let err = match status.code() {
        StatusCode::InvalidArgument | StatusCode::NotFound => PyValueError::new_err(message),
        StatusCode::OutOfRange => PyIndexError::new_err(message),
        StatusCode::Unimplemented => PyNotImplementedError::new_err(message),
        _ => PyRuntimeError::new_err(message),
    };
    if let Some((text, cause)) = PYTHON_CAUSE.with(|c| c.borrow_mut().take()) {
        // Only when this status reports that exception.
        if status.to_string().contains(&text) {
            Python::with_gil(|py| err.set_cause(py, Some(cause)));
        }
    }
    err
}

/// `Result` adapter: `.py_context("Error invoking function")?`.
pub trait PyContext<T> {
    fn py_context(self, context: &str) -> pyo3::PyResult<T>;
}

impl<T> PyContext<T> for ferrite_base::Result<T> {
    fn py_context(self, context: &str) -> pyo3::PyResult<T> {
        self.map_err(|s| to_py_err(context, &s))
    }
}
