//! Where a buffer's bytes live: host blocks (heap or mapped, recycled by
//! pooling allocators), imported host memory (owned, read-only, program
//! constants, foreign), and driver memory ([`DeviceMemory`]); and the
//! [`Allocation`] that owns one of them with its lock, device-use counters,
//! type, usage and access.

use std::alloc::Layout;
use std::fmt;
use std::ptr::NonNull;
use std::sync::Arc;

use ferrite_base::{bail, status, Result};
use parking_lot::{RwLock, RwLockReadGuard, RwLockWriteGuard};

use super::device_users::DeviceUsers;
use crate::memory::{BufferUsage, MemoryAccess, MemoryType};

/// Alignment of every allocation made by Ferrite's allocators.
pub const ALLOCATION_ALIGNMENT: usize = 64;

/// Blocks at least this large are mapped straight from the OS: the pages
/// arrive zeroed (no memset), and freeing returns them at once, where the
/// C heap would keep large freed chunks and let RSS grow.
pub(super) const MAPPED_BLOCK_MIN: usize = 1 << 20;

/// An owned, aligned block of host memory (zeroed when first allocated).
pub(crate) struct HeapBlock {
    ptr: NonNull<u8>,
    layout: Layout,
    /// The anonymous mapping backing a large block (None for heap blocks).
    mapping: Option<memmap2::MmapMut>,
}

// SAFETY: a HeapBlock exclusively owns its memory (like a Box<[u8]>); it is
// only read or written through the allocation's lock or under BindingPtr's
// documented contract.
unsafe impl Send for HeapBlock {}
// SAFETY: as above; shared access never hands out references without the lock.
unsafe impl Sync for HeapBlock {}

impl HeapBlock {
    /// Allocates `size` zeroed bytes aligned to `align` (at least 64).
    pub(crate) fn new_zeroed(size: u64, align: usize) -> Result<HeapBlock> {
        let align = align.max(ALLOCATION_ALIGNMENT);
        let layout = usize::try_from(size)
            .ok()
            .and_then(|s| Layout::from_size_align(s, align).ok())
            .ok_or_else(|| {
                status!(
                    ResourceExhausted,
                    "cannot allocate {size} bytes aligned to {align}"
                )
            })?;
        if layout.size() == 0 {
            // A dangling, well-aligned pointer: never dereferenced for reads
            // or writes of more than zero bytes, never deallocated.
            let ptr = NonNull::new(align as *mut u8).unwrap_or(NonNull::dangling());
            return Ok(HeapBlock {
                ptr,
                layout,
                mapping: None,
            });
        }
        if layout.size() >= MAPPED_BLOCK_MIN && align <= 4096 {
            if let Some(mut map) = take_spare_mapping(layout.size()) {
                // Reused pages are already resident: one memset instead of a
                // page fault per page (and the unmap's TLB shootdown).
                map.fill(0);
                if let Some(ptr) = NonNull::new(map.as_mut_ptr()) {
                    return Ok(HeapBlock {
                        ptr,
                        layout,
                        mapping: Some(map),
                    });
                }
            }
            let mut map = memmap2::MmapMut::map_anon(layout.size()).map_err(|e| {
                status!(
                    ResourceExhausted,
                    "out of host memory mapping {size} bytes: {e}"
                )
            })?;
            // Page-aligned, so at least `align`-aligned; the pointer stays
            // valid while `mapping` lives (moving the MmapMut does not move
            // the pages).
            if let Some(ptr) = NonNull::new(map.as_mut_ptr()) {
                return Ok(HeapBlock {
                    ptr,
                    layout,
                    mapping: Some(map),
                });
            }
        }
        // SAFETY: the layout has a non-zero size (checked above).
        let raw = unsafe { std::alloc::alloc_zeroed(layout) };
        match NonNull::new(raw) {
            Some(ptr) => Ok(HeapBlock {
                ptr,
                layout,
                mapping: None,
            }),
            None => bail!(
                ResourceExhausted,
                "out of host memory allocating {size} bytes"
            ),
        }
    }

    pub(crate) fn len(&self) -> usize {
        self.layout.size()
    }

