//! The CPU drivers `local-sync` and `local-task` (see
//! [`ferrite_hal::driver::Driver`]); the facade's registry lists them.

use crate::device::CpuDevice;
use crate::pool::{lends_by_default, PoolOptions, DEFAULT_IDLE_SPIN, MAX_WORKERS};
use crate::topology;
use ferrite_base::{bail, status, Result};
use ferrite_hal::device::DeviceRef;
use ferrite_hal::driver::{DeviceInfo, DeviceSpec, Driver, DriverOptions, TaskOptions};
use std::time::Duration;

/// The one device of a CPU driver.
fn default_device() -> Vec<DeviceInfo> {
    vec![DeviceInfo {
        device_id: 0,
        path: String::new(),
        name: "default".into(),
    }]
}

/// `local-sync`: work runs inline on the calling thread.
pub struct LocalSyncDriver;

impl Driver for LocalSyncDriver {
    fn name(&self) -> &'static str {
        "local-sync"
    }

    fn description(&self) -> &'static str {
        "Local execution using a lightweight inline synchronous queue"
    }

    fn enumerate(&self, _options: &DriverOptions) -> Result<Vec<DeviceInfo>> {
        Ok(default_device())
    }

    fn create(&self, spec: &DeviceSpec, _options: &DriverOptions) -> Result<DeviceRef> {
        spec.require_default_path()?;
        spec.check_params(&[])?;
        Ok(DeviceRef(CpuDevice::local_sync()))
    }
}

/// `local-task`: work runs on a worker pool (see [`crate::pool`]).
///
/// URI parameters: `workers=N` overrides `--task_topology_group_count`;
/// `lend_to_waiters=true|false|auto` lets blocked waiters run the device's
/// queued work, or not; `auto` (the default) is
/// [`crate::pool::lends_by_default`] (on).
///
/// Upstream's task flags, as this driver treats them:
/// - `--task_topology_group_count=N` (N > 0): N unpinned workers (clamped
///   to [`MAX_WORKERS`], as upstream clamps to its group limit).
/// - `--task_topology_cpu_ids=a,b,c`: one worker pinned to each listed
///   logical CPU; takes precedence over the group count, as upstream.
///   Repeating the flag (one executor per list upstream) is rejected.
/// - otherwise (`--task_topology_mode=physical_cores`, the only mode
///   upstream has) one worker per physical core the process may use, at
///   most `--task_topology_max_group_count`, each pinned to its core (a
///   logical CPU and its SMT siblings), as upstream (see [`crate::topology`]; a worker the
///   system refuses to pin runs unpinned). `FERRITE_LOCAL_TASK_PIN=0`
///   gives one unpinned worker per available CPU instead.
/// - `--task_topology_nodes`: `current` (default); `all`, `numa` or a node
///   id list are accepted when they name exactly the one node the host
///   has, rejected otherwise (several executors per device are not
///   supported).
/// - `--task_topology_performance_level`, `--task_topology_distribution`,
///   `--task_topology_favor`: only their defaults (`any`, `scatter`, none)
///   are accepted; other values select or order cores, which this driver
///   does not do, and are rejected rather than ignored.
/// - `--task_worker_spin_us=N`: N > 0 sets how long an idle worker polls
///   before sleeping; 0 (default) keeps [`DEFAULT_IDLE_SPIN`].
/// - `--task_worker_stack_size`: the workers' stack size (at least 64 KiB;
///   upstream's default leaves it to the platform).
/// - `--task_abort_on_failure`: a failure of queue work aborts the
///   process (see [`CpuDevice::set_abort_on_failure`]).
/// - `--task_worker_local_memory` (non-zero), `--task_topology_snapshot`:
///   rejected (not supported).
/// - `--dump_task_topologies` is the tools' concern, not the driver's.
pub struct LocalTaskDriver;

/// Smallest worker stack the pool runs with (smaller `--task_worker_stack_size`
/// values are raised to it).
const MIN_STACK: u64 = 64 * 1024;

impl LocalTaskDriver {
    /// The worker count `options` (and a `workers=` URI parameter) ask
    /// for: explicit, else one per core capped by the max group count.
    pub fn worker_count(spec: &DeviceSpec, options: &TaskOptions) -> Result<usize> {
        let mut explicit = options.topology_group_count as usize;
        for (k, v) in &spec.params {
            if k == "workers" {
                explicit = v.parse().map_err(|_| {
                    status!(
                        InvalidArgument,
                        "device '{}': workers must be a non-negative integer (got '{v}')",
                        spec.uri
                    )
                })?;
            }
        }
        if explicit > 0 {
            return Ok(explicit.min(MAX_WORKERS));
        }
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
        let cap = options.topology_max_group_count.max(1) as usize;
        Ok(cores.min(cap))
    }

