//! The conformance tests, each a `pub fn(&Harness)` (see the crate docs).
//!
//! `local-sync` runs queue work inline on the submitting thread, waiting for
//! the wait fence first, so tests that gate work on a semaphore submit from a
//! helper thread ([`in_background`]); on other devices the submission
//! returns at once and the same code holds.

use crate::harness::Harness;
use ferrite_base::{Status, StatusCode, Timeout};
use ferrite_hal::allocator::BufferParams;
use ferrite_hal::buffer::Buffer;
use ferrite_hal::command_buffer::{mode, Binding, BufferRef, CommandBuffer};
use ferrite_hal::device::{queue, Device};
use ferrite_hal::executable::{Executable, ExecutableRef};
use ferrite_hal::fence::Fence;
use ferrite_hal::memory::{BufferUsage, MemoryType};
use ferrite_hal::semaphore::Semaphore;
use ferrite_testkit::f32_bytes;
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

/// Generous bound for waits that should finish promptly.
const LONG: Duration = Duration::from_secs(20);

fn long() -> Timeout {
    Timeout::from_duration(LONG)
}

// ---------------------------------------------------------------------------
// Helpers

/// Device-local memory with the default usage (host-visible on the CPU,
/// reached by transfers on a GPU).
fn device_params() -> BufferParams {
    BufferParams::new(MemoryType::DEVICE_LOCAL, BufferUsage::DEFAULT)
}

/// Memory both the host maps and kernels write (pinned host memory on a
/// GPU).
fn host_visible_params() -> BufferParams {
    BufferParams::new(
        MemoryType::DEVICE_LOCAL | MemoryType::HOST_VISIBLE,
        BufferUsage::DEFAULT | BufferUsage::MAPPING,
    )
}

fn new_buffer(dev: &Arc<dyn Device>, size: u64) -> Buffer {
    dev.allocator()
        .allocate(&device_params(), size)
        .expect("allocate")
}

fn buffer_with(dev: &Arc<dyn Device>, bytes: &[u8]) -> Buffer {
    let b = new_buffer(dev, bytes.len() as u64);
    b.write(0, bytes).expect("write");
    b
}

/// A fence at `semaphore >= 1` on a fresh semaphore.
fn fresh_fence() -> (Arc<Semaphore>, Fence) {
    let s = Semaphore::new(0);
    let f = Fence::create_at(s.clone(), 1);
    (s, f)
}

fn direct(buffer: &Buffer, offset: u64, length: u64) -> BufferRef {
    BufferRef::Direct {
        buffer: buffer.clone(),
        offset,
        length,
    }
}

fn slot(slot: u32, offset: u64, length: u64) -> BufferRef {
    BufferRef::Slot {
        slot,
        offset,
        length,
    }
}

fn binding(buffer: &Buffer, offset: u64, length: u64) -> Binding {
    Binding {
        buffer: buffer.clone(),
        offset,
        length,
    }
}

/// Runs `f` on a new thread: submissions that wait on not-yet-reached
/// fences block on `local-sync` (work runs inline) and return at once
/// elsewhere.
fn in_background<R: Send + 'static>(
    f: impl FnOnce() -> R + Send + 'static,
) -> thread::JoinHandle<R> {
    thread::spawn(f)
}

fn assert_failed_with(r: ferrite_base::Result<bool>, code: StatusCode, message: &str, what: &str) {
    match r {
        Err(e) => {
            assert_eq!(e.code(), code, "{what}: {e}");
            assert!(
                e.message().contains(message),
                "{what}: message {:?} does not carry {message:?}",
                e.message()
            );
        }
        Ok(reached) => panic!("{what}: expected failure {code:?}, got Ok({reached})"),
    }
}

/// Little-endian bytes as f32 values.
fn bytes_f32(b: &[u8]) -> Vec<f32> {
    b.chunks_exact(4)
        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect()
}

/// Little-endian bytes as u32 values.
fn bytes_u32(b: &[u8]) -> Vec<u32> {
    b.chunks_exact(4)
        .map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect()
}

fn f32_buffer(dev: &Arc<dyn Device>, v: &[f32]) -> Buffer {
    buffer_with(dev, &f32_bytes(v))
}

/// A finalized command buffer that dispatches export `function` of the add
/// (or mul) fixture once, binding its three operands to table slots 0..3
/// (`bytes` each).
fn add_dispatch(
    loaded: &Arc<dyn Executable>,
    function: u32,
    workgroups: [u32; 3],
    bytes: u64,
) -> CommandBuffer {
    let cb = CommandBuffer::new(0, 3, u64::MAX, 3);
    cb.dispatch(
        ExecutableRef(loaded.clone()),
        function,
        workgroups,
        None,
        vec![],
        (0..3).map(|i| slot(i, 0, bytes)).collect(),
    )
    .unwrap();
    cb.finalize().unwrap();
    cb
}

fn add_inputs(n: usize, seed: f32) -> (Vec<f32>, Vec<f32>) {
    let a: Vec<f32> = (0..n).map(|i| i as f32 * 0.25 + seed).collect();
    let b: Vec<f32> = (0..n).map(|i| (i % 97) as f32 - 48.5 * seed).collect();
    (a, b)
}

// ---------------------------------------------------------------------------
// Moved from ferrite-hal-cpu's hal_suite (generic parts)

