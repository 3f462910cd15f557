//! Helpers of the HAL suite: compiling our own programs under `tests/hal/`
//! with the pinned IREE compiler at test time, pulling a CPU executable and
//! its dispatch's workgroup count out of a compiled module, and small buffer
//! utilities.
#![allow(dead_code)]

#[path = "../executable_support/mod.rs"]
mod support;

// Not every test binary uses both.
use std::path::PathBuf;
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
