//! The CPU devices: `local-sync` runs every queue operation inline on the
//! caller's thread; `local-task` runs submissions on a worker pool as their
//! wait fences are reached, and runs each command buffer as a region of the
//! pool (see [`crate::pool`]): its commands are split at the execution
//! barriers into stages, the commands of one stage run concurrently, and
//! each dispatch's workgroup grid is cut into tiles sized for the pool
//! (about [`TILES_PER_THREAD`] per thread that may run them), which the
//! pool's threads claim one at a time.
//!
//! Collectives (see [`crate::channel`]) run on the thread that reaches
//! them and wait there for the peer ranks, each of which runs on its own
//! device; on `local-task` each is a stage of its own, so a command
//! buffer's collectives run in order.
//!
//! Helping: a thread blocked waiting for a `local-task` device's work runs
//! its queued submissions itself (see [`crate::pool::lending`]), by
//! default whatever the worker count; only a thread waiting on a semaphore
//! this device's submissions signal (`submit` names the pool to them), so
//! a wait on the host or on another device runs none of its work;
//! [`PoolOptions::lend_to_waiters`] (URI parameter
//! `local-task://?lend_to_waiters=true|false|auto`) decides it, and
//! [`CpuDevice::scheduler_stats`] reports how many workgroups ran on the
//! workers and how many on other threads. With the environment variable
//! `FERRITE_LOCAL_TASK_STATS` set, each `local-task` pool prints those
//! statistics to stderr when it is dropped or the process exits (a
//! diagnostic for tools and benchmarks); with `FERRITE_LOCAL_TASK_STATS=stages`
//! it adds where command buffers' time went, stage by stage (wall, gaps
//! between stages, tile time, balance: see `pool::timing`).

use crate::channel::CpuChannel;
use crate::cpu_executable::{CpuExecutable, FORMATS};
use crate::executable::library::DispatchConfig;
use crate::pool::region::RegionWork;
use crate::pool::{PoolOptions, PoolStats, WorkerPool};
use ferrite_base::trace::{self, Arg};
use ferrite_base::{bail, Result, Status, StatusCode};
use ferrite_hal::allocator::{Allocator, CachingAllocator, HeapAllocator};
use ferrite_hal::buffer::DeviceRange;
use ferrite_hal::channel::{ChannelParams, ChannelProvider, ChannelRef};
use ferrite_hal::command_buffer::{Binding, BufferRef, Command};
use ferrite_hal::command_trace;
use ferrite_hal::device::{run_inline, Device, Work, WorkHint};
use ferrite_hal::executable::Executable;
use ferrite_hal::fence::Fence;
use ferrite_hal::memory::MemoryAccess;
use parking_lot::Mutex;
use smallvec::SmallVec;
use std::any::Any;
use std::ffi::c_void;
use std::ops::Range;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Instant;

/// Tiles a dispatch is cut into per thread that may run it: enough that a
/// thread finishing early finds more to take (balance), few enough that
/// claiming stays cheap next to running a tile.
pub const TILES_PER_THREAD: u64 = 8;

/// Most bytes of freed queue-allocated blocks a device keeps for reuse:
/// enough for the transients and results of typical per-call programs,
/// small next to what those programs map anyway.
const QUEUE_POOL_BYTES: u64 = 32 << 20;

/// How a CPU device runs work.
enum Mode {
    Sync,
    Task(Arc<WorkerPool>),
}

/// A CPU device (`local-sync` or `local-task`).
pub struct CpuDevice {
    id: &'static str,
    allocator: Arc<HeapAllocator>,
    /// Pool for queue `alloca` (see [`Device::queue_allocator`]).
    queue_pool: Arc<CachingAllocator>,
    mode: Mode,
    /// Abort the process when queue work fails (upstream's
    /// `--task_abort_on_failure`), instead of failing the signal fence.
    abort_on_failure: AtomicBool,
    /// Exports whose dispatches fail on purpose ([`FAIL_DISPATCH_VAR`],
    /// read when the device is created).
    fail_dispatch: Option<String>,
}

impl CpuDevice {
    /// `local-sync`: work runs inline on the calling thread.
    pub fn local_sync() -> Arc<CpuDevice> {
        Arc::new(CpuDevice {
            id: "local-sync",
            allocator: Arc::new(HeapAllocator::new()),
            queue_pool: Arc::new(CachingAllocator::for_device(QUEUE_POOL_BYTES, "local-sync")),
            mode: Mode::Sync,
            abort_on_failure: AtomicBool::new(false),
            fail_dispatch: fail_dispatch_pattern(),
        })
    }

    /// `local-task` with `workers` threads (0 = one per available core)
    /// and the default options. Fails when the system refuses a thread.
    pub fn local_task(workers: usize) -> Result<Arc<CpuDevice>> {
        CpuDevice::local_task_with(PoolOptions::new(workers))
    }

    /// `local-task` with `workers` threads (0 = one per available core) of
    /// `stack_size` bytes each (None: the platform default), as upstream's
    /// `--task_worker_stack_size`.
    pub fn local_task_with_stack_size(
        workers: usize,
        stack_size: Option<usize>,
    ) -> Result<Arc<CpuDevice>> {
        CpuDevice::local_task_with(PoolOptions {
            stack_size,
            ..PoolOptions::new(workers)
        })
    }

    /// `local-task` with a pool made from `options` (`workers` 0 = one per
    /// available core; counts above [`crate::pool::MAX_WORKERS`] are
    /// clamped to it, as upstream clamps its group count).
    pub fn local_task_with(mut options: PoolOptions) -> Result<Arc<CpuDevice>> {
        if options.workers == 0 {
            options.workers = std::thread::available_parallelism().map_or(1, |n| n.get());
        }
        let pool = WorkerPool::with_options(&options)?;
        Ok(Arc::new(CpuDevice {
            id: "local-task",
            allocator: Arc::new(HeapAllocator::new()),
            queue_pool: Arc::new(CachingAllocator::for_device(QUEUE_POOL_BYTES, "local-task")),
            mode: Mode::Task(Arc::new(pool)),
            abort_on_failure: AtomicBool::new(false),
            fail_dispatch: fail_dispatch_pattern(),
        }))
    }

