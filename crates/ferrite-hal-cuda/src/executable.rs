//! Executables of format `cuda-nvptx-fb`: a 64-byte header (`CDA1`,
//! version 0, content size, reserved) and an `iree.hal.cuda.ExecutableDef`
//! flatbuffer holding PTX modules and exports (kernel name, block dims,
//! dynamic shared memory, push-constant count, binding flags). Each PTX
//! module is JIT-compiled with `cuModuleLoadDataEx`; a JIT failure is an
//! error carrying the driver's log.

use crate::context::CudaContext;
use crate::ffi::{self, CUfunction, CUmodule};
use crate::flatbuffer::Fb;
use ferrite_base::{bail, status, Result};
use ferrite_hal::command_buffer::BufferRef;
use ferrite_hal::executable::{Executable, ExportInfo};
use ferrite_hal::MemoryAccess;
use std::any::Any;
use std::ffi::{c_int, c_void, CString};
use std::sync::Arc;

/// The executable format this driver loads.
pub const FORMAT: &str = "cuda-nvptx-fb";

/// One kernel: function handle and launch shape.
pub struct Kernel {
    /// The loaded function.
    pub function: CUfunction,
    /// Threads per block (x, y, z).
    pub block_dims: [u32; 3],
    /// Dynamic shared memory per block in bytes.
    pub shared_memory: u32,
    /// 32-bit push constants the kernel takes (after the bindings).
    pub constant_count: u32,
    /// Buffer bindings the kernel takes (first in its parameter list).
    pub binding_count: u32,
    /// Bit i set: the compiler marked binding i read-only (`binding_flags`
    /// READ_ONLY; bindings past 63 count as written).
    pub read_only: u64,
    /// The export's name (for diagnostics).
    pub name: std::sync::Arc<str>,
}

/// A loaded CUDA executable.
pub struct CudaExecutable {
    shared: Arc<CudaContext>,
    modules: Vec<CUmodule>,
    kernels: Vec<Kernel>,
    exports: Vec<ExportInfo>,
}

// SAFETY: module and function handles are plain driver handles, valid in
// the primary context from any thread (the context is made current before
// each use).
unsafe impl Send for CudaExecutable {}
// SAFETY: see above; nothing is mutated after loading.
unsafe impl Sync for CudaExecutable {}

impl Drop for CudaExecutable {
    fn drop(&mut self) {
        if self.shared.make_current().is_ok() {
            for &m in &self.modules {
                // SAFETY: `m` was loaded by cuModuleLoadDataEx and is
                // unloaded once; work that uses its kernels holds this
                // executable alive until the work completes.
                unsafe { (self.shared.api.cuModuleUnload)(m) };
            }
        }
    }
}

struct ExportDef<'a> {
    module: u32,
    name: &'a [u8],
    export_name: &'a [u8],
    block_dims: [u32; 3],
    shared_memory: u32,
    constant_count: u32,
    binding_count: u32,
    read_only: u64,
}

/// `binding_flags` bit: the kernel only reads the binding.
const BINDING_READ_ONLY: u64 = 1;

/// Bytes of the file header before the flatbuffer.
const HEADER_LEN: usize = 64;

/// Strips and checks the file header; returns the flatbuffer.
fn flatbuffer_of(data: &[u8]) -> Result<&[u8]> {
    if data.len() < HEADER_LEN {
        bail!(
            InvalidArgument,
            "executable flatbuffer data is not present or less than header size ({} bytes)",
            data.len()
        );
    }
    if &data[0..4] != b"CDA1" {
        bail!(
            InvalidArgument,
            "executable file identifier does not match; expected `CDA1`, got {:?}",
            String::from_utf8_lossy(&data[0..4])
        );
    }
    let version = u32::from_le_bytes([data[4], data[5], data[6], data[7]]);
    if version != 0 {
        bail!(
            Incompatible,
            "executable version {version} not compatible with this build"
        );
    }
    let mut size = [0u8; 8];
    size.copy_from_slice(&data[8..16]);
    let size = u64::from_le_bytes(size);
    if size == 0 || size > (data.len() - HEADER_LEN) as u64 {
        bail!(
            OutOfRange,
            "executable flatbuffer size prefix out of bounds (size is {size} but only {} bytes available)",
            data.len() - HEADER_LEN
        );
    }
    Ok(&data[HEADER_LEN..HEADER_LEN + size as usize])
}

