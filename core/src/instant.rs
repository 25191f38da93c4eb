//! A device that completes every request the moment it is posted and never touches memory,
//! so that what a benchmark over it times is rverbs' own work per request: sequence numbers,
//! signaling, scatter/gather checks, building and chaining the `ibv_send_wr` list, taking
//! and converting completions, and the channel's bookkeeping (feature `instant`).
//!
//! It is a device at the level a driver plugs into libibverbs: a context whose operations
//! table has `post_send`, `post_recv` and `poll_cq` of its own, queue pairs that are the
//! `ibv_qp_ex` a driver hands out, with the extended entry points (`wr_start`, the builders
//! such as `wr_rdma_write`, the data setters, `wr_complete`, `wr_abort`) of its own, and
//! completion queues that are the C structures libibverbs hands to a driver. rverbs posts to
//! it and polls it through exactly the code it uses for a real device
//! ([`Qp::post_send`](crate::verbs::Qp::post_send)'s extended path, `verbs::send_ex`, and
//! [`Cq::poll`](crate::verbs::Cq::poll)'s conversion); only the driver differs. The driver
//! reads each request's id, opcode and flags (as a driver reads them to build its work queue
//! entries) and, for each signaled one, writes a successful completion into the queue's
//! ring: through `ibv_post_send`, at once; through the extended entry points, staged behind
//! the ring's last entry and published by `wr_complete` (a failed section publishes none).
//! [`InstantDevice::legacy`] makes queue pairs without the extended entry points, on which
//! rverbs falls back to its `ibv_send_wr` chain (and says so), so both paths can be
//! measured. Receives stay posted until the queue pair moves to the error state, which
//! flushes them. Remote memory is never reached: an RDMA write goes nowhere, a read brings
//! nothing.
//!
//! Its raw handles ([`InstantProvider::raw_qp`], [`InstantProvider::raw_qp_ex`],
//! [`InstantCq::raw`]) let a baseline post hand-built `ibv_send_wr` chains or hand-written
//! `ibv_wr_*` sequences to the same driver and poll the same rings, so the two can be
//! compared: `benches/benches/library.rs` (time) and `benches/benches/cost.rs`
//! (instructions, `tools/cost`). [`Arrivals`] plays a peer's sends arriving (it completes
//! the oldest posted receive), so receive paths can be measured too; [`InstantDatagram`] is
//! a datagram queue pair on the same driver.
//!
//! ```
//! use rverbs_core::channel::{Channel, ChannelConfig};
//! use rverbs_core::memory::AccessFlags;
//! use rverbs_core::params::QpCaps;
//! use rverbs_core::instant::InstantDevice;
//! use rverbs_core::poll::StepClock;
//!
//! static CLOCK: StepClock = StepClock::new(core::time::Duration::from_micros(1));
//! let dev = InstantDevice::new();
//! let caps = QpCaps { max_send_wr: 64, max_recv_wr: 64, max_send_sge: 1, max_recv_sge: 1,
//!                     max_inline_data: 64 };
//! let src = dev.region(64, AccessFlags::LOCAL_WRITE);
//! let peer = dev.region(64, AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE);
//! let mut chan = Channel::new(dev.provider(caps), ChannelConfig::default(), &CLOCK);
//! chan.write(&[src.sge(0..8).unwrap()], peer.remote().slice(0, 8).unwrap()).unwrap();
//! chan.write_inline(b"12345678", peer.remote().slice(8, 8).unwrap()).unwrap();
//! assert_eq!(chan.outstanding_sends(), 0);
//! // Nothing moved: the device completes requests without touching memory.
//! assert_eq!(peer.load_u64(0), Some(0));
//! ```
//!
//! # Thread safety
//! None of its types is `Send` or `Sync`: the driver state sits behind raw pointers in the C
//! structures, for one thread.

use alloc::boxed::Box;
use alloc::rc::Rc;
use alloc::vec;
use alloc::vec::Vec;
use core::ffi::{c_int, c_void};
use core::fmt;
use core::ptr::{self, NonNull};

use crate::completion::{Completion, DatagramCompletion};
use crate::fifo::Fifo;
use crate::gid::Gid;
use crate::memory::{AccessFlags, VolatileBytes};
use crate::params::QpCaps;
use crate::provider::datagram::{DatagramProvider, Destination};
use crate::provider::{CompletionQueue, Provider, ProviderError, QueuePair, Verb};
use crate::sge::{RemoteMemory, Sge, SgeMut};
use crate::verbs::cq::{poll_completions, POLL_BATCH};
use crate::verbs::cq_ex::{self, ExOps};
use crate::verbs::ffi::sys;
use crate::verbs::qp::post_recv_chain;
use crate::verbs::send_ex::{ConnectedSender, DatagramSender};
use crate::verbs::{PostPath, VerbsError};
use crate::wr::{DatagramRequest, PostFailure, RecvRequest, SendFlags, WorkRequest};

const ENOMEM: c_int = crate::verb::errno::ENOMEM;
const ENOENT: c_int = crate::verb::errno::ENOENT;

/// `struct ibv_wc` as a driver writes it (the binding's fields are private).
#[repr(C)]
#[derive(Clone, Copy, Default)]
struct RawWc {
    wr_id: u64,
    status: u32,
    opcode: u32,
    vendor_err: u32,
    byte_len: u32,
    imm_data: u32,
    qp_num: u32,
    src_qp: u32,
    wc_flags: u32,
    pkey_index: u16,
    slid: u16,
    sl: u8,
    dlid_path_bits: u8,
}

const _: () = assert!(core::mem::size_of::<RawWc>() == core::mem::size_of::<sys::ibv_wc>());
const _: () = assert!(core::mem::align_of::<RawWc>() == core::mem::align_of::<sys::ibv_wc>());

/// A completion queue's entries, and for the extended poll the entry the queue is
/// positioned on.
struct Ring {
    wc: Fifo<RawWc>,
    /// Each entry's completion time on the device's clock, by the entry's slot, for a
    /// queue created with timestamps (empty otherwise): apart, so that a queue without
    /// them copies no time with every completion.
    stamp: Box<[u64]>,
    /// The device's clock: it ticks once for each completion written into a queue with
    /// timestamps (the device does no work that takes time), and is never 0 on a stamp.
    clock: u64,
    /// The completion an extended poll is positioned on, and its time.
    cur: RawWc,
    cur_stamp: u64,
}

impl Ring {
    fn new(cap: usize, timestamps: bool) -> Self {
        let cap = cap.max(1);
        Self {
            wc: Fifo::new(cap, RawWc::default()),
            stamp: vec![0; if timestamps { cap } else { 0 }].into_boxed_slice(),
            clock: 0,
            cur: RawWc::default(),
            cur_stamp: 0,
        }
    }

    /// Writes `wc` into the queue at once; `false` if it is full.
    #[inline]
    fn push(&mut self, wc: RawWc) -> bool {
        if !self.stage(0, wc) {
            return false;
        }
        self.stamp(0);
        self.wc.publish(1);
        true
    }

    /// Writes `wc` `i` places behind the last entry, unpublished; `false` if there is no
    /// room for it.
    #[inline(always)]
    fn stage(&mut self, i: usize, wc: RawWc) -> bool {
        match self.wc.behind_mut(i) {
            Some(e) => {
                *e = wc;
                true
            }
            None => false,
        }
    }

    /// Stamps the entry staged `i` places behind the last one with the device's clock, on a
    /// queue with timestamps (on one without, does nothing).
    #[inline(always)]
    fn stamp(&mut self, i: usize) {
        if let Some(s) = self.wc.slot_behind(i).and_then(|at| self.stamp.get_mut(at)) {
            self.clock += 1;
            *s = self.clock;
        }
    }

