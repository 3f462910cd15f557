//! The `ferrite` executable: see the library for the commands.

use std::process::ExitCode;

fn main() -> ExitCode {
    let code = ferrite_cli::main_with_args(std::env::args_os());
    ExitCode::from(u8::try_from(code).unwrap_or(1))
}
