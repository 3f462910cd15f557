//! Collective channels over NCCL: one communicator per channel, created by
//! `ncclCommInitRank` with the device's context current, and collectives
//! enqueued on the device's queue stream (so they are ordered with the
//! kernels, copies and semaphore waits/writes around them, as any queue
//! work).
//!
//! # Identifiers and rendezvous
//! A channel whose parameters leave the identifier empty gets it from the
//! [`ChannelProvider`]: rank 0 asks NCCL for a unique id
//! (`ncclGetUniqueId`) and the provider hands its bytes to every other rank
//! (in memory for [`ferrite_hal::channel::LocalGroup`], through a store for
//! one process per rank). The exchange key is the device's count of
//! channels created so far, so the n-th channel of every rank meets the
//! n-th of the others.
//!
//! # Grouping
//! Consecutive collective commands of a command buffer are issued inside
//! one `ncclGroupStart`/`ncclGroupEnd`, as upstream batches them: sends and
//! receives to each other's ranks then proceed together instead of waiting
//! on each other. `all_to_all` and `send_recv` are send/receive pairs.
//!
//! # Element types
//! NCCL has no 16-bit integers: reductions of i16/u16 are UNIMPLEMENTED;
//! operations that only move data (gathers, broadcasts, all-to-all,
//! send/recv) move any element type as bytes.

use crate::context::CudaContext;
use crate::ffi::{self, CUdeviceptr};
use crate::nccl::{self, dtype, ncclComm_t, ncclDataType_t, ncclRedOp_t, redop, Nccl};
use ferrite_base::{bail, Result};
use ferrite_hal::channel::{
    Channel, ChannelFlags, ChannelParams, ChannelProvider, ChannelRef, CollectiveElementType,
    CollectiveKind, CollectiveOp, Reduction, NO_COLOR,
};
use std::any::Any;
use std::ffi::{c_int, c_void};
use std::sync::Arc;

/// A participant of an NCCL communicator on one CUDA device.
pub struct NcclChannel {
    nccl: &'static Nccl,
    shared: Arc<CudaContext>,
    comm: ncclComm_t,
    rank: u32,
    count: u32,
}

// SAFETY: an NCCL communicator may be used from any thread as long as
// calls on it are not concurrent; every call on `comm` after creation is
// made under the owning device's `nccl_calls` lock (collectives, splits),
// or by the last owner (drop).
unsafe impl Send for NcclChannel {}
// SAFETY: see above.
unsafe impl Sync for NcclChannel {}

impl NcclChannel {
    /// The communicator handle.
    pub fn comm(&self) -> ncclComm_t {
        self.comm
    }

    /// Whether the channel was created on the device owning `shared`.
    pub(crate) fn belongs_to(&self, shared: &Arc<CudaContext>) -> bool {
        Arc::ptr_eq(&self.shared, shared)
    }
}

impl Drop for NcclChannel {
    fn drop(&mut self) {
        // Collectives hold their channel until the stream passed them (the
        // device's completion keeps it), so nothing is in flight here.
        if self.shared.make_current().is_err() {
            return;
        }
        // SAFETY: `comm` is a live communicator owned by this channel and
        // freed once: aborted when NCCL reported an asynchronous error (a
        // peer that failed would hold a finalize forever), else finalized
        // (when the library has it) and destroyed.
        unsafe {
            let mut async_error = nccl::NCCL_SUCCESS;
            let r = (self.nccl.ncclCommGetAsyncError)(self.comm, &mut async_error);
            if r != nccl::NCCL_SUCCESS
                || (async_error != nccl::NCCL_SUCCESS && async_error != nccl::NCCL_IN_PROGRESS)
            {
                (self.nccl.ncclCommAbort)(self.comm);
                return;
            }
            if let Some(finalize) = self.nccl.ncclCommFinalize {
                finalize(self.comm);
            }
            (self.nccl.ncclCommDestroy)(self.comm);
        }
    }
}

