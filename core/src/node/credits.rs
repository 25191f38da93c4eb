//! Credit-based flow control for node messaging: a sender never posts a message its
//! receiver has no buffer for.
//!
//! A sender holds `slots` credits per receiver. [`Node::post_send_inline`] spends one, or,
//! with none left, returns [`NodeError::WouldBlock`] at once (nothing was posted; call
//! `progress` and retry): so in steady state no send ever finds the receiver without a
//! posted buffer, and no "receiver not ready" retry happens. A receiver returns credits by
//! telling the sender how many of its messages it has consumed: piggybacked on traffic
//! (every message `post_send_inline` sends carries, in its immediate, the count of the
//! receiver's messages this node consumed), or, when no message went back since half the
//! credits were consumed, by an 8-byte inline write of the count into the peer's flag array.
//! The sender takes the larger of the two, reading the word only when what the immediates
//! returned leaves it no credit. Traffic both ways (requests and replies, a ping-pong)
//! therefore needs no credit writes at all; [`Node::credit_writes`] counts those that were
//! needed.
//!
//! The immediate of a send is the node's once messaging started: a send with immediate a
//! peer posts on its channel directly is read as a credit return, and [`Event::Message`]
//! carries no immediate. Writes with immediate are the user's ([`Event::Written`]).

#[cfg(doc)]
use super::Event;

use super::messaging::Rings;
use super::{Node, NodeError};
use crate::channel::Ticket;
use crate::memory::Region;
use crate::multi::MultiChannel;
use crate::poll::Backoff;
use crate::provider::Provider;
use crate::sge::RemoteMemory;
use crate::wire::flags::{FlagLayout, SLOT_LEN};
use crate::wr::{Opcode, SendFlags};

impl<P: Provider, M: Region, B: Backoff + Clone> Node<P, M, B> {
    /// Messages this node may have in flight to one peer (0 before messaging started).
    pub fn credits_per_peer(&self) -> usize {
        self.rings.as_ref().map_or(0, |r| r.credits)
    }

    /// Posts an inline send of `data` to `rank` (no registered memory; at most the queue
    /// pair's inline limit) and returns its ticket without waiting: the lowest-latency send.
    /// Once messaging has started it spends a credit: with none left, or with the send queue
    /// full, it returns [`NodeError::WouldBlock`] at once, having posted nothing. Like the
    /// channel's other unwaited posts, only every
    /// [`signal_every`](crate::channel::ChannelConfig::signal_every)-th send asks for a
    /// completion, so [`Event::SendsCompleted`] moves in steps; [`Node::wait`] on the ticket
    /// covers a send no later signaled one does. Does not allocate.
    pub fn post_send_inline(&mut self, rank: u32, data: &[u8]) -> Result<Ticket, NodeError> {
        let p = self
            .multi
            .position(rank)
            .ok_or(NodeError::UnknownRank(rank))?;
        let Some(r) = self.rings.as_mut() else {
            return self.post_send_unmetered(rank, data);
        };
        let (Some(chan), Some(st)) = (self.multi.by_index(p), r.heads.peers.get_mut(p)) else {
            return Err(NodeError::UnknownRank(rank));
        };
        let used = chan.remote_recvs_used();
        let sent = used.saturating_sub(st.base);
        // Every request that consumes one of the peer's ring slots counts, whichever call
        // posted it (a send or a write with immediate on the channel directly too). What
        // the peer's messages returned in their immediates is enough as long as it leaves
        // a credit; only then is the word the peer writes into our flags read (a one-way
        // stream's returns arrive there).
        if sent.saturating_sub(st.returned) >= r.credits as u64 {
            // The piggybacked count is widened against the larger of the two from now
            // on. The peer wrote that word: it is taken only if it could be true, counting
            // (as the peer does) from when messaging started.
            let written = FlagLayout::new(self.world)
                .credits(rank)
                .and_then(|at| self.flags.load_u64(at))
                .unwrap_or(0);
            st.returned = st.returned.max(plausible_return(written, sent));
            if sent.saturating_sub(st.returned) >= r.credits as u64 {
                st.refused = st.refused.saturating_add(1);
                return Err(NodeError::WouldBlock { rank });
            }
        }
        if !chan.send_room(1) {
            return Err(send_queue_full(rank, chan.fault()));
        }
        // Signaled as the channel signals (every `signal_every`-th request): the payload is
        // copied during the post, so no buffer waits for the completion, a send-queue slot
        // is reused only once a later signaled completion covers it, and a failed send
        // completes with an error, signaled or not. `progress` reports sends completed as
        // those signaled completions arrive; a wait for the ticket covers the rest. The
        // credit return rides along: the low 32 bits of our consumed count (the peer widens
        // it against what it had, `credit_in`).
        let consumed = st.consumed;
        let t = chan
            .post_inline_in_room(
                Opcode::SendImm(consumed as u32),
                data,
                RemoteMemory::default(),
                SendFlags::empty(),
            )
            .map_err(|error| NodeError::Channel { rank, error })?;
        st.reported = consumed;
        Ok(t)
    }

