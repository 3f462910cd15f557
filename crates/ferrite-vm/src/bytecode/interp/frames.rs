//! Frames: pushing and popping bytecode frames, delivering results across
//! modules, and calls and returns between functions of one module (which
//! copy arguments and results between the two frames' registers).

use super::super::module::{BytecodeModule, BytecodeState};
use super::super::verifier::pool_list;
use super::registers::{ref_slot, take_ref};
use super::values::write_results;
use crate::cconv::CconvType;
use crate::refs::Ref;
use crate::stack::{BytecodeFrame, Frame, Stack};
use crate::value::Variant;
use ferrite_base::{bail, Result};
use std::sync::Arc;

/// Where the interpreter is: the top frame's function, next instruction and
/// register bases.
pub(super) struct Cursor {
    pub(super) function: usize,
    pub(super) pc: usize,
    pub(super) i32_base: usize,
    pub(super) ref_base: usize,
}

/// Pushes a bytecode frame for internal function `function`. `state` is
/// given for frames entered from outside the module (host or another
/// module); frames of internal calls inherit their caller's.
pub(crate) fn push_frame(
    stack: &mut Stack,
    module: &BytecodeModule,
    state: Option<Arc<BytecodeState>>,
    function: u32,
) -> Result<(usize, usize)> {
    stack.check_depth()?;
    let f = &module.functions[function as usize];
    let (ib, rb) = stack.push_registers(f.i32_count as usize, f.ref_count as usize)?;
    // The arenas only grow; `push_registers` zeroes the frame's primitive
    // registers, and ref registers are cleared when their frame pops.
    let external = state.is_some();
    stack.frames.push(Frame::Bytecode(BytecodeFrame {
        state,
        function,
        pc: 0,
        current: 0,
        i32_base: ib as u32,
        ref_base: rb as u32,
        pending_results: u32::MAX,
        external,
    }));
    Ok((ib, rb))
}

pub(crate) fn pop_frame(stack: &mut Stack, ib: usize, rb: usize) {
    stack.frames.pop();
    for r in &mut stack.ref_regs[rb..stack.ref_top] {
        if r.is_some() {
            *r = None;
        }
    }
    stack.i32_top = ib;
    stack.ref_top = rb;
}

/// The state of bytecode frame `index`: its own when entered externally,
/// else that of the nearest externally-entered frame below it.
pub(crate) fn frame_state(frames: &[Frame], index: usize) -> Option<&Arc<BytecodeState>> {
    frames[..=index].iter().rev().find_map(|f| match f {
        Frame::Bytecode(b) => b.state.as_ref(),
        Frame::Native(_) => None,
    })
}

/// Delivers a cross-module callee's results to the top (bytecode) frame.
pub(crate) fn deliver_results(stack: &mut Stack, mut results: Vec<Variant>) -> Result<()> {
    let top = stack.frames.len().wrapping_sub(1);
    let Stack {
        frames,
        i32_regs,
        ref_regs,
        ..
    } = stack;
    let Some(Frame::Bytecode(f)) = frames.get(top) else {
        bail!(Internal, "results delivered to a non-bytecode frame");
    };
    let (function, at) = (f.function as usize, f.pending_results);
    let (ib, rb) = (f.i32_base as usize, f.ref_base as usize);
    if at == u32::MAX {
        bail!(Internal, "no call awaiting results");
    }
    let Some(state) = frame_state(frames, top) else {
        bail!(Internal, "bytecode frame without a module state");
    };
    let func = &state.module.functions[function];
    let list = pool_list(&func.pool, at as usize);
    let regs = &mut i32_regs[ib..ib + func.i32_count as usize];
    let refs = &mut ref_regs[rb..rb + func.ref_count as usize];
    let r = write_results(regs, refs, list, &mut results);
    if let Some(Frame::Bytecode(f)) = frames.get_mut(top) {
        f.pending_results = u32::MAX;
    }
    stack.recycle_values(results);
    r
}

