//! Stage timing: where a region's time goes between and within its stages.
//!
//! Off unless `FERRITE_LOCAL_TASK_STATS=stages` (then the pool's statistics
//! line gains a second line, and a per-stage table follows it): a region
//! without timing pays one branch per tile. With it on, every tile takes
//! two clock readings and a few atomic updates, and each region folds its
//! stages into the pool's totals when it ends.
//!
//! Per stage it measures:
//! - *wall*: from the first tile's start to the last tile's end;
//! - *gap*: from the previous stage's last tile end to this stage's first
//!   tile start, the barrier's cost (preparing the stage, publishing it,
//!   the first participant noticing);
//! - *busy*: the sum of the tiles' run times;
//! - *threads*: how many distinct threads ran tiles of it.
//!
//! `busy / (wall × threads)` is how evenly the stage's work was spread:
//! below one, some threads waited for others within the stage.
//!
//! *Shortest schedule*: a lower bound on the stage's wall for any schedule of its
//! tiles as they ran: the larger of its busy time spread evenly over the
//! threads the region may hold and its longest tile (a tile runs on one
//! thread). Summed over stages, with no gaps, it bounds from below what
//! a runtime running the same tiles (the same workgroups, where each tile
//! is one) at the same speed can reach on that many threads.
//!
//! Per thread (processor id) it also sums how long its tiles took against
//! the mean tile of the same stage, so a thread that is persistently slow
//! (a virtual CPU sharing its core with another guest, say) shows up as a
//! ratio above one rather than as noise in the stage walls.

use parking_lot::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

/// One stage's raw measurements in a running region (ns since the region's
/// start).
struct StageClock {
    published: AtomicU64,
    first_start: AtomicU64,
    last_start: AtomicU64,
    last_end: AtomicU64,
    busy: AtomicU64,
    /// The longest tile's run time.
    longest: AtomicU64,
    /// Processor ids that ran a tile (ids of 63 and above share bit 63).
    threads: AtomicU64,
    tiles: AtomicU64,
    /// Per processor id (below [`THREAD_SLOTS`]): tile time and tiles.
    per_thread: Box<[(AtomicU64, AtomicU64)]>,
}

/// Processor ids whose tile times are kept apart (larger ids are left out
/// of the per-thread figures).
const THREAD_SLOTS: usize = 64;

/// A running region's stage clocks.
pub(crate) struct RegionTiming {
    start: Instant,
    stages: Box<[StageClock]>,
}

impl RegionTiming {
    pub(crate) fn new(stages: usize) -> RegionTiming {
        RegionTiming {
            start: Instant::now(),
            stages: (0..stages)
                .map(|_| StageClock {
                    published: AtomicU64::new(0),
                    first_start: AtomicU64::new(u64::MAX),
                    last_start: AtomicU64::new(0),
                    last_end: AtomicU64::new(0),
                    busy: AtomicU64::new(0),
                    longest: AtomicU64::new(0),
                    threads: AtomicU64::new(0),
                    tiles: AtomicU64::new(0),
                    per_thread: (0..THREAD_SLOTS)
                        .map(|_| (AtomicU64::new(0), AtomicU64::new(0)))
                        .collect(),
                })
                .collect(),
        }
    }

    /// Nanoseconds since the region started.
    pub(crate) fn now(&self) -> u64 {
        self.start.elapsed().as_nanos() as u64
    }

    /// Records that `stage` was published (its tiles made claimable).
    pub(crate) fn published(&self, stage: usize) {
        self.stages[stage]
            .published
            .store(self.now(), Ordering::Relaxed);
    }

    /// Records a tile of `stage` that ran from `start` to `end` on
    /// `processor_id`.
    pub(crate) fn tile(&self, stage: usize, start: u64, end: u64, processor_id: u32) {
        let s = &self.stages[stage];
        s.first_start.fetch_min(start, Ordering::Relaxed);
        s.last_start.fetch_max(start, Ordering::Relaxed);
        s.last_end.fetch_max(end, Ordering::Relaxed);
        s.busy.fetch_add(end - start, Ordering::Relaxed);
        s.longest.fetch_max(end - start, Ordering::Relaxed);
        s.threads
            .fetch_or(1 << processor_id.min(63), Ordering::Relaxed);
        s.tiles.fetch_add(1, Ordering::Relaxed);
        if let Some((busy, tiles)) = s.per_thread.get(processor_id as usize) {
            busy.fetch_add(end - start, Ordering::Relaxed);
            tiles.fetch_add(1, Ordering::Relaxed);
        }
    }
}

/// Sums over regions, per stage index and in all.
#[derive(Clone, Debug, Default)]
pub(crate) struct StageSums {
    /// Regions folded in.
    pub regions: u64,
    /// Per stage index: (regions that ran it, tiles, wall, gap, busy,
    /// thread count × wall, publication to first tile start, first to
    /// last tile start, shortest schedule, longest tile), times in ns.
    pub per_stage: Vec<[u64; 10]>,
    /// Per processor id: (sum over its tiles of tile time / its stage's
    /// mean tile time, tiles), over stages of more than one tile.
    pub per_thread: Vec<(f64, u64)>,
}

