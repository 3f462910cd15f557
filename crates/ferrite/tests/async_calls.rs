//! Calls as futures (issue 29): many concurrent calls on one device and
//! across two, results equal to the synchronous call's; a call ordered
//! after a wait fence really returns before its work runs and is woken by
//! the signal; dropped futures leave nothing behind; errors reach the
//! future; `futures::executor::block_on` and tokio both drive them.
//!
//! One source (`tests/hal/async_axpy.mlir`) is compiled twice by the
//! pinned compiler: with `--iree-execution-model=async-external` (the
//! function takes a wait and a signal fence and returns after enqueueing)
//! and with the default synchronous model (the function awaits its own
//! work, which yields to the future). `async_calls_gpu.rs` runs the same on
//! `cuda`.

mod async_common;
mod common;

use std::path::PathBuf;
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use async_common::{args, bounded, eventually, f32s, formula, gate, live_bytes, N};
use ferrite::{CallFuture, Fence, Instance, Semaphore, Session, StatusCode, Tensor};
use futures::future::join_all;
use futures::FutureExt;

fn source() -> PathBuf {
    common::root().join("tests/hal/async_axpy.mlir")
}

fn async_program() -> &'static PathBuf {
    static PATH: OnceLock<PathBuf> = OnceLock::new();
    PATH.get_or_init(|| {
        let out = ferrite_testkit::target_tmpdir!("ferrite-facade").join("async_axpy.vmfb");
        let mut flags = ferrite_testkit::GENERIC_CPU.to_vec();
        flags.push("--iree-execution-model=async-external");
        ferrite_testkit::compile_file(&source(), &out, &flags)
    })
}

fn sync_program() -> &'static PathBuf {
    static PATH: OnceLock<PathBuf> = OnceLock::new();
    PATH.get_or_init(|| {
        let out = ferrite_testkit::target_tmpdir!("ferrite-facade").join("sync_axpy.vmfb");
        ferrite_testkit::compile_file(&source(), &out, ferrite_testkit::GENERIC_CPU)
    })
}

fn session(device: &str, program: &PathBuf) -> Session {
    let mut s = Session::new(&Instance::new(), device).unwrap();
    s.load_file(program).unwrap();
    s
}

/// What the synchronous call of the synchronous-model program answers
/// for call `i` (the reference every asynchronous result must equal).
fn expected(reference: &Session, i: usize) -> Vec<f32> {
    let out = f32s(&reference.call("axpy", &args(i)).unwrap());
    // The reference itself against the formula worked out here.
    assert_eq!(out, formula(i), "reference call {i} is wrong");
    out
}

#[test]
fn the_program_is_async_external() {
    // The fixture really is what the tests claim: five arguments, the last
    // two fences, and the coarse-fences model in its reflection.
    let s = session("local-sync", async_program());
    let f = s.function("axpy").unwrap();
    assert_eq!(f.arg_count(), 5);
    let model = f
        .vm_function()
        .state
        .module()
        .exports()
        .iter()
        .find(|e| e.name == "axpy")
        .and_then(|e| e.signature.attr("iree.abi.model").map(str::to_string));
    assert_eq!(model.as_deref(), Some("coarse-fences"));
    // The blocking call cannot be used without fences; the future can.
    let e = s.call("axpy", &args(0)).unwrap_err();
    assert_eq!(e.code(), StatusCode::InvalidArgument);
}

#[test]
fn sixty_four_concurrent_calls_on_one_device_equal_the_sync_call() {
    let reference = session("local-sync", sync_program());
    let expected: Vec<Vec<f32>> = (0..64).map(|i| expected(&reference, i)).collect();
    for device in ["local-task", "local-sync"] {
        for program in [async_program(), sync_program()] {
            let s = session(device, program);
            let futures: Vec<CallFuture> =
                (0..64).map(|i| s.call_async("axpy", &args(i))).collect();
            let results = bounded(Duration::from_secs(60), move || {
                futures::executor::block_on(join_all(futures))
            });
            for (i, r) in results.into_iter().enumerate() {
                let got = f32s(&r.unwrap_or_else(|e| panic!("{device} call {i}: {e}")));
                assert_eq!(got, expected[i], "{device} {} call {i}", program.display());
            }
        }
    }
}

