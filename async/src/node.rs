//! [`AsyncNode`]: a node's barriers and messages, awaited.

use core::fmt;
use core::future::poll_fn;
use core::task::Poll;
use core::time::Duration;
use rverbs_core::node::Members;

use rverbs_core::barrier::BarrierError;
use rverbs_core::memory::Region;
use rverbs_core::node::{Event, Node, NodeError};
use rverbs_core::poll::{Backoff, Deadline};
use rverbs_core::provider::Provider;

use crate::events::Events;

/// A [`Node`] whose barrier and message waits are futures. Nothing the node's operations
/// touch belongs to the caller (barrier flags and message rings live in memory the node
/// owns), so a future dropped or forgotten at any point leaves the node sound; what it
/// leaves is a barrier in progress, which the next [`barrier`](Self::barrier) resumes
/// instead of starting another.
///
/// A barrier sleeps on the events only once the node's barrier notifications raise
/// completions at their receivers (`Components::barrier_wakeups`, live after the first
/// barrier over the whole world: [`Node::barrier_wakeups_live`]); before that, and on a node
/// without wake-ups, it re-polls on every turn, because a plain write wakes nobody.
///
/// Waking: `events` wakes the task, as for [`AsyncChannel`](crate::AsyncChannel)
/// ([`TokioEvents::new`](crate::TokioEvents::new) with the node's
/// `Node::wakeup_source_shared()`); every wait is bounded by its timeout on `clock`.
pub struct AsyncNode<P: Provider, M: Region, B: Backoff + Clone, E: Events> {
    node: Node<P, M, B>,
    events: E,
    /// The deadline of a barrier whose future was dropped before it completed.
    open_barrier: Option<Deadline>,
}

impl<P: Provider, M: Region, B: Backoff + Clone, E: Events> fmt::Debug for AsyncNode<P, M, B, E> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("AsyncNode")
            .field("rank", &self.node.rank())
            .field("open_barrier", &self.open_barrier.is_some())
            .finish_non_exhaustive()
    }
}

impl<P: Provider, M: Region, B: Backoff + Clone, E: Events> AsyncNode<P, M, B, E> {
    /// Wraps a connected node; `events` wakes its waits.
    pub fn new(node: Node<P, M, B>, events: E) -> Self {
        Self {
            node,
            events,
            open_barrier: None,
        }
    }

    /// The node, for everything that does not wait (writes, `post_send_inline`, failure
    /// news). Starting a barrier on it directly while one of this wrapper's is open is
    /// refused by the node.
    pub fn node(&mut self) -> &mut Node<P, M, B> {
        &mut self.node
    }

    /// Whether a barrier whose future was dropped is still open (the next
    /// [`barrier`](Self::barrier) resumes it).
    pub fn has_open_barrier(&self) -> bool {
        self.open_barrier.is_some()
    }

    /// Barrier over all ranks with the node's algorithm, at most the node's
    /// [timeout](Node::timeout) (then the node's timeout error, naming the missing ranks,
    /// after its probe grace). Resumes a barrier whose future was dropped, with that
    /// barrier's deadline. Does not allocate.
    pub async fn barrier(&mut self) -> Result<(), NodeError> {
        let timeout = self.node.timeout();
        self.barrier_timeout(timeout).await
    }

