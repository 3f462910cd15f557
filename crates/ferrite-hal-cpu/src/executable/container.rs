//! The container around a CPU executable's ELF.
//!
//! What `hal.executable.create` receives for the `embedded-elf-<arch>` format
//! (a rodata segment of the module) is one of:
//!
//! - a bare ELF64 shared object (what the compiler emits for one target), or
//! - a FatELF: a little-endian header `{ magic: u32 = 0x1F0E70FA, version: u16 = 1,
//!   record_count: u8, reserved: u8 }` followed by `record_count` 24-byte records
//!   `{ machine: u16, osabi: u8, osabi_version: u8, word_size: u8 (1 = 32-bit,
//!   2 = 64-bit), byte_order: u8 (0 = MSB, 1 = LSB), reserved: [u8; 2],
//!   offset: u64, size: u64 }`, each naming an ELF stored at `offset..offset+size`
//!   of the whole file; the first record matching the host is used.
//!
//! (In a `.vmfb` the external rodata is preceded by a ZIP local file header whose
//! extra field starts `ca fe`, padding the data to its alignment; that header is
//! part of the module file and lies outside the rodata range the archive reader
//! hands out, so it never reaches this parser.)
//!
//! Every offset and size is checked; malformed input is an error, never a panic.

use ferrite_base::{Result, Status, StatusCode};

/// The first bytes of an ELF file.
pub const ELF_MAGIC: [u8; 4] = [0x7F, b'E', b'L', b'F'];
/// The first bytes of a FatELF file (`0x1F0E70FA` little-endian).
pub const FATELF_MAGIC: [u8; 4] = [0xFA, 0x70, 0x0E, 0x1F];
/// The only FatELF version defined.
pub const FATELF_VERSION: u16 = 1;
/// Size of the FatELF header.
pub const FATELF_HEADER_SIZE: usize = 8;
/// Size of one FatELF record.
pub const FATELF_RECORD_SIZE: usize = 24;

/// `e_machine` of x86-64.
pub const EM_X86_64: u16 = 0x3E;
/// `e_machine` of i386.
pub const EM_386: u16 = 0x03;
/// `e_machine` of 32-bit ARM.
pub const EM_ARM: u16 = 0x28;
/// `e_machine` of AArch64.
pub const EM_AARCH64: u16 = 0xB7;
/// `e_machine` of RISC-V.
pub const EM_RISCV: u16 = 0xF3;

/// The executable format prefix served by this loader.
pub const FORMAT_PREFIX: &str = "embedded-elf-";
/// The architecture suffix of the host (the only one this loader runs).
pub const HOST_ARCH: &str = "x86_64";

fn invalid(msg: impl Into<String>) -> Status {
    Status::new(StatusCode::InvalidArgument, msg)
}

/// Whether `format` (e.g. `embedded-elf-x86_64`) names executables this
/// loader can run on the host.
pub fn supports_format(format: &str) -> bool {
    format
        .strip_prefix(FORMAT_PREFIX)
        .is_some_and(|arch| arch.starts_with(HOST_ARCH))
}

/// What kind of container `data` is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ContainerKind {
    /// A bare ELF file.
    Elf,
    /// A FatELF holding one ELF per architecture.
    FatElf,
}

/// Classifies `data` by its magic bytes.
pub fn detect(data: &[u8]) -> Result<ContainerKind> {
    match data.get(..4) {
        Some(m) if m == ELF_MAGIC => Ok(ContainerKind::Elf),
        Some(m) if m == FATELF_MAGIC => Ok(ContainerKind::FatElf),
        Some(m) => Err(invalid(format!(
            "executable data is neither an ELF nor a FatELF (starts {:02x?})",
            m
        ))),
        None => Err(invalid(format!(
            "executable data too short ({} bytes) for a magic number",
            data.len()
        ))),
    }
}

/// One FatELF record.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FatElfRecord {
    /// `e_machine` of the ELF.
    pub machine: u16,
    /// `e_ident[EI_OSABI]`.
    pub osabi: u8,
    /// `e_ident[EI_ABIVERSION]`.
    pub osabi_version: u8,
    /// 1 = 32-bit, 2 = 64-bit.
    pub word_size: u8,
    /// 0 = big-endian, 1 = little-endian.
    pub byte_order: u8,
    /// Offset of the ELF in the FatELF file.
    pub offset: u64,
    /// Size of the ELF.
    pub size: u64,
}

fn u16_at(data: &[u8], at: usize) -> Option<u16> {
    Some(u16::from_le_bytes(
        data.get(at..at.checked_add(2)?)?.try_into().ok()?,
    ))
}

fn u64_at(data: &[u8], at: usize) -> Option<u64> {
    Some(u64::from_le_bytes(
        data.get(at..at.checked_add(8)?)?.try_into().ok()?,
    ))
}

