//! Integer arguments with upstream's exception types.
//!
//! Upstream's bindings (nanobind) answer an int that does not fit the C
//! parameter type (negative for an unsigned one, or too large) with
//! `TypeError` ("incompatible function arguments"); PyO3 raises
//! `OverflowError`. Code written for upstream catches `TypeError`, so the
//! arguments taken through [`uint`] raise that, naming the argument and
//! the range.

use pyo3::exceptions::{PyOverflowError, PyTypeError};
use pyo3::prelude::*;

/// `obj` as an unsigned integer type `T`; `TypeError` when it is not an
/// int or does not fit.
pub fn uint<T>(obj: &Bound<'_, PyAny>, what: &str) -> PyResult<T>
where
    T: for<'a> FromPyObject<'a> + TryFrom<u64>,
{
    match obj.extract::<T>() {
        Ok(v) => Ok(v),
        Err(e) if e.is_instance_of::<PyOverflowError>(obj.py()) => {
            let max = u64::MAX >> (64 - 8 * std::mem::size_of::<T>().min(8));
            Err(PyTypeError::new_err(format!(
                "{what} must be an int from 0 to {max}, got {}",
                obj.repr()
                    .map_or_else(|_| "?".to_string(), |r| r.to_string())
            )))
        }
        Err(e) => Err(e),
    }
}

/// A list index from a Python int: upstream converts to `size_t`, so a
/// negative index is out of range (`IndexError`), not an overflow.
pub fn list_index(obj: &Bound<'_, PyAny>, size: u32) -> PyResult<usize> {
    let index: i128 = obj.extract()?;
    usize::try_from(index).map_err(|_| {
        pyo3::exceptions::PyIndexError::new_err(format!(
            "Could not access list element: OUT_OF_RANGE; list index {index} out of range \
             (size {size})"
        ))
    })
}

/// `Ok` when `path` opens for reading as a file; else the `OSError`
/// subclass Python's `open` raises for it (`FileNotFoundError`,
/// `IsADirectoryError`, `PermissionError`, ...), with errno and filename.
pub fn check_readable_file(py: Python<'_>, path: &std::path::Path) -> PyResult<()> {
    let opened = std::fs::File::open(path).and_then(|f| {
        if f.metadata()?.is_dir() {
            Err(std::io::Error::from_raw_os_error(21)) // EISDIR
        } else {
            Ok(())
        }
    });
    let Err(e) = opened else {
        return Ok(());
    };
    let Some(errno) = e.raw_os_error() else {
        return Err(pyo3::exceptions::PyOSError::new_err(e.to_string()));
    };
    let strerror: String = py
        .import("os")?
        .call_method1("strerror", (errno,))?
        .extract()?;
    // OSError(errno, strerror, filename) picks the subclass for errno.
    let err = py
        .import("builtins")?
        .getattr("OSError")?
        .call1((errno, strerror, path))?;
    Err(PyErr::from_value(err))
}
