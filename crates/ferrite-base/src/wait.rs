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
//! While it polls, a waiter first lends its thread to ready queued work of
//! the queues that will make its sources ready ([`Helper`]s that each
//! source names, [`WaitSource::helpers`]: e.g. the `local-task` worker
//! pool whose submission signals the semaphore waited on): on a host with
//! few cores, the waiter running the submission it waits for itself beats
//! handing it to a worker that must first be woken, and the thread would
//! otherwise only yield. A wait on something no queue signals (the host,
//! a device that does not lend) runs no queued work.
//!
//! Asynchronous waiters use the same subscription path without a thread:
//! a [`Notifier`] also holds a task's [`Waker`], woken by the same
//! [`Notifier::notify`] that wakes sleeping threads; [`future::SourcesWait`]
//! is the wait as a future (see its module).

use crate::status::{Result, Status, StatusCode};
use crate::time::Deadline;
use parking_lot::{Condvar, Mutex};
use std::sync::Arc;
use std::task::Waker;
use std::time::{Duration, Instant};

pub mod future;
mod timer;

/// How long a blocking wait keeps polling before it sleeps.
pub const SPIN: Duration = Duration::from_micros(50);

/// Polls `ready` (pausing between polls) until it answers true or
/// [`SPIN`] (or `deadline`, when sooner) passes; returns its last answer.
/// Blocking waits call this before they sleep.
/// While it polls, the caller runs ready work of `helpers` (the queues
/// that will make what it waits for ready, see [`WaitSource::helpers`]);
/// time spent running work does not count against the polling bound. Only
/// waits without a deadline lend their thread: a job's length is unknown,
/// and a bounded wait must return on time.
pub fn spin_until(
    deadline: Deadline,
    helpers: &[Arc<dyn Helper>],
    mut ready: impl FnMut() -> bool,
) -> bool {
    if ready() {
        return true;
    }
    if deadline.has_passed() {
        return false;
    }
    let helpers = if lends(deadline) { helpers } else { &[] };
    for h in helpers {
        h.start_polling();
    }
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
    for h in helpers {
        h.stop_polling();
    }
    answer
}

/// Whether a wait until `deadline` lends its thread to queued work: only
/// one without a deadline (see [`spin_until`]). Waiters collect their
/// sources' [`Helpers`] only then.
#[inline]
pub fn lends(deadline: Deadline) -> bool {
    matches!(deadline, Deadline::InfiniteFuture)
}

/// A queue's ready work that a blocked waiter may run on its own thread
/// instead of idling.
///
/// Lending is a choice of the device that owns the queue and is scoped to
/// what the waiter waits for: a device that lends (the `local-task` device
/// does unless told not to) names its queue to each semaphore its
/// submissions will signal, and a waiter polls only the queues its
/// sources name ([`WaitSource::helpers`]). No registry is consulted: a
/// thread waiting on a semaphore that the host or another device signals
/// never runs this queue's work.
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

/// The queues a blocked waiter lends its thread to (usually one).
pub type Helpers = Vec<Arc<dyn Helper>>;

