//! Regions: a sequence of stages (a command buffer split at its barriers)
//! that the pool's threads run together, stage after stage.
//!
//! One thread leads a region (the thread executing the command buffer); it
//! publishes the region to the pool and participates until the last stage
//! is done. Idle workers join while it has unclaimed tiles and room, and
//! stay through stage changes: a barrier costs an atomic counter reaching
//! its target and the next stage's tiles being published, not a wake-up.
//!
//! ## Claiming
//! Each stage's tiles are split into contiguous ranges, one per thread that
//! may run tiles (the pool's workers and a leading caller), each range a
//! 64-bit word on its own cache line holding the stage (high bits) and the
//! range's next unclaimed tile (low bits). A participant claims from the
//! range of its processor id first, with one `fetch_add`, and then from
//! the others in turn. So a thread runs the same part of consecutive
//! dispatches (the data it wrote is still in its cache), claims rarely
//! contend, and no thread idles while any range has tiles left.
//!
//! A range's word changes stage only once every tile of the current stage
//! has finished, so the word a `fetch_add` returns names the stage of the
//! tile it claims: a claim that lands after a stage change is a valid
//! claim of the new stage; no tile is lost or run twice, and a late claim
//! is never confused with an earlier stage's. A separate word, `stage`,
//! names the stage being claimed; participants with nothing left to claim
//! poll only it.
//!
//! ## Stage changes
//! The participant finishing a stage's last tile prepares the next stage
//! ([`RegionWork::begin_stage`]: resolving bindings, reading indirect
//! workgroup counts, sizing tiles), publishes it, and wakes as many
//! sleeping workers as the new stage can use beyond those already in the
//! region. A participant that finds nothing left to claim while the
//! stage's last tiles still run prepares the next stage ahead
//! ([`RegionWork::prepare_ahead`]; one thread per stage, and the stage
//! change waits for it), which takes that work off the barrier.
//! Participants out of tiles poll the stage word for at most
//! [`STAGE_SPIN`] (a [`Spin`]: shorter while the machine is contended, and
//! never yielding); then a worker leaves the region (to sleep in the pool)
//! and the leader sleeps on the region's own futex word until the next
//! stage or the end. A participant that worked a long stage
//! ([`LONG_STAGE`]) before it ran out of tiles sleeps at once instead
//! (workers on the region's stage word): the rest of such a stage takes
//! longer than a spin is worth, and on a busy CPU the spin costs the
//! thread its fair share.
//!
//! ## Helpers of a region of short tiles
//! While the pool is contended, a region starting when the recent tiles
//! (timed by the leaders of earlier regions) averaged under
//! [`SHORT_TILE`] admits at most [`SHORT_TILE_HELPERS`] workers: a woken
//! worker on a busy CPU waits for a slice before it runs, which costs
//! more than it takes off a stage of microsecond tiles (see
//! `PoolState::region_helpers`). A region of longer tiles that a caller
//! leads admits every worker while the pool is contended (the caller
//! computes beside all of them: the program's share of busy CPUs grows
//! with its runnable threads).

use super::park;
use super::state::{PoolState, PREEMPTION_CHECK_AFTER};
use super::timing::RegionTiming;
use ferrite_base::{Result, Status};
use parking_lot::Mutex;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// How long a participant with no tile to claim polls for the next stage
/// before it leaves (a worker) or sleeps (the leader), while the pool is
/// not contended. Within a command buffer the next stage usually comes
/// within the last tile's run time (tens to hundreds of microseconds); a
/// worker that slept must be woken, which costs far more on a virtual
/// machine (the vCPU was halted), so participants stay for up to this
/// long. Spinning happens only while a command buffer runs, on at most as
/// many threads as the pool has workers.
pub const STAGE_SPIN: Duration = Duration::from_millis(1);

/// The spin bound while the pool is contended (see [`Spin`]).
pub const CONTENDED_SPIN: Duration = Duration::from_micros(20);

/// A participant that worked at least this long in a stage before it
/// found nothing left to claim does not spin for the next one: it sleeps
/// until the stage changes (see [`Region::waits_asleep`]). Why: it waits
/// for the stage's last tiles, which take about as long as its own did;
/// a thread that spins through that on a busy CPU uses up its fair share
/// of it on nothing (issue 25: MiniLM's stages take 0.3-1.5 ms, and
/// without spins it ran about 1.0x upstream under a full load, against
/// 1.04-1.11x with them), while a small program's stages (microseconds,
/// the MLP's) need the spin to bridge its barriers (without spins it was
/// 40-50% slower). `FERRITE_LOCAL_TASK_LONG_STAGE_US` sets it (0: off).
pub const LONG_STAGE: Duration = Duration::from_micros(100);

/// The short-tile rule's threshold (see `PoolState::region_helpers`):
/// while the pool is contended, a region starting when the recent tiles
/// averaged less than this admits at most [`SHORT_TILE_HELPERS`] workers.
/// The small MLP's tiles take a few microseconds, MiniLM's hundreds.
/// `FERRITE_LOCAL_TASK_SHORT_TILE_US` sets it (0: off).
pub const SHORT_TILE: Duration = Duration::from_micros(30);

/// Workers a region of short tiles admits beside its leader while the
/// pool is contended. On 16 cores under 16 busy loops the small MLP's
/// medians with none were 118 and 119.5 us against 130.5 and 121.3 us with
/// one (upstream 127 and 116.5; 10 and 12 alternated rounds,
/// docs/figures.md, eighth session): within the rounds' noise, while with
/// none the pool's tests that need a worker to take part (a stage
/// prepared ahead, a workgroup on a worker) could wait in vain on a busy
/// machine. `FERRITE_LOCAL_TASK_SHORT_TILE_HELPERS` sets it.
pub const SHORT_TILE_HELPERS: usize = 1;

/// Bounds of a worker's sleep for the next stage after a long stage: four
/// times what it worked in the stage, within these (then it leaves the
/// region, as a worker whose spin ended).
const LONG_STAGE_SLEEP_MIN: Duration = Duration::from_millis(1);
const LONG_STAGE_SLEEP_MAX: Duration = Duration::from_millis(20);

/// A gap this long between two polls of a spin means the spinning thread
/// was descheduled: some other runnable thread wanted its CPU.
pub const PREEMPTED_GAP: Duration = Duration::from_micros(200);

