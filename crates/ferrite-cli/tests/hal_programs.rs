//! Our own HAL programs (`tests/hal/*.mlir`), compiled at test time for a
//! generic x86-64 CPU, run through `ferrite run-module` and upstream's
//! `iree-run-module` (pinned in `.venv/bin`) with the same inputs on
//! `local-sync` and `local-task`: stdout must be identical. Then bad input:
//! wrong rank, shape, element type or argument count give an error naming
//! the argument with expected vs received (the text upstream prints), and a
//! device we lack is reported with the devices we have.

use ferrite_testkit::{compile_file, run_program, venv_tool, workspace_root, Output, GENERIC_CPU};
use std::path::{Path, PathBuf};
use std::time::Duration;

/// Compiles `tests/hal/<name>.mlir` with `flags` (once per source change)
/// into `<name><suffix>.vmfb`.
fn compile_with(name: &str, suffix: &str, flags: &[&str]) -> PathBuf {
    let src = workspace_root()
        .join("tests/hal")
        .join(format!("{name}.mlir"));
    let out = ferrite_testkit::target_tmpdir!("hal-programs").join(format!("{name}{suffix}.vmfb"));
    compile_file(&src, &out, flags)
}

/// Compiles for the local llvm-cpu target with a portable CPU.
fn compile(name: &str) -> PathBuf {
    compile_with(name, "", GENERIC_CPU)
}

fn tool_args(
    module: &Path,
    function: &str,
    inputs: &[String],
    device: Option<&str>,
) -> Vec<String> {
    let mut v = vec![
        format!("--module={}", module.display()),
        format!("--function={function}"),
    ];
    if let Some(d) = device {
        v.push(format!("--device={d}"));
    }
    v.extend(inputs.iter().map(|i| format!("--input={i}")));
    v
}

fn ferrite(module: &Path, function: &str, inputs: &[String], device: Option<&str>) -> Output {
    let mut a = vec!["run-module".to_string()];
    a.extend(tool_args(module, function, inputs, device));
    run_program(
        Path::new(env!("CARGO_BIN_EXE_ferrite")),
        &a,
        Duration::from_secs(120),
    )
}

fn upstream(module: &Path, function: &str, inputs: &[String], device: Option<&str>) -> Output {
    run_program(
        &venv_tool("iree-run-module"),
        &tool_args(module, function, inputs, device),
        Duration::from_secs(120),
    )
}

const DEVICES: [&str; 2] = ["local-sync", "local-task"];

/// Runs `program.function` through both tools on both devices and asserts
/// success and identical stdout. Returns upstream's stdout (local-sync).
fn differential(program: &str, function: &str, inputs: &[String]) -> String {
    let module = compile(program);
    let mut first = None;
    for device in DEVICES {
        let up = upstream(&module, function, inputs, Some(device));
        assert_eq!(
            up.code,
            Some(0),
            "upstream iree-run-module {program}.{function} on {device} failed:\n{}",
            up.stderr
        );
        let fe = ferrite(&module, function, inputs, Some(device));
        assert_eq!(
            fe.code,
            Some(0),
            "ferrite run-module {program}.{function} on {device} failed:\n{}{}",
            fe.stdout,
            fe.stderr
        );
        assert!(
            fe.stdout == up.stdout,
            "{program}.{function} on {device}: stdout differs\n--- upstream\n{}\n--- ferrite\n{}",
            up.stdout,
            fe.stdout
        );
        first.get_or_insert(up.stdout);
    }
    first.unwrap()
}

/// `SHAPExTYPE=v0,v1,...` with `n` values from `f(i)`.
fn tensor(spec: &str, n: usize, f: impl Fn(usize) -> String) -> String {
    let values: Vec<String> = (0..n).map(f).collect();
    format!("{spec}={}", values.join(","))
}

