//! Stream encoding: recorded commands enqueued one by one on a CUDA stream
//! (a "replay" of the command buffer).
//!
//! Used for every command buffer that does not run as a CUDA graph
//! ([`crate::graph`]): one-shot ones, and ones holding updates, copies,
//! collectives or indirect dispatches. The queue stream replays on the
//! submitting thread; an indirect dispatch there hands itself and the
//! commands after it to a continuation ([`crate::indirect`]), which replays
//! them on its own stream and reads each workgroup count once the work
//! before it is done.

use crate::channel::{NcclChannel, Resolved};
use crate::completion::InFlightResources;
use crate::context::CudaContext;
use crate::executable::dispatch_kernel;
use crate::ffi::{self, CUdeviceptr, CUstream};
use crate::memory::CudaMemory;
use ferrite_base::{bail, Result};
use ferrite_hal::buffer::Buffer;
use ferrite_hal::channel::{Channel as _, ChannelRef, CollectiveKind};
use ferrite_hal::command_buffer::{Binding, BufferRef, Command};
use std::ffi::c_void;
use std::sync::Arc;

/// The device address of `[offset, ..)` of `buffer`, which must be memory
/// of `shared`'s device.
pub(crate) fn device_ptr(
    shared: &Arc<CudaContext>,
    buffer: &Buffer,
    offset: u64,
) -> Result<CUdeviceptr> {
    match buffer
        .device_memory()
        .and_then(|m| m.as_any().downcast_ref::<CudaMemory>())
    {
        Some(m) if m.belongs_to(shared) => Ok(m.device_ptr() + buffer.byte_offset() + offset),
        Some(_) => bail!(InvalidArgument, "buffer belongs to another CUDA device"),
        None => bail!(
            InvalidArgument,
            "buffer of {} bytes is host memory of another device; a CUDA queue operation needs memory from the CUDA device's allocator",
            buffer.byte_length()
        ),
    }
}

/// The device address of the last allocation [`Bases::ptr`] resolved: a
/// dispatch's bindings and consecutive dispatches reach the same
/// allocations again and again (activations), each of which costs two
/// virtual calls and a check to resolve in full ([`device_ptr`]).
#[derive(Default)]
struct Bases {
    /// `Buffer::allocation_id` of the allocation, 0 when none.
    id: u64,
    /// Its device address (the memory's, before any buffer offset).
    base: CUdeviceptr,
}

impl Bases {
    /// [`resolve`], through the cache. The cached allocation is alive:
    /// the caller keeps the commands and table that reach it while it
    /// replays them, so its id names no other allocation meanwhile.
    fn resolve<'a>(
        &mut self,
        shared: &Arc<CudaContext>,
        r: &'a BufferRef,
        table: &'a [Binding],
    ) -> Result<(CUdeviceptr, u64)> {
        let (b, off, len) = r.resolve(table)?;
        let id = b.allocation_id();
        if id != self.id {
            // The memory's own address: `device_ptr` of offset 0 of the
            // buffer, less the buffer's offset into its allocation.
            self.base = device_ptr(shared, b, 0)? - b.byte_offset();
            self.id = id;
        }
        Ok((self.base + b.byte_offset() + off, len))
    }
}

/// A binding reference under `table`: its buffer, device address and
/// length (range checked).
pub(crate) fn resolve<'a>(
    shared: &Arc<CudaContext>,
    r: &'a BufferRef,
    table: &'a [Binding],
) -> Result<(&'a Buffer, CUdeviceptr, u64)> {
    let (b, off, len) = r.resolve(table)?;
    Ok((b, device_ptr(shared, b, off)?, len))
}

/// What a replay does at an indirect dispatch.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) enum AtIndirect {
    /// Stop and return its index (the queue stream: a continuation takes
    /// over from there).
    Stop,
    /// Wait for the stream, read the counts and launch (a continuation's
    /// own stream, on its own thread).
    Read,
}

/// The largest grid a launch may have (CUDA's limits for every device
/// since compute capability 3.0).
const MAX_GRID: [u32; 3] = [i32::MAX as u32, 65535, 65535];

