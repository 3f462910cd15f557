//! Device timestamps in the execution trace (`ferrite_base::trace`), from
//! which `--trace` JSON files and `.ireeprof` bundles are written.
//!
//! While a trace is recorded, the device brackets each queue operation and
//! each kernel it launches on a stream with two timing events
//! (`CU_EVENT_DEFAULT`, taken from a pool: none is created per launch once
//! the pool is warm) and, when the operation is reported (the stream has
//! passed them), reads their times with `cuEventElapsedTime` against a
//! *reference* event whose host time is known, and records spans on the
//! device's track (`cuda://N`) with device start and end times on the
//! trace's host clock: `queue` spans (execute, alloca, dealloca, fill,
//! update, copy, barrier) and, inside an execute, one `dispatch` span per
//! kernel named by its export, with its workgroup counts, command index
//! and executable. They are the events the CPU devices record, so the
//! bundle writer needs no device-specific path.
//!
//! A reference is made by recording an event on an idle stream of the
//! device's own and waiting for it: its GPU time lies between the host
//! clock before the record and after the wait, and the midpoint is taken
//! (the narrowest of a few tries: a few microseconds of uncertainty, the
//! same for every span of the reference, so spans keep their order and
//! durations exactly). A reference serves for one second of host time and
//! one recording at most: `cuEventElapsedTime` returns milliseconds as an
//! `f32`, whose resolution stays below 0.1 microsecond within a second,
//! and the two clocks drift apart slowly.
//!
//! CUDA graphs cannot be timed kernel by kernel, so while a trace is
//! recorded command buffers are replayed on the stream (module `graph`),
//! as with `FERRITE_CUDA_KERNEL_TIMES`: independent kernels of a stage run
//! one after another, and the times are those of the replayed kernels,
//! not of the graph the program would otherwise launch.
//!
//! Each reference is also recorded as a `clock` sample (device time equal
//! to the host time taken, and the host window), and so is, at most every
//! millisecond while reports come, an event recorded on the idle stream
//! (its device time measured from the reference, its own host window):
//! bundles write them as upstream's clock correlation records, from which
//! upstream's tools fit the device clock to the host's. Spans read from
//! the device carry `device_time`, and bundles write such dispatches as
//! upstream's device-timestamped dispatch events.
//!
//! Spans are resolved when the operation is reported, which may be after
//! the recording was asked to stop: each timing is
//! [`trace::Pending`] work of its recording, and the device is a
//! [`trace::Flush`] recorder ([`flush_on_stop`]) that reports everything
//! its stream holds when the recording stops, so every operation enqueued
//! while recording is in it. Work still kept on the host (waiting for a
//! semaphore the host or another device signals) when the recording stops
//! runs untimed.
//!
//! The device's block pool (idle device blocks kept for reuse,
//! [`crate::memory::SpareBlocks`], behind device-local allocations) records
//! the same `memory` events as the CPU devices' queue pool
//! (`ferrite_hal::allocator`'s pool events): `slab_acquire` (a fresh block
//! from the driver), `pool_reserve` (`reused` 1 for an idle block, 0 for
//! the fresh one), `pool_materialize`, `pool_release` (the buffer's block
//! dropped: kept idle, or freed), `slab_release` (a block back to the
//! driver: an exported one, the oldest idle ones the pool forgets to make
//! room, all idle ones before retrying an allocation that ran out of
//! memory), each with the pool's state after it ([`pool_acquired`],
//! [`pool_released`], [`pool_returned`]). The pool's counts are kept
//! whether or not a trace is recorded (a lock and a few additions per
//! device allocation and release; a map entry per block made or freed by
//! the driver, beside a driver call each).
//!
//! Off, the cost is one relaxed atomic load per queue operation and per
//! launch ([`ferrite_base::trace::enabled`]).

use crate::context::CudaContext;
use crate::ffi::{self, Api, CUevent, CUstream};
use ferrite_base::trace::{self, Arg, Event, Phase};
use ferrite_base::Result;
use parking_lot::Mutex;
use std::sync::{Arc, Weak};

/// How long (host nanoseconds) a reference serves before a new one is
/// made.
const RECALIBRATE_NS: u64 = 1_000_000_000;

