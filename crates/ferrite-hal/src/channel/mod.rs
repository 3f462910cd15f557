//! Collective channels: a participant (rank) of a group of devices that
//! exchange data with collective operations (all-reduce, all-gather, ...).
//!
//! A channel is created by a device ([`crate::device::Device::create_channel`])
//! and used by the collective command of command buffers
//! ([`crate::command_buffer::Command::Collective`]); the device that executes
//! the command performs the exchange (CPU devices in one process through a
//! shared rendezvous, CUDA devices through NCCL).
//!
//! Programs usually create channels with default parameters: rank, count and
//! the group's identifier come from the environment. A [`ChannelProvider`]
//! answers those defaults: from launcher environment variables (one process
//! per rank) or from an in-process group (one process driving every rank).
//!
//! The packed operation word, kinds, reductions and element types have
//! upstream's encoding (`hal.command_buffer.collective`'s `op` operand).

pub mod local_group;
mod provider;

use ferrite_base::{bail, RefObject, Result};
use std::any::Any;
use std::sync::Arc;

pub use local_group::{LocalGroup, LocalRank};
pub use provider::ChannelProvider;

/// Channel flags (none are defined; carried for the ABI).
pub type ChannelFlags = u64;

/// `color` value of [`Channel::split`] for a rank that joins no subgroup.
pub const NO_COLOR: i32 = -1;

/// How a channel is configured. `None`/empty fields ask the environment (the
/// device's [`ChannelProvider`]) for the value.
#[derive(Clone, Debug, Default)]
pub struct ChannelParams {
    /// Flags (reserved).
    pub flags: ChannelFlags,
    /// Implementation-defined group identifier (for NCCL the 128-byte
    /// `ncclUniqueId`); empty = exchanged through the provider.
    pub id: Vec<u8>,
    /// User-defined group key, opaque to the HAL.
    pub group: String,
    /// This participant's rank; `None` = from the provider.
    pub rank: Option<u32>,
    /// The number of participants; `None` = from the provider.
    pub count: Option<u32>,
}

/// One participant of a collective group (VM ref type `hal.channel`).
pub trait Channel: Send + Sync + 'static {
    /// This participant's rank in `[0, count)`.
    fn rank(&self) -> u32;
    /// The number of participants.
    fn count(&self) -> u32;
    /// Splits the group: ranks passing the same `color` form a new group,
    /// ordered by `key` (then by rank). Every rank of the group must call
    /// it. A rank passing [`NO_COLOR`] joins no group and gets `None`.
    fn split(&self, color: i32, key: i32, flags: ChannelFlags) -> Result<Option<ChannelRef>>;
    /// For drivers: downcast to the concrete channel.
    fn as_any(&self) -> &dyn Any;
}

/// The VM ref type `hal.channel`.
#[derive(Clone)]
pub struct ChannelRef(pub Arc<dyn Channel>);

impl RefObject for ChannelRef {
    fn type_name(&self) -> &'static str {
        "hal.channel"
    }
}

impl std::fmt::Debug for ChannelRef {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "hal.channel(rank {} of {})",
            self.0.rank(),
            self.0.count()
        )
    }
}

/// What a collective operation does (upstream's numbering).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum CollectiveKind {
    /// Concatenates `element_count` elements from every rank, in rank order
    /// (compiled programs pass the gathered total instead: see
    /// [`CollectiveOp::all_gather_send_count`]).
    AllGather = 0,
    /// Reduces `element_count` elements across ranks; every rank gets the result.
    AllReduce = 1,
    /// Rank r sends part i of its `element_count / count` parts to rank i,
    /// and receives part r of every rank in rank order.
    AllToAll = 2,
    /// Copies `element_count` elements from rank `param` to every rank.
    Broadcast = 3,
    /// Reduces across ranks into rank `param`'s receive buffer.
    Reduce = 4,
    /// Reduces `count * element_count` elements across ranks; rank i
    /// receives block i (`element_count` elements) of the result.
    ReduceScatter = 5,
    /// Sends to rank `param`.
    Send = 6,
    /// Receives from rank `param`.
    Recv = 7,
    /// Sends to rank `param & 0xffff` and receives from rank `param >> 16`
    /// (either may be `0xffff`, meaning none; no source receives zeros).
    SendRecv = 8,
}

