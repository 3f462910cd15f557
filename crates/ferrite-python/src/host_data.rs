//! Where Python host data becomes HAL buffers and buffer views: the one
//! place that decides between using the caller's memory in place (a
//! zero-copy import of a buffer-protocol export or of a DLPack host tensor)
//! and copying it into a fresh buffer, and that names the failures.
//!
//! Its callers only choose a [`Placement`] and the buffer parameters:
//! `FunctionInvoker` arguments (numpy arrays, anything numpy makes one of:
//! lists, scalars), `HalAllocator.allocate_buffer_copy` (which
//! `asdevicearray` and the legacy packing go through),
//! `allocate_host_staging_buffer_copy`, `import_host_allocation`, and the
//! host side of `from_dlpack_capsule`.

use crate::host_buffer::HostBuffer;
use crate::status::PyContext;
use ferrite_hal::allocator::{Allocator, BufferParams};
use ferrite_hal::buffer::{Buffer, ALLOCATION_ALIGNMENT};
use ferrite_hal::buffer_view::BufferView;
use ferrite_hal::element_type::{ElementType, EncodingType};
use ferrite_hal::external::ExternalBuffer;
use pyo3::exceptions::PyValueError;
use pyo3::intern;
use pyo3::prelude::*;
use pyo3::sync::GILOnceCell;

/// How the bytes of a host export reach the buffer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Placement {
    /// A fresh buffer with a copy of the bytes.
    Copy,
    /// The export's memory itself (the export lives as long as the buffer);
    /// the caller acquired a writable export.
    Import,
    /// The export's memory when it can stand as a device buffer (writable,
    /// non-empty, aligned to [`ALLOCATION_ALIGNMENT`]); a copy otherwise.
    ImportIfAligned,
}

/// A C-contiguous export of Python host data with the shape and element
/// type it will have as a buffer view.
pub struct HostArray {
    /// The export; C-contiguous (checked again by `raw_parts`).
    pub host: HostBuffer,
    /// Dimensions as the exporter gives them (rank 0 for a 0-d array).
    pub shape: Vec<u64>,
    /// The element type named by the export's format or its numpy dtype.
    pub element_type: ElementType,
}

/// numpy's converters, looked up once per process.
struct Numpy {
    asarray: PyObject,
    ascontiguousarray: PyObject,
}

static NUMPY: GILOnceCell<Numpy> = GILOnceCell::new();

fn numpy(py: Python<'_>) -> PyResult<&Numpy> {
    NUMPY.get_or_try_init(py, || {
        let np = py.import("numpy")?;
        Ok(Numpy {
            asarray: np.getattr("asarray")?.unbind(),
            ascontiguousarray: np.getattr("ascontiguousarray")?.unbind(),
        })
    })
}

impl HostArray {
    /// `obj` as an array: its own export when it has one (numpy arrays,
    /// `bytes`, `memoryview`, ml_dtypes arrays through a same-width integer
    /// view), else what `numpy.asarray` makes of it (lists, scalars); a
    /// C-contiguous copy (`numpy.ascontiguousarray`) when strided.
    /// `unconvertible` is the error for objects that are no array.
    pub fn from_object(
        obj: &Bound<'_, PyAny>,
        name: &str,
        unconvertible: impl Fn() -> PyErr,
    ) -> PyResult<HostArray> {
        let py = obj.py();
        let (mut host, named_type) = match HostBuffer::get_reinterpreting(obj) {
            Ok(h) => h,
            Err(_) => {
                let array = numpy(py)?
                    .asarray
                    .call1(py, (obj,))
                    .map_err(|_| unconvertible())?;
                HostBuffer::get_reinterpreting(array.bind(py)).map_err(|_| unconvertible())?
            }
        };
        let format_type = match named_type {
            Some(et) => Ok(Some(et)),
            None => host.element_type(),
        };
        let format_type = format_type.map_err(|e| {
            let dtype = obj
                .getattr(intern!(py, "dtype"))
                .and_then(|d| d.repr())
                .map(|r| r.to_string())
                .unwrap_or_default();
            PyValueError::new_err(format!(
                "{name}: could not map dtype {dtype} to element type: {}",
                e.value(py)
            ))
        })?;
        let element_type = match format_type {
            Some(et) => et,
            None => {
                let dtype: String = obj
                    .getattr(intern!(py, "dtype"))
                    .and_then(|d| d.getattr(intern!(py, "name")))
                    .and_then(|n| n.extract())
                    .map_err(|_| unconvertible())?;
                ElementType::from_numpy_dtype(&dtype).ok_or_else(&unconvertible)?
            }
        };
        let shape = host.shape();
        if !host.is_c_contiguous() {
            let dense = numpy(py)?.ascontiguousarray.call1(py, (obj,))?;
            host = HostBuffer::get_reinterpreting(dense.bind(py))?.0;
        }
        Ok(HostArray {
            host,
            shape,
            element_type,
        })
    }

