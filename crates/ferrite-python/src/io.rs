//! Parameter I/O: `FileHandle`, `ParameterIndex`, `ParameterIndexEntry`,
//! `ParameterProvider` and `create_io_parameters_module`, over
//! `ferrite_modules::io_parameters`.

use crate::host_buffer::{fill_byte_view, HostBuffer};
use crate::status::PyContext;
use crate::vm::{PyVmInstance, PyVmModule};
use ferrite_modules::io_parameters::formats::{self, irpa};
use ferrite_modules::io_parameters::{
    create_io_parameters_module as create_module, Entry, FileHandle, ParameterIndex,
    ParameterProvider, Storage, WritableBytes,
};
use parking_lot::Mutex;
use pyo3::exceptions::{PyIndexError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyTuple};
use std::os::raw::c_int;
use std::sync::Arc;

pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<PyFileHandle>()?;
    m.add_class::<PyParameterIndex>()?;
    m.add_class::<PyParameterIndexEntry>()?;
    m.add_class::<PyParameterProvider>()?;
    m.add_class::<PyHostView>()?;
    m.add_function(wrap_pyfunction!(create_io_parameters_module, m)?)?;
    Ok(())
}

/// The bytes of a Python buffer-protocol object, held (not copied) for as
/// long as a file handle needs them.
struct HeldBuffer {
    _view: HostBuffer,
    ptr: *const u8,
    len: usize,
}

// SAFETY: the exporter keeps `ptr..ptr+len` valid until the view is
// released, which happens (with the GIL) only when `_view` drops; the
// export is read-only (checked in `hold`), so nothing writes the bytes
// while the handle borrows them, and the handle never writes them.
unsafe impl Send for HeldBuffer {}
// SAFETY: see above; shared access is read-only.
unsafe impl Sync for HeldBuffer {}

impl AsRef<[u8]> for HeldBuffer {
    fn as_ref(&self) -> &[u8] {
        if self.len == 0 {
            return &[];
        }
        // SAFETY: valid for `len` bytes while `_view` lives (struct invariant).
        unsafe { std::slice::from_raw_parts(self.ptr, self.len) }
    }
}

fn hold(obj: &Bound<'_, PyAny>) -> PyResult<(FileHandle, usize)> {
    let view = HostBuffer::get(obj)?;
    if view.is_writable() {
        // Memory its owner may write (a bytearray, a writable array) is
        // never lent as a `&[u8]`: the handle gets a copy.
        let copy: Arc<Vec<u8>> = Arc::new(view.to_vec()?);
        let address = copy.as_ptr() as usize;
        let name = format!("memory at {address:#x?}");
        return Ok((FileHandle::from_shared(copy, &name), address));
    }
    // A read-only export (bytes, a read-only memoryview or mmap): the
    // exporter promises the memory does not change while exported, so the
    // handle may borrow it for as long as it holds the export.
    let (ptr, len) = view.raw_parts()?;
    let ptr = ptr as *const u8;
    let name = format!("memory at {ptr:#x?}");
    let held = HeldBuffer {
        _view: view,
        ptr,
        len,
    };
    Ok((FileHandle::from_shared(Arc::new(held), &name), ptr as usize))
}

/// The bytes of a writable Python buffer-protocol object (a `bytearray`,
/// a writable numpy array, an `mmap`), lent to a file handle that
/// `scatter` stores into.
struct HeldWritable {
    _view: HostBuffer,
    ptr: *mut u8,
    len: usize,
}

// SAFETY: `ptr`/`len` describe the contiguous memory of the buffer export
// held in `_view`, which keeps the exporter from freeing or resizing it
// while this value lives. Access goes through the file handle's lock, so
// Rust never aliases a write; Python code touching the same memory while a
// parameter operation runs is the caller's race, as with upstream's
// writable host allocations.
unsafe impl Send for HeldWritable {}
// SAFETY: see above.
unsafe impl Sync for HeldWritable {}

impl WritableBytes for HeldWritable {
    fn bytes(&self) -> &[u8] {
        if self.len == 0 {
            return &[];
        }
        // SAFETY: valid for `len` bytes while `_view` lives (see above).
        unsafe { std::slice::from_raw_parts(self.ptr, self.len) }
    }
    fn bytes_mut(&mut self) -> &mut [u8] {
        if self.len == 0 {
            return &mut [];
        }
        // SAFETY: valid and writable (the export was requested writable)
        // for `len` bytes while `_view` lives; `&mut self` is exclusive.
        unsafe { std::slice::from_raw_parts_mut(self.ptr, self.len) }
    }
}

