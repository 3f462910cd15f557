//! `ferrite e2e-matmul-test` and `ferrite e2e-conv2d-test`: run upstream's
//! generated e2e programs (like `iree-e2e-matmul-test` /
//! `iree-e2e-conv2d-test`) with the native test module they import.
//!
//! Takes upstream's runner flags: `--module=<tests.vmfb> --module=<calls.vmfb>
//! --device=...` plus `--require_exact_results`, `--acceptable_fp_delta`
//! and `--max_elements_to_check`. Each exported test function of the last
//! module runs in a fresh context, reported as `check-module` reports.
//!
//! As upstream's runners, a last module whose reflection attribute
//! `target_features` (the generators' `--requirements`) names a CPU feature
//! this host lacks is not run: the command says which feature and succeeds.

use std::sync::Arc;

use crate::E2eOptions;
use ferrite_base::status::ResultExt;
use ferrite_base::{bail, Result};
use ferrite_hal_cpu::cpu_features::{host_cpu_data, lookup_feature};
use ferrite_modules::check::CheckLog;
use ferrite_vm::native::NativeModule;
use ferrite_vm::{BytecodeModule, Instance, Module, ModuleBytes};

use ferrite_tooling::tools::check_module::{run_tests, ExtraModules, TestRun};

/// Options of the `e2e-*-test` commands (upstream's runner flags).
#[derive(clap::Args, Debug)]
pub struct E2eTestArgs {
    /// A `.vmfb` file to load; repeat (the generated tests module, then the
    /// calls module whose functions are the tests).
    #[arg(long = "module", required = true)]
    pub modules: Vec<String>,
    /// Devices and driver flags (`--device`, `--task_*`, `--list_devices`).
    #[command(flatten)]
    pub device: ferrite_tooling::device_flags::DeviceArgs,
    /// Runs only tests whose name contains this text.
    #[arg(long)]
    pub filter: Option<String>,
    /// Requires floating-point result elements to match exactly.
    #[arg(long = "require_exact_results", default_value_t = true,
          num_args = 0..=1, default_missing_value = "true", action = clap::ArgAction::Set)]
    pub require_exact_results: bool,
    /// Largest absolute difference accepted for inexact floating-point results.
    #[arg(long = "acceptable_fp_delta", default_value_t = 1e-5)]
    pub acceptable_fp_delta: f32,
    /// Checks about this many elements of large results (0 = all).
    #[arg(long = "max_elements_to_check", default_value_t = 10000)]
    pub max_elements_to_check: i32,
}

impl E2eTestArgs {
    fn options(&self) -> E2eOptions {
        E2eOptions {
            require_exact_results: self.require_exact_results,
            acceptable_fp_delta: self.acceptable_fp_delta,
            max_elements_to_check: self.max_elements_to_check,
        }
    }
}

/// Runs the tests with the module made by `create` registered.
pub fn run(args: &E2eTestArgs, create: fn(E2eOptions) -> Result<Arc<NativeModule>>) -> Result<()> {
    if args.acceptable_fp_delta.is_nan() || args.acceptable_fp_delta < 0.0 {
        bail!(
            InvalidArgument,
            "--acceptable_fp_delta: expected a tolerance >= 0, received {}",
            args.acceptable_fp_delta
        );
    }
    if let Some(path) = args.modules.last() {
        if let Some(missing) = missing_feature(path)? {
            println!("{missing}; not running the tests of '{path}'");
            return Ok(());
        }
    }
    let opts = args.options();
    let extra = || -> Result<ExtraModules> {
        Ok((vec![create(opts)? as Arc<dyn Module>], CheckLog::new()))
    };
    run_tests(&TestRun {
        modules: &args.modules,
        module_mode: ferrite_tooling::context::ModuleMode::default(),
        device: &args.device,
        filter: args.filter.as_deref(),
        expect_failure: false,
        extra: &extra,
        compare: None,
    })
}

/// The first CPU feature the module at `path` requires (its
/// `target_features` attribute) that this host lacks, as a message.
fn missing_feature(path: &str) -> Result<Option<String>> {
    let instance = Instance::default();
    ferrite_hal_module::register_types(instance.types());
    let bytes =
        ModuleBytes::map_file(path).annotate(|| format!("loading bytecode module at '{path}'"))?;
    let module = BytecodeModule::load(&instance, bytes)
        .annotate(|| format!("loading bytecode module at '{path}'"))?;
    let Some((_, features)) = module
        .archive()
        .attrs()
        .iter()
        .find(|(k, _)| k == "target_features")
    else {
        return Ok(None);
    };
    let data = host_cpu_data();
    for feature in features.split(',').filter(|f| !f.is_empty()) {
        match lookup_feature(&data, feature) {
            Some(1) => {}
            Some(_) => {
                return Ok(Some(format!(
                    "target device does not have the required feature '{feature}'"
                )))
            }
            None => {
                return Ok(Some(format!(
                    "CPU feature '{feature}' unknown on {}",
                    std::env::consts::ARCH
                )))
            }
        }
    }
    Ok(None)
}
