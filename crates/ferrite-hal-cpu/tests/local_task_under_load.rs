//! `local-task` on a busy machine (issue 25): with every CPU kept busy by
//! other processes, a call of a tiny program must not wait for the OS to
//! give a parked worker (or the parked caller) a time slice, nor for any
//! timeout: N calls under load finish within a generous multiple of the
//! same calls run inline (local-sync) on the idle machine, and at least
//! well under one scheduler tick a call.
//!
//! The test starts its own load: one busy process per CPU, each limited
//! to 60 s by `timeout(1)` and killed (and reaped) when the test ends,
//! passing or failing.

mod common;

use ferrite_base::Timeout;
use ferrite_hal::buffer::Buffer;
use ferrite_hal::command_buffer::CommandBuffer;
use ferrite_hal::device::{queue, Device};
use ferrite_hal::fence::Fence;
use ferrite_hal::semaphore::Semaphore;
use ferrite_hal_cpu::CpuDevice;
use std::process::{Child, Command};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// One busy process per CPU, killed and reaped on drop.
struct Load(Vec<Child>);

impl Load {
    fn start() -> Load {
        // One per CPU online, the count the pool's load rule compares
        // `/proc/loadavg` with, even where this process may use fewer
        // (an affinity mask).
        // SAFETY: sysconf reads a system constant; no memory is passed.
        let online = unsafe { libc::sysconf(libc::_SC_NPROCESSORS_ONLN) };
        let usable = std::thread::available_parallelism().map_or(1, |n| n.get());
        let cpus = usize::try_from(online).unwrap_or(0).max(usable);
        let mut load = Load(Vec::new());
        for _ in 0..cpus {
            // `timeout` bounds the load even if this process dies without
            // unwinding (SIGKILL).
            let child = Command::new("timeout")
                .args(["60", "sh", "-c", "while :; do :; done"])
                .spawn()
                .expect("starting a busy process (timeout, sh)");
            load.0.push(child);
        }
        // Let the busy loops reach the run queues.
        std::thread::sleep(Duration::from_millis(200));
        load
    }
}

impl Drop for Load {
    fn drop(&mut self) {
        for c in &mut self.0 {
            // SIGTERM to `timeout` is passed on to its child.
            // SAFETY: kill(2) with a pid this process spawned and has not
            // reaped yet (reaped below), so it names our own child.
            unsafe {
                libc::kill(c.id() as libc::pid_t, libc::SIGTERM);
            }
        }
        for c in &mut self.0 {
            let _ = c.wait();
        }
    }
}

/// A command buffer of one single-workgroup dispatch (4xf32 add).
struct Tiny {
    cb: CommandBuffer,
    out: Buffer,
}

fn tiny(dev: &Arc<dyn Device>) -> Tiny {
    let (cb, out, workgroups) = common::add_program(dev, "add4", 4);
    assert_eq!(workgroups, [1, 1, 1], "add4 is one workgroup");
    Tiny { cb, out }
}

/// `calls` executions, each waited for without a deadline by the calling
/// thread (as a program's synchronous call waits); their total wall time.
fn calls(dev: &Arc<dyn Device>, t: &Tiny, calls: u32) -> Duration {
    let start = Instant::now();
    for _ in 0..calls {
        let done = Fence::create_at(Semaphore::new(0), 1);
        queue::execute(dev, &Fence::new(), &done, Some(&t.cb), vec![]).unwrap();
        assert!(done.wait(Timeout::INFINITE).unwrap());
    }
    start.elapsed()
}

