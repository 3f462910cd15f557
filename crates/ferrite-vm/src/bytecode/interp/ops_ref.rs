//! Ref operands: the null and type checks the verifier cannot make (a ref
//! register's content is known only at run time).

use super::super::module::BytecodeState;
use super::registers::{ref_slot, RawReg};
use crate::buffer::VmBuffer;
use crate::list::VmList;
use crate::refs::Ref;
use crate::types::TypeDef;
use ferrite_base::{bail, status, Result};

pub(crate) fn deref_buffer<'a>(
    refs: &'a [Option<Ref>],
    reg: impl RawReg,
    what: &str,
) -> Result<&'a VmBuffer> {
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

pub(crate) fn deref_list(refs: &[Option<Ref>], reg: impl RawReg) -> Result<&VmList> {
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

pub(crate) fn type_at(state: &BytecodeState, imm: u64) -> TypeDef {
    state.module.types[imm as usize]
}

pub(crate) fn check_cast(r: &Option<Ref>, ty: TypeDef) -> Result<()> {
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
