//! Rank 0's hello readers: each accepted connection gets rank 0's challenge at
//! once, and the client's challenge and hello are read on a short-lived thread of
//! its own, both within `io_timeout` of being accepted; when the unidentified connections reach a limit, the oldest
//! is closed to make room (see [`pending`](super::pending)).

use core::net::SocketAddr;
use core::sync::atomic::{AtomicBool, Ordering};
use core::time::Duration;
use std::io::Write;
use std::net::{Shutdown, TcpStream};
use std::sync::{mpsc, Arc};
use std::thread;
use std::time::Instant;

use crate::exchange::frame_io::{read_frame, ReadError};
use crate::exchange::round_timer::RoundTimer;
use crate::exchange::ExchangeOptions;
use crate::wire::{Header, Seal, CHALLENGE_LEN};

use super::hello_limit;
use super::pending::{Crowded, Pending, Reading, Source, Unidentified};

/// Unidentified connections rank 0 keeps at least (4 per rank for large worlds).
const MIN_UNIDENTIFIED: usize = 256;
/// One source may hold this fraction of the unidentified connections.
const SOURCE_SHARE: usize = 4;
/// Time the challenge may take to write. It is the first write on a fresh
/// connection, so it fits in the empty send buffer and never waits in practice.
const CHALLENGE_WRITE: Duration = Duration::from_millis(100);
/// Stack of a hello reader: it reads one frame and checks one MAC.
const READER_STACK: usize = 256 * 1024;

/// A connection whose hello is being read: its reader thread reads it, and rank
/// 0's accept loop may shut it down to make room.
#[derive(Debug)]
pub(super) struct Conn {
    stream: TcpStream,
    finished: AtomicBool,
}

impl Reading for Arc<Conn> {
    fn finished(&self) -> bool {
        self.finished.load(Ordering::Acquire)
    }
}

/// A hello reader's report: the connection and the outcome of reading its hello.
#[derive(Debug)]
pub(super) struct Arrival {
    id: u64,
    conn: Arc<Conn>,
    addr: SocketAddr,
    seal: Seal,
    outcome: core::result::Result<(Header, Vec<u8>), ReadError>,
}

/// An arrival whose connection still holds its place, taken apart.
#[derive(Debug)]
pub(super) struct Claimed {
    pub(super) stream: TcpStream,
    pub(super) addr: SocketAddr,
    /// The connection's MAC state, past the challenge and the hello.
    pub(super) seal: Seal,
    pub(super) outcome: core::result::Result<(Header, Vec<u8>), ReadError>,
}

/// A connection closed to make room for a newer one.
#[derive(Debug)]
pub(super) struct Closed {
    pub(super) addr: SocketAddr,
    pub(super) age: Duration,
    pub(super) crowded: Crowded,
}

/// The hello readers of one join: the unidentified connections, the largest
/// hello they read, and the channel their arrivals come back on.
#[derive(Debug)]
pub(super) struct HelloReaders {
    tx: mpsc::Sender<Arrival>,
    rx: mpsc::Receiver<Arrival>,
    pending: Pending<Arc<Conn>>,
    next_id: u64,
    limit: u32,
    world_size: u32,
}

impl HelloReaders {
    pub(super) fn new(world_size: u32, options: &ExchangeOptions) -> Self {
        let (tx, rx) = mpsc::channel();
        let cap = (world_size as usize)
            .saturating_mul(4)
            .max(MIN_UNIDENTIFIED);
        Self {
            tx,
            rx,
            pending: Pending::new(cap / SOURCE_SHARE, cap),
            next_id: 0,
            limit: hello_limit(options, world_size),
            world_size,
        }
    }

    /// Takes a fresh connection: closes the oldest unidentified one first if a
    /// limit is reached (returned, to be logged), sends the challenge and starts
    /// the reader, which has until `io_timeout` after `accepted` for the whole
    /// hello.
    ///
    /// # Errors
    /// Why the connection was dropped instead (no challenge could be made or
    /// sent, no thread started); a connection closed to make room is returned
    /// in the error too.
    pub(super) fn start(
        &mut self,
        stream: TcpStream,
        addr: SocketAddr,
        accepted: Instant,
        options: &ExchangeOptions,
        clock: RoundTimer,
    ) -> (Option<Closed>, core::result::Result<(), String>) {
        let closed = self
            .pending
            .make_room(Source::of(addr))
            .map(|(old, crowded)| {
                // The reader wakes with an error; its arrival finds no place and is dropped.
                let _ = old.conn.stream.shutdown(Shutdown::Both);
                Closed {
                    addr: old.addr,
                    age: accepted.saturating_duration_since(old.accepted),
                    crowded,
                }
            });
        (closed, self.spawn(stream, addr, accepted, options, clock))
    }

