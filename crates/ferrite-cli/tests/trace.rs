//! `--trace=FILE.json` of `run-module` and `benchmark-module`: the file
//! parses as Chrome trace JSON and holds the events of a known program (two
//! dependent matmuls, two dispatches) on local-sync and local-task.

use ferrite_testkit::{compile_file, workspace_root, GENERIC_CPU};
use serde_json::Value;
use std::path::PathBuf;

fn ferrite(args: &[String]) -> std::process::Output {
    std::process::Command::new(env!("CARGO_BIN_EXE_ferrite"))
        .args(args)
        .output()
        .expect("running ferrite")
}

/// The test program, compiled by the pinned compiler.
fn two_matmuls() -> PathBuf {
    let root = workspace_root();
    compile_file(
        &root.join("tests/trace/two_matmuls.mlir"),
        &root.join("target/test-programs/trace_two_matmuls.vmfb"),
        GENERIC_CPU,
    )
}

fn inputs() -> Vec<String> {
    vec![
        "--function=two_matmuls".into(),
        "--input=32x64xf32=1".into(),
        "--input=64x16xf32=1".into(),
        "--input=16x8xf32=1".into(),
    ]
}

/// Runs `tool` on `device` with `--trace` to `trace_TAG.json` and returns
/// the parsed file.
fn traced(tag: &str, tool: &str, device: &str, extra: &[&str]) -> Value {
    let dir = workspace_root().join("target/test-programs");
    let path = dir.join(format!("trace_{tag}.json"));
    let _ = std::fs::remove_file(&path);
    let mut args = vec![
        tool.to_string(),
        format!("--module={}", two_matmuls().display()),
        format!("--device={device}"),
        format!("--trace={}", path.display()),
    ];
    args.extend(inputs());
    args.extend(extra.iter().map(|s| s.to_string()));
    let o = ferrite(&args);
    assert!(
        o.status.success(),
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    );
    let text = std::fs::read_to_string(&path).expect("the trace file was written");
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("trace JSON does not parse: {e}\n{text}"))
}

fn events<'a>(trace: &'a Value, cat: &str) -> Vec<&'a Value> {
    trace["traceEvents"]
        .as_array()
        .expect("traceEvents")
        .iter()
        .filter(|e| e["cat"] == cat)
        .collect()
}

/// The name the trace gives thread `tid` of track `pid`.
fn thread_name(trace: &Value, pid: &Value, tid: &Value) -> String {
    trace["traceEvents"]
        .as_array()
        .unwrap()
        .iter()
        .find(|e| {
            e["ph"] == "M" && e["name"] == "thread_name" && &e["pid"] == pid && &e["tid"] == tid
        })
        .and_then(|e| e["args"]["name"].as_str())
        .unwrap_or_else(|| panic!("no name for thread {tid} of track {pid}"))
        .to_string()
}

/// What both devices must show for one call of the program.
fn check_common(trace: &Value, calls: usize) {
    for e in trace["traceEvents"].as_array().unwrap() {
        let ph = e["ph"].as_str().unwrap();
        assert!(["X", "i", "M"].contains(&ph), "unexpected phase: {e}");
        if ph == "X" {
            assert!(e["ts"].as_f64().unwrap() >= 0.0 && e["dur"].as_f64().unwrap() >= 0.0);
        }
    }
    // The module initializer runs while loading (recorded too: the
    // recording starts before the modules load).
    let mut invocations = events(trace, "invocation");
    invocations.retain(|e| e["name"] != "module.__init");
    assert_eq!(invocations.len(), calls, "one invocation span per call");
    assert!(invocations
        .iter()
        .all(|e| e["name"] == "module.two_matmuls"));
    let vm = events(trace, "vm");
    assert!(
        vm.iter().any(|e| e["name"] == "module.two_matmuls"
            && ["interpreted", "compiled"].contains(&e["args"]["tier"].as_str().unwrap())),
        "a VM function span for the called function: {vm:?}"
    );
    let dispatches = events(trace, "dispatch");
    assert_eq!(
        dispatches.len(),
        2 * calls,
        "two dispatches per call: {dispatches:?}"
    );
    let names: Vec<&str> = dispatches[..2]
        .iter()
        .map(|e| e["name"].as_str().unwrap())
        .collect();
    assert!(
        names[0].starts_with("two_matmuls_dispatch_0_matmul_32x16x64"),
        "{names:?}"
    );
    assert!(
        names[1].starts_with("two_matmuls_dispatch_1_matmul_32x8x16"),
        "{names:?}"
    );
    for d in &dispatches {
        let wg: Vec<u64> = d["args"]["workgroups"]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v.as_u64().unwrap())
            .collect();
        assert_eq!(wg.len(), 3);
        assert!(wg.iter().product::<u64>() >= 1);
        assert!(d["args"]["bytes"].as_u64().unwrap() > 0);
    }
    let queue = events(trace, "queue");
    assert!(
        queue.iter().any(|e| e["name"] == "execute"),
        "the command buffer's queue execute: {queue:?}"
    );
    let tracks: Vec<&str> = trace["traceEvents"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["name"] == "process_name")
        .map(|e| e["args"]["name"].as_str().unwrap())
        .collect();
    assert!(tracks.contains(&"host (VM)"), "{tracks:?}");
}

