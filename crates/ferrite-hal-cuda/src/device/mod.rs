//! The CUDA device: one primary context, one queue stream on which every
//! queue operation is enqueued in submission order, a transfer stream for
//! synchronous host transfers and allocations, and a completion thread.
//! The context, its streams and pools are [`crate::context::CudaContext`];
//! the completion thread and reporting are in module `completion`;
//! enqueueing (waits, work, signals, keeping on the host) in module
//! `queue`; this module opens the device and implements the HAL's
//! `Device` on top of them.
//!
//! # Queue operations and semaphores
//!
//! A queue operation is enqueued once each of its wait timepoints is
//! either reached or signalled by earlier work on this same stream (stream
//! order covers it): then the work (kernel launches, copies, fills), then
//! two events (recorded without stalling the stream, unlike a host
//! callback) queued for the host to report (`Completions`): a plain one
//! and a `CU_EVENT_BLOCKING_SYNC` one. An operation with any other wait
//! (a semaphore the host, a CPU device, another GPU or host work signals)
//! is kept on the host until that wait is reached, and is failed without
//! running when it fails (module `deferral`): the GPU cannot skip work, so
//! a stream wait on the semaphore's word would let the work run once a
//! failure released it. The device's completion thread sleeps in
//! `cuEventSynchronize` (no spinning) on the oldest blocking one; a host
//! thread waiting on one of the device's semaphores also queries, while it
//! polls before sleeping, whether the oldest plain events are reached and
//! reports them itself (a blocking-sync event is seen reached about a
//! microsecond later). Reporting signals the semaphores on the host
//! (waking host waiters, CPU-device work and kept operations) or fails
//! them: with the CUDA error text when the stream faulted (the event wait
//! returns the error), or with a wait semaphore's failure.
//!
//! A chain of dependent submissions on this device is therefore enqueued
//! back to back without any host round trip: only the completion of each
//! is reported to the host.
//!
//! Host work ordered on the queue (`Device::submit`: io_parameters' load,
//! gather and scatter, `hal.device.queue.write`) is the exception: the
//! stream reaching it only starts the work on the host, so its signals are
//! not covered by stream order (`CudaTimeline::host_signaled`), and work
//! waiting on them is kept on the host until the host work ran. (Until
//! issue 24 such waits were skipped, and a dispatch reading freshly loaded
//! parameters ran before the host had copied them.)

use crate::completion::{Completions, InFlightResources};
use crate::context::{CudaContext, QueueOrder};
use crate::executable::CudaExecutable;
use crate::ffi::{self, CUcontext, CUdevice, CUdeviceptr, CUstream};
use crate::memory::{AllocationStats, CudaAllocator, CudaTimeline, SpareBlocks, WordPool};
use ferrite_base::{bail, status, Result};
use ferrite_hal::allocator::{Allocator, BufferParams};
use ferrite_hal::buffer::Buffer;
use ferrite_hal::channel::{ChannelParams, ChannelProvider, ChannelRef};
use ferrite_hal::command_buffer::{Binding, BindingTable, Command, CommandBuffer};
use ferrite_hal::device::{Device, Work};
use ferrite_hal::executable::Executable;
use ferrite_hal::fence::Fence;
use ferrite_hal::semaphore::DeviceTimeline;
use parking_lot::Mutex;
use std::any::Any;
use std::collections::VecDeque;
use std::ffi::c_void;
use std::sync::atomic::{AtomicU64, AtomicU8, Ordering};
use std::sync::{Arc, Weak};

pub(crate) mod deferral;

