//! AsyncNode on the software model (host, and under Miri in tools/test-all): a barrier loop
//! of four ranks awaited in one task, a barrier future dropped mid-way and resumed, and node
//! messages awaited (none lost to a dropped wait).
#![allow(clippy::std_instead_of_core)]

use std::future::Future;
use std::task::{Context, Waker};
use std::time::Duration;

use rverbs_async::{AsyncNode, Events, YieldEvents};
use rverbs_core::memory::{AccessFlags, Region};
use rverbs_core::model::{SoftNet, SoftNetConfig};
use rverbs_core::node::{soft_world_bytes, Event, Receive};
use rverbs_core::poll::{Backoff, StaticClock, StepClock};
use rverbs_core::provider::Provider;
use rverbs_testkit::{block_on, CAPS};

static CLOCK: StepClock = StepClock::new(Duration::from_micros(1));
const TIMEOUT: Duration = Duration::from_secs(60);
const SLOT: usize = 32;
const SLOTS: usize = 4;

/// One barrier of all four ranks, their futures joined in one task; each rank's barrier
/// must pass (a failure names the rank).
fn barrier_of_four<P: Provider, M: Region, B: Backoff + Clone, E: Events>(
    [n0, n1, n2, n3]: [&mut AsyncNode<P, M, B, E>; 4],
) {
    let (a, b, c, d) = block_on(async {
        tokio::join!(
            n0.barrier_timeout(TIMEOUT),
            n1.barrier_timeout(TIMEOUT),
            n2.barrier_timeout(TIMEOUT),
            n3.barrier_timeout(TIMEOUT)
        )
    });
    for (rank, answer) in [a, b, c, d].into_iter().enumerate() {
        answer.unwrap_or_else(|e| panic!("rank {rank}'s barrier: {e}"));
    }
}

#[test]
fn barriers_and_messages_awaited_with_cancellation() {
    let clock: StaticClock = &CLOCK;
    let net = SoftNet::new(SoftNetConfig::new(4, CAPS));
    let mut arena = vec![0u8; soft_world_bytes(4, 64)];
    let mut mem = vec![0u8; 4 * 3 * SLOTS * SLOT];
    let mut nodes = rverbs_testkit::nodes(&net, &mut arena, Receive::PerPeer, clock);
    for (n, m) in nodes.iter_mut().zip(mem.chunks_mut(3 * SLOTS * SLOT)) {
        let region = net.register(n.rank(), m, AccessFlags::LOCAL_WRITE).unwrap();
        n.start_messaging_in(region, SLOTS, SLOT).unwrap();
    }
    let mut it = nodes.into_iter().map(|n| AsyncNode::new(n, YieldEvents));
    let (mut n0, mut n1, mut n2, mut n3) = (
        it.next().unwrap(),
        it.next().unwrap(),
        it.next().unwrap(),
        it.next().unwrap(),
    );
    let rounds = if cfg!(miri) { 3 } else { 50 };
    for _ in 0..rounds {
        barrier_of_four([&mut n0, &mut n1, &mut n2, &mut n3]);
    }

    // Rank 0 enters a barrier and its future is dropped before the others arrive.
    {
        let mut fut = Box::pin(n0.barrier_timeout(TIMEOUT));
        let mut cx = Context::from_waker(Waker::noop());
        assert!(fut.as_mut().poll(&mut cx).is_pending());
    }
    assert!(n0.has_open_barrier());
    // The next call resumes that barrier (it does not start a second one).
    barrier_of_four([&mut n0, &mut n1, &mut n2, &mut n3]);
    assert!(!n0.has_open_barrier());

    // Messages: a wait dropped before anything arrived loses nothing.
    {
        let mut fut = Box::pin(n1.progress_timeout(TIMEOUT, 8, |_| panic!("nothing sent yet")));
        let mut cx = Context::from_waker(Waker::noop());
        assert!(fut.as_mut().poll(&mut cx).is_pending());
    }
    n0.node().post_send_inline(1, b"async hello").unwrap();
    let mut got = Vec::new();
    let n = block_on(n1.progress_timeout(TIMEOUT, 8, |ev| {
        if let Event::Message { rank, data } = ev {
            got.push((rank, data.to_vec()));
        }
    }))
    .unwrap();
    assert!(n >= 1);
    assert_eq!(got, [(0, b"async hello".to_vec())]);
    // No message more (the wait ends at its timeout): the dropped wait took nothing.
    let mut more = 0;
    for _ in 0..3 {
        block_on(n1.progress_timeout(Duration::from_micros(300), 8, |ev| {
            if matches!(ev, Event::Message { .. }) {
                more += 1;
            }
        }))
        .unwrap();
    }
    assert_eq!(more, 0);
}

