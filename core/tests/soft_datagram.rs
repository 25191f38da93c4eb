//! Datagram endpoints on the software model: UD both ways (inline and staged, header
//! stripped, sender known, replies), multicast fan-out with one post per datagram, late
//! joiners and leaving, losses counted exactly, bounded waits, the MTU refused before
//! posting, zero allocations per datagram, and dropping or swapping endpoints with work in
//! flight. Miri runs it (smaller worlds there).
#![allow(clippy::std_instead_of_core)] // test code

mod support;

use std::time::Duration;

use rverbs_core::datagram::{
    memory_needed, Datagram, DatagramConfig, DatagramError, Group, SequenceTracker, Sequencer,
};
use rverbs_core::memory::AccessFlags;
use rverbs_core::model::{NetDatagram, NetRegion, SoftNet, SoftNetConfig};
use rverbs_core::params::{Mtu, QpCaps};
use rverbs_core::poll::StepClock;
use rverbs_core::provider::datagram::DatagramProvider;
use rverbs_testkit::PanicAfter;
use support::allocs;

#[global_allocator]
static GLOBAL: support::Counting = support::Counting;

// Every read advances 1 ms: a 50 ms timeout passes after 50 reads (800 empty polls), which
// keeps the timeout test fast under Miri; nothing else ever waits on the model.
static CLOCK: StepClock = StepClock::new(Duration::from_millis(1));
const QKEY: u32 = 0x0123_4567;
const MTU: Mtu = Mtu::B256;
const CAPS: QpCaps = QpCaps {
    max_send_wr: 32,
    max_recv_wr: 16,
    max_send_sge: 4,
    max_recv_sge: 1,
    max_inline_data: 32,
};

type End<'n> = Datagram<NetDatagram<'n>, NetRegion<'n>>;

fn cfg(recv_slots: u32) -> DatagramConfig {
    let mut c = DatagramConfig::default();
    c.recv_slots = recv_slots;
    c.send_slots = 4;
    c.signal_every = 4;
    c.timeout = Duration::from_millis(50);
    c
}

/// Memory for `nodes` endpoints with `cfg`.
fn memory(nodes: usize, c: &DatagramConfig) -> Vec<Vec<u8>> {
    vec![vec![0u8; memory_needed(MTU.bytes(), c)]; nodes]
}

fn endpoints<'n>(net: &'n SoftNet<'n>, mem: &'n mut [Vec<u8>], c: DatagramConfig) -> Vec<End<'n>> {
    mem.iter_mut()
        .enumerate()
        .map(|(node, m)| {
            let node = node as u32;
            let qp = net.create_datagram(node, QKEY, MTU).unwrap();
            let region = net.register(node, m, AccessFlags::LOCAL_WRITE).unwrap();
            Datagram::new(qp, region, c, &CLOCK).unwrap()
        })
        .collect()
}

/// One endpoint on `node` with its own `mtu`.
fn endpoint_on<'n>(
    net: &'n SoftNet<'n>,
    node: u32,
    mtu: Mtu,
    m: &'n mut [u8],
    c: DatagramConfig,
) -> End<'n> {
    let qp = net.create_datagram(node, QKEY, mtu).unwrap();
    let region = net.register(node, m, AccessFlags::LOCAL_WRITE).unwrap();
    Datagram::new(qp, region, c, &CLOCK).unwrap()
}

