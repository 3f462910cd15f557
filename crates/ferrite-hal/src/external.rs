//! External buffers: memory allocated outside Ferrite wrapped in place as a
//! [`Buffer`], and Ferrite's memory handed to users outside it, with the
//! queue-ordering facts such users need (upstream's
//! `iree_hal_external_buffer_t`, `iree_hal_allocator_import_buffer` and
//! `iree_hal_allocator_export_buffer`).
//!
//! Bindings (DLPack, the buffer protocol) reach every driver's memory
//! through this module and never name a driver:
//!
//! - **Import**: an [`ExternalBuffer`] describes foreign memory by kind
//!   ([`ExternalBufferType::HostAllocation`]: a host address;
//!   [`ExternalBufferType::DeviceAllocation`]: an address in the device's
//!   own API, e.g. a CUDA device pointer), size, writability and an owner
//!   whose drop is the release. Making one is `unsafe`: the caller vouches
//!   for the memory. [`Allocator::import_buffer`](crate::Allocator::import_buffer)
//!   wraps it; every allocator imports host allocations, drivers with
//!   memory of their own override it for device allocations. The owner is
//!   dropped exactly once: with the last buffer using the memory (queue
//!   work keeps its buffers until it completes), or before an import error
//!   is returned.
//! - **Export**: [`Buffer::native_memory`] says where a driver's memory is
//!   (the device, its API's address, device-local or host memory the
//!   device maps); [`Buffer::export_device_address`] hands the device
//!   address out and tells the driver that foreign queues may use the
//!   memory after Ferrite's last buffer is gone.
//! - **Ordering**: a device's [`NativeQueue`]
//!   ([`Device::native_queue`](crate::device::Device::native_queue)) names
//!   its queue's stream in the device's API and orders it against foreign
//!   streams: [`NativeQueue::order_before_stream`] (a foreign stream waits
//!   for the queue's work so far) and [`NativeQueue::order_after_stream`]
//!   (the queue's later work waits for a foreign stream's work so far).
//!   Host memory of the CPU drivers has no queue to order: their queue
//!   operations have finished when their fences are reached.
//!
//! Layout: `native` (where driver memory and queues are in their own API;
//! names no other HAL module, so buffer storage reports it) and `import`
//! (the [`ExternalBuffer`] allocators consume); this file re-exports both
//! and adds the export methods on [`Buffer`], so the lower layers never
//! name it (no import cycle through it).

use ferrite_base::{bail, Result};

use crate::buffer::Buffer;

pub(crate) mod import;
pub(crate) mod native;

pub use crate::allocator::import_with_host;
pub use import::{ExternalBuffer, ExternalBufferType};
pub use native::{NativeApi, NativeDevice, NativeMemory, NativeQueue, NativeStream};

impl Buffer {
    /// Where this buffer's memory is in its device's own API, with the
    /// buffer's offset applied to the address; None for host memory of the
    /// CPU drivers (and any driver memory not handed out). Nothing is
    /// marked or ordered: this only describes the memory.
    pub fn native_memory(&self) -> Option<NativeMemory> {
        let mut native = self.device_memory()?.native()?;
        native.device_address += self.byte_offset();
        Some(native)
    }

    /// Hands this buffer's memory out by its device address (upstream's
    /// export as a device allocation): the address of the buffer's first
    /// byte, valid while this buffer (or a clone) lives. The driver is told
    /// that foreign queues may use the memory after Ferrite's last buffer
    /// is gone, so it frees the memory in queue order instead of recycling
    /// it. FAILED_PRECONDITION for memory without a device address (host
    /// memory of the CPU drivers: export it through a host mapping).
    pub fn export_device_address(&self) -> Result<u64> {
        let Some(memory) = self.device_memory() else {
            bail!(
                FailedPrecondition,
                "buffer is host memory without a device address"
            );
        };
        let Some(native) = memory.native() else {
            bail!(
                FailedPrecondition,
                "the driver's memory has no device address to hand out"
            );
        };
        memory.mark_exported();
        Ok(native.device_address + self.byte_offset())
    }
}
