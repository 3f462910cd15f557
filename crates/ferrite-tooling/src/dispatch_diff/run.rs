//! `run-module --compare_device`: the function traced on both devices,
//! then the traces compared.

use super::compare::compare;
use super::trace::{DispatchRecord, Recorder};
use crate::context::{load_context_with, parse_inputs};
use crate::tools::run_module::args::RunModuleArgs;
use ferrite_base::status::ResultExt;
use ferrite_base::Result;
use ferrite_vm::Instance;
use std::sync::Arc;

/// Runs `args`' function on `args`' devices and modules, then on
/// `other` with `--compare_module`s (default: the same modules), each
/// traced; prints each run's results and the comparison. Exits 1 when a
/// matched dispatch differs or one has no counterpart.
pub fn run_compare(args: &RunModuleArgs, other: &str) -> Result<()> {
    let function = args.function.as_deref().unwrap_or_default();
    let mut other_devices = args.device.clone();
    other_devices.devices = vec![other.to_string()];
    let other_modules = if args.compare_modules.is_empty() {
        &args.modules
    } else {
        &args.compare_modules
    };
    let first = args
        .device
        .devices
        .first()
        .map_or("the default device", |s| s.as_str());
    let a = traced(
        args,
        &args.device,
        &args.modules,
        function,
        first,
        &args.outputs,
    )?;
    let b = traced(args, &other_devices, other_modules, function, other, &[])?;
    let report = compare(&a, &b, args.compare_atol, args.compare_rtol);
    print!("{}", report.text(first, other, 5));
    if !report.differing.is_empty() || !report.unmatched.is_empty() {
        std::process::exit(1);
    }
    Ok(())
}

fn traced(
    args: &RunModuleArgs,
    devices: &crate::device_flags::DeviceArgs,
    modules: &[String],
    function: &str,
    label: &str,
    outputs: &[String],
) -> Result<Vec<DispatchRecord>> {
    let rec = Arc::new(Recorder::default());
    super::set_recorder(Some(rec.clone()));
    let instance = Instance::default();
    let run = load_context_with(
        &instance,
        modules,
        args.module_mode,
        devices,
        args.yieldable_test_module,
        args.params.modules()?,
    );
    super::set_recorder(None);
    let run = run.annotate(|| format!("creating the run context on {label}"))?;
    let f = run
        .context
        .lookup_function(function)
        .annotate(|| format!("looking up function '{function}'"))?;
    let inputs = parse_inputs(&args.inputs, &f.cconv.args, &run.devices)?;
    println!("EXEC @{function} on {label}");
    let results = run
        .context
        .invoke(&f, inputs)
        .annotate(|| format!("invoking function '{function}' on {label}"))?;
    crate::outputs::process_results(
        &results,
        &f.cconv.results,
        outputs,
        &[],
        &args.compare,
        args.print_max_element_count,
    )?;
    Ok(rec.take())
}
