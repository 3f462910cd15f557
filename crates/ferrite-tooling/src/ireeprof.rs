//! `.ireeprof` bundles in upstream IREE 3.13's HAL profile format (file
//! format 1.6), written from a recording of `ferrite_base::trace` so that
//! the pinned `iree-profile` (summary, dispatch, queue, command, memory,
//! export) and `iree-profile-render` read them.
//!
//! The layout is upstream's, as its profile file and schema headers define
//! it (facts, not code): a 24-byte file header (magic `IRPF`, version,
//! header length, flags, logical file length), then records, each a
//! 104-byte little-endian record header followed by a content-type string,
//! a name string and a payload. A session-begin record, one chunk record
//! per content type (devices, queues, executables, executable functions,
//! queue events, host execution events, memory events), and a session-end
//! record (plus command buffers and their operations when the recording
//! described any). Chunk payloads are packed arrays of fixed-size records that
//! start with their own length.
//!
//! What Ferrite's CPU devices record maps onto upstream's families:
//! - `queue-events`: each queue operation (submission order, bytes,
//!   operations).
//! - `host-execution`: each queue operation's run on the host, and each
//!   dispatch with its workgroup counts, tiles and time in tiles (upstream's
//!   CPU devices report dispatches this way too).
//! - `dispatch-events`: upstream's CPU devices refuse it; Ferrite records
//!   every dispatch (with its tiles on `local-task`), written as host
//!   execution events, which is how `iree-profile dispatch` reads CPU
//!   dispatch timings.
//! - `memory-events`: queue allocations and releases, each with an
//!   allocation id that pairs a release with its allocation (the
//!   recording names allocations by address, which a later allocation may
//!   reuse once released; ids are given in time order); and what the queue
//!   pool did for them (`ferrite_hal::allocator`'s pool events): a fresh
//!   block from the host (slab acquire), the block taken for an allocation
//!   (pool reserve, its result upstream's `OK` when a released block was
//!   reused and `OK_FRESH` for a fresh one), the block becoming the buffer
//!   (pool materialize), the allocation's block going back (pool release)
//!   and blocks returned to the host (slab release), each with the pool's
//!   state after it (bytes reserved, free, committed; reservations; blocks).
//!   A reservation has the allocation id of the queue allocation it served.
//!
//! Command buffers: the recording describes each command buffer the first
//! time it executes ([`ferrite_hal::command_trace`]); the bundle writes
//! upstream's command-buffer and command-operation records for them, and
//! execute events and the dispatches inside them name their command
//! buffer (dispatches also the index of their command: recorded on
//! `local-task`, found on `local-sync` by walking the command buffer's
//! dispatches in order, as that device runs them).
//!
//! Times are the recording's clock (nanoseconds since the process's trace
//! epoch), which upstream's tools only compare with each other.
//!
//! `cuda` times its queue operations and kernels on the GPU
//! (`ferrite_hal_cuda`'s `profile` module) and puts those times on the
//! recording's clock; its dispatch spans carry `device_time`, and are
//! written as upstream's device-timestamped dispatch events (ticks: those
//! nanoseconds) with the device's `clock` samples as clock correlation
//! records, so `iree-profile dispatch` counts them as device dispatches
//! and fits the device clock to the host's (written for `dispatch-events`).
//! Its queue operations, timed on the GPU too, are upstream's queue device
//! events (`device-queue-events`, with the same clock correlations), and
//! then not host execution events; without that family they stay queue and
//! host execution events.
//!
//! `device-queue-events` on a CPU device (which upstream's CPU devices
//! refuse): a CPU device's queue work runs on host threads, so its device
//! clock is the host clock; each queue operation's run is written as a
//! queue device event with host nanoseconds as ticks, and the device gets
//! two exact clock samples (tick = host time) at the recording's ends, so
//! the tools fit one nanosecond per tick.

use ferrite_base::trace::{Arg, Event, Phase, Trace};
use ferrite_base::{bail, Result};
use std::collections::BTreeMap;

/// `IRPF`, little-endian.
const MAGIC: u32 = 0x4650_5249;
const VERSION_MAJOR: u16 = 1;
const VERSION_MINOR: u16 = 6;
const FILE_HEADER_LEN: u32 = 24;
const RECORD_HEADER_LEN: u32 = 104;

const RECORD_SESSION_BEGIN: u16 = 1;
const RECORD_CHUNK: u16 = 2;
const RECORD_SESSION_END: u16 = 3;

const CT_SESSION: &str = "application/vnd.iree.hal.profile.session";
const CT_DEVICES: &str = "application/vnd.iree.hal.profile.devices";
const CT_QUEUES: &str = "application/vnd.iree.hal.profile.queues";
const CT_EXECUTABLES: &str = "application/vnd.iree.hal.profile.executables";
const CT_FUNCTIONS: &str = "application/vnd.iree.hal.profile.executable-functions";
const CT_COMMAND_BUFFERS: &str = "application/vnd.iree.hal.profile.command-buffers";
const CT_COMMAND_OPERATIONS: &str = "application/vnd.iree.hal.profile.command-operations";
const CT_QUEUE_EVENTS: &str = "application/vnd.iree.hal.profile.queue-events";
const CT_HOST_EXECUTION: &str = "application/vnd.iree.hal.profile.host-execution-events";
const CT_CLOCK_CORRELATIONS: &str = "application/vnd.iree.hal.profile.clock-correlations";
const CT_DISPATCH_EVENTS: &str = "application/vnd.iree.hal.profile.dispatch-events";
const CT_QUEUE_DEVICE_EVENTS: &str = "application/vnd.iree.hal.profile.queue-device-events";

/// Clock correlation flags: the record holds a device tick, and the host
/// time window around its sample.
const CLOCK_FLAG_DEVICE_TICK: u32 = 1;
const CLOCK_FLAG_HOST_CPU_TIMESTAMP: u32 = 1 << 1;
const CLOCK_FLAG_HOST_TIME_BRACKET: u32 = 1 << 3;
/// Dispatch event flag: the dispatch came from a command buffer.
const DISPATCH_FLAG_COMMAND_BUFFER: u32 = 1;
const CT_MEMORY_EVENTS: &str = "application/vnd.iree.hal.profile.memory-events";

/// Queue event types (upstream's numbering).
fn queue_event_type(op: &str) -> u32 {
    match op {
        "barrier" => 1,
        "dispatch" => 2,
        "execute" => 3,
        "copy" => 4,
        "fill" => 5,
        "update" => 6,
        "read" => 7,
        "write" => 8,
        "alloca" => 9,
        "dealloca" => 10,
        _ => 11,
    }
}

/// Command operation types (upstream's numbering; 0: none of upstream's
/// kinds, such as a collective).
fn command_operation_type(op: &str) -> u32 {
    match op {
        "barrier" => 1,
        "dispatch" => 2,
        "fill" => 3,
        "copy" => 4,
        "update" => 5,
        _ => 0,
    }
}

