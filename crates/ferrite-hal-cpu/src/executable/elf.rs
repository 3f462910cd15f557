//! A defensive ELF64 (x86-64) shared-object loader.
//!
//! [`ElfFile::parse`] checks the file header and program headers against the
//! file; [`ElfFile::load`] reserves one private anonymous mapping spanning every
//! `PT_LOAD` segment, copies the segments in, reads the dynamic table, symbol
//! table and string table out of the image (every address checked against the
//! image), applies the `DT_RELA` and `DT_JMPREL` relocations (each target
//! checked to lie inside the image), and finally sets page protections: each
//! segment's R/W/X (readable always; a page wanted both writable and executable
//! is refused) and `PT_GNU_RELRO` read-only.
//!
//! Nothing in this module runs code from the image except
//! [`LoadedElf::run_initializers`], which is `unsafe`: the code is trusted (as
//! upstream), the parsing around it is not.

use ferrite_base::{Result, Status, StatusCode};
use std::ffi::CStr;

/// `PT_LOAD`.
pub const PT_LOAD: u32 = 1;
/// `PT_DYNAMIC`.
pub const PT_DYNAMIC: u32 = 2;
/// `PT_GNU_RELRO`.
pub const PT_GNU_RELRO: u32 = 0x6474_e552;
/// Segment flag: executable.
pub const PF_X: u32 = 1;
/// Segment flag: writable.
pub const PF_W: u32 = 2;
/// Segment flag: readable.
pub const PF_R: u32 = 4;

/// `R_X86_64_NONE`.
pub const R_X86_64_NONE: u32 = 0;
/// `R_X86_64_64`: S + A.
pub const R_X86_64_64: u32 = 1;
/// `R_X86_64_PC32`: S + A - P (32-bit signed).
pub const R_X86_64_PC32: u32 = 2;
/// `R_X86_64_GLOB_DAT`: S.
pub const R_X86_64_GLOB_DAT: u32 = 6;
/// `R_X86_64_JUMP_SLOT`: S.
pub const R_X86_64_JUMP_SLOT: u32 = 7;
/// `R_X86_64_RELATIVE`: B + A.
pub const R_X86_64_RELATIVE: u32 = 8;
/// `R_X86_64_32`: S + A (32-bit zero-extended).
pub const R_X86_64_32: u32 = 10;
/// `R_X86_64_32S`: S + A (32-bit sign-extended).
pub const R_X86_64_32S: u32 = 11;
/// `R_X86_64_PC64`: S + A - P.
pub const R_X86_64_PC64: u32 = 24;

const EHDR_SIZE: usize = 64;
const PHDR_SIZE: usize = 56;
const SHDR_SIZE: usize = 64;
const DYN_SIZE: usize = 16;
const SYM_SIZE: usize = 24;
const RELA_SIZE: usize = 24;

const DT_NULL: u64 = 0;
const DT_NEEDED: u64 = 1;
const DT_PLTRELSZ: u64 = 2;
const DT_HASH: u64 = 4;
const DT_STRTAB: u64 = 5;
const DT_SYMTAB: u64 = 6;
const DT_RELA: u64 = 7;
const DT_RELASZ: u64 = 8;
const DT_RELAENT: u64 = 9;
const DT_STRSZ: u64 = 10;
const DT_SYMENT: u64 = 11;
const DT_INIT: u64 = 12;
const DT_REL: u64 = 17;
const DT_RELSZ: u64 = 18;
const DT_PLTREL: u64 = 20;
const DT_JMPREL: u64 = 23;
const DT_INIT_ARRAY: u64 = 25;
const DT_INIT_ARRAYSZ: u64 = 27;
const DT_RELR: u64 = 36;
const DT_GNU_HASH: u64 = 0x6fff_fef5;

const SHN_UNDEF: u16 = 0;
const SHN_ABS: u16 = 0xfff1;
const STB_GLOBAL: u8 = 1;
const STB_WEAK: u8 = 2;
const STT_FUNC: u8 = 2;

/// Largest image (sum of the `PT_LOAD` address span) this loader maps.
pub const MAX_IMAGE_SIZE: u64 = 1 << 30;
/// Largest segment alignment honoured.
pub const MAX_SEGMENT_ALIGN: u64 = 1 << 21;

fn precondition(msg: impl Into<String>) -> Status {
    Status::new(StatusCode::FailedPrecondition, msg)
}

fn out_of_range(msg: impl Into<String>) -> Status {
    Status::new(StatusCode::OutOfRange, msg)
}

fn rd_u16(d: &[u8], at: usize) -> Option<u16> {
    Some(u16::from_le_bytes(
        d.get(at..at.checked_add(2)?)?.try_into().ok()?,
    ))
}
fn rd_u32(d: &[u8], at: usize) -> Option<u32> {
    Some(u32::from_le_bytes(
        d.get(at..at.checked_add(4)?)?.try_into().ok()?,
    ))
}
fn rd_u64(d: &[u8], at: usize) -> Option<u64> {
    Some(u64::from_le_bytes(
        d.get(at..at.checked_add(8)?)?.try_into().ok()?,
    ))
}

