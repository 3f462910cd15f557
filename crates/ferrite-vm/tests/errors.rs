//! Failures are reported, never crashes: stack overflow, backtraces of
//! failing calls, wrong arguments to `Context::invoke`, integer division by
//! zero, failing and misbehaving native functions.

mod common;

use ferrite_base::{status, StatusCode};
use ferrite_vm::instance::InstanceOptions;
use ferrite_vm::native::{ArgReader, NativeModuleBuilder};
use ferrite_vm::stack::{NativeCall, NativePoll};
use ferrite_vm::{Context, Instance, Module, Variant};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::Arc;

fn context(instance: &Instance, fixture: &str) -> Context {
    let module = common::load_fixture(instance, fixture);
    common::context_for(instance, module).unwrap()
}

fn call_err(ctx: &Context, name: &str, args: Vec<Variant>) -> ferrite_base::Status {
    let f = ctx.lookup_function(name).unwrap();
    match catch_unwind(AssertUnwindSafe(|| ctx.invoke(&f, args))) {
        Ok(Ok(v)) => panic!("{name} succeeded with {v:?}, expected a failure"),
        Ok(Err(e)) => e,
        Err(_) => panic!("{name} panicked instead of returning an error"),
    }
}

#[test]
fn unbounded_recursion_is_resource_exhausted() {
    let instance = Instance::default();
    let ctx = context(&instance, "traps");
    let err = call_err(&ctx, "fail_deep_recursion", vec![]);
    assert_eq!(err.code(), StatusCode::ResourceExhausted, "{err}");
    // The frame limit or (compiled tier) the native stack budget.
    assert!(err.message().contains("stack overflow"), "{err}");
    let bt = err.backtrace();
    assert!(!bt.is_empty());
    assert_eq!(bt[0].function, "traps.fail_deep_recursion");
    assert!(
        bt.len() <= ferrite_vm::stack::DEFAULT_MAX_DEPTH,
        "backtrace of {} frames",
        bt.len()
    );
    // Deeper than upstream's stack admits (about 5,000 frames of a small
    // function), and printed with the middle elided.
    assert!(bt.len() > 5000, "only {} frames", bt.len());
    let text = err.to_string();
    assert!(
        text.contains("frames elided"),
        "{}",
        &text[..text.len().min(2000)]
    );
    assert!(text.lines().count() < 64, "{} lines", text.lines().count());
    // The context survives for further calls.
    let err2 = call_err(&ctx, "fail_deep_recursion", vec![]);
    assert_eq!(err2.code(), StatusCode::ResourceExhausted);

    // The limit is the instance's.
    let small = Instance::new(InstanceOptions {
        max_stack_depth: 16,
        ..InstanceOptions::default()
    });
    let ctx = context(&small, "traps");
    let err = call_err(&ctx, "fail_deep_recursion", vec![]);
    assert_eq!(err.code(), StatusCode::ResourceExhausted, "{err}");
    assert!(err.message().contains("16"), "{err}");
    assert!(err.backtrace().len() <= 16, "{err}");
    // A recursion deeper than 16 frames that would succeed otherwise.
    let ctx = context(&small, "calls");
    let f = ctx.lookup_function("fact_i64").unwrap();
    assert!(ctx.invoke(&f, vec![Variant::I64(5)]).is_ok());
    let err = ctx.invoke(&f, vec![Variant::I64(40)]).unwrap_err();
    assert_eq!(err.code(), StatusCode::ResourceExhausted, "{err}");
}

#[test]
fn failures_carry_a_backtrace() {
    let instance = Instance::default();
    let ctx = context(&instance, "traps");
    let err = call_err(&ctx, "fail_explicit_status", vec![]);
    assert_eq!(err.code(), StatusCode::PermissionDenied);
    let bt = err.backtrace();
    assert_eq!(bt.len(), 1, "{err}");
    assert_eq!(bt[0].function, "traps.fail_explicit_status");
    assert!(bt[0].offset > 0, "offset of the fail op: {err}");
    assert!(err
        .to_string()
        .contains(&format!("traps.fail_explicit_status@{}", bt[0].offset)));

    // Failure inside a callee: innermost frame first, the export last.
    let ctx = context(&instance, "calls");
    let err = call_err(&ctx, "fail_in_callee", vec![]);
    assert_eq!(err.code(), StatusCode::OutOfRange);
    let bt = err.backtrace();
    assert_eq!(bt.len(), 2, "{err}");
    assert!(bt[0].function.starts_with("calls."), "{err}");
    assert_ne!(bt[0].function, "calls.fail_in_callee", "{err}");
    assert_eq!(bt[1].function, "calls.fail_in_callee", "{err}");
}

