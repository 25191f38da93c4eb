//! Every other rank's side: connect to rank 0, send a `Hello` (then a `Sync`
//! per round), and check the table that comes back.

use std::io;
use std::net::{TcpStream, ToSocketAddrs};
use std::thread;
use std::time::Instant;

use crate::error::{BootstrapError, Result};
use crate::wire::{
    decode_table, encode_frame, table_payload_limit, FrameKind, MAX_PAYLOAD, REJECT_REASON_MAX,
};

use super::clock::Clock;
use super::frame_io::{read_frame, write_frame, MIN_TIMEOUT};
use super::personalize::Personalize;
use super::progress::Progress;
use super::session::PeerLink;
use super::ExchangeOptions;

/// Connects to rank 0, retrying until the deadline.
pub(super) fn connect(
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

/// A non-root rank's exchange: connect to rank 0, send the hello, get the table.
///
/// A connection reset before rank 0 answered is tried again on a new connection
/// until the deadline. Rank 0 closes a connection it has read only after
/// answering (a table or a `Reject`), so such a reset means rank 0 never read
/// our hello: it dropped the connection unread under a flood, or the kernel
/// did. The latter is what a thousand ranks connecting at once get from Linux:
/// the listen queue (128 with std) overflows, SYN cookies stand in for it, and
/// a cookie connection whose first data segment was dropped is reset when the
/// hello's next segment arrives.
#[allow(clippy::too_many_arguments)]
pub(super) fn peer_join(
    host: &str,
    port: u16,
    addr: String,
    rank: u32,
    world_size: u32,
    blob: &[u8],
    options: &ExchangeOptions,
    clock: Clock,
    progress: &mut Progress,
) -> Result<(PeerLink, Vec<Vec<u8>>)> {
    loop {
        let stream = connect(host, port, &addr, rank, options, clock, progress)?;
        let mut link = PeerLink {
            rank: 0,
            addr: addr.clone(),
            stream,
        };
        let outcome = peer_round(
            &mut link,
            FrameKind::Hello,
            options.personalize,
            rank,
            world_size,
            blob,
            options,
            clock,
            progress,
        );
        match outcome {
            Ok(blobs) => return Ok((link, blobs)),
            Err(error) if reset_unanswered(&error) && Instant::now() < clock.deadline => {
                progress.note(&format!(
                    "rank {rank}: {error}; rank 0 never answered, connecting again"
                ));
                thread::sleep(options.retry_interval.min(clock.remaining()));
            }
            Err(error) => return Err(error),
        }
    }
}

/// Whether the connection was reset (not closed) while sending the hello or
/// reading the answer.
fn reset_unanswered(error: &BootstrapError) -> bool {
    matches!(
        error,
        BootstrapError::Io { op: "send hello" | "table", source, .. }
            if matches!(
                source.kind(),
                io::ErrorKind::ConnectionReset
                    | io::ErrorKind::ConnectionAborted
                    | io::ErrorKind::BrokenPipe
            )
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

    let entry_limit = personalize.map_or(options.max_blob_size, |p| {
        p.entry_limit(world_size).min(MAX_PAYLOAD as usize)
    });
    let limit = table_payload_limit(world_size, entry_limit).max(REJECT_REASON_MAX as u32);
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
            let mut blobs =
                decode_table(&payload, entry_limit).map_err(|source| BootstrapError::Protocol {
                    rank,
                    peer: Some(0),
                    addr: link.addr.clone(),
                    source,
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