#[test]
fn datagrams_both_ways_with_the_header_stripped_and_the_sender_known() {
    let c = cfg(8);
    let mut mem = memory(2, &c);
    let net = SoftNet::new(SoftNetConfig::new(2, CAPS));
    let mut ends = endpoints(&net, &mut mem, c);
    let (a, b) = ends.split_at_mut(1);
    let (a, b) = (&mut a[0], &mut b[0]);
    let (ea, eb) = (a.endpoint(), b.endpoint());
    assert_eq!(ea.gid, net.gid(0));
    let to_b = a.peer(&eb).unwrap();
    let big: Vec<u8> = (0..200u8).collect();
    for round in 0..20u8 {
        // Inline (small) and through a send slot (above the 32-byte inline limit).
        a.send(&to_b, &[round; 8]).unwrap();
        a.send_parts(&to_b, &[&[round], &big]).unwrap();
        let d = b.recv().unwrap();
        assert_eq!(d.payload, &[round; 8]);
        assert_eq!((d.source.gid, d.source.qpn), (ea.gid, ea.qpn));
        assert_eq!((d.source.qkey, d.source.group), (QKEY, None));
        let src = d.source;
        let d = b.recv().unwrap();
        assert_eq!(d.payload.len(), 201);
        assert_eq!(d.payload[0], round);
        assert_eq!(&d.payload[1..], &big[..]);
        // Answer the sender from what the datagram said.
        let back = b.reply_to(&src).unwrap();
        b.send(&back, b"pong").unwrap();
        assert_eq!(a.recv().unwrap().payload, b"pong");
    }
    let (sa, sb) = (a.stats(), b.stats());
    assert_eq!((sa.sent, sa.sent_inline, sa.received), (40, 20, 20));
    assert_eq!((sb.sent, sb.received, sb.receive_errors), (20, 40, 0));
    // The MTU (256 here) is refused before posting, and the endpoint goes on.
    let posted = net.stats(0).sends_posted;
    assert_eq!(
        a.send(&to_b, &[0u8; 257]),
        Err(DatagramError::TooLarge { max: 256, got: 257 })
    );
    assert_eq!(net.stats(0).sends_posted, posted, "nothing was posted");
    a.send(&to_b, &[1u8; 256]).unwrap();
    assert_eq!(b.recv().unwrap().payload.len(), 256);
    assert!(matches!(
        a.send_parts(&to_b, &[&[], &[], &[], &[], &[]]),
        Err(DatagramError::TooManyParts { max: 4, got: 5 })
    ));
}

/// A peer made by an endpoint with a larger MTU, used on one with a smaller: the send is
/// refused before anything is copied into a send slot (whose neighbours may be in flight)
/// or posted.
#[test]
fn a_peer_made_by_another_endpoint_is_held_to_the_senders_mtu() {
    let c = cfg(4);
    let net = SoftNet::new(SoftNetConfig::new(3, CAPS));
    let mut ma = vec![0u8; memory_needed(1024, &c)];
    let mut mb = vec![0u8; memory_needed(256, &c)];
    let mut mc = vec![0u8; memory_needed(1024, &c)];
    {
        let mut a = endpoint_on(&net, 0, Mtu::B1024, &mut ma, c);
        let mut b = endpoint_on(&net, 1, Mtu::B256, &mut mb, c);
        let mut cc = endpoint_on(&net, 2, Mtu::B1024, &mut mc, c);
        let to_c = a.peer(&cc.endpoint()).unwrap();
        assert_eq!(to_c.mtu(), 1024);
        let posted = net.stats(1).sends_posted;
        assert_eq!(
            b.send(&to_c, &[0xab; 1000]),
            Err(DatagramError::TooLarge {
                max: 256,
                got: 1000
            })
        );
        assert_eq!(net.stats(1).sends_posted, posted, "nothing was posted");
        // Up to B's MTU the borrowed peer works.
        b.send(&to_c, &[0xcd; 256]).unwrap();
        assert_eq!(cc.recv().unwrap().payload, &[0xcd; 256]);
        a.send(&to_c, &[0xef; 1000]).unwrap();
        assert_eq!(cc.recv().unwrap().payload.len(), 1000);
    }
    assert!(
        !mb.contains(&0xab),
        "the refused payload was copied into B's memory"
    );
}

