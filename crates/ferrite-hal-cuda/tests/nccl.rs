//! NCCL channels on one GPU (a group of one rank): every collective kind
//! runs through NCCL on the queue stream and gives the one-rank result;
//! bad parameters are refused. Skipped with a printed reason without a GPU
//! or without NCCL (a failure under `FERRITE_REQUIRE_GPU=1`).

mod common;

use common::*;
use ferrite_base::Timeout;
use ferrite_hal::allocator::BufferParams;
use ferrite_hal::channel::{ChannelParams, ChannelRef, CollectiveOp, LocalGroup};
use ferrite_hal::command_buffer::{BufferRef, CommandBuffer};
use ferrite_hal::device::{queue, Device};
use ferrite_hal::{Buffer, BufferUsage, ChannelProvider, Fence, MemoryType, Semaphore};
use std::sync::Arc;

/// The GPU when NCCL is also there (else None after the printed skip).
fn gpu_with_nccl() -> Option<Arc<dyn Device>> {
    let dev = gpu()?;
    if let Err(e) = ferrite_hal_cuda::nccl::nccl() {
        if std::env::var("FERRITE_REQUIRE_GPU").as_deref() == Ok("1") {
            panic!("FERRITE_REQUIRE_GPU=1 but NCCL is missing: {e}");
        }
        println!("SKIPPED: {e}");
        return None;
    }
    Some(dev)
}

fn buf(dev: &Arc<dyn Device>, data: &[f32]) -> Buffer {
    let b = dev
        .allocator()
        .allocate(
            &BufferParams::new(MemoryType::DEVICE_LOCAL, BufferUsage::DEFAULT),
            (data.len() * 4) as u64,
        )
        .unwrap();
    let bytes: Vec<u8> = data.iter().flat_map(|x| x.to_le_bytes()).collect();
    b.write(0, &bytes).unwrap();
    b
}

fn f32s(b: &Buffer) -> Vec<f32> {
    b.to_vec()
        .unwrap()
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect()
}

fn whole(b: &Buffer) -> BufferRef {
    BufferRef::Direct {
        buffer: b.clone(),
        offset: 0,
        length: b.byte_length(),
    }
}

/// Records one collective and runs it, returning the execution's outcome.
fn run(
    dev: &Arc<dyn Device>,
    ch: &ChannelRef,
    packed: u32,
    param: u32,
    send: Option<&Buffer>,
    recv: Option<&Buffer>,
    count: u64,
) -> ferrite_base::Result<()> {
    let cb = CommandBuffer::new(1, 0, 0, 0);
    cb.collective(
        ch.clone(),
        CollectiveOp::from_packed(packed).unwrap(),
        param,
        send.map(whole),
        recv.map(whole),
        count,
    )?;
    cb.finalize()?;
    let s = Semaphore::new(0);
    queue::execute(
        dev,
        &Fence::new(),
        &Fence::create_at(s.clone(), 1),
        Some(&cb),
        vec![],
    )?;
    s.wait(1, Timeout::INFINITE).map(|_| ())
}

fn one_rank_channel(dev: &Arc<dyn Device>) -> ChannelRef {
    let group = LocalGroup::new(1).unwrap();
    let provider: Arc<dyn ChannelProvider> = group.rank(0).unwrap();
    dev.create_channel(u64::MAX, ChannelParams::default(), Some(&provider))
        .unwrap()
}

// Packed ops: kind | reduction << 8 | element type << 16 (f32 = 9).
const F32: u32 = 9 << 16;

