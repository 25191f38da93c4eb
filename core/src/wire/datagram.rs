//! The address of one datagram endpoint: what a peer needs to send to it.
//!
//! Datagram endpoint, version 1, 32 bytes, little-endian:
//!
//! | bytes  | field    | rule                                                   |
//! |--------|----------|--------------------------------------------------------|
//! | 0      | version  | 1                                                      |
//! | 1      | flags    | bit 0: route by GID (RoCE, or IB across subnets); others 0 |
//! | 2..4   | lid      | non-zero unless routed by GID                          |
//! | 4..8   | qpn      | < 2^24, and not `0xFF_FFFF` (the multicast number)     |
//! | 8..12  | qkey     | high bit clear (controlled Q_Keys are not for peers)   |
//! | 12     | mtu      | MTU code 1..=5: the largest payload it receives        |
//! | 13..16 | reserved | 0                                                      |
//! | 16..32 | gid      | non-zero when routed by GID                            |

use crate::gid::Gid;
use crate::params::Mtu;

use super::endpoint::check_header;
pub use super::endpoint::EndpointError;

/// Encoded size of a [`DatagramEndpoint`].
pub const DATAGRAM_ENDPOINT_LEN: usize = 32;
const VERSION: u8 = 1;
const FLAG_GLOBAL: u8 = 1;

/// What a peer needs to send datagrams to one endpoint.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct DatagramEndpoint {
    /// The port's GID (RoCE; InfiniBand across subnets).
    pub gid: Gid,
    /// Whether to route by GID.
    pub global: bool,
    /// The port's LID (InfiniBand).
    pub lid: u16,
    /// The queue pair number.
    pub qpn: u32,
    /// The Q_Key its datagrams must carry.
    pub qkey: u32,
    /// The largest payload it takes.
    pub mtu: Mtu,
}

impl DatagramEndpoint {
    /// Encodes the endpoint. Does not allocate.
    pub fn encode(&self) -> [u8; DATAGRAM_ENDPOINT_LEN] {
        let mut b = [0u8; DATAGRAM_ENDPOINT_LEN];
        b[0] = VERSION;
        b[1] = if self.global { FLAG_GLOBAL } else { 0 };
        b[2..4].copy_from_slice(&self.lid.to_le_bytes());
        b[4..8].copy_from_slice(&self.qpn.to_le_bytes());
        b[8..12].copy_from_slice(&self.qkey.to_le_bytes());
        b[12] = self.mtu.code();
        b[16..32].copy_from_slice(&self.gid.0);
        b
    }

    /// Decodes and validates an endpoint. Never panics. (A Q_Key with the high bit set is
    /// [`EndpointError::UnknownFlags`] with the Q_Key's top byte.)
    pub fn decode(b: &[u8]) -> Result<Self, EndpointError> {
        let Ok(b) = <&[u8; DATAGRAM_ENDPOINT_LEN]>::try_from(b) else {
            return Err(EndpointError::WrongLength {
                expected: DATAGRAM_ENDPOINT_LEN,
                got: b.len(),
            });
        };
        let global = check_header(b, VERSION, FLAG_GLOBAL)? & FLAG_GLOBAL != 0;
        let lid = u16::from_le_bytes([b[2], b[3]]);
        let qpn = u32::from_le_bytes([b[4], b[5], b[6], b[7]]);
        if qpn >= 0x00ff_ffff {
            return Err(EndpointError::QpnOutOfRange(qpn));
        }
        let qkey = u32::from_le_bytes([b[8], b[9], b[10], b[11]]);
        if qkey & 0x8000_0000 != 0 {
            return Err(EndpointError::UnknownFlags(b[11]));
        }
        let mtu = Mtu::from_code(b[12]).ok_or(EndpointError::BadMtu(b[12]))?;
        let mut gid = [0u8; 16];
        gid.copy_from_slice(&b[16..32]);
        let gid = Gid(gid);
        if (global && gid.is_zero()) || (!global && lid == 0) {
            return Err(EndpointError::NoRoute);
        }
        Ok(Self {
            gid,
            global,
            lid,
            qpn,
            qkey,
            mtu,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> DatagramEndpoint {
        DatagramEndpoint {
            gid: Gid::from_ipv4([192, 168, 77, 1]),
            global: true,
            lid: 0,
            qpn: 0x12_3456,
            qkey: 0x0123_4567,
            mtu: Mtu::B1024,
        }
    }

    #[test]
    fn round_trip_and_rejections() {
        let e = sample();
        assert_eq!(DatagramEndpoint::decode(&e.encode()), Ok(e));
        let good = e.encode();
        let bad = |i: usize, v: u8| {
            let mut b = good;
            b[i] = v;
            DatagramEndpoint::decode(&b)
        };
        assert_eq!(bad(0, 2), Err(EndpointError::UnsupportedVersion(2)));
        assert_eq!(bad(1, 2), Err(EndpointError::UnknownFlags(2)));
        assert_eq!(bad(7, 1), Err(EndpointError::QpnOutOfRange(0x0112_3456)));
        assert_eq!(bad(11, 0x81), Err(EndpointError::UnknownFlags(0x81)));
        assert_eq!(bad(12, 9), Err(EndpointError::BadMtu(9)));
        assert_eq!(bad(15, 1), Err(EndpointError::NonZeroReserved));
        assert_eq!(bad(1, 0), Err(EndpointError::NoRoute));
        let mut mc = good;
        mc[4..8].copy_from_slice(&0x00ff_ffffu32.to_le_bytes());
        assert_eq!(
            DatagramEndpoint::decode(&mc),
            Err(EndpointError::QpnOutOfRange(0x00ff_ffff))
        );
        assert!(DatagramEndpoint::decode(&good[..31]).is_err());
    }
}