#[test]
fn a_receive_with_nothing_to_receive_times_out_and_the_endpoint_goes_on() {
    let c = cfg(4);
    let mut mem = memory(2, &c);
    let net = SoftNet::new(SoftNetConfig::new(2, CAPS));
    let mut ends = endpoints(&net, &mut mem, c);
    let t0 = CLOCK_NOW();
    match ends[1].recv() {
        Err(DatagramError::TimedOut { waited }) => assert!(waited >= Duration::from_millis(50)),
        other => panic!("expected a timeout, got {other:?}"),
    }
    assert!(
        CLOCK_NOW() - t0 < 1_000_000_000,
        "bounded by the 50 ms timeout"
    );
    assert!(ends[1].try_recv().is_none());
    let eb = ends[1].endpoint();
    let to_b = ends[0].peer(&eb).unwrap();
    ends[0].send(&to_b, b"late").unwrap();
    assert_eq!(ends[1].recv().unwrap().payload, b"late");
}

#[allow(non_snake_case)]
fn CLOCK_NOW() -> u64 {
    use rverbs_core::poll::Clock;
    CLOCK.now().as_nanos()
}

#[test]
fn multicast_reaches_every_member_with_one_post_late_joiners_get_what_follows_and_leaving_stops_it()
{
    let members: usize = if cfg!(miri) { 4 } else { 64 };
    let c = cfg(16);
    let mut mem = memory(members + 1, &c);
    let net = SoftNet::new(SoftNetConfig::new(members as u32 + 1, CAPS));
    let mut ends = endpoints(&net, &mut mem, c);
    let group = Group::ipv4([239, 1, 2, 3]).unwrap();
    let (publisher, subs) = ends.split_first_mut().unwrap();
    let (early, late) = subs.split_at_mut(members / 2);
    for s in early.iter_mut() {
        s.join(group).unwrap();
    }
    assert_eq!(
        early[0].join(group),
        Err(DatagramError::AlreadyJoined(group.gid()))
    );
    let to_group = publisher.group_peer(group).unwrap();
    let mut seq = Sequencer::new(3);
    let mut trackers = vec![SequenceTracker::new(); members];
    let mut round = |publisher: &mut End<'_>, subs: &mut [&mut End<'_>], n: u64| {
        for _ in 0..n {
            let h = seq.stamp();
            publisher.send_parts(&to_group, &[&h, b"quote"]).unwrap();
        }
        for (s, t) in subs.iter_mut().zip(trackers.iter_mut()) {
            for _ in 0..n {
                let d = s.recv().unwrap();
                assert_eq!(d.source.group, Some(group.gid()));
                let (_, body) = t.observe(d.payload).unwrap();
                assert_eq!(body, b"quote");
            }
        }
    };
    let posted = net.stats(0).sends_posted;
    {
        let mut subs: Vec<&mut End<'_>> = early.iter_mut().collect();
        round(publisher, &mut subs, 8);
    }
    assert_eq!(
        net.stats(0).sends_posted - posted,
        8,
        "one post per datagram, whatever the number of members"
    );
    // The late half joins now: they get only what follows.
    for s in late.iter_mut() {
        s.join(group).unwrap();
    }
    assert_eq!(net.group_members(group.gid()), members);
    {
        let mut subs: Vec<&mut End<'_>> = early.iter_mut().chain(late.iter_mut()).collect();
        round(publisher, &mut subs, 8);
    }
    for (i, t) in trackers.iter().enumerate() {
        let c = t.counts();
        let first = if i < members / 2 { 0 } else { 8 };
        assert_eq!(
            (c.received, c.lost, c.reordered, c.first, c.highest),
            (16 - first, 0, 0, Some(first), Some(15)),
            "subscriber {i}"
        );
    }
    // Leaving stops delivery: the leavers get nothing more (and nothing is counted dropped
    // at them), the others everything.
    for s in early.iter_mut() {
        s.leave(group).unwrap();
    }
    assert_eq!(
        early[0].leave(group),
        Err(DatagramError::NotJoined(group.gid()))
    );
    let dropped_before: u64 = (1..=members as u32)
        .map(|n| net.stats(n).datagrams_dropped)
        .sum();
    publisher.send(&to_group, &seq.stamp()).unwrap();
    for s in early.iter_mut() {
        assert!(s.try_recv().is_none());
    }
    for s in late.iter_mut() {
        assert!(s.recv().is_ok());
    }
    let dropped: u64 = (1..=members as u32)
        .map(|n| net.stats(n).datagrams_dropped)
        .sum();
    assert_eq!(dropped, dropped_before);
}

