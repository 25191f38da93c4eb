//! Credit returns on the software model: traffic both ways carries them (no credit writes
//! at all), a one-way stream needs one write per half of the credits, and either way no
//! send finds its receiver without a buffer.
#![allow(clippy::std_instead_of_core)]

use std::cell::Cell;
use std::time::Duration;

use rverbs_core::memory::AccessFlags;
use rverbs_core::model::{SoftNet, SoftNetConfig};
use rverbs_core::node::{soft_world_bytes, Event, NodeError, PeerCounters, Receive};
use rverbs_core::params::QpCaps;
use rverbs_core::poll::{StaticClock, StepClock};

const SLOTS: usize = 4;
const SLOT: usize = 16;
const ROUNDS: u32 = if cfg!(miri) { 20 } else { 400 };

fn clock() -> StaticClock {
    static CLOCK: StepClock = StepClock::new(Duration::from_micros(1));
    &CLOCK
}

fn caps() -> QpCaps {
    QpCaps::queues(16, 16)
}

/// What one run saw.
#[derive(Debug)]
struct Run {
    /// Credit writes of rank 0 and rank 1.
    credit_writes: [u64; 2],
    /// Sends refused for lack of credit.
    would_block: u64,
    /// RNR retries the model counted.
    rnr: u64,
    /// Rank 1's counters of rank 0, and rank 0's of rank 1.
    counters: [PeerCounters; 2],
}

/// Two ranks; rank 1 sends `ROUNDS` numbered messages to rank 0, which answers each one
/// if `answer` (a ping-pong), or not at all (a one-way stream, into a receiver that
/// polls a quarter as often as the sender posts).
fn run(receive: Receive, answer: bool) -> Run {
    let net = SoftNet::new(SoftNetConfig::new(2, caps()));
    let mut arena = vec![0u8; soft_world_bytes(2, 64)];
    let slots = match receive {
        Receive::Shared { slots } => slots as usize,
        _ => SLOTS,
    };
    let mut mem = vec![0u8; 2 * slots * SLOT];
    let mut nodes = rverbs_testkit::nodes(&net, &mut arena, receive, clock());
    for (n, m) in nodes.iter_mut().zip(mem.chunks_mut(slots * SLOT)) {
        let region = net.register(n.rank(), m, AccessFlags::LOCAL_WRITE).unwrap();
        n.start_messaging_in(region, slots, SLOT).unwrap();
    }
    let (mut sent, mut answered) = (0u32, 0u32);
    let got = [Cell::new(0u32), Cell::new(0u32)];
    let mut would_block = 0;
    let mut steps = 0u32;
    while got[0].get() < ROUNDS || (answer && got[1].get() < ROUNDS) {
        steps += 1;
        assert!(steps < 1_000_000, "no progress: {got:?}");
        // Rank 1 sends while it may: in a ping-pong only once the last answer came.
        // A stream's sender tries twice per step.
        for _ in 0..if answer { 1 } else { 2 } {
            if sent < ROUNDS && (!answer || got[1].get() == sent) {
                match nodes[1].post_send_inline(0, &sent.to_le_bytes()) {
                    Ok(_) => sent += 1,
                    Err(NodeError::WouldBlock { .. }) => would_block += 1,
                    Err(e) => panic!("rank 1: {e}"),
                }
            }
        }
        if answer && answered < got[0].get() {
            match nodes[0].post_send_inline(1, &answered.to_le_bytes()) {
                Ok(_) => answered += 1,
                Err(NodeError::WouldBlock { .. }) => would_block += 1,
                Err(e) => panic!("rank 0: {e}"),
            }
        }
        for (r, node) in nodes.iter_mut().enumerate() {
            if r == 0 && !answer && !steps.is_multiple_of(4) {
                continue; // a stream's receiver is slower than its sender
            }
            node.progress(8, |ev| match ev {
                Event::Message { rank, data } => {
                    assert_eq!(rank as usize, 1 - r);
                    let seq = u32::from_le_bytes(data.try_into().unwrap());
                    assert_eq!(seq, got[r].get(), "rank {r}: out of order");
                    got[r].set(seq + 1);
                }
                Event::SendsCompleted { .. } => {}
                other => panic!("rank {r}: unexpected {other:?}"),
            })
            .unwrap();
        }
    }
    Run {
        credit_writes: [nodes[0].credit_writes(), nodes[1].credit_writes()],
        would_block,
        rnr: (0..2).map(|n| net.stats(n).rnr_retries).sum(),
        counters: [
            nodes[1].peer_counters(0).unwrap(),
            nodes[0].peer_counters(1).unwrap(),
        ],
    }
}

#[test]
fn a_ping_pong_carries_every_credit_return_and_writes_none() {
    for receive in [Receive::PerPeer, Receive::Shared { slots: 4 }] {
        let r = run(receive, true);
        eprintln!("ping-pong, {receive:?}: {r:?}");
        assert_eq!(r.credit_writes, [0, 0], "{receive:?}");
        assert_eq!(r.would_block, 0, "{receive:?}: a ping-pong never runs dry");
        assert_eq!(r.rnr, 0, "{receive:?}");
        let n = u64::from(ROUNDS);
        for c in r.counters {
            assert_eq!(
                (c.messages_sent, c.messages_received),
                (n, n),
                "{receive:?}: {c:?}"
            );
            assert_eq!(c.credits_refused, 0, "{receive:?}: {c:?}");
            assert!(c.channel.requests_posted >= n, "{receive:?}: {c:?}");
            assert_eq!((c.channel.timed_out, c.failed), (false, None), "{c:?}");
        }
    }
}

#[test]
fn a_one_way_stream_returns_credits_by_write_every_half_of_them() {
    for receive in [Receive::PerPeer, Receive::Shared { slots: 4 }] {
        let r = run(receive, false);
        eprintln!("one way, {receive:?}: {r:?}");
        // The receiver writes at most once per SLOTS / 2 messages consumed (once per call
        // that consumed that many), and at least once per SLOTS; the sender never writes.
        let (n, slots) = (u64::from(ROUNDS), SLOTS as u64);
        let w = r.credit_writes[0];
        assert!(
            w >= n / slots && w <= n / (slots / 2),
            "{receive:?}: {w} writes"
        );
        assert_eq!(r.credit_writes[1], 0, "{receive:?}");
        assert!(r.would_block > 0, "{receive:?}: the stream never waited");
        assert_eq!(r.rnr, 0, "{receive:?}");
        // The operator's view says the same: every refusal was for credit, every message
        // sent was received, and the receiver's credit writes are requests on its channel.
        let [sender, receiver] = r.counters;
        assert_eq!(
            sender.credits_refused, r.would_block,
            "{receive:?}: {sender:?}"
        );
        assert_eq!((sender.messages_sent, receiver.messages_received), (n, n));
        assert_eq!((receiver.messages_sent, sender.messages_received), (0, 0));
        assert!(
            receiver.channel.requests_posted >= w,
            "{receive:?}: {receiver:?}"
        );
    }
}