    /// Publishes the `n` entries staged behind the last one (an extended post's section),
    /// stamping each on the device's clock when the queue has timestamps.
    #[inline(always)]
    fn publish(&mut self, n: usize) {
        if !self.stamp.is_empty() {
            self.stamp_staged(n);
        }
        self.wc.publish(n);
    }

    /// Stamps the `n` entries staged behind the last one: out of line, so that a post to a
    /// queue without timestamps pays nothing for the loop.
    #[inline(never)]
    fn stamp_staged(&mut self, n: usize) {
        for i in 0..n {
            self.stamp(i);
        }
    }

    /// Positions the extended poll on the oldest entry and takes it off the ring; `false`
    /// if the ring is empty.
    #[inline]
    fn take(&mut self) -> bool {
        let at = self.wc.front_slot();
        let Some(wc) = self.wc.pop() else {
            return false;
        };
        self.cur = wc;
        self.cur_stamp = self.stamp.get(at).copied().unwrap_or(0);
        true
    }

    #[inline]
    fn pop(&mut self) -> Option<RawWc> {
        self.wc.pop()
    }
}

/// A queue pair's driver state: the receives it holds, whether it is in the error state, and
/// the requests of the `ibv_wr_*` critical section under way.
struct QpState {
    recvs: Vec<u64>,
    error: bool,
    /// Completions the requests built since `wr_start` will make, written into the send
    /// queue's ring behind its last entry and published by `wr_complete` (as a driver
    /// writes work queue entries and then rings the doorbell): nothing runs before it.
    staged: usize,
    /// The first failure of the section (reported by `wr_complete`), or 0.
    staged_err: c_int,
}

/// The completion opcode of a send opcode.
fn wc_opcode(op: sys::ibv_wr_opcode::Type) -> u32 {
    use sys::ibv_wc_opcode as wc;
    use sys::ibv_wr_opcode as wr;
    match op {
        wr::IBV_WR_RDMA_WRITE | wr::IBV_WR_RDMA_WRITE_WITH_IMM => wc::IBV_WC_RDMA_WRITE,
        wr::IBV_WR_RDMA_READ => wc::IBV_WC_RDMA_READ,
        wr::IBV_WR_ATOMIC_CMP_AND_SWP => wc::IBV_WC_COMP_SWAP,
        wr::IBV_WR_ATOMIC_FETCH_AND_ADD => wc::IBV_WC_FETCH_ADD,
        _ => wc::IBV_WC_SEND,
    }
}

const FLUSHED: u32 = sys::ibv_wc_status::IBV_WC_WR_FLUSH_ERR;

/// The driver's `post_send`: a successful completion for each signaled request (every
/// request, flushed, in the error state), at once.
///
/// # Safety
/// `qp` is one of this module's queue pairs; `wr` heads a null-terminated chain.
unsafe extern "C" fn drv_post_send(
    qp: *mut sys::ibv_qp,
    mut wr: *mut sys::ibv_send_wr,
    bad: *mut *mut sys::ibv_send_wr,
) -> c_int {
    // SAFETY: the caller's contract: `qp` is ours, so its context pointers lead to our state
    // and its send CQ's ring, which nothing else accesses during this call (one thread).
    unsafe {
        let st = &*(*qp).qp_context.cast::<QpState>();
        let ring = &mut *(*(*qp).send_cq).cq_context.cast::<Ring>();
        let qp_num = (*qp).qp_num;
        while !wr.is_null() {
            let w = &*wr;
            let signaled = w.send_flags & sys::ibv_send_flags::IBV_SEND_SIGNALED.0 != 0;
            if signaled || st.error {
                let wc = RawWc {
                    wr_id: w.wr_id,
                    status: if st.error { FLUSHED } else { 0 },
                    opcode: wc_opcode(w.opcode),
                    qp_num,
                    ..RawWc::default()
                };
                if !ring.push(wc) {
                    *bad = wr;
                    return ENOMEM;
                }
            }
            wr = w.next;
        }
    }
    0
}

/// The driver's `post_recv`: receives wait (nothing ever arrives) until a flush.
///
/// # Safety
/// As for [`drv_post_send`].
unsafe extern "C" fn drv_post_recv(
    qp: *mut sys::ibv_qp,
    mut wr: *mut sys::ibv_recv_wr,
    bad: *mut *mut sys::ibv_recv_wr,
) -> c_int {
    // SAFETY: as in drv_post_send.
    unsafe {
        let st = &mut *(*qp).qp_context.cast::<QpState>();
        let ring = &mut *(*(*qp).recv_cq).cq_context.cast::<Ring>();
        let qp_num = (*qp).qp_num;
        while !wr.is_null() {
            let w = &*wr;
            if st.error {
                let wc = RawWc {
                    wr_id: w.wr_id,
                    status: FLUSHED,
                    opcode: sys::ibv_wc_opcode::IBV_WC_RECV,
                    qp_num,
                    ..RawWc::default()
                };
                if !ring.push(wc) {
                    *bad = wr;
                    return ENOMEM;
                }
            } else if st.recvs.len() < st.recvs.capacity() {
                st.recvs.push(w.wr_id);
            } else {
                *bad = wr;
                return ENOMEM;
            }
            wr = w.next;
        }
    }
    0
}

/// The driver's `poll_cq`.
///
/// # Safety
/// `cq` is one of this module's queues; `wc` has room for `n` entries.
unsafe extern "C" fn drv_poll_cq(cq: *mut sys::ibv_cq, n: c_int, wc: *mut sys::ibv_wc) -> c_int {
    // SAFETY: the caller's contract: the ring behind `cq_context` is ours and `wc` has room.
    unsafe {
        let ring = &mut *(*cq).cq_context.cast::<Ring>();
        let out = wc.cast::<RawWc>();
        let mut i = 0;
        while i < n {
            let Some(e) = ring.pop() else { break };
            out.add(i as usize).write(e);
            i += 1;
        }
        i
    }
}

/// The driver state behind an extended queue pair.
///
/// # Safety
/// `q` is one of this module's queue pairs, and no other reference to its state is alive.
#[inline(always)]
unsafe fn ex_state<'a>(q: *mut sys::ibv_qp_ex) -> &'a mut QpState {
    // SAFETY: the caller's contract: the context pointer leads to our state.
    unsafe { &mut *(*q).qp_base.qp_context.cast::<QpState>() }
}

/// The driver's `wr_start`: opens a critical section (nothing built yet).
///
/// # Safety
/// As for [`ex_state`].
unsafe extern "C" fn drv_wr_start(q: *mut sys::ibv_qp_ex) {
    // SAFETY: the caller's contract.
    let st = unsafe { ex_state(q) };
    st.staged = 0;
    st.staged_err = 0;
}

/// What every builder does: takes the id and flags the caller set in the `ibv_qp_ex` and,
/// for a request that completes (signaled, or any in the error state), writes its
/// completion behind the ring's last entry, unpublished. No room fails the section with
/// `ENOMEM`. One section at a time per ring (the device is for one thread).
///
/// # Safety
/// As for [`ex_state`], inside a critical section.
#[inline(always)]
unsafe fn drv_build(q: *mut sys::ibv_qp_ex, opcode: u32) {
    // SAFETY: the caller's contract: our state and the send CQ's ring, which nothing else
    // accesses during this call; the id and flags are plain fields of the struct.
    unsafe {
        let st = ex_state(q);
        let signaled = (*q).wr_flags & sys::ibv_send_flags::IBV_SEND_SIGNALED.0 != 0;
        if !(signaled || st.error) || st.staged_err != 0 {
            return;
        }
        let ring = &mut *(*(*q).qp_base.send_cq).cq_context.cast::<Ring>();
        let wc = RawWc {
            wr_id: (*q).wr_id,
            status: if st.error { FLUSHED } else { 0 },
            opcode,
            qp_num: (*q).qp_base.qp_num,
            ..RawWc::default()
        };
        if !ring.stage(st.staged, wc) {
            st.staged_err = ENOMEM;
            return;
        }
        st.staged += 1;
    }
}

