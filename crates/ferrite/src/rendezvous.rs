//! Channel defaults for one process per rank, from the environment that
//! common launchers set, and a store through which rank 0's group
//! identifier (the NCCL unique id) reaches the other ranks.
//!
//! Rank and world size are read from the first complete pair of:
//! `RANK`/`WORLD_SIZE` (torchrun), `OMPI_COMM_WORLD_RANK`/
//! `OMPI_COMM_WORLD_SIZE` (Open MPI's mpirun), `PMI_RANK`/`PMI_SIZE`
//! (MPICH, Intel MPI, Slurm's PMI).
//!
//! The store is named by `FERRITE_STORE`:
//! - `tcp://HOST:PORT`: rank 0 listens on HOST:PORT (HOST must be one of
//!   its own addresses, e.g. `$MASTER_ADDR`); the other ranks connect,
//!   retrying until the deadline while rank 0 is not up yet. Use a port of
//!   its own: torchrun's agent already listens on `MASTER_PORT` with its
//!   c10d store (whose protocol is PyTorch's), so `MASTER_PORT + 1` is a
//!   usual choice.
//! - `file:DIR`: a directory every rank sees (a shared file system); rank 0
//!   writes each identifier there, the others read it. Use a fresh
//!   directory per job: files of an earlier job would be read as this
//!   one's.
//!
//! Each exchange is also a barrier: rank 0 returns once every rank has
//! fetched the identifier, so NCCL's initialization, which waits for every
//! rank without a deadline, starts only when all are there. Waits end
//! after `FERRITE_STORE_TIMEOUT` seconds (default 300) with a
//! DEADLINE_EXCEEDED error naming the missing ranks or the unreachable
//! store.
//!
//! ```no_run
//! # fn main() -> ferrite::Result<()> {
//! let instance = ferrite::Instance::new();
//! let session = match ferrite::rendezvous::from_env()? {
//!     Some(provider) => ferrite::Session::with_channel_provider(&instance, &["cuda"], provider)?,
//!     None => ferrite::Session::new(&instance, "cuda")?,
//! };
//! # let _ = session;
//! # Ok(())
//! # }
//! ```

use ferrite_base::{bail, status, Result};
use ferrite_hal::channel::ChannelProvider;
use std::any::Any;
use std::collections::HashMap;
use std::io::{BufRead, BufReader, Write};
use std::net::{TcpListener, TcpStream, ToSocketAddrs};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Condvar, Mutex, OnceLock};
use std::time::{Duration, Instant};

/// The launcher variables read, as (rank, size) pairs in order of precedence.
pub const RANK_VARIABLES: [(&str, &str); 3] = [
    ("RANK", "WORLD_SIZE"),
    ("OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE"),
    ("PMI_RANK", "PMI_SIZE"),
];

/// The variable naming the store.
pub const STORE_VARIABLE: &str = "FERRITE_STORE";
/// The variable giving the store's deadline in seconds.
pub const TIMEOUT_VARIABLE: &str = "FERRITE_STORE_TIMEOUT";
/// The default deadline of a rendezvous.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(300);

/// The provider for this process when a launcher started it: `Ok(None)`
/// when none of the rank variables is set; an error naming the variable
/// when one is malformed, when a rank has no size (or the reverse), or when
/// the store is missing or malformed for a group of more than one rank.
pub fn from_env() -> Result<Option<Arc<dyn ChannelProvider>>> {
    from_vars(|name| std::env::var(name).ok())
}

/// The channel provider sessions and the tools use by default: [`from_env`]'s
/// provider; `None` when no launcher variables are set (channels then need
/// explicit parameters or an in-process group). Malformed variables do not
/// fail programs that create no channel: the provider returned then fails
/// each use with the error naming the variable.
pub fn process_default() -> Option<Arc<dyn ChannelProvider>> {
    default_from_vars(|name| std::env::var(name).ok())
}

/// [`process_default`] over any variable source (tests).
fn default_from_vars(get: impl Fn(&str) -> Option<String>) -> Option<Arc<dyn ChannelProvider>> {
    match from_vars(get) {
        Ok(p) => p,
        Err(e) => Some(Arc::new(BrokenEnvironment(e))),
    }
}

