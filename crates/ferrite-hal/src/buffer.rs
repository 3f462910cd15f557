//! HAL buffers: a byte range of a host-memory allocation.
//!
//! A [`Buffer`] is a cheap handle (`Clone` shares it): an `Arc` of the
//! allocation plus the byte range this buffer covers. Subspans share the
//! allocation, so a subspan of a subspan still points at the one allocation
//! with the offsets added. The memory type, allowed usage and allowed access
//! are those the allocation was made with.
//!
//! # Memory and locking
//!
//! Allocation memory is either an owned, zero-initialized, 64-byte-aligned
//! heap block, an owned `Vec<u8>` (writable import), or read-only bytes kept
//! alive by an owner object (`Arc<dyn AsRef<[u8]>>`, e.g. a module's
//! `ModuleBytes`).
//!
//! Host access through this API ([`Buffer::read`], [`Buffer::write`],
//! [`Buffer::fill`], [`Buffer::copy`], [`Buffer::map_read`],
//! [`Buffer::map_write`]) goes through a reader/writer lock per allocation:
//! readers share it, writers are exclusive. A thread holding a mapping must
//! not start a conflicting access to the same allocation (it would wait for
//! itself).
//!
//! Devices get raw pointers instead, which take no lock:
//! [`Buffer::device_binding`] (a [`BindingPtr`] that keeps the allocation
//! alive) and [`Buffer::binding_range_resolved`] (a [`DeviceRange`]
//! borrowing the buffer). Both count as device work in flight on the
//! allocation while they live: host access that would race with them (a
//! read or mapping while device work may write, a write while any device
//! work uses the allocation) is refused with `FAILED_PRECONDITION`, and a
//! device use is refused while the host holds a conflicting mapping. So
//! host access through this API never overlaps device work on the same
//! allocation, however the program orders them; programs order them with
//! fences, as upstream, and a missing wait is an error instead of a race.
//!
//! Queue transfers (a queue's fill, update, copy, and the same commands in
//! a command buffer) are device work too, not host access:
//! [`Buffer::device_fill`], [`Buffer::device_write`], [`Buffer::device_copy`]
//! and [`Buffer::device_read`] count as device users while they move bytes,
//! so they run beside other device work of the same program (ordered by the
//! queue, as dispatches are) and are refused only while the host maps the
//! allocation.
//!
//! What remains the pointer users' contract (the CPU driver is the only
//! `unsafe` user): concurrent device writers (workgroups of one dispatch,
//! or dispatches not ordered against each other) touch disjoint bytes, as
//! the compiled program assigns them, and a pointer without write access is
//! never written through. [`Buffer::binding_ptr`] is the untracked form for
//! handing memory to a foreign owner (DLPack, the buffer protocol) under
//! that owner's contract.
//!
//! # Device memory
//!
//! A driver whose memory the host cannot address (a GPU's device-local
//! memory) wraps it as [`DeviceMemory`] ([`Buffer::from_device_memory`]).
//! Such buffers have no binding pointer; host access through this API goes
//! through the driver's synchronous transfers ([`DeviceMemory::read`],
//! [`DeviceMemory::write`]), so tools and bindings that read results with
//! [`Buffer::map_read`] work unchanged on every device (upstream's
//! `iree_hal_device_transfer_d2h`). Callers order such accesses with device
//! work by waiting on the work's fence first, as for host memory. Device
//! memory that also has a host mapping ([`DeviceMemory::host_ptr`], e.g.
//! pinned host memory) is accessed through the mapping like host memory.
//!
//! # Layout
//!
//! This module holds the [`Buffer`] handle, its ranges, checks and host
//! copies. Beside it: `storage` (the allocation and the memory it
//! owns), `device_use` (the device-use counters and the pointers, ranges
//! and uses counted on them), `mapping` (scoped host mappings),
//! `host_mapping` (owned host mappings) and `transfer` (queue transfers as
//! device work).

use std::fmt;
use std::sync::Arc;

use ferrite_base::RefObject;
use ferrite_base::{bail, status, Result};

use crate::memory::{BufferUsage, MemoryAccess, MemoryType};

mod device_use;
mod device_users;
mod handle;
mod host_mapping;
mod mapping;
mod storage;
mod transfer;

pub use device_use::{binding_ranges_resolved, BindingPtr, DeviceRange, DeviceUse};
pub use handle::Buffer;
pub use host_mapping::HostMapping;
pub use mapping::{MappedRead, MappedWrite};
pub use storage::{
    check_device_range, ConstantBytes, DeviceMemory, ForeignBytes, HostMemory, ALLOCATION_ALIGNMENT,
};
pub(crate) use storage::{Allocation, AllocationHome, HeapBlock, Storage};

