//! [`RecvRing`] on the instant device (issue #25's review): the ring reads its head's result
//! straight from the completion it polled, so what that completion says (a length longer
//! than a slot, an immediate) must reach the message checked, in order with messages the
//! channel polled first; and nothing safe may write a slot while its message is borrowed
//! (the device's [`PeerHand`](rverbs_core::instant::PeerHand), which plays a peer's RDMA
//! write, writes only memory a peer could write). Run under Miri in CI (tools/test-all).

use core::time::Duration;

use rverbs_core::channel::{Channel, ChannelConfig, ChannelError, RecvRing};
use rverbs_core::instant::{
    Arrivals, InstantCq, InstantDevice, InstantProvider, InstantQp, InstantRegion,
};
use rverbs_core::memory::AccessFlags;
use rverbs_core::params::QpCaps;
use rverbs_core::poll::StepClock;
use rverbs_core::provider::shared::{RoutedQp, SharedCqs};

static CLOCK: StepClock = StepClock::new(Duration::from_micros(1));

const LW: AccessFlags = AccessFlags::LOCAL_WRITE;
const SLOT: usize = 16;
/// Short: a timeout takes a clock read (one step) every few empty polls, which Miri runs
/// slowly. Nothing the tests wait for is late, except on purpose.
const TIMEOUT: Duration = Duration::from_micros(50);

fn caps() -> QpCaps {
    QpCaps {
        max_send_wr: 8,
        max_recv_wr: 4,
        max_send_sge: 1,
        max_recv_sge: 1,
        max_inline_data: 64,
    }
}

/// A ring of four 16-byte slots on an instant queue pair, and that queue pair's arrivals.
fn ring(
    dev: &InstantDevice,
    mem: InstantRegion,
) -> (RecvRing<InstantProvider, InstantRegion>, Arrivals) {
    let p = dev.provider(caps());
    let arrivals = p.arrivals();
    let cfg = ChannelConfig::with_timeout(TIMEOUT);
    let ring = RecvRing::new(Channel::new(p, cfg, &CLOCK), mem, SLOT).unwrap();
    (ring, arrivals)
}

/// A peer's claim of more bytes than a slot holds is clamped to the slot; the immediate comes
/// through; messages come out in order whether the ring polled their completion itself (read
/// straight from it) or the channel polled it first (read from the channel's results), and
/// every slot is re-posted either way.
#[test]
fn lengths_are_clamped_and_immediates_kept_on_both_read_paths() {
    let dev = InstantDevice::new();
    let mem = dev.region(4 * SLOT, LW);
    let (mut ring, arrivals) = ring(&dev, mem);
    assert_eq!(ring.slots(), 4);
    let lens = [0u32, 3, SLOT as u32, SLOT as u32 + 1, u32::MAX];
    for round in 0..10u32 {
        let len = lens[round as usize % lens.len()];
        assert!(arrivals.deliver(len, Some(round)));
        assert!(arrivals.deliver(len, None));
        if round % 2 == 1 {
            // The channel takes both completions first: the ring finds them in its results.
            assert_eq!(ring.channel().poll().unwrap(), 2);
        }
        for imm in [Some(round), None] {
            let m = ring.recv().unwrap();
            assert_eq!(m.data.len(), (len as usize).min(SLOT), "round {round}");
            assert_eq!((m.done.byte_len, m.done.imm), (len, imm), "round {round}");
            assert!(!m.done.written);
        }
        assert!(ring.try_recv().is_none());
        assert_eq!(
            ring.channel().outstanding_recvs(),
            4,
            "every slot posted again"
        );
        assert_eq!(
            ring.channel().counters().receives_completed,
            2 * u64::from(round + 1)
        );
    }
}

/// A ring with no message waits at most its channel's timeout, then fails, and keeps failing
/// (no hang, no message) on every later call; dropping it afterwards is clean.
#[test]
fn an_empty_ring_times_out_and_stays_broken() {
    let dev = InstantDevice::new();
    let (mut ring, arrivals) = ring(&dev, dev.region(4 * SLOT, LW));
    assert!(matches!(ring.recv(), Err(ChannelError::TimedOut { .. })));
    // The timeout flushed every receive: nothing is posted, nothing arrives any more.
    assert_eq!(ring.channel().outstanding_recvs(), 0);
    assert!(!arrivals.deliver(1, None));
    // Every later call says why, also once every slot's receive was flushed (and none is
    // posted again): the timeout, not a full receive queue.
    for _ in 0..6 {
        assert!(matches!(ring.recv(), Err(ChannelError::TimedOut { .. })));
        assert!(matches!(
            ring.try_recv(),
            Some(Err(ChannelError::TimedOut { .. }))
        ));
    }
}