#[test]
fn every_kind_on_a_group_of_one() {
    let Some(dev) = gpu_with_nccl() else { return };
    let ch = one_rank_channel(&dev);
    assert_eq!((ch.0.rank(), ch.0.count()), (0, 1));
    let x = [1.0f32, -2.0, 3.5, 4.0];
    let send = buf(&dev, &x);
    for (name, packed, param) in [
        ("all_gather", F32, 0),
        ("all_reduce sum", F32 | 1 | 1 << 8, 0),
        ("all_reduce avg", F32 | 1 | 5 << 8, 0),
        ("all_to_all", F32 | 2, 0),
        ("broadcast", F32 | 3, 0),
        ("reduce max", F32 | 4 | 4 << 8, 0),
        ("reduce_scatter", F32 | 5 | 1 << 8, 0),
        ("send_recv to self", F32 | 8, 0),
    ] {
        let recv = buf(&dev, &[0.0; 4]);
        run(&dev, &ch, packed, param, Some(&send), Some(&recv), 4)
            .unwrap_or_else(|e| panic!("{name}: {e}"));
        assert_eq!(f32s(&recv), x, "{name}");
    }
    // send_recv with no source zeroes the receive buffer.
    let recv = buf(&dev, &[9.0; 4]);
    run(&dev, &ch, F32 | 8, 0xffff_ffff, Some(&send), Some(&recv), 4).unwrap();
    assert_eq!(f32s(&recv), [0.0; 4]);
    // bf16 sums through ncclBfloat16 (two elements of 1.5 and 2.0).
    let b = dev
        .allocator()
        .allocate(
            &BufferParams::new(MemoryType::DEVICE_LOCAL, BufferUsage::DEFAULT),
            4,
        )
        .unwrap();
    b.write(0, &[0xc0, 0x3f, 0x00, 0x40]).unwrap();
    let r = dev
        .allocator()
        .allocate(
            &BufferParams::new(MemoryType::DEVICE_LOCAL, BufferUsage::DEFAULT),
            4,
        )
        .unwrap();
    run(&dev, &ch, 11 << 16 | 1 | 1 << 8, 0, Some(&b), Some(&r), 2).unwrap();
    assert_eq!(r.to_vec().unwrap(), vec![0xc0, 0x3f, 0x00, 0x40]);
}

#[test]
fn bad_collectives_fail_with_reasons() {
    let Some(dev) = gpu_with_nccl() else { return };
    let ch = one_rank_channel(&dev);
    let small = buf(&dev, &[0.0; 2]);
    let four = buf(&dev, &[0.0; 4]);
    let e = run(&dev, &ch, F32 | 1 | 1 << 8, 0, Some(&four), Some(&small), 4)
        .unwrap_err()
        .to_string();
    assert!(e.contains("recv range holds 8 bytes"), "{e}");
    let e = run(&dev, &ch, F32 | 3, 1, Some(&four), Some(&four), 4)
        .unwrap_err()
        .to_string();
    assert!(e.contains("rank 1 is outside the group of 1"), "{e}");
    // i16 reductions: NCCL has no 16-bit integers.
    let e = run(
        &dev,
        &ch,
        2 << 16 | 1 | 1 << 8,
        0,
        Some(&four),
        Some(&four),
        4,
    )
    .unwrap_err()
    .to_string();
    assert!(e.contains("no 16-bit integer reductions"), "{e}");
    // ...but moving them is fine.
    run(&dev, &ch, 2 << 16, 0, Some(&four), Some(&four), 4).unwrap();
}

#[test]
fn channel_parameters_are_checked() {
    let Some(dev) = gpu_with_nccl() else { return };
    let e = dev
        .create_channel(u64::MAX, ChannelParams::default(), None)
        .err()
        .unwrap()
        .to_string();
    assert!(e.contains("no channel provider"), "{e}");
    let params = ChannelParams {
        id: vec![1; 5],
        rank: Some(0),
        count: Some(1),
        ..ChannelParams::default()
    };
    let e = dev
        .create_channel(u64::MAX, params, None)
        .err()
        .unwrap()
        .to_string();
    assert!(e.contains("128 bytes"), "{e}");
    let params = ChannelParams {
        id: vec![0; 128],
        rank: Some(0),
        count: Some(1),
        ..ChannelParams::default()
    };
    let e = dev
        .create_channel(u64::MAX, params, None)
        .err()
        .unwrap()
        .to_string();
    assert!(e.contains("all zeros"), "{e}");
    let params = ChannelParams {
        rank: Some(3),
        count: Some(2),
        ..ChannelParams::default()
    };
    let e = dev
        .create_channel(u64::MAX, params, None)
        .err()
        .unwrap()
        .to_string();
    assert!(e.contains("outside a group of 2"), "{e}");
    // A split of a group of one: same color keeps the rank, no color gives none.
    let ch = one_rank_channel(&dev);
    match ch.0.split(0, 0, 0) {
        Ok(Some(s)) => assert_eq!((s.0.rank(), s.0.count()), (0, 1)),
        Ok(None) => panic!("a colored split gave no channel"),
        Err(e) => assert!(e.to_string().contains("ncclCommSplit"), "{e}"),
    }
    if let Ok(r) = ch.0.split(-1, 0, 0) {
        assert!(r.is_none());
    }
}
