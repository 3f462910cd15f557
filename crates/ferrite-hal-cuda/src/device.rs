//! The CUDA device: one primary context, one queue stream on which every
//! queue operation is enqueued in submission order, a transfer stream for
//! synchronous host transfers and allocations, and a completion thread.
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

use crate::deferral::{Body, Deferred, Queue};
use crate::executable::CudaExecutable;
use crate::ffi::{self, Api, CUcontext, CUdevice, CUdeviceptr, CUstream};
use crate::memory::{AllocationStats, CudaAllocator, CudaTimeline, SpareBlocks, WordPool};
use crate::replay::AtIndirect;
use ferrite_base::{bail, status, Result, Status};
use ferrite_hal::allocator::{Allocator, BufferParams};
use ferrite_hal::buffer::Buffer;
use ferrite_hal::channel::{ChannelParams, ChannelProvider, ChannelRef};
use ferrite_hal::command_buffer::{Binding, BindingTable, BufferRef, Command, CommandBuffer};
use ferrite_hal::device::{Device, Work};
use ferrite_hal::executable::Executable;
use ferrite_hal::fence::Fence;
use ferrite_hal::semaphore::DeviceTimeline;
use parking_lot::{Condvar, Mutex};
use std::any::Any;
use std::collections::VecDeque;
use std::ffi::c_void;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Weak};

/// Device state shared by the device, its memory, executables and
/// timelines (they keep the context and streams alive).
pub struct Shared {
    /// The driver API.
    pub api: &'static Api,
    pub(crate) ctx: CUcontext,
    pub(crate) device: CUdevice,
    /// The device ordinal (`cuda://N`).
    pub(crate) ordinal: i32,
    /// The queue stream.
    pub(crate) stream: CUstream,
    /// Synchronous transfers and allocations (never waits on semaphores).
    pub(crate) transfer_stream: CUstream,
    pub(crate) words: WordPool,
    /// Idle device blocks for queue allocations.
    pub(crate) spare: SpareBlocks,
    /// Idle pinned host blocks (host addresses) for host-visible
    /// allocations ([`crate::memory::PINNED_SPARE_MAX_BYTES`]).
    pub(crate) pinned_spare: SpareBlocks,
    /// Allocation statistics of every allocator of the device (device
    /// and queue allocations alike).
    pub(crate) stats: AllocationStats,
    /// Held around every NCCL call on this device's communicators after
    /// their creation (a batch of collectives, a split): NCCL requires calls
    /// on one communicator not to overlap, and a split may come from any
    /// thread while another enqueues collectives.
    pub(crate) nccl_calls: Mutex<()>,
    transfer_lock: Mutex<()>,
    /// Recorded-and-reached blocking-sync events for reuse.
    events: Mutex<Vec<ffi::CUevent>>,
    /// Recorded-and-reached plain events (probes) for reuse.
    probes: Mutex<Vec<ffi::CUevent>>,
    /// Enqueued operations whose completion the host has not seen yet.
    pub(crate) completions: Arc<Completions>,
    /// Per-kernel GPU times, with `FERRITE_CUDA_KERNEL_TIMES` set
    /// ([`crate::kernel_times`]).
    pub(crate) kernel_times: Option<crate::kernel_times::KernelTimes>,
    /// Release words foreign streams wait on ([`crate::consumer`]).
    pub(crate) consumer_waits: crate::consumer::ConsumerWaits,
    /// The device over this state, whose queue may keep operations on the
    /// host ([`Shared::order_queue_before`] orders those too). Weak: the
    /// device holds this state.
    queue_device: std::sync::OnceLock<Weak<CudaDevice>>,
}

// SAFETY: CUDA handles are usable from any thread once the context is
// current (`make_current`); the transfer stream is used under a lock and
// the queue stream under the device's submission lock.
unsafe impl Send for Shared {}
// SAFETY: see above.
unsafe impl Sync for Shared {}

impl Shared {
    /// Makes the device's context current on this thread. The driver's own
    /// notion of the current context is asked each time (a thread-local
    /// read inside the driver), not a cache of ours: another library on
    /// the same thread (PyTorch, CuPy) may have made its own context
    /// current meanwhile, and a cache would then leave ours unset while
    /// believing it set.
    pub fn make_current(&self) -> Result<()> {
        let mut current: CUcontext = std::ptr::null_mut();
        // SAFETY: a valid out-pointer.
        let r = unsafe { (self.api.cuCtxGetCurrent)(&mut current) };
        if r == ffi::CUDA_SUCCESS && current == self.ctx {
            return Ok(());
        }
        ffi::check(
            // SAFETY: `ctx` is the retained primary context.
            unsafe { (self.api.cuCtxSetCurrent)(self.ctx) },
            "cuCtxSetCurrent",
        )
    }

    /// Copies `len` bytes between unified addresses (device or host) on
    /// the transfer stream and waits for it.
    pub(crate) fn copy_sync(&self, dst: CUdeviceptr, src: CUdeviceptr, len: usize) -> Result<()> {
        if len == 0 {
            return Ok(());
        }
        self.make_current()?;
        let _g = self.transfer_lock.lock();
        ffi::check(
            // SAFETY: the caller passes ranges valid for `len` bytes (a checked
            // buffer range and a host slice); the copy completes before return.
            unsafe { (self.api.cuMemcpyAsync)(dst, src, len, self.transfer_stream) },
            "copying between host and device",
        )?;
        // SAFETY: a stream of this context.
        ffi::check(
            unsafe { (self.api.cuStreamSynchronize)(self.transfer_stream) },
            "waiting for a transfer",
        )
    }

    /// A blocking-sync event from the pool (or a new one); the context
    /// must be current.
    pub(crate) fn take_event(&self) -> Result<ffi::CUevent> {
        self.pooled_event(
            &self.events,
            ffi::CU_EVENT_BLOCKING_SYNC_NO_TIMING,
            "creating a completion event",
        )
    }

