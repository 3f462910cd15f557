//! Collective channels of the CPU devices: ranks in one process, each with
//! its own device, meeting at the rendezvous of an in-process
//! [`LocalGroup`].
//!
//! A channel is one rank's view of a group: the group's root ranks that
//! belong to it (all of them for a channel made by `hal.channel.create`, a
//! subset for one made by [`Channel::split`]), this rank's position among
//! them, and a name that every member derives the same way, so that the
//! n-th operation of the channel meets at the same rendezvous key on every
//! rank. Each rank contributes what it sends (a copy of its send range)
//! together with what it was asked to do; every rank checks the whole set
//! the same way, so a disagreement (another element count, another root, a
//! local failure) fails the operation on every rank with one message.
//!
//! CPU collectives connect devices of one process only: there is no
//! transport between processes or hosts (GPU channels use their vendor's
//! library for that).
//!
//! Ordering: a channel's collectives must run in the same order on every
//! rank. Programs record them on one timeline per device, and `local-task`
//! runs each collective of a command buffer as a stage of its own, so
//! the order is the program's.

use ferrite_base::{bail, Result, Status};
use ferrite_hal::buffer::Buffer;
use ferrite_hal::channel::{
    Channel, ChannelFlags, ChannelParams, ChannelProvider, ChannelRef, CollectiveElementType,
    CollectiveKind, CollectiveOp, LocalGroup, LocalRank, Reduction, NO_COLOR,
};
use ferrite_hal::memory::MemoryAccess;
use ferrite_hal::numerics;
use parking_lot::Mutex;
use std::any::Any;
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

/// From this many elements on, an all-reduce shares the reduction between
/// the ranks (a second rendezvous costs less than reducing everything on
/// every rank).
const SHARED_REDUCTION_ELEMENTS: u64 = 1 << 15;

/// `send_recv`'s "no peer" (upstream packs 16-bit ranks, -1 = none).
const NO_PEER: u32 = 0xffff;

/// One rank's participant of a CPU collective group (see the module docs).
pub struct CpuChannel {
    group: Arc<LocalGroup>,
    /// Root ranks of the members, in channel rank order.
    members: Arc<[u32]>,
    /// This participant's channel rank (index into `members`).
    rank: u32,
    /// The channel's name in rendezvous keys, the same on every member.
    name: String,
    /// Collectives executed so far (numbers their rendezvous).
    ops: AtomicU64,
    /// Splits performed so far (they run on the program's thread, unlike
    /// collectives, so they are counted apart).
    splits: AtomicU64,
    /// Point-to-point transfers so far per (sender, receiver) channel ranks.
    p2p: Mutex<HashMap<(u32, u32), u64>>,
}

/// Creates `device_id`'s channel for `params`, with defaults from
/// `provider`, which must be a rank of an in-process group. A rank and
/// count the program names must be the group's; the identifier and group
/// key are not needed (ranks find each other through the group, and the
/// n-th channel a rank creates meets the n-th of every other rank).
pub fn create_channel(
    device_id: &str,
    params: &ChannelParams,
    provider: Option<&Arc<dyn ChannelProvider>>,
) -> Result<ChannelRef> {
    let Some(provider) = provider else {
        bail!(
            FailedPrecondition,
            "{device_id}: a collective channel needs the ranks of an in-process group \
             (run the program on several ranks: ferrite::spmd, or run-module --spmd_ranks=N); \
             no channel provider was given"
        );
    };
    let Some(local) = provider.as_any().downcast_ref::<LocalRank>() else {
        bail!(
            Unimplemented,
            "{device_id}: CPU collectives connect devices of one process only, and this \
             channel provider is not a rank of an in-process group (ferrite_hal::channel::LocalRank); \
             ranks in other processes need a GPU driver's collectives"
        );
    };
    let group = local.group().clone();
    let (rank, count) = (local.rank(), group.count());
    if let Some(c) = params.count.filter(|&c| c != count) {
        bail!(
            InvalidArgument,
            "{device_id}: channel count {c} differs from the in-process group's {count} ranks"
        );
    }
    if let Some(r) = params.rank.filter(|&r| r != rank) {
        bail!(
            InvalidArgument,
            "{device_id}: channel rank {r} differs from this thread's rank {rank} of the in-process group"
        );
    }
    let n = group.next_round(rank, "channels");
    Ok(ChannelRef(Arc::new(CpuChannel {
        group,
        members: (0..count).collect(),
        rank,
        name: format!("cpu{n}"),
        ops: AtomicU64::new(0),
        splits: AtomicU64::new(0),
        p2p: Mutex::new(HashMap::new()),
    })))
}

