//! The bootstrap frame format, the one place it is defined.
//!
//! Every frame is a fixed 28-byte little-endian header, a payload, and, when the
//! header's MAC flag is set, a 32-byte MAC:
//!
//! | offset | size | field                                                   |
//! |-------:|-----:|---------------------------------------------------------|
//! | 0      | 4    | magic, the bytes `RVB1`                                 |
//! | 4      | 2    | version, `u16`, currently 2                             |
//! | 6      | 1    | kind, see [`FrameKind`]                                 |
//! | 7      | 1    | flags: bit 0 ([`FLAG_MAC`]) a MAC follows; others 0     |
//! | 8      | 8    | job id, `u64`                                           |
//! | 16     | 4    | sender rank, `u32`                                      |
//! | 20     | 4    | world size, `u32`                                       |
//! | 24     | 4    | payload length in bytes, `u32`                          |
//! | 28     | len  | payload                                                 |
//! | 28+len | 32   | HMAC-SHA256, only with [`FLAG_MAC`]; see [`Seal`]       |
//!
//! Each end opens a connection with a `Challenge` (its payload is
//! [`CHALLENGE_LEN`] random bytes); then the connecting end sends its `Hello`
//! or, in later rounds, `Sync`, and rank 0 answers with a `Table` or a `Reject`.
//! With a job secret every frame of either end, of every kind, carries the MAC;
//! without one, none does. [`Seal`] makes and checks them.
//!
//! A rank started again in a running world opens with a `Rejoin` in place of the
//! `Hello`; the surviving ranks send rank 0 a `Readmit` each in place of a `Sync`,
//! and rank 0 answers both with a `Table` (see `Connected::readmit`).
//!
//! Payloads by kind: `Challenge` carries the challenge; `Hello`, `Sync`, `Rejoin`
//! and `Readmit` carry the sender's opaque bytes; `Reject` carries a UTF-8 reason (at most
//! [`REJECT_REASON_MAX`] bytes); `Table` carries the table layout described at
//! [`encode_table`]: one entry per rank, rank `i`'s blob in entry `i`, or, when the
//! exchange is personalized (see [`Personalize`](crate::exchange::Personalize)),
//! the part of rank `i`'s blob meant for the receiver, with the receiver's own
//! entry empty.
//!
//! Version 1 had no challenge and no MAC, and byte 7 was reserved; the version
//! field keeps the two apart, so a rank of one version refuses the other with a
//! message that names both.
//!
//! The decoders are total: they return a [`WireError`] for every malformed input
//! and never panic, and they check every length against a limit before
//! allocating, so they are safe to run on bytes from any socket (and from a fuzzer).

mod mac;

pub use self::mac::{
    bye_reason, ByeCheck, End, LastWord, Seal, Sealed, CHALLENGE_LEN, MAC_LEN, MAX_REASON,
};

use core::fmt;

/// The four magic bytes that open every frame.
pub const MAGIC: [u8; 4] = *b"RVB1";
/// The only protocol version this crate speaks.
pub const VERSION: u16 = 2;
/// Header flag: a [`MAC_LEN`]-byte MAC follows the payload.
pub const FLAG_MAC: u8 = 1;
/// Size of the fixed header in bytes.
pub const HEADER_LEN: usize = 28;
/// Absolute ceiling on any payload (1 GiB), whatever limit the caller passes.
pub const MAX_PAYLOAD: u32 = 1 << 30;
/// Longest reject reason sent or accepted, in bytes.
pub const REJECT_REASON_MAX: usize = 1024;
/// Bytes a table spends per entry besides the blob itself (rank and length).
pub const TABLE_ENTRY_OVERHEAD: usize = 8;