    /// Makes a failure of queue work on `local-task` abort the process
    /// (after printing its status to stderr), as upstream's
    /// `--task_abort_on_failure`; off by default (the failure fails the
    /// submission's signal fence). A debugging aid: the process stops
    /// where the first failure happened.
    pub fn set_abort_on_failure(&self, abort: bool) {
        self.abort_on_failure.store(abort, Ordering::Relaxed);
    }

    /// What the `local-task` scheduler has done so far (None for
    /// `local-sync`): workgroups run on workers and on other threads,
    /// sleeps, idle polling time, worker CPU time.
    pub fn scheduler_stats(&self) -> Option<PoolStats> {
        match &self.mode {
            Mode::Sync => None,
            Mode::Task(p) => Some(p.stats()),
        }
    }

    /// Whether threads blocked waiting run this device's queued work
    /// (`local-task` with lending on; see the module docs).
    pub fn lends_to_waiters(&self) -> bool {
        match &self.mode {
            Mode::Sync => false,
            Mode::Task(p) => p.lends_to_waiters(),
        }
    }

    /// Worker threads (1 for `local-sync`).
    pub fn worker_count(&self) -> usize {
        match &self.mode {
            Mode::Sync => 1,
            Mode::Task(p) => p.worker_count(),
        }
    }

    /// Fails a dispatch of an export that [`FAIL_DISPATCH_VAR`] names (a
    /// glob), with `INTERNAL` and a message saying so: a way to see how a
    /// device failure reaches the program's waiters (the status, its
    /// message and where it arose), which correct programs on a CPU
    /// otherwise never show. Unset, nothing fails.
    #[inline]
    fn injected_failure(&self, cpu: &CpuExecutable, function: u32) -> Result<()> {
        match &self.fail_dispatch {
            None => Ok(()),
            Some(pattern) => Self::injected_failure_for(pattern, cpu, function),
        }
    }

    /// [`CpuDevice::injected_failure`] with a pattern set (out of line: a
    /// measuring aid, not the dispatch path).
    #[cold]
    #[inline(never)]
    fn injected_failure_for(pattern: &str, cpu: &CpuExecutable, function: u32) -> Result<()> {
        let name = export_name(cpu, function);
        if glob(pattern, &name) {
            bail!(
                Internal,
                "injected dispatch failure ({FAIL_DISPATCH_VAR}={pattern})"
            );
        }
        Ok(())
    }

    /// Runs a dispatch here and now (`local-sync`): the caller holds every
    /// bound buffer for the whole call, so plain addresses do.
    fn dispatch_inline(
        &self,
        exe: &Arc<dyn Executable>,
        function: u32,
        workgroups: [u32; 3],
        constants: &[u32],
        bindings: &[BufferRef],
        table: &[Binding],
    ) -> Result<()> {
        let cpu = cpu_executable(exe)?;
        if workgroups.contains(&0) {
            return Ok(());
        }
        // `addrs` holds the bindings' in-flight marks until the dispatch
        // returns: host access to the bound allocations is refused meanwhile.
        let mut addrs = BindingAddrs::empty();
        addrs.resolve_into(cpu, function, bindings, table)?;
        let start = trace::enabled().then(trace::now_ns);
        let outcome = self.injected_failure(cpu, function).and_then(|()| {
            run_slice(
                cpu,
                function,
                workgroups,
                None,
                0,
                1,
                constants,
                &addrs.ptrs,
                &addrs.lens,
            )
        });
        if let Some(start) = start {
            let mut args = dispatch_args(workgroups, &addrs.lens, &outcome);
            args.extend(command_trace::executable_args(cpu, function));
            let took = trace::now_ns().saturating_sub(start);
            args.push(("tiles", Arg::U64(1)));
            args.push(("tile_ns", Arg::U64(took)));
            let track = trace::device_track(self.id);
            trace::complete("dispatch", export_name(cpu, function), track, start, args);
        }
        outcome
    }
}

/// Runs a submission's work, a panic in it becoming an `INTERNAL` failure
/// (which fails the submission's signal fence) instead of unwinding into
/// the worker thread that runs it.
fn run_caught(work: Work) -> Result<()> {
    std::panic::catch_unwind(std::panic::AssertUnwindSafe(work)).unwrap_or_else(|payload| {
        Err(Status::new(
            StatusCode::Internal,
            format!(
                "local-task: queue work panicked: {}",
                crate::pool::region::panic_message(&*payload)
            ),
        ))
    })
}

/// The name of export `function` (`?` when the library has none there).
fn export_name(cpu: &CpuExecutable, function: u32) -> String {
    cpu.library()
        .export(function)
        .map_or_else(|| format!("export {function}"), |e| e.name.clone())
}

/// Where a dispatch failure arose, for its status: the export by name and
/// the workgroup counts (the queue operation and the device are added by
/// the queue work that ran it).
fn dispatch_context(cpu: &CpuExecutable, function: u32, workgroups: [u32; 3]) -> String {
    let [x, y, z] = workgroups;
    format!(
        "dispatch '{}' (workgroups {x}x{y}x{z})",
        export_name(cpu, function)
    )
}

/// Adds the device to a failure of queue work it ran, so every waiter on
/// the failed semaphores sees where the failure arose.
/// Runs a `local-task` submission's work and signals (or fails) `signal`
/// with its outcome; with `abort` (`--task_abort_on_failure`) a failure
/// aborts the process instead.
fn run_and_signal(work: Work, signal: &Fence, abort: bool, id: &str) {
    match run_caught(work) {
        // Signalling cannot fail for fresh values; a failure here means a
        // program bug already reported through the timeline.
        Ok(()) => drop(signal.signal()),
        Err(e) if abort => {
            eprintln!("local-task: queue work failed (--task_abort_on_failure): {e}");
            std::process::abort();
        }
        Err(e) => signal.fail(on_device(e, id)),
    }
}