    /// Returns an event the stream has reached to the pool.
    pub(crate) fn give_event(&self, event: ffi::CUevent) {
        self.events.lock().push(event);
    }

    /// A plain event (no blocking sync, no timing) from the pool, or a new
    /// one: what polling reporters query. The context must be current.
    fn take_probe(&self) -> Result<ffi::CUevent> {
        self.pooled_event(
            &self.probes,
            ffi::CU_EVENT_DISABLE_TIMING,
            "creating a completion probe",
        )
    }

    /// An event from `pool`, or a new one made with `flags`.
    fn pooled_event(
        &self,
        pool: &Mutex<Vec<ffi::CUevent>>,
        flags: std::ffi::c_uint,
        what: &str,
    ) -> Result<ffi::CUevent> {
        if let Some(e) = pool.lock().pop() {
            return Ok(e);
        }
        let mut e: ffi::CUevent = std::ptr::null_mut();
        ffi::check(
            // SAFETY: valid out-pointer; the context is current.
            unsafe { (self.api.cuEventCreate)(&mut e, flags) },
            what,
        )?;
        Ok(e)
    }

    /// The device ordinal (`cuda://N`; DLPack's `device_id`).
    pub fn ordinal(&self) -> i32 {
        self.ordinal
    }

    /// The queue stream's handle, for a DLPack producer asked to make its
    /// data ready for this device's queue (`__dlpack__(stream=...)`).
    pub fn queue_stream_handle(&self) -> usize {
        self.stream as usize
    }

    /// Orders every queue operation submitted so far before `consumer`'s
    /// later work, without blocking the host: `consumer` waits on the GPU
    /// for an event recorded on the queue stream, and, while operations
    /// are kept on the host ([`crate::deferral`]), for a word the queue
    /// stream writes once those have been enqueued and run
    /// ([`crate::consumer`]). So a queue waiting on a semaphore the host
    /// signals later cannot deadlock this. When kept work fails (its wait
    /// failed) it never runs and the consumer is released after the work
    /// that did run; the failure is reported through the operations'
    /// semaphores. `consumer` of `None` waits on the host instead, for
    /// kept operations too.
    ///
    /// # Safety
    /// `consumer` is `CU_STREAM_LEGACY`, `CU_STREAM_PER_THREAD` or a live
    /// stream handle of this device's context (the driver dereferences
    /// it; no API can check a handle first).
    pub unsafe fn order_queue_before(&self, consumer: Option<usize>) -> Result<()> {
        let consumer = consumer.map(|s| s as CUstream);
        if let Some(device) = self.queue_device.get().and_then(Weak::upgrade) {
            // SAFETY: the caller vouches for `consumer`.
            return unsafe { device.order_before_consumer(consumer) };
        }
        // SAFETY: the queue stream is ours; the caller vouches for
        // `consumer`.
        unsafe { self.order(self.stream, consumer) }
    }

    /// Orders `producer`'s work so far before everything enqueued on the
    /// queue stream later (a GPU-side wait): used before memory a consumer
    /// used on `producer` is freed stream-ordered on the queue stream.
    ///
    /// # Safety
    /// As [`Shared::order_queue_before`], for `producer`.
    pub unsafe fn order_before_queue(&self, producer: usize) -> Result<()> {
        // SAFETY: as above.
        unsafe { self.order(producer as CUstream, Some(self.stream)) }
    }

    /// Records an event on `from` and makes `to` wait for it (the host,
    /// when `to` is `None`).
    ///
    /// # Safety
    /// Both streams are valid handles (or the legacy/per-thread constants).
    unsafe fn order(&self, from: CUstream, to: Option<CUstream>) -> Result<()> {
        self.make_current()?;
        let api = self.api;
        let mut event: ffi::CUevent = std::ptr::null_mut();
        let flags = if to.is_some() {
            ffi::CU_EVENT_DISABLE_TIMING
        } else {
            ffi::CU_EVENT_BLOCKING_SYNC_NO_TIMING
        };
        ffi::check(
            // SAFETY: valid out-pointer; the context is current.
            unsafe { (api.cuEventCreate)(&mut event, flags) },
            "creating an event",
        )?;
        // SAFETY: the event belongs to this context; the caller vouches for
        // the streams. Destroying an event whose record or wait is still
        // pending is allowed (its resources go once it is reached).
        let r = unsafe {
            let mut r = (api.cuEventRecord)(event, from);
            if r == ffi::CUDA_SUCCESS {
                r = match to {
                    Some(s) => (api.cuStreamWaitEvent)(s, event, 0),
                    None => (api.cuEventSynchronize)(event),
                };
            }
            (api.cuEventDestroy_v2)(event);
            r
        };
        ffi::check(r, "ordering work between CUDA streams")
    }

    /// Waits for the transfer stream.
    pub(crate) fn sync_transfer(&self) -> Result<()> {
        let _g = self.transfer_lock.lock();
        // SAFETY: a stream of this context.
        ffi::check(
            unsafe { (self.api.cuStreamSynchronize)(self.transfer_stream) },
            "waiting for the transfer stream",
        )
    }
}