#[test]
fn datagrams_beyond_the_posted_receives_are_lost_and_counted_exactly() {
    let c = cfg(4);
    let mut mem = memory(2, &c);
    let net = SoftNet::new(SoftNetConfig::new(2, CAPS));
    let mut ends = endpoints(&net, &mut mem, c);
    let group = Group::ipv4([239, 9, 9, 9]).unwrap();
    ends[1].join(group).unwrap();
    let to_group = ends[0].group_peer(group).unwrap();
    let mut seq = Sequencer::new(0);
    let mut t = SequenceTracker::new();
    // Bursts of 6 at a receiver with 4 slots: 2 of every burst find no receive.
    for _ in 0..5 {
        for _ in 0..6 {
            let h = seq.stamp();
            ends[0].send(&to_group, &h).unwrap();
        }
        while let Some(d) = ends[1].try_recv() {
            t.observe(d.unwrap().payload).unwrap();
        }
    }
    let c = t.counts();
    let dropped = net.stats(1).datagrams_dropped;
    assert_eq!(dropped, 10);
    assert_eq!(c.received, 20);
    // The last burst's losses come after the last datagram received: the sender's last
    // sequence number counts them.
    assert_eq!(c.lost + 2, dropped);
    assert_eq!(t.missing_through(seq.next_sequence() - 1), dropped);
}

/// The headers of datagrams `0..n` of `stream`.
fn stamps(stream: u32, n: usize) -> Vec<[u8; 16]> {
    let mut s = Sequencer::new(stream);
    (0..n).map(|_| s.stamp()).collect()
}

/// Feeds `t` the datagrams of `all` at `order`; checks that each is counted exactly once.
fn feed(t: &mut SequenceTracker, all: &[[u8; 16]], order: impl IntoIterator<Item = usize>) {
    for i in order {
        t.observe(&all[i]).unwrap();
    }
}

fn counted_once(t: &SequenceTracker, fed: u64) {
    let c = t.counts();
    assert_eq!(
        c.received + c.duplicates + c.stale + c.out_of_range,
        fed,
        "every datagram counted once: {c:?}"
    );
}

#[test]
fn a_restarted_sender_is_counted_as_a_restart_and_the_new_runs_losses_as_lost() {
    let run = stamps(1, 140);
    let mut t = SequenceTracker::for_stream(1);
    feed(&mut t, &run, 0..=100);
    // The publisher restarts at 0; 50..=60 of the new run are lost.
    feed(&mut t, &run, (0..=100).filter(|i| !(50..=60).contains(i)));
    let c = t.counts();
    assert_eq!(
        (c.restarts, c.lost, c.reordered, c.duplicates),
        (1, 11, 0, 0)
    );
    assert_eq!((c.first, c.highest), (Some(0), Some(100)));
    // It goes on past the old high mark and loses 110..130: counted too.
    feed(&mut t, &run, (101..140).filter(|i| !(110..130).contains(i)));
    let c = t.counts();
    assert_eq!((c.restarts, c.lost, c.reordered), (1, 31, 0));
    assert_eq!(c.received, 101 + 90 + 19);
    assert_eq!(t.missing_through(139), 31);
    counted_once(&t, 101 + 90 + 19);
}