/// Most bytes a fill, update or copy of small work may touch (one tile).
pub const SMALL_TRANSFER_BYTES: u64 = 64 * 1024;

/// Whether work is small enough to run on the submitting thread: queue
/// bookkeeping, or commands whose every stage (between barriers) is at
/// most one tile: one direct single-workgroup dispatch or one transfer of
/// at most [`SMALL_TRANSFER_BYTES`]. Such a command buffer runs on one
/// thread wherever it runs; collectives and indirect dispatches (their
/// size is known only when they run) are never small.
pub fn is_small(hint: WorkHint<'_>) -> bool {
    let commands = match hint {
        WorkHint::Bookkeeping => return true,
        WorkHint::Commands(c) => c,
    };
    let mut stage_tiles = 0u64;
    for c in commands {
        let tiles = match c {
            Command::Barrier => {
                stage_tiles = 0;
                continue;
            }
            Command::Dispatch {
                workgroups,
                indirect: None,
                ..
            } => workgroups.iter().map(|&n| u64::from(n)).product::<u64>(),
            Command::Update { data, .. } => small_transfer(Some(data.len() as u64)),
            Command::Fill { target, .. } | Command::Copy { target, .. } => {
                small_transfer(known_length(target))
            }
            Command::Dispatch { .. } | Command::Collective { .. } => return false,
        };
        stage_tiles += tiles;
        if stage_tiles > 1 {
            return false;
        }
    }
    true
}

/// The most workgroups (all dispatches together) of work the loaded-solo
/// rule runs on one thread. With the rule's tiles under
/// `pool::region::SHORT_TILE` (30 us) on average, such work takes at most
/// about 2 ms on one thread; the small MLP of issue 25 has 9 workgroups a
/// call, MiniLM about 1,400 (whose one-thread run, ~80 ms against 17 ms in
/// the pool under load, the bound keeps out).
pub const SOLO_MAX_WORKGROUPS: u64 = 64;

/// Whether `hint`'s work is small enough for the loaded-solo rule and can
/// run to its end on any one thread: direct dispatches of at most
/// [`SOLO_MAX_WORKGROUPS`] workgroups in all, transfers of known lengths,
/// and no collective (which waits for peer ranks whose work the same
/// thread may have yet to submit) or indirect dispatch (its size is known
/// only when it runs).
pub fn solo_sized(hint: WorkHint<'_>) -> bool {
    let commands = match hint {
        WorkHint::Bookkeeping => return true,
        WorkHint::Commands(c) => c,
    };
    let mut workgroups = 0u64;
    for c in commands {
        match c {
            Command::Barrier | Command::Update { .. } => {}
            Command::Dispatch {
                workgroups: w,
                indirect: None,
                ..
            } => {
                workgroups =
                    workgroups.saturating_add(w.iter().map(|&n| u64::from(n)).product::<u64>());
                if workgroups > SOLO_MAX_WORKGROUPS {
                    return false;
                }
            }
            Command::Fill { target, .. } | Command::Copy { target, .. } => {
                if known_length(target).is_none() {
                    return false;
                }
            }
            Command::Dispatch { .. } | Command::Collective { .. } => return false,
        }
    }
    true
}

