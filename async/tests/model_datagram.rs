//! AsyncDatagram on the software model (host, and under Miri in tools/test-all): a
//! multicast subscriber awaits a sequenced stream (every datagram, in order, its contents,
//! no allocation per receive); a receive future dropped at every await point, forgotten,
//! or ended by `tokio::time::timeout` loses no datagram and leaves every receive slot
//! posted; a receive with nothing coming ends at its deadline and leaves the endpoint
//! intact; an aborted task and a runtime shut down with a receive in flight drop the
//! endpoint, whose queue pair is gone before its memory.
// drop_non_drop: the drops end borrows of the test memory before it is reused.
#![allow(
    clippy::std_instead_of_core,
    clippy::undocumented_unsafe_blocks,
    clippy::drop_non_drop
)]

mod support;

use std::cell::Cell;
use std::pin::Pin;
use std::rc::Rc;
use std::task::Poll;
use std::time::Duration;

use rverbs_async::{AsyncDatagram, YieldEvents};
use rverbs_core::datagram::{
    memory_needed, Datagram, DatagramConfig, DatagramError, Group, SequenceTracker, Sequencer,
};
use rverbs_core::memory::{AccessFlags, Region};
use rverbs_core::model::{NetDatagram, NetRegion, SoftNet, SoftNetConfig};
use rverbs_core::params::{Mtu, QpCaps};
use rverbs_core::poll::{Deadline, StaticClock};
use rverbs_testkit::{block_on, clock, poll_once, OnDrop};

#[global_allocator]
static GLOBAL: rverbs_testkit::Counting = rverbs_testkit::Counting;

const SLOTS: u32 = 4;
const GROUP: [u8; 4] = [239, 1, 2, 3];

fn net<'m>(nodes: u32) -> SoftNet<'m> {
    let caps = QpCaps {
        max_send_wr: 16,
        max_recv_wr: 8,
        max_send_sge: 2,
        max_recv_sge: 1,
        max_inline_data: 64,
    };
    SoftNet::new(SoftNetConfig::new(nodes, caps))
}

fn config(timeout: Duration) -> DatagramConfig {
    let mut c = DatagramConfig::default();
    (c.recv_slots, c.send_slots, c.timeout) = (SLOTS, 2, timeout);
    c
}

fn mem() -> Vec<u8> {
    vec![0; memory_needed(Mtu::B256.bytes(), &config(Duration::ZERO))]
}

type End<'n, M> = Datagram<NetDatagram<'n>, M>;

fn endpoint<'n, M: Region>(
    net: &'n SoftNet<'_>,
    node: u32,
    region: M,
    timeout: Duration,
    clock: StaticClock,
) -> End<'n, M> {
    let qp = net.create_datagram(node, 0x0123_4567, Mtu::B256).unwrap();
    Datagram::new(qp, region, config(timeout), clock).unwrap()
}

fn region<'n, 'm>(net: &'n SoftNet<'m>, node: u32, m: &'m mut [u8]) -> NetRegion<'n> {
    net.register(node, m, AccessFlags::LOCAL_WRITE).unwrap()
}

/// A datagram copied out of its slot: the payload's first bytes and its length.
fn copy(d: rverbs_core::datagram::Received<'_>) -> (usize, [u8; 16]) {
    let mut b = [0u8; 16];
    let n = d.payload.len().min(16);
    b[..n].copy_from_slice(&d.payload[..n]);
    (d.payload.len(), b)
}

#[test]
fn a_subscriber_awaits_a_sequenced_multicast_stream_in_order_without_allocating() {
    const N: u64 = 3 * SLOTS as u64; // every slot reused twice
    let (mut m0, mut m1, mut m2) = (mem(), mem(), mem());
    let net = net(3);
    let (r0, r1, r2) = (
        region(&net, 0, &mut m0),
        region(&net, 1, &mut m1),
        region(&net, 2, &mut m2),
    );
    let clock = clock!();
    let mut publisher = endpoint(&net, 0, r0, Duration::from_secs(60), clock);
    let mut subs = [
        AsyncDatagram::new(
            endpoint(&net, 1, r1, Duration::from_secs(60), clock),
            YieldEvents,
        ),
        AsyncDatagram::new(
            endpoint(&net, 2, r2, Duration::from_secs(60), clock),
            YieldEvents,
        ),
    ];
    let group = Group::ipv4(GROUP).unwrap();
    for s in &mut subs {
        s.datagram().join(group).unwrap();
    }
    let to = publisher.group_peer(group).unwrap();
    let from = publisher.endpoint().qpn;
    let mut seq = Sequencer::new(7);
    let mut trackers = [SequenceTracker::for_stream(7); 2];
    let mut before = 0;
    for i in 0..N {
        if i == 1 {
            before = rverbs_testkit::allocs(); // after one round: nothing is set up lazily
        }
        let h = seq.stamp();
        publisher.send_parts(&to, &[&h, &i.to_le_bytes()]).unwrap();
        for (s, t) in subs.iter_mut().zip(&mut trackers) {
            let (sequence, body, group_of, qpn) = block_on(s.recv_with(|d| {
                let (h, body) = t.observe(d.payload).expect("a sequence header");
                let mut b = [0u8; 8];
                b.copy_from_slice(body);
                (
                    h.sequence,
                    u64::from_le_bytes(b),
                    d.source.group,
                    d.source.qpn,
                )
            }))
            .unwrap();
            assert_eq!((sequence, body), (i, i), "datagram {i}");
            assert_eq!(group_of, Some(group.gid()));
            assert_eq!(qpn, from);
        }
    }
    assert_eq!(
        rverbs_testkit::allocs() - before,
        0,
        "allocations in {} receives and {} sends",
        2 * (N - 1),
        N - 1
    );
    for t in &trackers {
        let c = t.counts();
        assert_eq!((c.received, c.lost, c.reordered), (N, 0, 0));
        assert_eq!((c.first, c.highest), (Some(0), Some(N - 1)));
    }
    for s in &mut subs {
        assert_eq!(s.datagram().stats().received, N);
    }
}

/// Two endpoints: a publisher (node 0) and a subscriber (node 1) joined to the group.
struct Pair<'n, M: Region> {
    publisher: End<'n, NetRegion<'n>>,
    sub: AsyncDatagram<NetDatagram<'n>, M, YieldEvents>,
    to: rverbs_core::datagram::Peer<
        <NetDatagram<'n> as rverbs_core::provider::datagram::DatagramProvider>::Address,
    >,
}