/// How long a pool counts as contended after a spinner noticed it was
/// descheduled.
pub const CONTENDED_FOR: Duration = Duration::from_millis(100);

/// Polls between two yields of the CPU while the leader waits for
/// workers to leave a region it is abandoning ([`Unpublish`]).
const POLLS_PER_YIELD: u32 = 64;

/// One poll of the abandoning leader's wait: a short pause, and every
/// [`POLLS_PER_YIELD`]th time a yield.
fn pause(polls: &mut u32) {
    *polls += 1;
    if polls.is_multiple_of(POLLS_PER_YIELD) {
        std::thread::yield_now();
    } else {
        for _ in 0..32 {
            std::hint::spin_loop();
        }
    }
}

/// A bounded spin of a pool thread with nothing to do (a region's
/// participant between stages, an idle worker): pauses without yielding,
/// and ends at its bound or as soon as it notices that its thread was
/// descheduled (a gap of [`PREEMPTED_GAP`] between two polls).
///
/// Why: on a machine whose CPUs are all busy, a spinning thread spends
/// its fair share of CPU on nothing, and a yield hands its CPU to another
/// process for a whole time slice; either way, when the work it waits for
/// comes, the thread is queued behind other processes. A thread that
/// sleeps instead keeps its share, and a wake-up gets it the CPU promptly.
/// So a descheduled spinner stops spinning (the caller sleeps or leaves)
/// and marks the pool contended for [`CONTENDED_FOR`]; while contended,
/// spins last at most [`CONTENDED_SPIN`]. On an idle machine spins keep
/// their full bound (a wake-up costs more than a spin there).
pub(crate) struct Spin {
    since: Instant,
    last: Instant,
    bound: Duration,
}

/// Pause instructions between two polls of a [`Spin`]. One pause takes
/// from a few to about 140 cycles depending on the CPU (Intel made it
/// about 10x longer from Skylake on); a poll every few pauses notices a
/// stage change within about 100 ns there, where 32 pauses a poll took
/// up to 1.5 us, paid at every barrier by the thread that noticed last.
/// `FERRITE_LOCAL_TASK_PAUSES=N` sets it (a measuring aid).
pub(crate) const DEFAULT_PAUSES_PER_POLL: u32 = 2;

impl Spin {
    /// A spin of at most `bound` (shortened while `pool` is contended).
    pub(crate) fn start(pool: &PoolState, bound: Duration) -> Spin {
        let now = Instant::now();
        Spin {
            since: now,
            last: now,
            bound: pool.spin_bound(bound),
        }
    }

    /// When the spin started.
    pub(crate) fn since(&self) -> Instant {
        self.since
    }

    /// Polls once more (true, after a pause) or ends the spin (false: the
    /// bound passed, or the thread was descheduled, which marks `pool`
    /// contended).
    pub(crate) fn poll(&mut self, pool: &PoolState) -> bool {
        let now = Instant::now();
        if now.duration_since(self.last) >= PREEMPTED_GAP {
            pool.note_preempted();
            return false;
        }
        if now.duration_since(self.since) >= self.bound {
            return false;
        }
        self.last = now;
        for _ in 0..pool.pauses_per_poll {
            std::hint::spin_loop();
        }
        true
    }
}

/// Runs `f`, a call into the region's [`RegionWork`], turning a panic
/// into an `INTERNAL` status naming `what`: a panic never unwinds through
/// the region's machinery (which would leave the region published with
/// its work gone, or a worker dead with its tile never counted done).
fn guarded<T>(what: impl FnOnce() -> String, f: impl FnOnce() -> Result<T>) -> Result<T> {
    match std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)) {
        Ok(r) => r,
        Err(payload) => Err(Status::new(
            ferrite_base::StatusCode::Internal,
            format!("{} panicked: {}", what(), panic_message(&*payload)),
        )),
    }
}

/// The message of a panic payload (a `&str` or `String`, else a
/// placeholder).
pub(crate) fn panic_message(payload: &(dyn std::any::Any + Send)) -> String {
    if let Some(s) = payload.downcast_ref::<&str>() {
        (*s).to_string()
    } else if let Some(s) = payload.downcast_ref::<String>() {
        s.clone()
    } else {
        "(a non-string panic payload)".to_string()
    }
}

const TILE_BITS: u32 = 40;
const TILE_MASK: u64 = (1 << TILE_BITS) - 1;

fn pack(stage: usize, tile: u64) -> u64 {
    ((stage as u64) << TILE_BITS) | tile
}

fn unpack(word: u64) -> (usize, u64) {
    ((word >> TILE_BITS) as usize, word & TILE_MASK)
}

/// Work split in stages of independent tiles, run by a region.
pub trait RegionWork: Sync {
    /// Number of stages (each runs after every tile of the previous one).
    fn stage_count(&self) -> usize;
    /// Prepares `stage` and returns its tile count (0: nothing to run).
    /// Called once per stage, on one thread, after every tile of earlier
    /// stages finished and before any tile of this one starts.
    fn begin_stage(&self, stage: usize) -> Result<u64>;
    /// Prepares what [`RegionWork::begin_stage`] of `stage` will need, ahead
    /// of time: called at most once per stage, on a thread with nothing
    /// left to claim in the stage before, while that stage's last tiles
    /// still run, so it must not depend on their results. `begin_stage`
    /// still follows (after this returned) and decides what to use. The
    /// default does nothing.
    fn prepare_ahead(&self, stage: usize) {
        let _ = stage;
    }
    /// The tile count a preparation ahead of `stage` found, when
    /// [`RegionWork::prepare_ahead`] prepared it: then
    /// [`RegionWork::begin_stage`] of `stage` must return exactly this
    /// count (a pool writing claim words ahead relies on it). The default
    /// says nothing (None).
    fn prepared_tiles(&self, stage: usize) -> Option<u64> {
        let _ = stage;
        None
    }
    /// Runs tile `tile` of `stage` as logical processor `processor_id`;
    /// returns how many workgroups it ran (for the pool's statistics).
    fn run_tile(&self, stage: usize, tile: u64, processor_id: u32) -> Result<u64>;
}

/// A value on a cache line of its own: claim words that different threads
/// update must not share a line (each update would steal the line from
/// every thread reading its neighbour).
#[repr(align(128))]
struct Padded<T>(T);

