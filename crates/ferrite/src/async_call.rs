//! Calls as futures: [`CallFuture`] and [`VariantCallFuture`], made by
//! `call_async` on [`crate::Session`], [`crate::Function`] and
//! [`crate::OwnedFunction`].
//!
//! # What a call does, and when its future resolves
//!
//! `call_async` issues the call before it returns: the arguments are
//! converted and the invocation runs until it first waits on something.
//! Calls are therefore issued in the order `call_async` is called, whether
//! or not their futures are polled.
//!
//! - A function compiled with `--iree-execution-model=async-external`
//!   (its export carries `iree.abi.model = coarse-fences`; it takes a wait
//!   and a signal fence after its own arguments) enqueues its work on the
//!   device and returns at once: `call_async` passes a wait fence (already
//!   reached, or the one given to `call_async_after`) and a new signal
//!   fence, and the future resolves when the device reaches the signal
//!   fence ([`CallFuture::signal_fence`]). Nothing blocks and no thread is
//!   kept for the call.
//! - A function compiled with the default (synchronous) model waits for its
//!   own work with `hal.fence.await`. The session's `hal` module makes that
//!   wait yield instead of block, and the future waits for what it yielded
//!   on (woken by the semaphore's signal), then resumes the invocation in
//!   its next poll, on the thread that polls it. No thread blocks either;
//!   `call_async_after` begins such a call once its fence is reached.
//!
//! Where the work runs: the host-side part of a call (the program's VM
//! code: argument checks, command recording, submissions) runs on the
//! thread that calls `call_async` or polls the future. On `local-task` the
//! device work runs on the device's worker threads, on `cuda` on its
//! streams. `local-sync` has no threads of its own: it runs each queue
//! operation on the thread that submits it, so there a call's computation
//! happens inside `call_async` (or the poll that resumes it). Since
//! `local-sync` would also block that thread until a queue operation's
//! wait fence is reached, `call_async_after` on it waits for the fence as
//! a future first and begins the call afterwards (in the poll or on the
//! thread that signals the fence), async-external or not.
//!
//! The future resolves with the results (tensors copied to the host for
//! [`CallFuture`]; VM values as they are for [`VariantCallFuture`]), with
//! the call's error (a VM failure; a failed device submission or wait
//! fence: the status of the semaphore that failed), or with an error about
//! the arguments or the function's name.
//!
//! # Cancellation
//!
//! Dropping a future gives up its results, never the call: work already
//! enqueued completes, and an invocation that was waiting (or a call still
//! waiting for its `call_async_after` fence) goes on without the future,
//! polled by one process-wide thread when what it waits for is signalled
//! (never inside the signalling thread's own code), until it returns
//! (so a program's state never stays half-updated); its results and
//! buffers are then released. A dropped future never leaves a fence
//! unsignalled or a subscription behind on a semaphore.
//! [`calls_in_flight`] counts the calls still running without their
//! future; a call whose wait is never satisfied stays in that count.

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU8, AtomicUsize, Ordering};
use std::sync::Arc;
use std::task::{Context as TaskContext, Poll, Wake, Waker};

use ferrite_base::status::ResultExt;
use ferrite_base::wait::future::SourcesWait;
use ferrite_base::{Result, Status, StatusCode};
use ferrite_hal::fence::Fence;
use ferrite_hal::semaphore::Semaphore;
use ferrite_hal::TimepointWait;
use ferrite_vm::cconv::CconvType;
use ferrite_vm::invocation::Poll as InvocationPoll;
use ferrite_vm::{Context, FunctionRef, Invocation, Ref, Variant};

use crate::value::Value;

/// The reflection attribute and value upstream's compiler gives exports
/// compiled with `--iree-execution-model=async-external`.
const MODEL_ATTR: &str = "iree.abi.model";
const COARSE_FENCES: &str = "coarse-fences";

/// Whether `f` follows the coarse-fences model: `iree.abi.model` says so
/// and its last two arguments are refs (the wait and signal fences).
pub(crate) fn is_coarse_fences(f: &FunctionRef) -> bool {
    let module = f.state.module();
    let declared = module
        .exports()
        .get(f.ordinal as usize)
        .and_then(|e| e.signature.attr(MODEL_ATTR))
        == Some(COARSE_FENCES);
    let args = &f.cconv.args;
    declared
        && args.len() >= 2
        && matches!(&args[args.len() - 2..], [CconvType::Ref, CconvType::Ref])
}

