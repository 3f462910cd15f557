//! `ferrite benchmark-module`: times calls of functions like upstream's
//! `iree-benchmark-module` (same flags), printing a google-benchmark-style
//! table of per-call wall and CPU time, and with `--benchmark_out=FILE
//! --benchmark_out_format=json` (or `--benchmark_format=json` on stdout)
//! google benchmark's JSON report, which `ferrite.runtime.benchmark_module`
//! reads. Without `--function` every exported function that takes no
//! arguments is timed. `--compare-upstream` also runs the pinned
//! `iree-benchmark-module` on the same module, function, inputs and device
//! and ends with `ratio: X` (Ferrite time / upstream time, lower is better).

use crate::context::{load_context_with, parse_inputs};
use ferrite_base::status::ResultExt;
use ferrite_base::{bail, status, Result};
use ferrite_vm::Instance;
use std::path::PathBuf;
use std::process::Command;
use std::time::{Duration, Instant};

/// Options of `benchmark-module` (upstream's flag names).
#[derive(clap::Args, Debug)]
pub struct BenchmarkModuleArgs {
    /// A `.vmfb` file to load; repeat for several (the last is the main module).
    #[arg(long = "module", required_unless_present_any = crate::device_flags::LISTING)]
    pub modules: Vec<String>,
    /// Function to call; without it, every exported function that takes
    /// no arguments.
    #[arg(long)]
    pub function: Option<String>,
    /// Function inputs (as `run-module --input`).
    #[arg(long = "input", allow_hyphen_values = true)]
    pub inputs: Vec<String>,
    /// Devices and driver flags (`--device`, `--task_*`, `--list_devices`).
    #[command(flatten)]
    pub device: crate::device_flags::DeviceArgs,
    /// Timed repetitions; each runs enough calls to last the minimum time.
    #[arg(long = "benchmark_repetitions", default_value_t = 1)]
    pub repetitions: usize,
    /// Minimum time per repetition, `0.5s`, or a fixed call count `100x`
    /// (google benchmark's syntax).
    #[arg(long = "benchmark_min_time", default_value = "0.5s")]
    pub min_time: String,
    /// Format of the report on stdout: `console` (a table) or `json`.
    #[arg(long = "benchmark_format", default_value = "console")]
    pub format: String,
    /// Also write the report to this file.
    #[arg(long = "benchmark_out")]
    pub out: Option<PathBuf>,
    /// Format of `--benchmark_out`: `json` (default) or `console`.
    #[arg(long = "benchmark_out_format", default_value = "json")]
    pub out_format: String,
    /// Parameter files (`--parameters`, `--parameter_mode`).
    #[command(flatten)]
    pub params: crate::parameters::ParameterArgs,
    /// Also run the pinned `iree-benchmark-module` (found as
    /// `$IREE_BENCHMARK_MODULE`, else `.venv/bin/` above the working
    /// directory or this executable) and print `ratio: X`.
    #[arg(long = "compare-upstream")]
    pub compare_upstream: bool,
}

enum MinTime {
    Seconds(f64),
    Iterations(u64),
}

fn parse_min_time(s: &str) -> Result<MinTime> {
    let bad = || {
        status!(
            InvalidArgument,
            "--benchmark_min_time '{s}': expected `<float>s` or `<integer>x`"
        )
    };
    if let Some(n) = s.strip_suffix('x') {
        return Ok(MinTime::Iterations(n.parse().map_err(|_| bad())?));
    }
    let v = s.strip_suffix('s').unwrap_or(s);
    Ok(MinTime::Seconds(v.parse().map_err(|_| bad())?))
}

/// One row of the report: a repetition or an aggregate over them.
struct Row {
    name: String,
    run_name: String,
    /// `None` for a repetition, else `mean`, `median`, `stddev` or `cv`.
    aggregate: Option<&'static str>,
    repetitions: usize,
    repetition_index: usize,
    iterations: u64,
    /// Per-call wall and process-CPU time in nanoseconds (for `cv`, a ratio).
    real: f64,
    cpu: f64,
    items_per_second: f64,
}

