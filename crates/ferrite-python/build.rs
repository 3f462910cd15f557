//! Records the git commit the extension is built from, for
//! `ferrite.__version__` and `ferrite.runtime.version.GIT_COMMIT`.
//!
//! `FERRITE_GIT_COMMIT` in the environment wins (for builds from a source
//! archive that know their commit); otherwise `git rev-parse HEAD` in this
//! checkout. Outside a git checkout, or without git, the commit is empty
//! and the version is the plain package version.

use std::path::{Path, PathBuf};
use std::process::Command;

fn git(dir: &Path, args: &[&str]) -> Option<String> {
    let out = Command::new("git")
        .args(args)
        .current_dir(dir)
        .output()
        .ok()?;
    if !out.status.success() {
        return None;
    }
    let text = String::from_utf8(out.stdout).ok()?.trim().to_string();
    (!text.is_empty()).then_some(text)
}

/// A full or abbreviated commit id: hex digits only, nothing else passes.
fn is_commit(s: &str) -> bool {
    (7..=64).contains(&s.len()) && s.bytes().all(|b| b.is_ascii_hexdigit())
}

fn main() {
    println!("cargo:rerun-if-env-changed=FERRITE_GIT_COMMIT");
    let dir = PathBuf::from(std::env::var("CARGO_MANIFEST_DIR").unwrap_or_default());
    let commit = match std::env::var("FERRITE_GIT_COMMIT") {
        Ok(c) if is_commit(c.trim()) => Some(c.trim().to_ascii_lowercase()),
        _ => {
            // Rebuild when HEAD moves: HEAD itself (a checkout) and the
            // files a branch's id lives in (a commit).
            if let Some(git_dir) = git(&dir, &["rev-parse", "--git-dir"]) {
                let git_dir = dir.join(git_dir);
                println!("cargo:rerun-if-changed={}", git_dir.join("HEAD").display());
                if let Some(common) = git(&dir, &["rev-parse", "--git-common-dir"]) {
                    let common = dir.join(common);
                    println!(
                        "cargo:rerun-if-changed={}",
                        common.join("packed-refs").display()
                    );
                    if let Some(head_ref) = git(&dir, &["symbolic-ref", "-q", "HEAD"]) {
                        println!("cargo:rerun-if-changed={}", common.join(head_ref).display());
                    }
                }
            }
            git(&dir, &["rev-parse", "HEAD"]).filter(|c| is_commit(c))
        }
    };
    println!(
        "cargo:rustc-env=FERRITE_GIT_COMMIT={}",
        commit.unwrap_or_default()
    );
}
