//! `ferrite run-module`: load modules, call one function, print results the
//! way upstream's `iree-run-module` does.

use crate::format::format_result;
use crate::inputs::parse_scalar;
use ferrite_base::status::ResultExt;
use ferrite_base::{bail, Result};
use ferrite_vm::{BytecodeModule, Context, Instance, Module, ModuleBytes};
use std::sync::Arc;

/// Options of `run-module` (upstream's flag names).
#[derive(clap::Args, Debug)]
pub struct RunModuleArgs {
    /// A `.vmfb` file to load; repeat for several (the last is the main module).
    #[arg(long = "module", required = true)]
    pub modules: Vec<String>,
    /// Function to call (`name` or `module.name`).
    #[arg(long)]
    pub function: String,
    /// Function inputs in upstream's syntax (`42`, `1.5`).
    #[arg(long = "input")]
    pub inputs: Vec<String>,
    /// Device to run on (accepted for compatibility; VM-only modules need none).
    #[arg(long = "device")]
    pub devices: Vec<String>,
    /// Registers the `yieldable_test` native module (for upstream's async VM tests).
    #[arg(long = "yieldable-test-module")]
    pub yieldable_test_module: bool,
    /// Number of times to run the function (for timing; results printed once).
    #[arg(long, default_value_t = 1)]
    pub repeat: u64,
}

/// Loads the modules named on the command line, in order, into a context.
pub fn load_context(instance: &Instance, modules: &[String], yieldable: bool) -> Result<Context> {
    let mut ctx = Context::new(instance);
    if yieldable {
        ctx.register(ferrite_vm::testing::yieldable_test_module()?)?;
    }
    for path in modules {
        let bytes = if path == "-" {
            let mut v = Vec::new();
            std::io::Read::read_to_end(&mut std::io::stdin(), &mut v)?;
            ModuleBytes::from_vec(v)
        } else {
            ModuleBytes::map_file(path)
                .annotate(|| format!("loading bytecode module at '{path}'"))?
        };
        let m = BytecodeModule::load(instance, bytes)
            .annotate(|| format!("loading bytecode module at '{path}'"))?;
        for i in m.imports() {
            if i.full_name.starts_with("hal.") && !i.optional {
                bail!(
                    Unimplemented,
                    "module '{}' imports '{}': it needs a HAL device, and this build has none (available devices: none)",
                    m.name(),
                    i.full_name
                );
            }
        }
        ctx.register(m as Arc<dyn Module>)?;
    }
    Ok(ctx)
}

/// Runs the command; returns the process exit code.
pub fn run(args: &RunModuleArgs) -> Result<()> {
    let instance = Instance::default();
    let ctx = load_context(&instance, &args.modules, args.yieldable_test_module)
        .annotate(|| "creating run context".to_string())?;
    let f = ctx
        .lookup_function(&args.function)
        .annotate(|| format!("looking up function '{}'", args.function))?;
    // Inputs are parsed by the function's argument types, as upstream does;
    // extra inputs beyond the signature are counted, not parsed.
    let inputs = args
        .inputs
        .iter()
        .enumerate()
        .map(|(i, t)| match f.cconv.args.get(i) {
            Some(ty) => parse_scalar(t, ty, i),
            None => Ok(ferrite_vm::Variant::Null),
        })
        .collect::<Result<Vec<_>>>()
        .annotate(|| "parsing function inputs".to_string())?;
    println!("EXEC @{}", args.function);
    // Upstream prints the EXEC line before checking the argument count.
    if inputs.len() != f.cconv.args.len() {
        bail!(
            InvalidArgument,
            "input list and function mismatch; expected {} arguments but passed {}; invoking function '{}'",
            f.cconv.args.len(),
            inputs.len(),
            args.function
        );
    }
    let mut results = Vec::new();
    for _ in 0..args.repeat.max(1) {
        results = ctx
            .invoke(&f, inputs.clone())
            .annotate(|| format!("invoking function '{}'", args.function))?;
    }
    for (i, r) in results.iter().enumerate() {
        println!("result[{i}]: {}", format_result(r));
    }
    Ok(())
}
