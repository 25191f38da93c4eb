//! Nodes of 2, 3, 4 and 8 ranks as separate processes on a real device: barriers of every
//! algorithm with random per-rank delays, sub-group barriers, a barrier timeout when one
//! rank never arrives, scatter/gather/multicast with every byte checked, and a counting
//! allocator proving that none of it allocates once connected.
//!
//! The parent tests start one child process per rank: this same test binary, running the
//! ignored `child_rank` entry point with the scenario in environment variables.
#![allow(clippy::std_instead_of_core, clippy::std_instead_of_alloc)] // test code

mod support;
use rverbs_core::node::Members;
use support::device;

use std::time::{Duration, Instant};

use rverbs_bootstrap::connect;
use rverbs_core::barrier::{BarrierAlgorithm, BarrierError};
use rverbs_core::node::NodeError;
use rverbs_core::sge::{Sge, SgeMut};
use rverbs_core::verbs::AccessFlags;
use rverbs_std_shim::StdBackoff;
use rverbs_testkit::allocs_all;

// Counts every thread's allocations: a child rank runs one test alone, and the library's
// own threads (if any) must not allocate either.
#[global_allocator]
static GLOBAL: rverbs_testkit::Counting = rverbs_testkit::Counting;

/// Runs `world` child processes of `scenario` and asserts they all succeed.
fn run_world(scenario: &str, world: u32, port: u16) {
    let Some(dev) = device() else {
        return;
    };
    let (failed, took) = support::run_children("RVERBS_NODE_", scenario, world, port, &dev);
    eprintln!("{scenario} with {world} ranks: {took:?}");
    assert!(failed.is_empty(), "{scenario}/{world}: {failed:?}");
}

/// Each world on ports of its own; a failure names the world (`run_world`).
#[test]
fn worlds_of_2_3_4_and_8_ranks_pass_every_barrier_gather_and_multicast_without_allocating() {
    for (world, port) in [(2, 21000), (3, 21100), (4, 21200), (8, 21300)] {
        run_world("full", world, port);
    }
}

#[test]
fn barrier_times_out_naming_the_rank_that_never_arrives() {
    run_world("timeout", 3, 21400);
}

/// A tiny deterministic generator for per-rank delays.
fn next(x: &mut u64) -> u64 {
    *x ^= *x << 13;
    *x ^= *x >> 7;
    *x ^= *x << 17;
    *x
}

#[test]
#[ignore = "child-process entry point; the tests above run it"]
fn child_rank() {
    let (scenario, rank, world, port, dev) = support::world_env("RVERBS_NODE_");
    let job = format!("{scenario}-{world}-{port}");
    let (config, mut opts) = support::local_options(world, port, &dev, job);
    // gather_receive posts its receives when it is called; senders that get there first
    // are told "receiver not ready" and retry until it does.
    opts.node.qp.rnr_retry = rverbs_core::params::RnrRetry::Infinite;
    // Waits keep `WaitPolicy::default()`, the policy for ranks that outnumber the VM's vCPUs.
    let c = connect(&config, rank, &opts).unwrap_or_else(|e| panic!("rank {rank}: connect: {e}"));
    let (mut node, mut session, clock) = (c.node, c.session, c.clock);
    match scenario.as_str() {
        "full" => full(&mut node, &clock, rank, world),
        "timeout" => timeout(&mut node, rank),
        s => panic!("unknown scenario {s}"),
    }
    // Nobody tears down its queue pairs while a peer may still write to it, and nobody
    // leaves while a peer's barrier still runs: in "timeout" a rank that left early (rank 1
    // times out waiting for rank 0, which still waits for rank 2) was news of a failure to
    // rank 0 before its own timeout, under TCG one run in three.
    session.allgather(b"done").unwrap();
}

