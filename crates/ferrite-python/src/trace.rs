//! `ferrite.runtime.start_trace` / `stop_trace`: the process's execution
//! trace (`ferrite_base::trace`, the recorder the CLI's `--trace` uses), as
//! Chrome/Perfetto JSON.

use crate::status::PyContext;
use pyo3::prelude::*;

/// Starts recording (an error when a recording is already running).
#[pyfunction]
fn start_trace() -> PyResult<()> {
    ferrite_base::trace::start().py_context("starting the trace")
}

/// Stops recording; writes the Chrome JSON to `path` when given, and
/// returns it as text (None when no recording was running).
#[pyfunction]
#[pyo3(signature = (path = None))]
fn stop_trace(path: Option<std::path::PathBuf>) -> PyResult<Option<String>> {
    let Some(trace) = ferrite_base::trace::stop() else {
        return Ok(None);
    };
    let json = trace.to_chrome_json();
    if let Some(path) = path {
        std::fs::write(&path, &json).map_err(|e| {
            pyo3::exceptions::PyOSError::new_err(format!("writing trace '{}': {e}", path.display()))
        })?;
    }
    Ok(Some(json))
}

/// True while a trace is being recorded.
#[pyfunction]
fn is_tracing() -> bool {
    ferrite_base::trace::enabled()
}

pub(crate) fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(start_trace, m)?)?;
    m.add_function(wrap_pyfunction!(stop_trace, m)?)?;
    m.add_function(wrap_pyfunction!(is_tracing, m)?)?;
    Ok(())
}
