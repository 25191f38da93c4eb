//! [`Node`]: one rank of a connected world — a [`MultiChannel`] to every other rank, a
//! registered data window every peer can write, barriers and messaging.
//!
//! The node is written against the provider seam ([`Provider`], [`Region`]), so the same
//! barriers and messaging run on a device and on the software model. Building one on a
//! device is the job of `node/verbs.rs`: [`PreparedNode::new`] (open queue pairs, register memory) →
//! [`PreparedNode::blob`] (bytes to publish; see [`crate::wire::node`]) → exchange blobs out
//! of band (for example with `rverbs-bootstrap`) → [`PreparedNode::handshake`] → [`Node`].
//! Any other provider hands its connected channels and regions to [`Node::from_parts`].
//! After that nothing allocates: barriers, window writes, messaging and channel operations
//! reuse what setup made.
//!
//! # A barrier loop
//! On a device each rank is a process, its node comes from `rverbs_bootstrap::connect` (or
//! [`PreparedNode`]), and its loop is `for step in 0..n { work(step); node.barrier(Members::World)?; }`:
//! every wait is bounded by the node's default [timeout](Node::timeout), and no call takes
//! a clock. On the software model one thread plays all four ranks, so each starts the
//! barrier and then all are polled until every one has passed it:
//!
//! ```
//! # use rverbs_core::{channel::ChannelConfig, params::QpCaps, poll::{Spin, StepClock}};
//! # use rverbs_core::model::{SoftNet, SoftNetConfig};
//! use rverbs_core::node::{soft_world, soft_world_bytes, Members};
//! # static CLOCK: StepClock = StepClock::new(core::time::Duration::from_micros(1));
//! # let mut arena = vec![0u8; soft_world_bytes(4, 64)];
//! # let net = SoftNet::new(SoftNetConfig::new(4, QpCaps::queues(16, 16)));
//! # let cfg = ChannelConfig::default();
//! let mut nodes = soft_world(&net, &mut arena, 64, cfg, Default::default(), Spin, &CLOCK)?;
//! for _step in 0..100 {
//!     nodes.iter_mut().try_for_each(|n| n.barrier_start(Members::World))?; // all arrive
//!     while nodes.iter_mut().map(|n| n.barrier_poll()).collect::<Result<Vec<_>, _>>()?.contains(&false) {}
//! }
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! # The flag array
//! Every rank registers a small array peers may write, laid out once in
//! [`crate::wire::flags`] ([`FlagLayout`]): per rank, the count of barrier notifications it
//! sent us and how many of our messages it has consumed (its credit return, see
//! [`messaging`](Node::progress)); then the [failure notice](crate::wire::notice) a peer
//! writes when it sees a rank fail. Every peer holds the array's key and may write any bytes anywhere in it, so no
//! word is taken on trust: a barrier count above what its rank could have reached fails the
//! barrier ([`BarrierError::ImplausibleArrival`]), a credit word above what we sent counts as
//! nothing, and a notice that is not one, names a rank outside the world or names this node is
//! ignored.
//!
//! # When a rank fails
//! A node that sees a peer fail (a work request to it completes in error, or a wait on it
//! passes its deadline) tells every other rank with one 8-byte write each; something outside
//! the node (`rverbs-bootstrap`'s session watcher) can raise the same news through
//! [`Node::failure_alarm`]. Every barrier and [`Node::progress_until`] checks for news on each
//! poll, so every survivor's error names the rank that failed ([`NodeError::PeerFailed`],
//! [`BarrierError::PeerFailed`]) rather than a live rank it happened to wait for.
//!
//! # When a rank rejoins
//! A rank that failed can be started again with the same configuration (a new process, new
//! queue pairs, new memory) and readmitted while the others keep their nodes: every survivor
//! calls [`Node::readmit_begin`], the survivors and the new process exchange fresh endpoints
//! out of band, every survivor calls [`Node::readmit_finish`] with its new queue pair to the
//! new process, and after a second out-of-band round barriers run over all ranks again, every
//! count starting from zero (the steps and why they are needed: `node/readmit.rs`). On a device
//! `rverbs-bootstrap`'s `Connected::readmit` and `rejoin` do all of it; on the software model,
//! [`soft_rejoin`] builds the new node. Only a node built with readmission can readmit, and
//! such a node has neither messaging nor barrier wake-ups ([`Components`]).
//!
//! # Components
//! Messaging, barrier wake-ups and readmission are chosen when the node is built
//! ([`Components`]); a combination that cannot work is refused then, naming both choices
//! ([`SetupError::Incompatible`]). Barriers and failure news are part of every node.

mod alarm;
mod counters;
mod credits;
#[cfg(feature = "verbs")]
mod device_events;
mod failure;
mod messaging;
mod pool;
mod readmit;
mod soft;
#[cfg(feature = "verbs")]
mod verbs;
mod wakeups;

pub use alarm::FailureAlarm;
pub use counters::PeerCounters;
#[cfg(feature = "verbs")]
pub use device_events::failure_of_event;
pub use messaging::{Event, Receive};

pub use readmit::ReadmitError;
pub use soft::{
    soft_rejoin, soft_rejoin_bytes, soft_world, soft_world_bytes, soft_world_with, SoftNode,
};
#[cfg(feature = "verbs")]
pub use verbs::{NodeConfig, PreparedNode, ReadmitQp, VerbsNode, VerbsQp};

use alloc::vec::Vec;
use core::fmt;
use core::time::Duration;

use crate::barrier::{BarrierAlgorithm, BarrierError, BarrierState, BarrierTransport};
use crate::channel::{Channel, ChannelError, Done, Ticket};
use crate::memory::{AccessFlags, Region};
use crate::multi::{MultiChannel, MultiError};
use crate::poll::{Backoff, Deadline, StaticClock};
use crate::provider::Provider;
use crate::sge::{RemoteMemory, Sge};
#[cfg(feature = "verbs")]
use crate::verbs::VerbsError;
use crate::wire::flags::{FlagLayout, SLOT_LEN};
use crate::wire::node::NodeBlobError;

/// Bytes of a world's flag array ([`FlagLayout`]: barrier counters, then credit returns, then
/// the failure notice).
pub(crate) const fn flags_len(world: u32) -> usize {
    FlagLayout::new(world).len()
}

/// How long a barrier keeps waiting after its deadline, once it probed the ranks it misses,
/// for a dead rank's probe to fail (by default a queue pair gives up after 7 retries of about
/// 67 ms on RoCE, about 0.5 s) or for news from a peer.
pub const DEFAULT_PROBE_GRACE: Duration = Duration::from_secs(2);

const FLAG_ACCESS: AccessFlags = AccessFlags::LOCAL_WRITE.union(AccessFlags::REMOTE_WRITE);
#[cfg(feature = "verbs")]
const WINDOW_ACCESS: AccessFlags = AccessFlags::LOCAL_WRITE
    .union(AccessFlags::REMOTE_WRITE)
    .union(AccessFlags::REMOTE_READ);

