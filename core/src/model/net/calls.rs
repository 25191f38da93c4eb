//! The net's queue pairs as a [`Wiring`], and what each call of a handle does: which queues
//! it runs and how a node's shared completion queues are polled (see
//! [When work executes](super#when-work-executes)).

use alloc::boxed::Box;

use crate::completion::Completion;
use crate::params::QpCaps;
use crate::provider::ProviderError;
use crate::sge::Sge;
use crate::wr::{PostFailure, RecvRequest, WorkRequest};

use super::super::entry::{poll_into, RawSge, SendHeader, NO_SGE};
use super::super::execute::{self, enter_error, run_send_queue, HeadCopy, Limits, Wiring};
use super::super::keys::Reach;
use super::super::{SoftStats, EINVAL, ENOMEM, MAX_SGE};
use super::region::split_net_key;
use super::state::{Cqe, SrqState, World, QPN_BASE};
use crate::verb::errno::EOPNOTSUPP;

impl World {
    fn caps_send_sges(&self) -> usize {
        self.caps.max_send_sge as usize
    }

    fn caps_recv_sges(&self) -> usize {
        self.caps.max_recv_sge as usize
    }

    /// Where receive entries start in a queue pair's entry storage.
    fn recv_sges_at(&self) -> usize {
        self.caps.max_send_wr as usize * self.caps_send_sges()
    }

    fn node_of(&self, q: usize) -> Option<usize> {
        self.qps.get(q).map(|qp| qp.node as usize)
    }

    /// Resolves `at` against `node`'s region table (a net key names no node: generations
    /// are unique in the net, so another node's key finds another generation or nothing).
    pub(super) fn resolve_at(&self, node: usize, at: &Reach) -> Option<*mut u8> {
        let (gen, kind, slot) = split_net_key(at.sge.key);
        if kind != at.kind {
            return None;
        }
        self.nodes.get(node)?.regions.get(slot)?.reach(gen, at)
    }

    /// The shared receive queue `q` takes its receives from, if it is on one.
    fn srq_of(&self, q: usize) -> Option<&SrqState> {
        let qp = self.qps.get(q).filter(|qp| qp.on_srq)?;
        self.nodes.get(qp.node as usize)?.srq.as_ref()
    }

    fn srq_of_mut(&mut self, q: usize) -> Option<&mut SrqState> {
        let qp = self.qps.get(q).filter(|qp| qp.on_srq)?;
        self.nodes.get_mut(qp.node as usize)?.srq.as_mut()
    }
}

impl Wiring for World {
    fn caps(&self) -> QpCaps {
        self.caps
    }

    fn limits(&self) -> Limits {
        self.limits
    }

    fn qp_num(&self, q: usize) -> u32 {
        QPN_BASE.wrapping_add(q as u32)
    }

    fn peer(&self, q: usize) -> usize {
        q ^ 1
    }

    fn in_error(&self, q: usize) -> bool {
        self.qps.get(q).is_none_or(|qp| qp.error)
    }

    fn mark_error(&mut self, q: usize) {
        if let Some(qp) = self.qps.get_mut(q) {
            qp.error = true;
        }
    }

    fn unreachable(&self, q: usize) -> bool {
        match self.qps.get(q) {
            Some(qp) => qp.error || self.nodes.get(qp.node as usize).is_none_or(|n| n.dead),
            None => true,
        }
    }

    fn resolve(&self, q: usize, at: &Reach) -> Option<*mut u8> {
        self.resolve_at(self.node_of(q)?, at)
    }

    fn send_used(&self, q: usize) -> u64 {
        self.qps.get(q).map_or(0, |qp| qp.sq_count.used())
    }

    fn recv_used(&self, q: usize) -> u64 {
        self.qps.get(q).map_or(0, |qp| qp.rq_count.used())
    }

