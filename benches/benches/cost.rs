//! Instructions per operation, rverbs beside hand-written raw verbs, counted by callgrind:
//! the measuring half of `tools/cost` (which runs this binary under valgrind, reads the
//! counts and checks them against `benches/cost-budgets.txt`).
//!
//! Every case runs on the instant device (`rverbs_core::instant`, feature
//! `instant`): a driver behind libibverbs' operations table that completes each request when
//! it is posted and never touches memory. The `raw` side of a case does the same work by
//! hand, as a C program on the legacy verbs would: it fills `ibv_send_wr`/`ibv_recv_wr`
//! lists itself and calls the driver's `post_send` and `post_recv` directly. The
//! `raw_wr` side of the cases that post ([`WR_CASES`]) posts as a C program on the extended
//! verbs would: `ibv_wr_start`, per request the `wr_id`/`wr_flags` fields, one builder
//! (`ibv_wr_rdma_write`, ...) and one data setter (`ibv_wr_set_sge`,
//! `ibv_wr_set_inline_data`), then `ibv_wr_complete`, each called through the `ibv_qp_ex`
//! entry points as `verbs.h`'s inline functions do (rverbs posts through the same entry
//! points of the instant device's queue pairs). `tools/cost` compares rverbs with the
//! cheaper of the two. Both hand-written sides take completions through the extended entry
//! points, as rverbs does on the instant device, whose queues are extended ones: with the
//! usual hand-written `ibv_start_poll`/`ibv_next_poll`/`ibv_end_poll` sequence (rverbs
//! itself makes each completion a `start_poll`/`end_poll` batch, the same three calls for a
//! poll that takes one completion, because rxe's `next_poll` does not fit that sequence),
//! reading only what it needs (`wr_id`, `status`, and a receive's length and immediate);
//! side `raw-legacy` posts the chain and polls with `ibv_poll_cq`, for comparison. The
//! driver's own instructions are in every column.
//!
//! `cost <case> <side> <n>` (side `rverbs`, `raw` or `raw-legacy`) sets the case up, then calls [`measured`] three times: `n`
//! operations to warm up, then `n`, then `2n`. Under `valgrind --tool=callgrind
//! --collect-atstart=no --toggle-collect='cost::counted::*' --dump-after='cost::counted::measured'`
//! each call is one dump of exactly the instructions inside it, so `(dump 3 - dump 2) / n`
//! is the count per operation with the call's fixed cost
//! cancelled; with `n` a multiple of 64 every periodic action (a signaled request every
//! 16th, a sweep every 8th `progress`) falls the same number of times into each run. What
//! the bench plays of a peer (its writes into our flags, its messages arriving) runs in
//! [`peer`], which the same `--toggle-collect` pattern switches off again: it is in neither
//! column. A loop's own increment and branch (2 to 3 instructions per operation) are in
//! both.
//!
//! Run without arguments (as `cargo bench` does) it runs every case briefly on both sides,
//! checking each does its work; `cost --list` prints the case names.
#![allow(missing_docs)] // A bench binary.

use core::hint::black_box;
use core::mem::MaybeUninit;
use core::time::Duration;
use rverbs_core::node::Components;
use rverbs_core::node::Members;
use rverbs_core::wire::FlagLayout;

use rverbs_core::barrier::BarrierAlgorithm;
use rverbs_core::channel::{Channel, ChannelConfig, RecvRing};
use rverbs_core::datagram::{memory_needed, Datagram, DatagramConfig};
use rverbs_core::instant::{
    Arrivals, InstantCq, InstantDevice, InstantQp, InstantRegion, PeerHand,
};
use rverbs_core::memory::AccessFlags;
use rverbs_core::node::{Event, Node, NodeParts};
use rverbs_core::params::QpCaps;
use rverbs_core::poll::Spin;
use rverbs_core::provider::datagram::{DatagramProvider, Destination};
use rverbs_core::provider::shared::{RoutedQp, SharedCqs};
use rverbs_core::sge::RemoteMemory;
use rverbs_core::verbs::ffi::sys;
use rverbs_std_shim::MONOTONIC;

const MSG: usize = 64;
const BATCH: usize = 32;
/// The cases with a hand-written `ibv_wr_*` side (`raw_wr`).
const WR_CASES: &[&str] = &[
    "blocking_write",
    "unpolled_inline_write",
    "batch_32",
    "datagram_send",
    "atomic",
];

/// The channel's default signaling interval, used by both sides.
const SIGNAL_EVERY: u64 = 16;
/// Receive slots of a ring (both sides).
const SLOTS: usize = 16;

/// The cases, in the order `tools/cost` reports them.
const CASES: &[&str] = &[
    "blocking_write",
    "unpolled_inline_write",
    "batch_32",
    "barrier_2",
    "barrier_8",
    "barrier_64",
    "progress_idle",
    "recv_ring",
    "node_message",
    "datagram_send",
    "atomic",
];

fn caps() -> QpCaps {
    QpCaps {
        max_send_wr: 128,
        max_recv_wr: 64,
        max_send_sge: 1,
        max_recv_sge: 1,
        max_inline_data: 64,
    }
}

const RW: AccessFlags = AccessFlags::LOCAL_WRITE.union(AccessFlags::REMOTE);

