//! Where the workspace and the pinned upstream tools are.

use std::path::{Path, PathBuf};

/// The workspace root (two levels above this crate's manifest, as for every
/// crate under `crates/`).
pub fn workspace_root() -> PathBuf {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    dir.canonicalize().unwrap_or(dir)
}

/// The virtual environment holding the pinned IREE wheels: `$VENV` when set,
/// else `<workspace>/.venv` (made by `scripts/setup-venv.sh`).
pub fn venv_dir() -> PathBuf {
    std::env::var_os("VENV")
        .map(PathBuf::from)
        .unwrap_or_else(|| workspace_root().join(".venv"))
}

/// Where the venv's tool `name` (`iree-compile`, `iree-run-module`, ...)
/// would be, whether or not it is installed: for tests that skip a
/// comparison when the tool is absent.
pub fn venv_tool_path(name: &str) -> PathBuf {
    venv_dir().join("bin").join(name)
}

/// The venv's tool `name`; fails the test, saying how to install it, when
/// it is missing (the tests that need it must not pass without it).
pub fn venv_tool(name: &str) -> PathBuf {
    let p = venv_tool_path(name);
    assert!(
        p.is_file(),
        "{} is missing: these tests need the pinned IREE tools \
         (iree-base-compiler==3.13.0, iree-base-runtime==3.13.0); run scripts/setup-venv.sh \
         or point VENV at a venv that has them",
        p.display()
    );
    p
}

/// `dir`, created with its parents if needed.
pub fn created_dir(dir: PathBuf) -> PathBuf {
    std::fs::create_dir_all(&dir)
        .unwrap_or_else(|e| panic!("cannot create directory {}: {e}", dir.display()));
    dir
}

/// Whether missing upstream prerequisites (the pinned tools, the upstream
/// source mirror) must fail tests instead of skipping them: true when
/// `FERRITE_REQUIRE_UPSTREAM=1`, which CI sets wherever it installs them.
pub fn upstream_required() -> bool {
    std::env::var("FERRITE_REQUIRE_UPSTREAM").is_ok_and(|v| v == "1")
}

/// Reports that `test` cannot run because `reason`: prints
/// `SKIPPED <test>: <reason>` to the test output, or fails the test when
/// [`upstream_required`]. Callers return right after it.
pub fn skip_or_fail(test: &str, reason: &str) {
    assert!(
        !upstream_required(),
        "{test}: {reason} (FERRITE_REQUIRE_UPSTREAM=1 forbids skipping)"
    );
    eprintln!("SKIPPED {test}: {reason}");
    println!("SKIPPED {test}: {reason}");
}