/// Deterministic non-trivial f32 values in about [-2, 2], printed with all
/// their digits.
fn fvals(spec: &str, n: usize, seed: u32) -> String {
    tensor(spec, n, |i| {
        let mut s = (i as u32)
            .wrapping_mul(2_654_435_761)
            .wrapping_add(seed.wrapping_mul(40_503));
        s ^= s >> 13;
        s = s.wrapping_mul(0x5bd1_e995);
        s ^= s >> 15;
        let v = (s % 40_000) as f32 / 10_000.0 - 2.0;
        format!("{v}")
    })
}

// ---------------------------------------------------------------------------
// Differential runs

#[test]
fn matmul_32x64_times_64x16() {
    let out = differential(
        "matmul",
        "matmul",
        &[
            fvals("32x64xf32", 32 * 64, 1),
            fvals("64x16xf32", 64 * 16, 2),
        ],
    );
    assert!(
        out.starts_with("EXEC @matmul\nresult[0]: hal.buffer_view\n32x16xf32=["),
        "{out}"
    );
}

#[test]
fn conv2d_nhwc() {
    let out = differential(
        "conv2d",
        "conv2d",
        &[
            fvals("1x8x8x3xf32", 8 * 8 * 3, 3),
            fvals("3x3x3x4xf32", 3 * 3 * 3 * 4, 4),
        ],
    );
    assert!(out.contains("1x6x6x4xf32="), "{out}");
}

#[test]
fn elementwise_chain() {
    let out = differential(
        "elementwise",
        "chain",
        &[fvals("4x8xf32", 32, 5), fvals("4x8xf32", 32, 6)],
    );
    assert!(out.contains("4x8xf32="), "{out}");
    // Splat inputs and special values (inf, nan, signed zero).
    differential(
        "elementwise",
        "chain",
        &[
            tensor("4x8xf32", 32, |i| {
                ["0", "-0", "inf", "-inf", "nan", "1e-38", "3.4e38", "-1.5"][i % 8].to_string()
            }),
            "4x8xf32=0.75".to_string(),
        ],
    );
}

#[test]
fn reduction_sum_over_axis() {
    let out = differential("reduction", "row_sum", &[fvals("8x16xf32", 128, 7)]);
    assert!(out.contains("result[0]: hal.buffer_view\n8xf32="), "{out}");
}

#[test]
fn dynamic_shapes() {
    for n in [1usize, 7, 1000] {
        let spec = format!("{n}xf32");
        differential(
            "dynamic",
            "fma1",
            &[fvals(&spec, n, 8 + n as u32), fvals(&spec, n, 9)],
        );
        differential("dynamic", "sum_squares", &[fvals(&spec, n, 10)]);
    }
    // Empty tensors.
    let out = differential(
        "dynamic",
        "fma1",
        &["0xf32=".to_string(), "0xf32=".to_string()],
    );
    assert!(out.contains("0xf32="), "{out}");
    let out = differential("dynamic", "sum_squares", &["0xf32=".to_string()]);
    assert!(out.contains("f32=0"), "{out}");
}

#[test]
fn integer_i8_matmul_to_i32() {
    let out = differential(
        "int8",
        "qmatmul",
        &[
            tensor("4x8xi8", 32, |i| {
                format!("{}", ((i * 37) % 256) as i32 - 128)
            }),
            tensor("8x4xi8", 32, |i| {
                format!("{}", ((i * 91 + 13) % 255) as i32 - 127)
            }),
            tensor("4x4xi32", 16, |i| format!("{}", (i as i32 - 8) * 100_003)),
        ],
    );
    assert!(out.contains("4x4xi32="), "{out}");
}

#[test]
fn empty_and_fill() {
    for v in ["2.5", "-0", "1e-45", "-3.4028235e38"] {
        let out = differential("fill", "splat", &[v.to_string()]);
        assert!(out.contains("3x5xf32="), "{out}");
    }
    differential(
        "fill",
        "offset",
        &["6xi32=1,2,3,-4,-5,2147483640".to_string()],
    );
}

