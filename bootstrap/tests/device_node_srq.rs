//! Node messaging through one shared receive queue on a real device: 4 ranks as separate
//! processes exchange numbered messages through a pool of 12 receives each (4 credits per
//! peer), with rank 0 pausing 5 ms in every 20; every message arrives once and in order, no
//! completion fails, and the device's RNR NAK counters (`rcvd_rnr_err`, `send_rnr_err` in
//! sysfs) do not move. A control run proves those counters do count: a send to a rank that
//! has posted no receive yet moves them.
//!
//! The parent tests start one child process per rank: this same test binary, running the
//! ignored `child_rank` entry point with the scenario in environment variables.
#![allow(clippy::std_instead_of_core)] // test code

mod support;
use rverbs_core::node::Members;
use support::device;

use std::path::Path;
use std::time::{Duration, Instant};

use rverbs_bootstrap::connect;
use rverbs_core::node::{Event, NodeError, Receive};
use rverbs_core::params::RnrRetry;

const POOL: u32 = 12;
const SLOT: usize = 64;
const PER_PEER: u64 = 3000;

/// `rcvd_rnr_err + send_rnr_err` of port 1 of `dev`. Fails loudly if the device exposes
/// neither (the test would prove nothing).
fn rnr_count(dev: &str) -> u64 {
    let dir = Path::new("/sys/class/infiniband")
        .join(dev)
        .join("ports/1/hw_counters");
    let read = |n: &str| {
        std::fs::read_to_string(dir.join(n))
            .ok()
            .and_then(|s| s.trim().parse::<u64>().ok())
    };
    let (a, b) = (read("rcvd_rnr_err"), read("send_rnr_err"));
    assert!(
        a.is_some() || b.is_some(),
        "{} has no rcvd_rnr_err or send_rnr_err",
        dir.display()
    );
    a.unwrap_or(0) + b.unwrap_or(0)
}

/// Runs `world` child processes of `scenario`; returns how far the RNR counters moved.
fn run_world(scenario: &str, world: u32, port: u16) -> Option<u64> {
    let dev = device()?;
    let before = rnr_count(&dev);
    let (failed, took) = support::run_children("RVERBS_SRQ_", scenario, world, port, &dev);
    let moved = rnr_count(&dev) - before;
    eprintln!("{scenario} with {world} ranks: {took:?}, RNR counters +{moved}");
    assert!(failed.is_empty(), "{scenario}/{world}: {failed:?}");
    Some(moved)
}

#[test]
fn four_ranks_through_a_shared_pool_with_a_pausing_receiver_provoke_no_rnr() {
    if let Some(moved) = run_world("pool", 4, 22000) {
        assert_eq!(moved, 0, "a send found the shared receive queue empty");
    }
}

#[test]
fn the_rnr_counters_count_a_send_that_finds_no_receive() {
    if let Some(moved) = run_world("control", 2, 22100) {
        assert!(
            moved > 0,
            "the RNR counters did not move: they prove nothing"
        );
    }
}

/// The pool warns when it runs low: a receiver that stops polling while its peer sends
/// more than three quarters of the pool's receives gets the device's `SrqLimitReached`
/// event (the node armed it at a quarter of the pool), read by the device watch; then every
/// message is still delivered.
#[test]
fn a_pool_that_runs_low_raises_the_devices_limit_event() {
    if let Some(dev) = device() {
        let (failed, took) = support::run_children("RVERBS_SRQ_", "low_water", 2, 22200, &dev);
        eprintln!("low_water: {took:?}");
        assert!(failed.is_empty(), "low_water: {failed:?}");
    }
}

