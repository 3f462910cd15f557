//! CPU collective channels at the HAL level: ranks of one process, one
//! thread and one device each, running every collective kind, reduction and
//! element type through command buffers, on `local-sync` and on
//! `local-task` (with one worker per device, the tightest pool), against
//! results computed here; and the failures a user meets (disagreeing
//! ranks, a rank that never arrives, no in-process group).

use ferrite_base::{Result, StatusCode, Timeout};
use ferrite_hal::allocator::BufferParams;
use ferrite_hal::buffer::Buffer;
use ferrite_hal::channel::{
    ChannelParams, ChannelProvider, ChannelRef, CollectiveElementType as E, CollectiveKind as K,
    CollectiveOp, LocalGroup, Reduction as R, NO_COLOR,
};
use ferrite_hal::command_buffer::{mode, BufferRef, CommandBuffer};
use ferrite_hal::device::{queue, Device};
use ferrite_hal::fence::Fence;
use ferrite_hal::memory::{BufferUsage, MemoryType};
use ferrite_hal::numerics;
use ferrite_hal::semaphore::Semaphore;
use ferrite_hal_cpu::CpuDevice;
use std::any::Any;
use std::sync::Arc;
use std::time::Duration;

type MakeDevice = fn() -> Arc<dyn Device>;

fn local_sync() -> Arc<dyn Device> {
    CpuDevice::local_sync()
}

fn local_task() -> Arc<dyn Device> {
    CpuDevice::local_task(1).expect("local-task device")
}

const DEVICES: [(&str, MakeDevice); 2] = [("local-sync", local_sync), ("local-task", local_task)];

/// Runs `body(rank, device, channel)` on `n` threads, each rank with its own
/// device and the group's provider, and returns the results in rank order.
fn on_ranks<T: Send + 'static>(
    n: u32,
    make: MakeDevice,
    timeout: Duration,
    body: impl Fn(u32, &Arc<dyn Device>, ChannelRef) -> T + Send + Sync + 'static,
) -> Vec<T> {
    let group = LocalGroup::with_timeout(n, timeout).unwrap();
    let body = Arc::new(body);
    let handles: Vec<_> = (0..n)
        .map(|r| {
            let provider: Arc<dyn ChannelProvider> = group.rank(r).unwrap();
            let body = body.clone();
            std::thread::spawn(move || {
                let dev = make();
                let ch = dev
                    .create_channel(u64::MAX, ChannelParams::default(), Some(&provider))
                    .expect("create channel");
                assert_eq!((ch.0.rank(), ch.0.count()), (r, n));
                body(r, &dev, ch)
            })
        })
        .collect();
    handles.into_iter().map(|h| h.join().unwrap()).collect()
}

fn buffer(dev: &Arc<dyn Device>, bytes: &[u8], size: usize) -> Buffer {
    let params = BufferParams::new(MemoryType::DEVICE_LOCAL, BufferUsage::DEFAULT);
    let b = dev
        .allocator()
        .allocate(&params, size.max(1) as u64)
        .unwrap();
    b.write(0, bytes).unwrap();
    b
}

fn whole(b: &Buffer, len: usize) -> BufferRef {
    BufferRef::Direct {
        buffer: b.clone(),
        offset: 0,
        length: len as u64,
    }
}

/// Executes one collective on this rank: `send` bytes in, `recv_len` bytes
/// out (the receive buffer starts filled with 0xEE).
fn run(
    dev: &Arc<dyn Device>,
    ch: &ChannelRef,
    op: CollectiveOp,
    param: u32,
    send: Option<&[u8]>,
    recv_len: usize,
    element_count: u64,
) -> Result<Vec<u8>> {
    let cb = CommandBuffer::new(mode::ONE_SHOT, 3, u64::MAX, 0);
    let s = send.map(|s| buffer(dev, s, s.len()));
    let r = (op.kind != K::Send).then(|| buffer(dev, &vec![0xEE; recv_len], recv_len));
    cb.collective(
        ch.clone(),
        op,
        param,
        s.as_ref().map(|b| whole(b, send.unwrap().len())),
        r.as_ref().map(|b| whole(b, recv_len)),
        element_count,
    )?;
    cb.finalize()?;
    let done = Fence::create_at(Semaphore::new(0), 1);
    queue::execute(dev, &Fence::new(), &done, Some(&cb), vec![])?;
    done.wait(Timeout::from_duration(Duration::from_secs(30)))?;
    match r {
        Some(r) => r.to_vec(),
        None => Ok(Vec::new()),
    }
}