    /// The block's address, as an identity for pool trace events (the
    /// block keeps it while it moves between buffers and free lists).
    pub(crate) fn addr(&self) -> u64 {
        self.ptr.as_ptr() as usize as u64
    }
}

/// Freed mappings of at most this size are kept for reuse.
const SPARE_MAPPING_MAX_BYTES: usize = 16 << 20;
/// At most this many freed mappings are kept: a program that allocates the
/// same large buffer per call (a result, a transient) reuses the last one,
/// and at most 2 x 16 MiB stay resident after frees.
const SPARE_MAPPING_COUNT: usize = 2;

/// Recently freed mappings, most recent last.
static SPARE_MAPPINGS: std::sync::Mutex<Vec<memmap2::MmapMut>> = std::sync::Mutex::new(Vec::new());

/// A kept mapping of exactly `len` bytes, if any.
fn take_spare_mapping(len: usize) -> Option<memmap2::MmapMut> {
    let mut spare = SPARE_MAPPINGS.lock().unwrap_or_else(|e| e.into_inner());
    let i = spare.iter().rposition(|m| m.len() == len)?;
    Some(spare.swap_remove(i))
}

/// Keeps `map` for reuse (unmapping the oldest kept one beyond the limit).
fn keep_spare_mapping(map: memmap2::MmapMut) {
    if map.len() > SPARE_MAPPING_MAX_BYTES {
        return;
    }
    let evicted = {
        let mut spare = SPARE_MAPPINGS.lock().unwrap_or_else(|e| e.into_inner());
        spare.push(map);
        (spare.len() > SPARE_MAPPING_COUNT).then(|| spare.remove(0))
    };
    // Unmapped outside the lock.
    drop(evicted);
}

impl Drop for HeapBlock {
    fn drop(&mut self) {
        if let Some(map) = self.mapping.take() {
            keep_spare_mapping(map);
            return;
        }
        if self.layout.size() != 0 {
            // SAFETY: `ptr` came from `alloc_zeroed` with exactly `layout`.
            unsafe { std::alloc::dealloc(self.ptr.as_ptr(), self.layout) };
        }
    }
}

/// Host memory handed to an allocator for import.
pub enum HostMemory {
    /// Read-only bytes kept alive by their owner (e.g. `ModuleBytes`, an
    /// `Arc<[u8]>`, a memory map). The owner must return the same slice from
    /// every `as_ref()` call (true of every std container and of
    /// `ModuleBytes`): devices keep raw pointers into it.
    ReadOnly(Arc<dyn AsRef<[u8]> + Send + Sync>),
    /// A program's constant: read-only bytes that no dispatch writes, made
    /// by [`HostMemory::program_constant`]. Unlike [`HostMemory::ReadOnly`],
    /// it may be bound to a kernel binding whose format does not say whether
    /// the kernel writes it (CPU executables), which is what lets module
    /// rodata and mapped parameters be used in place.
    Constant(ConstantBytes),
    /// A writable vector the buffer takes ownership of.
    Owned(Vec<u8>),
    /// Memory owned by someone else (e.g. a DLPack producer), kept valid
    /// until its owner is dropped; made by [`HostMemory::foreign`].
    Foreign(ForeignBytes),
}

/// The bytes of a [`HostMemory::Constant`]; see
/// [`HostMemory::program_constant`].
pub struct ConstantBytes(Arc<dyn AsRef<[u8]> + Send + Sync>);

impl HostMemory {
    /// Bytes that a program declared constant: the `hal` module imports
    /// module rodata, and `io_parameters` maps parameters, this way when the
    /// program asks for `SHARING_IMMUTABLE` usage. Such memory is read-only
    /// to the host, but may be bound where the executable format cannot say
    /// whether a kernel writes (every CPU binding), as upstream binds it;
    /// such a binding counts as device work that may write it.
    ///
    /// Programs do write such storage in place: the compiler imports
    /// `util.unfoldable_constant` storage from rodata with
    /// `SHARING_IMMUTABLE | DISPATCH_STORAGE_WRITE` usage and dispatches
    /// write into it (upstream's e2e `tensor_insert_slice`, `sort`,
    /// `scatter`).
    ///
    /// # Safety
    /// The memory must stay mapped writable for as long as a buffer over it
    /// lives, and no one but device work bound to it may write it: module
    /// bytes read into memory or mapped privately (copy-on-write, see
    /// `ferrite_vm::ModuleBytes`), parameter files mapped the same way. The
    /// owner must return the same slice from every `as_ref()` call, as for
    /// [`HostMemory::ReadOnly`].
    // SAFETY: the body only wraps the owner; the contract above governs how
    // devices may bind it.
    pub unsafe fn program_constant(owner: Arc<dyn AsRef<[u8]> + Send + Sync>) -> HostMemory {
        HostMemory::Constant(ConstantBytes(owner))
    }