/// Who runs tiles in a region: its processor id (passed to the work; its
/// claim range is the one it tries first, see [`Region::claim`]) and which
/// of `ran`'s counters its workgroups go to.
#[derive(Clone, Copy)]
struct Seat {
    processor_id: u32,
    kind: usize,
}

/// The slot of [`Region`]'s `ran` counting workgroups run on workers.
const WORKER_KIND: usize = 0;
/// The slot counting workgroups run on other threads (leading callers).
const OTHER_KIND: usize = 1;

/// Most claim ranges a region splits its stages into (processor ids share
/// ranges beyond it).
const MAX_RANGES: usize = 64;

/// Claim ranges per region: one per thread that may run tiles (up to
/// [`MAX_RANGES`]).
fn range_count(threads: usize) -> usize {
    threads.clamp(1, MAX_RANGES)
}

/// The shared state of one running region.
pub(crate) struct Region {
    /// The stage whose tiles are being claimed (`stage_count()` once the
    /// region finished); stored after the stage's claim ranges.
    stage: Padded<AtomicU64>,
    /// The current stage's tiles split into contiguous ranges, one per
    /// thread that may run tiles: each word packs a stage and the next
    /// unclaimed tile of that range (see the module docs).
    ranges: Box<[Padded<AtomicU64>]>,
    /// Claim ranges per bank (`ranges` holds one bank of them, or two with
    /// banks: see [`Region::word`]).
    n_ranges: usize,
    /// `FERRITE_LOCAL_TASK_BANKS=1`: stages alternate between two banks of
    /// claim words, and the thread preparing a stage ahead writes its
    /// words (see [`Region::prepare_ahead`]).
    banks: bool,
    /// The stage (plus one) whose claim words were written ahead (0:
    /// none).
    banked: AtomicU64,
    /// Tiles of the current stage finished.
    done: Padded<AtomicU64>,
    /// Workgroups run, per claim range of the running thread's processor
    /// id: `[on workers, on other threads]`. Each thread adds to the slot
    /// of its own range, a cache line that no other thread writes (while
    /// processor ids stay below [`MAX_RANGES`]); the leader adds them to
    /// the pool's counters when the region ends. One pool-wide counter
    /// updated by every tile was a cache line that all threads took from
    /// each other at the end of every stage.
    ran: Box<[Padded<[AtomicU64; 2]>]>,
    /// Preparation ahead: a stage (high bits) and its state
    /// ([`AHEAD_RUNNING`], [`AHEAD_DONE`] or [`AHEAD_CLOSED`]); see
    /// [`Region::prepare_ahead`]. On a cache line of its own: it changes
    /// two or three times a stage, and the words every claim reads (the
    /// tile counts, the work, the failure flag) must not move with it.
    ahead: Padded<AtomicU64>,
    /// Tile count of each stage, stored before the stage is published.
    tiles: Box<[AtomicU64]>,
    /// Workers joined (the leader not counted).
    participants: AtomicUsize,
    /// Workers that may join at once.
    max_helpers: usize,
    /// Bumped when the leader is woken; it sleeps on it.
    leader_epoch: AtomicU32,
    /// With stage sleeps (`stage_sleep`): bumped at every stage change
    /// and at the end, after the stage word; participants out of tiles
    /// sleep on it.
    stage_epoch: AtomicU32,
    /// Workers asleep (or about to sleep) on `stage_epoch`.
    stage_sleepers: AtomicU32,
    /// `FERRITE_LOCAL_TASK_STAGE_SLEEP_US`: participants out of tiles
    /// sleep on `stage_epoch` for at most this long instead of spinning
    /// (None: they spin, see [`Spin`]).
    stage_sleep: Option<Duration>,
    /// `FERRITE_LOCAL_TASK_WAKE_ALL=1`: see [`Region::call_helpers`].
    wake_all: bool,
    /// Participants that worked at least this long in a stage sleep until
    /// the next one instead of spinning ([`LONG_STAGE`]; None: off).
    long_stage: Option<Duration>,
    /// Whether that rule holds only while the pool is contended
    /// (`FERRITE_LOCAL_TASK_LONG_STAGE_CONTENDED=1`).
    long_stage_contended: bool,
    /// Whether the leader times the tiles it runs, for the short-tile
    /// rule's average (`PoolState::note_tile_time`).
    time_tiles: bool,
    /// What the leader sleeps until: [`LEADER_AWAKE`] (it does not sleep),
    /// [`LEADER_FOR_STAGE`] or [`LEADER_FOR_WORKERS`].
    leader_sleeping: AtomicU32,
    /// The leader (a caller, not a worker) leaves the tiles to the workers
    /// while any is inside: see [`run`].
    aside: bool,
    failed: AtomicBool,
    failure: Mutex<Option<Status>>,
    pool: Arc<PoolState>,
    /// Stage clocks, when the pool measures stages (see [`super::timing`]).
    timing: Option<RegionTiming>,
    /// The leader's work, its lifetime erased: see [`Region::work`].
    work: *const (dyn RegionWork + 'static),
}

// SAFETY: every field but `work` is Sync and Send. `work` points to a
// `RegionWork` (which is Sync) that the leader keeps alive until the region
// has finished; it is only dereferenced under that guarantee (see
// `Region::work`), so sharing the pointer between threads is sound.
unsafe impl Send for Region {}
// SAFETY: as for Send.
unsafe impl Sync for Region {}

/// Tiles `start..end` of `tiles` form range `r` of `ranges`: contiguous,
/// in order, sizes differing by at most one (some empty when there are
/// fewer tiles than ranges).
fn range_bounds(tiles: u64, ranges: usize, r: usize) -> (u64, u64) {
    let n = ranges as u128;
    let t = tiles as u128;
    let start = t * r as u128 / n;
    let end = t * (r as u128 + 1) / n;
    (start as u64, end as u64)
}

/// A thread is preparing the stage ahead.
const AHEAD_RUNNING: u64 = 1;
/// The stage was prepared ahead (or its preparation was given up).
const AHEAD_DONE: u64 = 2;
/// The stage began (or the region ended): too late to prepare it ahead.
const AHEAD_CLOSED: u64 = 3;

fn pack_ahead(stage: usize, state: u64) -> u64 {
    ((stage as u64) << 2) | state
}

fn unpack_ahead(word: u64) -> (usize, u64) {
    ((word >> 2) as usize, word & 3)
}

/// The leader is not asleep.
const LEADER_AWAKE: u32 = 0;
/// The leader sleeps until the stage changes (or the region ends).
const LEADER_FOR_STAGE: u32 = 1;
/// The leader, stepped aside, sleeps until the region ends or the last
/// worker inside leaves.
const LEADER_FOR_WORKERS: u32 = 2;

/// What a claim attempt found.
enum Claim {
    /// Tile `.1` of stage `.0` is this thread's to run.
    Tile(usize, u64),
    /// Every tile of the stage asked for is claimed (or it is over).
    None,
}

/// When a participant began working in a stage (its first claim there;
/// kept only while the long-stage rule is on, see [`Region::waits_asleep`]),
/// and, for the leader while the short-tile rule is on, the time its
/// tiles took and how many it ran (`timed`).
#[derive(Default)]
struct StageClock {
    stage: Option<usize>,
    since: Option<Instant>,
    timed: bool,
    busy: Duration,
    tiles: u64,
}

impl Region {
    fn stage_count(&self) -> usize {
        self.tiles.len()
    }

