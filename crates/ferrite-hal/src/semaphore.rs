//! Timeline semaphores (the `hal.semaphore` ref type).
//!
//! A semaphore holds a `u64` payload that only grows. Waiters block (on a
//! condition variable, after polling for at most
//! [`ferrite_base::wait::SPIN`]) until the payload reaches their value,
//! the deadline passes (`DEADLINE_EXCEEDED`), or the semaphore fails. Failure
//! is sticky: every present and future waiter, query and timepoint callback
//! sees the failure status.
//!
//! Devices schedule work on semaphores with [`Semaphore::on_reached`]:
//! callbacks run once the payload reaches a value (or the semaphore fails),
//! immediately when that has already happened. Callbacks run on the
//! signalling thread, outside the semaphore's lock.
//!
//! For generic multi-waits, a [`Timepoint`] (semaphore, value) implements
//! [`WaitSource`].
//!
//! # Device timelines
//!
//! A device that waits and signals without the host (a GPU) attaches a
//! [`DeviceTimeline`] to the semaphore ([`Semaphore::device_timeline`]): a
//! copy of the payload in memory the device reads (for CUDA, a 64-bit word
//! in pinned, mapped host memory that the GPU waits on with
//! `cuStreamWaitValue64` and writes with `cuStreamWriteValue64`). The host
//! state here stays the one source of truth for host waiters and failures:
//! every host signal and failure is forwarded to the attached timeline
//! (so GPU waits on a semaphore a CPU device signals are released without a
//! host thread in between), and the device reports its own signals and
//! faults back through [`Semaphore::signal`] and [`Semaphore::fail`] from a
//! completion thread, which wakes host waiters; a host waiter in its
//! bounded polling window asks the device to report finished work itself
//! ([`DeviceTimeline::poll`]), which saves the completion thread's wake-up
//! on short GPU operations. A failure
//! releases device waiters (the timeline is set to its failure value) and
//! the device's queue fails the semaphores its own work signals, so
//! failures cross between CPU and GPU devices both ways.

use std::fmt;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Weak};

use ferrite_base::wait::{
    add_helper, lends, wait_sources, Event, Helper, Helpers, Notifier, WaitMode, WaitSource,
};
use ferrite_base::RefObject;
use ferrite_base::{bail, Deadline, Result, Status, StatusCode, Timeout};
use parking_lot::{Condvar, Mutex};

use crate::inflight::SubmissionUses;

/// A device's copy of a semaphore's payload (see the module docs).
pub trait DeviceTimeline: Send + Sync + 'static {
    /// The host payload advanced to `value` (called on the signalling
    /// thread with the semaphore's lock held: record the value, nothing
    /// more).
    fn advanced(&self, value: u64);
    /// The semaphore failed: release device waiters (they then observe the
    /// failure through the host state).
    fn failed(&self);
    /// A host thread waiting on the semaphore is polling (within its
    /// bounded window, [`ferrite_base::wait::SPIN`]): report, without
    /// blocking, any of the device's work that has already finished, so
    /// the waiter need not wait for the device's own completion reporting.
    /// Cheap when nothing is pending; the default does nothing.
    fn poll(&self) {}
    /// Someone is about to wait on the semaphore without polling (a thread
    /// going to sleep, a subscribed waiter, a callback): the device must
    /// report its work on its own from now on. Called outside the
    /// semaphore's lock, after the waiter registered (see
    /// [`Semaphore::has_sleepers`]). The default does nothing.
    fn watch(&self) {}
    /// For drivers: downcast to the concrete type.
    fn as_any(&self) -> &dyn std::any::Any;
}

/// A callback run when a semaphore reaches a value (`Ok`) or fails (`Err`).
pub type TimepointCallback = Box<dyn FnOnce(Result<()>) + Send>;

struct State {
    value: u64,
    failure: Option<Status>,
    /// Waiters subscribed through [`Timepoint`] wait sources, with the value
    /// each waits for.
    notifiers: Vec<(u64, Arc<Notifier>)>,
    /// Device callbacks, with their values.
    callbacks: Vec<(u64, TimepointCallback)>,
    /// Threads asleep in [`Semaphore::wait_until`].
    sleeping: u32,
    /// Device uses of submissions this semaphore signals, with the value
    /// that ends them: settled under the lock before a reached value (or
    /// the failure) is published (see [`crate::inflight`]).
    held: Vec<(u64, Arc<SubmissionUses>)>,
    /// While a trace is recorded: who last advanced or failed the
    /// semaphore (thread and queue operation), for waiters' trace spans.
    woken_by: Option<String>,
    /// Queues that lend to waiters and have submissions that will signal
    /// this semaphore, each with the largest value they will signal
    /// (see [`Semaphore::signalled_by`]): the only work a thread blocked
    /// on the semaphore runs while it polls.
    signallers: Vec<(u64, Weak<dyn Helper>)>,
}