/// Reads an indirect dispatch's workgroup counts (three little-endian
/// u32) once `stream` has finished the work before it.
fn read_workgroups(
    shared: &Arc<CudaContext>,
    stream: CUstream,
    function: u32,
    r: &BufferRef,
    table: &[Binding],
) -> Result<[u32; 3]> {
    let (_, p, len) = resolve(shared, r, table)?;
    if len < 12 {
        bail!(
            OutOfRange,
            "indirect dispatch of export {function}: the workgroup count reference holds {len} bytes, 3 x u32 (12 bytes) are read"
        );
    }
    ffi::check(
        // SAFETY: a stream of this context, owned by the caller.
        unsafe { (shared.api.cuStreamSynchronize)(stream) },
        "waiting for the work before an indirect dispatch",
    )?;
    let mut counts = [0u32; 3];
    // `copy_sync` copies between unified addresses; the destination is
    // this stack array, valid for 12 bytes.
    shared.copy_sync(counts.as_mut_ptr() as CUdeviceptr, p, 12)?;
    let counts = counts.map(u32::from_le);
    if counts.iter().zip(MAX_GRID).any(|(&c, m)| c > m) {
        bail!(
            OutOfRange,
            "indirect dispatch of export {function}: workgroup count {counts:?} exceeds the CUDA grid limit {MAX_GRID:?}"
        );
    }
    Ok(counts)
}

