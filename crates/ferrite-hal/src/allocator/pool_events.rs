//! Trace events of the queue pool ([`super::CachingAllocator`]): what
//! happened to each block, for memory profiles (`--device_profiling_mode=
//! memory-events` writes them as upstream's pool and slab memory events).
//!
//! Events are instants of category `memory` on the pool's device track:
//! - `slab_acquire`: a fresh block was allocated from the host (a miss);
//! - `pool_reserve`: a block was taken for an allocation, `reused` 1 when
//!   it came from a free list (a block an earlier allocation released), 0
//!   when it is the fresh block of the `slab_acquire` just before;
//! - `pool_materialize`: the block became the allocation's buffer;
//! - `pool_release`: the allocation's last handle was dropped and its block
//!   went back (to a free list, or to the host when the pool was full:
//!   then a `slab_release` follows);
//! - `slab_release`: a block went back to the host (a full pool, or
//!   `trim`).
//!
//! Every event names its block (`backing`, its address) and size class
//! (`bytes`); reserve and materialize also the allocation (`allocation`,
//! the same identity the queue's `alloca` event carries) and the size asked
//! for (`requested`). Each carries the pool's state after it: bytes in
//! live allocations (`pool_reserved`), bytes in free lists (`pool_free`),
//! live allocations (`pool_reservations`) and blocks owned (`pool_slabs`).
//!
//! Nothing here runs unless a recording is on: the pool checks
//! [`ferrite_base::trace::enabled`] (a relaxed load) first.

use ferrite_base::trace::{self, Arg};

/// The pool's state after an event.
#[derive(Clone, Copy, Debug, Default)]
pub(super) struct Snapshot {
    /// Bytes (size classes) of live allocations.
    pub reserved: u64,
    /// Bytes held in free lists.
    pub free: u64,
    /// Live allocations.
    pub reservations: u64,
    /// Blocks the pool owns: live plus free.
    pub slabs: u64,
}

/// Records one pool event `name` of block `backing` (`bytes` long) with
/// the pool's state `snap` and the event's own arguments `extra`.
pub(super) fn record(
    device: Option<&'static str>,
    name: &'static str,
    backing: u64,
    bytes: u64,
    snap: Snapshot,
    extra: &[(&'static str, u64)],
) {
    let track = device.map_or(trace::HOST_TRACK, trace::device_track);
    let mut args = Vec::with_capacity(6 + extra.len());
    args.push(("backing", Arg::U64(backing)));
    args.push(("bytes", Arg::U64(bytes)));
    args.extend(extra.iter().map(|&(k, v)| (k, Arg::U64(v))));
    args.push(("pool_reserved", Arg::U64(snap.reserved)));
    args.push(("pool_free", Arg::U64(snap.free)));
    args.push(("pool_reservations", Arg::U64(snap.reservations)));
    args.push(("pool_slabs", Arg::U64(snap.slabs)));
    trace::instant("memory", name, track, args);
}