use storage::LockHeld;

/// A length meaning "from the offset to the end of the buffer".
pub const WHOLE_BUFFER: u64 = u64::MAX;

impl RefObject for Buffer {
    fn type_name(&self) -> &'static str {
        "hal.buffer"
    }
}

impl fmt::Debug for Buffer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "Buffer(offset={}, length={}, allocation_size={}, type={}, usage={}, access={})",
            self.offset,
            self.length,
            self.alloc.len,
            self.alloc.memory_type,
            self.alloc.usage,
            self.alloc.access
        )
    }
}

/// How two buffer ranges overlap (upstream's `iree_hal_buffer_overlap_t`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Overlap {
    /// No byte in common.
    Disjoint,
    /// Some bytes in common.
    Partial,
    /// Exactly the same bytes.
    Complete,
}

impl Buffer {
    pub(crate) fn from_allocation(alloc: Allocation) -> Buffer {
        let length = alloc.len;
        Buffer {
            alloc: Arc::new(alloc),
            offset: 0,
            length,
        }
    }

    /// Wraps driver-owned memory (see [`DeviceMemory`]) as a buffer of
    /// `memory.len()` bytes with the given type, usage and access.
    pub fn from_device_memory(
        memory: Box<dyn DeviceMemory>,
        memory_type: MemoryType,
        usage: BufferUsage,
        access: MemoryAccess,
    ) -> Buffer {
        let len = memory.len();
        Buffer::from_allocation(Allocation::new(
            Storage::Device(memory),
            len,
            memory_type,
            usage,
            access,
            None,
            false,
        ))
    }

    /// The driver memory behind this buffer, if a driver made it with
    /// [`Buffer::from_device_memory`] (drivers downcast it to find device
    /// addresses; add [`Buffer::byte_offset`]).
    pub fn device_memory(&self) -> Option<&dyn DeviceMemory> {
        match &self.alloc.storage {
            Storage::Device(d) => Some(&**d),
            _ => None,
        }
    }

    /// Bytes this buffer covers.
    pub fn byte_length(&self) -> u64 {
        self.length
    }

    /// Offset of this buffer in its allocation.
    pub fn byte_offset(&self) -> u64 {
        self.offset
    }

    /// Size of the whole underlying allocation.
    pub fn allocation_size(&self) -> u64 {
        self.alloc.len
    }

    /// The memory type the allocation was made with.
    pub fn memory_type(&self) -> MemoryType {
        self.alloc.memory_type
    }

    /// The usages the allocation allows.
    pub fn allowed_usage(&self) -> BufferUsage {
        self.alloc.usage
    }

    /// The accesses the allocation allows.
    pub fn allowed_access(&self) -> MemoryAccess {
        self.alloc.access
    }

    /// An identity of the underlying allocation, unique while it lives
    /// (its address; profiles pair a queue allocation with its release).
    pub fn allocation_id(&self) -> u64 {
        Arc::as_ptr(&self.alloc) as usize as u64
    }

    /// True when both buffers share one allocation.
    pub fn same_allocation(&self, other: &Buffer) -> bool {
        Arc::ptr_eq(&self.alloc, &other.alloc)
    }

    /// True when both handles cover the same bytes of the same allocation.
    pub fn same_range(&self, other: &Buffer) -> bool {
        self.same_allocation(other) && self.offset == other.offset && self.length == other.length
    }

    /// A buffer over `[offset, offset + length)` of this one, sharing the
    /// allocation. `length` may be [`WHOLE_BUFFER`].
    pub fn subspan(&self, offset: u64, length: u64) -> Result<Buffer> {
        let (off, len) = self.resolve_range(offset, length)?;
        Ok(Buffer {
            alloc: self.alloc.clone(),
            offset: self.offset + off,
            length: len,
        })
    }

    /// Resolves `(offset, length)` within this buffer (`WHOLE_BUFFER`
    /// allowed) or fails with `OUT_OF_RANGE` naming the numbers.
    pub fn resolve_range(&self, offset: u64, length: u64) -> Result<(u64, u64)> {
        let max = self.length;
        if offset > max {
            bail!(
                OutOfRange,
                "attempted to access an address off the end of the valid buffer range (offset={offset}, length={}, buffer byte_length={max})",
                fmt_len(length)
            );
        }
        let length = if length == WHOLE_BUFFER {
            max - offset
        } else {
            length
        };
        if length == 0 {
            return Ok((offset, 0));
        }
        match offset.checked_add(length) {
            Some(end) if end <= max => Ok((offset, length)),
            _ => bail!(
                OutOfRange,
                "attempted to access an address outside of the valid buffer range (offset={offset}, length={length}, end(inc)={}, buffer byte_length={max})",
                offset as u128 + length as u128 - 1
            ),
        }
    }

