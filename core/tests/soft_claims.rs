//! A node's ring heads claimed from the shared poll (issue #25, sixth round): `progress`
//! delivers a successful receive at the head of its peer's ring straight from the poll's
//! completion, and sends everything else to the channel and the slower path. These tests
//! pin what that fast path must never do: deliver for a channel swapped out, read a slot
//! whose own receive has not completed (a caller's receive posted on a node channel takes a
//! message meant for no ring), lose or repeat a message when a handler panics between
//! claimed heads, hand out more events than the budget, or report a peer's failure twice
//! when its flushed receives come back. Run under Miri in CI (tools/test-all).
//!
//! The tests from `a_claimed_head_left_over_is_not_retired_on_a_channel_swapped_in` on are
//! the adversarial review of the same fast path (issue #25, msg26): sequences of public
//! calls that try to make `progress` count a receive on the wrong channel, read a slot whose
//! receive has not completed, or stop serving every peer because one broke. Each failed
//! before its fix (see the commit that added it).
#![allow(clippy::std_instead_of_core)]

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::time::Duration;

use rverbs_core::barrier::BarrierAlgorithm;
use rverbs_core::channel::ChannelError;
use rverbs_core::memory::AccessFlags;
use rverbs_core::node::{soft_world_bytes, Event, NodeError};
use rverbs_testkit::clock;
use rverbs_testkit::{assert_messages_flow_in_order, messaging_world, net, nodes};

const STEP: Duration = Duration::from_micros(1);
const SLOTS: usize = 4;
const SLOT: usize = 32;

/// Everything `progress` hands out: (rank, payload) per message, (rank, error) per failure,
/// and the count of events per call where [`progress`] made the calls.
#[derive(Debug, Default, PartialEq)]
struct Seen {
    messages: Vec<(u32, Vec<u8>)>,
    failed: Vec<(u32, ChannelError)>,
    per_call: Vec<usize>,
}

impl Seen {
    fn handler(&mut self) -> impl FnMut(Event<'_>) + '_ {
        |ev| match ev {
            Event::Message { rank, data } => self.messages.push((rank, data.to_vec())),
            Event::Failed { rank, error } => self.failed.push((rank, error)),
            _ => {}
        }
    }
}

/// `calls` calls of `progress` with `budget` on `node`, everything they hand out in `seen`.
fn progress<'n>(
    node: &mut rverbs_core::node::SoftNode<'n, rverbs_core::poll::Spin>,
    budget: usize,
    calls: usize,
    seen: &mut Seen,
) {
    for _ in 0..calls {
        let n = node.progress(budget, seen.handler()).unwrap();
        seen.per_call.push(n);
    }
}

/// A completion of a channel that a caller swapped out of its position (`Node::channel`
/// hands out `&mut Channel`) is never delivered from the ring: the poll offers it only to
/// the channel placed there, and the ring's channel identity no longer matches, so both
/// peers are reported replaced, once each, and no message is read from either ring.
#[test]
fn a_completion_for_a_swapped_channel_is_not_delivered() {
    messaging_world!(let net, nodes = 3, SLOTS, SLOT, clock!(STEP));
    // The control: without a swap the message is claimed and delivered.
    nodes[1].post_send_inline(0, b"first").unwrap();
    let mut seen = Seen::default();
    progress(&mut nodes[0], 8, 4, &mut seen);
    assert_eq!(seen.messages, [(1, b"first".to_vec())]);
    // Rank 1's message completes at rank 0 after rank 0 swapped its channels to ranks 1
    // and 2.
    nodes[1].post_send_inline(0, b"second").unwrap();
    {
        let mut chans = nodes[0].multi().channels();
        let (a, b) = (chans.next().unwrap(), chans.next().unwrap());
        std::mem::swap(a, b);
    }
    let mut seen = Seen::default();
    progress(&mut nodes[0], 8, 64, &mut seen);
    assert!(seen.messages.is_empty(), "{seen:?}");
    let mut failed = seen.failed.clone();
    failed.sort_by_key(|f| f.0);
    assert_eq!(
        failed,
        [(1, ChannelError::Replaced), (2, ChannelError::Replaced)],
        "each once"
    );
    // Swapped back, the node frees its rings on drop (a node whose channels were swapped
    // out leaks them, which Miri would report).
    let mut chans = nodes[0].multi().channels();
    let (a, b) = (chans.next().unwrap(), chans.next().unwrap());
    std::mem::swap(a, b);
}

