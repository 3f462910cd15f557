//! Loading `--module`s into a VM context (upstream's
//! `iree/tooling/context_util.c`): the `hal` module over the `--device`s
//! when a program needs it, then native modules, then the files in order.

use crate::device_flags::DeviceArgs;
use crate::inputs::parse_scalar;
use ferrite_base::status::ResultExt;
use ferrite_base::Result;
use ferrite_hal::device::DeviceRef;
use ferrite_hal_module::HalModuleOptions;
use ferrite_vm::cconv::CconvType;
use ferrite_vm::{BytecodeModule, Context, Instance, Module, ModuleBytes, Ref, Variant};
use std::sync::Arc;

/// The device the tools use when a program needs one and no `--device`
/// names it (as upstream).
pub const DEFAULT_DEVICE: &str = "local-task";

/// How `--module` files are read (`--module_mode`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum ModuleMode {
    /// Read the whole file into memory at startup.
    Preload,
    /// Map the file: pages are read as they are touched and rodata is used
    /// in place (Ferrite's default; upstream's is `preload`).
    #[default]
    Mmap,
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
    mode: ModuleMode,
    devices: &DeviceArgs,
    yieldable: bool,
    extra: Vec<Arc<dyn Module>>,
) -> Result<RunContext> {
    load_context_with_hal(
        instance,
        modules,
        mode,
        devices,
        yieldable,
        extra,
        HalModuleOptions {
            // One process per rank (torchrun, mpirun): channels take rank,
            // count and group identifier from the launcher's environment.
            channel_provider: ferrite::rendezvous::process_default(),
            ..HalModuleOptions::default()
        },
    )
}

/// [`load_context_with`] with explicit `hal` module options (e.g. the
/// channel provider of one rank of a multi-rank run).
pub fn load_context_with_hal(
    instance: &Instance,
    modules: &[String],
    mode: ModuleMode,
    devices: &DeviceArgs,
    yieldable: bool,
    extra: Vec<Arc<dyn Module>>,
    hal_options: HalModuleOptions,
) -> Result<RunContext> {
    // Driver flags are checked even when the program needs no device.
    devices.driver_options()?;
    ferrite_hal_module::register_types(instance.types());
    let mut loaded = Vec::new();
    for path in modules {
        let bytes = if path == "-" {
            let mut v = Vec::new();
            std::io::Read::read_to_end(&mut std::io::stdin(), &mut v)?;
            ModuleBytes::from_vec(v)
        } else if mode == ModuleMode::Preload {
            let v = std::fs::read(path)
                .map_err(ferrite_base::Status::from)
                .annotate(|| format!("loading bytecode module at '{path}'"))?;
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
        hal_devices = crate::dispatch_diff::wrap_devices(devices.create_devices(DEFAULT_DEVICE)?);
        let hal = ferrite_hal_module::create_hal_module(hal_devices.clone(), hal_options)?;
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
            // Host memory when the program uses no HAL device (see
            // `parse_inputs`).
            let allocator: std::sync::Arc<dyn ferrite_hal::allocator::Allocator> =
                match devices.first() {
                    Some(d) => d.0.allocator(),
                    None => std::sync::Arc::new(ferrite_hal::allocator::HeapAllocator::new()),
                };
            let view = ferrite_hal::buffer_view::parse_input(text, &*allocator)?;
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
    // A program that uses no HAL device (e.g. one returning an argument
    // unchanged) still takes tensors: they live in host memory, as
    // upstream's tools give them a heap allocator then.
    let allocator: std::sync::Arc<dyn ferrite_hal::allocator::Allocator> = match devices.first() {
        Some(d) => d.0.allocator(),
        None => std::sync::Arc::new(ferrite_hal::allocator::HeapAllocator::new()),
    };
    crate::inputs::parse_variants(arg_types, specs, Some(&*allocator), "arguments")
        .annotate(|| "parsing function inputs".to_string())
}
