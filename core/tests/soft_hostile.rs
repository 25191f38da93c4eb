//! A peer's bytes are hostile (issue 23, deliverable 3): every value a peer can write into a
//! node's flag array (barrier arrival counts, credit words, failure notices) or send it (the
//! credit return in a message's immediate) is checked against what it can legitimately be.
//! Each test forges one such value through the model, the way a peer does: an RDMA write of
//! any 8 bytes at any offset of the node's flag array, or a send with any immediate. Each
//! failed before its fix (the test names what the fix is).
#![allow(clippy::std_instead_of_core)]

use rverbs_core::node::Members;
use rverbs_core::wire::FlagLayout;
use std::time::Duration;

use rverbs_core::barrier::{BarrierAlgorithm, BarrierError};
use rverbs_core::failure::{Failure, FailureCause};
use rverbs_core::memory::AccessFlags;
use rverbs_core::model::SoftNet;
use rverbs_core::node::{soft_world_bytes, NodeError, SoftNode};
use rverbs_core::poll::{Spin, StaticClock, StepClock};
use rverbs_core::wire::notice;
use rverbs_testkit::{net, nodes};

fn clock() -> StaticClock {
    static CLOCK: StepClock = StepClock::new(Duration::from_micros(1));
    &CLOCK
}

const LONG: Duration = Duration::from_secs(3600);

fn world<'n, 'm: 'n>(
    net: &'n SoftNet<'m>,
    arena: &'m mut [u8],
    alg: BarrierAlgorithm,
) -> Vec<SoftNode<'n, Spin>> {
    nodes(net, arena, alg, clock())
}

