//! Messaging for a busy-polling thread: a receive ring per peer or one shared receive pool
//! ([`Receive`]), re-posted automatically, credit-based flow control, and
//! [`Node::progress`], which hands completions to a handler with bounded work per call.
//!
//! [`Node::start_messaging_in`] cuts one region into a ring of `slots` receive buffers of
//! `slot_size` bytes per peer and posts them all. Every rank must start messaging with the
//! same `slots`: it is the number of messages a sender may have in flight to one receiver.
//! On a node built with [`Receive::Shared`] the region is one pool of `slots` buffers posted
//! to the shared receive queue instead; a completion names the queue pair it arrived on,
//! which names the sender, and each sender holds `slots / (world - 1)` credits.
//!
//! # Flow control
//! Credits: see [`credits`](super::credits).
//!
//! # Cost and fairness
//! `progress` polls once (one poll of each completion queue the channels share, see
//! [`crate::provider::shared`]). A successful receive at the head of its peer's ring is
//! claimed from that poll and delivered at once from its slot (its number checked against
//! the ring's, on the very channel the ring was posted on; see `Heads::claim`); everything
//! else (a failure or flush, a receive a caller posted on the channel, a swapped channel,
//! a send completion) goes to the channel, and `progress` then serves only the peers whose
//! channels got completions, in the order they got them; a peer a budget cut short goes to the back of that list, so
//! a budget smaller than the traffic does not starve anyone. An idle `progress` costs the
//! same for 2 peers and for 2000. Every 8th call it also looks at one more peer, round-robin,
//! which delivers what a direct call on a channel polled on the node's behalf (within 8
//! calls per peer).
//!
//! # Memory
//! The ring memory lives in the node, and the node drains every channel before it frees it.
//! A pool cannot be drained (moving queue pairs to the error state flushes no receive of a
//! shared queue): its memory is freed only once the shared queue is destroyed, after the
//! node's queue pairs, and leaked if anything keeps the queue alive.
//! A handler that panics leaves its slot out of the ring; the next `progress` re-posts it.
//! Every rank must have started messaging before anyone sends to it (run a barrier after
//! `start_messaging`): a message that finds no ring would wait for one as "receiver not
//! ready". Once messaging has started, the node owns the receive queues: do not post
//! receives on its channels yourself (a peer's message would land in the oldest posted receive). A write
//! with immediate from a peer consumes a ring slot too and arrives as [`Event::Written`]; it
//! spends a credit like a message (the sender counts every request that consumes a peer's
//! receive, whichever call posted it), but only [`Node::post_send_inline`] checks credit
//! first.

use alloc::vec;
use alloc::vec::Vec;
use core::mem::ManuallyDrop;

use super::{Node, NodeError, SetupError};
use crate::channel::{recv_number, ChannelError, Done};
use crate::completion::{Completion, CompletionKind};
use crate::fifo::Fifo;
use crate::memory::{AccessFlags, Region};
use crate::multi::{MultiChannel, MultiError};
use crate::poll::{Backoff, Deadline, Patience};
use crate::provider::Provider;
use crate::sge::Sge;

/// Where a node's messages land: a ring per peer, or one pool all peers share. Chosen when
/// the node is built ([`Components::messaging`](super::Components); on a device the queue
/// pairs are created on a shared receive queue or not); [`Node::start_messaging_in`]
/// follows it.
///
/// | | receive memory | credits per sender |
/// |---|---|---|
/// | `PerPeer` | `(world - 1) * slots * slot_size` | `slots` |
/// | `Shared { slots }` | `slots * slot_size`, whatever the world size | `slots / (world - 1)` (at least 1) |
///
/// The shared pool trades per-sender depth for memory: with a pool of `slots` and `N`
/// ranks, a sender may have only `slots / (N - 1)` messages in flight to one receiver, so a
/// burst to one receiver waits for credits sooner than with per-peer rings of the same
/// total size; in exchange the memory does not grow with `N`. Size the pool to the traffic
/// (at least `N - 1` slots; a few times that keeps credit returns off the critical path).
///
/// With a shared pool the node's queue pairs have no receive queues of their own: receives
/// posted on a channel directly (`Channel::recv`, `MultiChannel::gather_receive`, a
/// `RecvRing`) are refused with [`ChannelError::RecvQueueFull`]; messages arrive only
/// through [`Node::progress`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub enum Receive {
    /// A ring of `slots` receive buffers per peer (the `slots` of `start_messaging`).
    #[default]
    PerPeer,
    /// One shared receive queue of `slots` receives for every peer (`ibv_create_srq`),
    /// re-posted as messages are consumed.
    Shared {
        /// Receives in the pool (on a device, clamped to its `max_srq_wr`).
        slots: u32,
    },
}

/// What [`Node::progress`] delivers.
#[derive(Debug)]
pub enum Event<'a> {
    /// A message arrived from `rank` (a send; its immediate, if any, was the sender's credit
    /// return and is not handed on).
    Message {
        /// The sender.
        rank: u32,
        /// The payload, valid for the duration of the handler call.
        data: &'a [u8],
    },
    /// `rank` wrote `len` bytes into our memory with an immediate (an RDMA write with
    /// immediate): the bytes are where the peer wrote them; no payload came with this event.
    Written {
        /// The writer.
        rank: u32,
        /// The immediate.
        imm: u32,
        /// Bytes written.
        len: u32,
    },
    /// Send-queue requests to `rank` completed: every request below `completed` is done.
    /// Reported as signaled completions arrive (a message is signaled every
    /// [`signal_every`](crate::channel::ChannelConfig::signal_every)-th request), so the
    /// count moves in steps; waiting for a message's ticket ([`Node::wait`]) covers the rest.
    SendsCompleted {
        /// The peer.
        rank: u32,
        /// Requests completed on that channel so far.
        completed: u64,
    },
    /// The channel to `rank` failed; it is broken from now on.
    Failed {
        /// The peer.
        rank: u32,
        /// Why.
        error: ChannelError,
    },
}