thread_local! {
    /// Set while this thread runs a submission the loaded-solo rule kept
    /// here (see `submit_hinted`).
    static SOLO: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// Marks the calling thread as running a solo submission until dropped.
struct SoloGuard(bool);

impl SoloGuard {
    fn enter() -> SoloGuard {
        SoloGuard(SOLO.with(|s| s.replace(true)))
    }

    fn active() -> bool {
        SOLO.with(|s| s.get())
    }
}

impl Drop for SoloGuard {
    fn drop(&mut self) {
        let was = self.0;
        SOLO.with(|s| s.set(was));
    }
}

/// One tile for a transfer of a known length of at most
/// [`SMALL_TRANSFER_BYTES`], more than any stage of small work otherwise.
fn small_transfer(length: Option<u64>) -> u64 {
    match length {
        Some(n) if n <= SMALL_TRANSFER_BYTES => 1,
        _ => u64::MAX / 2,
    }
}

/// The byte length a buffer reference names, when known before it runs.
fn known_length(r: &BufferRef) -> Option<u64> {
    match r {
        BufferRef::Direct {
            buffer,
            offset,
            length,
        } => Some(if *length == u64::MAX {
            buffer.byte_length().saturating_sub(*offset)
        } else {
            *length
        }),
        BufferRef::Slot { length, .. } => (*length != u64::MAX).then_some(*length),
    }
}

fn on_device(e: Status, id: &str) -> Status {
    e.annotate(format!("on device '{id}'"))
}

/// The environment variable naming exports (`*` wildcards) whose dispatches
/// fail on purpose (see `CpuDevice::injected_failure`).
pub const FAIL_DISPATCH_VAR: &str = "FERRITE_FAIL_DISPATCH";

/// A dispatch span's values: workgroup counts, the bytes its bindings
/// span, and its failure if it failed.
fn dispatch_args(
    workgroups: [u32; 3],
    lens: &[usize],
    outcome: &Result<()>,
) -> Vec<(&'static str, Arg)> {
    let mut args = vec![
        (
            "workgroups",
            Arg::List(workgroups.iter().map(|&w| w as u64).collect()),
        ),
        ("bytes", Arg::U64(lens.iter().map(|&l| l as u64).sum())),
    ];
    if let Err(e) = outcome {
        args.push(("failed", Arg::Str(e.to_string())));
    }
    args
}

/// The [`FAIL_DISPATCH_VAR`] pattern, if set and not empty.
fn fail_dispatch_pattern() -> Option<String> {
    std::env::var(FAIL_DISPATCH_VAR)
        .ok()
        .filter(|g| !g.is_empty())
}

fn cpu_executable(exe: &Arc<dyn Executable>) -> Result<&CpuExecutable> {
    match exe.as_any().downcast_ref::<CpuExecutable>() {
        Some(cpu) => Ok(cpu),
        None => bail!(
            InvalidArgument,
            "dispatch of an executable that the CPU driver did not load"
        ),
    }
}

/// Host addresses and lengths of a dispatch's bindings, and the marks that
/// count the dispatch as device work in flight on each bound allocation.
struct BindingAddrs<'a> {
    ptrs: SmallVec<[*mut c_void; 8]>,
    lens: SmallVec<[usize; 8]>,
    in_flight: SmallVec<[DeviceRange<'a>; 8]>,
}

// SAFETY: the addresses point into buffers that the binding table (or the
// command's direct references) of the command buffer being executed keeps
// alive until the execution returns, which is after every tile using them
// finished; the pointers themselves carry no thread affinity. Concurrent
// use is the kernels' disjoint writes (see `run_slice`).
unsafe impl Send for BindingAddrs<'_> {}
// SAFETY: as for Send; nothing is mutated through a shared BindingAddrs.
unsafe impl Sync for BindingAddrs<'_> {}

impl<'a> BindingAddrs<'a> {
    /// Resolves each binding with the access the kernel may make to it
    /// (`ANY` for every CPU binding: the library ABI marks none read-only),
    /// so read-only storage other than a program constant, bound where a
    /// kernel may write, is refused here, before the kernel runs.
    fn resolve(
        cpu: &CpuExecutable,
        function: u32,
        bindings: &'a [BufferRef],
        table: &'a [Binding],
    ) -> Result<BindingAddrs<'a>> {
        let mut addrs = BindingAddrs::empty();
        addrs.resolve_into(cpu, function, bindings, table)?;
        Ok(addrs)
    }

    fn empty() -> BindingAddrs<'a> {
        BindingAddrs {
            ptrs: SmallVec::new(),
            lens: SmallVec::new(),
            in_flight: SmallVec::new(),
        }
    }

    /// [`BindingAddrs::resolve`] into an empty `self`, for a caller that
    /// keeps the addresses in place (no copy of the inline vectors).
    fn resolve_into(
        &mut self,
        cpu: &CpuExecutable,
        function: u32,
        bindings: &'a [BufferRef],
        table: &'a [Binding],
    ) -> Result<()> {
        let addrs = self;
        let start = addrs.in_flight.len();
        // All bindings' device uses begun together: one fence between their
        // counts and their checks against host access, not one per binding.
        let ranges = bindings.iter().enumerate().map(|(i, r)| {
            let access = cpu.binding_access(function, i);
            r.resolve(table).map(|(b, o, l)| (b, o, l, access))
        });
        ferrite_hal::buffer::binding_ranges_resolved(ranges, &mut addrs.in_flight).map_err(
            |(i, e)| binding_error(e, cpu, function, i, cpu.binding_access(function, i)),
        )?;
        for range in &addrs.in_flight[start..] {
            addrs.ptrs.push(range.as_ptr().cast());
            addrs.lens.push(range.len());
        }
        Ok(())
    }
}

/// Names the binding and why it needs the access it was refused.
fn binding_error(
    e: Status,
    cpu: &CpuExecutable,
    function: u32,
    binding: usize,
    access: MemoryAccess,
) -> Status {
    let export = cpu
        .library()
        .export(function)
        .map_or("?", |x| x.name.as_str());
    let why = if access.intersects(MemoryAccess::WRITE | MemoryAccess::ANY) {
        " (the kernel may write it: CPU executables mark no binding read-only)"
    } else {
        ""
    };
    e.annotate(format!(
        "dispatch binding {binding} of '{export}' needs {access} access{why}"
    ))
}

/// A command buffer's execution as pool work: stages between barriers.
struct CommandsWork<'a> {
    device: &'a CpuDevice,
    commands: &'a [Command],
    table: &'a [Binding],
    /// Command index ranges of the stages (barriers and empty stages left out).
    stages: Vec<Range<usize>>,
    /// Each stage's items, prepared when it begins.
    prepared: Vec<OnceLock<SmallVec<[Item<'a>; 2]>>>,
    /// Stages prepared ahead (while the stage before ran its last tiles):
    /// the items, their tile count and their in-flight marks, taken by
    /// `begin_stage`.
    ahead: Vec<Mutex<Option<PreparedStage<'a>>>>,
    /// Threads that may run tiles at once (tile sizing).
    threads: u64,
    /// `max_concurrency` passed to kernels (processor ids are below it).
    concurrency: usize,
    /// The running stage's dispatches as device work in flight on their
    /// bound allocations; released when the next stage begins (every tile
    /// of the previous one has finished) or when the execution ends.
    in_flight: parking_lot::Mutex<SmallVec<[DeviceRange<'a>; 8]>>,
    /// The marks of the stage before the running one, released by the
    /// next thread that prepares a stage ahead (or when the execution
    /// ends) instead of by the stage change: each release is an atomic
    /// update of the allocation's counters, and the stage change is the
    /// one step every thread of the region waits for.
    retired: parking_lot::Mutex<SmallVec<[DeviceRange<'a>; 8]>>,
}

/// A stage's items, their tile count, and the in-flight marks of their
/// bindings.
type PreparedStage<'a> = (SmallVec<[Item<'a>; 2]>, u64, SmallVec<[DeviceRange<'a>; 8]>);

/// One command of a stage and its tiles `first_tile..first_tile + tiles`.
struct Item<'a> {
    command: usize,
    first_tile: u64,
    tiles: u64,
    dispatch: Option<PreparedDispatch<'a>>,
}

struct PreparedDispatch<'a> {
    cpu: &'a CpuExecutable,
    function: u32,
    workgroups: [u32; 3],
    total: u64,
    /// Workgroups per tile.
    per_tile: u64,
    constants: &'a [u32],
    /// Bindings; their in-flight marks are taken out when the next stage
    /// begins (see `CommandsWork::in_flight`).
    addrs: BindingAddrs<'a>,
    /// While a trace is recorded: when its first tile began and its last
    /// tile ended (trace clock), and its first failure.
    first_ns: AtomicU64,
    last_ns: AtomicU64,
    /// The sum of its tiles' times.
    tile_ns: AtomicU64,
    failure: Mutex<Option<String>>,
}