/// The fields of the ELF file header this loader uses.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ElfHeader {
    /// `e_type` (3 = shared object).
    pub e_type: u16,
    /// `e_machine` (0x3E = x86-64).
    pub e_machine: u16,
    /// Program header table offset.
    pub e_phoff: u64,
    /// Section header table offset.
    pub e_shoff: u64,
    /// Number of program headers.
    pub e_phnum: u16,
    /// Number of section headers.
    pub e_shnum: u16,
}

/// A program header.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ProgramHeader {
    /// `p_type`.
    pub p_type: u32,
    /// `p_flags` (`PF_*`).
    pub p_flags: u32,
    /// File offset of the segment's bytes.
    pub p_offset: u64,
    /// Virtual address.
    pub p_vaddr: u64,
    /// Bytes in the file.
    pub p_filesz: u64,
    /// Bytes in memory (the rest zero-filled).
    pub p_memsz: u64,
    /// Alignment.
    pub p_align: u64,
}

/// A parsed (not yet loaded) ELF file.
#[derive(Debug)]
pub struct ElfFile<'a> {
    data: &'a [u8],
    /// The file header.
    pub header: ElfHeader,
    /// Every program header.
    pub program_headers: Vec<ProgramHeader>,
}

impl<'a> ElfFile<'a> {
    /// Parses and checks the file header and program header table of a 64-bit
    /// little-endian x86-64 shared object.
    pub fn parse(data: &'a [u8]) -> Result<ElfFile<'a>> {
        if data.len() < EHDR_SIZE {
            return Err(precondition(format!(
                "ELF data ({} bytes) smaller than the file header ({EHDR_SIZE})",
                data.len()
            )));
        }
        if data[..4] != super::container::ELF_MAGIC {
            return Err(precondition("data does not start with the ELF magic"));
        }
        if data[4] != 2 {
            return Err(precondition(format!(
                "ELF class {} unsupported; expected 64-bit (2)",
                data[4]
            )));
        }
        if data[5] != 1 {
            return Err(precondition(format!(
                "ELF data encoding {} unsupported; expected little-endian (1)",
                data[5]
            )));
        }
        let field16 = |at| rd_u16(data, at).unwrap_or(0);
        let e_type = field16(16);
        let e_machine = field16(18);
        let e_version = rd_u32(data, 20).unwrap_or(0);
        let e_phoff = rd_u64(data, 32).unwrap_or(0);
        let e_shoff = rd_u64(data, 40).unwrap_or(0);
        let e_ehsize = field16(52);
        let e_phentsize = field16(54);
        let e_phnum = field16(56);
        let e_shentsize = field16(58);
        let e_shnum = field16(60);
        if e_version != 1 {
            return Err(precondition(format!(
                "ELF version {e_version} unsupported; expected 1"
            )));
        }
        if e_machine != super::container::EM_X86_64 {
            return Err(precondition(format!(
                "ELF machine {e_machine:#06x} does not match the host (x86-64, 0x003e)"
            )));
        }
        if e_type != 3 {
            return Err(precondition(format!(
                "ELF type {e_type} unsupported; only shared objects (3)"
            )));
        }
        if e_ehsize as usize != EHDR_SIZE || e_phentsize as usize != PHDR_SIZE {
            return Err(precondition(format!(
                "ELF entity size mismatch (ehsize {e_ehsize}, phentsize {e_phentsize})"
            )));
        }
        let in_file = |off: u64, count: u16, size: usize| -> bool {
            (count as u64)
                .checked_mul(size as u64)
                .and_then(|n| off.checked_add(n))
                .is_some_and(|end| end <= data.len() as u64)
        };
        if e_phoff == 0 || e_phnum == 0 || !in_file(e_phoff, e_phnum, PHDR_SIZE) {
            return Err(precondition(format!(
                "invalid program header table (offset {e_phoff}, {e_phnum} entries, file {} bytes)",
                data.len()
            )));
        }
        if e_shnum != 0
            && (e_shentsize as usize != SHDR_SIZE || !in_file(e_shoff, e_shnum, SHDR_SIZE))
        {
            return Err(precondition(format!(
                "invalid section header table (offset {e_shoff}, {e_shnum} entries of {e_shentsize} bytes)"
            )));
        }
        let mut program_headers = Vec::with_capacity(e_phnum as usize);
        for i in 0..e_phnum as usize {
            let at = e_phoff as usize + i * PHDR_SIZE;
            let p = &data[at..at + PHDR_SIZE];
            let ph = ProgramHeader {
                p_type: rd_u32(p, 0).unwrap_or(0),
                p_flags: rd_u32(p, 4).unwrap_or(0),
                p_offset: rd_u64(p, 8).unwrap_or(0),
                p_vaddr: rd_u64(p, 16).unwrap_or(0),
                p_filesz: rd_u64(p, 32).unwrap_or(0),
                p_memsz: rd_u64(p, 40).unwrap_or(0),
                p_align: rd_u64(p, 48).unwrap_or(0),
            };
            if ph.p_type == PT_LOAD {
                if ph.p_filesz > ph.p_memsz {
                    return Err(precondition(format!(
                        "segment {i}: file size {} exceeds memory size {}",
                        ph.p_filesz, ph.p_memsz
                    )));
                }
                if ph
                    .p_offset
                    .checked_add(ph.p_filesz)
                    .is_none_or(|e| e > data.len() as u64)
                {
                    return Err(precondition(format!(
                        "segment {i}: file range {}+{} outside the {} byte file",
                        ph.p_offset,
                        ph.p_filesz,
                        data.len()
                    )));
                }
                if ph
                    .p_vaddr
                    .checked_add(ph.p_memsz)
                    .is_none_or(|e| e > MAX_IMAGE_SIZE * 4)
                {
                    return Err(precondition(format!(
                        "segment {i}: address range {:#x}+{:#x} unsupported",
                        ph.p_vaddr, ph.p_memsz
                    )));
                }
                if ph.p_align > 1
                    && (!ph.p_align.is_power_of_two() || ph.p_align > MAX_SEGMENT_ALIGN)
                {
                    return Err(precondition(format!(
                        "segment {i}: alignment {} unsupported",
                        ph.p_align
                    )));
                }
                if ph.p_flags & PF_W != 0 && ph.p_flags & PF_X != 0 {
                    return Err(Status::new(
                        StatusCode::PermissionDenied,
                        format!("segment {i} is both writable and executable"),
                    ));
                }
            }
            program_headers.push(ph);
        }
        if !program_headers.iter().any(|p| p.p_type == PT_LOAD) {
            return Err(precondition("ELF has no PT_LOAD segment"));
        }
        // Loadable segments come in ascending address order and never share
        // bytes (the ELF specification's rule): overlapping segments would let
        // one segment's file bytes overwrite another's, e.g. data over code.
        let mut prev_end: Option<(usize, u64)> = None;
        for (i, p) in program_headers.iter().enumerate() {
            if p.p_type != PT_LOAD {
                continue;
            }
            if let Some((j, end)) = prev_end {
                if p.p_vaddr < end {
                    return Err(precondition(format!(
                        "segment {i} at {:#x} overlaps or precedes segment {j} (which ends at {end:#x}); PT_LOAD segments must be sorted and disjoint",
                        p.p_vaddr
                    )));
                }
            }
            // Checked above: no overflow.
            prev_end = Some((i, p.p_vaddr + p.p_memsz));
        }
        Ok(ElfFile {
            data,
            header: ElfHeader {
                e_type,
                e_machine,
                e_phoff,
                e_shoff,
                e_phnum,
                e_shnum,
            },
            program_headers,
        })
    }

    /// The raw file bytes.
    pub fn data(&self) -> &'a [u8] {
        self.data
    }