impl StageSums {
    /// Adds a finished region's stages; the region could hold at most
    /// `max_threads` threads (its leader included).
    pub(crate) fn fold(&mut self, timing: &RegionTiming, max_threads: usize) {
        self.regions += 1;
        if self.per_stage.len() < timing.stages.len() {
            self.per_stage.resize(timing.stages.len(), [0; 10]);
        }
        let mut prev_end: Option<u64> = None;
        for (i, s) in timing.stages.iter().enumerate() {
            let tiles = s.tiles.load(Ordering::Relaxed);
            if tiles == 0 {
                continue;
            }
            let first = s.first_start.load(Ordering::Relaxed);
            let last = s.last_end.load(Ordering::Relaxed);
            let wall = last.saturating_sub(first);
            let gap = prev_end.map_or(0, |p| first.saturating_sub(p));
            let threads = u64::from(s.threads.load(Ordering::Relaxed).count_ones());
            let row = &mut self.per_stage[i];
            row[0] += 1;
            row[1] += tiles;
            row[2] += wall;
            row[3] += gap;
            row[4] += s.busy.load(Ordering::Relaxed);
            row[5] += threads * wall;
            row[6] += first.saturating_sub(s.published.load(Ordering::Relaxed));
            row[7] += s.last_start.load(Ordering::Relaxed).saturating_sub(first);
            let busy = s.busy.load(Ordering::Relaxed);
            let longest = s.longest.load(Ordering::Relaxed);
            row[8] += busy.div_ceil(max_threads.max(1) as u64).max(longest);
            row[9] += longest;
            prev_end = Some(last);
            let mean = busy as f64 / tiles as f64;
            if tiles > 1 && mean > 0.0 {
                if self.per_thread.len() < THREAD_SLOTS {
                    self.per_thread.resize(THREAD_SLOTS, (0.0, 0));
                }
                for (slot, (busy, n)) in self.per_thread.iter_mut().zip(s.per_thread.iter()) {
                    let n_tiles = n.load(Ordering::Relaxed);
                    if n_tiles > 0 {
                        slot.0 += busy.load(Ordering::Relaxed) as f64 / mean;
                        slot.1 += n_tiles;
                    }
                }
            }
        }
    }

    /// Totals over every stage (the columns of a stage's row, summed).
    pub(crate) fn totals(&self) -> [u64; 10] {
        let mut t = [0u64; 10];
        for row in &self.per_stage {
            for (a, b) in t.iter_mut().zip(row) {
                *a += b;
            }
        }
        t
    }

    /// The summary line and the per-stage table.
    pub(crate) fn describe(&self) -> String {
        let [stages, tiles, wall, gap, busy, capacity, notice, spread, shortest_schedule, _] =
            self.totals();
        let ms = |ns: u64| ns as f64 / 1e6;
        let mut out = format!(
            "local-task stages: {} regions, {stages} stages, {tiles} tiles; stage wall {:.3} ms, gaps between stages {:.3} ms (of which publication to first start {:.3} ms), tile time {:.3} ms, first to last tile start {:.3} ms; balance {:.1}% (tile time / (wall x threads)); shortest schedule {:.3} ms (no schedule of these tiles is shorter: per stage the larger of its tile time over the threads and its longest tile, no gaps), {:.3} ms per region against {:.3} ms of stage walls and gaps",
            self.regions,
            ms(wall),
            ms(gap),
            ms(notice),
            ms(busy),
            ms(spread),
            100.0 * busy as f64 / capacity.max(1) as f64,
            ms(shortest_schedule),
            ms(shortest_schedule) / self.regions.max(1) as f64,
            ms(wall + gap) / self.regions.max(1) as f64,
        );
        let speeds: Vec<String> = self
            .per_thread
            .iter()
            .enumerate()
            .filter(|(_, (_, n))| *n > 0)
            .map(|(id, (sum, n))| format!("{id}:{:.2}", sum / *n as f64))
            .collect();
        if !speeds.is_empty() {
            out.push_str(&format!(
                "\n  tile time per thread against its stage's mean tile (processor id:ratio): {}",
                speeds.join(" ")
            ));
            // Which threads ran the tiles: an even spread gives each
            // thread 1/threads of them.
            let all: u64 = self.per_thread.iter().map(|(_, n)| n).sum();
            let shares: Vec<String> = self
                .per_thread
                .iter()
                .enumerate()
                .filter(|(_, (_, n))| *n > 0)
                .map(|(id, (_, n))| format!("{id}:{:.1}", 100.0 * *n as f64 / all.max(1) as f64))
                .collect();
            out.push_str(&format!(
                "\n  tiles per thread, % of all (processor id:share): {}",
                shares.join(" ")
            ));
        }
        out.push_str(
            "\n  stage  runs  tiles/run  wall_us  sched_us  gap_us  notice_us  spread_us  busy_us  longest_us  threads  balance",
        );
        for (
            i,
            [runs, tiles, wall, gap, busy, capacity, notice, spread, shortest_schedule, longest],
        ) in self.per_stage.iter().enumerate()
        {
            if *runs == 0 {
                continue;
            }
            let per = |v: u64| v as f64 / *runs as f64;
            out.push_str(&format!(
                "\n  {i:5}  {runs:4}  {:9.1}  {:7.1}  {:8.1}  {:6.1}  {:9.1}  {:9.1}  {:7.1}  {:10.1}  {:7.1}  {:6.1}%",
                per(*tiles),
                per(*wall) / 1e3,
                per(*shortest_schedule) / 1e3,
                per(*gap) / 1e3,
                per(*notice) / 1e3,
                per(*spread) / 1e3,
                per(*busy) / 1e3,
                per(*longest) / 1e3,
                *capacity as f64 / (*wall).max(1) as f64,
                100.0 * *busy as f64 / (*capacity).max(1) as f64,
            ));
        }
        out
    }
}

