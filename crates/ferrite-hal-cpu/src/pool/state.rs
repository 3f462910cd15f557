//! The state a pool's workers, regions and waiters share ([`PoolState`]),
//! and the per-thread marks it reads. Its queue, idle, lending and
//! reporting methods live in those modules; the state is defined here,
//! below them, so they name it without naming the pool module that names
//! them.

use super::region::{self, Region};
use super::stats::{Counters, CpuClock};
use super::timing;
use parking_lot::{Mutex, RwLock};
use std::cell::Cell;
use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// A queued submission.
pub type Job = Box<dyn FnOnce() + Send>;

thread_local! {
    /// (pool id, worker index) when this thread is a pool worker.
    pub(super) static WORKER: Cell<Option<(usize, u32)>> = const { Cell::new(None) };
    /// This thread's involuntary context switches when it last looked (see
    /// [`PoolState::note_if_switched_out`]).
    static SWITCHES: Cell<Option<u64>> = const { Cell::new(None) };
}

/// The longest average solo run ([`PoolState::solo_now`]) under which the
/// loaded-solo rule keeps applying; longer ones rest it for
/// [`SOLO_REST`] (see [`PoolState::note_solo_run`]).
pub const SOLO_MAX: Duration = Duration::from_millis(1);

/// A solo run this long rests the loaded-solo rule at once: longer than a
/// few of the scheduler's slices, so the work itself was long.
pub const SOLO_TRIP: Duration = Duration::from_millis(16);

/// How long the loaded-solo rule rests after solo runs longer than
/// [`SOLO_MAX`] on average.
pub const SOLO_REST: Duration = Duration::from_secs(1);

/// A region at least this long checks whether its leader was switched
/// out ([`PoolState::note_if_switched_out`]): longer than the scheduler's
/// smallest slice, so a region on a busy CPU usually is; shorter ones
/// (most calls of small programs) skip the system call.
pub(crate) const PREEMPTION_CHECK_AFTER: Duration = Duration::from_micros(500);

/// The calling thread's involuntary context switches so far (Linux).
#[cfg(target_os = "linux")]
fn involuntary_switches() -> Option<u64> {
    // SAFETY: `usage` is writable memory of the type getrusage fills,
    // alive for the call; RUSAGE_THREAD concerns the calling thread.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: as above.
    let rc = unsafe { libc::getrusage(libc::RUSAGE_THREAD, &mut usage) };
    (rc == 0).then_some(usage.ru_nivcsw as u64)
}

#[cfg(not(target_os = "linux"))]
fn involuntary_switches() -> Option<u64> {
    None
}

