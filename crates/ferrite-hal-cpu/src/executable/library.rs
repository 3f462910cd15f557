//! [`ExecutableLibrary`]: a loaded CPU executable and serial dispatch.
//!
//! Loading: pick the host ELF out of the container, load it with our own
//! loader and run its initializers (`embedded-elf-*`), or open a shared object
//! with the system loader (`system-elf-*`, see [`super::dylib`]); then call `iree_hal_executable_library_query` with
//! version 0.6 and our environment, then read and check the library tables
//! (every pointer must land inside the image; dispatch functions inside its
//! executable pages): header (version 0.6, no sanitizer), imports (resolved by
//! name against an [`ImportTable`]; a `?` prefix marks an optional import that
//! may stay unresolved), exports (names, attributes, tags, source locations)
//! and the executable constant count.
//!
//! Dispatch: [`ExecutableLibrary::dispatch`] runs the workgroups of one export
//! serially on the calling thread, each with the export's local memory, and
//! fails when a workgroup returns non-zero.

use super::abi::{
    self, DispatchAttrsV0, DispatchFnV0, EnvironmentV0, ImportFnV0, LibraryHeader, LibraryV0,
    ProcessorV0,
};
use super::container;
use super::dylib::{self, DylibImage};
use super::elf::{ElfFile, LoadedElf};
use super::ImageView;
use ferrite_base::{Result, Status, StatusCode};
use smallvec::SmallVec;
use std::collections::HashMap;
use std::ffi::{c_int, c_void, CStr};
use std::ops::Range;

/// Most exports or imports a library may declare.
pub const MAX_TABLE_COUNT: u32 = 1 << 16;

/// A host function an executable may import, with its context pointer.
#[derive(Clone, Copy, Debug)]
pub struct ImportFunction {
    /// The function (`int fn(void* params, void* context, void* reserved)`).
    pub func: ImportFnV0,
    /// Passed as `context` on every call.
    pub context: *const c_void,
}

// SAFETY: the context pointer is only handed to `func`; whoever registered it
// through `ImportTable::register_with_context` promised it may be used from any
// thread for as long as the table or a library resolved against it lives.
unsafe impl Send for ImportFunction {}
// SAFETY: as above; the pair is never mutated after registration.
unsafe impl Sync for ImportFunction {}

/// Host functions offered to executables' imports, by symbol name.
#[derive(Clone, Debug, Default)]
pub struct ImportTable {
    entries: HashMap<String, ImportFunction>,
}

impl ImportTable {
    /// An empty table.
    pub fn new() -> ImportTable {
        ImportTable::default()
    }

    /// Offers `func` under `name` with a null context.
    pub fn register(&mut self, name: impl Into<String>, func: ImportFnV0) {
        self.entries.insert(
            name.into(),
            ImportFunction {
                func,
                context: std::ptr::null(),
            },
        );
    }

    /// Offers `func` under `name`, called with `context`.
    ///
    /// # Safety
    /// `context` must stay valid, and usable from any thread, for as long as
    /// this table or any library resolved against it lives.
    // SAFETY: the caller keeps `context` valid and thread-safe for the table's
    // lifetime (contract above); the table only stores it.
    pub unsafe fn register_with_context(
        &mut self,
        name: impl Into<String>,
        func: ImportFnV0,
        context: *const c_void,
    ) {
        self.entries
            .insert(name.into(), ImportFunction { func, context });
    }

    /// The function offered under `name`.
    pub fn resolve(&self, name: &str) -> Option<ImportFunction> {
        self.entries.get(name).copied()
    }
}

/// How to load a library.
#[derive(Clone, Copy, Debug, Default)]
pub struct LoadOptions<'a> {
    /// The executable format from the module (e.g. `embedded-elf-x86_64`);
    /// checked when given.
    pub format: Option<&'a str>,
    /// Executable-level constants; must match the library's constant count.
    pub constants: &'a [u32],
    /// Host functions for the library's imports.
    pub imports: Option<&'a ImportTable>,
    /// Processor data for the environment; the host's when `None`.
    pub processor: Option<ProcessorV0>,
}