/// Allocation, statistics, host read/write/fill/map, subspans, copies, and range errors.
pub fn allocation_and_host_access(h: &Harness) {
    let dev = h.device.clone();
    let alloc = dev.allocator();
    let before = alloc.statistics();
    let live = |s: ferrite_hal::AllocatorStatistics| {
        (s.host_bytes_allocated + s.device_bytes_allocated)
            - (s.host_bytes_freed + s.device_bytes_freed)
    };
    let b = alloc.allocate(&device_params(), 256).unwrap();
    assert_eq!(b.byte_length(), 256);
    assert_eq!(b.byte_offset(), 0);
    assert!(b.to_vec().unwrap().iter().all(|&x| x == 0), "not zeroed");
    assert!(live(alloc.statistics()) >= live(before) + 256);

    b.write(8, &[1, 2, 3, 4]).unwrap();
    let mut r = [0u8; 4];
    b.read(8, &mut r).unwrap();
    assert_eq!(r, [1, 2, 3, 4]);

    b.fill(16, 16, &0xABCDu16.to_le_bytes()).unwrap();
    assert_eq!(&*b.map_read(16, 4).unwrap(), &[0xCD, 0xAB, 0xCD, 0xAB]);
    {
        let mut m = b.map_write(32, 8).unwrap();
        m.copy_from_slice(&[9, 8, 7, 6, 5, 4, 3, 2]);
    }
    let v = b.to_vec().unwrap();
    assert_eq!(&v[32..40], &[9, 8, 7, 6, 5, 4, 3, 2]);

    // Subspans alias the parent.
    let sub = b.subspan(8, 16).unwrap();
    assert_eq!((sub.byte_offset(), sub.byte_length()), (8, 16));
    assert!(sub.same_allocation(&b));
    let mut r = [0u8; 4];
    sub.read(0, &mut r).unwrap();
    assert_eq!(r, [1, 2, 3, 4]);
    sub.write(4, &[0xEE; 4]).unwrap();
    assert_eq!(&b.to_vec().unwrap()[12..16], &[0xEE; 4]);

    // In-allocation copy (memmove semantics) and between buffers.
    Buffer::copy(&b, 8, &b, 10, 8).unwrap();
    assert_eq!(
        &b.to_vec().unwrap()[8..18],
        &[1, 2, 1, 2, 3, 4, 0xEE, 0xEE, 0xEE, 0xEE]
    );
    let other = alloc.allocate(&device_params(), 64).unwrap();
    Buffer::copy(&b, 32, &other, 60, 4).unwrap();
    assert_eq!(&other.to_vec().unwrap()[60..], &[9, 8, 7, 6]);

    // Out-of-range and misaligned accesses are errors, not crashes.
    let e = b.read(250, &mut [0u8; 8]).unwrap_err();
    assert_eq!(e.code(), StatusCode::OutOfRange, "{e}");
    let e = sub.write(14, &[1, 2, 3]).unwrap_err();
    assert_eq!(e.code(), StatusCode::OutOfRange, "{e}");
    assert!(b.subspan(250, 8).is_err());
    let e = b.fill(2, 8, &[0, 0, 0, 0]).unwrap_err();
    assert_eq!(e.code(), StatusCode::InvalidArgument, "{e}");
    assert!(b.fill(0, 8, &[0, 0, 0]).is_err());
    assert!(Buffer::copy(&b, 200, &other, 0, 64).is_err());

    drop((b, sub, other));
    assert_eq!(live(alloc.statistics()), live(before), "buffers not freed");
}

/// A fill, update and copy chained by fences run in order, and not before the gate.
pub fn queue_chain_ordered_by_fences(h: &Harness) {
    let dev = h.device.clone();
    let target = new_buffer(&dev, 64);
    let copy_out = new_buffer(&dev, 64);
    let (gate, gate_fence) = fresh_fence();
    let (_, f1) = fresh_fence();
    let (_, f2) = fresh_fence();
    let (_, f3) = fresh_fence();
    let submit = in_background({
        let (dev, target, copy_out) = (dev.clone(), target.clone(), copy_out.clone());
        let (f1, f2, f3) = (f1.clone(), f2.clone(), f3.clone());
        move || -> ferrite_base::Result<()> {
            queue::fill(&dev, &gate_fence, &f1, target.clone(), 0, 64, vec![0x11])?;
            queue::update(&dev, &f1, &f2, (1..=8).collect(), target.clone(), 8)?;
            queue::copy(&dev, &f2, &f3, target, 4, copy_out, 32, 16)?;
            Ok(())
        }
    });
    // Nothing may run before the gate opens.
    thread::sleep(Duration::from_millis(20));
    for f in [&f1, &f2, &f3] {
        assert!(!f.query().unwrap(), "work ran before its wait fence");
    }
    assert!(target.to_vec().unwrap().iter().all(|&x| x == 0));
    gate.signal(1).unwrap();
    submit.join().unwrap().expect("submissions");
    assert!(f3.wait(long()).unwrap(), "chain did not finish");
    assert!(f1.query().unwrap() && f2.query().unwrap());

    let t = target.to_vec().unwrap();
    let mut want = vec![0x11u8; 64];
    want[8..16].copy_from_slice(&[1, 2, 3, 4, 5, 6, 7, 8]);
    assert_eq!(t, want);
    let c = copy_out.to_vec().unwrap();
    let mut want_c = vec![0u8; 64];
    want_c[32..48].copy_from_slice(&want[4..20]);
    assert_eq!(c, want_c);
}

/// Queue-ordered allocation and release, and an alloca ordered after a gate.
pub fn queue_alloca_dealloca(h: &Harness) {
    let dev = h.device.clone();
    let alloc = dev.queue_allocator();
    let timeline = Semaphore::new(0);
    let at = |v| Fence::create_at(timeline.clone(), v);
    let (f1, f2, f3) = (at(1), at(2), at(3));
    let buf = queue::alloca(&dev, &Fence::new(), &f1, &device_params(), 1024).unwrap();
    assert_eq!(buf.byte_length(), 1024);
    queue::fill(&dev, &f1, &f2, buf.clone(), 0, 1024, vec![7, 0, 0, 0]).unwrap();
    assert!(f2.wait(long()).unwrap());
    assert_eq!(timeline.query().unwrap(), 2);
    assert_eq!(bytes_u32(&buf.to_vec().unwrap()), vec![7u32; 256]);
    let freed = |s: ferrite_hal::AllocatorStatistics| s.host_bytes_freed + s.device_bytes_freed;
    let before = freed(alloc.statistics());
    queue::dealloca(&dev, &f2, &f3, buf).unwrap();
    assert!(f3.wait(long()).unwrap());
    assert!(
        freed(alloc.statistics()) >= before + 1024,
        "dealloca did not release the buffer: {:?}",
        alloc.statistics()
    );

    // An alloca ordered after a gate: the buffer exists at once, its signal
    // fence is reached only after the gate.
    let (gate, gate_fence) = fresh_fence();
    let (_, ready) = fresh_fence();
    let h = in_background({
        let (dev, ready) = (dev.clone(), ready.clone());
        move || queue::alloca(&dev, &gate_fence, &ready, &BufferParams::default(), 64)
    });
    thread::sleep(Duration::from_millis(10));
    assert!(!ready.query().unwrap());
    gate.signal(1).unwrap();
    let b = h.join().unwrap().unwrap();
    assert!(ready.wait(long()).unwrap());
    assert_eq!(b.byte_length(), 64);
}

