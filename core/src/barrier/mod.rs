//! Barriers over RDMA writes of arrival counters.
//!
//! Every rank owns a flag array with one 8-byte slot per rank. To tell rank `j` "I arrived",
//! rank `i` increments its count of notifications sent to `j` and RDMA-writes (inline, no
//! wait) that count into slot `i` of `j`'s flag array. To wait for `j`, rank `i` increments
//! the count it expects from `j` and spins until slot `j` of its own array reaches it.
//! Counts only grow, and one RC connection delivers writes in order, so one pair of counters
//! per peer serves every algorithm and every sub-group, barrier after barrier.
//!
//! The algorithms, over the sorted member list `m` with this rank at index `i` (`n` members):
//! - [`BarrierAlgorithm::Centralized`]: everyone notifies `m[0]`, which waits for all, then
//!   releases all. 2 one-way latencies for the followers, but `n-1` messages at the leader.
//! - [`BarrierAlgorithm::Dissemination`]: in round `d = 1, 2, 4, ...` notify `m[(i+d) % n]`
//!   and wait for `m[(i-d) % n]`. `ceil(log2 n)` rounds, no leader.
//! - [`BarrierAlgorithm::BinaryTree`]: a heap over `m`; wait for the children, notify the
//!   parent, wait for the parent's release, release the children. `2 log2 n` latencies, at
//!   most 3 messages per rank.
//!
//! # After a failure
//! A barrier that times out or hits a transport error **poisons** the state: the counters
//! no longer agree with the peers' (a late arrival would satisfy the wrong barrier), so
//! every later barrier fails with [`BarrierError::Poisoned`]. Recovery means reconnecting
//! (a new node), which is also what a dead peer requires anyway.

use alloc::vec;
use alloc::vec::Vec;
use core::fmt;
use core::time::Duration;

use crate::channel::ChannelError;
use crate::poll::{Backoff, Clock, Deadline};

/// Most missing ranks a timeout error lists by name (it always gives the full count).
pub const MAX_LISTED: usize = 16;

/// Barrier algorithm.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub enum BarrierAlgorithm {
    /// Leader gathers, then releases.
    Centralized,
    /// Pairwise rounds at doubling distances.
    #[default]
    Dissemination,
    /// Reduce up a binary tree, broadcast down.
    BinaryTree,
}

impl BarrierAlgorithm {
    /// All algorithms.
    pub const ALL: [BarrierAlgorithm; 3] =
        [Self::Centralized, Self::Dissemination, Self::BinaryTree];

    /// A short name.
    pub const fn name(self) -> &'static str {
        match self {
            Self::Centralized => "centralized",
            Self::Dissemination => "dissemination",
            Self::BinaryTree => "binary-tree",
        }
    }
}

/// Why a barrier failed.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum BarrierError {
    /// An earlier barrier failed; this state can no longer be trusted.
    Poisoned,
    /// The member list does not contain this rank.
    SelfNotInGroup,
    /// The member list is not sorted ascending.
    UnorderedPeers,
    /// The member list names a rank twice.
    DuplicatePeers,
    /// A member is not a rank of this world.
    RankOutOfRange(u32),
    /// The deadline passed before every awaited rank arrived.
    Timeout {
        /// The ranks still awaited (the first [`MAX_LISTED`]).
        missing: heapless::Vec<u32, MAX_LISTED>,
        /// How many ranks were still awaited.
        missing_count: usize,
    },
    /// Notifying a rank failed.
    Transport {
        /// The rank.
        rank: u32,
        /// The channel error.
        error: ChannelError,
    },
}

impl fmt::Display for BarrierError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Poisoned => {
                f.write_str("barrier state is poisoned by an earlier failure; reconnect")
            }
            Self::SelfNotInGroup => f.write_str("this rank is not in the barrier's member list"),
            Self::UnorderedPeers => f.write_str("barrier members must be sorted ascending"),
            Self::DuplicatePeers => f.write_str("barrier members must not repeat"),
            Self::RankOutOfRange(r) => write!(f, "rank {r} is not in this world"),
            Self::Timeout {
                missing,
                missing_count,
            } => {
                write!(
                    f,
                    "barrier timed out waiting for {missing_count} rank(s): {missing:?}"
                )?;
                if *missing_count > missing.len() {
                    f.write_str(" ...")?;
                }
                Ok(())
            }
            Self::Transport { rank, error } => write!(f, "notifying rank {rank} failed: {error}"),
        }
    }
}

impl core::error::Error for BarrierError {}

/// How a barrier reaches the other ranks.
pub trait BarrierTransport {
    /// Writes `count` into this rank's slot of `rank`'s flag array (without waiting).
    /// Fails with [`BarrierError::Transport`] (naming `rank`) or
    /// [`BarrierError::RankOutOfRange`] if there is no connection to `rank`.
    fn notify(&mut self, rank: u32, count: u64) -> Result<(), BarrierError>;
    /// The count `rank` last wrote into our flag array.
    fn arrived(&self, rank: u32) -> u64;
    /// Polls completions (retires notification writes, surfaces failures, naming the rank).
    fn progress(&mut self) -> Result<(), BarrierError>;
}

/// Per-rank arrival counters. Allocated once for the world size; barriers allocate nothing.
#[derive(Debug)]
pub struct BarrierState {
    me: u32,
    sent: Vec<u64>,
    expected: Vec<u64>,
    poisoned: bool,
}

