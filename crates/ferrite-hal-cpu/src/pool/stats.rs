//! What a pool has done: counters, the workers' CPU time, and the
//! statistics `FERRITE_LOCAL_TASK_STATS` prints.

use super::PoolState;
use parking_lot::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Weak};
use std::thread::JoinHandle;
use std::time::Duration;

/// What a pool has done so far (monotonic counters).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PoolStats {
    /// Workgroups run on the pool's worker threads.
    pub workgroups_on_workers: u64,
    /// Workgroups run on other threads (waiters that took a submission
    /// and led its command buffer).
    pub workgroups_on_callers: u64,
    /// Command-buffer executions run: regions, and small command buffers
    /// (every stage one tile) run one command after another.
    pub regions: u64,
    /// Times a worker went to sleep after polling in vain.
    pub sleeps: u64,
    /// Times a worker joined a running command buffer.
    pub joins: u64,
    /// Times a command buffer's leader slept waiting for other threads to
    /// finish a stage.
    pub leader_sleeps: u64,
    /// Total time workers spent polling for work while idle.
    pub idle_spin: Duration,
    /// Spins (of workers or leaders) that ended because their thread was
    /// descheduled (the machine was busy), each making the pool's spins
    /// short for a while.
    pub preempted_spins: u64,
    /// Times a pool thread found, going to sleep (a worker) or at the end
    /// of a long region (its leader), that the scheduler had switched it
    /// out against its will since it last looked: the machine has more
    /// runnable threads than CPUs. Each makes the pool's spins short for a
    /// while, as a preempted spin does.
    pub preempted_threads: u64,
    /// CPU time the worker threads have used (Linux; zero elsewhere).
    pub worker_cpu_time: Duration,
    /// Submissions the device ran on the submitting thread (small work
    /// whose wait was already reached) instead of queueing them.
    pub inline_submissions: u64,
}

/// The counters behind [`PoolStats`].
#[derive(Default)]
pub(super) struct Counters {
    pub(super) on_workers: AtomicU64,
    pub(super) on_callers: AtomicU64,
    pub(super) regions: AtomicU64,
    pub(super) sleeps: AtomicU64,
    pub(super) joins: AtomicU64,
    pub(super) leader_sleeps: AtomicU64,
    pub(super) idle_spin_ns: AtomicU64,
    pub(super) preempted_spins: AtomicU64,
    pub(super) preempted_threads: AtomicU64,
    pub(super) inline_submissions: AtomicU64,
}

/// A thread's CPU-time clock id (valid while the thread lives).
#[cfg(target_os = "linux")]
pub(super) type CpuClock = libc::clockid_t;
#[cfg(not(target_os = "linux"))]
pub(super) type CpuClock = ();

impl PoolState {
    /// Counters so far; only while the workers live (their CPU clocks).
    pub(super) fn stats(&self) -> PoolStats {
        let c = &self.stats;
        PoolStats {
            workgroups_on_workers: c.on_workers.load(Ordering::Relaxed),
            workgroups_on_callers: c.on_callers.load(Ordering::Relaxed),
            regions: c.regions.load(Ordering::Relaxed),
            sleeps: c.sleeps.load(Ordering::Relaxed),
            joins: c.joins.load(Ordering::Relaxed),
            leader_sleeps: c.leader_sleeps.load(Ordering::Relaxed),
            idle_spin: Duration::from_nanos(c.idle_spin_ns.load(Ordering::Relaxed)),
            preempted_spins: c.preempted_spins.load(Ordering::Relaxed),
            preempted_threads: c.preempted_threads.load(Ordering::Relaxed),
            worker_cpu_time: self.cpu_clocks.lock().iter().map(cpu_time_of).sum(),
            inline_submissions: c.inline_submissions.load(Ordering::Relaxed),
        }
    }

