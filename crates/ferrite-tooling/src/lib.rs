//! What Ferrite's command-line tools share, as upstream keeps it in
//! `iree/tooling`, and the tools themselves as library commands.
//!
//! - [`flagfile`]: `--flagfile=PATH` (flags read from a file, in place).
//! - [`flag_table`]: every flag of upstream's tools and what Ferrite does
//!   with it (`docs/flags.md`); ignored flags warn, rejected ones fail.
//! - [`device_flags`]: `--device`, `--list_drivers`, `--list_devices`,
//!   `--dump_devices` and the `--task_*` flags, over the facade's
//!   [driver registry](ferrite::driver).
//! - [`diagnostics`]: `--trace_execution` and `--print_statistics`.
//! - [`inputs`]: `--input` parsing (scalars, `4xf32=1,2,3,4`, `@file.npy`).
//! - [`outputs`], [`format`](mod@format): `--output` (`-`, `@file.npy`, `+file.bin`),
//!   `--expected_output` comparison, printing values as upstream does.
//! - [`npy`]: the one `.npy` reader and writer (also for
//!   [`ferrite::Tensor`]s).
//! - [`parameters`]: `--parameters` and `--parameter_mode`.
//! - [`benchmark`]: the benchmark runner (timing, repetitions, aggregates,
//!   google benchmark's reports).
//! - [`context`]: loading `--module`s into a VM context with the `hal`
//!   module over the selected devices.
//! - [`loaded_trace`]: a `--trace` JSON file read back, for `profile`'s
//!   tables and [`profile_png`]'s timeline.
//! - [`tools`]: `run-module`, `benchmark-module` (with the benchmark
//!   runner), `dump-module`, `check-module`; [`Tool`] bundles them so that
//!   the `ferrite` executable and the Python package's console command
//!   offer the same commands.
#![deny(missing_docs)]

pub mod benchmark;
pub mod context;
pub mod device_flags;
pub mod diagnostics;
pub mod dispatch_diff;
pub mod flag_table;
pub mod flagfile;
pub mod format;
pub mod inputs;
pub mod ireeprof;
pub mod loaded_trace;
pub mod npy;
pub mod outputs;
pub mod parameters;
pub mod profile_png;
pub mod tools;

use clap::{CommandFactory, Parser, Subcommand};
use ferrite_base::Result;
use std::ffi::OsString;

/// The tools, as subcommands named after the upstream tools they stand in
/// for.
// The variants are named after upstream's tools.
#[allow(clippy::enum_variant_names)]
#[derive(Subcommand, Debug)]
pub enum Tool {
    /// Loads modules and runs one function (like `iree-run-module`).
    RunModule(tools::run_module::RunModuleArgs),
    /// Prints a module's metadata and disassembly (like `iree-dump-module`).
    DumpModule(tools::dump_module::DumpModuleArgs),
    /// Times calls of one function (like `iree-benchmark-module`).
    BenchmarkModule(tools::benchmark_module::BenchmarkModuleArgs),
    /// Runs each test function of a self-checking program (like `iree-check-module`).
    CheckModule(tools::check_module::CheckModuleArgs),
    /// Summarizes a `--trace=FILE.json` trace: top dispatches by time, queue operations, waits; `--png=OUT.png` draws the timeline.
    Profile(tools::profile::ProfileArgs),
}

impl Tool {
    /// Runs the tool.
    pub fn run(&self) -> Result<()> {
        match self {
            Tool::RunModule(a) => tools::run_module::run(a),
            Tool::DumpModule(a) => tools::dump_module::run(a),
            Tool::BenchmarkModule(a) => tools::benchmark_module::run(a),
            Tool::CheckModule(a) => tools::check_module::run(a),
            Tool::Profile(a) => tools::profile::run(a),
        }
    }
}

#[derive(Parser)]
#[command(
    name = "ferrite",
    version,
    about = "Ferrite: a Rust runtime for IREE programs"
)]
struct ToolsCli {
    #[command(subcommand)]
    tool: Tool,
}

/// Runs the command line `args` (program name first) with the [`Tool`]s
/// and returns the exit status (see [`run_main`]).
pub fn main_with_args<I, T>(args: I) -> i32
where
    I: IntoIterator<Item = T>,
    T: Into<OsString> + Clone,
{
    run_main::<ToolsCli>(args, |cli| cli.tool.run())
}

/// Parses `args` (program name first) as `C` the way upstream's tools
/// parse flags, and runs `run` on the result: `--flagfile=PATH` is
/// expanded in place, upstream flags Ferrite ignores or rejects are
/// handled as [`flag_table`] says, and a flag given twice keeps its last
/// value (list flags accumulate). Returns the exit status: 0 on success, 1 when the
/// command fails (its error printed to stderr), 2 for usage errors;
/// `--help` and `--version` print and return 0.
pub fn run_main<C: Parser>(
    args: impl IntoIterator<Item = impl Into<OsString> + Clone>,
    run: impl FnOnce(C) -> Result<()>,
) -> i32 {
    let args: Vec<OsString> = args.into_iter().map(Into::into).collect();
    let args = match flagfile::expand_flagfiles(args).and_then(flag_table::screen) {
        Ok(a) => a,
        Err(e) => {
            // Upstream's tools exit with a failure status on flag errors.
            eprintln!("{e}");
            return 1;
        }
    };
    let args = take_vm_jit_flag(args);
    let parsed = command::<C>()
        .try_get_matches_from(args)
        .and_then(|m| C::from_arg_matches(&m));
    let cli = match parsed {
        Ok(cli) => cli,
        Err(e) => {
            let _ = e.print();
            return e.exit_code();
        }
    };
    match run(cli) {
        Ok(()) => 0,
        Err(e) => {
            eprintln!("{e}");
            1
        }
    }
}

/// Removes `--vm_jit[=BOOL]` (any position, last one wins) and applies it
/// as `FERRITE_VM_JIT`, which VM instances read when created: the switch of
/// the compiling tier, taken by every tool.
fn take_vm_jit_flag(args: Vec<OsString>) -> Vec<OsString> {
    let mut on = None;
    let rest = args
        .into_iter()
        .filter(|a| {
            let Some(s) = a.to_str() else { return true };
            let v = match s.strip_prefix("--vm_jit") {
                Some("") => "true",
                Some(v) if v.starts_with('=') => &v[1..],
                _ => return true,
            };
            on = Some(!matches!(v, "false" | "0" | "off" | "no"));
            false
        })
        .collect();
    if let Some(on) = on {
        // Single-threaded here: the tools have not started any thread yet.
        std::env::set_var("FERRITE_VM_JIT", if on { "1" } else { "0" });
    }
    rest
}

/// `C`'s command with upstream's override rule on it and its subcommands.
fn command<C: CommandFactory>() -> clap::Command {
    fn overriding(cmd: clap::Command) -> clap::Command {
        let names: Vec<String> = cmd
            .get_subcommands()
            .map(|s| s.get_name().to_string())
            .collect();
        let mut cmd = cmd.args_override_self(true);
        for n in names {
            cmd = cmd.mut_subcommand(n, overriding);
        }
        cmd
    }
    overriding(C::command())
}
