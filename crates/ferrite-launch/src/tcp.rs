//! The TCP store: rank 0 listens for one exchange at a time and the other
//! ranks fetch its identifier, each side proving to the other that it
//! holds the job's [`Secret`].
//!
//! # Protocol (text lines, one exchange per connection)
//!
//! ```text
//! server: FERRITE-STORE/1 <server nonce, 32 hex>
//! client: HELLO <rank> <size> <key> <client nonce, 32 hex> <tag("hello")>
//! server: ID <identifier, hex> <tag("id", identifier)>
//!       | LATER <tag("later")>              (another key is being served)
//!       | REFUSED <tag("refused", reason)> <reason>
//! client: OK <tag("ok")>                    (after checking the server's tag)
//! ```
//!
//! Each tag is HMAC-SHA256 under the secret of the label, both nonces, the
//! rank, the size, the key and the extra field, so a tag answers only the
//! connection it was made for. A client whose `HELLO` does not verify is
//! closed without a byte more: it learns the greeting's nonce and nothing
//! else. A server that cannot tag the identifier is refused by the client,
//! so a process that bound the port first cannot hand out an identifier of
//! its own. The identifier itself travels unencrypted (as NCCL's own
//! bootstrap traffic does): the store authenticates, it does not hide.
//!
//! # Limits
//!
//! Rank 0 listens only while it publishes one key and closes the listener
//! and every connection once ranks `1..size` all confirmed it (or at the
//! deadline). Lines are at most [`MAX_LINE`] bytes; a connection must send
//! its `HELLO` within [`HANDSHAKE_TIMEOUT`]; at most [`connection_limit`]
//! connections ([`MAX_CONNECTIONS`], or twice the group's size when that
//! is more) are open at once (a new one past that closes the oldest
//! connection that has not authenticated), each on a thread of its own
//! that ends with it.

use crate::secret::{hex, nonce, unhex, Secret, TOKEN_VARIABLE};
use ferrite_base::{bail, status, Result, Status};
use std::collections::BTreeSet;
use std::io::{ErrorKind, Read, Write};
use std::net::{TcpListener, TcpStream, ToSocketAddrs};
use std::sync::{Condvar, Mutex};
use std::time::{Duration, Instant};

/// The longest line either side reads (an identifier of [`MAX_ID_BYTES`]
/// in hex and its tag fit).
pub const MAX_LINE: usize = 2 * MAX_ID_BYTES + 256;
/// The largest identifier the store carries (NCCL's is 128 bytes).
pub const MAX_ID_BYTES: usize = 4096;
/// The longest key (keys are the driver's, e.g. `nccl/0`).
pub const MAX_KEY_BYTES: usize = 256;
/// How long a connection may take to send its `HELLO`, and later its `OK`.
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(5);
/// The most connections rank 0 keeps open at once for a group of up to 32
/// ranks; larger groups get twice their size (see [`connection_limit`]).
pub const MAX_CONNECTIONS: usize = 64;

/// The most connections rank 0 keeps open at once for a group of `size`.
pub fn connection_limit(size: u32) -> usize {
    MAX_CONNECTIONS.max(2 * size as usize)
}

const GREETING: &str = "FERRITE-STORE/1";

/// Checks a key: 1 to [`MAX_KEY_BYTES`] printable ASCII characters, no
/// spaces.
pub fn check_key(key: &str) -> Result<()> {
    if key.is_empty() || key.len() > MAX_KEY_BYTES || !key.bytes().all(|b| b.is_ascii_graphic()) {
        bail!(
            InvalidArgument,
            "store key '{}' must be 1 to {MAX_KEY_BYTES} printable ASCII characters without spaces",
            key.escape_default()
        );
    }
    Ok(())
}

/// What both sides tag: the connection's nonces and the claim.
struct Transcript<'a> {
    server_nonce: [u8; 16],
    client_nonce: [u8; 16],
    rank: String,
    size: String,
    key: &'a str,
}

impl<'a> Transcript<'a> {
    fn new(
        server_nonce: [u8; 16],
        client_nonce: [u8; 16],
        rank: u32,
        size: u32,
        key: &'a str,
    ) -> Self {
        Transcript {
            server_nonce,
            client_nonce,
            rank: rank.to_string(),
            size: size.to_string(),
            key,
        }
    }

    fn tag(&self, secret: &Secret, label: &str, extra: &[u8]) -> String {
        hex(&secret.tag(&self.parts(label, extra)))
    }

