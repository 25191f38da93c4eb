//! Endpoint exchange over TCP with rank 0 as the rendezvous.
//!
//! Rank 0 listens; every other rank connects to it (retrying until the deadline),
//! sends a `Hello` frame with its blob, and waits. Rank 0 checks each hello (job
//! id, world size, rank range, duplicates), refuses bad ones with a `Reject`
//! frame and keeps waiting for the real peer, and once all `N - 1` peers are in,
//! sends every peer the `Table` of all blobs. That is `N - 1` connections in all,
//! kept open in the returned [`Session`] for later [`Session::allgather`] rounds.
//!
//! Each accepted connection is read on its own short-lived thread, so a peer that
//! connects and stalls, or a foreign client, cannot hold up the others; every
//! read and write has a deadline, and a failure names the ranks concerned.

use core::net::SocketAddr;
use core::sync::atomic::{AtomicUsize, Ordering};
use core::time::Duration;
use std::io::{self, Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream, ToSocketAddrs};
use std::sync::{mpsc, Arc};
use std::thread;
use std::time::Instant;

use crate::config::ClusterConfig;
use crate::error::{BootstrapError, Result};
use crate::wire::{
    decode_header_with_limit, decode_table, encode_frame, encode_table, table_payload_limit,
    FrameKind, Header, WireError, HEADER_LEN, MAGIC, MAX_PAYLOAD, REJECT_REASON_MAX,
};

/// Waits shorter than this print nothing.
const LOG_AFTER: Duration = Duration::from_secs(5);
/// At most one progress line per this interval.
const LOG_EVERY: Duration = Duration::from_secs(5);
/// How long rank 0 sleeps between accept attempts when nothing happens.
const POLL: Duration = Duration::from_millis(5);
/// How often rank 0 checks that joined peers are still connected.
const LIVENESS_EVERY: Duration = Duration::from_millis(100);
/// Longest single blocking read, so waits can report progress.
const READ_SLICE: Duration = Duration::from_millis(250);
/// Smallest timeout handed to the OS (zero means "block forever" to some calls).
const MIN_TIMEOUT: Duration = Duration::from_millis(1);
/// Hello readers rank 0 runs at once at least (more for large worlds).
const MIN_READERS: usize = 256;
/// Rejections remembered for the final error message.
const MAX_NOTES: usize = 8;

/// Knobs of an exchange and of the session's later rounds.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ExchangeOptions {
    /// Identifies the job; frames with another job id are refused. All ranks
    /// must agree (see [`ClusterConfig::job_id`]). Default 0.
    pub job_id: u64,
    /// Overall deadline of the exchange and of each all-gather round. Default 60 s.
    ///
    /// When rank 0 gives up it tells every connected rank why (which ranks
    /// never came); a rank whose own deadline passes first only learns that
    /// rank 0 did not answer. Starting the other ranks a little after rank 0,
    /// or giving them a slightly longer timeout, gets them the better message.
    pub timeout: Duration,
    /// How long one read or write may make no progress, and how long a
    /// connected peer has to send its hello. Default 10 s.
    pub io_timeout: Duration,
    /// Pause between connection attempts to rank 0. Default 200 ms.
    pub retry_interval: Duration,
    /// Largest blob accepted from anyone, in bytes. Default 64 KiB.
    pub max_blob_size: usize,
    /// Print a progress line to stderr during long waits (at most every 5 s,
    /// only after 5 s) and when rank 0 refuses a connection. Default on.
    pub progress: bool,
}

impl Default for ExchangeOptions {
    fn default() -> Self {
        Self {
            job_id: 0,
            timeout: Duration::from_secs(60),
            io_timeout: Duration::from_secs(10),
            retry_interval: Duration::from_millis(200),
            max_blob_size: 64 * 1024,
            progress: true,
        }
    }
}

/// Where rank 0 waits for the others.
#[derive(Debug)]
pub enum Rendezvous {
    /// Rank 0 binds `host:port`; every other rank connects there.
    Address {
        /// Host name or address of rank 0.
        host: String,
        /// TCP port of rank 0.
        port: u16,
    },
    /// Rank 0 accepts on this already bound listener (for example one bound to
    /// port 0 in tests). Only valid for rank 0; the others use
    /// [`Rendezvous::Address`] with the listener's address.
    Listener(TcpListener),
}

/// Exchanges blobs with every rank of `config`, rank 0 of the configuration
/// being the rendezvous. Returns the open session and the blobs indexed by rank
/// (entry `rank` is `blob` itself).
///
/// # Errors
/// As [`exchange_at`].
pub fn exchange(
    config: &ClusterConfig,
    rank: u32,
    blob: &[u8],
    options: &ExchangeOptions,
) -> Result<(Session, Vec<Vec<u8>>)> {
    let root = config.rank(0);
    let rendezvous = Rendezvous::Address {
        host: root.host.clone(),
        port: root.port,
    };
    exchange_at(rendezvous, rank, config.world_size(), blob, options)
}

