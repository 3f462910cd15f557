//! Matching two traces dispatch by dispatch and finding where they part.

use super::trace::{DispatchRecord, Written};
use std::collections::HashMap;
use std::fmt::Write as _;

/// How one binding of a matched dispatch compares.
#[derive(Clone, Debug, PartialEq)]
pub struct BindingDiff {
    /// Binding index.
    pub binding: usize,
    /// Largest `|a - b|` over the written spans read as f32 (NaN in one
    /// and not the other counts as infinite).
    pub max_abs: f64,
    /// Elements over the threshold.
    pub over: usize,
    /// Elements compared.
    pub count: usize,
    /// Set when the written spans differ in offset or length.
    pub span_mismatch: Option<String>,
}

/// Compares two written spans as f32 (`|a-b| > atol + rtol*|b|` counts).
pub fn compare_spans(
    binding: usize,
    a: &Written,
    b: &Written,
    atol: f64,
    rtol: f64,
) -> BindingDiff {
    let n = a.bytes.len().min(b.bytes.len()) / 4;
    let f = |v: &[u8], i: usize| {
        f32::from_le_bytes([v[4 * i], v[4 * i + 1], v[4 * i + 2], v[4 * i + 3]]) as f64
    };
    let (mut max_abs, mut over) = (0f64, 0usize);
    for i in 0..n {
        let (x, y) = (f(&a.bytes, i), f(&b.bytes, i));
        let d = if x.is_nan() && y.is_nan() {
            0.0
        } else if x.is_nan() || y.is_nan() {
            f64::INFINITY
        } else if x == y {
            0.0
        } else {
            (x - y).abs()
        };
        max_abs = max_abs.max(d);
        if d > atol + rtol * y.abs() {
            over += 1;
        }
    }
    let span_mismatch = (a.offset != b.offset || a.bytes.len() != b.bytes.len()).then(|| {
        format!(
            "written spans differ: {}+{} vs {}+{}",
            a.offset,
            a.bytes.len(),
            b.offset,
            b.bytes.len()
        )
    });
    BindingDiff {
        binding,
        max_abs,
        over,
        count: n,
        span_mismatch,
    }
}

/// One matched dispatch that differs.
#[derive(Clone, Debug)]
pub struct DispatchDiff {
    /// Position in the first trace.
    pub index: usize,
    /// Export name.
    pub name: String,
    /// Occurrence of the name (0 for the first).
    pub occurrence: usize,
    /// The bindings that differ.
    pub bindings: Vec<BindingDiff>,
}

/// The comparison of two traces.
#[derive(Debug, Default)]
pub struct Report {
    /// Dispatches in each trace.
    pub counts: (usize, usize),
    /// Dispatches of the first trace with no counterpart in the second.
    pub unmatched: Vec<String>,
    /// Matched dispatches whose outputs differ, in the first trace's order.
    pub differing: Vec<DispatchDiff>,
}

/// Matches `a` and `b` by (export name, occurrence) and compares what
/// each matched pair wrote.
pub fn compare(a: &[DispatchRecord], b: &[DispatchRecord], atol: f64, rtol: f64) -> Report {
    let mut by_key: HashMap<(&str, usize), &DispatchRecord> = HashMap::new();
    let mut seen: HashMap<&str, usize> = HashMap::new();
    for r in b {
        let n = seen.entry(&r.name).or_default();
        by_key.insert((&r.name, *n), r);
        *n += 1;
    }
    let mut report = Report {
        counts: (a.len(), b.len()),
        ..Report::default()
    };
    let mut seen: HashMap<&str, usize> = HashMap::new();
    for (index, r) in a.iter().enumerate() {
        let n = seen.entry(&r.name).or_default();
        let occurrence = *n;
        *n += 1;
        let Some(other) = by_key.get(&(r.name.as_str(), occurrence)) else {
            report.unmatched.push(format!("{} #{occurrence}", r.name));
            continue;
        };
        let bindings: Vec<BindingDiff> = r
            .bindings
            .iter()
            .zip(&other.bindings)
            .enumerate()
            .map(|(i, (x, y))| compare_spans(i, x, y, atol, rtol))
            .filter(|d| d.over > 0 || d.span_mismatch.is_some())
            .collect();
        if !bindings.is_empty() {
            report.differing.push(DispatchDiff {
                index,
                name: r.name.clone(),
                occurrence,
                bindings,
            });
        }
    }
    report
}

impl Report {
    /// The report as text: counts, the first differing dispatch (the one
    /// to look at) and up to `max` more.
    pub fn text(&self, a: &str, b: &str, max: usize) -> String {
        let mut s = String::new();
        let _ = writeln!(
            s,
            "dispatch comparison: {} dispatches on {a}, {} on {b}; {} differ, {} unmatched",
            self.counts.0,
            self.counts.1,
            self.differing.len(),
            self.unmatched.len()
        );
        for (k, d) in self.differing.iter().take(max.max(1)).enumerate() {
            let _ = writeln!(
                s,
                "{} dispatch #{} {} (occurrence {}):",
                if k == 0 {
                    "FIRST DIFFERING"
                } else {
                    "differing"
                },
                d.index,
                d.name,
                d.occurrence
            );
            for b in &d.bindings {
                let _ =
                    writeln!(
                    s,
                    "  binding {}: {} of {} elements (as f32) over threshold, max |diff| {:.3e}{}",
                    b.binding,
                    b.over,
                    b.count,
                    b.max_abs,
                    b.span_mismatch.as_deref().map(|m| format!("; {m}")).unwrap_or_default()
                );
            }
        }
        for u in self.unmatched.iter().take(max) {
            let _ = writeln!(s, "unmatched on {b}: {u}");
        }
        if self.differing.is_empty() {
            let _ = writeln!(
                s,
                "every matched dispatch wrote the same values (within the threshold)"
            );
        }
        s
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rec(name: &str, vals: &[f32]) -> DispatchRecord {
        DispatchRecord {
            name: name.into(),
            bindings: vec![Written {
                offset: 0,
                bytes: vals.iter().flat_map(|v| v.to_le_bytes()).collect(),
            }],
        }
    }

    #[test]
    fn finds_first_differing_dispatch() {
        let a = vec![
            rec("d0", &[1.0, 2.0]),
            rec("d1", &[3.0, 4.0]),
            rec("d1", &[5.0, 6.0]),
        ];
        let b = vec![
            rec("d0", &[1.0, 2.0]),
            rec("d1", &[3.0, 4.0]),
            rec("d1", &[5.0, 6.5]),
        ];
        let r = compare(&a, &b, 1e-6, 0.0);
        assert_eq!(r.differing.len(), 1);
        assert_eq!(r.differing[0].index, 2);
        assert_eq!(r.differing[0].occurrence, 1);
        assert_eq!(r.differing[0].bindings[0].max_abs, 0.5);
        assert!(r
            .text("x", "y", 3)
            .contains("FIRST DIFFERING dispatch #2 d1"));
        let same = compare(&a, &a, 0.0, 0.0);
        assert!(same.differing.is_empty());
        let nan = compare(&[rec("d", &[f32::NAN])], &[rec("d", &[1.0])], 1.0, 0.0);
        assert_eq!(nan.differing[0].bindings[0].max_abs, f64::INFINITY);
    }
}
