//! Failure news on the software model: a rank whose process dies mid-barrier is named by
//! every survivor, whatever rank each happened to wait for, with every barrier algorithm; a
//! failure raised on a node's alarm ends its waits and is passed on; news about a rank outside
//! a sub-group's members does not fail that group's barrier.
#![allow(clippy::std_instead_of_core)]

use rverbs_core::node::Members;
use std::time::Duration;

use rverbs_core::barrier::{BarrierAlgorithm, BarrierError};
use rverbs_core::channel::ChannelError;
use rverbs_core::completion::WcStatus;
use rverbs_core::failure::{Failure, FailureCause};
use rverbs_core::node::{NodeError, SoftNode};
use rverbs_core::poll::Spin;
use rverbs_testkit::barrier_answers;
use rverbs_testkit::clock;

/// How far the step clocks move at each reading.
const STEP: Duration = Duration::from_micros(1);

const WORLD: u32 = if cfg!(miri) { 5 } else { 64 };

/// Probes that give up soon: the model's retries run out within a few hundred polls, and a
/// step clock advances 1 us per reading.
fn quick_probes(nodes: &mut [SoftNode<'_, Spin>]) {
    for n in nodes {
        n.set_probe_grace(Duration::from_millis(if cfg!(miri) { 1 } else { 20 }));
    }
}

/// [`rverbs_testkit::soft_nodes`] with [`quick_probes`].
macro_rules! quick_probed_nodes {
    (let $net:ident, $nodes:ident = $($world:tt)*) => {
        rverbs_testkit::soft_nodes!(let $net, $nodes = $($world)*);
        quick_probes(&mut $nodes);
    };
}

fn assert_all_name(answers: &[(u32, Result<(), NodeError>)], dead: u32, alg: BarrierAlgorithm) {
    for (r, a) in answers {
        match a {
            Err(NodeError::Barrier(BarrierError::PeerFailed(f))) => {
                assert_eq!(f.rank, dead, "rank {r} ({}) blamed {f}", alg.name());
                assert_ne!(f.reporter, dead);
            }
            other => panic!(
                "rank {r} ({}): expected news that rank {dead} failed, got {other:?}",
                alg.name()
            ),
        }
    }
}

#[test]
fn a_rank_killed_mid_barrier_is_named_by_every_survivor() {
    for alg in BarrierAlgorithm::ALL {
        // The leader (or tree root) and a rank in the middle.
        // Under Miri, one victim per algorithm (the leader for Centralized).
        let victims: &[u32] = if cfg!(miri) {
            &[0]
        } else {
            &[0, WORLD / 2 + 1]
        };
        for &dead in victims {
            let clock = clock!(STEP);
            quick_probed_nodes!(let net, nodes = WORLD, alg, clock);
            // One good barrier first, so the failure lands in a world that worked.
            let all = barrier_answers(&mut nodes, Duration::from_secs(1));
            assert!(all.iter().all(|(_, a)| a.is_ok()), "{all:?}");
            net.kill(dead);
            let timeout = Duration::from_millis(if cfg!(miri) { 1 } else { 5 });
            let answers = barrier_answers(nodes.iter_mut().filter(|n| n.rank() != dead), timeout);
            assert_eq!(answers.len(), WORLD as usize - 1);
            assert_all_name(&answers, dead, alg);
            // Every survivor knows, and the node stays poisoned until a rejoin.
            for n in nodes.iter_mut().filter(|n| n.rank() != dead) {
                assert_eq!(n.failure().map(|f| f.rank), Some(dead));
                assert!(n.is_poisoned());
            }
        }
    }
}

/// A killed process's memory registrations go before its queue pairs (seen on rxe in CI):
/// for a moment its queue pairs refuse writes with a remote access error instead of staying
/// silent, and the session watch tells of the death only later. A rank whose blocking
/// barrier meets the refusal waits (up to the probe grace) for that news and passes it on,
/// so a rank that waits for it (and never wrote to the dying one) names the dying rank too,
/// not a timeout of the live rank that left the barrier.
#[test]
#[cfg_attr(
    miri,
    ignore = "a second thread raises the alarm after a real-time pause"
)]
fn a_refused_notification_waits_for_the_news_and_passes_it_on() {
    // Dissemination over 3 ranks: rank 1 notifies rank 2 in the first round and waits for
    // rank 0's notification; rank 0 waits for rank 2 in the first round, so it never writes
    // to rank 2 and hears of it only from rank 1.
    let dying = 2;
    let clock = clock!(STEP);
    quick_probed_nodes!(let net, nodes = 3, BarrierAlgorithm::Dissemination, clock);
    let all = barrier_answers(&mut nodes, Duration::from_secs(1));
    assert!(all.iter().all(|(_, a)| a.is_ok()), "{all:?}");
    net.release_regions(dying);
    nodes[0]
        .barrier_start_timeout(Members::World, Duration::from_secs(3600))
        .unwrap();
    // Far longer than the test: the wait must end on the news, not on the grace.
    nodes[1].set_probe_grace(Duration::from_secs(3600));
    let alarm = nodes[1].failure_alarm();
    let news = Failure {
        rank: dying,
        cause: FailureCause::SessionClosed,
        reporter: 1,
    };
    let watch = std::thread::spawn(move || {
        std::thread::sleep(std::time::Duration::from_millis(20));
        assert!(alarm.raise(news));
    });
    let e = nodes[1].barrier_timeout(Members::World, Duration::from_secs(3600));
    watch.join().unwrap();
    match e {
        Err(NodeError::Barrier(BarrierError::PeerFailed(f))) => assert_eq!(f, news),
        other => panic!("rank 1: expected the news of rank {dying}, got {other:?}"),
    }
    // Bounded: its hour-long deadline is far, and the notice must land within these polls.
    let e = (0..100_000)
        .find_map(|_| match nodes[0].barrier_poll() {
            Ok(false) => None,
            Ok(true) => panic!("rank 0 completed without rank {dying}"),
            Err(e) => Some(e),
        })
        .expect("rank 0 heard nothing in 100000 polls");
    match e {
        NodeError::Barrier(BarrierError::PeerFailed(f)) => assert_eq!(f, news),
        other => panic!("rank 0: expected the news rank 1 passed on, got {other:?}"),
    }
}

