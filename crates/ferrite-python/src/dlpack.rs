//! DLPack interchange: buffer views out as DLPack capsules (legacy
//! `dltensor` and, for consumers asking for protocol 1.x, versioned
//! `dltensor_versioned`), and DLPack capsules in as buffer views.
//!
//! Import is zero-copy for dense row-major tensors (the producer's deleter
//! runs when the last buffer using the memory goes away) and copies strided
//! tensors into a new dense buffer. The structs are the DLPack ABI
//! (dlpack.h, v1.0) written out in Rust.

use crate::hal::PyHalBufferView;
use crate::status::PyContext;
use ferrite_hal::allocator::{Allocator, BufferParams};
use ferrite_hal::buffer::{BindingPtr, HostMemory, WHOLE_BUFFER};
use ferrite_hal::buffer_view::BufferView;
use ferrite_hal::element_type::{ElementType, EncodingType, NumericalType};
use ferrite_hal::memory::{BufferUsage, MemoryAccess, MemoryType};
use pyo3::exceptions::{PyBufferError, PyValueError};
use pyo3::ffi;
use pyo3::prelude::*;
use std::ffi::{c_void, CStr};

use std::sync::Arc;

/// `kDLCPU`: host memory, the only device type Ferrite's devices use.
pub const DL_CPU: i32 = 1;

const DL_INT: u8 = 0;
const DL_UINT: u8 = 1;
const DL_FLOAT: u8 = 2;
const DL_BFLOAT: u8 = 4;
const DL_COMPLEX: u8 = 5;
const DL_BOOL: u8 = 6;

/// `DLPACK_FLAG_BITMASK_READ_ONLY`.
const FLAG_READ_ONLY: u64 = 1;

const LEGACY_NAME: &CStr = c"dltensor";
const LEGACY_USED: &CStr = c"used_dltensor";
const VERSIONED_NAME: &CStr = c"dltensor_versioned";
const VERSIONED_USED: &CStr = c"used_dltensor_versioned";

#[repr(C)]
#[derive(Clone, Copy)]
struct DLDevice {
    device_type: i32,
    device_id: i32,
}

#[repr(C)]
#[derive(Clone, Copy)]
struct DLDataType {
    code: u8,
    bits: u8,
    lanes: u16,
}

#[repr(C)]
struct DLTensor {
    data: *mut c_void,
    device: DLDevice,
    ndim: i32,
    dtype: DLDataType,
    shape: *mut i64,
    strides: *mut i64,
    byte_offset: u64,
}

#[repr(C)]
struct DLManagedTensor {
    dl_tensor: DLTensor,
    manager_ctx: *mut c_void,
    deleter: Option<unsafe extern "C" fn(*mut DLManagedTensor)>,
}

#[repr(C)]
struct DLPackVersion {
    major: u32,
    minor: u32,
}

#[repr(C)]
struct DLManagedTensorVersioned {
    version: DLPackVersion,
    manager_ctx: *mut c_void,
    deleter: Option<unsafe extern "C" fn(*mut DLManagedTensorVersioned)>,
    flags: u64,
    dl_tensor: DLTensor,
}

/// What an exported tensor keeps alive: the mapping of the buffer (and so
/// the allocation) and the shape array the tensor points into.
struct ExportContext {
    _mapping: BindingPtr,
    shape: Vec<i64>,
}

fn dtype_of(et: ElementType) -> PyResult<DLDataType> {
    let code = match et.numerical_type() {
        NumericalType::FLOAT_IEEE => DL_FLOAT,
        NumericalType::INTEGER_UNSIGNED => DL_UINT,
        NumericalType::INTEGER | NumericalType::INTEGER_SIGNED => DL_INT,
        NumericalType::FLOAT_BRAIN => DL_BFLOAT,
        NumericalType::FLOAT_COMPLEX => DL_COMPLEX,
        NumericalType::BOOLEAN => DL_BOOL,
        _ => {
            return Err(PyValueError::new_err(
                "dlpack unsupported buffer view element type",
            ))
        }
    };
    let bits = et.bit_count();
    if bits == 0 || bits > 255 {
        return Err(PyValueError::new_err(
            "dlpack unsupported buffer view element type",
        ));
    }
    Ok(DLDataType {
        code,
        bits: bits as u8,
        lanes: 1,
    })
}

