//! What the stores refuse (issue 26): strangers, forged ranks, an impostor
//! server, slow or endless connections, and files others could read or
//! plant. Every server listens on 127.0.0.1 only; every wait has a
//! deadline of seconds.

use ferrite_base::StatusCode;
use ferrite_launch::tcp::{self, MAX_CONNECTIONS};
use ferrite_launch::{file, Secret};
use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

const ID: [u8; 128] = [0x5a; 128];

fn secret() -> Secret {
    Secret::new("the-job-secret-0123456789").unwrap()
}

/// Rank 0 publishing `ID` under `key` on a loopback port, on a thread.
fn serve(
    key: &'static str,
    size: u32,
    within: Duration,
) -> (String, JoinHandle<ferrite_base::Result<tcp::PublishReport>>) {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    let s = secret();
    let h = std::thread::spawn(move || {
        tcp::publish_on(listener, &s, key, &ID, size, Instant::now() + within)
    });
    (addr, h)
}

/// Everything the server sends until it closes (at most 64 KiB, 3 s).
fn read_all(conn: &mut TcpStream) -> String {
    conn.set_read_timeout(Some(Duration::from_secs(3))).unwrap();
    let mut got = Vec::new();
    let mut buf = [0u8; 4096];
    while got.len() < 65536 {
        match conn.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => got.extend_from_slice(&buf[..n]),
            Err(e) => panic!("the server neither answered nor closed: {e}"),
        }
    }
    String::from_utf8_lossy(&got).into_owned()
}

fn fetch_as(
    addr: &str,
    s: &Secret,
    rank: u32,
    size: u32,
    within: Duration,
) -> ferrite_base::Result<Vec<u8>> {
    let mut id = vec![0u8; ID.len()];
    tcp::fetch(
        addr,
        s,
        "nccl/0",
        rank,
        size,
        &mut id,
        Instant::now() + within,
    )
    .map(|()| id)
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

#[test]
fn a_stranger_is_refused_and_learns_nothing() {
    let (addr, server) = serve("nccl/0", 2, Duration::from_secs(2));
    let id_hex = hex(&ID);
    // The request the old, unauthenticated store answered with the id
    // (and counted as rank 4242 towards the barrier).
    let mut c = TcpStream::connect(&addr).unwrap();
    c.write_all(b"GET nccl/0 4242\n").unwrap();
    let got = read_all(&mut c);
    println!("stranger sending 'GET nccl/0 4242' got: {got:?}");
    assert!(
        got.starts_with("FERRITE-STORE/1 ") && got.lines().count() == 1,
        "{got}"
    );
    assert!(!got.contains(&id_hex));
    // A well-formed HELLO with a made-up tag.
    let mut c = TcpStream::connect(&addr).unwrap();
    let mut greeting = [0u8; 49];
    c.read_exact(&mut greeting).unwrap();
    let hello = format!("HELLO 1 2 nccl/0 {} {}\n", "00".repeat(16), "ab".repeat(32));
    c.write_all(hello.as_bytes()).unwrap();
    let got = read_all(&mut c);
    println!("stranger sending a HELLO with a made-up tag got after the greeting: {got:?}");
    assert_eq!(got, "");
    // Ferrite's own client with another job's secret.
    let other = Secret::new("another-jobs-secret-000000").unwrap();
    let e = fetch_as(&addr, &other, 1, 2, Duration::from_millis(800)).unwrap_err();
    println!("a rank with the wrong secret: {e}");
    assert_eq!(e.code(), StatusCode::DeadlineExceeded);
    assert!(
        e.to_string().contains("FERRITE_STORE_TOKEN the same"),
        "{e}"
    );
    // None of them released rank 0's barrier.
    let e = server.join().unwrap().unwrap_err();
    println!("rank 0: {e}");
    assert!(e.to_string().contains("ranks [1] did not fetch"), "{e}");
    // And the port is closed once rank 0 is done with it.
    assert!(TcpStream::connect(&addr).is_err(), "rank 0 still listens");
}

#[test]
fn forged_ranks_are_refused() {
    let (addr, server) = serve("nccl/0", 3, Duration::from_secs(10));
    let s = secret();
    let quick = Duration::from_secs(5);
    for (rank, size, why) in [
        (0, 3, "rank 0 is not one of 1..3"),
        (3, 3, "rank 3 is not one of 1..3"),
        (4242, 3, "rank 4242 is not one of 1..3"),
        (1, 4, "rank 0's group has 3 ranks, not 4"),
    ] {
        let e = fetch_as(&addr, &s, rank, size, quick).unwrap_err();
        println!("rank {rank} of {size}: {e}");
        assert_eq!(e.code(), StatusCode::PermissionDenied, "{e}");
        assert!(e.to_string().contains(why), "{e}");
    }
    assert_eq!(fetch_as(&addr, &s, 1, 3, quick).unwrap(), ID);
    let e = fetch_as(&addr, &s, 1, 3, quick).unwrap_err();
    println!("rank 1 again: {e}");
    assert!(e.to_string().contains("rank 1 already fetched"), "{e}");
    assert_eq!(fetch_as(&addr, &s, 2, 3, quick).unwrap(), ID);
    let report = server.join().unwrap().unwrap();
    println!("rank 0: {report:?}");
    assert_eq!(report.refused, 5);
    assert!(TcpStream::connect(&addr).is_err(), "rank 0 still listens");
}

#[test]
fn a_server_without_the_secret_is_rejected() {
    // A process that bound the port first and serves an id of its own.
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    let impostor = std::thread::spawn(move || {
        let answers = [
            // Ferrite's protocol with a made-up tag.
            format!("ID {} {}\n", hex(&[0xee; 128]), "cd".repeat(32)),
            // The old protocol's answer.
            format!("{}\n", hex(&[0xee; 128])),
        ];
        for answer in answers {
            let (mut c, _) = listener.accept().unwrap();
            c.write_all(format!("FERRITE-STORE/1 {}\n", "11".repeat(16)).as_bytes())
                .unwrap();
            // The whole HELLO, then the answer, then wait for the client
            // to hang up (closing with unread bytes would reset it).
            let mut byte = [0u8; 1];
            while c.read(&mut byte).unwrap() == 1 && byte[0] != b'\n' {}
            c.write_all(answer.as_bytes()).unwrap();
            let _ = c.read(&mut byte);
        }
        // Something else altogether.
        let (mut c, _) = listener.accept().unwrap();
        c.write_all(b"HTTP/1.1 200 OK\r\n\r\n").unwrap();
        let _ = c.read(&mut [0u8; 1]);
        listener
    });
    let s = secret();
    for _ in 0..3 {
        let t = Instant::now();
        let e = fetch_as(&addr, &s, 1, 2, Duration::from_secs(10)).unwrap_err();
        println!("rank 1 against the impostor: {e}");
        assert_eq!(e.code(), StatusCode::Unauthenticated, "{e}");
        assert!(e.to_string().contains("not rank 0 of this job"), "{e}");
        assert!(
            t.elapsed() < Duration::from_secs(5),
            "refused at once, not at the deadline"
        );
    }
    let _held = impostor.join().unwrap();
    // Rank 0 cannot take the port either, and says so.
    let e = tcp::publish(
        &addr,
        &s,
        "nccl/0",
        &ID,
        2,
        Instant::now() + Duration::from_secs(1),
    )
    .unwrap_err();
    println!("rank 0 on the held port: {e}");
    assert!(e.to_string().contains("cannot listen"), "{e}");
}

fn rss_kib() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap()
}

