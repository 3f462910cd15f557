//! What every CTS test is given and loads: the [`Harness`] (a device and
//! its executable [`Target`]) and the test executables, compiled or read
//! from `FERRITE_CTS_MODULES`. A file of its own so that the tests name it
//! without naming the crate root, whose `instantiate!` names the tests.

use ferrite_hal::device::Device;
use ferrite_testkit::{venv_tool, workspace_root, GENERIC_CPU};
use ferrite_vm::bytecode::archive::Archive;
use ferrite_vm::ModuleBytes;
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// The executable target a driver loads.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Target {
    /// `embedded-elf-x86_64` (llvm-cpu, generic x86-64).
    Cpu,
    /// `cuda-nvptx-fb` (sm_80).
    Cuda,
}

impl Target {
    /// The file-name tag of modules compiled for this target.
    pub fn tag(self) -> &'static str {
        match self {
            Target::Cpu => "cpu",
            Target::Cuda => "cuda",
        }
    }

    /// The compiler flags for this target.
    pub fn flags(self) -> &'static [&'static str] {
        match self {
            Target::Cpu => GENERIC_CPU,
            Target::Cuda => &["--iree-hal-target-device=cuda", "--iree-cuda-target=sm_80"],
        }
    }
}

/// The programs the suite dispatches (`tests/hal/<name>.mlir`).
pub const MODULES: &[&str] = &["add", "mul"];

/// What every test gets: the device under test and its target.
pub struct Harness {
    /// The device under test.
    pub device: Arc<dyn Device>,
    /// The executable target it loads.
    pub target: Target,
}

/// A compiled one-dispatch program's executable.
pub struct Exe {
    /// The executable format (`embedded-elf-x86_64`, `cuda-nvptx-fb`).
    pub format: String,
    /// The executable bytes (a rodata segment of the module).
    pub data: Vec<u8>,
    /// The workgroup count of the program's one dispatch.
    pub workgroups: [u32; 3],
}

impl Harness {
    /// A harness for `device` loading `target` executables.
    pub fn new(device: Arc<dyn Device>, target: Target) -> Harness {
        Harness { device, target }
    }

    /// The executable of `tests/hal/<name>.mlir` for this target.
    pub fn executable(&self, name: &str) -> Exe {
        executable(name, self.target)
    }
}

/// `<name>.<target>.vmfb`, compiled (once per source change) unless
/// `FERRITE_CTS_MODULES` holds it already.
pub fn module_path(name: &str, target: Target) -> PathBuf {
    let file = format!("{name}.{}.vmfb", target.tag());
    if let Some(dir) = std::env::var_os("FERRITE_CTS_MODULES") {
        let p = Path::new(&dir).join(&file);
        assert!(
            p.exists(),
            "FERRITE_CTS_MODULES is set but {} is missing (cts-modules writes it)",
            p.display()
        );
        return p;
    }
    compile_into(
        name,
        target,
        &workspace_root().join("target/tmp/ferrite-hal-cts"),
    )
}

/// Compiles `tests/hal/<name>.mlir` for `target` into `dir` and writes the
/// dispatch's workgroup count beside it; returns the module path.
pub fn compile_into(name: &str, target: Target, dir: &Path) -> PathBuf {
    std::fs::create_dir_all(dir).expect("creating the module folder");
    let src = workspace_root()
        .join("tests/hal")
        .join(format!("{name}.mlir"));
    let out = dir.join(format!("{name}.{}.vmfb", target.tag()));
    let out = ferrite_testkit::compile_file(&src, &out, target.flags());
    let wg = static_workgroup_count(&out);
    // Tests of one binary compile concurrently; the count must never be
    // seen half-written.
    ferrite_testkit::write_atomic(
        &out.with_extension("workgroups"),
        format!("{} {} {}\n", wg[0], wg[1], wg[2]),
    );
    out
}

/// The executable and workgroup count of a compiled program.
pub fn executable(name: &str, target: Target) -> Exe {
    let vmfb = module_path(name, target);
    let bytes = ModuleBytes::read_file(&vmfb).expect("read module");
    let archive = Archive::parse(bytes).expect("parse module");
    let rodata: Vec<Vec<u8>> = (0..archive.rodata_segments().len())
        .map(|i| archive.rodata(i).expect("rodata").to_vec())
        .collect();
    let (data, format) = match target {
        Target::Cpu => {
            let data = rodata
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
            (data, format)
        }
        Target::Cuda => {
            // The CUDA executable header starts with its identifier.
            let data = rodata
                .iter()
                .find(|r| r.starts_with(b"CDA1"))
                .expect("module holds no CUDA (CDA1) executable")
                .clone();
            (data, "cuda-nvptx-fb".to_string())
        }
    };
    let text = std::fs::read_to_string(vmfb.with_extension("workgroups"))
        .expect("the module's .workgroups file");
    let wg: Vec<u32> = text
        .split_whitespace()
        .map(|w| w.parse().expect("workgroup count"))
        .collect();
    Exe {
        format,
        data,
        workgroups: [wg[0], wg[1], wg[2]],
    }
}

/// The constant workgroup count of the one `hal.command_buffer.dispatch`
/// in `vmfb`, read from `iree-dump-module`'s disassembly.
pub fn static_workgroup_count(vmfb: &Path) -> [u32; 3] {
    let output = std::process::Command::new(venv_tool("iree-dump-module"))
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
        let args_start = line[pos..].find("](").map(|p| pos + p + 2).expect("args");
        let args: Vec<&str> = line[args_start..]
            .trim_end_matches(')')
            .split(", ")
            .collect();
        let resolve = |reg: &str| -> Option<u32> {
            let reg = format!("%i{}", reg.trim_start_matches('%').trim_start_matches('i'));
            for prev in lines[..n].iter().rev() {
                let t = prev.trim();
                if t.starts_with("vm.func") {
                    return None;
                }
                if let Some(rest) = t.strip_prefix(&format!("{reg} = ")) {
                    if rest.starts_with("vm.const.i32.zero") {
                        return Some(0);
                    }
                    return rest
                        .strip_prefix("vm.const.i32 ")?
                        .split_whitespace()
                        .next()?
                        .parse::<i64>()
                        .ok()
                        .map(|v| v as u32);
                }
            }
            None
        };
        counts.push([resolve(args[3]), resolve(args[4]), resolve(args[5])]);
    }
    assert_eq!(counts.len(), 1, "expected one dispatch, found {counts:?}");
    counts[0].map(|c| c.expect("workgroup count is not a constant"))
}
