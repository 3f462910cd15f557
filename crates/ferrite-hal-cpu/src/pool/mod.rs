//! The worker pool of `local-task`: a fixed set of threads that run queue
//! submissions (jobs) and, together, the stages of command buffers
//! (regions).
//!
//! - Jobs: whole queue submissions, run once their wait fence is reached,
//!   first come first served.
//! - Regions ([`region`]): a command buffer being executed, split at its
//!   barriers into stages of independent tiles (slices of dispatches'
//!   workgroup grids, transfers). The thread executing it leads; idle
//!   workers join while there is work and room, and stay across barriers
//!   while the next stage comes soon. While CPUs are free a region never
//!   holds more threads than the pool has workers, the leader included:
//!   when the leader is a waiting caller (below), one worker stays out, so
//!   `N` workers means at most `N` threads computing, as upstream's `N`
//!   worker groups. While the pool is contended (its threads lose their
//!   CPUs to other work), a caller's region of longer tiles admits every
//!   worker beside the caller (`PoolState::region_helpers`).
//!
//!
//! Its parts:
//! - [`queue`]: the job queue;
//! - `idle`: idle workers polling, sleeping (module `park`: the futex)
//!   and being woken, and joining regions;
//! - [`lending`]: waiters running queued jobs themselves;
//! - [`region`]: command buffers run together, stage by stage;
//! - [`stats`]: counters and `FERRITE_LOCAL_TASK_STATS` (`timing`: its
//!   per-stage timing).

mod idle;
pub mod lending;
mod machine_load;
mod park;
pub mod queue;
pub mod region;
mod report;
mod state;
pub mod stats;
mod timing;

#[cfg(test)]
mod tests;

pub use lending::lends_by_default;
pub use queue::Job;
pub use stats::PoolStats;

use ferrite_base::wait::Helper;
use ferrite_base::{Result, Status, StatusCode};
use parking_lot::Mutex;
use region::RegionWork;
use report::{report_at_exit, REPORT_AT_EXIT};
use state::PoolState;
use stats::{cpu_clock, Counters, STATS_VAR};
use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Weak};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// Most workers a pool runs: upstream's limit on topology groups (it clamps
/// larger `--task_topology_group_count` values to it, and so do we).
pub const MAX_WORKERS: usize = 256;

/// Default [`PoolOptions::idle_spin`]. Long enough to bridge the gap
/// between a program's calls (the VM work between two command buffers),
/// short enough that an idle process is idle.
pub const DEFAULT_IDLE_SPIN: Duration = Duration::from_micros(50);

/// How a pool is made.
#[derive(Clone, Debug)]
pub struct PoolOptions {
    /// Worker threads (at least one; at most [`MAX_WORKERS`], larger
    /// values are clamped).
    pub workers: usize,
    /// Stack size of each worker in bytes (None: the platform's default).
    pub stack_size: Option<usize>,
    /// Let threads blocked on what this pool's submissions signal run
    /// queued submissions (see [`lending`]; [`PoolOptions::new`] sets it
    /// to [`lends_by_default`]).
    pub lend_to_waiters: bool,
    /// How long an idle worker polls for work before it sleeps.
    pub idle_spin: Duration,
    /// Logical CPU ids to pin workers to, worker `i` to `cpu_ids[i %
    /// len]` (empty: not pinned).
    pub cpu_ids: Vec<usize>,
    /// A worker that cannot be pinned runs unpinned instead of failing
    /// the pool (for placement the user did not ask for: the driver's
    /// default, see [`crate::topology`]).
    pub pin_best_effort: bool,
    /// The loaded-solo rule (see [`WorkerPool::solo_now`]);
    /// [`PoolOptions::new`] turns it on unless `FERRITE_LOCAL_TASK_SOLO=0`.
    pub solo_when_loaded: bool,
}

impl PoolOptions {
    /// `workers` threads with the defaults: platform stack size, lending
    /// to waiters as [`lends_by_default`] says, [`DEFAULT_IDLE_SPIN`], not
    /// pinned.
    pub fn new(workers: usize) -> PoolOptions {
        PoolOptions {
            workers,
            stack_size: None,
            lend_to_waiters: lends_by_default(workers),
            idle_spin: DEFAULT_IDLE_SPIN,
            cpu_ids: Vec::new(),
            pin_best_effort: false,
            solo_when_loaded: solo_by_default(),
        }
    }
}

