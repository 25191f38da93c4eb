//! Errors of datagram endpoints.

use core::fmt;
use core::time::Duration;

use crate::completion::WcStatus;
use crate::gid::Gid;
use crate::provider::ProviderError;

/// Why a datagram operation failed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum DatagramError {
    /// The payload is longer than a datagram may be (the path MTU, or the destination's if
    /// smaller). Refused before anything was posted; the endpoint is intact.
    TooLarge {
        /// The largest payload, in bytes.
        max: u32,
        /// The payload's length.
        got: usize,
    },
    /// The peer's address cannot be used by this endpoint's queue pair: on a device, it was
    /// made on another protection domain (a peer of another endpoint). Refused before
    /// posting; make the peer with this endpoint ([`Datagram::peer`](super::Datagram::peer)).
    ForeignPeer,
    /// More payload parts than one send gathers. Refused before posting.
    TooManyParts {
        /// The limit.
        max: usize,
        /// Parts given.
        got: usize,
    },
    /// No datagram arrived before the deadline. Nothing is broken: the receives stay posted
    /// and the next call waits again.
    TimedOut {
        /// How long the call waited.
        waited: Duration,
    },
    /// The device did not complete posted sends before the deadline: the queue pair was
    /// flushed and drained, and the endpoint is broken.
    SendsStuck {
        /// Sends still outstanding when the wait gave up.
        outstanding: u64,
    },
    /// A send or receive completed with an error; the endpoint is broken (this is the
    /// first failure).
    Failed {
        /// Whether it was a receive.
        recv: bool,
        /// The completion status.
        status: WcStatus,
        /// The vendor error syndrome.
        vendor_err: u32,
    },
    /// The device refused a post (`errno`; ENOMEM: a queue was full). Nothing was posted.
    Post {
        /// The errno.
        errno: i32,
    },
    /// Polling, making an address, or joining or leaving a group failed.
    Provider(ProviderError),
    /// The endpoint broke earlier; this is what broke it. Make a new one.
    Broken {
        /// Whether the first failure was a receive's (else a send's, a poll's or a stuck
        /// send queue's).
        recv: bool,
        /// Its status (`General` when it was no completion's).
        status: WcStatus,
    },
    /// The group is joined already.
    AlreadyJoined(Gid),
    /// The group is not joined.
    NotJoined(Gid),
    /// An IPv4 group (its datagrams are IPv4 packets) on an endpoint whose port sends from
    /// an address that is not IPv4 (an IPv6 or RoCE v1 GID, or InfiniBand): it would
    /// receive nothing. Pick an IPv4 RoCE v2 GID for the queue pair
    /// (`verbs::UdConfig::gid_index`, or the default route).
    Ipv4GroupWithoutIpv4Route {
        /// The group.
        group: Gid,
        /// The GID the endpoint's port sends from.
        local: Gid,
    },
    /// The endpoint is a member of as many groups as it tracks.
    TooManyGroups {
        /// The limit.
        max: usize,
    },
    /// The endpoint cannot be built from this memory, provider or configuration.
    InvalidSetup {
        /// Why.
        what: &'static str,
    },
}

impl fmt::Display for DatagramError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            Self::TooLarge { max, got } => write!(
                f,
                "datagram of {got} bytes refused before posting: the path allows at most {max}"
            ),
            Self::ForeignPeer => write!(
                f,
                "the peer's address belongs to another protection domain than this endpoint's \
                 queue pair: make the peer with this endpoint"
            ),
            Self::TooManyParts { max, got } => {
                write!(f, "{got} payload parts, one datagram gathers at most {max}")
            }
            Self::TimedOut { waited } => write!(f, "no datagram arrived within {waited:?}"),
            Self::SendsStuck { outstanding } => write!(
                f,
                "{outstanding} sends did not complete in time; the queue pair was flushed"
            ),
            Self::Failed {
                recv,
                status,
                vendor_err,
            } => write!(
                f,
                "a datagram {} failed: {status} (vendor error {vendor_err:#x})",
                if recv { "receive" } else { "send" }
            ),
            Self::Post { errno } => write!(f, "the device refused the post (errno {errno})"),
            Self::Provider(e) => write!(f, "{e}"),
            Self::Broken { recv, status } => write!(
                f,
                "the endpoint is broken by an earlier {} failure: {status}",
                if recv { "receive" } else { "send" }
            ),
            Self::AlreadyJoined(g) => write!(f, "group {g} is joined already"),
            Self::NotJoined(g) => write!(f, "group {g} is not joined"),
            Self::Ipv4GroupWithoutIpv4Route { group, local } => write!(
                f,
                "group {group} is an IPv4 group, but this endpoint sends from {local}, not an \
                 IPv4 (RoCE v2) address: it would receive nothing from the group"
            ),
            Self::TooManyGroups { max } => {
                write!(f, "an endpoint is a member of at most {max} groups")
            }
            Self::InvalidSetup { what } => write!(f, "datagram endpoint: {what}"),
        }
    }
}

impl core::error::Error for DatagramError {}

impl From<ProviderError> for DatagramError {
    fn from(e: ProviderError) -> Self {
        Self::Provider(e)
    }
}