    /// Fails with `PERMISSION_DENIED` unless the buffer's memory type has all
    /// of `required`.
    pub fn validate_memory_type(&self, required: MemoryType) -> Result<()> {
        let actual = self.alloc.memory_type;
        if !actual.contains(required) {
            bail!(
                PermissionDenied,
                "buffer memory type is not compatible with the requested operation; buffer has {actual}, operation requires {required}"
            );
        }
        Ok(())
    }

    /// Fails with `PERMISSION_DENIED` unless the buffer allows `required`
    /// access (`ANY` always passes; a request without READ or WRITE is
    /// `INVALID_ARGUMENT`).
    pub fn validate_access(&self, required: MemoryAccess) -> Result<()> {
        let allowed = self.alloc.access;
        if required.contains(MemoryAccess::ANY) {
            return Ok(());
        }
        if !required.intersects(MemoryAccess::READ | MemoryAccess::WRITE) {
            bail!(
                InvalidArgument,
                "memory access must specify one or more of _READ or _WRITE"
            );
        }
        if !allowed.contains(required) {
            bail!(
                PermissionDenied,
                "buffer does not support the requested access type; buffer allows {allowed}, operation requires {required}"
            );
        }
        Ok(())
    }

    /// The access checks shared by host mappings and device bindings: the
    /// buffer's allowed access ([`Buffer::validate_access`]), then the
    /// storage: WRITE needs writable storage, and ANY (the executable does
    /// not say whether the kernel writes, as for CPU executables) needs
    /// writable storage or a program constant (no dispatch writes those).
    fn check_storage_access(&self, access: MemoryAccess) -> Result<()> {
        self.validate_access(access)?;
        if access.contains(MemoryAccess::WRITE) && !self.alloc.is_writable() {
            bail!(PermissionDenied, "buffer wraps read-only host memory");
        }
        if access.contains(MemoryAccess::ANY)
            && !self.alloc.is_writable()
            && !self.alloc.is_constant()
        {
            bail!(
                PermissionDenied,
                "buffer wraps read-only host memory that is not a program constant, and the kernel may write it"
            );
        }
        Ok(())
    }

    /// Fails with `PERMISSION_DENIED` unless the buffer allows `required`
    /// usage.
    pub fn validate_usage(&self, required: BufferUsage) -> Result<()> {
        let allowed = self.alloc.usage;
        if !allowed.contains(required) {
            bail!(
                PermissionDenied,
                "requested usage was not specified when the buffer was allocated; buffer allows {allowed}, operation requires {required}"
            );
        }
        Ok(())
    }

    /// Checks a host mapping of `[offset, offset+length)` with `access` and
    /// returns the absolute allocation range.
    fn check_host(&self, access: MemoryAccess, offset: u64, length: u64) -> Result<(u64, u64)> {
        if self.alloc.device_only().is_none() {
            // Device-only memory is reached through transfers instead.
            self.validate_memory_type(MemoryType::HOST_VISIBLE)?;
            self.validate_usage(BufferUsage::MAPPING_SCOPED)?;
        }
        self.check_storage_access(access)?;
        let (off, len) = self.resolve_range(offset, length)?;
        Ok((self.offset + off, len))
    }

    /// Foreign memory (imported from outside Rust, e.g. a numpy array) may be
    /// written by its owner at any time, so it is never borrowed as a Rust
    /// slice: it is read and written by copies ([`Buffer::read`],
    /// [`Buffer::write`]) only.
    fn refuse_foreign_mapping(&self) -> Result<()> {
        if let Storage::Foreign(_) = &self.alloc.storage {
            bail!(
                FailedPrecondition,
                "buffer wraps foreign host memory, which is not mapped as a Rust slice; use read/write (copies) instead"
            );
        }
        Ok(())
    }

    /// Copies `dst.len()` bytes starting at `offset` into `dst`.
    pub fn read(&self, offset: u64, dst: &mut [u8]) -> Result<()> {
        let (off, len) = self.check_host(MemoryAccess::READ, offset, dst.len() as u64)?;
        if let Some(d) = self.alloc.device_only() {
            self.alloc.device.host_may_read()?;
            return d.read(off, dst);
        }
        let g = LockHeld(self.alloc.lock.read());
        self.alloc.device.host_may_read()?;
        if let Storage::Foreign(_) = &self.alloc.storage {
            if len > 0 {
                // SAFETY: foreign storage is valid for `self.alloc.len` bytes
                // and the range was checked; the copy goes through raw
                // pointers, so no reference claims the bytes are unchanging
                // while their owner (outside Rust) may write them.
                unsafe {
                    std::ptr::copy_nonoverlapping(
                        self.alloc.base_ptr().add(off as usize),
                        dst.as_mut_ptr(),
                        len as usize,
                    )
                };
            }
            return Ok(());
        }
        dst.copy_from_slice(self.alloc.slice(&g, off, len));
        Ok(())
    }

