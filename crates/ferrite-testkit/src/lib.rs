//! Helpers shared by Ferrite's integration tests, so that every test crate
//! finds the pinned upstream tools, compiles its MLIR programs and runs
//! command-line tools the same way.
//!
//! - [`paths`]: the workspace root and the pinned IREE tools in the project
//!   venv (`$VENV`, else `<workspace>/.venv`).
//! - [`compile`]: compiling an MLIR file or source text with the pinned
//!   `iree-compile`, again only when the source changed.
//! - [`fixtures`]: the VM fixture modules built from `tests/vm`.
//! - [`process`]: running a program with a time limit and collecting its
//!   exit code and output.
//! - [`bytes`], [`parameter_files`]: test data as the bytes buffers and
//!   parameter files (GGUF, safetensors) hold.
//!
//! Only ever a dev-dependency; nothing here is part of Ferrite.

pub mod bytes;
pub mod compile;
pub mod fixtures;
pub mod parameter_files;
pub mod paths;
pub mod process;

pub use bytes::f32_bytes;
pub use compile::{compile_file, compile_source, write_atomic, GENERIC_CPU};
pub use paths::{
    skip_or_fail, upstream_required, venv_dir, venv_tool, venv_tool_path, workspace_root,
};
pub use process::{run_command, run_program, Output};

/// `$CARGO_TARGET_TMPDIR/<sub>` of the calling test crate, created if
/// needed. A macro because `CARGO_TARGET_TMPDIR` is only set while Cargo
/// builds an integration test, so it must be read in the test's own crate.
#[macro_export]
macro_rules! target_tmpdir {
    ($sub:expr) => {
        $crate::paths::created_dir(::std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join($sub))
    };
}
