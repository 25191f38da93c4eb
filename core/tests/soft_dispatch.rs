//! `MultiChannel::poll_ready` on shared completion queues hands each completion of its own
//! channels to the channel directly (no mailbox), and leaves in the mailboxes what it must
//! not take: completions behind older ones a neighbour's poll already routed there (taken in
//! order, none lost or seen twice), and those of a queue pair whose channel was swapped out
//! of the multi-channel (its new owner still finds them).
#![allow(clippy::std_instead_of_core)]

use core::time::Duration;

use rverbs_core::channel::{Channel, ChannelConfig, Ticket};
use rverbs_core::memory::AccessFlags;
use rverbs_core::model::{NetQp, SoftNet, SoftNetConfig};
use rverbs_core::multi::MultiChannel;
use rverbs_core::params::QpCaps;
use rverbs_core::poll::Spin;
use rverbs_core::provider::shared::{RoutedQp, SharedCqs};

use rverbs_testkit::clock;

#[repr(align(8))]
struct Words<const N: usize>([u8; N]);

type Chan<'n> = Channel<RoutedQp<NetQp<'n>, rverbs_core::model::NetCq<'n>>>;

fn caps() -> QpCaps {
    QpCaps::queues(16, 16).with_sges(1)
}

fn cfg(rank: u32) -> ChannelConfig {
    let mut c = ChannelConfig::with_timeout(Duration::from_secs(1));
    c.rank = Some(rank);
    c
}

fn chan<'n>(cqs: &SharedCqs<rverbs_core::model::NetCq<'n>>, q: NetQp<'n>, rank: u32) -> Chan<'n> {
    let routed = cqs.add(q).map_err(|(_, e)| e).expect("route");
    Channel::with_backoff(routed, cfg(rank), Spin, clock!())
}

/// Node 0 with three queue pairs on one pair of shared queues, to nodes 1 (`x`), 2 (`y`)
/// and 3 (a spare, `z`); `x` and `y` in a multi-channel. The far ends of `x` (`a`) and of
/// `z` (`c`).
struct Setup<'n> {
    multi: MultiChannel<RoutedQp<NetQp<'n>, rverbs_core::model::NetCq<'n>>, Spin>,
    z: Chan<'n>,
    a: Chan<'n>,
    c: Chan<'n>,
    /// Node 2's end: not used, kept until the test ends.
    _b: Chan<'n>,
}

fn setup<'n>(net: &'n SoftNet<'_>) -> Setup<'n> {
    let cqs0 = SharedCqs::new(net.send_cq(0).unwrap(), net.recv_cq(0).unwrap(), 3);
    let cqs1 = SharedCqs::new(net.send_cq(1).unwrap(), net.recv_cq(1).unwrap(), 1);
    let cqs2 = SharedCqs::new(net.send_cq(2).unwrap(), net.recv_cq(2).unwrap(), 1);
    let cqs3 = SharedCqs::new(net.send_cq(3).unwrap(), net.recv_cq(3).unwrap(), 1);
    let (x, a) = net.connect(0, 1).unwrap();
    let (y, b) = net.connect(0, 2).unwrap();
    let (z, c) = net.connect(0, 3).unwrap();
    let x = chan(&cqs0, x, 1);
    let y = chan(&cqs0, y, 2);
    let z = chan(&cqs0, z, 3);
    let a = chan(&cqs1, a, 0);
    let c = chan(&cqs3, c, 0);
    Setup {
        multi: MultiChannel::new(vec![x, y]).expect("multi"),
        z,
        a,
        c,
        _b: chan(&cqs2, b, 0),
    }
}

/// Posts one receive of `len` bytes at `at` of `mem` on `chan`.
fn post_recv(
    chan: &mut Chan<'_>,
    mem: &mut rverbs_core::model::NetRegion<'_>,
    at: usize,
) -> Ticket {
    let mut sge = [mem.sge_mut(at..at + 8).unwrap()];
    // SAFETY: `mem` outlives every wait on the ticket below, and each slot is posted once.
    unsafe { chan.post_recv(&mut sge) }.expect("post_recv")
}