/// Calls running without their future (dropped before they finished).
static DETACHED: AtomicUsize = AtomicUsize::new(0);

/// Number of calls whose future was dropped while they were still running
/// (they finish on their own; see the module docs). Zero once every such
/// call has returned and released its results: a diagnostic for servers
/// and tests.
pub fn calls_in_flight() -> usize {
    DETACHED.load(Ordering::Acquire)
}

/// Where a call stands.
enum Stage {
    /// A call given an unreached wait fence that the host waits for (a
    /// synchronous-model function, or any function on a device that runs
    /// queue work inline): the invocation begins once the fence is reached.
    Gate {
        wait: TimepointWait,
        function: FunctionRef,
        args: Vec<Variant>,
    },
    /// The invocation yielded and waits on `wait`.
    Yielded {
        invocation: Invocation,
        wait: SourcesWait,
    },
    /// The invocation returned; the device reaches `wait` (the call's
    /// signal fence) once the results are ready.
    Signal {
        results: Vec<Variant>,
        wait: TimepointWait,
    },
    /// The call failed before anything ran (arguments, lookup).
    Failed(Status),
    /// The outcome was handed out.
    Finished,
}

/// A call in progress: everything it needs, owned.
struct Driver {
    /// Keeps the modules' states alive while the invocation runs.
    _context: Arc<Context>,
    name: Arc<str>,
    /// The signal fence of a coarse-fences call.
    signal: Option<Arc<Fence>>,
    stage: Stage,
}

impl Driver {
    fn failed(context: Arc<Context>, name: Arc<str>, status: Status) -> Driver {
        Driver {
            _context: context,
            name,
            signal: None,
            stage: Stage::Failed(status),
        }
    }

    fn is_finished(&self) -> bool {
        matches!(self.stage, Stage::Finished | Stage::Failed(_))
    }

    /// Begins the invocation and runs it to its first wait.
    fn begin(&mut self, context: &Context, function: &FunctionRef, args: Vec<Variant>) {
        self.stage = match context.begin(function, args) {
            Ok(invocation) => self.step(invocation),
            Err(e) => Stage::Failed(self.annotate(e)),
        };
    }

    fn annotate(&self, e: Status) -> Status {
        e.annotate(format!("invoking function '{}'", self.name))
    }

    /// Steps the invocation until it waits on something or returns.
    fn step(&mut self, mut invocation: Invocation) -> Stage {
        match invocation.step() {
            Ok(InvocationPoll::Pending(w)) => Stage::Yielded {
                invocation,
                wait: SourcesWait::new(w.sources, w.mode, w.deadline),
            },
            // Without a signal fence the results are ready now: the empty
            // fence's wait resolves at the next look.
            Ok(InvocationPoll::Done(results)) => Stage::Signal {
                results,
                wait: match &self.signal {
                    Some(fence) => fence.wait_async(),
                    None => Fence::empty().wait_async(),
                },
            },
            Err(e) => Stage::Failed(self.annotate(e)),
        }
    }

