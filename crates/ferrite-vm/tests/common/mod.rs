//! Shared helpers of the VM integration tests (also included by
//! `crates/ferrite-cli/tests/run_module.rs` through `#[path]`).
//!
//! - Fixtures: `$FERRITE_FIXTURES` when set, else `<workspace>/build/fixtures/vm`,
//!   (re)built once per test process with `scripts/build-fixtures.sh` when a
//!   source under `tests/vm` has no up-to-date `.vmfb`. Missing tools or a failed
//!   build fail the test with a message; nothing passes silently.
//! - Host modules the fixtures import: `yieldable_test` (from
//!   `ferrite_vm::testing`), a fake `hal` offering exactly the imported
//!   `hal.*` functions, `ferrite_test` (counters and `add`) and
//!   `ferrite_async` (a `wait` that yields once).
#![allow(dead_code)]

use ferrite_base::{status, Result};
use ferrite_vm::native::{ArgReader, NativeModule, NativeModuleBuilder};
use ferrite_vm::refs::RefObject;
use ferrite_vm::stack::{NativePoll, Wait};
use ferrite_vm::{BytecodeModule, Context, Instance, Module, ModuleBytes, Variant};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};

/// The workspace root (two levels above the crate's manifest directory).
pub fn workspace_root() -> PathBuf {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    dir.canonicalize().unwrap_or(dir)
}

fn sources(root: &Path) -> Vec<PathBuf> {
    let mut v: Vec<PathBuf> = std::fs::read_dir(root.join("tests/vm"))
        .map(|rd| {
            rd.filter_map(|e| e.ok().map(|e| e.path()))
                .filter(|p| {
                    matches!(
                        p.extension().and_then(|e| e.to_str()),
                        Some("vmasm" | "mlir")
                    )
                })
                .collect()
        })
        .unwrap_or_default();
    v.sort();
    v
}

fn is_stale(src: &Path, out: &Path) -> bool {
    let (Ok(s), Ok(o)) = (std::fs::metadata(src), std::fs::metadata(out)) else {
        return true;
    };
    match (s.modified(), o.modified()) {
        (Ok(s), Ok(o)) => o < s,
        _ => false,
    }
}

/// The directory holding the fixture `.vmfb` files, built if needed.
pub fn fixtures_dir() -> &'static Path {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        if let Some(d) = std::env::var_os("FERRITE_FIXTURES") {
            let d = PathBuf::from(d);
            assert!(
                d.is_dir(),
                "FERRITE_FIXTURES={} is not a directory",
                d.display()
            );
            return d;
        }
        let root = workspace_root();
        let dir = root.join("build/fixtures/vm");
        let srcs = sources(&root);
        assert!(
            !srcs.is_empty(),
            "no fixture sources under {}/tests/vm",
            root.display()
        );
        let stale: Vec<String> = srcs
            .iter()
            .filter(|s| {
                let name = s.file_stem().unwrap().to_string_lossy().to_string();
                is_stale(s, &dir.join(format!("{name}.vmfb")))
            })
            .map(|s| s.file_name().unwrap().to_string_lossy().to_string())
            .collect();
        if !stale.is_empty() {
            eprintln!(
                "fixtures missing or out of date ({}); running scripts/build-fixtures.sh",
                stale.join(", ")
            );
            let out = Command::new("bash")
                .arg(root.join("scripts/build-fixtures.sh"))
                .current_dir(&root)
                .output()
                .expect("cannot run bash scripts/build-fixtures.sh");
            assert!(
                out.status.success(),
                "scripts/build-fixtures.sh failed ({}); the VM tests need the fixtures \
                 (run scripts/setup-venv.sh for the pinned tools, then scripts/build-fixtures.sh, \
                 or point FERRITE_FIXTURES at a directory of .vmfb files)\nstdout:\n{}\nstderr:\n{}",
                out.status,
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            );
        }
        dir
    })
}

/// Every fixture as (name, path), sorted by name. Fails when there are none,
/// or (for the in-tree directory) when a source has no fixture.
pub fn fixtures() -> Vec<(String, PathBuf)> {
    let dir = fixtures_dir();
    let mut v: Vec<(String, PathBuf)> = std::fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("cannot list fixtures in {}: {e}", dir.display()))
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().and_then(|e| e.to_str()) == Some("vmfb"))
        .map(|p| (p.file_stem().unwrap().to_string_lossy().to_string(), p))
        .collect();
    v.sort();
    assert!(!v.is_empty(), "no .vmfb fixtures in {}", dir.display());
    if std::env::var_os("FERRITE_FIXTURES").is_none() {
        for s in sources(&workspace_root()) {
            let name = s.file_stem().unwrap().to_string_lossy().to_string();
            assert!(
                v.iter().any(|(n, _)| *n == name),
                "source {} has no fixture {name}.vmfb in {}",
                s.display(),
                dir.display()
            );
        }
    }
    v
}

/// The path of fixture `name` (fails with a message when it is absent).
pub fn fixture_path(name: &str) -> PathBuf {
    let p = fixtures_dir().join(format!("{name}.vmfb"));
    assert!(
        p.is_file(),
        "fixture {} is missing (scripts/build-fixtures.sh builds it from tests/vm/{name}.*)",
        p.display()
    );
    p
}

/// A stand-in for the HAL's fence ref type, so modules naming `!hal.fence`
/// load without the HAL.
pub struct FakeFence;

impl RefObject for FakeFence {
    fn type_name(&self) -> &'static str {
        "hal.fence"
    }
}

/// An instance that can load every fixture (`hal.fence` registered).
pub fn fixture_instance() -> Instance {
    let i = Instance::default();
    i.types().register_type::<FakeFence>("hal.fence");
    i
}

