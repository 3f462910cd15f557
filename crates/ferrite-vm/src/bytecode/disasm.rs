//! Disassembly of verified bytecode, in the text form of upstream's
//! `iree-dump-module --output=disassembly` (IREE 3.13).
//!
//! The interpreter's decoded instructions fuse some sequences (compare and
//! branch, argument-free branches), so the disassembler re-decodes each
//! function's raw bytes with the ISA tables ([`Op::fields`]) instead. That is
//! safe on any module [`BytecodeModule::load`] accepted: it verified the same
//! bytes. Should the bytes still be malformed, decoding reports an error
//! rather than panicking.
//!
//! Known differences from upstream:
//! - upstream stops with `UNIMPLEMENTED; unhandled ext opcode` on some
//!   extension ops its disassembler lacks; this one prints every op.
//! - `vm.switch.ref` is printed as `%r = vm.switch.ref %i[%r, ...] else %r
//!   -> !type`; upstream's disassembler crashes on it, so this is a guess.
//!
//! As upstream, function headers use the export name, else the debug
//! database name, else `fnN`; calls name internal callees by their debug
//! name only (`@module.name`, else `@module:N`).

use super::archive::Archive;
use super::isa::{Op, CORE_TABLE, EXT_F32_TABLE, EXT_F64_TABLE};
use super::isa_types::{Bank, Field, PREFIX_EXT_F32, PREFIX_EXT_F64};
use super::module::BytecodeModule;
use super::verifier::{IMPORT_BIT, MOVE_BIT, REF_BIT, REF_MASK};
use crate::cconv::{Cconv, CconvType};
use ferrite_base::{bail, Result};
use std::fmt::Write as _;

/// One operand of a raw (unfused) instruction, in encoding order.
#[derive(Clone, Debug, PartialEq)]
pub enum Operand {
    /// A register as encoded (ref registers keep their type and move bits).
    Reg {
        /// Register bank of the field.
        bank: Bank,
        /// Whether the instruction writes it.
        write: bool,
        /// Whether the field honours the ref move bit.
        allow_move: bool,
        /// The encoded register.
        reg: u16,
    },
    /// An immediate constant (bits) of the bank's width.
    Imm(Bank, u64),
    /// A global byte offset or ref-global ordinal.
    Global(u32),
    /// A function ordinal (high bit marks imports).
    Func(u32),
    /// A rodata segment ordinal.
    Rodata(u32),
    /// A type-table ordinal.
    Type(u32),
    /// A string literal.
    Str(String),
    /// A branch target (bytecode offset of a block marker).
    Target(u32),
    /// A branch remap list of (source, destination) registers.
    Remap(Vec<(u16, u16)>),
    /// A register list; `results` marks result lists.
    List {
        /// Register bank of the list.
        bank: Bank,
        /// Whether the instruction writes the registers.
        results: bool,
        /// The encoded registers.
        regs: Vec<u16>,
    },
    /// A u16 immediate (branch table size).
    Count(u16),
    /// Branch table cases: target and remap list each.
    Cases(Vec<(u32, Vec<(u16, u16)>)>),
}

/// One raw instruction as encoded in the bytecode.
#[derive(Clone, Debug, PartialEq)]
pub struct RawInsn {
    /// Bytecode offset within the function.
    pub offset: u32,
    /// The operation (never a fused internal op).
    pub op: Op,
    /// Operands in encoding order.
    pub operands: Vec<Operand>,
}

/// Options of [`disassemble_module`].
#[derive(Clone, Debug, Default)]
pub struct DisasmOptions {
    /// Prefix each line with `[%08X]`, its bytecode offset.
    pub bytecode_offsets: bool,
    /// Only this function (exact name, or internal ordinal).
    pub function: Option<String>,
}

struct Rd<'a> {
    code: &'a [u8],
    pc: usize,
}