    /// True when the memory may not be written (read-only bytes, or foreign
    /// memory imported read-only).
    pub fn is_read_only(&self) -> bool {
        match self {
            HostMemory::ReadOnly(_) | HostMemory::Constant(_) => true,
            HostMemory::Owned(_) => false,
            HostMemory::Foreign(b) => !b.writable,
        }
    }
}

/// Foreign host memory and the owner whose drop releases it.
pub struct ForeignBytes {
    ptr: NonNull<u8>,
    len: usize,
    writable: bool,
    _owner: Box<dyn Send + Sync>,
}

// SAFETY: the memory is plain bytes whose owner is `Send + Sync`; access
// follows the allocation's lock or BindingPtr's contract, as for owned
// storage.
unsafe impl Send for ForeignBytes {}
// SAFETY: see above.
unsafe impl Sync for ForeignBytes {}

impl HostMemory {
    /// Wraps `len` bytes at `ptr` that stay valid (and, when `writable`,
    /// writable by this buffer alone) until `owner` is dropped; the buffer
    /// drops `owner` when its allocation is freed.
    ///
    /// # Safety
    /// `ptr` must be valid for reads (and writes when `writable`) of `len`
    /// bytes until `owner` is dropped, and nothing else may write to the
    /// memory while the buffer lives.
    // SAFETY: the contract above is the caller's; the body only stores the
    // pointer, which every later access bounds-checks against `len`.
    pub unsafe fn foreign(
        ptr: *mut u8,
        len: usize,
        writable: bool,
        owner: Box<dyn Send + Sync>,
    ) -> HostMemory {
        HostMemory::Foreign(ForeignBytes {
            ptr: NonNull::new(ptr).unwrap_or(NonNull::dangling()),
            len: if ptr.is_null() { 0 } else { len },
            writable,
            _owner: owner,
        })
    }

    /// The address and length of the bytes, whatever the kind (for
    /// drivers that copy or register imported memory). Foreign memory is
    /// never viewed as a Rust slice (its owner, e.g. Python code holding a
    /// numpy array, may write it at any time): copy it through the raw
    /// pointer (`std::ptr::copy_nonoverlapping`, a driver's copy), valid
    /// for `len` bytes while `self` lives.
    pub fn raw_parts(&self) -> (*const u8, usize) {
        match self {
            HostMemory::ReadOnly(o) | HostMemory::Constant(ConstantBytes(o)) => {
                let b = (**o).as_ref();
                (b.as_ptr(), b.len())
            }
            HostMemory::Owned(v) => (v.as_ptr(), v.len()),
            HostMemory::Foreign(b) => (b.ptr.as_ptr(), b.len),
        }
    }

    /// True when the memory may be written through an import.
    pub fn is_writable(&self) -> bool {
        match self {
            HostMemory::ReadOnly(_) | HostMemory::Constant(_) => false,
            HostMemory::Owned(_) => true,
            HostMemory::Foreign(b) => b.writable,
        }
    }
}

impl fmt::Debug for HostMemory {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            HostMemory::Constant(ConstantBytes(b)) => {
                write!(f, "HostMemory::Constant({} bytes)", (**b).as_ref().len())
            }
            HostMemory::ReadOnly(b) => {
                write!(f, "HostMemory::ReadOnly({} bytes)", (**b).as_ref().len())
            }
            HostMemory::Owned(v) => write!(f, "HostMemory::Owned({} bytes)", v.len()),
            HostMemory::Foreign(b) => write!(f, "HostMemory::Foreign({} bytes)", b.len),
        }
    }
}