/// The two functions callgrind's one `--toggle-collect='cost::counted::*'` names (valgrind
/// keeps only the last `--toggle-collect` it is given, so both match one pattern).
mod counted {
    /// Runs `op` `n` times: what is counted (see the module docs).
    #[inline(never)]
    pub(crate) fn measured<F: FnMut()>(op: &mut F, n: u64) {
        for _ in 0..n {
            op();
        }
    }

    /// What the bench plays of a peer: entered inside [`measured`], it switches counting off
    /// until it returns.
    #[inline(never)]
    pub(crate) fn peer<T, F: FnOnce() -> T>(act: F) -> T {
        act()
    }
}
use counted::{measured, peer};

/// `n` operations to warm up, then `n` and `2n`: three calls of [`measured`], three dumps
/// (the first is the warm-up's).
fn run<F: FnMut()>(mut op: F, n: u64) {
    measured(&mut op, n);
    measured(&mut op, n);
    measured(&mut op, 2 * n);
}

/// A hand-written poster and poller on raw verbs: what a C program does. `Q` queue pairs
/// share its completion queue (with more than one, a request's id carries its queue pair's
/// index; with one, the compiler removes the indexing).
struct Raw<const Q: usize = 1> {
    qps: [*mut sys::ibv_qp; Q],
    /// The queue pairs' extended form (null where the bench posts only the legacy way).
    qpx: [*mut sys::ibv_qp_ex; Q],
    cq: *mut sys::ibv_cq,
    /// The chain's `BATCH` requests, on the heap and reached only through this pointer (a
    /// reference to the array, taken anew for each request, would invalidate the `next`
    /// pointers linked through an earlier one: freed on drop.
    chain: *mut sys::ibv_send_wr,
    sge: sys::ibv_sge,
    /// The entry of an inline request (its bytes are copied during the post).
    isge: sys::ibv_sge,
    /// Per queue pair: requests posted, requests retired.
    next: [u64; Q],
    done: [u64; Q],
    depth: u64,
    /// Poll with `ibv_poll_cq` rather than the extended sequence.
    legacy: bool,
}

const QP_SHIFT: u32 = 48;

impl<const Q: usize> Raw<Q> {
    fn new(qps: [*mut sys::ibv_qp; Q], cq: *mut sys::ibv_cq, sge: (u64, u32, u32)) -> Self {
        // SAFETY: ibv_send_wr is plain C data; zero is a valid value.
        let chain: Box<[sys::ibv_send_wr; BATCH]> =
            Box::new(unsafe { MaybeUninit::zeroed().assume_init() });
        let chain = Box::into_raw(chain).cast::<sys::ibv_send_wr>();
        Self {
            qps,
            qpx: [core::ptr::null_mut(); Q],
            cq,
            chain,
            sge: sys::ibv_sge {
                addr: sge.0,
                length: sge.1,
                lkey: sge.2,
            },
            isge: sys::ibv_sge {
                addr: 0,
                length: 0,
                lkey: 0,
            },
            next: [0; Q],
            done: [0; Q],
            depth: u64::from(caps().max_send_wr) - 1,
            legacy: legacy_poll(),
        }
    }

    /// Fills request `i` of the chain for queue pair `q`: opcode `op`, our entry (or `inline`
    /// bytes), linked behind request `i - 1`. The caller sets the opcode's own fields.
    #[inline]
    fn build(
        &mut self,
        q: usize,
        i: usize,
        op: sys::ibv_wr_opcode::Type,
        inline: Option<&[u8]>,
        signaled: bool,
    ) -> &mut sys::ibv_send_wr {
        let base = self.chain;
        let (id, flags) = self.next_id(q, inline.is_some(), signaled);
        let sg_list = match inline {
            Some(d) => {
                self.isge.addr = d.as_ptr() as u64;
                self.isge.length = d.len() as u32;
                &raw mut self.isge
            }
            None => &raw mut self.sge,
        };
        // SAFETY: i < BATCH (the callers' loops), so i and i - 1 are inside the chain, which
        // only `self.chain` reaches; no reference into it outlives the caller's use of the
        // one returned, and the link to request i is made from the chain's pointer.
        unsafe {
            if i > 0 {
                (*base.add(i - 1)).next = base.add(i);
            }
            let w = &mut *base.add(i);
            w.wr_id = id;
            w.next = core::ptr::null_mut();
            w.sg_list = sg_list;
            w.num_sge = 1;
            w.opcode = op;
            w.send_flags = flags;
            w
        }
    }

    /// An RDMA write of request `i` to `to`.
    #[inline]
    fn write(&mut self, q: usize, i: usize, to: RemoteMemory, inline: Option<&[u8]>, sig: bool) {
        let w = self.build(q, i, sys::ibv_wr_opcode::IBV_WR_RDMA_WRITE, inline, sig);
        w.wr.rdma.remote_addr = to.addr;
        w.wr.rdma.rkey = to.rkey;
    }

    /// Queue pair `q`'s next request id, and the `IBV_SEND_*` flags of a request.
    #[inline]
    fn next_id(&mut self, q: usize, inline: bool, signaled: bool) -> (u64, u32) {
        let mut flags = if inline {
            sys::ibv_send_flags::IBV_SEND_INLINE.0
        } else {
            0
        };
        if signaled {
            flags |= sys::ibv_send_flags::IBV_SEND_SIGNALED.0;
        }
        let id = (q as u64) << QP_SHIFT | self.next[q];
        self.next[q] += 1;
        (id, flags)
    }

