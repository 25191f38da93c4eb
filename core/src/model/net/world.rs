//! [`SoftNet`]: setup (nodes, memory, connections, completion queues), faults and counters.

use core::cell::RefCell;
use core::fmt;
use core::marker::PhantomData;

#[cfg(doc)]
use crate::completion::WcStatus;
use crate::params::QpCaps;

use super::super::execute::Limits;
use super::super::region::{check_registration, register_in};
use super::super::{AccessFlags, SoftError, SoftStats, MAX_SGE};
use super::calls::NetState;
use super::handles::{CqKind, NetCq, NetQp};
use super::region::{net_key, NetRegion, GEN_MASK};
use super::state::{SrqState, World, QPN_BASE};
use super::{SoftNetConfig, MAX_NODES, NET_MAX_CQ, NET_MAX_INLINE, NET_MAX_QUEUE, NET_MAX_REGIONS};

/// A marker invariant in `'m` that also says "holds `&'m mut [u8]`".
type Invariant<'m> = PhantomData<fn(&'m mut [u8]) -> &'m mut [u8]>;

/// A world of nodes connected pairwise by in-memory RC queue pairs. See the
/// [module docs](super).
///
/// `'m` is the lifetime of the memory registered with it: every registered buffer stays
/// borrowed for as long as the net is in use.
pub struct SoftNet<'m> {
    /// `pub(super)` for the unit tests, which set the key generation counter.
    pub(super) state: RefCell<NetState>,
    nodes: u32,
    caps: QpCaps,
    cq_capacity: u32,
    /// Invariant in `'m`: shortening it would let a shorter-lived buffer be registered.
    _mem: Invariant<'m>,
}

impl fmt::Debug for SoftNet<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let st = self.state.borrow();
        f.debug_struct("SoftNet")
            .field("nodes", &self.nodes)
            .field("caps", &self.caps)
            .field("cq_capacity", &self.cq_capacity)
            .field("limits", &st.world.limits)
            .field("connections", &(st.world.qps.len() / 2))
            .finish()
    }
}

impl<'m> SoftNet<'m> {
    /// A net of `cfg.nodes` nodes, none connected yet, with their region tables and
    /// completion queues. Allocates (as does [`SoftNet::connect`]; nothing else does).
    pub fn new(cfg: SoftNetConfig) -> Self {
        let c = cfg.caps;
        let caps = QpCaps {
            max_send_wr: c.max_send_wr.min(NET_MAX_QUEUE),
            max_recv_wr: c.max_recv_wr.min(NET_MAX_QUEUE),
            max_send_sge: c.max_send_sge.min(MAX_SGE as u32),
            max_recv_sge: c.max_recv_sge.min(MAX_SGE as u32),
            max_inline_data: c.max_inline_data.min(NET_MAX_INLINE),
        };
        let nodes = cfg.nodes.min(MAX_NODES);
        let cq_capacity = cfg.cq_capacity.min(NET_MAX_CQ);
        let world = World::new(
            nodes,
            caps,
            Limits::new(cfg.rnr_retry, cfg.retry_count),
            cq_capacity,
            cfg.max_regions.min(NET_MAX_REGIONS),
        );
        Self {
            state: RefCell::new(NetState::new(world)),
            nodes,
            caps,
            cq_capacity,
            _mem: PhantomData,
        }
    }

    /// Number of nodes (after clamping).
    pub fn nodes(&self) -> u32 {
        self.nodes
    }

    /// The caps every queue pair has (after clamping).
    pub fn caps(&self) -> QpCaps {
        self.caps
    }

    /// Completions each node's send CQ, and each receive CQ, holds (after clamping).
    pub fn cq_capacity(&self) -> u32 {
        self.cq_capacity
    }

