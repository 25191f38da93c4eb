//! What a rank puts into the PMIx key-value store: a versioned envelope around the bytes.
//!
//! The key never changes between versions (`rverbs.node` for the exchange, `rverbs.oob.<n>`
//! for the `n`-th later round), so a rank of another version still finds the value and can
//! say which version it holds, instead of waiting for a key that never comes.
//!
//! | bytes | field                                              |
//! |-------|----------------------------------------------------|
//! | 0..4  | magic `b"RVPX"`                                    |
//! | 4..6  | protocol version `u16`, little-endian ([`PROTOCOL_VERSION`]) |
//! | 6..8  | reserved, 0                                        |
//! | 8..   | the payload (a node blob, or an all-gather contribution) |

use core::fmt;

/// The version of the PMIx rendezvous: key names, this envelope, the order of rounds.
/// Ranks of one job must agree; a rank that finds another version names it.
pub const PROTOCOL_VERSION: u16 = 1;

const MAGIC: [u8; 4] = *b"RVPX";
/// Length of the envelope before the payload.
pub(crate) const HEADER_LEN: usize = 8;

/// Why a value read from PMIx is not this version's envelope.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum EnvelopeError {
    /// Shorter than the envelope, wrong magic, or non-zero reserved bytes.
    NotOurs,
    /// An rverbs envelope of another protocol version.
    Version(u16),
}

impl fmt::Display for EnvelopeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::NotOurs => write!(f, "not an rverbs PMIx value"),
            Self::Version(v) => write!(
                f,
                "rverbs PMIx protocol version {v}, this rank speaks {PROTOCOL_VERSION}"
            ),
        }
    }
}

/// `payload` in an envelope of `version` (always [`PROTOCOL_VERSION`] outside tests of the
/// version check).
pub(crate) fn wrap(version: u16, payload: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(HEADER_LEN + payload.len());
    out.extend_from_slice(&MAGIC);
    out.extend_from_slice(&version.to_le_bytes());
    out.extend_from_slice(&[0, 0]);
    out.extend_from_slice(payload);
    out
}

/// The payload of an envelope of this version.
pub(crate) fn unwrap(value: &[u8]) -> Result<&[u8], EnvelopeError> {
    let (header, payload) = value
        .split_at_checked(HEADER_LEN)
        .ok_or(EnvelopeError::NotOurs)?;
    if header[..4] != MAGIC || header[6..8] != [0, 0] {
        return Err(EnvelopeError::NotOurs);
    }
    let version = u16::from_le_bytes([header[4], header[5]]);
    if version != PROTOCOL_VERSION {
        return Err(EnvelopeError::Version(version));
    }
    Ok(payload)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip_and_layout() {
        let v = wrap(PROTOCOL_VERSION, b"blob");
        assert_eq!(&v[..8], b"RVPX\x01\x00\x00\x00");
        assert_eq!(unwrap(&v), Ok(&b"blob"[..]));
        assert_eq!(unwrap(&wrap(PROTOCOL_VERSION, b"")), Ok(&b""[..]));
    }

    #[test]
    fn another_version_is_named() {
        let v = wrap(7, b"blob");
        assert_eq!(unwrap(&v), Err(EnvelopeError::Version(7)));
        assert!(EnvelopeError::Version(7).to_string().contains("version 7"));
    }

    #[test]
    fn foreign_bytes_are_refused() {
        assert_eq!(unwrap(b"RVPX\x01\x00"), Err(EnvelopeError::NotOurs));
        assert_eq!(
            unwrap(b"RVN1\x01\x00\x00\x00xx"),
            Err(EnvelopeError::NotOurs)
        );
        assert_eq!(unwrap(b"RVPX\x01\x00\x01\x00"), Err(EnvelopeError::NotOurs));
        // Every prefix of a valid value is refused or decodes to a prefix of the payload.
        let v = wrap(PROTOCOL_VERSION, b"abc");
        for cut in 0..v.len() {
            match unwrap(&v[..cut]) {
                Err(EnvelopeError::NotOurs) => assert!(cut < HEADER_LEN),
                Ok(p) => assert_eq!(p, &b"abc"[..cut - HEADER_LEN]),
                Err(e) => panic!("{e}"),
            }
        }
    }
}