    /// The file offset holding virtual address `vaddr` (within a `PT_LOAD`
    /// segment's file bytes), if any.
    pub fn file_offset_of(&self, vaddr: u64) -> Option<usize> {
        self.program_headers
            .iter()
            .filter(|p| p.p_type == PT_LOAD)
            .find(|p| vaddr >= p.p_vaddr && vaddr - p.p_vaddr < p.p_filesz)
            .map(|p| (p.p_offset + (vaddr - p.p_vaddr)) as usize)
    }

    /// Maps, relocates and protects the image. Runs no code from it.
    pub fn load(&self) -> Result<LoadedElf> {
        load(self)
    }
}

/// Pages reserved with `mmap`, released on drop.
struct Mapping {
    ptr: *mut u8,
    len: usize,
}

impl Drop for Mapping {
    fn drop(&mut self) {
        // SAFETY: `ptr..ptr+len` is exactly the anonymous mapping created in
        // `Mapping::new`, owned by this value; no pointer into it is used after
        // drop (LoadedElf owns the mapping and outlives every function pointer
        // it hands out through the library that holds it).
        unsafe {
            libc::munmap(self.ptr.cast(), self.len);
        }
    }
}

impl Mapping {
    fn new(len: usize) -> Result<Mapping> {
        // SAFETY: a fresh private anonymous mapping; no existing memory is
        // affected. The result is checked for MAP_FAILED.
        let ptr = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        if ptr == libc::MAP_FAILED {
            return Err(Status::new(
                StatusCode::ResourceExhausted,
                format!(
                    "mmap of {len} bytes for an ELF image failed: {}",
                    std::io::Error::last_os_error()
                ),
            ));
        }
        Ok(Mapping {
            ptr: ptr.cast(),
            len,
        })
    }
}

fn page_size() -> u64 {
    // SAFETY: sysconf has no preconditions.
    let p = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    if p > 0 && (p as u64).is_power_of_two() {
        p as u64
    } else {
        4096
    }
}

fn align_down(v: u64, a: u64) -> u64 {
    v & !(a - 1)
}

fn align_up(v: u64, a: u64) -> Option<u64> {
    Some(v.checked_add(a - 1)? & !(a - 1))
}

/// A loaded, relocated and protected ELF image.
pub struct LoadedElf {
    mapping: Mapping,
    /// Address of image offset 0 (= `bias + vaddr_min`).
    base: usize,
    size: usize,
    /// Lowest (page-aligned) virtual address of the image.
    vaddr_min: u64,
    /// The executable segments' file bytes (the only code), as image
    /// offsets.
    exec_ranges: Vec<(usize, usize)>,
    symtab: usize,
    sym_count: usize,
    strtab: usize,
    strsz: usize,
    init: Option<u64>,
    init_array: Vec<u64>,
}

impl std::fmt::Debug for LoadedElf {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LoadedElf")
            .field("base", &(self.base as *const u8))
            .field("size", &self.size)
            .field("symbols", &self.sym_count)
            .finish()
    }
}