fn op(kind: K, reduction: R, element_type: E) -> CollectiveOp {
    CollectiveOp {
        kind,
        reduction,
        element_type,
    }
}

const ALL_TYPES: [E; 12] = [
    E::Sint8,
    E::Uint8,
    E::Sint16,
    E::Uint16,
    E::Sint32,
    E::Uint32,
    E::Sint64,
    E::Uint64,
    E::Float16,
    E::Float32,
    E::Float64,
    E::BFloat16,
];

fn is_float(t: E) -> bool {
    matches!(t, E::Float16 | E::Float32 | E::Float64 | E::BFloat16)
}

/// Encodes `values` as `t` (integers wrap, as a C cast).
fn encode(t: E, values: &[f64]) -> Vec<u8> {
    let mut out = Vec::new();
    for &v in values {
        let i = v as i128;
        match t {
            E::Sint8 => out.extend((i as i8).to_le_bytes()),
            E::Uint8 => out.extend((i as u8).to_le_bytes()),
            E::Sint16 => out.extend((i as i16).to_le_bytes()),
            E::Uint16 => out.extend((i as u16).to_le_bytes()),
            E::Sint32 => out.extend((i as i32).to_le_bytes()),
            E::Uint32 => out.extend((i as u32).to_le_bytes()),
            E::Sint64 => out.extend((i as i64).to_le_bytes()),
            E::Uint64 => out.extend((i as u64).to_le_bytes()),
            E::Float16 => out.extend(numerics::f32_to_f16(v as f32).to_le_bytes()),
            E::BFloat16 => out.extend(numerics::f32_to_bf16(v as f32).to_le_bytes()),
            E::Float32 => out.extend((v as f32).to_le_bytes()),
            E::Float64 => out.extend(v.to_le_bytes()),
        }
    }
    out
}

fn decode(t: E, bytes: &[u8]) -> Vec<f64> {
    let size = t.byte_size() as usize;
    bytes
        .chunks_exact(size)
        .map(|b| match t {
            E::Sint8 => b[0] as i8 as f64,
            E::Uint8 => b[0] as f64,
            E::Sint16 => i16::from_le_bytes([b[0], b[1]]) as f64,
            E::Uint16 => u16::from_le_bytes([b[0], b[1]]) as f64,
            E::Float16 => numerics::f16_to_f32(u16::from_le_bytes([b[0], b[1]])) as f64,
            E::BFloat16 => numerics::bf16_to_f32(u16::from_le_bytes([b[0], b[1]])) as f64,
            E::Sint32 => i32::from_le_bytes(b.try_into().unwrap()) as f64,
            E::Uint32 => u32::from_le_bytes(b.try_into().unwrap()) as f64,
            E::Float32 => f32::from_le_bytes(b.try_into().unwrap()) as f64,
            E::Sint64 => i64::from_le_bytes(b.try_into().unwrap()) as f64,
            E::Uint64 => u64::from_le_bytes(b.try_into().unwrap()) as f64,
            E::Float64 => f64::from_le_bytes(b.try_into().unwrap()),
        })
        .collect()
}

/// Rank `r`'s values: small, distinct per rank and element, negative for
/// some elements of signed types.
fn values(t: E, r: u32, n: usize) -> Vec<f64> {
    let signed = !matches!(t, E::Uint8 | E::Uint16 | E::Uint32 | E::Uint64);
    (0..n)
        .map(|i| {
            let v = ((r as usize * 5 + i * 3) % 7 + 1) as f64;
            if signed && (i + r as usize).is_multiple_of(3) {
                -v
            } else {
                v
            }
        })
        .collect()
}

