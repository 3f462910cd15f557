//! The `.vmfb` archive reader: locates the `BytecodeModuleDef` FlatBuffer in
//! a module file, validates all of it, and exposes its metadata with the
//! bytecode and rodata left in place (zero-copy slices of [`ModuleBytes`]).
//!
//! # Container layout
//!
//! A `.vmfb` is, in order:
//!
//! 1. optionally a ZIP local file header (30 bytes + file name + extra field),
//!    which the compiler writes so the file is also a valid ZIP archive;
//! 2. a 4-byte little-endian size prefix `N`;
//! 3. `N` bytes of FlatBuffer: a root `uoffset`, the file identifier `IREE`,
//!    then the tables of the `BytecodeModuleDef` schema;
//! 4. optionally external rodata: the segment data that is too large to
//!    embed. An external segment's `external_data_offset` is relative to the
//!    end of the FlatBuffer rounded up to 64 bytes (offsets from the start of
//!    the file, including any ZIP header).
//!
//! [`Archive::parse`] checks every offset, length and index with checked
//! arithmetic and returns `INVALID_ARGUMENT` (or `INCOMPATIBLE` for a bytecode
//! version this runtime does not run) naming what was wrong and where; it
//! never panics on any input.

mod flatbuf;

use std::collections::HashSet;
use std::ops::Range;

use ferrite_base::{Result, Status, StatusCode};

use self::flatbuf::{Reader, Table, Vector};
use crate::bytes::ModuleBytes;

/// Bytecode version major this runtime executes.
pub const BYTECODE_VERSION_MAJOR: u16 = 17;
/// Newest bytecode version minor this runtime executes (older minors of the
/// same major are accepted).
pub const BYTECODE_VERSION_MINOR: u16 = 0;

/// The FlatBuffer file identifier of bytecode modules.
pub const FILE_IDENTIFIER: &[u8; 4] = b"IREE";

/// Alignment of the external rodata area that follows the FlatBuffer.
pub const SEGMENT_ALIGNMENT: usize = 64;

/// The `FeatureBits` a module or function may require.
pub mod feature_bits {
    /// 32-bit floating point ops (`EXT_F32`).
    pub const EXT_F32: u32 = 1 << 0;
    /// 64-bit floating point ops (`EXT_F64`).
    pub const EXT_F64: u32 = 1 << 1;
    /// Coroutine yields (`YIELD`).
    pub const YIELD: u32 = 1 << 2;
    /// Exception unwinding (`UNWIND`).
    pub const UNWIND: u32 = 1 << 3;
    /// Every feature this runtime provides. A module or function requiring
    /// any other bit is rejected, as upstream rejects it.
    pub const AVAILABLE: u32 = EXT_F32 | EXT_F64 | YIELD | UNWIND;

    /// `[EXT_F32|YIELD]`-style names of `bits` (unknown bits in hex).
    pub fn format(bits: u32) -> String {
        let names = [
            (EXT_F32, "EXT_F32"),
            (EXT_F64, "EXT_F64"),
            (YIELD, "YIELD"),
            (UNWIND, "UNWIND"),
        ];
        let mut parts: Vec<String> = names
            .iter()
            .filter(|(b, _)| bits & b != 0)
            .map(|(_, n)| n.to_string())
            .collect();
        if bits & !AVAILABLE != 0 {
            parts.push(format!("{:#x}", bits & !AVAILABLE));
        }
        format!("[{}]", parts.join("|"))
    }

    /// Fails when `required` names a feature this runtime does not have.
    pub fn check(required: u32) -> Result<(), String> {
        if required & !AVAILABLE == 0 {
            return Ok(());
        }
        Err(format!(
            "required features {} are not available in this runtime; have {} while {} are required",
            format(required & !AVAILABLE),
            format(AVAILABLE),
            format(required)
        ))
    }
}

/// ZIP local file header signature (`PK\x03\x04`, little-endian).
const ZIP_LOCAL_FILE_HEADER_SIGNATURE: u32 = 0x0403_4B50;
/// Fixed size of a ZIP local file header.
const ZIP_LOCAL_FILE_HEADER_SIZE: usize = 30;

/// Size of a `FunctionDescriptor` struct in the FlatBuffer.
const FUNCTION_DESCRIPTOR_SIZE: usize = 20;
/// Size of a `BytecodeLocationDef` struct in the FlatBuffer.
const BYTECODE_LOCATION_SIZE: usize = 8;

/// Largest `i32_register_count` a function may declare.
pub const MAX_I32_REGISTER_COUNT: u16 = 0x7FFF;
/// Largest `ref_register_count` a function may declare.
pub const MAX_REF_REGISTER_COUNT: u16 = 0x3FFF;

/// Field ids (declaration order; a union occupies two ids: type, value).
mod field {
    pub mod module {
        pub const NAME: usize = 0;
        pub const VERSION: usize = 1;
        pub const REQUIREMENTS: usize = 2;
        pub const ATTRS: usize = 3;
        pub const TYPES: usize = 4;
        pub const DEPENDENCIES: usize = 5;
        pub const IMPORTED_FUNCTIONS: usize = 6;
        pub const EXPORTED_FUNCTIONS: usize = 7;
        pub const FUNCTION_SIGNATURES: usize = 8;
        pub const RODATA_SEGMENTS: usize = 9;
        pub const RWDATA_SEGMENTS: usize = 10;
        pub const MODULE_STATE: usize = 11;
        pub const FUNCTION_DESCRIPTORS: usize = 12;
        pub const BYTECODE_VERSION: usize = 13;
        pub const BYTECODE_DATA: usize = 14;
        pub const DEBUG_DATABASE: usize = 15;
    }
}

