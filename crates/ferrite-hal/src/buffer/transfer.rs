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

use super::handle::Buffer;
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
        if let Some(d) = self.alloc.device_only() {
            // The driver's own synchronous transfer (no host access rule:
            // this is device work).
            let bytes: Vec<u8> = pattern.iter().copied().cycle().take(len as usize).collect();
            return d.write(self.offset + off, &bytes);
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
        if let Some(d) = self.alloc.device_only() {
            return d.write(self.offset + off, src);
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
        if let Some(d) = self.alloc.device_only() {
            return d.read(self.offset + off, dst);
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
            // Staged through the host with each side's device transfer.
            let n = usize::try_from(len)
                .map_err(|_| status!(ResourceExhausted, "copy of {len} bytes"))?;
            let mut staged = vec![0u8; n];
            src.device_read(s_off, &mut staged)?;
            return dst.device_write(d_off, &staged);
        }
        if len == 0 {
            return Ok(());
        }
        let from = src.binding_range_resolved(s_off, len, MemoryAccess::READ)?;
        let to = dst.binding_range_resolved(d_off, len, MemoryAccess::WRITE)?;
        let n =
            usize::try_from(len).map_err(|_| status!(ResourceExhausted, "copy of {len} bytes"))?;
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::allocator::{Allocator, BufferParams, HeapAllocator};

    fn alloc(size: u64) -> Buffer {
        HeapAllocator::new()
            .allocate(&BufferParams::default(), size)
            .unwrap()
    }

    /// The rule upstream's reusable command buffers broke on local-task:
    /// while a dispatch of the same work is in flight on one allocation, a
    /// transfer of that work (other bytes) runs, and host access is still
    /// refused.
    #[test]
    fn transfers_run_beside_device_work_where_host_access_is_refused() {
        let b = alloc(64);
        let dispatch = b.binding_range(0, 16, MemoryAccess::ANY).unwrap();
        b.device_fill(16, 16, &[7]).unwrap();
        b.device_write(32, &[1, 2, 3, 4]).unwrap();
        Buffer::device_copy(&b, 32, &b, 48, 4).unwrap();
        let mut got = [0u8; 4];
        b.device_read(48, &mut got).unwrap();
        assert_eq!(got, [1, 2, 3, 4]);
        let host = b.fill(16, 16, &[9]).unwrap_err();
        assert!(host.to_string().contains("in use by device work"), "{host}");
        assert!(b.map_read(0, 64).is_err());
        drop(dispatch);
        let all = b.to_vec().unwrap();
        assert_eq!(&all[16..32], &[7; 16]);
        assert_eq!(&all[32..36], &[1, 2, 3, 4]);
        assert_eq!(&all[48..52], &[1, 2, 3, 4]);
    }

    /// A transfer is device work: refused while the host maps the
    /// allocation, as a dispatch is.
    #[test]
    fn transfers_wait_for_no_host_mapping() {
        let b = alloc(32);
        let map = b.map_read(0, 8).unwrap();
        assert!(b.device_fill(8, 8, &[1]).is_err());
        let mut x = [0u8; 4];
        // Reading beside a host reader is fine.
        b.device_read(0, &mut x).unwrap();
        drop(map);
        b.device_fill(8, 8, &[1]).unwrap();
    }

    #[test]
    fn fill_patterns_of_every_width_and_overlapping_copies() {
        for pattern in [
            &[0xA5u8][..],
            &[1, 2],
            &[1, 2, 3, 4],
            &[1, 2, 3, 4, 5, 6, 7, 8],
        ] {
            let b = alloc(200);
            let p = pattern.len() as u64;
            b.device_fill(p, 23 * p, pattern).unwrap();
            let all = b.to_vec().unwrap();
            let want: Vec<u8> = pattern
                .iter()
                .copied()
                .cycle()
                .take(23 * p as usize)
                .collect();
            assert_eq!(&all[p as usize..24 * p as usize], &want[..]);
            assert!(all[..p as usize].iter().all(|&x| x == 0));
            assert!(all[24 * p as usize..].iter().all(|&x| x == 0));
        }
        let b = alloc(16);
        b.write(0, &[1, 2, 3, 4, 5, 6, 7, 8]).unwrap();
        Buffer::device_copy(&b, 0, &b, 2, 8).unwrap();
        assert_eq!(&b.to_vec().unwrap()[..10], &[1, 2, 1, 2, 3, 4, 5, 6, 7, 8]);
        // Misaligned and out-of-range requests are errors, not writes.
        assert!(b.device_fill(1, 4, &[0, 0]).is_err());
        assert!(b.device_fill(0, 3, &[0, 0]).is_err());
        assert!(b.device_fill(0, 32, &[0]).is_err());
        assert!(b.device_write(14, &[0; 4]).is_err());
        assert!(Buffer::device_copy(&b, 12, &b, 0, 8).is_err());
    }
}