fn element_type_of(dtype: DLDataType) -> PyResult<ElementType> {
    if dtype.lanes != 1 {
        return Err(PyValueError::new_err("Unsupported dtype lanes != 1"));
    }
    let nt = match dtype.code {
        DL_INT => NumericalType::INTEGER_SIGNED,
        DL_UINT => NumericalType::INTEGER_UNSIGNED,
        DL_FLOAT => NumericalType::FLOAT_IEEE,
        DL_BFLOAT => NumericalType::FLOAT_BRAIN,
        DL_COMPLEX => NumericalType::FLOAT_COMPLEX,
        DL_BOOL => NumericalType::BOOLEAN,
        code => {
            return Err(PyValueError::new_err(format!(
                "Unsupported dlpack dtype code {code}"
            )))
        }
    };
    Ok(ElementType::new(nt, dtype.bits))
}

/// Fills a `DLTensor` for `view` (dense row-major: strides left null).
fn describe(view: &BufferView, device: DLDevice) -> PyResult<(DLTensor, Box<ExportContext>)> {
    let dtype = dtype_of(view.element_type())?;
    let access = if view.buffer().allowed_access().contains(MemoryAccess::WRITE) {
        MemoryAccess::READ | MemoryAccess::WRITE
    } else {
        MemoryAccess::READ
    };
    let mapping = view
        .buffer()
        .binding_ptr(0, WHOLE_BUFFER, access)
        .py_context("Cannot export device buffer")?;
    let mut ctx = Box::new(ExportContext {
        shape: view.shape().iter().map(|&d| d as i64).collect(),
        _mapping: mapping,
    });
    let tensor = DLTensor {
        data: ctx._mapping.as_ptr() as *mut c_void,
        device,
        ndim: ctx.shape.len() as i32,
        dtype,
        shape: ctx.shape.as_mut_ptr(),
        strides: std::ptr::null_mut(),
        byte_offset: 0,
    };
    Ok((tensor, ctx))
}

unsafe extern "C" fn delete_legacy(t: *mut DLManagedTensor) {
    // SAFETY: `t` and its context were made by `Box::into_raw` in
    // `export_capsule`; DLPack calls the deleter exactly once.
    unsafe {
        let t = Box::from_raw(t);
        drop(Box::from_raw(t.manager_ctx as *mut ExportContext));
    }
}

unsafe extern "C" fn delete_versioned(t: *mut DLManagedTensorVersioned) {
    // SAFETY: as `delete_legacy`, for the versioned struct.
    unsafe {
        let t = Box::from_raw(t);
        drop(Box::from_raw(t.manager_ctx as *mut ExportContext));
    }
}

/// Capsule destructor: a capsule still carrying its unconsumed name was
/// never taken by a consumer, so its tensor is deleted here.
unsafe extern "C" fn capsule_destructor(capsule: *mut ffi::PyObject) {
    // SAFETY: CPython calls this with the capsule being destroyed; names and
    // pointers are read through the capsule API, and each tensor kind's own
    // deleter is called at most once (consumers rename the capsule).
    unsafe {
        if ffi::PyCapsule_IsValid(capsule, LEGACY_NAME.as_ptr()) == 1 {
            let t =
                ffi::PyCapsule_GetPointer(capsule, LEGACY_NAME.as_ptr()) as *mut DLManagedTensor;
            if let Some(d) = (*t).deleter {
                d(t);
            }
        } else if ffi::PyCapsule_IsValid(capsule, VERSIONED_NAME.as_ptr()) == 1 {
            let t = ffi::PyCapsule_GetPointer(capsule, VERSIONED_NAME.as_ptr())
                as *mut DLManagedTensorVersioned;
            if let Some(d) = (*t).deleter {
                d(t);
            }
        }
    }
}

/// Exports `view` as a DLPack capsule: versioned (protocol 1.0) or legacy.
pub fn export_capsule(
    py: Python<'_>,
    view: &BufferView,
    device_type: i32,
    device_id: i32,
    versioned: bool,
) -> PyResult<PyObject> {
    let device = DLDevice {
        device_type,
        device_id,
    };
    let (dl_tensor, ctx) = describe(view, device)?;
    let read_only = !view.buffer().allowed_access().contains(MemoryAccess::WRITE);
    let manager_ctx = Box::into_raw(ctx) as *mut c_void;
    let (ptr, name) = if versioned {
        let t = Box::new(DLManagedTensorVersioned {
            version: DLPackVersion { major: 1, minor: 0 },
            manager_ctx,
            deleter: Some(delete_versioned),
            flags: if read_only { FLAG_READ_ONLY } else { 0 },
            dl_tensor,
        });
        (Box::into_raw(t) as *mut c_void, VERSIONED_NAME)
    } else {
        let t = Box::new(DLManagedTensor {
            dl_tensor,
            manager_ctx,
            deleter: Some(delete_legacy),
        });
        (Box::into_raw(t) as *mut c_void, LEGACY_NAME)
    };
    // SAFETY: `ptr` is a live tensor of the kind `name` says; the capsule
    // owns it from here and `capsule_destructor` frees it unless a
    // consumer took it (renaming the capsule and calling the deleter).
    let capsule = unsafe { ffi::PyCapsule_New(ptr, name.as_ptr(), Some(capsule_destructor)) };
    if capsule.is_null() {
        // SAFETY: the capsule was not created, so the tensor is still ours.
        unsafe { capsule_destructor_fallback(ptr, versioned) };
        return Err(PyErr::fetch(py));
    }
    // SAFETY: `PyCapsule_New` returned a new, owned reference.
    Ok(unsafe { PyObject::from_owned_ptr(py, capsule) })
}

