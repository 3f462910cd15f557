//! Allocators: the [`Allocator`] trait, the host [`HeapAllocator`] and the
//! size-class [`CachingAllocator`] used for queue-ordered allocations.

use std::fmt;
use std::sync::Arc;

use ferrite_base::{bail, Result};
use parking_lot::Mutex;

use crate::buffer::{Allocation, AllocationHome, Buffer, HeapBlock, HostMemory, Storage};
use crate::external::import::{ExternalBuffer, ExternalBufferType};
use crate::memory::{BufferCompatibility, BufferUsage, MemoryAccess, MemoryType};

mod pool_events;
use pool_events::Snapshot;

/// Parameters of an allocation or import (upstream's `iree_hal_buffer_params_t`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BufferParams {
    /// Requested usage; empty means [`BufferUsage::DEFAULT`].
    pub usage: BufferUsage,
    /// Requested access; empty means [`MemoryAccess::ALL`].
    pub access: MemoryAccess,
    /// Requested memory type; empty means [`MemoryType::OPTIMAL`].
    pub memory_type: MemoryType,
    /// Queue affinity bitmask (0 = any queue).
    pub queue_affinity: u64,
    /// Minimum alignment in bytes (0 = the allocator's default, 64).
    pub min_alignment: u64,
}

impl Default for BufferParams {
    fn default() -> BufferParams {
        BufferParams {
            usage: BufferUsage::empty(),
            access: MemoryAccess::empty(),
            memory_type: MemoryType::empty(),
            queue_affinity: 0,
            min_alignment: 0,
        }
    }
}

impl BufferParams {
    /// Parameters with the given memory type and usage, other fields default.
    pub fn new(memory_type: MemoryType, usage: BufferUsage) -> BufferParams {
        BufferParams {
            memory_type,
            usage,
            ..BufferParams::default()
        }
    }

    /// Fills empty fields with upstream's defaults (usage DEFAULT, access
    /// ALL, type OPTIMAL).
    pub fn canonicalize(mut self) -> BufferParams {
        if self.usage.is_empty() {
            self.usage = BufferUsage::DEFAULT;
        }
        if self.access.is_empty() {
            self.access = MemoryAccess::ALL;
        }
        if self.memory_type.is_empty() {
            self.memory_type = MemoryType::OPTIMAL;
        }
        self
    }
}

/// Allocation statistics (upstream's `iree_hal_allocator_statistics_t`).
/// Host-local allocations count as host bytes, device-local ones as device
/// bytes (a host-visible device-local heap buffer counts as both).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct AllocatorStatistics {
    /// Highest concurrently live host bytes.
    pub host_bytes_peak: u64,
    /// Total host bytes ever allocated.
    pub host_bytes_allocated: u64,
    /// Total host bytes freed.
    pub host_bytes_freed: u64,
    /// Highest concurrently live device bytes.
    pub device_bytes_peak: u64,
    /// Total device bytes ever allocated.
    pub device_bytes_allocated: u64,
    /// Total device bytes freed.
    pub device_bytes_freed: u64,
}

impl fmt::Display for AllocatorStatistics {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "  HOST_LOCAL: {:>12}B peak / {:>12}B allocated / {:>12}B freed / {:>12}B live",
            self.host_bytes_peak,
            self.host_bytes_allocated,
            self.host_bytes_freed,
            self.host_bytes_allocated
                .saturating_sub(self.host_bytes_freed)
        )?;
        write!(
            f,
            "DEVICE_LOCAL: {:>12}B peak / {:>12}B allocated / {:>12}B freed / {:>12}B live",
            self.device_bytes_peak,
            self.device_bytes_allocated,
            self.device_bytes_freed,
            self.device_bytes_allocated
                .saturating_sub(self.device_bytes_freed)
        )
    }
}

/// A [`HeapAllocator`]'s statistics, which its allocations report their
/// end to.
#[derive(Default)]
struct StatsCell(Mutex<AllocatorStatistics>);

