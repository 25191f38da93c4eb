//! The bindings, and the verbs bindgen cannot bind.
//!
//! Only the [`verbs`](super) module touches `ibverbs-sys`, and within it each file calls the
//! verbs of the object it wraps: `device.rs` (device list, open, queries), `pd.rs`
//! (`ibv_alloc_pd`/`ibv_dealloc_pd`), `mr.rs` (`ibv_reg_mr`/`ibv_dereg_mr`), `dmabuf.rs`
//! (`ibv_reg_dmabuf_mr`), `cq.rs`
//! (`ibv_create_cq`/`ibv_destroy_cq`), `event.rs` (completion channels and events), `qp.rs`
//! (`ibv_modify_qp`, `ibv_destroy_qp`), `send_ex.rs` (`ibv_create_qp_ex`, `ibv_create_qp`,
//! `ibv_qp_to_qp_ex`, and the `static inline` `ibv_wr_*` as calls through the `ibv_qp_ex`
//! entry points), `srq.rs` (`ibv_create_srq`, `ibv_modify_srq`, `ibv_destroy_srq`). This file re-exports the bindings and implements the
//! five that are `static inline` in `verbs.h` (`ibv_post_send`, `ibv_post_recv`,
//! `ibv_post_srq_recv`, `ibv_poll_cq`, `ibv_req_notify_cq`): calls through the context's
//! `ops` table. Everything above `verbs` is written against the
//! [`Provider`](crate::provider::Provider) seam and never sees the bindings.

pub use ibverbs_sys as sys;

pub(crate) use crate::verb::errno::{EAGAIN, EINVAL, ENOSYS, EOPNOTSUPP};
use core::ffi::c_int;

extern "C" {
    /// glibc and musl both expose the thread's errno slot through this symbol.
    fn __errno_location() -> *mut c_int;
    /// From the C library: core has no `libc` dependency for one call.
    fn fcntl(fd: c_int, cmd: c_int, ...) -> c_int;
    fn socket(domain: c_int, kind: c_int, protocol: c_int) -> c_int;
    fn setsockopt(
        fd: c_int,
        level: c_int,
        name: c_int,
        value: *const core::ffi::c_void,
        len: u32,
    ) -> c_int;
    fn close(fd: c_int) -> c_int;
}

/// `struct ip_mreqn` of Linux: group, local interface address, interface index (all in
/// network order but the index).
#[repr(C)]
struct IpMreqn {
    multiaddr: [u8; 4],
    address: [u8; 4],
    ifindex: c_int,
}

/// Opens a datagram socket and makes the IP layer a member of the IPv4 multicast `group` on
/// the interface that has the address `local` (`IP_ADD_MEMBERSHIP`). Returns the socket:
/// the membership lasts until it is closed ([`close_fd`]). `Err(errno)` on failure.
pub(crate) fn join_ipv4_group(group: [u8; 4], local: [u8; 4]) -> Result<c_int, i32> {
    const AF_INET: c_int = 2;
    const SOCK_DGRAM: c_int = 2;
    const SOCK_CLOEXEC: c_int = 0o2_000_000;
    const IPPROTO_IP: c_int = 0;
    const IP_ADD_MEMBERSHIP: c_int = 35;
    // SAFETY: socket(2) takes no pointers; a failure returns -1.
    let fd = unsafe { socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0) };
    if fd < 0 {
        return Err(errno());
    }
    let req = IpMreqn {
        multiaddr: group,
        address: local,
        ifindex: 0,
    };
    // SAFETY: `req` is a valid ip_mreqn for the length passed, read only during the call.
    let rc = unsafe {
        setsockopt(
            fd,
            IPPROTO_IP,
            IP_ADD_MEMBERSHIP,
            (&raw const req).cast(),
            core::mem::size_of::<IpMreqn>() as u32,
        )
    };
    if rc != 0 {
        let e = errno();
        close_fd(fd);
        return Err(e);
    }
    Ok(fd)
}

/// Closes a descriptor this module opened.
pub(crate) fn close_fd(fd: c_int) {
    // SAFETY: the caller owns `fd` and never uses it again; close(2) takes no pointers.
    unsafe {
        close(fd);
    }
}

const F_GETFL: c_int = 3;
const F_SETFL: c_int = 4;
/// `O_NONBLOCK` on Linux (every architecture rverbs builds for).
const O_NONBLOCK: c_int = 0o4000;

/// Makes `fd` non-blocking; `Err(errno)` on failure.
pub(crate) fn set_nonblocking(fd: c_int) -> Result<(), i32> {
    // SAFETY: fcntl with F_GETFL/F_SETFL only reads and sets the descriptor's status flags;
    // an invalid fd fails with EBADF.
    unsafe {
        let flags = fcntl(fd, F_GETFL);
        if flags < 0 || fcntl(fd, F_SETFL, flags | O_NONBLOCK) < 0 {
            return Err(errno());
        }
    }
    Ok(())
}

/// Arms `cq` for one completion event (`ibv_req_notify_cq`, `static inline` in `verbs.h`).
/// Returns 0 or the errno.
///
/// # Safety
/// `cq` must be a live CQ created on a completion channel.
#[inline]
pub(crate) unsafe fn req_notify_cq(cq: *mut sys::ibv_cq, solicited_only: bool) -> i32 {
    // SAFETY: the caller guarantees cq is live, so its context and ops table are valid.
    unsafe {
        let ctx = (*cq).context;
        match (*ctx).ops.req_notify_cq {
            Some(f) => f(cq, c_int::from(solicited_only)),
            None => 38,
        }
    }
}