#[test]
fn failing_native_import_appears_in_the_backtrace() {
    let instance = Instance::default();
    let host = NativeModuleBuilder::new("ferrite_test", 1)
        .function("on_init", "0v_v", |_| Ok(NativePoll::Ready(vec![])))
        .unwrap()
        .function("on_deinit", "0v_v", |_| Ok(NativePoll::Ready(vec![])))
        .unwrap()
        .function("add", "0ii_i", |_| {
            Err(status!(Unavailable, "adder offline"))
        })
        .unwrap()
        .build();
    let mut ctx = Context::new(&instance);
    ctx.register(host).unwrap();
    ctx.register(common::load_fixture(&instance, "native_lifecycle") as Arc<dyn Module>)
        .unwrap();
    let err = call_err(&ctx, "check_add_import", vec![]);
    assert_eq!(err.code(), StatusCode::Unavailable, "{err}");
    assert!(err.to_string().contains("adder offline"), "{err}");
    let names: Vec<&str> = err
        .backtrace()
        .iter()
        .map(|f| f.function.as_str())
        .collect();
    assert_eq!(
        names,
        ["ferrite_test.add", "native_lifecycle.check_add_import"],
        "{err}"
    );
}

#[test]
fn native_function_returning_wrong_results_is_an_error() {
    let instance = Instance::default();
    let host = NativeModuleBuilder::new("ferrite_test", 1)
        .function("on_init", "0v_v", |_| Ok(NativePoll::Ready(vec![])))
        .unwrap()
        .function("on_deinit", "0v_v", |_| Ok(NativePoll::Ready(vec![])))
        .unwrap()
        // Declared 0ii_i, returns an f32.
        .function("add", "0ii_i", |_| {
            Ok(NativePoll::Ready(vec![Variant::F32(1.0)]))
        })
        .unwrap()
        .build();
    let mut ctx = Context::new(&instance);
    ctx.register(host).unwrap();
    ctx.register(common::load_fixture(&instance, "native_lifecycle") as Arc<dyn Module>)
        .unwrap();
    let err = call_err(&ctx, "check_add_import", vec![]);
    assert_eq!(err.code(), StatusCode::Internal, "{err}");
    assert!(err.to_string().contains("ferrite_test.add"), "{err}");

    // Too many results.
    let host = NativeModuleBuilder::new("h", 0)
        .function("two", "0v_i", |_| {
            Ok(NativePoll::Ready(vec![Variant::I32(1), Variant::I32(2)]))
        })
        .unwrap()
        .build();
    let mut ctx = Context::new(&instance);
    ctx.register(host).unwrap();
    let err = call_err(&ctx, "h.two", vec![]);
    assert_eq!(err.code(), StatusCode::Internal, "{err}");
}