/// Flag bit marking a dependency or import optional.
const OPTIONAL_FLAG: u32 = 1 << 1;
/// Default flags of dependencies and imports (`REQUIRED`).
const REQUIRED_FLAG: u32 = 1 << 0;

/// A module this module depends on (`ModuleDependencyDef`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DependencyDef {
    /// Name of the required module (`hal`, `check`, ...).
    pub name: String,
    /// Minimum version of that module.
    pub minimum_version: u32,
    /// True when the module may be absent.
    pub optional: bool,
}

/// A function signature (`FunctionSignatureDef`).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SignatureDef {
    /// Calling convention string (`0rr_r`, ...), when present.
    pub calling_convention: Option<String>,
    /// Reflection attributes (`iree.abi.declaration`, ...).
    pub attrs: Vec<(String, String)>,
}

/// An imported function (`ImportFunctionDef`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ImportDef {
    /// Fully-qualified name (`hal.buffer.subspan`).
    pub full_name: String,
    /// Expected signature.
    pub signature: SignatureDef,
    /// True when the import may be left unresolved.
    pub optional: bool,
}

/// An exported function (`ExportFunctionDef`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ExportDef {
    /// Name without the module prefix.
    pub local_name: String,
    /// Index into the internal function tables (validated in range).
    pub internal_ordinal: u32,
}

/// A read-only data segment: a validated byte range of the module file.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RodataSegment {
    /// Start of the data in [`Archive::bytes`].
    pub offset: usize,
    /// Length of the data in bytes.
    pub len: usize,
    /// True when the data lies after the FlatBuffer rather than inside it.
    pub external: bool,
}

impl RodataSegment {
    /// The byte range in [`Archive::bytes`].
    pub fn range(&self) -> Range<usize> {
        self.offset..self.offset.saturating_add(self.len)
    }

    /// The segment's bytes (empty if `archive` is not the one it came from
    /// and the range does not fit).
    pub fn data<'a>(&self, archive: &'a Archive) -> &'a [u8] {
        archive
            .bytes
            .as_slice()
            .get(self.range())
            .unwrap_or_default()
    }
}

/// Module state sizes (`ModuleStateDef`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ModuleStateDef {
    /// Bytes of primitive global storage.
    pub global_bytes_capacity: u32,
    /// Number of ref globals.
    pub global_ref_count: u32,
}

/// An internal function's layout (`FunctionDescriptor`), validated.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FunctionDescriptor {
    /// Offset of the function's bytecode in [`Archive::bytecode`].
    pub bytecode_offset: u32,
    /// Length of the function's bytecode (non-zero).
    pub bytecode_length: u32,
    /// [`feature_bits`] the function needs.
    pub requirements: u32,
    /// Number of blocks (at least 1).
    pub block_count: u16,
    /// Number of i32 registers (at most [`MAX_I32_REGISTER_COUNT`]).
    pub i32_register_count: u16,
    /// Number of ref registers (at most [`MAX_REF_REGISTER_COUNT`]).
    pub ref_register_count: u16,
}

impl FunctionDescriptor {
    /// The function's byte range in [`Archive::bytecode`].
    pub fn bytecode_range(&self) -> Range<usize> {
        let start = self.bytecode_offset as usize;
        start..start.saturating_add(self.bytecode_length as usize)
    }
}

/// One entry of the debug database's location table (`LocationTypeDef`).
///
/// Indices into the table are kept as stored; they are checked when used.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Location {
    /// No location (`NONE`) or a union kind this reader does not know.
    Unknown,
    /// A call site: `callee` location called from `caller` location.
    CallSite {
        /// Location index of the callee.
        callee: i32,
        /// Location index of the caller.
        caller: i32,
    },
    /// A source position.
    FileLineCol {
        /// Source file name.
        filename: String,
        /// 1-based line.
        line: i32,
        /// 1-based column.
        column: i32,
    },
    /// Several locations fused together.
    Fused {
        /// Optional metadata string.
        metadata: Option<String>,
        /// Location indices.
        locations: Vec<i32>,
    },
    /// A named location.
    Name {
        /// The name.
        name: String,
        /// Optional child location index.
        child: Option<i32>,
    },
}

/// One `BytecodeLocationDef`: an op's offset and its location index.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SourceMapEntry {
    /// Offset of the op in the function's bytecode.
    pub bytecode_offset: i32,
    /// Index into [`DebugDatabase::locations`].
    pub location: i32,
}

/// The source map of one internal function (`FunctionSourceMapDef`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FunctionSourceMap {
    /// The function's local name.
    pub local_name: String,
    /// Op locations, in file order.
    pub locations: Vec<SourceMapEntry>,
}

/// The module's debug database (`DebugDatabaseDef`).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct DebugDatabase {
    /// The location table.
    pub locations: Vec<Location>,
    /// Source maps, indexed by internal function ordinal.
    pub functions: Vec<FunctionSourceMap>,
}

impl DebugDatabase {
    /// The source map of internal function `function_ordinal`.
    pub fn function(&self, function_ordinal: usize) -> Option<&FunctionSourceMap> {
        self.functions.get(function_ordinal)
    }