    /// Drives the call as far as it goes without waiting.
    fn poll(&mut self, cx: &mut TaskContext<'_>) -> Poll<Result<Vec<Variant>>> {
        loop {
            match &mut self.stage {
                Stage::Gate { wait, .. } => {
                    let outcome = match Pin::new(wait).poll(cx) {
                        Poll::Pending => return Poll::Pending,
                        Poll::Ready(outcome) => outcome,
                    };
                    let Stage::Gate { function, args, .. } =
                        std::mem::replace(&mut self.stage, Stage::Finished)
                    else {
                        unreachable_stage();
                        return Poll::Pending;
                    };
                    match outcome {
                        Ok(()) => {
                            let context = self._context.clone();
                            self.begin(&context, &function, args);
                        }
                        Err(e) => {
                            self.stage = Stage::Failed(
                                self.annotate(e.annotate("the call's wait fence failed")),
                            )
                        }
                    }
                }
                Stage::Yielded { invocation, wait } => {
                    let outcome = match Pin::new(wait).poll(cx) {
                        Poll::Pending => return Poll::Pending,
                        Poll::Ready(outcome) => outcome,
                    };
                    if let Err(e) = invocation.complete_wait(outcome) {
                        self.stage = Stage::Failed(self.annotate(e));
                        continue;
                    }
                    let Stage::Yielded { invocation, .. } =
                        std::mem::replace(&mut self.stage, Stage::Finished)
                    else {
                        unreachable_stage();
                        return Poll::Pending;
                    };
                    self.stage = self.step(invocation);
                }
                Stage::Signal { wait, .. } => {
                    let outcome = match Pin::new(wait).poll(cx) {
                        Poll::Pending => return Poll::Pending,
                        Poll::Ready(outcome) => outcome,
                    };
                    let Stage::Signal { results, .. } =
                        std::mem::replace(&mut self.stage, Stage::Finished)
                    else {
                        unreachable_stage();
                        return Poll::Pending;
                    };
                    return Poll::Ready(match outcome {
                        Ok(()) => Ok(results),
                        Err(e) => Err(self.annotate(
                            e.annotate("the call's device work failed (its signal fence failed)"),
                        )),
                    });
                }
                Stage::Failed(_) => {
                    let Stage::Failed(e) = std::mem::replace(&mut self.stage, Stage::Finished)
                    else {
                        unreachable_stage();
                        return Poll::Pending;
                    };
                    return Poll::Ready(Err(e));
                }
                Stage::Finished => {
                    return Poll::Ready(Err(Status::new(
                        StatusCode::FailedPrecondition,
                        format!("the call of '{}' was polled after it resolved", self.name),
                    )))
                }
            }
        }
    }
}

/// The stage was matched just above: a mismatch cannot happen, and if it
/// did the future stays pending rather than panicking.
fn unreachable_stage() {
    debug_assert!(false, "call stage changed between match and take");
}

/// Starts a call of `function` (see the module docs): `args` are the
/// function's own arguments, already converted; for a coarse-fences
/// function without its fences in `args`, a wait fence and a new signal
/// fence are appended. The wait fence is `after` itself when the device
/// queues work (`local-task`, `cuda`); a device that runs queue work on the
/// submitting thread (`inline`: `local-sync`, which would block there until
/// `after` is reached) gets an already reached fence instead, and the call
/// begins once `after` is reached, as a synchronous-model call does.
pub(crate) fn start(
    context: Arc<Context>,
    function: &FunctionRef,
    mut args: Vec<Variant>,
    after: Option<Arc<Fence>>,
    inline: bool,
) -> VariantCallFuture {
    let name: Arc<str> = function.name.clone();
    let fail = |e: Status| VariantCallFuture::new(Driver::failed(context.clone(), name.clone(), e));
    let mut driver = Driver {
        _context: context.clone(),
        name: name.clone(),
        signal: None,
        stage: Stage::Finished,
    };
    let total = function.cconv.args.len();
    let coarse = is_coarse_fences(function);
    // The fence the host waits for before the invocation begins, if any.
    let mut gate = after;
    if coarse && args.len() + 2 == total {
        let wait = match gate.take() {
            Some(f) if !inline => f,
            host_gate => {
                gate = host_gate;
                Arc::new(Fence::new())
            }
        };
        let signal = Arc::new(Fence::create_at(Semaphore::new(0), 1));
        args.push(Variant::Ref(Ref::from_arc(wait)));
        args.push(Variant::Ref(Ref::from_arc(signal.clone())));
        driver.signal = Some(signal);
    } else if coarse && args.len() == total {
        // The caller passed both fences: the future waits on their signal
        // fence.
        let signal = match &args[total - 1] {
            Variant::Ref(r) => r.downcast_arc::<Fence>(),
            _ => None,
        };
        let Some(signal) = signal else {
            return fail(ferrite_base::status!(
                InvalidArgument,
                "argument {} of '{name}' (the signal fence of an async-external function) must be a fence",
                total - 1
            ));
        };
        if gate.is_some() {
            return fail(ferrite_base::status!(
                InvalidArgument,
                "'{name}': pass either a wait fence to call_async_after or both fences as arguments, not both"
            ));
        }
        driver.signal = Some(signal);
    }
    // Other argument counts reach the VM's own check when the call begins.
    match gate {
        // An unreached gate: begin once it is reached (a failed one fails
        // the call at the first poll).
        Some(wait) if !matches!(wait.query(), Ok(true)) => {
            driver.stage = Stage::Gate {
                wait: wait.wait_async(),
                function: function.clone(),
                args,
            };
        }
        _ => driver.begin(&context, function, args),
    }
    VariantCallFuture::new(driver)
}