/// State the workers, regions and waiters share.
pub(crate) struct PoolState {
    pub(super) id: usize,
    pub(super) workers: usize,
    pub(super) idle_spin: Duration,
    pub(super) jobs: Mutex<VecDeque<Job>>,
    /// Jobs queued and not yet taken (read without the lock).
    pub(super) queued: AtomicUsize,
    /// Threads polling the queue right now: lending waiters and idle
    /// workers in their polling window (not those running work).
    pub(super) pollers: AtomicUsize,
    /// Published regions. Joins read it under the shared lock (many
    /// workers woken for one stage join at once, none waiting for
    /// another: see `idle`); publishing and unpublishing take it
    /// exclusively, so no worker enters a region once it is unpublished.
    pub(super) regions: RwLock<Vec<Arc<Region>>>,
    /// Published regions (read without the lock).
    pub(super) region_count: AtomicUsize,
    /// The futex word idle workers sleep on; bumped whenever work appears.
    pub(super) epoch: AtomicU32,
    /// Workers asleep (or about to sleep) on `epoch`.
    pub(super) sleepers: AtomicU32,
    pub(super) shutdown: AtomicBool,
    pub(super) stats: Counters,
    /// Each worker's CPU-time clock (Linux), read by [`WorkerPool::stats`](super::WorkerPool::stats).
    pub(super) cpu_clocks: Mutex<Vec<CpuClock>>,
    /// Stage timing sums, when `FERRITE_LOCAL_TASK_STATS=stages`.
    pub(super) timing: Option<timing::PoolTiming>,
    /// The pool's clock origin (for `contended_until`).
    pub(super) clock: Instant,
    /// Nanoseconds after `clock` until which the pool counts as contended
    /// (see `region::Spin`).
    pub(super) contended_until: AtomicU64,
    /// `FERRITE_LOCAL_TASK_SPIN_US`: a fixed bound for every spin of this
    /// pool (stage waits and idle polls), contention ignored.
    pub(super) fixed_spin: Option<Duration>,
    /// The spin bound while contended: [`region::CONTENDED_SPIN`], or
    /// `FERRITE_LOCAL_TASK_CONTENDED_SPIN_US`.
    pub(super) contended_spin: Duration,
    /// `FERRITE_LOCAL_TASK_CONTENDED_HELPERS`: how many workers may join a
    /// region started while the pool is contended (unset: all of them).
    pub(super) contended_helpers: Option<usize>,
    /// Pause instructions between two polls of a spin
    /// ([`region::DEFAULT_PAUSES_PER_POLL`], or `FERRITE_LOCAL_TASK_PAUSES`).
    pub(super) pauses_per_poll: u32,
    /// `FERRITE_LOCAL_TASK_BANKS=1`: claim words in two banks, the next
    /// stage's written by the thread preparing it ahead (see `region`).
    pub(super) banks: AtomicBool,
    /// `FERRITE_LOCAL_TASK_LEADER_ASIDE=1`: a region led by a thread that
    /// is not a worker leaves its tiles to the workers (see `region::run`).
    pub(super) leader_aside: AtomicBool,
    /// `FERRITE_LOCAL_TASK_SLICE_US`: the scheduler time slice each worker
    /// asks for (see [`set_own_slice`](super::set_own_slice); None: the system's default).
    pub(super) slice: Option<Duration>,
    /// Whether threads look for involuntary switches
    /// ([`PoolState::note_if_switched_out`]; `FERRITE_LOCAL_TASK_SWITCH_CHECK=0`
    /// turns it off).
    pub(super) switch_check: bool,
    /// `FERRITE_LOCAL_TASK_JOIN_EXCLUSIVE=1`: joins take the region list's
    /// lock exclusively, one worker at a time (the behaviour before; a
    /// measuring aid).
    pub(super) join_exclusive: AtomicBool,
    /// `FERRITE_LOCAL_TASK_STAGE_SLEEP_US`: participants with nothing left
    /// to claim sleep in the region until the next stage (at most this
    /// many nanoseconds; 0: they spin, see `region::Spin`).
    pub(super) stage_sleep_ns: AtomicU64,
    /// `FERRITE_LOCAL_TASK_WAKE_ALL=1`: a stage wakes as many sleeping
    /// workers as it has tiles (up to the region's room), whoever is
    /// inside already (a measuring aid).
    pub(super) wake_all: AtomicBool,
    /// `FERRITE_LOCAL_TASK_SHARED_CLAIM=1`: regions claim every tile from
    /// one shared counter instead of per-thread ranges (a measuring aid).
    pub(super) shared_claim: AtomicBool,
    /// `FERRITE_LOCAL_TASK_LONG_STAGE_US`: participants that worked at
    /// least this many nanoseconds in a stage sleep until the next one
    /// instead of spinning ([`region::LONG_STAGE`] unless set; 0: off).
    pub(super) long_stage_ns: AtomicU64,
    /// `FERRITE_LOCAL_TASK_LONG_STAGE_CONTENDED=1`: that rule holds only
    /// while the pool is contended.
    pub(super) long_stage_contended: AtomicBool,
    /// `FERRITE_LOCAL_TASK_SHORT_TILE_US`: while the pool is contended, a
    /// region starting when the recent tiles took less than this many
    /// nanoseconds on average (`recent_tile_ns`) admits at most
    /// [`region::SHORT_TILE_HELPERS`] workers ([`region::SHORT_TILE`]
    /// unless set; 0: off).
    pub(super) short_tile_ns: AtomicU64,
    /// Workers such a region admits (`FERRITE_LOCAL_TASK_SHORT_TILE_HELPERS`,
    /// [`region::SHORT_TILE_HELPERS`] unless set).
    pub(super) short_tile_helpers: usize,
    /// The contended-caller rule (see [`PoolState::region_helpers`]); off
    /// with `FERRITE_LOCAL_TASK_CONTENDED_CALLER=0`.
    pub(super) contended_caller: AtomicBool,
    /// The machine's runnable threads: the contended-caller rule applies
    /// only while other programs keep half the CPUs busy.
    pub(super) machine: super::machine_load::MachineLoad,
    /// The loaded-solo rule ([`PoolState::solo_now`]); off with
    /// `FERRITE_LOCAL_TASK_SOLO=0` or [`super::PoolOptions::solo_when_loaded`].
    pub(super) solo_when_loaded: bool,
    /// Until when (the pool clock's nanoseconds) the loaded-solo rule
    /// rests after solo runs took longer than [`SOLO_MAX`].
    pub(super) solo_rests_until: AtomicU64,
    /// A moving average of solo runs' wall time (nanoseconds).
    pub(super) solo_avg_ns: AtomicU64,
    /// A moving average of the time one tile took (nanoseconds; 0: none
    /// measured yet), from the tiles the leaders of recent regions ran
    /// (see [`PoolState::note_tile_time`]).
    pub(super) recent_tile_ns: AtomicU64,
}

