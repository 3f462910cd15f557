//! `--device_profiling_mode` / `--device_profiling_output`: `.ireeprof`
//! bundles from local-sync and local-task, read back by the pinned
//! `iree-profile` (summary, dispatch, queue, command, memory, export) and
//! rendered to Perfetto by the pinned `iree-profile-render`; the counts
//! equal what ran (two dispatches, one execute, two allocas), the command
//! buffer's commands are listed with their exports, and allocations pair
//! with their release, as upstream's records of the same programs.

use ferrite_testkit::{compile_file, venv_tool, workspace_root, GENERIC_CPU};
use std::path::{Path, PathBuf};
use std::process::Command;

fn program() -> PathBuf {
    let root = workspace_root();
    compile_file(
        &root.join("tests/trace/two_matmuls.mlir"),
        &root.join("target/test-programs/trace_two_matmuls.vmfb"),
        GENERIC_CPU,
    )
}

/// Runs `cmd`, failing the test with its output unless it succeeds; stdout
/// then stderr.
fn ok(cmd: &mut Command) -> String {
    let o = cmd.output().expect("running a tool");
    let out = String::from_utf8_lossy(&o.stdout).into_owned() + &String::from_utf8_lossy(&o.stderr);
    assert!(
        o.status.success(),
        "{cmd:?}\n{out}{}",
        String::from_utf8_lossy(&o.stderr)
    );
    out
}

/// Runs `tool` (`run-module`, `benchmark-module`) on the program's
/// two_matmuls with its three inputs on `device`, recording into
/// `target/test-programs/NAME.ireeprof` (removed first); `args` are the
/// tool's other flags. The recording's path.
fn record(tool: &str, name: &str, device: &str, args: &[&str]) -> PathBuf {
    let path = workspace_root().join(format!("target/test-programs/{name}.ireeprof"));
    let _ = std::fs::remove_file(&path);
    ok(Command::new(env!("CARGO_BIN_EXE_ferrite"))
        .arg(tool)
        .arg(format!("--module={}", program().display()))
        .arg(format!("--device={device}"))
        .args([
            "--function=two_matmuls",
            "--input=32x64xf32=1",
            "--input=64x16xf32=1",
            "--input=16x8xf32=1",
        ])
        .arg(format!("--device_profiling_output={}", path.display()))
        .args(args));
    path
}

fn bundle(device: &str, extra: &[&str]) -> PathBuf {
    let mut args = vec![
        "--output=",
        "--device_profiling_mode=queue-events,host-execution,dispatch-events,memory-events",
    ];
    args.extend_from_slice(extra);
    record("run-module", &format!("profile_{device}"), device, &args)
}

fn profile(command: &str, file: &Path) -> String {
    ok(Command::new(venv_tool("iree-profile"))
        .arg(command)
        .arg(file))
}

/// The `key=value` after `prefix` on the line that starts with it.
fn field(text: &str, line_start: &str, key: &str) -> String {
    let line = text
        .lines()
        .find(|l| l.trim_start().starts_with(line_start))
        .unwrap_or_else(|| panic!("no line '{line_start}' in:\n{text}"));
    line.split_whitespace()
        .find_map(|w| w.strip_prefix(&format!("{key}=")))
        .unwrap_or_else(|| panic!("no {key}= in '{line}'"))
        .to_string()
}

/// Asserts that `field(text, line_start, key)` is `want`, printing `text`
/// when it is not.
fn assert_field(text: &str, line_start: &str, key: &str, want: &str) {
    assert_eq!(field(text, line_start, key), want, "{text}");
}

