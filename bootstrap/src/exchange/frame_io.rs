//! One frame moved over a `TcpStream` under deadlines: reads in short slices
//! (so waits can report progress), with a stall limit between bytes and a
//! hard deadline over all; and every frame through the connection's [`Seal`],
//! so none is sent without its MAC or accepted without checking it.

use crate::error::{BootstrapError, ExchangeError};
use core::time::Duration;
use std::io::{self, Read, Write};
use std::net::TcpStream;
use std::time::Instant;

use crate::secret::{SECRET_ENV, SECRET_FILE_ENV};
use crate::wire::{
    decode_header, Frame, Header, Seal, Sealed, WireError, HEADER_LEN, MAC_LEN, MAGIC,
};

use super::round_timer::RoundTimer;

/// Longest single blocking read, so waits can report progress.
pub(super) const READ_SLICE: Duration = Duration::from_millis(250);
/// Smallest timeout handed to the OS (zero means "block forever" to some calls).
pub(super) const MIN_TIMEOUT: Duration = Duration::from_millis(1);
/// A payload buffer grows by at most this much ahead of the bytes received, so a
/// frame that announces a large payload and stalls costs no more than this.
const PAYLOAD_STEP: usize = 64 * 1024;

/// Frames up to this size go out in one write; larger payloads are written in
/// place rather than copied next to their header.
const COALESCE: usize = 16 * 1024;

/// Why reading a frame failed, before it is given rank and address context.
#[derive(Debug)]
pub(super) enum ReadError {
    Io(io::Error),
    Timeout,
    Eof,
    Wire(WireError),
    /// A well-formed header announcing a payload over the limit in force.
    Oversize {
        header: Header,
        limit: u32,
    },
    /// A whole frame whose MAC does not prove it (see [`WireError::is_auth`]).
    Auth {
        header: Header,
        error: WireError,
    },
}

impl ReadError {
    pub(super) fn describe(&self) -> String {
        match self {
            Self::Io(error) => format!("read failed: {error}"),
            Self::Timeout => "sent no complete frame in time".to_owned(),
            Self::Eof => "closed the connection mid-frame".to_owned(),
            Self::Wire(error) => error.to_string(),
            Self::Oversize { header, limit } => format!(
                "{:?} frame from rank {} (of {}) announces {} bytes, which exceeds the limit of {limit} bytes",
                header.kind, header.sender, header.world_size, header.payload_len
            ),
            Self::Auth { header, error } => format!(
                "{:?} frame claiming rank {} (of {}): {}",
                header.kind,
                header.sender,
                header.world_size,
                auth_reason(*error, "the sender", "rank 0")
            ),
        }
    }

    pub(super) fn into_error(
        self,
        rank: u32,
        peer: Option<u32>,
        addr: &str,
        op: &'static str,
        clock: RoundTimer,
    ) -> BootstrapError {
        match self {
            Self::Io(source) => BootstrapError::Exchange(ExchangeError::Io {
                rank,
                peer,
                addr: addr.to_owned(),
                op,
                source,
            }),
            Self::Timeout => BootstrapError::Exchange(ExchangeError::Timeout {
                rank,
                missing: peer.into_iter().collect(),
                waited: clock.waited(),
                detail: format!("{op} from {addr}"),
            }),
            Self::Eof => BootstrapError::Exchange(ExchangeError::Disconnected {
                rank,
                peer,
                addr: addr.to_owned(),
            }),
            Self::Wire(source) => BootstrapError::Exchange(ExchangeError::Protocol {
                rank,
                peer,
                addr: addr.to_owned(),
                source,
            }),
            Self::Oversize { header, limit } => BootstrapError::Exchange(ExchangeError::Protocol {
                rank,
                peer,
                addr: addr.to_owned(),
                source: WireError::PayloadTooLarge {
                    len: header.payload_len,
                    limit,
                },
            }),
            Self::Auth { error, .. } => {
                let remote = peer.map_or_else(|| "the peer".to_owned(), |p| format!("rank {p}"));
                BootstrapError::Exchange(ExchangeError::Auth {
                    rank,
                    peer,
                    addr: addr.to_owned(),
                    reason: auth_reason(error, &remote, "this rank"),
                })
            }
        }
    }
}

/// What a failed MAC check means, said by `me` about `remote`: who lacks a
/// secret the other requires, or that the secrets differ. Never contains a secret.
pub(super) fn auth_reason(error: WireError, remote: &str, me: &str) -> String {
    let (with, without) = match error {
        WireError::MacUnexpected => (remote, me),
        WireError::MacMissing => (me, remote),
        other => return other.to_string(),
    };
    format!(
        "{with} requires a job secret and {without} has none (every rank needs the same \
         secret, from {SECRET_FILE_ENV}, {SECRET_ENV} or ExchangeOptions::secret, or none does)"
    )
}

