//! Branches (with their block-argument remaps) and `vm.fail`. Remap lists
//! are read from the pool with bounds checks; the hot primitive-only form
//! is `PrimitiveRemapBranch` in the dispatch loop.

use super::super::verifier::REF_BIT;
use super::registers::{ref_slot, take_ref};
use crate::refs::Ref;
use ferrite_base::{Result, Status, StatusCode};

pub(super) fn remap(regs: &mut [u32], refs: &mut [Option<Ref>], pool: &[u32], at: usize) {
    let n = pool[at] as usize;
    for i in 0..n {
        let src = pool[at + 1 + 2 * i] as u16;
        let dst = pool[at + 2 + 2 * i] as u16;
        if src & REF_BIT != 0 {
            let v = take_ref(refs, src);
            refs[ref_slot(dst)] = v;
        } else {
            regs[dst as usize] = regs[src as usize];
        }
    }
}

/// Branches to the target at pool `at` (target then remap list).
#[inline(always)]
pub(super) fn branch(regs: &mut [u32], refs: &mut [Option<Ref>], pool: &[u32], at: usize) -> usize {
    if pool[at + 1] != 0 {
        remap(regs, refs, pool, at + 1);
    }
    pool[at] as usize
}

/// Pool index just past the remap list at `at`.
pub(super) fn skip_remap(pool: &[u32], at: usize) -> usize {
    at + 1 + 2 * pool[at] as usize
}

pub(crate) fn check_fail(code: i32, message: &str) -> Result<()> {
    if code == 0 {
        return Ok(());
    }
    Err(Status::new(StatusCode::from_u32(code as u32), message))
}
