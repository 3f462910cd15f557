//! The counts of device work in flight on one allocation (and of owned
//! host mappings) that host access checks, and device uses count on: the
//! rule in the `buffer` module docs. Apart from the device-use handles
//! (`device_use`), which hold the allocation that holds these counts.

use std::sync::atomic::{fence, AtomicUsize, Ordering};

use ferrite_base::{bail, Result};
use parking_lot::RwLock;

/// Device work in flight on one allocation: counts of device users that
/// may write it and that only read it. Host accessors take the allocation's
/// lock and then check these; a device use counts itself and then checks
/// the lock. Both sides put a sequentially consistent fence between their
/// own step and the check, so of a host access and a device use that start
/// together at least one sees the other and is refused: they never overlap.
///
/// Owned host mappings ([`Buffer::map_host`], handed to Python and other
/// foreign holders that cannot keep a lock guard) are counted here too:
/// `host_mapped` of any access and `host_mapped_writable` of those that may
/// write, checked by device uses in the same fenced way.
#[derive(Default)]
pub(super) struct DeviceUsers {
    pub(super) writers: AtomicUsize,
    pub(super) readers: AtomicUsize,
    pub(super) host_mapped: AtomicUsize,
    pub(super) host_mapped_writable: AtomicUsize,
}

/// Why a device use was refused (see [`DeviceUsers::check_counted`]).
#[cold]
#[inline(never)]
pub(super) fn conflict_error(write: bool) -> ferrite_base::Status {
    ferrite_base::status!(
        FailedPrecondition,
        "buffer is mapped or accessed by the host while device work would {} it; host access must be ordered before the work (wait on its fences)",
        if write { "write" } else { "read" }
    )
}

impl DeviceUsers {
    pub(super) fn counter(&self, write: bool) -> &AtomicUsize {
        if write {
            &self.writers
        } else {
            &self.readers
        }
    }

    /// Starts a device use, unless the host holds a conflicting lock (any
    /// lock for a writer, the write lock for a reader).
    pub(super) fn begin(&self, lock: &RwLock<()>, write: bool) -> Result<()> {
        self.count(write);
        fence(Ordering::SeqCst);
        self.check_counted(lock, write)
    }

    /// The first step of [`DeviceUsers::begin`]: counts the use. Until a
    /// sequentially consistent fence and [`DeviceUsers::check_counted`]
    /// follow, the use is not begun (several uses may share the fence).
    pub(super) fn count(&self, write: bool) {
        self.counter(write).fetch_add(1, Ordering::SeqCst);
    }

    /// The last step of [`DeviceUsers::begin`], after the fence that
    /// follows [`DeviceUsers::count`]: refuses (and ends the counted use)
    /// while the host holds a conflicting lock or mapping.
    pub(super) fn check_counted(&self, lock: &RwLock<()>, write: bool) -> Result<()> {
        if self.conflicts(lock, write) {
            self.end(write);
            return Err(conflict_error(write));
        }
        Ok(())
    }

    /// Whether the host holds a lock or mapping that a device use counted
    /// (and fenced, see [`DeviceUsers::check_counted`]) must not overlap.
    #[inline]
    pub(super) fn conflicts(&self, lock: &RwLock<()>, write: bool) -> bool {
        if write {
            lock.is_locked() || self.host_mapped.load(Ordering::SeqCst) != 0
        } else {
            lock.is_locked_exclusive() || self.host_mapped_writable.load(Ordering::SeqCst) != 0
        }
    }

    pub(super) fn end(&self, write: bool) {
        self.counter(write).fetch_sub(1, Ordering::SeqCst);
    }

    /// With the shared lock held: refuses while device work may write.
    pub(super) fn host_may_read(&self) -> Result<()> {
        fence(Ordering::SeqCst);
        if self.writers.load(Ordering::SeqCst) != 0 {
            bail!(
                FailedPrecondition,
                "buffer is in use by device work that may write it (a dispatch in flight); wait on the work's fence before host access"
            );
        }
        Ok(())
    }

    /// With the exclusive lock held: refuses while any device work uses it.
    pub(super) fn host_may_write(&self) -> Result<()> {
        self.host_may_read()?;
        if self.readers.load(Ordering::SeqCst) != 0 {
            bail!(
                FailedPrecondition,
                "buffer is in use by device work that reads it (a dispatch in flight); wait on the work's fence before host writes"
            );
        }
        Ok(())
    }
}
