//! What a layer that polls a channel's shared completion queues on its behalf
//! ([`MultiChannel::poll_ready`](crate::multi::MultiChannel::poll_ready)) needs of the
//! channel: to hand it a completion the shared poll took for it (no copy into a mailbox and
//! out again), and to take a receive's result once it is known complete, without a wait.

use super::{Channel, ChannelError, Done, RECV_BIT};
use crate::completion::Completion;
use crate::poll::Backoff;
use crate::provider::Provider;
use crate::sge::Sge;

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

    /// Whether this channel's receive `r` ([`Channel::post_recv_numbered`]) has completed (nothing is
    /// polled, nothing taken). As for [`Channel::take_recv`], `r` must be a receive of this
    /// channel; for another channel's the answer means nothing. Does not allocate.
    #[inline]
    pub(crate) fn recv_complete(&self, r: u64) -> bool {
        self.recv_done > r
    }

    /// The result of this channel's receive `r` ([`Channel::post_recv_numbered`]), if it has
    /// completed; `None` if it has not (nothing is polled). What [`Channel::take_if_complete`]
    /// gives for the receive's ticket, without the wait's set-up. The caller must know `r`
    /// is a receive of this channel (the same channel identity as when it was posted) that
    /// it has not taken yet. Does not allocate.
    #[inline]
    pub(crate) fn take_recv(&mut self, r: u64) -> Option<Result<Done, ChannelError>> {
        (self.recv_done > r).then(|| self.recv_result(r))
    }

    /// Posts one receive into `sge` and returns its receive number, as
    /// [`Channel::post_recv`] without a ticket: for a caller that keeps its receives'
    /// numbers (a node's ring, whose entries are built once). Counted like every receive
    /// (room in the queue, outstanding receives). Does not allocate.
    ///
    /// # Safety
    /// The posting contract for the scatter buffer.
    #[inline(always)]
    pub(crate) unsafe fn post_recv_numbered(&mut self, sge: Sge<'_>) -> Result<u64, ChannelError> {
        // SAFETY: forwarded contract.
        unsafe { self.post_recv_one(sge) }
    }

    /// Re-posts a receive of the shape this channel took before (one scatter entry: a node's
    /// ring slot, on the channel its ring was posted on) for a caller that found the channel
    /// unbroken since (nothing in between could break it): only what the channel's receive
    /// accounting needs is checked, room in the queue and a result nobody took in the slot
    /// table, as [`Channel::post_recv_numbered`] checks them. Should the channel have broken
    /// after all, the device flushes the receive (a completion the slower path reports); a
    /// queue pair with no receive entries refuses the post. Does not allocate.
    ///
    /// # Safety
    /// The posting contract for the scatter buffer.
    #[inline(always)]
    pub(crate) unsafe fn repost_recv_numbered(
        &mut self,
        sge: Sge<'_>,
    ) -> Result<u64, ChannelError> {
        // SAFETY: forwarded contract.
        unsafe { self.post_recv_counted(sge) }
    }

    /// Retires this channel's receive `r`, whose successful completion a caller took from a
    /// shared poll for itself (a node's ring head, [`Channel::recv_number`]), without
    /// storing its result in the receive slot table: the caller keeps it, so nobody can take
    /// it through this channel (the slot stays free). The caller's promise, as for
    /// [`Channel::accept`]: the completion is this channel's, and every receive before `r`
    /// has completed (a queue pair's receives complete in the order they were posted).
    /// Ignored for a number never posted. Does not allocate.
    #[inline(always)]
    pub(crate) fn retire_claimed_recv(&mut self, r: u64) {
        if r < self.recv_next && self.recv_done <= r {
            self.recv_done = r + 1;
        }
    }
}

/// The receive number a successful completion of a receive queue carries
/// ([`Channel::post_recv_numbered`]): `None` for a failed one (a flush included) or one whose
/// id is not a channel's receive. The caller knows `c` came from a receive queue (its kind
/// is then a receive's) and compares the number with those it posted on that channel (the
/// same channel identity), never trusting it alone.
#[cfg_attr(not(feature = "alloc"), allow(dead_code))]
#[inline(always)]
pub(crate) fn recv_number(c: &Completion) -> Option<u64> {
    (c.status.is_success() && c.wr_id & RECV_BIT != 0).then_some(c.wr_id & !RECV_BIT)
}
