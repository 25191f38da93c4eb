//! Rank 0's side: the join that admits every peer, the later all-gather
//! rounds, and the two answers rank 0 sends back (the table, or a rejection).

mod hello;
mod join;
mod pending;
mod readmit;
mod round;

use crate::error::{BootstrapError, ExchangeError, Result};
use core::time::Duration;
use std::net::TcpStream;
use std::time::Instant;

use crate::exchange::frame_io::write_frame;
use crate::exchange::personalize::Personalize;
use crate::exchange::session::PeerLink;
use crate::exchange::ExchangeOptions;
use crate::wire::{
    encode_table, encode_table_with, table_payload_limit, FrameKind, Seal, WireError, MAX_PAYLOAD,
    REJECT_REASON_MAX,
};

pub(super) use self::join::root_join;
pub(super) use self::readmit::root_readmit;
pub(super) use self::round::root_round;

/// Ends the join: sends every peer its table and returns rank 0's. `blobs` are
/// every rank's blobs whole, by rank.
fn answer_join(
    peers: &mut [PeerLink],
    world_size: u32,
    blobs: Vec<Vec<u8>>,
    options: &ExchangeOptions,
    by: Instant,
) -> Result<Vec<Vec<u8>>> {
    let Some(p) = options.personalize else {
        send_table(peers, world_size, &blobs, options, by)?;
        return Ok(blobs);
    };
    // One table at a time, so rank 0 holds the blobs and a single O(N) table,
    // never all N of them.
    for peer in peers.iter_mut() {
        let payload = table_payload(personal_table(p, peer.rank, world_size, &blobs))?;
        send_table_frame(peer, &payload, world_size, options, by)?;
    }
    let mut own = Vec::with_capacity(blobs.len());
    for (from, blob) in (0u32..).zip(&blobs) {
        let mut entry = Vec::new();
        if from == 0 {
            entry.clone_from(blob);
        } else {
            p.cut(0, from, blob, &mut entry);
        }
        own.push(entry);
    }
    Ok(own)
}

/// Rank `for_rank`'s table: entry `j` is what rank `j`'s blob holds for it,
/// its own entry empty.
fn personal_table(
    p: &dyn Personalize,
    for_rank: u32,
    world_size: u32,
    blobs: &[Vec<u8>],
) -> core::result::Result<Vec<u8>, WireError> {
    let capacity = table_payload_limit(world_size, p.entry_limit(world_size)) as usize;
    encode_table_with(world_size, capacity, |from, out| {
        if from != for_rank {
            p.cut(for_rank, from, &blobs[from as usize], out);
        }
    })
}

/// Sends every peer the same table of `blobs`, all by `by`.
fn send_table(
    peers: &mut [PeerLink],
    world_size: u32,
    blobs: &[Vec<u8>],
    options: &ExchangeOptions,
    by: Instant,
) -> Result<()> {
    // One payload for all; each frame's header and MAC are the peer's own.
    let payload = table_payload(encode_table(blobs))?;
    for peer in peers {
        send_table_frame(peer, &payload, world_size, options, by)?;
    }
    Ok(())
}

fn table_payload(payload: core::result::Result<Vec<u8>, WireError>) -> Result<Vec<u8>> {
    payload.map_err(|source| {
        BootstrapError::Exchange(ExchangeError::InvalidArgument {
            rank: 0,
            reason: format!("cannot encode the table: {source}"),
        })
    })
}

/// Sends `peer` its table frame, done by `by` (the round's deadline) however
/// the peer paces its reads.
fn send_table_frame(
    peer: &mut PeerLink,
    payload: &[u8],
    world_size: u32,
    options: &ExchangeOptions,
    by: Instant,
) -> Result<()> {
    let sealed = peer
        .seal
        .seal(FrameKind::Table, options.job_id, 0, world_size, payload)
        .map_err(|source| {
            BootstrapError::Exchange(ExchangeError::InvalidArgument {
                rank: 0,
                reason: format!("cannot frame the table: {source}"),
            })
        })?;
    write_frame(&peer.stream, &sealed, payload, options.io_timeout, by).map_err(|source| {
        BootstrapError::Exchange(ExchangeError::Io {
            rank: 0,
            peer: Some(peer.rank),
            addr: peer.addr.clone(),
            op: "send table",
            source,
        })
    })
}

/// `reason` cut to at most [`REJECT_REASON_MAX`] bytes, at a char boundary.
fn reject_payload(reason: &str) -> &[u8] {
    let mut cut = reason.len().min(REJECT_REASON_MAX);
    while !reason.is_char_boundary(cut) {
        cut -= 1;
    }
    &reason.as_bytes()[..cut]
}

/// Sends a `Reject` saying `reason`, sealed for this connection. Best effort:
/// the connection is dropped right after, whatever happens here.
fn send_reject(
    stream: &TcpStream,
    seal: &mut Seal,
    world_size: u32,
    reason: &str,
    options: &ExchangeOptions,
) {
    let payload = reject_payload(reason);
    if let Ok(sealed) = seal.seal(FrameKind::Reject, options.job_id, 0, world_size, payload) {
        let stall = options.io_timeout.min(Duration::from_secs(1));
        let _ = write_frame(stream, &sealed, payload, stall, Instant::now() + stall);
    }
}

/// The largest `Hello` payload rank 0 reads in a world of `world_size`.
fn hello_limit(options: &ExchangeOptions, world_size: u32) -> u32 {
    u32::try_from(options.hello_limit(world_size)).unwrap_or(MAX_PAYLOAD)
}

/// The largest `Sync` payload rank 0 reads in an all-gather round.
fn round_limit(options: &ExchangeOptions) -> u32 {
    u32::try_from(options.max_blob_size).unwrap_or(MAX_PAYLOAD)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reject_reasons_are_cut_at_a_char_boundary() {
        let reason = "é".repeat(REJECT_REASON_MAX);
        let payload = reject_payload(&reason);
        assert!(payload.len() <= REJECT_REASON_MAX);
        assert!(core::str::from_utf8(payload).is_ok());
    }
}
