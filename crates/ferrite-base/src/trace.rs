//! The execution trace recorder: one process-wide recording of what the
//! runtime did, written as a Chrome/Perfetto JSON trace (`--trace=FILE.json`,
//! `ferrite.runtime.start_trace`, `ferrite::trace`).
//!
//! Every layer writes its own events here: the VM its invocations and
//! function spans, the HAL its queue operations and semaphore waits, the
//! drivers their dispatches and the tiles each worker thread ran. The
//! recorder sits in the base layer because all of those layers share it and
//! none may depend on another for it.
//!
//! Off, the cost is one relaxed atomic load per place that could record
//! ([`enabled`]); nothing is allocated and no clock is read. On, events go
//! to one mutex-guarded list (a tracing run measures where time goes, not
//! the last nanosecond).
//!
//! Besides spans and instants of work, some events carry metadata a
//! reader needs once per recording: `command_buffer` / `command` instants
//! describe a command buffer and its operations the first time it is
//! executed while recording ([`session`] tells a recorder whether it has
//! described something in this recording), and `load` spans time loading a
//! module, verifying it, compiling it, opening a parameter file.
//!
//! Events are grouped into tracks the way the Chrome trace format groups
//! them: a *process* per device (plus one for the host's VM work, see
//! [`HOST_TRACK`]) and a *thread* per OS thread that recorded something,
//! named after the thread (`local-task worker 1`, `main`, ...).

use parking_lot::Mutex;
use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::OnceLock;
use std::time::Instant;

/// The track (Chrome "process") of host-side VM work: invocations and VM
/// function spans. Devices get tracks numbered from 2 ([`device_track`]).
pub const HOST_TRACK: u32 = 1;

/// A value attached to an event (shown in the viewer's detail pane).
#[derive(Clone, Debug, PartialEq)]
pub enum Arg {
    /// An unsigned integer.
    U64(u64),
    /// Text.
    Str(String),
    /// A list of unsigned integers (workgroup counts, ranges).
    List(Vec<u64>),
}

/// How an event is drawn: a span with a duration, or an instant.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Phase {
    /// A span (`"ph": "X"`): `ts_ns` to `ts_ns + dur_ns`.
    Complete,
    /// A point in time (`"ph": "i"`).
    Instant,
}