    fn push_send(
        &mut self,
        q: usize,
        fill: impl FnOnce(&mut [RawSge], &mut [u8]) -> Result<SendHeader, i32>,
    ) -> Result<(), i32> {
        let (ns, ni) = (self.caps_send_sges(), self.caps.max_inline_data as usize);
        let cap = self.caps.max_send_wr;
        let qp = self.qps.get_mut(q).ok_or(ENOMEM)?;
        let i = qp.sq.tail(cap).ok_or(ENOMEM)?;
        let sges = qp.sges.get_mut(i * ns..(i + 1) * ns).ok_or(ENOMEM)?;
        let inline = qp.inline.get_mut(i * ni..(i + 1) * ni).ok_or(ENOMEM)?;
        let h = fill(sges, inline)?;
        *qp.send.get_mut(i).ok_or(ENOMEM)? = h;
        qp.sq.len += 1;
        qp.sq_count.posted += 1;
        Ok(())
    }

    fn push_recv(&mut self, q: usize, wr_id: u64, sges: &[Sge<'_>]) -> Result<(), i32> {
        if self.qps.get(q).is_some_and(|qp| qp.on_srq) {
            // As on a device: a queue pair on a shared receive queue has no receive queue.
            return Err(EINVAL);
        }
        let (at, nr) = (self.recv_sges_at(), self.caps_recv_sges());
        let cap = self.caps.max_recv_wr;
        let qp = self.qps.get_mut(q).ok_or(ENOMEM)?;
        let i = qp.rq.tail(cap).ok_or(ENOMEM)?;
        let dst = qp
            .sges
            .get_mut(at + i * nr..at + (i + 1) * nr)
            .ok_or(ENOMEM)?;
        let mut posted = sges.iter();
        for d in dst {
            // Unused entries are zero-length: execution skips them.
            *d = posted.next().map_or(NO_SGE, RawSge::of);
        }
        *qp.recv.get_mut(i).ok_or(ENOMEM)? = wr_id;
        qp.rq.len += 1;
        qp.rq_count.posted += 1;
        Ok(())
    }

    fn load_send_head(&self, q: usize, into: &mut HeadCopy<'_>) -> Option<(SendHeader, u64)> {
        let (ns, ni) = (self.caps_send_sges(), self.caps.max_inline_data as usize);
        let qp = self.qps.get(q)?;
        let i = qp.sq.front()?;
        let h = *qp.send.get(i)?;
        if h.inline {
            let n = usize::from(h.inline_len);
            let src = qp.inline.get(i * ni..i * ni + n)?;
            into.inline.get_mut(..n)?.copy_from_slice(src);
        } else {
            let n = usize::from(h.nsge);
            let src = qp.sges.get(i * ns..i * ns + n)?;
            into.sges.get_mut(..n)?.copy_from_slice(src);
        }
        // The ring holds the requests not yet executed, the newest at position
        // `sq_posted - 1`.
        Some((h, qp.sq_count.posted - u64::from(qp.sq.len)))
    }

    fn send_head_mut(&mut self, q: usize) -> Option<&mut SendHeader> {
        let qp = self.qps.get_mut(q)?;
        let i = qp.sq.front()?;
        qp.send.get_mut(i)
    }

    fn pop_send(&mut self, q: usize) -> Option<(u64, u64)> {
        let cap = self.caps.max_send_wr;
        let qp = self.qps.get_mut(q)?;
        let seq = qp.sq_count.posted - u64::from(qp.sq.len);
        let i = qp.sq.pop(cap)?;
        let wr_id = qp.send.get(i).map_or(0, |h| h.wr_id);
        if qp.sq.len == 0 {
            // Nothing left to wait: off the node's waiting list.
            self.unwait(q);
        }
        Some((wr_id, seq))
    }

    fn has_recv(&self, q: usize) -> bool {
        match self.srq_of(q) {
            Some(srq) => srq.ring.len > 0,
            None => self.qps.get(q).is_some_and(|qp| qp.rq.len > 0),
        }
    }

    fn load_recv_head(&self, q: usize, sges: &mut [RawSge; MAX_SGE]) -> Option<usize> {
        let nr = self.caps_recv_sges();
        if let Some(srq) = self.srq_of(q) {
            let i = srq.ring.front()?;
            let src = srq.sges.get(i * nr..(i + 1) * nr)?;
            sges.get_mut(..nr)?.copy_from_slice(src);
            return Some(nr);
        }
        let at = self.recv_sges_at();
        let qp = self.qps.get(q)?;
        let i = qp.rq.front()?;
        let src = qp.sges.get(at + i * nr..at + (i + 1) * nr)?;
        sges.get_mut(..nr)?.copy_from_slice(src);
        Some(nr)
    }

    fn pop_recv(&mut self, q: usize) -> Option<u64> {
        if self.qps.get(q).is_some_and(|qp| qp.on_srq) {
            // A receive is taken from the shared queue only by a message arriving on a
            // working queue pair; flushing one (it is in error by then) takes none, as the
            // shared queue's receives belong to no queue pair.
            if self.in_error(q) {
                return None;
            }
            let srq = self.srq_of_mut(q)?;
            let i = srq.ring.pop(srq.cap)?;
            return srq.ids.get(i).copied();
        }
        let cap = self.caps.max_recv_wr;
        let qp = self.qps.get_mut(q)?;
        let i = qp.rq.pop(cap)?;
        qp.recv.get(i).copied()
    }

    fn push_send_cqe(&mut self, q: usize, wc: Completion, seq: u64) {
        if let Some(node) = self.node_of(q).and_then(|n| self.nodes.get_mut(n)) {
            node.stats.send_cqes += 1;
            node.send_cq.push(Cqe::of(&wc, q as u32, seq));
        }
    }

    fn push_recv_cqe(&mut self, q: usize, wc: Completion) {
        if let Some(node) = self.node_of(q).and_then(|n| self.nodes.get_mut(n)) {
            node.stats.recv_cqes += 1;
            node.recv_cq.push(Cqe::of(&wc, q as u32, 0));
        }
    }

    fn stats(&mut self, q: usize) -> Option<&mut SoftStats> {
        let n = self.node_of(q)?;
        self.nodes.get_mut(n).map(|node| &mut node.stats)
    }
}

/// The world and the scratch room execution copies an inline payload into.
pub(super) struct NetState {
    pub(super) world: World,
    /// `max_inline_data` bytes.
    scratch: Box<[u8]>,
}

impl NetState {
    pub(super) fn new(world: World) -> Self {
        let scratch = alloc::vec![0u8; world.caps.max_inline_data as usize].into_boxed_slice();
        Self { world, scratch }
    }

