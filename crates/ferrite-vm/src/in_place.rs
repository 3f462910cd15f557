//! In-place entries: a second, typed way into a native function, for calls
//! from bytecode that finish at once.
//!
//! A native function's body ([`crate::native::NativeFn`]) serves every
//! call: from the host, from bytecode, resumed after a yield. That
//! generality costs on each call from bytecode: a [`NativeCall`] record
//! with its wait and save slots, an argument reader that can read values or
//! registers, result writers that check the declared result types, and an
//! outcome (`Result<NativePoll>`) returned through memory and inspected
//! afterwards. A function may also register an [`InPlaceFn`]: it reads its
//! arguments straight from the caller's registers ([`InPlaceArgs`]), writes
//! its results straight into the caller's result registers and answers one
//! word: `Ok(true)` (done), `Ok(false)` (declined) or `Err` (failed).
//!
//! The contract of an entry: it declines (returns `Ok(false)`) before it
//! has any effect whenever it cannot finish the call itself (an argument
//! of another type or null where it needs an object, a result shape it
//! does not write, anything that would yield or fail with a message the
//! body renders): the interpreter then runs the body as if the entry did
//! not exist, so every message and every rare path stays the body's. An
//! `Err` is reported as the body's failure would be (annotated with the
//! function's name, with a frame for the backtrace).
//!
//! [`NativeCall`]: crate::stack::NativeCall

use crate::bytecode::verifier::{MOVE_BIT, REF_BIT, REF_MASK};
use crate::refs::{Ref, RefObject};
use crate::stack::Operand;
use ferrite_base::Result;

/// A native function's in-place entry (see the module documentation):
/// `Ok(true)` when it finished the call and wrote its results, `Ok(false)`
/// when it declined before any effect.
pub type InPlaceFn = dyn Fn(&mut InPlaceCall<'_>) -> Result<bool> + Send + Sync;

/// A call from bytecode as an in-place entry sees it: the caller's
/// registers, the call's operands (verified against the import's
/// signature) and result registers.
///
/// Made only by the interpreter (`native_bridge::call_entry`), with this
/// invariant, which [`InPlaceArgs`] relies on to read registers without
/// bounds checks: `regs` and `refs` are the calling function's register
/// windows (`i32_count` and `ref_count` long) and `operands` were listed
/// at decode time from the call's register list with the import's
/// signature, the list the verifier checked against that same signature
/// (and the same variadic expansion): an `I32`/`F32` operand's register is
/// below `i32_count`, an `I64`/`F64` operand's pair `r, r + 1` too, and a
/// `Ref` operand's slot (`r & REF_MASK`) below `ref_count`.
pub struct InPlaceCall<'a> {
    pub(crate) regs: &'a mut [u32],
    pub(crate) refs: &'a mut [Option<Ref>],
    pub(crate) operands: &'a [Operand],
    /// The ref operands the caller moves into the call.
    pub(crate) moved: &'a [Operand],
    /// The caller's result registers (ref registers carry the ref bit).
    pub(crate) results: &'a [u32],
}

/// The ref register a call's single ref result goes to, checked by
/// [`InPlaceCall::ref_result`].
#[derive(Clone, Copy)]
pub struct RefResult(usize);

/// The i32 register a call's single i32 result goes to, checked by
/// [`InPlaceCall::i32_result`].
#[derive(Clone, Copy)]
pub struct I32Result(usize);

impl<'a> InPlaceCall<'a> {
    /// Reads the arguments from the first.
    #[inline(always)]
    pub fn args(&self) -> InPlaceArgs<'_> {
        InPlaceArgs {
            regs: self.regs,
            refs: self.refs,
            operands: self.operands,
            at: 0,
        }
    }

    /// The register of the call's result when it is exactly one ref.
    #[inline(always)]
    pub fn ref_result(&self) -> Option<RefResult> {
        let [reg] = *self.results else { return None };
        let reg = reg as u16;
        let slot = (reg & REF_MASK) as usize;
        (reg & REF_BIT != 0 && slot < self.refs.len()).then_some(RefResult(slot))
    }

    /// The register of the call's result when it is exactly one i32.
    #[inline(always)]
    pub fn i32_result(&self) -> Option<I32Result> {
        let [reg] = *self.results else { return None };
        let reg = reg as u16;
        (reg & REF_BIT == 0 && (reg as usize) < self.regs.len()).then_some(I32Result(reg as usize))
    }

    /// True when the call has no results.
    #[inline(always)]
    pub fn no_results(&self) -> bool {
        self.results.is_empty()
    }

    /// Finishes a call without results: releases the ref operands the
    /// caller moved into it (the entry only borrowed them).
    #[inline(always)]
    pub fn finish(&mut self) {
        release_moved(self.refs, self.moved);
    }

    /// Finishes the call with `value` in its ref result register.
    /// The moved operands are released first: the result may go to a
    /// register one of them frees.
    #[inline(always)]
    pub fn finish_ref(&mut self, at: RefResult, value: Ref) {
        release_moved(self.refs, self.moved);
        self.refs[at.0] = Some(value);
    }

    /// Finishes the call with `value` in its i32 result register.
    #[inline(always)]
    pub fn finish_i32(&mut self, at: I32Result, value: i32) {
        release_moved(self.refs, self.moved);
        self.regs[at.0] = value as u32;
    }

    /// Takes the ref of argument `index` when the caller moved it into the
    /// call (its last use): the callee keeps that reference instead of
    /// copying it and releasing the register's. `None` when the operand is
    /// not a moved ref or the register is empty.
    #[inline]
    pub fn take_moved_ref(&mut self, index: usize) -> Option<Ref> {
        match *self.operands.get(index)? {
            Operand::Ref(reg) if reg & MOVE_BIT != 0 => {
                self.refs.get_mut((reg & REF_MASK) as usize)?.take()
            }
            _ => None,
        }
    }
}

