//! The queues of one queue pair (fixed rings of work and completion entries), its region
//! table, and the state that ties them together.

use crate::completion::{Completion, CompletionKind, WcStatus};
use crate::sge::RemoteMemory;
use crate::wr::Opcode;

use super::keys::{split_key, KeyKind};
use super::{AccessFlags, SoftStats, MAX_INLINE, MAX_REGIONS, MAX_SGE, QP_NUMS, QUEUE_CAP};

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

#[derive(Clone, Copy)]
pub(super) struct RawSge {
    pub(super) addr: u64,
    pub(super) len: u32,
    pub(super) key: u32,
}

const NO_SGE: RawSge = RawSge {
    addr: 0,
    len: 0,
    key: 0,
};

#[derive(Clone, Copy)]
pub(super) struct SendWqe {
    /// Position in this side's send queue (for occupancy accounting).
    pub(super) seq: u64,
    pub(super) wr_id: u64,
    pub(super) opcode: Opcode,
    pub(super) signaled: bool,
    pub(super) inline: bool,
    pub(super) nsge: usize,
    pub(super) sges: [RawSge; MAX_SGE],
    pub(super) inline_len: usize,
    pub(super) inline_data: [u8; MAX_INLINE],
    pub(super) remote: RemoteMemory,
    /// Whether the first attempt happened (later ones are retries).
    pub(super) tried: bool,
    pub(super) retries: u8,
}

pub(super) const NO_SEND: SendWqe = SendWqe {
    seq: 0,
    wr_id: 0,
    opcode: Opcode::Send,
    signaled: false,
    inline: false,
    nsge: 0,
    sges: [NO_SGE; MAX_SGE],
    inline_len: 0,
    inline_data: [0; MAX_INLINE],
    remote: RemoteMemory {
        addr: 0,
        len: 0,
        rkey: 0,
    },
    tried: false,
    retries: 0,
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

#[derive(Clone, Copy)]
pub(super) struct RegionSlot {
    /// The registered buffer (with the provenance of the `&'m mut [u8]` it came from).
    pub(super) ptr: *mut u8,
    pub(super) len: usize,
    pub(super) access: AccessFlags,
    /// Generation of the current (or last) registration; 0 = never used.
    pub(super) gen: u32,
    pub(super) live: bool,
}

const NO_REGION: RegionSlot = RegionSlot {
    ptr: core::ptr::null_mut(),
    len: 0,
    access: AccessFlags::empty(),
    gen: 0,
    live: false,
};

pub(super) struct QpState {
    pub(super) sq: Ring<SendWqe>,
    pub(super) rq: Ring<RecvWqe>,
    pub(super) scq: Ring<SendCqe>,
    pub(super) rcq: Ring<Completion>,
    pub(super) sq_posted: u64,
    pub(super) sq_retired: u64,
    pub(super) rq_posted: u64,
    pub(super) rq_retired: u64,
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
            sq_posted: 0,
            sq_retired: 0,
            rq_posted: 0,
            rq_retired: 0,
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

    /// Resolves `addr..addr+len` against the region named by `key`, or `None`.
    pub(super) fn resolve(
        &self,
        side: usize,
        kind: KeyKind,
        key: u32,
        addr: u64,
        len: u64,
        need: AccessFlags,
    ) -> Option<*mut u8> {
        let (gen, k, s, slot) = split_key(key);
        let r = self.regions.get(slot)?;
        if k != kind || s != side || gen == 0 || !r.live || r.gen != gen {
            return None;
        }
        if !r.access.contains(need) {
            return None;
        }
        let off = addr.checked_sub(r.ptr.addr() as u64)?;
        let end = off.checked_add(len)?;
        if end > r.len as u64 {
            return None;
        }
        // In bounds of the registered buffer, so this keeps its provenance and stays inside
        // the allocation (wrapping_add only because it needs no unsafe).
        Some(r.ptr.wrapping_add(off as usize))
    }
}

pub(super) const fn completion(
    wr_id: u64,
    status: WcStatus,
    kind: CompletionKind,
    qp: usize,
) -> Completion {
    Completion {
        wr_id,
        status,
        vendor_err: 0,
        kind,
        byte_len: 0,
        imm: None,
        qp_num: QP_NUMS[qp],
    }
}