#[test]
fn local_sync_trace_has_invocation_vm_dispatch_and_queue_events() {
    let trace = traced("sync", "run-module", "local-sync", &["--output="]);
    check_common(&trace, 1);
    assert!(
        events(&trace, "tile").is_empty(),
        "local-sync runs each dispatch whole, on the caller"
    );
    let d = &events(&trace, "dispatch")[0];
    assert_eq!(thread_name(&trace, &d["pid"], &d["tid"]), "main");
}

#[test]
fn local_task_trace_shows_which_thread_ran_which_tiles() {
    let trace = traced(
        "task",
        "run-module",
        "local-task",
        &["--output=", "--task_topology_group_count=2"],
    );
    check_common(&trace, 1);
    let tiles = events(&trace, "tile");
    for d in events(&trace, "dispatch") {
        let total: u64 = d["args"]["workgroups"]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v.as_u64().unwrap())
            .product();
        // The tiles of this dispatch cover its workgroups exactly once.
        let mut ranges: Vec<(u64, u64)> = tiles
            .iter()
            .filter(|t| t["name"] == d["name"])
            .map(|t| {
                let r = t["args"]["workgroup_range"].as_array().unwrap();
                (r[0].as_u64().unwrap(), r[1].as_u64().unwrap())
            })
            .collect();
        ranges.sort();
        assert!(!ranges.is_empty(), "tiles of {}", d["name"]);
        let mut next = 0;
        for (a, b) in &ranges {
            assert_eq!(*a, next, "tile ranges of {}: {ranges:?}", d["name"]);
            next = *b;
        }
        assert_eq!(next, total, "tile ranges of {}: {ranges:?}", d["name"]);
        assert_eq!(d["args"]["tiles"].as_u64().unwrap(), ranges.len() as u64);
    }
    // Each tile is on the thread that ran it: a pool worker, or a thread
    // that lent itself while waiting.
    for t in &tiles {
        let name = thread_name(&trace, &t["pid"], &t["tid"]);
        assert!(
            name.starts_with("ferrite-worker-") || name == "main",
            "tile on an unexpected thread '{name}'"
        );
        assert!(t["args"]["processor_id"].as_u64().is_some());
    }
}

#[test]
fn benchmark_module_traces_every_call() {
    let trace = traced(
        "bench",
        "benchmark-module",
        "local-sync",
        &["--benchmark_min_time=3x", "--benchmark_repetitions=1"],
    );
    let calls = events(&trace, "invocation")
        .iter()
        .filter(|e| e["name"] != "module.__init")
        .count();
    assert!(calls >= 3, "at least the three timed calls: {calls}");
    check_common(&trace, calls);
}

#[test]
fn unwritable_trace_path_is_an_error_naming_it() {
    let mut args = vec![
        "run-module".to_string(),
        format!("--module={}", two_matmuls().display()),
        "--device=local-sync".into(),
        "--trace=/nonexistent-dir/t.json".into(),
    ];
    args.extend(inputs());
    let o = ferrite(&args);
    assert!(!o.status.success());
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains("--trace=/nonexistent-dir/t.json"), "{err}");
}