/// Parsed `PT_DYNAMIC` information.
#[derive(Default)]
struct Dynamic {
    strtab: Option<u64>,
    strsz: Option<u64>,
    symtab: Option<u64>,
    hash: Option<u64>,
    gnu_hash: Option<u64>,
    rela: Option<u64>,
    relasz: u64,
    jmprel: Option<u64>,
    pltrelsz: u64,
    init: Option<u64>,
    init_array: Option<u64>,
    init_arraysz: u64,
}

/// The image as a byte slice with address helpers; used only during loading.
struct Image<'m> {
    bytes: &'m mut [u8],
    vaddr_min: u64,
    base: u64,
}

impl Image<'_> {
    /// Image offset of `vaddr..vaddr+len`, when entirely inside the image.
    fn offset(&self, vaddr: u64, len: u64) -> Option<usize> {
        let off = vaddr.checked_sub(self.vaddr_min)?;
        let end = off.checked_add(len)?;
        (end <= self.bytes.len() as u64).then_some(off as usize)
    }
    fn u32_at(&self, vaddr: u64) -> Option<u32> {
        rd_u32(self.bytes, self.offset(vaddr, 4)?)
    }
    fn u64_at(&self, vaddr: u64) -> Option<u64> {
        rd_u64(self.bytes, self.offset(vaddr, 8)?)
    }
    /// Runtime address of virtual address `vaddr`.
    fn addr(&self, vaddr: u64) -> u64 {
        self.base.wrapping_add(vaddr.wrapping_sub(self.vaddr_min))
    }
    fn table(&self, what: &str, vaddr: u64, len: u64) -> Result<usize> {
        self.offset(vaddr, len).ok_or_else(|| {
            out_of_range(format!(
                "{what} at {vaddr:#x} ({len} bytes) lies outside the image"
            ))
        })
    }
}