/// A CUDA device (`cuda`, `cuda://N`, `cuda://GPU-<uuid>`).
pub struct CudaDevice {
    pub(crate) id: String,
    pub(crate) shared: Arc<CudaContext>,
    pub(crate) allocator: Arc<CudaAllocator>,
    /// Serializes enqueueing so stream order is submission order, and
    /// holds what is kept on the host ([`crate::device::deferral`]).
    pub(crate) queue: Mutex<Queue>,
    /// This device, for the drain thread of kept operations.
    pub(crate) me: Weak<CudaDevice>,
    pub(crate) cc: (i32, i32),
    pub(crate) sm_count: i32,
    /// Channels created so far: the n-th channel's identifier exchange uses
    /// key n, so the n-th channel of every rank meets the others' n-th.
    pub(crate) channels_created: AtomicU64,
    /// Command buffer executions launched as CUDA graphs.
    pub(crate) graph_launches: AtomicU64,
    /// Of those, one-shot command buffers launched as their shape's graph
    /// ([`crate::graph::oneshot_shape`]).
    pub(crate) oneshot_graph_launches: AtomicU64,
    /// Whether one-shot command buffers whose shape repeats run as graphs:
    /// a [`crate::graph::OneShotGraphs`] as u8
    /// ([`crate::graph::oneshot_graphs_default`]).
    pub(crate) oneshot_graphs: AtomicU8,
    /// Graph nodes whose parameters were updated before a launch.
    pub(crate) graph_node_updates: AtomicU64,
    /// One-shot command buffer shapes seen lately, with their graphs.
    pub(crate) shapes: Mutex<crate::graph::ShapeCache>,
    /// Queue operations kept on the host for a while ([`crate::device::deferral`]).
    pub(crate) kept_on_host: AtomicU64,
}

/// A kept operation's stream work, run by the drain thread.
pub(crate) type Body = Box<dyn FnOnce(&CudaDevice, &mut InFlightResources) -> Result<()> + Send>;

/// A queue operation kept on the host.
pub(crate) struct Deferred {
    pub(crate) wait: Fence,
    pub(crate) signal: Fence,
    pub(crate) keep: InFlightResources,
    pub(crate) work: Option<Work>,
    /// Estimated stream entries of its work alone (its waits, signals and
    /// event are counted when it is enqueued:
    /// [`CudaDevice::entries`]).
    pub(crate) work_entries: u64,
    /// Taken when enqueued; still here when the device went away first.
    pub(crate) body: Option<Body>,
}

impl Drop for Deferred {
    fn drop(&mut self) {
        if self.body.is_some() {
            self.signal.fail(status!(
                Aborted,
                "the CUDA device was released before a queue operation waiting on the host was enqueued"
            ));
        }
    }
}

/// The queue's submission state, under the device's submission lock.
#[derive(Default)]
pub(crate) struct Queue {
    /// Operations kept on the host, in submission order.
    pub(crate) deferred: VecDeque<Deferred>,
    /// Estimated stream entries enqueued so far.
    entries: u64,
    /// The sequence number of the next operation enqueued (its
    /// completion carries it; reports are in this order).
    next_seq: u64,
    /// In-flight operations that enqueued a gate: (sequence number,
    /// entries enqueued before it).
    gates: VecDeque<(u64, u64)>,
    /// A drain thread is running.
    draining: bool,
}