/// Fill, update and copy commands on directly recorded buffers; an empty execute is a barrier.
pub fn command_buffer_direct_transfers(h: &Harness) {
    let dev = h.device.clone();
    let a = new_buffer(&dev, 64);
    let b = new_buffer(&dev, 64);
    let cb = CommandBuffer::new(mode::ONE_SHOT, 3, u64::MAX, 0);
    cb.fill_buffer(direct(&a, 0, 32), 0x0403_0201, 4).unwrap();
    cb.update_buffer(vec![9; 8], direct(&a, 32, 8)).unwrap();
    cb.execution_barrier().unwrap();
    cb.copy_buffer(direct(&a, 0, 40), direct(&b, 16, 40))
        .unwrap();
    cb.fill_buffer(direct(&b, 60, 4), 0xFF, 1).unwrap();
    cb.finalize().unwrap();
    let (_, done) = fresh_fence();
    queue::execute(&dev, &Fence::new(), &done, Some(&cb), vec![]).unwrap();
    assert!(done.wait(long()).unwrap());

    let mut want_a = [1u8, 2, 3, 4].repeat(8);
    want_a.extend([9u8; 8]);
    want_a.extend([0u8; 24]);
    assert_eq!(a.to_vec().unwrap(), want_a);
    let mut want_b = vec![0u8; 16];
    want_b.extend(&want_a[..40]);
    want_b.extend([0u8; 4]);
    want_b.extend([0xFF; 4]);
    assert_eq!(b.to_vec().unwrap(), want_b);

    // Executing no command buffer is a barrier.
    let (_, after) = fresh_fence();
    queue::execute(&dev, &done, &after, None, vec![]).unwrap();
    assert!(after.wait(long()).unwrap());
}

/// One reusable recording executed with two different binding tables.
pub fn command_buffer_binding_tables(h: &Harness) {
    let dev = h.device.clone();
    // Reusable (mode 0) with three binding slots.
    let cb = CommandBuffer::new(0, 3, u64::MAX, 3);
    cb.fill_buffer(slot(0, 0, 16), 0xAA, 1).unwrap();
    cb.update_buffer(vec![1, 2, 3, 4], slot(1, 4, 4)).unwrap();
    cb.execution_barrier().unwrap();
    cb.copy_buffer(slot(0, 0, 8), slot(2, 8, 8)).unwrap();
    cb.copy_buffer(slot(1, 0, 8), slot(2, 0, 8)).unwrap();
    cb.finalize().unwrap();

    let expect_x = vec![0xAAu8; 16];
    let mut expect_y = vec![0u8; 16];
    expect_y[4..8].copy_from_slice(&[1, 2, 3, 4]);
    let mut expect_z = vec![0u8; 16];
    expect_z[..8].copy_from_slice(&expect_y[..8]);
    expect_z[8..16].copy_from_slice(&[0xAA; 8]);

    // Table 1: three separate buffers.
    let (x, y, z) = (
        new_buffer(&dev, 16),
        new_buffer(&dev, 16),
        new_buffer(&dev, 16),
    );
    let table1 = vec![
        binding(&x, 0, 16),
        binding(&y, 0, u64::MAX),
        binding(&z, 0, 16),
    ];
    // Table 2: three ranges of one buffer, executed after the first.
    let big = new_buffer(&dev, 64);
    big.fill(0, 64, &[0x55]).unwrap();
    let table2 = vec![
        binding(&big, 0, 16),
        binding(&big, 16, 16),
        binding(&big, 40, 16),
    ];
    let timeline = Semaphore::new(0);
    let (f1, f2) = (
        Fence::create_at(timeline.clone(), 1),
        Fence::create_at(timeline.clone(), 2),
    );
    queue::execute(&dev, &Fence::new(), &f1, Some(&cb), table1).unwrap();
    queue::execute(&dev, &f1, &f2, Some(&cb), table2).unwrap();
    assert!(f2.wait(long()).unwrap());
    assert_eq!(x.to_vec().unwrap(), expect_x);
    assert_eq!(y.to_vec().unwrap(), expect_y);
    assert_eq!(z.to_vec().unwrap(), expect_z);

    let g = big.to_vec().unwrap();
    assert_eq!(&g[0..16], &expect_x[..]);
    // Slot 1 held 0x55 before the update.
    let mut y2 = [0x55u8; 16];
    y2[4..8].copy_from_slice(&[1, 2, 3, 4]);
    assert_eq!(&g[16..32], &y2[..]);
    assert_eq!(&g[32..40], &[0x55; 8]);
    let mut z2 = y2[..8].to_vec();
    z2.extend([0xAA; 8]);
    assert_eq!(&g[40..56], &z2[..]);
    assert_eq!(&g[56..64], &[0x55; 8]);
}

