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
}

/// A trace being recorded for `--trace`: written to its file when dropped
/// (also when the run failed: that is when a trace helps most).
pub struct TraceRecording {
    path: Option<std::path::PathBuf>,
}

impl TraceRecording {
    /// Stops recording and writes the file; an error naming the file when
    /// it cannot be written. Nothing when no trace was asked for.
    pub fn finish(mut self) -> ferrite_base::Result<()> {
        self.write()
    }

    fn write(&mut self) -> ferrite_base::Result<()> {
        let Some(path) = self.path.take() else {
            return Ok(());
        };
        match ferrite_base::trace::stop() {
            Some(trace) => trace.write_chrome_json(&path),
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
    /// Turns on what must be on before the first call (the execution
    /// trace, the `--trace` recording, whose file is written when the
    /// returned recording is finished or dropped).
    pub fn apply(&self, run: &mut RunContext) -> ferrite_base::Result<TraceRecording> {
        if self.trace_execution {
            run.context
                .set_trace_execution(Some(ferrite_vm::bytecode::trace::ExecutionTrace::stderr()));
        }
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
            ferrite_base::trace::start()?;
        }
        Ok(TraceRecording {
            path: self.trace.clone(),
        })
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
