//! Wait sources and the one blocking-wait loop every layer shares.
//!
//! A [`WaitSource`] is anything that becomes ready (or fails) later: a HAL
//! timeline semaphore reaching a value, an [`Event`] being set. Waiters poll
//! for a short, bounded time first ([`SPIN`], pausing between polls
//! without yielding the CPU: a handoff to another thread usually completes
//! within it, and a yield on a busy machine gives the CPU away for a whole
//! scheduler time slice), then
//! subscribe a [`Notifier`] to each source, re-check, and sleep on the
//! notifier's condition variable until a source reports a change or the
//! deadline passes. Nothing waits by spinning beyond that bound.
//!
//! While it polls, a waiter first lends its thread to ready queued work
//! ([`Helper`]s, e.g. the `local-task` worker pool): on a host with few
//! cores, the waiter running the submission it waits for itself beats
//! handing it to a worker that must first be woken, and the thread would
//! otherwise only yield.
//!
//! Asynchronous waiters use the same subscription path without a thread:
//! a [`Notifier`] also holds a task's [`Waker`], woken by the same
//! [`Notifier::notify`] that wakes sleeping threads; [`future::SourcesWait`]
//! is the wait as a future (see its module).

use crate::status::{Result, Status, StatusCode};
use crate::time::Deadline;
use parking_lot::{Condvar, Mutex};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, RwLock, Weak};
use std::task::Waker;
use std::time::{Duration, Instant};

pub mod future;
mod timer;

/// How long a blocking wait keeps polling before it sleeps.
pub const SPIN: Duration = Duration::from_micros(50);

/// Polls `ready` (pausing between polls) until it answers true or
/// [`SPIN`] (or `deadline`, when sooner) passes; returns its last answer.
/// Blocking waits call this before they sleep.
/// While it polls, the caller runs ready work from registered [`Helper`]s;
/// time spent running work does not count against the polling bound. Only
/// waits without a deadline lend their thread: a job's length is unknown,
/// and a bounded wait must return on time.
pub fn spin_until(deadline: Deadline, mut ready: impl FnMut() -> bool) -> bool {
    if ready() {
        return true;
    }
    if deadline.has_passed() {
        return false;
    }
    let helpers = if matches!(deadline, Deadline::InfiniteFuture) {
        start_helping()
    } else {
        Vec::new()
    };
    let mut start = Instant::now();
    let answer = loop {
        if ready() {
            break true;
        }
        if deadline.has_passed() {
            break false;
        }
        if helpers.iter().any(|h| h.help_one()) {
            start = Instant::now();
            continue;
        }
        if start.elapsed() >= SPIN {
            break false;
        }
        // A pause, not a yield: on a loaded machine a yield hands the CPU
        // to another runnable process for its whole time slice (0.75-3 ms
        // with Linux's EEVDF scheduler), far beyond the spin's bound.
        for _ in 0..32 {
            std::hint::spin_loop();
        }
    };
    for h in &helpers {
        h.stop_polling();
    }
    answer
}

/// A source of ready work that a blocked waiter may run on its own thread
/// instead of idling (register with [`register_helper`]).
///
/// Devices own this choice: a device whose queue lends its work registers
/// itself (the `local-task` device does unless told not to) and stays
/// registered while its [`HelperRegistration`] lives. The registry is
/// process-wide because a waiter cannot tell which device will signal what
/// it waits for: every blocked waiter (without a deadline) polls every
/// registered helper.
///
/// A waiter announces itself with [`Helper::start_polling`] before its first
/// [`Helper::help_one`] and leaves with [`Helper::stop_polling`]: while some
/// thread polls, the source may skip waking its own threads for new work,
/// and must make sure queued work is picked up once the last poller leaves.
pub trait Helper: Send + Sync {
    /// The calling thread starts polling for work.
    fn start_polling(&self);
    /// Runs one piece of ready work on the calling thread; false when none
    /// was ready. The work must not depend on anything the waiter holds: it
    /// is work that was already free to run on any thread.
    fn help_one(&self) -> bool;
    /// The calling thread stops polling (it goes to sleep or returns).
    fn stop_polling(&self);
}

