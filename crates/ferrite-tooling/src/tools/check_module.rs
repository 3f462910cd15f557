//! `ferrite check-module`: runs every test function of a self-checking
//! program (like upstream's `iree-check-module`).
//!
//! The `check` module is registered after `hal` and before the program.
//! Each exported function of the main (last) module is a test, except
//! internal ones (`__init`, names starting with `__` or containing `$`).
//! Every test runs in a fresh context on a fresh device, so one failure
//! cannot affect the next. A test fails when any `check.expect_*` failed or
//! the call returned an error (or panicked).

use std::sync::Arc;
use std::time::Instant;

use ferrite_base::status::ResultExt;
use ferrite_base::{bail, Result};
use ferrite_modules::check::{create_check_module, CheckLog};
use ferrite_vm::cconv::Cconv;
use ferrite_vm::{BytecodeModule, Instance, Module, ModuleBytes};

use crate::context::load_context_with;
use crate::device_flags::DeviceArgs;

/// Options of `check-module`.
#[derive(clap::Args, Debug)]
pub struct CheckModuleArgs {
    /// A `.vmfb` file to load; repeat for several (the last is the module
    /// whose functions are the tests).
    #[arg(long = "module", required_unless_present_any = crate::device_flags::LISTING)]
    pub modules: Vec<String>,
    /// How module files are read: `mmap` (default) or `preload`.
    #[arg(long = "module_mode", value_enum, default_value_t = crate::context::ModuleMode::Mmap)]
    pub module_mode: crate::context::ModuleMode,
    /// Devices and driver flags (`--device`, `--task_*`, `--list_devices`).
    #[command(flatten)]
    pub device: crate::device_flags::DeviceArgs,
    /// Parameter files (`--parameters`, `--parameter_mode`).
    #[command(flatten)]
    pub params: crate::parameters::ParameterArgs,
    /// Runs only tests whose name contains this text.
    #[arg(long)]
    pub filter: Option<String>,
    /// Succeeds only when some test fails (as upstream's flag).
    #[arg(long = "expect_failure")]
    pub expect_failure: bool,
    /// Ferrite's differential mode: runs each test on `--device` and again
    /// on this device, every dispatch alone, and fails the test at the
    /// first dispatch whose written outputs differ (see `run-module
    /// --compare_device`).
    #[arg(long = "compare_device")]
    pub compare_device: Option<String>,
    /// Modules for the `--compare_device` run (e.g. the program compiled
    /// for the CPU; default: the same modules).
    #[arg(long = "compare_module")]
    pub compare_modules: Vec<String>,
    /// Absolute tolerance of `--compare_device` (outputs read as f32).
    #[arg(long = "compare_atol", default_value_t = 1e-5)]
    pub compare_atol: f64,
    /// Relative tolerance of `--compare_device`.
    #[arg(long = "compare_rtol", default_value_t = 1e-5)]
    pub compare_rtol: f64,
}

/// The second run of each test in differential mode.
pub struct CompareRun<'a> {
    /// The device to compare with.
    pub device: DeviceArgs,
    /// Its modules (the program compiled for it).
    pub modules: &'a [String],
    /// Tolerances for outputs read as f32.
    pub atol: f64,
    /// Relative tolerance.
    pub rtol: f64,
}

/// One test: the function's local name.
struct Test {
    name: String,
}

/// What a module offers `check-module`: its name, its test functions, and
/// the exports skipped for taking arguments or returning results (name and
/// cconv).
type Discovered = (String, Vec<Test>, Vec<(String, String)>);

/// The main module's name and its test functions; exports with arguments
/// or results are returned separately (skipped, with their cconv).
fn discover(path: &str) -> Result<Discovered> {
    let instance = Instance::default();
    ferrite_hal_module::register_types(instance.types());
    let bytes = if path == "-" {
        bail!(
            InvalidArgument,
            "check-module needs a module file, not stdin"
        );
    } else {
        ModuleBytes::map_file(path).annotate(|| format!("loading bytecode module at '{path}'"))?
    };
    let m = BytecodeModule::load(&instance, bytes)
        .annotate(|| format!("loading bytecode module at '{path}'"))?;
    let mut tests = Vec::new();
    let mut skipped = Vec::new();
    for e in m.exports() {
        if e.name.starts_with("__") || e.name.contains('$') {
            continue;
        }
        let cconv = Cconv::parse(&e.signature.cconv).annotate(|| format!("export '{}'", e.name))?;
        if !cconv.args.is_empty() || !cconv.results.is_empty() {
            skipped.push((e.name.clone(), e.signature.cconv.clone()));
            continue;
        }
        tests.push(Test {
            name: e.name.clone(),
        });
    }
    Ok((m.name().to_string(), tests, skipped))
}

/// The native modules one test's context gets besides `hal` (registered
/// before the program modules), and the log their failed expectations go to.
pub type ExtraModules = (Vec<Arc<dyn Module>>, CheckLog);

/// What a test run needs: the program modules and devices, which tests to
/// run, and how to make the native modules of each test's context.
pub struct TestRun<'a> {
    /// `.vmfb` paths; the last one's exports are the tests.
    pub modules: &'a [String],
    /// How module files are read.
    pub module_mode: crate::context::ModuleMode,
    /// `--device` and driver flags.
    pub device: &'a DeviceArgs,
    /// Runs only tests whose name contains this text.
    pub filter: Option<&'a str>,
    /// Succeeds only when some test fails.
    pub expect_failure: bool,
    /// Makes a fresh set of native modules for one test.
    pub extra: &'a dyn Fn() -> Result<ExtraModules>,
    /// Differential mode: each test also runs on another device and the
    /// two runs are compared dispatch by dispatch.
    pub compare: Option<CompareRun<'a>>,
}

