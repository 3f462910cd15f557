//! The CPU drivers' own HAL tests, instantiated for `local-sync` and for
//! `local-task` with 2 workers (modules `local_sync::*` and
//! `local_task::*`). The driver-generic tests (buffers, mapping rules,
//! semaphores and failure propagation, command buffers, queue ordering,
//! direct dispatches) live in the conformance suite `ferrite-hal-cts`,
//! which `tests/cts_local_sync.rs` and `tests/cts_local_task.rs`
//! instantiate; what stays here is CPU-specific: read-only host memory
//! and program constants bound to CPU kernels, programs run through the
//! VM with the `hal` module (compiled for llvm-cpu), and
//! `hal.fence.await` in asynchronous and synchronous mode.
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
use ferrite_hal::command_buffer::{Binding, BufferRef, CommandBuffer};
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
    dispatch_refuses_read_only_memory_where_kernels_may_write,
    dispatch_reads_program_constants_in_place,
    dispatch_matmul_through_vm,
    dispatch_conv2d_through_vm,
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

// ---------------------------------------------------------------------------
// Allocation and host access

// ---------------------------------------------------------------------------
// Queue operations

// ---------------------------------------------------------------------------
// Command buffers

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

// ---------------------------------------------------------------------------
// Deadlines

// ---------------------------------------------------------------------------
// Several submissions in flight

// ---------------------------------------------------------------------------
// hal.fence.await through the VM

fn assert_took(start: Instant, at_least: Duration, what: &str) {
    let took = start.elapsed();
    assert!(
        took >= at_least && took < at_least + Duration::from_secs(2),
        "{what}: took {took:?}, expected about {at_least:?}"
    );
}

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
