//! Malformed containers and ELFs: truncations, bit flips of the container and
//! ELF headers, corrupted dynamic tables and relocations pointing outside the
//! image all give errors, never panics or undefined behaviour.
//!
//! Only parsing, mapping and relocation are exercised on corrupted inputs;
//! nothing from a corrupted image is ever executed.

#[path = "executable_support/mod.rs"]
mod support;

use ferrite_base::StatusCode;
use ferrite_hal_cpu::executable::abi::QUERY_SYMBOL;
use ferrite_hal_cpu::executable::container;
use ferrite_hal_cpu::executable::elf::{ElfFile, PF_W, PF_X, PT_DYNAMIC, PT_LOAD};
use ferrite_hal_cpu::executable::library::{ExecutableLibrary, LoadOptions};
use std::ops::Range;

fn add_elf() -> Vec<u8> {
    support::fixture("add").executable
}

fn u64_at(d: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(d[at..at + 8].try_into().unwrap())
}

/// Parses and loads (maps, relocates, protects) without running anything.
fn try_load(data: &[u8]) -> Result<(), ferrite_base::Status> {
    let elf = container::select_elf(data)?;
    let file = ElfFile::parse(elf)?;
    let loaded = file.load()?;
    assert!(loaded.size() > 0);
    Ok(())
}

/// [`try_load`], then everything a full load checks before it jumps: the
/// query function must be a function inside an executable segment. What an
/// accepted image exposes holds: every address it would call is code.
fn load_checked(data: &[u8]) -> Result<(), ferrite_base::Status> {
    let elf = container::select_elf(data)?;
    let loaded = ElfFile::parse(elf)?.load()?;
    let query = loaded.lookup_function(QUERY_SYMBOL)?;
    assert!(loaded.is_executable(query));
    assert!(loaded.contains(query, 1));
    Ok(())
}

/// File ranges of interesting structures of a good ELF.
struct Layout {
    phdrs: Range<usize>,
    dynamic: Range<usize>,
    rela: Range<usize>,
    dynsym: Range<usize>,
}

fn layout(data: &[u8]) -> Layout {
    let file = ElfFile::parse(data).unwrap();
    let phoff = file.header.e_phoff as usize;
    let phdrs = phoff..phoff + file.header.e_phnum as usize * 56;
    let dyn_ph = file
        .program_headers
        .iter()
        .find(|p| p.p_type == PT_DYNAMIC)
        .unwrap();
    let dyn_off = file.file_offset_of(dyn_ph.p_vaddr).unwrap();
    let dynamic = dyn_off..dyn_off + dyn_ph.p_filesz as usize;
    let (mut rela, mut relasz, mut symtab, mut hash) = (0, 0, 0, 0);
    for e in dynamic.clone().step_by(16) {
        match u64_at(data, e) {
            7 => rela = u64_at(data, e + 8),
            8 => relasz = u64_at(data, e + 8),
            6 => symtab = u64_at(data, e + 8),
            4 => hash = u64_at(data, e + 8),
            _ => {}
        }
    }
    assert!(rela != 0 && relasz != 0 && symtab != 0 && hash != 0);
    let rela_off = file.file_offset_of(rela).unwrap();
    let sym_off = file.file_offset_of(symtab).unwrap();
    let nsyms = u32::from_le_bytes(
        data[file.file_offset_of(hash + 4).unwrap()..][..4]
            .try_into()
            .unwrap(),
    ) as usize;
    Layout {
        phdrs,
        dynamic,
        rela: rela_off..rela_off + relasz as usize,
        dynsym: sym_off..sym_off + nsyms * 24,
    }
}

#[test]
fn good_elf_loads_and_exports_the_query() {
    let data = add_elf();
    let file = ElfFile::parse(&data).unwrap();
    assert!(file.program_headers.iter().any(|p| p.p_type == PT_LOAD));
    let loaded = file.load().unwrap();
    let q = loaded
        .lookup_symbol("iree_hal_executable_library_query")
        .expect("query symbol");
    assert!(loaded.is_executable(q));
    assert!(loaded.lookup_symbol("missing").is_none());
}

