//! `ferrite benchmark-module`: times calls of functions like upstream's
//! `iree-benchmark-module` (same flags), printing a google-benchmark-style
//! table of per-call wall and CPU time, and with `--benchmark_out=FILE
//! --benchmark_out_format=json` (or `--benchmark_format=json` on stdout)
//! google benchmark's JSON report, which `ferrite.runtime.benchmark_module`
//! reads. Without `--function` every exported function that takes no
//! arguments is timed. `--compare-upstream` also runs the pinned
//! `iree-benchmark-module` on the same module, function, inputs and device
//! and ends with `ratio: X` (Ferrite time / upstream time, lower is better).
//! `--under-load` then times both again while one busy process per CPU
//! runs (started and killed by the command, limited to `--load-seconds`)
//! and adds `loaded ratio: Y` and an idle/loaded summary line.

use crate::benchmark::{console_report, fmt_time, json_report, MinTime, Row};
use crate::context::{load_context_with, parse_inputs};
use ferrite_base::status::ResultExt;
use ferrite_base::{bail, status, Result};
use ferrite_vm::Instance;
use std::path::PathBuf;
use std::process::Command;

/// Options of `benchmark-module` (upstream's flag names).
#[derive(clap::Args, Debug)]
pub struct BenchmarkModuleArgs {
    /// A `.vmfb` file to load; repeat for several (the last is the main module).
    #[arg(long = "module", required_unless_present_any = crate::device_flags::LISTING)]
    pub modules: Vec<String>,
    /// How module files are read: `mmap` (default) or `preload`.
    #[arg(long = "module_mode", value_enum, default_value_t = crate::context::ModuleMode::Mmap)]
    pub module_mode: crate::context::ModuleMode,
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
    /// Lists the benchmarks (one name a line) instead of running them.
    #[arg(long = "benchmark_list_tests", num_args = 0..=1, default_missing_value = "true",
          require_equals = true, default_value_t = false, action = clap::ArgAction::Set)]
    pub list_tests: bool,
    /// Reports only the aggregates of several repetitions (stdout and
    /// `--benchmark_out`).
    #[arg(long = "benchmark_report_aggregates_only", num_args = 0..=1,
          default_missing_value = "true", require_equals = true, default_value_t = false,
          action = clap::ArgAction::Set)]
    pub report_aggregates_only: bool,
    /// Shows only the aggregates on stdout (`--benchmark_out` keeps all rows).
    #[arg(long = "benchmark_display_aggregates_only", num_args = 0..=1,
          default_missing_value = "true", require_equals = true, default_value_t = false,
          action = clap::ArgAction::Set)]
    pub display_aggregates_only: bool,
    /// Parameter files (`--parameters`, `--parameter_mode`).
    #[command(flatten)]
    pub params: crate::parameters::ParameterArgs,
    /// `--trace_execution`, `--print_statistics`.
    #[command(flatten)]
    pub diagnostics: crate::diagnostics::DiagnosticArgs,
    /// Also run the pinned `iree-benchmark-module` (found as
    /// `$IREE_BENCHMARK_MODULE`, else beside this executable, in the Python
    /// environment of the pip-installed `ferrite`, in `.venv/bin/` above the
    /// working directory or this executable, else on `PATH`) and print
    /// `ratio: X`.
    #[arg(long = "compare-upstream")]
    pub compare_upstream: bool,
    /// After the idle timing, time again (upstream too with
    /// `--compare-upstream`) while one busy process per available CPU
    /// runs, and print the loaded figures and ratio beside the idle ones
    /// (with `--compare-upstream` the two runtimes alternate twice under
    /// the load; each loaded figure is the mean of its two timings).
    /// The load is started here, limited to `--load-seconds`, and killed
    /// as soon as the loaded timing ends (or fails).
    #[arg(long = "under-load")]
    pub under_load: bool,
    /// Longest the `--under-load` busy processes may live, in seconds.
    #[arg(long = "load-seconds", default_value_t = 120)]
    pub load_seconds: u64,
}

/// How long `--under-load` lets the busy processes settle before timing.
const LOAD_SETTLE: std::time::Duration = std::time::Duration::from_secs(3);

/// One busy process (`sh` looping) per available CPU, each limited in
/// time by `timeout(1)`, in a process group of their own that is killed
/// (and reaped) on drop.
struct CpuLoad {
    children: Vec<std::process::Child>,
}

