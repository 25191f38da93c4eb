//! Rank 0's unidentified connections (accepted, hello not yet read), oldest
//! first, and which one to close when a new one needs room.
//!
//! A real rank is unidentified for one round trip: it reads the challenge and
//! sends its hello at once. A client that lingers is not a rank. So when a new
//! connection would pass a limit, the one to go is the oldest unidentified one:
//! of the same source when that source is at its share, else of all. One source
//! never holds more than its share, so a flood from one address (or one IPv6
//! /64) closes only its own connections, and other sources' ranks keep theirs.
//! A connection whose hello has been read in full is never closed here: its
//! reader has finished and rank 0 is about to judge it.

use core::fmt;
use core::net::{IpAddr, SocketAddr};
use std::collections::{BTreeMap, HashMap, VecDeque};
use std::time::Instant;

/// Where a connection comes from, for the per-source share: an IPv4 address
/// (IPv4-mapped IPv6 included), or an IPv6 /64, since one host usually holds a
/// whole /64 and could otherwise take a new address per connection.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(super) struct Source(IpAddr);

impl Source {
    pub(super) fn of(addr: SocketAddr) -> Self {
        match addr.ip() {
            IpAddr::V4(v4) => Self(IpAddr::V4(v4)),
            IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
                Some(v4) => Self(IpAddr::V4(v4)),
                None => {
                    let mut segments = v6.segments();
                    segments[4..].fill(0);
                    Self(IpAddr::V6(segments.into()))
                }
            },
        }
    }
}

impl fmt::Display for Source {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.0 {
            IpAddr::V4(v4) => write!(f, "{v4}"),
            IpAddr::V6(v6) => write!(f, "{v6}/64"),
        }
    }
}

/// A connection's reader, as far as the table needs to know it.
pub(super) trait Reading {
    /// Whether its hello has been read in full (or its read has ended).
    fn finished(&self) -> bool;
}

/// One unidentified connection.
#[derive(Debug)]
pub(super) struct Unidentified<T> {
    pub(super) addr: SocketAddr,
    pub(super) accepted: Instant,
    pub(super) conn: T,
}

/// Which limit made room necessary.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Crowded {
    /// The new connection's source had `count` unidentified connections, its share.
    Source { source: Source, count: usize },
    /// There were `count` unidentified connections in all, the limit.
    All { count: usize },
}

impl fmt::Display for Crowded {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Source { source, count } => write!(
                f,
                "{source} had {count} unidentified connections, its share"
            ),
            Self::All { count } => write!(f, "{count} unidentified connections in all, the limit"),
        }
    }
}

/// The unidentified connections by id (ids grow with the time of accepting, so
/// the smallest is the oldest), and the ids of each source, oldest first.
#[derive(Debug)]
pub(super) struct Pending<T> {
    entries: BTreeMap<u64, Unidentified<T>>,
    by_source: HashMap<Source, VecDeque<u64>>,
    per_source: usize,
    cap: usize,
}

impl<T: Reading> Pending<T> {
    /// A table that keeps at most `per_source` connections of one source and
    /// `cap` in all (both at least 1).
    pub(super) fn new(per_source: usize, cap: usize) -> Self {
        Self {
            entries: BTreeMap::new(),
            by_source: HashMap::new(),
            per_source: per_source.max(1),
            cap: cap.max(1),
        }
    }

    /// Adds a connection; `id` must be larger than every id added before.
    pub(super) fn insert(&mut self, id: u64, entry: Unidentified<T>) {
        self.by_source
            .entry(Source::of(entry.addr))
            .or_default()
            .push_back(id);
        self.entries.insert(id, entry);
    }

    /// Takes connection `id` out of the table, if it is still there.
    pub(super) fn remove(&mut self, id: u64) -> Option<Unidentified<T>> {
        let entry = self.entries.remove(&id)?;
        let source = Source::of(entry.addr);
        if let Some(ids) = self.by_source.get_mut(&source) {
            if let Some(at) = ids.iter().position(|other| *other == id) {
                ids.remove(at);
            }
            if ids.is_empty() {
                self.by_source.remove(&source);
            }
        }
        Some(entry)
    }

