//! What a layer that polls a channel's shared completion queues on its behalf
//! ([`MultiChannel::poll_ready`](crate::multi::MultiChannel::poll_ready)) needs of the
//! channel: to hand it a completion the shared poll took for it (no copy into a mailbox and
//! out again), and to take a receive's result once it is known complete, without a wait.

use super::{Channel, ChannelError, Done, Ticket, Work};
use crate::completion::Completion;
use crate::poll::Backoff;
use crate::provider::Provider;

// Its callers (the multi-channel and the node) need `alloc`.
#[cfg_attr(not(feature = "alloc"), allow(dead_code))]
impl<P: Provider, B: Backoff, const R: usize> Channel<P, B, R> {
    /// Retires `c`, a completion of this channel's send (`recv` false) or receive queue that
    /// a shared poll took on its behalf, as its own poll would have: in the order the queue
    /// gave them, with nothing of the same kind left waiting for it elsewhere (the caller's
    /// promise). False if `c` names another queue pair (ignored, as its own poll ignores it).
    /// Does not allocate.
    #[inline]
    pub(crate) fn accept(&mut self, recv: bool, c: &Completion) -> bool {
        if c.qp_num != self.qp_num {
            return false;
        }
        if recv {
            self.on_recv_completion(c);
        } else {
            self.on_send_completion(c);
        }
        true
    }

    /// The receive sequence number `ticket` stands for, if it is one of this channel's
    /// receives: what [`Channel::take_recv`] takes, for a caller that keeps many receives'
    /// numbers (a node's ring) rather than their tickets.
    #[inline]
    pub(crate) fn recv_seq(&self, ticket: Ticket) -> Option<u64> {
        match ticket.work {
            Work::Recv(r) if ticket.chan == self.id => Some(r),
            _ => None,
        }
    }

    /// Whether this channel's receive `r` ([`Channel::recv_seq`]) has completed (nothing is
    /// polled, nothing taken). As for [`Channel::take_recv`], `r` must be a receive of this
    /// channel; for another channel's the answer means nothing. Does not allocate.
    #[inline]
    pub(crate) fn recv_complete(&self, r: u64) -> bool {
        self.recv_done > r
    }

    /// The result of this channel's receive `r` ([`Channel::recv_seq`]), if it has
    /// completed; `None` if it has not (nothing is polled). What [`Channel::take_if_complete`]
    /// gives for the receive's ticket, without the wait's set-up. The caller must know `r`
    /// is a receive of this channel (the same channel identity as when it was posted) that
    /// it has not taken yet. Does not allocate.
    #[inline]
    pub(crate) fn take_recv(&mut self, r: u64) -> Option<Result<Done, ChannelError>> {
        (self.recv_done > r).then(|| self.recv_result(r))
    }
}