/// Frees a tensor whose capsule could not be created.
///
/// # Safety
/// `ptr` is a tensor made by `export_capsule` (versioned as `versioned`
/// says) that no capsule owns, freed at most once.
// SAFETY: callers uphold the contract above; the body only frees the tensor.
unsafe fn capsule_destructor_fallback(ptr: *mut c_void, versioned: bool) {
    // SAFETY: the caller passes a tensor made by `export_capsule` that no
    // capsule owns.
    unsafe {
        if versioned {
            delete_versioned(ptr as *mut DLManagedTensorVersioned)
        } else {
            delete_legacy(ptr as *mut DLManagedTensor)
        }
    }
}

/// Owns an imported tensor: calls the producer's deleter when dropped.
enum Imported {
    Legacy(*mut DLManagedTensor),
    Versioned(*mut DLManagedTensorVersioned),
}

// SAFETY: DLPack lets the consumer call the deleter from any thread; the
// tensor is only read (never mutated) through these pointers until then.
unsafe impl Send for Imported {}
// SAFETY: see above; shared access only reads the immutable descriptor.
unsafe impl Sync for Imported {}

impl Imported {
    fn tensor(&self) -> &DLTensor {
        // SAFETY: the pointer came from a live capsule of the matching kind
        // and stays valid until our deleter call in `drop`.
        unsafe {
            match self {
                Imported::Legacy(t) => &(**t).dl_tensor,
                Imported::Versioned(t) => &(**t).dl_tensor,
            }
        }
    }

    fn read_only(&self) -> bool {
        match self {
            Imported::Legacy(_) => false,
            // SAFETY: as in `tensor`.
            Imported::Versioned(t) => unsafe { (**t).flags & FLAG_READ_ONLY != 0 },
        }
    }
}

impl Drop for Imported {
    fn drop(&mut self) {
        // SAFETY: we own the tensor (the capsule was renamed "used_..."), so
        // calling its deleter once here is the protocol.
        unsafe {
            match *self {
                Imported::Legacy(t) => {
                    if let Some(d) = (*t).deleter {
                        d(t)
                    }
                }
                Imported::Versioned(t) => {
                    if let Some(d) = (*t).deleter {
                        d(t)
                    }
                }
            }
        }
    }
}

/// Takes ownership of the tensor in `capsule` (renaming it, as the
/// protocol requires of consumers).
fn take_capsule(py: Python<'_>, capsule: &Bound<'_, PyAny>) -> PyResult<Imported> {
    let p = capsule.as_ptr();
    // SAFETY: `p` is a live object; the capsule API checks its type and
    // name before handing out the pointer.
    unsafe {
        if ffi::PyCapsule_IsValid(p, VERSIONED_NAME.as_ptr()) == 1 {
            let t = ffi::PyCapsule_GetPointer(p, VERSIONED_NAME.as_ptr())
                as *mut DLManagedTensorVersioned;
            if (*t).version.major != 1 {
                return Err(PyBufferError::new_err(format!(
                    "unsupported DLPack version {}.{} (1.x expected)",
                    (*t).version.major,
                    (*t).version.minor
                )));
            }
            if ffi::PyCapsule_SetName(p, VERSIONED_USED.as_ptr()) != 0 {
                return Err(PyErr::fetch(py));
            }
            return Ok(Imported::Versioned(t));
        }
        if ffi::PyCapsule_IsValid(p, LEGACY_NAME.as_ptr()) == 1 {
            let t = ffi::PyCapsule_GetPointer(p, LEGACY_NAME.as_ptr()) as *mut DLManagedTensor;
            if ffi::PyCapsule_SetName(p, LEGACY_USED.as_ptr()) != 0 {
                return Err(PyErr::fetch(py));
            }
            return Ok(Imported::Legacy(t));
        }
    }
    Err(PyValueError::new_err(
        "expected an unconsumed DLPack capsule named 'dltensor' or 'dltensor_versioned'",
    ))
}