    /// `ibv_wr_start` on queue pair `q`.
    #[inline]
    fn wr_start(&mut self, q: usize) {
        let x = self.qpx[q];
        // SAFETY: the extended QP lives as long as the device the bench keeps and has its
        // entry points (checked when it was set); as verbs.h's inline function, no check.
        unsafe { ((*x).wr_start.unwrap_unchecked())(x) }
    }

    /// The `wr_id` and `wr_flags` of queue pair `q`'s next request, set before its builder.
    #[inline]
    fn wr_header(&mut self, q: usize, inline: bool, signaled: bool) -> *mut sys::ibv_qp_ex {
        let (id, flags) = self.next_id(q, inline, signaled);
        let x = self.qpx[q];
        // SAFETY: as in wr_start.
        unsafe {
            (*x).wr_id = id;
            (*x).wr_flags = flags;
        }
        x
    }

    /// Our entry (or `inline` bytes) as the data of the request just built.
    #[inline]
    fn wr_data(&mut self, x: *mut sys::ibv_qp_ex, inline: Option<&[u8]>) {
        // SAFETY: as in wr_start; the inline bytes are copied during the call (the instant
        // device copies nothing), our entry names the bench's region.
        unsafe {
            match inline {
                Some(d) => ((*x).wr_set_inline_data.unwrap_unchecked())(
                    x,
                    d.as_ptr().cast_mut().cast(),
                    d.len(),
                ),
                None => ((*x).wr_set_sge.unwrap_unchecked())(
                    x,
                    self.sge.lkey,
                    self.sge.addr,
                    self.sge.length,
                ),
            }
        }
    }

    /// `ibv_wr_rdma_write` to `to` on queue pair `q`, inside a section.
    #[inline]
    fn wr_write(&mut self, q: usize, to: RemoteMemory, inline: Option<&[u8]>, sig: bool) {
        let x = self.wr_header(q, inline.is_some(), sig);
        // SAFETY: as in wr_start.
        unsafe { ((*x).wr_rdma_write.unwrap_unchecked())(x, to.rkey, to.addr) };
        self.wr_data(x, inline);
    }

    /// `ibv_wr_complete` on queue pair `q`.
    #[inline]
    fn wr_complete(&mut self, q: usize) {
        let x = self.qpx[q];
        // SAFETY: as in wr_start.
        let rc = unsafe { ((*x).wr_complete.unwrap_unchecked())(x) };
        assert_eq!(rc, 0, "ibv_wr_complete");
    }

    /// Whether queue pair `q`'s next request is one the signaling interval signals.
    #[inline]
    fn signal_due(&self, q: usize) -> bool {
        (self.next[q] + 1).is_multiple_of(SIGNAL_EVERY)
    }

    /// Polls until queue pair `q` has room for `n` more requests.
    #[inline]
    fn room(&mut self, q: usize, n: u64) {
        while self.next[q] + n - self.done[q] > self.depth {
            self.poll();
        }
    }

    /// `ibv_post_send` of the chain's first request on queue pair `q`.
    #[inline]
    fn post(&mut self, q: usize) {
        let mut bad = core::ptr::null_mut();
        let qp = self.qps[q];
        // SAFETY: the QP and its context live as long as the device the bench keeps; the
        // chain is built and null-terminated; the instant device touches no memory.
        let rc = unsafe {
            let f = (*(*qp).context).ops.post_send.expect("post_send");
            f(qp, self.chain, &mut bad)
        };
        assert_eq!(rc, 0, "ibv_post_send");
    }

    /// Polls once; retires through each completion's id.
    #[inline]
    fn poll(&mut self) -> usize {
        if self.legacy {
            return self.poll_legacy();
        }
        // SAFETY: the CQ lives as long as the device, and is an extended one (see
        // `extended`); only this poller polls it.
        unsafe {
            poll_extended(self.cq, |cq| {
                assert_eq!((*cq).status, 0, "completion status");
                let id = (*cq).wr_id;
                let (q, seq) = if Q == 1 {
                    (0, id)
                } else {
                    let q = (id >> QP_SHIFT) as usize;
                    (q.min(Q - 1), id & ((1 << QP_SHIFT) - 1))
                };
                self.done[q] = self.done[q].max(seq + 1);
            })
        }
    }

    /// `ibv_poll_cq` once; retires through each completion's id.
    #[inline]
    fn poll_legacy(&mut self) -> usize {
        let mut wc = [const { MaybeUninit::<sys::ibv_wc>::uninit() }; 16];
        // SAFETY: the CQ lives as long as the device; wc has room for 16 entries.
        let n = unsafe {
            let f = (*(*self.cq).context).ops.poll_cq.expect("poll_cq");
            f(self.cq, 16, wc.as_mut_ptr().cast())
        };
        assert!(n >= 0, "ibv_poll_cq");
        for e in &wc[..n as usize] {
            // SAFETY: the driver wrote the first n entries.
            let e = unsafe { e.assume_init_ref() };
            assert!(e.error().is_none(), "completion status");
            let (q, seq) = if Q == 1 {
                (0, e.wr_id())
            } else {
                let q = (e.wr_id() >> QP_SHIFT) as usize;
                (q.min(Q - 1), e.wr_id() & ((1 << QP_SHIFT) - 1))
            };
            self.done[q] = self.done[q].max(seq + 1);
        }
        n as usize
    }