#[test]
fn a_duplicate_does_not_cancel_a_loss() {
    let s = stamps(1, 4);
    let mut t = SequenceTracker::new();
    feed(&mut t, &s, [0, 1, 1, 3]);
    let c = t.counts();
    assert_eq!(
        (c.received, c.lost, c.reordered, c.duplicates, c.restarts),
        (3, 1, 0, 1, 0)
    );
    counted_once(&t, 4);
}

#[test]
fn a_late_joiner_whose_first_datagram_was_overtaken_still_counts_what_follows() {
    let s = stamps(1, 8);
    let mut t = SequenceTracker::new();
    // 4 arrives after 5, the first one seen; 6 is lost.
    feed(&mut t, &s, [5, 4, 7]);
    let c = t.counts();
    assert_eq!((c.received, c.lost, c.stale, c.first), (2, 1, 1, Some(5)));
    assert_eq!(t.missing_through(7), 1);
    counted_once(&t, 3);
}

#[test]
fn late_arrivals_fill_gaps_within_the_window_and_are_stale_beyond_it() {
    let s = stamps(1, 300);
    let mut t = SequenceTracker::new();
    feed(&mut t, &s, (0..300).filter(|&i| i != 10 && i != 250));
    assert_eq!(t.counts().lost, 2);
    // 250 is within the window of the highest (299): it fills its gap; 10 is not.
    feed(&mut t, &s, [250, 10]);
    let c = t.counts();
    assert_eq!((c.lost, c.reordered, c.stale, c.restarts), (1, 1, 1, 0));
    counted_once(&t, 300);
}

#[test]
fn a_strangers_sequence_numbers_are_counted_apart_and_change_nothing() {
    let s = stamps(1, 10);
    let mut t = SequenceTracker::for_stream(1);
    let mut evil = s[0];
    evil[8..16].copy_from_slice(&(u64::MAX - 1).to_le_bytes());
    t.observe(&s[0]).unwrap();
    t.observe(&evil).unwrap();
    feed(&mut t, &s, (1..10).filter(|&i| i != 5));
    let c = t.counts();
    assert_eq!(
        (c.lost, c.reordered, c.out_of_range, c.restarts, c.highest),
        (1, 0, 1, 0, Some(9))
    );
    counted_once(&t, 10);
    // A peer-announced last sequence number near the end of the range.
    assert_eq!(t.missing_through(u64::MAX), 1 + (u64::MAX - 9));
    assert_eq!(t.missing_through(0), 1);
    assert_eq!(SequenceTracker::new().missing_through(u64::MAX), 0);
    // Started by a stranger's datagram: the real stream takes over after two datagrams.
    let mut t = SequenceTracker::for_stream(1);
    t.observe(&evil).unwrap();
    feed(&mut t, &s, 0..10);
    let c = t.counts();
    assert_eq!(
        (c.restarts, c.lost, c.first, c.highest),
        (1, 0, Some(0), Some(9))
    );
    counted_once(&t, 11);
}

#[test]
fn a_sender_that_jumps_far_ahead_is_followed_after_two_datagrams() {
    let mut far = Sequencer::new(1);
    let mut t = SequenceTracker::new();
    let h = far.stamp();
    t.observe(&h).unwrap();
    let s: Vec<[u8; 16]> = {
        let mut x = [0u8; 16];
        x.copy_from_slice(&h);
        (0..3u64)
            .map(|i| {
                x[8..16].copy_from_slice(&(rverbs_core::datagram::MAX_GAP * 3 + i).to_le_bytes());
                x
            })
            .collect()
    };
    feed(&mut t, &s, 0..3);
    let c = t.counts();
    assert_eq!(
        (c.restarts, c.lost, c.out_of_range, c.received),
        (1, 0, 0, 4)
    );
    assert_eq!(c.first, Some(rverbs_core::datagram::MAX_GAP * 3));
    counted_once(&t, 4);
}