/// The hand that plays a peer's RDMA write must not write memory no peer could write: a ring
/// refuses remotely writable memory precisely so that a borrowed message cannot change under
/// its reader. A hand taken before the region went into the ring used to write the slot a
/// message borrowed (undefined behaviour, which Miri reports at the second read).
#[test]
fn a_peer_hand_cannot_write_a_ring_slot_while_its_message_is_borrowed() {
    let dev = InstantDevice::new();
    let mem = dev.region(4 * SLOT, LW);
    let hand = mem.peer_hand();
    let (mut ring, arrivals) = ring(&dev, mem);
    assert!(arrivals.deliver(8, None));
    let m = ring.recv().unwrap();
    assert_eq!(m.data, &[0; 8]);
    // The hand stores only at 8-aligned addresses, and the allocation's alignment is the
    // allocator's (Miri's may be 1): one of the first eight offsets is aligned, and inside
    // the borrowed slot.
    let wrote = (0..8).find(|&at| hand.store_u64(at, u64::MAX));
    assert_eq!(
        wrote, None,
        "a peer's write into memory without remote write access"
    );
    assert_eq!(m.data, &[0; 8], "a borrowed message changed");
}

/// A hand over memory a peer may write does write it.
#[test]
fn a_peer_hand_writes_remotely_writable_memory() {
    let dev = InstantDevice::new();
    for (access, value, what) in [
        (AccessFlags::REMOTE_WRITE, 7, "a writable region"),
        (AccessFlags::REMOTE_ATOMIC, 9, "an atomic region"),
    ] {
        let mem = dev.region(64, LW | access);
        let hand = mem.peer_hand();
        // The first 8-aligned offset (the allocator's alignment, which may be 1 under Miri).
        let at = (0..8).find(|&at| hand.store_u64(at, value)).expect(what);
        assert_eq!(mem.load_u64(at), Some(value), "{what}");
    }
}

/// An instant queue pair routed through shared completion queues.
type Routed = RoutedQp<InstantQp, InstantCq>;

/// Two queue pairs of `dev` (eight sends and eight receives each) routed through one pair of
/// completion queues ([`SharedCqs`]), each with its arrivals, in the order they were added.
fn two_on_shared_queues(dev: &InstantDevice) -> (SharedCqs<InstantCq>, [(Routed, Arrivals); 2]) {
    let (scq, rcq) = (dev.cq(64), dev.cq(64));
    let cq_caps = QpCaps {
        max_send_wr: 8,
        max_recv_wr: 8,
        ..caps()
    };
    let (qa, qb) = (dev.qp(&scq, &rcq, cq_caps), dev.qp(&scq, &rcq, cq_caps));
    let (arr_a, arr_b) = (qa.arrivals(), qb.arrivals());
    let shared = SharedCqs::new(scq, rcq, 2);
    let a = shared.add(qa).map_err(|(_, e)| e).unwrap();
    let b = shared.add(qb).map_err(|(_, e)| e).unwrap();
    (shared, [(a, arr_a), (b, arr_b)])
}

/// Two rings on queue pairs that share one receive completion queue (routed,
/// [`SharedCqs`](rverbs_core::provider::shared::SharedCqs)): each ring's one-completion poll
/// may meet the other's messages first; none is lost, handed twice or to the wrong ring, and
/// each ring's come out in order with their immediates. Then one ring waits while the other
/// queue pair's messages keep arriving: its wait still ends at its timeout.
#[test]
fn rings_on_a_shared_receive_queue_keep_their_own_messages_in_order() {
    let dev = InstantDevice::new();
    let (_shared, [(qa, arr_a), (qb, arr_b)]) = two_on_shared_queues(&dev);
    let cfg = ChannelConfig::with_timeout(TIMEOUT);
    let chan = |qp| Channel::new(qp, cfg, &CLOCK);
    let mut a = RecvRing::new(chan(qa), dev.region(4 * SLOT, LW), SLOT).unwrap();
    let mut b = RecvRing::new(chan(qb), dev.region(4 * SLOT, LW), SLOT).unwrap();
    let (mut next_a, mut next_b) = (0u32, 1000u32);
    for round in 0..12u32 {
        // Interleaved in the shared queue, A's first or B's first by turns.
        let order: [bool; 5] = if round % 2 == 0 {
            [true, false, true, false, true]
        } else {
            [false, true, false, true, true]
        };
        let (mut ka, mut kb) = (0, 0);
        for to_a in order {
            if to_a {
                assert!(arr_a.deliver(5, Some(next_a + ka)));
                ka += 1;
            } else {
                assert!(arr_b.deliver(SLOT as u32 + 9, Some(next_b + kb)));
                kb += 1;
            }
        }
        // Odd rounds: A's channel polls first (the mailboxes hand it only its own).
        if round % 2 == 1 {
            a.channel().poll().unwrap();
        }
        for k in 0..3 {
            let m = a.recv().unwrap();
            assert_eq!(
                (m.data.len(), m.done.imm),
                (5, Some(next_a + k)),
                "round {round}"
            );
        }
        for k in 0..2 {
            let m = b.recv().unwrap();
            assert_eq!(
                (m.data.len(), m.done.imm),
                (SLOT, Some(next_b + k)),
                "round {round}"
            );
        }
        assert!(
            a.try_recv().is_none() && b.try_recv().is_none(),
            "round {round}"
        );
        next_a += 3;
        next_b += 2;
    }
    let (ca, cb) = (a.channel().counters(), b.channel().counters());
    assert_eq!((ca.receives_completed, cb.receives_completed), (36, 24));
    // A waits for nothing while B's messages keep coming: the wait ends at its timeout.
    for _ in 0..4 {
        assert!(arr_b.deliver(1, Some(7)));
    }
    assert!(matches!(a.recv(), Err(ChannelError::TimedOut { .. })));
    for _ in 0..4 {
        assert_eq!(b.recv().unwrap().done.imm, Some(7), "B's messages intact");
    }
}