/// A launcher environment [`from_env`] refused, reported when a channel
/// asks for its defaults.
struct BrokenEnvironment(ferrite_base::Status);

impl ChannelProvider for BrokenEnvironment {
    fn default_rank_and_count(&self) -> Result<(u32, u32)> {
        Err(self
            .0
            .clone()
            .annotate("reading the launcher's rank variables".to_string()))
    }
    fn exchange_default_id(&self, _key: &str, _id: &mut [u8]) -> Result<()> {
        Err(self
            .0
            .clone()
            .annotate("reading the launcher's rank variables".to_string()))
    }
    fn as_any(&self) -> &dyn Any {
        self
    }
}

/// [`from_env`] over any variable source (tests).
pub fn from_vars(get: impl Fn(&str) -> Option<String>) -> Result<Option<Arc<dyn ChannelProvider>>> {
    let Some((rank, size)) = rank_and_size(&get)? else {
        return Ok(None);
    };
    let timeout = match get(TIMEOUT_VARIABLE) {
        None => DEFAULT_TIMEOUT,
        Some(v) => match v.trim().parse::<f64>() {
            Ok(s) if s > 0.0 && s.is_finite() => Duration::from_secs_f64(s),
            _ => bail!(
                InvalidArgument,
                "{TIMEOUT_VARIABLE}='{v}' is not a positive number of seconds"
            ),
        },
    };
    let store = match get(STORE_VARIABLE) {
        Some(s) => Some(Store::parse(&s)?),
        None if size == 1 => None,
        None => bail!(
            InvalidArgument,
            "rank {rank} of {size} (from the launcher's environment) needs {STORE_VARIABLE} to exchange the group identifier: tcp://HOST:PORT (rank 0 listens; not torchrun's MASTER_PORT) or file:/shared/dir"
        ),
    };
    Ok(Some(Arc::new(EnvProvider {
        rank,
        size,
        timeout,
        store,
        server: OnceLock::new(),
    })))
}

/// The first complete (rank, size) pair of [`RANK_VARIABLES`].
fn rank_and_size(get: &impl Fn(&str) -> Option<String>) -> Result<Option<(u32, u32)>> {
    for (rv, sv) in RANK_VARIABLES {
        let (r, s) = (get(rv), get(sv));
        let (r, s) = match (r, s) {
            (None, None) => continue,
            (Some(_), None) => bail!(InvalidArgument, "{rv} is set but {sv} is not"),
            (None, Some(_)) => bail!(InvalidArgument, "{sv} is set but {rv} is not"),
            (Some(r), Some(s)) => (r, s),
        };
        let parse = |name: &str, v: &str| -> Result<u32> {
            v.trim().parse::<u32>().map_err(|_| {
                status!(
                    InvalidArgument,
                    "{name}='{v}' is not a non-negative integer"
                )
            })
        };
        let (rank, size) = (parse(rv, &r)?, parse(sv, &s)?);
        if size == 0 {
            bail!(InvalidArgument, "{sv}=0: a group needs at least one rank");
        }
        if rank >= size {
            bail!(
                InvalidArgument,
                "{rv}={rank} is outside the group of {sv}={size}"
            );
        }
        return Ok(Some((rank, size)));
    }
    Ok(None)
}

/// Where identifiers are exchanged.
#[derive(Clone, Debug, PartialEq)]
pub enum Store {
    /// `tcp://HOST:PORT`.
    Tcp(String),
    /// `file:DIR`.
    File(PathBuf),
}

