//! What compiled code sees at run time: the [`Ctx`] block it is handed and
//! the `extern "C"` helpers it calls for everything that is not plain
//! arithmetic on registers (errors, ref registers, buffers, libm).
//!
//! Helpers are the compiled tier's only way to touch the interpreter's
//! data. Each one is a safe Rust body behind a thin `extern "C"` shim that
//! dereferences the context pointer; every index it receives is checked
//! again (a wrong one is an `INTERNAL` error, never an out-of-bounds access),
//! and none may unwind into compiled code (panics are caught and become
//! errors).

use super::super::interp::control;
use super::super::interp::ops_global;
use super::super::interp::ops_int;
use super::super::interp::ops_ref;
use super::super::module::BytecodeState;
use super::super::verifier::{pool_list, MOVE_BIT, REF_BIT, REF_MASK};
use crate::buffer::VmBuffer;
use crate::refs::Ref;
use crate::stack::Stack;
use ferrite_base::{status, Result, Status};
use std::panic::AssertUnwindSafe;

/// Results of one call travel through this many 64-bit slots of [`Ctx`];
/// functions with more primitive results stay interpreted.
pub(crate) const MAX_RESULTS: usize = 16;

/// The block compiled code receives as its first argument. The first fields
/// are read and written by compiled code at fixed offsets (see the `OFF_*`
/// constants); the rest is for helpers only.
#[repr(C)]
pub(crate) struct Ctx {
    /// Frames live now (interpreted ones plus compiled calls in progress).
    pub depth: u64,
    /// The invocation's frame limit.
    pub max_depth: u64,
    /// Compiled calls fail once the native stack pointer is below this.
    pub stack_limit: u64,
    /// The module state's primitive globals, as 32-bit words.
    pub globals: *const u32,
    /// Number of 32-bit global words.
    pub global_words: u64,
    /// A helper's secondary result (loaded values).
    pub scratch: u64,
    /// A returning function's primitive results, bit patterns zero-extended.
    pub ret: [u64; MAX_RESULTS],
    /// The module state the code runs against.
    pub state: *const BytecodeState,
    /// The invocation stack (ref registers live in its arena).
    pub stack: *mut Stack,
    /// The failure, once something failed.
    pub error: Option<Status>,
    /// `(function, instruction)` of each compiled frame a failure unwound,
    /// innermost first.
    pub trace: Vec<(u32, u32)>,
}

pub(crate) const OFF_DEPTH: i32 = 0;
pub(crate) const OFF_MAX_DEPTH: i32 = 8;
pub(crate) const OFF_STACK_LIMIT: i32 = 16;
pub(crate) const OFF_GLOBALS: i32 = 24;
pub(crate) const OFF_GLOBAL_WORDS: i32 = 32;
pub(crate) const OFF_SCRATCH: i32 = 40;
pub(crate) const OFF_RET: i32 = 48;

const _: () = {
    assert!(std::mem::offset_of!(Ctx, depth) == OFF_DEPTH as usize);
    assert!(std::mem::offset_of!(Ctx, max_depth) == OFF_MAX_DEPTH as usize);
    assert!(std::mem::offset_of!(Ctx, stack_limit) == OFF_STACK_LIMIT as usize);
    assert!(std::mem::offset_of!(Ctx, globals) == OFF_GLOBALS as usize);
    assert!(std::mem::offset_of!(Ctx, global_words) == OFF_GLOBAL_WORDS as usize);
    assert!(std::mem::offset_of!(Ctx, scratch) == OFF_SCRATCH as usize);
    assert!(std::mem::offset_of!(Ctx, ret) == OFF_RET as usize);
};

/// Packs a function ordinal and an instruction index into one argument.
pub(crate) fn fnpc(function: u32, pc: u32) -> i64 {
    ((function as u64) << 32 | pc as u64) as i64
}

fn unpack(fnpc: i64) -> (u32, u32) {
    ((fnpc as u64 >> 32) as u32, fnpc as u32)
}

