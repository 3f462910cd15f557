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
//!   while the next stage comes soon. A region never holds more threads
//!   than the pool has workers, the leader included: when the leader is a
//!   waiting caller (below), one worker stays out, so `N` workers means at
//!   most `N` threads computing, as upstream's `N` worker groups.
//!
//! ## Sleeping and waking
//! An idle worker polls for new work for a bounded time
//! ([`PoolOptions::idle_spin`]) and then sleeps on the pool's futex word
//! (a futex, module `park`). Whatever creates work (a job, a region, a region's next
//! stage) bumps the word and wakes only as many sleepers as the work can
//! use, with one system call; woken workers take no lock on the way out.
//! An idle pool therefore burns no CPU, and a stage with one tile wakes
//! nobody.
//!
//! ## Lending to waiters
//! With [`PoolOptions::lend_to_waiters`], the pool registers
//! as a [`Helper`] with `ferrite_base::wait`: a thread blocked waiting on a
//! semaphore or fence (typically the program waiting for its results) runs
//! the pool's queued submissions itself while it polls, instead of idling
//! until a woken worker has run them, and then leads their regions. A new
//! job wakes no worker while such a waiter polls. The registration is
//! process-wide because a waiter cannot know which device will signal what
//! it waits for; it ends when the pool is dropped. Turning it off makes
//! every submission run on the workers and waiters only sleep. Pools with
//! a requested worker stack size never lend (a waiter's stack may be
//! smaller than the work expects). [`PoolStats`] reports the share of
//! workgroups run by workers and by other threads.
//!
//! Lending is on by default ([`lends_by_default`]), whatever the worker
//! count: a program's synchronous call submits and then waits, and the
//! waiter taking its own submission runs it at once on a thread that is
//! already running. Left to a worker, the call needs that worker woken and
//! then the waiter woken, and on a machine whose CPUs are all busy each
//! wake-up waits for the scheduler to give the thread a time slice: a
//! 4xf32 add took about 1 ms a call that way on 2 busy cores (issue 25).
//! Waiters poll without yielding the CPU (`ferrite_base::wait`): a yield
//! on a busy machine gives the CPU to another process for its whole slice.

mod park;
pub mod region;
mod timing;

use ferrite_base::wait::{register_helper, Helper, HelperRegistration};
use ferrite_base::{Result, Status, StatusCode};
use parking_lot::Mutex;
use region::{Region, RegionWork, Spin};
use std::cell::Cell;
use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Weak};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

type Job = Box<dyn FnOnce() + Send>;

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
    /// Let blocked waiters run queued submissions (see the module docs;
    /// [`PoolOptions::new`] sets it to [`lends_by_default`]).
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
        }
    }
}

/// Whether a pool of `workers` threads lends to waiters unless told
/// otherwise: always. A thread waiting for a submission it just made runs
/// that submission itself when no worker has taken it yet, so a call needs
/// no worker to be woken and scheduled: on a machine whose CPUs are all
/// busy, a woken thread waits for the scheduler (up to a time slice, about
/// 1 ms per wake-up measured on 2 cores), which made a 4xf32 add on
/// local-task take about 1 ms a call (issue 25). Idle, the waiter
/// running the work instead of a woken worker costs nothing either.
pub fn lends_by_default(workers: usize) -> bool {
    let _ = workers;
    true
}

/// What a pool has done so far (monotonic counters).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PoolStats {
    /// Workgroups run on the pool's worker threads.
    pub workgroups_on_workers: u64,
    /// Workgroups run on other threads (waiters that took a submission
    /// and led its command buffer).
    pub workgroups_on_callers: u64,
    /// Command-buffer executions (regions) run.
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
    /// CPU time the worker threads have used (Linux; zero elsewhere).
    pub worker_cpu_time: Duration,
}

#[derive(Default)]
struct Counters {
    on_workers: AtomicU64,
    on_callers: AtomicU64,
    regions: AtomicU64,
    sleeps: AtomicU64,
    joins: AtomicU64,
    leader_sleeps: AtomicU64,
    idle_spin_ns: AtomicU64,
    preempted_spins: AtomicU64,
}

static NEXT_POOL_ID: AtomicUsize = AtomicUsize::new(1);

thread_local! {
    /// (pool id, worker index) when this thread is a pool worker.
    static WORKER: Cell<Option<(usize, u32)>> = const { Cell::new(None) };
}

