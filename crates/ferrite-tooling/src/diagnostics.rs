//! What the run and benchmark tools can report about a run besides its
//! results, under upstream's flag names: `--trace_execution` (one line per
//! executed VM op on stderr) and `--print_statistics` (each device's
//! allocator statistics on stderr at exit, in upstream's layout); and
//! Ferrite's `--trace=FILE.json` (a Chrome/Perfetto trace of the calls, see
//! `ferrite_base::trace`).

use crate::context::RunContext;
use ferrite_hal::device::DeviceRef;
use std::fmt::Write;

/// The diagnostic flags of `run-module` and `benchmark-module`.
#[derive(clap::Args, Debug, Clone, Default)]
pub struct DiagnosticArgs {
    /// Traces VM execution to stderr: one line per executed bytecode op,
    /// `[module.function+OFFSET]    op` (upstream's layout, the op as the
    /// disassembly prints it). Functions the compiling tier compiled are
    /// interpreted while tracing, so every op is seen.
    #[arg(long = "trace_execution", num_args = 0..=1, default_missing_value = "true",
          require_equals = true, default_value_t = false, action = clap::ArgAction::Set)]
    pub trace_execution: bool,
    /// Prints each device's allocator statistics (peak, allocated, freed
    /// and live host and device bytes) to stderr when the tool ends, as
    /// upstream does.
    #[arg(long = "print_statistics", num_args = 0..=1, default_missing_value = "true",
          require_equals = true, default_value_t = false, action = clap::ArgAction::Set)]
    pub print_statistics: bool,
    /// Writes a Chrome/Perfetto JSON trace of the calls to FILE (Ferrite's
    /// flag; open it in ui.perfetto.dev or summarize it with
    /// `ferrite profile FILE`): invocations, VM function spans, dispatches
    /// by executable export with workgroup counts (on local-task the tiles
    /// each worker ran), queue operations and semaphore waits with what
    /// woke them, per thread and device. Module loading is not traced.
    #[arg(long = "trace", value_name = "FILE.json")]
    pub trace: Option<std::path::PathBuf>,
    /// Prints aggregate device statistics to stderr when the tool ends
    /// (upstream's flag and heading): per device, each queue operation's
    /// count, total and mean time and bytes, and each dispatch export's
    /// count, total and mean time, tiles and time in tiles.
    #[arg(long = "print_device_statistics", num_args = 0..=1, default_missing_value = "true",
          require_equals = true, default_value_t = false, action = clap::ArgAction::Set)]
    pub print_device_statistics: bool,
    /// HAL profiling data families to record, comma-separated (upstream's
    /// flag): `queue-events`, `host-execution`, `device-queue-events`
    /// (queue operations on the device's clock; the host's on CPU
    /// devices), `dispatch-events` (per-dispatch timings, which upstream's
    /// CPU devices refuse), `memory-events`. Needs
    /// `--device_profiling_output`.
    #[arg(long = "device_profiling_mode", value_name = "FAMILIES")]
    pub device_profiling_mode: Option<String>,
    /// Where the `.ireeprof` bundle goes (upstream 3.13's format, read by
    /// `iree-profile` and `iree-profile-render`).
    #[arg(long = "device_profiling_output", value_name = "FILE.ireeprof")]
    pub device_profiling_output: Option<std::path::PathBuf>,
}

/// A trace being recorded for `--trace`: written to its file when dropped
/// (also when the run failed: that is when a trace helps most).
pub struct TraceRecording {
    path: Option<std::path::PathBuf>,
    /// Print `--print_device_statistics` from the recording.
    statistics: bool,
    /// `--device_profiling_output` and the families to write there.
    bundle: Option<(std::path::PathBuf, crate::ireeprof::Families)>,
}

impl TraceRecording {
    /// Stops recording and writes the file; an error naming the file when
    /// it cannot be written. Nothing when no trace was asked for.
    pub fn finish(mut self) -> ferrite_base::Result<()> {
        self.write()
    }

