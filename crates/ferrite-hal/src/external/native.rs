//! Driver memory and queues as their device's own API names them (the
//! export and ordering half of [`crate::external`]). Nothing here names
//! another HAL module, so buffer storage can report a [`NativeMemory`]
//! without depending on the import side.

use std::sync::Arc;

use ferrite_base::Result;

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
/// [`Buffer::native_memory`](crate::buffer::Buffer::native_memory)).
#[derive(Clone)]
pub struct NativeMemory {
    /// The queue of the device the memory belongs to.
    pub queue: Arc<dyn NativeQueue>,
    /// The device address of the first byte (of the allocation when a
    /// [`DeviceMemory`](crate::buffer::DeviceMemory) reports it, of the
    /// buffer from [`Buffer::native_memory`](crate::buffer::Buffer::native_memory)).
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