/// Enqueues `commands` on `stream`, resolving slots through `table`.
/// Returns the index of the first indirect dispatch when `at_indirect` is
/// [`AtIndirect::Stop`] (the commands before it are enqueued), else None.
///
/// The caller keeps `commands` (which hold their direct buffers and
/// executables) and `table`'s buffers alive until the stream has passed
/// the work: the queue stream's callers put the shared commands and the
/// table in the operation's `keep` once, rather than this function taking
/// a reference per command (a decode step's 455 dispatches took about
/// 1,800 reference counts per call that way); a continuation holds its
/// commands and table while it synchronizes its own stream. `keep` gets
/// what only this function knows: collectives' channels, timings.
pub(crate) fn replay(
    shared: &Arc<CudaContext>,
    stream: CUstream,
    commands: &[Command],
    table: &[Binding],
    keep: &mut InFlightResources,
    at_indirect: AtIndirect,
) -> Result<Option<usize>> {
    let api = shared.api;
    // Launch arguments, reused across launches (the driver copies them
    // before `cuLaunchKernel` returns).
    let mut params: Vec<*mut c_void> = Vec::new();
    let mut words: Vec<u64> = Vec::new();
    let mut consts: Vec<u32> = Vec::new();
    let mut bases = Bases::default();
    // Consecutive collectives form one NCCL group (see `channel`).
    let mut batch: Vec<Resolved<'_>> = Vec::new();
    // Whether a kernel was timed (FERRITE_CUDA_KERNEL_TIMES).
    let mut timed = false;
    for (index, cmd) in commands.iter().enumerate() {
        if !matches!(cmd, Command::Collective { .. }) && !batch.is_empty() {
            crate::channel::enqueue_batch(shared, &batch)?;
            batch.clear();
        }
        match cmd {
            Command::Barrier => {}
            Command::Collective {
                channel,
                op,
                param,
                send,
                recv,
                element_count,
            } => {
                if stream != shared.stream {
                    bail!(
                        Unimplemented,
                        "a collective after an indirect dispatch in one command buffer is not supported on CUDA (collectives run on the queue stream)"
                    );
                }
                batch.push(resolve_collective(
                    shared,
                    channel,
                    *op,
                    *param,
                    send.as_ref(),
                    recv.as_ref(),
                    *element_count,
                    table,
                    keep,
                )?);
            }
            Command::Fill { target, pattern } => {
                let (_, p, len) = resolve(shared, target, table)?;
                fill(shared, stream, p, len, pattern)?;
            }
            Command::Update { data, target } => {
                let (_, p, len) = resolve(shared, target, table)?;
                let n = (len as usize).min(data.len());
                ffi::check(
                    // SAFETY: `data` holds at least `n` bytes (kept alive in
                    // the command buffer, itself kept by the caller); the
                    // target range was checked.
                    unsafe {
                        (api.cuMemcpyHtoDAsync_v2)(p, data.as_ptr() as *const c_void, n, stream)
                    },
                    "enqueueing a buffer update",
                )?;
            }
            Command::Copy { source, target } => {
                let (_, sp, len) = resolve(shared, source, table)?;
                let (_, tp, _) = resolve(shared, target, table)?;
                ffi::check(
                    // SAFETY: both ranges were checked against their buffers.
                    unsafe { (api.cuMemcpyAsync)(tp, sp, len as usize, stream) },
                    "enqueueing a buffer copy",
                )?;
            }
            Command::Dispatch {
                executable,
                function,
                workgroups,
                indirect,
                constants,
                bindings,
            } => {
                let kernel = dispatch_kernel(executable, *function, bindings, constants)?;
                let workgroups = match (indirect, at_indirect) {
                    (None, _) => *workgroups,
                    // Collectives before it were flushed at the loop's top.
                    (Some(_), AtIndirect::Stop) => return Ok(Some(index)),
                    (Some(r), AtIndirect::Read) => {
                        read_workgroups(shared, stream, *function, r, table)?
                    }
                };
                if workgroups.contains(&0) {
                    continue;
                }
                words.clear();
                let mut bytes = 0u64;
                for r in bindings.iter().take(kernel.binding_count as usize) {
                    let (p, len) = bases.resolve(shared, r, table)?;
                    words.push(p);
                    bytes += len;
                }
                consts.clear();
                consts.extend_from_slice(&constants[..kernel.constant_count as usize]);
                params.clear();
                for w in words.iter_mut() {
                    params.push(w as *mut u64 as *mut c_void);
                }
                for c in consts.iter_mut() {
                    params.push(c as *mut u32 as *mut c_void);
                }
                let [bx, by, bz] = kernel.block_dims;
                if crate::diagnostics::log_launches() {
                    crate::diagnostics::print_launch(
                        "launch",
                        &kernel.name,
                        workgroups,
                        kernel.block_dims,
                        kernel.shared_memory,
                        &words,
                        &consts,
                    );
                }
                let timing = match &shared.kernel_times {
                    Some(k) => {
                        timed = true;
                        k.begin(api, stream)?
                    }
                    None => None,
                };
                // While a trace is recorded: the kernel's span in device
                // time (`crate::profile`).
                let traced = if ferrite_base::trace::enabled() {
                    let pinned = keep.traced.as_ref().and_then(|op| op.reference.clone());
                    shared.clock.begin(shared, stream, pinned)
                } else {
                    None
                };
                ffi::check(
                    // SAFETY: the parameter array points at one u64 per
                    // binding then one u32 per push constant, the layout the
                    // compiler gives the kernel; the driver copies them
                    // before returning; the caller keeps the commands (so the
                    // executable and direct buffers) and the table alive
                    // until the stream passes this launch.
                    unsafe {
                        (api.cuLaunchKernel)(
                            kernel.function,
                            workgroups[0],
                            workgroups[1],
                            workgroups[2],
                            bx,
                            by,
                            bz,
                            kernel.shared_memory,
                            stream,
                            params.as_mut_ptr(),
                            std::ptr::null_mut(),
                        )
                    },
                    "launching a kernel",
                )?;
                if let Some(k) = &shared.kernel_times {
                    k.end(api, stream, &kernel.name, timing)?;
                }
                if let Some(t) = traced {
                    // The host's enqueue of the launch: an instant on the
                    // device's track; the launch itself: a `dispatch` span
                    // in device time once the stream has run it, with what
                    // the CPU devices record of a dispatch.
                    use ferrite_base::trace::{self, Arg};
                    let track = trace::device_track(&crate::profile::track_name(shared.ordinal));
                    let counts = Arg::List(workgroups.iter().map(|&w| w as u64).collect());
                    let mut args = vec![("workgroups", counts.clone()), ("bytes", Arg::U64(bytes))];
                    if at_indirect == AtIndirect::Stop {
                        // A continuation's commands are a suffix of the
                        // command buffer: their index there is not known
                        // here, and the bundle finds it by walking.
                        args.push(("command", Arg::U64(index as u64)));
                    }
                    args.extend(ferrite_hal::command_trace::executable_args(
                        &*executable.0,
                        *function,
                    ));
                    trace::instant(
                        "dispatch enqueue",
                        kernel.name.to_string(),
                        track,
                        vec![("workgroups", counts), ("command", Arg::U64(index as u64))],
                    );
                    if let Some(t) = t.end(
                        &shared.clock,
                        stream,
                        "dispatch",
                        kernel.name.to_string(),
                        args,
                    ) {
                        keep.timings.push(t);
                    }
                }
            }
        }
    }
    crate::channel::enqueue_batch(shared, &batch)?;
    if let (true, Some(k)) = (timed, &shared.kernel_times) {
        k.execution();
    }
    Ok(None)
}