/// A `Box<[u8]>` turned into a raw pointer so it can be shared the same way
/// as a heap block; freed by rebuilding the box.
pub(crate) struct BoxedBytes {
    ptr: NonNull<u8>,
    len: usize,
}

// SAFETY: BoxedBytes exclusively owns its memory like a Box<[u8]>; access
// follows the allocation's lock or BindingPtr's contract.
unsafe impl Send for BoxedBytes {}
// SAFETY: see above.
unsafe impl Sync for BoxedBytes {}

impl Drop for BoxedBytes {
    fn drop(&mut self) {
        let slice = std::ptr::slice_from_raw_parts_mut(self.ptr.as_ptr(), self.len);
        // SAFETY: `ptr`/`len` came from `Box::into_raw` of a `Box<[u8]>` in
        // `Allocation::import` and are dropped exactly once, here.
        drop(unsafe { Box::from_raw(slice) });
    }
}

/// Memory a driver owns (e.g. GPU memory), wrapped in a [`Buffer`](super::Buffer) by
/// [`Buffer::from_device_memory`](super::Buffer::from_device_memory); dropped (freed) with the allocation.
///
/// # Safety
/// [`Buffer`](super::Buffer) trusts what an implementation says of its memory, so an
/// implementation that lied could make safe code reach undefined behaviour:
/// - `len()` returns the same value for the whole life of the object;
/// - `host_ptr()`, when `Some`, returns the same pointer every call, valid
///   for reads and writes of `len()` bytes for as long as the object lives,
///   and memory no one else accesses except through that pointer;
/// - `native()`, when `Some`, gives the address of the allocation's first
///   byte in the API of its queue's device, valid there for `len()` bytes
///   while the object lives (users outside Ferrite are handed it, and
///   address the memory through it, see [`crate::external`]).
///
/// `read` and `write` are safe methods that anyone holding the memory can
/// call ([`Buffer::device_memory`](super::Buffer::device_memory)) with any arguments: an implementation
/// must check the range itself ([`check_device_range`]) and fail for one
/// outside `[0, len())`, never touch memory outside it.
pub unsafe trait DeviceMemory: Send + Sync + 'static {
    /// Bytes in the allocation.
    fn len(&self) -> u64;
    /// True when the allocation has no bytes.
    fn is_empty(&self) -> bool {
        self.len() == 0
    }
    /// A host mapping of all `len()` bytes, when the host can address the
    /// memory directly (pinned host memory); None for device-only memory.
    /// See the trait's safety contract.
    fn host_ptr(&self) -> Option<NonNull<u8>>;
    /// Copies `dst.len()` bytes at `offset` to the host (synchronously);
    /// fails with `OUT_OF_RANGE` for a range outside the allocation.
    fn read(&self, offset: u64, dst: &mut [u8]) -> Result<()>;
    /// Copies `src` to `offset` (synchronously); fails with `OUT_OF_RANGE`
    /// for a range outside the allocation.
    fn write(&self, offset: u64, src: &[u8]) -> Result<()>;
    /// For drivers: downcast to the concrete type (device addresses).
    fn as_any(&self) -> &dyn std::any::Any;
    /// Where the memory is in the device's own API, for users outside
    /// Ferrite (see [`crate::external`]); None (the default) when the
    /// driver does not hand its memory out.
    fn native(&self) -> Option<crate::external::native::NativeMemory> {
        None
    }
    /// Told when the memory is handed to a user outside Ferrite whose own
    /// queues may use it after the last buffer is dropped: the driver must
    /// then free it in queue order rather than recycle it unordered.
    /// Default: nothing (a driver that never recycles memory).
    fn mark_exported(&self) {}
}

/// Checks that `[offset, offset + length)` lies within an allocation of
/// `len` bytes (for [`DeviceMemory::read`]/[`DeviceMemory::write`]
/// implementations).
pub fn check_device_range(len: u64, offset: u64, length: usize) -> Result<()> {
    match offset.checked_add(length as u64) {
        Some(end) if end <= len => Ok(()),
        _ => bail!(
            OutOfRange,
            "device memory access {offset}+{length} outside the allocation's {len} bytes"
        ),
    }
}