impl Rd<'_> {
    fn take(&mut self, n: usize) -> Result<&[u8]> {
        let Some(s) = self.code.get(self.pc..self.pc.saturating_add(n)) else {
            bail!(
                InvalidArgument,
                "truncated instruction at bytecode offset {}",
                self.pc
            );
        };
        self.pc += n;
        Ok(s)
    }
    fn u8(&mut self) -> Result<u8> {
        Ok(self.take(1)?[0])
    }
    fn u16(&mut self) -> Result<u16> {
        let b = self.take(2)?;
        Ok(u16::from_le_bytes([b[0], b[1]]))
    }
    fn u32(&mut self) -> Result<u32> {
        let b = self.take(4)?;
        Ok(u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
    }
    fn u64(&mut self) -> Result<u64> {
        Ok(self.u32()? as u64 | (self.u32()? as u64) << 32)
    }
    fn align2(&mut self) {
        self.pc = (self.pc + 1) & !1;
    }
    fn remap(&mut self) -> Result<Vec<(u16, u16)>> {
        self.align2();
        let n = self.u16()?;
        (0..n).map(|_| Ok((self.u16()?, self.u16()?))).collect()
    }
}

/// Decodes a function's bytecode into raw instructions, without fusion.
pub fn decode_raw(code: &[u8]) -> Result<Vec<RawInsn>> {
    let mut rd = Rd { code, pc: 0 };
    let mut out = Vec::new();
    while rd.pc < code.len() {
        let offset = rd.pc as u32;
        let b = rd.u8()?;
        let op = match b {
            PREFIX_EXT_F32 => EXT_F32_TABLE[rd.u8()? as usize],
            PREFIX_EXT_F64 => EXT_F64_TABLE[rd.u8()? as usize],
            _ => CORE_TABLE[b as usize],
        };
        let Some(op) = op else {
            bail!(
                InvalidArgument,
                "unknown opcode {b:#04x} at bytecode offset {offset}"
            );
        };
        let mut operands = Vec::new();
        let mut count = 0u16;
        for field in op.fields() {
            operands.push(match *field {
                Field::Reg {
                    bank,
                    write,
                    allow_move,
                } => Operand::Reg {
                    bank,
                    write,
                    allow_move,
                    reg: rd.u16()?,
                },
                Field::Attr(bank) => Operand::Imm(
                    bank,
                    match bank {
                        Bank::I64 | Bank::F64 => rd.u64()?,
                        _ => rd.u32()? as u64,
                    },
                ),
                Field::GlobalAttr => Operand::Global(rd.u32()?),
                Field::FuncAttr => Operand::Func(rd.u32()?),
                Field::RodataAttr => Operand::Rodata(rd.u32()?),
                Field::TypeOf => Operand::Type(rd.u32()?),
                Field::StringAttr => {
                    let n = rd.u16()? as usize;
                    Operand::Str(String::from_utf8_lossy(rd.take(n)?).into_owned())
                }
                Field::BranchTarget => Operand::Target(rd.u32()?),
                Field::BranchOperands => Operand::Remap(rd.remap()?),
                Field::Operands(bank) | Field::Results(bank) => {
                    rd.align2();
                    let n = rd.u16()?;
                    let regs = (0..n).map(|_| rd.u16()).collect::<Result<Vec<_>>>()?;
                    Operand::List {
                        bank,
                        results: matches!(field, Field::Results(_)),
                        regs,
                    }
                }
                Field::ConstI16 => {
                    count = rd.u16()?;
                    Operand::Count(count)
                }
                Field::BranchTableCases => Operand::Cases(
                    (0..count)
                        .map(|_| Ok((rd.u32()?, rd.remap()?)))
                        .collect::<Result<Vec<_>>>()?,
                ),
            });
        }
        out.push(RawInsn {
            offset,
            op,
            operands,
        });
    }
    Ok(out)
}

pub use ferrite_base::printf_float::format_g;

