//! Device use of a buffer's allocation: the pointers and ranges drivers
//! bind ([`BindingPtr`], [`DeviceRange`]) and the submission-long
//! [`DeviceUse`], all counted on the allocation's [`DeviceUsers`] so that
//! host access racing device work is refused (the rule in the `buffer`
//! module docs).

use std::fmt;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use ferrite_base::{bail, Result};

use super::device_users::DeviceUsers;
use super::handle::Buffer;
use super::storage::Allocation;
use crate::memory::MemoryAccess;

impl Buffer {
    /// A raw pointer to `[offset, offset+length)` for device use (dispatch
    /// bindings), after checking range and `access`. Takes no lock; see the
    /// module documentation for the contract users of the pointer follow.
    pub fn binding_ptr(
        &self,
        offset: u64,
        length: u64,
        access: MemoryAccess,
    ) -> Result<BindingPtr> {
        let (off, len) = self.resolve_range(offset, length)?;
        let (ptr, len) = self.checked_binding(off, len, access)?;
        Ok(BindingPtr {
            ptr,
            len,
            writable: self.alloc.is_writable()
                && access.intersects(MemoryAccess::WRITE | MemoryAccess::ANY),
            tracked: false,
            _keep: self.alloc.clone(),
        })
    }

    /// [`Buffer::binding_ptr`] for device work in flight: while the returned
    /// pointer lives the allocation counts it as a device user, and host
    /// access that would race with it ([`Buffer::map_read`] and the other
    /// host accessors) is refused rather than raced; it is refused in turn
    /// while the host holds a conflicting mapping. Drivers resolve dispatch
    /// bindings with this.
    pub fn device_binding(
        &self,
        offset: u64,
        length: u64,
        access: MemoryAccess,
    ) -> Result<BindingPtr> {
        let (off, len) = self.resolve_range(offset, length)?;
        let range = self.binding_range_resolved(off, len, access)?;
        let (ptr, len, write) = (range.ptr, range.len, range.write);
        // The use moves from the borrowed guard to the owning pointer.
        std::mem::forget(range);
        Ok(BindingPtr {
            ptr,
            len,
            writable: write,
            tracked: true,
            _keep: self.alloc.clone(),
        })
    }

