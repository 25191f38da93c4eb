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
//! A barrier over the whole world walks stages worked out once per algorithm (a plan), and
//! the common one, dissemination over the whole world, starts in a loop of its own
//! (`BarrierState::start_dissemination_world`, used by the node): per round one
//! notification and one compare, the pending state built only when a rank is missing; a
//! test holds it to the general walk barrier after barrier.
//!
//! # After a failure
//! When the deadline passes, a rank does not blame the ranks it waits for at once: one of them
//! may be alive and waiting for a dead rank itself. It first asks the transport whether a
//! failure is known ([`BarrierTransport::failure`]); if none is, it probes each missing rank
//! (writes it the count it already has, which changes nothing at a live rank and fails at a
//! dead one) and waits [`BarrierTransport::probe_grace`] longer for the news. Only then does
//! it report [`BarrierError::Timeout`] with the ranks it waited for: those are alive, or at
//! least not known to be dead. A failure heard of at any point ends the barrier with
//! [`BarrierError::PeerFailed`], naming the failed rank.
//!
//! A member that *refuses* a notification (a remote access or remote invalid request error)
//! is not blamed at once either: a dying process's memory registrations go before its queue
//! pairs, so for a moment they refuse writes, but the caller's own request with a bad key on
//! the same channel reads the same. A node's blocking barrier (`Node::barrier_timeout`) and
//! `rverbs-async`'s `AsyncNode` barrier wait up to the probe grace (no probe: the channel is
//! broken) for news of a member and report it; without any, the refusal
//! ([`BarrierError::Transport`]). The node's `barrier_poll` never waits: it reports news
//! already known, else the refusal (`NodeError::is_refusal`), and its caller may wait for
//! news with `Node::failure`.
//!
//! A barrier reads the clock only when it first finds an awaited rank missing: its timeout runs
//! from there (what comes before, the notifications it sends, does not wait), so a barrier whose
//! ranks are all there costs no clock read.
//!
//! A barrier that fails **poisons** the state: the counters no longer agree with the peers'
//! (a late arrival would satisfy the wrong barrier), so every later barrier fails with
//! [`BarrierError::Poisoned`]. Recovery is collective: every rank resets its counters
//! ([`BarrierState::reset`]) while nobody sends, as readmitting a restarted rank does
//! ([`Node::readmit_begin`](crate::node::Node::readmit_begin)), or builds a new node.
//!
//! News about a rank outside the barrier's members (and a broken channel to one) does not
//! fail the barrier: the members can still meet.
//!
//! # A count is a peer's word
//! The arrival counts are written by peers, so the barrier takes none of them on trust. A
//! rank cannot get more than one barrier ahead of us: every algorithm completes a barrier
//! only after every member entered it, so a peer finishes our current barrier at the
//! earliest and then enters the next one, where it notifies us at most once more (per
//! barrier a peer notifies us at most once, exactly when we wait for it: the stages pair
//! up). When we check rank `r`'s slot we have already counted the current barrier into
//! `expected[r]`, so an honest slot holds at most `expected[r] + 1`. A count above that is
//! corrupt or forged (say `u64::MAX`, which would otherwise complete this barrier and every
//! later one at once): the barrier fails with [`BarrierError::ImplausibleArrival`], naming
//! the slot's rank and the count, and the state is poisoned like after any failure. What
//! this cannot catch: any peer holds the flag array's key, so it can write a plausible count
//! (`expected[r]` or one more) into another rank's slot; only keys per peer (memory windows
//! bound to one queue pair) would stop that.

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
    /// Its position in [`BarrierAlgorithm::ALL`].
    const fn index(self) -> usize {
        match self {
            Self::Centralized => 0,
            Self::Dissemination => 1,
            Self::BinaryTree => 2,
        }
    }

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
    /// A barrier started with [`BarrierState::start`] has not finished yet.
    AlreadyStarted,
    /// [`BarrierState::poll`] was given other members than the barrier it advances started
    /// with (nothing was changed).
    MembersChanged,
    /// A member is not a rank of this world.
    RankOutOfRange(u32),
    /// The deadline passed before every awaited rank arrived.
    Timeout {
        /// The ranks still awaited (the first [`MAX_LISTED`]).
        missing: heapless::Vec<u32, MAX_LISTED>,
        /// How many ranks were still awaited.
        missing_count: usize,
    },
    /// Polling the completion queues the node's channels share failed.
    Completions(crate::provider::ProviderError),
    /// A rank failed (this node saw it, or heard it from a peer or its failure alarm): the
    /// barrier cannot complete. Names the failed rank, not the one this rank waited for.
    PeerFailed(crate::failure::Failure),
    /// Notifying a rank failed.
    Transport {
        /// The rank.
        rank: u32,
        /// The channel error.
        error: ChannelError,
    },
    /// The arrival count in `rank`'s slot of our flag array is more than `rank` could have
    /// reached (see [a count is a peer's word](self#a-count-is-a-peers-word)): the slot was
    /// corrupted or forged (by `rank` or by any peer holding the flag array's key).
    ImplausibleArrival {
        /// Whose slot.
        rank: u32,
        /// The count it held.
        count: u64,
        /// The most an honest `rank` could have written by now.
        most: u64,
    },
}

