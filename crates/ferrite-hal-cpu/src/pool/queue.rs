//! The pool's job queue: whole queue submissions, run first come first
//! served by whichever thread takes them (an idle worker, or a waiter
//! lending its thread, see [`super::lending`]).

use super::state::PoolState;
use std::sync::atomic::Ordering;

pub use super::state::Job;

impl PoolState {
    /// Queues `job`, waking as many sleeping workers as the queue has jobs
    /// that no thread about to look at it will take.
    pub(super) fn push(&self, job: Job) {
        self.jobs.lock().push_back(job);
        let queued = self.queued.fetch_add(1, Ordering::SeqCst) + 1;
        // Threads about to look at the queue take jobs without a wake-up:
        // pollers (idle workers in their polling window, lending waiters)
        // and the pushing thread itself when it is one of this pool's
        // workers (a job pushes the jobs that waited for it as it ends, and
        // its worker takes the next one when it returns). Waking a worker
        // for a job one of them takes would only cost the waker a system
        // call and the woken worker a polling window.
        let pusher = usize::from(self.current_worker().is_some());
        let takers = self.pollers.load(Ordering::SeqCst) + pusher;
        let want = queued.saturating_sub(takers).min(u32::MAX as usize) as u32;
        self.notify(want);
    }

    /// Takes the oldest queued job, if any.
    pub(super) fn pop(&self) -> Option<Job> {
        if self.queued.load(Ordering::SeqCst) == 0 {
            return None;
        }
        let job = self.jobs.lock().pop_front();
        if job.is_some() {
            self.queued.fetch_sub(1, Ordering::SeqCst);
        }
        job
    }
}

/// Runs a queued job, containing a panic: the worker (or lending waiter)
/// lives on, and the panic is reported on stderr. Jobs that have an
/// outcome to report (the device's submissions) catch their own panics
/// and fail their fences with them; this is the backstop for any other.
pub(super) fn run_job(job: Job) {
    if let Err(payload) = std::panic::catch_unwind(std::panic::AssertUnwindSafe(job)) {
        eprintln!(
            "local-task: a queued job panicked: {}",
            super::region::panic_message(&*payload)
        );
    }
}
