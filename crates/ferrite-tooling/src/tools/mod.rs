//! The tools, each a `clap::Args` struct of upstream's flags and a `run`.

pub mod benchmark_module;
pub mod check_module;
pub mod dump_module;
pub mod profile;
pub mod run_module;
