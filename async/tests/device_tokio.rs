//! rverbs-async on a real device (the SoftRoCE VM in CI): a tokio ping-pong between two
//! queue pairs whose completion queues sit on completion channels, woken through tokio's
//! reactor; buffers owned by their registrations; no allocation per operation. Barrier
//! loops of three ranks, asleep and polled. Atomics and a receive ring awaited. A multicast
//! subscriber awaiting a publisher's sequenced stream asleep on its endpoint's completion
//! channel, and the same stream busy-polled as the control that tells the two apart.
#![allow(clippy::std_instead_of_core)] // test code: std is the natural vocabulary here

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use rverbs_async::{AsyncChannel, TokioEvents};
use rverbs_core::channel::{Channel, ChannelConfig};
use rverbs_core::provider::verbs::{PreparedVerbs, VerbsProvider};
use rverbs_core::provider::Provider;
use rverbs_core::verbs::{open_device, AccessFlags, Context, OwnedRegion, Pd, QpConfig};
use rverbs_core::wire::Endpoint;
use rverbs_std_shim::MONOTONIC;

#[global_allocator]
static GLOBAL: rverbs_testkit::Counting = rverbs_testkit::Counting;

type Chan = AsyncChannel<VerbsProvider, OwnedRegion, TokioEvents>;

/// The test device, opened for `test`; `None` (after saying so) when the test is to be
/// skipped.
fn open(test: &str) -> Option<Context> {
    let name = rverbs_testkit::test_device(test)?;
    Some(open_device(&name).unwrap_or_else(|e| panic!("open {name}: {e}")))
}

/// The test device ([`open`]), a protection domain, and two queue pairs on it connected to
/// each other (their endpoints passed through the wire encoding) whose queues raise
/// completion events.
fn event_pair(test: &str) -> Option<(Context, Pd, VerbsProvider, VerbsProvider)> {
    let ctx = open(test)?;
    let pd = ctx.alloc_pd().unwrap();
    let qp = QpConfig::default();
    let a = PreparedVerbs::with_events(&ctx, &pd, &qp).unwrap();
    let b = PreparedVerbs::with_events(&ctx, &pd, &qp).unwrap();
    let ea = Endpoint::decode(&a.endpoint().encode()).unwrap();
    let eb = Endpoint::decode(&b.endpoint().encode()).unwrap();
    let (a, b) = (a.handshake(&eb).unwrap(), b.handshake(&ea).unwrap());
    Some((ctx, pd, a, b))
}

/// A channel on `p` whose waits give up after 20 s (far beyond any wake-up).
fn channel(p: VerbsProvider) -> Channel<VerbsProvider> {
    Channel::new(
        p,
        ChannelConfig::with_timeout(Duration::from_secs(20)),
        &MONOTONIC,
    )
}

const ROUNDS: u64 = 1000;
const MSG: usize = 64;