/// Counts an allocation of `bytes` bytes of `ty` in `s`.
fn record_alloc(s: &mut AllocatorStatistics, ty: MemoryType, bytes: u64) {
    if ty.contains(MemoryType::HOST_LOCAL) {
        s.host_bytes_allocated += bytes;
        let live = s.host_bytes_allocated - s.host_bytes_freed;
        s.host_bytes_peak = s.host_bytes_peak.max(live);
    }
    if ty.contains(MemoryType::DEVICE_LOCAL) {
        s.device_bytes_allocated += bytes;
        let live = s.device_bytes_allocated - s.device_bytes_freed;
        s.device_bytes_peak = s.device_bytes_peak.max(live);
    }
}

/// Counts the end of an allocation of `bytes` bytes of `ty` in `s`.
fn record_free(s: &mut AllocatorStatistics, ty: MemoryType, bytes: u64) {
    if ty.contains(MemoryType::HOST_LOCAL) {
        s.host_bytes_freed += bytes;
    }
    if ty.contains(MemoryType::DEVICE_LOCAL) {
        s.device_bytes_freed += bytes;
    }
}

impl AllocationHome for StatsCell {
    fn release(&self, memory_type: MemoryType, bytes: u64, block: Option<HeapBlock>) {
        record_free(&mut self.0.lock(), memory_type, bytes);
        // Heap allocations are not pooled: a block (none is handed here)
        // would just be freed.
        drop(block);
    }
}

/// Makes and imports buffers (upstream's `iree_hal_allocator_t`).
pub trait Allocator: Send + Sync {
    /// Which operations buffers with `params` of `size` bytes support, and
    /// the parameters the allocator would actually use.
    fn query_compatibility(
        &self,
        params: &BufferParams,
        size: u64,
    ) -> (BufferCompatibility, BufferParams);

    /// Allocates a zero-initialized buffer of `size` bytes (a pooling
    /// allocator may return recycled, uninitialized-by-contract contents).
    fn allocate(&self, params: &BufferParams, size: u64) -> Result<Buffer>;

    /// Wraps host memory in a buffer without copying. Read-only memory gives
    /// a buffer that allows READ access only.
    fn import_host(&self, params: &BufferParams, memory: HostMemory) -> Result<Buffer>;

    /// Wraps foreign memory in a buffer without copying where the allocator
    /// can (upstream's `iree_hal_allocator_import_buffer`; see
    /// [`crate::external`]). Read-only memory gives a buffer without WRITE
    /// access. The default imports host allocations through
    /// [`Allocator::import_host`] and refuses device allocations; a driver
    /// with device memory of its own overrides it.
    fn import_buffer(&self, params: &BufferParams, buffer: ExternalBuffer) -> Result<Buffer> {
        import_with_host(self, params, buffer)
    }

    /// True when [`Allocator::import_host`] of `length` bytes of such
    /// memory (`writable` or not) would copy them rather than wrap them:
    /// a caller that can produce the bytes another way (a parameter read
    /// from its file) then skips the import and writes them itself,
    /// without touching the memory it would have imported.
    fn import_copies(&self, _params: &BufferParams, _length: u64, _writable: bool) -> bool {
        false
    }

    /// Current statistics.
    fn statistics(&self) -> AllocatorStatistics;

    /// Releases cached memory, if any.
    fn trim(&self) -> Result<()> {
        Ok(())
    }
}

/// [`Allocator::import_buffer`]'s default: host allocations through
/// [`Allocator::import_host`], device allocations refused (the allocator
/// has no device memory of its own to wrap them as). Also reachable as
/// `ferrite_hal::external::import_with_host`.
pub fn import_with_host<A: Allocator + ?Sized>(
    allocator: &A,
    params: &BufferParams,
    buffer: ExternalBuffer,
) -> Result<Buffer> {
    match buffer.buffer_type() {
        ExternalBufferType::HostAllocation => allocator.import_host(params, buffer.into_host_memory()?),
        ExternalBufferType::DeviceAllocation => bail!(
            InvalidArgument,
            "this allocator has no device memory: it cannot import a device allocation ({} bytes at {:#x}); import it through the device it belongs to",
            buffer.size(),
            buffer.address()
        ),
    }
}