impl CudaDevice {
    /// Opens device `ordinal` (its primary context and two streams) and
    /// starts its completion thread.
    pub fn open(ordinal: i32) -> Result<Arc<CudaDevice>> {
        let api = ffi::api()?;
        let mut dev: CUdevice = 0;
        ffi::check(
            // SAFETY: valid out-pointer.
            unsafe { (api.cuDeviceGet)(&mut dev, ordinal) },
            &format!("opening CUDA device {ordinal}"),
        )?;
        let attr = |a| -> Result<i32> {
            let mut v = 0;
            ffi::check(
                // SAFETY: valid out-pointer and device.
                unsafe { (api.cuDeviceGetAttribute)(&mut v, a, dev) },
                "cuDeviceGetAttribute",
            )?;
            Ok(v)
        };
        let cc = (
            attr(ffi::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR)?,
            attr(ffi::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR)?,
        );
        let sm_count = attr(ffi::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)?;
        let mut ctx: CUcontext = std::ptr::null_mut();
        ffi::check(
            // SAFETY: valid out-pointer and device.
            unsafe { (api.cuDevicePrimaryCtxRetain)(&mut ctx, dev) },
            "retaining the primary context",
        )?;
        // SAFETY: retained just above.
        ffi::check(unsafe { (api.cuCtxSetCurrent)(ctx) }, "cuCtxSetCurrent")?;
        let mut stream: CUstream = std::ptr::null_mut();
        let mut transfer: CUstream = std::ptr::null_mut();
        // SAFETY: valid out-pointers in the current context.
        unsafe {
            ffi::check(
                (api.cuStreamCreate)(&mut stream, ffi::CU_STREAM_NON_BLOCKING),
                "creating the queue stream",
            )?;
            ffi::check(
                (api.cuStreamCreate)(&mut transfer, ffi::CU_STREAM_NON_BLOCKING),
                "creating the transfer stream",
            )?;
        }
        // Keep freed pool memory cached (transients are reallocated on
        // every call of a program).
        let mut pool: ffi::CUmemoryPool = std::ptr::null_mut();
        // SAFETY: valid out-pointer; the threshold is passed by pointer to
        // a u64 as the attribute requires.
        unsafe {
            if (api.cuDeviceGetDefaultMemPool)(&mut pool, dev) == ffi::CUDA_SUCCESS {
                let mut threshold: u64 = u64::MAX;
                (api.cuMemPoolSetAttribute)(
                    pool,
                    ffi::CU_MEMPOOL_ATTR_RELEASE_THRESHOLD,
                    &mut threshold as *mut u64 as *mut c_void,
                );
            }
        }
        let shared = Arc::new(CudaContext {
            api,
            ctx,
            device: dev,
            ordinal,
            stream,
            transfer_stream: transfer,
            words: WordPool::new(),
            transfer_lock: Mutex::new(()),
            events: Mutex::new(Vec::new()),
            probes: Mutex::new(Vec::new()),
            spare: SpareBlocks::default(),
            pinned_spare: SpareBlocks::with_limit(crate::memory::PINNED_SPARE_MAX_BYTES),
            stats: AllocationStats::default(),
            nccl_calls: Mutex::new(()),
            completions: Arc::new(Completions::new()),
            kernel_times: crate::kernel_times::enabled()
                .then(crate::kernel_times::KernelTimes::default),
            clock: crate::profile::DeviceClock::default(),
            consumer_waits: crate::consumer::ConsumerWaits::default(),
            queue_device: std::sync::OnceLock::new(),
        });
        crate::profile::flush_on_stop(&shared);
        let completions = shared.completions.clone();
        let weak = Arc::downgrade(&shared);
        std::thread::Builder::new()
            .name(format!("ferrite-cuda{ordinal}-completion"))
            .spawn(move || crate::completion::completion_loop(completions, weak))
            .map_err(|e| {
                status!(
                    ResourceExhausted,
                    "starting the CUDA completion thread: {e}"
                )
            })?;
        Ok(Arc::new_cyclic(|me: &Weak<CudaDevice>| {
            let _ = shared.queue_device.set(me.clone() as Weak<dyn QueueOrder>);
            CudaDevice {
                id: "cuda".to_string(),
                allocator: Arc::new(CudaAllocator::new(shared.clone())),
                shared,
                queue: Mutex::new(Queue::default()),
                me: me.clone(),
                cc,
                sm_count,
                channels_created: AtomicU64::new(0),
                graph_launches: AtomicU64::new(0),
                oneshot_graph_launches: AtomicU64::new(0),
                oneshot_graphs: AtomicU8::new(crate::graph::oneshot_graphs_default() as u8),
                graph_node_updates: AtomicU64::new(0),
                shapes: Mutex::new(crate::graph::ShapeCache::default()),
                kept_on_host: AtomicU64::new(0),
            }
        }))
    }

    /// How many command buffer executions ran as CUDA graphs so far (see
    /// the `graph` module: reusable command buffers, and one-shot ones
    /// whose shape repeats).
    pub fn graph_launches(&self) -> u64 {
        self.graph_launches.load(Ordering::Relaxed)
    }

    /// How many of [`Self::graph_launches`] were one-shot command buffers
    /// launched as the graph of a shape submitted before (see
    /// [`Self::set_oneshot_graphs`]).
    pub fn oneshot_graph_launches(&self) -> u64 {
        self.oneshot_graph_launches.load(Ordering::Relaxed)
    }

    /// Runs one-shot command buffers whose shape repeats as that shape's
    /// graph, updated where needed (`on`), or on the stream, command by
    /// command (`off`), whatever their parameters do. By default a device
    /// decides per shape: a graph, unless most of the shape's first
    /// executions had to update many nodes (`FERRITE_CUDA_ONESHOT_GRAPHS=1`
    /// or `0` sets on or off for new devices): see
    /// `graph::oneshot_graphs_default` for why.
    pub fn set_oneshot_graphs(&self, on: bool) {
        let mode = if on {
            crate::graph::OneShotGraphs::On
        } else {
            crate::graph::OneShotGraphs::Off
        };
        self.oneshot_graphs.store(mode as u8, Ordering::Relaxed);
    }

