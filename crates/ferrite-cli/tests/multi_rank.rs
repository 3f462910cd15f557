//! Several devices and several ranks from the command line:
//! `run-module --spmd_ranks=N` runs a program with collectives on N ranks
//! in one process (`{rank}` in inputs and outputs, results under
//! `rank R:`), and a program compiled for two devices runs with two
//! `--device` flags, its cross-device transfers ordered by semaphores,
//! giving what upstream's `iree-run-module` gives on the same module.

use ferrite_testkit::{compile_file, run_program, venv_tool, Output, GENERIC_CPU};
use std::path::{Path, PathBuf};
use std::time::Duration;

fn source(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join(format!("../../tests/collectives/{name}.mlir"))
}

fn out_dir() -> PathBuf {
    ferrite_testkit::target_tmpdir!("multi-rank")
}

fn ferrite(args: &[String]) -> Output {
    let mut a = vec!["run-module".to_string()];
    a.extend_from_slice(args);
    run_program(
        Path::new(env!("CARGO_BIN_EXE_ferrite")),
        &a,
        Duration::from_secs(120),
    )
}

fn strings(v: &[&str]) -> Vec<String> {
    v.iter().map(|s| s.to_string()).collect()
}

#[test]
fn spmd_ranks_run_a_collective_program() {
    let vmfb = compile_file(
        &source("two_ranks"),
        &out_dir().join("two_ranks.vmfb"),
        GENERIC_CPU,
    );
    let module = format!("--module={}", vmfb.display());
    for device in ["local-sync", "local-task"] {
        let o = ferrite(&strings(&[
            &module,
            "--function=all_reduce_sum",
            "--spmd_ranks=2",
            &format!("--device={device}"),
            "--input=4xf32=1,2,3,{rank}",
        ]));
        assert!(o.success(), "{device}: {}{}", o.stdout, o.stderr);
        let per_rank = "result[0]: hal.buffer_view\n4xf32=2 4 6 1\n";
        assert_eq!(
            o.stdout,
            format!("EXEC @all_reduce_sum\nrank 0:\n{per_rank}rank 1:\n{per_rank}"),
            "{device}"
        );
    }
    // `{rank}` in --device: each rank creates its own device (the failing
    // rank's error names it with the rank's number).
    let o = ferrite(&strings(&[
        &module,
        "--function=all_reduce_sum",
        "--spmd_ranks=2",
        "--device=local-task",
        "--device=no-such-driver{rank}",
        "--input=4xf32=1,2,3,{rank}",
    ]));
    assert!(!o.success());
    let named = |r: u8| o.stderr.contains(&format!("device 'no-such-driver{r}'"));
    assert!(
        (named(0) || named(1)) && !o.stderr.contains("{rank}"),
        "{}",
        o.stderr
    );
    // Per-rank output files.
    let dir = out_dir();
    let o = ferrite(&strings(&[
        &module,
        "--function=swap",
        "--spmd_ranks=2",
        "--input=3xf32={rank}",
        &format!("--output=@{}/swapped_{{rank}}.bin", dir.display()),
    ]));
    assert!(o.success(), "{}{}", o.stdout, o.stderr);
    for r in 0..2u8 {
        let got = std::fs::read(dir.join(format!("swapped_{r}.bin"))).unwrap();
        let want: Vec<u8> = [1.0f32 - r as f32; 3]
            .iter()
            .flat_map(|v| v.to_le_bytes())
            .collect();
        assert_eq!(got, want, "rank {r} received the other rank's values");
    }
    // Per-rank expected outputs; rank 1's does not match.
    let o = ferrite(&strings(&[
        &module,
        "--function=swap",
        "--spmd_ranks=2",
        "--input=3xf32={rank}",
        "--expected_output=3xf32=0",
    ]));
    assert_eq!(o.code, Some(1), "{}{}", o.stdout, o.stderr);
    assert!(o.stdout.contains("rank 0:\n[FAILED]"), "{}", o.stdout);
    let o = ferrite(&strings(&[
        &module,
        "--function=swap",
        "--spmd_ranks=2",
        "--input=3xf32={rank}",
        "--expected_output=3xf32=1",
    ]));
    assert_eq!(o.code, Some(1), "{}{}", o.stdout, o.stderr);
    assert!(
        o.stdout.contains("rank 0:\n[SUCCESS]") && o.stdout.contains("rank 1:\n[FAILED]"),
        "{}",
        o.stdout
    );
    // Without ranks the program's channel cannot be made.
    let o = ferrite(&strings(&[
        &module,
        "--function=all_reduce_sum",
        "--device=local-sync",
        "--input=4xf32=1",
    ]));
    assert!(!o.success());
    assert!(
        o.stderr.contains("no channel provider was given"),
        "{}",
        o.stderr
    );
    let o = ferrite(&strings(&[&module, "--function=swap", "--spmd_ranks=0"]));
    assert!(
        o.stderr.contains("--spmd_ranks must be at least 1"),
        "{}",
        o.stderr
    );
}