/// Whether pools use the loaded-solo rule unless told otherwise: yes,
/// unless the environment variable `FERRITE_LOCAL_TASK_SOLO` is `0`.
pub fn solo_by_default() -> bool {
    std::env::var(SOLO_VAR).map_or(true, |v| v.trim() != "0")
}

static NEXT_POOL_ID: AtomicUsize = AtomicUsize::new(1);

/// A fixed-size pool of worker threads (see the module docs).
pub struct WorkerPool {
    shared: Arc<PoolState>,
    threads: Vec<JoinHandle<()>>,
    /// Given to the semaphores this pool's submissions signal, when the
    /// pool lends to waiters (see [`lending`]).
    lend_target: Option<Weak<dyn Helper>>,
}

impl WorkerPool {
    /// Starts `count` workers with the default options.
    pub fn new(count: usize) -> Result<WorkerPool> {
        WorkerPool::with_options(&PoolOptions::new(count))
    }

    /// Starts a pool. Fails with `RESOURCE_EXHAUSTED` when the system
    /// refuses a thread (those already started are stopped) and with
    /// `INVALID_ARGUMENT` when a worker cannot be pinned to its CPU.
    pub fn with_options(options: &PoolOptions) -> Result<WorkerPool> {
        let count = options.workers.clamp(1, MAX_WORKERS);
        let shared = Arc::new(PoolState {
            id: NEXT_POOL_ID.fetch_add(1, Ordering::Relaxed),
            workers: count,
            idle_spin: options.idle_spin,
            jobs: Mutex::new(VecDeque::new()),
            queued: AtomicUsize::new(0),
            pollers: AtomicUsize::new(0),
            regions: parking_lot::RwLock::new(Vec::new()),
            region_count: AtomicUsize::new(0),
            epoch: AtomicU32::new(0),
            sleepers: AtomicU32::new(0),
            shutdown: AtomicBool::new(false),
            stats: Counters::default(),
            cpu_clocks: Mutex::new(Vec::with_capacity(count)),
            timing: timing::requested(std::env::var_os(STATS_VAR).as_deref())
                .then(Default::default),
            clock: Instant::now(),
            contended_until: AtomicU64::new(0),
            fixed_spin: std::env::var(SPIN_VAR)
                .ok()
                .and_then(|v| v.trim().parse().ok())
                .map(Duration::from_micros),
            contended_spin: std::env::var(CONTENDED_SPIN_VAR)
                .ok()
                .and_then(|v| v.trim().parse().ok())
                .map_or(region::CONTENDED_SPIN, Duration::from_micros),
            contended_helpers: std::env::var(CONTENDED_HELPERS_VAR)
                .ok()
                .and_then(|v| v.trim().parse().ok()),
            pauses_per_poll: std::env::var(PAUSES_VAR)
                .ok()
                .and_then(|v| v.trim().parse().ok())
                .unwrap_or(region::DEFAULT_PAUSES_PER_POLL),
            banks: AtomicBool::new(std::env::var(BANKS_VAR).is_ok_and(|v| v.trim() == "1")),
            slice: std::env::var(SLICE_VAR)
                .ok()
                .and_then(|v| v.trim().parse().ok())
                .map(Duration::from_micros),
            switch_check: std::env::var(SWITCH_CHECK_VAR).map_or(true, |v| v.trim() != "0"),
            leader_aside: AtomicBool::new(std::env::var(ASIDE_VAR).is_ok_and(|v| v.trim() == "1")),
            join_exclusive: AtomicBool::new(flag(JOIN_EXCLUSIVE_VAR)),
            stage_sleep_ns: AtomicU64::new(env_us_as_ns(STAGE_SLEEP_VAR, 0)),
            wake_all: AtomicBool::new(flag(WAKE_ALL_VAR)),
            shared_claim: AtomicBool::new(flag(SHARED_CLAIM_VAR)),
            long_stage_ns: AtomicU64::new(env_us_as_ns(
                LONG_STAGE_VAR,
                region::LONG_STAGE.as_nanos() as u64,
            )),
            long_stage_contended: AtomicBool::new(flag(LONG_STAGE_CONTENDED_VAR)),
            short_tile_ns: AtomicU64::new(env_us_as_ns(
                SHORT_TILE_VAR,
                region::SHORT_TILE.as_nanos() as u64,
            )),
            short_tile_helpers: std::env::var(SHORT_TILE_HELPERS_VAR)
                .ok()
                .and_then(|v| v.trim().parse().ok())
                .unwrap_or(region::SHORT_TILE_HELPERS),
            recent_tile_ns: AtomicU64::new(0),
            contended_caller: AtomicBool::new(
                std::env::var(CONTENDED_CALLER_VAR).map_or(true, |v| v.trim() != "0"),
            ),
            machine: machine_load::MachineLoad::new(),
            solo_when_loaded: options.solo_when_loaded,
            solo_rests_until: AtomicU64::new(0),
            solo_avg_ns: AtomicU64::new(0),
        });
        let mut pool = WorkerPool {
            shared: shared.clone(),
            threads: Vec::with_capacity(count),
            lend_target: None,
        };
        let whole_core = (options.pin_best_effort
            && !crate::topology::pins_one_cpu(
                std::env::var_os(crate::topology::PIN_VAR).as_deref(),
            ))
        .then(crate::topology::allowed_cpus)
        .flatten();
        for i in 0..count {
            let s = shared.clone();
            let mut builder = std::thread::Builder::new().name(format!("ferrite-worker-{i}"));
            if let Some(size) = options.stack_size {
                builder = builder.stack_size(size);
            }
            // On failure `pool` is dropped, which stops the started workers.
            let handle = builder
                .spawn(move || s.worker_main(i as u32))
                .map_err(|e| {
                    Status::new(
                        StatusCode::ResourceExhausted,
                        format!("starting local-task worker thread {i} of {count}: {e}"),
                    )
                })?;
            if !options.cpu_ids.is_empty() {
                let cpu = options.cpu_ids[i % options.cpu_ids.len()];
                // The default placement (best effort) lets a worker run on
                // its whole core (topology::core_cpus says why); CPUs the
                // user listed are taken as given.
                let cpus = match &whole_core {
                    Some(allowed) => {
                        crate::topology::core_cpus(cpu, allowed, crate::topology::sysfs_core_of)
                    }
                    None => vec![cpu],
                };
                let pinned = pin(&handle, &cpus);
                if !options.pin_best_effort {
                    pinned.map_err(|e| {
                        Status::new(
                            StatusCode::InvalidArgument,
                            format!("pinning local-task worker {i} to CPUs {cpus:?}: {e}"),
                        )
                    })?;
                }
            }
            if let Some(clock) = cpu_clock(&handle) {
                shared.cpu_clocks.lock().push(clock);
            }
            pool.threads.push(handle);
        }
        if std::env::var_os(STATS_VAR).is_some() {
            report_at_exit(&shared);
        }
        if options.lend_to_waiters && options.stack_size.is_none() {
            pool.lend_target = Some(lending::lend_target(&shared));
        }
        Ok(pool)
    }