#[test]
fn no_allocation_per_datagram() {
    let c = cfg(8);
    let mut mem = memory(3, &c);
    let net = SoftNet::new(SoftNetConfig::new(3, CAPS));
    let mut ends = endpoints(&net, &mut mem, c);
    let group = Group::ipv4([239, 0, 0, 1]).unwrap();
    ends[1].join(group).unwrap();
    ends[2].join(group).unwrap();
    let eb = ends[1].endpoint();
    let to_b = ends[0].peer(&eb).unwrap();
    let to_group = ends[0].group_peer(group).unwrap();
    let big = [7u8; 200];
    let mut seq = Sequencer::new(1);
    let before = allocs();
    let n = if cfg!(miri) { 20 } else { 2000 };
    for i in 0..n {
        let h = seq.stamp();
        if i % 2 == 0 {
            ends[0].send_parts(&to_group, &[&h, &big]).unwrap();
            for s in &mut ends[1..] {
                assert_eq!(s.recv().unwrap().payload.len(), 216);
            }
        } else {
            ends[0].send(&to_b, &h).unwrap();
            assert_eq!(ends[1].recv().unwrap().payload, &h);
        }
    }
    assert_eq!(allocs() - before, 0, "the datagram path allocated");
    let probe = std::hint::black_box(vec![1u8; 8]);
    assert!(allocs() > before, "the counting allocator is installed");
    drop(probe);
}

#[test]
fn dropping_or_swapping_endpoints_with_work_in_flight_drains_them() {
    let c = cfg(8);
    let mut mem = memory(4, &c);
    let net = SoftNet::new(SoftNetConfig::new(4, CAPS));
    let mut ends = endpoints(&net, &mut mem, c);
    let eb = ends[1].endpoint();
    let to_b = ends[0].peer(&eb).unwrap();
    // Unsignaled sends outstanding (signal_every 4), receives posted everywhere.
    for _ in 0..3 {
        ends[0].send(&to_b, &[9u8; 100]).unwrap();
    }
    assert!(ends[0].outstanding_sends() > 0);
    let mut d = ends.pop().unwrap();
    let mut e = ends.pop().unwrap();
    // Swapping whole endpoints moves each queue pair with its memory (the provider alone
    // cannot be swapped: `Datagram::provider` lends it as `&`, a compile_fail doctest);
    // dropped after the swap, each still drains the receives posted into its own memory.
    std::mem::swap(&mut d, &mut e);
    drop(d);
    drop(e);
    let a = ends.remove(0);
    drop(a);
    // Every posted receive of the dropped endpoints completed (flushed) before their
    // memory went.
    for node in [0, 2, 3] {
        assert_eq!(
            net.stats(node).recv_cqes,
            net.stats(node).recvs_posted,
            "node {node}"
        );
    }
    assert_eq!(ends[0].recv().unwrap().payload, &[9u8; 100]);
}

#[test]
fn bad_setups_are_refused() {
    let c = cfg(8);
    let net = SoftNet::new(SoftNetConfig::new(1, CAPS));
    let mut small = vec![0u8; memory_needed(MTU.bytes(), &c) - 1];
    let mut remote = vec![0u8; memory_needed(MTU.bytes(), &c)];
    let qp = net.create_datagram(0, QKEY, MTU).unwrap();
    let r = net
        .register(0, &mut small, AccessFlags::LOCAL_WRITE)
        .unwrap();
    assert!(matches!(
        Datagram::new(qp, r, c, &CLOCK),
        Err(DatagramError::InvalidSetup { .. })
    ));
    let qp = net.create_datagram(0, QKEY, MTU).unwrap();
    let r = net
        .register(
            0,
            &mut remote,
            AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE,
        )
        .unwrap();
    assert!(matches!(
        Datagram::new(qp, r, c, &CLOCK),
        Err(DatagramError::InvalidSetup { .. })
    ));
    let mut too_many = c;
    too_many.recv_slots = CAPS.max_recv_wr + 1;
    let mut m = vec![0u8; memory_needed(MTU.bytes(), &too_many)];
    let mut qp = net.create_datagram(0, QKEY, MTU).unwrap();
    assert_eq!(qp.mtu(), 256);
    assert!(qp
        .address(rverbs_core::provider::datagram::Destination::Lid(9))
        .is_err());
    let r = net.register(0, &mut m, AccessFlags::LOCAL_WRITE).unwrap();
    assert!(matches!(
        Datagram::new(qp, r, too_many, &CLOCK),
        Err(DatagramError::InvalidSetup { .. })
    ));
    assert_eq!(Group::ipv4([192, 168, 0, 1]), None);
}