fn timeout(node: &mut rverbs_core::node::VerbsNode<StdBackoff>, rank: u32) {
    node.set_algorithm(BarrierAlgorithm::Centralized);
    if rank == 2 {
        // Never arrives: stays connected (so nothing fails on the transport) past the others'
        // deadline, then leaves.
        std::thread::sleep(Duration::from_secs(4));
        return;
    }
    // At its deadline the barrier probes the missing rank and waits this long for news of a
    // failure before it blames it (the stalled rank is alive: no news comes).
    node.set_probe_grace(Duration::from_millis(500));
    let t = Instant::now();
    let err = node
        .barrier_timeout(Members::World, Duration::from_secs(1))
        .unwrap_err();
    let waited = t.elapsed();
    assert!(
        waited >= Duration::from_millis(1500) && waited < Duration::from_millis(3500),
        "{waited:?}"
    );
    let expected_missing: &[u32] = if rank == 0 { &[2] } else { &[0] };
    match &err {
        NodeError::Barrier(BarrierError::Timeout {
            missing,
            missing_count,
        }) => {
            assert_eq!(&missing[..], expected_missing, "rank {rank}: {err}");
            assert_eq!(*missing_count, 1);
        }
        other => panic!("rank {rank}: expected a timeout, got {other}"),
    }
    eprintln!("rank {rank}: {err}");
    assert!(node.is_poisoned());
    assert_eq!(
        node.barrier_timeout(Members::World, Duration::from_secs(1))
            .unwrap_err(),
        NodeError::Barrier(BarrierError::Poisoned)
    );
}