/// Host execution event flag: the work came from a command buffer.
const HOST_EXECUTION_FLAG_COMMAND_BUFFER: u32 = 1;

const MEMORY_SLAB_ACQUIRE: u32 = 1;
const MEMORY_SLAB_RELEASE: u32 = 2;
const MEMORY_POOL_RESERVE: u32 = 3;
const MEMORY_POOL_MATERIALIZE: u32 = 4;
const MEMORY_POOL_RELEASE: u32 = 5;
const MEMORY_QUEUE_ALLOCA: u32 = 7;
const MEMORY_QUEUE_DEALLOCA: u32 = 8;
const MEMORY_FLAG_QUEUE_OPERATION: u32 = 1;
const MEMORY_FLAG_POOL_RESERVATION: u32 = 1 << 3;
const MEMORY_FLAG_POOL_STATS: u32 = 1 << 4;
/// Pool acquire results (upstream's `iree_hal_pool_acquire_result_t`): a
/// block an earlier allocation released, and one never used before.
const POOL_ACQUIRE_OK: u32 = 0;
const POOL_ACQUIRE_OK_FRESH: u32 = 1;
/// `DEVICE_LOCAL | HOST_VISIBLE`-style CPU memory, as upstream's CPU
/// devices report their queue pool.
const CPU_MEMORY_TYPE: u64 = 0x32;

/// A function's metadata: name, workgroup size, constant and binding
/// counts.
type FunctionInfo = (String, [u32; 3], u64, u64);

/// Notes the executable and function a dispatch (or a command buffer's
/// dispatch command) `e` names: executables are numbered from 1 by first
/// use (raw identity -> (id, function count)), and a function's first
/// event gives its name, workgroup size, constant and binding counts. An
/// event without an executable is passed over.
fn note_function(
    executables: &mut BTreeMap<u64, (u64, u64)>,
    functions: &mut BTreeMap<(u64, u64), FunctionInfo>,
    e: &Event,
) {
    let Some(raw) = u64_arg(e, "executable") else {
        return;
    };
    let next = executables.len() as u64 + 1;
    let id = executables
        .entry(raw)
        .or_insert((next, u64_arg(e, "functions").unwrap_or(1)))
        .0;
    let f = u64_arg(e, "function").unwrap_or(0);
    functions.entry((id, f)).or_insert_with(|| {
        (
            e.name.clone(),
            list_arg(e, "workgroup_size").unwrap_or([1, 1, 1]),
            u64_arg(e, "constants").unwrap_or(0),
            u64_arg(e, "bindings").unwrap_or(0),
        )
    });
}

/// The data families of `--device_profiling_mode` Ferrite writes.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Families {
    /// `queue-events`.
    pub queue_events: bool,
    /// `host-execution`.
    pub host_execution: bool,
    /// `dispatch-events` (written as host execution events of dispatches).
    pub dispatch_events: bool,
    /// `memory-events`.
    pub memory_events: bool,
    /// `device-queue-events`: each queue operation's span on its device's
    /// clock (cuda: GPU timestamps; CPU devices: the host clock, which is
    /// theirs).
    pub device_queue_events: bool,
}

impl Families {
    /// Parses upstream's comma-separated mode list; an error naming a
    /// family Ferrite does not record.
    pub fn parse(mode: &str) -> Result<Families> {
        let mut f = Families::default();
        for name in mode.split(',').map(str::trim).filter(|s| !s.is_empty()) {
            match name {
                "queue-events" => f.queue_events = true,
                "host-execution" => f.host_execution = true,
                "dispatch-events" => f.dispatch_events = true,
                "memory-events" => f.memory_events = true,
                "device-queue-events" => f.device_queue_events = true,
                "device-metrics" | "executable-traces" | "counters" => bail!(
                    Unimplemented,
                    "--device_profiling_mode: '{name}' needs device metrics, traces or counters, which Ferrite's devices do not record (recorded: queue-events, host-execution, device-queue-events, dispatch-events, memory-events)"
                ),
                other => bail!(
                    InvalidArgument,
                    "--device_profiling_mode: unknown data family '{other}' (known: queue-events, host-execution, device-queue-events, dispatch-events, memory-events, device-metrics, executable-traces, counters)"
                ),
            }
        }
        if f == Families::default() {
            bail!(
                InvalidArgument,
                "--device_profiling_mode names no data family"
            );
        }
        Ok(f)
    }
}

fn u64_arg(e: &Event, key: &str) -> Option<u64> {
    e.args.iter().find_map(|(k, v)| match v {
        Arg::U64(n) if *k == key => Some(*n),
        _ => None,
    })
}

fn list_arg(e: &Event, key: &str) -> Option<[u32; 3]> {
    e.args.iter().find_map(|(k, v)| match v {
        Arg::List(l) if *k == key && l.len() == 3 => Some([l[0] as u32, l[1] as u32, l[2] as u32]),
        _ => None,
    })
}

fn str_arg<'a>(e: &'a Event, key: &str) -> Option<&'a str> {
    e.args.iter().find_map(|(k, v)| match v {
        Arg::Str(s) if *k == key => Some(s.as_str()),
        _ => None,
    })
}

/// A command buffer as the recording described it: the device ordinal it
/// was described on, mode, categories, queue affinity, command count, and
/// its commands in order (absent where the recording lacks one).
struct CommandBufferInfo<'a> {
    device: u32,
    mode: u64,
    categories: u64,
    queue_affinity: u64,
    commands: Vec<Option<&'a Event>>,
}

fn failed(e: &Event) -> bool {
    e.args.iter().any(|(k, _)| *k == "failed")
}

/// Little-endian field appends.
struct Bytes(Vec<u8>);

impl Bytes {
    fn u16(&mut self, v: u16) -> &mut Self {
        self.0.extend_from_slice(&v.to_le_bytes());
        self
    }
    fn u32(&mut self, v: u32) -> &mut Self {
        self.0.extend_from_slice(&v.to_le_bytes());
        self
    }
    fn u64(&mut self, v: u64) -> &mut Self {
        self.0.extend_from_slice(&v.to_le_bytes());
        self
    }
}

/// Appends one record: its 104-byte header, content type, name, payload.
fn record(out: &mut Vec<u8>, kind: u16, content_type: &str, name: &str, payload: &[u8]) {
    record_of(out, kind, content_type, name, payload, None);
}

