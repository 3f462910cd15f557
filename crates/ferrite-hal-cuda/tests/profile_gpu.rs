//! GPU test of device timestamps in the execution trace (issue 28): with a
//! trace recorded, the CUDA device records its queue operations and every
//! kernel it launches as spans in device time on the trace's host clock,
//! describes the command buffers it executes, and lists its queue
//! allocations and releases, as the CPU devices do; off again, nothing is
//! recorded and reusable command buffers run as graphs again. Prints
//! SKIPPED without a GPU (scripts/test-gpu.sh sets FERRITE_REQUIRE_GPU=1 so
//! a skip fails there). The `.ireeprof` bundle written from such a
//! recording is read back by upstream's `iree-profile` in
//! scripts/test-gpu.sh ("profile bundle on cuda").

mod common;

use common::*;
use ferrite_base::trace::{self, Arg, Event, Phase};
use ferrite_base::Timeout;
use ferrite_hal::allocator::BufferParams;
use ferrite_hal::command_buffer::{Binding, BufferRef, CommandBuffer};
use ferrite_hal::device::{queue, Device};
use ferrite_hal::executable::ExecutableRef;
use ferrite_hal::{BufferUsage, Fence, MemoryType, Semaphore, WHOLE_BUFFER};
use std::sync::Arc;

/// One recording per process at a time: the tests of this file take
/// turns.
static RECORDER: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// Blocks per dispatch: enough atomic adds on one word that each kernel
/// takes microseconds, well above the timing events' resolution.
const BLOCKS: u32 = 20_000;

fn u64_arg(e: &Event, key: &str) -> Option<u64> {
    e.args.iter().find_map(|(k, v)| match v {
        Arg::U64(n) if *k == key => Some(*n),
        _ => None,
    })
}

fn list_arg(e: &Event, key: &str) -> Option<Vec<u64>> {
    e.args.iter().find_map(|(k, v)| match v {
        Arg::List(l) if *k == key => Some(l.clone()),
        _ => None,
    })
}

/// A reusable command buffer (a CUDA graph when no trace is recorded) of
/// three GRID_PTX dispatches on binding slot 0, barriers between them.
fn three_dispatches(dev: &Arc<dyn Device>) -> CommandBuffer {
    let exe = dev
        .create_executable("cuda-nvptx-fb", &cda1(GRID_PTX, "k", 1, 0), &[])
        .unwrap();
    let cb = CommandBuffer::new(0, 0, 0, 1);
    for i in 0..3 {
        if i > 0 {
            cb.execution_barrier().unwrap();
        }
        cb.dispatch(
            ExecutableRef(exe.clone()),
            0,
            [BLOCKS, 1, 1],
            None,
            vec![],
            vec![BufferRef::Slot {
                slot: 0,
                offset: 0,
                length: 16,
            }],
        )
        .unwrap();
    }
    cb.finalize().unwrap();
    cb
}

