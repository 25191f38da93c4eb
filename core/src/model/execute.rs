//! How work executes, whatever holds the queue pairs: posting, running a send queue, one
//! attempt at its head, flushing (see [When work executes](super#when-work-executes) and
//! [Semantics](super#semantics)).
//!
//! The rules are written once, against [`Wiring`], which the two queue pairs of a
//! [`SoftFabric`](super::SoftFabric) implement (`pair.rs`), and so do the many of a
//! `SoftNet` (`net/calls.rs`). Which calls run which queues, and where completions go, is
//! the business of each model.

use crate::completion::{Completion, CompletionKind, WcStatus};
use crate::params::{QpCaps, RetryCount, RnrRetry};
use crate::sge::Sge;
use crate::wr::{AtomicOp, Opcode, PostFailure, RecvRequest, WorkRequest, ATOMIC_LEN, MAX_BATCH};

use super::entry::{build_send, check_send, completion, RawSge, SendHeader, NO_SGE};
use super::keys::Reach;
use super::spans::{copy_spans, gather, Spans};
use super::{AccessFlags, SoftStats, EINVAL, ENOMEM, MAX_SGE};

/// How many retries a blocked request gets.
#[derive(Clone, Copy, Debug)]
pub(super) struct Limits {
    /// Retries after an RNR NAK; `None`: retry forever.
    pub(super) rnr: Option<u8>,
    /// Retries when the peer does not answer.
    pub(super) retry: u8,
}

impl Limits {
    pub(super) const fn new(rnr_retry: RnrRetry, retry_count: RetryCount) -> Self {
        Self {
            rnr: match rnr_retry {
                RnrRetry::Infinite => None,
                r => Some(r.code()),
            },
            retry: retry_count.get(),
        }
    }
}