impl PoolState {
    /// The bound of a spin that would last `bound` on an idle machine: at
    /// most `contended_spin` ([`region::CONTENDED_SPIN`] unless set) while the pool is contended (see
    /// `region::Spin`), or the fixed bound of `FERRITE_LOCAL_TASK_SPIN_US`.
    pub(crate) fn spin_bound(&self, bound: Duration) -> Duration {
        if let Some(fixed) = self.fixed_spin {
            return fixed;
        }
        if self.is_contended() {
            bound.min(self.contended_spin)
        } else {
            bound
        }
    }

    /// How many workers may join a region that starts now: all but one
    /// (the leader runs tiles too) or, when the leader steps `aside`, all
    /// of them; fewer while the pool is contended and
    /// `FERRITE_LOCAL_TASK_CONTENDED_HELPERS` caps it.
    ///
    /// The short-tile rule: while contended and while other programs'
    /// runnable threads fill at least half the CPUs ([`super::machine_load`]),
    /// a region whose tiles are likely short (the recent ones averaged
    /// under `short_tile_ns`) admits at most `short_tile_helpers` workers
    /// ([`region::SHORT_TILE_HELPERS`] unless set). Not on an otherwise
    /// idle machine: there the pool counts as contended whenever its own
    /// threads outnumber the CPUs (the caller beside pinned workers), and
    /// an LLM's decode step (thousands of short tiles a step) ran 3.5x
    /// slower with one helper (issue 27, ninth session: 45-52 against
    /// upstream's 168-197 tok/s on 16 idle cores). Why: under a
    /// full load a woken worker waits for a busy CPU's slice before it
    /// runs, so for stages of microsecond tiles (the small MLP's) waking
    /// helpers costs more than they take off the stage (issue 25: 16
    /// helpers ran the MLP at 1.3x upstream under load), while long tiles
    /// (MiniLM's, hundreds of microseconds) still need every helper.
    ///
    /// The contended-caller rule: while contended, a region of longer
    /// tiles led by a caller (a thread that is not a worker) admits every
    /// worker, so the caller computes beside all of them (one thread more
    /// than the pool has workers). Why: on a machine whose CPUs all run
    /// other work, the scheduler shares each CPU among its runnable
    /// threads, so the program's share of the machine grows with its
    /// computing threads; the cap of one thread per worker protects the
    /// stages from one thread preempting another only while CPUs are free
    /// (issue 25: on 2 busy cores MiniLM ran 1.03x upstream with the cap).
    /// It applies only while other programs' runnable threads fill at least
    /// half the machine's CPUs ([`super::machine_load`]): the pool's own
    /// extra thread also counts as contention, and on idle CPUs the rule
    /// only oversubscribes them.
    /// `FERRITE_LOCAL_TASK_CONTENDED_CALLER=0` turns it off.
    pub(crate) fn region_helpers(&self, aside: bool) -> usize {
        let all = if aside {
            self.workers
        } else {
            self.workers.saturating_sub(1)
        };
        let short = self.tiles_are_short();
        // The contended-caller rule applies to a region that a caller (not
        // a worker) leads and runs tiles in.
        let widen = !short
            && !aside
            && self.contended_caller.load(Ordering::Relaxed)
            && self.workers >= 2
            && self.current_worker().is_none();
        // The clock is read only when a rule could apply.
        if (self.contended_helpers.is_none() && !short && !widen) || !self.is_contended() {
            return all;
        }
        // Both rules answer other programs' load, not the pool's own
        // threads outnumbering the CPUs (which also counts as contended).
        let others = (widen || short) && self.others_busy();
        let widen = widen && others;
        let short = short && others;
        let widened = if widen { self.workers } else { all };
        let mut cap = self.contended_helpers.map_or(widened, |c| widened.min(c));
        if widen && cap > all {
            self.stats.contended_widened.fetch_add(1, Ordering::Relaxed);
        }
        if short && cap > self.short_tile_helpers {
            cap = self.short_tile_helpers;
            self.stats.short_tile_caps.fetch_add(1, Ordering::Relaxed);
        }
        cap
    }