#[test]
fn kernels_and_queue_operations_are_traced_in_device_time() {
    let Some(dev) = gpu() else { return };
    let _one = RECORDER.lock().unwrap_or_else(|e| e.into_inner());
    let cuda = dev
        .as_any()
        .downcast_ref::<ferrite_hal_cuda::CudaDevice>()
        .unwrap();
    let cb = three_dispatches(&dev);
    let params = BufferParams::new(MemoryType::DEVICE_LOCAL, BufferUsage::DEFAULT);
    let s = Semaphore::new(0);
    let at = |v| Fence::create_at(s.clone(), v);
    let graphs_before = cuda.graph_launches();

    trace::start().unwrap();
    let host_start = trace::now_ns();
    let out = queue::alloca(&dev, &Fence::new(), &at(1), &params, 64).unwrap();
    let allocation = out.allocation_id();
    let table = vec![Binding {
        buffer: out.clone(),
        offset: 0,
        length: WHOLE_BUFFER,
    }];
    queue::fill(&dev, &at(1), &at(2), out.clone(), 0, 64, vec![0; 4]).unwrap();
    queue::execute(&dev, &at(2), &at(3), Some(&cb), table.clone()).unwrap();
    queue::execute(&dev, &at(3), &at(4), Some(&cb), table.clone()).unwrap();
    s.wait(4, Timeout::INFINITE).unwrap();
    let words: Vec<u32> = out
        .to_vec()
        .unwrap()
        .chunks_exact(4)
        .map(|c| u32::from_le_bytes(c.try_into().unwrap()))
        .collect();
    queue::dealloca(&dev, &at(4), &at(5), out).unwrap();
    s.wait(5, Timeout::INFINITE).unwrap();
    let recorded = trace::stop().unwrap();
    // After the stop: it takes a closing clock sample.
    let host_end = trace::now_ns();
    assert_eq!(words[..2], [6 * BLOCKS, BLOCKS], "the kernels ran");

    let track = trace::device_track("cuda://0");
    let on_device: Vec<&Event> = recorded
        .events
        .iter()
        .filter(|e| e.track == track)
        .collect();
    assert_eq!(
        recorded.tracks.get(&track).map(String::as_str),
        Some("device cuda://0")
    );

    // Six dispatches, in stream order: each takes time, none overlaps the
    // next (one stream), all inside the host window of the recording
    // (give or take the reference's calibration, a few microseconds).
    let mut dispatches: Vec<&Event> = on_device
        .iter()
        .copied()
        .filter(|e| e.cat == "dispatch")
        .collect();
    dispatches.sort_by_key(|e| e.ts_ns);
    assert_eq!(dispatches.len(), 6, "{on_device:#?}");
    let slack = 100_000;
    for (i, d) in dispatches.iter().enumerate() {
        assert_eq!(d.phase, Phase::Complete);
        assert_eq!(d.name, "k");
        assert!(d.dur_ns > 0, "dispatch {i} has no duration: {d:?}");
        assert!(
            d.ts_ns + slack >= host_start && d.ts_ns + d.dur_ns <= host_end + slack,
            "dispatch {i} at {}..{} outside the host window {host_start}..{host_end}",
            d.ts_ns,
            d.ts_ns + d.dur_ns
        );
        assert_eq!(list_arg(d, "workgroups"), Some(vec![BLOCKS as u64, 1, 1]));
        assert_eq!(u64_arg(d, "command"), Some([0, 2, 4][i % 3]));
        assert_eq!(u64_arg(d, "function"), Some(0));
        assert_eq!(u64_arg(d, "bindings"), Some(1));
        assert!(u64_arg(d, "executable").is_some_and(|x| x != 0));
        assert_eq!(u64_arg(d, "device_time"), Some(1), "read from the device");
        if i > 0 {
            let p = dispatches[i - 1];
            assert!(
                p.ts_ns + p.dur_ns <= d.ts_ns,
                "dispatches {} and {i} overlap on one stream: {p:?} {d:?}",
                i - 1
            );
        }
    }

    // Queue operations in device time: alloca, fill, two executes, the
    // release; each execute's span holds its three dispatches.
    let mut ops: Vec<&Event> = on_device
        .iter()
        .copied()
        .filter(|e| e.cat == "queue")
        .collect();
    ops.sort_by_key(|e| e.ts_ns);
    let names: Vec<&str> = ops.iter().map(|e| e.name.as_str()).collect();
    assert_eq!(
        names,
        ["alloca", "fill", "execute", "execute", "dealloca"],
        "{ops:#?}"
    );
    for (k, exec) in ops.iter().filter(|e| e.name == "execute").enumerate() {
        assert_eq!(exec.phase, Phase::Complete);
        assert_eq!(u64_arg(exec, "command_buffer"), Some(cb.id()));
        for d in &dispatches[3 * k..3 * k + 3] {
            assert!(
                exec.ts_ns <= d.ts_ns && d.ts_ns + d.dur_ns <= exec.ts_ns + exec.dur_ns,
                "execute {k} {exec:?} does not hold {d:?}"
            );
        }
    }
    assert_eq!(u64_arg(ops[0], "allocation"), Some(allocation));
    assert_eq!(u64_arg(ops[4], "allocation"), Some(allocation));
    assert_eq!(u64_arg(ops[0], "bytes"), Some(64));
    assert_eq!(u64_arg(ops[1], "bytes"), Some(64));

    // The command buffer described once, with its five commands.
    let described: Vec<&Event> = on_device
        .iter()
        .copied()
        .filter(|e| e.cat == "command_buffer")
        .collect();
    assert_eq!(described.len(), 1, "{described:#?}");
    assert_eq!(u64_arg(described[0], "commands"), Some(5));
    let commands = on_device.iter().filter(|e| e.cat == "command").count();
    assert_eq!(commands, 5);

    // Clock samples (the reference, and later ones measured from it): their
    // device time within their host window give or take the reference's
    // calibration (the same slack as above), inside the recording.
    let clocks: Vec<&Event> = on_device
        .iter()
        .copied()
        .filter(|e| e.cat == "clock")
        .collect();
    assert!(
        clocks.len() >= 2,
        "the reference's and the closing clock samples: {clocks:#?}"
    );
    for c in &clocks {
        let (tick, begin, end) = (
            u64_arg(c, "device_ns").unwrap(),
            u64_arg(c, "begin_ns").unwrap(),
            u64_arg(c, "end_ns").unwrap(),
        );
        assert!(
            begin <= end && host_start <= begin && end <= host_end,
            "{c:?}"
        );
        assert!(
            tick + slack >= begin && tick <= end + slack,
            "clock sample outside its window: {c:?}"
        );
    }

    // Kernels were timed one by one: no graph launch while recording.
    assert_eq!(cuda.graph_launches(), graphs_before);

    // Off again: nothing recorded, and the reusable command buffer runs as
    // a graph again.
    let out = dev.allocator().allocate(&params, 64).unwrap();
    let table = vec![Binding {
        buffer: out,
        offset: 0,
        length: WHOLE_BUFFER,
    }];
    queue::execute(&dev, &at(5), &at(6), Some(&cb), table).unwrap();
    s.wait(6, Timeout::INFINITE).unwrap();
    assert_eq!(cuda.graph_launches(), graphs_before + 1);
    trace::start().unwrap();
    let empty = trace::stop().unwrap();
    assert!(empty.events.is_empty(), "{:?}", empty.events);
}

