//! `--parameters=scope=file`: a program compiled with named parameters
//! (`tests/parameters/affine.mlir`) runs through `ferrite run-module` and
//! upstream's `iree-run-module` with the same parameters stored as `.irpa`
//! (written by Ferrite's archive writer, with a splat), `.gguf` and
//! `.safetensors`; stdout must be identical on both CPU devices and in both
//! parameter modes. A missing scope is an error naming it. A larger
//! parameter at a misaligned safetensors offset (`tests/parameters/
//! table_sum.mlir`), bound as an aligned copy (demand-paged where the
//! system allows), sums to the value written.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;

use ferrite_modules::io_parameters::formats::irpa;
use ferrite_modules::io_parameters::{FileHandle, ParameterIndex};
use ferrite_testkit::parameter_files::{gguf, safetensors};
use ferrite_testkit::{compile_file, f32_bytes, venv_tool, workspace_root, GENERIC_CPU};

fn out_dir() -> PathBuf {
    ferrite_testkit::target_tmpdir!("parameters")
}

fn compile() -> PathBuf {
    let src = workspace_root().join("tests/parameters/affine.mlir");
    compile_file(&src, &out_dir().join("affine.vmfb"), GENERIC_CPU)
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
    let tensors = [
        ("w", &[4u64][..], 0, f32_bytes(&W)),
        ("b", &[4], 0, f32_bytes(&B)),
    ];
    std::fs::write(path, gguf(32, &tensors)).unwrap();
}

fn write_safetensors(path: &Path) {
    let tensors = [
        ("b", &[4u64][..], f32_bytes(&B)),
        ("w", &[4], f32_bytes(&W)),
    ];
    std::fs::write(path, safetensors(&tensors)).unwrap();
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
fn misaligned_safetensors_tensors_reach_dispatches_intact() {
    let src = workspace_root().join("tests/parameters/table_sum.mlir");
    let module = compile_file(&src, &out_dir().join("table_sum.vmfb"), GENERIC_CPU);
    // `pad` (4 bytes) first puts `t` at an offset that is 4 mod 8.
    let t: Vec<f32> = (0..40_000).map(|i| (i % 7) as f32).collect();
    let file = out_dir().join("table.safetensors");
    std::fs::write(
        &file,
        safetensors(&[
            ("pad", &[1], f32_bytes(&[0.0])),
            ("t", &[40_000], f32_bytes(&t)),
        ]),
    )
    .unwrap();
    let ferrite = Path::new(env!("CARGO_BIN_EXE_ferrite"));
    let upstream = venv_tool("iree-run-module");
    for device in ["local-sync", "local-task"] {
        for mode in ["file", "preload"] {
            let a = vec![
                format!("--module={}", module.display()),
                "--function=main".to_string(),
                format!("--device={device}"),
                "--input=40000xf32=1".to_string(),
                format!("--parameters=model={}", file.display()),
                format!("--parameter_mode={mode}"),
            ];
            let (ok, up, err) = run(&upstream, &[], &a);
            assert!(ok, "upstream: {err}");
            let (ok, fe, err) = run(ferrite, &["run-module"], &a);
            assert!(ok, "ferrite: {err}");
            assert_eq!(fe, up, "{device} ({mode})");
            // 5714 full cycles of 0..7 (21 each) and then 0, 1.
            assert!(fe.contains("f32=119995"), "{device} ({mode}): {fe}");
        }
    }
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
