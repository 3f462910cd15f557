//! Programs with collectives (stablehlo `all_reduce`, `all_gather`,
//! `reduce_scatter`, `all_to_all`, `collective_permute`, with replica
//! groups that split the default channel), compiled by the pinned compiler
//! from `tests/collectives/*.mlir` and run on 2 and 4 ranks in one process
//! through `ferrite::spmd`, on `local-sync` and on `local-task` with one
//! worker per rank, against results worked out here; and a matmul split
//! across 2 and 4 ranks along the contracted dimension (partial products
//! summed by an all-reduce) against the same matmul on one device.

mod common;
mod two_ranks_case;

use ferrite::{spmd, Instance, Tensor, Value};
use std::path::PathBuf;

fn program(name: &str) -> PathBuf {
    let src = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join(format!("../../tests/collectives/{name}.mlir"));
    let out = ferrite_testkit::target_tmpdir!("ferrite-collectives").join(format!("{name}.vmfb"));
    ferrite_testkit::compile_file(&src, &out, ferrite_testkit::GENERIC_CPU)
}

const DEVICES: [&str; 2] = ["local-sync", "local-task://?workers=1"];

use two_ranks_case::{f32_in, f32_out};

#[test]
fn two_ranks_run_every_collective() {
    let module = std::fs::read(program("two_ranks")).unwrap();
    let instance = Instance::new();
    for device in DEVICES {
        let out = spmd::run(2, |rank| {
            let r = rank.rank();
            let mut s = rank.session(&instance, &[device])?;
            s.load_bytes(module.clone())?;
            let common = two_ranks_case::run(&mut s, r)?;
            let max = s.call(
                "all_reduce_max_singletons",
                &[Value::from(Tensor::from_i32(&[3], &[r as i32, -5, 7])?)],
            )?;
            let id = s.call("replica_id", &[])?;
            let id = id[0].as_tensor().unwrap().to_vec::<u32>()?;
            Ok((common, max[0].as_tensor().unwrap().to_i32_vec()?, id))
        })
        .unwrap_or_else(|e| panic!("{device}: {e}"));
        for (r, (common, max, id)) in out.into_iter().enumerate() {
            let what = format!("{device} rank {r}");
            two_ranks_case::check(&common, r, &what);
            // Singleton groups: each rank reduces with itself only.
            assert_eq!(
                max,
                [r as i32, -5, 7],
                "all_reduce in singleton groups, {what}"
            );
            // replica_id reads the channel's rank (hal.channel.rank_and_count).
            assert_eq!(id, [r as u32], "replica_id, {what}");
        }
    }
}

#[test]
fn four_ranks_split_groups_and_an_open_ring() {
    let module = std::fs::read(program("four_ranks")).unwrap();
    let instance = Instance::new();
    for device in DEVICES {
        let out = spmd::run(4, |rank| {
            let r = rank.rank() as i32;
            let mut s = rank.session(&instance, &[device])?;
            s.load_bytes(module.clone())?;
            let pairs = s.call(
                "all_reduce_pairs",
                &[Value::from(Tensor::from_i32(&[2], &[r, 100 * r])?)],
            )?;
            let ring = s.call("open_ring", &[f32_in(&[2], &[r as f32, -(r as f32)])])?;
            Ok((
                pairs[0].as_tensor().unwrap().to_i32_vec()?,
                f32_out(&ring[0]),
            ))
        })
        .unwrap_or_else(|e| panic!("{device}: {e}"));
        for (r, (pairs, ring)) in out.into_iter().enumerate() {
            let what = format!("{device} rank {r}");
            // Groups {0, 2} and {1, 3}.
            let peer = (r + 2) % 4;
            assert_eq!(
                pairs,
                [(r + peer) as i32, 100 * (r + peer) as i32],
                "{what}"
            );
            // 0 -> 1 -> 2 -> 3; nobody sends to 0, which receives zeros.
            let want = if r == 0 {
                vec![0., 0.]
            } else {
                vec![(r - 1) as f32, -((r - 1) as f32)]
            };
            assert_eq!(ring, want, "{what}");
        }
    }
}