    /// [`Node::post_send_inline`] before messaging started: no credit to spend, no
    /// immediate. Out of line.
    #[inline(never)]
    fn post_send_unmetered(&mut self, rank: u32, data: &[u8]) -> Result<Ticket, NodeError> {
        let chan = self.channel(rank)?;
        if !chan.send_room(1) {
            return Err(send_queue_full(rank, chan.fault()));
        }
        chan.post_inline_in_room(
            Opcode::Send,
            data,
            RemoteMemory::default(),
            SendFlags::empty(),
        )
        .map_err(|error| NodeError::Channel { rank, error })
    }

    /// Credit returns that needed an 8-byte write of their own since messaging started: a
    /// peer's messages were consumed and no message went back to it before half its credits
    /// were used. 0 for traffic that flows both ways. Does not allocate.
    pub fn credit_writes(&self) -> u64 {
        self.rings.as_ref().map_or(0, |r| r.credit_writes)
    }
}

/// A send refused for a full send queue: the channel's failure if it broke, else "try
/// again" (out of line).
#[cold]
#[inline(never)]
fn send_queue_full(rank: u32, fault: Option<crate::channel::ChannelError>) -> NodeError {
    match fault {
        Some(error) => NodeError::Channel { rank, error },
        None => NodeError::WouldBlock { rank },
    }
}

/// A credit word a peer wrote into our flag array (its count of our messages it consumed
/// since messaging started), if it could be true: at most the requests we posted since then
/// that consume its receives (`sent`, our count less the channel's at messaging start).
/// Anything larger is a lie or garbage and counts as nothing (0), so arithmetic on the count
/// can never overflow, whatever the peer wrote. (Measured against our whole count instead, a
/// forged word could buy the requests posted before messaging started as extra credit, and
/// keep them until our count caught up.)
pub(super) fn plausible_return(written: u64, sent: u64) -> u64 {
    if written <= sent {
        written
    } else {
        0
    }
}

/// Widens a 32-bit credit return to the 64-bit count it abbreviates: the count never goes
/// back and moves less than 2^31 between two messages (a sender has at most its credits in
/// flight), so anything that would move it back is stale or foreign and is ignored. A
/// count above what we sent only lets us post into a full ring, where the device retries
/// (receiver not ready): a peer cannot make us touch memory by lying. The immediate is the
/// peer's: a count above `sent` (the requests we ever posted that consume its receives)
/// cannot be true and is ignored too, so the count never overflows whatever the peer sends.
/// `sent` counts from messaging start, as the peer's consumed count does.
pub(super) fn credit_in(returned: &mut u64, imm: u32, sent: u64) {
    let step = imm.wrapping_sub(*returned as u32);
    if step < 1 << 31 {
        if let Some(n) = returned.checked_add(u64::from(step)).filter(|&n| n <= sent) {
            *returned = n;
        }
    }
}