    /// Polls until queue pair `q`'s request `seq` is retired.
    #[inline]
    fn wait(&mut self, q: usize, seq: u64) {
        while self.done[q] <= seq {
            self.poll();
        }
    }
}

impl<const Q: usize> Drop for Raw<Q> {
    fn drop(&mut self) {
        // SAFETY: `chain` came from `Box::into_raw` of this type in `new` and is freed once.
        drop(unsafe { Box::from_raw(self.chain.cast::<[sys::ibv_send_wr; BATCH]>()) });
    }
}

/// A hand-written ring of receives: one `ibv_recv_wr` per slot, re-posted once its message
/// was handed out.
struct RawRecvs {
    qp: *mut sys::ibv_qp,
    cq: *mut sys::ibv_cq,
    wrs: Vec<sys::ibv_recv_wr>,
    sges: Vec<sys::ibv_sge>,
    base: *const u8,
    slot_size: usize,
    /// Poll with `ibv_poll_cq` rather than the extended sequence.
    legacy: bool,
}

impl RawRecvs {
    fn new(qp: *mut sys::ibv_qp, cq: *mut sys::ibv_cq, mem: &InstantRegion, size: usize) -> Self {
        let slots = mem.len() / size;
        let sge = mem.sge(0..mem.len()).expect("in bounds");
        let sges = (0..slots)
            .map(|i| sys::ibv_sge {
                addr: sge.addr() + (i * size) as u64,
                length: size as u32,
                lkey: sge.lkey(),
            })
            .collect();
        // SAFETY: ibv_recv_wr is plain C data; zero is a valid value.
        let wrs = (0..slots)
            .map(|_| unsafe { MaybeUninit::zeroed().assume_init() })
            .collect();
        let mut r = Self {
            qp,
            cq,
            wrs,
            sges,
            // SAFETY: the instant device never writes the region, so viewing its bytes is
            // sound; the pointer keeps the allocation's provenance (an integer address would
            // not).
            base: unsafe { mem.slice_unchecked(0..mem.len()) }
                .expect("in bounds")
                .as_ptr(),
            slot_size: size,
            legacy: legacy_poll(),
        };
        for (i, w) in r.wrs.iter_mut().enumerate() {
            w.wr_id = i as u64;
            w.sg_list = &raw mut r.sges[i];
            w.num_sge = 1;
        }
        for i in 0..slots {
            r.post(i);
        }
        r
    }

    /// `ibv_post_recv` of slot `i`.
    #[inline]
    fn post(&mut self, i: usize) {
        let mut bad = core::ptr::null_mut();
        // SAFETY: the QP lives as long as the device; the request is built (null `next`),
        // its entry names the slot, which the bench keeps; the device writes no memory.
        let rc = unsafe {
            let f = (*(*self.qp).context).ops.post_recv.expect("post_recv");
            f(self.qp, &raw mut self.wrs[i], &mut bad)
        };
        assert_eq!(rc, 0, "ibv_post_recv");
    }

    /// Polls once; hands each message (its slot's bytes, its immediate) to `f` and re-posts
    /// the slot. Returns how many.
    #[inline]
    fn poll(&mut self, mut f: impl FnMut(&[u8], Option<u32>)) -> usize {
        if self.legacy {
            return self.poll_legacy(f);
        }
        let (base, slot_size) = (self.base, self.slot_size);
        let mut done = [0usize; 16];
        // SAFETY: the CQ lives as long as the device, and is an extended one (see
        // `extended`); only this poller polls it. Slot i's receive completed and is
        // re-posted only below; the device never writes memory, and nothing else writes the
        // slots.
        let n = unsafe {
            let mut n = 0;
            poll_extended(self.cq, |cq| {
                assert_eq!((*cq).status, 0, "completion status");
                let i = (*cq).wr_id as usize;
                let len = ((*cq).read_byte_len.expect("read_byte_len")(cq) as usize).min(slot_size);
                let flags = (*cq).read_wc_flags.expect("read_wc_flags")(cq);
                let imm = (flags & sys::ibv_wc_flags::IBV_WC_WITH_IMM.0 != 0)
                    .then(|| u32::from_be((*cq).read_imm_data.expect("read_imm_data")(cq)));
                f(
                    core::slice::from_raw_parts(base.add(i * slot_size), len),
                    imm,
                );
                done[n] = i;
                n += 1;
            })
        };
        for &i in &done[..n] {
            self.post(i);
        }
        n
    }

    /// Like [`RawRecvs::poll`], with `ibv_poll_cq`.
    #[inline]
    fn poll_legacy(&mut self, mut f: impl FnMut(&[u8], Option<u32>)) -> usize {
        let mut wc = [const { MaybeUninit::<sys::ibv_wc>::uninit() }; 16];
        // SAFETY: the CQ lives as long as the device; wc has room for 16 entries.
        let n = unsafe {
            let p = (*(*self.cq).context).ops.poll_cq.expect("poll_cq");
            p(self.cq, 16, wc.as_mut_ptr().cast())
        };
        assert!(n >= 0, "ibv_poll_cq");
        for e in &wc[..n as usize] {
            // SAFETY: the driver wrote the first n entries.
            let e = unsafe { e.assume_init_ref() };
            assert!(e.error().is_none(), "completion status");
            let i = e.wr_id() as usize;
            let len = (e.len()).min(self.slot_size);
            // SAFETY: slot i's receive completed and is re-posted only below; the device
            // never writes memory, and nothing else writes the slots.
            let data =
                unsafe { core::slice::from_raw_parts(self.base.add(i * self.slot_size), len) };
            f(data, e.imm_data().map(u32::from_be));
            self.post(i);
        }
        n as usize
    }
}

