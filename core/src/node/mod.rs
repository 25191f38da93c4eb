//! [`Node`]: one rank of a connected world — a [`MultiChannel`] to every other rank, a
//! registered data window every peer can write, and barriers.
//!
//! Lifecycle: [`PreparedNode::new`] (open queue pairs, register memory) → [`PreparedNode::blob`]
//! (bytes to publish; see [`crate::wire::node`]) → exchange blobs out of band (for example
//! with `rverbs-bootstrap`) → [`PreparedNode::handshake`] → [`Node`]. After that nothing
//! allocates: barriers, window writes and channel operations reuse what setup made.

mod messaging;

pub use messaging::Event;

use alloc::vec;
use alloc::vec::Vec;
use core::fmt;
use core::time::Duration;

use crate::barrier::{BarrierAlgorithm, BarrierError, BarrierState, BarrierTransport};
use crate::channel::{Channel, ChannelConfig, ChannelError, Done, Ticket};
use crate::memory::PageMemory;
use crate::multi::{MultiChannel, MultiError};
use crate::poll::{Backoff, Clock, StaticClock};
use crate::provider::verbs::{PreparedVerbs, VerbsProvider};
use crate::sge::{RemoteMemory, Sge};
use crate::verbs::mr::OwnedRegion;
use crate::verbs::{AccessFlags, Context, Pd, QpConfig, VerbsError};
use crate::wire::node::{node_blob_len, NodeBlob, NodeBlobError};

/// Node settings.
#[derive(Clone, Copy, Debug)]
#[non_exhaustive]
pub struct NodeConfig {
    /// Queue-pair knobs for every peer connection.
    pub qp: QpConfig,
    /// Channel settings for every peer.
    pub channel: ChannelConfig,
    /// Bytes of the data window peers may write into (0 for none; rounded up to a page).
    pub window_len: usize,
    /// Default barrier algorithm.
    pub algorithm: BarrierAlgorithm,
}

impl Default for NodeConfig {
    fn default() -> Self {
        Self {
            qp: QpConfig::default(),
            channel: ChannelConfig::default(),
            window_len: 64 * 1024,
            algorithm: BarrierAlgorithm::default(),
        }
    }
}

/// Why building or connecting a node failed.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum NodeError {
    /// A verb failed.
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
    Connect {
        /// The peer.
        rank: u32,
        /// The verb error.
        error: VerbsError,
    },
    /// The rank is not below the world size, or the world size is 0 or above
    /// [`MAX_WORLD`](crate::wire::MAX_WORLD).
    InvalidWorld {
        /// This rank.
        rank: u32,
        /// The world size.
        world: u32,
    },
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
    /// The allocator had no memory for a region of this many bytes.
    OutOfMemory {
        /// Bytes asked for.
        bytes: usize,
    },
    /// [`Node::start_messaging`] was called twice.
    MessagingStarted,
    /// [`Node::progress`] before [`Node::start_messaging`].
    MessagingNotStarted,
    /// An argument is out of range; nothing was changed.
    InvalidArgument {
        /// What is wrong.
        what: &'static str,
    },
    /// A barrier failed.
    Barrier(BarrierError),
    /// A channel operation failed.
    Channel {
        /// The peer.
        rank: u32,
        /// The error.
        error: ChannelError,
    },
}

impl fmt::Display for NodeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Verbs(e) => write!(f, "{e}"),
            Self::Blob { rank, error } => write!(f, "endpoint blob of rank {rank}: {error}"),
            Self::BlobCount { expected, got } => {
                write!(f, "{got} endpoint blobs for a world of {expected}")
            }
            Self::Connect { rank, error } => write!(f, "connecting to rank {rank}: {error}"),
            Self::InvalidWorld { rank, world } => write!(
                f,
                "rank {rank} of a world of {world}: the rank must be below the world size, \
                 which must be 1 to {}",
                crate::wire::MAX_WORLD
            ),
            Self::UnknownRank(r) => write!(f, "no peer with rank {r}"),
            Self::WindowOutOfRange { rank, offset, len } => write!(
                f,
                "{len} bytes at offset {offset} do not fit the window of rank {rank}"
            ),
            Self::ProgressTimedOut => f.write_str("progress_until reached its deadline"),
            Self::OutOfMemory { bytes } => write!(f, "no memory for a region of {bytes} bytes"),
            Self::MessagingStarted => f.write_str("messaging has already started"),
            Self::MessagingNotStarted => f.write_str("messaging has not started"),
            Self::InvalidArgument { what } => write!(f, "invalid argument: {what}"),
            Self::Barrier(e) => write!(f, "{e}"),
            Self::Channel { rank, error } => write!(f, "rank {rank}: {error}"),
        }
    }
}