/// The driver's `wr_rdma_write` (remote memory is never reached).
///
/// # Safety
/// As for [`drv_build`].
unsafe extern "C" fn drv_wr_rdma_write(q: *mut sys::ibv_qp_ex, _rkey: u32, _addr: u64) {
    // SAFETY: the caller's contract.
    unsafe { drv_build(q, sys::ibv_wc_opcode::IBV_WC_RDMA_WRITE) }
}

/// The driver's `wr_rdma_write_imm`.
///
/// # Safety
/// As for [`drv_build`].
unsafe extern "C" fn drv_wr_rdma_write_imm(
    q: *mut sys::ibv_qp_ex,
    _rkey: u32,
    _addr: u64,
    _imm: u32,
) {
    // SAFETY: the caller's contract.
    unsafe { drv_build(q, sys::ibv_wc_opcode::IBV_WC_RDMA_WRITE) }
}

/// The driver's `wr_rdma_read` (brings nothing).
///
/// # Safety
/// As for [`drv_build`].
unsafe extern "C" fn drv_wr_rdma_read(q: *mut sys::ibv_qp_ex, _rkey: u32, _addr: u64) {
    // SAFETY: the caller's contract.
    unsafe { drv_build(q, sys::ibv_wc_opcode::IBV_WC_RDMA_READ) }
}

/// The driver's `wr_send`.
///
/// # Safety
/// As for [`drv_build`].
unsafe extern "C" fn drv_wr_send(q: *mut sys::ibv_qp_ex) {
    // SAFETY: the caller's contract.
    unsafe { drv_build(q, sys::ibv_wc_opcode::IBV_WC_SEND) }
}

/// The driver's `wr_send_imm`.
///
/// # Safety
/// As for [`drv_build`].
unsafe extern "C" fn drv_wr_send_imm(q: *mut sys::ibv_qp_ex, _imm: u32) {
    // SAFETY: the caller's contract.
    unsafe { drv_build(q, sys::ibv_wc_opcode::IBV_WC_SEND) }
}

/// The driver's `wr_atomic_cmp_swp`.
///
/// # Safety
/// As for [`drv_build`].
unsafe extern "C" fn drv_wr_atomic_cmp_swp(
    q: *mut sys::ibv_qp_ex,
    _rkey: u32,
    _addr: u64,
    _compare: u64,
    _swap: u64,
) {
    // SAFETY: the caller's contract.
    unsafe { drv_build(q, sys::ibv_wc_opcode::IBV_WC_COMP_SWAP) }
}

/// The driver's `wr_atomic_fetch_add`.
///
/// # Safety
/// As for [`drv_build`].
unsafe extern "C" fn drv_wr_atomic_fetch_add(
    q: *mut sys::ibv_qp_ex,
    _rkey: u32,
    _addr: u64,
    _add: u64,
) {
    // SAFETY: the caller's contract.
    unsafe { drv_build(q, sys::ibv_wc_opcode::IBV_WC_FETCH_ADD) }
}

/// The driver's `wr_set_sge_list`: the device touches no memory, so it keeps nothing of the
/// list (as its `post_send` reads no `sg_list`).
unsafe extern "C" fn drv_wr_set_sge_list(
    _q: *mut sys::ibv_qp_ex,
    _n: usize,
    _list: *const sys::ibv_sge,
) {
}

/// The driver's `wr_set_sge`: as [`drv_wr_set_sge_list`].
unsafe extern "C" fn drv_wr_set_sge(_q: *mut sys::ibv_qp_ex, _lkey: u32, _addr: u64, _len: u32) {}

/// The driver's `wr_set_inline_data_list`: as [`drv_wr_set_inline_data`].
unsafe extern "C" fn drv_wr_set_inline_data_list(
    _q: *mut sys::ibv_qp_ex,
    _n: usize,
    _list: *const sys::ibv_data_buf,
) {
}

/// The driver's `wr_set_inline_data`: nothing is copied (nothing would be delivered).
unsafe extern "C" fn drv_wr_set_inline_data(
    _q: *mut sys::ibv_qp_ex,
    _addr: *mut c_void,
    _len: usize,
) {
}

/// The driver's `wr_set_ud_addr`.
unsafe extern "C" fn drv_wr_set_ud_addr(
    _q: *mut sys::ibv_qp_ex,
    _ah: *mut sys::ibv_ah,
    _qpn: u32,
    _qkey: u32,
) {
}

/// The driver's `wr_complete`: publishes the section's completions (each signaled request
/// completes; every one, flushed, in the error state) or, after a failure while building
/// (no room for them), none, returning the errno: nothing of a failed section runs.
///
/// # Safety
/// As for [`drv_build`].
unsafe extern "C" fn drv_wr_complete(q: *mut sys::ibv_qp_ex) -> c_int {
    // SAFETY: the caller's contract: our state, and the send CQ's ring, which nothing else
    // accesses during this call (one thread).
    unsafe {
        let st = ex_state(q);
        let err = st.staged_err;
        if err == 0 {
            let ring = &mut *(*(*q).qp_base.send_cq).cq_context.cast::<Ring>();
            ring.publish(st.staged);
        }
        st.staged = 0;
        err
    }
}

/// The driver's `wr_abort`: the section's requests are dropped.
///
/// # Safety
/// As for [`ex_state`].
unsafe extern "C" fn drv_wr_abort(q: *mut sys::ibv_qp_ex) {
    // SAFETY: the caller's contract.
    unsafe { ex_state(q) }.staged = 0;
}

/// The ring behind an extended queue of this module.
///
/// # Safety
/// `cq` is one of this module's queues, and nothing else borrows its ring meanwhile (one
/// thread; the driver's functions do not nest).
#[inline(always)]
unsafe fn ring_of<'a>(cq: *mut sys::ibv_cq_ex) -> &'a mut Ring {
    // SAFETY: the caller's contract: cq_context holds the queue's ring.
    unsafe { &mut *(*cq).cq_context.cast::<Ring>() }
}

/// The driver's `start_poll` (and `next_poll`): positions the queue on the oldest
/// completion, with its `wr_id` and `status` in the queue's fields; `ENOENT` when empty.
///
/// # Safety
/// As for [`ring_of`].
unsafe extern "C" fn drv_start_poll(
    cq: *mut sys::ibv_cq_ex,
    _attr: *mut sys::ibv_poll_cq_attr,
) -> c_int {
    // SAFETY: forwarded.
    unsafe { drv_next_poll(cq) }
}

/// # Safety
/// As for [`ring_of`].
unsafe extern "C" fn drv_next_poll(cq: *mut sys::ibv_cq_ex) -> c_int {
    // SAFETY: forwarded; the queue struct is ours to write (one thread).
    unsafe {
        let ring = ring_of(cq);
        if !ring.take() {
            return ENOENT;
        }
        (*cq).wr_id = ring.cur.wr_id;
        (*cq).status = ring.cur.status;
    }
    0
}

/// The driver's `end_poll`: nothing to release (no lock).
unsafe extern "C" fn drv_end_poll(_cq: *mut sys::ibv_cq_ex) {}

/// Defines the driver's readers of the current completion.
macro_rules! drv_readers {
    ($($name:ident -> $t:ty = |$r:ident| $e:expr;)*) => {$(
        /// A reader of the completion the queue is positioned on.
        ///
        /// # Safety
        /// As for [`ring_of`].
        unsafe extern "C" fn $name(cq: *mut sys::ibv_cq_ex) -> $t {
            // SAFETY: forwarded.
            let $r = unsafe { ring_of(cq) };
            $e
        }
    )*};
}