#[test]
fn concurrent_calls_across_two_devices_equal_the_sync_call() {
    let reference = session("local-sync", sync_program());
    let sync_dev = session("local-sync", async_program());
    let task_dev = session("local-task", async_program());
    let task_sync_model = session("local-task", sync_program());
    let sessions = [&sync_dev, &task_dev, &task_sync_model];
    // Interleaved: call i goes to session i % 3, all in flight together.
    let futures: Vec<CallFuture> = (0..66)
        .map(|i| sessions[i % 3].call_async("axpy", &args(i)))
        .collect();
    let results = bounded(Duration::from_secs(60), move || {
        futures::executor::block_on(join_all(futures))
    });
    for (i, r) in results.into_iter().enumerate() {
        assert_eq!(f32s(&r.unwrap()), expected(&reference, i), "call {i}");
    }
}

#[test]
fn a_gated_call_returns_at_once_and_the_signal_wakes_it() {
    let reference = session("local-sync", sync_program());
    for (device, program) in [
        ("local-task", async_program()),
        ("local-sync", async_program()),
        ("local-task", sync_program()),
    ] {
        let s = session(device, program);
        let f = s.function_owned("axpy").unwrap();
        let (sem, fence) = gate();
        // Returns with the work enqueued (async-external) or waiting to
        // begin (synchronous model): nothing can run before the gate.
        let mut call = f.call_async_after(&args(5), &fence);
        assert!(
            (&mut call).now_or_never().is_none(),
            "{device}: resolved before its wait fence was signalled"
        );
        assert_eq!(
            call.signal_fence().is_some(),
            program == async_program(),
            "only async-external calls have a signal fence"
        );
        let signaller = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(20));
            sem.signal(1).unwrap();
        });
        // block_on parks this thread: only the semaphore's signal, through
        // the waker, can bring it back.
        let out = bounded(Duration::from_secs(30), move || {
            futures::executor::block_on(call)
        });
        signaller.join().unwrap();
        assert_eq!(f32s(&out.unwrap()), expected(&reference, 5), "{device}");
    }
}

#[test]
fn calls_chain_on_the_device_through_signal_fences() {
    let reference = session("local-sync", sync_program());
    let s = session("local-task", async_program());
    let f = s.function_owned("axpy").unwrap();
    let (sem, fence) = gate();
    let mut calls = vec![f.call_async_after(&args(0), &fence)];
    for i in 1..8 {
        let previous = calls[i - 1].signal_fence().unwrap();
        calls.push(f.call_async_after(&args(i), &previous));
    }
    // Nothing ran: the first waits on the gate, each next on the one before.
    for c in &mut calls {
        assert!(c.now_or_never().is_none());
    }
    sem.signal(1).unwrap();
    let results = bounded(Duration::from_secs(30), move || {
        futures::executor::block_on(join_all(calls))
    });
    for (i, r) in results.into_iter().enumerate() {
        assert_eq!(f32s(&r.unwrap()), expected(&reference, i), "call {i}");
    }
}