#[test]
fn completions_behind_a_neighbours_routing_come_out_in_order_none_lost_or_twice() {
    let net = SoftNet::new(SoftNetConfig::new(4, caps()));
    let mut buf = Words([0u8; 64]);
    let mut mem = net
        .register(0, &mut buf.0, AccessFlags::LOCAL_WRITE)
        .unwrap();
    let Setup {
        mut multi,
        mut z,
        mut a,
        ..
    } = setup(&net);
    let x = multi.channel(1).unwrap();
    let tickets: Vec<Ticket> = (0..4).map(|i| post_recv(x, &mut mem, i * 8)).collect();
    // Two messages arrive; the spare channel's poll of the shared queues routes them into
    // `x`'s mailbox.
    for len in [1usize, 2] {
        a.send_inline(&[len as u8; 8][..len]).expect("send");
    }
    let _ = z.poll().expect("z poll");
    // Two more: the multi-channel's poll must not hand them over ahead of the two waiting.
    for len in [3usize, 4] {
        a.send_inline(&[len as u8; 8][..len]).expect("send");
    }
    let mut reported = Vec::new();
    let n = multi
        .poll_ready(|(p, rank), r| reported.push((p, rank, r.expect("no failure"))))
        .expect("poll_ready");
    assert_eq!(n, 4, "four receives retired, each once");
    assert_eq!(reported, [(0, 1, 4)], "x reported once, with all four");
    let x = multi.channel(1).unwrap();
    assert_eq!(x.outstanding_recvs(), 0);
    for (i, t) in tickets.into_iter().enumerate() {
        let done = x.wait(t).expect("receive");
        assert_eq!(done.byte_len as usize, i + 1, "receive {i}");
    }
    // Nothing is left to take twice.
    assert_eq!(multi.poll_ready(|_, _| panic!("nothing new")).unwrap(), 0);
    assert_eq!(mem.load_u64(0), Some(1), "the first message, one byte");
}

#[test]
fn a_swapped_out_channels_completions_wait_for_it_not_for_the_multi_channel() {
    let net = SoftNet::new(SoftNetConfig::new(4, caps()));
    let mut buf = Words([0u8; 64]);
    let mut mem = net
        .register(0, &mut buf.0, AccessFlags::LOCAL_WRITE)
        .unwrap();
    let Setup {
        mut multi,
        mut z,
        mut a,
        mut c,
        ..
    } = setup(&net);
    let t_old = post_recv(multi.channel(1).unwrap(), &mut mem, 0);
    let t_new = post_recv(&mut z, &mut mem, 8);
    // The caller swaps the spare channel in for rank 1: the multi-channel's lookup still
    // names `x`'s queue pair at that position.
    std::mem::swap(multi.channel(1).unwrap(), &mut z);
    a.send_inline(&[7; 5]).expect("send on x's connection");
    c.send_inline(&[9; 6]).expect("send on z's connection");
    let mut reported = Vec::new();
    multi
        .poll_ready(|(p, rank), r| reported.push((p, rank, r.expect("no failure"))))
        .expect("poll_ready");
    assert_eq!(
        reported,
        [(0, 1, 1)],
        "only the channel now at position 0, once"
    );
    let now = multi.channel(1).unwrap();
    assert_eq!(now.wait(t_new).expect("z's receive").byte_len, 6);
    // `x`, swapped out, still finds its own completion.
    assert_eq!(z.wait(t_old).expect("x's receive").byte_len, 5);
    assert_eq!(mem.load_u64(0), Some(0x07_0707_0707));
    assert_eq!(mem.load_u64(8), Some(0x0909_0909_0909));
}