/// `NativeCall::ready_one` and `ready_none` (the out-of-line result
/// writers the `hal` module uses) write a bytecode caller's result register
/// in place, answer host calls with values, and refuse a result count the
/// signature does not declare.
#[test]
fn native_ready_one_and_none_write_in_place_and_check_counts() {
    let instance = Instance::default();
    let host = |add: fn(&mut NativeCall<'_>) -> ferrite_base::Result<NativePoll>| {
        NativeModuleBuilder::new("ferrite_test", 1)
            .function("on_init", "0v_v", |c| c.ready_none())
            .unwrap()
            .function("on_deinit", "0v_v", |c| c.ready_none())
            .unwrap()
            .function("add", "0ii_i", add)
            .unwrap()
            .build()
    };
    let context_with = |add| {
        let mut ctx = Context::new(&instance);
        ctx.register(host(add)).unwrap();
        ctx.register(common::load_fixture(&instance, "native_lifecycle") as Arc<dyn Module>)
            .unwrap();
        ctx
    };
    // Right: the fixture checks the sum the import wrote to its register.
    let ctx = context_with(|c| {
        let mut a = ArgReader::new(c);
        let (x, y) = (a.i32()?, a.i32()?);
        c.ready_one(Variant::I32(x.wrapping_add(y)))
    });
    let f = ctx.lookup_function("check_add_import").unwrap();
    ctx.invoke(&f, vec![]).unwrap();
    // A wrong sum is seen (the register really is written).
    let ctx = context_with(|c| {
        let mut a = ArgReader::new(c);
        let (x, y) = (a.i32()?, a.i32()?);
        c.ready_one(Variant::I32(x.wrapping_add(y).wrapping_add(1)))
    });
    assert!(call_err(&ctx, "check_add_import", vec![]).code() != StatusCode::Ok);
    // Wrong type, and no result where one is declared.
    let ctx = context_with(|c| c.ready_one(Variant::F32(1.0)));
    let err = call_err(&ctx, "check_add_import", vec![]);
    assert_eq!(err.code(), StatusCode::Internal, "{err}");
    let ctx = context_with(|c| c.ready_none());
    let err = call_err(&ctx, "check_add_import", vec![]);
    assert_eq!(err.code(), StatusCode::Internal, "{err}");
    assert!(err.to_string().contains("returned 0 results"), "{err}");
    // From the host (argument values): the results come back as values.
    let ctx = context_with(|c| {
        let mut a = ArgReader::new(c);
        let (x, y) = (a.i32()?, a.i32()?);
        c.ready_one(Variant::I32(x * y))
    });
    let f = ctx.lookup_function("ferrite_test.add").unwrap();
    let out = ctx
        .invoke(&f, vec![Variant::I32(6), Variant::I32(7)])
        .unwrap();
    assert!(matches!(out.as_slice(), [Variant::I32(42)]), "{out:?}");

    // `ready_i32`, the typed writer: in place (right and wrong sums seen by
    // the fixture) and from the host.
    let ctx = context_with(|c| {
        let mut a = ArgReader::new(c);
        let (x, y) = (a.i32()?, a.i32()?);
        c.ready_i32(x.wrapping_add(y))
    });
    let f = ctx.lookup_function("check_add_import").unwrap();
    ctx.invoke(&f, vec![]).unwrap();
    let ctx = context_with(|c| {
        let mut a = ArgReader::new(c);
        let (x, y) = (a.i32()?, a.i32()?);
        c.ready_i32(x.wrapping_sub(y))
    });
    assert!(call_err(&ctx, "check_add_import", vec![]).code() != StatusCode::Ok);
    let ctx = context_with(|c| {
        let mut a = ArgReader::new(c);
        let (x, y) = (a.i32()?, a.i32()?);
        c.ready_i32(x - y)
    });
    let f = ctx.lookup_function("ferrite_test.add").unwrap();
    let out = ctx
        .invoke(&f, vec![Variant::I32(6), Variant::I32(7)])
        .unwrap();
    assert!(matches!(out.as_slice(), [Variant::I32(-1)]), "{out:?}");
    // `ready_ref` where the signature declares an i32: refused in place
    // (the caller's i32 register is not a ref register) and from the host.
    let ctx = context_with(|c| {
        c.ready_ref(ferrite_vm::Ref::new(
            ferrite_vm::buffer::VmBuffer::from_vec(vec![0; 4], false),
        ))
    });
    let err = call_err(&ctx, "check_add_import", vec![]);
    assert_eq!(err.code(), StatusCode::Internal, "{err}");
    let f = ctx.lookup_function("ferrite_test.add").unwrap();
    let err = ctx
        .invoke(&f, vec![Variant::I32(6), Variant::I32(7)])
        .unwrap_err();
    assert_eq!(err.code(), StatusCode::Internal, "{err}");
}