impl<'a> CommandsWork<'a> {
    fn new(
        device: &'a CpuDevice,
        commands: &'a [Command],
        table: &'a [Binding],
        threads: usize,
    ) -> CommandsWork<'a> {
        let mut stages = Vec::new();
        let mut start = 0;
        for (i, c) in commands.iter().enumerate() {
            match c {
                Command::Barrier => {
                    if i > start {
                        stages.push(start..i);
                    }
                    start = i + 1;
                }
                // A collective runs alone in its stage: a channel's
                // collectives must run in program order on every rank,
                // which commands of one stage would not.
                Command::Collective { .. } => {
                    if i > start {
                        stages.push(start..i);
                    }
                    stages.push(i..i + 1);
                    start = i + 1;
                }
                _ => {}
            }
        }
        if commands.len() > start {
            stages.push(start..commands.len());
        }
        let prepared = stages.iter().map(|_| OnceLock::new()).collect();
        let ahead = stages.iter().map(|_| Mutex::new(None)).collect();
        CommandsWork {
            device,
            commands,
            table,
            stages,
            prepared,
            ahead,
            threads: threads.max(1) as u64,
            concurrency: threads + 1,
            in_flight: parking_lot::Mutex::new(SmallVec::new()),
            retired: parking_lot::Mutex::new(SmallVec::new()),
        }
    }

    /// Prepares the items of `stage`: resolves its dispatches' bindings
    /// (their in-flight marks go to `marks`) and sizes their tiles.
    fn prepare_stage(
        &self,
        stage: usize,
        marks: &mut SmallVec<[DeviceRange<'a>; 8]>,
    ) -> Result<(SmallVec<[Item<'a>; 2]>, u64)> {
        let mut items = SmallVec::new();
        let mut tiles = 0;
        for index in self.stages[stage].clone() {
            let item = self
                .prepare(index, tiles, marks)
                .map_err(|e| e.annotate(format!("executing command {index}")))?;
            if let Some(item) = item {
                tiles += item.tiles;
                items.push(item);
            }
        }
        Ok((items, tiles))
    }

    fn prepare(
        &self,
        index: usize,
        first_tile: u64,
        marks: &mut SmallVec<[DeviceRange<'a>; 8]>,
    ) -> Result<Option<Item<'a>>> {
        let Command::Dispatch {
            executable,
            function,
            workgroups,
            indirect,
            constants,
            bindings,
        } = &self.commands[index]
        else {
            return Ok(Some(Item {
                command: index,
                first_tile,
                tiles: 1,
                dispatch: None,
            }));
        };
        let annotate = |e: Status| e.annotate(format!("dispatch of function {function}"));
        let workgroups = match indirect {
            None => *workgroups,
            Some(r) => read_workgroups(r, self.table).map_err(annotate)?,
        };
        let cpu = cpu_executable(&executable.0).map_err(annotate)?;
        let annotate = |e: Status| e.annotate(dispatch_context(cpu, *function, workgroups));
        let Some(total) = workgroups
            .iter()
            .try_fold(1u64, |n, &c| n.checked_mul(c as u64))
        else {
            return Err(annotate(Status::new(
                ferrite_base::StatusCode::OutOfRange,
                format!("workgroup count {workgroups:?} overflows a 64-bit workgroup index"),
            )));
        };
        if total == 0 {
            return Ok(None);
        }
        let mut addrs =
            BindingAddrs::resolve(cpu, *function, bindings, self.table).map_err(annotate)?;
        marks.extend(addrs.in_flight.drain(..));
        let sequential = cpu
            .library()
            .export(*function)
            .is_some_and(|e| e.sequential);
        let per_tile = if sequential || self.threads == 1 {
            total
        } else {
            total.div_ceil(self.threads * TILES_PER_THREAD)
        };
        Ok(Some(Item {
            command: index,
            first_tile,
            tiles: total.div_ceil(per_tile),
            dispatch: Some(PreparedDispatch {
                cpu,
                function: *function,
                workgroups,
                total,
                per_tile,
                constants,
                addrs,
                first_ns: AtomicU64::new(u64::MAX),
                last_ns: AtomicU64::new(0),
                tile_ns: AtomicU64::new(0),
                failure: Mutex::new(None),
            }),
        }))
    }

    /// Records each dispatch that ran as one span from its first tile's
    /// start to its last tile's end. Dispatches of one stage may overlap,
    /// so each takes the lane (a trace thread of the device) of its place
    /// in the stage.
    fn trace_dispatches(&self) {
        let track = trace::device_track(self.device.id);
        for items in self.prepared.iter().filter_map(|p| p.get()) {
            let mut lane = 0u32;
            for item in items {
                let Some(d) = &item.dispatch else {
                    continue;
                };
                let first = d.first_ns.load(Ordering::Relaxed);
                if first == u64::MAX {
                    continue;
                }
                let last = d.last_ns.load(Ordering::Relaxed);
                let outcome = match d.failure.lock().clone() {
                    Some(e) => Err(Status::new(StatusCode::Unknown, e)),
                    None => Ok(()),
                };
                let mut args = dispatch_args(d.workgroups, &d.addrs.lens, &outcome);
                args.extend(command_trace::executable_args(d.cpu, d.function));
                args.push(("command", Arg::U64(item.command as u64)));
                args.push(("tiles", Arg::U64(item.tiles)));
                args.push(("tile_ns", Arg::U64(d.tile_ns.load(Ordering::Relaxed))));
                trace::record(trace::Event {
                    phase: trace::Phase::Complete,
                    cat: "dispatch",
                    name: export_name(d.cpu, d.function),
                    ts_ns: first,
                    dur_ns: last.saturating_sub(first),
                    track,
                    thread: DISPATCH_LANES + lane,
                    args,
                });
                trace::name_thread(DISPATCH_LANES + lane, format!("dispatches (lane {lane})"));
                lane += 1;
            }
        }
    }
}

/// Trace thread numbers from here on are a `local-task` device's dispatch
/// lanes (real threads are numbered from 1 upward, far below).
const DISPATCH_LANES: u32 = 1 << 30;

impl RegionWork for CommandsWork<'_> {
    fn stage_count(&self) -> usize {
        self.stages.len()
    }

    fn prepare_ahead(&self, stage: usize) {
        // Off the barrier: the stage before the running one is over (the
        // marks are released after the lock is, which `begin_stage` takes).
        let retired = std::mem::take(&mut *self.retired.lock());
        drop(retired);
        // An indirect dispatch's workgroup count may be written by the
        // stage still running: such stages are prepared when they begin.
        let indirect = self.commands[self.stages[stage].clone()].iter().any(|c| {
            matches!(
                c,
                Command::Dispatch {
                    indirect: Some(_),
                    ..
                }
            )
        });
        if indirect {
            return;
        }
        let mut marks = SmallVec::new();
        // A failure is left for `begin_stage` to meet (and report) again.
        if let Ok((items, tiles)) = self.prepare_stage(stage, &mut marks) {
            *self.ahead[stage].lock() = Some((items, tiles, marks));
        }
    }

    fn prepared_tiles(&self, stage: usize) -> Option<u64> {
        // `begin_stage` takes this preparation when present, so it returns
        // the same count.
        self.ahead[stage]
            .lock()
            .as_ref()
            .map(|(_, tiles, _)| *tiles)
    }

    fn begin_stage(&self, stage: usize) -> Result<u64> {
        // Stages run in order: the previous one's tiles have all finished.
        let mut in_flight = self.in_flight.lock();
        let previous = std::mem::take(&mut *in_flight);
        // Marks no thread had time to release (no preparation ahead since)
        // go now, as before.
        let stale = std::mem::replace(&mut *self.retired.lock(), previous);
        drop(stale);
        let ahead = self.ahead[stage].lock().take();
        let (items, tiles) = match ahead {
            Some((items, tiles, marks)) => {
                *in_flight = marks;
                (items, tiles)
            }
            None => self.prepare_stage(stage, &mut in_flight)?,
        };
        drop(in_flight);
        if self.prepared[stage].set(items).is_err() {
            bail!(Internal, "stage {stage} of a command buffer began twice");
        }
        Ok(tiles)
    }

    fn run_tile(&self, stage: usize, tile: u64, processor_id: u32) -> Result<u64> {
        let item = self.prepared[stage].get().and_then(|items| {
            items
                .iter()
                .find(|i| (i.first_tile..i.first_tile + i.tiles).contains(&tile))
        });
        let Some(item) = item else {
            bail!(Internal, "tile {tile} of stage {stage} was never prepared");
        };
        let annotate = |e: Status| e.annotate(format!("executing command {}", item.command));
        let Some(d) = &item.dispatch else {
            self.device
                .execute_one(&self.commands[item.command], self.table)
                .map_err(annotate)?;
            return Ok(0);
        };
        let start = (tile - item.first_tile) * d.per_tile;
        let end = (start + d.per_tile).min(d.total);
        let t0 = trace::enabled().then(trace::now_ns);
        let outcome = self
            .device
            .injected_failure(d.cpu, d.function)
            .and_then(|()| {
                run_slice(
                    d.cpu,
                    d.function,
                    d.workgroups,
                    Some(start..end),
                    processor_id,
                    self.concurrency,
                    d.constants,
                    &d.addrs.ptrs,
                    &d.addrs.lens,
                )
            });
        if let Some(t0) = t0 {
            self.trace_tile(d, t0, start..end, processor_id, &outcome);
        }
        outcome
            .map_err(|e| annotate(e.annotate(dispatch_context(d.cpu, d.function, d.workgroups))))?;
        Ok(end - start)
    }
}