#[test]
fn truncations_are_errors() {
    let data = add_elf();
    for len in 0..data.len() {
        let _ = try_load(&data[..len]);
    }
    for len in 0..64 {
        let err = try_load(&data[..len]).unwrap_err();
        assert!(
            matches!(
                err.code(),
                StatusCode::InvalidArgument | StatusCode::FailedPrecondition
            ),
            "{len}: {err}"
        );
    }
    // Cutting into the last loaded segment is always refused.
    let file = ElfFile::parse(&data).unwrap();
    let end = file
        .program_headers
        .iter()
        .filter(|p| p.p_type == PT_LOAD)
        .map(|p| (p.p_offset + p.p_filesz) as usize)
        .max()
        .unwrap();
    for len in (end.saturating_sub(64))..end {
        assert!(try_load(&data[..len]).is_err(), "truncated at {len} loaded");
    }
}

/// Header bytes whose every bit flip must be refused: magic, class, data
/// encoding, type, machine, version, header and program header entry sizes.
const ALWAYS_CHECKED: [Range<usize>; 6] = [0..6, 16..18, 18..20, 20..24, 52..54, 54..56];

#[test]
fn elf_header_and_table_bit_flips() {
    let data = add_elf();
    let l = layout(&data);
    let mut regions = vec![
        0..64,
        l.phdrs.clone(),
        l.dynamic.clone(),
        l.rela.clone(),
        l.dynsym.clone(),
    ];
    regions.dedup();
    let mut loaded = 0;
    for r in regions {
        for byte in r {
            for bit in 0..8 {
                let mut d = data.clone();
                d[byte] ^= 1 << bit;
                let refused = match load_checked(&d) {
                    Ok(()) => false,
                    Err(e) => {
                        // Refusals are errors of the loader's kinds, never
                        // an internal error.
                        assert_ne!(e.code(), StatusCode::Internal, "byte {byte} bit {bit}: {e}");
                        true
                    }
                };
                if ALWAYS_CHECKED.iter().any(|r| r.contains(&byte)) {
                    assert!(
                        refused,
                        "flip of checked header byte {byte} bit {bit} accepted"
                    );
                }
                loaded += usize::from(!refused);
            }
        }
    }
    // Flips of fields the loader does not use (padding, section header
    // table, unused symbol bits) load: the loader is not stricter than the
    // format.
    assert!(loaded > 0, "no flip loaded");
}

#[test]
fn random_multi_byte_corruption() {
    let data = add_elf();
    let l = layout(&data);
    let targets: Vec<usize> = (0..64)
        .chain(l.phdrs)
        .chain(l.dynamic)
        .chain(l.rela)
        .chain(l.dynsym)
        .collect();
    let mut s = 0x1234_5678u64;
    let mut next = || {
        s ^= s << 13;
        s ^= s >> 7;
        s ^= s << 17;
        s
    };
    for _ in 0..20_000 {
        let mut d = data.clone();
        for _ in 0..1 + next() % 4 {
            let at = targets[(next() % targets.len() as u64) as usize];
            d[at] = match next() % 4 {
                0 => 0,
                1 => 0xff,
                _ => next() as u8,
            };
        }
        let _ = try_load(&d);
    }
}

fn set_u64(d: &mut [u8], at: usize, v: u64) {
    d[at..at + 8].copy_from_slice(&v.to_le_bytes());
}

#[test]
fn relocations_outside_the_image_are_refused() {
    let data = add_elf();
    let l = layout(&data);
    let first = l.rela.start;
    let image_span = {
        let file = ElfFile::parse(&data).unwrap();
        file.load().unwrap().size() as u64
    };
    for (r_offset, what) in [
        (u64::MAX - 3, "wrapping"),
        (1 << 40, "far"),
        (image_span, "just past the end"),
        (image_span - 4, "straddling the end"),
    ] {
        let mut d = data.clone();
        set_u64(&mut d, first, r_offset);
        let err = try_load(&d).unwrap_err();
        assert_eq!(err.code(), StatusCode::OutOfRange, "{what}: {err}");
    }
    // A symbol index past the symbol table.
    let mut d = data.clone();
    set_u64(&mut d, first + 8, (1000u64 << 32) | 1);
    assert_eq!(try_load(&d).unwrap_err().code(), StatusCode::OutOfRange);
    // An unknown relocation type.
    let mut d = data.clone();
    set_u64(&mut d, first + 8, 37);
    assert_eq!(try_load(&d).unwrap_err().code(), StatusCode::Unimplemented);
    // The relocation table itself pointing outside the image.
    let mut d = data.clone();
    let dt_rela = l
        .dynamic
        .clone()
        .step_by(16)
        .find(|e| u64_at(&data, *e) == 7)
        .unwrap();
    set_u64(&mut d, dt_rela + 8, 1 << 40);
    assert_eq!(try_load(&d).unwrap_err().code(), StatusCode::OutOfRange);
    // A relocation table size that is not a whole number of entries.
    let mut d = data.clone();
    let dt_relasz = l
        .dynamic
        .clone()
        .step_by(16)
        .find(|e| u64_at(&data, *e) == 8)
        .unwrap();
    set_u64(&mut d, dt_relasz + 8, 25);
    assert!(try_load(&d).is_err());
}

