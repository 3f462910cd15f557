//! The launcher environment and both stores end to end (the refusals are in
//! `tests/store_refusals.rs`).

#[test]
fn the_process_default_defers_a_broken_environment_to_channel_use() {
    let none = |_: &str| None;
    assert!(default_from_vars(none).is_none());
    let broken = |n: &str| (n == "RANK").then(|| "1".to_string());
    let p = default_from_vars(broken).expect("a provider that reports the error");
    let e = p.default_rank_and_count().unwrap_err().to_string();
    assert!(e.contains("RANK is set but WORLD_SIZE is not"), "{e}");
    let e = p
        .exchange_default_id("k", &mut [0u8; 4])
        .unwrap_err()
        .to_string();
    assert!(e.contains("WORLD_SIZE"), "{e}");
    let single = |n: &str| match n {
        "RANK" => Some("0".to_string()),
        "WORLD_SIZE" => Some("1".to_string()),
        _ => None,
    };
    let p = default_from_vars(single).unwrap();
    assert_eq!(p.default_rank_and_count().unwrap(), (0, 1));
}

use super::*;
use crate::secret::hex;
use std::collections::HashMap;
use std::net::TcpListener;

/// A token for the tests' jobs.
const TOKEN: &str = "test-token-0123456789abcdef";

fn vars(pairs: &[(&str, &str)]) -> impl Fn(&str) -> Option<String> {
    let m: HashMap<String, String> = pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    move |k| m.get(k).cloned()
}

fn err(pairs: &[(&str, &str)]) -> String {
    match from_vars(vars(pairs)) {
        Ok(_) => panic!("{pairs:?} was accepted"),
        Err(e) => e.to_string(),
    }
}

#[test]
fn no_launcher_means_no_provider() {
    assert!(from_vars(vars(&[("FERRITE_STORE", "tcp://h:1")]))
        .unwrap()
        .is_none());
}

#[test]
fn launchers_variables_in_order() {
    let p = from_vars(vars(&[
        ("OMPI_COMM_WORLD_RANK", "1"),
        ("OMPI_COMM_WORLD_SIZE", "4"),
        ("PMI_RANK", "3"),
        ("PMI_SIZE", "8"),
        ("FERRITE_STORE", "file:/tmp/x"),
    ]))
    .unwrap()
    .unwrap();
    assert_eq!(p.default_rank_and_count().unwrap(), (1, 4));
    let p = from_vars(vars(&[("PMI_RANK", "0"), ("PMI_SIZE", "1")]))
        .unwrap()
        .unwrap();
    assert_eq!(p.default_rank_and_count().unwrap(), (0, 1));
    // A group of one exchanges nothing: the id stays rank 0's.
    let mut id = [7u8; 4];
    p.exchange_default_id("k", &mut id).unwrap();
    assert_eq!(id, [7; 4]);
}

#[test]
fn bad_values_are_refused_with_their_names() {
    let e = err(&[("RANK", "0")]);
    assert!(e.contains("RANK is set but WORLD_SIZE is not"), "{e}");
    let e = err(&[("RANK", "x"), ("WORLD_SIZE", "2")]);
    assert!(e.contains("RANK='x'"), "{e}");
    let e = err(&[("RANK", "2"), ("WORLD_SIZE", "2")]);
    assert!(e.contains("outside the group"), "{e}");
    let e = err(&[("RANK", "0"), ("WORLD_SIZE", "0")]);
    assert!(e.contains("WORLD_SIZE=0"), "{e}");
    let e = err(&[("RANK", "1"), ("WORLD_SIZE", "2")]);
    assert!(e.contains("needs FERRITE_STORE"), "{e}");
    let base = [("RANK", "1"), ("WORLD_SIZE", "2")];
    for bad in [
        "tcp://host",
        "tcp://:80",
        "tcp://h:0",
        "tcp://h:99999",
        "udp://h:1",
        "file:",
        "h:1",
    ] {
        let mut v = base.to_vec();
        v.push(("FERRITE_STORE", bad));
        let e = err(&v);
        assert!(e.contains(&format!("FERRITE_STORE='{bad}'")), "{e}");
    }
    let mut v = base.to_vec();
    v.push(("FERRITE_STORE", "file:/tmp/x"));
    v.push(("FERRITE_STORE_TIMEOUT", "-3"));
    assert!(err(&v).contains("FERRITE_STORE_TIMEOUT='-3'"));
}