/// A dropped endpoint's queue pair is destroyed, as on a device: it is no group member any
/// more, and datagrams to the group no longer reach (and are not counted dropped at) it.
#[test]
fn a_dropped_endpoint_leaves_its_groups() {
    let c = cfg(4);
    let mut mem = memory(3, &c);
    let net = SoftNet::new(SoftNetConfig::new(3, CAPS));
    let mut ends = endpoints(&net, &mut mem, c);
    let g = Group::ipv4([239, 7, 7, 7]).unwrap();
    let other = Group::ipv4([239, 7, 7, 8]).unwrap();
    for e in &mut ends[1..] {
        e.join(g).unwrap();
    }
    ends[2].join(other).unwrap();
    assert_eq!(net.group_members(g.gid()), 2);
    drop(ends.pop());
    assert_eq!(net.group_members(g.gid()), 1);
    assert_eq!(net.group_members(other.gid()), 0);
    let to_g = ends[0].group_peer(g).unwrap();
    ends[0].send(&to_g, b"x").unwrap();
    assert_eq!(ends[1].recv().unwrap().payload, b"x");
    assert_eq!(
        net.stats(2).datagrams_dropped,
        0,
        "the dropped endpoint got it"
    );
}

/// Q_Keys with the high bit set are for privileged queue pairs: a device refuses them, and
/// so does the model (a peer could not decode such an endpoint).
#[test]
fn a_controlled_qkey_is_refused_as_on_a_device() {
    let net = SoftNet::new(SoftNetConfig::new(1, CAPS));
    assert!(net.create_datagram(0, 0x8000_0001, MTU).is_none());
    assert!(net.create_datagram(0, 0x7fff_ffff, MTU).is_some());
}

#[test]
fn a_panic_while_waiting_drains_the_endpoint_before_its_memory_goes() {
    let c = cfg(8);
    let mut mem = memory(2, &c);
    let net = SoftNet::new(SoftNetConfig::new(2, CAPS));
    let mut it = mem.iter_mut();
    let (m0, m1) = (it.next().unwrap(), it.next().unwrap());
    let qp = net.create_datagram(1, QKEY, MTU).unwrap();
    let b_qpn = qp.qp_num();
    let region = net.register(1, m1, AccessFlags::LOCAL_WRITE).unwrap();
    let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        let mut b: Datagram<_, _, PanicAfter> =
            Datagram::with_backoff(qp, region, c, PanicAfter(3), &CLOCK).unwrap();
        let _ = b.recv();
    }));
    assert!(r.is_err(), "the back-off panicked");
    assert_eq!(net.stats(1).recvs_posted, 8);
    assert_eq!(
        net.stats(1).recv_cqes,
        8,
        "every receive flushed before the unwind went on"
    );
    // A datagram to the dropped endpoint lands nowhere.
    let mut a = Datagram::new(
        net.create_datagram(0, QKEY, MTU).unwrap(),
        net.register(0, m0, AccessFlags::LOCAL_WRITE).unwrap(),
        c,
        &CLOCK,
    )
    .unwrap();
    let mut gone = a.endpoint();
    gone.qpn = b_qpn;
    gone.gid = net.gid(1);
    let to_gone = a.peer(&gone).unwrap();
    a.send(&to_gone, b"late").unwrap();
    assert_eq!(net.stats(1).datagrams_dropped, 1);
}
