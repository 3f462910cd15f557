//! A Chrome/Perfetto JSON trace read back (what `--trace` writes): its
//! spans and its track and thread names, for `ferrite profile`'s tables
//! ([`crate::tools::profile`]) and its timeline picture
//! ([`crate::profile_png`]), which both read it.

use ferrite_base::{bail, status, Result};
use serde_json::Value;
use std::collections::BTreeMap;

/// One span of the trace, as read back.
#[derive(Clone, Debug)]
pub struct Span {
    /// Category (`dispatch`, `tile`, `queue`, `wait`, `vm`, `invocation`).
    pub cat: String,
    /// Name (export, function, queue operation).
    pub name: String,
    /// Start, microseconds.
    pub ts: f64,
    /// Duration, microseconds.
    pub dur: f64,
    /// Track (device or host) and thread.
    pub pid: u64,
    /// Thread number.
    pub tid: u64,
    /// The event's `args` object.
    pub args: Value,
}

/// A trace read back: its spans and its track and thread names.
#[derive(Debug, Default)]
pub struct LoadedTrace {
    /// The `X` events, but loading.
    pub spans: Vec<Span>,
    /// The `load` spans (what ran inside them is in neither list).
    pub loads: Vec<Span>,
    /// Track number to name.
    pub tracks: BTreeMap<u64, String>,
    /// (track, thread) to name.
    pub threads: BTreeMap<(u64, u64), String>,
}

impl LoadedTrace {
    /// Parses Chrome trace JSON (an object with `traceEvents` or a bare
    /// array), keeping spans and metadata; an error naming what is wrong.
    pub fn parse(text: &str) -> Result<LoadedTrace> {
        let v: Value = serde_json::from_str(text)
            .map_err(|e| status!(InvalidArgument, "not a JSON trace: {e}"))?;
        let events = match &v {
            Value::Array(a) => a,
            Value::Object(o) => match o.get("traceEvents") {
                Some(Value::Array(a)) => a,
                _ => bail!(InvalidArgument, "the JSON has no 'traceEvents' array"),
            },
            _ => bail!(InvalidArgument, "a trace is a JSON object or array"),
        };
        let mut t = LoadedTrace::default();
        for e in events {
            let field = |k: &str| e.get(k).and_then(Value::as_u64).unwrap_or(0);
            match e.get("ph").and_then(Value::as_str) {
                Some("X") => {
                    let num = |k: &str| e.get(k).and_then(Value::as_f64);
                    let (Some(ts), Some(dur)) = (num("ts"), num("dur")) else {
                        bail!(InvalidArgument, "a span without 'ts' and 'dur': {e}");
                    };
                    t.spans.push(Span {
                        cat: e
                            .get("cat")
                            .and_then(Value::as_str)
                            .unwrap_or("")
                            .to_string(),
                        name: e
                            .get("name")
                            .and_then(Value::as_str)
                            .unwrap_or("")
                            .to_string(),
                        ts,
                        dur,
                        pid: field("pid"),
                        tid: field("tid"),
                        args: e.get("args").cloned().unwrap_or(Value::Null),
                    });
                }
                Some("M") => {
                    let name = e["args"]["name"].as_str().unwrap_or("").to_string();
                    match e.get("name").and_then(Value::as_str) {
                        Some("process_name") => {
                            t.tracks.insert(field("pid"), name);
                        }
                        Some("thread_name") => {
                            t.threads.insert((field("pid"), field("tid")), name);
                        }
                        _ => {}
                    }
                }
                _ => {}
            }
        }
        let (loads, rest): (Vec<Span>, Vec<Span>) = std::mem::take(&mut t.spans)
            .into_iter()
            .partition(|s| s.cat == "load");
        let inside = |s: &Span, l: &Span| s.ts >= l.ts && s.ts + s.dur <= l.ts + l.dur;
        t.spans = rest
            .into_iter()
            .filter(|s| !loads.iter().any(|l| inside(s, l)))
            .collect();
        t.loads = loads;
        Ok(t)
    }

    /// First start to last end over every span, microseconds.
    pub fn bounds(&self) -> (f64, f64) {
        let start = self
            .spans
            .iter()
            .map(|s| s.ts)
            .fold(f64::INFINITY, f64::min);
        let end = self
            .spans
            .iter()
            .map(|s| s.ts + s.dur)
            .fold(f64::NEG_INFINITY, f64::max);
        if start.is_finite() {
            (start, end)
        } else {
            (0.0, 0.0)
        }
    }
}
