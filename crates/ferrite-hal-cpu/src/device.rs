//! The CPU devices: `local-sync` runs every queue operation inline on the
//! caller's thread; `local-task` runs submissions on a worker pool as their
//! wait fences are reached and splits each dispatch's workgroups across the
//! workers.

use crate::cpu_executable::{CpuExecutable, FORMATS};
use crate::executable::library::DispatchConfig;
use crate::pool::WorkerPool;
use ferrite_base::{bail, Result, Status};
use ferrite_hal::allocator::{Allocator, CachingAllocator, HeapAllocator};
use ferrite_hal::buffer::BindingPtr;
use ferrite_hal::command_buffer::{Binding, BufferRef, Command};
use ferrite_hal::device::{run_inline, Device, Work};
use ferrite_hal::executable::Executable;
use ferrite_hal::fence::Fence;
use ferrite_hal::memory::MemoryAccess;
use parking_lot::Mutex;
use smallvec::SmallVec;
use std::any::Any;
use std::ffi::c_void;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

/// Workgroups a participant takes per reservation of a large dispatch.
const TILES_PER_RESERVATION: u64 = 8;

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
}

impl CpuDevice {
    /// `local-sync`: work runs inline on the calling thread.
    pub fn local_sync() -> Arc<CpuDevice> {
        Arc::new(CpuDevice {
            id: "local-sync",
            allocator: Arc::new(HeapAllocator::new()),
            queue_pool: Arc::new(CachingAllocator::new(QUEUE_POOL_BYTES)),
            mode: Mode::Sync,
        })
    }

    /// `local-task` with `workers` threads (0 = one per available core).
    pub fn local_task(workers: usize) -> Arc<CpuDevice> {
        CpuDevice::local_task_with_stack_size(workers, None)
    }

    /// `local-task` with `workers` threads (0 = one per available core) of
    /// `stack_size` bytes each (None: the platform default), as upstream's
    /// `--task_worker_stack_size`.
    pub fn local_task_with_stack_size(workers: usize, stack_size: Option<usize>) -> Arc<CpuDevice> {
        let n = if workers == 0 {
            std::thread::available_parallelism().map_or(1, |n| n.get())
        } else {
            workers
        };
        Arc::new(CpuDevice {
            id: "local-task",
            allocator: Arc::new(HeapAllocator::new()),
            queue_pool: Arc::new(CachingAllocator::new(QUEUE_POOL_BYTES)),
            mode: Mode::Task(Arc::new(WorkerPool::with_stack_size(n, stack_size))),
        })
    }

    /// Worker threads (1 for `local-sync`).
    pub fn worker_count(&self) -> usize {
        match &self.mode {
            Mode::Sync => 1,
            Mode::Task(p) => p.worker_count(),
        }
    }