impl Drop for Shared {
    fn drop(&mut self) {
        self.completions.close();
        if self.make_current().is_ok() {
            // Operations nobody holds a semaphore of may still be pending:
            // report them before the streams go.
            self.completions.report(self, true, true);
            for p in self.spare.drain() {
                // SAFETY: idle pool blocks of this context, freed once.
                unsafe { (self.api.cuMemFreeAsync)(p, self.stream) };
            }
            for p in self.pinned_spare.drain() {
                // SAFETY: idle cuMemHostAlloc blocks (host addresses) no
                // buffer refers to any more, freed once.
                unsafe { (self.api.cuMemFreeHost)(p as *mut c_void) };
            }
            // SAFETY: the queue stream of this context.
            unsafe { (self.api.cuStreamSynchronize)(self.stream) };
            if let Some(k) = &self.kernel_times {
                k.report(self.api, self.ordinal);
            }
            // SAFETY: the streams were created by this device and nothing
            // references them any more (everything using them holds an Arc
            // of `Shared`).
            unsafe {
                (self.api.cuStreamSynchronize)(self.stream);
                (self.api.cuStreamDestroy_v2)(self.stream);
                (self.api.cuStreamDestroy_v2)(self.transfer_stream);
                for e in self.events.get_mut().drain(..) {
                    (self.api.cuEventDestroy_v2)(e);
                }
                for e in self.probes.get_mut().drain(..) {
                    (self.api.cuEventDestroy_v2)(e);
                }
            }
            // Consumers still waiting on release words are released (and
            // waited for) before the words are freed.
            self.consumer_waits.release(self.api);
            self.words.release(self.api);
            // SAFETY: retained when the device was opened; released once.
            unsafe {
                (self.api.cuDevicePrimaryCtxRelease_v2)(self.device);
            }
        }
    }
}

/// What the host does once the stream reaches an enqueued operation's
/// event.
struct Completion {
    /// Recorded after the work (blocking sync: the completion thread
    /// sleeps on it); returned to the pool once reached.
    event: ffi::CUevent,
    /// A plain event recorded just before `event`, which polling reporters
    /// query: a blocking-sync event's completion reached a polling host
    /// about a microsecond later on an H100 (see the GPU test
    /// `submit_then_wait_latency_against_the_driver_alone`).
    probe: ffi::CUevent,
    /// Its place in stream order (see [`crate::deferral::Queue`]).
    seq: u64,
    signal: Fence,
    waits: Fence,
    /// Resources the enqueued work uses, released after it.
    keep: Keep,
    /// Host work to run after the stream work (for `submit`).
    work: Option<Work>,
}

/// Resources kept alive until the work using them completes.
#[derive(Default)]
pub(crate) struct Keep {
    pub(crate) buffers: Vec<Buffer>,
    pub(crate) executables: Vec<Arc<dyn Executable>>,
    pub(crate) bytes: Vec<Vec<u8>>,
    /// Channels of enqueued collectives (their communicators must outlive
    /// the NCCL kernels).
    pub(crate) channels: Vec<ChannelRef>,
    /// Commands launched as a graph or run by an indirect dispatch's
    /// continuation (their direct buffers and executables must outlive the
    /// work, even when the command buffer goes first).
    pub(crate) commands: Vec<Arc<[Command]>>,
    /// Gate words the queue stream waits on for a continuation.
    pub(crate) gates: Vec<Arc<CudaTimeline>>,
    /// Continuations' outcomes: a failure there fails the operation.
    pub(crate) outcomes: Vec<crate::indirect::Outcome>,
}

// SAFETY: the event handle is only synchronized/queried (thread-safe driver
// calls) and returned to the pool by whichever thread reports the
// completion, with the device's context current; everything else in a
// completion is Send.
unsafe impl Send for Completion {}

/// The queue stream's operations whose completion the host has not seen
/// yet, in stream order.
///
/// Two kinds of thread report them, always in order (under `reporting`):
/// the device's completion thread, which sleeps in `cuEventSynchronize`
/// (a blocking-sync event: no spinning) on the oldest one; and a host
/// thread waiting on a semaphore this device signals, which during its
/// bounded polling window ([`ferrite_base::wait::SPIN`]) asks the driver,
/// without blocking, whether the oldest operations are done
/// ([`DeviceTimeline::poll`](ferrite_hal::semaphore::DeviceTimeline::poll))
/// and reports those itself. A waiter thus sees a short GPU operation
/// finish within microseconds instead of after the completion thread's
/// wake-up from an interrupt-driven event wait plus a second thread
/// hand-off.
pub(crate) struct Completions {
    pending: Mutex<VecDeque<Completion>>,
    arrived: Condvar,
    /// Held while reporting, so reports keep stream order.
    reporting: Mutex<()>,
    /// The event the completion thread sleeps on, and whether another
    /// thread reported it meanwhile: such an event goes back to the pool
    /// only when the thread's wait returns, so it is never re-recorded for
    /// later work while the thread waits on it (the thread would then sleep
    /// until that later work, which may wait on a host signal that depends
    /// on the reports in between).
    watched: Mutex<(Option<EventHandle>, bool)>,
    /// Operations were queued without waking the completion thread (see
    /// `push`).
    unwatched: AtomicBool,
    closed: AtomicBool,
    /// One past the sequence number of the last operation reported.
    reported: AtomicU64,
    /// Notified (under `pending`) when operations are reported, for the
    /// drain thread of kept operations ([`crate::deferral`]).
    progressed: Condvar,
}

/// A `CUevent` compared by handle.
#[derive(Clone, Copy, PartialEq, Eq)]
struct EventHandle(ffi::CUevent);

// SAFETY: an opaque driver handle; the driver's event calls are
// thread-safe.
unsafe impl Send for EventHandle {}

impl Completions {
    fn new() -> Completions {
        Completions {
            pending: Mutex::new(VecDeque::new()),
            arrived: Condvar::new(),
            reporting: Mutex::new(()),
            watched: Mutex::new((None, false)),
            unwatched: AtomicBool::new(false),
            closed: AtomicBool::new(false),
            reported: AtomicU64::new(0),
            progressed: Condvar::new(),
        }
    }