#[test]
fn profile_summarizes_a_trace_and_draws_its_timeline() {
    let _ = traced(
        "profile",
        "run-module",
        "local-task",
        &["--output=", "--repeat=3"],
    );
    let dir = workspace_root().join("target/test-programs");
    let json = dir.join("trace_profile.json");
    let png = dir.join("trace_profile.png");
    let _ = std::fs::remove_file(&png);
    let o = ferrite(&[
        "profile".into(),
        json.display().to_string(),
        format!("--png={}", png.display()),
    ]);
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(
        o.status.success(),
        "{out}{}",
        String::from_utf8_lossy(&o.stderr)
    );
    assert!(out.contains("3 invocation(s)"), "{out}");
    assert!(out.contains("dispatches: 6 in"), "{out}");
    for export in [
        "two_matmuls_dispatch_0_matmul_32x16x64_f32",
        "two_matmuls_dispatch_1_matmul_32x8x16_f32",
    ] {
        let row = out
            .lines()
            .find(|l| l.ends_with(export))
            .unwrap_or_else(|| panic!("a row for {export}:\n{out}"));
        assert!(row.contains("      3 "), "three calls of {export}: {row}");
    }
    assert!(out.contains("execute"), "{out}");
    assert!(out.contains("threads running tiles"), "{out}");
    // A PNG of the documented width.
    let bytes = std::fs::read(&png).expect("the PNG was written");
    assert_eq!(&bytes[..8], b"\x89PNG\r\n\x1a\n");
    assert_eq!(&bytes[12..16], b"IHDR");
    assert_eq!(u32::from_be_bytes(bytes[16..20].try_into().unwrap()), 1600);

    let o = ferrite(&["profile".into(), "/nonexistent/t.json".into()]);
    assert!(!o.status.success());
    assert!(String::from_utf8_lossy(&o.stderr).contains("reading trace '/nonexistent/t.json'"));
}

/// Runs the program with `env` set; (exit code, stdout, stderr).
fn run_with_env(device: &str, extra: &[&str], env: &[(&str, &str)]) -> (i32, String, String) {
    let mut cmd = std::process::Command::new(env!("CARGO_BIN_EXE_ferrite"));
    cmd.arg("run-module")
        .arg(format!("--module={}", two_matmuls().display()))
        .arg(format!("--device={device}"))
        .args(inputs())
        .args(extra);
    for (k, v) in env {
        cmd.env(k, v);
    }
    let o = cmd.output().expect("running ferrite");
    (
        o.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&o.stdout).into_owned(),
        String::from_utf8_lossy(&o.stderr).into_owned(),
    )
}

#[test]
fn a_failed_dispatch_reaches_the_waiter_with_its_origin() {
    // FERRITE_FAIL_DISPATCH makes the second dispatch fail inside the
    // queue work; the program's fence wait must report that status, with
    // the export, the queue operation and the device, not a bare abort.
    for device in ["local-sync", "local-task"] {
        let (code, _, err) = run_with_env(
            device,
            &["--output=", "--trace=/dev/null"],
            &[("FERRITE_FAIL_DISPATCH", "*dispatch_1*")],
        );
        assert_eq!(code, 1, "{err}");
        for want in [
            "INTERNAL; injected dispatch failure (FERRITE_FAIL_DISPATCH=*dispatch_1*)",
            "dispatch 'two_matmuls_dispatch_1_matmul_32x8x16_f32' (workgroups ",
            "queue execute",
            &format!("on device '{device}'"),
            "in native function 'hal.fence.await'",
        ] {
            assert!(err.contains(want), "{device}: '{want}' in:\n{err}");
        }
        assert!(!err.contains("ABORTED"), "{err}");
    }
    // Unset, the same run succeeds (the failure was the injected one).
    let (code, _, err) = run_with_env("local-task", &["--output="], &[]);
    assert_eq!(code, 0, "{err}");
}

#[test]
fn print_device_statistics_has_upstream_heading_and_rows_per_export() {
    let (code, _, err) = run_with_env(
        "local-task",
        &[
            "--output=",
            "--print_device_statistics",
            "--task_topology_group_count=2",
        ],
        &[],
    );
    assert_eq!(code, 0, "{err}");
    let lines: Vec<&str> = err.lines().collect();
    let at = lines
        .iter()
        .position(|l| *l == "IREE HAL device statistics:")
        .unwrap_or_else(|| panic!("upstream's heading in:\n{err}"));
    assert_eq!(lines[at + 1], "  aggregate_rows=5", "{err}");
    assert!(
        lines[at + 2].starts_with("  dispatch_function_total="),
        "{err}"
    );
    for export in [
        "two_matmuls_dispatch_0_matmul_32x16x64_f32",
        "two_matmuls_dispatch_1_matmul_32x8x16_f32",
    ] {
        let row = lines
            .iter()
            .find(|l| l.starts_with(&format!("  host_execute p=0 {export}  count=1 total=")))
            .unwrap_or_else(|| panic!("a row for {export} in:\n{err}"));
        assert!(row.contains(" tiles="), "{row}");
    }
    assert!(
        lines
            .iter()
            .any(|l| l.starts_with("  host_execute_queue p=0 q=0 execute  count=1 total=")),
        "{err}"
    );
    assert!(
        lines.contains(&"  host_execute_queue p=0 q=0 alloca  count=2 payload=3072B"),
        "{err}"
    );
}
