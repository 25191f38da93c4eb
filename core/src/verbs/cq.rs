//! Completion queues and work completions.

use alloc::sync::Arc;
use core::cell::Cell;
use core::fmt;
use core::marker::PhantomData;
use core::mem::MaybeUninit;
use core::ptr::NonNull;
use core::sync::atomic::AtomicBool;

use super::device::Context;
use super::error::{Result, Verb, VerbsError};
use super::event::{ChannelInner, CompletionChannel};
use super::ffi::{self, errno, sys};
use crate::completion::{Completion, CompletionKind, DatagramCompletion, WcStatus};

pub(crate) struct CqInner {
    pub(crate) raw: NonNull<sys::ibv_cq>,
    _ctx: Context,
    // Dropped after the CQ is destroyed: a channel outlives its queues.
    channel: Option<Arc<ChannelInner>>,
    /// Whether the queue is armed for an event; the CQ's `cq_context` points at it, so
    /// whoever reads the event disarms it (see `verbs::event`). Dropped after the CQ is
    /// destroyed, which waits until every event read was acknowledged.
    pub(crate) armed: Arc<AtomicBool>,
}

impl Drop for CqInner {
    fn drop(&mut self) {
        // SAFETY: every QP using this CQ holds an Arc to it, so none is alive now.
        unsafe {
            sys::ibv_destroy_cq(self.raw.as_ptr());
        }
    }
}

// SAFETY: only the one `Cq` handle polls (it needs &mut and is neither Clone nor Sync); the
// Arc clones queue pairs hold only keep the queue alive, and destroying it from whichever
// thread drops the last clone is allowed. The pointer is owned.
unsafe impl Send for CqInner {}
// SAFETY: as above.
unsafe impl Sync for CqInner {}

/// A completion queue, polled by whoever owns this handle.
///
/// Not `Clone` and not `Sync`: polling needs `&mut self`, so safe code cannot poll one queue
/// from two threads at once. That matters because providers may drop their internal locks
/// (mlx5 does under `MLX5_SINGLE_THREADED=1`, a common low-latency setting). Queue pairs keep
/// the queue alive without being able to poll it.
///
/// ```compile_fail,E0277
/// # use rverbs_core::verbs::Cq;
/// fn is_sync<T: Sync>() {}
/// is_sync::<Cq>();
/// ```
///
/// ```compile_fail,E0308
/// # use rverbs_core::verbs::Cq;
/// fn two_pollers(cq: &Cq) -> (Cq, Cq) { (cq.clone(), cq.clone()) }
/// ```
pub struct Cq {
    inner: Arc<CqInner>,
    capacity: u32,
    _not_sync: PhantomData<Cell<()>>,
}

impl fmt::Debug for Cq {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Cq")
            .field("capacity", &self.capacity)
            .finish()
    }
}

impl Context {
    /// Creates a completion queue with room for at least `min_entries` completions.
    pub fn create_cq(&self, min_entries: u32) -> Result<Cq> {
        self.create_cq_with(min_entries, None)
    }

    pub(crate) fn create_cq_with(
        &self,
        min_entries: u32,
        channel: Option<Arc<ChannelInner>>,
    ) -> Result<Cq> {
        let n = core::ffi::c_int::try_from(min_entries.max(1)).map_err(|_| {
            VerbsError::InvalidArgument {
                what: "completion queue size",
            }
        })?;
        let raw_channel = channel
            .as_ref()
            .map_or(core::ptr::null_mut(), |c| c.raw.as_ptr());
        // SAFETY: the context is open; the channel, if any, is live and belongs to it (the
        // Arc keeps it alive as long as the CQ); no CQ context.
        let raw =
            unsafe { sys::ibv_create_cq(self.as_raw(), n, core::ptr::null_mut(), raw_channel, 0) };
        let raw = NonNull::new(raw).ok_or(VerbsError::Call {
            verb: Verb::CreateCq,
            errno: errno(),
        })?;
        // SAFETY: raw is a live CQ; cqe holds the granted size.
        let capacity = u32::try_from(unsafe { (*raw.as_ptr()).cqe }).unwrap_or(min_entries);
        let armed = Arc::new(AtomicBool::new(false));
        // SAFETY: raw is a live CQ nobody else knows yet; `cq_context` is ours to set. It
        // points at `armed`, which outlives the CQ (dropped after ibv_destroy_cq returned).
        unsafe {
            (*raw.as_ptr()).cq_context = Arc::as_ptr(&armed).cast_mut().cast();
        }
        Ok(Cq {
            inner: Arc::new(CqInner {
                raw,
                _ctx: self.clone(),
                channel,
                armed,
            }),
            capacity,
            _not_sync: PhantomData,
        })
    }
}

/// Most completions taken from the device in one `ibv_poll_cq` call.
pub const POLL_BATCH: usize = 32;

impl Cq {
    /// The raw `ibv_cq`.
    pub fn as_raw(&self) -> *mut sys::ibv_cq {
        self.inner.raw.as_ptr()
    }

    /// A handle that keeps the queue alive (for queue pairs that complete into it) and
    /// cannot poll it.
    pub(crate) fn keep_alive(&self) -> Arc<CqInner> {
        self.inner.clone()
    }

