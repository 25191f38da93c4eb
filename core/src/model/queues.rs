//! The queues of one queue pair (fixed rings of work and completion entries), its region
//! table, and the state that ties them together.

use crate::completion::Completion;

use super::entry::{Count, RawSge, SendHeader, NO_HEADER, NO_SGE};
use super::keys::{split_key, Reach};
use super::region::{RegionSlot, NO_REGION};
use super::{SoftStats, MAX_INLINE, MAX_REGIONS, MAX_SGE, QUEUE_CAP};

/// A fixed-capacity FIFO. A full ring hands the rejected value back.
pub(super) struct Ring<T: Copy> {
    buf: [T; QUEUE_CAP],
    head: usize,
    pub(super) len: usize,
}

impl<T: Copy> Ring<T> {
    const fn new(fill: T) -> Self {
        Self {
            buf: [fill; QUEUE_CAP],
            head: 0,
            len: 0,
        }
    }

    pub(super) fn push(&mut self, v: T) -> Result<(), T> {
        if self.len == QUEUE_CAP {
            return Err(v);
        }
        self.buf[(self.head + self.len) % QUEUE_CAP] = v;
        self.len += 1;
        Ok(())
    }

    pub(super) fn front(&self) -> Option<&T> {
        if self.len == 0 {
            None
        } else {
            Some(&self.buf[self.head])
        }
    }

    pub(super) fn front_mut(&mut self) -> Option<&mut T> {
        if self.len == 0 {
            None
        } else {
            Some(&mut self.buf[self.head])
        }
    }

    pub(super) fn pop(&mut self) -> Option<T> {
        if self.len == 0 {
            return None;
        }
        let v = self.buf[self.head];
        self.head = (self.head + 1) % QUEUE_CAP;
        self.len -= 1;
        Some(v)
    }

    pub(super) fn is_empty(&self) -> bool {
        self.len == 0
    }
}

/// A send-queue entry: header, entries and inline payload in one array element.
#[derive(Clone, Copy)]
pub(super) struct SendWqe {
    pub(super) hdr: SendHeader,
    pub(super) sges: [RawSge; MAX_SGE],
    pub(super) inline_data: [u8; MAX_INLINE],
}

pub(super) const NO_SEND: SendWqe = SendWqe {
    hdr: NO_HEADER,
    sges: [NO_SGE; MAX_SGE],
    inline_data: [0; MAX_INLINE],
};

#[derive(Clone, Copy)]
pub(super) struct RecvWqe {
    pub(super) wr_id: u64,
    pub(super) nsge: usize,
    pub(super) sges: [RawSge; MAX_SGE],
}

pub(super) const NO_RECV: RecvWqe = RecvWqe {
    wr_id: 0,
    nsge: 0,
    sges: [NO_SGE; MAX_SGE],
};

/// A send completion and the send-queue position it retires up to.
#[derive(Clone, Copy)]
pub(super) struct SendCqe {
    pub(super) wc: Completion,
    pub(super) seq: u64,
}

const NO_SEND_CQE: SendCqe = SendCqe {
    wc: Completion::EMPTY,
    seq: 0,
};

pub(super) struct QpState {
    pub(super) sq: Ring<SendWqe>,
    pub(super) rq: Ring<RecvWqe>,
    pub(super) scq: Ring<SendCqe>,
    pub(super) rcq: Ring<Completion>,
    pub(super) sq_count: Count,
    pub(super) rq_count: Count,
    pub(super) error: bool,
    pub(super) dead: bool,
    pub(super) cq_overflow: bool,
    pub(super) regions: [RegionSlot; MAX_REGIONS],
    pub(super) stats: SoftStats,
}

impl QpState {
    pub(super) const fn new() -> Self {
        Self {
            sq: Ring::new(NO_SEND),
            rq: Ring::new(NO_RECV),
            scq: Ring::new(NO_SEND_CQE),
            rcq: Ring::new(Completion::EMPTY),
            sq_count: Count::ZERO,
            rq_count: Count::ZERO,
            error: false,
            dead: false,
            cq_overflow: false,
            regions: [NO_REGION; MAX_REGIONS],
            stats: SoftStats {
                sends_posted: 0,
                recvs_posted: 0,
                send_cqes: 0,
                recv_cqes: 0,
                rnr_retries: 0,
                transport_retries: 0,
                datagrams_dropped: 0,
            },
        }
    }

    pub(super) fn push_send_cqe(&mut self, cqe: SendCqe) {
        self.stats.send_cqes += 1;
        if self.scq.push(cqe).is_err() {
            self.cq_overflow = true;
        }
    }

    pub(super) fn push_recv_cqe(&mut self, wc: Completion) {
        self.stats.recv_cqes += 1;
        if self.rcq.push(wc).is_err() {
            self.cq_overflow = true;
        }
    }

    /// Resolves `at` against the region its key names, or `None`.
    pub(super) fn resolve(&self, side: usize, at: &Reach) -> Option<*mut u8> {
        let (gen, k, s, slot) = split_key(at.sge.key);
        if k != at.kind || s != side {
            return None;
        }
        self.regions.get(slot)?.reach(gen, at)
    }
}
