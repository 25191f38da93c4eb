//! A node's message path on the instant device (issue #25's review): the path `tools/cost`
//! measures as `node_message`, where each completion of the shared queues is routed while
//! the device's queue is positioned on it (`CompletionQueue::poll_each`, read into memory
//! the read writes whole), a ring head is claimed inside that poll, delivered, and its slot
//! re-posted checking only the receive accounting, and a send after `send_room(1)` does not
//! look for room again. The soft model's queues take the default `poll_each` (a scratch
//! array), so only a device queue runs this code; the instant device is one Miri can run.
//! Adversarial: handlers that panic, budgets of 0 and 1, immediates that lie, timestamps,
//! a direct poll of a node's channel, a channel swapped out and back between calls.
//! Run under Miri in CI (tools/test-all) like the other instant tests.

use core::panic::AssertUnwindSafe;
use core::time::Duration;
use std::panic::catch_unwind;

use rverbs_core::barrier::BarrierAlgorithm;
use rverbs_core::channel::{Channel, ChannelConfig, ChannelError};
use rverbs_core::instant::{Arrivals, InstantCq, InstantDevice, InstantQp, InstantRegion};
use rverbs_core::memory::AccessFlags;
use rverbs_core::node::{Components, Event, Node, NodeError, NodeParts};
use rverbs_core::params::QpCaps;
use rverbs_core::poll::{Spin, StepClock};
use rverbs_core::provider::shared::{RoutedQp, SharedCqs};
use rverbs_core::sge::RemoteMemory;
use rverbs_core::wire::FlagLayout;

static CLOCK: StepClock = StepClock::new(Duration::from_micros(1));

const RW: AccessFlags = AccessFlags::LOCAL_WRITE.union(AccessFlags::REMOTE);
const LW: AccessFlags = AccessFlags::LOCAL_WRITE;
const SLOTS: usize = 4;
const SLOT: usize = 16;

type Routed = RoutedQp<InstantQp, InstantCq>;
type InstantNode = Node<Routed, InstantRegion, Spin>;

fn caps(send: u32) -> QpCaps {
    QpCaps {
        max_send_wr: send,
        max_recv_wr: 8,
        max_send_sge: 1,
        max_recv_sge: 1,
        max_inline_data: 64,
    }
}

/// Rank 0 of a world of `world` on `dev`: one queue pair per peer (send queues of `send`
/// entries) on one pair of shared queues (with timestamps if asked), messaging started
/// with rings of [`SLOTS`] slots of [`SLOT`] bytes; each peer's arrivals, by position; and
/// one spare queue pair on the same queues (a channel to swap in).
fn node(
    dev: &InstantDevice,
    world: u32,
    send: u32,
    timestamps: bool,
) -> (InstantNode, Vec<Arrivals>, Channel<Routed, Spin>) {
    let peers = world as usize - 1;
    let cq = |n| {
        if timestamps {
            dev.cq_with_timestamps(n)
        } else {
            dev.cq(n)
        }
    };
    let (scq, rcq) = (cq(64), cq(64));
    let qps: Vec<InstantQp> = (0..=peers)
        .map(|_| dev.qp(&scq, &rcq, caps(send)))
        .collect();
    let mut arrivals: Vec<Arrivals> = qps.iter().map(|q| q.arrivals()).collect();
    arrivals.truncate(peers);
    let shared = SharedCqs::new(scq, rcq, peers + 1);
    let cfg = |rank| {
        let mut cfg = ChannelConfig::with_timeout(Duration::from_micros(200));
        cfg.rank = Some(rank);
        cfg
    };
    let mut channels = Vec::new();
    for (qp, rank) in qps.into_iter().zip(1..) {
        let routed = shared.add(qp).map_err(|(_, e)| e).expect("route");
        channels.push(Channel::with_backoff(routed, cfg(rank), Spin, &CLOCK));
    }
    let spare = channels.pop().expect("the spare");
    let flags = dev.region(FlagLayout::new(world).len(), RW);
    let size = FlagLayout::new(world).len();
    let remotes: Vec<RemoteMemory> = (0..world).map(|_| dev.region(size, RW).remote()).collect();
    let mut node = Node::from_parts(NodeParts {
        rank: 0,
        world,
        channels,
        flags,
        window: dev.region(64, RW),
        peer_flags: remotes.clone(),
        peer_windows: remotes,
        algorithm: BarrierAlgorithm::Dissemination,
        backoff: Spin,
        clock: &CLOCK,
        timeout: Duration::from_micros(200),
        components: Components::default(),
    })
    .expect("node");
    node.start_messaging_in(dev.region(peers * SLOTS * SLOT, LW), SLOTS, SLOT)
        .expect("messaging");
    (node, arrivals, spare)
}

