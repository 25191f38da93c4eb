//! A deterministic in-memory model of a whole world: `nodes` nodes, any pair of them
//! connected by an RC connection, each node with one protection domain and one send and one
//! receive completion queue shared by all of its queue pairs. What the node layer runs on
//! without a device, from a few nodes under Miri to hundreds in one test process.
//!
//! ```
//! use rverbs_core::completion::{Completion, CompletionKind, WcStatus};
//! use rverbs_core::memory::AccessFlags;
//! use rverbs_core::params::QpCaps;
//! use rverbs_core::model::{SoftNet, SoftNetConfig};
//! use rverbs_core::provider::{CompletionQueue, QueuePair};
//! use rverbs_core::wr::{Opcode, SendFlags, WorkRequest};
//!
//! let caps = QpCaps::queues(16, 16);
//! // Buffers outlive the net: it may touch them for as long as it exists.
//! let (mut src, mut dst) = ([0u8; 16], [0u8; 16]);
//! let net = SoftNet::new(SoftNetConfig::new(3, caps));
//! let src = net.register(0, &mut src, AccessFlags::LOCAL_WRITE).unwrap();
//! // One rkey of node 2, good on every queue pair of node 2.
//! let dst = net
//!     .register(2, &mut dst, AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE)
//!     .unwrap();
//! src.write_from(0, b"hello");
//! let (mut to_2, _at_2) = net.connect(0, 2).unwrap();
//! let mut cq0 = net.send_cq(0).unwrap();
//! let sges = [src.sge(0..5).unwrap()];
//! let wr = WorkRequest {
//!     wr_id: 7,
//!     opcode: Opcode::Write,
//!     flags: SendFlags::SIGNALED,
//!     sges: &sges,
//!     remote: dst.remote(),
//! };
//! // SAFETY: the source region outlives the request, which we poll to completion below.
//! unsafe { to_2.post_send(&[wr]) }.unwrap();
//! let mut wc = [Completion::EMPTY; 4];
//! assert_eq!(cq0.poll(&mut wc).unwrap(), 1);
//! // The node's one send queue carries every queue pair's completions: route by `qp_num`.
//! assert_eq!((wc[0].wr_id, wc[0].qp_num), (7, to_2.qp_num()));
//! assert_eq!((wc[0].status, wc[0].kind), (WcStatus::Success, CompletionKind::Write));
//! let mut got = [0u8; 5];
//! dst.read_into(0, &mut got);
//! assert_eq!(&got, b"hello");
//! ```
//!
//! # Semantics
//! Those of the [two-party model](super#semantics), request by request: the same code
//! executes them (`soft/execute.rs`). In-order execution and completion per queue pair,
//! selective signaling and occupancy until a later signaled completion is polled, inline
//! copies at post, local keys resolved at execution on the posting node, remote keys on the
//! peer node, two-sided operations consuming the peer queue pair's oldest receive, length
//! and protection errors, the error state and its flushes, RNR and transport retries
//! counted in ticks. What differs:
//! - **Memory** belongs to a node, not to a queue pair: [`SoftNet::register`] puts a region
//!   in the node's table, and its keys work on every queue pair of that node (as with one
//!   protection domain per node) and on no other node's.
//! - **Completions** go to the node's shared queues: send-queue completions to its send CQ
//!   ([`SoftNet::send_cq`]), receive completions to its receive CQ ([`SoftNet::recv_cq`]),
//!   each carrying the queue pair's `qp_num`. Polling a completion retires occupancy of the
//!   queue pair it names.
//! - [`SoftNet::kill`] kills a node: all its queue pairs are flushed; peers' requests then
//!   get no answer and fail with [`WcStatus::RetryExceeded`] after `retry_count` ticks, and
//!   their receives are never consumed.
//! - [`SoftNet::stats`] counts per node (all its queue pairs together).
//! - Nodes also have datagram (UD) queue pairs, unicast and multicast, with rules of their
//!   own: [`datagram`].
//!
//! # When work executes
//! Deterministically, inside the calls, and only on the queue pairs a call can affect, so
//! that no call costs more with more nodes:
//! - [`QueuePair::post_send`] runs that queue pair's send queue: a write or read completes
//!   inside the post, a send that finds a receive too; a send with no receive at the peer
//!   waits (RNR), as does any request to a peer that does not answer.
//! - [`QueuePair::post_recv`] runs the send queue of the *peer* queue pair of that
//!   connection, so a send waiting for this receive completes inside the post.
//! - Polling a node's send CQ is one retry "timer tick" for that node's waiting queue pairs:
//!   each node keeps a list of its queue pairs whose send-queue head waits, and a tick walks
//!   that list only (each entry retries its head once). After the first failed attempt,
//!   `rnr_retry` (or `retry_count`) ticks that still find the peer not ready fail the
//!   request with [`WcStatus::RnrRetryExceeded`] (or [`WcStatus::RetryExceeded`]);
//!   `RnrRetry::Infinite` never gives up. Runs by a peer's `post_recv` retry for free, so a
//!   receive posted in time always wins.
//! - Polling a receive CQ and [`QueuePair::set_error`] run nothing else.
//!
//! The two-party model runs both send queues on every call; here a waiting head is retried
//! only by a tick of its node or a receive posted at its peer. The outcome is the same,
//! except that a waiting request whose own memory was deregistered meanwhile fails (with
//! [`WcStatus::LocalProtection`]) at that retry rather than at the next call of any kind.
//!
//! Costs: a post is O(requests + what they execute), a receive post also runs one peer
//! send queue, a send-CQ poll is O(waiting queue pairs of the node + completions polled), a
//! receive-CQ poll O(completions polled). Only [`SoftNet::kill`] (all queue pairs of one
//! node) and setup calls touch more. None of them allocates except [`SoftNet::new`] and
//! [`SoftNet::connect`].
//!
//! # Capacities and completion queues
//! Queue storage is sized from the caps, per queue pair, when [`SoftNet::connect`] creates
//! it: `max_send_wr` headers with `max_send_sge` entries and `max_inline_data` inline bytes
//! each, `max_recv_wr` receives with `max_recv_sge` entries each. Caps are clamped to
//! [`NET_MAX_QUEUE`], [`MAX_SGE`](super::MAX_SGE) and [`NET_MAX_INLINE`].
//!
//! Each node's send and receive CQ holds `cq_capacity` completions (clamped to
//! [`NET_MAX_CQ`]). A completion in a queue belongs to a request that still occupies its
//! queue pair (occupancy ends only when that completion, or a later one of the same queue,
//! is polled), so **a node's send CQ cannot overflow while the node has at most
//! `cq_capacity` send requests outstanding over all its queue pairs**, and likewise its
//! receive CQ for receives. [`SoftNetConfig::new`] picks `cq_capacity` = (nodes − 1) ×
//! the larger queue depth, which makes overflow impossible whatever the node posts (unless
//! that product is clamped). If a queue overflows anyway, every later poll of it fails with
//! `EOVERFLOW` and [`Verb::PollCq`](crate::provider::Verb::PollCq): completions are never
//! lost silently.
//!
//! # Memory and keys
//! As in the [two-party model](super#memory): buffers are borrowed for the net's whole `'m`,
//! the CPU reaches region bytes through volatile copies only, pointers are rebuilt from the
//! registered base (keeping provenance), inline entries with
//! [`core::ptr::with_exposed_provenance`]. Keys pack (generation, kind, slot), scrambled;
//! generations are drawn from one counter for the whole net, so a key names one
//! registration ever: a key of a dropped region, of another node, or an lkey used as an rkey
//! does not resolve. After [`NET_MAX_REGISTRATIONS`] registrations the counter is spent and
//! [`SoftNet::register`] fails with [`SoftError::KeysExhausted`](super::SoftError).
//!
//! # Thread safety
//! None needed: the net uses `RefCell`, and neither it nor its handles are `Send` or `Sync`.