impl Channel for CpuChannel {
    fn rank(&self) -> u32 {
        self.rank
    }

    fn count(&self) -> u32 {
        self.members.len() as u32
    }

    fn split(&self, color: i32, key: i32, _flags: ChannelFlags) -> Result<Option<ChannelRef>> {
        let n = self.splits.fetch_add(1, Ordering::Relaxed);
        let round = format!("{}/split{n}", self.name);
        let all = self.group.exchange_among(
            &round,
            &self.members,
            self.root(),
            Arc::new((color, key)),
        )?;
        if color == NO_COLOR {
            return Ok(None);
        }
        // Members of this color, ordered by key, then by rank.
        let mut mine: Vec<(i32, u32)> = all
            .iter()
            .enumerate()
            .filter_map(|(r, v)| {
                let &(c, k) = v.downcast_ref::<(i32, i32)>()?;
                (c == color).then_some((k, r as u32))
            })
            .collect();
        mine.sort_unstable();
        let members: Arc<[u32]> = mine
            .iter()
            .map(|&(_, r)| self.members[r as usize])
            .collect();
        let rank =
            mine.iter()
                .position(|&(_, r)| r == self.rank)
                .expect("a rank passing a color is among that color's members") as u32;
        Ok(Some(ChannelRef(Arc::new(CpuChannel {
            group: self.group.clone(),
            members,
            rank,
            name: format!("{round}/color{color}"),
            ops: AtomicU64::new(0),
            splits: AtomicU64::new(0),
            p2p: Mutex::new(HashMap::new()),
        }))))
    }

    fn as_any(&self) -> &dyn Any {
        self
    }
}

/// One operand of a collective: a buffer and a resolved byte range.
pub type Operand<'a> = (&'a Buffer, u64, u64);

/// What a rank brings to a collective's rendezvous.
struct Contribution {
    op: CollectiveOp,
    param: u32,
    element_count: u64,
    /// The bytes this rank sends (empty when it sends nothing).
    data: Vec<u8>,
    /// A failure this rank met before the rendezvous (e.g. a range too
    /// small): it still joins, so that its peers fail with it at once.
    error: Option<String>,
}

impl CpuChannel {
    /// This participant's rank in the whole in-process group.
    fn root(&self) -> u32 {
        self.members[self.rank as usize]
    }

    /// Runs one collective operation for this rank: `send` and `recv` are
    /// the command's ranges (present as the kind needs them, which
    /// recording checked).
    pub fn execute(
        &self,
        op: CollectiveOp,
        param: u32,
        send: Option<Operand<'_>>,
        recv: Option<Operand<'_>>,
        element_count: u64,
    ) -> Result<()> {
        let name = op.kind.name();
        let annotate = |e: Status| {
            e.annotate(format!(
                "{name} on rank {} of {}",
                self.rank,
                self.members.len()
            ))
        };
        match op.kind {
            CollectiveKind::Send => self.send(op, param, send, element_count).map_err(annotate),
            CollectiveKind::Recv => self.recv(op, param, recv, element_count).map_err(annotate),
            _ => self
                .collective(op, param, send, recv, element_count)
                .map_err(annotate),
        }
    }