    /// Lets the device decide per one-shot shape (the default unless
    /// `FERRITE_CUDA_ONESHOT_GRAPHS` is set): a graph, unless more than
    /// half of the shape's first graph executions had to update over a
    /// quarter of its nodes, after which the shape is replayed on the
    /// stream.
    pub fn set_oneshot_graphs_automatic(&self) {
        self.oneshot_graphs
            .store(crate::graph::OneShotGraphs::Auto as u8, Ordering::Relaxed);
    }

    /// The one-shot graph mode now.
    pub(crate) fn oneshot_graphs_mode(&self) -> crate::graph::OneShotGraphs {
        crate::graph::OneShotGraphs::from_u8(self.oneshot_graphs.load(Ordering::Relaxed))
    }

    /// How many graph nodes had their parameters (addresses, constants,
    /// workgroup counts, fill ranges) updated before a launch so far.
    pub fn graph_node_updates(&self) -> u64 {
        self.graph_node_updates.load(Ordering::Relaxed)
    }

    /// How many queue operations were kept on the host so far because the
    /// stream was too full behind a wait only the host can release (see
    /// the `deferral` module).
    pub fn kept_on_host(&self) -> u64 {
        self.kept_on_host.load(Ordering::Relaxed)
    }

    /// Bytes of idle pinned host blocks kept for reuse (see the `memory`
    /// module).
    pub fn idle_pinned_bytes(&self) -> u64 {
        self.shared.pinned_spare.bytes()
    }

    /// The device state (for tests and sibling modules).
    pub fn shared(&self) -> &Arc<CudaContext> {
        &self.shared
    }

    /// The device address of `[offset, ..)` of `buffer`, which must be
    /// memory of this device.
    fn device_ptr(&self, buffer: &Buffer, offset: u64) -> Result<CUdeviceptr> {
        crate::stream_encoder::device_ptr(&self.shared, buffer, offset)
    }
    /// The timeline of `sem`, attached to this device when it has none.
    pub(crate) fn timeline(&self, sem: &ferrite_hal::Semaphore) -> Result<Arc<dyn DeviceTimeline>> {
        let shared = self.shared.clone();
        sem.device_timeline(move || {
            Ok(Arc::new(CudaTimeline::new(&shared)?) as Arc<dyn DeviceTimeline>)
        })
    }
}

/// What an operation keeps alive, starting with its [`crate::profile::TracedOp`]
/// (`op` with `args`) while a trace is recorded.
fn traced(op: &'static str, args: &[(&'static str, u64)]) -> InFlightResources {
    InFlightResources {
        traced: crate::profile::traced_op(op, args),
        ..InFlightResources::default()
    }
}

/// Fills the whole of the new device buffer `b` with `byte` on `stream`.
fn fill_new(shared: &Arc<CudaContext>, b: &Buffer, byte: u8, stream: ffi::CUstream) -> Result<()> {
    if b.byte_length() == 0 {
        return Ok(());
    }
    let p = crate::stream_encoder::device_ptr(shared, b, 0)?;
    crate::stream_encoder::fill(shared, stream, p, b.byte_length(), &[byte])
}

/// The `hal.device.id` glob match (`*` and `?`).
fn glob(pattern: &str, text: &str) -> bool {
    fn go(p: &[u8], t: &[u8]) -> bool {
        match (p.first(), t.first()) {
            (None, None) => true,
            (Some(b'*'), _) => go(&p[1..], t) || (!t.is_empty() && go(p, &t[1..])),
            (Some(b'?'), Some(_)) => go(&p[1..], &t[1..]),
            (Some(a), Some(b)) if a == b => go(&p[1..], &t[1..]),
            _ => false,
        }
    }
    go(pattern.as_bytes(), text.as_bytes())
}

