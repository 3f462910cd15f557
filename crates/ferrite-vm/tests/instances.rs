//! Instances are independent: two instances (each with its own context of the
//! `globals` fixture) used from two threads at once never see each other's
//! globals, and a type registered in one instance is unknown to the other.

mod common;

use ferrite_base::StatusCode;
use ferrite_vm::{BytecodeModule, Context, Instance, Module, ModuleBytes, Variant};
use std::sync::{Arc, Barrier};

const ITERATIONS: i32 = 20_000;

fn counter_context(instance: &Instance) -> Context {
    let module = common::load_fixture(instance, "globals");
    Context::with_modules(instance, &[module as Arc<dyn Module>]).expect("context")
}

#[test]
fn two_instances_on_two_threads_do_not_interfere() {
    let barrier = Arc::new(Barrier::new(2));
    let handles: Vec<_> = (0..2)
        .map(|t| {
            let barrier = barrier.clone();
            std::thread::spawn(move || {
                let instance = Instance::default();
                let ctx = counter_context(&instance);
                let next = ctx.lookup_function("counter_next").unwrap();
                let check = ctx.lookup_function("test_initialized_by_init").unwrap();
                barrier.wait();
                // Thread 1 runs a second context of its own as well, stepping
                // both alternately: contexts of one instance are independent too.
                let ctx2 = (t == 1).then(|| counter_context(&instance));
                let next2 = ctx2
                    .as_ref()
                    .map(|c| c.lookup_function("counter_next").unwrap());
                for i in 1..=ITERATIONS {
                    let r = ctx.invoke(&next, Vec::new()).unwrap();
                    assert_eq!(r, vec![Variant::I32(i)], "thread {t} iteration {i}");
                    if let (Some(c2), Some(n2)) = (&ctx2, &next2) {
                        let r = c2.invoke(n2, Vec::new()).unwrap();
                        assert_eq!(r, vec![Variant::I32(i)], "thread {t} second context");
                    }
                    if i % 1000 == 0 {
                        ctx.invoke(&check, Vec::new()).unwrap();
                    }
                }
                ITERATIONS
            })
        })
        .collect();
    for h in handles {
        assert_eq!(h.join().expect("thread panicked"), ITERATIONS);
    }
}

#[test]
fn one_context_shared_by_threads_counts_every_call() {
    // The same context used from several threads: every call is counted
    // exactly once when calls are serialized through a mutex, and the
    // module (immutable) is shared freely across threads.
    let instance = Instance::default();
    let ctx = Arc::new(std::sync::Mutex::new(counter_context(&instance)));
    let handles: Vec<_> = (0..2)
        .map(|_| {
            let ctx = ctx.clone();
            std::thread::spawn(move || {
                for _ in 0..1000 {
                    let c = ctx.lock().unwrap();
                    let f = c.lookup_function("counter_next").unwrap();
                    c.invoke(&f, Vec::new()).unwrap();
                }
            })
        })
        .collect();
    for h in handles {
        h.join().unwrap();
    }
    let c = ctx.lock().unwrap();
    let f = c.lookup_function("counter_next").unwrap();
    assert_eq!(c.invoke(&f, Vec::new()).unwrap(), vec![Variant::I32(2001)]);
}

#[test]
fn module_loaded_once_runs_in_two_instances_contexts() {
    // A module is loaded against one instance's types; a second instance
    // loads its own copy and the two contexts stay independent.
    let a = Instance::default();
    let b = Instance::default();
    let ca = counter_context(&a);
    let cb = counter_context(&b);
    let fa = ca.lookup_function("counter_next").unwrap();
    let fb = cb.lookup_function("counter_next").unwrap();
    for _ in 0..5 {
        ca.invoke(&fa, Vec::new()).unwrap();
    }
    assert_eq!(cb.invoke(&fb, Vec::new()).unwrap(), vec![Variant::I32(1)]);
    assert_eq!(ca.invoke(&fa, Vec::new()).unwrap(), vec![Variant::I32(6)]);
}

#[test]
fn registered_types_are_per_instance() {
    let with = Instance::default();
    with.types().register_type::<common::FakeFence>("hal.fence");
    let without = Instance::default();
    assert!(with.types().lookup("hal.fence").is_some());
    assert!(without.types().lookup("hal.fence").is_none());
    assert!(with.types().names().contains(&"hal.fence".to_string()));
    assert!(!without.types().names().contains(&"hal.fence".to_string()));

    // Loading a module naming !hal.fence works only in the instance that
    // registered the type.
    let path = common::fixture_path("hal_variadic");
    BytecodeModule::load(&with, ModuleBytes::map_file(&path).unwrap())
        .expect("loads where hal.fence is registered");
    let err = match BytecodeModule::load(&without, ModuleBytes::map_file(&path).unwrap()) {
        Ok(_) => panic!("hal_variadic loaded without hal.fence registered"),
        Err(e) => e,
    };
    assert_eq!(err.code(), StatusCode::NotFound, "{err}");
    assert!(err.to_string().contains("hal.fence"), "{err}");

    // Built-in types exist in both.
    for i in [&with, &without] {
        assert!(i.types().lookup("vm.buffer").is_some());
        assert!(i.types().lookup("vm.list").is_some());
    }
}
