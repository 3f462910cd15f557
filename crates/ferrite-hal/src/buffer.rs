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

use std::alloc::Layout;
use std::fmt;
use std::ptr::NonNull;
use std::sync::atomic::{fence, AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;

use ferrite_base::RefObject;
use ferrite_base::{bail, status, Result};
use parking_lot::{RwLock, RwLockReadGuard, RwLockWriteGuard};

use crate::memory::{BufferUsage, MemoryAccess, MemoryType};

mod host_mapping;
mod transfer;

pub use host_mapping::HostMapping;

/// A length meaning "from the offset to the end of the buffer".
pub const WHOLE_BUFFER: u64 = u64::MAX;

/// Alignment of every allocation made by Ferrite's allocators.
pub const ALLOCATION_ALIGNMENT: usize = 64;

/// Blocks at least this large are mapped straight from the OS: the pages
/// arrive zeroed (no memset), and freeing returns them at once, where the
/// C heap would keep large freed chunks and let RSS grow.
const MAPPED_BLOCK_MIN: usize = 1 << 20;

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

/// Memory a driver owns (e.g. GPU memory), wrapped in a [`Buffer`] by
/// [`Buffer::from_device_memory`]; dropped (freed) with the allocation.
///
/// # Safety
/// [`Buffer`] trusts what an implementation says of its memory, so an
/// implementation that lied could make safe code reach undefined behaviour:
/// - `len()` returns the same value for the whole life of the object;
/// - `host_ptr()`, when `Some`, returns the same pointer every call, valid
///   for reads and writes of `len()` bytes for as long as the object lives,
///   and memory no one else accesses except through that pointer.
///
/// `read` and `write` are safe methods that anyone holding the memory can
/// call ([`Buffer::device_memory`]) with any arguments: an implementation
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

/// Where a pooled block goes when its last buffer is dropped.
pub(crate) trait Recycler: Send + Sync {
    fn recycle(&self, block: HeapBlock);
}

/// Records freed bytes on the owning allocator's statistics.
pub(crate) trait FreeTracker: Send + Sync {
    fn record_free(&self, memory_type: MemoryType, bytes: u64);
}

pub(crate) struct Allocation {
    storage: Storage,
    len: u64,
    lock: RwLock<()>,
    /// Device work in flight on this allocation (see [`DeviceUse`]).
    device: DeviceUsers,
    memory_type: MemoryType,
    usage: BufferUsage,
    access: MemoryAccess,
    /// Where the block goes back to (held strongly: a pool lives as long
    /// as any of its buffers, which keeps freeing free of a weak upgrade).
    recycler: Option<Arc<dyn Recycler>>,
    tracker: Option<Arc<dyn FreeTracker>>,
}

impl Drop for Allocation {
    fn drop(&mut self) {
        if let Some(t) = &self.tracker {
            t.record_free(self.memory_type, self.len);
        }
        if let Some(pool) = &self.recycler {
            if let Storage::Heap(block) = std::mem::replace(&mut self.storage, Storage::Empty) {
                pool.recycle(block);
            }
        }
    }
}

impl Allocation {
    pub(crate) fn from_block(
        block: HeapBlock,
        len: u64,
        memory_type: MemoryType,
        usage: BufferUsage,
        access: MemoryAccess,
        recycler: Option<Arc<dyn Recycler>>,
        tracker: Option<Arc<dyn FreeTracker>>,
    ) -> Allocation {
        debug_assert!(len as usize <= block.len());
        Allocation {
            storage: Storage::Heap(block),
            len,
            lock: RwLock::new(()),
            device: DeviceUsers::default(),
            memory_type,
            usage,
            access,
            recycler,
            tracker,
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
        Allocation {
            storage,
            len,
            lock: RwLock::new(()),
            device: DeviceUsers::default(),
            memory_type,
            usage,
            access,
            recycler: None,
            tracker: None,
        }
    }

    fn is_writable(&self) -> bool {
        match &self.storage {
            Storage::Heap(_) | Storage::Boxed(_) | Storage::Device(_) => true,
            Storage::Foreign(b) => b.writable,
            Storage::ReadOnly { .. } | Storage::Empty => false,
        }
    }

    /// True for read-only memory made by [`HostMemory::program_constant`].
    fn is_constant(&self) -> bool {
        matches!(self.storage, Storage::ReadOnly { constant: true, .. })
    }

    /// Driver memory the host cannot address (accessed by transfers).
    fn device_only(&self) -> Option<&dyn DeviceMemory> {
        match &self.storage {
            Storage::Device(d) if d.host_ptr().is_none() => Some(&**d),
            _ => None,
        }
    }

    /// Base pointer of the whole allocation (valid for `len` bytes).
    fn base_ptr(&self) -> *mut u8 {
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
    fn slice(&self, _guard: &LockHeld<'_>, off: u64, len: u64) -> &[u8] {
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
    fn slice_mut(&self, _guard: &RwLockWriteGuard<'_, ()>, off: u64, len: u64) -> &mut [u8] {
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
struct LockHeld<'a>(#[allow(dead_code)] RwLockReadGuard<'a, ()>);

/// A byte range of a host-memory allocation (the `hal.buffer` ref type).
#[derive(Clone)]
pub struct Buffer {
    alloc: Arc<Allocation>,
    offset: u64,
    length: u64,
}

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
        Buffer::from_allocation(Allocation {
            storage: Storage::Device(memory),
            len,
            lock: RwLock::new(()),
            device: DeviceUsers::default(),
            memory_type,
            usage,
            access,
            recycler: None,
            tracker: None,
        })
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
        self.validate_access(access)?;
        if access.contains(MemoryAccess::WRITE) && !self.alloc.is_writable() {
            bail!(PermissionDenied, "buffer wraps read-only host memory");
        }
        // ANY: the executable format does not say whether the kernel writes
        // (CPU executables). Writable storage serves it; read-only storage
        // only when it is a program constant (no dispatch writes those).
        if access.contains(MemoryAccess::ANY)
            && !self.alloc.is_writable()
            && !self.alloc.is_constant()
        {
            bail!(
                PermissionDenied,
                "buffer wraps read-only host memory that is not a program constant, and the kernel may write it"
            );
        }
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

    /// Maps `[offset, offset+length)` for reading (`length` may be
    /// [`WHOLE_BUFFER`]). Writers to the allocation wait until the mapping is
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
    /// [`WHOLE_BUFFER`]). All other host access to the allocation waits until
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
        self.validate_access(access)?;
        if access.contains(MemoryAccess::WRITE) && !self.alloc.is_writable() {
            bail!(PermissionDenied, "buffer wraps read-only host memory");
        }
        // ANY: the executable format does not say whether the kernel writes
        // (CPU executables). Writable storage serves it; read-only storage
        // only when it is a program constant (no dispatch writes those).
        if access.contains(MemoryAccess::ANY)
            && !self.alloc.is_writable()
            && !self.alloc.is_constant()
        {
            bail!(
                PermissionDenied,
                "buffer wraps read-only host memory that is not a program constant, and the kernel may write it"
            );
        }
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
struct DeviceUsers {
    writers: AtomicUsize,
    readers: AtomicUsize,
    host_mapped: AtomicUsize,
    host_mapped_writable: AtomicUsize,
}

impl DeviceUsers {
    fn counter(&self, write: bool) -> &AtomicUsize {
        if write {
            &self.writers
        } else {
            &self.readers
        }
    }

    /// Starts a device use, unless the host holds a conflicting lock (any
    /// lock for a writer, the write lock for a reader).
    fn begin(&self, lock: &RwLock<()>, write: bool) -> Result<()> {
        self.counter(write).fetch_add(1, Ordering::SeqCst);
        fence(Ordering::SeqCst);
        let conflict = if write {
            lock.is_locked() || self.host_mapped.load(Ordering::SeqCst) != 0
        } else {
            lock.is_locked_exclusive() || self.host_mapped_writable.load(Ordering::SeqCst) != 0
        };
        if conflict {
            self.end(write);
            bail!(
                FailedPrecondition,
                "buffer is mapped or accessed by the host while device work would {} it; host access must be ordered before the work (wait on its fences)",
                if write { "write" } else { "read" }
            );
        }
        Ok(())
    }

    fn end(&self, write: bool) {
        self.counter(write).fetch_sub(1, Ordering::SeqCst);
    }

    /// With the shared lock held: refuses while device work may write.
    fn host_may_read(&self) -> Result<()> {
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
    fn host_may_write(&self) -> Result<()> {
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
    use super::*;
    use crate::allocator::{Allocator, BufferParams, HeapAllocator};
    use ferrite_base::StatusCode;

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