/// Name of a register as upstream prints it (`%i3`, `%i4:5`, `%r2`, `%R2`
/// for a ref moved out of its register).
pub fn reg_name(reg: u16, bank: Bank, allow_move: bool) -> String {
    if reg & REF_BIT != 0 || bank == Bank::Ref {
        let m = if allow_move && reg & MOVE_BIT != 0 {
            'R'
        } else {
            'r'
        };
        format!("%{m}{}", reg & REF_MASK)
    } else if matches!(bank, Bank::I64 | Bank::F64) {
        format!("%i{}:{}", reg, reg as u32 + 1)
    } else {
        format!("%i{reg}")
    }
}

fn list_names(regs: &[u16]) -> String {
    regs.iter()
        .map(|&r| reg_name(r, Bank::Any, true))
        .collect::<Vec<_>>()
        .join(", ")
}

fn remap_names(pairs: &[(u16, u16)]) -> String {
    pairs
        .iter()
        .map(|&(s, d)| {
            format!(
                "{}->{}",
                reg_name(s, Bank::Any, true),
                reg_name(d, Bank::Any, true)
            )
        })
        .collect::<Vec<_>>()
        .join(", ")
}

/// Module-wide names the disassembly refers to.
struct Names<'a> {
    archive: &'a Archive,
    /// Debug-database names of internal functions (empty when none).
    debug: Vec<String>,
    /// Block index of each block-marker offset, for the current function.
    blocks: Vec<u32>,
}

impl Names<'_> {
    fn func(&self, f: u32) -> String {
        let module = self.archive.name();
        if f & IMPORT_BIT != 0 {
            let i = (f & !IMPORT_BIT) as usize;
            match self.archive.imports().get(i) {
                Some(imp) if !imp.full_name.is_empty() => imp.full_name.clone(),
                _ => format!("import:{i}"),
            }
        } else {
            match self.debug.get(f as usize) {
                Some(n) if !n.is_empty() => format!("{module}.{n}"),
                _ => format!("{module}:{f}"),
            }
        }
    }
    fn ty(&self, t: u32) -> String {
        self.archive
            .types()
            .get(t as usize)
            .cloned()
            .unwrap_or_else(|| "*".into())
    }
    fn block(&self, target: u32) -> String {
        match self.blocks.binary_search(&target) {
            Ok(i) => format!("^bb{i}"),
            Err(_) => format!("^{target:08X}"),
        }
    }
    fn rodata_len(&self, r: u32) -> usize {
        self.archive
            .rodata_segments()
            .get(r as usize)
            .map_or(0, |s| s.len)
    }
}