    /// The leader's work.
    ///
    /// # Safety
    /// The region must not have finished: the caller holds a claim of an
    /// unfinished tile (so the final stage cannot complete before it
    /// returns), or is the thread preparing the next stage (the region
    /// finishes only after it). The leader returns from
    /// [`run`] only once the region finished, so the work is alive.
    unsafe fn work(&self) -> &dyn RegionWork {
        // SAFETY: by this function's contract the pointee is alive.
        unsafe { &*self.work }
    }

    fn current_stage(&self) -> usize {
        self.stage.0.load(Ordering::Acquire) as usize
    }

    /// Range `r`'s claim word for `stage`: in one bank, or with banks in
    /// that of the stage's parity, so the words of the next stage can be
    /// written while the current one's are claimed from.
    fn word(&self, stage: usize, r: usize) -> &AtomicU64 {
        let bank = if self.banks { stage & 1 } else { 0 };
        &self.ranges[bank * self.n_ranges + r].0
    }

    fn is_finished(&self) -> bool {
        self.current_stage() >= self.stage_count()
    }

    /// Unclaimed tiles of `stage` (a snapshot; claims race with it).
    fn unclaimed(&self, stage: usize) -> u64 {
        let total = self.tiles[stage].load(Ordering::Relaxed);
        let n = self.n_ranges;
        (0..n)
            .map(|r| {
                let (s, next) = unpack(self.word(stage, r).load(Ordering::Acquire));
                if s != stage {
                    return 0;
                }
                range_bounds(total, n, r).1.saturating_sub(next)
            })
            .sum()
    }

    /// Whether a worker should join: unfinished, room left, and a tile
    /// unclaimed. Even a single tile is worth joining for: the threads
    /// inside may all be running tiles of their own, and a tile left to
    /// whichever finishes first starts one whole tile late (a stage of as
    /// many 1 ms tiles as threads took 1.5 tiles' time that way).
    pub(crate) fn joinable(&self) -> bool {
        let stage = self.current_stage();
        stage < self.stage_count()
            && self.participants.load(Ordering::Relaxed) < self.max_helpers
            && self.unclaimed(stage) > 0
    }

    /// A worker joins if the region has room (true): the caller holds the
    /// pool's region lock (shared), so the region is still published, and
    /// workers joining at once take the room one compare-and-swap each.
    pub(crate) fn try_enter(&self) -> bool {
        self.participants
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |p| {
                (p < self.max_helpers).then_some(p + 1)
            })
            .is_ok()
    }

    fn record(&self, e: Status) {
        self.failure.lock().get_or_insert(e);
        self.failed.store(true, Ordering::Release);
    }

    /// Claims a tile of `stage` (read from `self.stage`), trying first the
    /// range of `processor_id` (so a thread runs the same part of
    /// consecutive stages: locality) and then the others in turn (so no
    /// thread idles while tiles are left: balance).
    ///
    /// A range word changes stage only after every tile of its stage has
    /// finished, so the word a `fetch_add` returns names the stage its
    /// tile belongs to: a claim that lands after a stage change is a valid
    /// claim of the new stage, never a second run of an old tile.
    fn claim(&self, stage: usize, processor_id: u32) -> Claim {
        let n = self.n_ranges;
        let home = processor_id as usize % n;
        for k in 0..n {
            let r = (home + k) % n;
            let word = self.word(stage, r);
            let (s, next) = unpack(word.load(Ordering::Acquire));
            if s != stage {
                if s > stage {
                    // The region moved on: whatever the caller saw is over.
                    return Claim::None;
                }
                continue;
            }
            let total = self.tiles[s].load(Ordering::Relaxed);
            if next >= range_bounds(total, n, r).1 {
                continue;
            }
            let (s, tile) = unpack(word.fetch_add(1, Ordering::AcqRel));
            if s >= self.stage_count() {
                return Claim::None;
            }
            let total = self.tiles[s].load(Ordering::Relaxed);
            if tile < range_bounds(total, n, r).1 {
                return Claim::Tile(s, tile);
            }
        }
        Claim::None
    }

    /// Claims and runs one tile of `stage`; false when the claim found
    /// none. The tile's workgroups are counted in the thread's slot of
    /// `self.ran` (`kind`: 0 for a worker, 1 for another thread) before the
    /// tile counts as done, so the sums the leader takes at the end are
    /// complete.
    fn run_one(&self, stage: usize, seat: &Seat) -> bool {
        let Seat { processor_id, kind } = *seat;
        let Claim::Tile(stage, tile) = self.claim(stage, processor_id) else {
            return false;
        };
        if self.banks && self.current_stage() < stage {
            // Claimed from words written ahead, by a thread that looked
            // at a stage already over: the tile is this thread's, but its
            // stage has not begun. It begins once the running stage's
            // tiles (none of them this thread's) are done, or the region
            // ends on a failure, and then the tile is not run.
            let mut polls = 0;
            while self.current_stage() < stage {
                pause(&mut polls);
            }
            if self.is_finished() {
                return true;
            }
        }
        let total = self.tiles[stage].load(Ordering::Relaxed);
        if !self.failed.load(Ordering::Acquire) {
            let start = self.timing.as_ref().map(RegionTiming::now);
            // SAFETY: this thread holds the claim of an unfinished tile.
            let work = unsafe { self.work() };
            let result = guarded(
                || format!("tile {tile} of stage {stage}"),
                || work.run_tile(stage, tile, processor_id),
            );
            match result {
                Ok(n) => {
                    let slot = &self.ran[processor_id as usize % self.ran.len()].0[kind];
                    slot.fetch_add(n, Ordering::Relaxed);
                }
                Err(e) => self.record(e),
            }
            if let (Some(t), Some(start)) = (&self.timing, start) {
                t.tile(stage, start, t.now(), processor_id);
            }
        }
        if self.done.0.fetch_add(1, Ordering::AcqRel) + 1 == total {
            self.advance(Some(stage));
        }
        true
    }

