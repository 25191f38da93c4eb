//! The node layer on the software model: a world of 256 ranks in one process and one
//! thread (5 under Miri), every barrier algorithm with ranks arriving in random order,
//! sub-groups, a rank that stops, and messaging under credit flow control with one slow
//! receiver, through a ring per peer and through one shared receive pool. Ranks are interleaved by hand through the non-blocking barrier and `progress`,
//! so every schedule is reproducible from its seed.
#![allow(clippy::std_instead_of_core)]

use rverbs_core::node::Members;
use std::cell::Cell;
use std::time::Duration;

use rverbs_core::barrier::{BarrierAlgorithm, BarrierError};
use rverbs_core::channel::ChannelConfig;
use rverbs_core::memory::AccessFlags;
use rverbs_core::model::{SoftNet, SoftNetConfig};
use rverbs_core::node::{
    soft_world_bytes, soft_world_with, Component, Components, Event, NodeError, Receive,
    SetupError, SoftNode,
};
use rverbs_core::params::QpCaps;
use rverbs_core::poll::Spin;
use rverbs_testkit::clock;
use rverbs_testkit::{assert_messages_flow_in_order, messaging_world, net, nodes};

/// How far the step clocks move at each reading.
const STEP: Duration = Duration::from_micros(1);

/// The messaging tests' rings: slots per peer, and each slot's bytes.
const SLOTS: usize = 4;
const SLOT: usize = 32;

const WORLD: u32 = if cfg!(miri) { 5 } else { 256 };
const TIMEOUT: Duration = Duration::from_secs(3600);

/// A small deterministic generator (xorshift64*).
struct Rng(u64);

impl Rng {
    fn below(&mut self, n: usize) -> usize {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        (self.0.wrapping_mul(0x2545_f491_4f6c_dd1d) >> 33) as usize % n.max(1)
    }
}

fn caps() -> QpCaps {
    QpCaps::queues(16, 16)
}