impl Ctx {
    fn state(&self) -> &BytecodeState {
        // SAFETY: `run` sets `state` from a live `&BytecodeState` that
        // outlives the compiled call, and nothing mutates it through this
        // pointer.
        unsafe { &*self.state }
    }

    /// Records a failure at `(function, pc)`.
    fn fail(&mut self, fnpc: i64, e: Status) {
        self.error.get_or_insert(e);
        self.trace.push(unpack(fnpc));
    }

    /// The ref register arena. `run` holds the only other path to the
    /// stack and does not use it while compiled code runs.
    fn refs(&mut self) -> &mut Vec<Option<Ref>> {
        // SAFETY: `stack` comes from the `&mut Stack` that `run` was given;
        // `run` does not touch the stack while compiled code (and so this
        // helper) runs, and compiled code never dereferences it itself, so
        // this is the only live reference. The i32 register pointer compiled
        // entry code read its arguments through is not used after entry.
        unsafe { &mut (*self.stack).ref_regs }
    }

    fn stack(&mut self) -> &mut Stack {
        // SAFETY: as for `refs`.
        unsafe { &mut *self.stack }
    }

    fn ref_slot(&mut self, abs: i64) -> Result<&mut Option<Ref>> {
        let refs = self.refs();
        let n = refs.len();
        usize::try_from(abs)
            .ok()
            .and_then(|i| refs.get_mut(i))
            .ok_or_else(|| status!(Internal, "compiled code named ref slot {abs} of {n}"))
    }

    /// Reads a ref operand, moving it out when the move bit is set.
    fn take_ref(&mut self, base: i64, reg: u16) -> Result<Option<Ref>> {
        let slot = self.ref_slot(base + (reg & REF_MASK) as i64)?;
        Ok(if reg & MOVE_BIT != 0 {
            slot.take()
        } else {
            slot.clone()
        })
    }

    fn insn(&self, fnpc: i64) -> Result<&super::super::verifier::Insn> {
        let (f, pc) = unpack(fnpc);
        self.state()
            .module
            .functions
            .get(f as usize)
            .and_then(|func| func.insns.get(pc as usize))
            .ok_or_else(|| {
                status!(
                    Internal,
                    "compiled code named instruction {pc} of function {f}"
                )
            })
    }
}

/// Runs a helper body, turning an error or a panic into a recorded failure
/// and a nonzero return.
fn guard(ctx: *mut Ctx, fnpc: i64, body: impl FnOnce(&mut Ctx) -> Result<()>) -> i32 {
    // SAFETY: compiled code passes the `Ctx` pointer `run` gave it, which
    // points to a live, exclusively owned `Ctx` for the whole call.
    let ctx = unsafe { &mut *ctx };
    let r = std::panic::catch_unwind(AssertUnwindSafe(|| body(&mut *ctx)))
        .unwrap_or_else(|_| Err(status!(Internal, "compiled-code helper panicked")));
    match r {
        Ok(()) => 0,
        Err(e) => {
            ctx.fail(fnpc, e);
            1
        }
    }
}

/// A failure detected by compiled code itself at instruction `fnpc`
/// (division by zero, `vm.fail`, a global out of range, call depth); `a`
/// is the offending operand where the message names one.
pub(crate) extern "C" fn trap(ctx: *mut Ctx, fnpc: i64, a: i64) {
    guard(ctx, fnpc, |ctx| Err(trap_status(ctx, fnpc, a)));
}

