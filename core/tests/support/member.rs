//! What a child process that is a multicast member checks, in the tests where one sender
//! streams sequenced datagrams (48 bytes of `0x5a` behind each sequence header) to a group.

use std::time::Duration;

use rverbs_core::datagram::{Datagram, DatagramError, Group, SequenceTracker};
use rverbs_core::memory::Region;
use rverbs_core::poll::{Backoff, Deadline};
use rverbs_core::provider::datagram::DatagramProvider;

use super::{allocs, WALL};

/// Receives `n` datagrams sent to `group`, which must be the sequence numbers
/// `first..first + n` in order, none lost, none reordered; returns the allocations made
/// meanwhile.
pub fn receive_in_order<P: DatagramProvider, M: Region, B: Backoff, const N: usize>(
    ep: &mut Datagram<P, M, B, N>,
    tracker: &mut SequenceTracker,
    group: Group,
    first: u64,
    n: u64,
) -> u64 {
    let before = allocs();
    let mut got = 0;
    while got < n {
        let d = ep.recv().unwrap();
        assert_eq!(d.source.group, Some(group.gid()));
        let (h, body) = tracker.observe(d.payload).unwrap();
        assert_eq!(h.sequence, first + got, "in order, none missing");
        assert_eq!(body, &[0x5au8; 48]);
        got += 1;
    }
    let c = tracker.counts();
    assert_eq!((c.lost, c.reordered), (0, 0));
    allocs() - before
}

/// Waits `wait` for one datagram; returns how many arrived (0 or 1) and the allocations made
/// meanwhile.
pub fn receive_within<P: DatagramProvider, M: Region, B: Backoff, const N: usize>(
    ep: &mut Datagram<P, M, B, N>,
    wait: Duration,
) -> (u64, u64) {
    let before = allocs();
    let deadline = Deadline::after(&WALL, wait);
    let got = match ep.recv_until(deadline) {
        Ok(_) => 1,
        Err(DatagramError::TimedOut { .. }) => 0,
        Err(e) => panic!("{e}"),
    };
    (got, allocs() - before)
}