impl Device for CudaDevice {
    fn id(&self) -> &str {
        &self.id
    }
    fn native_queue(&self) -> Option<Arc<dyn ferrite_hal::external::NativeQueue>> {
        Some(self.shared.clone())
    }
    fn allocator(&self) -> Arc<dyn Allocator> {
        self.allocator.clone()
    }
    fn query_i64(&self, category: &str, key: &str) -> Result<Option<i64>> {
        Ok(match category {
            "hal.device.id" => Some(glob(key, &self.id) as i64),
            "hal.executable.format" => Some((key == crate::executable::FORMAT) as i64),
            "cuda.device" if key == "compute_capability_major" => Some(self.cc.0 as i64),
            "cuda.device" if key == "compute_capability_minor" => Some(self.cc.1 as i64),
            "hal.device" | "hal.dispatch" if key == "concurrency" => Some(self.sm_count as i64),
            _ => None,
        })
    }
    fn create_executable(
        &self,
        format: &str,
        data: &[u8],
        _constants: &[u32],
    ) -> Result<Arc<dyn Executable>> {
        if format != crate::executable::FORMAT {
            bail!(
                Unimplemented,
                "executable format '{format}' is not supported by the CUDA device (it loads '{}')",
                crate::executable::FORMAT
            );
        }
        Ok(Arc::new(CudaExecutable::load(&self.shared, data)?))
    }
    fn submit(&self, wait: &Fence, signal: &Fence, work: Work) -> Result<()> {
        // Host work ordered on the stream: it runs on the completion thread
        // once the stream (and so every wait) gets there.
        self.enqueue(
            wait,
            signal,
            InFlightResources::default(),
            Some(work),
            0,
            Box::new(|_, _| Ok(())),
        )
    }
    fn execute_commands(&self, commands: &[Command], bindings: &[Binding]) -> Result<()> {
        let done = Fence::new();
        let sem = ferrite_hal::Semaphore::new(0);
        done.insert(sem, 1);
        let wait = Fence::empty();
        let work_entries = commands.len() as u64;
        let mut q = self.queue.lock();
        let (defers, entries) = self.defers(&mut q, wait, &done, work_entries);
        if defers {
            let commands: Arc<[Command]> = commands.into();
            let bindings = bindings.to_vec();
            self.defer(
                &mut q,
                Deferred {
                    wait: wait.clone(),
                    signal: done.clone(),
                    keep: InFlightResources::default(),
                    work: None,
                    work_entries,
                    body: Some(Box::new(move |d, keep| {
                        d.enqueue_commands(&commands, &bindings, keep)
                    })),
                },
            );
        } else {
            self.enqueue_locked(
                &mut q,
                wait,
                &done,
                InFlightResources::default(),
                None,
                entries,
                // `commands` stay borrowed until `done` is reached below.
                |d, keep| d.enqueue_held_commands(commands, bindings, keep),
            );
        }
        drop(q);
        done.wait(ferrite_base::Timeout::INFINITE).map(|_| ())
    }
    fn as_any(&self) -> &dyn Any {
        self
    }

    fn create_channel(
        &self,
        queue_affinity: u64,
        params: ChannelParams,
        provider: Option<&Arc<dyn ChannelProvider>>,
    ) -> Result<ChannelRef> {
        // One device, one queue: any affinity naming queue 0 (or all) is it.
        if queue_affinity != u64::MAX && queue_affinity & 1 == 0 {
            bail!(
                InvalidArgument,
                "queue affinity {queue_affinity:#x} names no queue of the CUDA device (it has one, queue 0)"
            );
        }
        let n = self.channels_created.fetch_add(1, Ordering::Relaxed);
        crate::channel::create(&self.shared, params, provider, &format!("nccl/{n}"))
    }