/// What a frame carries.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum FrameKind {
    /// A rank introduces itself to rank 0 with its endpoint blob.
    Hello,
    /// Rank 0 sends every rank's blob, indexed by rank (or, in a personalized
    /// exchange, what each blob holds for the receiver).
    Table,
    /// Rank 0 refuses a connection or aborts a round; the payload says why.
    Reject,
    /// A rank's contribution to a later all-gather round.
    Sync,
    /// Each end's first frame on every connection: fresh random bytes that the
    /// MAC of every later frame on that connection covers (see [`Seal`]).
    Challenge,
    /// A rank closes its session. No payload: on purpose, and the connection closing after
    /// it is a goodbye, not a failure. A payload (UTF-8, at most [`MAX_REASON`] bytes): the
    /// process gives up because of an error, and this is why; its peers report it as gone
    /// with that reason ([`LastWord::GaveUp`]).
    Bye,
    /// A restarted rank introduces itself to the rank 0 of a running world, in place of a
    /// `Hello`, with the endpoint blob of its new process.
    Rejoin,
    /// A surviving rank's part in readmitting a restarted one, in place of a `Sync`: the
    /// endpoint blob it made for the new process.
    Readmit,
}

impl FrameKind {
    /// The byte that encodes this kind on the wire.
    #[must_use]
    pub const fn to_u8(self) -> u8 {
        match self {
            Self::Hello => 1,
            Self::Table => 2,
            Self::Reject => 3,
            Self::Sync => 4,
            Self::Challenge => 5,
            Self::Bye => 6,
            Self::Rejoin => 7,
            Self::Readmit => 8,
        }
    }

    /// The kind encoded by `byte`, or `None` for an unknown kind.
    #[must_use]
    pub const fn from_u8(byte: u8) -> Option<Self> {
        match byte {
            1 => Some(Self::Hello),
            2 => Some(Self::Table),
            3 => Some(Self::Reject),
            4 => Some(Self::Sync),
            5 => Some(Self::Challenge),
            6 => Some(Self::Bye),
            7 => Some(Self::Rejoin),
            8 => Some(Self::Readmit),
            _ => None,
        }
    }
}

/// A decoded frame header.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Header {
    /// What the frame carries.
    pub kind: FrameKind,
    /// Job id of the sender; frames from another job are refused.
    pub job_id: u64,
    /// Rank of the sender.
    pub sender: u32,
    /// World size the sender believes in.
    pub world_size: u32,
    /// Length of the payload that follows the header.
    pub payload_len: u32,
    /// Whether a [`MAC_LEN`]-byte MAC follows the payload ([`FLAG_MAC`]).
    pub mac: bool,
}

impl Header {
    /// Encodes the header into its fixed 28-byte form.
    #[must_use]
    pub fn encode(&self) -> [u8; HEADER_LEN] {
        let mut out = [0u8; HEADER_LEN];
        out[0..4].copy_from_slice(&MAGIC);
        out[4..6].copy_from_slice(&VERSION.to_le_bytes());
        out[6] = self.kind.to_u8();
        out[7] = if self.mac { FLAG_MAC } else { 0 };
        out[8..16].copy_from_slice(&self.job_id.to_le_bytes());
        out[16..20].copy_from_slice(&self.sender.to_le_bytes());
        out[20..24].copy_from_slice(&self.world_size.to_le_bytes());
        out[24..28].copy_from_slice(&self.payload_len.to_le_bytes());
        out
    }

    /// Bytes of the whole frame this header opens: header, payload and MAC.
    #[must_use]
    pub fn frame_len(&self) -> usize {
        HEADER_LEN + self.payload_len as usize + if self.mac { MAC_LEN } else { 0 }
    }
}

/// One frame decoded from a buffer, borrowing its payload and MAC.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Frame<'a> {
    /// The header.
    pub header: Header,
    /// The payload, `header.payload_len` bytes.
    pub payload: &'a [u8],
    /// The MAC, present if and only if `header.mac`. Not checked here: see [`Seal::open`].
    pub mac: Option<&'a [u8; MAC_LEN]>,
}