/// Pushes the frame of internal function `callee` called from the current
/// frame, copying the arguments listed at pool index `args`.
#[allow(clippy::too_many_arguments)]
#[inline(never)]
pub(super) fn enter_call(
    module: &BytecodeModule,
    stack: &mut Stack,
    cur: &mut Cursor,
    callee: usize,
    args: usize,
    results: usize,
    resume: usize,
    pc: usize,
) -> Result<()> {
    if stack.frames.len() >= stack.max_depth {
        bail!(
            ResourceExhausted,
            "stack overflow: call depth would exceed the limit of {} frames",
            stack.max_depth
        );
    }
    if let Some(Frame::Bytecode(f)) = stack.frames.last_mut() {
        f.pc = resume as u32;
        f.current = (pc - 1) as u32;
        f.pending_results = results as u32;
    }
    let func = &module.functions[cur.function];
    let (ib, rb) = (cur.i32_base, cur.ref_base);
    let (ic, rc) = (func.i32_count as usize, func.ref_count as usize);
    let callee_fn = &module.functions[callee];
    let (cib, crb) =
        stack.push_registers(callee_fn.i32_count as usize, callee_fn.ref_count as usize)?;
    let (caller_regs, callee_regs) = stack.i32_regs.split_at_mut(cib);
    let (caller_refs, callee_refs) = stack.ref_regs.split_at_mut(crb);
    copy_args(
        &caller_regs[ib..ib + ic],
        &mut caller_refs[rb..rb + rc],
        callee_regs,
        callee_refs,
        pool_list(&func.pool, args),
        &callee_fn.cconv.args,
    );
    stack.frames.push(Frame::Bytecode(BytecodeFrame {
        state: None,
        function: callee as u32,
        pc: 0,
        current: 0,
        i32_base: cib as u32,
        ref_base: crb as u32,
        pending_results: u32::MAX,
        external: false,
    }));
    *cur = Cursor {
        function: callee,
        pc: 0,
        i32_base: cib,
        ref_base: crb,
    };
    Ok(())
}

/// Returns from an internally-called frame into its caller, copying the
/// results listed at pool index `list`. False when the frame was entered
/// from outside the module (the caller then hands results to `run`).
#[inline(never)]
pub(super) fn leave_call(
    module: &BytecodeModule,
    stack: &mut Stack,
    cur: &mut Cursor,
    list: usize,
) -> bool {
    if ferrite_base::trace::enabled() {
        end_span(stack);
    }
    let n = stack.frames.len();
    let internal = matches!(stack.frames.last(), Some(Frame::Bytecode(f)) if !f.external);
    let caller = if internal {
        stack.frames.get(n.wrapping_sub(2))
    } else {
        None
    };
    let Some(Frame::Bytecode(caller)) = caller else {
        return false;
    };
    let func = &module.functions[cur.function];
    let (ib, rb) = (cur.i32_base, cur.ref_base);
    let (ic, rc) = (func.i32_count as usize, func.ref_count as usize);
    let caller_fn = &module.functions[caller.function as usize];
    let dst = pool_list(&caller_fn.pool, caller.pending_results as usize);
    let (cib, crb) = (caller.i32_base as usize, caller.ref_base as usize);
    let (cic, crc) = (caller_fn.i32_count as usize, caller_fn.ref_count as usize);
    let next = Cursor {
        function: caller.function as usize,
        pc: caller.pc as usize,
        i32_base: cib,
        ref_base: crb,
    };
    let (lo_regs, hi_regs) = stack.i32_regs.split_at_mut(ib);
    let (lo_refs, hi_refs) = stack.ref_regs.split_at_mut(rb);
    copy_results(
        &hi_regs[..ic],
        &mut hi_refs[..rc],
        &mut lo_regs[cib..cib + cic],
        &mut lo_refs[crb..crb + crc],
        pool_list(&func.pool, list),
        dst,
        &func.cconv.results,
    );
    let top = stack.ref_top;
    for r in &mut stack.ref_regs[rb..top] {
        if r.is_some() {
            *r = None;
        }
    }
    stack.i32_top = ib;
    stack.ref_top = rb;
    stack.frames.pop();
    if let Some(Frame::Bytecode(f)) = stack.frames.last_mut() {
        f.pending_results = u32::MAX;
    }
    *cur = next;
    true
}