#[test]
fn dropped_futures_finish_their_work_and_release_everything() {
    let reference = session("local-sync", sync_program());
    for (device, program) in [
        ("local-task", async_program()),
        ("local-sync", async_program()),
        ("local-task", sync_program()),
        ("local-sync", sync_program()),
    ] {
        let s = session(device, program);
        // Warm: what the first call allocates once (executables, pools).
        futures::executor::block_on(s.call_async("axpy", &args(0))).unwrap();
        let baseline = live_bytes(&s);
        let (sem, fence) = gate();
        let f = s.function("axpy").unwrap();
        let mut calls: Vec<CallFuture> = (0..16)
            .map(|i| f.call_async_after(&args(i), &fence))
            .collect();
        for c in &mut calls {
            assert!(c.now_or_never().is_none());
        }
        assert!(
            live_bytes(&s) > baseline,
            "{device}: the calls hold their arguments"
        );
        drop(calls);
        if program == sync_program() {
            // Not begun yet: they run without their futures once the gate
            // opens.
            assert!(ferrite::async_call::calls_in_flight() >= 16);
        }
        sem.signal(1).unwrap();
        // The work runs to the end and every buffer is released.
        eventually(
            &format!("{device}: dropped calls release their buffers"),
            || live_bytes(&s) == baseline,
        );
        // Dropped without a gate: an async-external call's work is on the
        // queue; a synchronous-model call is (usually) waiting inside its
        // invocation on its own work, and finishes without its future.
        let calls: Vec<CallFuture> = (0..16).map(|i| f.call_async(&args(i))).collect();
        drop(calls);
        eventually(
            &format!("{device}: calls dropped in flight release their buffers"),
            || live_bytes(&s) == baseline,
        );
        // The session goes on working.
        let more: Vec<CallFuture> = (0..8).map(|i| s.call_async("axpy", &args(i))).collect();
        let results = bounded(Duration::from_secs(30), move || {
            futures::executor::block_on(join_all(more))
        });
        for (i, r) in results.into_iter().enumerate() {
            assert_eq!(
                f32s(&r.unwrap()),
                expected(&reference, i),
                "{device} call {i}"
            );
        }
    }
    eventually("detached calls finish", || {
        ferrite::async_call::calls_in_flight() == 0
    });
}

#[test]
fn errors_reach_the_future() {
    for (device, program) in [
        ("local-task", async_program()),
        ("local-sync", async_program()),
        ("local-task", sync_program()),
    ] {
        let s = session(device, program);
        // A failed wait fence fails the call: on the device's queue for an
        // async-external call, before it begins for the synchronous model.
        let (sem, fence) = gate();
        let call = s
            .function("axpy")
            .unwrap()
            .call_async_after(&args(1), &fence);
        sem.fail(ferrite::Status::new(
            StatusCode::Aborted,
            "the previous stage failed",
        ));
        let e = bounded(Duration::from_secs(30), move || {
            futures::executor::block_on(call)
        })
        .unwrap_err();
        assert_eq!(e.code(), StatusCode::Aborted, "{device}: {e}");
        assert!(e.to_string().contains("the previous stage failed"), "{e}");
        // A tensor of the wrong shape: the program's own check fails.
        let mut bad = args(2);
        bad[1] = Tensor::from_f32(&[3], &[1.0, 2.0, 3.0]).unwrap().into();
        let e = futures::executor::block_on(s.call_async("axpy", &bad)).unwrap_err();
        assert!(e.to_string().contains("axpy"), "{device}: {e}");
        // Arguments the facade rejects, and a function that does not exist.
        let e = futures::executor::block_on(s.call_async("axpy", &args(0)[..2])).unwrap_err();
        assert_eq!(e.code(), StatusCode::InvalidArgument, "{e}");
        let e = futures::executor::block_on(s.call_async("nope", &[])).unwrap_err();
        assert_eq!(e.code(), StatusCode::NotFound, "{e}");
        // And the session still works.
        let out = futures::executor::block_on(s.call_async("axpy", &args(3))).unwrap();
        assert_eq!(f32s(&out).len(), N);
    }
}

