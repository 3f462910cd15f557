//! The `ferrite` command line (crates/ferrite-cli: `run-module`,
//! `benchmark-module`, `dump-module`, `check-module`, the `e2e-*-test`
//! runners and `generate`), run inside the Python process: the package's
//! `ferrite` console command (and so `benchmark_module`) is the same CLI
//! as the cargo-built executable and needs no separately installed one.

use pyo3::prelude::*;

/// Runs `ferrite` with `argv` (program name first); returns its exit status.
/// The GIL is released while the command runs.
#[pyfunction]
fn cli_main(py: Python<'_>, argv: Vec<String>) -> i32 {
    py.allow_threads(|| ferrite_cli::main_with_args(argv))
}

pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(cli_main, m)?)?;
    Ok(())
}