pub(crate) enum Storage {
    Heap(HeapBlock),
    /// Driver-owned memory (see [`DeviceMemory`]).
    Device(Box<dyn DeviceMemory>),
    Boxed(BoxedBytes),
    /// Read-only bytes; `constant` when made by
    /// [`HostMemory::program_constant`] (no dispatch writes them).
    ReadOnly {
        owner: Arc<dyn AsRef<[u8]> + Send + Sync>,
        constant: bool,
    },
    Foreign(ForeignBytes),
    /// Moved out (returned to a pool) during drop.
    Empty,
}

/// The allocator an allocation reports its end to: one object (and one
/// reference) for both the statistics and, for pooled blocks, the free
/// list, so that ending an allocation takes one lock and one reference
/// release rather than one of each per concern.
pub(crate) trait AllocationHome: Send + Sync {
    /// An allocation of `bytes` bytes of `memory_type` ended; `block` is its
    /// heap block when the allocation was made pooled (to be kept for
    /// reuse or freed), else None (its storage is freed by the caller).
    fn release(&self, memory_type: MemoryType, bytes: u64, block: Option<HeapBlock>);
}

pub(crate) struct Allocation {
    pub(super) storage: Storage,
    pub(super) len: u64,
    pub(super) lock: RwLock<()>,
    /// Device work in flight on this allocation (see [`DeviceUse`]).
    pub(super) device: DeviceUsers,
    pub(super) memory_type: MemoryType,
    pub(super) usage: BufferUsage,
    pub(super) access: MemoryAccess,
    /// The allocator told when the allocation ends (held strongly: a pool
    /// lives as long as any of its buffers, which keeps freeing free of a
    /// weak upgrade); None for imports and device memory.
    pub(super) home: Option<Arc<dyn AllocationHome>>,
    /// True when the heap block goes back to `home` for reuse.
    pub(super) pooled: bool,
}

impl Drop for Allocation {
    fn drop(&mut self) {
        if let Some(home) = &self.home {
            let block = match self.pooled {
                true => match std::mem::replace(&mut self.storage, Storage::Empty) {
                    Storage::Heap(block) => Some(block),
                    other => {
                        self.storage = other;
                        None
                    }
                },
                false => None,
            };
            home.release(self.memory_type, self.len, block);
        }
    }
}

impl Allocation {
    /// An allocation of `len` bytes of `storage` (a heap block may be
    /// larger: pools reuse blocks of a size class): no device work in
    /// flight and no host lock held yet. Every way of making one goes
    /// through it.
    pub(crate) fn new(
        storage: Storage,
        len: u64,
        memory_type: MemoryType,
        usage: BufferUsage,
        access: MemoryAccess,
        home: Option<Arc<dyn AllocationHome>>,
        pooled: bool,
    ) -> Allocation {
        debug_assert!(!matches!(&storage, Storage::Heap(b) if len as usize > b.len()));
        Allocation {
            storage,
            len,
            lock: RwLock::new(()),
            device: DeviceUsers::default(),
            memory_type,
            usage,
            access,
            home,
            pooled,
        }
    }

    pub(crate) fn import(
        memory: HostMemory,
        memory_type: MemoryType,
        usage: BufferUsage,
        access: MemoryAccess,
    ) -> Allocation {
        let constant = matches!(memory, HostMemory::Constant(_));
        let (storage, len, access) = match memory {
            HostMemory::ReadOnly(owner) | HostMemory::Constant(ConstantBytes(owner)) => {
                let len = (*owner).as_ref().len() as u64;
                // Read-only memory never allows writes, whatever was asked.
                let mut access =
                    access & !(MemoryAccess::WRITE | MemoryAccess::DISCARD | MemoryAccess::ANY);
                access |= MemoryAccess::READ;
                (Storage::ReadOnly { owner, constant }, len, access)
            }
            HostMemory::Owned(v) => {
                let len = v.len();
                let raw = Box::into_raw(v.into_boxed_slice());
                // A Box pointer is never null (dangling for empty slices).
                match NonNull::new(raw as *mut u8) {
                    Some(ptr) => (Storage::Boxed(BoxedBytes { ptr, len }), len as u64, access),
                    None => (Storage::Empty, 0, access),
                }
            }
            HostMemory::Foreign(b) => {
                let mut access = access;
                if !b.writable {
                    access &= !(MemoryAccess::WRITE | MemoryAccess::DISCARD | MemoryAccess::ANY);
                    access |= MemoryAccess::READ;
                }
                let len = b.len as u64;
                (Storage::Foreign(b), len, access)
            }
        };
        Allocation::new(storage, len, memory_type, usage, access, None, false)
    }