    /// Number of worker threads.
    pub fn worker_count(&self) -> usize {
        self.threads.len()
    }

    /// Whether blocked waiters run this pool's queued submissions.
    pub fn lends_to_waiters(&self) -> bool {
        self.lend_target.is_some()
    }

    /// The loaded-solo rule: whether a submission whose wait is reached
    /// should run on the submitting thread, one command after another,
    /// waking no worker: while other programs' threads keep every CPU of
    /// the machine busy and this pool's recent tiles were short (a small
    /// program), unless solo runs lately took longer than
    /// `state::SOLO_MAX` on average. The device asks it only for a thread that is
    /// not one of this pool's workers, and reports each solo run with
    /// [`WorkerPool::note_solo_run`].
    pub fn solo_now(&self) -> bool {
        self.shared.solo_now()
    }

    /// A submission ran solo (see [`WorkerPool::solo_now`]) in `took`.
    pub fn note_solo_run(&self, took: Duration) {
        self.shared.note_solo_run(took);
    }

    /// Runs `job` on some worker (or a waiter lending its thread).
    pub fn spawn(&self, job: Job) {
        self.shared.push(job);
    }

    /// Runs `work`'s stages on this pool with the calling thread leading
    /// (see [`region`]); returns the first failure.
    pub fn run_region(&self, work: &dyn RegionWork) -> Result<()> {
        region::run(&self.shared, work, self.processor_id())
    }

    /// The logical processor id of the calling thread: its worker index,
    /// or [`WorkerPool::worker_count`] for any other thread.
    pub fn processor_id(&self) -> u32 {
        self.shared
            .current_worker()
            .unwrap_or(self.threads.len() as u32)
    }

    /// Whether the calling thread is one of this pool's workers.
    pub fn on_worker_thread(&self) -> bool {
        self.shared.current_worker().is_some()
    }

