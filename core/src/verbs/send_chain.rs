//! The `ibv_send_wr` list a queue pair posts from: the one place a send chain is built and
//! handed to `ibv_post_send`, for connected ([`super::Qp`]) and datagram
//! ([`super::UdQp`]) queue pairs alike.

use alloc::boxed::Box;
use core::fmt;
use core::mem::MaybeUninit;
use core::ptr::{self, NonNull};

use super::ffi::{self, sys, EINVAL};
use crate::sge::Sge;
use crate::wr::{AtomicOp, Opcode, PostFailure, SendFlags, WorkRequest, MAX_BATCH};

/// A queue pair's own `ibv_send_wr` list, made once with the queue pair, zeroed and linked
/// (entry i names entry i + 1). A post writes only the fields a request uses, in place, and
/// ends the list after its last request for the length of the call: no request is zeroed,
/// copied or linked per post. Between posts the entries hold stale values no driver reads
/// (a driver reads a request only during the `ibv_post_send` that names it).
pub(crate) struct SendChain {
    /// The list's heap block, owned (from `Box::into_raw`, freed on drop). Kept as a raw
    /// pointer, never reborrowed through a `Box` or `&mut`: the entries' `next` pointers and
    /// every access derive from this one pointer, so none invalidates another.
    list: NonNull<sys::ibv_send_wr>,
}

// SAFETY: the list's pointers point into its own heap block, which moves with it; only the
// owner (through `&mut`) writes it, and a driver reads it only during a post.
unsafe impl Send for SendChain {}

impl SendChain {
    /// A zeroed, linked list. Allocates (setup).
    pub(crate) fn new() -> Self {
        // SAFETY: ibv_send_wr is plain C data for which all-zero bytes are a valid value.
        let list: Box<[sys::ibv_send_wr; MAX_BATCH]> =
            Box::new(unsafe { MaybeUninit::zeroed().assume_init() });
        let base = Box::into_raw(list).cast::<sys::ibv_send_wr>();
        for i in 0..MAX_BATCH - 1 {
            // SAFETY: i + 1 < MAX_BATCH: both inside the block, which stays in place.
            unsafe { (*base.add(i)).next = base.add(i + 1) };
        }
        Self {
            // SAFETY: Box::into_raw never returns null.
            list: unsafe { NonNull::new_unchecked(base) },
        }
    }

    /// Fills the first `n` entries (`fill(i, entry)`, which may refuse the request with an
    /// errno, and then nothing is posted) and posts them to `qp` with one `ibv_post_send`
    /// (one doorbell). `n` is at most [`MAX_BATCH`]; 0 posts nothing. Does not allocate.
    ///
    /// `fill` sets every field the driver reads for the request's opcode except `next`.
    ///
    /// # Safety
    /// `qp` is live; the [posting contract](crate#the-posting-contract) for the buffers the
    /// entries name.
    #[inline(always)]
    pub(crate) unsafe fn post(
        &mut self,
        qp: *mut sys::ibv_qp,
        n: usize,
        mut fill: impl FnMut(usize, &mut sys::ibv_send_wr) -> Result<(), i32>,
    ) -> Result<(), PostFailure> {
        if n == 0 {
            return Ok(());
        }
        if n > MAX_BATCH {
            return Err(PostFailure {
                posted: 0,
                errno: EINVAL,
            });
        }
        // Every entry is reached through this one pointer (the list links into itself).
        let base = self.list.as_ptr();
        for i in 0..n {
            // SAFETY: i < n <= MAX_BATCH: inside the array, and no other reference to entry
            // i is alive.
            let wr = unsafe { &mut *base.add(i) };
            if let Err(errno) = fill(i, wr) {
                return Err(PostFailure { posted: 0, errno });
            }
        }
        // SAFETY: n - 1 < MAX_BATCH. The list ends here for this post and is linked on again
        // after it.
        let last = unsafe { &mut *base.add(n - 1) };
        let after = last.next;
        last.next = ptr::null_mut();
        let mut bad: *mut sys::ibv_send_wr = ptr::null_mut();
        // SAFETY: the first n entries are filled and chained, the n-th ends the list; the
        // caller upholds the posting contract and that qp is live.
        let rc = unsafe { ffi::post_send(qp, base, &mut bad) };
        // SAFETY: as above; the driver has returned and holds no reference to the list.
        unsafe { (*base.add(n - 1)).next = after };
        // A failure that names no entry may have left every request in the send queue
        // (rxe, when its doorbell fails): count them all, so a caller flushes and waits
        // rather than hand back buffers the device may still read.
        ffi::post_result(rc, bad, base, n, n)
    }

