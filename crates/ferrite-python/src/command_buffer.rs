//! `HalCommandBuffer`: transfers recorded between `begin` and `end`, run by
//! `HalDevice.queue_execute`.

use crate::hal::{PyHalBuffer, PyHalDevice};
use crate::host_buffer::HostBuffer;
use crate::status::PyContext;
use crate::vm::PyVmRef;
use ferrite_base::{Status, StatusCode};
use ferrite_hal::command_buffer::{mode, BufferRef, CommandBuffer};
use ferrite_vm::Ref;
use pyo3::exceptions::{PyRuntimeError, PyValueError};
use pyo3::prelude::*;
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::Arc;

/// Recording states, as upstream's validation layer tracks them.
const INITIAL: u8 = 0;
const RECORDING: u8 = 1;
const ENDED: u8 = 2;

/// Command categories: transfer and dispatch (upstream's `ANY`).
const CATEGORY_ANY: u32 = 1 | 2;

/// A HAL command buffer.
#[pyclass(
    name = "HalCommandBuffer",
    module = "ferrite._ferrite",
    frozen,
    weakref
)]
pub struct PyHalCommandBuffer {
    pub command_buffer: Arc<CommandBuffer>,
    state: AtomicU8,
}

impl PyHalCommandBuffer {
    /// Wraps a command buffer made elsewhere (e.g. returned by a program):
    /// ended once finalized, recording until then.
    pub fn wrap(command_buffer: Arc<CommandBuffer>) -> Self {
        let state = if command_buffer.commands().is_ok() {
            ENDED
        } else {
            RECORDING
        };
        PyHalCommandBuffer {
            command_buffer,
            state: AtomicU8::new(state),
        }
    }

    fn check_recording(&self, context: &str) -> PyResult<()> {
        if self.state.load(Ordering::Acquire) != RECORDING {
            return Err(PyRuntimeError::new_err(format!(
                "{context}: FAILED_PRECONDITION; command buffer is not in a recording state; \
                 all recording must happen between a begin/end pair"
            )));
        }
        Ok(())
    }

    fn end_recording(&self) -> PyResult<()> {
        if self
            .state
            .compare_exchange(RECORDING, ENDED, Ordering::AcqRel, Ordering::Acquire)
            .is_err()
        {
            return Err(PyRuntimeError::new_err(
                "command buffer end: FAILED_PRECONDITION; command buffer is not in a recording state",
            ));
        }
        self.command_buffer
            .finalize()
            .py_context("command buffer end")
    }
}

fn whole(buffer: &PyHalBuffer, offset: u64, length: u64) -> BufferRef {
    BufferRef::Direct {
        buffer: (*buffer.buffer).clone(),
        offset,
        length,
    }
}

#[pymethods]
impl PyHalCommandBuffer {
    #[new]
    #[pyo3(signature = (device, binding_capacity = 0, begin = true))]
    fn new(device: &PyHalDevice, binding_capacity: u32, begin: bool) -> Self {
        let _ = device;
        let command_buffer = Arc::new(CommandBuffer::new(
            mode::ONE_SHOT,
            CATEGORY_ANY,
            u64::MAX,
            binding_capacity,
        ));
        PyHalCommandBuffer {
            command_buffer,
            state: AtomicU8::new(if begin { RECORDING } else { INITIAL }),
        }
    }

    fn begin(&self) -> PyResult<()> {
        match self
            .state
            .compare_exchange(INITIAL, RECORDING, Ordering::AcqRel, Ordering::Acquire)
        {
            Ok(_) => Ok(()),
            Err(RECORDING) => Err(PyRuntimeError::new_err(
                "command buffer begin: FAILED_PRECONDITION; command buffer is already in a recording state",
            )),
            Err(_) => Err(PyRuntimeError::new_err(
                "command buffer begin: FAILED_PRECONDITION; command buffer has already been recorded; \
                 re-recording command buffers is not allowed",
            )),
        }
    }

    fn end(&self) -> PyResult<()> {
        self.end_recording()
    }

    /// Copies `length` bytes (default: the whole source, which must then be
    /// as long as the target).
    #[pyo3(signature = (source_buffer, target_buffer, source_offset = 0, target_offset = 0, length = None, end = false))]
    fn copy(
        &self,
        source_buffer: &PyHalBuffer,
        target_buffer: &PyHalBuffer,
        source_offset: u64,
        target_offset: u64,
        length: Option<u64>,
        end: bool,
    ) -> PyResult<()> {
        let length = match length {
            Some(l) => l,
            None => {
                let l = source_buffer.buffer.byte_length();
                if l != target_buffer.buffer.byte_length() {
                    return Err(PyValueError::new_err(
                        "If length is not provided, source and target buffer length must match \
                         and it does not. Provide explicit length=",
                    ));
                }
                l
            }
        };
        self.check_recording("copy command")?;
        self.command_buffer
            .copy_buffer(
                whole(source_buffer, source_offset, length),
                whole(target_buffer, target_offset, length),
            )
            .py_context("copy command")?;
        if end {
            self.end_recording()?;
        }
        Ok(())
    }

    /// Fills `length` bytes (default: to the end of the target) with the
    /// bytes of `pattern` (a 1, 2, 4 or 8-byte buffer-protocol object).
    #[pyo3(signature = (target_buffer, pattern, target_offset = 0, length = None, end = false))]
    fn fill(
        &self,
        target_buffer: &PyHalBuffer,
        pattern: &Bound<'_, PyAny>,
        target_offset: u64,
        length: Option<u64>,
        end: bool,
    ) -> PyResult<()> {
        let host = HostBuffer::get(pattern)?;
        let bytes = host.to_vec()?;
        let length = length.unwrap_or(u64::MAX);
        self.check_recording("command buffer fill")?;
        if !matches!(bytes.len(), 1 | 2 | 4 | 8) {
            let s = Status::new(
                StatusCode::InvalidArgument,
                format!(
                    "fill value length is not one of the supported values (pattern_length={})",
                    bytes.len()
                ),
            );
            return Err(crate::status::to_py_err("command buffer fill", &s));
        }
        let mut word = [0u8; 8];
        word[..bytes.len()].copy_from_slice(&bytes);
        self.command_buffer
            .fill_buffer(
                whole(target_buffer, target_offset, length),
                u64::from_le_bytes(word),
                bytes.len() as u32,
            )
            .py_context("command buffer fill")?;
        if end {
            self.end_recording()?;
        }
        Ok(())
    }

    #[getter]
    fn r#ref(&self) -> PyVmRef {
        PyVmRef(Ref::from_arc(self.command_buffer.clone()))
    }

    #[getter]
    fn __iree_vm_ref__(&self) -> PyVmRef {
        self.r#ref()
    }

    fn __eq__(&self, other: &Bound<'_, PyAny>) -> bool {
        match other.downcast::<PyHalCommandBuffer>() {
            Ok(o) => Arc::ptr_eq(&o.get().command_buffer, &self.command_buffer),
            Err(_) => false,
        }
    }

    fn __hash__(&self) -> u64 {
        Arc::as_ptr(&self.command_buffer) as usize as u64
    }

    fn __repr__(&self) -> String {
        format!("<HalCommandBuffer {:?}>", self.command_buffer)
    }
}