    fn collective(
        &self,
        op: CollectiveOp,
        param: u32,
        send: Option<Operand<'_>>,
        recv: Option<Operand<'_>>,
        element_count: u64,
    ) -> Result<()> {
        let n = self.members.len() as u64;
        let size = op.element_type.byte_size();
        let (send_elems, recv_elems) = self.local_counts(op, param, recv, element_count);
        // Take this rank's data; a local failure is contributed, not
        // returned, so that peers do not wait for a rank that left.
        let mut error = None;
        let mut data = Vec::new();
        if send_elems > 0 {
            match byte_count(send_elems, size).and_then(|b| read_operand(send, b, "send")) {
                Ok(d) => data = d,
                Err(e) => error = Some(e.message().to_string()),
            }
        }
        if error.is_none() && recv_elems > 0 {
            if let Err(e) = byte_count(recv_elems, size).and_then(|b| check_len(recv, b, "recv")) {
                error = Some(e.message().to_string());
            }
        }
        let key = format!(
            "{}/op{}",
            self.name,
            self.ops.fetch_add(1, Ordering::Relaxed)
        );
        let mine = Arc::new(Contribution {
            op,
            param,
            element_count,
            data,
            error,
        });
        let all = self
            .group
            .exchange_among(&key, &self.members, self.root(), mine)?;
        let all: Vec<&Contribution> = all
            .iter()
            .map(|v| {
                v.downcast_ref::<Contribution>()
                    .expect("collective rounds carry contributions")
            })
            .collect();
        check_agreement(&all, n as u32)?;
        let me = self.rank as usize;
        let result: Vec<u8> = match op.kind {
            CollectiveKind::AllGather => all.iter().flat_map(|c| c.data.iter().copied()).collect(),
            CollectiveKind::AllReduce if element_count >= SHARED_REDUCTION_ELEMENTS => {
                self.reduce_in_parts(&key, op, &all, element_count)?
            }
            CollectiveKind::AllReduce => reduce(op, &all, 0, element_count, n),
            CollectiveKind::AllToAll => {
                let part = (element_count / n * size) as usize;
                all.iter()
                    .flat_map(|c| c.data[me * part..(me + 1) * part].iter().copied())
                    .collect()
            }
            CollectiveKind::Broadcast => all[param as usize].data.clone(),
            CollectiveKind::Reduce => {
                if me != param as usize {
                    return Ok(());
                }
                reduce(op, &all, 0, element_count, n)
            }
            CollectiveKind::ReduceScatter => {
                reduce(op, &all, me as u64 * element_count, element_count, n)
            }
            CollectiveKind::SendRecv => {
                let source = param >> 16;
                if source == NO_PEER {
                    vec![0; (element_count * size) as usize]
                } else {
                    all[source as usize].data.clone()
                }
            }
            CollectiveKind::Send | CollectiveKind::Recv => {
                unreachable!("point-to-point kinds do not meet the whole group")
            }
        };
        write_operand(recv, &result)
    }

    /// An all-reduce with the work shared: rank i reduces the i-th part of
    /// the elements, then the parts are exchanged in a second rendezvous.
    /// Each element is still reduced in rank order, so the result is the
    /// same as one rank reducing everything.
    fn reduce_in_parts(
        &self,
        key: &str,
        op: CollectiveOp,
        all: &[&Contribution],
        element_count: u64,
    ) -> Result<Vec<u8>> {
        let n = self.members.len() as u64;
        let part = element_count.div_ceil(n);
        let first = (self.rank as u64 * part).min(element_count);
        let count = part.min(element_count - first);
        let mine: Arc<Vec<u8>> = Arc::new(reduce(op, all, first, count, n));
        let parts =
            self.group
                .exchange_among(&format!("{key}/parts"), &self.members, self.root(), mine)?;
        let mut out = Vec::with_capacity((element_count * op.element_type.byte_size()) as usize);
        for p in &parts {
            out.extend_from_slice(
                p.downcast_ref::<Vec<u8>>()
                    .expect("reduction parts are byte vectors"),
            );
        }
        Ok(out)
    }

