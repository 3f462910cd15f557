//! `ferrite run-module`: output format, exit codes and error messages, and
//! differential runs against upstream's `iree-run-module` (pinned in
//! `.venv/bin`) on the fixtures' scalar exports: stdout must match exactly.
//!
//! Known upstream divergence: 3.13's `switch.i64` reads only the low 32 bits
//! of the selected case value (sign-extended); the default value is read
//! whole. `control_flow.switch_i64_wide` asserts exactly that difference.

#[path = "../../ferrite-vm/tests/common/mod.rs"]
mod common;

use ferrite_testkit::{run_program, venv_tool, Output};
use std::path::PathBuf;
use std::time::Duration;

fn ferrite_bin() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_ferrite"))
}

/// Upstream's `iree-run-module`; the differential tests fail without it.
fn upstream_bin() -> PathBuf {
    venv_tool("iree-run-module")
}

fn args(fixture: &str, function: &str, inputs: &[&str]) -> Vec<String> {
    let mut v = vec![
        format!("--module={}", common::fixture_path(fixture).display()),
        format!("--function={function}"),
    ];
    v.extend(inputs.iter().map(|i| format!("--input={i}")));
    v
}

fn ferrite(fixture: &str, function: &str, inputs: &[&str]) -> Output {
    let mut a = vec!["run-module".to_string()];
    a.extend(args(fixture, function, inputs));
    run_program(&ferrite_bin(), &a, Duration::from_secs(60))
}

fn upstream(fixture: &str, function: &str, inputs: &[&str]) -> Output {
    run_program(
        &upstream_bin(),
        &args(fixture, function, inputs),
        Duration::from_secs(60),
    )
}

fn ok_stdout(fixture: &str, function: &str, inputs: &[&str]) -> String {
    let o = ferrite(fixture, function, inputs);
    assert_eq!(
        o.code,
        Some(0),
        "ferrite run-module {fixture}.{function} {inputs:?} failed:\n{}{}",
        o.stdout,
        o.stderr
    );
    o.stdout
}

#[test]
fn prints_results_like_upstream_format() {
    assert_eq!(
        ok_stdout("arith_i32", "sum_i32", &["40", "2"]),
        "EXEC @sum_i32\nresult[0]: i32=42\n"
    );
    assert_eq!(
        ok_stdout("arith_i32", "divmod_i32", &["-17", "5"]),
        "EXEC @divmod_i32\nresult[0]: i32=-3\nresult[1]: i32=-2\n"
    );
    assert_eq!(
        ok_stdout("calls", "fact_i64", &["20"]),
        "EXEC @fact_i64\nresult[0]: i64=2432902008176640000\n"
    );
    assert_eq!(
        ok_stdout("calls", "mix", &["5", "1.5", "2.25"]),
        "EXEC @mix\nresult[0]: f64=18.75\nresult[1]: i64=15\n"
    );
    // %g: six significant digits, trailing zeros trimmed, exponent form
    // outside [1e-4, 1e6).
    assert_eq!(
        ok_stdout("arith_f32", "scale_f32", &["0.1", "3"]),
        "EXEC @scale_f32\nresult[0]: f32=0.3\n"
    );
    assert_eq!(
        ok_stdout("arith_f32", "scale_f32", &["1e30", "1e10"]),
        "EXEC @scale_f32\nresult[0]: f32=inf\n"
    );
    assert_eq!(
        ok_stdout("arith_f64", "hypot_f64", &["3", "4"]),
        "EXEC @hypot_f64\nresult[0]: f64=5\n"
    );
    assert_eq!(
        ok_stdout("arith_f64", "hypot_f64", &["1e100", "1e100"]),
        "EXEC @hypot_f64\nresult[0]: f64=1.41421e+100\n"
    );
    assert_eq!(
        ok_stdout("arith_f64", "hypot_f64", &["0.1", "0.2"]),
        "EXEC @hypot_f64\nresult[0]: f64=0.223607\n"
    );
    // A function without results prints only the EXEC line.
    assert_eq!(
        ok_stdout("control_flow", "test_collatz", &[]),
        "EXEC @test_collatz\n"
    );
}

