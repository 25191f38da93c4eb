//! The endpoint of one RC queue pair, and remote memory descriptors.
//!
//! Endpoint, version 1, 32 bytes, little-endian:
//!
//! | bytes  | field    | rule                                                   |
//! |--------|----------|--------------------------------------------------------|
//! | 0      | version  | 1                                                      |
//! | 1      | flags    | bit 0: route by GID (RoCE, or IB across subnets); others 0 |
//! | 2..4   | lid      | non-zero unless routed by GID                          |
//! | 4..8   | qpn      | < 2^24                                                 |
//! | 8..12  | psn      | < 2^24                                                 |
//! | 12     | mtu      | path MTU code 1..=5 the sender can use                 |
//! | 13..16 | reserved | 0                                                      |
//! | 16..32 | gid      | non-zero when routed by GID                            |
//!
//! Remote memory, 24 bytes: address u64, length u64, rkey u32, reserved u32 (0); the range
//! must not wrap around the address space.

use core::fmt;

use crate::params::{Mtu, Psn};
use crate::sge::RemoteMemory;

/// Encoded size of an [`Endpoint`].
pub const ENDPOINT_LEN: usize = 32;
/// Encoded size of a [`RemoteMemory`].
pub const REMOTE_MEMORY_LEN: usize = 24;
const VERSION: u8 = 1;
const FLAG_GLOBAL: u8 = 1;

/// What a peer needs to connect an RC queue pair to ours.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Endpoint {
    /// Queue pair number.
    pub qpn: u32,
    /// First packet sequence number we will send.
    pub psn: Psn,
    /// Local identifier (InfiniBand).
    pub lid: u16,
    /// Global identifier (RoCE; InfiniBand across subnets).
    pub gid: [u8; 16],
    /// Whether to route by GID.
    pub global: bool,
    /// The largest path MTU our port supports now.
    pub mtu: Mtu,
}

/// Why bytes are not a valid endpoint or memory descriptor.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum EndpointError {
    /// Not the encoded length.
    WrongLength {
        /// Expected length.
        expected: usize,
        /// Length given.
        got: usize,
    },
    /// A version this build does not speak.
    UnsupportedVersion(u8),
    /// Flag bits this version does not define.
    UnknownFlags(u8),
    /// Reserved bytes are not zero.
    NonZeroReserved,
    /// The QP number does not fit in 24 bits.
    QpnOutOfRange(u32),
    /// The PSN does not fit in 24 bits.
    PsnOutOfRange(u32),
    /// Not a path MTU code.
    BadMtu(u8),
    /// Neither a LID nor a GID to route by.
    NoRoute,
    /// A memory range that wraps around the address space.
    RangeOverflow,
}

impl fmt::Display for EndpointError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            Self::WrongLength { expected, got } => {
                write!(f, "expected {expected} bytes, got {got}")
            }
            Self::UnsupportedVersion(v) => write!(f, "unsupported endpoint version {v}"),
            Self::UnknownFlags(b) => write!(f, "unknown flag bits {b:#04x}"),
            Self::NonZeroReserved => f.write_str("reserved bytes are not zero"),
            Self::QpnOutOfRange(q) => write!(f, "QP number {q:#x} does not fit in 24 bits"),
            Self::PsnOutOfRange(p) => write!(f, "PSN {p:#x} does not fit in 24 bits"),
            Self::BadMtu(m) => write!(f, "{m} is not a path MTU code (1..=5)"),
            Self::NoRoute => f.write_str("neither a LID nor a GID to route by"),
            Self::RangeOverflow => f.write_str("memory range wraps around the address space"),
        }
    }
}

impl core::error::Error for EndpointError {}

/// Checks what an RC and a datagram endpoint lay out alike (each format with its own
/// version): the version in byte 0, byte 1 holding no flag but `known`, the reserved bytes
/// 13..16 zero. Returns the flags. `b` is a whole endpoint: the caller checked its length, so the
/// indexing cannot panic.
pub(super) fn check_header(b: &[u8], version: u8, known: u8) -> Result<u8, EndpointError> {
    if b[0] != version {
        return Err(EndpointError::UnsupportedVersion(b[0]));
    }
    let flags = b[1];
    if flags & !known != 0 {
        return Err(EndpointError::UnknownFlags(flags));
    }
    if b[13..16] != [0, 0, 0] {
        return Err(EndpointError::NonZeroReserved);
    }
    Ok(flags)
}

fn u32_at(b: &[u8], at: usize) -> u32 {
    let mut x = [0u8; 4];
    x.copy_from_slice(&b[at..at + 4]);
    u32::from_le_bytes(x)
}

fn u64_at(b: &[u8], at: usize) -> u64 {
    let mut x = [0u8; 8];
    x.copy_from_slice(&b[at..at + 8]);
    u64::from_le_bytes(x)
}

impl Endpoint {
    /// Encodes the endpoint.
    pub fn encode(&self) -> [u8; ENDPOINT_LEN] {
        let mut b = [0u8; ENDPOINT_LEN];
        b[0] = VERSION;
        b[1] = if self.global { FLAG_GLOBAL } else { 0 };
        b[2..4].copy_from_slice(&self.lid.to_le_bytes());
        b[4..8].copy_from_slice(&self.qpn.to_le_bytes());
        b[8..12].copy_from_slice(&self.psn.get().to_le_bytes());
        b[12] = self.mtu.code();
        b[16..32].copy_from_slice(&self.gid);
        b
    }