/// One recorded event.
#[derive(Clone, Debug)]
pub struct Event {
    /// Span or instant.
    pub phase: Phase,
    /// Category: `invocation`, `vm`, `dispatch`, `tile`, `queue`, `wait`, ...
    pub cat: &'static str,
    /// What the viewer shows on the span (a function or export name).
    pub name: String,
    /// Start, in nanoseconds since the process's trace epoch.
    pub ts_ns: u64,
    /// Duration in nanoseconds (0 for instants).
    pub dur_ns: u64,
    /// The track: [`HOST_TRACK`] or a device's ([`device_track`]).
    pub track: u32,
    /// The recording thread ([`thread_id`]).
    pub thread: u32,
    /// Named values.
    pub args: Vec<(&'static str, Arg)>,
}

/// A finished recording: its events and the names of its tracks and
/// threads.
#[derive(Clone, Debug, Default)]
pub struct Trace {
    /// Events in the order they were recorded (spans at their end).
    pub events: Vec<Event>,
    /// Track number to name (`host`, `device local-task`).
    pub tracks: BTreeMap<u32, String>,
    /// Thread number to name.
    pub threads: BTreeMap<u32, String>,
}

static ENABLED: AtomicBool = AtomicBool::new(false);
/// Set while [`stop`] waits for pending work: no new work becomes pending
/// (work already running still records, e.g. an execute's dispatches).
static STOPPING: AtomicBool = AtomicBool::new(false);
static RECORDING: Mutex<Option<Trace>> = Mutex::new(None);
/// The number of the current (or last) recording, from 1.
static SESSION: AtomicU64 = AtomicU64::new(0);
static NEXT_THREAD: AtomicU32 = AtomicU32::new(1);
/// Device names in track order (track = index + 2).
static DEVICE_TRACKS: Mutex<Vec<String>> = Mutex::new(Vec::new());
/// Work begun while recording whose events are not recorded yet
/// ([`Pending`]), and the condition [`stop`] waits on for it to settle.
static PENDING: Mutex<u64> = Mutex::new(0);
static SETTLED: parking_lot::Condvar = parking_lot::Condvar::new();
/// Recorders [`stop`] asks to report what they owe ([`flush_on_stop`]).
static FLUSHERS: Mutex<Vec<std::sync::Weak<dyn Flush>>> = Mutex::new(Vec::new());
/// How long [`stop`] waits for pending work at most (a GPU program's
/// work may take seconds; work that never ends must not hang the tool).
const STOP_WAIT: std::time::Duration = std::time::Duration::from_secs(60);

thread_local! {
    static THREAD: u32 = NEXT_THREAD.fetch_add(1, Ordering::Relaxed);
    /// What this thread is doing for the trace's "woken by" notes (the
    /// queue operation it runs), when recording.
    static DOING: std::cell::RefCell<Option<String>> = const { std::cell::RefCell::new(None) };
}

/// True while a trace is being recorded. The one check every recording
/// site makes first (a relaxed load).
#[inline(always)]
pub fn enabled() -> bool {
    ENABLED.load(Ordering::Relaxed)
}

/// The number of the recording running now (from 1; 0 before the first).
/// A recorder that writes metadata once per recording (a command buffer's
/// description) keeps the number it last wrote it in and compares.
pub fn session() -> u64 {
    SESSION.load(Ordering::Relaxed)
}

/// Nanoseconds since the process's trace epoch (fixed at the first use).
pub fn now_ns() -> u64 {
    static EPOCH: OnceLock<Instant> = OnceLock::new();
    let epoch = *EPOCH.get_or_init(Instant::now);
    u64::try_from(epoch.elapsed().as_nanos()).unwrap_or(u64::MAX)
}

/// This thread's number in traces.
pub fn thread_id() -> u32 {
    THREAD.try_with(|t| *t).unwrap_or(0)
}

/// The track of the device called `name` (one per distinct name).
pub fn device_track(name: &str) -> u32 {
    let mut tracks = DEVICE_TRACKS.lock();
    let index = match tracks.iter().position(|t| t == name) {
        Some(i) => i,
        None => {
            tracks.push(name.to_string());
            tracks.len() - 1
        }
    };
    index as u32 + 2
}

/// Starts recording. `FAILED_PRECONDITION` when a recording is already
/// running (one per process: the tools and bindings start and stop it
/// around the work they trace).
pub fn start() -> crate::Result<()> {
    let mut r = RECORDING.lock();
    if r.is_some() {
        crate::bail!(
            FailedPrecondition,
            "a trace is already being recorded in this process"
        );
    }
    now_ns();
    SESSION.fetch_add(1, Ordering::Relaxed);
    *r = Some(Trace::default());
    ENABLED.store(true, Ordering::Release);
    Ok(())
}

/// Stops recording and returns what was recorded (None when no recording
/// was running).
///
/// Work begun while recording is in the recording even when its events
/// come later: no new work becomes [`Pending`], the recorders registered
/// with [`flush_on_stop`] are asked to report what they owe (a GPU's timed
/// spans), and the pending work is waited for (at most a minute, then a
/// note on stderr) before the recording is closed. Meanwhile the recording
/// stays on, so what the pending work records (an execute's dispatches)
/// is in it.
pub fn stop() -> Option<Trace> {
    if RECORDING.lock().is_none() {
        ENABLED.store(false, Ordering::Release);
        return None;
    }
    STOPPING.store(true, Ordering::SeqCst);
    let flushers: Vec<std::sync::Arc<dyn Flush>> = {
        let mut f = FLUSHERS.lock();
        f.retain(|w| w.strong_count() > 0);
        f.iter().filter_map(std::sync::Weak::upgrade).collect()
    };
    for f in flushers {
        f.flush();
    }
    {
        let deadline = Instant::now() + STOP_WAIT;
        let mut pending = PENDING.lock();
        while *pending > 0 {
            if SETTLED.wait_until(&mut pending, deadline).timed_out() {
                eprintln!(
                    "ferrite: the trace stopped with {} operation(s) still running; they are not in it",
                    *pending
                );
                break;
            }
        }
    }
    ENABLED.store(false, Ordering::Release);
    STOPPING.store(false, Ordering::SeqCst);
    let mut trace = RECORDING.lock().take()?;
    trace.tracks.insert(HOST_TRACK, "host (VM)".to_string());
    for (i, name) in DEVICE_TRACKS.lock().iter().enumerate() {
        trace.tracks.insert(i as u32 + 2, format!("device {name}"));
    }
    Some(trace)
}

/// A recorder that reports events some time after the work they describe
/// was begun (a GPU device reads its timed spans once its stream has passed
/// them): [`stop`] calls [`Flush::flush`] so that it reports them into the
/// recording before it closes.
pub trait Flush: Send + Sync {
    /// Reports, now, the events of work already begun (waiting for that
    /// work if need be; never for work that waits on the host).
    fn flush(&self);
}

/// Registers `recorder` to be flushed by every [`stop`] while it lives.
pub fn flush_on_stop(recorder: std::sync::Weak<dyn Flush>) {
    FLUSHERS.lock().push(recorder);
}

/// Work begun while recording whose events will be recorded when it ends
/// ([`pending`]); [`stop`] waits until every one is dropped.
pub struct Pending {
    session: u64,
}

impl Pending {
    /// The recording the work was begun in ([`session`]): its events
    /// belong there and nowhere else.
    pub fn session(&self) -> u64 {
        self.session
    }
}

impl Drop for Pending {
    fn drop(&mut self) {
        let mut pending = PENDING.lock();
        *pending -= 1;
        if *pending == 0 {
            SETTLED.notify_all();
        }
    }
}

/// While recording: notes work begun now whose events come when it ends;
/// hold the guard until they are recorded. None when not recording (also
/// once [`stop`] has begun: work begun then is not traced).
pub fn pending() -> Option<Pending> {
    if !enabled() {
        return None;
    }
    let mut pending = PENDING.lock();
    // Under the lock `stop` reads the count with: work is either counted
    // before it looks, or sees it stopping.
    if STOPPING.load(Ordering::SeqCst) {
        return None;
    }
    *pending += 1;
    Some(Pending { session: session() })
}

/// How much [`Pending`] work the recording waits for now.
pub fn pending_work() -> u64 {
    *PENDING.lock()
}

/// Records `event` when a recording is running (ignored otherwise); the
/// recording thread's name is noted the first time it records.
pub fn record(event: Event) {
    let mut r = RECORDING.lock();
    let Some(trace) = r.as_mut() else {
        return;
    };
    if event.thread == thread_id() {
        trace.threads.entry(event.thread).or_insert_with(|| {
            let t = std::thread::current();
            match t.name() {
                Some(n) => n.to_string(),
                None => format!("thread {}", event.thread),
            }
        });
    }
    trace.events.push(event);
}

/// Names trace thread `thread` (a virtual lane a recorder fills with
/// events of its own, such as a device's dispatch lanes).
pub fn name_thread(thread: u32, name: impl Into<String>) {
    if let Some(trace) = RECORDING.lock().as_mut() {
        trace.threads.entry(thread).or_insert_with(|| name.into());
    }
}

/// Records a span from `start_ns` to now on this thread.
pub fn complete(
    cat: &'static str,
    name: impl Into<String>,
    track: u32,
    start_ns: u64,
    args: Vec<(&'static str, Arg)>,
) {
    let end = now_ns();
    record(Event {
        phase: Phase::Complete,
        cat,
        name: name.into(),
        ts_ns: start_ns,
        dur_ns: end.saturating_sub(start_ns),
        track,
        thread: thread_id(),
        args,
    });
}

/// Runs `f`; while recording, a span of category `cat` around it on the
/// host track ([`HOST_TRACK`]), named and given arguments by `what` from
/// `f`'s result once it is known (loads: a module, its verification, its
/// compilation, a parameter file). Off, `f` runs after one relaxed load.
#[inline]
pub fn timed<T>(
    cat: &'static str,
    what: impl FnOnce(&T) -> (String, Vec<(&'static str, Arg)>),
    f: impl FnOnce() -> T,
) -> T {
    if !enabled() {
        return f();
    }
    let start = now_ns();
    let out = f();
    let (name, args) = what(&out);
    complete(cat, name, HOST_TRACK, start, args);
    out
}

/// The start of a span that [`end_span`] records: now while recording,
/// None otherwise (no clock read), for code a closure cannot wrap.
#[inline(always)]
pub fn start_span() -> Option<u64> {
    enabled().then(now_ns)
}

/// Records a span of category `cat` from `start` ([`start_span`]) to now
/// on the host track, named by `what`; nothing when `start` is None.
#[inline]
pub fn end_span(
    cat: &'static str,
    start: Option<u64>,
    what: impl FnOnce() -> (String, Vec<(&'static str, Arg)>),
) {
    if let Some(start) = start {
        let (name, args) = what();
        complete(cat, name, HOST_TRACK, start, args);
    }
}

/// Records an instant on this thread.
pub fn instant(
    cat: &'static str,
    name: impl Into<String>,
    track: u32,
    args: Vec<(&'static str, Arg)>,
) {
    record(Event {
        phase: Phase::Instant,
        cat,
        name: name.into(),
        ts_ns: now_ns(),
        dur_ns: 0,
        track,
        thread: thread_id(),
        args,
    });
}

/// Notes what this thread is doing (e.g. `local-task: queue execute`) until
/// the returned guard is dropped; semaphores it signals meanwhile name it
/// as what woke their waiters ([`doing`]).
pub fn set_doing(what: String) -> DoingGuard {
    let previous = DOING
        .try_with(|d| d.borrow_mut().replace(what))
        .ok()
        .flatten();
    DoingGuard { previous }
}

/// Restores the previous [`set_doing`] note when dropped.
pub struct DoingGuard {
    previous: Option<String>,
}

impl Drop for DoingGuard {
    fn drop(&mut self) {
        let previous = self.previous.take();
        let _ = DOING.try_with(|d| *d.borrow_mut() = previous);
    }
}

/// Who this thread is and what it is doing, for "woken by" notes:
/// `thread NAME: WHAT` (or just the thread's name).
pub fn doing() -> String {
    let t = std::thread::current();
    let who = t
        .name()
        .map_or_else(|| format!("thread {}", thread_id()), str::to_string);
    match DOING.try_with(|d| d.borrow().clone()).ok().flatten() {
        Some(what) => format!("{who}: {what}"),
        None => who,
    }
}

impl Trace {
    /// The Chrome trace-event JSON (an object with `traceEvents`, as
    /// Perfetto and `chrome://tracing` load it); times in microseconds.
    pub fn to_chrome_json(&self) -> String {
        let mut out = String::from("{\"displayTimeUnit\":\"ns\",\"traceEvents\":[\n");
        let mut first = true;
        let mut sep = |out: &mut String| {
            if !first {
                out.push_str(",\n");
            }
            first = false;
        };
        // Which threads appear on which tracks: each gets its name there.
        let mut seen: BTreeMap<(u32, u32), ()> = BTreeMap::new();
        for e in &self.events {
            seen.insert((e.track, e.thread), ());
        }
        for (track, name) in &self.tracks {
            sep(&mut out);
            let _ = write!(
                out,
                "{{\"ph\":\"M\",\"name\":\"process_name\",\"pid\":{track},\"tid\":0,\"args\":{{\"name\":{}}}}}",
                json_string(name)
            );
        }
        for (track, thread) in seen.keys() {
            let name = self
                .threads
                .get(thread)
                .cloned()
                .unwrap_or_else(|| format!("thread {thread}"));
            sep(&mut out);
            let _ = write!(
                out,
                "{{\"ph\":\"M\",\"name\":\"thread_name\",\"pid\":{track},\"tid\":{thread},\"args\":{{\"name\":{}}}}}",
                json_string(&name)
            );
        }
        for e in &self.events {
            sep(&mut out);
            let _ = write!(
                out,
                "{{\"ph\":\"{}\",\"cat\":{},\"name\":{},\"pid\":{},\"tid\":{},\"ts\":{}",
                match e.phase {
                    Phase::Complete => "X",
                    Phase::Instant => "i",
                },
                json_string(e.cat),
                json_string(&e.name),
                e.track,
                e.thread,
                micros(e.ts_ns)
            );
            match e.phase {
                Phase::Complete => {
                    let _ = write!(out, ",\"dur\":{}", micros(e.dur_ns));
                }
                Phase::Instant => out.push_str(",\"s\":\"t\""),
            }
            if !e.args.is_empty() {
                out.push_str(",\"args\":{");
                for (i, (k, v)) in e.args.iter().enumerate() {
                    if i > 0 {
                        out.push(',');
                    }
                    let _ = write!(out, "{}:", json_string(k));
                    match v {
                        Arg::U64(n) => {
                            let _ = write!(out, "{n}");
                        }
                        Arg::Str(s) => out.push_str(&json_string(s)),
                        Arg::List(l) => {
                            out.push('[');
                            for (j, n) in l.iter().enumerate() {
                                if j > 0 {
                                    out.push(',');
                                }
                                let _ = write!(out, "{n}");
                            }
                            out.push(']');
                        }
                    }
                }
                out.push('}');
            }
            out.push('}');
        }
        out.push_str("\n]}\n");
        out
    }

    /// Writes [`Trace::to_chrome_json`] to `path`.
    pub fn write_chrome_json(&self, path: &std::path::Path) -> crate::Result<()> {
        std::fs::write(path, self.to_chrome_json()).map_err(|e| {
            crate::Status::new(
                crate::StatusCode::Unavailable,
                format!("writing trace '{}': {e}", path.display()),
            )
        })
    }
}

/// Nanoseconds as microseconds with three decimals (the format's unit).
fn micros(ns: u64) -> String {
    format!("{}.{:03}", ns / 1000, ns % 1000)
}

/// `s` as a JSON string literal.
fn json_string(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    out.push('"');
    // Names are plain ASCII almost always: copied whole.
    if !s.bytes().any(|b| b == b'"' || b == b'\\' || b < 0x20) {
        out.push_str(s);
        out.push('"');
        return out;
    }
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if (c as u32) < 0x20 => {
                let _ = write!(out, "\\u{:04x}", c as u32);
            }
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The tests of this module that record take turns (one recording per
    /// process); other tests of this crate do not record.
    static ONE: Mutex<()> = Mutex::new(());

    #[test]
    fn records_only_while_started_and_escapes_names() {
        let _one = ONE.lock();
        complete("vm", "before", HOST_TRACK, now_ns(), Vec::new());
        start().unwrap();
        assert!(start().is_err(), "a second recording is refused");
        let t0 = now_ns();
        complete(
            "dispatch",
            "quote\"d\n",
            device_track("test-device"),
            t0,
            vec![
                ("workgroups", Arg::List(vec![4, 1, 1])),
                ("note", Arg::Str("a\\b".into())),
            ],
        );
        instant("queue", "submit", HOST_TRACK, vec![("n", Arg::U64(3))]);
        let trace = stop().unwrap();
        assert!(!enabled());
        assert_eq!(trace.events.len(), 2);
        let json = trace.to_chrome_json();
        assert!(json.contains(r#""name":"quote\"d\n""#), "{json}");
        assert!(json.contains(r#""workgroups":[4,1,1]"#), "{json}");
        assert!(json.contains(r#""note":"a\\b""#), "{json}");
        assert!(json.contains(r#""name":"device test-device""#), "{json}");
        assert!(!json.contains("before"));
        assert!(stop().is_none());
    }

    #[test]
    fn stop_flushes_recorders_and_waits_for_pending_work() {
        let _one = ONE.lock();
        struct Late;
        impl Flush for Late {
            fn flush(&self) {
                instant("queue", "flushed", HOST_TRACK, Vec::new());
            }
        }
        let late: std::sync::Arc<dyn Flush> = std::sync::Arc::new(Late);
        flush_on_stop(std::sync::Arc::downgrade(&late));
        start().unwrap();
        // Work begun while recording, ending after stop() is called.
        let work = pending().unwrap();
        let (begun, go) = std::sync::mpsc::channel();
        let worker = std::thread::spawn(move || {
            let t0 = now_ns();
            begun.send(()).unwrap();
            std::thread::sleep(std::time::Duration::from_millis(50));
            complete("queue", "late work", HOST_TRACK, t0, Vec::new());
            drop(work);
        });
        go.recv().unwrap();
        let trace = stop().unwrap();
        let names: Vec<&str> = trace.events.iter().map(|e| e.name.as_str()).collect();
        assert_eq!(names, ["flushed", "late work"]);
        assert!(pending().is_none(), "nothing is pending once stopped");
        worker.join().unwrap();
        // A recorder gone is not flushed.
        drop(late);
        start().unwrap();
        assert!(stop().unwrap().events.is_empty());
    }
}
