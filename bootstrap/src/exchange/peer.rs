//! Every other rank's side: connect to rank 0, take its challenge, send a
//! `Hello` (then a `Sync` per round), and check the table that comes back;
//! connect again, with back-off, whenever rank 0 turns the connection away
//! before answering.

use crate::error::{BootstrapError, ExchangeError, Result};
use core::time::Duration;
use std::io::{self, Write};
use std::net::{TcpStream, ToSocketAddrs};
use std::thread;
use std::time::Instant;

use crate::wire::{
    decode_table, printable, table_payload_limit, FrameKind, Seal, CHALLENGE_LEN, MAX_PAYLOAD,
    REJECT_REASON_MAX,
};

use super::frame_io::{auth_reason, read_frame, stall_limit, write_frame, ReadError, MIN_TIMEOUT};
use super::personalize::Personalize;
use super::progress::Progress;
use super::round_timer::RoundTimer;
use super::session::PeerLink;
use super::{fmt_addr, ExchangeOptions};

/// The longest pause between attempts, whatever `retry_interval` says.
const MAX_PAUSE: Duration = Duration::from_secs(2);
/// Back-off grows to at most this many times `retry_interval`.
const MAX_PAUSE_FACTOR: u32 = 8;

/// Pauses between attempts to reach rank 0: `retry_interval`, doubled after every
/// failed attempt up to [`MAX_PAUSE_FACTOR`] times it (and [`MAX_PAUSE`]), each cut
/// by up to a quarter at random, so that ranks turned away together do not all
/// come back at the same instant.
#[derive(Debug)]
struct Backoff {
    next: Duration,
    max: Duration,
    state: u64,
}

impl Backoff {
    fn new(options: &ExchangeOptions, rank: u32) -> Self {
        let base = options.retry_interval;
        let seed = getrandom::u64().unwrap_or(0x9e37_79b9_7f4a_7c15 ^ u64::from(rank));
        Self {
            next: base,
            max: base
                .saturating_mul(MAX_PAUSE_FACTOR)
                .min(MAX_PAUSE)
                .max(base),
            state: seed | 1,
        }
    }

    /// Sleeps for the next pause, never past the deadline.
    fn pause(&mut self, clock: RoundTimer) {
        // xorshift64: spread, not secrecy, is all the jitter needs.
        self.state ^= self.state << 13;
        self.state ^= self.state >> 7;
        self.state ^= self.state << 17;
        let quarter = self.next / 4;
        let cut = quarter.mul_f64((self.state >> 11) as f64 / (1u64 << 53) as f64);
        thread::sleep((self.next - cut).min(clock.remaining()));
        self.next = self.next.saturating_mul(2).min(self.max);
    }
}

