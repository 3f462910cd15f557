//! `ferrite run-module`: load modules, call one function, print results the
//! way upstream's `iree-run-module` does.

use crate::context::{load_context_with, load_context_with_hal, parse_inputs};
use crate::device_flags::LISTING;
use ferrite_base::status::ResultExt;
use ferrite_base::{bail, Result};
use ferrite_vm::{Context, FunctionRef, Instance, Variant};

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

/// Runs the command. When an expected output does not match, the process
/// exits with status 1 after the `[FAILED]` report, printing nothing more
/// (as upstream).
pub fn run(args: &RunModuleArgs) -> Result<()> {
    if args.device.wants_listing() {
        return args.device.print_listing();
    }
    if let Some(ranks) = args.spmd_ranks {
        return run_ranks(args, ranks);
    }
    if let Some(other) = &args.compare_device {
        return crate::dispatch_diff::run::run_compare(args, other);
    }
    // Recording starts before loading: the trace shows the loads.
    let trace = args.diagnostics.start_recording()?;
    let instance = Instance::default();
    let mut run = load_context_with(
        &instance,
        &args.modules,
        args.module_mode,
        &args.device,
        args.yieldable_test_module,
        args.params.modules()?,
    )
    .annotate(|| "creating run context".to_string())?;
    args.diagnostics.apply(&mut run);
    let ctx = &run.context;
    let function = match &args.function {
        Some(f) => f.clone(),
        None => only_export(ctx).annotate(|| "creating run context".to_string())?,
    };
    let function = function.as_str();
    let f = ctx
        .lookup_function(function)
        .annotate(|| format!("looking up function '{}'", function))?;
    let inputs = parse_inputs(&args.inputs, &f.cconv.args, &run.devices)?;
    {
        use std::io::Write;
        let mut out = std::io::stdout().lock();
        let _ = writeln!(out, "EXEC @{}", function);
        let _ = out.flush();
    }
    // Upstream prints the EXEC line before checking the argument count.
    let results = invoke_repeated(ctx, &f, &inputs, function, args.repeat)?;
    let matched = crate::outputs::process_results(
        &results,
        &f.cconv.results,
        &args.outputs,
        &args.expected_outputs,
        &args.compare,
        args.print_max_element_count,
    )
    .annotate(|| "processing function outputs".to_string())?;
    // Statistics are read once the program's buffers are released.
    drop(results);
    drop(inputs);
    trace.finish()?;
    args.diagnostics.finish(&run);
    if !matched {
        std::process::exit(1);
    }
    Ok(())
}

/// Checks the argument count as upstream does, then invokes `f` `repeat`
/// times (at least once) with `inputs`; the last call's results.
fn invoke_repeated(
    ctx: &Context,
    f: &FunctionRef,
    inputs: &[Variant],
    function: &str,
    repeat: u64,
) -> Result<Vec<Variant>> {
    if inputs.len() != f.cconv.args.len() {
        // The declaration says what the arguments are (upstream prints it).
        let declaration = f
            .state
            .module()
            .exports()
            .get(f.ordinal as usize)
            .and_then(|e| {
                e.signature
                    .attr("iree.abi.declaration")
                    .map(|d| format!("; `{d}`"))
            })
            .unwrap_or_default();
        bail!(
            InvalidArgument,
            "input list and function mismatch; expected {} arguments but passed {}; invoking function '{}'{}",
            f.cconv.args.len(),
            inputs.len(),
            function,
            declaration
        );
    }
    let mut results = Vec::new();
    for _ in 0..repeat.max(1) {
        results = ctx
            .invoke(f, inputs.to_vec())
            .annotate(|| format!("invoking function '{}'", function))?;
    }
    Ok(results)
}

/// The function to run when `--function` is not given: the main (last)
/// module's one exported function (internal `__`-prefixed exports such as
/// `__init` aside), as upstream; an error naming the exports otherwise.
fn only_export(ctx: &Context) -> Result<String> {
    let Some(main) = ctx.modules().last() else {
        bail!(InvalidArgument, "no module loaded (--module=FILE.vmfb)");
    };
    let exports: Vec<&str> = main
        .exports()
        .iter()
        .map(|e| e.name.as_str())
        .filter(|n| !n.starts_with("__"))
        .collect();
    match exports.as_slice() {
        [one] => Ok(one.to_string()),
        [] => bail!(
            InvalidArgument,
            "module '{}' exports no function; nothing to run",
            main.name()
        ),
        many => bail!(
            InvalidArgument,
            "more than one exported function present; --function= must be specified explicitly (exports: {})",
            many.join(", ")
        ),
    }
}

/// `{rank}` in each of `specs` replaced by `rank`.
fn for_rank(specs: &[String], rank: u32) -> Vec<String> {
    specs
        .iter()
        .map(|s| s.replace("{rank}", &rank.to_string()))
        .collect()
}

/// `--spmd_ranks=N`: one thread per rank, each loading the modules on its
/// own devices with the rank's channel provider; results are printed in
/// rank order (each rank waits for its turn to print, failed or not, so a
/// failing rank never holds the others).
fn run_ranks(args: &RunModuleArgs, ranks: u32) -> Result<()> {
    if ranks == 0 {
        bail!(InvalidArgument, "--spmd_ranks must be at least 1");
    }
    let Some(function) = args.function.as_deref() else {
        bail!(InvalidArgument, "--spmd_ranks needs --function=NAME");
    };
    let instance = Instance::default();
    {
        use std::io::Write;
        let mut out = std::io::stdout().lock();
        let _ = writeln!(out, "EXEC @{}", function);
        let _ = out.flush();
    }
    let turn = (parking_lot::Mutex::new(0u32), parking_lot::Condvar::new());
    let matched = ferrite::spmd::run(ranks, |rank| {
        let r = rank.rank();
        let outcome = (|| {
            // `cuda://{rank}`: one GPU per rank (NCCL needs distinct GPUs).
            let mut devices = args.device.clone();
            devices.devices = for_rank(&devices.devices, r);
            let run = load_context_with_hal(
                &instance,
                &args.modules,
                args.module_mode,
                &devices,
                args.yieldable_test_module,
                args.params.modules()?,
                ferrite::spmd::hal_options(&rank),
            )
            .annotate(|| "creating run context".to_string())?;
            let ctx = &run.context;
            let f = ctx
                .lookup_function(function)
                .annotate(|| format!("looking up function '{}'", function))?;
            let inputs = parse_inputs(&for_rank(&args.inputs, r), &f.cconv.args, &run.devices)?;
            let results = invoke_repeated(ctx, &f, &inputs, function, args.repeat)?;
            Ok((results, f.cconv.results.clone()))
        })();
        let mut next = turn.0.lock();
        while *next != r {
            turn.1.wait(&mut next);
        }
        let printed = outcome.and_then(|(results, types)| {
            crate::outputs::print_flush(&format!("rank {r}:\n"));
            crate::outputs::process_results(
                &results,
                &types,
                &for_rank(&args.outputs, r),
                &for_rank(&args.expected_outputs, r),
                &args.compare,
                args.print_max_element_count,
            )
            .annotate(|| "processing function outputs".to_string())
        });
        *next += 1;
        turn.1.notify_all();
        printed
    })?;
    if matched.contains(&false) {
        std::process::exit(1);
    }
    Ok(())
}
