//! The benchmark runner `benchmark-module` uses (as upstream's tool
//! drives google benchmark): a warm-up call, the call count calibrated to
//! `--benchmark_min_time`, timed repetitions with wall and process CPU
//! time, aggregates over repetitions, and google benchmark's console and
//! JSON reports.

use ferrite_base::{status, Result};
use std::time::{Duration, Instant};

/// How long each repetition runs (`--benchmark_min_time`).
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum MinTime {
    /// At least this many seconds (`0.5s`): the call count is calibrated.
    Seconds(f64),
    /// Exactly this many calls (`100x`).
    Iterations(u64),
}

impl MinTime {
    /// Parses google benchmark's syntax: `<float>s` or `<integer>x`.
    pub fn parse(s: &str) -> Result<MinTime> {
        let bad = || {
            status!(
                InvalidArgument,
                "--benchmark_min_time '{s}': expected `<float>s` or `<integer>x`"
            )
        };
        if let Some(n) = s.strip_suffix('x') {
            return Ok(MinTime::Iterations(n.parse().map_err(|_| bad())?));
        }
        let v = s.strip_suffix('s').unwrap_or(s);
        Ok(MinTime::Seconds(v.parse().map_err(|_| bad())?))
    }
}

/// One row of the report: a repetition or an aggregate over them.
#[derive(Clone, Debug)]
pub struct Row {
    /// The row's name (`BM_f/process_time/real_time`, `..._mean`).
    pub name: String,
    /// The benchmark's name.
    pub run_name: String,
    /// `None` for a repetition, else `mean`, `median`, `stddev` or `cv`.
    pub aggregate: Option<&'static str>,
    /// Repetitions of the benchmark.
    pub repetitions: usize,
    /// Which repetition (0 for aggregates).
    pub repetition_index: usize,
    /// Calls timed (for aggregates, the repetitions).
    pub iterations: u64,
    /// Per-call wall time in nanoseconds (for `cv`, a ratio).
    pub real: f64,
    /// Per-call process CPU time in nanoseconds (for `cv`, a ratio).
    pub cpu: f64,
    /// Calls per second of wall time.
    pub items_per_second: f64,
}

/// A per-call time as google benchmark's console prints it.
pub fn fmt_time(ns: f64) -> String {
    if ns >= 1e6 {
        format!("{:.3} ms", ns / 1e6)
    } else if ns >= 1e3 {
        format!("{:.3} us", ns / 1e3)
    } else {
        format!("{:.1} ns", ns)
    }
}

/// Mean, median and sample standard deviation.
fn stats(v: &[f64]) -> (f64, f64, f64) {
    let n = v.len() as f64;
    let mean = v.iter().sum::<f64>() / n;
    let mut s = v.to_vec();
    s.sort_by(|a, b| a.partial_cmp(b).unwrap_or(std::cmp::Ordering::Equal));
    let median = if s.len() % 2 == 1 {
        s[s.len() / 2]
    } else {
        (s[s.len() / 2 - 1] + s[s.len() / 2]) / 2.0
    };
    let var = if v.len() > 1 {
        v.iter().map(|x| (x - mean) * (x - mean)).sum::<f64>() / (n - 1.0)
    } else {
        0.0
    };
    (mean, median, var.sqrt())
}

/// CPU time consumed by this process (all threads), in nanoseconds.
fn process_cpu_ns() -> f64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid, writable timespec owned by this frame, and
    // CLOCK_PROCESS_CPUTIME_ID is a clock every Linux kernel provides.
    let rc = unsafe { libc::clock_gettime(libc::CLOCK_PROCESS_CPUTIME_ID, &mut ts) };
    if rc != 0 {
        return 0.0;
    }
    ts.tv_sec as f64 * 1e9 + ts.tv_nsec as f64
}

