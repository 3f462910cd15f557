//! IREE parameter archives (`.irpa`), version 0.
//!
//! Layout (all integers little-endian, structures packed):
//!
//! - header at a 16-aligned base offset: magic `IRPA` (0x41505249), major
//!   and minor version (u16 each), header size (88 for v0), offset of a
//!   linked next header relative to this base (0 = none), flags (u64),
//!   entry count, then three (offset, length) u64 pairs relative to the
//!   base: the entry table, the metadata segment and the storage segment.
//! - entries, each 16-aligned: size (u64), type (u32: 0 skip, 1 splat,
//!   2 data, 3 external), flags (u64), name and metadata as (offset,
//!   length) within the metadata segment, minimum alignment (u64) — 60
//!   bytes — followed by, for splats, the length (u64), a 16-byte pattern
//!   and the pattern length (u8); for data, an (offset, length) within the
//!   storage segment.

use std::io::Write;
use std::path::Path;

use ferrite_base::{bail, status, Result};

use super::reader::Reader;
use crate::io_parameters::file_handle::FileHandle;
use crate::io_parameters::index::{ParameterIndex, Storage};

/// `IRPA` read as a little-endian u32.
pub const MAGIC: u32 = 0x4150_5249;
const PREFIX_SIZE: u64 = 32;
const HEADER_V0_SIZE: u64 = 88;
const ENTRY_HEADER_SIZE: u64 = 60;
const SPLAT_ENTRY_SIZE: u64 = ENTRY_HEADER_SIZE + 8 + 16 + 1;
const DATA_ENTRY_SIZE: u64 = ENTRY_HEADER_SIZE + 16;
const ENTRY_ALIGNMENT: u64 = 16;
/// Alignment of each parameter's bytes in archives this module writes
/// (what CPU kernels expect of their bindings, so maps import directly).
pub const DATA_ALIGNMENT: u64 = 64;

const TYPE_SKIP: u32 = 0;
const TYPE_SPLAT: u32 = 1;
const TYPE_DATA: u32 = 2;
const TYPE_EXTERNAL: u32 = 3;

#[derive(Clone, Copy)]
struct Range {
    offset: u64,
    length: u64,
}

fn read_range(r: &mut Reader<'_>, what: &str) -> Result<Range> {
    Ok(Range {
        offset: r.u64(what)?,
        length: r.u64(what)?,
    })
}

fn align(v: u64, a: u64) -> u64 {
    v.div_ceil(a) * a
}

/// Adds every parameter of the archive(s) in `handle` to `index`.
pub fn parse_into(index: &mut ParameterIndex, handle: &FileHandle) -> Result<()> {
    handle.with_bytes(|bytes| {
        let mut base = 0u64;
        loop {
            let next = parse_archive(index, handle, bytes, base)?;
            if next == 0 {
                return Ok(());
            }
            base = base.checked_add(next).ok_or_else(|| {
                status!(
                    OutOfRange,
                    "irpa header at offset {base} links past the end of the address space"
                )
            })?;
        }
    })
}

