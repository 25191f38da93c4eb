//! Rank 0's join: accept connections until every rank has sent an acceptable
//! hello, refusing strangers and forgetting ranks that leave before the table
//! is sent, then send everyone the table.

use crate::error::{BootstrapError, ExchangeError, Result};
use core::time::Duration;
use std::io;
use std::net::{TcpListener, TcpStream};
use std::os::fd::AsFd;
use std::time::Instant;

use rverbs_std_shim::hangup::{wait_for_hangup, PollSet};

use crate::exchange::frame_io::ReadError;
use crate::exchange::progress::Progress;
use crate::exchange::round_timer::RoundTimer;
use crate::exchange::session::PeerLink;
use crate::exchange::ExchangeOptions;
use crate::wire::{FrameKind, Header};

use super::hello::{Arrival, Claimed, HelloReaders};
use super::{answer_join, send_reject};

/// How long rank 0 sleeps between accept attempts when nothing happens.
const POLL: Duration = Duration::from_millis(5);
/// How often rank 0 checks that joined peers are still connected.
const LIVENESS_EVERY: Duration = Duration::from_millis(100);
/// Rejections remembered for the final error message.
const MAX_NOTES: usize = 8;
/// Connections accepted in one pass before the arrivals are looked at, so a
/// flood that never lets the listen queue run empty cannot starve real ranks'
/// hellos (or the deadline check) of attention.
const ACCEPT_BATCH: usize = 64;

/// Rank 0's side of the initial exchange.
pub(in crate::exchange) fn root_join(
    listener: &TcpListener,
    world_size: u32,
    blob: &[u8],
    options: &ExchangeOptions,
    clock: RoundTimer,
    progress: &mut Progress,
) -> Result<(Vec<PeerLink>, Vec<Vec<u8>>)> {
    let local = listener
        .local_addr()
        .map_or_else(|_| "?".to_owned(), |addr| addr.to_string());
    listener.set_nonblocking(true).map_err(|source| {
        BootstrapError::Exchange(ExchangeError::Io {
            rank: 0,
            peer: None,
            addr: local,
            op: "set_nonblocking",
            source,
        })
    })?;

    let mut readers = HelloReaders::new(world_size, options);
    let mut lobby = Lobby::new(world_size, options, clock);
    let mut last_liveness = Instant::now();
    while lobby.waiting() {
        lobby.turn(listener, &mut readers, progress)?;
        if last_liveness.elapsed() >= LIVENESS_EVERY {
            last_liveness = Instant::now();
            lobby.forget_lost(progress);
        }
        progress.tick(|| format!("rank 0 waiting for ranks {:?}", lobby.missing()));
    }
    readers.close_all();

    let (mut peers, blobs) = lobby.into_table(blob);
    let table = answer_join(&mut peers, world_size, blobs, options, clock.deadline)?;
    Ok((peers, table))
}

/// Rank 0 of a running world waits for restarted rank `rank` alone, on the listener the
/// exchange kept, refusing anything but its `Rejoin`; returns its connection and blob.
/// `old` is the connection of its previous process, which must have closed: a process that
/// is still connected has not failed and cannot be replaced.
pub(in crate::exchange) fn root_rejoin(
    listener: &TcpListener,
    world_size: u32,
    rank: u32,
    old: &TcpStream,
    options: &ExchangeOptions,
    clock: RoundTimer,
    progress: &mut Progress,
) -> Result<(PeerLink, Vec<u8>)> {
    let old = old.try_clone().map_err(|source| {
        BootstrapError::Exchange(ExchangeError::Io {
            rank: 0,
            peer: Some(rank),
            addr: String::new(),
            op: "duplicate the previous connection",
            source,
        })
    })?;
    let mut readers = HelloReaders::new(world_size, options);
    let mut lobby = Lobby::new(world_size, options, clock);
    lobby.rejoin = Some(Rejoin { rank, old });
    while lobby.waiting() {
        lobby.turn(listener, &mut readers, progress)?;
        progress.tick(|| format!("rank 0 waiting for rank {rank} to rejoin"));
    }
    readers.close_all();
    lobby.joined[rank as usize].take().ok_or_else(|| {
        BootstrapError::Exchange(ExchangeError::InvalidArgument {
            rank: 0,
            reason: format!("rank {rank} was admitted but has no place"),
        })
    })
}

/// The restarted rank a running world's rank 0 waits for, and a duplicate of the
/// connection of its previous process.
#[derive(Debug)]
struct Rejoin {
    rank: u32,
    old: TcpStream,
}

/// The ranks that have joined so far, and the connections turned away meanwhile, under the
/// round's options and timer.
#[derive(Debug)]
struct Lobby<'a> {
    options: &'a ExchangeOptions,
    clock: RoundTimer,
    world_size: u32,
    /// Slot `r` holds rank r's connection and blob; slot 0 stays empty.
    joined: Vec<Option<(PeerLink, Vec<u8>)>>,
    count: u32,
    refusals: Refusals,
    /// In a running world: the one rank that may come (with a `Rejoin`).
    rejoin: Option<Rejoin>,
}

