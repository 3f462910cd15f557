//! HAL objects: drivers, devices, allocators, buffers, buffer views and
//! mapped memory; `create_hal_module`.

use crate::host_buffer::{fill_byte_view, HostBuffer};
use crate::status::PyContext;
use crate::vm::{int_of, PyVmInstance, PyVmModule, PyVmRef};
use ferrite_hal::allocator::{Allocator, BufferParams};
use ferrite_hal::buffer::{BindingPtr, Buffer, WHOLE_BUFFER};
use ferrite_hal::buffer_view::BufferView;
use ferrite_hal::device::DeviceRef;
use ferrite_hal::element_type::{ElementType, EncodingType};
use ferrite_hal::memory::{BufferUsage, MemoryAccess, MemoryType};
use ferrite_hal::module::HalModuleOptions;
use ferrite_hal_cpu::CpuDevice;
use ferrite_vm::Ref;
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::PyTuple;
use std::os::raw::c_int;
use std::sync::Arc;

pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<PyHalDriver>()?;
    m.add_class::<PyHalDevice>()?;
    m.add_class::<PyHalAllocator>()?;
    m.add_class::<PyHalBuffer>()?;
    m.add_class::<PyHalBufferView>()?;
    m.add_class::<PyMappedMemory>()?;
    m.add_function(wrap_pyfunction!(create_hal_module, m)?)?;
    m.add_function(wrap_pyfunction!(element_type_is_byte_aligned, m)?)?;
    m.add_function(wrap_pyfunction!(element_type_dense_byte_count, m)?)?;
    Ok(())
}

/// The drivers this build offers, in upstream's (sorted) order.
const DRIVERS: &[&str] = &["local-sync", "local-task"];

/// Allocator wrappers upstream's drivers accept by name (`caching` pools,
/// `debug` checks). The CPU devices allocate from the heap and need neither,
/// so these names are accepted and change nothing; others are errors.
const ALLOCATORS: &[&str] = &["caching", "debug"];

fn check_allocators(allocators: Option<&Bound<'_, PyAny>>) -> PyResult<()> {
    let Some(allocators) = allocators else {
        return Ok(());
    };
    for spec in allocators.try_iter()? {
        let spec: String = spec?.extract()?;
        let name = spec.split(':').next().unwrap_or("");
        if !ALLOCATORS.contains(&name) {
            return Err(PyValueError::new_err(format!(
                "Error configuring the device: INVALID_ARGUMENT; unrecognized allocator '{spec}'"
            )));
        }
    }
    Ok(())
}

/// A HAL driver: a factory of devices.
#[pyclass(name = "HalDriver", module = "ferrite._ferrite", frozen)]
pub struct PyHalDriver {
    name: String,
}