    /// The location index recorded for the op at exactly `bytecode_offset` in
    /// function `function_ordinal`.
    pub fn location_index(&self, function_ordinal: usize, bytecode_offset: u32) -> Option<i32> {
        let offset = i32::try_from(bytecode_offset).ok()?;
        self.function(function_ordinal)?
            .locations
            .iter()
            .find(|e| e.bytecode_offset == offset)
            .map(|e| e.location)
    }

    /// The first `FileLineCol` reachable from location `index` (through
    /// `Name` children, `Fused` members and `CallSite` callees then callers),
    /// as `(filename, line, column)`. Cycles and bad indices yield `None`.
    pub fn file_line_col(&self, index: i32) -> Option<(&str, i32, i32)> {
        let mut visited = HashSet::new();
        let mut stack = vec![index];
        while let Some(i) = stack.pop() {
            let Ok(idx) = usize::try_from(i) else {
                continue;
            };
            let Some(loc) = self.locations.get(idx) else {
                continue;
            };
            if !visited.insert(idx) {
                continue;
            }
            match loc {
                Location::Unknown => {}
                Location::FileLineCol {
                    filename,
                    line,
                    column,
                } => return Some((filename, *line, *column)),
                Location::Name { child, .. } => stack.extend(child.iter().copied()),
                Location::CallSite { callee, caller } => {
                    stack.push(*caller);
                    stack.push(*callee);
                }
                Location::Fused { locations, .. } => stack.extend(locations.iter().rev()),
            }
        }
        None
    }

    /// `"file:line:col"` for the op at `bytecode_offset` of internal function
    /// `function_ordinal`, when the source map records one.
    pub fn resolve_location(
        &self,
        function_ordinal: usize,
        bytecode_offset: u32,
    ) -> Option<String> {
        let index = self.location_index(function_ordinal, bytecode_offset)?;
        let (file, line, col) = self.file_line_col(index)?;
        Some(format!("{file}:{line}:{col}"))
    }
}

/// A parsed, fully validated bytecode module archive.
///
/// Holds the module's [`ModuleBytes`] and its decoded metadata; bytecode and
/// rodata are borrowed slices of those bytes. Share it with `Arc<Archive>`.
#[derive(Clone, Debug)]
pub struct Archive {
    bytes: ModuleBytes,
    flatbuffer: Range<usize>,
    name: String,
    version: u32,
    requirements: u32,
    attrs: Vec<(String, String)>,
    types: Vec<String>,
    dependencies: Vec<DependencyDef>,
    imports: Vec<ImportDef>,
    exports: Vec<ExportDef>,
    function_signatures: Vec<SignatureDef>,
    rodata_segments: Vec<RodataSegment>,
    rwdata_segments: Vec<u32>,
    module_state: ModuleStateDef,
    function_descriptors: Vec<FunctionDescriptor>,
    bytecode_version: (u16, u16),
    bytecode: Range<usize>,
    debug_database: Option<DebugDatabase>,
}

fn invalid(msg: impl Into<String>) -> Status {
    Status::new(StatusCode::InvalidArgument, msg)
}

/// Locates the FlatBuffer: returns its byte range in `data` (after the size
/// prefix), skipping any ZIP local file header.
fn locate_flatbuffer(data: &[u8]) -> Result<Range<usize>> {
    let mut start = 0usize;
    if data.len() >= ZIP_LOCAL_FILE_HEADER_SIZE
        && read_u32(data, 0) == Some(ZIP_LOCAL_FILE_HEADER_SIGNATURE)
    {
        let name_len = read_u16(data, 26).unwrap_or(0) as usize;
        let extra_len = read_u16(data, 28).unwrap_or(0) as usize;
        start = ZIP_LOCAL_FILE_HEADER_SIZE + name_len + extra_len;
        if start > data.len() {
            return Err(invalid(format!(
                "vmfb: file has a ZIP header whose name and extra fields end at offset {start:#x}, \
                 past the end of the file ({} bytes)",
                data.len()
            )));
        }
    }
    let avail = data.len() - start;
    if avail < 16 {
        return Err(invalid(format!(
            "vmfb: truncated: module at offset {start:#x} needs at least 16 bytes, file has {avail}"
        )));
    }
    let prefix = read_u32(data, start).unwrap_or(0) as usize;
    let fb_start = start + 4;
    if prefix > avail - 4 {
        return Err(invalid(format!(
            "vmfb: truncated: size prefix at offset {start:#x} says the flatbuffer has {prefix} \
             bytes, file has {} after it",
            avail - 4
        )));
    }
    if prefix < 8 {
        return Err(invalid(format!(
            "vmfb: size prefix at offset {start:#x} is {prefix}; a flatbuffer needs at least 8 bytes"
        )));
    }
    Ok(fb_start..fb_start + prefix)
}

fn read_u16(data: &[u8], off: usize) -> Option<u16> {
    let b = data.get(off..off.checked_add(2)?)?;
    Some(u16::from_le_bytes([b[0], b[1]]))
}