    /// Counts a submission the device ran on its submitting thread instead
    /// of queueing it ([`PoolStats::inline_submissions`]).
    pub fn note_inline_submission(&self) {
        self.shared
            .stats
            .inline_submissions
            .fetch_add(1, Ordering::Relaxed);
    }

    /// Counts a small command buffer the calling thread ran outside any
    /// region (one command after another) and its `workgroups`, as a
    /// region counts itself and its tiles (on workers or other threads).
    pub fn note_small_command_buffer(&self, workgroups: u64) {
        self.shared.stats.regions.fetch_add(1, Ordering::Relaxed);
        self.shared
            .counter_for_this_thread()
            .fetch_add(workgroups, Ordering::Relaxed);
    }

    /// Counters of what the pool has done so far.
    pub fn stats(&self) -> PoolStats {
        self.shared.stats()
    }
}

/// A whole number of microseconds: every spin of a pool made afterwards
/// (idle workers, stage waits) lasts that long at most, whether or not the
/// machine is contended (a tuning and measuring aid; unset: adaptive, see
/// `region::Spin`).
const SPIN_VAR: &str = "FERRITE_LOCAL_TASK_SPIN_US";

/// A whole number of microseconds: the bound of every spin of a pool made
/// afterwards while the pool is contended (a measuring aid for issue 25;
/// unset: [`region::CONTENDED_SPIN`]).
const CONTENDED_SPIN_VAR: &str = "FERRITE_LOCAL_TASK_CONTENDED_SPIN_US";

/// A whole number: while the pool is contended (a spinner was descheduled
/// within the last [`region::CONTENDED_FOR`]), at most this many workers
/// join a region beside its leader (a tuning and measuring aid; unset: all).
const CONTENDED_HELPERS_VAR: &str = "FERRITE_LOCAL_TASK_CONTENDED_HELPERS";

/// A whole number: pause instructions between two polls of every spin of
/// a pool made afterwards (a measuring aid; unset:
/// [`region::DEFAULT_PAUSES_PER_POLL`]).
const PAUSES_VAR: &str = "FERRITE_LOCAL_TASK_PAUSES";

/// `1`: regions of pools made afterwards keep their claim words in two
/// banks, and the thread that prepares a stage ahead also writes its
/// claim words, so a stage change stores one word (a measuring aid for
/// issue 27's stage-change cost; unset: one bank, written at the change).
const BANKS_VAR: &str = "FERRITE_LOCAL_TASK_BANKS";

/// `1`: a caller leading a region of a pool made afterwards leaves its
/// tiles to the workers while any is inside, and sleeps (a measuring aid
/// for issue 25: on 16 loaded cores it did not shorten MiniLM's calls, see
/// docs/figures.md; unset: the caller runs tiles beside the workers).
const ASIDE_VAR: &str = "FERRITE_LOCAL_TASK_LEADER_ASIDE";

/// A whole number of microseconds: the time slice each worker of a pool
/// made afterwards asks the scheduler for (see [`set_own_slice`]; a
/// measuring aid for issue 25; unset: the system's default).
const SLICE_VAR: &str = "FERRITE_LOCAL_TASK_SLICE_US";

/// `0`: threads of pools made afterwards do not look for involuntary
/// context switches ([`PoolState::note_if_switched_out`]), so only a
/// preempted spin marks the pool contended (the behaviour before; a
/// measuring aid to compare both on one binary).
const SWITCH_CHECK_VAR: &str = "FERRITE_LOCAL_TASK_SWITCH_CHECK";

/// `1`: joins of pools made afterwards take the region list's lock
/// exclusively (the behaviour before joins shared it; a measuring aid for
/// issue 25).
const JOIN_EXCLUSIVE_VAR: &str = "FERRITE_LOCAL_TASK_JOIN_EXCLUSIVE";

/// A whole number of microseconds: a region's participant with nothing
/// left to claim sleeps on the region's stage word until the next stage,
/// for at most that long, instead of spinning (the leader sleeps at once
/// too; a measuring aid for issue 25: a thread that spins uses up its
/// fair share of a busy CPU; unset or 0: spin).
const STAGE_SLEEP_VAR: &str = "FERRITE_LOCAL_TASK_STAGE_SLEEP_US";

/// `1`: each stage of pools made afterwards wakes as many sleeping workers
/// as it has tiles (up to the region's room), not counting those inside
/// already (a measuring aid for issue 25; upstream wakes one worker per
/// shard of every dispatch).
const WAKE_ALL_VAR: &str = "FERRITE_LOCAL_TASK_WAKE_ALL";

