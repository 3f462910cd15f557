//! `ferrite profile FILE.json`: what a person reads first about a trace
//! written by `--trace` (or `ferrite.runtime.stop_trace`): the wall time,
//! the top dispatches by total time with their count, mean, share of the
//! wall time and bytes bound, the queue operations, the waits and who
//! ended them, the VM functions, and the threads' busy time in tiles; with
//! `--png=OUT.png` a timeline picture (see [`crate::profile_png`]).
//!
//! Loading (the `load` spans: module loads with their verification and
//! compilation, parameter files, module registration with the module
//! initializers run inside it) is summarized on a line of its own and left
//! out of the rest, whose wall time starts after it: the tables are about
//! the calls.

use ferrite_base::{status, Result};
use serde_json::Value;
use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::PathBuf;

pub use crate::loaded_trace::{LoadedTrace, Span};

/// Options of `profile`.
#[derive(clap::Args, Debug)]
pub struct ProfileArgs {
    /// A Chrome/Perfetto JSON trace written by `--trace=FILE.json`.
    pub file: PathBuf,
    /// Rows shown per table.
    #[arg(long, default_value_t = 10)]
    pub top: usize,
    /// Also draws the timeline (one row per thread and device) to this PNG.
    #[arg(long, value_name = "OUT.png")]
    pub png: Option<PathBuf>,
}

/// Per-name totals of one category.
#[derive(Default, Clone)]
struct Totals {
    count: u64,
    total_us: f64,
    max_us: f64,
    bytes: u64,
    failed: u64,
    /// The workgroup counts seen (first one kept, and whether others differ).
    workgroups: Option<Vec<u64>>,
    workgroups_vary: bool,
}

fn totals(spans: &[Span], cat: &str) -> Vec<(String, Totals)> {
    let mut by: BTreeMap<&str, Totals> = BTreeMap::new();
    for s in spans.iter().filter(|s| s.cat == cat) {
        let t = by.entry(&s.name).or_default();
        t.count += 1;
        t.total_us += s.dur;
        t.max_us = t.max_us.max(s.dur);
        t.bytes += s.args.get("bytes").and_then(Value::as_u64).unwrap_or(0);
        t.failed += s.args.get("failed").is_some() as u64;
        if let Some(w) = s.args.get("workgroups").and_then(Value::as_array) {
            let w: Vec<u64> = w.iter().filter_map(Value::as_u64).collect();
            match &t.workgroups {
                None => t.workgroups = Some(w),
                Some(old) if *old != w => t.workgroups_vary = true,
                Some(_) => {}
            }
        }
    }
    let mut rows: Vec<(String, Totals)> = by.into_iter().map(|(k, v)| (k.to_string(), v)).collect();
    rows.sort_by(|a, b| b.1.total_us.total_cmp(&a.1.total_us));
    rows
}

/// A time in microseconds, in the unit that reads best.
fn fmt_us(us: f64) -> String {
    if us >= 1e6 {
        format!("{:.3} s", us / 1e6)
    } else if us >= 1e3 {
        format!("{:.3} ms", us / 1e3)
    } else {
        format!("{us:.1} us")
    }
}

fn fmt_bytes(b: u64) -> String {
    match b {
        b if b >= 1 << 30 => format!("{:.2} GiB", b as f64 / (1u64 << 30) as f64),
        b if b >= 1 << 20 => format!("{:.2} MiB", b as f64 / (1u64 << 20) as f64),
        b if b >= 1 << 10 => format!("{:.1} KiB", b as f64 / 1024.0),
        b => format!("{b} B"),
    }
}

/// Cuts `s` to `n` characters (an ellipsis marks the cut).
fn clip(s: &str, n: usize) -> String {
    if s.chars().count() <= n {
        s.to_string()
    } else {
        let mut out: String = s.chars().take(n.saturating_sub(1)).collect();
        out.push('…');
        out
    }
}