fn pair<'n, 'm, M: Region>(
    net: &'n SoftNet<'m>,
    m0: &'m mut [u8],
    sub_region: M,
    timeout: Duration,
    clock: StaticClock,
) -> Pair<'n, M> {
    let mut publisher = endpoint(net, 0, region(net, 0, m0), timeout, clock);
    let mut sub = AsyncDatagram::new(endpoint(net, 1, sub_region, timeout, clock), YieldEvents);
    let group = Group::ipv4(GROUP).unwrap();
    sub.datagram().join(group).unwrap();
    let to = publisher.group_peer(group).unwrap();
    Pair { publisher, sub, to }
}

/// A publisher and a subscriber on a fresh network of two, their waits bounded by `timeout`
/// on `clock`, handed to `test`.
fn with_pair(
    timeout: Duration,
    clock: StaticClock,
    test: impl FnOnce(&mut Pair<'_, NetRegion<'_>>),
) {
    let (mut m0, mut m1) = (mem(), mem());
    let net = net(2);
    let r1 = region(&net, 1, &mut m1);
    test(&mut pair(&net, &mut m0, r1, timeout, clock));
}

/// A receive future dropped after `polls` polls, with a datagram arriving before the drop
/// (`arrives_first`) or after it: the next receive gets it, and the device has every slot
/// back.
fn drop_recv_after(polls: usize, arrives_first: bool) {
    with_pair(Duration::from_secs(60), clock!(), |p| {
        {
            let mut fut = Box::pin(p.sub.recv_with(copy));
            for _ in 0..polls {
                assert!(poll_once(fut.as_mut()).is_pending(), "nothing sent yet");
            }
            if arrives_first {
                p.publisher.send(&p.to, b"while waiting").unwrap();
            }
        }
        if !arrives_first {
            // Dropped with nothing in it: every receive is still posted.
            assert_eq!(p.sub.datagram().provider().recvs_posted(), SLOTS);
            p.publisher.send(&p.to, b"after the drop").unwrap();
        }
        let (len, b) = block_on(p.sub.recv_with(copy)).unwrap();
        let want: &[u8] = if arrives_first {
            b"while waiting"
        } else {
            b"after the drop"
        };
        assert_eq!(&b[..len], want, "polls {polls}");
        // The slot lent to the closure goes back with the next call; all others stayed posted.
        assert_eq!(p.sub.datagram().provider().recvs_posted(), SLOTS - 1);
        assert_eq!(p.sub.datagram().stats().received, 1);
    });
}

#[test]
fn a_receive_dropped_at_every_await_point_loses_no_datagram() {
    for polls in 0..4 {
        drop_recv_after(polls, false);
        drop_recv_after(polls, true);
    }
}