/// Why bytes could not be decoded as a frame or table.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum WireError {
    /// Fewer bytes than a header needs.
    Truncated {
        /// Bytes needed.
        needed: usize,
        /// Bytes available.
        got: usize,
    },
    /// The frame does not start with [`MAGIC`]: not an rverbs peer.
    BadMagic {
        /// The first four bytes received.
        found: [u8; 4],
    },
    /// A protocol version this crate does not speak.
    UnsupportedVersion {
        /// The version received.
        found: u16,
    },
    /// An unknown frame kind byte.
    UnknownKind {
        /// The kind byte received.
        found: u8,
    },
    /// The flags byte sets a bit this version does not define.
    UnknownFlags {
        /// The flags byte received.
        found: u8,
    },
    /// The payload length exceeds the limit in force.
    PayloadTooLarge {
        /// Announced payload length.
        len: u32,
        /// Limit in force.
        limit: u32,
    },
    /// A payload of these bytes exceeds what a `u32` length can describe.
    PayloadUnencodable {
        /// Payload length.
        len: usize,
    },
    /// A table with no entries (a world has at least one rank).
    TableEmpty,
    /// The table announces more entries than its payload can hold.
    TableCountTooLarge {
        /// Announced entry count.
        count: u32,
        /// Payload bytes left after the count.
        remaining: usize,
    },
    /// An entry header is cut off.
    TableTruncated {
        /// Index of the entry.
        index: u32,
    },
    /// Entries must carry ranks 0, 1, 2, ... in order.
    TableRankOutOfOrder {
        /// Index of the entry.
        index: u32,
        /// Rank the entry carries.
        rank: u32,
    },
    /// An entry's blob exceeds the blob size limit.
    TableEntryTooLarge {
        /// Index of the entry.
        index: u32,
        /// Announced blob length.
        len: u32,
        /// Limit in force.
        limit: usize,
    },
    /// An entry's blob runs past the end of the payload.
    TableEntryTruncated {
        /// Index of the entry.
        index: u32,
        /// Announced blob length.
        len: u32,
        /// Bytes left in the payload.
        remaining: usize,
    },
    /// Bytes remain after the last entry.
    TableTrailingBytes {
        /// Number of extra bytes.
        extra: usize,
    },
    /// A `Challenge` whose payload is not [`CHALLENGE_LEN`] bytes.
    ChallengeLength {
        /// The payload length received.
        len: u32,
    },
    /// An end's first frame on a connection is not its `Challenge`.
    ChallengeExpected {
        /// The kind that came instead.
        found: FrameKind,
    },
    /// A `Challenge` after an end's first frame.
    ChallengeRepeated,
    /// The frame carries no MAC, but this end has a job secret.
    MacMissing,
    /// The frame carries a MAC, but this end has no job secret.
    MacUnexpected,
    /// The MAC does not match: the sender holds another job secret, or the frame
    /// was altered, replayed or sent out of order.
    MacMismatch,
}

impl WireError {
    /// Whether this is a verdict on the frame's MAC (the job secret), not its shape.
    #[must_use]
    pub fn is_auth(&self) -> bool {
        matches!(
            self,
            Self::MacMissing | Self::MacUnexpected | Self::MacMismatch
        )
    }
}