    /// Reads the whole buffer into a new vector.
    pub fn to_vec(&self) -> Result<Vec<u8>> {
        let mut v = vec![
            0u8;
            usize::try_from(self.length).map_err(|_| {
                status!(
                    ResourceExhausted,
                    "buffer of {} bytes does not fit host memory",
                    self.length
                )
            })?
        ];
        self.read(0, &mut v)?;
        Ok(v)
    }

    /// Copies `src` into the buffer starting at `offset`.
    pub fn write(&self, offset: u64, src: &[u8]) -> Result<()> {
        let (off, len) = self.check_host(MemoryAccess::WRITE, offset, src.len() as u64)?;
        if let Some(d) = self.alloc.device_only() {
            self.alloc.device.host_may_write()?;
            return d.write(off, src);
        }
        let g = self.alloc.lock.write();
        self.alloc.device.host_may_write()?;
        if let Storage::Foreign(_) = &self.alloc.storage {
            if len > 0 {
                // SAFETY: writable foreign storage (checked by `check_host`)
                // valid for `self.alloc.len` bytes; range checked; a raw copy,
                // no reference over memory its owner may also access.
                unsafe {
                    std::ptr::copy_nonoverlapping(
                        src.as_ptr(),
                        self.alloc.base_ptr().add(off as usize),
                        len as usize,
                    )
                };
            }
            return Ok(());
        }
        self.alloc.slice_mut(&g, off, len).copy_from_slice(src);
        Ok(())
    }

    /// Copies `len` bytes at `src` into the buffer starting at `offset`,
    /// through raw pointers: for sources that must not be borrowed as a
    /// slice, e.g. memory a foreign owner (Python) may write.
    ///
    /// # Safety
    /// `src` must be valid for reads of `len` bytes for the duration of the
    /// call and must not overlap this buffer's memory.
    // SAFETY: the caller vouches for `src` (contract above); the destination
    // is checked as in `write`.
    pub unsafe fn write_raw(&self, offset: u64, src: *const u8, len: usize) -> Result<()> {
        let (off, len) = self.check_host(MemoryAccess::WRITE, offset, len as u64)?;
        if let Some(d) = self.alloc.device_only() {
            // Memory the host cannot address (a GPU's): stage the source,
            // then the driver's transfer; there is no host address to copy to.
            let mut staged = vec![0u8; len as usize];
            if len > 0 {
                // SAFETY: `src` is valid for `len` reads (the caller's
                // contract) and `staged` is a fresh allocation of `len` bytes.
                unsafe { std::ptr::copy_nonoverlapping(src, staged.as_mut_ptr(), len as usize) };
            }
            return d.write(off, &staged);
        }
        let _g = self.alloc.lock.write();
        self.alloc.device.host_may_write()?;
        if len > 0 {
            // SAFETY: the destination range was checked against writable
            // storage valid for `self.alloc.len` bytes and is exclusively
            // locked; the source is the caller's (contract above).
            unsafe {
                std::ptr::copy_nonoverlapping(
                    src,
                    self.alloc.base_ptr().add(off as usize),
                    len as usize,
                )
            };
        }
        Ok(())
    }

    /// Fills `[offset, offset+length)` (`length` may be [`WHOLE_BUFFER`])
    /// with a repeated 1, 2, 4 or 8 byte `pattern`; offset and length must be
    /// multiples of the pattern size.
    pub fn fill(&self, offset: u64, length: u64, pattern: &[u8]) -> Result<()> {
        let p = pattern.len() as u64;
        if !matches!(p, 1 | 2 | 4 | 8) {
            bail!(
                InvalidArgument,
                "fill patterns must be 1, 2, 4 or 8 bytes (got {p})"
            );
        }
        let (off, len) = self.check_host(MemoryAccess::WRITE, offset, length)?;
        if !(off - self.offset).is_multiple_of(p) || len % p != 0 {
            bail!(
                InvalidArgument,
                "attempting to fill a range with {p} byte values that is not aligned (offset={offset}, length={len})"
            );
        }
        if let Storage::Foreign(_) = &self.alloc.storage {
            // No `&mut` over foreign memory: fill a staging copy, then copy.
            let staged = pattern.repeat(usize::try_from(len / p).unwrap_or(usize::MAX));
            return self.write(off - self.offset, &staged);
        }
        if let Some(d) = self.alloc.device_only() {
            let bytes: Vec<u8> = pattern.iter().copied().cycle().take(len as usize).collect();
            return d.write(off, &bytes);
        }
        let g = self.alloc.lock.write();
        self.alloc.device.host_may_write()?;
        for chunk in self
            .alloc
            .slice_mut(&g, off, len)
            .chunks_exact_mut(p as usize)
        {
            chunk.copy_from_slice(pattern);
        }
        Ok(())
    }