    fn spawn(
        &mut self,
        mut stream: TcpStream,
        addr: SocketAddr,
        accepted: Instant,
        options: &ExchangeOptions,
        clock: RoundTimer,
    ) -> core::result::Result<(), String> {
        // Some platforms let accepted sockets inherit the listener's non-blocking mode.
        stream
            .set_nonblocking(false)
            .map_err(|error| format!("cannot configure the socket: {error}"))?;
        // Latency, not throughput, matters for these small frames.
        let _ = stream.set_nodelay(true);
        let mut challenge = [0u8; CHALLENGE_LEN];
        getrandom::fill(&mut challenge)
            .map_err(|error| format!("no random challenge from the OS: {error}"))?;
        let mut seal = Seal::root(options.secret.as_ref(), challenge);
        let frame = seal.challenge_frame(options.job_id, 0, self.world_size);
        stream
            .set_write_timeout(Some(CHALLENGE_WRITE))
            .and_then(|()| stream.write_all(&frame))
            .map_err(|error| format!("cannot send the challenge: {error}"))?;

        let id = self.next_id;
        self.next_id += 1;
        let conn = Arc::new(Conn {
            stream,
            finished: AtomicBool::new(false),
        });
        self.pending.insert(
            id,
            Unidentified {
                addr,
                accepted,
                conn: Arc::clone(&conn),
            },
        );
        let by = accepted
            .checked_add(options.io_timeout)
            .unwrap_or(clock.deadline)
            .min(clock.deadline);
        let stall = options.io_timeout;
        let limit = self.limit;
        let tx = self.tx.clone();
        let reader = move || {
            // The client's challenge, then its hello, all by `by`: bytes that
            // trickle in do not extend it.
            let outcome = read_frame(
                &conn.stream,
                &mut seal,
                by,
                by,
                stall,
                CHALLENGE_LEN as u32,
                &mut || {},
            )
            .and_then(|_| read_frame(&conn.stream, &mut seal, by, by, stall, limit, &mut || {}));
            conn.finished.store(true, Ordering::Release);
            // Rank 0 may have finished or given up already; the connection
            // then just closes.
            let _ = tx.send(Arrival {
                id,
                conn,
                addr,
                seal,
                outcome,
            });
        };
        let spawned = thread::Builder::new()
            .name("rverbs-bootstrap-hello".to_owned())
            .stack_size(READER_STACK)
            .spawn(reader);
        if let Err(error) = spawned {
            self.pending.remove(id);
            return Err(format!("cannot start a reader: {error}"));
        }
        Ok(())
    }

    /// The arrivals that come within `wait`, and any others already queued.
    pub(super) fn arrivals(&self, wait: Duration) -> Vec<Arrival> {
        let mut arrivals = Vec::new();
        if let Ok(arrival) = self.rx.recv_timeout(wait) {
            arrivals.push(arrival);
        }
        arrivals.extend(self.rx.try_iter());
        arrivals
    }

    /// The connection of `arrival` and what was read on it, unless it was
    /// closed to make room meanwhile.
    pub(super) fn claim(&mut self, arrival: Arrival) -> Option<Claimed> {
        self.pending.remove(arrival.id)?;
        // The reader has sent its handle and the table dropped its own: this is
        // the last one.
        let conn = Arc::try_unwrap(arrival.conn).ok()?;
        Some(Claimed {
            stream: conn.stream,
            addr: arrival.addr,
            seal: arrival.seal,
            outcome: arrival.outcome,
        })
    }

    /// Shuts every unidentified connection, so their readers end now rather
    /// than at their deadline.
    pub(super) fn close_all(&mut self) {
        for entry in self.pending.drain() {
            let _ = entry.conn.stream.shutdown(Shutdown::Both);
        }
    }
}
