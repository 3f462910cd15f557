//! The CPU executable library ABI (IREE `executable_library.h`, version 0.6),
//! mirrored as `#[repr(C)]` types.
//!
//! An executable is a shared object exporting one function,
//! [`QUERY_SYMBOL`]: given the newest version the runtime understands and the
//! runtime's [`EnvironmentV0`], it returns a pointer to a pointer to a
//! [`LibraryHeader`]; for version 0.6 that header pointer is the first field of
//! a [`LibraryV0`] describing imports, exports (dispatch functions with their
//! attributes and names), executable constants and embedded sources.
//!
//! Every dispatch function is called once per workgroup with the environment,
//! a [`DispatchStateV0`] shared by all workgroups of a dispatch and a
//! [`WorkgroupStateV0`] naming the workgroup; it returns 0 on success.
//!
//! Layouts are those of the C structs on a 64-bit little-endian target; the
//! compile-time assertions at the bottom pin every size and offset.

use std::ffi::{c_char, c_int, c_void};
use std::mem::{offset_of, size_of};

/// Version 0.6 of the library ABI, the only one this runtime understands.
pub const LIBRARY_VERSION_0_6: u32 = 0x0000_0006;
/// The newest version this runtime passes to the query function.
pub const LIBRARY_VERSION_LATEST: u32 = LIBRARY_VERSION_0_6;
/// Name of the exported query function.
pub const QUERY_SYMBOL: &str = "iree_hal_executable_library_query";

/// Library built without a sanitizer.
pub const SANITIZER_NONE: i32 = 0;
/// Library built with AddressSanitizer.
pub const SANITIZER_ADDRESS: i32 = 1;
/// Library built with MemorySanitizer.
pub const SANITIZER_MEMORY: i32 = 2;
/// Library built with ThreadSanitizer.
pub const SANITIZER_THREAD: i32 = 3;
/// Library built with UndefinedBehaviorSanitizer.
pub const SANITIZER_UNDEFINED: i32 = 4;

/// Number of `u64` words of processor data in the environment.
pub const PROCESSOR_DATA_CAPACITY_V0: usize = 8;
/// Granularity of workgroup local memory requests.
pub const WORKGROUP_LOCAL_MEMORY_PAGE_SIZE: usize = 4096;
/// Most constants a dispatch may declare.
pub const MAX_CONSTANT_COUNT: usize = 64;
/// Most bindings a dispatch may declare.
pub const MAX_BINDING_COUNT: usize = 64;

/// Dispatch flag: workgroups must run one after another, in order.
pub const DISPATCH_FLAG_V0_SEQUENTIAL: u64 = 1 << 0;
/// Dispatch flag: the workgroup size is chosen at dispatch time.
pub const DISPATCH_FLAG_V0_WORKGROUP_SIZE_DYNAMIC: u64 = 1 << 1;

/// Dispatch parameter kind: a 32-bit constant.
pub const DISPATCH_PARAM_TYPE_V0_CONSTANT: u8 = 0;
/// Dispatch parameter kind: a binding.
pub const DISPATCH_PARAM_TYPE_V0_BINDING: u8 = 1;
/// Dispatch parameter kind: a raw buffer pointer.
pub const DISPATCH_PARAM_TYPE_V0_BUFFER_PTR: u8 = 2;

/// An import function: `int fn(void* params, void* context, void* reserved)`.
pub type ImportFnV0 =
    unsafe extern "C" fn(params: *mut c_void, context: *mut c_void, reserved: *mut c_void) -> c_int;

/// The thunk through which executables call imports:
/// `int thunk(fn, params, context, reserved)`.
pub type ImportThunkV0 = unsafe extern "C" fn(
    fn_ptr: Option<ImportFnV0>,
    params: *mut c_void,
    context: *mut c_void,
    reserved: *mut c_void,
) -> c_int;

