//! [`AsyncDatagram`]: a datagram endpoint (unicast and multicast) whose receive is a future.

use core::fmt;
use core::future::poll_fn;
use core::task::Poll;

use rverbs_core::datagram::{Datagram, DatagramError, Received};
use rverbs_core::memory::Region;
use rverbs_core::poll::{Backoff, Deadline, Spin};
use rverbs_core::provider::datagram::DatagramProvider;

use crate::events::Events;

/// A [`Datagram`] endpoint whose receive waits are futures: a multicast subscriber (or any
/// UD receiver) in a task that sleeps until a datagram arrives.
///
/// # Cancellation
/// The endpoint owns its receive memory and keeps every receive slot posted; a datagram is
/// lent to the caller only inside the closure given to [`recv_with`](Self::recv_with),
/// after its receive completed, and its slot goes back to the device at the next receive.
/// So a receive future holds nothing the device writes: dropped or forgotten at any await
/// point it frees nothing and loses nothing (a datagram that arrived meanwhile waits in its
/// slot for the next receive). The caller never reaches a slot the device may still
/// write. A task aborted, or a runtime shut down, with the endpoint inside drops the
/// endpoint, which flushes and drains its queue pair before its memory goes (see
/// [`Datagram`]'s "Memory and soundness").
///
/// # Waiting
/// Every wait is bounded: by the endpoint's timeout ([`Datagram::timeout`]) from the call,
/// or the deadline given, on the endpoint's clock; then [`DatagramError::TimedOut`], after
/// which the endpoint is intact. Between polls the task sleeps on `events`:
/// [`TokioEvents`](crate::TokioEvents) over the queue pair's completion events
/// (`VerbsDatagram::with_events`, then `endpoint.provider().wakeup_source()`), or
/// [`YieldEvents`](crate::YieldEvents) on the model.
///
/// # Allocation
/// A receive allocates nothing (the future is a state machine in the task; the datagram is
/// borrowed from the endpoint's slot).
pub struct AsyncDatagram<P, M, E, B = Spin, const N: usize = 64>
where
    P: DatagramProvider,
    M: Region,
    E: Events,
    B: Backoff,
{
    ep: Datagram<P, M, B, N>,
    events: E,
}

impl<P, M, E, B, const N: usize> fmt::Debug for AsyncDatagram<P, M, E, B, N>
where
    P: DatagramProvider,
    M: Region,
    E: Events,
    B: Backoff,
{
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("AsyncDatagram")
            .field("qpn", &self.ep.endpoint().qpn)
            .field("stats", &self.ep.stats())
            .finish_non_exhaustive()
    }
}

impl<P, M, E, B, const N: usize> AsyncDatagram<P, M, E, B, N>
where
    P: DatagramProvider,
    M: Region,
    E: Events,
    B: Backoff,
{
    /// Wraps an endpoint; `events` wakes its waits.
    pub fn new(ep: Datagram<P, M, B, N>, events: E) -> Self {
        Self { ep, events }
    }

    /// The endpoint, for everything that does not wait for a datagram: joining and leaving
    /// groups, sending (a send copies its payload before it returns, so nothing is lent),
    /// counters. Handing it out mutably is sound: the endpoint keeps its memory and its
    /// queue pair together, and nothing of this wrapper's is in flight between receives.
    pub fn datagram(&mut self) -> &mut Datagram<P, M, B, N> {
        &mut self.ep
    }

    /// The endpoint, unwrapped.
    pub fn into_inner(self) -> Datagram<P, M, B, N> {
        self.ep
    }

    /// Waits for the next datagram, at most the endpoint's timeout, and hands it to `f`
    /// (the payload borrows the endpoint's receive slot, which goes back to the device at
    /// the next receive). Does not allocate.
    pub async fn recv_with<T>(
        &mut self,
        f: impl FnOnce(Received<'_>) -> T,
    ) -> Result<T, DatagramError> {
        let clock = self.ep.clock();
        let deadline = Deadline::after(clock, self.ep.timeout());
        self.recv_until_with(deadline, f).await
    }

    /// Like [`recv_with`](Self::recv_with), waiting until `deadline` on the endpoint's
    /// clock. Does not allocate.
    pub async fn recv_until_with<T>(
        &mut self,
        deadline: Deadline,
        f: impl FnOnce(Received<'_>) -> T,
    ) -> Result<T, DatagramError> {
        let clock = self.ep.clock();
        let started = clock.now();
        let mut f = Some(f);
        poll_fn(|cx| loop {
            // Re-posts the previous datagram's slot, then polls once.
            match self.ep.try_recv() {
                Some(Ok(d)) => {
                    let f = f.take().expect("a finished receive is not polled again");
                    return Poll::Ready(Ok(f(d)));
                }
                Some(Err(e)) => return Poll::Ready(Err(e)),
                None => {}
            }
            // Checked on every turn, whatever the events said: a wait never outlives its
            // deadline, even if completions keep waking it for datagrams it throws away.
            if deadline.passed(clock) {
                return Poll::Ready(Err(DatagramError::TimedOut {
                    waited: clock.now().saturating_duration_since(started),
                }));
            }
            match self.events.poll_events(cx, deadline, clock) {
                Poll::Ready(()) => continue,
                Poll::Pending => return Poll::Pending,
            }
        })
        .await
    }
}
