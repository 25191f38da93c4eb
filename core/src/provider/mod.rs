//! The provider seam: the few verbs the engine needs, behind one trait.
//!
//! [`crate::channel::Channel`] and everything above it are written against [`Provider`], not
//! against libibverbs. The implementations:
//! - [`verbs`] (feature `verbs`): a real RC queue pair with its own send and receive CQs;
//! - [`crate::model`], outside this folder: a deterministic in-memory model of RC
//!   connections and datagrams, so the engine builds and is tested without a device, under
//!   `no_std`, Miri and fuzzers. It never stands in for a device in a test that claims to
//!   test the data path.
//! - `crate::instant` (feature `instant`), outside this folder: the instant device, a driver
//!   behind libibverbs' own operations table that completes every request at once without
//!   touching memory, so benchmarks count rverbs' work alone.
//!
//! Datagrams (UD) have a seam of their own, [`datagram::DatagramProvider`]: a real
//! [`verbs_ud::VerbsDatagram`], or datagram queue pairs of the model's net.

use crate::completion::Completion;
use crate::params::QpCaps;
use crate::wr::{PostFailure, RecvRequest, WorkRequest};

pub mod datagram;
#[cfg(feature = "alloc")]
pub mod shared;
#[cfg(feature = "verbs")]
pub mod verbs;
#[cfg(feature = "verbs")]
pub mod verbs_ud;

pub use crate::verb::{ProviderError, Verb};
#[cfg(feature = "verbs")]
pub use crate::verbs::send_chain::SendList;

/// A queue pair's own list of device requests, which a batch builds its requests in (see
/// [`QueuePair::send_list`]). Without the `verbs` feature there is none: no value of this
/// type exists, and every batch stages provider-neutral requests.
#[cfg(not(feature = "verbs"))]
#[derive(Clone, Copy, Debug)]
pub enum SendList {}

/// The list's operations ([`crate::verbs`]'s `SendList` has them), none of which can be
/// reached: there is no value to call them on.
#[cfg(not(feature = "verbs"))]
#[allow(clippy::missing_safety_doc)]
impl SendList {
    pub(crate) unsafe fn set(self, _: usize, _: &WorkRequest<'_>) {
        match self {}
    }

    pub(crate) unsafe fn add_flags(self, _: usize, _: crate::wr::SendFlags) {
        match self {}
    }

    pub(crate) unsafe fn set_entry(self, _: usize, _: &crate::sge::Sge<'_>) {
        match self {}
    }

    pub(crate) unsafe fn post(self, _: usize) -> Result<(), PostFailure> {
        match self {}
    }
}

/// One connected RC queue pair: what can be posted to it. Where its completions go is the
/// business of [`Provider`] (its own two CQs) or of a completion queue several queue pairs
/// share ([`CompletionQueue`]).
///
/// Completions must be reported in posting order per queue (RC guarantees it), and a send
/// error must move the queue pair to the error state, flushing everything after it.
pub trait QueuePair {
    /// What the queue pair can hold.
    fn caps(&self) -> QpCaps;

    /// The queue pair's number: completions carry it, and a shared completion queue is
    /// routed by it.
    fn qp_num(&self) -> u32;

