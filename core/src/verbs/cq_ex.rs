//! Polling an extended completion queue (`ibv_cq_ex`): `ibv_start_poll`, `ibv_end_poll`
//! and the `ibv_wc_read_*` accessors, all `static inline` in `verbs.h` over
//! the queue's own function pointers.
//!
//! Why: `ibv_poll_cq` makes the driver write every field of an `ibv_wc` (48 bytes) for each
//! completion, and rverbs then converted all of them. Here the driver positions the queue on
//! a completion (its `wr_id` and `status` are fields of the queue), and rverbs reads the rest
//! one accessor at a time, only what the completion defines and a wait needs: the queue pair
//! number (a shared queue is routed by it), the opcode, the length only of receives, reads
//! and atomics, the immediate only where the completion carries one, and the timestamp only
//! on a queue created for timestamps (a separate instantiation, so other queues do not even
//! test for it). An error completion reads its vendor syndrome out of line.
//!
//! The protocol: `start_poll` returns `ENOENT` when the queue is empty, and then `end_poll`
//! must not be called; after a successful `start_poll`, `end_poll` closes the batch
//! (providers hold a lock across it and publish the consumer index there). rverbs makes each
//! completion a batch of its own (`start_poll`, read, `end_poll`, then `start_poll` again
//! for the next) and never calls `ibv_next_poll`: rxe's `next_poll`, on finding the queue
//! empty, closes the batch itself (it stores the consumer index and drops its lock), so the
//! `end_poll` every other provider expects after it would consume one entry more than the
//! device wrote on rxe (rdma-core 44, `providers/rxe/rxe.c`), and no single sequence with
//! `next_poll` is right on both. Shown in the VM by `tools/rxe-proofs/next_poll.c` (rdma-core
//! 44.0-2): after the documented `start_poll`, `next_poll` until `ENOENT`, `end_poll`, the
//! queue returns phantom completions round its ring (never-written slots, the old ones again)
//! and never the later ones, while a batch per completion, and an `end_poll` after a
//! `next_poll` that found one, return each exactly once. For a poll that takes one
//! completion (a wait for one request) the calls are the same three either way; a batch of
//! `k` costs `k - 1` calls more.

use core::ffi::c_int;
use core::mem::MaybeUninit;
use core::num::NonZeroU64;

use super::ffi::sys;
use crate::completion::{Completion, CompletionKind, DatagramCompletion, WcStatus};
use crate::verb::errno::ENOENT;
use crate::verb::{ProviderError, Verb};

type Start = unsafe extern "C" fn(*mut sys::ibv_cq_ex, *mut sys::ibv_poll_cq_attr) -> c_int;
type End = unsafe extern "C" fn(*mut sys::ibv_cq_ex);
type Read32 = unsafe extern "C" fn(*mut sys::ibv_cq_ex) -> u32;
type Read8 = unsafe extern "C" fn(*mut sys::ibv_cq_ex) -> u8;
type Read64 = unsafe extern "C" fn(*mut sys::ibv_cq_ex) -> u64;
type ReadFlags = unsafe extern "C" fn(*mut sys::ibv_cq_ex) -> core::ffi::c_uint;

/// The work-completion fields every extended queue of rverbs asks for
/// (`IBV_WC_STANDARD_FLAGS` of verbs.h): what [`Completion`] and [`DatagramCompletion`]
/// can hold. Asking does not make a poll read them.
pub(crate) const STANDARD_WC_FLAGS: u64 = (sys::IBV_WC_EX_WITH_BYTE_LEN
    | sys::IBV_WC_EX_WITH_IMM
    | sys::IBV_WC_EX_WITH_QP_NUM
    | sys::IBV_WC_EX_WITH_SRC_QP
    | sys::IBV_WC_EX_WITH_SLID
    | sys::IBV_WC_EX_WITH_SL
    | sys::IBV_WC_EX_WITH_DLID_PATH_BITS) as u64;

/// The extra field a queue created for timestamps asks for: the completion time as the
/// wall clock in nanoseconds, converted by the provider (`ibv_wc_read_completion_wallclock_ns`).
pub(crate) const WALLCLOCK_WC_FLAG: u64 = sys::IBV_WC_EX_WITH_COMPLETION_TIMESTAMP_WALLCLOCK as u64;

