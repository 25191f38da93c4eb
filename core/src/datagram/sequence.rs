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

/// Sequence numbers below the highest received that a [`SequenceTracker`] tells apart (a
/// late arrival fills its gap, a second arrival is a duplicate); older arrivals are
/// [stale](StreamCounts::stale).
pub const REORDER_WINDOW: u64 = 128;

/// The largest forward gap a [`SequenceTracker`] counts as lost in one step: a datagram
/// further ahead than this is [out of range](StreamCounts::out_of_range) (a stranger's, or
/// garbage) unless the next one agrees with it.
pub const MAX_GAP: u64 = 1 << 32;

/// What a [`SequenceTracker`] counted. Every datagram of the stream it saw is counted in
/// exactly one of `received`, `duplicates`, `stale` and `out_of_range`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct StreamCounts {
    /// Datagrams of the stream counted: each sequence number once (in order, or late
    /// within [`REORDER_WINDOW`] of the highest).
    pub received: u64,
    /// Sequence numbers skipped (a later one arrived first) that have not arrived since, in
    /// every run counted (see `restarts`). Exact for what lies between the first and the
    /// highest datagram of each run; a skipped number that arrives while it is within
    /// [`REORDER_WINDOW`] of the highest is taken off again, one that arrives later stays
    /// lost (that arrival is counted `stale`). Losses after the last datagram received are
    /// not counted here ([`SequenceTracker::missing_through`] counts them), nor those across
    /// a restart.
    pub lost: u64,
    /// Of `received`, datagrams that arrived after a higher sequence number and filled a
    /// gap.
    pub reordered: u64,
    /// Arrivals of a sequence number already counted (UD does not duplicate datagrams: a
    /// replay, or a restarted sender's first datagram).
    pub duplicates: u64,
    /// Arrivals too old to match: more than [`REORDER_WINDOW`] below the highest, or below
    /// the first datagram counted (a late joiner's first datagram overtook them). Not
    /// counted in `received`.
    pub stale: u64,
    /// Arrivals more than [`MAX_GAP`] ahead of the highest that the next datagram did not
    /// confirm: ignored.
    pub out_of_range: u64,
    /// Times counting started over: two consecutive datagrams agreed on a position the
    /// tracker did not expect (a duplicate, stale or out-of-range datagram, followed within
    /// [`REORDER_WINDOW`] by a higher one that is not expected either): the sender restarted
    /// its sequence, or jumped further ahead than [`MAX_GAP`]. The first of the two is then
    /// counted in `received` instead, `first` and `highest` describe the new run, and
    /// nothing between the runs is counted lost.
    pub restarts: u64,
    /// The first sequence number of the current run: where a receiver that joined late (or
    /// whose sender restarted) started counting.
    pub first: Option<u64>,
    /// The highest sequence number of the current run.
    pub highest: Option<u64>,
    /// Payloads without a valid sequence header.
    pub malformed: u64,
    /// Datagrams of other streams (not counted otherwise).
    pub foreign: u64,
}

/// The run being counted: from `first` to `highest`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Run {
    first: u64,
    highest: u64,
    /// Bit `i`: `highest - i` was received.
    seen: u128,
    /// Sequence numbers from `first` to `highest` not received.
    missing: u64,
}

/// Why a datagram did not fit the run (counted, and remembered in case the next one agrees).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Odd {
    Duplicate,
    Stale,
    OutOfRange,
}

/// Counts received, lost, reordered, duplicated and stray datagrams of one stream from their
/// sequence headers ([`StreamCounts`] says exactly what each counter means). Counting starts
/// at the first datagram seen, so a receiver that joins a group late counts nothing before
/// it as lost. One stray datagram (a stranger's, or a replay) cannot upset the counts: it
/// is counted as what it is and otherwise ignored, unless the next datagram continues from
/// it, which starts counting over (a restart). Does not allocate.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SequenceTracker {
    stream: Option<u32>,
    run: Option<Run>,
    /// The last datagram, if it did not fit the run.
    odd: Option<(u64, Odd)>,
    counts: StreamCounts,
}

impl SequenceTracker {
    /// A tracker for whichever stream it sees first.
    pub const fn new() -> Self {
        Self {
            stream: None,
            run: None,
            odd: None,
            counts: StreamCounts {
                received: 0,
                lost: 0,
                reordered: 0,
                duplicates: 0,
                stale: 0,
                out_of_range: 0,
                restarts: 0,
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
    /// stream is returned but only counted as foreign. Never panics, whatever the bytes.
    /// Does not allocate.
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
        self.count(h.sequence);
        Ok((h, rest))
    }

    /// Counts sequence number `seq` of the stream.
    fn count(&mut self, seq: u64) {
        let Some(run) = self.run.as_mut() else {
            self.start(seq);
            return;
        };
        let c = &mut self.counts;
        let odd = if seq > run.highest {
            let gap = seq - run.highest - 1;
            if gap < MAX_GAP {
                run.seen = if gap + 1 >= 128 {
                    1
                } else {
                    (run.seen << (gap + 1)) | 1
                };
                run.highest = seq;
                run.missing += gap;
                c.lost = c.lost.saturating_add(gap);
                c.received += 1;
                c.highest = Some(seq);
                self.odd = None;
                return;
            }
            Odd::OutOfRange
        } else {
            let back = run.highest - seq;
            if back >= REORDER_WINDOW || seq < run.first {
                Odd::Stale
            } else if run.seen & (1 << back) != 0 {
                Odd::Duplicate
            } else {
                run.seen |= 1 << back;
                run.missing = run.missing.saturating_sub(1);
                c.lost = c.lost.saturating_sub(1);
                c.received += 1;
                c.reordered += 1;
                self.odd = None;
                return;
            }
        };
        match self.odd {
            Some((p, was)) if seq > p && seq - p <= REORDER_WINDOW => {
                // The previous odd datagram and this one agree: count from the first of them.
                let undo = match was {
                    Odd::Duplicate => &mut self.counts.duplicates,
                    Odd::Stale => &mut self.counts.stale,
                    Odd::OutOfRange => &mut self.counts.out_of_range,
                };
                *undo -= 1;
                self.counts.restarts += 1;
                self.odd = None;
                self.start(p);
                // Within the window ahead of the new run's start: counted as in order.
                self.count(seq);
            }
            _ => {
                let n = match odd {
                    Odd::Duplicate => &mut self.counts.duplicates,
                    Odd::Stale => &mut self.counts.stale,
                    Odd::OutOfRange => &mut self.counts.out_of_range,
                };
                *n += 1;
                self.odd = Some((seq, odd));
            }
        }
    }

    /// Starts a run at `seq`.
    fn start(&mut self, seq: u64) {
        self.run = Some(Run {
            first: seq,
            highest: seq,
            seen: 1,
            missing: 0,
        });
        self.counts.received += 1;
        self.counts.first = Some(seq);
        self.counts.highest = Some(seq);
    }

    /// What it counted.
    pub const fn counts(&self) -> StreamCounts {
        self.counts
    }

    /// Sequence numbers of the current run, from its first one through `last` (a sequence
    /// number the sender announces, say at the end of a run) or the highest received if that
    /// is higher, that this receiver does not have: the losses after the last datagram
    /// received included. Takes any `last` (it may come from a peer); 0 before the first
    /// datagram.
    pub const fn missing_through(&self, last: u64) -> u64 {
        match self.run {
            Some(r) => r.missing.saturating_add(last.saturating_sub(r.highest)),
            None => 0,
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