    /// Whether the short-tile rule finds the recent tiles short: it is on
    /// and a measured average lies below its threshold.
    fn tiles_are_short(&self) -> bool {
        let threshold = self.short_tile_ns.load(Ordering::Relaxed);
        let recent = self.recent_tile_ns.load(Ordering::Relaxed);
        threshold > 0 && recent > 0 && recent < threshold
    }

    /// Folds a region's tiles into the pool's moving average of tile
    /// time: the leader ran `tiles` of them in `busy` (one sample per
    /// region, weight 1/4). The sample is capped at 4x the threshold, so
    /// one tile that lost its CPU on a busy machine (milliseconds) moves
    /// the average by a bounded step, not for the next dozen regions.
    pub(crate) fn note_tile_time(&self, busy: Duration, tiles: u64) {
        let threshold = self.short_tile_ns.load(Ordering::Relaxed);
        if tiles == 0 || threshold == 0 {
            return;
        }
        let sample = (busy.as_nanos() as u64 / tiles).clamp(1, threshold.saturating_mul(4));
        // Racy between leaders of concurrent regions (a lost update loses
        // one sample), which an average tolerates.
        let old = self.recent_tile_ns.load(Ordering::Relaxed);
        let new = if old == 0 {
            sample
        } else {
            old - old / 4 + sample / 4
        };
        self.recent_tile_ns.store(new.max(1), Ordering::Relaxed);
    }

    /// Whether a region that the calling thread starts now leaves its
    /// tiles to the workers (see `region::run`): only with
    /// `FERRITE_LOCAL_TASK_LEADER_ASIDE=1`, and never for a worker (it is
    /// pinned like the others) or a pool of one worker.
    pub(crate) fn leader_steps_aside(&self) -> bool {
        self.workers >= 2
            && self.current_worker().is_none()
            && self.leader_aside.load(Ordering::Relaxed)
    }

    /// Whether a spinner noticed preemption within [`region::CONTENDED_FOR`].
    /// Whether other programs keep half the machine's CPUs busy (see
    /// [`super::machine_load`]): the runnable threads beyond this pool's
    /// awake workers and the calling thread.
    fn others_busy(&self) -> bool {
        let awake = (self.workers as u32).saturating_sub(self.sleepers.load(Ordering::Relaxed));
        let now = self.clock.elapsed().as_nanos() as u64;
        self.machine.others_busy(now, awake + 1)
    }

    /// The loaded-solo rule: whether a submission whose wait is reached
    /// should run on the submitting thread, one command after another as
    /// on `local-sync`, waking no worker. It holds while threads of other
    /// programs keep every CPU of the machine busy ([`super::machine_load`])
    /// and the recent tiles were short (the short-tile rule's average, so
    /// a program whose regions were timed), unless solo runs lately took
    /// longer than [`SOLO_MAX`].
    ///
    /// Why: when every CPU already runs another program's thread, each
    /// worker a region wakes waits for a slice on its CPU before it runs,
    /// and a stage waits for its slowest worker; a small program's stages
    /// (microsecond tiles) are done sooner by the one thread that is
    /// already running. Issue 25, 16 cores under 16 busy processes: the
    /// small MLP took 118 us a call in regions (upstream 120 us) and 40 us
    /// on one thread; MiniLM's long tiles keep the pool.
    pub(crate) fn solo_now(&self) -> bool {
        if !self.solo_when_loaded || !self.tiles_are_short() {
            return false;
        }
        let now = self.clock.elapsed().as_nanos() as u64;
        if now < self.solo_rests_until.load(Ordering::Relaxed) {
            return false;
        }
        let awake = (self.workers as u32).saturating_sub(self.sleepers.load(Ordering::Relaxed));
        self.machine.others_fill(now, awake + 1)
    }