fn format_insn(insn: &RawInsn, n: &Names<'_>) -> String {
    use Operand as O;
    let mn = format!("vm.{}", insn.op.mnemonic());
    let ops = &insn.operands;
    let reg = |o: &Operand| match *o {
        O::Reg {
            bank,
            allow_move,
            reg,
            ..
        } => reg_name(reg, bank, allow_move),
        _ => String::new(),
    };
    let result = ops
        .iter()
        .rev()
        .find(|o| matches!(o, O::Reg { write: true, .. }))
        .map(reg)
        .unwrap_or_default();
    let reads: Vec<&Operand> = ops
        .iter()
        .filter(|o| matches!(o, O::Reg { write: false, .. }))
        .collect();
    let ty = ops
        .iter()
        .find_map(|o| match o {
            O::Type(t) => Some(n.ty(*t)),
            _ => None,
        })
        .unwrap_or_default();
    let attr = ops
        .iter()
        .find_map(|o| match o {
            O::Global(g) | O::Func(g) | O::Rodata(g) => Some(*g),
            _ => None,
        })
        .unwrap_or(0);
    let lists: Vec<&Vec<u16>> = ops
        .iter()
        .filter_map(|o| match o {
            O::List { regs, .. } => Some(regs),
            _ => None,
        })
        .collect();
    let results_list = ops
        .iter()
        .find_map(|o| match o {
            O::List {
                results: true,
                regs,
                ..
            } => Some(regs.as_slice()),
            _ => None,
        })
        .unwrap_or(&[]);
    let targets: Vec<String> = {
        let mut v = Vec::new();
        let mut i = 0;
        while i < ops.len() {
            if let O::Target(t) = ops[i] {
                let remap = match ops.get(i + 1) {
                    Some(O::Remap(p)) => remap_names(p),
                    _ => String::new(),
                };
                v.push(format!("{}({remap})", n.block(t)));
            }
            i += 1;
        }
        v
    };
    let string = ops
        .iter()
        .find_map(|o| match o {
            O::Str(s) => Some(s.clone()),
            _ => None,
        })
        .unwrap_or_default();
    let r = |i: usize| reads.get(i).map(|o| reg(o)).unwrap_or_default();
    let with_results = |body: String| {
        if results_list.is_empty() {
            body
        } else {
            format!("{} = {body}", list_names(results_list))
        }
    };
    match insn.op {
        Op::Block => String::new(),
        Op::GlobalLoadI32 | Op::GlobalLoadI64 | Op::GlobalLoadF32 | Op::GlobalLoadF64 => {
            format!("{result} = {mn} .rwdata[{attr}]")
        }
        Op::GlobalStoreI32 | Op::GlobalStoreI64 | Op::GlobalStoreF32 | Op::GlobalStoreF64 => {
            format!("{mn} {}, .rwdata[{attr}]", r(0))
        }
        Op::GlobalLoadIndirectI32
        | Op::GlobalLoadIndirectI64
        | Op::GlobalLoadIndirectF32
        | Op::GlobalLoadIndirectF64 => format!("{result} = {mn} .rwdata[{}]", r(0)),
        Op::GlobalStoreIndirectI32
        | Op::GlobalStoreIndirectI64
        | Op::GlobalStoreIndirectF32
        | Op::GlobalStoreIndirectF64 => format!("{mn} {}, .rwdata[{}]", r(1), r(0)),
        Op::GlobalLoadRef => format!("{result} = {mn} .refs[{attr}] : {ty}"),
        Op::GlobalStoreRef => format!("{mn} {}, .refs[{attr}] : {ty}", r(0)),
        Op::GlobalLoadIndirectRef => format!("{result} = {mn} .refs[{}] : {ty}", r(0)),
        Op::GlobalStoreIndirectRef => format!("{mn} {}, .refs[{}] : {ty}", r(1), r(0)),
        Op::ConstI32 | Op::ConstI64 | Op::ConstF32 | Op::ConstF64 => {
            let bits = ops
                .iter()
                .find_map(|o| match o {
                    O::Imm(_, b) => Some(*b),
                    _ => None,
                })
                .unwrap_or(0);
            let text = match insn.op {
                Op::ConstI32 => format!("{}  // 0x{:08X}", bits as u32 as i32, bits as u32),
                Op::ConstI64 => format!("{}  // 0x{:016X}", bits as i64, bits),
                Op::ConstF32 => format_g(f32::from_bits(bits as u32) as f64, 9),
                _ => format_g(f64::from_bits(bits), 17),
            };
            format!("{result} = {mn} {text}")
        }
        Op::ConstRefRodata => {
            format!("{result} = {mn} {attr}  // {}b", n.rodata_len(attr))
        }
        Op::SelectI32 | Op::SelectI64 | Op::SelectF32 | Op::SelectF64 => {
            format!("{result} = {mn} {} ? {} : {}", r(0), r(1), r(2))
        }
        Op::SelectRef => format!("{result} = {mn} {} ? {} : {} -> {ty}", r(0), r(1), r(2)),
        Op::SwitchI32 | Op::SwitchI64 | Op::SwitchF32 | Op::SwitchF64 => format!(
            "{result} = {mn} {}[{}] else {}",
            r(0),
            list_names(lists.first().map_or(&[][..], |l| l)),
            r(1)
        ),
        Op::SwitchRef => format!(
            "{result} = {mn} {}[{}] else {} -> {ty}",
            r(0),
            list_names(lists.first().map_or(&[][..], |l| l)),
            r(1)
        ),
        Op::ListAlloc => format!("{result} = {mn} {} : !vm.list<{ty}>", r(0)),
        Op::ListGetRef => format!("{result} = {mn} {}, {} : {ty}", r(0), r(1)),
        Op::CastAnyRef => format!("{result} = {mn} {} : !vm.ref<?> -> {ty}", r(0)),
        Op::BufferStoreI8
        | Op::BufferStoreI16
        | Op::BufferStoreI32
        | Op::BufferStoreI64
        | Op::BufferStoreF32
        | Op::BufferStoreF64 => format!("{mn} {}, {}, {}", r(2), r(0), r(1)),
        Op::Call => with_results(format!(
            "{mn} @{}({})",
            n.func(attr),
            list_names(lists.first().map_or(&[][..], |l| l))
        )),
        Op::CallYieldable => format!(
            "{mn} @{}({}) -> {}({})",
            n.func(attr),
            list_names(lists.first().map_or(&[][..], |l| l)),
            ops.iter()
                .find_map(|o| match o {
                    O::Target(t) => Some(n.block(*t)),
                    _ => None,
                })
                .unwrap_or_default(),
            list_names(results_list)
        ),
        Op::CallVariadic | Op::CallVariadicYieldable => {
            let segs = lists
                .first()
                .map(|l| {
                    l.iter()
                        .map(|s| s.to_string())
                        .collect::<Vec<_>>()
                        .join(", ")
                })
                .unwrap_or_default();
            let args = list_names(lists.get(1).map_or(&[][..], |l| l));
            let head = format!("{mn} @{} segments[{segs}]({args})", n.func(attr));
            if insn.op == Op::CallVariadic {
                with_results(head)
            } else {
                let t = ops
                    .iter()
                    .find_map(|o| match o {
                        O::Target(t) => Some(n.block(*t)),
                        _ => None,
                    })
                    .unwrap_or_default();
                format!("{head} -> {t}({})", list_names(results_list))
            }
        }
        Op::ImportResolved => format!("{result} = {mn} @{}", n.func(attr)),
        Op::Return | Op::DiscardRefs => {
            let l = list_names(lists.first().map_or(&[][..], |l| l));
            if l.is_empty() {
                mn
            } else {
                format!("{mn} {l}")
            }
        }
        Op::Fail => format!("{mn} {}, \"{string}\"", r(0)),
        Op::Trace | Op::Print => format!(
            "{mn} \"{string}\"({})",
            list_names(lists.first().map_or(&[][..], |l| l))
        ),
        Op::Branch | Op::Yield | Op::Break => {
            format!("{mn} {}", targets.join(", "))
        }
        Op::CondBranch | Op::CondBreak => {
            format!("{mn} {}, {}", r(0), targets.join(", "))
        }
        Op::BranchTable => {
            let mut s = format!("{mn} {} {{ default: {}", r(0), targets.join(", "));
            if let Some(O::Cases(cases)) = ops.last() {
                for (i, (t, p)) in cases.iter().enumerate() {
                    let _ = write!(s, ", {i}: {}({})", n.block(*t), remap_names(p));
                }
            }
            s.push_str(" }");
            s
        }
        _ => {
            let args = reads.iter().map(|o| reg(o)).collect::<Vec<_>>().join(", ");
            let mut s = if result.is_empty() {
                mn
            } else {
                format!("{result} = {mn}")
            };
            if !args.is_empty() {
                s.push(' ');
                s.push_str(&args);
            }
            if !ty.is_empty() {
                let _ = write!(s, " : {ty}");
            }
            s
        }
    }
}

