//! Lending to waiters: a thread blocked waiting for a `local-task`
//! device's work runs the pool's queued submissions itself.
//!
//! Lending is the device's choice ([`super::PoolOptions::lend_to_waiters`],
//! `local-task://?lend_to_waiters=`) and is scoped to what a waiter waits
//! for: a lending pool hands out its
//! [`WorkerPool::lend_target`](super::WorkerPool::lend_target), and the
//! device names it to every semaphore its submissions will signal
//! (`Fence::signalled_by` on the signal fence, before the submission can
//! run). A thread blocked on such a semaphore (typically the program
//! waiting for its results) runs the pool's queued submissions while it
//! polls, instead of idling until a woken worker has run them, and then
//! leads their regions; a new job wakes no worker while such a waiter
//! polls. A thread blocked on a semaphore that only the host or another
//! device signals runs none of this pool's work: the semaphore names no
//! queue, or only the other device's. The semaphore holds the pool weakly
//! and forgets it once the signalled value is reached (or the semaphore
//! fails), so nothing outlives the pool. Turning lending off makes every
//! submission run on the workers and waiters only sleep. Pools with a
//! requested worker stack size never lend (a waiter's stack may be smaller
//! than the work expects). [`super::PoolStats`] reports the share of
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
use super::state::PoolState;
use ferrite_base::wait::Helper;
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

/// The handle a lending pool gives to the semaphores its work signals.
pub(super) fn lend_target(state: &Arc<PoolState>) -> Weak<dyn Helper> {
    Arc::downgrade(state) as Weak<dyn Helper>
}