/// Copies call operands from the caller's registers to the callee's ABI
/// registers (each bank packed from 0), per the callee's argument types.
fn copy_args(
    caller_regs: &[u32],
    caller_refs: &mut [Option<Ref>],
    callee_regs: &mut [u32],
    callee_refs: &mut [Option<Ref>],
    list: &[u32],
    types: &[CconvType],
) {
    let (mut ii, mut ri) = (0usize, 0usize);
    for (&reg, t) in list.iter().zip(types) {
        let reg = reg as u16;
        match t {
            CconvType::Ref => {
                callee_refs[ri] = take_ref(caller_refs, reg);
                ri += 1;
            }
            t => {
                let n = t.i32_slots();
                // 64-bit arguments start on an even slot.
                ii += ii % n;
                callee_regs[ii] = caller_regs[reg as usize];
                if n == 2 {
                    callee_regs[ii + 1] = caller_regs[reg as usize + 1];
                }
                ii += n;
            }
        }
    }
}

/// Copies return operands of the callee into the caller's result registers.
fn copy_results(
    callee_regs: &[u32],
    callee_refs: &mut [Option<Ref>],
    caller_regs: &mut [u32],
    caller_refs: &mut [Option<Ref>],
    src: &[u32],
    dst: &[u32],
    types: &[CconvType],
) {
    for ((&s, &d), t) in src.iter().zip(dst).zip(types) {
        let (s, d) = (s as u16, d as u16);
        match t {
            CconvType::Ref => caller_refs[ref_slot(d)] = take_ref(callee_refs, s),
            t => {
                caller_regs[d as usize] = callee_regs[s as usize];
                if t.i32_slots() == 2 {
                    caller_regs[d as usize + 1] = callee_regs[s as usize + 1];
                }
            }
        }
    }
}

/// Notes that bytecode function `function` was entered (a trace is being
/// recorded); its span is recorded when it returns ([`end_span`]).
/// `INSTRUMENTED` is the dispatch loop's coverage/trace path, on which the
/// compiling tier steps aside.
pub(super) fn begin_span<const INSTRUMENTED: bool>(
    module: &BytecodeModule,
    stack: &mut Stack,
    function: usize,
) {
    #[cfg(feature = "jit")]
    let compiled = !INSTRUMENTED
        && module
            .jit
            .as_ref()
            .and_then(|j| j.entry(function))
            .is_some();
    #[cfg(not(feature = "jit"))]
    let compiled = false;
    let name = module
        .function_names
        .get(function)
        .map_or_else(|| format!("@{function}"), String::clone);
    stack.spans.push(crate::stack::FunctionSpan {
        start_ns: ferrite_base::trace::now_ns(),
        name: format!("{}.{name}", module.archive().name()),
        compiled,
    });
}

/// Records the span of the function returning now (entered while a trace
/// was being recorded), with the tier that ran it. Calls the compiling
/// tier made inside compiled code are part of their caller's span.
pub(super) fn end_span(stack: &mut Stack) {
    use ferrite_base::trace::{self, Arg};
    let Some(span) = stack.spans.pop() else {
        return;
    };
    let tier = if span.compiled {
        "compiled"
    } else {
        "interpreted"
    };
    trace::complete(
        "vm",
        span.name,
        trace::HOST_TRACK,
        span.start_ns,
        vec![("tier", Arg::Str(tier.to_string()))],
    );
}
