//! What a net holds: its queue pairs (storage sized from the caps), its nodes (region table,
//! two completion queues, the list of waiting queue pairs) and the bookkeeping of
//! connections and key generations.

use alloc::boxed::Box;
use alloc::vec::Vec;
use core::mem::size_of;

use crate::completion::{Completion, CompletionKind, WcStatus};
use crate::params::QpCaps;

use super::super::entry::{Count, RawSge, SendHeader, NO_HEADER, NO_SGE};
use super::super::execute::Limits;
use super::super::region::{RegionSlot, NO_REGION};
use super::super::SoftStats;

/// "No queue pair" in the waiting lists.
pub(super) const NONE: u32 = u32::MAX;

/// Queue-pair numbers are the queue pair's index plus this (never 0, as on hardware).
pub(super) const QPN_BASE: u32 = 0x100;

/// Head and length of a ring whose capacity its owner knows.
#[derive(Clone, Copy, Debug, Default)]
pub(super) struct RingPos {
    pub(super) head: u32,
    pub(super) len: u32,
}

impl RingPos {
    /// The slot the next push fills, or `None` if the ring (of `cap` slots) is full.
    pub(super) fn tail(&self, cap: u32) -> Option<usize> {
        if self.len >= cap {
            return None;
        }
        Some(((u64::from(self.head) + u64::from(self.len)) % u64::from(cap)) as usize)
    }

    /// The slot of the oldest entry, or `None` if empty.
    pub(super) fn front(&self) -> Option<usize> {
        (self.len > 0).then_some(self.head as usize)
    }

    /// Drops the oldest entry; its slot.
    pub(super) fn pop(&mut self, cap: u32) -> Option<usize> {
        let i = self.front()?;
        self.head = ((u64::from(self.head) + 1) % u64::from(cap.max(1))) as u32;
        self.len -= 1;
        Some(i)
    }
}

/// One queue pair: its queues, sized from the caps, and its place in its node's waiting
/// list.
pub(super) struct QpSlot {
    pub(super) node: u32,
    pub(super) error: bool,
    /// Takes its receives from its node's shared receive queue (its own queue is unused).
    pub(super) on_srq: bool,
    /// Whether it is in its node's waiting list (its send queue is not empty).
    pub(super) waiting: bool,
    pub(super) prev: u32,
    pub(super) next: u32,
    pub(super) sq: RingPos,
    pub(super) rq: RingPos,
    pub(super) sq_count: Count,
    pub(super) rq_count: Count,
    /// `max_send_wr` send headers.
    pub(super) send: Box<[SendHeader]>,
    /// `max_send_wr` × `max_send_sge` send entries, then `max_recv_wr` × `max_recv_sge`
    /// receive entries.
    pub(super) sges: Box<[RawSge]>,
    /// `max_send_wr` × `max_inline_data` inline bytes.
    pub(super) inline: Box<[u8]>,
    /// `max_recv_wr` receive ids. A receive keeps no entry count: unused entries are
    /// zero-length, which execution skips unchecked, as it skips zero-length entries posted.
    pub(super) recv: Box<[u64]>,
}

impl QpSlot {
    /// A queue pair of `node` with storage for `caps`. Allocates.
    pub(super) fn new(node: u32, caps: &QpCaps) -> Self {
        let sw = caps.max_send_wr as usize;
        let rw = caps.max_recv_wr as usize;
        let sges = sw * caps.max_send_sge as usize + rw * caps.max_recv_sge as usize;
        Self {
            node,
            error: false,
            on_srq: false,
            waiting: false,
            prev: NONE,
            next: NONE,
            sq: RingPos::default(),
            rq: RingPos::default(),
            sq_count: Count::ZERO,
            rq_count: Count::ZERO,
            send: alloc::vec![NO_HEADER; sw].into_boxed_slice(),
            sges: alloc::vec![NO_SGE; sges].into_boxed_slice(),
            inline: alloc::vec![0u8; sw * caps.max_inline_data as usize].into_boxed_slice(),
            recv: alloc::vec![0u64; rw].into_boxed_slice(),
        }
    }

    /// Heap bytes of one queue pair's storage for `caps`.
    pub(super) fn heap_bytes(caps: &QpCaps) -> usize {
        let sw = caps.max_send_wr as usize;
        let rw = caps.max_recv_wr as usize;
        sw * size_of::<SendHeader>()
            + (sw * caps.max_send_sge as usize + rw * caps.max_recv_sge as usize)
                * size_of::<RawSge>()
            + sw * caps.max_inline_data as usize
            + rw * size_of::<u64>()
    }
}

