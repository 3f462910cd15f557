//! Linking a context: import resolution by name and calling convention,
//! optional imports, dependency versions, and the `__init` / `__deinit`
//! lifecycle (observed through a counting native module). Uses the
//! `native_lifecycle` fixture (imports `ferrite_test.on_init/on_deinit/add`
//! and optionally `ferrite_test.maybe`).

mod common;

use common::HostCounters;
use ferrite_base::{status, StatusCode};
use ferrite_vm::native::{NativeModule, NativeModuleBuilder};
use ferrite_vm::stack::NativePoll;
use ferrite_vm::{Context, Instance, Module, Variant};
use std::sync::atomic::Ordering;
use std::sync::Arc;

fn lifecycle(instance: &Instance) -> Arc<dyn Module> {
    common::load_fixture(instance, "native_lifecycle")
}

/// A `ferrite_test` module built from (name, cconv) pairs whose bodies
/// return zeros of the right types (or fail, for `on_init` when `fail_init`).
fn custom_host(functions: &[(&str, &str)], fail_init: bool) -> Arc<NativeModule> {
    let mut b = NativeModuleBuilder::new("ferrite_test", 1);
    for &(name, cconv) in functions {
        let results: Vec<Variant> = cconv
            .split_once('_')
            .unwrap()
            .1
            .chars()
            .filter_map(|c| match c {
                'i' => Some(Variant::I32(0)),
                'I' => Some(Variant::I64(0)),
                _ => None,
            })
            .collect();
        let fail = fail_init && name == "on_init";
        b = b
            .function(name, cconv, move |_| {
                if fail {
                    return Err(status!(Aborted, "host refuses to initialize"));
                }
                Ok(NativePoll::Ready(results.clone()))
            })
            .unwrap();
    }
    b.build()
}

#[test]
fn import_calling_convention_mismatch_names_both_signatures() {
    let instance = Instance::default();
    let mut ctx = Context::new(&instance);
    ctx.register(custom_host(
        &[("on_init", "0v_v"), ("on_deinit", "0v_v"), ("add", "0II_I")],
        false,
    ))
    .unwrap();
    let err = ctx.register(lifecycle(&instance)).unwrap_err();
    let text = err.to_string();
    assert_eq!(err.code(), StatusCode::InvalidArgument, "{text}");
    assert!(text.contains("ferrite_test.add"), "{text}");
    assert!(text.contains("0ii_i"), "import signature missing: {text}");
    assert!(text.contains("0II_I"), "export signature missing: {text}");
    assert!(
        text.contains("native_lifecycle"),
        "module name missing: {text}"
    );
    assert_eq!(ctx.modules().count(), 1, "failed module stays unregistered");
}

#[test]
fn missing_required_import_is_not_found_and_named() {
    let instance = Instance::default();
    // The host exists but lacks `add`.
    let mut ctx = Context::new(&instance);
    ctx.register(custom_host(
        &[("on_init", "0v_v"), ("on_deinit", "0v_v")],
        false,
    ))
    .unwrap();
    let err = ctx.register(lifecycle(&instance)).unwrap_err();
    assert_eq!(err.code(), StatusCode::NotFound, "{err}");
    assert!(err.to_string().contains("'ferrite_test.add'"), "{err}");

    // No host at all: the first import is named.
    let mut ctx = Context::new(&instance);
    let err = ctx.register(lifecycle(&instance)).unwrap_err();
    assert_eq!(err.code(), StatusCode::NotFound, "{err}");
    assert!(err.to_string().contains("ferrite_test.on_init"), "{err}");
    assert_eq!(ctx.modules().count(), 0);
}

#[test]
fn optional_import_resolution() {
    let instance = Instance::default();
    for with_maybe in [false, true] {
        let counters = Arc::new(HostCounters::default());
        let mut ctx = Context::new(&instance);
        ctx.register(common::host_module(counters, with_maybe))
            .unwrap();
        ctx.register(lifecycle(&instance)).unwrap();
        let resolved = ctx.lookup_function("maybe_resolved").unwrap();
        let call = ctx.lookup_function("call_maybe").unwrap();
        let r = ctx.invoke(&resolved, vec![]).unwrap();
        let c = ctx.invoke(&call, vec![Variant::I32(21)]);
        if with_maybe {
            assert_eq!(r, vec![Variant::I32(1)]);
            assert_eq!(c.unwrap(), vec![Variant::I32(42)]);
        } else {
            assert_eq!(
                r,
                vec![Variant::I32(0)],
                "vm.import.resolved of an absent optional import"
            );
            let err = c.unwrap_err();
            assert_eq!(err.code(), StatusCode::NotFound, "{err}");
            assert!(err.to_string().contains("ferrite_test.maybe"), "{err}");
        }
    }
    // The calls fixture's own check of an absent optional import.
    let module = common::load_fixture(&instance, "calls");
    let ctx = Context::with_modules(&instance, &[module as Arc<dyn Module>]).unwrap();
    let f = ctx
        .lookup_function("test_optional_import_unresolved")
        .unwrap();
    ctx.invoke(&f, vec![]).unwrap();
}