#[test]
fn run_program_returns_each_ranks_results() {
    let module = std::fs::read(program("two_ranks")).unwrap();
    let instance = Instance::new();
    let inputs = (0..2).map(|r| vec![f32_in(&[4], &[r as f32; 4])]).collect();
    let out = spmd::run_program(
        &instance,
        &["local-task"],
        &module,
        "all_reduce_sum",
        inputs,
    )
    .unwrap();
    assert_eq!(out.len(), 2);
    for results in out {
        assert_eq!(f32_out(&results[0]), [1.; 4]);
    }
}

#[test]
fn a_failing_rank_stops_its_peers_and_is_reported() {
    let module = std::fs::read(program("two_ranks")).unwrap();
    let instance = Instance::new();
    let e = spmd::run(2, |rank| {
        let mut s = rank.session(&instance, &["local-sync"])?;
        s.load_bytes(module.clone())?;
        // Rank 1 passes a tensor of the wrong shape and never reaches the
        // collective; rank 0 must not wait for it for long.
        let n = if rank.rank() == 1 { 5 } else { 4 };
        s.call("all_reduce_sum", &[f32_in(&[n], &vec![1.; n as usize])])
    })
    .unwrap_err()
    .to_string();
    assert!(e.contains("rank 1"), "{e}");
    assert!(
        !e.contains("collective group failed"),
        "the root cause, not a peer's report: {e}"
    );
}

#[test]
fn a_program_with_collectives_needs_ranks() {
    let module = std::fs::read(program("two_ranks")).unwrap();
    let instance = Instance::new();
    let mut s = ferrite::Session::new(&instance, "local-sync").unwrap();
    s.load_bytes(module).unwrap();
    let e = s
        .call("all_reduce_sum", &[f32_in(&[4], &[1.; 4])])
        .unwrap_err()
        .to_string();
    assert!(e.contains("no channel provider was given"), "{e}");
}

/// `rows x cols` values of a fixed pseudo-random sequence in [-1, 1).
fn matrix(rows: usize, cols: usize, seed: u32) -> Vec<f32> {
    let mut s = seed.wrapping_mul(2654435761).wrapping_add(1);
    (0..rows * cols)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 17;
            s ^= s << 5;
            (s % 2048) as f32 / 1024.0 - 1.0
        })
        .collect()
}

#[test]
fn a_tensor_parallel_matmul_matches_one_device() {
    let module = std::fs::read(program("tp_matmul")).unwrap();
    let instance = Instance::new();
    let (m, k, n) = (16usize, 64usize, 24usize);
    let a = matrix(m, k, 1);
    let b = matrix(k, n, 2);
    let mut single = ferrite::Session::new(&instance, "local-task").unwrap();
    single.load_bytes(module.clone()).unwrap();
    let want = f32_out(
        &single
            .call(
                "matmul",
                &[
                    f32_in(&[m as u64, k as u64], &a),
                    f32_in(&[k as u64, n as u64], &b),
                ],
            )
            .unwrap()[0],
    );
    for (ranks, function) in [(2usize, "tp_matmul_2"), (4, "tp_matmul_4")] {
        let shard = k / ranks;
        let out = spmd::run(ranks as u32, |rank| {
            let r = rank.rank() as usize;
            // Rank r: columns r*shard.. of A, rows r*shard.. of B.
            let a_r: Vec<f32> = (0..m)
                .flat_map(|i| a[i * k + r * shard..i * k + (r + 1) * shard].to_vec())
                .collect();
            let b_r = b[r * shard * n..(r + 1) * shard * n].to_vec();
            let mut s = rank.session(&instance, &["local-task://?workers=1"])?;
            s.load_bytes(module.clone())?;
            let c = s.call(
                function,
                &[
                    f32_in(&[m as u64, shard as u64], &a_r),
                    f32_in(&[shard as u64, n as u64], &b_r),
                ],
            )?;
            Ok(f32_out(&c[0]))
        })
        .unwrap();
        for (r, c) in out.iter().enumerate() {
            assert_eq!(c, &out[0], "{function}: ranks agree bit for bit (rank {r})");
            for (i, (x, y)) in c.iter().zip(&want).enumerate() {
                assert!(
                    (x - y).abs() <= 1e-4 * y.abs().max(1.0),
                    "{function} rank {r} element {i}: {x} vs {y}"
                );
            }
        }
    }
}
