//! Whether other programs keep the machine's CPUs busy: the condition of
//! the contended-caller rule (`PoolState::region_helpers`, half the CPUs)
//! and of the loaded-solo rule (`PoolState::solo_now`, every CPU).
//!
//! A pool counts as contended when its own threads are switched out
//! involuntarily, which also happens on an idle machine when the pool's
//! threads outnumber the CPUs (every worker and the caller beside them).
//! The contended-caller rule adds a thread to a region, which helps only
//! when the other runnable threads are someone else's (the scheduler then
//! shares each CPU among more of ours); on an idle machine of 16 cores it
//! made MiniLM 1.12x upstream against 1.02x without it (issue 25). So the
//! rule also asks the kernel how many threads are runnable machine-wide
//! (`/proc/loadavg`) and counts the ones that cannot be the pool's.

use std::sync::atomic::{AtomicU32, AtomicU64, AtomicU8, Ordering};
use std::time::Duration;

/// How long one reading of `/proc/loadavg` is trusted.
const FRESH_FOR: Duration = Duration::from_millis(5);

/// The machine's runnable threads, read now and then.
pub(super) struct MachineLoad {
    /// CPUs online on the machine (the count `/proc/loadavg`'s runnable
    /// threads share).
    cpus: u32,
    /// When the last reading was taken (the pool clock's nanoseconds; 0:
    /// never).
    read_at: AtomicU64,
    /// Its reading: threads runnable machine-wide.
    runnable: AtomicU32,
    /// Tests: 1 says busy (half the CPUs, not all), 3 says every CPU is
    /// busy, 2 says not, 0 reads the machine.
    pub(super) assume: AtomicU8,
}

impl MachineLoad {
    pub(super) fn new() -> MachineLoad {
        MachineLoad {
            cpus: online_cpus(),
            read_at: AtomicU64::new(0),
            runnable: AtomicU32::new(0),
            assume: AtomicU8::new(0),
        }
    }

    /// Whether threads other than the pool's keep at least half the
    /// machine's CPUs busy: runnable threads machine-wide minus the most
    /// the pool can have running (`ours`: its awake workers and the
    /// caller). Read at most every [`FRESH_FOR`] (`now_ns` on the pool's
    /// clock); false where `/proc/loadavg` cannot be read.
    pub(super) fn others_busy(&self, now_ns: u64, ours: u32) -> bool {
        match self.assume.load(Ordering::Relaxed) {
            1 | 3 => return true,
            2 => return false,
            _ => {}
        }
        self.others_runnable(now_ns, ours) >= (self.cpus / 2).max(1)
    }

    /// Whether threads other than the pool's keep every CPU of the machine
    /// busy (as [`MachineLoad::others_busy`], with all CPUs for half).
    pub(super) fn others_fill(&self, now_ns: u64, ours: u32) -> bool {
        match self.assume.load(Ordering::Relaxed) {
            3 => return true,
            1 | 2 => return false,
            _ => {}
        }
        self.others_runnable(now_ns, ours) >= self.cpus.max(1)
    }

    /// Runnable threads machine-wide minus `ours`, from a reading at most
    /// [`FRESH_FOR`] old (0 where `/proc/loadavg` cannot be read).
    fn others_runnable(&self, now_ns: u64, ours: u32) -> u32 {
        let at = self.read_at.load(Ordering::Relaxed);
        let runnable = if at != 0 && now_ns.saturating_sub(at) < FRESH_FOR.as_nanos() as u64 {
            self.runnable.load(Ordering::Relaxed)
        } else {
            let r = runnable_now().unwrap_or(0);
            self.runnable.store(r, Ordering::Relaxed);
            self.read_at.store(now_ns.max(1), Ordering::Relaxed);
            r
        };
        runnable.saturating_sub(ours)
    }
}

/// Threads runnable on the machine now: the numerator of the fourth
/// field of `/proc/loadavg` ("running/total").
fn runnable_now() -> Option<u32> {
    let text = std::fs::read_to_string("/proc/loadavg").ok()?;
    parse_runnable(&text)
}

fn parse_runnable(loadavg: &str) -> Option<u32> {
    let field = loadavg.split_whitespace().nth(3)?;
    field.split('/').next()?.parse().ok()
}

fn online_cpus() -> u32 {
    // SAFETY: sysconf reads a system constant; no memory is passed.
    let n = unsafe { libc::sysconf(libc::_SC_NPROCESSORS_ONLN) };
    if n > 0 {
        n as u32
    } else {
        std::thread::available_parallelism().map_or(1, |n| n.get() as u32)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_the_runnable_count_of_loadavg() {
        assert_eq!(parse_runnable("0.52 0.58 0.59 3/467 12345\n"), Some(3));
        assert_eq!(parse_runnable("0.52 0.58 0.59\n"), None);
        assert_eq!(parse_runnable("a b c x/1 2"), None);
        if std::path::Path::new("/proc/loadavg").exists() {
            // This test's own thread is running.
            assert!(runnable_now().is_some_and(|r| r >= 1));
        }
    }

    #[test]
    fn a_reading_is_kept_for_a_while_and_tests_can_decide() {
        let m = MachineLoad::new();
        m.runnable.store(m.cpus + 3, Ordering::Relaxed);
        m.read_at.store(1_000, Ordering::Relaxed);
        // Fresh: the stored reading, whatever the machine does.
        assert!(m.others_busy(1_000 + 1_000, 0));
        assert!(m.others_fill(1_000 + 1_000, 3));
        assert!(!m.others_fill(1_000 + 1_000, 4));
        // Half the CPUs busy with others' threads is busy, not full.
        m.runnable.store(m.cpus / 2 + 1 + 1, Ordering::Relaxed);
        assert!(m.others_busy(1_000 + 1_000, 1));
        assert_eq!(m.others_fill(1_000 + 1_000, 1), m.cpus <= 2);
        m.assume.store(2, Ordering::Relaxed);
        assert!(!m.others_busy(0, 0) && !m.others_fill(0, 0));
        m.assume.store(1, Ordering::Relaxed);
        assert!(m.others_busy(0, 0) && !m.others_fill(0, 0));
        m.assume.store(3, Ordering::Relaxed);
        assert!(m.others_busy(0, 0) && m.others_fill(0, 0));
    }
}