    fn write(&mut self) -> ferrite_base::Result<()> {
        let path = self.path.take();
        let statistics = std::mem::take(&mut self.statistics);
        let bundle = self.bundle.take();
        if path.is_none() && !statistics && bundle.is_none() {
            return Ok(());
        }
        let Some(trace) = ferrite_base::trace::stop() else {
            return Ok(());
        };
        if statistics {
            eprint!("{}", device_statistics_report(&trace));
        }
        if let Some((file, families)) = bundle {
            std::fs::write(&file, crate::ireeprof::bundle(&trace, families)).map_err(|e| {
                ferrite_base::status!(
                    Unavailable,
                    "writing --device_profiling_output={}: {e}",
                    file.display()
                )
            })?;
        }
        match path {
            Some(path) => trace.write_chrome_json(&path),
            None => Ok(()),
        }
    }
}

impl Drop for TraceRecording {
    fn drop(&mut self) {
        if let Err(e) = self.write() {
            eprintln!("{e}");
        }
    }
}

impl DiagnosticArgs {
    /// Starts what must record from before the modules load: the
    /// `--trace` / statistics / `--device_profiling_*` recording (so it
    /// holds the load spans), whose files are written when the returned
    /// recording is finished or dropped. Checks the output paths first.
    pub fn start_recording(&self) -> ferrite_base::Result<TraceRecording> {
        if let Some(path) = &self.trace {
            // The file is created now, so a path that cannot be written
            // fails before the run rather than after it.
            std::fs::write(path, b"").map_err(|e| {
                ferrite_base::status!(
                    InvalidArgument,
                    "--trace={}: cannot write the file: {e}",
                    path.display()
                )
            })?;
        }
        let bundle = match (&self.device_profiling_mode, &self.device_profiling_output) {
            (Some(mode), Some(out)) => {
                let families = crate::ireeprof::Families::parse(mode)?;
                std::fs::write(out, b"").map_err(|e| {
                    ferrite_base::status!(
                        InvalidArgument,
                        "--device_profiling_output={}: cannot write the file: {e}",
                        out.display()
                    )
                })?;
                Some((out.clone(), families))
            }
            (Some(_), None) => ferrite_base::bail!(
                InvalidArgument,
                "--device_profiling_mode needs --device_profiling_output=FILE.ireeprof (Ferrite has no other profile sink)"
            ),
            (None, Some(_)) => ferrite_base::bail!(
                InvalidArgument,
                "--device_profiling_output needs --device_profiling_mode (e.g. queue-events,host-execution)"
            ),
            (None, None) => None,
        };
        // One recording serves the trace file, the statistics and the bundle.
        if self.trace.is_some() || self.print_device_statistics || bundle.is_some() {
            ferrite_base::trace::start()?;
        }
        Ok(TraceRecording {
            path: self.trace.clone(),
            statistics: self.print_device_statistics,
            bundle,
        })
    }

    /// Turns on what needs the loaded context before the first call (the
    /// execution trace).
    pub fn apply(&self, run: &mut RunContext) {
        if self.trace_execution {
            run.context
                .set_trace_execution(Some(ferrite_vm::bytecode::trace::ExecutionTrace::stderr()));
        }
    }

    /// Prints what is printed at exit (the statistics), if asked.
    pub fn finish(&self, run: &RunContext) {
        if self.print_statistics {
            eprint!("{}", statistics_report(&run.devices));
        }
    }
}

/// Upstream's `--print_statistics` report: per device, its name, the
/// allocator heading and the host and device rows, then a blank line. Empty
/// when the program used no device.
pub fn statistics_report(devices: &[DeviceRef]) -> String {
    let mut out = String::new();
    for d in devices {
        let _ = writeln!(out, "Device: {}", d.0.id());
        let _ = writeln!(out, "[[ iree_hal_allocator_t memory statistics ]]");
        let _ = writeln!(out, "{}", d.0.allocator().statistics());
        out.push('\n');
    }
    out
}

/// A duration as upstream's statistics print it: `413 ns`, `4.500 us`,
/// `1.250 ms`, `2.000 s`.
fn fmt_ns(ns: u64) -> String {
    match ns {
        n if n < 1_000 => format!("{n} ns"),
        n if n < 1_000_000 => format!("{:.3} us", n as f64 / 1e3),
        n if n < 1_000_000_000 => format!("{:.3} ms", n as f64 / 1e6),
        n => format!("{:.3} s", n as f64 / 1e9),
    }
}

