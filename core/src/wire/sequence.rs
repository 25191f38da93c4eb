//! The sequence header a datagram publisher puts in front of each payload, so that
//! receivers can count what the unreliable transport lost or reordered.
//!
//! Datagrams (UD, and multicast above all) are not acknowledged or retransmitted: a datagram
//! that meets no posted receive, a full queue or a congested switch is gone, and nothing
//! tells either side. A publisher that numbers its datagrams lets every receiver count the
//! gaps itself ([`crate::datagram::SequenceTracker`]). The header is the first 16 bytes of
//! the payload (after the network header the receiver never sees), version 1,
//! little-endian:
//!
//! | bytes | field    | rule                                                            |
//! |-------|----------|-----------------------------------------------------------------|
//! | 0     | version  | 1                                                               |
//! | 1..4  | reserved | 0                                                               |
//! | 4..8  | stream   | the publisher's stream number: sequences are counted per stream |
//! | 8..16 | sequence | 0 for the first datagram of the stream, then +1 for each        |
//!
//! The application's bytes follow. [`SequenceHeader::decode`] is total (fuzzed): any byte
//! string gives a header and the rest, or an error.

use core::fmt;

/// Encoded length of a [`SequenceHeader`].
pub const SEQUENCE_HEADER_LEN: usize = 16;
const VERSION: u8 = 1;

/// The header of one sequenced datagram.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct SequenceHeader {
    /// The publisher's stream.
    pub stream: u32,
    /// Its position in the stream, from 0.
    pub sequence: u64,
}

/// Why bytes do not start with a sequence header.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum SequenceHeaderError {
    /// Fewer than [`SEQUENCE_HEADER_LEN`] bytes.
    TooShort {
        /// Bytes given.
        got: usize,
    },
    /// A version this build does not speak.
    UnsupportedVersion(u8),
    /// Reserved bytes are not zero.
    NonZeroReserved,
}

impl fmt::Display for SequenceHeaderError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            Self::TooShort { got } => write!(
                f,
                "datagram of {got} bytes is shorter than its {SEQUENCE_HEADER_LEN}-byte sequence header"
            ),
            Self::UnsupportedVersion(v) => write!(f, "sequence header version {v}, expected 1"),
            Self::NonZeroReserved => f.write_str("sequence header reserved bytes are not zero"),
        }
    }
}

impl core::error::Error for SequenceHeaderError {}

impl SequenceHeader {
    /// The header as bytes. Does not allocate.
    pub const fn encode(&self) -> [u8; SEQUENCE_HEADER_LEN] {
        let mut b = [0u8; SEQUENCE_HEADER_LEN];
        b[0] = VERSION;
        let s = self.stream.to_le_bytes();
        let q = self.sequence.to_le_bytes();
        let mut i = 0;
        while i < 4 {
            b[4 + i] = s[i];
            i += 1;
        }
        let mut i = 0;
        while i < 8 {
            b[8 + i] = q[i];
            i += 1;
        }
        b
    }

    /// The header at the start of `bytes`, and the application bytes after it. Does not
    /// allocate.
    pub fn decode(bytes: &[u8]) -> Result<(Self, &[u8]), SequenceHeaderError> {
        let Some((h, rest)) = bytes.split_first_chunk::<SEQUENCE_HEADER_LEN>() else {
            return Err(SequenceHeaderError::TooShort { got: bytes.len() });
        };
        if h[0] != VERSION {
            return Err(SequenceHeaderError::UnsupportedVersion(h[0]));
        }
        if h[1..4] != [0; 3] {
            return Err(SequenceHeaderError::NonZeroReserved);
        }
        let mut s = [0u8; 4];
        s.copy_from_slice(&h[4..8]);
        let mut q = [0u8; 8];
        q.copy_from_slice(&h[8..16]);
        Ok((
            Self {
                stream: u32::from_le_bytes(s),
                sequence: u64::from_le_bytes(q),
            },
            rest,
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip_and_rejections() {
        let h = SequenceHeader {
            stream: 0xdead_beef,
            sequence: 0x0102_0304_0506_0708,
        };
        let mut b = [0u8; 20];
        b[..16].copy_from_slice(&h.encode());
        b[16..].copy_from_slice(b"tail");
        assert_eq!(
            b[..16],
            [1, 0, 0, 0, 0xef, 0xbe, 0xad, 0xde, 8, 7, 6, 5, 4, 3, 2, 1]
        );
        assert_eq!(SequenceHeader::decode(&b), Ok((h, &b"tail"[..])));
        assert_eq!(
            SequenceHeader::decode(&b[..15]),
            Err(SequenceHeaderError::TooShort { got: 15 })
        );
        let mut bad = b;
        bad[0] = 2;
        assert_eq!(
            SequenceHeader::decode(&bad),
            Err(SequenceHeaderError::UnsupportedVersion(2))
        );
        let mut bad = b;
        bad[2] = 1;
        assert_eq!(
            SequenceHeader::decode(&bad),
            Err(SequenceHeaderError::NonZeroReserved)
        );
    }
}
