//! HAL objects: drivers, devices, allocators, buffers, buffer views and
//! mapped memory; `create_hal_module`.

use crate::command_buffer::PyHalCommandBuffer;
use crate::debug_sink::PyHalModuleDebugSink;
use crate::fence::{fence_of, PyHalFence};
use crate::host_buffer::{fill_byte_view, HostBuffer};
use crate::host_data::{buffer_from_export, HostArray, Placement};
use crate::semaphore::PyHalSemaphore;
use crate::status::PyContext;
use crate::vm::{int_of, PyVmInstance, PyVmModule, PyVmRef};
use ferrite::driver::{self, DeviceInfo, DeviceSpec, Driver};
use ferrite_hal::allocator::{Allocator, BufferParams};
use ferrite_hal::buffer::{Buffer, HostMapping, WHOLE_BUFFER};
use ferrite_hal::buffer_view::BufferView;
use ferrite_hal::device::{queue, DeviceRef};
use ferrite_hal::element_type::{ElementType, EncodingType};
use ferrite_hal::memory::{BufferUsage, MemoryAccess, MemoryType};
use ferrite_hal::semaphore::Semaphore;
use ferrite_hal_cpu::CpuDevice;
use ferrite_hal_module::HalModuleOptions;
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
    m.add_class::<PyHalSemaphore>()?;
    m.add_class::<crate::external_timepoint::PyHalExternalTimepoint>()?;
    m.add_class::<PyHalFence>()?;
    m.add_class::<PyHalCommandBuffer>()?;
    m.add_class::<PyHalModuleDebugSink>()?;
    m.add_class::<crate::loop_bridge::PyHalDeviceLoopBridge>()?;
    m.add_function(wrap_pyfunction!(create_hal_module, m)?)?;
    m.add_function(wrap_pyfunction!(element_type_is_byte_aligned, m)?)?;
    m.add_function(wrap_pyfunction!(element_type_dense_byte_count, m)?)?;
    Ok(())
}

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

/// A HAL driver of the registry (`ferrite::driver`): a factory of devices.
#[pyclass(name = "HalDriver", module = "ferrite._ferrite", frozen)]
pub struct PyHalDriver {
    driver: &'static dyn Driver,
}

impl PyHalDriver {
    /// Creates the device `spec` names with the flags set so far.
    fn create_from_spec(
        &self,
        spec: &DeviceSpec,
        allocators: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<PyHalDevice> {
        check_allocators(allocators)?;
        let options = crate::flags::driver_options().py_context("Error configuring the device")?;
        let device = self
            .driver
            .create(spec, &options)
            .map_err(|e| e.annotate(format!("creating device '{}'", spec.uri)))
            .py_context("Error creating device")?;
        Ok(PyHalDevice { device })
    }

    fn devices(&self) -> PyResult<Vec<DeviceInfo>> {
        let options = crate::flags::driver_options().py_context("Error configuring the device")?;
        self.driver
            .enumerate(&options)
            .py_context("Error enumerating devices")
    }
}

#[pymethods]
impl PyHalDriver {
    #[staticmethod]
    fn query() -> Vec<&'static str> {
        driver::available_drivers()
    }

    /// Creates the driver named by `device_uri` (`local-task`, `local-task://`).
    #[staticmethod]
    fn create(device_uri: &str) -> PyResult<Self> {
        let name = device_uri.split("://").next().unwrap_or(device_uri);
        let name = name.split('?').next().unwrap_or(name);
        match driver::DRIVERS.iter().find(|d| d.name() == name) {
            Some(d) => Ok(PyHalDriver { driver: *d }),
            None => Err(PyValueError::new_err(format!(
                "Error creating driver: NOT_FOUND; no driver '{name}' registered"
            ))),
        }
    }

    #[getter]
    fn name(&self) -> &str {
        self.driver.name()
    }

