//! A frame's registers as the interpreter sees them.
//!
//! [`Registers`] is the i32 bank of one frame, exactly as long as its
//! function's verified register count. Its unchecked accessors take only
//! bank-typed [`Reg`]s, which only the verifier makes: the 32-bit ones a
//! register of a [`Narrow`] bank, the 64-bit ones one of a [`Wide`] bank.
//! [`Slot`] reads and writes each primitive type through the register type
//! of its bank. Ref registers are indexed with bounds checks
//! ([`ref_slot`]).

use super::super::isa_types::bank::{self, Narrow, RegBank, Wide, F32, F64, I32, I64};
use super::super::verifier::{DecodedFunction, Reg, MOVE_BIT, REF_BIT, REF_MASK};
use crate::refs::Ref;

/// The i32-bank registers of one frame of `func` (see [`Registers::of`]).
///
/// The width of an access is fixed by the register's type: a 64-bit read
/// takes a register of a 64-bit bank, so reading an i32 operand as 64-bit
/// (which could step one slot past the window) does not compile:
///
/// ```no_run
/// use ferrite_vm::bytecode::isa::OpRegs;
/// use ferrite_vm::bytecode::Registers;
///
/// fn first_operand(regs: &Registers<'_>, op: OpRegs) -> Option<i64> {
///     match op {
///         // SAFETY: not run (this shows what compiles); an operand of
///         // an instruction of the function `regs` was made for.
///         OpRegs::AddI64(a, _, _) => Some(unsafe { regs.get_i64(a) }),
///         _ => None,
///     }
/// }
/// ```
///
/// ```compile_fail,E0277
/// use ferrite_vm::bytecode::isa::OpRegs;
/// use ferrite_vm::bytecode::Registers;
///
/// fn first_operand(regs: &Registers<'_>, op: OpRegs) -> Option<i64> {
///     match op {
///         // SAFETY: not run (this must not compile): `a` is an i32
///         // operand, and `get_i64` takes only 64-bit banks.
///         OpRegs::AddI32(a, _, _) => Some(unsafe { regs.get_i64(a) }),
///         _ => None,
///     }
/// }
/// ```
pub struct Registers<'a> {
    slots: &'a mut [u32],
}

impl<'a> Registers<'a> {
    /// The `func.i32_count` slots of `slots` from `base` on: the window
    /// the verifier checked `func`'s register operands against. None when
    /// `slots` is shorter (an internal error: frames are sized by the same
    /// count).
    #[inline(always)]
    pub(crate) fn of(func: &DecodedFunction, slots: &'a mut [u32], base: usize) -> Option<Self> {
        let slots = slots.get_mut(base..base + func.i32_count as usize)?;
        Some(Registers { slots })
    }

    /// The slots, for bounds-checked access (call operands, results).
    #[inline(always)]
    pub(crate) fn slots(&mut self) -> &mut [u32] {
        self.slots
    }

    /// Reads 32-bit register `r` (of the i32 or f32 bank, as bits).
    ///
    /// # Safety
    /// `r` is an operand of the instructions (or register lists) of the
    /// function this window was made for. Its type says the verifier
    /// checked it for a 32-bit bank, so `r < i32_count`, which is this
    /// window's length.
    #[inline(always)]
    pub unsafe fn get<B: Narrow>(&self, r: Reg<B>) -> u32 {
        let i = r.raw() as usize;
        debug_assert!(r.raw() & REF_BIT == 0 && i < self.slots.len());
        // SAFETY: `i < self.slots.len()` by the caller's contract above.
        unsafe { *self.slots.get_unchecked(i) }
    }

    /// Writes 32-bit register `r`.
    ///
    /// # Safety
    /// As for [`Registers::get`].
    #[inline(always)]
    pub unsafe fn set<B: Narrow>(&mut self, r: Reg<B>, v: u32) {
        let i = r.raw() as usize;
        debug_assert!(r.raw() & REF_BIT == 0 && i < self.slots.len());
        // SAFETY: `i < self.slots.len()` by the caller's contract.
        unsafe { *self.slots.get_unchecked_mut(i) = v }
    }

    /// Reads the 64-bit register at `r` (slots `r` and `r + 1`, low half
    /// first on every host).
    ///
    /// # Safety
    /// As for [`Registers::get`]; the type says the verifier checked `r`
    /// for a 64-bit bank, so `r + 1 < i32_count`.
    #[inline(always)]
    pub unsafe fn get_i64<B: Wide>(&self, r: Reg<B>) -> i64 {
        let i = r.raw() as usize;
        debug_assert!(r.raw() & REF_BIT == 0 && i + 1 < self.slots.len());
        // SAFETY: slots `i` and `i + 1` are in the window by the caller's
        // contract; the read is unaligned, which `read_unaligned` allows.
        let v = unsafe { self.slots.as_ptr().add(i).cast::<u64>().read_unaligned() };
        if cfg!(target_endian = "little") {
            v as i64
        } else {
            v.rotate_left(32) as i64
        }
    }