/// Connects to rank 0, trying again with back-off until the deadline.
#[allow(clippy::too_many_arguments)]
fn connect(
    host: &str,
    port: u16,
    addr: &str,
    rank: u32,
    options: &ExchangeOptions,
    clock: RoundTimer,
    progress: &mut Progress,
    backoff: &mut Backoff,
) -> Result<TcpStream> {
    let mut last_error = io::Error::new(
        io::ErrorKind::TimedOut,
        "no connection attempt finished before the deadline",
    );
    loop {
        if Instant::now() >= clock.deadline {
            return Err(BootstrapError::Exchange(ExchangeError::Connect {
                rank,
                addr: addr.to_owned(),
                waited: clock.waited(),
                source: last_error,
            }));
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
        backoff.pause(clock);
    }
}

/// How one attempt to join ended, if not with the table.
enum Attempt {
    /// Rank 0 turned the connection away before answering (closed or reset it, or
    /// sent no challenge in time): worth another connection.
    Again {
        what: String,
        error: Box<BootstrapError>,
    },
    /// An answer, or a failure, that another connection would not change.
    Fail(Box<BootstrapError>),
}

impl Attempt {
    fn again(what: String, error: BootstrapError) -> Self {
        Self::Again {
            what,
            error: Box::new(error),
        }
    }

    fn fail(error: BootstrapError) -> Self {
        Self::Fail(Box::new(error))
    }
}

/// The connections rank 0 turned away, for the progress line and the final error.
#[derive(Debug, Default)]
struct TurnedAway {
    count: u32,
    last: String,
}

impl TurnedAway {
    /// The error to report when the deadline ends the retries: a timeout that
    /// says how rank 0 treated the earlier attempts, if it turned any away.
    fn explain(
        self,
        error: BootstrapError,
        rank: u32,
        addr: &str,
        clock: RoundTimer,
    ) -> BootstrapError {
        if self.count == 0 {
            return error;
        }
        BootstrapError::Exchange(ExchangeError::Timeout {
            rank,
            missing: vec![0],
            waited: clock.waited(),
            detail: format!(
                "rank 0 at {addr} turned away {} connection(s) before answering, so it may be \
                 overloaded by other connections (last: it {}); then: {error}",
                self.count, self.last
            ),
        })
    }
}

/// A non-root rank's exchange: connect to rank 0, take its challenge, send the
/// hello, get the table.
///
/// A connection turned away before rank 0 answered (closed, reset, or left
/// without a challenge for `io_timeout`) is tried again on a new one, with
/// back-off, until the deadline. Rank 0 closes a connection it has read only
/// after answering (a table or a `Reject`), so such a connection was never
/// read: rank 0 closed it to make room under a flood of other connections, or
/// the kernel dropped it. The latter is what a thousand ranks connecting at
/// once get from Linux: the listen queue (128 with std) overflows, SYN cookies
/// stand in for it, and a cookie connection whose first data segment was
/// dropped is reset when the next one arrives.
pub(super) fn peer_join(
    host: &str,
    port: u16,
    join: &Join<'_>,
    clock: RoundTimer,
    progress: &mut Progress,
) -> Result<(PeerLink, Vec<Vec<u8>>)> {
    let (rank, options) = (join.rank, join.options);
    let addr = fmt_addr(host, port);
    let mut backoff = Backoff::new(options, rank);
    let mut turned_away = TurnedAway::default();
    loop {
        let stream = match connect(
            host,
            port,
            &addr,
            rank,
            options,
            clock,
            progress,
            &mut backoff,
        ) {
            Ok(stream) => stream,
            Err(error) => return Err(turned_away.explain(error, rank, &addr, clock)),
        };
        let mut challenge = [0u8; CHALLENGE_LEN];
        getrandom::fill(&mut challenge).map_err(|error| {
            BootstrapError::Exchange(ExchangeError::InvalidArgument {
                rank,
                reason: format!("no random challenge from the OS: {error}"),
            })
        })?;
        let mut link = PeerLink {
            rank: 0,
            addr: addr.clone(),
            stream,
            seal: Seal::peer(options.secret.as_ref(), challenge),
        };
        match join_once(&mut link, join, clock, progress) {
            Ok(blobs) => return Ok((link, blobs)),
            Err(Attempt::Fail(error)) => return Err(*error),
            Err(Attempt::Again { what, error }) => {
                turned_away.count += 1;
                turned_away.last = what;
                if Instant::now() >= clock.deadline {
                    return Err(turned_away.explain(*error, rank, &addr, clock));
                }
                progress.notice(|| {
                    format!(
                        "rank {rank}: rank 0 at {addr} {} ({} time(s) so far); it may be \
                         overloaded by other connections; connecting again",
                        turned_away.last, turned_away.count
                    )
                });
                backoff.pause(clock);
            }
        }
    }
}

/// What a rank other than 0 brings to rank 0 when it joins: its hello (`Hello`, or `Rejoin`
/// for a restarted rank), its place in the world, its blob, and the exchange's options.
#[derive(Clone, Copy)]
pub(super) struct Join<'a> {
    pub(super) hello: FrameKind,
    pub(super) rank: u32,
    pub(super) world_size: u32,
    pub(super) blob: &'a [u8],
    pub(super) options: &'a ExchangeOptions,
}