/// The local (CPU) allocator: host memory that devices use directly.
///
/// Like upstream's heap allocator, every buffer is made host-visible, the
/// `OPTIMAL` bit is resolved away, and mapping plus transfer usages are always
/// added; memory that asks to be device-visible also supports queue transfer
/// and dispatch.
#[derive(Default)]
pub struct HeapAllocator {
    stats: Arc<StatsCell>,
}

impl HeapAllocator {
    /// A new allocator with zeroed statistics.
    pub fn new() -> HeapAllocator {
        HeapAllocator::default()
    }

    fn resolve(params: &BufferParams) -> (BufferCompatibility, BufferParams) {
        let mut p = params.canonicalize();
        let mut compat = BufferCompatibility::ALLOCATABLE
            | BufferCompatibility::IMPORTABLE
            | BufferCompatibility::EXPORTABLE;
        if p.memory_type.contains(MemoryType::DEVICE_VISIBLE) {
            if p.usage.intersects(BufferUsage::TRANSFER) {
                compat |= BufferCompatibility::QUEUE_TRANSFER;
            }
            if p.usage.intersects(BufferUsage::DISPATCH) {
                compat |= BufferCompatibility::QUEUE_DISPATCH;
            }
        }
        p.memory_type |= MemoryType::HOST_VISIBLE;
        p.memory_type &= !MemoryType::OPTIMAL;
        p.usage |= BufferUsage::MAPPING_SCOPED
            | BufferUsage::MAPPING_PERSISTENT
            | BufferUsage::MAPPING_ACCESS_RANDOM
            | BufferUsage::TRANSFER;
        (compat, p)
    }

    fn check_alignment(p: &BufferParams) -> Result<usize> {
        let a = p
            .min_alignment
            .max(crate::buffer::ALLOCATION_ALIGNMENT as u64);
        if !a.is_power_of_two() || a > (1 << 30) {
            bail!(InvalidArgument, "unsupported buffer alignment {a}");
        }
        Ok(a as usize)
    }
}

impl Allocator for HeapAllocator {
    fn query_compatibility(
        &self,
        params: &BufferParams,
        _size: u64,
    ) -> (BufferCompatibility, BufferParams) {
        Self::resolve(params)
    }

    fn allocate(&self, params: &BufferParams, size: u64) -> Result<Buffer> {
        let (_, p) = Self::resolve(params);
        let align = Self::check_alignment(&p)?;
        let block = HeapBlock::new_zeroed(size, align)?;
        record_alloc(&mut self.stats.0.lock(), p.memory_type, size);
        let home: Arc<dyn AllocationHome> = self.stats.clone();
        Ok(Buffer::from_allocation(Allocation::new(
            Storage::Heap(block),
            size,
            p.memory_type,
            p.usage,
            p.access,
            Some(home),
            false,
        )))
    }

    fn import_host(&self, params: &BufferParams, memory: HostMemory) -> Result<Buffer> {
        import_host_memory(params, memory)
    }

    fn statistics(&self) -> AllocatorStatistics {
        *self.stats.0.lock()
    }
}

/// [`Allocator::import_host`] of Ferrite's CPU allocators (the heap and the
/// caching pool import alike: the memory wrapped as it is, with the heap's
/// resolved parameters).
fn import_host_memory(params: &BufferParams, memory: HostMemory) -> Result<Buffer> {
    let (_, p) = HeapAllocator::resolve(params);
    check_import(&p, &memory)?;
    Ok(Buffer::from_allocation(Allocation::import(
        memory,
        p.memory_type,
        p.usage,
        p.access,
    )))
}