/// Recording validates ranges and slots; unfinalized buffers are refused.
pub fn command_buffer_misuse_errors(h: &Harness) {
    let dev = h.device.clone();
    let a = new_buffer(&dev, 16);
    let cb = CommandBuffer::new(mode::ONE_SHOT, 3, u64::MAX, 2);
    // Recording validates ranges and slots up front.
    assert_eq!(
        cb.fill_buffer(direct(&a, 8, 16), 0, 4).unwrap_err().code(),
        StatusCode::OutOfRange
    );
    assert_eq!(
        cb.fill_buffer(slot(2, 0, 4), 0, 4).unwrap_err().code(),
        StatusCode::OutOfRange
    );
    assert_eq!(
        cb.fill_buffer(direct(&a, 0, 4), 0, 3).unwrap_err().code(),
        StatusCode::InvalidArgument
    );
    // Not finalized: cannot be submitted.
    let (_, f) = fresh_fence();
    let e = queue::execute(&dev, &Fence::new(), &f, Some(&cb), vec![]).unwrap_err();
    assert_eq!(e.code(), StatusCode::FailedPrecondition, "{e}");
    cb.fill_buffer(direct(&a, 0, 16), 0x01, 1).unwrap();
    cb.finalize().unwrap();
    assert_eq!(
        cb.fill_buffer(direct(&a, 0, 4), 0, 4).unwrap_err().code(),
        StatusCode::FailedPrecondition
    );
    assert!(cb.finalize().is_err());
    // Queue transfers check ranges at submission.
    assert!(queue::fill(&dev, &Fence::new(), &f, a.clone(), 8, 16, vec![0]).is_err());
    assert!(queue::copy(&dev, &Fence::new(), &f, a.clone(), 0, a.clone(), 8, 16).is_err());
    assert!(
        !f.query().unwrap(),
        "a rejected submission signalled its fence"
    );
}

/// A compiled kernel dispatched twice from one recording with different tables.
pub fn dispatch_executable_binding_table(h: &Harness) {
    let dev = h.device.clone();
    let exe = h.executable("add");
    let loaded = dev
        .create_executable(&exe.format, &exe.data, &[])
        .expect("create executable");
    assert_eq!(loaded.exports().len(), 1);
    assert!(loaded.exports()[0].name.starts_with("add_dispatch_0"));
    assert_eq!(loaded.exports()[0].binding_count, 3);
    let function = loaded.lookup_export(&loaded.exports()[0].name).unwrap();
    let n = 100_000;
    let bytes = (n * 4) as u64;

    let cb = add_dispatch(&loaded, function, exe.workgroups, bytes);

    // The same recording executed twice with different tables: the second
    // binds ranges of one larger buffer at nonzero offsets.
    let (a, b) = add_inputs(n, 1.0);
    let (ba, bb, out) = (
        f32_buffer(&dev, &a),
        f32_buffer(&dev, &b),
        new_buffer(&dev, bytes),
    );
    let (a2, b2) = add_inputs(n, -3.0);
    let packed = new_buffer(&dev, 3 * bytes + 256);
    packed.write(64, &f32_bytes(&a2)).unwrap();
    packed.write(64 + bytes, &f32_bytes(&b2)).unwrap();
    let timeline = Semaphore::new(0);
    let (f1, f2) = (
        Fence::create_at(timeline.clone(), 1),
        Fence::create_at(timeline.clone(), 2),
    );
    queue::execute(
        &dev,
        &Fence::new(),
        &f1,
        Some(&cb),
        vec![
            binding(&ba, 0, bytes),
            binding(&bb, 0, bytes),
            binding(&out, 0, bytes),
        ],
    )
    .unwrap();
    queue::execute(
        &dev,
        &f1,
        &f2,
        Some(&cb),
        vec![
            binding(&packed, 64, bytes),
            binding(&packed, 64 + bytes, bytes),
            binding(&packed, 64 + 2 * bytes, bytes),
        ],
    )
    .unwrap();
    let r = f2.wait(long());
    assert!(r.as_ref().is_ok_and(|&x| x), "dispatch failed: {r:?}");
    let got = bytes_f32(&out.to_vec().unwrap());
    let want: Vec<f32> = a.iter().zip(&b).map(|(x, y)| x + y).collect();
    assert!(got == want, "first dispatch: wrong sums");
    let p = packed.to_vec().unwrap();
    let got2 = bytes_f32(&p[(64 + 2 * bytes) as usize..(64 + 3 * bytes) as usize]);
    let want2: Vec<f32> = a2.iter().zip(&b2).map(|(x, y)| x + y).collect();
    assert!(got2 == want2, "second dispatch: wrong sums");
    assert!(
        p[(64 + 3 * bytes) as usize..].iter().all(|&x| x == 0),
        "wrote past the range"
    );
}

/// A dispatch on direct bindings followed by a copy and a fill of its output.
pub fn dispatch_executable_direct_bindings(h: &Harness) {
    let dev = h.device.clone();
    let exe = h.executable("mul");
    let loaded = dev.create_executable(&exe.format, &exe.data, &[]).unwrap();
    let n = 32768;
    let bytes = (n * 4) as u64;
    let (a, b) = add_inputs(n, 0.5);
    let (ba, bb, out) = (
        f32_buffer(&dev, &a),
        f32_buffer(&dev, &b),
        new_buffer(&dev, bytes),
    );
    let cb = CommandBuffer::new(mode::ONE_SHOT, 3, u64::MAX, 0);
    cb.dispatch(
        ExecutableRef(loaded),
        0,
        exe.workgroups,
        None,
        vec![],
        vec![
            direct(&ba, 0, bytes),
            direct(&bb, 0, bytes),
            direct(&out, 0, bytes),
        ],
    )
    .unwrap();
    // A dispatch followed by a transfer that reads its output.
    let tail = new_buffer(&dev, 16);
    cb.execution_barrier().unwrap();
    cb.copy_buffer(direct(&out, bytes - 16, 16), direct(&tail, 0, 16))
        .unwrap();
    // And a fill after the dispatch, into the output's first 16 bytes.
    cb.fill_buffer(direct(&out, 0, 16), 0x3F80_0000, 4).unwrap();
    cb.finalize().unwrap();
    let (_, done) = fresh_fence();
    queue::execute(&dev, &Fence::new(), &done, Some(&cb), vec![]).unwrap();
    assert!(done.wait(long()).unwrap());
    let mut want: Vec<f32> = a.iter().zip(&b).map(|(x, y)| x * y).collect();
    assert_eq!(bytes_f32(&tail.to_vec().unwrap()), want[n - 4..]);
    want[..4].copy_from_slice(&[1.0; 4]);
    assert!(
        bytes_f32(&out.to_vec().unwrap()) == want,
        "wrong products or fill"
    );
}

