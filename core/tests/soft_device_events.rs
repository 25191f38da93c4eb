//! A device's asynchronous events as failure news, on the software model: a queue pair that
//! went fatal names the rank it leads to, a port that went down names the node's own rank;
//! raised on the node's alarm, either ends the node's next wait and reaches the peers.
#![allow(clippy::std_instead_of_core)]

use std::time::Duration;

use rverbs_core::barrier::BarrierAlgorithm;
use rverbs_core::failure::{FailureCause, QpFault};
use rverbs_core::poll::{StaticClock, StepClock};
use rverbs_core::verbs::AsyncEvent;

static CLOCK: StepClock = StepClock::new(Duration::from_micros(1));

#[test]
fn a_fatal_queue_pair_names_its_peer_and_a_port_down_names_this_rank() {
    let clock: StaticClock = &CLOCK;
    rverbs_testkit::soft_nodes!(let net, nodes = 4, BarrierAlgorithm::Dissemination, clock);

    // The table a watcher thread would take: every peer once, each queue pair once.
    let table = nodes[1].qp_ranks();
    let mut ranks: Vec<u32> = table.iter().map(|&(_, r)| r).collect();
    ranks.sort_unstable();
    assert_eq!(ranks, [0, 2, 3]);
    let (qp_to_3, _) = *table.iter().find(|&&(_, r)| r == 3).unwrap();
    assert_eq!(nodes[1].rank_of_qp(qp_to_3), Some(3));

    // Events that are no failure change nothing.
    for e in [
        AsyncEvent::PortActive { port: 1 },
        AsyncEvent::GidChange { port: 1 },
    ] {
        assert_eq!(nodes[1].failure_of_event(&e, 1), None);
    }

    let news = nodes[1]
        .failure_of_event(&AsyncEvent::QpFatal { qp_num: qp_to_3 }, 1)
        .expect("a fatal queue pair of the node is news");
    assert_eq!((news.rank, news.reporter), (3, 1));
    assert_eq!(news.cause, FailureCause::QueuePairFailed(QpFault::Fatal));
    assert!(nodes[1].failure_alarm().raise(news));
    rverbs_testkit::assert_barrier_fails_with(
        &mut nodes[1],
        news,
        &["rank 3 failed", "error state"],
    );
    // Passed on through the failure notice (its cause survives the 8-byte encoding).
    assert_eq!(nodes[0].failure(), Some(news));
    assert_eq!(nodes[2].failure(), Some(news));

    // A port down on rank 2's device: rank 2 names itself.
    let down = nodes[2]
        .failure_of_event(&AsyncEvent::PortError { port: 1 }, 1)
        .unwrap();
    assert_eq!((down.rank, down.reporter), (2, 2));
    assert_eq!(down.cause, FailureCause::PortDown { port: 1 });
    assert!(down.to_string().contains("port 1 went down"), "{down}");
    // Another port's news is not this node's.
    assert_eq!(
        nodes[2].failure_of_event(&AsyncEvent::PortError { port: 2 }, 1),
        None
    );
}