    #[pyo3(signature = (allocators = None))]
    fn create_default_device(
        &self,
        allocators: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<PyHalDevice> {
        let spec = DeviceSpec::parse(self.driver.name()).py_context("Error creating device")?;
        self.create_from_spec(&spec, allocators)
    }

    /// Creates device `device_id` (or the `device_id` of an info dict from
    /// `query_available_devices`).
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
        let devices = self.devices()?;
        let Some(info) = devices.iter().find(|d| d.device_id as i64 == id) else {
            let available = devices
                .iter()
                .map(|d| {
                    format!(
                        "{{'device_id': {}, 'path': '{}', 'name': '{}'}}",
                        d.device_id, d.path, d.name
                    )
                })
                .collect::<Vec<_>>()
                .join(", ");
            return Err(PyValueError::new_err(format!(
                "Device id {id} not found. Available devices: [{available}]"
            )));
        };
        let uri = format!("{}://{}", self.driver.name(), info.path);
        let spec = DeviceSpec::parse(&uri).py_context("Error creating device")?;
        self.create_from_spec(&spec, allocators)
    }

    #[pyo3(signature = (device_uri, allocators = None))]
    fn create_device_by_uri(
        &self,
        device_uri: &str,
        allocators: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<PyHalDevice> {
        let d = PyHalDriver::create(device_uri)?;
        let spec = DeviceSpec::parse(device_uri).py_context("Error creating device")?;
        d.create_from_spec(&spec, allocators)
    }

    /// A text description of device `device_id` (see
    /// `query_available_devices`): driver, device, executable formats and,
    /// for `local-task`, the worker count.
    fn dump_device_info(&self, device_id: i64) -> PyResult<String> {
        let devices = self.devices()?;
        let Some(info) = devices.iter().find(|d| d.device_id as i64 == device_id) else {
            return Err(PyValueError::new_err(format!(
                "Querying device info: NOT_FOUND; driver '{}' has no device with id {device_id} \
                 (available: {})",
                self.driver.name(),
                devices
                    .iter()
                    .map(|d| d.device_id.to_string())
                    .collect::<Vec<_>>()
                    .join(", ")
            )));
        };
        let uri = format!("{}://{}", self.driver.name(), info.path);
        let spec = DeviceSpec::parse(&uri).py_context("Error creating device")?;
        let device = self.create_from_spec(&spec, None)?;
        let mut out = format!(
            "- driver: {}\n- device {}: {}\n",
            self.driver.name(),
            info.device_id,
            info.name
        );
        if let Some(cpu) = device.device.0.as_any().downcast_ref::<CpuDevice>() {
            out.push_str(&format!("- workers: {}\n", cpu.worker_count()));
            out.push_str("- executable formats: embedded-elf-x86_64, system-elf-x86_64\n");
        }
        Ok(out)
    }

    fn query_available_devices(&self, py: Python<'_>) -> PyResult<Vec<PyObject>> {
        self.devices()?
            .into_iter()
            .map(|info| {
                let d = pyo3::types::PyDict::new(py);
                d.set_item("device_id", info.device_id)?;
                d.set_item("path", info.path)?;
                d.set_item("name", info.name)?;
                Ok(d.into_any().unbind())
            })
            .collect()
    }
}

/// A HAL device.
#[pyclass(name = "HalDevice", module = "ferrite._ferrite", frozen)]
pub struct PyHalDevice {
    pub device: DeviceRef,
}

impl PyHalDevice {
    fn no_external_capture(&self, context: &str) -> PyResult<()> {
        Err::<(), _>(ferrite_base::Status::new(
            ferrite_base::StatusCode::Unimplemented,
            format!("{} external capture not implemented", self.device.0.id()),
        ))
        .py_context(context)
    }
}

#[pymethods]
impl PyHalDevice {
    #[getter]
    fn allocator(&self) -> PyHalAllocator {
        PyHalAllocator {
            allocator: self.device.0.allocator(),
        }
    }

    fn create_semaphore(&self, initial_value: &Bound<'_, PyAny>) -> PyResult<PyHalSemaphore> {
        let initial_value: u64 = crate::args::uint(initial_value, "initial_value")?;
        Ok(PyHalSemaphore {
            semaphore: Semaphore::new(initial_value),
        })
    }