    /// The list, for a batch to build its requests in as they are pushed and post to `qp`
    /// ([`SendList`]).
    #[inline(always)]
    pub(crate) fn list(&mut self, qp: NonNull<sys::ibv_qp>) -> SendList {
        SendList {
            list: self.list,
            qp,
        }
    }
}

/// A queue pair's own `ibv_send_wr` list, lent to a
/// [`Batch`](crate::channel::Batch): each push writes the device's request into it in place,
/// and the batch is posted with one `ibv_post_send` of the list. One pass over the requests,
/// where staging provider-neutral requests for
/// [`QueuePair::post_send`](crate::provider::QueuePair::post_send) makes two (the staged
/// copy, then the provider's loop that reads it again).
///
/// Valid while the queue pair that handed it out lives and nothing else posts through the
/// list: a batch holds the channel, and with it the queue pair, borrowed for as long as it
/// holds the list. A batch that is forgotten (`mem::forget`) leaves requests in the list that
/// nothing posts: the next post writes every field it uses again, and the list's links are
/// only cut for the length of a post call (no lock is held, nothing is left half-open).
#[derive(Clone, Copy)]
pub struct SendList {
    list: NonNull<sys::ibv_send_wr>,
    qp: NonNull<sys::ibv_qp>,
}

// SAFETY: a list is used only through the `unsafe` methods below, by the batch that holds
// the queue pair's channel borrowed mutably, so it is as much a unique borrow of the queue
// pair's list as that borrow is (the list moves with its queue pair, which is `Send`); a
// shared `&SendList` can do nothing with it. So a batch is `Send` and `Sync` when its channel
// borrow is, as it was before it held a list.
unsafe impl Send for SendList {}
// SAFETY: as above.
unsafe impl Sync for SendList {}

impl SendList {
    /// Writes request `i`: every field the driver reads for `w`'s opcode but `next` (the list
    /// is linked already). An immediate is written only for the opcodes that carry one.
    ///
    /// # Safety
    /// `i < MAX_BATCH`; the list is valid (type docs) and no reference into entry `i` is
    /// alive.
    #[inline(always)]
    pub(crate) unsafe fn set(self, i: usize, w: &WorkRequest<'_>) {
        debug_assert!(i < MAX_BATCH);
        // SAFETY: the caller's contract: entry i is inside the list and reached through its
        // pointer alone.
        let wr = unsafe { &mut *self.list.as_ptr().add(i) };
        let (opcode, imm) = send_opcode(w.opcode);
        wr.wr_id = w.wr_id;
        // Sge is #[repr(C)] with the layout of ibv_sge (checked in verbs::mod).
        wr.sg_list = w.sges.as_ptr().cast_mut().cast();
        wr.num_sge = w.sges.len() as core::ffi::c_int;
        wr.opcode = opcode;
        wr.send_flags = w.flags.bits();
        if matches!(w.opcode, Opcode::SendImm(_) | Opcode::WriteImm(_)) {
            wr.__bindgen_anon_1.imm_data = imm;
        }
        fill_remote(w, wr);
    }

    /// Adds `f` to request `i`'s flags (the verbs' own `IBV_SEND_*` bits: checked in `wr`'s
    /// tests).
    ///
    /// # Safety
    /// As for [`SendList::set`], and request `i` was set.
    #[inline(always)]
    pub(crate) unsafe fn add_flags(self, i: usize, f: SendFlags) {
        // SAFETY: the caller's contract.
        unsafe { (*self.list.as_ptr().add(i)).send_flags |= f.bits() };
    }

    /// Points request `i` at the one entry `sge` (an inline request's payload, kept by the
    /// batch, which cannot be pointed at while it is built: the batch may move between
    /// pushes).
    ///
    /// # Safety
    /// As for [`SendList::add_flags`]; `sge` stays valid until the post that reads it
    /// returned.
    #[inline(always)]
    pub(crate) unsafe fn set_entry(self, i: usize, sge: &Sge<'_>) {
        // SAFETY: the caller's contract.
        unsafe {
            let wr = &mut *self.list.as_ptr().add(i);
            wr.sg_list = ptr::from_ref(sge).cast_mut().cast();
            wr.num_sge = 1;
        }
    }

