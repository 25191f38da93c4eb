//! Rank 0's side of readmitting a restarted rank: read every survivor's `Readmit` (each is
//! sent once that survivor has settled its queue pairs, so when all are in, nobody writes
//! into anybody's flag array any more), take the restarted rank's `Rejoin` on the listener,
//! then send the new process every survivor's endpoint for it and every survivor the new
//! process's endpoint for that survivor.

use crate::error::{BootstrapError, ExchangeError, Result};
use std::net::TcpListener;

use rverbs_core::wire::node::{NodeBlob, ADDRESSED_BLOB_LEN};

use crate::exchange::frame_io::ReadError;
use crate::exchange::progress::Progress;
use crate::exchange::round_timer::RoundTimer;
use crate::exchange::session::PeerLink;
use crate::exchange::ExchangeOptions;
use crate::wire::{encode_table, FrameKind, Header};

use super::join::root_rejoin;
use super::round::{settle, Outcome, Readers};
use super::{send_reject, send_table_frame, table_payload};

/// Rank 0 readmits `rejoiner` (not 0): `peers` are the session's links (entry `i` is rank
/// `i + 1`), `own` is rank 0's addressed node blob for the new process. Returns the new
/// process's node blob addressed to rank 0; its link has taken the old one's place.
#[allow(clippy::too_many_arguments)]
pub(in crate::exchange) fn root_readmit(
    listener: &TcpListener,
    peers: &mut [PeerLink],
    world_size: u32,
    rejoiner: u32,
    own: &[u8],
    options: &ExchangeOptions,
    clock: RoundTimer,
    progress: &mut Progress,
) -> Result<Vec<u8>> {
    let at = rejoiner as usize - 1;
    let (outcomes, arrived) = {
        let (before, rest) = peers.split_at_mut(at);
        let (old, after) = rest.split_first_mut().ok_or(BootstrapError::Exchange(
            ExchangeError::RankOutOfRange {
                rank: rejoiner,
                world_size,
            },
        ))?;
        let readers = Readers {
            limit: ADDRESSED_BLOB_LEN as u32,
            thread_name: "rverbs-bootstrap-readmit",
            waiting: |_: &[Option<Outcome>]| "rank 0 waiting for the survivors' parts".to_owned(),
        };
        readers.read_while(
            before.iter_mut().chain(after),
            options,
            clock,
            progress,
            |progress| {
                root_rejoin(
                    listener,
                    world_size,
                    rejoiner,
                    &old.stream,
                    options,
                    clock,
                    progress,
                )
            },
        )
    };
    let refuse_all = |peers: &mut [PeerLink], error: &BootstrapError| {
        let reason = format!("readmitting rank {rejoiner} failed at rank 0: {error}");
        for peer in peers.iter_mut().filter(|p| p.rank != rejoiner) {
            send_reject(&peer.stream, &mut peer.seal, world_size, &reason, options);
        }
        reason
    };
    let (mut link, full) = match arrived {
        Ok(arrived) => arrived,
        Err(error) => {
            refuse_all(peers, &error);
            return Err(error);
        }
    };
    let survivors = peers.iter().filter(|p| p.rank != rejoiner);
    let parts = match tally(
        survivors, outcomes, world_size, rejoiner, own, options, clock,
    ) {
        Ok(parts) => parts,
        Err(error) => {
            let reason = refuse_all(peers, &error);
            send_reject(&link.stream, &mut link.seal, world_size, &reason, options);
            return Err(error);
        }
    };
    // The new process: every survivor's endpoint for it, its own entry empty.
    let payload = table_payload(encode_table(&parts))?;
    send_table_frame(&mut link, &payload, world_size, options, clock.deadline)?;
    // Every survivor: the new process's endpoint for it alone.
    let cut = |to: u32| {
        NodeBlob::cut_for(&full, to).map_err(|error| {
            BootstrapError::Exchange(ExchangeError::Unexpected {
                rank: 0,
                peer: Some(rejoiner),
                addr: link.addr.clone(),
                reason: format!("its node blob has no endpoint for rank {to}: {error}"),
            })
        })
    };
    let mine = cut(0)?.to_vec();
    for peer in peers.iter_mut().filter(|p| p.rank != rejoiner) {
        let blobs: Vec<Vec<u8>> = (0..world_size)
            .map(|r| {
                if r == rejoiner {
                    cut(peer.rank).map(|b| b.to_vec())
                } else {
                    Ok(Vec::new())
                }
            })
            .collect::<Result<_>>()?;
        let payload = table_payload(encode_table(&blobs))?;
        send_table_frame(peer, &payload, world_size, options, clock.deadline)?;
    }
    peers[at] = link;
    Ok(mine)
}

/// The new process's table (entry 0 `own`, entry `s` survivor `s`'s endpoint blob for the
/// new process, its own entry empty) if every survivor sent a good `Readmit`; otherwise the
/// first failure in rank order, or a timeout naming the survivors that sent nothing.
fn tally<'a>(
    survivors: impl Iterator<Item = &'a PeerLink>,
    outcomes: Vec<Option<Outcome>>,
    world_size: u32,
    rejoiner: u32,
    own: &[u8],
    options: &ExchangeOptions,
    clock: RoundTimer,
) -> Result<Vec<Vec<u8>>> {
    let mut parts = vec![Vec::new(); world_size as usize];
    parts[0] = own.to_vec();
    let mut missing = Vec::new();
    let mut failure = None;
    for (peer, outcome) in survivors.zip(outcomes) {
        match outcome {
            None | Some(Err(ReadError::Timeout)) => missing.push(peer.rank),
            Some(Err(error)) => {
                failure.get_or_insert_with(|| {
                    error.into_error(0, Some(peer.rank), &peer.addr, "readmit", clock)
                });
            }
            Some(Ok((header, payload))) => {
                match check_part(&header, &payload, peer.rank, world_size, rejoiner, options) {
                    Err(reason) => {
                        failure.get_or_insert(BootstrapError::Exchange(
                            ExchangeError::Unexpected {
                                rank: 0,
                                peer: Some(peer.rank),
                                addr: peer.addr.clone(),
                                reason,
                            },
                        ));
                    }
                    Ok(()) => parts[peer.rank as usize] = payload,
                }
            }
        }
    }
    settle(failure, missing, clock, || {
        format!("readmitting rank {rejoiner}: the survivors' parts")
    })?;
    Ok(parts)
}

/// Why `header` and `payload` are not survivor `rank`'s part in readmitting `rejoiner`.
fn check_part(
    header: &Header,
    payload: &[u8],
    rank: u32,
    world_size: u32,
    rejoiner: u32,
    options: &ExchangeOptions,
) -> core::result::Result<(), String> {
    if header.kind != FrameKind::Readmit {
        return Err(format!(
            "expected a Readmit frame (every survivor readmits rank {rejoiner} together), got {:?}",
            header.kind
        ));
    }
    if header.sender != rank || header.job_id != options.job_id || header.world_size != world_size {
        return Err(format!(
            "Readmit claims rank {} of {} in job {:#x}, expected rank {rank} of {world_size} in job {:#x}",
            header.sender, header.world_size, header.job_id, options.job_id
        ));
    }
    let blob = NodeBlob::decode(payload).map_err(|error| format!("not a node blob: {error}"))?;
    if blob.rank != rank || blob.world != world_size || blob.addressee() != Some(rejoiner) {
        return Err(format!(
            "a node blob of rank {} of {} for {:?}, expected rank {rank}'s for rank {rejoiner}",
            blob.rank,
            blob.world,
            blob.addressee()
        ));
    }
    Ok(())
}