/// Rank `from` writes `word` at byte `offset` of rank `to`'s flag array, and waits for it.
fn forge(nodes: &mut [SoftNode<'_, Spin>], from: u32, to: u32, offset: u64, word: u64) {
    let slot = nodes[to as usize].flags_remote().slice(offset, 8).unwrap();
    let c = nodes[from as usize].channel(to).unwrap();
    let t = c.post_write_inline(&word.to_le_bytes(), slot).unwrap();
    c.wait(t).unwrap();
}

/// A barrier over every rank, all started, then polled in turn until each completed.
fn all_meet(nodes: &mut [SoftNode<'_, Spin>]) {
    for n in nodes.iter_mut() {
        n.barrier_start_timeout(Members::World, LONG).unwrap();
    }
    let mut open: Vec<usize> = (0..nodes.len()).collect();
    while !open.is_empty() {
        open.retain(|&r| !nodes[r].barrier_poll().unwrap());
    }
}

/// Fix: an arrival count above what the slot's rank could have reached (our count for the
/// stage + 1) fails the barrier. Before it, `u64::MAX` completed this barrier and every
/// later one at once, without the others ever entering.
#[test]
fn a_forged_arrival_count_fails_the_barrier_instead_of_completing_it() {
    for alg in BarrierAlgorithm::ALL {
        let net = net(3);
        let mut arena = vec![0u8; soft_world_bytes(3, 64)];
        let mut nodes = world(&net, &mut arena, alg);
        all_meet(&mut nodes);
        // Rank 2 writes u64::MAX into its own slot of rank 0's flag array and into rank 1's:
        // any peer holds the array's key, so it can write another rank's slot.
        forge(&mut nodes, 2, 0, 8, u64::MAX);
        forge(&mut nodes, 2, 0, 16, u64::MAX);
        // Rank 0 alone starts the next barrier: nobody else entered it.
        let e = nodes[0]
            .barrier_start_timeout(Members::World, LONG)
            .unwrap_err();
        match e {
            NodeError::Barrier(BarrierError::ImplausibleArrival { rank, count, most }) => {
                assert!(rank == 1 || rank == 2, "{alg:?}: {e}");
                // One barrier done, the second counted: an honest peer is at 2 or 3.
                assert_eq!((count, most), (u64::MAX, 3), "{alg:?}");
            }
            e => panic!("{alg:?}: expected a forged count to be refused, got {e}"),
        }
        assert!(e.to_string().contains("forged"), "{e}");
        // The counters can no longer be trusted: no later barrier completes either.
        assert!(nodes[0].is_poisoned());
        assert!(matches!(
            nodes[0].barrier_start_timeout(Members::World, LONG),
            Err(NodeError::Barrier(BarrierError::Poisoned))
        ));
    }
}

/// The same refusal in the blocking whole-world dissemination barrier, whose start is
/// specialised (its own loop of notify and compare): a forged count fails it, and every
/// later barrier is refused.
#[test]
fn a_forged_arrival_count_fails_the_blocking_dissemination_barrier() {
    let net = net(3);
    let mut arena = vec![0u8; soft_world_bytes(3, 64)];
    let mut nodes = world(&net, &mut arena, BarrierAlgorithm::Dissemination);
    all_meet(&mut nodes);
    // Rank 0 waits for rank 2 in its first round.
    forge(&mut nodes, 1, 0, 16, u64::MAX);
    let e = nodes[0].barrier_timeout(Members::World, LONG).unwrap_err();
    assert_eq!(
        e,
        NodeError::Barrier(BarrierError::ImplausibleArrival {
            rank: 2,
            count: u64::MAX,
            most: 3
        })
    );
    assert!(nodes[0].is_poisoned());
    assert_eq!(
        nodes[0].barrier(Members::World),
        Err(NodeError::Barrier(BarrierError::Poisoned))
    );
}

/// Not a fix, the bound's other side: honest ranks are never refused, though fast ranks
/// run their next barrier (its count is ours + 1) while a slow one still polls the last,
/// with sub-groups in between.
#[test]
fn a_rank_one_barrier_ahead_is_not_taken_for_a_forger() {
    let rounds = if cfg!(miri) { 4 } else { 40 };
    // Every rank runs the script's barriers it is a member of, in order.
    let script: [&[u32]; 3] = [&[0, 1, 2, 3], &[0, 2, 3], &[1, 3]];
    for alg in BarrierAlgorithm::ALL {
        let net = net(4);
        let mut arena = vec![0u8; soft_world_bytes(4, 64)];
        let mut nodes = world(&net, &mut arena, alg);
        let mut next = [0usize; 4];
        let mut pending: [Option<&[u32]>; 4] = [None; 4];
        let mut rng = 0x9e37_79b9_7f4a_7c15u64;
        let mut ahead = 0;
        for _ in 0..1_000_000 {
            if next.iter().all(|&k| k >= rounds) && pending.iter().all(Option::is_none) {
                break;
            }
            rng ^= rng << 13;
            rng ^= rng >> 7;
            rng ^= rng << 17;
            // Rank 3 is polled one time in sixteen: the others run ahead of it.
            let r = if rng.is_multiple_of(16) {
                3
            } else {
                (rng >> 8) as usize % 3
            };
            let n = &mut nodes[r];
            if pending[r].is_none() {
                {
                    while next[r] < rounds && !script[next[r] % 3].contains(&(r as u32)) {
                        next[r] += 1;
                    }
                    if next[r] >= rounds {
                        continue;
                    }
                    let g = script[next[r] % 3];
                    next[r] += 1;
                    if r != 3 && pending[3].is_some() && next[r] > next[3] {
                        // A barrier after the one rank 3 still polls.
                        ahead += 1;
                    }
                    n.set_algorithm(alg);
                    n.barrier_start_timeout(g, LONG)
                        .unwrap_or_else(|e| panic!("{alg:?} rank {r}: {e}"));
                    pending[r] = Some(g);
                }
            }
            if n.barrier_poll()
                .unwrap_or_else(|e| panic!("{alg:?} rank {r}: {e}"))
            {
                pending[r] = None;
            }
        }
        assert!(next.iter().all(|&k| k >= rounds), "{alg:?}: {next:?}");
        assert!(pending.iter().all(Option::is_none), "{alg:?}");
        assert!(ahead > 0, "{alg:?}: no rank ever ran ahead of rank 3");
    }
}

/// Fix: a failure notice from a peer naming this node itself is ignored. No rank writes
/// one (news goes to every rank but the failed one), and taking it left the node failed for
/// good: only readmitting the named rank forgets news, and a node cannot readmit itself.
#[test]
fn a_notice_naming_the_node_itself_is_ignored() {
    let net = net(3);
    let mut arena = vec![0u8; soft_world_bytes(3, 64)];
    let mut nodes = world(&net, &mut arena, BarrierAlgorithm::Dissemination);
    let notice_at = FlagLayout::new(3).notice() as u64;
    let about = |rank, reporter| {
        notice::encode(
            &Failure {
                rank,
                cause: FailureCause::TimedOut,
                reporter,
            },
            0,
        )
        .unwrap()
    };
    // Words that are not news here (not fixes, checked already): garbage, ranks outside
    // the world, a later incarnation.
    let not_news = [
        about(0, 1),
        u64::MAX,
        about(3, 1),
        about(2, 3),
        about(u32::from(u16::MAX), 1),
        about(2, 1) | 1 << 48,
    ];
    for word in not_news {
        forge(&mut nodes, 1, 0, notice_at, word);
        assert_eq!(nodes[0].failure(), None, "{word:#x} taken for news");
        all_meet(&mut nodes);
    }
    // Real news is still heard (rank 1 tells rank 0 that rank 2 failed).
    forge(&mut nodes, 1, 0, notice_at, about(2, 1));
    assert_eq!(
        nodes[0].failure().map(|f| (f.rank, f.reporter)),
        Some((2, 1))
    );
}

/// Rank 0 posts `n` writes with immediate to rank 1 on their channel (rank 1 posts a receive
/// without buffer for each) before messaging starts: requests that consume rank 1's
/// receives, which rank 1's credit returns (counted from messaging start) never count.
fn consume_before_messaging(nodes: &mut [SoftNode<'_, Spin>], n: u64) {
    let window = nodes[0].peer_window(1).unwrap().slice(0, 1).unwrap();
    for _ in 0..n {
        let r = nodes[1].channel(0).unwrap().post_recv_empty().unwrap();
        let c = nodes[0].channel(1).unwrap();
        let t = c.post_write_imm_inline(b"x", window, 7).unwrap();
        c.wait(t).unwrap();
        nodes[1].channel(0).unwrap().wait(r).unwrap();
    }
    assert_eq!(nodes[0].channel(1).unwrap().remote_recvs_used(), n);
}

const SLOTS: usize = 2;
const BEFORE: u64 = 3;

fn start_messaging<'n>(net: &'n SoftNet<'n>, nodes: &mut [SoftNode<'n, Spin>], mem: &'n mut [u8]) {
    for (n, m) in nodes.iter_mut().zip(mem.chunks_mut(SLOTS * 16)) {
        let region = net.register(n.rank(), m, AccessFlags::LOCAL_WRITE).unwrap();
        n.start_messaging_in(region, SLOTS, 16).unwrap();
    }
}

/// Sends from rank 0 to rank 1 until it says it would block; how many went.
fn send_until_blocked(n0: &mut SoftNode<'_, Spin>) -> usize {
    let mut sent = 0;
    while n0.post_send_inline(1, b"m").is_ok() {
        sent += 1;
        assert!(sent <= 4 * SLOTS, "credit without end");
    }
    sent
}

/// Two ranks whose channel carried `BEFORE` requests before messaging started, then rank 0
/// sent until its `SLOTS` credits ran out; `then` plays what follows on them.
fn with_credit_spent_after_earlier_requests(then: impl FnOnce(&mut [SoftNode<'_, Spin>])) {
    let net = net(2);
    let mut arena = vec![0u8; soft_world_bytes(2, 64)];
    let mut mem = vec![0u8; 2 * SLOTS * 16];
    let mut nodes = world(&net, &mut arena, BarrierAlgorithm::Dissemination);
    consume_before_messaging(&mut nodes, BEFORE);
    start_messaging(&net, &mut nodes, &mut mem);
    assert_eq!(send_until_blocked(&mut nodes[0]), SLOTS);
    then(&mut nodes);
}

/// Fix: a credit word counts from messaging start, as the peer's consumed count does, so it
/// can be at most what we sent since then. Before, it was checked against everything the
/// channel ever sent: a word counting the requests from before messaging as consumed passed,
/// and bought them as extra credit.
#[test]
fn a_credit_word_counts_from_messaging_start() {
    with_credit_spent_after_earlier_requests(|nodes| {
        // Rank 1 has consumed none of them; its word says all the channel ever sent: 5, of
        // which only 2 were sent since messaging started.
        let all = BEFORE + SLOTS as u64;
        forge(
            nodes,
            1,
            0,
            FlagLayout::new(2).credits(1).unwrap() as u64,
            all,
        );
        assert_eq!(
            send_until_blocked(&mut nodes[0]),
            0,
            "the word bought credit"
        );
        assert!(matches!(
            nodes[0].post_send_inline(1, b"m"),
            Err(NodeError::WouldBlock { rank: 1 })
        ));
    });
}

/// The same fix for the credit return a message's immediate carries.
#[test]
fn a_piggybacked_credit_return_counts_from_messaging_start() {
    with_credit_spent_after_earlier_requests(|nodes| {
        // Rank 1 sends on its channel directly: its immediate says 5 consumed.
        let all = (BEFORE + SLOTS as u64) as u32;
        let c = nodes[1].channel(0).unwrap();
        let t = c.post_send_imm_inline(b"r", all).unwrap();
        c.wait(t).unwrap();
        let mut got = 0;
        for _ in 0..64 {
            nodes[0]
                .progress(8, |e| {
                    if matches!(e, rverbs_core::node::Event::Message { .. }) {
                        got += 1;
                    }
                })
                .unwrap();
        }
        assert_eq!(got, 1, "the message itself is delivered");
        assert_eq!(
            send_until_blocked(&mut nodes[0]),
            0,
            "the immediate bought credit"
        );
    });
}