/// A failed semaphore stays failed; every waiter, present and future, sees the failure through two levels of queue work.
pub fn failed_semaphore_propagates_two_levels(h: &Harness) {
    let dev = h.device.clone();
    let target = new_buffer(&dev, 16);
    let (gate, gate_fence) = fresh_fence();
    let (level1_sem, level1) = fresh_fence();
    let (level2_sem, level2) = fresh_fence();
    // A waiter that starts before anything fails.
    let early_waiter = in_background({
        let level2 = level2.clone();
        move || level2.wait(long())
    });
    let submit = in_background({
        let (dev, target) = (dev.clone(), target.clone());
        let (level1, level2) = (level1.clone(), level2.clone());
        move || -> ferrite_base::Result<()> {
            queue::fill(
                &dev,
                &gate_fence,
                &level1,
                target.clone(),
                0,
                16,
                vec![0x11],
            )?;
            queue::update(&dev, &level1, &level2, vec![0x22; 4], target, 0)?;
            Ok(())
        }
    });
    thread::sleep(Duration::from_millis(20));
    gate.fail(Status::new(StatusCode::Aborted, "upstream producer failed"));
    submit.join().unwrap().expect("submissions are accepted");

    let code = StatusCode::Aborted;
    let msg = "upstream producer failed";
    assert_failed_with(
        early_waiter.join().unwrap(),
        code,
        msg,
        "waiter started before",
    );
    assert_failed_with(level1.wait(long()), code, msg, "level-1 signal fence");
    assert_failed_with(level2.wait(long()), code, msg, "level-2 signal fence");
    // Later waiters, with timeouts or polling, see the failure (not a
    // timeout).
    assert_failed_with(
        level2.wait(Timeout::from_duration(Duration::from_millis(5))),
        code,
        msg,
        "waiter started after",
    );
    assert_failed_with(level2.wait(Timeout::IMMEDIATE), code, msg, "poll");
    assert_failed_with(level2.query(), code, msg, "query");
    assert_eq!(level1_sem.failure().unwrap().code(), code);
    assert_eq!(level2_sem.failure().unwrap().code(), code);
    // The dependent work did not run.
    assert!(
        target.to_vec().unwrap().iter().all(|&x| x == 0),
        "work ran despite a failed wait"
    );
    // Work submitted after the failure fails at once too, and a joined fence
    // with one failed member fails.
    let (_, late) = fresh_fence();
    queue::barrier(&dev, &level2, &late).unwrap();
    assert_failed_with(late.wait(long()), code, msg, "submitted after failure");
    let (ok_sem, ok) = fresh_fence();
    ok_sem.signal(1).unwrap();
    assert_failed_with(Fence::join(&[&ok, &level1]).wait(long()), code, msg, "join");
    // Signalling a failed semaphore does not clear the failure.
    level1_sem.signal(5).unwrap();
    assert_failed_with(level1.query(), code, msg, "after signal");
}

/// Work failing at execution fails its signal fence and everything after it.
pub fn failed_work_propagates_to_dependents(h: &Harness) {
    let dev = h.device.clone();
    // A command buffer whose slot the submitted table does not have: the
    // work fails at execution, and its status flows down the chain.
    let a = new_buffer(&dev, 16);
    let cb = CommandBuffer::new(mode::ONE_SHOT, 3, u64::MAX, 4);
    cb.fill_buffer(slot(3, 0, 4), 0x7, 1).unwrap();
    cb.finalize().unwrap();
    let (_, f1) = fresh_fence();
    let (_, f2) = fresh_fence();
    let (_, f3) = fresh_fence();
    queue::execute(
        &dev,
        &Fence::new(),
        &f1,
        Some(&cb),
        vec![binding(&a, 0, 16)],
    )
    .unwrap();
    queue::fill(&dev, &f1, &f2, a.clone(), 0, 16, vec![0x33]).unwrap();
    queue::barrier(&dev, &f2, &f3).unwrap();
    for (f, what) in [(&f1, "failed work"), (&f2, "level 1"), (&f3, "level 2")] {
        assert_failed_with(f.wait(long()), StatusCode::OutOfRange, "slot 3", what);
    }
    assert!(
        a.to_vec().unwrap().iter().all(|&x| x == 0),
        "dependent fill ran"
    );
}

fn assert_took(start: Instant, at_least: Duration, what: &str) {
    let took = start.elapsed();
    assert!(
        took >= at_least && took < at_least + Duration::from_secs(2),
        "{what}: took {took:?}, expected about {at_least:?}"
    );
}

/// Fence waits time out on relative, joined, polled and absolute deadlines.
pub fn fence_wait_deadline(_h: &Harness) {
    let (_, never) = fresh_fence();
    let start = Instant::now();
    assert!(!never
        .wait(Timeout::Relative(20_000_000))
        .expect("a timeout is not an error"));
    assert_took(start, Duration::from_millis(20), "relative 20ms");
    // A joined fence (multi-wait path) times out the same way.
    let (s, reached) = fresh_fence();
    s.signal(1).unwrap();
    let (_, never2) = fresh_fence();
    let joined = Fence::join(&[&never, &reached, &never2]);
    let start = Instant::now();
    assert!(!joined.wait(Timeout::Relative(20_000_000)).unwrap());
    assert_took(start, Duration::from_millis(20), "joined 20ms");
    // Polling returns at once.
    let start = Instant::now();
    assert!(!never.wait(Timeout::IMMEDIATE).unwrap());
    assert!(start.elapsed() < Duration::from_millis(500));
    // An absolute deadline already shared by a caller.
    let deadline = ferrite_base::Deadline::after(Duration::from_millis(20));
    let start = Instant::now();
    assert!(!never.wait(Timeout::Absolute(deadline)).unwrap());
    assert!(!never.wait(Timeout::Absolute(deadline)).unwrap());
    assert_took(start, Duration::from_millis(15), "absolute deadline");
}

