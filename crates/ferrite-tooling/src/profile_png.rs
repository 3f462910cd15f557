//! `ferrite profile --png=OUT.png`: the trace as a timeline picture, one row
//! per thread of each track (host VM work, each device's threads and
//! dispatch lanes), spans inset by nesting depth, dispatches and tiles
//! coloured by export (the same export, the same colour), time on the x
//! axis.
//!
//! Text needs a TrueType font, read when drawing: the file `FERRITE_FONT`
//! names, else the one fontconfig's `fc-match sans` answers. Without one
//! the picture is drawn without labels and a note says how to get them.

use crate::loaded_trace::{LoadedTrace, Span};
use ferrite_base::{status, Result};
use plotters::prelude::*;
use plotters::style::FontStyle;
use std::collections::BTreeMap;
use std::path::Path;

const WIDTH: u32 = 1600;
const LABEL_W: i32 = 300;
const ROW_H: i32 = 24;
const TOP: i32 = 36;
const BOTTOM: i32 = 40;
/// Most rows drawn (a trace of many threads keeps its first ones).
const MAX_ROWS: usize = 64;

/// Loads a font for labels (see the module docs); false when none.
fn load_font() -> bool {
    static LOADED: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *LOADED.get_or_init(|| {
        let path = std::env::var_os("FERRITE_FONT")
            .map(std::path::PathBuf::from)
            .or_else(|| {
                let out = std::process::Command::new("fc-match")
                    .args(["-f", "%{file}", "sans"])
                    .output()
                    .ok()?;
                let p = String::from_utf8(out.stdout).ok()?;
                (!p.is_empty()).then(|| p.into())
            });
        let Some(bytes) = path.and_then(|p| std::fs::read(p).ok()) else {
            return false;
        };
        // plotters keeps registered fonts for the life of the process.
        let bytes: &'static [u8] = Box::leak(bytes.into_boxed_slice());
        plotters::style::register_font("sans-serif", FontStyle::Normal, bytes).is_ok()
    })
}

/// A stable colour for `name` (the same export, the same colour).
fn colour_of(name: &str) -> RGBColor {
    let mut h: u32 = 2166136261;
    for b in name.bytes() {
        h = (h ^ b as u32).wrapping_mul(16777619);
    }
    // Mid-light colours, so black labels stay readable.
    let c = |shift: u32| 90 + ((h >> shift) & 0x7f) as u8;
    RGBColor(c(0), c(8), c(16))
}

fn category_colour(span: &Span) -> RGBColor {
    match span.cat.as_str() {
        "dispatch" | "tile" => colour_of(&span.name),
        "invocation" => RGBColor(200, 200, 200),
        "vm" => RGBColor(150, 180, 230),
        "queue" => RGBColor(240, 200, 120),
        "wait" => RGBColor(235, 120, 120),
        _ => RGBColor(180, 180, 180),
    }
}

/// A round step of about `span / 8` microseconds for the axis ticks.
fn tick_step(span: f64) -> f64 {
    let raw = (span / 8.0).max(1e-3);
    let p = 10f64.powf(raw.log10().floor());
    [1.0, 2.0, 5.0, 10.0]
        .iter()
        .map(|m| m * p)
        .find(|s| *s >= raw)
        .unwrap_or(10.0 * p)
}

fn fmt_tick(us: f64) -> String {
    if us >= 1e6 {
        format!("{:.2}s", us / 1e6)
    } else if us >= 1e3 {
        format!("{:.2}ms", us / 1e3)
    } else {
        format!("{us:.0}us")
    }
}