#[pymethods]
impl PyHalDriver {
    #[staticmethod]
    fn query() -> Vec<&'static str> {
        DRIVERS.to_vec()
    }

    /// Creates the driver named by `device_uri` (`local-task`, `local-task://`).
    #[staticmethod]
    fn create(device_uri: &str) -> PyResult<Self> {
        let name = device_uri.split("://").next().unwrap_or(device_uri);
        if !DRIVERS.contains(&name) {
            return Err(PyValueError::new_err(format!(
                "Error creating driver: NOT_FOUND; no driver '{name}' registered"
            )));
        }
        Ok(PyHalDriver {
            name: name.to_string(),
        })
    }

    #[getter]
    fn name(&self) -> &str {
        &self.name
    }

    #[pyo3(signature = (allocators = None))]
    fn create_default_device(
        &self,
        allocators: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<PyHalDevice> {
        check_allocators(allocators)?;
        let device = match self.name.as_str() {
            "local-sync" => DeviceRef(CpuDevice::local_sync()),
            _ => DeviceRef(CpuDevice::local_task_with_stack_size(
                crate::flags::local_task_worker_count(),
                crate::flags::local_task_worker_stack_size(),
            )),
        };
        Ok(PyHalDevice { device })
    }

    /// Creates device `device_id` (or the `device_id` of an info dict from
    /// `query_available_devices`); the CPU drivers have one, id 0.
    #[pyo3(signature = (device_id, params = None, allocators = None))]
    fn create_device(
        &self,
        device_id: &Bound<'_, PyAny>,
        params: Option<&Bound<'_, PyAny>>,
        allocators: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<PyHalDevice> {
        let _ = params; // upstream's driver-specific creation parameters; CPU drivers take none
        let id = if let Ok(info) = device_id.downcast::<pyo3::types::PyDict>() {
            info.get_item("device_id")?
                .ok_or_else(|| PyValueError::new_err("device info dict has no 'device_id'"))?
                .extract::<i64>()?
        } else if let Ok(id) = device_id.extract::<i64>() {
            id
        } else {
            return Err(pyo3::exceptions::PyTypeError::new_err(format!(
                "create_device(): device_id must be an int or a device info dict, not {}",
                device_id.get_type().qualname()?
            )));
        };
        if id != 0 {
            return Err(PyValueError::new_err(format!(
                "Device id {id} not found. Available devices: [{{'device_id': 0, 'path': '', 'name': 'default'}}]"
            )));
        }
        self.create_default_device(allocators)
    }

    #[pyo3(signature = (device_uri, allocators = None))]
    fn create_device_by_uri(
        &self,
        device_uri: &str,
        allocators: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<PyHalDevice> {
        let d = PyHalDriver::create(device_uri)?;
        // `driver://path?params`: the CPU drivers have one device, no paths.
        if let Some((_, path)) = device_uri.split_once("://") {
            if !path.is_empty() {
                return Err(PyValueError::new_err(format!(
                    "Error creating device: NOT_FOUND; device paths not yet implemented; \
                     creating device '{device_uri}'"
                )));
            }
        }
        d.create_default_device(allocators)
    }

    fn query_available_devices(&self, py: Python<'_>) -> PyResult<Vec<PyObject>> {
        let d = pyo3::types::PyDict::new(py);
        d.set_item("device_id", 0)?;
        d.set_item("path", "")?;
        d.set_item("name", "default")?;
        Ok(vec![d.into_any().unbind()])
    }
}

/// A HAL device.
#[pyclass(name = "HalDevice", module = "ferrite._ferrite", frozen)]
pub struct PyHalDevice {
    pub device: DeviceRef,
}

#[pymethods]
impl PyHalDevice {
    #[getter]
    fn allocator(&self) -> PyHalAllocator {
        PyHalAllocator {
            allocator: self.device.0.allocator(),
        }
    }

    fn __repr__(&self) -> String {
        self.device.0.id().to_string()
    }
}

fn params(memory_type: &Bound<'_, PyAny>, usage: &Bound<'_, PyAny>) -> PyResult<BufferParams> {
    let mt = MemoryType::from_bits_truncate(int_of::<u32>(memory_type)?);
    let us = BufferUsage::from_bits_truncate(int_of::<u32>(usage)?);
    Ok(BufferParams::new(mt, us))
}

/// A device's allocator.
#[pyclass(name = "HalAllocator", module = "ferrite._ferrite", frozen)]
pub struct PyHalAllocator {
    allocator: Arc<dyn Allocator>,
}

#[pymethods]
impl PyHalAllocator {
    fn allocate_buffer(
        &self,
        memory_type: &Bound<'_, PyAny>,
        allowed_usage: &Bound<'_, PyAny>,
        allocation_size: u64,
    ) -> PyResult<PyHalBuffer> {
        let p = params(memory_type, allowed_usage)?;
        let buffer = self
            .allocator
            .allocate(&p, allocation_size)
            .py_context("could not allocate buffer")?;
        Ok(PyHalBuffer {
            buffer: Arc::new(buffer),
        })
    }

    /// Copies a buffer-protocol object into a new buffer; with an element
    /// type, returns a buffer view shaped like the object.
    #[pyo3(signature = (memory_type, allowed_usage, device, buffer, element_type = None))]
    fn allocate_buffer_copy(
        &self,
        py: Python<'_>,
        memory_type: &Bound<'_, PyAny>,
        allowed_usage: &Bound<'_, PyAny>,
        device: &Bound<'_, PyAny>,
        buffer: &Bound<'_, PyAny>,
        element_type: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<PyObject> {
        let _ = device;
        let p = params(memory_type, allowed_usage)?;
        let host = HostBuffer::get(buffer)?;
        let bytes = host.contiguous_bytes()?;
        let hal_buffer = self
            .allocator
            .allocate(&p, bytes.len() as u64)
            .py_context("Failed to allocate device visible buffer")?;
        hal_buffer
            .write(0, bytes)
            .py_context("Error copying into device buffer")?;
        match element_type {
            None => Ok(Py::new(
                py,
                PyHalBuffer {
                    buffer: Arc::new(hal_buffer),
                },
            )?
            .into_any()),
            Some(et) => {
                let et = ElementType(int_of::<u32>(et)?);
                let view =
                    BufferView::new(hal_buffer, &host.shape(), et, EncodingType::DENSE_ROW_MAJOR)
                        .py_context("Error allocating buffer_view")?;
                Ok(Py::new(
                    py,
                    PyHalBufferView {
                        view: Arc::new(view),
                    },
                )?
                .into_any())
            }
        }
    }

    #[getter]
    fn formatted_statistics(&self) -> String {
        self.allocator.statistics().to_string()
    }

    #[getter]
    fn has_statistics(&self) -> bool {
        true
    }

    fn trim(&self) -> PyResult<()> {
        self.allocator.trim().py_context("Error trimming allocator")
    }
}

fn format_buffer(b: &Buffer) -> String {
    format!(
        "{} bytes (at offset {} into {}), memory_type={}, allowed_access={}, allowed_usage={}",
        b.byte_length(),
        b.byte_offset(),
        b.allocation_size(),
        b.memory_type(),
        b.allowed_access(),
        b.allowed_usage()
    )
}

fn map_buffer(b: &Buffer) -> PyResult<PyMappedMemory> {
    let access = if b.allowed_access().contains(MemoryAccess::WRITE) {
        MemoryAccess::READ | MemoryAccess::WRITE
    } else {
        MemoryAccess::READ
    };
    let ptr = b
        .binding_ptr(0, WHOLE_BUFFER, access)
        .py_context("Could not map memory")?;
    Ok(PyMappedMemory { ptr })
}

/// A HAL buffer.
#[pyclass(name = "HalBuffer", module = "ferrite._ferrite", frozen)]
pub struct PyHalBuffer {
    pub buffer: Arc<Buffer>,
}

#[pymethods]
impl PyHalBuffer {
    fn byte_length(&self) -> u64 {
        self.buffer.byte_length()
    }

    fn memory_type(&self) -> u32 {
        self.buffer.memory_type().bits()
    }

    fn allowed_usage(&self) -> u32 {
        self.buffer.allowed_usage().bits()
    }

    fn fill_zero(&self, byte_offset: u64, byte_length: u64) -> PyResult<()> {
        self.buffer
            .fill(byte_offset, byte_length, &[0])
            .py_context("Error filling buffer")
    }

    fn create_view(
        &self,
        shape: Vec<u64>,
        element_type: &Bound<'_, PyAny>,
    ) -> PyResult<PyHalBufferView> {
        let et = ElementType(int_of::<u32>(element_type)?);
        let view = BufferView::new(
            (*self.buffer).clone(),
            &shape,
            et,
            EncodingType::DENSE_ROW_MAJOR,
        )
        .py_context("Error creating buffer view")?;
        Ok(PyHalBufferView {
            view: Arc::new(view),
        })
    }

    fn map(&self) -> PyResult<PyMappedMemory> {
        map_buffer(&self.buffer)
    }

    #[getter]
    fn r#ref(&self) -> PyVmRef {
        PyVmRef(Ref::from_arc(self.buffer.clone()))
    }

    #[getter]
    fn __iree_vm_ref__(&self) -> PyVmRef {
        self.r#ref()
    }

    fn __repr__(&self) -> String {
        format!("<HalBuffer {}>", format_buffer(&self.buffer))
    }
}

/// A HAL buffer view: a buffer with a shape and an element type.
#[pyclass(name = "HalBufferView", module = "ferrite._ferrite", frozen)]
pub struct PyHalBufferView {
    pub view: Arc<BufferView>,
}

#[pymethods]
impl PyHalBufferView {
    #[new]
    fn new(
        buffer: &PyHalBuffer,
        shape: Vec<u64>,
        element_type: &Bound<'_, PyAny>,
    ) -> PyResult<Self> {
        buffer.create_view(shape, element_type)
    }

    fn get_buffer(&self) -> PyHalBuffer {
        PyHalBuffer {
            buffer: Arc::new(self.view.buffer().clone()),
        }
    }

    fn map(&self) -> PyResult<PyMappedMemory> {
        map_buffer(self.view.buffer())
    }

    #[getter]
    fn shape(&self) -> Vec<u64> {
        self.view.shape().to_vec()
    }

    #[getter]
    fn element_type(&self) -> u32 {
        self.view.element_type().value()
    }

    #[getter]
    fn byte_length(&self) -> u64 {
        self.view.byte_length()
    }

    #[getter]
    fn r#ref(&self) -> PyVmRef {
        PyVmRef(Ref::from_arc(self.view.clone()))
    }

    #[getter]
    fn __iree_vm_ref__(&self) -> PyVmRef {
        self.r#ref()
    }

    fn __eq__(&self, other: &Bound<'_, PyAny>) -> bool {
        match other.downcast::<PyHalBufferView>() {
            Ok(o) => Arc::ptr_eq(&o.get().view, &self.view),
            Err(_) => false,
        }
    }

    fn __repr__(&self) -> String {
        let dims: Vec<String> = self.view.shape().iter().map(|d| d.to_string()).collect();
        format!(
            "<HalBufferView ({}), element_type=0x{:x}, {}>",
            dims.join(", "),
            // Upstream prints the element type with its outer bytes swapped.
            self.view.element_type().value().swap_bytes(),
            format_buffer(self.view.buffer())
        )
    }
}

/// Host-mapped memory of a buffer; `asarray` views it as a numpy array.
#[pyclass(name = "MappedMemory", module = "ferrite._ferrite", frozen)]
pub struct PyMappedMemory {
    ptr: BindingPtr,
}

#[pymethods]
impl PyMappedMemory {
    /// A numpy array viewing the mapped bytes (no copy); it keeps the
    /// mapping, and so the buffer, alive.
    fn asarray<'py>(
        slf: &Bound<'py, Self>,
        shape: Vec<usize>,
        numpy_dtype_descr: &Bound<'py, PyAny>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let py = slf.py();
        let np = py.import("numpy")?;
        let dtype = np.call_method1("dtype", (numpy_dtype_descr,))?;
        let flat = np.call_method1("frombuffer", (slf, &dtype))?;
        let count: usize = shape.iter().product();
        let flat = flat.call_method1(
            "__getitem__",
            (pyo3::types::PySlice::new(py, 0, count as isize, 1),),
        )?;
        flat.call_method1("reshape", (PyTuple::new(py, shape)?,))
    }

    // SAFETY: CPython calls this with a `Py_buffer` to fill for `slf`; the
    // body only hands it to `fill_byte_view` with memory `slf` keeps alive.
    unsafe fn __getbuffer__(
        slf: Bound<'_, Self>,
        view: *mut pyo3::ffi::Py_buffer,
        flags: c_int,
    ) -> PyResult<()> {
        let p = &slf.get().ptr;
        let (ptr, len, writable) = (p.as_ptr(), p.len(), p.is_writable());
        // SAFETY: the binding pointer is valid for `len` bytes while `slf`
        // lives (it holds the allocation), and writable only when the buffer
        // allows writes; host/device ordering is the caller's, as upstream.
        unsafe { fill_byte_view(slf.as_any(), view, flags, ptr, len, !writable) }
    }

    // SAFETY: nothing to release: the view owns a reference to `self`, which
    // keeps the memory alive until CPython drops the view.
    unsafe fn __releasebuffer__(&self, _view: *mut pyo3::ffi::Py_buffer) {}
}

