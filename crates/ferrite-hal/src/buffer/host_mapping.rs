//! Owned host mappings: a host pointer into a buffer handed to a holder
//! that cannot keep a lock guard (Python's `HalBuffer.map()`, whose
//! `MappedMemory` lives as long as the numpy arrays viewing it).
//!
//! Such a mapping follows the HAL's host-access rule like the scoped
//! mappings ([`Buffer::map_read`], [`Buffer::map_write`]): it is refused
//! (`FAILED_PRECONDITION`) while device work that may write the allocation
//! is in flight, and, when writable, while any device work uses it; while
//! it lives, device work that would conflict with it (any device use for a
//! writable mapping, device writers for a read-only one) is refused in
//! turn. It is counted on the allocation's device-use counters rather than
//! by holding the allocation's lock, so a holder that keeps it for long
//! never blocks the host accessors of other threads: host-to-host ordering
//! through such a mapping is the holder's, as with upstream's mappings.

use std::ptr::NonNull;
use std::sync::atomic::{fence, Ordering};
use std::sync::Arc;

use ferrite_base::{bail, Result};

use super::device_users::DeviceUsers;
use super::handle::Buffer;
use super::storage::Allocation;
use crate::memory::MemoryAccess;

impl DeviceUsers {
    /// Counts a host mapping (`write`: it may write), unless device work
    /// conflicts: any device writer, or, for a writable mapping, any device
    /// reader. The mirror of `begin` (count, fence, check).
    fn begin_host_mapping(&self, write: bool) -> Result<()> {
        self.host_mapped.fetch_add(1, Ordering::SeqCst);
        if write {
            self.host_mapped_writable.fetch_add(1, Ordering::SeqCst);
        }
        fence(Ordering::SeqCst);
        let writers = self.writers.load(Ordering::SeqCst);
        let readers = self.readers.load(Ordering::SeqCst);
        if writers != 0 || (write && readers != 0) {
            self.end_host_mapping(write);
            bail!(
                FailedPrecondition,
                "buffer is in use by device work that {} it (work in flight); wait on the work's fence before mapping it",
                if writers != 0 { "may write" } else { "reads" }
            );
        }
        Ok(())
    }

    fn end_host_mapping(&self, write: bool) {
        if write {
            self.host_mapped_writable.fetch_sub(1, Ordering::SeqCst);
        }
        self.host_mapped.fetch_sub(1, Ordering::SeqCst);
    }
}

/// A host mapping of a buffer's byte range that owns its allocation (see
/// the module documentation). The pointer is valid for [`HostMapping::len`]
/// bytes while this value lives; writes through it only when
/// [`HostMapping::is_writable`].
pub struct HostMapping {
    ptr: NonNull<u8>,
    len: usize,
    writable: bool,
    alloc: Arc<Allocation>,
}

// SAFETY: the pointer is into memory owned by `alloc` (kept alive here);
// the value itself is only an address and counters, usable from any
// thread; accesses through the pointer follow the contract above.
unsafe impl Send for HostMapping {}
// SAFETY: see above; `&HostMapping` only reads the address.
unsafe impl Sync for HostMapping {}

impl HostMapping {
    /// The first mapped byte.
    pub fn as_ptr(&self) -> *mut u8 {
        self.ptr.as_ptr()
    }

    /// The mapped length in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// True for an empty mapping.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// True when the mapping may be written through.
    pub fn is_writable(&self) -> bool {
        self.writable
    }
}

impl Drop for HostMapping {
    fn drop(&mut self) {
        self.alloc.device.end_host_mapping(self.writable);
    }
}

impl Buffer {
    /// True when the host may write this buffer: it allows WRITE access
    /// and its storage is writable (not read-only imported memory).
    pub fn host_writable(&self) -> bool {
        self.alloc.access.contains(MemoryAccess::WRITE) && self.alloc.is_writable()
    }

    /// Maps `[offset, offset+length)` (`length` may be
    /// [`super::WHOLE_BUFFER`]) for `access` (READ, or READ|WRITE) as an
    /// owned mapping counted by the host-access rule (see the module
    /// documentation): `FAILED_PRECONDITION` while conflicting device work
    /// is in flight; memory the host cannot address (device-only memory)
    /// cannot be mapped this way (`FAILED_PRECONDITION`; read it with
    /// [`Buffer::read`], which transfers).
    pub fn map_host(&self, offset: u64, length: u64, access: MemoryAccess) -> Result<HostMapping> {
        let (off, len) = self.check_host(access, offset, length)?;
        if self.alloc.device_only().is_some() {
            bail!(
                FailedPrecondition,
                "buffer is device-only memory ({} bytes) without a host address; copy it to the host instead of mapping it",
                self.alloc.len
            );
        }
        let write = access.contains(MemoryAccess::WRITE);
        self.alloc.device.begin_host_mapping(write)?;
        // In bounds: `check_host` checked the range against the allocation.
        let ptr = self.alloc.base_ptr().wrapping_add(off as usize);
        Ok(HostMapping {
            ptr: NonNull::new(ptr).unwrap_or(NonNull::dangling()),
            len: len as usize,
            writable: write,
            alloc: self.alloc.clone(),
        })
    }
}

#[cfg(test)]
mod tests {
    use crate::allocator::{Allocator, BufferParams, HeapAllocator};
    use crate::memory::MemoryAccess;
    use ferrite_base::StatusCode;

    #[test]
    fn owned_mappings_follow_the_host_access_rule() {
        let b = HeapAllocator::new()
            .allocate(&BufferParams::default(), 64)
            .unwrap();
        let rw = MemoryAccess::READ | MemoryAccess::WRITE;
        // Refused while device work may write; a read-only mapping is
        // allowed beside device readers, a writable one is not.
        {
            let w = b.begin_device_use(true).unwrap();
            let e = b.map_host(0, 64, MemoryAccess::READ).err().unwrap();
            assert_eq!(e.code(), StatusCode::FailedPrecondition, "{e}");
            drop(w);
            let r = b.begin_device_use(false).unwrap();
            assert!(b.map_host(0, 64, MemoryAccess::READ).is_ok());
            let e = b.map_host(0, 64, rw).err().unwrap();
            assert_eq!(e.code(), StatusCode::FailedPrecondition, "{e}");
            drop(r);
        }
        // While a writable mapping lives, device readers and writers are
        // refused; several mappings coexist and host accessors still work.
        let m = b.map_host(8, 16, rw).unwrap();
        assert_eq!(m.len(), 16);
        assert!(m.is_writable());
        let m2 = b.map_host(0, 64, MemoryAccess::READ).unwrap();
        for write in [true, false] {
            let e = b.begin_device_use(write).err().unwrap();
            assert_eq!(e.code(), StatusCode::FailedPrecondition, "{e}");
        }
        b.write(0, &[1, 2]).unwrap();
        drop(m);
        // A read-only mapping refuses device writers only.
        assert!(b.begin_device_use(false).is_ok());
        assert!(b.begin_device_use(true).is_err());
        drop(m2);
        assert!(b.begin_device_use(true).is_ok());
        // Ranges and access are checked.
        assert_eq!(
            b.map_host(60, 8, MemoryAccess::READ).err().unwrap().code(),
            StatusCode::OutOfRange
        );
    }
}
