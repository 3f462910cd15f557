//! Lending is scoped to the device that signals what a thread waits for
//! (issue 26): a thread blocked on a semaphore runs queued `local-task`
//! work only of the device(s) whose submissions will signal that
//! semaphore. A wait on a semaphore the host (or another device) signals
//! runs none of a device's work; a wait on a device's own semaphore still
//! runs it (issue 25's lending); with two devices, a wait on one lends
//! only to that one, and a wait on both lends to both.
//!
//! Each device has one worker, held busy by a submission that blocks
//! until the test lets it go: queued work then runs on the waiting thread
//! or nowhere, and the pools' counters say which thread ran the tiles
//! (`workgroups_on_callers` are the waiter's).

mod common;

use ferrite_base::Timeout;
use ferrite_hal::buffer::Buffer;
use ferrite_hal::device::{queue, Device};
use ferrite_hal::fence::Fence;
use ferrite_hal::semaphore::Semaphore;
use ferrite_hal_cpu::pool::PoolOptions;
use ferrite_hal_cpu::CpuDevice;
use std::sync::mpsc;
use std::sync::Arc;
use std::time::Duration;

/// Elements of the multi-workgroup `add` program (tests/hal/add.mlir).
const N: usize = 100_000;

/// A one-worker `local-task` device whose pool lends to waiters.
fn device() -> (Arc<CpuDevice>, Arc<dyn Device>) {
    // These tests queue work and watch who runs it: not the loaded-solo
    // rule, which on a busy host may run a submission as it is made.
    let cpu = CpuDevice::local_task_with(PoolOptions {
        solo_when_loaded: false,
        ..PoolOptions::new(1)
    })
    .unwrap();
    assert!(cpu.lends_to_waiters());
    let dev: Arc<dyn Device> = cpu.clone();
    (cpu, dev)
}

/// Holds a device's only worker inside a submission until dropped.
struct Busy(#[allow(dead_code)] mpsc::Sender<()>);

/// Occupies the worker of `dev` (it returns once the worker runs the
/// blocking submission, so no waiter can have taken it).
fn occupy(dev: &Arc<dyn Device>) -> Busy {
    let (started_tx, started_rx) = mpsc::channel();
    let (release_tx, release_rx) = mpsc::channel::<()>();
    let work = Box::new(move || {
        started_tx.send(()).unwrap();
        // Ends when the `Busy` is dropped (its sender goes away).
        let _ = release_rx.recv();
        Ok(())
    });
    let done = Fence::create_at(Semaphore::new(0), 1);
    dev.submit(&Fence::new(), &done, work).unwrap();
    started_rx
        .recv_timeout(Duration::from_secs(20))
        .expect("the worker never started the blocking submission");
    Busy(release_tx)
}

/// A queued `add` of `N` elements on `dev` (many workgroups: it goes to
/// the pool, never inline), its signal fence and its output.
struct Queued {
    done: Fence,
    out: Buffer,
    workgroups: u64,
}

fn queue_add(dev: &Arc<dyn Device>) -> Queued {
    let (cb, out, grid) = common::add_program(dev, "add", N);
    let workgroups = grid.iter().map(|&n| u64::from(n)).product();
    assert!(workgroups > 1, "the add program must not be small work");
    let done = Fence::create_at(Semaphore::new(0), 1);
    queue::execute(dev, &Fence::new(), &done, Some(&cb), vec![]).unwrap();
    assert!(
        !done.query().unwrap(),
        "queued work ran before its worker was free"
    );
    Queued {
        done,
        out,
        workgroups,
    }
}

fn check(q: &Queued) {
    assert!(q.done.wait(Timeout::INFINITE).unwrap());
    let got = common::bytes_f32(&q.out.to_vec().unwrap());
    let want: Vec<f32> = (0..N).map(|i| i as f32 + 10.0).collect();
    assert!(got == want, "wrong results");
}

/// Workgroups `cpu` has run on its workers and on other threads.
fn ran(cpu: &CpuDevice) -> (u64, u64) {
    let s = cpu.scheduler_stats().unwrap();
    (s.workgroups_on_workers, s.workgroups_on_callers)
}

#[test]
fn a_wait_on_a_host_signalled_semaphore_runs_no_device_work() {
    let (cpu, dev) = device();
    let busy = occupy(&dev);
    let queued = queue_add(&dev);
    let host = Semaphore::new(0);
    let signaller = std::thread::spawn({
        let host = host.clone();
        move || {
            std::thread::sleep(Duration::from_millis(30));
            host.signal(1).unwrap();
        }
    });
    // Without a deadline: the kind of wait that lends its thread.
    host.wait(1, Timeout::INFINITE).unwrap();
    signaller.join().unwrap();
    assert_eq!(
        ran(&cpu),
        (0, 0),
        "a wait on a host-signalled semaphore ran the device's queued work"
    );
    assert!(!queued.done.query().unwrap());
    drop(busy);
    check(&queued);
}

#[test]
fn a_wait_on_one_device_lends_only_to_it() {
    // Device A first: a process-wide registry of lenders would offer A's
    // work to the waiter before B's.
    let (cpu_a, dev_a) = device();
    let (cpu_b, dev_b) = device();
    let busy_a = occupy(&dev_a);
    let _busy_b = occupy(&dev_b);
    let on_a = queue_add(&dev_a);
    let on_b = queue_add(&dev_b);
    // B's only worker is busy: B's work runs on this thread or never.
    assert!(on_b.done.wait(Timeout::INFINITE).unwrap());
    assert_eq!(
        ran(&cpu_b),
        (0, on_b.workgroups),
        "the waiter did not run the work of the device it waited on"
    );
    assert_eq!(
        ran(&cpu_a),
        (0, 0),
        "a wait on device B's semaphore ran device A's queued work"
    );
    check(&on_b);
    drop(busy_a);
    check(&on_a);
}

#[test]
fn a_wait_on_two_devices_lends_to_both() {
    let (cpu_a, dev_a) = device();
    let (cpu_b, dev_b) = device();
    let _busy_a = occupy(&dev_a);
    let _busy_b = occupy(&dev_b);
    let on_a = queue_add(&dev_a);
    let on_b = queue_add(&dev_b);
    // One fence over both signals: a multi-semaphore wait.
    let both = Fence::join(&[&on_a.done, &on_b.done]);
    assert!(both.wait(Timeout::INFINITE).unwrap());
    assert_eq!(ran(&cpu_a), (0, on_a.workgroups));
    assert_eq!(ran(&cpu_b), (0, on_b.workgroups));
    check(&on_a);
    check(&on_b);
}

#[test]
fn a_device_that_does_not_lend_is_not_lent_to() {
    let cpu = CpuDevice::local_task_with(PoolOptions {
        lend_to_waiters: false,
        solo_when_loaded: false,
        ..PoolOptions::new(1)
    })
    .unwrap();
    let dev: Arc<dyn Device> = cpu.clone();
    let busy = occupy(&dev);
    let queued = queue_add(&dev);
    let releaser = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(30));
        drop(busy);
    });
    // A wait without a deadline (the kind that lends) on the device's own
    // semaphore: the work still runs on the worker, once it is free.
    assert!(queued.done.wait(Timeout::INFINITE).unwrap());
    releaser.join().unwrap();
    check(&queued);
    assert_eq!(ran(&cpu), (queued.workgroups, 0));
}
