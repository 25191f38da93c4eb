//! The fabric's two queue pairs as a [`Wiring`], and its calls: which queues each call runs
//! (both, every time) and how its per-queue-pair completion queues are polled.

use core::cell::RefMut;

use crate::completion::Completion;
use crate::params::QpCaps;
use crate::provider::ProviderError;
use crate::sge::Sge;
use crate::wr::{PostFailure, RecvRequest, WorkRequest};

use super::entry::{poll_into, RawSge, SendHeader};
use super::execute::{self, enter_error, run_send_queue, HeadCopy, Limits, Wiring};
use super::fabric::Shared;
use super::keys::Reach;
use super::queues::{QpState, SendCqe, NO_RECV, NO_SEND};
use super::{SoftStats, ENOMEM, MAX_INLINE, MAX_SGE, QP_NUMS};

/// Both queue pairs, borrowed for one call: queue pair `s` is side `s`, its peer `1 - s`.
pub(super) struct Pair<'s> {
    st: &'s mut [QpState; 2],
    caps: QpCaps,
    limits: Limits,
}

impl Wiring for Pair<'_> {
    fn caps(&self) -> QpCaps {
        self.caps
    }

    fn limits(&self) -> Limits {
        self.limits
    }

    fn qp_num(&self, q: usize) -> u32 {
        QP_NUMS[q & 1]
    }

    fn peer(&self, q: usize) -> usize {
        1 - (q & 1)
    }

    fn in_error(&self, q: usize) -> bool {
        self.st[q].error
    }

    fn mark_error(&mut self, q: usize) {
        self.st[q].error = true;
    }

    fn unreachable(&self, q: usize) -> bool {
        self.st[q].error || self.st[q].dead
    }

    fn resolve(&self, q: usize, at: &Reach) -> Option<*mut u8> {
        self.st[q].resolve(q, at)
    }

    fn send_used(&self, q: usize) -> u64 {
        self.st[q].sq_count.used()
    }

    fn recv_used(&self, q: usize) -> u64 {
        self.st[q].rq_count.used()
    }

    fn push_send(
        &mut self,
        q: usize,
        fill: impl FnOnce(&mut [RawSge], &mut [u8]) -> Result<SendHeader, i32>,
    ) -> Result<(), i32> {
        let mut w = NO_SEND;
        w.hdr = fill(&mut w.sges, &mut w.inline_data)?;
        let qp = &mut self.st[q];
        qp.sq.push(w).map_err(|_| ENOMEM)?;
        qp.sq_count.posted += 1;
        Ok(())
    }

    fn push_recv(&mut self, q: usize, wr_id: u64, sges: &[Sge<'_>]) -> Result<(), i32> {
        let mut r = NO_RECV;
        r.wr_id = wr_id;
        for (d, s) in r.sges.iter_mut().zip(sges) {
            *d = RawSge::of(s);
        }
        r.nsge = sges.len();
        let qp = &mut self.st[q];
        qp.rq.push(r).map_err(|_| ENOMEM)?;
        qp.rq_count.posted += 1;
        Ok(())
    }

    fn load_send_head(&self, q: usize, into: &mut HeadCopy<'_>) -> Option<(SendHeader, u64)> {
        let qp = &self.st[q];
        let w = qp.sq.front()?;
        into.sges = w.sges;
        let n = usize::from(w.hdr.inline_len);
        if let (Some(d), Some(s)) = (into.inline.get_mut(..n), w.inline_data.get(..n)) {
            d.copy_from_slice(s);
        }
        // The ring holds the requests not yet executed, the newest at position
        // `sq_posted - 1`.
        Some((w.hdr, qp.sq_count.posted - qp.sq.len as u64))
    }

    fn send_head_mut(&mut self, q: usize) -> Option<&mut SendHeader> {
        self.st[q].sq.front_mut().map(|w| &mut w.hdr)
    }

    fn pop_send(&mut self, q: usize) -> Option<(u64, u64)> {
        let qp = &mut self.st[q];
        let seq = qp.sq_count.posted - qp.sq.len as u64;
        qp.sq.pop().map(|w| (w.hdr.wr_id, seq))
    }

    fn has_recv(&self, q: usize) -> bool {
        !self.st[q].rq.is_empty()
    }

    fn load_recv_head(&self, q: usize, sges: &mut [RawSge; MAX_SGE]) -> Option<usize> {
        let r = self.st[q].rq.front()?;
        *sges = r.sges;
        Some(r.nsge.min(MAX_SGE))
    }

    fn pop_recv(&mut self, q: usize) -> Option<u64> {
        self.st[q].rq.pop().map(|r| r.wr_id)
    }

    fn push_send_cqe(&mut self, q: usize, wc: Completion, seq: u64) {
        self.st[q].push_send_cqe(SendCqe { wc, seq });
    }

    fn push_recv_cqe(&mut self, q: usize, wc: Completion) {
        self.st[q].push_recv_cqe(wc);
    }

    fn stats(&mut self, q: usize) -> Option<&mut SoftStats> {
        self.st.get_mut(q).map(|qp| &mut qp.stats)
    }
}

