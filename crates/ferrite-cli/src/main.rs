//! `ferrite`: command-line tools for IREE programs, taking upstream's flags.
//!
//! - `ferrite run-module --module=m.vmfb --function=f --input=42`
//! - `ferrite dump-module [--output=metadata|disassembly] m.vmfb`
//! - `ferrite check-module --module=tests.vmfb [--device=local-sync]`

mod benchmark_module;
mod check_module;
mod dump_module;
mod format;
mod inputs;
mod npy;
mod outputs;
mod run_module;

use clap::{Parser, Subcommand};
use std::process::ExitCode;

#[derive(Parser)]
#[command(
    name = "ferrite",
    version,
    about = "Ferrite: a Rust runtime for IREE programs"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

// The subcommands are named after the upstream tools they stand in for.
#[allow(clippy::enum_variant_names)]
#[derive(Subcommand)]
enum Command {
    /// Loads modules and runs one function (like `iree-run-module`).
    RunModule(run_module::RunModuleArgs),
    /// Prints a module's metadata and disassembly (like `iree-dump-module`).
    DumpModule(dump_module::DumpModuleArgs),
    /// Times calls of one function (like `iree-benchmark-module`).
    BenchmarkModule(benchmark_module::BenchmarkModuleArgs),
    /// Runs each test function of a self-checking program (like `iree-check-module`).
    CheckModule(check_module::CheckModuleArgs),
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match &cli.command {
        Command::RunModule(a) => run_module::run(a),
        Command::DumpModule(a) => dump_module::run(a),
        Command::BenchmarkModule(a) => benchmark_module::run(a),
        Command::CheckModule(a) => check_module::run(a),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("{e}");
            ExitCode::FAILURE
        }
    }
}