impl CpuLoad {
    fn start(seconds: u64) -> Result<CpuLoad> {
        use std::os::unix::process::CommandExt;
        let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
        let mut load = CpuLoad {
            children: Vec::with_capacity(cpus),
        };
        for _ in 0..cpus {
            let child = Command::new("timeout")
                .args([
                    &seconds.max(1).to_string(),
                    "sh",
                    "-c",
                    "while :; do :; done",
                ])
                .process_group(0)
                .stdin(std::process::Stdio::null())
                .spawn()
                .map_err(|e| status!(Unknown, "starting a busy process (timeout, sh): {e}"))?;
            load.children.push(child);
        }
        // Let the scheduler settle the busy loops: on a 16-CPU machine a
        // single-threaded local-sync MiniLM call timed within the first
        // second of the load took 206 ms and 92 ms a few seconds later
        // (upstream's 94 ms), the thread sharing a CPU with a busy loop
        // until the load was spread.
        std::thread::sleep(LOAD_SETTLE);
        Ok(load)
    }

    fn len(&self) -> usize {
        self.children.len()
    }
}

impl Drop for CpuLoad {
    fn drop(&mut self) {
        for c in &self.children {
            // SAFETY: killpg(2) on the process group of a child this
            // process spawned with `process_group(0)` (its pid is the group
            // id) and has not reaped yet (reaped below), so the group holds
            // only that `timeout` and its `sh`.
            unsafe {
                libc::killpg(c.id() as libc::pid_t, libc::SIGKILL);
            }
        }
        for c in &mut self.children {
            let _ = c.wait();
        }
    }
}

/// Ferrite's mean per-call wall time (ns) over the repetitions of `rows`.
fn per_call(rows: &[Row], repetitions: usize) -> Option<f64> {
    rows.iter()
        .filter(|r| r.aggregate.is_none())
        .map(|r| r.real)
        .reduce(|a, b| a + b)
        .map(|t| t / repetitions.max(1) as f64)
}