/// Why building a node, or setting up one of its parts, failed: what [`PreparedNode::new`],
/// [`PreparedNode::handshake`], [`Node::from_parts`], the model's [`soft_world`] and
/// [`soft_rejoin`], and starting messaging ([`Node::start_messaging_in`]) can fail with.
/// Once a node runs, its calls fail with a [`NodeError`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum SetupError {
    /// A verb failed (opening a device, creating a queue, registering memory).
    #[cfg(feature = "verbs")]
    Verbs(VerbsError),
    /// A peer's blob is malformed.
    Blob {
        /// Whose blob.
        rank: u32,
        /// What is wrong.
        error: NodeBlobError,
    },
    /// Not one blob per rank, or a blob in the wrong place.
    BlobCount {
        /// Expected.
        expected: u32,
        /// Got.
        got: usize,
    },
    /// Connecting the queue pair to a peer failed.
    #[cfg(feature = "verbs")]
    Connect {
        /// The peer.
        rank: u32,
        /// The verb error.
        error: VerbsError,
    },
    /// The node's shared completion queues refused the queue pair to a peer (queues deeper
    /// than they hold, a queue pair not on the node's shared receive queue, ...).
    #[cfg(feature = "verbs")]
    SharedCq {
        /// The peer.
        rank: u32,
        /// Why.
        error: crate::provider::shared::SharedCqError,
    },
    /// The rank is not below the world size, or the world size is 0 or above
    /// [`MAX_WORLD`](crate::wire::MAX_WORLD).
    InvalidWorld {
        /// This rank.
        rank: u32,
        /// The world size.
        world: u32,
    },
    /// The allocator had no memory for a region of this many bytes.
    OutOfMemory {
        /// Bytes asked for.
        bytes: usize,
    },
    /// Two components chosen for the node cannot work together (see [`Components`]); the
    /// node was not built.
    Incompatible {
        /// One choice.
        a: Component,
        /// The other, which `a` excludes.
        b: Component,
    },
    /// Messaging was started on a node built without it, or (on the model,
    /// [`soft_rejoin`]) a survivor was built without readmission ([`Components`]).
    NotBuiltWith(Component),
    /// A survivor cannot readmit the rank [`soft_rejoin`] builds a node for (on a device the
    /// survivors' side is a call of each running node: [`NodeError::Readmit`]).
    Readmit {
        /// The rank to readmit.
        rank: u32,
        /// Why not.
        error: ReadmitError,
    },
    /// [`Node::start_messaging_in`] was called twice.
    MessagingStarted,
    /// An argument is out of range, or the parts do not fit together; nothing was changed.
    InvalidArgument {
        /// What is wrong.
        what: &'static str,
    },
    /// The channel to a peer is broken, or refused the receives setup posts on it (barrier
    /// wake-ups, messaging's ring slots).
    Channel {
        /// The peer.
        rank: u32,
        /// The error.
        error: ChannelError,
    },
}

impl fmt::Display for SetupError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            #[cfg(feature = "verbs")]
            Self::Verbs(e) => write!(f, "{e}"),
            Self::Blob { rank, error } => write!(f, "endpoint blob of rank {rank}: {error}"),
            Self::BlobCount { expected, got } => {
                write!(f, "{got} endpoint blobs for a world of {expected}")
            }
            #[cfg(feature = "verbs")]
            Self::Connect { rank, error } => write!(f, "connecting to rank {rank}: {error}"),
            #[cfg(feature = "verbs")]
            Self::SharedCq { rank, error } => write!(
                f,
                "the queue pair to rank {rank}: the shared completion queues refused it: {error}"
            ),
            Self::InvalidWorld { rank, world } => write!(
                f,
                "rank {rank} of a world of {world}: the rank must be below the world size, \
                 which must be 1 to {}",
                crate::wire::MAX_WORLD
            ),
            Self::OutOfMemory { bytes } => write!(f, "no memory for a region of {bytes} bytes"),
            Self::Incompatible { a, b } => write!(
                f,
                "a node cannot be built with both {a} and {b}: choose one of them \
                 (see node::Components)"
            ),
            Self::NotBuiltWith(c) => {
                write!(f, "the node was built without {c} (see node::Components)")
            }
            Self::Readmit { rank, error } => write!(f, "cannot readmit rank {rank}: {error}"),
            Self::MessagingStarted => f.write_str("messaging has already started"),
            Self::InvalidArgument { what } => write!(f, "invalid argument: {what}"),
            // As `NodeError::Channel`: a local failure names the rank only as the far end.
            Self::Channel {
                rank,
                error: error @ (ChannelError::Failed(w) | ChannelError::Broken(w)),
            } if w.status.is_local() => write!(f, "the channel to rank {rank}: {error}"),
            Self::Channel { rank, error } => write!(f, "rank {rank}: {error}"),
        }
    }
}

impl core::error::Error for SetupError {}

#[cfg(feature = "verbs")]
impl From<VerbsError> for SetupError {
    fn from(e: VerbsError) -> Self {
        Self::Verbs(e)
    }
}

impl SetupError {
    /// A posting error of messaging's ring or pool, met while setting it up.
    pub(super) fn posting(e: NodeError) -> Self {
        match e {
            NodeError::Channel { rank, error } => Self::Channel { rank, error },
            NodeError::InvalidArgument { what } => Self::InvalidArgument { what },
            // The posting helpers fail with nothing else; named here so a new variant is
            // not turned into a wrong one silently.
            NodeError::UnknownRank(_) => Self::InvalidArgument {
                what: "a ring names a rank that has no channel",
            },
            _ => Self::InvalidArgument {
                what: "posting the receives failed",
            },
        }
    }
}

/// Why a call on a running node failed: a barrier, a window write, a send, `progress`, a
/// wait, readmission. Each names the rank it concerns where there is one. (Building the
/// node fails with a [`SetupError`].)
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum NodeError {
    /// A ticket waited on the node that none of its channels issued.
    ForeignTicket,
    /// No peer has this rank (it is this node's own rank, or not below the world size).
    UnknownRank(u32),
    /// A range of a peer's window that does not fit it.
    WindowOutOfRange {
        /// The peer.
        rank: u32,
        /// Offset asked for.
        offset: u64,
        /// Length asked for.
        len: u64,
    },
    /// [`Node::progress_until`] reached its deadline before `done()` held.
    ProgressTimedOut,
    /// [`Node::progress`] before messaging started.
    MessagingNotStarted,
    /// A message to `rank` cannot go now: its ring has no free slot for us (no credit), or
    /// our send queue to it is full. Nothing was posted; call [`Node::progress`] and retry.
    WouldBlock {
        /// The peer.
        rank: u32,
    },
    /// Messaging's own state does not hold what it should (a slot outside its ring, a pool
    /// without a peer); nothing was posted.
    InvalidArgument {
        /// What is wrong.
        what: &'static str,
    },
    /// A barrier failed.
    Barrier(BarrierError),
    /// Polling the completion queues the node's channels share failed (every peer is
    /// affected).
    Completions(crate::provider::ProviderError),
    /// A channel operation failed.
    Channel {
        /// The peer.
        rank: u32,
        /// The error.
        error: ChannelError,
    },
    /// A rank failed (see [the module docs](self#when-a-rank-fails)); names the failed rank.
    PeerFailed(crate::failure::Failure),
    /// A call needs a component the node was not built with ([`Components`]): readmission.
    NotBuiltWith(Component),
    /// A rank cannot be readmitted (see [the module docs](self#when-a-rank-rejoins)).
    Readmit {
        /// The rank to readmit.
        rank: u32,
        /// Why not.
        error: ReadmitError,
    },
}

