//! Parameters: weights stored outside a program, in `.irpa`, `.gguf` or
//! `.safetensors` files, served to programs through the `io_parameters`
//! VM module.
//!
//! - [`file_handle`]: memory-mapped files and host memory holding bytes.
//! - [`demand_paged`]: aligned copies of misaligned file bytes, filled on
//!   first access (Linux `userfaultfd`).
//! - [`index`]: named parameters and where their bytes are.
//! - [`formats`]: parsers for the three file formats and the irpa writer.
//! - [`provider`]: load/gather/scatter of one scope's parameters on a HAL
//!   device queue (zero-copy import of mapped bytes where possible).
//! - [`module`]: the `io_parameters` VM module over a list of providers.

#[cfg(target_os = "linux")]
pub mod demand_paged;
pub mod file_handle;
pub mod formats;
pub mod index;
pub mod module;
pub mod provider;

pub use file_handle::{FileHandle, WritableBytes};
pub use index::{Entry, ParameterIndex, Storage};
pub use module::create_io_parameters_module;
pub use provider::{ParameterProvider, Span};

/// Opens a parameter file and indexes it: what `--parameters=scope=path`
/// does for each file. The format comes from the extension.
pub fn open_file(
    index: &mut ParameterIndex,
    path: impl AsRef<std::path::Path>,
) -> ferrite_base::Result<()> {
    let handle = FileHandle::open(path)?;
    formats::parse_into(index, &handle, None)
}

/// Parses the command-line form `[scope=]path` into (scope, path); a
/// missing scope is the empty scope, as upstream's `--parameters` flag.
pub fn parse_flag(value: &str) -> (&str, &str) {
    match value.split_once('=') {
        Some((scope, path)) => (scope, path),
        None => ("", value),
    }
}
