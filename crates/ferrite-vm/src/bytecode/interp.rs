//! The bytecode interpreter.
//!
//! Runs decoded, verified instructions ([`super::verifier`]) of the frames
//! at the top of a [`Stack`]. Calls between functions of one module stay in
//! this loop, and so do calls to native imports that finish in one step
//! (they read their arguments from the caller's registers); other import
//! calls, returns to the host and yields hand a [`Step`] back to the
//! invocation loop, which owns cross-module control flow.

use super::isa::Op;
use super::module::{BytecodeModule, BytecodeState};
use super::verifier::{
    call_operands, pool_list, DecodedFunction, Insn, IMPORT_BIT, MOVE_BIT, REF_BIT, REF_MASK,
};
use crate::buffer::VmBuffer;
use crate::cconv::CconvType;
use crate::list::VmList;
use crate::module::FunctionRef;
use crate::refs::Ref;
use crate::stack::{
    Args, BytecodeFrame, Frame, NativeCall, NativePoll, NativeStep, Operand, Stack, Wait,
};
use crate::types::TypeDef;
use crate::value::Variant;
use ferrite_base::{bail, status, Result, Status, StatusCode};
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;

/// What the interpreter asks of the invocation loop.
pub(crate) enum Step {
    /// The externally-entered frame returned these results.
    Return(Vec<Variant>),
    /// Call another module's function; results go to the top frame.
    Call(FunctionRef, Vec<Variant>),
    /// Suspend until the wait is satisfied, then run the top frame again.
    Yield(Wait),
}

/// Where the interpreter is: the top frame's function, next instruction and
/// register bases.
struct Cursor {
    function: usize,
    pc: usize,
    i32_base: usize,
    ref_base: usize,
}

/// Control transfers the dispatch loop hands back to [`run`].
enum Action {
    CallImport {
        import: u32,
        segments: Option<usize>,
        args: usize,
        results: usize,
        resume: usize,
    },
    Return {
        list: usize,
    },
    Yield,
    /// A native import called in place yielded or failed: it needs a frame.
    Parked(Box<Parked>),
}

/// An in-place native call that outlives its step.
struct Parked {
    body: Arc<dyn NativeStep>,
    /// The wait it yielded on, or its failure.
    outcome: Result<Wait>,
    saved: Option<Box<dyn std::any::Any + Send>>,
    spare: Vec<Variant>,
    results: usize,
    resume: usize,
}

/// What the dispatch loop needs to call native imports in place.
struct NativeScratch<'a> {
    operands: &'a mut Vec<Operand>,
    results: &'a mut Vec<Variant>,
    /// False when one more frame would exceed the stack's depth limit.
    depth_ok: bool,
}

/// How an attempt to call an import in place ended.
enum InPlace {
    /// Finished; its results are in the registers.
    Done,
    /// Not a native function: take the general path.
    NotNative,
    /// Yielded or failed.
    Parked(Box<Parked>),
}

#[inline(always)]
fn get_i64(regs: &[u32], r: u16) -> i64 {
    let r = r as usize;
    (regs[r] as u64 | ((regs[r + 1] as u64) << 32)) as i64
}

#[inline(always)]
fn set_i64(regs: &mut [u32], r: u16, v: i64) {
    let r = r as usize;
    regs[r] = v as u32;
    regs[r + 1] = ((v as u64) >> 32) as u32;
}

#[inline(always)]
fn ref_slot(reg: u16) -> usize {
    (reg & REF_MASK) as usize
}

/// Reads a ref operand, moving it out when the move bit is set.
#[inline(always)]
fn take_ref(refs: &mut [Option<Ref>], reg: u16) -> Option<Ref> {
    let slot = &mut refs[ref_slot(reg)];
    if reg & MOVE_BIT != 0 {
        slot.take()
    } else {
        slot.clone()
    }
}

pub(crate) fn deref_buffer<'a>(refs: &'a [Option<Ref>], reg: u16, what: &str) -> Result<&'a VmBuffer> {
    match &refs[ref_slot(reg)] {
        None => bail!(InvalidArgument, "{what} is null"),
        Some(r) => r.downcast::<VmBuffer>().ok_or_else(|| {
            status!(
                InvalidArgument,
                "{what} is a !{}, expected !vm.buffer",
                r.type_name()
            )
        }),
    }
}

fn deref_list(refs: &[Option<Ref>], reg: u16) -> Result<&VmList> {
    match &refs[ref_slot(reg)] {
        None => bail!(InvalidArgument, "list is null"),
        Some(r) => r.downcast::<VmList>().ok_or_else(|| {
            status!(
                InvalidArgument,
                "list operand is a !{}, expected !vm.list",
                r.type_name()
            )
        }),
    }
}

