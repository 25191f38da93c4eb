//! The bootstrap frame format.
//!
//! Every frame is a fixed 28-byte little-endian header followed by a payload:
//!
//! | offset | size | field                                         |
//! |-------:|-----:|-----------------------------------------------|
//! | 0      | 4    | magic, the bytes `RVB1`                       |
//! | 4      | 2    | version, `u16`, currently 1                   |
//! | 6      | 1    | kind, see [`FrameKind`]                       |
//! | 7      | 1    | reserved, must be 0                           |
//! | 8      | 8    | job id, `u64`                                 |
//! | 16     | 4    | sender rank, `u32`                            |
//! | 20     | 4    | world size, `u32`                             |
//! | 24     | 4    | payload length in bytes, `u32`                |
//!
//! Payloads by kind: `Hello` and `Sync` carry the sender's opaque bytes; `Reject`
//! carries a UTF-8 reason (at most [`REJECT_REASON_MAX`] bytes); `Table` carries
//! the table layout described at [`encode_table`]: one entry per rank, rank `i`'s
//! blob in entry `i`, or, when the exchange is personalized (see
//! [`Personalize`](crate::exchange::Personalize)), the part of rank `i`'s blob
//! meant for the receiver, with the receiver's own entry empty.
//!
//! The decoders are total: they return a [`WireError`] for every malformed input
//! and never panic, and they check every length against a limit before
//! allocating, so they are safe to run on bytes from any socket (and from a fuzzer).

use core::fmt;

/// The four magic bytes that open every frame.
pub const MAGIC: [u8; 4] = *b"RVB1";
/// The only protocol version this crate speaks.
pub const VERSION: u16 = 1;
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
    /// A rank closes its session on purpose (no payload): the connection closing after it is
    /// a goodbye, not a failure.
    Bye,
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
            Self::Bye => 5,
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
            5 => Some(Self::Bye),
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
}

impl Header {
    /// Encodes the header into its fixed 28-byte form.
    #[must_use]
    pub fn encode(&self) -> [u8; HEADER_LEN] {
        let mut out = [0u8; HEADER_LEN];
        out[0..4].copy_from_slice(&MAGIC);
        out[4..6].copy_from_slice(&VERSION.to_le_bytes());
        out[6] = self.kind.to_u8();
        out[7] = 0;
        out[8..16].copy_from_slice(&self.job_id.to_le_bytes());
        out[16..20].copy_from_slice(&self.sender.to_le_bytes());
        out[20..24].copy_from_slice(&self.world_size.to_le_bytes());
        out[24..28].copy_from_slice(&self.payload_len.to_le_bytes());
        out
    }
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
    /// The reserved byte is not zero.
    ReservedNonzero {
        /// The reserved byte received.
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
            Self::ReservedNonzero { found } => {
                write!(f, "reserved header byte is {found}, expected 0")
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
/// unknown version or kind, nonzero reserved byte, oversized payload.
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
    if head[7] != 0 {
        return Err(WireError::ReservedNonzero { found: head[7] });
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
    })
}

/// Builds a complete frame (header and payload) in one buffer.
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
    let payload_len = u32::try_from(payload.len())
        .ok()
        .filter(|len| *len <= MAX_PAYLOAD)
        .ok_or(WireError::PayloadUnencodable { len: payload.len() })?;
    let header = Header {
        kind,
        job_id,
        sender,
        world_size,
        payload_len,
    };
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

#[cfg(test)]
mod tests;
