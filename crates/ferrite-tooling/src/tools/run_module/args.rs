//! `run-module`'s flags, in a file of their own so that the modes living
//! elsewhere (`dispatch_diff::run`, `--compare_device`) take them without
//! naming the tool that calls them.

use crate::device_flags::LISTING;

/// Options of `run-module` (upstream's flag names).
#[derive(clap::Args, Debug)]
pub struct RunModuleArgs {
    /// A `.vmfb` file to load; repeat for several (the last is the main module).
    #[arg(long = "module", required_unless_present_any = LISTING)]
    pub modules: Vec<String>,
    /// How module files are read: `mmap` (default) or `preload`.
    #[arg(long = "module_mode", value_enum, default_value_t = crate::context::ModuleMode::Mmap)]
    pub module_mode: crate::context::ModuleMode,
    /// Function to call (`name` or `module.name`).
    #[arg(long)]
    pub function: Option<String>,
    /// Function inputs in upstream's syntax: scalars (`42`, `1.5`), tensors
    /// (`2x2xi32=1 2 3 4`, `2x2xi32=@raw.bin`), numpy files (`@a.npy` from
    /// the start, `+a.npy` continuing in the same file, `*a.npy` all arrays
    /// left), `(null)`.
    #[arg(long = "input", allow_hyphen_values = true)]
    pub inputs: Vec<String>,
    /// Where each result goes, one flag per result: `-` stdout, empty to
    /// drop it, `@f.npy`/`+f.npy` numpy create/append, `@f.bin`/`+f.bin` raw.
    #[arg(long = "output", allow_hyphen_values = true)]
    pub outputs: Vec<String>,
    /// An expected result (same syntax as `--input`, `(ignored)` to skip);
    /// results are compared instead of printed and a mismatch exits 1.
    #[arg(long = "expected_output", allow_hyphen_values = true)]
    pub expected_outputs: Vec<String>,
    /// Tolerances and equality mode for `--expected_output`.
    #[command(flatten)]
    pub compare: crate::outputs::CompareArgs,
    /// Devices and driver flags (`--device`, `--task_*`, `--list_devices`).
    #[command(flatten)]
    pub device: crate::device_flags::DeviceArgs,
    /// Maximum elements of a tensor printed before eliding.
    #[arg(
        long = "print_max_element_count",
        alias = "output_max_element_count",
        default_value_t = 1024
    )]
    pub print_max_element_count: usize,
    /// Registers the `yieldable_test` native module (for upstream's async VM tests).
    #[arg(long = "yieldable-test-module")]
    pub yieldable_test_module: bool,
    /// Parameter files (`--parameters`, `--parameter_mode`).
    #[command(flatten)]
    pub params: crate::parameters::ParameterArgs,
    /// `--trace_execution`, `--print_statistics`.
    #[command(flatten)]
    pub diagnostics: crate::diagnostics::DiagnosticArgs,
    /// Number of times to run the function (for timing; results printed once).
    #[arg(long, default_value_t = 1)]
    pub repeat: u64,
    /// Runs the program on N ranks in one process (Ferrite's flag): each
    /// rank has its own copy of the `--device`s and its own context, and
    /// the program's collective channels connect the ranks. `{rank}` in
    /// `--device` (e.g. `cuda://{rank}`, one GPU per rank), `--input`,
    /// `--output` and `--expected_output` values stands for the
    /// rank's number; results are printed per rank under `rank R:`.
    #[arg(long = "spmd_ranks")]
    pub spmd_ranks: Option<u32>,
    /// Dispatch-level differential run (Ferrite's flag): the function runs
    /// on `--device`, then on this device, each executing every command
    /// alone and recording what each dispatch wrote; prints the first
    /// dispatch whose output differs (see `dispatch_diff`); exits 1 on a
    /// difference.
    #[arg(long = "compare_device")]
    pub compare_device: Option<String>,
    /// Modules for the `--compare_device` run (e.g. the program compiled
    /// for the CPU); the `--module`s when none.
    #[arg(long = "compare_module")]
    pub compare_modules: Vec<String>,
    /// Absolute tolerance of `--compare_device` (outputs read as f32).
    #[arg(long = "compare_atol", default_value_t = 1e-5)]
    pub compare_atol: f64,
    /// Relative tolerance of `--compare_device`.
    #[arg(long = "compare_rtol", default_value_t = 1e-4)]
    pub compare_rtol: f64,
}