/// One peer's messaging state (one struct per peer: one bounds check per peer served, not
/// one per field), indexed by the channel's position in the node's list.
#[derive(Clone, Copy, Debug, Default)]
pub(super) struct Peer {
    /// The rank of the channel (fixed at start).
    pub(super) rank: u32,
    /// The channel the peer's ring was posted on. `Node::channel` hands out `&mut Channel`,
    /// so a caller can swap a channel out; a ring whose channel changed is never read again,
    /// and its memory is leaked rather than freed while the displaced channel may still
    /// receive into it.
    pub(super) chan_id: usize,
    /// The ring's head: the slot whose receive completes next (a ring per peer).
    pub(super) head: usize,
    /// The channel's count of requests that consume the peer's receives when messaging
    /// started: what the peer's credit returns (which count from then) are measured from.
    pub(super) base: u64,
    /// Messages (and writes with immediate) of the peer consumed.
    pub(super) consumed: u64,
    /// The consumed count last told the peer (written back or piggybacked on a message).
    pub(super) reported: u64,
    /// What the peer last told us it consumed of our messages through a message's
    /// immediate (the flag array holds what it wrote; the sender trusts the larger).
    pub(super) returned: u64,
    /// Sends to the peer refused for want of credit ([`NodeError::WouldBlock`]).
    pub(super) refused: u64,
    /// Sends completed last reported ([`Event::SendsCompleted`]).
    pub(super) sends_seen: u64,
    /// The channel's failure was reported (once).
    pub(super) failure_reported: bool,
}

/// Messaging state: the ring memory and per-peer state, indexed by the channel's position
/// in the node's list.
pub(super) struct Rings<M> {
    /// Dropped by hand: a pool's memory is freed only once its shared queue is gone.
    pub(super) region: ManuallyDrop<M>,
    pub(super) slots: usize,
    /// Messages a sender may have in flight to one receiver: `slots` with a ring per peer,
    /// the peer's share of the pool with a shared one.
    pub(super) credits: usize,
    /// The shared pool, if messages land in one.
    pub(super) pool: Option<super::pool::Pool>,
    pub(super) slot_size: usize,
    /// Per-peer state and the rings' slots: what a poll's claim reads and moves (one
    /// place, so the claim captures one pointer).
    pub(super) heads: Heads,
    /// A slot handed to a handler and not yet re-posted (the handler may have panicked).
    pub(super) repost: Option<(usize, usize)>,
    /// Credit returns that needed a write of their own (no message went back in time).
    pub(super) credit_writes: u64,
    /// Peers to serve, oldest first: those whose channels had completions, and those a
    /// budget cut short. `queued[p]` says whether `p` is in it.
    pub(super) todo: Todo,
    /// The ring memory's address and local key, from its entry taken once at start (the
    /// [`Region`] contract keeps an entry valid while the region lives): each slot's
    /// receive entry is cut from it, with no bounds check per message (`recv_seqs` has one
    /// number per slot of the ring, so an index it accepts is a slot inside the ring).
    ring_entry: (u64, u32),
    /// The first of the ring heads a poll claimed (`Heads::claimed`) not yet delivered:
    /// `claimed[claimed_at..claimed_len]` wait (a handler panicked, or the budget ran out).
    claimed_at: usize,
    /// `claimed[..retired_to]` were retired on their channels (right after the poll that
    /// claimed them): never again, since by the next call the caller may have swapped
    /// another channel into their position, whose receives those numbers do not name.
    retired_to: usize,
    /// The peer the next sweep looks at, whether or not it had completions: one peer every
    /// [`SWEEP_EVERY`]-th `progress` call, round-robin, so completions a direct channel call
    /// took (which no poll of the shared queues reports again) are delivered too.
    pub(super) sweep: usize,
    /// `progress` calls until the next sweep (from [`SWEEP_EVERY`] down to 0).
    pub(super) sweep_in: u32,
}

impl<M: Region> Rings<M> {
    /// Messaging state over `region` for every channel of `multi`: the per-peer bookkeeping
    /// both receive layouts share; `recv_seqs` is the per-peer rings' own (empty for a
    /// pool). Allocates (setup).
    pub(super) fn new<P: Provider, B: Backoff + Clone>(
        multi: &mut MultiChannel<P, B>,
        region: M,
        (slots, slot_size, credits): (usize, usize, usize),
        pool: Option<super::pool::Pool>,
        recv_seqs: Vec<u64>,
    ) -> Self {
        let peers = multi.peers();
        let mut region = region;
        // The first slot's entry: its address is the region's start and its key the
        // region's, good for every byte of the registration. An entry for the whole region
        // would not exist past 4 GiB (an entry's length is 32 bits), and a ring may be
        // larger. A slot's entry exists (`start_messaging_in` checked local write, the
        // length, and `slot_size` fitting 32 bits).
        let ring_entry = region
            .sge_mut(0..slot_size)
            .map_or((0, 0), |e| (e.addr(), e.lkey()));
        let mut states: Vec<Peer> = multi
            .ranks()
            .zip(multi.ids())
            .map(|(rank, chan_id)| Peer {
                rank,
                chan_id,
                ..Peer::default()
            })
            .collect();
        for (st, c) in states.iter_mut().zip(multi.channels()) {
            st.base = c.remote_recvs_used();
        }
        Self {
            ring_entry,
            claimed_at: 0,
            retired_to: 0,
            region: ManuallyDrop::new(region),
            slots,
            credits,
            pool,
            slot_size,
            heads: Heads {
                peers: states,
                recv_seqs,
                slots,
                claimed: [Claimed::default(); CLAIM],
                claimed_len: 0,
            },
            repost: None,
            credit_writes: 0,
            todo: Todo {
                list: Fifo::new(peers, 0),
                queued: vec![false; peers],
            },
            sweep: 0,
            sweep_in: SWEEP_EVERY,
        }
    }
}