impl fmt::Display for NodeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::ForeignTicket => f.write_str("the ticket belongs to no channel of this node"),
            Self::UnknownRank(r) => write!(f, "no peer with rank {r}"),
            Self::WindowOutOfRange { rank, offset, len } => write!(
                f,
                "{len} bytes at offset {offset} do not fit the window of rank {rank}"
            ),
            Self::ProgressTimedOut => f.write_str("progress_until reached its deadline"),
            Self::MessagingNotStarted => f.write_str("messaging has not started"),
            Self::WouldBlock { rank } => write!(
                f,
                "rank {rank} has no free receive slot for us (or our send queue is full); \
                 progress and retry"
            ),
            Self::InvalidArgument { what } => write!(f, "invalid argument: {what}"),
            Self::Barrier(e) => write!(f, "{e}"),
            Self::Completions(e) => write!(f, "shared completion queues: {e}"),
            // A local failure names the rank only as the far end of our queue pair.
            Self::Channel {
                rank,
                error: error @ (ChannelError::Failed(w) | ChannelError::Broken(w)),
            } if w.status.is_local() => write!(f, "the channel to rank {rank}: {error}"),
            Self::Channel { rank, error } => write!(f, "rank {rank}: {error}"),
            Self::PeerFailed(failure) => write!(f, "{failure}"),
            Self::NotBuiltWith(c) => {
                write!(f, "the node was built without {c} (see node::Components)")
            }
            Self::Readmit { rank, error } => write!(f, "cannot readmit rank {rank}: {error}"),
        }
    }
}

impl core::error::Error for NodeError {}

impl NodeError {
    /// Whether this is a barrier's notification refused by a member (a remote access or
    /// remote invalid request error): a symptom of a dying member or of the caller's own bad
    /// key on that channel, not news by itself. A blocking barrier waits up to the probe
    /// grace for news that explains it (see [`crate::barrier`], "After a failure"); a caller
    /// of [`Node::barrier_poll`] can do the same with [`Node::failure`].
    pub fn is_refusal(&self) -> bool {
        matches!(self, Self::Barrier(BarrierError::Transport { error, .. }) if failure::is_refusal(error))
    }
}

impl From<BarrierError> for NodeError {
    fn from(e: BarrierError) -> Self {
        Self::Barrier(e)
    }
}

/// One of the components a node may be built with ([`Components`]), as errors name it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Component {
    /// Messaging into a receive ring per peer ([`Receive::PerPeer`]).
    Messaging,
    /// Messaging into one receive pool every peer shares ([`Receive::Shared`]).
    SharedReceive,
    /// Barrier wake-ups ([`Components::barrier_wakeups`]).
    BarrierWakeups,
    /// Readmission of a rank that failed and was started again ([`Components::readmission`]).
    Readmission,
}

impl fmt::Display for Component {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Messaging => "messaging (a receive ring per peer)",
            Self::SharedReceive => "messaging into a shared receive pool",
            Self::BarrierWakeups => "barrier wake-ups",
            Self::Readmission => "readmission",
        })
    }
}

/// What a node is built with besides what every node has (its channels, flag array, window,
/// barriers and failure news, which barriers need): chosen once, when the node is built
/// ([`NodeParts::components`], `NodeConfig::components` on a device, [`soft_world_with`] on
/// the model), so that a combination that cannot work is refused then
/// ([`SetupError::Incompatible`], naming both), never half way through a run.
///
/// | | messaging | barrier wake-ups | readmission |
/// |---|---|---|---|
/// | messaging | | no: a wake-up receive has no buffer for a message | no: rings, credits and posted receives are not rebuilt for a new process |
/// | barrier wake-ups | no | | no: the wake-up receives are not rebuilt for a new process |
/// | readmission | no | no | |
///
/// The default is messaging into a ring per peer ([`Components::messaging`]); a shared
/// receive pool ([`Receive::Shared`]) is messaging too, so it cannot be readmitted either
/// (a queue pair for a new process cannot join the shared queue).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct Components {
    /// Where messages land, if the node carries messages ([`Node::start_messaging_in`]);
    /// `None`: one-sided traffic only (writes, reads, atomics, barriers).
    pub messaging: Option<Receive>,
    /// Barrier notifications raise a completion at their receiver, so a rank asleep on
    /// completion events wakes when its peer arrives (see `node/wakeups.rs`). Every rank
    /// chooses it alike; it takes effect from the first barrier over the whole world.
    pub barrier_wakeups: bool,
    /// The node can readmit a rank that failed and was started again
    /// ([`Node::readmit_begin`]).
    pub readmission: bool,
}

impl Default for Components {
    fn default() -> Self {
        Self::messaging(Receive::PerPeer)
    }
}

impl From<Receive> for Components {
    fn from(receive: Receive) -> Self {
        Self::messaging(receive)
    }
}

impl Components {
    /// One-sided traffic only: no messaging, no wake-ups, no readmission.
    pub const fn one_sided() -> Self {
        Self {
            messaging: None,
            barrier_wakeups: false,
            readmission: false,
        }
    }

    /// Messaging, with messages landing as `receive` says (the default: per peer).
    pub const fn messaging(receive: Receive) -> Self {
        Self {
            messaging: Some(receive),
            ..Self::one_sided()
        }
    }

    /// One-sided traffic with barrier wake-ups.
    pub const fn barrier_wakeups() -> Self {
        Self {
            barrier_wakeups: true,
            ..Self::one_sided()
        }
    }

    /// One-sided traffic with readmission.
    pub const fn readmission() -> Self {
        Self {
            readmission: true,
            ..Self::one_sided()
        }
    }

    /// The first two components chosen that cannot work together, if any.
    pub const fn clash(&self) -> Option<(Component, Component)> {
        let messaging = match self.messaging {
            None => None,
            Some(Receive::PerPeer) => Some(Component::Messaging),
            Some(Receive::Shared { .. }) => Some(Component::SharedReceive),
        };
        match (messaging, self.barrier_wakeups, self.readmission) {
            (Some(m), true, _) => Some((m, Component::BarrierWakeups)),
            (Some(m), _, true) => Some((m, Component::Readmission)),
            (None, true, true) => Some((Component::BarrierWakeups, Component::Readmission)),
            _ => None,
        }
    }

    /// `Ok`, or [`SetupError::Incompatible`] naming the first clash.
    pub const fn check(&self) -> Result<(), SetupError> {
        match self.clash() {
            None => Ok(()),
            Some((a, b)) => Err(SetupError::Incompatible { a, b }),
        }
    }
}

/// Who takes part in a barrier: every rank of the world, or the ranks listed (sorted, no
/// repeats, this rank among them). Every member names the same members.
///
/// A list converts on its own, so `node.barrier(&[0, 2])` and `node.barrier(Members::World)`
/// both read as what they do.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Members<'a> {
    /// Every rank, `0..world` (the common barrier, and the cheapest: it needs no checking).
    #[default]
    World,
    /// These ranks.
    Ranks(&'a [u32]),
}