/// Parses the executable: (PTX images, exports).
fn parse(data: &[u8]) -> Result<(Vec<&[u8]>, Vec<ExportDef<'_>>)> {
    let fb = Fb::new(flatbuffer_of(data)?);
    let root = fb.root()?;
    let (mstart, mcount) = fb.vec_field(&root, 1, 4, "modules")?;
    let mut ptx = Vec::with_capacity(mcount);
    for i in 0..mcount {
        let m = fb.table_elem(mstart, i, "module")?;
        match fb.str_field(&m, 0, "ptx_image")? {
            Some(p) if !p.is_empty() => ptx.push(p),
            _ => bail!(InvalidArgument, "executable module {i} has no PTX image"),
        }
    }
    let (estart, ecount) = fb.vec_field(&root, 0, 4, "exports")?;
    let mut exports = Vec::with_capacity(ecount);
    for i in 0..ecount {
        let e = fb.table_elem(estart, i, "export")?;
        let module = fb.u32_field(&e, 0, "module_ordinal", 0)?;
        if module as usize >= ptx.len() {
            bail!(
                InvalidArgument,
                "export {i} references module {module} but the executable has {}",
                ptx.len()
            );
        }
        let Some(name) = fb.str_field(&e, 1, "kernel_name")? else {
            bail!(InvalidArgument, "export {i} has no kernel name");
        };
        let dims = match fb.struct_field(&e, 2, 12, "block_dims")? {
            Some(b) => {
                let w = |k: usize| u32::from_le_bytes([b[k], b[k + 1], b[k + 2], b[k + 3]]);
                [w(0), w(4), w(8)]
            }
            None => bail!(InvalidArgument, "export {i} has no block dims"),
        };
        if dims.contains(&0) {
            bail!(
                InvalidArgument,
                "export {i} has a zero block dimension {dims:?}"
            );
        }
        let shared_memory = fb.u32_field(&e, 3, "block_shared_memory_size", 0)?;
        let constant_count = fb.u32_field(&e, 4, "constant_count", 0)?;
        let (flags_at, binding_count) = fb.vec_field(&e, 5, 8, "binding_flags")?;
        let mut read_only = 0u64;
        for b in 0..binding_count.min(64) {
            let lo = fb.u32_at(flags_at + 8 * b, "binding_flags")?;
            if u64::from(lo) & BINDING_READ_ONLY != 0 {
                read_only |= 1 << b;
            }
        }
        // The export's name as the program looks it up (kernel names are
        // sanitized: `.` becomes `_`) is debug_info.name when present.
        let export_name = match fb.field(&e, 6, "debug_info")? {
            Some(_) => {
                let d = fb.table_field(&e, 6, "debug_info")?;
                fb.str_field(&d, 0, "debug_info.name")?.unwrap_or(name)
            }
            None => name,
        };
        exports.push(ExportDef {
            module,
            name,
            export_name,
            block_dims: dims,
            shared_memory,
            constant_count,
            binding_count: binding_count as u32,
            read_only,
        });
    }
    Ok((ptx, exports))
}

impl CudaExecutable {
    /// Loads `data` (format [`FORMAT`]) into the device's context.
    pub fn load(shared: &Arc<CudaContext>, data: &[u8]) -> Result<CudaExecutable> {
        let (ptx, exports) = parse(data)?;
        shared.make_current()?;
        let api = shared.api;
        let mut exe = CudaExecutable {
            shared: shared.clone(),
            modules: Vec::with_capacity(ptx.len()),
            kernels: Vec::with_capacity(exports.len()),
            exports: Vec::with_capacity(exports.len()),
        };
        for (i, image) in ptx.iter().enumerate() {
            // cuModuleLoadDataEx takes a NUL-terminated PTX image.
            let mut text = Vec::with_capacity(image.len() + 1);
            text.extend_from_slice(image);
            text.push(0);
            let mut log = vec![0u8; 16 * 1024];
            let mut options = [
                ffi::CU_JIT_ERROR_LOG_BUFFER,
                ffi::CU_JIT_ERROR_LOG_BUFFER_SIZE_BYTES,
            ];
            let mut values = [log.as_mut_ptr() as *mut c_void, log.len() as *mut c_void];
            let mut module: CUmodule = std::ptr::null_mut();
            // SAFETY: `text` is NUL-terminated PTX; the option arrays hold
            // 2 entries each (a log buffer valid for `log.len()` bytes and
            // its size passed by value, as the JIT options require).
            let r = unsafe {
                (api.cuModuleLoadDataEx)(
                    &mut module,
                    text.as_ptr() as *const c_void,
                    options.len() as u32,
                    options.as_mut_ptr() as *mut c_int,
                    values.as_mut_ptr(),
                )
            };
            if r != ffi::CUDA_SUCCESS {
                let end = log.iter().position(|&b| b == 0).unwrap_or(log.len());
                let log = String::from_utf8_lossy(&log[..end]);
                return Err(status!(
                    InvalidArgument,
                    "cuModuleLoadDataEx of PTX module {i} failed: {}; JIT log: {}",
                    ffi::error_name(r),
                    if log.trim().is_empty() {
                        "(empty)"
                    } else {
                        log.trim()
                    }
                ));
            }
            exe.modules.push(module);
        }
        for (i, e) in exports.iter().enumerate() {
            let name = CString::new(e.name).map_err(|_| {
                status!(
                    InvalidArgument,
                    "export {i}: kernel name contains a NUL byte"
                )
            })?;
            let mut function: CUfunction = std::ptr::null_mut();
            ffi::check(
                // SAFETY: the module is loaded; `name` is NUL-terminated.
                unsafe {
                    (api.cuModuleGetFunction)(
                        &mut function,
                        exe.modules[e.module as usize],
                        name.as_ptr(),
                    )
                },
                &format!("looking up kernel '{}'", name.to_string_lossy()),
            )?;
            if e.shared_memory > 48 * 1024 {
                ffi::check(
                    // SAFETY: `function` is a valid kernel handle.
                    unsafe {
                        (api.cuFuncSetAttribute)(
                            function,
                            ffi::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                            e.shared_memory as c_int,
                        )
                    },
                    "setting a kernel's dynamic shared memory size",
                )?;
            }
            exe.kernels.push(Kernel {
                function,
                block_dims: e.block_dims,
                shared_memory: e.shared_memory,
                constant_count: e.constant_count,
                binding_count: e.binding_count,
                read_only: e.read_only,
                name: String::from_utf8_lossy(e.export_name).into(),
            });
            exe.exports.push(ExportInfo {
                name: String::from_utf8_lossy(e.export_name).into_owned(),
                workgroup_size: e.block_dims,
                constant_count: e.constant_count,
                binding_count: e.binding_count,
            });
        }
        Ok(exe)
    }

