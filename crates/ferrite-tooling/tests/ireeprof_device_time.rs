//! `.ireeprof` bundles of a device that times its own work (cuda): a
//! recording shaped as `ferrite-hal-cuda` records one (dispatch spans
//! marked `device_time`, `clock` samples of its reference events, an
//! execute timed on the device, its command buffer described) is written
//! as upstream's device-timestamped dispatch events with clock
//! correlations, and the pinned `iree-profile` reads them as such: the
//! dispatches counted as device dispatches joined to their commands, the
//! clock samples fitted. The GPU suite (scripts/test-gpu.sh) does the same
//! from a real cuda run; this checks the writer without a GPU.

use ferrite_base::trace::{Arg, Event, Phase, Trace};
use ferrite_testkit::venv_tool;
use ferrite_tooling::ireeprof::{bundle, Families};
use std::process::Command;

const EXE: u64 = 0x5000;

fn event(phase: Phase, cat: &'static str, name: &str, ts: u64, dur: u64) -> Event {
    Event {
        phase,
        cat,
        name: name.to_string(),
        ts_ns: ts,
        dur_ns: dur,
        track: 2,
        thread: 1,
        args: Vec::new(),
    }
}

fn with(mut e: Event, args: Vec<(&'static str, Arg)>) -> Event {
    e.args = args;
    e
}

fn dispatch_args(command: u64, device_time: bool) -> Vec<(&'static str, Arg)> {
    let mut args = vec![
        ("workgroups", Arg::List(vec![4, 1, 1])),
        ("command", Arg::U64(command)),
        ("executable", Arg::U64(EXE)),
        ("function", Arg::U64(command / 2)),
        ("functions", Arg::U64(2)),
        ("workgroup_size", Arg::List(vec![32, 1, 1])),
        ("constants", Arg::U64(0)),
        ("bindings", Arg::U64(2)),
    ];
    if device_time {
        args.push(("device_time", Arg::U64(1)));
    }
    args
}

/// One execute of a three-command buffer (dispatch, barrier, dispatch),
/// its dispatches timed by the device or not.
fn recording(device_time: bool) -> Trace {
    let mut t = Trace::default();
    t.tracks.insert(1, "host (VM)".into());
    t.tracks.insert(2, "device cuda://0".into());
    let i = Phase::Instant;
    let c = Phase::Complete;
    t.events.push(with(
        event(i, "command_buffer", "command buffer 7", 100, 0),
        vec![
            ("command_buffer", Arg::U64(7)),
            ("mode", Arg::U64(1)),
            ("categories", Arg::U64(3)),
            ("queue_affinity", Arg::U64(u64::MAX)),
            ("commands", Arg::U64(3)),
        ],
    ));
    for (index, name) in [(0u64, "k0"), (1, "barrier"), (2, "k1")] {
        let mut args = vec![("command_buffer", Arg::U64(7)), ("index", Arg::U64(index))];
        if name == "barrier" {
            args.push(("op", Arg::Str("barrier".into())));
        } else {
            args.push(("op", Arg::Str("dispatch".into())));
            args.extend(
                dispatch_args(index, false)
                    .into_iter()
                    .filter(|(k, _)| *k != "command"),
            );
        }
        t.events.push(with(event(i, "command", name, 100, 0), args));
    }
    // Only a device that times its own work samples its clock.
    let samples = if device_time {
        &[1_000u64, 40_000][..]
    } else {
        &[]
    };
    for (k, &tick) in samples.iter().enumerate() {
        t.events.push(with(
            event(i, "clock", "clock sample", tick, 0),
            vec![
                ("device_ns", Arg::U64(tick)),
                ("begin_ns", Arg::U64(tick - 5 - k as u64)),
                ("end_ns", Arg::U64(tick + 5)),
            ],
        ));
    }
    let timed = |mut args: Vec<(&'static str, Arg)>| {
        if device_time {
            args.push(("device_time", Arg::U64(1)));
        }
        args
    };
    t.events.push(with(
        event(c, "dispatch", "k0", 6_000, 2_000),
        dispatch_args(0, device_time),
    ));
    t.events.push(with(
        event(c, "dispatch", "k1", 9_000, 3_000),
        dispatch_args(2, device_time),
    ));
    t.events.push(with(
        event(c, "queue", "fill", 2_000, 1_500),
        timed(vec![("bytes", Arg::U64(64))]),
    ));
    t.events.push(with(
        event(c, "queue", "execute", 5_000, 10_000),
        timed(vec![("command_buffer", Arg::U64(7))]),
    ));
    t
}

fn profile(command: &str, file: &std::path::Path) -> String {
    let o = Command::new(venv_tool("iree-profile"))
        .arg(command)
        .arg(file)
        .output()
        .expect("running iree-profile");
    let out = String::from_utf8_lossy(&o.stdout).into_owned() + &String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success(), "iree-profile {command}:\n{out}");
    out
}

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

fn write(name: &str, device_time: bool) -> std::path::PathBuf {
    write_with(
        name,
        device_time,
        "queue-events,host-execution,dispatch-events",
    )
}

fn write_with(name: &str, device_time: bool, mode: &str) -> std::path::PathBuf {
    let dir = ferrite_testkit::workspace_root().join("target/test-programs");
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join(name);
    let families = Families::parse(mode).unwrap();
    std::fs::write(&path, bundle(&recording(device_time), families)).unwrap();
    path
}