impl fmt::Display for WireError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            Self::Truncated { needed, got } => {
                write!(f, "frame truncated: needed {needed} bytes, got {got}")
            }
            Self::BadMagic { found } => write!(
                f,
                "bad magic {found:02x?} (expected {MAGIC:02x?} \"RVB1\"): not an rverbs-bootstrap peer"
            ),
            Self::UnsupportedVersion { found } => write!(
                f,
                "unsupported protocol version {found} (this build speaks version {VERSION})"
            ),
            Self::UnknownKind { found } => write!(f, "unknown frame kind {found}"),
            Self::UnknownFlags { found } => {
                write!(f, "unknown header flags {found:#04x} (this build knows only {FLAG_MAC:#04x}, the MAC)")
            }
            Self::PayloadTooLarge { len, limit } => {
                write!(f, "payload of {len} bytes exceeds the limit of {limit} bytes")
            }
            Self::PayloadUnencodable { len } => {
                write!(f, "payload of {len} bytes cannot be framed")
            }
            Self::TableEmpty => write!(f, "table has no entries"),
            Self::TableCountTooLarge { count, remaining } => write!(
                f,
                "table announces {count} entries but only {remaining} payload bytes follow"
            ),
            Self::TableTruncated { index } => write!(f, "table entry {index} is cut off"),
            Self::TableRankOutOfOrder { index, rank } => {
                write!(f, "table entry {index} carries rank {rank}, expected {index}")
            }
            Self::TableEntryTooLarge { index, len, limit } => write!(
                f,
                "table entry {index} holds {len} bytes, over the blob limit of {limit}"
            ),
            Self::TableEntryTruncated {
                index,
                len,
                remaining,
            } => write!(
                f,
                "table entry {index} announces {len} bytes but only {remaining} remain"
            ),
            Self::TableTrailingBytes { extra } => {
                write!(f, "{extra} bytes follow the last table entry")
            }
            Self::ChallengeLength { len } => write!(
                f,
                "challenge of {len} bytes, expected {CHALLENGE_LEN}"
            ),
            Self::ChallengeExpected { found } => write!(
                f,
                "expected a Challenge as the first frame, got {found:?} (an rverbs-bootstrap older than protocol version 2?)"
            ),
            Self::ChallengeRepeated => write!(f, "a second Challenge on one connection"),
            Self::MacMissing => write!(f, "frame carries no MAC, but this end has a job secret"),
            Self::MacUnexpected => {
                write!(f, "frame carries a MAC, but this end has no job secret")
            }
            Self::MacMismatch => write!(
                f,
                "MAC mismatch: wrong job secret (or the frame was altered, replayed or reordered)"
            ),
        }
    }
}

impl core::error::Error for WireError {}

/// Decodes a header, accepting payloads up to [`MAX_PAYLOAD`].
///
/// Reads the first [`HEADER_LEN`] bytes of `bytes` and ignores the rest.
///
/// # Errors
/// Any [`WireError`] that describes a header: truncated input, bad magic,
/// unknown version, kind or flags, oversized payload.
pub fn decode_header(bytes: &[u8]) -> Result<Header, WireError> {
    decode_header_with_limit(bytes, MAX_PAYLOAD)
}

/// Decodes a header, accepting payloads up to `payload_limit` bytes (itself
/// capped at [`MAX_PAYLOAD`]).
///
/// # Errors
/// As [`decode_header`], with `payload_limit` as the payload limit.
pub fn decode_header_with_limit(bytes: &[u8], payload_limit: u32) -> Result<Header, WireError> {
    let Some(head) = bytes.get(..HEADER_LEN) else {
        return Err(WireError::Truncated {
            needed: HEADER_LEN,
            got: bytes.len(),
        });
    };
    let magic = [head[0], head[1], head[2], head[3]];
    if magic != MAGIC {
        return Err(WireError::BadMagic { found: magic });
    }
    let version = u16::from_le_bytes([head[4], head[5]]);
    if version != VERSION {
        return Err(WireError::UnsupportedVersion { found: version });
    }
    let kind = FrameKind::from_u8(head[6]).ok_or(WireError::UnknownKind { found: head[6] })?;
    if head[7] & !FLAG_MAC != 0 {
        return Err(WireError::UnknownFlags { found: head[7] });
    }
    let job_id = u64::from_le_bytes([
        head[8], head[9], head[10], head[11], head[12], head[13], head[14], head[15],
    ]);
    let sender = u32::from_le_bytes([head[16], head[17], head[18], head[19]]);
    let world_size = u32::from_le_bytes([head[20], head[21], head[22], head[23]]);
    let payload_len = u32::from_le_bytes([head[24], head[25], head[26], head[27]]);
    let limit = payload_limit.min(MAX_PAYLOAD);
    if payload_len > limit {
        return Err(WireError::PayloadTooLarge {
            len: payload_len,
            limit,
        });
    }
    Ok(Header {
        kind,
        job_id,
        sender,
        world_size,
        payload_len,
        mac: head[7] & FLAG_MAC != 0,
    })
}

