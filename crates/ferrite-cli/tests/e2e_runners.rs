//! `ferrite e2e-matmul-test` / `e2e-conv2d-test` / `e2e-attention-test` on our own programs
//! (`tests/e2e_runners/*.mlir`, compiled at test time): correct products
//! and convolutions pass on both devices; a wrong product fails naming the
//! first disagreeing element with both values and the matrices around it;
//! sizes that do not match the result are an error, not a bad read.

use ferrite_testkit::{compile_file, workspace_root, GENERIC_CPU};
use std::path::{Path, PathBuf};
use std::process::Command;

/// Compiles `tests/e2e_runners/<name>.mlir` for a portable x86-64 CPU.
fn compile(name: &str) -> PathBuf {
    let src = workspace_root().join(format!("tests/e2e_runners/{name}.mlir"));
    let out = ferrite_testkit::target_tmpdir!("e2e-runners").join(format!("{name}.vmfb"));
    compile_file(&src, &out, GENERIC_CPU)
}

/// Runs `ferrite <command> --module=<vmfb> --device=<device>`: exit code
/// and stdout.
fn ferrite(command: &str, vmfb: &Path, device: &str, extra: &[&str]) -> (i32, String) {
    let output = Command::new(env!("CARGO_BIN_EXE_ferrite"))
        .arg(command)
        .arg(format!("--module={}", vmfb.display()))
        .arg(format!("--device={device}"))
        .args(extra)
        .output()
        .expect("run ferrite");
    let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
    (output.status.code().unwrap_or(-1), stdout)
}

#[test]
fn matmul_checks_pass_on_both_devices() {
    let vmfb = compile("matmul");
    for device in ["local-sync", "local-task"] {
        let (code, out) = ferrite("e2e-matmul-test", &vmfb, device, &[]);
        assert_eq!(code, 0, "{device}:\n{out}");
        assert!(out.contains("4 passed, 0 failed"), "{device}:\n{out}");
        for name in [
            "f32_accumulate_3x5x4",
            "i8_i32_7x9x6",
            "f16_f32_transposed_4x8x3",
            "batch_f32_2x3x4x5",
        ] {
            assert!(
                out.contains(&format!("[       OK ] module.{name}")),
                "{name}:\n{out}"
            );
        }
    }
}

#[test]
fn wrong_matmul_fails_with_a_clear_message() {
    let vmfb = compile("matmul_wrong");
    for device in ["local-sync", "local-task"] {
        let (code, out) = ferrite("e2e-matmul-test", &vmfb, device, &[]);
        assert_eq!(code, 1, "{device}:\n{out}");
        assert!(out.contains("0 passed, 1 failed"), "{out}");
        assert!(
            out.contains("the actual and expected result matrices disagree at row 0, column 0."),
            "{out}"
        );
        // lhs(seed 1) row 0 · rhs(seed 2) column 0 = -41; the program added 1.
        assert!(out.contains("actual value: -40"), "{out}");
        assert!(out.contains("expected value: -41"), "{out}");
        assert!(
            out.contains("left-hand side (rows 0..2 out of 0..2, columns 0..4 out of 0..4)"),
            "{out}"
        );
        assert!(
            out.contains("actual result (rows 0..2 out of 0..2"),
            "{out}"
        );
        assert!(
            out.contains("[  FAILED  ] module.off_by_one_3x5x4"),
            "{out}"
        );
    }
}

#[test]
fn inexact_results_are_accepted_only_within_the_tolerance() {
    let vmfb = compile("matmul_wrong");
    let loose = ["--require_exact_results=false", "--acceptable_fp_delta=1.5"];
    let (code, out) = ferrite("e2e-matmul-test", &vmfb, "local-sync", &loose);
    assert_eq!(code, 0, "{out}");
    assert!(out.contains("1 passed, 0 failed"), "{out}");
    let tight = ["--require_exact_results=false", "--acceptable_fp_delta=0.5"];
    let (code, out) = ferrite("e2e-matmul-test", &vmfb, "local-sync", &tight);
    assert_eq!(code, 1, "{out}");
    let negative = ["--acceptable_fp_delta=-1"];
    let (code, _) = ferrite("e2e-matmul-test", &vmfb, "local-sync", &negative);
    assert_ne!(code, 0);
}

#[test]
fn conv2d_checks_pass_and_mismatched_sizes_are_reported() {
    let vmfb = compile("conv2d");
    for device in ["local-sync", "local-task"] {
        let (code, out) = ferrite("e2e-conv2d-test", &vmfb, device, &[]);
        assert_eq!(code, 1, "{device}:\n{out}");
        assert!(
            out.contains("[       OK ] module.f32_strided_dilated"),
            "{out}"
        );
        assert!(out.contains("[  FAILED  ] module.f32_wrong_sizes"), "{out}");
        assert!(
            out.contains("actual_result: expected at least 36 elements of f32 (144 bytes), the buffer view has 72 bytes"),
            "{out}"
        );
        assert!(out.contains("1 passed, 1 failed"), "{out}");
    }
}

#[test]
fn attention_results_outside_the_value_range_fail() {
    let vmfb = compile("attention");
    for device in ["local-sync", "local-task"] {
        let (code, out) = ferrite("e2e-attention-test", &vmfb, device, &[]);
        assert_eq!(code, 1, "{device}:\n{out}");
        assert!(
            out.contains("[       OK ] module.mean_is_within_range"),
            "{out}"
        );
        assert!(
            out.contains("[  FAILED  ] module.out_of_range_fails"),
            "{out}"
        );
        assert!(
            out.contains(
                "attention result at batch 0, row 0, column 0 is 96.6, outside the range [-8, -1]"
            ),
            "{out}"
        );
        assert!(out.contains("1 passed, 1 failed"), "{out}");
    }
}

#[test]
fn modules_requiring_missing_cpu_features_are_not_run() {
    let vmfb = compile("requirements");
    let (code, out) = ferrite("e2e-matmul-test", &vmfb, "local-sync", &[]);
    assert_eq!(code, 0, "{out}");
    assert!(
        out.contains(&format!(
            "CPU feature 'not-a-feature' unknown on {}; not running the tests",
            std::env::consts::ARCH
        )),
        "{out}"
    );
    assert!(!out.contains("would_fail"), "{out}");
}
