//! An in-process collective group: several ranks driven by one process
//! (one thread per rank, each with its own device and context).
//!
//! [`LocalGroup::new`] makes a group of `count` ranks; [`LocalGroup::rank`]
//! hands out each rank's [`ChannelProvider`]. Identifiers are exchanged in
//! memory, and [`LocalGroup::exchange`] gives drivers a rendezvous where
//! every rank contributes a value and receives all of them in rank order:
//! CPU devices build their collectives on it; GPU drivers use the group
//! only for the identifier (their data moves through their own library).

use super::ChannelProvider;
use ferrite_base::{bail, Result};
use parking_lot::{Condvar, Mutex};
use std::any::Any;
use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// How long a rank waits for its peers at a rendezvous before failing: a
/// peer that never arrives (a program that diverged, a rank that failed
/// earlier) must not hang the others forever.
pub const DEFAULT_RENDEZVOUS_TIMEOUT: Duration = Duration::from_secs(120);

/// A group of ranks in one process.
pub struct LocalGroup {
    count: u32,
    timeout: Duration,
    state: Mutex<Rounds>,
    arrived: Condvar,
}

/// Values contributed to the rounds still in progress, by key.
#[derive(Default)]
struct Rounds {
    rounds: HashMap<String, Round>,
    /// A failure reported by a rank; every later rendezvous fails with it so
    /// that peers do not wait for a rank that is gone.
    poisoned: Option<String>,
}

struct Round {
    values: Vec<Option<Arc<dyn Any + Send + Sync>>>,
    /// How many ranks have taken the complete set (the round is removed when
    /// all have).
    taken: u32,
}

impl LocalGroup {
    /// A group of `count` ranks (at least 1).
    pub fn new(count: u32) -> Result<Arc<LocalGroup>> {
        Self::with_timeout(count, DEFAULT_RENDEZVOUS_TIMEOUT)
    }

    /// A group whose rendezvous fail after `timeout` without every rank.
    pub fn with_timeout(count: u32, timeout: Duration) -> Result<Arc<LocalGroup>> {
        if count == 0 {
            bail!(
                InvalidArgument,
                "a collective group needs at least one rank"
            );
        }
        Ok(Arc::new(LocalGroup {
            count,
            timeout,
            state: Mutex::new(Rounds::default()),
            arrived: Condvar::new(),
        }))
    }

    /// The number of ranks.
    pub fn count(&self) -> u32 {
        self.count
    }

    /// The provider rank `rank` hands to its device's `hal` module.
    pub fn rank(self: &Arc<Self>, rank: u32) -> Result<Arc<LocalRank>> {
        if rank >= self.count {
            bail!(
                OutOfRange,
                "rank {rank} is outside the group of {} ranks",
                self.count
            );
        }
        Ok(Arc::new(LocalRank {
            group: self.clone(),
            rank,
        }))
    }

    /// Fails every current and later rendezvous of the group with `why`
    /// (a rank that stops early calls it so its peers do not wait).
    pub fn poison(&self, why: &str) {
        let mut s = self.state.lock();
        if s.poisoned.is_none() {
            s.poisoned = Some(why.to_string());
        }
        self.arrived.notify_all();
    }

    /// Rendezvous `key`: rank `rank` contributes `value`; once every rank
    /// has, each receives all values in rank order. Every rank must call it
    /// with the same key (keys name successive rounds, e.g. a channel and a
    /// per-channel operation counter).
    pub fn exchange(
        &self,
        key: &str,
        rank: u32,
        value: Arc<dyn Any + Send + Sync>,
    ) -> Result<Vec<Arc<dyn Any + Send + Sync>>> {
        if rank >= self.count {
            bail!(
                OutOfRange,
                "rank {rank} is outside the group of {} ranks",
                self.count
            );
        }
        let deadline = Instant::now() + self.timeout;
        let mut s = self.state.lock();
        if let Some(why) = &s.poisoned {
            bail!(Aborted, "collective group failed earlier: {why}");
        }
        let count = self.count as usize;
        let round = s.rounds.entry(key.to_string()).or_insert_with(|| Round {
            values: vec![None; count],
            taken: 0,
        });
        if round.values[rank as usize].is_some() {
            bail!(
                FailedPrecondition,
                "rank {rank} joined rendezvous '{key}' twice"
            );
        }
        round.values[rank as usize] = Some(value);
        if round.values.iter().all(Option::is_some) {
            self.arrived.notify_all();
        }
        loop {
            if let Some(why) = &s.poisoned {
                bail!(Aborted, "collective group failed: {why}");
            }
            let round = s
                .rounds
                .get_mut(key)
                .expect("a round lives until every rank took it");
            if round.values.iter().all(Option::is_some) {
                let all: Vec<_> = round.values.iter().map(|v| v.clone().unwrap()).collect();
                round.taken += 1;
                if round.taken == self.count {
                    s.rounds.remove(key);
                }
                return Ok(all);
            }
            if self.arrived.wait_until(&mut s, deadline).timed_out() {
                let missing: Vec<usize> = s.rounds[key]
                    .values
                    .iter()
                    .enumerate()
                    .filter(|(_, v)| v.is_none())
                    .map(|(i, _)| i)
                    .collect();
                let why = format!(
                    "rendezvous '{key}' timed out after {:?} waiting for ranks {missing:?}",
                    self.timeout
                );
                s.poisoned = Some(why.clone());
                self.arrived.notify_all();
                bail!(DeadlineExceeded, "{why}");
            }
        }
    }
}

