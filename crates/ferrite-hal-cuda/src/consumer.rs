//! Ordering a foreign stream (a DLPack consumer's) after queue work that
//! is still kept on the host ([`crate::device::deferral`]).
//!
//! An event recorded on the queue stream covers only what was enqueued
//! there. Operations kept on the host (waiting on a semaphore the host, a
//! CPU device or another GPU signals) are enqueued later, so the consumer
//! waits instead on a *release word*: a pinned, device-mapped word at 0
//! that the consumer's stream waits on (`cuStreamWaitValue64` GEQ 1) and
//! that the queue stream sets to 1 (`cuStreamWriteValue64`) right after
//! the last operation kept at the time of the ordering call, through a
//! marker operation kept behind them. The consumer is released on the
//! GPU once that work has run, and the host never blocks.
//!
//! When a kept operation fails (its wait failed) its work never runs, but
//! the marker behind it has no waits of its own and is still enqueued, so
//! the consumer is released after the work that did run; the failure is
//! reported through the operations' signal semaphores. When the marker is
//! never enqueued (the device is released first, or enqueuing it fails),
//! its [`Release`] writes the word from the host when it is dropped: the
//! consumer is never left waiting forever.
//!
//! A word is reused only once the consumer's stream has passed its wait:
//! an event recorded on that stream right after the wait tells. Words whose
//! consumer has not passed yet are kept until the device state is dropped,
//! which releases them and waits for those events first.

use crate::context::CudaContext;
use crate::ffi::{self, CUdeviceptr, CUstream};
use ferrite_base::Result;
use parking_lot::Mutex;
use std::ptr::NonNull;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

/// The value that releases a consumer waiting on its word.
const RELEASED: u64 = 1;

/// A consumer stream's wait on a release word.
struct Wait {
    /// The word's pool slot (page, word).
    slot: (usize, usize),
    host: NonNull<AtomicU64>,
    /// Recorded on the consumer's stream right after its wait; None when
    /// recording failed (the word is then kept until the device goes).
    passed: Option<ffi::CUevent>,
}

/// Release words consumers may still be waiting on.
#[derive(Default)]
pub(crate) struct ConsumerWaits(Mutex<Vec<Wait>>);

// SAFETY: `host` points at a pinned pool word owned by this list until it
// is given back, accessed only atomically; events are opaque driver
// handles, usable from any thread.
unsafe impl Send for ConsumerWaits {}
// SAFETY: see above; the list is under a mutex.
unsafe impl Sync for ConsumerWaits {}

impl ConsumerWaits {
    /// Makes `consumer` wait on a new release word; the returned
    /// [`Release`] sets it. The context of `shared` must be current.
    ///
    /// # Safety
    /// `consumer` is `CU_STREAM_LEGACY`, `CU_STREAM_PER_THREAD` or a live
    /// stream handle of this device's context.
    pub(crate) unsafe fn add(
        &self,
        shared: &Arc<CudaContext>,
        consumer: CUstream,
    ) -> Result<Release> {
        self.give_back_passed(shared);
        let api = shared.api;
        let (page, word, host, dptr) = shared.words.take(shared)?;
        // SAFETY: the word is valid (the pool lives as long as `shared`) and
        // nobody else uses it.
        unsafe { host.as_ref() }.store(0, Ordering::Release);
        let waited = ffi::check(
            // SAFETY: `dptr` is the device address of a pinned word kept
            // until the consumer passed this wait (`passed`) or the device
            // state is dropped (which releases the word first and waits for
            // the consumer); the caller vouches for `consumer`.
            unsafe {
                (api.cuStreamWaitValue64_v2)(
                    consumer,
                    dptr,
                    RELEASED,
                    ffi::CU_STREAM_WAIT_VALUE_GEQ,
                )
            },
            "making the consumer stream wait for the queue's kept work",
        );
        if let Err(e) = waited {
            shared.words.give_back(page, word);
            return Err(e);
        }
        let mut event: ffi::CUevent = std::ptr::null_mut();
        // SAFETY: a valid out-pointer; the context is current. The event is
        // recorded on the consumer right after the wait, so it is reached
        // only once the consumer passed it; a failed record leaves it
        // unused and destroyed.
        let passed = unsafe {
            if (api.cuEventCreate)(&mut event, ffi::CU_EVENT_DISABLE_TIMING) != ffi::CUDA_SUCCESS {
                None
            } else if (api.cuEventRecord)(event, consumer) != ffi::CUDA_SUCCESS {
                (api.cuEventDestroy_v2)(event);
                None
            } else {
                Some(event)
            }
        };
        self.0.lock().push(Wait {
            slot: (page, word),
            host,
            passed,
        });
        Ok(Release {
            shared: shared.clone(),
            host,
            dptr,
            enqueued: false,
        })
    }