/// State the workers, regions and waiters share.
pub(crate) struct Shared {
    id: usize,
    workers: usize,
    idle_spin: Duration,
    jobs: Mutex<VecDeque<Job>>,
    /// Jobs queued and not yet taken (read without the lock).
    queued: AtomicUsize,
    /// Threads polling the queue right now: lending waiters and idle
    /// workers in their polling window (not those running work).
    pollers: AtomicUsize,
    regions: Mutex<Vec<Arc<Region>>>,
    /// Published regions (read without the lock).
    region_count: AtomicUsize,
    /// The futex word idle workers sleep on; bumped whenever work appears.
    epoch: AtomicU32,
    /// Workers asleep (or about to sleep) on `epoch`.
    sleepers: AtomicU32,
    shutdown: AtomicBool,
    stats: Counters,
    /// Each worker's CPU-time clock (Linux), read by [`WorkerPool::stats`].
    cpu_clocks: Mutex<Vec<CpuClock>>,
    /// Stage timing sums, when `FERRITE_LOCAL_TASK_STATS=stages`.
    timing: Option<timing::PoolTiming>,
    /// The pool's clock origin (for `contended_until`).
    clock: Instant,
    /// Nanoseconds after `clock` until which the pool counts as contended
    /// (see `region::Spin`).
    contended_until: AtomicU64,
    /// `FERRITE_LOCAL_TASK_SPIN_US`: a fixed bound for every spin of this
    /// pool (stage waits and idle polls), contention ignored.
    fixed_spin: Option<Duration>,
    /// `FERRITE_LOCAL_TASK_CONTENDED_HELPERS`: how many workers may join a
    /// region started while the pool is contended (unset: all of them).
    contended_helpers: Option<usize>,
}

/// A thread's CPU-time clock id (valid while the thread lives).
#[cfg(target_os = "linux")]
type CpuClock = libc::clockid_t;
#[cfg(not(target_os = "linux"))]
type CpuClock = ();

// The wake-up protocol: a producer makes work visible, then bumps `epoch`
// and reads `sleepers`; a worker about to sleep reads `epoch`, increments
// `sleepers`, re-checks for work, then sleeps only while `epoch` still
// holds what it read. All SeqCst: either the worker's re-check sees the
// work, or the producer sees the sleeper (and wakes it), or the epoch
// moved and the futex wait returns at once.
impl Shared {
    /// Signals new work that `want` more threads could use.
    fn notify(&self, want: u32) {
        self.epoch.fetch_add(1, Ordering::SeqCst);
        if want > 0 && self.sleepers.load(Ordering::SeqCst) > 0 {
            park::wake(&self.epoch, want);
        }
    }

    fn push(&self, job: Job) {
        self.jobs.lock().push_back(job);
        let queued = self.queued.fetch_add(1, Ordering::SeqCst) + 1;
        // Threads about to look at the queue take jobs without a wake-up:
        // pollers (idle workers in their polling window, lending waiters)
        // and the pushing thread itself when it is one of this pool's
        // workers (a job pushes the jobs that waited for it as it ends, and
        // its worker takes the next one when it returns). Waking a worker
        // for a job one of them takes would only cost the waker a system
        // call and the woken worker a polling window.
        let pusher = usize::from(self.current_worker().is_some());
        let takers = self.pollers.load(Ordering::SeqCst) + pusher;
        let want = queued.saturating_sub(takers).min(u32::MAX as usize) as u32;
        self.notify(want);
    }

    fn pop(&self) -> Option<Job> {
        if self.queued.load(Ordering::SeqCst) == 0 {
            return None;
        }
        let job = self.jobs.lock().pop_front();
        if job.is_some() {
            self.queued.fetch_sub(1, Ordering::SeqCst);
        }
        job
    }

    fn publish(&self, region: &Arc<Region>) {
        self.regions.lock().push(region.clone());
        self.region_count.fetch_add(1, Ordering::SeqCst);
    }

    fn unpublish(&self, region: &Arc<Region>) {
        let mut regions = self.regions.lock();
        regions.retain(|r| !Arc::ptr_eq(r, region));
        self.region_count.fetch_sub(1, Ordering::SeqCst);
    }

    /// A published region a worker could join now.
    fn has_joinable(&self) -> bool {
        self.region_count.load(Ordering::SeqCst) > 0
            && self.regions.lock().iter().any(|r| r.joinable())
    }

    /// Joins a region with work and room, if any, and works in it.
    fn try_join(&self, index: u32) -> bool {
        if self.region_count.load(Ordering::Acquire) == 0 {
            return false;
        }
        let region = {
            let regions = self.regions.lock();
            let Some(r) = regions.iter().find(|r| r.joinable()) else {
                return false;
            };
            r.enter();
            r.clone()
        };
        self.stats.joins.fetch_add(1, Ordering::Relaxed);
        region.work_in(index, &self.stats.on_workers);
        region.leave();
        true
    }

    /// The bound of a spin that would last `bound` on an idle machine: at
    /// most [`region::CONTENDED_SPIN`] while the pool is contended (see
    /// `region::Spin`), or the fixed bound of `FERRITE_LOCAL_TASK_SPIN_US`.
    pub(crate) fn spin_bound(&self, bound: Duration) -> Duration {
        if let Some(fixed) = self.fixed_spin {
            return fixed;
        }
        if self.is_contended() {
            bound.min(region::CONTENDED_SPIN)
        } else {
            bound
        }
    }