/// Runs one test in its own context; the failure messages (empty: passed).
/// In differential mode the test runs on both devices, each dispatch
/// traced, and a dispatch whose outputs differ is a failure too.
fn run_test(run: &TestRun<'_>, module_name: &str, test: &Test) -> Vec<String> {
    let Some(cmp) = &run.compare else {
        return run_test_on(run, run.device, run.modules, module_name, test);
    };
    use crate::dispatch_diff::{compare::compare, set_recorder, trace::Recorder};
    let traced = |device: &DeviceArgs, modules: &[String]| {
        let rec = Arc::new(Recorder::default());
        set_recorder(Some(rec.clone()));
        let failures = run_test_on(run, device, modules, module_name, test);
        set_recorder(None);
        (failures, rec.take())
    };
    let (mut failures, a) = traced(run.device, run.modules);
    let (other_failures, b) = traced(&cmp.device, cmp.modules);
    let other = cmp.device.devices.first().map_or("?", |s| s.as_str());
    let first = run
        .device
        .devices
        .first()
        .map_or("the default device", |s| s.as_str());
    failures.extend(
        other_failures
            .into_iter()
            .map(|f| format!("on {other}: {f}")),
    );
    let report = compare(&a, &b, cmp.atol, cmp.rtol);
    if !report.differing.is_empty() || !report.unmatched.is_empty() {
        failures.push(report.text(first, other, 3));
    }
    failures
}

fn run_test_on(
    run: &TestRun<'_>,
    device: &DeviceArgs,
    modules: &[String],
    module_name: &str,
    test: &Test,
) -> Vec<String> {
    let instance = Instance::default();
    let (extra, log) = match (run.extra)() {
        Ok(x) => x,
        Err(e) => return vec![e.to_string()],
    };
    let outcome = (|| -> Result<()> {
        let ctx = load_context_with(&instance, modules, run.module_mode, device, false, extra)
            .annotate(|| "creating the test context".to_string())?;
        let name = format!("{module_name}.{}", test.name);
        let f = ctx.context.lookup_function(&name)?;
        ctx.context
            .invoke(&f, Vec::new())
            .annotate(|| format!("invoking function '{name}'"))?;
        Ok(())
    })();
    let mut failures = log.take();
    if let Err(e) = outcome {
        failures.push(e.to_string());
    }
    failures
}

fn panic_text(p: &(dyn std::any::Any + Send)) -> String {
    if let Some(s) = p.downcast_ref::<&str>() {
        (*s).to_string()
    } else if let Some(s) = p.downcast_ref::<String>() {
        s.clone()
    } else {
        "(non-string panic payload)".to_string()
    }
}

/// Runs the command: exits 1 when a test failed (or, with
/// `--expect_failure`, when none did).
pub fn run(args: &CheckModuleArgs) -> Result<()> {
    if args.device.wants_listing() {
        return args.device.print_listing();
    }
    let extra = || -> Result<ExtraModules> {
        let (check, log) = create_check_module()?;
        let mut extra = vec![check as Arc<dyn Module>];
        extra.extend(args.params.modules()?);
        Ok((extra, log))
    };
    let compare = args.compare_device.as_ref().map(|d| {
        let mut device = args.device.clone();
        device.devices = vec![d.clone()];
        CompareRun {
            device,
            modules: if args.compare_modules.is_empty() {
                &args.modules
            } else {
                &args.compare_modules
            },
            atol: args.compare_atol,
            rtol: args.compare_rtol,
        }
    });
    run_tests(&TestRun {
        modules: &args.modules,
        module_mode: args.module_mode,
        device: &args.device,
        filter: args.filter.as_deref(),
        expect_failure: args.expect_failure,
        extra: &extra,
        compare,
    })
}

/// Runs each test of `run`, printing `[ RUN ]`/`[ OK ]`/`[ FAILED ]` lines
/// and `N passed, M failed`: exits 1 when a test failed (or, with
/// `expect_failure`, when none did).
pub fn run_tests(run: &TestRun<'_>) -> Result<()> {
    let args = run;
    let main = args.modules.last().map(String::as_str).unwrap_or("-");
    let (module_name, tests, skipped) = discover(main)?;
    for (name, cconv) in &skipped {
        println!(
            "[ SKIPPED  ] {module_name}.{name} (signature '{cconv}': a test takes no arguments and returns nothing)"
        );
    }
    let tests: Vec<&Test> = tests
        .iter()
        .filter(|t| args.filter.is_none_or(|f| t.name.contains(f)))
        .collect();
    let (mut passed, mut failed) = (0usize, Vec::new());
    for test in tests {
        let full = format!("{module_name}.{}", test.name);
        println!("[ RUN      ] {full}");
        let start = Instant::now();
        let failures = match std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            run_test(run, &module_name, test)
        })) {
            Ok(f) => f,
            Err(p) => vec![format!("panic: {}", panic_text(&*p))],
        };
        let ms = start.elapsed().as_millis();
        if failures.is_empty() {
            passed += 1;
            println!("[       OK ] {full} ({ms} ms)");
        } else {
            for f in &failures {
                for line in f.lines() {
                    println!("    {line}");
                }
            }
            println!("[  FAILED  ] {full} ({ms} ms)");
            failed.push(full);
        }
    }
    println!("{passed} passed, {} failed", failed.len());
    for f in &failed {
        println!("[  FAILED  ] {f}");
    }
    if args.expect_failure {
        if failed.is_empty() {
            println!("Test passed but expected failure");
            std::process::exit(1);
        }
        println!("Test failed as expected");
        return Ok(());
    }
    if !failed.is_empty() {
        std::process::exit(1);
    }
    Ok(())
}
