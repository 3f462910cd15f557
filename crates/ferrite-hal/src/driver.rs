//! Drivers: the factories of devices, as upstream's `iree_hal_driver_t`.
//!
//! A driver has a name (`local-sync`, `local-task`, `cuda`), enumerates the
//! devices it can create, and creates one from a parsed device URI
//! ([`DeviceSpec`]) and the process's driver flags ([`DriverOptions`]).
//! The list of drivers a build offers (the registry) lives in the facade
//! crate `ferrite` (`ferrite::driver`); the tools and the Python package
//! use that list, so a new driver is added there once.

use crate::device::DeviceRef;
use ferrite_base::{bail, status, Result};

/// A device a driver can create, as `--list_devices` shows it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DeviceInfo {
    /// The driver-specific ordinal (0 for the one CPU device).
    pub device_id: u64,
    /// The path that selects this device in a URI (`driver://PATH`):
    /// empty for a driver's default device, else e.g. `0` or `GPU-<uuid>`.
    pub path: String,
    /// A human-readable name (`default`, `NVIDIA H100 80GB HBM3`).
    pub name: String,
}

/// A parsed device URI: `driver`, `driver://`, `driver://PATH`,
/// `driver://PATH?k=v&k2=v2` (upstream's forms), or `driver?k=v`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DeviceSpec {
    /// The whole text as given (trimmed), for messages.
    pub uri: String,
    /// The driver name (`local-task`, `cuda`).
    pub driver: String,
    /// What follows `://` up to `?`: empty (the default device), an ordinal
    /// (`0`) or a driver-specific id (`GPU-<uuid>`).
    pub path: String,
    /// `key=value` parameters in the order given.
    pub params: Vec<(String, String)>,
}

impl DeviceSpec {
    /// Parses a device URI (see the type docs).
    pub fn parse(uri: &str) -> Result<DeviceSpec> {
        let uri = uri.trim();
        let (head, query) = uri.split_once('?').unwrap_or((uri, ""));
        let (driver, path) = head.split_once("://").unwrap_or((head, ""));
        if driver.is_empty() {
            bail!(InvalidArgument, "device URI '{uri}' has no driver name");
        }
        let mut params = Vec::new();
        for pair in query.split('&').filter(|p| !p.is_empty()) {
            let Some((k, v)) = pair.split_once('=') else {
                bail!(
                    InvalidArgument,
                    "device '{uri}': parameter '{pair}' is not of the form key=value"
                );
            };
            params.push((k.to_string(), v.to_string()));
        }
        Ok(DeviceSpec {
            uri: uri.to_string(),
            driver: driver.to_string(),
            path: path.to_string(),
            params,
        })
    }

    /// The device ordinal when the path is a plain number (`cuda://1`).
    pub fn ordinal(&self) -> Option<u64> {
        if self.path.is_empty() || !self.path.bytes().all(|b| b.is_ascii_digit()) {
            return None;
        }
        self.path.parse().ok()
    }

    /// Fails unless every parameter is one of `known` (named in the error).
    pub fn check_params(&self, known: &[&str]) -> Result<()> {
        for (k, _) in &self.params {
            if !known.contains(&k.as_str()) {
                let takes = if known.is_empty() {
                    "takes no parameters".to_string()
                } else {
                    format!("takes: {}", known.join(", "))
                };
                bail!(
                    InvalidArgument,
                    "device '{}': unknown parameter '{k}' ({} {takes})",
                    self.uri,
                    self.driver
                );
            }
        }
        Ok(())
    }

    /// Fails when the URI names a device path (for drivers with only a
    /// default device; upstream's message).
    pub fn require_default_path(&self) -> Result<()> {
        if !self.path.is_empty() {
            bail!(NotFound, "device paths not yet implemented");
        }
        Ok(())
    }
}

/// Driver flags of the process (upstream's `--task_*` flags and the
/// flags of other drivers), given to every driver when it creates a device.
/// Each driver reads the part it knows.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct DriverOptions {
    /// The task-system flags the `local-task` driver reads.
    pub task: TaskOptions,
    /// Other drivers' flags (`cuda_*`, ...) as `(name, value)`, in order;
    /// a driver that owns a name validates and reads it.
    pub other: Vec<(String, String)>,
}