/// The pool's stage sums (present when stage timing is on).
pub(crate) type PoolTiming = Mutex<StageSums>;

/// Whether `FERRITE_LOCAL_TASK_STATS` asks for stage timing.
pub(crate) fn requested(value: Option<&std::ffi::OsStr>) -> bool {
    value.is_some_and(|v| v == "stages")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gaps_walls_and_balance_add_up() {
        let t = RegionTiming::new(3);
        // Stage 0: two threads, 0..100 and 0..60.
        t.tile(0, 0, 100, 0);
        t.tile(0, 0, 60, 1);
        // Stage 2 (stage 1 empty): starts 30 ns after stage 0 ended.
        t.tile(2, 130, 230, 1);
        let mut sums = StageSums::default();
        // At most 2 threads: stage 0 can take no less than its longest
        // tile (100 ns; its 160 ns over 2 threads is less), stage 2 its
        // single tile's 100 ns.
        sums.fold(&t, 2);
        assert_eq!(sums.per_stage[0], [1, 2, 100, 0, 160, 200, 0, 0, 100, 100]);
        assert_eq!(sums.per_stage[1], [0; 10]);
        assert_eq!(
            sums.per_stage[2],
            [1, 1, 100, 30, 100, 100, 130, 0, 100, 100]
        );
        assert_eq!(sums.totals(), [2, 3, 200, 30, 260, 300, 130, 0, 200, 200]);
        assert!(
            sums.describe().contains("shortest schedule 0.000 ms"),
            "{}",
            sums.describe()
        );
        // On one thread stage 0 needs both tiles one after the other; on
        // 4 threads its longest tile still bounds it.
        let mut alone = StageSums::default();
        alone.fold(&t, 1);
        assert_eq!(alone.per_stage[0][8], 160);
        let mut wide = StageSums::default();
        wide.fold(&t, 4);
        assert_eq!(wide.per_stage[0][8], 100);
        // Many even tiles: their time spread over the threads.
        let even = RegionTiming::new(1);
        for i in 0..8 {
            even.tile(0, 0, 50, i % 2);
        }
        let mut evens = StageSums::default();
        evens.fold(&even, 2);
        assert_eq!(evens.per_stage[0][8], 200);
        assert!(
            sums.describe().contains("balance 86.7%"),
            "{}",
            sums.describe()
        );
        // Per thread: stage 0's mean tile is 80 ns, so thread 0 took 1.25
        // and thread 1 0.75 of it; the one-tile stage 2 is left out.
        assert_eq!(sums.per_thread[0], (1.25, 1));
        assert_eq!(sums.per_thread[1], (0.75, 1));
        assert!(
            sums.describe()
                .contains("(processor id:ratio): 0:1.25 1:0.75\n"),
            "{}",
            sums.describe()
        );
        // Tile shares: of the multi-tile stages' tiles, each thread ran one.
        assert!(
            sums.describe()
                .contains("(processor id:share): 0:50.0 1:50.0"),
            "{}",
            sums.describe()
        );
        let uneven = RegionTiming::new(1);
        for i in 0..4 {
            uneven.tile(0, 0, 50, u32::from(i == 3));
        }
        let mut unevens = StageSums::default();
        unevens.fold(&uneven, 2);
        assert!(
            unevens
                .describe()
                .contains("(processor id:share): 0:75.0 1:25.0"),
            "{}",
            unevens.describe()
        );
        assert!(requested(Some(std::ffi::OsStr::new("stages"))));
        assert!(!requested(Some(std::ffi::OsStr::new("1"))));
        assert!(!requested(None));
    }
}