#[test]
fn a_program_for_two_devices_matches_upstream() {
    let vmfb = compile_file(
        &source("two_devices"),
        &out_dir().join("two_devices.vmfb"),
        &[
            "--iree-hal-target-device=dev_a=local",
            "--iree-hal-target-device=dev_b=local",
            "--iree-hal-local-target-device-backends=llvm-cpu",
            "--iree-llvmcpu-target-cpu=generic",
        ],
    );
    let dir = out_dir();
    let x: Vec<f32> = (0..8192).map(|i| i as f32 * 0.25 - 100.0).collect();
    let raw = dir.join("hops_input.bin");
    std::fs::write(
        &raw,
        x.iter().flat_map(|v| v.to_le_bytes()).collect::<Vec<u8>>(),
    )
    .unwrap();
    let upstream_tool = venv_tool("iree-run-module");
    for devices in [["local-task", "local-task"], ["local-sync", "local-task"]] {
        let dev: Vec<String> = devices.iter().map(|d| format!("--device={d}")).collect();
        let main = [
            vec![
                format!("--module={}", vmfb.display()),
                "--function=main".into(),
            ],
            dev.clone(),
            strings(&["--input=4xf32=1,2,3,4", "--input=4xf32=10,20,30,40"]),
        ]
        .concat();
        let ours = ferrite(&main);
        let theirs = run_program(&upstream_tool, &main, Duration::from_secs(120));
        assert!(ours.success(), "{devices:?}: {}", ours.stderr);
        assert_eq!(
            ours.stdout,
            "EXEC @main\nresult[0]: hal.buffer_view\n4xf32=11 42 93 164\n"
        );
        assert_eq!(ours.stdout, theirs.stdout, "{devices:?}");

        let hops = |name: &str| {
            [
                vec![
                    format!("--module={}", vmfb.display()),
                    "--function=hops".into(),
                ],
                dev.clone(),
                vec![
                    format!("--input=8192xf32=@{}", raw.display()),
                    format!("--output=@{}", dir.join(name).display()),
                ],
            ]
            .concat()
        };
        let ours = ferrite(&hops("hops_ferrite.npy"));
        assert!(ours.success(), "{devices:?}: {}", ours.stderr);
        let theirs = run_program(
            &upstream_tool,
            &hops("hops_upstream.npy"),
            Duration::from_secs(120),
        );
        assert!(theirs.success(), "{}", theirs.stderr);
        let ours = std::fs::read(dir.join("hops_ferrite.npy")).unwrap();
        assert_eq!(
            ours,
            std::fs::read(dir.join("hops_upstream.npy")).unwrap(),
            "{devices:?}"
        );
        // ((x * x) + x) * 2 - x, exactly as f32 computes it.
        let want: Vec<u8> = x
            .iter()
            .flat_map(|&v| {
                let s = v * v + v;
                ((s + s) - v).to_le_bytes()
            })
            .collect();
        assert_eq!(&ours[ours.len() - want.len()..], &want[..], "{devices:?}");
    }
}