impl Channel for NcclChannel {
    fn rank(&self) -> u32 {
        self.rank
    }
    fn count(&self) -> u32 {
        self.count
    }
    fn split(&self, color: i32, key: i32, _flags: ChannelFlags) -> Result<Option<ChannelRef>> {
        let Some(split) = self.nccl.ncclCommSplit else {
            bail!(
                Unimplemented,
                "splitting a channel needs ncclCommSplit (NCCL 2.18+), but {} is NCCL {}",
                self.nccl.path,
                nccl::version_string(self.nccl.version)
            );
        };
        if color < 0 && color != NO_COLOR {
            bail!(
                InvalidArgument,
                "channel split color must be non-negative or {NO_COLOR} (no group), got {color}"
            );
        }
        self.shared.make_current()?;
        // Not concurrently with collectives another thread enqueues on
        // this communicator (NCCL calls on one communicator must not
        // overlap).
        let _calls = self.shared.nccl_calls.lock();
        let mut comm: ncclComm_t = std::ptr::null_mut();
        let c = if color == NO_COLOR {
            nccl::NCCL_SPLIT_NOCOLOR
        } else {
            color
        };
        self.nccl.check(
            // SAFETY: `self.comm` is live; a null config inherits the
            // parent's; `comm` is a valid out-pointer.
            unsafe { split(self.comm, c, key, &mut comm, std::ptr::null_mut()) },
            self.comm,
            "ncclCommSplit",
        )?;
        if comm.is_null() {
            return Ok(None);
        }
        let (mut rank, mut count) = (0, 0);
        // SAFETY: `comm` was just created; valid out-pointers.
        let r = unsafe {
            let r = (self.nccl.ncclCommUserRank)(comm, &mut rank);
            if r != nccl::NCCL_SUCCESS {
                r
            } else {
                (self.nccl.ncclCommCount)(comm, &mut count)
            }
        };
        if r != nccl::NCCL_SUCCESS {
            let e = self
                .nccl
                .to_status(r, comm, "querying a split communicator");
            // SAFETY: `comm` is ours and unused.
            unsafe { (self.nccl.ncclCommDestroy)(comm) };
            return Err(e);
        }
        Ok(Some(ChannelRef(Arc::new(NcclChannel {
            nccl: self.nccl,
            shared: self.shared.clone(),
            comm,
            rank: rank as u32,
            count: count as u32,
        }))))
    }
    fn as_any(&self) -> &dyn Any {
        self
    }
}

/// Creates the channel of `shared`'s device (see the module docs); `key`
/// names the identifier exchange.
pub(crate) fn create(
    shared: &Arc<CudaContext>,
    params: ChannelParams,
    provider: Option<&Arc<dyn ChannelProvider>>,
    key: &str,
) -> Result<ChannelRef> {
    let nccl = nccl::nccl()?;
    let (rank, count) = match (params.rank, params.count) {
        (Some(r), Some(c)) => (r, c),
        (r, c) => {
            let Some(p) = provider else {
                bail!(
                    InvalidArgument,
                    "channel {} left to the environment, but no channel provider is set (run under a launcher, e.g. torchrun or mpirun with FERRITE_STORE, or use ferrite::spmd)",
                    if r.is_none() { "rank" } else { "count" }
                );
            };
            let (dr, dc) = p
                .default_rank_and_count()
                .map_err(|e| e.annotate("querying the default channel rank and count"))?;
            (r.unwrap_or(dr), c.unwrap_or(dc))
        }
    };
    if count == 0 || rank >= count {
        bail!(
            InvalidArgument,
            "channel rank {rank} is outside a group of {count}"
        );
    }
    let mut id = nccl::ncclUniqueId {
        internal: [0; nccl::UNIQUE_ID_BYTES],
    };
    if params.id.is_empty() {
        let Some(p) = provider else {
            bail!(
                InvalidArgument,
                "channel identifier left to the environment, but no channel provider is set"
            );
        };
        if rank == 0 {
            shared.make_current()?;
            nccl.check(
                // SAFETY: a valid out-pointer to a 128-byte id.
                unsafe { (nccl.ncclGetUniqueId)(&mut id) },
                std::ptr::null_mut(),
                "ncclGetUniqueId",
            )?;
        }
        p.exchange_default_id(key, &mut id.internal)
            .map_err(|e| e.annotate("exchanging the NCCL unique id"))?;
    } else if params.id.len() != nccl::UNIQUE_ID_BYTES {
        bail!(
            InvalidArgument,
            "an NCCL channel id has {} bytes (ncclUniqueId), got {}",
            nccl::UNIQUE_ID_BYTES,
            params.id.len()
        );
    } else {
        id.internal.copy_from_slice(&params.id);
    }
    if id.internal.iter().all(|&b| b == 0) {
        bail!(
            InvalidArgument,
            "the NCCL channel id is all zeros (rank 0 published none)"
        );
    }
    shared.make_current()?;
    let mut comm: ncclComm_t = std::ptr::null_mut();
    nccl.check(
        // SAFETY: valid out-pointer; the id is passed by value; the
        // device's context is current, so NCCL binds the communicator to
        // this device.
        unsafe { (nccl.ncclCommInitRank)(&mut comm, count as c_int, id, rank as c_int) },
        std::ptr::null_mut(),
        &format!("ncclCommInitRank (rank {rank} of {count})"),
    )?;
    Ok(ChannelRef(Arc::new(NcclChannel {
        nccl,
        shared: shared.clone(),
        comm,
        rank,
        count,
    })))
}