#[test]
fn header_fields_are_checked() {
    let data = add_elf();
    let cases: &[(usize, &[u8], &str)] = &[
        (4, &[1], "32-bit class"),
        (5, &[2], "big-endian"),
        (16, &[2, 0], "executable type"),
        (18, &[0xB7, 0], "aarch64 machine"),
        (20, &[2, 0, 0, 0], "version"),
        (52, &[63, 0], "ehsize"),
        (54, &[55, 0], "phentsize"),
        (32, &[0xff, 0xff, 0xff, 0xff, 0, 0, 0, 0], "phoff"),
        (56, &[0xff, 0xff], "phnum"),
    ];
    for (at, bytes, what) in cases {
        let mut d = data.clone();
        d[*at..*at + bytes.len()].copy_from_slice(bytes);
        let err = try_load(&d).unwrap_err();
        assert_eq!(err.code(), StatusCode::FailedPrecondition, "{what}: {err}");
    }
    // A segment both writable and executable.
    let l = layout(&data);
    let mut d = data.clone();
    for ph in l.phdrs.clone().step_by(56) {
        if u32::from_le_bytes(d[ph..ph + 4].try_into().unwrap()) == PT_LOAD {
            d[ph + 4..ph + 8].copy_from_slice(&7u32.to_le_bytes());
            break;
        }
    }
    assert_eq!(
        try_load(&d).unwrap_err().code(),
        StatusCode::PermissionDenied
    );
    // A huge memory size is refused, not mapped.
    let mut d = data.clone();
    let ph = l
        .phdrs
        .clone()
        .step_by(56)
        .find(|p| u32::from_le_bytes(d[*p..*p + 4].try_into().unwrap()) == PT_LOAD)
        .unwrap();
    set_u64(&mut d, ph + 40, 1 << 36);
    assert!(try_load(&d).is_err());
}

fn fatelf(elf: &[u8]) -> Vec<u8> {
    let mut fat = Vec::new();
    fat.extend_from_slice(&container::FATELF_MAGIC);
    fat.extend_from_slice(&1u16.to_le_bytes());
    fat.extend_from_slice(&[1, 0]);
    fat.extend_from_slice(&container::EM_X86_64.to_le_bytes());
    fat.extend_from_slice(&[0, 0, 2, 1, 0, 0]);
    fat.extend_from_slice(&32u64.to_le_bytes());
    fat.extend_from_slice(&(elf.len() as u64).to_le_bytes());
    fat.extend_from_slice(elf);
    fat
}