    /// A device-local buffer usable once `signal_semaphores` is reached.
    fn queue_alloca(
        &self,
        py: Python<'_>,
        allocation_size: u64,
        wait_semaphores: &Bound<'_, PyAny>,
        signal_semaphores: &Bound<'_, PyAny>,
    ) -> PyResult<PyHalBuffer> {
        let wait = fence_of(wait_semaphores, "wait_semaphores")?;
        let signal = fence_of(signal_semaphores, "signal_semaphores")?;
        let params = BufferParams::new(MemoryType::DEVICE_LOCAL, BufferUsage::empty());
        let device = &self.device.0;
        let buffer = py
            .allow_threads(|| queue::alloca(device, &wait, &signal, &params, allocation_size))
            .py_context("allocating memory on queue")?;
        Ok(PyHalBuffer {
            buffer: Arc::new(buffer),
        })
    }

    fn queue_dealloca(
        &self,
        py: Python<'_>,
        buffer: &PyHalBuffer,
        wait_semaphores: &Bound<'_, PyAny>,
        signal_semaphores: &Bound<'_, PyAny>,
    ) -> PyResult<()> {
        let wait = fence_of(wait_semaphores, "wait_semaphores")?;
        let signal = fence_of(signal_semaphores, "signal_semaphores")?;
        let buffer = (*buffer.buffer).clone();
        let device = &self.device.0;
        py.allow_threads(|| queue::dealloca(device, &wait, &signal, buffer))
            .py_context("deallocating memory on queue")
    }

    /// Runs an ended command buffer once the wait list is reached.
    fn queue_execute(
        &self,
        py: Python<'_>,
        command_buffers: &PyHalCommandBuffer,
        wait_semaphores: &Bound<'_, PyAny>,
        signal_semaphores: &Bound<'_, PyAny>,
    ) -> PyResult<()> {
        let wait = fence_of(wait_semaphores, "wait_semaphores")?;
        let signal = fence_of(signal_semaphores, "signal_semaphores")?;
        let cb = command_buffers.command_buffer.clone();
        if cb.commands().is_err() {
            return Err(pyo3::exceptions::PyRuntimeError::new_err(
                "executing command buffers: FAILED_PRECONDITION; command buffer recording has not \
                 been ended and it is still in a recording state",
            ));
        }
        let device = &self.device.0;
        py.allow_threads(|| queue::execute(device, &wait, &signal, Some(&cb), Vec::new()))
            .py_context("executing command buffers")
    }

    /// Copies the whole source buffer to the start of the target.
    fn queue_copy(
        &self,
        py: Python<'_>,
        source_buffer: &PyHalBuffer,
        target_buffer: &PyHalBuffer,
        wait_semaphores: &Bound<'_, PyAny>,
        signal_semaphores: &Bound<'_, PyAny>,
    ) -> PyResult<()> {
        let wait = fence_of(wait_semaphores, "wait_semaphores")?;
        let signal = fence_of(signal_semaphores, "signal_semaphores")?;
        let length = source_buffer.buffer.byte_length();
        if length > target_buffer.buffer.byte_length() {
            return Err(PyValueError::new_err(
                "Source and buffer length must be less than the target buffer length and it \
                 does not. Please check allocations",
            ));
        }
        let (source, target) = (
            (*source_buffer.buffer).clone(),
            (*target_buffer.buffer).clone(),
        );
        let device = &self.device.0;
        py.allow_threads(|| queue::copy(device, &wait, &signal, source, 0, target, 0, length))
            .py_context("Copying buffer on queue")
    }

    /// Starts a profiling capture. Without arguments nothing is recorded
    /// (as upstream's devices without a profile sink). With `mode`
    /// (upstream's data families, comma-separated) and `file_path`
    /// (Ferrite's), the process's work is recorded until `end_profiling`,
    /// which writes an `.ireeprof` bundle in upstream 3.13's format there;
    /// a `mode` alone needs a sink, which upstream's bindings do not expose
    /// (upstream's message).
    #[pyo3(signature = (mode = None, file_path = None))]
    fn begin_profiling(
        &self,
        mode: Option<&str>,
        file_path: Option<std::path::PathBuf>,
    ) -> PyResult<()> {
        match (mode, file_path) {
            (None, None) => Ok(()),
            (Some(mode), Some(path)) => {
                let families = ferrite_tooling::ireeprof::Families::parse(mode)
                    .py_context("Error starting profiling")?;
                let mut pending = PROFILING.lock();
                if pending.is_some() {
                    return Err(PyValueError::new_err(
                        "a profiling capture is already running",
                    ));
                }
                ferrite_base::trace::start().py_context("Error starting profiling")?;
                *pending = Some((path, families));
                Ok(())
            }
            (Some(_), None) => Err(PyValueError::new_err(
                "Python HAL native profiling requires a profile sink and is not exposed by the \
                 runtime bindings (Ferrite: pass file_path= to write an .ireeprof bundle)",
            )),
            (None, Some(_)) => Err(PyValueError::new_err(
                "begin_profiling(file_path=...) needs a mode, e.g. 'queue-events,host-execution'",
            )),
        }
    }

