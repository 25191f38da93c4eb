//! Rank 0's side: the join that admits every peer, the later all-gather
//! rounds, and the two answers rank 0 sends back (the table, or a rejection).

mod hello;
mod join;
mod round;

use core::time::Duration;
use std::net::TcpStream;

use crate::error::{BootstrapError, Result};
use crate::exchange::frame_io::write_frame;
use crate::exchange::session::PeerLink;
use crate::exchange::ExchangeOptions;
use crate::wire::{encode_frame, encode_table, FrameKind, MAX_PAYLOAD, REJECT_REASON_MAX};

pub(super) use self::join::root_join;
pub(super) use self::round::root_round;

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

fn blob_limit(options: &ExchangeOptions) -> u32 {
    u32::try_from(options.max_blob_size).unwrap_or(MAX_PAYLOAD)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::HEADER_LEN;

    #[test]
    fn reject_reasons_are_cut_at_a_char_boundary() {
        let reason = "é".repeat(REJECT_REASON_MAX);
        let frame = reject_frame(7, 2, &reason);
        let payload = &frame[HEADER_LEN..];
        assert!(payload.len() <= REJECT_REASON_MAX);
        assert!(core::str::from_utf8(payload).is_ok());
    }
}
