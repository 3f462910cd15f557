//! The pool's tests: jobs, regions, idle workers, panics, options.

use super::region::Spin;
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
        let target = pool.lend_target().unwrap().upgrade().unwrap();
        let waiter = std::thread::spawn(move || {
            let start = Instant::now();
            ferrite_base::wait::spin_until(
                ferrite_base::time::Deadline::InfiniteFuture,
                &[target],
                || start.elapsed() >= Duration::from_micros(20),
            )
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
    fn link(shared: Arc<PoolState>, left: u32, done: std::sync::mpsc::Sender<()>) {
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
    // Small stages between large ones: a range left empty by a stage keeps
    // an older stage's word, which no claim may take from.
    let tiles = vec![3, 1, 64, 0, 3, 1000, 1, 1, 17, 2, 5, 1, 0, 4, 6, 1, 3, 2];
    let work = Staged {
        hits: tiles
            .iter()
            .map(|&n| (0..n).map(|_| AtomicUsize::new(0)).collect())
            .collect(),
        begun: tiles.iter().map(|_| AtomicUsize::new(0)).collect(),
        tiles,
    };
    for _ in 0..50 {
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
        50 * work.tiles.iter().sum::<u64>()
    );
}

/// [`Staged`] that prepares stages ahead and says their tile counts, so
/// a pool with claim-word banks writes the next stage's words early.
struct StagedAhead(Staged, AtomicUsize);

impl RegionWork for StagedAhead {
    fn stage_count(&self) -> usize {
        self.0.stage_count()
    }
    fn prepare_ahead(&self, stage: usize) {
        // Nothing of `stage` has begun or run yet.
        assert_eq!(self.0.begun[stage].load(Ordering::SeqCst), 0);
        self.1.fetch_add(1, Ordering::SeqCst);
    }
    fn prepared_tiles(&self, stage: usize) -> Option<u64> {
        Some(self.0.tiles[stage])
    }
    fn begin_stage(&self, stage: usize) -> Result<u64> {
        self.0.begin_stage(stage)
    }
    fn run_tile(&self, stage: usize, tile: u64, processor_id: u32) -> Result<u64> {
        self.0.run_tile(stage, tile, processor_id)
    }
}

/// With claim-word banks (the next stage's words written by the thread
/// preparing it ahead), still every tile of every stage runs once, and
/// only after its stage began and every tile of the earlier stages ran.
#[test]
fn with_banks_every_tile_of_every_stage_runs_once_in_order() {
    let pool = WorkerPool::new(4).unwrap();
    pool.shared.banks.store(true, Ordering::SeqCst);
    // Helpers prepare stages ahead: on a busy machine (CI's) the pool is
    // contended and the short-tile rule would run these microsecond tiles
    // on the leader alone, which prepares nothing ahead.
    pool.shared.short_tile_ns.store(0, Ordering::SeqCst);
    let tiles = vec![
        3, 1, 64, 0, 3, 1000, 1, 1, 17, 2, 5, 1, 0, 4, 6, 1, 3, 2, 9, 1,
    ];
    let work = StagedAhead(
        Staged {
            hits: tiles
                .iter()
                .map(|&n| (0..n).map(|_| AtomicUsize::new(0)).collect())
                .collect(),
            begun: tiles.iter().map(|_| AtomicUsize::new(0)).collect(),
            tiles,
        },
        AtomicUsize::new(0),
    );
    for _ in 0..200 {
        for h in work.0.hits.iter().flatten() {
            h.store(0, Ordering::SeqCst);
        }
        for b in &work.0.begun {
            b.store(0, Ordering::SeqCst);
        }
        pool.run_region(&work).unwrap();
        assert!(work
            .0
            .hits
            .iter()
            .flatten()
            .all(|h| h.load(Ordering::SeqCst) == 1));
    }
    let stats = pool.stats();
    assert_eq!(
        stats.workgroups_on_workers + stats.workgroups_on_callers,
        200 * work.0.tiles.iter().sum::<u64>()
    );
    // Stages were prepared ahead (and so their words written early).
    assert!(work.1.load(Ordering::SeqCst) > 0);
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
    if std::env::var_os(CONTENDED_SPIN_VAR).is_none() {
        assert_eq!(shared.contended_spin, region::CONTENDED_SPIN);
    }
    assert_eq!(shared.spin_bound(bound), shared.contended_spin);
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

/// One stage of long tiles recording, per processor id, the CPUs the
/// thread running the tile may use.
#[cfg(target_os = "linux")]
struct Affinities {
    tiles: u64,
    seen: Mutex<Vec<(u32, Vec<usize>)>>,
}

#[cfg(target_os = "linux")]
impl RegionWork for Affinities {
    fn stage_count(&self) -> usize {
        1
    }
    fn begin_stage(&self, _: usize) -> Result<u64> {
        Ok(self.tiles)
    }
    fn run_tile(&self, _: usize, _: u64, processor_id: u32) -> Result<u64> {
        std::thread::sleep(Duration::from_millis(60));
        // SAFETY: `set` is a plain bit set the kernel fills for the calling
        // thread (pid 0); CPU_ISSET reads bits below CPU_SETSIZE only.
        let cpus = unsafe {
            let mut set: libc::cpu_set_t = std::mem::zeroed();
            assert_eq!(
                libc::sched_getaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &mut set),
                0
            );
            (0..libc::CPU_SETSIZE as usize)
                .filter(|&c| libc::CPU_ISSET(c, &set))
                .collect()
        };
        self.seen.lock().push((processor_id, cpus));
        Ok(1)
    }
}

/// Workers given CPUs (the driver's default placement) run on exactly
/// their CPU; the leading caller stays unpinned.
#[cfg(target_os = "linux")]
#[test]
fn workers_run_on_the_cpus_they_are_pinned_to() {
    let cpus = crate::topology::default_worker_cpus(4);
    assert!(!cpus.is_empty(), "no CPU in this process's affinity mask");
    let pool = WorkerPool::with_options(&PoolOptions {
        cpu_ids: cpus.clone(),
        ..PoolOptions::new(cpus.len())
    })
    .unwrap();
    let work = Affinities {
        tiles: 2 * cpus.len() as u64 + 2,
        seen: Mutex::new(Vec::new()),
    };
    pool.run_region(&work).unwrap();
    let seen = work.seen.into_inner();
    let on_workers: Vec<_> = seen
        .iter()
        .filter(|(p, _)| (*p as usize) < cpus.len())
        .collect();
    // With one worker the caller leads alone (no room for helpers).
    if cpus.len() > 1 {
        assert!(!on_workers.is_empty(), "no tile ran on a worker: {seen:?}");
    }
    for (p, allowed) in on_workers {
        assert_eq!(allowed, &[cpus[*p as usize]], "worker {p}");
    }
}

/// The driver's default placement (best effort) lets each worker run on
/// its whole core: its CPU and that CPU's SMT siblings the process may use.
#[cfg(target_os = "linux")]
#[test]
fn default_placed_workers_may_run_on_their_whole_core() {
    if crate::topology::pins_one_cpu(std::env::var_os(crate::topology::PIN_VAR).as_deref()) {
        panic!("unset FERRITE_LOCAL_TASK_PIN=cpu to run this test");
    }
    let cpus = crate::topology::default_worker_cpus(4);
    assert!(!cpus.is_empty(), "no CPU in this process's affinity mask");
    let allowed = crate::topology::allowed_cpus().expect("affinity mask");
    let pool = WorkerPool::with_options(&PoolOptions {
        cpu_ids: cpus.clone(),
        pin_best_effort: true,
        ..PoolOptions::new(cpus.len())
    })
    .unwrap();
    let work = Affinities {
        tiles: 2 * cpus.len() as u64 + 2,
        seen: Mutex::new(Vec::new()),
    };
    pool.run_region(&work).unwrap();
    for (p, seen) in work.seen.into_inner() {
        let Some(&cpu) = cpus.get(p as usize) else {
            continue;
        };
        let mut want = crate::topology::core_cpus(cpu, &allowed, crate::topology::sysfs_core_of);
        want.sort_unstable();
        assert_eq!(seen, want, "worker {p}");
    }
}

/// A CPU that cannot be pinned to fails the pool, unless the placement
/// is best effort (the driver's default), which runs the worker unpinned.
#[cfg(target_os = "linux")]
#[test]
fn best_effort_pinning_survives_a_cpu_it_cannot_use() {
    let impossible = libc::CPU_SETSIZE as usize + 1;
    let strict = PoolOptions {
        cpu_ids: vec![impossible],
        ..PoolOptions::new(1)
    };
    let e = WorkerPool::with_options(&strict).err().expect("must fail");
    assert_eq!(e.code(), StatusCode::InvalidArgument);
    let lenient = PoolOptions {
        pin_best_effort: true,
        ..strict
    };
    let pool = WorkerPool::with_options(&lenient).unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    pool.spawn(Box::new(move || tx.send(()).unwrap()));
    rx.recv_timeout(Duration::from_secs(10))
        .expect("the unpinned worker ran no job");
}

/// With the leading caller stepped aside (`FERRITE_LOCAL_TASK_LEADER_ASIDE=1`), still every tile of every stage runs once and in order,
/// though the workers leave and rejoin between stages (and the last one
/// out wakes the leader, which then runs what is left itself).
#[test]
fn with_the_leader_aside_every_tile_of_every_stage_runs_once_in_order() {
    let pool = WorkerPool::new(3).unwrap();
    pool.shared.leader_aside.store(true, Ordering::SeqCst);
    let tiles = vec![3, 1, 64, 0, 3, 1000, 1, 1, 17, 2, 5, 1, 0, 4, 6, 1, 3, 2];
    let work = Staged {
        hits: tiles
            .iter()
            .map(|&n| (0..n).map(|_| AtomicUsize::new(0)).collect())
            .collect(),
        begun: tiles.iter().map(|_| AtomicUsize::new(0)).collect(),
        tiles,
    };
    for round in 0..200 {
        for h in work.hits.iter().flatten() {
            h.store(0, Ordering::SeqCst);
        }
        for b in &work.begun {
            b.store(0, Ordering::SeqCst);
        }
        if round % 50 == 49 {
            // Workers asleep when the region starts.
            std::thread::sleep(Duration::from_millis(5));
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
        200 * work.tiles.iter().sum::<u64>()
    );
}

/// `FERRITE_LOCAL_TASK_SLICE_US`'s request reaches the scheduler: on a
/// kernel with per-thread slices (Linux 6.12 and later, which this
/// project's machines run) the thread then reports the slice it asked for,
/// and its nice value is kept.
#[cfg(target_os = "linux")]
#[test]
fn a_worker_slice_request_sets_the_threads_slice() {
    let release = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap();
    let mut parts = release.trim().split(['.', '-']);
    let major: u32 = parts.next().unwrap().parse().unwrap();
    let minor: u32 = parts.next().unwrap().parse().unwrap();
    let got = std::thread::spawn(|| {
        // SAFETY: getpriority takes no pointers; 0 is the calling thread.
        let nice = unsafe { libc::getpriority(libc::PRIO_PROCESS, 0) };
        let r = try_set_own_slice(Duration::from_micros(300));
        // SAFETY: as above.
        let after = unsafe { libc::getpriority(libc::PRIO_PROCESS, 0) };
        (r, own_slice().unwrap(), nice, after)
    })
    .join()
    .unwrap();
    if (major, minor) >= (6, 12) {
        assert_eq!(got.0, Ok(()));
        assert_eq!(got.1, Duration::from_micros(300));
        assert_eq!(got.2, got.3, "the nice value changed");
    } else {
        assert!(got.0.is_err() || got.1 == Duration::from_micros(300));
    }
}

/// Tiles that keep their CPU busy for a while (no sleeping).
struct Busy(Duration);

impl RegionWork for Busy {
    fn stage_count(&self) -> usize {
        2
    }
    fn begin_stage(&self, _: usize) -> Result<u64> {
        Ok(6)
    }
    fn run_tile(&self, _: usize, _: u64, _: u32) -> Result<u64> {
        let start = Instant::now();
        while start.elapsed() < self.0 {
            std::hint::spin_loop();
        }
        Ok(1)
    }
}

/// Two workers pinned to one CPU, both running long tiles, take the CPU
/// from each other: the scheduler switches them out against their will,
/// which they notice when they go to sleep, and the pool counts as
/// contended (its spins short) although no spin was cut short.
#[test]
fn workers_switched_out_mid_tile_make_the_pool_contended() {
    let cpu = crate::topology::allowed_cpus()
        .and_then(|c| c.first().copied())
        .expect("a CPU in this process's affinity mask");
    let pool = WorkerPool::with_options(&PoolOptions {
        cpu_ids: vec![cpu, cpu],
        ..PoolOptions::new(2)
    })
    .unwrap();
    // Both workers join (the caller leaves the tiles to them).
    pool.shared.leader_aside.store(true, Ordering::SeqCst);
    assert_eq!(pool.stats().preempted_threads, 0);
    pool.run_region(&Busy(Duration::from_millis(6))).unwrap();
    let deadline = Instant::now() + Duration::from_secs(5);
    while pool.stats().preempted_threads == 0 && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(5));
    }
    assert!(pool.stats().preempted_threads > 0, "{:?}", pool.stats());
}

/// With the measuring aids of issue 25 on (participants sleeping between
/// stages instead of spinning, every stage waking as many workers as it
/// has tiles, one shared claim counter), still every tile of every stage
/// runs once, after its stage began.
#[test]
fn with_stage_sleeps_wake_all_and_a_shared_claim_every_tile_runs_once_in_order() {
    for (sleep_us, wake_all, shared) in [(1000u64, false, false), (50, true, true), (0, true, true)]
    {
        let pool = WorkerPool::new(4).unwrap();
        pool.shared
            .stage_sleep_ns
            .store(sleep_us * 1000, Ordering::SeqCst);
        pool.shared.wake_all.store(wake_all, Ordering::SeqCst);
        pool.shared.shared_claim.store(shared, Ordering::SeqCst);
        let tiles = vec![3, 1, 64, 0, 3, 1000, 1, 1, 17, 2, 5, 1, 0, 4, 6, 1, 3, 2];
        let work = Staged {
            hits: tiles
                .iter()
                .map(|&n| (0..n).map(|_| AtomicUsize::new(0)).collect())
                .collect(),
            begun: tiles.iter().map(|_| AtomicUsize::new(0)).collect(),
            tiles,
        };
        for _ in 0..50 {
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
    }
}

/// A stage's tiles each hold their thread for a while and count how many
/// run at once.
struct Concurrent {
    running: AtomicUsize,
    most: AtomicUsize,
}

impl RegionWork for Concurrent {
    fn stage_count(&self) -> usize {
        4
    }
    fn begin_stage(&self, _: usize) -> Result<u64> {
        Ok(64)
    }
    fn run_tile(&self, _: usize, _: u64, _: u32) -> Result<u64> {
        let now = self.running.fetch_add(1, Ordering::SeqCst) + 1;
        self.most.fetch_max(now, Ordering::SeqCst);
        std::thread::sleep(Duration::from_micros(300));
        self.running.fetch_sub(1, Ordering::SeqCst);
        Ok(1)
    }
}

/// Joins share the region list's lock, so the workers a stage wakes enter
/// at once; each takes room with a compare-and-swap, and a region still
/// never holds more threads than the pool has workers (the caller leading
/// included).
#[test]
fn workers_joining_at_once_never_exceed_the_room() {
    let pool = Arc::new(WorkerPool::new(6).unwrap());
    // The room is one worker fewer than the pool has: without the
    // contended-caller rule, which on a busy machine would admit all 6.
    pool.shared.contended_caller.store(false, Ordering::SeqCst);
    let works: Vec<Arc<Concurrent>> = (0..1)
        .map(|_| {
            Arc::new(Concurrent {
                running: AtomicUsize::new(0),
                most: AtomicUsize::new(0),
            })
        })
        .collect();
    let callers: Vec<_> = works
        .iter()
        .map(|w| {
            let (pool, w) = (pool.clone(), w.clone());
            std::thread::spawn(move || {
                for _ in 0..10 {
                    pool.run_region(&*w).unwrap();
                }
            })
        })
        .collect();
    for c in callers {
        c.join().unwrap();
    }
    for w in &works {
        let most = w.most.load(Ordering::SeqCst);
        // 5 workers may join beside the caller.
        assert!(most <= 6, "{most} tiles of one region ran at once");
        assert!(most >= 2, "no worker ever joined ({most})");
    }
}

/// Stages of tiles that hold their thread for a while (tile 0 of each
/// stage longest, so the other threads run out of tiles while it runs),
/// counting each tile's runs.
struct Slow {
    runs: Vec<AtomicUsize>,
}

const SLOW_STAGES: usize = 4;
const SLOW_TILES: u64 = 6;

impl RegionWork for Slow {
    fn stage_count(&self) -> usize {
        SLOW_STAGES
    }
    fn begin_stage(&self, stage: usize) -> Result<u64> {
        // Every tile of the stage before ran once.
        if stage > 0 {
            let before = (stage - 1) * SLOW_TILES as usize;
            for r in &self.runs[before..before + SLOW_TILES as usize] {
                assert_eq!(r.load(Ordering::SeqCst), 1);
            }
        }
        Ok(SLOW_TILES)
    }
    fn run_tile(&self, stage: usize, tile: u64, _: u32) -> Result<u64> {
        let ms = if tile == 0 { 4 } else { 1 };
        std::thread::sleep(Duration::from_millis(ms));
        self.runs[stage * SLOW_TILES as usize + tile as usize].fetch_add(1, Ordering::SeqCst);
        Ok(1)
    }
}

/// Runs `regions` regions of [`Slow`] on a pool of 3 workers with the
/// long-stage rule at `threshold_ns` (0: off), only while contended if
/// `contended_only` (the pool then counts as contended throughout);
/// returns the sleeps after a long stage it counted.
fn long_stage_waits(threshold_ns: u64, contended_only: bool, regions: usize) -> u64 {
    let pool = WorkerPool::new(3).unwrap();
    pool.shared
        .long_stage_ns
        .store(threshold_ns, Ordering::SeqCst);
    pool.shared
        .long_stage_contended
        .store(contended_only, Ordering::SeqCst);
    if contended_only {
        pool.shared
            .contended_until
            .store(u64::MAX, Ordering::SeqCst);
    }
    for _ in 0..regions {
        let work = Slow {
            runs: (0..SLOW_STAGES * SLOW_TILES as usize)
                .map(|_| AtomicUsize::new(0))
                .collect(),
        };
        pool.run_region(&work).unwrap();
        assert!(work.runs.iter().all(|r| r.load(Ordering::SeqCst) == 1));
    }
    pool.stats().long_stage_waits
}

/// A participant that worked a long stage (milliseconds of tiles, more
/// than the threshold) and found nothing left to claim sleeps until the
/// next stage instead of spinning; with the threshold above the stages'
/// length, or the rule off, nobody does (they spin as before).
#[test]
fn after_a_long_stage_participants_sleep_instead_of_spinning() {
    let on = long_stage_waits(500_000, false, 5);
    assert!(on > 0, "no participant slept after 1-4 ms stages");
    assert_eq!(long_stage_waits(1_000_000_000, false, 2), 0);
    assert_eq!(long_stage_waits(0, false, 2), 0);
    // Only while contended: the pool counts as contended here.
    assert!(long_stage_waits(500_000, true, 5) > 0);
}

/// With every stage counting as long (a threshold of 1 ns: every
/// participant out of tiles sleeps, workers on the region's stage word,
/// the leader on its own), still every tile of every stage runs once,
/// after its stage began, and no stage change is missed (a lost wake-up
/// would hold the region for the sleep's bound, or the leader for ever).
#[test]
fn with_every_stage_long_every_tile_runs_once_in_order() {
    let pool = WorkerPool::new(4).unwrap();
    pool.shared.long_stage_ns.store(1, Ordering::SeqCst);
    let tiles = vec![3, 1, 64, 0, 3, 1000, 1, 1, 17, 2, 5, 1, 0, 4, 6, 1, 3, 2];
    let work = Staged {
        hits: tiles
            .iter()
            .map(|&n| (0..n).map(|_| AtomicUsize::new(0)).collect())
            .collect(),
        begun: tiles.iter().map(|_| AtomicUsize::new(0)).collect(),
        tiles,
    };
    for _ in 0..50 {
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
    assert!(pool.stats().long_stage_waits > 0);
}

/// The distinct threads that ran a region of 8 tiles of 2 ms on `pool`.
fn threads_running(pool: &WorkerPool) -> usize {
    let work = OneStage::new(8, Duration::from_millis(2));
    pool.run_region(&work).unwrap();
    let mut ids: Vec<u32> = work.ran.lock().iter().map(|&(_, p)| p).collect();
    ids.sort_unstable();
    ids.dedup();
    ids.len()
}

/// The short-tile rule: after regions of tiles far shorter than its
/// threshold, a region started while the pool is contended admits at
/// most `SHORT_TILE_HELPERS` workers; that region's long tiles lift the
/// average over the threshold, and the next regions admit every worker
/// again; with the rule off nothing is capped.
#[test]
fn while_contended_a_region_after_short_tiles_admits_few_helpers() {
    let pool = WorkerPool::new(4).unwrap();
    let s = &pool.shared;
    s.short_tile_ns.store(200_000, Ordering::SeqCst);
    // This test is about the short-tile rule alone (the contended-caller
    // rule would add the caller's worker back to long-tile regions).
    s.contended_caller.store(false, Ordering::SeqCst);
    for _ in 0..20 {
        pool.run_region(&OneStage::new(8, Duration::ZERO)).unwrap();
    }
    let recent = s.recent_tile_ns.load(Ordering::SeqCst);
    assert!(recent > 0 && recent < 200_000, "average tile {recent} ns");
    s.contended_until.store(u64::MAX, Ordering::SeqCst);
    // Contended by its own threads alone (other programs leave the CPUs
    // idle): every worker may join.
    s.machine.assume.store(2, Ordering::SeqCst);
    assert_eq!(s.region_helpers(false), 3);
    // Other programs keep the CPUs busy (the rule's condition).
    s.machine.assume.store(1, Ordering::SeqCst);
    let caps = pool.stats().short_tile_caps;
    let n = threads_running(&pool);
    assert!(
        n <= 1 + region::SHORT_TILE_HELPERS,
        "{n} threads ran a region started after short tiles"
    );
    assert_eq!(pool.stats().short_tile_caps, caps + 1);
    // Its 2 ms tiles (the sample capped at 4x the threshold) lift the
    // average over the threshold.
    assert!(s.recent_tile_ns.load(Ordering::SeqCst) >= 200_000);
    let most = (0..5).map(|_| threads_running(&pool)).max().unwrap();
    assert!(most > 2, "long tiles ran on at most {most} threads");
    assert_eq!(pool.stats().short_tile_caps, caps + 1);
    // Off: short tiles measured, contended, and every worker may join.
    s.short_tile_ns.store(0, Ordering::SeqCst);
    s.recent_tile_ns.store(1, Ordering::SeqCst);
    assert_eq!(s.region_helpers(false), 3);
    // On, and not contended: every worker may join.
    s.short_tile_ns.store(200_000, Ordering::SeqCst);
    s.contended_until.store(0, Ordering::SeqCst);
    if !s.is_contended() {
        // (A spinner of this pool descheduled just now would mark it
        // contended again; then this check says nothing.)
        assert_eq!(s.region_helpers(false), 3);
    }
}

/// The contended-caller rule: while the pool is contended, a region of
/// long tiles that a caller leads admits every worker, so it runs on one
/// thread more than the pool has workers (the caller beside all of them);
/// uncontended, or with the rule off, one worker stays out. Without the
/// rule at most 3 threads run a region of a 3-worker pool.
#[test]
fn while_contended_a_caller_led_region_admits_every_worker() {
    let pool = WorkerPool::new(3).unwrap();
    let s = &pool.shared;
    // On by default; set here so an environment turning it off does not
    // turn this test into one that cannot fail.
    s.contended_caller.store(true, Ordering::SeqCst);
    s.contended_until.store(u64::MAX, Ordering::SeqCst);
    // Other programs keep the CPUs busy (the rule's condition).
    s.machine.assume.store(1, Ordering::SeqCst);
    let widened = pool.stats().contended_widened;
    assert_eq!(s.region_helpers(false), 3);
    // Tiles of 2 ms sleeps: every thread admitted finds some (woken
    // workers join within a tile's time), CPUs or not.
    let most = (0..5).map(|_| threads_running(&pool)).max().unwrap();
    assert_eq!(
        most, 4,
        "a contended caller-led region ran on {most} threads"
    );
    assert!(pool.stats().contended_widened > widened);
    // A leader stepping aside already admits every worker: nothing to add.
    assert_eq!(s.region_helpers(true), 3);
    // A worker leading (a queued submission) is not a caller: the others
    // join it, as uncontended.
    let (tx, rx) = std::sync::mpsc::channel();
    let shared = pool.shared.clone();
    pool.spawn(Box::new(move || {
        let _ = tx.send(shared.region_helpers(false));
    }));
    assert_eq!(rx.recv_timeout(Duration::from_secs(30)).unwrap(), 2);
    // Off: one worker stays out, as uncontended.
    s.contended_caller.store(false, Ordering::SeqCst);
    assert_eq!(s.region_helpers(false), 2);
    s.contended_caller.store(true, Ordering::SeqCst);
    // Contended only by its own threads (idle CPUs otherwise): no extra
    // thread.
    s.machine.assume.store(2, Ordering::SeqCst);
    assert_eq!(s.region_helpers(false), 2);
    s.machine.assume.store(1, Ordering::SeqCst);
    assert_eq!(s.region_helpers(false), 3);
    s.contended_until.store(0, Ordering::SeqCst);
    if !s.is_contended() {
        // (A spinner of this pool descheduled just now would mark it
        // contended again; then this check says nothing.)
        assert_eq!(s.region_helpers(false), 2);
    }
}

/// The loaded-solo rule: it holds only while other programs fill every CPU
/// (not half of them), the pool's recent tiles are short and it is on;
/// solo runs that average over `SOLO_MAX` rest it, and one slow run among
/// short ones does not.
#[test]
fn the_loaded_solo_rule_needs_a_full_machine_and_short_tiles() {
    let pool = WorkerPool::with_options(&PoolOptions {
        solo_when_loaded: true,
        ..PoolOptions::new(2)
    })
    .unwrap();
    let s = &pool.shared;
    s.short_tile_ns.store(30_000, Ordering::SeqCst);
    s.machine.assume.store(3, Ordering::SeqCst);
    // No tile timed yet: the program's size is unknown.
    assert!(!pool.solo_now());
    s.note_tile_time(Duration::from_micros(50), 10);
    assert!(pool.solo_now());
    // Half the CPUs busy is not enough; neither is an idle machine.
    s.machine.assume.store(1, Ordering::SeqCst);
    assert!(!pool.solo_now());
    s.machine.assume.store(2, Ordering::SeqCst);
    assert!(!pool.solo_now());
    s.machine.assume.store(3, Ordering::SeqCst);
    // Long tiles (MiniLM's hundreds of microseconds) keep the pool.
    for _ in 0..20 {
        s.note_tile_time(Duration::from_micros(500), 1);
    }
    assert!(!pool.solo_now());
    for _ in 0..20 {
        s.note_tile_time(Duration::from_micros(5), 1);
    }
    assert!(pool.solo_now());
    // One run that lost its CPU for a slice among short ones: still solo.
    for _ in 0..50 {
        pool.note_solo_run(Duration::from_micros(40));
    }
    pool.note_solo_run(Duration::from_millis(6));
    assert!(pool.solo_now());
    // Runs of about 2 ms: the rule rests.
    let mut rested = false;
    for _ in 0..20 {
        pool.note_solo_run(Duration::from_millis(2));
        if !pool.solo_now() {
            rested = true;
            break;
        }
    }
    assert!(rested, "solo runs of 2 ms did not rest the rule");
    assert!(pool.stats().solo_submissions >= 52);
    // ...for SOLO_REST.
    s.solo_rests_until.store(0, Ordering::SeqCst);
    assert!(pool.solo_now());
    // One run of many slices (a large program that slipped through): at
    // once.
    pool.note_solo_run(Duration::from_millis(80));
    assert!(!pool.solo_now());
    s.solo_rests_until.store(0, Ordering::SeqCst);
    assert!(pool.solo_now());
    // Off.
    let off = WorkerPool::with_options(&PoolOptions {
        solo_when_loaded: false,
        ..PoolOptions::new(2)
    })
    .unwrap();
    off.shared.short_tile_ns.store(30_000, Ordering::SeqCst);
    off.shared.machine.assume.store(3, Ordering::SeqCst);
    off.shared.note_tile_time(Duration::from_micros(5), 1);
    assert!(!off.solo_now());
}