    /// Decodes and validates an endpoint. Never panics.
    pub fn decode(b: &[u8]) -> Result<Self, EndpointError> {
        if b.len() != ENDPOINT_LEN {
            return Err(EndpointError::WrongLength {
                expected: ENDPOINT_LEN,
                got: b.len(),
            });
        }
        let global = check_header(b, VERSION, FLAG_GLOBAL)? & FLAG_GLOBAL != 0;
        let lid = u16::from_le_bytes([b[2], b[3]]);
        let qpn = u32_at(b, 4);
        if qpn >= 1 << 24 {
            return Err(EndpointError::QpnOutOfRange(qpn));
        }
        let psn_raw = u32_at(b, 8);
        let psn = Psn::new(psn_raw).ok_or(EndpointError::PsnOutOfRange(psn_raw))?;
        let mtu = Mtu::from_code(b[12]).ok_or(EndpointError::BadMtu(b[12]))?;
        let mut gid = [0u8; 16];
        gid.copy_from_slice(&b[16..32]);
        if (global && gid == [0; 16]) || (!global && lid == 0) {
            return Err(EndpointError::NoRoute);
        }
        Ok(Self {
            qpn,
            psn,
            lid,
            gid,
            global,
            mtu,
        })
    }
}

impl RemoteMemory {
    /// Encodes the descriptor.
    pub fn encode(&self) -> [u8; REMOTE_MEMORY_LEN] {
        let mut b = [0u8; REMOTE_MEMORY_LEN];
        b[0..8].copy_from_slice(&self.addr.to_le_bytes());
        b[8..16].copy_from_slice(&self.len.to_le_bytes());
        b[16..20].copy_from_slice(&self.rkey.to_le_bytes());
        b
    }

    /// Decodes and validates a descriptor. Never panics.
    pub fn decode(b: &[u8]) -> Result<Self, EndpointError> {
        if b.len() != REMOTE_MEMORY_LEN {
            return Err(EndpointError::WrongLength {
                expected: REMOTE_MEMORY_LEN,
                got: b.len(),
            });
        }
        if b[20..24] != [0; 4] {
            return Err(EndpointError::NonZeroReserved);
        }
        let addr = u64_at(b, 0);
        let len = u64_at(b, 8);
        if addr.checked_add(len).is_none() {
            return Err(EndpointError::RangeOverflow);
        }
        Ok(Self {
            addr,
            len,
            rkey: u32_at(b, 16),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> Endpoint {
        Endpoint {
            qpn: 0x12_3456,
            psn: Psn::new(0xab_cdef).unwrap(),
            lid: 0,
            gid: [0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 192, 168, 77, 1],
            global: true,
            mtu: Mtu::B1024,
        }
    }

    #[test]
    fn roce_and_ib_endpoints_decode_to_what_was_encoded() {
        let e = sample();
        assert_eq!(Endpoint::decode(&e.encode()), Ok(e));
        let ib = Endpoint {
            lid: 7,
            global: false,
            gid: [0; 16],
            ..e
        };
        assert_eq!(Endpoint::decode(&ib.encode()), Ok(ib));
    }

    #[test]
    fn rejects_each_bad_field() {
        let good = sample().encode();
        let bad = |i: usize, v: u8| {
            let mut b = good;
            b[i] = v;
            Endpoint::decode(&b)
        };
        assert_eq!(bad(0, 2), Err(EndpointError::UnsupportedVersion(2)));
        assert_eq!(bad(1, 3), Err(EndpointError::UnknownFlags(3)));
        assert_eq!(bad(7, 1), Err(EndpointError::QpnOutOfRange(0x0112_3456)));
        assert!(matches!(bad(11, 1), Err(EndpointError::PsnOutOfRange(_))));
        assert_eq!(bad(12, 0), Err(EndpointError::BadMtu(0)));
        assert_eq!(bad(12, 6), Err(EndpointError::BadMtu(6)));
        assert_eq!(bad(14, 1), Err(EndpointError::NonZeroReserved));
        assert_eq!(bad(1, 0), Err(EndpointError::NoRoute)); // LID routing with LID 0
        assert_eq!(
            Endpoint::decode(&good[..31]),
            Err(EndpointError::WrongLength {
                expected: 32,
                got: 31
            })
        );
    }

    #[test]
    fn remote_memory_round_trip_and_rejects() {
        let r = RemoteMemory {
            addr: 0x7f00_0000_1000,
            len: 4096,
            rkey: 0xdead,
        };
        assert_eq!(RemoteMemory::decode(&r.encode()), Ok(r));
        let mut b = r.encode();
        b[23] = 1;
        assert_eq!(
            RemoteMemory::decode(&b),
            Err(EndpointError::NonZeroReserved)
        );
        let wrap = RemoteMemory {
            addr: u64::MAX,
            len: 2,
            rkey: 1,
        };
        assert_eq!(
            RemoteMemory::decode(&wrap.encode()),
            Err(EndpointError::RangeOverflow)
        );
    }
}