    /// Elements this rank reads from its send range and writes to its
    /// receive range (0 = none).
    fn local_counts(
        &self,
        op: CollectiveOp,
        param: u32,
        recv: Option<Operand<'_>>,
        element_count: u64,
    ) -> (u64, u64) {
        let n = self.members.len() as u64;
        let me = self.rank;
        match op.kind {
            CollectiveKind::AllGather => {
                let recv_bytes = recv.map_or(0, |(_, _, l)| l);
                let per_rank = op.all_gather_send_count(element_count, n as u32, recv_bytes);
                (per_rank, per_rank.saturating_mul(n))
            }
            CollectiveKind::AllReduce | CollectiveKind::AllToAll => (element_count, element_count),
            CollectiveKind::Broadcast => {
                let send = if param == me { element_count } else { 0 };
                (send, element_count)
            }
            CollectiveKind::Reduce => {
                let recv = if param == me { element_count } else { 0 };
                (element_count, recv)
            }
            CollectiveKind::ReduceScatter => (element_count.saturating_mul(n), element_count),
            CollectiveKind::SendRecv => {
                let send = if param & 0xffff == NO_PEER {
                    0
                } else {
                    element_count
                };
                (send, element_count)
            }
            CollectiveKind::Send => (element_count, 0),
            CollectiveKind::Recv => (0, element_count),
        }
    }

    /// The rendezvous of the next transfer from `from` to `to` (channel
    /// ranks) and the pair's root ranks, sender first.
    fn p2p_round(&self, from: u32, to: u32) -> (String, [u32; 2]) {
        let mut p = self.p2p.lock();
        let k = p.entry((from, to)).or_insert(0);
        let key = format!("{}/p2p{from}>{to}/{k}", self.name);
        *k += 1;
        (
            key,
            [self.members[from as usize], self.members[to as usize]],
        )
    }

    fn check_peer(&self, peer: u32, what: &str) -> Result<()> {
        let n = self.members.len() as u32;
        if peer >= n {
            bail!(
                OutOfRange,
                "{what} rank {peer} is outside the channel's {n} ranks"
            );
        }
        if peer == self.rank {
            bail!(
                InvalidArgument,
                "rank {peer} cannot {what} itself (a send waits for its receive)"
            );
        }
        Ok(())
    }

    fn send(
        &self,
        op: CollectiveOp,
        to: u32,
        send: Option<Operand<'_>>,
        element_count: u64,
    ) -> Result<()> {
        self.check_peer(to, "send to")?;
        let bytes = byte_count(element_count, op.element_type.byte_size());
        let (data, error) = match bytes.and_then(|b| read_operand(send, b, "send")) {
            Ok(d) => (d, None),
            Err(e) => (Vec::new(), Some(e.message().to_string())),
        };
        let (key, pair) = self.p2p_round(self.rank, to);
        let mine = Arc::new(Contribution {
            op,
            param: to,
            element_count,
            data,
            error,
        });
        let both = self.group.exchange_among(&key, &pair, self.root(), mine)?;
        check_pair(&both, self.rank, to)
    }

    fn recv(
        &self,
        op: CollectiveOp,
        from: u32,
        recv: Option<Operand<'_>>,
        element_count: u64,
    ) -> Result<()> {
        self.check_peer(from, "receive from")?;
        let bytes = byte_count(element_count, op.element_type.byte_size());
        let error = bytes
            .and_then(|b| check_len(recv, b, "recv"))
            .err()
            .map(|e| e.message().to_string());
        let (key, pair) = self.p2p_round(from, self.rank);
        let mine = Arc::new(Contribution {
            op,
            param: from,
            element_count,
            data: Vec::new(),
            error,
        });
        let both = self.group.exchange_among(&key, &pair, self.root(), mine)?;
        check_pair(&both, from, self.rank)?;
        let sent = both[0]
            .downcast_ref::<Contribution>()
            .expect("point-to-point rounds carry contributions");
        write_operand(recv, &sent.data)
    }
}

