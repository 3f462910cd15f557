//! Idle cost of `local-task`: creates a device with N workers (argument,
//! default 16), runs a few queue submissions so every worker has run and
//! gone idle, then holds the device idle for 5 s and prints the CPU time
//! (user + system) the whole process used meanwhile.
//!
//! Usage: cargo run --release -p ferrite-hal-cpu --example idle_cpu -- [N]

use ferrite_hal::device::Device;
use ferrite_hal::fence::Fence;
use ferrite_hal::semaphore::Semaphore;
use std::time::{Duration, Instant};

fn cpu_time() -> Duration {
    // SAFETY: `usage` is a valid out-pointer for getrusage, which fills it.
    let usage = unsafe {
        let mut usage: libc::rusage = std::mem::zeroed();
        libc::getrusage(libc::RUSAGE_SELF, &mut usage);
        usage
    };
    let tv = |t: libc::timeval| Duration::new(t.tv_sec as u64, t.tv_usec as u32 * 1000);
    tv(usage.ru_utime) + tv(usage.ru_stime)
}

fn main() {
    let workers: usize = std::env::args()
        .nth(1)
        .map(|a| a.parse().expect("worker count"))
        .unwrap_or(16);
    let device = ferrite_hal_cpu::CpuDevice::local_task(workers).expect("local-task device");
    // Some work first, so the workers have woken, run and gone idle.
    let semaphore = Semaphore::new(0);
    for i in 1..=100u64 {
        let signal = Fence::create_at(semaphore.clone(), i);
        device
            .submit(Fence::empty(), &signal, Box::new(|| Ok(())))
            .expect("submit");
        signal.wait(ferrite_base::Timeout::INFINITE).expect("wait");
    }
    let hold = Duration::from_secs(5);
    let (cpu0, t0) = (cpu_time(), Instant::now());
    std::thread::sleep(hold);
    let (cpu, wall) = (cpu_time() - cpu0, t0.elapsed());
    let stats = device.scheduler_stats().expect("local-task has statistics");
    println!(
        "idle local-task device, {} workers: {:.3} ms CPU in {:.2} s wall (so far: {} worker sleeps, {:.3} ms idle polling)",
        device.worker_count(),
        cpu.as_secs_f64() * 1e3,
        wall.as_secs_f64(),
        stats.sleeps,
        stats.idle_spin.as_secs_f64() * 1e3,
    );
}