/// A dispatch function, called once per workgroup.
pub type DispatchFnV0 = unsafe extern "C" fn(
    environment: *const EnvironmentV0,
    dispatch_state: *const DispatchStateV0,
    workgroup_state: *const WorkgroupStateV0,
) -> c_int;

/// The exported query function.
pub type QueryFn = unsafe extern "C" fn(
    max_version: u32,
    environment: *const EnvironmentV0,
) -> *const *const LibraryHeader;

/// `iree_hal_executable_library_header_t`.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct LibraryHeader {
    /// ABI version the library implements.
    pub version: u32,
    /// NUL-terminated library name.
    pub name: *const c_char,
    /// Feature bits the library requires (none are defined).
    pub features: u32,
    /// Sanitizer the library was built with (`SANITIZER_*`).
    pub sanitizer: i32,
}

/// `iree_hal_executable_import_table_v0_t`.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct ImportTableV0 {
    /// Number of imports.
    pub count: u32,
    /// `count` NUL-terminated symbol names; a leading `?` marks an optional one.
    pub symbols: *const *const c_char,
}

/// `iree_hal_processor_v0_t`: CPU feature words (IREE's `cpu_data.h` bits).
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ProcessorV0 {
    /// Feature words; word 0 on x86-64 holds the SSE/AVX/AVX-512/AMX bits.
    pub data: [u64; PROCESSOR_DATA_CAPACITY_V0],
}

/// `iree_hal_executable_environment_v0_t`.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct EnvironmentV0 {
    /// Executable-level constants (the library's constant table count of them).
    pub constants: *const u32,
    /// Thunk used for every import call.
    pub import_thunk: Option<ImportThunkV0>,
    /// One function pointer per import (null for unresolved optional imports).
    pub import_funcs: *const Option<ImportFnV0>,
    /// One context pointer per import.
    pub import_contexts: *const *const c_void,
    /// Processor information.
    pub processor: ProcessorV0,
}

/// `iree_hal_executable_dispatch_state_v0_t`: shared by all workgroups.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct DispatchStateV0 {
    /// Workgroup size, x.
    pub workgroup_size_x: u32,
    /// Workgroup size, y.
    pub workgroup_size_y: u32,
    /// Workgroup size, z.
    pub workgroup_size_z: u16,
    /// Number of entries in `constants`.
    pub constant_count: u16,
    /// Workgroup count, x.
    pub workgroup_count_x: u32,
    /// Workgroup count, y.
    pub workgroup_count_y: u32,
    /// Workgroup count, z.
    pub workgroup_count_z: u16,
    /// Upper bound of workgroups that may run concurrently.
    pub max_concurrency: u8,
    /// Number of entries in `binding_ptrs` / `binding_lengths`.
    pub binding_count: u8,
    /// Dispatch constants.
    pub constants: *const u32,
    /// Base pointer of each binding.
    pub binding_ptrs: *const *mut c_void,
    /// Length in bytes of each binding.
    pub binding_lengths: *const usize,
}

/// `iree_hal_executable_workgroup_state_v0_t`: one workgroup.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct WorkgroupStateV0 {
    /// Workgroup id, x.
    pub workgroup_id_x: u32,
    /// Workgroup id, y.
    pub workgroup_id_y: u32,
    /// Workgroup id, z.
    pub workgroup_id_z: u16,
    /// Reserved, zero.
    pub reserved: u16,
    /// Id of the processor (worker) running the workgroup.
    pub processor_id: u32,
    /// Scratch memory for the workgroup (at least the export's request).
    pub local_memory: *mut c_void,
    /// Size of `local_memory` in bytes.
    pub local_memory_size: u32,
}