/// A second recording gets a fresh reference: its spans are on the clock
/// of its own time, after the first recording's.
#[test]
fn each_recording_is_on_the_host_clock_of_its_time() {
    let Some(dev) = gpu() else { return };
    let _one = RECORDER.lock().unwrap_or_else(|e| e.into_inner());
    let cb = three_dispatches(&dev);
    let params = BufferParams::new(MemoryType::DEVICE_LOCAL, BufferUsage::DEFAULT);
    let out = dev.allocator().allocate(&params, 64).unwrap();
    let table = vec![Binding {
        buffer: out,
        offset: 0,
        length: WHOLE_BUFFER,
    }];
    let s = Semaphore::new(0);
    let mut last_end = 0;
    for round in 1..=2u64 {
        trace::start().unwrap();
        let host_start = trace::now_ns();
        queue::execute(
            &dev,
            &Fence::create_at(s.clone(), round - 1),
            &Fence::create_at(s.clone(), round),
            Some(&cb),
            table.clone(),
        )
        .unwrap();
        s.wait(round, Timeout::INFINITE).unwrap();
        let host_end = trace::now_ns();
        let t = trace::stop().unwrap();
        let spans: Vec<&Event> = t
            .events
            .iter()
            .filter(|e| e.cat == "dispatch" || (e.cat == "queue" && e.name == "execute"))
            .collect();
        assert_eq!(spans.len(), 4, "round {round}: {spans:#?}");
        for e in spans {
            assert!(
                e.ts_ns + 100_000 >= host_start && e.ts_ns + e.dur_ns <= host_end + 100_000,
                "round {round}: {e:?} outside {host_start}..{host_end}"
            );
            assert!(
                e.ts_ns >= last_end,
                "round {round}: {e:?} before {last_end}"
            );
        }
        last_end = host_end;
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
}

/// Work enqueued while recording and still on the GPU (or not yet
/// reported) when the recording stops is in it: stopping flushes the
/// device, which waits for its stream and records the spans.
#[test]
fn operations_still_running_when_the_recording_stops_are_in_it() {
    let Some(dev) = gpu() else { return };
    let _one = RECORDER.lock().unwrap_or_else(|e| e.into_inner());
    let cb = three_dispatches(&dev);
    let params = BufferParams::new(MemoryType::DEVICE_LOCAL, BufferUsage::DEFAULT);
    let out = dev.allocator().allocate(&params, 64).unwrap();
    let table = vec![Binding {
        buffer: out.clone(),
        offset: 0,
        length: WHOLE_BUFFER,
    }];
    let s = Semaphore::new(0);
    let at = |v| Fence::create_at(s.clone(), v);
    const EXECUTES: u64 = 4;
    trace::start().unwrap();
    for v in 1..=EXECUTES {
        queue::execute(&dev, &at(v - 1), &at(v), Some(&cb), table.clone()).unwrap();
    }
    // Nobody has waited or queried (a query reports what is done): nothing
    // was reported yet when the recording is stopped (the completion
    // thread reports unwatched work only every 50 ms), and the last
    // kernels may still run.
    let recorded = trace::stop().unwrap();
    s.wait(EXECUTES, Timeout::INFINITE).unwrap();
    let words: Vec<u32> = out
        .to_vec()
        .unwrap()
        .chunks_exact(4)
        .map(|c| u32::from_le_bytes(c.try_into().unwrap()))
        .collect();
    assert_eq!(words[0], 3 * EXECUTES as u32 * BLOCKS, "the kernels ran");

    let executes = recorded
        .events
        .iter()
        .filter(|e| e.cat == "queue" && e.name == "execute" && e.phase == Phase::Complete)
        .count() as u64;
    let dispatches: Vec<&Event> = recorded
        .events
        .iter()
        .filter(|e| e.cat == "dispatch")
        .collect();
    assert_eq!(
        (executes, dispatches.len() as u64),
        (EXECUTES, 3 * EXECUTES),
        "recorded: {:#?}",
        recorded.events
    );
    for d in &dispatches {
        assert_eq!(u64_arg(d, "device_time"), Some(1), "{d:?}");
        assert!(d.dur_ns > 0, "{d:?}");
    }
    // Nothing of it leaks into the next recording.
    trace::start().unwrap();
    let next = trace::stop().unwrap();
    assert!(next.events.is_empty(), "{:?}", next.events);
}

/// The device's block pool records the CPU queue pool's memory events: a
/// queue allocation on a fresh block (acquired from the driver, reserved,
/// materialized), its release keeping the block idle, and a second
/// allocation of the same size reusing it; each event with the pool's
/// state after it and the allocation id of the buffer it served.
#[test]
fn pool_blocks_show_in_memory_events() {
    let Some(dev) = gpu() else { return };
    let _one = RECORDER.lock().unwrap_or_else(|e| e.into_inner());
    let params = BufferParams::new(MemoryType::DEVICE_LOCAL, BufferUsage::DEFAULT);
    // A size nothing else of this (new) device allocates.
    const SIZE: u64 = 3 * 4096 + 256;
    let s = Semaphore::new(0);
    let at = |v| Fence::create_at(s.clone(), v);
    trace::start().unwrap();
    let mut ids = Vec::new();
    for round in 0..2u64 {
        let b = queue::alloca(&dev, &at(2 * round), &at(2 * round + 1), &params, SIZE).unwrap();
        ids.push(b.allocation_id());
        // The queue's handle is the last: the block goes back when the
        // release is reported.
        queue::dealloca(&dev, &at(2 * round + 1), &at(2 * round + 2), b).unwrap();
        s.wait(2 * round + 2, Timeout::INFINITE).unwrap();
    }
    let recorded = trace::stop().unwrap();
    let track = trace::device_track("cuda://0");
    let memory: Vec<&Event> = recorded
        .events
        .iter()
        .filter(|e| e.cat == "memory" && e.track == track)
        .collect();
    let names: Vec<&str> = memory.iter().map(|e| e.name.as_str()).collect();
    assert_eq!(
        names,
        [
            "slab_acquire",
            "pool_reserve",
            "pool_materialize",
            "pool_release",
            "pool_reserve",
            "pool_materialize",
            "pool_release"
        ],
        "{memory:#?}"
    );
    let block = u64_arg(memory[0], "backing").unwrap();
    assert_ne!(block, 0);
    for e in &memory {
        assert_eq!(u64_arg(e, "backing"), Some(block), "one block: {e:?}");
        assert_eq!(u64_arg(e, "bytes"), Some(SIZE), "{e:?}");
        assert_eq!(u64_arg(e, "memory_type"), Some(0x30), "{e:?}");
    }
    // Fresh, then reused; each reservation names its buffer.
    assert_eq!(u64_arg(memory[1], "reused"), Some(0));
    assert_eq!(u64_arg(memory[4], "reused"), Some(1));
    for (k, i) in [(0, 1), (0, 2), (1, 4), (1, 5)] {
        assert_eq!(
            u64_arg(memory[i], "allocation"),
            Some(ids[k]),
            "{:?}",
            memory[i]
        );
    }
    // The pool's state after each: (bytes held by buffers, idle bytes,
    // buffers, blocks).
    let state = |e: &Event| {
        [
            "pool_reserved",
            "pool_free",
            "pool_reservations",
            "pool_slabs",
        ]
        .map(|k| u64_arg(e, k).unwrap_or_else(|| panic!("no {k}: {e:?}")))
    };
    let held = state(memory[0]);
    let [bytes, idle, buffers, blocks] = held;
    assert!(
        bytes >= SIZE && buffers >= 1 && blocks >= buffers,
        "{held:?}"
    );
    let released = [bytes - SIZE, idle + SIZE, buffers - 1, blocks];
    let expected = [held, held, held, released, held, held, released];
    let got: Vec<[u64; 4]> = memory.iter().map(|e| state(e)).collect();
    assert_eq!(got, expected, "{memory:#?}");
    // The queue's allocations and releases name the same buffers.
    let queue_ids: Vec<(String, Option<u64>)> = recorded
        .events
        .iter()
        .filter(|e| e.cat == "queue" && (e.name == "alloca" || e.name == "dealloca"))
        .map(|e| (e.name.clone(), u64_arg(e, "allocation")))
        .collect();
    for id in &ids {
        for op in ["alloca", "dealloca"] {
            assert!(
                queue_ids.contains(&(op.to_string(), Some(*id))),
                "{op} of {id}: {queue_ids:?}"
            );
        }
    }
}
