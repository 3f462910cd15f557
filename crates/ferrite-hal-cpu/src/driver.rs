//! The CPU drivers `local-sync` and `local-task` (see
//! [`ferrite_hal::driver::Driver`]); the facade's registry lists them.

use crate::CpuDevice;
use ferrite_base::{status, Result};
use ferrite_hal::device::DeviceRef;
use ferrite_hal::driver::{DeviceInfo, DeviceSpec, Driver, DriverOptions, TaskOptions};

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

/// `local-task`: work runs on a worker pool. The URI parameter
/// `workers=N` overrides `--task_topology_group_count`.
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
            return Ok(explicit);
        }
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
        let cap = options.topology_max_group_count.max(1) as usize;
        Ok(cores.min(cap))
    }
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
        spec.check_params(&["workers"])?;
        let task = &options.task;
        let workers = LocalTaskDriver::worker_count(spec, task)?;
        // Upstream's default (128 KiB) and 0 leave the size to the
        // platform; other values ask for that size (at least MIN_STACK).
        let size = task.worker_stack_size;
        let stack = (size != 0 && size != TaskOptions::default().worker_stack_size)
            .then(|| size.max(MIN_STACK) as usize);
        Ok(DeviceRef(CpuDevice::local_task_with_stack_size(
            workers, stack,
        )))
    }
}
