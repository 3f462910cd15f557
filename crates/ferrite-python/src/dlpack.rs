//! DLPack interchange: buffer views out as DLPack capsules (legacy
//! `dltensor` and, for consumers asking for protocol 1.x, versioned
//! `dltensor_versioned`), and DLPack capsules in as buffer views.
//!
//! | memory | `__dlpack_device__` | exported `data` |
//! | --- | --- | --- |
//! | host memory (CPU devices) | `(kDLCPU, 0)` | the mapped host address |
//! | CUDA device-local | `(kDLCUDA, ordinal)` | the device address (buffer offset included, `byte_offset` 0); `dl_device=(kDLCPU, 0)` copies to the host (flagged `IS_COPIED`) |
//! | CUDA pinned (host-visible) | `(kDLCUDAHost, 0)` | the host address; `dl_device=(kDLCPU, 0)` gives the same memory labelled host, `(kDLCUDA, ordinal)` its mapped device address |
//!
//! `__dlpack__(stream=...)` on CUDA memory follows the array API: `None`
//! means the legacy default stream, `-1` no ordering, `0` is refused, any
//! other value is the consumer's stream handle (`1` legacy, `2` per-thread
//! default stream). Ferrite records an event after everything enqueued so
//! far on the device's queue stream and makes the consumer's stream wait
//! for it on the GPU: the data are ready for the consumer's later work and
//! the host never blocks. Exports of CUDA memory to the host (pinned memory,
//! copies) wait for that event on the host instead. Exported device memory
//! is freed stream-ordered on the queue stream once the consumer's deleter
//! runs and Ferrite's last buffer is gone (never recycled as an idle block);
//! for a consumer on the legacy default stream (PyTorch's default), that
//! stream's work so far is ordered before the free. A consumer on another
//! stream must finish its work on the memory before releasing it (as DLPack
//! asks: the deleter means "no longer used").
//!
//! Import is zero-copy for dense row-major tensors (the producer's deleter
//! runs when the last buffer using the memory goes away). Strided host
//! tensors are copied into a new dense buffer; strided `kDLCUDA` tensors
//! are refused (make them contiguous first). A `kDLCUDA` tensor is wrapped
//! in place by the CUDA device of its ordinal, after the driver confirms the
//! pointer is that device's memory (pinned host memory labelled `kDLCUDA`
//! is refused as host memory); when the object has `__dlpack__`,
//! Ferrite passes its queue stream so the producer orders its pending work
//! before Ferrite's. The structs are the DLPack ABI (dlpack.h, v1.0) written
//! out in Rust.
//!
//! Every driver is reached through the HAL's external-buffer API
//! (`ferrite_hal::external`), never a driver's own types: imports are
//! `Allocator::import_buffer` of an `ExternalBuffer` (a host allocation,
//! or a device allocation of the device's own API), exports read
//! `Buffer::native_memory` / `Buffer::export_device_address`, and stream
//! ordering is the device's `NativeQueue`. A `kDLCUDA` tensor needs a
//! device whose native API is CUDA.

use crate::hal::PyHalBufferView;
use crate::status::PyContext;
use ferrite_hal::allocator::BufferParams;
use ferrite_hal::buffer::{BindingPtr, Buffer, WHOLE_BUFFER};
use ferrite_hal::buffer_view::BufferView;
use ferrite_hal::device::Device;
use ferrite_hal::element_type::{ElementType, EncodingType, NumericalType};
use ferrite_hal::external::{ExternalBuffer, NativeApi, NativeMemory, NativeQueue, NativeStream};
use ferrite_hal::memory::{BufferUsage, MemoryAccess, MemoryType};
use pyo3::exceptions::{PyBufferError, PyTypeError, PyValueError};
use pyo3::ffi;
use pyo3::prelude::*;
use std::ffi::{c_void, CStr};

use std::sync::Arc;

/// `kDLCPU`: host memory.
pub const DL_CPU: i32 = 1;
/// `kDLCUDA`: CUDA device memory.
pub const DL_CUDA: i32 = 2;
/// `kDLCUDAHost`: pinned host memory of the CUDA driver.
pub const DL_CUDA_HOST: i32 = 3;

const DL_INT: u8 = 0;
const DL_UINT: u8 = 1;
const DL_FLOAT: u8 = 2;
const DL_BFLOAT: u8 = 4;
const DL_COMPLEX: u8 = 5;
const DL_BOOL: u8 = 6;