    /// Copies `length` bytes from `src` at `src_offset` to `dst` at
    /// `dst_offset`. Overlapping ranges of one allocation are handled
    /// (memmove semantics).
    pub fn copy(
        src: &Buffer,
        src_offset: u64,
        dst: &Buffer,
        dst_offset: u64,
        length: u64,
    ) -> Result<()> {
        let (s_off, len) = src.check_host(MemoryAccess::READ, src_offset, length)?;
        let (d_off, _) = dst.check_host(MemoryAccess::WRITE, dst_offset, len)?;
        if len == 0 {
            return Ok(());
        }
        let foreign = |b: &Buffer| matches!(b.alloc.storage, Storage::Foreign(_));
        if foreign(src) || foreign(dst) {
            // No references over foreign memory: stage through a copy.
            let mut staged = vec![
                0u8;
                usize::try_from(len).map_err(|_| status!(
                    ResourceExhausted,
                    "copy of {len} bytes does not fit host memory"
                ))?
            ];
            src.read(s_off - src.offset, &mut staged)?;
            return dst.write(d_off - dst.offset, &staged);
        }
        if src.alloc.device_only().is_some() || dst.alloc.device_only().is_some() {
            // Staged through the host: drivers copy device memory on their
            // queues; this is the host path's fallback.
            let mut staged = vec![0u8; len as usize];
            src.read(src_offset, &mut staged)?;
            return dst.write(dst_offset, &staged);
        }
        if src.same_allocation(dst) {
            let a = &dst.alloc;
            let g = a.lock.write();
            a.device.host_may_write()?;
            let lo = s_off.min(d_off);
            let hi = (s_off + len).max(d_off + len);
            let window = a.slice_mut(&g, lo, hi - lo);
            window.copy_within(
                (s_off - lo) as usize..(s_off - lo + len) as usize,
                (d_off - lo) as usize,
            );
            return Ok(());
        }
        // Lock in address order so concurrent copies A->B and B->A cannot
        // deadlock.
        let src_first = Arc::as_ptr(&src.alloc) < Arc::as_ptr(&dst.alloc);
        let (rg, wg);
        if src_first {
            rg = LockHeld(src.alloc.lock.read());
            wg = dst.alloc.lock.write();
        } else {
            wg = dst.alloc.lock.write();
            rg = LockHeld(src.alloc.lock.read());
        }
        src.alloc.device.host_may_read()?;
        dst.alloc.device.host_may_write()?;
        dst.alloc
            .slice_mut(&wg, d_off, len)
            .copy_from_slice(src.alloc.slice(&rg, s_off, len));
        Ok(())
    }

    /// How `[a_off, a_off+a_len)` of `a` overlaps `[b_off, b_off+b_len)` of
    /// `b` (lengths may be [`WHOLE_BUFFER`]).
    pub fn test_overlap(
        a: &Buffer,
        a_off: u64,
        a_len: u64,
        b: &Buffer,
        b_off: u64,
        b_len: u64,
    ) -> Overlap {
        if !a.same_allocation(b) {
            return Overlap::Disjoint;
        }
        let resolve = |buf: &Buffer, off: u64, len: u64| {
            let len = if len == WHOLE_BUFFER {
                buf.length.saturating_sub(off)
            } else {
                len
            };
            (buf.offset as u128 + off as u128, len as u128)
        };
        let (ao, al) = resolve(a, a_off, a_len);
        let (bo, bl) = resolve(b, b_off, b_len);
        if al == 0 || bl == 0 {
            Overlap::Disjoint
        } else if ao == bo && al == bl {
            Overlap::Complete
        } else if ao + al > bo && bo + bl > ao {
            Overlap::Partial
        } else {
            Overlap::Disjoint
        }
    }
}

fn fmt_len(length: u64) -> String {
    if length == WHOLE_BUFFER {
        "-1".to_string()
    } else {
        length.to_string()
    }
}

#[cfg(test)]
mod tests {

    /// Device memory without a host mapping: bytes reachable only through
    /// `read`/`write`, as a GPU's are.
    struct FarMemory(parking_lot::Mutex<Vec<u8>>);