    fn verify(&self, secret: &Secret, label: &str, extra: &[u8], tag: &str) -> bool {
        match unhex(tag) {
            Some(t) => secret.verify(&self.parts(label, extra), &t),
            None => false,
        }
    }

    fn parts<'s>(&'s self, label: &'s str, extra: &'s [u8]) -> [&'s [u8]; 8] {
        [
            b"ferrite-store/1",
            label.as_bytes(),
            &self.server_nonce,
            &self.client_nonce,
            self.rank.as_bytes(),
            self.size.as_bytes(),
            self.key.as_bytes(),
            extra,
        ]
    }
}

/// Reads lines of at most `max` bytes from a stream, each before a
/// deadline; what arrived past a line waits for the next one.
struct LineReader {
    buf: Vec<u8>,
    max: usize,
}

/// Why no line came.
#[derive(Debug)]
enum LineError {
    /// The peer closed the connection.
    Closed,
    /// The deadline passed.
    Timeout,
    /// A line longer than the limit.
    TooLong,
    /// Not UTF-8.
    Malformed,
    /// Another I/O error.
    Io(std::io::Error),
}

impl std::fmt::Display for LineError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            LineError::Closed => write!(f, "connection closed"),
            LineError::Timeout => write!(f, "timed out"),
            LineError::TooLong => write!(f, "line too long"),
            LineError::Malformed => write!(f, "not text"),
            LineError::Io(e) => write!(f, "{e}"),
        }
    }
}

impl LineReader {
    fn new(max: usize) -> Self {
        LineReader {
            buf: Vec::new(),
            max,
        }
    }

    fn read_line(
        &mut self,
        stream: &mut TcpStream,
        deadline: Instant,
    ) -> std::result::Result<String, LineError> {
        loop {
            if let Some(end) = self.buf.iter().position(|&b| b == b'\n') {
                if end > self.max {
                    return Err(LineError::TooLong);
                }
                let line: Vec<u8> = self.buf.drain(..=end).collect();
                return String::from_utf8(line[..end].to_vec())
                    .map(|s| s.trim_end_matches('\r').to_string())
                    .map_err(|_| LineError::Malformed);
            }
            if self.buf.len() > self.max {
                return Err(LineError::TooLong);
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(LineError::Timeout);
            }
            stream.set_read_timeout(Some(left)).map_err(LineError::Io)?;
            let mut chunk = [0u8; 1024];
            // Never more than one byte past the limit is kept.
            let room = (self.max + 1 - self.buf.len()).min(chunk.len());
            match stream.read(&mut chunk[..room]) {
                Ok(0) => return Err(LineError::Closed),
                Ok(n) => self.buf.extend_from_slice(&chunk[..n]),
                Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {
                    return Err(LineError::Timeout)
                }
                Err(e) if e.kind() == ErrorKind::Interrupted => {}
                Err(e) => return Err(LineError::Io(e)),
            }
        }
    }
}

/// Writes one line before `deadline`.
fn write_line(stream: &mut TcpStream, line: &str, deadline: Instant) -> std::io::Result<()> {
    let left = deadline.saturating_duration_since(Instant::now());
    if left.is_zero() {
        return Err(ErrorKind::TimedOut.into());
    }
    stream.set_write_timeout(Some(left))?;
    let mut bytes = Vec::with_capacity(line.len() + 1);
    bytes.extend_from_slice(line.as_bytes());
    bytes.push(b'\n');
    stream.write_all(&bytes)?;
    stream.flush()
}

/// Rank 0's side of one exchange while it runs.
struct Server<'a> {
    secret: &'a Secret,
    key: &'a str,
    id: &'a [u8],
    size: u32,
    state: Mutex<ServerState>,
    changed: Condvar,
}

#[derive(Default)]
struct ServerState {
    /// Ranks being answered or done: a second claim of one is refused.
    claimed: BTreeSet<u32>,
    /// Ranks that confirmed the identifier.
    confirmed: BTreeSet<u32>,
    /// Open connections, oldest first.
    connections: Vec<Connection>,
    next_serial: u64,
    /// Connections refused or dropped (tests and diagnostics).
    refused: u64,
}

struct Connection {
    serial: u64,
    /// A handle to shut the connection down from the accepting thread.
    stream: TcpStream,
    authenticated: bool,
}

/// Counts of one exchange on rank 0 (tests and diagnostics).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct PublishReport {
    /// Connections accepted.
    pub accepted: u64,
    /// Connections closed without an identifier: unauthenticated,
    /// malformed, too slow, over the limit, or refused claims.
    pub refused: u64,
    /// The most connections open at once.
    pub peak_connections: usize,
}

