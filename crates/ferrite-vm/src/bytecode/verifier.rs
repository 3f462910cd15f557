//! Verification and decoding of function bytecode.
//!
//! Every function is decoded once, at load, into [`Insn`]s. Decoding *is*
//! verification: each operand is range-checked against the function's
//! register counts and the module's tables, every branch must land on a block
//! marker inside the function, extension opcodes need the module's feature
//! bits, and calls must match the callee's calling convention. The
//! interpreter relies on those facts; nothing in a `.vmfb` can make it panic.

use super::archive::FunctionDescriptor;
use super::isa::{Op, OpRegs, CORE_TABLE, EXT_F32_TABLE, EXT_F64_TABLE};
use super::isa_types::bank::{RegBank, F32, F64, I32, I64};
use super::isa_types::{Bank, Field, RegSource, BLOCK_MARKER, PREFIX_EXT_F32, PREFIX_EXT_F64};
use crate::cconv::{Cconv, CconvType};
use ferrite_base::{bail, status, Result};
use std::marker::PhantomData;

/// Feature bit: the ext_f32 opcode set.
pub const FEATURE_EXT_F32: u32 = 1 << 0;
/// Feature bit: the ext_f64 opcode set.
pub const FEATURE_EXT_F64: u32 = 1 << 1;

/// High bit of a function ordinal marking an import.
pub const IMPORT_BIT: u32 = 0x8000_0000;
/// Ref register type bit.
pub const REF_BIT: u16 = 0x8000;
/// Ref register move bit.
pub const MOVE_BIT: u16 = 0x4000;
/// Mask of a ref register's ordinal.
pub const REF_MASK: u16 = 0x3FFF;

/// A register operand of bank `B` that the verifier checked against its
/// function.
///
/// Only this module makes one (the field is private and so is the
/// constructor), and only once its register check (`FnCtx::check_reg`)
/// accepted it for `B`'s bank, which is the bank the instruction's ISA
/// field declares: the operand types of [`OpRegs`] come from the same ISA
/// description. So a `Reg<B>` carries these facts, which the interpreter's
/// unchecked register accesses rely on (see `interp`'s module docs):
///
/// - of a [`Narrow`] bank (i32, f32): no [`REF_BIT`], and below the
///   function's [`DecodedFunction::i32_count`];
/// - of a [`Wide`] bank (i64, f64): no [`REF_BIT`], even, and its two slots
///   below `i32_count` (`raw + 1 < i32_count`);
/// - of the [`Ref`] bank: [`REF_BIT`] set and the ordinal ([`REF_MASK`])
///   below [`DecodedFunction::ref_count`].
///
/// The raw encoding (with the ref and move bits) is kept, so the value is
/// also what the bytecode says.
///
/// [`Narrow`]: super::isa_types::bank::Narrow
/// [`Wide`]: super::isa_types::bank::Wide
/// [`Ref`]: super::isa_types::bank::Ref
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(transparent)]
pub struct Reg<B: RegBank>(u16, PhantomData<B>);

impl<B: RegBank> Reg<B> {
    /// Marks `raw` as checked for bank `B`. Private: call only once
    /// `check_reg` (of the function the register belongs to) accepted
    /// `raw` for `B::BANK`.
    #[inline(always)]
    fn verified(raw: u16) -> Reg<B> {
        Reg(raw, PhantomData)
    }

    /// The operand as encoded in the bytecode (ref registers with their
    /// type and move bits).
    #[inline(always)]
    pub fn raw(self) -> u16 {
        self.0
    }
}

/// The verified register lists of a function's instructions, one per bank
/// their registers were checked for (see [`DecodedFunction::reg_list`]).
#[derive(Debug, Clone, Default)]
pub struct RegLists {
    i32: Vec<Reg<I32>>,
    i64: Vec<Reg<I64>>,
    f32: Vec<Reg<F32>>,
    f64: Vec<Reg<F64>>,
}

/// A primitive bank that has a list in [`RegLists`].
pub trait ListBank: RegBank {
    /// This bank's list.
    fn list(lists: &RegLists) -> &[Reg<Self>];
    /// This bank's list, to append to.
    fn list_mut(lists: &mut RegLists) -> &mut Vec<Reg<Self>>;
}

macro_rules! list_bank {
    ($($b:ident: $field:ident;)*) => {$(
        impl ListBank for $b {
            #[inline(always)]
            fn list(lists: &RegLists) -> &[Reg<$b>] {
                &lists.$field
            }
            fn list_mut(lists: &mut RegLists) -> &mut Vec<Reg<$b>> {
                &mut lists.$field
            }
        }
    )*};
}
list_bank! {
    I32: i32;
    I64: i64;
    F32: f32;
    F64: f64;
}

/// One decoded instruction.
///
/// The op and its register operands are one value, [`OpRegs`]: a variant
/// per op whose fields are the op's registers, each a [`Reg`] of the bank
/// the ISA gives it (stored as encoded: primitive ordinals as is, ref
/// ordinals with their type and move bits). Variable-length operands
/// (register lists, branch targets, remap lists) live in the function's
/// pool at `pool`.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Insn {
    /// The operation with its register operands, typed by bank.
    pub regs: OpRegs,
    /// Index of this instruction's variable-length operands in the pool.
    pub pool: u32,
    /// Global offset/ordinal, function ordinal, rodata ordinal or string index.
    pub a: u32,
    /// Immediate constant bits, or a type-table ordinal.
    pub imm: u64,
}

impl Insn {
    /// The operation.
    #[inline(always)]
    pub fn op(&self) -> Op {
        self.regs.op()
    }
}