    /// Queues a completion. The completion thread is woken only when
    /// someone waits without polling: a thread asleep on, a waiter
    /// subscribed to, or a callback registered on one of the signalled
    /// semaphores, or host work to run. Otherwise the wake-up (a system
    /// call on the submitting thread) is deferred until such a waiter
    /// appears ([`Completions::watch`], through
    /// [`DeviceTimeline::watch`](ferrite_hal::semaphore::DeviceTimeline::watch))
    /// or another completion is queued; until then polling waiters and
    /// `query` report it. A chain of submit-then-wait calls thus wakes the
    /// thread at most every [`UNWATCHED_REPORT_DELAY`], when the thread
    /// looks for work queued unwatched (whose report releases what it
    /// keeps even when nobody ever waits on it).
    fn push(&self, c: Completion, shared: &Arc<Shared>) {
        // Host work must run; a semaphore whose timeline is not this
        // device's would tell another device when a waiter appears.
        let wake_now = c.work.is_some()
            || c.signal.timepoints().iter().any(|(s, _)| {
                !s.attached_timeline()
                    .and_then(|t| t.as_any().downcast_ref::<CudaTimeline>())
                    .is_some_and(|t| Arc::ptr_eq(&t.shared, shared))
            });
        let signal = c.signal.clone();
        self.pending.lock().push_back(c);
        // Set before looking for sleepers; a sleeper registers before it
        // calls `watch`, which clears this: one of the two sides wakes the
        // thread.
        self.unwatched.store(true, Ordering::SeqCst);
        if wake_now || signal.timepoints().iter().any(|(s, _)| s.has_sleepers()) {
            self.wake();
        }
    }

    /// Wakes the completion thread if completions were queued unwatched.
    fn wake(&self) {
        if self.unwatched.swap(false, Ordering::SeqCst) {
            let _q = self.pending.lock();
            self.arrived.notify_one();
        }
    }

    /// A waiter that does not poll appeared: the completion thread must
    /// report from now on.
    pub(crate) fn watch(&self) {
        self.wake();
    }

    fn close(&self) {
        self.closed.store(true, Ordering::Release);
        let _q = self.pending.lock();
        self.arrived.notify_all();
    }

    /// Reports pending operations whose events the stream has reached, in
    /// order, stopping at the first one not reached. With `block`, the
    /// oldest is waited for (sleeping) first; with `all`, every one is.
    fn report(&self, shared: &Shared, block: bool, all: bool) {
        let _order = self.reporting.lock();
        self.report_locked(shared, block, all);
    }

    fn report_locked(&self, shared: &Shared, mut block: bool, all: bool) {
        loop {
            let Some((event, probe)) = self.pending.lock().front().map(|c| (c.event, c.probe))
            else {
                return;
            };
            // SAFETY: events of this context, recorded on its queue
            // stream; only reporters (serialized by `reporting`) return
            // them to the pools, so they are not re-recorded before this
            // call.
            let status = unsafe {
                if block || all {
                    (shared.api.cuEventSynchronize)(event)
                } else {
                    (shared.api.cuEventQuery)(probe)
                }
            };
            if status == ffi::CUDA_ERROR_NOT_READY {
                return;
            }
            block = false;
            let Some(c) = self.pop_reported() else {
                return;
            };
            self.recycle(shared, c.event);
            // Reached (or the stream failed): nobody waits on a probe.
            shared.probes.lock().push(c.probe);
            complete(c, status);
        }
    }

    /// Takes the oldest operation to report it.
    fn pop_reported(&self) -> Option<Completion> {
        let mut q = self.pending.lock();
        let c = q.pop_front()?;
        self.reported.store(c.seq + 1, Ordering::Release);
        self.progressed.notify_all();
        Some(c)
    }

    /// One past the sequence number of the last operation reported.
    pub(crate) fn reported(&self) -> u64 {
        self.reported.load(Ordering::Acquire)
    }

    /// Sleeps until operation `seq` is reported, at most `timeout`.
    pub(crate) fn wait_reported(&self, seq: u64, timeout: std::time::Duration) {
        let mut q = self.pending.lock();
        if self.reported() <= seq {
            self.progressed.wait_for(&mut q, timeout);
        }
    }

    /// Returns a reported operation's event to the pool, or leaves that to
    /// the completion thread when it is sleeping on it.
    fn recycle(&self, shared: &Shared, event: ffi::CUevent) {
        {
            let mut w = self.watched.lock();
            if w.0 == Some(EventHandle(event)) {
                w.1 = true;
                return;
            }
        }
        shared.events.lock().push(event);
    }

    /// For a polling host waiter: reports what is already done, unless
    /// another thread is reporting (then that thread will).
    pub(crate) fn poll(&self, shared: &Shared) {
        if self.pending.lock().is_empty() {
            return;
        }
        let Some(_order) = self.reporting.try_lock() else {
            return;
        };
        if shared.make_current().is_ok() {
            self.report_locked(shared, false, false);
        }
    }
}

/// How long operations queued without waking the completion thread may go
/// unreported when nobody waits on them (see [`Completions::push`]).
const UNWATCHED_REPORT_DELAY: std::time::Duration = std::time::Duration::from_millis(50);