    fn flush_profiling(&self) {}

    /// Starts a capture by an external tool (RenderDoc, Nsight...): none
    /// applies to the CPU devices, so UNIMPLEMENTED, as upstream's.
    #[pyo3(signature = (provider, file_path = None, label = None))]
    fn begin_external_capture(
        &self,
        provider: &str,
        file_path: Option<&str>,
        label: Option<&str>,
    ) -> PyResult<()> {
        let _ = (provider, file_path, label);
        self.no_external_capture("starting external device capture")
    }

    /// Ends an external capture (see `begin_external_capture`).
    fn end_external_capture(&self) -> PyResult<()> {
        self.no_external_capture("ending external device capture")
    }

    /// A legacy (`dltensor`) DLPack capsule of `buffer_view`, labelled with
    /// the given DLPack device, as upstream's: `data` is the device address
    /// for CUDA device memory, the host address for host memory.
    fn create_dlpack_capsule(
        &self,
        py: Python<'_>,
        buffer_view: &PyHalBufferView,
        device_type_code: i32,
        device_id: i32,
    ) -> PyResult<PyObject> {
        crate::dlpack::export_capsule(py, &buffer_view.view, device_type_code, device_id)
    }

    /// Imports a DLPack capsule (`dltensor` or `dltensor_versioned`), or
    /// any object with `__dlpack__`, as a buffer view: zero-copy when dense
    /// row-major, copied when strided (host memory) or refused (CUDA
    /// memory). `kDLCUDA` tensors import only on the CUDA device of their
    /// ordinal.
    #[allow(clippy::wrong_self_convention)] // upstream's method name
    fn from_dlpack_capsule(
        &self,
        py: Python<'_>,
        capsule: &Bound<'_, PyAny>,
    ) -> PyResult<PyHalBufferView> {
        let view = crate::dlpack::import(py, &self.device.0, capsule)?;
        Ok(PyHalBufferView {
            view: Arc::new(view),
        })
    }

    /// Ends the capture `begin_profiling(mode, file_path)` started and
    /// writes its bundle (nothing when none is running).
    fn end_profiling(&self) -> PyResult<()> {
        let Some((path, families)) = PROFILING.lock().take() else {
            return Ok(());
        };
        let Some(trace) = ferrite_base::trace::stop() else {
            return Ok(());
        };
        std::fs::write(&path, ferrite_tooling::ireeprof::bundle(&trace, families)).map_err(|e| {
            pyo3::exceptions::PyOSError::new_err(format!(
                "writing profile bundle '{}': {e}",
                path.display()
            ))
        })
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
        allocation_size: &Bound<'_, PyAny>,
    ) -> PyResult<PyHalBuffer> {
        let allocation_size: u64 = crate::args::uint(allocation_size, "allocation_size")?;
        let p = params(memory_type, allowed_usage)?;
        let buffer = self
            .allocator
            .allocate(&p, allocation_size)
            .py_context("could not allocate buffer")?;
        Ok(PyHalBuffer {
            buffer: Arc::new(buffer),
        })
    }