/// The length a peer's `n`-th message claims (1 to 15 bytes: each message told apart by
/// it, as the instant device writes no payload), and a length that lies (longer than a slot)
/// every 7th.
fn len_of(n: u32) -> (u32, usize) {
    let l = n % 15 + 1;
    if n % 7 == 3 {
        (u32::MAX - n, SLOT)
    } else {
        (l, l as usize)
    }
}

/// What a peer's immediate says (its credit return to us): sometimes the truth (0: it
/// consumed nothing, as we send nothing), sometimes a lie, sometimes none.
fn imm_of(n: u32) -> Option<u32> {
    match n % 4 {
        0 => None,
        1 => Some(0),
        2 => Some(u32::MAX - n),
        _ => Some(n.wrapping_mul(0x9e37_79b9)),
    }
}

/// Messages from two peers interleaved, handed to handlers that panic now and then and
/// with budgets of 0, 1, 2 and 64: every message reaches a handler exactly once, in its
/// peer's order, as the rank that sent it, with its length clamped to the slot; every slot
/// comes back to its ring (a receive never outstanding twice, never more than the ring
/// holds), and no channel is reported failed. On shared queues with and without
/// timestamps (the two instances of the device's in-place read).
#[test]
fn every_message_is_handed_once_in_order_through_panics_and_small_budgets() {
    for timestamps in [false, true] {
        let dev = InstantDevice::new();
        let (mut node, arrivals, _spare) = node(&dev, 3, 8, timestamps);
        let mut sent = [0u32; 2];
        let mut got: [Vec<usize>; 2] = [Vec::new(), Vec::new()];
        let mut expected: [Vec<usize>; 2] = [Vec::new(), Vec::new()];
        let mut handed_total = 0usize;
        let mut calls = 0u32;
        for round in 0..40u32 {
            // Up to three messages from each peer, interleaved, as far as its ring has
            // receives posted.
            for k in 0..6u32 {
                let p = ((round + k) % 2) as usize;
                if (round * 7 + k) % 5 == 4 {
                    continue;
                }
                let (claim, len) = len_of(sent[p]);
                if arrivals[p].deliver(claim, imm_of(sent[p])) {
                    expected[p].push(len);
                    sent[p] += 1;
                }
            }
            let budget = [0usize, 1, 2, 64][(round % 4) as usize];
            // A handler that panics on every 5th message it is handed (after noting it: a
            // message handed to a panicking handler was delivered).
            let mut seen = 0usize;
            let r = catch_unwind(AssertUnwindSafe(|| {
                node.progress(budget, |e| match e {
                    Event::Message { rank, data } => {
                        let p = rank as usize - 1;
                        got[p].push(data.len());
                        seen += 1;
                        calls += 1;
                        if calls.is_multiple_of(5) {
                            panic!("the handler fails");
                        }
                    }
                    Event::Failed { rank, error } => panic!("rank {rank} failed: {error:?}"),
                    _ => {}
                })
            }));
            if let Ok(r) = &r {
                let n = r.as_ref().expect("progress");
                assert!(*n <= budget, "round {round}: {n} events for {budget}");
            }
            handed_total += seen;
            for rank in 1..=2 {
                let c = node.channel(rank).unwrap();
                assert!(c.fault().is_none(), "round {round}: rank {rank}");
                assert!(
                    c.outstanding_recvs() <= SLOTS as u64,
                    "round {round}: rank {rank} has {} receives out",
                    c.outstanding_recvs()
                );
            }
        }
        // Drain what budgets left behind (a panicking handler's slot is re-posted first).
        for _ in 0..20 {
            let r = catch_unwind(AssertUnwindSafe(|| {
                node.progress(64, |e| {
                    if let Event::Message { rank, data } = e {
                        got[rank as usize - 1].push(data.len());
                    }
                })
            }));
            assert!(r.is_ok_and(|r| r.is_ok()));
        }
        assert!(handed_total > 0);
        for p in 0..2 {
            assert_eq!(got[p], expected[p], "peer {p} (timestamps {timestamps})");
            let c = node.channel(p as u32 + 1).unwrap();
            assert_eq!(
                c.outstanding_recvs(),
                SLOTS as u64,
                "every slot back in the ring"
            );
        }
    }
}