    /// Writes the 64-bit register at `r`.
    ///
    /// # Safety
    /// As for [`Registers::get_i64`].
    #[inline(always)]
    pub unsafe fn set_i64<B: Wide>(&mut self, r: Reg<B>, v: i64) {
        let i = r.raw() as usize;
        debug_assert!(r.raw() & REF_BIT == 0 && i + 1 < self.slots.len());
        let v = if cfg!(target_endian = "little") {
            v as u64
        } else {
            (v as u64).rotate_left(32)
        };
        // SAFETY: as in `get_i64`: both slots are in the window.
        unsafe {
            self.slots
                .as_mut_ptr()
                .add(i)
                .cast::<u64>()
                .write_unaligned(v)
        }
    }
}

/// A primitive value type held in registers of one bank: one slot for
/// 32-bit types, two for 64-bit ones. Lets one op table serve both widths,
/// and ties each type to its bank: an `f64` is read only from a
/// `Reg<F64>`, an `i32` only from a `Reg<I32>`.
pub(crate) trait Slot: Copy {
    /// The bank registers of this type live in.
    type Bank: RegBank;
    /// Reads register `r` as this type.
    ///
    /// # Safety
    /// As for [`Registers::get`] (32-bit types) or [`Registers::get_i64`]
    /// (64-bit types).
    unsafe fn read(regs: &Registers<'_>, r: Reg<Self::Bank>) -> Self;
    /// Writes `v` to register `r`.
    ///
    /// # Safety
    /// As for [`Slot::read`].
    unsafe fn write(regs: &mut Registers<'_>, r: Reg<Self::Bank>, v: Self);
}

macro_rules! slot_impl {
    ($t:ty, $bank:ty, $get:ident, $set:ident, |$x:ident| $from:expr, |$y:ident| $to:expr) => {
        impl Slot for $t {
            type Bank = $bank;
            #[inline(always)]
            unsafe fn read(regs: &Registers<'_>, r: Reg<$bank>) -> Self {
                // SAFETY: forwarded from this function's contract.
                let $x = unsafe { regs.$get(r) };
                $from
            }
            #[inline(always)]
            unsafe fn write(regs: &mut Registers<'_>, r: Reg<$bank>, $y: Self) {
                // SAFETY: forwarded from this function's contract.
                unsafe { regs.$set(r, $to) }
            }
        }
    };
}
slot_impl!(u32, I32, get, set, |x| x, |v| v);
slot_impl!(i32, I32, get, set, |x| x as i32, |v| v as u32);
slot_impl!(f32, F32, get, set, |x| f32::from_bits(x), |v| v.to_bits());
slot_impl!(i64, I64, get_i64, set_i64, |x| x, |v| v);
slot_impl!(u64, I64, get_i64, set_i64, |x| x as u64, |v| v as i64);
slot_impl!(
    f64,
    F64,
    get_i64,
    set_i64,
    |x| f64::from_bits(x as u64),
    |v| v.to_bits() as i64
);

/// Reads slots `r`, `r + 1` as an i64, bounds-checked (for registers named
/// by call lists, which are checked per call rather than trusted).
#[inline(always)]
pub(crate) fn get_i64(regs: &[u32], r: u16) -> i64 {
    let r = r as usize;
    (regs[r] as u64 | ((regs[r + 1] as u64) << 32)) as i64
}

/// The bounds-checked counterpart of [`get_i64`].
#[inline(always)]
pub(crate) fn set_i64(regs: &mut [u32], r: u16, v: i64) {
    let r = r as usize;
    regs[r] = v as u32;
    regs[r + 1] = ((v as u64) >> 32) as u32;
}

/// A ref register operand as encoded: a verified `Reg<Ref>` from an
/// instruction, or a raw `u16` from a call or remap list. Ref accesses take
/// either, as they are bounds-checked; a primitive register is neither.
pub(crate) trait RawReg: Copy {
    /// The encoded operand (ref registers with their type and move bits).
    fn raw(self) -> u16;
}

impl RawReg for u16 {
    #[inline(always)]
    fn raw(self) -> u16 {
        self
    }
}

impl RawReg for Reg<bank::Ref> {
    #[inline(always)]
    fn raw(self) -> u16 {
        Reg::raw(self)
    }
}

/// The ordinal of a ref register operand (its type and move bits cleared).
#[inline(always)]
pub(crate) fn ref_slot(reg: impl RawReg) -> usize {
    (reg.raw() & REF_MASK) as usize
}

/// Reads a ref operand, moving it out when the move bit is set.
#[inline(always)]
pub(crate) fn take_ref(refs: &mut [Option<Ref>], reg: impl RawReg) -> Option<Ref> {
    let reg = reg.raw();
    let slot = &mut refs[ref_slot(reg)];
    if reg & MOVE_BIT != 0 {
        slot.take()
    } else {
        slot.clone()
    }
}

/// Clears the ref operands among `regs` that carry the move bit.
pub(crate) fn release_moved(refs: &mut [Option<Ref>], regs: &[Reg<bank::Ref>]) {
    for r in regs {
        let r = r.raw();
        if r & MOVE_BIT != 0 {
            refs[ref_slot(r)] = None;
        }
    }
}
