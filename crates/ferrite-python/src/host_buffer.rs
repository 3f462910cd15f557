//! Reading Python objects that export the buffer protocol (numpy arrays,
//! `bytes`, `memoryview`), and exporting Ferrite memory through it.

use ferrite_hal::element_type::{ElementType, NumericalType};
use pyo3::exceptions::{PyBufferError, PyValueError};
use pyo3::ffi;
use pyo3::intern;
use pyo3::prelude::*;
use std::ffi::c_void;
use std::os::raw::c_int;

/// A borrowed `Py_buffer`, released on drop.
pub struct HostBuffer {
    view: Box<ffi::Py_buffer>,
}

impl HostBuffer {
    /// Acquires a read-only view with shape, strides and format.
    pub fn get(obj: &Bound<'_, PyAny>) -> PyResult<HostBuffer> {
        let mut view: Box<ffi::Py_buffer> = Box::new(ffi::Py_buffer::new());
        // SAFETY: `obj` is a live object (we hold the GIL through `Bound`), and
        // `view` is a valid, zeroed `Py_buffer` that CPython fills on success.
        let rc =
            unsafe { ffi::PyObject_GetBuffer(obj.as_ptr(), &mut *view, ffi::PyBUF_RECORDS_RO) };
        if rc != 0 {
            return Err(PyErr::fetch(obj.py()));
        }
        Ok(HostBuffer { view })
    }

    /// Acquires a read-only view as `get` does, also of numpy arrays whose
    /// dtype has no buffer-protocol format (ml_dtypes' bfloat16 and float8
    /// types): those are exported through a view of the same bytes as
    /// unsigned integers of their width, and their element type, named by
    /// the dtype, comes back with the export (`None` for plain exports).
    pub fn get_reinterpreting(
        obj: &Bound<'_, PyAny>,
    ) -> PyResult<(HostBuffer, Option<ElementType>)> {
        let err = match HostBuffer::get(obj) {
            Ok(host) => return Ok((host, None)),
            Err(e) => e,
        };
        let py = obj.py();
        let Some((element_type, itemsize)) =
            obj.getattr(intern!(py, "dtype")).ok().and_then(|dtype| {
                let name: String = dtype.getattr(intern!(py, "name")).ok()?.extract().ok()?;
                let itemsize: usize = dtype
                    .getattr(intern!(py, "itemsize"))
                    .ok()?
                    .extract()
                    .ok()?;
                Some((ElementType::from_numpy_dtype(&name)?, itemsize))
            })
        else {
            return Err(err);
        };
        let Ok(bits) = obj.call_method1(intern!(py, "view"), (format!("u{itemsize}"),)) else {
            return Err(err);
        };
        Ok((HostBuffer::get(&bits)?, Some(element_type)))
    }

    /// Acquires a writable view (BufferError from the exporter when the
    /// object is read-only).
    pub fn get_writable(obj: &Bound<'_, PyAny>) -> PyResult<HostBuffer> {
        let mut view: Box<ffi::Py_buffer> = Box::new(ffi::Py_buffer::new());
        // SAFETY: as in `get`: a live object and a zeroed view to fill.
        let rc = unsafe { ffi::PyObject_GetBuffer(obj.as_ptr(), &mut *view, ffi::PyBUF_RECORDS) };
        if rc != 0 {
            return Err(PyErr::fetch(obj.py()));
        }
        Ok(HostBuffer { view })
    }

    /// This export as an owner another thread may hold (and drop).
    pub fn into_shared(self) -> SharedExport {
        SharedExport(self)
    }

    /// The dimensions (a 0-d or 1-d byte view when the exporter gave none).
    pub fn shape(&self) -> Vec<u64> {
        let v = &*self.view;
        if v.ndim == 0 {
            // A 0-d array (a numpy scalar array) is a rank-0 tensor.
            return Vec::new();
        }
        if v.shape.is_null() {
            return vec![v.len as u64 / (v.itemsize.max(1) as u64)];
        }
        // SAFETY: with PyBUF_ND requested, `shape` points at `ndim` entries
        // valid until the buffer is released.
        unsafe { std::slice::from_raw_parts(v.shape, v.ndim as usize) }
            .iter()
            .map(|&d| d as u64)
            .collect()
    }

    /// The element type the struct-module format names (`f`, `<i`, `Zd`,
    /// `?`), numpy's signed integers as `SINT_*`; `None` for formats with no
    /// plain mapping (the caller may ask the exporter, e.g. a numpy dtype);
    /// ValueError for data in non-native byte order.
    pub fn element_type(&self) -> PyResult<Option<ElementType>> {
        let v = &*self.view;
        if v.format.is_null() {
            return Ok(Some(ElementType::UINT_8));
        }
        // SAFETY: a non-null `format` is a NUL-terminated string owned by the
        // exporter until the view is released.
        let format = unsafe { std::ffi::CStr::from_ptr(v.format) }.to_bytes();
        let format = match format.split_first() {
            Some((b'@' | b'=', rest)) => rest,
            Some((b'<', rest)) if cfg!(target_endian = "little") => rest,
            Some((b'>' | b'!', rest)) if cfg!(target_endian = "little") => {
                let _ = rest;
                return Err(PyValueError::new_err(
                    "arrays in non-native byte order are not supported",
                ));
            }
            _ => format,
        };
        let bits = u8::try_from(v.itemsize * 8).unwrap_or(0);
        Ok(match format {
            b"?" => Some(ElementType::BOOL_8),
            b"e" => Some(ElementType::FLOAT_16),
            b"f" => Some(ElementType::FLOAT_32),
            b"d" => Some(ElementType::FLOAT_64),
            b"Zf" => Some(ElementType::COMPLEX_FLOAT_64),
            b"Zd" => Some(ElementType::COMPLEX_FLOAT_128),
            [c] if b"bhilq".contains(c) => {
                Some(ElementType::new(NumericalType::INTEGER_SIGNED, bits))
            }
            [c] if b"BHILQ".contains(c) => {
                Some(ElementType::new(NumericalType::INTEGER_UNSIGNED, bits))
            }
            _ => None,
        })
    }

