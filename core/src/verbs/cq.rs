//! Completion queues and work completions.

use alloc::boxed::Box;
use alloc::sync::Arc;
use core::cell::Cell;
use core::fmt;
use core::marker::PhantomData;
use core::num::NonZeroU64;
use core::ptr::NonNull;
use core::sync::atomic::AtomicBool;

use super::cq_ex::{self, ExOps};
use super::destroy::Owned;
use super::device::Context;
use super::error::{DeviceName, Result, TimestampRefusal, Verb, VerbsError};
use super::event::{ChannelInner, CompletionChannel};
use super::ffi::{self, errno, sys};
use crate::completion::{Completion, CompletionKind, DatagramCompletion, WcStatus};

pub(crate) struct CqInner {
    // Field order is drop order: the CQ is destroyed before the rest is released.
    pub(crate) raw: Owned<sys::ibv_cq>,
    _ctx: Context,
    // Dropped after the CQ is destroyed: a channel outlives its queues.
    channel: Option<Arc<ChannelInner>>,
    /// Whether the queue is armed for an event; the CQ's `cq_context` points at it, so
    /// whoever reads the event disarms it (see `verbs::event`). Dropped after the CQ is
    /// destroyed, which waits until every event read was acknowledged.
    pub(crate) armed: Arc<AtomicBool>,
}

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
    /// What `ibv_poll_cq` writes into: initialised once, at creation. A provider writes only the
    /// fields valid for each completion (mlx5 leaves all but `wr_id`, `status`, `qp_num`,
    /// `vendor_err` and `wc_flags` of an error completion alone, and `byte_len` of a send),
    /// so the rest holds the initial values or an older completion's values: stale, never uninitialised,
    /// and [`convert`] reads only what the completion defines. Kept here rather than on the
    /// stack so that an empty poll still writes no memory.
    wc: Box<[sys::ibv_wc; POLL_BATCH]>,
    /// The extended queue and its poll functions, or `None` on the legacy path.
    ex: Option<Extended>,
    /// Why the queue is on the legacy path, if it is.
    path: PollPath,
    /// The timestamp of the last completion a poll took (queues with timestamps only).
    last_timestamp: Option<NonZeroU64>,
    _not_sync: PhantomData<Cell<()>>,
}

/// An extended queue (the same object as [`CqInner::raw`], seen as `ibv_cq_ex`).
struct Extended {
    cq: NonNull<sys::ibv_cq_ex>,
    ops: ExOps,
}

// SAFETY: the pointer names the queue `CqInner` owns (and is Send for); only the one `Cq`
// holding this polls through it (`&mut self`), from whichever thread owns the `Cq`.
unsafe impl Send for Extended {}

/// How a [`Cq`] takes its completions from the device ([`Cq::poll_path`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum PollPath {
    /// Created with `ibv_create_cq_ex` and polled with `ibv_start_poll`/`ibv_end_poll` (one
    /// completion per batch: see `cq_ex.rs` for why not `ibv_next_poll`), reading each completion's fields one at a time, only those a wait
    /// needs.
    Extended,
    /// Created with `ibv_create_cq` and polled with `ibv_poll_cq`, which writes every field
    /// of each `ibv_wc`.
    Legacy {
        /// Why: the errno `ibv_create_cq_ex` refused the queue with (`EOPNOTSUPP` from a
        /// provider without it, or one that left a poll function rverbs calls unset), or
        /// `None` where the legacy path was asked for ([`CqOptions::legacy`]).
        create_cq_ex_errno: Option<i32>,
    },
}

/// How [`Context::create_cq_with_options`] creates a completion queue.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CqOptions {
    timestamps: bool,
    legacy: bool,
}

impl CqOptions {
    /// The defaults: the extended verbs where the provider has them, no timestamps.
    pub const fn new() -> Self {
        Self {
            timestamps: false,
            legacy: false,
        }
    }