    // SAFETY: no host mapping; `len` is the vector's, which never changes
    // size; read/write check their ranges.
    unsafe impl DeviceMemory for FarMemory {
        fn len(&self) -> u64 {
            self.0.lock().len() as u64
        }
        fn host_ptr(&self) -> Option<NonNull<u8>> {
            None
        }
        fn read(&self, offset: u64, dst: &mut [u8]) -> Result<()> {
            check_device_range(self.len(), offset, dst.len())?;
            let o = offset as usize;
            dst.copy_from_slice(&self.0.lock()[o..o + dst.len()]);
            Ok(())
        }
        fn write(&self, offset: u64, src: &[u8]) -> Result<()> {
            check_device_range(self.len(), offset, src.len())?;
            let o = offset as usize;
            self.0.lock()[o..o + src.len()].copy_from_slice(src);
            Ok(())
        }
        fn as_any(&self) -> &dyn std::any::Any {
            self
        }
    }

    #[test]
    fn raw_writes_into_device_only_memory_go_through_the_driver() {
        let b = Buffer::from_device_memory(
            Box::new(FarMemory(parking_lot::Mutex::new(vec![0; 16]))),
            MemoryType::DEVICE_LOCAL,
            BufferUsage::DEFAULT,
            MemoryAccess::ALL,
        );
        let src = [1u8, 2, 3, 4, 5, 6, 7, 8];
        // SAFETY: `src` is valid for 8 reads and is not the buffer's memory.
        unsafe { b.write_raw(4, src.as_ptr(), src.len()) }.unwrap();
        let mut back = [0u8; 16];
        b.read(0, &mut back).unwrap();
        assert_eq!(back, [0, 0, 0, 0, 1, 2, 3, 4, 5, 6, 7, 8, 0, 0, 0, 0]);
        // SAFETY: as above; the range is refused before any copy.
        assert!(unsafe { b.write_raw(12, src.as_ptr(), src.len()) }.is_err());
    }

    /// The device memory reachable through the safe `Buffer::device_memory`
    /// refuses ranges outside it (the contract every implementation keeps;
    /// the CUDA driver's is checked on a GPU by its own tests).
    #[test]
    fn device_memory_reached_safely_refuses_out_of_range_access() {
        let b = Buffer::from_device_memory(
            Box::new(FarMemory(parking_lot::Mutex::new(vec![0; 16]))),
            MemoryType::DEVICE_LOCAL,
            BufferUsage::DEFAULT,
            MemoryAccess::ALL,
        );
        let d = b.device_memory().unwrap();
        let e = d.write(1 << 20, &[1; 4]).unwrap_err();
        assert_eq!(e.code(), StatusCode::OutOfRange, "{e}");
        assert!(d.write(13, &[1; 4]).is_err());
        assert!(d.read(u64::MAX - 1, &mut [0; 4]).is_err());
        d.write(12, &[1; 4]).unwrap();
        assert!(check_device_range(16, 16, 0).is_ok());
        assert!(check_device_range(16, 17, 0).is_err());
    }
    use super::storage::MAPPED_BLOCK_MIN;
    use super::*;
    use crate::allocator::{Allocator, BufferParams, HeapAllocator};
    use ferrite_base::StatusCode;
    use std::ptr::NonNull;
    use std::sync::atomic::Ordering;

    fn alloc(size: u64) -> Buffer {
        HeapAllocator::new()
            .allocate(&BufferParams::default(), size)
            .unwrap()
    }

    #[test]
    fn reused_large_blocks_come_back_zeroed() {
        // A size no other test uses, so the spare found is this test's.
        let size = MAPPED_BLOCK_MIN as u64 + 4096 * 3;
        let b = alloc(size);
        b.fill(0, size, &[0xAB]).unwrap();
        let first = b
            .binding_ptr(0, WHOLE_BUFFER, MemoryAccess::READ)
            .unwrap()
            .as_ptr() as usize;
        drop(b);
        let b = alloc(size);
        let again = b
            .binding_ptr(0, WHOLE_BUFFER, MemoryAccess::READ)
            .unwrap()
            .as_ptr() as usize;
        assert_eq!(first, again, "the freed mapping is reused");
        let mut out = vec![1u8; size as usize];
        b.read(0, &mut out).unwrap();
        assert!(out.iter().all(|&x| x == 0));
    }

    #[test]
    fn read_write_and_alignment() {
        let b = alloc(100);
        let p = b.binding_ptr(0, WHOLE_BUFFER, MemoryAccess::READ).unwrap();
        assert_eq!(p.as_ptr() as usize % 64, 0);
        assert_eq!(p.len(), 100);
        b.write(10, &[1, 2, 3]).unwrap();
        let mut out = [0u8; 5];
        b.read(9, &mut out).unwrap();
        assert_eq!(out, [0, 1, 2, 3, 0]);
    }

