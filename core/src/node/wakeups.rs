//! Barrier wake-ups: notifications that raise a completion at the peer.
//!
//! A barrier notification is an 8-byte write into the peer's flag array. A plain write
//! completes only at the writer, so a peer asleep on its completion channel would not wake
//! until its sleep ran out. With wake-ups on, every notification is a write with immediate,
//! which consumes one of the peer's posted receives and raises a receive completion there:
//! the sleeping rank wakes the moment its peer arrives.
//!
//! Every queue pair keeps [`WAKE_RECVS`] receives without buffers posted for them, re-posted
//! as they complete: by the barrier's poll, and on every channel at the start of every
//! barrier (a rank that always arrives last finishes inside `start` and never polls). A peer
//! cannot get more than one barrier ahead of us (it needs our arrival to finish the next
//! one), and it sends us at most two notifications per barrier (arrival and release), so at
//! most four are consumed between two of our barrier starts; sixteen leave room for group
//! barriers started back to back. Were they ever exhausted, the peer's write would wait in
//! receiver-not-ready retries (and fail once those run out, breaking that channel).
//!
//! A channel whose wake-up receive failed (it broke: a peer's send landed on one, or the
//! peer died) is left alone: the barriers that need that rank fail when they notify it, and
//! the others go on.
//!
//! Receives without buffers cannot take a message: once wake-ups are on, the node's channels
//! carry one-sided traffic only (writes, reads, atomics, barriers). Wake-ups are a component
//! chosen when the node is built ([`Components`](super::Components)), and messaging with them
//! is refused then ([`SetupError::Incompatible`]); a peer's send on a channel would still land
//! on a wake-up receive and fail
//! with a length error, breaking that channel (an error, never a memory hazard: those
//! receives name no memory).
//!
//! Turning wake-ups on is collective (every rank builds its node with them): until the first
//! barrier over the whole world that completes after this rank built its node, notifications stay plain writes (a peer that has
//! not posted its wake-up receives yet would answer a write with immediate with
//! receiver-not-ready). Completing that barrier proves every rank entered it, so every rank
//! had posted them before.

use alloc::vec::Vec;

use heapless::Deque;

use super::SetupError;
use crate::channel::Ticket;
use crate::multi::MultiChannel;
use crate::poll::Backoff;
use crate::provider::Provider;

/// Receives without buffers each queue pair keeps posted for barrier wake-ups (fewer if the
/// receive queue is shallower).
pub(crate) const WAKE_RECVS: usize = 16;

/// The fewest that cover one peer's notifications in flight (see the module docs).
const MIN_WAKE_RECVS: usize = 4;

/// The immediate of a barrier notification (the receiver does not read it: the flag array
/// says who arrived).
pub(super) const WAKE_IMM: u32 = 0x7276_4257; // "rvBW"

/// The wake-up receives posted on every channel of a node, by channel position.
#[derive(Debug)]
pub(super) struct Wakeups {
    /// Whether notifications carry an immediate yet (see the module docs).
    pub(super) live: bool,
    posted: Vec<Deque<Ticket, WAKE_RECVS>>,
    /// Positions of the channels the last poll found completions on.
    ready: Vec<u32>,
    /// A channel the refill's poll found broken (reported once), for the barrier's next poll.
    pub(super) missed: Option<(u32, crate::channel::ChannelError)>,
}

impl Wakeups {
    /// Posts [`WAKE_RECVS`] receives on every channel of `multi`. Allocates (setup).
    pub(super) fn post_all<P: Provider, B: Backoff + Clone>(
        multi: &mut MultiChannel<P, B>,
    ) -> Result<Self, SetupError> {
        let mut posted = Vec::with_capacity(multi.peers());
        // Check every channel before posting on any: a refusal leaves nothing posted.
        if multi.channels().any(|c| c.outstanding_recvs() > 0) {
            return Err(SetupError::InvalidArgument {
                what: "barrier wake-ups need every receive on the node's channels completed",
            });
        }
        if multi
            .channels()
            .any(|c| c.recv_capacity() < MIN_WAKE_RECVS as u64)
        {
            return Err(SetupError::InvalidArgument {
                what: "barrier wake-ups need room for 4 receives on every queue pair",
            });
        }
        for (rank, c) in multi.ranked() {
            let mut q = Deque::new();
            for _ in 0..c.recv_capacity().min(WAKE_RECVS as u64) {
                let t = c
                    .post_recv_empty()
                    .map_err(|error| SetupError::Channel { rank, error })?;
                // WAKE_RECVS tickets fit a deque of WAKE_RECVS.
                let _ = q.push_back(t);
            }
            posted.push(q);
        }
        Ok(Self {
            live: false,
            missed: None,
            ready: Vec::with_capacity(posted.len()),
            posted,
        })
    }

    /// Notes that the channel at `pos` had completions in the last poll.
    #[inline]
    pub(super) fn mark(&mut self, pos: usize) {
        if self.ready.len() < self.ready.capacity() {
            self.ready.push(pos as u32);
        }
    }

    /// Polls once and re-posts the completed wake-up receives of every channel (at the start
    /// of a barrier: O(peers), once per barrier). A failure shows up where it matters: when
    /// a barrier notifies or waits for that rank. Does not allocate.
    pub(super) fn refill<P: Provider, B: Backoff + Clone>(
        &mut self,
        multi: &mut MultiChannel<P, B>,
    ) {
        let missed = &mut self.missed;
        let _ = multi.poll_ready(|(_, rank), r| {
            if let Err(e) = r {
                missed.get_or_insert((rank, e));
            }
        });
        self.ready.clear();
        self.ready.extend(0..self.posted.len() as u32);
        self.repost(multi);
    }

    /// Re-posts the wake-up receives that completed on the channels [`mark`](Self::mark)ed
    /// since the last call. A channel that failed is skipped (see the module docs). Does not
    /// allocate.
    pub(super) fn repost<P: Provider, B: Backoff + Clone>(
        &mut self,
        multi: &mut MultiChannel<P, B>,
    ) {
        for pos in self.ready.drain(..) {
            let (Some(c), Some(q)) = (
                multi.by_index(pos as usize),
                self.posted.get_mut(pos as usize),
            ) else {
                continue;
            };
            while let Some(&t) = q.front() {
                match c.take_if_complete(t) {
                    None => break,
                    Some(Err(_)) => {
                        // Broken: nothing will complete or post here again.
                        q.clear();
                        break;
                    }
                    Some(Ok(_)) => {
                        q.pop_front();
                        match c.post_recv_empty() {
                            // One popped, one pushed: there is room.
                            Ok(t) => {
                                let _ = q.push_back(t);
                            }
                            Err(_) => {
                                q.clear();
                                break;
                            }
                        }
                    }
                }
            }
        }
    }
}