fn type_name(t: &CconvType) -> &'static str {
    match t {
        CconvType::I32 => "i32",
        CconvType::I64 => "i64",
        CconvType::F32 => "f32",
        CconvType::F64 => "f64",
        CconvType::Ref | CconvType::Span(_) => "!vm.ref<?>",
    }
}

/// The `vm.func @name(%i0: i32, ...) -> (...)` signature line.
fn signature_line(name: &str, cconv: Option<&Cconv>) -> String {
    let mut args = Vec::new();
    let mut results = Vec::new();
    if let Some(c) = cconv {
        let (mut i, mut r) = (0u32, 0u32);
        for t in &c.args {
            let reg = match t {
                CconvType::Ref | CconvType::Span(_) => {
                    r += 1;
                    format!("%r{}", r - 1)
                }
                CconvType::I64 | CconvType::F64 => {
                    i += 2;
                    format!("%i{}:{}", i - 2, i - 1)
                }
                _ => {
                    i += 1;
                    format!("%i{}", i - 1)
                }
            };
            args.push(format!("{reg}: {}", type_name(t)));
        }
        results = c.results.iter().map(type_name).collect();
    }
    format!(
        "vm.func @{name}({}) -> ({})",
        args.join(", "),
        results.join(", ")
    )
}

/// Disassembles one internal function: `vm.export` lines, the signature
/// line, then `^bbN:` blocks of instructions, and a closing `}`.
pub fn disassemble_function(
    module: &BytecodeModule,
    ordinal: usize,
    bytecode_offsets: bool,
) -> Result<String> {
    let archive = module.archive();
    let code = archive.function_bytecode(ordinal);
    let insns = decode_raw(code)?;
    let names = Names {
        archive,
        debug: debug_names(archive),
        blocks: insns
            .iter()
            .filter(|i| i.op == Op::Block)
            .map(|i| i.offset)
            .collect(),
    };
    let mut out = String::new();
    for e in archive.exports() {
        if e.internal_ordinal as usize == ordinal {
            let _ = writeln!(out, "vm.export @{}", e.local_name);
        }
    }
    let cconv = archive
        .function_signatures()
        .get(ordinal)
        .and_then(|s| s.calling_convention.as_deref())
        .and_then(|c| Cconv::parse(c).ok());
    let _ = writeln!(
        out,
        "{} {{",
        signature_line(
            &function_name(archive, &names.debug, ordinal),
            cconv.as_ref()
        )
    );
    let mut block = 0;
    for insn in &insns {
        if bytecode_offsets {
            let _ = write!(out, "[{:08X}]", insn.offset);
        }
        if insn.op == Op::Block {
            let _ = writeln!(out, "^bb{block}:");
            block += 1;
        } else {
            let _ = writeln!(out, "  {}", format_insn(insn, &names));
        }
    }
    out.push('}');
    Ok(out)
}

