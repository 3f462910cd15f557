//! The driver registry: every HAL driver this build offers, in one list.
//!
//! The Rust API ([`crate::Device::create`]), the command-line tools
//! (`--device`, `--list_drivers`, `--list_devices`) and the Python package
//! (`HalDriver`, `get_device`) all create devices through this module, so a
//! driver is added in one place.
//!
//! # Adding a driver
//!
//! Implement [`ferrite_hal::driver::Driver`] in the driver's crate (name,
//! description, device enumeration, creation from a [`DeviceSpec`] and the
//! [`DriverOptions`]), add the crate to this crate's dependencies, and add
//! one line to [`DRIVERS`], e.g. `&ferrite_hal_cuda::CudaDriver,` (behind a
//! cargo feature if the driver needs a system library). Drivers are listed
//! in name order, as upstream lists them.
//!
//! # Device URIs
//!
//! | URI | device |
//! | --- | --- |
//! | `local-sync` | CPU, work runs inline on the calling thread |
//! | `local-task` | CPU, work runs on a pool of workers (`--task_topology_group_count`, else one per core up to `--task_topology_max_group_count`) |
//! | `local-task://?workers=4` (or `local-task?workers=4`) | the pool with 4 workers |
//! | `driver://0`, `driver://<id>` | a driver's device by ordinal or id (`cuda://0`, `cuda://GPU-<uuid>`) |
//!
//! Unknown drivers, paths and parameters are errors that say what exists.

use ferrite_base::status::ResultExt;
use ferrite_base::{bail, Result};
use ferrite_hal::device::DeviceRef;
pub use ferrite_hal::driver::{DeviceInfo, DeviceSpec, Driver, DriverOptions, TaskOptions};

/// The drivers this build offers, in name order. Add a driver here (see
/// the [module docs](self)).
pub static DRIVERS: &[&dyn Driver] = &[
    &ferrite_hal_cuda::CudaDriver,
    &ferrite_hal_cpu::LocalSyncDriver,
    &ferrite_hal_cpu::LocalTaskDriver,
];

/// The names of the drivers this build offers.
pub fn available_drivers() -> Vec<&'static str> {
    DRIVERS.iter().map(|d| d.name()).collect()
}

/// The driver called `name`; an unknown name is a NOT_FOUND error listing
/// the available drivers and suggesting the closest one.
pub fn find_driver(name: &str) -> Result<&'static dyn Driver> {
    match DRIVERS.iter().find(|d| d.name() == name) {
        Some(d) => Ok(*d),
        None => {
            let hint = closest_driver(name)
                .map(|d| format!("; did you mean '{d}'?"))
                .unwrap_or_default();
            bail!(
                NotFound,
                "no HAL driver named '{name}'{hint} Available drivers: {} (--list_devices lists their devices)",
                available_drivers().join(", ")
            )
        }
    }
}

/// The driver name within two edits of `name`, if any (typos such as
/// `local-snyc`).
fn closest_driver(name: &str) -> Option<&'static str> {
    fn distance(a: &str, b: &str) -> usize {
        let b: Vec<char> = b.chars().collect();
        let mut row: Vec<usize> = (0..=b.len()).collect();
        for (i, ca) in a.chars().enumerate() {
            let mut prev = row[0];
            row[0] = i + 1;
            for (j, &cb) in b.iter().enumerate() {
                let cur = row[j + 1];
                row[j + 1] = if ca == cb {
                    prev
                } else {
                    1 + prev.min(row[j]).min(row[j + 1])
                };
                prev = cur;
            }
        }
        row[b.len()]
    }
    available_drivers()
        .into_iter()
        .map(|d| (distance(name, d), d))
        .filter(|&(n, _)| n <= 2)
        .min()
        .map(|(_, d)| d)
}

/// Creates the HAL device `uri` names with the driver flags `options`.
pub fn create_device(uri: &str, options: &DriverOptions) -> Result<DeviceRef> {
    let create = || -> Result<DeviceRef> {
        let spec = DeviceSpec::parse(uri)?;
        find_driver(&spec.driver)?.create(&spec, options)
    };
    create().annotate(|| format!("creating device '{}'", uri.trim()))
}