/// An extended queue's poll functions, copied once when the queue is created (where rverbs
/// checks that the provider set each one it calls; providers set them when they create the
/// queue and never change them), so that a poll neither tests for null nor reloads them
/// through the queue.
#[derive(Clone, Copy)]
pub(crate) struct ExOps {
    start: Start,
    end: End,
    opcode: Read32,
    vendor_err: Read32,
    byte_len: Read32,
    imm: Read32,
    qp_num: Read32,
    wc_flags: ReadFlags,
    src_qp: Read32,
    slid: Read32,
    sl: Read8,
    path_bits: Read8,
    /// Set only for a queue created with timestamps.
    wallclock: Option<Read64>,
}

impl core::fmt::Debug for ExOps {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("ExOps")
            .field("timestamps", &self.wallclock.is_some())
            .finish_non_exhaustive()
    }
}

impl ExOps {
    /// The functions of `cq`, or `None` if the provider left one rverbs calls unset (or,
    /// with `timestamps`, the wall-clock reader).
    ///
    /// # Safety
    /// `cq` is a live extended queue.
    pub(crate) unsafe fn of(cq: *mut sys::ibv_cq_ex, timestamps: bool) -> Option<Self> {
        // SAFETY: the caller keeps the queue live; this reads its function pointers (the
        // opcode reader's return type, an enum of C, is a u32 in every ABI rverbs builds
        // for: bindgen's `Type` alias is `c_uint`).
        let c = unsafe { &*cq };
        let wallclock = if timestamps {
            Some(c.read_completion_wallclock_ns?)
        } else {
            None
        };
        Some(Self {
            start: c.start_poll?,
            end: c.end_poll?,
            opcode: c.read_opcode?,
            vendor_err: c.read_vendor_err?,
            byte_len: c.read_byte_len?,
            imm: c.read_imm_data?,
            qp_num: c.read_qp_num?,
            wc_flags: c.read_wc_flags?,
            src_qp: c.read_src_qp?,
            slid: c.read_slid?,
            sl: c.read_sl?,
            path_bits: c.read_dlid_path_bits?,
            wallclock,
        })
    }

    /// Whether the queue reports completion timestamps.
    pub(crate) fn timestamps(&self) -> bool {
        self.wallclock.is_some()
    }
}

/// Runs the poll protocol over at most `max` completions, calling `each(i)` while the
/// queue is positioned on the `i`-th, and returns how many it took. The empty queue, which
/// an idle progress loop meets most, costs the `start_poll` call and one test here; the
/// batch runs out of line ([`batch`]), so the callers stay small enough to inline.
///
/// # Safety
/// `cq` is a live extended queue whose functions are `ops`, polled by nobody else
/// meanwhile; `each` only reads the current completion through `ops`.
#[inline(always)]
unsafe fn drain(
    cq: *mut sys::ibv_cq_ex,
    ops: &ExOps,
    max: usize,
    each: impl FnMut(usize),
) -> Result<usize, ProviderError> {
    // SAFETY: forwarded.
    if !unsafe { start(cq, ops, max) }? {
        return Ok(0);
    }
    // SAFETY: forwarded, positioned on a completion by a successful start_poll.
    unsafe { rest(cq, ops, max, each) }
}

/// The protocol's first `start_poll`, unless `max` is 0: whether it positioned the queue
/// on a completion (false: the queue is empty, and no batch is open).
///
/// # Safety
/// As for [`drain`].
#[inline(always)]
unsafe fn start(cq: *mut sys::ibv_cq_ex, ops: &ExOps, max: usize) -> Result<bool, ProviderError> {
    if max == 0 {
        return Ok(false);
    }
    let mut attr = sys::ibv_poll_cq_attr { comp_mask: 0 };
    // SAFETY: the caller's contract; `attr` is valid for the call.
    let rc = unsafe { (ops.start)(cq, &mut attr) };
    match rc {
        0 => Ok(true),
        ENOENT => Ok(false),
        rc => Err(failed(Verb::StartPoll, rc)),
    }
}