    /// Posts the first `n` requests (`0 < n <= MAX_BATCH`, each set) with one `ibv_post_send`
    /// (one doorbell): `Ok`, or how many the device took (as [`SendChain::post`]). Does not
    /// allocate.
    ///
    /// # Safety
    /// The list is valid (type docs) and the queue pair live; the
    /// [posting contract](crate#the-posting-contract) for the buffers the requests name.
    #[inline(always)]
    pub(crate) unsafe fn post(self, n: usize) -> Result<(), PostFailure> {
        debug_assert!(n > 0 && n <= MAX_BATCH);
        let base = self.list.as_ptr();
        // SAFETY: n - 1 < MAX_BATCH. The list ends here for this post and is linked on again
        // right after it (the call cannot unwind: a C function pointer).
        unsafe {
            let last = &mut *base.add(n - 1);
            let after = last.next;
            last.next = ptr::null_mut();
            let mut bad: *mut sys::ibv_send_wr = ptr::null_mut();
            let rc = ffi::post_send(self.qp.as_ptr(), base, &mut bad);
            (*base.add(n - 1)).next = after;
            ffi::post_result(rc, bad, base, n, n)
        }
    }
}

impl fmt::Debug for SendList {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("SendList")
    }
}

impl Drop for SendChain {
    fn drop(&mut self) {
        // SAFETY: the block came from Box::into_raw in `new` and is freed once, here.
        drop(unsafe { Box::from_raw(self.list.as_ptr().cast::<[sys::ibv_send_wr; MAX_BATCH]>()) });
    }
}

impl fmt::Debug for SendChain {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("SendChain")
    }
}

/// The verb opcode and the immediate (in network order) of a connected request.
#[inline]
fn send_opcode(op: Opcode) -> (sys::ibv_wr_opcode::Type, u32) {
    use sys::ibv_wr_opcode as o;
    match op {
        Opcode::Send => (o::IBV_WR_SEND, 0),
        Opcode::SendImm(i) => (o::IBV_WR_SEND_WITH_IMM, i.to_be()),
        Opcode::Write => (o::IBV_WR_RDMA_WRITE, 0),
        Opcode::WriteImm(i) => (o::IBV_WR_RDMA_WRITE_WITH_IMM, i.to_be()),
        Opcode::Read => (o::IBV_WR_RDMA_READ, 0),
        Opcode::Atomic(AtomicOp::CompareSwap { .. }) => (o::IBV_WR_ATOMIC_CMP_AND_SWP, 0),
        Opcode::Atomic(AtomicOp::FetchAdd(_)) => (o::IBV_WR_ATOMIC_FETCH_AND_ADD, 0),
    }
}

/// Writes connected request `w` into `wr` (every field but `next`).
#[inline(always)]
fn fill_connected(w: &WorkRequest<'_>, wr: &mut sys::ibv_send_wr) {
    let (opcode, imm) = send_opcode(w.opcode);
    wr.wr_id = w.wr_id;
    // Sge is #[repr(C)] with the layout of ibv_sge (checked in verbs::mod).
    wr.sg_list = w.sges.as_ptr().cast_mut().cast();
    wr.num_sge = w.sges.len() as core::ffi::c_int;
    wr.opcode = opcode;
    wr.send_flags = w.flags.bits();
    wr.__bindgen_anon_1.imm_data = imm;
    fill_remote(w, wr);
}

/// Writes the remote fields of connected request `w` into `wr`.
#[inline(always)]
fn fill_remote(w: &WorkRequest<'_>, wr: &mut sys::ibv_send_wr) {
    if let Opcode::Atomic(op) = w.opcode {
        let (compare_add, swap) = match op {
            AtomicOp::CompareSwap { compare, swap } => (compare, swap),
            AtomicOp::FetchAdd(add) => (add, 0),
        };
        wr.wr.atomic = sys::ibv_send_wr__bindgen_ty_2__bindgen_ty_2 {
            remote_addr: w.remote.addr,
            compare_add,
            swap,
            rkey: w.remote.rkey,
        };
    } else {
        // Sends ignore the remote fields (their remote memory is the default, zero): written
        // for every other opcode, so the common case takes no branch.
        wr.wr.rdma = sys::ibv_send_wr__bindgen_ty_2__bindgen_ty_1 {
            remote_addr: w.remote.addr,
            rkey: w.remote.rkey,
        };
    }
}