/// The completion thread's loop: sleep until operations are pending, then
/// in `cuEventSynchronize` on the oldest (holding the device only for that
/// wait, so dropping the device ends the loop), and report.
fn completion_loop(completions: Arc<Completions>, shared: Weak<Shared>) {
    loop {
        let event = {
            let mut q = completions.pending.lock();
            loop {
                if let Some(c) = q.front() {
                    // Under the queue lock: a reporter pops (and then
                    // recycles) the oldest only after this is recorded, or
                    // before it is read.
                    *completions.watched.lock() = (Some(EventHandle(c.event)), false);
                    break c.event;
                }
                if completions.closed.load(Ordering::Acquire) {
                    return;
                }
                // Bounded: operations queued unwatched (nobody waits on
                // them, e.g. the work of a dropped call) are reported
                // within this time even if no waiter ever appears, so
                // what they keep (buffers) is released.
                completions.arrived.wait_for(&mut q, UNWATCHED_REPORT_DELAY);
            }
        };
        let Some(shared) = shared.upgrade() else {
            return;
        };
        if shared.make_current().is_err() {
            let _order = completions.reporting.lock();
            while let Some(c) = completions.pop_reported() {
                c.signal.fail(status!(Internal, "CUDA context lost"));
            }
            continue;
        }
        // Sleep until the oldest is reached without holding `reporting`,
        // so a polling waiter can report meanwhile (it then leaves the
        // event to this thread: `watched`).
        // SAFETY: an event of this context, not re-recorded during this
        // wait (`watched`); events are destroyed only when `Shared` drops,
        // and this thread holds it.
        let _ = unsafe { (shared.api.cuEventSynchronize)(event) };
        let (_, reported) = std::mem::take(&mut *completions.watched.lock());
        if reported {
            shared.events.lock().push(event);
        }
        completions.report(&shared, false, false);
    }
}

/// Reports one operation: signals or fails its semaphores with the
/// event's `status`.
fn complete(c: Completion, status: ffi::CUresult) {
    let Completion {
        event: _,
        probe: _,
        seq: _,
        signal,
        waits,
        keep,
        work,
    } = c;
    let outcome: Result<()> = if status != ffi::CUDA_SUCCESS {
        Err(Status::new(
            ferrite_base::StatusCode::Internal,
            format!("CUDA device failed: {}", ffi::error_name(status)),
        ))
    } else if let Some(e) = waits.timepoints().iter().find_map(|(s, _)| s.failure()) {
        Err(e)
    } else if let Some(e) = keep.outcomes.iter().find_map(|o| o.lock().take()) {
        Err(e)
    } else if let Some(work) = work {
        work()
    } else {
        Ok(())
    };
    drop(keep);
    match outcome {
        Ok(()) => {
            let _ = signal.signal();
        }
        Err(e) => signal.fail(e),
    }
}

