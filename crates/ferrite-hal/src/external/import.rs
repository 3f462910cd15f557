//! Foreign memory to import in place (the import half of
//! [`crate::external`]): the [`ExternalBuffer`] a binding makes and an
//! allocator consumes.

use ferrite_base::{bail, Result};

use crate::buffer::HostMemory;

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

/// Foreign memory to import without a copy (upstream's
/// `iree_hal_external_buffer_t` with its release callback): made by
/// [`ExternalBuffer::host_allocation`] or
/// [`ExternalBuffer::device_allocation`], consumed by
/// [`Allocator::import_buffer`](crate::allocator::Allocator::import_buffer).
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
    /// to order (DLPack's `stream` protocol, [`NativeQueue`](crate::external::NativeQueue)).
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

    /// The memory as [`HostMemory`] for [`Allocator::import_host`](crate::allocator::Allocator::import_host)
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