/// Decodes the frame at the start of `bytes` (header, payload and MAC, if any),
/// accepting payloads up to `payload_limit` bytes; bytes after it are ignored.
/// The MAC is split off, not checked: [`Seal::open`] does that.
///
/// # Errors
/// As [`decode_header_with_limit`], and [`WireError::Truncated`] if the frame
/// is cut off.
pub fn decode_frame(bytes: &[u8], payload_limit: u32) -> Result<Frame<'_>, WireError> {
    let header = decode_header_with_limit(bytes, payload_limit)?;
    let needed = header.frame_len();
    if bytes.len() < needed {
        return Err(WireError::Truncated {
            needed,
            got: bytes.len(),
        });
    }
    let end = HEADER_LEN + header.payload_len as usize;
    let payload = &bytes[HEADER_LEN..end];
    let mac = if header.mac {
        bytes[end..end + MAC_LEN].try_into().ok()
    } else {
        None
    };
    Ok(Frame {
        header,
        payload,
        mac,
    })
}

/// The header of a frame of `payload` without a MAC.
///
/// # Errors
/// [`WireError::PayloadUnencodable`] if `payload` is longer than [`MAX_PAYLOAD`].
pub fn frame_header(
    kind: FrameKind,
    job_id: u64,
    sender: u32,
    world_size: u32,
    payload: &[u8],
) -> Result<Header, WireError> {
    let payload_len = u32::try_from(payload.len())
        .ok()
        .filter(|len| *len <= MAX_PAYLOAD)
        .ok_or(WireError::PayloadUnencodable { len: payload.len() })?;
    Ok(Header {
        kind,
        job_id,
        sender,
        world_size,
        payload_len,
        mac: false,
    })
}

/// Builds a complete frame without a MAC (header and payload) in one buffer.
/// On a connection, frames go through a [`Seal`], which adds the MAC when
/// there is a job secret and counts the frame.
///
/// # Errors
/// [`WireError::PayloadUnencodable`] if `payload` is longer than [`MAX_PAYLOAD`].
pub fn encode_frame(
    kind: FrameKind,
    job_id: u64,
    sender: u32,
    world_size: u32,
    payload: &[u8],
) -> Result<Vec<u8>, WireError> {
    let header = frame_header(kind, job_id, sender, world_size, payload)?;
    let mut out = Vec::with_capacity(HEADER_LEN + payload.len());
    out.extend_from_slice(&header.encode());
    out.extend_from_slice(payload);
    Ok(out)
}

/// Largest table payload a world of `world_size` ranks with blobs of at most
/// `max_blob` bytes can produce, capped at [`MAX_PAYLOAD`].
#[must_use]
pub fn table_payload_limit(world_size: u32, max_blob: usize) -> u32 {
    let per_entry = (max_blob as u64).saturating_add(TABLE_ENTRY_OVERHEAD as u64);
    let total = (world_size as u64)
        .saturating_mul(per_entry)
        .saturating_add(4);
    u32::try_from(total.min(u64::from(MAX_PAYLOAD))).unwrap_or(MAX_PAYLOAD)
}

/// Encodes a table payload: entry `i` carries rank `i` and `blobs[i]`.
///
/// Layout, little-endian: entry count `u32`, then per entry rank `u32`, blob
/// length `u32`, blob bytes.
///
/// # Errors
/// [`WireError::PayloadUnencodable`] if the table would exceed [`MAX_PAYLOAD`].
pub fn encode_table<B: AsRef<[u8]>>(blobs: &[B]) -> Result<Vec<u8>, WireError> {
    let total = blobs.iter().try_fold(4usize, |acc, blob| {
        acc.checked_add(TABLE_ENTRY_OVERHEAD)?
            .checked_add(blob.as_ref().len())
    });
    let total = total
        .filter(|total| *total <= MAX_PAYLOAD as usize)
        .ok_or(WireError::PayloadUnencodable { len: usize::MAX })?;
    let count =
        u32::try_from(blobs.len()).map_err(|_| WireError::PayloadUnencodable { len: total })?;
    encode_table_with(count, total, |rank, out| {
        out.extend_from_slice(blobs[rank as usize].as_ref());
    })
}