/// Draws `trace` to the PNG `path`.
pub fn draw(trace: &LoadedTrace, path: &Path) -> Result<()> {
    let fail = |e: String| {
        status!(
            Unavailable,
            "drawing the timeline '{}': {e}",
            path.display()
        )
    };
    // Rows: every (track, thread) with spans, host first, threads in order.
    let mut rows: BTreeMap<(u64, u64), Vec<&Span>> = BTreeMap::new();
    for s in &trace.spans {
        rows.entry((s.pid, s.tid)).or_default().push(s);
    }
    let rows: Vec<((u64, u64), Vec<&Span>)> = rows.into_iter().take(MAX_ROWS).collect();
    let height = (TOP + BOTTOM + ROW_H * rows.len().max(1) as i32) as u32;
    let (start, end) = trace.bounds();
    let span_us = (end - start).max(1e-3);
    let plot_w = WIDTH as i32 - LABEL_W - 20;
    let x_of = |us: f64| LABEL_W + ((us - start) / span_us * plot_w as f64).round() as i32;
    let labels = load_font();
    let root = BitMapBackend::new(path, (WIDTH, height)).into_drawing_area();
    root.fill(&WHITE).map_err(|e| fail(e.to_string()))?;
    let font = ("sans-serif", 13).into_font().color(&BLACK);
    let small = ("sans-serif", 11).into_font().color(&BLACK);
    let text = |t: &str, x: i32, y: i32, f: &TextStyle| -> Result<()> {
        if labels {
            root.draw(&Text::new(t.to_string(), (x, y), f.clone()))
                .map_err(|e| fail(e.to_string()))?;
        }
        Ok(())
    };
    text(
        &format!(
            "ferrite trace: {} spans over {}",
            trace.spans.len(),
            fmt_tick(span_us)
        ),
        8,
        10,
        &font,
    )?;
    for (i, ((pid, tid), spans)) in rows.iter().enumerate() {
        let y0 = TOP + i as i32 * ROW_H;
        if i % 2 == 1 {
            root.draw(&Rectangle::new(
                [(0, y0), (WIDTH as i32, y0 + ROW_H)],
                RGBColor(246, 246, 246).filled(),
            ))
            .map_err(|e| fail(e.to_string()))?;
        }
        let track = trace.tracks.get(pid).cloned().unwrap_or_default();
        let thread = trace
            .threads
            .get(&(*pid, *tid))
            .cloned()
            .unwrap_or_else(|| format!("thread {tid}"));
        text(&format!("{track} / {thread}"), 6, y0 + 6, &small)?;
        // Nesting depth: spans sorted by start, longer first, against a
        // stack of the ends of the spans still open.
        let mut sorted = spans.clone();
        sorted.sort_by(|a, b| a.ts.total_cmp(&b.ts).then(b.dur.total_cmp(&a.dur)));
        let mut open: Vec<f64> = Vec::new();
        for s in sorted {
            while open.last().is_some_and(|&e| e <= s.ts) {
                open.pop();
            }
            let depth = open.len().min(4) as i32;
            open.push(s.ts + s.dur);
            let (x0, x1) = (x_of(s.ts), x_of(s.ts + s.dur).max(x_of(s.ts) + 1));
            let (top, bottom) = (y0 + 2 + depth * 3, y0 + ROW_H - 2);
            root.draw(&Rectangle::new(
                [(x0, top), (x1, bottom)],
                category_colour(s).filled(),
            ))
            .map_err(|e| fail(e.to_string()))?;
            if x1 - x0 > 70 && depth >= 1 {
                let room = ((x1 - x0 - 4) / 6).max(1) as usize;
                let name: String = s.name.chars().take(room).collect();
                text(&name, x0 + 2, top + 4, &small)?;
            }
        }
    }
    // Time axis.
    let axis_y = TOP + ROW_H * rows.len() as i32 + 4;
    root.draw(&PathElement::new(
        vec![(LABEL_W, axis_y), (LABEL_W + plot_w, axis_y)],
        BLACK,
    ))
    .map_err(|e| fail(e.to_string()))?;
    let step = tick_step(span_us);
    let mut t = 0.0;
    while t <= span_us + 1e-9 {
        let x = x_of(start + t);
        root.draw(&PathElement::new(vec![(x, axis_y), (x, axis_y + 5)], BLACK))
            .map_err(|e| fail(e.to_string()))?;
        text(&fmt_tick(t), x - 10, axis_y + 8, &small)?;
        t += step;
    }
    root.present().map_err(|e| fail(e.to_string()))?;
    if !labels {
        eprintln!(
            "note: no font for the timeline's labels (set FERRITE_FONT to a .ttf file, or install fontconfig); drawn without text"
        );
    }
    Ok(())
}