    /// Makes room for one more connection from `source`: if that source holds
    /// its share, takes out and returns its oldest unfinished connection; else,
    /// if the table is full, the oldest unfinished one of all. `None` when both
    /// limits hold (or every connection at the limit has finished its read).
    pub(super) fn make_room(&mut self, source: Source) -> Option<(Unidentified<T>, Crowded)> {
        let of_source = self.by_source.get(&source).map_or(0, VecDeque::len);
        if of_source >= self.per_source {
            let oldest = self.by_source.get(&source).and_then(|ids| {
                ids.iter()
                    .copied()
                    .find(|id| self.entries.get(id).is_some_and(|e| !e.conn.finished()))
            });
            if let Some(id) = oldest {
                let crowded = Crowded::Source {
                    source,
                    count: of_source,
                };
                return self.remove(id).map(|entry| (entry, crowded));
            }
        }
        if self.entries.len() >= self.cap {
            let count = self.entries.len();
            let oldest = self
                .entries
                .iter()
                .find(|(_, entry)| !entry.conn.finished())
                .map(|(id, _)| *id);
            if let Some(id) = oldest {
                return self.remove(id).map(|entry| (entry, Crowded::All { count }));
            }
        }
        None
    }

    /// Every connection in the table, oldest first (for closing them all).
    pub(super) fn drain(&mut self) -> impl Iterator<Item = Unidentified<T>> + '_ {
        self.by_source.clear();
        core::mem::take(&mut self.entries).into_values()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use core::cell::Cell;

    /// A stand-in reader: `finished` is what the test sets.
    #[derive(Debug, Default)]
    struct Fake(Cell<bool>);

    impl Reading for Fake {
        fn finished(&self) -> bool {
            self.0.get()
        }
    }

    fn at(ip: &str, port: u16) -> Unidentified<Fake> {
        Unidentified {
            addr: SocketAddr::new(ip.parse().unwrap(), port),
            accepted: Instant::now(),
            conn: Fake::default(),
        }
    }

    fn source(ip: &str) -> Source {
        Source::of(SocketAddr::new(ip.parse().unwrap(), 1))
    }

    #[test]
    fn a_source_at_its_share_loses_its_own_oldest() {
        let mut table = Pending::new(2, 10);
        table.insert(1, at("10.0.0.9", 1)); // another source, older than all
        table.insert(2, at("10.0.0.1", 2));
        table.insert(3, at("10.0.0.1", 3));
        assert!(table.make_room(source("10.0.0.2")).is_none());
        let (gone, why) = table.make_room(source("10.0.0.1")).unwrap();
        assert_eq!(gone.addr.port(), 2);
        assert_eq!(
            why,
            Crowded::Source {
                source: source("10.0.0.1"),
                count: 2
            }
        );
        assert!(table.remove(2).is_none());
        assert!(table.remove(1).is_some());
    }

    #[test]
    fn a_full_table_loses_the_oldest_of_all() {
        let mut table = Pending::new(10, 3);
        for (id, ip) in [(1, "10.0.0.1"), (2, "10.0.0.2"), (3, "10.0.0.3")] {
            table.insert(id, at(ip, id as u16));
        }
        let (gone, why) = table.make_room(source("10.0.0.4")).unwrap();
        assert_eq!((gone.addr.port(), why), (1, Crowded::All { count: 3 }));
        assert!(table.make_room(source("10.0.0.4")).is_none());
    }

    #[test]
    fn finished_reads_are_never_closed() {
        let mut table = Pending::new(2, 2);
        table.insert(1, at("10.0.0.1", 1));
        table.insert(2, at("10.0.0.1", 2));
        table.entries[&1].conn.0.set(true);
        let (gone, _) = table.make_room(source("10.0.0.1")).unwrap();
        assert_eq!(gone.addr.port(), 2);
        table.insert(3, at("10.0.0.1", 3));
        table.entries[&3].conn.0.set(true);
        // Over the share, but everything left has finished reading.
        assert!(table.make_room(source("10.0.0.1")).is_none());
    }

    #[test]
    fn a_source_with_nothing_to_give_still_respects_the_total() {
        let mut table = Pending::new(1, 2);
        table.insert(1, at("10.0.0.2", 1));
        table.insert(2, at("10.0.0.1", 2));
        table.entries[&2].conn.0.set(true);
        // 10.0.0.1 is at its share with nothing unfinished; the table is full.
        let (gone, why) = table.make_room(source("10.0.0.1")).unwrap();
        assert_eq!((gone.addr.port(), why), (1, Crowded::All { count: 2 }));
    }

    #[test]
    fn ipv6_sources_are_64_bit_prefixes() {
        assert_eq!(source("2001:db8::1"), source("2001:db8::ffff:2"));
        assert_ne!(source("2001:db8::1"), source("2001:db8:0:1::1"));
        assert_eq!(source("::ffff:10.0.0.1"), source("10.0.0.1"));
        assert_eq!(source("2001:db8::1").to_string(), "2001:db8::/64");
    }
}