fn trap_status(ctx: &mut Ctx, fnpc: i64, a: i64) -> Status {
    use super::super::isa::Op;
    let insn = match ctx.insn(fnpc) {
        Ok(i) => *i,
        Err(e) => return e,
    };
    let state = ctx.state();
    match insn.op() {
        Op::DivI32S
        | Op::DivI32U
        | Op::RemI32S
        | Op::RemI32U
        | Op::DivI64S
        | Op::DivI64U
        | Op::RemI64S
        | Op::RemI64U => ops_int::div_zero(insn.op()),
        Op::Fail => match control::check_fail(
            a as i32,
            state.module.strings.get(insn.a as usize).map_or("", |s| s),
        ) {
            Err(e) => e,
            Ok(()) => status!(Internal, "vm.fail trapped with status 0"),
        },
        Op::Call if a == 0 => {
            let max = ctx.max_depth;
            status!(
                ResourceExhausted,
                "stack overflow: call depth would exceed the limit of {max} frames"
            )
        }
        Op::Call => status!(
            ResourceExhausted,
            "stack overflow: compiled calls exhausted their native stack budget"
        ),
        Op::EndOfFunction => status!(Internal, "execution fell off the end of the function"),
        op => {
            let width = match op {
                Op::GlobalLoadI64
                | Op::GlobalStoreI64
                | Op::GlobalLoadIndirectI64
                | Op::GlobalStoreIndirectI64
                | Op::GlobalLoadF64
                | Op::GlobalStoreF64
                | Op::GlobalLoadIndirectF64
                | Op::GlobalStoreIndirectF64 => 8,
                _ => 4,
            };
            match ops_global::global_slot(state, a as u32, width) {
                Err(e) => e,
                Ok(_) => status!(Internal, "compiled code trapped at {}", op.mnemonic()),
            }
        }
    }
}

/// A callee failed: records the calling instruction as one more frame.
pub(crate) extern "C" fn unwind(ctx: *mut Ctx, fnpc: i64) {
    // SAFETY: as in `guard`.
    let ctx = unsafe { &mut *ctx };
    ctx.trace.push(unpack(fnpc));
}

/// Opens a ref register window of `n` slots for a compiled callee called at
/// `fnpc`; returns its base, or -1 when the register arena is exhausted
/// (the same `RESOURCE_EXHAUSTED` the interpreter's call raises).
pub(crate) extern "C" fn refs_enter(ctx: *mut Ctx, fnpc: i64, n: i64) -> i64 {
    let mut base = -1i64;
    guard(ctx, fnpc, |ctx| {
        let n = usize::try_from(n).map_err(|_| status!(Internal, "bad ref count"))?;
        let (_, b) = ctx.stack().push_registers(0, n)?;
        base = b as i64;
        Ok(())
    });
    base
}

/// Closes the window opened at `base`, releasing what it still holds.
pub(crate) extern "C" fn refs_leave(ctx: *mut Ctx, base: i64) {
    guard(ctx, -1, |ctx| {
        let stack = ctx.stack();
        let base = usize::try_from(base).map_err(|_| status!(Internal, "bad ref base"))?;
        let top = stack.ref_top.min(stack.ref_regs.len());
        for r in stack.ref_regs.get_mut(base..top).unwrap_or(&mut []) {
            *r = None;
        }
        stack.ref_top = base.min(stack.ref_top);
        Ok(())
    });
}

