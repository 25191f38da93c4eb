//! The private data rverbs puts in the RDMA connection manager's connection request and
//! reply ([`crate::cm`]): whether this side offers memory the peer may access, and where.
//!
//! The connection manager carries at most 56 bytes in a request and 196 in a reply, and on
//! InfiniBand and RoCE hands the receiver the full 56 or 196, zero-padded: the decoder reads
//! the first [`CONNECT_DATA_LEN`] bytes and requires every byte after them to be zero.
//!
//! Version 1, 32 bytes, little-endian:
//!
//! | bytes | field    | rule                                                        |
//! |-------|----------|-------------------------------------------------------------|
//! | 0..4  | magic    | `rvcm`: a connection from something that is not rverbs is refused |
//! | 4     | version  | 1                                                           |
//! | 5     | flags    | bit 0: memory offered; others 0                             |
//! | 6..8  | reserved | 0                                                           |
//! | 8..32 | memory   | a remote memory descriptor ([`super::endpoint`]); all zero unless offered |

use core::fmt;

use super::endpoint::{EndpointError, REMOTE_MEMORY_LEN};
use crate::sge::RemoteMemory;

/// Encoded size of [`ConnectData`].
pub const CONNECT_DATA_LEN: usize = 32;
/// Most private data the connection manager carries in a connection request (RC, on
/// InfiniBand and RoCE): what the encoding must fit in.
pub const MAX_REQUEST_PRIVATE_DATA: usize = 56;
const MAGIC: [u8; 4] = *b"rvcm";
const VERSION: u8 = 1;
const FLAG_MEMORY: u8 = 1;

static_assertions::const_assert!(CONNECT_DATA_LEN <= MAX_REQUEST_PRIVATE_DATA);
static_assertions::const_assert_eq!(8 + REMOTE_MEMORY_LEN, CONNECT_DATA_LEN);

/// What one side of an rdmacm connection tells the other when it connects or accepts.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct ConnectData {
    /// Memory this side lets the peer access (RDMA write, read or atomics, as its
    /// registration allows), if any.
    pub memory: Option<RemoteMemory>,
}

/// Why private data is not rverbs' connect data.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum ConnectDataError {
    /// Fewer bytes than the encoding.
    TooShort {
        /// Bytes given.
        got: usize,
    },
    /// Not rverbs' magic: the peer is some other rdmacm program.
    NotRverbs,
    /// A version this build does not speak.
    UnsupportedVersion(u8),
    /// Flag bits this version does not define.
    UnknownFlags(u8),
    /// Reserved or padding bytes are not zero, or a descriptor is present but not offered.
    NonZeroReserved,
    /// The memory descriptor is malformed.
    Memory(EndpointError),
}

impl fmt::Display for ConnectDataError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            Self::TooShort { got } => {
                write!(f, "{got} bytes of private data, need {CONNECT_DATA_LEN}")
            }
            Self::NotRverbs => f.write_str("the private data is not rverbs' (wrong magic)"),
            Self::UnsupportedVersion(v) => write!(f, "unsupported connect data version {v}"),
            Self::UnknownFlags(b) => write!(f, "unknown flag bits {b:#04x}"),
            Self::NonZeroReserved => f.write_str("reserved or padding bytes are not zero"),
            Self::Memory(e) => write!(f, "bad memory descriptor: {e}"),
        }
    }
}

impl core::error::Error for ConnectDataError {}

impl ConnectData {
    /// Encodes the data.
    pub fn encode(&self) -> [u8; CONNECT_DATA_LEN] {
        let mut b = [0u8; CONNECT_DATA_LEN];
        b[0..4].copy_from_slice(&MAGIC);
        b[4] = VERSION;
        if let Some(m) = self.memory {
            b[5] = FLAG_MEMORY;
            b[8..].copy_from_slice(&m.encode());
        }
        b
    }

    /// Decodes and validates private data as the connection manager delivered it (the
    /// encoding, then only zero bytes). Never panics.
    pub fn decode(b: &[u8]) -> Result<Self, ConnectDataError> {
        if b.len() < CONNECT_DATA_LEN {
            return Err(ConnectDataError::TooShort { got: b.len() });
        }
        let (b, padding) = b.split_at(CONNECT_DATA_LEN);
        if b[0..4] != MAGIC {
            return Err(ConnectDataError::NotRverbs);
        }
        if b[4] != VERSION {
            return Err(ConnectDataError::UnsupportedVersion(b[4]));
        }
        if b[5] & !FLAG_MEMORY != 0 {
            return Err(ConnectDataError::UnknownFlags(b[5]));
        }
        if b[6..8] != [0, 0] || padding.iter().any(|&x| x != 0) {
            return Err(ConnectDataError::NonZeroReserved);
        }
        let memory = if b[5] & FLAG_MEMORY != 0 {
            Some(RemoteMemory::decode(&b[8..]).map_err(ConnectDataError::Memory)?)
        } else if b[8..].iter().any(|&x| x != 0) {
            return Err(ConnectDataError::NonZeroReserved);
        } else {
            None
        };
        Ok(Self { memory })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MEM: RemoteMemory = RemoteMemory {
        addr: 0x7f12_3456_7000,
        len: 1 << 20,
        rkey: 0xbeef,
    };

    #[test]
    fn round_trip_with_and_without_memory_and_with_padding() {
        for d in [ConnectData { memory: Some(MEM) }, ConnectData::default()] {
            let b = d.encode();
            assert_eq!(ConnectData::decode(&b), Ok(d));
            // As the connection manager delivers a request: zero-padded to 56 bytes.
            let mut padded = [0u8; MAX_REQUEST_PRIVATE_DATA];
            padded[..CONNECT_DATA_LEN].copy_from_slice(&b);
            assert_eq!(ConnectData::decode(&padded), Ok(d));
        }
    }

    #[test]
    fn rejects_each_bad_field() {
        let good = ConnectData { memory: Some(MEM) }.encode();
        let bad = |i: usize, v: u8| {
            let mut b = [0u8; 40];
            b[..CONNECT_DATA_LEN].copy_from_slice(&good);
            b[i] = v;
            ConnectData::decode(&b)
        };
        assert_eq!(bad(0, b'x'), Err(ConnectDataError::NotRverbs));
        assert_eq!(bad(4, 2), Err(ConnectDataError::UnsupportedVersion(2)));
        assert_eq!(bad(5, 3), Err(ConnectDataError::UnknownFlags(3)));
        assert_eq!(bad(7, 1), Err(ConnectDataError::NonZeroReserved));
        assert_eq!(bad(39, 1), Err(ConnectDataError::NonZeroReserved));
        assert_eq!(
            bad(31, 1),
            Err(ConnectDataError::Memory(EndpointError::NonZeroReserved))
        );
        // Offered memory that wraps around the address space.
        let wrap = ConnectData {
            memory: Some(RemoteMemory {
                addr: u64::MAX,
                len: 2,
                rkey: 1,
            }),
        };
        assert_eq!(
            ConnectData::decode(&wrap.encode()),
            Err(ConnectDataError::Memory(EndpointError::RangeOverflow))
        );
        // A descriptor that is not offered must be absent.
        let mut b = ConnectData::default().encode();
        b[9] = 1;
        assert_eq!(
            ConnectData::decode(&b),
            Err(ConnectDataError::NonZeroReserved)
        );
        assert_eq!(
            ConnectData::decode(&good[..31]),
            Err(ConnectDataError::TooShort { got: 31 })
        );
    }
}
