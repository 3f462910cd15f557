//! `system-elf-*` executables: a regular shared object loaded by the system
//! dynamic loader.
//!
//! As upstream (`system_library_loader.c`): strip the optional debug footer,
//! write the library bytes to a fresh temporary file, `dlopen` it (lazy,
//! local), delete the file, and look up `iree_hal_executable_library_query`.
//! The loaded object's bounds come from its program headers
//! (`dl_iterate_phdr`, picking the object `dladdr` names for the query
//! symbol), so the library tables are read through the same bounds checks as
//! an embedded ELF image.

use super::abi;
use super::ImageView;
use ferrite_base::{Result, Status, StatusCode};
use std::ffi::{c_int, c_void, CStr};
use std::io::Write;

/// Format prefix of system shared-library executables (upstream's
/// `system-<dylib type>-<arch>`; the dylib type is `elf` on Linux).
pub const FORMAT_PREFIX: &str = "system-elf-";

/// Whether `format` names a system shared library this host can load.
pub fn supports_format(format: &str) -> bool {
    format.strip_prefix(FORMAT_PREFIX) == Some(super::container::HOST_ARCH)
}

/// Magic of the optional footer carrying an embedded debug database.
const FOOTER_MAGIC: &[u8; 8] = b"IREEDBG\0";
/// Size of the footer: magic, version, flags and four u64 fields.
const FOOTER_SIZE: usize = 48;

/// The shared-library bytes of `data`: all of it, or the prefix a debug
/// footer names.
pub fn library_bytes(data: &[u8]) -> Result<&[u8]> {
    let Some(start) = data.len().checked_sub(FOOTER_SIZE) else {
        return Ok(data);
    };
    let footer = &data[start..];
    if &footer[..8] != FOOTER_MAGIC {
        return Ok(data);
    }
    let u64_at = |o: usize| {
        let mut b = [0u8; 8];
        b.copy_from_slice(&footer[o..o + 8]);
        u64::from_le_bytes(b)
    };
    let (library_size, debug_offset, debug_size) = (u64_at(24), u64_at(32), u64_at(40));
    let limit = start as u64;
    if library_size > limit
        || debug_offset
            .checked_add(debug_size)
            .is_none_or(|e| e > limit)
    {
        return Err(Status::new(
            StatusCode::OutOfRange,
            "system library footer references out of range bytes",
        ));
    }
    Ok(&data[..library_size as usize])
}

/// One `PT_LOAD` segment of the loaded object, at runtime addresses.
#[derive(Clone, Copy, Debug)]
struct Segment {
    start: usize,
    end: usize,
    flags: u32,
}

/// A shared library opened with `dlopen`, with the bounds of its segments.
pub struct DylibImage {
    segments: Vec<Segment>,
    query: usize,
    // Closed (dlclose) on drop; every address above points into it.
    _library: libloading::Library,
}

impl std::fmt::Debug for DylibImage {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DylibImage")
            .field("segments", &self.segments)
            .field("query", &format_args!("{:#x}", self.query))
            .finish()
    }
}

fn failed(msg: impl Into<String>) -> Status {
    Status::new(StatusCode::FailedPrecondition, msg)
}

struct PhdrSearch {
    base: usize,
    query: usize,
    found: Option<Vec<Segment>>,
}

/// `dl_iterate_phdr` callback: records the `PT_LOAD` segments of the object
/// whose segments hold both the `dladdr` base and the query function.
unsafe extern "C" fn phdr_callback(
    info: *mut libc::dl_phdr_info,
    _size: libc::size_t,
    data: *mut c_void,
) -> c_int {
    // SAFETY: `data` is the `&mut PhdrSearch` passed to `dl_iterate_phdr` by
    // `find_segments`, alive and not otherwise borrowed during the iteration.
    let search = unsafe { &mut *data.cast::<PhdrSearch>() };
    // SAFETY: the dynamic loader passes a valid `dl_phdr_info` for the duration
    // of the callback.
    let info = unsafe { &*info };
    if info.dlpi_phdr.is_null() {
        return 0;
    }
    // SAFETY: `dlpi_phdr` points at `dlpi_phnum` program headers of a loaded
    // object, valid while it stays loaded (at least during the callback).
    let phdrs = unsafe { std::slice::from_raw_parts(info.dlpi_phdr, info.dlpi_phnum as usize) };
    let bias = info.dlpi_addr as usize;
    let segments: Vec<Segment> = phdrs
        .iter()
        .filter(|p| p.p_type == libc::PT_LOAD && p.p_memsz > 0)
        .filter_map(|p| {
            let start = bias.checked_add(p.p_vaddr as usize)?;
            let end = start.checked_add(p.p_memsz as usize)?;
            Some(Segment {
                start,
                end,
                flags: p.p_flags,
            })
        })
        .collect();
    let page = 4096usize;
    let holds = |addr: usize, page_aligned: bool| {
        segments.iter().any(|s| {
            let start = if page_aligned {
                s.start & !(page - 1)
            } else {
                s.start
            };
            addr >= start && addr < s.end
        })
    };
    if holds(search.base, true) && holds(search.query, false) {
        search.found = Some(segments);
        return 1;
    }
    0
}