/// Read-only host memory cannot back a buffer that dispatches may write
/// (`DISPATCH_STORAGE_WRITE` usage): a kernel bound to it could write memory
/// its owner (and safe Rust) treats as immutable. Refusing here, at import,
/// lets callers with a copy path take it (parameter loading, upstream's
/// "try import, else allocate and copy"); devices refuse such a buffer again
/// when a binding that may be written is resolved.
fn check_import(p: &BufferParams, memory: &HostMemory) -> Result<()> {
    let constant = matches!(memory, HostMemory::Constant(_));
    if memory.is_read_only() && !constant && p.usage.contains(BufferUsage::DISPATCH_STORAGE_WRITE) {
        ferrite_base::bail!(
            PermissionDenied,
            "read-only host memory cannot be imported with usage {} (dispatches may write DISPATCH_STORAGE_WRITE buffers)",
            p.usage
        );
    }
    Ok(())
}

/// Rounds a request up to its size class: multiples of 64 bytes up to 4 KiB,
/// then powers of two (so reuse wastes at most half a block).
fn size_class(size: u64) -> u64 {
    const SMALL: u64 = 4096;
    if size <= SMALL {
        size.max(1).div_ceil(64) * 64
    } else {
        size.checked_next_power_of_two().unwrap_or(size)
    }
}

/// Free-list slots: one per size class [`size_class`] can return, small
/// classes (64-byte steps up to 4 KiB) then powers of two from 8 KiB up.
const CLASS_SLOTS: usize = 64 + 51;

/// The free-list slot of a block of `bytes` (exactly a size class); `None`
/// for any other length, which is then not kept. Direct indexing, not a map
/// lookup: one allocation and one release per queue `alloca` took two
/// ordered-map searches.
fn class_slot(bytes: u64) -> Option<usize> {
    if bytes == 0 {
        None
    } else if bytes <= 4096 {
        bytes.is_multiple_of(64).then(|| (bytes / 64 - 1) as usize)
    } else if bytes.is_power_of_two() {
        Some(64 + bytes.trailing_zeros() as usize - 13)
    } else {
        None
    }
}

struct PoolShared {
    free: ferrite_base::spin::SpinLock<PoolFree>,
    max_cached_bytes: u64,
    /// The device whose track pool trace events go on (see `pool_events`).
    device: Option<&'static str>,
}

struct PoolFree {
    /// Free blocks by [`class_slot`]; every block in slot `i` has the
    /// length of that class.
    by_class: [Vec<HeapBlock>; CLASS_SLOTS],
    cached_bytes: u64,
    hits: u64,
    misses: u64,
    /// Blocks in free lists, and live pooled allocations with their bytes
    /// (the state pool trace events report).
    cached_blocks: u64,
    live_blocks: u64,
    live_bytes: u64,
    /// The pool's allocator statistics, under the same lock as the free
    /// lists: an allocation and its end each take one lock, not two.
    stats: AllocatorStatistics,
}

impl Default for PoolFree {
    fn default() -> PoolFree {
        PoolFree {
            by_class: [const { Vec::new() }; CLASS_SLOTS],
            cached_bytes: 0,
            hits: 0,
            misses: 0,
            cached_blocks: 0,
            live_blocks: 0,
            live_bytes: 0,
            stats: AllocatorStatistics::default(),
        }
    }
}

impl PoolFree {
    fn snapshot(&self) -> Snapshot {
        Snapshot {
            reserved: self.live_bytes,
            free: self.cached_bytes,
            reservations: self.live_blocks,
            slabs: self.live_blocks + self.cached_blocks,
        }
    }
}

