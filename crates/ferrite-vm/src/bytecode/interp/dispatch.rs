//! The dispatch loop: one `match` over the decoded instructions of the
//! executing function. Arms that move control (branches, calls, returns,
//! yields) are here; numeric ops come from the tables in
//! [`super::ops_int`] and [`super::ops_float`], expanded into the same
//! `match` by [`op_match!`].

use super::super::isa::{Op, OpRegs};
use super::super::isa_types::bank::I32;
use super::super::module::{BytecodeModule, BytecodeState};
use super::super::trace::{ExecutionTrace, TracedFunction};
use super::super::verifier::{
    call_operands, pool_list, DecodedFunction, Insn, IMPORT_BIT, MOVE_BIT, REF_BIT,
};
use super::control::{branch, check_fail, skip_remap};
use super::frames::{enter_call, leave_call, Cursor};
use super::native_bridge::Parked;
use super::native_bridge::{call_entry, call_in_place, InPlace, NativeScratch};
use super::numeric::numeric;
use super::ops_float::{with_float_ops, Float};
use super::ops_global::{global_slot, load_i64, ref_global, store_i64};
use super::ops_int::with_int_ops;
use super::ops_ref::{check_cast, deref_buffer, deref_list, type_at};
use super::registers::{ref_slot, release_moved, take_ref, Registers};
use crate::buffer::VmBuffer;
use crate::list::VmList;
use crate::refs::Ref;
use crate::stack::Stack;
use ferrite_base::{status, Result};
use std::sync::atomic::Ordering::Relaxed;