/// The calling thread's `errno`, read right after a verb returned NULL or -1.
#[inline]
pub(crate) fn errno() -> i32 {
    // SAFETY: __errno_location returns a valid pointer to the calling thread's errno for the
    // lifetime of the thread; reading an int through it is always sound.
    let e = unsafe { *__errno_location() };
    if e == 0 {
        // Some providers return NULL without setting errno; EIO is the honest fallback.
        5
    } else {
        e
    }
}

/// Posts a chain of send work requests with one doorbell.
///
/// Returns 0 or the errno, and sets `bad` to the first request that was not posted.
///
/// # Safety
/// `qp` must be a live QP; `wr` must head a valid, null-terminated chain whose buffers obey
/// the posting contract (see [`crate::channel`]).
#[inline]
pub(crate) unsafe fn post_send(
    qp: *mut sys::ibv_qp,
    wr: *mut sys::ibv_send_wr,
    bad: &mut *mut sys::ibv_send_wr,
) -> i32 {
    // SAFETY: the caller guarantees qp is live, so its context and ops table are valid. Every
    // provider sets post_send; a missing one is a broken libibverbs install, reported as ENOSYS.
    unsafe {
        let ctx = (*qp).context;
        match (*ctx).ops.post_send {
            Some(f) => f(qp, wr, bad),
            None => 38,
        }
    }
}

/// Posts a chain of receive work requests.
///
/// # Safety
/// As for [`post_send`].
#[inline]
pub(crate) unsafe fn post_recv(
    qp: *mut sys::ibv_qp,
    wr: *mut sys::ibv_recv_wr,
    bad: &mut *mut sys::ibv_recv_wr,
) -> i32 {
    // SAFETY: as in post_send.
    unsafe {
        let ctx = (*qp).context;
        match (*ctx).ops.post_recv {
            Some(f) => f(qp, wr, bad),
            None => 38,
        }
    }
}

/// Posts a chain of receive work requests to a shared receive queue.
///
/// # Safety
/// `srq` must be a live SRQ; `wr` as for [`post_send`].
#[inline]
pub(crate) unsafe fn post_srq_recv(
    srq: *mut sys::ibv_srq,
    wr: *mut sys::ibv_recv_wr,
    bad: &mut *mut sys::ibv_recv_wr,
) -> i32 {
    // SAFETY: as in post_send, for the SRQ's context.
    unsafe {
        let ctx = (*srq).context;
        match (*ctx).ops.post_srq_recv {
            Some(f) => f(srq, wr, bad),
            None => 38,
        }
    }
}

/// Polls up to `n` completions into `wc`. Returns the count, or a negative value on error.
///
/// # Safety
/// `cq` must be a live CQ and `wc` must point to `n` writable `ibv_wc`.
#[inline]
pub(crate) unsafe fn poll_cq(cq: *mut sys::ibv_cq, n: c_int, wc: *mut sys::ibv_wc) -> c_int {
    // SAFETY: the caller guarantees cq is live and wc has room for n entries.
    unsafe {
        let ctx = (*cq).context;
        match (*ctx).ops.poll_cq {
            Some(f) => f(cq, n, wc),
            None => -38,
        }
    }
}

/// What a post of `n` requests returned, as rverbs reports it: `rc` from the driver's post
/// call, `bad` the entry it stopped at in the list that starts at `base`, so the requests
/// ahead of `bad` went in. A failure whose `bad` names no entry (null) reports `unnamed`
/// requests posted: verbs does not say what that means, and drivers differ (rxe leaves it
/// null both when it refuses a post outright and when every request is already in its send
/// queue and only the doorbell system call failed, after which the device may still run
/// them). A `bad` outside the list (a driver bug) counts as the whole list. Never more than
/// `n`.
#[inline(always)]
pub(crate) fn post_result<T>(
    rc: c_int,
    bad: *mut T,
    base: *mut T,
    n: usize,
    unnamed: usize,
) -> Result<(), crate::wr::PostFailure> {
    if rc == 0 {
        Ok(())
    } else {
        Err(post_failed(rc, bad, base, n, unnamed))
    }
}

/// The failure [`post_result`] reports, out of the posting path.
#[cold]
#[inline(never)]
fn post_failed<T>(
    rc: c_int,
    bad: *mut T,
    base: *mut T,
    n: usize,
    unnamed: usize,
) -> crate::wr::PostFailure {
    let posted = if bad.is_null() {
        unnamed
    } else {
        // Addresses, not `offset_from`: a pointer the driver made up must not be undefined
        // behaviour here.
        let at = (bad as usize).wrapping_sub(base as usize);
        let size = core::mem::size_of::<T>().max(1);
        if at.is_multiple_of(size) && at / size < n {
            at / size
        } else {
            n
        }
    };
    crate::wr::PostFailure {
        posted: posted.min(n),
        // libibverbs' providers return a positive errno; siw returns it negated.
        errno: rc.saturating_abs(),
    }
}