fn check(device: &str, workers: &[&str]) {
    let file = bundle(device, workers);
    let summary = profile("summary", &file);
    assert_field(&summary, "records:", "session_end", "1");
    assert_field(&summary, "records:", "non_ok_session_end", "0");
    assert_field(&summary, "records:", "unknown", "0");
    assert_field(&summary, "event_records:", "host_execution_events", "4");
    assert_field(
        &summary,
        "event_records:",
        "invalid_host_execution_events",
        "0",
    );
    assert_field(&summary, "metadata_records:", "executable_functions", "2");

    let dispatch = profile("dispatch", &file);
    assert_field(&dispatch, "host_dispatches:", "total", "2");
    assert_field(&dispatch, "host_dispatches:", "valid", "2");
    for export in [
        "two_matmuls_dispatch_0_matmul_32x16x64_f32",
        "two_matmuls_dispatch_1_matmul_32x8x16_f32",
    ] {
        assert!(
            dispatch.lines().any(|l| l.trim() == export),
            "{export} in:\n{dispatch}"
        );
    }
    assert!(dispatch.contains("workgroup_count=4x1x1"), "{dispatch}");

    let queue = profile("queue", &file);
    assert_field(&queue, "queues=", "queue_events", "4");
    assert!(queue.contains("type=execute"), "{queue}");
    assert!(queue.contains("type=alloca"), "{queue}");

    // The program's one command buffer: its four commands (two dispatches,
    // each followed by a barrier) with the exports and workgroup counts
    // recorded, and both dispatches that ran joined to their commands.
    let command = profile("command", &file);
    assert_field(&command, "command_buffers=", "host_valid", "2");
    assert_field(&command, "command_buffers=", "command_buffers", "1");
    assert_field(&command, "command_buffers=", "command_operations", "4");
    assert_field(&command, "command_buffers=", "matched_host_dispatches", "2");
    let ops: Vec<String> = command
        .lines()
        .filter(|l| l.trim_start().starts_with("command["))
        .map(|l| {
            let op = field(l, "command[", "op");
            match op.as_str() {
                "dispatch" => format!(
                    "{op} {} {}",
                    field(l, "command[", "key"),
                    field(l, "command[", "workgroups")
                ),
                _ => op,
            }
        })
        .collect();
    assert_eq!(
        ops,
        [
            "dispatch two_matmuls_dispatch_0_matmul_32x16x64_f32 [4,1,1]",
            "barrier",
            "dispatch two_matmuls_dispatch_1_matmul_32x8x16_f32 [4,1,1]",
            "barrier"
        ],
        "{command}"
    );
    assert_field(&command, "host_submission=", "dispatches", "2");

    // Two queue allocations (1 KiB, 2 KiB), the 2 KiB one released by the
    // program: paired into two lifetimes, one still open at the end. The
    // queue pool served both from fresh blocks (two slabs, kept by the pool
    // at the end) and took both back (the 1 KiB result when the tool
    // dropped it): six lifetimes, three open.
    let memory = profile("memory", &file);
    assert!(memory.contains("queue_alloca/dealloca=2/1"), "{memory}");
    assert!(memory.contains("slab_acquire/release=2/0"), "{memory}");
    assert!(
        memory.contains("pool_reserve/materialize/release/wait=2/2/2/0"),
        "{memory}"
    );
    assert_field(&memory, "events:", "allocation_lifecycles", "6");
    assert_field(&memory, "events:", "open_lifecycles", "3");
    for (key, want) in [
        ("open_at_end", "0"),
        ("peak_open", "2"),
        ("high_water_bytes", "3072"),
        ("closed_bytes", "3072"),
    ] {
        assert_eq!(
            field(&memory, "pool_reservations:", key),
            want,
            "{key}: {memory}"
        );
    }
    for (key, want) in [
        ("open_at_end", "1"),
        ("peak_open", "2"),
        ("current_bytes", "1024"),
        ("high_water_bytes", "3072"),
        ("closed_bytes", "2048"),
    ] {
        assert_eq!(
            field(&memory, "queue_inflight_allocations:", key),
            want,
            "{key}: {memory}"
        );
    }

    let jsonl = file.with_extension("ireeperf.jsonl");
    ok(Command::new(venv_tool("iree-profile"))
        .args(["export", "--format=ireeperf-jsonl"])
        .arg(format!("--output={}", jsonl.display()))
        .arg(&file));
    let text = std::fs::read_to_string(&jsonl).unwrap();
    assert!(text.lines().count() > 10, "{text}");
    // Dispatch events name their command buffer and command (0 and 2).
    let mut indices: Vec<String> = text
        .lines()
        .filter(|l| l.contains(r#""record_type":"host_execution_event""#))
        .filter(|l| l.contains(r#""op":"dispatch""#))
        .map(|l| {
            assert!(!l.contains(r#""command_buffer_id":0,"#), "{l}");
            let at = l.find(r#""command_index":"#).expect(l) + 16;
            l[at..].split(',').next().unwrap().to_string()
        })
        .collect();
    indices.sort();
    assert_eq!(indices, ["0", "2"], "{text}");
    let pftrace = file.with_extension("pftrace");
    let rendered = ok(Command::new(venv_tool("iree-profile-render"))
        .arg("--format=perfetto")
        .arg("-o")
        .arg(&pftrace)
        .arg(&jsonl));
    assert!(rendered.contains("host_execution_slices=4"), "{rendered}");
    assert!(std::fs::metadata(&pftrace).unwrap().len() > 0);
}

#[test]
fn local_sync_bundle_reads_back_in_upstreams_tools() {
    check("local-sync", &[]);
}

#[test]
fn local_task_bundle_reads_back_in_upstreams_tools() {
    check("local-task", &["--task_topology_group_count=2"]);
    // Per-dispatch tiles (upstream's CPU devices refuse dispatch-events).
    let dispatch = profile(
        "dispatch",
        &bundle("local-task", &["--task_topology_group_count=2"]),
    );
    let tiles: Vec<u64> = dispatch
        .lines()
        .filter(|l| l.contains("tile_count="))
        .map(|l| field(l, "time_ns:", "tile_count").parse().unwrap())
        .collect();
    assert_eq!(tiles.len(), 2, "{dispatch}");
    assert!(tiles.iter().all(|&t| t >= 1), "{dispatch}");
}

/// Writes a bundle of `function` of `mlir` (under tests/trace) run by
/// `tool` (Ferrite's `run-module` or the pinned `iree-run-module`) on
/// `device`; returns its path.
fn bundle_of(tool: &str, device: &str, mlir: &str, function: &str, inputs: &[&str]) -> PathBuf {
    let root = workspace_root();
    let dir = root.join("target/test-programs");
    let module = compile_file(
        &root.join("tests/trace").join(format!("{mlir}.mlir")),
        &dir.join(format!("trace_{mlir}.vmfb")),
        GENERIC_CPU,
    );
    let path = dir.join(format!("profile_{mlir}_{tool}_{device}.ireeprof"));
    let _ = std::fs::remove_file(&path);
    let mut cmd = if tool == "ferrite" {
        let mut c = Command::new(env!("CARGO_BIN_EXE_ferrite"));
        c.arg("run-module");
        c
    } else {
        Command::new(venv_tool("iree-run-module"))
    };
    ok(cmd
        .arg(format!("--module={}", module.display()))
        .arg(format!("--device={device}"))
        .arg(format!("--function={function}"))
        .args(inputs)
        .arg("--device_profiling_mode=queue-events,host-execution,memory-events")
        .arg(format!("--device_profiling_output={}", path.display())));
    path
}

/// The lines of `iree-profile command` that describe commands, and the
/// queue allocation line of `iree-profile memory`.
fn commands_and_allocations(file: &Path) -> (Vec<String>, String) {
    let command = profile("command", file);
    let lines: Vec<String> = command
        .lines()
        .filter(|l| l.trim_start().starts_with("command["))
        .map(|l| l.trim().to_string())
        .collect();
    assert!(!lines.is_empty(), "{command}");
    let memory = profile("memory", file);
    let allocations = memory
        .lines()
        .find(|l| l.trim_start().starts_with("queue_inflight_allocations:"))
        .unwrap_or_else(|| panic!("{memory}"))
        .trim()
        .to_string();
    (lines, allocations)
}

/// Ferrite's command records (kind, flags, export, bindings, workgroups,
/// offsets, lengths) and queue allocation lifetimes read back exactly as
/// upstream's for the same program: a dispatch program and a transfer
/// program. Upstream's `local-task` is the reference for both devices
/// (its `local-sync` writes no command records).
#[test]
fn command_and_allocation_records_equal_upstreams() {
    let two_matmuls = [
        "--input=32x64xf32=1",
        "--input=64x16xf32=1",
        "--input=16x8xf32=1",
    ];
    let transfers = ["--input=64xf32=1", "--input=64xf32=2"];
    for (mlir, function, inputs) in [
        ("two_matmuls", "two_matmuls", &two_matmuls[..]),
        ("copies_and_fill", "copies_and_fill", &transfers[..]),
    ] {
        let upstream =
            commands_and_allocations(&bundle_of("upstream", "local-task", mlir, function, inputs));
        for device in ["local-sync", "local-task"] {
            let ours =
                commands_and_allocations(&bundle_of("ferrite", device, mlir, function, inputs));
            assert_eq!(ours, upstream, "{mlir} on {device}");
        }
    }
}

/// The `memory_event` records of `iree-profile memory --format=jsonl` as
/// (type, result, allocation id, backing id).
fn memory_events(file: &Path) -> Vec<(String, i64, u64, u64)> {
    ok(Command::new(venv_tool("iree-profile"))
        .args(["memory", "--format=jsonl"])
        .arg(file))
    .lines()
    .filter(|l| l.contains(r#""type":"memory_event""#))
    .map(|l| {
        let num = |key: &str| -> i64 {
            let at = l.find(&format!("\"{key}\":")).expect(key) + key.len() + 3;
            l[at..].split([',', '}']).next().unwrap().parse().unwrap()
        };
        let kind = l.split(r#""event_type":""#).nth(1).unwrap();
        (
            kind[..kind.find('"').unwrap()].to_string(),
            num("result"),
            num("allocation_id") as u64,
            num("backing_id") as u64,
        )
    })
    .collect()
}

/// A program that allocates, frees and allocates the same sizes again
/// (three calls of two_matmuls: a warm-up and two timed): the pool's events
/// show the first call's two fresh blocks and their reuse by the later
/// calls, with counts and peaks as they happened, on both CPU devices.
#[test]
fn pool_reuse_shows_in_memory_events() {
    for device in ["local-sync", "local-task"] {
        let path = record(
            "benchmark-module",
            &format!("profile_reuse_{device}"),
            device,
            &[
                "--benchmark_min_time=2x",
                "--device_profiling_mode=memory-events",
            ],
        );
        let memory = profile("memory", &path);
        for counts in [
            "slab_acquire/release=2/0",
            "pool_reserve/materialize/release/wait=6/6/6/0",
            "queue_alloca/dealloca=6/3",
        ] {
            assert!(memory.contains(counts), "{device}: {counts} in\n{memory}");
        }
        // Never more than one call's two blocks (1 KiB + 2 KiB) at once.
        for (line, key, want) in [
            ("pool_reservations:", "peak_open", "2"),
            ("pool_reservations:", "high_water_bytes", "3072"),
            ("pool_reservations:", "opened_bytes", "9216"),
            ("pool_reservations:", "closed_bytes", "9216"),
            ("slab_provider_events:", "current_bytes", "3072"),
        ] {
            assert_eq!(
                field(&memory, line, key),
                want,
                "{device} {line} {key}: {memory}"
            );
        }
        let events = memory_events(&path);
        let reserves: Vec<&(String, i64, u64, u64)> =
            events.iter().filter(|e| e.0 == "pool_reserve").collect();
        // Upstream's acquire results: 1 a fresh block, 0 a reused one.
        let results: Vec<i64> = reserves.iter().map(|e| e.1).collect();
        assert_eq!(results, [1, 1, 0, 0, 0, 0], "{device}: {events:?}");
        // A reused block is one of the fresh ones (same backing), each
        // block reused by one allocation per later call.
        for r in &reserves[2..] {
            assert!(
                reserves[..2].iter().any(|f| f.3 == r.3),
                "{device}: {r:?} reuses no fresh block: {events:?}"
            );
        }
        assert_ne!(reserves[0].3, reserves[1].3);
        // Each reservation has the allocation id of the queue alloca it
        // served, and its block goes back under the same id.
        for r in &reserves {
            for kind in ["queue_alloca", "pool_materialize", "pool_release"] {
                assert_eq!(
                    events.iter().filter(|e| e.0 == kind && e.2 == r.2).count(),
                    1,
                    "{device}: {kind} of allocation {}: {events:?}",
                    r.2
                );
            }
        }
    }
}

#[test]
fn profiling_flags_are_checked() {
    let run = |args: &[&str]| {
        Command::new(env!("CARGO_BIN_EXE_ferrite"))
            .arg("run-module")
            .arg(format!("--module={}", program().display()))
            .args([
                "--function=two_matmuls",
                "--input=32x64xf32=1",
                "--input=64x16xf32=1",
                "--input=16x8xf32=1",
            ])
            .args(args)
            .output()
            .unwrap()
    };
    for (args, want) in [
        (
            &["--device_profiling_mode=queue-events"][..],
            "needs --device_profiling_output",
        ),
        (
            &["--device_profiling_output=/tmp/x.ireeprof"][..],
            "needs --device_profiling_mode",
        ),
        (
            &[
                "--device_profiling_mode=device-metrics",
                "--device_profiling_output=/tmp/x.ireeprof",
            ][..],
            "'device-metrics'",
        ),
    ] {
        let o = run(args);
        assert!(!o.status.success());
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(err.contains(want), "{args:?}: {err}");
    }
}