#[test]
fn wrong_arguments_to_invoke_are_invalid_argument() {
    let instance = Instance::default();
    let ctx = context(&instance, "arith_i32");
    let f = ctx.lookup_function("sum_i32").unwrap();

    let err = ctx.invoke(&f, vec![Variant::I32(1)]).unwrap_err();
    assert_eq!(err.code(), StatusCode::InvalidArgument, "{err}");
    let t = err.to_string();
    assert!(
        t.contains("sum_i32") && t.contains("expects 2 arguments") && t.contains("received 1"),
        "{t}"
    );

    let err = ctx
        .invoke(&f, vec![Variant::I32(1), Variant::I32(2), Variant::I32(3)])
        .unwrap_err();
    assert_eq!(err.code(), StatusCode::InvalidArgument, "{err}");
    assert!(err.to_string().contains("received 3"), "{err}");

    let err = ctx
        .invoke(&f, vec![Variant::I32(1), Variant::F32(2.0)])
        .unwrap_err();
    assert_eq!(err.code(), StatusCode::InvalidArgument, "{err}");
    let t = err.to_string();
    assert!(
        t.contains("argument 1") && t.contains("expected i32") && t.contains("received f32"),
        "{t}"
    );

    let err = ctx
        .invoke(&f, vec![Variant::Null, Variant::I32(2)])
        .unwrap_err();
    assert_eq!(err.code(), StatusCode::InvalidArgument, "{err}");
    assert!(err.to_string().contains("argument 0"), "{err}");

    let err = ctx
        .invoke(&f, vec![Variant::I64(1), Variant::I32(2)])
        .unwrap_err();
    assert!(err.to_string().contains("received i64"), "{err}");

    // A ref where a scalar is expected.
    let buf = ferrite_vm::Ref::new(common::FakeFence);
    let err = ctx
        .invoke(&f, vec![Variant::I32(1), Variant::Ref(buf)])
        .unwrap_err();
    assert_eq!(err.code(), StatusCode::InvalidArgument, "{err}");
    assert!(err.to_string().contains("argument 1"), "{err}");

    // The same checks through begin().
    let err = ctx
        .begin(&f, vec![])
        .err()
        .expect("begin must check arguments");
    assert_eq!(err.code(), StatusCode::InvalidArgument, "{err}");

    // Correct arguments still work afterwards.
    assert_eq!(
        ctx.invoke(&f, vec![Variant::I32(40), Variant::I32(2)])
            .unwrap(),
        vec![Variant::I32(42)]
    );

    // f64 where f32 is expected, on a mixed signature.
    let ctx = context(&instance, "calls");
    let f = ctx.lookup_function("mix").unwrap();
    let err = ctx
        .invoke(
            &f,
            vec![Variant::I64(1), Variant::F64(1.0), Variant::F64(1.0)],
        )
        .unwrap_err();
    let t = err.to_string();
    assert!(
        t.contains("argument 2") && t.contains("expected f32") && t.contains("received f64"),
        "{t}"
    );
}

#[test]
fn integer_division_by_zero_is_an_error() {
    let instance = Instance::default();
    let ctx = context(&instance, "traps");
    for op in ["div", "rem"] {
        for ty in ["i32s", "i32u", "i64s", "i64u"] {
            let name = format!("fail_{op}_{ty}_by_zero");
            let err = call_err(&ctx, &name, vec![]);
            assert_ne!(err.code(), StatusCode::Ok, "{name}");
            assert!(
                err.message().contains("division by zero") || err.message().contains("zero"),
                "{name}: {err}"
            );
            assert_eq!(
                err.backtrace().first().map(|f| f.function.clone()),
                Some(format!("traps.{name}"))
            );
        }
    }
    // Through a function taking the divisor as an argument.
    let ctx = context(&instance, "arith_i32");
    let f = ctx.lookup_function("divmod_i32").unwrap();
    let err = ctx
        .invoke(&f, vec![Variant::I32(7), Variant::I32(0)])
        .unwrap_err();
    assert_ne!(err.code(), StatusCode::Ok);
    assert_eq!(
        ctx.invoke(&f, vec![Variant::I32(7), Variant::I32(2)])
            .unwrap(),
        vec![Variant::I32(3), Variant::I32(1)]
    );
}

#[test]
fn unknown_function_lookup_is_not_found() {
    let instance = Instance::default();
    let ctx = context(&instance, "traps");
    let err = ctx.lookup_function("no_such_function").unwrap_err();
    assert_eq!(err.code(), StatusCode::NotFound);
    assert!(err.to_string().contains("no_such_function"), "{err}");
    let err = ctx.lookup_function("traps.no_such_function").unwrap_err();
    assert_eq!(err.code(), StatusCode::NotFound);
}

#[test]
fn arithmetic_edge_cases_wrap_instead_of_panicking() {
    let instance = Instance::default();
    let ctx = context(&instance, "arith_i32");
    let f = ctx.lookup_function("divmod_i32").unwrap();
    // INT32_MIN / -1 overflows (upstream's C interpreter traps): Ferrite
    // must give a value or an error, never a panic.
    let r = catch_unwind(AssertUnwindSafe(|| {
        ctx.invoke(&f, vec![Variant::I32(i32::MIN), Variant::I32(-1)])
    }))
    .expect("INT32_MIN / -1 panicked");
    if let Ok(v) = r {
        assert_eq!(v, vec![Variant::I32(i32::MIN), Variant::I32(0)]);
    }
    let f = ctx.lookup_function("sum_i32").unwrap();
    assert_eq!(
        ctx.invoke(&f, vec![Variant::I32(i32::MAX), Variant::I32(1)])
            .unwrap(),
        vec![Variant::I32(i32::MIN)]
    );
    // 40! overflows i64 and wraps.
    let ctx = context(&instance, "calls");
    let f = ctx.lookup_function("fact_i64").unwrap();
    let want = (1..=40i64).fold(1i64, |a, b| a.wrapping_mul(b));
    assert_eq!(
        ctx.invoke(&f, vec![Variant::I64(40)]).unwrap(),
        vec![Variant::I64(want)]
    );
}