/// The text summary of `trace` (see the module docs), `top` rows a table.
pub fn summary(trace: &LoadedTrace, top: usize) -> String {
    let mut out = String::new();
    let (start, end) = trace.bounds();
    let wall = (end - start).max(0.0);
    let calls = trace.spans.iter().filter(|s| s.cat == "invocation").count();
    let in_calls: f64 = trace
        .spans
        .iter()
        .filter(|s| s.cat == "invocation")
        .map(|s| s.dur)
        .sum();
    let _ = writeln!(
        out,
        "wall time {} (first event to last), {calls} invocation(s) taking {}",
        fmt_us(wall),
        fmt_us(in_calls)
    );
    // Loading: the outermost load spans, each once.
    let outer: Vec<&Span> = trace
        .loads
        .iter()
        .filter(|s| {
            !trace
                .loads
                .iter()
                .any(|l| !std::ptr::eq(*s, l) && s.ts >= l.ts && s.ts + s.dur <= l.ts + l.dur)
        })
        .collect();
    if !outer.is_empty() {
        let total: f64 = outer.iter().map(|s| s.dur).sum();
        let list: Vec<String> = outer
            .iter()
            .map(|s| format!("{} {}", clip(&s.name, 60), fmt_us(s.dur)))
            .collect();
        let _ = writeln!(
            out,
            "loading (not in the wall time): {} in {} step(s): {}",
            fmt_us(total),
            outer.len(),
            list.join(", ")
        );
    }
    let devices: Vec<&str> = trace
        .tracks
        .values()
        .filter_map(|n| n.strip_prefix("device "))
        .collect();
    if !devices.is_empty() {
        let _ = writeln!(out, "devices: {}", devices.join(", "));
    }
    let share = |us: f64| if wall > 0.0 { 100.0 * us / wall } else { 0.0 };

    let dispatches = totals(&trace.spans, "dispatch");
    let all: f64 = dispatches.iter().map(|d| d.1.total_us).sum();
    let count: u64 = dispatches.iter().map(|d| d.1.count).sum();
    let _ = writeln!(
        out,
        "\ndispatches: {count} in {} ({:.1}% of wall time), {} distinct exports; top {} by total time:",
        fmt_us(all),
        share(all),
        dispatches.len(),
        top.min(dispatches.len())
    );
    if !dispatches.is_empty() {
        let _ = writeln!(
            out,
            "  {:>10} {:>6} {:>10} {:>10} {:>6} {:>11}  {:<14} export",
            "total", "count", "mean", "max", "wall%", "bytes/call", "workgroups"
        );
    }
    for (name, t) in dispatches.iter().take(top) {
        let wg = match (&t.workgroups, t.workgroups_vary) {
            (Some(w), false) => w.iter().map(u64::to_string).collect::<Vec<_>>().join("x"),
            (Some(_), true) => "varies".to_string(),
            (None, _) => "-".to_string(),
        };
        let failed = if t.failed > 0 {
            format!("  ({} failed)", t.failed)
        } else {
            String::new()
        };
        let _ = writeln!(
            out,
            "  {:>10} {:>6} {:>10} {:>10} {:>5.1}% {:>11}  {:<14} {}{failed}",
            fmt_us(t.total_us),
            t.count,
            fmt_us(t.total_us / t.count as f64),
            fmt_us(t.max_us),
            share(t.total_us),
            fmt_bytes(t.bytes / t.count.max(1)),
            wg,
            clip(name, 72)
        );
    }

    let queue = totals(&trace.spans, "queue");
    if !queue.is_empty() {
        let _ = writeln!(out, "\nqueue operations:");
        let _ = writeln!(
            out,
            "  {:>10} {:>6} {:>10} {:>6} {:>11}  operation",
            "total", "count", "mean", "wall%", "bytes"
        );
        for (name, t) in queue.iter().take(top) {
            let _ = writeln!(
                out,
                "  {:>10} {:>6} {:>10} {:>5.1}% {:>11}  {name}{}",
                fmt_us(t.total_us),
                t.count,
                fmt_us(t.total_us / t.count as f64),
                share(t.total_us),
                fmt_bytes(t.bytes),
                if t.failed > 0 {
                    format!("  ({} failed)", t.failed)
                } else {
                    String::new()
                }
            );
        }
    }

    let waits: Vec<&Span> = trace.spans.iter().filter(|s| s.cat == "wait").collect();
    if !waits.is_empty() {
        let total: f64 = waits.iter().map(|s| s.dur).sum();
        let _ = writeln!(
            out,
            "\nwaits: {} blocked for {} ({:.1}% of wall time); ended by:",
            waits.len(),
            fmt_us(total),
            share(total)
        );
        let mut by: BTreeMap<String, (u64, f64)> = BTreeMap::new();
        for w in &waits {
            let who = w
                .args
                .get("woken_by")
                .and_then(Value::as_str)
                .map_or_else(|| format!("({})", w.name), str::to_string);
            let e = by.entry(who).or_default();
            e.0 += 1;
            e.1 += w.dur;
        }
        let mut rows: Vec<_> = by.into_iter().collect();
        rows.sort_by(|a, b| b.1 .1.total_cmp(&a.1 .1));
        for (who, (n, us)) in rows.into_iter().take(top) {
            let _ = writeln!(out, "  {:>10} {n:>6}  {}", fmt_us(us), clip(&who, 90));
        }
    }

    let vm = totals(&trace.spans, "vm");
    if !vm.is_empty() {
        let _ = writeln!(out, "\nVM functions (inclusive time):");
        for (name, t) in vm.iter().take(top) {
            let _ = writeln!(
                out,
                "  {:>10} {:>6}  {}",
                fmt_us(t.total_us),
                t.count,
                clip(name, 90)
            );
        }
    }

    // Busy time in tiles per thread: how evenly a local-task pool shared
    // the dispatches.
    let mut busy: BTreeMap<(u64, u64), (u64, f64)> = BTreeMap::new();
    for s in trace.spans.iter().filter(|s| s.cat == "tile") {
        let e = busy.entry((s.pid, s.tid)).or_default();
        e.0 += 1;
        e.1 += s.dur;
    }
    if !busy.is_empty() {
        let _ = writeln!(out, "\nthreads running tiles:");
        for ((pid, tid), (n, us)) in busy {
            let name = trace
                .threads
                .get(&(pid, tid))
                .cloned()
                .unwrap_or_else(|| format!("thread {tid}"));
            let device = trace.tracks.get(&pid).cloned().unwrap_or_default();
            let _ = writeln!(
                out,
                "  {:>10} {n:>6} tiles  {:>5.1}% of wall  {name} ({device})",
                fmt_us(us),
                share(us)
            );
        }
    }
    out
}

