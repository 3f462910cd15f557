//! Coroutines: native functions that suspend their caller on wait sources,
//! driven by `Invocation::step` and by the built-in scheduler (`ctx.invoke`).
//!
//! - a wait on an `Event` set from another thread completes, without
//!   busy-waiting (the native function is stepped exactly twice and the
//!   waiting thread uses little CPU);
//! - a failed event fails the invocation with the event's status;
//! - a deadline on a never-set event gives DEADLINE_EXCEEDED on time;
//! - the `yield` fixture and `yieldable_test` functions yield and resume.

mod common;

use ferrite_base::wait::{Event, WaitMode};
use ferrite_base::{Deadline, Status, StatusCode, WaitSource};
use ferrite_vm::native::{ArgReader, NativeModule, NativeModuleBuilder};
use ferrite_vm::stack::{NativePoll, Wait};
use ferrite_vm::{Context, Instance, Module, Poll, Variant};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// `ferrite_async.wait(x)`: first step yields on `event` (with `deadline`),
/// the resumed step returns `x + 1`. Counts steps.
fn async_module(
    event: Arc<Event>,
    deadline: Deadline,
    steps: Arc<AtomicUsize>,
) -> Arc<NativeModule> {
    NativeModuleBuilder::new("ferrite_async", 0)
        .function("wait", "0i_i", move |call| {
            steps.fetch_add(1, Ordering::SeqCst);
            if !call.resumed {
                let source: Arc<dyn WaitSource> = event.clone();
                return Ok(NativePoll::Pending(Wait {
                    sources: vec![source],
                    mode: WaitMode::All,
                    deadline,
                    handles_failure: false,
                }));
            }
            // Resumed: the event must be ready now (the scheduler only
            // resumes after the wait is satisfied).
            if !event.poll()? {
                return Err(ferrite_base::status!(
                    Internal,
                    "resumed before the event was set"
                ));
            }
            let x = ArgReader::new(call).i32()?;
            Ok(NativePoll::Ready(vec![Variant::I32(x + 1)]))
        })
        .expect("declaring ferrite_async.wait")
        .build()
}

struct Setup {
    ctx: Context,
    event: Arc<Event>,
    steps: Arc<AtomicUsize>,
}

fn setup(deadline: Deadline) -> Setup {
    let instance = Instance::default();
    let event = Event::new();
    let steps = Arc::new(AtomicUsize::new(0));
    let module = common::load_fixture(&instance, "native_async");
    let mut ctx = Context::new(&instance);
    ctx.register(async_module(event.clone(), deadline, steps.clone()))
        .unwrap();
    ctx.register(module as Arc<dyn Module>).unwrap();
    Setup { ctx, event, steps }
}

/// CPU time consumed so far by the calling thread, when Linux tells.
fn thread_cpu_time() -> Option<Duration> {
    let s = std::fs::read_to_string("/proc/thread-self/schedstat").ok()?;
    let ns: u64 = s.split_whitespace().next()?.parse().ok()?;
    Some(Duration::from_nanos(ns))
}

fn set_later(event: &Arc<Event>, after: Duration) -> std::thread::JoinHandle<()> {
    let e = event.clone();
    std::thread::spawn(move || {
        std::thread::sleep(after);
        e.set();
    })
}

#[test]
fn step_returns_pending_until_event_is_set() {
    for function in ["wait_yieldable", "wait_plain"] {
        let s = setup(Deadline::InfiniteFuture);
        let f = s.ctx.lookup_function(function).unwrap();
        let mut inv = s.ctx.begin(&f, vec![Variant::I32(41)]).unwrap();
        let w = match inv.step().unwrap() {
            Poll::Pending(w) => w,
            Poll::Done(v) => panic!("{function}: finished without waiting: {v:?}"),
        };
        assert_eq!(w.sources.len(), 1);
        assert_eq!(s.steps.load(Ordering::SeqCst), 1);
        s.event.set();
        ferrite_base::wait::wait_sources(&w.sources, w.mode, w.deadline).unwrap();
        let want = if function == "wait_yieldable" {
            1042
        } else {
            2042
        };
        match inv.step().unwrap() {
            Poll::Done(v) => assert_eq!(v, vec![Variant::I32(want)], "{function}"),
            Poll::Pending(w) => panic!("{function}: pending again: {w:?}"),
        }
        assert_eq!(s.steps.load(Ordering::SeqCst), 2);
        // A completed invocation cannot be stepped again.
        let e = inv.step().unwrap_err();
        assert_eq!(e.code(), StatusCode::FailedPrecondition, "{e}");
    }
}

