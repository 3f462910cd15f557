//! The generic HAL suite: every test is written once against
//! `Arc<dyn Device>` and instantiated for `local-sync` and for `local-task`
//! with 2 workers (modules `local_sync::*` and `local_task::*`).
//!
//! Covered: allocation and host access; queue fill/update/copy ordered by
//! fences; queue alloca/dealloca; command buffers with direct buffers and with
//! binding tables; dispatches of real executables (compiled from
//! `tests/hal/*.mlir` at test time, taken from the module's rodata) both
//! directly and through the VM with the `hal` module; failure propagation
//! through two levels of queue work; deadlines; many submissions in flight;
//! `hal.fence.await` through the VM in asynchronous and synchronous mode.
//!
//! `local-sync` runs queue work inline on the submitting thread, waiting for
//! the wait fence first, so tests that gate work on a semaphore submit from a
//! helper thread ([`in_background`]); on `local-task` the submission returns
//! at once and the same code holds.

mod common;

use ferrite_base::{Status, StatusCode, Timeout};
use ferrite_hal::allocator::BufferParams;
use ferrite_hal::buffer::Buffer;
use ferrite_hal::buffer_view::BufferView;
use ferrite_hal::command_buffer::{mode, Binding, BufferRef, CommandBuffer};
use ferrite_hal::device::{queue, Device, DeviceRef};
use ferrite_hal::element_type::{ElementType, EncodingType};
use ferrite_hal::executable::{Executable, ExecutableRef};
use ferrite_hal::fence::Fence;
use ferrite_hal::memory::{BufferUsage, MemoryType};
use ferrite_hal::semaphore::Semaphore;
use ferrite_hal_cpu::CpuDevice;
use ferrite_hal_module::HalModuleOptions;
use ferrite_vm::{BytecodeModule, Context, Instance, Module, ModuleBytes, Poll, Ref, Variant};
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

/// Generous bound for waits that should finish promptly.
const LONG: Duration = Duration::from_secs(20);

fn long() -> Timeout {
    Timeout::from_duration(LONG)
}

fn local_sync() -> Arc<dyn Device> {
    CpuDevice::local_sync()
}

fn local_task() -> Arc<dyn Device> {
    CpuDevice::local_task(2).expect("local-task device")
}