impl<M> Drop for Rings<M> {
    fn drop(&mut self) {
        if self.pool.as_ref().is_some_and(|p| !p.probe.is_gone()) {
            // Receives of the shared queue may still name the memory (they outlive every
            // flush): it is leaked rather than freed under the device.
            return;
        }
        // SAFETY: dropped once, here; per-peer rings are drained by the node before (or
        // leaked with the whole `Rings`), and a pool's queue is gone.
        unsafe { ManuallyDrop::drop(&mut self.region) };
    }
}

impl<M> Rings<M> {
    pub(super) fn push_todo(&mut self, p: usize) {
        self.todo.push(p);
    }

    fn pop_todo(&mut self) -> Option<usize> {
        let p = self.todo.list.pop()?;
        if let Some(q) = self.todo.queued.get_mut(p) {
            *q = false;
        }
        Some(p)
    }
}

impl<M> Rings<M> {
    /// Whether every channel is still the one its ring was posted on.
    pub(super) fn channels_unchanged(&self, ids: impl Iterator<Item = usize>) -> bool {
        ids.eq(self.heads.peers.iter().map(|st| st.chan_id))
    }
}

impl<P: Provider, M: Region, B: Backoff + Clone> Node<P, M, B> {
    /// Starts messaging in `region` on a node built with messaging
    /// ([`Components::messaging`](super::Components); else [`SetupError::NotBuiltWith`]): a
    /// ring of `slots` receive buffers of `slot_size` bytes
    /// for every peer (the region must hold `(world - 1) * slots * slot_size` bytes, with
    /// local write access and no remote write or atomic access), all posted. Every rank must
    /// use the same `slots` (the credits it grants each sender). Allocates (setup);
    /// messaging itself does not.
    ///
    /// On a node whose queue pairs share a receive queue ([`Receive::Shared`]) the region
    /// is one pool of `slots` buffers for every peer instead (`slots * slot_size` bytes;
    /// `slots` at least `world - 1` and at most the queue's depth), and each sender gets
    /// `slots / (world - 1)` credits. The pool's memory is freed only once the shared queue
    /// is destroyed (after the last queue pair on it), else leaked.
    ///
    /// Checks everything before it posts: `slots` must fit every channel's receive queue
    /// (and slot table), and every channel must be healthy; otherwise it returns an error and
    /// changes nothing. If the device still refuses a post half way, the channels that got
    /// receives are flushed and drained (they are broken afterwards) before the ring memory
    /// is freed.
    pub fn start_messaging_in(
        &mut self,
        region: M,
        slots: usize,
        slot_size: usize,
    ) -> Result<(), SetupError> {
        if self.rings.is_some() {
            return Err(SetupError::MessagingStarted);
        }
        let bad = |what| Err(SetupError::InvalidArgument { what });
        if self.components.messaging.is_none() {
            // Not a clash found late: the node was built for one-sided traffic (and so may
            // have wake-up receives posted, which have no buffer for a message).
            return Err(SetupError::NotBuiltWith(super::Component::Messaging));
        }
        if slots == 0 || slot_size == 0 || slot_size > u32::MAX as usize {
            return bad("messaging needs at least one slot of 1 byte to 4 GiB");
        }
        let access = region.access();
        if !access.contains(AccessFlags::LOCAL_WRITE)
            || access.intersects(AccessFlags::REMOTE_WRITE | AccessFlags::REMOTE_ATOMIC)
        {
            return bad("ring memory needs local write access and no remote write access");
        }
        let peers = self.multi.peers();
        if self.shared_receive_slots() > 0 {
            return self.start_pool(region, slots, slot_size);
        }
        let len = peers
            .checked_mul(slots)
            .and_then(|n| n.checked_mul(slot_size));
        if len.is_none_or(|l| l > region.len()) {
            return bad("the ring region is smaller than (world - 1) * slots * slot_size");
        }
        for (rank, c) in self.multi.ranked() {
            if let Some(error) = c.fault() {
                return Err(SetupError::Channel { rank, error });
            }
            if c.outstanding_recvs() + slots as u64 > c.recv_capacity() {
                return bad("more ring slots than a channel's free receive queue entries");
            }
        }
        let mut rings = Rings::new(
            &mut self.multi,
            region,
            (slots, slot_size, slots),
            None,
            vec![NO_RECV; peers * slots],
        );
        for p in 0..peers {
            for i in 0..slots {
                if let Err(e) = post_slot(&mut self.multi, &mut rings, p, i) {
                    // Receives of peers 0..=p point into the ring: take them back from the
                    // device before the memory goes.
                    for c in self.multi.channels().take(p + 1) {
                        c.settle(true);
                    }
                    return Err(SetupError::posting(e));
                }
            }
        }
        self.rings = Some(rings);
        Ok(())
    }

    /// Receives the shared receive queue of this node's queue pairs holds (0: each has its
    /// own, and messaging uses a ring per peer).
    pub fn shared_receive_slots(&mut self) -> u32 {
        self.multi
            .channels()
            .next()
            .map_or(0, |c| c.provider().srq_capacity())
    }

    /// Bytes of receive memory messaging uses (0 before it started): `(world - 1) * slots *
    /// slot_size` with a ring per peer, `slots * slot_size` with a shared pool.
    pub fn receive_memory(&self) -> usize {
        self.rings.as_ref().map_or(0, |r| {
            let slots = if r.pool.is_some() {
                r.slots
            } else {
                r.slots * r.heads.peers.len()
            };
            slots * r.slot_size
        })
    }