/// An export (dispatch function) of a library.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ExportInfo {
    /// Index in the export table.
    pub ordinal: u32,
    /// Function name (the name `hal.executable.lookup.function` asks for).
    pub name: String,
    /// Optional tag.
    pub tag: Option<String>,
    /// Raw attributes.
    pub attrs: DispatchAttrsV0,
    /// Workgroup size (x, y, z; zeros in the attributes read as 1).
    pub workgroup_size: [u32; 3],
    /// Local memory each workgroup needs, in bytes.
    pub local_memory_size: usize,
    /// Dispatch constants the function reads.
    pub constant_count: u32,
    /// Bindings the function reads or writes.
    pub binding_count: u32,
    /// Workgroups must run in order, one at a time.
    pub sequential: bool,
    /// The workgroup size is chosen at dispatch time.
    pub dynamic_workgroup_size: bool,
    /// Source file and line, when the library records them.
    pub source_location: Option<(String, u32)>,
}

/// An import of a library.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ImportInfo {
    /// Symbol name without the optional marker.
    pub name: String,
    /// Whether the import may stay unresolved (`?` prefix).
    pub optional: bool,
    /// Whether a host function was found.
    pub resolved: bool,
}

/// How to run one dispatch.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DispatchConfig {
    /// Number of workgroups in x, y, z (z at most 65535).
    pub workgroup_count: [u32; 3],
    /// Workgroup size; the export's static size when `None`.
    pub workgroup_size: Option<[u32; 3]>,
    /// Linear workgroup indices to run (x fastest, then y, then z); all when
    /// `None`. Lets callers split one dispatch across threads.
    pub workgroups: Option<Range<u64>>,
    /// Reported to the kernel as `processor_id`.
    pub processor_id: u32,
    /// Reported to the kernel as `max_concurrency` (at least 1).
    pub max_concurrency: u8,
}

impl DispatchConfig {
    /// Every workgroup of a `count` grid, processor 0, concurrency 1.
    pub fn new(workgroup_count: [u32; 3]) -> DispatchConfig {
        DispatchConfig {
            workgroup_count,
            workgroup_size: None,
            workgroups: None,
            processor_id: 0,
            max_concurrency: 1,
        }
    }
}

/// The host's processor data in IREE's `cpu_data.h` layout (x86-64 word 0),
/// from [`crate::cpu_features::host_cpu_data`]; device queries answer from
/// it from now on ([`crate::cpu_features::mark_loaded`]).
pub fn host_processor() -> ProcessorV0 {
    crate::cpu_features::mark_loaded();
    ProcessorV0 {
        data: crate::cpu_features::host_cpu_data(),
    }
}

/// The thunk every import call goes through: calls `fn_ptr` (or fails with -1
/// when an unresolved optional import is called anyway).
unsafe extern "C" fn import_thunk(
    fn_ptr: Option<ImportFnV0>,
    params: *mut c_void,
    context: *mut c_void,
    reserved: *mut c_void,
) -> c_int {
    match fn_ptr {
        // SAFETY: `f` came from the ImportTable the library was resolved
        // against; its registrant provided a function following the import ABI
        // and a context valid for it; params/reserved come from the executable.
        Some(f) => unsafe { f(params, context, reserved) },
        None => -1,
    }
}

/// The image a library was loaded into.
#[derive(Debug)]
enum LoadedImage {
    /// Loaded by our own ELF loader.
    Elf(LoadedElf),
    /// Opened by the system dynamic loader.
    Dylib(DylibImage),
}

impl ImageView for LoadedImage {
    fn slice_at(&self, addr: usize, len: usize) -> Option<&[u8]> {
        match self {
            LoadedImage::Elf(e) => ImageView::slice_at(e, addr, len),
            LoadedImage::Dylib(d) => d.slice_at(addr, len),
        }
    }

    fn c_str_at(&self, addr: usize) -> Option<&CStr> {
        match self {
            LoadedImage::Elf(e) => e.c_str_at(addr),
            LoadedImage::Dylib(d) => d.c_str_at(addr),
        }
    }

    fn is_executable(&self, addr: usize) -> bool {
        match self {
            LoadedImage::Elf(e) => e.is_executable(addr),
            LoadedImage::Dylib(d) => d.is_executable(addr),
        }
    }
}

#[repr(C, align(64))]
#[derive(Clone, Copy)]
struct CacheLine([u8; 64]);