/// The caller's own request with a bad key fails on a node channel with the same remote
/// access error a dying peer's refusal gives. With no news of the peer within the probe
/// grace, the barrier fails with that error, naming the peer and the status, and no rank is
/// told that the live peer failed.
#[test]
fn a_callers_bad_key_is_not_a_peers_failure() {
    let clock = clock!(STEP);
    quick_probed_nodes!(let _net, nodes = 4, BarrierAlgorithm::Dissemination, clock);
    let all = barrier_answers(&mut nodes, Duration::from_secs(1));
    assert!(all.iter().all(|(_, a)| a.is_ok()), "{all:?}");
    let mut bogus = nodes[0].peer_window(1).unwrap();
    bogus.rkey ^= 0x5a5a;
    nodes[0]
        .channel(1)
        .unwrap()
        .post_write_inline(&[1u8; 8], bogus)
        .unwrap();
    match nodes[0].barrier_timeout(Members::World, Duration::from_millis(5)) {
        Err(NodeError::Barrier(BarrierError::Transport { rank, error })) => {
            assert_eq!(rank, 1);
            assert!(
                matches!(&error, ChannelError::Failed(w) | ChannelError::Broken(w)
                    if w.status == WcStatus::RemoteAccess),
                "{error:?}"
            );
        }
        other => panic!("expected the refused write's error, got {other:?}"),
    }
    for n in nodes.iter_mut() {
        assert_eq!(n.failure(), None, "rank {} holds news", n.rank());
    }
}