impl Store {
    /// Parses a `FERRITE_STORE` value.
    pub fn parse(v: &str) -> Result<Store> {
        if let Some(addr) = v.strip_prefix("tcp://") {
            let addr = addr.trim_end_matches('/');
            let port = addr.rsplit_once(':').map(|(h, p)| (h, p.parse::<u16>()));
            match port {
                Some((h, Ok(p))) if !h.is_empty() && p != 0 => Ok(Store::Tcp(addr.to_string())),
                _ => bail!(
                    InvalidArgument,
                    "{STORE_VARIABLE}='{v}': expected tcp://HOST:PORT with a port in 1..=65535"
                ),
            }
        } else if let Some(dir) = v.strip_prefix("file:") {
            let dir = dir.strip_prefix("//").unwrap_or(dir);
            if dir.is_empty() {
                bail!(
                    InvalidArgument,
                    "{STORE_VARIABLE}='{v}': expected file:/path/to/shared/dir"
                );
            }
            Ok(Store::File(PathBuf::from(dir)))
        } else {
            bail!(
                InvalidArgument,
                "{STORE_VARIABLE}='{v}': expected tcp://HOST:PORT or file:/shared/dir"
            )
        }
    }
}

/// A rank of a launcher-started group.
struct EnvProvider {
    rank: u32,
    size: u32,
    timeout: Duration,
    store: Option<Store>,
    /// Rank 0's TCP server, started on its first exchange.
    server: OnceLock<Result<Arc<Server>>>,
}

impl ChannelProvider for EnvProvider {
    fn default_rank_and_count(&self) -> Result<(u32, u32)> {
        Ok((self.rank, self.size))
    }

    fn exchange_default_id(&self, key: &str, id: &mut [u8]) -> Result<()> {
        if self.size == 1 {
            return Ok(());
        }
        let deadline = Instant::now() + self.timeout;
        match self
            .store
            .as_ref()
            .expect("a group of several ranks has a store")
        {
            Store::Tcp(addr) => {
                if self.rank == 0 {
                    let server = self
                        .server
                        .get_or_init(|| Server::start(addr))
                        .as_ref()
                        .map_err(Clone::clone)?;
                    server.publish(key, id, self.size, deadline)
                } else {
                    tcp_fetch(addr, key, self.rank, id, deadline)
                }
            }
            Store::File(dir) => {
                if self.rank == 0 {
                    file_publish(dir, key, id, self.size, deadline)
                } else {
                    file_fetch(dir, key, self.rank, id, deadline)
                }
            }
        }
        .map_err(|e| {
            e.annotate(format!(
                "rendezvous '{key}' of rank {} of {} through {STORE_VARIABLE}",
                self.rank, self.size
            ))
        })
    }

    fn as_any(&self) -> &dyn Any {
        self
    }
}

/// Rank 0's side of the TCP store: identifiers by key and the ranks that
/// fetched each.
///
/// Protocol (one request per connection, text lines): a rank sends
/// `GET <key> <rank>\n`; rank 0 answers `<hex id>\n` once it has published
/// the key.
struct Server {
    state: Mutex<HashMap<String, Published>>,
    changed: Condvar,
}

#[derive(Default)]
struct Published {
    id: Option<Vec<u8>>,
    fetched: Vec<u32>,
}

/// How long a connection may take to send its request or to wait for a
/// key: a stray client must not hold a thread forever.
const CONNECTION_TIMEOUT: Duration = Duration::from_secs(600);

impl Server {
    /// Listens on `addr` and serves requests on threads of its own for the
    /// life of the process.
    fn start(addr: &str) -> Result<Arc<Server>> {
        let listener = TcpListener::bind(addr).map_err(|e| {
            status!(
                Unavailable,
                "rank 0 cannot listen on {addr} ({e}); the host must be one of rank 0's addresses and the port free (not torchrun's MASTER_PORT)"
            )
        })?;
        let server = Arc::new(Server {
            state: Mutex::new(HashMap::new()),
            changed: Condvar::new(),
        });
        let s = server.clone();
        std::thread::Builder::new()
            .name("ferrite-store".into())
            .spawn(move || {
                for conn in listener.incoming().flatten() {
                    let s = s.clone();
                    let _ = std::thread::Builder::new()
                        .name("ferrite-store-conn".into())
                        .spawn(move || s.serve(conn));
                }
            })
            .map_err(|e| status!(ResourceExhausted, "starting the store's thread: {e}"))?;
        Ok(server)
    }