/// A handle over `obj`'s memory: read-only, or writable (the object must
/// export writable, C-contiguous memory) so that `scatter` stores into it.
fn hold_memory(obj: &Bound<'_, PyAny>, writable: bool) -> PyResult<(FileHandle, usize)> {
    if !writable {
        return hold(obj);
    }
    let view = HostBuffer::get_writable(obj)?;
    if !view.is_writable() {
        return Err(PyValueError::new_err(
            "writable=True needs an object that exports writable memory (e.g. a bytearray or a writable numpy array)",
        ));
    }
    let (ptr, len) = view.raw_parts()?;
    let name = format!("memory at {ptr:#x?}");
    let held = HeldWritable {
        _view: view,
        ptr,
        len,
    };
    Ok((
        FileHandle::from_writable_bytes(Box::new(held), &name),
        ptr as usize,
    ))
}

/// How a handle was made, for its repr and `is_host_allocation`.
#[derive(Clone)]
enum Kind {
    Host(usize),
    Fd(i32),
}

#[pyclass(name = "FileHandle", module = "ferrite._ferrite", frozen)]
#[derive(Clone)]
pub struct PyFileHandle {
    handle: FileHandle,
    kind: Kind,
}

impl PyFileHandle {
    fn of(handle: FileHandle) -> PyFileHandle {
        let kind = match handle
            .name()
            .strip_prefix("fd(")
            .and_then(|s| s.strip_suffix(')'))
        {
            Some(fd) => Kind::Fd(fd.parse().unwrap_or(-1)),
            None => Kind::Host(handle.with_bytes(|b| b.as_ptr() as usize)),
        };
        PyFileHandle { handle, kind }
    }
}

#[pymethods]
impl PyFileHandle {
    #[staticmethod]
    #[pyo3(signature = (host_buffer, readable = true, writable = false))]
    fn wrap_memory(
        host_buffer: &Bound<'_, PyAny>,
        readable: bool,
        writable: bool,
    ) -> PyResult<Self> {
        let _ = readable;
        let (handle, ptr) = hold_memory(host_buffer, writable)?;
        Ok(PyFileHandle {
            handle,
            kind: Kind::Host(ptr),
        })
    }

    #[staticmethod]
    #[pyo3(signature = (fd, readable = true, writable = false))]
    fn wrap_fd(fd: i32, readable: bool, writable: bool) -> PyResult<Self> {
        let _ = readable;
        if fd < 0 {
            return Err(PyValueError::new_err(format!(
                "invalid file descriptor {fd}"
            )));
        }
        // SAFETY: the caller passes an open descriptor (as upstream's
        // wrap_fd requires); it is only borrowed to duplicate it, so the
        // caller keeps ownership of `fd`.
        let borrowed = unsafe { std::os::fd::BorrowedFd::borrow_raw(fd) };
        let owned = borrowed.try_clone_to_owned().map_err(|e| {
            PyValueError::new_err(format!("cannot duplicate file descriptor {fd}: {e}"))
        })?;
        let file = std::fs::File::from(owned);
        let name = format!("fd({fd})");
        let handle = if writable {
            FileHandle::map_writable(&file, &name)
        } else {
            FileHandle::map(&file, &name)
        }
        .py_context("Mapping file descriptor")?;
        Ok(PyFileHandle {
            handle,
            kind: Kind::Fd(fd),
        })
    }

    /// A memoryview of a host allocation's bytes (a property, as upstream).
    #[getter]
    fn host_allocation(slf: Bound<'_, Self>) -> PyResult<PyObject> {
        if !slf.get().is_host_allocation() {
            return Err(PyValueError::new_err("FileHandle is not a host allocation"));
        }
        let view = Bound::new(
            slf.py(),
            PyHostView {
                handle: slf.get().handle.clone(),
                offset: 0,
                length: slf.get().handle.len() as usize,
            },
        )?;
        host_memoryview(&view)
    }

    #[getter]
    fn is_host_allocation(&self) -> bool {
        matches!(self.kind, Kind::Host(_))
    }

    /// True when the handle wraps a file descriptor.
    #[getter]
    fn is_fd(&self) -> bool {
        matches!(self.kind, Kind::Fd(_))
    }

    /// The wrapped file descriptor; -1 for other handles.
    #[getter]
    fn fd(&self) -> i64 {
        match self.kind {
            Kind::Fd(fd) => fd as i64,
            _ => -1,
        }
    }

    #[getter]
    fn is_async(&self) -> bool {
        false
    }

