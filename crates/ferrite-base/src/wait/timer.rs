//! Deadlines for asynchronous waits: one process-wide timer thread wakes
//! the tasks whose deadlines pass.
//!
//! A future with a finite deadline cannot sleep until it passes (it has no
//! thread), and an executor-specific timer would tie the wait to one
//! runtime. Instead the wait registers its waker here: a single thread,
//! started at the first registration, sleeps until the earliest deadline
//! and wakes every waker whose deadline has passed. Registrations are
//! removed when their wait finishes or is dropped, so the table holds only
//! waits in flight.

use parking_lot::{Condvar, Mutex};
use std::collections::BTreeMap;
use std::sync::OnceLock;
use std::task::Waker;
use std::time::Instant;

/// Deadline and registration number (distinct keys for equal deadlines).
type Key = (Instant, u64);

struct Timers {
    table: Mutex<Table>,
    /// Signalled when an earlier deadline is registered.
    changed: Condvar,
}

#[derive(Default)]
struct Table {
    entries: BTreeMap<Key, Waker>,
    next_id: u64,
}

fn timers() -> &'static Timers {
    static TIMERS: OnceLock<Timers> = OnceLock::new();
    TIMERS.get_or_init(|| {
        // If the thread cannot be started, registrations still work but
        // nothing wakes them at their deadline: waits then notice the
        // deadline at their next poll, which is the best left to do.
        let _ = std::thread::Builder::new()
            .name("ferrite-timer".into())
            .spawn(run);
        Timers {
            table: Mutex::new(Table::default()),
            changed: Condvar::new(),
        }
    })
}

fn run() {
    let t = timers();
    let mut table = t.table.lock();
    loop {
        let now = Instant::now();
        let mut due = Vec::new();
        while let Some(entry) = table.entries.first_entry() {
            if entry.key().0 > now {
                break;
            }
            due.push(entry.remove());
        }
        if !due.is_empty() {
            // Wakers may run code (an executor polling on the spot): never
            // under the table's lock.
            parking_lot::MutexGuard::unlocked(&mut table, || {
                for w in due {
                    w.wake();
                }
            });
            continue;
        }
        match table.entries.keys().next() {
            Some(&(at, _)) => {
                t.changed.wait_until(&mut table, at);
            }
            None => t.changed.wait(&mut table),
        }
    }
}

/// A waker registered to be woken at a deadline; unregistered when
/// dropped.
#[derive(Debug)]
pub(crate) struct TimerEntry {
    key: Key,
}

impl TimerEntry {
    /// Wakes `waker` once `at` passes (unless the entry is dropped first).
    pub(crate) fn register(at: Instant, waker: &Waker) -> TimerEntry {
        let t = timers();
        let mut table = t.table.lock();
        let key = (at, table.next_id);
        table.next_id += 1;
        let earliest = table.entries.keys().next().is_none_or(|k| key < *k);
        table.entries.insert(key, waker.clone());
        drop(table);
        if earliest {
            t.changed.notify_one();
        }
        TimerEntry { key }
    }

    /// Replaces the waker to wake (a task may move between threads and
    /// hand a new waker at each poll). After the deadline fired, the entry
    /// is gone and there is nothing to update: the caller sees the passed
    /// deadline itself.
    pub(crate) fn update(&self, waker: &Waker) {
        let mut table = timers().table.lock();
        if let Some(w) = table.entries.get_mut(&self.key) {
            if !w.will_wake(waker) {
                *w = waker.clone();
            }
        }
    }
}

impl Drop for TimerEntry {
    fn drop(&mut self) {
        let old = timers().table.lock().entries.remove(&self.key);
        // The waker is dropped outside the lock.
        drop(old);
    }
}

/// Number of deadlines registered now (for tests).
#[cfg(test)]
pub(crate) fn pending() -> usize {
    timers().table.lock().entries.len()
}