fn fmt_time(ns: f64) -> String {
    if ns >= 1e6 {
        format!("{:.3} ms", ns / 1e6)
    } else if ns >= 1e3 {
        format!("{:.3} us", ns / 1e3)
    } else {
        format!("{:.1} ns", ns)
    }
}

/// Mean, median and sample standard deviation.
fn stats(v: &[f64]) -> (f64, f64, f64) {
    let n = v.len() as f64;
    let mean = v.iter().sum::<f64>() / n;
    let mut s = v.to_vec();
    s.sort_by(|a, b| a.partial_cmp(b).unwrap_or(std::cmp::Ordering::Equal));
    let median = if s.len() % 2 == 1 {
        s[s.len() / 2]
    } else {
        (s[s.len() / 2 - 1] + s[s.len() / 2]) / 2.0
    };
    let var = if v.len() > 1 {
        v.iter().map(|x| (x - mean) * (x - mean)).sum::<f64>() / (n - 1.0)
    } else {
        0.0
    };
    (mean, median, var.sqrt())
}

/// CPU time consumed by this process (all threads), in nanoseconds.
fn process_cpu_ns() -> f64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid, writable timespec owned by this frame, and
    // CLOCK_PROCESS_CPUTIME_ID is a clock every Linux kernel provides.
    let rc = unsafe { libc::clock_gettime(libc::CLOCK_PROCESS_CPUTIME_ID, &mut ts) };
    if rc != 0 {
        return 0.0;
    }
    ts.tv_sec as f64 * 1e9 + ts.tv_nsec as f64
}

/// The functions to time: `--function`, else every export of the main
/// (last) module that takes no arguments, as upstream.
fn functions_to_run(ctx: &ferrite_vm::Context, args: &BenchmarkModuleArgs) -> Result<Vec<String>> {
    if let Some(f) = &args.function {
        return Ok(vec![f.clone()]);
    }
    let Some(main) = ctx.modules().last() else {
        return Ok(Vec::new());
    };
    let mut names = Vec::new();
    for e in main.exports() {
        if e.name.starts_with("__") {
            continue;
        }
        let full = format!("{}.{}", main.name(), e.name);
        let f = ctx.lookup_function(&full)?;
        if f.cconv.args.is_empty() {
            names.push(e.name.clone());
        }
    }
    Ok(names)
}