    /// The completion channel this queue raises its events on, if any.
    pub fn channel(&self) -> Option<CompletionChannel> {
        self.inner
            .channel
            .clone()
            .map(CompletionChannel::from_inner)
    }

    /// Whether this queue raises its events on `channel`.
    pub fn is_on(&self, channel: &CompletionChannel) -> bool {
        self.inner
            .channel
            .as_ref()
            .is_some_and(|c| c.raw == channel.inner_raw())
    }

    /// Entries the device granted (at least what was asked for).
    pub fn capacity(&self) -> u32 {
        self.capacity
    }

    /// Polls up to `out.len()` (at most [`POLL_BATCH`]) completions into `out` and returns how
    /// many. Does not allocate.
    #[inline]
    pub fn poll(&mut self, out: &mut [Completion]) -> Result<usize> {
        // SAFETY: the CQ is live, and `&mut self` makes this the only poller.
        unsafe { poll_completions(self.as_raw(), out) }
    }

    /// Polls up to `out.len()` (at most [`POLL_BATCH`]) completions of a datagram queue pair,
    /// with what each receive says about its sender. Does not allocate.
    #[inline]
    pub fn poll_datagrams(&mut self, out: &mut [DatagramCompletion]) -> Result<usize> {
        let mut wc = [const { MaybeUninit::<sys::ibv_wc>::uninit() }; POLL_BATCH];
        // SAFETY: the CQ is live, and `&mut self` makes this the only poller.
        let n = unsafe { poll_raw(self.as_raw(), &mut wc, out.len()) }?;
        for (dst, src) in out.iter_mut().zip(&wc[..n]) {
            // SAFETY: ibv_poll_cq wrote the first `n` entries.
            let src = unsafe { src.assume_init_ref() };
            *dst = DatagramCompletion {
                wc: convert(src),
                src_qp: src.src_qp,
                slid: src.slid,
                sl: src.sl,
                path_bits: src.dlid_path_bits,
                grh: (src.wc_flags & sys::ibv_wc_flags::IBV_WC_GRH).0 != 0,
            };
        }
        Ok(n)
    }
}

/// Polls up to `out.len()` (at most [`POLL_BATCH`]) completions of `cq` into `out` through
/// the provider's `poll_cq`, and returns how many: the one place completions are taken from
/// a device and converted ([`Cq::poll`] and the instant provider's queues both poll through
/// it). Does not allocate.
///
/// # Safety
/// `cq` is live, and nobody else polls it meanwhile.
#[inline]
pub(crate) unsafe fn poll_completions(
    cq: *mut sys::ibv_cq,
    out: &mut [Completion],
) -> Result<usize> {
    let mut wc = [const { MaybeUninit::<sys::ibv_wc>::uninit() }; POLL_BATCH];
    // SAFETY: forwarded contract.
    let n = unsafe { poll_raw(cq, &mut wc, out.len()) }?;
    for (dst, src) in out.iter_mut().zip(&wc[..n]) {
        // SAFETY: ibv_poll_cq wrote the first `n` entries.
        *dst = convert(unsafe { src.assume_init_ref() });
    }
    Ok(n)
}

/// Polls up to `want` (at most [`POLL_BATCH`]) completions of `cq` into `wc`, which is left
/// uninitialised (an empty poll, the common case of a busy-polling loop, then writes no
/// memory); returns how many entries the device wrote, from the start.
///
/// # Safety
/// `cq` is live, and nobody else polls it meanwhile.
#[inline]
unsafe fn poll_raw(
    cq: *mut sys::ibv_cq,
    wc: &mut [MaybeUninit<sys::ibv_wc>; POLL_BATCH],
    want: usize,
) -> Result<usize> {
    let want = want.min(POLL_BATCH);
    // SAFETY: the caller keeps the CQ live; wc has room for `want` entries, which
    // ibv_poll_cq writes (MaybeUninit<ibv_wc> has the layout of ibv_wc).
    let n = unsafe { ffi::poll_cq(cq, want as core::ffi::c_int, wc.as_mut_ptr().cast()) };
    if n < 0 {
        return Err(VerbsError::Call {
            verb: Verb::PollCq,
            errno: -n,
        });
    }
    Ok((n as usize).min(want))
}

#[inline]
fn convert(wc: &sys::ibv_wc) -> Completion {
    let (status, vendor_err) = match wc.error() {
        None => (WcStatus::Success, 0),
        Some((s, v)) => (WcStatus::from_code(s), v),
    };
    use sys::ibv_wc_opcode as op;
    let kind = match wc.opcode() {
        op::IBV_WC_SEND => CompletionKind::Send,
        op::IBV_WC_RDMA_WRITE => CompletionKind::Write,
        op::IBV_WC_RDMA_READ => CompletionKind::Read,
        op::IBV_WC_COMP_SWAP | op::IBV_WC_FETCH_ADD => CompletionKind::Atomic,
        op::IBV_WC_RECV => CompletionKind::Recv,
        op::IBV_WC_RECV_RDMA_WITH_IMM => CompletionKind::RecvWriteImm,
        _ => CompletionKind::Other,
    };
    Completion {
        wr_id: wc.wr_id(),
        status,
        vendor_err,
        kind,
        byte_len: wc.len() as u32,
        imm: wc.imm_data().map(u32::from_be),
        qp_num: wc.qp_num,
    }
}