/// Registered helpers, each with the id of its registration.
static HELPERS: RwLock<Vec<(u64, Weak<dyn Helper>)>> = RwLock::new(Vec::new());
/// Number of entries in `HELPERS`: waits skip the lock when it is zero.
static HELPER_COUNT: AtomicUsize = AtomicUsize::new(0);
static NEXT_REGISTRATION: AtomicU64 = AtomicU64::new(1);

/// Keeps a helper registered; dropping it unregisters the helper.
#[derive(Debug)]
pub struct HelperRegistration {
    id: u64,
}

impl Drop for HelperRegistration {
    fn drop(&mut self) {
        let mut helpers = HELPERS.write().unwrap_or_else(|e| e.into_inner());
        helpers.retain(|(id, _)| *id != self.id);
        HELPER_COUNT.store(helpers.len(), Ordering::Release);
    }
}

/// Lets blocked waiters run `helper`'s ready work until the returned
/// registration is dropped (or the helper itself is gone).
pub fn register_helper(helper: Weak<dyn Helper>) -> HelperRegistration {
    let id = NEXT_REGISTRATION.fetch_add(1, Ordering::Relaxed);
    let mut helpers = HELPERS.write().unwrap_or_else(|e| e.into_inner());
    helpers.retain(|(_, h)| h.strong_count() > 0);
    helpers.push((id, helper));
    HELPER_COUNT.store(helpers.len(), Ordering::Release);
    HelperRegistration { id }
}

/// Number of helpers registered now (for diagnostics and tests).
pub fn helper_count() -> usize {
    HELPER_COUNT.load(Ordering::Acquire)
}

/// The live helpers, each told that this thread starts polling it.
fn start_helping() -> Vec<Arc<dyn Helper>> {
    if HELPER_COUNT.load(Ordering::Acquire) == 0 {
        return Vec::new();
    }
    let helpers: Vec<Arc<dyn Helper>> = {
        let registered = HELPERS.read().unwrap_or_else(|e| e.into_inner());
        registered.iter().filter_map(|(_, h)| h.upgrade()).collect()
    };
    for h in &helpers {
        h.start_polling();
    }
    helpers
}

/// Whether a multi-wait needs every source or any one of them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WaitMode {
    /// Satisfied when all sources are ready.
    All,
    /// Satisfied when at least one source is ready.
    Any,
}

/// Wakes a sleeping waiter when a subscribed source changes state: a
/// thread asleep in [`Notifier::wait_for_change`], or a task whose
/// [`Waker`] was left with [`Notifier::set_waker`].
#[derive(Default, Debug)]
pub struct Notifier {
    generation: Mutex<u64>,
    cond: Condvar,
    /// The waker of the task waiting through this notifier, taken (and
    /// woken) by the next notification; the task leaves a new one each
    /// time it finds its wait still pending.
    waker: Mutex<Option<Waker>>,
}

impl Notifier {
    /// Creates a notifier ready to be subscribed.
    pub fn new() -> Arc<Notifier> {
        Arc::new(Notifier::default())
    }

    /// Signals that some subscribed source changed state: wakes sleeping
    /// threads and the task whose waker is held. Sources call it outside
    /// their own locks, because a waker may run arbitrary code (an executor
    /// that polls the task on the spot).
    pub fn notify(&self) {
        {
            let mut g = self.generation.lock();
            *g = g.wrapping_add(1);
            self.cond.notify_all();
        }
        let waker = self.waker.lock().take();
        if let Some(w) = waker {
            w.wake();
        }
    }

    /// Leaves `waker` to be woken by the next [`Notifier::notify`]
    /// (replacing any earlier one). A task sets it before it re-checks its
    /// sources, so a change that lands in between still wakes it.
    pub fn set_waker(&self, waker: &Waker) {
        let mut slot = self.waker.lock();
        match &*slot {
            Some(w) if w.will_wake(waker) => {}
            _ => *slot = Some(waker.clone()),
        }
    }