#[test]
fn tokio_ping_pong_sleeps_on_completion_events_and_allocates_nothing_per_operation() {
    let Some((_ctx, pd, a, b)) = event_pair(
        "tokio_ping_pong_sleeps_on_completion_events_and_allocates_nothing_per_operation",
    ) else {
        return;
    };
    let rw = AccessFlags::LOCAL_WRITE;
    let reg = |seed: u8| {
        pd.register_shared(vec![seed; MSG].into_boxed_slice(), rw)
            .unwrap()
    };
    let (abuf, bbuf) = (reg(0), reg(0));

    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_io()
        .enable_time()
        .build()
        .unwrap();
    static ALLOCS_IN_LOOP: AtomicU64 = AtomicU64::new(u64::MAX);
    let t0 = Instant::now();
    let (a, b) = rt.block_on(async move {
        let events = |p: &VerbsProvider| {
            TokioEvents::new(p.wakeup_source().expect("queues on a completion channel")).unwrap()
        };
        let mut a: Chan = {
            let ev = events(&a);
            AsyncChannel::new(channel(a), ev)
        };
        let mut b: Chan = {
            let ev = events(&b);
            AsyncChannel::new(channel(b), ev)
        };
        let (mut abuf, mut bbuf) = (abuf, bbuf);
        let mut before = 0;
        for i in 0..ROUNDS {
            if i == 1 {
                before = rverbs_testkit::allocs(); // after the first round (tokio's timer, once)
            }
            // A pings, B receives; B pongs, A receives. Both sides are futures of this one
            // task: whichever waits sleeps on its completion channel.
            abuf.write_from(0, &i.to_le_bytes());
            // join! polls in order: the receive is posted before the send.
            let ((rb, bb), (ra, ab)) = tokio::join!(b.recv(bbuf, 0..MSG), a.send(abuf, 0..MSG));
            ra.unwrap();
            assert_eq!(rb.unwrap().byte_len, MSG as u32);
            let mut got = [0u8; 8];
            assert!(bb.read_into(0, &mut got));
            assert_eq!(u64::from_le_bytes(got), i, "ping {i}");
            bb.write_from(0, &(i + 1_000_000).to_le_bytes());
            let ((ra, ab), (rb, bb)) = tokio::join!(a.recv(ab, 0..MSG), b.send(bb, 0..MSG));
            rb.unwrap();
            assert_eq!(ra.unwrap().byte_len, MSG as u32);
            assert!(ab.read_into(0, &mut got));
            assert_eq!(u64::from_le_bytes(got), i + 1_000_000, "pong {i}");
            (abuf, bbuf) = (ab, bb);
        }
        ALLOCS_IN_LOOP.store(rverbs_testkit::allocs() - before, Ordering::Relaxed);
        (a, b)
    });
    let took = t0.elapsed();
    let allocs = ALLOCS_IN_LOOP.load(Ordering::Relaxed);
    eprintln!(
        "{ROUNDS} round trips in {took:?} ({:?} each); {allocs} allocations in {} operations \
         after the first round",
        took / ROUNDS as u32,
        (ROUNDS - 1) * 4
    );
    assert_eq!(allocs, 0, "allocations per operation after setup");
    assert!(a.channel().fault().is_none() && b.channel().fault().is_none());
}

/// 100 barriers of three ranks of this process, awaited in one tokio task; `events` makes
/// each rank's waker (given the node's completion events). Returns the slowest barrier.
fn barrier_loop<E: rverbs_async::Events>(
    test: &str,
    events: impl Fn(std::sync::Arc<dyn rverbs_core::poll::Wakeup>) -> E,
) -> Option<Duration> {
    use rverbs_async::AsyncNode;
    use rverbs_core::node::{NodeConfig, PreparedNode};
    use rverbs_core::poll::Spin;

    let ctx = open(test)?;
    const WORLD: u32 = 3;
    const BARRIERS: u32 = 100;
    // Barrier notifications must raise completions, or a rank asleep on its completion
    // channel would not wake when its peer arrives.
    let mut cfg = NodeConfig::default();
    cfg.completion_events = true;
    cfg.components = rverbs_core::node::Components::barrier_wakeups();
    let prepared: Vec<_> = (0..WORLD)
        .map(|r| PreparedNode::new(&ctx, r, WORLD, cfg, Spin, &MONOTONIC).unwrap())
        .collect();
    let blobs: Vec<Vec<u8>> = prepared.iter().map(|p| p.blob()).collect();
    let nodes: Vec<_> = prepared
        .into_iter()
        .map(|p| p.handshake(&blobs).unwrap())
        .collect();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_io()
        .enable_time()
        .build()
        .unwrap();
    let t0 = Instant::now();
    let slowest = rt.block_on(async move {
        let mut it = nodes.into_iter().map(|n| {
            let ev = events(n.wakeup_source_shared().expect("events"));
            AsyncNode::new(n, ev)
        });
        let (mut a, mut b, mut c) = (it.next().unwrap(), it.next().unwrap(), it.next().unwrap());
        let timeout = Duration::from_secs(20);
        let mut slowest = Duration::ZERO;
        for i in 0..BARRIERS {
            let t = Instant::now();
            let (ra, rb, rc) = tokio::join!(
                a.barrier_timeout(timeout),
                b.barrier_timeout(timeout),
                c.barrier_timeout(timeout)
            );
            ra.unwrap_or_else(|e| panic!("barrier {i}, rank 0: {e}"));
            rb.unwrap_or_else(|e| panic!("barrier {i}, rank 1: {e}"));
            rc.unwrap_or_else(|e| panic!("barrier {i}, rank 2: {e}"));
            slowest = slowest.max(t.elapsed());
        }
        slowest
    });
    let took = t0.elapsed();
    eprintln!(
        "{test}: {BARRIERS} barriers of {WORLD} ranks in {took:?} ({:?} each), slowest {slowest:?}",
        took / BARRIERS
    );
    Some(slowest)
}

