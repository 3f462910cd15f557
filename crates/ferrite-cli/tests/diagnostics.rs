//! `--trace_execution` and `--print_statistics` of `run-module` and
//! `benchmark-module`.
//!
//! The pinned `iree-run-module` (the pip build) has execution tracing
//! compiled out: with `--trace_execution` it prints nothing more. So the
//! trace is checked against the disassembly (`dump-module
//! --bytecode_offsets`), which follows upstream's: the op sequence of a
//! known function, block by block, in bytecode order (fused compare and
//! branch included), on both tiers. `--print_statistics` is compared with
//! upstream's report line by line, numbers aside.

#[path = "../../ferrite-vm/tests/common/mod.rs"]
mod common;

use ferrite_testkit::{compile_file, run_program, venv_tool, workspace_root, Output, GENERIC_CPU};
use std::path::PathBuf;
use std::time::Duration;

fn ferrite_bin() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_ferrite"))
}

fn ferrite(args: &[String], env: &[(&str, &str)]) -> Output {
    let mut cmd = std::process::Command::new(ferrite_bin());
    cmd.args(args);
    for (k, v) in env {
        cmd.env(k, v);
    }
    let o = cmd.output().expect("running ferrite");
    Output {
        code: o.status.code(),
        stdout: String::from_utf8_lossy(&o.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&o.stderr).into_owned(),
    }
}

/// `(offset, text)` of each op of `function`, block markers included, from
/// `dump-module --bytecode_offsets`.
fn disassembly(fixture: &str, function: &str) -> Vec<(u32, String)> {
    let o = ferrite(
        &[
            "dump-module".into(),
            "--output=disassembly".into(),
            "--bytecode_offsets".into(),
            format!("--function={function}"),
            common::fixture_path(fixture).display().to_string(),
        ],
        &[],
    );
    assert_eq!(o.code, Some(0), "{}", o.stderr);
    o.stdout
        .lines()
        .filter_map(|l| {
            let rest = l.strip_prefix('[')?;
            let (hex, text) = rest.split_once(']')?;
            Some((u32::from_str_radix(hex, 16).ok()?, text.trim().to_string()))
        })
        .collect()
}

/// The trace lines of one call: `(module.function, offset, text)`.
fn trace(fixture: &str, function: &str, env: &[(&str, &str)]) -> Vec<(String, u32, String)> {
    let o = ferrite(
        &[
            "run-module".into(),
            format!("--module={}", common::fixture_path(fixture).display()),
            format!("--function={function}"),
            "--trace_execution".into(),
        ],
        env,
    );
    assert_eq!(o.code, Some(0), "{}{}", o.stdout, o.stderr);
    assert_eq!(
        o.stdout,
        format!("EXEC @{function}\n"),
        "the trace goes to stderr"
    );
    o.stderr
        .lines()
        .map(|l| {
            // `[module.function+OFFSET]    text`, as upstream formats it.
            let rest = l
                .strip_prefix('[')
                .unwrap_or_else(|| panic!("bad line {l:?}"));
            let (head, text) = rest
                .split_once("]    ")
                .unwrap_or_else(|| panic!("bad line {l:?}"));
            let (name, hex) = head.rsplit_once('+').unwrap();
            assert_eq!(hex.len(), 8, "offset as 8 hex digits: {l:?}");
            assert_eq!(hex, hex.to_ascii_uppercase(), "{l:?}");
            (
                name.to_string(),
                u32::from_str_radix(hex, 16).unwrap(),
                text.to_string(),
            )
        })
        .collect()
}