/// Exchanges blobs among `world_size` ranks meeting at `rendezvous`.
///
/// A world of one returns at once without touching the network.
///
/// # Errors
/// Argument errors ([`BootstrapError::RankOutOfRange`],
/// [`BootstrapError::BlobTooLarge`], [`BootstrapError::InvalidArgument`]);
/// on rank 0 [`BootstrapError::Bind`], and [`BootstrapError::Timeout`] naming
/// the ranks that never joined; on other ranks [`BootstrapError::Connect`],
/// [`BootstrapError::Rejected`] and [`BootstrapError::Timeout`]; on both
/// [`BootstrapError::Io`], [`BootstrapError::Protocol`],
/// [`BootstrapError::Unexpected`] and [`BootstrapError::Disconnected`].
pub fn exchange_at(
    rendezvous: Rendezvous,
    rank: u32,
    world_size: u32,
    blob: &[u8],
    options: &ExchangeOptions,
) -> Result<(Session, Vec<Vec<u8>>)> {
    if world_size == 0 || rank >= world_size {
        return Err(BootstrapError::RankOutOfRange { rank, world_size });
    }
    if options.max_blob_size > MAX_PAYLOAD as usize {
        return Err(BootstrapError::InvalidArgument {
            rank,
            reason: format!(
                "max_blob_size {} exceeds the frame limit of {MAX_PAYLOAD} bytes",
                options.max_blob_size
            ),
        });
    }
    if blob.len() > options.max_blob_size {
        return Err(BootstrapError::BlobTooLarge {
            rank,
            len: blob.len(),
            limit: options.max_blob_size,
        });
    }
    let mut session = Session {
        rank,
        world_size,
        options: options.clone(),
        link: Link::Alone,
        poisoned: false,
    };
    if world_size == 1 {
        return Ok((session, vec![blob.to_vec()]));
    }
    let clock = Clock::start(options.timeout);
    let mut progress = Progress::new(options.progress, clock, options.timeout);
    if rank == 0 {
        let listener = match rendezvous {
            Rendezvous::Listener(listener) => listener,
            Rendezvous::Address { host, port } => TcpListener::bind((host.as_str(), port))
                .map_err(|source| BootstrapError::Bind {
                    addr: fmt_addr(&host, port),
                    source,
                })?,
        };
        let (peers, blobs) = root_join(&listener, world_size, blob, options, clock, &mut progress)?;
        session.link = Link::Root(peers);
        Ok((session, blobs))
    } else {
        let Rendezvous::Address { host, port } = rendezvous else {
            return Err(BootstrapError::InvalidArgument {
                rank,
                reason: "only rank 0 accepts on a listener; other ranks need rank 0's address"
                    .to_owned(),
            });
        };
        let addr = fmt_addr(&host, port);
        let stream = connect(&host, port, &addr, rank, options, clock, &mut progress)?;
        let mut link = PeerLink {
            rank: 0,
            addr,
            stream,
        };
        let blobs = peer_round(
            &mut link,
            FrameKind::Hello,
            rank,
            world_size,
            blob,
            options,
            clock,
            &mut progress,
        )?;
        session.link = Link::Peer(link);
        Ok((session, blobs))
    }
}

/// The open connections after an exchange: rank 0 holds one per peer, every
/// other rank one to rank 0, a world of one none.
///
/// Dropping it closes the connections; [`Session::close`] does the same and
/// reports errors.
#[derive(Debug)]
pub struct Session {
    rank: u32,
    world_size: u32,
    options: ExchangeOptions,
    link: Link,
    poisoned: bool,
}

#[derive(Debug)]
enum Link {
    Alone,
    /// Entry `i` is rank `i + 1`.
    Root(Vec<PeerLink>),
    Peer(PeerLink),
}

#[derive(Debug)]
struct PeerLink {
    rank: u32,
    addr: String,
    stream: TcpStream,
}

impl Session {
    /// This process's rank.
    #[must_use]
    pub fn rank(&self) -> u32 {
        self.rank
    }

    /// Number of ranks.
    #[must_use]
    pub fn world_size(&self) -> u32 {
        self.world_size
    }

    /// The options in force for later rounds.
    #[must_use]
    pub fn options(&self) -> &ExchangeOptions {
        &self.options
    }

    /// Sets the overall deadline of each later [`Session::allgather`] round.
    pub fn set_timeout(&mut self, timeout: Duration) {
        self.options.timeout = timeout;
    }

    /// Turns progress lines on stderr on or off for later rounds.
    pub fn set_progress(&mut self, progress: bool) {
        self.options.progress = progress;
    }