    /// Registers `buf` with `node`'s protection domain: its keys work on every queue pair
    /// of `node`. The region is deregistered when dropped; the buffer stays borrowed for the
    /// net's `'m` regardless (see the [module docs](super#memory-and-keys)).
    pub fn register(
        &self,
        node: u32,
        buf: &'m mut [u8],
        access: AccessFlags,
    ) -> Result<NetRegion<'_>, SoftError> {
        check_registration(buf.len(), access)?;
        let mut st = self.state.borrow_mut();
        let w = &mut st.world;
        let n = w
            .nodes
            .get_mut(node as usize)
            .ok_or(SoftError::NoSuchNode)?;
        let next_gen = &mut w.next_gen;
        let (slot, reg) = register_in(
            &mut n.regions,
            buf,
            access,
            |_| {
                let gen = *next_gen;
                if gen == 0 || gen > GEN_MASK {
                    return Err(SoftError::KeysExhausted);
                }
                *next_gen = gen + 1;
                Ok(gen)
            },
            net_key,
        )?;
        Ok(NetRegion {
            state: &self.state,
            node,
            slot,
            reg,
        })
    }

    /// Connects nodes `a` and `b`: `a`'s end and `b`'s end, each the only handle to its
    /// queue pair. `None` if a node does not exist, `a == b`, or the two are connected
    /// already (once per unordered pair: two handles to one queue pair would let two owners
    /// take each other's completions). Allocates the queues of both ends.
    pub fn connect(&self, a: u32, b: u32) -> Option<(NetQp<'_>, NetQp<'_>)> {
        let q = self.state.borrow_mut().world.connect(a, b)?;
        Some((
            NetQp::new(&self.state, q, a, b, self.caps),
            NetQp::new(&self.state, q + 1, b, a, self.caps),
        ))
    }

    /// Gives `node` a shared receive queue of `depth` receives (clamped to 1 ..=
    /// [`NET_MAX_QUEUE`]) with `max_recv_sge` entries each: every queue pair of `node`
    /// connected from now on takes its receives from it (posted with
    /// [`QueuePair::post_srq_recv`](crate::provider::QueuePair::post_srq_recv) on any of
    /// them; its own receive queue refuses posts), and their receive completions still go
    /// to the node's receive CQ with their `qp_num`. Returns the depth, or `None` if the
    /// node does not exist, has one already, or has queue pairs already. Allocates.
    ///
    /// A send that finds the shared queue empty waits (RNR) like one that finds a queue
    /// pair's receive queue empty; posting to the shared queue runs nothing, so the send is
    /// retried at its node's next tick. Moving a queue pair to the error state flushes none
    /// of the shared queue's receives.
    pub fn create_srq(&self, node: u32, depth: u32) -> Option<u32> {
        let mut st = self.state.borrow_mut();
        let nsge = st.world.caps.max_recv_sge;
        let n = st.world.nodes.get_mut(node as usize)?;
        if n.srq.is_some() || !n.qps.is_empty() {
            return None;
        }
        let depth = depth.clamp(1, NET_MAX_QUEUE);
        n.srq = Some(SrqState::new(depth, nsge));
        Some(depth)
    }

    /// Receives posted to `node`'s shared receive queue and not yet taken by a message
    /// (0 without one).
    pub fn srq_posted(&self, node: u32) -> u32 {
        let st = self.state.borrow();
        st.world
            .nodes
            .get(node as usize)
            .and_then(|n| n.srq.as_ref())
            .map_or(0, |s| s.ring.len)
    }

    /// The send completion queue of `node`, which every send-queue completion of its queue
    /// pairs goes to; once (`None` on a second call, or if the node does not exist).
    pub fn send_cq(&self, node: u32) -> Option<NetCq<'_>> {
        self.take_cq(node, CqKind::Send)
    }

    /// The receive completion queue of `node`, which every receive completion of its queue
    /// pairs goes to; once (`None` on a second call, or if the node does not exist).
    pub fn recv_cq(&self, node: u32) -> Option<NetCq<'_>> {
        self.take_cq(node, CqKind::Recv)
    }

    fn take_cq(&self, node: u32, kind: CqKind) -> Option<NetCq<'_>> {
        let mut st = self.state.borrow_mut();
        let n = st.world.nodes.get_mut(node as usize)?;
        let cq = match kind {
            CqKind::Send => &mut n.send_cq,
            CqKind::Recv => &mut n.recv_cq,
        };
        if cq.taken {
            return None;
        }
        cq.taken = true;
        let life = n.life;
        Some(NetCq::new(&self.state, node, life, kind, self.cq_capacity))
    }

    /// Simulates the death of `node`'s process: every queue pair of it is flushed, and its
    /// peers' requests get no answer from now on (they fail with
    /// [`WcStatus::RetryExceeded`] after `retry_count` ticks). Costs O(queue pairs of
    /// `node`). No effect on a node that does not exist.
    pub fn kill(&self, node: u32) {
        self.state.borrow_mut().kill(node as usize);
    }

    /// Simulates the first step of a dying process's teardown, seen on rxe after `SIGKILL`:
    /// the kernel releases `node`'s memory registrations while its queue pairs still answer,
    /// so a peer's request that names one of its keys fails with [`WcStatus::RemoteAccess`]
    /// (and breaks the peer's queue pair) instead of timing out. Nothing else of `node`
    /// changes; dropping its regions later is harmless. No effect on a node that does not
    /// exist.
    pub fn release_regions(&self, node: u32) {
        let mut st = self.state.borrow_mut();
        if let Some(n) = st.world.nodes.get_mut(node as usize) {
            for r in n.regions.iter_mut() {
                r.release();
            }
        }
    }

    /// Restarts `node` after [`SoftNet::kill`], as a process started again in its place:
    /// a new life with no queue pairs, no registered memory and fresh completion queues
    /// ([`SoftNet::send_cq`] and [`SoftNet::recv_cq`] hand them out again), to which every
    /// node can [`connect`](SoftNet::connect) anew. What the old life had stays cut off: its
    /// queue pairs reach nothing (its peers' requests to them keep failing with
    /// [`WcStatus::RetryExceeded`]), its completion queue handles fail every poll with
    /// `ESTALE`, its regions' keys resolve nowhere (dropping them later is harmless). Peers'
    /// queue pairs to the old life are theirs to flush and drop. `false` (nothing changed)
    /// if the node does not exist or was not killed. Allocates (the new queues).
    pub fn restart(&self, node: u32) -> bool {
        self.state.borrow_mut().world.restart(node as usize)
    }

    /// Whether `node` was killed.
    pub fn is_dead(&self, node: u32) -> bool {
        let st = self.state.borrow();
        st.world.nodes.get(node as usize).is_some_and(|n| n.dead)
    }

    /// Whether the queue pair numbered `qp_num` is in the error state (`false` if there is
    /// no such queue pair).
    pub fn in_error(&self, qp_num: u32) -> bool {
        let st = self.state.borrow();
        qp_index(qp_num)
            .and_then(|q| st.world.qps.get(q))
            .is_some_and(|qp| qp.error)
    }

    /// Send-queue slots of the queue pair numbered `qp_num` in use (posted, not yet retired
    /// by a polled completion); 0 if there is no such queue pair.
    pub fn send_queue_used(&self, qp_num: u32) -> u64 {
        let st = self.state.borrow();
        qp_index(qp_num)
            .and_then(|q| st.world.qps.get(q))
            .map_or(0, |qp| qp.sq_count.used())
    }

    /// Receive-queue slots of the queue pair numbered `qp_num` in use (posted, completion
    /// not yet polled); 0 if there is no such queue pair.
    pub fn recv_queue_used(&self, qp_num: u32) -> u64 {
        let st = self.state.borrow();
        qp_index(qp_num)
            .and_then(|q| st.world.qps.get(q))
            .map_or(0, |qp| qp.rq_count.used())
    }

    /// Queue pairs of `node` whose send-queue head waits (for a receive at the peer, or for
    /// its retries to run out): what the next poll of its send CQ retries.
    pub fn waiting(&self, node: u32) -> u32 {
        let st = self.state.borrow();
        st.world
            .nodes
            .get(node as usize)
            .map_or(0, |n| n.waiting_len)
    }

    /// Counters of `node`, all its queue pairs together (zero for a node that does not
    /// exist).
    pub fn stats(&self, node: u32) -> SoftStats {
        let st = self.state.borrow();
        st.world
            .nodes
            .get(node as usize)
            .map_or(SoftStats::default(), |n| n.stats)
    }

    /// Connections made so far.
    pub fn connections(&self) -> usize {
        self.state.borrow().world.qps.len() / 2
    }

    /// Bytes of the model's own state: queues, completion queues, tables (not the
    /// registered buffers, which the caller owns). An estimate of its heap use, leaving out
    /// the allocator's overhead.
    pub fn footprint(&self) -> usize {
        self.state.borrow().world.footprint()
    }
}

/// The index of the queue pair numbered `qp_num`.
fn qp_index(qp_num: u32) -> Option<usize> {
    qp_num.checked_sub(QPN_BASE).map(|q| q as usize)
}
