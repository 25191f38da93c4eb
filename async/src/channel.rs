//! [`AsyncChannel`]: a channel whose operations are futures that own their buffers.

use core::fmt;
use core::future::poll_fn;
use core::ops::Range;
use core::task::{Context, Poll};

use rverbs_core::channel::{Channel, ChannelError, Done, Ticket};
use rverbs_core::memory::Region;
use rverbs_core::poll::{Backoff, Deadline, Spin};
use rverbs_core::provider::Provider;
use rverbs_core::sge::{RemoteMemory, SgeMut};

use crate::error::AsyncError;
use crate::events::Events;

/// An operation whose buffer the channel keeps until the device is done with it.
struct InFlight<M> {
    buf: M,
    /// `None` only between moving the buffer in and the post returning.
    ticket: Option<Ticket>,
    deadline: Deadline,
}

/// A [`Channel`] with async operations that take owned registered buffers ([`Region`]s) and
/// give them back with the result, the way completion-based IO must (tokio-uring does the
/// same for io_uring).
///
/// # Cancellation
/// A future may be dropped or `mem::forget`-ten at any await point. Before an operation
/// posts anything, its buffer moves into the channel, so the future never holds memory the
/// device may touch:
/// - a future dropped (or forgotten) before its post hands nothing out: the buffer is
///   dropped with the future or stays in the channel, and nothing was posted;
/// - a future dropped after its post leaves the buffer in the channel ("orphaned"). The
///   next operation first waits for it (bounded by the deadline the orphan was posted with;
///   at that deadline the channel is flushed, drained and broken, as every channel wait
///   does), then drops the buffer: released, never freed early;
/// - dropping the `AsyncChannel` with an orphan waits for it the same way (blocking, at most
///   the channel's timeout, then the flush), and only then drops the buffer; forgetting the
///   `AsyncChannel` leaks the buffer with it.
///
/// The caller reaches a buffer again only through an operation's result, after its
/// completion was polled. There is no `&mut Channel` to swap the channel out from under an
/// orphan.
///
/// # Waiting
/// Each wait polls the channel, checks the deadline (the channel's timeout from the post,
/// on the channel's clock), and otherwise asks its [`Events`] when to poll again:
/// [`TokioEvents`](crate::TokioEvents) sleeps on the completion channel through tokio's
/// reactor and a tokio timer at the deadline; [`YieldEvents`](crate::YieldEvents) re-polls
/// on every turn (the software model, runtimes without a reactor).
///
/// # Allocation
/// No operation allocates: the futures are plain state machines, the buffer moves into a
/// slot the channel already has, and [`TokioEvents`](crate::TokioEvents) reuses its reactor
/// registration and timer (proof on the model: `tests/model.rs`).
pub struct AsyncChannel<P: Provider, M: Region, E: Events, B: Backoff = Spin, const R: usize = 64> {
    chan: Channel<P, B, R>,
    inflight: Option<InFlight<M>>,
    events: E,
}

impl<P: Provider, M: Region, E: Events, B: Backoff, const R: usize> fmt::Debug
    for AsyncChannel<P, M, E, B, R>
{
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("AsyncChannel")
            .field("peer", &self.chan.peer())
            .field("in_flight", &self.inflight.is_some())
            .finish_non_exhaustive()
    }
}

impl<P: Provider, M: Region, E: Events, B: Backoff, const R: usize> AsyncChannel<P, M, E, B, R> {
    /// Wraps a connected channel; `events` wakes its waits. The channel must have nothing in
    /// flight of its own (its blocking calls leave nothing behind).
    pub fn new(chan: Channel<P, B, R>, events: E) -> Self {
        Self {
            chan,
            inflight: None,
            events,
        }
    }

    /// The channel, for inspection (its peer, failure, counters). Not `&mut`: swapping the
    /// channel out from under an orphaned operation would let the device keep its buffer
    /// while this side forgot it.
    pub fn channel(&self) -> &Channel<P, B, R> {
        &self.chan
    }

    /// Whether an operation whose future was dropped is still in flight (its buffer is kept
    /// here until it completes).
    pub fn has_orphan(&self) -> bool {
        self.inflight.is_some()
    }

    /// Waits for an orphaned operation (one whose future was dropped after it posted) and
    /// releases its buffer. Every operation does this first; call it to learn the orphan's
    /// result. `Ok(())` when there was none.
    pub async fn settle(&mut self) -> Result<(), AsyncError> {
        if self.inflight.is_none() {
            return Ok(());
        }
        let r = poll_fn(|cx| self.poll_inflight(cx)).await;
        drop(self.inflight.take());
        r.map(drop).map_err(AsyncError::Channel)
    }