/// The ref-only instructions (`vm.assign.ref`, `vm.const.ref.zero`,
/// `vm.const.ref.rodata`, `vm.discard.refs`, `vm.trace`/`vm.print` releases,
/// and the ref part of a branch's remap list at pool index `a`), run on the
/// frame's ref window at `base` exactly as the interpreter does.
pub(crate) extern "C" fn ref_op(ctx: *mut Ctx, fnpc: i64, base: i64, a: i64) -> i32 {
    guard(ctx, fnpc, |ctx| {
        use super::super::isa::Op;
        let insn = *ctx.insn(fnpc)?;
        let (f, _) = unpack(fnpc);
        let state = ctx.state;
        // SAFETY: as in `Ctx::state`; a separate borrow so the module's
        // tables can be read while ref slots are written.
        let module = unsafe { &(*state).module };
        let pool = &module.functions[f as usize].pool;
        let r = insn.regs.raw();
        match insn.op() {
            Op::AssignRef => {
                let v = ctx.take_ref(base, r[0])?;
                *ctx.ref_slot(base + (r[1] & REF_MASK) as i64)? = v;
            }
            Op::ConstRefZero => *ctx.ref_slot(base + (r[0] & REF_MASK) as i64)? = None,
            Op::ConstRefRodata => {
                let v = module
                    .rodata
                    .get(insn.a as usize)
                    .cloned()
                    .ok_or_else(|| status!(Internal, "rodata {} out of range", insn.a))?;
                *ctx.ref_slot(base + (r[0] & REF_MASK) as i64)? = Some(v);
            }
            Op::DiscardRefs | Op::Trace | Op::Print => {
                let need = if insn.op() == Op::DiscardRefs {
                    REF_BIT
                } else {
                    REF_BIT | MOVE_BIT
                };
                for &reg in pool_list(pool, insn.pool as usize) {
                    let reg = reg as u16;
                    if reg & need == need {
                        *ctx.ref_slot(base + (reg & REF_MASK) as i64)? = None;
                    }
                }
            }
            _ => {
                // A remap list: `a` is its pool index.
                let at = usize::try_from(a).map_err(|_| status!(Internal, "bad remap"))?;
                let n = pool.get(at).copied().unwrap_or(0) as usize;
                for i in 0..n {
                    let (Some(&src), Some(&dst)) =
                        (pool.get(at + 1 + 2 * i), pool.get(at + 2 + 2 * i))
                    else {
                        break;
                    };
                    let (src, dst) = (src as u16, dst as u16);
                    if src & REF_BIT != 0 {
                        let v = ctx.take_ref(base, src)?;
                        *ctx.ref_slot(base + (dst & REF_MASK) as i64)? = v;
                    }
                }
            }
        }
        Ok(())
    })
}