/// The `PT_LOAD` segments of the loaded object holding `query`.
fn find_segments(query: usize) -> Result<Vec<Segment>> {
    // SAFETY: an all-zero `Dl_info` is a valid value (null pointers).
    let mut dl_info: libc::Dl_info = unsafe { std::mem::zeroed() };
    // SAFETY: `dladdr` only inspects the address and fills `dl_info`.
    let rc = unsafe { libc::dladdr(query as *const c_void, &mut dl_info) };
    if rc == 0 || dl_info.dli_fbase.is_null() {
        return Err(failed("dladdr found no object for the query function"));
    }
    let mut search = PhdrSearch {
        base: dl_info.dli_fbase as usize,
        query,
        found: None,
    };
    // SAFETY: the callback only reads the loader's program headers and writes
    // `search`, which outlives the call.
    unsafe {
        libc::dl_iterate_phdr(
            Some(phdr_callback),
            (&mut search as *mut PhdrSearch).cast::<c_void>(),
        )
    };
    search
        .found
        .ok_or_else(|| failed("no loaded object holds the query function"))
}

impl DylibImage {
    /// Writes `data` (a shared object, with an optional debug footer) to a
    /// temporary file, opens it with the system loader and finds the query
    /// function. The file is deleted once opened.
    pub fn open(data: &[u8]) -> Result<DylibImage> {
        let bytes = library_bytes(data)?;
        if bytes.get(..4) != Some(&super::container::ELF_MAGIC[..]) {
            return Err(Status::new(
                StatusCode::InvalidArgument,
                "system library data is not an ELF shared object",
            ));
        }
        let io = |what: &str, e: std::io::Error| {
            Status::new(
                StatusCode::Unavailable,
                format!("{what} a temporary file for the system library: {e}"),
            )
        };
        let mut file = tempfile::Builder::new()
            .prefix("ferrite-executable-")
            .suffix(".so")
            .tempfile()
            .map_err(|e| io("creating", e))?;
        file.write_all(bytes).map_err(|e| io("writing", e))?;
        file.flush().map_err(|e| io("writing", e))?;
        // SAFETY: opening runs the library's initializers; executables are
        // trusted code, as upstream (which loads them the same way).
        let opened = unsafe { libloading::Library::new(file.path()) };
        // Delete the file whether or not it loaded; a mapped library stays valid.
        let _ = file.close();
        let library = opened.map_err(|e| {
            Status::new(
                StatusCode::FailedPrecondition,
                format!("dlopen of the system library failed: {e}"),
            )
        })?;
        let symbol = format!("{}\0", abi::QUERY_SYMBOL);
        // SAFETY: only the address is taken; it is called later through the
        // library ABI's query type after bounds checks.
        let query = unsafe { library.get::<*const c_void>(symbol.as_bytes()) }
            .map(|s| *s as usize)
            .map_err(|_| {
                Status::new(
                    StatusCode::NotFound,
                    format!("symbol '{}' not exported", abi::QUERY_SYMBOL),
                )
            })?;
        let segments = find_segments(query)?;
        Ok(DylibImage {
            segments,
            query,
            _library: library,
        })
    }

    /// Runtime address of `iree_hal_executable_library_query`.
    pub fn query_address(&self) -> usize {
        self.query
    }

    fn segment_of(&self, addr: usize) -> Option<&Segment> {
        self.segments
            .iter()
            .find(|s| addr >= s.start && addr < s.end && s.flags & libc::PF_R != 0)
    }
}

impl ImageView for DylibImage {
    fn slice_at(&self, addr: usize, len: usize) -> Option<&[u8]> {
        let seg = self.segment_of(addr)?;
        if addr.checked_add(len)? > seg.end {
            return None;
        }
        // SAFETY: `addr..addr+len` lies in one readable PT_LOAD segment of the
        // library, mapped while `self._library` keeps it open.
        Some(unsafe { std::slice::from_raw_parts(addr as *const u8, len) })
    }

    fn c_str_at(&self, addr: usize) -> Option<&CStr> {
        let seg = self.segment_of(addr)?;
        let rest = self.slice_at(addr, seg.end - addr)?;
        CStr::from_bytes_until_nul(rest).ok()
    }

    fn is_executable(&self, addr: usize) -> bool {
        self.segments
            .iter()
            .any(|s| addr >= s.start && addr < s.end && s.flags & libc::PF_X != 0)
    }
}