    /// Blocks (without a runtime) until an orphan completed, at most its deadline; used by
    /// `Drop` and `into_inner`.
    fn settle_blocking(&mut self) {
        if let Some(InFlight {
            ticket: Some(t),
            deadline,
            ..
        }) = self.inflight
        {
            // On expiry the channel flushes and drains before it returns, so the device is
            // done with the buffer either way (or the process aborted).
            let _ = self.chan.wait_until(t, deadline);
        }
        drop(self.inflight.take());
    }

    /// Gives the channel back, after waiting (blocking, bounded) for an orphan.
    pub fn into_inner(mut self) -> Channel<P, B, R> {
        self.settle_blocking();
        let this = core::mem::ManuallyDrop::new(self);
        // SAFETY: `this` is never used or dropped again; each field is read out once, and
        // the orphan slot is empty (settled above), so nothing it owned is lost.
        unsafe {
            let chan = core::ptr::read(&this.chan);
            drop(core::ptr::read(&this.events));
            drop(core::ptr::read(&this.inflight));
            chan
        }
    }

    fn poll_inflight(&mut self, cx: &mut Context<'_>) -> Poll<Result<Done, ChannelError>> {
        let Some(InFlight {
            ticket: Some(ticket),
            deadline,
            ..
        }) = self.inflight
        else {
            // Nothing in flight: only reachable if the post itself failed, handled there.
            return Poll::Ready(Ok(Done::default()));
        };
        loop {
            if let Some(r) = self.chan.try_wait(ticket) {
                return Poll::Ready(r);
            }
            let clock = self.chan.clock();
            if deadline.passed(clock) {
                // Times out, flushes and drains (or finds it completed after all).
                return Poll::Ready(self.chan.wait_until(ticket, deadline));
            }
            match self.events.poll_events(cx, deadline, clock) {
                Poll::Ready(()) => continue,
                Poll::Pending => return Poll::Pending,
            }
        }
    }

    /// Settles an orphan, moves `buf` into the channel, posts with `post`, waits, and hands
    /// the buffer back with the result.
    async fn run(
        &mut self,
        buf: M,
        post: impl FnOnce(&mut Channel<P, B, R>, &mut M) -> Result<Ticket, AsyncError>,
    ) -> (Result<Done, AsyncError>, M) {
        if let Err(e) = self.settle().await {
            return (Err(e), buf);
        }
        let deadline = Deadline::after(self.chan.clock(), self.chan.timeout());
        // From here on the future holds no buffer: dropping it leaves the buffer here.
        let slot = self.inflight.insert(InFlight {
            buf,
            ticket: None,
            deadline,
        });
        match post(&mut self.chan, &mut slot.buf) {
            Ok(t) => slot.ticket = Some(t),
            Err(e) => {
                // A refused post leaves nothing in flight (the channel drains a post the
                // device took in part before it returns the error).
                let f = self.inflight.take().expect("the slot was just filled");
                return (Err(e), f.buf);
            }
        }
        let r = poll_fn(|cx| self.poll_inflight(cx)).await;
        let f = self.inflight.take().expect("in flight until now");
        (r.map_err(AsyncError::Channel), f.buf)
    }

    /// [`run`](Self::run) for an operation whose completion says only that it is done.
    async fn run_unit(
        &mut self,
        buf: M,
        post: impl FnOnce(&mut Channel<P, B, R>, &mut M) -> Result<Ticket, AsyncError>,
    ) -> (Result<(), AsyncError>, M) {
        let (r, buf) = self.run(buf, post).await;
        (r.map(drop), buf)
    }