fn load(file: &ElfFile<'_>) -> Result<LoadedElf> {
    let page = page_size();
    let loads: Vec<&ProgramHeader> = file
        .program_headers
        .iter()
        .filter(|p| p.p_type == PT_LOAD)
        .collect();
    let align = loads.iter().map(|p| p.p_align).fold(page, u64::max);
    let lo = loads.iter().map(|p| p.p_vaddr).min().unwrap_or(0);
    let hi = loads
        .iter()
        .map(|p| p.p_vaddr + p.p_memsz)
        .max()
        .unwrap_or(0);
    let vaddr_min = align_down(lo, align);
    let vaddr_max = align_up(hi, page).ok_or_else(|| precondition("segment addresses overflow"))?;
    let size = vaddr_max - vaddr_min;
    if size == 0 || size > MAX_IMAGE_SIZE {
        return Err(Status::new(
            StatusCode::ResourceExhausted,
            format!("ELF image span of {size} bytes unsupported (limit {MAX_IMAGE_SIZE})"),
        ));
    }
    // Over-reserve so the image base can honour alignments above the page size.
    let reserve = (size + align - page) as usize;
    let mapping = Mapping::new(reserve)?;
    let base =
        align_up(mapping.ptr as u64, align).ok_or_else(|| precondition("address overflow"))?;
    let size = size as usize;
    // SAFETY: `base..base+size` lies inside the fresh read-write mapping owned by
    // `mapping`: mmap returns page-aligned memory, so aligning it up to `align`
    // skips at most `align - page` bytes, and `reserve = size + align - page`.
    // Nothing else references the mapping yet, and this slice is last used
    // before the protections change.
    let bytes = unsafe { std::slice::from_raw_parts_mut(base as *mut u8, size) };
    let mut image = Image {
        bytes,
        vaddr_min,
        base,
    };

    for p in &loads {
        let off = image
            .offset(p.p_vaddr, p.p_memsz)
            .ok_or_else(|| out_of_range("segment outside the image"))?;
        let src = &file.data[p.p_offset as usize..(p.p_offset + p.p_filesz) as usize];
        image.bytes[off..off + src.len()].copy_from_slice(src);
    }

    // Code: the file bytes of the executable segments, as image offsets.
    // Nothing outside them is ever called (page padding and the zero-filled
    // tail of a segment hold no code), and no relocation may write into them.
    let code: Vec<(usize, usize)> = loads
        .iter()
        .filter(|p| p.p_flags & PF_X != 0 && p.p_filesz > 0)
        .map(|p| {
            let start = (p.p_vaddr - vaddr_min) as usize;
            (start, start + p.p_filesz as usize)
        })
        .collect();
    if code.is_empty() {
        return Err(precondition(
            "ELF has no executable segment with file bytes",
        ));
    }

    // Dynamic table.
    let dyn_ph = file
        .program_headers
        .iter()
        .find(|p| p.p_type == PT_DYNAMIC)
        .ok_or_else(|| precondition("no PT_DYNAMIC segment"))?;
    let dyn_count = (dyn_ph.p_filesz / DYN_SIZE as u64) as usize;
    if dyn_count == 0 {
        return Err(precondition("empty PT_DYNAMIC segment"));
    }
    let dyn_off = image.table(
        "dynamic table",
        dyn_ph.p_vaddr,
        (dyn_count * DYN_SIZE) as u64,
    )?;
    let mut d = Dynamic::default();
    let mut plt_rel_kind = None;
    for i in 0..dyn_count {
        let at = dyn_off + i * DYN_SIZE;
        let tag = rd_u64(image.bytes, at).unwrap_or(0);
        let val = rd_u64(image.bytes, at + 8).unwrap_or(0);
        match tag {
            DT_NULL => break,
            DT_NEEDED => {
                return Err(Status::new(
                    StatusCode::Unavailable,
                    "ELF depends on other shared objects (DT_NEEDED); not supported",
                ))
            }
            DT_STRTAB => d.strtab = Some(val),
            DT_STRSZ => d.strsz = Some(val),
            DT_SYMTAB => d.symtab = Some(val),
            DT_SYMENT if val != SYM_SIZE as u64 => {
                return Err(precondition(format!("DT_SYMENT {val} != {SYM_SIZE}")))
            }
            DT_HASH => d.hash = Some(val),
            DT_GNU_HASH => d.gnu_hash = Some(val),
            DT_RELA => d.rela = Some(val),
            DT_RELASZ => d.relasz = val,
            DT_RELAENT if val != RELA_SIZE as u64 => {
                return Err(precondition(format!("DT_RELAENT {val} != {RELA_SIZE}")))
            }
            DT_JMPREL => d.jmprel = Some(val),
            DT_PLTRELSZ => d.pltrelsz = val,
            DT_PLTREL => plt_rel_kind = Some(val),
            DT_REL | DT_RELSZ => {
                return Err(precondition(
                    "DT_REL relocations unsupported (x86-64 uses RELA)",
                ))
            }
            DT_RELR => {
                return Err(Status::new(
                    StatusCode::Unimplemented,
                    "DT_RELR (packed relative relocations) unsupported",
                ))
            }
            DT_INIT => d.init = Some(val),
            DT_INIT_ARRAY => d.init_array = Some(val),
            DT_INIT_ARRAYSZ => d.init_arraysz = val,
            _ => {}
        }
    }
    if d.jmprel.is_some() && plt_rel_kind.is_some_and(|k| k != DT_RELA) {
        return Err(precondition("DT_PLTREL is not DT_RELA"));
    }

    // Symbol and string tables.
    let (Some(strtab), Some(strsz), Some(symtab)) = (d.strtab, d.strsz, d.symtab) else {
        return Err(precondition(
            "missing DT_STRTAB/DT_STRSZ/DT_SYMTAB in the dynamic table",
        ));
    };
    let strtab_off = image.table(".dynstr", strtab, strsz)?;
    let sym_count = symbol_count(&image, &d, symtab)?;
    let symtab_off = image.table(
        ".dynsym",
        symtab,
        (sym_count as u64).saturating_mul(SYM_SIZE as u64),
    )?;
    let sym = |i: usize| -> Symbol {
        let at = symtab_off + i * SYM_SIZE;
        Symbol {
            name: rd_u32(image.bytes, at).unwrap_or(0),

            shndx: rd_u16(image.bytes, at + 6).unwrap_or(0),
            value: rd_u64(image.bytes, at + 8).unwrap_or(0),
        }
    };
    let strings = &image.bytes[strtab_off..strtab_off + strsz as usize];
    for i in 1..sym_count {
        let s = sym(i);
        if s.shndx == SHN_UNDEF && s.name != 0 {
            let name = c_str_in(strings, s.name as usize).map(|c| c.to_string_lossy().into_owned());
            return Err(Status::new(
                StatusCode::Unavailable,
                format!(
                    "ELF imports symbol '{}'; symbol imports are not supported",
                    name.unwrap_or_else(|| "?".into())
                ),
            ));
        }
    }

    // Relocations.
    let symbols: Vec<Symbol> = (0..sym_count).map(sym).collect();
    for (what, table, len) in [
        (".rela.dyn", d.rela, d.relasz),
        (".rela.plt", d.jmprel, d.pltrelsz),
    ] {
        let Some(table) = table else { continue };
        if len % RELA_SIZE as u64 != 0 {
            return Err(precondition(format!(
                "{what} size {len} not a multiple of {RELA_SIZE}"
            )));
        }
        let off = image.table(what, table, len)?;
        for i in 0..(len as usize / RELA_SIZE) {
            let at = off + i * RELA_SIZE;
            let r_offset = rd_u64(image.bytes, at).unwrap_or(0);
            let r_info = rd_u64(image.bytes, at + 8).unwrap_or(0);
            let r_addend = rd_u64(image.bytes, at + 16).unwrap_or(0);
            apply_rela(&mut image, &code, &symbols, r_offset, r_info, r_addend)
                .map_err(|e| e.annotate(format!("{what} entry {i}")))?;
        }
    }

    // Initializers (addresses read after relocation).
    let mut init_array = Vec::new();
    if let Some(arr) = d.init_array {
        if d.init_arraysz % 8 != 0 {
            return Err(precondition("DT_INIT_ARRAYSZ not a multiple of 8"));
        }
        image.table("init array", arr, d.init_arraysz)?;
        for i in 0..d.init_arraysz / 8 {
            let v = image.u64_at(arr + i * 8).unwrap_or(0);
            if v != 0 && v != u64::MAX {
                let in_code = v.checked_sub(image.base).is_some_and(|off| {
                    code.iter().any(|&(s, e)| off >= s as u64 && off < e as u64)
                });
                if !in_code {
                    return Err(out_of_range(format!(
                        "DT_INIT_ARRAY entry {i} ({v:#x}) does not point into an executable segment"
                    )));
                }
                init_array.push(v);
            }
        }
    }
    // The mutable view of the image (`image.bytes`) is not used past this point.
    let image_base = image.base;

    // Protections: per page, the union of the flags of the segments covering it.
    let pages = size / page as usize;
    let mut page_flags = vec![0u32; pages];
    for p in &loads {
        if p.p_memsz == 0 {
            continue;
        }
        let first = (align_down(p.p_vaddr, page) - vaddr_min) / page;
        let last = (align_up(p.p_vaddr + p.p_memsz, page).unwrap_or(vaddr_max) - vaddr_min) / page;
        for f in &mut page_flags[first as usize..last as usize] {
            *f |= p.p_flags & (PF_W | PF_X);
        }
    }
    if page_flags.iter().any(|f| *f & PF_W != 0 && *f & PF_X != 0) {
        return Err(Status::new(
            StatusCode::PermissionDenied,
            "a writable and an executable segment share a page",
        ));
    }
    let mut i = 0;
    while i < pages {
        let f = page_flags[i];
        let mut j = i + 1;
        while j < pages && page_flags[j] == f {
            j += 1;
        }
        let mut prot = libc::PROT_READ;
        if f & PF_W != 0 {
            prot |= libc::PROT_WRITE;
        }
        if f & PF_X != 0 {
            prot |= libc::PROT_EXEC;
        }
        protect(
            image_base as usize + i * page as usize,
            (j - i) * page as usize,
            prot,
        )?;
        i = j;
    }
    for p in file
        .program_headers
        .iter()
        .filter(|p| p.p_type == PT_GNU_RELRO)
    {
        let start = align_up(p.p_vaddr, page).unwrap_or(u64::MAX);
        let end = align_down(p.p_vaddr.saturating_add(p.p_memsz), page);
        if start >= end || start < vaddr_min || end > vaddr_max {
            continue;
        }
        let first = ((start - vaddr_min) / page) as usize;
        let last = ((end - vaddr_min) / page) as usize;
        if page_flags[first..last].iter().any(|f| *f & PF_X != 0) {
            continue; // never strip execute permission from code
        }
        protect(
            image_base as usize + first * page as usize,
            (last - first) * page as usize,
            libc::PROT_READ,
        )?;
    }

    let init = d.init.filter(|v| *v != 0);
    if let Some(v) = init {
        let in_code = v
            .checked_sub(vaddr_min)
            .is_some_and(|off| code.iter().any(|&(s, e)| off >= s as u64 && off < e as u64));
        if !in_code {
            return Err(out_of_range(format!(
                "DT_INIT ({v:#x}) does not point into an executable segment"
            )));
        }
    }
    Ok(LoadedElf {
        mapping,
        base: image_base as usize,
        size,
        vaddr_min,
        exec_ranges: code,
        symtab: symtab_off,
        sym_count,
        strtab: strtab_off,
        strsz: strsz as usize,
        init,
        init_array,
    })
}