    /// Asks for hardware completion timestamps in wall-clock time
    /// ([`Completion::timestamp`]). A device that cannot give them refuses the queue at
    /// creation ([`VerbsError::TimestampsUnsupported`]).
    pub const fn timestamps(mut self, on: bool) -> Self {
        self.timestamps = on;
        self
    }

    /// Uses the legacy verbs (`ibv_create_cq`, `ibv_poll_cq`) even where the extended ones
    /// exist: to compare the two, or to steer around a provider's extended path. Cannot be
    /// combined with timestamps (refused at creation).
    pub const fn legacy(mut self, on: bool) -> Self {
        self.legacy = on;
        self
    }
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

    /// Creates a completion queue with room for at least `min_entries` completions, on
    /// `channel` if given, as `options` say: through `ibv_create_cq_ex` where the provider
    /// has it (else `ibv_create_cq`; [`Cq::poll_path`] says which and why), with hardware
    /// timestamps if asked for (refused with [`VerbsError::TimestampsUnsupported`] on a
    /// device without them, such as rxe).
    pub fn create_cq_with_options(
        &self,
        min_entries: u32,
        channel: Option<&CompletionChannel>,
        options: CqOptions,
    ) -> Result<Cq> {
        self.create_cq_full(min_entries, channel.map(|c| c.inner.clone()), options)
    }

    pub(crate) fn create_cq_with(
        &self,
        min_entries: u32,
        channel: Option<Arc<ChannelInner>>,
    ) -> Result<Cq> {
        self.create_cq_full(min_entries, channel, CqOptions::new())
    }