/// Adds `helper` to `helpers` unless it is there already (a fence's
/// semaphores are often signalled by one queue: it is polled once).
pub fn add_helper(helpers: &mut Helpers, helper: Arc<dyn Helper>) {
    let new = Arc::as_ptr(&helper) as *const ();
    if !helpers.iter().any(|h| Arc::as_ptr(h) as *const () == new) {
        helpers.push(helper);
    }
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
    /// Adds to `out` the queues whose pending work will make this source
    /// ready and that lend to waiters (see [`Helper`]); a blocked waiter
    /// runs their ready work while it polls. The default names none: the
    /// source is made ready by something a waiter cannot run.
    fn helpers(&self, out: &mut Helpers) {
        let _ = out;
    }
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
    let mut poll = || match poll_sources(sources, mode) {
        Ok(r) => r,
        Err(e) => {
            failure = Some(e);
            true
        }
    };
    // The queues to lend to are collected only for a wait that blocks.
    let ready = poll() || {
        let mut helpers = Helpers::new();
        if lends(deadline) {
            for s in sources {
                s.helpers(&mut helpers);
            }
        }
        spin_until(deadline, &helpers, &mut poll)
    };
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

    /// A queue of jobs, each setting an event.
    struct Jobs(Mutex<Vec<Arc<Event>>>);

    impl Helper for Jobs {
        fn start_polling(&self) {}
        fn stop_polling(&self) {}
        fn help_one(&self) -> bool {
            match self.0.lock().pop() {
                Some(e) => {
                    e.set();
                    true
                }
                None => false,
            }
        }
    }

    /// An event that `queue`'s work sets: a source naming its queue.
    struct Signalled {
        event: Arc<Event>,
        queue: Option<Arc<Jobs>>,
    }

    impl WaitSource for Signalled {
        fn poll(&self) -> Result<bool> {
            self.event.poll()
        }
        fn subscribe(&self, notifier: &Arc<Notifier>) {
            self.event.subscribe(notifier)
        }
        fn unsubscribe(&self, notifier: &Arc<Notifier>) {
            self.event.unsubscribe(notifier)
        }
        fn helpers(&self, out: &mut Helpers) {
            if let Some(q) = &self.queue {
                add_helper(out, q.clone());
            }
        }
    }

    fn jobs(events: &[&Arc<Event>]) -> Arc<Jobs> {
        Arc::new(Jobs(Mutex::new(
            events.iter().map(|&e| e.clone()).collect(),
        )))
    }

    #[test]
    fn a_waiter_runs_the_work_of_the_queue_it_waits_for() {
        let event = Event::new();
        let queue = jobs(&[&event]);
        // Nothing else sets the event: only the waiter running the job can
        // (waits without a deadline lend their thread).
        let srcs: Vec<Arc<dyn WaitSource>> = vec![Arc::new(Signalled {
            event: event.clone(),
            queue: Some(queue.clone()),
        })];
        wait_sources(&srcs, WaitMode::All, Deadline::InfiniteFuture).unwrap();
        assert!(queue.0.lock().is_empty());
    }

    #[test]
    fn a_waiter_runs_no_work_of_queues_its_sources_do_not_name() {
        // Queue `a`'s job sets an event nobody waits for; the waiter waits
        // on an event that `b`'s job sets, and on one set by another thread.
        let unrelated = Event::new();
        let a = jobs(&[&unrelated]);
        let from_b = Event::new();
        let b = jobs(&[&from_b]);
        let by_host = Event::new();
        let setter = std::thread::spawn({
            let by_host = by_host.clone();
            move || {
                std::thread::sleep(Duration::from_millis(30));
                by_host.set();
            }
        });
        let srcs: Vec<Arc<dyn WaitSource>> = vec![
            Arc::new(Signalled {
                event: from_b.clone(),
                queue: Some(b.clone()),
            }),
            Arc::new(Signalled {
                event: by_host.clone(),
                queue: None,
            }),
        ];
        wait_sources(&srcs, WaitMode::All, Deadline::InfiniteFuture).unwrap();
        setter.join().unwrap();
        assert!(b.0.lock().is_empty(), "the named queue's work did not run");
        assert_eq!(a.0.lock().len(), 1, "an unnamed queue's work ran");
        assert!(!unrelated.poll().unwrap());
    }

    #[test]
    fn bounded_waits_lend_to_nobody() {
        let event = Event::new();
        let queue = jobs(&[&event]);
        let helpers: Helpers = vec![queue.clone()];
        let deadline = Deadline::after(Duration::from_millis(5));
        assert!(!spin_until(deadline, &helpers, || false));
        assert_eq!(queue.0.lock().len(), 1);
        let mut named = Helpers::new();
        add_helper(&mut named, queue.clone());
        add_helper(&mut named, queue.clone());
        assert_eq!(named.len(), 1, "a queue is polled once");
    }
}
