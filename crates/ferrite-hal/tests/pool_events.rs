//! The queue pool's trace events: a fresh block, its reuse by a later
//! allocation of the same size class, the pool's state after each event,
//! a block the full pool hands back to the host, and trim.

use ferrite_base::trace::{self, Arg, Event};
use ferrite_hal::allocator::{Allocator, BufferParams, CachingAllocator};

fn arg(e: &Event, key: &str) -> Option<u64> {
    e.args.iter().find_map(|(k, v)| match v {
        Arg::U64(n) if *k == key => Some(*n),
        _ => None,
    })
}

/// `name backing=.. [reused=..] reserved/free/reservations/slabs` per event.
fn lines(t: &trace::Trace) -> Vec<String> {
    t.events
        .iter()
        .filter(|e| e.cat == "memory")
        .map(|e| {
            let reused = arg(e, "reused").map_or(String::new(), |r| format!(" reused={r}"));
            format!(
                "{} {}{reused} {}/{}/{}/{}",
                e.name,
                arg(e, "bytes").unwrap(),
                arg(e, "pool_reserved").unwrap(),
                arg(e, "pool_free").unwrap(),
                arg(e, "pool_reservations").unwrap(),
                arg(e, "pool_slabs").unwrap(),
            )
        })
        .collect()
}

#[test]
fn pool_records_reserve_reuse_release_and_trim() {
    // Keeps one 1 KiB block at most.
    let pool = CachingAllocator::for_device(1024, "pool-events-test");
    let p = BufferParams::default();
    // Nothing is recorded while not recording.
    drop(pool.allocate(&p, 1000).unwrap());
    trace::start().unwrap();
    let a = pool.allocate(&p, 1000).unwrap(); // the block freed above
    let a_id = a.allocation_id();
    let b = pool.allocate(&p, 1000).unwrap(); // fresh
    drop(a); // back to the free list
    drop(b); // the pool is full: back to the host
    let c = pool.allocate(&p, 1000).unwrap(); // a's block again
    drop(c);
    pool.trim().unwrap();
    let t = trace::stop().unwrap();
    assert_eq!(
        lines(&t),
        [
            "pool_reserve 1024 reused=1 1024/0/1/1",
            "pool_materialize 1024 1024/0/1/1",
            "slab_acquire 1024 2048/0/2/2",
            "pool_reserve 1024 reused=0 2048/0/2/2",
            "pool_materialize 1024 2048/0/2/2",
            "pool_release 1024 1024/1024/1/2",
            "pool_release 1024 0/1024/0/1",
            "slab_release 1024 0/1024/0/1",
            "pool_reserve 1024 reused=1 1024/0/1/1",
            "pool_materialize 1024 1024/0/1/1",
            "pool_release 1024 0/1024/0/1",
            "slab_release 1024 0/0/0/0",
        ]
    );
    let memory: Vec<&Event> = t.events.iter().filter(|e| e.cat == "memory").collect();
    // Reserve and materialize name the allocation (as the queue's alloca
    // does); every event names its block, the same block for a, c and the
    // trim.
    assert_eq!(arg(memory[0], "allocation"), Some(a_id));
    assert_eq!(arg(memory[0], "requested"), Some(1000));
    let block = arg(memory[0], "backing").unwrap();
    for i in [5, 8, 10, 11] {
        assert_eq!(arg(memory[i], "backing"), Some(block), "{}", memory[i].name);
    }
    assert_ne!(arg(memory[2], "backing"), Some(block));
    // On the device's own track.
    let track = trace::device_track("pool-events-test");
    assert!(memory.iter().all(|e| e.track == track));
}