    /// The address and length of `[offset, offset+length)` for `access`,
    /// checked as [`Buffer::binding_ptr`] checks it, without keeping the
    /// allocation alive: for callers that hold this buffer for as long as
    /// they use the pointer (e.g. a dispatch run inline on the submitting
    /// thread). The pointer carries the same contract as a [`BindingPtr`].
    pub fn binding_range(
        &self,
        offset: u64,
        length: u64,
        access: MemoryAccess,
    ) -> Result<DeviceRange<'_>> {
        let (off, len) = self.resolve_range(offset, length)?;
        self.binding_range_resolved(off, len, access)
    }

    /// [`Buffer::binding_range`] of a range already resolved against this
    /// buffer (by [`Buffer::resolve_range`], or a command's buffer reference
    /// resolved against its binding table): no whole-buffer lengths, and
    /// `offset + length` within the buffer, which is checked again. The
    /// range counts as device work in flight until it is dropped (see
    /// [`Buffer::device_binding`]).
    pub fn binding_range_resolved(
        &self,
        offset: u64,
        length: u64,
        access: MemoryAccess,
    ) -> Result<DeviceRange<'_>> {
        let (ptr, len) = self.checked_binding(offset, length, access)?;
        // A program constant bound where the kernel may write counts as
        // written: programs do write their constants in place
        // (HostMemory::program_constant).
        let write = access.intersects(MemoryAccess::WRITE | MemoryAccess::ANY);
        self.alloc.device.begin(&self.alloc.lock, write)?;
        Ok(DeviceRange {
            ptr,
            len,
            write,
            users: &self.alloc.device,
        })
    }

    /// Whether the allocation has no host mapping (the host reaches it only
    /// through driver copies).
    pub(crate) fn is_device_only(&self) -> bool {
        self.alloc.device_only().is_some()
    }

    /// Counts device work on this buffer's allocation (`write`: the work
    /// may write it) until the returned use ends: the HAL holds one per
    /// bound buffer for the life of a submission, so host access racing it
    /// is refused on every driver, including those whose kernels reach the
    /// memory without a host pointer (a GPU writing pinned memory).
    /// `FAILED_PRECONDITION` while the host holds a conflicting mapping.
    pub fn begin_device_use(&self, write: bool) -> Result<DeviceUse> {
        self.alloc.device.begin(&self.alloc.lock, write)?;
        Ok(DeviceUse {
            alloc: self.alloc.clone(),
            write,
            ended: AtomicBool::new(false),
        })
    }

    fn checked_binding(
        &self,
        offset: u64,
        length: u64,
        access: MemoryAccess,
    ) -> Result<(*mut u8, usize)> {
        self.check_storage_access(access)?;
        if self.alloc.device_only().is_some() {
            bail!(
                PermissionDenied,
                "buffer is device-only memory of another device ({} bytes) and has no host address for a CPU dispatch",
                self.alloc.len
            );
        }
        if offset
            .checked_add(length)
            .is_none_or(|end| end > self.length)
        {
            // Not resolved against this buffer after all: the full check
            // names the problem.
            self.resolve_range(offset, length)?;
            bail!(
                Internal,
                "range {offset}+{length} is not resolved against this buffer"
            );
        }
        let abs = (self.offset + offset) as usize;
        // `wrapping_add` keeps this safe; the result is in bounds because the
        // range was checked against the allocation.
        Ok((self.alloc.base_ptr().wrapping_add(abs), length as usize))
    }
}

/// A raw pointer to a buffer range for device execution (e.g. a CPU
/// executable's binding table). Keeps the allocation alive; never locks.
///
/// Contract for dereferencing (the one `unsafe` user is the CPU driver): the
/// pointer is valid for `len()` bytes while this value lives; accesses must be
/// ordered with host access to overlapping bytes (queue/semaphore ordering);
/// concurrent writers must write disjoint bytes; no writes unless
/// [`BindingPtr::is_writable`].
pub struct BindingPtr {
    ptr: *mut u8,
    len: usize,
    writable: bool,
    /// Counted as a device user of the allocation ([`Buffer::device_binding`]).
    tracked: bool,
    _keep: Arc<Allocation>,
}

impl Drop for BindingPtr {
    fn drop(&mut self) {
        if self.tracked {
            self._keep.device.end(self.writable);
        }
    }
}

/// A device use of a buffer's allocation held for a whole submission
/// (from [`Buffer::begin_device_use`]): while it is held, host access that
/// would race the work is refused, as for a [`BindingPtr`] from
/// [`Buffer::device_binding`]. It ends at [`DeviceUse::end`] or on drop,
/// whichever comes first.
pub struct DeviceUse {
    alloc: Arc<Allocation>,
    write: bool,
    ended: AtomicBool,
}

impl DeviceUse {
    /// Ends the use (idempotent): host access is allowed again once no other
    /// device use remains. Only atomics: callable under other locks.
    pub fn end(&self) {
        if !self.ended.swap(true, Ordering::SeqCst) {
            self.alloc.device.end(self.write);
        }
    }
}

impl Drop for DeviceUse {
    fn drop(&mut self) {
        self.end();
    }
}

impl fmt::Debug for DeviceUse {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "DeviceUse({} bytes, write={}, ended={})",
            self.alloc.len,
            self.write,
            self.ended.load(Ordering::Relaxed)
        )
    }
}