impl<'a> Members<'a> {
    /// The listed ranks, or `None` for the whole world.
    fn ranks(self) -> Option<&'a [u32]> {
        match self {
            Self::World => None,
            Self::Ranks(r) => Some(r),
        }
    }
}

impl<'a> From<&'a [u32]> for Members<'a> {
    fn from(ranks: &'a [u32]) -> Self {
        Self::Ranks(ranks)
    }
}

impl<'a, const N: usize> From<&'a [u32; N]> for Members<'a> {
    fn from(ranks: &'a [u32; N]) -> Self {
        Self::Ranks(ranks)
    }
}

impl<'a> From<&'a Vec<u32>> for Members<'a> {
    fn from(ranks: &'a Vec<u32>) -> Self {
        Self::Ranks(ranks)
    }
}

/// What a node is made of, for [`Node::from_parts`].
pub struct NodeParts<P: Provider, M: Region, B: Backoff + Clone> {
    /// This rank.
    pub rank: u32,
    /// Number of ranks.
    pub world: u32,
    /// One connected channel per other rank, each naming its rank
    /// ([`ChannelConfig::rank`](crate::channel::ChannelConfig::rank)).
    pub channels: Vec<Channel<P, B>>,
    /// Our flag array: at least [`FlagLayout::len`] bytes, 8-aligned, with
    /// local and remote write access, zeroed.
    pub flags: M,
    /// Our data window (peers write and read it).
    pub window: M,
    /// Every rank's flag array, indexed by rank (our own entry is ignored).
    pub peer_flags: Vec<RemoteMemory>,
    /// Every rank's data window, indexed by rank (our own entry is ignored).
    pub peer_windows: Vec<RemoteMemory>,
    /// Default barrier algorithm.
    pub algorithm: BarrierAlgorithm,
    /// What waits do between empty polls.
    pub backoff: B,
    /// The clock the node's waits are measured on (its channels').
    pub clock: StaticClock,
    /// How long a bare wait of the node waits ([`Node::timeout`]).
    pub timeout: Duration,
    /// What the node is built with ([`Components`]); checked here. Messaging into a shared
    /// pool ([`Receive::Shared`]) needs channels on a shared receive queue, and channels on
    /// one need it.
    pub components: Components,
}

impl<P: Provider, M: Region, B: Backoff + Clone> fmt::Debug for NodeParts<P, M, B> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("NodeParts")
            .field("rank", &self.rank)
            .field("world", &self.world)
            .field("channels", &self.channels.len())
            .field("algorithm", &self.algorithm)
            .field("timeout", &self.timeout)
            .field("components", &self.components)
            .finish_non_exhaustive()
    }
}

// A node moves to the thread that will poll it (and so does each of its channels).
#[cfg(feature = "verbs")]
static_assertions::assert_impl_all!(VerbsNode<crate::poll::Spin>: Send);

/// One connected rank. See the [module docs](self).
pub struct Node<P: Provider, M: Region, B: Backoff + Clone> {
    rank: u32,
    world: u32,
    algorithm: BarrierAlgorithm,
    /// Whether a whole-world barrier takes the specialised dissemination path
    /// ([`Node::dissemination_world`]): the algorithm is dissemination and there are no
    /// wake-ups. Kept with the algorithm (wake-ups are chosen at build), so a barrier asks
    /// one question instead of two.
    dissemination_world: bool,
    multi: MultiChannel<P, B>,
    rings: Option<messaging::Rings<M>>,
    barrier_wakeups: Option<wakeups::Wakeups>,
    /// The completion events the back-off sleeps on, if the queues have any.
    wakeup_source: Option<alloc::sync::Arc<dyn crate::poll::Wakeup>>,
    barrier: BarrierState,
    failures: failure::Failures,
    /// The rank between [`Node::readmit_begin`] and [`Node::readmit_finish`].
    readmitting: Option<u32>,
    probe_grace: Duration,
    all: Vec<u32>,
    backoff: B,
    peer_flags: Vec<RemoteMemory>,
    /// Per rank, where a barrier notification to it goes ([`NotifyTo`]): worked out and
    /// checked once, when a rank's flag array becomes known, not on every notification.
    notify_to: Vec<Option<NotifyTo>>,
    peer_windows: Vec<RemoteMemory>,
    flags: M,
    window: M,
    /// Barriers that timed out still waiting for each rank (indexed by rank).
    barrier_timeouts: Vec<u32>,
    clock: StaticClock,
    timeout: Duration,
    /// The members of the barrier [`Node::barrier_start`] began, if a group (room for
    /// `world` ranks made at build, so starting one does not allocate).
    polled: Vec<u32>,
    polled_group: bool,
    components: Components,
}

impl<P: Provider, M: Region, B: Backoff + Clone> Drop for Node<P, M, B> {
    fn drop(&mut self) {
        let Some(rings) = &self.rings else {
            return;
        };
        if rings.channels_unchanged(self.multi.ids()) {
            // Nothing may still receive into the ring memory once it is freed: flush and
            // drain every channel (or abort), whatever dropping the provider would do.
            for c in self.multi.channels() {
                c.settle(true);
            }
        } else {
            // The caller swapped a channel out: it may outlive the node with receives posted
            // into the ring, so the ring memory must never be freed.
            core::mem::forget(self.rings.take());
        }
    }
}

impl<P: Provider, M: Region, B: Backoff + Clone> fmt::Debug for Node<P, M, B> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Node")
            .field("rank", &self.rank)
            .field("world", &self.world)
            .field("algorithm", &self.algorithm)
            .field("poisoned", &self.barrier.is_poisoned())
            .field("failures", &self.failures)
            .finish()
    }
}

struct Transport<'a, P: Provider, M: Region, B: Backoff + Clone> {
    world: u32,
    multi: &'a mut MultiChannel<P, B>,
    flags: &'a M,
    peer_flags: &'a [RemoteMemory],
    notify_to: &'a [Option<NotifyTo>],
    barrier_wakeups: Option<&'a mut wakeups::Wakeups>,
    failures: &'a mut failure::Failures,
    probe_grace: Duration,
}

/// Where a barrier notification to one rank goes: our arrival slot in its flag array and
/// the position of its channel in the node's [`MultiChannel`] (fixed for the node's life:
/// readmission renews a channel in place).
#[derive(Clone, Copy, Debug)]
struct NotifyTo {
    slot: RemoteMemory,
    channel: usize,
}

/// Per rank, where a notification goes; `None` for our own rank (no channel to ourselves).
/// Every other rank's array was checked to hold [`FlagLayout::len`] bytes before it got
/// here, so each slot fits.
fn notify_to<P: Provider, B: Backoff + Clone>(
    me: u32,
    world: u32,
    peer_flags: &[RemoteMemory],
    multi: &MultiChannel<P, B>,
) -> Vec<Option<NotifyTo>> {
    peer_flags
        .iter()
        .enumerate()
        .map(|(r, f)| {
            let channel = multi.position(r as u32)?;
            Some(NotifyTo {
                slot: arrival_slot(me, world, r as u32, f)?,
                channel,
            })
        })
        .collect()
}

/// Rank `me`'s arrival slot in `rank`'s flag array `flags` (none in our own).
pub(crate) fn arrival_slot(
    me: u32,
    world: u32,
    rank: u32,
    flags: &RemoteMemory,
) -> Option<RemoteMemory> {
    FlagLayout::new(world)
        .arrivals(me)
        .filter(|_| rank != me)
        .and_then(|at| flags.slice(at as u64, SLOT_LEN as u64))
}

