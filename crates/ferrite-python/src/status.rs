//! Maps Ferrite statuses onto the exceptions upstream raises for each code,
//! with upstream's message shape: `<context>: <CODE>; <message>`.

use ferrite_base::status::{Status, StatusCode};
use pyo3::exceptions::{PyIndexError, PyNotImplementedError, PyRuntimeError, PyValueError};
use pyo3::PyErr;

/// The Python exception for `status`, its message prefixed by `context`.
pub fn to_py_err(context: &str, status: &Status) -> PyErr {
    let message = format!("{context}: {status}");
    match status.code() {
        StatusCode::InvalidArgument | StatusCode::NotFound => PyValueError::new_err(message),
        StatusCode::OutOfRange => PyIndexError::new_err(message),
        StatusCode::Unimplemented => PyNotImplementedError::new_err(message),
        _ => PyRuntimeError::new_err(message),
    }
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