#[test]
fn invoke_blocks_on_event_without_busy_waiting() {
    let s = setup(Deadline::InfiniteFuture);
    let f = s.ctx.lookup_function("wait_yieldable").unwrap();
    let delay = Duration::from_millis(60);
    let cpu0 = thread_cpu_time();
    let start = Instant::now();
    let setter = set_later(&s.event, delay);
    let r = s.ctx.invoke(&f, vec![Variant::I32(1)]).unwrap();
    let elapsed = start.elapsed();
    let cpu = thread_cpu_time().zip(cpu0).map(|(a, b)| a - b);
    setter.join().unwrap();
    assert_eq!(r, vec![Variant::I32(1002)]);
    assert!(
        elapsed >= delay - Duration::from_millis(5),
        "returned after {elapsed:?}, before the event was set"
    );
    assert_eq!(
        s.steps.load(Ordering::SeqCst),
        2,
        "the native function was stepped more than begin + one resume (polling?)"
    );
    if let Some(cpu) = cpu {
        assert!(
            cpu < Duration::from_millis(30),
            "the waiting thread used {cpu:?} of CPU during a {elapsed:?} wait (busy-waiting?)"
        );
        println!("waited {elapsed:?} using {cpu:?} CPU");
    }
}

#[test]
fn failed_event_fails_the_invocation_with_its_status() {
    for function in ["wait_yieldable", "wait_plain"] {
        let s = setup(Deadline::InfiniteFuture);
        let f = s.ctx.lookup_function(function).unwrap();
        let e = s.event.clone();
        let t = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(20));
            e.fail(Status::new(StatusCode::Aborted, "device lost in test"));
        });
        let err = s.ctx.invoke(&f, vec![Variant::I32(1)]).unwrap_err();
        t.join().unwrap();
        assert_eq!(err.code(), StatusCode::Aborted, "{function}: {err}");
        assert!(err.to_string().contains("device lost in test"), "{err}");
        assert_eq!(s.steps.load(Ordering::SeqCst), 1, "{function}");
    }
    // Already failed before the call: fails at once.
    let s = setup(Deadline::InfiniteFuture);
    s.event
        .fail(Status::new(StatusCode::DataLoss, "failed up front"));
    let f = s.ctx.lookup_function("wait_plain").unwrap();
    let err = s.ctx.invoke(&f, vec![Variant::I32(1)]).unwrap_err();
    assert_eq!(err.code(), StatusCode::DataLoss, "{err}");
}

#[test]
fn deadline_on_never_set_event_is_exceeded() {
    let budget = Duration::from_millis(20);
    let s = setup(Deadline::after(budget));
    let f = s.ctx.lookup_function("wait_yieldable").unwrap();
    let start = Instant::now();
    let err = s.ctx.invoke(&f, vec![Variant::I32(1)]).unwrap_err();
    let elapsed = start.elapsed();
    assert_eq!(err.code(), StatusCode::DeadlineExceeded, "{err}");
    assert!(
        elapsed >= budget - Duration::from_millis(2),
        "gave up after {elapsed:?}"
    );
    assert!(elapsed < Duration::from_secs(5), "took {elapsed:?}");
    // The invocation is over: the context still works for new calls.
    s.event.set();
    let r = s.ctx.invoke(&f, vec![Variant::I32(5)]);
    // (the deadline captured at module build time has passed; a new wait on
    // an already-set event is satisfied by the first poll)
    assert_eq!(r.unwrap(), vec![Variant::I32(1006)]);
}

#[test]
fn deadline_in_the_past_polls_once() {
    let s = setup(Deadline::InfinitePast);
    let f = s.ctx.lookup_function("wait_plain").unwrap();
    let start = Instant::now();
    let err = s.ctx.invoke(&f, vec![Variant::I32(1)]).unwrap_err();
    assert_eq!(err.code(), StatusCode::DeadlineExceeded, "{err}");
    assert!(start.elapsed() < Duration::from_secs(1));
}

fn drive(ctx: &Context, name: &str, args: Vec<Variant>) -> (usize, Vec<Variant>) {
    let f = ctx.lookup_function(name).unwrap();
    let mut inv = ctx.begin(&f, args).unwrap();
    let mut pending = 0;
    loop {
        match inv.step().unwrap_or_else(|e| panic!("{name}: {e}")) {
            Poll::Done(v) => return (pending, v),
            Poll::Pending(w) => {
                assert!(w.sources.is_empty(), "{name}: plain yields wait on nothing");
                pending += 1;
                assert!(pending < 10_000, "{name} never finishes");
            }
        }
    }
}