    /// Polls the peers, starting where the last call stopped, and hands up to `budget`
    /// events to `handler`; returns how many it handed. Received buffers are re-posted right
    /// after their handler call (or, if the handler panicked, at the start of the next
    /// call), and consumed messages are credited back to their senders. Does not allocate.
    pub fn progress(
        &mut self,
        budget: usize,
        mut handler: impl FnMut(Event<'_>),
    ) -> Result<usize, NodeError> {
        let Some(rings) = self.rings.as_mut() else {
            return Err(NodeError::MessagingNotStarted);
        };
        let r = match poll_rings(&mut self.multi, rings, budget, &mut handler) {
            // The idle path ends here, having read nothing the serving needs.
            Ok(handed) if rings.todo.list.is_empty() => return Ok(handed),
            Ok(handed) => self.serve_todo(budget, handed, &mut handler),
            Err(e) => Err(e),
        };
        match r {
            Ok(n) => Ok(n),
            Err(e) => Err(self.progress_failed(e)),
        }
    }

    /// Serves the peers on the list (see [`serve_todo`]): out of line, so an idle
    /// `progress` skips it whole, and reads the node's rank, world and flag addresses only
    /// when it serves.
    #[inline(never)]
    fn serve_todo(
        &mut self,
        budget: usize,
        handed: usize,
        handler: &mut impl FnMut(Event<'_>),
    ) -> Result<usize, NodeError> {
        let Some(rings) = self.rings.as_mut() else {
            return Ok(handed);
        };
        serve_todo(
            &mut self.multi,
            rings,
            &self.peer_flags,
            (self.rank, self.world),
            budget,
            handed,
            handler,
        )
    }

    /// A failed `progress`'s error, a channel's failure made failure news first: out of
    /// line, so the success path neither tests nor moves the (large) error.
    #[cold]
    #[inline(never)]
    fn progress_failed(&mut self, e: NodeError) -> NodeError {
        match e {
            NodeError::Channel { rank, error } => self.channel_failed(rank, error),
            e => e,
        }
    }

    /// Calls [`Node::progress`] until `done()` is true, backing off between empty rounds, or
    /// fails with a timeout after the node's [timeout](Node::timeout). Does not allocate.
    pub fn progress_wait(
        &mut self,
        handler: impl FnMut(Event<'_>),
        done: impl FnMut() -> bool,
    ) -> Result<(), NodeError> {
        let deadline = Deadline::after(self.clock, self.timeout);
        self.progress_until(deadline, handler, done)
    }

    /// [`Node::progress_wait`], failing with a timeout at `deadline` (on the node's
    /// [clock](Node::clock)). Does not allocate.
    pub fn progress_until(
        &mut self,
        deadline: Deadline,
        mut handler: impl FnMut(Event<'_>),
        mut done: impl FnMut() -> bool,
    ) -> Result<(), NodeError> {
        let clock = self.clock;
        let mut backoff = self.backoff.clone();
        backoff.reset();
        let mut patience = Patience::until(deadline);
        while !done() {
            // Failure news and the deadline first, every turn: a chatty live peer gives
            // `progress` something to deliver on every call, and must not hold the wait.
            if let Some(f) = self.failure() {
                return Err(NodeError::PeerFailed(f));
            }
            if patience.run_out(clock) {
                return Err(NodeError::ProgressTimedOut);
            }
            if self.progress(64, &mut handler)? > 0 {
                backoff.reset();
                continue;
            }
            backoff.snooze_within(&mut || patience.remaining(clock));
        }
        Ok(())
    }
}

/// Peers to serve, oldest first (each at most once: `queued[p]` says whether `p` is in
/// the list): one place, so a poll's report captures one pointer.
pub(super) struct Todo {
    list: Fifo<usize>,
    queued: Vec<bool>,
}

impl Todo {
    /// Puts peer `p` on the list unless it is there.
    #[inline(always)]
    fn push(&mut self, p: usize) {
        if let Some(q) = self.queued.get_mut(p) {
            if !*q {
                *q = true;
                // Each peer at most once, and there is a slot for every peer.
                let _ = self.list.push(p);
            }
        }
    }
}

/// A ring head a poll claimed: peer, slot in its ring, the receive number on its channel,
/// and what the completion said.
#[derive(Clone, Copy, Default)]
struct Claimed {
    p: usize,
    i: usize,
    r: u64,
    info: Done,
}

/// Ring heads one poll claims at most (the rest go to their channels, and `progress`
/// serves them the slower way, in order).
const CLAIM: usize = 32;

/// A ring slot with no receive posted.
const NO_RECV: u64 = u64::MAX;

/// `progress` sweeps one peer (round-robin) every this many calls: so completions a caller
/// took by polling a node's channel directly reach the handler within `SWEEP_EVERY` x peers
/// calls.
const SWEEP_EVERY: u32 = 8;

/// [`Node::progress`] up to the serving: a pool's messages handed out, a slot a panicking
/// handler left re-posted, one poll, the sweep's countdown; the peers to serve are then
/// on `rings.todo`. Returns how many events it handed (a pool's). The idle path (nothing
/// arrived, nothing left over, no sweep due) is inline and reads only what it tests;
/// everything else is out of line.
#[inline(always)]
fn poll_rings<P: Provider, M: Region, B: Backoff + Clone>(
    multi: &mut MultiChannel<P, B>,
    rings: &mut Rings<M>,
    budget: usize,
    handler: &mut impl FnMut(Event<'_>),
) -> Result<usize, NodeError> {
    let mut handed = 0;
    if rings.pool.is_some() {
        handed = super::pool::serve_pool(multi, rings, budget, handler)?;
    }
    if rings.repost.is_some() {
        repost(multi, rings)?;
    }
    if rings.heads.peers.is_empty() {
        return Ok(0);
    }
    // One poll of the shared queues (or of every channel, for providers with queues of
    // their own); a successful receive at the head of its peer's ring is claimed and
    // delivered below; channels that got other completions or failed join the list.
    let (heads, todo) = (&mut rings.heads, &mut rings.todo);
    if let Err(e) = multi.poll_claiming(|at, c| heads.claim(at, c), |(p, _), _| todo.push(p)) {
        return Err(claimed_then_failed(multi, rings, e));
    }
    // Heads claimed now, or left by a call whose handler panicked or whose budget ran out
    // (those first: the list keeps each peer's order).
    if rings.heads.claimed_len != 0 {
        return claimed_after_poll(multi, rings, (handed, budget), handler);
    }
    sweep_turn(multi, rings);
    Ok(handed)
}

/// Per-peer state and the per-peer rings' slots: what a poll's claim ([`Heads::claim`])
/// reads and moves, apart from the list of peers to serve, which the poll's report fills.
pub(super) struct Heads {
    /// Each peer's state, in the order of the channels.
    pub(super) peers: Vec<Peer>,
    /// Per ring slot, the receive number of its receive on its peer's channel
    /// ([`NO_RECV`] while it is not posted): claimed or taken by number, the channel's
    /// identity being checked (`Peer::chan_id`). Empty for a pool.
    pub(super) recv_seqs: Vec<u64>,
    /// Slots per ring (`Rings::slots`).
    slots: usize,
    /// Ring heads a poll claimed, oldest first: retired on their channels right after the
    /// poll and delivered by the same `progress` (up to its budget), the rest (a handler
    /// panicked, or the budget ran out) by the next call, after its poll, before what that
    /// poll claimed (appended: each peer's order is kept). `claimed[Rings::claimed_at..
    /// claimed_len]` wait.
    claimed: [Claimed; CLAIM],
    claimed_len: usize,
}

impl Heads {
    /// Claims `c`, a receive completion the poll found for the channel at position `p`
    /// (identity `id`), if it is the successful completion of the receive at the head of
    /// `p`'s ring on the very channel the ring was posted on: the head moves on and the
    /// slot leaves the ring (its receive done, so the node may read it; re-posted after
    /// delivery). Anything else (a failure or flush, the channel's own receive, a swapped
    /// channel, a receive not at the head) goes to the channel and the slower path, which
    /// keeps the order: a peer's later receives are no longer its head.
    #[inline(always)]
    fn claim(&mut self, (p, id): (usize, usize), c: &Completion) -> bool {
        let n = self.claimed_len;
        if n >= CLAIM {
            return false;
        }
        let Some(r) = recv_number(c) else {
            return false;
        };
        let Some(st) = self.peers.get_mut(p) else {
            return false;
        };
        if st.chan_id != id {
            return false;
        }
        let i = st.head;
        let Some(seq) = self.recv_seqs.get_mut(p * self.slots + i) else {
            return false;
        };
        if *seq != r {
            return false;
        }
        *seq = NO_RECV;
        st.head = if i + 1 == self.slots { 0 } else { i + 1 };
        if let Some(e) = self.claimed.get_mut(n) {
            *e = Claimed {
                p,
                i,
                r,
                info: Done {
                    byte_len: c.byte_len,
                    imm: c.imm,
                    written: c.kind == CompletionKind::RecvWriteImm,
                },
            };
        }
        self.claimed_len = n + 1;
        true
    }
}

/// The sweep's countdown (see [`sweep`]).
#[inline(always)]
fn sweep_turn<P: Provider, M, B: Backoff + Clone>(
    multi: &mut MultiChannel<P, B>,
    rings: &mut Rings<M>,
) {
    // The sweep: rare, because it is for the rare case (a caller that polled a node's
    // channel itself); an idle `progress` is then one poll of each shared queue.
    rings.sweep_in -= 1;
    if rings.sweep_in == 0 {
        sweep(multi, rings);
    }
}

/// [`poll_rings`] after a poll that claimed ring heads: they are retired on their channels
/// before anything else (a failed poll's error included, and before any handler runs),
/// then delivered up to the budget. Out of line, so an idle `progress` pays
/// one test.
#[inline(never)]
fn claimed_after_poll<P: Provider, M: Region, B: Backoff + Clone>(
    multi: &mut MultiChannel<P, B>,
    rings: &mut Rings<M>,
    (handed, budget): (usize, usize),
    handler: &mut impl FnMut(Event<'_>),
) -> Result<usize, NodeError> {
    // One head, claimed now: the common case (one peer's message per call), retired and
    // delivered without the loops, on the channel taken once.
    if let (0, 1, Some(&e)) = (
        rings.retired_to,
        rings.heads.claimed_len,
        rings.heads.claimed.first(),
    ) {
        rings.retired_to = 1;
        let mut handed = handed;
        if let Some(chan) = multi.by_index(e.p) {
            chan.retire_claimed_recv(e.r);
            if handed >= budget {
                // Delivered by a later call (the head waits in the list, retired).
                sweep_turn(multi, rings);
                return Ok(handed);
            }
            rings.claimed_at = 1;
            let half = rings.credits.div_ceil(2) as u64;
            handed += usize::from(deliver_one(chan, rings, e, half, handler)?);
        }
        rings.claimed_at = 0;
        rings.retired_to = 0;
        rings.heads.claimed_len = 0;
        sweep_turn(multi, rings);
        return Ok(handed);
    }
    retire_claimed(multi, rings);
    let handed = handed + deliver_claimed(multi, rings, budget.saturating_sub(handed), handler)?;
    sweep_turn(multi, rings);
    Ok(handed)
}

/// A failed poll (the rare case, out of line): heads it claimed before it failed are
/// retired on their channels first (they are off the shared queue) and wait in the list
/// for the next call; then the error, as the node says it.
#[cold]
#[inline(never)]
fn claimed_then_failed<P: Provider, M, B: Backoff + Clone>(
    multi: &mut MultiChannel<P, B>,
    rings: &mut Rings<M>,
    e: MultiError,
) -> NodeError {
    retire_claimed(multi, rings);
    poll_failed(e)
}

/// Retires the claimed heads on their channels (their completions came off the shared
/// queue, so the channels' receive counts must move), before any handler runs.
#[inline(never)]
fn retire_claimed<P: Provider, M, B: Backoff + Clone>(
    multi: &mut MultiChannel<P, B>,
    rings: &mut Rings<M>,
) {
    // Heads an earlier call left were retired then, on the channel that was there; the
    // one there now may be another (swapped in since), so they are not retired again.
    for e in rings
        .heads
        .claimed
        .iter()
        .take(rings.heads.claimed_len)
        .skip(rings.retired_to)
    {
        if let Some(c) = multi.by_index(e.p) {
            c.retire_claimed_recv(e.r);
        }
    }
    rings.retired_to = rings.heads.claimed_len;
}

/// Delivers the claimed heads (at most `budget`), in order: the credit its immediate
/// returns, the handler, the slot re-posted. A head whose channel broke or was swapped
/// since is not read (the slower path reports the failure). The slot leaves the list
/// before the handler runs, so a panicking handler neither sees it twice nor loses it
/// (`repost`), and the heads after it wait for the next call.
#[inline(always)]
fn deliver_claimed<P: Provider, M: Region, B: Backoff + Clone>(
    multi: &mut MultiChannel<P, B>,
    rings: &mut Rings<M>,
    budget: usize,
    handler: &mut impl FnMut(Event<'_>),
) -> Result<usize, NodeError> {
    let mut handed = 0;
    let half = rings.credits.div_ceil(2) as u64;
    while rings.claimed_at < rings.heads.claimed_len && handed < budget {
        let Some(&e) = rings.heads.claimed.get(rings.claimed_at) else {
            break;
        };
        rings.claimed_at += 1;
        let Some(chan) = multi.by_index(e.p) else {
            continue;
        };
        handed += usize::from(deliver_one(chan, rings, e, half, handler)?);
    }
    if rings.claimed_at == rings.heads.claimed_len {
        rings.claimed_at = 0;
        rings.retired_to = 0;
        rings.heads.claimed_len = 0;
    }
    Ok(handed)
}

/// Delivers claimed head `e` on `chan`, its peer's channel at its position (taken off the
/// list already): the credit its immediate returns, the handler, the slot re-posted.
/// Whether it reached the handler: a head whose channel broke or was swapped since is not
/// read (the slower path reports the failure). The slot is kept in `repost` while the
/// handler runs, so a panicking handler neither sees it twice nor loses it.
#[inline(always)]
fn deliver_one<P: Provider, M: Region, B: Backoff>(
    chan: &mut crate::channel::Channel<P, B>,
    rings: &mut Rings<M>,
    e: Claimed,
    half: u64,
    handler: &mut impl FnMut(Event<'_>),
) -> Result<bool, NodeError> {
    let p = e.p;
    let Some(st) = rings.heads.peers.get_mut(p) else {
        return Ok(false);
    };
    if chan.id() != st.chan_id || chan.fault().is_some() || st.failure_reported {
        rings.todo.push(p);
        return Ok(false);
    }
    st.consumed += 1;
    let rank = st.rank;
    if !e.info.written {
        if let Some(imm) = e.info.imm {
            let since_start = chan.remote_recvs_used().saturating_sub(st.base);
            super::credits::credit_in(&mut st.returned, imm, since_start);
        }
    }
    let credit_due = st.consumed - st.reported >= half;
    // The slot leaves the list before the handler runs; on a panic, or a failed re-post,
    // `repost` brings it back.
    rings.repost = Some((p, e.i));
    let k = p * rings.slots + e.i;
    hand_slot(&*rings.region, rings.slot_size, (rank, k), e.info, handler);
    // The channel was found unbroken above and nothing since could break it (the handler
    // cannot reach it): the re-post checks only the channel's receive accounting.
    post_ring_slot::<_, _, _, true>(chan, rings, k)
        .map_err(|error| NodeError::Channel { rank, error })?;
    rings.repost = None;
    if credit_due {
        // A credit return due: the serving writes it.
        rings.todo.push(p);
    }
    Ok(true)
}

/// Re-posts the slot a handler was lent when it panicked (the rare case: out of line).
#[cold]
#[inline(never)]
fn repost<P: Provider, M: Region, B: Backoff + Clone>(
    multi: &mut MultiChannel<P, B>,
    rings: &mut Rings<M>,
) -> Result<(), NodeError> {
    if let Some((p, i)) = rings.repost.take() {
        // A channel broken since takes no receive again (its failure is the peer's news, its
        // ring is done): the slot stays out, rather than fail every call for every peer.
        if multi
            .by_index(p)
            .is_some_and(|c| c.id() == rings.heads.peers[p].chan_id && c.fault().is_none())
        {
            if let Err(e) = post_slot(multi, rings, p, i) {
                // Not lost: the next call tries again.
                rings.repost = Some((p, i));
                return Err(e);
            }
        }
    }
    Ok(())
}

/// A failed poll of the channels, as the node says it.
#[cold]
#[inline(never)]
fn poll_failed(e: MultiError) -> NodeError {
    match e {
        MultiError::Peer(p) => NodeError::Channel {
            rank: p.rank,
            error: p.error,
        },
        MultiError::Completions(e) => NodeError::Completions(e),
        MultiError::UnknownRank(rank) => NodeError::UnknownRank(rank),
    }
}

/// The sweep's turn (every [`SWEEP_EVERY`]-th call): the next peer round-robin joins the
/// list to serve if serving it would do anything ([`has_work`]); an idle one costs the
/// tests, not a serving. Out of line.
#[inline(never)]
fn sweep<P: Provider, M, B: Backoff + Clone>(multi: &mut MultiChannel<P, B>, rings: &mut Rings<M>) {
    rings.sweep_in = SWEEP_EVERY;
    let p = rings.sweep;
    rings.sweep = if p + 1 < rings.heads.peers.len() {
        p + 1
    } else {
        0
    };
    if has_work(multi, rings, p) {
        rings.push_todo(p);
    }
}

/// Whether serving peer `p` (`serve_peer`, then `credit_back`) would do anything: an event
/// to hand out (`has_events`), a receive of its ring complete at the head (delivered, or
/// its failure found), or a credit return due (one a full send queue deferred).
fn has_work<P: Provider, M, B: Backoff + Clone>(
    multi: &MultiChannel<P, B>,
    rings: &Rings<M>,
    p: usize,
) -> bool {
    let Some(c) = multi.at(p) else {
        return false;
    };
    let Some(st) = rings.heads.peers.get(p) else {
        return false;
    };
    let credit_due = st.consumed - st.reported >= rings.credits.div_ceil(2) as u64;
    let same = c.id() == st.chan_id;
    let head = rings
        .heads
        .recv_seqs
        .get(p * rings.slots + st.head)
        .copied()
        .filter(|&r| r != NO_RECV);
    credit_due
        || c.sends_completed() > st.sends_seen
        || ((c.fault().is_some() || !same) && !st.failure_reported)
        || (same && head.is_some_and(|r| c.recv_complete(r)))
}

/// Serves the peers on the list (those whose channels had completions or failed, those a
/// budget cut short, the sweep's), after `handed` events a pool's messages made.
#[inline(always)]
fn serve_todo<P: Provider, M: Region, B: Backoff + Clone>(
    multi: &mut MultiChannel<P, B>,
    rings: &mut Rings<M>,
    peer_flags: &[crate::sge::RemoteMemory],
    (me, world): (u32, u32),
    budget: usize,
    mut handed: usize,
    handler: &mut impl FnMut(Event<'_>),
) -> Result<usize, NodeError> {
    // Each peer in the list at most once per call; one cut short goes to the back. With a
    // pool, messages were handed out above, and the peers they came from are here for
    // their credit returns, which must not wait for budget: a sender without credits
    // sends nothing, and the pool would run dry.
    let pooled = rings.pool.is_some();
    for _ in 0..rings.todo.list.len() {
        if handed >= budget && !pooled {
            break;
        }
        let Some(p) = rings.pop_todo() else {
            break;
        };
        let left = budget.saturating_sub(handed);
        let n = if left > 0 {
            serve_peer(multi, rings, p, left, handler)?
        } else {
            0
        };
        handed += n;
        super::credits::credit_back(multi, rings, peer_flags, (me, world), p);
        if (left > 0 && n >= left) || (left == 0 && has_events(multi, rings, p)) {
            rings.push_todo(p);
        }
    }
    Ok(handed)
}

/// Whether peer `p` has an event `serve_peer` would hand out (sends completed, a failure).
fn has_events<P: Provider, M, B: Backoff + Clone>(
    multi: &mut MultiChannel<P, B>,
    rings: &Rings<M>,
    p: usize,
) -> bool {
    multi.by_index(p).is_some_and(|c| {
        c.sends_completed() > rings.heads.peers[p].sends_seen
            || ((c.fault().is_some() || c.id() != rings.heads.peers[p].chan_id)
                && !rings.heads.peers[p].failure_reported)
    })
}

/// Hands out peer `p`'s events (whatever its channel has already polled), at most `budget`.
fn serve_peer<P: Provider, M: Region, B: Backoff + Clone>(
    multi: &mut MultiChannel<P, B>,
    rings: &mut Rings<M>,
    p: usize,
    budget: usize,
    handler: &mut impl FnMut(Event<'_>),
) -> Result<usize, NodeError> {
    let rank = rings.heads.peers[p].rank;
    let mut handed = 0;
    let Some(chan) = multi.by_index(p) else {
        return Ok(0);
    };
    if chan.id() != rings.heads.peers[p].chan_id {
        // The caller swapped this peer's channel out: its ring slots are posted on another
        // channel, so none of them may be read or re-posted again.
        return Ok(report_failure(rings, p, ChannelError::Replaced, handler));
    }
    if let Some(error) = chan.fault() {
        return Ok(report_failure(rings, p, error, handler));
    }
    let done = chan.sends_completed();
    if done > rings.heads.peers[p].sends_seen && handed < budget {
        rings.heads.peers[p].sends_seen = done;
        handler(Event::SendsCompleted {
            rank,
            completed: done,
        });
        handed += 1;
    }
    while handed < budget && rings.pool.is_none() {
        let i = rings.heads.peers[p].head;
        let r = rings.heads.recv_seqs[p * rings.slots + i];
        if r == NO_RECV {
            break;
        }
        let Some(chan) = multi.by_index(p) else {
            break;
        };
        // The channel is the one the ring was posted on (checked above).
        let Some(result) = chan.take_recv(r) else {
            break;
        };
        // The slot leaves the ring before the handler runs, so a panicking handler neither
        // sees it twice nor loses it: `repost` brings it back.
        rings.heads.recv_seqs[p * rings.slots + i] = NO_RECV;
        rings.heads.peers[p].head = if i + 1 == rings.slots { 0 } else { i + 1 };
        let sent = chan.remote_recvs_used();
        match result {
            Ok(info) => {
                rings.heads.peers[p].consumed += 1;
                rings.repost = Some((p, i));
                deliver(rings, (p, sent), p * rings.slots + i, info, handler);
                handed += 1;
                // On failure `repost` keeps the slot for the next call.
                post_slot(multi, rings, p, i)?;
                rings.repost = None;
            }
            Err(error) => {
                if !rings.heads.peers[p].failure_reported {
                    rings.heads.peers[p].failure_reported = true;
                    handler(Event::Failed { rank, error });
                    handed += 1;
                }
                break;
            }
        }
    }
    Ok(handed)
}

/// Reports peer `p`'s broken channel to the handler, once (then it is left alone): how
/// many events that was. Out of line: the rare case.
#[cold]
#[inline(never)]
fn report_failure<M>(
    rings: &mut Rings<M>,
    p: usize,
    error: ChannelError,
    handler: &mut impl FnMut(Event<'_>),
) -> usize {
    if rings.heads.peers[p].failure_reported {
        return 0;
    }
    rings.heads.peers[p].failure_reported = true;
    handler(Event::Failed {
        rank: rings.heads.peers[p].rank,
        error,
    });
    1
}

/// Hands ring slot `k` of `region` (slots of `slot_size` bytes), whose receive completed
/// with `info`, from `rank` to the handler (after the credit return was taken).
#[inline(always)]
fn hand_slot<M: Region>(
    region: &M,
    slot_size: usize,
    (rank, k): (u32, usize),
    info: Done,
    handler: &mut impl FnMut(Event<'_>),
) {
    if info.written {
        handler(Event::Written {
            rank,
            imm: info.imm.unwrap_or(0),
            len: info.byte_len,
        });
        return;
    }
    let at = k * slot_size;
    let len = (info.byte_len as usize).min(slot_size);
    // SAFETY: this slot's receive completed and it is not re-posted until after the handler
    // returns; the region grants no remote write access (checked when messaging started).
    let data = unsafe { region.slice_unchecked(at..at + len) }.unwrap_or(&[]);
    handler(Event::Message { rank, data });
}

/// Hands slot `slot` of the region (whose receive completed with `info`) from peer `p` to
/// the handler, after taking the credit return a message's immediate carries.
///
/// `sent` is what we ever posted to `p` that consumes its receives; less what we had posted
/// when messaging started, it is what its credit return may say at most.
#[inline(always)]
pub(super) fn deliver<M: Region>(
    rings: &mut Rings<M>,
    (p, sent): (usize, u64),
    slot: usize,
    info: Done,
    handler: &mut impl FnMut(Event<'_>),
) {
    let rank = rings.heads.peers[p].rank;
    if info.written {
        handler(Event::Written {
            rank,
            imm: info.imm.unwrap_or(0),
            len: info.byte_len,
        });
        return;
    }
    if let Some(imm) = info.imm {
        let since_start = sent.saturating_sub(rings.heads.peers[p].base);
        super::credits::credit_in(&mut rings.heads.peers[p].returned, imm, since_start);
    }
    let at = slot * rings.slot_size;
    let len = (info.byte_len as usize).min(rings.slot_size);
    // SAFETY: this slot's receive completed and it is not re-posted until after the handler
    // returns; the region grants no remote write access (checked when messaging started).
    let data = unsafe { rings.region.slice_unchecked(at..at + len) }.unwrap_or(&[]);
    handler(Event::Message { rank, data });
}

#[inline(always)]
fn post_slot<P: Provider, M: Region, B: Backoff + Clone>(
    multi: &mut MultiChannel<P, B>,
    rings: &mut Rings<M>,
    p: usize,
    i: usize,
) -> Result<(), NodeError> {
    let rank = rings.heads.peers.get(p).map_or(0, |st| st.rank);
    if i >= rings.slots {
        return Err(slot_outside());
    }
    let Some(chan) = multi.by_index(p) else {
        return Err(NodeError::UnknownRank(rank));
    };
    post_ring_slot::<_, _, _, false>(chan, rings, p * rings.slots + i)
        .map_err(|error| NodeError::Channel { rank, error })
}

/// Posts ring slot `k` (numbered across all the rings, peer by peer) on `chan`, its peer's
/// channel, and keeps its receive number. The entry is cut from the ring's own, with no
/// bounds check but `recv_seqs`' (one number per slot). `CHANNEL_SEEN`: the caller found the
/// channel unbroken and it is the one the ring was posted on (the same shape of receive
/// went in before), so only the receive accounting is checked
/// ([`Channel::repost_recv_numbered`](crate::channel::Channel)). Does not allocate.
#[inline(always)]
fn post_ring_slot<P: Provider, M, B: Backoff, const CHANNEL_SEEN: bool>(
    chan: &mut crate::channel::Channel<P, B>,
    rings: &mut Rings<M>,
    k: usize,
) -> Result<(), ChannelError> {
    let Some(seq) = rings.heads.recv_seqs.get_mut(k) else {
        // Never: the node names only its own slots.
        return Err(ChannelError::RecvQueueFull);
    };
    let at = (k * rings.slot_size) as u64;
    let (addr, lkey) = rings.ring_entry;
    // SAFETY: slot `k` lies inside the ring (`recv_seqs` has one entry per slot of the
    // `(world - 1) * slots * slot_size` bytes checked against the region at start), cut
    // from the region's own entry, whose address and key stay valid while the region
    // lives (the `Region` contract); the ring memory is owned by the node, which drains
    // every channel before it frees it (or leaks it if a channel was swapped out), and this
    // slot is read only after its receive completed, then re-posted.
    let sge = unsafe { Sge::from_raw(addr + at, rings.slot_size as u32, lkey) };
    // SAFETY: as above (the posting contract for the slot).
    *seq = if CHANNEL_SEEN {
        // SAFETY: as above.
        unsafe { chan.repost_recv_numbered(sge) }?
    } else {
        // SAFETY: as above.
        unsafe { chan.post_recv_numbered(sge) }?
    };
    Ok(())
}

/// A ring slot outside the ring (never, as the node names slots): out of line.
#[cold]
#[inline(never)]
fn slot_outside() -> NodeError {
    NodeError::InvalidArgument {
        what: "ring slot outside the ring",
    }
}