/// `DLPACK_FLAG_BITMASK_READ_ONLY`.
const FLAG_READ_ONLY: u64 = 1;
/// `DLPACK_FLAG_BITMASK_IS_COPIED`.
const FLAG_IS_COPIED: u64 = 1 << 1;

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

/// What keeps an exported tensor's bytes alive.
enum BytesOwner {
    /// A host mapping of the buffer (and so the allocation).
    Mapping(#[allow(dead_code)] BindingPtr),
    /// The buffer itself: its device memory is addressed directly.
    Buffer(#[allow(dead_code)] Buffer),
    /// A host copy the consumer owns.
    Bytes(#[allow(dead_code)] Vec<u8>),
}

/// What an exported tensor keeps alive: its bytes and the shape array the
/// tensor points into.
struct ExportContext {
    _owner: BytesOwner,
    shape: Vec<i64>,
    /// For CUDA memory handed to a consumer on the legacy default stream:
    /// that stream's work is ordered before the queue stream, on which the
    /// memory may be freed (stream-ordered) once `_owner` goes.
    release_after: Option<Arc<dyn NativeQueue>>,
}

impl Drop for ExportContext {
    fn drop(&mut self) {
        if let Some(queue) = self.release_after.take() {
            // SAFETY: the legacy default stream's handle is always valid
            // (the queue is a CUDA device's: only those export kDLCUDA).
            // Failure leaves the free unordered, as with any other stream.
            let _ = unsafe { queue.order_after_stream(NativeStream::CUDA_LEGACY) };
        }
    }
}

/// The bytes an export points at.
struct Source {
    data: *mut c_void,
    owner: BytesOwner,
    copied: bool,
    /// See [`ExportContext::release_after`].
    release_after: Option<Arc<dyn NativeQueue>>,
}

/// Where a buffer's bytes live, as DLPack names devices.
enum Location {
    /// Host memory (CPU devices' buffers).
    Host,
    /// CUDA device-local memory, ordered by its device's `queue`.
    CudaDevice { queue: Arc<dyn NativeQueue> },
    /// Pinned, mapped host memory of a CUDA device.
    CudaPinned { queue: Arc<dyn NativeQueue> },
}

impl Location {
    fn of(buffer: &Buffer) -> Location {
        match buffer.native_memory() {
            Some(NativeMemory {
                queue,
                device_local,
                ..
            }) if queue.device().api == NativeApi::Cuda => {
                if device_local {
                    Location::CudaDevice { queue }
                } else {
                    Location::CudaPinned { queue }
                }
            }
            // Memory of an API DLPack export does not know (none today)
            // is treated as host memory: its host mapping is then refused
            // with a clear error where the host cannot address it.
            _ => Location::Host,
        }
    }

    /// The DLPack device the memory is exported as by default.
    fn device(&self) -> (i32, i32) {
        match self {
            Location::Host => (DL_CPU, 0),
            Location::CudaDevice { queue } => (DL_CUDA, queue.device().ordinal),
            Location::CudaPinned { .. } => (DL_CUDA_HOST, 0),
        }
    }
}

/// A host mapping of `view`'s buffer (for host-addressable memory).
fn host_source(view: &BufferView) -> PyResult<Source> {
    let access = if view.buffer().allowed_access().contains(MemoryAccess::WRITE) {
        MemoryAccess::READ | MemoryAccess::WRITE
    } else {
        MemoryAccess::READ
    };
    let mapping = view
        .buffer()
        .binding_ptr(0, WHOLE_BUFFER, access)
        .py_context("Cannot export device buffer")?;
    Ok(Source {
        data: mapping.as_ptr() as *mut c_void,
        owner: BytesOwner::Mapping(mapping),
        copied: false,
        release_after: None,
    })
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

/// Fills a `DLTensor` for `view` over `source` (dense row-major: strides
/// left null).
fn describe(
    view: &BufferView,
    device: DLDevice,
    source: Source,
) -> PyResult<(DLTensor, Box<ExportContext>)> {
    let dtype = dtype_of(view.element_type())?;
    let mut ctx = Box::new(ExportContext {
        shape: view.shape().iter().map(|&d| d as i64).collect(),
        _owner: source.owner,
        release_after: source.release_after,
    });
    let tensor = DLTensor {
        data: source.data,
        device,
        ndim: ctx.shape.len() as i32,
        dtype,
        shape: ctx.shape.as_mut_ptr(),
        strides: std::ptr::null_mut(),
        byte_offset: 0,
    };
    Ok((tensor, ctx))
}

/// DLPack deleter of exported legacy tensors.
///
/// # Safety
/// `t` is a tensor made by `export_capsule` (its context boxed there),
/// not deleted before.
unsafe extern "C" fn delete_legacy(t: *mut DLManagedTensor) {
    // SAFETY: `t` and its context were made by `Box::into_raw` in
    // `export_capsule`; DLPack calls the deleter exactly once.
    unsafe {
        let t = Box::from_raw(t);
        drop(Box::from_raw(t.manager_ctx as *mut ExportContext));
    }
}

/// DLPack deleter of exported versioned tensors.
///
/// # Safety
/// As [`delete_legacy`], for the versioned struct.
unsafe extern "C" fn delete_versioned(t: *mut DLManagedTensorVersioned) {
    // SAFETY: as `delete_legacy`, for the versioned struct.
    unsafe {
        let t = Box::from_raw(t);
        drop(Box::from_raw(t.manager_ctx as *mut ExportContext));
    }
}

/// Capsule destructor: a capsule still carrying its unconsumed name was
/// never taken by a consumer, so its tensor is deleted here.
///
/// # Safety
/// Called by CPython with a capsule this module created, once.
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

/// Exports `view` over `source` as a DLPack capsule labelled `device`:
/// versioned (protocol 1.0) or legacy.
fn make_capsule(
    py: Python<'_>,
    view: &BufferView,
    device: (i32, i32),
    source: Source,
    versioned: bool,
) -> PyResult<PyObject> {
    let device = DLDevice {
        device_type: device.0,
        device_id: device.1,
    };
    let copied = source.copied;
    let (dl_tensor, ctx) = describe(view, device, source)?;
    let read_only = !copied && !view.buffer().allowed_access().contains(MemoryAccess::WRITE);
    let manager_ctx = Box::into_raw(ctx) as *mut c_void;
    let (ptr, name) = if versioned {
        let t = Box::new(DLManagedTensorVersioned {
            version: DLPackVersion { major: 1, minor: 0 },
            manager_ctx,
            deleter: Some(delete_versioned),
            flags: if read_only { FLAG_READ_ONLY } else { 0 }
                | if copied { FLAG_IS_COPIED } else { 0 },
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

/// `HalDevice.create_dlpack_capsule`: a legacy capsule of `view` labelled
/// with the caller's DLPack device, as upstream's. The data pointer is the
/// device address for CUDA device memory (and for pinned memory labelled
/// `kDLCUDA`), the host address otherwise; nothing is waited for.
pub fn export_capsule(
    py: Python<'_>,
    view: &BufferView,
    device_type: i32,
    device_id: i32,
) -> PyResult<PyObject> {
    let source = match Location::of(view.buffer()) {
        Location::CudaDevice { .. } => device_source(view)?,
        Location::CudaPinned { .. } if device_type == DL_CUDA => device_source(view)?,
        Location::Host | Location::CudaPinned { .. } => host_source(view)?,
    };
    make_capsule(py, view, (device_type, device_id), source, false)
}

/// The device address of `view`'s buffer, kept alive by the buffer
/// (exported through the HAL: the consumer's streams may use it after
/// Ferrite's last use, so the driver never recycles it without stream
/// ordering).
fn device_source(view: &BufferView) -> PyResult<Source> {
    let address = view
        .buffer()
        .export_device_address()
        .py_context("Cannot export device buffer")?;
    Ok(Source {
        data: address as *mut c_void,
        owner: BytesOwner::Buffer(view.buffer().clone()),
        copied: false,
        release_after: None,
    })
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

/// The capsule of `obj`: `obj` itself, or what its `__dlpack__` returns,
/// asked for protocol 1.0 and, when `stream` is given, to order its work
/// before that CUDA stream (producers predating those keywords are asked
/// with fewer).
fn capsule_of<'py>(
    py: Python<'py>,
    obj: &Bound<'py, PyAny>,
    stream: Option<usize>,
) -> PyResult<Bound<'py, PyAny>> {
    if !obj.hasattr("__dlpack__")? {
        return Ok(obj.clone());
    }
    let call = |max_version: bool| -> PyResult<Bound<'py, PyAny>> {
        let kwargs = pyo3::types::PyDict::new(py);
        if max_version {
            kwargs.set_item("max_version", (1, 0))?;
        }
        if let Some(s) = stream {
            kwargs.set_item("stream", s)?;
        }
        obj.call_method("__dlpack__", (), Some(&kwargs))
    };
    match call(true) {
        Ok(c) => Ok(c),
        // Producers predating protocol 1.0 take no `max_version`.
        Err(e) if e.is_instance_of::<PyTypeError>(py) => match call(false) {
            Ok(c) => Ok(c),
            Err(e) if stream.is_none() && e.is_instance_of::<PyTypeError>(py) => {
                obj.call_method0("__dlpack__")
            }
            Err(e) => Err(e),
        },
        Err(e) => Err(e),
    }
}

/// The DLPack device `obj` reports through `__dlpack_device__`, if any.
fn producer_device(obj: &Bound<'_, PyAny>) -> Option<(i32, i32)> {
    if !obj.hasattr("__dlpack_device__").unwrap_or(false) {
        return None;
    }
    obj.call_method0("__dlpack_device__")
        .ok()?
        .extract::<(i32, i32)>()
        .ok()
}

/// True for an object reporting CUDA device memory (`kDLCUDA`) through
/// `__dlpack_device__`.
pub fn is_cuda_tensor(obj: &Bound<'_, PyAny>) -> bool {
    matches!(producer_device(obj), Some((DL_CUDA, _)))
}

/// Why a device cannot take a `kDLCUDA` tensor, with where CUDA stands on
/// this machine.
fn not_a_cuda_device(device: &dyn Device, device_id: i32) -> PyErr {
    let through_cuda =
        || format!("import it through the CUDA device (rt.get_device(\"cuda://{device_id}\"))");
    // Asked of the driver registry, as `get_device` would.
    let options = ferrite::driver::DriverOptions::default();
    let cuda = match ferrite::driver::find_driver("cuda") {
        Err(_) => "and this build has no CUDA driver".to_string(),
        Ok(driver) => match driver.enumerate(&options) {
            Ok(found) if !found.is_empty() => through_cuda(),
            // No GPU listed: creating the device says why (no driver
            // library, or a driver that reports no GPU).
            _ => match ferrite::driver::DeviceSpec::parse("cuda")
                .and_then(|spec| driver.create(&spec, &options))
            {
                Err(e) => format!("and this machine has no CUDA device: {e}"),
                Ok(_) => through_cuda(),
            },
        },
    };
    PyValueError::new_err(format!(
        "dlpack tensor is CUDA device memory (kDLCUDA, device {device_id}); HAL device '{}' is not a CUDA device, {cuda}",
        device.id()
    ))
}

/// Imports a DLPack capsule (or any object with `__dlpack__`) as a buffer
/// view of `device`.
pub fn import(
    py: Python<'_>,
    device: &Arc<dyn Device>,
    obj: &Bound<'_, PyAny>,
) -> PyResult<BufferView> {
    let native = device
        .native_queue()
        .filter(|q| q.device().api == NativeApi::Cuda);
    // A CUDA producer orders its pending work before our queue stream.
    let stream = match (&native, producer_device(obj)) {
        (Some(q), Some((DL_CUDA, _))) => Some(q.stream().0),
        _ => None,
    };
    let capsule = capsule_of(py, obj, stream)?;
    let imported = take_capsule(py, &capsule)?;
    let t = imported.tensor();
    let on_cuda = match t.device.device_type {
        DL_CPU | DL_CUDA_HOST => false,
        DL_CUDA => true,
        other => {
            return Err(PyValueError::new_err(format!(
                "dlpack tensor is on device type {other}; Ferrite imports kDLCPU (1) and kDLCUDAHost (3) host memory, and kDLCUDA (2) memory on a CUDA device"
            )))
        }
    };
    let cuda = if on_cuda {
        let Some(c) = native else {
            return Err(not_a_cuda_device(&**device, t.device.device_id));
        };
        let ordinal = c.device().ordinal;
        if t.device.device_id != ordinal {
            return Err(PyValueError::new_err(format!(
                "dlpack tensor is on CUDA device {}, but HAL device '{}' is CUDA device {ordinal}; import it through rt.get_device(\"cuda://{}\")",
                t.device.device_id,
                device.id(),
                t.device.device_id
            )));
        }
        Some(c)
    } else {
        None
    };
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
    let writable = !imported.read_only();
    let params = BufferParams::new(MemoryType::DEVICE_LOCAL, BufferUsage::DEFAULT);
    // A read-only tensor is imported for reads only: without
    // DISPATCH_STORAGE_WRITE usage, binding it where a kernel may write
    // is refused rather than written.
    let params = if writable {
        params
    } else {
        BufferParams::new(
            MemoryType::DEVICE_LOCAL,
            BufferUsage::TRANSFER | BufferUsage::MAPPING | BufferUsage::DISPATCH_STORAGE_READ,
        )
    };
    if cuda.is_some() {
        if !dense {
            return Err(PyValueError::new_err(format!(
                "strided CUDA dlpack tensors are not supported (shape {shape:?}, strides {:?} elements); make the tensor contiguous first (torch: .contiguous())",
                strides.unwrap_or_default()
            )));
        }
        let access = if writable {
            MemoryAccess::READ | MemoryAccess::WRITE
        } else {
            MemoryAccess::READ
        };
        let usage = if writable {
            BufferUsage::TRANSFER | BufferUsage::DISPATCH_STORAGE
        } else {
            BufferUsage::TRANSFER | BufferUsage::DISPATCH_STORAGE_READ
        };
        let params = BufferParams {
            access,
            ..BufferParams::new(MemoryType::DEVICE_LOCAL, usage)
        };
        // SAFETY: a dense kDLCUDA tensor's bytes are `[base, base +
        // byte_size)` of the device's CUDA ordinal (checked above; the
        // driver checks the pointer's device, context and allocation range
        // again), valid until the producer's deleter runs, which `imported`
        // (the release) calls only when the last buffer using the memory is
        // dropped; a read-only tensor is imported not writable.
        let external = unsafe {
            ExternalBuffer::device_allocation(base as u64, byte_size, writable, Box::new(imported))
        };
        let buffer = device
            .allocator()
            .import_buffer(&params, external)
            .py_context("Could not import the CUDA dlpack tensor")?;
        return BufferView::new(buffer, &dims, et, EncodingType::DENSE_ROW_MAJOR)
            .py_context("Failed to create buffer view");
    }
    let allocator = device.allocator();
    let buffer = if dense {
        // SAFETY: a dense tensor's bytes are `[base, base + byte_size)`,
        // valid until the producer's deleter runs, which `imported` (kept
        // by the buffer as owner) calls only when the buffer is freed. The
        // producer may still write them: the HAL never borrows foreign
        // memory as a slice (raw copies; mappings refused).
        unsafe {
            crate::host_data::import_foreign(
                &*allocator,
                &params,
                base,
                byte_size as usize,
                writable,
                Box::new(imported),
            )
        }?
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
        crate::host_data::copy_slice_into_new(&*allocator, &params, &out)?
    };
    crate::host_data::view_of(buffer, &dims, et)
}

/// `__dlpack_device__` of a buffer view: where its memory is (see the
/// module docs).
pub fn dlpack_device(view: &BufferView) -> (i32, i32) {
    Location::of(view.buffer()).device()
}

/// The consumer's CUDA stream from `__dlpack__(stream=...)`: `None` for
/// "no ordering" (-1), the legacy default stream for `None`.
fn consumer_stream(stream: Option<i64>) -> PyResult<Option<NativeStream>> {
    parse_consumer_stream(stream).map_err(PyValueError::new_err)
}

/// [`consumer_stream`] without Python (unit-testable).
fn parse_consumer_stream(stream: Option<i64>) -> Result<Option<NativeStream>, String> {
    match stream {
        None => Ok(Some(NativeStream::CUDA_LEGACY)),
        Some(-1) => Ok(None),
        Some(0) => Err(
            "stream=0 is ambiguous for CUDA (DLPack): pass 1 for the legacy default stream, 2 for the per-thread default stream, a stream handle, or -1 for no ordering".to_string(),
        ),
        Some(s) if s < 0 => Err(format!(
            "invalid CUDA stream {s} for __dlpack__ (-1 means no ordering)"
        )),
        Some(s) => Ok(Some(NativeStream(s as usize))),
    }
}

/// The device address of `view`'s buffer for a consumer working on
/// `stream` (the `__dlpack__` argument): the queue's pending work is
/// ordered before that stream now, and, for the legacy default stream
/// (where PyTorch's default work runs), that stream's work before the
/// queue stream when the consumer releases the memory.
fn export_to_stream(
    view: &BufferView,
    queue: &Arc<dyn NativeQueue>,
    stream: Option<i64>,
) -> PyResult<Source> {
    let consumer = consumer_stream(stream)?;
    if let Some(s) = consumer {
        // SAFETY: the DLPack protocol makes the consumer pass a stream it
        // may use on this device: 1, 2 or a live handle (no driver API can
        // check a handle).
        unsafe { queue.order_before_stream(Some(s)) }
            .py_context("Could not order the export after pending device work")?;
    }
    let mut source = device_source(view)?;
    if consumer == Some(NativeStream::CUDA_LEGACY) {
        source.release_after = Some(queue.clone());
    }
    Ok(source)
}

/// `__dlpack__` of a buffer view: protocol 1.0 when the consumer's
/// `max_version` allows it, the legacy capsule otherwise; `dl_device`
/// picks among the forms in the module docs.
pub fn dlpack_of(
    py: Python<'_>,
    view: &PyHalBufferView,
    stream: Option<i64>,
    max_version: Option<(u32, u32)>,
    dl_device: Option<(i32, i32)>,
    copy: Option<bool>,
) -> PyResult<PyObject> {
    let view = &view.view;
    let versioned = max_version.is_some_and(|(major, _)| major >= 1);
    let location = Location::of(view.buffer());
    let natural = location.device();
    let target = dl_device.unwrap_or(natural);
    let no_copy = || {
        if copy == Some(true) {
            Err(PyBufferError::new_err(
                "copy=True is not supported here: buffer views export their own memory",
            ))
        } else {
            Ok(())
        }
    };
    let unsupported = || {
        let what = match natural.0 {
            DL_CPU => "kDLCPU",
            DL_CUDA => "kDLCUDA",
            _ => "kDLCUDAHost",
        };
        Err(PyBufferError::new_err(format!(
            "cannot export to DLPack device {target:?}: the buffer view's memory is on {what} {natural:?}"
        )))
    };
    let source = match &location {
        Location::Host => {
            if target != natural {
                return unsupported();
            }
            no_copy()?;
            host_source(view)?
        }
        Location::CudaDevice { queue } => {
            if target == natural {
                no_copy()?;
                export_to_stream(view, queue, stream)?
            } else if target == (DL_CPU, 0) {
                if copy == Some(false) {
                    return Err(PyBufferError::new_err(
                        "exporting CUDA device memory to kDLCPU needs a copy, and copy=False forbids it",
                    ));
                }
                // SAFETY: `None` waits on the host; no stream handle.
                unsafe { queue.order_before_stream(None) }
                    .py_context("Could not wait for pending device work")?;
                let bytes = view
                    .buffer()
                    .to_vec()
                    .py_context("Could not copy the buffer to the host")?;
                Source {
                    data: bytes.as_ptr() as *mut c_void,
                    owner: BytesOwner::Bytes(bytes),
                    copied: true,
                    release_after: None,
                }
            } else {
                return unsupported();
            }
        }
        Location::CudaPinned { queue } => {
            no_copy()?;
            if target == (DL_CUDA, queue.device().ordinal) {
                export_to_stream(view, queue, stream)?
            } else if target == natural || target == (DL_CPU, 0) {
                // SAFETY: `None` waits on the host; no stream handle.
                unsafe { queue.order_before_stream(None) }
                    .py_context("Could not wait for pending device work")?;
                host_source(view)?
            } else {
                return unsupported();
            }
        }
    };
    make_capsule(py, view, target, source, versioned)
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
    use super::*;
    use std::mem::{offset_of, size_of};

    #[test]
    fn structs_have_the_dlpack_abi_layout() {
        // dlpack.h v1.0 on 64-bit targets.
        assert_eq!(size_of::<DLTensor>(), 48);
        assert_eq!(offset_of!(DLTensor, device), 8);
        assert_eq!(offset_of!(DLTensor, byte_offset), 40);
        assert_eq!(size_of::<DLManagedTensor>(), 64);
        assert_eq!(offset_of!(DLManagedTensorVersioned, flags), 24);
        assert_eq!(offset_of!(DLManagedTensorVersioned, dl_tensor), 32);
    }

    #[test]
    fn consumer_streams_follow_the_array_api() {
        let legacy = NativeStream::CUDA_LEGACY;
        assert_eq!(parse_consumer_stream(None), Ok(Some(legacy)));
        assert_eq!(parse_consumer_stream(Some(-1)), Ok(None));
        assert_eq!(
            parse_consumer_stream(Some(2)),
            Ok(Some(NativeStream::CUDA_PER_THREAD))
        );
        assert_eq!(
            parse_consumer_stream(Some(0x7f00_1234)),
            Ok(Some(NativeStream(0x7f00_1234)))
        );
        assert!(parse_consumer_stream(Some(0))
            .unwrap_err()
            .contains("ambiguous"));
        assert!(parse_consumer_stream(Some(-2))
            .unwrap_err()
            .contains("invalid CUDA stream -2"));
    }

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