impl fmt::Display for BarrierError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Poisoned => f.write_str(
                "barrier state is poisoned by an earlier failure; readmit the failed rank \
                 (every rank resets its counters) or reconnect",
            ),
            Self::SelfNotInGroup => f.write_str("this rank is not in the barrier's member list"),
            Self::UnorderedPeers => f.write_str("barrier members must be sorted ascending"),
            Self::DuplicatePeers => f.write_str("barrier members must not repeat"),
            Self::AlreadyStarted => f.write_str("a barrier is already in progress"),
            Self::MembersChanged => {
                f.write_str("a barrier must be polled with the members it started with")
            }
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
            Self::PeerFailed(failure) => write!(f, "barrier cannot complete: {failure}"),
            Self::ImplausibleArrival { rank, count, most } => write!(
                f,
                "the arrival count in rank {rank}'s slot is {count}, more than the {most} it \
                 could have reached: the slot was corrupted or forged"
            ),
            Self::Completions(e) => write!(f, "shared completion queues: {e}"),
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
    /// The count `rank` last wrote into our flag array: a peer's word, any value (the barrier
    /// checks it, see [a count is a peer's word](self#a-count-is-a-peers-word)).
    fn arrived(&self, rank: u32) -> u64;
    /// Polls completions (retires notification writes, surfaces failures, naming the rank).
    fn progress(&mut self) -> Result<(), BarrierError>;
    /// A failure of some rank the transport knows of, if any: a barrier that times out
    /// reports it (when the rank is a member) instead of the ranks it happened to wait for.
    /// Default: none.
    fn failure(&mut self) -> Option<crate::failure::Failure> {
        None
    }
    /// How long a barrier whose deadline passed keeps waiting after probing the ranks it is
    /// missing (see [after a failure](self#after-a-failure)): long enough for a probe of a
    /// dead rank to fail and for the news to spread. The probe is a second
    /// [`notify`](Self::notify) with the count already sent, so `notify` must be idempotent
    /// for a count it already delivered. Default 0: the probe is sent, nothing is waited for.
    fn probe_grace(&self) -> Duration {
        Duration::ZERO
    }
}

/// Per-rank arrival counters. Allocated once for the world size; barriers allocate nothing.
#[derive(Debug)]
pub struct BarrierState {
    me: u32,
    sent: Vec<u64>,
    expected: Vec<u64>,
    poisoned: bool,
    pending: Option<Pending>,
    /// The fingerprint of the whole world's member list (`0..world`), computed once: a
    /// barrier over every rank checks its list against it in O(1).
    world_print: (usize, u64),
    /// Per algorithm (indexed by [`BarrierAlgorithm::index`]), the stages of a barrier over
    /// the whole world, worked out once: a whole-world step reads its ranks from here
    /// instead of evaluating the stage table (divisions, matches) on every step.
    plans: [Plan; 3],
    /// The whole-world dissemination barrier's rounds for this rank, `(notify, wait)` per
    /// round (the dissemination plan's steps, each of one rank to notify and one to wait
    /// for): what [`BarrierState::start_dissemination_world`] walks, one pair per round.
    rounds: Vec<(u32, u32)>,
}

/// The stages of one algorithm's barrier over the whole world for this rank: the ranks to
/// notify and to wait for, as ranges into one list. Built by [`stage`] over `0..world`, so it
/// says exactly what the table says (a test compares them).
#[derive(Debug, Default)]
struct Plan {
    /// Per stage: `ranks[notify.0..notify.1]` to notify, `ranks[wait.0..wait.1]` to wait for.
    steps: Vec<Step>,
    ranks: Vec<u32>,
}

#[derive(Clone, Copy, Debug)]
struct Step {
    notify: (u32, u32),
    wait: (u32, u32),
}

impl Plan {
    /// Stage by stage, what [`stage`] says for rank `me` of the whole world `0..world`
    /// (where a member's position is its rank).
    fn new(alg: BarrierAlgorithm, me: u32, world: u32) -> Self {
        let mut plan = Self::default();
        if world <= 1 {
            return plan;
        }
        let mut k = 0;
        while let Some((notify, wait)) = stage(alg, world as usize, me as usize, k) {
            let mut range = |set: Set| {
                let start = plan.ranks.len() as u32;
                plan.ranks.extend(set.iter().map(|r| r as u32));
                (start, plan.ranks.len() as u32)
            };
            let notify = range(notify);
            let wait = range(wait);
            plan.steps.push(Step { notify, wait });
            k += 1;
        }
        plan
    }

    fn ranks(&self, (a, b): (u32, u32)) -> &[u32] {
        self.ranks.get(a as usize..b as usize).unwrap_or(&[])
    }

    /// A dissemination plan's steps as `(notify, wait)` pairs: each of its steps notifies
    /// one rank and waits for one (the table's `Set::One` twice).
    fn rounds(&self) -> Vec<(u32, u32)> {
        self.steps
            .iter()
            .map(|s| {
                let (notify, wait) = (self.ranks(s.notify), self.ranks(s.wait));
                debug_assert!(notify.len() == 1 && wait.len() == 1);
                (notify[0], wait[0])
            })
            .collect()
    }
}

/// A barrier in progress: which stage, whether its notifications went out, and its deadline.
#[derive(Clone, Copy, Debug)]
struct Pending {
    alg: BarrierAlgorithm,
    /// This rank's index in the member list.
    i: usize,
    stage: u32,
    entered: bool,
    /// Whether the members are the whole world (`0..world`): the stages come from the plan.
    world: bool,
    /// Set when the barrier first finds a rank missing (a barrier that never waits reads no
    /// clock): the wait it bounds starts there.
    deadline: Deadline,
    /// Whether the deadline passed once and the missing ranks were probed.
    probed: bool,
    /// The member list it started with (length and a fingerprint), checked on every poll.
    members: (usize, u64),
}

