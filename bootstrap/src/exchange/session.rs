//! What an exchange leaves open: one connection per peer on rank 0, one to
//! rank 0 elsewhere, and the all-gather rounds run over them.

use crate::error::{BootstrapError, ExchangeError, Result};
use core::time::Duration;
use std::io;
use std::net::{Shutdown, TcpListener, TcpStream};
use std::os::fd::AsFd;
use std::time::Instant;

use rverbs_std_shim::unacked::unacknowledged;

use crate::wire::{FrameKind, Seal};

use super::frame_io::write_frame;

/// How long saying goodbye to one rank may take.
const GOODBYE_TIMEOUT: Duration = Duration::from_millis(500);
/// The longest a goodbye lingers, whatever [`ExchangeOptions::goodbye_linger`] says.
const MAX_LINGER: Duration = Duration::from_secs(60);
/// How often a lingering goodbye looks whether it was acknowledged, and pushes it again.
const LINGER_TICK: Duration = Duration::from_millis(50);

use super::peer::peer_round;
use super::progress::Progress;
use super::root::root_round;
use super::round_timer::RoundTimer;
use super::ExchangeOptions;

/// The accessors both sessions (this TCP one and [`PmixSession`](crate::pmix::PmixSession))
/// offer over their `rank`, `world_size` and `options`: one set of docs and one behaviour.
macro_rules! session_accessors {
    () => {
        /// This process's rank in the job.
        #[must_use]
        pub fn rank(&self) -> u32 {
            self.rank
        }

        /// Number of ranks in the job.
        #[must_use]
        pub fn world_size(&self) -> u32 {
            self.world_size
        }

        /// The options in force for later rounds (timeout, blob limit, ...).
        #[must_use]
        pub fn options(&self) -> &$crate::exchange::ExchangeOptions {
            &self.options
        }
    };
}
#[cfg(feature = "pmix")]
pub(crate) use session_accessors;

/// The open connections after an exchange: rank 0 holds one per peer, every
/// other rank one to rank 0, a world of one none.
///
/// [`Session::close`] is the deliberate end: the peers are told goodbye first, so a
/// [`Watch`](super::Watch) on their side does not take the closing for a failure.
/// Any other end is not a normal exit, and the peers learn so at once:
/// [`Session::leave_on_error`] tells them why; dropping the session without closing it (a
/// `?` that returned an error out of `main`, say) tells them it was dropped; a drop during a
/// panic sends nothing, which a watch reports as a crash.
#[derive(Debug)]
pub struct Session {
    rank: u32,
    world_size: u32,
    options: ExchangeOptions,
    pub(super) link: Link,
    /// Rank 0's rendezvous, kept open after the exchange for a rank that restarts (see
    /// [`Session::readmit`]): nothing accepts on it in between, so connections made then
    /// wait in the kernel's listen queue (a bounded one) until a readmit reads them.
    pub(super) listener: Option<TcpListener>,
    pub(super) poisoned: bool,
    said_goodbye: bool,
    /// Set before this session says goodbye and shuts its connections down, so its own
    /// [`Watch`](super::Watch) does not take that for a peer's failure.
    pub(super) closing: std::sync::Arc<core::sync::atomic::AtomicBool>,
}

/// What a session dropped without [`Session::close`] tells its peers.
pub const DROPPED_REASON: &str = "its session was dropped without being closed (the process \
                                  left on an error path)";

impl Drop for Session {
    fn drop(&mut self) {
        if !std::thread::panicking() {
            self.goodbye(Some(DROPPED_REASON));
        }
    }
}

/// The connections a [`Session`] holds, by the role of its rank.
#[derive(Debug)]
pub(super) enum Link {
    Alone,
    /// Entry `i` is rank `i + 1`.
    Root(Vec<PeerLink>),
    Peer(Box<PeerLink>),
}

/// One open connection, whom it leads to (for error messages), and its MAC
/// state, which every frame on it goes through.
#[derive(Debug)]
pub(super) struct PeerLink {
    pub(super) rank: u32,
    pub(super) addr: String,
    pub(super) stream: TcpStream,
    pub(super) seal: Seal,
}

