//! Waits as futures: [`SourcesWait`] resolves when its wait sources satisfy
//! the mode, a source fails, or the deadline passes, without a thread
//! blocked for it.
//!
//! The future subscribes one [`Notifier`] to its sources (the same path a
//! blocked thread uses) and leaves the task's waker in it; a source that
//! changes state notifies it from the signalling thread, which wakes the
//! task. A finite deadline is kept by the process-wide timer thread (one
//! thread for all waits). Dropping the future unsubscribes it and removes
//! its deadline: nothing of a cancelled wait stays behind in the sources.
//!
//! The futures need no particular executor: any that honours wakers
//! (tokio, `futures::executor`, a hand-written `block_on`) drives them.

use super::timer::TimerEntry;
use super::{poll_sources, Notifier, WaitMode, WaitSource};
use crate::status::{Result, Status, StatusCode};
use crate::time::Deadline;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

/// A wait on [`WaitSource`]s as a future (see the module docs).
///
/// Output: `Ok(())` once the sources satisfy the mode, the failing
/// source's status, or `DEADLINE_EXCEEDED` once the deadline passes
/// ([`Deadline::InfinitePast`] checks the sources once). Polling it again
/// after it resolved answers `FAILED_PRECONDITION`.
#[must_use = "a wait does nothing unless polled"]
pub struct SourcesWait {
    sources: Vec<Arc<dyn WaitSource>>,
    mode: WaitMode,
    deadline: Deadline,
    /// Subscribed to every source once the first poll found them pending.
    notifier: Option<Arc<Notifier>>,
    timer: Option<TimerEntry>,
    done: bool,
}

impl std::fmt::Debug for SourcesWait {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SourcesWait")
            .field("sources", &self.sources.len())
            .field("mode", &self.mode)
            .field("deadline", &self.deadline)
            .field("subscribed", &self.notifier.is_some())
            .field("done", &self.done)
            .finish()
    }
}

impl SourcesWait {
    /// A wait for `sources` to satisfy `mode` before `deadline`. Nothing
    /// happens until it is polled.
    pub fn new(sources: Vec<Arc<dyn WaitSource>>, mode: WaitMode, deadline: Deadline) -> Self {
        SourcesWait {
            sources,
            mode,
            deadline,
            notifier: None,
            timer: None,
            done: false,
        }
    }

    /// Whether the future has resolved.
    pub fn is_done(&self) -> bool {
        self.done
    }

    /// Polls the sources once; `Some` when the wait is over.
    fn check(&self) -> Option<Result<()>> {
        match poll_sources(&self.sources, self.mode) {
            Ok(true) => Some(Ok(())),
            Err(e) => Some(Err(e)),
            Ok(false) if self.deadline.has_passed() => Some(Err(Status::new(
                StatusCode::DeadlineExceeded,
                "wait deadline exceeded",
            ))),
            Ok(false) => None,
        }
    }

    fn finish(&mut self, outcome: Result<()>) -> Poll<Result<()>> {
        self.release();
        self.done = true;
        Poll::Ready(outcome)
    }

    /// Unsubscribes from the sources and drops the deadline.
    fn release(&mut self) {
        if let Some(n) = self.notifier.take() {
            for s in &self.sources {
                s.unsubscribe(&n);
            }
            n.clear_waker();
        }
        self.timer = None;
    }
}

impl Future for SourcesWait {
    type Output = Result<()>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Result<()>> {
        // Every field is Unpin: the future is moved freely.
        let this = self.get_mut();
        if this.done {
            return Poll::Ready(Err(Status::new(
                StatusCode::FailedPrecondition,
                "wait future polled after it resolved",
            )));
        }
        if let Some(outcome) = this.check() {
            return this.finish(outcome);
        }
        // The waker first, then subscribe and look again: a change between
        // the look above and the subscription is seen by the second look,
        // and any change after it wakes the waker left here.
        match &this.notifier {
            Some(n) => n.set_waker(cx.waker()),
            None => {
                let n = Notifier::new();
                n.set_waker(cx.waker());
                for s in &this.sources {
                    s.subscribe(&n);
                }
                this.notifier = Some(n);
            }
        }
        if let Deadline::At(at) = this.deadline {
            match &this.timer {
                Some(t) => t.update(cx.waker()),
                None => this.timer = Some(TimerEntry::register(at, cx.waker())),
            }
        }
        if let Some(outcome) = this.check() {
            return this.finish(outcome);
        }
        Poll::Pending
    }
}