/// Parses the archive whose header is at `base`; returns its next-header
/// offset (relative to `base`, 0 when it is the last).
fn parse_archive(
    index: &mut ParameterIndex,
    handle: &FileHandle,
    bytes: &[u8],
    base: u64,
) -> Result<u64> {
    let size = bytes.len() as u64;
    if base.checked_add(PREFIX_SIZE).is_none_or(|e| e > size) {
        bail!(
            InvalidArgument,
            "not enough bytes for an irpa header at offset {base} (file has {size} bytes); the file may be empty or truncated"
        );
    }
    let mut r = Reader::new(bytes, base, "irpa");
    let magic = r.u32("header magic")?;
    if magic != MAGIC {
        bail!(
            InvalidArgument,
            "irpa header magic at offset {base} is {magic:08X}; expected {MAGIC:08X} ('IRPA')"
        );
    }
    let major = r.u16("header version")?;
    let minor = r.u16("header version")?;
    let header_size = r.u64("header size")?;
    let next = r.u64("next header offset")?;
    let _flags = r.u64("header flags")?;
    if base.checked_add(header_size).is_none_or(|e| e > size) {
        bail!(
            OutOfRange,
            "irpa header at offset {base} reports {header_size} bytes but the file has {size} bytes"
        );
    }
    if next != 0
        && base
            .checked_add(next)
            .and_then(|n| n.checked_add(PREFIX_SIZE))
            .is_none_or(|e| e > size)
    {
        bail!(
            OutOfRange,
            "irpa header at offset {base} links a next header at offset {} beyond the file's {size} bytes",
            base.saturating_add(next)
        );
    }
    if major != 0 {
        bail!(
            Unimplemented,
            "irpa version {major}.{minor} at offset {base} is not supported (only 0.0)"
        );
    }
    if minor > 0 {
        bail!(
            Unimplemented,
            "irpa version {major}.{minor} at offset {base} is newer than this runtime reads (0.0)"
        );
    }
    if header_size != HEADER_V0_SIZE {
        bail!(
            InvalidArgument,
            "irpa v0 header at offset {base} must be {HEADER_V0_SIZE} bytes but reports {header_size}"
        );
    }
    let entry_count = r.u64("entry count")?;
    let entries = read_range(&mut r, "entry segment")?;
    let metadata = read_range(&mut r, "metadata segment")?;
    let storage = read_range(&mut r, "storage segment")?;
    for (what, seg) in [
        ("entry table", entries),
        ("metadata segment", metadata),
        ("storage segment", storage),
    ] {
        if seg.length == 0 {
            continue;
        }
        let end = base
            .checked_add(seg.offset)
            .and_then(|s| s.checked_add(seg.length));
        if end.is_none_or(|e| e > size) {
            bail!(
                OutOfRange,
                "irpa {what} of the header at offset {base} spans {}+{} (relative), beyond the file's {size} bytes",
                seg.offset,
                seg.length
            );
        }
    }
    // Resolves a reference into the metadata segment.
    let meta = |what: &str, at: u64, rf: Range| -> Result<&[u8]> {
        if rf.length == 0 {
            return Ok(&[]);
        }
        if rf
            .offset
            .checked_add(rf.length)
            .is_none_or(|e| e > metadata.length)
        {
            bail!(
                OutOfRange,
                "irpa entry at offset {at}: {what} {}+{} is outside the {} byte metadata segment",
                rf.offset,
                rf.length,
                metadata.length
            );
        }
        let start = (base + metadata.offset + rf.offset) as usize;
        Ok(&bytes[start..start + rf.length as usize])
    };

    let mut at = base + entries.offset;
    let mut remaining = entries.length;
    for i in 0..entry_count {
        if remaining < ENTRY_HEADER_SIZE {
            bail!(
                OutOfRange,
                "irpa entry table truncated at offset {at}: entry {i} of {entry_count} needs {ENTRY_HEADER_SIZE} bytes, {remaining} left"
            );
        }
        let mut r = Reader::new(bytes, at, "irpa");
        let entry_size = r.u64("entry size")?;
        let ty = r.u32("entry type")?;
        let _flags = r.u64("entry flags")?;
        let name = read_range(&mut r, "entry name")?;
        let metadata_ref = read_range(&mut r, "entry metadata")?;
        let _min_alignment = r.u64("entry alignment")?;
        if entry_size < ENTRY_HEADER_SIZE || entry_size > remaining {
            bail!(
                OutOfRange,
                "irpa entry {i} at offset {at} reports {entry_size} bytes; the table has {remaining} bytes left"
            );
        }
        let key = meta("name", at, name)?;
        let key = std::str::from_utf8(key)
            .map_err(|_| {
                status!(
                    InvalidArgument,
                    "irpa entry {i} at offset {at}: name is not UTF-8"
                )
            })?
            .to_string();
        let entry_metadata = meta("metadata", at, metadata_ref)?.to_vec();
        match ty {
            TYPE_SKIP => {}
            TYPE_SPLAT => {
                if entry_size < SPLAT_ENTRY_SIZE {
                    bail!(OutOfRange, "irpa splat entry '{key}' at offset {at} is {entry_size} bytes, expected at least {SPLAT_ENTRY_SIZE}");
                }
                let length = r.u64("splat length")?;
                let pattern = r.take(16, "splat pattern")?;
                let pattern_length = r.u8("splat pattern length")?;
                if pattern_length as usize > pattern.len() {
                    bail!(InvalidArgument, "irpa splat entry '{key}' at offset {at}: pattern length {pattern_length} exceeds 16");
                }
                index
                    .add_splat(&key, &pattern[..pattern_length as usize], length, entry_metadata)
                    .map_err(|e| e.annotate(format!("irpa entry at offset {at}")))?;
            }
            TYPE_DATA => {
                if entry_size < DATA_ENTRY_SIZE {
                    bail!(OutOfRange, "irpa data entry '{key}' at offset {at} is {entry_size} bytes, expected at least {DATA_ENTRY_SIZE}");
                }
                let data = read_range(&mut r, "data storage")?;
                let offset = if data.length == 0 {
                    0
                } else if data.offset.checked_add(data.length).is_none_or(|e| e > storage.length) {
                    bail!(
                        OutOfRange,
                        "irpa data entry '{key}' at offset {at}: storage {}+{} is outside the {} byte storage segment",
                        data.offset,
                        data.length,
                        storage.length
                    );
                } else {
                    base + storage.offset + data.offset
                };
                index
                    .add_file(&key, handle, offset, data.length, entry_metadata)
                    .map_err(|e| e.annotate(format!("irpa entry at offset {at}")))?;
            }
            TYPE_EXTERNAL => bail!(
                Unimplemented,
                "irpa entry '{key}' at offset {at} refers to an external file, which is not supported"
            ),
            other => bail!(Unimplemented, "irpa entry '{key}' at offset {at} has unknown type {other}"),
        }
        let step = align(entry_size, ENTRY_ALIGNMENT).min(remaining);
        at += step;
        remaining -= step;
    }
    Ok(next)
}