    /// With nothing left to claim in `stage`, prepares the next stage while
    /// the last tiles of this one run (see [`RegionWork::prepare_ahead`]),
    /// unless another thread does or it began already. The stage change
    /// waits for a preparation under way ([`Region::close_ahead`]), so the
    /// work is alive throughout.
    fn prepare_ahead(&self, stage: usize) {
        let next = stage + 1;
        if next >= self.stage_count() {
            return;
        }
        let word = self.ahead.0.load(Ordering::Acquire);
        if unpack_ahead(word).0 >= next {
            return;
        }
        if self
            .ahead
            .0
            .compare_exchange(
                word,
                pack_ahead(next, AHEAD_RUNNING),
                Ordering::AcqRel,
                Ordering::Relaxed,
            )
            .is_err()
        {
            return;
        }
        // SAFETY: `next` has not begun (its closing would have moved
        // `ahead` past the word replaced above), and the region cannot
        // finish before `next` begins, which waits for AHEAD_DONE below.
        let work = unsafe { self.work() };
        if let Err(e) = guarded(
            || format!("preparing stage {next} ahead"),
            || {
                work.prepare_ahead(next);
                Ok(())
            },
        ) {
            self.record(e);
        }
        if self.banks {
            self.write_ahead(work, next);
        }
        self.ahead
            .0
            .store(pack_ahead(next, AHEAD_DONE), Ordering::Release);
    }

    /// With banks, writes the claim words of `next`, just prepared ahead,
    /// into its bank (the other one than the running stage's, whose
    /// words named a stage over, all of its tiles claimed): the stage
    /// change then only stores the stage word. A thread that read a
    /// stage already over may claim from these words before `next`
    /// begins; it waits for it (see [`Region::run_one`]).
    fn write_ahead(&self, work: &dyn RegionWork, next: usize) {
        let Some(n) = work.prepared_tiles(next) else {
            return;
        };
        if n == 0 || n > TILE_MASK / 2 {
            return;
        }
        self.tiles[next].store(n, Ordering::Relaxed);
        let count = self.n_ranges;
        for r in 0..count {
            let (start, end) = range_bounds(n, count, r);
            if start < end {
                self.word(next, r)
                    .store(pack(next, start), Ordering::Release);
            }
        }
        self.banked.store(next as u64 + 1, Ordering::Release);
    }

    /// Ends preparation ahead up to `stage` (about to begin, or the end):
    /// waits for one under way, then marks the stage closed.
    fn close_ahead(&self, stage: usize) {
        loop {
            let word = self.ahead.0.load(Ordering::Acquire);
            if unpack_ahead(word).1 == AHEAD_RUNNING {
                std::hint::spin_loop();
                continue;
            }
            if self
                .ahead
                .0
                .compare_exchange(
                    word,
                    pack_ahead(stage, AHEAD_CLOSED),
                    Ordering::AcqRel,
                    Ordering::Relaxed,
                )
                .is_ok()
            {
                return;
            }
        }
    }

    /// Publishes the first non-empty stage after `from` (or the end). Only
    /// the thread that finished `from`'s last tile (or the leader, before
    /// publishing the region) calls this.
    fn advance(&self, from: Option<usize>) {
        let mut next = from.map_or(0, |s| s + 1);
        loop {
            if next >= self.stage_count() || self.failed.load(Ordering::Acquire) {
                let end = self.stage_count();
                self.close_ahead(end);
                for word in self.ranges.iter() {
                    word.0.store(pack(end, 0), Ordering::Release);
                }
                self.stage.0.store(end as u64, Ordering::SeqCst);
                self.wake_stage_sleepers(u32::MAX);
                self.wake_leader(true);
                return;
            }
            self.close_ahead(next);
            // SAFETY: the region has not finished: it finishes in this
            // function, after this call.
            let work = unsafe { self.work() };
            match guarded(
                || format!("beginning stage {next}"),
                || work.begin_stage(next),
            ) {
                Ok(0) => next += 1,
                Ok(n) => {
                    let banked = self.banked.load(Ordering::Acquire) == next as u64 + 1;
                    if banked && self.tiles[next].load(Ordering::Relaxed) != n {
                        // Claims may already have been made against the
                        // count prepared ahead.
                        self.record(Status::new(
                            ferrite_base::StatusCode::Internal,
                            format!(
                                "stage {next} was prepared ahead with {} tiles and began with {n}",
                                self.tiles[next].load(Ordering::Relaxed)
                            ),
                        ));
                        continue;
                    }
                    self.tiles[next].store(n, Ordering::Relaxed);
                    self.done.0.store(0, Ordering::Relaxed);
                    if let Some(t) = &self.timing {
                        t.published(next);
                    }
                    // The ranges first (each store releases the tile
                    // count above to whoever claims from it), then the
                    // stage that pollers watch. After the first stage only
                    // ranges with tiles are written: an empty range keeps
                    // the word of an earlier stage, all of whose tiles
                    // were claimed, so claims skip it (its stage is not
                    // the one claimed) and never take from it. Each store
                    // takes a cache line from the thread that claimed
                    // from it last, and the stage change waits for them
                    // all (a stage of 2 tiles among 17 ranges wrote 17).
                    let count = self.n_ranges;
                    for r in 0..count {
                        let (start, end) = range_bounds(n, count, r);
                        if !banked && (start < end || from.is_none()) {
                            self.word(next, r)
                                .store(pack(next, start), Ordering::Release);
                        }
                    }
                    self.stage.0.store(next as u64, Ordering::SeqCst);
                    self.wake_stage_sleepers(n.min(u32::MAX as u64) as u32);
                    self.wake_leader(false);
                    if from.is_some() {
                        self.call_helpers();
                    }
                    return;
                }
                Err(e) => self.record(e),
            }
        }
    }