/// `iree_hal_executable_dispatch_attrs_v0_t`.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct DispatchAttrsV0 {
    /// `DISPATCH_FLAG_V0_*` bits.
    pub flags: u64,
    /// Local memory required, in [`WORKGROUP_LOCAL_MEMORY_PAGE_SIZE`] pages.
    pub local_memory_pages: u16,
    /// Number of dispatch constants.
    pub constant_count: u8,
    /// Number of bindings.
    pub binding_count: u8,
    /// Static workgroup size, x (0 when unknown).
    pub workgroup_size_x: u32,
    /// Static workgroup size, y.
    pub workgroup_size_y: u32,
    /// Static workgroup size, z.
    pub workgroup_size_z: u16,
    /// Number of reflected parameters.
    pub parameter_count: u16,
    /// Reserved, zero.
    pub reserved_1: [u64; 5],
}

/// `iree_hal_executable_dispatch_parameter_v0_t`.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct DispatchParameterV0 {
    /// `DISPATCH_PARAM_TYPE_V0_*`.
    pub kind: u8,
    /// Size in bytes.
    pub size: u8,
    /// Flags (none defined).
    pub flags: u16,
    /// Index into the export table's parameter name table.
    pub name: u16,
    /// Byte offset within the constants or binding table.
    pub offset: u16,
}

/// `iree_hal_executable_dispatch_occupancy_v0_t` (reserved).
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct DispatchOccupancyV0 {
    /// Reserved.
    pub reserved: c_int,
}

/// `iree_hal_executable_source_location_v0_t`.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct SourceLocationV0 {
    /// 1-based line.
    pub line: u32,
    /// Length of `path` in bytes.
    pub path_length: u32,
    /// Path (not necessarily NUL-terminated).
    pub path: *const c_char,
}

/// `iree_hal_executable_stage_location_table_v0_t`.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct StageLocationTableV0 {
    /// Number of stages.
    pub count: u32,
    /// Stage names.
    pub names: *const *const c_char,
    /// Stage locations.
    pub locations: *const SourceLocationV0,
}

/// `iree_hal_executable_export_table_v0_t`.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct ExportTableV0 {
    /// Number of exports.
    pub count: u32,
    /// Dispatch function of each export.
    pub ptrs: *const Option<DispatchFnV0>,
    /// Attributes of each export (optional).
    pub attrs: *const DispatchAttrsV0,
    /// Per export, a pointer to `parameter_count` parameters (optional).
    pub params: *const *const DispatchParameterV0,
    /// Occupancy information (optional, reserved).
    pub occupancy: *const DispatchOccupancyV0,
    /// Name of each export (optional).
    pub names: *const *const c_char,
    /// Tag of each export (optional).
    pub tags: *const *const c_char,
    /// Parameter names (optional).
    pub parameter_names: *const *const c_char,
    /// Source location of each export (optional).
    pub source_locations: *const SourceLocationV0,
    /// Per-stage source locations of each export (optional).
    pub stage_locations: *const StageLocationTableV0,
}

/// `iree_hal_executable_constant_table_v0_t`.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct ConstantTableV0 {
    /// Number of executable-level constants the environment must provide.
    pub count: u32,
}

/// `iree_hal_executable_source_file_v0_t`.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct SourceFileV0 {
    /// Length of `path`.
    pub path_length: u32,
    /// Path.
    pub path: *const c_char,
    /// Length of `content`.
    pub content_length: u32,
    /// Contents.
    pub content: *const u8,
}

/// `iree_hal_executable_source_file_table_v0_t`.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct SourceFileTableV0 {
    /// Number of files.
    pub count: u32,
    /// Files.
    pub files: *const SourceFileV0,
}

/// `iree_hal_executable_library_v0_t`.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct LibraryV0 {
    /// Header (version, name, features, sanitizer).
    pub header: *const LibraryHeader,
    /// Imports.
    pub imports: ImportTableV0,
    /// Exports.
    pub exports: ExportTableV0,
    /// Executable-level constants.
    pub constants: ConstantTableV0,
    /// Embedded source files.
    pub sources: SourceFileTableV0,
}