fn protect(addr: usize, len: usize, prot: libc::c_int) -> Result<()> {
    // SAFETY: `addr..addr+len` is a page-aligned range inside the mapping owned
    // by the image being loaded; no Rust reference into it is live.
    let rc = unsafe { libc::mprotect(addr as *mut libc::c_void, len, prot) };
    if rc != 0 {
        return Err(Status::new(
            StatusCode::Internal,
            format!("mprotect failed: {}", std::io::Error::last_os_error()),
        ));
    }
    Ok(())
}

#[derive(Clone, Copy)]
struct Symbol {
    name: u32,

    shndx: u16,
    value: u64,
}

fn c_str_in(bytes: &[u8], at: usize) -> Option<&CStr> {
    CStr::from_bytes_until_nul(bytes.get(at..)?).ok()
}

fn symbol_count(image: &Image<'_>, d: &Dynamic, symtab: u64) -> Result<usize> {
    let max = image.bytes.len() / SYM_SIZE;
    let count = if let Some(hash) = d.hash {
        image
            .u32_at(hash.wrapping_add(4))
            .ok_or_else(|| out_of_range("DT_HASH outside the image"))? as usize
    } else if let Some(gh) = d.gnu_hash {
        gnu_hash_count(image, gh).ok_or_else(|| out_of_range("DT_GNU_HASH table malformed"))?
    } else {
        return Err(precondition(
            "no DT_HASH or DT_GNU_HASH to size the symbol table",
        ));
    };
    if count == 0 || count > max {
        return Err(out_of_range(format!(
            "symbol count {count} invalid for the image"
        )));
    }
    let _ = symtab;
    Ok(count)
}

