//! Helpers shared by the integration tests: the pinned upstream tools.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::Command;

/// The repository root.
pub fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../..")
        .canonicalize()
        .unwrap()
}

/// A pinned upstream tool from the project venv; panics with a clear message
/// when it is missing.
pub fn tool(name: &str) -> PathBuf {
    let path = root().join(".venv/bin").join(name);
    assert!(
        path.is_file(),
        "{} is missing: these tests need the pinned IREE tools; run scripts/setup-venv.sh",
        path.display()
    );
    path
}

/// Compiles `mlir` (source text) for a portable CPU into
/// `$CARGO_TARGET_TMPDIR/<name>.vmfb` with the pinned compiler.
pub fn compile(name: &str, mlir: &str) -> PathBuf {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("ferrite-facade");
    std::fs::create_dir_all(&dir).unwrap();
    let src = dir.join(format!("{name}.mlir"));
    let out = dir.join(format!("{name}.vmfb"));
    std::fs::write(&src, mlir).unwrap();
    let compiler = tool("iree-compile");
    let status = Command::new(&compiler)
        .arg(&src)
        .arg("-o")
        .arg(&out)
        .args([
            "--iree-hal-target-device=local",
            "--iree-hal-local-target-device-backends=llvm-cpu",
            "--iree-llvmcpu-target-cpu=generic",
        ])
        .status()
        .unwrap_or_else(|e| panic!("running {}: {e}", compiler.display()));
    assert!(status.success(), "iree-compile failed on {}", src.display());
    out
}
