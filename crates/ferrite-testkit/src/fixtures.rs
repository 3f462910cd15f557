//! The VM test fixtures: modules built from the sources under `tests/vm`
//! by `scripts/build-fixtures.sh` into `<workspace>/build/fixtures/vm`, or
//! a ready directory named by `$FERRITE_FIXTURES`.
//!
//! The in-tree directory is (re)built once per test process when a source
//! has no up-to-date `.vmfb`. Missing tools or a failed build fail the test
//! with a message; nothing passes silently.

use crate::paths::workspace_root;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

fn sources(root: &Path) -> Vec<PathBuf> {
    let mut v: Vec<PathBuf> = std::fs::read_dir(root.join("tests/vm"))
        .map(|rd| {
            rd.filter_map(|e| e.ok().map(|e| e.path()))
                .filter(|p| {
                    matches!(
                        p.extension().and_then(|e| e.to_str()),
                        Some("vmasm" | "mlir")
                    )
                })
                .collect()
        })
        .unwrap_or_default();
    v.sort();
    v
}

fn is_stale(src: &Path, out: &Path) -> bool {
    let (Ok(s), Ok(o)) = (std::fs::metadata(src), std::fs::metadata(out)) else {
        return true;
    };
    match (s.modified(), o.modified()) {
        (Ok(s), Ok(o)) => o < s,
        _ => false,
    }
}

/// The directory holding the fixture `.vmfb` files, built if needed.
pub fn fixtures_dir() -> &'static Path {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        if let Some(d) = std::env::var_os("FERRITE_FIXTURES") {
            let d = PathBuf::from(d);
            assert!(
                d.is_dir(),
                "FERRITE_FIXTURES={} is not a directory",
                d.display()
            );
            return d;
        }
        let root = workspace_root();
        let dir = root.join("build/fixtures/vm");
        let srcs = sources(&root);
        assert!(
            !srcs.is_empty(),
            "no fixture sources under {}/tests/vm",
            root.display()
        );
        let stale: Vec<String> = srcs
            .iter()
            .filter(|s| {
                let name = s.file_stem().unwrap().to_string_lossy().to_string();
                is_stale(s, &dir.join(format!("{name}.vmfb")))
            })
            .map(|s| s.file_name().unwrap().to_string_lossy().to_string())
            .collect();
        if !stale.is_empty() {
            eprintln!(
                "fixtures missing or out of date ({}); running scripts/build-fixtures.sh",
                stale.join(", ")
            );
            let out = Command::new("bash")
                .arg(root.join("scripts/build-fixtures.sh"))
                .current_dir(&root)
                .output()
                .expect("cannot run bash scripts/build-fixtures.sh");
            assert!(
                out.status.success(),
                "scripts/build-fixtures.sh failed ({}); the VM tests need the fixtures \
                 (run scripts/setup-venv.sh for the pinned tools, then scripts/build-fixtures.sh, \
                 or point FERRITE_FIXTURES at a directory of .vmfb files)\nstdout:\n{}\nstderr:\n{}",
                out.status,
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            );
        }
        dir
    })
}

/// Every fixture as (name, path), sorted by name. Fails when there are none,
/// or (for the in-tree directory) when a source has no fixture.
pub fn fixtures() -> Vec<(String, PathBuf)> {
    let dir = fixtures_dir();
    let mut v: Vec<(String, PathBuf)> = std::fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("cannot list fixtures in {}: {e}", dir.display()))
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().and_then(|e| e.to_str()) == Some("vmfb"))
        .map(|p| (p.file_stem().unwrap().to_string_lossy().to_string(), p))
        .collect();
    v.sort();
    assert!(!v.is_empty(), "no .vmfb fixtures in {}", dir.display());
    if std::env::var_os("FERRITE_FIXTURES").is_none() {
        for s in sources(&workspace_root()) {
            let name = s.file_stem().unwrap().to_string_lossy().to_string();
            assert!(
                v.iter().any(|(n, _)| *n == name),
                "source {} has no fixture {name}.vmfb in {}",
                s.display(),
                dir.display()
            );
        }
    }
    v
}

/// The path of fixture `name` (fails with a message when it is absent).
pub fn fixture_path(name: &str) -> PathBuf {
    let p = fixtures_dir().join(format!("{name}.vmfb"));
    assert!(
        p.is_file(),
        "fixture {} is missing (scripts/build-fixtures.sh builds it from tests/vm/{name}.*)",
        p.display()
    );
    p
}
