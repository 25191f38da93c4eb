//! The fabric that holds both queue pairs, and the two ends that are its [`Provider`]s.

use core::cell::RefCell;
use core::fmt;
use core::marker::PhantomData;

use crate::completion::Completion;
#[cfg(doc)]
use crate::completion::WcStatus;
use crate::params::{QpCaps, RetryCount, RnrRetry};
use crate::provider::{Provider, ProviderError, QueuePair};
use crate::wr::{PostFailure, RecvRequest, WorkRequest};

use super::execute::{enter_error, Limits};
use super::keys::{make_key, GEN_MASK};
use super::queues::QpState;
use super::region::{check_registration, register_in};
use super::{AccessFlags, Side, SoftError, SoftRegion, SoftStats, MAX_INLINE, MAX_SGE, QUEUE_CAP};

/// The state both ends share (no lifetime: the region table holds raw pointers whose
/// validity [`SoftFabric`]'s `'m` vouches for).
pub(super) struct Shared {
    pub(super) caps: QpCaps,
    pub(super) limits: Limits,
    pub(super) state: RefCell<[QpState; 2]>,
}

/// A marker invariant in `'m` that also says "holds `&'m mut [u8]`".
type Invariant<'m> = PhantomData<fn(&'m mut [u8]) -> &'m mut [u8]>;

/// Shared state of two connected in-memory RC queue pairs. See the [module docs](super).
///
/// `'m` is the lifetime of the memory registered with it: every registered buffer stays
/// borrowed for as long as the fabric is in use.
pub struct SoftFabric<'m> {
    /// `pub(super)` for the unit tests, which resolve keys against the tables directly.
    pub(super) shared: Shared,
    /// Whether [`SoftFabric::ends`] handed the ends out.
    ends_taken: core::cell::Cell<bool>,
    /// Invariant in `'m`: shortening it would let a shorter-lived buffer be registered.
    _mem: Invariant<'m>,
}

impl fmt::Debug for SoftFabric<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let st = self.shared.state.borrow();
        f.debug_struct("SoftFabric")
            .field("caps", &self.shared.caps)
            .field("rnr_limit", &self.shared.limits.rnr)
            .field("retry_limit", &self.shared.limits.retry)
            .field("a", &QpDebug(&st[0]))
            .field("b", &QpDebug(&st[1]))
            .finish()
    }
}

struct QpDebug<'a>(&'a QpState);

impl fmt::Debug for QpDebug<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let q = self.0;
        f.debug_struct("Qp")
            .field("send_used", &q.sq_count.used())
            .field("recv_used", &q.rq_count.used())
            .field("unexecuted_sends", &q.sq.len)
            .field("posted_recvs", &q.rq.len)
            .field("error", &q.error)
            .field("dead", &q.dead)
            .field("stats", &q.stats)
            .finish()
    }
}

const fn min_u32(a: u32, b: u32) -> u32 {
    if a < b {
        a
    } else {
        b
    }
}

impl<'m> SoftFabric<'m> {
    /// Two connected queue pairs with `caps` (clamped to the model's capacities), giving up
    /// on a missing receive after `rnr_retry` retries and on a dead peer after `retry_count`.
    pub const fn new(caps: QpCaps, rnr_retry: RnrRetry, retry_count: RetryCount) -> Self {
        let caps = QpCaps {
            max_send_wr: min_u32(caps.max_send_wr, QUEUE_CAP as u32),
            max_recv_wr: min_u32(caps.max_recv_wr, QUEUE_CAP as u32),
            max_send_sge: min_u32(caps.max_send_sge, MAX_SGE as u32),
            max_recv_sge: min_u32(caps.max_recv_sge, MAX_SGE as u32),
            max_inline_data: min_u32(caps.max_inline_data, MAX_INLINE as u32),
        };
        Self {
            shared: Shared {
                caps,
                limits: Limits::new(rnr_retry, retry_count),
                state: RefCell::new([QpState::new(), QpState::new()]),
            },
            ends_taken: core::cell::Cell::new(false),
            _mem: PhantomData,
        }
    }

    /// The two ends, once: `None` on a second call. Two handles to one queue pair would
    /// let two channels take each other's completions (as two owners of one device queue
    /// pair cannot: a `Qp` is not `Clone`).
    pub fn ends(&self) -> Option<(SoftEnd<'_>, SoftEnd<'_>)> {
        if self.ends_taken.replace(true) {
            return None;
        }
        Some((
            SoftEnd {
                shared: &self.shared,
                side: Side::A,
            },
            SoftEnd {
                shared: &self.shared,
                side: Side::B,
            },
        ))
    }

