//! The differential mode: `check-module --compare_device` and `run-module
//! --compare_device` run a program on two devices, every dispatch alone,
//! and name the first dispatch whose outputs differ. A program compared
//! with itself on the other CPU device agrees; compared with a variant
//! that computes another value (`--compare_module`), the test fails at
//! that dispatch.

use ferrite_testkit::{compile_file, run_program, workspace_root, GENERIC_CPU};
use std::path::{Path, PathBuf};
use std::time::Duration;

fn module(name: &str) -> PathBuf {
    let src = workspace_root().join(format!("tests/hal/compare/{name}.mlir"));
    let out = ferrite_testkit::target_tmpdir!("dispatch-compare").join(format!("{name}.vmfb"));
    compile_file(&src, &out, GENERIC_CPU)
}

fn ferrite(args: &[String]) -> ferrite_testkit::Output {
    run_program(
        Path::new(env!("CARGO_BIN_EXE_ferrite")),
        args,
        Duration::from_secs(120),
    )
}

#[test]
fn check_module_compares_dispatch_by_dispatch() {
    let (a, b) = (module("scaled"), module("scaled_wrong"));
    let same = ferrite(&[
        "check-module".into(),
        format!("--module={}", a.display()),
        "--device=local-sync".into(),
        "--compare_device=local-task".into(),
    ]);
    assert_eq!(same.code, Some(0), "{}{}", same.stdout, same.stderr);
    assert!(
        same.stdout.contains("1 passed, 0 failed"),
        "{}",
        same.stdout
    );
    let differ = ferrite(&[
        "check-module".into(),
        format!("--module={}", a.display()),
        "--device=local-sync".into(),
        "--compare_device=local-task".into(),
        format!("--compare_module={}", b.display()),
    ]);
    assert_eq!(differ.code, Some(1), "{}{}", differ.stdout, differ.stderr);
    assert!(
        differ
            .stdout
            .contains("FIRST DIFFERING dispatch #0 _scaled_dispatch_0"),
        "{}",
        differ.stdout
    );
}

/// The comparison reads bindings inside the traced submission: it must do
/// so as device work (host reads are refused while a submission's buffers
/// are in use), on a program with several command-buffer forms.
#[test]
fn run_module_compares_a_program_with_transfers() {
    let src = workspace_root().join("tests/hal/command_forms.mlir");
    let out = ferrite_testkit::target_tmpdir!("dispatch-compare").join("command_forms.vmfb");
    let m = compile_file(&src, &out, GENERIC_CPU);
    for function in ["pad", "concat_after_dispatch"] {
        let inputs: &[&str] = if function == "pad" {
            &["--input=3x4xf32=1,2,3,4,5,6,7,8,9,10,11,12"]
        } else {
            &["--input=4xf32=1,2,3,4", "--input=4xf32=0.5,0.25,2,3"]
        };
        let mut args = vec![
            "run-module".to_string(),
            format!("--module={}", m.display()),
            format!("--function={function}"),
            "--device=local-sync".into(),
            "--compare_device=local-task".into(),
        ];
        args.extend(inputs.iter().map(|s| s.to_string()));
        let o = ferrite(&args);
        assert_eq!(o.code, Some(0), "{function}: {}{}", o.stdout, o.stderr);
        assert!(
            o.stdout.contains("0 differ, 0 unmatched"),
            "{function}: {}",
            o.stdout
        );
    }
}