    pub(super) fn is_writable(&self) -> bool {
        match &self.storage {
            Storage::Heap(_) | Storage::Boxed(_) | Storage::Device(_) => true,
            Storage::Foreign(b) => b.writable,
            Storage::ReadOnly { .. } | Storage::Empty => false,
        }
    }

    /// True for read-only memory made by [`HostMemory::program_constant`].
    pub(super) fn is_constant(&self) -> bool {
        matches!(self.storage, Storage::ReadOnly { constant: true, .. })
    }

    /// Driver memory the host cannot address (accessed by transfers).
    pub(super) fn device_only(&self) -> Option<&dyn DeviceMemory> {
        match &self.storage {
            Storage::Device(d) if d.host_ptr().is_none() => Some(&**d),
            _ => None,
        }
    }

    /// Base pointer of the whole allocation (valid for `len` bytes).
    pub(super) fn base_ptr(&self) -> *mut u8 {
        match &self.storage {
            Storage::Heap(b) => b.ptr.as_ptr(),
            Storage::Boxed(b) => b.ptr.as_ptr(),
            Storage::ReadOnly { owner, .. } => (**owner).as_ref().as_ptr() as *mut u8,
            Storage::Foreign(b) => b.ptr.as_ptr(),
            // Only reached for memory with a host mapping: every host
            // access checks `device_only` first and goes through transfers.
            Storage::Device(d) => d.host_ptr().unwrap_or(NonNull::dangling()).as_ptr(),
            Storage::Empty => NonNull::dangling().as_ptr(),
        }
    }

    /// The bytes `[off, off + len)`; the caller holds the shared lock and has range-checked the span. The result borrows `self`, not
    /// the guard: callers (all in this module) keep the guard alive for as
    /// long as they use the slice (mappings store both together).
    pub(super) fn slice(&self, _guard: &LockHeld<'_>, off: u64, len: u64) -> &[u8] {
        if let Storage::ReadOnly { owner, .. } = &self.storage {
            return &(**owner).as_ref()[off as usize..(off + len) as usize];
        }
        if len == 0 {
            return &[];
        }
        // SAFETY: owned storage is valid for `self.len` initialized bytes and
        // the range was checked against `self.len`; the caller holds a lock
        // guard (shared or exclusive) for as long as it uses the slice, so no
        // `&mut` to these bytes exists meanwhile.
        unsafe { std::slice::from_raw_parts(self.base_ptr().add(off as usize), len as usize) }
    }

    /// Mutable bytes `[off, off + len)`; the caller holds the write lock, has
    /// range-checked the span and checked `is_writable`. As for `slice`, the
    /// caller keeps the guard alive while the slice is used.
    #[allow(clippy::mut_from_ref)]
    pub(super) fn slice_mut(
        &self,
        _guard: &RwLockWriteGuard<'_, ()>,
        off: u64,
        len: u64,
    ) -> &mut [u8] {
        assert!(self.is_writable(), "write to read-only storage");
        if len == 0 {
            return &mut [];
        }
        // SAFETY: owned, writable storage valid for `self.len` bytes; the range
        // was checked; the caller holds the exclusive write guard for as long
        // as it uses the slice, so no other reference to these bytes exists
        // through the safe API. Binding pointers are ordered against host
        // access by their documented contract.
        unsafe { std::slice::from_raw_parts_mut(self.base_ptr().add(off as usize), len as usize) }
    }
}

/// Proof that the allocation's shared lock is held; dropping it unlocks.
pub(super) struct LockHeld<'a>(#[allow(dead_code)] pub(super) RwLockReadGuard<'a, ()>);