/// A member refuses the async barrier's notification (the model's "registrations gone,
/// queue pairs alive" moment of a dying process): the barrier waits for news that explains
/// it, as the node's blocking barrier does, and names it when another thread raises it;
/// a future dropped during that wait leaves no barrier to resume, and the next barrier
/// reports the poisoned state, never success.
#[test]
#[cfg_attr(
    miri,
    ignore = "a second thread raises the alarm after a real-time pause"
)]
fn a_refused_notification_is_explained_by_news_and_a_dropped_wait_resumes_nothing() {
    use rverbs_core::barrier::{BarrierAlgorithm, BarrierError};
    use rverbs_core::failure::{Failure, FailureCause};
    use rverbs_core::node::{Members, NodeError};

    let clock: StaticClock = &CLOCK;
    for drop_mid_wait in [false, true] {
        let net = SoftNet::new(SoftNetConfig::new(3, CAPS));
        let mut arena = vec![0u8; soft_world_bytes(3, 64)];
        let mut nodes =
            rverbs_testkit::nodes(&net, &mut arena, BarrierAlgorithm::Dissemination, clock);
        let all = rverbs_testkit::barrier_answers(&mut nodes, Duration::from_secs(1));
        assert!(all.iter().all(|(_, a)| a.is_ok()), "{all:?}");
        // Dissemination over 3: rank 1 notifies rank 2 first; rank 0 never writes to it.
        let dying = 2;
        net.release_regions(dying);
        let mut it = nodes.into_iter();
        let mut n0 = it.next().unwrap();
        let mut n1 = it.next().unwrap();
        n0.barrier_start_timeout(Members::World, TIMEOUT).unwrap();
        n1.set_probe_grace(Duration::from_secs(3600));
        let news = Failure {
            rank: dying,
            cause: FailureCause::SessionClosed,
            reporter: 1,
        };
        let mut a1 = AsyncNode::new(n1, YieldEvents);
        if drop_mid_wait {
            {
                let mut fut = Box::pin(a1.barrier_timeout(TIMEOUT));
                let mut cx = Context::from_waker(Waker::noop());
                for _ in 0..1000 {
                    assert!(fut.as_mut().poll(&mut cx).is_pending());
                }
            }
            assert!(!a1.has_open_barrier());
            match block_on(a1.barrier_timeout(TIMEOUT)) {
                Err(NodeError::Barrier(BarrierError::Poisoned)) => {}
                other => panic!("expected the poisoned state, got {other:?}"),
            }
            continue;
        }
        let alarm = a1.node().failure_alarm();
        let watch = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(20));
            assert!(alarm.raise(news));
        });
        let e = block_on(a1.barrier_timeout(TIMEOUT));
        watch.join().unwrap();
        assert_eq!(e, Err(NodeError::Barrier(BarrierError::PeerFailed(news))));
        // Rank 0 hears it from rank 1.
        let e = (0..100_000)
            .find_map(|_| match n0.barrier_poll() {
                Ok(false) => None,
                Ok(true) => panic!("rank 0 completed without rank {dying}"),
                Err(e) => Some(e),
            })
            .expect("rank 0 heard nothing in 100000 polls");
        assert_eq!(e, NodeError::Barrier(BarrierError::PeerFailed(news)));
    }
}

/// A node that knows a peer failed (its alarm raised, as a session watch does) answers an
/// awaited message wait with that failure, naming the rank, as the blocking
/// `Node::progress_wait` does, instead of waiting out its timeout and reporting "no
/// message" (`Ok(0)`), which names nobody.
#[test]
fn an_awaited_message_wait_ends_with_the_failure_news_the_node_has() {
    use rverbs_core::failure::{Failure, FailureCause};
    use rverbs_core::node::NodeError;
    use rverbs_core::poll::Clock;

    // A clock of its own: the other tests' reads of theirs must not count as this wait's.
    static OWN: StepClock = StepClock::new(Duration::from_micros(1));
    let clock: StaticClock = &OWN;
    let net = SoftNet::new(SoftNetConfig::new(3, CAPS));
    let mut arena = vec![0u8; soft_world_bytes(3, 64)];
    let mut mem = vec![0u8; 3 * 2 * SLOTS * SLOT];
    let mut nodes = rverbs_testkit::nodes(&net, &mut arena, Receive::PerPeer, clock);
    for (n, m) in nodes.iter_mut().zip(mem.chunks_mut(2 * SLOTS * SLOT)) {
        let region = net.register(n.rank(), m, AccessFlags::LOCAL_WRITE).unwrap();
        n.start_messaging_in(region, SLOTS, SLOT).unwrap();
    }
    let news = Failure {
        rank: 2,
        cause: FailureCause::SessionClosed,
        reporter: 1,
    };
    let mut n1 = AsyncNode::new(nodes.swap_remove(1), YieldEvents);
    assert!(n1.node().failure_alarm().raise(news));
    // The blocking wait's answer, for comparison.
    assert_eq!(
        n1.node().progress_wait(|_| {}, || false),
        Err(NodeError::PeerFailed(news))
    );
    let start = OWN.now();
    let got = block_on(n1.progress_timeout(Duration::from_millis(50), 8, |_| {}));
    let waited = OWN.now().saturating_duration_since(start);
    assert_eq!(got, Err(NodeError::PeerFailed(news)), "after {waited:?}");
    assert!(waited < Duration::from_millis(50), "waited {waited:?}");
}