/// A loaded CPU executable.
pub struct ExecutableLibrary {
    environment: Box<EnvironmentV0>,
    _import_funcs: Box<[Option<ImportFnV0>]>,
    _import_contexts: Box<[*const c_void]>,
    _constants: Box<[u32]>,
    name: String,
    header: LibraryHeader,
    exports: Vec<ExportInfo>,
    dispatch_fns: Vec<DispatchFnV0>,
    imports: Vec<ImportInfo>,
    constant_count: u32,
    // Declared last so it is dropped last: every pointer above points into it.
    image: LoadedImage,
}

// SAFETY: after loading, the environment, tables and image are only read by
// Rust; the executable's dispatch functions are re-entrant by contract (upstream
// runs one library's workgroups on many threads at once), and import contexts
// were registered as thread-safe (`ImportTable::register_with_context`).
unsafe impl Send for ExecutableLibrary {}
// SAFETY: as above; `&self` methods never mutate shared state.
unsafe impl Sync for ExecutableLibrary {}

impl std::fmt::Debug for ExecutableLibrary {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ExecutableLibrary")
            .field("name", &self.name)
            .field("exports", &self.exports)
            .field("imports", &self.imports)
            .finish()
    }
}

fn failed(msg: impl Into<String>) -> Status {
    Status::new(StatusCode::FailedPrecondition, msg)
}

impl ExecutableLibrary {
    /// Loads a library from executable data: a bare ELF or a FatELF, or a
    /// system shared object when `options.format` is `system-elf-*`.
    ///
    /// Loading runs code from `data`: the ELF's initializers (or, for a
    /// system shared object, the system loader's constructors) and the
    /// library query function. Everything around that code is checked first
    /// (container, headers, segments inside the file, relocations, and every
    /// address called lies in the file bytes of an executable segment); the
    /// machine code itself cannot be checked.
    ///
    /// # Safety
    /// `data` must be trusted native code for this host: an executable
    /// produced by the IREE compiler for the CPU library ABI (as upstream
    /// trusts it). Its initializers, query function and, later, its dispatch
    /// functions run with the process's full rights.
    // SAFETY: the caller vouches for the code (contract above); the body
    // checks every address before calling it.
    pub unsafe fn load(data: &[u8], options: &LoadOptions<'_>) -> Result<ExecutableLibrary> {
        if let Some(format) = options.format {
            if dylib::supports_format(format) {
                // SAFETY: the caller vouches for the code (contract above).
                return unsafe { Self::load_system_dylib(data, options) };
            }
            if !container::supports_format(format) {
                return Err(Status::new(
                    StatusCode::Unimplemented,
                    format!(
                        "executable format '{format}' not supported (this loader runs {}{})",
                        container::FORMAT_PREFIX,
                        container::HOST_ARCH
                    ),
                ));
            }
        }
        let elf_bytes = container::select_elf(data)?;
        let elf = ElfFile::parse(elf_bytes)?.load()?;
        Self::from_elf(elf, options).map_err(|e| e.annotate("loading an embedded-elf executable"))
    }

    /// Loads a `system-elf-*` executable: the data is a shared object
    /// (optionally followed by a debug footer) opened with the system loader.
    ///
    /// # Safety
    /// As [`ExecutableLibrary::load`]: the system loader runs the object's
    /// constructors, and loading calls its query function.
    // SAFETY: the caller vouches for the code (contract above).
    pub unsafe fn load_system_dylib(
        data: &[u8],
        options: &LoadOptions<'_>,
    ) -> Result<ExecutableLibrary> {
        let load = || {
            let image = DylibImage::open(data)?;
            let query_addr = image.query_address();
            if !image.is_executable(query_addr) {
                return Err(failed(format!(
                    "'{}' is not in executable pages",
                    abi::QUERY_SYMBOL
                )));
            }
            Self::from_image(LoadedImage::Dylib(image), query_addr, options)
        };
        load().map_err(|e| e.annotate("loading a system-elf executable"))
    }

    fn from_elf(elf: LoadedElf, options: &LoadOptions<'_>) -> Result<ExecutableLibrary> {
        // Every address is checked before any code runs: the query function
        // here, initializers when the image was loaded.
        let query_addr = elf.lookup_function(abi::QUERY_SYMBOL)?;
        // SAFETY: the image is trusted code (`ExecutableLibrary::load`'s
        // contract); initializer addresses were checked at load to lie in the
        // file bytes of its executable segments.
        unsafe { elf.run_initializers()? };
        Self::from_image(LoadedImage::Elf(elf), query_addr, options)
    }