/// Times `function`: a warm-up call, then `repetitions` timed runs of the
/// same number of calls; returns the repetition rows and, for several
/// repetitions, the aggregates.
fn time_function(
    ctx: &ferrite_vm::Context,
    rc_devices: &[ferrite_hal::device::DeviceRef],
    function: &str,
    args: &BenchmarkModuleArgs,
    min_time: &MinTime,
) -> Result<Vec<Row>> {
    let f = ctx
        .lookup_function(function)
        .annotate(|| format!("looking up function '{function}'"))?;
    let inputs = if args.function.is_some() {
        parse_inputs(&args.inputs, &f.cconv.args, rc_devices)?
    } else {
        Vec::new()
    };
    if inputs.len() != f.cconv.args.len() {
        bail!(
            InvalidArgument,
            "input list and function mismatch; expected {} arguments but passed {}",
            f.cconv.args.len(),
            inputs.len()
        );
    }
    // Inputs stay in one list and results are written into one reused
    // vector, as upstream's benchmark reuses its input and output lists.
    let mut outputs = Vec::new();
    let mut call = || -> Result<()> {
        ctx.invoke_into(&f, &inputs, &mut outputs)
            .annotate(|| format!("invoking function '{function}'"))?;
        outputs.clear();
        Ok(())
    };
    // Warm-up: first-call costs (executable loading, pools) stay out.
    let warm = Instant::now();
    call()?;
    let first = warm.elapsed();
    let iterations = match *min_time {
        MinTime::Iterations(n) => n.max(1),
        MinTime::Seconds(s) => {
            // Calibrate on a short run, then size repetitions to `s`.
            let mut n = 1u64;
            let mut took = first;
            while took < Duration::from_millis(20) && n < 1 << 30 {
                n *= 4;
                let t = Instant::now();
                for _ in 0..n {
                    call()?;
                }
                took = t.elapsed();
            }
            let per = took.as_secs_f64() / n as f64;
            ((s / per.max(1e-9)).ceil() as u64).max(1)
        }
    };
    let run_name = format!("BM_{function}/process_time/real_time");
    let repetitions = args.repetitions.max(1);
    let mut rows = Vec::new();
    for index in 0..repetitions {
        let cpu0 = process_cpu_ns();
        let t = Instant::now();
        for _ in 0..iterations {
            call()?;
        }
        let wall = t.elapsed().as_secs_f64();
        let cpu = process_cpu_ns() - cpu0;
        rows.push(Row {
            name: run_name.clone(),
            run_name: run_name.clone(),
            aggregate: None,
            repetitions,
            repetition_index: index,
            iterations,
            real: wall * 1e9 / iterations as f64,
            cpu: cpu / iterations as f64,
            items_per_second: iterations as f64 / wall.max(1e-12),
        });
    }
    if repetitions > 1 {
        let real: Vec<f64> = rows.iter().map(|r| r.real).collect();
        let cpu: Vec<f64> = rows.iter().map(|r| r.cpu).collect();
        let ips: Vec<f64> = rows.iter().map(|r| r.items_per_second).collect();
        let (rm, rmed, rsd) = stats(&real);
        let (cm, cmed, csd) = stats(&cpu);
        let (im, imed, isd) = stats(&ips);
        let ratio = |sd: f64, mean: f64| if mean > 0.0 { sd / mean } else { 0.0 };
        for (agg, real, cpu, items) in [
            ("mean", rm, cm, im),
            ("median", rmed, cmed, imed),
            ("stddev", rsd, csd, isd),
            ("cv", ratio(rsd, rm), ratio(csd, cm), ratio(isd, im)),
        ] {
            rows.push(Row {
                name: format!("{run_name}_{agg}"),
                run_name: run_name.clone(),
                aggregate: Some(agg),
                repetitions,
                repetition_index: 0,
                iterations: repetitions as u64,
                real,
                cpu,
                items_per_second: items,
            });
        }
    }
    Ok(rows)
}

/// Runs the command; prints the report (and upstream's figures and the
/// ratio with `--compare-upstream`).
pub fn run(args: &BenchmarkModuleArgs) -> Result<()> {
    if args.device.wants_listing() {
        return args.device.print_listing();
    }
    let min_time = parse_min_time(&args.min_time)?;
    for (flag, value) in [
        ("--benchmark_format", &args.format),
        ("--benchmark_out_format", &args.out_format),
    ] {
        if value != "console" && value != "json" {
            bail!(
                InvalidArgument,
                "{flag}={value}: expected `console` or `json`"
            );
        }
    }
    let instance = Instance::default();
    let rc = load_context_with(
        &instance,
        &args.modules,
        &args.device,
        false,
        args.params.modules()?,
    )
    .annotate(|| "creating run context".to_string())?;
    let functions = functions_to_run(&rc.context, args)?;
    let mut rows = Vec::new();
    for f in &functions {
        rows.extend(time_function(&rc.context, &rc.devices, f, args, &min_time)?);
    }
    if functions.is_empty() {
        // As google benchmark: a message, an empty report, success.
        eprintln!("Failed to match any benchmarks against regex: .");
    }
    if args.format == "json" {
        println!("{}", json_report(&rows));
    } else if !rows.is_empty() {
        print!("{}", console_report(&rows));
    }
    if let Some(path) = &args.out {
        let text = match (rows.is_empty(), args.out_format.as_str()) {
            (true, _) => String::new(),
            (false, "json") => json_report(&rows) + "\n",
            (false, _) => console_report(&rows),
        };
        std::fs::write(path, text).map_err(|e| {
            status!(
                PermissionDenied,
                "writing --benchmark_out={}: {e}",
                path.display()
            )
        })?;
    }
    if args.compare_upstream {
        let Some(ours) = rows
            .iter()
            .filter(|r| r.aggregate.is_none())
            .map(|r| r.real)
            .reduce(|a, b| a + b)
        else {
            bail!(InvalidArgument, "--compare-upstream: nothing was timed");
        };
        let ours = ours / args.repetitions.max(1) as f64;
        let up = run_upstream(args)?;
        println!(
            "upstream iree-benchmark-module: {} per call (mean of {} repetition(s))",
            fmt_time(up),
            args.repetitions.max(1)
        );
        println!("ferrite benchmark-module: {} per call", fmt_time(ours));
        println!("ratio: {:.3}", ours / up);
    }
    Ok(())
}