/// Times `call`: one warm-up call, then `repetitions` timed runs of the
/// same number of calls (`min_time`); returns a row per repetition and,
/// for several repetitions, the mean, median, stddev and cv rows.
pub fn measure(
    run_name: &str,
    repetitions: usize,
    min_time: MinTime,
    mut call: impl FnMut() -> Result<()>,
) -> Result<Vec<Row>> {
    // Warm-up: first-call costs (executable loading, pools) stay out.
    let warm = Instant::now();
    call()?;
    let first = warm.elapsed();
    let iterations = match min_time {
        MinTime::Iterations(n) => n.max(1),
        MinTime::Seconds(s) => {
            // Calibrate on a short run, then size repetitions to `s`.
            let mut n = 1u64;
            let mut took = first;
            while took < Duration::from_millis(20) && n < 1 << 30 {
                n *= 4;
                let t = Instant::now();
                for _ in 0..n {
                    call()?;
                }
                took = t.elapsed();
            }
            let per = took.as_secs_f64() / n as f64;
            ((s / per.max(1e-9)).ceil() as u64).max(1)
        }
    };
    let run_name = run_name.to_string();
    let repetitions = repetitions.max(1);
    let mut rows = Vec::new();
    for index in 0..repetitions {
        let cpu0 = process_cpu_ns();
        let t = Instant::now();
        for _ in 0..iterations {
            call()?;
        }
        let wall = t.elapsed().as_secs_f64();
        let cpu = process_cpu_ns() - cpu0;
        rows.push(Row {
            name: run_name.clone(),
            run_name: run_name.clone(),
            aggregate: None,
            repetitions,
            repetition_index: index,
            iterations,
            real: wall * 1e9 / iterations as f64,
            cpu: cpu / iterations as f64,
            items_per_second: iterations as f64 / wall.max(1e-12),
        });
    }
    if repetitions > 1 {
        let real: Vec<f64> = rows.iter().map(|r| r.real).collect();
        let cpu: Vec<f64> = rows.iter().map(|r| r.cpu).collect();
        let ips: Vec<f64> = rows.iter().map(|r| r.items_per_second).collect();
        let (rm, rmed, rsd) = stats(&real);
        let (cm, cmed, csd) = stats(&cpu);
        let (im, imed, isd) = stats(&ips);
        let ratio = |sd: f64, mean: f64| if mean > 0.0 { sd / mean } else { 0.0 };
        for (agg, real, cpu, items) in [
            ("mean", rm, cm, im),
            ("median", rmed, cmed, imed),
            ("stddev", rsd, csd, isd),
            ("cv", ratio(rsd, rm), ratio(csd, cm), ratio(isd, im)),
        ] {
            rows.push(Row {
                name: format!("{run_name}_{agg}"),
                run_name: run_name.clone(),
                aggregate: Some(agg),
                repetitions,
                repetition_index: 0,
                iterations: repetitions as u64,
                real,
                cpu,
                items_per_second: items,
            });
        }
    }
    Ok(rows)
}

/// Google benchmark's console table (times per call; `cv` in percent).
pub fn console_report(rows: &[Row]) -> String {
    let w = rows.iter().map(|r| r.name.len()).max().unwrap_or(9) + 4;
    let rule = "-".repeat(w + 62);
    let mut out = format!(
        "{rule}\n{:<w$}{:>15}{:>15}{:>13} UserCounters...\n{rule}\n",
        "Benchmark", "Time", "CPU", "Iterations"
    );
    for r in rows {
        let (time, cpu, items) = if r.aggregate == Some("cv") {
            (
                format!("{:.2} %", r.real * 100.0),
                format!("{:.2} %", r.cpu * 100.0),
                format!("{:.2}%", r.items_per_second * 100.0),
            )
        } else {
            (
                fmt_time(r.real),
                fmt_time(r.cpu),
                format!("{:.6}k/s", r.items_per_second / 1e3),
            )
        };
        out.push_str(&format!(
            "{:<w$}{time:>15}{cpu:>15}{:>13} items_per_second={items}\n",
            r.name, r.iterations
        ));
    }
    out
}