    /// Queries the library at `query_addr` (checked to lie in the image's
    /// executable pages) and reads its tables through the image's bounds.
    fn from_image(
        image: LoadedImage,
        query_addr: usize,
        options: &LoadOptions<'_>,
    ) -> Result<ExecutableLibrary> {
        let elf = &image;
        let constants: Box<[u32]> = options.constants.into();
        let mut environment = Box::new(EnvironmentV0 {
            constants: constants.as_ptr(),
            import_thunk: Some(import_thunk),
            import_funcs: std::ptr::null(),
            import_contexts: std::ptr::null(),
            processor: options.processor.unwrap_or_else(host_processor),
        });
        // SAFETY: `query_addr` is the executable's exported query function inside
        // its executable pages; trusted code following the library ABI.
        let query: abi::QueryFn = unsafe { std::mem::transmute::<usize, abi::QueryFn>(query_addr) };
        // SAFETY: as above; the environment is a valid, boxed (stable) EnvironmentV0
        // that outlives the library, and the image stays mapped while `elf` lives.
        let result = unsafe { query(abi::LIBRARY_VERSION_LATEST, &*environment) } as usize;
        if result == 0 {
            return Err(Status::new(
                StatusCode::Incompatible,
                format!(
                    "executable does not support library ABI version {:#010x}",
                    abi::LIBRARY_VERSION_LATEST
                ),
            ));
        }
        let library: LibraryV0 = elf
            .read(result)
            .ok_or_else(|| failed("library descriptor lies outside the image"))?;
        let header: LibraryHeader = elf
            .read(library.header as usize)
            .ok_or_else(|| failed("library header lies outside the image"))?;
        if header.version != abi::LIBRARY_VERSION_0_6 {
            return Err(Status::new(
                StatusCode::Incompatible,
                format!(
                    "executable library version {:#010x} unsupported (need {:#010x})",
                    header.version,
                    abi::LIBRARY_VERSION_0_6
                ),
            ));
        }
        if header.sanitizer != abi::SANITIZER_NONE {
            return Err(Status::new(
                StatusCode::Unavailable,
                format!(
                    "executable requires sanitizer {}; not supported",
                    header.sanitizer
                ),
            ));
        }
        let name = string_at(elf, header.name as usize)
            .ok_or_else(|| failed("library name outside the image"))?;

        // Imports.
        let import_count = library.imports.count;
        if import_count > MAX_TABLE_COUNT {
            return Err(failed(format!("{import_count} imports exceeds the limit")));
        }
        let mut imports = Vec::new();
        let mut import_funcs = Vec::new();
        let mut import_contexts = Vec::new();
        for i in 0..import_count as usize {
            let sym_ptr: usize = read_entry(
                elf,
                library.imports.symbols as usize,
                i,
                "import symbol table",
            )?;
            let raw = string_at(elf, sym_ptr)
                .ok_or_else(|| failed(format!("import {i} name outside the image")))?;
            let (optional, name) = match raw.strip_prefix('?') {
                Some(n) => (true, n.to_string()),
                None => (false, raw),
            };
            let resolved = options.imports.and_then(|t| t.resolve(&name));
            if resolved.is_none() && !optional {
                return Err(Status::new(
                    StatusCode::NotFound,
                    format!("required executable import '{name}' not provided"),
                ));
            }
            import_funcs.push(resolved.map(|r| r.func));
            import_contexts.push(resolved.map_or(std::ptr::null(), |r| r.context));
            imports.push(ImportInfo {
                name,
                optional,
                resolved: resolved.is_some(),
            });
        }
        let import_funcs: Box<[Option<ImportFnV0>]> = import_funcs.into();
        let import_contexts: Box<[*const c_void]> = import_contexts.into();
        if import_count > 0 {
            environment.import_funcs = import_funcs.as_ptr();
            environment.import_contexts = import_contexts.as_ptr();
        }

        // Exports.
        let ex = library.exports;
        if ex.count > MAX_TABLE_COUNT {
            return Err(failed(format!("{} exports exceeds the limit", ex.count)));
        }
        if ex.count > 0 && ex.attrs.is_null() {
            return Err(failed(
                "executable exports must provide dispatch attributes",
            ));
        }
        if ex.count > 0 && ex.names.is_null() {
            return Err(failed("executable exports must provide function names"));
        }
        let mut exports = Vec::with_capacity(ex.count as usize);
        let mut dispatch_fns = Vec::with_capacity(ex.count as usize);
        for i in 0..ex.count as usize {
            let fn_addr: usize = read_entry(elf, ex.ptrs as usize, i, "export function table")?;
            if !elf.is_executable(fn_addr) {
                return Err(failed(format!(
                    "export {i} function is not in executable pages"
                )));
            }
            // SAFETY: the address lies in the image's executable pages; the
            // library ABI says it is a dispatch function (trusted code).
            dispatch_fns.push(unsafe { std::mem::transmute::<usize, DispatchFnV0>(fn_addr) });
            let attrs: DispatchAttrsV0 =
                read_entry(elf, ex.attrs as usize, i, "export attributes")?;
            let name_ptr: usize = read_entry(elf, ex.names as usize, i, "export name table")?;
            let name = string_at(elf, name_ptr)
                .filter(|n| !n.is_empty())
                .ok_or_else(|| failed(format!("export {i} has no name")))?;
            let tag = if ex.tags.is_null() {
                None
            } else {
                let p: usize = read_entry(elf, ex.tags as usize, i, "export tag table")?;
                if p == 0 {
                    None
                } else {
                    string_at(elf, p)
                }
            };
            let source_location = if ex.source_locations.is_null() {
                None
            } else {
                let loc: abi::SourceLocationV0 =
                    read_entry(elf, ex.source_locations as usize, i, "source locations")?;
                let path = elf
                    .slice_at(loc.path as usize, loc.path_length as usize)
                    .map(|b| String::from_utf8_lossy(b).into_owned());
                path.map(|p| (p, loc.line))
            };
            if attrs.constant_count as usize > abi::MAX_CONSTANT_COUNT
                || attrs.binding_count as usize > abi::MAX_BINDING_COUNT
            {
                return Err(Status::new(
                    StatusCode::OutOfRange,
                    format!(
                        "export '{name}' declares {} constants and {} bindings (limits {} and {})",
                        attrs.constant_count,
                        attrs.binding_count,
                        abi::MAX_CONSTANT_COUNT,
                        abi::MAX_BINDING_COUNT
                    ),
                ));
            }
            let one = |v: u32| v.max(1);
            exports.push(ExportInfo {
                ordinal: i as u32,
                name,
                tag,
                attrs,
                workgroup_size: [
                    one(attrs.workgroup_size_x),
                    one(attrs.workgroup_size_y),
                    one(attrs.workgroup_size_z as u32),
                ],
                local_memory_size: attrs.local_memory_pages as usize
                    * abi::WORKGROUP_LOCAL_MEMORY_PAGE_SIZE,
                constant_count: attrs.constant_count as u32,
                binding_count: attrs.binding_count as u32,
                sequential: attrs.flags & abi::DISPATCH_FLAG_V0_SEQUENTIAL != 0,
                dynamic_workgroup_size: attrs.flags & abi::DISPATCH_FLAG_V0_WORKGROUP_SIZE_DYNAMIC
                    != 0,
                source_location,
            });
        }

        let constant_count = library.constants.count;
        if constant_count as usize != constants.len() {
            return Err(failed(format!(
                "executable requires {constant_count} constants but {} were provided",
                constants.len()
            )));
        }

        Ok(ExecutableLibrary {
            environment,
            _import_funcs: import_funcs,
            _import_contexts: import_contexts,
            _constants: constants,
            name,
            header,
            exports,
            dispatch_fns,
            imports,
            constant_count,
            image,
        })
    }

