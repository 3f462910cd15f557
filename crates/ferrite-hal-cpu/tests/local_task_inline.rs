//! `local-task` runs small submissions whose wait is already reached on
//! the submitting thread (issue 25: a queued one woke a pinned worker that,
//! on a busy machine, held the job while waiting for its CPU), and only
//! those: multi-tile work and work that must wait still go to the pool,
//! and progress without any thread waiting for them.

mod common;

use ferrite_base::Timeout;
use ferrite_hal::buffer::Buffer;
use ferrite_hal::command_buffer::CommandBuffer;
use ferrite_hal::device::{queue, Device, WorkHint};
use ferrite_hal::executable::ExecutableRef;
use ferrite_hal::fence::Fence;
use ferrite_hal::semaphore::Semaphore;
use ferrite_hal_cpu::device::{is_small, solo_sized, SOLO_MAX_WORKGROUPS};
use ferrite_hal_cpu::pool::PoolOptions;
use ferrite_hal_cpu::CpuDevice;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Elements of the multi-workgroup `add` program (tests/hal/add.mlir).
const N: usize = 100_000;

use common::{add_program, buffer, whole};

fn check(out: &Buffer, n: usize) {
    let got = common::bytes_f32(&out.to_vec().unwrap());
    let want: Vec<f32> = (0..n).map(|i| i as f32 + 10.0).collect();
    assert!(got == want, "wrong results");
}

fn local_task(workers: usize) -> (Arc<CpuDevice>, Arc<dyn Device>) {
    let cpu = CpuDevice::local_task_with(PoolOptions::new(workers)).unwrap();
    let dev: Arc<dyn Device> = cpu.clone();
    (cpu, dev)
}

#[test]
fn small_ready_work_runs_before_submit_returns() {
    let (cpu, dev) = local_task(2);
    let (cb, out, workgroups) = add_program(&dev, "add4", 4);
    assert_eq!(workgroups, [1, 1, 1], "add4 is one workgroup");
    for i in 1..=3u64 {
        let done = Fence::create_at(Semaphore::new(0), 1);
        queue::execute(&dev, &Fence::new(), &done, Some(&cb), vec![]).unwrap();
        // No wait: queued, the work would still be ahead of a worker.
        assert!(done.query().unwrap(), "call {i}: not reached at return");
        assert_eq!(cpu.scheduler_stats().unwrap().inline_submissions, i);
    }
    check(&out, 4);
    // Run on this thread, they still count as command buffers and
    // workgroups (on other threads than the workers).
    let stats = cpu.scheduler_stats().unwrap();
    assert_eq!((stats.regions, stats.workgroups_on_callers), (3, 3));
    assert_eq!(stats.workgroups_on_workers, 0);
    // Bookkeeping (alloca, dealloca, barrier) whose wait is reached too.
    let done = Fence::create_at(Semaphore::new(0), 1);
    queue::barrier(&dev, &Fence::new(), &done).unwrap();
    assert!(done.query().unwrap());
    assert_eq!(cpu.scheduler_stats().unwrap().inline_submissions, 4);
}

#[test]
fn multi_tile_and_waiting_work_goes_to_the_pool() {
    let (cpu, dev) = local_task(2);
    let (cb, out, workgroups) = add_program(&dev, "add", N);
    assert!(workgroups.iter().product::<u32>() > 1);
    let done = Fence::create_at(Semaphore::new(0), 1);
    queue::execute(&dev, &Fence::new(), &done, Some(&cb), vec![]).unwrap();
    assert!(done.wait(Timeout::INFINITE).unwrap());
    check(&out, N);
    // Small work that must wait is queued behind its wait.
    let (small, small_out, _) = add_program(&dev, "add4", 4);
    let gate = Semaphore::new(0);
    let done = Fence::create_at(Semaphore::new(0), 1);
    let wait = Fence::create_at(gate.clone(), 1);
    queue::execute(&dev, &wait, &done, Some(&small), vec![]).unwrap();
    assert!(!done.query().unwrap());
    gate.signal(1).unwrap();
    assert!(done.wait(Timeout::INFINITE).unwrap());
    check(&small_out, 4);
    assert_eq!(cpu.scheduler_stats().unwrap().inline_submissions, 0);
}