fn read_u32(data: &[u8], off: usize) -> Option<u32> {
    let b = data.get(off..off.checked_add(4)?)?;
    Some(u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
}

fn ident_text(id: &[u8]) -> String {
    id.iter()
        .map(|&c| {
            if c.is_ascii_graphic() || c == b' ' {
                c as char
            } else {
                '.'
            }
        })
        .collect()
}

impl Archive {
    /// Parses and validates a module. Never panics.
    pub fn parse(bytes: ModuleBytes) -> Result<Archive> {
        let data = bytes.as_slice();
        let fb_range = locate_flatbuffer(data)?;
        let fb = data.get(fb_range.clone()).unwrap_or_default();
        let ident = fb.get(4..8).unwrap_or_default();
        if ident != FILE_IDENTIFIER {
            return Err(invalid(format!(
                "vmfb: file identifier at offset {:#x} is '{}', expected 'IREE'",
                fb_range.start + 4,
                ident_text(ident)
            )));
        }
        // Owned metadata may not exceed 16x the flatbuffer (plus slack);
        // real modules use well under 2x.
        let budget = fb.len().saturating_mul(16).saturating_add(64 * 1024);
        let mut r = Reader::new(fb, fb_range.start, budget);
        let root_pos = r.deref(0, "root table offset")?;
        let root = r.table_at(root_pos)?;
        r.path.push_str("BytecodeModuleDef");
        let mut p = Parser { r, data };
        let archive = p.module(&root, &bytes, fb_range)?;
        Ok(archive)
    }

    /// The module's bytes.
    pub fn bytes(&self) -> &ModuleBytes {
        &self.bytes
    }

    /// Module name (non-empty).
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Module version.
    pub fn version(&self) -> u32 {
        self.version
    }

    /// [`feature_bits`] required by the module.
    pub fn requirements(&self) -> u32 {
        self.requirements
    }

    /// Module reflection attributes (key, value).
    pub fn attrs(&self) -> &[(String, String)] {
        &self.attrs
    }

    /// Type table: full names (`i32`, `!vm.buffer`, `!hal.buffer`, ...).
    pub fn types(&self) -> &[String] {
        &self.types
    }

    /// Module dependencies.
    pub fn dependencies(&self) -> &[DependencyDef] {
        &self.dependencies
    }

    /// Imported functions, by import ordinal.
    pub fn imports(&self) -> &[ImportDef] {
        &self.imports
    }

    /// Exported functions, by export ordinal.
    pub fn exports(&self) -> &[ExportDef] {
        &self.exports
    }

    /// Signatures of the internal functions, by internal ordinal.
    pub fn function_signatures(&self) -> &[SignatureDef] {
        &self.function_signatures
    }

    /// Read-only data segments, by rodata ordinal.
    pub fn rodata_segments(&self) -> &[RodataSegment] {
        &self.rodata_segments
    }

    /// The bytes of rodata segment `ordinal`.
    pub fn rodata(&self, ordinal: usize) -> Option<&[u8]> {
        let seg = self.rodata_segments.get(ordinal)?;
        self.bytes.as_slice().get(seg.range())
    }

    /// Byte sizes of the read-write data segments.
    pub fn rwdata_segments(&self) -> &[u32] {
        &self.rwdata_segments
    }

    /// Module state sizes (zero when the module has no state).
    pub fn module_state(&self) -> ModuleStateDef {
        self.module_state
    }

    /// Internal function descriptors, by internal ordinal (one per signature).
    pub fn function_descriptors(&self) -> &[FunctionDescriptor] {
        &self.function_descriptors
    }

    /// The bytecode version as `(major, minor)`.
    pub fn bytecode_version(&self) -> (u16, u16) {
        self.bytecode_version
    }

    /// All bytecode (`bytecode_data`), zero-copy.
    pub fn bytecode(&self) -> &[u8] {
        self.bytes
            .as_slice()
            .get(self.bytecode.clone())
            .unwrap_or_default()
    }

    /// The bytecode of internal function `ordinal`; empty when out of range.
    pub fn function_bytecode(&self, ordinal: usize) -> &[u8] {
        match self.function_descriptors.get(ordinal) {
            Some(d) => self.bytecode().get(d.bytecode_range()).unwrap_or_default(),
            None => &[],
        }
    }

    /// The debug database, when the module carries one.
    pub fn debug_database(&self) -> Option<&DebugDatabase> {
        self.debug_database.as_ref()
    }

    /// `"file:line:col"` of the op at `bytecode_offset` in internal function
    /// `function_ordinal`, from the debug database.
    pub fn resolve_location(
        &self,
        function_ordinal: usize,
        bytecode_offset: u32,
    ) -> Option<String> {
        self.debug_database()?
            .resolve_location(function_ordinal, bytecode_offset)
    }

    /// Size of the FlatBuffer in bytes (excluding its size prefix).
    pub fn flatbuffer_len(&self) -> usize {
        self.flatbuffer.len()
    }

    /// Byte range of the FlatBuffer in [`Archive::bytes`].
    pub fn flatbuffer_range(&self) -> Range<usize> {
        self.flatbuffer.clone()
    }
}

struct Parser<'a> {
    r: Reader<'a>,
    data: &'a [u8],
}