/// A verified, decoded function.
#[derive(Debug, Clone)]
pub struct DecodedFunction {
    /// Instructions in bytecode order (block markers included).
    pub insns: Vec<Insn>,
    /// Bytecode offset (within the function) of each instruction.
    pub offsets: Vec<u32>,
    /// Pool of variable-length operands.
    pub pool: Vec<u32>,
    /// i32-bank register slot count.
    pub i32_count: u32,
    /// Ref register count.
    pub ref_count: u32,
    /// The function's calling convention.
    pub cconv: Cconv,
    /// Register lists the interpreter reads without bounds checks, as
    /// verified registers: the value registers of `switch` ops and the
    /// (source, destination) pairs of primitive-only branch remaps. An
    /// instruction that has one holds `start << 32 | len` in `Insn::imm`
    /// (see [`DecodedFunction::reg_list`]). Boxed: one list per bank
    /// inline would be eight more loop-invariant values the dispatch loop
    /// keeps at hand, and the pressure cost an instruction per dispatch.
    pub reg_lists: Box<RegLists>,
    /// Operand lists of import calls whose callee signature the module
    /// declares, listed once here so that native callees can read them in
    /// place without building them per call (see `Insn::imm` of such calls).
    pub(crate) operands: Vec<crate::stack::Operand>,
}

impl DecodedFunction {
    /// The verified register list an instruction's `imm` names (see
    /// [`DecodedFunction::reg_lists`]).
    /// Each list holds only registers checked for its bank `B`, so whichever
    /// `B` is asked for, the registers returned are sound to read as `B`.
    #[inline(always)]
    pub fn reg_list<B: ListBank>(&self, imm: u64) -> &[Reg<B>] {
        let (start, len) = ((imm >> 32) as usize, (imm & 0xFFFF_FFFF) as usize);
        B::list(&self.reg_lists)
            .get(start..start + len)
            .unwrap_or(&[])
    }
}

/// Records `regs` (checked here for bank `B`) as a register list of `fx`'s
/// function and returns its `imm` encoding.
fn push_reg_list<B: ListBank>(
    fx: &FnCtx<'_>,
    reg_lists: &mut RegLists,
    regs: impl IntoIterator<Item = u32>,
    at: usize,
) -> Result<u64> {
    let list = B::list_mut(reg_lists);
    let start = list.len();
    for r in regs {
        list.push(fx.reg::<B>(r as u16, false, at)?);
    }
    Ok(((start as u64) << 32) | (list.len() - start) as u64)
}

/// The register operands of one instruction as read (raw, with the move
/// rule of their field), handed out typed by [`OpRegs::decode`] once
/// each is checked again for the bank its operand type names.
struct Checked<'a, 'f> {
    fx: &'a FnCtx<'f>,
    regs: &'a [(u16, bool)],
    next: usize,
    at: usize,
}

impl RegSource for Checked<'_, '_> {
    fn reg<B: RegBank>(&mut self) -> Result<Reg<B>> {
        let Some(&(raw, allow_move)) = self.regs.get(self.next) else {
            bail!(
                Internal,
                "function '{}': instruction at bytecode offset {} has fewer register operands than its op",
                self.fx.name,
                self.at
            );
        };
        self.next += 1;
        self.fx.reg::<B>(raw, allow_move, self.at)
    }
}

/// The operands of an import call listed at decode time, and after them the
/// ref operands it moves (released once the callee returns): `Insn::imm`
/// holds `(start + 1) << 32 | moved << 16 | len` into
/// [`DecodedFunction::operands`], 0 if none.
#[inline]
pub(crate) fn call_operands<'a>(
    insn: &Insn,
    operands: &'a [crate::stack::Operand],
) -> Option<(&'a [crate::stack::Operand], &'a [crate::stack::Operand])> {
    if insn.imm == 0 {
        return None;
    }
    let start = ((insn.imm >> 32) as usize).checked_sub(1)?;
    let len = (insn.imm & 0xFFFF) as usize;
    let moved = ((insn.imm >> 16) & 0xFFFF) as usize;
    let all = operands.get(start..start + len + moved)?;
    Some(all.split_at(len))
}

/// What the verifier needs to know about the rest of the module.
pub struct ModuleEnv<'a> {
    /// Type table size.
    pub type_count: u32,
    /// Calling conventions of the imports (None when unspecified).
    pub import_cconvs: &'a [Option<Cconv>],
    /// Calling conventions of internal functions.
    pub function_cconvs: &'a [Cconv],
    /// Rodata segment count.
    pub rodata_count: u32,
    /// Bytes of primitive global storage.
    pub global_bytes: u32,
    /// Number of ref globals.
    pub global_refs: u32,
    /// Interned strings (fail messages, trace names), appended to.
    pub strings: &'a mut Vec<Box<str>>,
}

struct Reader<'a> {
    code: &'a [u8],
    pc: usize,
    fname: &'a str,
}

impl Reader<'_> {
    fn need(&self, n: usize, what: &str) -> Result<()> {
        if self.pc.checked_add(n).is_none_or(|e| e > self.code.len()) {
            bail!(
                InvalidArgument,
                "function '{}': truncated {what} at bytecode offset {} (needs {n} bytes, function has {})",
                self.fname,
                self.pc,
                self.code.len()
            );
        }
        Ok(())
    }
    fn u8(&mut self, what: &str) -> Result<u8> {
        self.need(1, what)?;
        let v = self.code[self.pc];
        self.pc += 1;
        Ok(v)
    }
    fn u16(&mut self, what: &str) -> Result<u16> {
        self.need(2, what)?;
        let v = u16::from_le_bytes([self.code[self.pc], self.code[self.pc + 1]]);
        self.pc += 2;
        Ok(v)
    }
    fn u32(&mut self, what: &str) -> Result<u32> {
        self.need(4, what)?;
        let mut b = [0u8; 4];
        b.copy_from_slice(&self.code[self.pc..self.pc + 4]);
        self.pc += 4;
        Ok(u32::from_le_bytes(b))
    }
    fn u64(&mut self, what: &str) -> Result<u64> {
        self.need(8, what)?;
        let mut b = [0u8; 8];
        b.copy_from_slice(&self.code[self.pc..self.pc + 8]);
        self.pc += 8;
        Ok(u64::from_le_bytes(b))
    }
    fn align2(&mut self) {
        self.pc = (self.pc + 1) & !1;
    }
}