/// Writes peer `p`'s consumed count into its flag array if it changed: the credit return.
/// The check is inline (it runs for every peer `progress` serves); the write is not.
#[inline]
pub(super) fn credit_back<P: Provider, M: Region, B: Backoff + Clone>(
    multi: &mut MultiChannel<P, B>,
    rings: &mut Rings<M>,
    peer_flags: &[crate::sge::RemoteMemory],
    (me, world): (u32, u32),
    p: usize,
) {
    // Half the credits at a time: a sender that ran out of credits has all of them in
    // flight, so they come back after at most half of them were consumed.
    if rings.heads.peers[p].consumed - rings.heads.peers[p].reported
        >= rings.credits.div_ceil(2) as u64
    {
        write_credit(multi, rings, peer_flags, (me, world), p);
    }
}

#[inline(never)]
fn write_credit<P: Provider, M: Region, B: Backoff + Clone>(
    multi: &mut MultiChannel<P, B>,
    rings: &mut Rings<M>,
    peer_flags: &[crate::sge::RemoteMemory],
    (me, world): (u32, u32),
    p: usize,
) {
    let consumed = rings.heads.peers[p].consumed;
    let rank = rings.heads.peers[p].rank;
    let Some(slot) = peer_flags
        .get(rank as usize)
        .zip(FlagLayout::new(world).credits(me))
        .and_then(|(f, at)| f.slice(at as u64, SLOT_LEN as u64))
    else {
        return;
    };
    let Some(chan) = multi.by_index(p) else {
        return;
    };
    // Credits never need to wait: a full send queue defers the return to the next call,
    // and a failure shows up as the channel's `Failed` event.
    if chan.send_room(1)
        && chan
            .post_inline_in_room(
                Opcode::Write,
                &FlagLayout::bytes(consumed),
                slot,
                SendFlags::SIGNALED,
            )
            .is_ok()
    {
        rings.heads.peers[p].reported = consumed;
        rings.credit_writes += 1;
    }
}

#[cfg(test)]
mod tests {
    use super::credit_in;

    #[test]
    fn a_credit_word_above_what_was_sent_counts_as_nothing() {
        use super::plausible_return;
        assert_eq!(plausible_return(5, 9), 5);
        assert_eq!(plausible_return(9, 9), 9);
        assert_eq!(plausible_return(10, 9), 0);
        assert_eq!(plausible_return(u64::MAX - 1, 9), 0);
    }

    #[test]
    fn a_credit_return_above_what_was_sent_is_ignored_and_never_overflows() {
        let mut r = 3;
        credit_in(&mut r, 12, 10); // 12 consumed of 10 sent: a lie
        assert_eq!(r, 3);
        credit_in(&mut r, 10, 10);
        assert_eq!(r, 10);
        let mut r = u64::MAX - 1;
        credit_in(&mut r, 5, u64::MAX); // 7 on would overflow: ignored, no panic
        assert_eq!(r, u64::MAX - 1);
    }

    #[test]
    fn a_credit_return_widens_across_the_32_bit_wrap_and_never_goes_back() {
        let sent = u64::MAX;
        let mut r = (1u64 << 32) - 2;
        credit_in(&mut r, 1, sent); // 2^32 + 1: three on, across the wrap
        assert_eq!(r, (1 << 32) + 1);
        credit_in(&mut r, u32::MAX, sent); // stale: would go back two
        assert_eq!(r, (1 << 32) + 1);
        credit_in(&mut r, 1 + (1 << 31), sent); // as far back as forward: foreign, ignored
        assert_eq!(r, (1 << 32) + 1);
        credit_in(&mut r, (1 << 31) - 1 + 1, sent); // 2^31 - 1 on: the most one message may move
        assert_eq!(r, (1 << 32) + (1 << 31));
    }
}