#[test]
fn several_results() {
    let out = differential(
        "multi_result",
        "several",
        &[
            fvals("5xf32", 5, 11),
            fvals("5xf32", 5, 12),
            "-123456".to_string(),
        ],
    );
    for i in 0..5 {
        assert!(out.contains(&format!("result[{i}]: ")), "{out}");
    }
    assert!(out.contains("result[4]: i32=-246912"), "{out}");
}

// ---------------------------------------------------------------------------
// Bad input

/// The diagnostic of an `iree-run-module` error: the text after the status
/// code, up to where upstream starts naming its own call stack.
fn upstream_diagnostic(stderr: &str, code: &str) -> String {
    let start = stderr
        .find(&format!("{code}; "))
        .unwrap_or_else(|| panic!("no {code} in upstream's stderr:\n{stderr}"))
        + code.len()
        + 2;
    let rest = &stderr[start..];
    let end = ["; while ", "; invoking", "; parsing", "\n"]
        .iter()
        .filter_map(|m| rest.find(m))
        .min()
        .unwrap_or(rest.len());
    rest[..end].to_string()
}

/// Both tools fail on both devices; Ferrite's stderr carries upstream's
/// diagnostic (which names the argument, expected and received), and
/// anything in `also`.
fn rejected_like_upstream(program: &str, function: &str, inputs: &[String], also: &[&str]) {
    let module = compile(program);
    for device in DEVICES {
        let up = upstream(&module, function, inputs, Some(device));
        assert_ne!(up.code, Some(0), "upstream accepted {inputs:?}");
        let want = upstream_diagnostic(&up.stderr, "INVALID_ARGUMENT");
        let fe = ferrite(&module, function, inputs, Some(device));
        assert_eq!(
            fe.code,
            Some(1),
            "ferrite {program}.{function} {inputs:?} on {device}:\n{}{}",
            fe.stdout,
            fe.stderr
        );
        assert!(
            fe.stderr.starts_with("INVALID_ARGUMENT; "),
            "ferrite's error does not start with the status code:\n{}",
            fe.stderr
        );
        assert!(
            fe.stderr.contains(&want),
            "on {device}: ferrite's error does not carry upstream's diagnostic\n  upstream: {want}\n  ferrite:  {}",
            fe.stderr
        );
        for a in also {
            assert!(
                fe.stderr.contains(a),
                "ferrite's error lacks {a:?}:\n{}",
                fe.stderr
            );
        }
        assert_eq!(fe.stdout, up.stdout, "stdout before the error differs");
        assert!(!fe.stderr.contains("panicked"), "{}", fe.stderr);
    }
}

#[test]
fn wrong_input_rank() {
    rejected_like_upstream(
        "dynamic",
        "fma1",
        &["5x2xf32=1".to_string(), "5xf32=0.5".to_string()],
        &["input0 shape rank mismatch; expected 1 but have 2"],
    );
    rejected_like_upstream(
        "matmul",
        "matmul",
        &["32x64xf32=1".to_string(), "1024xf32=1".to_string()],
        &["input1 shape rank mismatch; expected 2 but have 1"],
    );
}

#[test]
fn wrong_input_shape() {
    rejected_like_upstream(
        "add",
        "add",
        &["99999xf32=1".to_string(), "100000xf32=2".to_string()],
        &["input0 shape dimension 0 mismatch; expected 100000 but have 99999"],
    );
    rejected_like_upstream(
        "matmul",
        "matmul",
        &["32x64xf32=1".to_string(), "64x17xf32=1".to_string()],
        &["input1 shape dimension 1 mismatch; expected 16 but have 17"],
    );
}

#[test]
fn wrong_input_element_type() {
    rejected_like_upstream(
        "dynamic",
        "fma1",
        &["5xi32=1".to_string(), "5xf32=0.5".to_string()],
        &["input0 element type mismatch; expected f32", "but have i32"],
    );
    rejected_like_upstream(
        "int8",
        "qmatmul",
        &[
            "4x8xi8=1".to_string(),
            "8x4xi8=1".to_string(),
            "4x4xf32=1".to_string(),
        ],
        &["input2 element type mismatch; expected i32", "but have f32"],
    );
}