/// The ref ops with primitive operands: ref globals, lists, `select.ref`,
/// `switch.ref` and `cast.any.ref`, run on the frame's ref window at `base`
/// as the interpreter runs them. `a` is the instruction's primitive input
/// (global ordinal, capacity, index, condition), `b` the value bits a list
/// store writes; a primitive result goes to `scratch`.
pub(crate) extern "C" fn ref_insn(ctx: *mut Ctx, fnpc: i64, base: i64, a: i64, b: i64) -> i32 {
    guard(ctx, fnpc, |ctx| {
        use super::super::isa::Op;
        use crate::list::VmList;
        let insn = *ctx.insn(fnpc)?;
        let (f, _) = unpack(fnpc);
        let state_ptr = ctx.state;
        // SAFETY: as in `Ctx::state`; a separate borrow so the module state
        // can be read while ref slots are written.
        let state = unsafe { &*state_ptr };
        let r = insn.regs.raw();
        let slot = |reg: u16| base + (reg & REF_MASK) as i64;
        let list = |ctx: &mut Ctx, reg: u16| -> Result<Ref> {
            let s = ctx.ref_slot(slot(reg))?;
            ops_ref::deref_list(std::slice::from_ref(s), 0u16)?;
            s.clone()
                .ok_or_else(|| status!(Internal, "list register emptied"))
        };
        let ty = || ops_ref::type_at(state, insn.imm);
        match insn.op() {
            Op::GlobalLoadRef | Op::GlobalLoadIndirectRef => {
                let (ord, dst) = if insn.op() == Op::GlobalLoadRef {
                    (insn.a, r[0])
                } else {
                    (a as u32, r[1])
                };
                let g = ops_global::ref_global(state, ord)?.lock().clone();
                ops_ref::check_cast(&g, ty())?;
                *ctx.ref_slot(slot(dst))? = g;
            }
            Op::GlobalStoreRef | Op::GlobalStoreIndirectRef => {
                let (ord, src) = if insn.op() == Op::GlobalStoreRef {
                    (insn.a, r[0])
                } else {
                    (a as u32, r[1])
                };
                let v = ctx.take_ref(base, src)?;
                ops_ref::check_cast(&v, ty())?;
                *ops_global::ref_global(state, ord)?.lock() = v;
            }
            Op::ListAlloc => {
                let l = VmList::new(ty(), a as u32)?;
                *ctx.ref_slot(slot(r[1]))? = Some(Ref::new(l));
            }
            Op::ListReserve => as_list(&list(ctx, r[0])?)?.reserve(a as u32)?,
            Op::ListResize => as_list(&list(ctx, r[0])?)?.resize(a as u32)?,
            Op::ListSize => ctx.scratch = as_list(&list(ctx, r[0])?)?.size() as u64,
            Op::ListGetI32 => {
                ctx.scratch = as_list(&list(ctx, r[0])?)?.get_i32(a as u32)? as u32 as u64
            }
            Op::ListGetI64 => ctx.scratch = as_list(&list(ctx, r[0])?)?.get_i64(a as u32)? as u64,
            Op::ListGetF32 => {
                ctx.scratch = as_list(&list(ctx, r[0])?)?.get_f32(a as u32)?.to_bits() as u64
            }
            Op::ListGetF64 => {
                ctx.scratch = as_list(&list(ctx, r[0])?)?.get_f64(a as u32)?.to_bits()
            }
            Op::ListSetI32 => as_list(&list(ctx, r[0])?)?.set_i32(a as u32, b as i32)?,
            Op::ListSetI64 => as_list(&list(ctx, r[0])?)?.set_i64(a as u32, b)?,
            Op::ListSetF32 => {
                as_list(&list(ctx, r[0])?)?.set_f32(a as u32, f32::from_bits(b as u32))?
            }
            Op::ListSetF64 => {
                as_list(&list(ctx, r[0])?)?.set_f64(a as u32, f64::from_bits(b as u64))?
            }
            Op::ListGetRef => {
                let v = as_list(&list(ctx, r[0])?)?.get_ref(a as u32)?;
                let t = ty();
                // A value of another type reads as null, as in the
                // interpreter (upstream's retain-or-null).
                *ctx.ref_slot(slot(r[2]))? = v.filter(|x| t.accepts_ref(x));
            }
            Op::ListSetRef => {
                // The value is taken first, as the interpreter does (it may
                // be the list register itself, moved).
                let v = ctx.take_ref(base, r[2])?;
                as_list(&list(ctx, r[0])?)?.set_ref(a as u32, v)?;
            }
            Op::SelectRef => {
                let (t, f) = (r[1], r[2]);
                let chosen = if a as u32 != 0 { t } else { f };
                ops_ref::check_cast(ctx.ref_slot(slot(chosen))?, ty())?;
                let v = ctx.take_ref(base, chosen)?;
                let other = if chosen == t { f } else { t };
                if other & MOVE_BIT != 0 && other & REF_MASK != chosen & REF_MASK {
                    *ctx.ref_slot(slot(other))? = None;
                }
                *ctx.ref_slot(slot(r[3]))? = v;
            }
            Op::SwitchRef => {
                let pool = &state.module.functions[f as usize].pool;
                let vals = pool_list(pool, insn.pool as usize);
                let src = match usize::try_from(a as i32).ok().and_then(|i| vals.get(i)) {
                    Some(&reg) => reg as u16,
                    None => r[1],
                };
                let v = ctx.ref_slot(slot(src))?.clone();
                ops_ref::check_cast(&v, ty())?;
                *ctx.ref_slot(slot(r[2]))? = v;
            }
            Op::CastAnyRef => {
                let v = ctx.take_ref(base, r[0])?;
                ops_ref::check_cast(&v, ty())?;
                *ctx.ref_slot(slot(r[1]))? = v;
            }
            op => ferrite_base::bail!(Internal, "{} is not a ref op", op.mnemonic()),
        }
        Ok(())
    })
}

fn as_list(r: &Ref) -> Result<&crate::list::VmList> {
    r.downcast::<crate::list::VmList>()
        .ok_or_else(|| status!(Internal, "list operand changed type"))
}

