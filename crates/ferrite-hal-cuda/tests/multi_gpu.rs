//! NCCL channels across two GPUs in one process (one thread per rank, the
//! identifier exchanged through a `LocalGroup`): every collective kind
//! against its expected values, channel splits, and (ignored unless asked
//! for) the bus bandwidth of a 1 GiB f32 all-reduce. Needs 2 GPUs and NCCL:
//! skipped with a printed reason otherwise (a failure under
//! `FERRITE_REQUIRE_GPU=1`); `scripts/test-multi-gpu.sh` runs them.

use ferrite_base::Timeout;
use ferrite_hal::allocator::BufferParams;
use ferrite_hal::channel::{ChannelParams, ChannelRef, CollectiveOp, LocalGroup};
use ferrite_hal::command_buffer::{BufferRef, CommandBuffer};
use ferrite_hal::device::{queue, Device};
use ferrite_hal::driver::{Driver, DriverOptions};
use ferrite_hal::{Buffer, BufferUsage, ChannelProvider, Fence, MemoryType, Semaphore};
use ferrite_hal_cuda::{CudaDevice, CudaDriver};
use std::sync::{Arc, Barrier};
use std::time::Instant;

fn skip(why: &str) -> Option<()> {
    if std::env::var("FERRITE_REQUIRE_GPU").as_deref() == Ok("1") {
        panic!("FERRITE_REQUIRE_GPU=1 but {why}");
    }
    println!("SKIPPED: {why}");
    None
}

/// `Some` when two GPUs and NCCL are present.
fn two_gpus() -> Option<()> {
    let n = CudaDriver
        .enumerate(&DriverOptions::default())
        .map(|d| d.len())
        .unwrap_or(0);
    if n < 2 {
        return skip(&format!("2 GPUs needed, {n} found"));
    }
    if let Err(e) = ferrite_hal_cuda::nccl::nccl() {
        return skip(&e.to_string());
    }
    Some(())
}

fn alloc(dev: &Arc<dyn Device>, bytes: u64) -> Buffer {
    dev.allocator()
        .allocate(
            &BufferParams::new(MemoryType::DEVICE_LOCAL, BufferUsage::DEFAULT),
            bytes,
        )
        .unwrap()
}

