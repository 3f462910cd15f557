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