drv_readers! {
    drv_read_opcode -> u32 = |r| r.cur.opcode;
    drv_read_vendor_err -> u32 = |r| r.cur.vendor_err;
    drv_read_byte_len -> u32 = |r| r.cur.byte_len;
    drv_read_imm_data -> u32 = |r| r.cur.imm_data;
    drv_read_qp_num -> u32 = |r| r.cur.qp_num;
    drv_read_src_qp -> u32 = |r| r.cur.src_qp;
    drv_read_wc_flags -> core::ffi::c_uint = |r| r.cur.wc_flags;
    drv_read_slid -> u32 = |r| u32::from(r.cur.slid);
    drv_read_sl -> u8 = |r| r.cur.sl;
    drv_read_dlid_path_bits -> u8 = |r| r.cur.dlid_path_bits;
    drv_read_completion_wallclock_ns -> u64 = |r| r.cur_stamp;
}

/// A heap value the driver reaches through raw pointers (an `ibv_qp`'s context, a CQ's
/// ring): kept as the raw pointer `Box::into_raw` gave, never moved or reborrowed through a
/// `Box`, so the pointers handed to the driver stay valid (a `Box` that moves asserts
/// unique access, which would retire them). Freed on drop.
struct Heap<T>(core::ptr::NonNull<T>);

impl<T> Heap<T> {
    fn new(v: T) -> Self {
        // SAFETY: Box::into_raw never returns null.
        Self(unsafe { core::ptr::NonNull::new_unchecked(Box::into_raw(Box::new(v))) })
    }

    /// The value's address: every access, ours and the driver's, goes through it.
    fn get(&self) -> *mut T {
        self.0.as_ptr()
    }
}

impl<T> Drop for Heap<T> {
    fn drop(&mut self) {
        // SAFETY: from Box::into_raw in `new`, freed once, here.
        drop(unsafe { Box::from_raw(self.0.as_ptr()) });
    }
}

struct DeviceInner {
    ctx: Heap<sys::ibv_context>,
    /// Whether its queue pairs have the extended `ibv_wr_*` entry points.
    extended: bool,
    next_qpn: core::cell::Cell<u32>,
    next_key: core::cell::Cell<u32>,
}

/// The instant device: makes queue pairs, completion queues and memory regions. See the
/// [module docs](self).
#[derive(Clone)]
pub struct InstantDevice {
    inner: Rc<DeviceInner>,
}

impl fmt::Debug for InstantDevice {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("InstantDevice").finish_non_exhaustive()
    }
}

impl Default for InstantDevice {
    fn default() -> Self {
        Self::new()
    }
}

/// A zeroed C structure of libibverbs (all of them are plain data for which zero is valid:
/// null pointers, absent function pointers, a statically initialised mutex).
fn zeroed<T>() -> T {
    // SAFETY: only instantiated below with libibverbs structs of that kind.
    unsafe { core::mem::MaybeUninit::zeroed().assume_init() }
}

impl InstantDevice {
    /// A device whose queue pairs have the extended entry points (`ibv_wr_start`,
    /// `ibv_wr_*`, `ibv_wr_complete`), as rxe and current hardware providers do: rverbs
    /// posts through them. Allocates (setup).
    pub fn new() -> Self {
        Self::with_extended(true)
    }

    /// A device whose queue pairs lack the extended entry points (their `ibv_qp_ex` has none
    /// set, as with a provider without them): rverbs falls back to `ibv_post_send` chains
    /// and says why ([`InstantProvider::post_path`]). So both paths can be measured.
    /// Allocates (setup).
    pub fn legacy() -> Self {
        Self::with_extended(false)
    }

    fn with_extended(extended: bool) -> Self {
        let mut ctx: sys::ibv_context = zeroed();
        ctx.ops.post_send = Some(drv_post_send);
        ctx.ops.post_recv = Some(drv_post_recv);
        ctx.ops.poll_cq = Some(drv_poll_cq);
        ctx.cmd_fd = -1;
        ctx.async_fd = -1;
        Self {
            inner: Rc::new(DeviceInner {
                ctx: Heap::new(ctx),
                extended,
                next_qpn: core::cell::Cell::new(0x100),
                next_key: core::cell::Cell::new(0x1000),
            }),
        }
    }

    fn ctx(&self) -> *mut sys::ibv_context {
        self.inner.ctx.get()
    }

    /// A completion queue of `capacity` entries. Allocates (setup).
    pub fn cq(&self, capacity: u32) -> InstantCq {
        self.cq_with(capacity, false)
    }

    /// A completion queue of `capacity` entries whose completions carry the device's time
    /// ([`Completion::timestamp`]: the device's clock ticks once per completion it writes
    /// into such a queue). Allocates (setup).
    pub fn cq_with_timestamps(&self, capacity: u32) -> InstantCq {
        self.cq_with(capacity, true)
    }

    /// An extended queue (`ibv_cq_ex`, with the driver's poll functions), which also
    /// answers the legacy `poll_cq` of the context's operations.
    fn cq_with(&self, capacity: u32, timestamps: bool) -> InstantCq {
        let ring = Heap::new(Ring::new(capacity as usize, timestamps));
        let mut raw: sys::ibv_cq_ex = zeroed();
        raw.context = self.ctx();
        raw.cq_context = ring.get().cast::<c_void>();
        raw.cqe = capacity as c_int;
        raw.start_poll = Some(drv_start_poll);
        raw.next_poll = Some(drv_next_poll);
        raw.end_poll = Some(drv_end_poll);
        raw.read_opcode = Some(drv_read_opcode);
        raw.read_vendor_err = Some(drv_read_vendor_err);
        raw.read_byte_len = Some(drv_read_byte_len);
        raw.read_imm_data = Some(drv_read_imm_data);
        raw.read_qp_num = Some(drv_read_qp_num);
        raw.read_src_qp = Some(drv_read_src_qp);
        raw.read_wc_flags = Some(drv_read_wc_flags);
        raw.read_slid = Some(drv_read_slid);
        raw.read_sl = Some(drv_read_sl);
        raw.read_dlid_path_bits = Some(drv_read_dlid_path_bits);
        if timestamps {
            raw.read_completion_wallclock_ns = Some(drv_read_completion_wallclock_ns);
        }
        let raw = Heap::new(raw);
        // SAFETY: a live extended queue, just made, with every function set above.
        let ops = unsafe { ExOps::of(raw.get(), timestamps) }.expect("the driver sets them all");
        InstantCq {
            wc: Box::new([sys::ibv_wc::default(); POLL_BATCH]),
            ops,
            last_timestamp: None,
            inner: Rc::new(CqInner {
                raw,
                ring,
                capacity,
                _dev: self.clone(),
            }),
        }
    }