/// A semaphore timepoint exported as a host wait primitive (see
/// [`Semaphore::export_timepoint`]).
pub struct ExportedTimepoint {
    source: Arc<Semaphore>,
    value: u64,
    event: Arc<Event>,
}

impl ExportedTimepoint {
    /// The wait primitive: set when the timepoint is reached.
    pub fn event(&self) -> &Arc<Event> {
        &self.event
    }
}

/// How many semaphore failures this process has seen. A fence that found
/// all its timepoints reached while the count was N may answer "reached"
/// again without locking for as long as the count is still N: none of its
/// semaphores can have failed meanwhile (payloads only grow, and a
/// semaphore is reset only once nothing else holds it).
static FAILURES: AtomicU64 = AtomicU64::new(0);

/// The current [`FAILURES`] count (see `Fence::query`). Read it before
/// checking timepoints: a failure after the read changes the count.
#[inline]
pub(crate) fn failure_epoch() -> u64 {
    FAILURES.load(Ordering::Acquire)
}

/// A timeline semaphore. Shared as `Arc<Semaphore>`.
pub struct Semaphore {
    state: Mutex<State>,
    cond: Condvar,
    /// The payload, published after each change under `state`'s lock, and
    /// whether the semaphore failed: lets "is value V reached?" be answered
    /// without the lock when it is (the common case on queue paths). Only a
    /// positive answer is taken from here; anything else asks `state`.
    published: AtomicU64,
    failed: AtomicBool,
    /// A device's copy of the payload, once a device attached one.
    timeline: std::sync::OnceLock<Arc<dyn DeviceTimeline>>,
}

impl RefObject for Semaphore {
    fn type_name(&self) -> &'static str {
        "hal.semaphore"
    }
}

impl fmt::Debug for Semaphore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let s = self.state.lock();
        match &s.failure {
            None => write!(f, "Semaphore(value={})", s.value),
            Some(e) => write!(f, "Semaphore(failed: {e})"),
        }
    }
}

/// Most semaphores a thread keeps for reuse (see [`Semaphore::recycle`]).
const SPARE_SEMAPHORES: usize = 16;

thread_local! {
    /// Semaphores whose last reference was given back on this thread, reset
    /// to a fresh state: every queue operation of a compiled program creates
    /// a fence with a new semaphore, and reuse saves an allocation and a
    /// free on that path.
    static SPARE: std::cell::RefCell<Vec<Arc<Semaphore>>> =
        const { std::cell::RefCell::new(Vec::new()) };
}

impl Semaphore {
    /// A new semaphore with payload `initial_value`.
    pub fn new(initial_value: u64) -> Arc<Semaphore> {
        let spare = SPARE
            .try_with(|spare| spare.borrow_mut().pop())
            .ok()
            .flatten();
        if let Some(mut sem) = spare {
            // Spares are unique (checked when recycled, and nothing else
            // can reach them since) and already reset.
            if let Some(s) = Arc::get_mut(&mut sem) {
                s.state.get_mut().value = initial_value;
                *s.published.get_mut() = initial_value;
                return sem;
            }
        }
        Arc::new(Semaphore {
            state: Mutex::new(State {
                value: initial_value,
                failure: None,
                notifiers: Vec::new(),
                callbacks: Vec::new(),
                sleeping: 0,
                held: Vec::new(),
                woken_by: None,
                signallers: Vec::new(),
            }),
            cond: Condvar::new(),
            published: AtomicU64::new(initial_value),
            failed: AtomicBool::new(false),
            timeline: std::sync::OnceLock::new(),
        })
    }

    /// True when the payload has reached `value` and the semaphore has not
    /// failed, read without locking; false means "ask under the lock".
    #[inline]
    pub(crate) fn reached_fast(&self, value: u64) -> bool {
        !self.failed.load(Ordering::Acquire) && self.published.load(Ordering::Acquire) >= value
    }

    /// Puts a semaphore nobody else can reach back to a fresh state with
    /// payload `value` (callers hold it through `&mut`, so it is unshared).
    pub(crate) fn reset(&mut self, value: u64) {
        let state = self.state.get_mut();
        state.value = value;
        state.failure = None;
        *self.published.get_mut() = value;
        *self.failed.get_mut() = false;
        state.notifiers.clear();
        state.sleeping = 0;
        state.callbacks.clear();
        state.woken_by = None;
        // Checked first: the clear's drop loop costs a recycled
        // semaphore (one per queue operation) about 20 instructions.
        if !state.signallers.is_empty() {
            state.signallers.clear();
        }
        for (_, h) in state.held.drain(..) {
            h.settled();
        }
        self.timeline = std::sync::OnceLock::new();
    }