/// The protocol after a successful first `start_poll` ([`start`]), for `max > 0`.
///
/// # Safety
/// As for [`drain`], positioned on a completion.
#[inline(always)]
unsafe fn rest(
    cq: *mut sys::ibv_cq_ex,
    ops: &ExOps,
    max: usize,
    each: impl FnMut(usize),
) -> Result<usize, ProviderError> {
    if max == 1 {
        // One completion asked for (a blocking wait's first poll, which needs just its own
        // request's): read here, where `max` is a constant and this folds to a read and an
        // `end_poll`, not the batch's loop out of line.
        let mut each = each;
        each(0);
        // SAFETY: closes the batch the successful start_poll opened.
        unsafe { (ops.end)(cq) };
        return Ok(1);
    }
    // SAFETY: forwarded, positioned on a completion by a successful start_poll.
    Ok(unsafe { batch(cq, ops, max, each) })
}

/// After a successful `start_poll`: `each` on the current completion, `end_poll`, and
/// again from `start_poll` until `max` or the queue is empty (see the module docs for why
/// not `next_poll`). Returns how many it took: at least one, each read and ended, so the
/// device has let go of it and the caller must have it. A `start_poll` that fails here
/// (other than `ENOENT`) therefore ends the batch like an empty queue: its error is not
/// returned with the completions (that would drop them), and the caller's next poll, whose
/// first `start_poll` meets the same failure, reports it. A count alone also comes back in
/// a register, where a `Result` would come back through memory that [`drain`]'s empty
/// path, inlined into every caller, would then pass through as well.
///
/// # Safety
/// As for [`drain`], right after a successful `start_poll`; `max > 0`.
#[inline(never)]
unsafe fn batch(
    cq: *mut sys::ibv_cq_ex,
    ops: &ExOps,
    max: usize,
    mut each: impl FnMut(usize),
) -> usize {
    let mut attr = sys::ibv_poll_cq_attr { comp_mask: 0 };
    let mut n = 0;
    loop {
        each(n);
        n += 1;
        // SAFETY: closes the batch the last start_poll opened.
        unsafe { (ops.end)(cq) };
        if n == max {
            return n;
        }
        // SAFETY: the caller's contract; no batch is open.
        if unsafe { (ops.start)(cq, &mut attr) } != 0 {
            return n;
        }
    }
}

#[cold]
#[inline(never)]
fn failed(verb: Verb, rc: c_int) -> ProviderError {
    ProviderError {
        verb,
        // Providers return a positive errno; some negate it.
        errno: rc.saturating_abs(),
    }
}

/// Polls up to `out.len()` completions of `cq` into `out`; returns how many. On a queue
/// created with timestamps (`ops` has the reader), each successful completion carries its
/// timestamp and the last one taken is kept in `last`; which kind of queue it is is asked
/// only after a completion was found, so an empty poll is the `start_poll` call and its
/// test. Does not allocate.
///
/// Fails with the verb (`ibv_start_poll`) and its errno when the first `start_poll` fails
/// (a later one ends the batch, whose completions are returned: see [`batch`]): a small
/// error, so that the instant device's queues (which return it as is) and [`super::Cq`]
/// (which makes it a `VerbsError::Call`) carry no larger one through the hot path.
///
/// # Safety
/// `cq` is a live extended queue whose functions are `ops`, polled by nobody else
/// meanwhile.
#[inline(always)]
pub(crate) unsafe fn poll(
    cq: *mut sys::ibv_cq_ex,
    ops: &ExOps,
    out: &mut [Completion],
    last: &mut Option<NonZeroU64>,
) -> Result<usize, ProviderError> {
    let max = out.len();
    // SAFETY: forwarded.
    if !unsafe { start(cq, ops, max) }? {
        return Ok(0);
    }
    // The readers are inlined by force: `poll` is one function for every queue, and once a
    // second caller reads a single completion in line (a ring's receive wait does), the
    // compiler stops inlining them, which costs a blocking wait 30 instructions and a ring's
    // receive 24 (`tools/cost`: blocking_write 235 -> 265, recv_ring 276 -> 300 without).
    if ops.timestamps() {
        // SAFETY: forwarded, positioned on a completion; the closure reads the current
        // completion only, and `i < max`; the queue has the timestamp reader.
        let n = unsafe {
            rest(
                cq,
                ops,
                max,
                #[inline(always)]
                |i| {
                    read::<true>(cq, ops, out.get_unchecked_mut(i));
                },
            )
        }?;
        if let Some(c) = n.checked_sub(1).and_then(|l| out.get(l)) {
            *last = c.timestamp;
        }
        Ok(n)
    } else {
        // SAFETY: as above, without timestamps.
        unsafe {
            rest(
                cq,
                ops,
                max,
                #[inline(always)]
                |i| {
                    read::<false>(cq, ops, out.get_unchecked_mut(i));
                },
            )
        }
    }
}