/// Builds `wrs` into `chain` and posts them to the connected queue pair `qp` with one
/// doorbell: what [`super::Qp::post_send`] and the instant provider's queue pairs do. At most
/// [`MAX_BATCH`] requests. Does not allocate.
///
/// # Safety
/// `qp` is live; the posting contract for the buffers.
#[inline(always)]
pub(crate) unsafe fn post_send_chain(
    qp: *mut sys::ibv_qp,
    chain: &mut SendChain,
    wrs: &[WorkRequest<'_>],
) -> Result<(), PostFailure> {
    // SAFETY: forwarded contract; the index is below wrs.len() == n.
    unsafe {
        chain.post(qp, wrs.len(), |i, wr| {
            fill_connected(wrs.get_unchecked(i), wr);
            Ok(())
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use core::cell::Cell;

    /// A driver that queues every request it is given and then fails the post without
    /// naming one, as rxe does when the doorbell system call after its loop fails: the
    /// requests stay in the send queue, where the device may still run them. Counts the
    /// requests in the `Cell<usize>` behind the queue pair's context.
    unsafe extern "C" fn queue_all_then_fail(
        qp: *mut sys::ibv_qp,
        mut wr: *mut sys::ibv_send_wr,
        _bad: *mut *mut sys::ibv_send_wr,
    ) -> core::ffi::c_int {
        // SAFETY: the test's queue pair, whose context is its counter; the list is the
        // chain's, null-terminated.
        unsafe {
            let queued = &*(*qp).qp_context.cast::<Cell<usize>>();
            while !wr.is_null() {
                queued.set(queued.get() + 1);
                wr = (*wr).next;
            }
        }
        5 // EIO
    }

    /// A driver that refuses the third request of a post, naming it.
    unsafe extern "C" fn refuse_third(
        qp: *mut sys::ibv_qp,
        mut wr: *mut sys::ibv_send_wr,
        bad: *mut *mut sys::ibv_send_wr,
    ) -> core::ffi::c_int {
        // SAFETY: as above; `bad` is the chain's out-pointer.
        unsafe {
            let queued = &*(*qp).qp_context.cast::<Cell<usize>>();
            let mut i = 0;
            while !wr.is_null() {
                if i == 2 {
                    *bad = wr;
                    return 12;
                }
                queued.set(queued.get() + 1);
                i += 1;
                wr = (*wr).next;
            }
        }
        0
    }

    fn zeroed<T>() -> T {
        // SAFETY: only used with libibverbs structs, plain C data for which zero is valid.
        unsafe { MaybeUninit::zeroed().assume_init() }
    }

    /// Posts `n` sends through `driver`; what the post returned and how many the driver took.
    fn post_through(
        driver: unsafe extern "C" fn(
            *mut sys::ibv_qp,
            *mut sys::ibv_send_wr,
            *mut *mut sys::ibv_send_wr,
        ) -> core::ffi::c_int,
        n: usize,
    ) -> (Result<(), PostFailure>, usize) {
        let queued = Cell::new(0usize);
        let mut ctx: sys::ibv_context = zeroed();
        ctx.ops.post_send = Some(driver);
        let mut qp: sys::ibv_qp = zeroed();
        qp.context = &mut ctx;
        qp.qp_context = ptr::from_ref(&queued).cast_mut().cast();
        let wrs = [WorkRequest {
            wr_id: 0,
            opcode: Opcode::Send,
            flags: crate::wr::SendFlags::empty(),
            sges: &[],
            remote: crate::sge::RemoteMemory::default(),
        }; MAX_BATCH];
        let mut chain = SendChain::new();
        // SAFETY: the queue pair is the test's, live for the call; the requests name no
        // memory.
        let r = unsafe { post_send_chain(&mut qp, &mut chain, &wrs[..n]) };
        (r, queued.get())
    }

    #[test]
    fn a_failure_naming_no_request_counts_every_request_posted() {
        for n in [1, 3, MAX_BATCH] {
            let (r, queued) = post_through(queue_all_then_fail, n);
            assert_eq!(queued, n);
            // The device holds all n: a caller told fewer would hand their buffers back.
            assert_eq!(
                r,
                Err(PostFailure {
                    posted: n,
                    errno: 5
                })
            );
        }
    }

    /// A batch's list: a post hands the driver exactly the requests set for it (the list
    /// ends after the n-th, whatever longer post came before) and is linked on again after
    /// it; a failure is counted as the chain's are.
    #[test]
    fn a_send_list_posts_its_first_n_requests_and_stays_linked() {
        let queued = Cell::new(0usize);
        let mut ctx: sys::ibv_context = zeroed();
        // The driver is changed through the pointer the queue pair holds.
        let ctx: *mut sys::ibv_context = &mut ctx;
        let mut qp: sys::ibv_qp = zeroed();
        qp.context = ctx;
        qp.qp_context = ptr::from_ref(&queued).cast_mut().cast();
        let mut chain = SendChain::new();
        let list = chain.list(NonNull::from(&mut qp));
        let w = WorkRequest {
            wr_id: 0,
            opcode: Opcode::Send,
            flags: SendFlags::empty(),
            sges: &[],
            remote: crate::sge::RemoteMemory::default(),
        };
        for (driver, n, want, took) in [
            (
                queue_all_then_fail as _,
                MAX_BATCH,
                Err((MAX_BATCH, 5)),
                MAX_BATCH,
            ),
            (queue_all_then_fail as _, 3, Err((3, 5)), 3),
            (refuse_third as _, 5, Err((2, 12)), 2),
            (refuse_third as _, 2, Ok(()), 2),
            (
                queue_all_then_fail as _,
                MAX_BATCH,
                Err((MAX_BATCH, 5)),
                MAX_BATCH,
            ),
        ] {
            // SAFETY: ctx points at the live local above; no reference to it is alive.
            unsafe { (*ctx).ops.post_send = Some(driver) };
            queued.set(0);
            for i in 0..n {
                // SAFETY: i < MAX_BATCH; no reference into the list is alive.
                unsafe {
                    list.set(
                        i,
                        &WorkRequest {
                            wr_id: i as u64,
                            ..w
                        },
                    )
                };
            }
            // SAFETY: the queue pair is the test's, live for the call; the requests name no
            // memory.
            let r = unsafe { list.post(n) }.map_err(|f| (f.posted, f.errno));
            assert_eq!((r, queued.get()), (want, took));
        }
    }

    /// What the driver reads of a connected request with opcode `op` (the immediate only for
    /// the opcodes that carry one, the remote fields only for those that reach the peer's
    /// memory, the atomic operands only for atomics).
    fn read_fields(wr: &sys::ibv_send_wr, op: Opcode) -> [u64; 9] {
        let imm = matches!(op, Opcode::SendImm(_) | Opcode::WriteImm(_));
        let remote = !matches!(op, Opcode::Send | Opcode::SendImm(_));
        let atomic = matches!(op, Opcode::Atomic(_));
        // SAFETY: plain C data, and only what the opcode uses is read, as the union member
        // it was written as (a field written as another member may lie in the padding of the
        // member written last: uninitialised for Rust, though any bits do for the driver).
        let (imm_data, addr, rkey, compare_add, swap) = unsafe {
            let i = if imm { wr.__bindgen_anon_1.imm_data } else { 0 };
            if atomic {
                let a = wr.wr.atomic;
                (i, a.remote_addr, a.rkey, a.compare_add, a.swap)
            } else if remote {
                let r = wr.wr.rdma;
                (i, r.remote_addr, r.rkey, 0, 0)
            } else {
                (i, 0, 0, 0, 0)
            }
        };
        [
            wr.wr_id,
            u64::from(wr.opcode),
            u64::from(wr.send_flags),
            wr.sg_list as u64,
            wr.num_sge as u64,
            u64::from(imm_data),
            addr ^ (u64::from(rkey) << 32),
            compare_add,
            swap,
        ]
    }

    /// A batch writes each request over whatever an earlier one of another opcode left in
    /// the entry (a forgotten batch's, a chain post's): after `SendList::set` (and
    /// `set_entry` for an inline one), every field the driver reads for the request's opcode
    /// is what the chain's own builder writes into a zeroed entry.
    #[test]
    fn a_send_list_entry_keeps_nothing_of_the_request_before() {
        let result = [0u64; 1];
        let payload = [7u8; 8];
        // SAFETY: the entries are only compared, never posted.
        let (gather, inline) = unsafe {
            (
                [Sge::from_raw(result.as_ptr() as u64, 8, 11)],
                Sge::from_raw(payload.as_ptr() as u64, 8, 0),
            )
        };
        let remote = crate::sge::RemoteMemory {
            addr: 0x1000,
            len: 8,
            rkey: 0x55,
        };
        let ops = [
            Opcode::Atomic(AtomicOp::CompareSwap {
                compare: 3,
                swap: 4,
            }),
            Opcode::WriteImm(9),
            Opcode::Send,
            Opcode::Read,
            Opcode::Atomic(AtomicOp::FetchAdd(5)),
            Opcode::SendImm(10),
            Opcode::Write,
            Opcode::Atomic(AtomicOp::CompareSwap {
                compare: 6,
                swap: 8,
            }),
            Opcode::Send,
        ];
        let mut chain = SendChain::new();
        let list = chain.list(NonNull::dangling());
        for (k, op) in ops.into_iter().enumerate() {
            for is_inline in [false, true] {
                if is_inline && !matches!(op, Opcode::Send | Opcode::Write) {
                    continue;
                }
                let w = WorkRequest {
                    wr_id: k as u64 * 2 + u64::from(is_inline),
                    opcode: op,
                    flags: if is_inline {
                        SendFlags::INLINE
                    } else {
                        SendFlags::SIGNALED
                    },
                    sges: if is_inline { &[] } else { &gather },
                    remote: if matches!(op, Opcode::Send | Opcode::SendImm(_)) {
                        crate::sge::RemoteMemory::default()
                    } else {
                        remote
                    },
                };
                // SAFETY: entry 0 of the list; no reference into it is alive.
                unsafe {
                    list.set(0, &w);
                    if is_inline {
                        list.set_entry(0, &inline);
                    }
                }
                let mut want: sys::ibv_send_wr = zeroed();
                fill_connected(&w, &mut want);
                if is_inline {
                    want.sg_list = ptr::from_ref(&inline).cast_mut().cast();
                    want.num_sge = 1;
                }
                // SAFETY: entry 0, written above; no other reference to it is alive.
                let got = unsafe { &*chain.list.as_ptr() };
                assert_eq!(read_fields(got, op), read_fields(&want, op), "{op:?}");
            }
        }
    }

    #[test]
    fn a_failure_naming_a_request_counts_those_before_it() {
        let (r, queued) = post_through(refuse_third, 5);
        assert_eq!(queued, 2);
        assert_eq!(
            r,
            Err(PostFailure {
                posted: 2,
                errno: 12
            })
        );
        let (r, queued) = post_through(refuse_third, 2);
        assert_eq!((r, queued), (Ok(()), 2));
    }

    #[test]
    fn post_result_never_reports_more_than_the_list_or_trusts_a_stray_pointer() {
        let mut list = [0u64; 4];
        let base = list.as_mut_ptr();
        // SAFETY: inside the array.
        let third = unsafe { base.add(2) };
        let ok = ffi::post_result(0, ptr::null_mut(), base, 4, 4);
        assert_eq!(ok, Ok(()));
        let f = |bad, unnamed| {
            ffi::post_result(22, bad, base, 4, unnamed)
                .unwrap_err()
                .posted
        };
        assert_eq!(f(third, 0), 2);
        assert_eq!(f(base, 4), 0);
        assert_eq!(f(ptr::null_mut(), 0), 0);
        assert_eq!(f(ptr::null_mut(), 4), 4);
        // Not an entry of the list (a driver bug): the whole list, never more.
        let mut other = 0u64;
        assert_eq!(f(&mut other, 0), 4);
        assert_eq!(f(base.wrapping_byte_add(3), 0), 4);
        assert_eq!(f(base.wrapping_add(9), 0), 4);
        // siw returns its errno negated: reported as the errno it is.
        let e = ffi::post_result(-12, third, base, 4, 0).unwrap_err();
        assert_eq!((e.posted, e.errno), (2, 12));
    }
}