/// A failed call as a future (lookup or argument conversion failed).
pub(crate) fn failed(context: Arc<Context>, name: &str, e: Status) -> VariantCallFuture {
    VariantCallFuture::new(Driver::failed(context, name.into(), e))
}

/// A call as a future whose output is the VM's results as they are:
/// tensors stay in their device buffers (`hal.buffer_view` refs). Made by
/// `call_async_variants`; see the [module docs](self) for when it resolves
/// and what dropping it does. `Send`, `'static`, `Unpin`.
#[must_use = "dropping the future gives up the results (the call still runs)"]
pub struct VariantCallFuture {
    driver: Option<Driver>,
}

impl VariantCallFuture {
    fn new(driver: Driver) -> VariantCallFuture {
        VariantCallFuture {
            driver: Some(driver),
        }
    }

    /// `module.function` of the call.
    pub fn name(&self) -> &str {
        self.driver.as_ref().map_or("", |d| &d.name)
    }

    /// The fence the device signals when the call's work is done, for a
    /// function compiled with `--iree-execution-model=async-external`
    /// (None otherwise): pass it to `call_async_after` to order another
    /// call after this one on the device, without waiting on the host.
    pub fn signal_fence(&self) -> Option<Arc<Fence>> {
        self.driver.as_ref().and_then(|d| d.signal.clone())
    }
}

impl Future for VariantCallFuture {
    type Output = Result<Vec<Variant>>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut TaskContext<'_>) -> Poll<Self::Output> {
        let Some(driver) = self.driver.as_mut() else {
            return Poll::Ready(Err(Status::new(
                StatusCode::FailedPrecondition,
                "the call was polled after it resolved",
            )));
        };
        let out = driver.poll(cx);
        if out.is_ready() {
            self.driver = None;
        }
        out
    }
}

impl Drop for VariantCallFuture {
    fn drop(&mut self) {
        let Some(driver) = self.driver.take() else {
            return;
        };
        match driver.stage {
            // Nothing left to run: the device's queue holds what its
            // enqueued work needs and releases it when done.
            Stage::Signal { .. } | Stage::Failed(_) | Stage::Finished => {}
            Stage::Gate { .. } | Stage::Yielded { .. } => Detached::run_to_end(driver),
        }
    }
}

impl std::fmt::Debug for VariantCallFuture {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "VariantCallFuture({})", self.name())
    }
}

/// A call as a future whose output is [`Value`]s: tensor results copied to
/// the host, as [`crate::Function::call`] returns them. Made by
/// `call_async`; see the [module docs](self) for when it resolves and what
/// dropping it does. `Send`, `'static`, `Unpin`.
#[must_use = "dropping the future gives up the results (the call still runs)"]
#[derive(Debug)]
pub struct CallFuture {
    inner: VariantCallFuture,
}

impl CallFuture {
    pub(crate) fn new(inner: VariantCallFuture) -> CallFuture {
        CallFuture { inner }
    }

    /// `module.function` of the call.
    pub fn name(&self) -> &str {
        self.inner.name()
    }

    /// See [`VariantCallFuture::signal_fence`].
    pub fn signal_fence(&self) -> Option<Arc<Fence>> {
        self.inner.signal_fence()
    }
}

impl Future for CallFuture {
    type Output = Result<Vec<Value>>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut TaskContext<'_>) -> Poll<Self::Output> {
        let name = self.inner.name().to_string();
        match Pin::new(&mut self.inner).poll(cx) {
            Poll::Pending => Poll::Pending,
            Poll::Ready(Err(e)) => Poll::Ready(Err(e)),
            Poll::Ready(Ok(results)) => Poll::Ready(
                results
                    .into_iter()
                    .map(Value::from_variant)
                    .collect::<Result<Vec<_>>>()
                    .annotate(|| format!("reading results of '{name}'")),
            ),
        }
    }
}

/// A call whose future was dropped while it was still running: it drives
/// itself to the end on the [runner](runner) thread, polled again each
/// time what it waits for wakes it, then drops its results.
struct Detached {
    driver: std::sync::Mutex<Option<Driver>>,
    /// IDLE, QUEUED, RUNNING, or RUNNING with a wake that came meanwhile.
    state: AtomicU8,
}

const IDLE: u8 = 0;
const QUEUED: u8 = 1;
const RUNNING: u8 = 2;
const NOTIFIED: u8 = 3;