impl CommandsWork<'_> {
    /// Records one tile on the running thread (which worker, or which
    /// lending caller, ran which workgroups) and widens its dispatch's span.
    fn trace_tile(
        &self,
        d: &PreparedDispatch<'_>,
        t0: u64,
        range: Range<u64>,
        processor_id: u32,
        outcome: &Result<()>,
    ) {
        let t1 = trace::now_ns();
        d.first_ns.fetch_min(t0, Ordering::Relaxed);
        d.last_ns.fetch_max(t1, Ordering::Relaxed);
        d.tile_ns
            .fetch_add(t1.saturating_sub(t0), Ordering::Relaxed);
        let mut args = vec![
            ("workgroup_range", Arg::List(vec![range.start, range.end])),
            ("processor_id", Arg::U64(processor_id as u64)),
        ];
        if let Err(e) = outcome {
            d.failure.lock().get_or_insert_with(|| e.to_string());
            args.push(("failed", Arg::Str(e.to_string())));
        }
        trace::record(trace::Event {
            phase: trace::Phase::Complete,
            cat: "tile",
            name: export_name(d.cpu, d.function),
            ts_ns: t0,
            dur_ns: t1.saturating_sub(t0),
            track: trace::device_track(self.device.id),
            thread: trace::thread_id(),
            args,
        });
    }
}

