//! One SPMD program on several ranks in one process: each rank runs on its
//! own thread with its own devices and [`Session`], and the ranks' channels
//! (`hal.channel.create` with the default rank and count) form one
//! in-process group, so the program's collectives (all-reduce, all-gather,
//! ...) connect them. CPU devices exchange data in memory; nothing leaves
//! the process.
//!
//! ```no_run
//! use ferrite::{spmd, Instance, Tensor, Value};
//!
//! # fn main() -> ferrite::Result<()> {
//! let instance = Instance::new();
//! let module = std::fs::read("all_reduce.vmfb")?;
//! let inputs: Vec<Vec<Value>> = (0..2)
//!     .map(|r| Ok(vec![Value::from(Tensor::from_f32(&[4], &[r as f32; 4])?)]))
//!     .collect::<ferrite::Result<_>>()?;
//! let outputs = spmd::run_program(&instance, &["local-task"], &module, "main", inputs)?;
//! assert_eq!(outputs.len(), 2); // one result list per rank
//! # Ok(())
//! # }
//! ```
//!
//! [`run`] is the general form: it calls a closure on every rank with that
//! rank's [`Rank`], from which [`Rank::session`] makes a session whose
//! `hal` module answers channel defaults from the group.
//!
//! Each rank needs devices of its own: a collective waits for its peers on
//! the thread that runs it (a `local-task` worker, or the caller on
//! `local-sync`), so ranks sharing one device could wait for work queued
//! behind each other. [`Rank::session`] always makes new devices.

use std::sync::Arc;

use ferrite_base::status::ResultExt;
use ferrite_base::{Result, StatusCode};
use ferrite_hal::channel::{ChannelProvider, LocalGroup, LocalRank};
use ferrite_hal_module::HalModuleOptions;

use crate::instance::Instance;
use crate::session::Session;
use crate::value::Value;

/// One rank of an SPMD run: its index, the group size and the channel
/// provider its sessions use.
pub struct Rank {
    provider: Arc<LocalRank>,
}

impl Rank {
    /// This rank (0-based).
    pub fn rank(&self) -> u32 {
        self.provider.rank()
    }

    /// The number of ranks.
    pub fn count(&self) -> u32 {
        self.provider.group().count()
    }

    /// The provider that answers this rank's channel defaults.
    pub fn provider(&self) -> Arc<dyn ChannelProvider> {
        self.provider.clone()
    }

    /// A session on new devices named as [`Session::with_devices`] takes
    /// them, whose channels belong to this rank of the group.
    pub fn session(&self, instance: &Instance, devices: &[&str]) -> Result<Session> {
        Session::with_channel_provider(instance, devices, self.provider())
    }
}

/// Runs `body` on `ranks` threads, one per rank, and returns their results
/// in rank order. Rendezvous wait at most
/// [`ferrite_hal::channel::local_group::DEFAULT_RENDEZVOUS_TIMEOUT`] for a
/// missing rank; [`run_in_group`] takes a group with another timeout.
pub fn run<T: Send>(ranks: u32, body: impl Fn(Rank) -> Result<T> + Sync) -> Result<Vec<T>> {
    run_in_group(&LocalGroup::new(ranks)?, body)
}

/// [`run`] over an existing group (one rank per member). When a rank fails,
/// the group is poisoned so that its peers stop at their next rendezvous
/// instead of waiting for it; the error returned is the first rank's own
/// failure (not a peer's report of it), annotated with its rank.
pub fn run_in_group<T: Send>(
    group: &Arc<LocalGroup>,
    body: impl Fn(Rank) -> Result<T> + Sync,
) -> Result<Vec<T>> {
    let providers = (0..group.count())
        .map(|r| group.rank(r))
        .collect::<Result<Vec<_>>>()?;
    let body = &body;
    let results: Vec<Result<T>> = std::thread::scope(|s| {
        let handles: Vec<_> = providers
            .into_iter()
            .map(|provider| {
                let rank = provider.rank();
                let group = group.clone();
                s.spawn(move || {
                    let out = body(Rank { provider }).annotate(|| format!("rank {rank}"));
                    if let Err(e) = &out {
                        group.poison(&format!("rank {rank} failed: {}", e.message()));
                    }
                    out
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| match h.join() {
                Ok(r) => r,
                Err(_) => Err(ferrite_base::status!(Internal, "a rank's thread panicked")),
            })
            .collect()
    });
    // A peer's failure shows on the other ranks as Aborted (poisoned
    // group): report the rank that failed first.
    let first_own = results
        .iter()
        .position(|r| r.as_ref().is_err_and(|e| e.code() != StatusCode::Aborted));
    if let Some(i) = first_own.or_else(|| results.iter().position(Result::is_err)) {
        return Err(results
            .into_iter()
            .nth(i)
            .and_then(Result::err)
            .expect("position found an error"));
    }
    Ok(results.into_iter().map(|r| r.expect("no errors")).collect())
}

/// Loads `module` on every rank (each with new `devices`), calls `function`
/// with that rank's inputs (`inputs[rank]`; its length is the number of
/// ranks) and returns each rank's results.
pub fn run_program(
    instance: &Instance,
    devices: &[&str],
    module: &[u8],
    function: &str,
    inputs: Vec<Vec<Value>>,
) -> Result<Vec<Vec<Value>>> {
    let ranks = u32::try_from(inputs.len()).unwrap_or(u32::MAX);
    let inputs: Vec<std::sync::Mutex<Option<Vec<Value>>>> = inputs
        .into_iter()
        .map(|v| std::sync::Mutex::new(Some(v)))
        .collect();
    run(ranks, |rank| {
        let mut session = rank.session(instance, devices)?;
        session.load_bytes(module.to_vec())?;
        let args = inputs[rank.rank() as usize]
            .lock()
            .map_err(|_| ferrite_base::status!(Internal, "a rank's inputs were poisoned"))?
            .take()
            .unwrap_or_default();
        session.call(function, &args)
    })
}

/// The `hal` module options of a rank's sessions (its channel provider),
/// for callers that make the devices themselves
/// ([`Session::from_devices`]).
pub fn hal_options(rank: &Rank) -> HalModuleOptions {
    HalModuleOptions {
        channel_provider: Some(rank.provider()),
        ..HalModuleOptions::default()
    }
}