/// A queue pair routed on the shared queues before the multi-channel's own (its slot comes
/// first): the multi-channel's poll leaves its completions for it.
#[test]
fn a_neighbour_routed_first_keeps_its_completions() {
    let net = SoftNet::new(SoftNetConfig::new(4, caps()));
    let mut buf = Words([0u8; 64]);
    let mut mem = net
        .register(0, &mut buf.0, AccessFlags::LOCAL_WRITE)
        .unwrap();
    let cqs0 = SharedCqs::new(net.send_cq(0).unwrap(), net.recv_cq(0).unwrap(), 3);
    let cqs1 = SharedCqs::new(net.send_cq(1).unwrap(), net.recv_cq(1).unwrap(), 1);
    let cqs2 = SharedCqs::new(net.send_cq(2).unwrap(), net.recv_cq(2).unwrap(), 1);
    let (n, a) = net.connect(0, 1).unwrap();
    let (x, b) = net.connect(0, 2).unwrap();
    let mut neighbour = chan(&cqs0, n, 1);
    let mut multi = MultiChannel::new(vec![chan(&cqs0, x, 2)]).expect("multi");
    let (mut a, mut b) = (chan(&cqs1, a, 0), chan(&cqs2, b, 0));
    let t_n = post_recv(&mut neighbour, &mut mem, 0);
    let t_x = post_recv(multi.channel(2).unwrap(), &mut mem, 8);
    a.send_inline(&[3; 3]).expect("send to the neighbour");
    b.send_inline(&[4; 4]).expect("send to the multi-channel's");
    let mut reported = Vec::new();
    multi
        .poll_ready(|(p, rank), r| reported.push((p, rank, r.expect("no failure"))))
        .expect("poll_ready");
    assert_eq!(reported, [(0, 2, 1)], "only the multi-channel's own");
    assert_eq!(multi.channel(2).unwrap().wait(t_x).unwrap().byte_len, 4);
    assert_eq!(neighbour.wait(t_n).expect("the neighbour's").byte_len, 3);
}

/// A caller's `f` that panics while `poll_ready` reports: what the poll handed over was
/// given to the channels before, and no later poll gives or reports it again (delivery is
/// once); the poll after that serves new completions as before.
#[test]
fn a_report_that_panics_leaves_nothing_to_deliver_twice() {
    use std::panic::{catch_unwind, AssertUnwindSafe};
    let net = SoftNet::new(SoftNetConfig::new(4, caps()));
    let mut buf = Words([0u8; 64]);
    let mut mem = net
        .register(0, &mut buf.0, AccessFlags::LOCAL_WRITE)
        .unwrap();
    let Setup {
        mut multi,
        mut a,
        _b: mut b,
        ..
    } = setup(&net);
    let mut t_x: Vec<Ticket> = (0..3)
        .map(|i| post_recv(multi.channel(1).unwrap(), &mut mem, i * 8))
        .collect();
    let t_y = post_recv(multi.channel(2).unwrap(), &mut mem, 24);
    let panics = |multi: &mut MultiChannel<_, Spin>| {
        catch_unwind(AssertUnwindSafe(|| {
            multi.poll_ready(|_, _| panic!("the caller's report panics"))
        }))
        .is_err()
    };
    // Two channels with completions (each marked while the poll serves them)...
    a.send_inline(&[1; 1]).expect("send to x");
    b.send_inline(&[2; 2]).expect("send to y");
    assert!(panics(&mut multi));
    assert_eq!(multi.poll_ready(|_, _| panic!("nothing new")).unwrap(), 0);
    // ... then one (its completions handed over, reported once).
    a.send_inline(&[3; 3]).expect("send to x");
    assert!(panics(&mut multi));
    assert_eq!(multi.poll_ready(|_, _| panic!("nothing new")).unwrap(), 0);
    // Both delivered, each once: the receives complete with their own lengths.
    let x = multi.channel(1).unwrap();
    assert_eq!(x.wait(t_x.remove(0)).unwrap().byte_len, 1);
    assert_eq!(x.wait(t_x.remove(0)).unwrap().byte_len, 3);
    let y = multi.channel(2).unwrap();
    assert_eq!(y.wait(t_y).unwrap().byte_len, 2);
    // The next poll serves both channels again, each reported once.
    a.send_inline(&[4; 4]).expect("send to x");
    let t_y = post_recv(multi.channel(2).unwrap(), &mut mem, 32);
    b.send_inline(&[5; 5]).expect("send to y");
    let mut reported = Vec::new();
    let n = multi
        .poll_ready(|(p, rank), r| reported.push((p, rank, r.expect("no failure"))))
        .expect("poll_ready");
    assert_eq!(n, 2);
    reported.sort_unstable();
    assert_eq!(reported, [(0, 1, 1), (1, 2, 1)]);
    let x = multi.channel(1).unwrap();
    assert_eq!(x.wait(t_x.remove(0)).unwrap().byte_len, 4);
    assert_eq!(multi.channel(2).unwrap().wait(t_y).unwrap().byte_len, 5);
}