/// A receive the caller posts on a node's channel (misuse, documented: the node owns the
/// receive queues) sits behind the ring's receives, and the ring's slots are re-posted
/// behind it: a message lands in it. Its completion is the channel's (the caller's ticket),
/// and the node must not take it for the ring's head, whose receive has not completed: the
/// head's slot is read only once the next message completes it, and holds that message.
#[test]
fn a_callers_own_receive_never_makes_the_node_read_an_uncompleted_slot() {
    let mut mine = [0u8; SLOT];
    messaging_world!(let net, nodes = 3, SLOTS, SLOT, clock!(STEP));
    let mut region = net
        .register(0, &mut mine, AccessFlags::LOCAL_WRITE)
        .unwrap();
    let ticket = {
        let mut sge = [region.sge_mut(0..SLOT).unwrap()];
        // SAFETY: the region lives until the ticket was waited for below; nothing else
        // reads or writes the buffer meanwhile.
        unsafe { nodes[0].channel(1).unwrap().post_recv(&mut sge) }.unwrap()
    };
    // SLOTS messages fill the ring (each slot re-posted behind the caller's receive), the
    // next lands in the caller's receive, the one after in the ring's head again.
    let mut got = Vec::new();
    let mut sent = 0u32;
    for _ in 0..10_000 {
        if sent < SLOTS as u32 + 2 {
            match nodes[1].post_send_inline(0, &sent.to_le_bytes()) {
                Ok(_) => sent += 1,
                Err(NodeError::WouldBlock { .. }) => {}
                Err(e) => panic!("send {sent}: {e}"),
            }
        }
        nodes[1].progress(8, |_| {}).unwrap();
        nodes[0]
            .progress(8, |ev| {
                if let Event::Message { data, .. } = ev {
                    got.push(u32::from_le_bytes(data.try_into().unwrap()));
                }
            })
            .unwrap();
        if got.len() == SLOTS + 1 {
            break;
        }
    }
    let caller = SLOTS as u32;
    let ring: Vec<u32> = (0..SLOTS as u32 + 2).filter(|&m| m != caller).collect();
    assert_eq!(got, ring, "the caller's message is not the ring's");
    let done = nodes[0].wait(ticket).unwrap();
    assert_eq!(done.byte_len, 4);
    drop(nodes);
    drop(region);
    assert_eq!(&mine[..4], &caller.to_le_bytes());
}

/// Several heads claimed by one poll; the handler panics on the first: it is not delivered
/// again, the others are delivered by the next call, once each and in order, the panicked
/// slot is re-posted, and the ring goes on.
#[test]
fn a_handler_panic_between_claimed_heads_loses_and_repeats_nothing() {
    messaging_world!(let net, nodes = 3, SLOTS, SLOT, clock!(STEP));
    for m in [&b"boom"[..], b"two", b"three"] {
        nodes[1].post_send_inline(0, m).unwrap();
    }
    let mut got: Vec<Vec<u8>> = Vec::new();
    let r = catch_unwind(AssertUnwindSafe(|| {
        nodes[0].progress(8, |ev| {
            if let Event::Message { data, .. } = ev {
                if data == b"boom" {
                    panic!("the handler fails");
                }
                got.push(data.to_vec());
            }
        })
    }));
    assert!(r.is_err(), "the first message reached the handler");
    assert!(got.is_empty());
    let mut seen = Seen::default();
    progress(&mut nodes[0], 8, 4, &mut seen);
    let got: Vec<_> = seen.messages.iter().map(|m| m.1.clone()).collect();
    assert_eq!(got, [b"two".to_vec(), b"three".to_vec()]);
    assert_eq!(
        nodes[0].channel(1).unwrap().outstanding_recvs(),
        SLOTS as u64
    );
    // The ring goes on, credits come back.
    assert_messages_flow_in_order(&mut nodes, 1, 0, 4 * SLOTS, 10_000);
}

