//! Errors of channel operations.

use core::fmt;

use crate::completion::WcStatus;
use crate::provider::ProviderError;
use crate::wr::AtomicFault;

/// A work request that completed with an error.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct WrFailure {
    /// The peer's rank, if the channel knows it ([`ChannelConfig::rank`](super::ChannelConfig)).
    pub rank: Option<u32>,
    /// The request's id (its sequence number on the channel; receives have the top bit set).
    pub wr_id: u64,
    /// The completion status.
    pub status: WcStatus,
    /// The vendor error syndrome.
    pub vendor_err: u32,
}

impl fmt::Display for WrFailure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.status.is_local() {
            // Ours, not the peer's: the message must not read as the peer's failure.
            return write!(
                f,
                "this rank's own queue pair to {} failed locally: work request {:#x}: {} \
                 (vendor error {:#x}; a local port that went down or a bad local key, not \
                 the peer)",
                PeerName(self.rank),
                self.wr_id,
                self.status,
                self.vendor_err
            );
        }
        write!(
            f,
            "{}: work request {:#x} failed: {} (vendor error {:#x})",
            PeerName(self.rank),
            self.wr_id,
            self.status,
            self.vendor_err
        )
    }
}

/// Names a peer in messages: `rank 3`, or `the peer` when the channel was not told its rank.
#[derive(Clone, Copy, Debug)]
pub(crate) struct PeerName(pub(crate) Option<u32>);

impl fmt::Display for PeerName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.0 {
            Some(r) => write!(f, "rank {r}"),
            None => f.write_str("the peer"),
        }
    }
}

/// Why a channel operation failed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum ChannelError {
    /// A work request of this operation completed with an error; the channel is now broken.
    Failed(WrFailure),
    /// The channel broke earlier (this is the first failure); reconnect to recover.
    Broken(WrFailure),
    /// The device refused a post (`errno`; ENOMEM means a queue was full).
    Post {
        /// The errno.
        errno: i32,
    },
    /// Polling a completion queue failed.
    Provider(ProviderError),
    /// More scatter/gather entries than the queue pair allows.
    TooManySges {
        /// The limit.
        max: u32,
        /// Entries given.
        got: usize,
    },
    /// An inline payload larger than the queue pair allows.
    InlineTooLarge {
        /// The limit in bytes.
        max: u32,
        /// Bytes given.
        got: usize,
    },
    /// The batch already holds as many requests as one post allows.
    BatchFull {
        /// The limit.
        max: usize,
    },
    /// More receives outstanding than the receive queue (or slot table) holds.
    RecvQueueFull,
    /// A ticket was waited on a channel that did not issue it (nothing was waited for).
    ForeignTicket,
    /// The channel a receive ring (or a node's messaging) was built on was swapped for
    /// another through `&mut` access: its receives are posted on the displaced channel, so
    /// it refuses to read or re-post them (and leaks their memory rather than free it). Or
    /// the batch a [`Scope::batch`](super::Scope::batch) closure was given was swapped for
    /// one of another channel, which the scope would not wait for: nothing was posted.
    Replaced,
    /// A wait passed its deadline: the peer did not answer in time (it may be dead).
    /// Outstanding requests were flushed and drained, and the channel is broken.
    TimedOut {
        /// The peer's rank, if the channel knows it.
        rank: Option<u32>,
    },
    /// The connection was closed: this side disconnected it, or the peer did
    /// (`cm`, feature `rdmacm`). Outstanding work was flushed.
    Disconnected {
        /// The peer's rank, if the channel knows it.
        rank: Option<u32>,
    },
    /// An atomic was refused before posting (nothing was posted; the channel is intact):
    /// its target or result buffer is misaligned or of the wrong length.
    InvalidAtomic(AtomicFault),
    /// A [`RecvRing`](super::RecvRing) cannot be built on this memory or channel.
    InvalidRing {
        /// Why.
        what: &'static str,
    },
}

impl fmt::Display for ChannelError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Failed(w) => write!(f, "{w}"),
            Self::Broken(w) => write!(f, "channel is broken by an earlier failure: {w}"),
            Self::Post { errno } => write!(f, "the device refused the post (errno {errno})"),
            Self::Provider(e) => write!(f, "{e}"),
            Self::TooManySges { max, got } => {
                write!(
                    f,
                    "{got} scatter/gather entries, the queue pair allows {max}"
                )
            }
            Self::InlineTooLarge { max, got } => {
                write!(
                    f,
                    "inline payload of {got} bytes, the queue pair allows {max}"
                )
            }
            Self::BatchFull { max } => write!(f, "a batch holds at most {max} requests"),
            Self::RecvQueueFull => f.write_str("the receive queue is full"),
            Self::ForeignTicket => f.write_str("the ticket belongs to another channel"),
            Self::Replaced => f.write_str(
                "the channel (or a scope's batch) was swapped for another's: what was posted \
                 on it is out of reach, and a scope posts no batch of another channel",
            ),
            Self::InvalidRing { what } => write!(f, "receive ring: {what}"),
            Self::InvalidAtomic(e) => write!(f, "atomic refused before posting: {e}"),
            Self::TimedOut { rank } => write!(
                f,
                "timed out waiting for {}; outstanding work was flushed",
                PeerName(*rank)
            ),
            Self::Disconnected { rank } => write!(
                f,
                "the connection to {} was disconnected; outstanding work was flushed",
                PeerName(*rank)
            ),
        }
    }
}

impl core::error::Error for ChannelError {}

impl From<ProviderError> for ChannelError {
    fn from(e: ProviderError) -> Self {
        Self::Provider(e)
    }
}

#[cfg(all(test, feature = "alloc"))]
mod tests {
    use super::*;
    use crate::completion::WcStatus;

    #[test]
    fn a_local_failure_reads_as_ours_and_a_remote_one_as_the_peers() {
        let local = WrFailure {
            rank: Some(1),
            wr_id: 0xab,
            status: WcStatus::LocalQpOperation,
            vendor_err: 0,
        };
        let text = alloc::format!("{local}");
        assert!(!text.starts_with("rank 1"), "{text}");
        assert!(
            text.contains("own queue pair to rank 1 failed locally"),
            "{text}"
        );
        let remote = WrFailure {
            status: WcStatus::RetryExceeded,
            ..local
        };
        assert!(alloc::format!("{remote}").starts_with("rank 1: work request 0xab"));
    }
}