use crate::params::{QpCaps, RetryCount, RnrRetry};

#[cfg(doc)]
use crate::completion::WcStatus;
#[cfg(doc)]
use crate::provider::QueuePair;

mod calls;
pub mod datagram;
mod handles;
mod region;
mod state;
#[cfg(test)]
mod tests;
#[cfg(test)]
mod tests_scale;
#[cfg(test)]
mod tests_srq;
mod world;

pub use datagram::{NetAddress, NetDatagram};
pub use handles::{NetCq, NetQp};
pub use region::NetRegion;
pub use world::SoftNet;

/// Most nodes in one net.
pub const MAX_NODES: u32 = 4096;
/// Deepest send or receive queue of one queue pair.
pub const NET_MAX_QUEUE: u32 = 4096;
/// Largest inline payload in bytes.
pub const NET_MAX_INLINE: u32 = 1024;
/// Most completions one node's completion queue holds.
pub const NET_MAX_CQ: u32 = 1 << 20;
/// Most regions registered with one node at a time.
pub const NET_MAX_REGIONS: usize = 1 << region::SLOT_BITS;
/// Registrations one net can make over its life (each gets a generation of its own).
pub const NET_MAX_REGISTRATIONS: u32 = region::GEN_MASK;

/// The shape of a [`SoftNet`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SoftNetConfig {
    /// Number of nodes (clamped to [`MAX_NODES`]); they are numbered `0..nodes`.
    pub nodes: u32,
    /// Caps of every queue pair (clamped as the
    /// [module docs](self#capacities-and-completion-queues) say).
    pub caps: QpCaps,
    /// Completions each node's send CQ, and each node's receive CQ, holds.
    pub cq_capacity: u32,
    /// Retries after an RNR NAK.
    pub rnr_retry: RnrRetry,
    /// Retries when the peer does not answer.
    pub retry_count: RetryCount,
    /// Regions each node may have registered at a time (clamped to [`NET_MAX_REGIONS`]).
    pub max_regions: usize,
}

impl SoftNetConfig {
    /// `nodes` nodes whose queue pairs have `caps`; completion queues large enough that they
    /// cannot overflow ((nodes − 1) × the larger queue depth, clamped), default retries, and
    /// 16 regions per node.
    pub fn new(nodes: u32, caps: QpCaps) -> Self {
        let depth = caps.max_send_wr.max(caps.max_recv_wr);
        let cq = u64::from(nodes.saturating_sub(1)) * u64::from(depth);
        Self {
            nodes,
            caps,
            cq_capacity: u32::try_from(cq).unwrap_or(u32::MAX).min(NET_MAX_CQ),
            rnr_retry: RnrRetry::default(),
            retry_count: RetryCount::default(),
            max_regions: 16,
        }
    }
}
