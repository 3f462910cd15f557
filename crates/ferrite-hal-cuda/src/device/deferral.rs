//! Host deferral: queue operations kept on the host until they may be
//! enqueued on the queue stream.
//!
//! An operation waiting on a semaphore that the host, a CPU device,
//! another GPU or host work signals is kept here until its waits are
//! reached; then it is enqueued, or, when a wait failed, its signals fail
//! with that status and its work never runs. (Enqueuing it behind a
//! `cuStreamWaitValue64` on the semaphore's word would let the GPU run it
//! once a failure released the word: the GPU cannot skip work.) Waits on
//! work already enqueued on this stream are covered by stream order and
//! never kept. Upstream's CUDA driver keeps such operations on the host
//! the same way.
//!
//! The stream may still wait on the host inside an operation: an indirect
//! dispatch's continuation gate ([`crate::indirect`]). Everything enqueued
//! after such a gate stays in the stream's command queue, which is small
//! (on an H100 the enqueueing thread blocked inside the driver after
//! roughly 150 entries), so the device counts the stream entries enqueued
//! behind the oldest gate still in flight; an operation that would take
//! that count over [`GATED_ENTRIES`] is kept here too.
//!
//! Kept operations stay in submission order (every later operation queues
//! up behind them, so stream order stays submission order). A drain
//! thread, started while operations are kept, enqueues them as their
//! waits are reached and gates are passed, each through the same check.
//!
//! The queue's state ([`Queue`], [`Deferred`](super::Deferred),
//! [`Body`](super::Body)) is defined in the parent module beside the
//! device that holds it, since a kept operation's body takes the device:
//! types that hold each other in one file. This module is the logic.

use super::{CudaDevice, Queue};
use ferrite_base::Timeout;
use ferrite_hal::fence::Fence;
use std::sync::Weak;
use std::time::Duration;

/// The most stream entries enqueued behind a gate; half of what the
/// driver was seen to accept before blocking the enqueueing thread.
pub(crate) const GATED_ENTRIES: u64 = 64;

impl Queue {
    /// Whether an operation of `entries` may be enqueued now, given that
    /// the operations before sequence number `reported` were reported.
    pub(crate) fn fits(&mut self, reported: u64, entries: u64) -> bool {
        while self.gates.front().is_some_and(|&(seq, _)| seq < reported) {
            self.gates.pop_front();
        }
        match self.gates.front() {
            Some(&(_, before)) => self.entries - before + entries <= GATED_ENTRIES,
            None => true,
        }
    }

    /// Accounts for an operation just enqueued; returns its sequence
    /// number.
    pub(crate) fn enqueued(&mut self, entries: u64, gated: bool) -> u64 {
        let seq = self.next_seq;
        self.next_seq += 1;
        if gated {
            self.gates.push_back((seq, self.entries));
        }
        self.entries += entries;
        seq
    }

    /// The operation whose report the drain thread waits for.
    fn oldest_gate(&self) -> Option<u64> {
        self.gates.front().map(|&(seq, _)| seq)
    }

    /// Marks a drain thread as needed; true when one must be started.
    pub(crate) fn start_draining(&mut self) -> bool {
        !std::mem::replace(&mut self.draining, true)
    }

    /// No drain thread runs (it could not be started).
    pub(crate) fn stop_draining(&mut self) {
        self.draining = false;
    }
}

/// What the front kept operation waits for.
enum Blocked {
    /// The report of the operation with this sequence number (a gate).
    Report(u64),
    /// Its own waits (not reached, not covered by stream order).
    Wait(Fence),
}

/// The drain thread: enqueues kept operations as gates are passed; ends
/// when none are left or the device is gone (the kept operations then
/// fail, see [`Deferred`]'s drop).
pub(crate) fn drain(device: Weak<CudaDevice>) {
    loop {
        let Some(dev) = device.upgrade() else {
            return;
        };
        let blocked_on = {
            let mut q = dev.queue.lock();
            loop {
                let reported = dev.shared().completions.reported();
                let Some(front) = q.deferred.front() else {
                    q.draining = false;
                    return;
                };
                let (entries, waits_on_host) =
                    dev.entries(&front.wait, &front.signal, front.work_entries);
                if waits_on_host {
                    break Blocked::Wait(front.wait.clone());
                }
                if !q.fits(reported, entries) {
                    // Not fitting means a gate is in flight.
                    if let Some(seq) = q.oldest_gate() {
                        break Blocked::Report(seq);
                    }
                }
                let Some(op) = q.deferred.pop_front() else {
                    continue;
                };
                dev.enqueue_deferred(&mut q, op);
                // Its submitter may be long gone (a dropped call) and
                // nobody may ever wait on its signals: the completion
                // thread reports it, which releases what it keeps.
                dev.shared().completions.watch();
            }
        };
        let completions = dev.shared().completions.clone();
        // Not held while asleep: the device may be released meanwhile.
        drop(dev);
        // Bounded sleeps: the device may go meanwhile.
        let nap = Duration::from_millis(20);
        match blocked_on {
            Blocked::Report(seq) => {
                // Operations this thread enqueued may be unwatched (no
                // waiter asked for reports yet): the gate's report is
                // needed here.
                completions.watch();
                completions.wait_reported(seq, nap)
            }
            Blocked::Wait(wait) => {
                let pending = wait
                    .timepoints()
                    .into_iter()
                    .find(|(s, v)| s.query().is_ok_and(|c| c < *v));
                if let Some((sem, value)) = pending {
                    // Reached: enqueued; failed: its signals fail when it
                    // is taken up (the wait's status), its work not run.
                    let _ = sem.wait(value, Timeout::from_duration(nap));
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn entries_behind_the_oldest_gate_are_limited() {
        let mut q = Queue::default();
        // Ungated work never counts.
        assert!(q.fits(0, 1000));
        q.enqueued(1000, false);
        // A gate and what follows it, up to the limit.
        assert!(q.fits(0, 4));
        let gate = q.enqueued(4, true);
        assert!(q.fits(0, GATED_ENTRIES - 4));
        q.enqueued(GATED_ENTRIES - 4, false);
        assert!(!q.fits(0, 1));
        // Once the gate's operation is reported, the stream drains itself.
        assert!(q.fits(gate + 1, GATED_ENTRIES));
    }

    #[test]
    fn the_oldest_gate_still_in_flight_counts() {
        let mut q = Queue::default();
        let first = q.enqueued(10, true);
        let second = q.enqueued(10, true);
        q.enqueued(40, false);
        // 60 behind the first gate.
        assert!(q.fits(0, 4));
        assert!(!q.fits(0, 5));
        // The first passed: 50 behind the second.
        assert!(q.fits(first + 1, 14));
        assert!(!q.fits(first + 1, 15));
        assert_eq!(q.oldest_gate(), Some(second));
        assert!(q.fits(second + 1, GATED_ENTRIES));
        assert_eq!(q.oldest_gate(), None);
    }
}
