//! `ferrite`: command-line tools for IREE programs, taking upstream's flags.
//!
//! The tools are a library too ([`main_with_args`]), so that the Python
//! package can ship them as its `ferrite` console command without a
//! separate executable.
//!
//! - `ferrite run-module --module=m.vmfb --function=f --input=42`
//! - `ferrite dump-module [--output=metadata|disassembly] m.vmfb`
//! - `ferrite check-module --module=tests.vmfb [--device=local-sync]`
//! - `ferrite e2e-matmul-test --module=matmul.vmfb --module=calls.vmfb`

mod benchmark_module;
mod check_module;
mod dump_module;
mod e2e_test;
mod format;
mod inputs;
mod npy;
mod outputs;
mod parameters;
mod run_module;

use clap::{Parser, Subcommand};
use std::ffi::OsString;

#[derive(Parser)]
#[command(
    name = "ferrite",
    version,
    about = "Ferrite: a Rust runtime for IREE programs"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
    /// Compile VM bytecode functions to native code at load (the compiling
    /// tier); `--vm_jit=false` runs everything in the interpreter. Same as
    /// the environment variable `FERRITE_VM_JIT`.
    #[arg(long = "vm_jit", global = true, value_name = "BOOL")]
    vm_jit: Option<bool>,
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
    /// Runs generated matmul e2e tests with the `matmul_test` module (like `iree-e2e-matmul-test`).
    E2eMatmulTest(e2e_test::E2eTestArgs),
    /// Runs generated conv2d e2e tests with the `conv2d_test` module (like `iree-e2e-conv2d-test`).
    E2eConv2dTest(e2e_test::E2eTestArgs),
    /// Runs generated attention e2e tests with the `attention_test` module (like `iree-e2e-attention-test`).
    E2eAttentionTest(e2e_test::E2eTestArgs),
}

/// Runs the command line `args` (program name first) and returns the exit
/// status: 0 on success, 1 when the command fails (its error printed to
/// stderr), 2 for usage errors; `--help` and `--version` print and return 0.
pub fn main_with_args<I, T>(args: I) -> i32
where
    I: IntoIterator<Item = T>,
    T: Into<OsString> + Clone,
{
    let cli = match Cli::try_parse_from(args) {
        Ok(cli) => cli,
        Err(e) => {
            let _ = e.print();
            return e.exit_code();
        }
    };
    if let Some(on) = cli.vm_jit {
        // Instances read the switch when created (`InstanceOptions`); the
        // commands create theirs after this, on this thread.
        std::env::set_var("FERRITE_VM_JIT", if on { "1" } else { "0" });
    }
    let result = match &cli.command {
        Command::RunModule(a) => run_module::run(a),
        Command::DumpModule(a) => dump_module::run(a),
        Command::BenchmarkModule(a) => benchmark_module::run(a),
        Command::CheckModule(a) => check_module::run(a),
        Command::E2eMatmulTest(a) => {
            e2e_test::run(a, ferrite_modules::e2e::matmul::create_matmul_test_module)
        }
        Command::E2eConv2dTest(a) => {
            e2e_test::run(a, ferrite_modules::e2e::conv2d::create_conv2d_test_module)
        }
        Command::E2eAttentionTest(a) => e2e_test::run(
            a,
            ferrite_modules::e2e::attention::create_attention_test_module,
        ),
    };
    match result {
        Ok(()) => 0,
        Err(e) => {
            eprintln!("{e}");
            1
        }
    }
}
