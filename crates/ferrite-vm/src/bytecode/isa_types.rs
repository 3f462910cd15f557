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

/// The register banks as types: the `B` of a bank-typed register operand
/// [`Reg<B>`](super::verifier::Reg). A register's width is a property of
/// its bank, so the interpreter's 32-bit accessors take only [`Narrow`]
/// banks and its 64-bit ones only [`Wide`] banks.
pub mod bank {
    use super::Bank;

    mod sealed {
        /// Keeps the bank traits to the five banks below: a bank's width
        /// is what the verifier checked a register against, and the
        /// interpreter's unchecked accessors rely on it.
        pub trait Sealed {}
    }

    /// A register bank as a type.
    pub trait RegBank: sealed::Sealed + Copy + Eq + std::hash::Hash + std::fmt::Debug {
        /// The bank the verifier checks a register of this type against.
        const BANK: Bank;
    }
    /// A primitive bank of one 32-bit slot ([`I32`], [`F32`]).
    pub trait Narrow: RegBank {}
    /// A primitive bank of two consecutive 32-bit slots ([`I64`], [`F64`]).
    pub trait Wide: RegBank {}

    macro_rules! banks {
        ($($(#[$doc:meta])* $name:ident: $bank:ident $(, $width:ident)?;)*) => {$(
            $(#[$doc])*
            #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
            pub enum $name {}
            impl sealed::Sealed for $name {}
            impl RegBank for $name {
                const BANK: Bank = Bank::$bank;
            }
            $(impl $width for $name {})?
        )*};
    }
    banks! {
        /// The i32 bank: one slot.
        I32: I32, Narrow;
        /// The f32 bank: one slot of f32 bits.
        F32: F32, Narrow;
        /// The i64 bank: an even slot and the one after it.
        I64: I64, Wide;
        /// The f64 bank: an even slot and the one after it, f64 bits.
        F64: F64, Wide;
        /// The ref bank (operands keep their type and move bits).
        Ref: Ref;
    }
}

/// Where [`OpRegs::decode`](super::isa::OpRegs::decode) takes an
/// instruction's register operands from: the verifier, which hands out a
/// [`Reg<B>`](super::verifier::Reg) only for a register it checked
/// against bank `B`.
pub trait RegSource {
    /// The next register operand, checked for bank `B`.
    fn reg<B: bank::RegBank>(&mut self) -> ferrite_base::Result<super::verifier::Reg<B>>;
}