    /// The library name from its header.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The library header (version, features, sanitizer; `name` points into
    /// the image).
    pub fn header(&self) -> &LibraryHeader {
        &self.header
    }

    /// Every export, by ordinal.
    pub fn exports(&self) -> &[ExportInfo] {
        &self.exports
    }

    /// The export at `ordinal`.
    pub fn export(&self, ordinal: u32) -> Option<&ExportInfo> {
        self.exports.get(ordinal as usize)
    }

    /// The ordinal of the export named `name`.
    pub fn lookup_export(&self, name: &str) -> Option<u32> {
        self.exports
            .iter()
            .find(|e| e.name == name)
            .map(|e| e.ordinal)
    }

    /// Every import, in the library's order.
    pub fn imports(&self) -> &[ImportInfo] {
        &self.imports
    }

    /// Number of executable-level constants the library reads.
    pub fn constant_count(&self) -> u32 {
        self.constant_count
    }

    /// The environment passed to every call.
    pub fn environment(&self) -> &EnvironmentV0 {
        &self.environment
    }

    /// The processor data in the environment.
    pub fn processor(&self) -> &ProcessorV0 {
        &self.environment.processor
    }

    /// The image loaded by our own ELF loader (`None` for a system shared
    /// library).
    pub fn image(&self) -> Option<&LoadedElf> {
        match &self.image {
            LoadedImage::Elf(e) => Some(e),
            LoadedImage::Dylib(_) => None,
        }
    }