    fn create_cq_full(
        &self,
        min_entries: u32,
        channel: Option<Arc<ChannelInner>>,
        options: CqOptions,
    ) -> Result<Cq> {
        let n = core::ffi::c_int::try_from(min_entries.max(1)).map_err(|_| {
            VerbsError::InvalidArgument {
                what: "completion queue size",
            }
        })?;
        let raw_channel = channel
            .as_ref()
            .map_or(core::ptr::null_mut(), |c| c.raw.as_ptr());
        let (raw, ex, path) = if options.timestamps {
            if options.legacy {
                return Err(VerbsError::InvalidArgument {
                    what: "completion timestamps need the extended verbs, not the legacy ones",
                });
            }
            self.check_timestamps()?;
            match self.create_ex(n, raw_channel, true) {
                Ok(ex) => (ex.cq.cast::<sys::ibv_cq>(), Some(ex), PollPath::Extended),
                Err(errno) if refusal(errno) => {
                    return Err(self.no_timestamps(TimestampRefusal::NoWallClock { errno }))
                }
                Err(errno) => {
                    return Err(VerbsError::Call {
                        verb: Verb::CreateCqEx,
                        errno,
                    })
                }
            }
        } else {
            let tried = if options.legacy {
                None
            } else {
                Some(self.create_ex(n, raw_channel, false))
            };
            match tried {
                Some(Ok(ex)) => (ex.cq.cast::<sys::ibv_cq>(), Some(ex), PollPath::Extended),
                Some(Err(errno)) if !refusal(errno) => {
                    return Err(VerbsError::Call {
                        verb: Verb::CreateCqEx,
                        errno,
                    })
                }
                other => {
                    // SAFETY: the context is open; the channel, if any, is live and belongs
                    // to it (the Arc keeps it alive as long as the CQ); no CQ context.
                    let raw = unsafe {
                        sys::ibv_create_cq(self.as_raw(), n, core::ptr::null_mut(), raw_channel, 0)
                    };
                    let raw = NonNull::new(raw).ok_or(VerbsError::Call {
                        verb: Verb::CreateCq,
                        errno: errno(),
                    })?;
                    let why = other.and_then(|r| r.err());
                    (
                        raw,
                        None,
                        PollPath::Legacy {
                            create_cq_ex_errno: why,
                        },
                    )
                }
            }
        };
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
                // SAFETY: raw came from ibv_create_cq(_ex) above and nothing else destroys
                // it; every QP completing into it holds an Arc to this `CqInner`, so none is
                // alive when it is destroyed.
                raw: unsafe { Owned::new(raw) },
                _ctx: self.clone(),
                channel,
                armed,
            }),
            capacity,
            wc: Box::new([sys::ibv_wc::default(); POLL_BATCH]),
            ex,
            path,
            last_timestamp: None,
            _not_sync: PhantomData,
        })
    }

    /// `ibv_create_cq_ex` with the standard fields (and the wall-clock timestamp), or the
    /// errno it failed with; a queue whose provider left a poll function rverbs calls
    /// unset is destroyed again and reported as `EOPNOTSUPP`.
    fn create_ex(
        &self,
        n: core::ffi::c_int,
        channel: *mut sys::ibv_comp_channel,
        timestamps: bool,
    ) -> core::result::Result<Extended, i32> {
        let mut attr = sys::ibv_cq_init_attr_ex {
            cqe: n as u32,
            cq_context: core::ptr::null_mut(),
            channel,
            comp_vector: 0,
            wc_flags: cq_ex::STANDARD_WC_FLAGS
                | if timestamps {
                    cq_ex::WALLCLOCK_WC_FLAG
                } else {
                    0
                },
            comp_mask: 0,
            flags: 0,
            parent_domain: core::ptr::null_mut(),
        };
        // SAFETY: the context is open; the channel, if any, belongs to it and outlives the
        // queue (its owner keeps it in CqInner).
        let cq = unsafe { super::ext::create_cq_ex(self.as_raw(), &mut attr) }?;
        // SAFETY: a live extended queue, just created.
        match unsafe { ExOps::of(cq.as_ptr(), timestamps) } {
            Some(ops) => Ok(Extended { cq, ops }),
            None => {
                // SAFETY: ours, unused, destroyed (and a refusal counted) here; an extended
                // queue is destroyed as an ibv_cq.
                drop(unsafe { Owned::<sys::ibv_cq>::new(cq.cast()) });
                Err(crate::verb::errno::EOPNOTSUPP)
            }
        }
    }

    /// Refuses timestamps on a device whose clock does not run (`ibv_query_device_ex`:
    /// `completion_timestamp_mask` or `hca_core_clock` 0) or that cannot be asked.
    fn check_timestamps(&self) -> Result<()> {
        // SAFETY: the context is open.
        match unsafe { super::ext::query_device_ex(self.as_raw()) } {
            Err(errno) => Err(self.no_timestamps(TimestampRefusal::NoQuery { errno })),
            Ok(a) if a.completion_timestamp_mask == 0 || a.hca_core_clock == 0 => {
                Err(self.no_timestamps(TimestampRefusal::NoDeviceClock))
            }
            Ok(_) => Ok(()),
        }
    }

    fn no_timestamps(&self, reason: TimestampRefusal) -> VerbsError {
        VerbsError::TimestampsUnsupported {
            device: DeviceName::new(self.name()),
            reason,
        }
    }
}

/// A failed extended poll as the device layer reports it.
fn ex_error(e: crate::verb::ProviderError) -> VerbsError {
    VerbsError::Call {
        verb: e.verb,
        errno: e.errno,
    }
}