/// Imports a DLPack capsule (or any object with `__dlpack__`) as a buffer
/// view of `allocator`'s device.
pub fn import(
    py: Python<'_>,
    allocator: &Arc<dyn Allocator>,
    obj: &Bound<'_, PyAny>,
) -> PyResult<BufferView> {
    let capsule = if obj.hasattr("__dlpack__")? {
        let kwargs = pyo3::types::PyDict::new(py);
        kwargs.set_item("max_version", (1, 0))?;
        match obj.call_method("__dlpack__", (), Some(&kwargs)) {
            Ok(c) => c,
            // Producers predating protocol 1.0 take no keywords.
            Err(e) if e.is_instance_of::<pyo3::exceptions::PyTypeError>(py) => {
                obj.call_method0("__dlpack__")?
            }
            Err(e) => return Err(e),
        }
    } else {
        obj.clone()
    };
    let imported = take_capsule(py, &capsule)?;
    let t = imported.tensor();
    if t.device.device_type != DL_CPU {
        return Err(PyValueError::new_err(format!(
            "dlpack tensor is on device type {} (only kDLCPU = 1 is host memory)",
            t.device.device_type
        )));
    }
    let et = element_type_of(t.dtype)?;
    let ndim = usize::try_from(t.ndim)
        .map_err(|_| PyValueError::new_err(format!("invalid dlpack ndim {}", t.ndim)))?;
    let shape: Vec<i64> = if ndim == 0 {
        Vec::new()
    } else {
        // SAFETY: DLPack guarantees `shape` points to `ndim` values while
        // the tensor lives (until `imported` is dropped).
        unsafe { std::slice::from_raw_parts(t.shape, ndim) }.to_vec()
    };
    let strides: Option<Vec<i64>> = if t.strides.is_null() || ndim == 0 {
        None
    } else {
        // SAFETY: non-null `strides` point to `ndim` values, as `shape`.
        Some(unsafe { std::slice::from_raw_parts(t.strides, ndim) }.to_vec())
    };
    if shape.iter().any(|&d| d < 0) {
        return Err(PyValueError::new_err(format!(
            "dlpack tensor has a negative dimension: {shape:?}"
        )));
    }
    let dims: Vec<u64> = shape.iter().map(|&d| d as u64).collect();
    let bits = et.bit_count() as u64;
    let byte_size = dense_byte_size(&dims, bits).map_err(PyValueError::new_err)?;
    let elem = (bits / 8) as i64;
    let dense = match &strides {
        None => true,
        Some(st) => {
            let mut expect = 1i64;
            let mut ok = true;
            for i in (0..ndim).rev() {
                if shape[i] > 1 && st[i] != expect {
                    ok = false;
                }
                expect = expect.saturating_mul(shape[i]);
            }
            ok
        }
    };
    if !dense && !bits.is_multiple_of(8) {
        return Err(PyValueError::new_err(
            "strided dlpack tensors of sub-byte elements are not supported",
        ));
    }
    let base = (t.data as *mut u8).wrapping_add(t.byte_offset as usize);
    let params = BufferParams::new(MemoryType::DEVICE_LOCAL, BufferUsage::DEFAULT);
    let writable = !imported.read_only();
    // A read-only tensor is imported for reads only: without
    // DISPATCH_STORAGE_WRITE usage, binding it where a kernel may write
    // (any CPU binding) is refused rather than written.
    let params = if writable {
        params
    } else {
        BufferParams::new(
            MemoryType::DEVICE_LOCAL,
            BufferUsage::TRANSFER | BufferUsage::MAPPING | BufferUsage::DISPATCH_STORAGE_READ,
        )
    };
    let buffer = if dense {
        // SAFETY: a dense tensor's bytes are `[base, base + byte_size)`,
        // valid until the producer's deleter runs, which `imported` (kept
        // by the buffer as owner) calls only when the buffer is freed. The
        // producer may still write them: the HAL never borrows foreign
        // memory as a slice (raw copies; mappings refused).
        let memory =
            unsafe { HostMemory::foreign(base, byte_size as usize, writable, Box::new(imported)) };
        allocator
            .import_host(&params, memory)
            .py_context("Could not import external device buffer")?
    } else {
        // Gather element by element into a dense copy.
        let st = strides.unwrap_or_else(|| {
            // Dense row-major strides, in elements.
            let mut st = vec![1i64; ndim];
            for i in (0..ndim.saturating_sub(1)).rev() {
                st[i] = st[i + 1].saturating_mul(shape[i + 1]);
            }
            st
        });
        let mut out = vec![0u8; byte_size as usize];
        let mut index = vec![0i64; ndim];
        // A dense sub-byte tensor is copied whole; otherwise element by
        // element (`elem` bytes each; checked byte aligned above).
        let (count, elem) = if elem == 0 {
            (1, byte_size as i64)
        } else {
            (byte_size / elem as u64, elem)
        };
        for n in 0..count as usize {
            let off: i64 = index.iter().zip(&st).map(|(i, s)| i * s * elem).sum();
            // SAFETY: DLPack guarantees every in-shape index times its
            // stride addresses an element of the tensor's memory (for the
            // whole-copy case, the dense range itself). The copy goes
            // through raw pointers: the producer may write its memory, so
            // no slice over it is made.
            unsafe {
                std::ptr::copy_nonoverlapping(
                    base.offset(off as isize),
                    out.as_mut_ptr().add(n * elem as usize),
                    elem as usize,
                )
            };
            for d in (0..ndim).rev() {
                index[d] += 1;
                if index[d] < shape[d] {
                    break;
                }
                index[d] = 0;
            }
        }
        drop(imported);
        let b = allocator
            .allocate(&params, byte_size)
            .py_context("Could not allocate a buffer for the dlpack tensor")?;
        b.write(0, &out)
            .py_context("Could not copy the dlpack tensor")?;
        b
    };
    BufferView::new(buffer, &dims, et, EncodingType::DENSE_ROW_MAJOR)
        .py_context("Failed to create buffer view")
}

