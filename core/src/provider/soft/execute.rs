//! How work executes: posting, polling, and running the send queues (see
//! [When work executes](super#when-work-executes) and [Semantics](super#semantics)).

use crate::completion::{Completion, CompletionKind, WcStatus};
use crate::provider::{ProviderError, Verb};
use crate::wr::{Opcode, PostFailure, RecvRequest, SendFlags, WorkRequest, MAX_BATCH};

use super::fabric::Shared;
use super::keys::KeyKind;
use super::queues::{completion, QpState, RawSge, SendCqe, SendWqe, NO_RECV, NO_SEND};
use super::spans::{copy_spans, resolve_local, Spans};
use super::{AccessFlags, EINVAL, ENOMEM, EOVERFLOW, MAX_SGE};

/// What a send-queue head attempt came to.
enum Outcome {
    Done {
        status: WcStatus,
        byte_len: u32,
    },
    /// The peer posted no receive.
    Rnr,
    /// The peer does not answer (dead or in the error state).
    NoAck,
}

const fn done(status: WcStatus) -> Outcome {
    Outcome::Done {
        status,
        byte_len: 0,
    }
}

/// Moves `s` to the error state and flushes everything outstanding on it.
pub(super) fn enter_error(st: &mut [QpState; 2], s: usize) {
    let qp = &mut st[s];
    qp.error = true;
    while let Some(w) = qp.sq.pop() {
        qp.push_send_cqe(SendCqe {
            wc: completion(w.wr_id, WcStatus::Flushed, CompletionKind::Other, s),
            seq: w.seq,
        });
    }
    while let Some(r) = qp.rq.pop() {
        qp.push_recv_cqe(completion(
            r.wr_id,
            WcStatus::Flushed,
            CompletionKind::Other,
            s,
        ));
    }
}

/// Fails the receive at the head of `p`'s queue with `status` and moves `p` to the error
/// state (a responder-side error that consumed a receive).
fn fail_recv(st: &mut [QpState; 2], p: usize, status: WcStatus) {
    if let Some(r) = st[p].rq.pop() {
        st[p].push_recv_cqe(completion(r.wr_id, status, CompletionKind::Other, p));
    }
    enter_error(st, p);
}

impl Shared {
    /// Builds the queue entry for `wr`, or the errno that rejects it.
    ///
    /// # Safety
    /// The posting contract: inline entries must name readable memory.
    unsafe fn build_send(&self, wr: &WorkRequest<'_>) -> Result<SendWqe, i32> {
        if wr.sges.len() > self.caps.max_send_sge as usize {
            return Err(EINVAL);
        }
        let mut w = NO_SEND;
        w.wr_id = wr.wr_id;
        w.opcode = wr.opcode;
        w.signaled = wr.flags.contains(SendFlags::SIGNALED);
        w.remote = wr.remote;
        if wr.flags.contains(SendFlags::INLINE) {
            if wr.opcode == Opcode::Read {
                return Err(EINVAL);
            }
            let total: u64 = wr.sges.iter().map(|s| u64::from(s.len())).sum();
            if total > u64::from(self.caps.max_inline_data) {
                return Err(EINVAL);
            }
            w.inline = true;
            for s in wr.sges {
                let len = s.len() as usize;
                if len == 0 {
                    continue;
                }
                let addr = usize::try_from(s.addr()).map_err(|_| EINVAL)?;
                let dst = w
                    .inline_data
                    .get_mut(w.inline_len..w.inline_len + len)
                    .ok_or(EINVAL)?;
                let src = core::ptr::with_exposed_provenance::<u8>(addr);
                // SAFETY: the posting contract makes `addr..addr+len` of an inline entry
                // readable memory for the duration of the post; the engine makes inline
                // entries from a live slice with `as_ptr() as u64`, which exposes its
                // provenance for `with_exposed_provenance` to pick up. `dst` is our own array,
                // so the ranges do not overlap.
                unsafe { core::ptr::copy_nonoverlapping(src, dst.as_mut_ptr(), len) };
                w.inline_len += len;
            }
        } else {
            for (d, s) in w.sges.iter_mut().zip(wr.sges) {
                *d = RawSge {
                    addr: s.addr(),
                    len: s.len(),
                    key: s.lkey(),
                };
            }
            w.nsge = wr.sges.len();
        }
        Ok(w)
    }