struct FnCtx<'a> {
    name: &'a str,
    i32_count: u32,
    ref_count: u32,
}

impl FnCtx<'_> {
    /// `reg` as a register operand of bank `B`, once [`FnCtx::check_reg`]
    /// accepted it for `B`'s bank: the one place a [`Reg`] is made.
    fn reg<B: RegBank>(&self, reg: u16, allow_move: bool, at: usize) -> Result<Reg<B>> {
        self.check_reg(reg, B::BANK, allow_move, at)?;
        Ok(Reg::verified(reg))
    }

    fn check_reg(&self, reg: u16, bank: Bank, allow_move: bool, at: usize) -> Result<()> {
        let bad = |why: String| {
            status!(
                InvalidArgument,
                "function '{}': register {:#06x} at bytecode offset {at}: {why}",
                self.name,
                reg
            )
        };
        match bank {
            Bank::Ref => {
                if reg & REF_BIT == 0 {
                    return Err(bad("expected a ref register".into()));
                }
                if !allow_move && reg & MOVE_BIT != 0 {
                    return Err(bad("move bit not allowed here".into()));
                }
                let o = (reg & REF_MASK) as u32;
                if o >= self.ref_count {
                    return Err(bad(format!(
                        "ref register {o} out of range (function has {})",
                        self.ref_count
                    )));
                }
            }
            Bank::I32 | Bank::F32 | Bank::I64 | Bank::F64 => {
                if reg & REF_BIT != 0 {
                    return Err(bad(
                        "expected a primitive register, found a ref register".into()
                    ));
                }
                let width = if matches!(bank, Bank::I64 | Bank::F64) {
                    2
                } else {
                    1
                };
                // 64-bit values occupy an aligned slot pair, as upstream
                // requires.
                if width == 2 && reg & 1 != 0 {
                    return Err(bad(format!(
                        "{bank:?} register {reg} is not 8-byte aligned (64-bit registers are even)"
                    )));
                }
                if reg as u32 + width > self.i32_count {
                    return Err(bad(format!(
                        "{bank:?} register {reg} out of range (function has {} i32 slots)",
                        self.i32_count
                    )));
                }
            }
            Bank::Any => {
                if reg & REF_BIT != 0 {
                    self.check_reg(reg, Bank::Ref, true, at)?;
                } else {
                    self.check_reg(reg, Bank::I32, false, at)?;
                }
            }
        }
        Ok(())
    }
}