/// A CUDA device (`cuda`, `cuda://N`, `cuda://GPU-<uuid>`).
pub struct CudaDevice {
    id: String,
    shared: Arc<Shared>,
    allocator: Arc<CudaAllocator>,
    /// Serializes enqueueing so stream order is submission order, and
    /// holds what is kept on the host ([`crate::deferral`]).
    pub(crate) queue: Mutex<Queue>,
    /// This device, for the drain thread of kept operations.
    me: Weak<CudaDevice>,
    cc: (i32, i32),
    sm_count: i32,
    /// Channels created so far: the n-th channel's identifier exchange uses
    /// key n, so the n-th channel of every rank meets the others' n-th.
    channels_created: AtomicU64,
    /// Command buffer executions launched as CUDA graphs.
    pub(crate) graph_launches: AtomicU64,
    /// Of those, one-shot command buffers launched as their shape's graph
    /// ([`crate::graph::oneshot_shape`]).
    pub(crate) oneshot_graph_launches: AtomicU64,
    /// Graph nodes whose parameters were updated before a launch.
    pub(crate) graph_node_updates: AtomicU64,
    /// One-shot command buffer shapes seen lately, with their graphs.
    pub(crate) shapes: Mutex<crate::graph::ShapeCache>,
    /// Queue operations kept on the host for a while ([`crate::deferral`]).
    kept_on_host: AtomicU64,
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
        let shared = Arc::new(Shared {
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
            consumer_waits: crate::consumer::ConsumerWaits::default(),
            queue_device: std::sync::OnceLock::new(),
        });
        let completions = shared.completions.clone();
        let weak = Arc::downgrade(&shared);
        std::thread::Builder::new()
            .name(format!("ferrite-cuda{ordinal}-completion"))
            .spawn(move || completion_loop(completions, weak))
            .map_err(|e| {
                status!(
                    ResourceExhausted,
                    "starting the CUDA completion thread: {e}"
                )
            })?;
        Ok(Arc::new_cyclic(|me| {
            let _ = shared.queue_device.set(me.clone());
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
    /// launched as the graph of a shape submitted before
    /// (`FERRITE_CUDA_ONESHOT_GRAPHS=0` turns that off).
    pub fn oneshot_graph_launches(&self) -> u64 {
        self.oneshot_graph_launches.load(Ordering::Relaxed)
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
    pub fn shared(&self) -> &Arc<Shared> {
        &self.shared
    }

    /// Wraps `len` bytes of device memory at `dptr` that someone else
    /// allocated (a DLPack producer's tensor) as a device-local buffer of
    /// this device, without copying. The pointer is checked first with
    /// `cuPointerGetAttribute`: it must be device (or managed) memory of
    /// this device's ordinal and context, and the range must lie inside one
    /// allocation; otherwise INVALID_ARGUMENT / OUT_OF_RANGE naming what
    /// was expected and what was found.
    ///
    /// `owner` is dropped exactly once: when the last buffer using the
    /// memory is dropped, or before an error is returned. Its drop is the
    /// release (e.g. the producer's DLPack deleter). Queue operations keep
    /// their buffers until they complete, so the release follows all queue
    /// work using the memory.
    ///
    /// # Safety
    /// `[dptr, dptr + len)` must stay valid device memory of this device's
    /// context, not freed or reused by anyone, until `owner` is dropped.
    /// Writes by others while queue work uses the memory are the caller's
    /// to order (the DLPack `stream` protocol).
    pub unsafe fn import_device_memory(
        &self,
        dptr: CUdeviceptr,
        len: u64,
        usage: ferrite_hal::BufferUsage,
        access: ferrite_hal::MemoryAccess,
        owner: Box<dyn Send + Sync>,
    ) -> Result<Buffer> {
        // SAFETY: the caller's contract is the function's.
        unsafe { crate::memory::external_buffer(&self.shared, dptr, len, usage, access, owner) }
    }

    /// The device address of `[offset, ..)` of `buffer`, which must be
    /// memory of this device.
    fn device_ptr(&self, buffer: &Buffer, offset: u64) -> Result<CUdeviceptr> {
        crate::replay::device_ptr(&self.shared, buffer, offset)
    }
    /// The timeline of `sem`, attached to this device when it has none.
    fn timeline(&self, sem: &ferrite_hal::Semaphore) -> Result<Arc<dyn DeviceTimeline>> {
        let shared = self.shared.clone();
        sem.device_timeline(move || {
            Ok(Arc::new(CudaTimeline::new(&shared)?) as Arc<dyn DeviceTimeline>)
        })
    }

    /// Enqueues one queue operation (see the module docs) now, or keeps it
    /// on the host ([`crate::deferral`]) when the stream is too full
    /// behind a gate; `entries` estimates its stream entries besides its
    /// waits, signals and completion event.
    fn enqueue(
        &self,
        wait: &Fence,
        signal: &Fence,
        keep: Keep,
        work: Option<Work>,
        entries: u64,
        body: Body,
    ) -> Result<()> {
        let mut q = self.queue.lock();
        let work_entries = entries;
        let (defers, entries) = self.defers(&mut q, wait, signal, work_entries);
        if defers {
            self.defer(
                &mut q,
                Deferred {
                    wait: wait.clone(),
                    signal: signal.clone(),
                    keep,
                    work,
                    work_entries,
                    body: Some(body),
                },
            );
        } else {
            self.enqueue_locked(&mut q, wait, signal, keep, work, entries, body);
        }
        Ok(())
    }

    /// The stream entries of an operation waiting on `wait`, signalling
    /// `signal`, with `work` entries of work (its signals and completion
    /// event besides), and whether it must wait on the host: a wait
    /// timepoint neither reached (or failed) nor signalled by earlier work
    /// on this stream.
    ///
    /// Such an operation is never enqueued behind a stream wait on the
    /// semaphore's word: the GPU cannot skip work, so a wait released by a
    /// failure would let the work run. It is kept on the host until its
    /// waits are reached, then enqueued, or failed with the wait's status
    /// without running ([`crate::deferral`]), as upstream's driver does.
    pub(crate) fn entries(&self, wait: &Fence, signal: &Fence, work: u64) -> (u64, bool) {
        let waits_on_host = wait.timepoints().iter().any(|(sem, value)| {
            if sem.query().map_or(true, |v| v >= *value) {
                return false;
            }
            !sem.attached_timeline()
                .and_then(|t| t.as_any().downcast_ref::<CudaTimeline>())
                .is_some_and(|t| {
                    Arc::ptr_eq(&t.shared, &self.shared)
                        && t.stream_signaled.load(Ordering::Acquire) >= *value
                })
        });
        (work + signal.timepoints().len() as u64 + 1, waits_on_host)
    }

    /// Whether an operation (see [`Self::entries`]) must be kept on the
    /// host ([`crate::deferral`]), and its stream entries.
    fn defers(&self, q: &mut Queue, wait: &Fence, signal: &Fence, work: u64) -> (bool, u64) {
        let (entries, waits_on_host) = self.entries(wait, signal, work);
        let defers = waits_on_host
            || !q.deferred.is_empty()
            || !q.fits(self.shared.completions.reported(), entries);
        (defers, entries)
    }

    /// Keeps `op` on the host until the drain thread enqueues it.
    fn defer(&self, q: &mut Queue, op: Deferred) {
        self.kept_on_host.fetch_add(1, Ordering::Relaxed);
        self.hold(q, op);
    }

    /// Orders every queue operation submitted so far before `consumer`
    /// (see [`Shared::order_queue_before`]): operations kept on the host
    /// get a marker behind them that releases the consumer once the queue
    /// stream has run them.
    ///
    /// # Safety
    /// As [`Shared::order_queue_before`].
    unsafe fn order_before_consumer(&self, consumer: Option<CUstream>) -> Result<()> {
        self.shared.make_current()?;
        let mut q = self.queue.lock();
        if q.deferred.is_empty() {
            drop(q);
            // SAFETY: the queue stream is ours; the caller vouches for
            // `consumer`.
            return unsafe { self.shared.order(self.shared.stream, consumer) };
        }
        // The marker has no waits, so it is enqueued right after the last
        // operation kept now, also when some of them fail; it signals
        // nothing but `signal`.
        let marker = |signal: Fence, body: Body| Deferred {
            wait: Fence::new(),
            signal,
            keep: Keep::default(),
            work: None,
            work_entries: 1,
            body: Some(body),
        };
        match consumer {
            Some(stream) => {
                // SAFETY: the context is current; the caller vouches for
                // `stream`.
                let release = unsafe { self.shared.consumer_waits.add(&self.shared, stream) }?;
                // Dropped unrun (the device released first), the release
                // writes the word from the host.
                let body: Body = Box::new(move |d, _| release.enqueue(d.shared.stream));
                self.hold(&mut q, marker(Fence::new(), body));
                Ok(())
            }
            None => {
                // Its report comes after every earlier operation's (reports
                // keep stream order) and after the stream reached it.
                let reached = ferrite_hal::Semaphore::new(0);
                let body: Body = Box::new(|_, _| Ok(()));
                self.hold(&mut q, marker(Fence::create_at(reached.clone(), 1), body));
                drop(q);
                reached.wait(1, ferrite_base::Timeout::INFINITE)
            }
        }
    }

    /// Keeps `op` (a queue operation or a marker) on the host, in order
    /// behind what is kept already, and makes sure a drain thread runs.
    fn hold(&self, q: &mut Queue, op: Deferred) {
        q.deferred.push_back(op);
        // The gates' operations must be reported for the drain to go on,
        // also when nobody waits on them.
        self.shared.completions.watch();
        if q.start_draining() {
            let me = self.me.clone();
            let started = std::thread::Builder::new()
                .name(format!("ferrite-cuda{}-deferred", self.shared.ordinal))
                .spawn(move || crate::deferral::drain(me));
            if let Err(e) = started {
                // Nothing would enqueue them: fail what is kept.
                let e = status!(
                    ResourceExhausted,
                    "starting the thread for queue operations waiting on the host: {e}"
                );
                for mut op in q.deferred.drain(..) {
                    op.body = None;
                    op.signal.fail(e.clone());
                }
                q.stop_draining();
            }
        }
    }

    /// Enqueues a kept operation (the drain thread).
    pub(crate) fn enqueue_deferred(&self, q: &mut Queue, mut op: Deferred) {
        let Some(body) = op.body.take() else {
            return;
        };
        let keep = std::mem::take(&mut op.keep);
        let work = op.work.take();
        let (entries, _) = self.entries(&op.wait, &op.signal, op.work_entries);
        self.enqueue_locked(q, &op.wait, &op.signal, keep, work, entries, body);
    }

    /// Enqueues one queue operation on the stream: waits, `body`, signal
    /// writes, completion event. `body` failing fails `signal`.
    #[allow(clippy::too_many_arguments)]
    fn enqueue_locked(
        &self,
        q: &mut Queue,
        wait: &Fence,
        signal: &Fence,
        mut keep: Keep,
        work: Option<Work>,
        entries: u64,
        body: impl FnOnce(&Self, &mut Keep) -> Result<()>,
    ) {
        let mut gated = false;
        // Host work runs only once the stream has reached the operation
        // (on the completion thread or a polling waiter), so its signals
        // are not reached by stream order: later work on this stream that
        // waits on them is kept on the host until the report.
        let host_work = work.is_some();
        let log = crate::diagnostics::log_queue();
        let mut logged: Vec<String> = Vec::new();
        let outcome = (|| -> Result<()> {
            self.shared.make_current()?;
            for (sem, value) in wait.timepoints() {
                match sem.query() {
                    Ok(v) if v >= value => {
                        if log {
                            logged.push(format!("wait >= {value}: reached"));
                        }
                        continue;
                    }
                    Ok(_) => {}
                    Err(e) => return Err(e),
                }
                // Not reached: enqueued only when earlier work on this
                // stream signals it (the operation is kept on the host
                // until then otherwise, see `defers`), so stream order
                // covers it and a failure of that work is known before
                // this operation's report (a failed stream faults every
                // later operation).
                let covered = sem
                    .attached_timeline()
                    .and_then(|t| {
                        t.as_any().downcast_ref::<CudaTimeline>().map(|ct| {
                            Arc::ptr_eq(&ct.shared, &self.shared)
                                && ct.stream_signaled.load(Ordering::Acquire) >= value
                        })
                    })
                    .unwrap_or(false);
                if !covered {
                    bail!(
                        Internal,
                        "queue operation enqueued before its wait (>= {value}) was reached"
                    );
                }
                if log {
                    logged.push(format!("wait >= {value}: stream order"));
                }
            }
            body(self, &mut keep)?;
            // Whether the stream passing this operation reaches its
            // signals: not for host work, and not for work a
            // continuation finishes (an indirect dispatch's gate), whose
            // outcome is known only when it is reported.
            let reached_by_stream = !host_work && keep.gates.is_empty();
            for (sem, value) in signal.timepoints() {
                let t = self.timeline(&sem)?;
                let Some(ct) = t.as_any().downcast_ref::<CudaTimeline>() else {
                    continue;
                };
                if !Arc::ptr_eq(&ct.shared, &self.shared) {
                    continue;
                }
                if !reached_by_stream {
                    // Reached when reported (the host work ran, the
                    // continuation succeeded): later work waiting on it
                    // is kept on the host until then.
                    ct.host_signaled.fetch_max(value, Ordering::AcqRel);
                    if log {
                        logged.push(format!("signal {value}: when reported"));
                    }
                    continue;
                }
                // Host waiters and other devices see the value when the
                // operation is reported.
                ct.stream_signaled.fetch_max(value, Ordering::AcqRel);
                if log {
                    logged.push(format!("signal {value}: in stream order"));
                }
            }
            Ok(())
        })();
        // A continuation's gate word is a gate too.
        gated |= !keep.gates.is_empty();
        if let Err(e) = outcome {
            if !gated {
                signal.fail(e);
                return;
            }
            // A wait is in the stream already: the operation completes
            // (failing) once the stream passes it, so the gate is counted
            // and later work keeps its order.
            keep.outcomes.push(Arc::new(Mutex::new(Some(e))));
        }
        let (event, probe) = match self.event().and_then(|e| match self.shared.take_probe() {
            Ok(p) => Ok((e, p)),
            Err(err) => {
                self.shared.give_event(e);
                Err(err)
            }
        }) {
            Ok(pair) => pair,
            Err(e) => {
                signal.fail(e);
                return;
            }
        };
        let api = self.shared.api;
        // SAFETY: events of this context, recorded on its queue stream;
        // neither is pending (fresh or reached).
        let r = unsafe {
            match (api.cuEventRecord)(probe, self.shared.stream) {
                ffi::CUDA_SUCCESS => (api.cuEventRecord)(event, self.shared.stream),
                r => r,
            }
        };
        if r != ffi::CUDA_SUCCESS {
            // Possibly recorded: destroyed (deferred by the driver until
            // reached) rather than re-recorded from the pools.
            // SAFETY: events of this context, not used after this.
            unsafe {
                (api.cuEventDestroy_v2)(probe);
                (api.cuEventDestroy_v2)(event);
            }
            signal.fail(ffi::to_status(r, "recording a completion event"));
            return;
        }
        let seq = q.enqueued(entries, gated);
        if log {
            eprintln!(
                "cuda queue op {seq}{}: {}",
                if host_work { " (host work)" } else { "" },
                logged.join(", ")
            );
        }
        self.shared.completions.push(
            Completion {
                event,
                probe,
                seq,
                signal: signal.clone(),
                waits: wait.clone(),
                keep,
                work,
            },
            &self.shared,
        );
    }

    /// True when an operation waiting on `wait` and signalling `signal`
    /// may complete on the host now: every wait is reached and no earlier
    /// operation on this device's stream still has to signal one of the
    /// signal semaphores (a host signal would overtake it).
    fn completes_at_once(&self, wait: &Fence, signal: &Fence) -> bool {
        if !wait
            .timepoints()
            .iter()
            .all(|(s, v)| s.query().is_ok_and(|c| c >= *v))
        {
            return false;
        }
        signal.timepoints().iter().all(|(s, _)| {
            let Ok(current) = s.query() else {
                return false;
            };
            s.attached_timeline()
                .and_then(|t| t.as_any().downcast_ref::<CudaTimeline>())
                .is_none_or(|t| {
                    t.stream_signaled.load(Ordering::Acquire) <= current
                        && t.host_signaled.load(Ordering::Acquire) <= current
                })
        })
    }

    /// A completion event from the pool (or a new one).
    fn event(&self) -> Result<ffi::CUevent> {
        self.shared.take_event()
    }

    /// The device address of a binding reference under `table` (range
    /// checked).
    pub(crate) fn resolve_address(&self, r: &BufferRef, table: &[Binding]) -> Result<CUdeviceptr> {
        crate::replay::resolve(&self.shared, r, table).map(|(_, p, _)| p)
    }

    /// Enqueues recorded commands on the queue stream ([`crate::replay`]);
    /// from the first indirect dispatch on, a continuation runs them
    /// ([`crate::indirect`]).
    pub(crate) fn enqueue_commands(
        &self,
        commands: &[Command],
        table: &[Binding],
        keep: &mut Keep,
    ) -> Result<()> {
        for b in table {
            keep.buffers.push(b.buffer.clone());
        }
        let shared = &self.shared;
        match crate::replay::replay(
            shared,
            shared.stream,
            commands,
            table,
            keep,
            AtIndirect::Stop,
        )? {
            None => Ok(()),
            Some(i) => crate::indirect::defer(shared, commands[i..].into(), table, keep),
        }
    }
}

/// The kernel a dispatch launches, checked against the dispatch's
/// bindings and push constants (at least as many as the kernel takes).
pub(crate) fn dispatch_kernel<'a>(
    executable: &'a ferrite_hal::executable::ExecutableRef,
    function: u32,
    bindings: &[BufferRef],
    constants: &[u32],
) -> Result<&'a crate::executable::Kernel> {
    let Some(exe) = executable.0.as_any().downcast_ref::<CudaExecutable>() else {
        bail!(
            InvalidArgument,
            "executable was not loaded by a CUDA device"
        );
    };
    let kernel = exe.kernel(function)?;
    if bindings.len() < kernel.binding_count as usize {
        bail!(
            InvalidArgument,
            "dispatch of export {function} has {} bindings but the kernel takes {}",
            bindings.len(),
            kernel.binding_count
        );
    }
    if constants.len() < kernel.constant_count as usize {
        bail!(
            InvalidArgument,
            "dispatch of export {function} has {} constants but the kernel takes {}",
            constants.len(),
            kernel.constant_count
        );
    }
    Ok(kernel)
}

/// Fills the whole of the new device buffer `b` with `byte` on `stream`.
fn fill_new(shared: &Arc<Shared>, b: &Buffer, byte: u8, stream: ffi::CUstream) -> Result<()> {
    if b.byte_length() == 0 {
        return Ok(());
    }
    let p = crate::replay::device_ptr(shared, b, 0)?;
    crate::replay::fill(shared, stream, p, b.byte_length(), &[byte])
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
            Keep::default(),
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
                    keep: Keep::default(),
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
                Keep::default(),
                None,
                entries,
                |d, keep| d.enqueue_commands(commands, bindings, keep),
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
                    keep: Keep::default(),
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
            Keep::default(),
            None,
            entries,
            |d, _| {
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
                    out = Some(b);
                } else {
                    out = Some(d.allocator.allocate(params, size)?);
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
        let keep = Keep {
            buffers: vec![buffer],
            ..Keep::default()
        };
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
            crate::replay::fill(&d.shared, d.shared.stream, p, len, &pattern)
        });
        self.enqueue(wait, signal, Keep::default(), None, 1, body)
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
        self.enqueue(wait, signal, Keep::default(), None, 1, body)
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
        self.enqueue(wait, signal, Keep::default(), None, 1, body)
    }
    fn queue_barrier(&self, _this: &Arc<dyn Device>, wait: &Fence, signal: &Fence) -> Result<()> {
        self.enqueue(
            wait,
            signal,
            Keep::default(),
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
        let graph = crate::graph::eligible(cb, &commands);
        // A one-shot command buffer whose shape repeats runs as that
        // shape's graph (module `graph`); it needs no `cb`, so also when
        // kept on the host.
        let shape = if graph {
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
                keep: Keep::default(),
                work: None,
                work_entries,
                body: Some(body),
            };
            self.defer(&mut q, op);
            return Ok(());
        }
        self.enqueue_locked(
            &mut q,
            wait,
            signal,
            Keep::default(),
            None,
            entries,
            |d, keep| {
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
            },
        );
        Ok(())
    }
}