impl<P: Provider, M: Region, B: Backoff + Clone> Transport<'_, P, M, B> {
    /// `e`, or the failure news it is.
    #[cold]
    #[inline(never)]
    fn news(&mut self, e: BarrierError) -> BarrierError {
        failure::barrier_news(e, self.failures, self.multi, self.peer_flags)
    }
}

fn barrier_error(e: MultiError) -> BarrierError {
    match e {
        MultiError::Peer(p) => BarrierError::Transport {
            rank: p.rank,
            error: p.error,
        },
        MultiError::UnknownRank(r) => BarrierError::RankOutOfRange(r),
        MultiError::Completions(e) => BarrierError::Completions(e),
    }
}

impl<P: Provider, M: Region, B: Backoff + Clone> BarrierTransport for Transport<'_, P, M, B> {
    #[inline(always)]
    fn notify(&mut self, rank: u32, count: u64) -> Result<(), BarrierError> {
        let Some(&Some(NotifyTo { slot, channel })) = self.notify_to.get(rank as usize) else {
            return Err(BarrierError::RankOutOfRange(rank));
        };
        // The ticket is not waited for: a later signaled request (or the drain of a failure)
        // retires it, and failures surface in `progress`.
        let data = FlagLayout::bytes(count);
        // Every error goes through one cold call (which turns it into failure news if it is
        // one): the success path carries no conversion of the large error types.
        if !self.barrier_wakeups.as_ref().is_some_and(|w| w.live) {
            // The channel's own single-request inline post: no rank-naming error wrapper on
            // the way (the error is named here, out of line).
            match self.multi.by_index(channel) {
                Some(c) => match c.post_write_inline(&data, slot) {
                    Ok(_) => Ok(()),
                    Err(error) => Err(self.news(BarrierError::Transport { rank, error })),
                },
                None => Err(BarrierError::RankOutOfRange(rank)),
            }
        } else {
            match self.multi.by_index(channel) {
                Some(c) => match c.post_write_imm_inline(&data, slot, wakeups::WAKE_IMM) {
                    Ok(_) => Ok(()),
                    Err(error) => Err(self.news(BarrierError::Transport { rank, error })),
                },
                None => Err(BarrierError::RankOutOfRange(rank)),
            }
        }
    }

    #[inline]
    fn arrived(&self, rank: u32) -> u64 {
        arrivals(self.flags, self.world, rank)
    }

    #[inline]
    fn progress(&mut self) -> Result<(), BarrierError> {
        if let Err(e) = self.poll_channels() {
            return Err(self.news(e));
        }
        match self.failure() {
            Some(f) => Err(BarrierError::PeerFailed(f)),
            None => Ok(()),
        }
    }

    #[inline]
    fn failure(&mut self) -> Option<crate::failure::Failure> {
        self.failures.news(self.flags, self.multi, self.peer_flags)
    }

    fn probe_grace(&self) -> Duration {
        self.probe_grace
    }
}

/// The transport of the specialised whole-world dissemination start
/// ([`Node::dissemination_world`]): notifications (plain inline writes: no wake-ups) and
/// arrivals, nothing else to borrow. Its errors are the plain ones; the node turns them into
/// the failure news they are once the start has returned (out of line), so no cold path
/// here needs the failure state.
struct Notifier<'a, P: Provider, M: Region, B: Backoff + Clone> {
    world: u32,
    multi: &'a mut MultiChannel<P, B>,
    flags: &'a M,
    notify_to: &'a [Option<NotifyTo>],
}

/// A notification to `rank` failed with `error`.
#[cold]
#[inline(never)]
fn notify_failed(rank: u32, error: ChannelError) -> BarrierError {
    BarrierError::Transport { rank, error }
}

/// The count `rank` last wrote into its arrival slot of `flags` (0 for a rank outside the
/// world: never read for one, the barrier's ranks are the world's).
#[inline(always)]
fn arrivals<M: Region>(flags: &M, world: u32, rank: u32) -> u64 {
    FlagLayout::new(world)
        .arrivals(rank)
        .and_then(|at| flags.load_u64(at))
        .unwrap_or(0)
}

impl<P: Provider, M: Region, B: Backoff + Clone> BarrierTransport for Notifier<'_, P, M, B> {
    #[inline(always)]
    fn notify(&mut self, rank: u32, count: u64) -> Result<(), BarrierError> {
        let Some(&Some(to)) = self.notify_to.get(rank as usize) else {
            return Err(BarrierError::RankOutOfRange(rank));
        };
        match self.multi.by_index(to.channel) {
            Some(c) => match c.post_write_inline(&FlagLayout::bytes(count), to.slot) {
                Ok(_) => Ok(()),
                Err(error) => Err(notify_failed(rank, error)),
            },
            None => Err(BarrierError::RankOutOfRange(rank)),
        }
    }

    #[inline(always)]
    fn arrived(&self, rank: u32) -> u64 {
        arrivals(self.flags, self.world, rank)
    }

    /// Not called by the start it serves; a poll of the channels, errors plain.
    fn progress(&mut self) -> Result<(), BarrierError> {
        self.multi.poll().map(drop).map_err(barrier_error)
    }
}

impl<P: Provider, M: Region, B: Backoff + Clone> Transport<'_, P, M, B> {
    /// One poll of the channels' completions (re-posting wake-up receives).
    #[inline]
    fn poll_channels(&mut self) -> Result<(), BarrierError> {
        let Some(w) = self.barrier_wakeups.as_deref_mut() else {
            return self.multi.poll().map(|_| ()).map_err(barrier_error);
        };
        if let Some((rank, error)) = w.missed.take() {
            return Err(BarrierError::Transport { rank, error });
        }
        let mut first = None;
        self.multi
            .poll_ready(|(pos, rank), r| match r {
                Ok(_) => w.mark(pos),
                Err(error) => {
                    first.get_or_insert(BarrierError::Transport { rank, error });
                }
            })
            .map_err(barrier_error)?;
        w.repost(self.multi);
        first.map_or(Ok(()), Err)
    }
}

