//! The CUDA side of the HAL's external-buffer API
//! ([`ferrite_hal::external`]): the queue as CUDA streams see it. Device
//! allocations are imported by [`CudaAllocator::import_buffer`](crate::memory::CudaAllocator)
//! (module `memory`), and device memory says where it is through
//! [`DeviceMemory::native`](ferrite_hal::buffer::DeviceMemory::native).

use crate::context::CudaContext;
use ferrite_base::Result;
use ferrite_hal::external::{NativeApi, NativeDevice, NativeQueue, NativeStream};

// SAFETY: `device` is this context's device ordinal in the CUDA driver
// API, and `stream` its queue stream, created with the context and
// destroyed only in its Drop (so valid while the queue lives).
unsafe impl NativeQueue for CudaContext {
    fn device(&self) -> NativeDevice {
        NativeDevice {
            api: NativeApi::Cuda,
            ordinal: self.ordinal(),
        }
    }

    fn stream(&self) -> NativeStream {
        NativeStream(self.queue_stream_handle())
    }

    unsafe fn order_before_stream(&self, consumer: Option<NativeStream>) -> Result<()> {
        // SAFETY: the trait's contract (a stream handle of this process
        // valid on this device, or a constant) is `order_queue_before`'s.
        unsafe { self.order_queue_before(consumer.map(|s| s.0)) }
    }

    unsafe fn order_after_stream(&self, producer: NativeStream) -> Result<()> {
        // SAFETY: as above, for `order_before_queue`.
        unsafe { self.order_before_queue(producer.0) }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dlpack_stream_numbers_are_the_cuda_constants() {
        // DLPack's `stream=1` / `stream=2` are passed through as handles:
        // they must be the driver's own constants.
        assert_eq!(NativeStream::CUDA_LEGACY.0, crate::ffi::CU_STREAM_LEGACY);
        assert_eq!(
            NativeStream::CUDA_PER_THREAD.0,
            crate::ffi::CU_STREAM_PER_THREAD
        );
    }
}
