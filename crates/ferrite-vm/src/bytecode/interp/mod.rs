//! The bytecode interpreter.
//!
//! Runs decoded, verified instructions ([`super::verifier`]) of the frames
//! at the top of a [`Stack`]. Calls between functions of one module stay in
//! this loop, and so do calls to native imports that finish in one step
//! (they read their arguments from the caller's registers); other import
//! calls, returns to the host and yields hand a [`Step`] back to the
//! invocation loop, which owns cross-module control flow.
//!
//! - [`dispatch`]: the dispatch loop, one `match` over the instructions;
//!   numeric ops come from the tables in [`ops_int`] and [`ops_float`]
//!   (one row per op pair, expanded for both widths; shapes in
//!   [`numeric`]).
//! - [`registers`]: a frame's register window and its unchecked accessors.
//! - [`frames`]: frames, and calls and returns inside a module.
//! - [`native_bridge`]: native imports called in place.
//! - [`values`]: arguments and results as values, for the host and other
//!   modules.
//! - [`control`], [`ops_global`], [`ops_ref`]: branches and `vm.fail`,
//!   globals, and ref checks.
//!
//! # The unsafe contract: only verified bytecode is interpreted
//!
//! The interpreter reads instructions and primitive registers without
//! bounds checks. That is sound because of facts the verifier establishes
//! and the types carry, not because of comments at each access:
//!
//! 1. Instructions come only from a [`DecodedFunction`], which only the
//!    verifier makes and nothing changes after load. Every pc the loop can
//!    reach indexes one: execution starts at 0, branch and resume targets
//!    were checked against the instruction count, and the `EndOfFunction`
//!    sentinel after the last instruction fails instead of falling through.
//! 2. Register operands are bank-typed [`Reg<B>`]s, which only the
//!    verifier makes, after checking them against the function's register
//!    counts for bank `B` (see [`Reg`] for the exact facts). A decoded
//!    instruction carries them in its [`OpRegs`], whose operand types are
//!    generated from the ISA: each operand is a `Reg` of the bank the ISA
//!    gives it. The unchecked accessors of [`Registers`] take only `Reg`s,
//!    and are `unsafe fn`s whose preconditions are those facts.
//! 3. The window an access goes through is the function's own:
//!    [`Registers::of`] cuts it to exactly the `i32_count` of the function
//!    whose instructions [`dispatch`] then reads.
//! 4. Each access has the width of its operand's bank, as a fact of the
//!    types rather than of this module's code: the 32-bit accessors take
//!    only registers of a 32-bit bank ([`Narrow`]), the 64-bit ones only of
//!    a 64-bit bank ([`Wide`]), and [`Slot`] ties each value type to its
//!    bank. An arm binds its operands from the instruction's [`OpRegs`]
//!    variant, so reading an i32 operand as 64-bit (which could step one
//!    slot past the window) does not compile (see [`Registers`]' example);
//!    so do a numeric table row whose type disagrees with the ISA, and a
//!    primitive register passed as a ref. What is left to this module is
//!    the value's meaning (reading an f32 operand's bits as u32, which
//!    shared 32-bit arms do, is sound).
//!
//! Ref registers, call operand lists and pool data are read with bounds
//! checks; nothing a `.vmfb` contains can make them panic, as the verifier
//! checked them too, but no `unsafe` depends on it.
//!
//! [`DecodedFunction`]: super::verifier::DecodedFunction
//! [`Reg`]: super::verifier::Reg
//! [`Reg<B>`]: super::verifier::Reg
//! [`OpRegs`]: super::isa::OpRegs
//! [`Narrow`]: super::isa_types::bank::Narrow
//! [`Wide`]: super::isa_types::bank::Wide
//! [`Slot`]: registers::Slot
//! [`Registers`]: registers::Registers
//! [`Registers::of`]: registers::Registers::of

pub(super) mod control;
mod dispatch;
pub(super) mod frames;
pub(crate) mod native_bridge;
mod numeric;
mod ops_float;
pub(super) mod ops_global;
pub(super) mod ops_int;
pub(super) mod ops_ref;
mod registers;
pub(crate) mod values;

use super::module::BytecodeState;
use super::verifier::pool_list;
use crate::module::FunctionRef;
use crate::stack::{Frame, Stack, Wait};
use crate::value::Variant;
use dispatch::{exec, Action};
use ferrite_base::{bail, Result};
use frames::Cursor;
use native_bridge::{keep_call, Parked};
use std::sync::Arc;
use values::{read_values_into, read_variadic};

pub(crate) use frames::{deliver_results, frame_state, pop_frame};
pub use registers::Registers;