    /// The device timeline attached to this semaphore, attaching the one
    /// `make` builds when there is none yet (the first device to ask owns
    /// it; others see it and decide whether they can use it). After
    /// attaching, the current payload (or failure) is forwarded to it, so
    /// no signal between the device's read and the attach is lost.
    pub fn device_timeline(
        &self,
        make: impl FnOnce() -> Result<Arc<dyn DeviceTimeline>>,
    ) -> Result<Arc<dyn DeviceTimeline>> {
        if let Some(t) = self.timeline.get() {
            return Ok(t.clone());
        }
        let made = make()?;
        let t = self.timeline.get_or_init(|| made).clone();
        match self.query() {
            Ok(v) => t.advanced(v),
            Err(_) => t.failed(),
        }
        Ok(t)
    }

    /// The attached device timeline, if any.
    pub fn attached_timeline(&self) -> Option<&Arc<dyn DeviceTimeline>> {
        self.timeline.get()
    }

    /// Takes back a semaphore the caller holds the only reference to, for a
    /// later [`Semaphore::new`] on this thread; shared ones are just dropped.
    pub fn recycle(mut sem: Arc<Semaphore>) {
        let Some(s) = Arc::get_mut(&mut sem) else {
            return;
        };
        // Dropping waiters and callbacks may run arbitrary code: done here,
        // before touching the thread's spare list.
        s.reset(0);
        let _ = SPARE.try_with(|spare| {
            if let Ok(mut spare) = spare.try_borrow_mut() {
                if spare.len() < SPARE_SEMAPHORES {
                    spare.push(sem);
                }
            }
        });
    }

    /// The current payload, or the failure status once failed. Lets the
    /// attached device report finished work first, so a caller polling
    /// with `query` sees it.
    pub fn query(&self) -> Result<u64> {
        self.poll_device();
        let s = self.state.lock();
        match &s.failure {
            Some(e) => Err(e.clone()),
            None => Ok(s.value),
        }
    }

    /// The failure status, if the semaphore has failed.
    pub fn failure(&self) -> Option<Status> {
        self.state.lock().failure.clone()
    }

    /// Advances the payload to `value`, waking waiters and running callbacks
    /// whose values are reached. `INVALID_ARGUMENT` when `value` is not
    /// greater than the current payload (as upstream:
    /// "semaphore already signaled past V"). Signalling a failed semaphore
    /// is ignored (the failure stays), as upstream's runtime does.
    pub fn signal(&self, value: u64) -> Result<()> {
        let (ready, notify) = {
            let mut s = self.state.lock();
            if s.failure.is_some() {
                return Ok(());
            }
            if value <= s.value {
                bail!(InvalidArgument, "semaphore already signaled past {value}");
            }
            // Device uses of the work signalling `value` end before anyone
            // can see it reached; the Arcs are dropped after the lock.
            let released = if s.held.is_empty() {
                Vec::new()
            } else {
                let r = take_where(&mut s.held, |(v, _)| *v <= value);
                for (_, h) in &r {
                    h.settled();
                }
                r
            };
            s.value = value;
            if ferrite_base::trace::enabled() {
                s.woken_by = Some(ferrite_base::trace::doing());
            }
            s.forget_signallers_up_to(value);
            self.published.store(value, Ordering::Release);
            if let Some(t) = self.timeline.get() {
                t.advanced(value);
            }
            if s.callbacks.is_empty() && s.notifiers.is_empty() {
                // Nobody scheduled on this semaphore: only blocked waiters
                // (if any) need waking.
                drop(s);
                drop(released);
                self.cond.notify_all();
                return Ok(());
            }
            let ready = take_where(&mut s.callbacks, |(v, _)| *v <= value);
            let notify: Vec<Arc<Notifier>> = s
                .notifiers
                .iter()
                .filter(|(v, _)| *v <= value)
                .map(|(_, n)| n.clone())
                .collect();
            drop(s);
            drop(released);
            (ready, notify)
        };
        self.cond.notify_all();
        for n in notify {
            n.notify();
        }
        let mut ready = ready;
        ready.sort_by_key(|(v, _)| *v);
        for (_, cb) in ready {
            cb(Ok(()));
        }
        Ok(())
    }