/// Releases the ref operands the caller moved into the call: `moved`
/// lists only those (made at decode time), so no move bit to test.
/// Out of line, though saving and restoring the registers a release needs
/// cost more than the loop: inlined into each entry it took ~240
/// instructions off an add call but added ~100 I1 misses and ~2% CPU time
/// (docs/figures.md, Cost, HS).
#[inline(never)]
fn release_moved(refs: &mut [Option<Ref>], moved: &[Operand]) {
    for op in moved {
        if let Operand::Ref(reg) = *op {
            if let Some(slot) = refs.get_mut((reg & REF_MASK) as usize) {
                *slot = None;
            }
        }
    }
}

/// Reads an in-place call's arguments in order. Every reader answers
/// `None` where the body would fail (a missing argument, another type, a
/// null or mistyped object): the entry then declines and the body renders
/// the message.
pub struct InPlaceArgs<'a> {
    regs: &'a [u32],
    refs: &'a [Option<Ref>],
    operands: &'a [Operand],
    at: usize,
}

impl<'a> InPlaceArgs<'a> {
    #[inline(always)]
    fn next(&mut self) -> Option<Operand> {
        let op = *self.operands.get(self.at)?;
        self.at += 1;
        Some(op)
    }

    /// The next argument as i32 (also a variadic span's count).
    #[inline(always)]
    pub fn i32(&mut self) -> Option<i32> {
        match self.next()? {
            // SAFETY: an `I32` operand's register is below `i32_count`, the
            // length of `regs` (see `InPlaceCall`'s invariant).
            Operand::I32(r) => Some(unsafe { *self.regs.get_unchecked(r as usize) } as i32),
            Operand::Count(n) => Some(n),
            _ => None,
        }
    }

    /// The next argument as a variadic span's count (non-negative).
    #[inline(always)]
    pub fn count(&mut self) -> Option<usize> {
        usize::try_from(self.i32()?).ok()
    }

    /// The next argument as i64.
    #[inline(always)]
    pub fn i64(&mut self) -> Option<i64> {
        match self.next()? {
            Operand::I64(r) => {
                let r = r as usize;
                // SAFETY: an `I64` operand's pair `r, r + 1` is below
                // `i32_count`, the length of `regs` (`InPlaceCall`'s
                // invariant).
                let (lo, hi) = unsafe {
                    (
                        *self.regs.get_unchecked(r) as u64,
                        *self.regs.get_unchecked(r + 1) as u64,
                    )
                };
                Some((lo | hi << 32) as i64)
            }
            _ => None,
        }
    }

    /// The next argument as a (possibly null) ref.
    #[inline(always)]
    pub fn opt_ref(&mut self) -> Option<Option<&'a Ref>> {
        match self.next()? {
            Operand::Ref(r) => {
                // SAFETY: a `Ref` operand's slot is below `ref_count`, the
                // length of `refs` (`InPlaceCall`'s invariant).
                let slot = unsafe { self.refs.get_unchecked((r & REF_MASK) as usize) };
                Some(slot.as_ref())
            }
            _ => None,
        }
    }

    /// The next argument as a non-null ref.
    #[inline(always)]
    pub fn a_ref(&mut self) -> Option<&'a Ref> {
        self.opt_ref()?
    }

    /// The next argument as a non-null object of type `T`.
    #[inline(always)]
    pub fn obj<T: RefObject>(&mut self) -> Option<&'a T> {
        self.a_ref()?.downcast::<T>()
    }

    /// The next argument as a possibly-null object of type `T` (`None`
    /// when it is of another type, `Some(None)` when null).
    #[inline(always)]
    pub fn opt_obj<T: RefObject>(&mut self) -> Option<Option<&'a T>> {
        match self.opt_ref()? {
            None => Some(None),
            Some(r) => r.downcast::<T>().map(Some),
        }
    }

    /// Where the next argument is read from (0 for the first).
    pub fn position(&self) -> usize {
        self.at
    }
}