/// [`record`] of a chunk that belongs to one device's queue 0 (`device`:
/// its ordinal, which is also its queue's stream id), or spans devices.
fn record_of(
    out: &mut Vec<u8>,
    kind: u16,
    content_type: &str,
    name: &str,
    payload: &[u8],
    device: Option<u32>,
) {
    let total = RECORD_HEADER_LEN as u64 + (content_type.len() + name.len() + payload.len()) as u64;
    let mut h = Bytes(Vec::with_capacity(RECORD_HEADER_LEN as usize));
    h.u64(total)
        .u64(payload.len() as u64)
        .u64(1) // session id
        .u64(device.map_or(0, u64::from)) // stream id
        .u64(0) // event id
        .u64(0) // executable id
        .u64(0) // command buffer id
        .u32(RECORD_HEADER_LEN)
        .u32(content_type.len() as u32)
        .u32(name.len() as u32)
        .u32(device.unwrap_or(u32::MAX)) // physical device ordinal (MAX: all)
        .u32(device.map_or(u32::MAX, |_| 0)) // queue ordinal
        .u32(0) // padding before the 64-bit chunk flags
        .u64(0) // chunk flags
        .u64(0) // dropped records
        .u32(0) // session status code
        .u16(kind)
        .u16(0);
    debug_assert_eq!(h.0.len(), RECORD_HEADER_LEN as usize);
    out.extend_from_slice(&h.0);
    out.extend_from_slice(content_type.as_bytes());
    out.extend_from_slice(name.as_bytes());
    out.extend_from_slice(payload);
}