impl<'a> Parser<'a> {
    fn module(
        &mut self,
        root: &Table,
        bytes: &ModuleBytes,
        fb_range: Range<usize>,
    ) -> Result<Archive> {
        use field::module as f;
        // The version first: a module from another major may not follow this
        // schema's meaning, so say that rather than something confusing.
        let raw_version = self
            .r
            .u32_field(root, f::BYTECODE_VERSION, "bytecode_version", 0)?;
        let major = (raw_version >> 16) as u16;
        let minor = (raw_version & 0xFFFF) as u16;
        if major != BYTECODE_VERSION_MAJOR || minor > BYTECODE_VERSION_MINOR {
            return Err(Status::new(
                StatusCode::Incompatible,
                format!(
                    "vmfb: bytecode version {major}.{minor} is not supported; this runtime \
                     supports {BYTECODE_VERSION_MAJOR}.{BYTECODE_VERSION_MINOR}"
                ),
            ));
        }

        let name = self.r.owned_string_field(root, f::NAME, "name")?;
        let name = match name {
            Some(n) if !n.is_empty() => n,
            _ => return Err(self.r.error("required field 'name' is missing or empty")),
        };
        let version = self.r.u32_field(root, f::VERSION, "version", 0)?;
        let requirements = self.r.u32_field(root, f::REQUIREMENTS, "requirements", 0)?;
        feature_bits::check(requirements)
            .map_err(|e| self.r.error(format_args!("module requirements: {e}")))?;

        let attrs = self.r.with(".attrs", |r| attrs_field(r, root, f::ATTRS))?;
        let types = self.table_vec(root, f::TYPES, ".types", |r, t| {
            match r.owned_string_field(t, 0, "full_name")? {
                Some(s) if !s.is_empty() => Ok(s),
                _ => Err(r.error("missing full_name")),
            }
        })?;
        let dependencies = self.table_vec(root, f::DEPENDENCIES, ".dependencies", |r, t| {
            let name = match r.owned_string_field(t, 0, "name")? {
                Some(s) if !s.is_empty() => s,
                _ => return Err(r.error("missing module name")),
            };
            let minimum_version = r.u32_field(t, 1, "minimum_version", 0)?;
            let flags = r.u32_field(t, 2, "flags", REQUIRED_FLAG)?;
            Ok(DependencyDef {
                name,
                minimum_version,
                optional: flags & OPTIONAL_FLAG != 0,
            })
        })?;
        let imports = self.table_vec(
            root,
            f::IMPORTED_FUNCTIONS,
            ".imported_functions",
            |r, t| {
                let full_name = match r.owned_string_field(t, 0, "full_name")? {
                    Some(s) if !s.is_empty() => s,
                    _ => return Err(r.error("missing full_name")),
                };
                let signature = match r.table_field(t, 1, "signature")? {
                    Some(st) => r.with(".signature", |r| signature(r, &st))?,
                    None => SignatureDef::default(),
                };
                let flags = r.u32_field(t, 2, "flags", REQUIRED_FLAG)?;
                Ok(ImportDef {
                    full_name,
                    signature,
                    optional: flags & OPTIONAL_FLAG != 0,
                })
            },
        )?;
        let exports = self.table_vec(
            root,
            f::EXPORTED_FUNCTIONS,
            ".exported_functions",
            |r, t| {
                let local_name = match r.owned_string_field(t, 0, "local_name")? {
                    Some(s) if !s.is_empty() => s,
                    _ => return Err(r.error("missing local_name")),
                };
                let ordinal = r.i32_field(t, 1, "internal_ordinal", 0)?;
                let internal_ordinal = u32::try_from(ordinal)
                    .map_err(|_| r.error(format_args!("internal_ordinal {ordinal} is negative")))?;
                Ok(ExportDef {
                    local_name,
                    internal_ordinal,
                })
            },
        )?;
        let function_signatures = self.table_vec(
            root,
            f::FUNCTION_SIGNATURES,
            ".function_signatures",
            |r, t| signature(r, t),
        )?;

        let fb_start = fb_range.start;
        let rodata_base = fb_range
            .end
            .checked_next_multiple_of(SEGMENT_ALIGNMENT)
            .ok_or_else(|| invalid("vmfb: flatbuffer end overflows"))?;
        let file_len = self.data.len();
        let rodata_segments =
            self.table_vec(root, f::RODATA_SEGMENTS, ".rodata_segments", |r, t| {
                let compression = r.u8_field(t, 0, "compression_type_type", 0)?;
                if compression > 1 {
                    return Err(r.error(format_args!(
                    "unknown compression type {compression} (only uncompressed data is supported)"
                )));
                }
                // The union's value: a table for UncompressedDataDef, and
                // nothing without a type.
                let has_value = r.has(t, 1, 4, "compression_type")?;
                if compression == 0 && has_value {
                    return Err(r.error("compression_type has a value but no type"));
                }
                if compression == 1 && r.table_field(t, 1, "compression_type")?.is_none() {
                    return Err(r.error("compression_type UncompressedDataDef has no value"));
                }
                if let Some(v) = r.vector_field(t, 2, 1, "embedded_data")? {
                    return Ok(RodataSegment {
                        offset: fb_start + v.start,
                        len: v.len,
                        external: false,
                    });
                }
                let offset = r.u64_field(t, 3, "external_data_offset", 0)?;
                let length = r.u64_field(t, 4, "external_data_length", 0)?;
                let range = usize::try_from(offset)
                    .ok()
                    .and_then(|o| rodata_base.checked_add(o))
                    .and_then(|s| Some((s, s.checked_add(usize::try_from(length).ok()?)?)))
                    .filter(|&(_, e)| e <= file_len);
                match range {
                    Some((start, end)) => Ok(RodataSegment {
                        offset: start,
                        len: end - start,
                        external: true,
                    }),
                    None => Err(r.error(format_args!(
                    "external data {offset:#x}+{length:#x} (relative to offset {rodata_base:#x}) \
                     exceeds the file length {file_len:#x}"
                ))),
                }
            })?;
        let rwdata_segments =
            self.table_vec(root, f::RWDATA_SEGMENTS, ".rwdata_segments", |r, t| {
                let size = r.i32_field(t, 0, "byte_size", 0)?;
                u32::try_from(size)
                    .map_err(|_| r.error(format_args!("byte_size {size} is negative")))
            })?;
        let module_state = match self.r.table_field(root, f::MODULE_STATE, "module_state")? {
            Some(t) => self.r.with(".module_state", |r| {
                let cap = r.i32_field(&t, 0, "global_bytes_capacity", 0)?;
                let refs = r.i32_field(&t, 1, "global_ref_count", 0)?;
                let global_bytes_capacity = u32::try_from(cap).map_err(|_| {
                    r.error(format_args!("global_bytes_capacity {cap} is negative"))
                })?;
                let global_ref_count = u32::try_from(refs)
                    .map_err(|_| r.error(format_args!("global_ref_count {refs} is negative")))?;
                Ok(ModuleStateDef {
                    global_bytes_capacity,
                    global_ref_count,
                })
            })?,
            None => ModuleStateDef::default(),
        };

        let bytecode_vec = self
            .r
            .vector_field(root, f::BYTECODE_DATA, 1, "bytecode_data")?;
        let bytecode = match bytecode_vec {
            Some(v) => fb_start + v.start..fb_start + v.start + v.len,
            None => fb_start..fb_start,
        };
        let bytecode_len = bytecode.len();
        let function_descriptors = self.function_descriptors(root, bytecode_len)?;

        if function_signatures.len() != function_descriptors.len() {
            return Err(self.r.error(format_args!(
                "function_signatures has {} entries but function_descriptors has {}",
                function_signatures.len(),
                function_descriptors.len()
            )));
        }
        for (i, e) in exports.iter().enumerate() {
            if e.internal_ordinal as usize >= function_descriptors.len() {
                return Err(self.r.error(format_args!(
                    "exported_functions[{i}] ('{}') internal_ordinal {} out of range \
                     (module has {} functions)",
                    e.local_name,
                    e.internal_ordinal,
                    function_descriptors.len()
                )));
            }
        }

        let debug_database = match self
            .r
            .table_field(root, f::DEBUG_DATABASE, "debug_database")?
        {
            Some(t) => Some(self.r.with(".debug_database", |r| debug_database(r, &t))?),
            None => None,
        };

        Ok(Archive {
            bytes: bytes.clone(),
            flatbuffer: fb_range,
            name,
            version,
            requirements,
            attrs,
            types,
            dependencies,
            imports,
            exports,
            function_signatures,
            rodata_segments,
            rwdata_segments,
            module_state,
            function_descriptors,
            bytecode_version: (major, minor),
            bytecode,
            debug_database,
        })
    }

