//! Calls to native (Rust) imports made in place: the callee reads its
//! arguments straight from the caller's registers and writes its results
//! back, with no frame unless it yields or fails.

use super::super::module::BytecodeState;
use super::super::verifier::{pool_list, segment_size, MOVE_BIT};
use super::registers::{get_i64, ref_slot, take_ref};
use super::values::write_results;
use crate::cconv::CconvType;
use crate::in_place::InPlaceCall;
use crate::refs::Ref;
use crate::stack::{Args, NativeCall, NativePoll, NativeStep, Operand, Stack, Wait};
use crate::value::Variant;
use ferrite_base::{bail, Result};
use std::sync::Arc;

/// An in-place native call that outlives its step.
pub(super) struct Parked {
    pub(super) body: Arc<dyn NativeStep>,
    /// The wait it yielded on, or its failure.
    pub(super) outcome: Result<Wait>,
    pub(super) saved: Option<Box<dyn std::any::Any + Send>>,
    pub(super) spare: Vec<Variant>,
    pub(super) results: usize,
    pub(super) resume: usize,
}

/// What the dispatch loop needs to call native imports in place.
pub(super) struct NativeScratch<'a> {
    pub(super) operands: &'a mut Vec<Operand>,
    pub(super) results: &'a mut Vec<Variant>,
    /// False when one more frame would exceed the stack's depth limit.
    pub(super) depth_ok: bool,
}

/// How an attempt to call an import in place ended.
pub(super) enum InPlace {
    /// Finished; its results are in the registers.
    Done,
    /// Not a native function: take the general path.
    NotNative,
    /// Yielded or failed.
    Parked(Box<Parked>),
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
                let n = segment_size(segments, i, args.len())? as usize;
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
///
/// The common case (a native module function that wrote its results in
/// place) is the only one handled here; everything else (a body that built
/// a result vector, yielded or failed, or a native step without a direct
/// closure) goes to [`settle`], out of line, so this path stays short.
#[inline(never)]
pub(super) fn call_in_place(
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
        written: false,
    };
    let outcome = match &target.direct {
        Some(f) => {
            let outcome = f(&mut call);
            if call.written && call.holds_nothing() {
                if let Ok(NativePoll::Ready(out)) = &outcome {
                    if out.capacity() == 0 {
                        // Results already in the registers, nothing left to
                        // check or release: neither value owns anything
                        // (checked just above), so forgetting them leaks
                        // nothing and spares their drop code.
                        std::mem::forget(outcome);
                        std::mem::forget(call);
                        return Ok(InPlace::Done);
                    }
                }
            }
            match outcome {
                Ok(poll) if call.written => Ok(poll),
                other => body.finish(&call, other),
            }
        }
        None => body.step(&mut call),
    };
    let settled = settle(body, call, outcome, pool, results, resume, scratch.results)?;
    if let (InPlace::Parked(_), Some((listed, _))) = (&settled, listed) {
        // The parked call's record is built from the scratch list.
        scratch.operands.clear();
        scratch.operands.extend_from_slice(listed);
    }
    Ok(settled)
}

/// Calls import `import` through its in-place entry ([`crate::in_place`]),
/// tried by the dispatch loop before [`call_in_place`] for calls whose
/// operands were listed at decode time: `Ok(true)` when the entry finished
/// the call, `Ok(false)` when there is none or it declined (the dispatch
/// loop then goes on to `call_in_place`, which also reports an unresolved
/// import), and the parked call when the entry failed. Inlined into the
/// dispatch loop: as a call of its own, passing its eight arguments cost
/// about as much as the rest of it (~45 instructions per import call).
#[inline(always)]
#[allow(clippy::too_many_arguments)]
pub(super) fn call_entry(
    state: &BytecodeState,
    regs: &mut [u32],
    refs: &mut [Option<Ref>],
    (operands, moved): (&[Operand], &[Operand]),
    import: u32,
    result_list: &[u32],
    (results, resume): (usize, usize),
    scratch: &mut NativeScratch<'_>,
) -> std::result::Result<bool, Box<Parked>> {
    let Ok(target) = state.import_ref(import) else {
        return Ok(false);
    };
    let (Some(entry), Some(body)) = (&target.in_place, &target.native) else {
        return Ok(false);
    };
    if !scratch.depth_ok {
        // A failure would need a frame: the general path handles the call.
        return Ok(false);
    }
    let mut c = InPlaceCall {
        regs,
        refs,
        operands,
        moved,
        results: result_list,
    };
    match entry(&mut c) {
        Ok(done) => Ok(done),
        Err(e) => Err(in_place_failed(body, e, operands, results, resume, scratch)),
    }
}

/// An in-place entry failed: the call is parked with the failure, named
/// as the body's would be, as [`settle`] parks a failed body.
#[cold]
#[inline(never)]
fn in_place_failed(
    body: &Arc<dyn NativeStep>,
    e: ferrite_base::Status,
    operands: &[Operand],
    results: usize,
    resume: usize,
    scratch: &mut NativeScratch<'_>,
) -> Box<Parked> {
    let e = match body.finish(&NativeCall::with_values(Vec::new()), Err(e)) {
        Err(e) => e,
        Ok(_) => ferrite_base::status!(Internal, "a failed native call finished"),
    };
    // The parked call's record is built from the scratch list.
    scratch.operands.clear();
    scratch.operands.extend_from_slice(operands);
    Box::new(Parked {
        body: body.clone(),
        outcome: Err(e),
        saved: None,
        spare: std::mem::take(scratch.results),
        results,
        resume,
    })
}

/// The rest of [`call_in_place`]: results the body returned as a vector,
/// and calls that yielded or failed (parked, to get a frame).
#[cold]
#[inline(never)]
#[allow(clippy::too_many_arguments)]
fn settle(
    body: &Arc<dyn NativeStep>,
    call: NativeCall<'_>,
    outcome: Result<NativePoll>,
    pool: &[u32],
    results: usize,
    resume: usize,
    spare: &mut Vec<Variant>,
) -> Result<InPlace> {
    let NativeCall {
        args,
        saved,
        written,
        ..
    } = call;
    let Args::Registers(frame) = args else {
        bail!(Internal, "an in-place native call lost its registers");
    };
    let outcome = match outcome {
        Ok(NativePoll::Ready(out)) if written => {
            drop(out);
            return Ok(InPlace::Done);
        }
        Ok(NativePoll::Ready(mut out)) => {
            // A body that built its result vector itself.
            release_moved_operands(frame.refs, frame.moved.unwrap_or(frame.operands));
            return write_results(frame.regs, frame.refs, pool_list(pool, results), &mut out)
                .map(|()| InPlace::Done);
        }
        Ok(NativePoll::Pending(w)) => Ok(w),
        Err(e) => Err(e),
    };
    Ok(InPlace::Parked(Box::new(Parked {
        body: body.clone(),
        outcome,
        saved,
        spare: std::mem::take(spare),
        results,
        resume,
    })))
}

/// The record of an in-place native call that outlives its step (it
/// yielded, or failed and needs a frame for the backtrace): it takes its
/// arguments as values, moved or retained per their move bits, as a call
/// through the trampoline would have.
#[allow(clippy::too_many_arguments)]
pub(super) fn keep_call(
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
    let mut call = Stack::native_call_with(vals, results);
    call.saved = saved;
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