    /// One more round over the open connections: every rank contributes
    /// `bytes` and receives everyone's contribution, indexed by rank. All ranks
    /// must call it the same number of times. Doubles as an out-of-band
    /// barrier ("every rank is ready").
    ///
    /// The round has the session's overall timeout. After a failed round the
    /// session is poisoned and every later call fails.
    ///
    /// # Errors
    /// [`BootstrapError::BlobTooLarge`] if `bytes` exceeds the blob limit (the
    /// session stays usable); [`BootstrapError::Poisoned`]; otherwise the
    /// network errors of [`exchange_at`], a rank-0 [`BootstrapError::Timeout`]
    /// naming the ranks that did not contribute in time.
    pub fn allgather(&mut self, bytes: &[u8]) -> Result<Vec<Vec<u8>>> {
        if self.poisoned {
            return Err(BootstrapError::Poisoned { rank: self.rank });
        }
        if bytes.len() > self.options.max_blob_size {
            return Err(BootstrapError::BlobTooLarge {
                rank: self.rank,
                len: bytes.len(),
                limit: self.options.max_blob_size,
            });
        }
        let clock = Clock::start(self.options.timeout);
        let mut progress = Progress::new(self.options.progress, clock, self.options.timeout);
        let outcome = match &mut self.link {
            Link::Alone => Ok(vec![bytes.to_vec()]),
            Link::Root(peers) => root_round(
                peers,
                self.world_size,
                bytes,
                &self.options,
                clock,
                &mut progress,
            ),
            Link::Peer(link) => peer_round(
                link,
                FrameKind::Sync,
                self.rank,
                self.world_size,
                bytes,
                &self.options,
                clock,
                &mut progress,
            ),
        };
        if outcome.is_err() {
            self.poisoned = true;
        }
        outcome
    }

    /// Closes every connection.
    ///
    /// # Errors
    /// [`BootstrapError::Io`] for the first shutdown that failed (connections
    /// the remote side already closed do not count).
    pub fn close(self) -> Result<()> {
        let links: Vec<&PeerLink> = match &self.link {
            Link::Alone => Vec::new(),
            Link::Root(peers) => peers.iter().collect(),
            Link::Peer(link) => vec![link],
        };
        let mut first_error = None;
        for link in links {
            if let Err(source) = link.stream.shutdown(Shutdown::Both) {
                if source.kind() != io::ErrorKind::NotConnected && first_error.is_none() {
                    first_error = Some(BootstrapError::Io {
                        rank: self.rank,
                        peer: Some(link.rank),
                        addr: link.addr.clone(),
                        op: "shutdown",
                        source,
                    });
                }
            }
        }
        first_error.map_or(Ok(()), Err)
    }
}

/// Start and deadline of one exchange or round.
#[derive(Clone, Copy, Debug)]
struct Clock {
    start: Instant,
    deadline: Instant,
}

impl Clock {
    fn start(total: Duration) -> Self {
        let start = Instant::now();
        let deadline = start
            .checked_add(total)
            .unwrap_or_else(|| start + Duration::from_secs(365 * 86_400));
        Self { start, deadline }
    }

    fn remaining(&self) -> Duration {
        self.deadline.saturating_duration_since(Instant::now())
    }

    fn waited(&self) -> Duration {
        self.start.elapsed()
    }
}

/// Rate-limited progress lines on stderr.
#[derive(Debug)]
struct Progress {
    enabled: bool,
    start: Instant,
    total: Duration,
    last: Option<Instant>,
}

impl Progress {
    fn new(enabled: bool, clock: Clock, total: Duration) -> Self {
        Self {
            enabled,
            start: clock.start,
            total,
            last: None,
        }
    }

    fn tick(&mut self, what: impl FnOnce() -> String) {
        if let Some(line) = self.line_at(Instant::now(), what) {
            eprintln!("{line}");
        }
    }

    /// The progress line due at `now`, if any, marking it as printed.
    fn line_at(&mut self, now: Instant, what: impl FnOnce() -> String) -> Option<String> {
        if !self.enabled {
            return None;
        }
        let waited = now.saturating_duration_since(self.start);
        if waited < LOG_AFTER
            || self
                .last
                .is_some_and(|last| now.saturating_duration_since(last) < LOG_EVERY)
        {
            return None;
        }
        self.last = Some(now);
        Some(format!(
            "rverbs-bootstrap: {} ({} s of {} s)",
            what(),
            waited.as_secs(),
            self.total.as_secs()
        ))
    }

    fn note(&self, line: &str) {
        if self.enabled {
            eprintln!("rverbs-bootstrap: {line}");
        }
    }
}

/// Why reading a frame failed, before it is given rank and address context.
#[derive(Debug)]
enum ReadError {
    Io(io::Error),
    Timeout,
    Eof,
    Wire(WireError),
}

