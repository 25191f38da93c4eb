//! Messaging for a busy-polling thread: receive rings per peer, re-posted automatically, and
//! [`Node::progress`], which hands completions to a handler with bounded work per call.
//!
//! [`Node::start_messaging`] registers one ring of `slots` receive buffers of `slot_size`
//! bytes per peer and posts them all. A peer's send (or write with immediate) consumes the
//! oldest; `progress` delivers it as an [`Event`] and re-posts the buffer at once. A sender
//! may have at most `slots` messages in flight to one receiver; beyond that the receiver's
//! device answers "receiver not ready" and the sender retries (see
//! [`crate::params::RnrRetry`]). Once messaging has started, the node owns the receive queues:
//! do not post receives on its channels yourself.
//!
//! The ring memory lives in the node, which drops its queue pairs first, so no receive ever
//! points into freed memory: not when a handler panics (the slot it was reading is re-posted
//! by the next `progress`), and not when `start_messaging` fails (it checks its arguments
//! and every channel before it posts anything).

use alloc::vec::Vec;

use super::{rank_of, Node, NodeError};
use crate::channel::{ChannelError, Ticket};
use crate::multi::MultiChannel;
use crate::poll::{Backoff, Clock, Deadline};
use crate::provider::verbs::VerbsProvider;
use crate::verbs::mr::OwnedRegion;
use crate::verbs::AccessFlags;

/// What [`Node::progress`] delivers.
#[derive(Debug)]
pub enum Event<'a> {
    /// A message arrived from `rank` (a send, or a write with immediate whose bytes went to
    /// the window and whose `data` here is empty).
    Message {
        /// The sender.
        rank: u32,
        /// The payload, valid for the duration of the handler call.
        data: &'a [u8],
        /// The immediate, if the message carried one.
        imm: Option<u32>,
    },
    /// Send-queue requests to `rank` completed: every request below `completed` is done.
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

pub(super) struct Rings {
    // Declared (and dropped) after the node's channels: see Node's field order.
    region: OwnedRegion,
    slots: usize,
    slot_size: usize,
    tickets: Vec<Option<Ticket>>,
    head: Vec<usize>,
    sends_seen: Vec<u64>,
    failure_reported: Vec<bool>,
    /// A slot handed to a handler and not yet re-posted (the handler may have panicked).
    repost: Option<(usize, usize)>,
    /// The channel each peer's ring was posted on. `Node::channel` hands out `&mut Channel`,
    /// so a caller can swap a channel out; a ring whose channel changed is never read again,
    /// and its memory is leaked rather than freed while the displaced channel may still
    /// receive into it.
    chan_ids: Vec<usize>,
}

impl Rings {
    /// Whether every channel is still the one its ring was posted on.
    pub(super) fn channels_unchanged(&self, ids: impl Iterator<Item = usize>) -> bool {
        ids.eq(self.chan_ids.iter().copied())
    }
}

impl<B: Backoff + Clone> Node<B> {
    /// Registers a ring of `slots` receive buffers of `slot_size` bytes for every peer and
    /// posts them. Allocates (setup); messaging itself does not.
    ///
    /// Checks everything before it posts: `slots` must fit every channel's receive queue
    /// (and slot table), and every channel must be healthy; otherwise it returns an error and
    /// changes nothing. If the device still refuses a post half way, the channels that got
    /// receives are flushed and drained (they are broken afterwards) before the ring memory
    /// is freed.
    pub fn start_messaging(&mut self, slots: usize, slot_size: usize) -> Result<(), NodeError> {
        if self.rings.is_some() {
            return Err(NodeError::MessagingStarted);
        }
        if slots == 0 || slot_size == 0 {
            return Err(NodeError::InvalidArgument {
                what: "messaging needs at least one slot of at least one byte",
            });
        }
        let peers = self.multi.peers();
        let me = self.rank;
        for p in 0..peers {
            let rank = rank_of(me, p);
            let chan = self.multi.by_index(p).ok_or(NodeError::UnknownRank(rank))?;
            if let Some(error) = chan.failure() {
                return Err(NodeError::Channel { rank, error });
            }
            if chan.outstanding_recvs() + slots as u64 > chan.recv_capacity() {
                return Err(NodeError::InvalidArgument {
                    what: "more ring slots than a channel's free receive queue entries",
                });
            }
        }
        let len = peers
            .checked_mul(slots)
            .and_then(|n| n.checked_mul(slot_size))
            .ok_or(NodeError::InvalidArgument {
                what: "ring size overflows",
            })?;
        let region = super::page_region(&self.pd, len, AccessFlags::LOCAL_WRITE)?;
        let mut rings = Rings {
            region,
            slots,
            slot_size,
            tickets: (0..peers * slots).map(|_| None).collect(),
            head: alloc::vec![0; peers],
            sends_seen: alloc::vec![0; peers],
            failure_reported: alloc::vec![false; peers],
            repost: None,
            chan_ids: self.multi.ids().collect(),
        };
        for p in 0..peers {
            for i in 0..slots {
                if let Err(e) = post_slot(&mut self.multi, &mut rings, me, p, i) {
                    // Receives of peers 0..=p point into the ring: take them back from the
                    // device before the memory goes.
                    for q in 0..=p {
                        if let Some(c) = self.multi.by_index(q) {
                            c.settle(true);
                        }
                    }
                    return Err(e);
                }
            }
        }
        self.rings = Some(rings);
        Ok(())
    }