impl core::error::Error for NodeError {}

impl From<VerbsError> for NodeError {
    fn from(e: VerbsError) -> Self {
        Self::Verbs(e)
    }
}

impl From<BarrierError> for NodeError {
    fn from(e: BarrierError) -> Self {
        Self::Barrier(e)
    }
}

/// Zeroed page memory of `len` bytes (rounded up to pages), registered with `access`.
pub(super) fn page_region(
    pd: &Pd,
    len: usize,
    access: AccessFlags,
) -> Result<OwnedRegion, NodeError> {
    let mem = PageMemory::zeroed(len).ok_or(NodeError::OutOfMemory { bytes: len })?;
    Ok(pd.register_shared(mem, access)?)
}

const FLAG_ACCESS: AccessFlags = AccessFlags::LOCAL_WRITE.union(AccessFlags::REMOTE_WRITE);
const WINDOW_ACCESS: AccessFlags = AccessFlags::LOCAL_WRITE
    .union(AccessFlags::REMOTE_WRITE)
    .union(AccessFlags::REMOTE_READ);

/// A node whose queue pairs wait for the peers' blobs.
pub struct PreparedNode<B: Backoff + Clone> {
    rank: u32,
    world: u32,
    cfg: NodeConfig,
    backoff: B,
    clock: StaticClock,
    pd: Pd,
    qps: Vec<Option<PreparedVerbs>>,
    flags: OwnedRegion,
    window: OwnedRegion,
}

impl<B: Backoff + Clone> fmt::Debug for PreparedNode<B> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PreparedNode")
            .field("rank", &self.rank)
            .field("world", &self.world)
            .finish()
    }
}

impl<B: Backoff + Clone> PreparedNode<B> {
    /// Creates one queue pair per other rank and registers the flag array and data window.
    /// `backoff` is cloned into every channel and used by barriers; every channel measures
    /// its timeouts ([`ChannelConfig::timeout`]) on `clock`.
    pub fn new(
        ctx: &Context,
        rank: u32,
        world: u32,
        cfg: NodeConfig,
        backoff: B,
        clock: StaticClock,
    ) -> Result<Self, NodeError> {
        if world == 0 || rank >= world || world > crate::wire::MAX_WORLD {
            return Err(NodeError::InvalidWorld { rank, world });
        }
        let pd = ctx.alloc_pd()?;
        let mut qp = cfg.qp;
        // Barrier notifications are 8-byte inline writes.
        qp.max_inline_data = qp.max_inline_data.max(8);
        let mut qps = Vec::with_capacity(world as usize);
        for r in 0..world {
            qps.push(if r == rank {
                None
            } else {
                Some(PreparedVerbs::new(ctx, &pd, &qp)?)
            });
        }
        let flags = page_region(&pd, 8 * world as usize, FLAG_ACCESS)?;
        let window = page_region(&pd, cfg.window_len.max(64), WINDOW_ACCESS)?;
        Ok(Self {
            rank,
            world,
            cfg,
            backoff,
            clock,
            pd,
            qps,
            flags,
            window,
        })
    }

    /// The bytes to publish to every other rank.
    pub fn blob(&self) -> Vec<u8> {
        let mut out = vec![0u8; node_blob_len(self.world)];
        let ok = NodeBlob::encode_into(
            &mut out,
            self.rank,
            self.world,
            |r| match &self.qps[r as usize] {
                Some(q) => q.endpoint(),
                None => unreachable!("the encoder skips this rank's own slot"),
            },
            self.flags.remote(),
            self.window.remote(),
        );
        debug_assert!(ok.is_ok(), "rank and world were validated in new()");
        out
    }