/// Reads an indirect dispatch's workgroup counts (three little-endian u32).
fn read_workgroups(r: &BufferRef, table: &[Binding]) -> Result<[u32; 3]> {
    let (b, o, _) = r.resolve(table)?;
    let mut raw = [0u8; 12];
    b.device_read(o, &mut raw)?;
    let w =
        |i: usize| u32::from_le_bytes([raw[4 * i], raw[4 * i + 1], raw[4 * i + 2], raw[4 * i + 3]]);
    Ok([w(0), w(1), w(2)])
}

#[allow(clippy::too_many_arguments)]
fn run_slice(
    cpu: &CpuExecutable,
    function: u32,
    workgroups: [u32; 3],
    range: Option<std::ops::Range<u64>>,
    processor_id: u32,
    concurrency: usize,
    constants: &[u32],
    ptrs: &[*mut c_void],
    lens: &[usize],
) -> Result<()> {
    let config = DispatchConfig {
        workgroups: range,
        processor_id,
        max_concurrency: concurrency.clamp(1, 255) as u8,
        ..DispatchConfig::new(workgroups)
    };
    // SAFETY: every binding pointer comes from `Buffer::binding_ptr` or
    // `Buffer::binding_range`, which checked the range against its live
    // allocation; the allocation stays alive for the whole call (kept by the
    // `BindingPtr`s of a pooled dispatch, or by the binding table the caller
    // of an inline dispatch holds). The executable is trusted
    // compiled code; queue ordering (wait fences) keeps host access and other
    // submissions off these ranges while it runs, and concurrent slices of
    // one dispatch touch the disjoint output regions the program assigns to
    // distinct workgroups.
    unsafe {
        cpu.library()
            .dispatch_split(function, &config, constants, ptrs, lens)
    }
}

/// Matches `pattern` (with `*` wildcards) against `text`.
fn glob(pattern: &str, text: &str) -> bool {
    match pattern.split_once('*') {
        None => pattern == text,
        Some((head, rest)) => {
            let Some(tail) = text.strip_prefix(head) else {
                return false;
            };
            (0..=tail.len()).any(|i| tail.is_char_boundary(i) && glob(rest, &tail[i..]))
        }
    }
}

impl Device for CpuDevice {
    fn id(&self) -> &str {
        self.id
    }

    fn allocator(&self) -> Arc<dyn Allocator> {
        self.allocator.clone()
    }

    fn queue_allocator(&self) -> Arc<dyn Allocator> {
        self.queue_pool.clone()
    }

    fn queue_allocate(
        &self,
        params: &ferrite_hal::allocator::BufferParams,
        size: u64,
    ) -> Result<ferrite_hal::buffer::Buffer> {
        self.queue_pool.allocate(params, size)
    }

    fn query_i64(&self, category: &str, key: &str) -> Result<Option<i64>> {
        Ok(match category {
            "hal.device.id" => Some(glob(key, self.id) as i64),
            "hal.executable.format" => Some(FORMATS.iter().any(|f| glob(key, f)) as i64),
            "hal.device" if key == "concurrency" => Some(self.worker_count() as i64),
            "hal.dispatch" if key == "concurrency" => Some(self.worker_count() as i64),
            "hal.cpu" => {
                crate::cpu_features::lookup_feature(&crate::cpu_features::query_data(), key)
            }
            _ => None,
        })
    }

    fn create_executable(
        &self,
        format: &str,
        data: &[u8],
        constants: &[u32],
    ) -> Result<Arc<dyn Executable>> {
        Ok(Arc::new(CpuExecutable::load(format, data, constants)?))
    }

    fn submit(&self, wait: &Fence, signal: &Fence, work: Work) -> Result<()> {
        let id = self.id;
        let pool = match &self.mode {
            Mode::Sync => return run_inline(wait, signal, || work().map_err(|e| on_device(e, id))),
            Mode::Task(p) => p.clone(),
        };
        // Before the work can run: threads blocked on what it signals
        // may run this pool's queued work (and only those threads).
        if let Some(target) = pool.lend_target() {
            signal.signalled_by(target);
        }
        let failed = signal.clone();
        let signal = signal.clone();
        let abort = self.abort_on_failure.load(Ordering::Relaxed);
        let job: Box<dyn FnOnce() + Send> =
            Box::new(move || run_and_signal(work, &signal, abort, id));
        let timepoints = wait.timepoints();
        if timepoints.is_empty() {
            pool.spawn(job);
            return Ok(());
        }
        // Run once every timepoint is reached; the first failure fails the
        // signal fence instead.
        let pending = Arc::new(AtomicUsize::new(timepoints.len()));
        let job = Arc::new(Mutex::new(Some((job, pool, failed))));
        for (semaphore, value) in timepoints {
            let pending = pending.clone();
            let job = job.clone();
            semaphore.on_reached(
                value,
                Box::new(move |outcome| match outcome {
                    Ok(()) => {
                        if pending.fetch_sub(1, Ordering::AcqRel) == 1 {
                            if let Some((j, pool, _)) = job.lock().take() {
                                pool.spawn(j);
                            }
                        }
                    }
                    Err(e) => {
                        if let Some((_, _, signal)) = job.lock().take() {
                            signal.fail(e);
                        }
                    }
                }),
            );
        }
        Ok(())
    }