    /// Runs `q`'s send queue; if its head is left waiting, puts it on its node's waiting
    /// list (emptying the queue takes it off, in `pop_send`).
    fn run(&mut self, q: usize, tick: bool) {
        run_send_queue(&mut self.world, &mut self.scratch, q, tick);
        if self.world.qps.get(q).is_some_and(|qp| qp.sq.len > 0) {
            self.world.wait(q);
        }
    }

    /// Posts and runs `q`'s send queue.
    ///
    /// # Safety
    /// The posting contract.
    pub(super) unsafe fn post_send(
        &mut self,
        q: usize,
        wrs: &[WorkRequest<'_>],
    ) -> Result<(), PostFailure> {
        // SAFETY: forwarded posting contract.
        let result = unsafe { execute::post_send(&mut self.world, q, wrs) };
        self.run(q, false);
        result
    }

    /// Posts receives to `q` and runs the peer's send queue, which may wait for them.
    pub(super) fn post_recv(
        &mut self,
        q: usize,
        wrs: &[RecvRequest<'_>],
    ) -> Result<(), PostFailure> {
        let result = execute::post_recv(&mut self.world, q, wrs);
        if self.world.in_error(q) {
            // Receives posted in the error state complete flushed.
            enter_error(&mut self.world, q);
        }
        self.run(q ^ 1, false);
        result
    }

    /// Posts receives to the shared receive queue of `q`'s node; runs nothing (a send
    /// waiting for one is retried at its node's next tick).
    pub(super) fn post_srq_recv(
        &mut self,
        q: usize,
        wrs: &[RecvRequest<'_>],
    ) -> Result<(), PostFailure> {
        let fail = |posted, errno| Err(PostFailure { posted, errno });
        if wrs.len() > crate::wr::MAX_BATCH {
            return fail(0, EINVAL);
        }
        let nr = self.world.caps_recv_sges();
        let Some(node) = self
            .world
            .qps
            .get(q)
            .filter(|qp| qp.on_srq)
            .map(|qp| qp.node as usize)
        else {
            return fail(0, EOPNOTSUPP);
        };
        for (i, wr) in wrs.iter().enumerate() {
            let Some(n) = self.world.nodes.get_mut(node) else {
                return fail(i, EOPNOTSUPP);
            };
            let Some(srq) = n.srq.as_mut() else {
                return fail(i, EOPNOTSUPP);
            };
            if wr.sges.len() > nr {
                return fail(i, EINVAL);
            }
            if srq.posted - srq.retired >= u64::from(srq.cap) {
                return fail(i, ENOMEM);
            }
            let Some(at) = srq.ring.tail(srq.cap) else {
                return fail(i, ENOMEM);
            };
            let Some(dst) = srq.sges.get_mut(at * nr..(at + 1) * nr) else {
                return fail(i, ENOMEM);
            };
            let mut posted = wr.sges.iter();
            for d in dst {
                *d = posted.next().map_or(NO_SGE, RawSge::of);
            }
            if let Some(id) = srq.ids.get_mut(at) {
                *id = wr.wr_id;
            }
            srq.ring.len += 1;
            srq.posted += 1;
            n.stats.recvs_posted += 1;
        }
        Ok(())
    }

    /// Receives the shared receive queue of `q`'s node holds (0: `q` is not on one).
    pub(super) fn srq_capacity(&self, q: usize) -> u32 {
        self.world.srq_of(q).map_or(0, |s| s.cap)
    }

    pub(super) fn set_error(&mut self, q: usize) {
        enter_error(&mut self.world, q);
    }

    /// One retry tick for the waiting queue pairs of `node`.
    fn tick(&mut self, node: usize) {
        let Some(n) = self.world.nodes.get(node) else {
            return;
        };
        let mut cur = n.waiting_head;
        while let Some(qp) = self.world.qps.get(cur as usize) {
            // Running `cur` can take only `cur` off this node's list (an error it causes
            // elsewhere flushes a queue pair of the peer node) and adds nothing to it, so
            // the successor read now stays valid, and a queue pair still waiting keeps its
            // place: each is retried once per tick.
            let next = qp.next;
            self.run(cur as usize, true);
            cur = next;
        }
    }

    /// A tick for `node`, then up to `out.len()` completions of its send CQ.
    pub(super) fn poll_send(
        &mut self,
        node: usize,
        out: &mut [Completion],
    ) -> Result<usize, ProviderError> {
        self.tick(node);
        let w = &mut self.world;
        let Some(n) = w.nodes.get_mut(node) else {
            return Ok(0);
        };
        poll_into(n.send_cq.overflow, out, || {
            let c = n.send_cq.pop()?;
            if let Some(qp) = w.qps.get_mut(c.qp as usize) {
                qp.sq_count.retire_to(c.seq);
            }
            Some(c.completion())
        })
    }

    /// Up to `out.len()` completions of `node`'s receive CQ.
    pub(super) fn poll_recv(
        &mut self,
        node: usize,
        out: &mut [Completion],
    ) -> Result<usize, ProviderError> {
        let w = &mut self.world;
        let Some(n) = w.nodes.get_mut(node) else {
            return Ok(0);
        };
        poll_into(n.recv_cq.overflow, out, || {
            let c = n.recv_cq.pop()?;
            match w.qps.get_mut(c.qp as usize) {
                Some(qp) if qp.on_srq => {
                    if let Some(srq) = n.srq.as_mut() {
                        srq.retired += 1;
                    }
                }
                Some(qp) => qp.rq_count.retired += 1,
                None => {}
            }
            Some(c.completion())
        })
    }

    /// Kills `node`: dead, and every queue pair of it flushed (its datagram queue pairs
    /// too).
    pub(super) fn kill(&mut self, node: usize) {
        let Some(n) = self.world.nodes.get_mut(node) else {
            return;
        };
        n.dead = true;
        let qps = n.qps.len();
        for u in 0..self.world.ud.len() {
            if self
                .world
                .ud
                .get(u)
                .is_some_and(|d| d.node as usize == node)
            {
                self.ud_enter_error(u);
            }
        }
        for i in 0..qps {
            if let Some(&q) = self.world.nodes.get(node).and_then(|n| n.qps.get(i)) {
                enter_error(&mut self.world, q as usize);
            }
        }
    }
}