    /// Runs export `ordinal` over the workgroups of `config`, serially on the
    /// calling thread. `bindings` are (base pointer, length in bytes) pairs.
    ///
    /// # Safety
    /// Calls trusted native code that reads and writes the bindings as the
    /// compiled program dictates: every binding must be valid for reads and
    /// writes of its length, not otherwise accessed during the call, and large
    /// enough for the shapes the export was compiled for (or sized by the
    /// constants passed); `constants` must carry the values the export expects.
    // SAFETY: the caller guarantees the bindings (contract above); the body
    // checks ordinal, counts and ranges before calling the kernel.
    pub unsafe fn dispatch(
        &self,
        ordinal: u32,
        config: &DispatchConfig,
        constants: &[u32],
        bindings: &[(*mut u8, usize)],
    ) -> Result<()> {
        // Inline for the usual handful of bindings: no allocation per dispatch.
        let binding_ptrs: SmallVec<[*mut c_void; 8]> =
            bindings.iter().map(|b| b.0.cast()).collect();
        let binding_lengths: SmallVec<[usize; 8]> = bindings.iter().map(|b| b.1).collect();
        // SAFETY: the same bindings, split into the two arrays the ABI takes;
        // the caller's guarantees carry over.
        unsafe { self.dispatch_split(ordinal, config, constants, &binding_ptrs, &binding_lengths) }
    }

