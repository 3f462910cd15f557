//! The compiling tier's allow-list: the ops it translates. A function
//! compiles only when every instruction in it is on the list (and the
//! function-level conditions of [`super`] hold); anything else keeps the
//! function in the interpreter.
//!
//! Both lists are written out op by op and [`compiles`] matches them with
//! no wildcard, so an op added to the generated [`Op`] enum is a compile
//! error here (and in the translator's `match`, which has no wildcard
//! either) until someone decides which tier runs it: the tier never picks up
//! a new op by default, and never silently drops one it claims.
//!
//! `tests/jit_allow_list.rs` checks that every op on the list is translated
//! in some fixture function, and that functions using an op off the list
//! stay interpreted.

use super::super::isa::Op;

/// The ops the tier translates, inline or through a [`super::runtime`]
/// helper (an or-pattern, usable in `match` arms).
#[rustfmt::skip]
macro_rules! compiled_ops {
    () => {
        // Decoder-internal forms: fused compare-and-branch, direct branches, the end sentinel.
        Op::FusedCmpEQI32CondBranch | Op::FusedCmpNEI32CondBranch | Op::FusedCmpLTI32SCondBranch
        | Op::FusedCmpLTI32UCondBranch | Op::FusedCmpNZI32CondBranch | Op::FusedCmpEQI64CondBranch
        | Op::FusedCmpNEI64CondBranch | Op::FusedCmpLTI64SCondBranch
        | Op::FusedCmpLTI64UCondBranch | Op::FusedCmpNZI64CondBranch | Op::DirectCondBranch
        | Op::DirectBranch | Op::PrimitiveRemapBranch | Op::EndOfFunction
        // Control flow, internal calls (import calls are refused per function), debug output.
        | Op::Branch | Op::CondBranch | Op::Call | Op::Return | Op::Fail | Op::ImportResolved
        | Op::Trace | Op::Print | Op::CondBreak | Op::Break | Op::Block | Op::BranchTable
        // Globals, primitive inline and ref through helpers.
        | Op::GlobalLoadI32 | Op::GlobalStoreI32 | Op::GlobalLoadIndirectI32
        | Op::GlobalStoreIndirectI32 | Op::GlobalLoadI64 | Op::GlobalStoreI64
        | Op::GlobalLoadIndirectI64 | Op::GlobalStoreIndirectI64 | Op::GlobalLoadRef
        | Op::GlobalStoreRef | Op::GlobalLoadIndirectRef | Op::GlobalStoreIndirectRef
        | Op::GlobalLoadF32 | Op::GlobalStoreF32 | Op::GlobalLoadIndirectF32
        | Op::GlobalStoreIndirectF32 | Op::GlobalLoadF64 | Op::GlobalStoreF64
        | Op::GlobalLoadIndirectF64 | Op::GlobalStoreIndirectF64
        // Constants.
        | Op::ConstI32Zero | Op::ConstI32 | Op::ConstI64Zero | Op::ConstI64 | Op::ConstRefZero
        | Op::ConstRefRodata | Op::ConstF32Zero | Op::ConstF32 | Op::ConstF64Zero | Op::ConstF64
        // Lists (helpers).
        | Op::ListAlloc | Op::ListReserve | Op::ListSize | Op::ListResize | Op::ListGetI32
        | Op::ListSetI32 | Op::ListGetI64 | Op::ListSetI64 | Op::ListGetRef | Op::ListSetRef
        | Op::ListGetF32 | Op::ListSetF32 | Op::ListGetF64 | Op::ListSetF64
        // Select and switch.
        | Op::SelectI32 | Op::SelectI64 | Op::SelectRef | Op::SwitchI32 | Op::SwitchI64
        | Op::SwitchRef | Op::SelectF32 | Op::SwitchF32 | Op::SelectF64 | Op::SwitchF64
        // Buffer loads, stores and length (helpers).
        | Op::BufferLoadI8U | Op::BufferLoadI8S | Op::BufferLoadI16U | Op::BufferLoadI16S
        | Op::BufferLoadI32 | Op::BufferLoadI64 | Op::BufferStoreI8 | Op::BufferStoreI16
        | Op::BufferStoreI32 | Op::BufferStoreI64 | Op::BufferLength | Op::BufferLoadF32
        | Op::BufferStoreF32 | Op::BufferLoadF64 | Op::BufferStoreF64
        // Ref bookkeeping and compares.
        | Op::CmpEQRef | Op::CmpNERef | Op::CmpNZRef | Op::CastAnyRef | Op::DiscardRefs
        | Op::AssignRef
        // Compares.
        | Op::CmpEQI32 | Op::CmpNEI32 | Op::CmpLTI32S | Op::CmpLTI32U | Op::CmpNZI32
        | Op::CmpEQI64 | Op::CmpNEI64 | Op::CmpLTI64S | Op::CmpLTI64U | Op::CmpNZI64
        | Op::CmpEQF32O | Op::CmpEQF32U | Op::CmpNEF32O | Op::CmpNEF32U | Op::CmpLTF32O
        | Op::CmpLTF32U | Op::CmpLTEF32O | Op::CmpLTEF32U | Op::CmpNaNF32 | Op::CmpEQF64O
        | Op::CmpEQF64U | Op::CmpNEF64O | Op::CmpNEF64U | Op::CmpLTF64O | Op::CmpLTF64U
        | Op::CmpLTEF64O | Op::CmpLTEF64U | Op::CmpNaNF64
        // Conversions and bitcasts.
        | Op::TruncI32I8 | Op::TruncI32I16 | Op::TruncI64I32 | Op::ExtI8I32S | Op::ExtI8I32U
        | Op::ExtI16I32S | Op::ExtI16I32U | Op::ExtI32I64S | Op::ExtI32I64U | Op::CastSI32F32
        | Op::CastUI32F32 | Op::CastF32SI32 | Op::CastF32UI32 | Op::BitcastI32F32
        | Op::BitcastF32I32 | Op::CastF32SI64 | Op::CastF32UI64 | Op::CastSI64F32
        | Op::CastUI64F32 | Op::TruncF64F32 | Op::ExtF32F64 | Op::CastSI32F64 | Op::CastUI32F64
        | Op::CastF64SI32 | Op::CastF64UI32 | Op::CastSI64F64 | Op::CastUI64F64 | Op::CastF64SI64
        | Op::CastF64UI64 | Op::BitcastI64F64 | Op::BitcastF64I64
        // Integer arithmetic, bit ops and shifts.
        | Op::AddI32 | Op::SubI32 | Op::MulI32 | Op::DivI32S | Op::DivI32U | Op::RemI32S
        | Op::RemI32U | Op::FMAI32 | Op::AddI64 | Op::SubI64 | Op::MulI64 | Op::DivI64S
        | Op::DivI64U | Op::RemI64S | Op::RemI64U | Op::FMAI64 | Op::NotI32 | Op::AndI32
        | Op::OrI32 | Op::XorI32 | Op::NotI64 | Op::AndI64 | Op::OrI64 | Op::XorI64 | Op::ShlI32
        | Op::ShrI32S | Op::ShrI32U | Op::ShlI64 | Op::ShrI64S | Op::ShrI64U | Op::CtlzI32
        | Op::CtlzI64 | Op::AbsI32 | Op::AbsI64 | Op::MinI32S | Op::MinI32U | Op::MaxI32S
        | Op::MaxI32U | Op::MinI64S | Op::MinI64U | Op::MaxI64S | Op::MaxI64U
        // Float arithmetic and math (libm through helpers).
        | Op::AddF32 | Op::SubF32 | Op::MulF32 | Op::DivF32 | Op::RemF32 | Op::FMAF32 | Op::AbsF32
        | Op::NegF32 | Op::CeilF32 | Op::FloorF32 | Op::AtanF32 | Op::Atan2F32 | Op::CosF32
        | Op::SinF32 | Op::ExpF32 | Op::Exp2F32 | Op::ExpM1F32 | Op::LogF32 | Op::Log10F32
        | Op::Log1pF32 | Op::Log2F32 | Op::PowF32 | Op::RsqrtF32 | Op::SqrtF32 | Op::TanhF32
        | Op::ErfF32 | Op::RoundF32 | Op::MinF32 | Op::MaxF32 | Op::RoundF32Even | Op::AddF64
        | Op::SubF64 | Op::MulF64 | Op::DivF64 | Op::RemF64 | Op::FMAF64 | Op::AbsF64 | Op::NegF64
        | Op::CeilF64 | Op::FloorF64 | Op::AtanF64 | Op::Atan2F64 | Op::CosF64 | Op::SinF64
        | Op::ExpF64 | Op::Exp2F64 | Op::ExpM1F64 | Op::LogF64 | Op::Log10F64 | Op::Log1pF64
        | Op::Log2F64 | Op::PowF64 | Op::RsqrtF64 | Op::SqrtF64 | Op::TanhF64 | Op::ErfF64
        | Op::RoundF64 | Op::MinF64 | Op::MaxF64 | Op::RoundF64Even
    };
}

/// The ops that keep a function in the interpreter: calls that may yield or
/// take variadic segments, `vm.yield`, and the buffer ops that allocate or
/// work on whole ranges (alloc/clone/copy/compare/fill/hash).
#[rustfmt::skip]
macro_rules! interpreted_ops {
    () => {
        Op::CallVariadic | Op::CallYieldable | Op::CallVariadicYieldable | Op::Yield
        | Op::BufferAlloc | Op::BufferClone | Op::BufferCopy | Op::BufferCompare
        | Op::BufferFillI8 | Op::BufferFillI16 | Op::BufferFillI32 | Op::BufferFillI64
        | Op::BufferFillF32 | Op::BufferFillF64 | Op::BufferHash
    };
}

pub(crate) use interpreted_ops;

/// Whether the compiling tier translates `op` (it is on the allow-list).
pub const fn compiles(op: Op) -> bool {
    match op {
        compiled_ops!() => true,
        interpreted_ops!() => false,
    }
}