    /// How many workers may join a region that starts now: all but one
    /// (the leader runs tiles too), or fewer while the pool is contended
    /// and `FERRITE_LOCAL_TASK_CONTENDED_HELPERS` caps it.
    pub(crate) fn region_helpers(&self) -> usize {
        let all = self.workers.saturating_sub(1);
        match self.contended_helpers {
            Some(cap) if self.is_contended() => all.min(cap),
            _ => all,
        }
    }

    /// Whether a spinner noticed preemption within [`region::CONTENDED_FOR`].
    fn is_contended(&self) -> bool {
        let now = self.clock.elapsed().as_nanos() as u64;
        now < self.contended_until.load(Ordering::Relaxed)
    }

    /// A spinner of this pool was descheduled: the machine has more
    /// runnable threads than CPUs; spins stay short for a while.
    pub(crate) fn note_preempted(&self) {
        self.stats.preempted_spins.fetch_add(1, Ordering::Relaxed);
        let until = (self.clock.elapsed() + region::CONTENDED_FOR).as_nanos() as u64;
        self.contended_until.fetch_max(until, Ordering::Relaxed);
    }

    /// The counter of workgroups run by the calling thread's kind.
    fn counter_for_this_thread(&self) -> &AtomicU64 {
        if self.current_worker().is_some() {
            &self.stats.on_workers
        } else {
            &self.stats.on_callers
        }
    }

    /// This thread's worker index, when it is one of this pool's workers.
    fn current_worker(&self) -> Option<u32> {
        WORKER
            .with(Cell::get)
            .and_then(|(pool, i)| (pool == self.id).then_some(i))
    }

    fn worker_main(&self, index: u32) {
        WORKER.with(|w| w.set(Some((self.id, index))));
        // Its poll for work since it last found nothing to do (None: it
        // just worked).
        let mut idle_since: Option<Spin> = None;
        loop {
            if let Some(job) = self.pop() {
                run_job(job);
                idle_since = None;
                continue;
            }
            if self.try_join(index) {
                idle_since = None;
                continue;
            }
            if self.shutdown.load(Ordering::SeqCst) {
                return;
            }
            // Poll for new work (anything new bumps the epoch) for at most
            // `idle_spin` in all: bumps for work other threads take do not
            // extend the window, so an idle worker sleeps on time even
            // while the rest of the pool is busy.
            // While it polls it counts as a poller: new jobs wake nobody
            // (see `push`); it leaves the count before looking at the
            // queue again, so a job pushed meanwhile is seen (SeqCst on
            // both sides, as with lending waiters).
            // A descheduled poller (see `region::Spin`) stops polling and
            // sleeps at once.
            let spin = idle_since.get_or_insert_with(|| Spin::start(self, self.idle_spin));
            let since = spin.since();
            let seen = self.epoch.load(Ordering::SeqCst);
            let mut woke = false;
            self.pollers.fetch_add(1, Ordering::SeqCst);
            while spin.poll(self) {
                if self.epoch.load(Ordering::Relaxed) != seen {
                    woke = true;
                    break;
                }
            }
            self.pollers.fetch_sub(1, Ordering::SeqCst);
            if woke {
                continue;
            }
            self.stats
                .idle_spin_ns
                .fetch_add(since.elapsed().as_nanos() as u64, Ordering::Relaxed);
            idle_since = None;
            let seen = self.epoch.load(Ordering::SeqCst);
            self.sleepers.fetch_add(1, Ordering::SeqCst);
            let idle = self.queued.load(Ordering::SeqCst) == 0
                && !self.shutdown.load(Ordering::SeqCst)
                && !self.has_joinable();
            if idle {
                self.stats.sleeps.fetch_add(1, Ordering::Relaxed);
                park::wait(&self.epoch, seen);
            }
            self.sleepers.fetch_sub(1, Ordering::SeqCst);
        }
    }
}

/// Runs a queued job, containing a panic: the worker (or lending waiter)
/// lives on, and the panic is reported on stderr. Jobs that have an
/// outcome to report (the device's submissions) catch their own panics
/// and fail their fences with them; this is the backstop for any other.
fn run_job(job: Job) {
    if let Err(payload) = std::panic::catch_unwind(std::panic::AssertUnwindSafe(job)) {
        eprintln!(
            "local-task: a queued job panicked: {}",
            region::panic_message(&*payload)
        );
    }
}

/// A blocked waiter lends its thread to the pool's queued submissions.
impl Helper for Shared {
    fn start_polling(&self) {
        self.pollers.fetch_add(1, Ordering::SeqCst);
    }

    fn help_one(&self) -> bool {
        // While it runs the job this thread does not poll: new jobs must
        // wake a worker meanwhile.
        let Some(job) = self.pop() else {
            return false;
        };
        self.stop_polling();
        run_job(job);
        self.start_polling();
        true
    }

