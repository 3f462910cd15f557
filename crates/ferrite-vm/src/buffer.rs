//! The built-in `vm.buffer` ref type: a fixed-length byte buffer.
//!
//! A [`VmBuffer`] is either *owned* (allocated by `vm.buffer.alloc`,
//! `vm.buffer.clone` or the host; mutable unless created read-only) or a
//! zero-copy *read-only view* of shared bytes such as a module's rodata.
//! Its length never changes after creation.
//!
//! # Offset units (as upstream IREE)
//!
//! - Typed loads, stores and fills (`load_*`, `store_*`, `fill_*`) take
//!   **element** offsets and element counts: `load_i32(3)` reads bytes
//!   `12..16`, `fill_i16(1, 2, v)` writes bytes `2..6`. No alignment is
//!   required of the byte position beyond being a whole element index.
//! - Byte-level operations (`read`, `write`, `copy`, `compare`, `hash`,
//!   `clone_range`) take **byte** offsets and byte lengths.
//!
//! All multi-byte values are little-endian. Out-of-bounds accesses fail with
//! `OUT_OF_RANGE`; any mutation of a read-only buffer fails with
//! `PERMISSION_DENIED` (checked before the range, as upstream does).
//!
//! # Host exports
//!
//! [`VmBuffer::export_host`] hands the host (Python's buffer protocol) a raw
//! pointer to an owned buffer's bytes. The export holds the buffer's write
//! lock for as long as it lives, so no Rust reference to the bytes exists
//! while the host may read or write them through that pointer; every VM-side
//! access meanwhile fails with `FAILED_PRECONDITION` naming the live export
//! instead of waiting for it (which would deadlock a caller that holds the
//! export and runs the VM on the same thread).

use crate::refs::RefObject;
use ferrite_base::{bail, status, Result};
use parking_lot::lock_api::ArcRwLockWriteGuard;
use parking_lot::{Mutex, RawRwLock, RwLock, RwLockReadGuard, RwLockWriteGuard};
use std::ops::Range;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Weak};
use std::time::Duration;

/// The largest buffer [`VmBuffer::new`] and [`VmBuffer::clone_range`] will
/// allocate (64 GiB); larger requests fail with `RESOURCE_EXHAUSTED`.
pub const MAX_BUFFER_LENGTH: u64 = 1 << 36;

/// Shared immutable bytes a read-only buffer views.
/// Bytes shared with a zero-copy read-only buffer view (e.g. module rodata).
pub type SharedBytes = Arc<dyn AsRef<[u8]> + Send + Sync>;

enum Storage {
    /// Owned, mutable bytes.
    Owned(Owned),
    /// A read-only view of `range` within shared bytes (no lock needed).
    Shared {
        bytes: SharedBytes,
        range: Range<usize>,
    },
}

/// Owned bytes, the lock that guards them, and the state of host exports.
struct Owned {
    /// The bytes. Reached only through this lock: VM accesses hold a guard
    /// for the length of one operation; a host export holds the write guard
    /// for its whole life.
    bytes: Arc<RwLock<Box<[u8]>>>,
    /// Length in bytes (fixed; read without the lock).
    len: usize,
    /// Export sessions alive or being set up. Non-zero means the write lock
    /// is held, or about to be, by a host export: VM accesses that find the
    /// lock taken fail instead of waiting.
    exports: Arc<AtomicUsize>,
    /// The live export session, shared by every concurrent export.
    session: Mutex<Weak<ExportSession>>,
}

/// How long a VM access waits for the lock (held by another VM access)
/// before it checks again whether a host export holds it.
const LOCK_RETRY: Duration = Duration::from_millis(1);

fn exported_error() -> ferrite_base::Status {
    status!(
        FailedPrecondition,
        "vm.buffer is exported to the host through the buffer protocol (a live memoryview or \
         numpy array over it); release the export (del the array, memoryview.release()) \
         before the VM uses the buffer"
    )
}

impl Owned {
    fn new(bytes: Box<[u8]>) -> Owned {
        Owned {
            len: bytes.len(),
            bytes: Arc::new(RwLock::new(bytes)),
            exports: Arc::new(AtomicUsize::new(0)),
            session: Mutex::new(Weak::new()),
        }
    }

    /// A shared guard for one VM access; `FAILED_PRECONDITION` while a host
    /// export holds the bytes (never waits for an export to end).
    fn read(&self) -> Result<RwLockReadGuard<'_, Box<[u8]>>> {
        loop {
            if let Some(g) = self.bytes.try_read_for(LOCK_RETRY) {
                return Ok(g);
            }
            if self.exports.load(Ordering::SeqCst) != 0 {
                return Err(exported_error());
            }
        }
    }

    /// An exclusive guard for one VM access; as [`Owned::read`].
    fn write(&self) -> Result<RwLockWriteGuard<'_, Box<[u8]>>> {
        loop {
            if let Some(g) = self.bytes.try_write_for(LOCK_RETRY) {
                return Ok(g);
            }
            if self.exports.load(Ordering::SeqCst) != 0 {
                return Err(exported_error());
            }
        }
    }
}

/// An address that may cross threads: only ever handed out, never
/// dereferenced by this module.
struct ExportPtr(*mut u8);

// SAFETY: `ExportPtr` is a plain address into bytes owned by the
// `ExportSession` that holds it (through its write guard); this module never
// dereferences it, and whoever does follows [`HostExport`]'s contract, which
// does not depend on the thread.
unsafe impl Send for ExportPtr {}
// SAFETY: as for `Send`: a shared `ExportPtr` only yields the address.
unsafe impl Sync for ExportPtr {}

/// One host export of an owned buffer: holds its write lock throughout.
struct ExportSession {
    /// Held for the session's life: no VM access (and so no Rust reference
    /// to the bytes) can exist while the host uses `ptr`.
    _guard: ArcRwLockWriteGuard<RawRwLock, Box<[u8]>>,
    /// The bytes' address, taken from the guard once, before the host saw it.
    ptr: ExportPtr,
    len: usize,
    exports: Arc<AtomicUsize>,
}

impl Drop for ExportSession {
    fn drop(&mut self) {
        // Runs before the guard (a field) is released: a VM access that then
        // finds the lock still taken waits for it rather than failing.
        self.exports.fetch_sub(1, Ordering::SeqCst);
    }
}