/// Upstream's task-system flags (`iree/task/api.c`, `local_task` driver
/// module), parsed and range-checked; the `local-task` driver decides what
/// each one does.
#[derive(Clone, Debug, PartialEq)]
pub struct TaskOptions {
    /// `--task_topology_group_count`: workers; 0 picks by the mode.
    pub topology_group_count: u32,
    /// `--task_topology_max_group_count`: cap on the automatic count.
    pub topology_max_group_count: u32,
    /// `--task_topology_cpu_ids`: one list of logical CPU ids per use of the
    /// flag (one topology each).
    pub topology_cpu_ids: Vec<Vec<u32>>,
    /// `--task_topology_mode` (`physical_cores`).
    pub topology_mode: String,
    /// `--task_topology_nodes` (`current`, `numa`, `all`, `0,2,...`).
    pub topology_nodes: String,
    /// `--task_topology_snapshot` (a captured topology file; testing only).
    pub topology_snapshot: String,
    /// `--task_topology_performance_level` (`any`, `low`, `high`, ...).
    pub topology_performance_level: String,
    /// `--task_topology_distribution` (`scatter`, `compact`).
    pub topology_distribution: String,
    /// `--task_topology_favor` (``, `latency`, `throughput`, `efficiency`).
    pub topology_favor: String,
    /// `--task_worker_spin_us`.
    pub worker_spin_us: u64,
    /// `--task_worker_stack_size` in bytes.
    pub worker_stack_size: u64,
    /// `--task_worker_local_memory` in bytes (0: the default).
    pub worker_local_memory: u64,
    /// `--task_abort_on_failure`.
    pub abort_on_failure: bool,
    /// `--dump_task_topologies`.
    pub dump_topologies: bool,
}

impl Default for TaskOptions {
    /// Upstream's defaults, as its `--help` prints them.
    fn default() -> Self {
        TaskOptions {
            topology_group_count: 0,
            topology_max_group_count: 64,
            topology_cpu_ids: Vec::new(),
            topology_mode: "physical_cores".into(),
            topology_nodes: "current".into(),
            topology_snapshot: String::new(),
            topology_performance_level: "any".into(),
            topology_distribution: "scatter".into(),
            topology_favor: String::new(),
            worker_spin_us: 0,
            worker_stack_size: 131072,
            worker_local_memory: 0,
            abort_on_failure: false,
            dump_topologies: false,
        }
    }
}

/// The task flags [`TaskOptions::set`] knows, by upstream name.
pub const TASK_FLAGS: &[&str] = &[
    "task_topology_group_count",
    "task_topology_max_group_count",
    "task_topology_cpu_ids",
    "task_topology_mode",
    "task_topology_nodes",
    "task_topology_snapshot",
    "task_topology_performance_level",
    "task_topology_distribution",
    "task_topology_favor",
    "task_worker_spin_us",
    "task_worker_stack_size",
    "task_worker_local_memory",
    "task_abort_on_failure",
    "dump_task_topologies",
];

fn parse_uint<T: std::str::FromStr>(flag: &str, value: &str) -> Result<T> {
    value.trim().parse().map_err(|_| {
        status!(
            InvalidArgument,
            "--{flag}={value}: expected a non-negative integer (at most {})",
            std::any::type_name::<T>()
                .strip_prefix('u')
                .map_or(String::new(), |bits| format!("{bits}-bit"))
        )
    })
}

fn parse_bool(flag: &str, value: &str) -> Result<bool> {
    match value.trim() {
        "" | "true" | "1" => Ok(true),
        "false" | "0" => Ok(false),
        v => bail!(
            InvalidArgument,
            "--{flag}={v}: expected true, false, 1 or 0"
        ),
    }
}

fn parse_choice(flag: &str, value: &str, choices: &[&str]) -> Result<String> {
    let v = value.trim().trim_matches('"');
    if choices.contains(&v) {
        return Ok(v.to_string());
    }
    bail!(
        InvalidArgument,
        "--{flag}={v}: expected one of {}",
        choices
            .iter()
            .map(|c| format!("'{c}'"))
            .collect::<Vec<_>>()
            .join(", ")
    )
}

impl TaskOptions {
    /// Sets flag `name` (upstream's name, no `--`) from its text `value`;
    /// returns false when `name` is not a task flag, and an error naming the
    /// flag when the value does not parse.
    pub fn set(&mut self, name: &str, value: &str) -> Result<bool> {
        match name {
            "task_topology_group_count" => self.topology_group_count = parse_uint(name, value)?,
            "task_topology_max_group_count" => {
                self.topology_max_group_count = parse_uint(name, value)?
            }
            "task_topology_cpu_ids" => {
                let ids = value
                    .split(',')
                    .map(|id| parse_uint::<u32>(name, id))
                    .collect::<Result<Vec<_>>>()
                    .map_err(|_| {
                        status!(
                            InvalidArgument,
                            "--{name}={value}: expected a comma-separated list of logical CPU ids (e.g. 0,1,2)"
                        )
                    })?;
                self.topology_cpu_ids.push(ids);
            }
            "task_topology_mode" => {
                self.topology_mode = parse_choice(name, value, &["physical_cores"])?
            }
            "task_topology_nodes" => {
                let v = value.trim().trim_matches('"');
                let ok = matches!(v, "current" | "numa" | "all")
                    || (!v.is_empty() && v.split(',').all(|n| n.trim().parse::<u32>().is_ok()));
                if !ok {
                    bail!(
                        InvalidArgument,
                        "--{name}={v}: expected 'current', 'numa', 'all' or a comma-separated list of NUMA node ids"
                    );
                }
                self.topology_nodes = v.to_string();
            }
            "task_topology_snapshot" => {
                self.topology_snapshot = value.trim().trim_matches('"').to_string()
            }
            "task_topology_performance_level" => {
                self.topology_performance_level = parse_choice(
                    name,
                    value,
                    &["any", "low", "efficiency", "high", "performance"],
                )?
            }
            "task_topology_distribution" => {
                self.topology_distribution = parse_choice(name, value, &["compact", "scatter"])?
            }
            "task_topology_favor" => {
                self.topology_favor =
                    parse_choice(name, value, &["", "latency", "throughput", "efficiency"])?
            }
            "task_worker_spin_us" => self.worker_spin_us = parse_uint(name, value)?,
            "task_worker_stack_size" => self.worker_stack_size = parse_uint(name, value)?,
            "task_worker_local_memory" => self.worker_local_memory = parse_uint(name, value)?,
            "task_abort_on_failure" => self.abort_on_failure = parse_bool(name, value)?,
            "dump_task_topologies" => self.dump_topologies = parse_bool(name, value)?,
            _ => return Ok(false),
        }
        Ok(true)
    }
}