impl<P: Provider, M: Region, B: Backoff + Clone> Node<P, M, B> {
    /// Assembles a node from connected channels and registered memory (see [`NodeParts`]);
    /// checks that there is exactly one channel per other rank and that every flag array is
    /// large enough. Allocates (setup).
    pub fn from_parts(parts: NodeParts<P, M, B>) -> Result<Self, SetupError> {
        let NodeParts {
            rank,
            world,
            channels,
            flags,
            window,
            peer_flags,
            peer_windows,
            algorithm,
            backoff,
            clock,
            timeout,
            components,
        } = parts;
        components.check()?;
        if world == 0 || rank >= world || world > crate::wire::MAX_WORLD {
            return Err(SetupError::InvalidWorld { rank, world });
        }
        let bad = |what| Err(SetupError::InvalidArgument { what });
        if channels.len() != world as usize - 1 {
            return bad("a node needs exactly one channel per other rank");
        }
        if channels.iter().any(|c| c.peer() == Some(rank)) {
            return bad("a channel to this node's own rank");
        }
        if peer_flags.len() != world as usize || peer_windows.len() != world as usize {
            return bad("peer flag arrays and windows are indexed by rank");
        }
        let need = flags_len(world);
        if flags.len() < need || !flags.access().contains(FLAG_ACCESS) {
            return bad("the flag array needs FlagLayout::len bytes and local and remote write");
        }
        for (r, f) in peer_flags.iter().enumerate() {
            if r as u32 != rank && (f.len as usize) < need {
                return Err(SetupError::Blob {
                    rank: r as u32,
                    error: NodeBlobError::FlagsTooSmall,
                });
            }
        }
        let mut multi = MultiChannel::new(channels).map_err(|_| SetupError::InvalidArgument {
            what: "every channel must name a distinct peer rank",
        })?;
        if multi.ranks().any(|r| r >= world) {
            return Err(SetupError::InvalidArgument {
                what: "a channel names a rank outside the world",
            });
        }
        let on_srq = multi
            .channels()
            .next()
            .is_some_and(|c| c.provider().srq_capacity() > 0);
        let shared = matches!(components.messaging, Some(Receive::Shared { .. }));
        if on_srq && !shared {
            return bad(
                "the channels share a receive queue: choose messaging into Receive::Shared",
            );
        }
        if shared && !on_srq && world > 1 {
            return bad("Receive::Shared messaging needs channels on a shared receive queue");
        }
        let barrier_wakeups = if components.barrier_wakeups {
            Some(wakeups::Wakeups::post_all(&mut multi)?)
        } else {
            None
        };
        let notify_to = notify_to(rank, world, &peer_flags, &multi);
        Ok(Self {
            rank,
            world,
            algorithm,
            dissemination_world: algorithm == BarrierAlgorithm::Dissemination
                && barrier_wakeups.is_none(),
            multi,
            rings: None,
            barrier_wakeups,
            wakeup_source: None,
            barrier: BarrierState::new(rank, world),
            failures: failure::Failures::new(rank, world, backoff.waker()),
            readmitting: None,
            probe_grace: DEFAULT_PROBE_GRACE,
            all: (0..world).collect(),
            backoff,
            peer_flags,
            notify_to,
            peer_windows,
            flags,
            window,
            barrier_timeouts: alloc::vec![0; world as usize],
            clock,
            timeout,
            polled: Vec::with_capacity(world as usize),
            polled_group: false,
            components,
        })
    }

    /// What the node was built with.
    pub fn components(&self) -> Components {
        self.components
    }

    /// The wake-up source of the node's queues, their completion events (a node built with
    /// `NodeConfig::completion_events`): their [`fd`](crate::poll::Wakeup::fd) is what to
    /// hand `poll(2)`/`epoll` to sleep in an event loop of one's own (arm first; see
    /// [`Wakeup`](crate::poll::Wakeup)).
    pub fn wakeup_source(&self) -> Option<&dyn crate::poll::Wakeup> {
        self.wakeup_source.as_deref()
    }

    /// [`Node::wakeup_source`] as a shared handle, for an event loop that keeps it
    /// (`rverbs_async::TokioEvents` registers its descriptor with tokio's reactor).
    pub fn wakeup_source_shared(&self) -> Option<alloc::sync::Arc<dyn crate::poll::Wakeup>> {
        self.wakeup_source.clone()
    }

    /// The back-off barriers and [`Node::progress_until`] wait with (each channel has a
    /// clone of it).
    pub fn backoff(&self) -> &B {
        &self.backoff
    }

    /// Whether barrier notifications raise completions ([`Components::barrier_wakeups`]).
    pub fn barrier_wakeups(&self) -> bool {
        self.barrier_wakeups.is_some()
    }

    /// Whether barrier notifications carry an immediate yet, so a rank asleep on its
    /// completion events wakes when its peer arrives: wake-ups are on and a barrier over the
    /// whole world completed since (until then notifications are plain writes, which wake
    /// nobody; see [`Components::barrier_wakeups`]).
    pub fn barrier_wakeups_live(&self) -> bool {
        self.barrier_wakeups.as_ref().is_some_and(|w| w.live)
    }

    /// This rank.
    #[inline]
    pub fn rank(&self) -> u32 {
        self.rank
    }

    /// Number of ranks.
    #[inline]
    pub fn world_size(&self) -> u32 {
        self.world
    }

    /// The default barrier algorithm.
    pub fn algorithm(&self) -> BarrierAlgorithm {
        self.algorithm
    }

    /// Sets the default barrier algorithm. Every member of a barrier must use the same one.
    pub fn set_algorithm(&mut self, alg: BarrierAlgorithm) {
        self.algorithm = alg;
        self.dissemination_world =
            alg == BarrierAlgorithm::Dissemination && self.barrier_wakeups.is_none();
    }

    /// Whether a failed barrier poisoned this node (see [`crate::barrier`]).
    pub fn is_poisoned(&self) -> bool {
        self.barrier.is_poisoned()
    }

    /// The failure this node knows of: one it saw, one a peer wrote into its notice slot, or
    /// one raised on its [alarm](Node::failure_alarm). Sticky until the failed rank is
    /// [readmitted](self#when-a-rank-rejoins) (or every rank builds a new node).
    /// Two 8-byte loads when nothing is known; does not allocate.
    ///
    /// Waits of the node check it on their own; call it from loops of your own (a spin on
    /// window memory, say) to learn of a failure elsewhere in the world.
    #[inline]
    pub fn failure(&mut self) -> Option<crate::failure::Failure> {
        self.failures
            .news(&self.flags, &mut self.multi, &self.peer_flags)
    }

    /// Sets how long a barrier waits after its deadline for news of a failure before it reports
    /// a timeout ([`DEFAULT_PROBE_GRACE`]; see [`crate::barrier`]'s "After a failure"). Make it
    /// at least the time your queue pairs take to give up on a dead peer. The same grace bounds
    /// the wait for news after a member refused a notification ([`NodeError::is_refusal`]).
    /// A grace too large for the clock to add (`Duration::MAX`) means those waits never end
    /// without news.
    pub fn set_probe_grace(&mut self, grace: Duration) {
        self.probe_grace = grace;
    }

    /// The [probe grace](Node::set_probe_grace).
    pub fn probe_grace(&self) -> Duration {
        self.probe_grace
    }

    /// A handle another thread can raise a failure with (a session watcher that saw a rank's
    /// connection close, a health check of your own). The node sees it on its next check and
    /// passes it on to every other rank; a node asleep in a blocking wait is woken by it at
    /// once (it wakes the back-off's [waker](Backoff::waker)). News a peer writes into the
    /// flag array raises no completion: a sleeping node sees it when its sleep slice ends
    /// (at most 100 ms under `rverbs_std_shim::WaitPolicy::Block`).
    pub fn failure_alarm(&self) -> FailureAlarm {
        self.failures.alarm().clone()
    }

    /// Tells every rank that `rank` failed because of `error`, if `error` says so, and turns
    /// it into the node's error for `rank`.
    fn channel_failed(&mut self, rank: u32, error: ChannelError) -> NodeError {
        if let Some((failed, cause)) = self.failures.cause_of(rank, &error) {
            self.failures
                .declare(failed, cause, &mut self.multi, &self.peer_flags);
        }
        NodeError::Channel { rank, error }
    }

