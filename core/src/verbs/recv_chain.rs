//! Receive requests as one `ibv_recv_wr` chain: what a queue pair's receive queue
//! ([`qp`](super::qp), [`ud`](super::ud)) and a shared receive queue ([`srq`](super::srq))
//! both post, one doorbell for the whole chain.

use core::mem::MaybeUninit;
use core::ptr;

use super::ffi::{self, sys, EINVAL};
use crate::wr::{PostFailure, RecvRequest, MAX_BATCH};

/// Builds `wrs` (at most [`MAX_BATCH`]) into a chain on the stack and posts it to `queue`
/// through `post` (`ffi::post_recv` or `ffi::post_srq_recv`). Does not allocate.
///
/// An empty `wrs` posts nothing; more than [`MAX_BATCH`] are refused with `EINVAL` and
/// nothing posted. A failed post says how many requests ahead of the one refused went in.
///
/// # Safety
/// `queue` is live and of the kind `post` takes; the [posting
/// contract](crate#the-posting-contract) for the buffers the requests name.
#[inline(always)]
pub(super) unsafe fn post_recv_wrs<Q>(
    queue: *mut Q,
    post: unsafe fn(*mut Q, *mut sys::ibv_recv_wr, &mut *mut sys::ibv_recv_wr) -> i32,
    wrs: &[RecvRequest<'_>],
) -> Result<(), PostFailure> {
    if let [w] = wrs {
        // One request (a ring slot's re-post, the common case): one entry on the stack, not
        // the chain's array, so this stays small enough to inline into the poster.
        let mut wr = sys::ibv_recv_wr {
            wr_id: w.wr_id,
            next: ptr::null_mut(),
            sg_list: w.sges.as_ptr().cast_mut().cast(),
            num_sge: w.sges.len() as core::ffi::c_int,
        };
        let base = ptr::addr_of_mut!(wr);
        let mut bad: *mut sys::ibv_recv_wr = ptr::null_mut();
        // SAFETY: the entry is initialised and ends the chain; the caller upholds the posting
        // contract and that queue is live and what post takes.
        let rc = unsafe { post(queue, base, &mut bad) };
        return ffi::post_result(rc, bad, base, 1, 0);
    }
    // SAFETY: forwarded.
    unsafe { post_chain(queue, post, wrs) }
}

/// [`post_recv_wrs`] for any number of requests but one: the chain built in an array on
/// the stack.
///
/// # Safety
/// As for [`post_recv_wrs`].
#[inline]
unsafe fn post_chain<Q>(
    queue: *mut Q,
    post: unsafe fn(*mut Q, *mut sys::ibv_recv_wr, &mut *mut sys::ibv_recv_wr) -> i32,
    wrs: &[RecvRequest<'_>],
) -> Result<(), PostFailure> {
    if wrs.is_empty() {
        return Ok(());
    }
    if wrs.len() > MAX_BATCH {
        return Err(PostFailure {
            posted: 0,
            errno: EINVAL,
        });
    }
    let mut chain: [MaybeUninit<sys::ibv_recv_wr>; MAX_BATCH] =
        [const { MaybeUninit::uninit() }; MAX_BATCH];
    let base = chain.as_mut_ptr().cast::<sys::ibv_recv_wr>();
    for (i, w) in wrs.iter().enumerate() {
        let next = if i + 1 < wrs.len() {
            // SAFETY: i + 1 < wrs.len() <= MAX_BATCH, inside the array.
            unsafe { base.add(i + 1) }
        } else {
            ptr::null_mut()
        };
        // Through `base`, not `chain[i]`: a `&mut` to the entry would retire the pointers
        // derived from `base` before it (the previous entry's `next`, and `base` itself,
        // which the driver walks the chain through), undefined behaviour Miri reports.
        // SAFETY: i < wrs.len() <= MAX_BATCH, inside the array; no reference into it lives.
        unsafe {
            base.add(i).write(sys::ibv_recv_wr {
                wr_id: w.wr_id,
                next,
                // Sge is #[repr(C)] with the layout of ibv_sge (checked in verbs::mod).
                sg_list: w.sges.as_ptr().cast_mut().cast(),
                num_sge: w.sges.len() as core::ffi::c_int,
            })
        };
    }
    let mut bad: *mut sys::ibv_recv_wr = ptr::null_mut();
    // SAFETY: the first wrs.len() entries are initialised and chained; the caller upholds the
    // posting contract and that queue is live and what post takes.
    let rc = unsafe { post(queue, base, &mut bad) };
    // A receive post that names no entry took none: no driver queues receives behind a
    // call that can fail afterwards (rxe and mlx5 write them to memory the device reads,
    // with no system call; the kernel path names the entry).
    ffi::post_result(rc, bad, base, wrs.len(), 0)
}