    /// [`run`](Self::run) for an atomic: `post` names the 8 bytes at `offset` of `buf`, into
    /// which the device writes the remote word's previous value; that value is the result.
    async fn run_atomic(
        &mut self,
        buf: M,
        offset: usize,
        post: impl FnOnce(&mut Channel<P, B, R>, &mut SgeMut<'_>) -> Result<Ticket, ChannelError>,
    ) -> (Result<u64, AsyncError>, M) {
        let range = offset..offset.saturating_add(8);
        let (r, buf) = self
            .run(buf, |chan, buf| {
                let mut sge = entry_mut(buf, &range)?;
                post(chan, &mut sge).map_err(AsyncError::Channel)
            })
            .await;
        let r = r.and_then(|_| {
            buf.load_u64(offset)
                .ok_or(AsyncError::Misaligned { offset })
        });
        (r, buf)
    }

    /// Sends `buf[range]` to the peer's next receive. Does not allocate.
    pub async fn send(&mut self, buf: M, range: Range<usize>) -> (Result<(), AsyncError>, M) {
        self.run_unit(buf, |chan, buf| {
            let sge = [entry(buf, &range)?];
            // SAFETY: the buffer lives in `self.inflight` until this ticket completed
            // or the channel drained (see `run`, `settle_blocking`); nothing else
            // reaches it meanwhile, and a `Region` leaked keeps its memory.
            unsafe { chan.post_send(&sge) }.map_err(AsyncError::Channel)
        })
        .await
    }

    /// Writes `buf[range]` to `remote`. Does not allocate.
    pub async fn write(
        &mut self,
        buf: M,
        range: Range<usize>,
        remote: RemoteMemory,
    ) -> (Result<(), AsyncError>, M) {
        self.run_unit(buf, |chan, buf| {
            let sge = [entry(buf, &range)?];
            // SAFETY: as in `send`.
            unsafe { chan.post_write(&sge, remote) }.map_err(AsyncError::Channel)
        })
        .await
    }

    /// Reads `remote` into `buf[range]` (the region needs local write). Does not allocate.
    pub async fn read(
        &mut self,
        buf: M,
        range: Range<usize>,
        remote: RemoteMemory,
    ) -> (Result<(), AsyncError>, M) {
        self.run_unit(buf, |chan, buf| {
            let mut sge = [entry_mut(buf, &range)?];
            // SAFETY: as in `send`; the device writes the buffer, which nobody reads
            // until the result hands it back.
            unsafe { chan.post_read(&mut sge, remote) }.map_err(AsyncError::Channel)
        })
        .await
    }

    /// Receives the peer's next message into `buf[range]`. Does not allocate.
    ///
    /// A receive cannot be taken back from the device: if this future is dropped after it
    /// posted, the receive stays posted with the buffer, and the next operation waits for a
    /// message to land in it (or for the channel's timeout, which breaks the channel). For
    /// receives that are cheap to abandon, keep them posted in a ring
    /// ([`AsyncRing`](crate::AsyncRing)).
    pub async fn recv(&mut self, buf: M, range: Range<usize>) -> (Result<Done, AsyncError>, M) {
        self.run(buf, |chan, buf| {
            let mut sge = [entry_mut(buf, &range)?];
            // SAFETY: as in `read`.
            unsafe { chan.post_recv(&mut sge) }.map_err(AsyncError::Channel)
        })
        .await
    }

    /// Adds `add` to the 8-byte word at `remote`; returns the word's previous value, which
    /// the device writes into `buf[offset..offset + 8]`. Does not allocate.
    pub async fn fetch_add(
        &mut self,
        buf: M,
        offset: usize,
        remote: RemoteMemory,
        add: u64,
    ) -> (Result<u64, AsyncError>, M) {
        self.run_atomic(buf, offset, |chan, sge| {
            // SAFETY: as in `read`.
            unsafe { chan.post_fetch_add(sge, remote, add) }
        })
        .await
    }

    /// Compares the 8-byte word at `remote` with `compare` and, if equal, writes `swap`;
    /// returns the previous value (written into `buf[offset..offset + 8]`). Does not
    /// allocate.
    pub async fn compare_swap(
        &mut self,
        buf: M,
        offset: usize,
        remote: RemoteMemory,
        compare: u64,
        swap: u64,
    ) -> (Result<u64, AsyncError>, M) {
        self.run_atomic(buf, offset, |chan, sge| {
            // SAFETY: as in `read`.
            unsafe { chan.post_compare_swap(sge, remote, compare, swap) }
        })
        .await
    }
}

impl<P: Provider, M: Region, E: Events, B: Backoff, const R: usize> Drop
    for AsyncChannel<P, M, E, B, R>
{
    fn drop(&mut self) {
        // An orphan's buffer goes only after the device is done with it.
        self.settle_blocking();
    }
}

fn entry<'a, M: Region>(
    buf: &'a M,
    range: &Range<usize>,
) -> Result<rverbs_core::sge::Sge<'a>, AsyncError> {
    buf.sge(range.clone()).ok_or(AsyncError::OutOfBounds {
        start: range.start,
        end: range.end,
        len: buf.len(),
    })
}

fn entry_mut<'a, M: Region>(
    buf: &'a mut M,
    range: &Range<usize>,
) -> Result<rverbs_core::sge::SgeMut<'a>, AsyncError> {
    let len = buf.len();
    if !buf
        .access()
        .contains(rverbs_core::memory::AccessFlags::LOCAL_WRITE)
    {
        return Err(AsyncError::NoLocalWrite);
    }
    buf.sge_mut(range.clone()).ok_or(AsyncError::OutOfBounds {
        start: range.start,
        end: range.end,
        len,
    })
}
