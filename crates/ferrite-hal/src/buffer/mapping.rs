//! Scoped host mappings ([`Buffer::map_read`], [`Buffer::map_write`]):
//! the allocation's lock held for the mapping's life, refused while device
//! work that would race them is in flight (see the `buffer` module docs).

use ferrite_base::Result;
use parking_lot::RwLockWriteGuard;

use super::handle::Buffer;
use super::storage::{Allocation, LockHeld};
use crate::memory::MemoryAccess;

impl Buffer {
    /// Maps `[offset, offset+length)` for reading (`length` may be
    /// [`WHOLE_BUFFER`](super::WHOLE_BUFFER)). Writers to the allocation wait until the mapping is
    /// dropped.
    pub fn map_read(&self, offset: u64, length: u64) -> Result<MappedRead<'_>> {
        let (off, len) = self.check_host(MemoryAccess::READ, offset, length)?;
        self.refuse_foreign_mapping()?;
        let guard = LockHeld(self.alloc.lock.read());
        if let Some(d) = self.alloc.device_only() {
            self.alloc.device.host_may_read()?;
            let mut staged = vec![0u8; len as usize];
            d.read(off, &mut staged)?;
            return Ok(MappedRead {
                data: &[],
                staged: Some(staged),
                _guard: guard,
            });
        }
        self.alloc.device.host_may_read()?;
        let data = self.alloc.slice(&guard, off, len);
        Ok(MappedRead {
            data,
            staged: None,
            _guard: guard,
        })
    }

    /// Maps `[offset, offset+length)` for writing (`length` may be
    /// [`WHOLE_BUFFER`](super::WHOLE_BUFFER)). All other host access to the allocation waits until
    /// the mapping is dropped.
    pub fn map_write(&self, offset: u64, length: u64) -> Result<MappedWrite<'_>> {
        let (off, len) = self.check_host(MemoryAccess::WRITE, offset, length)?;
        self.refuse_foreign_mapping()?;
        let guard = self.alloc.lock.write();
        if let Some(d) = self.alloc.device_only() {
            self.alloc.device.host_may_write()?;
            // Staged: read now (the caller may write part of it), written
            // back when the mapping is dropped.
            let mut staged = vec![0u8; len as usize];
            d.read(off, &mut staged)?;
            return Ok(MappedWrite {
                data: &mut [],
                staged: Some((staged, off, &self.alloc)),
                _guard: guard,
            });
        }
        self.alloc.device.host_may_write()?;
        let data = self.alloc.slice_mut(&guard, off, len);
        Ok(MappedWrite {
            data,
            staged: None,
            _guard: guard,
        })
    }
}

/// A scoped read mapping; derefs to the mapped bytes. Holds the
/// allocation's shared lock until dropped.
pub struct MappedRead<'a> {
    data: &'a [u8],
    /// The bytes copied from device-only memory (then `data` is empty).
    staged: Option<Vec<u8>>,
    _guard: LockHeld<'a>,
}

impl std::ops::Deref for MappedRead<'_> {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        match &self.staged {
            Some(v) => v,
            None => self.data,
        }
    }
}

/// A scoped write mapping; derefs (mutably) to the mapped bytes. Holds the
/// allocation's exclusive lock until dropped.
pub struct MappedWrite<'a> {
    data: &'a mut [u8],
    /// Bytes staged for device-only memory, with their allocation offset;
    /// written back on drop.
    staged: Option<(Vec<u8>, u64, &'a Allocation)>,
    _guard: RwLockWriteGuard<'a, ()>,
}

impl std::ops::Deref for MappedWrite<'_> {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        match &self.staged {
            Some((v, _, _)) => v,
            None => self.data,
        }
    }
}

impl std::ops::DerefMut for MappedWrite<'_> {
    fn deref_mut(&mut self) -> &mut [u8] {
        match &mut self.staged {
            Some((v, _, _)) => v,
            None => self.data,
        }
    }
}

impl Drop for MappedWrite<'_> {
    fn drop(&mut self) {
        if let Some((v, off, alloc)) = self.staged.take() {
            if let Some(d) = alloc.device_only() {
                if let Err(e) = d.write(off, &v) {
                    // Drop cannot return it; a failed transfer means the
                    // device is lost, which its queues report too.
                    eprintln!("ferrite: writing a mapped range back to device memory failed: {e}");
                }
            }
        }
    }
}
