//! Adversarial review of the node's claimed ring heads (issue #25, msg26): sequences of
//! public calls that try to make `progress` count a receive on the wrong channel, read a
//! slot whose receive has not completed, or stop serving every peer because one broke.
//! Each test failed before its fix (see the commit that added it).
#![allow(clippy::std_instead_of_core)]

use std::time::Duration;

use rverbs_core::barrier::BarrierAlgorithm;
use rverbs_core::channel::ChannelError;
use rverbs_core::memory::AccessFlags;
use rverbs_core::node::{soft_world_bytes, Event};
use rverbs_testkit::clock;
use rverbs_testkit::{net, nodes};

const STEP: Duration = Duration::from_micros(1);
const SLOTS: usize = 4;
const SLOT: usize = 32;

/// `let net, nodes` of `world` ranks with messaging started (rings of [`SLOTS`] slots of
/// [`SLOT`] bytes per peer).
macro_rules! messaging_world {
    (let $net:ident, $nodes:ident = $world:expr) => {
        let world_size: u32 = $world;
        let $net = net(world_size);
        let mut arena = vec![0u8; soft_world_bytes(world_size, 64)];
        let mem_len = (world_size as usize - 1) * SLOTS * SLOT;
        let mut rings = vec![0u8; world_size as usize * mem_len];
        #[allow(unused_mut)]
        let mut $nodes = nodes(&$net, &mut arena, BarrierAlgorithm::default(), clock!(STEP));
        for (n, mem) in $nodes.iter_mut().zip(rings.chunks_mut(mem_len)) {
            let region = $net
                .register(n.rank(), mem, AccessFlags::LOCAL_WRITE)
                .unwrap();
            n.start_messaging_in(region, SLOTS, SLOT).unwrap();
        }
    };
}

/// Every event `progress` hands out: (rank, payload) per message, (rank, error) per
/// failure.
#[derive(Debug, Default)]
struct Seen {
    messages: Vec<(u32, Vec<u8>)>,
    failed: Vec<(u32, ChannelError)>,
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

/// Swaps the node's first two channels (positions 0 and 1: the channels to ranks 1 and 2
/// of rank 0), as `Node::multi` lets any caller.
fn swap_first_two(node: &mut rverbs_core::node::SoftNode<'_, rverbs_core::poll::Spin>) {
    let mut chans = node.multi().channels();
    let (a, b) = (chans.next().unwrap(), chans.next().unwrap());
    std::mem::swap(a, b);
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
    messaging_world!(let net, nodes = 3);
    nodes[1].post_send_inline(0, b"a").unwrap();
    nodes[1].post_send_inline(0, b"b").unwrap();
    let mut seen = Seen::default();
    // One poll claims both heads; the budget delivers one, the other waits in the list.
    assert_eq!(nodes[0].progress(1, seen.handler()).unwrap(), 1);
    assert_eq!(seen.messages, [(1, b"a".to_vec())]);
    let to_2 = nodes[0].channel(2).unwrap().counters();
    assert_eq!(to_2.receives_completed, 0, "rank 2 sent nothing");
    swap_first_two(&mut nodes[0]);
    let _ = nodes[0].progress(8, seen.handler()).unwrap();
    {
        // Position 0 now holds the channel to rank 2.
        let chan = nodes[0].multi().channels().next().unwrap();
        assert_eq!(chan.peer(), Some(2));
        assert_eq!(
            chan.counters().receives_completed,
            0,
            "a receive of rank 1's channel retired on rank 2's"
        );
        assert_eq!(chan.outstanding_recvs(), SLOTS as u64);
    }
    swap_first_two(&mut nodes[0]);
    let mut after = Seen::default();
    for _ in 0..64 {
        nodes[0].progress(8, after.handler()).unwrap();
    }
    assert!(
        after.messages.iter().all(|m| m.0 != 2),
        "a message from rank 2, which sent none: {after:?}"
    );
}

/// The same with a budget of 0: the one head the poll claimed is retired and waits (the
/// list holds one entry from its first slot), and the next call's one-head shortcut must
/// not retire it a second time on the channel swapped in.
#[test]
fn a_head_claimed_under_a_zero_budget_is_not_retired_on_a_channel_swapped_in() {
    messaging_world!(let net, nodes = 3);
    nodes[1].post_send_inline(0, b"a").unwrap();
    let mut seen = Seen::default();
    assert_eq!(nodes[0].progress(0, seen.handler()).unwrap(), 0);
    assert!(seen.messages.is_empty());
    swap_first_two(&mut nodes[0]);
    let _ = nodes[0].progress(8, seen.handler()).unwrap();
    {
        let chan = nodes[0].multi().channels().next().unwrap();
        assert_eq!(chan.peer(), Some(2));
        assert_eq!(
            chan.counters().receives_completed,
            0,
            "a receive of rank 1's channel retired on rank 2's"
        );
        assert_eq!(chan.outstanding_recvs(), SLOTS as u64);
    }
    swap_first_two(&mut nodes[0]);
    let mut after = Seen::default();
    for _ in 0..64 {
        nodes[0].progress(8, after.handler()).unwrap();
    }
    assert!(
        after.messages.iter().all(|m| m.0 != 2),
        "a message from rank 2, which sent none: {after:?}"
    );
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
    use std::panic::{catch_unwind, AssertUnwindSafe};
    messaging_world!(let net, nodes = 3);
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
                    Err(rverbs_core::node::NodeError::WouldBlock { .. }) => break,
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