/// Plain old data read out of a loaded image: types for which *every*
/// `size_of::<Self>()`-byte pattern is a valid value (integers, raw pointers,
/// and `#[repr(C)]` structs of those). Reading an image never produces a
/// `bool`, a reference, an enum or a non-null function pointer, whose
/// invalid bit patterns would be undefined behaviour.
///
/// Reading a type with invalid bit patterns does not compile (reading a
/// `u32` the same way does):
///
/// ```
/// use ferrite_hal_cpu::executable::ImageView;
/// fn f(image: &impl ImageView) -> Option<u32> {
///     image.read::<u32>(0x1000)
/// }
/// ```
///
/// ```compile_fail
/// use ferrite_hal_cpu::executable::ImageView;
/// fn f(image: &impl ImageView) -> Option<bool> {
///     image.read::<bool>(0x1000)
/// }
/// ```
///
/// ```compile_fail
/// use ferrite_hal_cpu::executable::ImageView;
/// fn f(image: &impl ImageView) -> Option<&'static u8> {
///     image.read::<&'static u8>(0x1000)
/// }
/// ```
///
/// # Safety
/// Implement only for `Copy` types valid for any bit pattern of their size
/// (padding included: padding bytes may hold anything).
pub unsafe trait ImagePod: Copy {}

macro_rules! image_pod {
    ($($t:ty),* $(,)?) => {
        // SAFETY: integers and raw pointers are valid for every bit pattern;
        // each struct listed is `#[repr(C)]` with only integer, raw-pointer or
        // ImagePod-struct fields (see their definitions above), so every bit
        // pattern of it is valid too.
        $(unsafe impl ImagePod for $t {})*
    };
}
image_pod!(
    u8,
    u16,
    u32,
    u64,
    usize,
    i32,
    LibraryHeader,
    ImportTableV0,
    DispatchAttrsV0,
    DispatchParameterV0,
    SourceLocationV0,
    StageLocationTableV0,
    ExportTableV0,
    ConstantTableV0,
    SourceFileV0,
    SourceFileTableV0,
    LibraryV0,
);
// SAFETY: a raw pointer is valid for every bit pattern (it is never
// dereferenced by reading it).
unsafe impl<T> ImagePod for *const T {}
// SAFETY: as above.
unsafe impl<T> ImagePod for *mut T {}