/// A refusal is a symptom: when the dying rank's goodbye already raised the cause on a
/// survivor's alarm (it left because of an error), that survivor's refused write names the
/// cause, and so does every rank it tells; here through the barrier's poll, which never
/// waits.
#[test]
fn a_refusal_after_news_names_the_news_cause() {
    // Dissemination over 3 ranks: rank 1 notifies rank 2 in the first round; rank 0 waits
    // for rank 2 in the first round and so never writes to it (it hears from rank 1).
    let world = 3;
    let dying = 2;
    let clock = clock!(STEP);
    quick_probed_nodes!(let net, nodes = world, BarrierAlgorithm::Dissemination, clock);
    let all = barrier_answers(&mut nodes, Duration::from_secs(1));
    assert!(all.iter().all(|(_, a)| a.is_ok()), "{all:?}");
    let left = Failure {
        rank: dying,
        cause: FailureCause::LeftOnError,
        reporter: 0,
    };
    // Rank 1's write to rank 2 is refused; the news is on its alarm already.
    assert!(nodes[1].failure_alarm().raise(left));
    net.release_regions(dying);
    let answers = barrier_answers(
        nodes.iter_mut().filter(|n| n.rank() != dying),
        Duration::from_millis(5),
    );
    for (r, a) in &answers {
        match a {
            Err(NodeError::Barrier(BarrierError::PeerFailed(f))) => {
                assert_eq!(f.rank, dying, "rank {r}: {f}");
                assert_eq!(f.cause, FailureCause::LeftOnError, "rank {r}: {f}");
            }
            other => panic!("rank {r}: expected news that rank {dying} left, got {other:?}"),
        }
    }
}

#[test]
fn a_rank_that_stalls_is_still_a_timeout_after_the_probe() {
    // Nobody died: the stalled rank answers the probe, so the leader reports a timeout that
    // names it, and no failure is invented.
    let world_size = if cfg!(miri) { 4 } else { 16 };
    let clock = clock!(STEP);
    quick_probed_nodes!(let net, nodes = world_size, BarrierAlgorithm::Centralized, clock);
    let stalled = world_size - 1;
    let answers: Vec<_> = {
        let mut v = Vec::new();
        for n in nodes.iter_mut().filter(|n| n.rank() != stalled) {
            n.barrier_start_timeout(Members::World, Duration::from_millis(5))
                .unwrap();
        }
        let e = loop {
            match nodes[0].barrier_poll() {
                Ok(false) => {}
                Ok(true) => panic!("completed without rank {stalled}"),
                Err(e) => break e,
            }
        };
        v.push(e);
        v
    };
    match &answers[0] {
        NodeError::Barrier(BarrierError::Timeout { missing, .. }) => {
            assert_eq!(missing.as_slice(), &[stalled]);
        }
        other => panic!("expected a timeout naming rank {stalled}, got {other}"),
    }
    assert_eq!(nodes[0].failure(), None);
    // The operator's counters say the same: one barrier timed out waiting for the stalled
    // rank, none for any other, and nobody is counted as failed.
    let c = nodes[0].peer_counters(stalled).unwrap();
    assert_eq!((c.barrier_timeouts, c.failed), (1, None), "{c:?}");
    assert_eq!(nodes[0].peer_counters(1).unwrap().barrier_timeouts, 0);
}