/// Queue pairs, named by index, as the execution rules see them. A model implements it over
/// its own storage; every method is O(1) or O(entries of one request) and does not allocate.
pub(super) trait Wiring {
    /// The caps of every queue pair (after clamping).
    fn caps(&self) -> QpCaps;
    /// Retry limits of every queue pair.
    fn limits(&self) -> Limits;
    /// The number completions of `q` carry.
    fn qp_num(&self, q: usize) -> u32;
    /// The other end of `q`'s connection.
    fn peer(&self, q: usize) -> usize;
    /// Whether `q` is in the error state.
    fn in_error(&self, q: usize) -> bool;
    /// Moves `q` to the error state (without flushing: [`enter_error`] does that).
    fn mark_error(&mut self, q: usize);
    /// Whether `q` answers no requests (its process is dead, or it is in the error state).
    fn unreachable(&self, q: usize) -> bool;
    /// Resolves `at` against the memory `q` may use (its side's or node's region table).
    fn resolve(&self, q: usize, at: &Reach) -> Option<*mut u8>;
    /// Send-queue slots of `q` in use (posted, not retired by a polled completion).
    fn send_used(&self, q: usize) -> u64;
    /// Receive-queue slots of `q` in use.
    fn recv_used(&self, q: usize) -> u64;
    /// Appends an entry to `q`'s send queue: `fill` writes its entries or inline bytes into
    /// the storage it is given and returns its header. `Err` with `fill`'s errno, or
    /// `ENOMEM` if the queue is full.
    fn push_send(
        &mut self,
        q: usize,
        fill: impl FnOnce(&mut [RawSge], &mut [u8]) -> Result<SendHeader, i32>,
    ) -> Result<(), i32>;
    /// Appends a receive to `q`'s receive queue; `Err(ENOMEM)` if it is full.
    fn push_recv(&mut self, q: usize, wr_id: u64, sges: &[Sge<'_>]) -> Result<(), i32>;
    /// Copies the head of `q`'s send queue out into `into` (execution changes the queues
    /// while it reads the request). Returns the header and the head's position in the send
    /// queue, or `None` if the queue is empty.
    fn load_send_head(&self, q: usize, into: &mut HeadCopy<'_>) -> Option<(SendHeader, u64)>;
    /// The header of the head of `q`'s send queue, for its retry state.
    fn send_head_mut(&mut self, q: usize) -> Option<&mut SendHeader>;
    /// Removes the head of `q`'s send queue; its `(wr_id, position)`.
    fn pop_send(&mut self, q: usize) -> Option<(u64, u64)>;
    /// Whether `q` has a receive posted.
    fn has_recv(&self, q: usize) -> bool;
    /// Copies the entries of `q`'s oldest receive into `sges`; how many, or `None`.
    fn load_recv_head(&self, q: usize, sges: &mut [RawSge; MAX_SGE]) -> Option<usize>;
    /// Removes `q`'s oldest receive; its `wr_id`.
    fn pop_recv(&mut self, q: usize) -> Option<u64>;
    /// Delivers a send completion of `q`, which retires `q`'s send queue up to `seq` when
    /// polled.
    fn push_send_cqe(&mut self, q: usize, wc: Completion, seq: u64);
    /// Delivers a receive completion of `q`.
    fn push_recv_cqe(&mut self, q: usize, wc: Completion);
    /// The counters `q`'s work counts into (`None` only for a queue pair that does not
    /// exist).
    fn stats(&mut self, q: usize) -> Option<&mut SoftStats>;
}

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

/// Posts `wrs` one at a time with `post` (which counts it in the stats too): a batch over
/// [`MAX_BATCH`] is refused whole; otherwise posting stops at the first refusal and says how
/// many went before it, as a device's chain post does.
fn post_each<T>(wrs: &[T], mut post: impl FnMut(&T) -> Result<(), i32>) -> Result<(), PostFailure> {
    if wrs.len() > MAX_BATCH {
        return Err(PostFailure {
            posted: 0,
            errno: EINVAL,
        });
    }
    for (i, wr) in wrs.iter().enumerate() {
        post(wr).map_err(|errno| PostFailure { posted: i, errno })?;
    }
    Ok(())
}

/// Posts send requests to `q` (checks, occupancy, inline copies); runs nothing.
///
/// # Safety
/// The posting contract.
pub(super) unsafe fn post_send<W: Wiring>(
    w: &mut W,
    q: usize,
    wrs: &[WorkRequest<'_>],
) -> Result<(), PostFailure> {
    let caps = w.caps();
    post_each(wrs, |wr| {
        check_send(&caps, wr)?;
        if w.send_used(q) >= u64::from(caps.max_send_wr) {
            return Err(ENOMEM);
        }
        w.push_send(q, |sges, inline| {
            // SAFETY: forwarded posting contract.
            unsafe { build_send(wr, sges, inline) }
        })?;
        if let Some(stats) = w.stats(q) {
            stats.sends_posted += 1;
        }
        Ok(())
    })
}

/// Posts receives to `q`; runs nothing.
pub(super) fn post_recv<W: Wiring>(
    w: &mut W,
    q: usize,
    wrs: &[RecvRequest<'_>],
) -> Result<(), PostFailure> {
    let caps = w.caps();
    post_each(wrs, |wr| {
        if wr.sges.len() > caps.max_recv_sge as usize {
            return Err(EINVAL);
        }
        if w.recv_used(q) >= u64::from(caps.max_recv_wr) {
            return Err(ENOMEM);
        }
        w.push_recv(q, wr.wr_id, wr.sges)?;
        if let Some(stats) = w.stats(q) {
            stats.recvs_posted += 1;
        }
        Ok(())
    })
}

/// Moves `q` to the error state and flushes everything outstanding on it, signaled or not.
pub(super) fn enter_error<W: Wiring>(w: &mut W, q: usize) {
    w.mark_error(q);
    let qp_num = w.qp_num(q);
    while let Some((wr_id, seq)) = w.pop_send(q) {
        let wc = completion(wr_id, WcStatus::Flushed, CompletionKind::Other, qp_num);
        w.push_send_cqe(q, wc, seq);
    }
    while let Some(wr_id) = w.pop_recv(q) {
        let wc = completion(wr_id, WcStatus::Flushed, CompletionKind::Other, qp_num);
        w.push_recv_cqe(q, wc);
    }
}

/// Fails the oldest receive of `p` with `status` and moves `p` to the error state (a
/// responder-side error that consumed a receive).
fn fail_recv<W: Wiring>(w: &mut W, p: usize, status: WcStatus) {
    if let Some(wr_id) = w.pop_recv(p) {
        let wc = completion(wr_id, status, CompletionKind::Other, w.qp_num(p));
        w.push_recv_cqe(p, wc);
    }
    enter_error(w, p);
}

/// Runs `q`'s send queue from its head as far as it goes. `tick`: `q`'s retry timer fires
/// in this call (one retry for a blocked head). `inline` is scratch room for one inline
/// payload (at least `max_inline_data` bytes).
///
/// Returns with the queue empty, or with its head blocked (tried, waiting for a receive at
/// the peer or for its retries to run out).
pub(super) fn run_send_queue<W: Wiring>(w: &mut W, inline: &mut [u8], q: usize, mut tick: bool) {
    let limits = w.limits();
    let qp_num = w.qp_num(q);
    let mut head = HeadCopy {
        sges: [NO_SGE; MAX_SGE],
        inline,
    };
    loop {
        if w.in_error(q) {
            // Requests posted in the error state, or left over by an error elsewhere.
            enter_error(w, q);
            return;
        }
        let Some((h, seq)) = w.load_send_head(q, &mut head) else {
            return;
        };
        let local = if h.inline {
            Local::Inline(head.inline.get(..usize::from(h.inline_len)).unwrap_or(&[]))
        } else {
            Local::Entries(head.sges.get(..usize::from(h.nsge)).unwrap_or(&[]))
        };
        let (status, byte_len) = match execute(w, q, &h, local) {
            Outcome::Done { status, byte_len } => (status, byte_len),
            blocked => {
                let (limit, fail) = match blocked {
                    Outcome::Rnr => (limits.rnr, WcStatus::RnrRetryExceeded),
                    _ => (Some(limits.retry), WcStatus::RetryExceeded),
                };
                let Some(head) = w.send_head_mut(q) else {
                    return;
                };
                let retried = if !head.tried {
                    head.tried = true;
                    false
                } else if tick {
                    head.retries = head.retries.saturating_add(1);
                    true
                } else {
                    return;
                };
                let retries = head.retries;
                if retried {
                    tick = false;
                    if let Some(stats) = w.stats(q) {
                        if fail == WcStatus::RnrRetryExceeded {
                            stats.rnr_retries += 1;
                        } else {
                            stats.transport_retries += 1;
                        }
                    }
                }
                match limit {
                    Some(l) if retries >= l => (fail, 0),
                    _ => return,
                }
            }
        };
        let _ = w.pop_send(q);
        let kind = match h.opcode {
            Opcode::Send | Opcode::SendImm(_) => CompletionKind::Send,
            Opcode::Write | Opcode::WriteImm(_) => CompletionKind::Write,
            Opcode::Read => CompletionKind::Read,
            Opcode::Atomic(_) => CompletionKind::Atomic,
        };
        if status.is_success() {
            if h.signaled {
                let mut wc = completion(h.wr_id, status, kind, qp_num);
                wc.byte_len = byte_len;
                w.push_send_cqe(q, wc, seq);
            }
        } else {
            let wc = completion(h.wr_id, status, CompletionKind::Other, qp_num);
            w.push_send_cqe(q, wc, seq);
            enter_error(w, q);
        }
    }
}

/// Where execution copies the head of a send queue ([`Wiring::load_send_head`]): its
/// entries, and room for its inline bytes (at least `max_inline_data`).
pub(super) struct HeadCopy<'a> {
    pub(super) sges: [RawSge; MAX_SGE],
    pub(super) inline: &'a mut [u8],
}

/// The local side of a request: its payload, copied at post time, or its entries.
#[derive(Clone, Copy)]
enum Local<'a> {
    Inline(&'a [u8]),
    Entries(&'a [RawSge]),
}

/// Resolves local entries of `q` (lkeys), each needing `need`.
fn resolve_local<W: Wiring>(w: &W, q: usize, sges: &[RawSge], need: AccessFlags) -> Option<Spans> {
    gather(sges, |s| w.resolve(q, &Reach::entry(s, need)))
}

/// One attempt at the request `h` at the head of `s`'s send queue.
fn execute<W: Wiring>(w: &mut W, s: usize, h: &SendHeader, local: Local<'_>) -> Outcome {
    let p = w.peer(s);
    // The local side of the transfer: gathered (sends, writes) or scattered (reads).
    let local = match local {
        Local::Inline(bytes) => Spans::one(bytes.as_ptr().cast_mut(), bytes.len()),
        Local::Entries(sges) => {
            let need = if h.opcode.writes_local() {
                AccessFlags::LOCAL_WRITE
            } else {
                AccessFlags::empty()
            };
            match resolve_local(w, s, sges, need) {
                Some(l) => l,
                None => return done(WcStatus::LocalProtection),
            }
        }
    };
    let Ok(total) = u32::try_from(local.total) else {
        return done(WcStatus::LocalLength);
    };
    if w.unreachable(p) {
        return Outcome::NoAck;
    }
    if h.opcode.consumes_remote_recv() && !w.has_recv(p) {
        return Outcome::Rnr;
    }
    if let Opcode::Atomic(op) = h.opcode {
        return atomic(w, p, h, op, &local);
    }
    let remote = if h.opcode.is_rdma() && total > 0 {
        let need = if h.opcode == Opcode::Read {
            AccessFlags::REMOTE_READ
        } else {
            AccessFlags::REMOTE_WRITE
        };
        match w.resolve(p, &Reach::remote(h.rkey, h.raddr, total, need)) {
            Some(ptr) => Spans::one(ptr, total as usize),
            None => {
                // Class C responder error: NAK to the requester, responder to error.
                enter_error(w, p);
                return done(WcStatus::RemoteAccess);
            }
        }
    } else {
        Spans::EMPTY
    };
    let imm = match h.opcode {
        Opcode::SendImm(i) | Opcode::WriteImm(i) => Some(i),
        _ => None,
    };
    match h.opcode {
        Opcode::Send | Opcode::SendImm(_) => {
            let mut rsges = [NO_SGE; MAX_SGE];
            let Some(n) = w.load_recv_head(p, &mut rsges) else {
                return Outcome::Rnr;
            };
            let rsges = rsges.get(..n).unwrap_or(&[]);
            let Some(dst) = resolve_local(w, p, rsges, AccessFlags::LOCAL_WRITE) else {
                fail_recv(w, p, WcStatus::LocalProtection);
                return done(WcStatus::RemoteOperation);
            };
            if dst.total < local.total {
                fail_recv(w, p, WcStatus::LocalLength);
                return done(WcStatus::RemoteInvalidRequest);
            }
            // SAFETY: `local` spans are resolved, live registered ranges of `s`'s memory (or
            // the caller's copy of the inline bytes), `dst` live ranges of `p`'s with local
            // write access; the posting contract keeps the buffers valid and unreferenced
            // while the requests are outstanding.
            unsafe { copy_spans(local.as_slice(), dst.as_slice()) };
            complete_recv(w, p, CompletionKind::Recv, total, imm);
        }
        Opcode::Write | Opcode::WriteImm(_) => {
            // SAFETY: as above; `remote` is a live range of `p`'s memory granting remote
            // write.
            unsafe { copy_spans(local.as_slice(), remote.as_slice()) };
            if imm.is_some() {
                complete_recv(w, p, CompletionKind::RecvWriteImm, total, imm);
            }
        }
        Opcode::Read => {
            // SAFETY: as above; `remote` grants remote read, `local` local write.
            unsafe { copy_spans(remote.as_slice(), local.as_slice()) };
        }
        // Executed by `atomic` above.
        Opcode::Atomic(_) => {}
    }
    Outcome::Done {
        status: WcStatus::Success,
        byte_len: total,
    }
}

/// The atomic `op` of the request `h` at its responder `p`, the prior value going to `local`
/// (one resolved 8-byte entry with local write access: `check_send` made sure of the length
/// at post). The model runs one request at a time, so the read-modify-write below is atomic
/// with respect to every other atomic of the model. As a responder does: an rkey that does
/// not grant [`AccessFlags::REMOTE_ATOMIC`] on the 8 bytes is a remote access error, a
/// misaligned address a NAK-invalid-request; both move the responder to the error state
/// (class C, as rxe does).
fn atomic<W: Wiring>(w: &mut W, p: usize, h: &SendHeader, op: AtomicOp, local: &Spans) -> Outcome {
    let len = u64::from(ATOMIC_LEN);
    let need = AccessFlags::REMOTE_ATOMIC;
    let Some(ptr) = w.resolve(p, &Reach::remote(h.rkey, h.raddr, ATOMIC_LEN, need)) else {
        enter_error(w, p);
        return done(WcStatus::RemoteAccess);
    };
    // `resolve` keeps the address, so the pointer is as aligned as `raddr`.
    if !h.raddr.is_multiple_of(len) {
        enter_error(w, p);
        return done(WcStatus::RemoteInvalidRequest);
    }
    let word = ptr.cast::<u64>();
    // SAFETY: `ptr` is a live, 8-aligned, 8-byte range of `p`'s registered memory that grants
    // remote atomic access; the CPU reaches region bytes only through volatile copies, so no
    // Rust reference to them exists.
    let prior = u64::from_le(unsafe { word.read_volatile() });
    // SAFETY: as above.
    unsafe { word.write_volatile(op.apply(prior).to_le()) };
    let bytes = prior.to_le_bytes();
    // SAFETY: the source is this function's array, the destination `local`'s resolved
    // entries with local write access, kept valid and unreferenced by the posting contract.
    unsafe {
        copy_spans(
            Spans::one(bytes.as_ptr().cast_mut(), bytes.len()).as_slice(),
            local.as_slice(),
        )
    };
    Outcome::Done {
        status: WcStatus::Success,
        byte_len: ATOMIC_LEN,
    }
}

/// Completes the oldest receive of `p` successfully.
fn complete_recv<W: Wiring>(
    w: &mut W,
    p: usize,
    kind: CompletionKind,
    byte_len: u32,
    imm: Option<u32>,
) {
    if let Some(wr_id) = w.pop_recv(p) {
        let mut wc = completion(wr_id, WcStatus::Success, kind, w.qp_num(p));
        wc.byte_len = byte_len;
        wc.imm = imm;
        w.push_recv_cqe(p, wc);
    }
}
