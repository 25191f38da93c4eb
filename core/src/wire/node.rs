//! What one rank of a [`Node`](crate::node::Node) publishes to all others.
//!
//! Version 1, little-endian:
//!
//! | bytes          | field                                                        |
//! |----------------|--------------------------------------------------------------|
//! | 0..4           | magic `b"RVN1"`                                               |
//! | 4..8           | rank `u32`                                                   |
//! | 8..12          | world size `u32` (1..=[`MAX_WORLD`])                         |
//! | 12..16         | window length `u32` is not here; reserved, 0                 |
//! | 16..16+32w     | one [`Endpoint`] per rank: the QP this rank connects to that rank; all zero for itself |
//! | then 24        | the flag array ([`RemoteMemory`], `8 * world` bytes long)    |
//! | then 24        | the data window ([`RemoteMemory`])                           |

use core::fmt;

use super::endpoint::{Endpoint, EndpointError, ENDPOINT_LEN, REMOTE_MEMORY_LEN};
use crate::sge::RemoteMemory;

/// Largest world a node blob describes.
pub const MAX_WORLD: u32 = 4096;
const MAGIC: [u8; 4] = *b"RVN1";
const HEADER: usize = 16;

/// Encoded length of a node blob for a world of `world` ranks.
pub const fn node_blob_len(world: u32) -> usize {
    HEADER + ENDPOINT_LEN * world as usize + 2 * REMOTE_MEMORY_LEN
}

/// Why bytes are not a valid node blob.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum NodeBlobError {
    /// Too short, too long, or not the length its world size implies.
    WrongLength {
        /// Expected length (0 if the header itself is cut).
        expected: usize,
        /// Length given.
        got: usize,
    },
    /// Not a node blob (magic) or another version.
    BadMagic,
    /// Reserved bytes are not zero.
    NonZeroReserved,
    /// World size 0 or above [`MAX_WORLD`].
    BadWorld(u32),
    /// The rank is not below the world size, or not the rank expected.
    BadRank(u32),
    /// The world size differs from ours.
    WorldMismatch {
        /// Ours.
        expected: u32,
        /// Theirs.
        got: u32,
    },
    /// The slot for the sender itself is not all zero.
    SelfSlotNotEmpty,
    /// An endpoint is malformed.
    Endpoint {
        /// Whose slot.
        slot: u32,
        /// Why.
        error: EndpointError,
    },
    /// The flag array does not hold one slot per rank.
    FlagsTooSmall,
}

impl fmt::Display for NodeBlobError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            Self::WrongLength { expected, got } => {
                write!(f, "node blob of {got} bytes, expected {expected}")
            }
            Self::BadMagic => f.write_str("not an rverbs node blob (magic/version)"),
            Self::NonZeroReserved => f.write_str("reserved bytes are not zero"),
            Self::BadWorld(w) => write!(f, "world size {w} is out of range"),
            Self::BadRank(r) => write!(f, "unexpected rank {r}"),
            Self::WorldMismatch { expected, got } => {
                write!(f, "world size {got}, expected {expected}")
            }
            Self::SelfSlotNotEmpty => f.write_str("the sender's own endpoint slot is not empty"),
            Self::Endpoint { slot, error } => write!(f, "endpoint for rank {slot}: {error}"),
            Self::FlagsTooSmall => f.write_str("flag array smaller than 8 bytes per rank"),
        }
    }
}

impl core::error::Error for NodeBlobError {}

/// A decoded, validated node blob.
#[derive(Clone, Copy, Debug)]
pub struct NodeBlob<'a> {
    bytes: &'a [u8],
    /// The sender's rank.
    pub rank: u32,
    /// The world size.
    pub world: u32,
    /// The sender's flag array.
    pub flags: RemoteMemory,
    /// The sender's data window.
    pub window: RemoteMemory,
}

impl<'a> NodeBlob<'a> {
    /// Encodes into `out` (exactly [`node_blob_len`] bytes). `endpoint(r)` gives the endpoint
    /// for rank `r` (ignored for `rank` itself).
    pub fn encode_into(
        out: &mut [u8],
        rank: u32,
        world: u32,
        mut endpoint: impl FnMut(u32) -> Endpoint,
        flags: RemoteMemory,
        window: RemoteMemory,
    ) -> Result<(), NodeBlobError> {
        if world == 0 || world > MAX_WORLD {
            return Err(NodeBlobError::BadWorld(world));
        }
        if rank >= world {
            return Err(NodeBlobError::BadRank(rank));
        }
        let need = node_blob_len(world);
        if out.len() != need {
            return Err(NodeBlobError::WrongLength {
                expected: need,
                got: out.len(),
            });
        }
        out.fill(0);
        out[0..4].copy_from_slice(&MAGIC);
        out[4..8].copy_from_slice(&rank.to_le_bytes());
        out[8..12].copy_from_slice(&world.to_le_bytes());
        for r in 0..world {
            if r != rank {
                let at = HEADER + ENDPOINT_LEN * r as usize;
                out[at..at + ENDPOINT_LEN].copy_from_slice(&endpoint(r).encode());
            }
        }
        let at = HEADER + ENDPOINT_LEN * world as usize;
        out[at..at + REMOTE_MEMORY_LEN].copy_from_slice(&flags.encode());
        out[at + REMOTE_MEMORY_LEN..].copy_from_slice(&window.encode());
        Ok(())
    }