/// The blocking whole-world dissemination barrier (its own start, specialised) waits like
/// every other: a stalled rank is probed, then named in a timeout, and counted against it.
#[test]
fn a_blocking_dissemination_barrier_names_a_stalled_rank_after_the_probe() {
    let world_size = if cfg!(miri) { 4 } else { 8 };
    let clock = clock!(STEP);
    quick_probed_nodes!(let net, nodes = world_size, BarrierAlgorithm::Dissemination, clock);
    // Rank 0 waits for the stalled rank in its first round (at distance 1 below it).
    let stalled = world_size - 1;
    for n in nodes[1..].iter_mut().filter(|n| n.rank() != stalled) {
        n.barrier_start_timeout(Members::World, Duration::from_millis(5))
            .unwrap();
    }
    let e = nodes[0]
        .barrier_timeout(Members::World, Duration::from_millis(5))
        .unwrap_err();
    match &e {
        NodeError::Barrier(BarrierError::Timeout { missing, .. }) => {
            assert_eq!(missing.as_slice(), &[stalled], "{e}");
        }
        other => panic!("expected a timeout naming rank {stalled}, got {other}"),
    }
    assert_eq!(nodes[0].failure(), None);
    let c = nodes[0].peer_counters(stalled).unwrap();
    assert_eq!((c.barrier_timeouts, c.failed), (1, None), "{c:?}");
    // A failed barrier poisons the node: the next one is refused at once.
    assert!(nodes[0].is_poisoned());
    assert_eq!(
        nodes[0].barrier_timeout(Members::World, Duration::from_millis(5)),
        Err(NodeError::Barrier(BarrierError::Poisoned))
    );
}

#[test]
fn a_failure_raised_on_the_alarm_ends_a_wait_and_names_the_rank() {
    let world_size = 4;
    let clock = clock!(STEP);
    quick_probed_nodes!(let net, nodes = world_size, BarrierAlgorithm::Dissemination, clock);
    // A rank outside the world is not news.
    let other = nodes[3].failure_alarm();
    let news = Failure {
        rank: 2,
        cause: FailureCause::SessionClosed,
        reporter: 0,
    };
    assert!(other.raise(Failure {
        rank: world_size,
        ..news
    }));
    assert_eq!(nodes[3].failure(), None);
    assert!(
        other.raise(Failure {
            reporter: 3,
            ..news
        }),
        "ignored news made room"
    );
    assert_eq!(nodes[3].failure().map(|f| f.reporter), Some(3));

    let alarm = nodes[1].failure_alarm();
    assert!(alarm.raise(news));
    // A second raise does not replace the first.
    assert!(!alarm.raise(Failure { rank: 3, ..news }));
    rverbs_testkit::assert_barrier_fails_with(
        &mut nodes[1],
        news,
        &["rank 2 failed", "session closed"],
    );
    // Rank 1 passed the news on to every other rank but the failed one.
    assert_eq!(nodes[0].failure(), Some(news));
    assert_eq!(nodes[2].failure(), None);
}

/// A rank that gave up (its bootstrap goodbye said so) is news like a crash, with its own
/// cause: every other rank's next wait fails at once naming it, not at its timeout.
#[test]
fn a_rank_that_left_on_error_fails_every_next_wait_naming_it() {
    let world_size = 4;
    let clock = clock!(STEP);
    quick_probed_nodes!(let net, nodes = world_size, BarrierAlgorithm::Dissemination, clock);
    net.kill(2);
    let news = Failure {
        rank: 2,
        cause: FailureCause::LeftOnError,
        reporter: 0,
    };
    // Rank 0's session watch saw rank 2's goodbye with a reason.
    assert!(nodes[0].failure_alarm().raise(news));
    let start = clock.now();
    for r in [0usize, 1, 3] {
        let e = nodes[r]
            .barrier_timeout(Members::World, Duration::from_secs(3600))
            .unwrap_err();
        assert_eq!(
            e,
            NodeError::Barrier(BarrierError::PeerFailed(news)),
            "rank {r}"
        );
        assert!(e.to_string().contains("rank 2 failed"), "{e}");
        assert!(e.to_string().contains("because of an error"), "{e}");
    }
    // Not at the hour-long timeout: within the few reads of the step clock the waits took.
    assert!(clock.now().saturating_duration_since(start) < Duration::from_secs(1));
    // The counters name the cause on rank 2's entry only.
    for r in [0usize, 1, 3] {
        let c = nodes[r].peer_counters(2).unwrap();
        assert_eq!(c.failed, Some(FailureCause::LeftOnError), "rank {r}: {c:?}");
        let other = if r == 0 { 1 } else { 0 };
        assert_eq!(nodes[r].peer_counters(other).unwrap().failed, None);
    }
}

