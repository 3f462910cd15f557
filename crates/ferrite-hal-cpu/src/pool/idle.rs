//! Idle workers: how a worker finds work (queued jobs, running regions it
//! can join), polls for a bounded time when there is none, and then
//! sleeps on the pool's futex word until whatever creates work wakes it.
//!
//! An idle worker polls for new work for a bounded time
//! ([`super::PoolOptions::idle_spin`]) and then sleeps on the pool's futex word
//! (a futex, module `park`). Whatever creates work (a job, a region, a region's next
//! stage) bumps the word and wakes only as many sleepers as the work can
//! use, with one system call; woken workers take no lock on the way out.
//! An idle pool therefore burns no CPU, and a stage with one tile wakes
//! nobody.

use super::park;
use super::queue::run_job;
use super::region::{Region, Spin};
use super::state::{PoolState, WORKER};
use std::sync::atomic::Ordering;
use std::sync::Arc;

// The wake-up protocol: a producer makes work visible, then bumps `epoch`
// and reads `sleepers`; a worker about to sleep reads `epoch`, increments
// `sleepers`, re-checks for work, then sleeps only while `epoch` still
// holds what it read. All SeqCst: either the worker's re-check sees the
// work, or the producer sees the sleeper (and wakes it), or the epoch
// moved and the futex wait returns at once.
impl PoolState {
    /// Signals new work that `want` more threads could use.
    pub(super) fn notify(&self, want: u32) {
        self.epoch.fetch_add(1, Ordering::SeqCst);
        if want > 0 && self.sleepers.load(Ordering::SeqCst) > 0 {
            park::wake(&self.epoch, want);
        }
    }

    /// Makes `region` visible to idle workers.
    pub(super) fn publish(&self, region: &Arc<Region>) {
        self.regions.write().push(region.clone());
        self.region_count.fetch_add(1, Ordering::SeqCst);
    }

    /// Takes `region` off the list idle workers look at.
    pub(super) fn unpublish(&self, region: &Arc<Region>) {
        let mut regions = self.regions.write();
        regions.retain(|r| !Arc::ptr_eq(r, region));
        self.region_count.fetch_sub(1, Ordering::SeqCst);
    }

    /// A published region a worker could join now.
    pub(super) fn has_joinable(&self) -> bool {
        self.region_count.load(Ordering::SeqCst) > 0
            && self.regions.read().iter().any(|r| r.joinable())
    }

    /// Joins a region with work and room, if any, and works in it.
    pub(super) fn try_join(&self, index: u32) -> bool {
        if self.region_count.load(Ordering::Acquire) == 0 {
            return false;
        }
        // Under the shared lock: the workers a stage wakes join at once,
        // and one of them losing its CPU inside holds up no other (an
        // exclusive lock did: on a loaded machine its waiters spun, then
        // yielded their CPUs to the busy processes). Entering is a
        // compare-and-swap against the region's room; unpublishing takes
        // the lock exclusively, so nobody enters after it.
        let find = |regions: &[Arc<Region>]| {
            regions
                .iter()
                .find(|r| r.joinable() && r.try_enter())
                .cloned()
        };
        let region = if self.join_exclusive.load(Ordering::Relaxed) {
            find(&self.regions.write())
        } else {
            find(&self.regions.read())
        };
        let Some(region) = region else {
            return false;
        };
        self.stats.joins.fetch_add(1, Ordering::Relaxed);
        region.work_in(index);
        region.leave();
        true
    }

    /// The loop of worker `index`: run jobs, join regions, poll, sleep,
    /// until the pool shuts down.
    pub(super) fn worker_main(&self, index: u32) {
        WORKER.with(|w| w.set(Some((self.id, index))));
        if let Some(slice) = self.slice {
            super::set_own_slice(slice);
        }
        // Its poll for work since it last found nothing to do (None: it
        // just worked).
        let mut idle_since: Option<Spin> = None;
        loop {
            if let Some(job) = self.pop() {
                run_job(job);
                idle_since = None;
                continue;
            }
            if self.try_join(index) {
                idle_since = None;
                continue;
            }
            if self.shutdown.load(Ordering::SeqCst) {
                return;
            }
            // Poll for new work (anything new bumps the epoch) for at most
            // `idle_spin` in all: bumps for work other threads take do not
            // extend the window, so an idle worker sleeps on time even
            // while the rest of the pool is busy.
            // While it polls it counts as a poller: new jobs wake nobody
            // (see `push`); it leaves the count before looking at the
            // queue again, so a job pushed meanwhile is seen (SeqCst on
            // both sides, as with lending waiters).
            // A descheduled poller (see `region::Spin`) stops polling and
            // sleeps at once.
            let spin = idle_since.get_or_insert_with(|| Spin::start(self, self.idle_spin));
            let since = spin.since();
            let seen = self.epoch.load(Ordering::SeqCst);
            let mut woke = false;
            self.pollers.fetch_add(1, Ordering::SeqCst);
            while spin.poll(self) {
                if self.epoch.load(Ordering::Relaxed) != seen {
                    woke = true;
                    break;
                }
            }
            self.pollers.fetch_sub(1, Ordering::SeqCst);
            if woke {
                continue;
            }
            self.stats
                .idle_spin_ns
                .fetch_add(since.elapsed().as_nanos() as u64, Ordering::Relaxed);
            idle_since = None;
            let seen = self.epoch.load(Ordering::SeqCst);
            self.sleepers.fetch_add(1, Ordering::SeqCst);
            let idle = self.queued.load(Ordering::SeqCst) == 0
                && !self.shutdown.load(Ordering::SeqCst)
                && !self.has_joinable();
            if idle {
                self.note_if_switched_out();
                self.stats.sleeps.fetch_add(1, Ordering::Relaxed);
                park::wait(&self.epoch, seen);
            }
            self.sleepers.fetch_sub(1, Ordering::SeqCst);
        }
    }
}