/// What the interpreter asks of the invocation loop.
pub(crate) enum Step {
    /// The externally-entered frame returned these results.
    Return(Vec<Variant>),
    /// Call another module's function; results go to the top frame.
    Call(FunctionRef, Vec<Variant>),
    /// Suspend until the wait is satisfied, then run the top frame again.
    Yield(Wait),
}

/// Runs the top frame (which must be bytecode) until it leaves the module.
pub(crate) fn run(stack: &mut Stack) -> Result<Step> {
    let top_index = stack.frames.len().wrapping_sub(1);
    // The module state lives in the nearest externally-entered frame. It is
    // moved out for the duration of the run (and put back below) so that the
    // interpreter can hold it while mutating the stack without refcounting.
    let Some(owner) = (0..=top_index)
        .rev()
        .find(|&i| matches!(&stack.frames[i], Frame::Bytecode(b) if b.state.is_some()))
    else {
        bail!(Internal, "bytecode frame without a module state");
    };
    let Frame::Bytecode(holder) = &mut stack.frames[owner] else {
        bail!(Internal, "bytecode frame without a module state");
    };
    let Some(state) = holder.state.take() else {
        bail!(Internal, "bytecode frame without a module state");
    };
    let step = run_with(&state, stack);
    match stack.frames.get_mut(owner) {
        Some(Frame::Bytecode(holder)) => holder.state = Some(state),
        // The frame returned: the stack keeps its state for the next
        // invocation of the same state (see `Stack::kept_state`).
        _ => stack.kept_state = Some(state),
    }
    step
}

fn run_with(state: &Arc<BytecodeState>, stack: &mut Stack) -> Result<Step> {
    let Some(Frame::Bytecode(top)) = stack.frames.last() else {
        bail!(Internal, "interpreter entered on a non-bytecode frame");
    };
    let mut cur = Cursor {
        function: top.function as usize,
        pc: top.pc as usize,
        i32_base: top.i32_base as usize,
        ref_base: top.ref_base as usize,
    };
    let module = &*state.module;
    let result = if stack.coverage.is_some() || stack.trace.is_some() {
        exec::<true>(state, stack, &mut cur)
    } else {
        exec::<false>(state, stack, &mut cur)
    };
    let Some(Frame::Bytecode(frame)) = stack.frames.last_mut() else {
        bail!(Internal, "bytecode frame vanished");
    };
    // Keep the frame record in sync for backtraces and resumption.
    frame.pc = cur.pc as u32;
    frame.current = cur.pc.saturating_sub(1) as u32;
    let action = result?;
    let func = &module.functions[cur.function];
    let (ib, rb) = (cur.i32_base, cur.ref_base);
    let (ic, rc) = (func.i32_count as usize, func.ref_count as usize);
    match action {
        Action::Return { list } => {
            let out = stack.spare_values.pop().unwrap_or_default();
            let regs = &stack.i32_regs[ib..ib + ic];
            let refs = &mut stack.ref_regs[rb..rb + rc];
            let list = pool_list(&func.pool, list);
            let vals = read_values_into(regs, refs, list, &func.cconv.results, out)?;
            pop_frame(stack, ib, rb);
            Ok(Step::Return(vals))
        }
        Action::CallImport {
            import,
            segments,
            args,
            results,
            resume,
        } => {
            frame.pc = resume as u32;
            frame.pending_results = results as u32;
            let target = state.import_ref(import)?;
            let list = pool_list(&func.pool, args);
            let seg = segments.map(|seg| pool_list(&func.pool, seg));
            let spare = stack.spare_values.pop().unwrap_or_default();
            let regs = &stack.i32_regs[ib..ib + ic];
            let refs = &mut stack.ref_regs[rb..rb + rc];
            let vals = match seg {
                None => read_values_into(regs, refs, list, &target.cconv.args, spare)?,
                Some(seg) => read_variadic(regs, refs, list, &target.cconv.args, seg, spare)?,
            };
            Ok(Step::Call(target.clone(), vals))
        }
        Action::Parked(parked) => {
            let Parked {
                body,
                outcome,
                saved,
                spare,
                results,
                resume,
            } = *parked;
            frame.pc = resume as u32;
            frame.pending_results = results as u32;
            let operands = std::mem::take(&mut stack.operands);
            let mut call = keep_call(stack, ib, ic, rb, rc, operands, saved, spare);
            match outcome {
                Ok(w) => {
                    call.resumed = true;
                    stack.push_native_call(body, call);
                    Ok(Step::Yield(w))
                }
                Err(e) => {
                    stack.push_native_call(body, call);
                    Err(e)
                }
            }
        }
        Action::Yield => Ok(Step::Yield(Wait::yield_now())),
    }
}