/// The bytes of a [`VmBuffer`] handed to the host (Python's buffer
/// protocol), from [`VmBuffer::export_host`].
///
/// Contract: [`HostExport::as_ptr`] is valid for [`HostExport::len`] bytes
/// while this value lives, and may be written only when
/// [`HostExport::is_writable`]. For an owned buffer the export holds the
/// buffer's write lock, so nothing in Rust reads or writes the bytes
/// meanwhile (VM accesses fail with `FAILED_PRECONDITION`); the holder may
/// read and write through the pointer from any thread, ordering its own
/// accesses. A read-only (shared) buffer's bytes never change.
pub struct HostExport {
    inner: ExportInner,
}

enum ExportInner {
    Owned(Arc<ExportSession>),
    Shared {
        bytes: SharedBytes,
        range: Range<usize>,
    },
}

impl HostExport {
    /// The first byte.
    pub fn as_ptr(&self) -> *mut u8 {
        match &self.inner {
            ExportInner::Owned(s) => s.ptr.0,
            ExportInner::Shared { bytes, range } => {
                (**bytes).as_ref()[range.clone()].as_ptr() as *mut u8
            }
        }
    }

    /// Length in bytes.
    pub fn len(&self) -> usize {
        match &self.inner {
            ExportInner::Owned(s) => s.len,
            ExportInner::Shared { range, .. } => range.len(),
        }
    }

    /// True for an empty buffer.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// True when the host may write through [`HostExport::as_ptr`].
    pub fn is_writable(&self) -> bool {
        matches!(self.inner, ExportInner::Owned(_))
    }
}

/// A `!vm.buffer`: a fixed-length byte buffer, mutable or read-only.
///
/// Thread-safe: owned bytes sit behind a reader/writer lock; read-only views
/// take no lock at all.
pub struct VmBuffer {
    storage: Storage,
}

// A host export may be dropped on any thread (Python releases buffers
// wherever the last reference goes): checked here, not assumed.
const _: () = {
    const fn send_sync<T: Send + Sync>() {}
    send_sync::<HostExport>();
};

impl RefObject for VmBuffer {
    fn type_name(&self) -> &'static str {
        "vm.buffer"
    }
}

impl std::fmt::Debug for VmBuffer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("VmBuffer")
            .field("length", &self.len())
            .field("mutable", &self.is_mutable())
            .finish()
    }
}

/// Validates an allocation alignment the way upstream's aligned allocator
/// does: zero (default) or a power of two.
fn check_alignment(alignment: u32) -> Result<()> {
    if alignment != 0 && !alignment.is_power_of_two() {
        bail!(
            InvalidArgument,
            "buffer alignment must be 0 or a power of two (got {alignment})"
        );
    }
    Ok(())
}

/// Allocates `length` zeroed bytes, failing softly when memory is short.
fn alloc_zeroed(length: u64) -> Result<Box<[u8]>> {
    if length > MAX_BUFFER_LENGTH {
        bail!(
            ResourceExhausted,
            "buffer length {length} exceeds the maximum of {MAX_BUFFER_LENGTH} bytes"
        );
    }
    let n = length as usize;
    let mut v: Vec<u8> = Vec::new();
    if v.try_reserve_exact(n).is_err() {
        bail!(
            ResourceExhausted,
            "failed to allocate a buffer of {length} bytes"
        );
    }
    v.resize(n, 0);
    Ok(v.into_boxed_slice())
}

/// `offset + length` as a checked byte range within `buffer_length`.
fn byte_range(what: &str, offset: u64, length: u64, buffer_length: u64) -> Result<Range<usize>> {
    match offset.checked_add(length) {
        Some(end) if end <= buffer_length => Ok(offset as usize..end as usize),
        _ => Err(status!(
            OutOfRange,
            "buffer {what} of {length} bytes at offset {offset} out of range (length {buffer_length})"
        )),
    }
}

/// The byte range of `count` elements of `size` bytes starting at element
/// `element_offset`, checked against `buffer_length`.
fn element_range(
    what: &str,
    element_offset: u64,
    count: u64,
    size: u64,
    buffer_length: u64,
) -> Result<Range<usize>> {
    let start = element_offset.checked_mul(size);
    let len = count.checked_mul(size);
    match (start, len) {
        (Some(start), Some(len)) => match start.checked_add(len) {
            Some(end) if end <= buffer_length => Ok(start as usize..end as usize),
            _ => Err(status!(
                OutOfRange,
                "buffer {what} of {len} bytes at offset {start} (element {element_offset}) out of range (length {buffer_length})"
            )),
        },
        _ => Err(status!(
            OutOfRange,
            "buffer {what} of {count} {size}-byte elements at element offset {element_offset} out of range (length {buffer_length})"
        )),
    }
}

fn read_only_error() -> ferrite_base::Status {
    status!(
        PermissionDenied,
        "buffer is read-only and cannot be mapped for mutation"
    )
}