    /// # Safety
    /// The posting contract.
    pub(super) unsafe fn post_send(
        &self,
        side: usize,
        wrs: &[WorkRequest<'_>],
    ) -> Result<(), PostFailure> {
        if wrs.len() > MAX_BATCH {
            return Err(PostFailure {
                posted: 0,
                errno: EINVAL,
            });
        }
        let mut st = self.state.borrow_mut();
        let mut result = Ok(());
        for (i, wr) in wrs.iter().enumerate() {
            let fail = |errno| PostFailure { posted: i, errno };
            // SAFETY: forwarded posting contract.
            let mut w = match unsafe { self.build_send(wr) } {
                Ok(w) => w,
                Err(errno) => {
                    result = Err(fail(errno));
                    break;
                }
            };
            let qp = &mut st[side];
            if qp.sq_posted - qp.sq_retired >= u64::from(self.caps.max_send_wr) {
                result = Err(fail(ENOMEM));
                break;
            }
            w.seq = qp.sq_posted;
            if qp.sq.push(w).is_err() {
                result = Err(fail(ENOMEM));
                break;
            }
            qp.sq_posted += 1;
            qp.stats.sends_posted += 1;
        }
        self.progress(&mut st, None);
        result
    }

    pub(super) fn post_recv(
        &self,
        side: usize,
        wrs: &[RecvRequest<'_>],
    ) -> Result<(), PostFailure> {
        if wrs.len() > MAX_BATCH {
            return Err(PostFailure {
                posted: 0,
                errno: EINVAL,
            });
        }
        let mut st = self.state.borrow_mut();
        let mut result = Ok(());
        for (i, wr) in wrs.iter().enumerate() {
            let qp = &mut st[side];
            let errno = if wr.sges.len() > self.caps.max_recv_sge as usize {
                EINVAL
            } else if qp.rq_posted - qp.rq_retired >= u64::from(self.caps.max_recv_wr) {
                ENOMEM
            } else {
                let mut r = NO_RECV;
                r.wr_id = wr.wr_id;
                for (d, s) in r.sges.iter_mut().zip(wr.sges) {
                    *d = RawSge {
                        addr: s.addr(),
                        len: s.len(),
                        key: s.lkey(),
                    };
                }
                r.nsge = wr.sges.len();
                match qp.rq.push(r) {
                    Ok(()) => {
                        qp.rq_posted += 1;
                        qp.stats.recvs_posted += 1;
                        continue;
                    }
                    Err(_) => ENOMEM,
                }
            };
            result = Err(PostFailure { posted: i, errno });
            break;
        }
        self.progress(&mut st, None);
        result
    }

    pub(super) fn poll_send(
        &self,
        side: usize,
        out: &mut [Completion],
    ) -> Result<usize, ProviderError> {
        let mut st = self.state.borrow_mut();
        self.progress(&mut st, Some(side));
        let qp = &mut st[side];
        if qp.cq_overflow {
            return Err(ProviderError {
                verb: Verb::PollCq,
                errno: EOVERFLOW,
            });
        }
        let mut n = 0;
        for slot in out.iter_mut() {
            let Some(c) = qp.scq.pop() else { break };
            *slot = c.wc;
            qp.sq_retired = qp.sq_retired.max(c.seq + 1);
            n += 1;
        }
        Ok(n)
    }

    pub(super) fn poll_recv(
        &self,
        side: usize,
        out: &mut [Completion],
    ) -> Result<usize, ProviderError> {
        let mut st = self.state.borrow_mut();
        self.progress(&mut st, None);
        let qp = &mut st[side];
        if qp.cq_overflow {
            return Err(ProviderError {
                verb: Verb::PollCq,
                errno: EOVERFLOW,
            });
        }
        let mut n = 0;
        for slot in out.iter_mut() {
            let Some(c) = qp.rcq.pop() else { break };
            *slot = c;
            qp.rq_retired += 1;
            n += 1;
        }
        Ok(n)
    }

    pub(super) fn set_error(&self, side: usize) {
        let mut st = self.state.borrow_mut();
        enter_error(&mut st, side);
        self.progress(&mut st, None);
    }

    /// Runs both send queues as far as they go; `tick` names the side whose retry timer
    /// fires in this call.
    fn progress(&self, st: &mut [QpState; 2], tick: Option<usize>) {
        for s in 0..2 {
            self.run_send_queue(st, s, tick == Some(s));
        }
    }

    fn run_send_queue(&self, st: &mut [QpState; 2], s: usize, mut tick: bool) {
        loop {
            if st[s].error {
                // Requests posted in the error state, or left over by an error elsewhere.
                enter_error(st, s);
                return;
            }
            let Some(head) = st[s].sq.front_mut() else {
                return;
            };
            // A copy: execution reads the inline bytes while it changes the queues.
            let w = *head;
            let (status, byte_len) = match self.execute(st, s, &w) {
                Outcome::Done { status, byte_len } => (status, byte_len),
                blocked => {
                    let (limit, fail) = match blocked {
                        Outcome::Rnr => (self.rnr_limit, WcStatus::RnrRetryExceeded),
                        _ => (Some(self.retry_limit), WcStatus::RetryExceeded),
                    };
                    let qp = &mut st[s];
                    let Some(head) = qp.sq.front_mut() else {
                        return;
                    };
                    if !head.tried {
                        head.tried = true;
                    } else if tick {
                        tick = false;
                        head.retries = head.retries.saturating_add(1);
                        if fail == WcStatus::RnrRetryExceeded {
                            qp.stats.rnr_retries += 1;
                        } else {
                            qp.stats.transport_retries += 1;
                        }
                    } else {
                        return;
                    }
                    match limit {
                        Some(l) if head.retries >= l => (fail, 0),
                        _ => return,
                    }
                }
            };
            let qp = &mut st[s];
            let _ = qp.sq.pop();
            let kind = match w.opcode {
                Opcode::Send | Opcode::SendImm(_) => CompletionKind::Send,
                Opcode::Write | Opcode::WriteImm(_) => CompletionKind::Write,
                Opcode::Read => CompletionKind::Read,
            };
            if status.is_success() {
                if w.signaled {
                    let mut wc = completion(w.wr_id, status, kind, s);
                    wc.byte_len = byte_len;
                    qp.push_send_cqe(SendCqe { wc, seq: w.seq });
                }
            } else {
                let wc = completion(w.wr_id, status, CompletionKind::Other, s);
                qp.push_send_cqe(SendCqe { wc, seq: w.seq });
                enter_error(st, s);
            }
        }
    }

    /// One attempt at the request `w` at the head of `s`'s send queue.
    fn execute(&self, st: &mut [QpState; 2], s: usize, w: &SendWqe) -> Outcome {
        let p = 1 - s;
        let sges = &w.sges[..w.nsge.min(MAX_SGE)];
        // The local side of the transfer: gathered (sends, writes) or scattered (reads).
        let local = if w.inline {
            Spans::one(w.inline_data.as_ptr().cast_mut(), w.inline_len)
        } else {
            let need = if w.opcode == Opcode::Read {
                AccessFlags::LOCAL_WRITE
            } else {
                AccessFlags::empty()
            };
            match resolve_local(&st[s], s, sges, need) {
                Some(l) => l,
                None => return done(WcStatus::LocalProtection),
            }
        };
        let Ok(total) = u32::try_from(local.total) else {
            return done(WcStatus::LocalLength);
        };
        if st[p].error || st[p].dead {
            return Outcome::NoAck;
        }
        if w.opcode.consumes_remote_recv() && st[p].rq.is_empty() {
            return Outcome::Rnr;
        }
        let remote = if w.opcode.is_rdma() && total > 0 {
            let need = if w.opcode == Opcode::Read {
                AccessFlags::REMOTE_READ
            } else {
                AccessFlags::REMOTE_WRITE
            };
            let r = &w.remote;
            match st[p].resolve(p, KeyKind::Remote, r.rkey, r.addr, u64::from(total), need) {
                Some(ptr) => Spans::one(ptr, total as usize),
                None => {
                    // Class C responder error: NAK to the requester, responder to error.
                    enter_error(st, p);
                    return done(WcStatus::RemoteAccess);
                }
            }
        } else {
            Spans::EMPTY
        };
        let imm = match w.opcode {
            Opcode::SendImm(i) | Opcode::WriteImm(i) => Some(i),
            _ => None,
        };
        match w.opcode {
            Opcode::Send | Opcode::SendImm(_) => {
                let Some(r) = st[p].rq.front_mut().map(|r| *r) else {
                    return Outcome::Rnr;
                };
                let rsges = &r.sges[..r.nsge.min(MAX_SGE)];
                let Some(dst) = resolve_local(&st[p], p, rsges, AccessFlags::LOCAL_WRITE) else {
                    fail_recv(st, p, WcStatus::LocalProtection);
                    return done(WcStatus::RemoteOperation);
                };
                if dst.total < local.total {
                    fail_recv(st, p, WcStatus::LocalLength);
                    return done(WcStatus::RemoteInvalidRequest);
                }
                // SAFETY: `local` spans are resolved, live registered ranges of `s` (or our
                // copy of the inline bytes), `dst` live ranges of `p` with local write
                // access; the posting contract keeps the buffers valid and unreferenced
                // while the requests are outstanding.
                unsafe { copy_spans(local.as_slice(), dst.as_slice()) };
                self.complete_recv(st, p, CompletionKind::Recv, total, imm);
            }
            Opcode::Write | Opcode::WriteImm(_) => {
                // SAFETY: as above; `remote` is a live range of `p` granting remote write.
                unsafe { copy_spans(local.as_slice(), remote.as_slice()) };
                if imm.is_some() {
                    self.complete_recv(st, p, CompletionKind::RecvWriteImm, total, imm);
                }
            }
            Opcode::Read => {
                // SAFETY: as above; `remote` grants remote read, `local` local write.
                unsafe { copy_spans(remote.as_slice(), local.as_slice()) };
            }
        }
        Outcome::Done {
            status: WcStatus::Success,
            byte_len: total,
        }
    }

    fn complete_recv(
        &self,
        st: &mut [QpState; 2],
        p: usize,
        kind: CompletionKind,
        byte_len: u32,
        imm: Option<u32>,
    ) {
        if let Some(r) = st[p].rq.pop() {
            let mut wc = completion(r.wr_id, WcStatus::Success, kind, p);
            wc.byte_len = byte_len;
            wc.imm = imm;
            st[p].push_recv_cqe(wc);
        }
    }
}
