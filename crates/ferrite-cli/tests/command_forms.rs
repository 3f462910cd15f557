//! Every command-buffer form the pinned compiler emits, in a program of our
//! own (`tests/hal/command_forms.mlir`): reusable command buffers run with
//! binding tables, fills and copies after dispatches, several stages,
//! kernels writing a rodata-initialised constant in place, and one-shot
//! command buffers with direct bindings.
//!
//! The test first checks that the compiled module really holds each form
//! (a program that silently stopped emitting one would make this test
//! vacuous), then runs every function on both CPU devices, in both module
//! modes and both VM tiers, three calls in a row (memoized command buffers
//! and constants written in place are reused), and requires output equal to
//! upstream's `iree-run-module` on the same device.
//!
//! Before the fix of the transfer rule, local-task refused
//! `concat_after_dispatch` ("buffer is in use by device work"); before the
//! copy-on-write module map, `insert_into_constant` died of SIGSEGV in the
//! default module mode on both devices.

use ferrite_testkit::{compile_file, run_program, venv_tool, workspace_root, GENERIC_CPU};
use std::path::{Path, PathBuf};
use std::time::Duration;

fn module() -> PathBuf {
    let src = workspace_root().join("tests/hal/command_forms.mlir");
    let out = ferrite_testkit::target_tmpdir!("command-forms").join("command_forms.vmfb");
    compile_file(&src, &out, GENERIC_CPU)
}

/// `SHAPExf32=...` with `n` deterministic, non-uniform values (a uniform
/// input would hide a wrong row or column).
fn values(shape: &str, n: usize, seed: u32) -> String {
    let v: Vec<String> = (0..n as u32)
        .map(|i| {
            let h = i
                .wrapping_mul(2_654_435_761)
                .wrapping_add(seed.wrapping_mul(40_503))
                >> 20;
            format!("{}", (h % 64) as f32 / 8.0 - 4.0)
        })
        .collect();
    format!("{shape}xf32={}", v.join(","))
}

/// (function, inputs)
fn cases() -> Vec<(&'static str, Vec<String>)> {
    vec![
        (
            "insert_into_constant",
            vec!["2x3xi32=-1,-2,-3,-4,-5,-6".into()],
        ),
        ("insert_constants", vec![]),
        ("pad", vec![values("3x4", 12, 1)]),
        (
            "concat_after_dispatch",
            vec![values("4", 4, 2), values("4", 4, 3)],
        ),
        (
            "stages",
            vec![values("8x16", 128, 4), values("16x4", 64, 5)],
        ),
        ("dynamic_pad", vec![values("5", 5, 6)]),
    ]
}

fn args(module: &Path, function: &str, inputs: &[String], device: &str) -> Vec<String> {
    let mut v = vec![
        format!("--module={}", module.display()),
        format!("--function={function}"),
        format!("--device={device}"),
    ];
    v.extend(inputs.iter().map(|i| format!("--input={i}")));
    v
}

#[test]
fn the_module_holds_every_form() {
    let module = module();
    let out = run_program(
        &venv_tool("iree-dump-module"),
        &[
            "--output=disassembly".to_string(),
            module.display().to_string(),
        ],
        Duration::from_secs(60),
    );
    assert_eq!(out.code, Some(0), "iree-dump-module failed: {}", out.stderr);
    // Calls only (`vm.call @hal.x(` or `vm.call.variadic @hal.x segments`),
    // not the import declarations.
    let count = |what: &str| {
        out.stdout
            .lines()
            .filter(|l| {
                l.contains("vm.call") && l.contains(&format!("{what}("))
                    || l.contains("vm.call") && l.contains(&format!("{what} "))
            })
            .count()
    };
    for form in [
        "@hal.command_buffer.dispatch",
        "@hal.command_buffer.execution_barrier",
        "@hal.command_buffer.copy_buffer",
        "@hal.command_buffer.fill_buffer",
        "@hal.command_buffer.finalize",
        "@hal.device.queue.execute.indirect",
        "@hal.device.queue.execute",
        "@hal.allocator.import",
    ] {
        assert!(
            count(form) > 0,
            "tests/hal/command_forms.mlir no longer compiles to a module calling {form}: \
             the test would not exercise that form"
        );
    }
    // Several stages: at least one command buffer with two barriers.
    assert!(
        count("@hal.command_buffer.execution_barrier") >= 2,
        "no command buffer with several stages"
    );
}

#[test]
fn every_form_matches_upstream_on_both_cpu_devices_in_both_module_modes() {
    let module = module();
    let ferrite = Path::new(env!("CARGO_BIN_EXE_ferrite"));
    let mut failures = Vec::new();
    for (function, inputs) in cases() {
        for device in ["local-sync", "local-task"] {
            let up = run_program(
                &venv_tool("iree-run-module"),
                &args(&module, function, &inputs, device),
                Duration::from_secs(60),
            );
            assert_eq!(
                up.code,
                Some(0),
                "upstream iree-run-module {function} on {device} failed:\n{}",
                up.stderr
            );
            for mode in ["mmap", "preload"] {
                for jit in ["true", "false"] {
                    let mut a = vec!["run-module".to_string()];
                    a.extend(args(&module, function, &inputs, device));
                    a.push(format!("--module_mode={mode}"));
                    a.push(format!("--vm_jit={jit}"));
                    a.push("--repeat=3".to_string());
                    let fe = run_program(ferrite, &a, Duration::from_secs(60));
                    let what =
                        format!("{function} on {device}, --module_mode={mode} --vm_jit={jit}");
                    if fe.code != Some(0) {
                        failures.push(format!(
                            "{what}: exit {:?}\n{}{}",
                            fe.code, fe.stdout, fe.stderr
                        ));
                    } else if fe.stdout != up.stdout {
                        failures.push(format!(
                            "{what}: output differs\n--- upstream\n{}--- ferrite\n{}",
                            up.stdout, fe.stdout
                        ));
                    }
                }
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n\n"));
}