#[test]
fn runs_yielding_functions_to_completion() {
    // yield_sum(n) yields n times inside a callee and returns 2n.
    assert_eq!(
        ok_stdout("yield", "yield_sum", &["6"]),
        "EXEC @yield_sum\nresult[0]: i32=12\n"
    );
    assert_eq!(
        ok_stdout("yield", "test_yield_in_place", &[]),
        "EXEC @test_yield_in_place\n"
    );
}

#[test]
fn runtime_failure_exits_nonzero_with_status() {
    let o = ferrite("traps", "fail_explicit_status", &[]);
    assert_eq!(o.code, Some(1), "{o:?}", o = (&o.stdout, &o.stderr));
    assert_eq!(o.stdout, "EXEC @fail_explicit_status\n");
    assert!(
        o.stderr
            .contains("PERMISSION_DENIED; explicit failure with PERMISSION_DENIED"),
        "{}",
        o.stderr
    );
    assert!(
        o.stderr.contains("traps.fail_explicit_status@"),
        "backtrace missing: {}",
        o.stderr
    );
    // Integer division by zero is an error, not a signal.
    let o = ferrite("traps", "fail_div_i32s_by_zero", &[]);
    assert_eq!(o.code, Some(1), "{}", o.stderr);
    assert_eq!(o.stdout, "EXEC @fail_div_i32s_by_zero\n");
    assert!(!o.stderr.trim().is_empty());
    // Unbounded recursion.
    let o = ferrite("traps", "fail_deep_recursion", &[]);
    assert_eq!(o.code, Some(1), "{}", o.stderr);
    assert!(o.stderr.starts_with("RESOURCE_EXHAUSTED"), "{}", o.stderr);
}

#[test]
fn load_and_lookup_errors() {
    let missing = common::fixtures_dir().join("no_such_module.vmfb");
    let o = run_program(
        &ferrite_bin(),
        &[
            "run-module".into(),
            format!("--module={}", missing.display()),
            "--function=f".into(),
        ],
        Duration::from_secs(60),
    );
    assert_eq!(o.code, Some(1));
    assert!(o.stdout.is_empty(), "{}", o.stdout);
    assert!(
        o.stderr.starts_with("NOT_FOUND") && o.stderr.contains("no_such_module.vmfb"),
        "{}",
        o.stderr
    );

    let o = ferrite("traps", "nope", &[]);
    assert_eq!(o.code, Some(1));
    assert!(o.stdout.is_empty(), "{}", o.stdout);
    assert!(
        o.stderr.starts_with("NOT_FOUND") && o.stderr.contains("'nope'"),
        "{}",
        o.stderr
    );

    // A module importing the HAL gets the real `hal` module over a CPU device.
    let o = ferrite("hal_variadic", "test_call_variadic_import", &[]);
    assert_eq!(o.code, Some(0), "{}", o.stderr);
    let o = ferrite("hal_variadic", "test_call_variadic_yieldable_import", &[]);
    assert_eq!(o.code, Some(0), "{}", o.stderr);
}

#[test]
fn input_errors() {
    let o = ferrite("arith_i32", "sum_i32", &["3"]);
    assert_eq!(o.code, Some(1));
    assert!(
        o.stderr.contains(
            "INVALID_ARGUMENT; input list and function mismatch; expected 2 arguments but passed 1"
        ),
        "{}",
        o.stderr
    );
    let o = ferrite("arith_i32", "sum_i32", &["1", "2", "3"]);
    assert_eq!(o.code, Some(1));
    assert!(
        o.stderr.contains("expected 2 arguments but passed 3"),
        "{}",
        o.stderr
    );
    let o = ferrite("arith_i32", "sum_i32", &["1", "abc"]);
    assert_eq!(o.code, Some(1));
    assert!(
        o.stderr.starts_with("INVALID_ARGUMENT") && o.stderr.contains("abc"),
        "{}",
        o.stderr
    );
    // Upstream's message, for comparison (its text after the source prefix).
    let u = upstream("arith_i32", "sum_i32", &["3"]);
    assert_ne!(u.code, Some(0));
    assert!(
        u.stderr
            .contains("input list and function mismatch; expected 2 arguments but passed 1"),
        "{}",
        u.stderr
    );
}

