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

use std::sync::Arc;

use ferrite_base::{bail, Result};

use crate::buffer::{Buffer, HostMemory};

/// What an [`ExternalBuffer`]'s address is (upstream's
/// `iree_hal_external_buffer_type_t`, the kinds Ferrite imports).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ExternalBufferType {
    /// A host address of this process (a numpy array, a DLPack `kDLCPU`
    /// tensor).
    HostAllocation,
    /// An address in the device's own API (a CUDA device pointer, a DLPack
    /// `kDLCUDA` tensor), valid on the device that imports it.
    DeviceAllocation,
}

/// The API whose addresses and streams a device's [`NativeMemory`] and
/// [`NativeQueue`] are in.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum NativeApi {
    /// The CUDA driver API: device pointers (`CUdeviceptr`) and streams
    /// (`CUstream`).
    Cuda,
}

/// A device as its own API names it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct NativeDevice {
    /// The API.
    pub api: NativeApi,
    /// The device's ordinal in that API (`cuda://N`; DLPack's `device_id`).
    pub ordinal: i32,
}

/// A stream handle in a device's own API. For CUDA it is a `CUstream` of
/// this process, or one of the driver's constants: 1 the legacy default
/// stream (`CU_STREAM_LEGACY`), 2 the per-thread default stream
/// (`CU_STREAM_PER_THREAD`) — the numbers DLPack's `stream` argument uses.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct NativeStream(pub usize);

impl NativeStream {
    /// CUDA's legacy default stream (where PyTorch's default work runs).
    pub const CUDA_LEGACY: NativeStream = NativeStream(1);
    /// CUDA's per-thread default stream.
    pub const CUDA_PER_THREAD: NativeStream = NativeStream(2);
}

/// A device queue as its own API sees it: what foreign code (another
/// library's streams) needs to order its work against Ferrite's.
///
/// # Safety
/// Foreign code trusts what an implementation says: [`NativeQueue::device`]
/// names the device the queue runs on, and [`NativeQueue::stream`] is a
/// stream handle of that API, valid on that device while the queue lives
/// (bindings pass it to foreign producers, which enqueue work on it).
pub unsafe trait NativeQueue: Send + Sync {
    /// The device the queue runs on.
    fn device(&self) -> NativeDevice;

    /// The queue's own stream, for a foreign producer asked to make its
    /// data ready for work on this queue (DLPack `__dlpack__(stream=...)`).
    fn stream(&self) -> NativeStream;

    /// Makes `consumer`'s later work wait for every queue operation
    /// submitted so far, without blocking the host (the consumer waits on
    /// the device); `None` waits on the host instead. Operations still
    /// waiting for a semaphore are ordered too: the consumer is released
    /// once they ran (or failed; failures are reported through the
    /// operations' semaphores, never to the consumer).
    ///
    /// # Safety
    /// `consumer` must be a stream handle of this process valid on this
    /// device (or one of the API's constants, see [`NativeStream`]): the
    /// driver dereferences it, and no API can check a handle first.
    unsafe fn order_before_stream(&self, consumer: Option<NativeStream>) -> Result<()>;

    /// Makes the queue's later work wait for `producer`'s work so far (on
    /// the device): e.g. before memory a foreign consumer used on
    /// `producer` is freed in queue order.
    ///
    /// # Safety
    /// As [`NativeQueue::order_before_stream`], for `producer`.
    unsafe fn order_after_stream(&self, producer: NativeStream) -> Result<()>;
}

/// Where a driver's memory is, as its device's own API addresses it (see
/// [`Buffer::native_memory`]).
#[derive(Clone)]
pub struct NativeMemory {
    /// The queue of the device the memory belongs to.
    pub queue: Arc<dyn NativeQueue>,
    /// The device address of the first byte (of the allocation when a
    /// [`DeviceMemory`](crate::buffer::DeviceMemory) reports it, of the
    /// buffer from [`Buffer::native_memory`]).
    pub device_address: u64,
    /// True for device-only memory; false for host memory the device maps
    /// (pinned memory), which the host also addresses
    /// ([`DeviceMemory::host_ptr`](crate::buffer::DeviceMemory::host_ptr)).
    pub device_local: bool,
}

impl std::fmt::Debug for NativeMemory {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NativeMemory")
            .field("device", &self.queue.device())
            .field(
                "device_address",
                &format_args!("{:#x}", self.device_address),
            )
            .field("device_local", &self.device_local)
            .finish()
    }
}

/// Foreign memory to import without a copy (upstream's
/// `iree_hal_external_buffer_t` with its release callback): made by
/// [`ExternalBuffer::host_allocation`] or
/// [`ExternalBuffer::device_allocation`], consumed by
/// [`Allocator::import_buffer`](crate::Allocator::import_buffer).
///
/// The release is an owner object: dropping it releases the memory (runs a
/// DLPack producer's deleter, releases a Python buffer export). It is
/// dropped exactly once, when the last buffer using the memory is dropped,
/// or with the `ExternalBuffer` if that is never imported or its import
/// fails.
pub struct ExternalBuffer {
    ty: ExternalBufferType,
    /// The address as given (a host pointer keeps its provenance: host
    /// imports use it as a pointer again).
    address: Address,
    size: u64,
    writable: bool,
    release: Box<dyn Send + Sync>,
}