    /// Connects to every peer; `blobs[r]` is rank `r`'s blob (our own entry is ignored).
    pub fn handshake<T: AsRef<[u8]>>(self, blobs: &[T]) -> Result<Node<B>, NodeError> {
        if blobs.len() != self.world as usize {
            return Err(NodeError::BlobCount {
                expected: self.world,
                got: blobs.len(),
            });
        }
        let mut decoded = Vec::with_capacity(blobs.len());
        for (r, b) in blobs.iter().enumerate() {
            let r = r as u32;
            if r == self.rank {
                decoded.push(None);
                continue;
            }
            let d =
                NodeBlob::decode(b.as_ref()).map_err(|error| NodeError::Blob { rank: r, error })?;
            if d.rank != r || d.world != self.world {
                return Err(NodeError::Blob {
                    rank: r,
                    error: if d.world != self.world {
                        NodeBlobError::WorldMismatch {
                            expected: self.world,
                            got: d.world,
                        }
                    } else {
                        NodeBlobError::BadRank(d.rank)
                    },
                });
            }
            decoded.push(Some(d));
        }
        let mut chans = Vec::with_capacity(self.world as usize - 1);
        let mut peer_flags = vec![RemoteMemory::default(); self.world as usize];
        let mut peer_windows = vec![RemoteMemory::default(); self.world as usize];
        for (r, (qp, d)) in self.qps.into_iter().zip(decoded).enumerate() {
            let (Some(qp), Some(d)) = (qp, d) else {
                continue;
            };
            let ep = d.endpoint_for(self.rank).ok_or(NodeError::Blob {
                rank: r as u32,
                error: NodeBlobError::BadRank(self.rank),
            })?;
            let p = qp.handshake(&ep).map_err(|error| NodeError::Connect {
                rank: r as u32,
                error,
            })?;
            let mut ccfg = self.cfg.channel;
            ccfg.peer = Some(r as u32);
            chans.push(Channel::with_backoff(
                p,
                ccfg,
                self.backoff.clone(),
                self.clock,
            ));
            peer_flags[r] = d.flags;
            peer_windows[r] = d.window;
        }
        Ok(Node {
            rank: self.rank,
            world: self.world,
            algorithm: self.cfg.algorithm,
            multi: MultiChannel::new(chans).map_err(|_| NodeError::InvalidWorld {
                rank: self.rank,
                world: self.world,
            })?,
            rings: None,
            barrier: BarrierState::new(self.rank, self.world),
            all: (0..self.world).collect(),
            backoff: self.backoff,
            peer_flags,
            peer_windows,
            flags: self.flags,
            window: self.window,
            pd: self.pd,
        })
    }
}

// A node moves to the thread that will poll it (and so does each of its channels).
static_assertions::assert_impl_all!(Node<crate::poll::Spin>: Send);
static_assertions::assert_impl_all!(Channel<VerbsProvider>: Send);

/// One connected rank. See the [module docs](self).
pub struct Node<B: Backoff + Clone> {
    rank: u32,
    world: u32,
    algorithm: BarrierAlgorithm,
    multi: MultiChannel<VerbsProvider, B>,
    // After `multi`: the channels' queue pairs are destroyed before the ring memory is freed.
    rings: Option<messaging::Rings>,
    barrier: BarrierState,
    all: Vec<u32>,
    backoff: B,
    peer_flags: Vec<RemoteMemory>,
    peer_windows: Vec<RemoteMemory>,
    flags: OwnedRegion,
    window: OwnedRegion,
    pd: Pd,
}

impl<B: Backoff + Clone> Drop for Node<B> {
    fn drop(&mut self) {
        // The fields drop next, the channels before the ring memory. If the caller swapped a
        // channel out, that channel may outlive the node with receives posted into the ring:
        // then the ring memory must never be freed.
        if let Some(rings) = &self.rings {
            if !rings.channels_unchanged(self.multi.ids()) {
                core::mem::forget(self.rings.take());
            }
        }
    }
}

impl<B: Backoff + Clone> fmt::Debug for Node<B> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Node")
            .field("rank", &self.rank)
            .field("world", &self.world)
            .field("algorithm", &self.algorithm)
            .field("poisoned", &self.barrier.is_poisoned())
            .finish()
    }
}

struct Transport<'a, B: Backoff + Clone> {
    me: u32,
    multi: &'a mut MultiChannel<VerbsProvider, B>,
    flags: &'a OwnedRegion,
    peer_flags: &'a [RemoteMemory],
}

/// The rank of the channel at position `peer` of the node's list (ranks in order, without
/// this node's own).
#[inline]
pub(super) fn rank_of(me: u32, peer: usize) -> u32 {
    if (peer as u32) < me {
        peer as u32
    } else {
        peer as u32 + 1
    }
}

fn barrier_error(e: MultiError) -> BarrierError {
    match e {
        MultiError::Peer(p) => BarrierError::Transport {
            rank: p.rank,
            error: p.error,
        },
        MultiError::UnknownRank(r) => BarrierError::RankOutOfRange(r),
        // Node builds its MultiChannel itself from one channel per rank: neither can happen.
        MultiError::ChannelWithoutRank | MultiError::DuplicateRank(_) => {
            BarrierError::RankOutOfRange(u32::MAX)
        }
    }
}