    /// Posts the requests as one chain (one doorbell). At most
    /// [`MAX_BATCH`](crate::wr::MAX_BATCH) requests.
    ///
    /// # Safety
    /// The [posting contract](crate#the-posting-contract).
    unsafe fn post_send(&mut self, wrs: &[WorkRequest<'_>]) -> Result<(), PostFailure>;

    /// The queue pair's own list of device requests (its `ibv_send_wr` list), lent to a
    /// [`Batch`](crate::channel::Batch) that writes each request into it as it is pushed and
    /// posts the list with one call: one pass over the requests. `None` (the default): the
    /// batch stages provider-neutral [`WorkRequest`]s and posts them with
    /// [`QueuePair::post_send`] (the model, and any provider that does not forward to one of
    /// this crate's verbs queue pairs: a [`SendList`] is made only by those).
    ///
    /// `unsafe` to call although it does nothing unsafe itself: a batch writes into and posts
    /// the list it returns, so a provider written in safe code alone must not be able to
    /// return one (the list of a queue pair it has dropped, or of one whose completions it
    /// does not report). A provider that returns `Some` got the list through this call, and
    /// answers for its contract:
    ///
    /// ```compile_fail,E0133
    /// use rverbs_core::provider::{QueuePair, SendList};
    /// fn lend(qp: &mut impl QueuePair) -> Option<SendList> {
    ///     qp.send_list() // error: call to unsafe function
    /// }
    /// ```
    ///
    /// # Safety
    /// The caller uses the list only while it holds this queue pair borrowed mutably (so the
    /// queue pair lives, and nothing else posts to it meanwhile), and treats every request
    /// it posts through the list as posted to this queue pair: the
    /// [posting contract](crate#the-posting-contract), the request's completion polled from
    /// this provider. A wrapper that forwards the call keeps it by returning the list of the
    /// queue pair it owns, posts to and reports the completions of.
    #[inline(always)]
    unsafe fn send_list(&mut self) -> Option<SendList> {
        None
    }

    /// Posts receives as one chain. At most [`MAX_BATCH`](crate::wr::MAX_BATCH) requests.
    ///
    /// # Safety
    /// The [posting contract](crate#the-posting-contract).
    unsafe fn post_recv(&mut self, wrs: &[RecvRequest<'_>]) -> Result<(), PostFailure>;

    /// Moves the queue pair to the error state: every outstanding request completes, flushed.
    /// (Receives of a shared receive queue stay posted: they belong to no queue pair.)
    fn set_error(&mut self) -> Result<(), ProviderError>;

    /// Most receives the shared receive queue this queue pair takes its receives from holds;
    /// 0 (the default) if it has a receive queue of its own.
    fn srq_capacity(&self) -> u32 {
        0
    }

    /// Posts receives to the queue pair's shared receive queue (any queue pair on it
    /// receives into them), as one chain of at most [`MAX_BATCH`](crate::wr::MAX_BATCH)
    /// requests. Fails with `EOPNOTSUPP` (the default) on a queue pair without one.
    ///
    /// # Safety
    /// The [posting contract](crate#the-posting-contract), until the completion is polled
    /// or [`QueuePair::srq_probe`] says the shared queue is gone: moving queue pairs to the
    /// error state does not flush a shared receive queue.
    unsafe fn post_srq_recv(&mut self, wrs: &[RecvRequest<'_>]) -> Result<(), PostFailure> {
        let _ = wrs;
        Err(PostFailure {
            posted: 0,
            errno: 95,
        })
    }

    /// Arms the low-water event of the queue pair's shared receive queue: the device reports
    /// (as an asynchronous event, `SrqLimitReached`) once fewer than `limit` receives are
    /// posted to it, then disarms. Fails with `EOPNOTSUPP` (the default) where there is no
    /// such queue or event.
    fn arm_srq_limit(&mut self, limit: u32) -> Result<(), ProviderError> {
        let _ = limit;
        Err(ProviderError {
            verb: Verb::ModifySrq,
            errno: crate::verb::errno::EOPNOTSUPP,
        })
    }

    /// The completion queues its send and receive queues complete into, `[send, receive]`,
    /// if the provider can say (see [`CompletionQueue::id`]). `None` (the default): not
    /// checked.
    fn completion_queues(&self) -> Option<[CqId; 2]> {
        None
    }

    /// Tells when the shared receive queue is gone (and with it every receive posted to it),
    /// so that memory those receives name may be freed; `None` (the default) without one.
    #[cfg(feature = "alloc")]
    fn srq_probe(&self) -> Option<crate::memory::SrqProbe> {
        None
    }
}

/// A completion queue: polled for up to `out.len()` completions at a time.
pub trait CompletionQueue {
    /// Polls completions into `out`; returns how many.
    fn poll(&mut self, out: &mut [Completion]) -> Result<usize, ProviderError>;

    /// Polls up to `scratch.len()` completions and calls `each` on every one, in order;
    /// returns how many. `scratch` is where the default ([`CompletionQueue::poll`] of one
    /// completion, then `each` on it, until the queue is empty or `scratch` is full) puts
    /// them; a queue that can read a completion where it lies (a
    /// device's extended queue, positioned on it) hands each over as it reads it and
    /// leaves `scratch` alone. `each` runs while the queue may hold its poll open, so it
    /// must neither poll this queue nor run a user's code (a panic would leave the batch
    /// open). Does not allocate.
    #[inline(always)]
    fn poll_each(
        &mut self,
        scratch: &mut [Completion],
        mut each: impl FnMut(&Completion),
    ) -> Result<usize, ProviderError>
    where
        Self: Sized,
    {
        // One completion per poll: should `each` panic, the completions behind the one it
        // was given are still in the queue, not in `scratch` with nobody to route them.
        let mut n = 0;
        for one in scratch.chunks_mut(1) {
            match self.poll(one) {
                Ok(0) => break,
                Ok(_) => {}
                // A later poll's failure ends the batch: what was routed stays routed, and
                // the next poll, meeting the same failure first, reports it.
                Err(_) if n > 0 => break,
                Err(e) => return Err(e),
            }
            each(&one[0]);
            n += 1;
        }
        Ok(n)
    }

    /// Most completions the queue holds.
    fn capacity(&self) -> u32;

    /// Which queue this is, if the provider can say: compared with
    /// [`QueuePair::completion_queues`] so that a queue pair that completes elsewhere is
    /// refused when it is routed here ([`shared::SharedCqs::add`]). `None` (the default):
    /// not checked.
    fn id(&self) -> Option<CqId> {
        None
    }
}

/// Names one completion queue (the address of its device object, or the model's node and
/// kind): equal for one queue, different for two that live at the same time.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CqId {
    /// Whose queue: the address of the object that owns it.
    pub owner: usize,
    /// Which of the owner's queues.
    pub index: usize,
}

/// A connected queue pair with a send and a receive completion queue of its own: what a
/// [`Channel`](crate::channel::Channel) is built on.
///
/// The engine ignores completions that carry another queue pair's number (a completion queue
/// shared by mistake).
pub trait Provider: QueuePair {
    /// Polls send completions into `out`; returns how many.
    fn poll_send(&mut self, out: &mut [Completion]) -> Result<usize, ProviderError>;

    /// Polls receive completions into `out`; returns how many.
    fn poll_recv(&mut self, out: &mut [Completion]) -> Result<usize, ProviderError>;

    /// For a queue pair whose completion queues are shared with others ([`shared`]): polls
    /// them once, keeps every completion for its queue pair, and calls `ready(qp_num)` for
    /// each queue pair with completions waiting. `ready` returns true if the caller polls
    /// that queue pair (both kinds, send then receive) right away, before anyone else can:
    /// its next poll of each kind then takes what is waiting without polling the shared
    /// queues again, which were just seen empty. Returns how many completions it took, or
    /// `None` for a provider with queues of its own (the default), whose caller polls each
    /// queue pair instead.
    fn poll_shared(
        &mut self,
        ready: &mut dyn FnMut(u32) -> bool,
    ) -> Result<Option<usize>, ProviderError> {
        let _ = ready;
        Ok(None)
    }

    /// [`Provider::poll_shared`] that first offers each completion to `take(slot, recv, c)`
    /// (`slot`: its queue pair's [`Provider::shared_slot`]; `recv`: it came from the receive
    /// queue) if nothing of its queue pair's kind waits before it: `true` means the caller
    /// took it (it hands it to that queue pair's channel itself, after this call and before
    /// it polls any queue pair `ready` named), `false` that it is kept for its queue pair as
    /// `poll_shared` keeps it. A completion of a queue pair the caller does not own must be
    /// refused: it waits for its owner's poll. `take` may run while a device queue holds a
    /// poll batch open ([`CompletionQueue::poll_each`]): keep it to a decision and a copy
    /// (should it panic, the batch is ended and the completion it was offered is kept for
    /// its queue pair, as if refused: a `take` that panics has not taken it; the ones
    /// behind it stay in the queue).
    /// The default ignores `take` (nothing is handed over).
    fn poll_shared_with<T: FnMut(usize, bool, &Completion) -> bool>(
        &mut self,
        take: &mut T,
        ready: &mut dyn FnMut(u32) -> bool,
    ) -> Result<Option<usize>, ProviderError>
    where
        Self: Sized,
    {
        let _ = take;
        self.poll_shared(ready)
    }

    /// For a queue pair on shared completion queues: its place among their queue pairs
    /// (fixed while it is routed there, a replaced queue pair keeping its predecessor's),
    /// as [`Provider::poll_shared_with`] names it. `None` (the default) for a provider with
    /// queues of its own.
    fn shared_slot(&self) -> Option<usize> {
        None
    }

    /// The wake-up source of this provider's queues (their completion events), if they raise
    /// any: a channel built on it [attaches](crate::poll::Backoff::attach) them to its
    /// back-off. `None` (the default) for queues without a completion channel.
    #[cfg(feature = "alloc")]
    fn wakeup_source(&self) -> Option<alloc::sync::Arc<dyn crate::poll::Wakeup>> {
        None
    }

    /// The hardware timestamp of the last completion the last poll of the send completion
    /// queue took, where that queue was created with timestamps (a latency test reads it
    /// after waiting for one request); `None` (the default) otherwise.
    fn last_send_timestamp(&self) -> Option<core::num::NonZeroU64> {
        None
    }

    /// For a queue pair on a shared receive queue: completions of receives posted with
    /// [`QueuePair::post_srq_recv`], whichever queue pair of that queue they arrived on
    /// (`qp_num` says which), in arrival order. None (the default) for a provider without.
    fn poll_srq(&mut self, out: &mut [Completion]) -> Result<usize, ProviderError> {
        let _ = out;
        Ok(0)
    }
}