/// A fingerprint of a member list (FNV-1a over the ranks).
fn fingerprint(m: &[u32]) -> (usize, u64) {
    let h = m.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, &r| {
        (h ^ u64::from(r)).wrapping_mul(0x0000_0100_0000_01b3)
    });
    (m.len(), h)
}

/// [`fingerprint`] of `0..world`, without the list.
fn world_fingerprint(world: u32) -> (usize, u64) {
    let h = (0..world).fold(0xcbf2_9ce4_8422_2325u64, |h, r| {
        (h ^ u64::from(r)).wrapping_mul(0x0000_0100_0000_01b3)
    });
    (world as usize, h)
}

/// What the count a peer wrote says, against the count `expected` of it this stage waits for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Arrival {
    /// Not yet (an honest count lags, or a slot went back: harmless either way).
    Waiting,
    /// Arrived: the count is `expected`, or one more (the peer is in the next barrier).
    In,
    /// More than the peer could have reached (see the module docs).
    Implausible,
}

/// Reads a peer's arrival `count` against `expected` (this stage's count, already
/// incremented). `count - expected` (wrapping) is 0 or 1 exactly when the count is in: the
/// arrived path is a subtraction and one compare-and-branch, 2 to 3 instructions more per
/// awaited rank than the plain `>=` it replaced (x86-64), and no division. (At
/// `expected == u64::MAX` a count of 0 would be "one more": one count per barrier never
/// gets there.)
#[inline]
fn arrival(count: u64, expected: u64) -> Arrival {
    if count.wrapping_sub(expected) <= 1 {
        Arrival::In
    } else if count < expected {
        Arrival::Waiting
    } else {
        Arrival::Implausible
    }
}

/// Whether `rank`, awaited with `expected[rank]`, has arrived; an error naming it if its count
/// is one no honest peer could have written.
#[inline]
fn arrived<T: BarrierTransport>(t: &T, rank: u32, expected: &[u64]) -> Result<bool, BarrierError> {
    let (count, expected) = (t.arrived(rank), expected[rank as usize]);
    match arrival(count, expected) {
        Arrival::In => Ok(true),
        Arrival::Waiting => Ok(false),
        Arrival::Implausible => Err(implausible(rank, count, expected)),
    }
}

#[cold]
#[inline(never)]
fn implausible(rank: u32, count: u64, expected: u64) -> BarrierError {
    BarrierError::ImplausibleArrival {
        rank,
        count,
        most: expected.saturating_add(1),
    }
}

/// [`BarrierState::advance`] over the whole world: the stages from `plan`.
#[inline]
fn advance_plan<T: BarrierTransport>(
    plan: &Plan,
    sent: &mut [u64],
    expected: &mut [u64],
    t: &mut T,
    p: &mut Pending,
) -> Result<bool, BarrierError> {
    while let Some(step) = plan.steps.get(p.stage as usize) {
        let wait = plan.ranks(step.wait);
        if !p.entered {
            for &r in plan.ranks(step.notify) {
                let c = &mut sent[r as usize];
                *c += 1;
                t.notify(r, *c)?;
            }
            for &r in wait {
                expected[r as usize] += 1;
            }
            p.entered = true;
        }
        for &r in wait {
            if !arrived(t, r, expected)? {
                return Ok(false);
            }
        }
        p.stage += 1;
        p.entered = false;
    }
    Ok(true)
}

/// Whether `e` is about a rank that is not among `members` (sorted).
fn about_a_stranger(e: &BarrierError, members: &[u32]) -> bool {
    let rank = match e {
        BarrierError::PeerFailed(f) => f.rank,
        BarrierError::Transport { rank, .. } => *rank,
        _ => return false,
    };
    members.binary_search(&rank).is_err()
}

/// Ranks of one side of a stage, as positions in the member list (no allocation).
#[derive(Clone, Copy, Debug)]
enum Set {
    None,
    One(usize),
    Span(usize, usize),
}

impl Set {
    fn iter(self) -> impl Iterator<Item = usize> {
        let (a, b) = match self {
            Set::None => (0, 0),
            Set::One(k) => (k, k + 1),
            Set::Span(a, b) => (a, b),
        };
        a..b
    }
}

/// Stage `k` of algorithm `alg` for member `i` of `n`: whom to notify on entering it, then
/// whom to wait for; `None` after the last stage.
fn stage(alg: BarrierAlgorithm, n: usize, i: usize, k: u32) -> Option<(Set, Set)> {
    match alg {
        BarrierAlgorithm::Centralized => match (i, k) {
            (0, 0) => Some((Set::None, Set::Span(1, n))),
            (0, 1) => Some((Set::Span(1, n), Set::None)),
            (_, 0) => Some((Set::One(0), Set::One(0))),
            _ => None,
        },
        BarrierAlgorithm::Dissemination => {
            let d = 1usize.checked_shl(k).filter(|&d| d < n)?;
            Some((Set::One((i + d) % n), Set::One((i + n - d) % n)))
        }
        BarrierAlgorithm::BinaryTree => {
            let kids = Set::Span((2 * i + 1).min(n), (2 * i + 3).min(n));
            match k {
                0 => Some((Set::None, kids)),
                1 if i > 0 => Some((Set::One((i - 1) / 2), Set::One((i - 1) / 2))),
                1 => Some((Set::None, Set::None)),
                2 => Some((kids, Set::None)),
                _ => None,
            }
        }
    }
}

