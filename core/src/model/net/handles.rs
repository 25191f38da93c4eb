//! The handles a net hands out: a queue pair ([`QueuePair`]) and a node's completion queue
//! ([`CompletionQueue`]).

use core::cell::RefCell;
use core::fmt;

use crate::completion::Completion;
use crate::params::QpCaps;
use crate::provider::{CompletionQueue, ProviderError, QueuePair};
use crate::wr::{PostFailure, RecvRequest, WorkRequest};

use super::calls::NetState;

use super::state::QPN_BASE;
#[cfg(doc)]
use super::SoftNet;
use crate::verb::errno::ESTALE;

/// One end of a connection of a [`SoftNet`]: a [`QueuePair`] whose completions go to its
/// node's shared completion queues.
pub struct NetQp<'n> {
    state: &'n RefCell<NetState>,
    q: u32,
    node: u32,
    peer: u32,
    caps: QpCaps,
}

impl fmt::Debug for NetQp<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("NetQp")
            .field("qp_num", &self.qp_num())
            .field("node", &self.node)
            .field("peer", &self.peer)
            .finish()
    }
}

impl<'n> NetQp<'n> {
    pub(super) fn new(
        state: &'n RefCell<NetState>,
        q: u32,
        node: u32,
        peer: u32,
        caps: QpCaps,
    ) -> Self {
        Self {
            state,
            q,
            node,
            peer,
            caps,
        }
    }

    /// The node this end belongs to.
    #[inline]
    pub fn node(&self) -> u32 {
        self.node
    }

    /// The node at the other end.
    #[inline]
    pub fn peer_node(&self) -> u32 {
        self.peer
    }

    /// The queue pair number its completions carry, unique in the net.
    #[inline]
    pub fn qp_num(&self) -> u32 {
        QPN_BASE.wrapping_add(self.q)
    }
}

impl QueuePair for NetQp<'_> {
    fn caps(&self) -> QpCaps {
        self.caps
    }

    fn qp_num(&self) -> u32 {
        NetQp::qp_num(self)
    }

    /// Posts and runs this queue pair's send queue (see
    /// [When work executes](super#when-work-executes)). Does not allocate.
    unsafe fn post_send(&mut self, wrs: &[WorkRequest<'_>]) -> Result<(), PostFailure> {
        // SAFETY: forwarded posting contract.
        unsafe { self.state.borrow_mut().post_send(self.q as usize, wrs) }
    }

    /// Posts receives, then runs the peer's send queue (a send waiting for them completes
    /// here). Does not allocate.
    unsafe fn post_recv(&mut self, wrs: &[RecvRequest<'_>]) -> Result<(), PostFailure> {
        self.state.borrow_mut().post_recv(self.q as usize, wrs)
    }

    /// Flushes everything outstanding into the node's completion queues (not the receives
    /// of its node's shared receive queue). Does not allocate.
    fn set_error(&mut self) -> Result<(), ProviderError> {
        self.state.borrow_mut().set_error(self.q as usize);
        Ok(())
    }

    fn srq_capacity(&self) -> u32 {
        self.state.borrow().srq_capacity(self.q as usize)
    }

    /// Its node's two queues: every queue pair of a node completes into them.
    fn completion_queues(&self) -> Option<[crate::provider::CqId; 2]> {
        Some([
            net_cq_id(self.state, self.node, CqKind::Send),
            net_cq_id(self.state, self.node, CqKind::Recv),
        ])
    }

    /// Posts to the node's shared receive queue ([`SoftNet::create_srq`]); runs nothing.
    /// Does not allocate.
    unsafe fn post_srq_recv(&mut self, wrs: &[RecvRequest<'_>]) -> Result<(), PostFailure> {
        self.state.borrow_mut().post_srq_recv(self.q as usize, wrs)
    }

    /// Always gone: the model resolves a receive's keys only when a message arrives, so a
    /// receive whose region was dropped never reaches its memory (and that memory is
    /// borrowed for the net's whole life anyway).
    #[cfg(feature = "alloc")]
    fn srq_probe(&self) -> Option<crate::memory::SrqProbe> {
        (self.srq_capacity() > 0).then(crate::memory::SrqProbe::released)
    }
}

/// Which of a node's two completion queues.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum CqKind {
    Send,
    Recv,
}

/// The send or receive completion queue of one node of a [`SoftNet`], shared by all of the
/// node's queue pairs: completions carry the queue pair's `qp_num`.
pub struct NetCq<'n> {
    state: &'n RefCell<NetState>,
    node: u32,
    /// The node's life it was handed out in.
    life: u32,
    kind: CqKind,
    capacity: u32,
}

impl fmt::Debug for NetCq<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("NetCq")
            .field("node", &self.node)
            .field("send", &(self.kind == CqKind::Send))
            .field("capacity", &self.capacity)
            .finish()
    }
}

impl<'n> NetCq<'n> {
    pub(super) fn new(
        state: &'n RefCell<NetState>,
        node: u32,
        life: u32,
        kind: CqKind,
        capacity: u32,
    ) -> Self {
        Self {
            state,
            node,
            life,
            kind,
            capacity,
        }
    }

    /// The node it belongs to.
    #[inline]
    pub fn node(&self) -> u32 {
        self.node
    }

    /// Whether it is the node's send completion queue (else its receive queue).
    #[inline]
    pub fn is_send(&self) -> bool {
        self.kind == CqKind::Send
    }

    /// Completions waiting in it (0 for a queue of a node's earlier life).
    pub fn len(&self) -> u32 {
        let st = self.state.borrow();
        st.world
            .nodes
            .get(self.node as usize)
            .filter(|n| n.life == self.life)
            .map_or(0, |n| match self.kind {
                CqKind::Send => n.send_cq.len(),
                CqKind::Recv => n.recv_cq.len(),
            })
    }

    /// Whether no completion waits in it.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

impl CompletionQueue for NetCq<'_> {
    /// A send queue's poll is first one retry tick for the node's waiting queue pairs (see
    /// [When work executes](super#when-work-executes)); a receive queue's polls only. Fails
    /// with `EOVERFLOW` once the queue has overflowed, and with `ESTALE` once its node was
    /// [restarted](super::SoftNet::restart). Does not allocate.
    fn poll(&mut self, out: &mut [Completion]) -> Result<usize, ProviderError> {
        let mut st = self.state.borrow_mut();
        if st
            .world
            .nodes
            .get(self.node as usize)
            .is_some_and(|n| n.life != self.life)
        {
            return Err(ProviderError {
                verb: crate::provider::Verb::PollCq,
                errno: ESTALE,
            });
        }
        match self.kind {
            CqKind::Send => st.poll_send(self.node as usize, out),
            CqKind::Recv => st.poll_recv(self.node as usize, out),
        }
    }

    fn capacity(&self) -> u32 {
        self.capacity
    }

    fn id(&self) -> Option<crate::provider::CqId> {
        Some(net_cq_id(self.state, self.node, self.kind))
    }
}

/// The model's name for node `node`'s queue of `kind` in the net behind `state`.
fn net_cq_id(state: &RefCell<NetState>, node: u32, kind: CqKind) -> crate::provider::CqId {
    crate::provider::CqId {
        owner: core::ptr::from_ref(state) as usize,
        index: node as usize * 2 + usize::from(kind == CqKind::Recv),
    }
}