/// Checks a collective's channel and ranges and resolves its buffers to
/// device addresses (the ranges must hold the bytes NCCL reads and
/// writes on this rank).
#[allow(clippy::too_many_arguments)]
pub(crate) fn resolve_collective<'a>(
    shared: &Arc<CudaContext>,
    channel: &'a ChannelRef,
    op: ferrite_hal::channel::CollectiveOp,
    param: u32,
    send: Option<&BufferRef>,
    recv: Option<&BufferRef>,
    element_count: u64,
    table: &[Binding],
    keep: &mut InFlightResources,
) -> Result<Resolved<'a>> {
    let name = op.kind.name();
    let Some(ch) = channel.0.as_any().downcast_ref::<NcclChannel>() else {
        bail!(
            InvalidArgument,
            "collective {name}: the channel was not created by a CUDA device"
        );
    };
    if !ch.belongs_to(shared) {
        bail!(
            InvalidArgument,
            "collective {name}: the channel belongs to another CUDA device"
        );
    }
    keep.channels.push(channel.clone());
    let n = ch.count() as u64;
    let me = ch.rank();
    let mut range = |r: Option<&BufferRef>| -> Result<(CUdeviceptr, u64)> {
        match r {
            None => Ok((0, 0)),
            Some(r) => {
                let (b, p, len) = resolve(shared, r, table)?;
                keep.buffers.push(b.clone());
                Ok((p, len))
            }
        }
    };
    let (sp, slen) = range(send)?;
    let (rp, rlen) = range(recv)?;
    let (send_elems, recv_elems, count) = match op.kind {
        CollectiveKind::AllGather => {
            let per = op.all_gather_send_count(element_count, n as u32, rlen);
            (per, per.saturating_mul(n), per)
        }
        CollectiveKind::AllReduce | CollectiveKind::AllToAll => {
            (element_count, element_count, element_count)
        }
        CollectiveKind::Broadcast => (
            if param == me { element_count } else { 0 },
            element_count,
            element_count,
        ),
        CollectiveKind::Reduce => (
            element_count,
            if param == me { element_count } else { 0 },
            element_count,
        ),
        CollectiveKind::ReduceScatter => (
            element_count.saturating_mul(n),
            element_count,
            element_count,
        ),
        CollectiveKind::Send => (element_count, 0, element_count),
        CollectiveKind::Recv => (0, element_count, element_count),
        CollectiveKind::SendRecv => {
            let send = if param & 0xffff == 0xffff {
                0
            } else {
                element_count
            };
            (send, element_count, element_count)
        }
    };
    let size = op.element_type.byte_size();
    for (what, elems, len) in [("send", send_elems, slen), ("recv", recv_elems, rlen)] {
        let need = elems.checked_mul(size);
        if need.is_none_or(|b| b > len) {
            bail!(
                OutOfRange,
                "collective {name}: the {what} range holds {len} bytes but rank {me} of {n} needs {elems} elements of {size} bytes"
            );
        }
    }
    Ok(Resolved {
        channel: ch,
        op,
        param,
        send: sp,
        recv: rp,
        element_count: count,
    })
}

/// Enqueues a fill of `[p, p+len)` with `pattern` (1, 2 or 4 bytes) on
/// `stream`.
pub(crate) fn fill(
    shared: &CudaContext,
    stream: CUstream,
    p: CUdeviceptr,
    len: u64,
    pattern: &[u8],
) -> Result<()> {
    let api = shared.api;
    let n = pattern.len();
    if !len.is_multiple_of(n as u64) {
        bail!(
            InvalidArgument,
            "fill length {len} is not a multiple of the {n}-byte pattern"
        );
    }
    let count = (len / n as u64) as usize;
    // SAFETY: the target range `[p, p+len)` was checked by the caller.
    let r = unsafe {
        match n {
            1 => (api.cuMemsetD8Async)(p, pattern[0], count, stream),
            2 => (api.cuMemsetD16Async)(
                p,
                u16::from_le_bytes([pattern[0], pattern[1]]),
                count,
                stream,
            ),
            4 => (api.cuMemsetD32Async)(
                p,
                u32::from_le_bytes([pattern[0], pattern[1], pattern[2], pattern[3]]),
                count,
                stream,
            ),
            _ => bail!(
                Unimplemented,
                "CUDA fills take 1, 2 or 4-byte patterns (got {n})"
            ),
        }
    };
    ffi::check(r, "enqueueing a buffer fill")
}
