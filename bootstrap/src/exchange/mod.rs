//! Endpoint exchange over TCP with rank 0 as the rendezvous.
//!
//! Rank 0 listens; every other rank connects to it (retrying with back-off until
//! the deadline), reads the random `Challenge` rank 0 sends first, sends a `Hello`
//! frame with its blob, and waits. Rank 0 checks each hello (MAC, job id, world
//! size, rank range, duplicates), refuses bad ones with a `Reject` frame and keeps
//! waiting for the real peer, and once all `N - 1` peers are in, sends every peer
//! the `Table` of all blobs. That is `N - 1` connections in all, kept open in the
//! returned [`Session`] for later [`Session::allgather`] rounds. With a job secret
//! ([`ExchangeOptions::secret`]) every frame on them carries a MAC bound to the
//! connection's challenge (see [`Seal`](crate::wire::Seal)).
//!
//! A table of every blob is N blobs to each of N ranks. When each blob holds
//! something per peer, as rverbs-core's node blobs do, that grows as N² per rank;
//! with a [`Personalize`] (such as [`NodeBlobs`]) rank 0 sends each rank only what
//! the others' blobs hold for it, O(N) bytes per rank, and the frame limits follow
//! from the world size.
//!
//! Each accepted connection is read on its own short-lived thread, so a peer that
//! connects and stalls, or a foreign client, cannot hold up the others; every
//! read and write has a deadline, and a failure names the ranks concerned.
//!
//! Clients that are not ranks cannot keep the real ones out. A client has
//! `io_timeout` from being accepted to deliver its whole hello, however it
//! trickles the bytes in. Unidentified clients (accepted, hello not yet read) are
//! limited per source address and in all; at either limit rank 0 closes the
//! oldest unidentified connection (of that source, or of all) to take the new
//! one, so a new connection always gets a reader and only a client that lingers
//! loses its place. A rank whose connection is closed or reset before rank 0
//! answered connects again with back-off until the deadline, and says that rank
//! 0 turned it away.

// This file is the public face; the rest follows the story above. `root` is
// rank 0's side (the join, its hello readers, later rounds), `peer` every other
// rank's, `session` what an exchange leaves open, `frame_io` one frame moved
// under deadlines, `progress` the lines printed during waits, `clock` a round's
// start and deadline; `personalize` the per-rank tables and `node_blobs` the
// one rverbs-core needs.
mod frame_io;
mod node_blobs;
mod peer;
mod personalize;
mod progress;
mod readmit;
#[cfg(test)]
mod readmit_tests;
mod root;
mod round_timer;
mod session;
mod watch;

use crate::error::{BootstrapError, ExchangeError, Result};
use core::time::Duration;
use std::net::TcpListener;

use crate::config::ClusterConfig;
use crate::secret::JobSecret;
use crate::wire::{FrameKind, MAX_PAYLOAD};

use self::progress::Progress;
use self::round_timer::RoundTimer;
use self::session::Link;

pub use self::node_blobs::NodeBlobs;
pub use self::personalize::Personalize;
#[cfg(feature = "pmix")]
pub(crate) use self::session::session_accessors;
pub use self::session::{Session, DROPPED_REASON};
#[cfg(feature = "verbs")]
pub(crate) use self::watch::WatchThread;
pub use self::watch::{Departure, Watch};

pub use self::readmit::exchange_rejoin;
#[cfg(feature = "verbs")]
pub(crate) use self::readmit::RANK_ZERO;

/// Knobs of an exchange and of the session's later rounds.
#[derive(Clone, Debug)]
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
    /// How long one read or write may make no progress; on rank 0, how long a
    /// client has from the moment it is accepted to deliver its whole hello
    /// (bytes trickling in do not extend it); on the others, how long rank 0
    /// has to send its challenge once connected. Default 10 s.
    pub io_timeout: Duration,
    /// First pause between attempts to reach rank 0; it doubles after each
    /// failed attempt, up to 8 times this (and at most 2 s). Default 200 ms.
    pub retry_interval: Duration,
    /// Largest blob accepted from anyone, in bytes: in the exchange unless
    /// [`personalize`](Self::personalize) sets its own limit, and in every
    /// all-gather round. Default 64 KiB.
    pub max_blob_size: usize,
    /// Print a progress line to stderr during long waits (at most every 5 s,
    /// only after 5 s) and when rank 0 refuses a connection. Default on.
    pub progress: bool,
    /// How rank 0 cuts the exchange's table for each rank, and the blob and
    /// entry limits that go with it; see [`Personalize`]. All ranks must agree.
    /// Default `None`: every rank receives every blob whole.
    pub personalize: Option<&'static dyn Personalize>,
    /// The job secret: with one, every frame carries a MAC and rank 0 admits only
    /// ranks that hold the same secret (see [`JobSecret`]). All ranks must agree:
    /// a rank with a secret and one without refuse each other, saying so. Default
    /// `None`, as is [`JobSecret::from_env`] when no variable is set; `connect()`
    /// reads the environment when this is `None`, `exchange` does not.
    pub secret: Option<JobSecret>,
    /// Longest a rank that gives up ([`Session::leave_on_error`], or a session dropped
    /// without being closed) waits for every peer's kernel to acknowledge its goodbye, pushing
    /// it again every 50 ms meanwhile: the usual reason to give up is this host's own link
    /// going down, and the goodbye must cross it once it is back (a short flap), promptly,
    /// not at the kernel's next backed-off retry. A reachable peer acknowledges within a
    /// round trip, so the wait is that long; only a link (or peer) that stays unreachable
    /// makes the process wait all of it before it exits. [`Session::close`] does not wait.
    /// Default 10 s (rverbs' default channel timeout: a peer waiting longer than that has
    /// timed out on its own); at most 60 s are waited, whatever is set.
    pub goodbye_linger: Duration,
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
            personalize: None,
            secret: None,
            goodbye_linger: Duration::from_secs(10),
        }
    }
}