/// Control transfers the dispatch loop hands back to [`super::run`].
pub(super) enum Action {
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

/// Runs the top frame's function and the module-internal calls and returns
/// it makes, until control leaves the module (see [`Action`]).
#[inline(never)]
pub(super) fn exec<const COVERAGE: bool>(
    state: &BytecodeState,
    stack: &mut Stack,
    cur: &mut Cursor,
) -> Result<Action> {
    let module: &BytecodeModule = &state.module;
    loop {
        if cur.pc == 0 && ferrite_base::trace::enabled() {
            super::frames::begin_span::<COVERAGE>(module, stack, cur.function);
        }
        // A function the compiling tier compiled runs natively from its
        // first instruction and comes back at its `vm.return`.
        #[cfg(feature = "jit")]
        if !COVERAGE && cur.pc == 0 {
            if let Some(entry) = module.jit.as_ref().and_then(|j| j.entry(cur.function)) {
                let ic = module.functions[cur.function].i32_count as usize;
                match super::super::jit::run(entry, state, stack, cur.function, cur.i32_base, ic) {
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
        // The traced lines of this function, on the instrumented path only.
        let traced = match &stack.trace {
            Some(t) if COVERAGE => Some((t.clone(), t.function(&state.module, cur.function)?)),
            _ => None,
        };
        let func = &module.functions[cur.function];
        let rc = func.ref_count as usize;
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
        // The window is sized by the function the operands were verified
        // against: `dispatch` reads only this function's instructions.
        let Some(mut regs) = Registers::of(func, i32_regs, ib) else {
            return Err(status!(Internal, "register file shorter than its frame"));
        };
        let refs: &mut [Option<Ref>] = &mut ref_regs[rb..rb + rc];
        let mut scratch = NativeScratch {
            operands,
            results: native_results,
            depth_ok: frames.len() < *max_depth,
        };
        let flow = dispatch::<COVERAGE>(
            state,
            func,
            &mut regs,
            refs,
            &mut cur.pc,
            Instrument {
                coverage: coverage.as_deref_mut(),
                trace: traced.as_ref().map(|(t, f)| (&**t, &**f)),
            },
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

/// What the instrumented dispatch loop records per executed instruction:
/// which ops ran (coverage) and the execution trace.
struct Instrument<'a> {
    coverage: Option<&'a mut [bool]>,
    trace: Option<(&'a ExecutionTrace, &'a TracedFunction)>,
}

/// The dispatch loop over one function's instructions. Kept apart from the
/// frame handling so its hot loop keeps its values in registers.
#[inline(never)]
fn dispatch<const COVERAGE: bool>(
    state: &BytecodeState,
    func: &DecodedFunction,
    regs: &mut Registers<'_>,
    refs: &mut [Option<Ref>],
    pc_out: &mut usize,
    mut instrument: Instrument<'_>,
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
            if let Some(listed) = listed {
                // The callee's typed in-place entry, when it has one.
                match call_entry(
                    state,
                    regs.slots(),
                    refs,
                    listed,
                    import,
                    pool_list(pool, results),
                    (results, resume),
                    scratch,
                ) {
                    Ok(true) => {
                        pc = resume;
                        continue;
                    }
                    Ok(false) => {}
                    Err(parked) => {
                        *pc_out = pc;
                        return Ok(Flow::Exit(Action::Parked(parked)));
                    }
                }
            }
            let call = (import, segments, args, results, resume);
            match tri!(call_in_place(
                state,
                regs.slots(),
                refs,
                pool,
                listed,
                call,
                scratch
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
    // Register accesses. Every register these name is an operand of an
    // instruction of `func` (or one of its verified register lists) and
    // `regs` is `func`'s window; the register's type (a bank-typed `Reg`)
    // fixes the width of the access, so `Registers`' contract holds: each
    // access states it as its SAFETY. `slot!`/`wu32!`/`r32!`/`w32!` take a
    // register of either 32-bit bank (i32, or f32 as bits), `ri64!`/`wi64!`
    // one of either 64-bit bank; the others only their own bank.
    macro_rules! slot {
        ($regs:ident, $r:expr) => {
            // SAFETY: a verified operand of `func`, read with its width.
            unsafe { $regs.get($r) }
        };
    }
    macro_rules! wu32 {
        ($regs:ident, $r:expr, $v:expr) => {{
            let v: u32 = $v;
            // SAFETY: a verified operand of `func`, written with its width.
            unsafe { $regs.set($r, v) }
        }};
    }
    macro_rules! r32 {
        ($regs:ident, $r:expr) => {
            slot!($regs, $r) as i32
        };
    }
    macro_rules! w32 {
        ($regs:ident, $r:expr, $v:expr) => {
            wu32!($regs, $r, ($v) as u32)
        };
    }
    macro_rules! ri64 {
        ($regs:ident, $r:expr) => {
            // SAFETY: a verified operand of `func`, read with its width.
            unsafe { $regs.get_i64($r) }
        };
    }
    macro_rules! wi64 {
        ($regs:ident, $r:expr, $v:expr $(,)?) => {{
            let v: i64 = $v;
            // SAFETY: a verified operand of `func`, written with its width.
            unsafe { $regs.set_i64($r, v) }
        }};
    }
    macro_rules! rf32 {
        ($regs:ident, $r:expr) => {
            numeric!(@read $regs, f32, $r)
        };
    }
    macro_rules! wf32 {
        ($regs:ident, $r:expr, $v:expr) => {
            numeric!(@write $regs, f32, $r, $v)
        };
    }
    macro_rules! rf64 {
        ($regs:ident, $r:expr) => {
            numeric!(@read $regs, f64, $r)
        };
    }
    macro_rules! wf64 {
        ($regs:ident, $r:expr, $v:expr) => {
            numeric!(@write $regs, f64, $r, $v)
        };
    }
    // The whole `match`: the arms written below, then one arm per row of
    // the numeric op tables. A row's registers are bound to its operand
    // names, then `out`, with the types the decoded op gives them.
    macro_rules! op_match {
        ($scrutinee:expr, $regs:ident; { $($arms:tt)* }
         $( $shape:ident $(<$from:ty, $to:ty>)? [$t:ty] $op:ident |$($x:ident),*| $e:expr; )*) => {
            match $scrutinee {
                $(
                    R::$op($($x,)* out) => {
                        tri!(numeric!($regs, out, $op; $shape $(<$from, $to>)? [$t] |$($x),*| $e))
                    }
                )*
                $($arms)*
            }
        };
    }
    // Adds the float table's rows to the integer table's for `op_match!`.
    macro_rules! and_float_ops {
        ($($acc:tt)*) => {
            with_float_ops!(op_match! { $($acc)* })
        };
    }
    // Buffer loads and stores: buffer `b`, element offset (i64) `off`,
    // value register `v`; they differ only in width and register bank.
    macro_rules! buffer_load {
        ($b:ident, $off:ident, $load:ident, |$v:ident| $write:expr) => {{
            let off = ri64!(regs, $off) as u64;
            let $v = tri!(tri!(deref_buffer(refs, $b, "source_buffer")).$load(off));
            $write;
        }};
    }
    macro_rules! buffer_store {
        ($b:ident, $off:ident, $store:ident, $value:expr) => {{
            let off = ri64!(regs, $off) as u64;
            let value = $value;
            tri!(tri!(deref_buffer(refs, $b, "target_buffer")).$store(off, value));
        }};
    }
    // A compare fused with the conditional branch it feeds: writes the
    // compare's result and branches on it.
    macro_rules! fused_branch {
        ($insn:ident, $out:ident, $c:expr) => {{
            let c: bool = $c;
            wu32!(regs, $out, c as u32);
            pc = if c {
                $insn.a as usize
            } else {
                $insn.imm as usize
            };
        }};
    }
    // Arms shared by two ops of the same width but different banks (their
    // operands differ in type, so one or-pattern cannot bind both).
    macro_rules! select32 {
        ($c:ident, $t:ident, $f:ident, $out:ident) => {{
            let v = if slot!(regs, $c) != 0 {
                slot!(regs, $t)
            } else {
                slot!(regs, $f)
            };
            wu32!(regs, $out, v);
        }};
    }
    macro_rules! select64 {
        ($c:ident, $t:ident, $f:ident, $out:ident) => {{
            let v = if slot!(regs, $c) != 0 {
                ri64!(regs, $t)
            } else {
                ri64!(regs, $f)
            };
            wi64!(regs, $out, v);
        }};
    }
    // A switch over the values of a verified register list of the bank
    // of `$dflt` (the list's type is inferred from it).
    macro_rules! switch {
        ($insn:ident, $idx:ident, $dflt:ident, $out:ident, $read:ident, $write:ident) => {{
            let idx = r32!(regs, $idx);
            let vals = func.reg_list($insn.imm);
            let reg = match usize::try_from(idx).ok().and_then(|i| vals.get(i)) {
                Some(&reg) => reg,
                None => $dflt,
            };
            let v = $read!(regs, reg);
            $write!(regs, $out, v);
        }};
    }
    // Calls (`$yieldable`: the `.yieldable` form, with a resume block).
    // One arm per op rather than a test of the op inside a shared arm: the
    // op is known from the pattern alone (a test of `insn.regs` would keep
    // its address live through the loop).
    macro_rules! call {
        ($insn:ident, $yieldable:expr) => {{
            let p = $insn.pool as usize;
            let nargs = pool[p] as usize;
            let (resume, results) = if $yieldable {
                (pool[p + 1 + nargs] as usize, p + 2 + nargs)
            } else {
                (pc, p + 1 + nargs)
            };
            if $insn.a & IMPORT_BIT != 0 {
                import_call!($insn, None, p, results, resume);
            }
            *pc_out = pc;
            return Ok(Flow::Call {
                callee: $insn.a as usize,
                args: p,
                results,
                resume,
            });
        }};
    }
    macro_rules! call_variadic {
        ($insn:ident, $yieldable:expr) => {{
            let p = $insn.pool as usize;
            let args = p + 1 + pool[p] as usize;
            let after_args = args + 1 + pool[args] as usize;
            let (resume, results) = if $yieldable {
                (pool[after_args] as usize, after_args + 1)
            } else {
                (pc, after_args)
            };
            import_call!($insn, Some(p), args, results, resume);
        }};
    }
    // Buffer fills with an i32 value register, by element width.
    macro_rules! fill32 {
        ($b:ident, $off:ident, $len:ident, $v:ident, $fill:ident) => {{
            let buf = tri!(deref_buffer(refs, $b, "buffer"));
            let (off, len, v) = (
                ri64!(regs, $off) as u64,
                ri64!(regs, $len) as u64,
                r32!(regs, $v),
            );
            tri!(buf.$fill(off, len, v));
        }};
    }
    use OpRegs as R;
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
            if let Some((t, f)) = instrument.trace {
                f.emit(t, pc - 1);
            }
            if let Some(cov) = instrument.coverage.as_deref_mut() {
                for c in insn.op().components() {
                    cov[*c as usize] = true;
                }
            }
        }
        with_int_ops!(and_float_ops! { insn.regs, regs; {
            R::Block => {}
            R::EndOfFunction => {
                fail!(status!(
                    Internal,
                    "execution fell off the end of the function"
                ));
            }
            // ---- globals
            R::GlobalLoadI32(out) => {
                let s = tri!(global_slot(state, insn.a, 4));
                wu32!(regs, out, state.globals[s].load(Relaxed));
            }
            R::GlobalLoadF32(out) => {
                let s = tri!(global_slot(state, insn.a, 4));
                wu32!(regs, out, state.globals[s].load(Relaxed));
            }
            R::GlobalStoreI32(v) => {
                let s = tri!(global_slot(state, insn.a, 4));
                state.globals[s].store(slot!(regs, v), Relaxed);
            }
            R::GlobalStoreF32(v) => {
                let s = tri!(global_slot(state, insn.a, 4));
                state.globals[s].store(slot!(regs, v), Relaxed);
            }
            R::GlobalLoadIndirectI32(at, out) => {
                let s = tri!(global_slot(state, slot!(regs, at), 4));
                wu32!(regs, out, state.globals[s].load(Relaxed));
            }
            R::GlobalLoadIndirectF32(at, out) => {
                let s = tri!(global_slot(state, slot!(regs, at), 4));
                wu32!(regs, out, state.globals[s].load(Relaxed));
            }
            R::GlobalStoreIndirectI32(at, v) => {
                let s = tri!(global_slot(state, slot!(regs, at), 4));
                state.globals[s].store(slot!(regs, v), Relaxed);
            }
            R::GlobalStoreIndirectF32(at, v) => {
                let s = tri!(global_slot(state, slot!(regs, at), 4));
                state.globals[s].store(slot!(regs, v), Relaxed);
            }
            R::GlobalLoadI64(out) => {
                let s = tri!(global_slot(state, insn.a, 8));
                wi64!(regs, out, load_i64(state, s));
            }
            R::GlobalLoadF64(out) => {
                let s = tri!(global_slot(state, insn.a, 8));
                wi64!(regs, out, load_i64(state, s));
            }
            R::GlobalStoreI64(v) => {
                let s = tri!(global_slot(state, insn.a, 8));
                store_i64(state, s, ri64!(regs, v));
            }
            R::GlobalStoreF64(v) => {
                let s = tri!(global_slot(state, insn.a, 8));
                store_i64(state, s, ri64!(regs, v));
            }
            R::GlobalLoadIndirectI64(at, out) => {
                let s = tri!(global_slot(state, slot!(regs, at), 8));
                wi64!(regs, out, load_i64(state, s));
            }
            R::GlobalLoadIndirectF64(at, out) => {
                let s = tri!(global_slot(state, slot!(regs, at), 8));
                wi64!(regs, out, load_i64(state, s));
            }
            R::GlobalStoreIndirectI64(at, v) => {
                let s = tri!(global_slot(state, slot!(regs, at), 8));
                store_i64(state, s, ri64!(regs, v));
            }
            R::GlobalStoreIndirectF64(at, v) => {
                let s = tri!(global_slot(state, slot!(regs, at), 8));
                store_i64(state, s, ri64!(regs, v));
            }
            R::GlobalLoadRef(out) => {
                let g = tri!(ref_global(state, insn.a)).lock().clone();
                tri!(check_cast(&g, type_at(state, insn.imm)));
                refs[ref_slot(out)] = g;
            }
            R::GlobalStoreRef(v) => {
                let v = take_ref(refs, v);
                tri!(check_cast(&v, type_at(state, insn.imm)));
                *tri!(ref_global(state, insn.a)).lock() = v;
            }
            R::GlobalLoadIndirectRef(at, out) => {
                let g = tri!(ref_global(state, slot!(regs, at))).lock().clone();
                tri!(check_cast(&g, type_at(state, insn.imm)));
                refs[ref_slot(out)] = g;
            }
            R::GlobalStoreIndirectRef(at, v) => {
                let v = take_ref(refs, v);
                tri!(check_cast(&v, type_at(state, insn.imm)));
                *tri!(ref_global(state, slot!(regs, at))).lock() = v;
            }
            // ---- constants
            R::ConstI32Zero(out) => wu32!(regs, out, 0),
            R::ConstF32Zero(out) => wu32!(regs, out, 0),
            R::ConstI32(out) => wu32!(regs, out, insn.imm as u32),
            R::ConstF32(out) => wu32!(regs, out, insn.imm as u32),
            R::ConstI64Zero(out) => wi64!(regs, out, 0),
            R::ConstF64Zero(out) => wi64!(regs, out, 0),
            R::ConstI64(out) => wi64!(regs, out, insn.imm as i64),
            R::ConstF64(out) => wi64!(regs, out, insn.imm as i64),
            R::ConstRefZero(out) => refs[ref_slot(out)] = None,
            R::ConstRefRodata(out) => {
                refs[ref_slot(out)] = Some(state.module.rodata[insn.a as usize].clone())
            }
            // ---- lists
            R::ListAlloc(cap, out) => {
                let ty = type_at(state, insn.imm);
                let l = tri!(VmList::new(ty, slot!(regs, cap)));
                refs[ref_slot(out)] = Some(Ref::new(l));
            }
            R::ListReserve(l, n) => tri!(tri!(deref_list(refs, l)).reserve(slot!(regs, n))),
            R::ListSize(l, out) => {
                let n = tri!(deref_list(refs, l)).size();
                wu32!(regs, out, n);
            }
            R::ListResize(l, n) => tri!(tri!(deref_list(refs, l)).resize(slot!(regs, n))),
            R::ListGetI32(l, i, out) => {
                let v = tri!(tri!(deref_list(refs, l)).get_i32(slot!(regs, i)));
                w32!(regs, out, v);
            }
            R::ListSetI32(l, i, v) => {
                let v = r32!(regs, v);
                tri!(tri!(deref_list(refs, l)).set_i32(slot!(regs, i), v));
            }
            R::ListGetI64(l, i, out) => {
                let v = tri!(tri!(deref_list(refs, l)).get_i64(slot!(regs, i)));
                wi64!(regs, out, v);
            }
            R::ListSetI64(l, i, v) => {
                let v = ri64!(regs, v);
                tri!(tri!(deref_list(refs, l)).set_i64(slot!(regs, i), v));
            }
            R::ListGetF32(l, i, out) => {
                let v = tri!(tri!(deref_list(refs, l)).get_f32(slot!(regs, i)));
                wf32!(regs, out, v);
            }
            R::ListSetF32(l, i, v) => {
                let v = rf32!(regs, v);
                tri!(tri!(deref_list(refs, l)).set_f32(slot!(regs, i), v));
            }
            R::ListGetF64(l, i, out) => {
                let v = tri!(tri!(deref_list(refs, l)).get_f64(slot!(regs, i)));
                wf64!(regs, out, v);
            }
            R::ListSetF64(l, i, v) => {
                let v = rf64!(regs, v);
                tri!(tri!(deref_list(refs, l)).set_f64(slot!(regs, i), v));
            }
            R::ListGetRef(l, i, out) => {
                let v = tri!(tri!(deref_list(refs, l)).get_ref(slot!(regs, i)));
                let ty = type_at(state, insn.imm);
                // A value of another type reads as null, as upstream's
                // retain-or-null does.
                let v = v.filter(|x| ty.accepts_ref(x));
                refs[ref_slot(out)] = v;
            }
            R::ListSetRef(l, i, v) => {
                let v = take_ref(refs, v);
                tri!(tri!(deref_list(refs, l)).set_ref(slot!(regs, i), v));
            }
            // ---- select / switch
            R::SelectI32(c, t, f, out) => select32!(c, t, f, out),
            R::SelectF32(c, t, f, out) => select32!(c, t, f, out),
            R::SelectI64(c, t, f, out) => select64!(c, t, f, out),
            R::SelectF64(c, t, f, out) => select64!(c, t, f, out),
            R::SelectRef(c, t, f, out) => {
                let chosen = if slot!(regs, c) != 0 { t } else { f };
                // The result's type is checked as upstream does (a ref of
                // another type is a type mismatch, not a silent copy).
                tri!(check_cast(&refs[ref_slot(chosen)], type_at(state, insn.imm)));
                let v = take_ref(refs, chosen);
                // The unchosen operand is released when marked move.
                let other = if chosen == t { f } else { t };
                if other.raw() & MOVE_BIT != 0 && ref_slot(other) != ref_slot(chosen) {
                    refs[ref_slot(other)] = None;
                }
                refs[ref_slot(out)] = v;
            }
            R::SwitchI32(idx, dflt, out) => switch!(insn, idx, dflt, out, slot, wu32),
            R::SwitchF32(idx, dflt, out) => switch!(insn, idx, dflt, out, slot, wu32),
            R::SwitchI64(idx, dflt, out) => switch!(insn, idx, dflt, out, ri64, wi64),
            R::SwitchF64(idx, dflt, out) => switch!(insn, idx, dflt, out, ri64, wi64),
            R::SwitchRef(idx, dflt, out) => {
                let idx = r32!(regs, idx);
                let vals = pool_list(pool, insn.pool as usize);
                let src = match usize::try_from(idx).ok().and_then(|i| vals.get(i)) {
                    Some(&reg) => reg as u16,
                    None => dflt.raw(),
                };
                let v = refs[ref_slot(src)].clone();
                tri!(check_cast(&v, type_at(state, insn.imm)));
                refs[ref_slot(out)] = v;
            }
            // ---- integer width conversions (arithmetic, shifts and
            // compares are rows of the `ops_int` table)
            R::TruncI32I8(x, out) => wu32!(regs, out, slot!(regs, x) as u8 as u32),
            R::TruncI32I16(x, out) => wu32!(regs, out, slot!(regs, x) as u16 as u32),
            R::TruncI64I32(x, out) => wu32!(regs, out, ri64!(regs, x) as u32),
            R::ExtI8I32S(x, out) => w32!(regs, out, slot!(regs, x) as u8 as i8 as i32),
            R::ExtI8I32U(x, out) => wu32!(regs, out, slot!(regs, x) as u8 as u32),
            R::ExtI16I32S(x, out) => w32!(regs, out, slot!(regs, x) as u16 as i16 as i32),
            R::ExtI16I32U(x, out) => wu32!(regs, out, slot!(regs, x) as u16 as u32),
            R::ExtI32I64S(x, out) => wi64!(regs, out, r32!(regs, x) as i64),
            R::ExtI32I64U(x, out) => wi64!(regs, out, slot!(regs, x) as i64),
            // ---- ref comparisons
            R::CmpEQRef(a, b, out) => {
                let eq = refs[ref_slot(a)] == refs[ref_slot(b)];
                release_moved(refs, &[a, b]);
                w32!(regs, out, eq);
            }
            R::CmpNERef(a, b, out) => {
                let ne = refs[ref_slot(a)] != refs[ref_slot(b)];
                release_moved(refs, &[a, b]);
                w32!(regs, out, ne);
            }
            R::CmpNZRef(a, out) => {
                let nz = refs[ref_slot(a)].is_some();
                release_moved(refs, &[a]);
                w32!(regs, out, nz);
            }
            // ---- control flow
            R::DirectBranch => pc = insn.a as usize,
            R::PrimitiveRemapBranch => {
                for pair in func.reg_list::<I32>(insn.imm).chunks_exact(2) {
                    let v = slot!(regs, pair[0]);
                    wu32!(regs, pair[1], v);
                }
                pc = insn.a as usize;
            }
            R::DirectCondBranch(c) => {
                pc = if slot!(regs, c) != 0 {
                    insn.a as usize
                } else {
                    insn.imm as usize
                };
            }
            R::FusedCmpEQI32CondBranch(a, b, out) => {
                fused_branch!(insn, out, slot!(regs, a) == slot!(regs, b))
            }
            R::FusedCmpNEI32CondBranch(a, b, out) => {
                fused_branch!(insn, out, slot!(regs, a) != slot!(regs, b))
            }
            R::FusedCmpLTI32SCondBranch(a, b, out) => {
                fused_branch!(insn, out, r32!(regs, a) < r32!(regs, b))
            }
            R::FusedCmpLTI32UCondBranch(a, b, out) => {
                fused_branch!(insn, out, slot!(regs, a) < slot!(regs, b))
            }
            R::FusedCmpNZI32CondBranch(a, out) => fused_branch!(insn, out, slot!(regs, a) != 0),
            R::FusedCmpEQI64CondBranch(a, b, out) => {
                fused_branch!(insn, out, ri64!(regs, a) == ri64!(regs, b))
            }
            R::FusedCmpNEI64CondBranch(a, b, out) => {
                fused_branch!(insn, out, ri64!(regs, a) != ri64!(regs, b))
            }
            R::FusedCmpLTI64SCondBranch(a, b, out) => {
                fused_branch!(insn, out, ri64!(regs, a) < ri64!(regs, b))
            }
            R::FusedCmpLTI64UCondBranch(a, b, out) => {
                fused_branch!(insn, out, (ri64!(regs, a) as u64) < (ri64!(regs, b) as u64))
            }
            R::FusedCmpNZI64CondBranch(a, out) => fused_branch!(insn, out, ri64!(regs, a) != 0),
            R::Branch => pc = branch(regs.slots(), refs, pool, insn.pool as usize),
            R::CondBranch(c) => {
                let p = insn.pool as usize;
                if slot!(regs, c) != 0 {
                    pc = branch(regs.slots(), refs, pool, p);
                } else {
                    let f = skip_remap(pool, p + 1);
                    pc = branch(regs.slots(), refs, pool, f);
                }
            }
            R::BranchTable(idx) => {
                let p = insn.pool as usize;
                let idx = r32!(regs, idx);
                let default_end = skip_remap(pool, p + 1);
                let size = pool[default_end] as i64;
                if idx < 0 || idx as i64 >= size {
                    pc = branch(regs.slots(), refs, pool, p);
                } else {
                    let mut at = default_end + 1;
                    for _ in 0..idx {
                        at = skip_remap(pool, at + 1);
                    }
                    pc = branch(regs.slots(), refs, pool, at);
                }
            }
            R::Call => call!(insn, false),
            R::CallYieldable => call!(insn, true),
            R::CallVariadic => call_variadic!(insn, false),
            R::CallVariadicYieldable => call_variadic!(insn, true),
            R::Return => {
                *pc_out = pc;
                return Ok(Flow::Return {
                    list: insn.pool as usize,
                });
            }
            R::Fail(code) => {
                let code = r32!(regs, code);
                tri!(check_fail(code, &state.module.strings[insn.a as usize]));
            }
            R::ImportResolved(out) => {
                let resolved = state.import_resolved(insn.a & !IMPORT_BIT);
                w32!(regs, out, resolved);
            }
            R::Yield => {
                pc = branch(regs.slots(), refs, pool, insn.pool as usize);
                *pc_out = pc;
                return Ok(Flow::Exit(Action::Yield));
            }
            R::Trace | R::Print => {
                let list = pool_list(pool, insn.pool as usize);
                for &reg in list {
                    let reg = reg as u16;
                    if reg & (REF_BIT | MOVE_BIT) == REF_BIT | MOVE_BIT {
                        refs[ref_slot(reg)] = None;
                    }
                }
            }
            R::CondBreak(_) => {
                // Debugger breaks are not supported; execution continues.
                pc = branch(regs.slots(), refs, pool, insn.pool as usize);
            }
            R::Break => pc = branch(regs.slots(), refs, pool, insn.pool as usize),
            // ---- buffers
            R::BufferLoadI8U(b, off, out) => buffer_load!(b, off, load_i8u, |v| w32!(regs, out, v)),
            R::BufferLoadI8S(b, off, out) => buffer_load!(b, off, load_i8s, |v| w32!(regs, out, v)),
            R::BufferLoadI16U(b, off, out) => {
                buffer_load!(b, off, load_i16u, |v| w32!(regs, out, v))
            }
            R::BufferLoadI16S(b, off, out) => {
                buffer_load!(b, off, load_i16s, |v| w32!(regs, out, v))
            }
            R::BufferLoadI32(b, off, out) => buffer_load!(b, off, load_i32, |v| w32!(regs, out, v)),
            R::BufferLoadI64(b, off, out) => {
                buffer_load!(b, off, load_i64, |v| wi64!(regs, out, v))
            }
            R::BufferLoadF32(b, off, out) => {
                buffer_load!(b, off, load_f32, |v| wf32!(regs, out, v))
            }
            R::BufferLoadF64(b, off, out) => {
                buffer_load!(b, off, load_f64, |v| wf64!(regs, out, v))
            }
            R::BufferStoreI8(b, off, v) => buffer_store!(b, off, store_i8, r32!(regs, v)),
            R::BufferStoreI16(b, off, v) => buffer_store!(b, off, store_i16, r32!(regs, v)),
            R::BufferStoreI32(b, off, v) => buffer_store!(b, off, store_i32, r32!(regs, v)),
            R::BufferStoreI64(b, off, v) => buffer_store!(b, off, store_i64, ri64!(regs, v)),
            R::BufferStoreF32(b, off, v) => buffer_store!(b, off, store_f32, rf32!(regs, v)),
            R::BufferStoreF64(b, off, v) => buffer_store!(b, off, store_f64, rf64!(regs, v)),
            R::BufferAlloc(len, align, out) => {
                let len = ri64!(regs, len) as u64;
                let b = tri!(VmBuffer::new(len, slot!(regs, align)));
                refs[ref_slot(out)] = Some(Ref::new(b));
            }
            R::BufferClone(src, off, len, align, out) => {
                let (off, len) = (ri64!(regs, off) as u64, ri64!(regs, len) as u64);
                let b = tri!(tri!(deref_buffer(refs, src, "source")).clone_range(
                    off,
                    len,
                    slot!(regs, align)
                ));
                refs[ref_slot(out)] = Some(Ref::new(b));
            }
            R::BufferLength(b, out) => {
                let n = tri!(deref_buffer(refs, b, "buffer")).len();
                wi64!(regs, out, n as i64);
            }
            R::BufferCopy(src, src_off, dst, dst_off, len) => {
                let src = tri!(deref_buffer(refs, src, "source_buffer"));
                let dst = tri!(deref_buffer(refs, dst, "target_buffer"));
                tri!(VmBuffer::copy(
                    src,
                    ri64!(regs, src_off) as u64,
                    dst,
                    ri64!(regs, dst_off) as u64,
                    ri64!(regs, len) as u64
                ));
            }
            R::BufferCompare(lhs, lhs_off, rhs, rhs_off, len, out) => {
                let a = tri!(deref_buffer(refs, lhs, "lhs_buffer"));
                let b = tri!(deref_buffer(refs, rhs, "rhs_buffer"));
                let eq = tri!(VmBuffer::compare(
                    a,
                    ri64!(regs, lhs_off) as u64,
                    b,
                    ri64!(regs, rhs_off) as u64,
                    ri64!(regs, len) as u64
                ));
                w32!(regs, out, eq);
            }
            R::BufferFillI8(b, off, len, v) => fill32!(b, off, len, v, fill_i8),
            R::BufferFillI16(b, off, len, v) => fill32!(b, off, len, v, fill_i16),
            R::BufferFillI32(b, off, len, v) => fill32!(b, off, len, v, fill_i32),
            R::BufferFillI64(b, off, len, v) => {
                let b = tri!(deref_buffer(refs, b, "buffer"));
                tri!(b.fill_i64(
                    ri64!(regs, off) as u64,
                    ri64!(regs, len) as u64,
                    ri64!(regs, v)
                ));
            }
            R::BufferFillF32(b, off, len, v) => {
                let b = tri!(deref_buffer(refs, b, "buffer"));
                tri!(b.fill_f32(
                    ri64!(regs, off) as u64,
                    ri64!(regs, len) as u64,
                    rf32!(regs, v)
                ));
            }
            R::BufferFillF64(b, off, len, v) => {
                let b = tri!(deref_buffer(refs, b, "buffer"));
                tri!(b.fill_f64(
                    ri64!(regs, off) as u64,
                    ri64!(regs, len) as u64,
                    rf64!(regs, v)
                ));
            }
            R::BufferHash(b, off, len, out) => {
                let b = tri!(deref_buffer(refs, b, "source_buffer"));
                let h = tri!(b.hash(ri64!(regs, off) as u64, ri64!(regs, len) as u64));
                wi64!(regs, out, h);
            }
            // ---- refs
            R::CastAnyRef(v, out) => {
                let v = take_ref(refs, v);
                tri!(check_cast(&v, type_at(state, insn.imm)));
                refs[ref_slot(out)] = v;
            }
            R::DiscardRefs => {
                for &reg in pool_list(pool, insn.pool as usize) {
                    let reg = reg as u16;
                    if reg & REF_BIT != 0 {
                        refs[ref_slot(reg)] = None;
                    }
                }
            }
            R::AssignRef(v, out) => {
                let v = take_ref(refs, v);
                refs[ref_slot(out)] = v;
            }
            // ---- float conversions and bitcasts (arithmetic, math and
            // compares are rows of the `ops_float` table)
            R::BitcastI32F32(x, out) => wu32!(regs, out, slot!(regs, x)),
            R::BitcastF32I32(x, out) => wu32!(regs, out, slot!(regs, x)),
            R::TruncF64F32(x, out) => wf32!(regs, out, rf64!(regs, x) as f32),
            R::ExtF32F64(x, out) => wf64!(regs, out, rf32!(regs, x) as f64),
            R::BitcastI64F64(x, out) => wi64!(regs, out, ri64!(regs, x)),
            R::BitcastF64I64(x, out) => wi64!(regs, out, ri64!(regs, x)),
        }})
    }
}