/// A completion as a node's queue stores it (32 bytes rather than a [`Completion`]'s 40
/// plus the position it retires).
#[derive(Clone, Copy, Debug)]
pub(super) struct Cqe {
    pub(super) wr_id: u64,
    /// For send completions, the send-queue position it retires up to (inclusive).
    pub(super) seq: u64,
    /// The queue pair's index.
    pub(super) qp: u32,
    byte_len: u32,
    imm: u32,
    status: u8,
    kind: u8,
    has_imm: bool,
}

const NO_CQE: Cqe = Cqe {
    wr_id: 0,
    seq: 0,
    qp: 0,
    byte_len: 0,
    imm: 0,
    status: 0,
    kind: 0,
    has_imm: false,
};

const KINDS: [CompletionKind; 7] = [
    CompletionKind::Send,
    CompletionKind::Write,
    CompletionKind::Read,
    CompletionKind::Atomic,
    CompletionKind::Recv,
    CompletionKind::RecvWriteImm,
    CompletionKind::Other,
];

impl Cqe {
    pub(super) fn of(wc: &Completion, qp: u32, seq: u64) -> Self {
        Self {
            wr_id: wc.wr_id,
            seq,
            qp,
            byte_len: wc.byte_len,
            imm: wc.imm.unwrap_or(0),
            // The model makes only statuses with codes below 32.
            status: u8::try_from(wc.status.code()).unwrap_or(u8::MAX),
            kind: KINDS.iter().position(|k| *k == wc.kind).unwrap_or(6) as u8,
            has_imm: wc.imm.is_some(),
        }
    }

    pub(super) fn completion(&self) -> Completion {
        Completion {
            wr_id: self.wr_id,
            status: WcStatus::from_code(u32::from(self.status)),
            vendor_err: 0,
            kind: KINDS
                .get(usize::from(self.kind))
                .copied()
                .unwrap_or(CompletionKind::Other),
            byte_len: self.byte_len,
            imm: self.has_imm.then_some(self.imm),
            qp_num: QPN_BASE.wrapping_add(self.qp),
            // The model keeps no device clock.
            timestamp: None,
        }
    }
}

/// A completion queue several queue pairs share.
pub(super) struct CqRing {
    ring: Box<[Cqe]>,
    pos: RingPos,
    /// A completion did not fit: every poll fails from now on.
    pub(super) overflow: bool,
    /// Whether [`SoftNet`](super::SoftNet) handed the queue out.
    pub(super) taken: bool,
}

impl CqRing {
    fn new(cap: u32) -> Self {
        Self {
            ring: alloc::vec![NO_CQE; cap as usize].into_boxed_slice(),
            pos: RingPos::default(),
            overflow: false,
            taken: false,
        }
    }

    /// Completions it holds.
    pub(super) fn len(&self) -> u32 {
        self.pos.len
    }

    pub(super) fn cap(&self) -> u32 {
        self.ring.len() as u32
    }

    pub(super) fn push(&mut self, cqe: Cqe) {
        match self.pos.tail(self.cap()) {
            Some(i) => {
                if let Some(s) = self.ring.get_mut(i) {
                    *s = cqe;
                    self.pos.len += 1;
                    return;
                }
                self.overflow = true;
            }
            None => self.overflow = true,
        }
    }

    pub(super) fn pop(&mut self) -> Option<Cqe> {
        let cap = self.cap();
        let i = self.pos.pop(cap)?;
        self.ring.get(i).copied()
    }
}

/// One node: its protection domain, its two completion queues, its waiting queue pairs.
/// A node's shared receive queue: receives any of its queue pairs connected after it was
/// created take, oldest first.
pub(super) struct SrqState {
    pub(super) cap: u32,
    pub(super) ring: RingPos,
    pub(super) posted: u64,
    /// Receives whose completion was polled (occupancy ends there, as for a queue pair's).
    pub(super) retired: u64,
    /// `cap` receive ids.
    pub(super) ids: Box<[u64]>,
    /// `cap` × `max_recv_sge` entries.
    pub(super) sges: Box<[RawSge]>,
}