fn remap(regs: &mut [u32], refs: &mut [Option<Ref>], pool: &[u32], at: usize) {
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
fn branch(regs: &mut [u32], refs: &mut [Option<Ref>], pool: &[u32], at: usize) -> usize {
    if pool[at + 1] != 0 {
        remap(regs, refs, pool, at + 1);
    }
    pool[at] as usize
}

/// Pool index just past the remap list at `at`.
fn skip_remap(pool: &[u32], at: usize) -> usize {
    at + 1 + 2 * pool[at] as usize
}

pub(crate) fn div_zero(op: Op) -> Status {
    status!(
        InvalidArgument,
        "{}: integer division by zero",
        op.mnemonic()
    )
}

pub(crate) fn check_fail(code: i32, message: &str) -> Result<()> {
    if code == 0 {
        return Ok(());
    }
    Err(Status::new(StatusCode::from_u32(code as u32), message))
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

fn ref_global(state: &BytecodeState, ordinal: u32) -> Result<&parking_lot::Mutex<Option<Ref>>> {
    state.ref_globals.get(ordinal as usize).ok_or_else(|| {
        status!(
            OutOfRange,
            "ref global {ordinal} out of range ({} ref globals)",
            state.ref_globals.len()
        )
    })
}

fn type_at(state: &BytecodeState, imm: u64) -> TypeDef {
    state.module.types[imm as usize]
}

fn check_cast(r: &Option<Ref>, ty: TypeDef) -> Result<()> {
    if let Some(r) = r {
        if !ty.accepts_ref(r) {
            bail!(
                InvalidArgument,
                "ref type mismatch: value is a !{}, expected {}",
                r.type_name(),
                ty.name()
            );
        }
    }
    Ok(())
}

/// The rounding C's `roundeven` performs.
pub(crate) fn round_even_f32(x: f32) -> f32 {
    let r = x.round();
    if (x - x.trunc()).abs() == 0.5 {
        2.0 * (x / 2.0).round_ties_even_compat()
    } else {
        r
    }
}

trait RoundEven {
    fn round_ties_even_compat(self) -> Self;
}
impl RoundEven for f32 {
    fn round_ties_even_compat(self) -> f32 {
        self.round_ties_even()
    }
}
impl RoundEven for f64 {
    fn round_ties_even_compat(self) -> f64 {
        self.round_ties_even()
    }
}

/// C's `remainder` (IEEE remainder, quotient rounded to nearest even).
fn ieee_rem_f64(x: f64, y: f64) -> f64 {
    libm::remainder(x, y)
}

fn ieee_rem_f32(x: f32, y: f32) -> f32 {
    libm::remainderf(x, y)
}

/// Writes `results` (from a callee) into the registers named by `list`.
pub(crate) fn write_results(
    regs: &mut [u32],
    refs: &mut [Option<Ref>],
    list: &[u32],
    results: &mut Vec<Variant>,
) -> Result<()> {
    if list.len() != results.len() {
        bail!(
            Internal,
            "callee returned {} results, caller expects {}",
            results.len(),
            list.len()
        );
    }
    for (&reg, v) in list.iter().zip(results.drain(..)) {
        let reg = reg as u16;
        let is_ref = reg & REF_BIT != 0;
        match (v, is_ref) {
            (Variant::I32(x), false) => regs[reg as usize] = x as u32,
            (Variant::F32(x), false) => regs[reg as usize] = x.to_bits(),
            (Variant::I64(x), false) => set_i64(regs, reg, x),
            (Variant::F64(x), false) => set_i64(regs, reg, x.to_bits() as i64),
            (Variant::Ref(r), true) => refs[ref_slot(reg)] = Some(r),
            (Variant::Null, true) => refs[ref_slot(reg)] = None,
            (v, _) => bail!(
                InvalidArgument,
                "callee result {:?} does not match the caller's {} register",
                v,
                if is_ref { "ref" } else { "primitive" }
            ),
        }
    }
    Ok(())
}

/// Writes one native result to the caller's register `reg` (ref registers
/// carry the ref bit), checking it against the callee's declared type.
#[inline(always)]
pub(crate) fn write_typed(
    regs: &mut [u32],
    refs: &mut [Option<Ref>],
    reg: u32,
    ty: &CconvType,
    v: Variant,
) -> Result<()> {
    let reg = reg as u16;
    let is_ref = reg & REF_BIT != 0;
    match (ty, v, is_ref) {
        (CconvType::I32, Variant::I32(x), false) => regs[reg as usize] = x as u32,
        (CconvType::F32, Variant::F32(x), false) => regs[reg as usize] = x.to_bits(),
        (CconvType::I64, Variant::I64(x), false) => set_i64(regs, reg, x),
        (CconvType::F64, Variant::F64(x), false) => set_i64(regs, reg, x.to_bits() as i64),
        (CconvType::Ref, Variant::Ref(r), true) => refs[ref_slot(reg)] = Some(r),
        (CconvType::Ref, Variant::Null, true) => refs[ref_slot(reg)] = None,
        (ty, v, _) => bail!(
            Internal,
            "value {v:?} does not match the declared {ty:?} result or the caller's {} register",
            if is_ref { "ref" } else { "primitive" }
        ),
    }
    Ok(())
}

/// [`read_values`] into a recycled vector.
fn read_values_into(
    regs: &[u32],
    refs: &mut [Option<Ref>],
    list: &[u32],
    types: &[CconvType],
    mut out: Vec<Variant>,
) -> Result<Vec<Variant>> {
    if list.len() != types.len() {
        bail!(
            Internal,
            "register list has {} entries, signature {}",
            list.len(),
            types.len()
        );
    }
    out.clear();
    out.reserve(list.len());
    for (&reg, t) in list.iter().zip(types) {
        out.push(read_scalar_or_ref(regs, refs, reg, t)?);
    }
    Ok(out)
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

/// Places host-provided arguments into a fresh frame's ABI registers.
pub(crate) fn place_args(
    regs: &mut [u32],
    refs: &mut [Option<Ref>],
    args: &mut Vec<Variant>,
    types: &[CconvType],
) -> Result<()> {
    if args.len() != types.len() {
        bail!(
            InvalidArgument,
            "expected {} arguments, received {}",
            types.len(),
            args.len()
        );
    }
    let (mut ii, mut ri) = (0usize, 0usize);
    for (i, (v, t)) in args.drain(..).zip(types).enumerate() {
        match (t, v) {
            (CconvType::I32, Variant::I32(x)) => {
                regs[ii] = x as u32;
                ii += 1;
            }
            (CconvType::F32, Variant::F32(x)) => {
                regs[ii] = x.to_bits();
                ii += 1;
            }
            (CconvType::I64, Variant::I64(x)) => {
                ii += ii % 2;
                set_i64(regs, ii as u16, x);
                ii += 2;
            }
            (CconvType::F64, Variant::F64(x)) => {
                ii += ii % 2;
                set_i64(regs, ii as u16, x.to_bits() as i64);
                ii += 2;
            }
            (CconvType::Ref, Variant::Ref(r)) => {
                refs[ri] = Some(r);
                ri += 1;
            }
            (CconvType::Ref, Variant::Null) => {
                refs[ri] = None;
                ri += 1;
            }
            (t, v) => bail!(
                InvalidArgument,
                "argument {i}: expected {}, received {}",
                match t {
                    CconvType::I32 => "i32",
                    CconvType::I64 => "i64",
                    CconvType::F32 => "f32",
                    CconvType::F64 => "f64",
                    CconvType::Ref => "ref",
                    CconvType::Span(_) => "span",
                },
                v.kind_name()
            ),
        }
    }
    Ok(())
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
    let (ib, rb) = (stack.i32_top, stack.ref_top);
    stack.i32_top += f.i32_count as usize;
    stack.ref_top += f.ref_count as usize;
    // The arenas only grow: a frame's registers may hold stale primitive
    // values from an earlier frame (never uninitialised memory), and ref
    // registers are cleared when their frame pops.
    if stack.i32_regs.len() < stack.i32_top {
        stack.i32_regs.resize(stack.i32_top, 0);
    }
    if stack.ref_regs.len() < stack.ref_top {
        stack.ref_regs.resize(stack.ref_top, None);
    }
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
    if let Some(Frame::Bytecode(holder)) = stack.frames.get_mut(owner) {
        holder.state = Some(state);
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
    let result = if stack.coverage.is_some() {
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

/// Lists a native call's operands (per `args`, with each variadic span's
/// count from `segments`) without reading any register.
pub(crate) fn build_operands(
    out: &mut Vec<Operand>,
    list: &[u32],
    segments: Option<&[u32]>,
    args: &[CconvType],
) -> Result<()> {
    out.clear();
    let operand = |reg: u32, t: &CconvType| -> Result<Operand> {
        let reg = reg as u16;
        Ok(match t {
            CconvType::I32 => Operand::I32(reg),
            CconvType::I64 => Operand::I64(reg),
            CconvType::F32 => Operand::F32(reg),
            CconvType::F64 => Operand::F64(reg),
            CconvType::Ref => Operand::Ref(reg),
            CconvType::Span(_) => bail!(InvalidArgument, "nested variadic spans are not supported"),
        })
    };
    let Some(segments) = segments else {
        if list.len() != args.len() {
            bail!(
                Internal,
                "register list has {} entries, signature {}",
                list.len(),
                args.len()
            );
        }
        for (&reg, t) in list.iter().zip(args) {
            out.push(operand(reg, t)?);
        }
        return Ok(());
    };
    let mut at = 0usize;
    for (i, a) in args.iter().enumerate() {
        let (items, n): (&[CconvType], usize) = match a {
            CconvType::Span(items) => {
                let n = *segments.get(i).ok_or_else(|| {
                    status!(
                        InvalidArgument,
                        "variadic call has {} segment sizes, signature needs {}",
                        segments.len(),
                        args.len()
                    )
                })? as usize;
                out.push(Operand::Count(n as i32));
                (items, n * items.len())
            }
            t => (std::slice::from_ref(t), 1),
        };
        let Some(span) = list.get(at..at + n) else {
            bail!(
                InvalidArgument,
                "variadic call has fewer registers than its segments need"
            );
        };
        for (&reg, t) in span.iter().zip(items.iter().cycle()) {
            out.push(operand(reg, t)?);
        }
        at += n;
    }
    Ok(())
}

/// Calls import `call.0` in place when it is a native function: its body
/// reads the arguments straight from `regs`/`refs` (see [`Args::Registers`])
/// and its results are written back before the dispatch loop goes on, with
/// no frame, no argument values and no trip through the invocation loop.
/// `call` is (import, segment list, argument list, result list, resume pc).
#[inline(never)]
fn call_in_place(
    state: &BytecodeState,
    regs: &mut [u32],
    refs: &mut [Option<Ref>],
    pool: &[u32],
    listed: Option<(&[Operand], &[Operand])>,
    call: (u32, Option<usize>, usize, usize, usize),
    scratch: &mut NativeScratch<'_>,
) -> Result<InPlace> {
    let (import, segments, args, results, resume) = call;
    let target = state.import_ref(import)?;
    let Some(body) = &target.native else {
        return Ok(InPlace::NotNative);
    };
    if !scratch.depth_ok {
        return Ok(InPlace::NotNative);
    }
    let (operands, moved): (&[Operand], _) = match listed {
        Some((ops, moved)) => (ops, Some(moved)),
        None => {
            let list = pool_list(pool, args);
            let seg = segments.map(|seg| pool_list(pool, seg));
            build_operands(scratch.operands, list, seg, &target.cconv.args)?;
            (&scratch.operands[..], None)
        }
    };
    let mut call = NativeCall {
        args: Args::Registers(crate::stack::InPlace {
            regs,
            refs,
            operands,
            moved,
            results: pool_list(pool, results),
            result_types: &target.cconv.results,
        }),
        saved: None,
        resumed: false,
        wait_status: None,
        // Unused in place: `ready` writes to the registers.
        results: Vec::new(),
        written: false,
    };
    let outcome = match body.direct() {
        Some(f) => match f(&mut call) {
            // Results already in the registers: nothing left to check.
            Ok(poll) if call.written => Ok(poll),
            other => body.finish(&call, other),
        },
        None => body.step(&mut call),
    };
    let (saved, written) = (call.saved, call.written);
    discard_empty(call.results);
    let outcome = match outcome {
        Ok(NativePoll::Ready(out)) if written => {
            discard_empty(out);
            return Ok(InPlace::Done);
        }
        Ok(NativePoll::Ready(mut out)) => {
            // A body that built its result vector itself.
            release_moved_operands(refs, moved.unwrap_or(operands));
            return write_results(regs, refs, pool_list(pool, results), &mut out)
                .map(|()| InPlace::Done);
        }
        Ok(NativePoll::Pending(w)) => Ok(w),
        Err(e) => Err(e),
    };
    let spare = std::mem::take(scratch.results);
    // The parked call's record is built from the scratch list.
    if let Some((listed, _)) = listed {
        scratch.operands.clear();
        scratch.operands.extend_from_slice(listed);
    }
    Ok(InPlace::Parked(Box::new(Parked {
        body: body.clone(),
        outcome,
        saved,
        spare,
        results,
        resume,
    })))
}

/// Drops a vector that is normally empty without an out-of-line drop call
/// (the hot in-place call path hands back only unallocated vectors).
#[inline(always)]
fn discard_empty(v: Vec<Variant>) {
    if v.capacity() == 0 {
        // Nothing allocated, nothing to release.
        std::mem::forget(v);
    } else {
        drop(v);
    }
}

/// The record of an in-place native call that outlives its step (it
/// yielded, or failed and needs a frame for the backtrace): it takes its
/// arguments as values, moved or retained per their move bits, as a call
/// through the trampoline would have.
#[allow(clippy::too_many_arguments)]
fn keep_call(
    stack: &mut Stack,
    ib: usize,
    ic: usize,
    rb: usize,
    rc: usize,
    operands: Vec<Operand>,
    saved: Option<Box<dyn std::any::Any + Send>>,
    results: Vec<Variant>,
) -> NativeCall<'static> {
    let vals = take_operands(
        &stack.i32_regs[ib..ib + ic],
        &mut stack.ref_regs[rb..rb + rc],
        &operands,
    );
    stack.operands = operands;
    let mut call = stack.native_call(vals);
    call.saved = saved;
    call.results = results;
    call
}

/// Releases the ref operands a finished in-place native call received with
/// the move bit (the callee only borrowed them).
#[inline]
pub(crate) fn release_moved_operands(refs: &mut [Option<Ref>], operands: &[Operand]) {
    for op in operands {
        if let Operand::Ref(reg) = *op {
            if reg & MOVE_BIT != 0 {
                refs[ref_slot(reg)] = None;
            }
        }
    }
}

/// The operands as owned values, refs moved or retained per their move
/// bits: what a call that outlives its step keeps.
fn take_operands(regs: &[u32], refs: &mut [Option<Ref>], operands: &[Operand]) -> Vec<Variant> {
    operands
        .iter()
        .map(|op| match *op {
            Operand::I32(r) => Variant::I32(regs[r as usize] as i32),
            Operand::F32(r) => Variant::F32(f32::from_bits(regs[r as usize])),
            Operand::I64(r) => Variant::I64(get_i64(regs, r)),
            Operand::F64(r) => Variant::F64(f64::from_bits(get_i64(regs, r) as u64)),
            Operand::Ref(r) => Variant::from_ref(take_ref(refs, r)),
            Operand::Count(n) => Variant::I32(n),
        })
        .collect()
}

/// Reads the arguments of a variadic import call: each span is passed as
/// its element count followed by the elements, as upstream's ABI lays them
/// out.
fn read_variadic(
    regs: &[u32],
    refs: &mut [Option<Ref>],
    list: &[u32],
    args: &[CconvType],
    segments: &[u32],
    mut out: Vec<Variant>,
) -> Result<Vec<Variant>> {
    out.clear();
    out.reserve(list.len() + segments.len());
    let mut at = 0usize;
    for (i, a) in args.iter().enumerate() {
        match a {
            CconvType::Span(items) => {
                let n = *segments.get(i).ok_or_else(|| {
                    status!(
                        InvalidArgument,
                        "variadic call has {} segment sizes, signature needs {}",
                        segments.len(),
                        args.len()
                    )
                })? as usize;
                let take = n * items.len();
                let Some(span) = list.get(at..at + take) else {
                    bail!(
                        InvalidArgument,
                        "variadic call has fewer registers than its segments need"
                    );
                };
                out.push(Variant::I32(n as i32));
                for (&reg, t) in span.iter().zip(items.iter().cycle()) {
                    out.push(read_scalar_or_ref(regs, refs, reg, t)?);
                }
                at += take;
            }
            t => {
                let Some(&reg) = list.get(at) else {
                    bail!(
                        InvalidArgument,
                        "variadic call has fewer registers than its segments need"
                    );
                };
                out.push(read_scalar_or_ref(regs, refs, reg, t)?);
                at += 1;
            }
        }
    }
    Ok(out)
}

/// One call operand as a value; refs are moved or retained per the
/// register's move bit.
#[inline(always)]
fn read_scalar_or_ref(
    regs: &[u32],
    refs: &mut [Option<Ref>],
    reg: u32,
    t: &CconvType,
) -> Result<Variant> {
    let reg = reg as u16;
    Ok(match t {
        CconvType::I32 => Variant::I32(regs[reg as usize] as i32),
        CconvType::F32 => Variant::F32(f32::from_bits(regs[reg as usize])),
        CconvType::I64 => Variant::I64(get_i64(regs, reg)),
        CconvType::F64 => Variant::F64(f64::from_bits(get_i64(regs, reg) as u64)),
        CconvType::Ref => Variant::from_ref(take_ref(refs, reg)),
        CconvType::Span(_) => bail!(InvalidArgument, "nested variadic spans are not supported"),
    })
}

/// An i32-bank register slot, without a bounds check.
///
/// The verifier checked every register operand of every instruction against
/// the function's (rounded) i32 register count, with one extra slot for
/// 64-bit operands, and `run` passes `exec` a register slice of exactly that
/// length.
macro_rules! slot {
    ($regs:expr, $r:expr) => {{
        let i = $r as usize;
        debug_assert!(i < $regs.len());
        // SAFETY: `i` is a verified register ordinal of this function and
        // `$regs` has the function's full register count (see above).
        *unsafe { $regs.get_unchecked(i) }
    }};
}

/// The writable form of [`slot!`]; same invariant.
macro_rules! slot_mut {
    ($regs:expr, $r:expr) => {
        *{
            let i = $r as usize;
            debug_assert!(i < $regs.len());
            // SAFETY: as for `slot!`: a verified ordinal into a full-size file.
            unsafe { $regs.get_unchecked_mut(i) }
        }
    };
}

#[inline(always)]
fn get_i64u(regs: &[u32], r: u16) -> i64 {
    let r = r as usize;
    debug_assert!(r + 1 < regs.len());
    // SAFETY: the verifier checked that both slots `r` and `r + 1` of every
    // 64-bit operand are below the function's register count, and `regs`
    // holds exactly that many slots; unaligned reads are allowed.
    let v = unsafe { regs.as_ptr().add(r).cast::<u64>().read_unaligned() };
    // Slot `r` holds the low half on every host.
    if cfg!(target_endian = "little") {
        v as i64
    } else {
        v.rotate_left(32) as i64
    }
}

/// Stores an i64 into two slots, evaluating the value first.
macro_rules! set_i64u {
    ($regs:expr, $r:expr, $v:expr $(,)?) => {{
        let v: i64 = $v;
        set_i64u_fn($regs, $r, v)
    }};
}

#[inline(always)]
fn set_i64u_fn(regs: &mut [u32], r: u16, v: i64) {
    let r = r as usize;
    debug_assert!(r + 1 < regs.len());
    let v = if cfg!(target_endian = "little") {
        v as u64
    } else {
        (v as u64).rotate_left(32)
    };
    // SAFETY: as in `get_i64u`: both slots are verified in range.
    unsafe { regs.as_mut_ptr().add(r).cast::<u64>().write_unaligned(v) }
}

macro_rules! r32 {
    ($regs:ident, $r:expr) => {
        slot!($regs, $r) as i32
    };
}
macro_rules! w32 {
    ($regs:ident, $r:expr, $v:expr) => {
        slot_mut!($regs, $r) = ($v) as u32
    };
}
macro_rules! rf32 {
    ($regs:ident, $r:expr) => {
        f32::from_bits(slot!($regs, $r))
    };
}
macro_rules! wf32 {
    ($regs:ident, $r:expr, $v:expr) => {
        slot_mut!($regs, $r) = f32::to_bits($v)
    };
}
macro_rules! rf64 {
    ($regs:ident, $r:expr) => {
        f64::from_bits(get_i64u($regs, $r) as u64)
    };
}
macro_rules! wf64 {
    ($regs:ident, $r:expr, $v:expr) => {
        set_i64u!($regs, $r, f64::to_bits($v) as i64)
    };
}

/// The dispatch loop over one function's instructions.
#[inline(never)]
fn exec<const COVERAGE: bool>(
    state: &BytecodeState,
    stack: &mut Stack,
    cur: &mut Cursor,
) -> Result<Action> {
    let module: &BytecodeModule = &state.module;
    loop {
        #[cfg(feature = "jit")]
        if !COVERAGE && cur.pc == 0 {
            if let Some(entry) = module.jit.as_ref().and_then(|j| j.entry(cur.function)) {
                let ic = module.functions[cur.function].i32_count as usize;
                match super::jit::run(entry, state, stack, cur.function, cur.i32_base, ic) {
                    Ok(list) => {
                        if !leave_call(module, stack, cur, list) {
                            return Ok(Action::Return { list });
                        }
                        continue;
                    }
                    Err(failure) => {
                        cur.pc = failure.innermost_pc + 1;
                        return Err(failure.status);
                    }
                }
            }
        }
        let func = &module.functions[cur.function];
        let (ic, rc) = (func.i32_count as usize, func.ref_count as usize);
        let (ib, rb) = (cur.i32_base, cur.ref_base);
        let Stack {
            frames,
            i32_regs,
            ref_regs,
            coverage,
            operands,
            native_results,
            max_depth,
            ..
        } = &mut *stack;
        let regs: &mut [u32] = &mut i32_regs[ib..ib + ic];
        let refs: &mut [Option<Ref>] = &mut ref_regs[rb..rb + rc];
        let mut scratch = NativeScratch {
            operands,
            results: native_results,
            depth_ok: frames.len() < *max_depth,
        };
        let flow = dispatch::<COVERAGE>(
            state,
            func,
            regs,
            refs,
            &mut cur.pc,
            coverage.as_deref_mut(),
            &mut scratch,
        )?;
        match flow {
            Flow::Call {
                callee,
                args,
                results,
                resume,
            } => {
                let pc = cur.pc;
                enter_call(module, stack, cur, callee, args, results, resume, pc)?;
            }
            Flow::Return { list } => {
                if !leave_call(module, stack, cur, list) {
                    return Ok(Action::Return { list });
                }
            }
            Flow::Exit(action) => return Ok(action),
        }
    }
}

/// How the dispatch loop left: an internal call or return (handled by
/// [`exec`] without leaving the module), or an [`Action`] for [`run`].
enum Flow {
    Call {
        callee: usize,
        args: usize,
        results: usize,
        resume: usize,
    },
    Return {
        list: usize,
    },
    Exit(Action),
}

/// The dispatch loop over one function's instructions. Kept apart from the
/// frame handling so its hot loop keeps its values in registers.
#[inline(never)]
fn dispatch<const COVERAGE: bool>(
    state: &BytecodeState,
    func: &DecodedFunction,
    regs: &mut [u32],
    refs: &mut [Option<Ref>],
    pc_out: &mut usize,
    mut coverage: Option<&mut [bool]>,
    scratch: &mut NativeScratch<'_>,
) -> Result<Flow> {
    let insns: &[Insn] = &func.insns;
    let pool: &[u32] = &func.pool;
    let mut pc = *pc_out;
    macro_rules! fail {
        ($e:expr) => {{
            *pc_out = pc;
            return Err($e);
        }};
    }
    // An import call: in place when the callee is native (then on to
    // `resume`, or out with the parked call), else out to the invocation
    // loop. `segments` is the variadic segment list (None for fixed arity).
    macro_rules! import_call {
        ($insn:expr, $segments:expr, $args:expr, $results:expr, $resume:expr) => {{
            let insn: &Insn = $insn;
            let import = insn.a & !IMPORT_BIT;
            let (segments, args, results, resume) = ($segments, $args, $results, $resume);
            let listed = call_operands(insn, &func.operands);
            let call = (import, segments, args, results, resume);
            match tri!(call_in_place(
                state, regs, refs, pool, listed, call, scratch
            )) {
                InPlace::Done => {
                    pc = resume;
                    continue;
                }
                InPlace::Parked(parked) => {
                    *pc_out = pc;
                    return Ok(Flow::Exit(Action::Parked(parked)));
                }
                InPlace::NotNative => {}
            }
            *pc_out = pc;
            return Ok(Flow::Exit(Action::CallImport {
                import,
                segments,
                args,
                results,
                resume,
            }));
        }};
    }
    macro_rules! tri {
        ($e:expr) => {
            match $e {
                Ok(v) => v,
                Err(e) => fail!(e),
            }
        };
    }
    macro_rules! buffer_load {
        ($r:ident, $load:ident, |$v:ident| $write:expr) => {{
            let off = get_i64u(regs, $r[1]) as u64;
            let $v = tri!(tri!(deref_buffer(refs, $r[0], "source_buffer")).$load(off));
            $write;
        }};
    }
    macro_rules! buffer_store {
        ($r:ident, $store:ident, $value:expr) => {{
            let off = get_i64u(regs, $r[1]) as u64;
            let value = $value;
            tri!(tri!(deref_buffer(refs, $r[0], "target_buffer")).$store(off, value));
        }};
    }
    loop {
        // Fields are read through a reference so each arm loads only the
        // operands it uses.
        debug_assert!(pc < insns.len());
        // SAFETY: `pc` is always a valid instruction index: execution starts
        // at 0 (every function has at least its end sentinel), branch and
        // resume targets were verified against the instruction count, and
        // sequential execution cannot step past the `EndOfFunction` sentinel
        // the verifier appends, which never falls through.
        let insn = unsafe { insns.get_unchecked(pc) };
        pc += 1;
        if COVERAGE {
            if let Some(cov) = coverage.as_deref_mut() {
                for c in insn.op.components() {
                    cov[*c as usize] = true;
                }
            }
        }
        let r = &insn.r;
        match insn.op {
            Op::Block => {}
            Op::EndOfFunction => {
                fail!(status!(
                    Internal,
                    "execution fell off the end of the function"
                ));
            }
            // ---- globals
            Op::GlobalLoadI32 | Op::GlobalLoadF32 => {
                let s = tri!(global_slot(state, insn.a, 4));
                slot_mut!(regs, r[0]) = state.globals[s].load(Relaxed);
            }
            Op::GlobalStoreI32 | Op::GlobalStoreF32 => {
                let s = tri!(global_slot(state, insn.a, 4));
                state.globals[s].store(slot!(regs, r[0]), Relaxed);
            }
            Op::GlobalLoadIndirectI32 | Op::GlobalLoadIndirectF32 => {
                let s = tri!(global_slot(state, slot!(regs, r[0]), 4));
                slot_mut!(regs, r[1]) = state.globals[s].load(Relaxed);
            }
            Op::GlobalStoreIndirectI32 | Op::GlobalStoreIndirectF32 => {
                let s = tri!(global_slot(state, slot!(regs, r[0]), 4));
                state.globals[s].store(slot!(regs, r[1]), Relaxed);
            }
            Op::GlobalLoadI64 | Op::GlobalLoadF64 => {
                let s = tri!(global_slot(state, insn.a, 8));
                slot_mut!(regs, r[0]) = state.globals[s].load(Relaxed);
                regs[r[0] as usize + 1] = state.globals[s + 1].load(Relaxed);
            }
            Op::GlobalStoreI64 | Op::GlobalStoreF64 => {
                let s = tri!(global_slot(state, insn.a, 8));
                state.globals[s].store(slot!(regs, r[0]), Relaxed);
                state.globals[s + 1].store(regs[r[0] as usize + 1], Relaxed);
            }
            Op::GlobalLoadIndirectI64 | Op::GlobalLoadIndirectF64 => {
                let s = tri!(global_slot(state, slot!(regs, r[0]), 8));
                slot_mut!(regs, r[1]) = state.globals[s].load(Relaxed);
                regs[r[1] as usize + 1] = state.globals[s + 1].load(Relaxed);
            }
            Op::GlobalStoreIndirectI64 | Op::GlobalStoreIndirectF64 => {
                let s = tri!(global_slot(state, slot!(regs, r[0]), 8));
                state.globals[s].store(slot!(regs, r[1]), Relaxed);
                state.globals[s + 1].store(regs[r[1] as usize + 1], Relaxed);
            }
            Op::GlobalLoadRef => {
                let g = tri!(ref_global(state, insn.a)).lock().clone();
                tri!(check_cast(&g, type_at(state, insn.imm)));
                refs[ref_slot(r[0])] = g;
            }
            Op::GlobalStoreRef => {
                let v = take_ref(refs, r[0]);
                tri!(check_cast(&v, type_at(state, insn.imm)));
                *tri!(ref_global(state, insn.a)).lock() = v;
            }
            Op::GlobalLoadIndirectRef => {
                let g = tri!(ref_global(state, slot!(regs, r[0]))).lock().clone();
                tri!(check_cast(&g, type_at(state, insn.imm)));
                refs[ref_slot(r[1])] = g;
            }
            Op::GlobalStoreIndirectRef => {
                let v = take_ref(refs, r[1]);
                tri!(check_cast(&v, type_at(state, insn.imm)));
                *tri!(ref_global(state, slot!(regs, r[0]))).lock() = v;
            }
            // ---- constants
            Op::ConstI32Zero | Op::ConstF32Zero => slot_mut!(regs, r[0]) = 0,
            Op::ConstI32 | Op::ConstF32 => slot_mut!(regs, r[0]) = insn.imm as u32,
            Op::ConstI64Zero | Op::ConstF64Zero => set_i64u!(regs, r[0], 0),
            Op::ConstI64 | Op::ConstF64 => set_i64u!(regs, r[0], insn.imm as i64),
            Op::ConstRefZero => refs[ref_slot(r[0])] = None,
            Op::ConstRefRodata => {
                refs[ref_slot(r[0])] = Some(state.module.rodata[insn.a as usize].clone())
            }
            // ---- lists
            Op::ListAlloc => {
                let ty = type_at(state, insn.imm);
                let l = tri!(VmList::new(ty, slot!(regs, r[0])));
                refs[ref_slot(r[1])] = Some(Ref::new(l));
            }
            Op::ListReserve => tri!(tri!(deref_list(refs, r[0])).reserve(slot!(regs, r[1]))),
            Op::ListSize => {
                let n = tri!(deref_list(refs, r[0])).size();
                slot_mut!(regs, r[1]) = n;
            }
            Op::ListResize => tri!(tri!(deref_list(refs, r[0])).resize(slot!(regs, r[1]))),
            Op::ListGetI32 => {
                let v = tri!(tri!(deref_list(refs, r[0])).get_i32(slot!(regs, r[1])));
                w32!(regs, r[2], v);
            }
            Op::ListSetI32 => {
                let v = r32!(regs, r[2]);
                tri!(tri!(deref_list(refs, r[0])).set_i32(slot!(regs, r[1]), v));
            }
            Op::ListGetI64 => {
                let v = tri!(tri!(deref_list(refs, r[0])).get_i64(slot!(regs, r[1])));
                set_i64u!(regs, r[2], v);
            }
            Op::ListSetI64 => {
                let v = get_i64u(regs, r[2]);
                tri!(tri!(deref_list(refs, r[0])).set_i64(slot!(regs, r[1]), v));
            }
            Op::ListGetF32 => {
                let v = tri!(tri!(deref_list(refs, r[0])).get_f32(slot!(regs, r[1])));
                wf32!(regs, r[2], v);
            }
            Op::ListSetF32 => {
                let v = rf32!(regs, r[2]);
                tri!(tri!(deref_list(refs, r[0])).set_f32(slot!(regs, r[1]), v));
            }
            Op::ListGetF64 => {
                let v = tri!(tri!(deref_list(refs, r[0])).get_f64(slot!(regs, r[1])));
                wf64!(regs, r[2], v);
            }
            Op::ListSetF64 => {
                let v = rf64!(regs, r[2]);
                tri!(tri!(deref_list(refs, r[0])).set_f64(slot!(regs, r[1]), v));
            }
            Op::ListGetRef => {
                let v = tri!(tri!(deref_list(refs, r[0])).get_ref(slot!(regs, r[1])));
                let ty = type_at(state, insn.imm);
                // A value of another type reads as null, as upstream's
                // retain-or-null does.
                let v = v.filter(|x| ty.accepts_ref(x));
                refs[ref_slot(r[2])] = v;
            }
            Op::ListSetRef => {
                let v = take_ref(refs, r[2]);
                tri!(tri!(deref_list(refs, r[0])).set_ref(slot!(regs, r[1]), v));
            }
            // ---- select / switch
            Op::SelectI32 | Op::SelectF32 => {
                let v = if slot!(regs, r[0]) != 0 {
                    slot!(regs, r[1])
                } else {
                    slot!(regs, r[2])
                };
                slot_mut!(regs, r[3]) = v;
            }
            Op::SelectI64 | Op::SelectF64 => {
                let v = if slot!(regs, r[0]) != 0 {
                    get_i64u(regs, r[1])
                } else {
                    get_i64u(regs, r[2])
                };
                set_i64u!(regs, r[3], v);
            }
            Op::SelectRef => {
                let (t, f) = (r[1], r[2]);
                let chosen = if slot!(regs, r[0]) != 0 { t } else { f };
                let v = take_ref(refs, chosen);
                // The unchosen operand is released when marked move.
                let other = if chosen == t { f } else { t };
                if other & MOVE_BIT != 0 && ref_slot(other) != ref_slot(chosen) {
                    refs[ref_slot(other)] = None;
                }
                refs[ref_slot(r[3])] = v;
            }
            Op::SwitchI32 | Op::SwitchF32 => {
                let idx = r32!(regs, r[0]);
                let vals = pool_list(pool, insn.pool as usize);
                let v = match usize::try_from(idx).ok().and_then(|i| vals.get(i)) {
                    Some(&reg) => slot!(regs, reg),
                    None => slot!(regs, r[1]),
                };
                slot_mut!(regs, r[2]) = v;
            }
            Op::SwitchI64 | Op::SwitchF64 => {
                let idx = r32!(regs, r[0]);
                let vals = pool_list(pool, insn.pool as usize);
                let v = match usize::try_from(idx).ok().and_then(|i| vals.get(i)) {
                    Some(&reg) => get_i64u(regs, reg as u16),
                    None => get_i64u(regs, r[1]),
                };
                set_i64u!(regs, r[2], v);
            }
            Op::SwitchRef => {
                let idx = r32!(regs, r[0]);
                let vals = pool_list(pool, insn.pool as usize);
                let src = match usize::try_from(idx).ok().and_then(|i| vals.get(i)) {
                    Some(&reg) => reg as u16,
                    None => r[1],
                };
                let v = refs[ref_slot(src)].clone();
                tri!(check_cast(&v, type_at(state, insn.imm)));
                refs[ref_slot(r[2])] = v;
            }
            // ---- i32 arithmetic
            Op::AddI32 => w32!(regs, r[2], r32!(regs, r[0]).wrapping_add(r32!(regs, r[1]))),
            Op::SubI32 => w32!(regs, r[2], r32!(regs, r[0]).wrapping_sub(r32!(regs, r[1]))),
            Op::MulI32 => w32!(regs, r[2], r32!(regs, r[0]).wrapping_mul(r32!(regs, r[1]))),
            Op::DivI32S => {
                let b = r32!(regs, r[1]);
                if b == 0 {
                    fail!(div_zero(insn.op));
                }
                w32!(regs, r[2], r32!(regs, r[0]).wrapping_div(b));
            }
            Op::DivI32U => {
                let b = slot!(regs, r[1]);
                if b == 0 {
                    fail!(div_zero(insn.op));
                }
                slot_mut!(regs, r[2]) = slot!(regs, r[0]) / b;
            }
            Op::RemI32S => {
                let b = r32!(regs, r[1]);
                if b == 0 {
                    fail!(div_zero(insn.op));
                }
                w32!(regs, r[2], r32!(regs, r[0]).wrapping_rem(b));
            }
            Op::RemI32U => {
                let b = slot!(regs, r[1]);
                if b == 0 {
                    fail!(div_zero(insn.op));
                }
                slot_mut!(regs, r[2]) = slot!(regs, r[0]) % b;
            }
            Op::FMAI32 => w32!(
                regs,
                r[3],
                r32!(regs, r[0])
                    .wrapping_mul(r32!(regs, r[1]))
                    .wrapping_add(r32!(regs, r[2]))
            ),
            Op::AbsI32 => w32!(regs, r[1], r32!(regs, r[0]).wrapping_abs()),
            Op::MinI32S => w32!(regs, r[2], r32!(regs, r[0]).min(r32!(regs, r[1]))),
            Op::MinI32U => slot_mut!(regs, r[2]) = slot!(regs, r[0]).min(slot!(regs, r[1])),
            Op::MaxI32S => w32!(regs, r[2], r32!(regs, r[0]).max(r32!(regs, r[1]))),
            Op::MaxI32U => slot_mut!(regs, r[2]) = slot!(regs, r[0]).max(slot!(regs, r[1])),
            Op::NotI32 => slot_mut!(regs, r[1]) = !slot!(regs, r[0]),
            Op::AndI32 => slot_mut!(regs, r[2]) = slot!(regs, r[0]) & slot!(regs, r[1]),
            Op::OrI32 => slot_mut!(regs, r[2]) = slot!(regs, r[0]) | slot!(regs, r[1]),
            Op::XorI32 => slot_mut!(regs, r[2]) = slot!(regs, r[0]) ^ slot!(regs, r[1]),
            Op::CtlzI32 => slot_mut!(regs, r[1]) = slot!(regs, r[0]).leading_zeros(),
            // ---- i64 arithmetic
            Op::AddI64 => set_i64u!(
                regs,
                r[2],
                get_i64u(regs, r[0]).wrapping_add(get_i64u(regs, r[1])),
            ),
            Op::SubI64 => set_i64u!(
                regs,
                r[2],
                get_i64u(regs, r[0]).wrapping_sub(get_i64u(regs, r[1])),
            ),
            Op::MulI64 => set_i64u!(
                regs,
                r[2],
                get_i64u(regs, r[0]).wrapping_mul(get_i64u(regs, r[1])),
            ),
            Op::DivI64S => {
                let b = get_i64u(regs, r[1]);
                if b == 0 {
                    fail!(div_zero(insn.op));
                }
                set_i64u!(regs, r[2], get_i64u(regs, r[0]).wrapping_div(b));
            }
            Op::DivI64U => {
                let b = get_i64u(regs, r[1]) as u64;
                if b == 0 {
                    fail!(div_zero(insn.op));
                }
                set_i64u!(regs, r[2], ((get_i64u(regs, r[0]) as u64) / b) as i64);
            }
            Op::RemI64S => {
                let b = get_i64u(regs, r[1]);
                if b == 0 {
                    fail!(div_zero(insn.op));
                }
                set_i64u!(regs, r[2], get_i64u(regs, r[0]).wrapping_rem(b));
            }
            Op::RemI64U => {
                let b = get_i64u(regs, r[1]) as u64;
                if b == 0 {
                    fail!(div_zero(insn.op));
                }
                set_i64u!(regs, r[2], ((get_i64u(regs, r[0]) as u64) % b) as i64);
            }
            Op::FMAI64 => set_i64u!(
                regs,
                r[3],
                get_i64u(regs, r[0])
                    .wrapping_mul(get_i64u(regs, r[1]))
                    .wrapping_add(get_i64u(regs, r[2])),
            ),
            Op::AbsI64 => set_i64u!(regs, r[1], get_i64u(regs, r[0]).wrapping_abs()),
            Op::MinI64S => {
                set_i64u!(regs, r[2], get_i64u(regs, r[0]).min(get_i64u(regs, r[1])))
            }
            Op::MinI64U => set_i64u!(
                regs,
                r[2],
                (get_i64u(regs, r[0]) as u64).min(get_i64u(regs, r[1]) as u64) as i64,
            ),
            Op::MaxI64S => {
                set_i64u!(regs, r[2], get_i64u(regs, r[0]).max(get_i64u(regs, r[1])))
            }
            Op::MaxI64U => set_i64u!(
                regs,
                r[2],
                (get_i64u(regs, r[0]) as u64).max(get_i64u(regs, r[1]) as u64) as i64,
            ),
            Op::NotI64 => set_i64u!(regs, r[1], !get_i64u(regs, r[0])),
            Op::AndI64 => set_i64u!(regs, r[2], get_i64u(regs, r[0]) & get_i64u(regs, r[1])),
            Op::OrI64 => set_i64u!(regs, r[2], get_i64u(regs, r[0]) | get_i64u(regs, r[1])),
            Op::XorI64 => set_i64u!(regs, r[2], get_i64u(regs, r[0]) ^ get_i64u(regs, r[1])),
            Op::CtlzI64 => set_i64u!(
                regs,
                r[1],
                (get_i64u(regs, r[0]) as u64).leading_zeros() as i64,
            ),
            // ---- shifts
            Op::ShlI32 => slot_mut!(regs, r[2]) = slot!(regs, r[0]) << (slot!(regs, r[1]) & 31),
            Op::ShrI32S => w32!(regs, r[2], r32!(regs, r[0]) >> (slot!(regs, r[1]) & 31)),
            Op::ShrI32U => slot_mut!(regs, r[2]) = slot!(regs, r[0]) >> (slot!(regs, r[1]) & 31),
            Op::ShlI64 => set_i64u!(regs, r[2], get_i64u(regs, r[0]) << (slot!(regs, r[1]) & 63)),
            Op::ShrI64S => set_i64u!(regs, r[2], get_i64u(regs, r[0]) >> (slot!(regs, r[1]) & 63)),
            Op::ShrI64U => set_i64u!(
                regs,
                r[2],
                ((get_i64u(regs, r[0]) as u64) >> (slot!(regs, r[1]) & 63)) as i64,
            ),
            // ---- casting / conversion
            Op::TruncI32I8 => slot_mut!(regs, r[1]) = slot!(regs, r[0]) as u8 as u32,
            Op::TruncI32I16 => slot_mut!(regs, r[1]) = slot!(regs, r[0]) as u16 as u32,
            Op::TruncI64I32 => slot_mut!(regs, r[1]) = get_i64u(regs, r[0]) as u32,
            Op::ExtI8I32S => w32!(regs, r[1], slot!(regs, r[0]) as u8 as i8 as i32),
            Op::ExtI8I32U => slot_mut!(regs, r[1]) = slot!(regs, r[0]) as u8 as u32,
            Op::ExtI16I32S => w32!(regs, r[1], slot!(regs, r[0]) as u16 as i16 as i32),
            Op::ExtI16I32U => slot_mut!(regs, r[1]) = slot!(regs, r[0]) as u16 as u32,
            Op::ExtI32I64S => set_i64u!(regs, r[1], r32!(regs, r[0]) as i64),
            Op::ExtI32I64U => set_i64u!(regs, r[1], slot!(regs, r[0]) as i64),
            // ---- comparisons
            Op::CmpEQI32 => w32!(regs, r[2], slot!(regs, r[0]) == slot!(regs, r[1])),
            Op::CmpNEI32 => w32!(regs, r[2], slot!(regs, r[0]) != slot!(regs, r[1])),
            Op::CmpLTI32S => w32!(regs, r[2], r32!(regs, r[0]) < r32!(regs, r[1])),
            Op::CmpLTI32U => w32!(regs, r[2], slot!(regs, r[0]) < slot!(regs, r[1])),
            Op::CmpNZI32 => w32!(regs, r[1], slot!(regs, r[0]) != 0),
            Op::CmpEQI64 => w32!(regs, r[2], get_i64u(regs, r[0]) == get_i64u(regs, r[1])),
            Op::CmpNEI64 => w32!(regs, r[2], get_i64u(regs, r[0]) != get_i64u(regs, r[1])),
            Op::CmpLTI64S => w32!(regs, r[2], get_i64u(regs, r[0]) < get_i64u(regs, r[1])),
            Op::CmpLTI64U => w32!(
                regs,
                r[2],
                (get_i64u(regs, r[0]) as u64) < (get_i64u(regs, r[1]) as u64)
            ),
            Op::CmpNZI64 => w32!(regs, r[1], get_i64u(regs, r[0]) != 0),
            Op::CmpEQRef => {
                let eq = refs[ref_slot(r[0])] == refs[ref_slot(r[1])];
                release_moved(refs, &[r[0], r[1]]);
                w32!(regs, r[2], eq);
            }
            Op::CmpNERef => {
                let ne = refs[ref_slot(r[0])] != refs[ref_slot(r[1])];
                release_moved(refs, &[r[0], r[1]]);
                w32!(regs, r[2], ne);
            }
            Op::CmpNZRef => {
                let nz = refs[ref_slot(r[0])].is_some();
                release_moved(refs, &[r[0]]);
                w32!(regs, r[1], nz);
            }
            // ---- control flow
            Op::DirectBranch => pc = insn.a as usize,
            Op::PrimitiveRemapBranch => {
                let list = insn.pool as usize + 1;
                let n = pool[list] as usize;
                for pair in pool[list + 1..list + 1 + 2 * n].chunks_exact(2) {
                    let v = slot!(regs, pair[0]);
                    slot_mut!(regs, pair[1]) = v;
                }
                pc = insn.a as usize;
            }
            Op::DirectCondBranch => {
                pc = if slot!(regs, r[0]) != 0 {
                    insn.a as usize
                } else {
                    insn.imm as usize
                };
            }
            Op::FusedCmpEQI32CondBranch => {
                let c = slot!(regs, r[0]) == slot!(regs, r[1]);
                slot_mut!(regs, r[2]) = c as u32;
                pc = if c {
                    insn.a as usize
                } else {
                    insn.imm as usize
                };
            }
            Op::FusedCmpNEI32CondBranch => {
                let c = slot!(regs, r[0]) != slot!(regs, r[1]);
                slot_mut!(regs, r[2]) = c as u32;
                pc = if c {
                    insn.a as usize
                } else {
                    insn.imm as usize
                };
            }
            Op::FusedCmpLTI32SCondBranch => {
                let c = (slot!(regs, r[0]) as i32) < (slot!(regs, r[1]) as i32);
                slot_mut!(regs, r[2]) = c as u32;
                pc = if c {
                    insn.a as usize
                } else {
                    insn.imm as usize
                };
            }
            Op::FusedCmpLTI32UCondBranch => {
                let c = slot!(regs, r[0]) < slot!(regs, r[1]);
                slot_mut!(regs, r[2]) = c as u32;
                pc = if c {
                    insn.a as usize
                } else {
                    insn.imm as usize
                };
            }
            Op::FusedCmpNZI32CondBranch => {
                let c = slot!(regs, r[0]) != 0;
                slot_mut!(regs, r[1]) = c as u32;
                pc = if c {
                    insn.a as usize
                } else {
                    insn.imm as usize
                };
            }
            Op::FusedCmpEQI64CondBranch => {
                let c = get_i64u(regs, r[0]) == get_i64u(regs, r[1]);
                slot_mut!(regs, r[2]) = c as u32;
                pc = if c {
                    insn.a as usize
                } else {
                    insn.imm as usize
                };
            }
            Op::FusedCmpNEI64CondBranch => {
                let c = get_i64u(regs, r[0]) != get_i64u(regs, r[1]);
                slot_mut!(regs, r[2]) = c as u32;
                pc = if c {
                    insn.a as usize
                } else {
                    insn.imm as usize
                };
            }
            Op::FusedCmpLTI64SCondBranch => {
                let c = get_i64u(regs, r[0]) < get_i64u(regs, r[1]);
                slot_mut!(regs, r[2]) = c as u32;
                pc = if c {
                    insn.a as usize
                } else {
                    insn.imm as usize
                };
            }
            Op::FusedCmpLTI64UCondBranch => {
                let c = (get_i64u(regs, r[0]) as u64) < (get_i64u(regs, r[1]) as u64);
                slot_mut!(regs, r[2]) = c as u32;
                pc = if c {
                    insn.a as usize
                } else {
                    insn.imm as usize
                };
            }
            Op::FusedCmpNZI64CondBranch => {
                let c = get_i64u(regs, r[0]) != 0;
                slot_mut!(regs, r[1]) = c as u32;
                pc = if c {
                    insn.a as usize
                } else {
                    insn.imm as usize
                };
            }
            Op::Branch => pc = branch(regs, refs, pool, insn.pool as usize),
            Op::CondBranch => {
                let p = insn.pool as usize;
                if slot!(regs, r[0]) != 0 {
                    pc = branch(regs, refs, pool, p);
                } else {
                    let f = skip_remap(pool, p + 1);
                    pc = branch(regs, refs, pool, f);
                }
            }
            Op::BranchTable => {
                let p = insn.pool as usize;
                let idx = r32!(regs, r[0]);
                let default_end = skip_remap(pool, p + 1);
                let size = pool[default_end] as i64;
                if idx < 0 || idx as i64 >= size {
                    pc = branch(regs, refs, pool, p);
                } else {
                    let mut at = default_end + 1;
                    for _ in 0..idx {
                        at = skip_remap(pool, at + 1);
                    }
                    pc = branch(regs, refs, pool, at);
                }
            }
            Op::Call | Op::CallYieldable => {
                let p = insn.pool as usize;
                let nargs = pool[p] as usize;
                let (resume, results) = if insn.op == Op::CallYieldable {
                    (pool[p + 1 + nargs] as usize, p + 2 + nargs)
                } else {
                    (pc, p + 1 + nargs)
                };
                if insn.a & IMPORT_BIT != 0 {
                    import_call!(insn, None, p, results, resume);
                }
                *pc_out = pc;
                return Ok(Flow::Call {
                    callee: insn.a as usize,
                    args: p,
                    results,
                    resume,
                });
            }
            Op::CallVariadic | Op::CallVariadicYieldable => {
                let p = insn.pool as usize;
                let args = p + 1 + pool[p] as usize;
                let after_args = args + 1 + pool[args] as usize;
                let (resume, results) = if insn.op == Op::CallVariadicYieldable {
                    (pool[after_args] as usize, after_args + 1)
                } else {
                    (pc, after_args)
                };
                import_call!(insn, Some(p), args, results, resume);
            }
            Op::Return => {
                *pc_out = pc;
                return Ok(Flow::Return {
                    list: insn.pool as usize,
                });
            }
            Op::Fail => {
                let code = r32!(regs, r[0]);
                tri!(check_fail(code, &state.module.strings[insn.a as usize]));
            }
            Op::ImportResolved => {
                let resolved = state.import_resolved(insn.a & !IMPORT_BIT);
                w32!(regs, r[0], resolved);
            }
            Op::Yield => {
                pc = branch(regs, refs, pool, insn.pool as usize);
                *pc_out = pc;
                return Ok(Flow::Exit(Action::Yield));
            }
            Op::Trace | Op::Print => {
                let list = pool_list(pool, insn.pool as usize);
                for &reg in list {
                    let reg = reg as u16;
                    if reg & (REF_BIT | MOVE_BIT) == REF_BIT | MOVE_BIT {
                        refs[ref_slot(reg)] = None;
                    }
                }
            }
            Op::CondBreak => {
                // Debugger breaks are not supported; execution continues.
                pc = branch(regs, refs, pool, insn.pool as usize);
            }
            Op::Break => pc = branch(regs, refs, pool, insn.pool as usize),
            // ---- buffers
            // Loads and stores: buffer in r[0], element offset (i64) in r[1],
            // value in r[2]; they differ only in width and register bank.
            Op::BufferLoadI8U => buffer_load!(r, load_i8u, |v| w32!(regs, r[2], v)),
            Op::BufferLoadI8S => buffer_load!(r, load_i8s, |v| w32!(regs, r[2], v)),
            Op::BufferLoadI16U => buffer_load!(r, load_i16u, |v| w32!(regs, r[2], v)),
            Op::BufferLoadI16S => buffer_load!(r, load_i16s, |v| w32!(regs, r[2], v)),
            Op::BufferLoadI32 => buffer_load!(r, load_i32, |v| w32!(regs, r[2], v)),
            Op::BufferLoadI64 => buffer_load!(r, load_i64, |v| set_i64u!(regs, r[2], v)),
            Op::BufferLoadF32 => buffer_load!(r, load_f32, |v| wf32!(regs, r[2], v)),
            Op::BufferLoadF64 => buffer_load!(r, load_f64, |v| wf64!(regs, r[2], v)),
            Op::BufferStoreI8 => buffer_store!(r, store_i8, slot!(regs, r[2]) as i32),
            Op::BufferStoreI16 => buffer_store!(r, store_i16, slot!(regs, r[2]) as i32),
            Op::BufferStoreI32 => buffer_store!(r, store_i32, slot!(regs, r[2]) as i32),
            Op::BufferStoreI64 => buffer_store!(r, store_i64, get_i64u(regs, r[2])),
            Op::BufferStoreF32 => buffer_store!(r, store_f32, rf32!(regs, r[2])),
            Op::BufferStoreF64 => buffer_store!(r, store_f64, rf64!(regs, r[2])),
            Op::BufferAlloc => {
                let len = get_i64u(regs, r[0]) as u64;
                let b = tri!(VmBuffer::new(len, slot!(regs, r[1])));
                refs[ref_slot(r[2])] = Some(Ref::new(b));
            }
            Op::BufferClone => {
                let (off, len) = (get_i64u(regs, r[1]) as u64, get_i64u(regs, r[2]) as u64);
                let b = tri!(tri!(deref_buffer(refs, r[0], "source")).clone_range(
                    off,
                    len,
                    slot!(regs, r[3])
                ));
                refs[ref_slot(r[4])] = Some(Ref::new(b));
            }
            Op::BufferLength => {
                let n = tri!(deref_buffer(refs, r[0], "buffer")).len();
                set_i64u!(regs, r[1], n as i64);
            }
            Op::BufferCopy => {
                let src = tri!(deref_buffer(refs, r[0], "source_buffer"));
                let dst = tri!(deref_buffer(refs, r[2], "target_buffer"));
                tri!(VmBuffer::copy(
                    src,
                    get_i64u(regs, r[1]) as u64,
                    dst,
                    get_i64u(regs, r[3]) as u64,
                    get_i64u(regs, r[4]) as u64
                ));
            }
            Op::BufferCompare => {
                let a = tri!(deref_buffer(refs, r[0], "lhs_buffer"));
                let b = tri!(deref_buffer(refs, r[2], "rhs_buffer"));
                let eq = tri!(VmBuffer::compare(
                    a,
                    get_i64u(regs, r[1]) as u64,
                    b,
                    get_i64u(regs, r[3]) as u64,
                    get_i64u(regs, r[4]) as u64
                ));
                w32!(regs, r[5], eq);
            }
            Op::BufferFillI8 | Op::BufferFillI16 | Op::BufferFillI32 => {
                let b = tri!(deref_buffer(refs, r[0], "buffer"));
                let (off, len, v) = (
                    get_i64u(regs, r[1]) as u64,
                    get_i64u(regs, r[2]) as u64,
                    r32!(regs, r[3]),
                );
                tri!(match insn.op {
                    Op::BufferFillI8 => b.fill_i8(off, len, v),
                    Op::BufferFillI16 => b.fill_i16(off, len, v),
                    _ => b.fill_i32(off, len, v),
                });
            }
            Op::BufferFillI64 => {
                let b = tri!(deref_buffer(refs, r[0], "buffer"));
                tri!(b.fill_i64(
                    get_i64u(regs, r[1]) as u64,
                    get_i64u(regs, r[2]) as u64,
                    get_i64u(regs, r[3])
                ));
            }
            Op::BufferFillF32 => {
                let b = tri!(deref_buffer(refs, r[0], "buffer"));
                tri!(b.fill_f32(
                    get_i64u(regs, r[1]) as u64,
                    get_i64u(regs, r[2]) as u64,
                    rf32!(regs, r[3])
                ));
            }
            Op::BufferFillF64 => {
                let b = tri!(deref_buffer(refs, r[0], "buffer"));
                tri!(b.fill_f64(
                    get_i64u(regs, r[1]) as u64,
                    get_i64u(regs, r[2]) as u64,
                    rf64!(regs, r[3])
                ));
            }
            Op::BufferHash => {
                let b = tri!(deref_buffer(refs, r[0], "source_buffer"));
                let h = tri!(b.hash(get_i64u(regs, r[1]) as u64, get_i64u(regs, r[2]) as u64));
                set_i64u!(regs, r[3], h);
            }
            // ---- refs
            Op::CastAnyRef => {
                let v = take_ref(refs, r[0]);
                tri!(check_cast(&v, type_at(state, insn.imm)));
                refs[ref_slot(r[1])] = v;
            }
            Op::DiscardRefs => {
                for &reg in pool_list(pool, insn.pool as usize) {
                    let reg = reg as u16;
                    if reg & REF_BIT != 0 {
                        refs[ref_slot(reg)] = None;
                    }
                }
            }
            Op::AssignRef => {
                let v = take_ref(refs, r[0]);
                refs[ref_slot(r[1])] = v;
            }
            // ---- f32
            Op::AddF32 => wf32!(regs, r[2], rf32!(regs, r[0]) + rf32!(regs, r[1])),
            Op::SubF32 => wf32!(regs, r[2], rf32!(regs, r[0]) - rf32!(regs, r[1])),
            Op::MulF32 => wf32!(regs, r[2], rf32!(regs, r[0]) * rf32!(regs, r[1])),
            Op::DivF32 => wf32!(regs, r[2], rf32!(regs, r[0]) / rf32!(regs, r[1])),
            Op::RemF32 => wf32!(
                regs,
                r[2],
                ieee_rem_f32(rf32!(regs, r[0]), rf32!(regs, r[1]))
            ),
            Op::FMAF32 => wf32!(
                regs,
                r[3],
                rf32!(regs, r[0]) * rf32!(regs, r[1]) + rf32!(regs, r[2])
            ),
            Op::AbsF32 => wf32!(regs, r[1], rf32!(regs, r[0]).abs()),
            Op::NegF32 => wf32!(regs, r[1], -rf32!(regs, r[0])),
            Op::CeilF32 => wf32!(regs, r[1], rf32!(regs, r[0]).ceil()),
            Op::FloorF32 => wf32!(regs, r[1], rf32!(regs, r[0]).floor()),
            Op::RoundF32 => wf32!(regs, r[1], rf32!(regs, r[0]).round()),
            Op::RoundF32Even => wf32!(regs, r[1], round_even_f32(rf32!(regs, r[0]))),
            Op::MinF32 => {
                let (a, b) = (rf32!(regs, r[0]), rf32!(regs, r[1]));
                wf32!(regs, r[2], if b < a { b } else { a });
            }
            Op::MaxF32 => {
                let (a, b) = (rf32!(regs, r[0]), rf32!(regs, r[1]));
                wf32!(regs, r[2], if a < b { b } else { a });
            }
            Op::AtanF32 => wf32!(regs, r[1], rf32!(regs, r[0]).atan()),
            Op::Atan2F32 => wf32!(regs, r[2], rf32!(regs, r[0]).atan2(rf32!(regs, r[1]))),
            Op::CosF32 => wf32!(regs, r[1], rf32!(regs, r[0]).cos()),
            Op::SinF32 => wf32!(regs, r[1], rf32!(regs, r[0]).sin()),
            Op::ExpF32 => wf32!(regs, r[1], rf32!(regs, r[0]).exp()),
            Op::Exp2F32 => wf32!(regs, r[1], rf32!(regs, r[0]).exp2()),
            Op::ExpM1F32 => wf32!(regs, r[1], rf32!(regs, r[0]).exp_m1()),
            Op::LogF32 => wf32!(regs, r[1], rf32!(regs, r[0]).ln()),
            Op::Log10F32 => wf32!(regs, r[1], rf32!(regs, r[0]).log10()),
            Op::Log1pF32 => wf32!(regs, r[1], rf32!(regs, r[0]).ln_1p()),
            Op::Log2F32 => wf32!(regs, r[1], rf32!(regs, r[0]).log2()),
            Op::PowF32 => wf32!(regs, r[2], rf32!(regs, r[0]).powf(rf32!(regs, r[1]))),
            Op::RsqrtF32 => wf32!(regs, r[1], 1.0 / rf32!(regs, r[0]).sqrt()),
            Op::SqrtF32 => wf32!(regs, r[1], rf32!(regs, r[0]).sqrt()),
            Op::TanhF32 => wf32!(regs, r[1], rf32!(regs, r[0]).tanh()),
            Op::ErfF32 => wf32!(regs, r[1], super::cmath::erff(rf32!(regs, r[0]))),
            Op::CastSI32F32 => wf32!(regs, r[1], r32!(regs, r[0]) as f32),
            Op::CastUI32F32 => wf32!(regs, r[1], slot!(regs, r[0]) as f32),
            Op::CastSI64F32 => wf32!(regs, r[1], get_i64u(regs, r[0]) as f32),
            Op::CastUI64F32 => wf32!(regs, r[1], get_i64u(regs, r[0]) as u64 as f32),
            Op::CastF32SI32 => w32!(regs, r[1], rf32!(regs, r[0]).round() as i64 as i32),
            Op::CastF32UI32 => w32!(regs, r[1], rf32!(regs, r[0]).round() as i64 as u32),
            Op::CastF32SI64 => set_i64u!(regs, r[1], rf32!(regs, r[0]).round() as i64),
            Op::CastF32UI64 => set_i64u!(regs, r[1], rf32!(regs, r[0]).round() as u64 as i64),
            Op::BitcastI32F32 | Op::BitcastF32I32 => slot_mut!(regs, r[1]) = slot!(regs, r[0]),
            Op::CmpEQF32O => w32!(regs, r[2], rf32!(regs, r[0]) == rf32!(regs, r[1])),
            Op::CmpEQF32U => {
                let (a, b) = (rf32!(regs, r[0]), rf32!(regs, r[1]));
                w32!(regs, r[2], a.is_nan() || b.is_nan() || a == b);
            }
            Op::CmpNEF32O => {
                let (a, b) = (rf32!(regs, r[0]), rf32!(regs, r[1]));
                // C's `!=` is true for unordered operands too.
                w32!(regs, r[2], a != b);
            }
            Op::CmpNEF32U => {
                let (a, b) = (rf32!(regs, r[0]), rf32!(regs, r[1]));
                w32!(regs, r[2], a.is_nan() || b.is_nan() || a != b);
            }
            Op::CmpLTF32O => w32!(regs, r[2], rf32!(regs, r[0]) < rf32!(regs, r[1])),
            Op::CmpLTF32U => {
                let (a, b) = (rf32!(regs, r[0]), rf32!(regs, r[1]));
                w32!(regs, r[2], a.is_nan() || b.is_nan() || a < b);
            }
            Op::CmpLTEF32O => w32!(regs, r[2], rf32!(regs, r[0]) <= rf32!(regs, r[1])),
            Op::CmpLTEF32U => {
                let (a, b) = (rf32!(regs, r[0]), rf32!(regs, r[1]));
                w32!(regs, r[2], a.is_nan() || b.is_nan() || a <= b);
            }
            Op::CmpNaNF32 => w32!(regs, r[1], rf32!(regs, r[0]).is_nan()),
            // ---- f64
            Op::AddF64 => wf64!(regs, r[2], rf64!(regs, r[0]) + rf64!(regs, r[1])),
            Op::SubF64 => wf64!(regs, r[2], rf64!(regs, r[0]) - rf64!(regs, r[1])),
            Op::MulF64 => wf64!(regs, r[2], rf64!(regs, r[0]) * rf64!(regs, r[1])),
            Op::DivF64 => wf64!(regs, r[2], rf64!(regs, r[0]) / rf64!(regs, r[1])),
            Op::RemF64 => wf64!(
                regs,
                r[2],
                ieee_rem_f64(rf64!(regs, r[0]), rf64!(regs, r[1]))
            ),
            Op::FMAF64 => wf64!(
                regs,
                r[3],
                rf64!(regs, r[0]) * rf64!(regs, r[1]) + rf64!(regs, r[2])
            ),
            Op::AbsF64 => wf64!(regs, r[1], rf64!(regs, r[0]).abs()),
            Op::NegF64 => wf64!(regs, r[1], -rf64!(regs, r[0])),
            Op::CeilF64 => wf64!(regs, r[1], rf64!(regs, r[0]).ceil()),
            Op::FloorF64 => wf64!(regs, r[1], rf64!(regs, r[0]).floor()),
            Op::RoundF64 => wf64!(regs, r[1], rf64!(regs, r[0]).round()),
            Op::RoundF64Even => wf64!(regs, r[1], rf64!(regs, r[0]).round_ties_even()),
            Op::MinF64 => {
                let (a, b) = (rf64!(regs, r[0]), rf64!(regs, r[1]));
                wf64!(regs, r[2], if b < a { b } else { a });
            }
            Op::MaxF64 => {
                let (a, b) = (rf64!(regs, r[0]), rf64!(regs, r[1]));
                wf64!(regs, r[2], if a < b { b } else { a });
            }
            Op::AtanF64 => wf64!(regs, r[1], rf64!(regs, r[0]).atan()),
            Op::Atan2F64 => wf64!(regs, r[2], rf64!(regs, r[0]).atan2(rf64!(regs, r[1]))),
            Op::CosF64 => wf64!(regs, r[1], rf64!(regs, r[0]).cos()),
            Op::SinF64 => wf64!(regs, r[1], rf64!(regs, r[0]).sin()),
            Op::ExpF64 => wf64!(regs, r[1], rf64!(regs, r[0]).exp()),
            Op::Exp2F64 => wf64!(regs, r[1], rf64!(regs, r[0]).exp2()),
            Op::ExpM1F64 => wf64!(regs, r[1], rf64!(regs, r[0]).exp_m1()),
            Op::LogF64 => wf64!(regs, r[1], rf64!(regs, r[0]).ln()),
            Op::Log10F64 => wf64!(regs, r[1], rf64!(regs, r[0]).log10()),
            Op::Log1pF64 => wf64!(regs, r[1], rf64!(regs, r[0]).ln_1p()),
            Op::Log2F64 => wf64!(regs, r[1], rf64!(regs, r[0]).log2()),
            Op::PowF64 => wf64!(regs, r[2], rf64!(regs, r[0]).powf(rf64!(regs, r[1]))),
            Op::RsqrtF64 => wf64!(regs, r[1], 1.0 / rf64!(regs, r[0]).sqrt()),
            Op::SqrtF64 => wf64!(regs, r[1], rf64!(regs, r[0]).sqrt()),
            Op::TanhF64 => wf64!(regs, r[1], rf64!(regs, r[0]).tanh()),
            Op::ErfF64 => wf64!(regs, r[1], super::cmath::erf(rf64!(regs, r[0]))),
            Op::TruncF64F32 => wf32!(regs, r[1], rf64!(regs, r[0]) as f32),
            Op::ExtF32F64 => wf64!(regs, r[1], rf32!(regs, r[0]) as f64),
            Op::CastSI32F64 => wf64!(regs, r[1], r32!(regs, r[0]) as f64),
            Op::CastUI32F64 => wf64!(regs, r[1], slot!(regs, r[0]) as f64),
            // Upstream rounds these through float (`lroundf`).
            Op::CastF64SI32 => {
                w32!(regs, r[1], (rf64!(regs, r[0]) as f32).round() as i64 as i32)
            }
            Op::CastF64UI32 => {
                w32!(regs, r[1], (rf64!(regs, r[0]) as f32).round() as i64 as u32)
            }
            Op::CastSI64F64 => wf64!(regs, r[1], get_i64u(regs, r[0]) as f64),
            Op::CastUI64F64 => wf64!(regs, r[1], get_i64u(regs, r[0]) as u64 as f64),
            Op::CastF64SI64 => set_i64u!(regs, r[1], rf64!(regs, r[0]).round() as i64),
            Op::CastF64UI64 => set_i64u!(regs, r[1], rf64!(regs, r[0]).round() as i64),
            Op::BitcastI64F64 | Op::BitcastF64I64 => {
                set_i64u!(regs, r[1], get_i64u(regs, r[0]))
            }
            Op::CmpEQF64O => w32!(regs, r[2], rf64!(regs, r[0]) == rf64!(regs, r[1])),
            Op::CmpEQF64U => {
                let (a, b) = (rf64!(regs, r[0]), rf64!(regs, r[1]));
                w32!(regs, r[2], a.is_nan() || b.is_nan() || a == b);
            }
            Op::CmpNEF64O => w32!(regs, r[2], rf64!(regs, r[0]) != rf64!(regs, r[1])),
            Op::CmpNEF64U => {
                let (a, b) = (rf64!(regs, r[0]), rf64!(regs, r[1]));
                w32!(regs, r[2], a.is_nan() || b.is_nan() || a != b);
            }
            Op::CmpLTF64O => w32!(regs, r[2], rf64!(regs, r[0]) < rf64!(regs, r[1])),
            Op::CmpLTF64U => {
                let (a, b) = (rf64!(regs, r[0]), rf64!(regs, r[1]));
                w32!(regs, r[2], a.is_nan() || b.is_nan() || a < b);
            }
            Op::CmpLTEF64O => w32!(regs, r[2], rf64!(regs, r[0]) <= rf64!(regs, r[1])),
            Op::CmpLTEF64U => {
                let (a, b) = (rf64!(regs, r[0]), rf64!(regs, r[1]));
                w32!(regs, r[2], a.is_nan() || b.is_nan() || a <= b);
            }
            Op::CmpNaNF64 => w32!(regs, r[1], rf64!(regs, r[0]).is_nan()),
        }
    }
}

/// Pushes the frame of internal function `callee` called from the current
/// frame, copying the arguments listed at pool index `args`.
#[allow(clippy::too_many_arguments)]
#[inline(never)]
fn enter_call(
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
    let (cib, crb) = (stack.i32_top, stack.ref_top);
    stack.i32_top += callee_fn.i32_count as usize;
    stack.ref_top += callee_fn.ref_count as usize;
    if stack.i32_regs.len() < stack.i32_top {
        stack.i32_regs.resize(stack.i32_top, 0);
    }
    if stack.ref_regs.len() < stack.ref_top {
        stack.ref_regs.resize(stack.ref_top, None);
    }
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
fn leave_call(module: &BytecodeModule, stack: &mut Stack, cur: &mut Cursor, list: usize) -> bool {
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

fn release_moved(refs: &mut [Option<Ref>], regs: &[u16]) {
    for &r in regs {
        if r & MOVE_BIT != 0 {
            refs[ref_slot(r)] = None;
        }
    }
}
