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
//! One 64-bit word, `claim`, holds the current stage (high bits) and the
//! next unclaimed tile of it (low bits). A participant claims with one
//! `fetch_add` and runs the tile the returned word names, if it exists. The
//! stage only changes once every tile of the current one has finished, so a
//! claim that lands after the change is a valid claim of the new stage: no
//! tile is lost or run twice, and a late claim is never confused with an
//! earlier stage's.
//!
//! ## Stage changes
//! The participant finishing a stage's last tile prepares the next stage
//! ([`RegionWork::begin_stage`]: resolving bindings, reading indirect
//! workgroup counts, sizing tiles), publishes it, and wakes as many
//! sleeping workers as the new stage can use beyond those already in the
//! region. Participants out of tiles poll the word for at most
//! [`STAGE_SPIN`]; then a worker leaves the region (to sleep in the pool)
//! and the leader sleeps on the region's own futex word until the next
//! stage or the end.

use super::park;
use super::Shared;
use ferrite_base::{Result, Status};
use parking_lot::Mutex;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// How long a participant with no tile to claim polls for the next stage
/// before it leaves (a worker) or sleeps (the leader). Within a command
/// buffer the next stage usually comes within the last tile's run time
/// (tens to hundreds of microseconds); a worker that slept must be woken,
/// which costs far more on a virtual machine (the vCPU was halted), so
/// participants stay for up to this long. Spinning happens only while a
/// command buffer runs, on at most as many threads as the pool has workers.
pub const STAGE_SPIN: Duration = Duration::from_millis(1);

/// Polls between two yields of the CPU while spinning: the spinner gives
/// its core away now and then, in case a thread it waits for (or any
/// other) is ready to run on it.
const POLLS_PER_YIELD: u32 = 64;

/// One poll of a spin loop: a short pause, and every [`POLLS_PER_YIELD`]th
/// time a yield.
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
    /// Runs tile `tile` of `stage` as logical processor `processor_id`;
    /// returns how many workgroups it ran (for the pool's statistics).
    fn run_tile(&self, stage: usize, tile: u64, processor_id: u32) -> Result<u64>;
}

/// The shared state of one running region.
pub(crate) struct Region {
    claim: AtomicU64,
    /// Tiles of the current stage finished.
    done: AtomicU64,
    /// Tile count of each stage, stored before the stage is published.
    tiles: Box<[AtomicU64]>,
    /// Workers joined (the leader not counted).
    participants: AtomicUsize,
    /// Workers that may join at once.
    max_helpers: usize,
    /// Bumped at every stage change; the leader sleeps on it.
    leader_epoch: AtomicU32,
    leader_sleeping: AtomicBool,
    failed: AtomicBool,
    failure: Mutex<Option<Status>>,
    pool: Arc<Shared>,
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

    fn is_finished(&self) -> bool {
        unpack(self.claim.load(Ordering::Acquire)).0 >= self.stage_count()
    }

    /// Whether a worker should join: unfinished, room left, and at least
    /// two unclaimed tiles (one the participants inside can take anyway).
    pub(crate) fn joinable(&self) -> bool {
        let (stage, next) = unpack(self.claim.load(Ordering::Acquire));
        stage < self.stage_count()
            && self.participants.load(Ordering::Relaxed) < self.max_helpers
            && self.tiles[stage].load(Ordering::Relaxed) > next + 1
    }

    /// A worker joins (the caller checked [`Region::joinable`] under the
    /// pool's region lock).
    pub(crate) fn enter(&self) {
        self.participants.fetch_add(1, Ordering::Relaxed);
    }

    fn record(&self, e: Status) {
        self.failure.lock().get_or_insert(e);
        self.failed.store(true, Ordering::Release);
    }

    /// Claims and runs one tile; false when the claim found none. The
    /// tile's workgroups are counted in `ran` before the tile counts as
    /// done, so statistics read after the region are complete.
    fn run_one(&self, processor_id: u32, ran: &AtomicU64) -> bool {
        let (stage, tile) = unpack(self.claim.fetch_add(1, Ordering::AcqRel));
        if stage >= self.stage_count() {
            return false;
        }
        let total = self.tiles[stage].load(Ordering::Relaxed);
        if tile >= total {
            return false;
        }
        if !self.failed.load(Ordering::Acquire) {
            // SAFETY: this thread holds the claim of an unfinished tile.
            match unsafe { self.work() }.run_tile(stage, tile, processor_id) {
                Ok(n) => {
                    ran.fetch_add(n, Ordering::Relaxed);
                }
                Err(e) => self.record(e),
            }
        }
        if self.done.fetch_add(1, Ordering::AcqRel) + 1 == total {
            self.advance(Some(stage));
        }
        true
    }