/// A HAL driver: names itself, lists its devices, creates them.
///
/// Implementations live in the driver crates (`ferrite-hal-cpu`, ...);
/// the facade's registry lists one static instance of each.
pub trait Driver: Send + Sync {
    /// The name used in device URIs (`local-task`).
    fn name(&self) -> &'static str;

    /// One line for `--list_drivers`.
    fn description(&self) -> &'static str;

    /// The devices this driver can create now (none when, say, no GPU is
    /// present: that is not an error).
    fn enumerate(&self, options: &DriverOptions) -> Result<Vec<DeviceInfo>>;

    /// Creates the device `spec` names (`spec.driver` is this driver's
    /// name); unknown paths and parameters are errors naming them.
    fn create(&self, spec: &DeviceSpec, options: &DriverOptions) -> Result<DeviceRef>;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_uris() {
        let s = DeviceSpec::parse("local-sync").unwrap();
        assert_eq!((s.driver.as_str(), s.path.as_str()), ("local-sync", ""));
        assert!(s.params.is_empty());
        let s = DeviceSpec::parse("local-task://").unwrap();
        assert_eq!((s.driver.as_str(), s.path.as_str()), ("local-task", ""));
        let s = DeviceSpec::parse("local-task://?workers=3").unwrap();
        assert_eq!(s.params, vec![("workers".into(), "3".into())]);
        let s = DeviceSpec::parse("local-task?workers=2&x=y").unwrap();
        assert_eq!(s.params.len(), 2);
        let s = DeviceSpec::parse("cuda://0").unwrap();
        assert_eq!((s.driver.as_str(), s.ordinal()), ("cuda", Some(0)));
        let s = DeviceSpec::parse("cuda://GPU-0a1b2c3d-aaaa-bbbb-cccc-0123456789ab").unwrap();
        assert_eq!(s.path, "GPU-0a1b2c3d-aaaa-bbbb-cccc-0123456789ab");
        assert_eq!(s.ordinal(), None);
        assert!(DeviceSpec::parse("").is_err());
        assert!(DeviceSpec::parse("://0").is_err());
        assert!(DeviceSpec::parse("local-task://?workers").is_err());
        let s = DeviceSpec::parse("local-task?threads=2").unwrap();
        let e = s.check_params(&["workers"]).unwrap_err();
        assert!(e.to_string().contains("unknown parameter 'threads'"), "{e}");
        assert!(DeviceSpec::parse("local-task://1")
            .unwrap()
            .require_default_path()
            .is_err());
    }

    #[test]
    fn task_flags_parse_and_say_what_is_wrong() {
        let mut t = TaskOptions::default();
        assert!(t.set("task_topology_group_count", "4").unwrap());
        assert_eq!(t.topology_group_count, 4);
        assert!(t.set("task_topology_cpu_ids", "0,1,2").unwrap());
        assert!(t.set("task_topology_cpu_ids", "3").unwrap());
        assert_eq!(t.topology_cpu_ids, vec![vec![0, 1, 2], vec![3]]);
        assert!(t.set("task_topology_favor", "latency").unwrap());
        assert!(t.set("task_topology_nodes", "0,2").unwrap());
        assert!(t.set("dump_task_topologies", "").unwrap());
        assert!(t.dump_topologies);
        assert!(!t.set("cuda_use_streams", "true").unwrap());
        for (flag, bad) in [
            ("task_topology_group_count", "-1"),
            ("task_topology_group_count", "many"),
            ("task_topology_cpu_ids", "0,x"),
            ("task_topology_distribution", "random"),
            ("task_topology_nodes", "somewhere"),
            ("task_abort_on_failure", "maybe"),
        ] {
            let e = t.set(flag, bad).unwrap_err();
            assert!(e.to_string().contains(flag), "{e}");
        }
    }
}