fn full(
    node: &mut rverbs_core::node::VerbsNode<StdBackoff>,
    clock: &rverbs_std_shim::Monotonic,
    rank: u32,
    world: u32,
) {
    // 10,000 barriers per algorithm (RVERBS_NODE_BARRIERS overrides).
    let barriers: u32 = std::env::var("RVERBS_NODE_BARRIERS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(10_000);
    let tmo = Duration::from_secs(60);
    const CHUNK: usize = 1024;
    let w = world as usize;
    // Setup (allocates): buffers, registrations, entry lists.
    let pd = node.pd().clone();
    let mut src = vec![0u8; CHUNK * w];
    let mut back = vec![0u8; CHUNK * w];
    let mut msg = vec![0u8; 64];
    let mut rcv = vec![0u8; 64];
    let mut epoch_buf = vec![0u8; 8 * w];
    let mut src_mr = pd.register(&mut src, AccessFlags::LOCAL_WRITE).unwrap();
    let mut back_mr = pd.register(&mut back, AccessFlags::LOCAL_WRITE).unwrap();
    let mut msg_mr = pd.register(&mut msg, AccessFlags::LOCAL_WRITE).unwrap();
    let mut rcv_mr = pd.register(&mut rcv, AccessFlags::LOCAL_WRITE).unwrap();
    let mut epoch_mr = pd
        .register(&mut epoch_buf, AccessFlags::LOCAL_WRITE)
        .unwrap();
    let windows: Vec<_> = (0..world)
        .map(|r| node.peer_window(r).unwrap_or_default())
        .collect();
    let group: Vec<u32> = (0..world).filter(|r| r % 2 == rank % 2).collect();
    let mut rng = 0x9e37_79b9_7f4a_7c15u64 ^ u64::from(rank + 1);

    let before = allocs_all();
    // 1. Barriers, every algorithm, with random per-rank delays; every 500th barrier checks
    // that nobody left early: each rank publishes its epoch before the barrier and reads
    // everyone's after it.
    for alg in BarrierAlgorithm::ALL {
        node.set_algorithm(alg);
        let t = Instant::now();
        for k in 1..=barriers as u64 {
            if next(&mut rng).is_multiple_of(8) {
                let until = Instant::now() + Duration::from_micros(next(&mut rng) % 50);
                while Instant::now() < until {
                    std::hint::spin_loop();
                }
            }
            let check = k.is_multiple_of(500);
            if check {
                node.window().store_u64(0, k);
            }
            node.barrier_timeout(Members::World, tmo)
                .unwrap_or_else(|e| panic!("rank {rank} {alg:?} #{k}: {e}"));
            if check {
                let mut outs: heapless_like::Outs<'_> = heapless_like::Outs::new(&mut epoch_mr);
                for r in (0..world).filter(|&r| r != rank) {
                    let slot = outs.slot(r as usize);
                    node.multi()
                        .read(r, slot, windows[r as usize].slice(0, 8).unwrap())
                        .unwrap();
                }
                for r in (0..world).filter(|&r| r != rank) {
                    let v = u64::from_le_bytes(
                        epoch_mr.as_slice()[r as usize * 8..r as usize * 8 + 8]
                            .try_into()
                            .unwrap(),
                    );
                    assert!(
                        v >= k,
                        "rank {rank} {alg:?}: rank {r} was at epoch {v} after barrier {k}"
                    );
                }
                // Nobody may overwrite its epoch before everyone has read it.
                node.barrier_timeout(Members::World, tmo).unwrap();
            }
        }
        if rank == 0 {
            eprintln!(
                "world {world}: {barriers} {} barriers in {:?}",
                alg.name(),
                t.elapsed()
            );
        }
    }
    // 2. Sub-group barriers: evens and odds at the same time.
    let alg = node.algorithm();
    node.set_algorithm(BarrierAlgorithm::BinaryTree);
    for _ in 0..barriers.min(1000) {
        node.barrier_timeout(&group, tmo).unwrap();
    }
    node.set_algorithm(alg);
    node.barrier_timeout(Members::World, tmo).unwrap();

    // 3. Every rank in turn scatters a distinct chunk to every peer, gathers one back from
    // every peer, and multicasts a message; every byte is checked.
    let pat = |root: u32, to: u32, i: usize| {
        (i as u8).wrapping_mul(7) ^ (root as u8).wrapping_mul(31) ^ (to as u8)
    };
    for root in 0..world {
        // Everyone fills its gather chunk and, if not root, posts the multicast receive.
        for i in 0..CHUNK {
            let b = [pat(root, rank, i) ^ 0x55];
            node.window().write_from(2 * CHUNK + i, &b);
        }
        let recv_t = if rank != root {
            let mut parts = rcv_mr.chunks_mut(32);
            let mut r = [parts.next().unwrap()];
            let mut r2 = [parts.next().unwrap()];
            let chan = node.channel(root).unwrap();
            // SAFETY: rcv_mr is read only after both waits below.
            let t1 = unsafe { chan.post_recv(&mut r) }.unwrap();
            // SAFETY: as above; this one receives the scatter_send that follows the multicast.
            let t2 = unsafe { chan.post_recv(&mut r2) }.unwrap();
            Some((t1, t2))
        } else {
            None
        };
        node.barrier_timeout(Members::World, tmo).unwrap();
        if rank == root {
            for r in 0..world {
                for i in 0..CHUNK {
                    src_mr.as_mut_slice()[r as usize * CHUNK + i] = pat(root, r, i);
                }
            }
            msg_mr.as_mut_slice()[..8].copy_from_slice(&u64::from(root).to_le_bytes());
            let sges: [Option<[Sge<'_>; 1]>; 8] = core::array::from_fn(|r| {
                (r < w && r as u32 != rank)
                    .then(|| [src_mr.sge(r * CHUNK..(r + 1) * CHUNK).unwrap()])
            });
            node.multi()
                .scatter_write((0..world).filter(|&r| r != rank).map(|r| {
                    let s = sges[r as usize].as_ref().unwrap();
                    (
                        r,
                        &s[..],
                        windows[r as usize]
                            .slice(CHUNK as u64, CHUNK as u64)
                            .unwrap(),
                    )
                }))
                .unwrap();
            let mut outs: [Option<[SgeMut<'_>; 1]>; 8] =
                [None, None, None, None, None, None, None, None];
            for (i, s) in back_mr.chunks_mut(CHUNK).enumerate() {
                if i != rank as usize {
                    outs[i] = Some([s]);
                }
            }
            let wins = &windows;
            node.multi()
                .gather_read(outs.iter_mut().enumerate().filter_map(|(r, o)| {
                    o.as_mut().map(|s| {
                        (
                            r as u32,
                            &mut s[..],
                            wins[r].slice(2 * CHUNK as u64, CHUNK as u64).unwrap(),
                        )
                    })
                }))
                .unwrap();
            for r in (0..world).filter(|&r| r != rank) {
                for i in 0..CHUNK {
                    assert_eq!(
                        back_mr.as_slice()[r as usize * CHUNK + i],
                        pat(root, r, i) ^ 0x55,
                        "gather from {r} byte {i}"
                    );
                }
            }
            let m = [msg_mr.sge(0..8).unwrap()];
            node.multi()
                .send_to_each((0..world).filter(|&r| r != rank), &m)
                .unwrap();
            // scatter_send: a distinct 8-byte message to every peer.
            for r in 0..w {
                src_mr.as_mut_slice()[r * 8..r * 8 + 8]
                    .copy_from_slice(&[root as u8, r as u8, 0xa5, 0, 0, 0, 0, 1]);
            }
            let per: [Option<[Sge<'_>; 1]>; 8] = core::array::from_fn(|r| {
                (r < w && r as u32 != rank).then(|| [src_mr.sge(r * 8..r * 8 + 8).unwrap()])
            });
            node.multi()
                .scatter_send(
                    per.iter()
                        .enumerate()
                        .filter_map(|(r, s)| s.as_ref().map(|s| (r as u32, &s[..]))),
                )
                .unwrap();
            // gather_receive: every peer sends 8 bytes back.
            let mut slots: [Option<[SgeMut<'_>; 1]>; 8] = Default::default();
            for (i, s) in back_mr.chunks_mut(8).enumerate().take(8) {
                if i < w && i as u32 != rank {
                    slots[i] = Some([s]);
                }
            }
            let mut lens = [0u32; 8];
            node.multi()
                .gather_receive(
                    slots
                        .iter_mut()
                        .enumerate()
                        .filter_map(|(r, s)| s.as_mut().map(|s| (r as u32, &mut s[..]))),
                    |peer, info| lens[peer as usize] = info.byte_len,
                )
                .unwrap();
            for r in (0..world).filter(|&r| r != rank) {
                assert_eq!(lens[r as usize], 8, "gather_receive length from {r}");
                assert_eq!(
                    back_mr.as_slice()[r as usize * 8..r as usize * 8 + 8],
                    [r as u8, root as u8, 0x5a, 0, 0, 0, 0, 2],
                    "gather_receive bytes from {r}"
                );
            }
        }
        if let Some((t1, t2)) = recv_t {
            let chan = node.channel(root).unwrap();
            let info = chan.wait(t1).unwrap();
            assert_eq!(info.byte_len, 8);
            assert_eq!(rcv_mr.as_slice()[..8], u64::from(root).to_le_bytes());
            let info = chan.wait(t2).unwrap();
            assert_eq!(info.byte_len, 8);
            assert_eq!(
                rcv_mr.as_slice()[32..40],
                [root as u8, rank as u8, 0xa5, 0, 0, 0, 0, 1]
            );
            // Our part of the root's gather_receive.
            msg_mr.as_mut_slice()[8..16]
                .copy_from_slice(&[rank as u8, root as u8, 0x5a, 0, 0, 0, 0, 2]);
            chan.send(&[msg_mr.sge(8..16).unwrap()]).unwrap();
        }
        node.barrier_timeout(Members::World, tmo).unwrap();
        if rank != root {
            let mut got = [0u8; CHUNK];
            node.window().read_into(CHUNK, &mut got);
            for (i, b) in got.iter().enumerate() {
                assert_eq!(*b, pat(root, rank, i), "scatter from {root} byte {i}");
            }
        }
        node.barrier_timeout(Members::World, tmo).unwrap();
    }
    // 4. Messaging through the event loop: rounds of SLOTS/2 inline messages to every peer,
    // each checked for sender, round and order. Starting it allocates (setup) and hands the
    // receive queues to the node, so it comes after the phases that post receives themselves.
    let allocs_before_messaging = allocs_all() - before;
    const SLOTS: usize = 16;
    node.start_messaging(SLOTS, 256).unwrap();
    // Every ring is posted before anyone sends.
    node.barrier_timeout(Members::World, tmo).unwrap();
    let messaging_start = allocs_all();
    let rounds = 50u32;
    let per_round = (SLOTS / 2) as u32;
    let mut next_from = [0u32; 8];
    let mut bad = 0u32;
    let mut completions_seen = 0u64;
    for round in 0..rounds {
        let got: [std::cell::Cell<u32>; 8] =
            core::array::from_fn(|i| std::cell::Cell::new(next_from[i]));
        let bad_seen = std::cell::Cell::new(0u32);
        let completions = std::cell::Cell::new(0u64);
        let on_event = |ev: rverbs_core::node::Event<'_>| match ev {
            rverbs_core::node::Event::Message { rank: from, data } if data.len() == 12 => {
                let sender = u32::from_le_bytes(data[..4].try_into().unwrap());
                let seq = u32::from_le_bytes(data[4..8].try_into().unwrap());
                let to = u32::from_le_bytes(data[8..].try_into().unwrap());
                let g = &got[from as usize];
                if sender != from || to != rank || seq != g.get() {
                    bad_seen.set(bad_seen.get() + 1);
                }
                g.set(g.get() + 1);
            }
            rverbs_core::node::Event::SendsCompleted { .. } => {
                completions.set(completions.get() + 1)
            }
            other => panic!("rank {rank}: unexpected event {other:?}"),
        };
        for r in (0..world).filter(|&r| r != rank) {
            for k in 0..per_round {
                let seq = round * per_round + k;
                let mut m = [0u8; 12];
                m[..4].copy_from_slice(&rank.to_le_bytes());
                m[4..8].copy_from_slice(&seq.to_le_bytes());
                m[8..].copy_from_slice(&r.to_le_bytes());
                // Completion shows up as an Event::SendsCompleted in progress; without
                // credit (the receiver has not returned it yet) the send waits its turn.
                let deadline = rverbs_core::poll::Deadline::after(clock, tmo);
                loop {
                    match node.post_send_inline(r, &m) {
                        Ok(_) => break,
                        Err(NodeError::WouldBlock { .. }) => {
                            assert!(!deadline.passed(clock), "rank {rank}: no credit from {r}");
                            node.progress(64, on_event).unwrap();
                        }
                        Err(e) => panic!("rank {rank}: send to {r}: {e}"),
                    }
                }
            }
        }
        let want = (round + 1) * per_round;
        let deadline = rverbs_core::poll::Deadline::after(clock, tmo);
        node.progress_until(deadline, on_event, || {
            (0..world)
                .filter(|&r| r != rank)
                .all(|r| got[r as usize].get() >= want)
        })
        .unwrap_or_else(|e| panic!("rank {rank} round {round}: {e}"));
        bad += bad_seen.get();
        completions_seen += completions.get();
        next_from = core::array::from_fn(|i| got[i].get());
    }
    assert_eq!(bad, 0, "rank {rank}: messages out of order or misaddressed");
    assert!(
        completions_seen > 0,
        "rank {rank}: no send completion events"
    );
    node.barrier_timeout(Members::World, tmo).unwrap();

    let allocs = allocs_before_messaging + (allocs_all() - messaging_start);
    eprintln!("rank {rank}: {allocs} allocations after connecting (messaging setup excluded)");
    assert_eq!(
        allocs, 0,
        "rank {rank}: barriers and multi-peer operations allocated"
    );
}

/// Per-rank 8-byte scatter entries over one region, without allocating.
mod heapless_like {
    use rverbs_core::sge::SgeMut;
    use rverbs_core::verbs::MemoryRegion;

    pub(crate) struct Outs<'a> {
        slots: [Option<[SgeMut<'a>; 1]>; 8],
    }

    impl<'a> Outs<'a> {
        pub(crate) fn new(mr: &'a mut MemoryRegion<'_>) -> Self {
            let mut slots: [Option<[SgeMut<'a>; 1]>; 8] = Default::default();
            for (i, s) in mr.chunks_mut(8).enumerate().take(8) {
                slots[i] = Some([s]);
            }
            Self { slots }
        }

        pub(crate) fn slot(&mut self, i: usize) -> &mut [SgeMut<'a>] {
            self.slots[i].as_mut().expect("world of at most 8")
        }
    }
}