    /// The statistics line `FERRITE_LOCAL_TASK_STATS` prints.
    pub(super) fn report(&self) {
        let s = self.stats();
        let total = (s.workgroups_on_workers + s.workgroups_on_callers).max(1) as f64;
        eprintln!(
            "local-task stats: {} workers; workgroups on workers {} ({:.1}%), on other threads {} ({:.1}%); {} command buffers; {} submissions run inline; {} joins; {} leader sleeps; {} worker sleeps; {} spins cut short by preemption; {} threads found preempted; {:.3} ms idle polling; {:.3} ms worker CPU",
            self.workers,
            s.workgroups_on_workers,
            100.0 * s.workgroups_on_workers as f64 / total,
            s.workgroups_on_callers,
            100.0 * s.workgroups_on_callers as f64 / total,
            s.regions,
            s.inline_submissions,
            s.joins,
            s.leader_sleeps,
            s.sleeps,
            s.preempted_spins,
            s.preempted_threads,
            s.idle_spin.as_secs_f64() * 1e3,
            s.worker_cpu_time.as_secs_f64() * 1e3,
        );
        // How evenly the workers shared the work: on a machine whose CPUs
        // are all busy, the scheduler gives each CPU's threads their fair
        // share, so a worker that ran (or spun) far more than the others
        // is the one descheduled mid-tile (issue 25).
        let mut per_worker: Vec<Duration> =
            self.cpu_clocks.lock().iter().map(cpu_time_of).collect();
        if !per_worker.is_empty() {
            per_worker.sort();
            let ms = |d: Duration| d.as_secs_f64() * 1e3;
            eprintln!(
                "  worker CPU min / median / max: {:.3} / {:.3} / {:.3} ms",
                ms(per_worker[0]),
                ms(per_worker[per_worker.len() / 2]),
                ms(per_worker[per_worker.len() - 1]),
            );
        }
        if let Some(t) = &self.timing {
            eprintln!("{}", t.lock().describe());
        }
    }
}

/// With this environment variable set, pools print their statistics when
/// dropped or at process exit, whichever comes first.
pub(super) const STATS_VAR: &str = "FERRITE_LOCAL_TASK_STATS";

/// Pools to report at exit (dropped ones are removed).
pub(super) static REPORT_AT_EXIT: Mutex<Vec<Weak<PoolState>>> = Mutex::new(Vec::new());

/// Prints the statistics of `state` at process exit unless its pool is
/// dropped first.
pub(super) fn report_at_exit(shared: &Arc<PoolState>) {
    static HOOK: std::sync::Once = std::sync::Once::new();
    REPORT_AT_EXIT.lock().push(Arc::downgrade(shared));
    #[cfg(unix)]
    HOOK.call_once(|| {
        extern "C" fn report_all() {
            for pool in REPORT_AT_EXIT.lock().iter().filter_map(Weak::upgrade) {
                pool.report();
            }
        }
        // SAFETY: `report_all` is an `extern "C" fn()` that lives for the
        // whole program; atexit only stores it. It takes only locks no
        // exiting thread holds across a call to `exit`.
        unsafe {
            libc::atexit(report_all);
        }
    });
}

/// The CPU-time clock of the thread of `handle`.
#[cfg(target_os = "linux")]
pub(super) fn cpu_clock(handle: &JoinHandle<()>) -> Option<CpuClock> {
    use std::os::unix::thread::JoinHandleExt;
    let mut clock: libc::clockid_t = 0;
    // SAFETY: the thread is alive (just started, joined only by the pool's
    // drop); `clock` is a valid out-pointer.
    let rc = unsafe { libc::pthread_getcpuclockid(handle.as_pthread_t(), &mut clock) };
    (rc == 0).then_some(clock)
}

#[cfg(not(target_os = "linux"))]
pub(super) fn cpu_clock(_handle: &JoinHandle<()>) -> Option<CpuClock> {
    None
}

/// CPU time used so far on `clock` (its thread must still run: the pool
/// reads its workers' clocks only before joining them).
#[cfg(target_os = "linux")]
pub(super) fn cpu_time_of(clock: &CpuClock) -> Duration {
    // SAFETY: `ts` is a valid out-pointer; a stale clock id only makes the
    // call fail, which is handled.
    unsafe {
        let mut ts: libc::timespec = std::mem::zeroed();
        if libc::clock_gettime(*clock, &mut ts) != 0 {
            return Duration::ZERO;
        }
        Duration::new(ts.tv_sec as u64, ts.tv_nsec as u32)
    }
}

#[cfg(not(target_os = "linux"))]
pub(super) fn cpu_time_of(_clock: &CpuClock) -> Duration {
    Duration::ZERO
}