/// The text `--list_drivers` prints (upstream's layout).
pub fn list_drivers_text() -> String {
    let rule = format!("# {}\n", "=".repeat(76));
    let mut out = format!(
        "{rule}# Available HAL drivers\n{rule}# Use --list_devices={{driver name}} to enumerate available devices.\n\n"
    );
    for d in DRIVERS {
        out.push_str(&format!("{:>16}: {}\n", d.name(), d.description()));
    }
    out
}

/// The URIs of the devices of `driver` (every driver when `None`), one
/// per line, as `--list_devices` prints them.
pub fn list_devices_text(driver: Option<&str>, options: &DriverOptions) -> Result<String> {
    let mut out = String::new();
    for d in selected(driver)? {
        for info in d.enumerate(options)? {
            out.push_str(&format!("{}://{}\n", d.name(), info.path));
        }
    }
    Ok(out)
}

/// The text `--dump_devices` prints: per driver, each device's URI and name.
pub fn dump_devices_text(driver: Option<&str>, options: &DriverOptions) -> Result<String> {
    let rule = format!("# {}\n", "=".repeat(76));
    let thin = format!("# ==={}===\n", "-".repeat(70));
    let mut out = String::new();
    for d in selected(driver)? {
        out.push_str(&format!(
            "{rule}# Enumerated devices for driver '{}'\n{rule}\n",
            d.name()
        ));
        for info in d.enumerate(options)? {
            out.push_str(&format!(
                "{thin}# --device={}://{}\n#   {}\n{thin}\n",
                d.name(),
                info.path,
                info.name
            ));
        }
        out.push('\n');
    }
    Ok(out)
}

fn selected(driver: Option<&str>) -> Result<Vec<&'static dyn Driver>> {
    Ok(match driver {
        Some(name) if !name.is_empty() => vec![find_driver(name)?],
        _ => DRIVERS.to_vec(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use ferrite_base::StatusCode;

    #[test]
    fn drivers_are_sorted_and_unique() {
        let names = available_drivers();
        let mut sorted = names.clone();
        sorted.sort();
        sorted.dedup();
        assert_eq!(names, sorted);
    }

    #[test]
    fn unknown_driver_lists_the_available_ones() {
        let e = create_device("vulkan", &DriverOptions::default()).unwrap_err();
        assert_eq!(e.code(), StatusCode::NotFound);
        assert!(e.to_string().contains("local-sync, local-task"), "{e}");
    }

    #[test]
    fn lists_as_upstream() {
        let text = list_drivers_text();
        assert!(text.contains("      local-sync: Local execution"), "{text}");
        let devices = list_devices_text(None, &DriverOptions::default()).unwrap();
        assert_eq!(devices, "local-sync://\nlocal-task://\n");
        let one = list_devices_text(Some("local-task"), &DriverOptions::default()).unwrap();
        assert_eq!(one, "local-task://\n");
        assert!(list_devices_text(Some("nope"), &DriverOptions::default()).is_err());
        let dump = dump_devices_text(Some("local-sync"), &DriverOptions::default()).unwrap();
        assert!(
            dump.contains("# --device=local-sync://\n#   default\n"),
            "{dump}"
        );
    }

    #[test]
    fn task_options_reach_the_driver() {
        let mut options = DriverOptions::default();
        options.task.set("task_topology_group_count", "3").unwrap();
        let d = create_device("local-task", &options).unwrap();
        let cpu =
            d.0.as_any()
                .downcast_ref::<ferrite_hal_cpu::CpuDevice>()
                .unwrap();
        assert_eq!(cpu.worker_count(), 3);
        // A URI parameter wins over the flag.
        let d = create_device("local-task://?workers=2", &options).unwrap();
        let cpu =
            d.0.as_any()
                .downcast_ref::<ferrite_hal_cpu::CpuDevice>()
                .unwrap();
        assert_eq!(cpu.worker_count(), 2);
    }
}