/// Polls up to `max` completions of `cq`, calling `each` on every one while the queue is
/// positioned on it (read into a [`Completion`] on the stack, as [`poll`] reads them into
/// `out`): for a caller that routes each completion somewhere (the shared queues), no array
/// is written and read back. Timestamps and `last` as for [`poll`]; returns how many.
/// Should `each` panic, the open batch is closed on the way out ([`EndOnUnwind`]: the
/// provider's lock released, that completion consumed), so later polls still work. Does
/// not allocate.
///
/// # Safety
/// As for [`poll`]; `each` must not poll `cq` (a batch is open while it runs).
#[inline(always)]
pub(crate) unsafe fn poll_each(
    cq: *mut sys::ibv_cq_ex,
    ops: &ExOps,
    max: usize,
    last: &mut Option<NonZeroU64>,
    mut each: impl FnMut(&Completion),
) -> Result<usize, ProviderError> {
    // SAFETY: forwarded.
    if !unsafe { start(cq, ops, max) }? {
        return Ok(0);
    }
    if ops.timestamps() {
        // SAFETY: forwarded, positioned on a completion; the closure reads the current
        // completion only; the queue has the timestamp reader.
        unsafe {
            rest(
                cq,
                ops,
                max,
                #[inline(always)]
                move |_| {
                    let mut c = MaybeUninit::<Completion>::uninit();
                    read::<true>(cq, ops, c.as_mut_ptr());
                    // SAFETY: `read` wrote the whole completion.
                    let c = c.assume_init_ref();
                    *last = c.timestamp;
                    let open = EndOnUnwind(cq, ops.end);
                    each(c);
                    core::mem::forget(open);
                },
            )
        }
    } else {
        // SAFETY: as above, without timestamps.
        unsafe {
            rest(
                cq,
                ops,
                max,
                #[inline(always)]
                move |_| {
                    let mut c = MaybeUninit::<Completion>::uninit();
                    read::<false>(cq, ops, c.as_mut_ptr());
                    // SAFETY: `read` wrote the whole completion.
                    let c = c.assume_init_ref();
                    let open = EndOnUnwind(cq, ops.end);
                    each(c);
                    core::mem::forget(open);
                },
            )
        }
    }
}

/// Closes the poll batch of its queue when dropped: armed around a caller's code that runs
/// inside a batch ([`poll_each`]) and forgotten when that code returns, so only a panic
/// drops it (no instruction on the way that returns).
struct EndOnUnwind(*mut sys::ibv_cq_ex, End);

impl Drop for EndOnUnwind {
    fn drop(&mut self) {
        // SAFETY: made only inside a batch a successful start_poll opened on this live
        // queue, and dropped only when the code it guards unwound before that batch's
        // end_poll: this is that end_poll.
        unsafe { (self.1)(self.0) };
    }
}