impl Session {
    pub(super) fn new(rank: u32, world_size: u32, options: ExchangeOptions, link: Link) -> Self {
        Self {
            rank,
            world_size,
            options,
            link,
            listener: None,
            poisoned: false,
            said_goodbye: false,
            closing: std::sync::Arc::default(),
        }
    }

    /// Tells every connected rank that this session closes (best effort, once): on purpose
    /// (`reason` `None`), or because the process gives up, and why.
    fn goodbye(&mut self, reason: Option<&str>) {
        self.closing
            .store(true, core::sync::atomic::Ordering::Release);
        if core::mem::replace(&mut self.said_goodbye, true) {
            return;
        }
        let (job_id, rank, world) = (self.options.job_id, self.rank, self.world_size);
        let mut links: Vec<&mut PeerLink> = match &mut self.link {
            Link::Alone => Vec::new(),
            Link::Root(peers) => peers.iter_mut().collect(),
            Link::Peer(link) => vec![&mut **link],
        };
        for link in &mut links {
            // Sealed like every frame on the connection (a MAC when the job has a secret).
            let why = crate::wire::bye_reason(reason.unwrap_or("")).as_bytes();
            if let Ok(sealed) = link.seal.seal(FrameKind::Bye, job_id, rank, world, why) {
                let _ = write_frame(
                    &link.stream,
                    &sealed,
                    why,
                    GOODBYE_TIMEOUT,
                    Instant::now() + GOODBYE_TIMEOUT,
                );
            }
        }
        if reason.is_some() {
            let streams: Vec<&TcpStream> = links.iter().map(|l| &l.stream).collect();
            linger(&streams, self.options.goodbye_linger);
        }
    }

    session_accessors!();

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
    /// [`ExchangeError::BlobTooLarge`] if `bytes` exceeds the blob limit (the
    /// session stays usable); [`ExchangeError::Poisoned`]; otherwise the
    /// network errors of [`exchange_at`], a rank-0 [`ExchangeError::Timeout`]
    /// naming the ranks that did not contribute in time.
    ///
    /// [`exchange_at`]: super::exchange_at
    pub fn allgather(&mut self, bytes: &[u8]) -> Result<Vec<Vec<u8>>> {
        if self.poisoned {
            return Err(BootstrapError::Exchange(ExchangeError::Poisoned {
                rank: self.rank,
            }));
        }
        if bytes.len() > self.options.max_blob_size {
            return Err(BootstrapError::Exchange(ExchangeError::BlobTooLarge {
                rank: self.rank,
                len: bytes.len(),
                limit: self.options.max_blob_size,
            }));
        }
        let clock = RoundTimer::start(self.options.timeout);
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
                None,
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

    /// Closes every connection, on purpose: the peers are told goodbye, and their watches
    /// report nothing.
    ///
    /// # Errors
    /// [`ExchangeError::Io`] for the first shutdown that failed (connections
    /// the remote side already closed do not count).
    pub fn close(mut self) -> Result<()> {
        self.goodbye(None);
        self.shut_down()
    }

    /// Closes every connection because this process gives up: the peers' watches report
    /// this rank as gone with `reason` (cut to [`MAX_REASON`](crate::wire::MAX_REASON)
    /// bytes; an empty reason is sent as "no reason given"), and their nodes fail their next
    /// wait naming it, instead of taking it for a normal exit.
    ///
    /// Returns once every peer's kernel has acknowledged the goodbye, or after
    /// [`ExchangeOptions::goodbye_linger`] (default 10 s): when this host's own link is down
    /// (the usual reason to give up), the goodbye is pushed again every 50 ms until it crosses,
    /// so a peer learns within moments of the link coming back. Dropping the session without
    /// closing it waits the same way.
    ///
    /// # Errors
    /// As [`Session::close`].
    pub fn leave_on_error(mut self, reason: &str) -> Result<()> {
        self.goodbye(Some(if reason.is_empty() {
            "no reason given"
        } else {
            reason
        }));
        self.shut_down()
    }

    fn shut_down(&mut self) -> Result<()> {
        let links: Vec<&PeerLink> = match &self.link {
            Link::Alone => Vec::new(),
            Link::Root(peers) => peers.iter().collect(),
            Link::Peer(link) => vec![&**link],
        };
        let mut first_error = None;
        for link in links {
            if let Err(source) = link.stream.shutdown(Shutdown::Both) {
                if source.kind() != io::ErrorKind::NotConnected && first_error.is_none() {
                    first_error = Some(BootstrapError::Exchange(ExchangeError::Io {
                        rank: self.rank,
                        peer: Some(link.rank),
                        addr: link.addr.clone(),
                        op: "shutdown",
                        source,
                    }));
                }
            }
        }
        first_error.map_or(Ok(()), Err)
    }
}

/// Waits, at most `limit`, until every peer's kernel has acknowledged the goodbye written on
/// `streams` (and the end of the stream, which this sends now): a process that gives up
/// while its own link is down (the usual reason to give up) would otherwise leave its reason
/// to the kernel's retries of a closed socket, which back off (a persist timer at 3.5 s after
/// a 2 s outage, measured across two hosts; the peer learned 0.4-1.5 s after the link was
/// back in three runs) and stop after `tcp_orphan_retries` (8 by default), and the process
/// would never know whether it arrived. Waiting here, this process
/// pushes the bytes again every [`LINGER_TICK`], so they leave within that tick of the link
/// coming back. A peer that is reachable acknowledges within a round trip; one that reset
/// the connection ends the wait for its connection at once. Where the kernel cannot say
/// what is acknowledged (not Linux), nothing waits.
fn linger(streams: &[&TcpStream], limit: Duration) {
    // At most a minute, whatever was configured: a goodbye that has not crossed by then
    // will not, and a process must be able to exit.
    let deadline = Instant::now() + limit.min(MAX_LINGER);
    let mut waiting: Vec<&TcpStream> = streams
        .iter()
        .copied()
        // The end of the stream follows the goodbye: the peer's watch sees the hang-up.
        .filter(|s| s.shutdown(Shutdown::Write).is_ok())
        .collect();
    loop {
        // An error (a connection already closed, an unsupported system) is nothing to wait for.
        waiting.retain(|s| unacknowledged(s.as_fd()).is_ok_and(|n| n > 0));
        if waiting.is_empty() || Instant::now() >= deadline {
            return;
        }
        for s in &waiting {
            // Setting TCP_NODELAY flushes pending output at once (tcp(7)): the goodbye goes
            // out now if the link is back, instead of at the kernel's next backed-off try.
            let _ = s.set_nodelay(true);
        }
        std::thread::sleep(LINGER_TICK.min(deadline.saturating_duration_since(Instant::now())));
    }
}

#[cfg(all(test, target_os = "linux"))]
mod tests {
    use super::*;
    use std::io::{Read, Write};

