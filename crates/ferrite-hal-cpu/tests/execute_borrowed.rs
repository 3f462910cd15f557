//! `queue::execute_borrowed` (issue 26, Cost): a command buffer executed
//! with a binding table the caller keeps. On `local-sync` the work runs in
//! place on the table as it is; where work may outlive the call
//! (`local-task` with a wait not yet reached) the table is copied, so the
//! caller may drop its table and buffers at once and the work still finds
//! them when it runs.

mod common;

use ferrite_base::Timeout;
use ferrite_hal::allocator::BufferParams;
use ferrite_hal::buffer::Buffer;
use ferrite_hal::command_buffer::{Binding, BindingTable, BufferRef, CommandBuffer};
use ferrite_hal::device::{queue, Device};
use ferrite_hal::executable::ExecutableRef;
use ferrite_hal::fence::Fence;
use ferrite_hal::memory::{BufferUsage, MemoryType};
use ferrite_hal::semaphore::Semaphore;
use ferrite_hal_cpu::CpuDevice;
use std::sync::Arc;

const N: usize = 4;

fn buffer(dev: &Arc<dyn Device>, values: &[f32]) -> Buffer {
    let params = BufferParams::new(MemoryType::DEVICE_LOCAL, BufferUsage::DEFAULT);
    let b = dev
        .allocator()
        .allocate(&params, (values.len() * 4) as u64)
        .unwrap();
    b.write(0, &common::f32_bytes(values)).unwrap();
    b
}

/// One dispatch of the 4-element `add4` on binding table slots 0 and 1
/// into slot 2.
fn add_on_slots(dev: &Arc<dyn Device>) -> CommandBuffer {
    let exe = common::executable("add4");
    let loaded = dev.create_executable(&exe.format, &exe.data, &[]).unwrap();
    let slot = |slot| BufferRef::Slot {
        slot,
        offset: 0,
        length: (N * 4) as u64,
    };
    let cb = CommandBuffer::new(0, 3, u64::MAX, 3);
    cb.dispatch(
        ExecutableRef(loaded),
        0,
        exe.workgroups,
        None,
        vec![],
        vec![slot(0), slot(1), slot(2)],
    )
    .unwrap();
    cb.finalize().unwrap();
    cb
}

fn table(a: &Buffer, b: &Buffer, out: &Buffer) -> BindingTable {
    [a, b, out]
        .into_iter()
        .map(|buffer| Binding {
            buffer: buffer.clone(),
            offset: 0,
            length: (N * 4) as u64,
        })
        .collect()
}

fn check(out: &Buffer, base: f32) {
    let got = common::bytes_f32(&out.to_vec().unwrap());
    let want: Vec<f32> = (0..N).map(|i| i as f32 + base).collect();
    assert_eq!(got, want);
}

#[test]
fn local_sync_runs_on_the_borrowed_table() {
    let dev: Arc<dyn Device> = CpuDevice::local_sync();
    let cb = add_on_slots(&dev);
    let a = buffer(&dev, &[0.0, 1.0, 2.0, 3.0]);
    let b = buffer(&dev, &[10.0; N]);
    let out = buffer(&dev, &[0.0; N]);
    let bindings = table(&a, &b, &out);
    let done = Fence::create_at(Semaphore::new(0), 1);
    queue::execute_borrowed(&dev, &Fence::new(), &done, &cb, &bindings).unwrap();
    assert!(done.query().unwrap(), "inline work is done at return");
    check(&out, 10.0);
    // The table is still the caller's, and usable again.
    let b2 = buffer(&dev, &[20.0; N]);
    let bindings = table(&a, &b2, &out);
    let done = Fence::create_at(Semaphore::new(0), 1);
    queue::execute_borrowed(&dev, &Fence::new(), &done, &cb, &bindings).unwrap();
    check(&out, 20.0);
}

#[test]
fn pending_work_keeps_its_own_copy_of_the_table() {
    let dev: Arc<dyn Device> = CpuDevice::local_task(2).unwrap();
    let cb = add_on_slots(&dev);
    let out = buffer(&dev, &[0.0; N]);
    let gate = Semaphore::new(0);
    let wait = Fence::create_at(gate.clone(), 1);
    let done = Fence::create_at(Semaphore::new(0), 1);
    {
        // The caller's table and input buffers go away before the work can
        // run (its wait is not reached).
        let a = buffer(&dev, &[0.0, 1.0, 2.0, 3.0]);
        let b = buffer(&dev, &[10.0; N]);
        let bindings = table(&a, &b, &out);
        queue::execute_borrowed(&dev, &wait, &done, &cb, &bindings).unwrap();
    }
    assert!(!done.query().unwrap(), "the work waits for the gate");
    gate.signal(1).unwrap();
    assert!(done.wait(Timeout::INFINITE).unwrap());
    check(&out, 10.0);
}