/// [`Buffer::binding_range_resolved`] of several ranges (one dispatch's
/// bindings) at once, appended to `out`: every use is counted, then one
/// sequentially consistent fence stands between all the counts and all the
/// checks against host access, where one range at a time needs a fence
/// each. The rule is the same for each range: its count comes before the
/// fence and its check after it, as the host side's lock comes before its
/// fence and its check of the counts. `ranges` yields (buffer, offset,
/// length, access) or the error of resolving that binding. On failure,
/// `Err((index, status))` names the binding that failed and `out` is as it
/// was (the uses counted here are ended).
pub fn binding_ranges_resolved<'a, I>(
    ranges: I,
    out: &mut smallvec::SmallVec<[DeviceRange<'a>; 8]>,
) -> std::result::Result<(), (usize, ferrite_base::Status)>
where
    I: IntoIterator<Item = Result<(&'a Buffer, u64, u64, MemoryAccess)>>,
{
    let start = out.len();
    // The host lock of each counted range, for the checks.
    let mut locks: smallvec::SmallVec<[&'a parking_lot::RwLock<()>; 8]> = smallvec::SmallVec::new();
    for (i, item) in ranges.into_iter().enumerate() {
        let counted = item.and_then(|(buffer, offset, length, access)| {
            let (ptr, len) = buffer.checked_binding(offset, length, access)?;
            let write = access.intersects(MemoryAccess::WRITE | MemoryAccess::ANY);
            buffer.alloc.device.count(write);
            locks.push(&buffer.alloc.lock);
            Ok(DeviceRange {
                ptr,
                len,
                write,
                users: &buffer.alloc.device,
            })
        });
        match counted {
            // Counted, not yet checked: dropping it ends the count.
            Ok(range) => out.push(range),
            Err(e) => {
                out.truncate(start);
                return Err((i, e));
            }
        }
    }
    std::sync::atomic::fence(Ordering::SeqCst);
    for (i, (range, lock)) in out[start..].iter().zip(&locks).enumerate() {
        if range.users.conflicts(lock, range.write) {
            let e = super::device_users::conflict_error(range.write);
            out.truncate(start);
            return Err((i, e));
        }
    }
    Ok(())
}

/// A checked device range of a buffer (from [`Buffer::binding_range`]),
/// counted as device work in flight until dropped; it borrows the buffer, so
/// the allocation outlives it. Dereferencing follows [`BindingPtr`]'s
/// contract.
pub struct DeviceRange<'a> {
    ptr: *mut u8,
    len: usize,
    write: bool,
    users: &'a DeviceUsers,
}

impl DeviceRange<'_> {
    /// The first byte of the range.
    pub fn as_ptr(&self) -> *mut u8 {
        self.ptr
    }

    /// Length of the range in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// True for an empty range.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
}

// SAFETY: a DeviceRange only carries an address (never dereferenced
// through it) and a shared reference to the allocation's atomic counters,
// which are Sync; moving or sharing it across threads is as safe as the
// Buffer it borrows.
unsafe impl Send for DeviceRange<'_> {}
// SAFETY: as above; `&DeviceRange` offers only the address and length.
unsafe impl Sync for DeviceRange<'_> {}

impl Drop for DeviceRange<'_> {
    fn drop(&mut self) {
        self.users.end(self.write);
    }
}

// SAFETY: the pointer targets memory owned by (or kept alive with) the held
// allocation, which is Send + Sync; synchronization of the bytes themselves
// is the documented responsibility of the dereferencing user.
unsafe impl Send for BindingPtr {}
// SAFETY: see above; `BindingPtr` itself offers no safe dereference.
unsafe impl Sync for BindingPtr {}

impl BindingPtr {
    /// The first byte of the range.
    pub fn as_ptr(&self) -> *mut u8 {
        self.ptr
    }

    /// Length of the range in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// True for an empty range.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// True when the bytes may be written through this pointer.
    pub fn is_writable(&self) -> bool {
        self.writable
    }
}

impl fmt::Debug for BindingPtr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "BindingPtr({:p}, {} bytes, writable={})",
            self.ptr, self.len, self.writable
        )
    }
}