/// Runs `profile`.
pub fn run(args: &ProfileArgs) -> Result<()> {
    let text = std::fs::read_to_string(&args.file)
        .map_err(|e| status!(NotFound, "reading trace '{}': {e}", args.file.display()))?;
    let trace = LoadedTrace::parse(&text)
        .map_err(|e| e.annotate(format!("reading trace '{}'", args.file.display())))?;
    print!("{}", summary(&trace, args.top.max(1)));
    if let Some(png) = &args.png {
        crate::profile_png::draw(&trace, png)?;
        println!("\ntimeline: {}", png.display());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A hand-made trace: 1 ms of wall time, export `a` twice for 200 us
    /// each (1 KiB bound each time), `b` once for 100 us, one queue execute.
    const TRACE: &str = r#"{"traceEvents":[
        {"ph":"M","name":"process_name","pid":2,"tid":0,"args":{"name":"device local-task"}},
        {"ph":"M","name":"thread_name","pid":2,"tid":5,"args":{"name":"ferrite-worker-0"}},
        {"ph":"X","cat":"invocation","name":"module.f","pid":1,"tid":1,"ts":0,"dur":1000},
        {"ph":"X","cat":"dispatch","name":"b","pid":2,"tid":9,"ts":50,"dur":100,"args":{"workgroups":[1,1,1],"bytes":64}},
        {"ph":"X","cat":"dispatch","name":"a","pid":2,"tid":9,"ts":200,"dur":200,"args":{"workgroups":[4,1,1],"bytes":1024}},
        {"ph":"X","cat":"dispatch","name":"a","pid":2,"tid":9,"ts":500,"dur":200,"args":{"workgroups":[4,1,1],"bytes":1024}},
        {"ph":"X","cat":"tile","name":"a","pid":2,"tid":5,"ts":200,"dur":150,"args":{}},
        {"ph":"X","cat":"queue","name":"execute","pid":2,"tid":5,"ts":40,"dur":700},
        {"ph":"X","cat":"wait","name":"semaphore wait","pid":1,"tid":1,"ts":40,"dur":700,"args":{"woken_by":"ferrite-worker-0: local-task queue execute"}},
        {"ph":"i","cat":"queue","name":"alloca","pid":2,"tid":1,"ts":10,"s":"t"}
    ]}"#;

    #[test]
    fn summary_ranks_dispatches_by_total_time_with_shares_and_bytes() {
        let t = LoadedTrace::parse(TRACE).unwrap();
        assert_eq!(t.bounds(), (0.0, 1000.0));
        let s = summary(&t, 10);
        assert!(s.starts_with("wall time 1.000 ms"), "{s}");
        assert!(
            s.contains("dispatches: 3 in 500.0 us (50.0% of wall time), 2 distinct exports"),
            "{s}"
        );
        let a = s.lines().position(|l| l.ends_with(" a")).expect("row of a");
        let b = s.lines().position(|l| l.ends_with(" b")).expect("row of b");
        assert!(a < b, "a (400 us) ranks above b (100 us):\n{s}");
        let row_a = s.lines().nth(a).unwrap();
        for want in ["400.0 us", " 2 ", "200.0 us", "40.0%", "1.0 KiB", "4x1x1"] {
            assert!(row_a.contains(want), "{want} in '{row_a}'");
        }
        assert!(s.contains("execute"), "{s}");
        assert!(
            s.contains("ferrite-worker-0: local-task queue execute"),
            "{s}"
        );
        assert!(
            s.contains("1 tiles   15.0% of wall  ferrite-worker-0 (device local-task)"),
            "{s}"
        );
        // --top=1 keeps one dispatch row.
        let one = summary(&t, 1);
        assert!(one.lines().any(|l| l.ends_with(" a")) && !one.lines().any(|l| l.ends_with(" b")));
    }

    #[test]
    fn loading_is_a_line_of_its_own_outside_the_wall_time() {
        // A load of 3 ms (with a verification inside), a registration of
        // 1 ms running the module's initializer and one dispatch, then a
        // call of 1 ms with two dispatches.
        let t = r#"{"traceEvents":[
        {"ph":"X","cat":"load","name":"load module m","pid":1,"tid":1,"ts":0,"dur":3000},
        {"ph":"X","cat":"load","name":"verify module m","pid":1,"tid":1,"ts":100,"dur":500},
        {"ph":"X","cat":"load","name":"register module m","pid":1,"tid":1,"ts":3000,"dur":1000},
        {"ph":"X","cat":"invocation","name":"m.__init","pid":1,"tid":1,"ts":3100,"dur":800},
        {"ph":"X","cat":"dispatch","name":"init","pid":2,"tid":9,"ts":3200,"dur":100},
        {"ph":"X","cat":"invocation","name":"m.f","pid":1,"tid":1,"ts":5000,"dur":1000},
        {"ph":"X","cat":"dispatch","name":"a","pid":2,"tid":9,"ts":5100,"dur":200},
        {"ph":"X","cat":"dispatch","name":"a","pid":2,"tid":9,"ts":5500,"dur":200}
    ]}"#;
        let t = LoadedTrace::parse(t).unwrap();
        assert_eq!(t.loads.len(), 3);
        let s = summary(&t, 10);
        assert!(
            s.contains("loading (not in the wall time): 4.000 ms in 2 step(s): load module m 3.000 ms, register module m 1.000 ms"),
            "{s}"
        );
        assert!(s.contains("1 invocation(s)"), "{s}");
        assert!(s.starts_with("wall time 1.000 ms"), "{s}");
        assert!(
            s.contains("dispatches: 2 in 400.0 us (40.0% of wall time)"),
            "{s}"
        );
        assert!(!s.lines().any(|l| l.ends_with(" init")), "{s}");
    }

    #[test]
    fn bad_traces_are_errors_naming_the_problem() {
        for (text, want) in [
            ("not json", "not a JSON trace"),
            ("{\"x\":1}", "no 'traceEvents'"),
            ("3", "JSON object or array"),
            ("[{\"ph\":\"X\",\"name\":\"a\"}]", "without 'ts' and 'dur'"),
        ] {
            let e = LoadedTrace::parse(text).unwrap_err();
            assert!(e.to_string().contains(want), "{text}: {e}");
        }
    }
}