/// One rank of a [`LocalGroup`]: the channel provider its device uses.
pub struct LocalRank {
    group: Arc<LocalGroup>,
    rank: u32,
}

impl LocalRank {
    /// The group.
    pub fn group(&self) -> &Arc<LocalGroup> {
        &self.group
    }
    /// This rank.
    pub fn rank(&self) -> u32 {
        self.rank
    }
}

impl ChannelProvider for LocalRank {
    fn default_rank_and_count(&self) -> Result<(u32, u32)> {
        Ok((self.rank, self.group.count))
    }

    fn exchange_default_id(&self, key: &str, id: &mut [u8]) -> Result<()> {
        let mine: Arc<dyn Any + Send + Sync> = Arc::new(id.to_vec());
        let all = self.group.exchange(&format!("id/{key}"), self.rank, mine)?;
        let root = all[0]
            .downcast_ref::<Vec<u8>>()
            .expect("identifier rounds carry byte vectors");
        if root.len() != id.len() {
            bail!(
                InvalidArgument,
                "rank 0's channel identifier has {} bytes, rank {} expected {}",
                root.len(),
                self.rank,
                id.len()
            );
        }
        id.copy_from_slice(root);
        Ok(())
    }

    fn as_any(&self) -> &dyn Any {
        self
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranks_receive_every_value_in_rank_order() {
        let g = LocalGroup::new(3).unwrap();
        let handles: Vec<_> = (0..3u32)
            .map(|r| {
                let g = g.clone();
                std::thread::spawn(move || {
                    let mut out = Vec::new();
                    for round in 0..50 {
                        let all = g
                            .exchange(&format!("k{round}"), r, Arc::new(r * 10 + round))
                            .unwrap();
                        out.push(
                            all.iter()
                                .map(|v| *v.downcast_ref::<u32>().unwrap())
                                .collect::<Vec<_>>(),
                        );
                    }
                    out
                })
            })
            .collect();
        for h in handles {
            let out = h.join().unwrap();
            for (round, vals) in out.iter().enumerate() {
                let round = round as u32;
                assert_eq!(vals, &vec![round, 10 + round, 20 + round]);
            }
        }
        assert!(g.state.lock().rounds.is_empty());
    }

    #[test]
    fn identifiers_come_from_rank_zero() {
        let g = LocalGroup::new(2).unwrap();
        let p1 = g.rank(1).unwrap();
        let t = std::thread::spawn(move || {
            let mut id = [0u8; 4];
            p1.exchange_default_id("c0", &mut id).unwrap();
            id
        });
        let mut id = [1, 2, 3, 4];
        g.rank(0)
            .unwrap()
            .exchange_default_id("c0", &mut id)
            .unwrap();
        assert_eq!(t.join().unwrap(), [1, 2, 3, 4]);
        assert_eq!(g.rank(0).unwrap().default_rank_and_count().unwrap(), (0, 2));
        assert!(g.rank(2).is_err());
    }

    #[test]
    fn a_missing_rank_times_out_and_poisons_the_group() {
        let g = LocalGroup::with_timeout(2, Duration::from_millis(50)).unwrap();
        let e = g.exchange("x", 0, Arc::new(())).unwrap_err().to_string();
        assert!(e.contains("waiting for ranks [1]"), "{e}");
        let e = g.exchange("y", 1, Arc::new(())).unwrap_err().to_string();
        assert!(e.contains("failed"), "{e}");
    }

    #[test]
    fn joining_twice_is_refused() {
        let g = LocalGroup::with_timeout(2, Duration::from_millis(100)).unwrap();
        let g2 = g.clone();
        // Rank 0 joins twice; whichever call comes second is refused, the
        // other times out waiting for rank 1.
        let t = std::thread::spawn(move || g2.exchange("x", 0, Arc::new(())));
        let here = g.exchange("x", 0, Arc::new(())).unwrap_err().to_string();
        let there = t.join().unwrap().unwrap_err().to_string();
        let refused = [&here, &there]
            .iter()
            .filter(|e| e.contains("twice"))
            .count();
        assert_eq!(refused, 1, "{here} / {there}");
    }
}