impl Drop for SourcesWait {
    fn drop(&mut self) {
        self.release();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wait::Event;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::task::{Wake, Waker};
    use std::time::{Duration, Instant};

    /// Counts its wakes.
    struct CountingWaker(AtomicUsize);

    impl Wake for CountingWaker {
        fn wake(self: Arc<Self>) {
            self.0.fetch_add(1, Ordering::SeqCst);
        }
    }

    fn counting() -> (Arc<CountingWaker>, Waker) {
        let c = Arc::new(CountingWaker(AtomicUsize::new(0)));
        (c.clone(), Waker::from(c))
    }

    fn poll(w: &mut SourcesWait, waker: &Waker) -> Poll<Result<()>> {
        Pin::new(w).poll(&mut Context::from_waker(waker))
    }

    /// Subscriptions on an event, for leak checks.
    fn subscribers(e: &Event) -> usize {
        e.state.lock().subscribers.len()
    }

    #[test]
    fn set_event_wakes_the_task_once_and_resolves() {
        let e = Event::new();
        let (count, waker) = counting();
        let mut w = SourcesWait::new(
            vec![e.clone() as Arc<dyn WaitSource>],
            WaitMode::All,
            Deadline::InfiniteFuture,
        );
        assert!(poll(&mut w, &waker).is_pending());
        assert_eq!(subscribers(&e), 1);
        assert_eq!(count.0.load(Ordering::SeqCst), 0);
        e.set();
        assert_eq!(count.0.load(Ordering::SeqCst), 1);
        assert!(matches!(poll(&mut w, &waker), Poll::Ready(Ok(()))));
        assert_eq!(subscribers(&e), 0, "a resolved wait unsubscribes");
        let again = poll(&mut w, &waker);
        assert!(
            matches!(&again, Poll::Ready(Err(s)) if s.code() == StatusCode::FailedPrecondition),
            "{again:?}"
        );
    }

    #[test]
    fn failure_reaches_the_future_and_any_mode_needs_one_source() {
        let a = Event::new();
        let b = Event::new();
        let (_, waker) = counting();
        let sources = vec![a.clone() as Arc<dyn WaitSource>, b.clone()];
        let mut any = SourcesWait::new(sources.clone(), WaitMode::Any, Deadline::InfiniteFuture);
        let mut all = SourcesWait::new(sources, WaitMode::All, Deadline::InfiniteFuture);
        assert!(poll(&mut any, &waker).is_pending());
        assert!(poll(&mut all, &waker).is_pending());
        b.set();
        assert!(matches!(poll(&mut any, &waker), Poll::Ready(Ok(()))));
        assert!(poll(&mut all, &waker).is_pending());
        a.fail(Status::new(StatusCode::Aborted, "device lost"));
        match poll(&mut all, &waker) {
            Poll::Ready(Err(e)) => {
                assert_eq!(e.code(), StatusCode::Aborted);
                assert_eq!(e.message(), "device lost");
            }
            other => panic!("expected the failure, got {other:?}"),
        }
    }

    #[test]
    fn dropped_wait_leaves_no_subscription_or_deadline() {
        let e = Event::new();
        let (count, waker) = counting();
        let before = crate::wait::timer::pending();
        let mut w = SourcesWait::new(
            vec![e.clone() as Arc<dyn WaitSource>],
            WaitMode::All,
            Deadline::At(Instant::now() + Duration::from_secs(3600)),
        );
        assert!(poll(&mut w, &waker).is_pending());
        assert_eq!(subscribers(&e), 1);
        assert!(crate::wait::timer::pending() > before);
        drop(w);
        assert_eq!(subscribers(&e), 0);
        e.set();
        assert_eq!(count.0.load(Ordering::SeqCst), 0, "nobody left to wake");
    }

    #[test]
    fn deadline_wakes_and_resolves_deadline_exceeded() {
        let e = Event::new();
        let (count, waker) = counting();
        let start = Instant::now();
        let mut w = SourcesWait::new(
            vec![e.clone() as Arc<dyn WaitSource>],
            WaitMode::All,
            Deadline::At(start + Duration::from_millis(20)),
        );
        assert!(poll(&mut w, &waker).is_pending());
        // The timer thread wakes the task; bounded so a lost wake fails.
        while count.0.load(Ordering::SeqCst) == 0 {
            assert!(start.elapsed() < Duration::from_secs(10), "never woken");
            std::thread::sleep(Duration::from_millis(1));
        }
        assert!(start.elapsed() >= Duration::from_millis(20));
        match poll(&mut w, &waker) {
            Poll::Ready(Err(e)) => assert_eq!(e.code(), StatusCode::DeadlineExceeded),
            other => panic!("expected DEADLINE_EXCEEDED, got {other:?}"),
        }
        assert_eq!(subscribers(&e), 0);
        // A poll-only deadline answers at once.
        let mut now = SourcesWait::new(
            vec![e.clone() as Arc<dyn WaitSource>],
            WaitMode::All,
            Deadline::InfinitePast,
        );
        assert!(
            matches!(poll(&mut now, &waker), Poll::Ready(Err(s)) if s.code() == StatusCode::DeadlineExceeded)
        );
        // No sources: reached.
        let mut none = SourcesWait::new(Vec::new(), WaitMode::All, Deadline::InfinitePast);
        assert!(matches!(poll(&mut none, &waker), Poll::Ready(Ok(()))));
    }
}