/// Instantiates each listed test function for both devices.
macro_rules! device_tests {
    ($($name:ident),* $(,)?) => {
        mod local_sync {
            $(#[test] fn $name() { super::$name(super::local_sync()) })*
        }
        mod local_task {
            $(#[test] fn $name() { super::$name(super::local_task()) })*
        }
    };
}

device_tests!(
    allocation_and_host_access,
    queue_chain_ordered_by_fences,
    queue_alloca_dealloca,
    command_buffer_direct_transfers,
    command_buffer_binding_tables,
    command_buffer_misuse_errors,
    dispatch_executable_binding_table,
    dispatch_executable_direct_bindings,
    dispatch_refuses_read_only_memory_where_kernels_may_write,
    dispatch_reads_program_constants_in_place,
    dispatch_matmul_through_vm,
    dispatch_conv2d_through_vm,
    failed_semaphore_propagates_two_levels,
    failed_work_propagates_to_dependents,
    fence_wait_deadline,
    queue_work_pending_past_deadline,
    many_dispatches_in_flight,
    fence_await_vm_async,
    fence_await_vm_synchronous,
);

// ---------------------------------------------------------------------------
// Helpers

/// Device-local (and, on the CPU, host-visible) memory with the default
/// usage: what programs' `hal.buffer.assert` accepts for their arguments.
fn device_params() -> BufferParams {
    BufferParams::new(MemoryType::DEVICE_LOCAL, BufferUsage::DEFAULT)
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
/// fences block on `local-sync` (work runs inline) and return at once on
/// `local-task`.
fn in_background<R: Send + 'static>(
    f: impl FnOnce() -> R + Send + 'static,
) -> thread::JoinHandle<R> {
    thread::spawn(f)
}

fn is_task(dev: &Arc<dyn Device>) -> bool {
    dev.id() == "local-task"
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

// ---------------------------------------------------------------------------
// Allocation and host access

fn allocation_and_host_access(dev: Arc<dyn Device>) {
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

// ---------------------------------------------------------------------------
// Queue operations

fn queue_chain_ordered_by_fences(dev: Arc<dyn Device>) {
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

fn queue_alloca_dealloca(dev: Arc<dyn Device>) {
    let alloc = dev.queue_allocator();
    let timeline = Semaphore::new(0);
    let at = |v| Fence::create_at(timeline.clone(), v);
    let (f1, f2, f3) = (at(1), at(2), at(3));
    let buf = queue::alloca(&dev, &Fence::new(), &f1, &device_params(), 1024).unwrap();
    assert_eq!(buf.byte_length(), 1024);
    queue::fill(&dev, &f1, &f2, buf.clone(), 0, 1024, vec![7, 0, 0, 0]).unwrap();
    assert!(f2.wait(long()).unwrap());
    assert_eq!(timeline.query().unwrap(), 2);
    assert_eq!(common::bytes_u32(&buf.to_vec().unwrap()), vec![7u32; 256]);
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

// ---------------------------------------------------------------------------
// Command buffers

fn command_buffer_direct_transfers(dev: Arc<dyn Device>) {
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

fn command_buffer_binding_tables(dev: Arc<dyn Device>) {
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

fn command_buffer_misuse_errors(dev: Arc<dyn Device>) {
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

// ---------------------------------------------------------------------------
// Dispatch

fn f32_buffer(dev: &Arc<dyn Device>, v: &[f32]) -> Buffer {
    buffer_with(dev, &common::f32_bytes(v))
}

/// A kernel's bindings may all be written (the CPU library ABI marks none
/// read-only), so read-only host memory is refused where a dispatch binds
/// it: at import when the usage allows dispatch writes, and at dispatch time
/// when it was imported for dispatch reads only. The memory is never written.
fn dispatch_refuses_read_only_memory_where_kernels_may_write(dev: Arc<dyn Device>) {
    let exe = common::executable("add");
    let loaded = dev
        .create_executable(&exe.format, &exe.data, &[])
        .expect("create executable");
    let function = 0;
    let n = 1024;
    let bytes = (n * 4) as u64;
    let (a, b) = add_inputs(n, 1.0);
    let (ba, bb) = (f32_buffer(&dev, &a), f32_buffer(&dev, &b));
    let constant = Arc::new(vec![0x5au8; bytes as usize]);
    let memory = || ferrite_hal::buffer::HostMemory::ReadOnly(constant.clone());

    // Imported with the default usage (dispatch storage, written or read):
    // refused at import, so callers can take their copy path.
    let err = dev
        .allocator()
        .import_host(&device_params(), memory())
        .unwrap_err();
    assert_eq!(err.code(), StatusCode::PermissionDenied, "{err}");
    assert!(err.message().contains("read-only host memory"), "{err}");

    // Imported for dispatch reads only, then bound as the kernel's output.
    let read_only = dev
        .allocator()
        .import_host(
            &BufferParams::new(
                MemoryType::DEVICE_LOCAL,
                BufferUsage::DISPATCH_STORAGE_READ | BufferUsage::TRANSFER,
            ),
            memory(),
        )
        .expect("a read-only import for dispatch reads");
    let cb = add_dispatch(&loaded, function, exe.workgroups, bytes);
    let (_s, done) = fresh_fence();
    let table = vec![
        binding(&ba, 0, bytes),
        binding(&bb, 0, bytes),
        binding(&read_only, 0, bytes),
    ];
    let submitted = queue::execute(&dev, &Fence::new(), &done, Some(&cb), table);
    let err = match submitted {
        Err(e) => e,
        Ok(()) => done
            .wait(long())
            .expect_err("a dispatch writing read-only memory"),
    };
    assert_eq!(err.code(), StatusCode::PermissionDenied, "{err}");
    let text = err.to_string();
    assert!(text.contains("dispatch binding 2"), "{text}");
    assert!(text.contains("may write"), "{text}");
    assert!(
        constant.iter().all(|&x| x == 0x5a),
        "read-only memory was written"
    );
}

/// A program constant (what the `hal` module makes of module rodata the
/// program imports with SHARING_IMMUTABLE usage) is imported in place even
/// with the usage that allows dispatch writes, and a kernel reads it where
/// it lies: no allocation, right sums, the bytes untouched.
fn dispatch_reads_program_constants_in_place(dev: Arc<dyn Device>) {
    let exe = common::executable("add");
    let loaded = dev
        .create_executable(&exe.format, &exe.data, &[])
        .expect("create executable");
    // The fixture's static shape (as dispatch_executable_binding_table).
    let n = 100_000;
    let bytes = (n * 4) as u64;
    let (a, b) = add_inputs(n, 2.0);
    let constant: Arc<Vec<u8>> = Arc::new(common::f32_bytes(&a));
    let before = dev.allocator().statistics();
    // SAFETY: the add kernel writes only binding 2; the constant is binding 0.
    let memory = unsafe { ferrite_hal::buffer::HostMemory::program_constant(constant.clone()) };
    let params = BufferParams::new(
        MemoryType::DEVICE_LOCAL,
        BufferUsage::DEFAULT | BufferUsage::SHARING_IMMUTABLE,
    );
    let imported = dev
        .allocator()
        .import_host(&params, memory)
        .expect("a program constant imports with dispatch usage");
    let after = dev.allocator().statistics();
    assert_eq!(
        after.host_bytes_allocated + after.device_bytes_allocated,
        before.host_bytes_allocated + before.device_bytes_allocated,
        "the constant was copied"
    );
    let (bb, out) = (f32_buffer(&dev, &b), new_buffer(&dev, bytes));
    let cb = add_dispatch(&loaded, 0, exe.workgroups, bytes);
    let (_s, done) = fresh_fence();
    let table = vec![
        binding(&imported, 0, bytes),
        binding(&bb, 0, bytes),
        binding(&out, 0, bytes),
    ];
    queue::execute(&dev, &Fence::new(), &done, Some(&cb), table).unwrap();
    let r = done.wait(long());
    assert!(r.as_ref().is_ok_and(|&x| x), "dispatch failed: {r:?}");
    let got = common::bytes_f32(&out.to_vec().unwrap());
    let want: Vec<f32> = a.iter().zip(&b).map(|(x, y)| x + y).collect();
    assert!(got == want, "wrong sums from a constant read in place");
    assert_eq!(*constant, common::f32_bytes(&a), "the constant was written");
    // Still not writable through the host API.
    assert!(imported.write(0, &[0u8; 4]).is_err());
}

/// A finalized command buffer that dispatches export `function` of the add
/// fixture once, binding its three operands to table slots 0..3 (`bytes`
/// each).
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

fn dispatch_executable_binding_table(dev: Arc<dyn Device>) {
    let exe = common::executable("add");
    assert_eq!(exe.format, "embedded-elf-x86_64");
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
    packed.write(64, &common::f32_bytes(&a2)).unwrap();
    packed.write(64 + bytes, &common::f32_bytes(&b2)).unwrap();
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
    let got = common::bytes_f32(&out.to_vec().unwrap());
    let want: Vec<f32> = a.iter().zip(&b).map(|(x, y)| x + y).collect();
    assert!(got == want, "first dispatch: wrong sums");
    let p = packed.to_vec().unwrap();
    let got2 = common::bytes_f32(&p[(64 + 2 * bytes) as usize..(64 + 3 * bytes) as usize]);
    let want2: Vec<f32> = a2.iter().zip(&b2).map(|(x, y)| x + y).collect();
    assert!(got2 == want2, "second dispatch: wrong sums");
    assert!(
        p[(64 + 3 * bytes) as usize..].iter().all(|&x| x == 0),
        "wrote past the range"
    );
}

fn dispatch_executable_direct_bindings(dev: Arc<dyn Device>) {
    let exe = common::executable("mul");
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
    cb.finalize().unwrap();
    let (_, done) = fresh_fence();
    queue::execute(&dev, &Fence::new(), &done, Some(&cb), vec![]).unwrap();
    assert!(done.wait(long()).unwrap());
    let want: Vec<f32> = a.iter().zip(&b).map(|(x, y)| x * y).collect();
    assert!(common::bytes_f32(&out.to_vec().unwrap()) == want);
    assert_eq!(common::bytes_f32(&tail.to_vec().unwrap()), want[n - 4..]);
}

/// A context with the `hal` module over `dev` and the compiled program.
fn vm_context(
    dev: &Arc<dyn Device>,
    program: &str,
    vm_dialect: bool,
    options: HalModuleOptions,
) -> (Instance, Context) {
    let instance = Instance::default();
    ferrite_hal_module::register_types(instance.types());
    let hal = ferrite_hal_module::create_hal_module(vec![DeviceRef(dev.clone())], options)
        .expect("create hal module");
    let path = common::compile(program, vm_dialect);
    let module = BytecodeModule::load(&instance, ModuleBytes::read_file(&path).unwrap())
        .expect("load module");
    let mut ctx = Context::new(&instance);
    ctx.register(hal).expect("register hal");
    ctx.register(module as Arc<dyn Module>)
        .expect("register program");
    (instance, ctx)
}

fn f32_view(dev: &Arc<dyn Device>, shape: &[u64], v: &[f32]) -> Variant {
    let view = BufferView::new(
        f32_buffer(dev, v),
        shape,
        ElementType::FLOAT_32,
        EncodingType::DENSE_ROW_MAJOR,
    )
    .unwrap();
    Variant::Ref(Ref::new(view))
}

fn result_f32(r: &Variant, shape: &[u64]) -> Vec<f32> {
    let Variant::Ref(r) = r else {
        panic!("result is not a ref: {r:?}")
    };
    let view = r.downcast::<BufferView>().expect("result is a buffer view");
    assert_eq!(view.shape(), shape);
    assert_eq!(view.element_type(), ElementType::FLOAT_32);
    let bytes = view.buffer().to_vec().unwrap();
    common::bytes_f32(&bytes[..view.byte_length() as usize])
}

fn dispatch_matmul_through_vm(dev: Arc<dyn Device>) {
    let (_i, ctx) = vm_context(&dev, "matmul", false, HalModuleOptions::default());
    let f = ctx.lookup_function("matmul").unwrap();
    let (m, k, n) = (32usize, 64usize, 16usize);
    // Small integers: every partial sum is exact in f32, so any summation
    // order gives the same bits.
    let lhs: Vec<f32> = (0..m * k)
        .map(|i| ((i * 7 + i / k * 3) % 11) as f32 - 5.0)
        .collect();
    let rhs: Vec<f32> = (0..k * n)
        .map(|i| ((i * 5 + i / n) % 7) as f32 - 3.0)
        .collect();
    let mut want = vec![0f32; m * n];
    for i in 0..m {
        for j in 0..n {
            want[i * n + j] = (0..k).map(|p| lhs[i * k + p] * rhs[p * n + j]).sum();
        }
    }
    for round in 0..2 {
        let out = ctx
            .invoke(
                &f,
                vec![
                    f32_view(&dev, &[m as u64, k as u64], &lhs),
                    f32_view(&dev, &[k as u64, n as u64], &rhs),
                ],
            )
            .unwrap_or_else(|e| panic!("round {round}: {e}"));
        assert_eq!(out.len(), 1);
        assert_eq!(
            result_f32(&out[0], &[m as u64, n as u64]),
            want,
            "round {round}"
        );
    }
    // A wrong shape is rejected naming the argument.
    let e = ctx
        .invoke(
            &f,
            vec![
                f32_view(&dev, &[m as u64, k as u64], &lhs),
                f32_view(&dev, &[n as u64, k as u64], &rhs),
            ],
        )
        .unwrap_err();
    assert_eq!(e.code(), StatusCode::InvalidArgument);
    assert!(e.message().contains("input1"), "{e}");
}

fn dispatch_conv2d_through_vm(dev: Arc<dyn Device>) {
    let (_i, ctx) = vm_context(&dev, "conv2d", false, HalModuleOptions::default());
    let f = ctx.lookup_function("conv2d").unwrap();
    let (h, w, c, kh, kw, fo) = (8usize, 8usize, 3usize, 3usize, 3usize, 4usize);
    let input: Vec<f32> = (0..h * w * c).map(|i| (i % 5) as f32 - 2.0).collect();
    let filter: Vec<f32> = (0..kh * kw * c * fo)
        .map(|i| (i % 3) as f32 - 1.0)
        .collect();
    let (oh, ow) = (h - kh + 1, w - kw + 1);
    let mut want = vec![0f32; oh * ow * fo];
    for y in 0..oh {
        for x in 0..ow {
            for o in 0..fo {
                let mut s = 0f32;
                for dy in 0..kh {
                    for dx in 0..kw {
                        for ci in 0..c {
                            s += input[((y + dy) * w + (x + dx)) * c + ci]
                                * filter[((dy * kw + dx) * c + ci) * fo + o];
                        }
                    }
                }
                want[(y * ow + x) * fo + o] = s;
            }
        }
    }
    let out = ctx
        .invoke(
            &f,
            vec![
                f32_view(&dev, &[1, h as u64, w as u64, c as u64], &input),
                f32_view(&dev, &[kh as u64, kw as u64, c as u64, fo as u64], &filter),
            ],
        )
        .unwrap_or_else(|e| panic!("conv2d on {}: {e}", dev.id()));
    assert_eq!(
        result_f32(&out[0], &[1, oh as u64, ow as u64, fo as u64]),
        want
    );
}

// ---------------------------------------------------------------------------
// Failure propagation

fn failed_semaphore_propagates_two_levels(dev: Arc<dyn Device>) {
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

fn failed_work_propagates_to_dependents(dev: Arc<dyn Device>) {
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

// ---------------------------------------------------------------------------
// Deadlines

fn assert_took(start: Instant, at_least: Duration, what: &str) {
    let took = start.elapsed();
    assert!(
        took >= at_least && took < at_least + Duration::from_secs(2),
        "{what}: took {took:?}, expected about {at_least:?}"
    );
}

fn fence_wait_deadline(_dev: Arc<dyn Device>) {
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

fn queue_work_pending_past_deadline(dev: Arc<dyn Device>) {
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

// ---------------------------------------------------------------------------
// Several submissions in flight

fn many_dispatches_in_flight(dev: Arc<dyn Device>) {
    let exe = common::executable("mul");
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
    if is_task(&dev) {
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
            common::bytes_f32(&out.to_vec().unwrap()) == *want,
            "submission {k}: wrong products"
        );
    }
}

// ---------------------------------------------------------------------------
// hal.fence.await through the VM

const DEADLINE_EXCEEDED: i32 = StatusCode::DeadlineExceeded as i32;

fn fence_arg(f: &Fence) -> Variant {
    Variant::Ref(Ref::new(f.clone()))
}

/// A fence signalled by queue work on `dev` once `gate` opens.
fn queue_fence(dev: &Arc<dyn Device>) -> (Arc<Semaphore>, Fence, thread::JoinHandle<()>) {
    let (gate, gate_fence) = fresh_fence();
    let (_, done) = fresh_fence();
    let h = in_background({
        let (dev, done) = (dev.clone(), done.clone());
        move || queue::barrier(&dev, &gate_fence, &done).unwrap()
    });
    (gate, done, h)
}

fn open_later(gate: &Arc<Semaphore>, after: Duration) -> thread::JoinHandle<()> {
    let gate = gate.clone();
    thread::spawn(move || {
        thread::sleep(after);
        gate.signal(1).unwrap();
    })
}

/// What both modes share: results of `await_one` / `await_two`.
fn fence_await_common(dev: &Arc<dyn Device>, ctx: &Context) {
    assert_eq!(DEADLINE_EXCEEDED, 4);
    let one = ctx.lookup_function("await_one").unwrap();
    let two = ctx.lookup_function("await_two").unwrap();

    // Signalled later by queue work: 0 after the wait.
    let (gate, done, submit) = queue_fence(dev);
    let opener = open_later(&gate, Duration::from_millis(30));
    let start = Instant::now();
    let r = ctx
        .invoke(&one, vec![fence_arg(&done), Variant::I32(-1)])
        .unwrap();
    assert_eq!(r, vec![Variant::I32(0)]);
    assert!(start.elapsed() >= Duration::from_millis(25));
    opener.join().unwrap();
    submit.join().unwrap();

    // Already reached: 0 at once.
    let r = ctx
        .invoke(&one, vec![fence_arg(&done), Variant::I32(0)])
        .unwrap();
    assert_eq!(r, vec![Variant::I32(0)]);

    // Never signalled, 20 ms: DEADLINE_EXCEEDED as the result, on time.
    let (_, never) = fresh_fence();
    let start = Instant::now();
    let r = ctx
        .invoke(&one, vec![fence_arg(&never), Variant::I32(20)])
        .unwrap();
    assert_eq!(r, vec![Variant::I32(DEADLINE_EXCEEDED)]);
    assert_took(start, Duration::from_millis(20), "fence.await 20ms");
    // Timeout 0 polls.
    let r = ctx
        .invoke(&one, vec![fence_arg(&never), Variant::I32(0)])
        .unwrap();
    assert_eq!(r, vec![Variant::I32(DEADLINE_EXCEEDED)]);

    // Two fences, one of them never: times out; both reached: 0, and the
    // code after the await ran (+1000).
    let r = ctx
        .invoke(
            &two,
            vec![fence_arg(&done), fence_arg(&never), Variant::I32(10)],
        )
        .unwrap();
    assert_eq!(r, vec![Variant::I32(1000 + DEADLINE_EXCEEDED)]);
    let (gate2, done2, submit2) = queue_fence(dev);
    let opener = open_later(&gate2, Duration::from_millis(10));
    let r = ctx
        .invoke(
            &two,
            vec![fence_arg(&done), fence_arg(&done2), Variant::I32(-1)],
        )
        .unwrap();
    assert_eq!(r, vec![Variant::I32(1000)]);
    opener.join().unwrap();
    submit2.join().unwrap();

    // A fence failed while awaited fails the invocation with its status.
    let (gate3, done3, submit3) = queue_fence(dev);
    let failer = {
        let gate3 = gate3.clone();
        thread::spawn(move || {
            thread::sleep(Duration::from_millis(20));
            gate3.fail(Status::new(StatusCode::DataLoss, "lost the input"));
        })
    };
    let e = ctx
        .invoke(&one, vec![fence_arg(&done3), Variant::I32(-1)])
        .unwrap_err();
    assert_eq!(e.code(), StatusCode::DataLoss, "{e}");
    assert!(e.message().contains("lost the input"), "{e}");
    failer.join().unwrap();
    submit3.join().unwrap();
    // Already failed, even with a zero timeout: the failure, not a timeout.
    let e = ctx
        .invoke(&one, vec![fence_arg(&done3), Variant::I32(0)])
        .unwrap_err();
    assert_eq!(e.code(), StatusCode::DataLoss, "{e}");
}

fn fence_await_vm_async(dev: Arc<dyn Device>) {
    let (_i, ctx) = vm_context(&dev, "fence_await", true, HalModuleOptions::default());
    fence_await_common(&dev, &ctx);

    // The invocation yields instead of blocking: the host drives it.
    let one = ctx.lookup_function("await_one").unwrap();
    let (gate, done, submit) = queue_fence(&dev);
    let mut inv = ctx
        .begin(&one, vec![fence_arg(&done), Variant::I32(-1)])
        .unwrap();
    let start = Instant::now();
    let wait = match inv.step().unwrap() {
        Poll::Pending(w) => w,
        Poll::Done(v) => panic!("await of an unreached fence completed: {v:?}"),
    };
    assert!(start.elapsed() < Duration::from_secs(1), "step blocked");
    assert!(!wait.sources.is_empty());
    assert!(wait.handles_failure);
    assert_eq!(wait.deadline, ferrite_base::Deadline::InfiniteFuture);
    gate.signal(1).unwrap();
    submit.join().unwrap();
    let outcome = ferrite_base::wait::wait_sources(&wait.sources, wait.mode, wait.deadline);
    outcome.as_ref().unwrap();
    inv.complete_wait(outcome).unwrap();
    match inv.step().unwrap() {
        Poll::Done(v) => assert_eq!(v, vec![Variant::I32(0)]),
        Poll::Pending(_) => panic!("yielded again after the fence was reached"),
    }

    // A timed-out wait handed back to the frame becomes DEADLINE_EXCEEDED.
    let (_, never) = fresh_fence();
    let mut inv = ctx
        .begin(&one, vec![fence_arg(&never), Variant::I32(5)])
        .unwrap();
    let Poll::Pending(w) = inv.step().unwrap() else {
        panic!("expected a yield")
    };
    assert!(matches!(w.deadline, ferrite_base::Deadline::At(_)));
    let outcome = ferrite_base::wait::wait_sources(&w.sources, w.mode, w.deadline);
    assert_eq!(
        outcome.as_ref().unwrap_err().code(),
        StatusCode::DeadlineExceeded
    );
    inv.complete_wait(outcome).unwrap();
    match inv.step().unwrap() {
        Poll::Done(v) => assert_eq!(v, vec![Variant::I32(DEADLINE_EXCEEDED)]),
        Poll::Pending(_) => panic!("yielded twice"),
    }
}

fn fence_await_vm_synchronous(dev: Arc<dyn Device>) {
    let options = HalModuleOptions {
        synchronous: true,
        ..HalModuleOptions::default()
    };
    let (_i, ctx) = vm_context(&dev, "fence_await", true, options);
    fence_await_common(&dev, &ctx);

    // The invocation blocks inside the import: one step, no yield.
    let one = ctx.lookup_function("await_one").unwrap();
    let (gate, done, submit) = queue_fence(&dev);
    let opener = open_later(&gate, Duration::from_millis(20));
    let mut inv = ctx
        .begin(&one, vec![fence_arg(&done), Variant::I32(-1)])
        .unwrap();
    let start = Instant::now();
    match inv.step().unwrap() {
        Poll::Done(v) => assert_eq!(v, vec![Variant::I32(0)]),
        Poll::Pending(_) => panic!("synchronous fence.await yielded"),
    }
    assert!(start.elapsed() >= Duration::from_millis(15));
    opener.join().unwrap();
    submit.join().unwrap();

    let (_, never) = fresh_fence();
    let mut inv = ctx
        .begin(&one, vec![fence_arg(&never), Variant::I32(20)])
        .unwrap();
    let start = Instant::now();
    match inv.step().unwrap() {
        Poll::Done(v) => assert_eq!(v, vec![Variant::I32(DEADLINE_EXCEEDED)]),
        Poll::Pending(_) => panic!("synchronous fence.await yielded"),
    }
    assert_took(start, Duration::from_millis(20), "synchronous 20ms");
}
