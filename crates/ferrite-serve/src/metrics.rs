//! `/metrics`: the server's counters in Prometheus' text format
//! (prometheus-client): requests by endpoint and status, queue depth,
//! running sequences and the batch size of each decode step, prompt and
//! generated tokens, decode tokens/s, time to first token, inter-token
//! latency, device memory (where the engine reports it), the process'
//! resident memory and its heap bytes in use (glibc).

use std::sync::atomic::AtomicU64;

use prometheus_client::encoding::text::encode;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::Registry;

/// Labels of a request count.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RequestLabels {
    /// The route (`/v1/chat/completions`, ...; `other` for unknown paths).
    pub endpoint: String,
    /// The HTTP status answered.
    pub status: u16,
}

/// Labels of a per-device value.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct DeviceLabels {
    /// The device's name.
    pub device: String,
    /// `device_local` or `host_local` (the allocator's two heaps).
    pub memory: String,
}

/// Every metric the server exports.
pub struct Metrics {
    registry: Registry,
    /// Requests answered, by endpoint and status.
    pub requests: Family<RequestLabels, Counter>,
    /// Generation requests waiting for a slot.
    pub queue_depth: Gauge,
    /// Sequences holding a slot (prefilling or decoding).
    pub running: Gauge,
    /// Sequences in each batched decode step.
    pub batch_size: Histogram,
    /// Prompt tokens prefilled.
    pub prompt_tokens: Counter,
    /// Tokens generated.
    pub generated_tokens: Counter,
    /// Decode tokens per second over the last second of work.
    pub tokens_per_second: Gauge<f64, AtomicU64>,
    /// Seconds from a request's arrival to its first token.
    pub time_to_first_token: Histogram,
    /// Seconds between consecutive tokens of one sequence.
    pub inter_token_latency: Histogram,
    /// Generations ended because their client went away.
    pub cancelled: Counter,
    /// Live allocator bytes per device and heap.
    pub device_memory: Family<DeviceLabels, Gauge>,
    /// Resident memory of the process, bytes.
    pub resident_memory: Gauge,
    /// Bytes in use in glibc malloc's heap (all arenas and mmapped
    /// chunks): a leak grows it, allocator fragmentation grows only the
    /// resident memory. Absent where the C library is not glibc.
    pub heap_in_use: Gauge,
}

impl Default for Metrics {
    fn default() -> Self {
        Metrics::new()
    }
}

impl Metrics {
    /// A fresh registry with every metric registered.
    pub fn new() -> Metrics {
        let mut registry = Registry::with_prefix("ferrite");
        let m = Metrics {
            requests: Family::default(),
            queue_depth: Gauge::default(),
            running: Gauge::default(),
            batch_size: Histogram::new([1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0, 128.0]),
            prompt_tokens: Counter::default(),
            generated_tokens: Counter::default(),
            tokens_per_second: Gauge::default(),
            time_to_first_token: Histogram::new(exponential_buckets(0.005, 2.0, 14)),
            inter_token_latency: Histogram::new(exponential_buckets(0.001, 2.0, 14)),
            cancelled: Counter::default(),
            device_memory: Family::default(),
            resident_memory: Gauge::default(),
            heap_in_use: Gauge::default(),
            registry: Registry::default(),
        };
        registry.register(
            "requests",
            "HTTP requests answered, by endpoint and status",
            m.requests.clone(),
        );
        registry.register(
            "queue_depth",
            "generation requests waiting for a slot",
            m.queue_depth.clone(),
        );
        registry.register(
            "running_sequences",
            "sequences holding a KV-cache slot",
            m.running.clone(),
        );
        registry.register(
            "batch_size",
            "sequences in each batched decode step",
            m.batch_size.clone(),
        );
        registry.register(
            "prompt_tokens",
            "prompt tokens prefilled",
            m.prompt_tokens.clone(),
        );
        registry.register(
            "generated_tokens",
            "tokens generated",
            m.generated_tokens.clone(),
        );
        registry.register(
            "decode_tokens_per_second",
            "decode tokens per second over the last second of work (0 when idle)",
            m.tokens_per_second.clone(),
        );
        registry.register(
            "time_to_first_token_seconds",
            "seconds from a request's arrival to its first token",
            m.time_to_first_token.clone(),
        );
        registry.register(
            "inter_token_latency_seconds",
            "seconds between consecutive tokens of one sequence",
            m.inter_token_latency.clone(),
        );
        registry.register(
            "cancelled_generations",
            "generations ended because the client went away",
            m.cancelled.clone(),
        );
        registry.register(
            "device_memory_bytes",
            "live allocator bytes per device and heap (device_local, host_local)",
            m.device_memory.clone(),
        );
        registry.register(
            "resident_memory_bytes",
            "resident memory of the server process",
            m.resident_memory.clone(),
        );
        if heap_in_use_bytes().is_some() {
            registry.register(
                "heap_in_use_bytes",
                "bytes in use in the C library's malloc heap (glibc: all arenas and mmapped chunks)",
                m.heap_in_use.clone(),
            );
        }
        Metrics { registry, ..m }
    }