/// Runs both send queues as far as they go; `tick` names the side whose retry timer fires
/// in this call.
fn progress(w: &mut Pair<'_>, tick: Option<usize>) {
    let mut inline = [0u8; MAX_INLINE];
    for s in 0..2 {
        run_send_queue(w, &mut inline, s, tick == Some(s));
    }
}

impl Shared {
    /// Both queue pairs as a [`Wiring`], for one call.
    pub(super) fn pair<'s>(&self, st: &'s mut [QpState; 2]) -> Pair<'s> {
        Pair {
            st,
            caps: self.caps,
            limits: self.limits,
        }
    }

    /// Runs `post` on the pair, then lets both sides progress (what was posted may be what a
    /// blocked head waits for).
    fn posting(
        &self,
        post: impl FnOnce(&mut Pair<'_>) -> Result<(), PostFailure>,
    ) -> Result<(), PostFailure> {
        let mut st = self.state.borrow_mut();
        let mut w = self.pair(&mut st);
        let result = post(&mut w);
        progress(&mut w, None);
        result
    }

    /// # Safety
    /// The posting contract.
    pub(super) unsafe fn post_send(
        &self,
        side: usize,
        wrs: &[WorkRequest<'_>],
    ) -> Result<(), PostFailure> {
        // SAFETY: forwarded posting contract.
        self.posting(|w| unsafe { execute::post_send(w, side, wrs) })
    }

    pub(super) fn post_recv(
        &self,
        side: usize,
        wrs: &[RecvRequest<'_>],
    ) -> Result<(), PostFailure> {
        self.posting(|w| execute::post_recv(w, side, wrs))
    }

    /// The queues of `side` to poll, after the pair progressed (with a tick for `tick`): a
    /// poll is when the model runs.
    fn to_poll(&self, side: usize, tick: Option<usize>) -> RefMut<'_, QpState> {
        let mut st = self.state.borrow_mut();
        progress(&mut self.pair(&mut st), tick);
        RefMut::map(st, |st| &mut st[side])
    }

    pub(super) fn poll_send(
        &self,
        side: usize,
        out: &mut [Completion],
    ) -> Result<usize, ProviderError> {
        let mut qp = self.to_poll(side, Some(side));
        poll_into(qp.cq_overflow, out, || {
            let c = qp.scq.pop()?;
            qp.sq_count.retire_to(c.seq);
            Some(c.wc)
        })
    }

    pub(super) fn poll_recv(
        &self,
        side: usize,
        out: &mut [Completion],
    ) -> Result<usize, ProviderError> {
        let mut qp = self.to_poll(side, None);
        poll_into(qp.cq_overflow, out, || {
            let c = qp.rcq.pop()?;
            qp.rq_count.retired += 1;
            Some(c)
        })
    }

    pub(super) fn set_error(&self, side: usize) {
        let mut st = self.state.borrow_mut();
        let mut w = self.pair(&mut st);
        enter_error(&mut w, side);
        progress(&mut w, None);
    }
}
