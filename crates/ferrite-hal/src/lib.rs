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
//!   [`ferrite_base::wait::WaitSource`]s; [`wait_async`]: their waits as
//!   futures (`Semaphore::wait_async`, `Fence::wait_async`).
//! - [`numerics`]: narrow-float conversions and C-compatible number
//!   formatting/parsing.
//! - [`command_buffer`], [`executable`], [`device`]: recorded commands,
//!   loaded executables, and the device trait with queue operations built
//!   on one submission primitive.
//! - [`channel`]: collective channels (a rank of a device group), the
//!   collective operation encoding and the provider of default ranks.
//! - [`external`]: foreign memory imported in place, Ferrite's memory
//!   handed out by device address, and ordering against foreign streams
//!   (DLPack's needs, driver-neutral).
//! - [`driver`]: the driver trait (device URIs, enumeration, creation) and
//!   the driver flags (`--task_*`) drivers receive.
//!
//! The HAL does not depend on the VM: its objects are
//! [`ferrite_base::RefObject`]s, and the `hal` VM module with the ref-type
//! registration lives in `ferrite-hal-module`.
#![deny(missing_docs)]

pub mod allocator;
pub mod buffer;
pub mod buffer_view;
pub mod channel;
pub mod command_buffer;
pub mod command_trace;
pub mod device;
pub mod driver;
pub mod element_type;
pub mod executable;
pub mod external;
pub mod fence;
mod inflight;
pub mod memory;
pub mod numerics;
pub mod semaphore;
pub mod wait_async;

pub use allocator::{
    Allocator, AllocatorStatistics, BufferParams, CachingAllocator, HeapAllocator,
};
pub use buffer::{BindingPtr, Buffer, DeviceMemory, HostMapping, HostMemory, WHOLE_BUFFER};
pub use buffer_view::BufferView;
pub use channel::{Channel, ChannelParams, ChannelProvider, ChannelRef, CollectiveOp};
pub use element_type::{ElementType, EncodingType, NumericalType};
pub use external::{ExternalBuffer, ExternalBufferType, NativeQueue, NativeStream};
pub use fence::Fence;
pub use memory::{BufferCompatibility, BufferUsage, MemoryAccess, MemoryType};
pub use semaphore::{wait_multi, Semaphore, Timepoint};
pub use wait_async::{wait_multi_async, TimepointWait};