    /// Publishes the first non-empty stage after `from` (or the end). Only
    /// the thread that finished `from`'s last tile (or the leader, before
    /// publishing the region) calls this.
    fn advance(&self, from: Option<usize>) {
        let mut next = from.map_or(0, |s| s + 1);
        loop {
            if next >= self.stage_count() || self.failed.load(Ordering::Acquire) {
                self.claim
                    .store(pack(self.stage_count(), 0), Ordering::SeqCst);
                self.wake_leader();
                return;
            }
            // SAFETY: the region has not finished: it finishes in this
            // function, after this call.
            match unsafe { self.work() }.begin_stage(next) {
                Ok(0) => next += 1,
                Ok(n) => {
                    self.tiles[next].store(n, Ordering::Relaxed);
                    self.done.store(0, Ordering::Relaxed);
                    self.claim.store(pack(next, 0), Ordering::SeqCst);
                    self.wake_leader();
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
        let (stage, next) = unpack(self.claim.load(Ordering::Acquire));
        if stage >= self.stage_count() {
            return;
        }
        let left = self.tiles[stage]
            .load(Ordering::Relaxed)
            .saturating_sub(next);
        let inside = self.participants.load(Ordering::Relaxed);
        let usable = left.min(self.max_helpers as u64 + 1) as usize;
        let want = usable.saturating_sub(1 + inside);
        if want > 0 {
            self.pool.notify(want as u32);
        }
    }

    fn wake_leader(&self) {
        self.leader_epoch.fetch_add(1, Ordering::SeqCst);
        if self.leader_sleeping.load(Ordering::SeqCst) {
            park::wake(&self.leader_epoch, 1);
        }
    }

    /// A joined worker runs tiles (counting their workgroups in `ran`)
    /// until the region finishes or it found nothing to claim for
    /// [`STAGE_SPIN`]. The caller leaves afterwards ([`Region::leave`]).
    pub(crate) fn work_in(&self, processor_id: u32, ran: &AtomicU64) {
        let mut idle_since: Option<Instant> = None;
        let mut polls = 0;
        loop {
            let (stage, next) = unpack(self.claim.load(Ordering::Acquire));
            if stage >= self.stage_count() {
                return;
            }
            if next < self.tiles[stage].load(Ordering::Relaxed) {
                self.run_one(processor_id, ran);
                idle_since = None;
                continue;
            }
            match idle_since {
                None => idle_since = Some(Instant::now()),
                Some(t) if t.elapsed() >= STAGE_SPIN => return,
                Some(_) => {}
            }
            pause(&mut polls);
        }
    }

    /// A joined worker leaves.
    pub(crate) fn leave(&self) {
        self.participants.fetch_sub(1, Ordering::Relaxed);
    }

    /// The leader runs tiles (counting workgroups in `ran`) until the
    /// region finishes.
    fn lead(&self, processor_id: u32, ran: &AtomicU64) {
        let mut idle_since: Option<Instant> = None;
        let mut polls = 0;
        loop {
            let word = self.claim.load(Ordering::Acquire);
            let (stage, next) = unpack(word);
            if stage >= self.stage_count() {
                return;
            }
            if next < self.tiles[stage].load(Ordering::Relaxed) {
                self.run_one(processor_id, ran);
                idle_since = None;
                continue;
            }
            let since = *idle_since.get_or_insert_with(Instant::now);
            if since.elapsed() < STAGE_SPIN {
                pause(&mut polls);
                continue;
            }
            // Sleep until the stage changes: announce, re-check, sleep on
            // the epoch read before the re-check (see `wake_leader`).
            let epoch = self.leader_epoch.load(Ordering::SeqCst);
            self.leader_sleeping.store(true, Ordering::SeqCst);
            if unpack(self.claim.load(Ordering::SeqCst)).0 == stage {
                self.pool
                    .stats
                    .leader_sleeps
                    .fetch_add(1, Ordering::Relaxed);
                park::wait(&self.leader_epoch, epoch);
            }
            self.leader_sleeping.store(false, Ordering::SeqCst);
            idle_since = None;
        }
    }
}

/// Runs `work` on `pool`'s threads with the calling thread as leader (as
/// logical processor `processor_id`), returning once every stage is done:
/// the first failure (later stages are skipped), else Ok.
pub(crate) fn run(pool: &Arc<Shared>, work: &dyn RegionWork, processor_id: u32) -> Result<()> {
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
    // region dereferences it only while unfinished (`Region::work`), and
    // this function returns only after the region finished, so `work`
    // outlives every use.
    let work: *const (dyn RegionWork + 'static) = unsafe {
        std::mem::transmute::<*const (dyn RegionWork + '_), *const (dyn RegionWork + 'static)>(
            work as *const dyn RegionWork,
        )
    };
    let region = Arc::new(Region {
        claim: AtomicU64::new(0),
        done: AtomicU64::new(0),
        tiles: (0..stages).map(|_| AtomicU64::new(0)).collect(),
        participants: AtomicUsize::new(0),
        max_helpers: pool.workers.saturating_sub(1),
        leader_epoch: AtomicU32::new(0),
        leader_sleeping: AtomicBool::new(false),
        failed: AtomicBool::new(false),
        failure: Mutex::new(None),
        pool: pool.clone(),
        work,
    });
    // Prepare the first stage before anyone can see the region (it wakes
    // nobody: the region is not published yet).
    region.advance(None);
    let published = region.max_helpers > 0 && !region.is_finished();
    if published {
        pool.publish(&region);
        region.call_helpers();
    }
    region.lead(processor_id, pool.counter_for_this_thread());
    if published {
        pool.unpublish(&region);
    }
    pool.stats.regions.fetch_add(1, Ordering::Relaxed);
    let failure = region.failure.lock().take();
    match failure {
        Some(e) => Err(e),
        None => Ok(()),
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
}