/// While recording, a clock sample (see [`DeviceClock::sample_if_due`]) is
/// taken when reports come at least this long (host nanoseconds) after
/// the last one.
const SAMPLE_EVERY_NS: u64 = 1_000_000;

/// Calibration tries per reference (the narrowest window wins).
const CALIBRATION_TRIES: usize = 3;

/// Trace thread numbers from here on are CUDA devices' stream lanes (one
/// per device ordinal; real threads are numbered from 1 upward and the
/// CPU devices' dispatch lanes from `1 << 30`).
const STREAM_LANES: u32 = 3 << 29;

/// The trace track name of device `ordinal`.
pub(crate) fn track_name(ordinal: i32) -> String {
    format!("cuda://{ordinal}")
}

/// A host-clock window known to contain the moment the GPU reached an
/// event: the trace clock read before recording it and after waiting for
/// it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Calibration {
    /// Trace clock before the record (ns).
    pub(crate) before_ns: u64,
    /// Trace clock after the wait returned (ns).
    pub(crate) after_ns: u64,
}

impl Calibration {
    /// The host time taken for the event: the window's midpoint.
    pub(crate) fn host_ns(self) -> u64 {
        self.before_ns + self.after_ns.saturating_sub(self.before_ns) / 2
    }

    /// The window's width (twice the worst-case error of [`Self::host_ns`]).
    pub(crate) fn width(self) -> u64 {
        self.after_ns.saturating_sub(self.before_ns)
    }
}

/// The trace-clock time of an event `elapsed_ms` milliseconds (as
/// `cuEventElapsedTime` reports, negative when it came first) after a
/// reference at `reference_ns`, rounded to the nanosecond and clamped to
/// the clock's range.
pub(crate) fn to_trace_ns(reference_ns: u64, elapsed_ms: f32) -> u64 {
    let delta = (elapsed_ms as f64 * 1e6).round();
    if !delta.is_finite() {
        return reference_ns;
    }
    if delta >= 0.0 {
        reference_ns.saturating_add(delta as u64)
    } else {
        reference_ns.saturating_sub((-delta) as u64)
    }
}

/// A span's start and end on the trace clock from the two elapsed times
/// against its reference; the end is never before the start.
pub(crate) fn span_ns(reference_ns: u64, start_ms: f32, end_ms: f32) -> (u64, u64) {
    let start = to_trace_ns(reference_ns, start_ms);
    (start, to_trace_ns(reference_ns, end_ms).max(start))
}

/// An event of known host time that timed events are measured against.
pub(crate) struct Reference {
    api: &'static Api,
    event: CUevent,
    host_ns: u64,
}

// SAFETY: the event is a plain driver handle; the driver's event calls are
// thread-safe, and the event is only read (elapsed times) after it was
// reached, and destroyed once, when the last holder drops it.
unsafe impl Send for Reference {}
// SAFETY: see above.
unsafe impl Sync for Reference {}

impl Drop for Reference {
    fn drop(&mut self) {
        // SAFETY: created by `DeviceClock::calibrate`, reached, destroyed
        // once here.
        unsafe { (self.api.cuEventDestroy_v2)(self.event) };
    }
}

#[derive(Default)]
struct ClockState {
    /// The recording the reference was made in.
    session: u64,
    /// Host time of the last clock sample recorded ([`SAMPLE_EVERY_NS`]).
    last_sample_ns: u64,
    reference: Option<Arc<Reference>>,
    /// The idle stream references are recorded on (created on first use).
    stream: Option<StreamHandle>,
}

struct StreamHandle(CUstream);

/// A device's timing events and reference, and the state of its block
/// pool (see the module docs).
#[derive(Default)]
pub(crate) struct DeviceClock {
    state: Mutex<ClockState>,
    /// Reached timing events for reuse.
    pool: Mutex<Vec<CUevent>>,
    /// Device blocks held by buffers, for memory events.
    blocks: Mutex<PoolBlocks>,
}

/// Device blocks held by buffers (count and bytes), and every block's
/// length by address from the driver's allocation to its free (a block
/// the pool forgets is known by address only).
#[derive(Default)]
struct PoolBlocks {
    live: u64,
    live_bytes: u64,
    lengths: std::collections::HashMap<u64, u64>,
}

