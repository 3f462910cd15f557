//! CUDA memory: the allocator, the buffer storage kinds and the pinned
//! words that carry semaphore payloads to the GPU.
//!
//! | request | memory |
//! | --- | --- |
//! | device-local, not host-visible | device memory from the device's stream-ordered pool (`cuMemAllocAsync`; queue `alloca` allocates on the queue's stream, the allocator on a transfer stream it then synchronizes) |
//! | host-visible (any) | pinned, mapped host memory (`cuMemHostAlloc` with `DEVICEMAP`): the host maps it directly, kernels read it over the bus; idle blocks are kept for reuse by size (at most [`PINNED_SPARE_MAX_BYTES`]), never ones handed outside Ferrite |
//! | import of host memory | read-only or at most 1 MiB: copied into device memory; larger writable memory: `cuMemHostRegister` (mapped) |
//! | import of a device allocation ([`ExternalBuffer::device_allocation`] through [`Allocator::import_buffer`]) | wrapped in place (no copy) after checking the pointer's device, context and allocation range; never freed by Ferrite: its owner is dropped (the release) with the last buffer |
//!
//! Device memory is freed stream-ordered (`cuMemFreeAsync` on the queue
//! stream) when its last buffer is dropped, so work enqueued before the
//! drop still sees it. Every queue operation keeps the buffers it uses
//! until it completes, so the last drop of imported device memory (and so
//! its release) comes after all queue work using it.

use crate::context::CudaContext;
use crate::ffi::{self, CUdeviceptr};
use ferrite_base::{bail, status, Result};
use ferrite_hal::allocator::{Allocator, AllocatorStatistics, BufferParams};
use ferrite_hal::buffer::{Buffer, DeviceMemory, HostMemory};
use ferrite_hal::external::{ExternalBuffer, ExternalBufferType, NativeMemory};
use ferrite_hal::memory::{BufferCompatibility, BufferUsage, MemoryAccess, MemoryType};
use ferrite_hal::semaphore::DeviceTimeline;
use parking_lot::Mutex;
use std::any::Any;
use std::collections::{BTreeMap, HashMap, VecDeque};
use std::ffi::c_void;
use std::ptr::NonNull;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