/// Symbol count implied by a GNU hash table: one past the highest symbol
/// reachable from any bucket's chain.
fn gnu_hash_count(image: &Image<'_>, gh: u64) -> Option<usize> {
    let nbuckets = image.u32_at(gh)? as u64;
    let symoffset = image.u32_at(gh + 4)? as u64;
    let bloom_size = image.u32_at(gh + 8)? as u64;
    let buckets = gh
        .checked_add(16)?
        .checked_add(bloom_size.checked_mul(8)?)?;
    let chains = buckets.checked_add(nbuckets.checked_mul(4)?)?;
    image.offset(buckets, nbuckets * 4)?;
    let mut max_sym = 0u64;
    for b in 0..nbuckets {
        max_sym = max_sym.max(image.u32_at(buckets + b * 4)? as u64);
    }
    if max_sym < symoffset {
        return Some(symoffset as usize);
    }
    let limit = (image.bytes.len() / SYM_SIZE) as u64;
    let mut idx = max_sym;
    loop {
        if idx > limit {
            return None;
        }
        let v = image.u32_at(chains.checked_add((idx - symoffset).checked_mul(4)?)?)?;
        if v & 1 != 0 {
            return Some(idx as usize + 1);
        }
        idx += 1;
    }
}

fn apply_rela(
    image: &mut Image<'_>,
    code: &[(usize, usize)],
    symbols: &[Symbol],
    r_offset: u64,
    r_info: u64,
    addend: u64,
) -> Result<()> {
    let kind = (r_info & 0xffff_ffff) as u32;
    let sym_index = (r_info >> 32) as usize;
    if kind == R_X86_64_NONE {
        return Ok(());
    }
    let s = if sym_index == 0 {
        0
    } else {
        let sym = symbols.get(sym_index).ok_or_else(|| {
            out_of_range(format!(
                "relocation names symbol {sym_index} of {}",
                symbols.len()
            ))
        })?;
        match sym.shndx {
            SHN_UNDEF => {
                return Err(precondition(format!(
                    "relocation against undefined symbol {sym_index}"
                )))
            }
            SHN_ABS => sym.value,
            _ => image.addr(sym.value),
        }
    };
    let width = match kind {
        R_X86_64_PC32 | R_X86_64_32 | R_X86_64_32S => 4,
        _ => 8,
    };
    let off = image.offset(r_offset, width).ok_or_else(|| {
        out_of_range(format!(
            "relocation target {r_offset:#x} (+{width}) lies outside the image"
        ))
    })?;
    if code
        .iter()
        .any(|&(s, e)| off < e && off + width as usize > s)
    {
        return Err(Status::new(
            StatusCode::PermissionDenied,
            format!("relocation target {r_offset:#x} lies in an executable segment (text relocations are refused)"),
        ));
    }
    let p = image.addr(r_offset);
    let value: u64 = match kind {
        R_X86_64_RELATIVE => image.addr(addend),
        R_X86_64_64 => s.wrapping_add(addend),
        R_X86_64_GLOB_DAT | R_X86_64_JUMP_SLOT => s,
        R_X86_64_PC64 => s.wrapping_add(addend).wrapping_sub(p),
        R_X86_64_32 => {
            let v = s.wrapping_add(addend);
            u32::try_from(v).map_err(|_| out_of_range("R_X86_64_32 value does not fit"))? as u64
        }
        R_X86_64_32S | R_X86_64_PC32 => {
            let v = if kind == R_X86_64_PC32 {
                s.wrapping_add(addend).wrapping_sub(p)
            } else {
                s.wrapping_add(addend)
            } as i64;
            i32::try_from(v)
                .map_err(|_| out_of_range("32-bit signed relocation value does not fit"))?
                as u32 as u64
        }
        other => {
            return Err(Status::new(
                StatusCode::Unimplemented,
                format!("x86-64 relocation type {other} unsupported"),
            ))
        }
    };
    image.bytes[off..off + width as usize].copy_from_slice(&value.to_le_bytes()[..width as usize]);
    Ok(())
}

impl LoadedElf {
    /// Address of the image's lowest mapped byte.
    pub fn base(&self) -> *const u8 {
        self.base as *const u8
    }

    /// Size of the image in bytes.
    pub fn size(&self) -> usize {
        self.size
    }

    /// The runtime address of the image's virtual address `vaddr`.
    pub fn address_of(&self, vaddr: u64) -> Option<usize> {
        let off = vaddr.checked_sub(self.vaddr_min)?;
        (off < self.size as u64).then(|| self.base + off as usize)
    }

    /// Whether `addr..addr+len` lies inside the image.
    pub fn contains(&self, addr: usize, len: usize) -> bool {
        addr >= self.base
            && addr
                .checked_add(len)
                .is_some_and(|e| e <= self.base + self.size)
    }

    /// Whether `addr` lies in the file bytes of an executable segment (page
    /// padding and a segment's zero-filled tail do not count).
    pub fn is_executable(&self, addr: usize) -> bool {
        addr.checked_sub(self.base)
            .is_some_and(|off| self.exec_ranges.iter().any(|(s, e)| off >= *s && off < *e))
    }

    /// The image bytes (every page is readable).
    pub fn bytes(&self) -> &[u8] {
        debug_assert!(self.mapping.len >= self.size);
        // SAFETY: `base..base+size` lies in `self.mapping`, which lives as long as
        // `self`, and every page of it was given at least PROT_READ. Pages marked
        // writable may be written by the executable's own code while it runs; we
        // only read immutable tables (headers, names, attributes) through this.
        unsafe { std::slice::from_raw_parts(self.base as *const u8, self.size) }
    }

