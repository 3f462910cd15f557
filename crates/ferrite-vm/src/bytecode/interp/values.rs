//! Values in and out of registers: a call's arguments and results as
//! [`Variant`]s, for the host, other modules and native callees. These
//! accesses name registers from call lists and are bounds-checked.

use super::super::verifier::{segment_size, REF_BIT};
use super::registers::{get_i64, ref_slot, set_i64, take_ref};
use crate::cconv::CconvType;
use crate::refs::Ref;
use crate::value::Variant;
use ferrite_base::{bail, Result};

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
pub(super) fn read_values_into(
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

/// Reads the arguments of a variadic import call: each span is passed as
/// its element count followed by the elements, as upstream's ABI lays them
/// out.
pub(super) fn read_variadic(
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
                let n = segment_size(segments, i, args.len())? as usize;
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
