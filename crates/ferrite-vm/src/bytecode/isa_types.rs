//! Vocabulary of the generated ISA tables ([`super::isa`]).

/// The opcode set an op belongs to; extension sets follow a prefix byte.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OpSet {
    /// The core set (no prefix).
    Core,
    /// The f32 extension (prefix 0xE0, needs the EXT_F32 feature).
    ExtF32,
    /// The f64 extension (prefix 0xE1, needs the EXT_F64 feature).
    ExtF64,
}

/// Core opcode that introduces the ext_f32 set.
pub const PREFIX_EXT_F32: u8 = 0xE0;
/// Core opcode that introduces the ext_f64 set.
pub const PREFIX_EXT_F64: u8 = 0xE1;
/// Core opcode of the block marker that starts every basic block.
pub const BLOCK_MARKER: u8 = 0x79;

/// The register bank a register operand lives in.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Bank {
    /// One 32-bit integer slot.
    I32,
    /// Two consecutive 32-bit slots holding an i64.
    I64,
    /// One 32-bit slot holding f32 bits.
    F32,
    /// Two consecutive 32-bit slots holding f64 bits.
    F64,
    /// A ref register (ordinal has the type bit set).
    Ref,
    /// Either bank, decided per register by its type bit.
    Any,
}

/// One operand field of an instruction encoding, in encoding order.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Field {
    /// A register ordinal (u16).
    Reg {
        /// Bank of the register.
        bank: Bank,
        /// Whether the instruction writes it.
        write: bool,
        /// Whether the ref move bit may be set.
        allow_move: bool,
    },
    /// An immediate constant of the bank's width.
    Attr(Bank),
    /// A global byte offset (i32/i64/f32/f64) or ref-global ordinal (u32).
    GlobalAttr,
    /// A function ordinal (u32; high bit marks imports).
    FuncAttr,
    /// A rodata segment ordinal (u32).
    RodataAttr,
    /// A type-table ordinal (u32).
    TypeOf,
    /// A length-prefixed (u16) UTF-8 string.
    StringAttr,
    /// A block's bytecode offset (u32).
    BranchTarget,
    /// A remap list: u16 count then (src, dst) register pairs, 2-aligned.
    BranchOperands,
    /// A register list: u16 count then registers, 2-aligned.
    Operands(Bank),
    /// A result register list, encoded as [`Field::Operands`].
    Results(Bank),
    /// A u16 immediate.
    ConstI16,
    /// `table_size` (previous field) cases of target + remap list.
    BranchTableCases,
}