/// Writes the bundle of `trace` with the `families` asked for.
pub fn bundle(trace: &Trace, families: Families) -> Vec<u8> {
    // Devices: the trace's device tracks, numbered from 0.
    let devices: Vec<(u32, String)> = trace
        .tracks
        .iter()
        .filter(|(t, _)| **t >= 2)
        .map(|(t, n)| (t - 2, n.strip_prefix("device ").unwrap_or(n).to_string()))
        .collect();
    let device_of = |e: &Event| e.track.saturating_sub(2);
    let name = devices
        .iter()
        .map(|(_, n)| n.as_str())
        .collect::<Vec<_>>()
        .join(",");

    // Executables by their recorded identity, numbered from 1 in order of
    // first use; functions seen per executable.
    let mut executables: BTreeMap<u64, (u64, u64)> = BTreeMap::new(); // raw -> (id, function count)
    let mut functions: BTreeMap<(u64, u64), FunctionInfo> = BTreeMap::new();
    let dispatches: Vec<&Event> = trace
        .events
        .iter()
        .filter(|e| e.cat == "dispatch" && e.phase == Phase::Complete)
        .collect();
    for d in &dispatches {
        note_function(&mut executables, &mut functions, d);
    }

    // Command buffers as described (the first description of an id wins;
    // a recording describes each once), and the executables their
    // dispatches name (some may not have run).
    let mut command_buffers: BTreeMap<u64, CommandBufferInfo> = BTreeMap::new();
    for e in &trace.events {
        if e.cat != "command_buffer" {
            continue;
        }
        let Some(id) = u64_arg(e, "command_buffer") else {
            continue;
        };
        let count = u64_arg(e, "commands").unwrap_or(0) as usize;
        command_buffers
            .entry(id)
            .or_insert_with(|| CommandBufferInfo {
                device: device_of(e),
                mode: u64_arg(e, "mode").unwrap_or(0),
                categories: u64_arg(e, "categories").unwrap_or(0),
                queue_affinity: u64_arg(e, "queue_affinity").unwrap_or(u64::MAX),
                // A description claiming more commands than a process could
                // record is not believed.
                commands: vec![None; count.min(1 << 24)],
            });
    }
    for e in &trace.events {
        if e.cat != "command" {
            continue;
        }
        let (Some(id), Some(index)) = (u64_arg(e, "command_buffer"), u64_arg(e, "index")) else {
            continue;
        };
        if let Some(slot) = command_buffers
            .get_mut(&id)
            .and_then(|cb| cb.commands.get_mut(index as usize))
        {
            slot.get_or_insert(e);
        }
        if str_arg(e, "op") == Some("dispatch") {
            note_function(&mut executables, &mut functions, e);
        }
    }
    let executable_id = |raw: Option<u64>| raw.and_then(|r| executables.get(&r)).map_or(0, |x| x.0);

    // Queue operations in time order, each its own submission.
    let mut queue_ops: Vec<&Event> = trace.events.iter().filter(|e| e.cat == "queue").collect();
    queue_ops.sort_by_key(|e| e.ts_ns);
    // The command buffer each operation executes (0: none).
    let command_buffer_of = |e: &Event| {
        if e.name == "execute" {
            u64_arg(e, "command_buffer").unwrap_or(0)
        } else {
            0
        }
    };
    // Operations each queue operation covers: an execute's commands.
    let operations_of = |e: &Event| match e.name.as_str() {
        "execute" => command_buffers
            .get(&command_buffer_of(e))
            .map_or(1, |cb| cb.commands.len() as u64),
        "barrier" => 0,
        _ => 1,
    };
    // The queue pool's events, in time order (recorded as they happen).
    let mut memory_ops: Vec<&Event> = trace.events.iter().filter(|e| e.cat == "memory").collect();
    memory_ops.sort_by_key(|e| e.ts_ns);
    let timeline = memory_timeline(&queue_ops, &memory_ops);
    let (allocation_ids, memory_ids) = lifecycle_ids(&queue_ops, &memory_ops, &timeline);

    let mut out = Vec::new();
    let mut h = Bytes(Vec::new());
    h.u32(MAGIC)
        .u16(VERSION_MAJOR)
        .u16(VERSION_MINOR)
        .u32(FILE_HEADER_LEN)
        .u32(0)
        .u64(0); // patched below
    out.extend_from_slice(&h.0);
    record(&mut out, RECORD_SESSION_BEGIN, CT_SESSION, &name, &[]);

    let mut p = Bytes(Vec::new());
    for (ordinal, _) in &devices {
        p.u32(32).u32(0).u32(*ordinal).u32(1);
        p.0.extend_from_slice(&[0u8; 16]);
    }
    record(&mut out, RECORD_CHUNK, CT_DEVICES, &name, &p.0);

    let mut p = Bytes(Vec::new());
    for (ordinal, _) in &devices {
        p.u32(24).u32(*ordinal).u32(0).u32(0).u64(*ordinal as u64);
    }
    record(&mut out, RECORD_CHUNK, CT_QUEUES, &name, &p.0);

    if !executables.is_empty() {
        let mut p = Bytes(Vec::new());
        let mut by_id: Vec<(u64, u64)> = executables.values().copied().collect();
        by_id.sort();
        for (id, count) in by_id {
            p.u32(40)
                .u32(0)
                .u64(id)
                .u32(count as u32)
                .u32(0)
                .u64(0)
                .u64(0);
        }
        record(&mut out, RECORD_CHUNK, CT_EXECUTABLES, &name, &p.0);
        let mut p = Bytes(Vec::new());
        for ((id, ordinal), (fname, size, constants, bindings)) in &functions {
            p.u32(64 + fname.len() as u32)
                .u32(0)
                .u64(*id)
                .u32(*ordinal as u32)
                .u32(*constants as u32)
                .u32(*bindings as u32)
                .u32(0)
                .u32(size[0])
                .u32(size[1])
                .u32(size[2])
                .u32(fname.len() as u32)
                .u64(0)
                .u64(0);
            p.0.extend_from_slice(fname.as_bytes());
        }
        record(&mut out, RECORD_CHUNK, CT_FUNCTIONS, &name, &p.0);
    }

    if !command_buffers.is_empty() {
        let mut p = Bytes(Vec::new());
        for (id, cb) in &command_buffers {
            p.u32(48)
                .u32(0)
                .u64(*id)
                .u64(cb.mode)
                .u64(cb.categories)
                .u64(cb.queue_affinity)
                .u32(cb.device)
                .u32(0);
        }
        record(&mut out, RECORD_CHUNK, CT_COMMAND_BUFFERS, &name, &p.0);
        let mut p = Bytes(Vec::new());
        for (id, cb) in &command_buffers {
            for (index, c) in cb.commands.iter().enumerate() {
                let Some(c) = c else {
                    continue;
                };
                command_operation(&mut p, *id, index as u32, c, &executable_id);
            }
        }
        record(&mut out, RECORD_CHUNK, CT_COMMAND_OPERATIONS, &name, &p.0);
    }

    // Submission of each queue operation: its place in time order.
    let submission = |i: usize| i as u64 + 1;
    if families.queue_events {
        let mut p = Bytes(Vec::new());
        for (i, e) in queue_ops.iter().enumerate() {
            let ops = operations_of(e);
            let dev = device_of(e);
            p.u32(104)
                .u32(queue_event_type(&e.name))
                .u32(0)
                .u32(0)
                .u64(i as u64 + 1)
                .u64(e.ts_ns)
                .u64(submission(i))
                .u64(command_buffer_of(e))
                .u64(allocation_ids[i])
                .u64(dev as u64)
                .u32(dev)
                .u32(0)
                .u32(0)
                .u32(1)
                .u32(0)
                .u32(ops as u32)
                .u64(u64_arg(e, "bytes").unwrap_or(0))
                .u64(e.ts_ns);
        }
        record(&mut out, RECORD_CHUNK, CT_QUEUE_EVENTS, &name, &p.0);
    }

    // Device-timestamped dispatch events per device (written after the
    // clock correlations, below).
    let mut device_dispatches: BTreeMap<u32, Bytes> = BTreeMap::new();
    if families.host_execution || families.dispatch_events {
        let mut p = Bytes(Vec::new());
        let mut event_id = 0u64;
        // A dispatch belongs to the execute whose span holds it: the last
        // execute of its device that began before it (executes of one
        // queue do not overlap), found by binary search.
        let mut executes: BTreeMap<u32, Vec<(u64, u64, usize)>> = BTreeMap::new();
        for (i, q) in queue_ops.iter().enumerate() {
            if q.name == "execute" && q.phase == Phase::Complete {
                executes
                    .entry(q.track)
                    .or_default()
                    .push((q.ts_ns, q.ts_ns + q.dur_ns, i));
            }
        }
        let execute_of = |d: &Event| {
            let list = executes.get(&d.track)?;
            let at = list.partition_point(|(start, _, _)| *start <= d.ts_ns);
            match at.checked_sub(1).map(|i| list[i]) {
                Some((_, end, i)) if d.ts_ns + d.dur_ns <= end => Some(i),
                _ => None,
            }
        };
        // Each dispatch's execute and command index. Dispatches that did
        // not record their command (local-sync runs commands in order)
        // take the next dispatch command of their execute's command buffer
        // with the same executable and function.
        let mut placed: Vec<(Option<usize>, Option<u32>)> = Vec::with_capacity(dispatches.len());
        let mut by_execute: BTreeMap<usize, Vec<usize>> = BTreeMap::new();
        for (k, d) in dispatches.iter().enumerate() {
            let exec = execute_of(d);
            placed.push((exec, u64_arg(d, "command").map(|c| c as u32)));
            if let (Some(i), None) = placed[k] {
                by_execute.entry(i).or_default().push(k);
            }
        }
        for (exec, mut ks) in by_execute {
            let Some(cb) = command_buffers.get(&command_buffer_of(queue_ops[exec])) else {
                continue;
            };
            ks.sort_by_key(|&k| dispatches[k].ts_ns);
            let mut cursor = 0usize;
            for k in ks {
                let d = dispatches[k];
                let key = (u64_arg(d, "executable"), u64_arg(d, "function"));
                let found = cb.commands[cursor..].iter().position(|c| {
                    c.is_some_and(|c| {
                        str_arg(c, "op") == Some("dispatch")
                            && (u64_arg(c, "executable"), u64_arg(c, "function")) == key
                    })
                });
                if let Some(j) = found {
                    placed[k].1 = Some((cursor + j) as u32);
                    cursor += j + 1;
                }
            }
        }
        if families.host_execution {
            for (i, e) in queue_ops.iter().enumerate() {
                // Work the device timed did not run on the host: with
                // device-queue-events it is a device queue event only.
                if e.phase != Phase::Complete || (families.device_queue_events && device_timed(e)) {
                    continue;
                }
                event_id += 1;
                let cb = command_buffer_of(e);
                host_execution(
                    &mut p,
                    HostExecution {
                        kind: queue_event_type(&e.name),
                        flags: if cb != 0 {
                            HOST_EXECUTION_FLAG_COMMAND_BUFFER
                        } else {
                            0
                        },
                        status: if failed(e) { 13 } else { 0 },
                        event_id,
                        submission: submission(i),
                        command_buffer: cb,
                        executable: 0,
                        allocation: allocation_ids[i],
                        device: device_of(e),
                        command_index: u32::MAX,
                        function: u32::MAX,
                        workgroups: [0; 3],
                        workgroup_size: [0; 3],
                        span: (e.ts_ns, e.ts_ns + e.dur_ns),
                        payload: u64_arg(e, "bytes").unwrap_or(0),
                        tiles: (0, 0),
                        operations: operations_of(e) as u32,
                    },
                );
            }
        }
        // Dispatches timed by the device (cuda) are device events, per
        // device; the others host execution events.
        for (d, (exec, command)) in dispatches.iter().zip(&placed) {
            let cb = exec.map_or(0, |i| command_buffer_of(queue_ops[i]));
            if device_timed(d) {
                if families.dispatch_events {
                    let p = device_dispatches
                        .entry(device_of(d))
                        .or_insert_with(|| Bytes(Vec::new()));
                    let id = p.0.len() as u64 / DISPATCH_EVENT_LEN as u64 + 1;
                    dispatch_event(
                        p,
                        d,
                        id,
                        exec.map_or(0, submission),
                        cb,
                        executable_id(u64_arg(d, "executable")),
                        command.unwrap_or(u32::MAX),
                    );
                }
                continue;
            }
            event_id += 1;
            host_execution(
                &mut p,
                HostExecution {
                    kind: queue_event_type("dispatch"),
                    flags: if cb != 0 {
                        HOST_EXECUTION_FLAG_COMMAND_BUFFER
                    } else {
                        0
                    },
                    status: if failed(d) { 13 } else { 0 },
                    event_id,
                    submission: exec.map_or(0, submission),
                    command_buffer: cb,
                    executable: executable_id(u64_arg(d, "executable")),
                    allocation: 0,
                    device: device_of(d),
                    command_index: command.unwrap_or(u32::MAX),
                    function: u64_arg(d, "function").unwrap_or(0) as u32,
                    workgroups: list_arg(d, "workgroups").unwrap_or([0; 3]),
                    workgroup_size: list_arg(d, "workgroup_size").unwrap_or([1, 1, 1]),
                    span: (d.ts_ns, d.ts_ns + d.dur_ns),
                    payload: 0,
                    tiles: (
                        u64_arg(d, "tiles").unwrap_or(1),
                        u64_arg(d, "tile_ns").unwrap_or(d.dur_ns),
                    ),
                    operations: 1,
                },
            );
        }
        record(&mut out, RECORD_CHUNK, CT_HOST_EXECUTION, &name, &p.0);
    }

    // Queue operations on their device's clock, per device: spans the
    // device timed (cuda), and on devices that do not time their own work
    // (the CPU devices, whose device is the host) the host-clock spans of
    // their run, which is when a CPU device's queue did that work.
    let mut device_queue: BTreeMap<u32, Bytes> = BTreeMap::new();
    if families.device_queue_events {
        for (i, e) in queue_ops.iter().enumerate() {
            if e.phase != Phase::Complete {
                continue;
            }
            let dev = device_of(e);
            let p = device_queue.entry(dev).or_insert_with(|| Bytes(Vec::new()));
            let id = p.0.len() as u64 / QUEUE_DEVICE_EVENT_LEN as u64 + 1;
            p.u32(QUEUE_DEVICE_EVENT_LEN)
                .u32(queue_event_type(&e.name))
                .u32(0) // flags
                .u32(0)
                .u64(id)
                .u64(submission(i))
                .u64(command_buffer_of(e))
                .u64(allocation_ids[i])
                .u64(dev as u64) // stream id: the queue record's
                .u64(u64_arg(e, "bytes").unwrap_or(0))
                .u32(dev)
                .u32(0) // queue ordinal
                .u32(operations_of(e) as u32)
                .u32(0)
                .u64(e.ts_ns)
                .u64(e.ts_ns + e.dur_ns);
        }
    }

    if !device_dispatches.is_empty() || !device_queue.is_empty() {
        // Devices whose device events are on the host clock: those with
        // device queue events and no clock samples of their own.
        let sampled: std::collections::BTreeSet<u32> = trace
            .events
            .iter()
            .filter(|e| e.cat == "clock")
            .map(device_of)
            .collect();
        let host_clocked: Vec<u32> = device_queue
            .keys()
            .copied()
            .filter(|d| !sampled.contains(d))
            .collect();
        clock_correlations(&mut out, trace, &host_clocked, &name);
    }
    for (device, p) in device_dispatches {
        record_of(
            &mut out,
            RECORD_CHUNK,
            CT_DISPATCH_EVENTS,
            &name,
            &p.0,
            Some(device),
        );
    }
    for (device, p) in device_queue {
        record_of(
            &mut out,
            RECORD_CHUNK,
            CT_QUEUE_DEVICE_EVENTS,
            &name,
            &p.0,
            Some(device),
        );
    }

    if families.memory_events {
        // The queue operations that opened and closed each allocation id,
        // so the pool events serving them carry their submission.
        let mut alloca_of: BTreeMap<u64, u64> = BTreeMap::new();
        let mut dealloca_of: BTreeMap<u64, u64> = BTreeMap::new();
        for (i, e) in queue_ops.iter().enumerate() {
            match e.name.as_str() {
                "alloca" => alloca_of.insert(allocation_ids[i], submission(i)),
                "dealloca" => dealloca_of.insert(allocation_ids[i], submission(i)),
                _ => None,
            };
        }
        // Each device's memory type: its pool events say (cuda's device
        // memory); CPU devices' is host memory the device uses.
        let mut memory_type_of: BTreeMap<u32, u64> = BTreeMap::new();
        for e in &memory_ops {
            if let Some(t) = u64_arg(e, "memory_type") {
                memory_type_of.entry(device_of(e)).or_insert(t);
            }
        }
        let memory_type = |device: u32| {
            memory_type_of
                .get(&device)
                .copied()
                .unwrap_or(CPU_MEMORY_TYPE)
        };
        let mut p = Bytes(Vec::new());
        for (n, &(is_queue, i)) in timeline.iter().enumerate() {
            let event_id = n as u64 + 1;
            if is_queue {
                let e = queue_ops[i];
                let dev = device_of(e);
                memory_event(
                    &mut p,
                    MemoryEvent {
                        kind: if e.name == "alloca" {
                            MEMORY_QUEUE_ALLOCA
                        } else {
                            MEMORY_QUEUE_DEALLOCA
                        },
                        memory_type: memory_type(dev),
                        flags: MEMORY_FLAG_QUEUE_OPERATION,
                        result: u32::MAX,
                        event_id,
                        ts_ns: e.ts_ns,
                        allocation: allocation_ids[i],
                        device: dev,
                        backing: u64_arg(e, "allocation").unwrap_or(0),
                        submission: submission(i),
                        length: u64_arg(e, "bytes").unwrap_or(0),
                        pool_stats: None,
                    },
                );
                continue;
            }
            let e = memory_ops[i];
            let id = memory_ids[i];
            let (kind, queue_op) = match e.name.as_str() {
                "slab_acquire" => (MEMORY_SLAB_ACQUIRE, None),
                "slab_release" => (MEMORY_SLAB_RELEASE, None),
                "pool_reserve" => (MEMORY_POOL_RESERVE, alloca_of.get(&id)),
                "pool_materialize" => (MEMORY_POOL_MATERIALIZE, alloca_of.get(&id)),
                _ => (MEMORY_POOL_RELEASE, dealloca_of.get(&id)),
            };
            let mut flags = MEMORY_FLAG_POOL_STATS;
            if kind != MEMORY_SLAB_ACQUIRE && kind != MEMORY_SLAB_RELEASE {
                flags |= MEMORY_FLAG_POOL_RESERVATION;
            }
            if queue_op.is_some() {
                flags |= MEMORY_FLAG_QUEUE_OPERATION;
            }
            let result = match (kind, u64_arg(e, "reused")) {
                (MEMORY_POOL_RESERVE, Some(0)) => POOL_ACQUIRE_OK_FRESH,
                (MEMORY_POOL_RESERVE, Some(_)) => POOL_ACQUIRE_OK,
                _ => u32::MAX,
            };
            let arg = |key| u64_arg(e, key).unwrap_or(0);
            memory_event(
                &mut p,
                MemoryEvent {
                    kind,
                    memory_type: memory_type(device_of(e)),
                    flags,
                    result,
                    event_id,
                    ts_ns: e.ts_ns,
                    allocation: id,
                    device: device_of(e),
                    backing: arg("backing"),
                    submission: queue_op.copied().unwrap_or(0),
                    length: arg("bytes"),
                    pool_stats: Some([
                        arg("pool_reserved"),
                        arg("pool_free"),
                        arg("pool_reservations"),
                        arg("pool_slabs"),
                    ]),
                },
            );
        }
        record(&mut out, RECORD_CHUNK, CT_MEMORY_EVENTS, &name, &p.0);
    }

    record(&mut out, RECORD_SESSION_END, CT_SESSION, &name, &[]);
    let len = out.len() as u64;
    out[16..24].copy_from_slice(&len.to_le_bytes());
    out
}