#[test]
fn wrong_input_count() {
    rejected_like_upstream(
        "dynamic",
        "fma1",
        &["5xf32=1".to_string()],
        &[
            "expected 2 arguments but passed 1",
            // The signature, as upstream prints it.
            "`sync func @fma1(",
        ],
    );
}

/// A program that uses no HAL device still takes tensor inputs (upstream's
/// e2e `regression/unused_args.mlir`; Ferrite refused them: "the program
/// uses no HAL device").
#[test]
fn tensors_for_a_program_without_a_device() {
    let out = differential(
        "unused_arg",
        "second",
        &["4xf32=0".to_string(), "4xf32=1,2,3,4".to_string()],
    );
    assert!(out.contains("4xf32=1 2 3 4"), "{out}");
}

/// Without `--function`, a module with one exported function runs it (as
/// upstream); with several, the error names them.
#[test]
fn run_module_without_function() {
    let add = compile("add");
    let inputs = ["100000xf32=1".to_string(), "100000xf32=2".to_string()];
    let mut a = vec![
        "run-module".to_string(),
        format!("--module={}", add.display()),
    ];
    a.extend(inputs.iter().map(|i| format!("--input={i}")));
    let up = run_program(
        &venv_tool("iree-run-module"),
        &a[1..],
        Duration::from_secs(60),
    );
    let fe = run_program(
        Path::new(env!("CARGO_BIN_EXE_ferrite")),
        &a,
        Duration::from_secs(60),
    );
    assert_eq!(up.code, Some(0), "{}", up.stderr);
    assert_eq!(fe.code, Some(0), "{}", fe.stderr);
    assert_eq!(fe.stdout, up.stdout);
    let several = compile("fill");
    let fe = run_program(
        Path::new(env!("CARGO_BIN_EXE_ferrite")),
        &[
            "run-module".to_string(),
            format!("--module={}", several.display()),
        ],
        Duration::from_secs(60),
    );
    assert_eq!(fe.code, Some(1), "{}", fe.stdout);
    assert!(
        fe.stderr.contains("--function= must be specified")
            && fe.stderr.contains("splat")
            && fe.stderr.contains("offset"),
        "{}",
        fe.stderr
    );
}

#[test]
fn tensor_input_for_scalar_argument_is_an_error() {
    // Upstream 3.13 reads `5xf32=1` for an i32 argument as the number 5
    // (a strtol prefix); Ferrite rejects it, naming the input text.
    let module = compile("multi_result");
    let inputs = [
        "5xf32=1".to_string(),
        "5xf32=1".to_string(),
        "5xf32=1".to_string(),
    ];
    let fe = ferrite(&module, "several", &inputs, Some("local-sync"));
    assert_eq!(fe.code, Some(1), "{}{}", fe.stdout, fe.stderr);
    assert!(fe.stderr.starts_with("INVALID_ARGUMENT; "), "{}", fe.stderr);
    assert!(fe.stderr.contains("`5xf32=1`"), "{}", fe.stderr);
}

/// Where libcuda cannot be loaded, `--device=cuda` says so (not "unknown
/// device"); on a machine with a GPU the same run succeeds.
#[test]
fn cuda_without_a_driver_says_so() {
    let module = compile("add");
    let inputs = ["100000xf32=1".to_string(), "100000xf32=2".to_string()];
    let fe = ferrite(&module, "add", &inputs, Some("cuda"));
    assert!(!fe.stderr.contains("panicked"), "{}", fe.stderr);
    // Never "device 'cuda' is not available": the driver is registered.
    assert!(!fe.stderr.contains("is not available"), "{}", fe.stderr);
    if !fe.stderr.contains("no CUDA driver found") {
        // libcuda loaded (a GPU machine): the CPU-only module has no
        // variant for it, which is an error too, but not this one.
        assert_eq!(fe.code, Some(1), "{}{}", fe.stdout, fe.stderr);
        eprintln!("libcuda present: {}", fe.stderr.trim());
    } else {
        assert_eq!(fe.code, Some(1), "{}{}", fe.stdout, fe.stderr);
    }
}

