//! Helpers of the HAL suite: compiling our own programs under `tests/hal/`
//! with the pinned IREE compiler at test time, pulling a CPU executable and
//! its dispatch's workgroup count out of a compiled module, and small buffer
//! utilities.
#![allow(dead_code)]

use ferrite_vm::bytecode::archive::Archive;
use ferrite_vm::ModuleBytes;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Mutex;

/// The workspace root.
pub fn workspace_root() -> PathBuf {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    dir.canonicalize().unwrap_or(dir)
}

/// A pinned tool from `<workspace>/.venv/bin`.
pub fn tool(name: &str) -> PathBuf {
    let p = workspace_root().join(".venv/bin").join(name);
    assert!(
        p.is_file(),
        "{} not found: the HAL suite compiles its programs with the pinned IREE \
         compiler (iree-base-compiler==3.13.0) installed in <workspace>/.venv",
        p.display()
    );
    p
}

static BUILD_LOCK: Mutex<()> = Mutex::new(());

/// Compiles `tests/hal/<name>.mlir` (once per source change) and returns the
/// `.vmfb` path. `vm_dialect` programs are compiled with
/// `--compile-mode=vm`; the others for the local llvm-cpu target with a
/// portable (generic x86-64) CPU.
pub fn compile(name: &str, vm_dialect: bool) -> PathBuf {
    let _guard = BUILD_LOCK.lock().unwrap_or_else(|e| e.into_inner());
    let src = workspace_root()
        .join("tests/hal")
        .join(format!("{name}.mlir"));
    let out_dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("hal-suite");
    std::fs::create_dir_all(&out_dir).expect("create output directory");
    let out = out_dir.join(format!("{name}.vmfb"));
    let fresh = match (std::fs::metadata(&src), std::fs::metadata(&out)) {
        (Ok(s), Ok(o)) => matches!((s.modified(), o.modified()), (Ok(s), Ok(o)) if o >= s),
        _ => false,
    };
    if !fresh {
        let mut cmd = Command::new(tool("iree-compile"));
        if vm_dialect {
            cmd.arg("--compile-mode=vm");
        } else {
            cmd.args([
                "--iree-hal-target-device=local",
                "--iree-hal-local-target-device-backends=llvm-cpu",
                "--iree-llvmcpu-target-cpu=generic",
            ]);
        }
        let tmp = out.with_extension(format!("vmfb.{}.tmp", std::process::id()));
        let output = cmd
            .arg(&src)
            .arg("-o")
            .arg(&tmp)
            .output()
            .expect("run iree-compile");
        assert!(
            output.status.success(),
            "iree-compile failed for {}:\n{}",
            src.display(),
            String::from_utf8_lossy(&output.stderr)
        );
        std::fs::rename(&tmp, &out).expect("move compiled module into place");
    }
    out
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
    let archive =
        Archive::parse(ModuleBytes::read_file(&vmfb).expect("read module")).expect("parse module");
    let rodata: Vec<Vec<u8>> = (0..archive.rodata_segments().len())
        .map(|i| archive.rodata(i).expect("rodata segment").to_vec())
        .collect();
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
    Executable {
        format,
        data,
        workgroups: dispatch_workgroups(&vmfb),
    }
}

/// The constant workgroup counts of the single `hal.command_buffer.dispatch`
/// of a module, from `iree-dump-module --output=disassembly`.
pub fn dispatch_workgroups(vmfb: &Path) -> [u32; 3] {
    let output = Command::new(tool("iree-dump-module"))
        .arg("--output=disassembly")
        .arg(vmfb)
        .output()
        .expect("run iree-dump-module");
    assert!(output.status.success(), "iree-dump-module failed");
    let text = String::from_utf8_lossy(&output.stdout).into_owned();
    let lines: Vec<&str> = text.lines().collect();
    let calls: Vec<usize> = lines
        .iter()
        .enumerate()
        .filter(|(_, l)| l.contains("vm.call.variadic @hal.command_buffer.dispatch "))
        .map(|(i, _)| i)
        .collect();
    assert_eq!(
        calls.len(),
        1,
        "expected one dispatch in {}",
        vmfb.display()
    );
    let n = calls[0];
    let line = lines[n];
    let start = line.find("](").expect("dispatch arguments") + 2;
    let args: Vec<&str> = line[start..].trim_end_matches(')').split(", ").collect();
    let resolve = |reg: &str| -> u32 {
        let reg = reg.trim();
        for prev in lines[..n].iter().rev() {
            let t = prev.trim();
            assert!(
                !t.starts_with("vm.func"),
                "workgroup count {reg} is not a constant"
            );
            let Some(rest) = t.strip_prefix(&format!("{reg} = ")) else {
                continue;
            };
            if rest.starts_with("vm.const.i32.zero") {
                return 0;
            }
            let v = rest
                .strip_prefix("vm.const.i32 ")
                .unwrap_or_else(|| panic!("workgroup count {reg} is not a constant: {t}"));
            return v.split_whitespace().next().unwrap().parse().unwrap();
        }
        panic!("no definition of {reg}");
    };
    [resolve(args[3]), resolve(args[4]), resolve(args[5])]
}

/// f32 values as little-endian bytes.
pub fn f32_bytes(v: &[f32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
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