/// Queue allocations and releases (`true`, index into `queue_ops`) and
/// pool events (`false`, index into `memory`) in one time order; on equal
/// times pool events first (a pool reserves before its `alloca` is noted).
fn memory_timeline(queue_ops: &[&Event], memory: &[&Event]) -> Vec<(bool, usize)> {
    let mut order: Vec<(u64, bool, usize)> = memory
        .iter()
        .enumerate()
        .map(|(i, e)| (e.ts_ns, false, i))
        .chain(
            queue_ops
                .iter()
                .enumerate()
                .filter(|(_, e)| matches!(e.name.as_str(), "alloca" | "dealloca"))
                .map(|(i, e)| (e.ts_ns, true, i)),
        )
        .collect();
    order.sort();
    order.into_iter().map(|(_, q, i)| (q, i)).collect()
}

/// The allocation id of each queue operation (0 for those that are not
/// allocations or releases) and of each pool event, walking `timeline`
/// ([`memory_timeline`]).
///
/// A queue allocation opens one, in time order; a release closes the open
/// one of the same address, or gets its own when the allocation was made
/// before the recording began. Addresses are reused once released, ids
/// never. A pool reservation opens an id that its block's materialize and
/// release share and that the queue allocation it served (same allocation
/// address, next in time) takes over; a fresh block (slab) has its own id
/// from its acquisition to its return to the host.
fn lifecycle_ids(
    queue_ops: &[&Event],
    memory: &[&Event],
    timeline: &[(bool, usize)],
) -> (Vec<u64>, Vec<u64>) {
    let mut queue_ids = vec![0u64; queue_ops.len()];
    let mut memory_ids = vec![0u64; memory.len()];
    let mut new_id = {
        let mut next = 0u64;
        move || {
            next += 1;
            next
        }
    };
    // Open queue allocations and reservations not yet taken over by their
    // alloca, by allocation address; open reservations and slabs by block.
    let mut open: BTreeMap<u64, u64> = BTreeMap::new();
    let mut reserved: BTreeMap<u64, u64> = BTreeMap::new();
    // Open queue allocations no reservation has joined yet: a device that
    // times its queue operations on the GPU (cuda) may date an alloca
    // before the host reserved its block.
    let mut unreserved: BTreeMap<u64, u64> = BTreeMap::new();
    let mut reservations: BTreeMap<u64, u64> = BTreeMap::new();
    let mut slabs: BTreeMap<u64, u64> = BTreeMap::new();
    for &(is_queue, i) in timeline {
        if is_queue {
            let e = queue_ops[i];
            let Some(key) = u64_arg(e, "allocation") else {
                continue;
            };
            queue_ids[i] = match e.name.as_str() {
                "alloca" => {
                    let id = match reserved.remove(&key) {
                        Some(id) => id,
                        None => {
                            let id = new_id();
                            unreserved.insert(key, id);
                            id
                        }
                    };
                    open.insert(key, id);
                    id
                }
                "dealloca" => {
                    unreserved.remove(&key);
                    open.remove(&key).unwrap_or_else(&mut new_id)
                }
                _ => 0,
            };
            continue;
        }
        let e = memory[i];
        let Some(block) = u64_arg(e, "backing") else {
            continue;
        };
        memory_ids[i] = match e.name.as_str() {
            "slab_acquire" => {
                let id = new_id();
                slabs.insert(block, id);
                id
            }
            "slab_release" => slabs.remove(&block).unwrap_or_else(&mut new_id),
            "pool_reserve" => {
                let allocation = u64_arg(e, "allocation");
                let id = match allocation.and_then(|a| unreserved.remove(&a)) {
                    Some(id) => id,
                    None => {
                        let id = new_id();
                        if let Some(a) = allocation {
                            reserved.insert(a, id);
                        }
                        id
                    }
                };
                reservations.insert(block, id);
                id
            }
            "pool_materialize" => reservations
                .get(&block)
                .copied()
                .unwrap_or_else(&mut new_id),
            "pool_release" => {
                let id = reservations.remove(&block).unwrap_or_else(&mut new_id);
                // A reservation no alloca took over (an allocation made
                // from the pool directly) ends here too.
                reserved.retain(|_, v| *v != id);
                id
            }
            _ => 0,
        };
    }
    (queue_ids, memory_ids)
}