/// `stall` from now, never past `hard` (a `stall` too long to add to now, such as
/// `Duration::MAX`, is no limit of its own: `hard` decides).
pub(super) fn stall_limit(stall: Duration, hard: Instant) -> Instant {
    Instant::now()
        .checked_add(stall)
        .map_or(hard, |by| by.min(hard))
}

/// Fills `buf`. The first byte may take until `by`; after each read that makes
/// progress the rest gets another `stall`, never past `hard`.
fn read_exact_by(
    mut stream: &TcpStream,
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
                by = stall_limit(stall, hard);
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

/// Reads one frame whose payload may not exceed `limit` bytes, and opens it
/// with `seal` (its MAC checked and counted). The payload buffer grows with the
/// bytes that arrive, after the header's length passed that check, never far
/// ahead of them.
pub(super) fn read_frame(
    stream: &TcpStream,
    seal: &mut Seal,
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
    let by = stall_limit(stall, hard);
    read_exact_by(stream, rest, by, hard, stall, tick)?;
    let header = decode_header(&head).map_err(ReadError::Wire)?;
    seal.check_order(&header).map_err(ReadError::Wire)?;
    if header.payload_len > limit {
        return Err(ReadError::Oversize { header, limit });
    }
    let len = header.payload_len as usize;
    let mut payload = Vec::new();
    while payload.len() < len {
        let start = payload.len();
        payload.resize(len.min(start + PAYLOAD_STEP), 0);
        let by = stall_limit(stall, hard);
        read_exact_by(stream, &mut payload[start..], by, hard, stall, tick)?;
    }
    let mut mac = [0u8; MAC_LEN];
    if header.mac {
        let by = stall_limit(stall, hard);
        read_exact_by(stream, &mut mac, by, hard, stall, tick)?;
    }
    let frame = Frame {
        header,
        payload: &payload,
        mac: header.mac.then_some(&mac),
    };
    seal.open(&frame).map_err(|error| {
        if error.is_auth() {
            ReadError::Auth { header, error }
        } else {
            ReadError::Wire(error)
        }
    })?;
    Ok((header, payload))
}

/// Writes a frame made by [`Seal::seal`] for `payload`, each write allowed
/// `stall` without progress and the whole frame done by `hard`: a peer that
/// reads just fast enough never to stall a write cannot hold the writer past
/// its deadline.
pub(super) fn write_frame(
    stream: &TcpStream,
    sealed: &Sealed,
    payload: &[u8],
    stall: Duration,
    hard: Instant,
) -> io::Result<()> {
    let mac: &[u8] = sealed.mac.as_ref().map_or(&[], |mac| mac.as_slice());
    if payload.len() <= COALESCE {
        let mut frame = Vec::with_capacity(HEADER_LEN + payload.len() + mac.len());
        frame.extend_from_slice(&sealed.header);
        frame.extend_from_slice(payload);
        frame.extend_from_slice(mac);
        write_all_by(stream, &frame, stall, hard)?;
    } else {
        write_all_by(stream, &sealed.header, stall, hard)?;
        write_all_by(stream, payload, stall, hard)?;
        write_all_by(stream, mac, stall, hard)?;
    }
    Ok(())
}

/// Writes all of `buf`, each write allowed `stall` without progress, and fails
/// once `hard` has passed with bytes still to go, progress or not. (The first
/// write is tried even at `hard`: one the socket takes at once is no wait.)
fn write_all_by(
    mut stream: &TcpStream,
    mut buf: &[u8],
    stall: Duration,
    hard: Instant,
) -> io::Result<()> {
    let mut first = true;
    while !buf.is_empty() {
        let left = hard.saturating_duration_since(Instant::now());
        if left.is_zero() && !first {
            return Err(io::Error::new(
                io::ErrorKind::TimedOut,
                format!(
                    "the round's deadline passed with {} bytes still to write",
                    buf.len()
                ),
            ));
        }
        first = false;
        let slice = stall.min(left);
        stream.set_write_timeout(Some(slice.max(MIN_TIMEOUT)))?;
        match stream.write(buf) {
            Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
            Ok(n) => buf = &buf[n..],
            Err(error) if error.kind() == io::ErrorKind::Interrupted => {}
            Err(error)
                if matches!(
                    error.kind(),
                    io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
                ) =>
            {
                // The peer took nothing for a whole `stall`; a shorter slice
                // ended at the deadline, which the loop's top reports.
                if slice == stall {
                    return Err(error);
                }
            }
            Err(error) => return Err(error),
        }
    }
    Ok(())
}