// Layout pins (64-bit targets; the C structs on x86-64 SysV).
const _: () = {
    assert!(size_of::<LibraryHeader>() == 24);
    assert!(offset_of!(LibraryHeader, name) == 8);
    assert!(offset_of!(LibraryHeader, features) == 16);
    assert!(offset_of!(LibraryHeader, sanitizer) == 20);

    assert!(size_of::<ImportTableV0>() == 16);
    assert!(offset_of!(ImportTableV0, symbols) == 8);

    assert!(size_of::<ProcessorV0>() == 64);

    assert!(size_of::<EnvironmentV0>() == 96);
    assert!(offset_of!(EnvironmentV0, import_thunk) == 8);
    assert!(offset_of!(EnvironmentV0, import_funcs) == 16);
    assert!(offset_of!(EnvironmentV0, import_contexts) == 24);
    assert!(offset_of!(EnvironmentV0, processor) == 32);

    assert!(size_of::<DispatchStateV0>() == 48);
    assert!(offset_of!(DispatchStateV0, workgroup_size_y) == 4);
    assert!(offset_of!(DispatchStateV0, workgroup_size_z) == 8);
    assert!(offset_of!(DispatchStateV0, constant_count) == 10);
    assert!(offset_of!(DispatchStateV0, workgroup_count_x) == 12);
    assert!(offset_of!(DispatchStateV0, workgroup_count_y) == 16);
    assert!(offset_of!(DispatchStateV0, workgroup_count_z) == 20);
    assert!(offset_of!(DispatchStateV0, max_concurrency) == 22);
    assert!(offset_of!(DispatchStateV0, binding_count) == 23);
    assert!(offset_of!(DispatchStateV0, constants) == 24);
    assert!(offset_of!(DispatchStateV0, binding_ptrs) == 32);
    assert!(offset_of!(DispatchStateV0, binding_lengths) == 40);

    assert!(size_of::<WorkgroupStateV0>() == 32);
    assert!(offset_of!(WorkgroupStateV0, workgroup_id_y) == 4);
    assert!(offset_of!(WorkgroupStateV0, workgroup_id_z) == 8);
    assert!(offset_of!(WorkgroupStateV0, reserved) == 10);
    assert!(offset_of!(WorkgroupStateV0, processor_id) == 12);
    assert!(offset_of!(WorkgroupStateV0, local_memory) == 16);
    assert!(offset_of!(WorkgroupStateV0, local_memory_size) == 24);

    assert!(size_of::<DispatchAttrsV0>() == 64);
    assert!(offset_of!(DispatchAttrsV0, local_memory_pages) == 8);
    assert!(offset_of!(DispatchAttrsV0, constant_count) == 10);
    assert!(offset_of!(DispatchAttrsV0, binding_count) == 11);
    assert!(offset_of!(DispatchAttrsV0, workgroup_size_x) == 12);
    assert!(offset_of!(DispatchAttrsV0, workgroup_size_y) == 16);
    assert!(offset_of!(DispatchAttrsV0, workgroup_size_z) == 20);
    assert!(offset_of!(DispatchAttrsV0, parameter_count) == 22);
    assert!(offset_of!(DispatchAttrsV0, reserved_1) == 24);

    assert!(size_of::<DispatchParameterV0>() == 8);
    assert!(offset_of!(DispatchParameterV0, flags) == 2);
    assert!(offset_of!(DispatchParameterV0, name) == 4);
    assert!(offset_of!(DispatchParameterV0, offset) == 6);

    assert!(size_of::<DispatchOccupancyV0>() == 4);

    assert!(size_of::<SourceLocationV0>() == 16);
    assert!(offset_of!(SourceLocationV0, path_length) == 4);
    assert!(offset_of!(SourceLocationV0, path) == 8);

    assert!(size_of::<StageLocationTableV0>() == 24);
    assert!(offset_of!(StageLocationTableV0, names) == 8);
    assert!(offset_of!(StageLocationTableV0, locations) == 16);

    assert!(size_of::<ExportTableV0>() == 80);
    assert!(offset_of!(ExportTableV0, ptrs) == 8);
    assert!(offset_of!(ExportTableV0, attrs) == 16);
    assert!(offset_of!(ExportTableV0, params) == 24);
    assert!(offset_of!(ExportTableV0, occupancy) == 32);
    assert!(offset_of!(ExportTableV0, names) == 40);
    assert!(offset_of!(ExportTableV0, tags) == 48);
    assert!(offset_of!(ExportTableV0, parameter_names) == 56);
    assert!(offset_of!(ExportTableV0, source_locations) == 64);
    assert!(offset_of!(ExportTableV0, stage_locations) == 72);

    assert!(size_of::<ConstantTableV0>() == 4);

    assert!(size_of::<SourceFileV0>() == 32);
    assert!(offset_of!(SourceFileV0, path) == 8);
    assert!(offset_of!(SourceFileV0, content_length) == 16);
    assert!(offset_of!(SourceFileV0, content) == 24);

    assert!(size_of::<SourceFileTableV0>() == 16);
    assert!(offset_of!(SourceFileTableV0, files) == 8);

    assert!(size_of::<LibraryV0>() == 128);
    assert!(offset_of!(LibraryV0, imports) == 8);
    assert!(offset_of!(LibraryV0, exports) == 24);
    assert!(offset_of!(LibraryV0, constants) == 104);
    assert!(offset_of!(LibraryV0, sources) == 112);
};