/// Runs one barrier over `members` with ranks starting in random order and polled in random
/// order; checks that no member completes before the last member started.
fn barrier_in_random_order(
    nodes: &mut [SoftNode<'_, Spin>],
    members: &[u32],
    alg: BarrierAlgorithm,
    rng: &mut Rng,
) -> usize {
    let n = members.len();
    let mut started = vec![false; n];
    let mut done = vec![false; n];
    let (mut n_started, mut n_done, mut steps) = (0, 0, 0);
    while n_done < n {
        steps += 1;
        let k = rng.below(n);
        let r = members[k] as usize;
        if !started[k] {
            // Late arrivals: a rank starts only on some of the steps that pick it.
            if rng.below(4) == 0 {
                nodes[r].set_algorithm(alg);
                nodes[r].barrier_start_timeout(members, TIMEOUT).unwrap();
                started[k] = true;
                n_started += 1;
            }
            continue;
        }
        if done[k] {
            continue;
        }
        if nodes[r].barrier_poll().unwrap() {
            assert_eq!(
                n_started,
                n,
                "{}: rank {r} left the barrier before every member arrived",
                alg.name()
            );
            done[k] = true;
            n_done += 1;
        }
    }
    steps
}

#[test]
fn every_algorithm_at_256_ranks_with_random_arrivals() {
    let clock = clock!(STEP);
    rverbs_testkit::soft_nodes!(let net, nodes = WORLD, BarrierAlgorithm::default(), clock);
    let all: Vec<u32> = (0..WORLD).collect();
    let mut rng = Rng(0x5eed_1234);
    for alg in BarrierAlgorithm::ALL {
        for round in 0..3 {
            let steps = barrier_in_random_order(&mut nodes, &all, alg, &mut rng);
            eprintln!(
                "{} ranks, {}, round {round}: {steps} random steps",
                WORLD,
                alg.name()
            );
        }
    }
    // Counters stay in step across algorithms: a blocking-style barrier still works.
    for n in &nodes {
        assert!(!n.is_poisoned());
    }
}

#[test]
fn sub_groups_run_side_by_side() {
    let clock = clock!(STEP);
    rverbs_testkit::soft_nodes!(let net, nodes = WORLD, BarrierAlgorithm::default(), clock);
    let evens: Vec<u32> = (0..WORLD).step_by(2).collect();
    let odds: Vec<u32> = (1..WORLD).step_by(2).collect();
    let mut rng = Rng(77);
    for alg in BarrierAlgorithm::ALL {
        barrier_in_random_order(&mut nodes, &evens, alg, &mut rng);
        barrier_in_random_order(&mut nodes, &odds, alg, &mut rng);
    }
    // Then the whole world again, over the same counters.
    let all: Vec<u32> = (0..WORLD).collect();
    barrier_in_random_order(&mut nodes, &all, BarrierAlgorithm::Dissemination, &mut rng);
}

#[test]
fn a_rank_that_stops_is_named_by_the_timeout() {
    let world_size = if cfg!(miri) { 4 } else { 32 };
    let clock = clock!(STEP);
    rverbs_testkit::soft_nodes!(let net, nodes = world_size, BarrierAlgorithm::default(), clock);
    let stopped = world_size - 1;
    let timeout = Duration::from_millis(5);
    for n in nodes.iter_mut().filter(|n| n.rank() != stopped) {
        // The stopped rank is alive: it answers the probe, so after the grace it is blamed.
        n.set_probe_grace(Duration::from_millis(5));
        n.set_algorithm(BarrierAlgorithm::Centralized);
        n.barrier_start_timeout(Members::World, timeout).unwrap();
    }
    // The leader waits for everyone; the stopped rank never arrives.
    let leader = loop {
        match nodes[0].barrier_poll() {
            Ok(false) => {}
            Ok(true) => panic!("the barrier completed without rank {stopped}"),
            Err(e) => break e,
        }
    };
    match leader {
        NodeError::Barrier(BarrierError::Timeout {
            missing,
            missing_count,
        }) => {
            assert_eq!(missing_count, 1);
            assert_eq!(missing.as_slice(), &[stopped]);
        }
        other => panic!("expected a timeout naming rank {stopped}, got {other}"),
    }
    assert!(nodes[0].is_poisoned());
    // A follower times out waiting for the leader, naming it.
    let follower = loop {
        match nodes[1].barrier_poll() {
            Ok(false) => {}
            Ok(true) => panic!("released without the leader"),
            Err(e) => break e,
        }
    };
    assert!(
        matches!(&follower, NodeError::Barrier(BarrierError::Timeout { missing, .. }) if missing.as_slice() == [0]),
        "{follower}"
    );
}

/// Pool slots per node with a shared receive queue: one per peer at the largest world.
const POOL: usize = if cfg!(miri) { 8 } else { 256 };

/// What one slow-receiver run measured.
struct SlowReceiver {
    receive_memory: usize,
    credits: usize,
    would_block: u64,
    rnr: u64,
}

/// Every rank sends numbered messages to rank 0 (the slow receiver, served one step in 16)
/// and to its right neighbour, with messages landing as `receive` says; checks that every
/// message arrives once, in order per sender, and that no send found the receiver without a
/// posted buffer.
fn slow_receiver(world_size: u32, receive: Receive, per_peer: u32) -> SlowReceiver {
    let mut cfg = SoftNetConfig::new(world_size, caps());
    // A pool's completions all go to the node's receive queue.
    cfg.cq_capacity = cfg.cq_capacity.max(POOL as u32);
    let net = SoftNet::new(cfg);
    let mut arena = vec![0u8; soft_world_bytes(world_size, 64)];
    let (slots, mem_len) = match receive {
        Receive::PerPeer => (SLOTS, (world_size as usize - 1) * SLOTS * SLOT),
        _ => (POOL, POOL * SLOT),
    };
    let mut rings = vec![0u8; world_size as usize * mem_len];
    let clock = clock!(STEP);
    let mut nodes = rverbs_testkit::nodes(&net, &mut arena, receive, clock);
    for (n, mem) in nodes.iter_mut().zip(rings.chunks_mut(mem_len)) {
        let region = net
            .register(n.rank(), mem, AccessFlags::LOCAL_WRITE)
            .unwrap();
        n.start_messaging_in(region, slots, SLOT).unwrap();
    }
    let receive_memory = nodes[0].receive_memory();
    let credits = nodes[0].credits_per_peer();
    let w = world_size as usize;
    let targets = |r: usize| {
        let right = (r + 1) % w;
        if right == 0 || r == 0 {
            vec![(r + 1) % w]
        } else {
            vec![0, right]
        }
    };
    let mut next_out: Vec<Vec<u32>> = (0..w).map(|r| vec![0; targets(r).len()]).collect();
    let got: Vec<Vec<Cell<u32>>> = (0..w)
        .map(|_| (0..w).map(|_| Cell::new(0)).collect())
        .collect();
    let expected_total: u32 = (0..w).map(|r| targets(r).len() as u32 * per_peer).sum();
    let received = Cell::new(0u32);
    let mut would_block = 0u64;
    let mut naks = 0u64;
    let mut rng = Rng(99);
    let mut steps = 0u64;
    while received.get() < expected_total {
        steps += 1;
        assert!(steps < 50_000_000, "messaging made no progress");
        let r = rng.below(w);
        if r == 0 && rng.below(16) != 0 {
            continue; // rank 0 is slow
        }
        let node = &mut nodes[r];
        // One send attempt per step, to the next target with messages left.
        for (k, &to) in targets(r).iter().enumerate() {
            if next_out[r][k] < per_peer {
                let mut m = [0u8; 8];
                m[..4].copy_from_slice(&(r as u32).to_le_bytes());
                m[4..].copy_from_slice(&next_out[r][k].to_le_bytes());
                match node.post_send_inline(to as u32, &m) {
                    Ok(_) => next_out[r][k] += 1,
                    Err(NodeError::WouldBlock { .. }) => would_block += 1,
                    Err(e) => panic!("rank {r} -> {to}: {e}"),
                }
                // A send that finds a posted receive completes inside the post; one that
                // does not waits at its queue pair's head (the model's RNR NAK, which its
                // `rnr_retries` counts only from the first retry on).
                if net.waiting(r as u32) > 0 {
                    naks += 1;
                }
                break;
            }
        }
        node.progress(8, |ev| match ev {
            Event::Message {
                rank: from, data, ..
            } => {
                let sender = u32::from_le_bytes(data[..4].try_into().unwrap());
                let seq = u32::from_le_bytes(data[4..8].try_into().unwrap());
                assert_eq!(sender, from);
                let g = &got[r][from as usize];
                assert_eq!(
                    seq,
                    g.get(),
                    "rank {r}: message {seq} from {from} out of order"
                );
                g.set(seq + 1);
                received.set(received.get() + 1);
            }
            Event::SendsCompleted { .. } => {}
            other => panic!("rank {r}: unexpected {other:?}"),
        })
        .unwrap();
    }
    let rnr: u64 = naks
        + (0..world_size)
            .map(|n| net.stats(n).rnr_retries)
            .sum::<u64>();
    eprintln!(
        "{world_size} ranks, {receive:?}: {expected_total} messages in {steps} steps, \
         {would_block} sends refused for lack of credit ({credits} per peer), {rnr} RNR \
         retries, {receive_memory} bytes of receive memory per rank"
    );
    SlowReceiver {
        receive_memory,
        credits,
        would_block,
        rnr,
    }
}

#[test]
fn messaging_with_one_slow_receiver_provokes_no_rnr() {
    let r = slow_receiver(WORLD, Receive::PerPeer, if cfg!(miri) { 6 } else { 12 });
    assert_eq!(r.rnr, 0, "a send found no posted receive");
    assert!(
        r.would_block > 0,
        "the slow receiver never ran a sender out of credit"
    );
}

#[test]
fn a_shared_pool_with_one_slow_receiver_loses_nothing_and_provokes_no_rnr() {
    let r = slow_receiver(
        WORLD,
        Receive::Shared { slots: POOL as u32 },
        if cfg!(miri) { 6 } else { 12 },
    );
    assert_eq!(r.rnr, 0, "a send found the shared queue empty");
    assert_eq!(r.credits, POOL / (WORLD as usize - 1));
    assert!(
        r.would_block > 0,
        "the slow receiver never ran a sender out of credit"
    );
}

#[test]
fn shared_pool_memory_does_not_grow_with_the_world() {
    let sizes: &[u32] = if cfg!(miri) { &[3, 5] } else { &[16, 64, 256] };
    eprintln!("ranks | per-peer rings (4 slots) | shared pool ({POOL} slots)   bytes per rank");
    let mut pooled = Vec::new();
    for &n in sizes {
        let ring = slow_receiver(n, Receive::PerPeer, 2);
        let pool = slow_receiver(n, Receive::Shared { slots: POOL as u32 }, 2);
        eprintln!(
            "{n:5} | {:24} | {:10}",
            ring.receive_memory, pool.receive_memory
        );
        assert_eq!(ring.receive_memory, (n as usize - 1) * 4 * 32);
        assert_eq!(pool.rnr + ring.rnr, 0);
        pooled.push(pool.receive_memory);
    }
    assert!(
        pooled.iter().all(|&m| m == POOL * 32),
        "the pool's memory depends on the world size: {pooled:?}"
    );
}

#[test]
fn messages_per_barrier_per_algorithm() {
    let sizes: &[u32] = if cfg!(miri) {
        &[2, 5]
    } else {
        &[2, 16, 128, 256]
    };
    eprintln!(
        "ranks | centralized | dissemination | binary-tree   (notification writes per barrier)"
    );
    for &n in sizes {
        let clock = clock!(STEP);
        rverbs_testkit::soft_nodes!(let net, nodes = n, BarrierAlgorithm::default(), clock);
        let all: Vec<u32> = (0..n).collect();
        let mut rng = Rng(3);
        let mut counts = Vec::new();
        for alg in BarrierAlgorithm::ALL {
            let before: u64 = (0..n).map(|r| net.stats(r).sends_posted).sum();
            barrier_in_random_order(&mut nodes, &all, alg, &mut rng);
            let after: u64 = (0..n).map(|r| net.stats(r).sends_posted).sum();
            counts.push(after - before);
        }
        eprintln!(
            "{n:5} | {:11} | {:13} | {:11}",
            counts[0], counts[1], counts[2]
        );
        let n64 = u64::from(n);
        let rounds = u64::from(n.next_power_of_two().trailing_zeros());
        assert_eq!(
            counts[0],
            2 * (n64 - 1),
            "centralized: in and out of the leader"
        );
        assert_eq!(
            counts[1],
            n64 * rounds,
            "dissemination: one per rank per round"
        );
        assert_eq!(
            counts[2],
            2 * (n64 - 1),
            "binary tree: up and down every edge"
        );
    }
}

#[test]
fn a_barrier_is_polled_with_the_members_it_started_with_whatever_later_starts_name() {
    // The poll takes no members (the node keeps the ones the start named), so a poll with
    // other members cannot be written; a second start naming others is refused and changes
    // nothing.
    let clock = clock!(STEP);
    rverbs_testkit::soft_nodes!(let net, nodes = 4, BarrierAlgorithm::default(), clock);
    for n in nodes.iter_mut() {
        n.set_algorithm(BarrierAlgorithm::BinaryTree);
    }
    nodes[0].barrier_start(&[0, 1]).unwrap();
    for other in [&[0u32, 2][..], &[0, 1, 2], &[0, 1000]] {
        assert_eq!(
            nodes[0].barrier_start(other),
            Err(NodeError::Barrier(BarrierError::AlreadyStarted))
        );
        assert_eq!(nodes[0].barrier_poll(), Ok(false));
    }
    // Nothing was changed: the right members still finish it.
    nodes[1].barrier_start(&[0, 1]).unwrap();
    while !(nodes[0].barrier_poll().unwrap() & nodes[1].barrier_poll().unwrap()) {}
    assert!(!nodes[0].is_poisoned());
}

#[test]
fn barrier_wakeups_consume_and_repost_receives_across_many_barriers() {
    // Each barrier consumes up to two wake-up receives per peer; more barriers than the
    // sixteen posted prove they are re-posted, for every algorithm and for sub-groups.
    let world_size = if cfg!(miri) { 4 } else { 32 };
    let rounds = if cfg!(miri) { 6 } else { 12 };
    let net = net(world_size);
    let mut arena = vec![0u8; soft_world_bytes(world_size, 64)];
    let mut ring = vec![0u8; 4096];
    let clock = clock!(STEP);
    let mut nodes = nodes(&net, &mut arena, Components::barrier_wakeups(), clock);
    for n in nodes.iter_mut() {
        assert!(n.barrier_wakeups());
        assert!(!n.barrier_wakeups_live());
    }
    let all: Vec<u32> = (0..world_size).collect();
    let evens: Vec<u32> = (0..world_size).step_by(2).collect();
    let mut rng = Rng(4242);
    for _ in 0..rounds {
        for alg in BarrierAlgorithm::ALL {
            barrier_in_random_order(&mut nodes, &all, alg, &mut rng);
        }
        barrier_in_random_order(
            &mut nodes,
            &evens,
            BarrierAlgorithm::Dissemination,
            &mut rng,
        );
    }
    // After the first full barrier every notification was a write with immediate: each
    // consumed a wake-up receive at its peer, and some channel consumed more of them than
    // were ever posted at once (16), so they were re-posted.
    let most: u64 = nodes
        .iter_mut()
        .flat_map(|n| {
            n.multi()
                .channels()
                .map(|c| c.remote_recvs_used())
                .collect::<Vec<_>>()
        })
        .max()
        .unwrap();
    assert!(
        most > 16,
        "at most {most} notifications to one peer carried an immediate"
    );
    // Messages would land on receives without buffers: the node was built without
    // messaging, and says so.
    rverbs_testkit::assert_built_without_messaging(&net, &mut nodes[0], &mut ring, 2);
    for n in &nodes {
        assert!(!n.is_poisoned());
    }
}

/// Runs one full barrier in which rank 0 arrives first and polls while rank 1 "computes",
/// so rank 1 always arrives last and finishes without polling.
fn barrier_rank_1_last(nodes: &mut [SoftNode<'_, Spin>]) {
    nodes[0]
        .barrier_start_timeout(Members::World, TIMEOUT)
        .unwrap();
    for _ in 0..20 {
        assert!(!nodes[0].barrier_poll().unwrap());
    }
    nodes[1]
        .barrier_start_timeout(Members::World, TIMEOUT)
        .unwrap();
    let mut done = [false; 2];
    for _ in 0..10_000 {
        for (r, d) in done.iter_mut().enumerate() {
            *d = *d || nodes[r].barrier_poll().unwrap();
        }
        if done == [true, true] {
            return;
        }
    }
    panic!("barrier stuck: {done:?}");
}

#[test]
fn a_rank_that_always_arrives_last_keeps_its_wakeup_receives_posted() {
    // The last rank finishes inside `barrier_start`; its wake-up receives must still be
    // re-posted, or the sixteenth barrier's notification finds none.
    let clock = clock!(STEP);
    rverbs_testkit::soft_nodes!(let net, nodes = 2, Components::barrier_wakeups(), clock);
    for _ in 0..(if cfg!(miri) { 20 } else { 60 }) {
        barrier_rank_1_last(&mut nodes);
    }
    let left = nodes[1].channel(0).unwrap().outstanding_recvs();
    assert!(left >= 14, "rank 1 has only {left} wake-up receives posted");
}

#[test]
fn a_stray_send_breaks_one_channel_and_not_the_other_barriers() {
    let clock = clock!(STEP);
    rverbs_testkit::soft_nodes!(let net, nodes = 3, Components::barrier_wakeups(), clock);
    let all = [0u32, 1, 2];
    let mut rng = Rng(9);
    barrier_in_random_order(&mut nodes, &all, BarrierAlgorithm::Dissemination, &mut rng);
    // Rank 2 sends to rank 0: the message lands on a receive without a buffer, and rank 0's
    // channel to rank 2 breaks with a length error (no memory is written anywhere).
    let _ = nodes[2].channel(0).unwrap().post_send_inline(b"stray");
    for _ in 0..100 {
        let _ = nodes[0].multi().poll();
        let _ = nodes[2].multi().poll();
    }
    assert!(nodes[0].channel(2).unwrap().fault().is_some());
    // Barriers without rank 2 go on.
    for _ in 0..20 {
        barrier_in_random_order(
            &mut nodes,
            &[0, 1],
            BarrierAlgorithm::Dissemination,
            &mut rng,
        );
    }
}

/// A message whose completion a caller took by polling the node's channel directly (so no
/// poll of the queues reports it again) still reaches the handler: `progress` sweeps one
/// peer every 8 calls, round-robin, so within 8 x peers calls.
#[test]
fn a_message_taken_by_a_direct_channel_poll_is_still_delivered() {
    let world_size = 4u32;
    messaging_world!(let net, nodes = world_size, SLOTS, SLOT, clock!(STEP));
    nodes[1].post_send_inline(0, b"direct").unwrap();
    // Rank 0 polls its channel to rank 1 itself: the receive's completion is now the
    // channel's, and no later poll of the queues reports it.
    let mut seen = 0;
    for _ in 0..1000 {
        seen += nodes[0].channel(1).unwrap().poll().unwrap();
        if seen > 0 {
            break;
        }
    }
    assert!(seen > 0, "the message never completed at rank 0");
    let peers = world_size - 1;
    let mut delivered = None;
    for call in 1..=8 * peers {
        nodes[0]
            .progress(8, |ev| {
                if let Event::Message { rank, data, .. } = ev {
                    assert_eq!((rank, data), (1, &b"direct"[..]));
                    delivered = Some(call);
                }
            })
            .unwrap();
        if delivered.is_some() {
            break;
        }
    }
    assert!(
        delivered.is_some(),
        "not delivered within {} progress calls",
        8 * peers
    );
}

#[test]
fn components_that_cannot_work_together_are_refused_when_the_world_is_built_naming_both() {
    let clock = clock!(STEP);
    let mut wakeups_and_messages = Components::messaging(Receive::PerPeer);
    wakeups_and_messages.barrier_wakeups = true;
    let mut pool_and_readmission = Components::messaging(Receive::Shared { slots: 8 });
    pool_and_readmission.readmission = true;
    let mut wakeups_and_readmission = Components::barrier_wakeups();
    wakeups_and_readmission.readmission = true;
    let cases = [
        (
            wakeups_and_messages,
            (Component::Messaging, Component::BarrierWakeups),
        ),
        (
            pool_and_readmission,
            (Component::SharedReceive, Component::Readmission),
        ),
        (
            wakeups_and_readmission,
            (Component::BarrierWakeups, Component::Readmission),
        ),
    ];
    for (components, (a, b)) in cases {
        let net = net(3);
        let mut arena = vec![0u8; soft_world_bytes(3, 64)];
        let alg = BarrierAlgorithm::default();
        let e = soft_world_with(
            &net,
            &mut arena,
            64,
            ChannelConfig::default(),
            (alg, Spin, clock),
            components,
        )
        .unwrap_err();
        assert_eq!(e, SetupError::Incompatible { a, b });
        let text = e.to_string();
        assert!(
            text.contains(&a.to_string()) && text.contains(&b.to_string()),
            "{text}"
        );
    }
}

/// A handler that panics on a message leaves its slot to be re-posted by the next
/// `progress`; the message after it, whose completion the panicking call's poll already took
/// (so no later poll of the queues reports it again), must still reach the handler (the
/// sweep finds it at the ring's head), once, and the one that panicked never again; credits
/// must keep coming back, so the sender can go on far past its credits.
#[test]
fn a_message_behind_one_whose_handler_panicked_is_still_delivered_once() {
    use std::panic::{catch_unwind, AssertUnwindSafe};
    let world_size = 3u32;
    messaging_world!(let net, nodes = world_size, SLOTS, SLOT, clock!(STEP));
    nodes[1].post_send_inline(0, b"boom").unwrap();
    nodes[1].post_send_inline(0, b"next").unwrap();
    // Both complete at rank 0's channel to rank 1 before any `progress` sees them.
    let mut seen = 0;
    for _ in 0..1000 {
        seen += nodes[0].channel(1).unwrap().poll().unwrap();
        if seen >= 2 {
            break;
        }
    }
    assert!(seen >= 2, "the messages never completed at rank 0");
    let peers = (world_size - 1) as usize;
    let mut got: Vec<Vec<u8>> = Vec::new();
    let mut panicked = false;
    for _ in 0..8 * peers + 8 {
        let r = catch_unwind(AssertUnwindSafe(|| {
            nodes[0].progress(8, |ev| {
                if let Event::Message { data, .. } = ev {
                    if data == b"boom" && !panicked {
                        panic!("the handler fails");
                    }
                    got.push(data.to_vec());
                }
            })
        }));
        match r {
            Err(_) => panicked = true,
            Ok(r) => {
                r.unwrap();
            }
        }
        if got.len() == 1 {
            break;
        }
    }
    assert!(panicked, "the first message never reached the handler");
    assert_eq!(
        got,
        [b"next".to_vec()],
        "delivered once, the panicked one not again"
    );
    // The panicked slot was re-posted: every slot is posted again.
    let ch = nodes[0].channel(1).unwrap();
    assert_eq!(ch.outstanding_recvs(), SLOTS as u64);
    // Credits keep coming back: many more messages than credits go through.
    let credits = nodes[1].credits_per_peer();
    assert_messages_flow_in_order(&mut nodes, 1, 0, 4 * credits.max(1), 100_000);
}

/// A send whose completion a caller took by waiting on the node's channel directly (so no
/// poll of the queues reports it again) is still reported: `progress`'s sweep finds the
/// channel's count of completed sends above what the handler was told.
#[test]
fn sends_completed_through_a_direct_channel_wait_are_still_reported() {
    let world_size = 4u32;
    messaging_world!(let net, nodes = world_size, SLOTS, SLOT, clock!(STEP));
    let t = nodes[0].post_send_inline(2, b"direct").unwrap();
    nodes[0].channel(2).unwrap().wait(t).unwrap();
    let done = nodes[0].channel(2).unwrap().sends_completed();
    assert!(done > 0);
    let peers = world_size - 1;
    let mut reported = None;
    for _ in 0..=8 * peers {
        nodes[0]
            .progress(8, |ev| {
                if let Event::SendsCompleted { rank, completed } = ev {
                    reported = Some((rank, completed));
                }
            })
            .unwrap();
        if reported.is_some() {
            break;
        }
    }
    assert_eq!(reported, Some((2, done)), "within {} calls", 8 * peers);
}
