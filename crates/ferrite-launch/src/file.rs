//! The file store: a directory every rank sees (a shared file system).
//!
//! Rank 0 writes `<key>.id` (a temporary file of mode 0600, renamed into
//! place), then waits for every rank's `<key>.ack.<rank>` (mode 0600 too)
//! and removes them all once the last is there, or at its deadline; a
//! directory it created it removes too when it is empty. The directory must
//! not be writable by group or others (a directory rank 0 creates is 0700),
//! and a rank reads an identifier only from a file of mode 0600 owned by
//! the directory's owner: nobody else can plant one.

use crate::secret::{hex, unhex};
use ferrite_base::{bail, status, Result};
use std::fs::{DirBuilder, OpenOptions};
use std::io::Write;
use std::os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// A key as a file name (keys are the driver's, e.g. `nccl/0`).
fn file_name(key: &str) -> String {
    key.chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '-' || c == '.' {
                c
            } else {
                '_'
            }
        })
        .collect()
}

fn id_path(dir: &Path, key: &str) -> PathBuf {
    dir.join(format!("{}.id", file_name(key)))
}

fn ack_path(dir: &Path, key: &str, rank: u32) -> PathBuf {
    dir.join(format!("{}.ack.{rank}", file_name(key)))
}

/// Refuses a directory that others could write into.
fn check_dir(dir: &Path) -> Result<std::fs::Metadata> {
    let m = std::fs::metadata(dir)
        .map_err(|e| status!(Unavailable, "store directory {}: {e}", dir.display()))?;
    if !m.is_dir() {
        bail!(
            InvalidArgument,
            "store directory {} is not a directory",
            dir.display()
        );
    }
    if m.mode() & 0o022 != 0 {
        bail!(
            PermissionDenied,
            "store directory {} is writable by group or others (mode {:o}); use a fresh directory of this job's own (rank 0 creates it 0700)",
            dir.display(),
            m.mode() & 0o7777
        );
    }
    Ok(m)
}

/// Writes `bytes` to a new file of mode 0600 (replacing none).
fn write_private(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    let mut f = OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(path)?;
    f.write_all(bytes)?;
    f.sync_all()
}

/// Rank 0: publishes `id` under `key` in `dir` and waits until ranks
/// `1..size` acknowledged it; the files are removed either way.
pub fn publish(dir: &Path, key: &str, id: &[u8], size: u32, deadline: Instant) -> Result<()> {
    let created = !dir.exists();
    DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)
        .map_err(|e| {
            status!(
                Unavailable,
                "creating the store directory {}: {e}",
                dir.display()
            )
        })?;
    check_dir(dir)?;
    let dst = id_path(dir, key);
    let acks: Vec<PathBuf> = (1..size).map(|r| ack_path(dir, key, r)).collect();
    // Leftovers of an earlier, failed job must not count for this one.
    for a in &acks {
        let _ = std::fs::remove_file(a);
    }
    let tmp = dir.join(format!(".{}.id.tmp", file_name(key)));
    let _ = std::fs::remove_file(&tmp);
    let cleanup = || {
        for p in acks.iter().chain([&dst, &tmp]) {
            let _ = std::fs::remove_file(p);
        }
        if created {
            let _ = std::fs::remove_dir(dir);
        }
    };
    let result = write_private(&tmp, hex(id).as_bytes())
        .and_then(|_| std::fs::rename(&tmp, &dst))
        .map_err(|e| status!(Unavailable, "writing {}: {e}", dst.display()))
        .and_then(|()| loop {
            let missing: Vec<u32> = (1..size)
                .filter(|&r| !acks[r as usize - 1].exists())
                .collect();
            if missing.is_empty() {
                break Ok(());
            }
            if Instant::now() >= deadline {
                break Err(status!(
                    DeadlineExceeded,
                    "ranks {missing:?} did not read {} in time",
                    dst.display()
                ));
            }
            std::thread::sleep(Duration::from_millis(20));
        });
    cleanup();
    result
}

/// A non-zero rank: waits for `key`'s identifier in `dir`, reads it into
/// `id` and acknowledges it.
pub fn fetch(dir: &Path, key: &str, rank: u32, id: &mut [u8], deadline: Instant) -> Result<()> {
    let src = id_path(dir, key);
    let text = loop {
        let attempt =
            std::fs::metadata(&src).and_then(|m| std::fs::read_to_string(&src).map(|t| (m, t)));
        match attempt {
            Ok((m, t)) => {
                let d = check_dir(dir)?;
                if m.mode() & 0o077 != 0 || m.uid() != d.uid() {
                    bail!(
                        PermissionDenied,
                        "{} has mode {:o} and owner {}: rank 0 writes it 0600 as the directory's owner ({})",
                        src.display(),
                        m.mode() & 0o7777,
                        m.uid(),
                        d.uid()
                    );
                }
                break t;
            }
            Err(_) if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(20)),
            Err(e) => bail!(
                DeadlineExceeded,
                "{} did not appear in time ({e}); is rank 0 running with the same store?",
                src.display()
            ),
        }
    };
    let bytes = unhex(text.trim())
        .ok_or_else(|| status!(InvalidArgument, "{} is malformed", src.display()))?;
    if bytes.len() != id.len() {
        bail!(
            InvalidArgument,
            "{} holds {} bytes, this rank expected {}",
            src.display(),
            bytes.len(),
            id.len()
        );
    }
    id.copy_from_slice(&bytes);
    let ack = ack_path(dir, key, rank);
    let _ = std::fs::remove_file(&ack);
    write_private(&ack, b"").map_err(|e| status!(Unavailable, "writing {}: {e}", ack.display()))
}