    /// The kernel of export `ordinal`.
    pub fn kernel(&self, ordinal: u32) -> Result<&Kernel> {
        self.kernels.get(ordinal as usize).ok_or_else(|| {
            status!(
                OutOfRange,
                "export ordinal {ordinal} out of range; executable has {} exports",
                self.kernels.len()
            )
        })
    }
}

impl Executable for CudaExecutable {
    fn exports(&self) -> &[ExportInfo] {
        &self.exports
    }
    fn as_any(&self) -> &dyn Any {
        self
    }
    /// `READ` for bindings the compiler marked read-only, `READ | WRITE`
    /// for the others (and for unknown exports or bindings).
    fn binding_access(&self, export: u32, binding: usize) -> MemoryAccess {
        match self.kernels.get(export as usize) {
            Some(k) if binding < 64 && k.read_only & (1 << binding) != 0 => MemoryAccess::READ,
            _ => MemoryAccess::READ | MemoryAccess::WRITE,
        }
    }
}

/// The kernel a dispatch launches, checked against the dispatch's
/// bindings and push constants (at least as many as the kernel takes).
pub(crate) fn dispatch_kernel<'a>(
    executable: &'a ferrite_hal::executable::ExecutableRef,
    function: u32,
    bindings: &[BufferRef],
    constants: &[u32],
) -> Result<&'a Kernel> {
    let Some(exe) = executable.0.as_any().downcast_ref::<CudaExecutable>() else {
        bail!(
            InvalidArgument,
            "executable was not loaded by a CUDA device"
        );
    };
    let kernel = exe.kernel(function)?;
    if bindings.len() < kernel.binding_count as usize {
        bail!(
            InvalidArgument,
            "dispatch of export {function} has {} bindings but the kernel takes {}",
            bindings.len(),
            kernel.binding_count
        );
    }
    if constants.len() < kernel.constant_count as usize {
        bail!(
            InvalidArgument,
            "dispatch of export {function} has {} constants but the kernel takes {}",
            constants.len(),
            kernel.constant_count
        );
    }
    Ok(kernel)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rejects_bad_headers() {
        assert!(flatbuffer_of(b"")
            .unwrap_err()
            .to_string()
            .contains("less than header"));
        let mut d = b"XXXX\0\0\0\0\x04\0\0\0\0\0\0\0".to_vec();
        d.resize(HEADER_LEN, 0);
        d.extend_from_slice(b"abcd");
        assert!(flatbuffer_of(&d).unwrap_err().to_string().contains("CDA1"));
        d[0..4].copy_from_slice(b"CDA1");
        assert_eq!(flatbuffer_of(&d).unwrap(), b"abcd");
        d[8] = 99;
        assert!(flatbuffer_of(&d)
            .unwrap_err()
            .to_string()
            .contains("out of bounds"));
        // A truncated flatbuffer is an error, not a panic.
        d[8] = 4;
        assert!(parse(&d).is_err());
    }
}