/// `--print_device_statistics`: upstream's heading and total lines, then
/// one row per (device, queue operation) and per dispatch export, from the
/// events of a recording (see `ferrite_base::trace`). `p=` is the device's
/// place among the devices that recorded (upstream's physical device), and
/// every CPU queue is `q=0`.
pub fn device_statistics_report(trace: &ferrite_base::trace::Trace) -> String {
    use ferrite_base::trace::{Arg, Phase};
    use std::collections::BTreeMap;
    #[derive(Default)]
    struct Row {
        count: u64,
        total_ns: u64,
        bytes: u64,
        tiles: u64,
        tile_ns: u64,
        failed: u64,
        /// Whether the rows' events are spans (alloca is an instant).
        timed: bool,
    }
    let bytes = |e: &ferrite_base::trace::Event| {
        e.args
            .iter()
            .find_map(|(k, v)| match (*k, v) {
                ("bytes", Arg::U64(b)) => Some(*b),
                _ => None,
            })
            .unwrap_or(0)
    };
    let device_of = |track: u32| track.saturating_sub(2);
    let mut queue: BTreeMap<(u32, String), Row> = BTreeMap::new();
    let mut dispatch: BTreeMap<(u32, String), Row> = BTreeMap::new();
    let (mut dispatch_total, mut queue_total) = (0u64, 0u64);
    for e in &trace.events {
        let failed = e.args.iter().any(|(k, _)| *k == "failed") as u64;
        match e.cat {
            "queue" => {
                let r = queue
                    .entry((device_of(e.track), e.name.clone()))
                    .or_default();
                r.count += 1;
                r.bytes += bytes(e);
                r.failed += failed;
                if e.phase == Phase::Complete {
                    r.timed = true;
                    r.total_ns += e.dur_ns;
                    queue_total += e.dur_ns;
                }
            }
            "dispatch" => {
                let r = dispatch
                    .entry((device_of(e.track), e.name.clone()))
                    .or_default();
                r.count += 1;
                r.total_ns += e.dur_ns;
                r.failed += failed;
                dispatch_total += e.dur_ns;
            }
            "tile" => {
                let r = dispatch
                    .entry((device_of(e.track), e.name.clone()))
                    .or_default();
                r.tiles += 1;
                r.tile_ns += e.dur_ns;
            }
            _ => {}
        }
    }
    let mut out = String::from("\nIREE HAL device statistics:\n");
    let _ = writeln!(out, "  aggregate_rows={}", queue.len() + dispatch.len());
    let _ = writeln!(out, "  dispatch_function_total={}", fmt_ns(dispatch_total));
    let _ = writeln!(out, "  host_execution_queue_total={}", fmt_ns(queue_total));
    let devices: BTreeMap<u32, &String> = trace
        .tracks
        .iter()
        .filter(|(t, _)| **t >= 2)
        .map(|(t, n)| (device_of(*t), n))
        .collect();
    for (p, name) in &devices {
        let _ = writeln!(out, "  p={p}: {name}");
    }
    let avg = |r: &Row| fmt_ns(r.total_ns / r.count.max(1));
    for ((p, op), r) in &queue {
        let _ = write!(
            out,
            "  host_execute_queue p={p} q=0 {op}  count={}",
            r.count
        );
        if r.timed {
            let _ = write!(out, " total={} avg={}", fmt_ns(r.total_ns), avg(r));
        }
        if r.bytes > 0 {
            let _ = write!(out, " payload={}B", r.bytes);
        }
        if r.failed > 0 {
            let _ = write!(out, " failed={}", r.failed);
        }
        out.push('\n');
    }
    for ((p, export), r) in &dispatch {
        let _ = write!(
            out,
            "  host_execute p={p} {export}  count={} total={} avg={}",
            r.count,
            fmt_ns(r.total_ns),
            avg(r)
        );
        if r.tiles > 0 {
            let _ = write!(out, " tiles={} tile_sum={}", r.tiles, fmt_ns(r.tile_ns));
        }
        if r.failed > 0 {
            let _ = write!(out, " failed={}", r.failed);
        }
        out.push('\n');
    }
    out
}