#[test]
fn a_barrier_loop_of_three_ranks_polled_by_tokio() {
    let Some(slowest) = barrier_loop("a_barrier_loop_of_three_ranks_polled_by_tokio", |_| {
        rverbs_async::YieldEvents
    }) else {
        return;
    };
    assert!(
        slowest < Duration::from_secs(10),
        "slowest barrier {slowest:?}"
    );
}

/// Every rank asleep on its completion channel between polls. The first barrier over the
/// world after enabling wake-ups still notifies with plain writes (see
/// `Components::barrier_wakeups`), which wake nobody: `AsyncNode` re-polls through it, and
/// sleeps on events from the next one. (Sleeping through it was this test's first finding:
/// one barrier per run ended at its 20 s deadline.)
#[test]
fn a_barrier_loop_of_three_ranks_asleep_on_completion_events() {
    let Some(slowest) = barrier_loop(
        "a_barrier_loop_of_three_ranks_asleep_on_completion_events",
        |w| TokioEvents::new(w).unwrap(),
    ) else {
        return;
    };
    // A rank whose wake-up was lost sleeps to its 20 s deadline (and then finds the barrier
    // done): no barrier may come near that.
    assert!(
        slowest < Duration::from_secs(10),
        "slowest barrier {slowest:?}"
    );
}

/// Events that count how often a wait asked them (every poll of a receive that found
/// nothing does) and how often they put the task to sleep.
#[derive(Debug)]
struct Counted<E> {
    inner: E,
    calls: u64,
    sleeps: u64,
}

impl<E: rverbs_async::Events> rverbs_async::Events for Counted<E> {
    fn poll_events(
        &mut self,
        cx: &mut std::task::Context<'_>,
        deadline: rverbs_core::poll::Deadline,
        clock: &(dyn rverbs_core::poll::Clock + Sync),
    ) -> std::task::Poll<()> {
        self.calls += 1;
        let r = self.inner.poll_events(cx, deadline, clock);
        if r.is_pending() {
            self.sleeps += 1;
        }
        r
    }
}

const GROUP: [u8; 4] = [239, 7, 7, 7];
/// The stream: BURSTS bursts of BURST datagrams, PAUSE apart, so the subscriber has
/// nothing to do between bursts and must sleep.
const BURSTS: u64 = 20;
const BURST: u64 = 10;
const PAUSE: Duration = Duration::from_millis(20);
const BODY: usize = 48;
/// How long the last receive waits with nothing coming.
const QUIET: Duration = Duration::from_millis(300);

/// A datagram endpoint on `ctx`, with its queues on a completion channel if `events`.
fn datagram_endpoint(
    ctx: &rverbs_core::verbs::Context,
    events: bool,
) -> rverbs_core::datagram::Datagram<rverbs_core::provider::verbs_ud::VerbsDatagram, OwnedRegion> {
    use rverbs_core::datagram::{memory_needed, Datagram, DatagramConfig};
    use rverbs_core::memory::PageMemory;
    use rverbs_core::provider::datagram::DatagramProvider;
    use rverbs_core::provider::verbs_ud::VerbsDatagram;
    use rverbs_core::verbs::UdConfig;

    let pd = ctx.alloc_pd().unwrap();
    let ud = UdConfig::default(); // 128 receives
    let qp = if events {
        VerbsDatagram::with_events(ctx, &pd, &ud).unwrap()
    } else {
        VerbsDatagram::new(ctx, &pd, &ud).unwrap()
    };
    assert_eq!(qp.wakeup_source().is_some(), events);
    let mut cfg = DatagramConfig::default();
    // More receive slots than a burst, so a subscriber that wakes late loses nothing.
    (cfg.recv_slots, cfg.send_slots) = (64, 8);
    cfg.timeout = Duration::from_secs(5);
    let need = memory_needed(qp.mtu(), &cfg);
    let mem = pd
        .register_shared(PageMemory::zeroed(need).unwrap(), AccessFlags::LOCAL_WRITE)
        .unwrap();
    Datagram::new(qp, mem, cfg, &MONOTONIC).unwrap()
}