/// Queue work gated past a wait deadline times out cleanly, then completes.
pub fn queue_work_pending_past_deadline(h: &Harness) {
    let dev = h.device.clone();
    // The signal fence of work still waiting on a gate times out cleanly,
    // then completes once the gate opens.
    let (gate, gate_fence) = fresh_fence();
    let (_, done) = fresh_fence();
    let target = new_buffer(&dev, 8);
    let submit = in_background({
        let (dev, done, target) = (dev.clone(), done.clone(), target.clone());
        move || queue::fill(&dev, &gate_fence, &done, target, 0, 8, vec![0x5A])
    });
    let start = Instant::now();
    assert!(!done.wait(Timeout::Relative(20_000_000)).unwrap());
    assert_took(start, Duration::from_millis(20), "pending queue work");
    gate.signal(1).unwrap();
    submit.join().unwrap().unwrap();
    assert!(done.wait(long()).unwrap());
    assert_eq!(target.to_vec().unwrap(), vec![0x5A; 8]);
}

/// Eight dispatches queued behind one gate, all correct once it opens.
pub fn many_dispatches_in_flight(h: &Harness) {
    let dev = h.device.clone();
    let exe = h.executable("mul");
    let loaded = dev.create_executable(&exe.format, &exe.data, &[]).unwrap();
    let n = 32768;
    let bytes = (n * 4) as u64;
    let cb = add_dispatch(&loaded, 0, exe.workgroups, bytes);
    let cb = Arc::new(cb);

    let (gate, gate_fence) = fresh_fence();
    let mut jobs = Vec::new();
    for k in 0..8 {
        let (a, b) = add_inputs(n, k as f32 + 0.5);
        let want: Vec<f32> = a.iter().zip(&b).map(|(x, y)| x * y).collect();
        let bufs = (
            f32_buffer(&dev, &a),
            f32_buffer(&dev, &b),
            new_buffer(&dev, bytes),
        );
        let (_, signal) = fresh_fence();
        jobs.push((bufs, signal, want));
    }
    let submit = in_background({
        let dev = dev.clone();
        let cb = cb.clone();
        let work: Vec<(Vec<Binding>, Fence)> = jobs
            .iter()
            .map(|((a, b, o), s, _)| {
                (
                    vec![
                        binding(a, 0, bytes),
                        binding(b, 0, bytes),
                        binding(o, 0, bytes),
                    ],
                    s.clone(),
                )
            })
            .collect();
        move || -> ferrite_base::Result<()> {
            for (table, signal) in work {
                queue::execute(&dev, &gate_fence, &signal, Some(&cb), table)?;
            }
            Ok(())
        }
    });
    thread::sleep(Duration::from_millis(10));
    if !dev.runs_inline() {
        // All eight are queued and none ran.
        assert!(jobs.iter().all(|(_, s, _)| !s.query().unwrap()));
    }
    gate.signal(1).unwrap();
    submit.join().unwrap().unwrap();
    let all = Fence::join(&jobs.iter().map(|(_, s, _)| s).collect::<Vec<_>>());
    assert_eq!(all.timepoint_count(), 8);
    assert!(all.wait(long()).unwrap(), "not all dispatches finished");
    for (k, ((_, _, out), _, want)) in jobs.iter().enumerate() {
        assert!(
            bytes_f32(&out.to_vec().unwrap()) == *want,
            "submission {k}: wrong products"
        );
    }
}

// ---------------------------------------------------------------------------
// The mapping rules

/// The gate, the signal fence, the submitting thread (inline devices) and
/// the expected sums of [`gated_add_into`].
type GatedWork = (
    Arc<Semaphore>,
    Fence,
    Option<thread::JoinHandle<ferrite_base::Result<()>>>,
    Vec<f32>,
);

/// Submits the add kernel writing `out` (host-visible) behind `gate`; the
/// submission returns once the HAL counted it (from a helper thread on
/// devices that run work inline, which then blocks there until the gate).
fn gated_add_into(h: &Harness, out: &Buffer) -> GatedWork {
    let dev = h.device.clone();
    let exe = h.executable("add");
    let loaded = dev
        .create_executable(&exe.format, &exe.data, &[])
        .expect("create executable");
    let n = 100_000;
    let bytes = (n * 4) as u64;
    let (a, b) = add_inputs(n, 1.5);
    let want: Vec<f32> = a.iter().zip(&b).map(|(x, y)| x + y).collect();
    let (ba, bb) = (f32_buffer(&dev, &a), f32_buffer(&dev, &b));
    let cb = add_dispatch(&loaded, 0, exe.workgroups, bytes);
    let (gate, gate_fence) = fresh_fence();
    let (_, done) = fresh_fence();
    let table = vec![
        binding(&ba, 0, bytes),
        binding(&bb, 0, bytes),
        binding(out, 0, bytes),
    ];
    let submit = {
        let done = done.clone();
        move || queue::execute(&dev, &gate_fence, &done, Some(&cb), table)
    };
    if h.device.runs_inline() {
        (gate, done, Some(in_background(submit)), want)
    } else {
        submit().expect("submission");
        (gate, done, None, want)
    }
}

/// Host access to a host-visible buffer that a submitted kernel writes is
/// refused (FAILED_PRECONDITION) from submission until the work's signal
/// fence is reached, on every driver: the kernel is gated behind a
/// semaphore, so it is certainly in flight while the host tries.
pub fn host_access_refused_while_kernel_in_flight(h: &Harness) {
    let bytes = 100_000 * 4;
    let out = h
        .device
        .allocator()
        .allocate(&host_visible_params(), bytes)
        .expect("a host-visible buffer");
    // Mappable before any work.
    assert_eq!(out.map_read(0, 16).unwrap().len(), 16);
    let (gate, done, submit, want) = gated_add_into(h, &out);
    // On an inline device the submission counts the uses on the helper
    // thread: wait (bounded) for the first refusal. Elsewhere the first
    // try must be refused already.
    let start = Instant::now();
    let err = loop {
        match out.map_read(0, 16) {
            Err(e) => break e,
            Ok(m) => {
                drop(m);
                assert!(
                    h.device.runs_inline() && start.elapsed() < Duration::from_secs(5),
                    "map_read of a buffer a gated kernel writes succeeded (device {})",
                    h.device.id()
                );
                thread::sleep(Duration::from_millis(1));
            }
        }
    };
    assert_eq!(err.code(), StatusCode::FailedPrecondition, "{err}");
    assert!(!done.query().unwrap(), "the gated work finished early");
    for (what, r) in [
        ("map_write", out.map_write(0, 16).map(drop)),
        ("read", out.read(0, &mut [0u8; 16])),
        ("write", out.write(0, &[0u8; 16])),
        ("fill", out.fill(0, 16, &[0])),
        ("to_vec", out.to_vec().map(drop)),
    ] {
        let e = r.expect_err(what);
        assert_eq!(e.code(), StatusCode::FailedPrecondition, "{what}: {e}");
    }
    gate.signal(1).unwrap();
    if let Some(s) = submit {
        s.join().unwrap().expect("submission");
    }
    assert!(done.wait(long()).unwrap(), "the kernel did not finish");
    // Once the signal fence is reached the host sees the results at once.
    let got = bytes_f32(&out.map_read(0, bytes).expect("map after the fence"));
    assert!(got == want, "wrong sums");
    out.write(0, &[0u8; 4]).expect("host write after the fence");
}