impl SrqState {
    /// A queue of `cap` receives of `nsge` entries. Allocates.
    pub(super) fn new(cap: u32, nsge: u32) -> Self {
        Self {
            cap,
            ring: RingPos::default(),
            posted: 0,
            retired: 0,
            ids: alloc::vec![0u64; cap as usize].into_boxed_slice(),
            sges: alloc::vec![NO_SGE; cap as usize * nsge as usize].into_boxed_slice(),
        }
    }

    fn heap_bytes(&self) -> usize {
        self.ids.len() * size_of::<u64>() + self.sges.len() * size_of::<RawSge>()
    }
}

pub(super) struct NodeState {
    pub(super) regions: Box<[RegionSlot]>,
    /// Its shared receive queue, if it has one.
    pub(super) srq: Option<SrqState>,
    pub(super) send_cq: CqRing,
    pub(super) recv_cq: CqRing,
    /// Its queue pairs, for [`SoftNet::kill`](super::SoftNet::kill).
    pub(super) qps: Vec<u32>,
    /// The queue pairs whose send-queue head waits (a doubly linked list through
    /// [`QpSlot::prev`] and [`QpSlot::next`]): what a tick retries.
    pub(super) waiting_head: u32,
    pub(super) waiting_tail: u32,
    pub(super) waiting_len: u32,
    pub(super) dead: bool,
    /// How many times it was restarted ([`SoftNet::restart`](super::SoftNet::restart)):
    /// completion queue handles of an earlier life no longer reach its queues.
    pub(super) life: u32,
    pub(super) stats: SoftStats,
}

impl NodeState {
    fn new(max_regions: usize, cq_capacity: u32) -> Self {
        Self {
            regions: alloc::vec![NO_REGION; max_regions].into_boxed_slice(),
            srq: None,
            send_cq: CqRing::new(cq_capacity),
            recv_cq: CqRing::new(cq_capacity),
            qps: Vec::new(),
            waiting_head: NONE,
            waiting_tail: NONE,
            waiting_len: 0,
            dead: false,
            life: 0,
            stats: SoftStats::default(),
        }
    }
}

/// Everything the net's calls change. Queue pair `q`'s peer is `q ^ 1`: a connection
/// creates both ends at once, at indices `2c` and `2c + 1`.
pub(super) struct World {
    pub(super) caps: QpCaps,
    pub(super) limits: Limits,
    pub(super) nodes: Vec<NodeState>,
    pub(super) qps: Vec<QpSlot>,
    /// One bit per ordered pair `(a, b)`, `a < b`, at `a * nodes + b`: connected.
    connected: Vec<u64>,
    /// The generation the next registration gets (one counter for the whole net).
    pub(super) next_gen: u32,
    /// Datagram queue pairs (`net/datagram.rs`), numbered from `UD_QPN_BASE`.
    pub(super) ud: Vec<super::datagram::UdState>,
    /// Multicast groups and their members (datagram queue pair indices), in joining order.
    pub(super) groups: Vec<super::datagram::Group>,
}

impl World {
    /// The world of `nodes` nodes with no connections. Allocates.
    pub(super) fn new(
        nodes: u32,
        caps: QpCaps,
        limits: Limits,
        cq_capacity: u32,
        max_regions: usize,
    ) -> Self {
        let n = nodes as usize;
        Self {
            caps,
            limits,
            nodes: (0..n)
                .map(|_| NodeState::new(max_regions, cq_capacity))
                .collect(),
            qps: Vec::new(),
            connected: alloc::vec![0u64; (n * n).div_ceil(64)],
            next_gen: 1,
            ud: Vec::new(),
            groups: Vec::new(),
        }
    }

    /// Connects `a` and `b`: both ends, at indices `2c` (of `a`) and `2c + 1`. `None` if
    /// either node does not exist, `a == b`, or they are connected already. Allocates.
    pub(super) fn connect(&mut self, a: u32, b: u32) -> Option<u32> {
        let n = self.nodes.len();
        let (lo, hi) = (a.min(b) as usize, a.max(b) as usize);
        if a == b || hi >= n {
            return None;
        }
        let bit = lo * n + hi;
        let word = self.connected.get_mut(bit / 64)?;
        if *word & (1 << (bit % 64)) != 0 {
            return None;
        }
        let q = u32::try_from(self.qps.len()).ok()?;
        if q > u32::MAX - QPN_BASE - 2 {
            return None;
        }
        *word |= 1 << (bit % 64);
        for node in [a, b] {
            let mut qp = QpSlot::new(node, &self.caps);
            qp.on_srq = self.nodes[node as usize].srq.is_some();
            self.qps.push(qp);
        }
        self.nodes[a as usize].qps.push(q);
        self.nodes[b as usize].qps.push(q + 1);
        Some(q)
    }