macro_rules! typed_load {
    ($(#[$doc:meta])* $name:ident, $ty:ty, $out:ty, $conv:expr) => {
        $(#[$doc])*
        pub fn $name(&self, element_offset: u64) -> Result<$out> {
            const N: usize = std::mem::size_of::<$ty>();
            let mut b = [0u8; N];
            self.with_bytes(|bytes| -> Result<()> {
                let r = element_range("load", element_offset, 1, N as u64, bytes.len() as u64)?;
                b.copy_from_slice(&bytes[r]);
                Ok(())
            })??;
            let conv: fn($ty) -> $out = $conv;
            Ok(conv(<$ty>::from_le_bytes(b)))
        }
    };
}

macro_rules! typed_store {
    ($(#[$doc:meta])* $name:ident, $in:ty, $ty:ty) => {
        $(#[$doc])*
        pub fn $name(&self, element_offset: u64, value: $in) -> Result<()> {
            const N: usize = std::mem::size_of::<$ty>();
            let b = (value as $ty).to_le_bytes();
            self.with_bytes_mut(|bytes| {
                let r = element_range("store", element_offset, 1, N as u64, bytes.len() as u64)?;
                bytes[r].copy_from_slice(&b);
                Ok(())
            })
        }
    };
}

macro_rules! typed_fill {
    ($(#[$doc:meta])* $name:ident, $in:ty, $ty:ty) => {
        $(#[$doc])*
        pub fn $name(&self, element_offset: u64, element_count: u64, value: $in) -> Result<()> {
            const N: usize = std::mem::size_of::<$ty>();
            let b = (value as $ty).to_le_bytes();
            self.with_bytes_mut(|bytes| {
                let r = element_range("fill", element_offset, element_count, N as u64, bytes.len() as u64)?;
                if N == 1 {
                    bytes[r].fill(b[0]);
                } else {
                    for chunk in bytes[r].chunks_exact_mut(N) {
                        chunk.copy_from_slice(&b);
                    }
                }
                Ok(())
            })
        }
    };
}

impl VmBuffer {
    /// Allocates a zero-filled mutable buffer of `length` bytes.
    ///
    /// `alignment` must be 0 (default) or a power of two
    /// (`INVALID_ARGUMENT` otherwise); storage is byte-addressed, so the
    /// alignment is validated but does not change behaviour. Lengths above
    /// [`MAX_BUFFER_LENGTH`] or that cannot be allocated fail with
    /// `RESOURCE_EXHAUSTED`.
    pub fn new(length: u64, alignment: u32) -> Result<VmBuffer> {
        check_alignment(alignment)?;
        Ok(VmBuffer {
            storage: Storage::Owned(Owned::new(alloc_zeroed(length)?)),
        })
    }

    /// Wraps `data`; mutable or read-only as asked. Read-only buffers are
    /// stored without a lock.
    pub fn from_vec(data: Vec<u8>, mutable: bool) -> VmBuffer {
        let storage = if mutable {
            Storage::Owned(Owned::new(data.into_boxed_slice()))
        } else {
            let len = data.len();
            Storage::Shared {
                bytes: Arc::new(data),
                range: 0..len,
            }
        };
        VmBuffer { storage }
    }

    /// A zero-copy read-only view of `range` within `bytes` (module rodata).
    /// Fails with `OUT_OF_RANGE` if the range is reversed or exceeds `bytes`.
    pub fn from_shared(bytes: SharedBytes, range: Range<usize>) -> Result<VmBuffer> {
        let total = (*bytes).as_ref().len();
        if range.start > range.end || range.end > total {
            bail!(
                OutOfRange,
                "read-only buffer view {}..{} out of range of {} shared bytes",
                range.start,
                range.end,
                total
            );
        }
        Ok(VmBuffer {
            storage: Storage::Shared { bytes, range },
        })
    }

    /// The shared bytes and the range of them this buffer views, when it is
    /// a read-only view (module rodata): lets a consumer keep the bytes alive
    /// and use them in place (e.g. a HAL import without a copy). `None` for
    /// owned (mutable) buffers.
    pub fn shared_view(&self) -> Option<(&SharedBytes, Range<usize>)> {
        match &self.storage {
            Storage::Shared { bytes, range } => Some((bytes, range.clone())),
            Storage::Owned(_) => None,
        }
    }

    /// Length in bytes.
    pub fn len(&self) -> u64 {
        match &self.storage {
            Storage::Owned(o) => o.len as u64,
            Storage::Shared { range, .. } => (range.end - range.start) as u64,
        }
    }

    /// True when the buffer has no bytes.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// True when the buffer may be written.
    pub fn is_mutable(&self) -> bool {
        matches!(self.storage, Storage::Owned(_))
    }

    /// Runs `f` over the buffer's bytes (under a shared lock for owned
    /// buffers; do not call back into this buffer's mutating methods).
    /// `FAILED_PRECONDITION` while a host export of an owned buffer lives.
    pub fn with_bytes<R>(&self, f: impl FnOnce(&[u8]) -> R) -> Result<R> {
        match &self.storage {
            Storage::Owned(o) => Ok(f(&o.read()?)),
            Storage::Shared { bytes, range } => Ok(f(&(**bytes).as_ref()[range.clone()])),
        }
    }

    /// Runs `f` over the mutable bytes; `PERMISSION_DENIED` when read-only,
    /// `FAILED_PRECONDITION` while a host export lives.
    fn with_bytes_mut<R>(&self, f: impl FnOnce(&mut [u8]) -> Result<R>) -> Result<R> {
        match &self.storage {
            Storage::Owned(o) => f(&mut o.write()?),
            Storage::Shared { .. } => Err(read_only_error()),
        }
    }

    /// A copy of all bytes (`FAILED_PRECONDITION` while a host export of an
    /// owned buffer lives).
    pub fn to_vec(&self) -> Result<Vec<u8>> {
        self.with_bytes(|b| b.to_vec())
    }

    /// Exports the bytes to the host (see [`HostExport`]): writable for an
    /// owned buffer, read-only for a shared one. Concurrent exports share
    /// one session; the first waits for VM accesses in flight (each holds
    /// the lock for one operation) and, once it holds the lock, VM accesses
    /// fail until the last export is dropped. Call it without holding
    /// anything a VM access might wait for (for Python: with the GIL
    /// released).
    pub fn export_host(&self) -> HostExport {
        let o = match &self.storage {
            Storage::Shared { bytes, range } => {
                return HostExport {
                    inner: ExportInner::Shared {
                        bytes: bytes.clone(),
                        range: range.clone(),
                    },
                }
            }
            Storage::Owned(o) => o,
        };
        let mut slot = o.session.lock();
        if let Some(session) = slot.upgrade() {
            return HostExport {
                inner: ExportInner::Owned(session),
            };
        }
        // Counted before the lock is taken: VM accesses that queue behind
        // this export fail rather than wait for it to end.
        o.exports.fetch_add(1, Ordering::SeqCst);
        let mut guard = o.bytes.write_arc();
        let ptr = ExportPtr(guard.as_mut_ptr());
        let session = Arc::new(ExportSession {
            _guard: guard,
            ptr,
            len: o.len,
            exports: o.exports.clone(),
        });
        *slot = Arc::downgrade(&session);
        HostExport {
            inner: ExportInner::Owned(session),
        }
    }

    /// Copies `out.len()` bytes starting at byte `offset` into `out`.
    pub fn read(&self, offset: u64, out: &mut [u8]) -> Result<()> {
        self.with_bytes(|b| {
            let r = byte_range("read", offset, out.len() as u64, b.len() as u64)?;
            out.copy_from_slice(&b[r]);
            Ok(())
        })?
    }

    /// Writes `data` starting at byte `offset`.
    pub fn write(&self, offset: u64, data: &[u8]) -> Result<()> {
        self.with_bytes_mut(|b| {
            let r = byte_range("write", offset, data.len() as u64, b.len() as u64)?;
            b[r].copy_from_slice(data);
            Ok(())
        })
    }

    /// `vm.buffer.clone`: a new mutable buffer holding bytes
    /// `offset..offset+length` of this one. The source range is checked
    /// first (`OUT_OF_RANGE`), then `alignment` (0 or a power of two).
    pub fn clone_range(&self, offset: u64, length: u64, alignment: u32) -> Result<VmBuffer> {
        let mut data = self.with_bytes(|b| -> Result<Vec<u8>> {
            let r = byte_range("clone", offset, length, b.len() as u64)?;
            if length > MAX_BUFFER_LENGTH {
                bail!(
                    ResourceExhausted,
                    "buffer length {length} exceeds the maximum of {MAX_BUFFER_LENGTH} bytes"
                );
            }
            let mut v = Vec::new();
            if v.try_reserve_exact(r.len()).is_err() {
                bail!(
                    ResourceExhausted,
                    "failed to allocate a buffer of {length} bytes"
                );
            }
            v.extend_from_slice(&b[r]);
            Ok(v)
        })??;
        check_alignment(alignment)?;
        data.shrink_to_fit();
        Ok(VmBuffer::from_vec(data, true))
    }

    /// `vm.buffer.copy`: copies `length` bytes from `src` at byte
    /// `src_offset` to `dst` at byte `dst_offset`.
    ///
    /// The source range is checked first (`OUT_OF_RANGE`), then the target's
    /// mutability (`PERMISSION_DENIED`) and range. `src` and `dst` may be the
    /// same buffer, with overlapping ranges (memmove semantics). Locks are
    /// taken in address order, so concurrent copies never deadlock.
    pub fn copy(
        src: &VmBuffer,
        src_offset: u64,
        dst: &VmBuffer,
        dst_offset: u64,
        length: u64,
    ) -> Result<()> {
        let src_len = src.len();
        let sr = byte_range("copy source", src_offset, length, src_len)?;
        let Storage::Owned(dst_lock) = &dst.storage else {
            return Err(read_only_error());
        };
        if std::ptr::eq(src, dst) {
            let mut b = dst_lock.write()?;
            let dr = byte_range("copy target", dst_offset, length, b.len() as u64)?;
            b.copy_within(sr, dr.start);
            return Ok(());
        }
        match &src.storage {
            Storage::Shared { bytes, range } => {
                let s = &(**bytes).as_ref()[range.clone()];
                let mut d = dst_lock.write()?;
                let dr = byte_range("copy target", dst_offset, length, d.len() as u64)?;
                d[dr].copy_from_slice(&s[sr]);
            }
            Storage::Owned(src_lock) => {
                // Lock in address order to avoid lock-order inversion between
                // concurrent copies A->B and B->A.
                let (s, mut d);
                if (src as *const VmBuffer) < (dst as *const VmBuffer) {
                    s = src_lock.read()?;
                    d = dst_lock.write()?;
                } else {
                    d = dst_lock.write()?;
                    s = src_lock.read()?;
                }
                let dr = byte_range("copy target", dst_offset, length, d.len() as u64)?;
                d[dr].copy_from_slice(&s[sr]);
            }
        }
        Ok(())
    }

    /// `vm.buffer.compare`: true when `length` bytes of `a` at byte
    /// `a_offset` equal those of `b` at byte `b_offset` (both ranges are
    /// checked, `OUT_OF_RANGE`). `a` and `b` may be the same buffer.
    pub fn compare(
        a: &VmBuffer,
        a_offset: u64,
        b: &VmBuffer,
        b_offset: u64,
        length: u64,
    ) -> Result<bool> {
        if std::ptr::eq(a, b) {
            return a.with_bytes(|bytes| {
                let ar = byte_range("compare", a_offset, length, bytes.len() as u64)?;
                let br = byte_range("compare", b_offset, length, bytes.len() as u64)?;
                Ok(bytes[ar] == bytes[br])
            })?;
        }
        // Both locks are shared; take them in address order anyway so a
        // queued writer can never interleave into a cycle.
        let (first, second, swapped) = if (a as *const VmBuffer) < (b as *const VmBuffer) {
            (a, b, false)
        } else {
            (b, a, true)
        };
        first.with_bytes(|x| {
            second.with_bytes(|y| {
                let (ab, bb) = if swapped { (y, x) } else { (x, y) };
                let ar = byte_range("compare", a_offset, length, ab.len() as u64)?;
                let br = byte_range("compare", b_offset, length, bb.len() as u64)?;
                Ok(ab[ar] == bb[br])
            })?
        })?
    }

    /// `vm.buffer.hash`: SipHash-2-4 with key `00 01 .. 0f` over `length`
    /// bytes at byte `offset`, as a signed 64-bit value (bit-identical to
    /// upstream IREE).
    pub fn hash(&self, offset: u64, length: u64) -> Result<i64> {
        self.with_bytes(|b| {
            let r = byte_range("hash", offset, length, b.len() as u64)?;
            Ok(siphash24(&b[r]) as i64)
        })?
    }

    typed_load!(
        /// `vm.buffer.load.i8.u`: the byte at element (= byte) offset, zero-extended.
        load_i8u, u8, i32, |v| v as i32
    );
    typed_load!(
        /// `vm.buffer.load.i8.s`: the byte at element (= byte) offset, sign-extended.
        load_i8s, i8, i32, |v| v as i32
    );
    typed_load!(
        /// `vm.buffer.load.i16.u`: the i16 at byte `2 * element_offset`, zero-extended.
        load_i16u, u16, i32, |v| v as i32
    );
    typed_load!(
        /// `vm.buffer.load.i16.s`: the i16 at byte `2 * element_offset`, sign-extended.
        load_i16s, i16, i32, |v| v as i32
    );
    typed_load!(
        /// `vm.buffer.load.i32`: the i32 at byte `4 * element_offset`.
        load_i32, i32, i32, |v| v
    );
    typed_load!(
        /// `vm.buffer.load.i64`: the i64 at byte `8 * element_offset`.
        load_i64, i64, i64, |v| v
    );
    typed_load!(
        /// `vm.buffer.load.f32`: the f32 at byte `4 * element_offset`.
        load_f32, f32, f32, |v| v
    );
    typed_load!(
        /// `vm.buffer.load.f64`: the f64 at byte `8 * element_offset`.
        load_f64, f64, f64, |v| v
    );

    typed_store!(
        /// `vm.buffer.store.i8`: stores the low byte of `value` at element (= byte) offset.
        store_i8, i32, u8
    );
    typed_store!(
        /// `vm.buffer.store.i16`: stores the low 16 bits of `value` at byte `2 * element_offset`.
        store_i16, i32, u16
    );
    typed_store!(
        /// `vm.buffer.store.i32`: stores `value` at byte `4 * element_offset`.
        store_i32, i32, i32
    );
    typed_store!(
        /// `vm.buffer.store.i64`: stores `value` at byte `8 * element_offset`.
        store_i64, i64, i64
    );
    typed_store!(
        /// `vm.buffer.store.f32`: stores `value` at byte `4 * element_offset`.
        store_f32, f32, f32
    );
    typed_store!(
        /// `vm.buffer.store.f64`: stores `value` at byte `8 * element_offset`.
        store_f64, f64, f64
    );

    typed_fill!(
        /// `vm.buffer.fill.i8`: writes the low byte of `value` to `element_count`
        /// bytes starting at byte `element_offset`.
        fill_i8, i32, u8
    );
    typed_fill!(
        /// `vm.buffer.fill.i16`: writes the low 16 bits of `value` to
        /// `element_count` i16 elements starting at element `element_offset`.
        fill_i16, i32, u16
    );
    typed_fill!(
        /// `vm.buffer.fill.i32`: writes `value` to `element_count` i32 elements
        /// starting at element `element_offset`.
        fill_i32, i32, i32
    );
    typed_fill!(
        /// `vm.buffer.fill.i64`: writes `value` to `element_count` i64 elements
        /// starting at element `element_offset`.
        fill_i64, i64, i64
    );
    typed_fill!(
        /// `vm.buffer.fill.f32`: writes `value` to `element_count` f32 elements
        /// starting at element `element_offset`.
        fill_f32, f32, f32
    );
    typed_fill!(
        /// `vm.buffer.fill.f64`: writes `value` to `element_count` f64 elements
        /// starting at element `element_offset`.
        fill_f64, f64, f64
    );
}

/// SipHash-2-4 with the fixed key `00 01 02 .. 0f`.
fn siphash24(data: &[u8]) -> u64 {
    const K0: u64 = 0x0706050403020100;
    const K1: u64 = 0x0f0e0d0c0b0a0908;
    let mut v0 = 0x736f6d6570736575u64 ^ K0;
    let mut v1 = 0x646f72616e646f6du64 ^ K1;
    let mut v2 = 0x6c7967656e657261u64 ^ K0;
    let mut v3 = 0x7465646279746573u64 ^ K1;

    #[inline(always)]
    fn round(v0: &mut u64, v1: &mut u64, v2: &mut u64, v3: &mut u64) {
        *v0 = v0.wrapping_add(*v1);
        *v1 = v1.rotate_left(13);
        *v1 ^= *v0;
        *v0 = v0.rotate_left(32);
        *v2 = v2.wrapping_add(*v3);
        *v3 = v3.rotate_left(16);
        *v3 ^= *v2;
        *v0 = v0.wrapping_add(*v3);
        *v3 = v3.rotate_left(21);
        *v3 ^= *v0;
        *v2 = v2.wrapping_add(*v1);
        *v1 = v1.rotate_left(17);
        *v1 ^= *v2;
        *v2 = v2.rotate_left(32);
    }

    let mut chunks = data.chunks_exact(8);
    for chunk in &mut chunks {
        let m = u64::from_le_bytes(chunk.try_into().expect("8-byte chunk"));
        v3 ^= m;
        round(&mut v0, &mut v1, &mut v2, &mut v3);
        round(&mut v0, &mut v1, &mut v2, &mut v3);
        v0 ^= m;
    }
    let mut b = (data.len() as u64) << 56;
    for (i, &byte) in chunks.remainder().iter().enumerate() {
        b |= (byte as u64) << (8 * i);
    }
    v3 ^= b;
    round(&mut v0, &mut v1, &mut v2, &mut v3);
    round(&mut v0, &mut v1, &mut v2, &mut v3);
    v0 ^= b;
    v2 ^= 0xff;
    for _ in 0..4 {
        round(&mut v0, &mut v1, &mut v2, &mut v3);
    }
    v0 ^ v1 ^ v2 ^ v3
}

#[cfg(test)]
mod tests {
    use super::*;
    use ferrite_base::StatusCode;

    fn code<T: std::fmt::Debug>(r: Result<T>) -> StatusCode {
        r.expect_err("expected an error").code()
    }

    fn ro(data: &[u8]) -> VmBuffer {
        let shared: SharedBytes = Arc::new(data.to_vec());
        let len = data.len();
        VmBuffer::from_shared(shared, 0..len).unwrap()
    }

    #[test]
    fn new_is_zeroed_and_mutable() {
        let b = VmBuffer::new(16, 16).unwrap();
        assert_eq!(b.len(), 16);
        assert!(!b.is_empty());
        assert!(b.is_mutable());
        assert_eq!(b.to_vec().unwrap(), vec![0; 16]);
        let e = VmBuffer::new(0, 0).unwrap();
        assert!(e.is_empty());
        assert_eq!(b.type_name(), "vm.buffer");
    }

    #[test]
    fn new_rejects_bad_alignment_and_huge_length() {
        assert_eq!(code(VmBuffer::new(4, 3)), StatusCode::InvalidArgument);
        assert_eq!(
            code(VmBuffer::new(4, u32::MAX)),
            StatusCode::InvalidArgument
        );
        assert_eq!(
            code(VmBuffer::new(u64::MAX, 0)),
            StatusCode::ResourceExhausted
        );
        assert_eq!(
            code(VmBuffer::new(MAX_BUFFER_LENGTH + 1, 0)),
            StatusCode::ResourceExhausted
        );
    }

    #[test]
    fn from_vec_read_only_and_mutable() {
        let m = VmBuffer::from_vec(vec![1, 2, 3], true);
        assert!(m.is_mutable());
        m.write(1, &[9]).unwrap();
        assert_eq!(m.to_vec().unwrap(), vec![1, 9, 3]);
        let r = VmBuffer::from_vec(vec![1, 2, 3], false);
        assert!(!r.is_mutable());
        assert_eq!(code(r.write(0, &[9])), StatusCode::PermissionDenied);
        assert_eq!(r.to_vec().unwrap(), vec![1, 2, 3]);
    }

    #[test]
    fn from_shared_views_subrange_and_refuses_writes() {
        let shared: SharedBytes = Arc::new(vec![0u8, 1, 2, 3, 4, 5, 6, 7]);
        let b = VmBuffer::from_shared(shared.clone(), 2..6).unwrap();
        assert_eq!(b.len(), 4);
        assert!(!b.is_mutable());
        assert_eq!(b.to_vec().unwrap(), vec![2, 3, 4, 5]);
        assert_eq!(b.load_i8u(0).unwrap(), 2);
        assert_eq!(b.load_i16u(1).unwrap(), 0x0504);
        let e = b.store_i8(0, 1).unwrap_err();
        assert_eq!(e.code(), StatusCode::PermissionDenied);
        assert!(e.message().contains("read-only"), "{}", e.message());
        assert_eq!(code(b.store_i32(0, 1)), StatusCode::PermissionDenied);
        assert_eq!(code(b.store_i64(0, 1)), StatusCode::PermissionDenied);
        assert_eq!(code(b.store_f32(0, 1.0)), StatusCode::PermissionDenied);
        assert_eq!(code(b.store_f64(0, 1.0)), StatusCode::PermissionDenied);
        assert_eq!(code(b.store_i16(0, 1)), StatusCode::PermissionDenied);
        assert_eq!(code(b.fill_i8(0, 1, 1)), StatusCode::PermissionDenied);
        assert_eq!(code(b.fill_i16(0, 1, 1)), StatusCode::PermissionDenied);
        assert_eq!(code(b.fill_i32(0, 1, 1)), StatusCode::PermissionDenied);
        assert_eq!(code(b.fill_i64(0, 0, 1)), StatusCode::PermissionDenied);
        assert_eq!(code(b.fill_f32(0, 1, 1.0)), StatusCode::PermissionDenied);
        assert_eq!(code(b.fill_f64(0, 0, 1.0)), StatusCode::PermissionDenied);
        // Permission is checked before the range, as upstream.
        assert_eq!(code(b.store_i32(100, 1)), StatusCode::PermissionDenied);
        let m = VmBuffer::new(4, 0).unwrap();
        assert_eq!(
            code(VmBuffer::copy(&m, 0, &b, 0, 4)),
            StatusCode::PermissionDenied
        );
        assert_eq!(b.to_vec().unwrap(), vec![2, 3, 4, 5]);
        // Empty views and bad ranges.
        assert!(VmBuffer::from_shared(shared.clone(), 8..8)
            .unwrap()
            .is_empty());
        assert_eq!(
            code(VmBuffer::from_shared(shared.clone(), 4..9)),
            StatusCode::OutOfRange
        );
        #[allow(clippy::reversed_empty_ranges)]
        let rev = 5..4;
        assert_eq!(
            code(VmBuffer::from_shared(shared, rev)),
            StatusCode::OutOfRange
        );
    }

    #[test]
    fn read_write_checked() {
        let b = VmBuffer::new(8, 0).unwrap();
        b.write(4, &[1, 2, 3, 4]).unwrap();
        let mut out = [0u8; 3];
        b.read(5, &mut out).unwrap();
        assert_eq!(out, [2, 3, 4]);
        assert_eq!(code(b.read(6, &mut out)), StatusCode::OutOfRange);
        assert_eq!(code(b.write(5, &[0; 4])), StatusCode::OutOfRange);
        assert_eq!(code(b.write(u64::MAX, &[0])), StatusCode::OutOfRange);
        b.read(8, &mut []).unwrap();
        assert_eq!(code(b.read(9, &mut [])), StatusCode::OutOfRange);
        let e = b.write(6, &[0; 4]).unwrap_err();
        assert_eq!(
            e.message(),
            "buffer write of 4 bytes at offset 6 out of range (length 8)"
        );
    }

    #[test]
    fn loads_use_element_offsets() {
        let b = VmBuffer::from_vec(
            vec![
                0x00, 0x01, 0x7F, 0x80, 0xFF, 0xFF, 0x34, 0x12, 1, 2, 3, 4, 5, 6, 7, 8,
            ],
            false,
        );
        assert_eq!(b.load_i8u(3).unwrap(), 0x80);
        assert_eq!(b.load_i8s(3).unwrap(), -128);
        assert_eq!(b.load_i8s(2).unwrap(), 127);
        assert_eq!(b.load_i16u(2).unwrap(), 0xFFFF);
        assert_eq!(b.load_i16s(2).unwrap(), -1);
        assert_eq!(b.load_i16u(3).unwrap(), 0x1234);
        assert_eq!(b.load_i32(1).unwrap(), 0x1234FFFFu32 as i32);
        assert_eq!(b.load_i32(2).unwrap(), 0x04030201);
        assert_eq!(b.load_i64(1).unwrap(), 0x0807060504030201);
        assert_eq!(b.load_i8u(15).unwrap(), 8);
        assert_eq!(code(b.load_i8u(16)), StatusCode::OutOfRange);
        assert_eq!(code(b.load_i8s(16)), StatusCode::OutOfRange);
        assert_eq!(code(b.load_i16u(8)), StatusCode::OutOfRange);
        assert_eq!(code(b.load_i16s(8)), StatusCode::OutOfRange);
        assert_eq!(code(b.load_i32(4)), StatusCode::OutOfRange);
        assert_eq!(code(b.load_i64(2)), StatusCode::OutOfRange);
        assert_eq!(code(b.load_f32(4)), StatusCode::OutOfRange);
        assert_eq!(code(b.load_f64(2)), StatusCode::OutOfRange);
        assert_eq!(code(b.load_i64(u64::MAX)), StatusCode::OutOfRange);
        assert_eq!(code(b.load_i64(u64::MAX / 8)), StatusCode::OutOfRange);
        let e = b.load_i32(4).unwrap_err();
        assert!(
            e.message().contains("4 bytes at offset 16"),
            "{}",
            e.message()
        );
        assert!(e.message().contains("length 16"), "{}", e.message());
    }

    #[test]
    fn float_loads_and_stores() {
        let b = VmBuffer::new(16, 0).unwrap();
        b.store_f32(1, 42.5).unwrap();
        assert_eq!(b.load_f32(1).unwrap(), 42.5);
        assert_eq!(b.load_i32(1).unwrap(), 42.5f32.to_bits() as i32);
        b.store_f64(1, -3.25).unwrap();
        assert_eq!(b.load_f64(1).unwrap(), -3.25);
        assert_eq!(code(b.store_f32(4, 0.0)), StatusCode::OutOfRange);
        assert_eq!(code(b.store_f64(2, 0.0)), StatusCode::OutOfRange);
    }

    #[test]
    fn stores_truncate_and_use_element_offsets() {
        let b = VmBuffer::new(14, 0).unwrap();
        b.store_i8(1, 0x1FF).unwrap();
        assert_eq!(b.load_i8u(1).unwrap(), 0xFF);
        b.store_i16(1, 0x12345).unwrap();
        assert_eq!(b.to_vec().unwrap()[2..4], [0x45, 0x23]);
        b.store_i32(2, -2).unwrap();
        assert_eq!(b.to_vec().unwrap()[8..12], [0xFE, 0xFF, 0xFF, 0xFF]);
        b.store_i64(0, 0x0102030405060708).unwrap();
        assert_eq!(b.to_vec().unwrap()[0..8], [8, 7, 6, 5, 4, 3, 2, 1]);
        assert_eq!(code(b.store_i8(14, 0)), StatusCode::OutOfRange);
        assert_eq!(code(b.store_i16(7, 0)), StatusCode::OutOfRange);
        assert_eq!(code(b.store_i64(1, 0)), StatusCode::OutOfRange);
        let e = b.store_i32(3, 0).unwrap_err();
        assert_eq!(e.code(), StatusCode::OutOfRange);
        assert_eq!(
            e.message(),
            "buffer store of 4 bytes at offset 12 (element 3) out of range (length 14)"
        );
    }

    #[test]
    fn fills_use_element_offset_and_count() {
        let b = VmBuffer::new(16, 0).unwrap();
        b.fill_i8(1, 2, 0x1AB).unwrap();
        assert_eq!(b.to_vec().unwrap()[0..4], [0, 0xAB, 0xAB, 0]);
        b.fill_i16(2, 2, 0x0102).unwrap();
        assert_eq!(b.to_vec().unwrap()[4..8], [2, 1, 2, 1]);
        b.fill_i32(2, 2, -1).unwrap();
        assert_eq!(b.to_vec().unwrap()[8..16], [0xFF; 8]);
        b.fill_i64(0, 2, 0).unwrap();
        assert_eq!(b.to_vec().unwrap(), vec![0; 16]);
        b.fill_f32(1, 3, 1.5).unwrap();
        assert_eq!(b.load_f32(0).unwrap(), 0.0);
        assert_eq!(b.load_f32(3).unwrap(), 1.5);
        b.fill_f64(1, 1, 2.5).unwrap();
        assert_eq!(b.load_f64(1).unwrap(), 2.5);
        // Zero-length fills at the end are fine; past it are not.
        b.fill_i32(4, 0, 7).unwrap();
        assert_eq!(code(b.fill_i32(5, 0, 7)), StatusCode::OutOfRange);
        assert_eq!(code(b.fill_i8(15, 2, 0)), StatusCode::OutOfRange);
        assert_eq!(code(b.fill_i16(7, 2, 0)), StatusCode::OutOfRange);
        assert_eq!(code(b.fill_i32(1, 4, 0)), StatusCode::OutOfRange);
        assert_eq!(code(b.fill_i64(1, 2, 0)), StatusCode::OutOfRange);
        assert_eq!(code(b.fill_f32(0, 5, 0.0)), StatusCode::OutOfRange);
        assert_eq!(code(b.fill_f64(0, 3, 0.0)), StatusCode::OutOfRange);
        assert_eq!(code(b.fill_i64(0, u64::MAX, 0)), StatusCode::OutOfRange);
        assert_eq!(code(b.fill_i8(u64::MAX, 2, 0)), StatusCode::OutOfRange);
        // Failed fills write nothing.
        assert_eq!(b.load_f64(1).unwrap(), 2.5);
    }

    #[test]
    fn clone_range_copies_into_new_mutable_buffer() {
        let src = ro(&[1, 2, 3, 4, 5, 6]);
        let c = src.clone_range(2, 3, 16).unwrap();
        assert!(c.is_mutable());
        assert_eq!(c.to_vec().unwrap(), vec![3, 4, 5]);
        c.store_i8(0, 9).unwrap();
        assert_eq!(src.to_vec().unwrap(), vec![1, 2, 3, 4, 5, 6]);
        assert!(src.clone_range(6, 0, 0).unwrap().is_empty());
        assert_eq!(code(src.clone_range(4, 3, 0)), StatusCode::OutOfRange);
        assert_eq!(code(src.clone_range(7, 0, 0)), StatusCode::OutOfRange);
        assert_eq!(code(src.clone_range(0, 1, 6)), StatusCode::InvalidArgument);
    }

    #[test]
    fn copy_between_buffers() {
        let a = VmBuffer::from_vec(vec![1, 2, 3, 4], true);
        let b = VmBuffer::new(6, 0).unwrap();
        VmBuffer::copy(&a, 1, &b, 2, 3).unwrap();
        assert_eq!(b.to_vec().unwrap(), vec![0, 0, 2, 3, 4, 0]);
        // Source range checked.
        assert_eq!(
            code(VmBuffer::copy(&a, 2, &b, 0, 3)),
            StatusCode::OutOfRange
        );
        assert_eq!(
            code(VmBuffer::copy(&a, 5, &b, 0, 0)),
            StatusCode::OutOfRange
        );
        // Target range checked.
        assert_eq!(
            code(VmBuffer::copy(&a, 0, &b, 3, 4)),
            StatusCode::OutOfRange
        );
        assert_eq!(
            code(VmBuffer::copy(&a, 0, &b, 7, 0)),
            StatusCode::OutOfRange
        );
        // From a read-only view; both lock orders.
        let r = ro(&[7, 8]);
        VmBuffer::copy(&r, 0, &b, 0, 2).unwrap();
        VmBuffer::copy(&b, 0, &a, 0, 4).unwrap();
        assert_eq!(a.to_vec().unwrap(), vec![7, 8, 2, 3]);
        VmBuffer::copy(&a, 0, &b, 0, 4).unwrap();
        assert_eq!(b.to_vec().unwrap()[0..4], [7, 8, 2, 3]);
    }

    #[test]
    fn copy_within_same_buffer_is_memmove() {
        let b = VmBuffer::from_vec(vec![1, 2, 3, 4, 5, 6], true);
        VmBuffer::copy(&b, 0, &b, 2, 4).unwrap();
        assert_eq!(b.to_vec().unwrap(), vec![1, 2, 1, 2, 3, 4]);
        VmBuffer::copy(&b, 2, &b, 0, 4).unwrap();
        assert_eq!(b.to_vec().unwrap(), vec![1, 2, 3, 4, 3, 4]);
        assert_eq!(
            code(VmBuffer::copy(&b, 0, &b, 3, 4)),
            StatusCode::OutOfRange
        );
        let r = ro(&[1, 2]);
        assert_eq!(
            code(VmBuffer::copy(&r, 0, &r, 1, 1)),
            StatusCode::PermissionDenied
        );
    }

    #[test]
    fn concurrent_cross_copies_do_not_deadlock() {
        let a = Arc::new(VmBuffer::new(64, 0).unwrap());
        let b = Arc::new(VmBuffer::new(64, 0).unwrap());
        let mut handles = Vec::new();
        for t in 0..4 {
            let (a, b) = (a.clone(), b.clone());
            handles.push(std::thread::spawn(move || {
                for _ in 0..2000 {
                    if t % 2 == 0 {
                        VmBuffer::copy(&a, 0, &b, 0, 64).unwrap();
                        VmBuffer::compare(&a, 0, &b, 0, 64).unwrap();
                    } else {
                        VmBuffer::copy(&b, 0, &a, 0, 64).unwrap();
                        VmBuffer::compare(&b, 0, &a, 0, 64).unwrap();
                    }
                }
            }));
        }
        for h in handles {
            h.join().unwrap();
        }
    }

    #[test]
    fn compare_ranges() {
        let a = ro(&[0x64, 0, 0, 0, 0xC8, 0, 0, 0, 0x2C, 1, 0, 0]);
        let b = VmBuffer::from_vec(vec![0x64, 0, 0, 0, 0xC9, 0, 0, 0, 0x2C, 1, 0, 0], true);
        assert!(VmBuffer::compare(&a, 0, &a, 0, 12).unwrap());
        assert!(!VmBuffer::compare(&a, 0, &b, 0, 12).unwrap());
        assert!(VmBuffer::compare(&a, 0, &b, 0, 4).unwrap());
        assert!(VmBuffer::compare(&b, 8, &a, 8, 4).unwrap());
        assert!(VmBuffer::compare(&a, 1, &a, 5, 3).unwrap());
        assert!(VmBuffer::compare(&a, 12, &b, 12, 0).unwrap());
        assert_eq!(
            code(VmBuffer::compare(&a, 10, &b, 0, 4)),
            StatusCode::OutOfRange
        );
        assert_eq!(
            code(VmBuffer::compare(&a, 0, &b, 10, 4)),
            StatusCode::OutOfRange
        );
        assert_eq!(
            code(VmBuffer::compare(&a, 0, &a, 10, 4)),
            StatusCode::OutOfRange
        );
    }

    /// Expected values of upstream IREE's `vm.buffer.hash` over bytes
    /// `00..1f`: the first four are upstream's own test vectors, the rest
    /// were produced by running the pinned upstream runtime.
    #[test]
    fn hash_matches_upstream() {
        let bytes: Vec<u8> = (0u8..32).collect();
        let b = ro(&bytes);
        assert_eq!(b.hash(0, 5).unwrap(), 1762690195596617357);
        assert_eq!(b.hash(0, 16).unwrap(), 4551675220716592091);
        assert_eq!(b.hash(0, 25).unwrap(), -4836423040314787606);
        assert_eq!(b.hash(0, 32).unwrap(), 8153574914611379406);
        // From iree-run-module (iree-base-runtime 3.13.0) over the same rodata.
        assert_eq!(b.hash(0, 0).unwrap(), 8246050544436514353);
        assert_eq!(b.hash(3, 7).unwrap(), 5289383927409556679);
        assert_eq!(b.hash(0, 8).unwrap(), -7785046478206851998);
        assert_eq!(b.hash(7, 9).unwrap(), -297660529946838753);
        assert_eq!(b.hash(3, 20).unwrap(), -3482701722681528424);
        assert_eq!(b.hash(0, 7).unwrap(), -6124331488671313609);
        assert_eq!(b.hash(32, 0).unwrap(), 8246050544436514353);
        assert_eq!(code(b.hash(0, 33)), StatusCode::OutOfRange);
        assert_eq!(code(b.hash(33, 0)), StatusCode::OutOfRange);
        // The same bytes hash the same in a mutable buffer.
        let m = VmBuffer::from_vec(bytes.clone(), true);
        assert_eq!(m.hash(0, 25).unwrap(), b.hash(0, 25).unwrap());
    }

    #[test]
    fn host_export_holds_the_bytes_and_vm_access_fails_cleanly() {
        let b = VmBuffer::from_vec(vec![1, 2, 3, 4], true);
        let e = b.export_host();
        assert!(e.is_writable());
        assert_eq!(e.len(), 4);
        // Every VM-side access fails (never waits) while the export lives.
        assert_eq!(code(b.load_i8u(0)), StatusCode::FailedPrecondition);
        assert_eq!(code(b.store_i8(0, 9)), StatusCode::FailedPrecondition);
        assert_eq!(code(b.to_vec()), StatusCode::FailedPrecondition);
        assert_eq!(code(b.hash(0, 4)), StatusCode::FailedPrecondition);
        let other = VmBuffer::from_vec(vec![0; 4], true);
        assert_eq!(
            code(VmBuffer::copy(&other, 0, &b, 0, 4)),
            StatusCode::FailedPrecondition
        );
        assert_eq!(
            code(VmBuffer::copy(&b, 0, &other, 0, 4)),
            StatusCode::FailedPrecondition
        );
        let err = b.to_vec().unwrap_err().to_string();
        assert!(err.contains("exported"), "{err}");
        assert_eq!(b.len(), 4); // the length needs no lock
                                // A second export shares the session (same memory).
        let e2 = b.export_host();
        assert_eq!(e2.as_ptr(), e.as_ptr());
        // SAFETY: the export holds the write lock; nothing else touches the
        // 4 bytes at `as_ptr` while it lives.
        unsafe { *e.as_ptr().add(1) = 7 };
        drop(e);
        assert_eq!(code(b.load_i8u(0)), StatusCode::FailedPrecondition);
        // Dropped on another thread, as Python may release it.
        std::thread::spawn(move || drop(e2)).join().unwrap();
        assert_eq!(b.to_vec().unwrap(), vec![1, 7, 3, 4]);
        b.store_i8(0, 5).unwrap();
        assert_eq!(b.load_i8u(0).unwrap(), 5);
    }

    #[test]
    fn host_export_of_read_only_bytes_takes_no_lock() {
        let b = ro(&[1, 2, 3]);
        let e = b.export_host();
        assert!(!e.is_writable());
        assert_eq!(b.to_vec().unwrap(), vec![1, 2, 3]);
        assert_eq!(b.load_i8u(2).unwrap(), 3);
        drop(e);
    }

    #[test]
    fn host_export_waits_for_vm_access_in_flight() {
        let b = Arc::new(VmBuffer::from_vec(vec![0; 8], true));
        let (tx, rx) = std::sync::mpsc::channel();
        let vm = {
            let b = b.clone();
            std::thread::spawn(move || {
                b.with_bytes(|_| {
                    tx.send(()).unwrap();
                    std::thread::sleep(std::time::Duration::from_millis(50));
                })
                .unwrap();
            })
        };
        rx.recv().unwrap();
        let e = b.export_host(); // waits for the read above to finish
        vm.join().unwrap();
        assert_eq!(code(b.load_i8u(0)), StatusCode::FailedPrecondition);
        drop(e);
        assert_eq!(b.load_i8u(0).unwrap(), 0);
    }

    #[test]
    fn with_bytes_and_debug() {
        let b = VmBuffer::from_vec(vec![1, 2, 3], true);
        assert_eq!(
            b.with_bytes(|x| x.iter().map(|&v| v as u32).sum::<u32>())
                .unwrap(),
            6
        );
        assert_eq!(format!("{b:?}"), "VmBuffer { length: 3, mutable: true }");
    }
}