    /// Wraps a writable, C-contiguous buffer-protocol object's memory as a
    /// HAL buffer without copying; the object stays exported (and alive)
    /// until the buffer is freed. Host writes to it while a device reads or
    /// writes it race, as for any mapped memory.
    fn import_host_allocation(
        &self,
        buffer_obj: &Bound<'_, PyAny>,
        memory_type: &Bound<'_, PyAny>,
        allowed_usage: &Bound<'_, PyAny>,
    ) -> PyResult<PyHalBuffer> {
        let p = params(memory_type, allowed_usage)?;
        let host = HostBuffer::get_writable(buffer_obj)?;
        let buffer = buffer_from_export(&*self.allocator, &p, host, Placement::Import)?;
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
        let host = HostBuffer::get_reinterpreting(buffer)?.0;
        let Some(et) = element_type else {
            let buffer = buffer_from_export(&*self.allocator, &p, host, Placement::Copy)?;
            return Ok(Py::new(
                py,
                PyHalBuffer {
                    buffer: Arc::new(buffer),
                },
            )?
            .into_any());
        };
        let array = HostArray {
            shape: host.shape(),
            host,
            element_type: ElementType(int_of::<u32>(et)?),
        };
        let view = array.into_view(&*self.allocator, &p, Placement::Copy)?;
        Ok(Py::new(
            py,
            PyHalBufferView {
                view: Arc::new(view),
            },
        )?
        .into_any())
    }

    /// A transfer buffer holding a copy of `initial_contents` (a
    /// C-contiguous buffer-protocol object).
    fn allocate_host_staging_buffer_copy(
        &self,
        device: &Bound<'_, PyAny>,
        initial_contents: &Bound<'_, PyAny>,
    ) -> PyResult<PyHalBuffer> {
        let _ = device;
        let host = HostBuffer::get(initial_contents)?;
        let p = BufferParams::new(
            MemoryType::OPTIMAL | MemoryType::DEVICE_LOCAL,
            BufferUsage::TRANSFER,
        );
        let buffer = buffer_from_export(&*self.allocator, &p, host, Placement::Copy)?;
        Ok(PyHalBuffer {
            buffer: Arc::new(buffer),
        })
    }

    /// The `BufferCompatibility` bits of buffers of these parameters, used
    /// as `intended_usage` (restricted to `allowed_usage`).
    fn query_buffer_compatibility(
        &self,
        memory_type: &Bound<'_, PyAny>,
        allowed_usage: &Bound<'_, PyAny>,
        intended_usage: &Bound<'_, PyAny>,
        allocation_size: u64,
    ) -> PyResult<u32> {
        let mt = MemoryType::from_bits_truncate(int_of::<u32>(memory_type)?);
        let usage = int_of::<u32>(allowed_usage)? & int_of::<u32>(intended_usage)?;
        let p = BufferParams::new(mt, BufferUsage::from_bits_truncate(usage));
        Ok(self
            .allocator
            .query_compatibility(&p, allocation_size)
            .0
            .bits())
    }