/// Fails unless both ends of a transfer (sender first) agree on what moves.
fn check_pair(both: &[Arc<dyn Any + Send + Sync>], from: u32, to: u32) -> Result<()> {
    let c = |i: usize| {
        both[i]
            .downcast_ref::<Contribution>()
            .expect("point-to-point rounds carry contributions")
    };
    let (s, r) = (c(0), c(1));
    for (who, x) in [(from, s), (to, r)] {
        if let Some(e) = &x.error {
            bail!(FailedPrecondition, "rank {who} failed: {e}");
        }
    }
    if s.element_count != r.element_count || s.op.element_type != r.op.element_type {
        bail!(
            InvalidArgument,
            "rank {from} sends {} {:?} elements, rank {to} receives {} {:?}",
            s.element_count,
            s.op.element_type,
            r.element_count,
            r.op.element_type
        );
    }
    Ok(())
}

/// Fails (with the same message on every rank) unless every rank asked for
/// the same operation with consistent parameters.
fn check_agreement(all: &[&Contribution], n: u32) -> Result<()> {
    for (r, c) in all.iter().enumerate() {
        if let Some(e) = &c.error {
            bail!(FailedPrecondition, "rank {r} failed: {e}");
        }
    }
    let first = all[0];
    let kind = first.op.kind.name();
    if first.op.kind == CollectiveKind::AllGather {
        // Each rank derives its send count from its receive range.
        for (r, c) in all.iter().enumerate().skip(1) {
            if c.data.len() != first.data.len() {
                bail!(
                    InvalidArgument,
                    "ranks disagree on the elements each sends in all_gather: rank 0 sends {} bytes, rank {r} sends {}",
                    first.data.len(),
                    c.data.len()
                );
            }
        }
    }
    for (r, c) in all.iter().enumerate().skip(1) {
        if c.op != first.op {
            bail!(
                InvalidArgument,
                "ranks disagree on the operation: rank 0 runs {kind} {:?} {:?}, rank {r} runs {} {:?} {:?}",
                first.op.reduction,
                first.op.element_type,
                c.op.kind.name(),
                c.op.reduction,
                c.op.element_type
            );
        }
        if c.element_count != first.element_count {
            bail!(
                InvalidArgument,
                "ranks disagree on the element count of {kind}: rank 0 has {}, rank {r} has {}",
                first.element_count,
                c.element_count
            );
        }
    }
    match first.op.kind {
        CollectiveKind::Broadcast | CollectiveKind::Reduce => {
            for (r, c) in all.iter().enumerate() {
                if c.param != first.param {
                    bail!(
                        InvalidArgument,
                        "ranks disagree on the root of {kind}: rank 0 names {}, rank {r} names {}",
                        first.param,
                        c.param
                    );
                }
            }
            if first.param >= n {
                bail!(
                    OutOfRange,
                    "root rank {} of {kind} is outside the channel's {n} ranks",
                    first.param
                );
            }
        }
        CollectiveKind::AllToAll if !first.element_count.is_multiple_of(n as u64) => bail!(
            InvalidArgument,
            "all_to_all of {} elements cannot be split into {n} equal parts",
            first.element_count
        ),
        CollectiveKind::SendRecv => {
            for (r, c) in all.iter().enumerate() {
                let (to, from) = (c.param & 0xffff, c.param >> 16);
                for (peer, what) in [(to, "sends to"), (from, "receives from")] {
                    if peer != NO_PEER && peer >= n {
                        bail!(
                            OutOfRange,
                            "rank {r} {what} rank {peer}, outside the channel's {n} ranks"
                        );
                    }
                }
                if from != NO_PEER && all[from as usize].param & 0xffff != r as u32 {
                    let t = all[from as usize].param & 0xffff;
                    let t = if t == NO_PEER {
                        "nobody".to_string()
                    } else {
                        format!("rank {t}")
                    };
                    bail!(
                        InvalidArgument,
                        "rank {r} receives from rank {from}, but rank {from} sends to {t}"
                    );
                }
            }
        }
        _ => {}
    }
    Ok(())
}

