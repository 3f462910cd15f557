//! Globals: byte offsets into the primitive global storage (checked per
//! access for the indirect forms) and ref global ordinals.

use super::super::module::BytecodeState;
use crate::refs::Ref;
use ferrite_base::spin::SpinLock;
use ferrite_base::{bail, status, Result};
use std::sync::atomic::Ordering::Relaxed;

/// A ref global: its value behind a one-word spin lock
/// ([`ferrite_base::spin`]). A load clones the ref under the lock and a
/// store replaces it, each holding the lock for a reference-count update;
/// programs load their device and memoized command buffers from globals on
/// every call, and the lock's release is a plain store.
pub(crate) type RefGlobal = SpinLock<Option<Ref>>;

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