    /// The pool `spec` and `options` describe, or an error naming the flag
    /// or parameter this driver cannot honour.
    pub fn pool_options(spec: &DeviceSpec, options: &TaskOptions) -> Result<PoolOptions> {
        let defaults = TaskOptions::default();
        let reject = |flag: &str, value: &str, why: &str| -> Result<()> {
            bail!(
                InvalidArgument,
                "--{flag}={value} is not supported by Ferrite's local-task: {why}"
            )
        };
        if options.topology_performance_level != defaults.topology_performance_level {
            reject(
                "task_topology_performance_level",
                &options.topology_performance_level,
                "it does not select cores by performance level (only 'any')",
            )?;
        }
        if options.topology_distribution != defaults.topology_distribution {
            reject(
                "task_topology_distribution",
                &options.topology_distribution,
                "it does not place workers by cache domain (only 'scatter'); pin them with --task_topology_cpu_ids",
            )?;
        }
        if options.topology_favor != defaults.topology_favor {
            reject(
                "task_topology_favor",
                &options.topology_favor,
                "it does not select or place cores by preset; pin workers with --task_topology_cpu_ids",
            )?;
        }
        if !options.topology_snapshot.is_empty() {
            reject(
                "task_topology_snapshot",
                &options.topology_snapshot,
                "topology snapshots are an upstream testing aid",
            )?;
        }
        if options.worker_local_memory != 0 {
            reject(
                "task_worker_local_memory",
                &options.worker_local_memory.to_string(),
                "each dispatch gets the local memory its executable declares",
            )?;
        }
        check_nodes(&options.topology_nodes)?;
        if options.topology_cpu_ids.len() > 1 {
            bail!(
                InvalidArgument,
                "--task_topology_cpu_ids given {} times: upstream makes one executor per list; Ferrite's local-task device has one pool, so give one list",
                options.topology_cpu_ids.len()
            );
        }
        // None: `auto`, decided once the worker count is known.
        let mut lend_to_waiters = None;
        for (k, v) in &spec.params {
            if k == "lend_to_waiters" {
                lend_to_waiters = match v.as_str() {
                    "true" | "1" => Some(true),
                    "false" | "0" => Some(false),
                    "auto" => None,
                    _ => bail!(
                        InvalidArgument,
                        "device '{}': lend_to_waiters must be true, false or auto (got '{v}')",
                        spec.uri
                    ),
                };
            }
        }
        let (workers, cpu_ids) = match options.topology_cpu_ids.first() {
            Some(ids) => {
                let cpus = online_cpu_count();
                if let Some(bad) = ids.iter().find(|&&id| id as usize >= cpus) {
                    bail!(
                        InvalidArgument,
                        "--task_topology_cpu_ids: CPU {bad} does not exist (this host has CPUs 0..{})",
                        cpus.saturating_sub(1)
                    );
                }
                if ids.len() > MAX_WORKERS {
                    bail!(
                        ResourceExhausted,
                        "--task_topology_cpu_ids lists {} CPUs, more than the {MAX_WORKERS} workers a pool can have",
                        ids.len()
                    );
                }
                (ids.len(), ids.iter().map(|&id| id as usize).collect())
            }
            None => default_placement(spec, options)?,
        };
        let pin_best_effort = options.topology_cpu_ids.is_empty();
        // Upstream's default (128 KiB) and 0 leave the size to the
        // platform; other values ask for that size (at least MIN_STACK).
        let size = options.worker_stack_size;
        let stack_size =
            (size != 0 && size != defaults.worker_stack_size).then(|| size.max(MIN_STACK) as usize);
        let idle_spin = if options.worker_spin_us > 0 {
            Duration::from_micros(options.worker_spin_us)
        } else {
            DEFAULT_IDLE_SPIN
        };
        Ok(PoolOptions {
            workers,
            stack_size,
            lend_to_waiters: lend_to_waiters.unwrap_or_else(|| lends_by_default(workers)),
            idle_spin,
            cpu_ids,
            pin_best_effort,
            solo_when_loaded: crate::pool::solo_by_default(),
        })
    }
}