/// `elements * size` bytes, or an error when a program's element count
/// overflows.
fn byte_count(elements: u64, size: u64) -> Result<u64> {
    match elements.checked_mul(size) {
        Some(b) => Ok(b),
        None => bail!(
            OutOfRange,
            "{elements} elements of {size} bytes overflow a 64-bit byte count"
        ),
    }
}

/// Fails unless `operand` holds at least `bytes` bytes.
fn check_len(operand: Option<Operand<'_>>, bytes: u64, what: &str) -> Result<()> {
    let Some((_, _, len)) = operand else {
        bail!(InvalidArgument, "no {what} buffer");
    };
    if len < bytes {
        bail!(
            OutOfRange,
            "{what} range of {len} bytes is smaller than the {bytes} bytes the operation needs"
        );
    }
    Ok(())
}

/// Copies the first `bytes` bytes of `operand`.
fn read_operand(operand: Option<Operand<'_>>, bytes: u64, what: &str) -> Result<Vec<u8>> {
    check_len(operand, bytes, what)?;
    let (buffer, offset, _) = operand.expect("checked above");
    let range = buffer.binding_range_resolved(offset, bytes, MemoryAccess::READ)?;
    let mut out = vec![0u8; range.len()];
    // SAFETY: `range` was checked against the live allocation of `buffer`
    // (which the executing command buffer holds) for `len` readable bytes,
    // and counts as device work on it until dropped; queue ordering keeps
    // other writers off the range while this command runs.
    unsafe { std::ptr::copy_nonoverlapping(range.as_ptr(), out.as_mut_ptr(), out.len()) };
    Ok(out)
}

/// Writes `data` at the start of `operand` (whose length was checked).
fn write_operand(operand: Option<Operand<'_>>, data: &[u8]) -> Result<()> {
    let Some((buffer, offset, _)) = operand else {
        return Ok(());
    };
    let range = buffer.binding_range_resolved(offset, data.len() as u64, MemoryAccess::WRITE)?;
    // SAFETY: `range` was checked writable for `data.len()` bytes of the
    // live allocation of `buffer`, held by the executing command buffer;
    // `data` is a separate vector, so the copy does not overlap it.
    unsafe { std::ptr::copy_nonoverlapping(data.as_ptr(), range.as_ptr(), data.len()) };
    Ok(())
}

/// An element type that collectives reduce.
trait Element: Copy {
    const SIZE: usize;
    fn load(b: &[u8]) -> Self;
    fn store(self, b: &mut [u8]);
    fn apply(self, other: Self, reduction: Reduction) -> Self;
    /// `self / n` (the average's last step).
    fn divide(self, n: u64) -> Self;
}

macro_rules! int_element {
    ($($t:ty),*) => {$(
        impl Element for $t {
            const SIZE: usize = std::mem::size_of::<$t>();
            fn load(b: &[u8]) -> Self {
                <$t>::from_le_bytes(b.try_into().expect("element-sized chunk"))
            }
            fn store(self, b: &mut [u8]) {
                b.copy_from_slice(&self.to_le_bytes());
            }
            // Integers wrap, as NCCL's do.
            fn apply(self, o: Self, r: Reduction) -> Self {
                match r {
                    Reduction::Product => self.wrapping_mul(o),
                    Reduction::Minimum => self.min(o),
                    Reduction::Maximum => self.max(o),
                    Reduction::Sum | Reduction::Average | Reduction::None => self.wrapping_add(o),
                }
            }
            fn divide(self, n: u64) -> Self {
                (self as i128 / n as i128) as $t
            }
        }
    )*};
}
int_element!(i8, u8, i16, u16, i32, u32, i64, u64);