/// Whether `ibv_create_cq_ex` failed because the provider lacks what was asked for (then
/// rverbs falls back or refuses), not for want of resources.
fn refusal(errno: i32) -> bool {
    use crate::verb::errno::{EINVAL, ENOSYS, EOPNOTSUPP};
    matches!(errno, EOPNOTSUPP | ENOSYS | EINVAL)
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
            .is_some_and(|c| c.raw.get() == channel.inner_raw())
    }

    /// Entries the device granted (at least what was asked for).
    pub fn capacity(&self) -> u32 {
        self.capacity
    }

    /// Polls up to `out.len()` (at most [`POLL_BATCH`]) completions into `out` and returns how
    /// many. Does not allocate.
    #[inline]
    pub fn poll(&mut self, out: &mut [Completion]) -> Result<usize> {
        let want = out.len().min(POLL_BATCH);
        let out = &mut out[..want];
        match &self.ex {
            Some(ex) => {
                // SAFETY: the CQ is live, its functions are `ops` (with the timestamp reader
                // if it was created with timestamps), and `&mut self` makes this the only
                // poller.
                unsafe { cq_ex::poll(ex.cq.as_ptr(), &ex.ops, out, &mut self.last_timestamp) }
                    .map_err(ex_error)
            }
            // SAFETY: the CQ is live, and `&mut self` makes this the only poller.
            None => unsafe { poll_completions(self.as_raw(), &mut self.wc, out) },
        }
    }

    /// [`Cq::poll`] for a caller that routes each completion somewhere
    /// ([`crate::provider::CompletionQueue::poll_each`]): up to `scratch.len()` (at most
    /// [`POLL_BATCH`]) completions, each handed to `each` as it is read (on the extended path
    /// while the queue is positioned on it, with `scratch` untouched; the legacy path polls
    /// one completion at a time into `scratch`, so a panicking `each` strands none behind
    /// it). `each` must not poll this queue. Does not allocate.
    #[inline]
    pub(crate) fn poll_each(
        &mut self,
        scratch: &mut [Completion],
        mut each: impl FnMut(&Completion),
    ) -> core::result::Result<usize, crate::verb::ProviderError> {
        let want = scratch.len().min(POLL_BATCH);
        match &self.ex {
            Some(ex) => {
                // SAFETY: as in `poll`; `each` does not poll this queue (the contract).
                unsafe {
                    cq_ex::poll_each(
                        ex.cq.as_ptr(),
                        &ex.ops,
                        want,
                        &mut self.last_timestamp,
                        each,
                    )
                }
            }
            None => {
                // One completion per `ibv_poll_cq`, as the extended path takes them: should
                // `each` panic, the completions behind the one it was given are still in
                // the queue, not in `scratch` with nobody to route them.
                let mut n = 0;
                for one in scratch[..want].chunks_mut(1) {
                    // SAFETY: the CQ is live, and `&mut self` makes this the only poller.
                    match unsafe { poll_completions(self.as_raw(), &mut self.wc, one) } {
                        Ok(0) => break,
                        Ok(_) => {}
                        // A later poll's failure ends the batch: what was handed over stays
                        // handed over, and the next poll, meeting the failure first, reports it.
                        Err(_) if n > 0 => break,
                        Err(e) => return Err(e.provider_error(crate::verb::Verb::PollCq)),
                    }
                    each(&one[0]);
                    n += 1;
                }
                Ok(n)
            }
        }
    }

    /// How this queue takes completions from the device, and why (the extended verbs, or
    /// the legacy ones where the provider lacks the extended ones): a program that wants to
    /// say which path it runs on asks here (core prints nothing).
    pub fn poll_path(&self) -> PollPath {
        self.path
    }

    /// Whether completions of this queue carry hardware timestamps
    /// ([`CqOptions::timestamps`]).
    pub fn has_timestamps(&self) -> bool {
        self.ex.as_ref().is_some_and(|e| e.ops.timestamps())
    }

    /// The timestamp of the last completion a poll of this queue took (`None` before the
    /// first, or on a queue without timestamps): what a latency test reads after it waited
    /// for one request.
    pub fn last_timestamp(&self) -> Option<NonZeroU64> {
        self.last_timestamp
    }

    /// The raw `ibv_cq_ex`, on the extended path.
    pub fn as_raw_ex(&self) -> Option<*mut sys::ibv_cq_ex> {
        self.ex.as_ref().map(|e| e.cq.as_ptr())
    }

    /// Polls up to `out.len()` (at most [`POLL_BATCH`]) completions of a datagram queue pair,
    /// with what each successful receive says about its sender (zeros for other
    /// completions, whose sender fields the device does not define). Does not allocate.
    #[inline]
    pub fn poll_datagrams(&mut self, out: &mut [DatagramCompletion]) -> Result<usize> {
        let want = out.len().min(POLL_BATCH);
        let out = &mut out[..want];
        match &self.ex {
            Some(ex) if ex.ops.timestamps() => {
                // SAFETY: as in `poll`.
                return unsafe { cq_ex::poll_datagrams::<true>(ex.cq.as_ptr(), &ex.ops, out) }
                    .map_err(ex_error);
            }
            Some(ex) => {
                // SAFETY: as in `poll`.
                return unsafe { cq_ex::poll_datagrams::<false>(ex.cq.as_ptr(), &ex.ops, out) }
                    .map_err(ex_error);
            }
            None => {}
        }
        // SAFETY: the CQ is live, and `&mut self` makes this the only poller.
        let n = unsafe { poll_raw(self.as_raw(), &mut self.wc, out.len()) }?;
        for (dst, src) in out.iter_mut().zip(&self.wc[..n]) {
            let wc = convert(src);
            *dst = if wc.status.is_success() && wc.kind.is_recv() {
                DatagramCompletion {
                    wc,
                    src_qp: src.src_qp,
                    slid: src.slid,
                    sl: src.sl,
                    path_bits: src.dlid_path_bits,
                    grh: (src.wc_flags & sys::ibv_wc_flags::IBV_WC_GRH).0 != 0,
                }
            } else {
                DatagramCompletion {
                    wc,
                    ..DatagramCompletion::EMPTY
                }
            };
        }
        Ok(n)
    }
}