/// A caller's own `take` ([`Provider::poll_shared_with`] is public) that panics on its own
/// completion loses that one (documented), but no other queue pair's: a neighbour's
/// message polled in the same batch, behind it, must still reach the neighbour. On a
/// device's extended queue (`poll_each` in place) the neighbour's stays in the queue; on a
/// queue polled into the scratch array first (`poll_each`'s default: the model, the verbs
/// legacy path) the whole batch left the queue, and the panic leaves the loop over the
/// array with the rest routed nowhere. Lost, the neighbour's receive never completes: its
/// wait times out, and dropping its channel waits for a flush the device can no longer
/// give, then aborts the process. Here that channel is forgotten instead (its memory
/// leaked with it), so a failure fails this test only.
#[test]
fn a_callers_take_that_panics_loses_no_neighbours_completion() {
    use core::panic::AssertUnwindSafe;
    use rverbs_core::provider::{Provider, QueuePair};
    use rverbs_core::wr::RecvRequest;
    use std::panic::catch_unwind;

    let net = SoftNet::new(SoftNetConfig::new(4, caps()));
    // Freed at the end only if nothing names it any more; leaked if a receive naming it
    // was lost (its channel is forgotten then).
    let raw: *mut Words<64> = Box::into_raw(Box::new(Words([0u8; 64])));
    // SAFETY: from `Box::into_raw` just above; freed at most once, below, after every use.
    let buf: &'static mut Words<64> = unsafe { &mut *raw };
    let mut mem = net
        .register(0, &mut buf.0, AccessFlags::LOCAL_WRITE)
        .unwrap();
    let cqs0 = SharedCqs::new(net.send_cq(0).unwrap(), net.recv_cq(0).unwrap(), 2);
    let cqs1 = SharedCqs::new(net.send_cq(1).unwrap(), net.recv_cq(1).unwrap(), 1);
    let cqs3 = SharedCqs::new(net.send_cq(3).unwrap(), net.recv_cq(3).unwrap(), 1);
    let (x, a) = net.connect(0, 1).unwrap();
    let (z, c) = net.connect(0, 3).unwrap();
    // The caller's own queue pair, polled by hand; the neighbour is a channel.
    let mut mine = cqs0.add(x).map_err(|(_, e)| e).expect("route");
    let mut neighbour = chan(&cqs0, z, 3);
    let (mut a, mut c) = (chan(&cqs1, a, 0), chan(&cqs3, c, 0));
    let wr = RecvRequest {
        wr_id: 1,
        sges: &[],
    };
    // SAFETY: names no memory.
    unsafe { mine.post_recv(core::slice::from_ref(&wr)) }.expect("post");
    let t = post_recv(&mut neighbour, &mut mem, 0);
    // Ours first, the neighbour's behind it, in the one receive queue.
    a.send_inline(&[]).expect("send to mine");
    c.send_inline(&[5; 5]).expect("send to the neighbour");
    let r = catch_unwind(AssertUnwindSafe(|| {
        let _ = mine.poll_shared_with(
            &mut |_, _, _| panic!("the caller's take fails"),
            &mut |_| false,
        );
    }));
    assert!(r.is_err(), "the take ran (a completion was there)");
    // Not a wait: a wait that times out flushes the channel and, the receive never
    // completing, aborts the process. A few polls find the message if it is anywhere.
    for _ in 0..4 {
        neighbour.poll().expect("the neighbour's poll");
    }
    let arrived = neighbour.outstanding_recvs() == 0;
    if arrived {
        assert_eq!(neighbour.wait(t).expect("complete").byte_len, 5);
        // Nothing names the buffer once its channels and registration are gone.
        drop((neighbour, mine, a, c, mem));
        // SAFETY: from `Box::into_raw` above, freed once; every receive that named it has
        // completed, and the region registered on it is dropped.
        drop(unsafe { Box::from_raw(raw) });
    } else {
        // Its receive is gone: a drop would wait for its flush and then abort.
        core::mem::forget(neighbour);
    }
    assert!(
        arrived,
        "the neighbour's message survives the caller's take"
    );
}