/// Google benchmark's JSON report (schema version 1; times in ms).
pub fn json_report(rows: &[Row]) -> String {
    let benchmarks: Vec<serde_json::Value> = rows
        .iter()
        .map(|r| {
            let mut o = serde_json::Map::new();
            o.insert("name".into(), r.name.clone().into());
            o.insert("family_index".into(), 0.into());
            o.insert("per_family_instance_index".into(), 0.into());
            o.insert("run_name".into(), r.run_name.clone().into());
            let run_type = if r.aggregate.is_some() {
                "aggregate"
            } else {
                "iteration"
            };
            o.insert("run_type".into(), run_type.into());
            o.insert("repetitions".into(), r.repetitions.into());
            if let Some(agg) = r.aggregate {
                o.insert("threads".into(), 1.into());
                o.insert("aggregate_name".into(), agg.into());
                let unit = if agg == "cv" { "percentage" } else { "time" };
                o.insert("aggregate_unit".into(), unit.into());
            } else {
                o.insert("repetition_index".into(), r.repetition_index.into());
                o.insert("threads".into(), 1.into());
            }
            o.insert("iterations".into(), r.iterations.into());
            // A `cv` row holds ratios, which google benchmark leaves unscaled.
            let scale = if r.aggregate == Some("cv") { 1.0 } else { 1e-6 };
            o.insert("real_time".into(), (r.real * scale).into());
            o.insert("cpu_time".into(), (r.cpu * scale).into());
            o.insert("time_unit".into(), "ms".into());
            o.insert("items_per_second".into(), r.items_per_second.into());
            serde_json::Value::Object(o)
        })
        .collect();
    let context = serde_json::json!({
        "executable": std::env::current_exe().map(|p| p.display().to_string()).unwrap_or_default(),
        "num_cpus": std::thread::available_parallelism().map_or(1, |n| n.get()),
        "library_build_type": if cfg!(debug_assertions) { "debug" } else { "release" },
        "json_schema_version": 1,
    });
    let report = serde_json::json!({ "context": context, "benchmarks": benchmarks });
    serde_json::to_string_pretty(&report).unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn min_time_syntax() {
        assert_eq!(MinTime::parse("100x").unwrap(), MinTime::Iterations(100));
        assert_eq!(MinTime::parse("0.25s").unwrap(), MinTime::Seconds(0.25));
        assert_eq!(MinTime::parse("2").unwrap(), MinTime::Seconds(2.0));
        let e = MinTime::parse("fast").unwrap_err();
        assert!(e.to_string().contains("--benchmark_min_time 'fast'"), "{e}");
    }

    #[test]
    fn repetitions_and_aggregates() {
        let mut calls = 0u64;
        let rows = measure("BM_f", 3, MinTime::Iterations(5), || {
            calls += 1;
            Ok(())
        })
        .unwrap();
        assert_eq!(calls, 1 + 3 * 5, "one warm-up call, then 3 x 5");
        let names: Vec<&str> = rows.iter().map(|r| r.name.as_str()).collect();
        assert_eq!(
            names,
            [
                "BM_f",
                "BM_f",
                "BM_f",
                "BM_f_mean",
                "BM_f_median",
                "BM_f_stddev",
                "BM_f_cv"
            ]
        );
        assert!(rows[..3]
            .iter()
            .all(|r| r.iterations == 5 && r.aggregate.is_none()));
        let json = json_report(&rows);
        assert_eq!(json.matches("\"run_type\": \"aggregate\"").count(), 4);
        assert!(console_report(&rows).contains("BM_f_cv"));
        // A failing call stops the run with its error.
        let e = measure("BM_g", 1, MinTime::Iterations(2), || {
            Err(ferrite_base::status!(Internal, "boom"))
        })
        .unwrap_err();
        assert!(e.to_string().contains("boom"));
    }
}
