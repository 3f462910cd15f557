//! Transfers that run as device work: a queue's fill, update, copy and
//! read, and the same commands inside a command buffer.
//!
//! Such a transfer is ordered with the device's other work by the queue
//! (wait fences, barriers between command-buffer stages), exactly as a
//! dispatch is, so it counts as a device user of the allocations it touches
//! ([`Buffer::binding_range_resolved`]), not as host access. The host-access
//! rule ("a host read or mapping while device work may write is refused")
//! is about the host racing the device; a transfer racing a dispatch of the
//! same program on other bytes of one allocation is the device's own,
//! program-ordered concurrency, which the host accessors would wrongly
//! refuse. A transfer is still refused while the host holds a conflicting
//! mapping of the allocation, as a dispatch is.
//!
//! Bytes are moved through raw pointers (never a Rust reference over the
//! range), because device work not ordered against this transfer may touch
//! other bytes of the same allocation at the same time.
//!
//! Memory the host cannot address (another driver's device memory) goes
//! through that driver's synchronous transfers, as the host accessors do.

use ferrite_base::{bail, status, Result};

use super::Buffer;
use crate::memory::MemoryAccess;

impl Buffer {
    /// Fills `[offset, offset+length)` (`length` may be
    /// [`super::WHOLE_BUFFER`]) with a repeated 1, 2, 4 or 8 byte `pattern`,
    /// as device work (see the module documentation).
    pub fn device_fill(&self, offset: u64, length: u64, pattern: &[u8]) -> Result<()> {
        let p = pattern.len() as u64;
        if !matches!(p, 1 | 2 | 4 | 8) {
            bail!(
                InvalidArgument,
                "fill patterns must be 1, 2, 4 or 8 bytes (got {p})"
            );
        }
        let (off, len) = self.resolve_range(offset, length)?;
        if !off.is_multiple_of(p) || !len.is_multiple_of(p) {
            bail!(
                InvalidArgument,
                "attempting to fill a range with {p} byte values that is not aligned (offset={offset}, length={len})"
            );
        }
        if self.host_unaddressable() {
            return self.fill(offset, length, pattern);
        }
        if len == 0 {
            return Ok(());
        }
        let range = self.binding_range_resolved(off, len, MemoryAccess::WRITE)?;
        let dst = range.as_ptr();
        let len = range.len();
        let p = p as usize;
        // SAFETY: `range` is a checked, writable range of `len` bytes of a
        // live allocation (the buffer is borrowed for the call) and counts
        // as device work on it, so no host reference to these bytes exists
        // (host access is refused meanwhile); device work running at the
        // same time touches other bytes (queue ordering, as for dispatches).
        // The pattern is written once, then the filled prefix is doubled
        // with non-overlapping copies inside the range.
        unsafe {
            if p == 1 {
                std::ptr::write_bytes(dst, pattern[0], len);
            } else {
                std::ptr::copy_nonoverlapping(pattern.as_ptr(), dst, p);
                let mut filled = p;
                while filled < len {
                    let n = filled.min(len - filled);
                    std::ptr::copy_nonoverlapping(dst, dst.add(filled), n);
                    filled += n;
                }
            }
        }
        Ok(())
    }

    /// Writes `src` at `offset`, as device work (a queue update).
    pub fn device_write(&self, offset: u64, src: &[u8]) -> Result<()> {
        let (off, len) = self.resolve_range(offset, src.len() as u64)?;
        if self.host_unaddressable() {
            return self.write(offset, src);
        }
        if len == 0 {
            return Ok(());
        }
        let range = self.binding_range_resolved(off, len, MemoryAccess::WRITE)?;
        // SAFETY: a checked writable range of `src.len()` bytes counted as
        // device work (see `device_fill`); `src` is a Rust slice, which
        // cannot overlap memory no reference may point into.
        unsafe { std::ptr::copy_nonoverlapping(src.as_ptr(), range.as_ptr(), range.len()) };
        Ok(())
    }

    /// Reads `dst.len()` bytes at `offset` into `dst`, as device work (e.g.
    /// an indirect dispatch's workgroup count, written by an earlier stage).
    pub fn device_read(&self, offset: u64, dst: &mut [u8]) -> Result<()> {
        let (off, len) = self.resolve_range(offset, dst.len() as u64)?;
        if self.host_unaddressable() {
            return self.read(offset, dst);
        }
        if len == 0 {
            return Ok(());
        }
        let range = self.binding_range_resolved(off, len, MemoryAccess::READ)?;
        // SAFETY: a checked readable range of `dst.len()` bytes counted as
        // device work; no device work writes it meanwhile (queue ordering),
        // and `dst` is an exclusive Rust slice outside it.
        unsafe { std::ptr::copy_nonoverlapping(range.as_ptr(), dst.as_mut_ptr(), range.len()) };
        Ok(())
    }

    /// Copies `length` bytes from `src` at `src_offset` to `dst` at
    /// `dst_offset` (`length` may be [`super::WHOLE_BUFFER`]: the rest of
    /// `src`), as device work. Overlapping ranges of one allocation are
    /// handled (memmove semantics).
    pub fn device_copy(
        src: &Buffer,
        src_offset: u64,
        dst: &Buffer,
        dst_offset: u64,
        length: u64,
    ) -> Result<()> {
        let (s_off, len) = src.resolve_range(src_offset, length)?;
        let (d_off, _) = dst.resolve_range(dst_offset, len)?;
        if src.host_unaddressable() || dst.host_unaddressable() {
            return Buffer::copy(src, src_offset, dst, dst_offset, len);
        }
        if len == 0 {
            return Ok(());
        }
        let from = src.binding_range_resolved(s_off, len, MemoryAccess::READ)?;
        let to = dst.binding_range_resolved(d_off, len, MemoryAccess::WRITE)?;
        let n = usize::try_from(len)
            .map_err(|_| status!(ResourceExhausted, "copy of {len} bytes"))?;
        // SAFETY: both ranges were checked against their live allocations
        // (borrowed for the call) and count as device work, so no host
        // reference covers them; `ptr::copy` allows the ranges to overlap
        // (a copy within one allocation).
        unsafe { std::ptr::copy(from.as_ptr(), to.as_ptr(), n) };
        Ok(())
    }

    /// True when the host has no address for this buffer's memory (another
    /// driver's device memory): transfers go through the driver instead.
    fn host_unaddressable(&self) -> bool {
        self.alloc.device_only().is_some()
    }
}