    /// True when the exporter allows writes through this memory.
    pub fn is_writable(&self) -> bool {
        self.view.readonly == 0
    }

    /// True when the elements are laid out densely in C order.
    pub fn is_c_contiguous(&self) -> bool {
        // SAFETY: `view` is a filled buffer; the call only reads it.
        unsafe { ffi::PyBuffer_IsContiguous(&*self.view, b'C' as std::os::raw::c_char) != 0 }
    }

    /// Address and length of the bytes; ValueError when not C-contiguous.
    /// Never a slice: the exporter's owner (Python code, another thread)
    /// may write the memory, so Rust reads it only by raw copies
    /// ([`HostBuffer::to_vec`]) or hands the pointer on to a consumer whose
    /// contract allows that (a HAL foreign import).
    pub fn raw_parts(&self) -> PyResult<(*mut u8, usize)> {
        if !self.is_c_contiguous() {
            return Err(PyValueError::new_err("ndarray is not C-contiguous"));
        }
        Ok((self.view.buf as *mut u8, self.view.len as usize))
    }

    /// A copy of the bytes; ValueError when not C-contiguous.
    pub fn to_vec(&self) -> PyResult<Vec<u8>> {
        let (ptr, len) = self.raw_parts()?;
        let mut out = Vec::with_capacity(len);
        if len > 0 {
            // SAFETY: the view is C-contiguous, so `ptr` is valid for reads
            // of `len` bytes until the view is released (on drop). The copy
            // is made through raw pointers, so no `&[u8]` asserts the bytes
            // are unchanging; the caller holds the GIL (a `HostBuffer` is
            // only used under it), so no Python code writes them meanwhile.
            unsafe {
                std::ptr::copy_nonoverlapping(ptr, out.as_mut_ptr(), len);
                out.set_len(len);
            }
        }
        Ok(out)
    }
}

/// A buffer export kept alive by a HAL buffer that imported its memory.
pub struct SharedExport(#[allow(dead_code)] HostBuffer);

// SAFETY: the export is never read through this wrapper (the HAL buffer
// holds the pointer it was given); it is only dropped, and
// `HostBuffer::drop` takes the GIL before releasing the export, so dropping
// it on any thread is sound.
unsafe impl Send for SharedExport {}
// SAFETY: see `Send`: a shared reference gives access to nothing.
unsafe impl Sync for SharedExport {}

impl Drop for HostBuffer {
    fn drop(&mut self) {
        Python::with_gil(|_| {
            // SAFETY: the view was filled by a successful PyObject_GetBuffer and
            // is released exactly once, with the GIL held.
            unsafe { ffi::PyBuffer_Release(&mut *self.view) };
        });
    }
}

/// Fills `view` as a 1-d unsigned-byte buffer over `[ptr, ptr+len)` owned by
/// `owner` (kept alive through `view.obj`).
///
/// # Safety
/// `view` must be the pointer CPython passed to `__getbuffer__`; `ptr` must
/// stay valid for `len` bytes while `owner` lives, and writable when
/// `readonly` is false.
// SAFETY: callers pass the pointer CPython gave `__getbuffer__` and memory
// that `owner` keeps valid (the contract above); only `view` is written.
pub unsafe fn fill_byte_view(
    owner: &Bound<'_, PyAny>,
    view: *mut ffi::Py_buffer,
    flags: c_int,
    ptr: *mut u8,
    len: usize,
    readonly: bool,
) -> PyResult<()> {
    if view.is_null() {
        return Err(PyBufferError::new_err("View is null"));
    }
    if (flags & ffi::PyBUF_WRITABLE) == ffi::PyBUF_WRITABLE && readonly {
        return Err(PyBufferError::new_err("Object is not writable"));
    }
    // SAFETY: `view` is non-null and CPython's to fill (caller's contract);
    // `ptr`/`len` are valid while `owner` lives, and `owner` is stored with a
    // new reference in `obj`, released by CPython through `__releasebuffer__`.
    unsafe {
        (*view).obj = owner.clone().into_ptr();
        (*view).buf = ptr as *mut c_void;
        (*view).len = len as isize;
        (*view).readonly = readonly as c_int;
        (*view).itemsize = 1;
        (*view).format = if (flags & ffi::PyBUF_FORMAT) == ffi::PyBUF_FORMAT {
            c"B".as_ptr() as *mut _
        } else {
            std::ptr::null_mut()
        };
        (*view).ndim = 1;
        (*view).shape = if (flags & ffi::PyBUF_ND) == ffi::PyBUF_ND {
            &mut (*view).len
        } else {
            std::ptr::null_mut()
        };
        (*view).strides = if (flags & ffi::PyBUF_STRIDES) == ffi::PyBUF_STRIDES {
            &mut (*view).itemsize
        } else {
            std::ptr::null_mut()
        };
        (*view).suboffsets = std::ptr::null_mut();
        (*view).internal = std::ptr::null_mut();
    }
    Ok(())
}