    /// The caps both queue pairs have (after clamping).
    pub fn caps(&self) -> QpCaps {
        self.shared.caps
    }

    /// Registers `buf` with `side`'s queue pair. The region is deregistered when dropped; the
    /// buffer stays borrowed for the fabric's `'m` regardless (see the
    /// [module docs](super#memory)).
    pub fn register(
        &self,
        side: Side,
        buf: &'m mut [u8],
        access: AccessFlags,
    ) -> Result<SoftRegion<'_>, SoftError> {
        check_registration(buf.len(), access)?;
        let s = side.index();
        let mut st = self.shared.state.borrow_mut();
        let (slot, reg) = register_in(
            &mut st[s].regions,
            buf,
            access,
            |last| match (last + 1) & GEN_MASK {
                0 => Ok(1),
                g => Ok(g),
            },
            |gen, kind, slot| make_key(gen, kind, s, slot),
        )?;
        Ok(SoftRegion {
            shared: &self.shared,
            side,
            slot,
            reg,
        })
    }

    /// Simulates the death of `side`'s process: its queues are flushed, and the peer's
    /// requests fail with [`WcStatus::RetryExceeded`] from now on.
    pub fn kill(&self, side: Side) {
        let mut st = self.shared.state.borrow_mut();
        st[side.index()].dead = true;
        enter_error(&mut self.shared.pair(&mut st), side.index());
    }

    /// Whether `side`'s queue pair is in the error state.
    pub fn in_error(&self, side: Side) -> bool {
        self.shared.state.borrow()[side.index()].error
    }

    /// Send-queue slots of `side` in use (posted, not yet retired by a polled completion).
    pub fn send_queue_used(&self, side: Side) -> u64 {
        let st = self.shared.state.borrow();
        st[side.index()].sq_count.used()
    }

    /// Receive-queue slots of `side` in use (posted, completion not yet polled).
    pub fn recv_queue_used(&self, side: Side) -> u64 {
        let st = self.shared.state.borrow();
        st[side.index()].rq_count.used()
    }

    /// Counters of `side`.
    pub fn stats(&self, side: Side) -> SoftStats {
        self.shared.state.borrow()[side.index()].stats
    }
}

/// One end of a [`SoftFabric`]: a [`Provider`].
pub struct SoftEnd<'f> {
    shared: &'f Shared,
    side: Side,
}

impl fmt::Debug for SoftEnd<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SoftEnd")
            .field("side", &self.side)
            .field("qp_num", &self.side.qp_num())
            .finish()
    }
}

impl SoftEnd<'_> {
    /// Which side this end is.
    #[inline]
    pub fn side(&self) -> Side {
        self.side
    }

    /// The queue pair number its completions carry.
    #[inline]
    pub fn qp_num(&self) -> u32 {
        self.side.qp_num()
    }
}

impl QueuePair for SoftEnd<'_> {
    fn qp_num(&self) -> u32 {
        self.side.qp_num()
    }

    fn caps(&self) -> QpCaps {
        self.shared.caps
    }

    /// Posts and runs what can run (see [When work executes](super#when-work-executes)).
    /// Does not allocate.
    unsafe fn post_send(&mut self, wrs: &[WorkRequest<'_>]) -> Result<(), PostFailure> {
        // SAFETY: forwarded posting contract.
        unsafe { self.shared.post_send(self.side.index(), wrs) }
    }

    /// Does not allocate.
    unsafe fn post_recv(&mut self, wrs: &[RecvRequest<'_>]) -> Result<(), PostFailure> {
        self.shared.post_recv(self.side.index(), wrs)
    }

    fn set_error(&mut self) -> Result<(), ProviderError> {
        self.shared.set_error(self.side.index());
        Ok(())
    }
}

impl Provider for SoftEnd<'_> {
    /// One retry tick for a blocked request of this side, then the polling. Does not
    /// allocate.
    fn poll_send(&mut self, out: &mut [Completion]) -> Result<usize, ProviderError> {
        self.shared.poll_send(self.side.index(), out)
    }

    /// Does not allocate.
    fn poll_recv(&mut self, out: &mut [Completion]) -> Result<usize, ProviderError> {
        self.shared.poll_recv(self.side.index(), out)
    }
}
