//! The native module behind `ferrite.runtime` (`ferrite._ferrite`).
//!
//! Thin PyO3 classes over the Rust layers, named and shaped as upstream's
//! `iree.runtime._binding`; everything that upstream writes in Python
//! (enums, the system API, function invokers) lives in `python/ferrite`.
//! Every `VmInstance` owns its type registry; the one process-wide state is
//! the runtime flags of `parse_flags` (see `flags.rs`), as upstream's.
#![allow(missing_docs)] // Python-facing items are documented in the `.pyi` stub.

use pyo3::prelude::*;

mod args;
mod command_buffer;
mod debug_sink;
mod declaration;
mod dlpack;
mod external_timepoint;
mod fence;
mod flags;
mod hal;
mod host_buffer;
mod host_data;
mod invoke;
mod io;
mod llm;
mod loop_bridge;
mod pymodule;
mod semaphore;
mod status;
mod tokenizer;
mod tools;
mod trace;
mod vm;

#[pymodule]
fn _ferrite(m: &Bound<'_, PyModule>) -> PyResult<()> {
    vm::register(m)?;
    hal::register(m)?;
    invoke::register(m)?;
    flags::register(m)?;
    pymodule::register(m)?;
    tokenizer::register(m)?;
    tools::register(m)?;
    io::register(m)?;
    llm::register(m)?;
    trace::register(m)?;
    let commit = option_env!("FERRITE_GIT_COMMIT").filter(|c| !c.is_empty());
    m.add("__version__", version(env!("CARGO_PKG_VERSION"), commit))?;
    m.add("__git_commit__", commit)?;
    Ok(())
}

/// The package version with the commit it was built from as a PEP 440 local
/// version label (`0.1.0+g89ece87b8985`), or the plain version without one.
fn version(package: &str, commit: Option<&str>) -> String {
    match commit {
        Some(c) => format!("{package}+g{}", &c[..c.len().min(12)]),
        None => package.to_string(),
    }
}
