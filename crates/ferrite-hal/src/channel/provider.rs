//! The [`ChannelProvider`] trait: where channels created with default
//! parameters get them. A file of its own so that providers beside the
//! channel types (`local_group`) implement it without naming the module
//! that re-exports them.

use ferrite_base::Result;
use std::any::Any;

/// Supplies the defaults of [`ChannelParams`](super::ChannelParams) a program leaves unset: the
/// rank and participant count, and the exchange of the group identifier
/// that rank 0 creates (`ncclUniqueId` for NCCL).
pub trait ChannelProvider: Send + Sync + 'static {
    /// This process's (or thread's) rank and the group size.
    fn default_rank_and_count(&self) -> Result<(u32, u32)>;
    /// Exchanges the group identifier: on rank 0, `id` holds the identifier
    /// to publish; on every other rank it is overwritten with rank 0's.
    /// `key` names the exchange so that several groups can be formed in
    /// turn (the n-th channel created by a program uses the same key on
    /// every rank).
    fn exchange_default_id(&self, key: &str, id: &mut [u8]) -> Result<()>;
    /// For drivers: downcast to the concrete provider (an in-process group
    /// lets CPU devices find their peers without any identifier).
    fn as_any(&self) -> &dyn Any;
}