    /// A queue pair completing into `send_cq` and `recv_cq` (which it keeps alive).
    /// Allocates (setup).
    pub fn qp(&self, send_cq: &InstantCq, recv_cq: &InstantCq, caps: QpCaps) -> InstantQp {
        let qp_num = self.inner.next_qpn.get();
        self.inner.next_qpn.set(qp_num + 1);
        let state = Rc::new(Heap::new(QpState {
            recvs: Vec::with_capacity(caps.max_recv_wr as usize),
            error: false,
            staged: 0,
            staged_err: 0,
        }));
        let mut raw: sys::ibv_qp_ex = zeroed();
        let base = &mut raw.qp_base;
        base.context = self.ctx();
        base.qp_context = state.get().cast::<c_void>();
        base.send_cq = send_cq.raw();
        base.recv_cq = recv_cq.raw();
        base.qp_num = qp_num;
        base.qp_type = sys::ibv_qp_type::IBV_QPT_RC;
        if self.inner.extended {
            raw.wr_start = Some(drv_wr_start);
            raw.wr_complete = Some(drv_wr_complete);
            raw.wr_abort = Some(drv_wr_abort);
            raw.wr_rdma_write = Some(drv_wr_rdma_write);
            raw.wr_rdma_write_imm = Some(drv_wr_rdma_write_imm);
            raw.wr_rdma_read = Some(drv_wr_rdma_read);
            raw.wr_send = Some(drv_wr_send);
            raw.wr_send_imm = Some(drv_wr_send_imm);
            raw.wr_atomic_cmp_swp = Some(drv_wr_atomic_cmp_swp);
            raw.wr_atomic_fetch_add = Some(drv_wr_atomic_fetch_add);
            raw.wr_set_sge = Some(drv_wr_set_sge);
            raw.wr_set_sge_list = Some(drv_wr_set_sge_list);
            raw.wr_set_inline_data_list = Some(drv_wr_set_inline_data_list);
            raw.wr_set_inline_data = Some(drv_wr_set_inline_data);
            raw.wr_set_ud_addr = Some(drv_wr_set_ud_addr);
        }
        let raw = Heap::new(raw);
        // SAFETY: the extended queue pair is ours and lives as long as the InstantQp (the
        // sender is dropped with it).
        let sender = unsafe { ConnectedSender::new(Ok(raw.0)) };
        InstantQp {
            raw,
            state,
            sender,
            caps,
            _cqs: [send_cq.inner.clone(), recv_cq.inner.clone()],
        }
    }

    /// A queue pair with a send and a receive completion queue of its own, each as deep as
    /// its queue (plus one entry for a drain request): what a
    /// [`Channel`](crate::channel::Channel) runs on. Allocates (setup).
    pub fn provider(&self, caps: QpCaps) -> InstantProvider {
        let send_cq = self.cq(caps.max_send_wr + 1);
        let recv_cq = self.cq(caps.max_recv_wr + 1);
        let qp = self.qp(&send_cq, &recv_cq, caps);
        InstantProvider {
            qp,
            send_cq,
            recv_cq,
        }
    }

    /// Like [`InstantDevice::provider`], with completion queues that carry the device's
    /// timestamps ([`InstantDevice::cq_with_timestamps`]). Allocates (setup).
    pub fn provider_with_timestamps(&self, caps: QpCaps) -> InstantProvider {
        let send_cq = self.cq_with_timestamps(caps.max_send_wr + 1);
        let recv_cq = self.cq_with_timestamps(caps.max_recv_wr + 1);
        let qp = self.qp(&send_cq, &recv_cq, caps);
        InstantProvider {
            qp,
            send_cq,
            recv_cq,
        }
    }

    /// A zeroed memory region of `len` bytes with `access`. Allocates (setup).
    pub fn region(&self, len: usize, access: AccessFlags) -> InstantRegion {
        let key = self.inner.next_key.get();
        self.inner.next_key.set(key + 1);
        InstantRegion {
            mem: Rc::new(Memory::zeroed(len)),
            access,
            key,
        }
    }
}

struct CqInner {
    // Field order is drop order: nothing points at the ring once the CQ struct is gone.
    raw: Heap<sys::ibv_cq_ex>,
    ring: Heap<Ring>,
    capacity: u32,
    _dev: InstantDevice,
}

/// A completion queue of the instant device: an extended queue, polled through
/// [`CompletionQueue`] with `start_poll`/`next_poll`/`end_poll` as rverbs polls a device's
/// extended queue ([`Cq::poll`](crate::verbs::Cq::poll)'s path), or through the legacy
/// `poll_cq` ([`InstantCq::poll_legacy`]).
pub struct InstantCq {
    inner: Rc<CqInner>,
    /// The queue's poll functions, as [`Cq`](crate::verbs::Cq) keeps them.
    ops: ExOps,
    /// Where legacy polls put work completions (initialised once, as a device queue's).
    wc: Box<[sys::ibv_wc; POLL_BATCH]>,
    /// The timestamp of the last completion a poll took (queues with timestamps only).
    last_timestamp: Option<core::num::NonZeroU64>,
}

impl fmt::Debug for InstantCq {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("InstantCq")
            .field("capacity", &self.inner.capacity)
            .finish()
    }
}

impl InstantCq {
    /// The `ibv_cq` a hand-written poller passes to `ops.poll_cq`: valid while this handle
    /// lives, to be polled by one poller at a time.
    pub fn raw(&self) -> *mut sys::ibv_cq {
        self.inner.raw.get().cast()
    }

    /// The same queue as `ibv_cq_ex`, for a hand-written `ibv_start_poll` sequence: valid
    /// while this handle lives, to be polled by one poller at a time.
    pub fn raw_ex(&self) -> *mut sys::ibv_cq_ex {
        self.inner.raw.get()
    }

    /// The timestamp of the last completion a poll took (`None` before the first, or on a
    /// queue without timestamps).
    pub fn last_timestamp(&self) -> Option<core::num::NonZeroU64> {
        self.last_timestamp
    }

    /// Polls through the legacy `poll_cq` of the context's operations (every field of each
    /// `ibv_wc` written, then converted), as rverbs polls a queue on the legacy path.
    /// Completions polled this way carry no timestamp. Does not allocate.
    pub fn poll_legacy(&mut self, out: &mut [Completion]) -> Result<usize, ProviderError> {
        // SAFETY: the CQ lives as long as this handle, and `&mut self` makes this the only
        // poller.
        unsafe { poll_completions(self.raw(), &mut self.wc, out) }.map_err(call_error)
    }
}

fn call_error(e: VerbsError) -> ProviderError {
    match e {
        VerbsError::Call { verb, errno } => ProviderError { verb, errno },
        other => ProviderError {
            verb: Verb::PollCq,
            errno: other.errno().unwrap_or(0),
        },
    }
}

impl CompletionQueue for InstantCq {
    // Inlined whole: an empty poll is then the driver's `start_poll` call and a test in the
    // caller (an idle progress polls every queue), the batch itself being out of line.
    #[inline(always)]
    fn poll(&mut self, out: &mut [Completion]) -> Result<usize, ProviderError> {
        // SAFETY: the CQ lives as long as this handle, its functions are `ops` (with the
        // timestamp reader if it was created with timestamps), and `&mut self` makes this
        // the only poller.
        unsafe { cq_ex::poll(self.raw_ex(), &self.ops, out, &mut self.last_timestamp) }
    }

    // Each completion handed over while the queue is positioned on it: no scratch array.
    #[inline(always)]
    fn poll_each(
        &mut self,
        scratch: &mut [Completion],
        each: impl FnMut(&Completion),
    ) -> Result<usize, ProviderError> {
        // SAFETY: as in `poll`; `each` does not poll this queue (the trait's contract).
        unsafe {
            cq_ex::poll_each(
                self.raw_ex(),
                &self.ops,
                scratch.len(),
                &mut self.last_timestamp,
                each,
            )
        }
    }

    fn capacity(&self) -> u32 {
        self.inner.capacity
    }

    fn id(&self) -> Option<crate::provider::CqId> {
        Some(crate::provider::CqId {
            owner: self.raw() as usize,
            index: 0,
        })
    }
}

/// A queue pair of the instant device.
pub struct InstantQp {
    // Field order is drop order: the sender (which points at the QP struct) goes first, the
    // QP struct before the state it points at.
    sender: ConnectedSender,
    raw: Heap<sys::ibv_qp_ex>,
    // Shared with the queue pair's [`Arrivals`], which may outlive it.
    state: Rc<Heap<QpState>>,
    caps: QpCaps,
    _cqs: [Rc<CqInner>; 2],
}