impl BarrierState {
    /// Counters for rank `me` of a world of `world` ranks.
    pub fn new(me: u32, world: u32) -> Self {
        Self {
            me,
            sent: vec![0; world as usize],
            expected: vec![0; world as usize],
            poisoned: false,
            pending: None,
            world_print: world_fingerprint(world),
            plans: BarrierAlgorithm::ALL.map(|alg| Plan::new(alg, me, world)),
            rounds: Plan::new(BarrierAlgorithm::Dissemination, me, world).rounds(),
        }
    }

    /// Forgets every count, the barrier in progress and the poison: the state of a new
    /// world. Every rank must reset together, with no notification in flight and its flag
    /// array zeroed, before any of them starts another barrier. Does not allocate.
    pub fn reset(&mut self) {
        self.sent.fill(0);
        self.expected.fill(0);
        self.poisoned = false;
        self.pending = None;
    }

    /// Abandons the barrier in progress and refuses new ones until [`BarrierState::reset`].
    pub(crate) fn poison(&mut self) {
        self.poisoned = true;
        self.pending = None;
    }

    /// Whether a barrier was started and has not finished.
    pub fn is_pending(&self) -> bool {
        self.pending.is_some()
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

    /// Runs one barrier over `members` (validated first), waiting with `backoff` between
    /// rounds of polling. Does not allocate.
    pub fn run<T: BarrierTransport, C: Clock, B: Backoff>(
        &mut self,
        t: &mut T,
        members: &[u32],
        alg: BarrierAlgorithm,
        clock: &C,
        timeout: Duration,
        backoff: &mut B,
    ) -> Result<(), BarrierError> {
        self.start(t, members, alg, clock, timeout)?;
        if self.pending.is_none() {
            return Ok(());
        }
        let print = fingerprint(members);
        self.finish(t, members, print, clock, backoff)
    }

    /// [`BarrierState::run`] over every rank of the world (`0..world`, see
    /// [`BarrierState::start_world`]).
    pub(crate) fn run_world<T: BarrierTransport, C: Clock, B: Backoff>(
        &mut self,
        t: &mut T,
        world: &[u32],
        alg: BarrierAlgorithm,
        clock: &C,
        timeout: Duration,
        backoff: &mut B,
    ) -> Result<(), BarrierError> {
        self.start_world(t, world, alg, clock, timeout)?;
        if self.pending.is_none() {
            // Every awaited rank was there: no wait, no back-off.
            return Ok(());
        }
        self.finish(t, world, self.world_print, clock, backoff)
    }

    /// Polls the barrier just started until it completes, backing off between rounds.
    fn finish<T: BarrierTransport, C: Clock, B: Backoff>(
        &mut self,
        t: &mut T,
        members: &[u32],
        print: (usize, u64),
        clock: &C,
        backoff: &mut B,
    ) -> Result<(), BarrierError> {
        backoff.reset();
        while !self.poll_as(t, members, print, clock)? {
            let deadline = self.pending.as_ref().map(|p| p.deadline);
            backoff.snooze_within(&mut || deadline.map_or(Duration::MAX, |d| d.remaining(clock)));
        }
        Ok(())
    }

    /// Starts a barrier over `members` (validated first) and sends what it can without
    /// waiting; [`BarrierState::poll`] with the same members finishes it. Does not allocate.
    pub fn start<T: BarrierTransport, C: Clock>(
        &mut self,
        t: &mut T,
        members: &[u32],
        alg: BarrierAlgorithm,
        clock: &C,
        timeout: Duration,
    ) -> Result<(), BarrierError> {
        if self.poisoned {
            return Err(BarrierError::Poisoned);
        }
        if self.pending.is_some() {
            return Err(BarrierError::AlreadyStarted);
        }
        self.validate(members)?;
        let print = fingerprint(members);
        // A valid list of `world` ranks is `0..world`: the plan serves it.
        let world = members.len() == self.sent.len();
        self.begin(t, members, (print, world), alg, clock, timeout)
    }

    /// [`BarrierState::start_world`] for [`BarrierAlgorithm::Dissemination`], specialised:
    /// per round one notification and one compare of the awaited rank's slot, straight
    /// from the rounds worked out at build (no plan walked through ranges, no pending state
    /// built unless a rank is missing). `Ok(true)`: the barrier completed. `Ok(false)`: a
    /// rank is missing; the barrier is pending at that round, entered, its deadline running
    /// from now, exactly as [`BarrierState::start_world`] leaves it (finish it with
    /// [`BarrierState::poll_world`] or [`BarrierState::finish_world`]). Refuses a poisoned
    /// state and a barrier already started; a failed notification and an implausible
    /// arrival poison the state, as everywhere. Does not allocate.
    #[inline]
    pub(crate) fn start_dissemination_world<T: BarrierTransport, C: Clock>(
        &mut self,
        t: &mut T,
        clock: &C,
        timeout: Duration,
    ) -> Result<bool, BarrierError> {
        if self.poisoned || self.pending.is_some() {
            return Err(self.refusal());
        }
        for k in 0..self.rounds.len() {
            let (to, from) = self.rounds[k];
            let c = &mut self.sent[to as usize];
            *c += 1;
            if let Err(e) = t.notify(to, *c) {
                return Err(self.fail(e));
            }
            let e = &mut self.expected[from as usize];
            *e += 1;
            let (count, e) = (t.arrived(from), *e);
            match arrival(count, e) {
                Arrival::In => {}
                Arrival::Waiting => {
                    self.wait_at(k, clock, timeout);
                    return Ok(false);
                }
                Arrival::Implausible => return Err(self.fail(implausible(from, count, e))),
            }
        }
        Ok(true)
    }

    /// Why a barrier may not start: the state is poisoned, or one is in progress.
    #[cold]
    #[inline(never)]
    fn refusal(&self) -> BarrierError {
        if self.poisoned {
            BarrierError::Poisoned
        } else {
            BarrierError::AlreadyStarted
        }
    }

    /// The whole-world dissemination barrier waits in round `k` (entered: its notification
    /// is out, its count expected): the pending state the plan walk goes on from, with the
    /// deadline from now.
    #[cold]
    #[inline(never)]
    fn wait_at<C: Clock>(&mut self, k: usize, clock: &C, timeout: Duration) {
        self.pending = Some(Pending {
            alg: BarrierAlgorithm::Dissemination,
            i: self.me as usize,
            stage: k as u32,
            entered: true,
            world: true,
            deadline: Deadline::after(clock, timeout),
            probed: false,
            members: self.world_print,
        });
    }

    /// Polls the whole-world barrier in progress until it completes, backing off between
    /// rounds (see [`BarrierState::run_world`]). Does not allocate.
    pub(crate) fn finish_world<T: BarrierTransport, C: Clock, B: Backoff>(
        &mut self,
        t: &mut T,
        world: &[u32],
        clock: &C,
        backoff: &mut B,
    ) -> Result<(), BarrierError> {
        debug_assert!(world.iter().copied().eq(0..self.sent.len() as u32));
        self.finish(t, world, self.world_print, clock, backoff)
    }

    /// [`BarrierState::start`] over every rank of the world: `0..world`, which needs no
    /// checking and whose fingerprint is known (a whole-world barrier is the common one, and
    /// checking a list of 64 ranks costs more than the rest of a step). Does not allocate.
    pub(crate) fn start_world<T: BarrierTransport, C: Clock>(
        &mut self,
        t: &mut T,
        world: &[u32],
        alg: BarrierAlgorithm,
        clock: &C,
        timeout: Duration,
    ) -> Result<(), BarrierError> {
        debug_assert!(world.iter().copied().eq(0..self.sent.len() as u32));
        if self.poisoned {
            return Err(BarrierError::Poisoned);
        }
        if self.pending.is_some() {
            return Err(BarrierError::AlreadyStarted);
        }
        self.begin(t, world, (self.world_print, true), alg, clock, timeout)
    }

    fn begin<T: BarrierTransport, C: Clock>(
        &mut self,
        t: &mut T,
        members: &[u32],
        (print, world): ((usize, u64), bool),
        alg: BarrierAlgorithm,
        clock: &C,
        timeout: Duration,
    ) -> Result<(), BarrierError> {
        if members.len() <= 1 {
            return Ok(());
        }
        let mut p = Pending {
            alg,
            // In the whole world a rank's position is its rank.
            i: if world {
                self.me as usize
            } else {
                members.iter().position(|&r| r == self.me).unwrap_or(0)
            },
            stage: 0,
            entered: false,
            world,
            // Replaced below if the barrier has to wait.
            deadline: Deadline::never(),
            probed: false,
            members: print,
        };
        if self.advance(t, members, &mut p)? {
            return Ok(());
        }
        // A rank is missing: the wait starts, and with it the deadline.
        p.deadline = Deadline::after(clock, timeout);
        self.pending = Some(p);
        Ok(())
    }

    /// Advances the barrier in progress: `Ok(true)` once it completed (also when none is in
    /// progress), `Ok(false)` while ranks are still awaited, an error (which poisons the
    /// state) on a transport failure, on an arrival count no honest peer could have written
    /// ([`BarrierError::ImplausibleArrival`]) or when the deadline passed. Never waits. Does
    /// not allocate.
    pub fn poll<T: BarrierTransport, C: Clock>(
        &mut self,
        t: &mut T,
        members: &[u32],
        clock: &C,
    ) -> Result<bool, BarrierError> {
        let print = fingerprint(members);
        self.poll_as(t, members, print, clock)
    }

    /// [`BarrierState::poll`] over every rank of the world (`0..world`, see
    /// [`BarrierState::start_world`]).
    pub(crate) fn poll_world<T: BarrierTransport, C: Clock>(
        &mut self,
        t: &mut T,
        world: &[u32],
        clock: &C,
    ) -> Result<bool, BarrierError> {
        debug_assert!(world.iter().copied().eq(0..self.sent.len() as u32));
        self.poll_as(t, world, self.world_print, clock)
    }

    fn poll_as<T: BarrierTransport, C: Clock>(
        &mut self,
        t: &mut T,
        members: &[u32],
        print: (usize, u64),
        clock: &C,
    ) -> Result<bool, BarrierError> {
        let Some(mut p) = self.pending else {
            return Ok(true);
        };
        if p.members != print {
            return Err(BarrierError::MembersChanged);
        }
        if self.advance(t, members, &mut p)? {
            self.pending = None;
            return Ok(true);
        }
        self.pending = Some(p);
        if p.deadline.passed(clock) {
            // A live rank we wait for may itself wait for a dead one: name the dead one if
            // anyone knows.
            if let Some(f) = t
                .failure()
                .filter(|f| members.binary_search(&f.rank).is_ok())
            {
                return Err(self.fail(BarrierError::PeerFailed(f)));
            }
            if !p.probed {
                return self.probe(t, members, clock).map(|()| false);
            }
            return Err(self.fail(self.timeout_error(t, members)));
        }
        if let Err(e) = t.progress() {
            // A rank outside the group failing (or its channel breaking) is no reason for
            // this group's barrier to fail: the members can still meet.
            if !about_a_stranger(&e, members) {
                return Err(self.fail(e));
            }
        }
        let done = self.advance(t, members, &mut p)?;
        self.pending = if done { None } else { Some(p) };
        Ok(done)
    }

    /// The deadline passed with ranks missing and no failure known: write each missing rank
    /// the count it already has from us (harmless to a live rank; a dead one's queue pair
    /// fails the write once its retries run out, and that failure becomes news), then wait
    /// the transport's grace for that news before blaming the missing ranks.
    fn probe<T: BarrierTransport, C: Clock>(
        &mut self,
        t: &mut T,
        m: &[u32],
        clock: &C,
    ) -> Result<(), BarrierError> {
        let Some(mut p) = self.pending else {
            return Ok(());
        };
        if let Some((_, wait)) = stage(p.alg, m.len(), p.i, p.stage) {
            for k in wait.iter() {
                let r = m[k];
                if arrival(t.arrived(r), self.expected[r as usize]) != Arrival::In {
                    if let Err(e) = t.notify(r, self.sent[r as usize]) {
                        return Err(self.fail(e));
                    }
                }
            }
        }
        p.probed = true;
        p.deadline = Deadline::after(clock, t.probe_grace());
        self.pending = Some(p);
        Ok(())
    }

    fn fail(&mut self, e: BarrierError) -> BarrierError {
        self.poisoned = true;
        self.pending = None;
        e
    }

    /// Runs `p`'s stages while their awaited ranks have arrived; true when the last one is
    /// done. Leaves storing `p` to the caller (an error has poisoned the state).
    #[inline]
    fn advance<T: BarrierTransport>(
        &mut self,
        t: &mut T,
        m: &[u32],
        p: &mut Pending,
    ) -> Result<bool, BarrierError> {
        let r = if p.world {
            let Self {
                sent,
                expected,
                plans,
                ..
            } = self;
            advance_plan(&plans[p.alg.index()], sent, expected, t, p)
        } else {
            self.advance_table(t, m, p)
        };
        r.map_err(|e| self.fail(e))
    }

    /// [`BarrierState::advance`] for a member list other than the whole world: the stages
    /// from the table, over positions in `m`.
    fn advance_table<T: BarrierTransport>(
        &mut self,
        t: &mut T,
        m: &[u32],
        p: &mut Pending,
    ) -> Result<bool, BarrierError> {
        let n = m.len();
        while let Some((notify, wait)) = stage(p.alg, n, p.i, p.stage) {
            if !p.entered {
                for k in notify.iter() {
                    let r = m[k];
                    let c = &mut self.sent[r as usize];
                    *c += 1;
                    t.notify(r, *c)?;
                }
                for k in wait.iter() {
                    self.expected[m[k] as usize] += 1;
                }
                p.entered = true;
            }
            for k in wait.iter() {
                if !arrived(t, m[k], &self.expected)? {
                    return Ok(false);
                }
            }
            p.stage += 1;
            p.entered = false;
        }
        Ok(true)
    }

    /// The timeout error of the stage in progress: which of its ranks never arrived.
    fn timeout_error<T: BarrierTransport>(&self, t: &T, m: &[u32]) -> BarrierError {
        let mut missing = heapless::Vec::new();
        let mut missing_count = 0;
        if let Some(p) = self.pending {
            if let Some((_, wait)) = stage(p.alg, m.len(), p.i, p.stage) {
                for k in wait.iter() {
                    let r = m[k];
                    if arrival(t.arrived(r), self.expected[r as usize]) != Arrival::In {
                        missing_count += 1;
                        let _ = missing.push(r);
                    }
                }
            }
        }
        BarrierError::Timeout {
            missing,
            missing_count,
        }
    }
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

    /// A transport whose flag array the test writes: what peers "wrote" is whatever the
    /// test puts in `slots`.
    struct Slots {
        slots: [u64; 3],
        notified: usize,
    }

    impl BarrierTransport for Slots {
        fn notify(&mut self, _: u32, _: u64) -> Result<(), BarrierError> {
            self.notified += 1;
            Ok(())
        }
        fn arrived(&self, rank: u32) -> u64 {
            self.slots[rank as usize]
        }
        fn progress(&mut self) -> Result<(), BarrierError> {
            Ok(())
        }
    }

    fn clock() -> crate::poll::StaticClock {
        static CLOCK: crate::poll::StepClock =
            crate::poll::StepClock::new(Duration::from_micros(1));
        &CLOCK
    }

    #[test]
    fn a_whole_world_plan_says_what_the_stage_table_says() {
        // Every world up to 70 natively; Miri interprets, so up to 9 there.
        let most = if cfg!(miri) { 9 } else { 70 };
        for world in 1..=most {
            for me in 0..world {
                for alg in BarrierAlgorithm::ALL {
                    let plan = Plan::new(alg, me, world);
                    let mut k = 0;
                    // A world of one has no stages (the table would give it a few empty ones).
                    let table =
                        |k| stage(alg, world as usize, me as usize, k).filter(|_| world > 1);
                    while let Some((notify, wait)) = table(k) {
                        let step = plan.steps[k as usize];
                        let ranks = |set: Set| set.iter().map(|r| r as u32).collect::<Vec<_>>();
                        assert_eq!(
                            plan.ranks(step.notify),
                            ranks(notify),
                            "{alg:?} {me}/{world}"
                        );
                        assert_eq!(plan.ranks(step.wait), ranks(wait), "{alg:?} {me}/{world}");
                        k += 1;
                    }
                    assert_eq!(plan.steps.len(), k as usize, "{alg:?} {me}/{world}");
                }
            }
        }
    }

    #[test]
    fn a_barrier_whose_ranks_are_all_there_reads_no_clock() {
        use core::sync::atomic::{AtomicU32, Ordering};
        struct Counting(AtomicU32);
        impl Clock for Counting {
            fn now(&self) -> crate::poll::Instant {
                self.0.fetch_add(1, Ordering::Relaxed);
                crate::poll::Instant::from_nanos(0)
            }
        }
        let clock = Counting(AtomicU32::new(0));
        let long = Duration::from_secs(3600);
        for alg in BarrierAlgorithm::ALL {
            let mut s = BarrierState::new(0, 3);
            let mut t = Slots {
                slots: [0, 1, 1],
                notified: 0,
            };
            s.run_world(
                &mut t,
                &[0, 1, 2],
                alg,
                &clock,
                long,
                &mut crate::poll::Spin,
            )
            .unwrap_or_else(|e| panic!("{alg:?}: {e}"));
            assert_eq!(clock.0.load(Ordering::Relaxed), 0, "{alg:?}");
            // A missing rank starts the deadline: one read, then one per poll.
            t.slots = [0, 1, 2];
            s.start_world(&mut t, &[0, 1, 2], alg, &clock, long)
                .unwrap();
            assert!(s.is_pending(), "{alg:?}");
            assert_eq!(clock.0.load(Ordering::Relaxed), 1, "{alg:?}");
            t.slots = [0, 2, 2];
            assert_eq!(
                s.poll_world(&mut t, &[0, 1, 2], &clock),
                Ok(true),
                "{alg:?}"
            );
            clock.0.store(0, Ordering::Relaxed);
        }
        // The specialised whole-world dissemination start alike: none while all are there,
        // one when a rank is missing (the deadline starts).
        let mut s = BarrierState::new(0, 3);
        let mut t = Slots {
            slots: [0, 1, 1],
            notified: 0,
        };
        assert_eq!(s.start_dissemination_world(&mut t, &clock, long), Ok(true));
        assert_eq!(clock.0.load(Ordering::Relaxed), 0);
        assert_eq!(s.start_dissemination_world(&mut t, &clock, long), Ok(false));
        assert_eq!(clock.0.load(Ordering::Relaxed), 1);
        assert!(s.is_pending());
    }

    /// A world of flag arrays in one process: rank `me`'s transport writes its counts into
    /// the other ranks' arrays (an RDMA write overwrites the slot) and reads its own.
    struct Shared<'a> {
        me: u32,
        flags: &'a [Vec<core::cell::Cell<u64>>],
    }

