//! What the run and benchmark tools can report about a run besides its
//! results, under upstream's flag names: `--trace_execution` (one line per
//! executed VM op on stderr) and `--print_statistics` (each device's
//! allocator statistics on stderr at exit, in upstream's layout).

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
}

impl DiagnosticArgs {
    /// Turns on what must be on before the first call (the execution trace).
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
