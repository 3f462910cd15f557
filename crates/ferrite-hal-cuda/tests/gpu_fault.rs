//! A faulting kernel fails the semaphores its submission signals, with the
//! CUDA error text, and every waiter (host and a CPU device's queue) sees
//! it instead of hanging. In its own test binary: a fault ends the CUDA
//! context of the process.

mod common;

use common::*;
use ferrite_base::Timeout;
use ferrite_hal::allocator::BufferParams;
use ferrite_hal::command_buffer::{BufferRef, CommandBuffer};
use ferrite_hal::device::{queue, Device};
use ferrite_hal::executable::ExecutableRef;
use ferrite_hal::{BufferUsage, Fence, MemoryType, Semaphore};
use std::sync::Arc;

#[test]
fn faulting_kernel_fails_every_waiter() {
    let Some(gpu) = gpu() else { return };
    let cpu: Arc<dyn Device> = ferrite_hal_cpu::device::CpuDevice::local_task(1).unwrap();
    let exe = gpu
        .create_executable("cuda-nvptx-fb", &cda1(FAULT_PTX, "k", 1, 0), &[])
        .unwrap();
    let x = gpu
        .allocator()
        .allocate(
            &BufferParams::new(MemoryType::DEVICE_LOCAL, BufferUsage::DEFAULT),
            4,
        )
        .unwrap();
    let cb = CommandBuffer::new(1, 0, 0, 0);
    cb.dispatch(
        ExecutableRef(exe),
        0,
        [1, 1, 1],
        None,
        vec![],
        vec![BufferRef::Direct {
            buffer: x,
            offset: 0,
            length: 4,
        }],
    )
    .unwrap();
    cb.finalize().unwrap();
    let (s, after) = (Semaphore::new(0), Semaphore::new(0));
    queue::execute(
        &gpu,
        &Fence::new(),
        &Fence::create_at(s.clone(), 1),
        Some(&cb),
        vec![],
    )
    .unwrap();
    queue::barrier(
        &cpu,
        &Fence::create_at(s.clone(), 1),
        &Fence::create_at(after.clone(), 1),
    )
    .unwrap();
    let e = s
        .wait(
            1,
            Timeout::from_duration(std::time::Duration::from_millis(20_000)),
        )
        .unwrap_err();
    assert!(
        e.to_string().contains("CUDA_ERROR_ILLEGAL_ADDRESS")
            || e.to_string().contains("CUDA_ERROR"),
        "{e}"
    );
    let e2 = after
        .wait(
            1,
            Timeout::from_duration(std::time::Duration::from_millis(20_000)),
        )
        .unwrap_err();
    assert_eq!(e.to_string(), e2.to_string());
    println!("fault reported: {e}");
}