    /// Wakes as many sleeping workers as the current stage can use beyond
    /// the threads already in the region (the leader and joined workers
    /// take tiles anyway), up to the region's room.
    fn call_helpers(&self) {
        let stage = self.current_stage();
        if stage >= self.stage_count() {
            return;
        }
        // With every worker that may join inside there is nobody to wake
        // (the usual case within a command buffer): this thread goes on
        // to claim its own tile at once. With `wake_all` those inside are
        // not counted (one of them may have lost its CPU).
        let inside = if self.wake_all {
            0
        } else {
            self.participants.load(Ordering::Relaxed)
        };
        if inside >= self.max_helpers {
            return;
        }
        // The stage was just published: its tile count is what is left to
        // claim, near enough (reading every range instead would take each
        // range's cache line from the thread claiming from it).
        let left = self.tiles[stage].load(Ordering::Relaxed);
        let leader = self.leader_threads();
        let usable = left.min((self.max_helpers + leader) as u64) as usize;
        let want = usable.saturating_sub(leader + inside);
        if want > 0 {
            self.pool.notify(want as u32);
        }
    }

    /// Wakes up to `count` participants asleep for the next stage (stage
    /// sleeps, or a long stage's: see [`Region::waits_asleep`]), after a
    /// SeqCst store of `stage`. A sleeper reads the epoch, counts itself
    /// in `stage_sleepers`, then re-checks `stage` (all SeqCst), so either
    /// its re-check sees the store, or this load sees it counted and the
    /// bump that follows moves the epoch it read (its futex wait returns).
    /// With nobody asleep the stage change costs this one load.
    fn wake_stage_sleepers(&self, count: u32) {
        if count == 0 || self.stage_sleepers.load(Ordering::SeqCst) == 0 {
            return;
        }
        self.stage_epoch.fetch_add(1, Ordering::SeqCst);
        park::wake(&self.stage_epoch, count);
    }

    /// A participant out of tiles of `stage` sleeps until the stage
    /// changes or `bound` passes; false when it passed with the stage
    /// unchanged (the caller leaves).
    fn sleep_for_stage(&self, stage: usize, bound: Duration) -> bool {
        let epoch = self.stage_epoch.load(Ordering::SeqCst);
        self.stage_sleepers.fetch_add(1, Ordering::SeqCst);
        if self.stage.0.load(Ordering::SeqCst) as usize == stage {
            // About to block anyway: one system call more tells whether
            // the thread lost its CPU meanwhile (see
            // `PoolState::note_if_switched_out`), as a worker going to
            // sleep in the pool does.
            self.pool.note_if_switched_out();
            park::wait_for(&self.stage_epoch, epoch, bound);
        }
        self.stage_sleepers.fetch_sub(1, Ordering::SeqCst);
        self.stage.0.load(Ordering::SeqCst) as usize != stage
    }

    /// Threads beside the workers that run tiles: the leader (1), or none
    /// when it stepped aside.
    fn leader_threads(&self) -> usize {
        usize::from(!self.aside)
    }

    /// Wakes the leader if it sleeps for a stage change or, `at_end`, for
    /// anything (after a SeqCst store of `stage`: either the leader's
    /// re-check of `stage` sees the store, or this load sees its
    /// `leader_sleeping`; it read the epoch before, so the bump makes its
    /// futex wait return). A leader that is not asleep, or stepped aside
    /// (it waits for the end), costs the stage change one load, not a
    /// locked update or a wake-up.
    fn wake_leader(&self, at_end: bool) {
        let sleeping = self.leader_sleeping.load(Ordering::SeqCst);
        if sleeping == LEADER_FOR_STAGE || (at_end && sleeping != LEADER_AWAKE) {
            self.leader_epoch.fetch_add(1, Ordering::SeqCst);
            park::wake(&self.leader_epoch, 1);
        }
    }

    /// A joined worker runs tiles until the region finishes or its
    /// [`Spin`] for the next stage ended. The caller leaves afterwards
    /// ([`Region::leave`]).
    pub(crate) fn work_in(&self, processor_id: u32) {
        let seat = Seat {
            processor_id,
            kind: WORKER_KIND,
        };
        let mut spin: Option<Spin> = None;
        // The stage this thread found nothing left to claim in: it polls
        // the stage word until that changes.
        let mut exhausted: Option<usize> = None;
        let mut clock = StageClock::default();
        loop {
            let stage = self.current_stage();
            if stage >= self.stage_count() {
                return;
            }
            if self.claim_or_prepare(stage, &mut exhausted, &seat, &mut clock) {
                spin = None;
                continue;
            }
            if let Some(bound) = self.stage_sleep {
                if !self.sleep_for_stage(stage, bound) {
                    return;
                }
                continue;
            }
            if spin.is_none() {
                if let Some(worked) = self.waits_asleep(&clock, stage) {
                    let bound = (worked * 4).clamp(LONG_STAGE_SLEEP_MIN, LONG_STAGE_SLEEP_MAX);
                    if !self.sleep_for_stage(stage, bound) {
                        return;
                    }
                    continue;
                }
            }
            let s = spin.get_or_insert_with(|| Spin::start(&self.pool, STAGE_SPIN));
            if !s.poll(&self.pool) {
                return;
            }
        }
    }

    /// Runs one tile of `stage` (true), or, the first time the stage has
    /// nothing left to claim for this thread, records that in `exhausted`
    /// and prepares the next stage ahead (false: the caller idles until
    /// the stage changes).
    fn claim_or_prepare(
        &self,
        stage: usize,
        exhausted: &mut Option<usize>,
        seat: &Seat,
        clock: &mut StageClock,
    ) -> bool {
        if *exhausted == Some(stage) {
            return false;
        }
        if self.long_stage.is_some() && clock.stage != Some(stage) {
            clock.stage = Some(stage);
            clock.since = Some(Instant::now());
        }
        if clock.timed {
            let start = Instant::now();
            if self.run_one(stage, seat) {
                clock.busy += start.elapsed();
                clock.tiles += 1;
                return true;
            }
        } else if self.run_one(stage, seat) {
            return true;
        }
        *exhausted = Some(stage);
        self.prepare_ahead(stage);
        false
    }