/// Workers and their CPUs without `--task_topology_cpu_ids`: an explicit
/// count (flag or `workers=`) runs unpinned, as upstream's group count;
/// otherwise one pinned worker per physical core ([`crate::topology`]),
/// unless `FERRITE_LOCAL_TASK_PIN=0` or the host does not say which CPUs
/// the process may use (then one unpinned worker per available CPU).
fn default_placement(spec: &DeviceSpec, options: &TaskOptions) -> Result<(usize, Vec<usize>)> {
    let workers = LocalTaskDriver::worker_count(spec, options)?;
    let explicit =
        options.topology_group_count > 0 || spec.params.iter().any(|(k, _)| k == "workers");
    if explicit || topology::pinning_disabled(std::env::var_os(topology::PIN_VAR).as_deref()) {
        return Ok((workers, Vec::new()));
    }
    let cap = options.topology_max_group_count.max(1) as usize;
    let cpus = topology::default_worker_cpus(cap.min(MAX_WORKERS));
    if cpus.is_empty() {
        return Ok((workers, Vec::new()));
    }
    Ok((cpus.len(), cpus))
}

/// Logical CPUs the system has (ids are below it).
fn online_cpu_count() -> usize {
    #[cfg(target_os = "linux")]
    {
        // SAFETY: sysconf has no memory effects.
        let n = unsafe { libc::sysconf(libc::_SC_NPROCESSORS_CONF) };
        if n > 0 {
            return n as usize;
        }
    }
    std::thread::available_parallelism().map_or(1, |n| n.get())
}

/// NUMA nodes of the host (1 when the system does not say).
fn numa_node_count() -> usize {
    let Ok(entries) = std::fs::read_dir("/sys/devices/system/node") else {
        return 1;
    };
    let n = entries
        .filter_map(|e| e.ok())
        .filter(|e| {
            e.file_name()
                .to_str()
                .and_then(|n| n.strip_prefix("node"))
                .is_some_and(|id| !id.is_empty() && id.bytes().all(|b| b.is_ascii_digit()))
        })
        .count();
    n.max(1)
}

/// Accepts `--task_topology_nodes` values that name the host's one node.
fn check_nodes(nodes: &str) -> Result<()> {
    if nodes == "current" {
        return Ok(());
    }
    let count = numa_node_count();
    let one_node = match nodes {
        "all" | "numa" => count == 1,
        list => count == 1 && list.split(',').all(|n| n.trim() == "0"),
    };
    if one_node {
        return Ok(());
    }
    bail!(
        InvalidArgument,
        "--task_topology_nodes={nodes} is not supported by Ferrite's local-task on this host ({count} NUMA node{}): upstream makes one executor per node; use 'current'",
        if count == 1 { "" } else { "s" }
    )
}

