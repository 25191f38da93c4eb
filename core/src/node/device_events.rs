//! What a device's asynchronous events mean for a node: which rank's failure news each one
//! is (see [`crate::failure`]).
//!
//! A node does not read the events itself: reading them is a sleep on a descriptor, and a
//! node never sleeps on its own. A watcher (in std code, `rverbs_bootstrap`'s device watch)
//! reads them ([`AsyncEvents`](crate::verbs::AsyncEvents)), asks [`failure_of_event`] what
//! each means, and raises the answer on the node's
//! [failure alarm](super::Node::failure_alarm), which ends the node's waits at once and is
//! passed on to every peer that can still be reached.
//!
//! - This node's port went down, or its device failed: the failed rank is this node's own.
//!   Its peers cannot be told over the dead link; they see their requests to it fail or time
//!   out, naming it.
//! - A queue pair went into the error state: the rank it leads to (the node's channel table
//!   knows which rank each queue pair number serves).
//! - Everything else (a port coming back, GID changes, SRQ limits, the last receive of a
//!   queue pair): no failure; the watcher reports it as it is.

use crate::failure::{Failure, FailureCause, QpFault};
use crate::verbs::AsyncEvent;

/// The failure news `event` is for rank `me`, whose channels use `port`, given which rank
/// each queue pair number leads to (`rank_of_qp`). `None` for an event that is no failure
/// (or is about another port, or a queue pair that is none of this node's channels).
pub fn failure_of_event(
    event: &AsyncEvent,
    me: u32,
    port: u8,
    rank_of_qp: impl Fn(u32) -> Option<u32>,
) -> Option<Failure> {
    let qp = |qp_num: u32, fault: QpFault| {
        rank_of_qp(qp_num).map(|rank| (rank, FailureCause::QueuePairFailed(fault)))
    };
    let (rank, cause) = match *event {
        AsyncEvent::PortError { port: p } if p == port => (me, FailureCause::PortDown { port }),
        AsyncEvent::DeviceFatal => (me, FailureCause::DeviceFatal),
        AsyncEvent::QpFatal { qp_num } => qp(qp_num, QpFault::Fatal)?,
        AsyncEvent::QpRequestError { qp_num } => qp(qp_num, QpFault::InvalidRequest)?,
        AsyncEvent::QpAccessError { qp_num } => qp(qp_num, QpFault::AccessError)?,
        _ => return None,
    };
    Some(Failure {
        rank,
        cause,
        reporter: me,
    })
}

impl<P: crate::provider::Provider, M: crate::memory::Region, B: crate::poll::Backoff + Clone>
    super::Node<P, M, B>
{
    /// The rank whose channel runs on queue pair `qp_num`, if one does.
    pub fn rank_of_qp(&self, qp_num: u32) -> Option<u32> {
        self.multi.rank_of_qp(qp_num)
    }

    /// Every channel's queue pair number with its rank: the table a watcher in another
    /// thread names failed queue pairs by ([`failure_of_event`]). A readmitted rank gets a new
    /// queue pair: take the table again after [`Node::readmit_finish`](super::Node::readmit_finish).
    pub fn qp_ranks(&self) -> alloc::vec::Vec<(u32, u32)> {
        self.multi.qp_ranks().collect()
    }

    /// Replaces the probe the node asks, when a request fails on this side, whether its own
    /// link is down (and what to call it): a verbs node starts with one that asks the device
    /// for its port's state. std code can do better: the port's state changes only after
    /// the kernel has finished taking the link down, while requests in flight fail from the
    /// start of it (`rverbs_bootstrap::device_watch::link_probe` also asks the network
    /// interface). Called only on that error path, from the thread that waits.
    pub fn set_link_probe(
        &mut self,
        probe: impl Fn() -> Option<crate::failure::FailureCause> + Send + Sync + 'static,
    ) {
        self.failures
            .set_link_probe(super::failure::LinkProbe(alloc::sync::Arc::new(probe)));
    }

    /// The failure news `event` is for this node, whose channels use `port`
    /// ([`failure_of_event`] with this node's rank and channel table).
    pub fn failure_of_event(&self, event: &AsyncEvent, port: u8) -> Option<Failure> {
        failure_of_event(event, self.rank, port, |q| self.rank_of_qp(q))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn table(q: u32) -> Option<u32> {
        match q {
            0x11 => Some(1),
            0x12 => Some(2),
            _ => None,
        }
    }

    #[test]
    fn a_port_down_names_this_rank_and_a_failed_queue_pair_its_peer() {
        let f = failure_of_event(&AsyncEvent::PortError { port: 1 }, 0, 1, table).unwrap();
        assert_eq!((f.rank, f.reporter), (0, 0));
        assert_eq!(f.cause, FailureCause::PortDown { port: 1 });
        let f = failure_of_event(&AsyncEvent::QpFatal { qp_num: 0x12 }, 0, 1, table).unwrap();
        assert_eq!(f.rank, 2);
        assert_eq!(f.cause, FailureCause::QueuePairFailed(QpFault::Fatal));
        let f = failure_of_event(&AsyncEvent::QpAccessError { qp_num: 0x11 }, 3, 1, table);
        assert_eq!(f.map(|f| (f.rank, f.reporter)), Some((1, 3)));
        let f = failure_of_event(&AsyncEvent::DeviceFatal, 5, 1, table).unwrap();
        assert_eq!((f.rank, f.cause), (5, FailureCause::DeviceFatal));
    }

    #[test]
    fn other_events_are_no_failure() {
        for e in [
            AsyncEvent::PortError { port: 2 }, // another port than the node's
            AsyncEvent::PortActive { port: 1 },
            AsyncEvent::GidChange { port: 1 },
            AsyncEvent::QpFatal { qp_num: 0x99 }, // not one of the node's queue pairs
            AsyncEvent::QpLastWqeReached { qp_num: 0x11 },
            AsyncEvent::SrqLimitReached { srq_handle: 1 },
            AsyncEvent::Unknown { code: 77 },
        ] {
            assert_eq!(failure_of_event(&e, 0, 1, table), None, "{e}");
        }
    }
}