    /// The channels to every other rank, addressed by rank.
    pub fn multi(&mut self) -> &mut MultiChannel<P, B> {
        &mut self.multi
    }

    /// The channel to `rank`.
    pub fn channel(&mut self, rank: u32) -> Result<&mut Channel<P, B>, NodeError> {
        self.multi
            .channel(rank)
            .map_err(|_| NodeError::UnknownRank(rank))
    }

    /// Waits for a ticket of one of this node's channels (it names its rank), at most the
    /// channel's timeout. Does not allocate.
    pub fn wait(&mut self, t: Ticket) -> Result<Done, NodeError> {
        // A ticket without a rank came from a channel outside any node.
        let rank = t.peer().ok_or(NodeError::ForeignTicket)?;
        match self.channel(rank)?.wait(t) {
            Ok(done) => Ok(done),
            Err(error) => Err(self.channel_failed(rank, error)),
        }
    }

    /// Our data window (peers write into it).
    pub fn window(&self) -> &M {
        &self.window
    }

    /// Our data window, to hand out scatter entries.
    pub fn window_mut(&mut self) -> &mut M {
        &mut self.window
    }

    /// `rank`'s data window.
    pub fn peer_window(&self, rank: u32) -> Option<RemoteMemory> {
        self.peer_windows
            .get(rank as usize)
            .copied()
            .filter(|_| rank != self.rank)
    }

    /// Writes `sges` into `rank`'s window at `offset` and waits. Does not allocate.
    pub fn write_window(
        &mut self,
        rank: u32,
        offset: u64,
        sges: &[Sge<'_>],
    ) -> Result<(), NodeError> {
        let len: u64 = sges.iter().map(|s| u64::from(s.len())).sum();
        let window = self.peer_window(rank).ok_or(NodeError::UnknownRank(rank))?;
        let remote = window
            .slice(offset, len)
            .ok_or(NodeError::WindowOutOfRange { rank, offset, len })?;
        match self.channel(rank)?.write(sges, remote) {
            Ok(()) => Ok(()),
            Err(error) => Err(self.channel_failed(rank, error)),
        }
    }

    /// The clock the node measures its timeouts on: its channels'.
    pub fn clock(&self) -> StaticClock {
        self.clock
    }

    /// How long a bare wait of the node (`barrier`, `barrier_start`, `progress_wait`) waits
    /// before it gives up: [`NodeParts::timeout`] (on a device and on the model, the
    /// channels' [`ChannelConfig::timeout`](crate::channel::ChannelConfig::timeout)) until
    /// [`Node::set_timeout`] changes it.
    pub fn timeout(&self) -> Duration {
        self.timeout
    }

    /// Sets the default timeout of the node's bare waits (see [`Node::timeout`]).
    pub fn set_timeout(&mut self, timeout: Duration) {
        self.timeout = timeout;
    }

    /// Barrier over `members` with the node's algorithm ([`Node::set_algorithm`]), giving
    /// up after the node's [timeout](Node::timeout). Every member must call it with the same
    /// members and algorithm. Does not allocate.
    ///
    /// ```
    /// # use rverbs_core::node::{soft_world, soft_world_bytes, Members};
    /// # use rverbs_core::model::{SoftNet, SoftNetConfig};
    /// # use rverbs_core::{channel::ChannelConfig, params::QpCaps, poll::{Spin, StepClock}};
    /// # static CLOCK: StepClock = StepClock::new(core::time::Duration::from_micros(1));
    /// # let mut arena = vec![0u8; soft_world_bytes(1, 64)];
    /// # let net = SoftNet::new(SoftNetConfig::new(1, QpCaps::queues(16, 16)));
    /// # let cfg = ChannelConfig::default();
    /// # let mut node = soft_world(&net, &mut arena, 64, cfg, Default::default(), Spin, &CLOCK)
    /// #     .unwrap().remove(0);
    /// for step in 0..3 {
    ///     // ... this step's work ...
    ///     node.barrier(Members::World)?;
    /// }
    /// # Ok::<(), rverbs_core::node::NodeError>(())
    /// ```
    pub fn barrier<'a>(&mut self, members: impl Into<Members<'a>>) -> Result<(), NodeError> {
        let timeout = self.timeout;
        self.barrier_timeout(members, timeout)
    }

