//! What the tests of calls as futures share (`async_calls.rs` on the CPU
//! devices, `async_calls_gpu.rs` on `cuda`): the program's arguments and
//! expected results, a time bound, gates and memory counts.
#![allow(dead_code)]

use std::sync::mpsc;
use std::sync::Arc;
use std::time::{Duration, Instant};

use ferrite::{Fence, Semaphore, Session, Tensor, Value};

/// Elements of `tests/hal/async_axpy.mlir`'s vectors.
pub const N: usize = 256;

/// The arguments of call `i`: distinct per call, so mixed-up results
/// show. Every value is a small multiple of 0.5, so `a * x + y` is exact
/// in f32 with or without a fused multiply-add.
pub fn args(i: usize) -> Vec<Value> {
    let (a, x, y) = operands(i);
    vec![
        Value::F32(a),
        Tensor::from_f32(&[N as u64], &x).unwrap().into(),
        Tensor::from_f32(&[N as u64], &y).unwrap().into(),
    ]
}

fn operands(i: usize) -> (f32, Vec<f32>, Vec<f32>) {
    let x: Vec<f32> = (0..N).map(|k| (k + i) as f32 * 0.5).collect();
    let y: Vec<f32> = (0..N).map(|k| (k * 3 + 7 * i) as f32).collect();
    (1.0 + i as f32, x, y)
}

/// `a * x + y` for call `i`, worked out here.
pub fn formula(i: usize) -> Vec<f32> {
    let (a, x, y) = operands(i);
    x.iter().zip(&y).map(|(x, y)| a * x + y).collect()
}

/// The single tensor result of a call.
pub fn f32s(out: &[Value]) -> Vec<f32> {
    assert_eq!(out.len(), 1);
    out[0].as_tensor().unwrap().to_f32_vec().unwrap()
}

/// Runs `f` on a thread and fails the test if it takes longer than
/// `limit` (a lost wake-up would otherwise hang the test forever).
pub fn bounded<T: Send + 'static>(limit: Duration, f: impl FnOnce() -> T + Send + 'static) -> T {
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(f());
    });
    rx.recv_timeout(limit)
        .unwrap_or_else(|_| panic!("did not finish within {limit:?}: a wake-up was lost"))
}

/// A semaphore at 0 and a fence at its value 1: a gate to hold calls
/// behind.
pub fn gate() -> (Arc<Semaphore>, Arc<Fence>) {
    let s = Semaphore::new(0);
    (s.clone(), Arc::new(Fence::create_at(s, 1)))
}

/// Live bytes of the session's first device's allocators (arguments, and
/// results the program allocates on the queue).
pub fn live_bytes(session: &Session) -> u64 {
    let d = &session.devices()[0].hal().0;
    [d.allocator().statistics(), d.queue_allocator().statistics()]
        .iter()
        .map(|s| {
            (s.host_bytes_allocated + s.device_bytes_allocated)
                - (s.host_bytes_freed + s.device_bytes_freed)
        })
        .sum()
}

/// Waits (bounded) until `done` holds, polling.
pub fn eventually(what: &str, mut done: impl FnMut() -> bool) {
    let start = Instant::now();
    while !done() {
        assert!(
            start.elapsed() < Duration::from_secs(20),
            "timed out waiting until {what}"
        );
        std::thread::sleep(Duration::from_millis(2));
    }
}
