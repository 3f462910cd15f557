//! Shared helpers of the crate's tests: compiling MLIR programs with the
//! pinned `iree-compile`, pulling the executable out of the module with
//! Ferrite's archive reader, and reading the workgroup counts the compiled
//! host code dispatches with (from `iree-dump-module`). `tests/common`
//! (the HAL suite's helpers) builds on this module.
#![allow(dead_code)]

use ferrite_testkit::GENERIC_CPU;
use ferrite_vm::bytecode::archive::Archive;
use ferrite_vm::ModuleBytes;
use std::path::{Path, PathBuf};
use std::process::Command;

// Not every test binary uses both.
#[allow(unused_imports)]
pub use ferrite_testkit::{venv_tool as tool, workspace_root};

/// Compiles `tests/data/<name>.mlir` for the local llvm-cpu target (generic
/// x86-64), once per source change, and returns the `.vmfb` path.
pub fn compile(name: &str) -> PathBuf {
    let src = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/data")
        .join(format!("{name}.mlir"));
    compile_file(&src, "hal-cpu-fixtures", &[])
}

/// Compiles `src` with the pinned compiler into `<target tmp>/<out_dir>/`,
/// once per source change. Without `flags`, it builds for the local llvm-cpu
/// target with a portable (generic x86-64) CPU.
pub fn compile_file(src: &Path, out_dir: &str, flags: &[&str]) -> PathBuf {
    let stem = src.file_stem().expect("source file name").to_string_lossy();
    let out = ferrite_testkit::target_tmpdir!(out_dir).join(format!("{stem}.vmfb"));
    let flags = if flags.is_empty() { GENERIC_CPU } else { flags };
    ferrite_testkit::compile_file(src, &out, flags)
}

/// Every rodata segment of `vmfb`, its ELF executable and format string.
pub fn module_executable(vmfb: &Path) -> (Vec<Vec<u8>>, Vec<u8>, String) {
    let bytes = ModuleBytes::read_file(vmfb).expect("read module");
    let archive = Archive::parse(bytes).expect("parse module");
    let rodata: Vec<Vec<u8>> = (0..archive.rodata_segments().len())
        .map(|i| archive.rodata(i).expect("rodata").to_vec())
        .collect();
    let executable = rodata
        .iter()
        .find(|r| r.starts_with(b"\x7fELF"))
        .expect("module holds no ELF executable")
        .clone();
    let format = rodata
        .iter()
        .filter_map(|r| std::str::from_utf8(r).ok())
        .find(|s| s.starts_with("embedded-elf-"))
        .expect("module names no embedded-elf format")
        .to_string();
    (rodata, executable, format)
}

/// A compiled module's CPU executable.
pub struct Fixture {
    /// The module path.
    pub vmfb: PathBuf,
    /// The executable data (the rodata segment holding the ELF).
    pub executable: Vec<u8>,
    /// The executable format named in the module's rodata.
    pub format: String,
    /// Every rodata segment's bytes.
    pub rodata: Vec<Vec<u8>>,
}

/// Compiles `name` and extracts its executable.
pub fn fixture(name: &str) -> Fixture {
    let vmfb = compile(name);
    let (rodata, executable, format) = module_executable(&vmfb);
    Fixture {
        vmfb,
        executable,
        format,
        rodata,
    }
}

/// The constant workgroup counts of every `hal.command_buffer.dispatch` in the
/// module, in program order (`None` for a count held in a register that is not
/// a constant, i.e. computed at run time).
pub fn dispatch_workgroup_counts(vmfb: &Path) -> Vec<[Option<u32>; 3]> {
    let output = Command::new(tool("iree-dump-module"))
        .arg(vmfb)
        .output()
        .expect("run iree-dump-module");
    assert!(output.status.success(), "iree-dump-module failed");
    let text = String::from_utf8_lossy(&output.stdout);
    let lines: Vec<&str> = text.lines().collect();
    let mut counts = Vec::new();
    for (n, line) in lines.iter().enumerate() {
        let Some(pos) = line.find("@hal.command_buffer.dispatch segments") else {
            continue;
        };
        let args_start = line[pos..]
            .find("](")
            .map(|p| pos + p + 2)
            .expect("dispatch args");
        let args: Vec<&str> = line[args_start..]
            .trim_end_matches(')')
            .split(", ")
            .collect();
        let resolve = |reg: &str| -> Option<u32> {
            let reg = reg.trim_start_matches('%').trim_start_matches('i');
            let reg = format!("%i{reg}");
            for prev in lines[..n].iter().rev() {
                let t = prev.trim();
                if t.starts_with("vm.func") {
                    return None;
                }
                if let Some(rest) = t.strip_prefix(&format!("{reg} = ")) {
                    if rest.starts_with("vm.const.i32.zero") {
                        return Some(0);
                    }
                    if let Some(v) = rest.strip_prefix("vm.const.i32 ") {
                        return v
                            .split_whitespace()
                            .next()?
                            .parse::<i64>()
                            .ok()
                            .map(|v| v as u32);
                    }
                    return None;
                }
            }
            None
        };
        counts.push([resolve(args[3]), resolve(args[4]), resolve(args[5])]);
    }
    counts
}

/// The single static workgroup count of a one-dispatch module.
pub fn static_workgroup_count(vmfb: &Path) -> [u32; 3] {
    let counts = dispatch_workgroup_counts(vmfb);
    assert_eq!(counts.len(), 1, "expected one dispatch, found {counts:?}");
    counts[0].map(|c| c.expect("workgroup count is not a constant"))
}

/// Deterministic pseudo-random f32 values in [-1, 1).
pub fn values(n: usize, seed: u32) -> Vec<f32> {
    let mut s = seed.wrapping_mul(2_654_435_761).wrapping_add(1);
    (0..n)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 17;
            s ^= s << 5;
            (s >> 8) as f32 / (1u32 << 23) as f32 - 1.0
        })
        .collect()
}

/// `(ptr, len)` binding of a mutable f32 slice.
pub fn binding(v: &mut [f32]) -> (*mut u8, usize) {
    (v.as_mut_ptr().cast(), std::mem::size_of_val(v))
}
