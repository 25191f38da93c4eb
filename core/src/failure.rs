//! Who failed and why: the news a node spreads when it sees a peer fail, so that every
//! survivor's error names the rank that actually failed, not the live rank it happened to
//! be waiting for.
//!
//! A node learns of a failure three ways:
//! - it sees one itself: a work request to a peer completes in error, or a wait on a peer's
//!   channel passes its deadline ([`FailureCause::Completion`], [`FailureCause::TimedOut`]);
//! - a peer tells it: the node that saw the failure writes a [failure
//!   notice](crate::wire::notice) into the last 8 bytes of every other rank's flag array;
//! - something outside the node tells it through a [`FailureAlarm`](crate::node::FailureAlarm) (for example
//!   `rverbs-bootstrap`'s session watcher, when a rank's bootstrap connection closes
//!   without a goodbye: [`FailureCause::SessionClosed`]).
//!
//! Every node wait (barriers, [`Node::progress_until`](crate::node::Node::progress_until))
//! checks both the alarm and the notice slot on each poll: two 8-byte loads.

use core::fmt;

use crate::completion::WcStatus;

/// Why a rank is considered failed.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum FailureCause {
    /// A work request to the rank completed with this error status (a dead process's queue
    /// pairs stop answering: transport retries run out).
    Completion(WcStatus),
    /// A wait on the rank's channel passed its deadline with requests still unanswered.
    TimedOut,
    /// The rank's bootstrap session closed without a goodbye: its process exited or lost its
    /// connection.
    SessionClosed,
    /// The rank's own device said that this port went down (an asynchronous event): the rank
    /// is cut off from every peer until the link comes back. Reported by the rank itself.
    PortDown {
        /// The port number.
        port: u8,
    },
    /// The device moved the queue pair to the rank into the error state (an asynchronous
    /// event): nothing more travels on that connection.
    QueuePairFailed(QpFault),
    /// The rank's own device failed (an asynchronous event): nothing opened on it works.
    DeviceFatal,
    /// The rank's process gave up because of an error and said so in its goodbye
    /// (`rverbs-bootstrap`: `Session::leave_on_error`, or a session dropped without
    /// `close`); the bootstrap keeps its words (`Connected::departure`).
    LeftOnError,
}

/// Why a device moved a queue pair into the error state (the asynchronous event it gave).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum QpFault {
    /// An error no completion reports (`IBV_EVENT_QP_FATAL`).
    Fatal,
    /// The queue pair received a request it cannot execute (`IBV_EVENT_QP_REQ_ERR`).
    InvalidRequest,
    /// A request broke the queue pair's access rules (`IBV_EVENT_QP_ACCESS_ERR`).
    AccessError,
}

impl QpFault {
    /// The code a failure notice carries (see [`crate::wire::notice`]).
    pub const fn code(self) -> u8 {
        match self {
            Self::Fatal => 1,
            Self::InvalidRequest => 2,
            Self::AccessError => 3,
        }
    }

    /// The fault with notice code `code`, if there is one.
    pub const fn from_code(code: u8) -> Option<Self> {
        match code {
            1 => Some(Self::Fatal),
            2 => Some(Self::InvalidRequest),
            3 => Some(Self::AccessError),
            _ => None,
        }
    }
}

impl fmt::Display for QpFault {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Fatal => "a fatal error",
            Self::InvalidRequest => "an invalid request",
            Self::AccessError => "a remote access error",
        })
    }
}

impl fmt::Display for FailureCause {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Completion(s) => write!(f, "a work request to it failed: {s}"),
            Self::TimedOut => f.write_str("requests to it went unanswered past their deadline"),
            Self::SessionClosed => f.write_str(
                "its bootstrap session closed without a goodbye (the process exited or lost \
                 its connection)",
            ),
            Self::LeftOnError => {
                f.write_str("its process left because of an error (its bootstrap session said so)")
            }
            Self::PortDown { port } => write!(f, "its device's port {port} went down"),
            Self::QueuePairFailed(q) => {
                write!(
                    f,
                    "the device put the queue pair to it in the error state ({q})"
                )
            }
            Self::DeviceFatal => f.write_str("its device failed"),
        }
    }
}

/// A failed rank, the cause, and the rank that saw it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Failure {
    /// The rank that failed.
    pub rank: u32,
    /// Why it is considered failed.
    pub cause: FailureCause,
    /// The rank that saw the failure first-hand (it may be this node's own rank).
    pub reporter: u32,
}

impl fmt::Display for Failure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "rank {} failed: {} (seen by rank {})",
            self.rank, self.cause, self.reporter
        )
    }
}