    /// Drops the waker left by [`Notifier::set_waker`], if any.
    pub fn clear_waker(&self) {
        let old = self.waker.lock().take();
        drop(old);
    }

    /// The current generation; pass it to [`Notifier::wait_for_change`].
    pub fn generation(&self) -> u64 {
        *self.generation.lock()
    }

    /// Sleeps until the generation moves past `seen` or `deadline` passes.
    /// Returns false on deadline.
    pub fn wait_for_change(&self, seen: u64, deadline: Deadline) -> bool {
        let mut g = self.generation.lock();
        while *g == seen {
            match deadline {
                Deadline::InfinitePast => return false,
                Deadline::InfiniteFuture => self.cond.wait(&mut g),
                Deadline::At(t) => {
                    if self.cond.wait_until(&mut g, t).timed_out() {
                        return *g != seen;
                    }
                }
            }
        }
        true
    }
}

/// Something a waiter can block on until it is ready or failed.
pub trait WaitSource: Send + Sync {
    /// `Ok(true)` when ready, `Ok(false)` when pending, `Err` once failed
    /// (a failure is sticky: every later poll returns it too).
    fn poll(&self) -> Result<bool>;
    /// Registers `notifier` to be woken on any later state change.
    fn subscribe(&self, notifier: &Arc<Notifier>);
    /// Removes a notifier registered by [`WaitSource::subscribe`].
    fn unsubscribe(&self, notifier: &Arc<Notifier>);
}

/// Polls `sources` once; `Ok(true)` when the mode is satisfied.
pub fn poll_sources(sources: &[Arc<dyn WaitSource>], mode: WaitMode) -> Result<bool> {
    if sources.is_empty() {
        return Ok(true);
    }
    let mut all = true;
    for s in sources {
        let ready = s.poll()?;
        if ready && mode == WaitMode::Any {
            return Ok(true);
        }
        all &= ready;
    }
    Ok(all && mode == WaitMode::All)
}

/// Blocks until `sources` satisfy `mode`, a source fails (its status is
/// returned), or `deadline` passes (`DEADLINE_EXCEEDED`).
pub fn wait_sources(
    sources: &[Arc<dyn WaitSource>],
    mode: WaitMode,
    deadline: Deadline,
) -> Result<()> {
    let mut failure = None;
    let ready = spin_until(deadline, || match poll_sources(sources, mode) {
        Ok(r) => r,
        Err(e) => {
            failure = Some(e);
            true
        }
    });
    if let Some(e) = failure {
        return Err(e);
    }
    if ready {
        return Ok(());
    }
    let notifier = Notifier::new();
    for s in sources {
        s.subscribe(&notifier);
    }
    let result = (|| loop {
        let seen = notifier.generation();
        if poll_sources(sources, mode)? {
            return Ok(());
        }
        if deadline.has_passed() || !notifier.wait_for_change(seen, deadline) {
            // One last look: the change may have raced the deadline.
            if poll_sources(sources, mode)? {
                return Ok(());
            }
            return Err(Status::new(
                StatusCode::DeadlineExceeded,
                "wait deadline exceeded",
            ));
        }
    })();
    for s in sources {
        s.unsubscribe(&notifier);
    }
    result
}

/// A one-shot event: a minimal [`WaitSource`] that is set once (or failed).
#[derive(Default)]
pub struct Event {
    state: Mutex<EventState>,
}

#[derive(Default)]
struct EventState {
    outcome: Option<Result<()>>,
    subscribers: Vec<Arc<Notifier>>,
}

impl Event {
    /// A new, unset event.
    pub fn new() -> Arc<Event> {
        Arc::new(Event::default())
    }

    /// Sets the event (ready); later sets are ignored.
    pub fn set(&self) {
        self.finish(Ok(()));
    }

    /// Fails the event: every waiter sees `status`.
    pub fn fail(&self, status: Status) {
        self.finish(Err(status));
    }