    /// Reads a `T` at runtime address `addr`, if `addr..addr+size_of::<T>()` lies
    /// inside the image. `T` is plain old data ([`super::abi::ImagePod`]).
    pub fn read<T: super::abi::ImagePod>(&self, addr: usize) -> Option<T> {
        if !self.contains(addr, std::mem::size_of::<T>()) {
            return None;
        }
        // SAFETY: in bounds of the readable image (checked above); unaligned
        // read; `T: ImagePod` is valid for every bit pattern.
        Some(unsafe { std::ptr::read_unaligned(addr as *const T) })
    }

    /// The NUL-terminated string at runtime address `addr`, if it starts and
    /// ends inside the image.
    pub fn c_str_at(&self, addr: usize) -> Option<&CStr> {
        let off = addr.checked_sub(self.base)?;
        c_str_in(self.bytes(), off)
    }

    /// Runtime address of the defined global or weak dynamic symbol `name`.
    pub fn lookup_symbol(&self, name: &str) -> Option<usize> {
        let bytes = self.bytes();
        let strings = bytes.get(self.strtab..self.strtab + self.strsz)?;
        (1..self.sym_count).rev().find_map(|i| {
            let at = self.symtab + i * SYM_SIZE;
            let st_name = rd_u32(bytes, at)? as usize;
            let info = *bytes.get(at + 4)?;
            let shndx = rd_u16(bytes, at + 6)?;
            let value = rd_u64(bytes, at + 8)?;
            let bind = info >> 4;
            if (bind != STB_GLOBAL && bind != STB_WEAK) || shndx == SHN_UNDEF || st_name == 0 {
                return None;
            }
            if c_str_in(strings, st_name)?.to_bytes() != name.as_bytes() {
                return None;
            }
            self.address_of(value)
        })
    }

    /// Runtime address of the defined function symbol `name`, checked before
    /// anything jumps there: the symbol is a function (`STT_FUNC`) and its
    /// whole extent (at least one byte) lies inside one executable segment.
    pub fn lookup_function(&self, name: &str) -> Result<usize> {
        let not_found = || {
            Status::new(
                StatusCode::NotFound,
                format!("symbol '{name}' not exported"),
            )
        };
        let bytes = self.bytes();
        let strings = bytes
            .get(self.strtab..self.strtab + self.strsz)
            .ok_or_else(not_found)?;
        let index = (1..self.sym_count)
            .rev()
            .find(|&i| {
                let at = self.symtab + i * SYM_SIZE;
                let bind = bytes.get(at + 4).map_or(0, |b| b >> 4);
                let shndx = rd_u16(bytes, at + 6).unwrap_or(SHN_UNDEF);
                let st_name = rd_u32(bytes, at).unwrap_or(0) as usize;
                (bind == STB_GLOBAL || bind == STB_WEAK)
                    && shndx != SHN_UNDEF
                    && st_name != 0
                    && c_str_in(strings, st_name).is_some_and(|c| c.to_bytes() == name.as_bytes())
            })
            .ok_or_else(not_found)?;
        let at = self.symtab + index * SYM_SIZE;
        let kind = bytes.get(at + 4).map_or(0, |b| b & 0xf);
        let value = rd_u64(bytes, at + 8).unwrap_or(0);
        let size = rd_u64(bytes, at + 16).unwrap_or(0).max(1);
        if kind != STT_FUNC {
            return Err(precondition(format!(
                "symbol '{name}' has type {kind}, not a function (STT_FUNC)"
            )));
        }
        let start = value.checked_sub(self.vaddr_min);
        let end = start.and_then(|s| s.checked_add(size));
        let inside = start.zip(end).is_some_and(|(s, e)| {
            self.exec_ranges
                .iter()
                .any(|&(a, b)| s >= a as u64 && e <= b as u64)
        });
        if !inside {
            return Err(Status::new(
                StatusCode::OutOfRange,
                format!(
                    "symbol '{name}' ({value:#x}, {size} bytes) does not lie inside an executable segment"
                ),
            ));
        }
        Ok(self.base + start.unwrap_or(0) as usize)
    }

    /// Runs `DT_INIT` and the `DT_INIT_ARRAY` functions, in order. Entries
    /// outside the image's executable pages are refused before anything runs.
    ///
    /// # Safety
    /// Calls code from the image: the ELF must be a trusted executable whose
    /// initializers take no arguments and follow the C ABI.
    // SAFETY: the caller vouches the image is trusted (contract above); every
    // address called is first checked to lie in the image's executable pages.
    pub unsafe fn run_initializers(&self) -> Result<()> {
        let mut fns = Vec::new();
        if let Some(init) = self.init {
            fns.push(
                self.address_of(init)
                    .ok_or_else(|| out_of_range("DT_INIT outside the image"))?,
            );
        }
        // DT_INIT_ARRAY entries were read after relocation: runtime addresses.
        fns.extend(self.init_array.iter().map(|a| *a as usize));
        for &addr in &fns {
            if !self.is_executable(addr) {
                return Err(out_of_range(format!(
                    "initializer at {addr:#x} is not in executable pages"
                )));
            }
        }
        for addr in fns {
            // SAFETY: `addr` lies in an executable page of the image (checked);
            // the caller vouches that the image is trusted code whose
            // initializers are `void(void)` C functions.
            let f: unsafe extern "C" fn() =
                unsafe { std::mem::transmute::<usize, unsafe extern "C" fn()>(addr) };
            // SAFETY: see above.
            unsafe { f() };
        }
        Ok(())
    }
}