/// Rank 0: listens on `addr` until ranks `1..size` all confirmed `id`
/// under `key` (or `deadline`), then closes the listener and every
/// connection.
pub fn publish(
    addr: &str,
    secret: &Secret,
    key: &str,
    id: &[u8],
    size: u32,
    deadline: Instant,
) -> Result<PublishReport> {
    let listener = TcpListener::bind(addr).map_err(|e| {
        status!(
            Unavailable,
            "rank 0 cannot listen on {addr} ({e}); the host must be one of rank 0's addresses and the port free (not torchrun's MASTER_PORT)"
        )
    })?;
    publish_on(listener, secret, key, id, size, deadline)
}

/// [`publish`] on a listener already bound.
pub fn publish_on(
    listener: TcpListener,
    secret: &Secret,
    key: &str,
    id: &[u8],
    size: u32,
    deadline: Instant,
) -> Result<PublishReport> {
    check_key(key)?;
    if id.len() > MAX_ID_BYTES {
        bail!(
            InvalidArgument,
            "identifier of {} bytes, the store carries at most {MAX_ID_BYTES}",
            id.len()
        );
    }
    if size < 2 {
        return Ok(PublishReport::default());
    }
    listener
        .set_nonblocking(true)
        .map_err(|e| status!(Unavailable, "listening: {e}"))?;
    let server = Server {
        secret,
        key,
        id,
        size,
        state: Mutex::new(ServerState::default()),
        changed: Condvar::new(),
    };
    let mut report = PublishReport::default();
    let result = std::thread::scope(|scope| {
        let result = loop {
            {
                let st = server.lock();
                if st.confirmed.len() as u32 >= size - 1 {
                    break Ok(());
                }
                if Instant::now() >= deadline {
                    let missing: Vec<u32> =
                        (1..size).filter(|r| !st.confirmed.contains(r)).collect();
                    break Err(status!(
                        DeadlineExceeded,
                        "ranks {missing:?} did not fetch the identifier in time"
                    ));
                }
            }
            match listener.accept() {
                Ok((stream, _)) => {
                    report.accepted += 1;
                    if let Some((serial, conn)) = server.admit(stream) {
                        let peak = server.lock().connections.len();
                        report.peak_connections = report.peak_connections.max(peak);
                        let s = &server;
                        let spawned = std::thread::Builder::new()
                            .name("ferrite-store-conn".into())
                            .stack_size(128 << 10)
                            .spawn_scoped(scope, move || s.serve(serial, conn));
                        if spawned.is_err() {
                            server.forget(serial, false);
                        }
                    }
                }
                Err(e) if e.kind() == ErrorKind::WouldBlock => {
                    let st = server.lock();
                    let _ = server
                        .changed
                        .wait_timeout(st, Duration::from_millis(5))
                        .unwrap_or_else(|p| p.into_inner());
                }
                // Out of descriptors and the like: let connections end.
                Err(_) => std::thread::sleep(Duration::from_millis(5)),
            }
        };
        drop(listener);
        for c in &server.lock().connections {
            let _ = c.stream.shutdown(std::net::Shutdown::Both);
        }
        result
    });
    report.refused = server.lock().refused;
    result.map(|()| report)
}

