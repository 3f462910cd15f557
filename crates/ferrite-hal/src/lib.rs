//! Ferrite's HAL layer: the hardware-abstraction types every driver shares,
//! with no driver specifics.
//!
//! - [`element_type`]: element and encoding types with upstream's encoding,
//!   names and numpy mapping.
//! - [`memory`]: memory type, buffer usage and memory access bitflags with
//!   upstream's values and printed forms.
//! - [`buffer`], [`allocator`]: host-memory buffers (subspans, checked host
//!   access, raw binding pointers for devices), the heap allocator and a
//!   caching pool for queue-ordered allocations.
//! - [`buffer_view`]: shaped views of buffers and upstream's text form
//!   (`2x3xf32=[1 2 3][4 5 6]`) for printing and `--input` parsing.
//! - [`semaphore`], [`fence`]: timeline semaphores and fences, usable as
//!   [`ferrite_base::wait::WaitSource`]s.
//! - [`numerics`]: narrow-float conversions and C-compatible number
//!   formatting/parsing.
//! - [`command_buffer`], [`executable`], [`device`]: recorded commands,
//!   loaded executables, and the device trait with queue operations built
//!   on one submission primitive.
//! - [`driver`]: the driver trait (device URIs, enumeration, creation) and
//!   the driver flags (`--task_*`) drivers receive.
//! - [`module`]: the `hal` VM module.
#![deny(missing_docs)]

pub mod allocator;
pub mod buffer;
pub mod buffer_view;
pub mod command_buffer;
pub mod device;
pub mod driver;
pub mod element_type;
pub mod executable;
pub mod fence;
pub mod memory;
pub mod module;
pub mod numerics;
pub mod semaphore;

pub use allocator::{
    Allocator, AllocatorStatistics, BufferParams, CachingAllocator, HeapAllocator,
};
pub use buffer::{BindingPtr, Buffer, HostMemory, WHOLE_BUFFER};
pub use buffer_view::BufferView;
pub use element_type::{ElementType, EncodingType, NumericalType};
pub use fence::Fence;
pub use memory::{BufferCompatibility, BufferUsage, MemoryAccess, MemoryType};
pub use semaphore::{wait_multi, Semaphore, Timepoint};

/// Registers the HAL ref types this crate defines with a VM type registry:
/// `hal.buffer`, `hal.buffer_view`, `hal.fence` and `hal.semaphore`.
///
/// `hal.device`, `hal.allocator`, `hal.command_buffer`, `hal.executable`,
/// `hal.channel` and `hal.file` are registered by the crates that define
/// those objects (the `hal` VM module and the drivers).
pub fn register_types(registry: &ferrite_vm::types::TypeRegistry) {
    registry.register_type::<Buffer>("hal.buffer");
    registry.register_type::<BufferView>("hal.buffer_view");
    registry.register_type::<Fence>("hal.fence");
    registry.register_type::<Semaphore>("hal.semaphore");
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn registers_types() {
        let r = ferrite_vm::types::TypeRegistry::default();
        register_types(&r);
        for n in [
            "hal.buffer",
            "hal.buffer_view",
            "hal.fence",
            "hal.semaphore",
        ] {
            assert!(r.lookup(n).is_some(), "{n}");
        }
        let f = ferrite_vm::Ref::new(Fence::new());
        assert!(r.lookup("hal.fence").unwrap().matches(&f));
        assert!(!r.lookup("hal.buffer").unwrap().matches(&f));
        let s = ferrite_vm::Ref::from_arc(Semaphore::new(0));
        assert_eq!(s.type_name(), "hal.semaphore");
    }
}