/// Parses a FatELF's record table (checking that every record's range lies
/// inside `data`, after the table).
pub fn parse_fatelf(data: &[u8]) -> Result<Vec<FatElfRecord>> {
    if data.get(..4) != Some(&FATELF_MAGIC[..]) {
        return Err(invalid("not a FatELF (bad magic)"));
    }
    let header = data.get(..FATELF_HEADER_SIZE).ok_or_else(|| {
        invalid(format!(
            "FatELF truncated: {} bytes, header needs 8",
            data.len()
        ))
    })?;
    let version = u16::from_le_bytes([header[4], header[5]]);
    if version != FATELF_VERSION {
        return Err(Status::new(
            StatusCode::Unimplemented,
            format!("FatELF version {version} unsupported (only {FATELF_VERSION})"),
        ));
    }
    let count = header[6] as usize;
    let table_end = FATELF_HEADER_SIZE + count * FATELF_RECORD_SIZE;
    if data.len() < table_end {
        return Err(invalid(format!(
            "FatELF truncated: {count} records need {table_end} bytes, have {}",
            data.len()
        )));
    }
    let mut records = Vec::with_capacity(count);
    for i in 0..count {
        let at = FATELF_HEADER_SIZE + i * FATELF_RECORD_SIZE;
        let r = &data[at..at + FATELF_RECORD_SIZE];
        let record = FatElfRecord {
            machine: u16_at(r, 0).unwrap_or(0),
            osabi: r[2],
            osabi_version: r[3],
            word_size: r[4],
            byte_order: r[5],
            offset: u64_at(r, 8).unwrap_or(0),
            size: u64_at(r, 16).unwrap_or(0),
        };
        let end = record.offset.checked_add(record.size);
        let in_bounds = record.offset >= table_end as u64
            && record.size > 0
            && end.is_some_and(|e| e <= data.len() as u64);
        if !in_bounds {
            return Err(Status::new(
                StatusCode::OutOfRange,
                format!(
                    "FatELF record {i}: range offset {} size {} outside the {} bytes after the record table (ends at {table_end})",
                    record.offset,
                    record.size,
                    data.len()
                ),
            ));
        }
        records.push(record);
    }
    Ok(records)
}

fn record_matches_host(r: &FatElfRecord) -> bool {
    // OS ABIs: NONE/SYSV (0), LINUX (3), STANDALONE (255).
    r.machine == EM_X86_64
        && matches!(r.osabi, 0 | 3 | 255)
        && r.word_size == 2
        && r.byte_order == 1
}

/// Returns the host's ELF inside `data`: `data` itself for a bare ELF, or the
/// matching record's bytes for a FatELF. The result starts with the ELF magic.
pub fn select_elf(data: &[u8]) -> Result<&[u8]> {
    match detect(data)? {
        ContainerKind::Elf => Ok(data),
        ContainerKind::FatElf => {
            let records = parse_fatelf(data)?;
            let r = records.iter().find(|r| record_matches_host(r)).ok_or_else(|| {
                Status::new(
                    StatusCode::NotFound,
                    format!(
                        "no ELF for the host ({HOST_ARCH}, 64-bit little-endian) among the FatELF's {} records",
                        records.len()
                    ),
                )
            })?;
            // Bounds were checked by parse_fatelf.
            let elf = &data[r.offset as usize..(r.offset + r.size) as usize];
            if elf.get(..4) != Some(&ELF_MAGIC[..]) {
                return Err(invalid("FatELF record does not point at an ELF"));
            }
            Ok(elf)
        }
    }
}

/// The architecture suffix for an ELF header's machine and class
/// (`x86_64`, `x86_32`, `arm_64`, `arm_32`, `riscv_32`, `riscv_64`, `unknown`).
pub fn elf_arch_name(machine: u16, class: u8) -> &'static str {
    match machine {
        EM_X86_64 => "x86_64",
        EM_386 => "x86_32",
        EM_AARCH64 => "arm_64",
        EM_ARM => "arm_32",
        EM_RISCV if class == 1 => "riscv_32",
        EM_RISCV => "riscv_64",
        _ => "unknown",
    }
}

/// Infers the executable format string (`embedded-elf-<arch>`) of `data`;
/// for a FatELF, the host's format when a record matches it, else the first
/// record's.
pub fn infer_format(data: &[u8]) -> Result<String> {
    let (machine, class) = match detect(data)? {
        ContainerKind::Elf => {
            let class = *data
                .get(4)
                .ok_or_else(|| invalid("ELF truncated in e_ident"))?;
            let machine =
                u16_at(data, 18).ok_or_else(|| invalid("ELF truncated before e_machine"))?;
            (machine, class)
        }
        ContainerKind::FatElf => {
            let records = parse_fatelf(data)?;
            let r = records
                .iter()
                .find(|r| record_matches_host(r))
                .or(records.first())
                .ok_or_else(|| invalid("FatELF has no records"))?;
            (r.machine, r.word_size)
        }
    };
    Ok(format!("{FORMAT_PREFIX}{}", elf_arch_name(machine, class)))
}