    impl BarrierTransport for Shared<'_> {
        fn notify(&mut self, rank: u32, count: u64) -> Result<(), BarrierError> {
            self.flags[rank as usize][self.me as usize].set(count);
            Ok(())
        }
        fn arrived(&self, rank: u32) -> u64 {
            self.flags[self.me as usize][rank as usize].get()
        }
        fn progress(&mut self) -> Result<(), BarrierError> {
            Ok(())
        }
    }

    #[test]
    fn the_specialised_dissemination_start_meets_the_general_one_barrier_after_barrier() {
        // Every world up to 12 natively (Miri: up to 5); ranks start in a rotating order,
        // barrier after barrier, each rank alternating the specialised start and the general
        // one (in opposite phase to its neighbour), so counts from either reach the other.
        let most = if cfg!(miri) { 5 } else { 12 };
        let long = Duration::from_secs(3600);
        let alg = BarrierAlgorithm::Dissemination;
        for world in 1..=most {
            let flags: Vec<Vec<core::cell::Cell<u64>>> = (0..world)
                .map(|_| (0..world).map(|_| core::cell::Cell::new(0)).collect())
                .collect();
            let all: Vec<u32> = (0..world).collect();
            let mut states: Vec<BarrierState> =
                (0..world).map(|r| BarrierState::new(r, world)).collect();
            for b in 0..6u32 {
                let mut waiting = Vec::new();
                for k in 0..world {
                    let r = (k + b) % world;
                    let mut t = Shared {
                        me: r,
                        flags: &flags,
                    };
                    let s = &mut states[r as usize];
                    let done = if (r + b) % 2 == 0 {
                        s.start_dissemination_world(&mut t, &clock(), long)
                    } else {
                        s.start_world(&mut t, &all, alg, &clock(), long)
                            .map(|()| !s.is_pending())
                    }
                    .unwrap_or_else(|e| panic!("{r}/{world} barrier {b}: {e}"));
                    assert_eq!(done, !s.is_pending(), "{r}/{world} barrier {b}");
                    if !done {
                        waiting.push(r);
                    }
                }
                // The last rank to start never waits for anyone who has not started.
                let mut turns = 0;
                while !waiting.is_empty() {
                    turns += 1;
                    assert!(turns < 100, "{world}: barrier {b} never completes");
                    waiting.retain(|&r| {
                        let mut t = Shared {
                            me: r,
                            flags: &flags,
                        };
                        !states[r as usize]
                            .poll_world(&mut t, &all, &clock())
                            .unwrap_or_else(|e| panic!("{r}/{world} barrier {b}: {e}"))
                    });
                }
                // Every rank counted the same barriers: one notification per round each.
                let rounds = states[0].rounds.len() as u64;
                for s in &states {
                    assert_eq!(s.sent.iter().sum::<u64>(), rounds * u64::from(b + 1));
                    assert_eq!(s.expected.iter().sum::<u64>(), rounds * u64::from(b + 1));
                }
            }
        }
    }

    #[test]
    fn the_specialised_dissemination_start_keeps_every_refusal() {
        let long = Duration::from_secs(3600);
        let flags: Vec<Vec<core::cell::Cell<u64>>> = (0..4)
            .map(|_| (0..4).map(|_| core::cell::Cell::new(0)).collect())
            .collect();
        let mut t = Shared {
            me: 0,
            flags: &flags,
        };
        let mut s = BarrierState::new(0, 4);
        // Nobody else is there: pending in round 0, deadline running, a second start refused.
        assert_eq!(
            s.start_dissemination_world(&mut t, &clock(), long),
            Ok(false)
        );
        assert!(s.is_pending());
        assert_eq!(
            s.start_dissemination_world(&mut t, &clock(), long),
            Err(BarrierError::AlreadyStarted)
        );
        assert!(!s.is_poisoned(), "a refused start changes nothing");
        // Rank 0 waits for rank 3 in round 0 (count 1): a forged count fails the barrier.
        flags[0][3].set(u64::MAX);
        let mut s = BarrierState::new(0, 4);
        assert_eq!(
            s.start_dissemination_world(&mut t, &clock(), long),
            Err(BarrierError::ImplausibleArrival {
                rank: 3,
                count: u64::MAX,
                most: 2
            })
        );
        assert!(s.is_poisoned());
        assert_eq!(
            s.start_dissemination_world(&mut t, &clock(), long),
            Err(BarrierError::Poisoned)
        );
        // A transport that cannot notify fails the barrier and poisons the state.
        struct Refusing;
        impl BarrierTransport for Refusing {
            fn notify(&mut self, rank: u32, _: u64) -> Result<(), BarrierError> {
                Err(BarrierError::RankOutOfRange(rank))
            }
            fn arrived(&self, _: u32) -> u64 {
                0
            }
            fn progress(&mut self) -> Result<(), BarrierError> {
                Ok(())
            }
        }
        let mut s = BarrierState::new(0, 4);
        assert_eq!(
            s.start_dissemination_world(&mut Refusing, &clock(), long),
            Err(BarrierError::RankOutOfRange(1))
        );
        assert!(s.is_poisoned());
    }

    #[test]
    fn an_arrival_is_the_expected_count_or_one_more() {
        assert_eq!(arrival(0, 1), Arrival::Waiting);
        assert_eq!(arrival(1, 1), Arrival::In);
        assert_eq!(arrival(2, 1), Arrival::In);
        assert_eq!(arrival(3, 1), Arrival::Implausible);
        assert_eq!(arrival(u64::MAX, 1), Arrival::Implausible);
        assert_eq!(arrival(u64::MAX, u64::MAX), Arrival::In);
        assert_eq!(arrival(u64::MAX - 1, u64::MAX), Arrival::Waiting);
        assert_eq!(arrival(u64::MAX - 1, 3), Arrival::Implausible);
    }

    #[test]
    fn a_forged_arrival_count_fails_the_barrier_instead_of_completing_it() {
        let long = Duration::from_secs(3600);
        for alg in BarrierAlgorithm::ALL {
            // Rank 0 of 3 waits for both others directly in every algorithm; rank 2 arrived.
            let mut s = BarrierState::new(0, 3);
            let mut t = Slots {
                slots: [0, u64::MAX, 1],
                notified: 0,
            };
            let e = s.run(
                &mut t,
                &[0, 1, 2],
                alg,
                &clock(),
                long,
                &mut crate::poll::Spin,
            );
            assert_eq!(
                e,
                Err(BarrierError::ImplausibleArrival {
                    rank: 1,
                    count: u64::MAX,
                    most: 2
                }),
                "{alg:?}"
            );
            let shown = alloc::string::ToString::to_string(&e.unwrap_err());
            assert!(shown.contains("rank 1's slot"), "{shown}");
            assert!(s.is_poisoned(), "{alg:?}");
            // Honest counts, one barrier ahead at most: barrier after barrier completes.
            let mut s = BarrierState::new(0, 3);
            for b in 1..=5u64 {
                t.slots = [0, b + 1, b];
                s.run(
                    &mut t,
                    &[0, 1, 2],
                    alg,
                    &clock(),
                    long,
                    &mut crate::poll::Spin,
                )
                .unwrap_or_else(|e| panic!("{alg:?} barrier {b}: {e}"));
            }
            // Two ahead is not possible for an honest rank.
            t.slots = [0, 8, 6];
            assert!(matches!(
                s.start(&mut t, &[0, 1, 2], alg, &clock(), long),
                Err(BarrierError::ImplausibleArrival {
                    rank: 1,
                    count: 8,
                    most: 7
                })
            ));
        }
    }
}