/// Loads fixture `name` into `instance`.
pub fn load_fixture(instance: &Instance, name: &str) -> Arc<BytecodeModule> {
    let path = fixture_path(name);
    let bytes =
        ModuleBytes::map_file(&path).unwrap_or_else(|e| panic!("mapping {}: {e}", path.display()));
    BytecodeModule::load(instance, bytes)
        .unwrap_or_else(|e| panic!("loading {}: {e}", path.display()))
}

/// A fake `hal` module with one function per `hal.*` import of `module`,
/// declared with the import's calling convention. `fence.join` returns a
/// null fence; `fence.await` yields once, then returns 0 (OK); anything
/// else fails with UNIMPLEMENTED.
pub fn fake_hal_module(module: &dyn Module) -> Arc<NativeModule> {
    let mut b = NativeModuleBuilder::new("hal", 0);
    for imp in module.imports() {
        let Some(local) = imp.full_name.strip_prefix("hal.") else {
            continue;
        };
        let name = local.to_string();
        let cconv = imp.signature.cconv.clone();
        b = b
            .function(local, &cconv, move |call| match name.as_str() {
                "fence.join" => {
                    let mut a = ArgReader::new(call);
                    let _flags = a.i64()?;
                    let n = a.i32()?;
                    for _ in 0..n {
                        if a.opt_ref()?.is_some() {
                            return Err(status!(Unimplemented, "fake hal joins null fences only"));
                        }
                    }
                    Ok(NativePoll::Ready(vec![Variant::Null]))
                }
                "fence.await" => {
                    if !call.resumed {
                        return Ok(NativePoll::Pending(Wait::yield_now()));
                    }
                    Ok(NativePoll::Ready(vec![Variant::I32(0)]))
                }
                other => Err(status!(Unimplemented, "fake hal has no '{other}'")),
            })
            .unwrap_or_else(|e| panic!("declaring fake hal.{local}: {e}"));
    }
    b.build()
}

/// Call counters of the `ferrite_test` host module.
#[derive(Default)]
pub struct HostCounters {
    /// Calls of `on_init`.
    pub init: AtomicUsize,
    /// Calls of `on_deinit`.
    pub deinit: AtomicUsize,
    /// Calls of `add`.
    pub add: AtomicUsize,
}

impl HostCounters {
    pub fn get(c: &AtomicUsize) -> usize {
        c.load(Ordering::SeqCst)
    }
}

/// The `ferrite_test` host module of `tests/vm/native_*.vmasm`:
/// `on_init`/`on_deinit` (`0v_v`) count calls, `add` (`0ii_i`) adds,
/// `maybe` (`0i_i`, doubles its argument) only when `with_maybe`.
pub fn host_module(counters: Arc<HostCounters>, with_maybe: bool) -> Arc<NativeModule> {
    let (c1, c2, c3) = (counters.clone(), counters.clone(), counters);
    let b = NativeModuleBuilder::new("ferrite_test", 1)
        .function("on_init", "0v_v", move |_| {
            c1.init.fetch_add(1, Ordering::SeqCst);
            Ok(NativePoll::Ready(vec![]))
        })
        .and_then(|b| {
            b.function("on_deinit", "0v_v", move |_| {
                c2.deinit.fetch_add(1, Ordering::SeqCst);
                Ok(NativePoll::Ready(vec![]))
            })
        })
        .and_then(|b| {
            b.function("add", "0ii_i", move |call| {
                c3.add.fetch_add(1, Ordering::SeqCst);
                let mut a = ArgReader::new(call);
                let (x, y) = (a.i32()?, a.i32()?);
                Ok(NativePoll::Ready(vec![Variant::I32(x.wrapping_add(y))]))
            })
        })
        .expect("declaring ferrite_test");
    let b = if with_maybe {
        b.function("maybe", "0i_i", |call| {
            let x = ArgReader::new(call).i32()?;
            Ok(NativePoll::Ready(vec![Variant::I32(x * 2)]))
        })
        .expect("declaring ferrite_test.maybe")
    } else {
        b
    };
    b.build()
}

/// The default `ferrite_async` host module of `tests/vm/native_async.vmasm`:
/// `wait` (`0i_i`) yields once with nothing to wait for, then returns its
/// argument plus one. (`coroutines.rs` provides versions that wait on events.)
pub fn default_async_module() -> Arc<NativeModule> {
    NativeModuleBuilder::new("ferrite_async", 0)
        .function("wait", "0i_i", |call| {
            if !call.resumed {
                return Ok(NativePoll::Pending(Wait::yield_now()));
            }
            let x = ArgReader::new(call).i32()?;
            Ok(NativePoll::Ready(vec![Variant::I32(x.wrapping_add(1))]))
        })
        .expect("declaring ferrite_async")
        .build()
}

/// A context with whatever host modules `module` imports registered first,
/// then `module` itself.
pub fn context_for(instance: &Instance, module: Arc<BytecodeModule>) -> Result<Context> {
    let mut ctx = Context::new(instance);
    let imports = |prefix: &str| {
        module
            .imports()
            .iter()
            .any(|i| i.full_name.starts_with(prefix))
    };
    if imports("yieldable_test.") {
        ctx.register(ferrite_vm::testing::yieldable_test_module()?)?;
    }
    if imports("hal.") {
        ctx.register(fake_hal_module(&*module))?;
    }
    if imports("ferrite_test.") {
        ctx.register(host_module(Arc::new(HostCounters::default()), true))?;
    }
    if imports("ferrite_async.") {
        ctx.register(default_async_module())?;
    }
    ctx.register(module as Arc<dyn Module>)?;
    Ok(ctx)
}

/// Names of the exports of `module`, in ordinal order.
pub fn export_names(module: &dyn Module) -> Vec<String> {
    module.exports().iter().map(|e| e.name.clone()).collect()
}