/// Creates the `hal` module serving `device` (or `devices`).
#[pyfunction]
#[pyo3(signature = (instance, device = None, devices = None, debug_sink = None))]
fn create_hal_module(
    instance: &PyVmInstance,
    device: Option<PyRef<'_, PyHalDevice>>,
    devices: Option<Vec<PyRef<'_, PyHalDevice>>>,
    debug_sink: Option<PyObject>,
) -> PyResult<PyVmModule> {
    let _ = debug_sink;
    let list: Vec<DeviceRef> = match (device, devices) {
        (Some(_), Some(_)) => {
            return Err(PyValueError::new_err(
                "\"device\" and \"devices\" are mutually exclusive arguments.",
            ))
        }
        (Some(d), None) => vec![d.device.clone()],
        (None, Some(ds)) => ds.iter().map(|d| d.device.clone()).collect(),
        (None, None) => {
            return Err(PyValueError::new_err(
                "\"device\" or \"devices\" arguments must be specified.",
            ))
        }
    };
    ferrite_hal::module::register_types(instance.instance.types());
    let module = ferrite_hal::module::create_hal_module(list, HalModuleOptions::default())
        .py_context("Error creating hal module")?;
    Ok(PyVmModule::new(module))
}

#[pyfunction]
fn element_type_is_byte_aligned(value: u32) -> bool {
    ElementType(value).is_byte_aligned()
}

#[pyfunction]
fn element_type_dense_byte_count(value: u32) -> usize {
    ElementType(value).element_byte_count()
}
