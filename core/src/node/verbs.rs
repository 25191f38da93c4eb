//! Building a [`Node`] on a device: the only part of the node layer that needs libibverbs.
//!
//! [`PreparedNode::new`] opens one queue pair per other rank, all completing into one send
//! and one receive completion queue (sized to the sum of their queues, routed by queue-pair
//! number: [`crate::provider::shared`]), and registers the flag array and the data window;
//! [`PreparedNode::blob`] is what to publish; [`PreparedNode::handshake`] connects to every
//! peer's blob and hands the parts to the provider-neutral [`Node::from_parts`].

use alloc::sync::Arc;
use alloc::vec;
use alloc::vec::Vec;
use core::fmt;

use super::{flags_len, Components, Node, NodeError, NodeParts, Receive, SetupError};
use crate::barrier::BarrierAlgorithm;
use crate::channel::{Channel, ChannelConfig};
use crate::memory::{AccessFlags, PageMemory};
use crate::poll::{Backoff, StaticClock, Wakeup};
use crate::provider::shared::{RoutedQp, SharedCqs};
use crate::sge::RemoteMemory;
use crate::verbs::mr::OwnedRegion;
use crate::verbs::{Context, Cq, CqEvents, Pd, PreparedQp, Qp, QpConfig, Srq, VerbsError};
use crate::wire::node::{node_blob_len, NodeBlob, NodeBlobError, ADDRESSED_BLOB_LEN};

use super::ReadmitError;

/// A node on a device: verbs queue pairs on two completion queues the node shares, page
/// memory registered on its protection domain.
pub type VerbsNode<B> = Node<VerbsQp, OwnedRegion, B>;

/// A node's queue pair to one peer: a verbs queue pair on the node's shared completion
/// queues.
pub type VerbsQp = RoutedQp<Qp, Cq>;

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
    /// Create the node's completion queues on a completion channel and
    /// [attach](Backoff::attach) their events to the back-off, so a blocking policy
    /// (`rverbs_std_shim::WaitPolicy::Block`) sleeps until a completion arrives. Off by
    /// default: a pinned, spinning rank has no use for events.
    pub completion_events: bool,
    /// What the node is built with: messaging (and where messages land), barrier wake-ups,
    /// readmission ([`Components`]; the default is messaging into a ring per peer). With
    /// messaging into [`Receive::Shared`] the queue pairs are created on a shared receive
    /// queue of that many receives, and `qp.max_recv_wr` is unused. Every rank chooses alike;
    /// a combination that cannot work is refused by [`PreparedNode::new`], before anything
    /// is created.
    pub components: Components,
}

impl Default for NodeConfig {
    fn default() -> Self {
        Self {
            qp: QpConfig::default(),
            channel: ChannelConfig::default(),
            window_len: 64 * 1024,
            algorithm: BarrierAlgorithm::default(),
            completion_events: false,
            components: Components::default(),
        }
    }
}

/// Zeroed page memory of `len` bytes (rounded up to pages), registered with `access`.
fn page_region(pd: &Pd, len: usize, access: AccessFlags) -> Result<OwnedRegion, SetupError> {
    let mem = PageMemory::zeroed(len).ok_or(SetupError::OutOfMemory { bytes: len })?;
    Ok(pd.register_shared(mem, access)?)
}