    fn __repr__(&self) -> String {
        match self.kind {
            Kind::Host(ptr) => format!("FileHandle<host_allocation(<memory at {ptr:#x}>)>"),
            Kind::Fd(fd) => format!("FileHandle<fd({fd})>"),
        }
    }
}

/// A read-only byte range of a file handle exported through the buffer
/// protocol (what `memoryview` wraps for `file_view`/`host_allocation`).
#[pyclass(name = "_ParameterBytes", module = "ferrite._ferrite", frozen)]
pub struct PyHostView {
    handle: FileHandle,
    offset: usize,
    length: usize,
}

#[pymethods]
impl PyHostView {
    // SAFETY: CPython calls this with a `Py_buffer` to fill for `slf`; the
    // body hands it memory that `slf` keeps alive through its handle.
    unsafe fn __getbuffer__(
        slf: Bound<'_, Self>,
        view: *mut pyo3::ffi::Py_buffer,
        flags: c_int,
    ) -> PyResult<()> {
        let me = slf.get();
        let ptr = me
            .handle
            .with_range(me.offset as u64, me.length as u64, |b| b.as_ptr())
            .py_context("Viewing parameter bytes")?;
        // SAFETY: read-only handles (the only kind Python makes or maps)
        // never move their bytes, and `slf` (kept by the view) holds the
        // handle; the view is read-only.
        unsafe { fill_byte_view(slf.as_any(), view, flags, ptr as *mut u8, me.length, true) }
    }

    // SAFETY: nothing to release; the view's reference to `self` keeps the
    // bytes alive until CPython drops it.
    unsafe fn __releasebuffer__(&self, _view: *mut pyo3::ffi::Py_buffer) {}
}

fn host_memoryview(view: &Bound<'_, PyHostView>) -> PyResult<PyObject> {
    let py = view.py();
    let mv = py
        .import("builtins")?
        .getattr("memoryview")?
        .call1((view,))?;
    Ok(mv.unbind())
}

#[pyclass(name = "ParameterIndexEntry", module = "ferrite._ferrite", frozen)]
pub struct PyParameterIndexEntry {
    entry: Entry,
}

#[pymethods]
impl PyParameterIndexEntry {
    #[getter]
    fn key(&self) -> &str {
        &self.entry.key
    }

    #[getter]
    fn length(&self) -> u64 {
        self.entry.length
    }

    #[getter]
    fn metadata<'py>(&self, py: Python<'py>) -> Bound<'py, PyBytes> {
        PyBytes::new(py, &self.entry.metadata)
    }

    #[getter]
    fn is_file(&self) -> bool {
        matches!(self.entry.storage, Storage::File { .. })
    }

    #[getter]
    fn is_splat(&self) -> bool {
        matches!(self.entry.storage, Storage::Splat { .. })
    }

    #[getter]
    fn file_storage(&self) -> PyResult<(PyFileHandle, u64)> {
        match &self.entry.storage {
            Storage::File { handle, offset } => Ok((PyFileHandle::of(handle.clone()), *offset)),
            Storage::Splat { .. } => Err(PyValueError::new_err("Entry is not file storage based")),
        }
    }

    #[getter]
    fn file_view(&self, py: Python<'_>) -> PyResult<PyObject> {
        match &self.entry.storage {
            Storage::File { handle, offset } => {
                let view = Bound::new(
                    py,
                    PyHostView {
                        handle: handle.clone(),
                        offset: *offset as usize,
                        length: self.entry.length as usize,
                    },
                )?;
                host_memoryview(&view)
            }
            Storage::Splat { .. } => Err(PyValueError::new_err("Entry is not file storage based")),
        }
    }

    #[getter]
    fn splat_pattern<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyBytes>> {
        match &self.entry.storage {
            Storage::Splat { pattern } => Ok(PyBytes::new(py, pattern)),
            Storage::File { .. } => Err(PyValueError::new_err("Entry is not splat")),
        }
    }

    fn __repr__(&self, py: Python<'_>) -> PyResult<String> {
        Ok(match &self.entry.storage {
            // Upstream's file-entry repr has no closing '>'; kept identical.
            Storage::File { handle, offset } => format!(
                "<ParameterIndexEntry '{}' {}:{offset}:{}",
                self.entry.key,
                PyFileHandle::of(handle.clone()).__repr__(),
                self.entry.length
            ),
            Storage::Splat { pattern } => format!(
                "<ParameterIndexEntry '{}' splat {}:{}>",
                self.entry.key,
                PyBytes::new(py, pattern).repr()?,
                self.entry.length
            ),
        })
    }
}