impl AllocationHome for PoolShared {
    fn release(&self, memory_type: MemoryType, len: u64, block: Option<HeapBlock>) {
        let Some(block) = block else {
            // Not pooled (an alignment the free lists do not keep).
            record_free(&mut self.free.lock().stats, memory_type, len);
            return;
        };
        let bytes = block.len() as u64;
        let traced = ferrite_base::trace::enabled().then(|| block.addr());
        let mut f = self.free.lock();
        record_free(&mut f.stats, memory_type, len);
        f.live_blocks -= 1;
        f.live_bytes -= bytes;
        let slot = class_slot(bytes);
        if slot.is_none() || f.cached_bytes + bytes > self.max_cached_bytes {
            let snap = f.snapshot();
            drop(f);
            drop(block);
            if let Some(addr) = traced {
                pool_events::record(self.device, "pool_release", addr, bytes, snap, &[]);
                pool_events::record(self.device, "slab_release", addr, bytes, snap, &[]);
            }
            return;
        }
        f.cached_bytes += bytes;
        f.cached_blocks += 1;
        if let Some(slot) = slot {
            f.by_class[slot].push(block);
        }
        if let Some(addr) = traced {
            let snap = f.snapshot();
            drop(f);
            pool_events::record(self.device, "pool_release", addr, bytes, snap, &[]);
        }
    }
}

/// A pool in front of the heap: buffers freed (last handle dropped) return
/// their block to a free list keyed by size class, and later allocations of
/// the same class reuse it. Used for queue-ordered `alloca`/`dealloca`.
///
/// Reused blocks keep their previous contents (initialized bytes, never
/// uninitialized memory); fresh blocks are zeroed.
pub struct CachingAllocator {
    /// Free lists and statistics, shared with the allocations made pooled
    /// (their home).
    shared: Arc<PoolShared>,
}

/// Counters of a [`CachingAllocator`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PoolStatistics {
    /// Bytes currently held in free lists.
    pub cached_bytes: u64,
    /// Allocations served from a free list.
    pub hits: u64,
    /// Allocations that needed a fresh block.
    pub misses: u64,
}

impl CachingAllocator {
    /// A pool that keeps at most `max_cached_bytes` of freed blocks; its
    /// trace events go on the host track.
    pub fn new(max_cached_bytes: u64) -> CachingAllocator {
        CachingAllocator::with_track(max_cached_bytes, None)
    }

    /// [`CachingAllocator::new`] for the device with id `device`: its trace
    /// events (reserve, materialize, release, fresh and returned blocks) go
    /// on that device's track, so profiles count them as its memory events.
    pub fn for_device(max_cached_bytes: u64, device: &'static str) -> CachingAllocator {
        CachingAllocator::with_track(max_cached_bytes, Some(device))
    }

    fn with_track(max_cached_bytes: u64, device: Option<&'static str>) -> CachingAllocator {
        CachingAllocator {
            shared: Arc::new(PoolShared {
                free: ferrite_base::spin::SpinLock::new(PoolFree::default()),
                max_cached_bytes,
                device,
            }),
        }
    }

    /// Pool counters.
    pub fn pool_statistics(&self) -> PoolStatistics {
        let f = self.shared.free.lock();
        PoolStatistics {
            cached_bytes: f.cached_bytes,
            hits: f.hits,
            misses: f.misses,
        }
    }
}

impl Allocator for CachingAllocator {
    fn query_compatibility(
        &self,
        params: &BufferParams,
        size: u64,
    ) -> (BufferCompatibility, BufferParams) {
        let _ = size;
        HeapAllocator::resolve(params)
    }

