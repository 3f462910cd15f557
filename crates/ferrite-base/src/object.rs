//! [`RefObject`]: a shareable object that names its type.
//!
//! The VM holds objects of other layers (HAL buffers, fences, devices) in
//! its ref registers as `Arc<dyn RefObject>`. The trait lives here, below
//! both the VM and the HAL, so that a HAL type can be such an object
//! without the HAL depending on the VM (as upstream's objects carry their
//! reference count from `base` and the `hal` module registers their VM
//! types). The name a type gives is the one the VM's type registry knows it
//! by; registering it is the binding crate's job (`ferrite-hal-module` for
//! the HAL types).

use std::any::Any;

/// An object that can live in a VM ref register: any `Send + Sync` type
/// with a stable type name.
pub trait RefObject: Any + Send + Sync {
    /// The registered type name without the leading `!` (`vm.buffer`,
    /// `hal.fence`).
    fn type_name(&self) -> &'static str;
}