/// The fields of one memory event.
struct MemoryEvent {
    kind: u32,
    /// The memory's type bits (upstream's numbering, which Ferrite's
    /// `MemoryType` shares).
    memory_type: u64,
    flags: u32,
    result: u32,
    event_id: u64,
    ts_ns: u64,
    allocation: u64,
    device: u32,
    backing: u64,
    submission: u64,
    length: u64,
    /// The pool's state after the event: bytes reserved, bytes free,
    /// reservations, blocks (committed bytes are reserved plus free).
    pool_stats: Option<[u64; 4]>,
}

/// One memory event (160 bytes, upstream's layout). The pool is the
/// device's queue pool (id: device ordinal + 1).
fn memory_event(p: &mut Bytes, m: MemoryEvent) {
    let [reserved, free, reservations, slabs] = m.pool_stats.unwrap_or_default();
    p.u32(160)
        .u32(m.kind)
        .u32(m.flags)
        .u32(m.result)
        .u64(m.event_id)
        .u64(m.ts_ns)
        .u64(m.allocation)
        .u64(m.device as u64 + 1)
        .u64(m.backing)
        .u64(m.submission)
        .u32(m.device)
        .u32(0)
        .u32(0) // frontier entries
        .u32(0)
        .u64(m.memory_type)
        .u64(0) // buffer usage
        .u64(0) // offset in the block
        .u64(m.length)
        .u64(0) // alignment
        .u64(reserved)
        .u64(free)
        .u64(reserved + free)
        .u64(0) // budget: the pool caps what it keeps, not what it hands out
        .u32(reservations as u32)
        .u32(slabs as u32);
}