    /// [`Semaphore::signal`] when nothing is scheduled on the semaphore
    /// (no callbacks or subscribed waiters, whose code must not run under a
    /// caller's lock): Some(outcome) when handled, None to call `signal`.
    pub(crate) fn signal_quiet(&self, value: u64) -> Option<Result<()>> {
        let mut s = self.state.lock();
        if s.failure.is_some()
            || value <= s.value
            || !s.callbacks.is_empty()
            || !s.notifiers.is_empty()
            || !s.held.is_empty()
        {
            return None;
        }
        s.value = value;
        if ferrite_base::trace::enabled() {
            s.woken_by = Some(ferrite_base::trace::doing());
        }
        s.forget_signallers_up_to(value);
        self.published.store(value, Ordering::Release);
        if let Some(t) = self.timeline.get() {
            t.advanced(value);
        }
        drop(s);
        self.cond.notify_all();
        Some(Ok(()))
    }

    /// Fails the semaphore with `status` (the first failure wins). Every
    /// waiter, present and future, sees it; pending callbacks run with it.
    pub fn fail(&self, status: Status) {
        let (callbacks, notify, status) = {
            let mut s = self.state.lock();
            if s.failure.is_some() {
                return;
            }
            let status = if status.code() == StatusCode::Ok {
                Status::new(
                    StatusCode::Unknown,
                    format!(
                        "semaphore failed without an error code: {}",
                        status.message()
                    ),
                )
            } else {
                status
            };
            let released = std::mem::take(&mut s.held);
            for (_, h) in &released {
                h.settled();
            }
            // Nothing will signal it any more.
            s.signallers.clear();
            s.failure = Some(status.clone());
            if ferrite_base::trace::enabled() {
                s.woken_by = Some(ferrite_base::trace::doing());
            }
            self.failed.store(true, Ordering::Release);
            // After `failed`: whoever sees the new count sees the flag.
            FAILURES.fetch_add(1, Ordering::AcqRel);
            let callbacks = std::mem::take(&mut s.callbacks);
            let notify: Vec<Arc<Notifier>> = s.notifiers.iter().map(|(_, n)| n.clone()).collect();
            drop(s);
            drop(released);
            (callbacks, notify, status)
        };
        if let Some(t) = self.timeline.get() {
            t.failed();
        }
        self.cond.notify_all();
        for n in notify {
            n.notify();
        }
        for (_, cb) in callbacks {
            cb(Err(status.clone()));
        }
    }

    /// Blocks until the payload reaches `value` (`Ok`), the semaphore fails
    /// (its status), or the timeout passes (`DEADLINE_EXCEEDED`).
    pub fn wait(&self, value: u64, timeout: Timeout) -> Result<()> {
        self.wait_until(value, timeout.to_deadline())
    }

    /// [`Semaphore::wait`] with an absolute deadline.
    pub fn wait_until(&self, value: u64, deadline: Deadline) -> Result<()> {
        if self.reached_fast(value) {
            return Ok(());
        }
        {
            // Most waits find the value already reached.
            let s = self.state.lock();
            if let Some(e) = &s.failure {
                return Err(e.clone());
            }
            if s.value >= value {
                return Ok(());
            }
        }
        if ferrite_base::trace::enabled() {
            let start = ferrite_base::trace::now_ns();
            let outcome = self.wait_blocking(value, deadline);
            self.trace_wait(start, value, &outcome);
            return outcome;
        }
        self.wait_blocking(value, deadline)
    }

    /// Who last advanced or failed this semaphore while a trace was
    /// recorded (thread and queue operation).
    pub(crate) fn woken_by(&self) -> Option<String> {
        self.state.lock().woken_by.clone()
    }

    /// Records a wait that blocked: how long, for what, and who woke it.
    fn trace_wait(&self, start: u64, value: u64, outcome: &Result<()>) {
        use ferrite_base::trace::Arg;
        let woken_by = self.woken_by();
        let mut args = vec![("value", Arg::U64(value))];
        if let Some(w) = woken_by {
            args.push(("woken_by", Arg::Str(w)));
        }
        if let Err(e) = outcome {
            args.push(("failed", Arg::Str(e.to_string())));
        }
        ferrite_base::trace::complete(
            "wait",
            "semaphore wait",
            ferrite_base::trace::HOST_TRACK,
            start,
            args,
        );
    }