impl Server<'_> {
    fn lock(&self) -> std::sync::MutexGuard<'_, ServerState> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Registers a new connection, closing the oldest unauthenticated one
    /// when the limit is reached; `None` when it cannot be served.
    fn admit(&self, stream: TcpStream) -> Option<(u64, TcpStream)> {
        let mut st = self.lock();
        if st.connections.len() >= connection_limit(self.size) {
            match st.connections.iter().position(|c| !c.authenticated) {
                Some(i) => {
                    let old = st.connections.remove(i);
                    let _ = old.stream.shutdown(std::net::Shutdown::Both);
                }
                None => {
                    st.refused += 1;
                    return None;
                }
            }
        }
        if stream.set_nonblocking(false).is_err() {
            st.refused += 1;
            return None;
        }
        let handle = stream.try_clone().ok()?;
        let serial = st.next_serial;
        st.next_serial += 1;
        st.connections.push(Connection {
            serial,
            stream: handle,
            authenticated: false,
        });
        Some((serial, stream))
    }

    /// Drops a connection from the table (its thread is ending).
    fn forget(&self, serial: u64, confirmed: bool) {
        let mut st = self.lock();
        st.connections.retain(|c| c.serial != serial);
        if !confirmed {
            st.refused += 1;
        }
        self.changed.notify_all();
    }

    /// One connection, start to end.
    fn serve(&self, serial: u64, mut conn: TcpStream) {
        let confirmed = self.exchange(serial, &mut conn).unwrap_or(false);
        let _ = conn.shutdown(std::net::Shutdown::Both);
        self.forget(serial, confirmed);
    }

    /// The protocol; `Some(true)` once the peer confirmed the identifier,
    /// `None` or `Some(false)` when it was closed without.
    fn exchange(&self, serial: u64, conn: &mut TcpStream) -> Option<bool> {
        let hello_deadline = Instant::now() + HANDSHAKE_TIMEOUT;
        let server_nonce = nonce::<16>().ok()?;
        write_line(
            conn,
            &format!("{GREETING} {}", hex(&server_nonce)),
            hello_deadline,
        )
        .ok()?;
        let mut lines = LineReader::new(MAX_LINE);
        let hello = lines.read_line(conn, hello_deadline).ok()?;
        let mut f = hello.split(' ');
        let (Some("HELLO"), Some(rank), Some(size), Some(key), Some(client_nonce), Some(tag), None) = (
            f.next(),
            f.next(),
            f.next(),
            f.next(),
            f.next(),
            f.next(),
            f.next(),
        ) else {
            return None;
        };
        let rank: u32 = rank.parse().ok()?;
        let size: u32 = size.parse().ok()?;
        let client_nonce: [u8; 16] = unhex(client_nonce)?.try_into().ok()?;
        let t = Transcript::new(server_nonce, client_nonce, rank, size, key);
        if !t.verify(self.secret, "hello", b"", tag) {
            // A stranger: not a byte more.
            return None;
        }
        {
            let mut st = self.lock();
            if let Some(c) = st.connections.iter_mut().find(|c| c.serial == serial) {
                c.authenticated = true;
            }
        }
        let answer_deadline = Instant::now() + HANDSHAKE_TIMEOUT;
        let refuse = |conn: &mut TcpStream, reason: String| {
            let tag = t.tag(self.secret, "refused", reason.as_bytes());
            let _ = write_line(conn, &format!("REFUSED {tag} {reason}"), answer_deadline);
            Some(false)
        };
        if key != self.key {
            let tag = t.tag(self.secret, "later", b"");
            let _ = write_line(conn, &format!("LATER {tag}"), answer_deadline);
            return Some(false);
        }
        if size != self.size {
            return refuse(
                conn,
                format!("rank 0's group has {} ranks, not {size}", self.size),
            );
        }
        if rank == 0 || rank >= self.size {
            return refuse(
                conn,
                format!("rank {rank} is not one of 1..{} that fetch", self.size),
            );
        }
        if !self.lock().claimed.insert(rank) {
            return refuse(
                conn,
                format!("rank {rank} already fetched '{key}' or is fetching it"),
            );
        }
        let id_hex = hex(self.id);
        let tag = t.tag(self.secret, "id", self.id);
        let confirmed = write_line(conn, &format!("ID {id_hex} {tag}"), answer_deadline).is_ok()
            && match lines.read_line(conn, answer_deadline) {
                Ok(ok) => ok
                    .strip_prefix("OK ")
                    .is_some_and(|tag| t.verify(self.secret, "ok", b"", tag)),
                Err(_) => false,
            };
        let mut st = self.lock();
        if confirmed {
            st.confirmed.insert(rank);
        } else {
            // Not confirmed: the rank may try again.
            st.claimed.remove(&rank);
        }
        self.changed.notify_all();
        Some(confirmed)
    }
}

/// Why one attempt to fetch failed.
enum Attempt {
    /// Worth trying again (rank 0 not listening yet, serving another key,
    /// the connection dropped).
    Retry(String),
    /// Not worth trying again: the server is not who it should be, or it
    /// refused this rank.
    Fatal(Status),
}

/// A non-zero rank: connects to rank 0 at `addr` (retrying while it is not
/// listening or serves another key), proves it holds `secret`, checks that
/// the server does too, and reads `key`'s identifier into `id`.
pub fn fetch(
    addr: &str,
    secret: &Secret,
    key: &str,
    rank: u32,
    size: u32,
    id: &mut [u8],
    deadline: Instant,
) -> Result<()> {
    check_key(key)?;
    let mut last_error = String::from("no attempt");
    let mut pause = Duration::from_millis(10);
    loop {
        if Instant::now() >= deadline {
            bail!(
                DeadlineExceeded,
                "rank 0's store at {addr} did not answer in time (last: {last_error})"
            );
        }
        match try_fetch(addr, secret, key, rank, size, deadline) {
            Ok(bytes) => {
                if bytes.len() != id.len() {
                    bail!(
                        InvalidArgument,
                        "rank 0's identifier has {} bytes, this rank expected {}",
                        bytes.len(),
                        id.len()
                    );
                }
                id.copy_from_slice(&bytes);
                return Ok(());
            }
            Err(Attempt::Retry(why)) => last_error = why,
            Err(Attempt::Fatal(e)) => return Err(e),
        }
        std::thread::sleep(pause.min(deadline.saturating_duration_since(Instant::now())));
        pause = (pause * 2).min(Duration::from_millis(200));
    }
}