impl fmt::Debug for InstantQp {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("InstantQp")
            .field("qp_num", &self.qp_num())
            .field("caps", &self.caps)
            .finish()
    }
}

impl InstantQp {
    /// The `ibv_qp` a hand-written poster passes to `ops.post_send`: valid while this handle
    /// lives.
    pub fn raw(&self) -> *mut sys::ibv_qp {
        // SAFETY: in bounds of the live struct (its first field); no reference is made.
        unsafe { &raw mut (*self.raw.get()).qp_base }
    }

    /// The `ibv_qp_ex` a hand-written poster calls the `ibv_wr_*` entry points of, or
    /// `None` on a [legacy](InstantDevice::legacy) device: valid while this handle lives.
    pub fn raw_ex(&self) -> Option<*mut sys::ibv_qp_ex> {
        self.post_path().is_extended().then(|| self.raw.get())
    }

    /// How rverbs posts to this queue pair (see [`InstantDevice::legacy`]).
    pub fn post_path(&self) -> PostPath {
        self.sender.path()
    }

    /// A handle that plays a peer's sends arriving at this queue pair (the instant device
    /// delivers nothing by itself): a benchmark makes messages arrive with it.
    pub fn arrivals(&self) -> Arrivals {
        Arrivals {
            state: self.state.clone(),
            recv_cq: self._cqs[1].clone(),
            qp_num: self.qp_num(),
        }
    }
}

/// Completes a queue pair's oldest posted receive as a peer's send would
/// ([`InstantQp::arrivals`], [`InstantProvider::arrivals`]); the receive buffer is not
/// written (the device never touches memory).
pub struct Arrivals {
    state: Rc<Heap<QpState>>,
    recv_cq: Rc<CqInner>,
    qp_num: u32,
}

impl fmt::Debug for Arrivals {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Arrivals")
            .field("qp_num", &self.qp_num)
            .finish()
    }
}

impl Arrivals {
    /// A message of `byte_len` bytes (with immediate `imm`, if any) arrives: the oldest
    /// posted receive completes successfully into the receive completion queue. `false` if
    /// no receive is posted, the queue pair is in the error state or the queue is full.
    /// Does not allocate.
    pub fn deliver(&self, byte_len: u32, imm: Option<u32>) -> bool {
        // SAFETY: the state and the ring stay allocated while this handle holds them; the
        // driver reaches them only inside calls made from this thread (nothing here is
        // `Send`), none of which is running now.
        unsafe {
            let st = &mut *self.state.get();
            let ring = &mut *self.recv_cq.ring.get();
            if st.error || st.recvs.is_empty() || ring.wc.is_full() {
                return false;
            }
            let wr_id = st.recvs.remove(0);
            ring.push(RawWc {
                wr_id,
                opcode: sys::ibv_wc_opcode::IBV_WC_RECV,
                byte_len,
                imm_data: imm.map_or(0, u32::to_be),
                wc_flags: if imm.is_some() {
                    sys::ibv_wc_flags::IBV_WC_WITH_IMM.0
                } else {
                    0
                },
                qp_num: self.qp_num,
                ..RawWc::default()
            })
        }
    }
}

impl QueuePair for InstantQp {
    fn caps(&self) -> QpCaps {
        self.caps
    }

    #[inline]
    fn qp_num(&self) -> u32 {
        // SAFETY: the struct lives as long as self; only the driver writes other fields.
        unsafe { (*self.raw()).qp_num }
    }