impl ReadError {
    fn describe(&self) -> String {
        match self {
            Self::Io(error) => format!("read failed: {error}"),
            Self::Timeout => "sent no complete frame in time".to_owned(),
            Self::Eof => "closed the connection mid-frame".to_owned(),
            Self::Wire(error) => error.to_string(),
        }
    }

    fn into_error(
        self,
        rank: u32,
        peer: Option<u32>,
        addr: &str,
        op: &'static str,
        clock: Clock,
    ) -> BootstrapError {
        match self {
            Self::Io(source) => BootstrapError::Io {
                rank,
                peer,
                addr: addr.to_owned(),
                op,
                source,
            },
            Self::Timeout => BootstrapError::Timeout {
                rank,
                missing: peer.into_iter().collect(),
                waited: clock.waited(),
                detail: format!("{op} from {addr}"),
            },
            Self::Eof => BootstrapError::Disconnected {
                rank,
                peer,
                addr: addr.to_owned(),
            },
            Self::Wire(source) => BootstrapError::Protocol {
                rank,
                peer,
                addr: addr.to_owned(),
                source,
            },
        }
    }
}

/// Fills `buf`. The first byte may take until `by`; after each read that makes
/// progress the rest gets another `stall`, never past `hard`.
fn read_exact_by(
    stream: &mut TcpStream,
    buf: &mut [u8],
    by: Instant,
    hard: Instant,
    stall: Duration,
    tick: &mut dyn FnMut(),
) -> core::result::Result<(), ReadError> {
    let mut by = by.min(hard);
    let mut filled = 0;
    while filled < buf.len() {
        let now = Instant::now();
        if now >= by {
            return Err(ReadError::Timeout);
        }
        let slice = (by - now).min(READ_SLICE).max(MIN_TIMEOUT);
        stream
            .set_read_timeout(Some(slice))
            .map_err(ReadError::Io)?;
        match stream.read(&mut buf[filled..]) {
            Ok(0) => return Err(ReadError::Eof),
            Ok(n) => {
                filled += n;
                by = (Instant::now() + stall).min(hard);
            }
            Err(error)
                if matches!(
                    error.kind(),
                    io::ErrorKind::WouldBlock
                        | io::ErrorKind::TimedOut
                        | io::ErrorKind::Interrupted
                ) =>
            {
                tick();
            }
            Err(error) => return Err(ReadError::Io(error)),
        }
    }
    Ok(())
}

/// Reads one frame whose payload may not exceed `limit` bytes. The payload
/// buffer is allocated only after the header's length passed that check.
fn read_frame(
    stream: &mut TcpStream,
    first_byte_by: Instant,
    hard: Instant,
    stall: Duration,
    limit: u32,
    tick: &mut dyn FnMut(),
) -> core::result::Result<(Header, Vec<u8>), ReadError> {
    let mut head = [0u8; HEADER_LEN];
    // Judge the magic first: a foreign client (say, an HTTP probe) may send
    // fewer bytes than a header and then wait for an answer.
    let (magic, rest) = head.split_at_mut(MAGIC.len());
    read_exact_by(stream, magic, first_byte_by, hard, stall, tick)?;
    if *magic != MAGIC {
        let found = [magic[0], magic[1], magic[2], magic[3]];
        return Err(ReadError::Wire(WireError::BadMagic { found }));
    }
    let by = (Instant::now() + stall).min(hard);
    read_exact_by(stream, rest, by, hard, stall, tick)?;
    let header = decode_header_with_limit(&head, limit).map_err(ReadError::Wire)?;
    let mut payload = vec![0u8; header.payload_len as usize];
    let by = (Instant::now() + stall).min(hard);
    read_exact_by(stream, &mut payload, by, hard, stall, tick)?;
    Ok((header, payload))
}

fn write_frame(stream: &mut TcpStream, frame: &[u8], timeout: Duration) -> io::Result<()> {
    stream.set_write_timeout(Some(timeout.max(MIN_TIMEOUT)))?;
    stream.write_all(frame)?;
    stream.flush()
}

fn reject_frame(job_id: u64, world_size: u32, reason: &str) -> Vec<u8> {
    let mut cut = reason.len().min(REJECT_REASON_MAX);
    while !reason.is_char_boundary(cut) {
        cut -= 1;
    }
    encode_frame(
        FrameKind::Reject,
        job_id,
        0,
        world_size,
        &reason.as_bytes()[..cut],
    )
    .expect("a reject reason is far below the frame limit")
}

/// Best effort: the connection is dropped right after, whatever happens here.
fn send_reject(stream: &mut TcpStream, frame: &[u8], options: &ExchangeOptions) {
    let _ = write_frame(
        stream,
        frame,
        options.io_timeout.min(Duration::from_secs(1)),
    );
}