impl<'a> Lobby<'a> {
    /// One turn of the wait: at the deadline, give up (closing every reader); else take
    /// the connections in the listen backlog and admit every hello that arrived.
    fn turn(
        &mut self,
        listener: &TcpListener,
        readers: &mut HelloReaders,
        progress: &mut Progress,
    ) -> Result<()> {
        if Instant::now() >= self.clock.deadline {
            readers.close_all();
            return Err(self.give_up());
        }
        self.accept_backlog(listener, readers, progress);
        for arrival in readers.arrivals(POLL) {
            self.admit(readers, arrival, progress);
        }
        Ok(())
    }

    fn new(world_size: u32, options: &'a ExchangeOptions, clock: RoundTimer) -> Self {
        Self {
            options,
            clock,
            world_size,
            joined: (0..world_size).map(|_| None).collect(),
            count: 0,
            refusals: Refusals::default(),
            rejoin: None,
        }
    }

    /// Whether some rank other than 0 has not joined yet (the restarted rank, in a running
    /// world).
    fn waiting(&self) -> bool {
        match &self.rejoin {
            Some(r) => self.joined[r.rank as usize].is_none(),
            None => self.count < self.world_size - 1,
        }
    }

    fn missing(&self) -> Vec<u32> {
        (1..self.world_size)
            .filter(|rank| self.rejoin.as_ref().is_none_or(|r| r.rank == *rank))
            .filter(|rank| self.joined[*rank as usize].is_none())
            .collect()
    }