/// One collective resolved to device addresses.
pub(crate) struct Resolved<'a> {
    pub channel: &'a NcclChannel,
    pub op: CollectiveOp,
    pub param: u32,
    pub send: CUdeviceptr,
    pub recv: CUdeviceptr,
    pub element_count: u64,
}

/// The NCCL type for `t`, or `None` where NCCL has none (16-bit integers).
fn data_type(t: CollectiveElementType) -> Option<ncclDataType_t> {
    use CollectiveElementType as E;
    Some(match t {
        E::Sint8 => dtype::INT8,
        E::Uint8 => dtype::UINT8,
        E::Sint16 | E::Uint16 => return None,
        E::Sint32 => dtype::INT32,
        E::Uint32 => dtype::UINT32,
        E::Sint64 => dtype::INT64,
        E::Uint64 => dtype::UINT64,
        E::Float16 => dtype::FLOAT16,
        E::Float32 => dtype::FLOAT32,
        E::Float64 => dtype::FLOAT64,
        E::BFloat16 => dtype::BFLOAT16,
    })
}

fn reduction(r: Reduction) -> Result<ncclRedOp_t> {
    Ok(match r {
        Reduction::Sum => redop::SUM,
        Reduction::Product => redop::PROD,
        Reduction::Minimum => redop::MIN,
        Reduction::Maximum => redop::MAX,
        Reduction::Average => redop::AVG,
        Reduction::None => bail!(InvalidArgument, "a reducing collective needs a reduction"),
    })
}