/// `vm.cmp.{eq,ne,nz}.ref`: the i32 result goes to `scratch`.
pub(crate) extern "C" fn ref_cmp(ctx: *mut Ctx, fnpc: i64, base: i64) -> i32 {
    guard(ctx, fnpc, |ctx| {
        use super::super::isa::Op;
        let insn = *ctx.insn(fnpc)?;
        let r = insn.regs.raw();
        let slot = |reg: u16| base + (reg & REF_MASK) as i64;
        let v = match insn.op() {
            Op::CmpNZRef => {
                let nz = ctx.ref_slot(slot(r[0]))?.is_some();
                release(ctx, base, &[r[0]])?;
                nz
            }
            op => {
                let a = ctx.ref_slot(slot(r[0]))?.clone();
                let b = ctx.ref_slot(slot(r[1]))?.clone();
                let eq = a == b;
                drop((a, b));
                release(ctx, base, &[r[0], r[1]])?;
                if op == Op::CmpEQRef {
                    eq
                } else {
                    !eq
                }
            }
        };
        ctx.scratch = v as u64;
        Ok(())
    })
}

fn release(ctx: &mut Ctx, base: i64, regs: &[u16]) -> Result<()> {
    for &r in regs {
        if r & MOVE_BIT != 0 {
            *ctx.ref_slot(base + (r & REF_MASK) as i64)? = None;
        }
    }
    Ok(())
}

fn buffer_at<'a>(ctx: &'a mut Ctx, base: i64, reg: u16, what: &str) -> Result<&'a VmBuffer> {
    let slot = ctx.ref_slot(base + (reg & REF_MASK) as i64)?;
    ops_ref::deref_buffer(std::slice::from_ref(slot), 0u16, what)
}

/// `vm.buffer.load.*`: loads at element offset `off` of the buffer in the
/// instruction's first operand; the bits go to `scratch`.
pub(crate) extern "C" fn buffer_load(ctx: *mut Ctx, fnpc: i64, base: i64, off: i64) -> i32 {
    guard(ctx, fnpc, |ctx| {
        use super::super::isa::Op;
        let insn = *ctx.insn(fnpc)?;
        let b = buffer_at(ctx, base, insn.regs.raw()[0], "source_buffer")?;
        let off = off as u64;
        let v: u64 = match insn.op() {
            Op::BufferLoadI8U => b.load_i8u(off)? as u32 as u64,
            Op::BufferLoadI8S => b.load_i8s(off)? as u32 as u64,
            Op::BufferLoadI16U => b.load_i16u(off)? as u32 as u64,
            Op::BufferLoadI16S => b.load_i16s(off)? as u32 as u64,
            Op::BufferLoadI32 => b.load_i32(off)? as u32 as u64,
            Op::BufferLoadI64 => b.load_i64(off)? as u64,
            Op::BufferLoadF32 => b.load_f32(off)?.to_bits() as u64,
            Op::BufferLoadF64 => b.load_f64(off)?.to_bits(),
            op => ferrite_base::bail!(Internal, "{} is not a buffer load", op.mnemonic()),
        };
        ctx.scratch = v;
        Ok(())
    })
}

/// `vm.buffer.store.*`: stores the value bits `v` at element offset `off`.
pub(crate) extern "C" fn buffer_store(
    ctx: *mut Ctx,
    fnpc: i64,
    base: i64,
    off: i64,
    v: i64,
) -> i32 {
    guard(ctx, fnpc, |ctx| {
        use super::super::isa::Op;
        let insn = *ctx.insn(fnpc)?;
        let b = buffer_at(ctx, base, insn.regs.raw()[0], "target_buffer")?;
        let off = off as u64;
        match insn.op() {
            Op::BufferStoreI8 => b.store_i8(off, v as i32),
            Op::BufferStoreI16 => b.store_i16(off, v as i32),
            Op::BufferStoreI32 => b.store_i32(off, v as i32),
            Op::BufferStoreI64 => b.store_i64(off, v),
            Op::BufferStoreF32 => b.store_f32(off, f32::from_bits(v as u32)),
            Op::BufferStoreF64 => b.store_f64(off, f64::from_bits(v as u64)),
            op => ferrite_base::bail!(Internal, "{} is not a buffer store", op.mnemonic()),
        }
    })
}

/// `vm.buffer.length`: the length goes to `scratch`.
pub(crate) extern "C" fn buffer_length(ctx: *mut Ctx, fnpc: i64, base: i64) -> i32 {
    guard(ctx, fnpc, |ctx| {
        let insn = *ctx.insn(fnpc)?;
        let n = buffer_at(ctx, base, insn.regs.raw()[0], "buffer")?.len();
        ctx.scratch = n;
        Ok(())
    })
}