/// A node whose queue pairs wait for the peers' blobs.
pub struct PreparedNode<B: Backoff + Clone> {
    rank: u32,
    world: u32,
    cfg: NodeConfig,
    backoff: B,
    clock: StaticClock,
    qps: Vec<Option<PreparedQp>>,
    send_cq: Cq,
    recv_cq: Cq,
    wakeup_source: Option<Arc<dyn Wakeup>>,
    /// The shared receive queue, with [`Receive::Shared`] (the queue pairs keep it alive).
    srq: Option<Srq>,
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
    ) -> Result<Self, SetupError> {
        if world == 0 || rank >= world || world > crate::wire::MAX_WORLD {
            return Err(SetupError::InvalidWorld { rank, world });
        }
        cfg.components.check()?;
        let pd = ctx.alloc_pd()?;
        let mut qp = cfg.qp;
        // Barrier notifications and credit returns are 8-byte inline writes.
        qp.max_inline_data = qp.max_inline_data.max(8);
        // One send and one receive queue for every peer's queue pair, deep enough for all of
        // their queues at once, so neither can overflow.
        let peers = world - 1;
        let depth = |per: u32| {
            per.checked_mul(peers.max(1))
                .ok_or(SetupError::Verbs(VerbsError::InvalidArgument {
                    what: "the completion queues for this world would exceed 2^32 entries",
                }))
        };
        let send_depth = depth(qp.max_send_wr)?;
        // With a shared receive queue, every receive completion is one of its receives.
        let srq = match cfg.components.messaging {
            None | Some(Receive::PerPeer) => None,
            Some(Receive::Shared { slots }) => Some(pd.create_srq(slots, qp.max_recv_sge.max(1))?),
        };
        let recv_depth = match &srq {
            None => depth(qp.max_recv_wr)?,
            Some(s) => s.max_wr(),
        };
        let (send_cq, recv_cq, wakeup_source) = if cfg.completion_events {
            let channel = ctx.create_completion_channel()?;
            let send_cq = ctx.create_cq_on(send_depth, &channel)?;
            let recv_cq = ctx.create_cq_on(recv_depth, &channel)?;
            let events = CqEvents::new(&channel, &[&send_cq, &recv_cq], false)?;
            let wakeup_source: Arc<dyn Wakeup> = Arc::new(events);
            (send_cq, recv_cq, Some(wakeup_source))
        } else {
            (ctx.create_cq(send_depth)?, ctx.create_cq(recv_depth)?, None)
        };
        let mut qps = Vec::with_capacity(world as usize);
        for r in 0..world {
            qps.push(if r == rank {
                None
            } else {
                Some(match &srq {
                    None => pd.create_rc_qp(&send_cq, &recv_cq, &qp)?,
                    Some(s) => pd.create_rc_qp_on_srq(&send_cq, &recv_cq, s, &qp)?,
                })
            });
        }
        let flags = page_region(&pd, flags_len(world), super::FLAG_ACCESS)?;
        let window = page_region(&pd, cfg.window_len.max(64), super::WINDOW_ACCESS)?;
        Ok(Self {
            rank,
            world,
            cfg,
            backoff,
            clock,
            qps,
            send_cq,
            recv_cq,
            wakeup_source,
            srq,
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
    pub fn handshake<T: AsRef<[u8]>>(self, blobs: &[T]) -> Result<VerbsNode<B>, SetupError> {
        if blobs.len() != self.world as usize {
            return Err(SetupError::BlobCount {
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
            let d = NodeBlob::decode(b.as_ref())
                .map_err(|error| SetupError::Blob { rank: r, error })?;
            if d.rank != r || d.world != self.world {
                return Err(SetupError::Blob {
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
        let peers = self.world as usize - 1;
        let mut backoff = self.backoff;
        if let Some(w) = &self.wakeup_source {
            backoff.attach(w);
        }
        let shared = match &self.srq {
            None => SharedCqs::new(self.send_cq, self.recv_cq, peers),
            Some(s) => SharedCqs::with_srq(self.send_cq, self.recv_cq, peers, s.max_wr()),
        };
        let mut channels = Vec::with_capacity(peers);
        let mut peer_flags = vec![RemoteMemory::default(); self.world as usize];
        let mut peer_windows = vec![RemoteMemory::default(); self.world as usize];
        for (r, (qp, d)) in self.qps.into_iter().zip(decoded).enumerate() {
            let (Some(qp), Some(d)) = (qp, d) else {
                continue;
            };
            let rank = r as u32;
            let ep = d.endpoint_for(self.rank).ok_or(SetupError::Blob {
                rank,
                error: NodeBlobError::BadRank(self.rank),
            })?;
            let qp = qp
                .handshake(&ep)
                .map_err(|error| SetupError::Connect { rank, error })?;
            let p = shared
                .add(qp)
                .map_err(|(_, error)| SetupError::SharedCq { rank, error })?;
            let mut ccfg = self.cfg.channel;
            ccfg.rank = Some(rank);
            channels.push(Channel::with_backoff(p, ccfg, backoff.clone(), self.clock));
            peer_flags[r] = d.flags;
            peer_windows[r] = d.window;
        }
        let mut node = Node::from_parts(NodeParts {
            rank: self.rank,
            world: self.world,
            channels,
            flags: self.flags,
            window: self.window,
            peer_flags,
            peer_windows,
            algorithm: self.cfg.algorithm,
            backoff,
            clock: self.clock,
            timeout: self.cfg.channel.timeout,
            components: self.cfg.components,
        })?;
        node.wakeup_source = self.wakeup_source;
        // A request that fails on this side may be the port going down under it: ask the
        // device (only on that error path) so the news names the port, not the peer.
        let (ctx, port) = (node.pd().context().clone(), self.cfg.qp.port);
        node.failures
            .set_link_probe(super::failure::LinkProbe(alloc::sync::Arc::new(
                move || {
                    let down = ctx.query_port(port).is_ok_and(|p| !p.active);
                    down.then_some(crate::failure::FailureCause::PortDown { port })
                },
            )));
        Ok(node)
    }
}

/// A queue pair made for a rank being readmitted, waiting for the new process's endpoint
/// ([`VerbsNode::readmit_prepare`], [`VerbsNode::readmit_connect`]).
#[derive(Debug)]
pub struct ReadmitQp {
    rank: u32,
    qp: PreparedQp,
}

impl ReadmitQp {
    /// The rank it is for.
    pub fn rank(&self) -> u32 {
        self.rank
    }
}

impl<B: Backoff + Clone> VerbsNode<B> {
    /// The protection domain (register more memory with it).
    pub fn pd(&self) -> &Pd {
        self.window.pd()
    }

    /// Step one of readmitting `rank` on a device ([`Node::readmit_begin`], see
    /// [the module docs](super#when-a-rank-rejoins)), then a new queue pair for the new
    /// process, made with `qp` (the settings every queue pair of this node was made with) on
    /// the node's protection domain and completion queues. Returns it and the bytes to send
    /// the new process: this node's endpoint for it, flag array and window (the addressed
    /// form of [`crate::wire::node`], which [`PreparedNode::handshake`] takes).
    pub fn readmit_prepare(
        &mut self,
        rank: u32,
        qp: &QpConfig,
    ) -> Result<(ReadmitQp, [u8; ADDRESSED_BLOB_LEN]), NodeError> {
        self.readmit_begin(rank)?;
        let mut cfg = *qp;
        // Barrier notifications and credit returns are 8-byte inline writes.
        cfg.max_inline_data = cfg.max_inline_data.max(8);
        let pd = self.window.pd();
        let made = self
            .multi
            .channel(rank)
            .map_err(|_| NodeError::UnknownRank(rank))?
            .provider()
            .with_cqs(|send, recv| pd.create_rc_qp(send, recv, &cfg))
            .ok_or(NodeError::Readmit {
                rank,
                error: ReadmitError::QueuePair(crate::provider::shared::SharedCqError::Busy),
            })?
            .map_err(|error| NodeError::Readmit {
                rank,
                error: ReadmitError::Verbs(error),
            })?;
        let blob = NodeBlob::encode_addressed(
            self.rank,
            self.world,
            rank,
            made.endpoint(),
            self.flags.remote(),
            self.window.remote(),
        )
        .map_err(|error| NodeError::Readmit {
            rank,
            error: ReadmitError::Blob(error),
        })?;
        Ok((ReadmitQp { rank, qp: made }, blob))
    }

    /// Step two of readmitting a rank on a device: connects `prepared` to the endpoint the
    /// new process made for this rank in `blob` (its node blob, full or addressed to this
    /// rank), then [`Node::readmit_finish`]. Call it once every other survivor took step one
    /// (the exchange of blobs is that round); start no barrier before every rank took step
    /// two.
    pub fn readmit_connect(&mut self, prepared: ReadmitQp, blob: &[u8]) -> Result<(), NodeError> {
        let rank = prepared.rank;
        let blob_error = |error| NodeError::Readmit {
            rank,
            error: ReadmitError::Blob(error),
        };
        let d = NodeBlob::decode(blob).map_err(blob_error)?;
        if d.world != self.world {
            return Err(blob_error(NodeBlobError::WorldMismatch {
                expected: self.world,
                got: d.world,
            }));
        }
        if d.rank != rank {
            return Err(blob_error(NodeBlobError::BadRank(d.rank)));
        }
        let ep = d
            .endpoint_for(self.rank)
            .ok_or(blob_error(NodeBlobError::BadAddressee(self.rank)))?;
        let qp = prepared
            .qp
            .handshake(&ep)
            .map_err(|error| NodeError::Readmit {
                rank,
                error: ReadmitError::Connect(error),
            })?;
        self.readmit_finish(rank, qp, d.flags, d.window)
    }

    /// Starts messaging with a ring of `slots` receive buffers of `slot_size` bytes per
    /// peer, in page memory registered on the node's protection domain (see
    /// [`Node::start_messaging_in`]); on a node built with [`Receive::Shared`], with one
    /// pool of `slots` buffers for all peers. Allocates (setup).
    ///
    /// ```no_run
    /// # fn f(ctx: &rverbs_core::verbs::Context, blobs: &[Vec<u8>]) -> Result<(), rverbs_core::node::SetupError> {
    /// use rverbs_core::node::{NodeConfig, PreparedNode, Receive};
    /// use rverbs_core::poll::{Spin, StepClock};
    ///
    /// static CLOCK: StepClock = StepClock::new(core::time::Duration::from_micros(1));
    /// let (rank, world) = (0, 64);
    /// let mut cfg = NodeConfig::default();
    /// // 256 receive buffers for all 63 peers (4 credits each), not 63 rings.
    /// cfg.components.messaging = Some(Receive::Shared { slots: 256 });
    /// let prepared = PreparedNode::new(ctx, rank, world, cfg, Spin, &CLOCK)?;
    /// let mut node = prepared.handshake(blobs)?;
    /// node.start_messaging(256, 4096)?;
    /// assert_eq!(node.receive_memory(), 256 * 4096);
    /// # Ok(()) }
    /// ```
    pub fn start_messaging(&mut self, slots: usize, slot_size: usize) -> Result<(), SetupError> {
        let peers = if self.shared_receive_slots() > 0 {
            1
        } else {
            self.world as usize - 1
        };
        let len = peers
            .max(1)
            .checked_mul(slots)
            .and_then(|n| n.checked_mul(slot_size))
            .ok_or(SetupError::InvalidArgument {
                what: "ring size overflows",
            })?;
        if len == 0 {
            return Err(SetupError::InvalidArgument {
                what: "messaging needs at least one slot of at least one byte",
            });
        }
        let region = page_region(self.window.pd(), len, AccessFlags::LOCAL_WRITE)?;
        self.start_messaging_in(region, slots, slot_size)
    }
}