    /// Returns the words whose consumers passed their waits to the pool.
    fn give_back_passed(&self, shared: &CudaContext) {
        self.0.lock().retain(|w| {
            let Some(event) = w.passed else {
                return true;
            };
            // SAFETY: an event of this context, destroyed only here or in
            // `release`.
            let r = unsafe { (shared.api.cuEventQuery)(event) };
            if r == ffi::CUDA_ERROR_NOT_READY {
                return true;
            }
            // Passed (or the consumer's stream failed, and it will not
            // read the word again).
            // SAFETY: as above; not used after this.
            unsafe { (shared.api.cuEventDestroy_v2)(event) };
            shared.words.give_back(w.slot.0, w.slot.1);
            false
        });
    }

    /// Releases every consumer still waiting and waits until each passed
    /// its wait; the words may then be freed. Called when the device state
    /// is dropped (no [`Release`] is left: each holds that state), with its
    /// context current.
    pub(crate) fn release(&self, api: &ffi::Api) {
        for w in self.0.lock().drain(..) {
            // SAFETY: the word is still owned by this list (the pool is
            // released after this).
            unsafe { w.host.as_ref() }.store(RELEASED, Ordering::Release);
            if let Some(event) = w.passed {
                // SAFETY: an event of this context, not used after this.
                unsafe {
                    (api.cuEventSynchronize)(event);
                    (api.cuEventDestroy_v2)(event);
                }
            }
        }
    }
}

/// Sets a release word: on the queue stream after the kept work
/// ([`Release::enqueue`]), or, when it is dropped without that, from the
/// host at once (the consumer is released rather than left waiting).
pub(crate) struct Release {
    /// Keeps the word's pool alive (the word itself is kept by
    /// [`ConsumerWaits`] until the consumer passed it).
    shared: Arc<CudaContext>,
    host: NonNull<AtomicU64>,
    dptr: CUdeviceptr,
    enqueued: bool,
}

// SAFETY: `host` is a pinned word kept alive as described on the fields,
// accessed only atomically.
unsafe impl Send for Release {}

impl Release {
    /// Enqueues the word's write on `stream` (the queue stream, after the
    /// work the consumer is ordered after). The context must be current.
    pub(crate) fn enqueue(mut self, stream: CUstream) -> Result<()> {
        ffi::check(
            // SAFETY: `dptr` is the device address of the pinned word, kept
            // until the consumer passed its wait, which follows this write.
            unsafe {
                (self.shared.api.cuStreamWriteValue64_v2)(
                    stream,
                    self.dptr,
                    RELEASED,
                    ffi::CU_STREAM_WRITE_VALUE_DEFAULT,
                )
            },
            "enqueueing the release of a consumer stream",
        )?;
        self.enqueued = true;
        Ok(())
    }
}

impl Drop for Release {
    fn drop(&mut self) {
        if !self.enqueued {
            // SAFETY: the word is kept by `ConsumerWaits` until the consumer
            // passed its wait, which needs this write.
            unsafe { self.host.as_ref() }.store(RELEASED, Ordering::Release);
        }
    }
}
