//! Compiling MLIR with the pinned `iree-compile` at test time.
//!
//! Outputs are rebuilt only when the source (or the compiler) is newer than
//! the module, and written under a temporary name first, so tests of one
//! process (serialised by a lock) and of concurrent processes never read a
//! half-written module.

use crate::paths::venv_tool;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

/// Flags for the local llvm-cpu target with a portable (generic x86-64)
/// CPU: modules that run on any machine the tests run on.
pub const GENERIC_CPU: &[&str] = &[
    "--iree-hal-target-device=local",
    "--iree-hal-local-target-device-backends=llvm-cpu",
    "--iree-llvmcpu-target-cpu=generic",
];

static BUILD_LOCK: Mutex<()> = Mutex::new(());

/// Writes `contents` to `path` under a name unique to this process and
/// call, then renames it into place: a reader in another thread or process
/// sees the old file or the whole new one, never an empty or partial one
/// (`std::fs::write` truncates first, and a test reading meanwhile saw an
/// empty file).
pub fn write_atomic(path: &Path, contents: impl AsRef<[u8]>) {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let n = NEXT.fetch_add(1, Ordering::Relaxed);
    let mut tmp = path.as_os_str().to_owned();
    tmp.push(format!(".{}.{n}.tmp", std::process::id()));
    let tmp = PathBuf::from(tmp);
    std::fs::write(&tmp, contents)
        .unwrap_or_else(|e| panic!("cannot write {}: {e}", tmp.display()));
    std::fs::rename(&tmp, path)
        .unwrap_or_else(|e| panic!("cannot move {} into place: {e}", path.display()));
}

/// Whether `out` exists and is at least as new as every one of `inputs`.
fn is_fresh(out: &Path, inputs: &[&Path]) -> bool {
    let Ok(Ok(built)) = std::fs::metadata(out).map(|m| m.modified()) else {
        return false;
    };
    inputs.iter().all(
        |input| matches!(std::fs::metadata(input).map(|m| m.modified()), Ok(Ok(t)) if built >= t),
    )
}

/// Compiles `src` with `flags` into `out` (a `.vmfb` path), unless `out` is
/// already at least as new as `src` and the compiler; returns `out`. The
/// pinned compiler must be installed either way, so a test never passes on
/// a leftover module alone. A compile error fails the test with the
/// compiler's diagnostics.
pub fn compile_file(src: &Path, out: &Path, flags: &[&str]) -> PathBuf {
    let compiler = venv_tool("iree-compile");
    let _guard = BUILD_LOCK.lock().unwrap_or_else(|e| e.into_inner());
    if !is_fresh(out, &[src, &compiler]) {
        if let Some(dir) = out.parent() {
            std::fs::create_dir_all(dir)
                .unwrap_or_else(|e| panic!("cannot create {}: {e}", dir.display()));
        }
        let tmp = out.with_extension(format!("vmfb.{}.tmp", std::process::id()));
        let output = Command::new(&compiler)
            .args(flags)
            .arg(src)
            .arg("-o")
            .arg(&tmp)
            .output()
            .unwrap_or_else(|e| panic!("cannot run {}: {e}", compiler.display()));
        assert!(
            output.status.success(),
            "iree-compile failed for {}:\n{}",
            src.display(),
            String::from_utf8_lossy(&output.stderr)
        );
        std::fs::rename(&tmp, out)
            .unwrap_or_else(|e| panic!("cannot move {} into place: {e}", out.display()));
    }
    out.to_path_buf()
}

/// Compiles MLIR source text into `out`: the text is kept beside it as
/// `<out stem>.mlir`, rewritten (and the module rebuilt) only when it
/// changes.
pub fn compile_source(mlir: &str, out: &Path, flags: &[&str]) -> PathBuf {
    let src = out.with_extension("mlir");
    {
        let _guard = BUILD_LOCK.lock().unwrap_or_else(|e| e.into_inner());
        if std::fs::read_to_string(&src).map_or(true, |old| old != mlir) {
            if let Some(dir) = src.parent() {
                std::fs::create_dir_all(dir)
                    .unwrap_or_else(|e| panic!("cannot create {}: {e}", dir.display()));
            }
            write_atomic(&src, mlir);
        }
    }
    compile_file(&src, out, flags)
}