fn buf(dev: &Arc<dyn Device>, data: &[f32]) -> Buffer {
    let b = alloc(dev, (data.len() * 4) as u64);
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

fn record(
    ch: &ChannelRef,
    packed: u32,
    param: u32,
    send: &Buffer,
    recv: &Buffer,
    count: u64,
) -> CommandBuffer {
    let cb = CommandBuffer::new(0, 0, 0, 0);
    cb.collective(
        ch.clone(),
        CollectiveOp::from_packed(packed).unwrap(),
        param,
        Some(whole(send)),
        Some(whole(recv)),
        count,
    )
    .unwrap();
    cb.finalize().unwrap();
    cb
}

fn execute(dev: &Arc<dyn Device>, cb: &CommandBuffer) {
    let s = Semaphore::new(0);
    queue::execute(
        dev,
        &Fence::new(),
        &Fence::create_at(s.clone(), 1),
        Some(cb),
        vec![],
    )
    .unwrap();
    s.wait(1, Timeout::INFINITE).unwrap();
}

/// Runs `body(rank, device, channel)` on one thread per GPU.
fn on_two_ranks<T: Send>(body: impl Fn(u32, Arc<dyn Device>, ChannelRef) -> T + Sync) -> Vec<T> {
    let group = LocalGroup::new(2).unwrap();
    let body = &body;
    std::thread::scope(|s| {
        let hs: Vec<_> = (0..2u32)
            .map(|r| {
                let provider: Arc<dyn ChannelProvider> = group.rank(r).unwrap();
                s.spawn(move || {
                    let dev: Arc<dyn Device> = CudaDevice::open(r as i32).unwrap();
                    let ch = dev
                        .create_channel(u64::MAX, ChannelParams::default(), Some(&provider))
                        .unwrap();
                    assert_eq!((ch.0.rank(), ch.0.count()), (r, 2));
                    body(r, dev, ch)
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    })
}

const F32: u32 = 9 << 16;

#[test]
fn every_kind_across_two_gpus() {
    if two_gpus().is_none() {
        return;
    }
    let out = on_two_ranks(|r, dev, ch| {
        let x: Vec<f32> = (0..4).map(|i| (10 * r + i) as f32).collect();
        let send = buf(&dev, &x);
        let mut got = Vec::new();
        for (packed, param, count, recv_len) in [
            (F32 | 1 | 1 << 8, 0, 4, 4),              // all_reduce sum
            (F32 | 1 | 4 << 8, 0, 4, 4),              // all_reduce max
            (F32 | 1 | 5 << 8, 0, 4, 4),              // all_reduce avg
            (F32, 0, 4, 8),                           // all_gather (per-rank count)
            (F32, 0, 8, 8),                           // all_gather (the compiler's total)
            (F32 | 2, 0, 4, 4),                       // all_to_all
            (F32 | 3, 1, 4, 4),                       // broadcast from rank 1
            (F32 | 5 | 1 << 8, 0, 2, 2),              // reduce_scatter
            (F32 | 8, (1 - r) | (1 - r) << 16, 4, 4), // send_recv swap
        ] {
            let recv = buf(&dev, &vec![0.0; recv_len]);
            let cb = record(&ch, packed, param, &send, &recv, count);
            execute(&dev, &cb);
            got.push(f32s(&recv));
        }
        got
    });
    let (a, b) = ([0.0f32, 1.0, 2.0, 3.0], [10.0f32, 11.0, 12.0, 13.0]);
    let gathered: Vec<f32> = a.iter().chain(b.iter()).copied().collect();
    for (r, got) in out.iter().enumerate() {
        assert_eq!(got[0], vec![10.0, 12.0, 14.0, 16.0], "rank {r} sum");
        assert_eq!(got[1], b.to_vec(), "rank {r} max");
        assert_eq!(got[2], vec![5.0, 6.0, 7.0, 8.0], "rank {r} avg");
        assert_eq!(got[3], gathered, "rank {r} all_gather");
        assert_eq!(got[4], gathered, "rank {r} all_gather total");
        let mine = if r == 0 {
            [0.0, 1.0, 10.0, 11.0]
        } else {
            [2.0, 3.0, 12.0, 13.0]
        };
        assert_eq!(got[5], mine.to_vec(), "rank {r} all_to_all");
        assert_eq!(got[6], b.to_vec(), "rank {r} broadcast");
        let half = if r == 0 { [10.0, 12.0] } else { [14.0, 16.0] };
        assert_eq!(got[7], half.to_vec(), "rank {r} reduce_scatter");
        let other = if r == 0 { b } else { a };
        assert_eq!(got[8], other.to_vec(), "rank {r} send_recv");
    }
}

#[test]
fn split_into_singletons() {
    if two_gpus().is_none() {
        return;
    }
    let out = on_two_ranks(|r, dev, ch| match ch.0.split(r as i32, 0, 0) {
        Err(e) => {
            println!("split: {e}");
            assert!(e.to_string().contains("ncclCommSplit"), "{e}");
            None
        }
        Ok(s) => {
            let s = s.expect("a colored split gives a channel");
            let x = buf(&dev, &[r as f32 + 1.0; 4]);
            let y = buf(&dev, &[0.0; 4]);
            execute(&dev, &record(&s, F32 | 1 | 1 << 8, 0, &x, &y, 4));
            Some((s.0.rank(), s.0.count(), f32s(&y)))
        }
    });
    for (r, o) in out.into_iter().enumerate() {
        if let Some((rank, count, y)) = o {
            assert_eq!((rank, count), (0, 1));
            assert_eq!(y, vec![r as f32 + 1.0; 4]);
        }
    }
}

/// Bus bandwidth of a 1 GiB f32 all-reduce (NCCL's definition:
/// busbw = 2 (n-1)/n * bytes / time), printed as `busbw_GBps=`.
#[test]
#[ignore = "a benchmark: scripts/test-multi-gpu.sh runs it"]
fn bench_all_reduce_1gib() {
    if two_gpus().is_none() {
        return;
    }
    let bytes: u64 = 1 << 30;
    let iters = 20;
    let start = Barrier::new(2);
    let times = on_two_ranks(|_, dev, ch| {
        let x = alloc(&dev, bytes);
        let y = alloc(&dev, bytes);
        let cb = record(&ch, F32 | 1 | 1 << 8, 0, &x, &y, bytes / 4);
        for _ in 0..5 {
            execute(&dev, &cb);
        }
        start.wait();
        let t = Instant::now();
        let s = Semaphore::new(0);
        for i in 0..iters {
            queue::execute(
                &dev,
                &Fence::create_at(s.clone(), i),
                &Fence::create_at(s.clone(), i + 1),
                Some(&cb),
                vec![],
            )
            .unwrap();
        }
        s.wait(iters, Timeout::INFINITE).unwrap();
        t.elapsed().as_secs_f64() / iters as f64
    });
    let dt = times.iter().cloned().fold(0.0, f64::max);
    let algbw = bytes as f64 / dt / 1e9;
    let busbw = algbw * 2.0 * (2.0 - 1.0) / 2.0;
    println!(
        "ferrite all_reduce 1GiB f32 2 GPUs: time_ms={:.3} algbw_GBps={algbw:.1} busbw_GBps={busbw:.1}",
        dt * 1e3
    );
}