    fn allocate(&self, params: &BufferParams, size: u64) -> Result<Buffer> {
        let (_, p) = HeapAllocator::resolve(params);
        let align = HeapAllocator::check_alignment(&p)?;
        let class = size_class(size);
        let pooled = align == crate::buffer::ALLOCATION_ALIGNMENT;
        let mut snap = None;
        let reused = if pooled {
            let mut f = self.shared.free.lock();
            let block = class_slot(class).and_then(|s| f.by_class[s].pop());
            match &block {
                Some(b) => {
                    f.cached_bytes -= b.len() as u64;
                    f.cached_blocks -= 1;
                    f.hits += 1;
                    // Served: counted here, under the lock already held.
                    record_alloc(&mut f.stats, p.memory_type, size);
                }
                None => f.misses += 1,
            }
            // Counted live now (a fresh block's failure undoes it below).
            f.live_blocks += 1;
            f.live_bytes += class;
            if ferrite_base::trace::enabled() {
                snap = Some(f.snapshot());
            }
            block
        } else {
            None
        };
        let was_reused = reused.is_some();
        let block = match reused {
            Some(b) => b,
            None => HeapBlock::new_zeroed(class, align).inspect_err(|_| {
                if pooled {
                    let mut f = self.shared.free.lock();
                    f.live_blocks -= 1;
                    f.live_bytes -= class;
                }
            })?,
        };
        let backing = snap.map(|s| (s, block.addr()));
        if !was_reused {
            // A fresh block (rare on a warm pool): counted once it exists.
            record_alloc(&mut self.shared.free.lock().stats, p.memory_type, size);
        }
        let home: Arc<dyn AllocationHome> = self.shared.clone();
        let buffer = Buffer::from_allocation(Allocation::new(
            Storage::Heap(block),
            size,
            p.memory_type,
            p.usage,
            p.access,
            Some(home),
            pooled,
        ));
        if let Some((snap, addr)) = backing {
            let device = self.shared.device;
            let id = buffer.allocation_id();
            if !was_reused {
                pool_events::record(device, "slab_acquire", addr, class, snap, &[]);
            }
            let reserve = [
                ("allocation", id),
                ("requested", size),
                ("reused", was_reused as u64),
            ];
            pool_events::record(device, "pool_reserve", addr, class, snap, &reserve);
            let materialize = [("allocation", id), ("requested", size)];
            pool_events::record(device, "pool_materialize", addr, class, snap, &materialize);
        }
        Ok(buffer)
    }

    fn import_host(&self, params: &BufferParams, memory: HostMemory) -> Result<Buffer> {
        import_host_memory(params, memory)
    }

    fn statistics(&self) -> AllocatorStatistics {
        self.shared.free.lock().stats
    }