#[test]
fn tiny_calls_under_cpu_load_wait_for_no_time_slice() {
    // The calls run on a thread of their own, watched: waits have no
    // deadline (as a program's), so a lost wake-up would hang them.
    let (tx, rx) = std::sync::mpsc::channel();
    let load: Arc<parking_lot::Mutex<Option<Load>>> = Default::default();
    let load2 = load.clone();
    std::thread::spawn(move || {
        // The reference: the same calls run inline (local-sync), idle.
        let sync: Arc<dyn Device> = CpuDevice::local_sync();
        let t = tiny(&sync);
        calls(&sync, &t, 50);
        let reference = calls(&sync, &t, N);
        // The default device as `--device=local-task` makes it: one
        // worker per physical core, pinned, default policy.
        let spec = ferrite_hal::driver::DeviceSpec::parse("local-task").unwrap();
        let options = ferrite_hal::driver::TaskOptions::default();
        let pool = ferrite_hal_cpu::LocalTaskDriver::pool_options(&spec, &options).unwrap();
        let cpu = CpuDevice::local_task_with(pool).unwrap();
        let dev: Arc<dyn Device> = cpu.clone();
        let t = tiny(&dev);
        calls(&dev, &t, 50);
        let idle = calls(&dev, &t, N);
        assert_eq!(
            common::bytes_f32(&t.out.to_vec().unwrap()),
            [10.0, 11.0, 12.0, 13.0]
        );
        *load2.lock() = Some(Load::start());
        let loaded = calls(&dev, &t, N);
        load2.lock().take();
        let _ = tx.send((reference, idle, loaded, cpu.scheduler_stats().unwrap()));
    });
    let outcome = rx.recv_timeout(Duration::from_secs(60));
    // Stops the load also when the calls hung or failed.
    load.lock().take();
    let (reference, idle, loaded, stats) = outcome.expect("the calls hung or failed");
    let bound = (reference * RATIO).max(FLOOR * N);
    println!(
        "{N} calls: local-sync idle {reference:?}; local-task idle {idle:?} ({:?}/call), loaded {loaded:?} ({:?}/call); bound {bound:?}; {stats:?}",
        idle / N,
        loaded / N
    );
    assert!(
        loaded <= bound,
        "{N} tiny calls took {loaded:?} under load against {idle:?} idle (bound {bound:?})"
    );
}

/// Elements of the multi-workgroup `add` program (tests/hal/add.mlir).
const ADD_N: usize = 100_000;

/// The loaded-solo rule (issue 25): a program of several workgroups whose
/// tiles are short (a small model's) runs on the calling thread, one
/// command after another, while other processes keep every CPU busy: on
/// 16 cores under 16 busy processes the small MLP took 118 us a call in
/// the pool's regions and 40 us on one thread. Before the rule no
/// submission ran there (`solo_submissions` stays 0); with it most of the
/// loaded calls do, with right results.
#[test]
fn a_program_of_short_tiles_runs_on_its_caller_while_every_cpu_is_busy() {
    let (tx, rx) = std::sync::mpsc::channel();
    let load: Arc<parking_lot::Mutex<Option<Load>>> = Default::default();
    let load2 = load.clone();
    std::thread::spawn(move || {
        let spec = ferrite_hal::driver::DeviceSpec::parse("local-task").unwrap();
        let options = ferrite_hal::driver::TaskOptions::default();
        let mut pool = ferrite_hal_cpu::LocalTaskDriver::pool_options(&spec, &options).unwrap();
        // The default, whatever the environment says.
        pool.solo_when_loaded = true;
        let cpu = CpuDevice::local_task_with(pool).unwrap();
        let dev: Arc<dyn Device> = cpu.clone();
        let (cb, out, grid) = common::add_program(&dev, "add", ADD_N);
        let workgroups: u64 = grid.iter().map(|&n| u64::from(n)).product();
        assert!(workgroups > 1, "the add program must not be small work");
        let t = Tiny { cb, out };
        let want: Vec<f32> = (0..ADD_N).map(|i| i as f32 + 10.0).collect();
        // Regions time the tiles (the rule needs to know they are short).
        calls(&dev, &t, 20);
        *load2.lock() = Some(Load::start());
        let before = cpu.scheduler_stats().unwrap();
        let mut right = true;
        for _ in 0..CALLS {
            t.out
                .write(0, &common::f32_bytes(&vec![0.0; ADD_N]))
                .unwrap();
            calls(&dev, &t, 1);
            right &= common::bytes_f32(&t.out.to_vec().unwrap()) == want;
        }
        let after = cpu.scheduler_stats().unwrap();
        load2.lock().take();
        let _ = tx.send((right, before, after));
    });
    let outcome = rx.recv_timeout(Duration::from_secs(60));
    load.lock().take();
    let (right, before, after) = outcome.expect("the calls hung or failed");
    let solo = after.solo_submissions - before.solo_submissions;
    println!("{CALLS} calls under load: {solo} solo; {after:?}");
    assert!(right, "a call under load gave a wrong sum");
    assert!(
        solo >= CALLS / 2,
        "{solo} of {CALLS} calls ran solo while every CPU was busy (the rule reads /proc/loadavg)"
    );
}

/// Calls of the loaded-solo test.
const CALLS: u64 = 200;

/// Calls timed idle and under load.
const N: u32 = 300;
/// The bound on the loaded time, in multiples of the same calls' time on
/// an idle local-sync device (the calls' own cost, no scheduling)...
const RATIO: u32 = 20;
/// ...and at least this much per call: a quarter of the time a thread
/// woken on a busy CPU waited for the scheduler in every call before the
/// fix (about 1 ms: the scheduler tick), so a call that waits for a
/// sleeping thread to get a time slice, or for any timeout, blows
/// through it.
const FLOOR: Duration = Duration::from_micros(250);