impl CollectiveKind {
    /// Whether the operation applies a [`Reduction`].
    pub fn is_reduction(self) -> bool {
        matches!(self, Self::AllReduce | Self::Reduce | Self::ReduceScatter)
    }
    /// Whether the operation reads a send buffer.
    pub fn uses_send(self) -> bool {
        !matches!(self, Self::Recv)
    }
    /// Whether the operation writes a receive buffer.
    pub fn uses_recv(self) -> bool {
        !matches!(self, Self::Send)
    }
    /// Upstream's lower-case name (`all_reduce`).
    pub fn name(self) -> &'static str {
        match self {
            Self::AllGather => "all_gather",
            Self::AllReduce => "all_reduce",
            Self::AllToAll => "all_to_all",
            Self::Broadcast => "broadcast",
            Self::Reduce => "reduce",
            Self::ReduceScatter => "reduce_scatter",
            Self::Send => "send",
            Self::Recv => "recv",
            Self::SendRecv => "send_recv",
        }
    }
}

/// The reduction of a reducing collective (upstream's numbering).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum Reduction {
    /// None (non-reducing operations).
    None = 0,
    /// Sum.
    Sum = 1,
    /// Product.
    Product = 2,
    /// Minimum.
    Minimum = 3,
    /// Maximum.
    Maximum = 4,
    /// Average.
    Average = 5,
}

/// The element type a collective moves or reduces (upstream's numbering).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum CollectiveElementType {
    /// i8.
    Sint8 = 0,
    /// u8.
    Uint8 = 1,
    /// i16.
    Sint16 = 2,
    /// u16.
    Uint16 = 3,
    /// i32.
    Sint32 = 4,
    /// u32.
    Uint32 = 5,
    /// i64.
    Sint64 = 6,
    /// u64.
    Uint64 = 7,
    /// IEEE half.
    Float16 = 8,
    /// f32.
    Float32 = 9,
    /// f64.
    Float64 = 10,
    /// bfloat16.
    BFloat16 = 11,
}

impl CollectiveElementType {
    /// Bytes per element.
    pub fn byte_size(self) -> u64 {
        match self {
            Self::Sint8 | Self::Uint8 => 1,
            Self::Sint16 | Self::Uint16 | Self::Float16 | Self::BFloat16 => 2,
            Self::Sint32 | Self::Uint32 | Self::Float32 => 4,
            Self::Sint64 | Self::Uint64 | Self::Float64 => 8,
        }
    }
}

/// A decoded collective operation word: kind in byte 0, reduction in byte 1,
/// element type in byte 2, byte 3 reserved.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct CollectiveOp {
    /// What the operation does.
    pub kind: CollectiveKind,
    /// The reduction ([`Reduction::None`] unless the kind reduces).
    pub reduction: Reduction,
    /// The element type.
    pub element_type: CollectiveElementType,
}

impl CollectiveOp {
    /// Decodes and validates a packed operation word, naming the field that
    /// was out of range.
    pub fn from_packed(packed: u32) -> Result<CollectiveOp> {
        let [k, r, e, _] = packed.to_le_bytes();
        use CollectiveElementType as E;
        use CollectiveKind as K;
        let kind = match k {
            0 => K::AllGather,
            1 => K::AllReduce,
            2 => K::AllToAll,
            3 => K::Broadcast,
            4 => K::Reduce,
            5 => K::ReduceScatter,
            6 => K::Send,
            7 => K::Recv,
            8 => K::SendRecv,
            _ => bail!(
                InvalidArgument,
                "collective op {packed:#x}: unknown kind {k} (expected 0..=8)"
            ),
        };
        let reduction = match r {
            0 => Reduction::None,
            1 => Reduction::Sum,
            2 => Reduction::Product,
            3 => Reduction::Minimum,
            4 => Reduction::Maximum,
            5 => Reduction::Average,
            _ => bail!(
                InvalidArgument,
                "collective op {packed:#x}: unknown reduction {r} (expected 0..=5)"
            ),
        };
        let element_type = match e {
            0 => E::Sint8,
            1 => E::Uint8,
            2 => E::Sint16,
            3 => E::Uint16,
            4 => E::Sint32,
            5 => E::Uint32,
            6 => E::Sint64,
            7 => E::Uint64,
            8 => E::Float16,
            9 => E::Float32,
            10 => E::Float64,
            11 => E::BFloat16,
            _ => bail!(
                InvalidArgument,
                "collective op {packed:#x}: unknown element type {e} (expected 0..=11)"
            ),
        };
        if !kind.is_reduction() && reduction != Reduction::None {
            bail!(
                InvalidArgument,
                "collective op {packed:#x}: {} does not reduce, but reduction {reduction:?} was given",
                kind.name()
            );
        }
        if kind.is_reduction() && reduction == Reduction::None {
            bail!(
                InvalidArgument,
                "collective op {packed:#x}: {} needs a reduction",
                kind.name()
            );
        }
        Ok(CollectiveOp {
            kind,
            reduction,
            element_type,
        })
    }