/// `control_flow.test_loop_block_args` sums 1..10 in a loop: the trace is
/// its entry block (marker included), the loop body ten times, then the
/// exit blocks without their markers (branches land after a marker, as
/// upstream's interpreter), in bytecode order: the compares the
/// interpreter fuses with their branches appear where the bytecode has
/// them. The same on both tiers (the compiling tier steps aside).
#[test]
fn trace_follows_the_bytecode_of_a_known_loop_on_both_tiers() {
    let dis = disassembly("control_flow", "test_loop_block_args");
    let mut blocks: Vec<Vec<(u32, String)>> = Vec::new();
    for (off, text) in dis {
        if text.starts_with("^bb") {
            blocks.push(Vec::new());
        }
        blocks.last_mut().unwrap().push((off, text));
    }
    assert_eq!(blocks.len(), 5, "{blocks:?}");
    let mut want: Vec<(u32, String)> = blocks[0].clone();
    for _ in 0..10 {
        want.extend(blocks[1][1..].iter().cloned());
    }
    want.extend(blocks[2][1..].iter().cloned());
    want.extend(blocks[3][1..].iter().cloned());
    for tier in ["1", "0"] {
        let got = trace(
            "control_flow",
            "test_loop_block_args",
            &[("FERRITE_VM_JIT", tier)],
        );
        assert!(got
            .iter()
            .all(|(f, _, _)| f == "control_flow.test_loop_block_args"));
        let got: Vec<(u32, String)> = got.into_iter().map(|(_, o, t)| (o, t)).collect();
        assert_eq!(got, want, "FERRITE_VM_JIT={tier}");
    }
}

/// Across calls between functions (exported and internal, named or
/// not): every traced line is an op of the function it names (offset and
/// text as the disassembly has them), and tracing leaves the output alone.
#[test]
fn traced_lines_are_ops_of_the_named_function_across_calls() {
    let listing = ferrite(
        &[
            "dump-module".into(),
            "--output=disassembly".into(),
            "--bytecode_offsets".into(),
            common::fixture_path("calls").display().to_string(),
        ],
        &[],
    );
    assert_eq!(listing.code, Some(0), "{}", listing.stderr);
    // Functions in ordinal order: (name, ops).
    let mut functions: Vec<(String, Vec<(u32, String)>)> = Vec::new();
    for l in listing.stdout.lines() {
        if let Some(rest) = l.strip_prefix("vm.func @") {
            let name = rest.split('(').next().unwrap().to_string();
            functions.push((name, Vec::new()));
        } else if let Some(rest) = l.strip_prefix('[') {
            let (hex, text) = rest.split_once(']').unwrap();
            let op = (
                u32::from_str_radix(hex, 16).unwrap(),
                text.trim().to_string(),
            );
            functions.last_mut().unwrap().1.push(op);
        }
    }
    let tests: Vec<String> = listing
        .stdout
        .lines()
        .filter_map(|l| l.strip_prefix("vm.export @"))
        .filter(|n| n.starts_with("test_") && !n.contains("yield") && !n.contains("unresolved"))
        .map(str::to_string)
        .collect();
    assert!(tests.len() >= 3, "{tests:?}");
    let mut seen = std::collections::BTreeSet::new();
    for t in &tests {
        let plain = ferrite(
            &[
                "run-module".into(),
                format!("--module={}", common::fixture_path("calls").display()),
                format!("--function={t}"),
            ],
            &[],
        );
        assert_eq!(plain.code, Some(0), "{}", plain.stderr);
        let got = trace("calls", t, &[]);
        assert!(!got.is_empty(), "{t}: no trace");
        for (f, off, text) in got {
            // `calls.name`, or `calls@N` for a function without a name.
            let ops = if let Some(n) = f.strip_prefix("calls@") {
                &functions[n.parse::<usize>().unwrap()].1
            } else {
                let name = f.strip_prefix("calls.").unwrap_or_else(|| panic!("{f}"));
                &functions
                    .iter()
                    .find(|(n, _)| n == name)
                    .unwrap_or_else(|| panic!("{f}"))
                    .1
            };
            assert!(
                ops.contains(&(off, text.clone())),
                "{t}: [{f}+{off:08X}] {text} is not an op of that function"
            );
            seen.insert(f);
        }
    }
    assert!(
        seen.len() > tests.len(),
        "calls into other functions are traced too: {seen:?}"
    );
}