    fn pair() -> (TcpStream, TcpStream) {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let a = TcpStream::connect(listener.local_addr().unwrap()).unwrap();
        (a, listener.accept().unwrap().0)
    }

    #[test]
    fn a_goodbye_the_peer_acknowledges_ends_the_linger_at_once() {
        let (a, mut b) = pair();
        (&a).write_all(b"goodbye").unwrap();
        let start = Instant::now();
        linger(&[&a], Duration::from_secs(10));
        assert!(
            start.elapsed() < Duration::from_secs(2),
            "{:?}",
            start.elapsed()
        );
        // The end of the stream was sent too.
        let mut got = Vec::new();
        b.read_to_end(&mut got).unwrap();
        assert_eq!(got, b"goodbye");
    }

    #[test]
    fn a_goodbye_that_cannot_cross_lingers_no_longer_than_the_limit() {
        let (a, b) = pair();
        // The peer reads nothing: once its window is full, nothing more is acknowledged.
        a.set_nonblocking(true).unwrap();
        let chunk = [0u8; 64 * 1024];
        let mut stuck = 0;
        while stuck < 20 {
            match (&a).write(&chunk) {
                Ok(_) => stuck = 0,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    stuck += 1;
                    std::thread::sleep(Duration::from_millis(10));
                }
                Err(e) => panic!("{e}"),
            }
        }
        assert!(unacknowledged(a.as_fd()).unwrap() > 0);
        let start = Instant::now();
        linger(&[&a], Duration::from_millis(300));
        let took = start.elapsed();
        assert!(
            took >= Duration::from_millis(300) && took < Duration::from_secs(3),
            "{took:?}"
        );
        drop(b);
    }
}