#[test]
fn slow_and_endless_lines_do_not_block_the_job() {
    let (addr, server) = serve("nccl/0", 2, Duration::from_secs(20));
    let rss_before = rss_kib();
    // An endless request line, as fast as the server takes it (the old
    // store buffered 768 MiB of it).
    let a = addr.clone();
    let endless = std::thread::spawn(move || {
        let mut c = TcpStream::connect(&a).unwrap();
        c.set_write_timeout(Some(Duration::from_secs(10))).unwrap();
        let chunk = vec![b'x'; 1 << 20];
        let mut sent = 0usize;
        while sent < 256 << 20 {
            match c.write(&chunk) {
                Ok(n) => sent += n,
                Err(_) => break,
            }
        }
        sent
    });
    // A line dribbled a byte at a time.
    let a = addr.clone();
    let slow = std::thread::spawn(move || {
        let mut c = TcpStream::connect(&a).unwrap();
        let t = Instant::now();
        while c.write_all(b"H").is_ok() && t.elapsed() < Duration::from_secs(15) {
            std::thread::sleep(Duration::from_millis(50));
        }
        t.elapsed()
    });
    std::thread::sleep(Duration::from_millis(300));
    // The real rank 1 gets through while both are still at it.
    let t = Instant::now();
    let got = fetch_as(&addr, &secret(), 1, 2, Duration::from_secs(10)).unwrap();
    assert_eq!(got, ID);
    let report = server.join().unwrap().unwrap();
    let took = t.elapsed();
    println!("rank 1 fetched, rank 0 done {took:?} after rank 1 began: {report:?}");
    assert!(took < tcp::HANDSHAKE_TIMEOUT, "{took:?}");
    let sent = endless.join().unwrap();
    let slow_for = slow.join().unwrap();
    let grew = rss_kib().saturating_sub(rss_before);
    println!(
        "endless line: {} MiB sent before the server cut it; dribbler cut after {slow_for:?} (rank 0 closes every connection after the barrier); RSS grew {grew} KiB",
        sent >> 20
    );
    assert!(sent < 256 << 20, "the endless line was never cut");
    assert!(
        slow_for < tcp::HANDSHAKE_TIMEOUT,
        "the dribbler outlived the exchange"
    );
    assert!(grew < 32 << 10, "RSS grew {grew} KiB");
}