fn add_module() -> PathBuf {
    let root = workspace_root();
    let dir = root.join("target/test-programs");
    std::fs::create_dir_all(&dir).unwrap();
    let src = dir.join("diagnostics_add.mlir");
    std::fs::write(
        &src,
        "func.func @add(%a: tensor<4xf32>, %b: tensor<4xf32>) -> tensor<4xf32> {\n  \
         %0 = arith.addf %a, %b : tensor<4xf32>\n  return %0 : tensor<4xf32>\n}\n",
    )
    .unwrap();
    let out = dir.join("diagnostics_add.vmfb");
    compile_file(&src, &out, GENERIC_CPU)
}

/// A report's lines with every number replaced by `N` and runs of spaces
/// kept (upstream pads the byte counts to a fixed width).
fn shape(report: &str) -> Vec<String> {
    report
        .lines()
        .map(|l| {
            let mut out = String::new();
            let mut digits = 0;
            for c in l.chars() {
                if c.is_ascii_digit() {
                    digits += 1;
                } else {
                    if digits > 0 {
                        // Keep the field width: N right-aligned in it.
                        out.push_str(&" ".repeat(digits - 1));
                        out.push('N');
                        digits = 0;
                    }
                    out.push(c);
                }
            }
            if digits > 0 {
                out.push_str(&" ".repeat(digits - 1));
                out.push('N');
            }
            out
        })
        .collect()
}

#[test]
fn print_statistics_has_upstream_layout() {
    let module = add_module();
    for device in ["local-sync", "local-task"] {
        let a: Vec<String> = vec![
            format!("--module={}", module.display()),
            format!("--device={device}"),
            "--function=add".into(),
            "--input=4xf32=1".into(),
            "--input=4xf32=2".into(),
            "--print_statistics".into(),
        ];
        let up = run_program(&venv_tool("iree-run-module"), &a, Duration::from_secs(60));
        let mut ours_args = vec!["run-module".to_string()];
        ours_args.extend(a.iter().cloned());
        let ours = ferrite(&ours_args, &[]);
        assert_eq!(up.code, Some(0), "{}", up.stderr);
        assert_eq!(ours.code, Some(0), "{}", ours.stderr);
        assert_eq!(ours.stdout, up.stdout);
        assert_eq!(
            shape(&ours.stderr),
            shape(&up.stderr),
            "ours:\n{}\nupstream:\n{}",
            ours.stderr,
            up.stderr
        );
        assert!(
            ours.stderr.starts_with(&format!("Device: {device}\n")),
            "{}",
            ours.stderr
        );
        // Everything the program allocated is freed by the time of the report.
        let device_row = ours
            .stderr
            .lines()
            .find(|l| l.starts_with("DEVICE_LOCAL:"))
            .unwrap();
        assert!(device_row.ends_with(" 0B live"), "{device_row}");
        assert!(!device_row.contains(" 0B allocated"), "{device_row}");
    }
    // benchmark-module prints it too, after the report; a program without a
    // device prints nothing.
    let b = ferrite(
        &[
            "benchmark-module".into(),
            format!("--module={}", module.display()),
            "--device=local-sync".into(),
            "--function=add".into(),
            "--input=4xf32=1".into(),
            "--input=4xf32=2".into(),
            "--benchmark_min_time=3x".into(),
            "--print_statistics".into(),
        ],
        &[],
    );
    assert_eq!(b.code, Some(0), "{}", b.stderr);
    assert!(
        b.stderr
            .contains("Device: local-sync\n[[ iree_hal_allocator_t memory statistics ]]\n"),
        "{}",
        b.stderr
    );
    let vm_only = ferrite(
        &[
            "run-module".into(),
            format!(
                "--module={}",
                common::fixture_path("control_flow").display()
            ),
            "--function=test_loop_block_args".into(),
            "--print_statistics".into(),
        ],
        &[],
    );
    assert_eq!(vm_only.code, Some(0));
    assert_eq!(vm_only.stderr, "");
}