fn debug_names(archive: &Archive) -> Vec<String> {
    archive
        .debug_database()
        .map(|db| db.functions.iter().map(|f| f.local_name.clone()).collect())
        .unwrap_or_default()
}

/// Name of an internal function as the disassembly heads it: its first
/// export name, else its debug name, else `fnN`.
fn function_name(archive: &Archive, debug: &[String], ordinal: usize) -> String {
    if let Some(e) = archive
        .exports()
        .iter()
        .find(|e| e.internal_ordinal as usize == ordinal)
    {
        return e.local_name.clone();
    }
    match debug.get(ordinal) {
        Some(n) if !n.is_empty() => n.clone(),
        _ => format!("fn{ordinal}"),
    }
}

/// Disassembles a whole module the way `iree-dump-module
/// --output=disassembly` does: a `vm.module` preamble (types, imports with
/// their calling conventions, rodata as hex), then every function.
pub fn disassemble_module(module: &BytecodeModule, opts: &DisasmOptions) -> Result<String> {
    let archive = module.archive();
    let mut out = String::new();
    let _ = writeln!(
        out,
        "vm.module @{} version {}",
        archive.name(),
        archive.version()
    );
    for t in archive.types() {
        let _ = writeln!(out, "vm.type {t}");
    }
    for i in archive.imports() {
        let _ = write!(
            out,
            "vm.import {}@{}",
            if i.optional { "optional " } else { "" },
            i.full_name
        );
        if let Some(c) = &i.signature.calling_convention {
            let _ = write!(out, " cconv \"{c}\"");
        }
        out.push('\n');
    }
    for (i, s) in archive.rodata_segments().iter().enumerate() {
        let _ = write!(out, "vm.rodata[{i}] = ");
        for b in s.data(archive) {
            let _ = write!(out, "{b:02X}");
        }
        out.push('\n');
    }
    // A blank line follows the declarations (when there are any) and
    // separates functions.
    let has_decls = !archive.types().is_empty()
        || !archive.imports().is_empty()
        || !archive.rodata_segments().is_empty();
    if has_decls {
        out.push('\n');
    }
    let debug = debug_names(archive);
    let mut first = true;
    for i in 0..archive.function_descriptors().len() {
        if let Some(filter) = &opts.function {
            let by_ordinal = filter.parse::<usize>().ok() == Some(i);
            if !by_ordinal && *filter != function_name(archive, &debug, i) {
                continue;
            }
        }
        if !(first && has_decls) {
            out.push('\n');
        }
        first = false;
        out.push_str(&disassemble_function(module, i, opts.bytecode_offsets)?);
        out.push('\n');
    }
    Ok(out)
}