    /// Polls every peer once and hands up to `budget` events to `handler`; returns how many
    /// it handed. Received buffers are re-posted right after their handler call (or, if the
    /// handler panicked, at the start of the next call). Does not allocate.
    pub fn progress(
        &mut self,
        budget: usize,
        mut handler: impl FnMut(Event<'_>),
    ) -> Result<usize, NodeError> {
        let me = self.rank;
        let Some(rings) = self.rings.as_mut() else {
            return Err(NodeError::MessagingNotStarted);
        };
        progress_rings(&mut self.multi, rings, me, budget, &mut handler)
    }

    /// Calls [`Node::progress`] until `done()` is true, backing off between empty rounds, or
    /// fails with a timeout at `deadline`. Does not allocate.
    pub fn progress_until<C: Clock>(
        &mut self,
        clock: &C,
        deadline: Deadline,
        mut handler: impl FnMut(Event<'_>),
        mut done: impl FnMut() -> bool,
    ) -> Result<(), NodeError> {
        let mut backoff = self.backoff.clone();
        backoff.reset();
        while !done() {
            if self.progress(64, &mut handler)? > 0 {
                backoff.reset();
                continue;
            }
            if deadline.passed(clock) {
                return Err(NodeError::ProgressTimedOut);
            }
            backoff.snooze();
        }
        Ok(())
    }
}

fn progress_rings<B: Backoff + Clone>(
    multi: &mut MultiChannel<VerbsProvider, B>,
    rings: &mut Rings,
    me: u32,
    budget: usize,
    handler: &mut impl FnMut(Event<'_>),
) -> Result<usize, NodeError> {
    if let Some((p, i)) = rings.repost.take() {
        if multi.by_index(p).map(|c| c.id()) == Some(rings.chan_ids[p]) {
            post_slot(multi, rings, me, p, i)?;
        }
    }
    let mut handed = 0;
    for p in 0..multi.peers() {
        let rank = rank_of(me, p);
        if handed >= budget {
            break;
        }
        let chan = multi.by_index(p).ok_or(NodeError::UnknownRank(rank))?;
        if chan.id() != rings.chan_ids[p] {
            // The caller swapped this peer's channel out: its ring slots are posted on
            // another channel, so none of them may be read or re-posted again.
            if !rings.failure_reported[p] {
                rings.failure_reported[p] = true;
                handler(Event::Failed {
                    rank,
                    error: ChannelError::ForeignTicket,
                });
                handed += 1;
            }
            continue;
        }
        if let Some(error) = chan.failure() {
            // A broken channel is reported once, then left alone.
            if !rings.failure_reported[p] {
                rings.failure_reported[p] = true;
                handler(Event::Failed { rank, error });
                handed += 1;
            }
            continue;
        }
        if let Err(error) = chan.poll() {
            rings.failure_reported[p] = true;
            handler(Event::Failed { rank, error });
            handed += 1;
            continue;
        }
        let done = chan.sends_completed();
        if done > rings.sends_seen[p] && handed < budget {
            rings.sends_seen[p] = done;
            handler(Event::SendsCompleted {
                rank,
                completed: done,
            });
            handed += 1;
        }
        while handed < budget {
            let i = rings.head[p];
            let Some(t) = rings.tickets[p * rings.slots + i] else {
                break;
            };
            let chan = multi.by_index(p).ok_or(NodeError::UnknownRank(rank))?;
            let Some(result) = chan.try_wait(t) else {
                break;
            };
            // The slot leaves the ring before the handler runs, so a panicking handler
            // neither sees it twice nor loses it: `repost` brings it back.
            rings.tickets[p * rings.slots + i] = None;
            rings.head[p] = (i + 1) % rings.slots;
            match result {
                Ok(info) => {
                    rings.repost = Some((p, i));
                    let at = (p * rings.slots + i) * rings.slot_size;
                    let len = (info.byte_len as usize).min(rings.slot_size);
                    // SAFETY: this slot's receive completed and it is not re-posted until
                    // after the handler returns; the region grants no remote access.
                    let data = unsafe { rings.region.slice_unchecked(at..at + len) }.unwrap_or(&[]);
                    handler(Event::Message {
                        rank,
                        data,
                        imm: info.imm,
                    });
                    handed += 1;
                    rings.repost = None;
                    post_slot(multi, rings, me, p, i)?;
                }
                Err(error) => {
                    if !rings.failure_reported[p] {
                        rings.failure_reported[p] = true;
                        handler(Event::Failed { rank, error });
                        handed += 1;
                    }
                    break;
                }
            }
        }
    }
    Ok(handed)
}

fn post_slot<B: Backoff + Clone>(
    multi: &mut MultiChannel<VerbsProvider, B>,
    rings: &mut Rings,
    me: u32,
    p: usize,
    i: usize,
) -> Result<(), NodeError> {
    let at = (p * rings.slots + i) * rings.slot_size;
    let mut sge =
        [rings
            .region
            .sge_mut(at..at + rings.slot_size)
            .ok_or(NodeError::InvalidArgument {
                what: "ring slot outside the ring",
            })?];
    let rank = rank_of(me, p);
    let chan = multi.by_index(p).ok_or(NodeError::UnknownRank(rank))?;
    // SAFETY: the ring memory is owned by the node and dropped after its channels (field
    // order), and this slot is read only after its receive completed, then re-posted.
    let t =
        unsafe { chan.post_recv(&mut sge) }.map_err(|error| NodeError::Channel { rank, error })?;
    rings.tickets[p * rings.slots + i] = Some(t);
    Ok(())
}