    /// Decodes and validates a blob. Never panics.
    pub fn decode(b: &'a [u8]) -> Result<Self, NodeBlobError> {
        if b.len() < HEADER {
            return Err(NodeBlobError::WrongLength {
                expected: 0,
                got: b.len(),
            });
        }
        if b[0..4] != MAGIC {
            return Err(NodeBlobError::BadMagic);
        }
        if b[12..16] != [0; 4] {
            return Err(NodeBlobError::NonZeroReserved);
        }
        let rank = u32::from_le_bytes([b[4], b[5], b[6], b[7]]);
        let world = u32::from_le_bytes([b[8], b[9], b[10], b[11]]);
        if world == 0 || world > MAX_WORLD {
            return Err(NodeBlobError::BadWorld(world));
        }
        if rank >= world {
            return Err(NodeBlobError::BadRank(rank));
        }
        let need = node_blob_len(world);
        if b.len() != need {
            return Err(NodeBlobError::WrongLength {
                expected: need,
                got: b.len(),
            });
        }
        for r in 0..world {
            let at = HEADER + ENDPOINT_LEN * r as usize;
            let slot = &b[at..at + ENDPOINT_LEN];
            if r == rank {
                if slot.iter().any(|&x| x != 0) {
                    return Err(NodeBlobError::SelfSlotNotEmpty);
                }
            } else {
                Endpoint::decode(slot)
                    .map_err(|error| NodeBlobError::Endpoint { slot: r, error })?;
            }
        }
        let at = HEADER + ENDPOINT_LEN * world as usize;
        let map = |error| NodeBlobError::Endpoint { slot: rank, error };
        let flags = RemoteMemory::decode(&b[at..at + REMOTE_MEMORY_LEN]).map_err(map)?;
        let window = RemoteMemory::decode(&b[at + REMOTE_MEMORY_LEN..]).map_err(map)?;
        if flags.len < 8 * u64::from(world) {
            return Err(NodeBlobError::FlagsTooSmall);
        }
        Ok(Self {
            bytes: b,
            rank,
            world,
            flags,
            window,
        })
    }

    /// The endpoint the sender prepared for `rank`, `None` for the sender itself or out of
    /// range.
    pub fn endpoint_for(&self, rank: u32) -> Option<Endpoint> {
        if rank == self.rank || rank >= self.world {
            return None;
        }
        let at = HEADER + ENDPOINT_LEN * rank as usize;
        Endpoint::decode(&self.bytes[at..at + ENDPOINT_LEN]).ok()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::params::{Mtu, Psn};

    fn ep(r: u32) -> Endpoint {
        Endpoint {
            qpn: 100 + r,
            psn: Psn::new(r).unwrap(),
            lid: 0,
            gid: [1; 16],
            global: true,
            mtu: Mtu::B1024,
        }
    }

    #[test]
    fn round_trip_and_rejects() {
        let world = 3;
        let mut b = [0u8; node_blob_len(3)];
        let flags = RemoteMemory {
            addr: 4096,
            len: 24,
            rkey: 5,
        };
        let window = RemoteMemory {
            addr: 8192,
            len: 100,
            rkey: 6,
        };
        NodeBlob::encode_into(&mut b, 1, world, ep, flags, window).unwrap();
        let d = NodeBlob::decode(&b).unwrap();
        assert_eq!((d.rank, d.world, d.flags, d.window), (1, 3, flags, window));
        assert_eq!(d.endpoint_for(0), Some(ep(0)));
        assert_eq!(d.endpoint_for(2), Some(ep(2)));
        assert_eq!(d.endpoint_for(1), None);
        let mut bad = b;
        bad[0] = b'X';
        assert_eq!(NodeBlob::decode(&bad).unwrap_err(), NodeBlobError::BadMagic);
        let mut bad = b;
        bad[4] = 3;
        assert_eq!(
            NodeBlob::decode(&bad).unwrap_err(),
            NodeBlobError::BadRank(3)
        );
        let mut bad = b;
        bad[16] = 9; // rank 0's slot: an unknown endpoint version
        assert!(matches!(
            NodeBlob::decode(&bad),
            Err(NodeBlobError::Endpoint { slot: 0, .. })
        ));
        let mut bad = b;
        bad[16 + 32 + 5] = 1; // the sender's own slot
        assert_eq!(
            NodeBlob::decode(&bad).unwrap_err(),
            NodeBlobError::SelfSlotNotEmpty
        );
        assert!(matches!(
            NodeBlob::decode(&b[..50]),
            Err(NodeBlobError::WrongLength { .. })
        ));
        let small = RemoteMemory { len: 16, ..flags };
        NodeBlob::encode_into(&mut b, 1, world, ep, small, window).unwrap();
        assert_eq!(
            NodeBlob::decode(&b).unwrap_err(),
            NodeBlobError::FlagsTooSmall
        );
    }
}