#[test]
fn fatelf_container_corruption() {
    let elf = add_elf();
    let fat = fatelf(&elf);
    assert_eq!(container::select_elf(&fat).unwrap(), &elf[..]);
    // Truncations inside the header or the record table, and of the payload.
    for len in 0..64 {
        assert!(container::select_elf(&fat[..len]).is_err(), "len {len}");
    }
    assert!(container::select_elf(&fat[..fat.len() - 1]).is_err());
    // Every bit of the header and record table.
    for byte in 0..32 {
        for bit in 0..8 {
            let mut d = fat.clone();
            d[byte] ^= 1 << bit;
            if let Ok(sel) = container::select_elf(&d) {
                // A selection is always a sub-slice after the record table that
                // starts with the ELF magic (a flipped size may shorten it).
                let start = sel.as_ptr() as usize - d.as_ptr() as usize;
                assert!(
                    start >= 32 && start + sel.len() <= d.len(),
                    "byte {byte} bit {bit}"
                );
                assert!(sel.starts_with(b"\x7fELF"), "byte {byte} bit {bit}");
            }
            let _ = container::infer_format(&d);
            let _ = try_load(&d);
        }
    }
    // Specific refusals.
    let mut d = fat.clone();
    d[4] = 2;
    assert_eq!(
        container::select_elf(&d).unwrap_err().code(),
        StatusCode::Unimplemented
    );
    let mut d = fat.clone();
    set_u64(&mut d, 16, 8); // offset inside the record table
    assert_eq!(
        container::select_elf(&d).unwrap_err().code(),
        StatusCode::OutOfRange
    );
    let mut d = fat.clone();
    set_u64(&mut d, 24, u64::MAX); // size wrapping
    assert_eq!(
        container::select_elf(&d).unwrap_err().code(),
        StatusCode::OutOfRange
    );
    let mut d = fat.clone();
    d[8] = 0xB7; // only an aarch64 record
    assert_eq!(
        container::select_elf(&d).unwrap_err().code(),
        StatusCode::NotFound
    );
    // Neither ELF nor FatELF.
    assert_eq!(
        container::detect(b"PK\x03\x04....").unwrap_err().code(),
        StatusCode::InvalidArgument
    );
    assert_eq!(
        container::select_elf(&[]).unwrap_err().code(),
        StatusCode::InvalidArgument
    );
}

/// The file offset of the dynamic symbol table entry named `name`.
fn symbol_entry(data: &[u8], name: &str) -> usize {
    let l = layout(data);
    let file = ElfFile::parse(data).unwrap();
    let strtab = l
        .dynamic
        .clone()
        .step_by(16)
        .find(|e| u64_at(data, *e) == 5)
        .map(|e| file.file_offset_of(u64_at(data, e + 8)).unwrap())
        .unwrap();
    l.dynsym
        .step_by(24)
        .find(|&at| {
            let n = u32::from_le_bytes(data[at..at + 4].try_into().unwrap()) as usize;
            data[strtab + n..].starts_with(name.as_bytes()) && data[strtab + n + name.len()] == 0
        })
        .expect("symbol in .dynsym")
}

/// File offsets of the program headers of the first executable and the
/// first writable `PT_LOAD` segments.
fn load_segments(data: &[u8]) -> (usize, usize) {
    let l = layout(data);
    let flags = |ph: usize| u32::from_le_bytes(data[ph + 4..ph + 8].try_into().unwrap());
    let loads: Vec<usize> = l
        .phdrs
        .step_by(56)
        .filter(|&ph| u32::from_le_bytes(data[ph..ph + 4].try_into().unwrap()) == PT_LOAD)
        .collect();
    let code = *loads.iter().find(|&&ph| flags(ph) & PF_X != 0).unwrap();
    let data_seg = *loads.iter().find(|&&ph| flags(ph) & PF_W != 0).unwrap();
    (code, data_seg)
}

/// The full load, query function and initializers included.
fn full_load(data: &[u8]) -> Result<ExecutableLibrary, ferrite_base::Status> {
    // SAFETY: the code is the fixture's, compiled by the pinned compiler from
    // this crate's sources (trusted); the mutations change only addresses and
    // headers around it, which the loader must refuse before it jumps. A
    // loader that jumped anyway would crash this test.
    unsafe { ExecutableLibrary::load(data, &LoadOptions::default()) }
}