    /// A buffer view of this array's bytes, placed as `placement` says.
    pub fn into_view(
        self,
        allocator: &dyn Allocator,
        params: &BufferParams,
        placement: Placement,
    ) -> PyResult<BufferView> {
        let buffer = buffer_from_export(allocator, params, self.host, placement)?;
        view_of(buffer, &self.shape, self.element_type)
    }
}

/// A dense row-major view of the whole `buffer`.
pub fn view_of(buffer: Buffer, shape: &[u64], element_type: ElementType) -> PyResult<BufferView> {
    BufferView::new(buffer, shape, element_type, EncodingType::DENSE_ROW_MAJOR)
        .py_context("Error allocating buffer_view")
}

/// A buffer with the bytes of `host` (C-contiguous; ValueError when not):
/// its memory itself or a copy, as `placement` says.
pub fn buffer_from_export(
    allocator: &dyn Allocator,
    params: &BufferParams,
    host: HostBuffer,
    placement: Placement,
) -> PyResult<Buffer> {
    let (ptr, len) = host.raw_parts()?;
    let import = match placement {
        Placement::Copy => false,
        Placement::Import => true,
        Placement::ImportIfAligned => {
            host.is_writable() && len > 0 && (ptr as usize).is_multiple_of(ALLOCATION_ALIGNMENT)
        }
    };
    if import {
        let writable = host.is_writable();
        // SAFETY: `host` holds a C-contiguous export of `len` bytes at `ptr`
        // (writable when `writable`), which the exporter keeps valid and
        // unresized (numpy refuses to resize an exported array) until the
        // export is released, i.e. until `host`, the owner passed here, is
        // dropped with the buffer's allocation. Python may keep writing the
        // object: the HAL never borrows foreign memory as a slice (copies
        // through raw pointers), so that races only as mapped memory does
        // in upstream, without breaking a Rust reference; device work on it
        // is ordered by the caller's fences.
        return unsafe {
            import_foreign(
                allocator,
                params,
                ptr,
                len,
                writable,
                Box::new(host.into_shared()),
            )
        };
    }
    // SAFETY: `ptr` is valid for reads of `len` bytes while `host` lives
    // (a C-contiguous export), it is not the fresh buffer's memory, and the
    // GIL is held (a `HostBuffer` is only used under it), so no Python code
    // writes it during the copy.
    unsafe { copy_into_new(allocator, params, ptr, len) }
}

/// A buffer over foreign host memory, without a copy where the allocator
/// wraps it (the HAL's external host-allocation import: a GPU allocator
/// copies small or read-only memory; `owner` is then dropped at once).
///
/// # Safety
/// `ptr` must be valid for reads (and writes when `writable`) of `len` bytes
/// until `owner` is dropped (the buffer drops it with its allocation); any
/// other writer of the memory must only race as mapped memory does (the
/// HAL reads foreign memory only through raw copies).
pub unsafe fn import_foreign(
    allocator: &dyn Allocator,
    params: &BufferParams,
    ptr: *mut u8,
    len: usize,
    writable: bool,
    owner: Box<dyn Send + Sync>,
) -> PyResult<Buffer> {
    // SAFETY: the caller's contract above is
    // `ExternalBuffer::host_allocation`'s.
    let external = unsafe { ExternalBuffer::host_allocation(ptr, len, writable, owner) };
    let buffer = allocator
        .import_buffer(params, external)
        .py_context("Could not import host memory")?;
    debug_assert_eq!(buffer.byte_length(), len as u64);
    Ok(buffer)
}

/// A fresh buffer holding a copy of `len` bytes at `ptr`.
///
/// # Safety
/// `ptr` must be valid for reads of `len` bytes for the call and must not
/// be written meanwhile.
pub unsafe fn copy_into_new(
    allocator: &dyn Allocator,
    params: &BufferParams,
    ptr: *const u8,
    len: usize,
) -> PyResult<Buffer> {
    let buffer = allocate(allocator, params, len)?;
    // SAFETY: the caller vouches for `ptr` (contract above), and the fresh
    // buffer's memory cannot overlap memory that existed before it.
    unsafe { buffer.write_raw(0, ptr, len) }.py_context("Error copying into device buffer")?;
    Ok(buffer)
}

/// A fresh buffer holding a copy of `bytes` (memory Rust owns).
pub fn copy_slice_into_new(
    allocator: &dyn Allocator,
    params: &BufferParams,
    bytes: &[u8],
) -> PyResult<Buffer> {
    let buffer = allocate(allocator, params, bytes.len())?;
    buffer
        .write(0, bytes)
        .py_context("Error copying into device buffer")?;
    Ok(buffer)
}

fn allocate(allocator: &dyn Allocator, params: &BufferParams, len: usize) -> PyResult<Buffer> {
    allocator
        .allocate(params, len as u64)
        .py_context("Failed to allocate device visible buffer")
}