    /// [`AsyncNode::barrier`], giving up after `timeout`.
    pub async fn barrier_timeout(&mut self, timeout: Duration) -> Result<(), NodeError> {
        let clock = self.node.clock();
        let deadline = match self.open_barrier {
            Some(d) => d,
            None => {
                self.node.barrier_start_timeout(Members::World, timeout)?;
                let d = Deadline::after(clock, timeout);
                self.open_barrier = Some(d);
                d
            }
        };
        // Sleeping on completion events is right only once notifications raise completions
        // at their receivers (wake-ups on, and live: the first barrier over the whole world
        // after enabling them still uses plain writes, which wake nobody). Until then the
        // wait re-polls on every turn.
        let events_wake = self.node.barrier_wakeups_live();
        let grace = self.node.probe_grace();
        // A member's refusal of a notification, and until when news that explains it is
        // awaited (as the node's blocking barrier does: see `NodeError::is_refusal`).
        let mut refused: Option<(NodeError, Deadline)> = None;
        let r = poll_fn(|cx| loop {
            if let Some((_, until)) = &refused {
                // News of any rank is about a member: this barrier is over the whole world.
                if let Some(f) = self.node.failure() {
                    return Poll::Ready(Err(NodeError::Barrier(BarrierError::PeerFailed(f))));
                }
                if until.passed(clock) {
                    if let Some((e, _)) = refused.take() {
                        return Poll::Ready(Err(e));
                    }
                }
                // A peer's notice raises no completion: look again on the next turn.
                cx.waker().wake_by_ref();
                return Poll::Pending;
            }
            match self.node.barrier_poll() {
                Ok(true) => return Poll::Ready(Ok(())),
                Err(e) if e.is_refusal() => {
                    // The barrier is over (failed, the node poisoned): a future dropped
                    // while it waits for news must not leave it to be resumed, or the
                    // resumed poll would find nothing pending and answer done.
                    self.open_barrier = None;
                    refused = Some((e, Deadline::after(clock, grace)));
                    continue;
                }
                Err(e) => return Poll::Ready(Err(e)),
                Ok(false) => {}
            }
            // Past the deadline the node probes for up to its grace before it reports the
            // timeout. The events are for waits before the deadline (after it a timer-driven
            // one answers `Ready` at once, every time): looping on them would spin through
            // the whole grace inside this one `poll`, holding the executor's thread. So
            // yield and look again on the next turn, as without wake-ups.
            if !events_wake || deadline.passed(clock) {
                cx.waker().wake_by_ref();
                return Poll::Pending;
            }
            match self.events.poll_events(cx, deadline, clock) {
                Poll::Ready(()) => continue,
                Poll::Pending => return Poll::Pending,
            }
        })
        .await;
        self.open_barrier = None;
        r
    }

    /// Waits until the node delivered at least one event (messages, writes with immediate)
    /// to `handler`, at most the node's [timeout](Node::timeout), handling up to `budget` per
    /// poll; returns how many it handled (0: the timeout passed with none). Failure news
    /// ends it, as it ends [`Node::progress_wait`]: [`NodeError::PeerFailed`], naming the
    /// rank, looked for on every turn (news a peer writes raises no completion, so with
    /// events that sleep it is seen at the next wake-up, at the latest at the deadline). A
    /// dropped future loses no message: what was not handed to `handler` stays in the node.
    /// Does not allocate.
    pub async fn progress(
        &mut self,
        budget: usize,
        handler: impl FnMut(Event<'_>),
    ) -> Result<usize, NodeError> {
        let timeout = self.node.timeout();
        self.progress_timeout(timeout, budget, handler).await
    }

    /// [`AsyncNode::progress`], waiting at most `timeout`.
    pub async fn progress_timeout(
        &mut self,
        timeout: Duration,
        budget: usize,
        mut handler: impl FnMut(Event<'_>),
    ) -> Result<usize, NodeError> {
        let clock = self.node.clock();
        let deadline = Deadline::after(clock, timeout);
        poll_fn(|cx| loop {
            // News first, every turn, as the blocking wait does: a dead peer must not turn
            // into "no message" at the deadline, and a live one's traffic must not hide it.
            if let Some(f) = self.node.failure() {
                return Poll::Ready(Err(NodeError::PeerFailed(f)));
            }
            match self.node.progress(budget, &mut handler) {
                Ok(0) => {}
                r => return Poll::Ready(r),
            }
            if deadline.passed(clock) {
                return Poll::Ready(Ok(0));
            }
            match self.events.poll_events(cx, deadline, clock) {
                Poll::Ready(()) => continue,
                Poll::Pending => return Poll::Pending,
            }
        })
        .await
    }
}