/// A budget smaller than what one poll claimed: each call hands out at most its budget,
/// the rest follow in order on the next calls (before anything a later poll claims).
#[test]
fn claimed_heads_respect_the_budget_and_keep_their_order() {
    messaging_world!(let net, nodes = 3, SLOTS, SLOT, clock!(STEP));
    for m in [&b"a"[..], b"b", b"c"] {
        nodes[1].post_send_inline(0, m).unwrap();
    }
    let mut seen = Seen::default();
    progress(&mut nodes[0], 1, 2, &mut seen);
    assert_eq!(seen.per_call, [1, 1]);
    nodes[1].post_send_inline(0, b"d").unwrap();
    progress(&mut nodes[0], 1, 4, &mut seen);
    let got: Vec<_> = seen.messages.iter().map(|m| m.1.clone()).collect();
    assert_eq!(
        got,
        [b"a".to_vec(), b"b".to_vec(), b"c".to_vec(), b"d".to_vec()]
    );
    assert!(seen.per_call.iter().all(|&n| n <= 1), "{:?}", seen.per_call);
}

/// A peer dies: our send to it fails, its queue pair flushes every ring receive (error
/// completions, never claimed). The node reports the failure once, reads no flushed slot,
/// and the other peer's messages still flow.
#[test]
fn flushed_receives_after_a_peer_failure_report_failed_once() {
    messaging_world!(let net, nodes = 3, SLOTS, SLOT, clock!(STEP));
    net.kill(1);
    let _ = nodes[0].post_send_inline(1, b"to the dead");
    let mut seen = Seen::default();
    for _ in 0..2000 {
        progress(&mut nodes[0], 8, 1, &mut seen);
        if !seen.failed.is_empty() && nodes[0].channel(1).unwrap().fault().is_some() {
            break;
        }
    }
    progress(&mut nodes[0], 8, 64, &mut seen);
    assert!(seen.messages.is_empty(), "{seen:?}");
    assert_eq!(seen.failed.len(), 1, "{seen:?}");
    assert_eq!(seen.failed[0].0, 1);
    nodes[2].post_send_inline(0, b"alive").unwrap();
    let mut seen = Seen::default();
    progress(&mut nodes[0], 8, 8, &mut seen);
    assert_eq!(seen.messages, [(2, b"alive".to_vec())]);
    assert!(seen.failed.is_empty());
}

/// Swaps the node's first two channels (positions 0 and 1: the channels to ranks 1 and 2
/// of rank 0), as `Node::multi` lets any caller.
fn swap_first_two(node: &mut rverbs_core::node::SoftNode<'_, rverbs_core::poll::Spin>) {
    let mut chans = node.multi().channels();
    let (a, b) = (chans.next().unwrap(), chans.next().unwrap());
    std::mem::swap(a, b);
}