    /// [`ExecutableLibrary::dispatch`] with the bindings already split into
    /// the base pointers and byte lengths the executable ABI takes (same
    /// length; extra lengths are ignored).
    ///
    /// # Safety
    /// As [`ExecutableLibrary::dispatch`], for each (pointer, length) pair.
    // SAFETY: see `dispatch`.
    pub unsafe fn dispatch_split(
        &self,
        ordinal: u32,
        config: &DispatchConfig,
        constants: &[u32],
        binding_ptrs: &[*mut c_void],
        binding_lengths: &[usize],
    ) -> Result<()> {
        if binding_lengths.len() < binding_ptrs.len() {
            return Err(Status::new(
                StatusCode::InvalidArgument,
                format!(
                    "{} binding pointers but {} lengths",
                    binding_ptrs.len(),
                    binding_lengths.len()
                ),
            ));
        }
        let bindings = binding_ptrs;
        let export = self.exports.get(ordinal as usize).ok_or_else(|| {
            Status::new(
                StatusCode::InvalidArgument,
                format!(
                    "export ordinal {ordinal} out of range ({} exports)",
                    self.exports.len()
                ),
            )
        })?;
        let func = self.dispatch_fns[ordinal as usize];
        let invalid = |m: String| {
            Status::new(
                StatusCode::InvalidArgument,
                format!("dispatch of '{}': {m}", export.name),
            )
        };
        if constants.len() < export.constant_count as usize
            || constants.len() > abi::MAX_CONSTANT_COUNT
        {
            return Err(invalid(format!(
                "{} constants given, export needs {} (limit {})",
                constants.len(),
                export.constant_count,
                abi::MAX_CONSTANT_COUNT
            )));
        }
        if bindings.len() < export.binding_count as usize || bindings.len() > abi::MAX_BINDING_COUNT
        {
            return Err(invalid(format!(
                "{} bindings given, export needs {} (limit {})",
                bindings.len(),
                export.binding_count,
                abi::MAX_BINDING_COUNT
            )));
        }
        let [cx, cy, cz] = config.workgroup_count;
        let cz16 = u16::try_from(cz)
            .map_err(|_| invalid(format!("workgroup count z {cz} exceeds 65535")))?;
        let size = match config.workgroup_size {
            Some(s) => s.map(|v| v.max(1)),
            None => export.workgroup_size,
        };
        let sz16 = u16::try_from(size[2])
            .map_err(|_| invalid(format!("workgroup size z {} exceeds 65535", size[2])))?;
        let total = (cx as u64)
            .checked_mul(cy as u64)
            .and_then(|n| n.checked_mul(cz as u64))
            .ok_or_else(|| {
                invalid(format!(
                    "workgroup count {cx}x{cy}x{cz} overflows a 64-bit workgroup index"
                ))
            })?;
        let range = config.workgroups.clone().unwrap_or(0..total);
        if range.start > range.end || range.end > total {
            return Err(invalid(format!(
                "workgroup range {range:?} outside 0..{total}"
            )));
        }
        if range.is_empty() {
            return Ok(());
        }
        let state = abi::DispatchStateV0 {
            workgroup_size_x: size[0],
            workgroup_size_y: size[1],
            workgroup_size_z: sz16,
            constant_count: constants.len() as u16,
            workgroup_count_x: cx,
            workgroup_count_y: cy,
            workgroup_count_z: cz16,
            max_concurrency: config.max_concurrency.max(1),
            binding_count: bindings.len() as u8,
            constants: constants.as_ptr(),
            binding_ptrs: binding_ptrs.as_ptr(),
            binding_lengths: binding_lengths.as_ptr(),
        };
        // Most exports use no workgroup-local memory: skip the (empty)
        // vector's construction call on that path.
        let lines = export.local_memory_size.div_ceil(64);
        let mut local = if lines == 0 {
            Vec::new()
        } else {
            vec![CacheLine([0; 64]); lines]
        };
        let local_size = u32::try_from(local.len() * 64)
            .map_err(|_| invalid("local memory too large".into()))?;
        let mut wg = abi::WorkgroupStateV0 {
            workgroup_id_x: 0,
            workgroup_id_y: 0,
            workgroup_id_z: 0,
            reserved: 0,
            processor_id: config.processor_id,
            local_memory: if local.is_empty() {
                std::ptr::null_mut()
            } else {
                local.as_mut_ptr().cast()
            },
            local_memory_size: local_size,
        };
        let plane = cx as u64 * cy as u64;
        for linear in range {
            wg.workgroup_id_x = (linear % cx as u64) as u32;
            wg.workgroup_id_y = ((linear / cx as u64) % cy as u64) as u32;
            wg.workgroup_id_z = (linear / plane) as u16;
            // SAFETY: `func` is a dispatch function of this library (checked to lie
            // in its executable pages at load); the environment, dispatch state,
            // workgroup state, constants, binding tables and local memory all
            // outlive the call; the caller vouches for the bindings.
            let rc = unsafe { func(&*self.environment, &state, &wg) };
            if rc != 0 {
                return Err(Status::new(
                    StatusCode::Internal,
                    format!(
                        "executable '{}' export '{}' returned error {rc} in workgroup ({}, {}, {})",
                        self.name,
                        export.name,
                        wg.workgroup_id_x,
                        wg.workgroup_id_y,
                        wg.workgroup_id_z
                    ),
                ));
            }
        }
        Ok(())
    }
}

/// Reads entry `index` of a table of `T` at runtime address `table`.
fn read_entry<T: abi::ImagePod>(
    elf: &impl ImageView,
    table: usize,
    index: usize,
    what: &str,
) -> Result<T> {
    if table == 0 {
        return Err(failed(format!("{what} is null")));
    }
    index
        .checked_mul(std::mem::size_of::<T>())
        .and_then(|o| table.checked_add(o))
        .and_then(|addr| elf.read::<T>(addr))
        .ok_or_else(|| failed(format!("{what} entry {index} lies outside the image")))
}

fn string_at(elf: &impl ImageView, addr: usize) -> Option<String> {
    Some(elf.c_str_at(addr)?.to_string_lossy().into_owned())
}