/// `(device_type, device_id)` of host buffer views.
pub fn dlpack_device() -> (i32, i32) {
    (DL_CPU, 0)
}

/// `__dlpack__` of a buffer view: protocol 1.0 when the consumer's
/// `max_version` allows it, the legacy capsule otherwise.
pub fn dlpack_of(
    py: Python<'_>,
    view: &PyHalBufferView,
    max_version: Option<(u32, u32)>,
    dl_device: Option<(i32, i32)>,
    copy: Option<bool>,
) -> PyResult<PyObject> {
    if let Some(d) = dl_device {
        if d != dlpack_device() {
            return Err(PyBufferError::new_err(format!(
                "cannot export to DLPack device {d:?}: buffer views live on kDLCPU (1, 0)"
            )));
        }
    }
    if copy == Some(true) {
        return Err(PyBufferError::new_err(
            "copy=True is not supported: buffer views export their own memory",
        ));
    }
    let versioned = max_version.is_some_and(|(major, _)| major >= 1);
    export_capsule(py, &view.view, DL_CPU, 0, versioned)
}

/// Bytes of a dense tensor of `dims` with `bits`-bit elements, every product
/// checked: a foreign tensor's shape must not wrap to a small size that
/// would then describe less (or more) memory than it has.
fn dense_byte_size(dims: &[u64], bits: u64) -> Result<u64, String> {
    let overflow = || format!("dlpack tensor shape {dims:?} of {bits}-bit elements overflows");
    let count = dims
        .iter()
        .try_fold(1u64, |n, &d| n.checked_mul(d))
        .ok_or_else(overflow)?;
    let total_bits = count.checked_mul(bits).ok_or_else(overflow)?;
    if !total_bits.is_multiple_of(8) {
        return Err("dlpack tensor does not have a byte aligned size".to_string());
    }
    Ok(total_bits / 8)
}

#[cfg(test)]
mod tests {
    use super::dense_byte_size;

    #[test]
    fn shape_products_are_checked() {
        assert_eq!(dense_byte_size(&[2, 3], 32), Ok(24));
        assert_eq!(dense_byte_size(&[], 16), Ok(2));
        assert_eq!(dense_byte_size(&[0, u64::MAX], 32), Ok(0));
        // 2^32 * 2^32 wraps to 0 in u64 arithmetic.
        let e = dense_byte_size(&[1 << 32, 1 << 32], 8).unwrap_err();
        assert!(e.contains("overflows"), "{e}");
        // The count fits, count * bits does not.
        let e = dense_byte_size(&[1 << 61], 32).unwrap_err();
        assert!(e.contains("overflows"), "{e}");
        assert!(dense_byte_size(&[3], 4)
            .unwrap_err()
            .contains("byte aligned"));
    }
}
