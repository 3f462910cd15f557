//! Channel defaults for one process per rank, from the environment that
//! common launchers set, and a store through which rank 0's group
//! identifier (the NCCL unique id) reaches the other ranks. The facade
//! re-exports this crate as `ferrite::rendezvous`.
//!
//! Rank and world size are read from the first complete pair of:
//! `RANK`/`WORLD_SIZE` (torchrun), `OMPI_COMM_WORLD_RANK`/
//! `OMPI_COMM_WORLD_SIZE` (Open MPI's mpirun), `PMI_RANK`/`PMI_SIZE`
//! (MPICH, Intel MPI, Slurm's PMI).
//!
//! The store is named by `FERRITE_STORE`:
//! - `tcp://HOST:PORT`: rank 0 listens on HOST:PORT (HOST must be one of
//!   its own addresses, e.g. `$MASTER_ADDR`) while it publishes an
//!   identifier, and closes the port once every rank confirmed it; the
//!   other ranks connect, retrying until the deadline while rank 0 is not
//!   listening yet. Every rank needs the job's secret in
//!   `FERRITE_STORE_TOKEN` (at least 16 characters, e.g.
//!   `export FERRITE_STORE_TOKEN=$(python3 -c 'import secrets; print(secrets.token_hex(32))')`
//!   once before the launcher starts the ranks): each connection is an
//!   HMAC-SHA256 challenge/response both ways, so a process without the
//!   secret neither learns the identifier nor counts as a rank, and a
//!   process that took the port first cannot hand out an identifier of its
//!   own (the ranks refuse it). Use a port of its own: torchrun's agent
//!   already listens on `MASTER_PORT` with its c10d store, so
//!   `MASTER_PORT + 1` is a usual choice. See [`tcp`] for the protocol and
//!   its limits (line length, connection count, timeouts). The identifier
//!   is authenticated, not encrypted.
//! - `file:DIR`: a directory every rank sees (a shared file system); rank 0
//!   writes each identifier there (mode 0600, in a directory no one else
//!   can write), the others read it, and rank 0 removes the files once all
//!   have. Use a fresh directory per job. See [`file`](mod@file).
//!
//! Not done: torchrun's own c10d store (`MASTER_ADDR`/`MASTER_PORT`) and
//! MPI's or PMI's exchange are not used; a job under them still names a
//! `FERRITE_STORE` of its own. The c10d store's wire protocol is PyTorch's
//! internal one and has changed between releases (its query codes were
//! renumbered when a validation query was added first, and some releases
//! put a magic number before every query), so a client here would have to
//! track PyTorch's versions; that store also takes no secret, so anyone who
//! reaches `MASTER_PORT` reads and writes it. MPI's and PMI's exchanges
//! would mean loading `libmpi`/`libpmi` at run time (foreign calls) for
//! one identifier.
//!
//! Each exchange is also a barrier: rank 0 returns once every rank has
//! fetched the identifier, so NCCL's initialization, which waits for every
//! rank without a deadline, starts only when all are there. Waits end
//! after `FERRITE_STORE_TIMEOUT` seconds (default 300) with a
//! DEADLINE_EXCEEDED error naming the missing ranks or the unreachable
//! store.
//!
//! ```no_run
//! # fn main() -> ferrite_base::Result<()> {
//! match ferrite_launch::from_env()? {
//!     Some(provider) => { /* ferrite::Session::with_channel_provider(&instance, &["cuda"], provider)? */ }
//!     None => { /* not started by a launcher */ }
//! }
//! # Ok(())
//! # }
//! ```
#![deny(missing_docs)]

pub mod file;
mod secret;
pub mod tcp;

pub use secret::{Secret, MIN_TOKEN_LEN, TOKEN_VARIABLE};

use ferrite_base::{bail, status, Result};
use ferrite_hal::channel::ChannelProvider;
use std::any::Any;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
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
/// when one is malformed, when a rank has no size (or the reverse), when
/// the store is missing or malformed for a group of more than one rank, or
/// when a TCP store has no (or too short a) `FERRITE_STORE_TOKEN`.
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
pub fn default_from_vars(get: impl Fn(&str) -> Option<String>) -> Option<Arc<dyn ChannelProvider>> {
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
            "rank {rank} of {size} (from the launcher's environment) needs {STORE_VARIABLE} to exchange the group identifier: tcp://HOST:PORT (rank 0 listens; not torchrun's MASTER_PORT; with {TOKEN_VARIABLE}) or file:/shared/dir"
        ),
    };
    let secret = match (&store, get(TOKEN_VARIABLE)) {
        (Some(Store::Tcp(_)), Some(t)) if size > 1 => Some(Secret::new(&t)?),
        (Some(Store::Tcp(addr)), None) if size > 1 => bail!(
            InvalidArgument,
            "{STORE_VARIABLE}=tcp://{addr} needs {TOKEN_VARIABLE}, a secret that every rank of this job holds and nobody else does (at least {MIN_TOKEN_LEN} characters; {})",
            secret::TOKEN_HINT
        ),
        _ => None,
    };
    Ok(Some(Arc::new(EnvProvider {
        rank,
        size,
        timeout,
        store,
        secret,
        publishing: Mutex::new(()),
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
    /// The job's secret (a TCP store of several ranks).
    secret: Option<Secret>,
    /// Rank 0 publishes one key at a time (the TCP store listens on one
    /// port for one key).
    publishing: Mutex<()>,
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
        let store = self
            .store
            .as_ref()
            .expect("a group of several ranks has a store");
        let result = tcp::check_key(key).and_then(|()| match store {
            Store::Tcp(addr) => {
                let secret = self.secret.as_ref().expect("a TCP store has a secret");
                if self.rank == 0 {
                    let _one = self.publishing.lock().unwrap_or_else(|p| p.into_inner());
                    tcp::publish(addr, secret, key, id, self.size, deadline).map(|_| ())
                } else {
                    tcp::fetch(addr, secret, key, self.rank, self.size, id, deadline)
                }
            }
            Store::File(dir) => {
                if self.rank == 0 {
                    let _one = self.publishing.lock().unwrap_or_else(|p| p.into_inner());
                    file::publish(dir, key, id, self.size, deadline)
                } else {
                    file::fetch(dir, key, self.rank, id, deadline)
                }
            }
        });
        result.map_err(|e| {
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

#[cfg(test)]
mod tests;