    #[inline(always)]
    unsafe fn post_send(&mut self, wrs: &[WorkRequest<'_>]) -> Result<(), PostFailure> {
        // SAFETY: the QP is live; the device touches no memory, the contract is forwarded.
        unsafe { self.sender.post(self.raw(), wrs) }
    }

    #[inline(always)]
    unsafe fn send_list(&mut self) -> Option<crate::provider::SendList> {
        // SAFETY: `raw()` points into the live struct, never null.
        let qp = unsafe { NonNull::new_unchecked(self.raw()) };
        Some(self.sender.chain.list(qp))
    }

    fn completion_queues(&self) -> Option<[crate::provider::CqId; 2]> {
        let id = |c: &Rc<CqInner>| crate::provider::CqId {
            owner: c.raw.get() as usize,
            index: 0,
        };
        Some([id(&self._cqs[0]), id(&self._cqs[1])])
    }

    #[inline(always)]
    unsafe fn post_recv(&mut self, wrs: &[RecvRequest<'_>]) -> Result<(), PostFailure> {
        // SAFETY: as above.
        unsafe { post_recv_chain(self.raw(), wrs) }
    }

    fn set_error(&mut self) -> Result<(), ProviderError> {
        // SAFETY: the state and the receive CQ's ring are ours and not borrowed elsewhere
        // (the driver runs only inside calls made from this thread).
        unsafe {
            let st = &mut *self.state.get();
            st.error = true;
            let ring = &mut *(*(*self.raw()).recv_cq).cq_context.cast::<Ring>();
            for wr_id in st.recvs.drain(..) {
                let wc = RawWc {
                    wr_id,
                    status: FLUSHED,
                    opcode: sys::ibv_wc_opcode::IBV_WC_RECV,
                    qp_num: (*self.raw()).qp_num,
                    ..RawWc::default()
                };
                if !ring.push(wc) {
                    return Err(ProviderError {
                        verb: Verb::ModifyQpErr,
                        errno: ENOMEM,
                    });
                }
            }
        }
        Ok(())
    }
}

/// A queue pair with its own two completion queues: a [`Provider`].
#[derive(Debug)]
pub struct InstantProvider {
    qp: InstantQp,
    send_cq: InstantCq,
    recv_cq: InstantCq,
}

impl InstantProvider {
    /// The queue pair's `ibv_qp` (see [`InstantQp::raw`]).
    pub fn raw_qp(&self) -> *mut sys::ibv_qp {
        self.qp.raw()
    }

    /// The queue pair's `ibv_qp_ex` (see [`InstantQp::raw_ex`]).
    pub fn raw_qp_ex(&self) -> Option<*mut sys::ibv_qp_ex> {
        self.qp.raw_ex()
    }

    /// How rverbs posts to the queue pair (see [`InstantDevice::legacy`]).
    pub fn post_path(&self) -> PostPath {
        self.qp.post_path()
    }

    /// The send completion queue's `ibv_cq` (see [`InstantCq::raw`]).
    pub fn raw_send_cq(&self) -> *mut sys::ibv_cq {
        self.send_cq.raw()
    }

    /// The receive completion queue's `ibv_cq` (see [`InstantCq::raw`]).
    pub fn raw_recv_cq(&self) -> *mut sys::ibv_cq {
        self.recv_cq.raw()
    }

    /// Plays a peer's sends arriving (see [`InstantQp::arrivals`]).
    pub fn arrivals(&self) -> Arrivals {
        self.qp.arrivals()
    }
}

impl QueuePair for InstantProvider {
    fn caps(&self) -> QpCaps {
        self.qp.caps
    }

    #[inline]
    fn qp_num(&self) -> u32 {
        self.qp.qp_num()
    }

    #[inline(always)]
    unsafe fn post_send(&mut self, wrs: &[WorkRequest<'_>]) -> Result<(), PostFailure> {
        // SAFETY: forwarded contract.
        unsafe { self.qp.post_send(wrs) }
    }

    #[inline(always)]
    unsafe fn send_list(&mut self) -> Option<crate::provider::SendList> {
        // SAFETY: forwarded contract: the list is the queue pair this provider owns, posts to
        // and polls the completions of.
        unsafe { self.qp.send_list() }
    }

    #[inline]
    unsafe fn post_recv(&mut self, wrs: &[RecvRequest<'_>]) -> Result<(), PostFailure> {
        // SAFETY: forwarded contract.
        unsafe { self.qp.post_recv(wrs) }
    }

    fn set_error(&mut self) -> Result<(), ProviderError> {
        self.qp.set_error()
    }
}

impl Provider for InstantProvider {
    // Inlined whole, as the queues' own `poll`: the count and the error then stay in
    // registers to the channel's test of them.
    #[inline(always)]
    fn poll_send(&mut self, out: &mut [Completion]) -> Result<usize, ProviderError> {
        self.send_cq.poll(out)
    }

    #[inline(always)]
    fn poll_recv(&mut self, out: &mut [Completion]) -> Result<usize, ProviderError> {
        self.recv_cq.poll(out)
    }

    fn last_send_timestamp(&self) -> Option<core::num::NonZeroU64> {
        self.send_cq.last_timestamp()
    }
}

/// Heap bytes a region owns (and a [`PeerHand`] keeps alive).
struct Memory {
    ptr: NonNull<u8>,
    len: usize,
}

impl Memory {
    fn zeroed(len: usize) -> Self {
        let b: Box<[u8]> = vec![0u8; len.max(8)].into_boxed_slice();
        let len = b.len();
        let ptr = NonNull::from(Box::leak(b)).cast::<u8>();
        Self { ptr, len }
    }

    fn bytes(&self) -> VolatileBytes {
        // SAFETY: the bytes stay allocated while `self` lives, and are only reached through
        // volatile accesses and entries handed to the device (which never touches them).
        unsafe { VolatileBytes::new(self.ptr, self.len) }
    }
}

impl Drop for Memory {
    fn drop(&mut self) {
        // SAFETY: made from a leaked Box<[u8]> of this length; nothing reaches it any more
        // (the instant device never touches memory).
        unsafe {
            drop(Box::from_raw(ptr::slice_from_raw_parts_mut(
                self.ptr.as_ptr(),
                self.len,
            )));
        }
    }
}

/// Memory "registered" with the instant device. It owns its bytes; since the device never
/// touches memory, they are only what the CPU writes (and what a [`PeerHand`] plays a peer
/// writing).
pub struct InstantRegion {
    mem: Rc<Memory>,
    access: AccessFlags,
    key: u32,
}

impl fmt::Debug for InstantRegion {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("InstantRegion")
            .field("len", &self.mem.len)
            .field("key", &self.key)
            .field("access", &self.access)
            .finish()
    }
}

impl InstantRegion {
    /// Length in bytes.
    #[inline]
    pub fn len(&self) -> usize {
        self.mem.len
    }

    /// Whether the region is empty (never).
    #[inline]
    pub fn is_empty(&self) -> bool {
        self.mem.len == 0
    }

    /// Access it was made with.
    #[inline]
    pub fn access(&self) -> AccessFlags {
        self.access
    }

    /// Its local (and remote) key.
    #[inline]
    pub fn lkey(&self) -> u32 {
        self.key
    }

    /// The descriptor a peer would write it through.
    #[inline]
    pub fn remote(&self) -> RemoteMemory {
        self.bytes().remote(self.key)
    }

    #[inline]
    fn bytes(&self) -> VolatileBytes {
        self.mem.bytes()
    }

    crate::memory::volatile_byte_accessors!();

    /// The bytes of `range`, or `None` if out of bounds.
    ///
    /// # Safety
    /// Nobody may write the range while the slice lives (no peer and no local work request;
    /// of a remotely writable region, no [`PeerHand`] either).
    pub unsafe fn slice_unchecked(&self, range: core::ops::Range<usize>) -> Option<&[u8]> {
        let (_, len) = self.bytes().entry(&range)?;
        // From the allocation's pointer, not the entry's integer address: a pointer made
        // from an integer has no provenance, and a slice through it is undefined behaviour
        // (Miri reports it).
        // SAFETY: in bounds (checked by `entry`); the caller rules out writers while the
        // slice lives.
        Some(unsafe {
            core::slice::from_raw_parts(self.mem.ptr.as_ptr().add(range.start), len as usize)
        })
    }

    /// A gather entry for `range`, or `None` if out of bounds. Does not allocate.
    pub fn sge(&self, range: core::ops::Range<usize>) -> Option<Sge<'_>> {
        let (addr, len) = self.bytes().entry(&range)?;
        // SAFETY: inside this region, which outlives the entry's borrow.
        Some(unsafe { Sge::from_raw(addr, len, self.key) })
    }

    /// A scatter entry for `range`, or `None` if out of bounds or without local write
    /// access. Does not allocate.
    pub fn sge_mut(&mut self, range: core::ops::Range<usize>) -> Option<SgeMut<'_>> {
        if !self.access.contains(AccessFlags::LOCAL_WRITE) {
            return None;
        }
        let (addr, len) = self.bytes().entry(&range)?;
        // SAFETY: inside this region, borrowed mutably for the entry's life.
        Some(unsafe { SgeMut::from_raw(addr, len, self.key) })
    }

    /// A handle that plays a peer writing this region (the instant device delivers no
    /// writes): a benchmark makes a barrier's peers arrive with it. It writes only if the
    /// region grants remote write or atomic access, as a peer's RDMA would: memory no peer
    /// can write (a [`RecvRing`](crate::channel::RecvRing)'s, a node's message slots) is
    /// lent out as plain slices, which a store through the hand would change under their
    /// readers.
    pub fn peer_hand(&self) -> PeerHand {
        PeerHand {
            mem: self.mem.clone(),
            writable: self
                .access
                .intersects(AccessFlags::REMOTE_WRITE | AccessFlags::REMOTE_ATOMIC),
        }
    }
}

crate::memory::region_by_inherent_methods!(InstantRegion);

/// Writes a region as a peer's RDMA write would ([`InstantRegion::peer_hand`]).
pub struct PeerHand {
    mem: Rc<Memory>,
    /// Whether a peer may write the region (its remote access): if not, nothing is stored.
    writable: bool,
}

impl fmt::Debug for PeerHand {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PeerHand")
            .field("len", &self.mem.len)
            .field("writable", &self.writable)
            .finish()
    }
}

impl PeerHand {
    /// A volatile little-endian `u64` store at an 8-aligned `offset`; `false` (storing
    /// nothing) if misaligned, out of bounds, or the region grants no remote write or atomic
    /// access. Does not allocate.
    #[inline]
    pub fn store_u64(&self, offset: usize, v: u64) -> bool {
        self.writable && self.mem.bytes().store_u64(offset, v)
    }
}

/// The instant device's Q_Key for its datagram queue pairs.
const DATAGRAM_QKEY: u32 = 0x1111_1111;
/// The path MTU its datagram queue pairs report.
const DATAGRAM_MTU: u32 = 1024;
const EOPNOTSUPP: c_int = crate::verb::errno::EOPNOTSUPP;

/// An address on the instant device: an `ibv_ah` of its own (zeroed: the driver reads
/// nothing of it) that a hand-written baseline puts in its requests as rverbs does.
#[derive(Clone)]
pub struct InstantAddress {
    ah: Rc<Heap<sys::ibv_ah>>,
    to: Destination,
}

impl fmt::Debug for InstantAddress {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("InstantAddress")
            .field("to", &self.to)
            .finish()
    }
}

impl InstantAddress {
    /// The `ibv_ah` a hand-written poster names in `wr.ud.ah`: valid while this handle (or
    /// a clone) lives.
    pub fn raw(&self) -> *mut sys::ibv_ah {
        self.ah.get()
    }
}