    /// [`Node::barrier`], giving up after `timeout`. Does not allocate.
    pub fn barrier_timeout<'a>(
        &mut self,
        members: impl Into<Members<'a>>,
        timeout: Duration,
    ) -> Result<(), NodeError> {
        let members = members.into().ranks();
        if members.is_none() && self.dissemination_world {
            return match self.dissemination_world(timeout) {
                Ok(()) => Ok(()),
                Err(e) => Err(self.after_refusal(e, None)),
            };
        }
        let (alg, clock) = (self.algorithm, self.clock);
        if let Err(e) = self.with_barrier(members, |barrier, t, m, backoff| match members {
            None => barrier.run_world(t, m, alg, &clock, timeout, backoff),
            Some(_) => barrier.run(t, m, alg, &clock, timeout, backoff),
        }) {
            return Err(self.after_refusal(e, members));
        }
        self.barrier_completed(members);
        Ok(())
    }

    /// A blocking barrier's error `e`; if a member refused a notification (a remote access
    /// or remote invalid request error), the news that explains it, if it comes within the
    /// [probe grace](Node::set_probe_grace). A refusal is a symptom, not news: a dying
    /// process's registrations go before its queue pairs (rxe refuses writes to a `SIGKILL`ed
    /// process for a moment instead of staying silent), but the caller's own request with a
    /// bad key, failing on the same channel, reads the same. So the node waits, as after a
    /// missed deadline, for news of a member (a session watch's alarm, a peer's notice) and
    /// passes it on; without any, `e` stands, and no live rank is called failed. At most the
    /// probe grace, checking the news on every turn: a barrier whose refusal comes during
    /// the probe after its deadline can so return up to twice the grace after the deadline.
    #[cold]
    #[inline(never)]
    fn after_refusal(&mut self, e: NodeError, members: Option<&[u32]>) -> NodeError {
        if !e.is_refusal() {
            return e;
        }
        let member = |r: u32| members.is_none_or(|m| m.contains(&r));
        let clock = self.clock;
        let until = Deadline::after(clock, self.probe_grace);
        self.backoff.reset();
        loop {
            if let Some(f) = self
                .failures
                .news(&self.flags, &mut self.multi, &self.peer_flags)
            {
                // Only the first news is kept: one about a non-member means none about
                // a member can come.
                return if member(f.rank) {
                    NodeError::Barrier(BarrierError::PeerFailed(f))
                } else {
                    e
                };
            }
            if until.passed(clock) {
                return e;
            }
            self.backoff.snooze_within(&mut || until.remaining(clock));
        }
    }

    /// [`Node::barrier`], giving up at `deadline` (on the node's [clock](Node::clock)).
    /// Does not allocate.
    pub fn barrier_until<'a>(
        &mut self,
        members: impl Into<Members<'a>>,
        deadline: Deadline,
    ) -> Result<(), NodeError> {
        let timeout = deadline.remaining(self.clock);
        self.barrier_timeout(members, timeout)
    }

    /// Starts a barrier over `members` with the node's algorithm without waiting: call
    /// [`Node::barrier_poll`] until it answers `true`. It gives up after the node's
    /// [timeout](Node::timeout). For a thread that has other work while the barrier
    /// completes (and for simulating many ranks on one thread). The node remembers the
    /// members (copied into room made at build), so the poll needs none. Does not allocate.
    pub fn barrier_start<'a>(&mut self, members: impl Into<Members<'a>>) -> Result<(), NodeError> {
        let timeout = self.timeout;
        self.barrier_start_timeout(members, timeout)
    }

    /// [`Node::barrier_start`], giving up after `timeout`. Does not allocate.
    pub fn barrier_start_timeout<'a>(
        &mut self,
        members: impl Into<Members<'a>>,
        timeout: Duration,
    ) -> Result<(), NodeError> {
        let members = members.into().ranks();
        let (alg, clock) = (self.algorithm, self.clock);
        // Remember the members for the polls, unless a barrier is in progress (the start
        // fails then, and the one in progress keeps its own).
        let remember = !self.barrier.is_pending();
        let done = if members.is_none() && self.dissemination_world {
            // Completed or pending alike: `barrier_poll` finishes what is left.
            self.start_dissemination_world(timeout).map(drop)
        } else {
            self.with_barrier(members, |barrier, t, m, _| match members {
                None => barrier.start_world(t, m, alg, &clock, timeout),
                Some(_) => barrier.start(t, m, alg, &clock, timeout),
            })
        };
        if remember && done.is_ok() {
            self.polled.clear();
            if let Some(m) = members {
                // `validate` held: at most `world` distinct ranks, which the room holds.
                self.polled.extend_from_slice(m);
            }
            self.polled_group = members.is_some();
        }
        done
    }

    /// Advances the barrier [`Node::barrier_start`] began, without waiting: `Ok(true)` once
    /// every rank it waits for arrived (and when none is in progress); [`BarrierError::PeerFailed`]
    /// as soon as a member is known to have failed; a timeout error (naming the ranks still
    /// missing) once its deadline and then the [probe grace](Node::set_probe_grace) passed.
    /// Does not allocate.
    pub fn barrier_poll(&mut self) -> Result<bool, NodeError> {
        let clock = self.clock;
        let polled = core::mem::take(&mut self.polled);
        let members = self.polled_group.then_some(&polled[..]);
        let done = self.with_barrier(members, |barrier, t, m, _| match members {
            None => barrier.poll_world(t, m, &clock),
            Some(_) => barrier.poll(t, m, &clock),
        });
        if let Ok(true) = done {
            self.barrier_completed(members);
        }
        self.polled = polled;
        done
    }

    /// [`Node::barrier_timeout`] over the whole world with the dissemination algorithm and
    /// no wake-ups, specialised: the rounds run straight from the barrier's list
    /// ([`BarrierState::start_dissemination_world`]), the transport built once; only a
    /// barrier that has to wait goes on through the general poll loop (deadline, failure
    /// news and probes on every turn, timeouts counted per rank). With wake-ups on, the
    /// general path runs (it re-posts the wake-up receives and makes them live).
    #[inline]
    fn dissemination_world(&mut self, timeout: Duration) -> Result<(), NodeError> {
        match self.start_dissemination_world(timeout) {
            Ok(true) => Ok(()),
            Ok(false) => self.finish_world_barrier(),
            Err(e) => Err(e),
        }
    }

    /// The start of [`Node::dissemination_world`] (and of [`Node::barrier_start`] over the
    /// world with that algorithm): [`BarrierState::start_dissemination_world`] over a
    /// [`Notifier`], whose errors become failure news here, out of line.
    #[inline(always)]
    fn start_dissemination_world(&mut self, timeout: Duration) -> Result<bool, NodeError> {
        debug_assert!(self.barrier_wakeups.is_none());
        let clock = self.clock;
        let Self {
            world,
            multi,
            barrier,
            notify_to,
            flags,
            ..
        } = self;
        let mut t = Notifier {
            world: *world,
            multi,
            flags,
            notify_to,
        };
        match barrier.start_dissemination_world(&mut t, &clock, timeout) {
            Ok(done) => Ok(done),
            Err(e) => Err(self.barrier_news(e)),
        }
    }

    /// `e`, or the failure news it is, as the node's error.
    #[cold]
    #[inline(never)]
    fn barrier_news(&mut self, e: BarrierError) -> NodeError {
        NodeError::Barrier(failure::barrier_news(
            e,
            &mut self.failures,
            &mut self.multi,
            &self.peer_flags,
        ))
    }

    /// The wait of a whole-world barrier [`Node::dissemination_world`] started: the general
    /// poll loop, through [`Node::with_barrier`] (which counts a timeout against each rank
    /// still missing).
    #[inline(never)]
    fn finish_world_barrier(&mut self) -> Result<(), NodeError> {
        let clock = self.clock;
        self.with_barrier(None, |barrier, t, m, backoff| {
            barrier.finish_world(t, m, &clock, backoff)
        })?;
        self.barrier_completed(None);
        Ok(())
    }

    /// After a barrier over `members` (every rank when `None`) completed: a full barrier
    /// proves every rank enabled its wake-ups, so notifications may carry an immediate.
    fn barrier_completed(&mut self, members: Option<&[u32]>) {
        if members.is_none_or(|m| m.len() == self.world as usize) {
            if let Some(w) = &mut self.barrier_wakeups {
                w.live = true;
            }
        }
    }

    /// Lends `f` the barrier state, a transport over the node's channels and flag arrays, the
    /// member list (`members`, or every rank) and the back-off.
    fn with_barrier<T>(
        &mut self,
        members: Option<&[u32]>,
        f: impl FnOnce(
            &mut BarrierState,
            &mut Transport<'_, P, M, B>,
            &[u32],
            &mut B,
        ) -> Result<T, BarrierError>,
    ) -> Result<T, NodeError> {
        let Self {
            world,
            multi,
            barrier,
            all,
            backoff,
            peer_flags,
            notify_to,
            flags,
            barrier_wakeups,
            failures,
            probe_grace,
            barrier_timeouts,
            ..
        } = self;
        if let Some(w) = barrier_wakeups.as_mut() {
            // At every barrier's start, re-post on every channel: a rank that arrives last
            // finishes inside `start` and never reaches the barrier's poll, and completions
            // other calls retired (a channel wait, `multi().poll()`) never reached it either.
            // O(peers) once per barrier keeps at most two barriers' notifications in flight.
            if !barrier.is_pending() {
                w.refill(multi);
            }
        }
        let mut t = Transport {
            world: *world,
            multi,
            flags,
            peer_flags,
            notify_to,
            barrier_wakeups: barrier_wakeups.as_mut(),
            failures,
            probe_grace: *probe_grace,
        };
        let out = f(barrier, &mut t, members.unwrap_or(all), backoff);
        if let Err(BarrierError::Timeout { missing, .. }) = &out {
            for &r in missing {
                if let Some(n) = barrier_timeouts.get_mut(r as usize) {
                    *n = n.saturating_add(1);
                }
            }
        }
        out.map_err(NodeError::Barrier)
    }
}