    /// Whether a participant that found nothing left to claim in `stage`
    /// sleeps until the next stage instead of spinning: when it worked in
    /// the stage for at least [`LONG_STAGE`] (`clock`, from its first
    /// claim in the stage; the last tiles it waits for, begun about when
    /// its own last one was, take about as long) and, with
    /// `FERRITE_LOCAL_TASK_LONG_STAGE_CONTENDED=1`, the pool is
    /// contended. Some(how long it worked) when so, counted in
    /// [`super::PoolStats::long_stage_waits`].
    fn waits_asleep(&self, clock: &StageClock, stage: usize) -> Option<Duration> {
        let threshold = self.long_stage?;
        if clock.stage != Some(stage) {
            return None;
        }
        let worked = clock.since?.elapsed();
        if worked < threshold || (self.long_stage_contended && !self.pool.is_contended()) {
            return None;
        }
        self.pool
            .stats
            .long_stage_waits
            .fetch_add(1, Ordering::Relaxed);
        Some(worked)
    }

    /// A joined worker leaves. Release: the leader's unwinding guard
    /// ([`Unpublish`]) reads the count with Acquire, so a worker's last use
    /// of the work happens before the leader gives the work back.
    ///
    /// The last worker to leave wakes a leader stepped aside (SeqCst on
    /// both sides, as in [`Region::wake_leader`]: either the leader's
    /// re-check sees no worker inside, or this load sees it asleep), which
    /// then runs the tiles left itself.
    pub(crate) fn leave(&self) {
        let before = self.participants.fetch_sub(1, Ordering::SeqCst);
        if before == 1
            && self.aside
            && self.leader_sleeping.load(Ordering::SeqCst) == LEADER_FOR_WORKERS
        {
            self.leader_epoch.fetch_add(1, Ordering::SeqCst);
            park::wake(&self.leader_epoch, 1);
        }
    }

    /// The leader runs tiles until the region finishes. Stepped aside, it
    /// sleeps instead while any worker is inside (they run every tile and
    /// each stage change; the last one out wakes it, see
    /// [`Region::leave`]), and runs tiles itself only while none is.
    /// Returns the time the tiles it ran took and their count (both zero
    /// unless the region times them, `time_tiles`).
    fn lead(&self, seat: &Seat) -> (Duration, u64) {
        let mut spin: Option<Spin> = None;
        let mut exhausted: Option<usize> = None;
        let mut clock = StageClock {
            timed: self.time_tiles,
            ..StageClock::default()
        };
        loop {
            let stage = self.current_stage();
            if stage >= self.stage_count() {
                return (clock.busy, clock.tiles);
            }
            if self.aside && self.participants.load(Ordering::SeqCst) > 0 {
                self.leader_sleep(LEADER_FOR_WORKERS, || {
                    !self.is_finished() && self.participants.load(Ordering::SeqCst) > 0
                });
                spin = None;
                continue;
            }
            if self.claim_or_prepare(stage, &mut exhausted, seat, &mut clock) {
                spin = None;
                continue;
            }
            // After a long stage the leader sleeps at once (see
            // `waits_asleep`), as with stage sleeps.
            let asleep = self.stage_sleep.is_some()
                || (spin.is_none() && self.waits_asleep(&clock, stage).is_some());
            if !asleep {
                let s = spin.get_or_insert_with(|| Spin::start(&self.pool, STAGE_SPIN));
                if s.poll(&self.pool) {
                    continue;
                }
            }
            // Sleep until the stage changes.
            self.leader_sleep(LEADER_FOR_STAGE, || {
                self.stage.0.load(Ordering::SeqCst) as usize == stage
            });
            spin = None;
        }
    }

    /// The leader sleeps for `reason` ([`LEADER_FOR_STAGE`] or
    /// [`LEADER_FOR_WORKERS`]) while `still` holds: it reads the epoch,
    /// announces what it sleeps for, re-checks `still` and sleeps on the
    /// epoch read before the re-check, so a wake-up between the check and
    /// the futex wait is not lost (see [`Region::wake_leader`] and
    /// [`Region::leave`], which bump the epoch after seeing the
    /// announcement).
    fn leader_sleep(&self, reason: u32, still: impl FnOnce() -> bool) {
        let epoch = self.leader_epoch.load(Ordering::SeqCst);
        self.leader_sleeping.store(reason, Ordering::SeqCst);
        if still() {
            self.pool
                .stats
                .leader_sleeps
                .fetch_add(1, Ordering::Relaxed);
            park::wait(&self.leader_epoch, epoch);
        }
        self.leader_sleeping.store(LEADER_AWAKE, Ordering::SeqCst);
    }
}

