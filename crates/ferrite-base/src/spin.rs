//! A one-word spin lock for short critical sections on the call path (a
//! fence's timepoints, the queue pool's free lists, the VM's ref globals):
//! each holds it for a few dozen instructions and never blocks under it. A parking mutex's
//! release is an atomic read-modify-write (it checks for parked waiters);
//! this lock's is a plain store, one atomic update fewer per use. Waiters
//! spin briefly, then yield their thread until the holder lets go.

use std::cell::UnsafeCell;
use std::sync::atomic::AtomicBool;
use std::sync::atomic::Ordering::{Acquire, Relaxed, Release};

/// A value behind a one-word spin lock (see the module docs).
#[derive(Default)]
pub struct SpinLock<T> {
    locked: AtomicBool,
    value: UnsafeCell<T>,
}

// SAFETY: the value is reached only through a `SpinGuard`, which exists
// only while its holder owns `locked` (taken with acquire, given back with
// release ordering), or through `&mut self`: accesses are exclusive and
// ordered, as with a mutex, so `T: Send` suffices.
unsafe impl<T: Send> Sync for SpinLock<T> {}

impl<T> SpinLock<T> {
    /// An unlocked `value`.
    pub const fn new(value: T) -> SpinLock<T> {
        SpinLock {
            locked: AtomicBool::new(false),
            value: UnsafeCell::new(value),
        }
    }

    /// Takes the lock: exclusive access to the value until the guard drops.
    #[inline]
    pub fn lock(&self) -> SpinGuard<'_, T> {
        if self.locked.swap(true, Acquire) {
            self.lock_contended();
        }
        SpinGuard(self)
    }

    #[cold]
    #[inline(never)]
    fn lock_contended(&self) {
        let mut spins = 0u32;
        loop {
            while self.locked.load(Relaxed) {
                if spins < 64 {
                    spins += 1;
                    std::hint::spin_loop();
                } else {
                    std::thread::yield_now();
                }
            }
            if !self.locked.swap(true, Acquire) {
                return;
            }
        }
    }

    /// The value, through exclusive access to the lock itself.
    pub fn get_mut(&mut self) -> &mut T {
        self.value.get_mut()
    }
}

/// Exclusive access to a [`SpinLock`]'s value.
pub struct SpinGuard<'a, T>(&'a SpinLock<T>);

impl<T> std::ops::Deref for SpinGuard<'_, T> {
    type Target = T;
    fn deref(&self) -> &T {
        // SAFETY: the guard holds the lock (see `SpinLock`'s `Sync`).
        unsafe { &*self.0.value.get() }
    }
}

impl<T> std::ops::DerefMut for SpinGuard<'_, T> {
    fn deref_mut(&mut self) -> &mut T {
        // SAFETY: the guard holds the lock, and `&mut self` makes this the
        // only access through it.
        unsafe { &mut *self.0.value.get() }
    }
}

impl<T> Drop for SpinGuard<'_, T> {
    #[inline]
    fn drop(&mut self) {
        self.0.locked.store(false, Release);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    #[test]
    fn threads_take_turns() {
        let lock = Arc::new(SpinLock::new(0u64));
        let threads: Vec<_> = (0..4)
            .map(|_| {
                let lock = lock.clone();
                std::thread::spawn(move || {
                    for _ in 0..10_000 {
                        *lock.lock() += 1;
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
        assert_eq!(*lock.lock(), 40_000);
    }
}