fn try_fetch(
    addr: &str,
    secret: &Secret,
    key: &str,
    rank: u32,
    size: u32,
    deadline: Instant,
) -> std::result::Result<Vec<u8>, Attempt> {
    let retry = |what: &str, e: &dyn std::fmt::Display| Attempt::Retry(format!("{what}: {e}"));
    let target = addr
        .to_socket_addrs()
        .map_err(|e| retry(&format!("resolving {addr}"), &e))?
        .next()
        .ok_or_else(|| Attempt::Retry(format!("{addr} resolves to no address")))?;
    let left = deadline.saturating_duration_since(Instant::now());
    if left.is_zero() {
        return Err(Attempt::Retry("deadline".into()));
    }
    let mut conn =
        TcpStream::connect_timeout(&target, left).map_err(|e| retry("connecting", &e))?;
    let step = || (Instant::now() + HANDSHAKE_TIMEOUT).min(deadline);
    let mut lines = LineReader::new(MAX_LINE);
    let greeting = lines.read_line(&mut conn, step()).map_err(|e| {
        retry(
            "reading the store's greeting (is it a Ferrite store? torchrun's MASTER_PORT is not)",
            &e,
        )
    })?;
    let impostor = |what: &str| {
        Attempt::Fatal(status!(
            Unauthenticated,
            "the store at {addr} {what}: it is not rank 0 of this job (another process may hold the port, or its {TOKEN_VARIABLE} differs)"
        ))
    };
    let server_nonce: [u8; 16] = greeting
        .strip_prefix(GREETING)
        .and_then(|n| n.strip_prefix(' '))
        .and_then(unhex)
        .and_then(|n| n.try_into().ok())
        .ok_or_else(|| {
            impostor(&format!(
                "greeted with '{}', not a Ferrite store's greeting",
                greeting
                    .chars()
                    .take(40)
                    .collect::<String>()
                    .escape_default()
            ))
        })?;
    let client_nonce = nonce::<16>().map_err(Attempt::Fatal)?;
    let t = Transcript::new(server_nonce, client_nonce, rank, size, key);
    let hello = format!(
        "HELLO {rank} {size} {key} {} {}",
        hex(&client_nonce),
        t.tag(secret, "hello", b"")
    );
    write_line(&mut conn, &hello, step()).map_err(|e| retry("sending the request", &e))?;
    let answer = lines.read_line(&mut conn, step()).map_err(|e| match e {
        LineError::Closed => Attempt::Retry(format!(
            "rank 0 closed the connection without an answer (is {TOKEN_VARIABLE} the same on every rank?)"
        )),
        e => retry("reading the answer", &e),
    })?;
    let mut f = answer.splitn(3, ' ');
    match (f.next(), f.next(), f.next()) {
        (Some("ID"), Some(id_hex), Some(tag)) => {
            let id = unhex(id_hex).ok_or_else(|| impostor("sent a malformed identifier"))?;
            if !t.verify(secret, "id", &id, tag) {
                return Err(impostor("could not prove it knows the job's secret"));
            }
            // Rank 0 counts this rank once it read the confirmation.
            write_line(
                &mut conn,
                &format!("OK {}", t.tag(secret, "ok", b"")),
                step(),
            )
            .map_err(|e| retry("confirming", &e))?;
            Ok(id)
        }
        (Some("LATER"), Some(tag), None) if t.verify(secret, "later", b"", tag) => {
            Err(Attempt::Retry(format!("rank 0 is not serving '{key}' yet")))
        }
        (Some("REFUSED"), Some(tag), Some(reason))
            if t.verify(secret, "refused", reason.as_bytes(), tag) =>
        {
            Err(Attempt::Fatal(status!(
                PermissionDenied,
                "rank 0 refused rank {rank}: {reason}"
            )))
        }
        _ => Err(impostor("could not prove it knows the job's secret")),
    }
}