/// `1`: regions of pools made afterwards claim tiles from one shared
/// counter, as upstream's shards do, instead of one range per thread (a
/// measuring aid for issue 25).
const SHARED_CLAIM_VAR: &str = "FERRITE_LOCAL_TASK_SHARED_CLAIM";

/// A whole number of microseconds: a region's participant that worked at
/// least that long in a stage sleeps until the next stage instead of
/// spinning, in pools made afterwards (unset: [`region::LONG_STAGE`]; 0
/// turns the rule off, every participant spins as before, to compare both
/// on one binary).
const LONG_STAGE_VAR: &str = "FERRITE_LOCAL_TASK_LONG_STAGE_US";

/// `1`: that rule holds only while the pool is contended (a measuring aid
/// for issue 25; unset: always).
const LONG_STAGE_CONTENDED_VAR: &str = "FERRITE_LOCAL_TASK_LONG_STAGE_CONTENDED";

/// A whole number of microseconds: while a pool made afterwards is
/// contended, a region starting when the recent tiles averaged less than
/// that admits at most [`region::SHORT_TILE_HELPERS`] workers (the
/// short-tile rule, see `PoolState::region_helpers`; unset:
/// [`region::SHORT_TILE`]; 0 turns it off, to compare both on one binary).
const SHORT_TILE_VAR: &str = "FERRITE_LOCAL_TASK_SHORT_TILE_US";

/// A whole number: workers a region of short tiles admits beside its
/// leader while the pool is contended (a measuring aid for issue 25; unset:
/// [`region::SHORT_TILE_HELPERS`]).
const SHORT_TILE_HELPERS_VAR: &str = "FERRITE_LOCAL_TASK_SHORT_TILE_HELPERS";

/// `0`: while a pool made afterwards is contended, a region a caller leads
/// still admits one worker fewer than the pool has (the behaviour before
/// the contended-caller rule, see `PoolState::region_helpers`; unset: every
/// worker, beside the caller, for regions of longer tiles).
const CONTENDED_CALLER_VAR: &str = "FERRITE_LOCAL_TASK_CONTENDED_CALLER";

/// `0`: pools made afterwards do not use the loaded-solo rule unless their
/// options ask for it (see [`solo_by_default`]).
const SOLO_VAR: &str = "FERRITE_LOCAL_TASK_SOLO";

/// Whether the environment variable `name` is `1`.
fn flag(name: &str) -> bool {
    std::env::var(name).is_ok_and(|v| v.trim() == "1")
}

/// Asks the scheduler to give the calling thread time slices of `slice`
/// (Linux 6.12 and later, the EEVDF scheduler: `sched_setattr` with
/// `sched_runtime` on a normal-policy thread; its nice value is kept).
/// Why: on a machine whose CPUs all run busy processes, a worker woken
/// for a region's next stage may wait until the busy process on its CPU
/// has used its slice (0.75 ms and more by default); a woken thread with
/// a shorter slice than the running one preempts it at once. The kernel
/// clamps the value to 0.1-100 ms. A refusal (an older kernel, another
/// policy) is reported once on stderr and the default slice stays.
fn set_own_slice(slice: Duration) {
    static REPORTED: std::sync::Once = std::sync::Once::new();
    if let Err(why) = try_set_own_slice(slice) {
        REPORTED
            .call_once(|| eprintln!("{SLICE_VAR}: the scheduler refused a {slice:?} slice: {why}"));
    }
}

/// `struct sched_attr`, its first version (48 bytes).
#[cfg(target_os = "linux")]
#[repr(C)]
#[derive(Default)]
struct SchedAttr {
    size: u32,
    policy: u32,
    flags: u64,
    nice: i32,
    priority: u32,
    runtime: u64,
    deadline: u64,
    period: u64,
}

/// [`set_own_slice`]'s request; the error says why it was refused.
#[cfg(target_os = "linux")]
fn try_set_own_slice(slice: Duration) -> std::result::Result<(), String> {
    // SAFETY: sched_getscheduler and getpriority take no pointers and
    // concern the calling thread (id 0).
    let (policy, nice) = unsafe {
        (
            libc::sched_getscheduler(0),
            libc::getpriority(libc::PRIO_PROCESS, 0),
        )
    };
    if policy != libc::SCHED_OTHER {
        return Err(format!("the thread's policy is {policy}, not SCHED_OTHER"));
    }
    let attr = SchedAttr {
        size: std::mem::size_of::<SchedAttr>() as u32,
        policy: libc::SCHED_OTHER as u32,
        nice,
        runtime: slice.as_nanos().min(u64::MAX as u128) as u64,
        ..SchedAttr::default()
    };
    // SAFETY: `attr` is a fully initialised sched_attr of the size its
    // `size` field states, alive for the call, which only reads it; pid 0
    // is the calling thread.
    let rc = unsafe { libc::syscall(libc::SYS_sched_setattr, 0, &attr as *const SchedAttr, 0u32) };
    if rc != 0 {
        return Err(std::io::Error::last_os_error().to_string());
    }
    Ok(())
}