/// Polls up to `out.len()` (at most [`POLL_BATCH`]) completions of `cq` into `out` through
/// the provider's `poll_cq`, by way of `wc` (initialised once by its owner, so fields a
/// device leaves unwritten hold old values, never uninitialised memory), and returns how
/// many: the one place completions are taken from a device and converted ([`Cq::poll`] and
/// the instant provider's queues both poll through it). Does not allocate.
///
/// # Safety
/// `cq` is live, and nobody else polls it meanwhile.
#[inline]
pub(crate) unsafe fn poll_completions(
    cq: *mut sys::ibv_cq,
    wc: &mut [sys::ibv_wc; POLL_BATCH],
    out: &mut [Completion],
) -> Result<usize> {
    // SAFETY: forwarded contract.
    let n = unsafe { poll_raw(cq, wc, out.len()) }?;
    for (dst, src) in out.iter_mut().zip(&wc[..n]) {
        *dst = convert(src);
    }
    Ok(n)
}

/// Polls up to `want` (at most [`POLL_BATCH`]) completions of `cq` into `wc`; returns how
/// many entries the device wrote, from the start.
///
/// # Safety
/// `cq` is live, and nobody else polls it meanwhile.
#[inline]
unsafe fn poll_raw(
    cq: *mut sys::ibv_cq,
    wc: &mut [sys::ibv_wc; POLL_BATCH],
    want: usize,
) -> Result<usize> {
    let want = want.min(POLL_BATCH);
    // SAFETY: the caller keeps the CQ live; wc has room for `want` entries, which
    // ibv_poll_cq writes.
    let n = unsafe { ffi::poll_cq(cq, want as core::ffi::c_int, wc.as_mut_ptr()) };
    if n < 0 {
        return Err(VerbsError::Call {
            verb: Verb::PollCq,
            errno: -n,
        });
    }
    Ok((n as usize).min(want))
}

