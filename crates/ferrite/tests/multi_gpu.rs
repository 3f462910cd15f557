//! Programs with collectives on two GPUs through NCCL, compiled by the
//! pinned compiler for cuda (`tests/collectives/*.mlir`, sm_80): one process
//! driving both GPUs (`ferrite::spmd`, one thread and one `cuda://R` device
//! per rank) and one process per GPU (two child processes of this test
//! binary with torchrun's variables and a `FERRITE_STORE`, the provider
//! from `ferrite::rendezvous::from_env`), checked against results worked
//! out here and, for a tensor-parallel matmul, against one GPU.
//!
//! Needs 2 GPUs and NCCL: skipped with a printed reason otherwise (a
//! failure under `FERRITE_REQUIRE_GPU=1`). Modules come from
//! `FERRITE_MULTI_GPU_DIR/<name>.cuda.vmfb` when set (a GPU machine without
//! the compiler), else they are compiled here.

use ferrite::{spmd, Instance, Session};
use ferrite_hal::driver::{Driver, DriverOptions};
use std::path::PathBuf;

fn skip(why: &str) -> bool {
    if std::env::var("FERRITE_REQUIRE_GPU").as_deref() == Ok("1") {
        panic!("FERRITE_REQUIRE_GPU=1 but {why}");
    }
    println!("SKIPPED: {why}");
    false
}

fn two_gpus() -> bool {
    let n = ferrite_hal_cuda::CudaDriver
        .enumerate(&DriverOptions::default())
        .map(|d| d.len())
        .unwrap_or(0);
    if n < 2 {
        return skip(&format!("2 GPUs needed, {n} found"));
    }
    if let Err(e) = ferrite_hal_cuda::nccl::nccl() {
        return skip(&e.to_string());
    }
    true
}