impl BarrierState {
    /// Counters for rank `me` of a world of `world` ranks.
    pub fn new(me: u32, world: u32) -> Self {
        Self {
            me,
            sent: vec![0; world as usize],
            expected: vec![0; world as usize],
            poisoned: false,
        }
    }

    /// Whether an earlier barrier failed.
    pub fn is_poisoned(&self) -> bool {
        self.poisoned
    }

    /// Checks a member list: sorted, no repeats, in range, containing this rank.
    pub fn validate(&self, members: &[u32]) -> Result<(), BarrierError> {
        let world = self.sent.len() as u32;
        let mut has_me = false;
        for (k, &r) in members.iter().enumerate() {
            if r >= world {
                return Err(BarrierError::RankOutOfRange(r));
            }
            if k > 0 {
                let prev = members[k - 1];
                if r == prev {
                    return Err(BarrierError::DuplicatePeers);
                }
                if r < prev {
                    return Err(BarrierError::UnorderedPeers);
                }
            }
            has_me |= r == self.me;
        }
        if has_me {
            Ok(())
        } else {
            Err(BarrierError::SelfNotInGroup)
        }
    }

    /// Runs one barrier over `members` (validated first). Does not allocate.
    pub fn run<T: BarrierTransport, C: Clock, B: Backoff>(
        &mut self,
        t: &mut T,
        members: &[u32],
        alg: BarrierAlgorithm,
        clock: &C,
        timeout: Duration,
        backoff: &mut B,
    ) -> Result<(), BarrierError> {
        if self.poisoned {
            return Err(BarrierError::Poisoned);
        }
        self.validate(members)?;
        let deadline = Deadline::after(clock, timeout);
        let r = self.run_unchecked(t, members, alg, clock, deadline, backoff);
        if r.is_err() {
            self.poisoned = true;
        }
        r
    }

    fn run_unchecked<T: BarrierTransport, C: Clock, B: Backoff>(
        &mut self,
        t: &mut T,
        m: &[u32],
        alg: BarrierAlgorithm,
        clock: &C,
        deadline: Deadline,
        backoff: &mut B,
    ) -> Result<(), BarrierError> {
        let n = m.len();
        if n <= 1 {
            return Ok(());
        }
        let i = m.iter().position(|&r| r == self.me).unwrap_or(0);
        let mut w = Waiter {
            clock,
            deadline,
            backoff,
        };
        match alg {
            BarrierAlgorithm::Centralized => {
                let leader = m[0];
                if i == 0 {
                    self.wait(t, &m[1..], &mut w)?;
                    for &r in &m[1..] {
                        self.notify(t, r)?;
                    }
                } else {
                    self.notify(t, leader)?;
                    self.wait(t, &[leader], &mut w)?;
                }
            }
            BarrierAlgorithm::Dissemination => {
                let mut d = 1;
                while d < n {
                    self.notify(t, m[(i + d) % n])?;
                    self.wait(t, &[m[(i + n - d) % n]], &mut w)?;
                    d *= 2;
                }
            }
            BarrierAlgorithm::BinaryTree => {
                let (c1, c2) = (2 * i + 1, 2 * i + 2);
                let kids = &m[c1.min(n)..(c2 + 1).min(n)];
                self.wait(t, kids, &mut w)?;
                if i > 0 {
                    let parent = m[(i - 1) / 2];
                    self.notify(t, parent)?;
                    self.wait(t, &[parent], &mut w)?;
                }
                for &k in kids {
                    self.notify(t, k)?;
                }
            }
        }
        Ok(())
    }

    fn notify<T: BarrierTransport>(&mut self, t: &mut T, rank: u32) -> Result<(), BarrierError> {
        let c = &mut self.sent[rank as usize];
        *c += 1;
        t.notify(rank, *c)
    }

    fn wait<T: BarrierTransport, C: Clock, B: Backoff>(
        &mut self,
        t: &mut T,
        ranks: &[u32],
        w: &mut Waiter<'_, C, B>,
    ) -> Result<(), BarrierError> {
        for &r in ranks {
            self.expected[r as usize] += 1;
        }
        w.backoff.reset();
        loop {
            if ranks
                .iter()
                .all(|&r| t.arrived(r) >= self.expected[r as usize])
            {
                return Ok(());
            }
            if w.deadline.passed(w.clock) {
                let mut missing = heapless::Vec::new();
                let mut missing_count = 0;
                for &r in ranks {
                    if t.arrived(r) < self.expected[r as usize] {
                        missing_count += 1;
                        let _ = missing.push(r);
                    }
                }
                return Err(BarrierError::Timeout {
                    missing,
                    missing_count,
                });
            }
            t.progress()?;
            w.backoff.snooze();
        }
    }
}

struct Waiter<'a, C, B> {
    clock: &'a C,
    deadline: Deadline,
    backoff: &'a mut B,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn member_lists_are_validated() {
        let s = BarrierState::new(2, 5);
        assert_eq!(s.validate(&[0, 2, 4]), Ok(()));
        assert_eq!(s.validate(&[0, 1]), Err(BarrierError::SelfNotInGroup));
        assert_eq!(s.validate(&[2, 1]), Err(BarrierError::UnorderedPeers));
        assert_eq!(s.validate(&[2, 2]), Err(BarrierError::DuplicatePeers));
        assert_eq!(s.validate(&[2, 9]), Err(BarrierError::RankOutOfRange(9)));
    }
}
