//! Globals: byte offsets into the primitive global storage (checked per
//! access for the indirect forms) and ref global ordinals.

use super::super::module::BytecodeState;
use crate::refs::Ref;
use ferrite_base::{bail, status, Result};
use std::cell::UnsafeCell;
use std::sync::atomic::AtomicBool;
use std::sync::atomic::Ordering::{Acquire, Relaxed, Release};

/// A ref global: its value behind a one-word spin lock. A load clones the
/// ref under the lock and a store replaces it, each holding the lock for a
/// reference-count update; programs load their device and memoized
/// command buffers from globals on every call. A parking mutex's release
/// is an atomic read-modify-write (it checks for parked waiters); this
/// lock's is a plain store, one atomic update fewer per access. Waiters
/// spin briefly, then yield their thread until the holder lets go.
pub(crate) struct RefGlobal {
    locked: AtomicBool,
    value: UnsafeCell<Option<Ref>>,
}

// SAFETY: the value is reached only through a `RefGlobalGuard`, which
// exists only while its holder owns `locked` (taken with acquire, given
// back with release ordering), so accesses are exclusive and ordered; `Ref`
// is `Send + Sync`.
unsafe impl Sync for RefGlobal {}

impl RefGlobal {
    /// A null global.
    pub(crate) fn new() -> RefGlobal {
        RefGlobal {
            locked: AtomicBool::new(false),
            value: UnsafeCell::new(None),
        }
    }

    /// Takes the lock: exclusive access to the value until the guard drops.
    #[inline]
    pub(crate) fn lock(&self) -> RefGlobalGuard<'_> {
        if self.locked.swap(true, Acquire) {
            self.lock_contended();
        }
        RefGlobalGuard(self)
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
}

/// Exclusive access to a [`RefGlobal`]'s value (see [`RefGlobal::lock`]).
pub(crate) struct RefGlobalGuard<'a>(&'a RefGlobal);

impl std::ops::Deref for RefGlobalGuard<'_> {
    type Target = Option<Ref>;
    fn deref(&self) -> &Option<Ref> {
        // SAFETY: the guard holds the lock (see `RefGlobal`'s `Sync`).
        unsafe { &*self.0.value.get() }
    }
}

impl std::ops::DerefMut for RefGlobalGuard<'_> {
    fn deref_mut(&mut self) -> &mut Option<Ref> {
        // SAFETY: the guard holds the lock, and `&mut self` makes this the
        // only access through it.
        unsafe { &mut *self.0.value.get() }
    }
}

impl Drop for RefGlobalGuard<'_> {
    #[inline]
    fn drop(&mut self) {
        self.0.locked.store(false, Release);
    }
}

pub(crate) fn global_slot(state: &BytecodeState, byte_offset: u32, width: u32) -> Result<usize> {
    if !byte_offset.is_multiple_of(4)
        || byte_offset as u64 + width as u64 > state.globals.len() as u64 * 4
    {
        bail!(
            OutOfRange,
            "global byte offset {byte_offset} (+{width}) out of range or misaligned ({} bytes of globals)",
            state.globals.len() * 4
        );
    }
    Ok((byte_offset / 4) as usize)
}

pub(crate) fn ref_global(state: &BytecodeState, ordinal: u32) -> Result<&RefGlobal> {
    state.ref_globals.get(ordinal as usize).ok_or_else(|| {
        status!(
            OutOfRange,
            "ref global {ordinal} out of range ({} ref globals)",
            state.ref_globals.len()
        )
    })
}

/// Reads the 64-bit global at slot `s` (checked by [`global_slot`] with
/// width 8), low half first.
#[inline]
pub(super) fn load_i64(state: &BytecodeState, s: usize) -> i64 {
    let lo = state.globals[s].load(Relaxed) as u64;
    let hi = state.globals[s + 1].load(Relaxed) as u64;
    (lo | hi << 32) as i64
}

/// Writes the 64-bit global at slot `s` (checked as for [`load_i64`]).
#[inline]
pub(super) fn store_i64(state: &BytecodeState, s: usize, v: i64) {
    state.globals[s].store(v as u32, Relaxed);
    state.globals[s + 1].store((v as u64 >> 32) as u32, Relaxed);
}