/// One function's ops as `--trace_execution` prints them: the function's
/// name (its first export, else its debug name, else `@N` as upstream
/// prints unnamed functions) and each op's bytecode offset and text, in
/// bytecode order. The text is the disassembly's (block markers as
/// `^bbN:`).
pub fn op_lines(module: &BytecodeModule, ordinal: usize) -> Result<(String, Vec<(u32, String)>)> {
    let archive = module.archive();
    let insns = decode_raw(archive.function_bytecode(ordinal))?;
    let names = Names {
        archive,
        debug: debug_names(archive),
        blocks: insns
            .iter()
            .filter(|i| i.op == Op::Block)
            .map(|i| i.offset)
            .collect(),
    };
    let exported = archive
        .exports()
        .iter()
        .find(|e| e.internal_ordinal as usize == ordinal)
        .map(|e| e.local_name.clone());
    let name = match exported.or_else(|| names.debug.get(ordinal).cloned()) {
        Some(n) if !n.is_empty() => format!(".{n}"),
        _ => format!("@{ordinal}"),
    };
    let mut block = 0;
    let lines = insns
        .iter()
        .map(|insn| {
            let text = if insn.op == Op::Block {
                block += 1;
                format!("^bb{}:", block - 1)
            } else {
                format_insn(insn, &names)
            };
            (insn.offset, text)
        })
        .collect();
    Ok((name, lines))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn format_g_matches_printf() {
        assert_eq!(format_g(107.5, 9), "107.5");
        assert_eq!(format_g(-0.0, 9), "-0");
        assert_eq!(format_g(0.000999500277, 9), "0.000999500277");
        assert_eq!(
            format_g(f32::from_bits(0x3A83126F) as f64, 9),
            "0.00100000005"
        );
        assert_eq!(format_g(0.1, 17), "0.10000000000000001");
        assert_eq!(format_g(-1e100, 17), "-1e+100");
        assert_eq!(format_g(1e-9, 17), "1.0000000000000001e-09");
        assert_eq!(format_g(123456789.0, 9), "123456789");
        assert_eq!(format_g(1234567890.0, 9), "1.23456789e+09");
        assert_eq!(format_g(f64::INFINITY, 9), "inf");
    }

    #[test]
    fn register_names() {
        assert_eq!(reg_name(3, Bank::I32, false), "%i3");
        assert_eq!(reg_name(4, Bank::I64, false), "%i4:5");
        assert_eq!(reg_name(REF_BIT | 2, Bank::Ref, true), "%r2");
        assert_eq!(reg_name(REF_BIT | MOVE_BIT | 2, Bank::Any, true), "%R2");
        assert_eq!(reg_name(REF_BIT | MOVE_BIT | 2, Bank::Ref, false), "%r2");
    }
}
