//! A pool's statistics read off its state ([`PoolStats`] for
//! `WorkerPool::stats`) and printed (`FERRITE_LOCAL_TASK_STATS`: when the
//! pool drops, or at process exit): apart from the counters themselves
//! (`stats`), which the state holds.

use super::state::PoolState;
use super::stats::{cpu_time_of, PoolStats};
use parking_lot::Mutex;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Weak};
use std::time::Duration;

impl PoolState {
    /// Counters so far; only while the workers live (their CPU clocks).
    pub(super) fn stats(&self) -> PoolStats {
        let c = &self.stats;
        PoolStats {
            workgroups_on_workers: c.on_workers.load(Ordering::Relaxed),
            workgroups_on_callers: c.on_callers.load(Ordering::Relaxed),
            regions: c.regions.load(Ordering::Relaxed),
            sleeps: c.sleeps.load(Ordering::Relaxed),
            joins: c.joins.load(Ordering::Relaxed),
            leader_sleeps: c.leader_sleeps.load(Ordering::Relaxed),
            idle_spin: Duration::from_nanos(c.idle_spin_ns.load(Ordering::Relaxed)),
            preempted_spins: c.preempted_spins.load(Ordering::Relaxed),
            preempted_threads: c.preempted_threads.load(Ordering::Relaxed),
            long_stage_waits: c.long_stage_waits.load(Ordering::Relaxed),
            short_tile_caps: c.short_tile_caps.load(Ordering::Relaxed),
            contended_widened: c.contended_widened.load(Ordering::Relaxed),
            worker_cpu_time: self.cpu_clocks.lock().iter().map(cpu_time_of).sum(),
            inline_submissions: c.inline_submissions.load(Ordering::Relaxed),
            solo_submissions: c.solo_submissions.load(Ordering::Relaxed),
        }
    }

    /// The statistics line `FERRITE_LOCAL_TASK_STATS` prints.
    pub(super) fn report(&self) {
        let s = self.stats();
        let total = (s.workgroups_on_workers + s.workgroups_on_callers).max(1) as f64;
        eprintln!(
            "local-task stats: {} workers; workgroups on workers {} ({:.1}%), on other threads {} ({:.1}%); {} command buffers; {} submissions run inline ({} solo under load); {} joins; {} leader sleeps; {} worker sleeps; {} sleeps after a long stage; {} regions capped for short tiles (recent tiles {:.1} us on average); {} contended regions with every worker beside the caller; {} spins cut short by preemption; {} threads found preempted; {:.3} ms idle polling; {:.3} ms worker CPU",
            self.workers,
            s.workgroups_on_workers,
            100.0 * s.workgroups_on_workers as f64 / total,
            s.workgroups_on_callers,
            100.0 * s.workgroups_on_callers as f64 / total,
            s.regions,
            s.inline_submissions,
            s.solo_submissions,
            s.joins,
            s.leader_sleeps,
            s.sleeps,
            s.long_stage_waits,
            s.short_tile_caps,
            self.recent_tile_ns.load(Ordering::Relaxed) as f64 / 1e3,
            s.contended_widened,
            s.preempted_spins,
            s.preempted_threads,
            s.idle_spin.as_secs_f64() * 1e3,
            s.worker_cpu_time.as_secs_f64() * 1e3,
        );
        // How evenly the workers shared the work: on a machine whose CPUs
        // are all busy, the scheduler gives each CPU's threads their fair
        // share, so a worker that ran (or spun) far more than the others
        // is the one descheduled mid-tile (issue 25).
        let mut per_worker: Vec<Duration> =
            self.cpu_clocks.lock().iter().map(cpu_time_of).collect();
        if !per_worker.is_empty() {
            per_worker.sort();
            let ms = |d: Duration| d.as_secs_f64() * 1e3;
            eprintln!(
                "  worker CPU min / median / max: {:.3} / {:.3} / {:.3} ms",
                ms(per_worker[0]),
                ms(per_worker[per_worker.len() / 2]),
                ms(per_worker[per_worker.len() - 1]),
            );
        }
        if let Some(t) = &self.timing {
            eprintln!("{}", t.lock().describe());
        }
    }
}

/// Pools to report at exit (dropped ones are removed).
pub(super) static REPORT_AT_EXIT: Mutex<Vec<Weak<PoolState>>> = Mutex::new(Vec::new());

/// Prints the statistics of `state` at process exit unless its pool is
/// dropped first.
pub(super) fn report_at_exit(shared: &Arc<PoolState>) {
    static HOOK: std::sync::Once = std::sync::Once::new();
    REPORT_AT_EXIT.lock().push(Arc::downgrade(shared));
    #[cfg(unix)]
    HOOK.call_once(|| {
        extern "C" fn report_all() {
            for pool in REPORT_AT_EXIT.lock().iter().filter_map(Weak::upgrade) {
                pool.report();
            }
        }
        // SAFETY: `report_all` is an `extern "C" fn()` that lives for the
        // whole program; atexit only stores it. It takes only locks no
        // exiting thread holds across a call to `exit`.
        unsafe {
            libc::atexit(report_all);
        }
    });
}
