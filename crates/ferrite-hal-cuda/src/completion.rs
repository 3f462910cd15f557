//! Completions: the queue stream's enqueued operations whose end the host
//! has not seen yet, the device's completion thread, and reporting (signal
//! or fail the operation's semaphores, release what it kept alive).

use crate::context::CudaContext;
use crate::ffi;
use crate::memory::CudaTimeline;
use ferrite_base::{status, Result, Status};
use ferrite_hal::buffer::Buffer;
use ferrite_hal::channel::ChannelRef;
use ferrite_hal::command_buffer::Command;
use ferrite_hal::device::Work;
use ferrite_hal::fence::Fence;
use parking_lot::{Condvar, Mutex};
use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Weak};

/// What the host does once the stream reaches an enqueued operation's
/// event.
pub(crate) struct Completion {
    /// Recorded after the work (blocking sync: the completion thread
    /// sleeps on it); returned to the pool once reached.
    pub(crate) event: ffi::CUevent,
    /// A plain event recorded just before `event`, which polling reporters
    /// query: a blocking-sync event's completion reached a polling host
    /// about a microsecond later on an H100 (see the GPU test
    /// `submit_then_wait_latency_against_the_driver_alone`).
    pub(crate) probe: ffi::CUevent,
    /// Its place in stream order (see [`crate::device::Queue`]).
    pub(crate) seq: u64,
    pub(crate) signal: Fence,
    pub(crate) waits: Fence,
    /// Resources the enqueued work uses, released after it.
    pub(crate) keep: InFlightResources,
    /// Host work to run after the stream work (for `submit`).
    pub(crate) work: Option<Work>,
}

/// A continuation's outcome, read when its queue operation is reported.
pub(crate) type Outcome = Arc<Mutex<Option<Status>>>;

/// Resources kept alive until the work using them completes.
#[derive(Default)]
pub(crate) struct InFlightResources {
    pub(crate) buffers: Vec<Buffer>,
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
    pub(crate) outcomes: Vec<Outcome>,
    /// While a trace is recorded: the queue operation's name and arguments
    /// (its span is timed on the stream, [`crate::profile`]).
    pub(crate) traced: Option<crate::profile::TracedOp>,
    /// Timed work of the operation, resolved into trace spans when it is
    /// reported.
    pub(crate) timings: Vec<crate::profile::Timing>,
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
    /// drain thread of kept operations ([`crate::device::deferral`]).
    progressed: Condvar,
}

/// A `CUevent` compared by handle.
#[derive(Clone, Copy, PartialEq, Eq)]
struct EventHandle(ffi::CUevent);

// SAFETY: an opaque driver handle; the driver's event calls are
// thread-safe.
unsafe impl Send for EventHandle {}

impl Completions {
    pub(crate) fn new() -> Completions {
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
    pub(crate) fn push(&self, c: Completion, shared: &Arc<CudaContext>) {
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

    pub(crate) fn close(&self) {
        self.closed.store(true, Ordering::Release);
        let _q = self.pending.lock();
        self.arrived.notify_all();
    }

    /// Reports pending operations whose events the stream has reached, in
    /// order, stopping at the first one not reached. With `block`, the
    /// oldest is waited for (sleeping) first; with `all`, every one is.
    pub(crate) fn report(&self, shared: &CudaContext, block: bool, all: bool) {
        let _order = self.reporting.lock();
        self.report_locked(shared, block, all);
    }

    fn report_locked(&self, shared: &CudaContext, mut block: bool, all: bool) {
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
            let Some(mut c) = self.pop_reported() else {
                return;
            };
            self.recycle(shared, c.event);
            // Reached (or the stream failed): nobody waits on a probe.
            shared.probes.lock().push(c.probe);
            if !c.keep.timings.is_empty() {
                // The stream passed the timing events (recorded before
                // this operation's completion events).
                crate::profile::resolve(shared, &mut c.keep.timings, status == ffi::CUDA_SUCCESS);
            }
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
    fn recycle(&self, shared: &CudaContext, event: ffi::CUevent) {
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
    pub(crate) fn poll(&self, shared: &CudaContext) {
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
pub(crate) fn completion_loop(completions: Arc<Completions>, shared: Weak<CudaContext>) {
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
        // wait (`watched`); events are destroyed only when `CudaContext` drops,
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