    /// The blocking part of [`Semaphore::wait_until`] (the value was not
    /// reached when it was first checked).
    fn wait_blocking(&self, value: u64, deadline: Deadline) -> Result<()> {
        let mut helpers = Helpers::new();
        if lends(deadline) {
            self.helpers_into(&mut helpers);
        }
        ferrite_base::wait::spin_until(deadline, &helpers, || {
            self.poll_device();
            let s = self.state.lock();
            s.failure.is_some() || s.value >= value
        });
        let mut s = self.state.lock();
        loop {
            if let Some(e) = &s.failure {
                return Err(e.clone());
            }
            if s.value >= value {
                return Ok(());
            }
            if matches!(deadline, Deadline::InfinitePast) {
                return Err(Status::new(
                    StatusCode::DeadlineExceeded,
                    format!(
                        "timed out waiting for semaphore to reach {value} (at {})",
                        s.value
                    ),
                ));
            }
            s.sleeping += 1;
            if s.sleeping == 1 {
                // Registered first, then the device is told (outside the
                // lock): a device that enqueues after this sees the sleeper.
                parking_lot::MutexGuard::unlocked(&mut s, || self.watch_device());
                if s.failure.is_some() || s.value >= value {
                    s.sleeping -= 1;
                    continue;
                }
            }
            let timed_out = match deadline {
                Deadline::InfinitePast => true,
                Deadline::InfiniteFuture => {
                    self.cond.wait(&mut s);
                    false
                }
                Deadline::At(t) => self.cond.wait_until(&mut s, t).timed_out(),
            };
            s.sleeping -= 1;
            if timed_out {
                if let Some(e) = &s.failure {
                    return Err(e.clone());
                }
                if s.value >= value {
                    return Ok(());
                }
                return Err(Status::new(
                    StatusCode::DeadlineExceeded,
                    format!(
                        "timed out waiting for semaphore to reach {value} (at {})",
                        s.value
                    ),
                ));
            }
        }
    }

    /// Exports the timepoint `value` as a host wait primitive: an
    /// [`ExportedTimepoint`] whose event is set when the semaphore reaches
    /// `value`, or failed with the semaphore's failure.
    pub fn export_timepoint(self: &Arc<Self>, value: u64) -> ExportedTimepoint {
        let event = Event::new();
        let e = event.clone();
        self.on_reached(
            value,
            Box::new(move |outcome| match outcome {
                Ok(()) => e.set(),
                Err(status) => e.fail(status),
            }),
        );
        ExportedTimepoint {
            source: self.clone(),
            value,
            event,
        }
    }

    /// Imports `timepoint` as `value` of this semaphore: once the timepoint
    /// is reached this semaphore is signalled to `value` (if still below
    /// it); a failure of the timepoint's source fails this semaphore.
    pub fn import_timepoint(self: &Arc<Self>, value: u64, timepoint: &ExportedTimepoint) {
        let target = self.clone();
        timepoint.source.on_reached(
            timepoint.value,
            Box::new(move |outcome| match outcome {
                Ok(()) => {
                    if target.query().is_ok_and(|v| v < value) {
                        // Racing signals may pass `value` first; then there
                        // is nothing left to do.
                        let _ = target.signal(value);
                    }
                }
                Err(status) => target.fail(status),
            }),
        );
    }

    /// Runs `callback` once the payload reaches `value` (`Ok`) or the
    /// semaphore fails (`Err`); immediately, on this thread, if either has
    /// already happened.
    pub fn on_reached(&self, value: u64, callback: TimepointCallback) {
        let immediate = {
            let mut s = self.state.lock();
            if let Some(e) = &s.failure {
                Some(Err(e.clone()))
            } else if s.value >= value {
                Some(Ok(()))
            } else {
                s.callbacks.push((value, callback));
                drop(s);
                self.watch_device();
                return;
            }
        };
        if let Some(r) = immediate {
            callback(r);
        }
    }

    /// Keeps a submission's device uses until the payload reaches `value`
    /// or the semaphore fails; settles them at once when either has
    /// already happened. Settling happens under the lock, before the
    /// reached value is published.
    pub(crate) fn hold_until(&self, value: u64, uses: Arc<SubmissionUses>) {
        {
            let mut s = self.state.lock();
            if s.failure.is_none() && s.value < value {
                s.held.push((value, uses));
                drop(s);
                // The device must report the signal without a host waiter.
                self.watch_device();
                return;
            }
        }
        uses.settled();
    }

    /// Tells the semaphore that `queue`'s pending work will signal it to
    /// `value`: until the payload reaches `value` (or the semaphore
    /// fails), a thread blocked waiting on it may run `queue`'s ready work
    /// while it polls ([`ferrite_base::wait::Helper`]). A device whose
    /// queue lends to waiters calls this for each semaphore a submission
    /// signals, before the submission can run; one entry per queue is kept
    /// (the largest value). No queue named here: waiters only wait.
    pub fn signalled_by(&self, value: u64, queue: &Weak<dyn Helper>) {
        let mut s = self.state.lock();
        if s.failure.is_some() || s.value >= value {
            return;
        }
        match s
            .signallers
            .iter_mut()
            .find(|(_, q)| Weak::ptr_eq(q, queue))
        {
            Some((v, _)) => *v = (*v).max(value),
            None => s.signallers.push((value, queue.clone())),
        }
    }