/// What a reduction of `inputs` (per rank) gives, computed in f64 and
/// encoded as `t` (integer results wrap as the devices' do).
fn expected_reduction(t: E, red: R, inputs: &[Vec<f64>]) -> Vec<u8> {
    let n = inputs.len();
    let out: Vec<f64> = (0..inputs[0].len())
        .map(|i| {
            let col = inputs.iter().map(|v| v[i]);
            match red {
                R::Sum => col.sum(),
                R::Product => col.product(),
                R::Minimum => col.fold(f64::INFINITY, f64::min),
                R::Maximum => col.fold(f64::NEG_INFINITY, f64::max),
                R::Average if is_float(t) => col.sum::<f64>() / n as f64,
                // Integer averages truncate toward zero.
                R::Average => (col.sum::<f64>() as i128 / n as i128) as f64,
                R::None => unreachable!(),
            }
        })
        .collect();
    encode(t, &out)
}

fn assert_close(t: E, got: &[u8], want: &[u8], what: &str) {
    if !is_float(t) {
        assert_eq!(got, want, "{what}");
        return;
    }
    let (g, w) = (decode(t, got), decode(t, want));
    let tol = match t {
        E::Float16 => 1e-3,
        E::BFloat16 => 1e-2,
        _ => 1e-6,
    };
    assert_eq!(g.len(), w.len(), "{what}");
    for (i, (a, b)) in g.iter().zip(&w).enumerate() {
        assert!(
            (a - b).abs() <= tol * b.abs().max(1.0),
            "{what}: element {i}: {a} != {b}"
        );
    }
}

#[test]
fn reductions_of_every_type_and_operation() {
    const N: u32 = 3;
    const COUNT: usize = 5;
    for (dev_name, make) in DEVICES {
        let results = on_ranks(N, make, Duration::from_secs(30), |r, dev, ch| {
            let mut out = Vec::new();
            for t in ALL_TYPES {
                for red in [R::Sum, R::Product, R::Minimum, R::Maximum, R::Average] {
                    let send = encode(t, &values(t, r, COUNT));
                    let size = t.byte_size() as usize;
                    let all = run(
                        dev,
                        &ch,
                        op(K::AllReduce, red, t),
                        0,
                        Some(&send),
                        COUNT * size,
                        COUNT as u64,
                    )
                    .unwrap();
                    // Reduce to rank 1: others' receive buffers stay untouched.
                    let one = run(
                        dev,
                        &ch,
                        op(K::Reduce, red, t),
                        1,
                        Some(&send),
                        COUNT * size,
                        COUNT as u64,
                    )
                    .unwrap();
                    out.push((t, red, all, one));
                }
            }
            out
        });
        for (r, per_rank) in results.iter().enumerate() {
            for (k, (t, red, all, one)) in per_rank.iter().enumerate() {
                let inputs: Vec<_> = (0..N).map(|q| values(*t, q, COUNT)).collect();
                let want = expected_reduction(*t, *red, &inputs);
                let what = format!("{dev_name} rank {r} {t:?} {red:?}");
                assert_close(*t, all, &want, &format!("all_reduce {what}"));
                if r == 1 {
                    assert_close(*t, one, &want, &format!("reduce {what}"));
                } else {
                    assert!(
                        one.iter().all(|&b| b == 0xEE),
                        "reduce {what} wrote {one:?}"
                    );
                }
                // Every rank computes bit-identical results.
                assert_eq!(all, &results[0][k].2, "{what}");
            }
        }
    }
}

#[test]
fn half_precision_reductions_round_in_the_type() {
    // 2049 is not an f16: 2048 + 1 rounds to 2048 at each step.
    for (dev_name, make) in DEVICES {
        let out = on_ranks(2, make, Duration::from_secs(30), |r, dev, ch| {
            let v = if r == 0 { 2048.0 } else { 1.0 };
            let f16 = run(
                dev,
                &ch,
                op(K::AllReduce, R::Sum, E::Float16),
                0,
                Some(&encode(E::Float16, &[v, 0.5])),
                4,
                2,
            )
            .unwrap();
            let bf16 = run(
                dev,
                &ch,
                op(K::AllReduce, R::Maximum, E::BFloat16),
                0,
                Some(&encode(E::BFloat16, &[v, -(r as f64)])),
                4,
                2,
            )
            .unwrap();
            (decode(E::Float16, &f16), decode(E::BFloat16, &bf16))
        });
        for (f16, bf16) in out {
            assert_eq!(f16, [2048.0, 1.0], "{dev_name}");
            assert_eq!(bf16, [2048.0, 0.0], "{dev_name}");
        }
    }
}

