//! The CUDA context of one device and what lives in it: the context made
//! current on demand, the queue and transfer streams, event and memory
//! pools, and stream-to-stream ordering for foreign consumers.

use crate::completion::Completions;
use crate::ffi::{self, Api, CUcontext, CUdevice, CUdeviceptr, CUstream};
use crate::memory::{AllocationStats, SpareBlocks, WordPool};
use ferrite_base::Result;
use parking_lot::Mutex;
use std::ffi::c_void;
use std::sync::{Arc, Weak};

/// A device's CUDA context with its streams, event and memory pools and
/// completions, shared by the device, its memory, executables and
/// timelines (they keep the context and streams alive).
pub struct CudaContext {
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
    pub(crate) transfer_lock: Mutex<()>,
    /// Recorded-and-reached blocking-sync events for reuse.
    pub(crate) events: Mutex<Vec<ffi::CUevent>>,
    /// Recorded-and-reached plain events (probes) for reuse.
    pub(crate) probes: Mutex<Vec<ffi::CUevent>>,
    /// Enqueued operations whose completion the host has not seen yet.
    pub(crate) completions: Arc<Completions>,
    /// Per-kernel GPU times, with `FERRITE_CUDA_KERNEL_TIMES` set
    /// ([`crate::kernel_times`]).
    pub(crate) kernel_times: Option<crate::kernel_times::KernelTimes>,
    /// Timing events and the reference for device times in the execution
    /// trace ([`crate::profile`]).
    pub(crate) clock: crate::profile::DeviceClock,
    /// Release words foreign streams wait on ([`crate::consumer`]).
    pub(crate) consumer_waits: crate::consumer::ConsumerWaits,
    /// The device over this state, whose queue may keep operations on the
    /// host ([`CudaContext::order_queue_before`] orders those too). Weak: the
    /// device holds this state.
    pub(crate) queue_device: std::sync::OnceLock<Weak<dyn QueueOrder>>,
}

/// What the context asks of the device over it (`CudaDevice`, whose queue
/// may keep operations on the host): a trait, so that the context, which
/// everything in the driver holds, names no module above it.
pub(crate) trait QueueOrder: Send + Sync {
    /// Orders every queue operation submitted so far, those kept on the
    /// host included, before `consumer` (the host when `None`).
    ///
    /// # Safety
    /// As [`CudaContext::order_queue_before`].
    unsafe fn order_before_consumer(&self, consumer: Option<CUstream>) -> Result<()>;
}

// SAFETY: CUDA handles are usable from any thread once the context is
// current (`make_current`); the transfer stream is used under a lock and
// the queue stream under the device's submission lock.
unsafe impl Send for CudaContext {}
// SAFETY: see above.
unsafe impl Sync for CudaContext {}

impl CudaContext {
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
    pub(crate) fn take_probe(&self) -> Result<ffi::CUevent> {
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

    /// Idle device blocks kept for reuse, and their bytes (see
    /// [`crate::memory::SpareBlocks`]).
    pub fn idle_device_blocks(&self) -> (usize, u64) {
        (self.spare.blocks(), self.spare.bytes())
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
    /// are kept on the host ([`crate::device::deferral`]), for a word the queue
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
    /// As [`CudaContext::order_queue_before`], for `producer`.
    pub unsafe fn order_before_queue(&self, producer: usize) -> Result<()> {
        // SAFETY: as above.
        unsafe { self.order(producer as CUstream, Some(self.stream)) }
    }

    /// Records an event on `from` and makes `to` wait for it (the host,
    /// when `to` is `None`).
    ///
    /// # Safety
    /// Both streams are valid handles (or the legacy/per-thread constants).
    pub(crate) unsafe fn order(&self, from: CUstream, to: Option<CUstream>) -> Result<()> {
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

impl Drop for CudaContext {
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
            // Every timed span was resolved by the reports above.
            self.clock.release(self.api);
            // SAFETY: the streams were created by this device and nothing
            // references them any more (everything using them holds an Arc
            // of `CudaContext`).
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
