//! Stopping a recording while a CPU device's queue work runs (issue 28):
//! the recording waits for that work and holds its span, so an operation
//! running when `end_profiling` (or the end of a tool's run) stops the
//! recording is not lost. Work running at the stop is detected with
//! `trace::pending_work`, and the span must end after the stop began.

use ferrite_base::trace;
use ferrite_base::Timeout;
use ferrite_hal::allocator::BufferParams;
use ferrite_hal::device::{queue, Device};
use ferrite_hal::fence::Fence;
use ferrite_hal::memory::{BufferUsage, MemoryType};
use ferrite_hal::semaphore::Semaphore;
use ferrite_hal_cpu::CpuDevice;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Long enough (a first-touch fill of this many bytes) that it is still
/// running when the test stops the recording right after it began.
const BYTES: u64 = 256 << 20;

#[test]
fn a_queue_operation_running_when_the_recording_stops_is_in_it() {
    let dev: Arc<dyn Device> = CpuDevice::local_task(1).expect("local-task device");
    let params = BufferParams::new(MemoryType::DEVICE_LOCAL, BufferUsage::DEFAULT);
    let target = dev.allocator().allocate(&params, BYTES).unwrap();
    let s = Semaphore::new(0);
    trace::start().unwrap();
    queue::fill(
        &dev,
        &Fence::new(),
        &Fence::create_at(s.clone(), 1),
        target.clone(),
        0,
        BYTES,
        vec![7],
    )
    .unwrap();
    // The fill runs on a worker: wait until it has begun.
    let deadline = Instant::now() + Duration::from_secs(10);
    while trace::pending_work() == 0 && Instant::now() < deadline {
        std::thread::yield_now();
    }
    let stop_begun = trace::now_ns();
    let recorded = trace::stop().unwrap();
    s.wait(1, Timeout::INFINITE).unwrap();
    let fills: Vec<&trace::Event> = recorded
        .events
        .iter()
        .filter(|e| e.cat == "queue" && e.name == "fill")
        .collect();
    assert_eq!(fills.len(), 1, "{:#?}", recorded.events);
    let fill = fills[0];
    assert!(
        fill.ts_ns + fill.dur_ns > stop_begun,
        "the fill ended before the stop began ({fill:?}, stop at {stop_begun}): the test did not stop the recording while it ran"
    );
    assert_eq!(trace::pending_work(), 0);
}