/// What one run of [`multicast_stream`] measured.
#[derive(Debug)]
struct StreamRun {
    /// How often the receives asked their events (every poll that found nothing does).
    calls: u64,
    /// How often the events put the task to sleep.
    sleeps: u64,
    /// Allocations in the receives after the first.
    allocs: u64,
    /// The longest single receive.
    slowest: Duration,
    /// How long the last receive, with nothing coming, waited for its deadline.
    quiet: Duration,
}

/// A publisher thread sends a sequenced stream to a multicast group in bursts; a tokio task
/// awaits every datagram through `AsyncDatagram` woken by `make(completion events)`, and
/// checks each one's sequence number, contents, group and sender, then that a receive with
/// nothing coming ends with `TimedOut` at its deadline. Returns what it measured.
fn multicast_stream<E: rverbs_async::Events>(
    test: &str,
    make: impl FnOnce(std::sync::Arc<dyn rverbs_core::poll::Wakeup>) -> E,
) -> Option<StreamRun> {
    use rverbs_async::AsyncDatagram;
    use rverbs_core::datagram::{DatagramError, Group, SequenceTracker, Sequencer};
    use rverbs_core::poll::Deadline;
    use rverbs_core::provider::datagram::DatagramProvider;

    let ctx = open(test)?;
    let group = Group::ipv4(GROUP).unwrap();
    const N: u64 = BURSTS * BURST;

    let mut sub = datagram_endpoint(&ctx, true);
    sub.join(group).unwrap();
    let wakeup = sub.provider().wakeup_source().expect("events");

    let (go_tx, go_rx) = std::sync::mpsc::channel::<()>();
    let (qpn_tx, qpn_rx) = std::sync::mpsc::channel::<u32>();
    let pctx = ctx.clone();
    let publisher = std::thread::spawn(move || {
        let mut ep = datagram_endpoint(&pctx, false);
        let to = ep.group_peer(group).unwrap();
        qpn_tx.send(ep.endpoint().qpn).unwrap();
        go_rx.recv().unwrap();
        let mut seq = Sequencer::new(27);
        for b in 0..BURSTS {
            std::thread::sleep(PAUSE);
            for k in 0..BURST {
                let i = b * BURST + k;
                let h = seq.stamp();
                ep.send_parts(&to, &[&h, &i.to_le_bytes(), &[i as u8; BODY]])
                    .unwrap();
            }
        }
        ep.wait_sent().unwrap();
    });
    let from = qpn_rx.recv().unwrap();

    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_io()
        .enable_time()
        .build()
        .unwrap();
    let mut events = Counted {
        inner: rt.block_on(async { make(wakeup) }),
        calls: 0,
        sleeps: 0,
    };
    let mut tracker = SequenceTracker::for_stream(27);
    let mut sub = AsyncDatagram::new(sub, &mut events);
    let t0 = Instant::now();
    let (allocs, slowest, quiet) = rt.block_on(async {
        go_tx.send(()).unwrap();
        let mut before = 0;
        let mut slowest = Duration::ZERO;
        for i in 0..N {
            if i == 1 {
                before = rverbs_testkit::allocs();
            }
            let t = Instant::now();
            let (sequence, n, body_ok, grp, qpn) = sub
                .recv_with(|d| {
                    let (h, rest) = tracker.observe(d.payload).expect("a sequence header");
                    let mut n = [0u8; 8];
                    n.copy_from_slice(&rest[..8]);
                    let body_ok = rest.len() == 8 + BODY && rest[8..].iter().all(|&x| x == i as u8);
                    (
                        h.sequence,
                        u64::from_le_bytes(n),
                        body_ok,
                        d.source.group,
                        d.source.qpn,
                    )
                })
                .await
                .unwrap_or_else(|e| panic!("{test}: datagram {i}: {e}"));
            slowest = slowest.max(t.elapsed());
            assert_eq!((sequence, n), (i, i), "datagram {i} out of sequence");
            assert!(
                body_ok,
                "datagram {i}: its body is not {BODY} bytes of {}",
                i as u8
            );
            assert_eq!(grp, Some(group.gid()), "datagram {i} not from the group");
            assert_eq!(qpn, from, "datagram {i} not from the publisher");
        }
        let allocs = rverbs_testkit::allocs() - before;
        // Nothing more comes: the wait ends at its deadline.
        let t = Instant::now();
        let r = sub
            .recv_until_with(Deadline::after(&MONOTONIC, QUIET), |_| ())
            .await;
        let quiet = t.elapsed();
        assert!(
            matches!(r, Err(DatagramError::TimedOut { .. })),
            "a receive with nothing coming: {r:?}"
        );
        (allocs, slowest, quiet)
    });
    let took = t0.elapsed();
    publisher.join().unwrap();
    let ep = sub.into_inner();
    let run = StreamRun {
        calls: events.calls,
        sleeps: events.sleeps,
        allocs,
        slowest,
        quiet,
    };
    eprintln!(
        "{test}: {N} datagrams in {BURSTS} bursts in {took:?}; slowest receive {:?}; \
         {} event polls, {} sleeps; {} allocations in {} receives; a quiet receive of \
         {QUIET:?} ended after {:?}",
        run.slowest,
        run.calls,
        run.sleeps,
        run.allocs,
        N - 1,
        run.quiet
    );
    let c = tracker.counts();
    assert_eq!((c.received, c.lost, c.reordered), (N, 0, 0), "{c:?}");
    assert!(ep.failure().is_none());
    // Bounded: no receive came near the endpoint's 5 s timeout, and the quiet one ended at
    // its deadline, not before, and not much after.
    assert!(
        run.slowest < Duration::from_secs(3),
        "slowest receive {:?}",
        run.slowest
    );
    assert!(
        run.quiet >= QUIET && run.quiet < Duration::from_secs(3),
        "a receive bounded at {QUIET:?} took {:?}",
        run.quiet
    );
    Some(run)
}