/// Runs `work` on `pool`'s threads with the calling thread as leader (as
/// logical processor `processor_id`), returning once every stage is done:
/// the first failure (later stages are skipped), else Ok.
pub(crate) fn run(pool: &Arc<PoolState>, work: &dyn RegionWork, processor_id: u32) -> Result<()> {
    let stages = work.stage_count();
    if stages == 0 {
        return Ok(());
    }
    if stages >= 1 << (64 - TILE_BITS) {
        return Err(Status::new(
            ferrite_base::StatusCode::ResourceExhausted,
            format!(
                "{stages} stages (barrier-separated groups of commands) in one command buffer; at most {} are supported",
                (1u64 << (64 - TILE_BITS)) - 1
            ),
        ));
    }
    // SAFETY: only the lifetime is erased (same fat-pointer layout). The
    // region dereferences it only while unfinished (`Region::work`), by
    // the leader or by a worker counted in `participants`. This function
    // returns normally only after the region finished (`lead` returns only
    // then; panics of the work are caught by `guarded` and end the region
    // as a failure), and if it unwinds before that, the `Unpublish` guard
    // takes the region off the pool and waits until no worker is inside,
    // so `work` outlives every use either way.
    let work: *const (dyn RegionWork + 'static) = unsafe {
        std::mem::transmute::<*const (dyn RegionWork + '_), *const (dyn RegionWork + 'static)>(
            work as *const dyn RegionWork,
        )
    };
    // With FERRITE_LOCAL_TASK_LEADER_ASIDE=1 a caller leading a region
    // steps aside: the workers (pinned one per core by default, as
    // upstream's) run every tile and it sleeps until the end, as
    // upstream's caller waits. The question it answers: does the unpinned
    // caller, sharing a CPU with a busy process and a pinned worker of its
    // region, slow every stage on a loaded machine? On 16 loaded cores it
    // did not (docs/figures.md, issue 25), so it is off by default.
    let aside = pool.leader_steps_aside();
    let max_helpers = pool.region_helpers(aside);
    let banks = pool.banks.load(Ordering::Relaxed);
    let threads = pool.workers.max(1) + 1;
    // With a shared claim every thread takes from one counter.
    let n_ranges = if pool.shared_claim.load(Ordering::Relaxed) {
        1
    } else {
        range_count(threads)
    };
    let stage_sleep = match pool.stage_sleep_ns.load(Ordering::Relaxed) {
        0 => None,
        ns => Some(Duration::from_nanos(ns)),
    };
    let region = Arc::new(Region {
        stage: Padded(AtomicU64::new(0)),
        ranges: (0..n_ranges * if banks { 2 } else { 1 })
            .map(|_| Padded(AtomicU64::new(0)))
            .collect(),
        n_ranges,
        banks,
        banked: AtomicU64::new(0),
        done: Padded(AtomicU64::new(0)),
        ran: (0..range_count(threads))
            .map(|_| Padded([AtomicU64::new(0), AtomicU64::new(0)]))
            .collect(),
        ahead: Padded(AtomicU64::new(0)),
        tiles: (0..stages).map(|_| AtomicU64::new(0)).collect(),
        participants: AtomicUsize::new(0),
        max_helpers,
        leader_epoch: AtomicU32::new(0),
        stage_epoch: AtomicU32::new(0),
        stage_sleepers: AtomicU32::new(0),
        stage_sleep,
        wake_all: pool.wake_all.load(Ordering::Relaxed),
        long_stage: match pool.long_stage_ns.load(Ordering::Relaxed) {
            0 => None,
            ns => Some(Duration::from_nanos(ns)),
        },
        long_stage_contended: pool.long_stage_contended.load(Ordering::Relaxed),
        time_tiles: pool.short_tile_ns.load(Ordering::Relaxed) > 0,
        leader_sleeping: AtomicU32::new(LEADER_AWAKE),
        aside,
        failed: AtomicBool::new(false),
        failure: Mutex::new(None),
        pool: pool.clone(),
        timing: pool.timing.as_ref().map(|_| RegionTiming::new(stages)),
        work,
    });
    // Prepare the first stage before anyone can see the region (it wakes
    // nobody: the region is not published yet).
    region.advance(None);
    let published = region.max_helpers > 0 && !region.is_finished();
    let mut guard = Unpublish {
        pool,
        region: &region,
        published: false,
    };
    if published {
        pool.publish(&region);
        guard.published = true;
        region.call_helpers();
    }
    let kind = if pool.current_worker().is_some() {
        WORKER_KIND
    } else {
        OTHER_KIND
    };
    let seat = Seat { processor_id, kind };
    let started = Instant::now();
    let (busy, tiles) = region.lead(&seat);
    pool.note_tile_time(busy, tiles);
    if started.elapsed() >= PREEMPTION_CHECK_AFTER {
        pool.note_if_switched_out();
    }
    // Normal end: the region finished, so no thread uses `work` any more
    // (see `Region::work`); workers still inside only poll its words.
    std::mem::forget(guard);
    if published {
        pool.unpublish(&region);
    }
    pool.stats.regions.fetch_add(1, Ordering::Relaxed);
    // Every tile finished (and counted its workgroups before it counted as
    // done), so the slots are complete.
    for (kind, counter) in [
        (WORKER_KIND, &pool.stats.on_workers),
        (OTHER_KIND, &pool.stats.on_callers),
    ] {
        let sum: u64 = region
            .ran
            .iter()
            .map(|slot| slot.0[kind].load(Ordering::Relaxed))
            .sum();
        if sum > 0 {
            counter.fetch_add(sum, Ordering::Relaxed);
        }
    }
    if let (Some(sums), Some(t)) = (&pool.timing, &region.timing) {
        sums.lock()
            .fold(t, region.max_helpers + region.leader_threads());
    }
    let failure = region.failure.lock().take();
    match failure {
        Some(e) => Err(e),
        None => Ok(()),
    }
}

/// Ends a region whose leader unwinds out of [`run`] before the region
/// finished (a panic in the region's own code: panics of the work are
/// caught as failures, see [`guarded`]). `run` must not return while any
/// thread can still reach the caller's `work` through the region, so the
/// drop marks the region failed (no tile runs any more), takes it off the
/// pool's list (no worker joins any more) and waits until every joined
/// worker has left. Forgotten on the normal path.
struct Unpublish<'a> {
    pool: &'a Arc<PoolState>,
    region: &'a Arc<Region>,
    published: bool,
}

impl Drop for Unpublish<'_> {
    fn drop(&mut self) {
        let region = self.region;
        region.record(Status::new(
            ferrite_base::StatusCode::Internal,
            "the command buffer's leading thread unwound",
        ));
        if self.published {
            // Under the pool's region lock, as joins: after this no worker
            // enters.
            self.pool.unpublish(region);
        }
        // Workers inside finish the tile they run (no new tile runs: the
        // region failed) and leave once they see the end or give up
        // polling; `leave` is a Release decrement.
        let mut polls = 0;
        while region.participants.load(Ordering::Acquire) > 0 {
            pause(&mut polls);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn claims_pack_stage_and_tile() {
        let w = pack(3, 17);
        assert_eq!(unpack(w), (3, 17));
        assert_eq!(unpack(w + 1), (3, 18));
        assert_eq!(unpack(pack(1 << 20, TILE_MASK)), (1 << 20, TILE_MASK));
    }

    #[test]
    fn ranges_cover_the_tiles_in_order_evenly() {
        for tiles in [0u64, 1, 5, 12, 17, 48, 1000, TILE_MASK] {
            for ranges in [1usize, 2, 3, 16, 17, MAX_RANGES] {
                let mut next = 0;
                let (mut small, mut large) = (u64::MAX, 0);
                for r in 0..ranges {
                    let (start, end) = range_bounds(tiles, ranges, r);
                    assert_eq!(start, next, "{tiles} tiles, {ranges} ranges, range {r}");
                    assert!(end >= start);
                    small = small.min(end - start);
                    large = large.max(end - start);
                    next = end;
                }
                assert_eq!(next, tiles);
                assert!(large - small <= 1, "{tiles} tiles over {ranges} ranges");
            }
        }
    }
}