    /// The Prometheus text exposition of every metric.
    pub fn render(&self) -> String {
        if let Some(rss) = resident_bytes() {
            self.resident_memory.set(rss as i64);
        }
        if let Some(heap) = heap_in_use_bytes() {
            self.heap_in_use
                .set(i64::try_from(heap).unwrap_or(i64::MAX));
        }
        let mut out = String::new();
        // Writing into a String cannot fail.
        let _ = encode(&mut out, &self.registry);
        out
    }
}

/// The process' resident set size from `/proc/self/statm` (Linux); None
/// elsewhere.
fn resident_bytes() -> Option<u64> {
    let statm = std::fs::read_to_string("/proc/self/statm").ok()?;
    let pages: u64 = statm.split_whitespace().nth(1)?.parse().ok()?;
    Some(pages * 4096)
}

/// glibc's `struct mallinfo2` (glibc 2.33 and later): every field a
/// `size_t`.
#[cfg(all(target_os = "linux", target_env = "gnu"))]
#[repr(C)]
#[allow(
    dead_code,
    reason = "the C struct's layout; two of its fields are read"
)]
struct MallInfo2 {
    arena: usize,
    ordblks: usize,
    smblks: usize,
    hblks: usize,
    hblkhd: usize,
    usmblks: usize,
    fsmblks: usize,
    uordblks: usize,
    fordblks: usize,
    keepcost: usize,
}

#[cfg(all(target_os = "linux", target_env = "gnu"))]
unsafe extern "C" {
    fn mallinfo2() -> MallInfo2;
}

/// Bytes in use in malloc's heap: allocated chunks of every arena plus
/// mmapped chunks (what `malloc_stats()` prints as "in use bytes").
#[cfg(all(target_os = "linux", target_env = "gnu"))]
fn heap_in_use_bytes() -> Option<u64> {
    // SAFETY: mallinfo2 takes no arguments and returns a plain struct by
    // value; it only reads the allocator's statistics under its own locks
    // and may be called from any thread at any time.
    let m = unsafe { mallinfo2() };
    Some((m.uordblks + m.hblkhd) as u64)
}

/// Not glibc: no portable way to ask the allocator.
#[cfg(not(all(target_os = "linux", target_env = "gnu")))]
fn heap_in_use_bytes() -> Option<u64> {
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_exposition_names_every_metric() {
        let m = Metrics::new();
        m.requests
            .get_or_create(&RequestLabels {
                endpoint: "/v1/completions".into(),
                status: 200,
            })
            .inc();
        m.queue_depth.set(3);
        m.batch_size.observe(4.0);
        let text = m.render();
        for name in [
            "ferrite_requests_total{endpoint=\"/v1/completions\",status=\"200\"} 1",
            "ferrite_queue_depth 3",
            "ferrite_running_sequences",
            "ferrite_batch_size_count 1",
            "ferrite_generated_tokens_total",
            "ferrite_decode_tokens_per_second",
            "ferrite_time_to_first_token_seconds_bucket",
            "ferrite_inter_token_latency_seconds_bucket",
            "ferrite_resident_memory_bytes",
        ] {
            assert!(text.contains(name), "{name} missing from:\n{text}");
        }
    }

    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    #[test]
    fn the_heap_gauge_follows_allocations() {
        let m = Metrics::new();
        let gauge = |m: &Metrics| -> i64 {
            let text = m.render();
            let line = text
                .lines()
                .find(|l| l.starts_with("ferrite_heap_in_use_bytes "))
                .unwrap_or_else(|| panic!("no heap gauge in:\n{text}"));
            line.rsplit(' ').next().unwrap().parse().unwrap()
        };
        let before = gauge(&m);
        // 64 MiB, touched so that it is really allocated.
        let big = vec![1u8; 64 << 20];
        let during = gauge(&m);
        assert!(big.iter().all(|&b| b == 1));
        drop(big);
        let after = gauge(&m);
        // Other tests allocate concurrently: compare with a wide margin.
        assert!(during - before > 48 << 20, "{before} -> {during}");
        assert!(during - after > 48 << 20, "{during} -> {after}");
    }
}