/// Events as the trait asks, with a timer at the deadline: until then the waker is
/// registered (here: woken at once, so the test's loop polls again), and once the deadline
/// passed the timer has fired, so `Ready` at once, as `TokioEvents` answers then.
struct TimerEvents;

impl Events for TimerEvents {
    fn poll_events(
        &mut self,
        cx: &mut Context<'_>,
        deadline: rverbs_core::poll::Deadline,
        clock: &(dyn rverbs_core::poll::Clock + Sync),
    ) -> std::task::Poll<()> {
        if deadline.passed(clock) {
            return std::task::Poll::Ready(());
        }
        cx.waker().wake_by_ref();
        std::task::Poll::Pending
    }
}

/// A barrier past its deadline waits out the node's probe grace before it reports the
/// timeout. The events' contract is for waits before the deadline: after it a timer-driven
/// `Events` answers `Ready` at once, every time. The future must still yield to the
/// executor on every turn of the grace, not spin through all of it (2 s by default) inside
/// one `poll`, blocking the executor's thread.
#[test]
fn an_awaited_barrier_yields_during_the_probe_grace_after_its_deadline() {
    use rverbs_core::barrier::BarrierError;
    use rverbs_core::node::{Components, NodeError};
    use rverbs_core::poll::Clock;
    use std::task::Poll;

    // A clock of its own: the other tests' reads of theirs must not count as this poll's.
    // Coarse, so the grace is a few dozen polls (the test runs under Miri too).
    static OWN: StepClock = StepClock::new(Duration::from_micros(100));
    let clock: StaticClock = &OWN;
    let net = SoftNet::new(SoftNetConfig::new(2, CAPS));
    let mut arena = vec![0u8; soft_world_bytes(2, 64)];
    let mut nodes = rverbs_testkit::nodes(&net, &mut arena, Components::barrier_wakeups(), clock);
    // One barrier over the whole world makes the wake-ups live (the barrier then sleeps on
    // the events).
    let all = rverbs_testkit::barrier_answers(&mut nodes, Duration::from_secs(1));
    assert!(all.iter().all(|(_, a)| a.is_ok()), "{all:?}");
    let mut n0 = AsyncNode::new(nodes.swap_remove(0), TimerEvents);
    assert!(n0.node().barrier_wakeups_live());
    let grace = Duration::from_millis(20);
    n0.node().set_probe_grace(grace);
    // Rank 1 never comes.
    let timeout = Duration::from_millis(5);
    let start = OWN.now();
    let mut fut = Box::pin(n0.barrier_timeout(timeout));
    let mut cx = Context::from_waker(Waker::noop());
    let mut polls_after_deadline = 0u32;
    let answer = loop {
        let before = OWN.now().saturating_duration_since(start);
        let r = fut.as_mut().poll(&mut cx);
        let after = OWN.now().saturating_duration_since(start);
        if before >= timeout {
            polls_after_deadline += 1;
        }
        // One poll may take a turn, never the grace.
        assert!(
            after.saturating_sub(before) < grace / 2,
            "one poll took {:?} of the clock ({before:?} -> {after:?}): it spun through the \
             probe grace",
            after.saturating_sub(before)
        );
        if let Poll::Ready(r) = r {
            break r;
        }
        assert!(after < Duration::from_secs(10), "no answer after {after:?}");
    };
    assert!(
        matches!(
            answer,
            Err(NodeError::Barrier(BarrierError::Timeout { .. }))
        ),
        "expected the barrier's timeout, got {answer:?}"
    );
    assert!(
        polls_after_deadline > 1,
        "{polls_after_deadline} polls after the deadline"
    );
}