/// Polls up to `out.len()` completions of a datagram queue pair's queue, with what each
/// successful receive says about its sender (zeros otherwise, as [`super::Cq::poll_datagrams`]
/// documents). Does not allocate.
///
/// # Safety
/// As for [`poll`].
#[inline]
pub(crate) unsafe fn poll_datagrams<const TS: bool>(
    cq: *mut sys::ibv_cq_ex,
    ops: &ExOps,
    out: &mut [DatagramCompletion],
) -> Result<usize, ProviderError> {
    let max = out.len();
    // SAFETY: as in `poll`.
    unsafe {
        drain(cq, ops, max, |i| {
            let mut wc = Completion::EMPTY;
            read::<TS>(cq, ops, &mut wc);
            *out.get_unchecked_mut(i) = if wc.status.is_success() && wc.kind.is_recv() {
                DatagramCompletion {
                    wc,
                    src_qp: (ops.src_qp)(cq),
                    slid: (ops.slid)(cq) as u16,
                    sl: (ops.sl)(cq),
                    path_bits: (ops.path_bits)(cq),
                    grh: (ops.wc_flags)(cq) & sys::ibv_wc_flags::IBV_WC_GRH.0 != 0,
                }
            } else {
                DatagramCompletion {
                    wc,
                    ..DatagramCompletion::EMPTY
                }
            };
        })
    }
}

/// Reads the completion the queue is positioned on into `slot` (written in place: a value
/// returned through both this and the error path would be built on the stack and copied;
/// written whole, so `slot` may be uninitialised),
/// the way `ibv_poll_cq(3)` defines its
/// fields (as the legacy conversion does): an error completion only by `wr_id`, `status`,
/// `vendor_err` and `qp_num`; a successful one also by its opcode, its length only for
/// receives, reads and atomics, its immediate only where it has one.
///
/// # Safety
/// Inside a poll batch of `cq`, whose functions are `ops`; `slot` is valid for writes.
#[inline(always)]
unsafe fn read<const TS: bool>(cq: *mut sys::ibv_cq_ex, ops: &ExOps, slot: *mut Completion) {
    // SAFETY: the caller's contract: the queue is positioned on a completion, whose wr_id
    // and status the provider stored in the queue, and whose other fields its readers give.
    unsafe {
        let wr_id = (*cq).wr_id;
        let status = (*cq).status;
        let qp_num = (ops.qp_num)(cq);
        if status != sys::ibv_wc_status::IBV_WC_SUCCESS {
            error(cq, ops, slot, wr_id, status, qp_num);
            return;
        }
        use sys::ibv_wc_opcode as op;
        let (kind, byte_len, imm) = match (ops.opcode)(cq) {
            op::IBV_WC_SEND => (CompletionKind::Send, 0, None),
            op::IBV_WC_RDMA_WRITE => (CompletionKind::Write, 0, None),
            op::IBV_WC_RDMA_READ => (CompletionKind::Read, (ops.byte_len)(cq), None),
            op::IBV_WC_COMP_SWAP | op::IBV_WC_FETCH_ADD => {
                (CompletionKind::Atomic, (ops.byte_len)(cq), None)
            }
            op::IBV_WC_RECV => {
                let imm = if (ops.wc_flags)(cq) & sys::ibv_wc_flags::IBV_WC_WITH_IMM.0 != 0 {
                    Some(u32::from_be((ops.imm)(cq)))
                } else {
                    None
                };
                (CompletionKind::Recv, (ops.byte_len)(cq), imm)
            }
            // Always carries an immediate.
            op::IBV_WC_RECV_RDMA_WITH_IMM => (
                CompletionKind::RecvWriteImm,
                (ops.byte_len)(cq),
                Some(u32::from_be((ops.imm)(cq))),
            ),
            _ => (CompletionKind::Other, 0, None),
        };
        let timestamp = if TS {
            match ops.wallclock {
                Some(f) => NonZeroU64::new(f(cq)),
                None => None,
            }
        } else {
            None
        };
        slot.write(Completion {
            wr_id,
            status: WcStatus::Success,
            vendor_err: 0,
            kind,
            byte_len,
            imm,
            qp_num,
            timestamp,
        });
    }
}

