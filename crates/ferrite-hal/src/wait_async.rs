//! Semaphore and fence waits as futures: [`Semaphore::wait_async`],
//! [`Fence::wait_async`] and [`wait_multi_async`].
//!
//! A pending wait subscribes a notifier to each semaphore it waits on (the
//! list a semaphore's `signal` and `fail` already notify, outside the
//! semaphore's lock) and leaves the task's waker in it: the thread that
//! signals the semaphore (a device's completion, a host `signal`) wakes
//! the task. No thread blocks per wait. A device that owns the semaphore's
//! timeline is told a waiter subscribed, so it reports completions itself
//! (see [`crate::semaphore::DeviceTimeline::watch`]).
//!
//! Dropping a wait future unsubscribes it from every semaphore: a cancelled
//! wait leaves nothing behind, and the semaphores go on as if it had never
//! been made. The futures work on any executor (see
//! [`ferrite_base::wait::future`]).

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use ferrite_base::wait::future::SourcesWait;
use ferrite_base::wait::{WaitMode, WaitSource};
use ferrite_base::{Deadline, Result};

use crate::fence::Fence;
use crate::semaphore::Semaphore;

/// A wait for timeline semaphores as a future: `Ok(())` once reached, the
/// failure status of a failed semaphore, `DEADLINE_EXCEEDED` past the
/// deadline (only waits made with one). Made by [`Semaphore::wait_async`],
/// [`Fence::wait_async`] and [`wait_multi_async`].
#[must_use = "a wait does nothing unless polled"]
#[derive(Debug)]
pub struct TimepointWait {
    inner: SourcesWait,
}

impl TimepointWait {
    fn new(timepoints: &[(Arc<Semaphore>, u64)], mode: WaitMode, deadline: Deadline) -> Self {
        let sources = timepoints
            .iter()
            .map(|(s, v)| s.timepoint(*v) as Arc<dyn WaitSource>)
            .collect();
        TimepointWait {
            inner: SourcesWait::new(sources, mode, deadline),
        }
    }
}

impl Future for TimepointWait {
    type Output = Result<()>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Result<()>> {
        Pin::new(&mut self.inner).poll(cx)
    }
}

impl Semaphore {
    /// Waits, as a future, until the payload reaches `value` (`Ok`) or the
    /// semaphore fails (its status). No deadline: combine with the
    /// executor's timer (e.g. `tokio::time::timeout`) to bound it; dropping
    /// the future cancels the wait cleanly.
    pub fn wait_async(self: &Arc<Self>, value: u64) -> TimepointWait {
        self.wait_async_until(value, Deadline::InfiniteFuture)
    }

    /// [`Semaphore::wait_async`] that resolves with `DEADLINE_EXCEEDED`
    /// once `deadline` passes (kept by one process-wide timer thread).
    pub fn wait_async_until(self: &Arc<Self>, value: u64, deadline: Deadline) -> TimepointWait {
        TimepointWait::new(&[(self.clone(), value)], WaitMode::All, deadline)
    }
}

impl Fence {
    /// Waits, as a future, until every timepoint of the fence is reached
    /// (`Ok`; at once for an empty fence) or one of its semaphores fails
    /// (its status). The timepoints are those of the fence now; ones
    /// inserted later are not waited on.
    pub fn wait_async(&self) -> TimepointWait {
        self.wait_async_until(Deadline::InfiniteFuture)
    }

    /// [`Fence::wait_async`] that resolves with `DEADLINE_EXCEEDED` once
    /// `deadline` passes.
    pub fn wait_async_until(&self, deadline: Deadline) -> TimepointWait {
        TimepointWait::new(&self.timepoints(), WaitMode::All, deadline)
    }
}

/// Waits, as a future, on several (semaphore, value) timepoints: all of
/// them or any one ([`crate::semaphore::wait_multi`] without a thread).
pub fn wait_multi_async(
    timepoints: &[(Arc<Semaphore>, u64)],
    mode: WaitMode,
    deadline: Deadline,
) -> TimepointWait {
    TimepointWait::new(timepoints, mode, deadline)
}