/// One attempt over a fresh connection: the challenges, then the hello round.
fn join_once(
    link: &mut PeerLink,
    join: &Join<'_>,
    clock: RoundTimer,
    progress: &mut Progress,
) -> core::result::Result<Vec<Vec<u8>>, Attempt> {
    let Join {
        hello,
        rank,
        world_size,
        blob,
        options,
    } = *join;
    // Ours first, without waiting for rank 0's: a connection that the listen
    // queue only knows by its SYN cookie comes to exist when data arrives.
    let frame = link.seal.challenge_frame(options.job_id, rank, world_size);
    let sent = link
        .stream
        .set_write_timeout(Some(options.io_timeout.max(MIN_TIMEOUT)))
        .and_then(|()| (&link.stream).write_all(&frame));
    if let Err(source) = sent {
        let reset = is_reset(&source);
        let what = "reset the connection before answering".to_owned();
        let error = BootstrapError::Exchange(ExchangeError::Io {
            rank,
            peer: Some(0),
            addr: link.addr.clone(),
            op: "send challenge",
            source,
        });
        return Err(if reset {
            Attempt::again(what, error)
        } else {
            Attempt::fail(error)
        });
    }
    // Rank 0 writes its challenge as soon as it accepts; one that does not come
    // within io_timeout is from a rank 0 too busy to accept.
    let by = stall_limit(options.io_timeout, clock.deadline);
    let challenge = read_frame(
        &link.stream,
        &mut link.seal,
        by,
        by,
        options.io_timeout,
        CHALLENGE_LEN as u32,
        &mut || {},
    );
    match challenge {
        Ok(_) => {}
        // Rank 0 refuses our challenge frame as well, and logs why.
        Err(ReadError::Auth { error, .. }) => {
            return Err(Attempt::fail(BootstrapError::Exchange(
                ExchangeError::Auth {
                    rank,
                    peer: Some(0),
                    addr: link.addr.clone(),
                    reason: auth_reason(error, "rank 0", "this rank"),
                },
            )));
        }
        Err(error @ ReadError::Timeout) if Instant::now() < clock.deadline => {
            return Err(Attempt::again(
                format!("sent no challenge within {:.1?}", options.io_timeout),
                error.into_error(rank, Some(0), &link.addr, "challenge", clock),
            ));
        }
        Err(error) => {
            let what = turned_away(&error);
            let error = error.into_error(rank, Some(0), &link.addr, "challenge", clock);
            return Err(match what {
                Some(what) => Attempt::again(what, error),
                None => Attempt::fail(error),
            });
        }
    }
    peer_round(
        link,
        hello,
        options.personalize,
        rank,
        world_size,
        blob,
        options,
        clock,
        progress,
    )
    .map_err(|error| match unanswered(&error) {
        Some(what) => Attempt::again(what.to_owned(), error),
        None => Attempt::fail(error),
    })
}

/// What rank 0 did to a connection before it sent anything, if it closed or
/// reset it.
fn turned_away(error: &ReadError) -> Option<String> {
    match error {
        ReadError::Eof => Some("closed the connection before answering".to_owned()),
        ReadError::Io(source) if is_reset(source) => {
            Some("reset the connection before answering".to_owned())
        }
        _ => None,
    }
}

/// Whether the hello round failed because rank 0 closed or reset the connection
/// before answering, and how to say so.
fn unanswered(error: &BootstrapError) -> Option<&'static str> {
    match error {
        BootstrapError::Exchange(ExchangeError::Io {
            op: "send hello" | "table",
            source,
            ..
        }) if is_reset(source) => Some("reset the connection before answering"),
        BootstrapError::Exchange(ExchangeError::Disconnected { .. }) => {
            Some("closed the connection before answering")
        }
        _ => None,
    }
}

fn is_reset(error: &io::Error) -> bool {
    matches!(
        error.kind(),
        io::ErrorKind::ConnectionReset
            | io::ErrorKind::ConnectionAborted
            | io::ErrorKind::BrokenPipe
    )
}

