//! Helpers shared by the integration tests: the pinned upstream tools and
//! compiling programs with them (from `ferrite-testkit`).
#![allow(dead_code)]

use std::path::PathBuf;

// Not every test binary uses both.
#[allow(unused_imports)]
pub use ferrite_testkit::{venv_tool as tool, workspace_root as root};

/// Compiles `mlir` (source text) for a portable CPU into
/// `$CARGO_TARGET_TMPDIR/ferrite-facade/<name>.vmfb` with the pinned
/// compiler (again only when the text changes).
pub fn compile(name: &str, mlir: &str) -> PathBuf {
    let out = ferrite_testkit::target_tmpdir!("ferrite-facade").join(format!("{name}.vmfb"));
    ferrite_testkit::compile_source(mlir, &out, ferrite_testkit::GENERIC_CPU)
}