impl<B: Backoff + Clone> BarrierTransport for Transport<'_, B> {
    #[inline]
    fn notify(&mut self, rank: u32, count: u64) -> Result<(), BarrierError> {
        let slot = self
            .peer_flags
            .get(rank as usize)
            .and_then(|f| f.slice(u64::from(self.me) * 8, 8))
            .ok_or(BarrierError::RankOutOfRange(rank))?;
        // The ticket is not waited for: a later signaled request (or the drain of a failure)
        // retires it, and failures surface in `progress`.
        self.multi
            .post_write_inline(rank, &count.to_le_bytes(), slot)
            .map(|_| ())
            .map_err(barrier_error)
    }

    #[inline]
    fn arrived(&self, rank: u32) -> u64 {
        self.flags.load_u64(rank as usize * 8).unwrap_or(0)
    }

    #[inline]
    fn progress(&mut self) -> Result<(), BarrierError> {
        self.multi.poll().map(|_| ()).map_err(barrier_error)
    }
}

impl<B: Backoff + Clone> Node<B> {
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

    /// The protection domain (register more memory with it).
    pub fn pd(&self) -> &Pd {
        &self.pd
    }

    /// The default barrier algorithm.
    pub fn algorithm(&self) -> BarrierAlgorithm {
        self.algorithm
    }

    /// Sets the default barrier algorithm. Every member of a barrier must use the same one.
    pub fn set_algorithm(&mut self, alg: BarrierAlgorithm) {
        self.algorithm = alg;
    }

    /// Whether a failed barrier poisoned this node (see [`crate::barrier`]).
    pub fn is_poisoned(&self) -> bool {
        self.barrier.is_poisoned()
    }

    /// The channels to every other rank, addressed by rank.
    pub fn multi(&mut self) -> &mut MultiChannel<VerbsProvider, B> {
        &mut self.multi
    }

    /// The channel to `rank`.
    pub fn channel(&mut self, rank: u32) -> Result<&mut Channel<VerbsProvider, B>, NodeError> {
        self.multi
            .channel(rank)
            .map_err(|_| NodeError::UnknownRank(rank))
    }

    /// Posts an inline send of `data` to `rank` (no registered memory; at most the QP's
    /// inline limit) and returns its ticket without waiting: the lowest-latency send. Does
    /// not allocate.
    pub fn post_send_inline(&mut self, rank: u32, data: &[u8]) -> Result<Ticket, NodeError> {
        self.channel(rank)?
            .post_send_inline(data)
            .map_err(|error| NodeError::Channel { rank, error })
    }

    /// Waits for a ticket of one of this node's channels (it names its rank), at most the
    /// channel's timeout. Does not allocate.
    pub fn wait(&mut self, t: Ticket) -> Result<Done, NodeError> {
        let rank = t.peer().unwrap_or(u32::MAX);
        self.channel(rank)?
            .wait(t)
            .map_err(|error| NodeError::Channel { rank, error })
    }

    /// Our data window (peers write into it).
    pub fn window(&self) -> &OwnedRegion {
        &self.window
    }

    /// Our data window, to hand out scatter entries.
    pub fn window_mut(&mut self) -> &mut OwnedRegion {
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
        self.channel(rank)?
            .write(sges, remote)
            .map_err(|error| NodeError::Channel { rank, error })
    }

    /// Barrier over all ranks with the default algorithm. Does not allocate.
    pub fn barrier<C: Clock>(&mut self, clock: &C, timeout: Duration) -> Result<(), NodeError> {
        let alg = self.algorithm;
        self.run_barrier(None, alg, clock, timeout)
    }

    /// Barrier over `members` (sorted, no repeats, containing this rank) with `alg`.
    /// Every member must call it with the same list and algorithm. Does not allocate.
    pub fn barrier_group<C: Clock>(
        &mut self,
        members: &[u32],
        alg: BarrierAlgorithm,
        clock: &C,
        timeout: Duration,
    ) -> Result<(), NodeError> {
        self.run_barrier(Some(members), alg, clock, timeout)
    }

    /// Runs a barrier over `members`, or over every rank when `None`.
    fn run_barrier<C: Clock>(
        &mut self,
        members: Option<&[u32]>,
        alg: BarrierAlgorithm,
        clock: &C,
        timeout: Duration,
    ) -> Result<(), NodeError> {
        let Self {
            rank,
            multi,
            barrier,
            all,
            backoff,
            peer_flags,
            flags,
            ..
        } = self;
        let mut t = Transport {
            me: *rank,
            multi,
            flags,
            peer_flags,
        };
        barrier
            .run(&mut t, members.unwrap_or(all), alg, clock, timeout, backoff)
            .map_err(NodeError::Barrier)
    }
}