    /// Decodes a vector-of-tables field with `f` per element.
    fn table_vec<T>(
        &mut self,
        t: &Table,
        id: usize,
        seg: &str,
        mut f: impl FnMut(&mut Reader<'a>, &Table) -> Result<T>,
    ) -> Result<Vec<T>> {
        self.r.with(seg, |r| table_vec(r, t, id, &seg[1..], &mut f))
    }

    fn function_descriptors(
        &mut self,
        root: &Table,
        bytecode_len: usize,
    ) -> Result<Vec<FunctionDescriptor>> {
        let id = field::module::FUNCTION_DESCRIPTORS;
        self.r.with(".function_descriptors", |r| {
            let Some(v) =
                r.vector_field(root, id, FUNCTION_DESCRIPTOR_SIZE, "function_descriptors")?
            else {
                return Ok(Vec::new());
            };
            r.charge(
                v.len
                    .saturating_mul(std::mem::size_of::<FunctionDescriptor>()),
            )?;
            let mut out = Vec::with_capacity(v.len);
            for i in 0..v.len {
                let d = r.with_index(i, |r| function_descriptor(r, &v, i, bytecode_len))?;
                out.push(d);
            }
            Ok(out)
        })
    }
}

fn table_vec<'a, T>(
    r: &mut Reader<'a>,
    t: &Table,
    id: usize,
    name: &str,
    f: &mut impl FnMut(&mut Reader<'a>, &Table) -> Result<T>,
) -> Result<Vec<T>> {
    let Some(v) = r.vector_field(t, id, 4, name)? else {
        return Ok(Vec::new());
    };
    r.charge(v.len.saturating_mul(std::mem::size_of::<T>().max(16)))?;
    let mut out = Vec::with_capacity(v.len);
    for i in 0..v.len {
        let item = r.with_index(i, |r| {
            let et = r.table_elem(&v, i)?;
            f(r, &et)
        })?;
        out.push(item);
    }
    Ok(out)
}

fn attrs_field(r: &mut Reader<'_>, t: &Table, id: usize) -> Result<Vec<(String, String)>> {
    table_vec(r, t, id, "attrs", &mut |r, a| {
        let key = r.owned_string_field(a, 0, "key")?.unwrap_or_default();
        let value = r.owned_string_field(a, 1, "value")?.unwrap_or_default();
        Ok((key, value))
    })
}

fn signature(r: &mut Reader<'_>, t: &Table) -> Result<SignatureDef> {
    let calling_convention = r.owned_string_field(t, 0, "calling_convention")?;
    let attrs = r.with(".attrs", |r| attrs_field(r, t, 1))?;
    Ok(SignatureDef {
        calling_convention,
        attrs,
    })
}

fn function_descriptor(
    r: &mut Reader<'_>,
    v: &Vector,
    i: usize,
    bytecode_len: usize,
) -> Result<FunctionDescriptor> {
    let p = r.elem(v, i)?;
    let offset = r.i32_at(p, "bytecode_offset")?;
    let length = r.i32_at(p + 4, "bytecode_length")?;
    let requirements = r.u32_at(p + 8, "requirements")?;
    feature_bits::check(requirements).map_err(|e| r.error(format_args!("requirements: {e}")))?;
    // p + 12: reserved (i16)
    let block_count = r.i16_at(p + 14, "block_count")?;
    let i32_count = r.i16_at(p + 16, "i32_register_count")?;
    let ref_count = r.i16_at(p + 18, "ref_register_count")?;
    if block_count <= 0 {
        return Err(r.error(format_args!(
            "block_count is {block_count}; functions must have at least 1 block"
        )));
    }
    if length <= 0 {
        return Err(r.error(format_args!(
            "bytecode_length is {length}; functions must have at least 1 block"
        )));
    }
    let in_range = usize::try_from(offset)
        .ok()
        .and_then(|o| o.checked_add(length as usize))
        .is_some_and(|end| end <= bytecode_len);
    if !in_range {
        return Err(r.error(format_args!(
            "bytecode range {:#x}..{:#x} exceeds bytecode_data length {:#x}",
            i64::from(offset),
            i64::from(offset) + i64::from(length),
            bytecode_len
        )));
    }
    if !(0..=MAX_I32_REGISTER_COUNT as i16).contains(&i32_count) {
        return Err(r.error(format_args!(
            "i32_register_count {i32_count} out of range 0..={MAX_I32_REGISTER_COUNT}"
        )));
    }
    if !(0..=MAX_REF_REGISTER_COUNT as i16).contains(&ref_count) {
        return Err(r.error(format_args!(
            "ref_register_count {ref_count} out of range 0..={MAX_REF_REGISTER_COUNT}"
        )));
    }
    Ok(FunctionDescriptor {
        bytecode_offset: offset as u32,
        bytecode_length: length as u32,
        requirements,
        block_count: block_count as u16,
        i32_register_count: i32_count as u16,
        ref_register_count: ref_count as u16,
    })
}

fn debug_database(r: &mut Reader<'_>, t: &Table) -> Result<DebugDatabase> {
    let types = r.vector_field(t, 0, 1, "location_table_type")?;
    let values = r.vector_field(t, 1, 4, "location_table")?;
    let locations = r.with(".location_table", |r| {
        let (types, values) = match (types, values) {
            (None, None) => return Ok(Vec::new()),
            (Some(ty), Some(va)) if ty.len == va.len => (ty, va),
            (ty, va) => {
                return Err(r.error(format_args!(
                    "location_table_type has {} entries but location_table has {}",
                    ty.map_or(0, |v| v.len),
                    va.map_or(0, |v| v.len)
                )))
            }
        };
        r.charge(values.len.saturating_mul(std::mem::size_of::<Location>()))?;
        let mut out = Vec::with_capacity(values.len);
        for i in 0..values.len {
            let loc = r.with_index(i, |r| {
                let kind = r.u8_at(r.elem(&types, i)?, "location type")?;
                let slot = r.elem(&values, i)?;
                // NONE entries carry a zero offset (upstream's verifier
                // rejects a value without a type); anything else must point
                // at a table.
                if kind == 0 {
                    if r.u32_at(slot, "location")? != 0 {
                        return Err(r.error("location present with type NONE"));
                    }
                    return Ok(Location::Unknown);
                }
                if r.u32_at(slot, "location")? == 0 {
                    return Err(r.error(format_args!("location of type {kind} has no value")));
                }
                if kind > 4 {
                    return Ok(Location::Unknown);
                }
                let lt = r.table_at(r.deref(slot, "location")?)?;
                location(r, kind, &lt)
            })?;
            out.push(loc);
        }
        Ok(out)
    })?;
    let functions = r.with(".functions", |r| {
        table_vec(r, t, 2, "functions", &mut |r, ft| {
            let local_name = r
                .owned_string_field(ft, 0, "local_name")?
                .unwrap_or_default();
            let locations = match r.vector_field(ft, 1, BYTECODE_LOCATION_SIZE, "locations")? {
                Some(v) => {
                    r.charge(v.len.saturating_mul(std::mem::size_of::<SourceMapEntry>()))?;
                    let mut out = Vec::with_capacity(v.len);
                    for i in 0..v.len {
                        let p = r.elem(&v, i)?;
                        out.push(SourceMapEntry {
                            bytecode_offset: r.i32_at(p, "bytecode_offset")?,
                            location: r.i32_at(p + 4, "location")?,
                        });
                    }
                    out
                }
                None => Vec::new(),
            };
            Ok(FunctionSourceMap {
                local_name,
                locations,
            })
        })
    })?;
    Ok(DebugDatabase {
        locations,
        functions,
    })
}

fn location(r: &mut Reader<'_>, kind: u8, t: &Table) -> Result<Location> {
    Ok(match kind {
        1 => Location::CallSite {
            callee: r.i32_field(t, 0, "callee", 0)?,
            caller: r.i32_field(t, 1, "caller", 0)?,
        },
        2 => Location::FileLineCol {
            filename: r.owned_string_field(t, 0, "filename")?.unwrap_or_default(),
            line: r.i32_field(t, 1, "line", 0)?,
            column: r.i32_field(t, 2, "column", 0)?,
        },
        3 => {
            let metadata = r.owned_string_field(t, 0, "metadata")?;
            let locations = match r.vector_field(t, 1, 4, "locations")? {
                Some(v) => {
                    r.charge(v.len.saturating_mul(4))?;
                    let mut out = Vec::with_capacity(v.len);
                    for i in 0..v.len {
                        out.push(r.i32_at(r.elem(&v, i)?, "location")?);
                    }
                    out
                }
                None => Vec::new(),
            };
            Location::Fused {
                metadata,
                locations,
            }
        }
        4 => Location::Name {
            name: r.owned_string_field(t, 0, "name")?.unwrap_or_default(),
            child: if r.has(t, 1, 4, "child_location")? {
                Some(r.i32_field(t, 1, "child_location", 0)?)
            } else {
                None
            },
        },
        _ => Location::Unknown,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn err_of(bytes: Vec<u8>) -> Status {
        Archive::parse(ModuleBytes::from_vec(bytes)).unwrap_err()
    }

    #[test]
    fn locates_plain_and_zip_wrapped_flatbuffers() {
        let mut plain = vec![0u8; 20];
        plain[0..4].copy_from_slice(&12u32.to_le_bytes());
        assert_eq!(locate_flatbuffer(&plain).unwrap(), 4..16);

        let mut zip = vec![0u8; 30 + 3 + 2];
        zip[0..4].copy_from_slice(&ZIP_LOCAL_FILE_HEADER_SIGNATURE.to_le_bytes());
        zip[26..28].copy_from_slice(&3u16.to_le_bytes());
        zip[28..30].copy_from_slice(&2u16.to_le_bytes());
        zip.extend_from_slice(&16u32.to_le_bytes());
        zip.extend_from_slice(&[0u8; 16]);
        assert_eq!(locate_flatbuffer(&zip).unwrap(), 39..55);

        zip[28..30].copy_from_slice(&0xFFFFu16.to_le_bytes());
        let e = locate_flatbuffer(&zip).unwrap_err();
        assert!(e.message().contains("ZIP"), "{}", e.message());
    }

    #[test]
    fn rejects_short_and_oversized_prefixes() {
        let e = err_of(vec![1, 2, 3]);
        assert_eq!(e.code(), StatusCode::InvalidArgument);
        assert!(e.message().contains("truncated"), "{}", e.message());
        let mut b = vec![0u8; 32];
        b[0..4].copy_from_slice(&100u32.to_le_bytes());
        let e = err_of(b);
        assert!(e.message().contains("100 bytes"), "{}", e.message());
        let mut b = vec![0u8; 32];
        b[0..4].copy_from_slice(&28u32.to_le_bytes());
        b[8..12].copy_from_slice(b"ABC\x01");
        let e = err_of(b);
        assert_eq!(
            e.message(),
            "vmfb: file identifier at offset 0x8 is 'ABC.', expected 'IREE'"
        );
    }

    fn db(locations: Vec<Location>) -> DebugDatabase {
        DebugDatabase {
            locations,
            functions: vec![FunctionSourceMap {
                local_name: "f".into(),
                locations: vec![
                    SourceMapEntry {
                        bytecode_offset: 4,
                        location: 0,
                    },
                    SourceMapEntry {
                        bytecode_offset: 8,
                        location: 3,
                    },
                    SourceMapEntry {
                        bytecode_offset: 12,
                        location: 99,
                    },
                    SourceMapEntry {
                        bytecode_offset: 16,
                        location: -1,
                    },
                ],
            }],
        }
    }

    #[test]
    fn resolves_locations_through_names_fused_and_call_sites() {
        let d = db(vec![
            Location::Name {
                name: "n".into(),
                child: Some(1),
            },
            Location::Fused {
                metadata: None,
                locations: vec![2, 4],
            },
            Location::CallSite {
                callee: 5,
                caller: 4,
            },
            Location::Unknown,
            Location::FileLineCol {
                filename: "caller.mlir".into(),
                line: 1,
                column: 2,
            },
            Location::FileLineCol {
                filename: "callee.mlir".into(),
                line: 3,
                column: 4,
            },
        ]);
        assert_eq!(d.resolve_location(0, 4).as_deref(), Some("callee.mlir:3:4"));
        assert_eq!(d.resolve_location(0, 8), None);
        assert_eq!(d.resolve_location(0, 12), None);
        assert_eq!(d.resolve_location(0, 16), None);
        assert_eq!(d.resolve_location(0, 5), None);
        assert_eq!(d.resolve_location(1, 4), None);
    }

    #[test]
    fn location_cycles_terminate() {
        let d = db(vec![
            Location::Name {
                name: "a".into(),
                child: Some(1),
            },
            Location::Fused {
                metadata: None,
                locations: vec![0, 1, 2],
            },
            Location::CallSite {
                callee: 0,
                caller: 2,
            },
        ]);
        assert_eq!(d.resolve_location(0, 4), None);
        assert_eq!(d.file_line_col(2), None);
    }
}