/// Sends (each after `send_room(1)`, which the post then trusts) and the credit writes the
/// node makes on its own, on a small send queue, with a peer that returns credit generously
/// and sometimes lies: the channel never has more requests outstanding than its send queue
/// holds less the drain request's entry, whatever the order of sends, deliveries and
/// direct polls of the channel.
#[test]
fn a_send_after_send_room_never_overfills_the_send_queue() {
    for send in [3u32, 4, 8] {
        let dev = InstantDevice::new();
        let (mut node, arrivals, _spare) = node(&dev, 2, send, false);
        let depth = u64::from(send - 1);
        let mut ours = 0u32;
        let mut refused = 0u32;
        let mut posted = 0u32;
        let data = [7u8; 8];
        let check = |node: &mut InstantNode, at: &str| {
            let c = node.channel(1).unwrap();
            assert!(
                c.outstanding_sends() <= depth,
                "send queue of {send}: {} outstanding {at}",
                c.outstanding_sends()
            );
        };
        for round in 0..60u32 {
            for _ in 0..(round % 5) {
                match node.post_send_inline(1, &data) {
                    Ok(_) => posted += 1,
                    Err(NodeError::WouldBlock { .. }) => refused += 1,
                    Err(e) => panic!("send {round}: {e:?}"),
                }
                check(&mut node, "after a send");
            }
            // The peer's messages: its immediates return credit (what we posted, or a lie).
            if round % 3 != 2 {
                let imm = if round % 4 == 1 {
                    u32::MAX - round
                } else {
                    posted
                };
                if arrivals[0].deliver(4, Some(imm)) {
                    ours += 1;
                }
            }
            if round % 6 == 5 {
                let _ = node.channel(1).unwrap().poll();
                check(&mut node, "after a direct poll");
            }
            node.progress(1 + (round % 3) as usize, |e| {
                if let Event::Failed { rank, error } = e {
                    panic!("rank {rank} failed: {error:?}");
                }
            })
            .expect("progress");
            check(&mut node, "after progress");
        }
        // The scenario reaches its edges: sends refused (no credit, or no room), and credit
        // returns the node wrote on its own.
        assert!(
            posted > 0 && ours > 0 && refused > 0 && node.credit_writes() > 0,
            "sent {posted}, refused {refused}, received {ours}, {} credit writes",
            node.credit_writes()
        );
    }
}

/// A claimed head the budget left for a later call, then the peer's channel swapped out
/// for another on the same shared queues before that call, and back after it: the head is
/// never read from (nor its slot re-posted on) a channel that is not its ring's; the swap
/// is reported once as `Replaced`; no message is handed twice.
#[test]
fn a_head_left_over_is_not_delivered_on_a_channel_swapped_in() {
    let dev = InstantDevice::new();
    let (mut node, arrivals, mut spare) = node(&dev, 2, 8, false);
    assert!(arrivals[0].deliver(3, None));
    assert!(arrivals[0].deliver(5, None));
    let mut got = Vec::new();
    let mut failed = Vec::new();
    let mut handler = |e: Event<'_>| match e {
        Event::Message { data, .. } => got.push(data.len()),
        Event::Failed { error, .. } => failed.push(error),
        _ => {}
    };
    // Both heads claimed by the poll; one delivered, one left (retired on its channel).
    assert_eq!(node.progress(1, &mut handler).unwrap(), 1);
    core::mem::swap(node.channel(1).unwrap(), &mut spare);
    let _ = node.progress(64, &mut handler);
    let _ = node.progress(64, &mut handler);
    core::mem::swap(node.channel(1).unwrap(), &mut spare);
    for _ in 0..4 {
        let _ = node.progress(64, &mut handler);
    }
    assert!(got.len() <= 2 && got.first() == Some(&3), "{got:?}");
    if got.len() == 2 {
        assert_eq!(got[1], 5);
    }
    assert!(
        matches!(failed.as_slice(), [ChannelError::Replaced]),
        "the swap reported once: {failed:?}"
    );
    // The spare got none of the ring's receives.
    assert_eq!(spare.outstanding_recvs(), 0);
}