/// An error completion (out of line: the hot path reads successes).
///
/// # Safety
/// As for [`read`].
#[cold]
#[inline(never)]
unsafe fn error(
    cq: *mut sys::ibv_cq_ex,
    ops: &ExOps,
    slot: *mut Completion,
    wr_id: u64,
    status: u32,
    qp_num: u32,
) {
    let c = Completion {
        wr_id,
        status: WcStatus::from_code(status),
        // SAFETY: forwarded.
        vendor_err: unsafe { (ops.vendor_err)(cq) },
        kind: CompletionKind::Other,
        byte_len: 0,
        imm: None,
        qp_num,
        timestamp: None,
    };
    // SAFETY: the caller's contract ([`read`]'s): `slot` is valid for writes.
    unsafe { slot.write(c) };
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An extended queue played by Rust functions: `ready` successful receive completions
    /// (ids 0, 1, ...), then `start_poll` fails with `EIO` (a device error), for ever. A
    /// batch is `open` from a successful `start_poll` to its `end_poll`; a `start_poll` while
    /// one is open fails with `EDEADLK` (rxe would spin on the lock the batch holds).
    #[repr(C)]
    struct Fake {
        cq: sys::ibv_cq_ex,
        ready: u64,
        next: u64,
        open: bool,
    }

    impl Fake {
        fn new(ready: u64) -> Self {
            Fake {
                // SAFETY: plain C data (integers, pointers, optional function pointers, a
                // mutex and a condition variable as bytes): all zeroes is a valid value.
                cq: unsafe { core::mem::zeroed() },
                ready,
                next: 0,
                open: false,
            }
        }
    }

    const EIO: c_int = 5;
    const EDEADLK: c_int = 35;

    unsafe extern "C" fn start(cq: *mut sys::ibv_cq_ex, _: *mut sys::ibv_poll_cq_attr) -> c_int {
        // SAFETY: every queue these functions are given is the first field of a `Fake`
        // (`repr(C)`), reached through a pointer to the whole `Fake`.
        let f = unsafe { &mut *cq.cast::<Fake>() };
        if f.open {
            return EDEADLK;
        }
        if f.next < f.ready {
            f.cq.wr_id = f.next;
            f.cq.status = sys::ibv_wc_status::IBV_WC_SUCCESS;
            f.next += 1;
            f.open = true;
            0
        } else {
            EIO
        }
    }
    unsafe extern "C" fn end(cq: *mut sys::ibv_cq_ex) {
        // SAFETY: as in `start`.
        unsafe { (*cq.cast::<Fake>()).open = false };
    }
    unsafe extern "C" fn opcode(_: *mut sys::ibv_cq_ex) -> u32 {
        sys::ibv_wc_opcode::IBV_WC_RECV
    }
    unsafe extern "C" fn byte_len(_: *mut sys::ibv_cq_ex) -> u32 {
        8
    }
    unsafe extern "C" fn zero32(_: *mut sys::ibv_cq_ex) -> u32 {
        0
    }
    unsafe extern "C" fn zero8(_: *mut sys::ibv_cq_ex) -> u8 {
        0
    }
    unsafe extern "C" fn flags(_: *mut sys::ibv_cq_ex) -> core::ffi::c_uint {
        0
    }

    fn ops() -> ExOps {
        ExOps {
            start,
            end,
            opcode,
            vendor_err: zero32,
            byte_len,
            imm: zero32,
            qp_num: zero32,
            wc_flags: flags,
            src_qp: zero32,
            slid: zero32,
            sl: zero8,
            path_bits: zero8,
            wallclock: None,
        }
    }

    /// Completions a poll took (each read and ended: the device has let go of them) before
    /// a later `start_poll` of the same batch failed are the caller's: returned, not
    /// dropped with the error (a channel would then wait for them until its drain gave up);
    /// the failure shows at the next poll, whose first `start_poll` fails the same way.
    #[test]
    fn completions_taken_before_a_failed_start_poll_are_returned_not_lost() {
        for ready in [1u64, 2, 3] {
            let mut f = Fake::new(ready);
            let cq = core::ptr::addr_of_mut!(f).cast::<sys::ibv_cq_ex>();
            let mut out = [Completion::EMPTY; 4];
            let mut last = None;
            // SAFETY: `cq` is a live queue (the `Fake` outlives the calls) whose functions
            // are `ops()`, polled by nobody else.
            let r = unsafe { poll(cq, &ops(), &mut out, &mut last) };
            assert_eq!(r.ok(), Some(ready as usize), "{ready} ready");
            for (i, c) in out[..ready as usize].iter().enumerate() {
                assert_eq!((c.wr_id, c.byte_len), (i as u64, 8));
            }
            // SAFETY: as above.
            let r = unsafe { poll(cq, &ops(), &mut out, &mut last) };
            assert!(
                matches!(r, Err(e) if e.verb == Verb::StartPoll && e.errno == EIO),
                "{r:?}"
            );
        }
    }

    /// `poll_each` hands every completion over in order while the queue is positioned on it
    /// (each batch ended), as `poll` would have written them, and keeps `poll`'s count when a
    /// later `start_poll` of the batch fails.
    #[test]
    fn poll_each_hands_over_every_completion_in_order() {
        let mut f = Fake::new(3);
        let cq = core::ptr::addr_of_mut!(f).cast::<sys::ibv_cq_ex>();
        let (mut seen, mut last) = ([u64::MAX; 4], None);
        let mut k = 0;
        // SAFETY: `cq` is a live queue (the `Fake` outlives the calls) whose functions are
        // `ops()`, polled by nobody else; the closure does not poll it.
        let r = unsafe {
            poll_each(cq, &ops(), 4, &mut last, |c| {
                seen[k] = c.wr_id;
                assert_eq!((c.byte_len, c.kind), (8, CompletionKind::Recv));
                k += 1;
            })
        };
        assert_eq!(r.ok(), Some(3));
        assert_eq!(seen, [0, 1, 2, u64::MAX]);
        // SAFETY: as above.
        let open = unsafe { (*cq.cast::<Fake>()).open };
        assert!(!open, "every batch ended");
    }

    /// A caller's code that panics inside `poll_each`'s batch does not leave the batch open
    /// (on rxe the provider's lock would stay taken and the next poll spin for ever): the
    /// next poll works and hands over the next completion.
    #[test]
    fn a_panic_inside_poll_each_closes_the_batch() {
        extern crate std;
        use core::panic::AssertUnwindSafe;
        use std::panic::catch_unwind;
        let mut f = Fake::new(3);
        let cq = core::ptr::addr_of_mut!(f).cast::<sys::ibv_cq_ex>();
        let mut last = None;
        let r = catch_unwind(AssertUnwindSafe(|| {
            // SAFETY: as in the test above.
            unsafe {
                poll_each(cq, &ops(), 4, &mut last, |c| {
                    assert!(c.wr_id != 1, "the caller's code fails");
                })
            }
        }));
        assert!(r.is_err(), "the closure panicked on the second completion");
        // SAFETY: as above.
        let open = unsafe { (*cq.cast::<Fake>()).open };
        assert!(!open, "the batch the panic left was ended");
        let mut ids = [u64::MAX; 2];
        let mut k = 0;
        // SAFETY: as above.
        let r = unsafe {
            poll_each(cq, &ops(), 2, &mut last, |c| {
                ids[k] = c.wr_id;
                k += 1;
            })
        };
        assert_eq!((r.ok(), ids), (Some(1), [2, u64::MAX]));
    }

    /// On a queue created with timestamps, `poll_each` hands each completion over with its
    /// timestamp and keeps the last one taken, as `poll` does.
    #[test]
    fn poll_each_on_a_timestamped_queue_carries_the_timestamps() {
        unsafe extern "C" fn wallclock(cq: *mut sys::ibv_cq_ex) -> u64 {
            // SAFETY: as in `start`.
            1000 + unsafe { (*cq).wr_id }
        }
        let mut f = Fake::new(2);
        let cq = core::ptr::addr_of_mut!(f).cast::<sys::ibv_cq_ex>();
        let ops = ExOps {
            wallclock: Some(wallclock),
            ..ops()
        };
        let (mut stamps, mut last) = ([None; 2], None);
        let mut k = 0;
        // SAFETY: as in the tests above; `ops` has the timestamp reader.
        let r = unsafe {
            poll_each(cq, &ops, 4, &mut last, |c| {
                stamps[k] = c.timestamp.map(NonZeroU64::get);
                k += 1;
            })
        };
        assert_eq!(r.ok(), Some(2));
        assert_eq!(stamps, [Some(1000), Some(1001)]);
        assert_eq!(last.map(NonZeroU64::get), Some(1001));
    }
}