/// Enqueues `batch` on `shared`'s queue stream in one NCCL group. The
/// caller holds the device's submission lock and keeps every buffer and
/// channel alive until the stream passed the batch.
pub(crate) fn enqueue_batch(shared: &CudaContext, batch: &[Resolved<'_>]) -> Result<()> {
    let Some(first) = batch.first() else {
        return Ok(());
    };
    let nccl = first.channel.nccl;
    let stream = shared.stream as nccl::cudaStream_t;
    let _calls = shared.nccl_calls.lock();
    // SAFETY: ncclGroupStart has no preconditions.
    let started = unsafe { (nccl.ncclGroupStart)() };
    nccl.check(started, std::ptr::null_mut(), "ncclGroupStart")?;
    let mut outcome = Ok(());
    for c in batch {
        outcome = enqueue_one(nccl, shared, c, stream);
        if outcome.is_err() {
            break;
        }
    }
    // The group is always closed, so NCCL's per-thread group state is
    // clean for the next submission even when an entry failed.
    // SAFETY: matches the ncclGroupStart above.
    let end = unsafe { (nccl.ncclGroupEnd)() };
    outcome?;
    nccl.check(end, first.channel.comm, "ncclGroupEnd")
}

fn enqueue_one(
    nccl: &Nccl,
    shared: &CudaContext,
    c: &Resolved<'_>,
    stream: nccl::cudaStream_t,
) -> Result<()> {
    let ch = c.channel;
    let comm = ch.comm;
    let kind = c.op.kind;
    let name = kind.name();
    let elem = c.op.element_type;
    let Ok(n) = usize::try_from(c.element_count) else {
        bail!(
            InvalidArgument,
            "collective {name}: element count {} is too large",
            c.element_count
        );
    };
    // Data movement without arithmetic: any type moves as bytes.
    let (dt, count) = match data_type(elem) {
        Some(dt) => (dt, n),
        None if kind.is_reduction() => bail!(
            Unimplemented,
            "collective {name} of {elem:?} on cuda: NCCL has no 16-bit integer reductions"
        ),
        None => (dtype::UINT8, n * elem.byte_size() as usize),
    };
    let unit = if data_type(elem).is_some() {
        elem.byte_size()
    } else {
        1
    };
    let send = c.send as *const c_void;
    let recv = c.recv as *mut c_void;
    let peer = |p: u32| -> Result<c_int> {
        if p >= ch.count {
            bail!(
                OutOfRange,
                "collective {name}: rank {p} is outside the group of {}",
                ch.count
            );
        }
        Ok(p as c_int)
    };
    // SAFETY: for every call below, `send`/`recv` are device addresses of
    // ranges the caller checked against their buffers for the byte counts
    // these calls touch (element count times element size, per rank where
    // the kind says so); `comm` is live; `stream` is the device's queue
    // stream, in the device's context, which is current.
    let r = unsafe {
        match kind {
            CollectiveKind::AllReduce => (nccl.ncclAllReduce)(
                send,
                recv,
                count,
                dt,
                reduction(c.op.reduction)?,
                comm,
                stream,
            ),
            CollectiveKind::AllGather => (nccl.ncclAllGather)(send, recv, count, dt, comm, stream),
            CollectiveKind::ReduceScatter => (nccl.ncclReduceScatter)(
                send,
                recv,
                count,
                dt,
                reduction(c.op.reduction)?,
                comm,
                stream,
            ),
            CollectiveKind::Broadcast => {
                (nccl.ncclBroadcast)(send, recv, count, dt, peer(c.param)?, comm, stream)
            }
            CollectiveKind::Reduce => (nccl.ncclReduce)(
                send,
                recv,
                count,
                dt,
                reduction(c.op.reduction)?,
                peer(c.param)?,
                comm,
                stream,
            ),
            CollectiveKind::Send => (nccl.ncclSend)(send, count, dt, peer(c.param)?, comm, stream),
            CollectiveKind::Recv => (nccl.ncclRecv)(recv, count, dt, peer(c.param)?, comm, stream),
            CollectiveKind::AllToAll => {
                let ranks = ch.count as usize;
                if n % ranks != 0 {
                    bail!(
                        InvalidArgument,
                        "collective all_to_all: {n} elements do not split into {ranks} equal parts"
                    );
                }
                let part = count / ranks;
                let stride = (part as u64 * unit) as CUdeviceptr;
                let mut r = nccl::NCCL_SUCCESS;
                for p in 0..ranks {
                    let off = p as CUdeviceptr * stride;
                    r = (nccl.ncclSend)(
                        (c.send + off) as *const c_void,
                        part,
                        dt,
                        p as c_int,
                        comm,
                        stream,
                    );
                    if r != nccl::NCCL_SUCCESS {
                        break;
                    }
                    r = (nccl.ncclRecv)(
                        (c.recv + off) as *mut c_void,
                        part,
                        dt,
                        p as c_int,
                        comm,
                        stream,
                    );
                    if r != nccl::NCCL_SUCCESS {
                        break;
                    }
                }
                r
            }
            CollectiveKind::SendRecv => {
                let (to, from) = (c.param & 0xffff, c.param >> 16);
                let mut r = nccl::NCCL_SUCCESS;
                if to != 0xffff {
                    r = (nccl.ncclSend)(send, count, dt, peer(to)?, comm, stream);
                }
                if r == nccl::NCCL_SUCCESS {
                    if from != 0xffff {
                        r = (nccl.ncclRecv)(recv, count, dt, peer(from)?, comm, stream);
                    } else {
                        // No source: the receive buffer reads as zeros.
                        ffi::check(
                            (shared.api.cuMemsetD8Async)(
                                c.recv,
                                0,
                                n * elem.byte_size() as usize,
                                shared.stream,
                            ),
                            "zeroing a send_recv buffer with no source",
                        )?;
                    }
                }
                r
            }
        }
    };
    nccl.check(r, comm, &format!("collective {name} (nccl)"))
}
