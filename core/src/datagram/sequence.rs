//! Counting what an unreliable transport lost: a sender numbers its datagrams
//! ([`Sequencer`], header format in [`crate::wire::sequence`]), every receiver counts the
//! gaps ([`SequenceTracker`]).
//!
//! ```
//! use rverbs_core::datagram::{SequenceTracker, Sequencer};
//!
//! let mut tx = Sequencer::new(7);
//! let sent: Vec<[u8; 16]> = (0..5).map(|_| tx.stamp()).collect();
//! let mut rx = SequenceTracker::new();
//! // Datagram 2 is lost, 4 overtakes 3.
//! for i in [0, 1, 4, 3] {
//!     let (h, body) = rx.observe(&sent[i]).unwrap();
//!     assert_eq!((h.stream, h.sequence, body.len()), (7, i as u64, 0));
//! }
//! let c = rx.counts();
//! assert_eq!((c.received, c.lost, c.reordered), (4, 1, 1));
//! // The sender says it sent 0..=5: one more never arrived.
//! assert_eq!(rx.missing_through(5), 2);
//! ```

use crate::wire::sequence::{SequenceHeader, SequenceHeaderError, SEQUENCE_HEADER_LEN};

/// Numbers the datagrams of one stream: the header to put in front of each payload.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Sequencer {
    stream: u32,
    next: u64,
}

impl Sequencer {
    /// Stream `stream`, starting at sequence 0.
    pub const fn new(stream: u32) -> Self {
        Self { stream, next: 0 }
    }

    /// The sequence number the next [`stamp`](Self::stamp) gives.
    pub const fn next_sequence(&self) -> u64 {
        self.next
    }

    /// The stream.
    pub const fn stream(&self) -> u32 {
        self.stream
    }

    /// The header of the next datagram (send it as the first part:
    /// [`Datagram::send_parts`](super::Datagram::send_parts)). Does not allocate.
    pub fn stamp(&mut self) -> [u8; SEQUENCE_HEADER_LEN] {
        let h = SequenceHeader {
            stream: self.stream,
            sequence: self.next,
        };
        self.next += 1;
        h.encode()
    }
}

/// What a [`SequenceTracker`] counted.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct StreamCounts {
    /// Datagrams of the stream received.
    pub received: u64,
    /// Sequence numbers skipped (a later one arrived first) and not made up for by a late
    /// arrival since: lost in transit, as far as this receiver can tell. Exact when the
    /// transport does not duplicate datagrams (UD does not); datagrams lost after the last
    /// one received are not counted here ([`SequenceTracker::missing_through`] counts them).
    pub lost: u64,
    /// Datagrams that arrived after one with a higher sequence number.
    pub reordered: u64,
    /// The first sequence number received: what a receiver that joined late starts from.
    pub first: Option<u64>,
    /// The highest sequence number received.
    pub highest: Option<u64>,
    /// Payloads without a valid sequence header.
    pub malformed: u64,
    /// Datagrams of other streams (not counted otherwise).
    pub foreign: u64,
}

/// Counts received, lost and reordered datagrams of one stream from their sequence headers.
/// Counting starts at the first datagram seen, so a receiver that joins a group late counts
/// nothing before it as lost. Does not allocate.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SequenceTracker {
    stream: Option<u32>,
    /// One past the highest sequence received.
    expected: Option<u64>,
    gaps: u64,
    counts: StreamCounts,
}

impl SequenceTracker {
    /// A tracker for whichever stream it sees first.
    pub const fn new() -> Self {
        Self {
            stream: None,
            expected: None,
            gaps: 0,
            counts: StreamCounts {
                received: 0,
                lost: 0,
                reordered: 0,
                first: None,
                highest: None,
                malformed: 0,
                foreign: 0,
            },
        }
    }

    /// A tracker for stream `stream` only.
    pub const fn for_stream(stream: u32) -> Self {
        let mut t = Self::new();
        t.stream = Some(stream);
        t
    }

    /// Reads the sequence header at the start of `payload`, counts the datagram, and
    /// returns the header and the application bytes after it. A payload without a valid
    /// header is counted as malformed and returned as the error; a datagram of another
    /// stream is returned but only counted as foreign. Does not allocate.
    pub fn observe<'a>(
        &mut self,
        payload: &'a [u8],
    ) -> Result<(SequenceHeader, &'a [u8]), SequenceHeaderError> {
        let (h, rest) = match SequenceHeader::decode(payload) {
            Ok(x) => x,
            Err(e) => {
                self.counts.malformed += 1;
                return Err(e);
            }
        };
        if *self.stream.get_or_insert(h.stream) != h.stream {
            self.counts.foreign += 1;
            return Ok((h, rest));
        }
        let c = &mut self.counts;
        c.received += 1;
        let seq = h.sequence;
        match self.expected {
            None => {
                c.first = Some(seq);
                self.expected = Some(seq.saturating_add(1));
            }
            Some(e) if seq >= e => {
                self.gaps += seq - e;
                self.expected = Some(seq.saturating_add(1));
            }
            Some(_) => c.reordered += 1,
        }
        c.highest = Some(c.highest.map_or(seq, |x| x.max(seq)));
        c.lost = self.gaps.saturating_sub(c.reordered);
        Ok((h, rest))
    }

    /// What it counted.
    pub const fn counts(&self) -> StreamCounts {
        self.counts
    }

    /// Datagrams of the stream from the first one received through `last` (a sequence
    /// number the sender announces, say at the end of a run) that this receiver does not
    /// have: the losses after the last datagram received included. Assumes no duplicates.
    pub const fn missing_through(&self, last: u64) -> u64 {
        match self.counts.first {
            Some(first) if last >= first => (last - first + 1).saturating_sub(self.counts.received),
            _ => 0,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_late_joiner_counts_from_what_it_first_sees() {
        let mut tx = Sequencer::new(1);
        let all: [[u8; 16]; 10] = core::array::from_fn(|_| tx.stamp());
        let mut rx = SequenceTracker::for_stream(1);
        for h in &all[6..] {
            rx.observe(h).unwrap();
        }
        let c = rx.counts();
        assert_eq!(
            (c.received, c.lost, c.first, c.highest),
            (4, 0, Some(6), Some(9))
        );
        assert_eq!(rx.missing_through(9), 0);
        assert_eq!(rx.missing_through(11), 2);
    }

    #[test]
    fn foreign_and_malformed_are_counted_apart() {
        let mut rx = SequenceTracker::for_stream(1);
        let other = Sequencer::new(2).stamp();
        assert!(rx.observe(&other).is_ok());
        assert!(rx.observe(b"short").is_err());
        let c = rx.counts();
        assert_eq!((c.received, c.foreign, c.malformed), (0, 1, 1));
    }
}
