//! `ferrite benchmark-module`: times calls of one function like upstream's
//! `iree-benchmark-module` (same flags), printing a google-benchmark-style
//! table of per-call wall time; `--compare-upstream` also runs the pinned
//! `iree-benchmark-module` on the same module, function, inputs and device
//! and ends with `ratio: X` (Ferrite time / upstream time, lower is better).

use crate::run_module::{load_context, parse_inputs};
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
    #[arg(long = "module", required = true)]
    pub modules: Vec<String>,
    /// Function to call.
    #[arg(long)]
    pub function: String,
    /// Function inputs (as `run-module --input`).
    #[arg(long = "input", allow_hyphen_values = true)]
    pub inputs: Vec<String>,
    /// HAL device(s): `local-sync` or `local-task`.
    #[arg(long = "device")]
    pub devices: Vec<String>,
    /// Worker threads of `local-task` (0 = one per core).
    #[arg(long = "task_topology_group_count", default_value_t = 0)]
    pub task_workers: usize,
    /// Timed repetitions; each runs enough calls to last the minimum time.
    #[arg(long = "benchmark_repetitions", default_value_t = 1)]
    pub repetitions: usize,
    /// Minimum time per repetition, `0.5s`, or a fixed call count `100x`
    /// (google benchmark's syntax).
    #[arg(long = "benchmark_min_time", default_value = "0.5s")]
    pub min_time: String,
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

/// Per-call times of each repetition, in nanoseconds.
struct Measurement {
    per_call_ns: Vec<f64>,
    iterations: u64,
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

fn stats(v: &[f64]) -> (f64, f64, f64, f64) {
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
    (mean, median, s[0], var.sqrt())
}

/// Runs the command; prints the table (and upstream's figures and the
/// ratio with `--compare-upstream`).
pub fn run(args: &BenchmarkModuleArgs) -> Result<()> {
    let min_time = parse_min_time(&args.min_time)?;
    let instance = Instance::default();
    let rc = load_context(
        &instance,
        &args.modules,
        &args.devices,
        args.task_workers,
        false,
    )
    .annotate(|| "creating run context".to_string())?;
    let ctx = &rc.context;
    let f = ctx
        .lookup_function(&args.function)
        .annotate(|| format!("looking up function '{}'", args.function))?;
    let inputs = parse_inputs(&args.inputs, &f.cconv.args, &rc.devices)?;
    if inputs.len() != f.cconv.args.len() {
        bail!(
            InvalidArgument,
            "input list and function mismatch; expected {} arguments but passed {}",
            f.cconv.args.len(),
            inputs.len()
        );
    }
    let call = || -> Result<()> {
        ctx.invoke(&f, inputs.clone())
            .annotate(|| format!("invoking function '{}'", args.function))?;
        Ok(())
    };
    // Warm-up: first-call costs (executable loading, pools) stay out.
    let warm = Instant::now();
    call()?;
    let first = warm.elapsed();
    let iterations = match min_time {
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
    let mut m = Measurement {
        per_call_ns: Vec::new(),
        iterations,
    };
    for _ in 0..args.repetitions.max(1) {
        let t = Instant::now();
        for _ in 0..iterations {
            call()?;
        }
        m.per_call_ns
            .push(t.elapsed().as_secs_f64() * 1e9 / iterations as f64);
    }
    let name = format!("BM_{}/process_time/real_time", args.function);
    print_table(&name, &m);
    if args.compare_upstream {
        let up = run_upstream(args)?;
        let ours = stats(&m.per_call_ns).0;
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

fn print_table(name: &str, m: &Measurement) {
    let w = name.len() + 8;
    let rule = "-".repeat(w + 34);
    println!("{rule}");
    println!("{:<w$}{:>16}{:>18}", "Benchmark", "Time", "Iterations");
    println!("{rule}");
    for t in &m.per_call_ns {
        println!("{:<w$}{:>16}{:>18}", name, fmt_time(*t), m.iterations);
    }
    let (mean, median, min, stddev) = stats(&m.per_call_ns);
    let n = m.per_call_ns.len();
    for (suffix, v) in [
        ("mean", mean),
        ("median", median),
        ("min", min),
        ("stddev", stddev),
    ] {
        println!(
            "{:<w$}{:>16}{:>18}",
            format!("{name}_{suffix}"),
            fmt_time(v),
            n
        );
    }
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
    cmd.arg(format!("--function={}", args.function));
    for i in &args.inputs {
        cmd.arg(format!("--input={i}"));
    }
    for d in &args.devices {
        cmd.arg(format!("--device={d}"));
    }
    cmd.arg(format!("--task_topology_group_count={}", args.task_workers));
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