/// One command-operation record (120 bytes, upstream's layout) for the
/// recorded command `c`, index `index` of command buffer `id`.
fn command_operation(
    p: &mut Bytes,
    id: u64,
    index: u32,
    c: &Event,
    executable_id: &dyn Fn(Option<u64>) -> u64,
) {
    let op = str_arg(c, "op").unwrap_or("");
    let dispatch = op == "dispatch";
    let slot = |key: &str| u64_arg(c, key).map_or(u32::MAX, |s| s as u32);
    p.u32(120)
        .u32(command_operation_type(op))
        .u32(u64_arg(c, "flags").unwrap_or(0) as u32)
        .u32(index)
        .u64(id)
        .u32(u32::MAX) // block ordinal: Ferrite's commands are a flat list
        .u32(u32::MAX)
        .u64(if dispatch {
            executable_id(u64_arg(c, "executable"))
        } else {
            0
        })
        .u32(if dispatch {
            u64_arg(c, "function").unwrap_or(0) as u32
        } else {
            u32::MAX
        })
        .u32(u64_arg(c, "bindings").unwrap_or(0) as u32);
    for w in list_arg(c, "workgroups").unwrap_or([0; 3]) {
        p.u32(w);
    }
    for w in list_arg(c, "workgroup_size").unwrap_or([0; 3]) {
        p.u32(w);
    }
    p.u64(u64_arg(c, "source_offset").unwrap_or(0))
        .u64(u64_arg(c, "target_offset").unwrap_or(0))
        .u64(u64_arg(c, "length").unwrap_or(0))
        .u32(slot("source_slot"))
        .u32(slot("target_slot"))
        .u32(u32::MAX) // branch targets: none
        .u32(u32::MAX)
        .u32(0)
        .u32(0); // padding to the record's 8-byte alignment
}

/// Whether a dispatch span was timed by its device (`device_time`): its
/// times are device timestamps put on the recording's clock.
fn device_timed(e: &Event) -> bool {
    u64_arg(e, "device_time").is_some()
}

/// The length of upstream's dispatch event record.
const DISPATCH_EVENT_LEN: u32 = 88;
/// The length of upstream's queue device event record.
const QUEUE_DEVICE_EVENT_LEN: u32 = 96;

/// One device-timestamped dispatch event (88 bytes, upstream's layout).
/// Ferrite's device ticks are nanoseconds of the recording's clock (the
/// device converted them, see [`clock_correlations`]).
fn dispatch_event(
    p: &mut Bytes,
    d: &Event,
    event_id: u64,
    submission: u64,
    command_buffer: u64,
    executable: u64,
    command_index: u32,
) {
    p.u32(DISPATCH_EVENT_LEN)
        .u32(if command_buffer != 0 {
            DISPATCH_FLAG_COMMAND_BUFFER
        } else {
            0
        })
        .u64(event_id)
        .u64(submission)
        .u64(command_buffer)
        .u64(executable)
        .u32(command_index)
        .u32(u64_arg(d, "function").unwrap_or(0) as u32);
    for w in list_arg(d, "workgroups").unwrap_or([0; 3]) {
        p.u32(w);
    }
    for w in list_arg(d, "workgroup_size").unwrap_or([1, 1, 1]) {
        p.u32(w);
    }
    p.u64(d.ts_ns).u64(d.ts_ns + d.dur_ns);
}

/// The clock correlation records (72 bytes each, upstream's layout) of
/// the recording's `clock` samples: a device recorded an event and waited
/// for it between two host clock reads (the bracket, whose midpoint is
/// given as the host timestamp of the sample); its tick is the event's
/// device time on the recording's clock, which is how the device times
/// its spans, so the samples show how well device and host clocks agree
/// (upstream's tools fit ticks to host time from them).
///
/// Devices in `host_clocked` time their device events on the host clock
/// itself (the CPU devices): each gets two exact samples, tick equal to
/// host time, at the start and the end of the recording's events, from
/// which the tools fit one nanosecond per tick.
fn clock_correlations(out: &mut Vec<u8>, trace: &Trace, host_clocked: &[u32], name: &str) {
    let mut p = Bytes(Vec::new());
    let mut sample = 0u64;
    let mut write = |p: &mut Bytes, device: u32, tick: u64, begin: u64, end: u64| {
        sample += 1;
        p.u32(72)
            .u32(
                CLOCK_FLAG_DEVICE_TICK
                    | CLOCK_FLAG_HOST_CPU_TIMESTAMP
                    | CLOCK_FLAG_HOST_TIME_BRACKET,
            )
            .u32(device)
            .u32(0)
            .u64(sample)
            .u64(tick)
            .u64(begin + end.saturating_sub(begin) / 2)
            .u64(0) // host system timestamp: none
            .u64(0) // its frequency
            .u64(begin)
            .u64(end);
    };
    for e in trace.events.iter().filter(|e| e.cat == "clock") {
        let (Some(tick), Some(begin), Some(end)) = (
            u64_arg(e, "device_ns"),
            u64_arg(e, "begin_ns"),
            u64_arg(e, "end_ns"),
        ) else {
            continue;
        };
        write(&mut p, e.track.saturating_sub(2), tick, begin, end);
    }
    let first = trace.events.iter().map(|e| e.ts_ns).min();
    let last = trace.events.iter().map(|e| e.ts_ns + e.dur_ns).max();
    if let (Some(first), Some(last)) = (first, last) {
        for &device in host_clocked {
            write(&mut p, device, first, first, first);
            write(&mut p, device, last, last, last);
        }
    }
    record(out, RECORD_CHUNK, CT_CLOCK_CORRELATIONS, name, &p.0);
}

/// The fields of one host execution event.
struct HostExecution {
    kind: u32,
    flags: u32,
    status: u32,
    event_id: u64,
    submission: u64,
    command_buffer: u64,
    executable: u64,
    allocation: u64,
    device: u32,
    command_index: u32,
    function: u32,
    workgroups: [u32; 3],
    workgroup_size: [u32; 3],
    span: (u64, u64),
    payload: u64,
    tiles: (u64, u64),
    operations: u32,
}