/// (fixture, function, inputs) run through both runtimes.
const DIFFERENTIAL: &[(&str, &str, &[&str])] = &[
    ("arith_i32", "sum_i32", &["3", "4"]),
    ("arith_i32", "sum_i32", &["2147483647", "1"]),
    ("arith_i32", "sum_i32", &["-5", "12"]),
    ("arith_i32", "divmod_i32", &["17", "5"]),
    ("arith_i32", "divmod_i32", &["-17", "5"]),
    ("arith_i32", "divmod_i32", &["17", "-5"]),
    ("arith_i64", "mulsub_i64", &["123456789012", "1000"]),
    ("arith_i64", "mulsub_i64", &["-7", "3"]),
    ("arith_i64", "mulsub_i64", &["9223372036854775807", "2"]),
    ("arith_f32", "scale_f32", &["1.5", "2"]),
    ("arith_f32", "scale_f32", &["0.1", "3"]),
    ("arith_f32", "scale_f32", &["1e30", "1e10"]),
    ("arith_f32", "scale_f32", &["-2.5e-8", "3"]),
    ("arith_f64", "hypot_f64", &["3", "4"]),
    ("arith_f64", "hypot_f64", &["1e200", "1e200"]),
    ("arith_f64", "hypot_f64", &["1e100", "1e-100"]),
    ("arith_f64", "hypot_f64", &["0.1", "0.2"]),
    ("arith_f64", "hypot_f64", &["123456.789", "1e-3"]),
    ("calls", "mix", &["5", "1.5", "2.25"]),
    ("calls", "mix", &["-3", "0.1", "-7.5"]),
    ("calls", "mix", &["10000000000", "0.5", "0.25"]),
    ("calls", "fib_i32", &["10"]),
    ("calls", "fib_i32", &["20"]),
    ("calls", "fact_i64", &["5"]),
    ("calls", "fact_i64", &["20"]),
    ("control_flow", "collatz_steps", &["27"]),
    ("control_flow", "collatz_steps", &["97"]),
    ("control_flow", "switch_i64_wide", &["2"]),
    ("control_flow", "switch_i64_wide", &["-1"]),
    ("globals", "counter_next", &[]),
];

#[test]
fn differential_against_upstream() {
    upstream_bin();
    let mut mismatches = Vec::new();
    for (fixture, function, inputs) in DIFFERENTIAL {
        let f = ferrite(fixture, function, inputs);
        let u = upstream(fixture, function, inputs);
        if f.code != Some(0) || u.code != Some(0) || f.stdout != u.stdout {
            mismatches.push(format!(
                "{fixture}.{function} {inputs:?}:\n  ferrite ({:?}): {:?} {:?}\n  upstream ({:?}): {:?} {:?}",
                f.code, f.stdout, f.stderr, u.code, u.stdout, u.stderr
            ));
        }
    }
    println!(
        "differential: {} runs, {} mismatches",
        DIFFERENTIAL.len(),
        mismatches.len()
    );
    assert!(mismatches.is_empty(), "{}", mismatches.join("\n"));
}

/// Upstream 3.13 reads the selected case of `switch.i64` as 32 bits
/// (sign-extended); Ferrite reads all 64. Cases whose value fits in i32, and
/// the default, agree.
#[test]
fn switch_i64_wide_known_upstream_divergence() {
    upstream_bin();
    for (input, full) in [("0", 5_000_000_000i64), ("1", -6_000_000_000i64)] {
        let f = ferrite("control_flow", "switch_i64_wide", &[input]);
        let u = upstream("control_flow", "switch_i64_wide", &[input]);
        assert_eq!(f.code, Some(0), "{}", f.stderr);
        assert_eq!(u.code, Some(0), "{}", u.stderr);
        assert_eq!(
            f.stdout,
            format!("EXEC @switch_i64_wide\nresult[0]: i64={full}\n")
        );
        let truncated = full as i32 as i64;
        assert_eq!(
            u.stdout,
            format!("EXEC @switch_i64_wide\nresult[0]: i64={truncated}\n"),
            "upstream's switch.i64 behaviour changed; revisit this known divergence"
        );
    }
}