/// The shared queues' try-lock is a guard: a panic in the callback `poll_shared` runs while
/// it holds the lock (the caller's code) releases it, so the other queue pairs on the queues
/// go on; a lock left held would make every later poll find the queues busy and see nothing
/// (each channel's wait would end only at its timeout).
#[test]
fn a_panic_inside_the_shared_queues_lock_leaves_them_unlocked() {
    use core::panic::AssertUnwindSafe;
    use rverbs_core::provider::{Provider, QueuePair};
    use std::panic::catch_unwind;
    let dev = InstantDevice::new();
    let (_shared, [(mut a, arr_a), (b, arr_b)]) = two_on_shared_queues(&dev);
    let cfg = ChannelConfig::with_timeout(TIMEOUT);
    let mut ring_b = RecvRing::new(Channel::new(b, cfg, &CLOCK), dev.region(64, LW), SLOT).unwrap();
    let wr = rverbs_core::wr::RecvRequest {
        wr_id: 1,
        sges: &[],
    };
    // SAFETY: names no memory.
    unsafe { a.post_recv(core::slice::from_ref(&wr)) }.unwrap();
    assert!(arr_a.deliver(0, None));
    assert!(arr_b.deliver(3, Some(11)));
    let r = catch_unwind(AssertUnwindSafe(|| {
        let _ = a.poll_shared(&mut |_| panic!("the caller's callback fails"));
    }));
    assert!(r.is_err(), "the callback ran (A had a completion to name)");
    // B's message is still reachable, and new ones keep coming.
    assert_eq!(ring_b.recv().unwrap().done.imm, Some(11));
    assert!(arr_b.deliver(3, Some(12)));
    assert_eq!(ring_b.recv().unwrap().done.imm, Some(12));
    // And A's own completion waits in its mailbox.
    let mut wc = [rverbs_core::completion::Completion::EMPTY; 2];
    assert_eq!(a.poll_recv(&mut wc).unwrap(), 1);
    assert_eq!(wc[0].wr_id, 1);
}

/// A caller's own `take` ([`Provider::poll_shared_with`](rverbs_core::provider::Provider)
/// is public) that panics must not lose a completion that was not its own: the take is
/// offered every queue pair's completions (it must refuse those of queue pairs it does not
/// own), so the one it panics on may be a neighbour's. Lost, the neighbour's receive never
/// completes: its wait times out, and dropping its channel waits for a flush the device
/// can no longer give, then aborts the process (fatal: "the device did not flush"). Here
/// the lost receive's channel is forgotten instead, so a failure fails this test only.
#[test]
fn a_callers_take_that_panics_on_a_neighbours_completion_does_not_lose_it() {
    use core::panic::AssertUnwindSafe;
    use rverbs_core::provider::Provider;
    use std::panic::catch_unwind;
    let dev = InstantDevice::new();
    let (_shared, [(mut a, _arr_a), (b, arr_b)]) = two_on_shared_queues(&dev);
    let cfg = ChannelConfig::with_timeout(TIMEOUT);
    let mut ring_b = RecvRing::new(Channel::new(b, cfg, &CLOCK), dev.region(64, LW), SLOT).unwrap();
    assert!(arr_b.deliver(3, Some(11)));
    let r = catch_unwind(AssertUnwindSafe(|| {
        let _ = a.poll_shared_with(
            &mut |_, _, _| panic!("the caller's take fails"),
            &mut |_| false,
        );
    }));
    assert!(r.is_err(), "the take was offered B's completion");
    let got = ring_b.recv().map(|m| m.done.imm);
    if got.is_err() {
        // Its receive is gone: a drop would wait for its flush and then abort.
        core::mem::forget(ring_b);
    }
    assert_eq!(got.ok(), Some(Some(11)), "B's message survives A's take");
}
