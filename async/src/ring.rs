//! [`AsyncRing`]: receives kept posted in a ring, awaited.

use core::fmt;
use core::future::poll_fn;
use core::task::Poll;

use rverbs_core::channel::{Channel, RecvRing, RingMessage};
use rverbs_core::memory::Region;
use rverbs_core::poll::{Backoff, Deadline, Spin};
use rverbs_core::provider::Provider;

use crate::error::AsyncError;
use crate::events::Events;

/// A [`RecvRing`] whose receive is a future. The ring owns its memory and keeps its receives
/// posted, so a receive future holds nothing the device writes: dropping or forgetting it at
/// any point loses no message and frees nothing (the next receive finds the message in the
/// ring). The cheapest receive to abandon, for `select!` and `timeout`.
pub struct AsyncRing<P: Provider, M: Region, E: Events, B: Backoff = Spin, const R: usize = 64> {
    ring: RecvRing<P, M, B, R>,
    events: E,
}

impl<P: Provider, M: Region, E: Events, B: Backoff, const R: usize> fmt::Debug
    for AsyncRing<P, M, E, B, R>
{
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("AsyncRing")
            .field("ring", &self.ring)
            .finish_non_exhaustive()
    }
}

impl<P: Provider, M: Region, E: Events, B: Backoff, const R: usize> AsyncRing<P, M, E, B, R> {
    /// Wraps a ring; `events` wakes its waits.
    pub fn new(ring: RecvRing<P, M, B, R>, events: E) -> Self {
        Self { ring, events }
    }

    /// The channel, to send and write with its blocking calls (see [`RecvRing::channel`]).
    pub fn channel(&mut self) -> &mut Channel<P, B, R> {
        self.ring.channel()
    }

    /// The ring.
    pub fn ring(&mut self) -> &mut RecvRing<P, M, B, R> {
        &mut self.ring
    }

    /// Sends `data` (copied into the request at post time, so nothing is borrowed past the
    /// post) and waits for its completion, at most the channel's timeout. Dropping the future
    /// after the post leaves nothing behind but the send itself. Does not allocate.
    pub async fn send_inline(&mut self, data: &[u8]) -> Result<(), AsyncError> {
        let chan = self.ring.channel();
        let (clock, timeout) = (chan.clock(), chan.timeout());
        let deadline = Deadline::after(clock, timeout);
        let ticket = chan.post_send_inline(data)?;
        poll_fn(|cx| loop {
            let chan = self.ring.channel();
            if let Some(r) = chan.try_wait(ticket) {
                return Poll::Ready(r.map(drop).map_err(AsyncError::Channel));
            }
            if deadline.passed(clock) {
                let r = chan.wait_until(ticket, deadline);
                return Poll::Ready(r.map(drop).map_err(AsyncError::Channel));
            }
            match self.events.poll_events(cx, deadline, clock) {
                Poll::Ready(()) => continue,
                Poll::Pending => return Poll::Pending,
            }
        })
        .await
    }

    /// Waits for the next message, at most the channel's timeout, and hands it to `f` (the
    /// message borrows the ring's slot, which goes back to the device at the next receive).
    /// Does not allocate.
    pub async fn recv_with<T>(
        &mut self,
        f: impl FnOnce(RingMessage<'_>) -> T,
    ) -> Result<T, AsyncError> {
        let (clock, timeout) = {
            let c = self.ring.channel();
            (c.clock(), c.timeout())
        };
        let deadline = Deadline::after(clock, timeout);
        let mut f = Some(f);
        poll_fn(|cx| loop {
            match self.ring.try_recv() {
                Some(Ok(msg)) => {
                    let f = f.take().expect("a finished receive is not polled again");
                    return Poll::Ready(Ok(f(msg)));
                }
                Some(Err(e)) => return Poll::Ready(Err(AsyncError::Channel(e))),
                None => {}
            }
            if deadline.passed(clock) {
                // Times out and breaks the ring's channel (flushed and drained), or finds the
                // message after all.
                let r = match self.ring.recv_until(deadline) {
                    Ok(msg) => Ok(f.take().expect("a finished receive is not polled again")(
                        msg,
                    )),
                    Err(e) => Err(AsyncError::Channel(e)),
                };
                return Poll::Ready(r);
            }
            match self.events.poll_events(cx, deadline, clock) {
                Poll::Ready(()) => continue,
                Poll::Pending => return Poll::Pending,
            }
        })
        .await
    }
}
