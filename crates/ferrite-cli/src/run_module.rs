//! `ferrite run-module`: load modules, call one function, print results the
//! way upstream's `iree-run-module` does.

use crate::inputs::parse_scalar;
use ferrite_base::status::ResultExt;
use ferrite_base::{bail, Result};
use ferrite_hal::device::DeviceRef;
use ferrite_hal::module::HalModuleOptions;
use ferrite_hal_cpu::CpuDevice;
use ferrite_vm::cconv::CconvType;
use ferrite_vm::{BytecodeModule, Context, Instance, Module, ModuleBytes, Ref, Variant};
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
    /// HAL device(s) to run on: `local-sync` or `local-task` (default when
    /// the program needs one: `local-task`).
    #[arg(long = "device")]
    pub devices: Vec<String>,
    /// Worker threads of `local-task` (0 = one per core).
    #[arg(long = "task_topology_group_count", default_value_t = 0)]
    pub task_workers: usize,
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
    /// Number of times to run the function (for timing; results printed once).
    #[arg(long, default_value_t = 1)]
    pub repeat: u64,
}

/// The devices this build offers.
pub const AVAILABLE_DEVICES: &[&str] = &["local-sync", "local-task"];

/// Creates the HAL device named `name` (`local-sync`, `local-task`, with an
/// optional `://` suffix as upstream accepts).
pub fn create_device(name: &str, task_workers: usize) -> Result<DeviceRef> {
    let driver = name.split("://").next().unwrap_or(name);
    match driver {
        "local-sync" => Ok(DeviceRef(CpuDevice::local_sync())),
        "local-task" => Ok(DeviceRef(CpuDevice::local_task(task_workers)?)),
        other => bail!(
            NotFound,
            "device '{other}' is not available; available devices: {}",
            AVAILABLE_DEVICES.join(", ")
        ),
    }
}

/// A context with the modules named on the command line, in order, plus the
/// `hal` module (over `devices`) when a program needs it.
pub struct RunContext {
    /// The VM context.
    pub context: Context,
    /// The devices the `hal` module serves (empty for VM-only programs).
    pub devices: Vec<DeviceRef>,
}

/// Loads the modules named on the command line, in order, into a context,
/// with `extra` native modules (e.g. `check`, `io_parameters`) registered
/// after `hal` and before the loaded modules.
pub fn load_context_with(
    instance: &Instance,
    modules: &[String],
    devices: &[String],
    task_workers: usize,
    yieldable: bool,
    extra: Vec<Arc<dyn Module>>,
) -> Result<RunContext> {
    ferrite_hal::module::register_types(instance.types());
    let mut loaded = Vec::new();
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
        loaded.push(m);
    }
    let needs_hal = loaded.iter().any(|m| {
        m.dependencies().iter().any(|d| d.name == "hal")
            || m.imports().iter().any(|i| i.full_name.starts_with("hal."))
    });
    let mut ctx = Context::new(instance);
    let mut hal_devices = Vec::new();
    if needs_hal {
        let names: Vec<&str> = if devices.is_empty() {
            vec!["local-task"]
        } else {
            devices.iter().map(String::as_str).collect()
        };
        for n in names {
            hal_devices.push(
                create_device(n, task_workers).annotate(|| format!("creating device '{n}'"))?,
            );
        }
        let hal = ferrite_hal::module::create_hal_module(
            hal_devices.clone(),
            HalModuleOptions::default(),
        )?;
        ctx.register(hal)?;
    }
    if yieldable {
        ctx.register(ferrite_vm::testing::yieldable_test_module()?)?;
    }
    // Programs compiled with parameters import `io_parameters`
    // unconditionally; without `--parameters` it serves no scope, so a load
    // fails with a message naming the scope (as upstream).
    let needs_parameters = loaded.iter().any(|m| {
        m.imports()
            .iter()
            .any(|i| i.full_name.starts_with("io_parameters."))
    });
    if needs_parameters && !extra.iter().any(|m| m.name() == "io_parameters") {
        ctx.register(ferrite_modules::io_parameters::create_io_parameters_module(
            Vec::new(),
        )?)?;
    }
    for m in extra {
        ctx.register(m)?;
    }
    for m in loaded {
        ctx.register(m as Arc<dyn Module>)?;
    }
    Ok(RunContext {
        context: ctx,
        devices: hal_devices,
    })
}

/// Parses one `--input` for an argument of type `ty`: scalars by type,
/// tensors (`4xf32=1,2,3,4`) into buffer views on the first device.
#[allow(dead_code)]
pub fn parse_input(
    text: &str,
    ty: &CconvType,
    index: usize,
    devices: &[DeviceRef],
) -> Result<Variant> {
    match ty {
        CconvType::Ref => {
            let Some(device) = devices.first() else {
                bail!(
                    InvalidArgument,
                    "input {index} `{text}` is a tensor but the program uses no HAL device"
                );
            };
            let view = ferrite_hal::buffer_view::parse_input(text, &*device.0.allocator())?;
            Ok(Variant::Ref(Ref::new(view)))
        }
        ty => parse_scalar(text, ty, index),
    }
}

/// Parses all `--input` values for `f`'s arguments (upstream's
/// `iree_tooling_parse_variants`), tensors on the first device.
pub fn parse_inputs(
    specs: &[String],
    arg_types: &[CconvType],
    devices: &[DeviceRef],
) -> Result<Vec<Variant>> {
    let allocator = devices.first().map(|d| d.0.allocator());
    crate::inputs::parse_variants(arg_types, specs, allocator.as_deref(), "arguments")
        .annotate(|| "parsing function inputs".to_string())
}

/// Runs the command. When an expected output does not match, the process
/// exits with status 1 after the `[FAILED]` report, printing nothing more
/// (as upstream).
pub fn run(args: &RunModuleArgs) -> Result<()> {
    let instance = Instance::default();
    let run = load_context_with(
        &instance,
        &args.modules,
        &args.devices,
        args.task_workers,
        args.yieldable_test_module,
        args.params.modules()?,
    )
    .annotate(|| "creating run context".to_string())?;
    let ctx = &run.context;
    let f = ctx
        .lookup_function(&args.function)
        .annotate(|| format!("looking up function '{}'", args.function))?;
    let inputs = parse_inputs(&args.inputs, &f.cconv.args, &run.devices)?;
    {
        use std::io::Write;
        let mut out = std::io::stdout().lock();
        let _ = writeln!(out, "EXEC @{}", args.function);
        let _ = out.flush();
    }
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
    let matched = crate::outputs::process_results(
        &results,
        &f.cconv.results,
        &args.outputs,
        &args.expected_outputs,
        &args.compare,
        args.print_max_element_count,
    )
    .annotate(|| "processing function outputs".to_string())?;
    if !matched {
        drop(results);
        std::process::exit(1);
    }
    Ok(())
}
