//! `--parameters=scope=file`: a program compiled with named parameters
//! (`tests/parameters/affine.mlir`) runs through `ferrite run-module` and
//! upstream's `iree-run-module` with the same parameters stored as `.irpa`
//! (written by Ferrite's archive writer, with a splat), `.gguf` and
//! `.safetensors`; stdout must be identical on both CPU devices and in both
//! parameter modes. A missing scope is an error naming it.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;

use ferrite_modules::io_parameters::formats::irpa;
use ferrite_modules::io_parameters::{FileHandle, ParameterIndex};

fn workspace_root() -> PathBuf {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    dir.canonicalize().unwrap_or(dir)
}

fn venv_tool(name: &str) -> PathBuf {
    let venv = std::env::var_os("VENV")
        .map(PathBuf::from)
        .unwrap_or_else(|| workspace_root().join(".venv"));
    let p = venv.join("bin").join(name);
    assert!(
        p.is_file(),
        "{} is missing: run scripts/setup-venv.sh",
        p.display()
    );
    p
}

fn out_dir() -> PathBuf {
    let d = Path::new(env!("CARGO_TARGET_TMPDIR")).join("parameters");
    std::fs::create_dir_all(&d).unwrap();
    d
}

fn compile() -> PathBuf {
    let src = workspace_root().join("tests/parameters/affine.mlir");
    let out = out_dir().join("affine.vmfb");
    let o = Command::new(venv_tool("iree-compile"))
        .args([
            "--iree-hal-target-device=local",
            "--iree-hal-local-target-device-backends=llvm-cpu",
            "--iree-llvmcpu-target-cpu=generic",
        ])
        .arg(&src)
        .arg("-o")
        .arg(&out)
        .output()
        .unwrap();
    assert!(
        o.status.success(),
        "iree-compile: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    out
}

fn f32_bytes(v: &[f32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

const W: [f32; 4] = [1.5, -2.0, 0.25, 8.0];
const B: [f32; 4] = [10.0, 20.0, 30.0, 40.0];

fn write_irpa(path: &Path) {
    let mut index = ParameterIndex::new();
    let h = FileHandle::from_shared(Arc::new(f32_bytes(&W)), "w");
    index.add_file("w", &h, 0, 16, Vec::new()).unwrap();
    index
        .add_splat("b", &0.5f32.to_le_bytes(), 16, Vec::new())
        .unwrap();
    irpa::save_archive_file(&index, path).unwrap();
}

fn write_gguf(path: &Path) {
    let mut f = Vec::new();
    let string = |f: &mut Vec<u8>, s: &str| {
        f.extend_from_slice(&(s.len() as u64).to_le_bytes());
        f.extend_from_slice(s.as_bytes());
    };
    f.extend_from_slice(b"GGUF");
    f.extend_from_slice(&3u32.to_le_bytes());
    f.extend_from_slice(&2u64.to_le_bytes()); // tensors
    f.extend_from_slice(&0u64.to_le_bytes()); // key/values
    for (name, offset) in [("w", 0u64), ("b", 32)] {
        string(&mut f, name);
        f.extend_from_slice(&1u32.to_le_bytes());
        f.extend_from_slice(&4u64.to_le_bytes());
        f.extend_from_slice(&0u32.to_le_bytes()); // F32
        f.extend_from_slice(&offset.to_le_bytes());
    }
    f.resize(f.len().div_ceil(32) * 32, 0);
    f.extend_from_slice(&f32_bytes(&W));
    f.resize(f.len() + 16, 0);
    f.extend_from_slice(&f32_bytes(&B));
    std::fs::write(path, f).unwrap();
}

fn write_safetensors(path: &Path) {
    let mut header = String::from(
        r#"{"b":{"dtype":"F32","shape":[4],"data_offsets":[0,16]},"w":{"dtype":"F32","shape":[4],"data_offsets":[16,32]}}"#,
    );
    while header.len() % 8 != 0 {
        header.push(' ');
    }
    let mut f = (header.len() as u64).to_le_bytes().to_vec();
    f.extend_from_slice(header.as_bytes());
    f.extend_from_slice(&f32_bytes(&B));
    f.extend_from_slice(&f32_bytes(&W));
    std::fs::write(path, f).unwrap();
}

fn run(tool: &Path, pre: &[&str], args: &[String]) -> (bool, String, String) {
    let o = Command::new(tool).args(pre).args(args).output().unwrap();
    (
        o.status.success(),
        String::from_utf8_lossy(&o.stdout).into_owned(),
        String::from_utf8_lossy(&o.stderr).into_owned(),
    )
}

fn args(module: &Path, device: &str, extra: &[String]) -> Vec<String> {
    let mut v = vec![
        format!("--module={}", module.display()),
        "--function=main".to_string(),
        format!("--device={device}"),
        "--input=4xf32=1,2,3,4".to_string(),
    ];
    v.extend_from_slice(extra);
    v
}

#[test]
fn parameter_files_match_upstream() {
    let module = compile();
    let dir = out_dir();
    let files = [
        dir.join("affine.irpa"),
        dir.join("affine.gguf"),
        dir.join("affine.safetensors"),
    ];
    write_irpa(&files[0]);
    write_gguf(&files[1]);
    write_safetensors(&files[2]);
    let ferrite = Path::new(env!("CARGO_BIN_EXE_ferrite"));
    let upstream = venv_tool("iree-run-module");
    for file in &files {
        for device in ["local-sync", "local-task"] {
            for mode in ["file", "preload"] {
                let extra = [
                    format!("--parameters=model={}", file.display()),
                    format!("--parameter_mode={mode}"),
                ];
                let a = args(&module, device, &extra);
                let (ok, up, err) = run(&upstream, &[], &a);
                assert!(ok, "upstream with {}: {err}", file.display());
                let (ok, fe, err) = run(ferrite, &["run-module"], &a);
                assert!(ok, "ferrite with {}: {err}", file.display());
                assert_eq!(fe, up, "{} on {device} ({mode})", file.display());
            }
        }
    }
    // The values are the ones written (not, say, zeros on both sides).
    let (_, out, _) = run(
        ferrite,
        &["run-module"],
        &args(
            &module,
            "local-sync",
            &[format!("--parameters=model={}", files[1].display())],
        ),
    );
    assert!(out.contains("4xf32=11.5 16 30.75 72"), "{out}");
}

#[test]
fn missing_scope_and_bad_files_are_errors() {
    let module = compile();
    let ferrite = Path::new(env!("CARGO_BIN_EXE_ferrite"));
    let (ok, _, err) = run(ferrite, &["run-module"], &args(&module, "local-sync", &[]));
    assert!(!ok);
    assert!(
        err.contains("no provider registered that handles scopes like 'model'"),
        "{err}"
    );

    let bad = out_dir().join("bad.irpa");
    std::fs::write(&bad, b"IRPA").unwrap();
    let flag = format!("--parameters=model={}", bad.display());
    let (ok, _, err) = run(
        ferrite,
        &["run-module"],
        &args(&module, "local-sync", std::slice::from_ref(&flag)),
    );
    assert!(!ok);
    assert!(
        err.contains("not enough bytes for an irpa header at offset 0") && err.contains(&flag),
        "{err}"
    );

    let (ok, _, err) = run(
        ferrite,
        &["run-module"],
        &args(
            &module,
            "local-sync",
            &["--parameter_mode=lazy".to_string()],
        ),
    );
    assert!(!ok);
    assert!(err.contains("--parameter_mode= value 'lazy'"), "{err}");
}