#[test]
fn fence_and_semaphore_waits_are_futures() {
    let s = Semaphore::new(0);
    let fence = Fence::create_at(s.clone(), 2);
    let mut w = fence.wait_async();
    assert!((&mut w).now_or_never().is_none());
    let mut dropped = s.wait_async(7);
    assert!((&mut dropped).now_or_never().is_none());
    drop(dropped);
    std::thread::spawn({
        let s = s.clone();
        move || {
            std::thread::sleep(Duration::from_millis(10));
            s.signal(2).unwrap();
        }
    });
    bounded(Duration::from_secs(10), move || {
        futures::executor::block_on(w)
    })
    .unwrap();
    assert!(!s.has_sleepers(), "no waiter left behind");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tokio_tasks_drive_calls_and_cancel_them_with_timeouts() {
    let reference = session("local-sync", sync_program());
    let s = session("local-task", async_program());
    let f = s.function_owned("axpy").unwrap();
    // Spawned tasks need Send + 'static futures: the calls are.
    let tasks: Vec<_> = (0..64)
        .map(|i| tokio::spawn(f.call_async(&args(i))))
        .collect();
    for (i, t) in tasks.into_iter().enumerate() {
        let out = tokio::time::timeout(Duration::from_secs(60), t)
            .await
            .expect("a call did not finish: a wake-up was lost")
            .unwrap()
            .unwrap();
        assert_eq!(f32s(&out), expected(&reference, i), "call {i}");
    }
    // A timeout drops the call's future; the call itself completes once
    // its gate opens, and the device's memory comes back.
    let before = live_bytes(&s);
    let (sem, fence) = gate();
    let late = tokio::time::timeout(
        Duration::from_millis(20),
        f.call_async_after(&args(1), &fence),
    )
    .await;
    assert!(
        late.is_err(),
        "the gated call cannot finish before its gate"
    );
    sem.signal(1).unwrap();
    let start = Instant::now();
    while live_bytes(&s) != before {
        assert!(
            start.elapsed() < Duration::from_secs(20),
            "buffers never released"
        );
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    // A semaphore wait composes with tokio's timer as well.
    let never = Semaphore::new(0);
    let r = tokio::time::timeout(Duration::from_millis(10), never.wait_async(1)).await;
    assert!(r.is_err());
    assert!(!never.has_sleepers());
}

#[tokio::test]
async fn a_current_thread_runtime_is_woken_from_device_threads() {
    // One thread polls everything; the wakes come from local-task's
    // workers and from the thread that opens the gate.
    let s = session("local-task", async_program());
    let f = s.function_owned("axpy").unwrap();
    let (sem, fence) = gate();
    let gated = f.call_async_after(&args(2), &fence);
    let calls: Vec<CallFuture> = (0..16).map(|i| f.call_async(&args(i))).collect();
    std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(10));
        sem.signal(1).unwrap();
    });
    let all = tokio::time::timeout(Duration::from_secs(60), async {
        (gated.await, join_all(calls).await)
    })
    .await
    .expect("a wake-up was lost");
    assert_eq!(f32s(&all.0.unwrap()), formula(2));
    for (i, r) in all.1.into_iter().enumerate() {
        assert_eq!(f32s(&r.unwrap()), formula(i), "call {i}");
    }
}

/// Threads of this process now (Linux: one entry per thread in
/// `/proc/self/task`).
#[cfg(target_os = "linux")]
fn thread_count() -> usize {
    std::fs::read_dir("/proc/self/task")
        .expect("reading /proc/self/task")
        .count()
}

#[cfg(target_os = "linux")]
#[test]
fn calls_in_flight_park_no_threads() {
    // 512 calls waiting on a gate, on a device with its own queue threads
    // and on one without (where the call waits for the gate as a future):
    // if any wait parked a thread per call, the process would hold
    // hundreds more threads. Other tests of this binary run meanwhile and
    // start a few threads of their own; the bound leaves room for them.
    let reference = session("local-sync", sync_program());
    let expected: Vec<Vec<f32>> = (0..8).map(|i| expected(&reference, i)).collect();
    for (device, program) in [
        ("local-task", async_program()),
        ("local-sync", async_program()),
        ("local-task", sync_program()),
    ] {
        let s = session(device, program);
        let f = s.function_owned("axpy").unwrap();
        let (sem, fence) = gate();
        let before = thread_count();
        let mut calls: Vec<CallFuture> = (0..512)
            .map(|i| f.call_async_after(&args(i % 8), &fence))
            .collect();
        for c in &mut calls {
            assert!(c.now_or_never().is_none());
        }
        let during = thread_count();
        assert!(
            during < before + 128,
            "{device}: {before} threads before, {during} with 512 calls in flight"
        );
        sem.signal(1).unwrap();
        let results = bounded(Duration::from_secs(120), move || {
            futures::executor::block_on(join_all(calls))
        });
        for (i, r) in results.into_iter().enumerate() {
            assert_eq!(f32s(&r.unwrap()), expected[i % 8], "{device} call {i}");
        }
    }
}