/// Random interleavings (seeded) of what safe code can do around `progress`: three peers'
/// messages with lying lengths and immediates, direct polls of the node's channels, budgets
/// of 0 to 64, handlers that panic, sends after `send_room(1)`, and a channel swapped out
/// for another on the same shared queues and back (both polled meanwhile, no `progress`
/// between): every message reaches a handler exactly once, in its peer's order; no channel
/// fails; no ring ever has more receives out than slots, and all are back at the end; no
/// send queue holds more than its depth. 200 seeds natively (3000 were run once, in
/// debug, for the review: none failed), 2 under Miri.
#[test]
fn random_interleavings_hand_every_message_once_in_order() {
    let seeds = if cfg!(miri) { 1..3u64 } else { 1..200u64 };
    for seed in seeds {
        let mut s = seed.wrapping_mul(0x9e3779b97f4a7c15);
        let mut rnd = move |n: u64| {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            s % n
        };
        let dev = InstantDevice::new();
        let (mut node, arrivals, mut spare) = node(&dev, 4, 8, seed % 2 == 0);
        let mut sent = [0u32; 3];
        let mut got: [Vec<usize>; 3] = Default::default();
        let mut expected: [Vec<usize>; 3] = Default::default();
        let mut calls = 0u64;
        for step in 0..300 {
            match rnd(8) {
                6 => {
                    // Swapped out and back, polled on both sides meanwhile, no progress.
                    let r = rnd(3) as u32 + 1;
                    core::mem::swap(node.channel(r).unwrap(), &mut spare);
                    let _ = spare.poll();
                    let _ = node.channel(r).unwrap().poll();
                    core::mem::swap(node.channel(r).unwrap(), &mut spare);
                }
                7 => {
                    let r = rnd(3) as u32 + 1;
                    match node.post_send_inline(r, &[1, 2, 3]) {
                        Ok(_) | Err(NodeError::WouldBlock { .. }) => {}
                        Err(e) => panic!("seed {seed} step {step}: send {e:?}"),
                    }
                    let c = node.channel(r).unwrap();
                    assert!(c.outstanding_sends() <= 7, "seed {seed} step {step}");
                }
                0..=2 => {
                    let p = rnd(3) as usize;
                    let (claim, len) = len_of(sent[p]);
                    if arrivals[p].deliver(claim, imm_of(sent[p])) {
                        expected[p].push(len);
                        sent[p] += 1;
                    }
                }
                3 => {
                    let r = rnd(3) as u32 + 1;
                    let _ = node.channel(r).unwrap().poll();
                }
                _ => {
                    let budget = [0usize, 1, 2, 3, 64][rnd(5) as usize];
                    let panic_at = rnd(4);
                    let r = catch_unwind(AssertUnwindSafe(|| {
                        node.progress(budget, |e| match e {
                            Event::Message { rank, data } => {
                                got[rank as usize - 1].push(data.len());
                                calls += 1;
                                if calls % 4 == panic_at {
                                    panic!("handler");
                                }
                            }
                            Event::Failed { rank, error } => panic!("FAILED {rank} {error:?}"),
                            _ => {}
                        })
                    }));
                    if let Ok(r) = r {
                        let n = r.unwrap_or_else(|e| panic!("seed {seed} step {step}: {e:?}"));
                        assert!(n <= budget);
                    }
                }
            }
            for r in 1..=3 {
                let c = node.channel(r).unwrap();
                assert!(c.fault().is_none(), "seed {seed} step {step}");
                assert!(c.outstanding_recvs() <= SLOTS as u64);
            }
        }
        for _ in 0..30 {
            let _ = catch_unwind(AssertUnwindSafe(|| {
                node.progress(64, |e| {
                    if let Event::Message { rank, data } = e {
                        got[rank as usize - 1].push(data.len());
                    }
                })
            }));
        }
        for p in 0..3 {
            assert_eq!(got[p], expected[p], "seed {seed} peer {p}");
            assert_eq!(
                node.channel(p as u32 + 1).unwrap().outstanding_recvs(),
                SLOTS as u64,
                "seed {seed} peer {p}"
            );
        }
    }
}