#[test]
fn yield_fixture_resumes_at_saved_pc() {
    let instance = Instance::default();
    let module = common::load_fixture(&instance, "yield");
    let ctx = common::context_for(&instance, module).unwrap();
    assert_eq!(drive(&ctx, "test_yield_in_place", vec![]), (2, vec![]));
    // count_down(6) yields 6 times inside a call.yieldable callee, then
    // count_down(0) never yields.
    assert_eq!(
        drive(&ctx, "test_call_yieldable_internal", vec![]),
        (6, vec![])
    );
    for n in [0, 1, 5, 100] {
        assert_eq!(
            drive(&ctx, "yield_sum", vec![Variant::I32(n)]),
            (n as usize, vec![Variant::I32(2 * n)])
        );
        // And through the blocking scheduler.
        let f = ctx.lookup_function("yield_sum").unwrap();
        assert_eq!(
            ctx.invoke(&f, vec![Variant::I32(n)]).unwrap(),
            vec![Variant::I32(2 * n)]
        );
    }
}

#[test]
fn yieldable_test_module_functions() {
    let instance = Instance::default();
    let mut ctx = Context::new(&instance);
    ctx.register(ferrite_vm::testing::yieldable_test_module().unwrap())
        .unwrap();
    // yield_n(5, 3): yields 3 times, returns 8.
    assert_eq!(
        drive(
            &ctx,
            "yieldable_test.yield_n",
            vec![Variant::I32(5), Variant::I32(3)]
        ),
        (3, vec![Variant::I32(8)])
    );
    // yield_variadic_sum([1, 2, 3], 2): arguments flattened as count,
    // elements, then n; yields twice, returns 6 + 2.
    let args = vec![
        Variant::I32(3),
        Variant::I32(1),
        Variant::I32(2),
        Variant::I32(3),
        Variant::I32(2),
    ];
    assert_eq!(
        drive(&ctx, "yieldable_test.yield_variadic_sum", args),
        (2, vec![Variant::I32(8)])
    );
    let args = vec![Variant::I32(0), Variant::I32(0)];
    assert_eq!(
        drive(&ctx, "yieldable_test.yield_variadic_sum", args),
        (0, vec![Variant::I32(0)])
    );
}

#[test]
fn call_variadic_yieldable_import_resumes() {
    // hal_variadic's test_call_variadic_yieldable_import calls the (fake)
    // hal.fence.await through call.variadic.yieldable; the fake yields once.
    let instance = common::fixture_instance();
    let module = common::load_fixture(&instance, "hal_variadic");
    let ctx = common::context_for(&instance, module).unwrap();
    assert_eq!(
        drive(&ctx, "test_call_variadic_yieldable_import", vec![]),
        (1, vec![])
    );
    assert_eq!(
        drive(&ctx, "test_call_variadic_import", vec![]),
        (0, vec![])
    );
}

#[test]
fn many_invocations_interleaved_on_one_context() {
    // Several suspended invocations of the same context progress
    // independently when stepped in turn.
    let instance = Instance::default();
    let module = common::load_fixture(&instance, "yield");
    let ctx = common::context_for(&instance, module).unwrap();
    let f = ctx.lookup_function("yield_sum").unwrap();
    let mut invs: Vec<_> = (0..8)
        .map(|n| (n, ctx.begin(&f, vec![Variant::I32(n)]).unwrap(), None))
        .collect();
    let mut rounds = 0;
    while invs.iter().any(|(_, _, r)| r.is_none()) {
        for (_, inv, result) in invs.iter_mut().filter(|(_, _, r)| r.is_none()) {
            if let Poll::Done(v) = inv.step().unwrap() {
                *result = Some(v);
            }
        }
        rounds += 1;
        assert!(rounds < 100);
    }
    for (n, _, r) in invs {
        assert_eq!(r.unwrap(), vec![Variant::I32(2 * n)]);
    }
}

/// A wait made with `handles_failure` hands a timeout to the function,
/// which turns it into a result instead of failing the invocation (what
/// `hal.fence.await` does with `DEADLINE_EXCEEDED`).
#[test]
fn handled_wait_failure_reaches_the_function() {
    let instance = ferrite_vm::Instance::default();
    let event = ferrite_base::wait::Event::new();
    let module = NativeModuleBuilder::new("awaiter", 0)
        .function("await_code", "0i_i", move |call| {
            if !call.resumed {
                let source: Arc<dyn WaitSource> = event.clone();
                return Ok(NativePoll::Pending(Wait {
                    sources: vec![source],
                    mode: WaitMode::All,
                    deadline: Deadline::after(Duration::from_millis(10)),
                    handles_failure: true,
                }));
            }
            let code = match call.take_wait_status() {
                Some(Ok(())) => 0,
                Some(Err(e)) => e.code() as i32,
                None => -1,
            };
            Ok(NativePoll::Ready(vec![Variant::I32(code)]))
        })
        .unwrap()
        .build();
    let mut ctx = ferrite_vm::Context::new(&instance);
    ctx.register(module).unwrap();
    let f = ctx.lookup_function("awaiter.await_code").unwrap();
    let r = ctx.invoke(&f, vec![Variant::I32(0)]).unwrap();
    assert_eq!(r, vec![Variant::I32(StatusCode::DeadlineExceeded as i32)]);
}