fn metadata_bytes(metadata: Option<&Bound<'_, PyAny>>) -> PyResult<Vec<u8>> {
    match metadata {
        None => Ok(Vec::new()),
        Some(m) if m.is_none() => Ok(Vec::new()),
        Some(m) => {
            if let Ok(s) = m.extract::<String>() {
                Ok(s.into_bytes())
            } else if let Ok(b) = m.extract::<Vec<u8>>() {
                Ok(b)
            } else {
                Err(PyValueError::new_err("metadata must be bytes or str"))
            }
        }
    }
}

#[pyclass(name = "ParameterIndex", module = "ferrite._ferrite", frozen)]
pub struct PyParameterIndex {
    index: Mutex<ParameterIndex>,
}

fn table(index: &ParameterIndex) -> String {
    let total: u64 = index.entries().iter().map(|e| e.length).sum();
    let mut s = String::new();
    s += &format!("//==={}===//\n", "-".repeat(110));
    s += &format!(
        "// Parameter scope <global> ({} entries, {total} total bytes)\n",
        index.len()
    );
    s += &format!(
        "//==={}+{}+{}+{}===//\n",
        "-".repeat(12),
        "-".repeat(18),
        "-".repeat(18),
        "-".repeat(59)
    );
    s += "//         Start |              End |           Length | Key\n";
    s += &format!(
        "//{}+{}+{}+{}//\n",
        "-".repeat(15),
        "-".repeat(18),
        "-".repeat(18),
        "-".repeat(62)
    );
    for e in index.entries() {
        let (start, end) = match &e.storage {
            Storage::File { offset, .. } => (offset.to_string(), (offset + e.length).to_string()),
            Storage::Splat { .. } => ("-".to_string(), "-".to_string()),
        };
        s += &format!("{start:>16} | {end:>16} | {:>16} | `{}`\n", e.length, e.key);
    }
    s + "\n"
}

#[pymethods]
impl PyParameterIndex {
    #[new]
    fn new() -> Self {
        PyParameterIndex {
            index: Mutex::new(ParameterIndex::new()),
        }
    }

    fn __len__(&self) -> usize {
        self.index.lock().len()
    }

    fn __getitem__(&self, i: isize) -> PyResult<PyParameterIndexEntry> {
        let index = self.index.lock();
        match usize::try_from(i).ok().and_then(|i| index.entries().get(i)) {
            Some(e) => Ok(PyParameterIndexEntry { entry: e.clone() }),
            None => Err(PyIndexError::new_err(format!(
                "Could not enumerate parameter index: OUT_OF_RANGE; entry {i} out of range (have {} entries in the index)",
                index.len()
            ))),
        }
    }

    fn reserve(&self, new_capacity: usize) {
        let mut index = self.index.lock();
        let more = new_capacity.saturating_sub(index.len());
        index.reserve(more);
    }