/// The subscriber asleep on its endpoint's completion channel between bursts.
#[test]
fn a_multicast_subscriber_awaits_a_sequenced_stream_asleep_on_completion_events() {
    let Some(run) = multicast_stream(
        "a_multicast_subscriber_awaits_a_sequenced_stream_asleep_on_completion_events",
        |w| TokioEvents::new(w).unwrap(),
    ) else {
        return;
    };
    assert_eq!(run.allocs, 0, "allocations per receive after the first");
    // Asleep between bursts: at least one sleep per pause (the subscriber keeps up with a
    // burst in far less than the pause; half of them allows for a descheduled VM).
    assert!(
        run.sleeps >= BURSTS / 2,
        "{} sleeps in {BURSTS} pauses",
        run.sleeps
    );
    // Not polling: an asleep wait asks its events a handful of times per wake-up; a
    // busy-polling one once per turn (the next test measures that).
    assert!(
        run.calls <= ASLEEP_CALLS_PER_DATAGRAM * BURSTS * BURST,
        "{} event polls for {} datagrams",
        run.calls,
        BURSTS * BURST
    );
}

/// The control for the test above: the same stream with `YieldEvents`, which re-polls on
/// every turn of the runtime. Receives the same datagrams, and asks its events far more
/// often than an asleep subscriber may: the count tells sleeping from polling.
#[test]
fn a_multicast_subscriber_polled_by_tokio_is_told_apart_by_its_event_polls() {
    let Some(run) = multicast_stream(
        "a_multicast_subscriber_polled_by_tokio_is_told_apart_by_its_event_polls",
        |_| rverbs_async::YieldEvents,
    ) else {
        return;
    };
    assert!(
        run.calls > ASLEEP_CALLS_PER_DATAGRAM * BURSTS * BURST,
        "a busy-polling subscriber asked its events only {} times",
        run.calls
    );
}

/// The most event polls per datagram an asleep subscriber may make (measured on rxe:
/// fewer than 1).
const ASLEEP_CALLS_PER_DATAGRAM: u64 = 8;