/// How a [`CudaMemory`] was obtained (and how it is released).
enum Kind {
    /// Pool memory (`cuMemAllocAsync`), freed with `cuMemFreeAsync`.
    Device,
    /// Pinned host memory (`cuMemHostAlloc`), freed with `cuMemFreeHost`.
    Pinned(NonNull<u8>),
    /// Registered host memory; unregistered, then the owner is dropped.
    Registered(NonNull<u8>, #[allow(dead_code)] HostMemory),
    /// Device memory allocated by someone else: never freed here; dropping
    /// the owner releases it (e.g. runs a DLPack producer's deleter).
    External(#[allow(dead_code)] Box<dyn Send + Sync>),
}

/// A CUDA allocation behind a [`Buffer`].
pub struct CudaMemory {
    shared: Arc<CudaContext>,
    dptr: CUdeviceptr,
    len: u64,
    kind: Kind,
    /// Handed to a user outside Ferrite (DLPack): see
    /// [`CudaMemory::mark_exported`].
    exported: AtomicBool,
}

// SAFETY: the device pointer and pinned host pointers are process-wide
// addresses owned by this value; access to the bytes follows the HAL
// buffer contract (queue ordering).
unsafe impl Send for CudaMemory {}
// SAFETY: see above.
unsafe impl Sync for CudaMemory {}

impl CudaMemory {
    /// The device address of byte 0 (0 for an empty allocation).
    pub fn device_ptr(&self) -> CUdeviceptr {
        self.dptr
    }

    /// True when `shared` is the device this memory belongs to.
    pub fn belongs_to(&self, shared: &Arc<CudaContext>) -> bool {
        Arc::ptr_eq(&self.shared, shared)
    }

    /// The device this memory belongs to.
    pub fn shared(&self) -> &Arc<CudaContext> {
        &self.shared
    }

    /// Marks the memory as handed to a user outside Ferrite (a DLPack
    /// consumer), whose own streams may still use it after the last
    /// Ferrite buffer is dropped: it is then freed stream-ordered on the
    /// queue stream (after whatever the export ordered before that stream)
    /// instead of being kept as an idle spare block, which queue
    /// allocations reuse without any stream ordering.
    pub fn mark_exported(&self) {
        self.exported.store(true, Ordering::Relaxed);
    }

    /// True for device-only memory (pool or imported device memory); false
    /// for pinned or registered host memory, which the host addresses too.
    pub fn is_device_local(&self) -> bool {
        matches!(self.kind, Kind::Device | Kind::External(_))
    }
}

impl Drop for CudaMemory {
    fn drop(&mut self) {
        match self.kind {
            Kind::Device => self.shared.stats.record_free(false, self.len),
            Kind::Pinned(_) => self.shared.stats.record_free(true, self.len),
            Kind::Registered(..) | Kind::External(_) => {}
        }
        let api = self.shared.api;
        if matches!(self.kind, Kind::External(_)) || self.shared.make_current().is_err() {
            return;
        }
        match &self.kind {
            Kind::Device => {
                if self.dptr == 0 {
                    return;
                }
                let free = if self.exported.load(Ordering::Relaxed) {
                    vec![self.dptr]
                } else {
                    // Kept; what the spare forgets to make room is freed.
                    self.shared.spare.put(self.len, self.dptr)
                };
                for &p in &free {
                    // SAFETY: `p` came from cuMemAllocAsync (this block, or
                    // an idle spare block no buffer refers to any more) and
                    // is freed once, ordered after all work enqueued on the
                    // queue stream so far (which is all work that can use
                    // it).
                    unsafe { (api.cuMemFreeAsync)(p, self.shared.stream) };
                }
                crate::profile::pool_released(&self.shared, self.dptr, self.len, &free);
            }
            Kind::Pinned(p) => {
                // Kept for the next allocation of this size: a pinned
                // allocation is a driver call that, once no other pinned
                // block keeps the driver's 2 MiB pinned chunk, pins a new
                // one (about a millisecond), e.g. for every staging buffer
                // of a device-to-host copy. Memory handed outside Ferrite
                // is not kept: its users' streams may still read it.
                let size = self.len.max(1);
                let host = p.as_ptr() as u64;
                let free = if self.exported.load(Ordering::Relaxed) {
                    vec![host]
                } else {
                    self.shared.pinned_spare.put(size, host)
                };
                for h in free {
                    // SAFETY: `h` came from cuMemHostAlloc (this block, or
                    // an idle spare block no buffer refers to any more) and
                    // is freed once (the spare no longer keeps it).
                    unsafe { (api.cuMemFreeHost)(h as *mut c_void) };
                }
            }
            // SAFETY: registered by cuMemHostRegister; unregistered once,
            // before the owner (a field) is dropped.
            Kind::Registered(p, _) => unsafe {
                (api.cuMemHostUnregister)(p.as_ptr() as *mut c_void);
            },
            // Not ours to free: the owner (a field) is dropped after this.
            Kind::External(_) => {}
        }
    }
}

// SAFETY: `len` is fixed at creation; `host_ptr` is the pinned or registered
// host mapping of exactly `len` bytes, freed only in Drop (so valid while
// `self` lives) and reached only through the HAL's checked accessors; `read`
// and `write` check their ranges before any copy; `native` gives `dptr`,
// the CUDA address of those `len` bytes on the context's device (device
// memory, the mapping's device address, or an import checked against its
// allocation when made), freed only in Drop as well.
unsafe impl DeviceMemory for CudaMemory {
    fn len(&self) -> u64 {
        self.len
    }
    fn host_ptr(&self) -> Option<NonNull<u8>> {
        match &self.kind {
            Kind::Device | Kind::External(_) => None,
            Kind::Pinned(p) | Kind::Registered(p, _) => Some(*p),
        }
    }
    fn read(&self, offset: u64, dst: &mut [u8]) -> Result<()> {
        ferrite_hal::buffer::check_device_range(self.len, offset, dst.len())?;
        self.shared.copy_sync(
            dst.as_mut_ptr() as CUdeviceptr,
            self.dptr + offset,
            dst.len(),
        )
    }
    fn write(&self, offset: u64, src: &[u8]) -> Result<()> {
        ferrite_hal::buffer::check_device_range(self.len, offset, src.len())?;
        self.shared
            .copy_sync(self.dptr + offset, src.as_ptr() as CUdeviceptr, src.len())
    }
    fn as_any(&self) -> &dyn Any {
        self
    }
    fn native(&self) -> Option<NativeMemory> {
        Some(NativeMemory {
            queue: self.shared.clone(),
            device_address: self.dptr,
            device_local: self.is_device_local(),
        })
    }
    fn mark_exported(&self) {
        CudaMemory::mark_exported(self)
    }
}

/// Imports of at most this many bytes are copies.
const COPY_IMPORT_MAX_BYTES: usize = 1 << 20;

/// Reads one `cuPointerGetAttribute` value of type `T`.
///
/// # Safety
/// `T` is the type cuda.h gives `attribute` (the driver writes that many
/// bytes).
unsafe fn pointer_attribute<T: Default>(
    api: &ffi::Api,
    attribute: i32,
    dptr: CUdeviceptr,
) -> Result<T> {
    let mut v = T::default();
    ffi::check(
        // SAFETY: `v` is an out-value of the type cuda.h gives `attribute`
        // (the caller's contract); the driver validates `dptr` itself and
        // fails for addresses it does not know.
        unsafe { (api.cuPointerGetAttribute)(&mut v as *mut T as *mut c_void, attribute, dptr) },
        &format!("address {dptr:#x} is not memory the CUDA driver knows (cuPointerGetAttribute)"),
    )?;
    Ok(v)
}

/// Checks that `[dptr, dptr + len)` is device memory of device `shared`:
/// device (or managed) memory, of that device's ordinal and context (when
/// the driver reports one), inside one allocation.
pub(crate) fn check_device_range(shared: &CudaContext, dptr: CUdeviceptr, len: u64) -> Result<()> {
    if len == 0 {
        return Ok(());
    }
    let api = shared.api;
    shared.make_current()?;
    // Each query's out-type is the attribute's in cuda.h (unsigned int,
    // int, CUcontext, CUdeviceptr, size_t).
    let mem_type: std::ffi::c_uint =
        // SAFETY: as the comment above says.
        unsafe { pointer_attribute(api, ffi::CU_POINTER_ATTRIBUTE_MEMORY_TYPE, dptr) }?;
    if mem_type != ffi::CU_MEMORYTYPE_DEVICE && mem_type != ffi::CU_MEMORYTYPE_UNIFIED {
        bail!(
            InvalidArgument,
            "address {dptr:#x} is {} memory, not CUDA device memory",
            if mem_type == ffi::CU_MEMORYTYPE_HOST {
                "host"
            } else {
                "non-device"
            }
        );
    }
    let ordinal: std::ffi::c_int =
        // SAFETY: as above.
        unsafe { pointer_attribute(api, ffi::CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL, dptr) }?;
    if ordinal != shared.ordinal {
        bail!(
            InvalidArgument,
            "device memory at {dptr:#x} belongs to CUDA device {ordinal}, expected CUDA device {}",
            shared.ordinal
        );
    }
    // Stream-ordered and virtual-memory allocations report no context; an
    // allocation of another context on the same device is refused.
    let ctx: ffi::CUcontext =
        // SAFETY: as above.
        unsafe { pointer_attribute(api, ffi::CU_POINTER_ATTRIBUTE_CONTEXT, dptr) }
            .unwrap_or(std::ptr::null_mut());
    if !ctx.is_null() && ctx != shared.ctx {
        bail!(
            InvalidArgument,
            "device memory at {dptr:#x} belongs to another CUDA context of device {ordinal} (expected the device's primary context)"
        );
    }
    let start: CUdeviceptr =
        // SAFETY: as above.
        unsafe { pointer_attribute(api, ffi::CU_POINTER_ATTRIBUTE_RANGE_START_ADDR, dptr) }?;
    let size: usize =
        // SAFETY: as above.
        unsafe { pointer_attribute(api, ffi::CU_POINTER_ATTRIBUTE_RANGE_SIZE, dptr) }?;
    let end = start.saturating_add(size as u64);
    if dptr < start || dptr.checked_add(len).is_none_or(|e| e > end) {
        bail!(
            OutOfRange,
            "{len} bytes at {dptr:#x} do not fit in their CUDA allocation [{start:#x}, {end:#x})"
        );
    }
    Ok(())
}

/// A buffer over device memory someone else allocated: an
/// [`ExternalBufferType::DeviceAllocation`] import (see
/// [`CudaAllocator`]'s `import_buffer`). The pointer is checked first with
/// `cuPointerGetAttribute`: it must be device (or managed) memory of this
/// device's ordinal and context, and the range must lie inside one
/// allocation; otherwise INVALID_ARGUMENT / OUT_OF_RANGE naming what was
/// expected and what was found. `params` asks for device-local memory;
/// read-only memory loses WRITE access and dispatch-write usage.
///
/// The release (`owner`) is dropped exactly once: when the last buffer
/// using the memory is dropped, or before an error is returned. Queue
/// operations keep their buffers until they complete, so the release
/// follows all queue work using the memory.
fn external_buffer(
    shared: &Arc<CudaContext>,
    params: &BufferParams,
    external: ExternalBuffer,
) -> Result<Buffer> {
    let p = params.canonicalize();
    if p.memory_type.contains(MemoryType::HOST_VISIBLE) {
        bail!(
            InvalidArgument,
            "a CUDA device allocation imports as device-local memory, not {}",
            p.memory_type
        );
    }
    // The contract `ExternalBuffer::device_allocation`'s caller vouched
    // for: the range stays valid device memory of this device until
    // `owner` is dropped, which the buffer does after its last use.
    let (dptr, len, writable, owner) = external.into_parts();
    let (mut usage, mut access) = (p.usage, p.access);
    if !writable {
        usage.remove(BufferUsage::DISPATCH_STORAGE_WRITE);
        access.remove(MemoryAccess::WRITE | MemoryAccess::DISCARD);
    }
    check_device_range(shared, dptr, len)?;
    Ok(Buffer::from_device_memory(
        Box::new(CudaMemory {
            shared: shared.clone(),
            dptr,
            len,
            kind: Kind::External(owner),
            exported: AtomicBool::new(false),
        }),
        MemoryType::DEVICE_LOCAL,
        usage | BufferUsage::TRANSFER,
        access,
    ))
}

/// A device's allocation statistics: every device block (allocations,
/// queue allocations, spare blocks handed out again) and pinned host block
/// counts from its creation until its last user drops it, as the CPU
/// drivers count heap and pool blocks. Imported memory is not counted.
#[derive(Default)]
pub(crate) struct AllocationStats(Mutex<AllocatorStatistics>);

impl AllocationStats {
    /// `bytes` more are live (`host`: pinned host memory).
    pub(crate) fn record_alloc(&self, host: bool, bytes: u64) {
        let mut s = self.0.lock();
        if host {
            s.host_bytes_allocated += bytes;
            let live = s.host_bytes_allocated - s.host_bytes_freed;
            s.host_bytes_peak = s.host_bytes_peak.max(live);
        } else {
            s.device_bytes_allocated += bytes;
            let live = s.device_bytes_allocated - s.device_bytes_freed;
            s.device_bytes_peak = s.device_bytes_peak.max(live);
        }
    }

    /// `bytes` are no longer used by anyone.
    pub(crate) fn record_free(&self, host: bool, bytes: u64) {
        let mut s = self.0.lock();
        if host {
            s.host_bytes_freed += bytes;
        } else {
            s.device_bytes_freed += bytes;
        }
    }

    /// The statistics so far.
    pub(crate) fn get(&self) -> AllocatorStatistics {
        *self.0.lock()
    }
}

/// The CUDA allocator of one device.
pub struct CudaAllocator {
    shared: Arc<CudaContext>,
}

impl CudaAllocator {
    /// The allocator of the device `shared`.
    pub fn new(shared: Arc<CudaContext>) -> CudaAllocator {
        CudaAllocator { shared }
    }

    fn resolve(params: &BufferParams) -> (MemoryType, BufferUsage, MemoryAccess) {
        let p = params.canonicalize();
        let ty = if p.memory_type.contains(MemoryType::HOST_VISIBLE) {
            MemoryType::HOST_LOCAL | MemoryType::DEVICE_VISIBLE
        } else {
            MemoryType::DEVICE_LOCAL
        };
        let mut usage = p.usage | BufferUsage::TRANSFER | BufferUsage::DISPATCH_STORAGE;
        if ty.contains(MemoryType::HOST_VISIBLE) {
            usage |= BufferUsage::MAPPING;
        }
        (ty, usage, p.access)
    }

    /// An idle spare block of `size` bytes as a buffer (see
    /// [`SpareBlocks`]), usable at once from any stream or the host.
    pub(crate) fn spare_device_buffer(
        shared: &Arc<CudaContext>,
        params: &BufferParams,
        size: u64,
    ) -> Option<Buffer> {
        let dptr = shared.spare.take(size)?;
        let b = Self::device_memory_buffer(shared, params, dptr, size);
        crate::profile::pool_acquired(shared, &b, dptr, size, true);
        Some(b)
    }

    /// A buffer over the device block `[dptr, dptr+size)`, which it owns.
    fn device_memory_buffer(
        shared: &Arc<CudaContext>,
        params: &BufferParams,
        dptr: CUdeviceptr,
        size: u64,
    ) -> Buffer {
        let (_, usage, access) = Self::resolve(params);
        shared.stats.record_alloc(false, size);
        Buffer::from_device_memory(
            Box::new(CudaMemory {
                shared: shared.clone(),
                dptr,
                len: size,
                kind: Kind::Device,
                exported: AtomicBool::new(false),
            }),
            MemoryType::DEVICE_LOCAL,
            usage,
            access,
        )
    }

    /// Device-local memory of `size` bytes allocated in stream order on
    /// `stream` (the queue stream for alloca).
    pub(crate) fn device_buffer(
        shared: &Arc<CudaContext>,
        params: &BufferParams,
        size: u64,
        stream: ffi::CUstream,
    ) -> Result<Buffer> {
        let mut dptr: CUdeviceptr = 0;
        if size > 0 {
            // SAFETY: `dptr` is a valid out-pointer; the stream belongs to
            // the current context.
            let alloc = |dptr: &mut CUdeviceptr| unsafe {
                (shared.api.cuMemAllocAsync)(dptr, size as usize, stream)
            };
            let mut r = alloc(&mut dptr);
            if r == ffi::CUDA_ERROR_OUT_OF_MEMORY {
                // Idle spare blocks go back to the pool before giving up.
                let idle = shared.spare.drain();
                for &p in &idle {
                    // SAFETY: idle pool blocks of this context, freed once.
                    unsafe { (shared.api.cuMemFreeAsync)(p, stream) };
                }
                crate::profile::pool_returned(shared, &idle);
                r = alloc(&mut dptr);
            }
            ffi::check(r, &format!("allocating {size} bytes of device memory"))?;
        }
        let b = Self::device_memory_buffer(shared, params, dptr, size);
        crate::profile::pool_acquired(shared, &b, dptr, size, false);
        Ok(b)
    }

    fn pinned_buffer(&self, params: &BufferParams, size: u64) -> Result<Buffer> {
        let (ty, usage, access) = Self::resolve(params);
        let api = self.shared.api;
        let mut host: *mut c_void = match self.shared.pinned_spare.take(size.max(1)) {
            Some(p) => p as *mut c_void,
            None => std::ptr::null_mut(),
        };
        if host.is_null() {
            ffi::check(
                // SAFETY: valid out-pointer; a size of at least 1 byte.
                unsafe {
                    (api.cuMemHostAlloc)(
                        &mut host,
                        size.max(1) as usize,
                        ffi::CU_MEMHOSTALLOC_PORTABLE_DEVICEMAP,
                    )
                },
                &format!("allocating {size} bytes of pinned host memory"),
            )?;
        }
        let Some(p) = NonNull::new(host as *mut u8) else {
            bail!(
                ResourceExhausted,
                "cuMemHostAlloc returned null for {size} bytes"
            );
        };
        // Zeroed as the HAL's allocate promises.
        // SAFETY: the allocation is valid for `size` bytes and unshared.
        unsafe { std::ptr::write_bytes(p.as_ptr(), 0, size as usize) };
        let mut dptr: CUdeviceptr = 0;
        // SAFETY: `host` is a pinned, mapped allocation.
        let r = unsafe { (api.cuMemHostGetDevicePointer_v2)(&mut dptr, host, 0) };
        // Counted from here: dropping `mem` (also on the error below)
        // records the free.
        self.shared.stats.record_alloc(true, size);
        let mem = CudaMemory {
            shared: self.shared.clone(),
            dptr,
            len: size,
            kind: Kind::Pinned(p),
            exported: AtomicBool::new(false),
        };
        ffi::check(r, "mapping pinned host memory for the device")?;
        Ok(Buffer::from_device_memory(Box::new(mem), ty, usage, access))
    }
}

impl Allocator for CudaAllocator {
    fn query_compatibility(
        &self,
        params: &BufferParams,
        _size: u64,
    ) -> (BufferCompatibility, BufferParams) {
        let p = params.canonicalize();
        let (ty, usage, access) = Self::resolve(&p);
        let mut compat = BufferCompatibility::ALLOCATABLE
            | BufferCompatibility::IMPORTABLE
            | BufferCompatibility::QUEUE_TRANSFER
            | BufferCompatibility::QUEUE_DISPATCH;
        if ty.contains(MemoryType::HOST_VISIBLE) {
            compat |= BufferCompatibility::EXPORTABLE;
        }
        let resolved = BufferParams {
            memory_type: ty,
            usage,
            access,
            ..p
        };
        (compat, resolved)
    }

    fn allocate(&self, params: &BufferParams, size: u64) -> Result<Buffer> {
        self.shared.make_current()?;
        let (ty, _, _) = Self::resolve(params);
        let b = if ty.contains(MemoryType::HOST_VISIBLE) {
            self.pinned_buffer(params, size)?
        } else {
            // An idle spare block of the size first: blocks this allocator
            // made come back there when dropped (a program's inputs, made
            // anew for every call), and were kept unused until forgotten
            // when only queue allocations took them. Otherwise on the
            // transfer stream, synchronized: usable from any stream and by
            // the host at once (never waits on the queue stream, which may
            // be blocked on a semaphore the caller signals later).
            let spare = match size {
                0 => None,
                _ => Self::spare_device_buffer(&self.shared, params, size),
            };
            let b = match spare {
                Some(b) => b,
                None => {
                    Self::device_buffer(&self.shared, params, size, self.shared.transfer_stream)?
                }
            };
            if size > 0 {
                let dptr = b
                    .device_memory()
                    .and_then(|m| m.as_any().downcast_ref::<CudaMemory>())
                    .map_or(0, |m| m.dptr);
                ffi::check(
                    // SAFETY: zeroing the fresh allocation on the stream it was
                    // allocated on, or an idle spare block (no work uses it:
                    // see `SpareBlocks`).
                    unsafe {
                        (self.shared.api.cuMemsetD8Async)(
                            dptr,
                            0,
                            size as usize,
                            self.shared.transfer_stream,
                        )
                    },
                    "zeroing a new allocation",
                )?;
            }
            self.shared.sync_transfer()?;
            b
        };
        Ok(b)
    }

    fn import_copies(&self, _params: &BufferParams, length: u64, writable: bool) -> bool {
        !writable || length <= COPY_IMPORT_MAX_BYTES as u64
    }

    fn import_buffer(&self, params: &BufferParams, buffer: ExternalBuffer) -> Result<Buffer> {
        match buffer.buffer_type() {
            ExternalBufferType::HostAllocation => {
                self.import_host(params, buffer.into_host_memory()?)
            }
            ExternalBufferType::DeviceAllocation => external_buffer(&self.shared, params, buffer),
        }
    }

    fn import_host(&self, params: &BufferParams, memory: HostMemory) -> Result<Buffer> {
        self.shared.make_current()?;
        let p = params.canonicalize();
        let (bytes_ptr, len) = memory.raw_parts();
        let bytes_ptr = bytes_ptr as *mut u8;
        // Read-only and small memory is copied into device memory (kernels
        // read it at full speed, and registering costs more than copying a
        // small input); large writable memory is registered and mapped.
        let writable = memory.is_writable() && len > COPY_IMPORT_MAX_BYTES;
        if !writable || len == 0 {
            let mut copy_params = BufferParams::new(MemoryType::DEVICE_LOCAL, p.usage);
            copy_params.access = p.access;
            if !memory.is_writable() {
                // Read-only memory gives a read-only buffer, copy or not
                // (the `Allocator::import_host` contract).
                copy_params
                    .access
                    .remove(MemoryAccess::WRITE | MemoryAccess::DISCARD);
            }
            let b = self.allocate(&copy_params, len as u64)?;
            if len > 0 {
                let dptr = b
                    .device_memory()
                    .and_then(|m| m.as_any().downcast_ref::<CudaMemory>())
                    .map(|m| m.dptr)
                    .ok_or_else(|| status!(Internal, "device allocation without device memory"))?;
                // A driver copy from the raw address: foreign memory (a
                // numpy array Python may write) is never viewed as a Rust
                // slice; `memory` keeps the `len` bytes alive for this call,
                // and `dptr` is a fresh allocation of `len` bytes.
                self.shared.copy_sync(dptr, bytes_ptr as CUdeviceptr, len)?;
            }
            return Ok(b);
        }
        let api = self.shared.api;
        ffi::check(
            // SAFETY: `bytes_ptr` is valid for `len` bytes while `memory` lives,
            // and `memory` is kept in the buffer until after unregistering.
            unsafe {
                (api.cuMemHostRegister_v2)(
                    bytes_ptr as *mut c_void,
                    len,
                    ffi::CU_MEMHOSTREGISTER_PORTABLE_DEVICEMAP,
                )
            },
            &format!("registering {len} bytes of host memory"),
        )?;
        let mut dptr: CUdeviceptr = 0;
        // SAFETY: registered just above with DEVICEMAP.
        let r =
            unsafe { (api.cuMemHostGetDevicePointer_v2)(&mut dptr, bytes_ptr as *mut c_void, 0) };
        let Some(p_host) = NonNull::new(bytes_ptr) else {
            bail!(Internal, "host memory with a null pointer");
        };
        let mem = CudaMemory {
            shared: self.shared.clone(),
            dptr,
            len: len as u64,
            kind: Kind::Registered(p_host, memory),
            exported: AtomicBool::new(false),
        };
        ffi::check(r, "mapping registered host memory for the device")?;
        Ok(Buffer::from_device_memory(
            Box::new(mem),
            MemoryType::HOST_LOCAL | MemoryType::DEVICE_VISIBLE,
            p.usage | BufferUsage::TRANSFER | BufferUsage::DISPATCH_STORAGE | BufferUsage::MAPPING,
            p.access,
        ))
    }

    fn statistics(&self) -> AllocatorStatistics {
        self.shared.stats.get()
    }
}

/// Device-local blocks whose last user has finished, kept for reuse by
/// allocations of the same size (queue allocations and the allocator's
/// own).
///
/// A device buffer is dropped only once every queue operation that used it
/// has completed (queue operations keep their buffers until reported), so
/// a spare block is idle: reusing it needs no stream ordering. Memory
/// handed outside Ferrite ([`CudaMemory::mark_exported`]) is never kept:
/// its users' streams are not Ferrite's queue. A queue
/// allocation served from here is therefore complete at once (no stream
/// operation, no completion to report), which matters for programs that
/// allocate transients on every call, with `FERRITE_CUDA_ALLOCA_INIT=none`.
/// (By default, and with `poison`, see [`crate::diagnostics`], queue
/// allocations are filled on the queue stream before use, and spare blocks
/// are not handed out at once.)
///
/// Bounded to [`SPARE_MAX_BYTES`] and [`SPARE_MAX_BLOCKS`]: a block that
/// would pass either bound makes room by giving the oldest idle blocks
/// back (to the stream-ordered pool), so blocks of sizes nobody asks for
/// again (a transient shape that does not come back, a call's small
/// inputs) leave in time instead of holding the spare, and with them
/// whatever the driver keeps on the host per allocation (issue 29: a
/// serving step's small inputs were such blocks, about 4 a step kept for
/// ever, the likely cause of a cuda server's heap growing with its
/// requests).
///
/// The same structure, bounded to [`PINNED_SPARE_MAX_BYTES`], keeps idle
/// pinned host blocks (by host address) for host-visible allocations,
/// under the same rules.
pub struct SpareBlocks {
    inner: Mutex<Spares>,
    max_bytes: u64,
    max_blocks: usize,
}

impl Default for SpareBlocks {
    fn default() -> SpareBlocks {
        SpareBlocks::with_limit(SPARE_MAX_BYTES)
    }
}

#[derive(Default)]
struct Spares {
    /// Idle blocks by size, each with the stamp it was kept under, oldest
    /// first.
    by_size: HashMap<u64, VecDeque<(u64, CUdeviceptr)>>,
    /// Every idle block's size by stamp: the oldest is the first.
    ages: BTreeMap<u64, u64>,
    /// The next block's stamp.
    next_stamp: u64,
    bytes: u64,
}

impl Spares {
    /// Forgets the oldest block and returns it.
    fn pop_oldest(&mut self) -> Option<CUdeviceptr> {
        let (stamp, len) = self.ages.pop_first()?;
        let blocks = self.by_size.get_mut(&len)?;
        // Stamps grow, so a size's oldest block is the oldest block
        // overall among those of its size.
        let (oldest, p) = blocks.pop_front()?;
        debug_assert_eq!(oldest, stamp);
        if blocks.is_empty() {
            self.by_size.remove(&len);
        }
        self.bytes -= len;
        Some(p)
    }
}

/// At most this many bytes of idle device blocks are kept.
pub const SPARE_MAX_BYTES: u64 = 256 << 20;

/// At most this many idle blocks are kept (of each kind: device, pinned).
/// Far more than a program keeps in flight per size; a bound on the
/// count, not only the bytes, because tiny blocks (a call's 16-byte
/// inputs) would take millions to reach the byte bound.
pub const SPARE_MAX_BLOCKS: usize = 1024;

/// At most this many bytes of idle pinned host blocks are kept (see
/// [`CudaAllocator`]'s host-visible allocations).
pub const PINNED_SPARE_MAX_BYTES: u64 = 16 << 20;

impl SpareBlocks {
    /// Keeps at most `max_bytes` of idle blocks (and at most
    /// [`SPARE_MAX_BLOCKS`] blocks).
    pub fn with_limit(max_bytes: u64) -> SpareBlocks {
        SpareBlocks {
            inner: Mutex::new(Spares::default()),
            max_bytes,
            max_blocks: SPARE_MAX_BLOCKS,
        }
    }

    /// Keeps the idle block `[dptr, dptr+len)`, making room by forgetting
    /// the oldest blocks. Returns the blocks the caller must free now:
    /// those forgotten, or `dptr` itself when it alone passes the bytes
    /// bound.
    #[must_use = "the returned blocks are no longer kept and must be freed"]
    pub(crate) fn put(&self, len: u64, dptr: CUdeviceptr) -> Vec<CUdeviceptr> {
        if len > self.max_bytes || self.max_blocks == 0 {
            return vec![dptr];
        }
        let mut s = self.inner.lock();
        let mut freed = Vec::new();
        while s.bytes + len > self.max_bytes || s.ages.len() >= self.max_blocks {
            match s.pop_oldest() {
                Some(p) => freed.push(p),
                None => break,
            }
        }
        let stamp = s.next_stamp;
        s.next_stamp += 1;
        s.bytes += len;
        s.ages.insert(stamp, len);
        s.by_size.entry(len).or_default().push_back((stamp, dptr));
        freed
    }

    /// Bytes of idle blocks kept.
    pub(crate) fn bytes(&self) -> u64 {
        self.inner.lock().bytes
    }

    /// How many idle blocks are kept.
    pub(crate) fn blocks(&self) -> usize {
        self.inner.lock().ages.len()
    }

    /// An idle block of exactly `len` bytes (the one kept last: the most
    /// recently used memory).
    pub(crate) fn take(&self, len: u64) -> Option<CUdeviceptr> {
        let mut s = self.inner.lock();
        let blocks = s.by_size.get_mut(&len)?;
        let (stamp, p) = blocks.pop_back()?;
        // A size whose last block is taken is forgotten: programs whose
        // transient sizes vary per call (a batch's rows times its attended
        // length) would otherwise keep an entry and its list for every size
        // they ever freed, growing the host heap with the calls.
        if blocks.is_empty() {
            s.by_size.remove(&len);
        }
        s.ages.remove(&stamp);
        s.bytes -= len;
        Some(p)
    }

    /// How many distinct sizes have idle blocks.
    #[cfg(test)]
    fn sizes(&self) -> usize {
        self.inner.lock().by_size.len()
    }

    /// Every kept block (for freeing them).
    pub(crate) fn drain(&self) -> Vec<CUdeviceptr> {
        let mut s = self.inner.lock();
        s.bytes = 0;
        s.ages.clear();
        s.by_size
            .drain()
            .flat_map(|(_, v)| v.into_iter().map(|(_, p)| p))
            .collect()
    }
}

/// Pinned, mapped 64-bit words for semaphore payloads, carved from
/// 4 KiB pages (pinning per semaphore would cost a driver call per
/// fence). A page is ordinary heap memory registered with the driver
/// (`cuMemHostRegister`, mapped): `cuMemHostAlloc` of one page made the
/// process 2 MiB larger (the driver's pinned chunk) on an H100.
pub struct WordPool {
    /// The pages, and the free (page, word) slots.
    #[allow(clippy::type_complexity)]
    pages: Mutex<(Vec<Page>, Vec<(usize, usize)>)>,
}

struct Page {
    host: NonNull<AtomicU64>,
    dptr: CUdeviceptr,
}

// SAFETY: the pages are pinned host memory accessed only through atomics.
unsafe impl Send for WordPool {}
// SAFETY: see above.
unsafe impl Sync for WordPool {}

const WORDS_PER_PAGE: usize = 512;

impl WordPool {
    /// An empty pool.
    pub fn new() -> WordPool {
        WordPool {
            pages: Mutex::new((Vec::new(), Vec::new())),
        }
    }

    /// A word of the pool: (page, slot, host address, device address).
    /// Its value is whatever its last user left.
    pub(crate) fn take(
        &self,
        shared: &CudaContext,
    ) -> Result<(usize, usize, NonNull<AtomicU64>, CUdeviceptr)> {
        let mut g = self.pages.lock();
        if g.1.is_empty() {
            let api = shared.api;
            // SAFETY: the layout has a non-zero size.
            let host = unsafe { std::alloc::alloc_zeroed(page_layout()) } as *mut c_void;
            let Some(h) = NonNull::new(host as *mut AtomicU64) else {
                bail!(
                    ResourceExhausted,
                    "allocating a page for semaphore payloads"
                );
            };
            let registered = ffi::check(
                // SAFETY: `host` is a live, page-aligned allocation of one
                // page, unregistered before it is freed (`release`).
                unsafe {
                    (api.cuMemHostRegister_v2)(
                        host,
                        WORDS_PER_PAGE * 8,
                        ffi::CU_MEMHOSTREGISTER_PORTABLE_DEVICEMAP,
                    )
                },
                "pinning semaphore payloads",
            );
            if let Err(e) = registered {
                // SAFETY: allocated above with this layout, not registered.
                unsafe { std::alloc::dealloc(host as *mut u8, page_layout()) };
                return Err(e);
            }
            let mut dptr = 0;
            // SAFETY: registered just above with DEVICEMAP.
            let mapped = unsafe { (api.cuMemHostGetDevicePointer_v2)(&mut dptr, host, 0) };
            if let Err(e) = ffi::check(mapped, "mapping semaphore payloads") {
                // SAFETY: registered and allocated above, used by nothing.
                unsafe {
                    (api.cuMemHostUnregister)(host);
                    std::alloc::dealloc(host as *mut u8, page_layout());
                }
                return Err(e);
            }
            let page = g.0.len();
            g.0.push(Page { host: h, dptr });
            for w in (0..WORDS_PER_PAGE).rev() {
                g.1.push((page, w));
            }
        }
        let Some((page, word)) = g.1.pop() else {
            bail!(Internal, "semaphore payload pool is empty after growing");
        };
        let p = &g.0[page];
        // SAFETY: `word` < WORDS_PER_PAGE, within the page.
        let host = unsafe { NonNull::new_unchecked(p.host.as_ptr().add(word)) };
        Ok((page, word, host, p.dptr + 8 * word as u64))
    }

    /// Returns a word taken with [`Self::take`]; nothing may use it after.
    pub(crate) fn give_back(&self, page: usize, word: usize) {
        self.pages.lock().1.push((page, word));
    }

    /// Unregisters and frees every page. The device's context must be
    /// current, and no timeline may use the pool any more (each holds the
    /// device state that owns it, which is being dropped).
    pub(crate) fn release(&self, api: &ffi::Api) {
        let mut g = self.pages.lock();
        g.1.clear();
        for p in g.0.drain(..) {
            // SAFETY: a page registered and allocated by `take` with
            // `page_layout()`; no word of it is in use (see above).
            unsafe {
                (api.cuMemHostUnregister)(p.host.as_ptr() as *mut c_void);
                std::alloc::dealloc(p.host.as_ptr() as *mut u8, page_layout());
            }
        }
    }
}

/// One page of payload words, page-aligned (registration pins whole pages).
fn page_layout() -> std::alloc::Layout {
    match std::alloc::Layout::from_size_align(WORDS_PER_PAGE * 8, WORDS_PER_PAGE * 8) {
        Ok(l) => l,
        Err(_) => unreachable!("4096 is a power of two"),
    }
}

impl Default for WordPool {
    fn default() -> Self {
        WordPool::new()
    }
}

/// A semaphore's payload as the GPU sees it (see
/// [`ferrite_hal::semaphore`]'s device timelines): a pinned word the host
/// keeps at the semaphore's value (an indirect dispatch's continuation
/// gate is such a word the queue stream waits on, `cuStreamWaitValue64`
/// GEQ), plus the highest value this device's queue stream will reach by
/// its own order, which lets waits that stream order already satisfies be
/// enqueued at once (other waits keep the operation on the host:
/// [`crate::device::deferral`]).
pub struct CudaTimeline {
    pub(crate) shared: Arc<CudaContext>,
    host: NonNull<AtomicU64>,
    /// The word's device address.
    pub(crate) dptr: CUdeviceptr,
    /// Highest value enqueued for signalling on the owner's queue stream
    /// by operations whose signal the stream's position alone gives: once
    /// the stream passes such an operation, its values are reached for
    /// later work on the same stream (waits on them are skipped).
    pub(crate) stream_signaled: AtomicU64,
    /// Highest value enqueued for signalling by operations whose signal
    /// is reached only when they are reported: host work
    /// (`Device::submit`), which the stream reaching it only starts, and
    /// work an indirect dispatch's continuation finishes. Later work
    /// waiting on it is kept on the host until then.
    pub(crate) host_signaled: AtomicU64,
    slot: (usize, usize),
}

// SAFETY: `host` points at a pinned word owned by the pool for this
// timeline's lifetime, accessed only atomically.
unsafe impl Send for CudaTimeline {}
// SAFETY: see above.
unsafe impl Sync for CudaTimeline {}

/// The value written on failure: releases every device waiter (a
/// continuation gate's stream wait). The GPU's
/// GEQ compares `(int64_t)(*addr - value) >= 0`, so the value must be at
/// most 2^63 ahead of every awaited value: 2^62 is above any payload a
/// program reaches and releases them all (u64::MAX would not).
pub const FAILURE_VALUE: u64 = 1 << 62;

impl CudaTimeline {
    /// A new word from `shared`'s pool, at 0.
    pub fn new(shared: &Arc<CudaContext>) -> Result<CudaTimeline> {
        let (page, word, host, dptr) = shared.words.take(shared)?;
        // SAFETY: the word is valid and owned by this timeline.
        unsafe { host.as_ref() }.store(0, Ordering::Release);
        Ok(CudaTimeline {
            shared: shared.clone(),
            host,
            dptr,
            stream_signaled: AtomicU64::new(0),
            host_signaled: AtomicU64::new(0),
            slot: (page, word),
        })
    }

    fn word(&self) -> &AtomicU64 {
        // SAFETY: valid while the pool lives, which `shared` keeps alive.
        unsafe { self.host.as_ref() }
    }
}

impl Drop for CudaTimeline {
    fn drop(&mut self) {
        self.shared.words.give_back(self.slot.0, self.slot.1);
    }
}

impl DeviceTimeline for CudaTimeline {
    fn advanced(&self, value: u64) {
        self.word().fetch_max(value, Ordering::AcqRel);
    }
    fn failed(&self) {
        self.word().store(FAILURE_VALUE, Ordering::Release);
    }
    fn poll(&self) {
        self.shared.completions.poll(&self.shared);
    }
    fn watch(&self) {
        self.shared.completions.watch();
    }
    fn as_any(&self) -> &dyn Any {
        self
    }
}

#[cfg(test)]
mod spare_block_tests {
    use super::SpareBlocks;

    #[test]
    fn sizes_are_forgotten_once_their_blocks_are_taken() {
        let spare = SpareBlocks::with_limit(1 << 30);
        // Many calls, each freeing and re-taking a block of its own size.
        for len in 1..=10_000u64 {
            assert!(spare.put(len * 256, 0x1000 + len).is_empty());
            assert_eq!(spare.take(len * 256), Some(0x1000 + len));
        }
        assert_eq!(spare.sizes(), 0);
        assert_eq!(spare.bytes(), 0);
        // Blocks still idle keep their size; taking one of two keeps it.
        assert!(spare.put(512, 1).is_empty());
        assert!(spare.put(512, 2).is_empty());
        assert_eq!(spare.take(512), Some(2));
        assert_eq!(spare.sizes(), 1);
        assert_eq!(spare.take(512), Some(1));
        assert_eq!(spare.take(512), None);
        assert_eq!(spare.sizes(), 0);
    }

    /// Blocks of sizes nobody asks for again (a call's small inputs, which
    /// `Allocator::allocate` made and queue allocations never take; odd
    /// transient sizes) are not kept without bound: beyond
    /// `SPARE_MAX_BLOCKS` the oldest go (issue 29: 4 tiny input buffers
    /// per serving step stayed idle forever, far below the byte bound).
    #[test]
    fn blocks_nobody_takes_are_bounded_in_count() {
        let spare = SpareBlocks::with_limit(super::SPARE_MAX_BYTES);
        let mut freed = Vec::new();
        for i in 0..100_000u64 {
            freed.extend(spare.put(4 * (1 + i % 16), 0x1000 + i));
        }
        assert!(
            spare.blocks() <= super::SPARE_MAX_BLOCKS,
            "{} blocks kept",
            spare.blocks()
        );
        // Every block is either still kept or handed back to be freed,
        // once, oldest first.
        assert_eq!(freed.len() + spare.blocks(), 100_000);
        assert!(freed.windows(2).all(|w| w[0] < w[1]), "oldest first, once");
        let mut kept = spare.drain();
        kept.sort_unstable();
        assert_eq!(kept.first(), Some(&(0x1000 + freed.len() as u64)));
        assert_eq!(kept.last(), Some(&(0x1000 + 99_999)));
        assert_eq!((spare.blocks(), spare.bytes()), (0, 0));
    }

    /// When the byte bound is reached, a block of a size in use replaces
    /// the oldest idle blocks instead of being refused: stale sizes (a
    /// transient shape that never came back) would otherwise hold the
    /// spare and every later size went back to the driver.
    #[test]
    fn a_full_spare_makes_room_by_forgetting_its_oldest_blocks() {
        let spare = SpareBlocks::with_limit(1 << 20);
        for i in 0..16u64 {
            assert!(spare.put(64 << 10, 0x10_0000 * (i + 1)).is_empty());
        }
        assert_eq!(spare.bytes(), 1 << 20);
        // The oldest block makes room for the new one.
        assert_eq!(spare.put(4096, 0x42), vec![0x10_0000]);
        assert_eq!(spare.bytes(), (15 << 16) + 4096);
        assert_eq!(spare.take(4096), Some(0x42), "the new block is kept");
        // The most recently kept block of a size is taken first.
        assert_eq!(spare.take(64 << 10), Some(0x10_0000 * 16));
        // A block larger than the whole bound is not kept (nothing else
        // is forgotten for it).
        assert_eq!(spare.put(2 << 20, 0x77), vec![0x77]);
        assert_eq!(spare.blocks(), 14);
    }
}