#[test]
fn idle_connections_past_the_limit_do_not_block_the_job() {
    let (addr, server) = serve("nccl/0", 2, Duration::from_secs(30));
    // Many more than the limit (the old store made a thread for each).
    let idle: Vec<TcpStream> = (0..300)
        .map(|_| TcpStream::connect(&addr).unwrap())
        .collect();
    std::thread::sleep(Duration::from_millis(300));
    let t = Instant::now();
    let got = fetch_as(&addr, &secret(), 1, 2, Duration::from_secs(20)).unwrap();
    assert_eq!(got, ID);
    let report = server.join().unwrap().unwrap();
    let took = t.elapsed();
    println!("rank 0 done {took:?} after rank 1 began: {report:?}");
    assert!(took < tcp::HANDSHAKE_TIMEOUT, "{took:?}");
    assert!(report.accepted >= 301, "{report:?}");
    assert!(report.peak_connections <= MAX_CONNECTIONS, "{report:?}");
    drop(idle);
}

#[test]
fn an_authenticated_exchange_closes_the_port_after_the_barrier() {
    let (addr, server) = serve("nccl/0", 2, Duration::from_secs(10));
    assert_eq!(
        fetch_as(&addr, &secret(), 1, 2, Duration::from_secs(5)).unwrap(),
        ID
    );
    let report = server.join().unwrap().unwrap();
    assert_eq!(report.refused, 0, "{report:?}");
    assert!(TcpStream::connect(&addr).is_err(), "rank 0 still listens");
    // A rank asking for a key rank 0 is not serving is told to come back
    // later (and retries until its deadline).
    let (addr, server) = serve("nccl/1", 2, Duration::from_secs(10));
    let e = fetch_as(&addr, &secret(), 1, 2, Duration::from_millis(500)).unwrap_err();
    assert!(e.to_string().contains("not serving 'nccl/0' yet"), "{e}");
    let mut id = vec![0u8; ID.len()];
    tcp::fetch(
        &addr,
        &secret(),
        "nccl/1",
        1,
        2,
        &mut id,
        Instant::now() + Duration::from_secs(5),
    )
    .unwrap();
    server.join().unwrap().unwrap();
}

#[test]
fn the_file_store_is_private_and_cleaned_up() {
    let root = std::env::temp_dir().join(format!("ferrite-launch-file-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&root);
    std::fs::create_dir(&root).unwrap();
    std::fs::set_permissions(&root, std::fs::Permissions::from_mode(0o700)).unwrap();
    let dir = root.join("job");
    let d = dir.clone();
    let rank0 = std::thread::spawn(move || {
        file::publish(
            &d,
            "nccl/0",
            &ID,
            2,
            Instant::now() + Duration::from_secs(10),
        )
    });
    let id_file = dir.join("nccl_0.id");
    let t = Instant::now();
    while !id_file.exists() {
        assert!(t.elapsed() < Duration::from_secs(5), "no id file");
        std::thread::sleep(Duration::from_millis(5));
    }
    let file_mode = std::fs::metadata(&id_file).unwrap().mode() & 0o777;
    let dir_mode = std::fs::metadata(&dir).unwrap().mode() & 0o777;
    println!("id file mode {file_mode:o}, directory mode {dir_mode:o}");
    assert_eq!(file_mode, 0o600);
    assert_eq!(dir_mode, 0o700);
    let mut id = vec![0u8; ID.len()];
    file::fetch(
        &dir,
        "nccl/0",
        1,
        &mut id,
        Instant::now() + Duration::from_secs(5),
    )
    .unwrap();
    assert_eq!(id, ID);
    rank0.join().unwrap().unwrap();
    assert!(
        !dir.exists(),
        "rank 0 removes the directory it made, and its files"
    );

    // A directory others can write into is refused (anyone could plant an id).
    let open = root.join("open");
    std::fs::create_dir(&open).unwrap();
    std::fs::set_permissions(&open, std::fs::Permissions::from_mode(0o777)).unwrap();
    let e = file::publish(
        &open,
        "nccl/0",
        &ID,
        2,
        Instant::now() + Duration::from_secs(1),
    )
    .unwrap_err();
    println!("world-writable directory: {e}");
    assert!(e.to_string().contains("writable by group or others"), "{e}");
    // An id file others could read or write is not taken.
    let lax = root.join("lax");
    std::fs::create_dir(&lax).unwrap();
    std::fs::set_permissions(&lax, std::fs::Permissions::from_mode(0o700)).unwrap();
    std::fs::write(lax.join("nccl_0.id"), hex(&ID)).unwrap();
    std::fs::set_permissions(
        lax.join("nccl_0.id"),
        std::fs::Permissions::from_mode(0o644),
    )
    .unwrap();
    let e = file::fetch(
        &lax,
        "nccl/0",
        1,
        &mut id,
        Instant::now() + Duration::from_secs(1),
    )
    .unwrap_err();
    println!("id file of mode 644: {e}");
    assert!(e.to_string().contains("0600"), "{e}");
    let _ = std::fs::remove_dir_all(&root);
}