// SAFETY: plain driver handles (events, one stream), used with the
// device's context current; the driver's calls on them are thread-safe.
unsafe impl Send for DeviceClock {}
// SAFETY: see above; the state is behind mutexes.
unsafe impl Sync for DeviceClock {}

impl DeviceClock {
    /// A timing event from the pool or a new one (context current).
    fn take(&self, api: &Api) -> Result<CUevent> {
        if let Some(e) = self.pool.lock().pop() {
            return Ok(e);
        }
        let mut e: CUevent = std::ptr::null_mut();
        ffi::check(
            // SAFETY: a valid out-pointer; the caller made the context
            // current.
            unsafe { (api.cuEventCreate)(&mut e, ffi::CU_EVENT_DEFAULT) },
            "creating a timing event",
        )?;
        Ok(e)
    }

    /// The reference for events recorded now, made anew when there is none
    /// of this recording younger than [`RECALIBRATE_NS`] (context current).
    fn reference(&self, shared: &CudaContext) -> Result<Arc<Reference>> {
        let api = shared.api;
        let mut state = self.state.lock();
        let session = trace::session();
        if let Some(r) = &state.reference {
            if state.session == session
                && trace::now_ns().saturating_sub(r.host_ns) < RECALIBRATE_NS
            {
                return Ok(r.clone());
            }
        }
        let stream = match &state.stream {
            Some(s) => s.0,
            None => {
                let mut s: CUstream = std::ptr::null_mut();
                ffi::check(
                    // SAFETY: a valid out-pointer; the context is current.
                    unsafe { (api.cuStreamCreate)(&mut s, ffi::CU_STREAM_NON_BLOCKING) },
                    "creating the timing reference stream",
                )?;
                state.stream = Some(StreamHandle(s));
                s
            }
        };
        let mut tries: Vec<(CUevent, Calibration)> = Vec::with_capacity(CALIBRATION_TRIES);
        for _ in 0..CALIBRATION_TRIES {
            let event = match self.take(api) {
                Ok(e) => e,
                Err(e) => {
                    self.pool.lock().extend(tries.iter().map(|t| t.0));
                    return Err(e);
                }
            };
            let before_ns = trace::now_ns();
            // SAFETY: an event and a stream of this context; nothing else
            // is enqueued on the stream, so the event is reached as soon as
            // the GPU gets to it.
            let r = unsafe {
                match (api.cuEventRecord)(event, stream) {
                    ffi::CUDA_SUCCESS => (api.cuEventSynchronize)(event),
                    r => r,
                }
            };
            let after_ns = trace::now_ns();
            if r != ffi::CUDA_SUCCESS {
                // SAFETY: ours, not used after this.
                unsafe { (api.cuEventDestroy_v2)(event) };
                self.pool.lock().extend(tries.iter().map(|t| t.0));
                return Err(ffi::to_status(r, "recording a timing reference"));
            }
            tries.push((
                event,
                Calibration {
                    before_ns,
                    after_ns,
                },
            ));
        }
        let Some(&(event, c)) = tries.iter().min_by_key(|t| t.1.width()) else {
            ferrite_base::bail!(Internal, "no timing reference was made");
        };
        let host_ns = c.host_ns();
        if trace::enabled() {
            // The reference is a clock sample: device time equal to the
            // host time taken, within its window.
            clock_sample(shared, host_ns, c);
            state.last_sample_ns = host_ns;
        }
        self.pool
            .lock()
            .extend(tries.iter().map(|t| t.0).filter(|&e| e != event));
        let r = Arc::new(Reference {
            api,
            event,
            host_ns,
        });
        state.session = session;
        state.reference = Some(r.clone());
        Ok(r)
    }