    fn trim(&self) -> Result<()> {
        let (blocks, snap) = {
            let mut f = self.shared.free.lock();
            f.cached_bytes = 0;
            f.cached_blocks = 0;
            let blocks = std::mem::replace(&mut f.by_class, [const { Vec::new() }; CLASS_SLOTS]);
            (blocks, f.snapshot())
        };
        if ferrite_base::trace::enabled() {
            let device = self.shared.device;
            for block in blocks.iter().flatten() {
                let len = block.len() as u64;
                pool_events::record(device, "slab_release", block.addr(), len, snap, &[]);
            }
        }
        drop(blocks);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_size_class_has_a_slot_of_its_own() {
        let mut seen = [None; CLASS_SLOTS];
        let sizes = (1..=4096u64).chain((13..64).flat_map(|b| [(1u64 << b) - 1, 1 << b]));
        for size in sizes {
            let class = size_class(size);
            let slot = class_slot(class).expect("a size class has a slot");
            match seen[slot] {
                None => seen[slot] = Some(class),
                Some(c) => assert_eq!(c, class, "slot {slot} shared by two classes"),
            }
        }
        assert!(
            seen.iter().all(Option::is_some),
            "every slot is some class's"
        );
        for not_a_class in [0, 1, 63, 65, 4097, 8191, 12288, u64::MAX] {
            assert_eq!(class_slot(not_a_class), None, "{not_a_class}");
        }
    }

    #[test]
    fn heap_params_and_stats() {
        let a = HeapAllocator::new();
        let params = BufferParams::new(MemoryType::DEVICE_LOCAL, BufferUsage::DEFAULT);
        let (compat, p) = a.query_compatibility(&params, 16);
        assert!(
            compat.contains(BufferCompatibility::QUEUE_DISPATCH | BufferCompatibility::ALLOCATABLE)
        );
        assert_eq!(p.memory_type.to_string(), "DEVICE_LOCAL|HOST_VISIBLE");
        assert_eq!(
            p.usage.to_string(),
            "TRANSFER|DISPATCH_STORAGE|MAPPING|MAPPING_PERSISTENT"
        );
        let b = a.allocate(&params, 100).unwrap();
        assert_eq!(b.to_vec().unwrap(), vec![0u8; 100]);
        let s = a.statistics();
        assert_eq!(
            (
                s.device_bytes_allocated,
                s.device_bytes_peak,
                s.host_bytes_allocated
            ),
            (100, 100, 0)
        );
        let sub = b.subspan(10, 10).unwrap();
        drop(b);
        assert_eq!(a.statistics().device_bytes_freed, 0);
        drop(sub);
        assert_eq!(a.statistics().device_bytes_freed, 100);
        // Same sequence as an upstream Python session (local-task heap):
        // its repr and formatted statistics are quoted in the asserts.
        let h = a
            .allocate(
                &BufferParams::new(
                    MemoryType::HOST_LOCAL | MemoryType::DEVICE_VISIBLE,
                    BufferUsage::TRANSFER,
                ),
                100,
            )
            .unwrap();
        assert_eq!(h.memory_type().to_string(), "HOST_LOCAL|DEVICE_VISIBLE");
        assert_eq!(
            h.allowed_usage().to_string(),
            "TRANSFER|MAPPING|MAPPING_PERSISTENT"
        );
        assert_eq!(h.allowed_access().to_string(), "ALL");
        assert_eq!(
            a.statistics().to_string(),
            "  HOST_LOCAL:          100B peak /          100B allocated /            0B freed /          100B live\n\
             DEVICE_LOCAL:          100B peak /          100B allocated /          100B freed /            0B live"
        );
        drop(h);
        assert!(a.allocate(&BufferParams::default(), u64::MAX).is_err());
    }

    #[test]
    fn caching_reuses_blocks() {
        let pool = CachingAllocator::new(1 << 20);
        let p = BufferParams::default();
        let b = pool.allocate(&p, 1000).unwrap();
        let addr = b.binding_ptr(0, 1, MemoryAccess::READ).unwrap().as_ptr() as usize;
        drop(b);
        assert_eq!(pool.pool_statistics().cached_bytes, 1024);
        let b2 = pool.allocate(&p, 1010).unwrap();
        assert_eq!(b2.byte_length(), 1010);
        assert_eq!(
            b2.binding_ptr(0, 1, MemoryAccess::READ).unwrap().as_ptr() as usize,
            addr
        );
        assert_eq!(pool.pool_statistics().hits, 1);
        let b3 = pool.allocate(&p, 5000).unwrap();
        assert_eq!(b3.allocation_size(), 5000);
        drop(b3);
        assert_eq!(pool.pool_statistics().cached_bytes, 8192);
        pool.trim().unwrap();
        assert_eq!(pool.pool_statistics().cached_bytes, 0);
        // Buffers outliving the pool free their block normally.
        drop(pool);
        drop(b2);
    }

    /// The pool's statistics (kept under its free-list lock) count every
    /// allocation and every end: fresh blocks, reused blocks, and
    /// allocations of an alignment the free lists do not keep.
    #[test]
    fn caching_statistics_count_reused_and_unpooled() {
        let pool = CachingAllocator::new(1 << 20);
        let p = BufferParams::new(MemoryType::DEVICE_LOCAL, BufferUsage::DEFAULT);
        let a = pool.allocate(&p, 100).unwrap();
        drop(a);
        let b = pool.allocate(&p, 100).unwrap();
        assert_eq!(pool.pool_statistics().hits, 1);
        let aligned = BufferParams {
            min_alignment: 128,
            ..p
        };
        let c = pool.allocate(&aligned, 300).unwrap();
        let s = pool.statistics();
        assert_eq!(s.device_bytes_allocated, 500);
        assert_eq!(s.device_bytes_freed, 100);
        assert_eq!(s.device_bytes_peak, 400);
        drop((b, c));
        let s = pool.statistics();
        assert_eq!(s.device_bytes_freed, 500);
        // Only the pooled block is cached; the aligned one was freed.
        assert_eq!(pool.pool_statistics().cached_bytes, 128);
    }
}