#[test]
fn corrupted_entry_points_are_refused_before_any_jump() {
    let data = add_elf();
    full_load(&data).expect("the unmodified fixture loads");
    let sym = symbol_entry(&data, QUERY_SYMBOL);
    let (code_ph, data_ph) = load_segments(&data);
    let code_vaddr = u64_at(&data, code_ph + 16);
    let code_filesz = u64_at(&data, code_ph + 32);
    let data_vaddr = u64_at(&data, data_ph + 16);
    let cases: Vec<(u64, &str)> = vec![
        (data_vaddr, "in the writable data segment"),
        (
            code_vaddr + code_filesz,
            "just past the code (page padding)",
        ),
        (
            code_vaddr + code_filesz - 1,
            "straddling the end of the code",
        ),
        (code_vaddr.wrapping_sub(1), "just before the code"),
        (1 << 40, "far outside the image"),
        (0, "at address zero"),
    ];
    for (value, what) in cases {
        let mut d = data.clone();
        set_u64(&mut d, sym + 8, value);
        if value == code_vaddr + code_filesz - 1 {
            // A one-byte symbol at the last code byte is inside; make it
            // claim more than is left.
            set_u64(&mut d, sym + 16, 16);
        }
        let err = full_load(&d).expect_err(what);
        assert_eq!(err.code(), StatusCode::OutOfRange, "{what}: {err}");
        assert!(
            err.message().contains("executable segment"),
            "{what}: {err}"
        );
    }
    // The query symbol re-typed as data.
    let mut d = data.clone();
    d[sym + 4] = (d[sym + 4] & 0xf0) | 1; // STT_OBJECT
    let err = full_load(&d).unwrap_err();
    assert_eq!(err.code(), StatusCode::FailedPrecondition, "{err}");
    assert!(err.message().contains("STT_FUNC"), "{err}");
}

#[test]
fn corrupted_program_headers_are_refused() {
    let data = add_elf();
    let (code_ph, data_ph) = load_segments(&data);
    let len = data.len() as u64;
    // The code segment's bytes outside the file.
    for (off, what) in [(len, "at the end of the file"), (u64::MAX - 8, "wrapping")] {
        let mut d = data.clone();
        set_u64(&mut d, code_ph + 8, off);
        let err = full_load(&d).expect_err(what);
        assert_eq!(err.code(), StatusCode::FailedPrecondition, "{what}: {err}");
        assert!(err.message().contains("outside the"), "{what}: {err}");
    }
    // A data segment moved over the code: its bytes would overwrite code.
    let mut d = data.clone();
    set_u64(&mut d, data_ph + 16, u64_at(&data, code_ph + 16));
    let err = full_load(&d).unwrap_err();
    assert_eq!(err.code(), StatusCode::FailedPrecondition, "{err}");
    assert!(err.message().contains("sorted and disjoint"), "{err}");
    // The code segment no longer executable: nothing may be called.
    let mut d = data.clone();
    d[code_ph + 4..code_ph + 8].copy_from_slice(&4u32.to_le_bytes());
    let err = full_load(&d).unwrap_err();
    assert_eq!(err.code(), StatusCode::FailedPrecondition, "{err}");
    // The code segment's file size cut to nothing but its memory kept: the
    // query function would be zero-filled memory.
    let mut d = data.clone();
    set_u64(&mut d, code_ph + 32, 0);
    assert!(full_load(&d).is_err());
}

#[test]
fn initializers_outside_the_code_are_refused_at_load() {
    let data = add_elf();
    let l = layout(&data);
    let (_, data_ph) = load_segments(&data);
    let data_vaddr = u64_at(&data, data_ph + 16);
    // Turn the first DT_NULL into DT_INIT pointing at data (the table keeps
    // a terminating DT_NULL after it in the fixture's padding, if any; if
    // not, the loop ends at the table's end).
    let null = l
        .dynamic
        .clone()
        .step_by(16)
        .find(|e| u64_at(&data, *e) == 0)
        .expect("DT_NULL");
    let mut d = data.clone();
    set_u64(&mut d, null, 12); // DT_INIT
    set_u64(&mut d, null + 8, data_vaddr);
    let err = try_load(&d).unwrap_err();
    assert_eq!(err.code(), StatusCode::OutOfRange, "{err}");
    assert!(err.message().contains("DT_INIT"), "{err}");
}

#[test]
fn relocations_into_code_are_refused() {
    let data = add_elf();
    let l = layout(&data);
    let (code_ph, _) = load_segments(&data);
    let mut d = data.clone();
    set_u64(&mut d, l.rela.start, u64_at(&data, code_ph + 16) + 16);
    let err = try_load(&d).unwrap_err();
    assert_eq!(err.code(), StatusCode::PermissionDenied, "{err}");
    assert!(err.message().contains("executable segment"), "{err}");
}