/// With rank 0's channels to ranks 1 and 2 swapped, a `progress` whose claim list still
/// holds heads of rank 1's ring retires none of them on rank 2's channel (now at position
/// 0): its receives stay posted, none counted complete; swapped back, no call hands out a
/// message from rank 2, which sent none.
fn assert_left_over_heads_stay_off_rank_2s_channel(
    node: &mut rverbs_core::node::SoftNode<'_, rverbs_core::poll::Spin>,
    seen: &mut Seen,
) {
    swap_first_two(node);
    let _ = node.progress(8, seen.handler()).unwrap();
    {
        // Position 0 now holds the channel to rank 2.
        let chan = node.multi().channels().next().unwrap();
        assert_eq!(chan.peer(), Some(2));
        assert_eq!(
            chan.counters().receives_completed,
            0,
            "a receive of rank 1's channel retired on rank 2's"
        );
        assert_eq!(chan.outstanding_recvs(), SLOTS as u64);
    }
    swap_first_two(node);
    let mut after = Seen::default();
    for _ in 0..64 {
        node.progress(8, after.handler()).unwrap();
    }
    assert!(
        after.messages.iter().all(|m| m.0 != 2),
        "a message from rank 2, which sent none: {after:?}"
    );
}

/// Heads a poll claimed and a budget left undelivered stay in the claimed list; the next
/// `progress` retires them again ("retiring twice changes nothing") on whatever channel is
/// at their position by then. A caller who swapped another channel in between (here the
/// node's own channel to rank 2, whose ring receives have not completed: rank 2 sent
/// nothing) must not see that channel's receives counted complete: its receive count
/// would lie to any wait on it, and once swapped back the node would take its ring heads
/// as completed, read slots no message was written to, and post them a second time while
/// their first receives are still with the device.
#[test]
fn a_claimed_head_left_over_is_not_retired_on_a_channel_swapped_in() {
    messaging_world!(let net, nodes = 3, SLOTS, SLOT, clock!(STEP));
    nodes[1].post_send_inline(0, b"a").unwrap();
    nodes[1].post_send_inline(0, b"b").unwrap();
    let mut seen = Seen::default();
    // One poll claims both heads; the budget delivers one, the other waits in the list.
    assert_eq!(nodes[0].progress(1, seen.handler()).unwrap(), 1);
    assert_eq!(seen.messages, [(1, b"a".to_vec())]);
    let to_2 = nodes[0].channel(2).unwrap().counters();
    assert_eq!(to_2.receives_completed, 0, "rank 2 sent nothing");
    assert_left_over_heads_stay_off_rank_2s_channel(&mut nodes[0], &mut seen);
}

/// The same with a budget of 0: the one head the poll claimed is retired and waits (the
/// list holds one entry from its first slot), and the next call's one-head shortcut must
/// not retire it a second time on the channel swapped in.
#[test]
fn a_head_claimed_under_a_zero_budget_is_not_retired_on_a_channel_swapped_in() {
    messaging_world!(let net, nodes = 3, SLOTS, SLOT, clock!(STEP));
    nodes[1].post_send_inline(0, b"a").unwrap();
    let mut seen = Seen::default();
    assert_eq!(nodes[0].progress(0, seen.handler()).unwrap(), 0);
    assert!(seen.messages.is_empty());
    assert_left_over_heads_stay_off_rank_2s_channel(&mut nodes[0], &mut seen);
}