#[test]
fn unavailable_device_lists_available_ones() {
    let module = compile("add");
    let inputs = ["100000xf32=1".to_string(), "100000xf32=2".to_string()];
    // Drivers Ferrite lacks (cuda exists: see the next test).
    for device in ["metal", "vulkan", "local-async"] {
        let fe = ferrite(&module, "add", &inputs, Some(device));
        assert_eq!(fe.code, Some(1), "{}{}", fe.stdout, fe.stderr);
        assert!(fe.stdout.is_empty(), "{}", fe.stdout);
        assert!(fe.stderr.contains(&format!("'{device}'")), "{}", fe.stderr);
        assert!(
            fe.stderr.contains("local-sync") && fe.stderr.contains("local-task"),
            "the error does not list the available devices:\n{}",
            fe.stderr
        );
        assert!(!fe.stderr.contains("panicked"), "{}", fe.stderr);
    }
    // A typo gets a suggestion, and the context is said once.
    let fe = ferrite(&module, "add", &inputs, Some("local-snyc"));
    assert_eq!(fe.code, Some(1));
    assert!(
        fe.stderr.contains("did you mean 'local-sync'?"),
        "{}",
        fe.stderr
    );
    assert_eq!(
        fe.stderr.matches("creating device").count(),
        1,
        "{}",
        fe.stderr
    );
    // A device URI with a suffix is still a device we lack.
    let fe = ferrite(&module, "add", &inputs, Some("vulkan://0"));
    assert_eq!(fe.code, Some(1));
    assert!(fe.stderr.contains("vulkan"), "{}", fe.stderr);
    assert!(
        fe.stderr.contains("local-sync, local-task"),
        "{}",
        fe.stderr
    );
}

#[test]
fn module_compiled_for_a_device_we_lack() {
    // A module built only for CUDA, run on our default device: its
    // initializer finds no usable device. Upstream fails the same way
    // (INCOMPATIBLE naming the cuda target).
    let module = compile_with(
        "add",
        "_cuda",
        &["--iree-hal-target-device=cuda", "--iree-cuda-target=sm_80"],
    );
    let inputs = ["100000xf32=1".to_string(), "100000xf32=2".to_string()];
    for device in [None, Some("local-sync"), Some("local-task")] {
        let fe = ferrite(&module, "add", &inputs, device);
        assert_eq!(fe.code, Some(1), "{}{}", fe.stdout, fe.stderr);
        assert!(fe.stderr.starts_with("INCOMPATIBLE; "), "{}", fe.stderr);
        assert!(fe.stderr.contains("\"cuda\""), "{}", fe.stderr);
        assert!(!fe.stderr.contains("panicked"), "{}", fe.stderr);
    }
    let up = upstream(&module, "add", &inputs, Some("local-sync"));
    assert_ne!(up.code, Some(0));
    assert!(up.stderr.contains("INCOMPATIBLE"), "{}", up.stderr);
}

/// `hal.cpu` feature queries answer as upstream's: the host's bits once
/// the program loaded an executable, zeros in a program that loads none;
/// an unknown feature name fails the query (the program's default).
#[test]
fn cpu_feature_queries() {
    let with_exec = differential("cpu_features", "features", &[]);
    let bit = |out: &str, i: usize| out.contains(&format!("result[{i}]: i64=1"));
    assert_eq!(
        bit(&with_exec, 0),
        std::arch::is_x86_feature_detected!("sse3"),
        "{with_exec}"
    );
    assert_eq!(
        bit(&with_exec, 4),
        std::arch::is_x86_feature_detected!("avx2"),
        "{with_exec}"
    );
    assert!(with_exec.contains("result[10]: i64=7"), "{with_exec}");
    let without = differential("cpu_features_noexec", "features", &[]);
    assert!(!without.contains("i64=1"), "{without}");
    assert!(without.contains("result[10]: i64=7"), "{without}");
}