/// A non-root rank's round: send our frame (`Hello` or `Sync`), then read the
/// table (or a rejection) from rank 0 and check it. With `personalize` (only
/// ever the exchange's round) the table is cut for this rank.
#[allow(clippy::too_many_arguments)]
pub(super) fn peer_round(
    link: &mut PeerLink,
    kind: FrameKind,
    personalize: Option<&dyn Personalize>,
    rank: u32,
    world_size: u32,
    own: &[u8],
    options: &ExchangeOptions,
    clock: RoundTimer,
    progress: &mut Progress,
) -> Result<Vec<Vec<u8>>> {
    let sealed = link
        .seal
        .seal(kind, options.job_id, rank, world_size, own)
        .map_err(|source| {
            BootstrapError::Exchange(ExchangeError::InvalidArgument {
                rank,
                reason: format!("cannot frame the blob: {source}"),
            })
        })?;
    let op = match kind {
        FrameKind::Hello | FrameKind::Rejoin => "send hello",
        FrameKind::Readmit => "send readmission part",
        _ => "send all-gather contribution",
    };
    write_frame(
        &link.stream,
        &sealed,
        own,
        options.io_timeout,
        clock.deadline,
    )
    .map_err(|source| {
        BootstrapError::Exchange(ExchangeError::Io {
            rank,
            peer: Some(0),
            addr: link.addr.clone(),
            op,
            source,
        })
    })?;

    let entry_limit = personalize.map_or(options.max_blob_size, |p| {
        p.entry_limit(world_size).min(MAX_PAYLOAD as usize)
    });
    let limit = table_payload_limit(world_size, entry_limit).max(REJECT_REASON_MAX as u32);
    let addr = link.addr.clone();
    let (header, payload) = read_frame(
        &link.stream,
        &mut link.seal,
        clock.deadline,
        clock.deadline,
        options.io_timeout,
        limit,
        &mut || {
            progress.tick(|| format!("rank {rank} waiting for the table from rank 0 at {addr}"))
        },
    )
    .map_err(|error| error.into_error(rank, Some(0), &link.addr, "table", clock))?;

    let unexpected = |reason: String| {
        BootstrapError::Exchange(ExchangeError::Unexpected {
            rank,
            peer: Some(0),
            addr: link.addr.clone(),
            reason,
        })
    };
    match header.kind {
        FrameKind::Reject => Err(BootstrapError::Exchange(ExchangeError::Rejected {
            rank,
            addr: link.addr.clone(),
            // Rank 0's words, printed by whoever reads the error: cleaned as a goodbye's are.
            reason: printable(&payload, REJECT_REASON_MAX),
        })),
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
            let mut blobs = decode_table(&payload, entry_limit).map_err(|source| {
                BootstrapError::Exchange(ExchangeError::Protocol {
                    rank,
                    peer: Some(0),
                    addr: link.addr.clone(),
                    source,
                })
            })?;
            if blobs.len() != world_size as usize {
                return Err(unexpected(format!(
                    "table holds {} entries for a world of {world_size}",
                    blobs.len()
                )));
            }
            // A plain table echoes our blob, which catches a rank 0 that mixed
            // up the entries; a personalized one leaves our entry empty (each
            // entry's own format names its sender and addressee, if it cares).
            let mine = &mut blobs[rank as usize];
            if personalize.is_some() {
                if !mine.is_empty() {
                    return Err(unexpected(format!(
                        "the table carries {} bytes in this rank's own entry, which a personalized table leaves empty (does every rank set the same `personalize`?)",
                        mine.len()
                    )));
                }
                own.clone_into(mine);
            } else if mine != own {
                return Err(unexpected(
                    "the table does not echo this rank's blob unchanged (does every rank set the same `personalize`?)".to_owned(),
                ));
            }
            Ok(blobs)
        }
        other => Err(unexpected(format!(
            "expected a Table or Reject frame, got {other:?}"
        ))),
    }
}