    #[test]
    fn range_errors_name_offsets() {
        let b = alloc(16);
        let e = b.write(14, &[0; 4]).unwrap_err();
        assert_eq!(e.code(), StatusCode::OutOfRange);
        assert!(
            e.message()
                .contains("offset=14, length=4, end(inc)=17, buffer byte_length=16"),
            "{e}"
        );
        let e = b.subspan(17, 1).unwrap_err();
        assert!(
            e.message()
                .contains("offset=17, length=1, buffer byte_length=16"),
            "{e}"
        );
        let e = b.read(u64::MAX - 1, &mut [0; 4]).unwrap_err();
        assert_eq!(e.code(), StatusCode::OutOfRange);
        assert!(b.subspan(16, 0).is_ok());
    }

    #[test]
    fn subspan_of_subspan() {
        let b = alloc(64);
        let s1 = b.subspan(8, 32).unwrap();
        let s2 = s1.subspan(4, WHOLE_BUFFER).unwrap();
        assert_eq!((s2.byte_offset(), s2.byte_length()), (12, 28));
        assert!(s2.same_allocation(&b));
        s2.write(0, &[7]).unwrap();
        let mut x = [0u8];
        b.read(12, &mut x).unwrap();
        assert_eq!(x[0], 7);
        let e = s1.subspan(30, 4).unwrap_err();
        assert!(e.message().contains("buffer byte_length=32"), "{e}");
        assert_eq!(Buffer::test_overlap(&s1, 0, 4, &b, 8, 4), Overlap::Complete);
        assert_eq!(Buffer::test_overlap(&s1, 0, 4, &b, 10, 4), Overlap::Partial);
        assert_eq!(
            Buffer::test_overlap(&s1, 0, 4, &b, 12, 4),
            Overlap::Disjoint
        );
    }

    #[test]
    fn same_allocation_copy_overlapping() {
        let b = alloc(16);
        b.write(0, &[1, 2, 3, 4, 5, 6, 7, 8]).unwrap();
        let lo = b.subspan(0, 8).unwrap();
        let hi = b.subspan(2, 8).unwrap();
        Buffer::copy(&lo, 0, &hi, 0, 8).unwrap();
        assert_eq!(&b.to_vec().unwrap()[..10], &[1, 2, 1, 2, 3, 4, 5, 6, 7, 8]);
        let other = alloc(4);
        Buffer::copy(&b, 2, &other, 0, 4).unwrap();
        assert_eq!(other.to_vec().unwrap(), vec![1, 2, 3, 4]);
        assert!(Buffer::copy(&b, 14, &other, 0, 4).is_err());
    }

    #[test]
    fn fill_patterns() {
        let b = alloc(16);
        b.fill(4, 8, &[0xAB, 0xCD]).unwrap();
        let v = b.to_vec().unwrap();
        assert_eq!(
            &v[2..14],
            &[0, 0, 0xAB, 0xCD, 0xAB, 0xCD, 0xAB, 0xCD, 0xAB, 0xCD, 0, 0]
        );
        assert!(b.fill(1, 4, &[0, 0]).is_err());
        assert!(b.fill(0, 3, &[0; 3]).is_err());
        b.fill(0, WHOLE_BUFFER, &[9]).unwrap();
        assert!(b.to_vec().unwrap().iter().all(|&x| x == 9));
    }

    #[test]
    fn permissions() {
        let a = HeapAllocator::new();
        // Read-only memory cannot back a buffer dispatches may write.
        let e = a
            .import_host(
                &BufferParams::default(),
                HostMemory::ReadOnly(Arc::new(vec![1u8, 2, 3])),
            )
            .unwrap_err();
        assert_eq!(e.code(), StatusCode::PermissionDenied, "{e}");
        let read_params = BufferParams {
            usage: BufferUsage::TRANSFER
                | BufferUsage::MAPPING
                | BufferUsage::DISPATCH_STORAGE_READ,
            ..BufferParams::default()
        };
        let ro = a
            .import_host(
                &read_params,
                HostMemory::ReadOnly(Arc::new(vec![1u8, 2, 3])),
            )
            .unwrap();
        assert_eq!(ro.to_vec().unwrap(), vec![1, 2, 3]);
        let e = ro.write(0, &[1]).unwrap_err();
        assert_eq!(e.code(), StatusCode::PermissionDenied);
        assert!(
            e.message()
                .contains("buffer allows READ, operation requires WRITE"),
            "{e}"
        );
        assert!(ro.binding_ptr(0, 3, MemoryAccess::WRITE).is_err());
        let p = ro.binding_ptr(1, 2, MemoryAccess::READ).unwrap();
        assert!(!p.is_writable());
        let owned = a
            .import_host(&BufferParams::default(), HostMemory::Owned(vec![5u8; 4]))
            .unwrap();
        owned.write(0, &[1]).unwrap();
        assert_eq!(owned.to_vec().unwrap(), vec![1, 5, 5, 5]);
        let params = BufferParams {
            usage: BufferUsage::TRANSFER,
            access: MemoryAccess::READ,
            ..BufferParams::default()
        };
        let b = a.allocate(&params, 8).unwrap();
        let e = b.validate_usage(BufferUsage::DISPATCH_STORAGE).unwrap_err();
        assert!(
            e.message().contains("operation requires DISPATCH_STORAGE"),
            "{e}"
        );
    }