    /// Adds the live queues that will signal this semaphore (see
    /// [`Semaphore::signalled_by`]) to `out`.
    pub(crate) fn helpers_into(&self, out: &mut Helpers) {
        let s = self.state.lock();
        for (_, q) in &s.signallers {
            if let Some(q) = q.upgrade() {
                add_helper(out, q);
            }
        }
    }

    /// A wait source for `self` reaching `value`.
    pub fn timepoint(self: &Arc<Self>, value: u64) -> Arc<Timepoint> {
        Arc::new(Timepoint {
            semaphore: self.clone(),
            value,
        })
    }

    /// True when a thread sleeps on the semaphore, a waiter is subscribed
    /// or a callback is registered: waiters that do not poll, for which a
    /// device must report completions on its own (see
    /// [`DeviceTimeline::watch`]).
    pub fn has_sleepers(&self) -> bool {
        let s = self.state.lock();
        s.sleeping > 0 || !s.notifiers.is_empty() || !s.callbacks.is_empty()
    }

    #[inline]
    fn watch_device(&self) {
        if let Some(t) = self.timeline.get() {
            t.watch();
        }
    }

    /// Lets the attached device report finished work (see
    /// [`DeviceTimeline::poll`]).
    #[inline]
    fn poll_device(&self) {
        if let Some(t) = self.timeline.get() {
            t.poll();
        }
    }

    fn poll_value(&self, value: u64) -> Result<bool> {
        if !self.reached_fast(value) {
            self.poll_device();
        }
        let s = self.state.lock();
        match &s.failure {
            Some(e) => Err(e.clone()),
            None => Ok(s.value >= value),
        }
    }

    fn subscribe_at(&self, value: u64, notifier: &Arc<Notifier>) {
        self.state.lock().notifiers.push((value, notifier.clone()));
        self.watch_device();
    }

    fn unsubscribe_all(&self, notifier: &Arc<Notifier>) {
        self.state
            .lock()
            .notifiers
            .retain(|(_, n)| !Arc::ptr_eq(n, notifier));
    }
}

impl State {
    /// The payload reached `value`: queues whose signals it covers have
    /// nothing more to signal here.
    #[inline]
    fn forget_signallers_up_to(&mut self, value: u64) {
        if !self.signallers.is_empty() {
            self.signallers.retain(|(v, _)| *v > value);
        }
    }
}

/// Removes and returns the items matching `pred`, keeping both sides in
/// their original order.
fn take_where<T>(v: &mut Vec<T>, pred: impl Fn(&T) -> bool) -> Vec<T> {
    let (taken, kept): (Vec<T>, Vec<T>) = std::mem::take(v).into_iter().partition(|x| pred(x));
    *v = kept;
    taken
}

/// A (semaphore, value) pair usable as a [`WaitSource`].
#[derive(Clone)]
pub struct Timepoint {
    /// The semaphore.
    pub semaphore: Arc<Semaphore>,
    /// The payload value waited for.
    pub value: u64,
}

impl fmt::Debug for Timepoint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Timepoint({:?} >= {})", self.semaphore, self.value)
    }
}

impl WaitSource for Timepoint {
    fn poll(&self) -> Result<bool> {
        self.semaphore.poll_value(self.value)
    }

    fn subscribe(&self, notifier: &Arc<Notifier>) {
        self.semaphore.subscribe_at(self.value, notifier);
    }

    /// Removes every subscription of `notifier` on this semaphore.
    fn unsubscribe(&self, notifier: &Arc<Notifier>) {
        self.semaphore.unsubscribe_all(notifier);
    }

    fn helpers(&self, out: &mut Helpers) {
        self.semaphore.helpers_into(out);
    }
}