/// Encodes a table payload of `count` entries (the layout of [`encode_table`])
/// without a buffer per entry: `entry(rank, out)` appends entry `rank`'s bytes
/// to `out` and leaves what is there alone. `capacity` is a size hint.
///
/// # Errors
/// [`WireError::PayloadUnencodable`] as soon as the table exceeds [`MAX_PAYLOAD`].
pub fn encode_table_with(
    count: u32,
    capacity: usize,
    mut entry: impl FnMut(u32, &mut Vec<u8>),
) -> Result<Vec<u8>, WireError> {
    let mut out = Vec::with_capacity(capacity.min(MAX_PAYLOAD as usize));
    out.extend_from_slice(&count.to_le_bytes());
    for rank in 0..count {
        out.extend_from_slice(&rank.to_le_bytes());
        let len_at = out.len();
        out.extend_from_slice(&[0; 4]);
        entry(rank, &mut out);
        if out.len() > MAX_PAYLOAD as usize {
            return Err(WireError::PayloadUnencodable { len: out.len() });
        }
        // Fits: the whole table, this entry included, is below MAX_PAYLOAD.
        let len = (out.len() - len_at - 4) as u32;
        out[len_at..len_at + 4].copy_from_slice(&len.to_le_bytes());
    }
    Ok(out)
}

/// Decodes a table payload into blobs indexed by rank.
///
/// Entries must carry ranks `0..count` in order, each blob at most `max_blob`
/// bytes, with no bytes after the last entry. The entry count is checked
/// against the payload size before anything is allocated.
///
/// # Errors
/// The `Table*` variants of [`WireError`].
pub fn decode_table(payload: &[u8], max_blob: usize) -> Result<Vec<Vec<u8>>, WireError> {
    let mut reader = Reader { rest: payload };
    let count = reader.u32().ok_or(WireError::Truncated {
        needed: 4,
        got: payload.len(),
    })?;
    if count == 0 {
        return Err(WireError::TableEmpty);
    }
    let remaining = reader.rest.len();
    if (count as u64).saturating_mul(TABLE_ENTRY_OVERHEAD as u64) > remaining as u64 {
        return Err(WireError::TableCountTooLarge { count, remaining });
    }
    let mut blobs = Vec::with_capacity(count as usize);
    for index in 0..count {
        let (Some(rank), Some(len)) = (reader.u32(), reader.u32()) else {
            return Err(WireError::TableTruncated { index });
        };
        if rank != index {
            return Err(WireError::TableRankOutOfOrder { index, rank });
        }
        if len as usize > max_blob {
            return Err(WireError::TableEntryTooLarge {
                index,
                len,
                limit: max_blob,
            });
        }
        let remaining = reader.rest.len();
        let blob = reader
            .take(len as usize)
            .ok_or(WireError::TableEntryTruncated {
                index,
                len,
                remaining,
            })?;
        blobs.push(blob.to_vec());
    }
    if !reader.rest.is_empty() {
        return Err(WireError::TableTrailingBytes {
            extra: reader.rest.len(),
        });
    }
    Ok(blobs)
}

/// A cursor over untrusted bytes that never reads past the end.
struct Reader<'a> {
    rest: &'a [u8],
}

impl<'a> Reader<'a> {
    fn take(&mut self, len: usize) -> Option<&'a [u8]> {
        if len > self.rest.len() {
            return None;
        }
        let (head, tail) = self.rest.split_at(len);
        self.rest = tail;
        Some(head)
    }

    fn u32(&mut self) -> Option<u32> {
        let bytes = self.take(4)?;
        Some(u32::from_le_bytes([bytes[0], bytes[1], bytes[2], bytes[3]]))
    }
}

/// Text a peer sent (a `Reject`'s or a `Bye`'s reason) made safe to print: lossy UTF-8, at
/// most `max` bytes, control characters (a terminal's escape sequences, line breaks that
/// would forge log lines) replaced. No reason rverbs writes has any.
pub(crate) fn printable(bytes: &[u8], max: usize) -> String {
    let text = String::from_utf8_lossy(&bytes[..bytes.len().min(max)]);
    text.chars()
        .map(|c| if c.is_control() { '?' } else { c })
        .collect()
}

#[cfg(test)]
mod tests;
