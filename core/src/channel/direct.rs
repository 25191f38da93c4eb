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

    /// The result of the receive `ticket` stands for, if it has completed; `None` if it has
    /// not (nothing is polled) or `ticket` is not one of this channel's receives. What
    /// [`Channel::take_if_complete`] gives for a receive, without the wait's set-up. Does
    /// not allocate.
    #[inline]
    pub(crate) fn take_recv(&mut self, ticket: Ticket) -> Option<Result<Done, ChannelError>> {
        match ticket.work {
            Work::Recv(r) if ticket.chan == self.id && self.recv_done > r => {
                Some(self.recv_result(r))
            }
            _ => None,
        }
    }
}