    /// Hands the connections waiting on the listener (at most [`ACCEPT_BATCH`])
    /// to hello readers, closing the oldest unidentified connections to make room.
    fn accept_backlog(
        &mut self,
        listener: &TcpListener,
        readers: &mut HelloReaders,
        progress: &mut Progress,
    ) {
        let (options, clock) = (self.options, self.clock);
        for _ in 0..ACCEPT_BATCH {
            match listener.accept() {
                Ok((stream, addr)) => {
                    let (closed, started) =
                        readers.start(stream, addr, Instant::now(), options, clock);
                    if let Some(closed) = closed {
                        self.refusals.remember(
                            format!(
                                "closed the connection from {} after {:.1?} without a hello, to make room for one from {addr}: {}",
                                closed.addr, closed.age, closed.crowded
                            ),
                            progress,
                        );
                    }
                    if let Err(reason) = started {
                        self.refusals.remember(
                            format!("dropped a connection from {addr}: {reason}"),
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
    }

    /// Seats the sender of a good hello in its rank's slot; refuses anything
    /// else with a `Reject` frame saying why.
    fn admit(&mut self, readers: &mut HelloReaders, arrival: Arrival, progress: &mut Progress) {
        let options = self.options;
        // A connection closed to make room was logged then.
        let Some(Claimed {
            stream,
            addr,
            mut seal,
            outcome,
        }) = readers.claim(arrival)
        else {
            return;
        };
        let verdict = match outcome {
            Err(error) => Err(hello_failure(&error, options)),
            Ok((header, payload)) => check_hello(
                &header,
                &self.joined,
                self.world_size,
                options,
                self.rejoin.as_ref(),
            )
            .and_then(|()| check_blob(header.sender, self.world_size, &payload, options))
            .map(|()| (header.sender, payload)),
        };
        match verdict {
            Ok((rank, payload)) => {
                self.joined[rank as usize] = Some((
                    PeerLink {
                        rank,
                        addr: addr.to_string(),
                        stream,
                        seal,
                    },
                    payload,
                ));
                self.count += 1;
            }
            Err(reason) => {
                send_reject(&stream, &mut seal, self.world_size, &reason, options);
                self.refusals
                    .remember(format!("refused {addr}: {reason}"), progress);
            }
        }
    }

    /// Empties the slots of joined peers that have closed their end, so the
    /// rank can join again instead of getting a table over a dead connection.
    fn forget_lost(&mut self, progress: &mut Progress) {
        for slot in &mut self.joined {
            if slot
                .as_ref()
                .is_some_and(|(link, _)| !still_connected(&link.stream))
            {
                if let Some((link, _)) = slot.take() {
                    self.count -= 1;
                    self.refusals.remember(
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

    /// Tells every joined peer that rank 0 gives up, and returns the error
    /// naming the ranks that never came.
    fn give_up(&mut self) -> BootstrapError {
        let (options, clock) = (self.options, self.clock);
        let missing = self.missing();
        let reason = format!(
            "rendezvous timed out after {:.1?} waiting for ranks {missing:?}",
            clock.waited()
        );
        for (link, _) in self.joined.iter_mut().flatten() {
            send_reject(
                &link.stream,
                &mut link.seal,
                self.world_size,
                &reason,
                options,
            );
        }
        BootstrapError::Exchange(ExchangeError::Timeout {
            rank: 0,
            missing,
            waited: clock.waited(),
            detail: self.refusals.detail(),
        })
    }

    /// The blobs by rank (`blob` is rank 0's) and the connections to ranks 1 and up.
    fn into_table(self, blob: &[u8]) -> (Vec<PeerLink>, Vec<Vec<u8>>) {
        let mut blobs = Vec::with_capacity(self.world_size as usize);
        let mut peers = Vec::with_capacity(self.world_size as usize - 1);
        blobs.push(blob.to_vec());
        for (link, payload) in self.joined.into_iter().flatten() {
            blobs.push(payload);
            peers.push(link);
        }
        (peers, blobs)
    }
}

/// Connections rank 0 refused, dropped or lost during the join: all counted,
/// the first few kept for the final error message.
#[derive(Debug, Default)]
struct Refusals {
    count: usize,
    notes: Vec<String>,
}

impl Refusals {
    /// Counts a refusal; prints and keeps the first [`MAX_NOTES`], then prints
    /// one now and then, so a flood of strangers does not flood stderr too.
    fn remember(&mut self, line: String, progress: &mut Progress) {
        self.count += 1;
        if self.notes.len() < MAX_NOTES {
            progress.note(&format!("rank 0 {line}"));
            self.notes.push(line);
        } else {
            let count = self.count;
            progress.notice(|| {
                format!("rank 0 {line} ({count} connections refused or closed so far; not every one is shown)")
            });
        }
    }

    /// The timeout error's detail: empty if nothing was refused.
    fn detail(&self) -> String {
        if self.count == 0 {
            String::new()
        } else {
            format!(
                "{} connection(s) refused meanwhile: {}",
                self.count,
                self.notes.join("; ")
            )
        }
    }
}

/// Why a connection's hello could not be read, as rank 0 tells the client.
fn hello_failure(error: &ReadError, options: &ExchangeOptions) -> String {
    match error {
        ReadError::Timeout => format!(
            "sent no complete hello within {:.1?} of being accepted",
            options.io_timeout
        ),
        ReadError::Eof => "closed the connection before its hello was complete".to_owned(),
        other => other.describe(),
    }
}

fn check_hello(
    header: &Header,
    joined: &[Option<(PeerLink, Vec<u8>)>],
    world_size: u32,
    options: &ExchangeOptions,
    rejoin: Option<&Rejoin>,
) -> core::result::Result<(), String> {
    match (rejoin, header.kind) {
        (None, FrameKind::Hello) | (Some(_), FrameKind::Rejoin) => {}
        (None, FrameKind::Rejoin) => {
            return Err(
                "a Rejoin frame, but this world is still starting: every rank of a new \
                 world calls connect() (a rank rejoins a running world)"
                    .to_owned(),
            )
        }
        (Some(r), FrameKind::Hello) => {
            return Err(format!(
                "a Hello frame, but this world is running: the restarted rank {} calls \
                 rejoin(), not connect()",
                r.rank
            ))
        }
        (None, kind) => return Err(format!("expected a Hello frame, got {kind:?}")),
        (Some(_), kind) => return Err(format!("expected a Rejoin frame, got {kind:?}")),
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
    if let Some(r) = rejoin {
        if header.sender != r.rank {
            return Err(format!(
                "rank {} is not the rank being readmitted (rank {}): it is running",
                header.sender, r.rank
            ));
        }
        if !hung_up(&r.old) {
            return Err(format!(
                "rank {}'s previous process is still connected to rank 0: it has not exited, \
                 so it cannot be replaced",
                r.rank
            ));
        }
    }
    if let Some((link, _)) = &joined[header.sender as usize] {
        return Err(format!(
            "rank {} already joined from {}",
            header.sender, link.addr
        ));
    }
    Ok(())
}

/// Why the blob of a hello that is otherwise fine is refused, if it is.
fn check_blob(
    rank: u32,
    world_size: u32,
    blob: &[u8],
    options: &ExchangeOptions,
) -> core::result::Result<(), String> {
    let Some(p) = options.personalize else {
        return Ok(());
    };
    p.check(rank, world_size, blob)
        .map_err(|reason| format!("rank {rank}'s blob is refused by {p:?}: {reason}"))
}

/// Whether the peer closed its end (or the connection failed), whatever unread data it left.
fn hung_up(stream: &TcpStream) -> bool {
    let mut set = PollSet::with_capacity(1);
    let mut hung = [false];
    wait_for_hangup(&mut set, [stream.as_fd()], Duration::ZERO, &mut hung).is_ok_and(|n| n > 0)
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
