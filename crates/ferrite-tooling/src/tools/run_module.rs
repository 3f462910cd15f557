//! `ferrite run-module`: load modules, call one function, print results the
//! way upstream's `iree-run-module` does.

use crate::context::{load_context_with, load_context_with_hal, parse_inputs};
use ferrite_base::status::ResultExt;
use ferrite_base::{bail, Result};
use ferrite_vm::{Context, FunctionRef, Instance, Variant};

pub(crate) mod args;

pub use args::RunModuleArgs;

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
