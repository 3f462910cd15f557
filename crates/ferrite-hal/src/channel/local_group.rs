//! An in-process collective group: several ranks driven by one process
//! (one thread per rank, each with its own device and context).
//!
//! [`LocalGroup::new`] makes a group of `count` ranks; [`LocalGroup::rank`]
//! hands out each rank's [`ChannelProvider`]. Identifiers are exchanged in
//! memory, and [`LocalGroup::exchange`] gives drivers a rendezvous where
//! every rank contributes a value and receives all of them in rank order:
//! CPU devices build their collectives on it; GPU drivers use the group
//! only for the identifier (their data moves through their own library).

use super::provider::ChannelProvider;
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
    /// Per-rank counters of [`LocalGroup::next_round`], by stream name.
    counters: Mutex<HashMap<(u32, String), u64>>,
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
    /// The ranks taking part, in the order values are returned.
    members: Vec<u32>,
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
            counters: Mutex::new(HashMap::new()),
        }))
    }

    /// The number of ranks.
    pub fn count(&self) -> u32 {
        self.count
    }

    /// How long a rendezvous waits for missing ranks.
    pub fn timeout(&self) -> Duration {
        self.timeout
    }

    /// The next number of `rank`'s counter named `stream` (0, 1, 2, ...).
    /// Ranks that perform the same sequence of operations get the same
    /// numbers, so keys built from them name the same rendezvous on every
    /// rank (e.g. the n-th channel a rank creates).
    pub fn next_round(&self, rank: u32, stream: &str) -> u64 {
        let mut c = self.counters.lock();
        let n = c.entry((rank, stream.to_string())).or_insert(0);
        let this = *n;
        *n += 1;
        this
    }

    /// Whether a rank failed or a rendezvous timed out (see [`Self::poison`]).
    pub fn poisoned(&self) -> Option<String> {
        self.state.lock().poisoned.clone()
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
        let all: Vec<u32> = (0..self.count).collect();
        self.exchange_among(key, &all, rank, value)
    }

    /// Rendezvous `key` among `members` only (distinct ranks of the group;
    /// a subgroup or a pair of peers): each member contributes a value and
    /// receives all of them in the order of `members`. Every member must
    /// pass the same list; a member passing another list is refused,
    /// naming both.
    pub fn exchange_among(
        &self,
        key: &str,
        members: &[u32],
        rank: u32,
        value: Arc<dyn Any + Send + Sync>,
    ) -> Result<Vec<Arc<dyn Any + Send + Sync>>> {
        if let Some(&bad) = members.iter().find(|&&m| m >= self.count) {
            bail!(
                OutOfRange,
                "rank {bad} is outside the group of {} ranks",
                self.count
            );
        }
        let Some(slot) = members.iter().position(|&m| m == rank) else {
            bail!(
                InvalidArgument,
                "rank {rank} joined rendezvous '{key}' of ranks {members:?}"
            );
        };
        if (1..members.len()).any(|i| members[..i].contains(&members[i])) {
            bail!(
                InvalidArgument,
                "rendezvous '{key}' names a rank twice: {members:?}"
            );
        }
        let deadline = Instant::now() + self.timeout;
        let mut s = self.state.lock();
        if let Some(why) = &s.poisoned {
            bail!(Aborted, "collective group failed earlier: {why}");
        }
        let round = s.rounds.entry(key.to_string()).or_insert_with(|| Round {
            members: members.to_vec(),
            values: vec![None; members.len()],
            taken: 0,
        });
        if round.members != members {
            bail!(
                InvalidArgument,
                "rank {rank} joined rendezvous '{key}' of ranks {members:?}, but it was begun by ranks {:?}",
                round.members
            );
        }
        if round.values[slot].is_some() {
            bail!(
                FailedPrecondition,
                "rank {rank} joined rendezvous '{key}' twice"
            );
        }
        round.values[slot] = Some(value);
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
                if round.taken as usize == round.members.len() {
                    s.rounds.remove(key);
                }
                return Ok(all);
            }
            if self.arrived.wait_until(&mut s, deadline).timed_out() {
                let round = &s.rounds[key];
                let missing: Vec<u32> = round
                    .values
                    .iter()
                    .zip(&round.members)
                    .filter(|(v, _)| v.is_none())
                    .map(|(_, &m)| m)
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
    fn subsets_meet_without_the_others() {
        let g = LocalGroup::with_timeout(3, Duration::from_secs(10)).unwrap();
        let g2 = g.clone();
        let t = std::thread::spawn(move || g2.exchange_among("p", &[2, 0], 0, Arc::new(7u32)));
        let here = g.exchange_among("p", &[2, 0], 2, Arc::new(9u32)).unwrap();
        let there = t.join().unwrap().unwrap();
        for all in [here, there] {
            let v: Vec<u32> = all
                .iter()
                .map(|v| *v.downcast_ref::<u32>().unwrap())
                .collect();
            assert_eq!(v, [9, 7]);
        }
        let e = g
            .exchange_among("q", &[0, 1], 2, Arc::new(()))
            .unwrap_err()
            .to_string();
        assert!(e.contains("of ranks [0, 1]"), "{e}");
        assert_eq!(g.next_round(0, "a"), 0);
        assert_eq!(g.next_round(0, "a"), 1);
        assert_eq!(g.next_round(1, "a"), 0);
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