/// Runs `ranks` providers made from `store` on threads, each exchanging
/// `keys` identifiers; returns what every rank received.
fn exchange_all(store: &str, ranks: u32, keys: u32, timeout: &str) -> Vec<Result<Vec<Vec<u8>>>> {
    let handles: Vec<_> = (0..ranks)
        .map(|r| {
            let store = store.to_string();
            let timeout = timeout.to_string();
            std::thread::spawn(move || -> Result<Vec<Vec<u8>>> {
                let p = from_vars(vars(&[
                    ("RANK", &r.to_string()),
                    ("WORLD_SIZE", &ranks.to_string()),
                    ("FERRITE_STORE", &store),
                    ("FERRITE_STORE_TIMEOUT", &timeout),
                    ("FERRITE_STORE_TOKEN", TOKEN),
                ]))?
                .unwrap();
                (0..keys)
                    .map(|k| {
                        let mut id = if r == 0 {
                            vec![k as u8 + 1; 128]
                        } else {
                            vec![0; 128]
                        };
                        p.exchange_default_id(&format!("nccl/{k}"), &mut id)?;
                        Ok(id)
                    })
                    .collect()
            })
        })
        .collect();
    handles.into_iter().map(|h| h.join().unwrap()).collect()
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

#[test]
fn tcp_store_hands_rank_zeros_ids_to_every_rank() {
    let store = format!("tcp://127.0.0.1:{}", free_port());
    for (r, got) in exchange_all(&store, 3, 3, "30").into_iter().enumerate() {
        let got = got.unwrap_or_else(|e| panic!("rank {r}: {e}"));
        for (k, id) in got.iter().enumerate() {
            assert_eq!(id, &vec![k as u8 + 1; 128], "rank {r} key {k}");
        }
    }
}

#[test]
fn file_store_hands_rank_zeros_ids_to_every_rank() {
    let dir = std::env::temp_dir().join(format!(
        "ferrite-store-{}-{}",
        std::process::id(),
        free_port()
    ));
    let store = format!("file:{}", dir.display());
    for (r, got) in exchange_all(&store, 2, 2, "30").into_iter().enumerate() {
        let got = got.unwrap_or_else(|e| panic!("rank {r}: {e}"));
        assert_eq!(got, vec![vec![1; 128], vec![2; 128]]);
    }
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn a_missing_rank_is_a_deadline_naming_it() {
    // Rank 0 alone: it publishes and waits for rank 1, which never comes.
    let store = format!("tcp://127.0.0.1:{}", free_port());
    let p = from_vars(vars(&[
        ("RANK", "0"),
        ("WORLD_SIZE", "2"),
        ("FERRITE_STORE", &store),
        ("FERRITE_STORE_TIMEOUT", "0.3"),
        ("FERRITE_STORE_TOKEN", TOKEN),
    ]))
    .unwrap()
    .unwrap();
    let e = p
        .exchange_default_id("nccl/0", &mut [1; 8])
        .unwrap_err()
        .to_string();
    assert!(e.contains("ranks [1] did not fetch"), "{e}");
    // Rank 1 alone: nobody listens.
    let store = format!("tcp://127.0.0.1:{}", free_port());
    let p = from_vars(vars(&[
        ("RANK", "1"),
        ("WORLD_SIZE", "2"),
        ("FERRITE_STORE", &store),
        ("FERRITE_STORE_TIMEOUT", "0.3"),
        ("FERRITE_STORE_TOKEN", TOKEN),
    ]))
    .unwrap()
    .unwrap();
    let e = p
        .exchange_default_id("nccl/0", &mut [0; 8])
        .unwrap_err()
        .to_string();
    assert!(e.contains("did not answer in time"), "{e}");
    // The file store likewise.
    let dir = std::env::temp_dir().join(format!("ferrite-store-missing-{}", std::process::id()));
    let p = from_vars(vars(&[
        ("RANK", "1"),
        ("WORLD_SIZE", "2"),
        ("FERRITE_STORE", &format!("file:{}", dir.display())),
        ("FERRITE_STORE_TIMEOUT", "0.2"),
    ]))
    .unwrap()
    .unwrap();
    let e = p
        .exchange_default_id("nccl/0", &mut [0; 8])
        .unwrap_err()
        .to_string();
    assert!(e.contains("did not appear in time"), "{e}");
}

/// The child side of `two_processes_exchange`: one rank in a process of
/// its own, with the launcher variables the parent set.
#[test]
#[ignore = "started by two_processes_exchange as a child process"]
fn child_exchange() {
    let p = from_env().unwrap().expect("launcher variables are set");
    let (rank, _) = p.default_rank_and_count().unwrap();
    for k in 0..2u8 {
        let mut id = if rank == 0 {
            vec![0xa0 + k; 128]
        } else {
            vec![0; 128]
        };
        p.exchange_default_id(&format!("nccl/{k}"), &mut id)
            .unwrap();
        println!("ID rank {rank} key {k}: {}", hex(&id[..4]));
    }
}

#[test]
fn two_processes_exchange() {
    let exe = std::env::current_exe().unwrap();
    let dir = std::env::temp_dir().join(format!("ferrite-store-procs-{}", std::process::id()));
    for store in [
        format!("tcp://127.0.0.1:{}", free_port()),
        format!("file:{}", dir.display()),
    ] {
        let children: Vec<_> = (0..2)
            .map(|r| {
                std::process::Command::new(&exe)
                    .args(["--exact", "tests::child_exchange", "--ignored"])
                    .args(["--nocapture", "--test-threads=1"])
                    .env("RANK", r.to_string())
                    .env("WORLD_SIZE", "2")
                    .env("FERRITE_STORE", &store)
                    .env("FERRITE_STORE_TOKEN", TOKEN)
                    .env("FERRITE_STORE_TIMEOUT", "30")
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
                "{store} rank {r}: {text}{}",
                String::from_utf8_lossy(&out.stderr)
            );
            for (k, id) in [(0, "a0a0a0a0"), (1, "a1a1a1a1")] {
                let want = format!("ID rank {r} key {k}: {id}");
                assert!(text.contains(&want), "{store} rank {r}: {text}");
            }
        }
    }
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn a_tcp_store_needs_a_token_and_a_file_store_does_not() {
    let base = [
        ("RANK", "1"),
        ("WORLD_SIZE", "2"),
        ("FERRITE_STORE", "tcp://127.0.0.1:1"),
    ];
    let e = err(&base);
    assert!(e.contains("needs FERRITE_STORE_TOKEN"), "{e}");
    assert!(e.contains("secrets.token_hex"), "{e}");
    let mut v = base.to_vec();
    v.push(("FERRITE_STORE_TOKEN", "too-short"));
    let e = err(&v);
    assert!(e.contains("at least 16"), "{e}");
    assert!(!e.contains("too-short"), "the token is never printed: {e}");
    // A group of one exchanges nothing and needs no secret.
    let one = [
        ("RANK", "0"),
        ("WORLD_SIZE", "1"),
        ("FERRITE_STORE", "tcp://127.0.0.1:1"),
    ];
    assert!(from_vars(vars(&one)).unwrap().is_some());
    let file = [
        ("RANK", "1"),
        ("WORLD_SIZE", "2"),
        ("FERRITE_STORE", "file:/tmp/x"),
    ];
    assert!(from_vars(vars(&file)).unwrap().is_some());
}