#[test]
fn dependency_versions_are_checked() {
    let instance = Instance::default();
    let base = || custom_host(&[("on_init", "0v_v")], false); // ferrite_test version 1
    let user = |min: u32, optional: bool| {
        NativeModuleBuilder::new("dep_user", 0)
            .dependency("ferrite_test", min, optional)
            .build()
    };

    let mut ctx = Context::new(&instance);
    ctx.register(base()).unwrap();
    let err = ctx.register(user(2, false)).unwrap_err();
    assert_eq!(err.code(), StatusCode::Incompatible, "{err}");
    let text = err.to_string();
    assert!(
        text.contains("ferrite_test") && text.contains('1') && text.contains('2'),
        "{text}"
    );
    // Even an optional dependency, when present, must be new enough.
    let err = ctx.register(user(2, true)).unwrap_err();
    assert_eq!(err.code(), StatusCode::Incompatible, "{err}");
    ctx.register(user(1, false)).unwrap();
    assert_eq!(ctx.modules().count(), 2);

    // Absent dependency: required fails NOT_FOUND, optional is fine.
    let mut ctx = Context::new(&instance);
    let err = ctx.register(user(0, false)).unwrap_err();
    assert_eq!(err.code(), StatusCode::NotFound, "{err}");
    assert!(err.to_string().contains("ferrite_test"), "{err}");
    ctx.register(user(0, true)).unwrap();

    // A bytecode module's recorded dependency (hal_variadic needs `hal`).
    let instance = common::fixture_instance();
    let module = common::load_fixture(&instance, "hal_variadic");
    assert!(module
        .dependencies()
        .iter()
        .any(|d| d.name == "hal" && !d.optional));
    let mut ctx = Context::new(&instance);
    let err = ctx.register(module as Arc<dyn Module>).unwrap_err();
    assert_eq!(err.code(), StatusCode::NotFound, "{err}");
    assert!(err.to_string().contains("'hal'"), "{err}");
}

#[test]
fn init_runs_on_register_and_deinit_on_drop() {
    let instance = Instance::default();
    let counters = Arc::new(HostCounters::default());
    let get = |f: fn(&HostCounters) -> usize| f(&counters);
    {
        let mut ctx = Context::new(&instance);
        ctx.register(common::host_module(counters.clone(), false))
            .unwrap();
        assert_eq!(get(|c| c.init.load(Ordering::SeqCst)), 0);
        ctx.register(lifecycle(&instance)).unwrap();
        assert_eq!(
            get(|c| c.init.load(Ordering::SeqCst)),
            1,
            "__init ran once on register"
        );
        assert_eq!(get(|c| c.deinit.load(Ordering::SeqCst)), 0);
        for name in ["check_init_ran", "check_add_import"] {
            let f = ctx.lookup_function(name).unwrap();
            ctx.invoke(&f, vec![])
                .unwrap_or_else(|e| panic!("{name}: {e}"));
        }
        assert_eq!(get(|c| c.add.load(Ordering::SeqCst)), 1);
        assert_eq!(get(|c| c.init.load(Ordering::SeqCst)), 1);
        assert_eq!(
            get(|c| c.deinit.load(Ordering::SeqCst)),
            0,
            "__deinit before drop"
        );
    }
    assert_eq!(
        get(|c| c.deinit.load(Ordering::SeqCst)),
        1,
        "__deinit ran once on drop"
    );
    assert_eq!(get(|c| c.init.load(Ordering::SeqCst)), 1);

    // Two contexts of one module: each has its own state and lifecycle.
    {
        let mut a = Context::new(&instance);
        a.register(common::host_module(counters.clone(), false))
            .unwrap();
        a.register(lifecycle(&instance)).unwrap();
        let mut b = Context::new(&instance);
        b.register(common::host_module(counters.clone(), false))
            .unwrap();
        b.register(lifecycle(&instance)).unwrap();
        assert_eq!(get(|c| c.init.load(Ordering::SeqCst)), 3);
        drop(a);
        assert_eq!(get(|c| c.deinit.load(Ordering::SeqCst)), 2);
    }
    assert_eq!(get(|c| c.deinit.load(Ordering::SeqCst)), 3);

    // Globals set in the fixture's __init (globals.vmasm).
    let module = common::load_fixture(&instance, "globals");
    let ctx = Context::with_modules(&instance, &[module as Arc<dyn Module>]).unwrap();
    let f = ctx.lookup_function("test_initialized_by_init").unwrap();
    ctx.invoke(&f, vec![]).unwrap();
}

#[test]
fn failing_init_fails_register_and_leaves_module_out() {
    let instance = Instance::default();
    let mut ctx = Context::new(&instance);
    ctx.register(custom_host(
        &[("on_init", "0v_v"), ("on_deinit", "0v_v"), ("add", "0ii_i")],
        true,
    ))
    .unwrap();
    let err = ctx.register(lifecycle(&instance)).unwrap_err();
    assert_eq!(err.code(), StatusCode::Aborted, "{err}");
    let text = err.to_string();
    assert!(text.contains("host refuses to initialize"), "{text}");
    assert!(text.contains("__init"), "{text}");
    assert_eq!(ctx.modules().count(), 1);
    assert!(ctx
        .lookup_function("native_lifecycle.check_init_ran")
        .is_err());
}
