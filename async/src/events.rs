//! How a waiting future learns that polling the channel again is worth it: the one seam
//! between the futures and a runtime.

use core::task::{Context, Poll};

use rverbs_core::poll::{Clock, Deadline};

/// Wakes a future waiting on a channel: when a completion may have arrived, or its deadline
/// passed.
///
/// A wait calls [`poll_events`](Self::poll_events) after a poll of the channel found nothing
/// and the deadline had not passed. `Ready(())` means "poll the channel again now" (for
/// example: queues were just armed, so a completion that arrived before the arm raised no
/// event and must be looked for); `Pending` means the waker of `cx` is registered and will
/// be woken when a completion event arrives or at `deadline`, whichever comes first.
/// Returning `Ready` too often costs CPU, never correctness; never waking costs the bound,
/// so implementations wake by the deadline at the latest.
pub trait Events {
    /// See the [trait docs](Self).
    fn poll_events(
        &mut self,
        cx: &mut Context<'_>,
        deadline: Deadline,
        clock: &(dyn Clock + Sync),
    ) -> Poll<()>;
}

/// Runtime-neutral events without a descriptor: every wait wakes itself at once, so the
/// executor polls the channel on each turn (a cooperative busy-poll). What the software
/// model uses (host tests, Miri), and a fallback for queues without a completion channel.
#[derive(Clone, Copy, Debug, Default)]
pub struct YieldEvents;

impl Events for YieldEvents {
    #[inline]
    fn poll_events(
        &mut self,
        cx: &mut Context<'_>,
        _deadline: Deadline,
        _clock: &(dyn Clock + Sync),
    ) -> Poll<()> {
        cx.waker().wake_by_ref();
        Poll::Pending
    }
}

impl<E: Events + ?Sized> Events for &mut E {
    #[inline]
    fn poll_events(
        &mut self,
        cx: &mut Context<'_>,
        deadline: Deadline,
        clock: &(dyn Clock + Sync),
    ) -> Poll<()> {
        (**self).poll_events(cx, deadline, clock)
    }
}

#[cfg(feature = "tokio")]
pub use self::tokio_events::TokioEvents;

#[cfg(feature = "tokio")]
mod tokio_events {
    use super::*;
    use core::fmt;
    use core::pin::Pin;
    use core::time::Duration;
    use std::os::fd::{AsRawFd, RawFd};
    use std::sync::Arc;

    use rverbs_core::poll::Wakeup;
    use tokio::io::unix::AsyncFd;
    use tokio::io::Interest;
    use tokio::time::Sleep;

    /// The completion channel's descriptor, borrowed from the `Wakeup` that keeps it open.
    struct EventFd(Arc<dyn Wakeup>);

    impl AsRawFd for EventFd {
        fn as_raw_fd(&self) -> RawFd {
            // `Wakeup` is an unsafe trait whose implementors keep `fd` open and unchanged while
            // the value lives; this value holds it.
            self.0.fd()
        }
    }

    /// Events from a completion channel, through tokio's reactor: the task sleeps until the
    /// channel's descriptor is readable (a completion on an armed queue) or the wait's
    /// deadline, on a tokio timer. Arming follows the blocking back-off's protocol (arm, poll
    /// once more, sleep; take and acknowledge events after waking), so no wake-up is lost.
    ///
    /// Made once per channel or node, inside a tokio runtime with IO and time enabled
    /// (`AsyncFd` registers the descriptor, which is non-blocking already); every wait after
    /// that reuses the registration and the timer, so a wait allocates nothing.
    pub struct TokioEvents {
        wakeup: Arc<dyn Wakeup>,
        fd: AsyncFd<EventFd>,
        sleep: Pin<Box<Sleep>>,
        /// The deadline the timer is set to (resetting it is cheap but not free).
        timer_at: Option<Deadline>,
    }

    impl fmt::Debug for TokioEvents {
        fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.debug_struct("TokioEvents")
                .field("fd", &self.wakeup.fd())
                .finish_non_exhaustive()
        }
    }

    impl TokioEvents {
        /// Registers `wakeup`'s descriptor with the current tokio runtime's reactor
        /// (`Node::wakeup_source()`, or a `CqEvents` of your own queues). Must be
        /// called inside a runtime with IO and time enabled.
        pub fn new(wakeup: Arc<dyn Wakeup>) -> std::io::Result<Self> {
            // SAFETY: `Wakeup` is an unsafe trait whose implementors keep `fd()` open and
            // the same for as long as the value lives; `EventFd` holds the value (an `Arc`)
            // for the `AsyncFd`'s whole life, and always returns that descriptor.
            let fd = unsafe {
                AsyncFd::register_with_interest(EventFd(wakeup.clone()), Interest::READABLE)
            }
            .map_err(std::io::Error::from)?;
            Ok(Self {
                wakeup,
                fd,
                sleep: Box::pin(tokio::time::sleep(Duration::ZERO)),
                timer_at: None,
            })
        }
    }

    impl Events for TokioEvents {
        fn poll_events(
            &mut self,
            cx: &mut Context<'_>,
            deadline: Deadline,
            clock: &(dyn Clock + Sync),
        ) -> Poll<()> {
            // An error arming counts as a wake-up: the wait polls, which reports a broken
            // queue, and checks its deadline.
            match self.wakeup.arm() {
                Ok(false) => {}
                Ok(true) | Err(_) => return Poll::Ready(()),
            }
            match self.fd.poll_read_ready(cx) {
                Poll::Ready(Ok(mut guard)) => {
                    // Acknowledges the events (destroying a queue waits for that) and disarms
                    // the queues that fired; the wait polls next.
                    let _ = self.wakeup.take_events();
                    guard.clear_ready();
                    return Poll::Ready(());
                }
                Poll::Ready(Err(_)) => return Poll::Ready(()),
                Poll::Pending => {}
            }
            if self.timer_at != Some(deadline) {
                let left = deadline.remaining(clock);
                let at = tokio::time::Instant::now()
                    .checked_add(left)
                    .unwrap_or_else(|| tokio::time::Instant::now() + Duration::from_secs(86_400));
                self.sleep.as_mut().reset(at);
                self.timer_at = Some(deadline);
            }
            if self.sleep.as_mut().poll(cx).is_ready() {
                // The deadline passed with no event: if one was ever lost, a queue that
                // believes itself armed would never fire again, so arm everything anew.
                self.wakeup.forget_armed();
                self.timer_at = None;
                return Poll::Ready(());
            }
            Poll::Pending
        }
    }

    use core::future::Future;
}