/// The poll the node makes goes through its first channel's provider, which names the
/// shared completion queues; a caller who swapped that channel for one of another node
/// (here: another world's, same type) makes the node poll that node's queues. Their
/// completions carry that node's slot numbers and receive numbers, which the claim must
/// not take for this node's ring heads: the message rank 2 of world B sent to B's rank 0
/// must not come out of A's rank 0 as a message from its rank 2 (a slot A's device never
/// wrote, then posted a second time).
#[test]
fn a_completion_of_another_nodes_queues_is_never_claimed() {
    // Two worlds built side by side (one lifetime, so their channels have one type).
    let (net_a, net_b) = (net(3), net(3));
    let mut arenas = [
        vec![0u8; soft_world_bytes(3, 64)],
        vec![0u8; soft_world_bytes(3, 64)],
    ];
    let mem_len = 2 * SLOTS * SLOT;
    let mut rings = [vec![0u8; 3 * mem_len], vec![0u8; 3 * mem_len]];
    let [arena_a, arena_b] = &mut arenas;
    let mut a = nodes(&net_a, arena_a, BarrierAlgorithm::default(), clock!(STEP));
    let mut b = nodes(&net_b, arena_b, BarrierAlgorithm::default(), clock!(STEP));
    let [rings_a, rings_b] = &mut rings;
    for (world, net, mem) in [(&mut a, &net_a, rings_a), (&mut b, &net_b, rings_b)] {
        for (n, mem) in world.iter_mut().zip(mem.chunks_mut(mem_len)) {
            let region = net
                .register(n.rank(), mem, AccessFlags::LOCAL_WRITE)
                .unwrap();
            n.start_messaging_in(region, SLOTS, SLOT).unwrap();
        }
    }
    std::mem::swap(a[0].channel(1).unwrap(), b[0].channel(1).unwrap());
    b[2].post_send_inline(0, b"for B").unwrap();
    let mut seen = Seen::default();
    for _ in 0..8 {
        a[0].progress(8, seen.handler()).unwrap();
    }
    assert!(
        seen.messages.is_empty(),
        "A's rank 0 handed out B's message: {seen:?}"
    );
    std::mem::swap(a[0].channel(1).unwrap(), b[0].channel(1).unwrap());
    // B's message is B's: its rank 0 still gets it.
    let mut seen_b = Seen::default();
    for _ in 0..64 {
        b[0].progress(8, seen_b.handler()).unwrap();
    }
    assert_eq!(seen_b.messages, [(2, b"for B".to_vec())]);
}

/// A handler panics on rank 1's message (its slot waits to be re-posted by the next
/// `progress`), and before that call rank 1's channel breaks (rank 1 died; our send to it
/// failed). The re-post can never succeed on a broken channel: it must not fail every later
/// `progress` and so stop the messages of every other peer; rank 1's failure is reported
/// once, rank 2's message is delivered.
#[test]
fn a_slot_left_by_a_panic_on_a_channel_broken_since_does_not_stop_the_other_peers() {
    messaging_world!(let net, nodes = 3, SLOTS, SLOT, clock!(STEP));
    nodes[1].post_send_inline(0, b"boom").unwrap();
    let r = catch_unwind(AssertUnwindSafe(|| {
        nodes[0].progress(8, |ev| {
            if let Event::Message { .. } = ev {
                panic!("the handler fails");
            }
        })
    }));
    assert!(r.is_err(), "the message reached the handler");
    net.kill(1);
    let t = nodes[0].post_send_inline(1, b"to the dead").unwrap();
    assert!(nodes[0].wait(t).is_err(), "a send to a dead rank fails");
    assert!(nodes[0].channel(1).unwrap().fault().is_some());
    nodes[2].post_send_inline(0, b"alive").unwrap();
    let mut seen = Seen::default();
    let mut errors = 0;
    for _ in 0..64 {
        if nodes[0].progress(8, seen.handler()).is_err() {
            errors += 1;
        }
    }
    assert!(errors <= 1, "{errors} of 64 progress calls failed");
    assert_eq!(seen.messages, [(2, b"alive".to_vec())]);
    assert!(
        seen.failed.len() <= 1 && seen.failed.iter().all(|f| f.0 == 1),
        "{seen:?}"
    );
}