fn fmt_addr(host: &str, port: u16) -> String {
    if host.contains(':') {
        format!("[{host}]:{port}")
    } else {
        format!("{host}:{port}")
    }
}

fn blob_limit(options: &ExchangeOptions) -> u32 {
    u32::try_from(options.max_blob_size).unwrap_or(MAX_PAYLOAD)
}

/// A connection accepted by rank 0 and the outcome of reading its first frame.
#[derive(Debug)]
struct Arrival {
    stream: TcpStream,
    addr: SocketAddr,
    outcome: core::result::Result<(Header, Vec<u8>), ReadError>,
}

/// Rank 0's side of the initial exchange.
fn root_join(
    listener: &TcpListener,
    world_size: u32,
    blob: &[u8],
    options: &ExchangeOptions,
    clock: Clock,
    progress: &mut Progress,
) -> Result<(Vec<PeerLink>, Vec<Vec<u8>>)> {
    let local = listener
        .local_addr()
        .map_or_else(|_| "?".to_owned(), |addr| addr.to_string());
    let io_error = |op, source| BootstrapError::Io {
        rank: 0,
        peer: None,
        addr: local.clone(),
        op,
        source,
    };
    listener
        .set_nonblocking(true)
        .map_err(|source| io_error("set_nonblocking", source))?;

    let (tx, rx) = mpsc::channel::<Arrival>();
    // Slot `r` holds rank r's connection and blob; slot 0 stays empty.
    let mut joined: Vec<Option<(PeerLink, Vec<u8>)>> = (0..world_size).map(|_| None).collect();
    let mut count = 0u32;
    let mut notes: Vec<String> = Vec::new();
    let mut refused = 0usize;
    let mut last_liveness = Instant::now();
    let readers = Arc::new(AtomicUsize::new(0));
    let max_readers = (world_size as usize).saturating_mul(4).max(MIN_READERS);
    let missing = |joined: &[Option<(PeerLink, Vec<u8>)>]| -> Vec<u32> {
        (1..world_size)
            .filter(|rank| joined[*rank as usize].is_none())
            .collect()
    };
    let mut remember = |line: String, progress: &Progress| {
        progress.note(&format!("rank 0 {line}"));
        refused += 1;
        if notes.len() < MAX_NOTES {
            notes.push(line);
        }
    };

    while count < world_size - 1 {
        if Instant::now() >= clock.deadline {
            let missing = missing(&joined);
            let reason = format!(
                "rendezvous timed out after {:.1?} waiting for ranks {missing:?}",
                clock.waited()
            );
            let frame = reject_frame(options.job_id, world_size, &reason);
            for (link, _) in joined.iter_mut().flatten() {
                send_reject(&mut link.stream, &frame, options);
            }
            let detail = if refused == 0 {
                String::new()
            } else {
                format!(
                    "{refused} connection(s) refused meanwhile: {}",
                    notes.join("; ")
                )
            };
            return Err(BootstrapError::Timeout {
                rank: 0,
                missing,
                waited: clock.waited(),
                detail,
            });
        }

        loop {
            match listener.accept() {
                Ok((stream, addr)) if readers.load(Ordering::Relaxed) >= max_readers => {
                    // A flood of connections must not exhaust threads; real
                    // peers are few and quick, so only strangers lose here.
                    drop(stream);
                    remember(
                        format!("dropped a connection from {addr}: too many connections in flight"),
                        progress,
                    );
                }
                Ok((stream, addr)) => {
                    if let Err(error) =
                        spawn_hello_reader(stream, addr, options, clock, tx.clone(), &readers)
                    {
                        remember(
                            format!(
                                "dropped a connection from {addr}: cannot start reader: {error}"
                            ),
                            progress,
                        );
                    }
                }
                Err(error) if error.kind() == io::ErrorKind::Interrupted => {}
                // WouldBlock, or a transient failure such as ECONNABORTED or
                // EMFILE: try again after the pause below.
                Err(_) => break,
            }
        }

        let mut arrivals = Vec::new();
        if let Ok(arrival) = rx.recv_timeout(POLL) {
            arrivals.push(arrival);
        }
        arrivals.extend(rx.try_iter());
        for Arrival {
            mut stream,
            addr,
            outcome,
        } in arrivals
        {
            let verdict = match outcome {
                Err(error) => Err(error.describe()),
                Ok((header, payload)) => check_hello(&header, &joined, world_size, options)
                    .map(|()| (header.sender, payload)),
            };
            match verdict {
                Ok((rank, payload)) => {
                    joined[rank as usize] = Some((
                        PeerLink {
                            rank,
                            addr: addr.to_string(),
                            stream,
                        },
                        payload,
                    ));
                    count += 1;
                }
                Err(reason) => {
                    let frame = reject_frame(options.job_id, world_size, &reason);
                    send_reject(&mut stream, &frame, options);
                    remember(format!("refused {addr}: {reason}"), progress);
                }
            }
        }

        if last_liveness.elapsed() >= LIVENESS_EVERY {
            last_liveness = Instant::now();
            for slot in &mut joined {
                if slot
                    .as_ref()
                    .is_some_and(|(link, _)| !still_connected(&link.stream))
                {
                    if let Some((link, _)) = slot.take() {
                        count -= 1;
                        remember(
                            format!(
                                "lost rank {} at {}: disconnected before the table was sent",
                                link.rank, link.addr
                            ),
                            progress,
                        );
                    }
                }
            }
        }

        progress.tick(|| format!("rank 0 waiting for ranks {:?}", missing(&joined)));
    }

    let mut blobs = Vec::with_capacity(world_size as usize);
    let mut peers = Vec::with_capacity(world_size as usize - 1);
    blobs.push(blob.to_vec());
    for (link, payload) in joined.into_iter().flatten() {
        blobs.push(payload);
        peers.push(link);
    }
    send_table(&mut peers, world_size, &blobs, options)?;
    Ok((peers, blobs))
}

