//! Indirect dispatches on the queue stream: workgroup counts that earlier
//! work on the GPU may write, so they are known only once that work is done.
//!
//! A kernel launch takes its grid from the host, so the counts must be read
//! back before the launch, yet the submitting thread must not block on the
//! stream (the work before may wait on a semaphore that the same thread
//! signals later). A command buffer with an indirect dispatch is therefore
//! split there:
//!
//! - On the queue stream, on the submitting thread: the commands before it,
//!   an event, then a wait (`cuStreamWaitValue64` GEQ 1) on a fresh pinned
//!   *gate* word; the queue operation's signals and completion event follow
//!   as usual. Later submissions queue up behind the gate, in order.
//! - A continuation thread waits for the event, then replays the indirect
//!   dispatch and the commands after it on its own stream
//!   ([`AtIndirect::Read`]): before each indirect dispatch it waits for that
//!   stream and reads the 12 bytes of counts. It then waits for its stream
//!   and opens the gate from the host (also on every error path, even a
//!   panic, so the queue stream never stays blocked).
//! - A failure in the continuation (a count above the grid limit, a short
//!   count reference, a launch error, a fault) is stored in the operation's
//!   outcome slot, which its completion report reads before signalling: the
//!   signal semaphores fail with it.
//!
//! Upstream's CUDA stream command buffers return UNIMPLEMENTED for indirect
//! dispatches; the cost here is one host round trip per indirect dispatch.

use crate::completion::{InFlightResources, Outcome};
use crate::context::CudaContext;
use crate::ffi;
use crate::memory::CudaTimeline;
use crate::stream_encoder::{replay, AtIndirect};
use ferrite_base::{status, Result};
use ferrite_hal::command_buffer::{Binding, Command};
use ferrite_hal::semaphore::DeviceTimeline as _;
use parking_lot::Mutex;
use std::sync::Arc;

/// Splits the queue stream at an indirect dispatch: `rest` (that dispatch
/// and the commands after it) runs on a continuation thread, and the queue
/// stream waits until it is done. `keep` receives what must outlive the
/// continuation's GPU work (released when the operation is reported, after
/// the gate opened).
pub(crate) fn defer(
    shared: &Arc<CudaContext>,
    rest: Arc<[Command]>,
    table: &[Binding],
    keep: &mut InFlightResources,
) -> Result<()> {
    let api = shared.api;
    let event = shared.take_event()?;
    // SAFETY: an event of this context, recorded on its queue stream.
    let recorded = unsafe { (api.cuEventRecord)(event, shared.stream) };
    if let Err(e) = ffi::check(recorded, "recording the work before an indirect dispatch") {
        shared.give_event(event);
        return Err(e);
    }
    let gate = Arc::new(CudaTimeline::new(shared)?);
    let waited = ffi::check(
        // SAFETY: `gate.dptr` is a pinned word that lives while `gate`
        // does; `keep` holds it until the operation is reported, which is
        // after the stream passed this wait.
        unsafe {
            (api.cuStreamWaitValue64_v2)(shared.stream, gate.dptr, 1, ffi::CU_STREAM_WAIT_VALUE_GEQ)
        },
        "enqueueing the wait for an indirect dispatch",
    );
    if let Err(e) = waited {
        // The stream may not have reached the event yet, and waiting for it
        // here could wait on a signal this thread gives later: it is not
        // given back to the pool (where it could be re-recorded while
        // pending) but destroyed, which the driver defers until reached.
        // SAFETY: an event of this context, not used after this.
        unsafe { (api.cuEventDestroy_v2)(event) };
        return Err(e);
    }
    let outcome: Outcome = Arc::new(Mutex::new(None));
    keep.commands.push(rest.clone());
    keep.gates.push(gate.clone());
    keep.outcomes.push(outcome.clone());
    let continuation = Continuation {
        shared: shared.clone(),
        rest,
        table: table.to_vec(),
        event,
        reached: false,
        _gate: GateOpener(gate),
        outcome,
    };
    let spawned = std::thread::Builder::new()
        .name("ferrite-cuda-indirect".into())
        .spawn(move || continuation.run());
    if let Err(e) = spawned {
        // The closure (and so the continuation) was dropped: its gate is
        // open and its event given back; the operation fails.
        return Err(status!(
            ResourceExhausted,
            "starting the thread for an indirect dispatch: {e}"
        ));
    }
    Ok(())
}

