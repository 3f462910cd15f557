//! Helpers of the HAL suite: compiling our own programs under `tests/hal/`
//! with the pinned IREE compiler at test time, pulling a CPU executable and
//! its dispatch's workgroup count out of a compiled module, and small buffer
//! utilities.
#![allow(dead_code)]

#[path = "../executable_support/mod.rs"]
mod support;

// Not every test binary uses both.
use ferrite_hal::allocator::BufferParams;
use ferrite_hal::buffer::Buffer;
use ferrite_hal::command_buffer::{BufferRef, CommandBuffer};
use ferrite_hal::device::Device;
use ferrite_hal::executable::ExecutableRef;
use ferrite_hal::memory::{BufferUsage, MemoryType};
use std::path::PathBuf;
use std::sync::Arc;
#[allow(unused_imports)]
pub use support::{tool, workspace_root};

/// Compiles `tests/hal/<name>.mlir` (once per source change) and returns the
/// `.vmfb` path. `vm_dialect` programs are compiled with
/// `--compile-mode=vm`; the others for the local llvm-cpu target with a
/// portable (generic x86-64) CPU.
pub fn compile(name: &str, vm_dialect: bool) -> PathBuf {
    let src = workspace_root()
        .join("tests/hal")
        .join(format!("{name}.mlir"));
    let flags: &[&str] = if vm_dialect {
        &["--compile-mode=vm"]
    } else {
        &[]
    };
    support::compile_file(&src, "hal-suite", flags)
}

/// The CPU executable of a compiled one-dispatch program.
pub struct Executable {
    /// Format string from the module's rodata (`embedded-elf-x86_64`).
    pub format: String,
    /// The executable bytes (the ELF rodata segment).
    pub data: Vec<u8>,
    /// Workgroup counts of the program's dispatch, read from the disassembly.
    pub workgroups: [u32; 3],
}

/// Compiles `name` and extracts its executable and dispatch workgroup count.
pub fn executable(name: &str) -> Executable {
    let vmfb = compile(name, false);
    let (_, data, format) = support::module_executable(&vmfb);
    Executable {
        format,
        data,
        workgroups: support::static_workgroup_count(&vmfb),
    }
}

pub use ferrite_testkit::f32_bytes;

/// A device-local buffer of `dev` holding `values`.
pub fn buffer(dev: &Arc<dyn Device>, values: &[f32]) -> Buffer {
    let params = BufferParams::new(MemoryType::DEVICE_LOCAL, BufferUsage::DEFAULT);
    let b = dev
        .allocator()
        .allocate(&params, (values.len() * 4) as u64)
        .unwrap();
    b.write(0, &f32_bytes(values)).unwrap();
    b
}

/// All of `b`, as a direct binding.
pub fn whole(b: &Buffer) -> BufferRef {
    BufferRef::Direct {
        buffer: b.clone(),
        offset: 0,
        length: b.byte_length(),
    }
}

/// A command buffer of one dispatch of `name` (an elementwise add of two
/// `n`-element buffers: 0, 1, 2, ... and 10.0 each) and its output buffer,
/// with the dispatch's workgroup count.
pub fn add_program(
    dev: &Arc<dyn Device>,
    name: &str,
    n: usize,
) -> (CommandBuffer, Buffer, [u32; 3]) {
    let exe = executable(name);
    let loaded = dev.create_executable(&exe.format, &exe.data, &[]).unwrap();
    let a: Vec<f32> = (0..n).map(|i| i as f32).collect();
    let (a, b, out) = (
        buffer(dev, &a),
        buffer(dev, &vec![10.0; n]),
        buffer(dev, &vec![0.0; n]),
    );
    let cb = CommandBuffer::new(0, 3, u64::MAX, 0);
    cb.dispatch(
        ExecutableRef(loaded),
        0,
        exe.workgroups,
        None,
        vec![],
        vec![whole(&a), whole(&b), whole(&out)],
    )
    .unwrap();
    cb.finalize().unwrap();
    (cb, out, exe.workgroups)
}

/// Little-endian bytes as f32 values.
pub fn bytes_f32(b: &[u8]) -> Vec<f32> {
    b.chunks_exact(4)
        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect()
}

/// Little-endian bytes as u32 values.
pub fn bytes_u32(b: &[u8]) -> Vec<u32> {
    b.chunks_exact(4)
        .map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect()
}