/// More messages in one poll than the claim takes (`CLAIM` is 32), from two peers at once,
/// under budgets of 0, 1, a few and many in turn: some heads are claimed, the rest go the
/// slower way (the claim list full, a head not claimed since), some wait for the next call.
/// Every message arrives once, each peer's in the order sent, and no call hands out more
/// than its budget.
#[test]
fn heads_past_the_claim_limit_and_budget_cuts_keep_each_peers_order() {
    const DEEP: usize = 48;
    const EACH: u32 = 3 * DEEP as u32;
    let net = rverbs_core::model::SoftNet::new(rverbs_core::model::SoftNetConfig::new(
        3,
        rverbs_testkit::caps(128, 128, 1),
    ));
    let mut arena = vec![0u8; soft_world_bytes(3, 64)];
    let mem_len = 2 * DEEP * 8;
    let mut rings = vec![0u8; 3 * mem_len];
    let mut nodes = nodes(&net, &mut arena, BarrierAlgorithm::default(), clock!(STEP));
    for (n, mem) in nodes.iter_mut().zip(rings.chunks_mut(mem_len)) {
        let region = net
            .register(n.rank(), mem, AccessFlags::LOCAL_WRITE)
            .unwrap();
        n.start_messaging_in(region, DEEP, 8).unwrap();
    }
    let budgets = [1usize, 0, 5, 3, 64, 2, 40];
    let mut sent = [0u32; 3];
    let mut got: [Vec<u32>; 3] = Default::default();
    let mut turn = 0;
    while (got[1].len() as u32) < EACH || (got[2].len() as u32) < EACH {
        turn += 1;
        assert!(turn < 20_000, "stuck: {:?}", got.each_ref().map(Vec::len));
        // Bursts: each sender sends what its credits allow before rank 0 polls.
        for s in 1..3 {
            while sent[s] < EACH {
                match nodes[s].post_send_inline(0, &sent[s].to_le_bytes()) {
                    Ok(_) => sent[s] += 1,
                    Err(NodeError::WouldBlock { .. }) => break,
                    Err(e) => panic!("send: {e}"),
                }
            }
            nodes[s].progress(64, |_| {}).unwrap();
        }
        let budget = budgets[turn % budgets.len()];
        let n = nodes[0]
            .progress(budget, |ev| {
                if let Event::Message { rank, data } = ev {
                    got[rank as usize].push(u32::from_le_bytes(data.try_into().unwrap()));
                }
            })
            .unwrap();
        assert!(n <= budget, "{n} events for a budget of {budget}");
    }
    for (r, got) in got.iter().enumerate().skip(1) {
        assert_eq!(*got, (0..EACH).collect::<Vec<_>>(), "rank {r}'s order");
    }
}

/// A ring region of more than 4 GiB (a scatter entry's length is 32 bits; a large world's
/// rings reach it: 1000 peers x 1024 slots x 8 KiB is 8 GiB). Each slot's receive entry is
/// cut from one entry of the region taken at start: for such a region that entry does not
/// exist, and the slots must still be posted into the region's own memory under its key,
/// so a message arrives as it does in a small region. (`vec!` of zeros maps the 4 GiB
/// lazily: only the pages the messages land on are touched.)
#[test]
#[cfg_attr(miri, ignore = "4 GiB of address space")]
fn a_ring_region_over_4_gib_receives_messages() {
    const BIG: usize = (4 << 30) + 4096;
    let net = net(2);
    let mut arena = vec![0u8; soft_world_bytes(2, 64)];
    let mut big = vec![0u8; BIG];
    let mut small = [0u8; SLOTS * SLOT];
    let mut nodes = nodes(&net, &mut arena, BarrierAlgorithm::default(), clock!(STEP));
    for (n, mem) in nodes.iter_mut().zip([&mut big[..], &mut small[..]]) {
        let region = net
            .register(n.rank(), mem, AccessFlags::LOCAL_WRITE)
            .unwrap();
        n.start_messaging_in(region, SLOTS, SLOT).unwrap();
    }
    nodes[1].post_send_inline(0, b"over 4 GiB").unwrap();
    let mut seen = Seen::default();
    for _ in 0..16 {
        nodes[0].progress(8, seen.handler()).unwrap();
        nodes[1].progress(8, |_| {}).unwrap();
    }
    assert!(seen.failed.is_empty(), "{seen:?}");
    assert_eq!(seen.messages, [(1, b"over 4 GiB".to_vec())]);
}