/// Whether the raw side polls with `ibv_poll_cq` (side `raw-legacy`) instead of the
/// extended sequence (side `raw`): set once, before a case is set up.
static LEGACY_POLL: core::sync::atomic::AtomicBool = core::sync::atomic::AtomicBool::new(false);

fn legacy_poll() -> bool {
    LEGACY_POLL.load(core::sync::atomic::Ordering::Relaxed)
}

/// The hand-written extended poll: `ibv_start_poll`, then `ibv_next_poll` up to 16
/// completions, calling `each` while the queue is positioned on each, then `ibv_end_poll`
/// (only after a successful start, as `ibv_create_cq_ex(3)` requires). Returns how many.
/// A C program calls these `static inline` wrappers of verbs.h, which call through the
/// queue's pointers as here.
///
/// # Safety
/// `cq` is a live queue of the instant device, whose queues are extended ones
/// ([`InstantCq::raw_ex`] is the same address: `ibv_cq_ex_to_cq` is a cast), polled by
/// nobody else meanwhile; `each` only reads the current completion.
#[inline(always)]
unsafe fn poll_extended(cq: *mut sys::ibv_cq, mut each: impl FnMut(*mut sys::ibv_cq_ex)) -> usize {
    const ENOENT: i32 = 2;
    let cq = cq.cast::<sys::ibv_cq_ex>();
    let mut attr = sys::ibv_poll_cq_attr { comp_mask: 0 };
    // SAFETY: the caller's contract.
    unsafe {
        let rc = (*cq).start_poll.expect("start_poll")(cq, &mut attr);
        if rc == ENOENT {
            return 0;
        }
        assert_eq!(rc, 0, "ibv_start_poll");
        let mut n = 0;
        loop {
            each(cq);
            n += 1;
            if n == 16 {
                break;
            }
            let rc = (*cq).next_poll.expect("next_poll")(cq);
            if rc == ENOENT {
                break;
            }
            assert_eq!(rc, 0, "ibv_next_poll");
        }
        (*cq).end_poll.expect("end_poll")(cq);
        n
    }
}

type InstantNode = Node<RoutedQp<InstantQp, InstantCq>, InstantRegion, Spin>;

/// Rank 0 of a world of `world` on the instant device (dissemination barriers, each queue
/// pair on one shared send and one shared receive queue), a hand that writes its flags as
/// the other ranks would, and the arrivals of rank 1's queue pair.
fn node(dev: &InstantDevice, world: u32) -> (InstantNode, PeerHand, Arrivals) {
    let peers = world as usize - 1;
    let (scq, rcq) = (dev.cq(256 * peers as u32), dev.cq(256 * peers as u32));
    let qps: Vec<InstantQp> = (0..peers).map(|_| dev.qp(&scq, &rcq, caps())).collect();
    let arrivals = qps[0].arrivals();
    let shared = SharedCqs::new(scq, rcq, peers);
    let mut channels = Vec::new();
    for (qp, rank) in qps.into_iter().zip(1..) {
        let routed = shared.add(qp).map_err(|(_, e)| e).expect("route");
        let mut cfg = ChannelConfig::with_timeout(Duration::from_secs(10));
        cfg.rank = Some(rank);
        channels.push(Channel::with_backoff(routed, cfg, Spin, &MONOTONIC));
    }
    let flags = dev.region(FlagLayout::new(world).len(), RW);
    let hand = flags.peer_hand();
    let size = FlagLayout::new(world).len();
    let remotes: Vec<RemoteMemory> = (0..world).map(|_| dev.region(size, RW).remote()).collect();
    let node = Node::from_parts(NodeParts {
        rank: 0,
        world,
        channels,
        flags,
        window: dev.region(64, RW),
        peer_flags: remotes.clone(),
        peer_windows: remotes,
        algorithm: BarrierAlgorithm::Dissemination,
        backoff: Spin,
        clock: &MONOTONIC,
        timeout: Duration::from_secs(10),
        components: Components::default(),
    })
    .expect("node");
    (node, hand, arrivals)
}

/// The ranks rank 0 notifies (`d`) and waits for (`world - d`) in a dissemination barrier.
fn rounds(world: u32) -> Vec<(u32, u32)> {
    let mut d = 1;
    let mut r = Vec::new();
    while d < world {
        r.push((d, world - d));
        d *= 2;
    }
    r
}