fn module(name: &str) -> Vec<u8> {
    let path = match std::env::var("FERRITE_MULTI_GPU_DIR") {
        Ok(dir) => PathBuf::from(dir).join(format!("{name}.cuda.vmfb")),
        Err(_) => {
            let src = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
                .join(format!("../../tests/collectives/{name}.mlir"));
            let out = ferrite_testkit::target_tmpdir!("ferrite-multi-gpu")
                .join(format!("{name}.cuda.vmfb"));
            ferrite_testkit::compile_file(
                &src,
                &out,
                &["--iree-hal-target-device=cuda", "--iree-cuda-target=sm_80"],
            )
        }
    };
    std::fs::read(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

mod two_ranks_case;
use two_ranks_case::{f32_in, f32_out};

#[test]
fn two_gpus_in_one_process_run_every_collective() {
    if !two_gpus() {
        return;
    }
    let module = module("two_ranks");
    let instance = Instance::new();
    let out = spmd::run(2, |rank| {
        let mut s = rank.session(&instance, &[&format!("cuda://{}", rank.rank())])?;
        s.load_bytes(module.clone())?;
        two_ranks_case::run(&mut s, rank.rank())
    })
    .unwrap();
    for (r, res) in out.iter().enumerate() {
        two_ranks_case::check(res, r, &format!("rank {r}"));
    }
    println!("two_ranks on 2 GPUs (one process): all_reduce, all_gather, reduce_scatter, all_to_all, collective_permute, compute_around match");
}

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
fn a_tensor_parallel_matmul_on_two_gpus_matches_one_gpu() {
    if !two_gpus() {
        return;
    }
    let module = module("tp_matmul");
    let instance = Instance::new();
    let (m, k, n) = (16usize, 64usize, 24usize);
    let a = matrix(m, k, 1);
    let b = matrix(k, n, 2);
    let mut single = Session::new(&instance, "cuda://0").unwrap();
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
    drop(single);
    let shard = k / 2;
    let out = spmd::run(2, |rank| {
        let r = rank.rank() as usize;
        // Rank r: columns r*shard.. of A, rows r*shard.. of B.
        let a_r: Vec<f32> = (0..m)
            .flat_map(|i| a[i * k + r * shard..i * k + (r + 1) * shard].to_vec())
            .collect();
        let b_r = b[r * shard * n..(r + 1) * shard * n].to_vec();
        let mut s = rank.session(&instance, &[&format!("cuda://{r}")])?;
        s.load_bytes(module.clone())?;
        let c = s.call(
            "tp_matmul_2",
            &[
                f32_in(&[m as u64, shard as u64], &a_r),
                f32_in(&[shard as u64, n as u64], &b_r),
            ],
        )?;
        Ok(f32_out(&c[0]))
    })
    .unwrap();
    let mut max_err = 0f32;
    for (r, c) in out.iter().enumerate() {
        assert_eq!(c, &out[0], "ranks agree bit for bit (rank {r})");
        for (i, (x, y)) in c.iter().zip(&want).enumerate() {
            max_err = max_err.max((x - y).abs());
            assert!(
                (x - y).abs() <= 1e-4 * y.abs().max(1.0),
                "rank {r} element {i}: {x} vs {y}"
            );
        }
    }
    println!("tp_matmul 16x64x24 split over 2 GPUs vs 1 GPU: max abs error {max_err:e}");
}

/// The child side of `two_processes_all_reduce`: runs only when that test
/// starts it (with `FERRITE_CHILD_MODULE` and the launcher variables set).
#[test]
#[ignore = "started by two_processes_all_reduce as a child process"]
fn child_rank() {
    let path = std::env::var("FERRITE_CHILD_MODULE").expect("FERRITE_CHILD_MODULE");
    let provider = ferrite::rendezvous::from_env()
        .unwrap()
        .expect("launcher variables are set");
    let (r, _) = provider.default_rank_and_count().unwrap();
    let instance = Instance::new();
    let mut s =
        Session::with_channel_provider(&instance, &[&format!("cuda://{r}")], provider).unwrap();
    s.load_file(&path).unwrap();
    let rf = r as f32;
    let sum = s
        .call(
            "all_reduce_sum",
            &[f32_in(&[4], &[1. + rf, 2., 3., 4. * rf])],
        )
        .unwrap();
    let g = s
        .call(
            "all_gather_dim1",
            &[f32_in(&[2, 2], &[rf, rf + 0.5, 10. + rf, 20. + rf])],
        )
        .unwrap();
    println!(
        "RESULT rank {r}: {:?} {:?}",
        f32_out(&sum[0]),
        f32_out(&g[0])
    );
}

#[test]
fn two_processes_all_reduce() {
    if !two_gpus() {
        return;
    }
    let dir = ferrite_testkit::target_tmpdir!("ferrite-multi-gpu");
    let path = dir.join("two_ranks.child.vmfb");
    std::fs::write(&path, module("two_ranks")).unwrap();
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    // The job's secret for the TCP store, the same for both ranks.
    let token = ferrite::rendezvous::Secret::random()
        .unwrap()
        .token()
        .to_string();
    let exe = std::env::current_exe().unwrap();
    let children: Vec<_> = (0..2)
        .map(|r| {
            std::process::Command::new(&exe)
                .args([
                    "--exact",
                    "child_rank",
                    "--ignored",
                    "--nocapture",
                    "--test-threads=1",
                ])
                .env("RANK", r.to_string())
                .env("WORLD_SIZE", "2")
                .env("FERRITE_STORE", format!("tcp://127.0.0.1:{port}"))
                .env("FERRITE_STORE_TIMEOUT", "60")
                .env("FERRITE_STORE_TOKEN", &token)
                .env("FERRITE_CHILD_MODULE", &path)
                .stdout(std::process::Stdio::piped())
                .stderr(std::process::Stdio::piped())
                .spawn()
                .unwrap()
        })
        .collect();
    for (r, c) in children.into_iter().enumerate() {
        let out = c.wait_with_output().unwrap();
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success(),
            "rank {r} failed:\n{text}\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let want = format!(
            "RESULT rank {r}: [3.0, 4.0, 6.0, 4.0] [0.0, 0.5, 1.0, 1.5, 10.0, 20.0, 11.0, 21.0]"
        );
        assert!(text.contains(&want), "rank {r}:\n{text}");
        println!("{want}");
    }
}