/// Verifies and decodes one function's bytecode, laid out as `desc` says:
/// its register counts, its block count (which must be exact, as upstream
/// requires) and its feature requirements (which extension opcodes need).
pub fn decode_function(
    name: &str,
    code: &[u8],
    desc: &FunctionDescriptor,
    cconv: &Cconv,
    env: &mut ModuleEnv<'_>,
) -> Result<DecodedFunction> {
    let (i32_count, ref_count) = (
        u32::from(desc.i32_register_count),
        u32::from(desc.ref_register_count),
    );
    // Register files are allocated rounded up to a power of two (at least
    // one register per bank), as upstream sizes them.
    let i32_count = i32_count.max(1).next_power_of_two();
    let ref_count = ref_count.max(1).next_power_of_two();
    if i32_count > 0x7FFF || ref_count > REF_MASK as u32 {
        bail!(
            InvalidArgument,
            "function '{name}': register counts exceed the maximum"
        );
    }
    let fx = FnCtx {
        name,
        i32_count,
        ref_count,
    };
    check_signature_storage(&fx, cconv)?;
    let mut rd = Reader {
        code,
        pc: 0,
        fname: name,
    };
    let mut insns = Vec::new();
    let mut offsets = Vec::new();
    let mut pool: Vec<u32> = Vec::new();
    let mut operands: Vec<crate::stack::Operand> = Vec::new();
    // Branch target pool slots to patch from byte offsets to insn indices.
    let mut fixups: Vec<(usize, usize)> = Vec::new();
    let mut block_at: Vec<(u32, u32)> = Vec::new();
    if code.first() != Some(&BLOCK_MARKER) {
        bail!(
            InvalidArgument,
            "function '{name}': bytecode must begin with a block marker"
        );
    }
    let mut in_block = false;
    while rd.pc < code.len() {
        let start = rd.pc;
        let b = rd.u8("opcode")?;
        let op = match b {
            PREFIX_EXT_F32 | PREFIX_EXT_F64 => {
                let (table, bit, set) = if b == PREFIX_EXT_F32 {
                    (&EXT_F32_TABLE, FEATURE_EXT_F32, "EXT_F32")
                } else {
                    (&EXT_F64_TABLE, FEATURE_EXT_F64, "EXT_F64")
                };
                if desc.requirements & bit == 0 {
                    bail!(
                        InvalidArgument,
                        "function '{name}': {set} opcode at bytecode offset {start} but the function does not require {set}"
                    );
                }
                let e = rd.u8("extension opcode")?;
                table[e as usize].ok_or_else(|| {
                    status!(InvalidArgument, "function '{name}': unknown {set} opcode {e:#04x} at bytecode offset {start}")
                })?
            }
            _ => CORE_TABLE[b as usize].ok_or_else(|| {
                status!(
                    InvalidArgument,
                    "function '{name}': unknown opcode {b:#04x} at bytecode offset {start}"
                )
            })?,
        };
        // Every op sits in a block: a block marker opens one, a terminator
        // closes it, and nothing but a marker may follow a terminator (as
        // upstream's verifier requires).
        match (in_block, op == Op::Block) {
            (false, false) => bail!(
                InvalidArgument,
                "function '{name}': op {} at bytecode offset {start} is not in a block (it follows a terminator)",
                op.mnemonic()
            ),
            (true, true) => bail!(
                InvalidArgument,
                "function '{name}': block marker at bytecode offset {start} while still in a block (the previous block has no terminator)"
            ),
            _ => {}
        }
        in_block = !is_terminator(op);
        if op == Op::Block {
            block_at.push((start as u32, insns.len() as u32));
        }
        // The op's register operands are typed once all its fields are read.
        let mut insn = Insn {
            regs: OpRegs::EndOfFunction,
            pool: pool.len() as u32,
            a: 0,
            imm: 0,
        };
        let mut raw_regs = [(0u16, false); 6];
        let mut nreg = 0usize;
        let mut last_i16 = 0u16;
        let mut list_idx = 0usize;
        for field in op.fields() {
            match *field {
                Field::Reg {
                    bank, allow_move, ..
                } => {
                    let reg = rd.u16("register")?;
                    fx.check_reg(reg, bank, allow_move, start)?;
                    let Some(slot) = raw_regs.get_mut(nreg) else {
                        bail!(
                            Internal,
                            "op {} has more than 6 register operands",
                            op.mnemonic()
                        );
                    };
                    *slot = (reg, allow_move);
                    nreg += 1;
                }
                Field::Attr(bank) => {
                    insn.imm = match bank {
                        Bank::I64 | Bank::F64 => rd.u64("constant")?,
                        _ => rd.u32("constant")? as u64,
                    };
                }
                Field::GlobalAttr => insn.a = rd.u32("global ordinal")?,
                Field::FuncAttr => {
                    let f = rd.u32("function ordinal")?;
                    check_func_ordinal(name, f, env, start)?;
                    insn.a = f;
                }
                Field::RodataAttr => {
                    let r = rd.u32("rodata ordinal")?;
                    if r >= env.rodata_count {
                        bail!(InvalidArgument, "function '{name}': rodata ordinal {r} at bytecode offset {start} out of range ({} segments)", env.rodata_count);
                    }
                    insn.a = r;
                }
                Field::TypeOf => {
                    let t = rd.u32("type ordinal")?;
                    if t >= env.type_count {
                        bail!(InvalidArgument, "function '{name}': type ordinal {t} at bytecode offset {start} out of range ({} types)", env.type_count);
                    }
                    insn.imm = t as u64;
                }
                Field::StringAttr => {
                    let n = rd.u16("string length")? as usize;
                    rd.need(n, "string")?;
                    let s = std::str::from_utf8(&code[rd.pc..rd.pc + n]).map_err(|_| {
                        status!(
                            InvalidArgument,
                            "function '{name}': string at bytecode offset {} is not UTF-8",
                            rd.pc
                        )
                    })?;
                    rd.pc += n;
                    insn.a = env.strings.len() as u32;
                    env.strings.push(s.into());
                }
                Field::BranchTarget => {
                    let t = rd.u32("branch target")?;
                    fixups.push((pool.len(), start));
                    pool.push(t);
                }
                Field::BranchOperands => {
                    read_remap_list(&mut rd, &fx, &mut pool, start)?;
                }
                Field::Operands(bank) | Field::Results(bank) => {
                    rd.align2();
                    let n = rd.u16("register list size")?;
                    pool.push(n as u32);
                    for _ in 0..n {
                        let reg = rd.u16("register list entry")?;
                        // Segment sizes are literal counts, not registers.
                        if !(op_has_segments(op) && list_idx == 0) {
                            fx.check_reg(reg, bank, true, start)?;
                        }
                        pool.push(reg as u32);
                    }
                    list_idx += 1;
                }
                Field::ConstI16 => {
                    last_i16 = rd.u16("table size")?;
                    pool.push(last_i16 as u32);
                }
                Field::BranchTableCases => {
                    for _ in 0..last_i16 {
                        let t = rd.u32("branch table case target")?;
                        fixups.push((pool.len(), start));
                        pool.push(t);
                        read_remap_list(&mut rd, &fx, &mut pool, start)?;
                    }
                }
            }
        }
        insn.regs = OpRegs::decode(
            op,
            &mut Checked {
                fx: &fx,
                regs: &raw_regs[..nreg],
                next: 0,
                at: start,
            },
        )?;
        check_semantics(&insn, &pool, env, &fx, cconv, start)?;
        list_import_operands(&mut insn, &pool, env, &mut operands)?;
        insns.push(insn);
        offsets.push(start as u32);
    }
    if block_at.len() != usize::from(desc.block_count) {
        bail!(
            InvalidArgument,
            "function '{name}': descriptor declares {} blocks, bytecode has {}",
            desc.block_count,
            block_at.len()
        );
    }
    for (slot, at) in fixups {
        let target = pool[slot];
        match block_at.binary_search_by_key(&target, |&(off, _)| off) {
            // Execution resumes after the marker.
            Ok(i) => pool[slot] = block_at[i].1 + 1,
            Err(_) => bail!(
                InvalidArgument,
                "function '{name}': branch at bytecode offset {at} targets offset {target}, which is not a block start"
            ),
        }
    }
    // Every function ends in a terminator (the end sentinel appended below
    // makes running past one safe regardless; this rejects malformed code).
    if in_block {
        bail!(
            InvalidArgument,
            "function '{name}': last instruction {:?} is not a terminator",
            insns.last().map(|i: &Insn| i.op().mnemonic())
        );
    }
    let mut reg_lists = RegLists::default();
    fuse(&fx, &mut insns, &mut offsets, &pool, &mut reg_lists)?;
    list_switch_values(&fx, &mut insns, &offsets, &pool, &mut reg_lists)?;
    // A sentinel after the last instruction: falling through the end of the
    // function lands on it (and fails) instead of outside the instruction
    // array, so every pc the interpreter can reach indexes a valid slot.
    insns.push(Insn {
        regs: OpRegs::EndOfFunction,
        pool: 0,
        a: 0,
        imm: 0,
    });
    offsets.push(code.len() as u32);
    Ok(DecodedFunction {
        insns,
        offsets,
        pool,
        i32_count,
        ref_count,
        cconv: cconv.clone(),
        reg_lists: Box::new(reg_lists),
        operands,
    })
}