    /// Gives dead node `n` a new life: its queue pairs of the old one are cut off (they
    /// belong to no node any more: nothing they do reaches a node's queues or memory, and
    /// peers' requests to them still get no answer), its regions are gone, its completion
    /// queues are new and not yet handed out, it has no shared receive queue and no
    /// connections, so every other node can connect to it again. `false` (nothing changed)
    /// if `n` does not exist or is alive. Allocates (its new queues).
    pub(super) fn restart(&mut self, n: usize) -> bool {
        if !self.nodes.get(n).is_some_and(|node| node.dead) {
            return false;
        }
        let old = core::mem::take(&mut self.nodes[n].qps);
        for q in old {
            self.unwait(q as usize);
            if let Some(qp) = self.qps.get_mut(q as usize) {
                qp.error = true;
                qp.node = NONE;
            }
        }
        let count = self.nodes.len();
        for m in 0..count {
            let (lo, hi) = (m.min(n), m.max(n));
            let bit = lo * count + hi;
            if let Some(word) = self.connected.get_mut(bit / 64) {
                *word &= !(1 << (bit % 64));
            }
        }
        let node = &mut self.nodes[n];
        let (life, stats) = (node.life.wrapping_add(1), node.stats);
        *node = NodeState::new(node.regions.len(), node.send_cq.cap());
        node.life = life;
        node.stats = stats;
        true
    }

    /// Puts `q` at the tail of its node's waiting list (if it is not there yet).
    pub(super) fn wait(&mut self, q: usize) {
        let Some(qp) = self.qps.get(q) else {
            return;
        };
        if qp.waiting {
            return;
        }
        let Some(node) = self.nodes.get_mut(qp.node as usize) else {
            return;
        };
        let (q32, tail) = (q as u32, node.waiting_tail);
        match self.qps.get_mut(tail as usize) {
            Some(t) => t.next = q32,
            None => node.waiting_head = q32,
        }
        node.waiting_tail = q32;
        node.waiting_len += 1;
        if let Some(qp) = self.qps.get_mut(q) {
            qp.waiting = true;
            qp.prev = tail;
            qp.next = NONE;
        }
    }

    /// Takes `q` off its node's waiting list (if it is there).
    pub(super) fn unwait(&mut self, q: usize) {
        let Some(qp) = self.qps.get_mut(q) else {
            return;
        };
        if !qp.waiting {
            return;
        }
        qp.waiting = false;
        let (prev, next, node) = (qp.prev, qp.next, qp.node);
        qp.prev = NONE;
        qp.next = NONE;
        let Some(node) = self.nodes.get_mut(node as usize) else {
            return;
        };
        match self.qps.get_mut(prev as usize) {
            Some(p) => p.next = next,
            None => node.waiting_head = next,
        }
        match self.qps.get_mut(next as usize) {
            Some(n) => n.prev = prev,
            None => node.waiting_tail = prev,
        }
        node.waiting_len -= 1;
    }

    /// Bytes of the world's state (the structures and their heap storage; not the
    /// registered buffers, which the caller owns).
    pub(super) fn footprint(&self) -> usize {
        let nodes: usize = self
            .nodes
            .iter()
            .map(|n| {
                n.regions.len() * size_of::<RegionSlot>()
                    + n.srq.as_ref().map_or(0, SrqState::heap_bytes)
                    + 2 * n.send_cq.ring.len() * size_of::<Cqe>()
                    + n.qps.capacity() * size_of::<u32>()
            })
            .sum();
        size_of::<Self>()
            + self.nodes.capacity() * size_of::<NodeState>()
            + nodes
            + self.qps.capacity() * size_of::<QpSlot>()
            + self.qps.len() * QpSlot::heap_bytes(&self.caps)
            + self.connected.capacity() * size_of::<u64>()
            + self
                .ud
                .iter()
                .map(super::datagram::UdState::heap_bytes)
                .sum::<usize>()
            + self
                .groups
                .iter()
                .map(super::datagram::Group::heap_bytes)
                .sum::<usize>()
    }
}