/// A submission that binds a buffer the host holds mapped is refused
/// (FAILED_PRECONDITION) and nothing runs: at submission, or, on a device
/// that runs ready work inline (it registers nothing it runs at once), by
/// its signal fence failing with that status. Once the mapping is dropped
/// the same submission runs.
pub fn device_work_refused_while_host_maps(h: &Harness) {
    let dev = h.device.clone();
    let a = dev
        .allocator()
        .allocate(&host_visible_params(), 64)
        .expect("a host-visible buffer");
    let cb = CommandBuffer::new(0, 3, u64::MAX, 1);
    cb.fill_buffer(slot(0, 0, 64), 0x5A, 1).unwrap();
    cb.finalize().unwrap();
    let (_, done) = fresh_fence();
    {
        let mapping = a.map_read(0, 64).unwrap();
        let submitted = queue::execute(
            &dev,
            &Fence::new(),
            &done,
            Some(&cb),
            vec![binding(&a, 0, 64)],
        );
        let e = match submitted {
            Err(e) => e,
            Ok(()) if dev.runs_inline() => done
                .wait(long())
                .expect_err("work submitted over a host mapping ran"),
            Ok(()) => panic!("work submitted over a host mapping was accepted"),
        };
        assert_eq!(e.code(), StatusCode::FailedPrecondition, "{e}");
        assert!(mapping.iter().all(|&x| x == 0));
    }
    if !dev.runs_inline() {
        assert!(!done.query().unwrap(), "a refused submission signalled");
    }
    let (_, done) = fresh_fence();
    queue::execute(
        &dev,
        &Fence::new(),
        &done,
        Some(&cb),
        vec![binding(&a, 0, 64)],
    )
    .unwrap();
    assert!(done.wait(long()).unwrap());
    assert_eq!(a.to_vec().unwrap(), vec![0x5A; 64]);
}

// ---------------------------------------------------------------------------
// External buffers (ferrite_hal::external)

/// An external buffer's release: counts its drops, keeping `T` (the memory
/// or what keeps it valid) until then.
struct Released<T: Send + Sync> {
    _keep: T,
    count: Arc<std::sync::atomic::AtomicUsize>,
}

impl<T: Send + Sync> Drop for Released<T> {
    fn drop(&mut self) {
        self.count.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
    }
}

fn drops(count: &std::sync::atomic::AtomicUsize) -> usize {
    count.load(std::sync::atomic::Ordering::SeqCst)
}

/// Polls `count` until it is 1 or LONG passed (the thread that reports
/// queue work drops what the work kept, maybe after its fence is reached),
/// then checks that it stays 1.
fn released_once(count: &std::sync::atomic::AtomicUsize, what: &str) {
    let start = Instant::now();
    while drops(count) == 0 && start.elapsed() < LONG {
        thread::sleep(Duration::from_millis(1));
    }
    assert_eq!(drops(count), 1, "{what}: released once");
    thread::sleep(Duration::from_millis(10));
    assert_eq!(drops(count), 1, "{what}: released once, never again");
}

/// A host allocation imported through `Allocator::import_buffer`: read and
/// written through the HAL in place (unless the allocator says it copies
/// such imports), kept alive by queue work that uses it after the caller
/// dropped its buffer, and released exactly once after that last use; a
/// read-only import refuses writes.
pub fn external_host_allocation_import(h: &Harness) {
    use ferrite_hal::external::{ExternalBuffer, ExternalBufferType};
    // Past the size a GPU driver copies rather than wraps (1 MiB on cuda).
    const LEN: usize = 2 << 20;
    let dev = h.device.clone();
    let mut bytes: Vec<u8> = (0..LEN).map(|i| (i % 251) as u8).collect();
    let want = bytes.clone();
    let ptr = bytes.as_mut_ptr();
    let count = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let owner = Box::new(Released {
        _keep: bytes,
        count: count.clone(),
    });
    let params = device_params();
    let copies = dev.allocator().import_copies(&params, LEN as u64, true);
    // SAFETY: `ptr` addresses the owner's LEN bytes (a vector's heap block,
    // which moving the vector does not move), valid until the owner is
    // dropped; only Ferrite writes them meanwhile.
    let external = unsafe { ExternalBuffer::host_allocation(ptr, LEN, true, owner) };
    assert_eq!(external.buffer_type(), ExternalBufferType::HostAllocation);
    assert_eq!(external.size(), LEN as u64);
    let imported = dev
        .allocator()
        .import_buffer(&params, external)
        .expect("importing a host allocation");
    assert_eq!(imported.byte_length(), LEN as u64);
    assert_eq!(imported.to_vec().unwrap(), want, "read through the HAL");
    if copies {
        assert_eq!(drops(&count), 1, "a copying import releases at once");
    } else {
        assert_eq!(drops(&count), 0, "released while a buffer uses it");
        imported.write(8, &[0xEE; 4]).unwrap();
        let mut seen = [0u8; 4];
        // SAFETY: the owner (and so the LEN bytes at `ptr`) lives while
        // `imported` does; a raw copy, as the HAL itself reads such memory.
        unsafe { std::ptr::copy_nonoverlapping(ptr.add(8), seen.as_mut_ptr(), 4) };
        assert_eq!(seen, [0xEE; 4], "the import is the memory itself");
    }
    // Queue work that starts after the caller dropped its buffer.
    let out = new_buffer(&dev, 4096);
    let (gate, gate_fence) = fresh_fence();
    let (_, done) = fresh_fence();
    let submit = in_background({
        let (dev, src, out, done) = (dev.clone(), imported.clone(), out.clone(), done.clone());
        move || queue::copy(&dev, &gate_fence, &done, src, 4096, out, 0, 4096)
    });
    drop(imported);
    thread::sleep(Duration::from_millis(20));
    if !copies {
        assert_eq!(drops(&count), 0, "released before queue work used it");
    }
    gate.signal(1).unwrap();
    submit.join().unwrap().expect("queue copy from the import");
    assert!(done.wait(long()).unwrap());
    assert_eq!(out.to_vec().unwrap(), want[4096..8192].to_vec());
    released_once(&count, "host allocation");

    // Read-only: the buffer allows no writes.
    let ro_count = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let mut ro_bytes = vec![7u8; 256];
    let ro_ptr = ro_bytes.as_mut_ptr();
    let owner = Box::new(Released {
        _keep: ro_bytes,
        count: ro_count.clone(),
    });
    // SAFETY: as above, 256 bytes; not writable, and Ferrite must not
    // write them.
    let external = unsafe { ExternalBuffer::host_allocation(ro_ptr, 256, false, owner) };
    let ro_params = BufferParams::new(
        MemoryType::DEVICE_LOCAL,
        BufferUsage::TRANSFER | BufferUsage::MAPPING | BufferUsage::DISPATCH_STORAGE_READ,
    );
    let ro = dev
        .allocator()
        .import_buffer(&ro_params, external)
        .expect("importing read-only host memory");
    assert_eq!(ro.to_vec().unwrap(), vec![7u8; 256]);
    assert!(ro.write(0, &[1]).is_err(), "read-only import written");
    drop(ro);
    released_once(&ro_count, "read-only host allocation");
}