/// Lists the value registers of primitive `switch` ops (checked when their
/// operand list was read) in `reg_lists`.
fn list_switch_values(
    fx: &FnCtx<'_>,
    insns: &mut [Insn],
    offsets: &[u32],
    pool: &[u32],
    reg_lists: &mut RegLists,
) -> Result<()> {
    for (insn, &at) in insns.iter_mut().zip(offsets) {
        let values = pool_list(pool, insn.pool as usize).iter().copied();
        let at = at as usize;
        insn.imm = match insn.op() {
            Op::SwitchI32 => push_reg_list::<I32>(fx, reg_lists, values, at)?,
            Op::SwitchI64 => push_reg_list::<I64>(fx, reg_lists, values, at)?,
            Op::SwitchF32 => push_reg_list::<F32>(fx, reg_lists, values, at)?,
            Op::SwitchF64 => push_reg_list::<F64>(fx, reg_lists, values, at)?,
            _ => continue,
        };
    }
    Ok(())
}

/// For an import call with a declared callee signature, lists its operands
/// in `operands` and records where in `insn.imm` (see [`call_operands`]).
fn list_import_operands(
    insn: &mut Insn,
    pool: &[u32],
    env: &ModuleEnv<'_>,
    operands: &mut Vec<crate::stack::Operand>,
) -> Result<()> {
    let p = insn.pool as usize;
    let (args, segments) = match insn.op() {
        Op::Call | Op::CallYieldable => (p, None),
        Op::CallVariadic | Op::CallVariadicYieldable => (p + 1 + pool_list(pool, p).len(), Some(p)),
        _ => return Ok(()),
    };
    if insn.a & IMPORT_BIT == 0 {
        return Ok(());
    }
    let Some(c) = callee_cconv(env, insn.a) else {
        return Ok(());
    };
    let mut listed = Vec::new();
    super::interp::native_bridge::build_operands(
        &mut listed,
        pool_list(pool, args),
        segments.map(|s| pool_list(pool, s)),
        &c.args,
    )?;
    let moved: Vec<crate::stack::Operand> = listed
        .iter()
        .filter(|op| matches!(op, crate::stack::Operand::Ref(r) if r & MOVE_BIT != 0))
        .copied()
        .collect();
    if listed.len() > 0xFFFF || moved.len() > 0xFFFF {
        // Too long to list; the call builds its operands when it runs.
        return Ok(());
    }
    insn.imm =
        ((operands.len() as u64 + 1) << 32) | (moved.len() as u64) << 16 | listed.len() as u64;
    operands.extend(listed);
    operands.extend(moved);
    Ok(())
}

fn op_has_segments(op: Op) -> bool {
    matches!(op, Op::CallVariadic | Op::CallVariadicYieldable)
}

fn read_remap_list(
    rd: &mut Reader<'_>,
    fx: &FnCtx<'_>,
    pool: &mut Vec<u32>,
    at: usize,
) -> Result<()> {
    rd.align2();
    let n = rd.u16("remap list size")?;
    pool.push(n as u32);
    for _ in 0..n {
        let src = rd.u16("remap source")?;
        let dst = rd.u16("remap destination")?;
        fx.check_reg(src, Bank::Any, true, at)?;
        fx.check_reg(dst, Bank::Any, true, at)?;
        if (src & REF_BIT) != (dst & REF_BIT) {
            bail!(
                InvalidArgument,
                "function '{}': branch at bytecode offset {at} remaps between register banks",
                fx.name
            );
        }
        pool.push(src as u32);
        pool.push(dst as u32);
    }
    Ok(())
}

fn check_func_ordinal(name: &str, f: u32, env: &ModuleEnv<'_>, at: usize) -> Result<()> {
    if f & IMPORT_BIT != 0 {
        let i = (f & !IMPORT_BIT) as usize;
        if i >= env.import_cconvs.len() {
            bail!(InvalidArgument, "function '{name}': import ordinal {i} at bytecode offset {at} out of range ({} imports)", env.import_cconvs.len());
        }
    } else if f as usize >= env.function_cconvs.len() {
        bail!(InvalidArgument, "function '{name}': function ordinal {f} at bytecode offset {at} out of range ({} functions)", env.function_cconvs.len());
    }
    Ok(())
}

/// The callee's calling convention for a function ordinal.
fn callee_cconv<'e>(env: &'e ModuleEnv<'_>, f: u32) -> Option<&'e Cconv> {
    if f & IMPORT_BIT != 0 {
        env.import_cconvs
            .get((f & !IMPORT_BIT) as usize)
            .and_then(|c| c.as_ref())
    } else {
        env.function_cconvs.get(f as usize)
    }
}

