//! The `local-task` scheduler seen from outside: a command buffer of
//! multi-workgroup dispatches in two dependent stages (independent
//! dispatches within each) gives the right results, its workgroups reach
//! the worker threads, and with lending to waiters turned off the waiting
//! caller runs none of them.

mod common;

use ferrite_base::Timeout;
use ferrite_hal::allocator::BufferParams;
use ferrite_hal::buffer::Buffer;
use ferrite_hal::command_buffer::{BufferRef, CommandBuffer};
use ferrite_hal::device::{queue, Device};
use ferrite_hal::executable::ExecutableRef;
use ferrite_hal::fence::Fence;
use ferrite_hal::memory::{BufferUsage, MemoryType};
use ferrite_hal::semaphore::Semaphore;
use ferrite_hal_cpu::pool::PoolOptions;
use ferrite_hal_cpu::CpuDevice;
use std::sync::Arc;
use std::time::Duration;

/// Elements of the `add` program's vectors (tests/hal/add.mlir).
const N: usize = 100_000;
/// Independent dispatches per stage.
const PER_STAGE: usize = 8;

struct Program {
    cb: CommandBuffer,
    a: Vec<f32>,
    b: Vec<f32>,
    firsts: Vec<Buffer>,
    seconds: Vec<Buffer>,
    workgroups_per_run: u64,
}

fn buffer(dev: &Arc<dyn Device>, values: Option<&[f32]>) -> Buffer {
    let params = BufferParams::new(MemoryType::DEVICE_LOCAL, BufferUsage::DEFAULT);
    let b = dev.allocator().allocate(&params, (N * 4) as u64).unwrap();
    if let Some(v) = values {
        b.write(0, &common::f32_bytes(v)).unwrap();
    }
    b
}

fn direct(b: &Buffer) -> BufferRef {
    BufferRef::Direct {
        buffer: b.clone(),
        offset: 0,
        length: (N * 4) as u64,
    }
}

/// Stage 1: first[i] = a + b (PER_STAGE independent dispatches); barrier;
/// stage 2: second[i] = first[i] + b.
fn program(dev: &Arc<dyn Device>) -> Program {
    let exe = common::executable("add");
    let loaded = dev.create_executable(&exe.format, &exe.data, &[]).unwrap();
    let a: Vec<f32> = (0..N).map(|i| i as f32 * 0.5).collect();
    let b: Vec<f32> = (0..N).map(|i| (i % 13) as f32 - 6.0).collect();
    let (ba, bb) = (buffer(dev, Some(&a)), buffer(dev, Some(&b)));
    let firsts: Vec<Buffer> = (0..PER_STAGE).map(|_| buffer(dev, None)).collect();
    let seconds: Vec<Buffer> = (0..PER_STAGE).map(|_| buffer(dev, None)).collect();
    let cb = CommandBuffer::new(0, 3, u64::MAX, 0);
    let dispatch = |x: &Buffer, y: &Buffer, out: &Buffer| {
        cb.dispatch(
            ExecutableRef(loaded.clone()),
            0,
            exe.workgroups,
            None,
            vec![],
            vec![direct(x), direct(y), direct(out)],
        )
        .unwrap();
    };
    for f in &firsts {
        dispatch(&ba, &bb, f);
    }
    cb.execution_barrier().unwrap();
    for (f, s) in firsts.iter().zip(&seconds) {
        dispatch(f, &bb, s);
    }
    cb.finalize().unwrap();
    let per_dispatch: u64 = exe.workgroups.iter().map(|&c| c as u64).product();
    assert!(per_dispatch > 1, "add must have several workgroups");
    Program {
        cb,
        a,
        b,
        firsts,
        seconds,
        workgroups_per_run: per_dispatch * 2 * PER_STAGE as u64,
    }
}