/// Reads a completion the way `ibv_poll_cq(3)` defines its fields: an error completion
/// only by `wr_id`, `status`, `vendor_err` and `qp_num` (its opcode and lengths are
/// undefined: kind [`CompletionKind::Other`], `byte_len` 0, no immediate); a successful one
/// also by its opcode, its `byte_len` only for receives, reads and atomics (a send's or
/// write's is undefined: 0), and a receive's immediate when `wc_flags` says there is one.
#[inline]
fn convert(wc: &sys::ibv_wc) -> Completion {
    if let Some((s, vendor_err)) = wc.error() {
        return Completion {
            wr_id: wc.wr_id(),
            status: WcStatus::from_code(s),
            vendor_err,
            kind: CompletionKind::Other,
            byte_len: 0,
            imm: None,
            qp_num: wc.qp_num,
            timestamp: None,
        };
    }
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
    let byte_len = match kind {
        CompletionKind::Recv
        | CompletionKind::RecvWriteImm
        | CompletionKind::Read
        | CompletionKind::Atomic => wc.len() as u32,
        _ => 0,
    };
    Completion {
        wr_id: wc.wr_id(),
        status: WcStatus::Success,
        vendor_err: 0,
        kind,
        byte_len,
        // Receives only: rxe also flags the sender's completion of a send or write with
        // immediate IBV_WC_WITH_IMM (with a zero immediate), which ibv_poll_cq(3) does not
        // define; the extended path reads it for receives alone too. Shown in the VM by
        // tools/rxe-proofs/send_imm.c (rdma-core 44.0-2): both sender completions came back
        // with wc_flags 0x02 (WITH_IMM) and imm_data 0.
        imm: if kind.is_recv() {
            wc.imm_data().map(u32::from_be)
        } else {
            None
        },
        qp_num: wc.qp_num,
        timestamp: None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Writes `v` at byte `at` of `wc` (ibverbs-sys keeps these fields private; the offsets
    /// are those of `struct ibv_wc` in verbs.h).
    fn put(wc: &mut sys::ibv_wc, at: usize, v: u32) {
        assert!(at + 4 <= core::mem::size_of::<sys::ibv_wc>());
        // SAFETY: in bounds (checked); ibv_wc is plain C data, any bits are a valid value.
        unsafe {
            core::ptr::from_mut(wc)
                .cast::<u8>()
                .add(at)
                .cast::<u32>()
                .write_unaligned(v)
        };
    }
    const STATUS: usize = 8;
    const OPCODE: usize = 12;
    const VENDOR_ERR: usize = 16;
    const BYTE_LEN: usize = 20;
    const IMM: usize = 24;

    /// What a provider leaves behind in the fields a completion does not define.
    fn stale() -> sys::ibv_wc {
        let mut wc = sys::ibv_wc::default();
        put(&mut wc, 0, 7);
        put(&mut wc, STATUS, sys::ibv_wc_status::IBV_WC_SUCCESS);
        wc.qp_num = 9;
        put(&mut wc, OPCODE, sys::ibv_wc_opcode::IBV_WC_RECV);
        put(&mut wc, BYTE_LEN, 1234);
        put(&mut wc, IMM, 5);
        wc.wc_flags = sys::ibv_wc_flags::IBV_WC_WITH_IMM;
        wc
    }

    #[test]
    fn an_error_completion_is_read_only_by_the_fields_it_defines() {
        let mut wc = stale();
        put(&mut wc, STATUS, sys::ibv_wc_status::IBV_WC_WR_FLUSH_ERR);
        put(&mut wc, VENDOR_ERR, 0x99);
        let c = convert(&wc);
        assert_eq!((c.wr_id, c.qp_num, c.vendor_err), (7, 9, 0x99));
        assert_eq!(c.status, WcStatus::Flushed);
        assert_eq!(
            (c.kind, c.byte_len, c.imm),
            (CompletionKind::Other, 0, None)
        );
    }

    #[test]
    fn a_send_completion_has_no_length_and_a_receive_has_one() {
        let mut wc = stale();
        put(&mut wc, OPCODE, sys::ibv_wc_opcode::IBV_WC_SEND);
        wc.wc_flags = sys::ibv_wc_flags(0);
        let c = convert(&wc);
        assert_eq!((c.kind, c.byte_len, c.imm), (CompletionKind::Send, 0, None));
        // rxe flags a send with immediate's own completion WITH_IMM (shown by
        // tools/rxe-proofs/send_imm.c in the VM): still no immediate.
        wc.wc_flags = sys::ibv_wc_flags::IBV_WC_WITH_IMM;
        let c = convert(&wc);
        assert_eq!((c.kind, c.imm), (CompletionKind::Send, None));
        let c = convert(&stale());
        assert_eq!(
            (c.kind, c.byte_len, c.imm),
            (CompletionKind::Recv, 1234, Some(u32::from_be(5)))
        );
    }
}