impl Detached {
    fn run_to_end(driver: Driver) {
        DETACHED.fetch_add(1, Ordering::AcqRel);
        let task = Arc::new(Detached {
            driver: std::sync::Mutex::new(Some(driver)),
            state: AtomicU8::new(IDLE),
        });
        task.schedule();
    }

    /// Queues the task for the runner unless it is queued already, or
    /// marks a running task to be polled once more.
    fn schedule(self: &Arc<Self>) {
        loop {
            let (from, to) = match self.state.load(Ordering::Acquire) {
                IDLE => (IDLE, QUEUED),
                RUNNING => (RUNNING, NOTIFIED),
                _ => return,
            };
            if self
                .state
                .compare_exchange(from, to, Ordering::AcqRel, Ordering::Acquire)
                .is_ok()
            {
                if to == QUEUED {
                    runner::submit(self.clone());
                }
                return;
            }
        }
    }

    /// Polls the call once (on the runner thread).
    fn run(self: Arc<Self>) {
        self.state.store(RUNNING, Ordering::Release);
        let waker = Waker::from(self.clone());
        let finished = {
            // Only the runner polls; a poisoned lock (a panic inside an
            // earlier poll) still holds a usable driver.
            let mut slot = self.driver.lock().unwrap_or_else(|e| e.into_inner());
            match slot.as_mut() {
                Some(d) => {
                    let done =
                        d.poll(&mut TaskContext::from_waker(&waker)).is_ready() || d.is_finished();
                    if done {
                        slot.take()
                    } else {
                        None
                    }
                }
                None => None,
            }
        };
        if let Some(driver) = finished {
            // Results and buffers go here, outside the lock.
            drop(driver);
            DETACHED.fetch_sub(1, Ordering::AcqRel);
        }
        if self
            .state
            .compare_exchange(RUNNING, IDLE, Ordering::AcqRel, Ordering::Acquire)
            .is_err()
        {
            // Woken while polling: poll again.
            self.state.store(QUEUED, Ordering::Release);
            runner::submit(self);
        }
    }
}

impl Wake for Detached {
    fn wake(self: Arc<Self>) {
        self.schedule();
    }

    fn wake_by_ref(self: &Arc<Self>) {
        self.schedule();
    }
}

/// The one thread that polls calls whose futures were dropped. Wakers run
/// on whatever thread signals a semaphore (a device's worker or completion
/// thread, inside its signal path): a detached call is only queued there,
/// and its program code runs here instead. Started at the first dropped
/// call; it sleeps while nothing is queued.
mod runner {
    use super::Detached;
    use std::collections::VecDeque;
    use std::sync::{Arc, Condvar, Mutex, OnceLock};

    struct Queue {
        tasks: Mutex<VecDeque<Arc<Detached>>>,
        ready: Condvar,
        /// Whether the thread is running (it could not be started when not).
        started: bool,
    }

    fn queue() -> &'static Queue {
        static QUEUE: OnceLock<Queue> = OnceLock::new();
        QUEUE.get_or_init(|| {
            let started = std::thread::Builder::new()
                .name("ferrite-detached-calls".into())
                .spawn(run)
                .is_ok();
            Queue {
                tasks: Mutex::new(VecDeque::new()),
                ready: Condvar::new(),
                started,
            }
        })
    }

    pub(super) fn submit(task: Arc<Detached>) {
        let q = queue();
        if !q.started {
            // No thread to hand it to: poll it here rather than never.
            task.run();
            return;
        }
        q.tasks
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push_back(task);
        q.ready.notify_one();
    }

    fn run() {
        let q = queue();
        loop {
            let task = {
                let mut tasks = q.tasks.lock().unwrap_or_else(|e| e.into_inner());
                loop {
                    if let Some(t) = tasks.pop_front() {
                        break t;
                    }
                    tasks = q.ready.wait(tasks).unwrap_or_else(|e| e.into_inner());
                }
            };
            // A panic inside one call's program must not stop the thread
            // that finishes every other dropped call.
            let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| task.run()));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn assert_send_static_unpin<T: Send + 'static + Unpin>() {}

    #[test]
    fn futures_are_send_static_and_unpin() {
        assert_send_static_unpin::<CallFuture>();
        assert_send_static_unpin::<VariantCallFuture>();
        assert_send_static_unpin::<ferrite_hal::TimepointWait>();
    }
}