/// Serializes every entry of `index` as a single v0 archive: splats stay
/// splats, file-backed parameters are copied into the storage segment with
/// each parameter aligned to [`DATA_ALIGNMENT`].
pub fn write_archive(index: &ParameterIndex, out: &mut impl Write) -> Result<()> {
    let entries = index.entries();
    // Metadata segment: names then metadata blobs.
    let mut metadata = Vec::new();
    let mut table = Vec::new();
    let mut storage_len = 0u64;
    let mut data_offsets = Vec::with_capacity(entries.len());
    for e in entries {
        let name = (metadata.len() as u64, e.key.len() as u64);
        metadata.extend_from_slice(e.key.as_bytes());
        let meta = (metadata.len() as u64, e.metadata.len() as u64);
        metadata.extend_from_slice(&e.metadata);
        let mut entry = Vec::with_capacity(SPLAT_ENTRY_SIZE as usize);
        let (ty, size) = match &e.storage {
            Storage::Splat { .. } => (TYPE_SPLAT, SPLAT_ENTRY_SIZE),
            Storage::File { .. } => (TYPE_DATA, DATA_ENTRY_SIZE),
        };
        entry.extend_from_slice(&size.to_le_bytes());
        entry.extend_from_slice(&ty.to_le_bytes());
        entry.extend_from_slice(&0u64.to_le_bytes());
        for v in [name.0, name.1, meta.0, meta.1] {
            entry.extend_from_slice(&v.to_le_bytes());
        }
        match &e.storage {
            Storage::Splat { pattern } => {
                entry.extend_from_slice(&0u64.to_le_bytes());
                entry.extend_from_slice(&e.length.to_le_bytes());
                let mut p = [0u8; 16];
                p[..pattern.len()].copy_from_slice(pattern);
                entry.extend_from_slice(&p);
                entry.push(pattern.len() as u8);
            }
            Storage::File { handle, offset: at } => {
                entry.extend_from_slice(&DATA_ALIGNMENT.to_le_bytes());
                let offset = align(storage_len, DATA_ALIGNMENT);
                storage_len = offset + e.length;
                data_offsets.push((offset, handle, *at, e.length));
                entry.extend_from_slice(&offset.to_le_bytes());
                entry.extend_from_slice(&e.length.to_le_bytes());
            }
        }
        entry.resize(align(entry.len() as u64, ENTRY_ALIGNMENT) as usize, 0);
        table.extend_from_slice(&entry);
    }
    let entry_offset = align(HEADER_V0_SIZE, ENTRY_ALIGNMENT);
    let metadata_offset = entry_offset + table.len() as u64;
    let storage_offset = align(metadata_offset + metadata.len() as u64, DATA_ALIGNMENT);
    let mut head = Vec::with_capacity(storage_offset as usize);
    head.extend_from_slice(&MAGIC.to_le_bytes());
    head.extend_from_slice(&0u16.to_le_bytes());
    head.extend_from_slice(&0u16.to_le_bytes());
    for v in [
        HEADER_V0_SIZE,
        0,
        0,
        entries.len() as u64,
        entry_offset,
        table.len() as u64,
        metadata_offset,
        metadata.len() as u64,
        storage_offset,
        storage_len,
    ] {
        head.extend_from_slice(&v.to_le_bytes());
    }
    head.resize(entry_offset as usize, 0);
    head.extend_from_slice(&table);
    head.extend_from_slice(&metadata);
    head.resize(storage_offset as usize, 0);
    let io = |e: std::io::Error| status!(Unavailable, "writing irpa archive: {e}");
    out.write_all(&head).map_err(io)?;
    let mut written = 0u64;
    for (offset, handle, at, length) in data_offsets {
        let pad = (offset - written) as usize;
        out.write_all(&vec![0u8; pad]).map_err(io)?;
        handle.with_range(at, length, |b| out.write_all(b).map_err(io))??;
        written = offset + length;
    }
    Ok(())
}

/// Writes `index` as an archive at `path` (replacing any file there).
pub fn save_archive_file(index: &ParameterIndex, path: impl AsRef<Path>) -> Result<()> {
    let path = path.as_ref();
    let file = std::fs::File::create(path)
        .map_err(|e| status!(Unavailable, "creating '{}': {e}", path.display()))?;
    let mut w = std::io::BufWriter::new(file);
    write_archive(index, &mut w)?;
    w.flush()
        .map_err(|e| status!(Unavailable, "writing '{}': {e}", path.display()))
}