/// Opens the gate when dropped: the queue stream proceeds whatever
/// happened to the continuation.
struct GateOpener(Arc<CudaTimeline>);

impl Drop for GateOpener {
    fn drop(&mut self) {
        self.0.advanced(1);
    }
}

/// The part of a command buffer after an indirect dispatch.
struct Continuation {
    shared: Arc<CudaContext>,
    rest: Arc<[Command]>,
    table: Vec<Binding>,
    /// Recorded on the queue stream after the commands before `rest`.
    event: ffi::CUevent,
    /// Whether `event` was waited for (then it may go back to the pool).
    reached: bool,
    /// Opens the gate when the continuation is dropped, after `outcome`
    /// was set.
    _gate: GateOpener,
    outcome: Outcome,
}

// SAFETY: the event handle is only synchronized (a thread-safe driver call)
// and then given back to the device's pool; everything else is Send.
unsafe impl Send for Continuation {}

impl Continuation {
    fn run(mut self) {
        if let Err(e) = self.replay_rest() {
            *self.outcome.lock() = Some(e);
        }
        // `self` drops here: the event goes back, then the gate opens
        // (fields drop after `Drop::drop`).
    }

    fn replay_rest(&mut self) -> Result<()> {
        let shared = &self.shared.clone();
        let api = shared.api;
        shared.make_current()?;
        // SAFETY: an event of this context recorded on the queue stream;
        // only this continuation gives it back or destroys it.
        let reached = unsafe { (api.cuEventSynchronize)(self.event) };
        self.reached = true;
        ffi::check(reached, "waiting for the work before an indirect dispatch")?;
        let stream = OwnStream::new(shared)?;
        let mut keep = InFlightResources::default();
        let replayed = replay(
            shared,
            stream.0,
            &self.rest,
            &self.table,
            &mut keep,
            AtIndirect::Read,
        );
        // Whatever was enqueued runs to the end before the gate opens.
        // SAFETY: the stream created above.
        let finished = unsafe { (api.cuStreamSynchronize)(stream.0) };
        if !keep.timings.is_empty() {
            // The stream passed the dispatches' timing events.
            crate::profile::resolve(shared, &mut keep.timings, finished == ffi::CUDA_SUCCESS);
        }
        replayed?;
        ffi::check(finished, "running the commands after an indirect dispatch")
    }
}

impl Drop for Continuation {
    fn drop(&mut self) {
        if self.reached {
            self.shared.give_event(self.event);
        } else {
            // Never waited for (the thread did not start): it may still be
            // pending, so it is destroyed (deferred by the driver until
            // reached) rather than re-recorded from the pool.
            // SAFETY: an event of this context, not used after this.
            unsafe { (self.shared.api.cuEventDestroy_v2)(self.event) };
        }
    }
}

/// A non-blocking stream of the current context, destroyed on drop (the
/// driver releases it once its work is done).
struct OwnStream(ffi::CUstream, &'static ffi::Api);

impl OwnStream {
    fn new(shared: &CudaContext) -> Result<OwnStream> {
        let mut s: ffi::CUstream = std::ptr::null_mut();
        ffi::check(
            // SAFETY: valid out-pointer; the context is current.
            unsafe { (shared.api.cuStreamCreate)(&mut s, ffi::CU_STREAM_NON_BLOCKING) },
            "creating the stream for an indirect dispatch",
        )?;
        Ok(OwnStream(s, shared.api))
    }
}

impl Drop for OwnStream {
    fn drop(&mut self) {
        // SAFETY: a stream created by `new` and not used after this.
        unsafe { (self.1.cuStreamDestroy_v2)(self.0) };
    }
}