/// `vm.import.resolved`.
pub(crate) extern "C" fn import_resolved(ctx: *mut Ctx, ordinal: i64) -> i32 {
    // SAFETY: as in `guard`.
    let ctx = unsafe { &*ctx };
    ctx.state().import_resolved(ordinal as u32) as i32
}

/// Float operations compiled as calls, each the interpreter's expression.
pub(crate) mod math {
    use super::super::super::cmath;

    macro_rules! unary {
        ($($name:ident: $t:ty => $r:ty = |$x:ident| $e:expr;)*) => {$(
            pub(crate) extern "C" fn $name($x: $t) -> $r { $e }
        )*};
    }
    macro_rules! binary {
        ($($name:ident: $t:ty = |$x:ident, $y:ident| $e:expr;)*) => {$(
            pub(crate) extern "C" fn $name($x: $t, $y: $t) -> $t { $e }
        )*};
    }
    unary! {
        atan_f32: f32 => f32 = |x| x.atan();
        cos_f32: f32 => f32 = |x| x.cos();
        sin_f32: f32 => f32 = |x| x.sin();
        exp_f32: f32 => f32 = |x| x.exp();
        exp2_f32: f32 => f32 = |x| x.exp2();
        expm1_f32: f32 => f32 = |x| x.exp_m1();
        log_f32: f32 => f32 = |x| x.ln();
        log10_f32: f32 => f32 = |x| x.log10();
        log1p_f32: f32 => f32 = |x| x.ln_1p();
        log2_f32: f32 => f32 = |x| x.log2();
        tanh_f32: f32 => f32 = |x| x.tanh();
        erf_f32: f32 => f32 = |x| cmath::erff(x);
        round_f32: f32 => f32 = |x| x.round();
        round_even_f32: f32 => f32 = |x| x.round_ties_even();
        atan_f64: f64 => f64 = |x| x.atan();
        cos_f64: f64 => f64 = |x| x.cos();
        sin_f64: f64 => f64 = |x| x.sin();
        exp_f64: f64 => f64 = |x| x.exp();
        exp2_f64: f64 => f64 = |x| x.exp2();
        expm1_f64: f64 => f64 = |x| x.exp_m1();
        log_f64: f64 => f64 = |x| x.ln();
        log10_f64: f64 => f64 = |x| x.log10();
        log1p_f64: f64 => f64 = |x| x.ln_1p();
        log2_f64: f64 => f64 = |x| x.log2();
        tanh_f64: f64 => f64 = |x| x.tanh();
        erf_f64: f64 => f64 = |x| cmath::erf(x);
        round_f64: f64 => f64 = |x| x.round();
        round_even_f64: f64 => f64 = |x| x.round_ties_even();
        f32_si32: f32 => i32 = |x| x.round() as i64 as i32;
        f32_ui32: f32 => i32 = |x| x.round() as i64 as u32 as i32;
        f32_si64: f32 => i64 = |x| x.round() as i64;
        f32_ui64: f32 => i64 = |x| x.round() as u64 as i64;
        f64_si32: f64 => i32 = |x| (x as f32).round() as i64 as i32;
        f64_ui32: f64 => i32 = |x| (x as f32).round() as i64 as u32 as i32;
        f64_si64: f64 => i64 = |x| x.round() as i64;
        f64_ui64: f64 => i64 = |x| x.round() as i64;
        ui64_f32: i64 => f32 = |x| x as u64 as f32;
        ui64_f64: i64 => f64 = |x| x as u64 as f64;
    }
    binary! {
        atan2_f32: f32 = |x, y| x.atan2(y);
        pow_f32: f32 = |x, y| x.powf(y);
        rem_f32: f32 = |x, y| libm::remainderf(x, y);
        atan2_f64: f64 = |x, y| x.atan2(y);
        pow_f64: f64 = |x, y| x.powf(y);
        rem_f64: f64 = |x, y| libm::remainder(x, y);
    }
}