/// The calling thread's requested scheduler slice as `sched_getattr`
/// reports it (zero: the system's default; the tests check requests).
#[cfg(all(test, target_os = "linux"))]
fn own_slice() -> std::io::Result<Duration> {
    let mut attr = SchedAttr::default();
    // SAFETY: `attr` is writable memory of the size passed, alive for the
    // call; pid 0 is the calling thread; the kernel writes at most that
    // many bytes.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_sched_getattr,
            0,
            &mut attr as *mut SchedAttr,
            std::mem::size_of::<SchedAttr>() as u32,
            0u32,
        )
    };
    if rc != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(Duration::from_nanos(attr.runtime))
}

#[cfg(not(target_os = "linux"))]
fn try_set_own_slice(_slice: Duration) -> std::result::Result<(), String> {
    Err("not supported on this system".to_string())
}

impl WorkerPool {
    /// The pool as a queue that waiters may run work of, when it lends to
    /// waiters (None otherwise): name it to each semaphore a submission to
    /// the pool will signal (`Fence::signalled_by`) before the submission
    /// can run, and threads blocked on those semaphores, and only those,
    /// run the pool's queued submissions while they poll.
    pub fn lend_target(&self) -> Option<&Weak<dyn Helper>> {
        self.lend_target.as_ref()
    }
}

impl Drop for WorkerPool {
    fn drop(&mut self) {
        if std::env::var_os(STATS_VAR).is_some() {
            let mut pending = REPORT_AT_EXIT.lock();
            let before = pending.len();
            pending.retain(|w| !std::ptr::eq(w.as_ptr(), Arc::as_ptr(&self.shared)));
            if pending.len() < before {
                drop(pending);
                self.shared.report();
            }
        }
        self.shared.shutdown.store(true, Ordering::SeqCst);
        self.shared.epoch.fetch_add(1, Ordering::SeqCst);
        park::wake(&self.shared.epoch, u32::MAX);
        for t in self.threads.drain(..) {
            // A worker that panicked has already reported it.
            let _ = t.join();
        }
    }
}

/// Pins the thread of `handle` to the logical CPUs `cpus`.
#[cfg(target_os = "linux")]
fn pin(handle: &JoinHandle<()>, cpus: &[usize]) -> std::io::Result<()> {
    use std::os::unix::thread::JoinHandleExt;
    if cpus.is_empty() || cpus.iter().any(|&cpu| cpu >= libc::CPU_SETSIZE as usize) {
        return Err(std::io::Error::from_raw_os_error(libc::EINVAL));
    }
    // SAFETY: `set` is a plain bit set initialised by CPU_ZERO before use,
    // every CPU is below CPU_SETSIZE (checked), and the pthread handle
    // belongs to a thread that is alive (it is joined only by the pool's
    // drop).
    let rc = unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        libc::CPU_ZERO(&mut set);
        for &cpu in cpus {
            libc::CPU_SET(cpu, &mut set);
        }
        libc::pthread_setaffinity_np(
            handle.as_pthread_t(),
            std::mem::size_of::<libc::cpu_set_t>(),
            &set,
        )
    };
    if rc == 0 {
        Ok(())
    } else {
        Err(std::io::Error::from_raw_os_error(rc))
    }
}

#[cfg(not(target_os = "linux"))]
fn pin(_handle: &JoinHandle<()>, _cpus: &[usize]) -> std::io::Result<()> {
    Err(std::io::Error::new(
        std::io::ErrorKind::Unsupported,
        "thread affinity is only supported on Linux",
    ))
}

/// A duration in microseconds from the environment variable `var`, in
/// nanoseconds; `default_ns` when it is unset or not a whole number.
fn env_us_as_ns(var: &str, default_ns: u64) -> u64 {
    std::env::var(var)
        .ok()
        .and_then(|v| v.trim().parse::<u64>().ok())
        .map_or(default_ns, |us| us.saturating_mul(1000))
}