/// Google benchmark's console table (times per call; `cv` in percent).
fn console_report(rows: &[Row]) -> String {
    let w = rows.iter().map(|r| r.name.len()).max().unwrap_or(9) + 4;
    let rule = "-".repeat(w + 62);
    let mut out = format!(
        "{rule}\n{:<w$}{:>15}{:>15}{:>13} UserCounters...\n{rule}\n",
        "Benchmark", "Time", "CPU", "Iterations"
    );
    for r in rows {
        let (time, cpu, items) = if r.aggregate == Some("cv") {
            (
                format!("{:.2} %", r.real * 100.0),
                format!("{:.2} %", r.cpu * 100.0),
                format!("{:.2}%", r.items_per_second * 100.0),
            )
        } else {
            (
                fmt_time(r.real),
                fmt_time(r.cpu),
                format!("{:.6}k/s", r.items_per_second / 1e3),
            )
        };
        out.push_str(&format!(
            "{:<w$}{time:>15}{cpu:>15}{:>13} items_per_second={items}\n",
            r.name, r.iterations
        ));
    }
    out
}

/// Google benchmark's JSON report (schema version 1; times in ms).
fn json_report(rows: &[Row]) -> String {
    let benchmarks: Vec<serde_json::Value> = rows
        .iter()
        .map(|r| {
            let mut o = serde_json::Map::new();
            o.insert("name".into(), r.name.clone().into());
            o.insert("family_index".into(), 0.into());
            o.insert("per_family_instance_index".into(), 0.into());
            o.insert("run_name".into(), r.run_name.clone().into());
            let run_type = if r.aggregate.is_some() {
                "aggregate"
            } else {
                "iteration"
            };
            o.insert("run_type".into(), run_type.into());
            o.insert("repetitions".into(), r.repetitions.into());
            if let Some(agg) = r.aggregate {
                o.insert("threads".into(), 1.into());
                o.insert("aggregate_name".into(), agg.into());
                let unit = if agg == "cv" { "percentage" } else { "time" };
                o.insert("aggregate_unit".into(), unit.into());
            } else {
                o.insert("repetition_index".into(), r.repetition_index.into());
                o.insert("threads".into(), 1.into());
            }
            o.insert("iterations".into(), r.iterations.into());
            // A `cv` row holds ratios, which google benchmark leaves unscaled.
            let scale = if r.aggregate == Some("cv") { 1.0 } else { 1e-6 };
            o.insert("real_time".into(), (r.real * scale).into());
            o.insert("cpu_time".into(), (r.cpu * scale).into());
            o.insert("time_unit".into(), "ms".into());
            o.insert("items_per_second".into(), r.items_per_second.into());
            serde_json::Value::Object(o)
        })
        .collect();
    let context = serde_json::json!({
        "executable": std::env::current_exe().map(|p| p.display().to_string()).unwrap_or_default(),
        "num_cpus": std::thread::available_parallelism().map_or(1, |n| n.get()),
        "library_build_type": if cfg!(debug_assertions) { "debug" } else { "release" },
        "json_schema_version": 1,
    });
    let report = serde_json::json!({ "context": context, "benchmarks": benchmarks });
    serde_json::to_string_pretty(&report).unwrap_or_default()
}