/// An [`ExternalBuffer`]'s address.
enum Address {
    Host(*mut u8),
    Device(u64),
}

impl std::fmt::Debug for ExternalBuffer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ExternalBuffer")
            .field("type", &self.ty)
            .field("address", &format_args!("{:#x}", self.address()))
            .field("size", &self.size)
            .field("writable", &self.writable)
            .finish()
    }
}

impl ExternalBuffer {
    /// `size` bytes of host memory at `ptr`, released by dropping
    /// `release`.
    ///
    /// # Safety
    /// `ptr` must be valid for reads (and writes when `writable`) of `size`
    /// bytes until `release` is dropped, and must not be freed or resized
    /// before. Other writers (the owner's code) may write it meanwhile only
    /// as mapped memory races: the HAL never makes a Rust slice over
    /// foreign memory (it copies through raw pointers), and device work on
    /// it is ordered by the caller's fences.
    pub unsafe fn host_allocation(
        ptr: *mut u8,
        size: usize,
        writable: bool,
        release: Box<dyn Send + Sync>,
    ) -> ExternalBuffer {
        ExternalBuffer {
            ty: ExternalBufferType::HostAllocation,
            address: Address::Host(ptr),
            size: size as u64,
            writable,
            release,
        }
    }

    /// `size` bytes at `address` in the importing device's own API (a CUDA
    /// device pointer), released by dropping `release`. The importing
    /// driver checks what its API can check (that the address is that
    /// device's memory and the range lies in one allocation) and refuses
    /// the import otherwise.
    ///
    /// # Safety
    /// `[address, address + size)` must stay valid memory of the importing
    /// device, not freed or reused by anyone, until `release` is dropped;
    /// when not `writable`, nothing Ferrite runs may write it. Writes by
    /// others while Ferrite's queue work uses the memory are the caller's
    /// to order (DLPack's `stream` protocol, [`NativeQueue`]).
    pub unsafe fn device_allocation(
        address: u64,
        size: u64,
        writable: bool,
        release: Box<dyn Send + Sync>,
    ) -> ExternalBuffer {
        ExternalBuffer {
            ty: ExternalBufferType::DeviceAllocation,
            address: Address::Device(address),
            size,
            writable,
            release,
        }
    }

    /// The kind of address.
    pub fn buffer_type(&self) -> ExternalBufferType {
        self.ty
    }

    /// The address of the first byte.
    pub fn address(&self) -> u64 {
        match self.address {
            Address::Host(p) => p as u64,
            Address::Device(a) => a,
        }
    }

    /// Bytes.
    pub fn size(&self) -> u64 {
        self.size
    }

    /// True when Ferrite may write the memory.
    pub fn is_writable(&self) -> bool {
        self.writable
    }

    /// The memory as [`HostMemory`] for [`Allocator::import_host`](crate::Allocator::import_host)
    /// (host allocations; a device allocation is an INVALID_ARGUMENT error,
    /// its release dropped).
    pub fn into_host_memory(self) -> Result<HostMemory> {
        let ptr = match self.address {
            Address::Host(p) => p,
            Address::Device(a) => bail!(
                InvalidArgument,
                "external buffer at {a:#x} is a device allocation, not host memory"
            ),
        };
        let Ok(size) = usize::try_from(self.size) else {
            bail!(
                OutOfRange,
                "external host allocation of {} bytes",
                self.size
            );
        };
        // SAFETY: `host_allocation`'s contract is `HostMemory::foreign`'s:
        // `address` is valid for reads (writes when `writable`) of `size`
        // bytes until the release is dropped, and the HAL accesses foreign
        // memory only through raw copies.
        Ok(unsafe { HostMemory::foreign(ptr, size, self.writable, self.release) })
    }

    /// The parts, for a driver's import: (address, size, writable,
    /// release). The driver must keep `release` until no buffer or queue
    /// operation uses the memory any more, and drop it exactly once (the
    /// contract the `ExternalBuffer`'s maker vouched for is tied to it).
    pub fn into_parts(self) -> (u64, u64, bool, Box<dyn Send + Sync>) {
        (self.address(), self.size, self.writable, self.release)
    }
}

/// [`Allocator::import_buffer`](crate::Allocator::import_buffer)'s default:
/// host allocations through [`Allocator::import_host`](crate::Allocator::import_host),
/// device allocations refused (the allocator has no device memory of its
/// own to wrap them as).
pub fn import_with_host<A: crate::Allocator + ?Sized>(
    allocator: &A,
    params: &crate::BufferParams,
    buffer: ExternalBuffer,
) -> Result<Buffer> {
    match buffer.buffer_type() {
        ExternalBufferType::HostAllocation => allocator.import_host(params, buffer.into_host_memory()?),
        ExternalBufferType::DeviceAllocation => bail!(
            InvalidArgument,
            "this allocator has no device memory: it cannot import a device allocation ({} bytes at {:#x}); import it through the device it belongs to",
            buffer.size(),
            buffer.address()
        ),
    }
}

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