/// Reads a fresh connection's first frame on its own thread, so that a silent
/// or slow client delays nobody else.
fn spawn_hello_reader(
    mut stream: TcpStream,
    addr: SocketAddr,
    options: &ExchangeOptions,
    clock: Clock,
    tx: mpsc::Sender<Arrival>,
    readers: &Arc<AtomicUsize>,
) -> io::Result<()> {
    // Some platforms let accepted sockets inherit the listener's non-blocking mode.
    stream.set_nonblocking(false)?;
    // Latency, not throughput, matters for these small frames.
    let _ = stream.set_nodelay(true);
    let stall = options.io_timeout;
    let limit = blob_limit(options);
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

fn check_hello(
    header: &Header,
    joined: &[Option<(PeerLink, Vec<u8>)>],
    world_size: u32,
    options: &ExchangeOptions,
) -> core::result::Result<(), String> {
    if header.kind != FrameKind::Hello {
        return Err(format!("expected a Hello frame, got {:?}", header.kind));
    }
    if header.job_id != options.job_id {
        return Err(format!(
            "job id {:#x} does not match this rendezvous' job id {:#x} (stale or foreign job)",
            header.job_id, options.job_id
        ));
    }
    if header.world_size != world_size {
        return Err(format!(
            "world size {} does not match this rendezvous' world size {world_size}",
            header.world_size
        ));
    }
    if header.sender == 0 || header.sender >= world_size {
        return Err(format!(
            "rank {} is out of range 1..{world_size}",
            header.sender
        ));
    }
    if let Some((link, _)) = &joined[header.sender as usize] {
        return Err(format!(
            "rank {} already joined from {}",
            header.sender, link.addr
        ));
    }
    Ok(())
}

/// Whether the peer has not closed its end, probed without consuming data.
fn still_connected(stream: &TcpStream) -> bool {
    if stream.set_nonblocking(true).is_err() {
        return false;
    }
    let mut probe = [0u8; 1];
    let alive = match stream.peek(&mut probe) {
        Ok(0) => false,
        // Early data stays queued; the next read judges it.
        Ok(_) => true,
        Err(error) => matches!(
            error.kind(),
            io::ErrorKind::WouldBlock | io::ErrorKind::Interrupted
        ),
    };
    stream.set_nonblocking(false).is_ok() && alive
}

fn send_table(
    peers: &mut [PeerLink],
    world_size: u32,
    blobs: &[Vec<u8>],
    options: &ExchangeOptions,
) -> Result<()> {
    let payload = encode_table(blobs).map_err(|source| BootstrapError::InvalidArgument {
        rank: 0,
        reason: format!("cannot encode the table: {source}"),
    })?;
    let frame = encode_frame(FrameKind::Table, options.job_id, 0, world_size, &payload).map_err(
        |source| BootstrapError::InvalidArgument {
            rank: 0,
            reason: format!("cannot frame the table: {source}"),
        },
    )?;
    for peer in peers {
        write_frame(&mut peer.stream, &frame, options.io_timeout).map_err(|source| {
            BootstrapError::Io {
                rank: 0,
                peer: Some(peer.rank),
                addr: peer.addr.clone(),
                op: "send table",
                source,
            }
        })?;
    }
    Ok(())
}

/// Rank 0's side of an all-gather round: read every peer's `Sync` in parallel,
/// then send the table.
fn root_round(
    peers: &mut [PeerLink],
    world_size: u32,
    bytes: &[u8],
    options: &ExchangeOptions,
    clock: Clock,
    progress: &mut Progress,
) -> Result<Vec<Vec<u8>>> {
    type Outcome = core::result::Result<(Header, Vec<u8>), ReadError>;
    let limit = blob_limit(options);
    let stall = options.io_timeout;
    let mut outcomes: Vec<Option<Outcome>> = (0..peers.len()).map(|_| None).collect();
    thread::scope(|scope| {
        let (tx, rx) = mpsc::channel::<(usize, Outcome)>();
        let mut pending = 0usize;
        for (index, peer) in peers.iter_mut().enumerate() {
            let tx = tx.clone();
            let spawned = thread::Builder::new()
                .name("rverbs-bootstrap-sync".to_owned())
                .spawn_scoped(scope, move || {
                    let outcome = read_frame(
                        &mut peer.stream,
                        clock.deadline,
                        clock.deadline,
                        stall,
                        limit,
                        &mut || {},
                    );
                    let _ = tx.send((index, outcome));
                });
            match spawned {
                Ok(_) => pending += 1,
                Err(error) => outcomes[index] = Some(Err(ReadError::Io(error))),
            }
        }
        drop(tx);
        // Every reader stops by the deadline, so this loop and the scope end too.
        while pending > 0 {
            match rx.recv_timeout(READ_SLICE) {
                Ok((index, outcome)) => {
                    outcomes[index] = Some(outcome);
                    pending -= 1;
                }
                Err(mpsc::RecvTimeoutError::Timeout) => progress.tick(|| {
                    let waiting: Vec<u32> = (1u32..)
                        .zip(&outcomes)
                        .filter(|(_, outcome)| outcome.is_none())
                        .map(|(rank, _)| rank)
                        .collect();
                    format!("rank 0 waiting for ranks {waiting:?} (all-gather)")
                }),
                Err(mpsc::RecvTimeoutError::Disconnected) => break,
            }
        }
    });

    let mut blobs = Vec::with_capacity(world_size as usize);
    blobs.push(bytes.to_vec());
    let mut missing = Vec::new();
    let mut failure = None;
    for (peer, outcome) in peers.iter().zip(outcomes) {
        match outcome {
            None | Some(Err(ReadError::Timeout)) => missing.push(peer.rank),
            Some(Err(error)) => {
                failure.get_or_insert_with(|| {
                    error.into_error(0, Some(peer.rank), &peer.addr, "all-gather", clock)
                });
            }
            Some(Ok((header, payload))) => {
                let problem = if header.kind != FrameKind::Sync {
                    Some(format!("expected a Sync frame, got {:?}", header.kind))
                } else if header.sender != peer.rank
                    || header.job_id != options.job_id
                    || header.world_size != world_size
                {
                    Some(format!(
                        "Sync claims rank {} of {} in job {:#x}, expected rank {} of {world_size} in job {:#x}",
                        header.sender, header.world_size, header.job_id, peer.rank, options.job_id
                    ))
                } else {
                    None
                };
                match problem {
                    Some(reason) => {
                        failure.get_or_insert(BootstrapError::Unexpected {
                            rank: 0,
                            peer: Some(peer.rank),
                            addr: peer.addr.clone(),
                            reason,
                        });
                    }
                    None => blobs.push(payload),
                }
            }
        }
    }
    if failure.is_some() || !missing.is_empty() {
        let error = failure.unwrap_or_else(|| BootstrapError::Timeout {
            rank: 0,
            missing,
            waited: clock.waited(),
            detail: "all-gather round".to_owned(),
        });
        let frame = reject_frame(
            options.job_id,
            world_size,
            &format!("all-gather aborted by rank 0: {error}"),
        );
        for peer in peers.iter_mut() {
            send_reject(&mut peer.stream, &frame, options);
        }
        return Err(error);
    }
    send_table(peers, world_size, &blobs, options)?;
    Ok(blobs)
}

/// Connects to rank 0, retrying until the deadline.
fn connect(
    host: &str,
    port: u16,
    addr: &str,
    rank: u32,
    options: &ExchangeOptions,
    clock: Clock,
    progress: &mut Progress,
) -> Result<TcpStream> {
    let mut last_error = io::Error::new(
        io::ErrorKind::TimedOut,
        "no connection attempt finished before the deadline",
    );
    loop {
        if Instant::now() >= clock.deadline {
            return Err(BootstrapError::Connect {
                rank,
                addr: addr.to_owned(),
                waited: clock.waited(),
                source: last_error,
            });
        }
        match (host, port).to_socket_addrs() {
            Ok(candidates) => {
                for candidate in candidates {
                    let budget = clock.remaining().min(options.io_timeout).max(MIN_TIMEOUT);
                    match TcpStream::connect_timeout(&candidate, budget) {
                        Ok(stream) => {
                            // Latency, not throughput, matters for these small frames.
                            let _ = stream.set_nodelay(true);
                            return Ok(stream);
                        }
                        Err(error) => last_error = error,
                    }
                }
            }
            Err(error) => last_error = error,
        }
        progress.tick(|| format!("rank {rank} waiting to connect to rank 0 at {addr}"));
        thread::sleep(options.retry_interval.min(clock.remaining()));
    }
}

/// A non-root rank's round: send our frame (`Hello` or `Sync`), then read the
/// table (or a rejection) from rank 0 and check it.
#[allow(clippy::too_many_arguments)]
fn peer_round(
    link: &mut PeerLink,
    kind: FrameKind,
    rank: u32,
    world_size: u32,
    own: &[u8],
    options: &ExchangeOptions,
    clock: Clock,
    progress: &mut Progress,
) -> Result<Vec<Vec<u8>>> {
    let frame = encode_frame(kind, options.job_id, rank, world_size, own).map_err(|source| {
        BootstrapError::InvalidArgument {
            rank,
            reason: format!("cannot frame the blob: {source}"),
        }
    })?;
    let op = if kind == FrameKind::Hello {
        "send hello"
    } else {
        "send all-gather contribution"
    };
    write_frame(&mut link.stream, &frame, options.io_timeout).map_err(|source| {
        BootstrapError::Io {
            rank,
            peer: Some(0),
            addr: link.addr.clone(),
            op,
            source,
        }
    })?;

    let limit =
        table_payload_limit(world_size, options.max_blob_size).max(REJECT_REASON_MAX as u32);
    let addr = link.addr.clone();
    let (header, payload) = read_frame(
        &mut link.stream,
        clock.deadline,
        clock.deadline,
        options.io_timeout,
        limit,
        &mut || {
            progress.tick(|| format!("rank {rank} waiting for the table from rank 0 at {addr}"))
        },
    )
    .map_err(|error| error.into_error(rank, Some(0), &link.addr, "table", clock))?;

    let unexpected = |reason: String| BootstrapError::Unexpected {
        rank,
        peer: Some(0),
        addr: link.addr.clone(),
        reason,
    };
    match header.kind {
        FrameKind::Reject => Err(BootstrapError::Rejected {
            rank,
            addr: link.addr.clone(),
            reason: String::from_utf8_lossy(&payload[..payload.len().min(REJECT_REASON_MAX)])
                .into_owned(),
        }),
        FrameKind::Table => {
            if header.sender != 0
                || header.job_id != options.job_id
                || header.world_size != world_size
            {
                return Err(unexpected(format!(
                    "table claims sender {} of {} in job {:#x}, expected rank 0 of {world_size} in job {:#x}",
                    header.sender, header.world_size, header.job_id, options.job_id
                )));
            }
            let blobs = decode_table(&payload, options.max_blob_size).map_err(|source| {
                BootstrapError::Protocol {
                    rank,
                    peer: Some(0),
                    addr: link.addr.clone(),
                    source,
                }
            })?;
            if blobs.len() != world_size as usize {
                return Err(unexpected(format!(
                    "table holds {} entries for a world of {world_size}",
                    blobs.len()
                )));
            }
            if blobs[rank as usize] != own {
                return Err(unexpected(
                    "the table does not echo this rank's blob unchanged".to_owned(),
                ));
            }
            Ok(blobs)
        }
        other => Err(unexpected(format!(
            "expected a Table or Reject frame, got {other:?}"
        ))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn progress_lines_are_rate_limited() {
        let clock = Clock::start(Duration::from_secs(60));
        let mut progress = Progress::new(true, clock, Duration::from_secs(60));
        let at = |secs| clock.start + Duration::from_secs(secs);
        let what = || "rank 0 waiting for ranks [3, 5]".to_owned();
        assert_eq!(progress.line_at(at(2), what), None);
        assert_eq!(
            progress.line_at(at(12), what).as_deref(),
            Some("rverbs-bootstrap: rank 0 waiting for ranks [3, 5] (12 s of 60 s)")
        );
        assert_eq!(progress.line_at(at(16), what), None);
        assert!(progress.line_at(at(17), what).is_some());
        let mut quiet = Progress::new(false, clock, Duration::from_secs(60));
        assert_eq!(quiet.line_at(at(30), what), None);
    }

    #[test]
    fn reject_reasons_are_cut_at_a_char_boundary() {
        let reason = "é".repeat(REJECT_REASON_MAX);
        let frame = reject_frame(7, 2, &reason);
        let payload = &frame[HEADER_LEN..];
        assert!(payload.len() <= REJECT_REASON_MAX);
        assert!(core::str::from_utf8(payload).is_ok());
    }

    #[test]
    fn addresses_bracket_ipv6() {
        assert_eq!(fmt_addr("::1", 7), "[::1]:7");
        assert_eq!(fmt_addr("node1", 7), "node1:7");
    }
}