/// One barrier step of rank 0 in a world of `world` whose other ranks have all arrived.
/// `R` is the number of rounds, `log2 world`.
fn barrier<const R: usize>(dev: &InstantDevice, world: u32, raw: bool, n: u64) {
    let rounds = rounds(world);
    assert_eq!(rounds.len(), R);
    if !raw {
        let (mut node, hand, _) = node(dev, world);
        let mut count = 0u64;
        run(
            || {
                count += 1;
                peer(|| {
                    for &(_, from) in &rounds {
                        assert!(hand.store_u64(8 * from as usize, count));
                    }
                });
                node.barrier_timeout(Members::World, Duration::from_secs(10))
                    .expect("barrier");
            },
            n,
        );
        return;
    }
    // By hand: per round one 8-byte inline write of the count (signaled every 16th on its
    // queue pair), then a spin on the flag word of the rank it waits for (polling the send
    // queue while it spins); completions retired only when a queue would overflow, as the
    // node does.
    let (scq, rcq) = (dev.cq(256 * world), dev.cq(256 * world));
    let qps: Vec<InstantQp> = rounds.iter().map(|_| dev.qp(&scq, &rcq, caps())).collect();
    let mut raw = Raw::<R>::new(core::array::from_fn(|q| qps[q].raw()), scq.raw(), (0, 0, 0));
    let flags = dev.region(FlagLayout::new(world).len(), RW);
    let hand = flags.peer_hand();
    let targets: Vec<RemoteMemory> = rounds
        .iter()
        .map(|_| dev.region(FlagLayout::new(world).len(), RW).remote())
        .collect();
    let mut count = 0u64;
    run(
        || {
            count += 1;
            peer(|| {
                for &(_, from) in &rounds {
                    assert!(hand.store_u64(8 * from as usize, count));
                }
            });
            let note = count.to_le_bytes();
            for (q, &(_, from)) in rounds.iter().enumerate() {
                raw.room(q, 1);
                let sig = raw.signal_due(q);
                let to = targets[q].slice(0, 8).expect("in bounds");
                raw.write(q, 0, to, Some(&note), sig);
                raw.post(q);
                while flags.load_u64(8 * from as usize) < Some(count) {
                    raw.poll();
                }
            }
        },
        n,
    );
}

