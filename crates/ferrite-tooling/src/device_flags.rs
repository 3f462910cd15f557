//! Device flags the tools share (upstream's `iree/tooling/device_util.c`
//! and the task-system flags): `--device`, `--list_drivers`,
//! `--list_devices`, `--dump_devices`, and the `--task_*` flags, parsed
//! into the [`DriverOptions`] the driver registry hands to drivers.

use ferrite::driver::{self, DriverOptions};
use ferrite_base::Result;
use ferrite_hal::device::DeviceRef;

/// The listing flags: a tool given one needs no `--module`.
pub const LISTING: [&str; 3] = ["list_drivers", "list_devices", "dump_devices"];

/// Device selection and driver flags.
#[derive(clap::Args, Debug, Clone, Default)]
pub struct DeviceArgs {
    /// HAL device(s) to run on, by URI: `local-sync`, `local-task`,
    /// `local-task://?workers=N` (see `--list_devices`).
    #[arg(long = "device")]
    pub devices: Vec<String>,
    /// Lists the HAL drivers of this build and exits.
    #[arg(long = "list_drivers")]
    pub list_drivers: bool,
    /// Lists the devices of every driver (or of one: `--list_devices=DRIVER`)
    /// by URI and exits.
    #[arg(long = "list_devices", num_args = 0..=1, default_missing_value = "", require_equals = true)]
    pub list_devices: Option<String>,
    /// Prints each driver's devices with their names and exits.
    #[arg(long = "dump_devices", num_args = 0..=1, default_missing_value = "", require_equals = true)]
    pub dump_devices: Option<String>,
    /// Task-system flags, as upstream names them.
    #[command(flatten)]
    pub task: TaskArgs,
}

/// Upstream's task-system flags (values are checked when parsed into
/// [`DriverOptions`]; the `local-task` driver gives them their meaning).
#[derive(clap::Args, Debug, Clone, Default)]
pub struct TaskArgs {
    /// Workers of `local-task` (0: by `--task_topology_max_group_count`).
    #[arg(long = "task_topology_group_count")]
    pub topology_group_count: Option<String>,
    /// Upper bound on the automatic worker count (default 64).
    #[arg(long = "task_topology_max_group_count")]
    pub topology_max_group_count: Option<String>,
    /// Logical CPU ids for one topology (`0,1,2`); repeat for several.
    #[arg(long = "task_topology_cpu_ids")]
    pub topology_cpu_ids: Vec<String>,
    /// Topology mode (`physical_cores`).
    #[arg(long = "task_topology_mode")]
    pub topology_mode: Option<String>,
    /// NUMA nodes (`current`, `numa`, `all`, `0,2,...`).
    #[arg(long = "task_topology_nodes")]
    pub topology_nodes: Option<String>,
    /// A captured topology to use instead of the host's (testing only).
    #[arg(long = "task_topology_snapshot")]
    pub topology_snapshot: Option<String>,
    /// Core performance level (`any`, `low`, `high`).
    #[arg(long = "task_topology_performance_level")]
    pub topology_performance_level: Option<String>,
    /// Distribution across cache domains (`scatter`, `compact`).
    #[arg(long = "task_topology_distribution")]
    pub topology_distribution: Option<String>,
    /// Preset (`latency`, `throughput`, `efficiency`).
    #[arg(long = "task_topology_favor")]
    pub topology_favor: Option<String>,
    /// Microseconds a worker spins waiting for work.
    #[arg(long = "task_worker_spin_us")]
    pub worker_spin_us: Option<String>,
    /// Bytes of each worker's stack.
    #[arg(long = "task_worker_stack_size")]
    pub worker_stack_size: Option<String>,
    /// Bytes of per-worker local memory for dispatches.
    #[arg(long = "task_worker_local_memory")]
    pub worker_local_memory: Option<String>,
    /// Aborts on the first failure in a task queue.
    #[arg(long = "task_abort_on_failure", num_args = 0..=1, default_missing_value = "true", require_equals = true)]
    pub abort_on_failure: Option<String>,
    /// Prints the task topology.
    #[arg(long = "dump_task_topologies", num_args = 0..=1, default_missing_value = "true", require_equals = true)]
    pub dump_topologies: Option<String>,
}

impl TaskArgs {
    /// The flags given, as `(upstream name, value)`, in a fixed order.
    pub fn given(&self) -> Vec<(&'static str, &str)> {
        let single: [(&'static str, &Option<String>); 13] = [
            ("task_topology_group_count", &self.topology_group_count),
            (
                "task_topology_max_group_count",
                &self.topology_max_group_count,
            ),
            ("task_topology_mode", &self.topology_mode),
            ("task_topology_nodes", &self.topology_nodes),
            ("task_topology_snapshot", &self.topology_snapshot),
            (
                "task_topology_performance_level",
                &self.topology_performance_level,
            ),
            ("task_topology_distribution", &self.topology_distribution),
            ("task_topology_favor", &self.topology_favor),
            ("task_worker_spin_us", &self.worker_spin_us),
            ("task_worker_stack_size", &self.worker_stack_size),
            ("task_worker_local_memory", &self.worker_local_memory),
            ("task_abort_on_failure", &self.abort_on_failure),
            ("dump_task_topologies", &self.dump_topologies),
        ];
        let mut v: Vec<(&'static str, &str)> = single
            .into_iter()
            .filter_map(|(name, value)| Some((name, value.as_deref()?)))
            .collect();
        for ids in &self.topology_cpu_ids {
            v.push(("task_topology_cpu_ids", ids.as_str()));
        }
        v
    }
}

impl DeviceArgs {
    /// The driver flags, each value checked (an error names the flag).
    pub fn driver_options(&self) -> Result<DriverOptions> {
        let mut options = DriverOptions::default();
        for (name, value) in self.task.given() {
            options.task.set(name, value)?;
        }
        Ok(options)
    }

    /// True when a listing flag was given (the tool prints and exits).
    pub fn wants_listing(&self) -> bool {
        self.list_drivers || self.list_devices.is_some() || self.dump_devices.is_some()
    }

    /// Prints what `--list_drivers`, `--list_devices` and `--dump_devices`
    /// ask for, in upstream's formats.
    pub fn print_listing(&self) -> Result<()> {
        let options = self.driver_options()?;
        if self.list_drivers {
            print!("{}", driver::list_drivers_text());
        }
        if let Some(d) = &self.list_devices {
            print!("{}", driver::list_devices_text(Some(d), &options)?);
        }
        if let Some(d) = &self.dump_devices {
            print!("{}", driver::dump_devices_text(Some(d), &options)?);
        }
        Ok(())
    }

    /// Creates the devices named by `--device` (or `default` when none is
    /// named) with the driver flags.
    pub fn create_devices(&self, default: &str) -> Result<Vec<DeviceRef>> {
        let options = self.driver_options()?;
        let names: Vec<&str> = if self.devices.is_empty() {
            vec![default]
        } else {
            self.devices.iter().map(String::as_str).collect()
        };
        names
            .into_iter()
            .map(|n| driver::create_device(n, &options))
            .collect()
    }
}
