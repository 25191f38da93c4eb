//! Rank 0's side of an all-gather round over the open connections.

use crate::error::{BootstrapError, ExchangeError, Result};
use std::sync::mpsc;
use std::thread;

use crate::exchange::frame_io::{read_frame, ReadError, READ_SLICE};
use crate::exchange::progress::Progress;
use crate::exchange::round_timer::RoundTimer;
use crate::exchange::session::PeerLink;
use crate::exchange::ExchangeOptions;
use crate::wire::{FrameKind, Header};

use super::{round_limit, send_reject, send_table};

/// What reading one peer's contribution came to.
pub(super) type Outcome = core::result::Result<(Header, Vec<u8>), ReadError>;

/// Rank 0's side of an all-gather round: read every peer's `Sync` in parallel,
/// then send the table.
pub(in crate::exchange) fn root_round(
    peers: &mut [PeerLink],
    world_size: u32,
    bytes: &[u8],
    options: &ExchangeOptions,
    clock: RoundTimer,
    progress: &mut Progress,
) -> Result<Vec<Vec<u8>>> {
    let outcomes = read_contributions(peers, options, clock, progress);
    match tally(peers, outcomes, world_size, bytes, options, clock) {
        Ok(blobs) => {
            send_table(peers, world_size, &blobs, options, clock.deadline)?;
            Ok(blobs)
        }
        Err(error) => {
            abort(peers, world_size, &error, options);
            Err(error)
        }
    }
}

/// Reads every peer's frame, each on a thread of its own; entry `i` is peer
/// `i`'s outcome, `None` if its reader never reported.
fn read_contributions(
    peers: &mut [PeerLink],
    options: &ExchangeOptions,
    clock: RoundTimer,
    progress: &mut Progress,
) -> Vec<Option<Outcome>> {
    let readers = Readers {
        limit: round_limit(options),
        thread_name: "rverbs-bootstrap-sync",
        waiting: |outcomes: &[Option<Outcome>]| {
            let waiting: Vec<u32> = (1u32..)
                .zip(outcomes)
                .filter(|(_, outcome)| outcome.is_none())
                .map(|(rank, _)| rank)
                .collect();
            format!("rank 0 waiting for ranks {waiting:?} (all-gather)")
        },
    };
    readers
        .read_while(peers.iter_mut(), options, clock, progress, |_| ())
        .0
}

/// How rank 0 reads one frame from each of several peers at once: the largest frame it
/// takes, its reader threads' name, and the progress line while it waits (given the
/// outcomes so far).
pub(super) struct Readers<W> {
    pub(super) limit: u32,
    pub(super) thread_name: &'static str,
    pub(super) waiting: W,
}

impl<W: Fn(&[Option<Outcome>]) -> String> Readers<W> {
    /// Reads one frame from each of `peers`, each on a thread of its own, while `meanwhile`
    /// runs on this one; entry `i` is peer `i`'s outcome, `None` if its reader never
    /// reported.
    pub(super) fn read_while<'p, T>(
        &self,
        peers: impl Iterator<Item = &'p mut PeerLink>,
        options: &ExchangeOptions,
        clock: RoundTimer,
        progress: &mut Progress,
        meanwhile: impl FnOnce(&mut Progress) -> T,
    ) -> (Vec<Option<Outcome>>, T) {
        let (limit, stall) = (self.limit, options.io_timeout);
        let mut outcomes: Vec<Option<Outcome>> = Vec::new();
        let result = thread::scope(|scope| {
            let (tx, rx) = mpsc::channel::<(usize, Outcome)>();
            let mut pending = 0usize;
            for (index, peer) in peers.enumerate() {
                let tx = tx.clone();
                let spawned = thread::Builder::new()
                    .name(self.thread_name.to_owned())
                    .spawn_scoped(scope, move || {
                        let outcome = read_frame(
                            &peer.stream,
                            &mut peer.seal,
                            clock.deadline,
                            clock.deadline,
                            stall,
                            limit,
                            &mut || {},
                        );
                        let _ = tx.send((index, outcome));
                    });
                outcomes.push(match spawned {
                    Ok(_) => {
                        pending += 1;
                        None
                    }
                    Err(error) => Some(Err(ReadError::Io(error))),
                });
            }
            drop(tx);
            let result = meanwhile(progress);
            // Every reader stops by the deadline, so this loop and the scope end too.
            while pending > 0 {
                match rx.recv_timeout(READ_SLICE) {
                    Ok((index, outcome)) => {
                        if let Some(slot) = outcomes.get_mut(index) {
                            *slot = Some(outcome);
                        }
                        pending -= 1;
                    }
                    Err(mpsc::RecvTimeoutError::Timeout) => {
                        progress.tick(|| (self.waiting)(&outcomes));
                    }
                    Err(mpsc::RecvTimeoutError::Disconnected) => break,
                }
            }
            result
        });
        (outcomes, result)
    }
}

/// The table (`bytes` is rank 0's entry) if every peer sent a good `Sync`;
/// otherwise the first failure in rank order, or failing that a timeout
/// naming every rank that sent nothing in time.
fn tally(
    peers: &[PeerLink],
    outcomes: Vec<Option<Outcome>>,
    world_size: u32,
    bytes: &[u8],
    options: &ExchangeOptions,
    clock: RoundTimer,
) -> Result<Vec<Vec<u8>>> {
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
            Some(Ok((header, payload))) => match check_sync(&header, peer, world_size, options) {
                Err(reason) => {
                    failure.get_or_insert(BootstrapError::Exchange(ExchangeError::Unexpected {
                        rank: 0,
                        peer: Some(peer.rank),
                        addr: peer.addr.clone(),
                        reason,
                    }));
                }
                Ok(()) => blobs.push(payload),
            },
        }
    }
    settle(failure, missing, clock, || "all-gather round".to_owned())?;
    Ok(blobs)
}

/// How a round rank 0 read from several peers ended: the first failure (in rank order),
/// else a timeout naming the ranks in `missing` and what was waited for (`detail`), else
/// success.
pub(super) fn settle(
    failure: Option<BootstrapError>,
    missing: Vec<u32>,
    clock: RoundTimer,
    detail: impl FnOnce() -> String,
) -> Result<()> {
    match failure {
        Some(error) => Err(error),
        None if missing.is_empty() => Ok(()),
        None => Err(BootstrapError::Exchange(ExchangeError::Timeout {
            rank: 0,
            missing,
            waited: clock.waited(),
            detail: detail(),
        })),
    }
}

/// Why `header` is not `peer`'s `Sync` for this round, if it is not.
fn check_sync(
    header: &Header,
    peer: &PeerLink,
    world_size: u32,
    options: &ExchangeOptions,
) -> core::result::Result<(), String> {
    if header.kind != FrameKind::Sync {
        return Err(format!("expected a Sync frame, got {:?}", header.kind));
    }
    if header.sender != peer.rank
        || header.job_id != options.job_id
        || header.world_size != world_size
    {
        return Err(format!(
            "Sync claims rank {} of {} in job {:#x}, expected rank {} of {world_size} in job {:#x}",
            header.sender, header.world_size, header.job_id, peer.rank, options.job_id
        ));
    }
    Ok(())
}

/// Tells every peer why the round failed, so none waits for a table that
/// will not come.
fn abort(
    peers: &mut [PeerLink],
    world_size: u32,
    error: &BootstrapError,
    options: &ExchangeOptions,
) {
    let reason = format!("all-gather aborted by rank 0: {error}");
    for peer in peers.iter_mut() {
        send_reject(&peer.stream, &mut peer.seal, world_size, &reason, options);
    }
}
