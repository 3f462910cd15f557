//! Shared helpers of the VM integration tests (also included by
//! `crates/ferrite-cli/tests/run_module.rs` through `#[path]`).
//!
//! - Fixtures: `$FERRITE_FIXTURES` when set, else `<workspace>/build/fixtures/vm`,
//!   (re)built when stale (`ferrite_testkit::fixtures`).
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
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

// Not every test binary uses all of them.
#[allow(unused_imports)]
pub use ferrite_testkit::{
    fixtures::{fixture_path, fixtures, fixtures_dir},
    workspace_root,
};

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
    // Miri cannot map files (scripts/miri.sh runs some of these tests
    // under it): the bytes are read instead.
    #[cfg(miri)]
    let bytes = ModuleBytes::from_vec(
        std::fs::read(&path).unwrap_or_else(|e| panic!("reading {}: {e}", path.display())),
    );
    #[cfg(not(miri))]
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
