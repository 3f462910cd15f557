//! Devices created by URI through the [driver registry](crate::driver).
//!
//! `Device::create("local-task")`, `Device::create("local-task://?workers=4")`;
//! see [`crate::driver`] for the URI forms and the drivers available.

use crate::driver::{self, DriverOptions};
use ferrite_base::Result;
use ferrite_hal::device::DeviceRef;

/// A HAL device made by the registry. Cheap to clone (shared).
#[derive(Clone)]
pub struct Device {
    name: String,
    inner: DeviceRef,
}

impl Device {
    /// Creates the device `name` with default driver flags (see
    /// [`crate::driver`] for names).
    pub fn create(name: &str) -> Result<Device> {
        Device::create_with(name, &DriverOptions::default())
    }

    /// Creates the device `name` with the driver flags `options` (worker
    /// count and topology for `local-task`, ...).
    pub fn create_with(name: &str, options: &DriverOptions) -> Result<Device> {
        let inner = driver::create_device(name, options)?;
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
    fn creates_devices() {
        assert_eq!(Device::create("local-sync").unwrap().id(), "local-sync");
        let d = Device::create("local-task://?workers=2").unwrap();
        assert_eq!(d.id(), "local-task");
        assert_eq!(d.name(), "local-task://?workers=2");
    }

    #[test]
    fn rejects_bad_names() {
        let e = Device::create("vulkan").unwrap_err();
        assert_eq!(e.code(), StatusCode::NotFound);
        assert!(
            e.to_string().contains("cuda, local-sync, local-task"),
            "{e}"
        );
        let e = Device::create("local-task?workers=many").unwrap_err();
        assert_eq!(e.code(), StatusCode::InvalidArgument);
        assert!(Device::create("local-task?threads=2").is_err());
        assert!(Device::create("local-sync?workers=2").is_err());
    }
}