/// Error completions routed as the device's queue reads them (the read's error branch, into
/// uninitialised memory, on queues with and without timestamps): a flushed receive and a
/// flushed send of one queue pair, offered to a caller's `take` and refused, then taken
/// from the mailboxes with every field the flush defines, and no timestamp; the other queue
/// pair on the queues sees none of them.
#[test]
fn flushed_completions_routed_in_place_carry_what_the_flush_says() {
    use rverbs_core::completion::{Completion, CompletionKind, WcStatus};
    use rverbs_core::provider::{Provider, QueuePair};
    use rverbs_core::sge::Sge;
    use rverbs_core::wr::{Opcode, RecvRequest, SendFlags, WorkRequest};
    for timestamps in [false, true] {
        let dev = InstantDevice::new();
        let (scq, rcq) = if timestamps {
            (dev.cq_with_timestamps(16), dev.cq_with_timestamps(16))
        } else {
            (dev.cq(16), dev.cq(16))
        };
        let (qa, qb) = (dev.qp(&scq, &rcq, caps(8)), dev.qp(&scq, &rcq, caps(8)));
        let shared = SharedCqs::new(scq, rcq, 2);
        let mut a = shared.add(qa).map_err(|(_, e)| e).unwrap();
        let mut b = shared.add(qb).map_err(|(_, e)| e).unwrap();
        let wr = RecvRequest {
            wr_id: 41,
            sges: &[],
        };
        // SAFETY: names no memory.
        unsafe { a.post_recv(core::slice::from_ref(&wr)) }.unwrap();
        a.set_error().unwrap();
        let data = [1u8; 4];
        // SAFETY: inline data, copied during the post.
        let sge = [unsafe { Sge::from_raw(data.as_ptr() as u64, 4, 0) }];
        let send = WorkRequest::new(
            Opcode::Send,
            SendFlags::INLINE | SendFlags::SIGNALED,
            &sge,
            RemoteMemory::default(),
        );
        let send = WorkRequest { wr_id: 42, ..send };
        // SAFETY: as above.
        unsafe { a.post_send(core::slice::from_ref(&send)) }.unwrap();
        let mut offered = Vec::new();
        b.poll_shared_with(
            &mut |_, recv, c: &Completion| {
                offered.push((recv, c.wr_id, c.status, c.timestamp));
                false
            },
            &mut |_| false,
        )
        .unwrap();
        assert_eq!(offered.len(), 2, "timestamps {timestamps}: {offered:?}");
        for &(_, wr_id, status, ts) in &offered {
            assert!(wr_id == 41 || wr_id == 42);
            assert_eq!((status, ts), (WcStatus::Flushed, None));
        }
        let mut wc = [Completion::EMPTY; 2];
        assert_eq!(b.poll_recv(&mut wc).unwrap(), 0, "none of them is b's");
        assert_eq!(b.poll_send(&mut wc).unwrap(), 0);
        for (recv, id) in [(true, 41u64), (false, 42)] {
            let n = if recv {
                a.poll_recv(&mut wc)
            } else {
                a.poll_send(&mut wc)
            }
            .unwrap();
            assert_eq!(n, 1);
            let c = wc[0];
            assert_eq!(
                (c.wr_id, c.status, c.qp_num, c.vendor_err, c.timestamp),
                (id, WcStatus::Flushed, a.qp_num(), 0, None)
            );
            assert_eq!(
                (c.kind, c.byte_len, c.imm),
                (CompletionKind::Other, 0, None)
            );
        }
    }
}