fn f32s(v: &[f32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

fn to_f32(b: &[u8]) -> Vec<f32> {
    b.chunks_exact(4)
        .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
        .collect()
}

#[test]
fn data_movement_kinds() {
    const N: u32 = 4;
    for (dev_name, make) in DEVICES {
        let out = on_ranks(N, make, Duration::from_secs(30), |r, dev, ch| {
            let f = |k| op(k, R::None, E::Float32);
            let base = r as f32 * 10.0;
            let mine: Vec<f32> = (0..4).map(|i| base + i as f32).collect();
            // all_gather as upstream's header counts (per rank) ...
            let g1 = run(dev, &ch, f(K::AllGather), 0, Some(&f32s(&mine[..2])), 32, 2).unwrap();
            // ... and as the compiler records it (the gathered total).
            let g2 = run(dev, &ch, f(K::AllGather), 0, Some(&f32s(&mine[..2])), 32, 8).unwrap();
            let a2a = run(dev, &ch, f(K::AllToAll), 0, Some(&f32s(&mine)), 16, 4).unwrap();
            let bc = run(dev, &ch, f(K::Broadcast), 2, Some(&f32s(&mine)), 16, 4).unwrap();
            let rs = run(
                dev,
                &ch,
                op(K::ReduceScatter, R::Sum, E::Float32),
                0,
                Some(&f32s(&[base; 8])),
                8,
                2,
            )
            .unwrap();
            // A ring without the last link: rank 3 sends to nobody, so
            // rank 0 receives zeros.
            let to = if r == N - 1 { 0xffff } else { r + 1 };
            let from = if r == 0 { 0xffff } else { r - 1 };
            let ring = run(
                dev,
                &ch,
                f(K::SendRecv),
                (from << 16) | to,
                Some(&f32s(&mine[..2])),
                8,
                2,
            )
            .unwrap();
            // Point to point: 0 -> 1 and 3 -> 2, twice each (in order).
            let mut p2p = Vec::new();
            for round in 0..2 {
                let payload = f32s(&[base + 100.0 * round as f32]);
                match r {
                    0 | 3 => {
                        run(
                            dev,
                            &ch,
                            f(K::Send),
                            if r == 0 { 1 } else { 2 },
                            Some(&payload),
                            0,
                            1,
                        )
                        .unwrap();
                    }
                    _ => {
                        let from = if r == 1 { 0 } else { 3 };
                        p2p.extend(to_f32(
                            &run(dev, &ch, f(K::Recv), from, None, 4, 1).unwrap(),
                        ));
                    }
                }
            }
            [g1, g2, a2a, bc, rs, ring]
                .map(|b| to_f32(&b))
                .to_vec()
                .into_iter()
                .chain([p2p])
                .collect::<Vec<_>>()
        });
        for (r, got) in out.iter().enumerate() {
            let what = format!("{dev_name} rank {r}");
            let gathered = [0., 1., 10., 11., 20., 21., 30., 31.];
            assert_eq!(got[0], gathered, "all_gather per rank, {what}");
            assert_eq!(got[1], gathered, "all_gather total, {what}");
            let a2a: Vec<f32> = (0..4).map(|q| q as f32 * 10.0 + r as f32).collect();
            assert_eq!(got[2], a2a, "all_to_all, {what}");
            assert_eq!(got[3], [20., 21., 22., 23.], "broadcast, {what}");
            assert_eq!(got[4], [60., 60.], "reduce_scatter, {what}");
            let ring = if r == 0 {
                vec![0., 0.]
            } else {
                vec![(r - 1) as f32 * 10.0, (r - 1) as f32 * 10.0 + 1.0]
            };
            assert_eq!(got[5], ring, "send_recv, {what}");
            let p2p = match r {
                1 => vec![0., 100.],
                2 => vec![30., 130.],
                _ => vec![],
            };
            assert_eq!(got[6], p2p, "send/recv, {what}");
        }
    }
}

#[test]
fn split_forms_subgroups_ordered_by_key() {
    for (dev_name, make) in DEVICES {
        let out = on_ranks(4, make, Duration::from_secs(30), |r, dev, ch| {
            // Colors: even ranks, odd ranks; rank 3 joins none. Keys reverse
            // the order within a color.
            let color = if r == 3 { NO_COLOR } else { (r % 2) as i32 };
            let sub = ch.0.split(color, -(r as i32), 0).unwrap();
            let sub = sub?;
            let sum = run(
                dev,
                &sub,
                op(K::AllReduce, R::Sum, E::Sint32),
                0,
                Some(&(r as i32 + 1).to_le_bytes()),
                4,
                1,
            )
            .unwrap();
            Some((
                sub.0.rank(),
                sub.0.count(),
                i32::from_le_bytes(sum.try_into().unwrap()),
            ))
        });
        // {0, 2} in key order is [2, 0]; {1} alone.
        assert_eq!(
            out,
            [Some((1, 2, 4)), Some((0, 1, 2)), Some((0, 2, 4)), None],
            "{dev_name}"
        );
    }
}

#[test]
fn disagreements_fail_every_rank_naming_them() {
    for (dev_name, make) in DEVICES {
        let out = on_ranks(2, make, Duration::from_secs(30), |r, dev, ch| {
            let f = op(K::AllReduce, R::Sum, E::Float32);
            let count = if r == 0 { 2 } else { 1 };
            let counts = run(dev, &ch, f, 0, Some(&[0u8; 8]), 8, count).unwrap_err();
            let root = run(
                dev,
                &ch,
                op(K::Broadcast, R::None, E::Float32),
                5,
                Some(&[0u8; 4]),
                4,
                1,
            )
            .unwrap_err();
            // A receive range too small on rank 1 only.
            let small = run(
                dev,
                &ch,
                f,
                0,
                Some(&[0u8; 8]),
                if r == 1 { 4 } else { 8 },
                2,
            )
            .unwrap_err();
            // The channel still works after failed operations.
            let ok = run(dev, &ch, f, 0, Some(&f32s(&[1.0])), 4, 1).unwrap();
            [counts, root, small]
                .map(|e| e.to_string())
                .to_vec()
                .into_iter()
                .chain([format!("{:?}", to_f32(&ok))])
                .collect::<Vec<_>>()
        });
        for (r, msgs) in out.iter().enumerate() {
            let what = format!("{dev_name} rank {r}");
            assert!(
                msgs[0].contains("rank 0 has 2, rank 1 has 1"),
                "{what}: {}",
                msgs[0]
            );
            assert!(
                msgs[1].contains("root rank 5 of broadcast is outside the channel's 2 ranks"),
                "{what}: {}",
                msgs[1]
            );
            assert!(
                msgs[2].contains("rank 1 failed: recv range of 4 bytes"),
                "{what}: {}",
                msgs[2]
            );
            assert_eq!(msgs[3], "[2.0]", "{what}");
        }
    }
}

#[test]
fn large_all_reduces_share_the_work_and_agree() {
    // Above the size where ranks reduce a part each; 3 ranks, uneven parts.
    const COUNT: usize = 100_003;
    for (dev_name, make) in DEVICES {
        let out = on_ranks(3, make, Duration::from_secs(30), |r, dev, ch| {
            let t = E::Float32;
            let send = encode(t, &values(t, r, COUNT));
            let sum = run(
                dev,
                &ch,
                op(K::AllReduce, R::Sum, t),
                0,
                Some(&send),
                COUNT * 4,
                COUNT as u64,
            )
            .unwrap();
            let h = E::BFloat16;
            let send = encode(h, &values(h, r, COUNT));
            let avg = run(
                dev,
                &ch,
                op(K::AllReduce, R::Average, h),
                0,
                Some(&send),
                COUNT * 2,
                COUNT as u64,
            )
            .unwrap();
            (sum, avg)
        });
        let inputs = |t| (0..3).map(|q| values(t, q, COUNT)).collect::<Vec<_>>();
        let want_sum = expected_reduction(E::Float32, R::Sum, &inputs(E::Float32));
        let want_avg = expected_reduction(E::BFloat16, R::Average, &inputs(E::BFloat16));
        for (r, (sum, avg)) in out.iter().enumerate() {
            assert_close(
                E::Float32,
                sum,
                &want_sum,
                &format!("{dev_name} rank {r} sum"),
            );
            assert_close(
                E::BFloat16,
                avg,
                &want_avg,
                &format!("{dev_name} rank {r} average"),
            );
            assert_eq!(
                (sum, avg),
                (&out[0].0, &out[0].1),
                "{dev_name}: ranks agree bit for bit"
            );
        }
    }
}

#[test]
fn huge_element_counts_are_errors_on_every_rank() {
    for (dev_name, make) in DEVICES {
        let out = on_ranks(2, make, Duration::from_secs(30), |_, dev, ch| {
            let mut msgs = Vec::new();
            for kind in [K::AllReduce, K::AllGather, K::ReduceScatter, K::SendRecv] {
                let red = if kind.is_reduction() { R::Sum } else { R::None };
                let e = run(
                    dev,
                    &ch,
                    op(kind, red, E::Float64),
                    0,
                    Some(&[0u8; 8]),
                    8,
                    u64::MAX / 4,
                );
                msgs.push(e.unwrap_err().to_string());
            }
            msgs
        });
        for (r, msgs) in out.iter().enumerate() {
            for m in msgs {
                assert!(
                    m.contains("rank 0 failed")
                        && (m.contains("overflow") || m.contains("smaller than")),
                    "{dev_name} rank {r}: {m}"
                );
            }
        }
    }
}

#[test]
fn a_rank_that_never_arrives_is_a_deadline_error() {
    for (dev_name, make) in DEVICES {
        let out = on_ranks(2, make, Duration::from_millis(300), |r, dev, ch| {
            if r == 1 {
                return None;
            }
            let e = run(
                dev,
                &ch,
                op(K::AllReduce, R::Sum, E::Float32),
                0,
                Some(&[0u8; 4]),
                4,
                1,
            )
            .unwrap_err();
            Some(e)
        });
        let e = out[0].as_ref().unwrap();
        assert_eq!(e.code(), StatusCode::DeadlineExceeded, "{dev_name}: {e}");
        assert!(
            e.to_string().contains("waiting for ranks [1]"),
            "{dev_name}: {e}"
        );
    }
}

/// A provider that is not an in-process group (as one reading launcher
/// environment variables would be).
struct Elsewhere;

impl ChannelProvider for Elsewhere {
    fn default_rank_and_count(&self) -> Result<(u32, u32)> {
        Ok((0, 2))
    }
    fn exchange_default_id(&self, _key: &str, _id: &mut [u8]) -> Result<()> {
        Ok(())
    }
    fn as_any(&self) -> &dyn Any {
        self
    }
}

#[test]
fn channels_need_an_in_process_group() {
    for (dev_name, make) in DEVICES {
        let dev = make();
        let e = dev
            .create_channel(u64::MAX, ChannelParams::default(), None)
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("no channel provider was given"),
            "{dev_name}: {e}"
        );
        let other: Arc<dyn ChannelProvider> = Arc::new(Elsewhere);
        let e = dev
            .create_channel(u64::MAX, ChannelParams::default(), Some(&other))
            .unwrap_err()
            .to_string();
        assert!(e.contains("devices of one process only"), "{dev_name}: {e}");
        let group = LocalGroup::new(2).unwrap();
        let p: Arc<dyn ChannelProvider> = group.rank(1).unwrap();
        let params = ChannelParams {
            count: Some(3),
            ..ChannelParams::default()
        };
        let e = dev
            .create_channel(u64::MAX, params, Some(&p))
            .unwrap_err()
            .to_string();
        assert!(e.contains("channel count 3 differs"), "{dev_name}: {e}");
    }
}