/// Waits on several (semaphore, value) timepoints: all of them or any one.
/// `DEADLINE_EXCEEDED` on timeout; a failed semaphore's status as soon as
/// the wait sees it.
pub fn wait_multi(
    timepoints: &[(Arc<Semaphore>, u64)],
    mode: WaitMode,
    timeout: Timeout,
) -> Result<()> {
    let deadline = timeout.to_deadline();
    if let [(sem, value)] = timepoints {
        return sem.wait_until(*value, deadline);
    }
    let sources: Vec<Arc<dyn WaitSource>> = timepoints
        .iter()
        .map(|(s, v)| s.timepoint(*v) as Arc<dyn WaitSource>)
        .collect();
    wait_sources(&sources, mode, deadline)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicU64, Ordering};
    use std::thread;
    use std::time::{Duration, Instant};

    #[test]
    fn signal_query_and_monotonic() {
        let s = Semaphore::new(1);
        assert_eq!(s.query().unwrap(), 1);
        s.signal(5).unwrap();
        assert_eq!(s.query().unwrap(), 5);
        let e = s.signal(5).unwrap_err();
        assert_eq!(e.code(), StatusCode::InvalidArgument);
        assert_eq!(e.message(), "semaphore already signaled past 5");
        assert!(s.signal(3).is_err());
        s.wait(4, Timeout::IMMEDIATE).unwrap();
    }

    #[test]
    fn wait_across_threads() {
        let s = Semaphore::new(0);
        let t = thread::spawn({
            let s = s.clone();
            move || {
                for v in 1..=3 {
                    thread::sleep(Duration::from_millis(5));
                    s.signal(v).unwrap();
                }
            }
        });
        s.wait(3, Timeout::INFINITE).unwrap();
        assert_eq!(s.query().unwrap(), 3);
        t.join().unwrap();
    }

    #[test]
    fn timeout_is_deadline_exceeded_on_time() {
        let s = Semaphore::new(0);
        let start = Instant::now();
        let e = s
            .wait(1, Timeout::from_duration(Duration::from_millis(30)))
            .unwrap_err();
        let took = start.elapsed();
        assert_eq!(e.code(), StatusCode::DeadlineExceeded);
        assert!(
            took >= Duration::from_millis(30) && took < Duration::from_millis(500),
            "{took:?}"
        );
        let e = s.wait(1, Timeout::IMMEDIATE).unwrap_err();
        assert_eq!(e.code(), StatusCode::DeadlineExceeded);
    }

    #[test]
    fn failure_seen_by_present_and_future_waiters() {
        let s = Semaphore::new(0);
        let early = thread::spawn({
            let s = s.clone();
            move || s.wait(10, Timeout::INFINITE)
        });
        thread::sleep(Duration::from_millis(10));
        s.fail(Status::new(StatusCode::Aborted, "device lost"));
        let e = early.join().unwrap().unwrap_err();
        assert_eq!(e.code(), StatusCode::Aborted);
        assert_eq!(e.message(), "device lost");
        // A later waiter, even for an already-reached value, sees the failure.
        let e = s.wait(0, Timeout::INFINITE).unwrap_err();
        assert_eq!(e.code(), StatusCode::Aborted);
        assert_eq!(s.query().unwrap_err().code(), StatusCode::Aborted);
        // Signals after failure are ignored; the failure stays.
        s.signal(20).unwrap();
        assert!(s.query().is_err());
        s.fail(Status::new(StatusCode::Internal, "second"));
        assert_eq!(s.failure().unwrap().code(), StatusCode::Aborted);
    }

    #[test]
    fn callbacks() {
        let s = Semaphore::new(0);
        let seen = Arc::new(AtomicU64::new(0));
        for v in [3u64, 1, 2] {
            let seen = seen.clone();
            s.on_reached(
                v,
                Box::new(move |r| {
                    if r.is_ok() {
                        seen.fetch_add(v * 10, Ordering::SeqCst);
                    }
                }),
            );
        }
        s.signal(2).unwrap();
        assert_eq!(seen.load(Ordering::SeqCst), 30);
        // Already reached: runs now.
        let seen2 = seen.clone();
        s.on_reached(
            1,
            Box::new(move |r| {
                r.unwrap();
                seen2.fetch_add(1, Ordering::SeqCst);
            }),
        );
        assert_eq!(seen.load(Ordering::SeqCst), 31);
        let failed = Arc::new(Mutex::new(None));
        let f2 = failed.clone();
        s.on_reached(
            9,
            Box::new(move |r| *f2.lock() = Some(r.unwrap_err().code())),
        );
        s.fail(Status::new(StatusCode::DataLoss, "x"));
        assert_eq!(*failed.lock(), Some(StatusCode::DataLoss));
        // The value-3 callback ran with the failure (not counted as reached).
        assert_eq!(seen.load(Ordering::SeqCst), 31);
        assert!(s.state.lock().callbacks.is_empty());
        let f3 = failed.clone();
        s.on_reached(
            0,
            Box::new(move |r| *f3.lock() = Some(r.unwrap_err().code())),
        );
    }

    #[test]
    fn multi_wait_any_all() {
        let a = Semaphore::new(0);
        let b = Semaphore::new(0);
        let tps = vec![(a.clone(), 1), (b.clone(), 1)];
        let t = thread::spawn({
            let b = b.clone();
            move || {
                thread::sleep(Duration::from_millis(10));
                b.signal(1).unwrap();
            }
        });
        wait_multi(&tps, WaitMode::Any, Timeout::INFINITE).unwrap();
        t.join().unwrap();
        let e = wait_multi(
            &tps,
            WaitMode::All,
            Timeout::from_duration(Duration::from_millis(10)),
        )
        .unwrap_err();
        assert_eq!(e.code(), StatusCode::DeadlineExceeded);
        let t = thread::spawn({
            let a = a.clone();
            move || {
                thread::sleep(Duration::from_millis(10));
                a.signal(2).unwrap();
            }
        });
        wait_multi(&tps, WaitMode::All, Timeout::INFINITE).unwrap();
        t.join().unwrap();
        // Failure wakes a multi-wait.
        let c = Semaphore::new(0);
        let tps = vec![(a.clone(), 5), (c.clone(), 1)];
        let t = thread::spawn({
            let c = c.clone();
            move || {
                thread::sleep(Duration::from_millis(10));
                c.fail(Status::new(StatusCode::Cancelled, "stop"));
            }
        });
        let e = wait_multi(&tps, WaitMode::All, Timeout::INFINITE).unwrap_err();
        assert_eq!(e.code(), StatusCode::Cancelled);
        t.join().unwrap();
        // Subscriptions are cleaned up.
        assert!(a.state.lock().notifiers.is_empty());
        assert!(wait_multi(&[], WaitMode::All, Timeout::IMMEDIATE).is_ok());
    }

    /// A queue that never has work (only its identity matters here).
    struct Idle;

    impl Helper for Idle {
        fn start_polling(&self) {}
        fn help_one(&self) -> bool {
            false
        }
        fn stop_polling(&self) {}
    }

    fn named(s: &Semaphore) -> usize {
        let mut helpers = Helpers::new();
        s.helpers_into(&mut helpers);
        helpers.len()
    }

    #[test]
    fn waiters_lend_only_to_queues_with_signals_pending() {
        let queue: Arc<dyn Helper> = Arc::new(Idle);
        let weak = Arc::downgrade(&queue);
        let s = Semaphore::new(0);
        assert_eq!(named(&s), 0, "a semaphore the host signals names no queue");
        s.signalled_by(2, &weak);
        s.signalled_by(1, &weak);
        assert_eq!(named(&s), 1, "one entry per queue");
        s.signal(1).unwrap();
        assert_eq!(named(&s), 1, "value 2 is still to come");
        s.signal(2).unwrap();
        assert_eq!(named(&s), 0, "reached: nothing left to signal");
        s.signalled_by(2, &weak);
        assert_eq!(named(&s), 0, "a reached value names no queue");
        s.signalled_by(3, &weak);
        let other: Arc<dyn Helper> = Arc::new(Idle);
        s.signalled_by(4, &Arc::downgrade(&other));
        assert_eq!(named(&s), 2);
        drop(other);
        assert_eq!(named(&s), 1, "a dropped queue is not lent to");
        s.fail(Status::new(StatusCode::Aborted, "x"));
        assert_eq!(named(&s), 0, "a failed semaphore names no queue");
    }

    #[test]
    fn exported_timepoints_follow_the_semaphore() {
        let s = Semaphore::new(0);
        let at2 = s.export_timepoint(2).event().clone();
        let at0 = s.export_timepoint(0).event().clone();
        assert!(at0.poll().unwrap(), "a reached value exports a set event");
        assert!(!at2.poll().unwrap());
        s.signal(1).unwrap();
        assert!(!at2.poll().unwrap());
        s.signal(2).unwrap();
        assert!(at2.poll().unwrap());
        let at5 = s.export_timepoint(5);
        let imported = Semaphore::new(0);
        imported.import_timepoint(7, &at5);
        s.signal(5).unwrap();
        assert_eq!(
            imported.query().unwrap(),
            7,
            "an import signals on the source's reach"
        );
        let at9 = s.export_timepoint(9);
        imported.import_timepoint(8, &at9);
        s.fail(Status::new(StatusCode::Aborted, "gone"));
        let e = at9.event().poll().unwrap_err();
        assert_eq!(e.code(), StatusCode::Aborted);
        assert!(
            imported.query().is_err(),
            "a failed source fails the importer"
        );
        assert!(
            s.export_timepoint(10).event().poll().is_err(),
            "failure stays"
        );
    }
}