/// Executes the program once (the calling thread waits) and checks results.
fn run(dev: &Arc<dyn Device>, p: &Program) {
    for s in &p.seconds {
        s.fill(0, (N * 4) as u64, &[0]).unwrap();
    }
    let done = Fence::create_at(Semaphore::new(0), 1);
    queue::execute(dev, &Fence::new(), &done, Some(&p.cb), vec![]).unwrap();
    assert!(done
        .wait(Timeout::from_duration(Duration::from_secs(20)))
        .unwrap());
    let first: Vec<f32> = p.a.iter().zip(&p.b).map(|(x, y)| x + y).collect();
    let second: Vec<f32> = first.iter().zip(&p.b).map(|(x, y)| x + y).collect();
    for (f, s) in p.firsts.iter().zip(&p.seconds) {
        assert!(common::bytes_f32(&f.to_vec().unwrap()) == first, "stage 1");
        assert!(
            common::bytes_f32(&s.to_vec().unwrap()) == second,
            "stage 2 ran before stage 1 finished"
        );
    }
}

#[test]
fn a_multi_workgroup_dispatch_reaches_the_workers() {
    // Lending on whatever the CPU count (by default it is on only with
    // fewer workers than CPUs): the caller leads, and workers still join.
    // Not the loaded-solo rule, which on a busy host keeps a program of
    // short tiles on the caller (tests/local_task_under_load.rs).
    let options = PoolOptions {
        lend_to_waiters: true,
        solo_when_loaded: false,
        ..PoolOptions::new(2)
    };
    let cpu = CpuDevice::local_task_with(options).unwrap();
    assert!(cpu.lends_to_waiters());
    let dev: Arc<dyn Device> = cpu.clone();
    let p = program(&dev);
    // The waiting caller leads each execution; a worker joins as soon as
    // it is awake, which on a loaded host may take a few executions.
    let mut runs = 0;
    loop {
        run(&dev, &p);
        runs += 1;
        let stats = cpu.scheduler_stats().unwrap();
        assert_eq!(
            stats.workgroups_on_workers + stats.workgroups_on_callers,
            runs * p.workgroups_per_run
        );
        if stats.workgroups_on_workers > 0 {
            println!(
                "after {runs} runs: {} workgroups on workers, {} on the caller",
                stats.workgroups_on_workers, stats.workgroups_on_callers
            );
            break;
        }
        assert!(runs < 200, "no workgroup ran on a worker in {runs} runs");
    }
}

#[test]
fn without_lending_the_caller_runs_no_workgroups() {
    let options = PoolOptions {
        lend_to_waiters: false,
        ..PoolOptions::new(2)
    };
    let cpu = CpuDevice::local_task_with(options).unwrap();
    assert!(!cpu.lends_to_waiters());
    let dev: Arc<dyn Device> = cpu.clone();
    let p = program(&dev);
    for _ in 0..3 {
        run(&dev, &p);
    }
    let stats = cpu.scheduler_stats().unwrap();
    assert_eq!(stats.workgroups_on_callers, 0);
    assert_eq!(stats.workgroups_on_workers, 3 * p.workgroups_per_run);
    assert_eq!(stats.regions, 3);
}

#[test]
fn lending_is_on_by_default_whatever_the_worker_count() {
    // The waiting caller runs its own queued submission instead of waiting
    // for a woken worker to be scheduled (issue 25), with spare CPUs or
    // without.
    let cpus = std::thread::available_parallelism().unwrap().get();
    for workers in [1, 2, cpus, cpus + 1] {
        let cpu = CpuDevice::local_task(workers).unwrap();
        assert!(cpu.lends_to_waiters(), "{workers} workers, {cpus} CPUs");
    }
    // 0 asks for one worker per CPU.
    assert!(CpuDevice::local_task(0).unwrap().lends_to_waiters());
}

#[test]
fn one_worker_means_one_thread_per_command_buffer() {
    // A region never holds more threads than the pool has workers, the
    // leading caller included: with one worker, each execution runs
    // entirely on the caller or entirely on the worker.
    let cpu = CpuDevice::local_task(1).unwrap();
    let dev: Arc<dyn Device> = cpu.clone();
    let p = program(&dev);
    for _ in 0..5 {
        let before = cpu.scheduler_stats().unwrap();
        run(&dev, &p);
        let after = cpu.scheduler_stats().unwrap();
        let workers = after.workgroups_on_workers - before.workgroups_on_workers;
        let callers = after.workgroups_on_callers - before.workgroups_on_callers;
        assert_eq!(workers + callers, p.workgroups_per_run);
        assert!(
            workers == 0 || callers == 0,
            "{workers} on the worker, {callers} on the caller"
        );
    }
}