    /// A solo run took `took` (wall time): counts it, and rests the rule
    /// for [`SOLO_REST`] when the moving average of solo runs (weight 1/8,
    /// each sample at most 4x [`SOLO_MAX`]) exceeds [`SOLO_MAX`]: work that
    /// large may gain from the workers even on a busy machine, and the
    /// regions run meanwhile time its tiles again. An average, because on
    /// a busy CPU a short run now and then loses its CPU for a slice
    /// (milliseconds); the cap bounds what one such run moves it. A run
    /// longer than [`SOLO_TRIP`] (several slices) rests it at once.
    pub(crate) fn note_solo_run(&self, took: Duration) {
        self.stats.solo_submissions.fetch_add(1, Ordering::Relaxed);
        let max = SOLO_MAX.as_nanos() as u64;
        let sample = (took.as_nanos() as u64).min(4 * max);
        // Racy between threads running solo at once (a lost update loses a
        // sample), which an average tolerates.
        let old = self.solo_avg_ns.load(Ordering::Relaxed);
        let avg = old - old / 8 + sample / 8;
        if avg > max || took > SOLO_TRIP {
            self.solo_avg_ns.store(0, Ordering::Relaxed);
            let until = (self.clock.elapsed() + SOLO_REST).as_nanos() as u64;
            self.solo_rests_until.fetch_max(until, Ordering::Relaxed);
        } else {
            self.solo_avg_ns.store(avg, Ordering::Relaxed);
        }
    }

    pub(crate) fn is_contended(&self) -> bool {
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

    /// Marks the pool contended, as [`PoolState::note_preempted`] does,
    /// when the scheduler switched the calling thread out involuntarily
    /// since the thread last looked (`getrusage(RUSAGE_THREAD)`'s
    /// `ru_nivcsw`; the first look only records the count).
    ///
    /// Why: a spinner notices preemption only while it spins, and under a
    /// CPU load the threads are mostly descheduled mid-tile: on 2 cores
    /// with one busy process each, MiniLM's 3-second timing saw 3 to 8
    /// preempted spins, so the pool counted as contended for at most
    /// 0.8 s of it and spun with the idle bounds (1 ms between stages)
    /// the rest: 10 ms more CPU per call (66-68 against 58 ms) and
    /// 149-180 ms a call against 123-149 ms without spins. A thread
    /// looks when it is about to block anyway (one system call beside
    /// the futex wait), and a leader at the end of a region that took
    /// long enough to be sliced ([`PREEMPTION_CHECK_AFTER`]).
    pub(crate) fn note_if_switched_out(&self) {
        if !self.switch_check {
            return;
        }
        let Some(now) = involuntary_switches() else {
            return;
        };
        let before = SWITCHES.with(|c| c.replace(Some(now)));
        if before.is_some_and(|b| now > b) {
            self.stats.preempted_threads.fetch_add(1, Ordering::Relaxed);
            let until = (self.clock.elapsed() + region::CONTENDED_FOR).as_nanos() as u64;
            self.contended_until.fetch_max(until, Ordering::Relaxed);
        }
    }

    /// The counter of workgroups run by the calling thread's kind.
    pub(crate) fn counter_for_this_thread(&self) -> &AtomicU64 {
        if self.current_worker().is_some() {
            &self.stats.on_workers
        } else {
            &self.stats.on_callers
        }
    }

    /// This thread's worker index, when it is one of this pool's workers.
    pub(crate) fn current_worker(&self) -> Option<u32> {
        WORKER
            .with(Cell::get)
            .and_then(|(pool, i)| (pool == self.id).then_some(i))
    }
}