/// Runs case `name` on one side: rverbs, or by hand (`raw`) on the legacy verbs or (`wr`)
/// on the extended ones.
fn case(name: &str, raw: bool, wr: bool, n: u64) {
    let dev = InstantDevice::new();
    let src = dev.region(MSG * BATCH, RW);
    let dst = dev.region(MSG * BATCH, RW);
    let g = [src.sge(0..MSG).expect("in bounds")];
    let to = dst.remote().slice(0, MSG as u64).expect("in bounds");
    let word = dst.remote().slice(0, 8).expect("in bounds");
    let sge = (g[0].addr(), g[0].len(), g[0].lkey());
    let prov = dev.provider(caps());
    let data = 7u64.to_le_bytes();
    let remotes: [RemoteMemory; BATCH] = core::array::from_fn(|i| {
        dst.remote()
            .slice((i * MSG) as u64, MSG as u64)
            .expect("in bounds")
    });
    let mut r = Raw::new([prov.raw_qp()], prov.raw_send_cq(), sge);
    if wr {
        assert!(
            raw && WR_CASES.contains(&name),
            "no ibv_wr_* side for {name}"
        );
        r.qpx = [prov
            .raw_qp_ex()
            .expect("the instant device's QPs are extended")];
    }
    match (name, raw) {
        ("blocking_write", true) if wr => run(
            || {
                let seq = r.next[0];
                r.wr_start(0);
                r.wr_write(0, black_box(to), None, true);
                r.wr_complete(0);
                r.wait(0, seq);
            },
            n,
        ),
        ("unpolled_inline_write", true) if wr => run(
            || {
                r.room(0, 1);
                let sig = r.signal_due(0);
                r.wr_start(0);
                r.wr_write(0, black_box(word), Some(&data), sig);
                r.wr_complete(0);
            },
            n,
        ),
        ("batch_32", true) if wr => run(
            || {
                r.wr_start(0);
                for (i, to) in remotes.iter().enumerate() {
                    let sig = r.signal_due(0) || i + 1 == BATCH;
                    r.wr_write(0, black_box(*to), None, sig);
                }
                let last = r.next[0] - 1;
                r.wr_complete(0);
                r.wait(0, last);
            },
            n,
        ),
        ("datagram_send", true) if wr => {
            let mut dg = dev.datagram(caps());
            let ah = dg.address(Destination::Lid(dg.lid())).expect("address");
            let (qpn, qkey) = (dg.qp_num(), dg.qkey());
            let mut r = Raw::new([dg.raw_qp()], dg.raw_send_cq(), sge);
            r.qpx = [dg.raw_qp_ex().expect("extended")];
            run(
                || {
                    r.room(0, 1);
                    let sig = r.signal_due(0);
                    r.wr_start(0);
                    let x = r.wr_header(0, true, sig);
                    // SAFETY: as in Raw::wr_start; the address handle lives as long as `ah`.
                    unsafe {
                        ((*x).wr_send.unwrap_unchecked())(x);
                        ((*x).wr_set_ud_addr.unwrap_unchecked())(x, ah.raw(), qpn, qkey);
                    }
                    r.wr_data(x, Some(black_box(&data)));
                    r.wr_complete(0);
                },
                n,
            );
        }
        ("atomic", true) if wr => {
            let result = dev.region(8, RW);
            let rs = result.sge(0..8).expect("in bounds");
            r.sge = sys::ibv_sge {
                addr: rs.addr(),
                length: 8,
                lkey: rs.lkey(),
            };
            run(
                || {
                    let seq = r.next[0];
                    let to = black_box(word);
                    r.wr_start(0);
                    let x = r.wr_header(0, false, true);
                    // SAFETY: as in Raw::wr_start.
                    unsafe {
                        ((*x).wr_atomic_fetch_add.unwrap_unchecked())(x, to.rkey, to.addr, 1)
                    };
                    r.wr_data(x, None);
                    r.wr_complete(0);
                    r.wait(0, seq);
                },
                n,
            );
        }
        ("blocking_write", false) => {
            let mut chan = Channel::new(prov, ChannelConfig::default(), &MONOTONIC);
            run(|| chan.write(black_box(&g), to).expect("write"), n);
        }
        ("blocking_write", true) => run(
            || {
                let seq = r.next[0];
                r.write(0, 0, black_box(to), None, true);
                r.post(0);
                r.wait(0, seq);
            },
            n,
        ),
        ("unpolled_inline_write", false) => {
            let mut chan = Channel::new(prov, ChannelConfig::default(), &MONOTONIC);
            assert_eq!(u64::from(chan.signal_every()), SIGNAL_EVERY);
            run(
                || {
                    let t = chan
                        .post_write_inline(black_box(&data), word)
                        .expect("post");
                    black_box(t);
                },
                n,
            );
        }
        ("unpolled_inline_write", true) => run(
            || {
                // Retire before the queue would overflow, as the channel does.
                r.room(0, 1);
                let sig = r.signal_due(0);
                r.write(0, 0, black_box(word), Some(&data), sig);
                r.post(0);
            },
            n,
        ),
        // Counted per post of 32: tools/cost divides by 32.
        ("batch_32", false) => {
            let mut chan = Channel::new(prov, ChannelConfig::default(), &MONOTONIC);
            run(
                || {
                    let mut batch = chan.batch();
                    for to in &remotes {
                        batch.write(&g, *to).expect("push");
                    }
                    batch.run().expect("batch");
                },
                n,
            );
        }
        ("batch_32", true) => run(
            || {
                // Everything before is retired (its last request signaled), so it all fits.
                for (i, to) in remotes.iter().enumerate() {
                    let sig = r.signal_due(0) || i + 1 == BATCH;
                    r.write(0, i, black_box(*to), None, sig);
                }
                let last = r.next[0] - 1;
                r.post(0);
                r.wait(0, last);
            },
            n,
        ),
        ("barrier_2", _) => barrier::<1>(&dev, 2, raw, n),
        ("barrier_8", _) => barrier::<3>(&dev, 8, raw, n),
        ("barrier_64", _) => barrier::<6>(&dev, 64, raw, n),
        ("progress_idle", false) => {
            let (mut node, _, _) = node(&dev, 2);
            node.start_messaging_in(
                dev.region(SLOTS * MSG, AccessFlags::LOCAL_WRITE),
                SLOTS,
                MSG,
            )
            .expect("messaging");
            run(
                || {
                    let got = node.progress(64, |_| {}).expect("progress");
                    assert_eq!(got, 0);
                },
                n,
            );
        }
        ("progress_idle", true) => {
            // One poll of the send queue and one of the receive queue, with receives posted.
            let mem = dev.region(SLOTS * MSG, AccessFlags::LOCAL_WRITE);
            let mut recvs = RawRecvs::new(prov.raw_qp(), prov.raw_recv_cq(), &mem, MSG);
            run(
                || {
                    let got = r.poll()
                        + recvs.poll(|d, _| {
                            black_box(d);
                        });
                    assert_eq!(got, 0);
                },
                n,
            );
        }
        ("recv_ring", false) => {
            let arrivals = prov.arrivals();
            let chan = Channel::new(prov, ChannelConfig::default(), &MONOTONIC);
            let mem = dev.region(SLOTS * MSG, AccessFlags::LOCAL_WRITE);
            let mut ring = RecvRing::new(chan, mem, MSG).expect("ring");
            run(
                || {
                    assert!(peer(|| arrivals.deliver(MSG as u32, None)));
                    let m = ring.recv().expect("recv");
                    assert_eq!(black_box(m.data).len(), MSG);
                },
                n,
            );
        }
        ("recv_ring", true) => {
            let arrivals = prov.arrivals();
            let mem = dev.region(SLOTS * MSG, AccessFlags::LOCAL_WRITE);
            let mut recvs = RawRecvs::new(prov.raw_qp(), prov.raw_recv_cq(), &mem, MSG);
            run(
                || {
                    assert!(peer(|| arrivals.deliver(MSG as u32, None)));
                    let mut got = 0;
                    while got == 0 {
                        got = recvs.poll(|d, _| assert_eq!(black_box(d).len(), MSG));
                    }
                },
                n,
            );
        }
        ("node_message", false) => {
            // Send one 8-byte inline message to rank 1; rank 1's message arrives (its
            // immediate returning the credit), and `progress` hands it over.
            let (mut node, _, arrivals) = node(&dev, 2);
            node.start_messaging_in(
                dev.region(SLOTS * MSG, AccessFlags::LOCAL_WRITE),
                SLOTS,
                MSG,
            )
            .expect("messaging");
            let mut sent = 0u32;
            run(
                || {
                    node.post_send_inline(1, black_box(&data)).expect("send");
                    sent += 1;
                    assert!(peer(|| arrivals.deliver(8, Some(sent))));
                    let mut messages = 0;
                    node.progress(64, |e| {
                        if let Event::Message { data, .. } = e {
                            messages += 1;
                            black_box(data);
                        }
                    })
                    .expect("progress");
                    assert_eq!(messages, 1);
                },
                n,
            );
        }
        ("node_message", true) => {
            // By hand: an inline send with immediate (the count of the peer's messages we
            // consumed: its credit return), signaled every 16th, refused without credit;
            // then one poll of the receive queue, which hands the message over, takes its
            // credit return and re-posts the slot.
            let arrivals = prov.arrivals();
            let mem = dev.region(SLOTS * MSG, AccessFlags::LOCAL_WRITE);
            let mut recvs = RawRecvs::new(prov.raw_qp(), prov.raw_recv_cq(), &mem, MSG);
            let (mut consumed, mut returned) = (0u32, 0u32);
            run(
                || {
                    assert!(r.next[0] - u64::from(returned) < SLOTS as u64, "credit");
                    r.room(0, 1);
                    let sig = r.signal_due(0);
                    let w = r.build(
                        0,
                        0,
                        sys::ibv_wr_opcode::IBV_WR_SEND_WITH_IMM,
                        Some(black_box(&data)),
                        sig,
                    );
                    w.__bindgen_anon_1.imm_data = consumed.to_be();
                    r.post(0);
                    let sent = r.next[0] as u32;
                    assert!(peer(|| arrivals.deliver(8, Some(sent))));
                    let mut messages = 0;
                    recvs.poll(|d, imm| {
                        consumed += 1;
                        returned = returned.max(imm.unwrap_or(0));
                        messages += 1;
                        black_box(d);
                    });
                    assert_eq!(messages, 1);
                },
                n,
            );
        }
        ("datagram_send", false) => {
            let cfg = DatagramConfig::default();
            let dg = dev.datagram(caps());
            let mem = dev.region(memory_needed(dg.mtu(), &cfg), AccessFlags::LOCAL_WRITE);
            let mut ep = Datagram::new(dg, mem, cfg, &MONOTONIC).expect("endpoint");
            assert_eq!(u64::from(ep.signal_every()), SIGNAL_EVERY);
            // To itself: the instant device delivers nothing anyway.
            let to = ep.peer(&ep.endpoint()).expect("peer");
            run(|| ep.send(&to, black_box(&data)).expect("send"), n);
        }
        ("datagram_send", true) => {
            // By hand: an inline UD send naming the address handle, queue pair and Q_Key,
            // signaled every 16th, polled only when the queue would overflow.
            let mut dg = dev.datagram(caps());
            let ah = dg.address(Destination::Lid(dg.lid())).expect("address");
            let (qpn, qkey) = (dg.qp_num(), dg.qkey());
            let mut r = Raw::new([dg.raw_qp()], dg.raw_send_cq(), sge);
            run(
                || {
                    r.room(0, 1);
                    let sig = r.signal_due(0);
                    let w = r.build(
                        0,
                        0,
                        sys::ibv_wr_opcode::IBV_WR_SEND,
                        Some(black_box(&data)),
                        sig,
                    );
                    w.wr.ud = sys::ibv_send_wr__bindgen_ty_2__bindgen_ty_3 {
                        ah: ah.raw(),
                        remote_qpn: qpn,
                        remote_qkey: qkey,
                    };
                    r.post(0);
                },
                n,
            );
        }
        ("atomic", false) => {
            let mut chan = Channel::new(prov, ChannelConfig::default(), &MONOTONIC);
            let mut result = dev.region(8, RW);
            run(
                || {
                    let mut at = result.sge_mut(0..8).expect("in bounds");
                    chan.fetch_add(&mut at, black_box(word), 1).expect("atomic");
                },
                n,
            );
        }
        ("atomic", true) => {
            let result = dev.region(8, RW);
            let rs = result.sge(0..8).expect("in bounds");
            r.sge = sys::ibv_sge {
                addr: rs.addr(),
                length: 8,
                lkey: rs.lkey(),
            };
            run(
                || {
                    let seq = r.next[0];
                    let to = black_box(word);
                    let w = r.build(
                        0,
                        0,
                        sys::ibv_wr_opcode::IBV_WR_ATOMIC_FETCH_AND_ADD,
                        None,
                        true,
                    );
                    w.wr.atomic.remote_addr = to.addr;
                    w.wr.atomic.rkey = to.rkey;
                    w.wr.atomic.compare_add = 1;
                    r.post(0);
                    r.wait(0, seq);
                },
                n,
            );
        }
        _ => panic!("unknown case {name}"),
    }
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match args.iter().map(String::as_str).collect::<Vec<_>>()[..] {
        ["--list"] => CASES.iter().for_each(|c| println!("{c}")),
        ["--list-wr"] => WR_CASES.iter().for_each(|c| println!("{c}")),
        [name, side @ ("rverbs" | "raw" | "raw_wr" | "raw-legacy"), n] => {
            let n: u64 = n.parse().expect("n: a number");
            LEGACY_POLL.store(side == "raw-legacy", core::sync::atomic::Ordering::Relaxed);
            case(name, side != "rverbs", side == "raw_wr", n);
        }
        // `cargo bench` (which passes `--bench`) or no arguments: every case, briefly.
        _ => {
            for c in CASES {
                case(c, false, false, 64);
                case(c, true, false, 64);
                LEGACY_POLL.store(true, core::sync::atomic::Ordering::Relaxed);
                case(c, true, false, 64);
                LEGACY_POLL.store(false, core::sync::atomic::Ordering::Relaxed);
            }
            for c in WR_CASES {
                case(c, true, true, 64);
            }
            println!(
                "cost: {} cases ran on both sides, {} on the ibv_wr_* side too",
                CASES.len(),
                WR_CASES.len()
            );
        }
    }
}