    fn stop_polling(&self) {
        self.pollers.fetch_sub(1, Ordering::SeqCst);
        if self.queued.load(Ordering::SeqCst) > 0 {
            self.notify(1);
        }
    }
}

/// A fixed-size pool of worker threads (see the module docs).
pub struct WorkerPool {
    shared: Arc<Shared>,
    threads: Vec<JoinHandle<()>>,
    lends: bool,
    _registration: Option<HelperRegistration>,
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
        let shared = Arc::new(Shared {
            id: NEXT_POOL_ID.fetch_add(1, Ordering::Relaxed),
            workers: count,
            idle_spin: options.idle_spin,
            jobs: Mutex::new(VecDeque::new()),
            queued: AtomicUsize::new(0),
            pollers: AtomicUsize::new(0),
            regions: Mutex::new(Vec::new()),
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
            contended_helpers: std::env::var(CONTENDED_HELPERS_VAR)
                .ok()
                .and_then(|v| v.trim().parse().ok()),
        });
        let mut pool = WorkerPool {
            shared: shared.clone(),
            threads: Vec::with_capacity(count),
            lends: false,
            _registration: None,
        };
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
                let pinned = pin(&handle, cpu);
                if !options.pin_best_effort {
                    pinned.map_err(|e| {
                        Status::new(
                            StatusCode::InvalidArgument,
                            format!("pinning local-task worker {i} to CPU {cpu}: {e}"),
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
            let weak: Weak<dyn Helper> = Arc::downgrade(&shared) as Weak<dyn Helper>;
            pool._registration = Some(register_helper(weak));
            pool.lends = true;
        }
        Ok(pool)
    }

    /// Number of worker threads.
    pub fn worker_count(&self) -> usize {
        self.threads.len()
    }

    /// Whether blocked waiters run this pool's queued submissions.
    pub fn lends_to_waiters(&self) -> bool {
        self.lends
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

    /// Counters of what the pool has done so far.
    pub fn stats(&self) -> PoolStats {
        self.shared.stats()
    }
}

impl Shared {
    /// Counters so far; only while the workers live (their CPU clocks).
    fn stats(&self) -> PoolStats {
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
            worker_cpu_time: self.cpu_clocks.lock().iter().map(cpu_time_of).sum(),
        }
    }

    /// The statistics line `FERRITE_LOCAL_TASK_STATS` prints.
    fn report(&self) {
        let s = self.stats();
        let total = (s.workgroups_on_workers + s.workgroups_on_callers).max(1) as f64;
        eprintln!(
            "local-task stats: {} workers; workgroups on workers {} ({:.1}%), on other threads {} ({:.1}%); {} command buffers; {} joins; {} leader sleeps; {} worker sleeps; {} spins cut short by preemption; {:.3} ms idle polling; {:.3} ms worker CPU",
            self.workers,
            s.workgroups_on_workers,
            100.0 * s.workgroups_on_workers as f64 / total,
            s.workgroups_on_callers,
            100.0 * s.workgroups_on_callers as f64 / total,
            s.regions,
            s.joins,
            s.leader_sleeps,
            s.sleeps,
            s.preempted_spins,
            s.idle_spin.as_secs_f64() * 1e3,
            s.worker_cpu_time.as_secs_f64() * 1e3,
        );
        if let Some(t) = &self.timing {
            eprintln!("{}", t.lock().describe());
        }
    }
}

/// A whole number of microseconds: every spin of a pool made afterwards
/// (idle workers, stage waits) lasts that long at most, whether or not the
/// machine is contended (a tuning and measuring aid; unset: adaptive, see
/// `region::Spin`).
const SPIN_VAR: &str = "FERRITE_LOCAL_TASK_SPIN_US";

/// With this environment variable set, pools print their statistics when
/// dropped or at process exit, whichever comes first.
const STATS_VAR: &str = "FERRITE_LOCAL_TASK_STATS";

/// A whole number: while the pool is contended (a spinner was descheduled
/// within the last [`region::CONTENDED_FOR`]), at most this many workers
/// join a region beside its leader (a tuning and measuring aid; unset: all).
const CONTENDED_HELPERS_VAR: &str = "FERRITE_LOCAL_TASK_CONTENDED_HELPERS";

/// Pools to report at exit (dropped ones are removed).
static REPORT_AT_EXIT: Mutex<Vec<Weak<Shared>>> = Mutex::new(Vec::new());

fn report_at_exit(shared: &Arc<Shared>) {
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

/// Pins the thread of `handle` to logical CPU `cpu`.
#[cfg(target_os = "linux")]
fn pin(handle: &JoinHandle<()>, cpu: usize) -> std::io::Result<()> {
    use std::os::unix::thread::JoinHandleExt;
    if cpu >= libc::CPU_SETSIZE as usize {
        return Err(std::io::Error::from_raw_os_error(libc::EINVAL));
    }
    // SAFETY: `set` is a plain bit set initialised by CPU_ZERO before use,
    // `cpu` is below CPU_SETSIZE (checked), and the pthread handle belongs
    // to a thread that is alive (it is joined only by the pool's drop).
    let rc = unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        libc::CPU_ZERO(&mut set);
        libc::CPU_SET(cpu, &mut set);
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
fn pin(_handle: &JoinHandle<()>, _cpu: usize) -> std::io::Result<()> {
    Err(std::io::Error::new(
        std::io::ErrorKind::Unsupported,
        "thread affinity is only supported on Linux",
    ))
}

/// The CPU-time clock of the thread of `handle`.
#[cfg(target_os = "linux")]
fn cpu_clock(handle: &JoinHandle<()>) -> Option<CpuClock> {
    use std::os::unix::thread::JoinHandleExt;
    let mut clock: libc::clockid_t = 0;
    // SAFETY: the thread is alive (just started, joined only by the pool's
    // drop); `clock` is a valid out-pointer.
    let rc = unsafe { libc::pthread_getcpuclockid(handle.as_pthread_t(), &mut clock) };
    (rc == 0).then_some(clock)
}

#[cfg(not(target_os = "linux"))]
fn cpu_clock(_handle: &JoinHandle<()>) -> Option<CpuClock> {
    None
}

/// CPU time used so far on `clock` (its thread must still run: the pool
/// reads its workers' clocks only before joining them).
#[cfg(target_os = "linux")]
fn cpu_time_of(clock: &CpuClock) -> Duration {
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
fn cpu_time_of(_clock: &CpuClock) -> Duration {
    Duration::ZERO
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The stack size of the calling thread, as pthreads reports it.
    fn current_stack_size() -> usize {
        // SAFETY: `attr` is initialised by pthread_getattr_np before it is
        // read and destroyed once; `size` is a valid out-pointer; both calls
        // concern the calling thread, which is alive throughout.
        unsafe {
            let mut attr: libc::pthread_attr_t = std::mem::zeroed();
            assert_eq!(libc::pthread_getattr_np(libc::pthread_self(), &mut attr), 0);
            let mut size = 0usize;
            assert_eq!(libc::pthread_attr_getstacksize(&attr, &mut size), 0);
            libc::pthread_attr_destroy(&mut attr);
            size
        }
    }

    #[test]
    fn jobs_queued_while_a_waiter_polls_still_run() {
        let pool = WorkerPool::new(1).unwrap();
        let (tx, rx) = std::sync::mpsc::channel();
        for round in 0..200u32 {
            // A waiter polls (and may take the job) for at most a few µs,
            // then stops: whoever does not run the job must have woken a
            // worker for it.
            let waiter = std::thread::spawn(|| {
                let deadline = ferrite_base::time::Deadline::after(Duration::from_micros(20));
                ferrite_base::wait::spin_until(deadline, || false)
            });
            let tx = tx.clone();
            pool.spawn(Box::new(move || tx.send(round).unwrap()));
            waiter.join().unwrap();
            assert_eq!(rx.recv_timeout(Duration::from_secs(10)), Ok(round));
        }
    }

    /// A chain of jobs each pushing the next from a worker (as a
    /// submission's end releases the one waiting for it): every job runs,
    /// and the chain wakes (almost) no sleeping worker, since the pushing
    /// worker takes the next job itself.
    #[test]
    fn jobs_pushed_by_a_worker_run_without_waking_others() {
        fn link(shared: Arc<Shared>, left: u32, done: std::sync::mpsc::Sender<()>) {
            if left == 0 {
                done.send(()).unwrap();
                return;
            }
            // Longer than the idle window: the other workers are asleep
            // by the time this job pushes the next.
            std::thread::sleep(Duration::from_micros(200));
            let next = shared.clone();
            shared.push(Box::new(move || link(next, left - 1, done)));
        }
        let pool = WorkerPool::new(4).unwrap();
        std::thread::sleep(Duration::from_millis(20));
        let sleeps_before = pool.stats().sleeps;
        let (tx, rx) = std::sync::mpsc::channel();
        let shared = pool.shared.clone();
        pool.spawn(Box::new(move || link(shared, 300, tx)));
        rx.recv_timeout(Duration::from_secs(20)).unwrap();
        let sleeps = pool.stats().sleeps - sleeps_before;
        // Were each push to wake a sleeping worker, that worker would poll
        // in vain and sleep again: about one sleep per job.
        assert!(sleeps < 30, "{sleeps} sleeps for 300 chained jobs");
    }

    /// Stages of `tiles[s]` tiles that record which stage each tile saw
    /// finished before it.
    struct Staged {
        tiles: Vec<u64>,
        hits: Vec<Vec<AtomicUsize>>,
        begun: Vec<AtomicUsize>,
    }

    impl RegionWork for Staged {
        fn stage_count(&self) -> usize {
            self.tiles.len()
        }
        fn begin_stage(&self, stage: usize) -> Result<u64> {
            // Every tile of the previous stages ran exactly once.
            for s in 0..stage {
                assert!(self.hits[s].iter().all(|h| h.load(Ordering::SeqCst) == 1));
            }
            self.begun[stage].fetch_add(1, Ordering::SeqCst);
            Ok(self.tiles[stage])
        }
        fn run_tile(&self, stage: usize, tile: u64, _: u32) -> Result<u64> {
            assert_eq!(self.begun[stage].load(Ordering::SeqCst), 1);
            self.hits[stage][tile as usize].fetch_add(1, Ordering::SeqCst);
            Ok(1)
        }
    }

    #[test]
    fn every_tile_of_every_stage_runs_once_in_order() {
        let pool = WorkerPool::new(4).unwrap();
        let tiles = vec![1, 64, 0, 3, 1000, 1, 1, 17];
        let work = Staged {
            hits: tiles
                .iter()
                .map(|&n| (0..n).map(|_| AtomicUsize::new(0)).collect())
                .collect(),
            begun: tiles.iter().map(|_| AtomicUsize::new(0)).collect(),
            tiles,
        };
        for _ in 0..20 {
            for h in work.hits.iter().flatten() {
                h.store(0, Ordering::SeqCst);
            }
            for b in &work.begun {
                b.store(0, Ordering::SeqCst);
            }
            pool.run_region(&work).unwrap();
            assert!(work
                .hits
                .iter()
                .flatten()
                .all(|h| h.load(Ordering::SeqCst) == 1));
        }
        let stats = pool.stats();
        assert_eq!(
            stats.workgroups_on_workers + stats.workgroups_on_callers,
            20 * work.tiles.iter().sum::<u64>()
        );
    }

    /// Stages whose tiles take a while, recording when stages are
    /// prepared ahead and begun.
    struct Ahead {
        stages: usize,
        begun: Vec<AtomicUsize>,
        ahead: Vec<AtomicUsize>,
        /// A preparation ahead under way (stage + 1; 0 when none).
        preparing: AtomicUsize,
    }

    impl RegionWork for Ahead {
        fn stage_count(&self) -> usize {
            self.stages
        }
        fn prepare_ahead(&self, stage: usize) {
            assert!(stage > 0);
            assert_eq!(self.begun[stage - 1].load(Ordering::SeqCst), 1);
            assert_eq!(self.begun[stage].load(Ordering::SeqCst), 0);
            assert_eq!(self.ahead[stage].fetch_add(1, Ordering::SeqCst), 0);
            self.preparing.store(stage + 1, Ordering::SeqCst);
            std::thread::sleep(Duration::from_micros(300));
            self.preparing.store(0, Ordering::SeqCst);
        }
        fn begin_stage(&self, stage: usize) -> Result<u64> {
            // Never while this stage is being prepared ahead.
            assert_ne!(self.preparing.load(Ordering::SeqCst), stage + 1);
            self.begun[stage].fetch_add(1, Ordering::SeqCst);
            Ok(8)
        }
        fn run_tile(&self, _: usize, tile: u64, _: u32) -> Result<u64> {
            // Uneven tiles: the threads done first prepare the next stage.
            std::thread::sleep(Duration::from_micros(100 + 400 * (tile % 3)));
            Ok(1)
        }
    }

    #[test]
    fn the_next_stage_is_prepared_ahead_once_before_it_begins() {
        let pool = WorkerPool::new(4).unwrap();
        let mut prepared = 0;
        for _ in 0..10 {
            let work = Ahead {
                stages: 6,
                begun: (0..6).map(|_| AtomicUsize::new(0)).collect(),
                ahead: (0..6).map(|_| AtomicUsize::new(0)).collect(),
                preparing: AtomicUsize::new(0),
            };
            pool.run_region(&work).unwrap();
            assert!(work.begun.iter().all(|b| b.load(Ordering::SeqCst) == 1));
            prepared += work
                .ahead
                .iter()
                .map(|a| a.load(Ordering::SeqCst))
                .sum::<usize>();
        }
        // 50 stage changes with idle threads waiting at each: some must
        // have been prepared ahead.
        assert!(prepared > 0, "no stage was prepared ahead");
    }

    /// One stage of `tiles` tiles, each taking `sleep`, recording which
    /// tile ran on which processor id, in the order they finished.
    struct OneStage {
        tiles: u64,
        sleep: Duration,
        ran: Mutex<Vec<(u64, u32)>>,
    }

    impl OneStage {
        fn new(tiles: u64, sleep: Duration) -> OneStage {
            OneStage {
                tiles,
                sleep,
                ran: Mutex::new(Vec::new()),
            }
        }
    }

    impl RegionWork for OneStage {
        fn stage_count(&self) -> usize {
            1
        }
        fn begin_stage(&self, _: usize) -> Result<u64> {
            Ok(self.tiles)
        }
        fn run_tile(&self, _: usize, tile: u64, processor_id: u32) -> Result<u64> {
            std::thread::sleep(self.sleep);
            self.ran.lock().push((tile, processor_id));
            Ok(1)
        }
    }

    /// A thread claims its own range of a stage first (locality), then
    /// takes the others' (balance): a caller leading alone on a one-worker
    /// pool (no room for helpers) is processor 1 of two ranges, so it runs
    /// the second half of the tiles, then the first.
    #[test]
    fn a_thread_starts_with_its_own_range_then_takes_the_rest() {
        let pool = WorkerPool::new(1).unwrap();
        assert_eq!(pool.processor_id(), 1);
        let work = OneStage::new(10, Duration::ZERO);
        pool.run_region(&work).unwrap();
        let order: Vec<u64> = work.ran.into_inner().into_iter().map(|(t, _)| t).collect();
        assert_eq!(order, [5, 6, 7, 8, 9, 0, 1, 2, 3, 4]);
    }

    /// A stage of as many long tiles as the region has threads runs one
    /// tile on each: the last unclaimed tile is joined for, not left to
    /// whichever thread finishes its own first (one tile late).
    #[test]
    fn as_many_long_tiles_as_threads_run_on_every_thread() {
        let pool = WorkerPool::new(4).unwrap();
        for _ in 0..3 {
            // The caller leads and 3 workers may join: 4 threads.
            let work = OneStage::new(4, Duration::from_millis(150));
            let start = Instant::now();
            pool.run_region(&work).unwrap();
            let elapsed = start.elapsed();
            let mut ran: Vec<u32> = work.ran.into_inner().into_iter().map(|(_, p)| p).collect();
            ran.sort_unstable();
            ran.dedup();
            assert_eq!(
                ran.len(),
                4,
                "4 tiles ran on threads {ran:?} in {elapsed:?}"
            );
        }
    }

    struct Failing;

    impl RegionWork for Failing {
        fn stage_count(&self) -> usize {
            3
        }
        fn begin_stage(&self, stage: usize) -> Result<u64> {
            assert!(stage < 2, "a stage after the failing one was begun");
            Ok(8)
        }
        fn run_tile(&self, stage: usize, tile: u64, _: u32) -> Result<u64> {
            if stage == 1 && tile == 5 {
                return Err(Status::new(StatusCode::Internal, "tile 5 failed"));
            }
            Ok(1)
        }
    }

    #[test]
    fn a_failing_tile_stops_the_region() {
        let pool = WorkerPool::new(3).unwrap();
        let e = pool.run_region(&Failing).unwrap_err();
        assert_eq!(e.code(), StatusCode::Internal);
        assert!(e.to_string().contains("tile 5 failed"), "{e}");
    }

    /// Every tile of stage 0 panics, whichever thread runs it (the leader
    /// or joined workers); the work is dropped right after `run_region`
    /// returns. Before panics were caught, a panic on the leader unwound
    /// out of `run_region` with the region still published (workers went
    /// on calling `run_tile` on the dropped work: use after free) and a
    /// panic on a worker killed the worker, its tile never counted done
    /// (the leader waited forever).
    struct Panicking {
        calls: AtomicUsize,
        /// Freed by drop: a call after the drop would read freed memory.
        payload: Vec<u64>,
    }

    impl RegionWork for Panicking {
        fn stage_count(&self) -> usize {
            2
        }
        fn begin_stage(&self, stage: usize) -> Result<u64> {
            assert_eq!(stage, 0, "the stage after the failing one was begun");
            Ok(256)
        }
        fn run_tile(&self, _: usize, tile: u64, _: u32) -> Result<u64> {
            self.calls.fetch_add(1, Ordering::SeqCst);
            assert_eq!(self.payload.len(), 64);
            std::thread::sleep(Duration::from_micros(50));
            panic!("tile {tile} panicked on purpose");
        }
    }

    #[test]
    fn a_panicking_tile_fails_the_region_and_the_workers_live_on() {
        let pool = Arc::new(WorkerPool::new(4).unwrap());
        let (tx, rx) = std::sync::mpsc::channel();
        let p = pool.clone();
        // On a thread of its own: before the fix this hung (a worker died
        // with its tile unfinished) or unwound.
        std::thread::spawn(move || {
            for _ in 0..20 {
                let work = Box::new(Panicking {
                    calls: AtomicUsize::new(0),
                    payload: vec![7; 64],
                });
                let outcome =
                    std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| p.run_region(&*work)));
                let calls = work.calls.load(Ordering::SeqCst);
                drop(work);
                tx.send((outcome.map_err(|_| ()), calls)).unwrap();
            }
        });
        for _ in 0..20 {
            let (outcome, calls) = rx
                .recv_timeout(Duration::from_secs(30))
                .expect("run_region hung after a panicking tile");
            let e = outcome
                .expect("the panic unwound out of run_region")
                .unwrap_err();
            assert_eq!(e.code(), StatusCode::Internal);
            assert!(e.to_string().contains("panicked on purpose"), "{e}");
            // Tiles after the failure are skipped, not run.
            assert!((1..256).contains(&calls), "{calls} tiles ran");
        }
        // Every worker lives on: a stage of as many long tiles as threads
        // runs one tile on each of them.
        let work = OneStage::new(4, Duration::from_millis(100));
        pool.run_region(&work).unwrap();
        let mut ran: Vec<u32> = work.ran.into_inner().into_iter().map(|(_, p)| p).collect();
        ran.sort_unstable();
        ran.dedup();
        assert_eq!(ran.len(), 4, "tiles ran on {ran:?}");
    }

    /// A queued job that panics neither kills its worker nor the pool.
    #[test]
    fn a_panicking_job_leaves_its_worker_alive() {
        let pool = WorkerPool::with_options(&PoolOptions {
            lend_to_waiters: false,
            ..PoolOptions::new(1)
        })
        .unwrap();
        pool.spawn(Box::new(|| panic!("job panicked on purpose")));
        let (tx, rx) = std::sync::mpsc::channel();
        pool.spawn(Box::new(move || tx.send(()).unwrap()));
        rx.recv_timeout(Duration::from_secs(10))
            .expect("the only worker died with the panicking job");
    }

    /// A spinner that notices it was descheduled (a gap between polls)
    /// ends its spin and makes the pool's later spins short.
    #[test]
    fn a_descheduled_spin_ends_and_shortens_later_spins() {
        if std::env::var_os(SPIN_VAR).is_some() {
            return; // A fixed bound was asked for.
        }
        let pool = WorkerPool::new(1).unwrap();
        let shared = &pool.shared;
        let bound = Duration::from_millis(50);
        assert_eq!(shared.spin_bound(bound), bound);
        let mut spin = Spin::start(shared, bound);
        assert!(spin.poll(shared));
        // As if the thread lost its CPU for a while.
        std::thread::sleep(region::PREEMPTED_GAP * 2);
        assert!(!spin.poll(shared), "a descheduled spin went on");
        assert_eq!(pool.stats().preempted_spins, 1);
        assert_eq!(shared.spin_bound(bound), region::CONTENDED_SPIN);
        let start = Instant::now();
        let mut spin = Spin::start(shared, bound);
        while spin.poll(shared) {}
        assert!(start.elapsed() < bound, "{:?}", start.elapsed());
    }

    #[test]
    fn thread_creation_failure_is_an_error() {
        // No system gives a thread an exabyte of stack.
        let options = PoolOptions {
            stack_size: Some(1 << 60),
            ..PoolOptions::new(2)
        };
        let e = WorkerPool::with_options(&options).err().expect("must fail");
        assert_eq!(e.code(), StatusCode::ResourceExhausted);
        assert!(e.to_string().contains("worker thread 0 of 2"), "{e}");
    }

    #[test]
    fn worker_counts_are_capped() {
        let pool = WorkerPool::new(100_000).unwrap();
        assert_eq!(pool.worker_count(), MAX_WORKERS);
        assert_eq!(WorkerPool::new(0).unwrap().worker_count(), 1);
    }

    #[test]
    fn an_idle_pool_sleeps() {
        let pool = WorkerPool::new(4).unwrap();
        let (tx, rx) = std::sync::mpsc::channel();
        for _ in 0..8 {
            let tx = tx.clone();
            pool.spawn(Box::new(move || tx.send(()).unwrap()));
        }
        for _ in 0..8 {
            rx.recv().unwrap();
        }
        std::thread::sleep(Duration::from_millis(20));
        let before = pool.stats().worker_cpu_time;
        std::thread::sleep(Duration::from_millis(300));
        let used = pool.stats().worker_cpu_time - before;
        // Sleeping workers use no CPU; allow for scheduler noise.
        assert!(
            used < Duration::from_millis(5),
            "idle workers used {used:?}"
        );
    }

    #[test]
    fn workers_get_the_requested_stack_size() {
        for wanted in [256 * 1024, 4 * 1024 * 1024] {
            let options = PoolOptions {
                stack_size: Some(wanted),
                ..PoolOptions::new(1)
            };
            let pool = WorkerPool::with_options(&options).unwrap();
            assert!(!pool.lends_to_waiters());
            let (tx, rx) = std::sync::mpsc::channel();
            pool.spawn(Box::new(move || tx.send(current_stack_size()).unwrap()));
            let got = rx.recv().unwrap();
            // The system may round up to whole pages (and add a guard page).
            assert!(
                got >= wanted && got < wanted + 64 * 1024,
                "{got} for {wanted}"
            );
        }
    }
}