impl ExchangeOptions {
    /// The largest blob the exchange (not a later round) takes in a world of
    /// `world_size` ranks.
    fn hello_limit(&self, world_size: u32) -> usize {
        match self.personalize {
            Some(p) => p.blob_limit(world_size).min(MAX_PAYLOAD as usize),
            None => self.max_blob_size,
        }
    }
}

/// Checks this rank's own first-round blob, before any peer sees it, against `limit` and
/// against `personalize` (which must be able to cut it): the same refusals for the TCP
/// exchange and the PMIx one.
pub(crate) fn check_own_blob(
    rank: u32,
    world_size: u32,
    blob: &[u8],
    limit: usize,
    personalize: Option<&dyn Personalize>,
) -> Result<()> {
    if blob.len() > limit {
        return Err(BootstrapError::Exchange(ExchangeError::BlobTooLarge {
            rank,
            len: blob.len(),
            limit,
        }));
    }
    if let Some(p) = personalize {
        p.check(rank, world_size, blob).map_err(|reason| {
            BootstrapError::Exchange(ExchangeError::InvalidArgument {
                rank,
                reason: format!("{p:?} refuses this rank's blob: {reason}"),
            })
        })?;
    }
    Ok(())
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
/// (entry `rank` is `blob` itself; the others are cut for this rank if
/// [`ExchangeOptions::personalize`] is set).
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
/// Argument errors ([`ExchangeError::RankOutOfRange`],
/// [`ExchangeError::BlobTooLarge`], [`ExchangeError::InvalidArgument`], also
/// for a blob [`Personalize::check`] refuses);
/// on rank 0 [`ExchangeError::Bind`], and [`ExchangeError::Timeout`] naming
/// the ranks that never joined; on other ranks [`ExchangeError::Connect`],
/// [`ExchangeError::Rejected`] and [`ExchangeError::Timeout`]; on both
/// [`ExchangeError::Io`], [`ExchangeError::Protocol`],
/// [`ExchangeError::Unexpected`] and [`ExchangeError::Disconnected`].
pub fn exchange_at(
    rendezvous: Rendezvous,
    rank: u32,
    world_size: u32,
    blob: &[u8],
    options: &ExchangeOptions,
) -> Result<(Session, Vec<Vec<u8>>)> {
    if world_size == 0 || rank >= world_size {
        return Err(BootstrapError::Exchange(ExchangeError::RankOutOfRange {
            rank,
            world_size,
        }));
    }
    if options.max_blob_size > MAX_PAYLOAD as usize {
        return Err(BootstrapError::Exchange(ExchangeError::InvalidArgument {
            rank,
            reason: format!(
                "max_blob_size {} exceeds the frame limit of {MAX_PAYLOAD} bytes",
                options.max_blob_size
            ),
        }));
    }
    let limit = options.hello_limit(world_size);
    check_own_blob(rank, world_size, blob, limit, options.personalize)?;
    if world_size == 1 {
        let session = Session::new(rank, world_size, options.clone(), Link::Alone);
        return Ok((session, vec![blob.to_vec()]));
    }
    if rank == 0 {
        let clock = RoundTimer::start(options.timeout);
        let mut progress = Progress::new(options.progress, clock, options.timeout);
        let listener = match rendezvous {
            Rendezvous::Listener(listener) => listener,
            Rendezvous::Address { host, port } => TcpListener::bind((host.as_str(), port))
                .map_err(|source| {
                    BootstrapError::Exchange(ExchangeError::Bind {
                        addr: fmt_addr(&host, port),
                        source,
                    })
                })?,
        };
        let (peers, blobs) =
            root::root_join(&listener, world_size, blob, options, clock, &mut progress)?;
        let mut session = Session::new(rank, world_size, options.clone(), Link::Root(peers));
        session.listener = Some(listener);
        Ok((session, blobs))
    } else {
        let Rendezvous::Address { host, port } = rendezvous else {
            return Err(BootstrapError::Exchange(ExchangeError::InvalidArgument {
                rank,
                reason: "only rank 0 accepts on a listener; other ranks need rank 0's address"
                    .to_owned(),
            }));
        };
        peer_session(
            &host,
            port,
            FrameKind::Hello,
            rank,
            world_size,
            blob,
            options,
        )
    }
}

/// A rank other than 0 joins rank 0 at `host:port` (`hello` is `Hello`, or `Rejoin` for a
/// restarted rank) within `options.timeout`, and its session runs over that link.
fn peer_session(
    host: &str,
    port: u16,
    hello: FrameKind,
    rank: u32,
    world_size: u32,
    blob: &[u8],
    options: &ExchangeOptions,
) -> Result<(Session, Vec<Vec<u8>>)> {
    let clock = RoundTimer::start(options.timeout);
    let mut progress = Progress::new(options.progress, clock, options.timeout);
    let join = peer::Join {
        hello,
        rank,
        world_size,
        blob,
        options,
    };
    let (link, blobs) = peer::peer_join(host, port, &join, clock, &mut progress)?;
    let link = Link::Peer(Box::new(link));
    Ok((Session::new(rank, world_size, options.clone(), link), blobs))
}

fn fmt_addr(host: &str, port: u16) -> String {
    if host.contains(':') {
        format!("[{host}]:{port}")
    } else {
        format!("{host}:{port}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ipv6_hosts_are_bracketed_before_the_port_and_names_are_not() {
        assert_eq!(fmt_addr("::1", 7), "[::1]:7");
        assert_eq!(fmt_addr("node1", 7), "node1:7");
    }
}