    /// Answers one `GET` once its key is published; malformed requests
    /// are dropped.
    fn serve(&self, conn: TcpStream) {
        let _ = conn.set_read_timeout(Some(CONNECTION_TIMEOUT));
        let mut line = String::new();
        let Ok(reader) = conn.try_clone() else { return };
        if BufReader::new(reader).read_line(&mut line).is_err() {
            return;
        }
        let mut parts = line.split_whitespace();
        let (Some("GET"), Some(key), Some(rank), None) =
            (parts.next(), parts.next(), parts.next(), parts.next())
        else {
            return;
        };
        let Ok(rank) = rank.parse::<u32>() else {
            return;
        };
        let deadline = Instant::now() + CONNECTION_TIMEOUT;
        let mut st = self.state.lock().unwrap_or_else(|p| p.into_inner());
        let id = loop {
            if let Some(id) = st.get(key).and_then(|p| p.id.clone()) {
                break id;
            }
            let now = Instant::now();
            if now >= deadline {
                return;
            }
            st = self
                .changed
                .wait_timeout(st, deadline - now)
                .unwrap_or_else(|p| p.into_inner())
                .0;
        };
        drop(st);
        let mut w = conn;
        if writeln!(w, "{}", hex(&id)).and_then(|_| w.flush()).is_ok() {
            let mut st = self.state.lock().unwrap_or_else(|p| p.into_inner());
            let p = st.entry(key.to_string()).or_default();
            if !p.fetched.contains(&rank) {
                p.fetched.push(rank);
            }
            self.changed.notify_all();
        }
    }

    /// Publishes `id` under `key` and waits until the other `size - 1`
    /// ranks fetched it.
    fn publish(&self, key: &str, id: &[u8], size: u32, deadline: Instant) -> Result<()> {
        let mut st = self.state.lock().unwrap_or_else(|p| p.into_inner());
        let p = st.entry(key.to_string()).or_default();
        if p.id.is_some() {
            bail!(FailedPrecondition, "key '{key}' was published twice");
        }
        p.id = Some(id.to_vec());
        self.changed.notify_all();
        loop {
            let fetched = &st[key].fetched;
            if fetched.len() as u32 >= size - 1 {
                return Ok(());
            }
            let now = Instant::now();
            if now >= deadline {
                let missing: Vec<u32> = (1..size).filter(|r| !fetched.contains(r)).collect();
                bail!(
                    DeadlineExceeded,
                    "ranks {missing:?} did not fetch the identifier in time"
                );
            }
            st = self
                .changed
                .wait_timeout(st, deadline - now)
                .unwrap_or_else(|p| p.into_inner())
                .0;
        }
    }
}

/// A non-zero rank's side: connect to rank 0 (retrying while it is not
/// listening yet), ask for `key`, read the identifier.
fn tcp_fetch(addr: &str, key: &str, rank: u32, id: &mut [u8], deadline: Instant) -> Result<()> {
    let mut last_error = String::from("no attempt");
    let mut pause = Duration::from_millis(10);
    loop {
        let now = Instant::now();
        if now >= deadline {
            bail!(
                DeadlineExceeded,
                "rank 0's store at {addr} did not answer in time (last: {last_error})"
            );
        }
        match try_fetch(addr, key, rank, deadline) {
            Ok(Some(bytes)) => {
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
            Ok(None) => last_error = "connection closed before an answer".into(),
            Err(e) => last_error = e,
        }
        std::thread::sleep(pause.min(deadline.saturating_duration_since(Instant::now())));
        pause = (pause * 2).min(Duration::from_millis(500));
    }
}

/// One attempt: `Ok(None)` when the server closed without an answer.
fn try_fetch(
    addr: &str,
    key: &str,
    rank: u32,
    deadline: Instant,
) -> std::result::Result<Option<Vec<u8>>, String> {
    let target = addr
        .to_socket_addrs()
        .map_err(|e| format!("resolving {addr}: {e}"))?
        .next()
        .ok_or_else(|| format!("{addr} resolves to no address"))?;
    let left = deadline.saturating_duration_since(Instant::now());
    if left.is_zero() {
        return Err("deadline".into());
    }
    let mut conn = TcpStream::connect_timeout(&target, left).map_err(|e| e.to_string())?;
    conn.set_read_timeout(Some(left))
        .map_err(|e| e.to_string())?;
    writeln!(conn, "GET {key} {rank}").map_err(|e| e.to_string())?;
    let mut line = String::new();
    BufReader::new(conn)
        .read_line(&mut line)
        .map_err(|e| e.to_string())?;
    if line.is_empty() {
        return Ok(None);
    }
    unhex(line.trim())
        .map(Some)
        .ok_or_else(|| format!("malformed answer '{}'", line.trim()))
}

/// A key as a file name (keys are the driver's, e.g. `nccl/0`).
fn file_name(key: &str) -> String {
    key.chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '-' || c == '.' {
                c
            } else {
                '_'
            }
        })
        .collect()
}

