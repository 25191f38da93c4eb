//! Rank 0's hello readers: each accepted connection's first frame is read on a
//! short-lived thread of its own, and only so many run at once.

use core::net::SocketAddr;
use core::sync::atomic::{AtomicUsize, Ordering};
use core::time::Duration;
use std::io;
use std::net::TcpStream;
use std::sync::{mpsc, Arc};
use std::thread;
use std::time::Instant;

use crate::exchange::clock::Clock;
use crate::exchange::frame_io::{read_frame, ReadError};
use crate::exchange::ExchangeOptions;
use crate::wire::Header;

use super::hello_limit;

/// Hello readers rank 0 runs at once at least (more for large worlds).
const MIN_READERS: usize = 256;

/// A connection accepted by rank 0 and the outcome of reading its first frame.
#[derive(Debug)]
pub(super) struct Arrival {
    pub(super) stream: TcpStream,
    pub(super) addr: SocketAddr,
    pub(super) outcome: core::result::Result<(Header, Vec<u8>), ReadError>,
}

/// The hello readers of one join: how many are running, how many may, the
/// largest hello they read, and the channel their arrivals come back on.
#[derive(Debug)]
pub(super) struct HelloReaders {
    tx: mpsc::Sender<Arrival>,
    rx: mpsc::Receiver<Arrival>,
    in_flight: Arc<AtomicUsize>,
    max: usize,
    limit: u32,
}

impl HelloReaders {
    pub(super) fn new(world_size: u32, options: &ExchangeOptions) -> Self {
        let (tx, rx) = mpsc::channel();
        Self {
            tx,
            rx,
            in_flight: Arc::new(AtomicUsize::new(0)),
            max: (world_size as usize).saturating_mul(4).max(MIN_READERS),
            limit: hello_limit(options, world_size),
        }
    }

    /// Whether as many readers run as may; a new connection is then dropped.
    pub(super) fn full(&self) -> bool {
        self.in_flight.load(Ordering::Relaxed) >= self.max
    }

    /// Starts a reader on a fresh connection; see [`spawn_hello_reader`].
    pub(super) fn spawn(
        &self,
        stream: TcpStream,
        addr: SocketAddr,
        options: &ExchangeOptions,
        clock: Clock,
    ) -> io::Result<()> {
        spawn_hello_reader(
            stream,
            addr,
            options,
            self.limit,
            clock,
            self.tx.clone(),
            &self.in_flight,
        )
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
}

/// Reads a fresh connection's first frame on its own thread, so that a silent
/// or slow client delays nobody else.
fn spawn_hello_reader(
    mut stream: TcpStream,
    addr: SocketAddr,
    options: &ExchangeOptions,
    limit: u32,
    clock: Clock,
    tx: mpsc::Sender<Arrival>,
    readers: &Arc<AtomicUsize>,
) -> io::Result<()> {
    // Some platforms let accepted sockets inherit the listener's non-blocking mode.
    stream.set_nonblocking(false)?;
    // Latency, not throughput, matters for these small frames.
    let _ = stream.set_nodelay(true);
    let stall = options.io_timeout;
    let first_byte_by = (Instant::now() + stall).min(clock.deadline);
    let in_flight = InFlight::enter(readers);
    thread::Builder::new()
        .name("rverbs-bootstrap-hello".to_owned())
        .spawn(move || {
            let _in_flight = in_flight;
            let outcome = read_frame(
                &mut stream,
                first_byte_by,
                clock.deadline,
                stall,
                limit,
                &mut || {},
            );
            // Rank 0 may have finished or given up already; the connection
            // then just closes.
            let _ = tx.send(Arrival {
                stream,
                addr,
                outcome,
            });
        })?;
    Ok(())
}

/// Counts a running hello reader until dropped.
#[derive(Debug)]
struct InFlight(Arc<AtomicUsize>);

impl InFlight {
    fn enter(counter: &Arc<AtomicUsize>) -> Self {
        counter.fetch_add(1, Ordering::Relaxed);
        Self(Arc::clone(counter))
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}
