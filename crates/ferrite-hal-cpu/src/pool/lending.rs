//! Lending to waiters: a thread blocked waiting on a semaphore or fence
//! runs the pool's queued submissions itself.
//!
//! With [`super::PoolOptions::lend_to_waiters`], the pool registers
//! as a [`Helper`] with `ferrite_base::wait`: a thread blocked waiting on a
//! semaphore or fence (typically the program waiting for its results) runs
//! the pool's queued submissions itself while it polls, instead of idling
//! until a woken worker has run them, and then leads their regions. A new
//! job wakes no worker while such a waiter polls. The registration is
//! process-wide because a waiter cannot know which device will signal what
//! it waits for; it ends when the pool is dropped. Turning it off makes
//! every submission run on the workers and waiters only sleep. Pools with
//! a requested worker stack size never lend (a waiter's stack may be
//! smaller than the work expects). [`super::PoolStats`] reports the share of
//! workgroups run by workers and by other threads.
//!
//! Lending is on by default ([`lends_by_default`]), whatever the worker
//! count: a program's synchronous call submits and then waits, and the
//! waiter taking its own submission runs it at once on a thread that is
//! already running. Left to a worker, the call needs that worker woken and
//! then the waiter woken, and on a machine whose CPUs are all busy each
//! wake-up waits for the scheduler to give the thread a time slice: a
//! 4xf32 add took about 1 ms a call that way on 2 busy cores (issue 25).
//! Waiters poll without yielding the CPU (`ferrite_base::wait`): a yield
//! on a busy machine gives the CPU to another process for its whole slice.
//!
//! Small submissions (every stage one tile) whose wait is already reached
//! never reach the queue: the device runs them on the submitting thread
//! (`CpuDevice::submit_hinted`), so a tiny call wakes no worker at all, and
//! no woken worker can take it and then wait for its CPU.

use super::queue::run_job;
use super::PoolState;
use ferrite_base::wait::{register_helper, Helper, HelperRegistration};
use std::sync::atomic::Ordering;
use std::sync::{Arc, Weak};

/// Whether a pool of `workers` threads lends to waiters unless told
/// otherwise: always. A thread waiting for a submission it just made runs
/// that submission itself when no worker has taken it yet, so a call needs
/// no worker to be woken and scheduled: on a machine whose CPUs are all
/// busy, a woken thread waits for the scheduler (up to a time slice, about
/// 1 ms per wake-up measured on 2 cores), which made a 4xf32 add on
/// local-task take about 1 ms a call (issue 25). Idle, the waiter
/// running the work instead of a woken worker costs nothing either.
pub fn lends_by_default(workers: usize) -> bool {
    let _ = workers;
    true
}

/// A blocked waiter lends its thread to the pool's queued submissions.
impl Helper for PoolState {
    fn start_polling(&self) {
        self.pollers.fetch_add(1, Ordering::SeqCst);
    }

    fn help_one(&self) -> bool {
        // While it runs the job this thread does not poll: new jobs must
        // wake a worker meanwhile.
        let Some(job) = self.pop() else {
            return false;
        };
        self.stop_polling();
        run_job(job);
        self.start_polling();
        true
    }

    fn stop_polling(&self) {
        self.pollers.fetch_sub(1, Ordering::SeqCst);
        if self.queued.load(Ordering::SeqCst) > 0 {
            self.notify(1);
        }
    }
}

/// Registers `state` with `ferrite_base::wait` until the returned
/// registration is dropped (the pool's drop).
pub(super) fn register(state: &Arc<PoolState>) -> HelperRegistration {
    let weak: Weak<dyn Helper> = Arc::downgrade(state) as Weak<dyn Helper>;
    register_helper(weak)
}