/// Reads a `[count, entries...]` list from the pool at `at` (empty when
/// the pool is too short). Written as three length checks on slices, with
/// no index arithmetic to check for overflow: every import call and
/// register list goes through here.
#[inline]
pub fn pool_list(pool: &[u32], at: usize) -> &[u32] {
    match pool.get(at..) {
        Some([n, rest @ ..]) => rest.get(..*n as usize).unwrap_or(&[]),
        _ => &[],
    }
}

/// Pool index just past the remap list (`[count, (src, dst)...]`) at `at`.
pub fn skip_remap(pool: &[u32], at: usize) -> Option<usize> {
    let n = *pool.get(at)? as usize;
    Some(at + 1 + 2 * n)
}

/// The instruction indices decoded instruction `insn` may branch to (the
/// decoder turned its block offsets into indices); `None` when its pool
/// entries run past `pool`.
pub fn branch_targets(pool: &[u32], insn: &Insn) -> Option<Vec<usize>> {
    let at = |i: usize| pool.get(i).map(|&t| t as usize);
    Some(match insn.op() {
        Op::DirectBranch | Op::PrimitiveRemapBranch => vec![insn.a as usize],
        Op::DirectCondBranch
        | Op::FusedCmpEQI32CondBranch
        | Op::FusedCmpNEI32CondBranch
        | Op::FusedCmpLTI32SCondBranch
        | Op::FusedCmpLTI32UCondBranch
        | Op::FusedCmpNZI32CondBranch
        | Op::FusedCmpEQI64CondBranch
        | Op::FusedCmpNEI64CondBranch
        | Op::FusedCmpLTI64SCondBranch
        | Op::FusedCmpLTI64UCondBranch
        | Op::FusedCmpNZI64CondBranch => vec![insn.a as usize, insn.imm as usize],
        Op::Branch | Op::Break | Op::CondBreak | Op::Yield => vec![at(insn.pool as usize)?],
        Op::CondBranch => {
            let p = insn.pool as usize;
            vec![at(p)?, at(skip_remap(pool, p + 1)?)?]
        }
        Op::BranchTable => {
            let p = insn.pool as usize;
            let mut out = vec![at(p)?];
            let end = skip_remap(pool, p + 1)?;
            let size = at(end)?;
            let mut a = end + 1;
            for _ in 0..size {
                out.push(at(a)?);
                a = skip_remap(pool, a + 1)?;
            }
            out
        }
        _ => Vec::new(),
    })
}

/// Checks that the registers of `list` match the flat scalar `types`.
fn check_list_types(
    fx: &FnCtx<'_>,
    list: &[u32],
    types: &[CconvType],
    what: &str,
    at: usize,
) -> Result<()> {
    if list.len() != types.len() {
        bail!(
            InvalidArgument,
            "function '{}': {what} at bytecode offset {at} has {} registers, signature expects {}",
            fx.name,
            list.len(),
            types.len()
        );
    }
    for (reg, t) in list.iter().zip(types) {
        let bank = match t {
            CconvType::I32 => Bank::I32,
            CconvType::I64 => Bank::I64,
            CconvType::F32 => Bank::F32,
            CconvType::F64 => Bank::F64,
            CconvType::Ref => Bank::Ref,
            CconvType::Span(_) => bail!(
                InvalidArgument,
                "function '{}': unexpected span in {what}",
                fx.name
            ),
        };
        fx.check_reg(*reg as u16, bank, true, at)
            .map_err(|e| e.annotate(format!("in {what}")))?;
    }
    Ok(())
}

/// The element count of a variadic call's span argument `i`, from the
/// call's segment sizes; an error when the call gives too few.
pub(crate) fn segment_size(segments: &[u32], i: usize, args: usize) -> Result<u32> {
    segments.get(i).copied().ok_or_else(|| {
        status!(
            InvalidArgument,
            "variadic call has {} segment sizes, signature needs {args}",
            segments.len()
        )
    })
}

/// Expands a variadic argument list with its segment sizes to flat types.
pub fn expand_variadic(args: &[CconvType], segments: &[u32]) -> Result<Vec<CconvType>> {
    let mut out = Vec::new();
    for (i, a) in args.iter().enumerate() {
        match a {
            CconvType::Span(items) => {
                let n = segment_size(segments, i, args.len())?;
                for _ in 0..n {
                    out.extend(items.iter().cloned());
                }
            }
            t => out.push(t.clone()),
        }
    }
    Ok(out)
}