#[test]
fn pools_that_do_not_lend_queue_everything() {
    let cpu = CpuDevice::local_task_with(PoolOptions {
        lend_to_waiters: false,
        ..PoolOptions::new(2)
    })
    .unwrap();
    let dev: Arc<dyn Device> = cpu.clone();
    let (cb, out, _) = add_program(&dev, "add4", 4);
    let done = Fence::create_at(Semaphore::new(0), 1);
    queue::execute(&dev, &Fence::new(), &done, Some(&cb), vec![]).unwrap();
    assert!(done.wait(Timeout::INFINITE).unwrap());
    check(&out, 4);
    assert_eq!(cpu.scheduler_stats().unwrap().inline_submissions, 0);
}

/// Submissions nobody waits for (no thread lends itself) still finish:
/// the pool's workers run them. Polled without blocking, so no waiter
/// ever runs pool work.
#[test]
fn async_submissions_progress_without_a_waiter() {
    let (_cpu, dev) = local_task(2);
    let (big, big_out, _) = add_program(&dev, "add", N);
    let (small, small_out, _) = add_program(&dev, "add4", 4);
    let gate = Semaphore::new(0);
    let big_done = Fence::create_at(Semaphore::new(0), 1);
    let small_done = Fence::create_at(Semaphore::new(0), 1);
    queue::execute(&dev, &Fence::new(), &big_done, Some(&big), vec![]).unwrap();
    queue::execute(
        &dev,
        &Fence::create_at(gate.clone(), 1),
        &small_done,
        Some(&small),
        vec![],
    )
    .unwrap();
    // The gate opens on another thread, as a device or host event would.
    let opener = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(20));
        gate.signal(1).unwrap();
    });
    let start = Instant::now();
    while !(big_done.query().unwrap() && small_done.query().unwrap()) {
        assert!(
            start.elapsed() < Duration::from_secs(20),
            "queued submissions made no progress without a waiter"
        );
        std::thread::sleep(Duration::from_millis(1));
    }
    opener.join().unwrap();
    check(&big_out, N);
    check(&small_out, 4);
}

#[test]
fn small_means_one_tile_per_stage() {
    let dev: Arc<dyn Device> = CpuDevice::local_sync();
    let exe = common::executable("add4");
    let loaded = dev.create_executable(&exe.format, &exe.data, &[]).unwrap();
    let buf = buffer(&dev, &[0.0; 4]);
    let dispatch = |cb: &CommandBuffer, workgroups: [u32; 3]| {
        let refs = vec![whole(&buf), whole(&buf), whole(&buf)];
        cb.dispatch(
            ExecutableRef(loaded.clone()),
            0,
            workgroups,
            None,
            vec![],
            refs,
        )
        .unwrap();
    };
    let commands = |build: &dyn Fn(&CommandBuffer)| {
        let cb = CommandBuffer::new(0, 3, u64::MAX, 0);
        build(&cb);
        cb.finalize().unwrap();
        cb.commands().unwrap()
    };
    assert!(is_small(WorkHint::Bookkeeping));
    // A chain of single-workgroup dispatches, one per stage.
    let chain = commands(&|cb| {
        for _ in 0..100 {
            dispatch(cb, [1, 1, 1]);
            cb.execution_barrier().unwrap();
        }
    });
    assert!(is_small(WorkHint::Commands(&chain)));
    // Two independent dispatches could run on two threads.
    let pair = commands(&|cb| {
        dispatch(cb, [1, 1, 1]);
        dispatch(cb, [1, 1, 1]);
    });
    assert!(!is_small(WorkHint::Commands(&pair)));
    let grid = commands(&|cb| dispatch(cb, [2, 1, 1]));
    assert!(!is_small(WorkHint::Commands(&grid)));
    // The loaded-solo rule's size: up to SOLO_MAX_WORKGROUPS in all, over
    // any number of dispatches and stages.
    assert!(solo_sized(WorkHint::Bookkeeping));
    // (100 single-workgroup stages: small work, but over the solo bound.)
    assert!(!solo_sized(WorkHint::Commands(&chain)));
    assert!(solo_sized(WorkHint::Commands(&grid)));
    let n = SOLO_MAX_WORKGROUPS as u32;
    let at_bound = commands(&|cb| {
        dispatch(cb, [n / 2, 1, 1]);
        cb.execution_barrier().unwrap();
        dispatch(cb, [n - n / 2, 1, 1]);
    });
    assert!(solo_sized(WorkHint::Commands(&at_bound)));
    let over = commands(&|cb| {
        dispatch(cb, [n / 2, 1, 1]);
        cb.execution_barrier().unwrap();
        dispatch(cb, [1, n - n / 2 + 1, 1]);
    });
    assert!(!solo_sized(WorkHint::Commands(&over)));
}