/// Device allocations: a device without an API of its own (the CPU
/// drivers) refuses them, releasing the owner once, and its buffers have
/// no native memory; a device with one (cuda) describes its memory by
/// device address, hands it out, imports such an address in place (the
/// same bytes), refuses a range past the allocation, and orders its queue
/// against its own stream and the host.
pub fn external_device_allocation_import(h: &Harness) {
    use ferrite_hal::external::ExternalBuffer;
    let dev = h.device.clone();
    let count = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let released = |keep: Option<Buffer>| -> Box<dyn Send + Sync> {
        Box::new(Released {
            _keep: keep,
            count: count.clone(),
        })
    };
    let Some(queue_) = dev.native_queue() else {
        // SAFETY: the import is refused before anything uses the address.
        let external =
            unsafe { ExternalBuffer::device_allocation(0x1000, 64, true, released(None)) };
        let e = dev
            .allocator()
            .import_buffer(&device_params(), external)
            .expect_err("a device allocation imported by a device without one");
        assert_eq!(e.code(), StatusCode::InvalidArgument, "{e}");
        assert!(e.message().contains("device allocation"), "{e}");
        assert_eq!(drops(&count), 1, "a refused import releases its owner");
        let b = new_buffer(&dev, 64);
        assert!(b.native_memory().is_none());
        let e = b
            .export_device_address()
            .expect_err("host memory exported by device address");
        assert_eq!(e.code(), StatusCode::FailedPrecondition, "{e}");
        return;
    };
    let bytes: Vec<u8> = (0..=255).collect();
    let original = buffer_with(&dev, &bytes);
    let native = original
        .native_memory()
        .expect("device memory describes itself");
    assert_eq!(native.queue.device(), queue_.device());
    assert!(native.device_local, "device-local memory");
    let address = original.export_device_address().unwrap();
    assert_eq!(address, native.device_address);
    let sub = original.subspan(64, 128).unwrap();
    assert_eq!(sub.native_memory().unwrap().device_address, address + 64);
    assert_eq!(sub.export_device_address().unwrap(), address + 64);
    // The owner keeps `original`, and so the memory, alive.
    // SAFETY: bytes 64..192 of `original`'s device allocation, valid while
    // the owner (holding `original`) lives.
    let external = unsafe {
        ExternalBuffer::device_allocation(address + 64, 128, true, released(Some(original.clone())))
    };
    let imported = dev
        .allocator()
        .import_buffer(&device_params(), external)
        .expect("importing a device allocation");
    assert_eq!(imported.byte_length(), 128);
    assert_eq!(
        imported.native_memory().unwrap().device_address,
        address + 64
    );
    assert_eq!(imported.to_vec().unwrap(), bytes[64..192].to_vec());
    imported.write(0, &[0xEE; 8]).unwrap();
    assert_eq!(
        original.to_vec().unwrap()[64..72],
        [0xEE; 8],
        "the same memory"
    );
    // Queue work on the import, ordered before the queue's own stream and
    // then the host; the queue ordered after its own stream.
    let (_, done) = fresh_fence();
    queue::fill(
        &dev,
        &Fence::new(),
        &done,
        imported.clone(),
        8,
        8,
        vec![0x5A],
    )
    .unwrap();
    let stream = queue_.stream();
    // SAFETY: the queue's own stream is a live handle of this device.
    unsafe { queue_.order_before_stream(Some(stream)) }.unwrap();
    // SAFETY: as above.
    unsafe { queue_.order_after_stream(stream) }.unwrap();
    // SAFETY: `None` waits on the host; no handle.
    unsafe { queue_.order_before_stream(None) }.unwrap();
    assert!(done.wait(long()).unwrap());
    assert_eq!(original.to_vec().unwrap()[72..80], [0x5A; 8]);
    drop(imported);
    released_once(&count, "device allocation");
    // Past the end of the allocation: refused, the owner released.
    // SAFETY: the driver refuses the range before anything uses it.
    let external = unsafe {
        ExternalBuffer::device_allocation(
            address + 64,
            1 << 40,
            true,
            released(Some(original.clone())),
        )
    };
    assert!(dev
        .allocator()
        .import_buffer(&device_params(), external)
        .is_err());
    assert_eq!(drops(&count), 2, "a refused import releases its owner");
}
