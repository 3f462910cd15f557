//! The device registry: HAL devices created by name.
//!
//! A device name is a driver name with optional parameters, in the URI form
//! upstream's tools accept:
//!
//! | name | device |
//! | --- | --- |
//! | `local-sync` | CPU, work runs inline on the calling thread |
//! | `local-task` | CPU, work runs on a pool of one worker per core |
//! | `local-task://?workers=4` (or `local-task?workers=4`) | the pool with 4 workers |
//!
//! Unknown drivers and parameters are errors that list what is available.

use ferrite_base::{bail, status, Result};
use ferrite_hal::device::DeviceRef;
use ferrite_hal_cpu::CpuDevice;

/// The drivers this build offers, with a one-line description each.
pub const DRIVERS: &[(&str, &str)] = &[
    ("local-sync", "CPU; work runs inline on the calling thread"),
    (
        "local-task",
        "CPU; work runs on a worker pool (parameter: workers=N, 0 = one per core)",
    ),
];

/// The names of the drivers this build offers.
pub fn available_drivers() -> Vec<&'static str> {
    DRIVERS.iter().map(|(n, _)| *n).collect()
}

/// A parsed device name: driver plus `key=value` parameters.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DeviceSpec {
    /// The driver (`local-sync`, `local-task`).
    pub driver: String,
    /// Parameters in the order given.
    pub params: Vec<(String, String)>,
}

impl DeviceSpec {
    /// Parses `driver`, `driver://`, `driver://?k=v&k2=v2` or `driver?k=v`.
    pub fn parse(name: &str) -> Result<DeviceSpec> {
        let name = name.trim();
        let (head, query) = match name.split_once('?') {
            Some((h, q)) => (h, q),
            None => (name, ""),
        };
        let driver = match head.split_once("://") {
            Some((d, rest)) => {
                if !rest.is_empty() {
                    bail!(
                        InvalidArgument,
                        "device '{name}': a path after '://' is not supported (got '{rest}'); \
                         use parameters, e.g. 'local-task://?workers=4'"
                    );
                }
                d
            }
            None => head,
        };
        if driver.is_empty() {
            bail!(InvalidArgument, "device name '{name}' has no driver");
        }
        let mut params = Vec::new();
        for pair in query.split('&').filter(|p| !p.is_empty()) {
            let Some((k, v)) = pair.split_once('=') else {
                bail!(
                    InvalidArgument,
                    "device '{name}': parameter '{pair}' is not of the form key=value"
                );
            };
            params.push((k.to_string(), v.to_string()));
        }
        Ok(DeviceSpec {
            driver: driver.to_string(),
            params,
        })
    }
}

/// A HAL device made by the registry. Cheap to clone (shared).
#[derive(Clone)]
pub struct Device {
    name: String,
    inner: DeviceRef,
}

impl Device {
    /// Creates the device `name` (see the [module docs](self) for names).
    pub fn create(name: &str) -> Result<Device> {
        let spec = DeviceSpec::parse(name)?;
        let inner = match spec.driver.as_str() {
            "local-sync" => {
                if let Some((k, _)) = spec.params.first() {
                    bail!(
                        InvalidArgument,
                        "device '{name}': local-sync takes no parameters (got '{k}')"
                    );
                }
                DeviceRef(CpuDevice::local_sync())
            }
            "local-task" => {
                let mut workers = 0usize;
                for (k, v) in &spec.params {
                    match k.as_str() {
                        "workers" => {
                            workers = v.parse().map_err(|_| {
                                status!(
                                    InvalidArgument,
                                    "device '{name}': workers must be a non-negative integer (got '{v}')"
                                )
                            })?
                        }
                        other => bail!(
                            InvalidArgument,
                            "device '{name}': unknown parameter '{other}' (local-task takes: workers)"
                        ),
                    }
                }
                DeviceRef(CpuDevice::local_task(workers)?)
            }
            other => bail!(
                NotFound,
                "device '{other}' is not available; available devices: {}",
                available_drivers().join(", ")
            ),
        };
        Ok(Device {
            name: name.trim().to_string(),
            inner,
        })
    }

    /// Wraps a HAL device made elsewhere (a driver this registry does not
    /// know), under `name`.
    pub fn from_hal(name: impl Into<String>, device: DeviceRef) -> Device {
        Device {
            name: name.into(),
            inner: device,
        }
    }

    /// The name the device was created with.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The HAL device's identifier (`local-sync`, `local-task`).
    pub fn id(&self) -> &str {
        self.inner.0.id()
    }

    /// The HAL device, for code that works at the HAL layer.
    pub fn hal(&self) -> &DeviceRef {
        &self.inner
    }
}

impl std::fmt::Debug for Device {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Device({})", self.name)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ferrite_base::StatusCode;

    #[test]
    fn parses_names() {
        let s = DeviceSpec::parse("local-sync").unwrap();
        assert_eq!(s.driver, "local-sync");
        assert!(s.params.is_empty());
        let s = DeviceSpec::parse("local-task://").unwrap();
        assert_eq!(s.driver, "local-task");
        let s = DeviceSpec::parse("local-task://?workers=3").unwrap();
        assert_eq!(s.params, vec![("workers".into(), "3".into())]);
        let s = DeviceSpec::parse("local-task?workers=2&x=y").unwrap();
        assert_eq!(s.params.len(), 2);
        assert!(DeviceSpec::parse("").is_err());
        assert!(DeviceSpec::parse("local-task://?workers").is_err());
        assert!(DeviceSpec::parse("local-task://0").is_err());
    }

    #[test]
    fn creates_devices() {
        assert_eq!(Device::create("local-sync").unwrap().id(), "local-sync");
        let d = Device::create("local-task://?workers=2").unwrap();
        assert_eq!(d.id(), "local-task");
        assert_eq!(d.name(), "local-task://?workers=2");
    }

    #[test]
    fn rejects_bad_names() {
        let e = Device::create("cuda").unwrap_err();
        assert_eq!(e.code(), StatusCode::NotFound);
        assert!(e.to_string().contains("local-sync, local-task"), "{e}");
        let e = Device::create("local-task?workers=many").unwrap_err();
        assert_eq!(e.code(), StatusCode::InvalidArgument);
        assert!(Device::create("local-task?threads=2").is_err());
        assert!(Device::create("local-sync?workers=2").is_err());
    }
}