/// One `device_event=` line of `iree-profile queue`: type, submission,
/// command buffer, ops, ticks, valid, and ns (absent when the tool fitted
/// no clock).
#[derive(Debug)]
struct DeviceEvent {
    fields: [String; 6],
    ns: Option<String>,
}

fn device_events(queue: &str) -> Vec<DeviceEvent> {
    queue
        .lines()
        .map(str::trim)
        .filter(|l| l.starts_with("device_event="))
        .map(|l| {
            let get = |key: &str| {
                l.split_whitespace()
                    .find_map(|w| w.strip_prefix(&format!("{key}=")))
                    .map(str::to_string)
            };
            DeviceEvent {
                fields: [
                    "type",
                    "submission",
                    "command_buffer",
                    "ops",
                    "ticks",
                    "valid",
                ]
                .map(|k| get(k).unwrap_or_else(|| panic!("no {k}= in '{l}'"))),
                ns: get("ns"),
            }
        })
        .collect()
}

#[test]
fn device_timed_dispatches_are_device_dispatch_events() {
    let file = write("device_time.ireeprof", true);
    let summary = profile("summary", &file);
    assert_field(&summary, "records:", "unknown", "0");
    assert_field(&summary, "chunks:", "dispatch_events", "1");
    assert_eq!(field(&summary, "chunks:", "clock_correlations"), "1");
    // Two samples a tick per nanosecond apart: the device clock fitted.
    assert!(summary.contains("clock_samples=2"), "{summary}");
    assert!(summary.contains("clock_fit: ns_per_tick="), "{summary}");
    let dispatch = profile("dispatch", &file);
    assert_field(&dispatch, "dispatches:", "total", "2");
    assert_field(&dispatch, "dispatches:", "valid", "2");
    assert_field(&dispatch, "host_dispatches:", "total", "0");
    for export in ["k0", "k1"] {
        assert!(
            dispatch.lines().any(|l| l.trim() == export),
            "{export} in:\n{dispatch}"
        );
    }
    let command = profile("command", &file);
    assert_field(&command, "command_buffers=", "matched_dispatches", "2");
}

#[test]
fn host_timed_dispatches_stay_host_execution_events() {
    // The CPU devices' shape: no device_time, no dispatch-events chunk.
    let file = write("host_time.ireeprof", false);
    let summary = profile("summary", &file);
    assert_field(&summary, "chunks:", "dispatch_events", "0");
    let dispatch = profile("dispatch", &file);
    assert_field(&dispatch, "host_dispatches:", "total", "2");
    assert_field(&dispatch, "dispatches:", "total", "0");
}

#[test]
fn device_timed_queue_operations_are_queue_device_events() {
    let file = write_with(
        "device_queue.ireeprof",
        true,
        "queue-events,host-execution,device-queue-events,dispatch-events",
    );
    let summary = profile("summary", &file);
    assert_field(&summary, "records:", "unknown", "0");
    assert_field(&summary, "chunks:", "queue_device_events", "1");
    assert_field(&summary, "event_records:", "queue_device_events", "2");
    // Device-timed work did not run on the host: no host execution events.
    assert_field(&summary, "event_records:", "host_execution_events", "0");
    let queue = profile("queue", &file);
    assert_field(&queue, "queues=", "queue_device_events", "2");
    assert_field(&queue, "queues=", "queue_events", "2");
    let events = device_events(&queue);
    assert_eq!(
        events.iter().map(|e| e.fields.clone()).collect::<Vec<_>>(),
        [
            ["fill", "1", "0", "1", "1500", "true"].map(String::from),
            ["execute", "2", "7", "3", "10000", "true"].map(String::from),
        ],
        "{queue}"
    );
    // The device clock fitted from the clock samples: durations in ns
    // (the samples are a tick per nanosecond, give or take their brackets).
    for (e, ticks) in events.iter().zip([1_500i64, 10_000]) {
        let ns: i64 =
            e.ns.as_deref()
                .expect("ns= with a clock fit")
                .parse()
                .unwrap();
        assert!((ns - ticks).abs() <= 2, "{e:?} in:\n{queue}");
    }
    // The dispatches stay device dispatch events.
    let dispatch = profile("dispatch", &file);
    assert_field(&dispatch, "dispatches:", "valid", "2");
}

#[test]
fn cpu_queue_operations_are_queue_device_events_on_the_host_clock() {
    // The CPU devices' shape (no device times, no clock samples): their
    // queue work ran on the host, whose clock is theirs.
    let file = write_with(
        "device_queue_host.ireeprof",
        false,
        "queue-events,host-execution,device-queue-events",
    );
    let summary = profile("summary", &file);
    assert_field(&summary, "records:", "unknown", "0");
    assert_field(&summary, "event_records:", "queue_device_events", "2");
    // Host-run work stays host execution events as well (2 operations, 2
    // dispatches).
    assert_field(&summary, "event_records:", "host_execution_events", "4");
    let queue = profile("queue", &file);
    let events = device_events(&queue);
    assert_eq!(events.len(), 2, "{queue}");
    // Exact: one nanosecond per tick.
    for (e, ns) in events.iter().zip(["1500", "10000"]) {
        assert_eq!(e.fields[4], ns, "{queue}");
        assert_eq!(e.ns.as_deref(), Some(ns), "{queue}");
    }
}