fn check_semantics(
    insn: &Insn,
    pool: &[u32],
    env: &ModuleEnv<'_>,
    fx: &FnCtx<'_>,
    own: &Cconv,
    at: usize,
) -> Result<()> {
    let p = insn.pool as usize;
    let name = fx.name;
    match insn.op() {
        Op::Call | Op::CallYieldable => {
            let args = pool_list(pool, p);
            let rest = p + 1 + args.len() + if insn.op() == Op::CallYieldable { 1 } else { 0 };
            let results = pool_list(pool, rest);
            if let Some(c) = callee_cconv(env, insn.a) {
                if c.is_variadic() {
                    bail!(InvalidArgument, "function '{name}': non-variadic call at bytecode offset {at} to variadic callee");
                }
                check_list_types(fx, args, &c.args, "call arguments", at)?;
                check_list_types(fx, results, &c.results, "call results", at)?;
            }
        }
        Op::CallVariadic | Op::CallVariadicYieldable => {
            if insn.a & IMPORT_BIT == 0 {
                bail!(InvalidArgument, "function '{name}': variadic call at bytecode offset {at} must target an import");
            }
            let segs = pool_list(pool, p);
            let args_at = p + 1 + segs.len();
            let args = pool_list(pool, args_at);
            let mut rest = args_at + 1 + args.len();
            if insn.op() == Op::CallVariadicYieldable {
                rest += 1;
            }
            let results = pool_list(pool, rest);
            if let Some(c) = callee_cconv(env, insn.a) {
                let flat = expand_variadic(&c.args, segs).map_err(|e| {
                    e.annotate(format!("function '{name}' at bytecode offset {at}"))
                })?;
                check_list_types(fx, args, &flat, "variadic call arguments", at)?;
                check_list_types(fx, results, &c.results, "call results", at)?;
            }
        }
        Op::Return => {
            check_list_types(fx, pool_list(pool, p), &own.results, "return values", at)?;
        }
        Op::GlobalLoadI32 | Op::GlobalStoreI32 | Op::GlobalLoadF32 | Op::GlobalStoreF32 => {
            check_global(name, insn.a, 4, env, at)?;
        }
        Op::GlobalLoadI64 | Op::GlobalStoreI64 | Op::GlobalLoadF64 | Op::GlobalStoreF64 => {
            check_global(name, insn.a, 8, env, at)?;
        }
        Op::GlobalLoadRef | Op::GlobalStoreRef if insn.a >= env.global_refs => {
            bail!(InvalidArgument, "function '{name}': ref global {} at bytecode offset {at} out of range ({} ref globals)", insn.a, env.global_refs);
        }
        Op::ImportResolved if insn.a & IMPORT_BIT == 0 => {
            bail!(InvalidArgument, "function '{name}': import.resolved at bytecode offset {at} names a non-import function");
        }
        _ => {}
    }
    Ok(())
}

fn check_global(name: &str, offset: u32, width: u32, env: &ModuleEnv<'_>, at: usize) -> Result<()> {
    if offset
        .checked_add(width)
        .is_none_or(|e| e > env.global_bytes)
    {
        bail!(
            InvalidArgument,
            "function '{name}': global byte offset {offset} (+{width}) at bytecode offset {at} out of range ({} bytes of globals)",
            env.global_bytes
        );
    }
    Ok(())
}

fn check_signature_storage(fx: &FnCtx<'_>, cconv: &Cconv) -> Result<()> {
    for list in [&cconv.args, &cconv.results] {
        let mut slots = 0u32;
        let mut refs = 0u32;
        for t in list.iter() {
            match t {
                CconvType::Ref => refs += 1,
                CconvType::Span(_) => bail!(
                    InvalidArgument,
                    "function '{}': bytecode functions cannot be variadic",
                    fx.name
                ),
                t => slots += t.i32_slots() as u32,
            }
        }
        if slots > fx.i32_count || refs > fx.ref_count {
            bail!(
                InvalidArgument,
                "function '{}': insufficient register storage for function arguments/results ({slots} i32 slots and {refs} refs needed, {} and {} available)",
                fx.name,
                fx.i32_count,
                fx.ref_count
            );
        }
    }
    Ok(())
}

/// Rewrites common sequences into fused internal ops: branches without
/// block arguments jump directly, and a compare that feeds the following
/// conditional branch becomes one compare-and-branch. The replaced
/// instructions keep their slots, so every instruction index stays valid.
fn fuse(
    fx: &FnCtx<'_>,
    insns: &mut [Insn],
    offsets: &mut [u32],
    pool: &[u32],
    reg_lists: &mut RegLists,
) -> Result<()> {
    for i in 0..insns.len() {
        let insn = insns[i];
        let p = insn.pool as usize;
        match insn.regs {
            OpRegs::Branch if pool[p + 1] == 0 => {
                insns[i].regs = OpRegs::DirectBranch;
                insns[i].a = pool[p];
            }
            // Block arguments that are all primitive registers (every
            // source and destination, not only the first half of the
            // list): the interpreter copies slot pairs without per-entry
            // type tests, from a verified register list (each entry was
            // checked by `read_remap_list` when the branch was decoded).
            // Each slot is copied on its own, so entries are i32-bank slots.
            OpRegs::Branch if remap_pairs(pool, p + 1).all(|r| r as u16 & REF_BIT == 0) => {
                insns[i].regs = OpRegs::PrimitiveRemapBranch;
                insns[i].a = pool[p];
                let at = offsets[i] as usize;
                insns[i].imm = push_reg_list::<I32>(fx, reg_lists, remap_pairs(pool, p + 1), at)?;
            }
            OpRegs::CondBranch(cond) => {
                let t = pool[p];
                if pool[p + 1] != 0 {
                    continue;
                }
                let f_at = p + 2;
                let f = pool[f_at];
                if pool[f_at + 1] != 0 {
                    continue;
                }
                insns[i].regs = OpRegs::DirectCondBranch(cond);
                insns[i].a = t;
                insns[i].imm = f as u64;
                if i == 0 {
                    continue;
                }
                // The compare feeding the branch may sit a few instructions
                // earlier; it is sunk next to the branch when the
                // instructions in between are plain register arithmetic that
                // neither reads nor writes its operands or result.
                let cond = cond.raw();
                let mut j = i;
                let mut found = None;
                while j > 0 && i - j < 4 {
                    j -= 1;
                    let cand = insns[j];
                    if let Some((fused, result)) = fused_compare(cand.regs) {
                        if result == cond {
                            found = Some((j, fused));
                        }
                        break;
                    }
                    if !is_plain_register_op(cand.op()) || touches(&cand, cond, 1) {
                        break;
                    }
                }
                let Some((j, fused)) = found else {
                    continue;
                };
                let cmp = insns[j];
                let (reads, _) = register_slots(&cmp);
                if insns[j + 1..i].iter().any(|x| {
                    let (xr, xw) = register_slots(x);
                    xw.iter().any(|w| reads.contains(w) || *w == cond) || xr.contains(&cond)
                }) {
                    continue;
                }
                // Shift the independent instructions up one slot (and their
                // offsets, for backtraces) and put the fused op last.
                insns.copy_within(j + 1..i, j);
                offsets.copy_within(j + 1..i, j);
                offsets[i - 1] = offsets[i];
                insns[i - 1] = Insn {
                    regs: fused,
                    a: t,
                    imm: f as u64,
                    ..cmp
                };
            }
            _ => {}
        }
    }
    Ok(())
}