    fn dispatch(
        &self,
        exe: &Arc<dyn Executable>,
        function: u32,
        workgroups: [u32; 3],
        constants: &[u32],
        bindings: &[BufferRef],
        table: &[Binding],
    ) -> Result<()> {
        let Some(cpu) = exe.as_any().downcast_ref::<CpuExecutable>() else {
            bail!(
                InvalidArgument,
                "dispatch of an executable that the CPU driver did not load"
            );
        };
        let total = workgroups.iter().map(|&c| c as u64).product::<u64>();
        if total == 0 {
            return Ok(());
        }
        let sequential = cpu.library().export(function).is_some_and(|e| e.sequential);
        let pool = match &self.mode {
            Mode::Task(p) if !sequential && total > 1 => p.clone(),
            _ => {
                // Run here, now: the caller holds every bound buffer for the
                // whole call, so plain addresses do (no keep-alive handles).
                let mut ptrs: SmallVec<[*mut c_void; 8]> = SmallVec::new();
                let mut lens: SmallVec<[usize; 8]> = SmallVec::new();
                for (i, r) in bindings.iter().enumerate() {
                    let (p, n) = r
                        .resolve(table)
                        .and_then(|(b, o, l)| b.binding_range_resolved(o, l, MemoryAccess::READ))
                        .map_err(|e| e.annotate(format!("dispatch binding {i}")))?;
                    ptrs.push(p.cast());
                    lens.push(n);
                }
                return run_slice(
                    cpu, function, workgroups, None, 0, 1, constants, &ptrs, &lens,
                );
            }
        };
        let bindings: Arc<[BindingPtr]> = bindings
            .iter()
            .enumerate()
            .map(|(i, r)| {
                r.resolve(table)
                    .and_then(|(b, o, l)| b.binding_ptr(o, l, MemoryAccess::READ))
                    .map_err(|e| e.annotate(format!("dispatch binding {i}")))
            })
            .collect::<Result<Vec<_>>>()?
            .into();
        let workers = pool.worker_count();
        let per = if total < workers as u64 * TILES_PER_RESERVATION {
            1
        } else {
            TILES_PER_RESERVATION
        };
        let chunks = total.div_ceil(per);
        let exe = exe.clone();
        let constants: Arc<[u32]> = constants.into();
        let failure: Arc<Mutex<Option<Status>>> = Arc::new(Mutex::new(None));
        let f2 = failure.clone();
        pool.parallel_for(
            chunks,
            workers,
            Arc::new(move |chunk| {
                let start = chunk * per;
                let end = (start + per).min(total);
                let Some(cpu) = exe.as_any().downcast_ref::<CpuExecutable>() else {
                    return;
                };
                let ptrs: SmallVec<[*mut c_void; 8]> =
                    bindings.iter().map(|b| b.as_ptr().cast()).collect();
                let lens: SmallVec<[usize; 8]> = bindings.iter().map(|b| b.len()).collect();
                let r = run_slice(
                    cpu,
                    function,
                    workgroups,
                    Some(start..end),
                    (chunk % workers as u64) as u32,
                    workers,
                    &constants,
                    &ptrs,
                    &lens,
                );
                if let Err(e) = r {
                    f2.lock().get_or_insert(e);
                }
            }),
        );
        let failed = failure.lock().take();
        match failed {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }
}

/// The workgroup grid of a dispatch: as recorded, or read from its
/// indirect buffer (three little-endian u32) at execution.
fn workgroup_count(
    recorded: [u32; 3],
    indirect: Option<&BufferRef>,
    table: &[Binding],
) -> Result<[u32; 3]> {
    let Some(r) = indirect else {
        return Ok(recorded);
    };
    let (b, o, _) = r.resolve(table)?;
    let mut raw = [0u8; 12];
    b.read(o, &mut raw)?;
    let w =
        |i: usize| u32::from_le_bytes([raw[4 * i], raw[4 * i + 1], raw[4 * i + 2], raw[4 * i + 3]]);
    Ok([w(0), w(1), w(2)])
}

/// One dispatch of a concurrent run, resolved for the workers: its chunks
/// are `first_chunk..first_chunk + chunks` of the run's chunk space.
struct Part {
    executable: Arc<dyn Executable>,
    function: u32,
    workgroups: [u32; 3],
    /// Workgroups per chunk; a sequential export is one chunk of all.
    per: u64,
    total: u64,
    sequential: bool,
    first_chunk: u64,
    constants: Vec<u32>,
    bindings: Vec<BindingPtr>,
    /// Index of the command in the command buffer, for error messages.
    command: usize,
}

impl CpuDevice {
    /// Runs independent dispatches (`commands`, all `Command::Dispatch`, the
    /// first at index `first` of the command buffer) as one parallel pass
    /// over all their workgroups: each dispatch is cut into chunks as
    /// [`CpuDevice::dispatch`] would cut it, and the workers take chunks of
    /// any of them.
    fn dispatch_concurrently(
        &self,
        pool: &Arc<WorkerPool>,
        commands: &[Command],
        table: &[Binding],
        first: usize,
    ) -> Result<()> {
        let workers = pool.worker_count();
        let mut parts = Vec::with_capacity(commands.len());
        let mut chunks = 0u64;
        for (k, c) in commands.iter().enumerate() {
            let Command::Dispatch {
                executable,
                function,
                workgroups,
                indirect,
                constants,
                bindings,
            } = c
            else {
                continue;
            };
            let command = first + k;
            let at = |e: Status| {
                e.annotate(format!("dispatch of function {function}"))
                    .annotate(format!("executing command {command}"))
            };
            let workgroups = workgroup_count(*workgroups, indirect.as_ref(), table).map_err(at)?;
            let Some(cpu) = executable.0.as_any().downcast_ref::<CpuExecutable>() else {
                return Err(at(Status::new(
                    ferrite_base::StatusCode::InvalidArgument,
                    "dispatch of an executable that the CPU driver did not load",
                )));
            };
            let total = workgroups.iter().map(|&c| c as u64).product::<u64>();
            if total == 0 {
                continue;
            }
            let sequential = cpu
                .library()
                .export(*function)
                .is_some_and(|e| e.sequential);
            let per = if sequential {
                total
            } else if total < workers as u64 * TILES_PER_RESERVATION {
                1
            } else {
                TILES_PER_RESERVATION
            };
            let bindings = bindings
                .iter()
                .enumerate()
                .map(|(i, r)| {
                    r.resolve(table)
                        .and_then(|(b, o, l)| b.binding_ptr(o, l, MemoryAccess::READ))
                        .map_err(|e| e.annotate(format!("dispatch binding {i}")))
                })
                .collect::<Result<Vec<_>>>()
                .map_err(at)?;
            parts.push(Part {
                executable: executable.0.clone(),
                function: *function,
                workgroups,
                per,
                total,
                sequential,
                first_chunk: chunks,
                constants: constants.clone(),
                bindings,
                command,
            });
            chunks += total.div_ceil(per);
        }
        let parts = Arc::new(parts);
        let failure: Arc<Mutex<Option<Status>>> = Arc::new(Mutex::new(None));
        let (p2, f2) = (parts.clone(), failure.clone());
        pool.parallel_for(
            chunks,
            workers,
            Arc::new(move |chunk| {
                let i = p2.partition_point(|p| p.first_chunk <= chunk) - 1;
                let p = &p2[i];
                let Some(cpu) = p.executable.as_any().downcast_ref::<CpuExecutable>() else {
                    return;
                };
                let local = chunk - p.first_chunk;
                let start = local * p.per;
                let (range, concurrency) = if p.sequential {
                    (None, 1)
                } else {
                    (Some(start..(start + p.per).min(p.total)), workers)
                };
                let ptrs: SmallVec<[*mut c_void; 8]> =
                    p.bindings.iter().map(|b| b.as_ptr().cast()).collect();
                let lens: SmallVec<[usize; 8]> = p.bindings.iter().map(|b| b.len()).collect();
                let r = run_slice(
                    cpu,
                    p.function,
                    p.workgroups,
                    range,
                    (chunk % workers as u64) as u32,
                    concurrency,
                    &p.constants,
                    &ptrs,
                    &lens,
                );
                if let Err(e) = r {
                    let e = e
                        .annotate(format!("dispatch of function {}", p.function))
                        .annotate(format!("executing command {}", p.command));
                    f2.lock().get_or_insert(e);
                }
            }),
        );
        let failed = failure.lock().take();
        match failed {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }
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
        let pool = match &self.mode {
            Mode::Sync => return run_inline(wait, signal, work),
            Mode::Task(p) => p.clone(),
        };
        let failed = signal.clone();
        let signal = signal.clone();
        let job: Box<dyn FnOnce() + Send> = Box::new(move || match work() {
            // Signalling cannot fail for fresh values; a failure here means a
            // program bug already reported through the timeline.
            Ok(()) => drop(signal.signal()),
            Err(e) => signal.fail(e),
        });
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

    fn execute_commands(&self, commands: &[Command], bindings: &[Binding]) -> Result<()> {
        let pool = match &self.mode {
            Mode::Task(p) => Some(p),
            Mode::Sync => None,
        };
        let mut i = 0;
        while i < commands.len() {
            // Dispatches with no barrier between them are independent (the
            // compiler orders dependent ones with a barrier): on local-task
            // a run of them shares one parallel pass over all their
            // workgroups, instead of one fork-join each.
            let run = commands[i..]
                .iter()
                .take_while(|c| matches!(c, Command::Dispatch { .. }))
                .count();
            if let (Some(pool), 2..) = (pool, run) {
                self.dispatch_concurrently(pool, &commands[i..i + run], bindings, i)?;
                i += run;
                continue;
            }
            self.execute_one(&commands[i], bindings)
                .map_err(|e| e.annotate(format!("executing command {i}")))?;
            i += 1;
        }
        Ok(())
    }

    fn as_any(&self) -> &dyn Any {
        self
    }

    fn runs_inline(&self) -> bool {
        matches!(self.mode, Mode::Sync)
    }
}

impl CpuDevice {
    fn execute_one(&self, c: &Command, table: &[Binding]) -> Result<()> {
        match c {
            Command::Barrier => Ok(()),
            Command::Fill { target, pattern } => {
                let (b, o, l) = target.resolve(table)?;
                b.fill(o, l, pattern)
            }
            Command::Update { data, target } => {
                let (b, o, _) = target.resolve(table)?;
                b.write(o, data)
            }
            Command::Copy { source, target } => {
                let (s, so, sl) = source.resolve(table)?;
                let (t, to, _) = target.resolve(table)?;
                ferrite_hal::buffer::Buffer::copy(s, so, t, to, sl)
            }
            Command::Dispatch {
                executable,
                function,
                workgroups,
                indirect,
                constants,
                bindings,
            } => {
                let workgroups = workgroup_count(*workgroups, indirect.as_ref(), table)?;
                self.dispatch(
                    &executable.0,
                    *function,
                    workgroups,
                    constants,
                    bindings,
                    table,
                )
                .map_err(|e| e.annotate(format!("dispatch of function {function}")))
            }
        }
    }
}