/// Rank 0 writes `<key>.id` (atomically: a temporary file renamed), then
/// waits for every rank's `<key>.ack.<rank>`.
fn file_publish(dir: &Path, key: &str, id: &[u8], size: u32, deadline: Instant) -> Result<()> {
    let name = file_name(key);
    std::fs::create_dir_all(dir).map_err(|e| {
        status!(
            Unavailable,
            "creating the store directory {}: {e}",
            dir.display()
        )
    })?;
    let tmp = dir.join(format!(".{name}.id.tmp"));
    let dst = dir.join(format!("{name}.id"));
    std::fs::write(&tmp, hex(id))
        .and_then(|_| std::fs::rename(&tmp, &dst))
        .map_err(|e| status!(Unavailable, "writing {}: {e}", dst.display()))?;
    loop {
        let missing: Vec<u32> = (1..size)
            .filter(|r| !dir.join(format!("{name}.ack.{r}")).exists())
            .collect();
        if missing.is_empty() {
            return Ok(());
        }
        if Instant::now() >= deadline {
            bail!(
                DeadlineExceeded,
                "ranks {missing:?} did not read {} in time",
                dst.display()
            );
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// A non-zero rank waits for `<key>.id`, reads it and acknowledges.
fn file_fetch(dir: &Path, key: &str, rank: u32, id: &mut [u8], deadline: Instant) -> Result<()> {
    let name = file_name(key);
    let src = dir.join(format!("{name}.id"));
    let text = loop {
        match std::fs::read_to_string(&src) {
            Ok(t) => break t,
            Err(_) if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(20)),
            Err(e) => bail!(
                DeadlineExceeded,
                "{} did not appear in time ({e}); is rank 0 running with the same {STORE_VARIABLE}?",
                src.display()
            ),
        }
    };
    let bytes = unhex(text.trim())
        .ok_or_else(|| status!(InvalidArgument, "{} is malformed", src.display()))?;
    if bytes.len() != id.len() {
        bail!(
            InvalidArgument,
            "{} holds {} bytes, this rank expected {}",
            src.display(),
            bytes.len(),
            id.len()
        );
    }
    id.copy_from_slice(&bytes);
    let ack = dir.join(format!("{name}.ack.{rank}"));
    std::fs::write(&ack, b"").map_err(|e| status!(Unavailable, "writing {}: {e}", ack.display()))
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

fn unhex(s: &str) -> Option<Vec<u8>> {
    if !s.len().is_multiple_of(2) || !s.is_ascii() {
        return None;
    }
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&s[i..i + 2], 16).ok())
        .collect()
}

#[cfg(test)]
mod tests {

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
    fn exchange_all(
        store: &str,
        ranks: u32,
        keys: u32,
        timeout: &str,
    ) -> Vec<Result<Vec<Vec<u8>>>> {
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
        ]))
        .unwrap()
        .unwrap();
        let e = p
            .exchange_default_id("nccl/0", &mut [0; 8])
            .unwrap_err()
            .to_string();
        assert!(e.contains("did not answer in time"), "{e}");
        // The file store likewise.
        let dir =
            std::env::temp_dir().join(format!("ferrite-store-missing-{}", std::process::id()));
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
                        .args(["--exact", "rendezvous::tests::child_exchange", "--ignored"])
                        .args(["--nocapture", "--test-threads=1"])
                        .env("RANK", r.to_string())
                        .env("WORLD_SIZE", "2")
                        .env("FERRITE_STORE", &store)
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
}
