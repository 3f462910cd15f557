//! Kernel timings, a diagnostic: with `FERRITE_CUDA_KERNEL_TIMES=1` a
//! device brackets every kernel it launches with two timing events and,
//! when it is released, prints to stderr the GPU time of each kernel
//! (launches, total, mean, share) and the kernel time per command-buffer
//! execution. Set it to see whether a program is bound by its kernels or
//! by what happens between them: compare the kernel time per execution
//! with the wall time per call.
//!
//! While it is on, every command buffer is replayed on the stream (no CUDA
//! graphs: a graph's kernels cannot be timed one by one), so independent
//! kernels of a stage run one after another; timing events also cost the
//! host a little per launch. The figures are therefore per-kernel GPU
//! times, not the speed of the normal path.

use crate::ffi::{self, Api, CUevent, CUstream};
use ferrite_base::Result;
use parking_lot::Mutex;
use std::collections::HashMap;
use std::sync::{Arc, OnceLock};

/// The environment variable that turns kernel timing on.
pub const VAR: &str = "FERRITE_CUDA_KERNEL_TIMES";

/// Launches recorded at most (beyond it timing stops, and the report says
/// so): a long run should not grow without bound.
const MAX_SAMPLES: usize = 1 << 20;

/// Whether `FERRITE_CUDA_KERNEL_TIMES` is set to something other than 0.
pub fn enabled() -> bool {
    static ON: OnceLock<bool> = OnceLock::new();
    *ON.get_or_init(|| std::env::var(VAR).is_ok_and(|v| !v.is_empty() && v != "0"))
}

struct Sample {
    name: Arc<str>,
    start: CUevent,
    end: CUevent,
}

#[derive(Default)]
struct State {
    samples: Vec<Sample>,
    /// Command-buffer executions that launched at least one kernel.
    executions: u64,
    dropped: u64,
}

/// One device's recorded launches.
#[derive(Default)]
pub(crate) struct KernelTimes {
    state: Mutex<State>,
}

// SAFETY: the event handles are plain driver handles, used with the
// device's context current; the driver's event calls are thread-safe.
unsafe impl Send for KernelTimes {}
// SAFETY: see above; the samples are behind a mutex.
unsafe impl Sync for KernelTimes {}

impl KernelTimes {
    /// Records a timing event on `stream` before a launch; None once the
    /// sample limit is reached. The context must be current.
    pub(crate) fn begin(&self, api: &Api, stream: CUstream) -> Result<Option<CUevent>> {
        if self.state.lock().samples.len() >= MAX_SAMPLES {
            self.state.lock().dropped += 1;
            return Ok(None);
        }
        record(api, stream).map(Some)
    }

    /// Records the closing event of a launch begun with `start`.
    pub(crate) fn end(
        &self,
        api: &Api,
        stream: CUstream,
        name: &Arc<str>,
        start: Option<CUevent>,
    ) -> Result<()> {
        let Some(start) = start else {
            return Ok(());
        };
        let end = record(api, stream)?;
        self.state.lock().samples.push(Sample {
            name: name.clone(),
            start,
            end,
        });
        Ok(())
    }

    /// Counts a command-buffer execution that launched kernels.
    pub(crate) fn execution(&self) {
        self.state.lock().executions += 1;
    }

    /// Prints the report (see the module docs) and destroys the events.
    /// The stream must have passed every recorded launch (the device
    /// synchronizes before calling this) and the context must be current.
    pub(crate) fn report(&self, api: &Api, ordinal: i32) {
        let mut state = self.state.lock();
        let mut per: HashMap<Arc<str>, (u64, f64)> = HashMap::new();
        let mut total_ms = 0.0f64;
        let mut unreadable = 0u64;
        for s in state.samples.drain(..) {
            let mut ms = 0.0f32;
            // SAFETY: both events were recorded on this context's queue
            // stream, which has passed them; destroyed once, here.
            let r = unsafe {
                let r = (api.cuEventElapsedTime)(&mut ms, s.start, s.end);
                (api.cuEventDestroy_v2)(s.start);
                (api.cuEventDestroy_v2)(s.end);
                r
            };
            if r != ffi::CUDA_SUCCESS {
                unreadable += 1;
                continue;
            }
            let e = per.entry(s.name).or_default();
            e.0 += 1;
            e.1 += ms as f64;
            total_ms += ms as f64;
        }
        let launches: u64 = per.values().map(|v| v.0).sum();
        let mut rows: Vec<_> = per.into_iter().collect();
        rows.sort_by(|a, b| b.1 .1.total_cmp(&a.1 .1));
        let mut out = format!(
            "cuda://{ordinal} kernel times ({VAR}; graphs off, kernels serialized): {launches} launches, {total_ms:.3} ms of kernel time in {} command-buffer executions ({:.3} ms per execution)",
            state.executions,
            total_ms / state.executions.max(1) as f64
        );
        if state.dropped > 0 || unreadable > 0 {
            out += &format!(
                "; {} launches not timed (limit {MAX_SAMPLES}), {unreadable} unreadable",
                state.dropped
            );
        }
        out += "\n  kernel                                                   launches   total_ms    mean_us   share\n";
        for (name, (n, ms)) in rows {
            out += &format!(
                "  {:<56} {:>8} {:>10.3} {:>10.1} {:>6.1}%\n",
                name,
                n,
                ms,
                ms * 1e3 / n as f64,
                100.0 * ms / total_ms.max(f64::MIN_POSITIVE)
            );
        }
        eprint!("{out}");
    }
}

/// A timing event recorded on `stream` (context current).
fn record(api: &Api, stream: CUstream) -> Result<CUevent> {
    let mut e: CUevent = std::ptr::null_mut();
    ffi::check(
        // SAFETY: valid out-pointer; the caller made the context current.
        unsafe { (api.cuEventCreate)(&mut e, ffi::CU_EVENT_DEFAULT) },
        "creating a timing event",
    )?;
    // SAFETY: a fresh event of this context and a stream of it.
    let r = unsafe { (api.cuEventRecord)(e, stream) };
    if r != ffi::CUDA_SUCCESS {
        // SAFETY: created above, not recorded.
        unsafe { (api.cuEventDestroy_v2)(e) };
        return Err(ffi::to_status(r, "recording a timing event"));
    }
    Ok(e)
}