impl Driver for LocalTaskDriver {
    fn name(&self) -> &'static str {
        "local-task"
    }

    fn description(&self) -> &'static str {
        "Local execution using the IREE multithreading task system"
    }

    fn enumerate(&self, _options: &DriverOptions) -> Result<Vec<DeviceInfo>> {
        Ok(default_device())
    }

    fn create(&self, spec: &DeviceSpec, options: &DriverOptions) -> Result<DeviceRef> {
        spec.require_default_path()?;
        spec.check_params(&["workers", "lend_to_waiters"])?;
        let pool = LocalTaskDriver::pool_options(spec, &options.task)?;
        let device = CpuDevice::local_task_with(pool)?;
        device.set_abort_on_failure(options.task.abort_on_failure);
        Ok(DeviceRef(device))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn options(flags: &[(&str, &str)]) -> TaskOptions {
        let mut o = TaskOptions::default();
        for (k, v) in flags {
            assert!(o.set(k, v).unwrap(), "{k}");
        }
        o
    }

    fn pool(uri: &str, flags: &[(&str, &str)]) -> Result<PoolOptions> {
        LocalTaskDriver::pool_options(&DeviceSpec::parse(uri).unwrap(), &options(flags))
    }

    #[test]
    fn group_count_and_its_cap() {
        assert_eq!(
            pool("local-task", &[("task_topology_group_count", "3")])
                .unwrap()
                .workers,
            3
        );
        let huge = pool("local-task", &[("task_topology_group_count", "100000")]).unwrap();
        assert_eq!(huge.workers, MAX_WORKERS);
        assert_eq!(pool("local-task://?workers=5", &[]).unwrap().workers, 5);
        let auto = pool("local-task", &[("task_topology_max_group_count", "1")]).unwrap();
        assert_eq!(auto.workers, 1);
    }

    /// By default one worker per physical core, each pinned (as upstream's
    /// `physical_cores` mode); an explicit count runs unpinned.
    #[test]
    fn default_workers_are_pinned_one_per_core() {
        let d = pool("local-task", &[]).unwrap();
        let disabled = topology::pinning_disabled(std::env::var_os(topology::PIN_VAR).as_deref());
        match topology::allowed_cpus() {
            Some(allowed) if !disabled => {
                assert_eq!(d.cpu_ids.len(), d.workers);
                assert_eq!(d.cpu_ids, topology::default_worker_cpus(64));
                assert!(d.cpu_ids.iter().all(|c| allowed.contains(c)));
                assert!(d.pin_best_effort);
            }
            _ => assert!(d.cpu_ids.is_empty()),
        }
        let capped = pool("local-task", &[("task_topology_max_group_count", "1")]).unwrap();
        assert_eq!(capped.workers, 1);
        for explicit in [
            pool("local-task", &[("task_topology_group_count", "3")]).unwrap(),
            pool("local-task://?workers=3", &[]).unwrap(),
        ] {
            assert_eq!((explicit.workers, explicit.cpu_ids.len()), (3, 0));
        }
        let listed = pool("local-task", &[("task_topology_cpu_ids", "0")]).unwrap();
        assert!(!listed.pin_best_effort);
    }

    #[test]
    fn cpu_ids_pin_one_worker_each() {
        let p = pool(
            "local-task",
            &[
                ("task_topology_cpu_ids", "0"),
                ("task_topology_group_count", "7"),
            ],
        )
        .unwrap();
        assert_eq!((p.workers, p.cpu_ids), (1, vec![0]));
        let e = pool(
            "local-task",
            &[
                ("task_topology_cpu_ids", "0"),
                ("task_topology_cpu_ids", "0"),
            ],
        )
        .unwrap_err();
        assert!(e.to_string().contains("given 2 times"), "{e}");
        let e = pool("local-task", &[("task_topology_cpu_ids", "0,100000")]).unwrap_err();
        assert!(e.to_string().contains("CPU 100000 does not exist"), "{e}");
    }

    #[test]
    fn placement_flags_are_rejected_by_name() {
        for (flag, value) in [
            ("task_topology_performance_level", "high"),
            ("task_topology_distribution", "compact"),
            ("task_topology_favor", "latency"),
            ("task_worker_local_memory", "65536"),
        ] {
            let e = pool("local-task", &[(flag, value)]).unwrap_err();
            assert!(e.to_string().contains(&format!("--{flag}=")), "{e}");
        }
        // Defaults given explicitly are fine.
        pool(
            "local-task",
            &[
                ("task_topology_performance_level", "any"),
                ("task_topology_nodes", "current"),
            ],
        )
        .unwrap();
    }

    #[test]
    fn spin_stack_and_lending() {
        let p = pool(
            "local-task://?lend_to_waiters=false",
            &[
                ("task_worker_spin_us", "7"),
                ("task_worker_stack_size", "1048576"),
            ],
        )
        .unwrap();
        assert!(!p.lend_to_waiters);
        assert_eq!(p.idle_spin, Duration::from_micros(7));
        assert_eq!(p.stack_size, Some(1 << 20));
        let d = pool("local-task", &[]).unwrap();
        assert_eq!((d.idle_spin, d.stack_size), (DEFAULT_IDLE_SPIN, None));
        let e = pool("local-task://?lend_to_waiters=maybe", &[]).unwrap_err();
        assert!(
            e.to_string().contains("true, false or auto (got 'maybe')"),
            "{e}"
        );
        let forced = pool("local-task://?lend_to_waiters=true&workers=64", &[]).unwrap();
        assert!(forced.lend_to_waiters);
    }

    #[test]
    fn lending_by_default_whatever_the_worker_count() {
        let cpus = std::thread::available_parallelism().unwrap().get();
        // The waiting caller runs its own submissions (issue 25): on by
        // default with fewer, as many or more workers than CPUs.
        for uri in [
            "local-task".to_string(),
            format!("local-task://?workers={cpus}"),
            format!("local-task://?workers={}&lend_to_waiters=auto", cpus + 1),
            "local-task://?workers=1".to_string(),
        ] {
            let p = pool(&uri, &[]).unwrap();
            assert!(p.lend_to_waiters, "{uri}: {cpus} CPUs");
        }
        let p = pool("local-task://?workers=1&lend_to_waiters=false", &[]).unwrap();
        assert!(!p.lend_to_waiters);
    }
}