#[test]
fn news_about_a_rank_outside_a_group_does_not_fail_the_group() {
    quick_probed_nodes!(let net, nodes = 4, BarrierAlgorithm::Dissemination, clock!(STEP));
    net.kill(3);
    assert!(nodes[0].failure_alarm().raise(Failure {
        rank: 3,
        cause: FailureCause::SessionClosed,
        reporter: 0,
    }));
    let group = [0, 1, 2];
    for _ in 0..3 {
        let mut open: Vec<u32> = Vec::new();
        for r in group {
            let n = &mut nodes[r as usize];
            n.set_algorithm(BarrierAlgorithm::Dissemination);
            n.barrier_start_timeout(&group, TIMEOUT_OK).unwrap();
            open.push(r);
        }
        while !open.is_empty() {
            open.retain(|&r| {
                !nodes[r as usize]
                    .barrier_poll()
                    .unwrap_or_else(|e| panic!("rank {r}: {e}"))
            });
        }
    }
    // The news reached every member, and a barrier over the whole world fails on it.
    for r in group {
        assert_eq!(nodes[r as usize].failure().map(|f| f.rank), Some(3));
    }
    let e = nodes[1]
        .barrier_timeout(Members::World, TIMEOUT_OK)
        .unwrap_err();
    assert!(
        matches!(e, NodeError::Barrier(BarrierError::PeerFailed(f)) if f.rank == 3),
        "{e}"
    );
}

/// A member refuses a group's barrier notification while news about a rank outside the
/// group is known (the only news a node keeps): the group's barrier fails with the refusal,
/// naming the member, not with the stranger's news (which a group's barrier ignores, and
/// would have gone on waiting with a broken channel), in the poll and in the blocking wait.
#[test]
fn a_members_refusal_is_not_taken_for_news_about_a_stranger() {
    quick_probed_nodes!(let net, nodes = 4, BarrierAlgorithm::Dissemination, clock!(STEP));
    net.kill(3);
    let stranger = Failure {
        rank: 3,
        cause: FailureCause::SessionClosed,
        reporter: 1,
    };
    assert!(nodes[1].failure_alarm().raise(stranger));
    assert_eq!(nodes[1].failure(), Some(stranger));
    // Dissemination over [0, 1, 2]: rank 1 notifies rank 2 first.
    net.release_regions(2);
    let group = [0, 1, 2];
    let refused = |e: &NodeError| {
        matches!(
            e,
            NodeError::Barrier(BarrierError::Transport { rank: 2, .. })
        ) && e.is_refusal()
    };
    nodes[1].barrier_start_timeout(&group, TIMEOUT_OK).unwrap();
    let e = (0..100_000)
        .find_map(|_| match nodes[1].barrier_poll() {
            Ok(false) => None,
            Ok(true) => panic!("completed without rank 2"),
            Err(e) => Some(e),
        })
        .expect("the refusal within 100000 polls");
    assert!(refused(&e), "{e:?}");
    // The blocking barrier (a fresh world): the stranger's news ends the refusal's wait at
    // once, with the refusal.
    quick_probed_nodes!(let net, nodes = 4, BarrierAlgorithm::Dissemination, clock!(STEP));
    net.kill(3);
    assert!(nodes[1].failure_alarm().raise(stranger));
    assert_eq!(nodes[1].failure(), Some(stranger));
    net.release_regions(2);
    nodes[1].set_probe_grace(TIMEOUT_OK);
    let e = nodes[1].barrier_timeout(&group, TIMEOUT_OK).unwrap_err();
    assert!(refused(&e), "{e:?}");
}

const TIMEOUT_OK: Duration = Duration::from_secs(3600);