    /// On `local-task`, small work (see [`is_small`]) whose wait is already
    /// reached runs here, on the submitting thread, as on `local-sync`:
    /// queued, it would wake a worker that, on a machine whose CPUs are
    /// all busy, waits for a time slice on its CPU (a pinned worker cannot
    /// move to another) while holding the job the caller then waits for
    /// (issue 25). Small work has no parallelism to lose: every stage is
    /// one tile. Not on the pool's own workers, and not when the pool does
    /// not lend to waiters (then every submission runs on the workers).
    ///
    /// So does any work without collectives while the pool's loaded-solo
    /// rule holds ([`WorkerPool::solo_now`]: other programs keep every CPU
    /// busy and this program's tiles are short), its command buffers run
    /// one command after another ([`CpuDevice::execute_commands`]).
    fn submit_hinted(
        &self,
        wait: &Fence,
        signal: &Fence,
        hint: WorkHint<'_>,
        work: Work,
    ) -> Result<()> {
        if let Mode::Task(pool) = &self.mode {
            if pool.lends_to_waiters() && !pool.on_worker_thread() {
                let small = is_small(hint);
                // Cheap tests first: `solo_now` may read /proc/loadavg.
                let solo = !small && solo_sized(hint) && pool.solo_now();
                if (small || solo) && wait.query().unwrap_or(false) {
                    pool.note_inline_submission();
                    let abort = self.abort_on_failure.load(Ordering::Relaxed);
                    if !solo {
                        run_and_signal(work, signal, abort, self.id);
                        return Ok(());
                    }
                    let started = Instant::now();
                    {
                        let _solo = SoloGuard::enter();
                        run_and_signal(work, signal, abort, self.id);
                    }
                    pool.note_solo_run(started.elapsed());
                    return Ok(());
                }
            }
        }
        self.submit(wait, signal, work)
    }

    fn execute_commands(&self, commands: &[Command], bindings: &[Binding]) -> Result<()> {
        if let Mode::Task(pool) = &self.mode {
            // Small work (every stage one tile) has nothing to share out:
            // it runs as on local-sync, one command after another, without
            // a region's publishing, claiming and stage changes (about 1 us
            // a stage). While a trace is recorded it keeps the region path,
            // whose per-thread tiles the trace shows.
            // So does a command buffer the loaded-solo rule runs here
            // (`submit_hinted`).
            if !trace::enabled() && (SoloGuard::active() || is_small(WorkHint::Commands(commands)))
            {
                let mut workgroups = 0;
                let outcome = commands.iter().enumerate().try_for_each(|(i, c)| {
                    if let Command::Dispatch { workgroups: w, .. } = c {
                        workgroups += w.iter().map(|&n| u64::from(n)).product::<u64>();
                    }
                    self.execute_one(c, bindings)
                        .map_err(|e| e.annotate(format!("executing command {i}")))
                });
                pool.note_small_command_buffer(workgroups);
                return outcome;
            }
            let work = CommandsWork::new(self, commands, bindings, pool.worker_count());
            let outcome = pool.run_region(&work);
            if trace::enabled() {
                work.trace_dispatches();
            }
            return outcome;
        }
        for (i, c) in commands.iter().enumerate() {
            self.execute_one(c, bindings)
                .map_err(|e| e.annotate(format!("executing command {i}")))?;
        }
        Ok(())
    }

    fn as_any(&self) -> &dyn Any {
        self
    }

    fn runs_inline(&self) -> bool {
        matches!(self.mode, Mode::Sync)
    }

    fn queue_execute_borrowed(
        &self,
        this: &Arc<dyn Device>,
        wait: &Fence,
        signal: &Fence,
        command_buffer: &ferrite_hal::command_buffer::CommandBuffer,
        bindings: &[Binding],
    ) -> Result<()> {
        if !self.runs_inline() {
            return self.queue_execute(
                this,
                wait,
                signal,
                command_buffer,
                bindings.iter().cloned().collect(),
            );
        }
        // Inline: the commands run to their end inside this call, on the
        // caller's table as it is.
        ferrite_hal::device::queue::host::execute_inline(
            this,
            wait,
            signal,
            command_buffer,
            bindings,
        )
    }

    fn create_channel(
        &self,
        _queue_affinity: u64,
        params: ChannelParams,
        provider: Option<&Arc<dyn ChannelProvider>>,
    ) -> Result<ChannelRef> {
        crate::channel::create_channel(self.id, &params, provider)
    }
}

impl CpuDevice {
    fn execute_one(&self, c: &Command, table: &[Binding]) -> Result<()> {
        match c {
            Command::Barrier => Ok(()),
            Command::Collective {
                channel,
                op,
                param,
                send,
                recv,
                element_count,
            } => {
                let Some(cpu) = channel.0.as_any().downcast_ref::<CpuChannel>() else {
                    bail!(
                        InvalidArgument,
                        "collective {} on {}: the channel was not created by a CPU device",
                        op.kind.name(),
                        self.id
                    );
                };
                let send = send.as_ref().map(|r| r.resolve(table)).transpose()?;
                let recv = recv.as_ref().map(|r| r.resolve(table)).transpose()?;
                cpu.execute(*op, *param, send, recv, *element_count)
            }
            Command::Fill { target, pattern } => {
                let (b, o, l) = target.resolve(table)?;
                b.device_fill(o, l, pattern)
            }
            Command::Update { data, target } => {
                let (b, o, _) = target.resolve(table)?;
                b.device_write(o, data)
            }
            Command::Copy { source, target } => {
                let (s, so, sl) = source.resolve(table)?;
                let (t, to, _) = target.resolve(table)?;
                ferrite_hal::buffer::Buffer::device_copy(s, so, t, to, sl)
            }
            Command::Dispatch {
                executable,
                function,
                workgroups,
                indirect,
                constants,
                bindings,
            } => {
                let workgroups = match indirect {
                    None => *workgroups,
                    Some(r) => read_workgroups(r, table)?,
                };
                self.dispatch_inline(
                    &executable.0,
                    *function,
                    workgroups,
                    constants,
                    bindings,
                    table,
                )
                .map_err(|e| match cpu_executable(&executable.0) {
                    Ok(cpu) => e.annotate(dispatch_context(cpu, *function, workgroups)),
                    Err(_) => e.annotate(format!("dispatch of function {function}")),
                })
            }
        }
    }
}