    /// While recording, when the last clock sample is [`SAMPLE_EVERY_NS`]
    /// old: records an event on the idle stream, waits for it between two
    /// host clock reads, and records its device time (measured from the
    /// current reference) against that window as a `clock` sample. Such
    /// samples show how the two clocks agree over the recording (upstream's
    /// tools fit one to the other from the first and the last); a few
    /// microseconds every millisecond at most; with `now`, whenever the
    /// recording has a reference (the closing sample when it stops).
    /// Context current.
    fn sample_if_due(&self, shared: &CudaContext, now: bool) {
        let api = shared.api;
        let mut state = self.state.lock();
        let due = trace::now_ns().saturating_sub(state.last_sample_ns) >= SAMPLE_EVERY_NS;
        if !(due || now) || state.session != trace::session() {
            return;
        }
        let (Some(reference), Some(stream)) = (state.reference.clone(), state.stream.as_ref())
        else {
            return;
        };
        let Ok(event) = self.take(api) else {
            return;
        };
        let before_ns = trace::now_ns();
        let mut ms = 0f32;
        // SAFETY: an event and the idle stream of this context; the
        // reference event was reached when it was made.
        let r = unsafe {
            match (api.cuEventRecord)(event, stream.0) {
                ffi::CUDA_SUCCESS => match (api.cuEventSynchronize)(event) {
                    ffi::CUDA_SUCCESS => (api.cuEventElapsedTime)(&mut ms, reference.event, event),
                    r => r,
                },
                r => r,
            }
        };
        let after_ns = trace::now_ns();
        if r != ffi::CUDA_SUCCESS {
            // SAFETY: ours, not used after this.
            unsafe { (api.cuEventDestroy_v2)(event) };
            return;
        }
        self.pool.lock().push(event);
        let window = Calibration {
            before_ns,
            after_ns,
        };
        clock_sample(shared, to_trace_ns(reference.host_ns, ms), window);
        state.last_sample_ns = window.host_ns();
    }

    /// Records a timing event on `stream` before some work (context
    /// current), measured against `pinned` when given (the reference of the
    /// queue operation the work belongs to: its spans and the operation's
    /// then share one calibration, so the operation's span holds theirs
    /// exactly) or the current reference. None when it cannot be done: the
    /// work then runs untimed (profiling never fails the program).
    pub(crate) fn begin(
        &self,
        shared: &CudaContext,
        stream: CUstream,
        pinned: Option<Arc<Reference>>,
    ) -> Option<Timing> {
        // Not recording (or stopping): the work runs untimed.
        let pending = trace::pending()?;
        let reference = match pinned {
            Some(r) => r,
            None => self.reference(shared).ok()?,
        };
        let api = shared.api;
        let start = self.take(api).ok()?;
        let t = Timing {
            api,
            pending,
            start,
            end: std::ptr::null_mut(),
            reference,
            cat: "",
            name: String::new(),
            args: Vec::new(),
        };
        // SAFETY: an event and a stream of this context.
        if unsafe { (api.cuEventRecord)(start, stream) } != ffi::CUDA_SUCCESS {
            return None; // `t` destroys the event
        }
        Some(t)
    }

    /// Destroys the pooled events and the reference and its stream; the
    /// device calls it with its context current, before the context goes
    /// (every timed span was resolved: the streams were synchronized).
    pub(crate) fn release(&self, api: &Api) {
        let mut state = self.state.lock();
        state.reference = None;
        if let Some(s) = state.stream.take() {
            // SAFETY: created by `reference`, idle (each record was waited
            // for), not used after this.
            unsafe { (api.cuStreamDestroy_v2)(s.0) };
        }
        for e in self.pool.lock().drain(..) {
            // SAFETY: reached events of this context, destroyed once.
            unsafe { (api.cuEventDestroy_v2)(e) };
        }
    }
}

/// Records a `clock` sample of device `shared`: an event whose device time
/// (on the trace clock, as spans are) is `device_ns`, reached within the
/// host `window`.
fn clock_sample(shared: &CudaContext, device_ns: u64, window: Calibration) {
    let track = trace::device_track(&track_name(shared.ordinal));
    trace::instant(
        "clock",
        "clock sample",
        track,
        vec![
            ("device_ns", Arg::U64(device_ns)),
            ("begin_ns", Arg::U64(window.before_ns)),
            ("end_ns", Arg::U64(window.after_ns)),
        ],
    );
}