/// The registers of the remap list at pool index `at` (`n`, then `n`
/// source/destination pairs), sources and destinations alternating.
fn remap_pairs(pool: &[u32], at: usize) -> impl Iterator<Item = u32> + '_ {
    let n = pool.get(at).copied().unwrap_or(0) as usize;
    pool.get(at + 1..at + 1 + 2 * n)
        .unwrap_or(&[])
        .iter()
        .copied()
}

/// The fused compare-and-branch op for a compare (with the compare's
/// operands), and the compare's result register.
fn fused_compare(regs: OpRegs) -> Option<(OpRegs, u16)> {
    use OpRegs as R;
    Some(match regs {
        R::CmpEQI32(a, b, c) => (R::FusedCmpEQI32CondBranch(a, b, c), c.raw()),
        R::CmpNEI32(a, b, c) => (R::FusedCmpNEI32CondBranch(a, b, c), c.raw()),
        R::CmpLTI32S(a, b, c) => (R::FusedCmpLTI32SCondBranch(a, b, c), c.raw()),
        R::CmpLTI32U(a, b, c) => (R::FusedCmpLTI32UCondBranch(a, b, c), c.raw()),
        R::CmpNZI32(a, c) => (R::FusedCmpNZI32CondBranch(a, c), c.raw()),
        R::CmpEQI64(a, b, c) => (R::FusedCmpEQI64CondBranch(a, b, c), c.raw()),
        R::CmpNEI64(a, b, c) => (R::FusedCmpNEI64CondBranch(a, b, c), c.raw()),
        R::CmpLTI64S(a, b, c) => (R::FusedCmpLTI64SCondBranch(a, b, c), c.raw()),
        R::CmpLTI64U(a, b, c) => (R::FusedCmpLTI64UCondBranch(a, b, c), c.raw()),
        R::CmpNZI64(a, c) => (R::FusedCmpNZI64CondBranch(a, c), c.raw()),
        _ => return None,
    })
}

/// True for ops whose operands are only primitive registers and immediates
/// and that cannot fail or have effects beyond their result registers.
fn is_plain_register_op(op: Op) -> bool {
    !matches!(
        op,
        Op::DivI32S
            | Op::DivI32U
            | Op::RemI32S
            | Op::RemI32U
            | Op::DivI64S
            | Op::DivI64U
            | Op::RemI64S
            | Op::RemI64U
    ) && !op.fields().is_empty()
        && op.fields().iter().all(|f| match f {
            Field::Reg { bank, .. } => !matches!(bank, Bank::Ref | Bank::Any),
            Field::Attr(_) => true,
            _ => false,
        })
}

/// Whether `insn` reads or writes i32-bank slot `reg` (+`width` slots).
fn touches(insn: &Insn, reg: u16, width: u16) -> bool {
    let (r, w) = register_slots(insn);
    (0..width).any(|k| r.contains(&(reg + k)) || w.contains(&(reg + k)))
}

/// The i32-bank slots a plain register op reads and writes.
fn register_slots(insn: &Insn) -> (Vec<u16>, Vec<u16>) {
    let (mut reads, mut writes) = (Vec::new(), Vec::new());
    let mut n = 0;
    let raw = insn.regs.raw();
    for f in insn.op().fields() {
        if let Field::Reg { bank, write, .. } = *f {
            let reg = raw[n];
            n += 1;
            let width = if matches!(bank, Bank::I64 | Bank::F64) {
                2
            } else {
                1
            };
            let set = if write { &mut writes } else { &mut reads };
            for k in 0..width {
                set.push(reg + k);
            }
        }
    }
    (reads, writes)
}

/// The ops that end a block (upstream's verifier closes the block after
/// each): branches, returns, failures, yields and the yieldable calls.
fn is_terminator(op: Op) -> bool {
    matches!(
        op,
        Op::Return
            | Op::Branch
            | Op::CondBranch
            | Op::BranchTable
            | Op::Fail
            | Op::Yield
            | Op::Break
            | Op::CondBreak
            | Op::CallYieldable
            | Op::CallVariadicYieldable
    )
}

#[cfg(test)]
mod tests {
    use super::pool_list;

    #[test]
    fn pool_lists_read_their_count_and_refuse_short_pools() {
        let pool = [9, 2, 10, 11, 0, 3, 20];
        assert_eq!(pool_list(&pool, 1), &[10, 11]);
        assert_eq!(pool_list(&pool, 4), &[] as &[u32]);
        // A count past the end of the pool, an index at and past the end.
        assert_eq!(pool_list(&pool, 5), &[] as &[u32]);
        assert_eq!(pool_list(&pool, 7), &[] as &[u32]);
        assert_eq!(pool_list(&pool, usize::MAX), &[] as &[u32]);
        // A count of u32::MAX must not wrap around.
        assert_eq!(pool_list(&[u32::MAX, 1, 2], 0), &[] as &[u32]);
        assert_eq!(pool_list(&[3, 1, 2, 3], 0), &[1, 2, 3]);
    }
}