    #[pyo3(signature = (key, pattern, total_length, *, metadata = None))]
    fn add_splat(
        &self,
        key: &str,
        pattern: &Bound<'_, PyAny>,
        total_length: u64,
        metadata: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<()> {
        let view = HostBuffer::get(pattern)?;
        let bytes = view.to_vec()?;
        self.index
            .lock()
            .add_splat(key, &bytes, total_length, metadata_bytes(metadata)?)
            .py_context("Could not add parameter index entry")
    }

    #[pyo3(signature = (key, file_handle, length, *, offset = 0, metadata = None))]
    fn add_from_file_handle(
        &self,
        key: &str,
        file_handle: &PyFileHandle,
        length: u64,
        offset: u64,
        metadata: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<()> {
        self.index
            .lock()
            .add_file(
                key,
                &file_handle.handle,
                offset,
                length,
                metadata_bytes(metadata)?,
            )
            .py_context("Could not add parameter index entry")
    }

    #[pyo3(signature = (key, buffer, *, readable = true, writable = false, metadata = None))]
    fn add_buffer(
        &self,
        key: &str,
        buffer: &Bound<'_, PyAny>,
        readable: bool,
        writable: bool,
        metadata: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<()> {
        let _ = readable;
        let (handle, _) = hold_memory(buffer, writable)?;
        let length = handle.len();
        self.index
            .lock()
            .add_file(key, &handle, 0, length, metadata_bytes(metadata)?)
            .py_context("Could not add parameter index entry")
    }

    fn load_from_file_handle(&self, file_handle: &PyFileHandle, format: &str) -> PyResult<()> {
        let mut index = self.index.lock();
        formats::parse_into(&mut index, &file_handle.handle, Some(format))
            .py_context("Could not parse parameter file index")
    }

    #[pyo3(signature = (file_path, format = None, readable = true, writable = false, mmap = None, *, mode = None))]
    fn load(
        &self,
        file_path: &str,
        format: Option<&str>,
        readable: bool,
        writable: bool,
        mmap: Option<bool>,
        mode: Option<&str>,
    ) -> PyResult<()> {
        let _ = readable;
        let preload = match (mmap, mode) {
            (Some(_), Some(_)) => {
                return Err(PyValueError::new_err(
                    "mmap and mode are mutually exclusive",
                ))
            }
            (Some(m), None) => !m,
            (None, None) | (None, Some("mmap")) | (None, Some("file_async")) => false,
            (None, Some("preload")) => true,
            (None, Some(other)) => {
                return Err(PyValueError::new_err(format!(
                    "unknown load mode '{other}'; expected 'mmap', 'preload' or 'file_async'"
                )))
            }
        };
        let handle = if writable && preload {
            return Err(PyValueError::new_err(
                "writable=True needs a memory-mapped file (mode='mmap'): scatters into a preloaded copy would never reach the file",
            ));
        } else if writable {
            FileHandle::open_writable(file_path)
        } else if preload {
            FileHandle::preload(file_path)
        } else {
            FileHandle::open(file_path)
        }
        .py_context("Mapping parameter file")?;
        let mut index = self.index.lock();
        // Parse into a copy so a malformed file leaves the index unchanged.
        let mut next = index.clone();
        formats::parse_into(&mut next, &handle, format)
            .py_context("Could not parse parameter file index")?;
        *index = next;
        Ok(())
    }

    #[pyo3(signature = (file_path, file_offset = 0, target_index = None))]
    fn create_archive_file(
        &self,
        py: Python<'_>,
        file_path: &str,
        file_offset: u64,
        target_index: Option<Py<PyParameterIndex>>,
    ) -> PyResult<Py<PyParameterIndex>> {
        if file_offset != 0 {
            return Err(PyValueError::new_err(format!(
                "file_offset={file_offset}: archives are written at the start of the file (offset 0)"
            )));
        }
        let snapshot = self.index.lock().clone();
        irpa::save_archive_file(&snapshot, file_path)
            .py_context("Could not write parameter archive")?;
        let target = match target_index {
            Some(t) => t,
            None => Py::new(py, PyParameterIndex::new())?,
        };
        let handle = FileHandle::open(file_path).py_context("Mapping parameter file")?;
        formats::parse_into(&mut target.get().index.lock(), &handle, Some("irpa"))
            .py_context("Could not parse parameter file index")?;
        Ok(target)
    }

    #[pyo3(signature = (*, scope = "", max_concurrent_operations = None))]
    fn create_provider(
        &self,
        scope: &str,
        max_concurrent_operations: Option<u64>,
    ) -> PyParameterProvider {
        // Each request runs as one queue operation, so there is no
        // concurrency limit to configure.
        let _ = max_concurrent_operations;
        PyParameterProvider {
            provider: ParameterProvider::new(scope, self.index.lock().clone()),
        }
    }

    fn items(&self) -> Vec<(String, PyParameterIndexEntry)> {
        self.index
            .lock()
            .entries()
            .iter()
            .map(|e| (e.key.clone(), PyParameterIndexEntry { entry: e.clone() }))
            .collect()
    }

    fn __repr__(&self) -> String {
        table(&self.index.lock())
    }

    fn __str__(&self) -> String {
        table(&self.index.lock())
    }
}

#[pyclass(name = "ParameterProvider", module = "ferrite._ferrite", frozen)]
pub struct PyParameterProvider {
    provider: ParameterProvider,
}

/// Creates the `io_parameters` module serving `providers` (the first that
/// answers for a request's scope serves it).
#[pyfunction]
#[pyo3(signature = (instance, *providers))]
fn create_io_parameters_module(
    instance: &PyVmInstance,
    providers: &Bound<'_, PyTuple>,
) -> PyResult<PyVmModule> {
    ferrite_hal_module::register_types(instance.instance.types());
    let list = providers
        .iter()
        .map(|p| {
            p.downcast::<PyParameterProvider>()
                .map(|p| p.get().provider.clone())
                .map_err(|_| {
                    PyValueError::new_err(format!(
                        "expected ParameterProvider, got {}",
                        p.get_type()
                            .name()
                            .map(|n| n.to_string())
                            .unwrap_or_default()
                    ))
                })
        })
        .collect::<PyResult<Vec<_>>>()?;
    let module = create_module(list).py_context("Could not create io_parameters module")?;
    Ok(PyVmModule::new(module))
}