/// An in-place entry (`NativeModuleBuilder::in_place`) serves calls from
/// bytecode: when it finishes, the body is not run and its result is the
/// one the caller sees; when it declines, the body runs as if there were no
/// entry; when it fails, the failure is named and placed in the backtrace
/// as the body's would be. Host calls always run the body.
#[test]
fn native_in_place_entry_finishes_declines_or_fails() {
    use ferrite_vm::in_place::InPlaceCall;
    use std::sync::atomic::{AtomicUsize, Ordering};
    type Entry = fn(&mut InPlaceCall<'_>) -> ferrite_base::Result<bool>;
    let instance = Instance::default();
    let body_calls = Arc::new(AtomicUsize::new(0));
    let context_with = |entry: Entry| {
        let calls = body_calls.clone();
        let host = NativeModuleBuilder::new("ferrite_test", 1)
            .function("on_init", "0v_v", |c| c.ready_none())
            .unwrap()
            .function("on_deinit", "0v_v", |c| c.ready_none())
            .unwrap()
            .function("add", "0ii_i", move |c| {
                calls.fetch_add(1, Ordering::Relaxed);
                let mut a = ArgReader::new(c);
                let (x, y) = (a.i32()?, a.i32()?);
                c.ready_i32(x.wrapping_add(y))
            })
            .unwrap()
            .in_place(entry)
            .unwrap()
            .build();
        let mut ctx = Context::new(&instance);
        ctx.register(host).unwrap();
        ctx.register(common::load_fixture(&instance, "native_lifecycle") as Arc<dyn Module>)
            .unwrap();
        ctx
    };
    let sum: Entry = |c| {
        let mut a = c.args();
        let (Some(x), Some(y)) = (a.i32(), a.i32()) else {
            return Ok(false);
        };
        let Some(out) = c.i32_result() else {
            return Ok(false);
        };
        c.finish_i32(out, x.wrapping_add(y));
        Ok(true)
    };
    // Finished by the entry: the fixture checks the sum, the body never ran.
    let ctx = context_with(sum);
    let f = ctx.lookup_function("check_add_import").unwrap();
    ctx.invoke(&f, vec![]).unwrap();
    assert_eq!(body_calls.load(Ordering::Relaxed), 0);
    // The entry's result is the one the caller sees.
    let ctx = context_with(|c| {
        let Some(out) = c.i32_result() else {
            return Ok(false);
        };
        c.finish_i32(out, -5);
        Ok(true)
    });
    assert!(call_err(&ctx, "check_add_import", vec![]).code() != StatusCode::Ok);
    assert_eq!(body_calls.load(Ordering::Relaxed), 0);
    // From the host: the body.
    let ctx = context_with(sum);
    let f = ctx.lookup_function("ferrite_test.add").unwrap();
    let out = ctx
        .invoke(&f, vec![Variant::I32(6), Variant::I32(7)])
        .unwrap();
    assert!(matches!(out.as_slice(), [Variant::I32(13)]), "{out:?}");
    assert_eq!(body_calls.load(Ordering::Relaxed), 1);
    // Declined: the body runs and its sum is checked.
    let ctx = context_with(|_| Ok(false));
    let f = ctx.lookup_function("check_add_import").unwrap();
    ctx.invoke(&f, vec![]).unwrap();
    assert!(body_calls.load(Ordering::Relaxed) > 1);
    // Failed: named as the body's failure, with its frame.
    let ctx = context_with(|_| Err(status!(Unavailable, "adder offline")));
    let err = call_err(&ctx, "check_add_import", vec![]);
    assert_eq!(err.code(), StatusCode::Unavailable, "{err}");
    assert!(err.to_string().contains("adder offline"), "{err}");
    assert!(
        err.to_string()
            .contains("in native function 'ferrite_test.add'"),
        "{err}"
    );
    let names: Vec<&str> = err
        .backtrace()
        .iter()
        .map(|f| f.function.as_str())
        .collect();
    assert_eq!(
        names,
        ["ferrite_test.add", "native_lifecycle.check_add_import"],
        "{err}"
    );
    // An entry needs a function to enter.
    let err = NativeModuleBuilder::new("m", 0)
        .in_place(|_| Ok(false))
        .err()
        .expect("an entry without a function is refused");
    assert_eq!(err.code(), StatusCode::FailedPrecondition, "{err}");
}