/// A datagram queue pair of the instant device with its own two completion queues: a
/// [`DatagramProvider`], so that [`Datagram`](crate::datagram::Datagram)'s sends can be
/// measured. Sends complete at once (signaled ones) and go nowhere; no datagram ever
/// arrives, so receives stay posted until the queue pair is flushed; multicast groups are
/// refused (`EOPNOTSUPP`). Its send path fills each `ibv_send_wr` the way
/// [`UdQp::post_send`](crate::verbs::UdQp::post_send) does (the same fields, the same
/// chain), less the address handle's protection-domain check (the device has none).
pub struct InstantDatagram {
    // Field order is drop order: the sender points at the queue pair's struct.
    sender: DatagramSender,
    qp: InstantQp,
    send_cq: InstantCq,
    recv_cq: InstantCq,
    /// Where polls of the receive queue put completions before they become datagram ones.
    recv_wc: [Completion; POLL_BATCH],
    ctx: *mut sys::ibv_context,
}

impl fmt::Debug for InstantDatagram {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("InstantDatagram")
            .field("qp", &self.qp)
            .finish_non_exhaustive()
    }
}

impl InstantDevice {
    /// A datagram queue pair with a send and a receive completion queue of its own, each as
    /// deep as its queue (plus one entry). Allocates (setup).
    pub fn datagram(&self, caps: QpCaps) -> InstantDatagram {
        let send_cq = self.cq(caps.max_send_wr + 1);
        let recv_cq = self.cq(caps.max_recv_wr + 1);
        let qp = self.qp(&send_cq, &recv_cq, caps);
        // SAFETY: the struct is ours and nothing else reads it now.
        unsafe { (*qp.raw()).qp_type = sys::ibv_qp_type::IBV_QPT_UD };
        // SAFETY: the extended queue pair lives as long as `qp`, dropped after the sender.
        let sender = unsafe { DatagramSender::new(Ok(qp.raw.0)) };
        InstantDatagram {
            sender,
            qp,
            send_cq,
            recv_cq,
            recv_wc: [Completion::EMPTY; POLL_BATCH],
            ctx: self.ctx(),
        }
    }
}

impl InstantDatagram {
    /// Posts `wrs` as one `ibv_send_wr` chain, filling each entry the way
    /// [`UdQp::post_send`](crate::verbs::UdQp::post_send) does: on a legacy device, or for a
    /// batch the extended path handed over. Out of line: the extended path is the common one.
    ///
    /// # Safety
    /// As for [`DatagramProvider::post_send`].
    #[inline(never)]
    unsafe fn post_chain(
        &mut self,
        wrs: &[DatagramRequest<'_, InstantAddress>],
    ) -> Result<(), PostFailure> {
        let qp = self.qp.raw();
        // SAFETY: the QP is live; the address handles are alive (borrowed by the requests);
        // the device touches no memory; the index is below wrs.len() == n.
        unsafe {
            self.sender.chain.post(qp, wrs.len(), |i, wr| {
                let w = wrs.get_unchecked(i);
                wr.wr_id = w.wr_id;
                // Sge is #[repr(C)] with the layout of ibv_sge (checked in verbs::mod).
                wr.sg_list = w.sges.as_ptr().cast_mut().cast();
                wr.num_sge = w.sges.len() as c_int;
                (wr.opcode, wr.__bindgen_anon_1.imm_data) = match w.imm {
                    Some(imm) => (sys::ibv_wr_opcode::IBV_WR_SEND_WITH_IMM, imm.to_be()),
                    None => (sys::ibv_wr_opcode::IBV_WR_SEND, 0),
                };
                wr.send_flags = (w.flags & !SendFlags::FENCE).bits();
                wr.wr.ud = sys::ibv_send_wr__bindgen_ty_2__bindgen_ty_3 {
                    ah: w.dest.raw(),
                    remote_qpn: w.remote_qpn,
                    remote_qkey: w.remote_qkey,
                };
                Ok(())
            })
        }
    }

    /// The queue pair's `ibv_qp` (see [`InstantQp::raw`]).
    pub fn raw_qp(&self) -> *mut sys::ibv_qp {
        self.qp.raw()
    }

    /// The queue pair's `ibv_qp_ex` (see [`InstantQp::raw_ex`]).
    pub fn raw_qp_ex(&self) -> Option<*mut sys::ibv_qp_ex> {
        self.post_path().is_extended().then(|| self.qp.raw.get())
    }

    /// How rverbs posts to the queue pair (see [`InstantDevice::legacy`]).
    pub fn post_path(&self) -> PostPath {
        self.sender.path()
    }

    /// The send completion queue's `ibv_cq` (see [`InstantCq::raw`]).
    pub fn raw_send_cq(&self) -> *mut sys::ibv_cq {
        self.send_cq.raw()
    }
}

impl DatagramProvider for InstantDatagram {
    type Address = InstantAddress;

    #[inline]
    fn same_address(a: &InstantAddress, b: &InstantAddress) -> bool {
        Rc::ptr_eq(&a.ah, &b.ah)
    }

    fn caps(&self) -> QpCaps {
        self.qp.caps
    }

    #[inline]
    fn qp_num(&self) -> u32 {
        self.qp.qp_num()
    }

    fn qkey(&self) -> u32 {
        DATAGRAM_QKEY
    }

    fn gid(&self) -> Gid {
        Gid::default()
    }

    fn lid(&self) -> u16 {
        1
    }

    fn mtu(&self) -> u32 {
        DATAGRAM_MTU
    }

    fn address(&mut self, to: Destination) -> Result<InstantAddress, ProviderError> {
        let mut ah: sys::ibv_ah = zeroed();
        ah.context = self.ctx;
        Ok(InstantAddress {
            ah: Rc::new(Heap::new(ah)),
            to,
        })
    }

    #[inline(always)]
    unsafe fn post_send(
        &mut self,
        wrs: &[DatagramRequest<'_, InstantAddress>],
    ) -> Result<(), PostFailure> {
        if let Some(wr) = self.sender.extended() {
            // SAFETY: the QP is live; the address handles are alive (borrowed by the
            // requests); the device touches no memory.
            match unsafe { wr.post(wrs, |dest| Ok(dest.raw())) } {
                Ok(()) => return Ok(()),
                Err(Some(f)) => return Err(f),
                // A request of several entries: the batch goes through the chain.
                Err(None) => {}
            }
        }
        // SAFETY: forwarded contract.
        unsafe { self.post_chain(wrs) }
    }

    #[inline]
    unsafe fn post_recv(&mut self, wrs: &[RecvRequest<'_>]) -> Result<(), PostFailure> {
        // SAFETY: forwarded contract; the QP is live.
        unsafe { self.qp.post_recv(wrs) }
    }

    #[inline]
    fn poll_send(&mut self, out: &mut [Completion]) -> Result<usize, ProviderError> {
        self.send_cq.poll(out)
    }

    /// Receives only ever complete flushed here (no datagram arrives), so no sender fields
    /// are ever defined: each completion comes with zeros for them.
    fn poll_recv(&mut self, out: &mut [DatagramCompletion]) -> Result<usize, ProviderError> {
        let n = out.len().min(POLL_BATCH);
        let got = self.recv_cq.poll(&mut self.recv_wc[..n])?;
        for (d, wc) in out.iter_mut().zip(&self.recv_wc[..got]) {
            *d = DatagramCompletion {
                wc: *wc,
                ..DatagramCompletion::EMPTY
            };
        }
        Ok(got)
    }

    fn set_error(&mut self) -> Result<(), ProviderError> {
        self.qp.set_error()
    }

    fn join_group(&mut self, _group: Gid) -> Result<(), ProviderError> {
        Err(ProviderError {
            verb: Verb::AttachMcast,
            errno: EOPNOTSUPP,
        })
    }

    fn leave_group(&mut self, _group: Gid) -> Result<(), ProviderError> {
        Err(ProviderError {
            verb: Verb::DetachMcast,
            errno: EOPNOTSUPP,
        })
    }
}