    fn queue_alloca(
        &self,
        _this: &Arc<dyn Device>,
        wait: &Fence,
        signal: &Fence,
        params: &BufferParams,
        size: u64,
    ) -> Result<Buffer> {
        let device_local = !params
            .canonicalize()
            .memory_type
            .contains(ferrite_hal::MemoryType::HOST_VISIBLE);
        // A queue allocation's contents are undefined (as upstream), but it
        // is zeroed on the queue stream before it is handed out unless
        // FERRITE_CUDA_ALLOCA_INIT=none (see crate::diagnostics: a kernel of
        // upstream's e2e suite reads outputs it never wrote).
        let init = crate::diagnostics::alloca_init().byte();
        let mut q = self.queue.lock();
        if init.is_none()
            && device_local
            && size > 0
            && q.deferred.is_empty()
            && self.completes_at_once(wait, signal)
        {
            if let Some(b) = CudaAllocator::spare_device_buffer(&self.shared, params, size) {
                drop(q);
                if ferrite_base::trace::enabled() {
                    // Nothing is enqueued: the allocation is an instant.
                    use ferrite_base::trace::{self, Arg};
                    let track =
                        trace::device_track(&crate::profile::track_name(self.shared.ordinal));
                    let args = vec![
                        ("bytes", Arg::U64(size)),
                        ("allocation", Arg::U64(b.allocation_id())),
                    ];
                    trace::instant("queue", "alloca", track, args);
                }
                signal.signal()?;
                return Ok(b);
            }
        }
        let (defers, entries) = self.defers(&mut q, wait, signal, 1);
        if defers {
            // The buffer is returned now, so it is allocated now (on the
            // transfer stream, not ordered after the queue's work); only
            // its signal waits.
            let b = if device_local {
                let b = CudaAllocator::device_buffer(
                    &self.shared,
                    params,
                    size,
                    self.shared.transfer_stream,
                )?;
                if let Some(byte) = init {
                    fill_new(&self.shared, &b, byte, self.shared.transfer_stream)?;
                }
                self.shared.sync_transfer()?;
                b
            } else {
                self.allocator.allocate(params, size)?
            };
            self.defer(
                &mut q,
                Deferred {
                    wait: wait.clone(),
                    signal: signal.clone(),
                    keep: traced(
                        "alloca",
                        &[("bytes", size), ("allocation", b.allocation_id())],
                    ),
                    work: None,
                    work_entries: 1,
                    body: Some(Box::new(|_, _| Ok(()))),
                },
            );
            return Ok(b);
        }
        let mut out = None;
        self.enqueue_locked(
            &mut q,
            wait,
            signal,
            traced("alloca", &[("bytes", size)]),
            None,
            entries,
            |d, keep| {
                if device_local {
                    let spare = match init {
                        Some(_) if size > 0 => {
                            CudaAllocator::spare_device_buffer(&d.shared, params, size)
                        }
                        _ => None,
                    };
                    let b = match spare {
                        Some(b) => b,
                        None => {
                            CudaAllocator::device_buffer(&d.shared, params, size, d.shared.stream)?
                        }
                    };
                    if let Some(byte) = init {
                        fill_new(&d.shared, &b, byte, d.shared.stream)?;
                    }
                    // Kept until the allocation (and its fill) ran: a
                    // caller dropping the buffer at once must not make it
                    // an idle spare block while the stream still has work
                    // on it (spare blocks are handed out without ordering).
                    keep.buffers.push(b.clone());
                    out = Some(b);
                } else {
                    out = Some(d.allocator.allocate(params, size)?);
                }
                if let (Some(t), Some(b)) = (keep.traced.as_mut(), &out) {
                    let id = ferrite_base::trace::Arg::U64(b.allocation_id());
                    t.args.push(("allocation", id));
                }
                Ok(())
            },
        );
        drop(q);
        match out {
            Some(b) => Ok(b),
            None => {
                // The operation failed (the signal fence carries why); the
                // caller still needs a buffer handle to release.
                let s = signal.timepoints().iter().find_map(|(s, _)| s.failure());
                Err(s.unwrap_or_else(|| status!(Internal, "queue alloca failed")))
            }
        }
    }
    fn queue_dealloca(
        &self,
        _this: &Arc<dyn Device>,
        wait: &Fence,
        signal: &Fence,
        buffer: Buffer,
    ) -> Result<()> {
        let mut keep = traced(
            "dealloca",
            &[
                ("bytes", buffer.byte_length()),
                ("allocation", buffer.allocation_id()),
            ],
        );
        keep.buffers.push(buffer);
        self.enqueue(wait, signal, keep, None, 0, Box::new(|_, _| Ok(())))
    }
    fn queue_fill(
        &self,
        _this: &Arc<dyn Device>,
        wait: &Fence,
        signal: &Fence,
        target: Buffer,
        offset: u64,
        length: u64,
        pattern: Vec<u8>,
    ) -> Result<()> {
        let (off, len) = target.resolve_range(offset, length)?;
        let body: Body = Box::new(move |d, keep| {
            let p = d.device_ptr(&target, off)?;
            keep.buffers.push(target.clone());
            crate::stream_encoder::fill(&d.shared, d.shared.stream, p, len, &pattern)
        });
        self.enqueue(
            wait,
            signal,
            traced("fill", &[("bytes", len)]),
            None,
            1,
            body,
        )
    }
    fn queue_update(
        &self,
        _this: &Arc<dyn Device>,
        wait: &Fence,
        signal: &Fence,
        data: Vec<u8>,
        target: Buffer,
        offset: u64,
    ) -> Result<()> {
        let keep = traced("update", &[("bytes", data.len() as u64)]);
        let body: Body = Box::new(move |d, keep| {
            let p = d.device_ptr(&target, offset)?;
            ffi::check(
                // SAFETY: the range was checked by the caller; `data` is kept
                // alive until the copy completed.
                unsafe {
                    (d.shared.api.cuMemcpyHtoDAsync_v2)(
                        p,
                        data.as_ptr() as *const c_void,
                        data.len(),
                        d.shared.stream,
                    )
                },
                "enqueueing a buffer update",
            )?;
            keep.buffers.push(target.clone());
            keep.bytes.push(data);
            Ok(())
        });
        self.enqueue(wait, signal, keep, None, 1, body)
    }
    fn queue_copy(
        &self,
        _this: &Arc<dyn Device>,
        wait: &Fence,
        signal: &Fence,
        source: Buffer,
        source_offset: u64,
        target: Buffer,
        target_offset: u64,
        length: u64,
    ) -> Result<()> {
        let (_, len) = source.resolve_range(source_offset, length)?;
        let body: Body = Box::new(move |d, keep| {
            let s = d.device_ptr(&source, source_offset)?;
            let t = d.device_ptr(&target, target_offset)?;
            ffi::check(
                // SAFETY: both ranges were checked by the caller.
                unsafe { (d.shared.api.cuMemcpyAsync)(t, s, len as usize, d.shared.stream) },
                "enqueueing a buffer copy",
            )?;
            keep.buffers.push(source.clone());
            keep.buffers.push(target.clone());
            Ok(())
        });
        self.enqueue(
            wait,
            signal,
            traced("copy", &[("bytes", len)]),
            None,
            1,
            body,
        )
    }
    fn queue_barrier(&self, _this: &Arc<dyn Device>, wait: &Fence, signal: &Fence) -> Result<()> {
        self.enqueue(
            wait,
            signal,
            traced("barrier", &[]),
            None,
            0,
            Box::new(|_, _| Ok(())),
        )
    }
    fn queue_execute(
        &self,
        _this: &Arc<dyn Device>,
        wait: &Fence,
        signal: &Fence,
        cb: &CommandBuffer,
        bindings: BindingTable,
    ) -> Result<()> {
        let commands = cb.commands()?;
        // While a trace is recorded: the command buffer described the
        // first time it runs in the recording, and the execute timed.
        let keep = if ferrite_base::trace::enabled() {
            let track = crate::profile::track_name(self.shared.ordinal);
            let id = ferrite_hal::command_trace::describe(cb, &track);
            traced("execute", &[("command_buffer", id)])
        } else {
            InFlightResources::default()
        };
        let graph = crate::graph::eligible(cb, &commands);
        // A one-shot command buffer whose shape repeats runs as that
        // shape's graph (module `graph`); it needs no `cb`, so also when
        // kept on the host.
        let shape = if graph || self.oneshot_graphs_mode() == crate::graph::OneShotGraphs::Off {
            None
        } else {
            crate::graph::oneshot_shape(cb, &commands)
        };
        let mut q = self.queue.lock();
        let as_graph = graph || shape.as_ref().is_some_and(|s| self.shape_is_known(s));
        let work = if as_graph { 1 } else { commands.len() as u64 };
        let (defers, entries) = self.defers(&mut q, wait, signal, work);
        if defers {
            // Kept on the host without `cb` (borrowed): a reusable one is
            // replayed on the stream when enqueued, not launched as a
            // graph.
            let work_entries = commands.len() as u64;
            let body: Body = Box::new(move |d, keep| match &shape {
                Some(shape) => d.execute_oneshot(shape, &commands, &bindings, keep),
                None => d.enqueue_commands(&commands, &bindings, keep),
            });
            let op = Deferred {
                wait: wait.clone(),
                signal: signal.clone(),
                keep,
                work: None,
                work_entries,
                body: Some(body),
            };
            self.defer(&mut q, op);
            return Ok(());
        }
        self.enqueue_locked(&mut q, wait, signal, keep, None, entries, |d, keep| {
            if let Some(shape) = &shape {
                return d.execute_oneshot(shape, &commands, &bindings, keep);
            }
            if graph {
                for b in &bindings {
                    keep.buffers.push(b.buffer.clone());
                }
                keep.commands.push(commands.clone());
                if d.launch_graph(cb, &commands, &bindings)? {
                    return Ok(());
                }
            }
            d.enqueue_commands(&commands, &bindings, keep)
        });
        Ok(())
    }
}