#[test]
#[ignore = "child-process entry point; the tests above run it"]
fn child_rank() {
    let (scenario, rank, world, port, dev) = support::world_env("RVERBS_SRQ_");
    let (config, mut opts) =
        support::local_options(world, port, &dev, format!("srq-{scenario}-{port}"));
    opts.node.components.messaging = Some(Receive::Shared { slots: POOL });
    // An RNR NAK is retried, not fatal: the counters, not a failed completion, tell.
    opts.node.qp.rnr_retry = RnrRetry::Infinite;
    let c = connect(&config, rank, &opts).unwrap_or_else(|e| panic!("rank {rank}: connect: {e}"));
    let watch = c.device_watch;
    let (mut node, mut session) = (c.node, c.session);
    assert_eq!(
        node.shared_receive_slots(),
        POOL,
        "rxe grants what was asked"
    );
    let tmo = Duration::from_secs(60);
    let w = world as usize;
    let mut got = vec![0u64; w];
    let handle = |ev: Event<'_>, got: &mut Vec<u64>| match ev {
        Event::Message {
            rank: from, data, ..
        } => {
            let seq = u64::from_le_bytes(data[..8].try_into().unwrap());
            assert_eq!(
                seq, got[from as usize],
                "rank {rank}: from {from} out of order"
            );
            got[from as usize] += 1;
        }
        Event::Failed { rank: r, error } => panic!("rank {rank}: peer {r} failed: {error}"),
        Event::SendsCompleted { .. } | Event::Written { .. } => {}
    };
    if scenario == "control" {
        // Rank 1 sends before rank 0 posted any receive: the device NAKs it (RNR) until
        // rank 0 starts messaging 200 ms later.
        if rank == 1 {
            node.post_send_inline(0, &0u64.to_le_bytes()).unwrap();
        } else {
            std::thread::sleep(Duration::from_millis(200));
        }
        node.start_messaging(POOL as usize, SLOT).unwrap();
        let t0 = Instant::now();
        while rank == 0 && got[1] == 0 {
            assert!(t0.elapsed() < tmo, "the control message never arrived");
            node.progress(8, |ev| handle(ev, &mut got)).unwrap();
        }
        session.allgather(b"done").unwrap();
        return;
    }
    node.start_messaging(POOL as usize, SLOT).unwrap();
    if scenario == "low_water" {
        // Rank 1 sends 10 of its 12 credits while rank 0 does not poll: 2 receives stay
        // posted, under the limit of 3 (a quarter of 12).
        const SENT: u64 = 10;
        node.barrier_timeout(Members::World, tmo).unwrap();
        if rank == 1 {
            for i in 0..SENT {
                node.post_send_inline(0, &i.to_le_bytes()).unwrap();
            }
        } else {
            let watch = watch.as_ref().expect("connect starts a device watch");
            let t0 = Instant::now();
            let seen = loop {
                let low = watch.seen().into_iter().find(|e| {
                    matches!(
                        e.event,
                        rverbs_core::verbs::AsyncEvent::SrqLimitReached { .. }
                    )
                });
                if let Some(e) = low {
                    break e;
                }
                assert!(
                    t0.elapsed() < Duration::from_secs(10),
                    "no SrqLimitReached event within 10 s: {:?}",
                    watch.seen()
                );
                std::thread::sleep(Duration::from_millis(10));
            };
            eprintln!("rank 0: {} after {:?}", seen.event, t0.elapsed());
            assert!(
                seen.failure.is_none(),
                "a low pool is a warning, not a failure"
            );
            while got[1] < SENT {
                assert!(t0.elapsed() < tmo, "the messages never arrived");
                node.progress(8, |ev| handle(ev, &mut got)).unwrap();
            }
        }
        session.allgather(b"done").unwrap();
        return;
    }
    assert_eq!(node.receive_memory(), POOL as usize * SLOT);
    assert_eq!(node.credits_per_peer(), POOL as usize / (w - 1));
    // Nobody sends before every pool is posted.
    node.barrier_timeout(Members::World, tmo).unwrap();
    let mut sent = vec![0u64; w];
    let peers: Vec<u32> = (0..world).filter(|&r| r != rank).collect();
    let t0 = Instant::now();
    let mut next_pause = t0 + Duration::from_millis(20);
    let expected = PER_PEER * (world as u64 - 1);
    while sent.iter().sum::<u64>() < expected || got.iter().sum::<u64>() < expected {
        assert!(
            t0.elapsed() < Duration::from_secs(300),
            "rank {rank}: stuck"
        );
        if rank == 0 && Instant::now() >= next_pause {
            std::thread::sleep(Duration::from_millis(5));
            next_pause += Duration::from_millis(20);
        }
        for &to in &peers {
            let n = &mut sent[to as usize];
            if *n == PER_PEER {
                continue;
            }
            let mut m = [0u8; SLOT];
            m[..8].copy_from_slice(&n.to_le_bytes());
            match node.post_send_inline(to, &m) {
                Ok(_) => *n += 1,
                Err(NodeError::WouldBlock { .. }) => {}
                Err(e) => panic!("rank {rank} -> {to}: {e}"),
            }
        }
        node.progress(64, |ev| handle(ev, &mut got)).unwrap();
    }
    eprintln!(
        "rank {rank}: {expected} messages each way in {:?}",
        t0.elapsed()
    );
    // Nobody tears down its queue pairs while a peer may still send to it.
    session.allgather(b"done").unwrap();
}