    #[getter]
    fn statistics<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, pyo3::types::PyDict>> {
        let s = self.allocator.statistics();
        let d = pyo3::types::PyDict::new(py);
        d.set_item("host_bytes_peak", s.host_bytes_peak)?;
        d.set_item("host_bytes_allocated", s.host_bytes_allocated)?;
        d.set_item("host_bytes_freed", s.host_bytes_freed)?;
        d.set_item("device_bytes_peak", s.device_bytes_peak)?;
        d.set_item("device_bytes_allocated", s.device_bytes_allocated)?;
        d.set_item("device_bytes_freed", s.device_bytes_freed)?;
        Ok(d)
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

/// Maps the whole buffer as an owned host mapping (writable when the
/// buffer allows writes): refused while device work uses it in a
/// conflicting way, and counted by the HAL while the `MappedMemory` lives,
/// so device work submitted meanwhile is refused instead of racing the
/// Python views.
fn map_buffer(b: &Buffer) -> PyResult<PyMappedMemory> {
    let access = if b.host_writable() {
        MemoryAccess::READ | MemoryAccess::WRITE
    } else {
        MemoryAccess::READ
    };
    let mapping = b
        .map_host(0, WHOLE_BUFFER, access)
        .py_context("Could not map memory")?;
    Ok(PyMappedMemory { mapping })
}

/// The bundle a `begin_profiling(mode, file_path)` capture writes at
/// `end_profiling` (one capture per process, as the recorder).
static PROFILING: parking_lot::Mutex<
    Option<(std::path::PathBuf, ferrite_tooling::ireeprof::Families)>,
> = parking_lot::Mutex::new(None);

/// A HAL buffer.
#[pyclass(name = "HalBuffer", module = "ferrite._ferrite", frozen)]
pub struct PyHalBuffer {
    pub buffer: Arc<Buffer>,
}

impl PyHalBuffer {
    /// A dense row-major view of the whole buffer.
    fn view_of(&self, shape: Vec<u64>, et: ElementType) -> PyResult<PyHalBufferView> {
        let view = BufferView::new(
            (*self.buffer).clone(),
            &shape,
            et,
            EncodingType::DENSE_ROW_MAJOR,
        )
        .py_context("creating buffer view")?;
        Ok(PyHalBufferView {
            view: Arc::new(view),
        })
    }
}

/// Dimensions from a `Shape` (its `dims`) or a sequence of ints.
fn shape_arg(shape: &Bound<'_, PyAny>) -> PyResult<Vec<u64>> {
    let py = shape.py();
    let is_shape = shape.get_type().name().is_ok_and(|n| n == "Shape");
    let dims = if is_shape {
        shape.getattr(pyo3::intern!(py, "dims"))?
    } else {
        shape.clone()
    };
    dims.extract::<Vec<u64>>().map_err(|_| {
        pyo3::exceptions::PyTypeError::new_err(format!(
            "shape must be a Shape or a sequence of non-negative ints, not {}",
            shape
                .get_type()
                .name()
                .map(|n| n.to_string())
                .unwrap_or_default()
        ))
    })
}

/// The largest element size in bytes `create_view` takes (as upstream,
/// the element type is the opaque type of `8 * size` bits, which must fit
/// its 8-bit width field); larger ints are element type values.
const MAX_ELEMENT_SIZE: u32 = 31;

/// `create_view`'s element argument: a size in bytes (a plain int of at
/// most [`MAX_ELEMENT_SIZE`], upstream's meaning) or an element type.
fn element_type_arg(arg: &Bound<'_, PyAny>) -> PyResult<ElementType> {
    if arg.is_instance_of::<pyo3::types::PyBool>() {
        return Err(pyo3::exceptions::PyTypeError::new_err(
            "element_size must be an int or a HalElementType, not bool",
        ));
    }
    if arg.is_exact_instance_of::<pyo3::types::PyInt>() {
        let v: u32 = arg.extract()?;
        if (1..=MAX_ELEMENT_SIZE).contains(&v) {
            return Ok(ElementType::new(
                ferrite_hal::element_type::NumericalType::UNKNOWN,
                (v * 8) as u8,
            ));
        }
        if v == 0 {
            return Err(PyValueError::new_err(
                "element_size must be at least 1 byte",
            ));
        }
        return Ok(ElementType(v));
    }
    Ok(ElementType(int_of::<u32>(arg)?))
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

    /// A view of the whole buffer. `shape` is a `Shape` (upstream's
    /// signature) or a sequence of ints. `element_size` is, as upstream, a
    /// size in bytes (1 to 31: an opaque element type of that width); a
    /// `HalElementType` (or its int value, which is larger) names the
    /// element type itself.
    #[pyo3(signature = (shape, element_size))]
    fn create_view(
        &self,
        shape: &Bound<'_, PyAny>,
        element_size: &Bound<'_, PyAny>,
    ) -> PyResult<PyHalBufferView> {
        self.view_of(shape_arg(shape)?, element_type_arg(element_size)?)
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

    /// The buffer a VM ref holds; ValueError when it holds something else.
    #[staticmethod]
    fn __iree_vm_cast__(py: Python<'_>, r#ref: &Bound<'_, PyAny>) -> PyResult<PyObject> {
        crate::vm::vm_cast(py, r#ref, &py.get_type::<PyHalBuffer>())
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
        shape: &Bound<'_, PyAny>,
        element_type: &Bound<'_, PyAny>,
    ) -> PyResult<Self> {
        buffer.view_of(shape_arg(shape)?, ElementType(int_of::<u32>(element_type)?))
    }

    /// DLPack export (protocol 1.0 when `max_version` allows, else
    /// legacy); on CUDA memory `stream` is the consumer's stream, which is
    /// made to wait for the device's pending work (see `dlpack.rs`).
    #[pyo3(signature = (*, stream = None, max_version = None, dl_device = None, copy = None))]
    fn __dlpack__(
        &self,
        py: Python<'_>,
        stream: Option<i64>,
        max_version: Option<(u32, u32)>,
        dl_device: Option<(i32, i32)>,
        copy: Option<bool>,
    ) -> PyResult<PyObject> {
        crate::dlpack::dlpack_of(py, self, stream, max_version, dl_device, copy)
    }

    /// `(kDLCPU, 0)` for host memory, `(kDLCUDA, ordinal)` for CUDA device
    /// memory, `(kDLCUDAHost, 0)` for CUDA pinned memory.
    fn __dlpack_device__(&self) -> (i32, i32) {
        crate::dlpack::dlpack_device(&self.view)
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

    /// The buffer view a VM ref holds; ValueError when it holds something else.
    #[staticmethod]
    fn __iree_vm_cast__(py: Python<'_>, r#ref: &Bound<'_, PyAny>) -> PyResult<PyObject> {
        crate::vm::vm_cast(py, r#ref, &py.get_type::<PyHalBufferView>())
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
            "<HalBufferView ({}), element_type=0x{:08x}, {}>",
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
    mapping: HostMapping,
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
        let count = shape
            .iter()
            .try_fold(1usize, |n, &d| n.checked_mul(d))
            .filter(|&n| n <= isize::MAX as usize)
            .ok_or_else(|| {
                pyo3::exceptions::PyValueError::new_err(format!("shape {shape:?} overflows"))
            })?;
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
        let p = &slf.get().mapping;
        let (ptr, len, writable) = (p.as_ptr(), p.len(), p.is_writable());
        // SAFETY: the mapping is valid for `len` bytes while `slf` lives
        // (it holds the allocation), writable only when mapped so, and
        // device work that would conflict with it is refused while it
        // lives (the HAL counts it); host-to-host ordering is the caller's,
        // as upstream.
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
    debug_sink: Option<Py<PyHalModuleDebugSink>>,
) -> PyResult<PyVmModule> {
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
    ferrite_hal_module::register_types(instance.instance.types());
    let options = HalModuleOptions {
        trace_sink: Some(
            debug_sink
                .map(PyHalModuleDebugSink::trace_sink)
                .unwrap_or_else(ferrite_hal_module::stderr_trace_sink),
        ),
        ..HalModuleOptions::default()
    };
    let module = ferrite_hal_module::create_hal_module(list, options)
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

/// The Python object for a semaphore, fence or command buffer ref.
pub fn sync_object_of(py: Python<'_>, r: &Ref) -> PyResult<Option<PyObject>> {
    if let Some(semaphore) = r.downcast_arc::<Semaphore>() {
        return Ok(Some(Py::new(py, PyHalSemaphore { semaphore })?.into_any()));
    }
    if let Some(fence) = r.downcast_arc::<ferrite_hal::fence::Fence>() {
        return Ok(Some(Py::new(py, PyHalFence::wrap(fence))?.into_any()));
    }
    if let Some(cb) = r.downcast_arc::<ferrite_hal::command_buffer::CommandBuffer>() {
        return Ok(Some(Py::new(py, PyHalCommandBuffer::wrap(cb))?.into_any()));
    }
    Ok(None)
}

/// True when `clazz` is the Python class of `r`'s semaphore, fence or
/// command buffer.
pub fn sync_class_matches(py: Python<'_>, r: &Ref, clazz: &Bound<'_, pyo3::types::PyType>) -> bool {
    (clazz.is(py.get_type::<PyHalSemaphore>()) && r.is::<Semaphore>())
        || (clazz.is(py.get_type::<PyHalFence>()) && r.is::<ferrite_hal::fence::Fence>())
        || (clazz.is(py.get_type::<PyHalCommandBuffer>())
            && r.is::<ferrite_hal::command_buffer::CommandBuffer>())
}

/// The object address of a semaphore, fence or command buffer ref (0 for
/// other types).
pub fn sync_ref_address(r: &Ref) -> usize {
    if let Some(s) = r.downcast::<Semaphore>() {
        return s as *const _ as usize;
    }
    if let Some(f) = r.downcast::<ferrite_hal::fence::Fence>() {
        return f as *const _ as usize;
    }
    if let Some(c) = r.downcast::<ferrite_hal::command_buffer::CommandBuffer>() {
        return c as *const _ as usize;
    }
    0
}
