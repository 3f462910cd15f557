//! The dispatch loop: one `match` over the decoded instructions of the
//! executing function. Arms that move control (branches, calls, returns,
//! yields) are here; numeric ops come from the tables in
//! [`super::ops_int`] and [`super::ops_float`], expanded into the same
//! `match` by [`op_match!`].

use super::super::isa::Op;
use super::super::module::{BytecodeModule, BytecodeState};
use super::super::trace::{ExecutionTrace, TracedFunction};
use super::super::verifier::{
    call_operands, pool_list, DecodedFunction, Insn, IMPORT_BIT, MOVE_BIT, REF_BIT,
};
use super::control::{branch, check_fail, skip_remap};
use super::frames::{enter_call, leave_call, Cursor};
use super::native_bridge::{call_in_place, InPlace, NativeScratch};
use super::numeric::numeric;
use super::ops_float::{with_float_ops, Float};
use super::ops_global::{global_slot, load_i64, ref_global, store_i64};
use super::ops_int::with_int_ops;
use super::ops_ref::{check_cast, deref_buffer, deref_list, type_at};
use super::registers::{ref_slot, release_moved, take_ref, Registers};
use super::Action;
use crate::buffer::VmBuffer;
use crate::list::VmList;
use crate::refs::Ref;
use crate::stack::Stack;
use ferrite_base::{status, Result};
use std::sync::atomic::Ordering::Relaxed;

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
    // instruction of `func` (or one of its verified register lists), read
    // with the bank the ISA declares for it, and `regs` is `func`'s window:
    // `Registers`' contract, which each access states as its SAFETY.
    macro_rules! slot {
        ($regs:ident, $r:expr) => {
            numeric!(@read $regs, u32, $r)
        };
    }
    macro_rules! wu32 {
        ($regs:ident, $r:expr, $v:expr) => {
            numeric!(@write $regs, u32, $r, $v)
        };
    }
    macro_rules! r32 {
        ($regs:ident, $r:expr) => {
            numeric!(@read $regs, i32, $r)
        };
    }
    macro_rules! w32 {
        ($regs:ident, $r:expr, $v:expr) => {
            numeric!(@write $regs, u32, $r, ($v) as u32)
        };
    }
    macro_rules! ri64 {
        ($regs:ident, $r:expr) => {
            numeric!(@read $regs, i64, $r)
        };
    }
    macro_rules! wi64 {
        ($regs:ident, $r:expr, $v:expr $(,)?) => {
            numeric!(@write $regs, i64, $r, $v)
        };
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
    // the numeric op tables.
    macro_rules! op_match {
        ($scrutinee:expr, $regs:ident, $r:ident; { $($arms:tt)* }
         $( $shape:ident $(<$from:ty, $to:ty>)? [$t:ty] $op:ident |$($x:ident),*| $e:expr; )*) => {
            match $scrutinee {
                $(
                    Op::$op => tri!(numeric!($regs, $r, $op; $shape $(<$from, $to>)? [$t] |$($x),*| $e)),
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
    macro_rules! buffer_load {
        ($r:ident, $load:ident, |$v:ident| $write:expr) => {{
            let off = ri64!(regs, $r[1]) as u64;
            let $v = tri!(tri!(deref_buffer(refs, $r[0], "source_buffer")).$load(off));
            $write;
        }};
    }
    macro_rules! buffer_store {
        ($r:ident, $store:ident, $value:expr) => {{
            let off = ri64!(regs, $r[1]) as u64;
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
            if let Some((t, f)) = instrument.trace {
                f.emit(t, pc - 1);
            }
            if let Some(cov) = instrument.coverage.as_deref_mut() {
                for c in insn.op.components() {
                    cov[*c as usize] = true;
                }
            }
        }
        let r = &insn.r;
        with_int_ops!(and_float_ops! { insn.op, regs, r; {
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
                wu32!(regs, r[0], state.globals[s].load(Relaxed));
            }
            Op::GlobalStoreI32 | Op::GlobalStoreF32 => {
                let s = tri!(global_slot(state, insn.a, 4));
                state.globals[s].store(slot!(regs, r[0]), Relaxed);
            }
            Op::GlobalLoadIndirectI32 | Op::GlobalLoadIndirectF32 => {
                let s = tri!(global_slot(state, slot!(regs, r[0]), 4));
                wu32!(regs, r[1], state.globals[s].load(Relaxed));
            }
            Op::GlobalStoreIndirectI32 | Op::GlobalStoreIndirectF32 => {
                let s = tri!(global_slot(state, slot!(regs, r[0]), 4));
                state.globals[s].store(slot!(regs, r[1]), Relaxed);
            }
            Op::GlobalLoadI64 | Op::GlobalLoadF64 => {
                let s = tri!(global_slot(state, insn.a, 8));
                wi64!(regs, r[0], load_i64(state, s));
            }
            Op::GlobalStoreI64 | Op::GlobalStoreF64 => {
                let s = tri!(global_slot(state, insn.a, 8));
                store_i64(state, s, ri64!(regs, r[0]));
            }
            Op::GlobalLoadIndirectI64 | Op::GlobalLoadIndirectF64 => {
                let s = tri!(global_slot(state, slot!(regs, r[0]), 8));
                wi64!(regs, r[1], load_i64(state, s));
            }
            Op::GlobalStoreIndirectI64 | Op::GlobalStoreIndirectF64 => {
                let s = tri!(global_slot(state, slot!(regs, r[0]), 8));
                store_i64(state, s, ri64!(regs, r[1]));
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
            Op::ConstI32Zero | Op::ConstF32Zero => wu32!(regs, r[0], 0),
            Op::ConstI32 | Op::ConstF32 => wu32!(regs, r[0], insn.imm as u32),
            Op::ConstI64Zero | Op::ConstF64Zero => wi64!(regs, r[0], 0),
            Op::ConstI64 | Op::ConstF64 => wi64!(regs, r[0], insn.imm as i64),
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
                wu32!(regs, r[1], n);
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
                wi64!(regs, r[2], v);
            }
            Op::ListSetI64 => {
                let v = ri64!(regs, r[2]);
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
                wu32!(regs, r[3], v);
            }
            Op::SelectI64 | Op::SelectF64 => {
                let v = if slot!(regs, r[0]) != 0 {
                    ri64!(regs, r[1])
                } else {
                    ri64!(regs, r[2])
                };
                wi64!(regs, r[3], v);
            }
            Op::SelectRef => {
                let (t, f) = (r[1], r[2]);
                let chosen = if slot!(regs, r[0]) != 0 { t } else { f };
                // The result's type is checked as upstream does (a ref of
                // another type is a type mismatch, not a silent copy).
                tri!(check_cast(&refs[ref_slot(chosen)], type_at(state, insn.imm)));
                let v = take_ref(refs, chosen);
                // The unchosen operand is released when marked move.
                let other = if chosen == t { f } else { t };
                if other.raw() & MOVE_BIT != 0 && ref_slot(other) != ref_slot(chosen) {
                    refs[ref_slot(other)] = None;
                }
                refs[ref_slot(r[3])] = v;
            }
            Op::SwitchI32 | Op::SwitchF32 => {
                let idx = r32!(regs, r[0]);
                let vals = func.reg_list(insn.imm);
                let v = match usize::try_from(idx).ok().and_then(|i| vals.get(i)) {
                    Some(&reg) => slot!(regs, reg),
                    None => slot!(regs, r[1]),
                };
                wu32!(regs, r[2], v);
            }
            Op::SwitchI64 | Op::SwitchF64 => {
                let idx = r32!(regs, r[0]);
                let vals = func.reg_list(insn.imm);
                let v = match usize::try_from(idx).ok().and_then(|i| vals.get(i)) {
                    Some(&reg) => ri64!(regs, reg),
                    None => ri64!(regs, r[1]),
                };
                wi64!(regs, r[2], v);
            }
            Op::SwitchRef => {
                let idx = r32!(regs, r[0]);
                let vals = pool_list(pool, insn.pool as usize);
                let src = match usize::try_from(idx).ok().and_then(|i| vals.get(i)) {
                    Some(&reg) => reg as u16,
                    None => r[1].raw(),
                };
                let v = refs[ref_slot(src)].clone();
                tri!(check_cast(&v, type_at(state, insn.imm)));
                refs[ref_slot(r[2])] = v;
            }
            // ---- integer width conversions (arithmetic, shifts and
            // compares are rows of the `ops_int` table)
            Op::TruncI32I8 => wu32!(regs, r[1], slot!(regs, r[0]) as u8 as u32),
            Op::TruncI32I16 => wu32!(regs, r[1], slot!(regs, r[0]) as u16 as u32),
            Op::TruncI64I32 => wu32!(regs, r[1], ri64!(regs, r[0]) as u32),
            Op::ExtI8I32S => w32!(regs, r[1], slot!(regs, r[0]) as u8 as i8 as i32),
            Op::ExtI8I32U => wu32!(regs, r[1], slot!(regs, r[0]) as u8 as u32),
            Op::ExtI16I32S => w32!(regs, r[1], slot!(regs, r[0]) as u16 as i16 as i32),
            Op::ExtI16I32U => wu32!(regs, r[1], slot!(regs, r[0]) as u16 as u32),
            Op::ExtI32I64S => wi64!(regs, r[1], r32!(regs, r[0]) as i64),
            Op::ExtI32I64U => wi64!(regs, r[1], slot!(regs, r[0]) as i64),
            // ---- ref comparisons
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
                for pair in func.reg_list(insn.imm).chunks_exact(2) {
                    let v = slot!(regs, pair[0]);
                    wu32!(regs, pair[1], v);
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
                wu32!(regs, r[2], c as u32);
                pc = if c {
                    insn.a as usize
                } else {
                    insn.imm as usize
                };
            }
            Op::FusedCmpNEI32CondBranch => {
                let c = slot!(regs, r[0]) != slot!(regs, r[1]);
                wu32!(regs, r[2], c as u32);
                pc = if c {
                    insn.a as usize
                } else {
                    insn.imm as usize
                };
            }
            Op::FusedCmpLTI32SCondBranch => {
                let c = (slot!(regs, r[0]) as i32) < (slot!(regs, r[1]) as i32);
                wu32!(regs, r[2], c as u32);
                pc = if c {
                    insn.a as usize
                } else {
                    insn.imm as usize
                };
            }
            Op::FusedCmpLTI32UCondBranch => {
                let c = slot!(regs, r[0]) < slot!(regs, r[1]);
                wu32!(regs, r[2], c as u32);
                pc = if c {
                    insn.a as usize
                } else {
                    insn.imm as usize
                };
            }
            Op::FusedCmpNZI32CondBranch => {
                let c = slot!(regs, r[0]) != 0;
                wu32!(regs, r[1], c as u32);
                pc = if c {
                    insn.a as usize
                } else {
                    insn.imm as usize
                };
            }
            Op::FusedCmpEQI64CondBranch => {
                let c = ri64!(regs, r[0]) == ri64!(regs, r[1]);
                wu32!(regs, r[2], c as u32);
                pc = if c {
                    insn.a as usize
                } else {
                    insn.imm as usize
                };
            }
            Op::FusedCmpNEI64CondBranch => {
                let c = ri64!(regs, r[0]) != ri64!(regs, r[1]);
                wu32!(regs, r[2], c as u32);
                pc = if c {
                    insn.a as usize
                } else {
                    insn.imm as usize
                };
            }
            Op::FusedCmpLTI64SCondBranch => {
                let c = ri64!(regs, r[0]) < ri64!(regs, r[1]);
                wu32!(regs, r[2], c as u32);
                pc = if c {
                    insn.a as usize
                } else {
                    insn.imm as usize
                };
            }
            Op::FusedCmpLTI64UCondBranch => {
                let c = (ri64!(regs, r[0]) as u64) < (ri64!(regs, r[1]) as u64);
                wu32!(regs, r[2], c as u32);
                pc = if c {
                    insn.a as usize
                } else {
                    insn.imm as usize
                };
            }
            Op::FusedCmpNZI64CondBranch => {
                let c = ri64!(regs, r[0]) != 0;
                wu32!(regs, r[1], c as u32);
                pc = if c {
                    insn.a as usize
                } else {
                    insn.imm as usize
                };
            }
            Op::Branch => pc = branch(regs.slots(), refs, pool, insn.pool as usize),
            Op::CondBranch => {
                let p = insn.pool as usize;
                if slot!(regs, r[0]) != 0 {
                    pc = branch(regs.slots(), refs, pool, p);
                } else {
                    let f = skip_remap(pool, p + 1);
                    pc = branch(regs.slots(), refs, pool, f);
                }
            }
            Op::BranchTable => {
                let p = insn.pool as usize;
                let idx = r32!(regs, r[0]);
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
                pc = branch(regs.slots(), refs, pool, insn.pool as usize);
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
                pc = branch(regs.slots(), refs, pool, insn.pool as usize);
            }
            Op::Break => pc = branch(regs.slots(), refs, pool, insn.pool as usize),
            // ---- buffers
            // Loads and stores: buffer in r[0], element offset (i64) in r[1],
            // value in r[2]; they differ only in width and register bank.
            Op::BufferLoadI8U => buffer_load!(r, load_i8u, |v| w32!(regs, r[2], v)),
            Op::BufferLoadI8S => buffer_load!(r, load_i8s, |v| w32!(regs, r[2], v)),
            Op::BufferLoadI16U => buffer_load!(r, load_i16u, |v| w32!(regs, r[2], v)),
            Op::BufferLoadI16S => buffer_load!(r, load_i16s, |v| w32!(regs, r[2], v)),
            Op::BufferLoadI32 => buffer_load!(r, load_i32, |v| w32!(regs, r[2], v)),
            Op::BufferLoadI64 => buffer_load!(r, load_i64, |v| wi64!(regs, r[2], v)),
            Op::BufferLoadF32 => buffer_load!(r, load_f32, |v| wf32!(regs, r[2], v)),
            Op::BufferLoadF64 => buffer_load!(r, load_f64, |v| wf64!(regs, r[2], v)),
            Op::BufferStoreI8 => buffer_store!(r, store_i8, slot!(regs, r[2]) as i32),
            Op::BufferStoreI16 => buffer_store!(r, store_i16, slot!(regs, r[2]) as i32),
            Op::BufferStoreI32 => buffer_store!(r, store_i32, slot!(regs, r[2]) as i32),
            Op::BufferStoreI64 => buffer_store!(r, store_i64, ri64!(regs, r[2])),
            Op::BufferStoreF32 => buffer_store!(r, store_f32, rf32!(regs, r[2])),
            Op::BufferStoreF64 => buffer_store!(r, store_f64, rf64!(regs, r[2])),
            Op::BufferAlloc => {
                let len = ri64!(regs, r[0]) as u64;
                let b = tri!(VmBuffer::new(len, slot!(regs, r[1])));
                refs[ref_slot(r[2])] = Some(Ref::new(b));
            }
            Op::BufferClone => {
                let (off, len) = (ri64!(regs, r[1]) as u64, ri64!(regs, r[2]) as u64);
                let b = tri!(tri!(deref_buffer(refs, r[0], "source")).clone_range(
                    off,
                    len,
                    slot!(regs, r[3])
                ));
                refs[ref_slot(r[4])] = Some(Ref::new(b));
            }
            Op::BufferLength => {
                let n = tri!(deref_buffer(refs, r[0], "buffer")).len();
                wi64!(regs, r[1], n as i64);
            }
            Op::BufferCopy => {
                let src = tri!(deref_buffer(refs, r[0], "source_buffer"));
                let dst = tri!(deref_buffer(refs, r[2], "target_buffer"));
                tri!(VmBuffer::copy(
                    src,
                    ri64!(regs, r[1]) as u64,
                    dst,
                    ri64!(regs, r[3]) as u64,
                    ri64!(regs, r[4]) as u64
                ));
            }
            Op::BufferCompare => {
                let a = tri!(deref_buffer(refs, r[0], "lhs_buffer"));
                let b = tri!(deref_buffer(refs, r[2], "rhs_buffer"));
                let eq = tri!(VmBuffer::compare(
                    a,
                    ri64!(regs, r[1]) as u64,
                    b,
                    ri64!(regs, r[3]) as u64,
                    ri64!(regs, r[4]) as u64
                ));
                w32!(regs, r[5], eq);
            }
            Op::BufferFillI8 | Op::BufferFillI16 | Op::BufferFillI32 => {
                let b = tri!(deref_buffer(refs, r[0], "buffer"));
                let (off, len, v) = (
                    ri64!(regs, r[1]) as u64,
                    ri64!(regs, r[2]) as u64,
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
                    ri64!(regs, r[1]) as u64,
                    ri64!(regs, r[2]) as u64,
                    ri64!(regs, r[3])
                ));
            }
            Op::BufferFillF32 => {
                let b = tri!(deref_buffer(refs, r[0], "buffer"));
                tri!(b.fill_f32(
                    ri64!(regs, r[1]) as u64,
                    ri64!(regs, r[2]) as u64,
                    rf32!(regs, r[3])
                ));
            }
            Op::BufferFillF64 => {
                let b = tri!(deref_buffer(refs, r[0], "buffer"));
                tri!(b.fill_f64(
                    ri64!(regs, r[1]) as u64,
                    ri64!(regs, r[2]) as u64,
                    rf64!(regs, r[3])
                ));
            }
            Op::BufferHash => {
                let b = tri!(deref_buffer(refs, r[0], "source_buffer"));
                let h = tri!(b.hash(ri64!(regs, r[1]) as u64, ri64!(regs, r[2]) as u64));
                wi64!(regs, r[3], h);
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
            // ---- float conversions and bitcasts (arithmetic, math and
            // compares are rows of the `ops_float` table)
            Op::BitcastI32F32 | Op::BitcastF32I32 => wu32!(regs, r[1], slot!(regs, r[0])),
            Op::TruncF64F32 => wf32!(regs, r[1], rf64!(regs, r[0]) as f32),
            Op::ExtF32F64 => wf64!(regs, r[1], rf32!(regs, r[0]) as f64),
            Op::BitcastI64F64 | Op::BitcastF64I64 => {
                wi64!(regs, r[1], ri64!(regs, r[0]))
            }
        }})
    }
}
