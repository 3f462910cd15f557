//! What a pool has done: counters, the workers' CPU time, and the
//! statistics `FERRITE_LOCAL_TASK_STATS` prints.

use std::sync::atomic::AtomicU64;
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
    /// Times a region's participant, out of tiles after working at least
    /// `region::LONG_STAGE` in a stage, slept until the next stage instead
    /// of spinning.
    pub long_stage_waits: u64,
    /// Regions started while the pool was contended and its recent tiles
    /// short, whose helpers the short-tile rule capped
    /// (`PoolState::region_helpers`).
    pub short_tile_caps: u64,
    /// Regions started by a caller while the pool was contended that the
    /// contended-caller rule let every worker join
    /// (`PoolState::region_helpers`).
    pub contended_widened: u64,
    /// CPU time the worker threads have used (Linux; zero elsewhere).
    pub worker_cpu_time: Duration,
    /// Submissions the device ran on the submitting thread (small work
    /// whose wait was already reached) instead of queueing them.
    pub inline_submissions: u64,
    /// Of those, submissions the loaded-solo rule ran there (work of short
    /// tiles while other programs kept every CPU busy; see
    /// `WorkerPool::solo_now`).
    pub solo_submissions: u64,
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
    pub(super) long_stage_waits: AtomicU64,
    pub(super) short_tile_caps: AtomicU64,
    pub(super) contended_widened: AtomicU64,
    pub(super) inline_submissions: AtomicU64,
    pub(super) solo_submissions: AtomicU64,
}

/// A thread's CPU-time clock id (valid while the thread lives).
#[cfg(target_os = "linux")]
pub(super) type CpuClock = libc::clockid_t;
#[cfg(not(target_os = "linux"))]
pub(super) type CpuClock = ();

/// With this environment variable set, pools print their statistics when
/// dropped or at process exit, whichever comes first.
pub(super) const STATS_VAR: &str = "FERRITE_LOCAL_TASK_STATS";

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