/// The name google benchmark gives `function`'s benchmark.
fn run_name(function: &str) -> String {
    format!("BM_{function}/process_time/real_time")
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

/// Times `function` with its `--input`s (see [`crate::benchmark::measure`]).
fn time_function(
    ctx: &ferrite_vm::Context,
    rc_devices: &[ferrite_hal::device::DeviceRef],
    function: &str,
    args: &BenchmarkModuleArgs,
    min_time: MinTime,
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
    let call = || -> Result<()> {
        ctx.invoke_into(&f, &inputs, &mut outputs)
            .annotate(|| format!("invoking function '{function}'"))?;
        outputs.clear();
        Ok(())
    };
    crate::benchmark::measure(&run_name(function), args.repetitions, min_time, call)
}

/// Runs the command; prints the report (and upstream's figures and the
/// ratio with `--compare-upstream`).
pub fn run(args: &BenchmarkModuleArgs) -> Result<()> {
    if args.device.wants_listing() {
        return args.device.print_listing();
    }
    let min_time = MinTime::parse(&args.min_time)?;
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
    // Recording starts before loading: the trace shows the loads.
    let trace = args.diagnostics.start_recording()?;
    let instance = Instance::default();
    let mut rc = load_context_with(
        &instance,
        &args.modules,
        args.module_mode,
        &args.device,
        false,
        args.params.modules()?,
    )
    .annotate(|| "creating run context".to_string())?;
    args.diagnostics.apply(&mut rc);
    let functions = functions_to_run(&rc.context, args)?;
    if args.list_tests {
        for f in &functions {
            println!("{}", run_name(f));
        }
        return Ok(());
    }
    let mut rows = Vec::new();
    for f in &functions {
        rows.extend(time_function(&rc.context, &rc.devices, f, args, min_time)?);
    }
    if functions.is_empty() {
        // As google benchmark: a message, an empty report, success.
        eprintln!("Failed to match any benchmarks against regex: .");
    }
    // With several repetitions, google benchmark can keep only the
    // aggregate rows, in the file and on stdout or on stdout alone.
    let aggregates: Vec<Row> = rows
        .iter()
        .filter(|r| r.aggregate.is_some())
        .cloned()
        .collect();
    let pick = |only: bool| {
        if only && !aggregates.is_empty() {
            &aggregates
        } else {
            &rows
        }
    };
    let shown = pick(args.report_aggregates_only || args.display_aggregates_only);
    if args.format == "json" {
        println!("{}", json_report(shown));
    } else if !shown.is_empty() {
        print!("{}", console_report(shown));
    }
    if let Some(path) = &args.out {
        let kept = pick(args.report_aggregates_only);
        let text = match (kept.is_empty(), args.out_format.as_str()) {
            (true, _) => String::new(),
            (false, "json") => json_report(kept) + "\n",
            (false, _) => console_report(kept),
        };
        std::fs::write(path, text).map_err(|e| {
            status!(
                PermissionDenied,
                "writing --benchmark_out={}: {e}",
                path.display()
            )
        })?;
    }
    let mut idle = None;
    if args.compare_upstream {
        let Some(ours) = per_call(&rows, args.repetitions) else {
            bail!(InvalidArgument, "--compare-upstream: nothing was timed");
        };
        let up = run_upstream(args)?;
        println!(
            "upstream iree-benchmark-module: {} per call (mean of {} repetition(s))",
            fmt_time(up),
            args.repetitions.max(1)
        );
        println!("ferrite benchmark-module: {} per call", fmt_time(ours));
        println!("ratio: {:.3}", ours / up);
        idle = Some((ours, Some(up)));
    }
    if args.under_load {
        let Some(ours_idle) = idle.map(|i| i.0).or(per_call(&rows, args.repetitions)) else {
            bail!(InvalidArgument, "--under-load: nothing was timed");
        };
        let load = CpuLoad::start(args.load_seconds)?;
        // Under load, where a thread lands decides much of its share of a
        // CPU, and the scheduler keeps moving the busy processes around for
        // a while after they start: whichever runtime is timed first would
        // meet a different machine. With `--compare-upstream` the two
        // alternate (ours, upstream, ours, upstream) and each figure is
        // the mean of its two timings.
        let rounds = if args.compare_upstream { 2 } else { 1 };
        let mut ours_runs = Vec::with_capacity(rounds);
        let mut up_runs = Vec::with_capacity(rounds);
        for _ in 0..rounds {
            let mut loaded = Vec::new();
            for f in &functions {
                loaded.extend(time_function(&rc.context, &rc.devices, f, args, min_time)?);
            }
            ours_runs.push(per_call(&loaded, args.repetitions).unwrap_or(f64::NAN));
            if args.compare_upstream {
                up_runs.push(run_upstream(args)?);
            }
        }
        let busy = load.len();
        drop(load);
        let mean = |v: &[f64]| v.iter().sum::<f64>() / v.len() as f64;
        let ours = mean(&ours_runs);
        let up = (!up_runs.is_empty()).then(|| mean(&up_runs));
        println!("under load ({busy} busy processes, one per CPU):");
        if rounds > 1 {
            let list = |v: &[f64]| {
                v.iter()
                    .map(|t| fmt_time(*t))
                    .collect::<Vec<_>>()
                    .join(", ")
            };
            println!(
                "  alternating timings: ferrite {}; upstream {}",
                list(&ours_runs),
                list(&up_runs)
            );
        }
        println!("  ferrite benchmark-module: {} per call", fmt_time(ours));
        let up_idle = idle.and_then(|i| i.1);
        if let (Some(up), Some(up_idle)) = (up, up_idle) {
            println!(
                "  upstream iree-benchmark-module: {} per call",
                fmt_time(up)
            );
            println!("loaded ratio: {:.3}", ours / up);
            println!(
                "idle vs loaded: ferrite {} / {}, upstream {} / {}, ratio {:.3} / {:.3}",
                fmt_time(ours_idle),
                fmt_time(ours),
                fmt_time(up_idle),
                fmt_time(up),
                ours_idle / up_idle,
                ours / up
            );
        } else {
            println!(
                "idle vs loaded: ferrite {} / {} ({:.2}x)",
                fmt_time(ours_idle),
                fmt_time(ours),
                ours / ours_idle
            );
        }
    }
    trace.finish()?;
    args.diagnostics.finish(&rc);
    Ok(())
}

const UPSTREAM_TOOL: &str = "iree-benchmark-module";

/// Set by the Python package's `ferrite` console command (`ferrite._cli`) to
/// its environment's script directories (`os.pathsep`-separated): there pip
/// installs `iree-benchmark-module` beside `ferrite`, while this process's
/// executable is the Python interpreter.
const PYTHON_SCRIPTS_ENV: &str = "FERRITE_PYTHON_SCRIPTS";

/// Where `iree-benchmark-module` is looked for, in order: beside the
/// running executable (as installed by `cargo install` or a release
/// archive next to upstream's tools), the Python environment's script
/// directories, `.venv/bin` in or above the working directory and the
/// executable (a repository checkout), then `PATH`.
fn upstream_search_dirs(
    exe: Option<PathBuf>,
    python_scripts: Option<std::ffi::OsString>,
    cwd: Option<PathBuf>,
    path: Option<std::ffi::OsString>,
) -> Vec<PathBuf> {
    let mut dirs = Vec::new();
    if let Some(dir) = exe.as_deref().and_then(|e| e.parent()) {
        dirs.push(dir.to_path_buf());
    }
    if let Some(p) = &python_scripts {
        dirs.extend(std::env::split_paths(p).filter(|d| !d.as_os_str().is_empty()));
    }
    for start in cwd.iter().chain(exe.iter()) {
        dirs.extend(start.ancestors().map(|d| d.join(".venv/bin")));
    }
    if let Some(p) = &path {
        dirs.extend(std::env::split_paths(p).filter(|d| !d.as_os_str().is_empty()));
    }
    dirs
}

fn find_upstream_tool(dirs: &[PathBuf]) -> Option<PathBuf> {
    dirs.iter()
        .map(|d| d.join(UPSTREAM_TOOL))
        .find(|p| p.is_file())
}

fn upstream_tool() -> Result<PathBuf> {
    if let Some(p) = std::env::var_os("IREE_BENCHMARK_MODULE") {
        return Ok(PathBuf::from(p));
    }
    let dirs = upstream_search_dirs(
        std::env::current_exe().ok(),
        std::env::var_os(PYTHON_SCRIPTS_ENV),
        std::env::current_dir().ok(),
        std::env::var_os("PATH"),
    );
    match find_upstream_tool(&dirs) {
        Some(p) => Ok(p),
        None => bail!(
            NotFound,
            "{UPSTREAM_TOOL} not found beside this executable, in the Python environment, in .venv/bin or on PATH: install iree-base-runtime (pip) or set IREE_BENCHMARK_MODULE"
        ),
    }
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

#[cfg(test)]
mod tests {
    use super::*;

    /// A fresh directory tree for one test: `venv/bin` (the Python
    /// environment), `cargo/bin` (the executable's directory), `path/bin`
    /// (on PATH) and `work` (the working directory).
    fn tree(name: &str) -> PathBuf {
        let root =
            std::env::temp_dir().join(format!("ferrite-upstream-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&root);
        for d in ["venv/bin", "cargo/bin", "path/bin", "work"] {
            std::fs::create_dir_all(root.join(d)).unwrap();
        }
        root
    }

    fn put_tool(dir: &std::path::Path) -> PathBuf {
        let p = dir.join(UPSTREAM_TOOL);
        std::fs::write(&p, "").unwrap();
        p
    }

    fn search(root: &std::path::Path, exe_dir: &str) -> Option<PathBuf> {
        let dirs = upstream_search_dirs(
            Some(root.join(exe_dir).join("ferrite")),
            Some(std::env::join_paths([root.join("venv/bin")]).unwrap()),
            Some(root.join("work")),
            Some(std::env::join_paths([root.join("path/bin")]).unwrap()),
        );
        find_upstream_tool(&dirs)
    }

    #[test]
    fn finds_upstream_tool_in_order() {
        let root = tree("order");
        // Nothing installed anywhere: not found.
        assert_eq!(search(&root, "cargo/bin"), None);
        // Only on PATH.
        let on_path = put_tool(&root.join("path/bin"));
        assert_eq!(search(&root, "cargo/bin"), Some(on_path));
        // The pip-installed `ferrite` runs inside Python: the environment's
        // script directory comes before PATH.
        let in_venv = put_tool(&root.join("venv/bin"));
        assert_eq!(search(&root, "python-elsewhere"), Some(in_venv.clone()));
        // Beside the running executable first of all.
        let beside = put_tool(&root.join("cargo/bin"));
        assert_eq!(search(&root, "cargo/bin"), Some(beside));
        // A repository checkout: .venv/bin above the working directory,
        // before PATH.
        std::fs::remove_file(&in_venv).unwrap();
        std::fs::create_dir_all(root.join(".venv/bin")).unwrap();
        let checkout = put_tool(&root.join(".venv/bin"));
        assert_eq!(search(&root, "python-elsewhere"), Some(checkout));
        std::fs::remove_dir_all(&root).unwrap();
    }
}