    /// The elements each rank sends in an [`CollectiveKind::AllGather`] of
    /// `element_count` over `count` ranks whose receive range holds
    /// `recv_bytes` bytes.
    ///
    /// Upstream's HAL header counts the elements each rank sends, but the
    /// pinned compiler passes the gathered total (the result's element
    /// count: a `4xf32` gathered over 2 ranks is recorded with 8). The receive
    /// range tells them apart: when it cannot hold `count * element_count`
    /// elements but holds `element_count`, and `count` divides it, the
    /// count is the total; otherwise it is per rank (and the range check of
    /// the operation refuses a receive range too small for either).
    pub fn all_gather_send_count(self, element_count: u64, count: u32, recv_bytes: u64) -> u64 {
        let size = self.element_type.byte_size();
        let count = count as u64;
        let per_rank_fits = element_count
            .checked_mul(count)
            .and_then(|n| n.checked_mul(size))
            .is_some_and(|b| b <= recv_bytes);
        let total_fits = element_count
            .checked_mul(size)
            .is_some_and(|b| b <= recv_bytes);
        if count > 1 && !per_rank_fits && total_fits && element_count.is_multiple_of(count) {
            element_count / count
        } else {
            element_count
        }
    }

    /// Re-encodes the packed word.
    pub fn packed(self) -> u32 {
        u32::from_le_bytes([
            self.kind as u8,
            self.reduction as u8,
            self.element_type as u8,
            0,
        ])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn decodes_what_the_compiler_emits() {
        // all_reduce sum f32, as compiled from stablehlo.all_reduce.
        let op = CollectiveOp::from_packed(590081).unwrap();
        assert_eq!(op.kind, CollectiveKind::AllReduce);
        assert_eq!(op.reduction, Reduction::Sum);
        assert_eq!(op.element_type, CollectiveElementType::Float32);
        assert_eq!(op.packed(), 590081);
    }

    #[test]
    fn all_gather_counts_per_rank_or_total() {
        let op = CollectiveOp::from_packed(589824).unwrap();
        assert_eq!(op.kind, CollectiveKind::AllGather);
        // As compiled: 4xf32 per rank, 2 ranks, total 8 recorded, 32-byte recv.
        assert_eq!(op.all_gather_send_count(8, 2, 32), 4);
        // As upstream's header: 4 per rank into a recv range for 8.
        assert_eq!(op.all_gather_send_count(4, 2, 32), 4);
        assert_eq!(op.all_gather_send_count(4, 1, 16), 4);
    }

    #[test]
    fn refuses_bad_words_naming_the_field() {
        let e = CollectiveOp::from_packed(9).unwrap_err().to_string();
        assert!(e.contains("unknown kind 9"), "{e}");
        let e = CollectiveOp::from_packed(0x0100).unwrap_err().to_string();
        assert!(e.contains("all_gather does not reduce"), "{e}");
        let e = CollectiveOp::from_packed(0x0c_0101)
            .unwrap_err()
            .to_string();
        assert!(e.contains("unknown element type 12"), "{e}");
        let e = CollectiveOp::from_packed(0x0901).unwrap_err().to_string();
        assert!(e.contains("unknown reduction 9"), "{e}");
        let e = CollectiveOp::from_packed(0x09_0001)
            .unwrap_err()
            .to_string();
        assert!(e.contains("needs a reduction"), "{e}");
    }
}