fn upstream_tool() -> Result<PathBuf> {
    if let Some(p) = std::env::var_os("IREE_BENCHMARK_MODULE") {
        return Ok(PathBuf::from(p));
    }
    let mut starts = Vec::new();
    if let Ok(d) = std::env::current_dir() {
        starts.push(d);
    }
    if let Ok(e) = std::env::current_exe() {
        starts.push(e);
    }
    for s in starts {
        for dir in s.ancestors() {
            let p = dir.join(".venv/bin/iree-benchmark-module");
            if p.is_file() {
                return Ok(p);
            }
        }
    }
    bail!(
        NotFound,
        "iree-benchmark-module not found: set IREE_BENCHMARK_MODULE or run from the repository (.venv/bin)"
    )
}

/// Runs upstream's tool with the same flags; returns its mean per-call
/// real time in nanoseconds (from its JSON report).
fn run_upstream(args: &BenchmarkModuleArgs) -> Result<f64> {
    let tool = upstream_tool()?;
    let mut cmd = Command::new(&tool);
    for m in &args.modules {
        cmd.arg(format!("--module={m}"));
    }
    if let Some(f) = &args.function {
        cmd.arg(format!("--function={f}"));
    }
    for i in &args.inputs {
        cmd.arg(format!("--input={i}"));
    }
    for d in &args.device.devices {
        cmd.arg(format!("--device={d}"));
    }
    for p in &args.params.parameters {
        cmd.arg(format!("--parameters={p}"));
    }
    cmd.arg(format!("--parameter_mode={}", args.params.parameter_mode));
    for (name, value) in args.device.task.given() {
        cmd.arg(format!("--{name}={value}"));
    }
    cmd.arg(format!(
        "--benchmark_repetitions={}",
        args.repetitions.max(1)
    ));
    cmd.arg(format!("--benchmark_min_time={}", args.min_time));
    cmd.arg("--benchmark_format=json");
    let out = cmd
        .output()
        .map_err(|e| status!(Unknown, "running {}: {e}", tool.display()))?;
    let text = String::from_utf8_lossy(&out.stdout);
    if !out.status.success() {
        bail!(
            Unknown,
            "{} failed ({}): {}{}",
            tool.display(),
            out.status,
            text,
            String::from_utf8_lossy(&out.stderr)
        );
    }
    parse_upstream_json(&text)
}

/// Mean `real_time` (ns) of the `iteration` runs in google benchmark's JSON.
pub fn parse_upstream_json(text: &str) -> Result<f64> {
    let mut times = Vec::new();
    for obj in text.split('{').skip(1) {
        let field = |key: &str| -> Option<&str> {
            let i = obj.find(&format!("\"{key}\":"))?;
            let rest = obj[i + key.len() + 3..].trim_start();
            let end = rest.find([',', '\n', '}']).unwrap_or(rest.len());
            Some(rest[..end].trim().trim_matches('"'))
        };
        if field("run_type") != Some("iteration") {
            continue;
        }
        let (Some(t), Some(unit)) = (field("real_time"), field("time_unit")) else {
            continue;
        };
        let Ok(t) = t.parse::<f64>() else { continue };
        let scale = match unit {
            "ns" => 1.0,
            "us" => 1e3,
            "ms" => 1e6,
            "s" => 1e9,
            _ => continue,
        };
        times.push(t * scale);
    }
    if times.is_empty() {
        bail!(
            Unknown,
            "no benchmark iterations in iree-benchmark-module's output:\n{text}"
        );
    }
    Ok(times.iter().sum::<f64>() / times.len() as f64)
}