/// The rest of the channel's async operations on a device: fetch-and-add and
/// compare-and-swap against a peer's window (the previous values come back, the window
/// holds the results), and receives kept posted in a ring, awaited asleep while the peer
/// sends later, plus the ring's inline send answered by an owned-buffer receive.
#[test]
fn atomics_and_a_receive_ring_awaited_on_completion_events() {
    use rverbs_async::AsyncRing;
    use rverbs_core::channel::RecvRing;

    let test = "atomics_and_a_receive_ring_awaited_on_completion_events";
    let Some((_ctx, pd, a, b)) = event_pair(test) else {
        return;
    };
    let window = pd
        .register_shared(
            vec![0u8; 64].into_boxed_slice(),
            AccessFlags::LOCAL_WRITE
                | AccessFlags::REMOTE_WRITE
                | AccessFlags::REMOTE_READ
                | AccessFlags::REMOTE_ATOMIC,
        )
        .unwrap();
    let ring_mem = pd
        .register_shared(
            vec![0u8; 16 * 64].into_boxed_slice(),
            AccessFlags::LOCAL_WRITE,
        )
        .unwrap();
    let abuf = pd
        .register_shared(vec![0u8; 64].into_boxed_slice(), AccessFlags::LOCAL_WRITE)
        .unwrap();
    let word = window.remote().slice(8, 8).unwrap();
    const MESSAGES: u64 = 20;

    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_io()
        .enable_time()
        .build()
        .unwrap();
    rt.block_on(async {
        let ev = |p: &VerbsProvider| {
            TokioEvents::new(p.wakeup_source().expect("queues on a completion channel")).unwrap()
        };
        let (eva, evb) = (ev(&a), ev(&b));
        let mut a: Chan = AsyncChannel::new(channel(a), eva);
        let ring = RecvRing::new(channel(b), ring_mem, 64).unwrap();
        let mut b = AsyncRing::new(ring, evb);

        // Atomics: the previous value comes back in the buffer, the window has the sum.
        let mut buf = abuf;
        for (k, want) in [0u64, 5, 10].into_iter().enumerate() {
            let (r, back) = a.fetch_add(buf, 16, word, 5).await;
            assert_eq!(r.unwrap(), want, "fetch_add {k}");
            buf = back;
        }
        assert_eq!(window.load_u64(8), Some(15));
        let (r, back) = a.compare_swap(buf, 16, word, 15, 99).await;
        assert_eq!(r.unwrap(), 15, "a compare_swap that matches");
        assert_eq!(window.load_u64(8), Some(99));
        let (r, back) = a.compare_swap(back, 16, word, 15, 7).await;
        assert_eq!(r.unwrap(), 99, "a compare_swap that does not match");
        assert_eq!(window.load_u64(8), Some(99), "a failed compare_swap wrote");
        buf = back;

        // The ring's receives are posted already: B awaits each message (asleep until A,
        // a little later, sends it), then answers inline into A's awaited receive.
        for i in 0..MESSAGES {
            let text = format!("message {i:03}");
            buf.write_from(0, text.as_bytes());
            let len = text.len();
            let (got, (r, back)) = tokio::join!(b.recv_with(|m| m.data.to_vec()), async {
                tokio::time::sleep(Duration::from_millis(2)).await;
                a.send(buf, 0..len).await
            });
            r.unwrap();
            assert_eq!(got.unwrap(), text.as_bytes(), "message {i}");
            let reply = format!("reply {i:03}");
            let ((r, back), sent) =
                tokio::join!(a.recv(back, 0..64), b.send_inline(reply.as_bytes()));
            sent.unwrap();
            assert_eq!(r.unwrap().byte_len as usize, reply.len());
            let mut got = vec![0u8; reply.len()];
            assert!(back.read_into(0, &mut got));
            assert_eq!(got, reply.as_bytes(), "reply {i}");
            buf = back;
        }
        assert!(a.channel().fault().is_none());
        assert!(b.channel().fault().is_none());
    });
    eprintln!("{test}: 3 fetch_add, 2 compare_swap, {MESSAGES} ring receives and replies");
}