macro_rules! float_element {
    ($($t:ty),*) => {$(
        impl Element for $t {
            const SIZE: usize = std::mem::size_of::<$t>();
            fn load(b: &[u8]) -> Self {
                <$t>::from_le_bytes(b.try_into().expect("element-sized chunk"))
            }
            fn store(self, b: &mut [u8]) {
                b.copy_from_slice(&self.to_le_bytes());
            }
            fn apply(self, o: Self, r: Reduction) -> Self {
                match r {
                    Reduction::Product => self * o,
                    Reduction::Minimum => self.min(o),
                    Reduction::Maximum => self.max(o),
                    Reduction::Sum | Reduction::Average | Reduction::None => self + o,
                }
            }
            fn divide(self, n: u64) -> Self {
                self / n as $t
            }
        }
    )*};
}
float_element!(f32, f64);

/// A 16-bit float held as its bits; arithmetic in f32, rounded back after
/// each step (as a device reducing in the type itself).
#[derive(Clone, Copy)]
struct Half<const BF: bool>(u16);

impl<const BF: bool> Half<BF> {
    fn get(self) -> f32 {
        if BF {
            numerics::bf16_to_f32(self.0)
        } else {
            numerics::f16_to_f32(self.0)
        }
    }
    fn new(v: f32) -> Self {
        Half(if BF {
            numerics::f32_to_bf16(v)
        } else {
            numerics::f32_to_f16(v)
        })
    }
}

impl<const BF: bool> Element for Half<BF> {
    const SIZE: usize = 2;
    fn load(b: &[u8]) -> Self {
        Half(u16::from_le_bytes([b[0], b[1]]))
    }
    fn store(self, b: &mut [u8]) {
        b.copy_from_slice(&self.0.to_le_bytes());
    }
    fn apply(self, o: Self, r: Reduction) -> Self {
        Self::new(self.get().apply(o.get(), r))
    }
    fn divide(self, n: u64) -> Self {
        Self::new(self.get() / n as f32)
    }
}

/// Reduces elements `first..first + count` of every rank's data.
fn reduce(op: CollectiveOp, all: &[&Contribution], first: u64, count: u64, n: u64) -> Vec<u8> {
    use CollectiveElementType as E;
    let inputs: Vec<&[u8]> = all.iter().map(|c| c.data.as_slice()).collect();
    let (first, count) = (first as usize, count as usize);
    let r = op.reduction;
    match op.element_type {
        E::Sint8 => reduce_as::<i8>(&inputs, first, count, r, n),
        E::Uint8 => reduce_as::<u8>(&inputs, first, count, r, n),
        E::Sint16 => reduce_as::<i16>(&inputs, first, count, r, n),
        E::Uint16 => reduce_as::<u16>(&inputs, first, count, r, n),
        E::Sint32 => reduce_as::<i32>(&inputs, first, count, r, n),
        E::Uint32 => reduce_as::<u32>(&inputs, first, count, r, n),
        E::Sint64 => reduce_as::<i64>(&inputs, first, count, r, n),
        E::Uint64 => reduce_as::<u64>(&inputs, first, count, r, n),
        E::Float16 => reduce_as::<Half<false>>(&inputs, first, count, r, n),
        E::BFloat16 => reduce_as::<Half<true>>(&inputs, first, count, r, n),
        E::Float32 => reduce_as::<f32>(&inputs, first, count, r, n),
        E::Float64 => reduce_as::<f64>(&inputs, first, count, r, n),
    }
}

/// Reduces in rank order (so every rank computes bit-identical results).
fn reduce_as<T: Element>(
    inputs: &[&[u8]],
    first: usize,
    count: usize,
    reduction: Reduction,
    n: u64,
) -> Vec<u8> {
    let mut out = vec![0u8; count * T::SIZE];
    let at = |data: &[u8], i: usize| T::load(&data[(first + i) * T::SIZE..][..T::SIZE]);
    for (i, o) in out.chunks_exact_mut(T::SIZE).enumerate() {
        let mut acc = at(inputs[0], i);
        for data in &inputs[1..] {
            acc = acc.apply(at(data, i), reduction);
        }
        if reduction == Reduction::Average {
            acc = acc.divide(n);
        }
        acc.store(o);
    }
    out
}
