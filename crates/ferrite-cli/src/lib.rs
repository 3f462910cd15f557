//! `ferrite`: command-line tools for IREE programs, taking upstream's flags.
//!
//! A thin layer: the tools themselves (`run-module`, `benchmark-module`,
//! `dump-module`, `check-module`) live in `ferrite-tooling`, which the
//! Python package's `ferrite` console command runs too, and the e2e test
//! runners in `ferrite-e2e`; this crate puts them under one executable.
//!
//! - `ferrite run-module --module=m.vmfb --function=f --input=42`
//! - `ferrite dump-module [--output=metadata|disassembly] m.vmfb`
//! - `ferrite check-module --module=tests.vmfb [--device=local-sync]`
//! - `ferrite e2e-matmul-test --module=matmul.vmfb --module=calls.vmfb`
//! - `ferrite generate --gguf=model.gguf --chat="Hello"` (ferrite-llm)
//! - `ferrite serve --gguf=model.gguf [--port=8000]` (ferrite-serve: an
//!   OpenAI-compatible server)
//!
//! Every command reads `--flagfile=PATH` (flags from a file, in place) and
//! keeps the last value of a flag given twice, as upstream's tools.

pub mod generate;

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
}

// The subcommands are named after the upstream tools they stand in for.
// One value per process, parsed once: the variants' sizes do not matter.
#[allow(clippy::enum_variant_names, clippy::large_enum_variant)]
#[derive(Subcommand)]
enum Command {
    #[command(flatten)]
    Tool(ferrite_tooling::Tool),
    /// Runs generated matmul e2e tests with the `matmul_test` module (like `iree-e2e-matmul-test`).
    E2eMatmulTest(ferrite_e2e::runner::E2eTestArgs),
    /// Runs generated conv2d e2e tests with the `conv2d_test` module (like `iree-e2e-conv2d-test`).
    E2eConv2dTest(ferrite_e2e::runner::E2eTestArgs),
    /// Runs generated attention e2e tests with the `attention_test` module (like `iree-e2e-attention-test`).
    E2eAttentionTest(ferrite_e2e::runner::E2eTestArgs),
    /// Generates text with a GGUF language model (ferrite-llm): `--gguf=PATH --chat=TEXT`.
    Generate(generate::GenerateArgs),
    /// Serves a GGUF language model over an OpenAI-compatible HTTP API (ferrite-serve): `--gguf=PATH [--port=N]`.
    Serve(ferrite_serve::ServeArgs),
}

/// Runs the command line `args` (program name first) and returns the exit
/// status: 0 on success, 1 when the command fails (its error printed to
/// stderr), 2 for usage errors; `--help` and `--version` print and return 0.
pub fn main_with_args<I, T>(args: I) -> i32
where
    I: IntoIterator<Item = T>,
    T: Into<OsString> + Clone,
{
    ferrite_tooling::run_main::<Cli>(args, |cli| match &cli.command {
        Command::Tool(t) => t.run(),
        Command::E2eMatmulTest(a) => {
            ferrite_e2e::runner::run(a, ferrite_e2e::matmul::create_matmul_test_module)
        }
        Command::E2eConv2dTest(a) => {
            ferrite_e2e::runner::run(a, ferrite_e2e::conv2d::create_conv2d_test_module)
        }
        Command::E2eAttentionTest(a) => {
            ferrite_e2e::runner::run(a, ferrite_e2e::attention::create_attention_test_module)
        }
        Command::Generate(a) => generate::run(a),
        Command::Serve(a) => ferrite_serve::run(a),
    })
}
