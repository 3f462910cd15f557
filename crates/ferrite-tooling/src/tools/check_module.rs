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
}

/// Runs one test in its own context; the failure messages (empty: passed).
fn run_test(run: &TestRun<'_>, module_name: &str, test: &Test) -> Vec<String> {
    let instance = Instance::default();
    let (extra, log) = match (run.extra)() {
        Ok(x) => x,
        Err(e) => return vec![e.to_string()],
    };
    let outcome = (|| -> Result<()> {
        let ctx = load_context_with(
            &instance,
            run.modules,
            run.module_mode,
            run.device,
            false,
            extra,
        )
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
    run_tests(&TestRun {
        modules: &args.modules,
        module_mode: args.module_mode,
        device: &args.device,
        filter: args.filter.as_deref(),
        expect_failure: args.expect_failure,
        extra: &extra,
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