/// One host execution event (152 bytes, upstream's layout).
fn host_execution(p: &mut Bytes, h: HostExecution) {
    p.u32(152)
        .u32(h.kind)
        .u32(h.flags)
        .u32(h.status)
        .u64(h.event_id)
        .u64(h.submission)
        .u64(h.command_buffer)
        .u64(h.executable)
        .u64(h.allocation)
        .u64(h.device as u64)
        .u32(h.device)
        .u32(0)
        .u32(h.command_index)
        .u32(h.function)
        .u32(h.workgroups[0])
        .u32(h.workgroups[1])
        .u32(h.workgroups[2])
        .u32(h.workgroup_size[0])
        .u32(h.workgroup_size[1])
        .u32(h.workgroup_size[2])
        .u64(h.span.0)
        .u64(h.span.1)
        .u64(h.payload)
        .u64(h.tiles.0)
        .u64(h.tiles.1)
        .u32(h.operations)
        .u32(0);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn families_parse_and_refuse_what_is_not_recorded() {
        let f = Families::parse("queue-events,host-execution").unwrap();
        assert!(f.queue_events && f.host_execution && !f.memory_events);
        let f = Families::parse("device-queue-events").unwrap();
        assert!(f.device_queue_events && !f.queue_events);
        let e = Families::parse("device-metrics").unwrap_err();
        assert!(e.to_string().contains("'device-metrics'"), "{e}");
        let e = Families::parse("bogus").unwrap_err();
        assert!(e.to_string().contains("unknown data family 'bogus'"), "{e}");
        assert!(Families::parse("").is_err());
    }

    fn queue_op(name: &str, allocation: Option<u64>) -> Event {
        Event {
            phase: Phase::Complete,
            cat: "queue",
            name: name.to_string(),
            ts_ns: 0,
            dur_ns: 0,
            track: 2,
            thread: 1,
            args: allocation
                .map(|a| ("allocation", Arg::U64(a)))
                .into_iter()
                .collect(),
        }
    }

    #[test]
    fn releases_pair_with_their_allocation_across_address_reuse() {
        // X allocated, Y allocated, X released, X's address reused by a new
        // allocation and released, Z released (allocated before the
        // recording), an execute between.
        let ops = [
            queue_op("alloca", Some(0x10)),
            queue_op("alloca", Some(0x20)),
            queue_op("dealloca", Some(0x10)),
            queue_op("execute", None),
            queue_op("alloca", Some(0x10)),
            queue_op("dealloca", Some(0x10)),
            queue_op("dealloca", Some(0x30)),
            queue_op("dealloca", Some(0x20)),
        ];
        let refs: Vec<&Event> = ops.iter().collect();
        let timeline = memory_timeline(&refs, &[]);
        assert_eq!(
            lifecycle_ids(&refs, &[], &timeline).0,
            [1, 2, 1, 0, 3, 3, 4, 2]
        );
    }

    fn at(mut e: Event, ts_ns: u64) -> Event {
        e.ts_ns = ts_ns;
        e
    }

    fn pool_event(name: &str, backing: u64, allocation: Option<u64>, ts_ns: u64) -> Event {
        let mut args = vec![("backing", Arg::U64(backing))];
        args.extend(allocation.map(|a| ("allocation", Arg::U64(a))));
        Event {
            phase: Phase::Instant,
            cat: "memory",
            name: name.to_string(),
            ts_ns,
            dur_ns: 0,
            track: 2,
            thread: 1,
            args,
        }
    }

    #[test]
    fn pool_events_share_the_id_of_the_allocation_they_serve() {
        // Allocation 0xA on a fresh block 0xB0, released; then allocation
        // 0xA again (its address reused) on the same block, reused;
        // allocation 0xC made from the pool with no alloca, released;
        // the block returned to the host by a trim.
        let queue = [
            at(queue_op("alloca", Some(0xA)), 4),
            at(queue_op("dealloca", Some(0xA)), 5),
            at(queue_op("alloca", Some(0xA)), 9),
        ];
        let memory = [
            pool_event("slab_acquire", 0xB0, None, 1),
            pool_event("pool_reserve", 0xB0, Some(0xA), 2),
            pool_event("pool_materialize", 0xB0, Some(0xA), 3),
            pool_event("pool_release", 0xB0, None, 6),
            pool_event("pool_reserve", 0xB0, Some(0xA), 7),
            pool_event("pool_materialize", 0xB0, Some(0xA), 8),
            pool_event("pool_release", 0xB0, None, 10),
            pool_event("pool_reserve", 0xB0, Some(0xC), 11),
            pool_event("pool_release", 0xB0, None, 12),
            pool_event("slab_release", 0xB0, None, 13),
        ];
        let q: Vec<&Event> = queue.iter().collect();
        let m: Vec<&Event> = memory.iter().collect();
        let timeline = memory_timeline(&q, &m);
        let (queue_ids, memory_ids) = lifecycle_ids(&q, &m, &timeline);
        assert_eq!(queue_ids, [2, 2, 3]);
        assert_eq!(memory_ids, [1, 2, 2, 2, 3, 3, 3, 4, 4, 1]);
        // Pool events on equal times come first.
        let tied = [at(queue_op("alloca", Some(0xA)), 2)];
        let q: Vec<&Event> = tied.iter().collect();
        let timeline = memory_timeline(&q, &m[..2]);
        assert_eq!(timeline, [(false, 0), (false, 1), (true, 0)]);
        assert_eq!(lifecycle_ids(&q, &m[..2], &timeline).0, [2]);
    }

    #[test]
    fn a_reservation_dated_after_its_alloca_joins_it() {
        // cuda: the alloca is dated by the GPU (it reached the operation
        // while the host was still taking the block), the reservation by
        // the host; a second allocation in the usual order; the first
        // released.
        let queue = [
            at(queue_op("alloca", Some(0xA)), 1),
            at(queue_op("alloca", Some(0xB)), 5),
            at(queue_op("dealloca", Some(0xA)), 7),
        ];
        let memory = [
            pool_event("pool_reserve", 0xB0, Some(0xA), 2),
            pool_event("pool_materialize", 0xB0, Some(0xA), 3),
            pool_event("pool_reserve", 0xB1, Some(0xB), 4),
            pool_event("pool_release", 0xB0, None, 8),
        ];
        let q: Vec<&Event> = queue.iter().collect();
        let m: Vec<&Event> = memory.iter().collect();
        let timeline = memory_timeline(&q, &m);
        let (queue_ids, memory_ids) = lifecycle_ids(&q, &m, &timeline);
        assert_eq!(queue_ids, [1, 2, 1]);
        assert_eq!(memory_ids, [1, 1, 2, 1]);
    }

    #[test]
    fn empty_recording_is_a_well_formed_bundle() {
        let b = bundle(&Trace::default(), Families::parse("queue-events").unwrap());
        assert_eq!(&b[..4], b"IRPF");
        assert_eq!(
            u64::from_le_bytes(b[16..24].try_into().unwrap()),
            b.len() as u64
        );
        // Records chain exactly to the end, the first a session begin.
        let mut off = 24usize;
        let mut kinds = Vec::new();
        while off < b.len() {
            let len = u64::from_le_bytes(b[off..off + 8].try_into().unwrap()) as usize;
            kinds.push(u16::from_le_bytes(
                b[off + 100..off + 102].try_into().unwrap(),
            ));
            off += len;
        }
        assert_eq!(off, b.len());
        assert_eq!(kinds.first(), Some(&RECORD_SESSION_BEGIN));
        assert_eq!(kinds.last(), Some(&RECORD_SESSION_END));
    }
}