    fn finish(&self, outcome: Result<()>) {
        let subs = {
            let mut st = self.state.lock();
            if st.outcome.is_some() {
                return;
            }
            st.outcome = Some(outcome);
            st.subscribers.clone()
        };
        for n in subs {
            n.notify();
        }
    }
}

impl WaitSource for Event {
    fn poll(&self) -> Result<bool> {
        match &self.state.lock().outcome {
            None => Ok(false),
            Some(Ok(())) => Ok(true),
            Some(Err(e)) => Err(e.clone()),
        }
    }

    fn subscribe(&self, notifier: &Arc<Notifier>) {
        self.state.lock().subscribers.push(notifier.clone());
    }

    fn unsubscribe(&self, notifier: &Arc<Notifier>) {
        self.state
            .lock()
            .subscribers
            .retain(|n| !Arc::ptr_eq(n, notifier));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn wait_any_and_all() {
        let a = Event::new();
        let b = Event::new();
        let srcs: Vec<Arc<dyn WaitSource>> = vec![a.clone(), b.clone()];
        let t = std::thread::spawn({
            let a = a.clone();
            move || {
                std::thread::sleep(Duration::from_millis(20));
                a.set();
            }
        });
        wait_sources(&srcs, WaitMode::Any, Deadline::InfiniteFuture).unwrap();
        t.join().unwrap();
        let err = wait_sources(
            &srcs,
            WaitMode::All,
            Deadline::after(Duration::from_millis(10)),
        )
        .unwrap_err();
        assert_eq!(err.code(), StatusCode::DeadlineExceeded);
        b.fail(Status::new(StatusCode::Aborted, "boom"));
        let err = wait_sources(&srcs, WaitMode::All, Deadline::InfiniteFuture).unwrap_err();
        assert_eq!(err.code(), StatusCode::Aborted);
    }

    /// A helper holding jobs that set events. The registry is process
    /// wide and the tests of this binary run in parallel: a waiter of
    /// another test that took its list of helpers while this one was
    /// registered may still poll it afterwards, so only waiters on the
    /// thread that made it run its jobs.
    struct Jobs(Mutex<Vec<Arc<Event>>>, std::thread::ThreadId);

    impl Helper for Jobs {
        fn start_polling(&self) {}
        fn stop_polling(&self) {}
        fn help_one(&self) -> bool {
            if std::thread::current().id() != self.1 {
                return false;
            }
            match self.0.lock().pop() {
                Some(e) => {
                    e.set();
                    true
                }
                None => false,
            }
        }
    }

    #[test]
    fn a_waiter_runs_ready_work_it_waits_for() {
        let event = Event::new();
        let jobs = Arc::new(Jobs(
            Mutex::new(vec![event.clone()]),
            std::thread::current().id(),
        ));
        let weak: Weak<dyn Helper> = Arc::downgrade(&jobs) as Weak<dyn Helper>;
        let registration = register_helper(weak);
        // Nothing else sets the event: only the waiter running the job can
        // (waits without a deadline lend their thread).
        let srcs: Vec<Arc<dyn WaitSource>> = vec![event.clone()];
        wait_sources(&srcs, WaitMode::All, Deadline::InfiniteFuture).unwrap();
        assert!(jobs.0.lock().is_empty());
        drop(registration);
        // Unregistered: a waiter no longer runs its work.
        let late = Event::new();
        jobs.0.lock().push(late.clone());
        let other = Event::new();
        let setter = std::thread::spawn({
            let other = other.clone();
            move || {
                std::thread::sleep(Duration::from_millis(30));
                other.set();
            }
        });
        let srcs: Vec<Arc<dyn WaitSource>> = vec![other.clone()];
        wait_sources(&srcs, WaitMode::All, Deadline::InfiniteFuture).unwrap();
        setter.join().unwrap();
        assert_eq!(jobs.0.lock().len(), 1, "an unregistered helper's work ran");
    }
}
