//! The `ibv_send_wr` list a queue pair posts from: the one place a send chain is built and
//! handed to `ibv_post_send`, for connected ([`super::Qp`]) and datagram
//! ([`super::UdQp`]) queue pairs alike.

use alloc::boxed::Box;
use core::fmt;
use core::mem::MaybeUninit;
use core::ptr::{self, NonNull};

use super::ffi::{self, sys, EINVAL};
use crate::wr::{AtomicOp, Opcode, PostFailure, WorkRequest, MAX_BATCH};

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
        // SAFETY: a driver sets bad to an entry of the list it was given.
        unsafe { ffi::post_result(rc, bad, base) }
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
#[inline]
fn fill_connected(w: &WorkRequest<'_>, wr: &mut sys::ibv_send_wr) {
    let (opcode, imm) = send_opcode(w.opcode);
    wr.wr_id = w.wr_id;
    // Sge is #[repr(C)] with the layout of ibv_sge (checked in verbs::mod).
    wr.sg_list = w.sges.as_ptr().cast_mut().cast();
    wr.num_sge = w.sges.len() as core::ffi::c_int;
    wr.opcode = opcode;
    wr.send_flags = w.flags.bits();
    wr.__bindgen_anon_1.imm_data = imm;
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
#[inline]
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