#[test]
fn a_forgotten_receive_future_loses_no_datagram() {
    with_pair(Duration::from_secs(60), clock!(), |p| {
        let mut fut = Box::pin(p.sub.recv_with(copy));
        assert!(poll_once(fut.as_mut()).is_pending());
        // Forget it: its destructor never runs, its borrow of the endpoint ends. (The box's
        // memory is reclaimed without dropping the future, as a leak would never, so Miri sees
        // no leak.)
        let boxed = unsafe { Pin::into_inner_unchecked(fut) };
        let layout = std::alloc::Layout::for_value(&*boxed);
        let raw = Box::into_raw(boxed).cast::<u8>();
        assert_eq!(p.sub.datagram().provider().recvs_posted(), SLOTS);
        p.publisher.send(&p.to, b"to the forgotten").unwrap();
        let (len, b) = block_on(p.sub.recv_with(copy)).unwrap();
        assert_eq!(&b[..len], b"to the forgotten");
        unsafe { std::alloc::dealloc(raw, layout) };
    });
}

#[test]
fn tokio_timeout_around_a_receive_then_the_datagram_arrives() {
    // The endpoint's own bound (on the step clock) is far beyond tokio's 5 ms, so tokio's
    // timeout is what ends the wait.
    with_pair(Duration::from_secs(3600), clock!(), |p| {
        let rt = support::runtime();
        assert!(
            support::tokio_timeout_fires(&rt, p.sub.recv_with(copy)),
            "nothing was sent: the timeout fires"
        );
        assert_eq!(p.sub.datagram().provider().recvs_posted(), SLOTS);
        p.publisher.send(&p.to, b"late").unwrap();
        let (len, b) = rt.block_on(p.sub.recv_with(copy)).unwrap();
        assert_eq!(&b[..len], b"late");
    });
}

#[test]
fn a_receive_with_nothing_coming_ends_at_its_deadline_and_the_endpoint_stays_usable() {
    let clock = clock!(); // 1 ms per read
    let timeout = Duration::from_millis(20);
    with_pair(timeout, clock, |p| {
        let mut polls = 0u32;
        let r = {
            let mut fut = std::pin::pin!(p.sub.recv_with(copy));
            loop {
                polls += 1;
                if let Poll::Ready(r) = poll_once(fut.as_mut()) {
                    break r;
                }
                assert!(polls < 1000, "the wait outlived its deadline");
            }
        };
        match r {
            Err(DatagramError::TimedOut { waited }) => assert!(waited >= timeout, "{waited:?}"),
            other => panic!("expected a timeout, got {other:?}"),
        }
        // An explicit deadline, already passed: refused at once, after one look.
        let past = Deadline::after(clock, Duration::ZERO);
        let r = block_on(p.sub.recv_until_with(past, copy));
        assert!(matches!(r, Err(DatagramError::TimedOut { .. })), "{r:?}");
        // Intact: every slot posted, and the next datagram arrives.
        assert_eq!(p.sub.datagram().provider().recvs_posted(), SLOTS);
        assert!(p.sub.datagram().failure().is_none());
        p.publisher.send(&p.to, b"still here").unwrap();
        let (len, b) = block_on(p.sub.recv_with(copy)).unwrap();
        assert_eq!(&b[..len], b"still here");
    });
}

#[test]
fn an_aborted_task_and_a_runtime_shut_down_drop_the_endpoint_queue_pair_first() {
    for shutdown in [false, true] {
        // tokio tasks are 'static: memory and net are leaked for the test, and reclaimed at
        // its end.
        let m1: *mut [u8] = Box::into_raw(mem().into_boxed_slice());
        let n: *mut SoftNet<'static> = Box::into_raw(Box::new(net(2)));
        let net: &'static SoftNet<'static> = unsafe { &*n };
        let dropped = Rc::new(Cell::new(None));
        // Says when it is dropped, and whether the queue pair that received into it was gone
        // by then (the subscriber had left the group).
        let seen = dropped.clone();
        let tracked = OnDrop::new(
            net.register(1, unsafe { &mut *m1 }, AccessFlags::LOCAL_WRITE)
                .unwrap(),
            move |_| seen.set(Some(net.group_members(Group::ipv4(GROUP).unwrap().gid()))),
        );
        let mut sub = AsyncDatagram::new(
            endpoint(net, 1, tracked, Duration::from_secs(60), clock!()),
            YieldEvents,
        );
        let group = Group::ipv4(GROUP).unwrap();
        sub.datagram().join(group).unwrap();
        assert_eq!(net.group_members(group.gid()), 1);
        support::end_a_waiting_task(
            shutdown,
            |waiting| async move {
                waiting.set(true);
                // Nothing is sent: this waits until it is aborted or the runtime goes.
                let _ = sub.recv_with(copy).await;
            },
            || assert_eq!(dropped.get(), None, "still waiting"),
        );
        // The endpoint went with the task: its queue pair (which left the group) before the
        // memory it received into.
        assert_eq!(dropped.get(), Some(0), "shutdown {shutdown}");
        unsafe {
            drop(Box::from_raw(n));
            drop(Box::from_raw(m1));
        }
    }
}
