//! The shared test helpers themselves: a tool's exit code and output come
//! back whole, a program over its time limit fails the test, and compiled
//! modules are rebuilt exactly when their source changes.

use ferrite_testkit::{compile_source, run_command, run_program, GENERIC_CPU};
use std::path::Path;
use std::process::Command;
use std::time::Duration;

#[test]
fn run_command_returns_code_and_both_streams() {
    // More than a pipe buffer on each stream: the drain threads must keep
    // the child from blocking.
    let out = run_command(
        Command::new("sh").args([
            "-c",
            "head -c 200000 /dev/zero | tr '\\0' a; head -c 100000 /dev/zero | tr '\\0' b >&2; exit 3",
        ]),
        Duration::from_secs(60),
    );
    assert_eq!(out.code, Some(3));
    assert!(!out.success());
    assert_eq!(out.stdout.len(), 200_000);
    assert!(out.stdout.bytes().all(|b| b == b'a'));
    assert_eq!(out.stderr.len(), 100_000);
    let ok = run_program(
        Path::new("sh"),
        &["-c", "printf hi"],
        Duration::from_secs(60),
    );
    assert!(ok.success());
    assert_eq!(ok.stdout, "hi");
}

#[test]
#[should_panic(expected = "did not finish within")]
fn run_command_fails_a_program_over_its_time_limit() {
    run_command(Command::new("sleep").arg("30"), Duration::from_millis(200));
}

#[test]
fn compile_source_rebuilds_only_when_the_text_changes() {
    let dir = ferrite_testkit::target_tmpdir!("testkit");
    let out = dir.join("twice.vmfb");
    let _ = std::fs::remove_file(&out);
    let program = |k: i32| {
        format!("func.func @f(%x: i32) -> i32 {{\n  %c = arith.constant {k} : i32\n  %0 = arith.addi %x, %c : i32\n  return %0 : i32\n}}\n")
    };
    let modified = |p: &Path| std::fs::metadata(p).unwrap().modified().unwrap();
    assert_eq!(compile_source(&program(1), &out, GENERIC_CPU), out);
    let first = std::fs::read(&out).unwrap();
    assert!(!first.is_empty());
    let first_time = modified(&out);
    // Same text: neither the source nor the module is written again.
    std::thread::sleep(Duration::from_millis(20));
    compile_source(&program(1), &out, GENERIC_CPU);
    assert_eq!(modified(&out), first_time);
    // New text: rebuilt, and the module differs (another constant).
    std::thread::sleep(Duration::from_millis(20));
    compile_source(&program(2), &out, GENERIC_CPU);
    assert!(modified(&out) > first_time);
    assert_ne!(std::fs::read(&out).unwrap(), first);
}

#[test]
#[should_panic(expected = "iree-compile failed for")]
fn compile_errors_fail_with_the_diagnostics() {
    let out = ferrite_testkit::target_tmpdir!("testkit").join("broken.vmfb");
    compile_source("func.func @f( -> i32", &out, GENERIC_CPU);
}