/// Work bracketed by two timing events, to be resolved into a trace span
/// once the stream has passed it ([`resolve`]). Dropped unresolved (the
/// work failed to enqueue, or the device was lost), its events are
/// destroyed.
pub(crate) struct Timing {
    api: &'static Api,
    /// Held until the span is recorded: the recording waits for it.
    pending: trace::Pending,
    start: CUevent,
    end: CUevent,
    reference: Arc<Reference>,
    cat: &'static str,
    name: String,
    args: Vec<(&'static str, Arg)>,
}

// SAFETY: plain driver handles, read only after the stream reached them.
unsafe impl Send for Timing {}

impl Timing {
    /// The reference this timing is measured against.
    pub(crate) fn reference(&self) -> Arc<Reference> {
        self.reference.clone()
    }

    /// Records the closing event on `stream` after the work, naming the
    /// span (context current). None when the record fails.
    pub(crate) fn end(
        mut self,
        clock: &DeviceClock,
        stream: CUstream,
        cat: &'static str,
        name: String,
        args: Vec<(&'static str, Arg)>,
    ) -> Option<Timing> {
        let end = clock.take(self.api).ok()?;
        self.end = end;
        // SAFETY: an event and a stream of this context.
        if unsafe { (self.api.cuEventRecord)(end, stream) } != ffi::CUDA_SUCCESS {
            return None;
        }
        self.cat = cat;
        self.name = name;
        self.args = args;
        Some(self)
    }
}

impl Drop for Timing {
    fn drop(&mut self) {
        for e in [self.start, self.end] {
            if !e.is_null() {
                // SAFETY: events of this timing, possibly still pending
                // (the driver defers the destruction until reached), not
                // used after this.
                unsafe { (self.api.cuEventDestroy_v2)(e) };
            }
        }
    }
}

/// Records the spans of `timings`, whose events the stream has passed
/// (`reached`: it did so without a fault), on the device's track, and
/// returns their events to the pool. With the context current.
pub(crate) fn resolve(shared: &CudaContext, timings: &mut Vec<Timing>, reached: bool) {
    let api = shared.api;
    let track = trace::device_track(&track_name(shared.ordinal));
    let lane = STREAM_LANES + shared.ordinal.max(0) as u32;
    // Spans of the recording running (or stopping: it waits for them) are
    // recorded; those of an earlier one are not.
    let session = trace::session();
    let recording = timings.iter().any(|t| t.pending.session() == session);
    if recording {
        trace::name_thread(
            lane,
            format!("{} stream (device time)", track_name(shared.ordinal)),
        );
    }
    for mut t in timings.drain(..) {
        let (mut start_ms, mut end_ms) = (0f32, 0f32);
        // SAFETY: the three events are of this context and were reached
        // (the caller saw a later event of the same stream reached).
        let read = reached
            && unsafe {
                (api.cuEventElapsedTime)(&mut start_ms, t.reference.event, t.start)
                    == ffi::CUDA_SUCCESS
                    && (api.cuEventElapsedTime)(&mut end_ms, t.reference.event, t.end)
                        == ffi::CUDA_SUCCESS
            };
        if read {
            // Reached: reusable. Otherwise `t` destroys them.
            let mut pool = shared.clock.pool.lock();
            pool.push(std::mem::replace(&mut t.start, std::ptr::null_mut()));
            pool.push(std::mem::replace(&mut t.end, std::ptr::null_mut()));
        }
        if t.pending.session() != session {
            continue;
        }
        let mut args = std::mem::take(&mut t.args);
        let (ts_ns, end_ns) = if read {
            // Marks the times as the device's (a bundle writes such
            // dispatches as device-timestamped dispatch events).
            args.push(("device_time", Arg::U64(1)));
            span_ns(t.reference.host_ns, start_ms, end_ms)
        } else {
            args.push((
                "failed",
                Arg::Str("the device faulted: no device times".to_string()),
            ));
            let now = trace::now_ns();
            (now, now)
        };
        trace::record(Event {
            phase: Phase::Complete,
            cat: t.cat,
            name: std::mem::take(&mut t.name),
            ts_ns,
            dur_ns: end_ns - ts_ns,
            track,
            thread: lane,
            args,
        });
    }
    if recording && reached {
        shared.clock.sample_if_due(shared, false);
    }
}

impl trace::Flush for CudaContext {
    /// Reports every operation the stream holds, waiting for the GPU to
    /// pass it (the stream never waits on the host: work that does is kept
    /// on the host until its waits are reached), so their timed spans are
    /// recorded.
    fn flush(&self) {
        if self.make_current().is_ok() {
            self.completions.report(self, true, true);
            // A closing clock sample: with the reference's, every
            // recording with device times has two, from which tools fit
            // the device clock over the whole recording.
            self.clock.sample_if_due(self, true);
        }
    }
}

/// Registers the device context `shared` to be flushed when a recording
/// stops ([`trace::flush_on_stop`]), while it lives.
pub(crate) fn flush_on_stop(shared: &Arc<CudaContext>) {
    let weak: Weak<dyn trace::Flush> = Arc::downgrade(shared) as Weak<CudaContext>;
    trace::flush_on_stop(weak);
}

/// `ferrite_hal::MemoryType::DEVICE_LOCAL`'s bits: what the pool's blocks
/// are (memory events carry it).
const DEVICE_LOCAL: u64 = 0x30;

/// Records a pool event `name` of block `backing` (`bytes` long) on
/// device `shared`'s track, with the pool's state after it from `blocks`
/// (live) and the idle blocks (see the module docs).
fn pool_event(
    shared: &CudaContext,
    blocks: &PoolBlocks,
    name: &'static str,
    backing: u64,
    bytes: u64,
    extra: &[(&'static str, u64)],
) {
    let idle_blocks = shared.spare.blocks() as u64;
    let mut args = Vec::with_capacity(7 + extra.len());
    args.push(("backing", Arg::U64(backing)));
    args.push(("bytes", Arg::U64(bytes)));
    args.extend(extra.iter().map(|&(k, v)| (k, Arg::U64(v))));
    args.push(("memory_type", Arg::U64(DEVICE_LOCAL)));
    args.push(("pool_reserved", Arg::U64(blocks.live_bytes)));
    args.push(("pool_free", Arg::U64(shared.spare.bytes())));
    args.push(("pool_reservations", Arg::U64(blocks.live)));
    args.push(("pool_slabs", Arg::U64(blocks.live + idle_blocks)));
    let track = trace::device_track(&track_name(shared.ordinal));
    trace::instant("memory", name, track, args);
}

/// The device block `dptr` (`size` bytes) became `buffer`'s: an idle block
/// taken (`reused`), or a fresh one from the driver. Counts it, and while
/// recording records the block's acquisition (fresh), reservation and
/// materialization.
pub(crate) fn pool_acquired(
    shared: &CudaContext,
    buffer: &ferrite_hal::buffer::Buffer,
    dptr: u64,
    size: u64,
    reused: bool,
) {
    if dptr == 0 {
        return;
    }
    let mut blocks = shared.clock.blocks.lock();
    blocks.live += 1;
    blocks.live_bytes += size;
    if !reused {
        blocks.lengths.insert(dptr, size);
    }
    if !trace::enabled() {
        return;
    }
    let id = buffer.allocation_id();
    if !reused {
        pool_event(shared, &blocks, "slab_acquire", dptr, size, &[]);
    }
    let reserve = [
        ("allocation", id),
        ("requested", size),
        ("reused", reused as u64),
    ];
    pool_event(shared, &blocks, "pool_reserve", dptr, size, &reserve);
    let materialize = [("allocation", id), ("requested", size)];
    pool_event(
        shared,
        &blocks,
        "pool_materialize",
        dptr,
        size,
        &materialize,
    );
}

/// The buffer of device block `dptr` (`len` bytes) was dropped and its
/// block kept idle or freed; `freed` are the blocks that went back to the
/// driver with it (itself when not kept, idle blocks the pool forgot).
pub(crate) fn pool_released(shared: &CudaContext, dptr: u64, len: u64, freed: &[u64]) {
    if dptr == 0 {
        return;
    }
    let mut blocks = shared.clock.blocks.lock();
    blocks.live -= 1;
    blocks.live_bytes -= len;
    let recording = trace::enabled();
    if recording {
        pool_event(shared, &blocks, "pool_release", dptr, len, &[]);
    }
    slab_releases(shared, &mut blocks, freed, recording);
}

/// Idle blocks `freed` went back to the driver.
pub(crate) fn pool_returned(shared: &CudaContext, freed: &[u64]) {
    let mut blocks = shared.clock.blocks.lock();
    slab_releases(shared, &mut blocks, freed, trace::enabled());
}

fn slab_releases(shared: &CudaContext, blocks: &mut PoolBlocks, freed: &[u64], recording: bool) {
    for &p in freed {
        let len = blocks.lengths.remove(&p).unwrap_or(0);
        if recording {
            pool_event(shared, blocks, "slab_release", p, len, &[]);
        }
    }
}

/// What a queue operation records while a trace is recorded: its name and
/// arguments (`bytes`, `allocation`, `command_buffer`), and once its span
/// has begun, the reference it is measured against (the kernels it
/// launches are measured against it too).
pub(crate) struct TracedOp {
    pub(crate) op: &'static str,
    pub(crate) args: Vec<(&'static str, Arg)>,
    pub(crate) reference: Option<Arc<Reference>>,
}

/// The [`TracedOp`] of queue operation `op` while a trace is recorded,
/// else None (one relaxed load).
#[inline]
pub(crate) fn traced_op(op: &'static str, args: &[(&'static str, u64)]) -> Option<TracedOp> {
    if !trace::enabled() {
        return None;
    }
    Some(TracedOp {
        op,
        args: args.iter().map(|&(k, v)| (k, Arg::U64(v))).collect(),
        reference: None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn elapsed_milliseconds_land_on_the_trace_clock() {
        // 1.5 ms after a reference at 10 us.
        assert_eq!(to_trace_ns(10_000, 1.5), 1_510_000);
        // Sub-microsecond offsets round to the nanosecond.
        assert_eq!(to_trace_ns(10_000, 0.000_25), 10_250);
        // Before the reference (an event recorded first).
        assert_eq!(to_trace_ns(10_000, -0.004), 6_000);
        // Clamped at the clock's ends, never wrapping.
        assert_eq!(to_trace_ns(1_000, -1.0), 0);
        assert_eq!(to_trace_ns(u64::MAX - 5, 1.0), u64::MAX);
        assert_eq!(to_trace_ns(7, f32::NAN), 7);
    }

    #[test]
    fn spans_keep_order_and_never_end_before_they_start() {
        let r = 5_000_000_000u64;
        // A run of kernels back to back: starts and ends increase, each
        // span's duration is its elapsed difference.
        let times = [(0.010f32, 0.030f32), (0.031, 0.052), (0.052, 0.100)];
        let spans: Vec<(u64, u64)> = times.iter().map(|&(s, e)| span_ns(r, s, e)).collect();
        for w in spans.windows(2) {
            assert!(w[0].0 <= w[1].0 && w[0].1 <= w[1].0, "{spans:?}");
        }
        assert_eq!(spans[0], (r + 10_000, r + 30_000));
        assert_eq!(spans[2].1 - spans[2].0, 48_000);
        // An end read (by f32 rounding) before its start is clamped.
        assert_eq!(span_ns(r, 0.5, 0.499), (r + 500_000, r + 500_000));
    }

    #[test]
    fn calibration_takes_the_window_midpoint() {
        let c = Calibration {
            before_ns: 1_000,
            after_ns: 9_001,
        };
        assert_eq!(c.host_ns(), 5_000);
        assert_eq!(c.width(), 8_001);
        // A clock read out of order gives an empty window, not a wrap.
        let odd = Calibration {
            before_ns: 10,
            after_ns: 4,
        };
        assert_eq!((odd.host_ns(), odd.width()), (10, 0));
    }

    #[test]
    fn f32_milliseconds_resolve_below_a_tenth_of_a_microsecond_within_a_reference() {
        // The reference is renewed every RECALIBRATE_NS: the coarsest
        // f32 step of an elapsed time within it is under 100 ns.
        let ms = (RECALIBRATE_NS as f64 / 1e6) as f32;
        let step_ns = (f32::from_bits(ms.to_bits() + 1) - ms) as f64 * 1e6;
        assert!(step_ns < 100.0, "{step_ns}");
    }
}
