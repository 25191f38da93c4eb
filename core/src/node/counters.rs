//! What a node did with each peer, for an operator: [`Node::peer_counters`].
//!
//! Every count is one the node keeps anyway (the channel's request numbers, messaging's
//! consumed counts) or one kept on a cold path (a refused send, a barrier that timed out):
//! the data path pays nothing for them.

use super::Node;
use crate::channel::ChannelCounters;
use crate::failure::FailureCause;
use crate::memory::Region;
use crate::poll::Backoff;
use crate::provider::Provider;

/// A snapshot of one peer's counters ([`Node::peer_counters`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct PeerCounters {
    /// The peer.
    pub rank: u32,
    /// The channel to it: requests posted and completed, receives, whether it timed out, its
    /// failure.
    pub channel: ChannelCounters,
    /// Messages (and writes with immediate) sent to it since messaging started: each spent
    /// a credit. 0 before messaging.
    pub messages_sent: u64,
    /// Its messages this node consumed (handed to `progress`'s handler) since messaging
    /// started.
    pub messages_received: u64,
    /// Sends to it refused for want of credit ([`NodeError::WouldBlock`](super::NodeError)).
    pub credits_refused: u64,
    /// Barriers that timed out while still waiting for it (a timeout lists at most
    /// [`MAX_LISTED`](crate::barrier::MAX_LISTED) ranks; only those are counted).
    pub barrier_timeouts: u32,
    /// Why it is considered failed, if the node's failure news names it. The node keeps one
    /// piece of news, the first it learned: a second peer that failed later shows here as
    /// `None`, and its broken channel in `channel.failure`.
    pub failed: Option<FailureCause>,
}

impl<P: Provider, M: Region, B: Backoff + Clone> Node<P, M, B> {
    /// The counters of the peer `rank`, or `None` for this node's own rank or a rank outside
    /// the world. A snapshot: it reads what the node has seen so far and polls nothing.
    /// Does not allocate.
    ///
    pub fn peer_counters(&self, rank: u32) -> Option<PeerCounters> {
        let p = self.multi.position(rank)?;
        let chan = self.multi.at(p)?;
        let channel = chan.counters();
        let (mut sent, mut received, mut refused) = (0, 0, 0);
        if let Some(r) = &self.rings {
            sent = chan
                .remote_recvs_used()
                .saturating_sub(r.heads.peers[p].base);
            received = r.heads.peers[p].consumed;
            refused = r.heads.peers[p].refused;
        }
        let failed = self
            .failures
            .known()
            .filter(|f| f.rank == rank)
            .map(|f| f.cause);
        Some(PeerCounters {
            rank,
            channel,
            messages_sent: sent,
            messages_received: received,
            credits_refused: refused,
            barrier_timeouts: self
                .barrier_timeouts
                .get(rank as usize)
                .copied()
                .unwrap_or(0),
            failed,
        })
    }
}