    /// Host access racing device work in flight on the same allocation is
    /// refused, in both orders, and allowed again once the work is done.
    #[test]
    fn host_access_racing_device_work_is_refused() {
        let b = alloc(64);
        let rw = MemoryAccess::READ | MemoryAccess::WRITE;
        // A dispatch that may write the buffer is in flight.
        let writer = b.device_binding(0, 64, rw).unwrap();
        let busy = |r: Result<()>| {
            let e = r.unwrap_err();
            assert_eq!(e.code(), StatusCode::FailedPrecondition, "{e}");
            assert!(e.message().contains("device work"), "{e}");
        };
        busy(b.map_read(0, 8).map(drop));
        busy(b.map_write(0, 8).map(drop));
        busy(b.read(0, &mut [0u8; 4]));
        busy(b.write(0, &[1]));
        busy(b.fill(0, 8, &[1]));
        busy(Buffer::copy(&b, 0, &b, 8, 8));
        // Another view of the same allocation is the same memory.
        busy(b.subspan(8, 8).unwrap().map_read(0, 8).map(drop));
        drop(writer);
        assert_eq!(b.map_read(0, 8).unwrap().len(), 8);

        // A dispatch that only reads: host reads go on, host writes wait
        // for it (refused), and mapped memory keeps the device out.
        let reader = b.device_binding(0, 64, MemoryAccess::READ).unwrap();
        assert_eq!(b.map_read(0, 8).unwrap().len(), 8);
        busy(b.map_write(0, 8).map(drop));
        drop(reader);
        {
            let _mapped = b.map_write(0, 8).unwrap();
            let e = b.device_binding(0, 64, MemoryAccess::READ).unwrap_err();
            assert_eq!(e.code(), StatusCode::FailedPrecondition, "{e}");
            assert!(e.message().contains("mapped"), "{e}");
        }
        {
            let _mapped = b.map_read(0, 8).unwrap();
            assert!(b.device_binding(0, 64, rw).is_err());
            // Reading device work may share the memory with host readers.
            drop(b.binding_range(0, 64, MemoryAccess::READ).unwrap());
        }
        // The inline form counts while it lives, too.
        let range = b.binding_range(0, 64, rw).unwrap();
        busy(b.map_read(0, 8).map(drop));
        drop(range);
        b.write(0, &[7]).unwrap();
    }

    /// Threads mapping and writing while device uses come and go never see
    /// both at once: every host access either succeeds alone or is refused.
    #[test]
    fn racing_device_use_and_host_mapping_never_overlap() {
        let b = alloc(4096);
        let rw = MemoryAccess::READ | MemoryAccess::WRITE;
        let in_device = std::sync::atomic::AtomicBool::new(false);
        let in_host = std::sync::atomic::AtomicBool::new(false);
        std::thread::scope(|s| {
            s.spawn(|| {
                for _ in 0..20_000 {
                    if let Ok(p) = b.device_binding(0, 4096, rw) {
                        in_device.store(true, Ordering::SeqCst);
                        assert!(
                            !in_host.load(Ordering::SeqCst),
                            "host mapped during device use"
                        );
                        in_device.store(false, Ordering::SeqCst);
                        drop(p);
                    }
                }
            });
            s.spawn(|| {
                for _ in 0..20_000 {
                    if let Ok(m) = b.map_write(0, 16) {
                        in_host.store(true, Ordering::SeqCst);
                        assert!(
                            !in_device.load(Ordering::SeqCst),
                            "device used a mapped buffer"
                        );
                        in_host.store(false, Ordering::SeqCst);
                        drop(m);
                    }
                }
            });
        });
    }

    #[test]
    fn mappings() {
        let b = alloc(8);
        {
            let mut m = b.map_write(2, 4).unwrap();
            m.copy_from_slice(&[1, 2, 3, 4]);
        }
        let m = b.map_read(0, WHOLE_BUFFER).unwrap();
        assert_eq!(&*m, &[0, 0, 1, 2, 3, 4, 0, 0]);
        let m2 = b.map_read(3, 1).unwrap();
        assert_eq!(m2[0], 2);
    }
}
