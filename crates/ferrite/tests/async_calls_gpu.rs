//! Calls as futures on `cuda` (issue 29): the program of
//! `async_calls.rs` (`tests/hal/async_axpy.mlir`) compiled for sm_80 with
//! `--iree-execution-model=async-external`. The futures are woken through
//! the device timeline: the GPU's completion reaches the host semaphore
//! (the completion thread, told to report because a waiter subscribed), and
//! that signal wakes the task. Results are checked against values worked
//! out here (exact in f32, fused or not).
//!
//! Needs a GPU: skipped with a printed reason otherwise (a failure under
//! `FERRITE_REQUIRE_GPU=1`). The module comes from
//! `FERRITE_ASYNC_GPU_MODULE` when set, else from `async-modules/` beside
//! this test executable (where `scripts/gpu-build.sh` puts it for a GPU
//! machine without the compiler), else it is compiled here.

mod async_common;

use std::path::PathBuf;
use std::time::{Duration, Instant};

use async_common::{args, bounded, eventually, f32s, formula, gate, live_bytes};
use ferrite::{CallFuture, Instance, Session, StatusCode};
use ferrite_hal::driver::{Driver, DriverOptions};
use futures::future::join_all;
use futures::FutureExt;

/// Whether a GPU is here; prints why not (fails under
/// `FERRITE_REQUIRE_GPU=1`).
fn gpu() -> bool {
    let n = ferrite_hal_cuda::CudaDriver
        .enumerate(&DriverOptions::default())
        .map(|d| d.len())
        .unwrap_or(0);
    if n > 0 {
        return true;
    }
    if std::env::var("FERRITE_REQUIRE_GPU").as_deref() == Ok("1") {
        panic!("FERRITE_REQUIRE_GPU=1 but no cuda device was found");
    }
    println!("SKIPPED calls as futures on cuda: no cuda device");
    false
}

fn module() -> PathBuf {
    if let Ok(p) = std::env::var("FERRITE_ASYNC_GPU_MODULE") {
        return PathBuf::from(p);
    }
    if let Some(beside) = std::env::current_exe()
        .ok()
        .and_then(|e| {
            e.parent()
                .map(|d| d.join("async-modules/async_axpy.cuda.vmfb"))
        })
        .filter(|p| p.is_file())
    {
        return beside;
    }
    let src = ferrite_testkit::workspace_root().join("tests/hal/async_axpy.mlir");
    let out = ferrite_testkit::target_tmpdir!("ferrite-facade").join("async_axpy.cuda.vmfb");
    ferrite_testkit::compile_file(
        &src,
        &out,
        &[
            "--iree-hal-target-device=cuda",
            "--iree-cuda-target=sm_80",
            "--iree-execution-model=async-external",
        ],
    )
}

fn session() -> Session {
    let mut s = Session::new(&Instance::new(), "cuda").unwrap();
    s.load_file(module()).unwrap();
    s
}

#[test]
fn sixty_four_concurrent_calls_on_cuda() {
    if !gpu() {
        return;
    }
    let s = session();
    let start = Instant::now();
    let calls: Vec<CallFuture> = (0..64).map(|i| s.call_async("axpy", &args(i))).collect();
    let results = bounded(Duration::from_secs(60), move || {
        futures::executor::block_on(join_all(calls))
    });
    println!("64 concurrent calls on cuda: {:?}", start.elapsed());
    for (i, r) in results.into_iter().enumerate() {
        assert_eq!(f32s(&r.unwrap()), formula(i), "call {i}");
    }
}

#[test]
fn gated_and_chained_calls_on_cuda_are_woken_by_the_device() {
    if !gpu() {
        return;
    }
    let s = session();
    let f = s.function_owned("axpy").unwrap();
    let (sem, fence) = gate();
    let mut calls = vec![f.call_async_after(&args(0), &fence)];
    for i in 1..8 {
        let previous = calls[i - 1].signal_fence().unwrap();
        calls.push(f.call_async_after(&args(i), &previous));
    }
    for c in &mut calls {
        assert!(
            c.now_or_never().is_none(),
            "resolved before its gate opened"
        );
    }
    let signaller = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(20));
        sem.signal(1).unwrap();
    });
    let results = bounded(Duration::from_secs(30), move || {
        futures::executor::block_on(join_all(calls))
    });
    signaller.join().unwrap();
    for (i, r) in results.into_iter().enumerate() {
        assert_eq!(f32s(&r.unwrap()), formula(i), "call {i}");
    }
}

#[test]
fn dropped_and_failed_calls_on_cuda() {
    if !gpu() {
        return;
    }
    let s = session();
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
    drop(calls);
    sem.signal(1).unwrap();
    // Nobody waits on the device after this: the kept work is enqueued
    // once the gate opens, and its reports (which release its buffers)
    // must come without a waiter asking for them.
    eventually("dropped cuda calls release their buffers", || {
        live_bytes(&s) == baseline
    });
    // The same for a call enqueued at once and dropped (no host wait at
    // all follows it).
    drop(s.call_async("axpy", &args(2)));
    eventually("a dropped cuda call releases its buffers unwatched", || {
        live_bytes(&s) == baseline
    });
    // A failed wait fence fails the call's signal fence on the device.
    let (sem, fence) = gate();
    let call = f.call_async_after(&args(1), &fence);
    sem.fail(ferrite::Status::new(
        StatusCode::Aborted,
        "the previous stage failed",
    ));
    let e = bounded(Duration::from_secs(30), move || {
        futures::executor::block_on(call)
    })
    .unwrap_err();
    assert_eq!(e.code(), StatusCode::Aborted, "{e}");
    // Still working.
    let out = futures::executor::block_on(s.call_async("axpy", &args(3))).unwrap();
    assert_eq!(f32s(&out), formula(3));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tokio_tasks_drive_cuda_calls() {
    if !gpu() {
        return;
    }
    let s = session();
    let f = s.function_owned("axpy").unwrap();
    let tasks: Vec<_> = (0..64)
        .map(|i| tokio::spawn(f.call_async(&args(i))))
        .collect();
    for (i, t) in tasks.into_iter().enumerate() {
        let out = tokio::time::timeout(Duration::from_secs(60), t)
            .await
            .expect("a call did not finish: a wake-up was lost")
            .unwrap()
            .unwrap();
        assert_eq!(f32s(&out), formula(i), "call {i}");
    }
}