#[cfg(test)]
mod tests {
    use super::*;
    use ferrite_base::{Status, StatusCode};
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::task::{Wake, Waker};
    use std::time::{Duration, Instant};

    /// A minimal executor: parks the thread until woken.
    struct ThreadWaker(std::thread::Thread, AtomicUsize);

    impl Wake for ThreadWaker {
        fn wake(self: Arc<Self>) {
            self.1.fetch_add(1, Ordering::SeqCst);
            self.0.unpark();
        }
    }

    fn block_on<F: Future>(f: F) -> (F::Output, usize) {
        let w = Arc::new(ThreadWaker(std::thread::current(), AtomicUsize::new(0)));
        let waker = Waker::from(w.clone());
        let mut f = std::pin::pin!(f);
        loop {
            if let Poll::Ready(out) = f.as_mut().poll(&mut Context::from_waker(&waker)) {
                return (out, w.1.load(Ordering::SeqCst));
            }
            std::thread::park_timeout(Duration::from_secs(10));
        }
    }

    #[test]
    fn signal_from_another_thread_wakes_the_task() {
        let s = Semaphore::new(0);
        let t = std::thread::spawn({
            let s = s.clone();
            move || {
                for v in 1..=3 {
                    std::thread::sleep(Duration::from_millis(5));
                    s.signal(v).unwrap();
                }
            }
        });
        let (out, wakes) = block_on(s.wait_async(3));
        out.unwrap();
        assert!(wakes >= 1, "the task was woken, not found ready by polling");
        t.join().unwrap();
        assert!(!s.has_sleepers(), "the finished wait unsubscribed");
    }

    #[test]
    fn failure_resolves_with_the_status_and_fences_wait_all() {
        let a = Semaphore::new(0);
        let b = Semaphore::new(0);
        let fence = Fence::create_at(a.clone(), 2);
        fence.insert(b.clone(), 1);
        let t = std::thread::spawn({
            let (a, b) = (a.clone(), b.clone());
            move || {
                std::thread::sleep(Duration::from_millis(5));
                a.signal(2).unwrap();
                std::thread::sleep(Duration::from_millis(5));
                b.fail(Status::new(StatusCode::DataLoss, "dispatch faulted"));
            }
        });
        let (out, _) = block_on(fence.wait_async());
        let e = out.unwrap_err();
        assert_eq!(e.code(), StatusCode::DataLoss);
        t.join().unwrap();
        // A reached fence and an empty one resolve at the first poll.
        let (out, wakes) = block_on(Fence::create_at(a.clone(), 1).wait_async());
        assert!(out.is_ok() && wakes == 0);
        assert!(block_on(Fence::new().wait_async()).0.is_ok());
        let (out, _) = block_on(wait_multi_async(
            &[(a.clone(), 9), (b.clone(), 1)],
            WaitMode::Any,
            Deadline::InfiniteFuture,
        ));
        assert_eq!(out.unwrap_err().code(), StatusCode::DataLoss);
    }

    #[test]
    fn dropped_wait_unsubscribes_and_deadlines_expire() {
        let s = Semaphore::new(0);
        {
            let mut w = s.wait_async(1);
            let waker = Waker::from(Arc::new(ThreadWaker(
                std::thread::current(),
                AtomicUsize::new(0),
            )));
            let p = Pin::new(&mut w).poll(&mut Context::from_waker(&waker));
            assert!(p.is_pending());
            assert!(s.has_sleepers());
        }
        assert!(!s.has_sleepers(), "a dropped wait leaves no waiter behind");
        s.signal(1).unwrap();
        let start = Instant::now();
        let (out, _) =
            block_on(s.wait_async_until(5, Deadline::At(start + Duration::from_millis(20))));
        assert_eq!(out.unwrap_err().code(), StatusCode::DeadlineExceeded);
        assert!(start.elapsed() >= Duration::from_millis(20));
        assert!(!s.has_sleepers());
    }
}
