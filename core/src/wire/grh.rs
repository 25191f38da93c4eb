//! The 40-byte network header a device writes in front of every received datagram.
//!
//! A datagram (UD) receive buffer starts with 40 bytes the device fills before the payload:
//! the *global route header* (GRH). What they hold depends on how the datagram travelled:
//!
//! InfiniBand, RoCE v1 and RoCE v2 over IPv6: an IPv6-shaped header.
//!
//! | bytes  | field                                                   |
//! |--------|---------------------------------------------------------|
//! | 0..4   | version (4 bits, 6), traffic class (8), flow label (20), big-endian |
//! | 4..6   | payload length, big-endian                              |
//! | 6      | next header (0x1b: InfiniBand transport; 0x11: UDP, RoCE v2) |
//! | 7      | hop limit                                               |
//! | 8..24  | source GID                                              |
//! | 24..40 | destination GID                                         |
//!
//! RoCE v2 over IPv4: the IPv4 header of the packet in the last 20 bytes, the first 20
//! undefined (SoftRoCE zeroes them).
//!
//! | bytes  | field                                                   |
//! |--------|---------------------------------------------------------|
//! | 0..20  | undefined                                               |
//! | 20     | version (4 bits, 4) and header length (4 bits, 5 words) |
//! | 21     | type of service (the traffic class)                     |
//! | 22..24 | total length, big-endian                                |
//! | 28     | time to live (the hop limit)                            |
//! | 29     | protocol (17, UDP)                                      |
//! | 30..32 | header checksum                                         |
//! | 32..36 | source address                                          |
//! | 36..40 | destination address                                     |
//!
//! [`NetworkHeader::decode`] tells them apart as libibverbs does (`ibv_init_ah_from_wc`): the
//! IPv6 form has version 6 in its first four bits, unless bytes 20..40 are a well-formed IPv4
//! header (version 4, five words, a correct checksum), which the undefined bytes of the IPv4
//! form could otherwise make ambiguous. IPv4 addresses come out IPv4-mapped
//! (`::ffff:a.b.c.d`), as RoCE v2 GIDs write them. The decoder is total: any 40 bytes give a
//! header or an error, never a panic (fuzzed).

use core::fmt;

use crate::gid::Gid;

/// Bytes of the network header in front of every received datagram.
pub const GRH_LEN: usize = 40;

/// The network protocol a datagram travelled over.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum NetworkKind {
    /// IPv4 (RoCE v2): the GIDs are IPv4-mapped addresses.
    Ipv4,
    /// IPv6, or an InfiniBand or RoCE v1 global route header.
    Ipv6,
}

/// What the network header of a received datagram says.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct NetworkHeader {
    /// How the datagram travelled.
    pub kind: NetworkKind,
    /// The sender's GID.
    pub sgid: Gid,
    /// The destination GID: this port's, or the multicast group's.
    pub dgid: Gid,
    /// Hop limit (IPv4: time to live) left on arrival.
    pub hop_limit: u8,
    /// Traffic class (IPv4: type of service).
    pub traffic_class: u8,
    /// Flow label (IPv6 only; 0 for IPv4).
    pub flow_label: u32,
}

/// Why 40 bytes are not a network header.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum GrhError {
    /// Neither IPv6 (version 6 in the first four bits) nor IPv4 (version 4 at byte 20).
    UnknownVersion {
        /// The first four bits of byte 0.
        v6_nibble: u8,
        /// The first four bits of byte 20.
        v4_nibble: u8,
    },
}

impl fmt::Display for GrhError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            Self::UnknownVersion {
                v6_nibble,
                v4_nibble,
            } => write!(
                f,
                "not a datagram network header: IP version {v6_nibble} at byte 0 and {v4_nibble} at byte 20"
            ),
        }
    }
}

impl core::error::Error for GrhError {}

/// Offset of the IPv4 header in the IPv4 form.
const V4: usize = 20;

/// The one's-complement checksum of an IPv4 header whose checksum field is zero.
fn ipv4_checksum(h: &[u8; 20]) -> u16 {
    let mut sum: u32 = 0;
    for (i, pair) in h.chunks_exact(2).enumerate() {
        if i != 5 {
            sum += u32::from(u16::from_be_bytes([pair[0], pair[1]]));
        }
    }
    while sum > 0xffff {
        sum = (sum & 0xffff) + (sum >> 16);
    }
    !(sum as u16)
}

fn ipv4_part(b: &[u8; GRH_LEN]) -> [u8; 20] {
    let mut h = [0u8; 20];
    h.copy_from_slice(&b[V4..]);
    h
}

fn well_formed_ipv4(h: &[u8; 20]) -> bool {
    h[0] == 0x45 && u16::from_be_bytes([h[10], h[11]]) == ipv4_checksum(h)
}

impl NetworkHeader {
    /// Reads the header in front of a received datagram. Does not allocate.
    pub fn decode(b: &[u8; GRH_LEN]) -> Result<Self, GrhError> {
        let v4 = ipv4_part(b);
        let v6_nibble = b[0] >> 4;
        if v6_nibble == 6 && !well_formed_ipv4(&v4) {
            let word = u32::from_be_bytes([b[0], b[1], b[2], b[3]]);
            let mut sgid = [0u8; 16];
            let mut dgid = [0u8; 16];
            sgid.copy_from_slice(&b[8..24]);
            dgid.copy_from_slice(&b[24..40]);
            return Ok(Self {
                kind: NetworkKind::Ipv6,
                sgid: Gid(sgid),
                dgid: Gid(dgid),
                hop_limit: b[7],
                traffic_class: (word >> 20) as u8,
                flow_label: word & 0xf_ffff,
            });
        }
        let v4_nibble = v4[0] >> 4;
        if v4_nibble != 4 {
            return Err(GrhError::UnknownVersion {
                v6_nibble,
                v4_nibble,
            });
        }
        Ok(Self {
            kind: NetworkKind::Ipv4,
            sgid: Gid::from_ipv4([v4[12], v4[13], v4[14], v4[15]]),
            dgid: Gid::from_ipv4([v4[16], v4[17], v4[18], v4[19]]),
            hop_limit: v4[8],
            traffic_class: v4[1],
            flow_label: 0,
        })
    }

    /// The header a RoCE v2 device writes for an IPv4 datagram of `payload` bytes from `src`
    /// to `dst` (the software model writes it; tests and fuzzing check the decoder on it):
    /// 20 zero bytes, then the IPv4 header (total length counts the UDP, transport and
    /// datagram headers and the CRC a RoCE v2 packet carries). Does not allocate.
    pub fn encode_ipv4(
        src: [u8; 4],
        dst: [u8; 4],
        payload: u32,
        ttl: u8,
        tos: u8,
    ) -> [u8; GRH_LEN] {
        // UDP (8), base transport (12), datagram extended transport (8), payload, ICRC (4).
        let total = (20 + 8 + 12 + 8 + 4 + payload).min(u32::from(u16::MAX)) as u16;
        let mut h = [0u8; 20];
        h[0] = 0x45;
        h[1] = tos;
        h[2..4].copy_from_slice(&total.to_be_bytes());
        // Don't fragment, as RoCE v2 packets are sent.
        h[6] = 0x40;
        h[8] = ttl;
        h[9] = 17;
        h[12..16].copy_from_slice(&src);
        h[16..20].copy_from_slice(&dst);
        let sum = ipv4_checksum(&h);
        h[10..12].copy_from_slice(&sum.to_be_bytes());
        let mut b = [0u8; GRH_LEN];
        b[V4..].copy_from_slice(&h);
        b
    }

    /// The IPv6-shaped header of a datagram of `payload` bytes from `sgid` to `dgid` (next
    /// header UDP, as RoCE v2 over IPv6). Does not allocate.
    pub fn encode_ipv6(
        sgid: Gid,
        dgid: Gid,
        payload: u32,
        hop_limit: u8,
        traffic_class: u8,
        flow_label: u32,
    ) -> [u8; GRH_LEN] {
        let word = (6u32 << 28) | (u32::from(traffic_class) << 20) | (flow_label & 0xf_ffff);
        let len = (8 + 12 + 8 + 4 + payload).min(u32::from(u16::MAX)) as u16;
        let mut b = [0u8; GRH_LEN];
        b[0..4].copy_from_slice(&word.to_be_bytes());
        b[4..6].copy_from_slice(&len.to_be_bytes());
        b[6] = 0x11;
        b[7] = hop_limit;
        b[8..24].copy_from_slice(&sgid.0);
        b[24..40].copy_from_slice(&dgid.0);
        b
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn what_softroce_writes_decodes_as_ipv4() {
        // Captured in the SoftRoCE VM: a multicast datagram from 192.168.77.1 to 239.1.2.3.
        let mut b = [0u8; GRH_LEN];
        b[20..40].copy_from_slice(&[
            0x45, 0x00, 0x00, 0x44, 0xa7, 0xc4, 0x40, 0x00, 0x40, 0x11, 0x94, 0x36, 0xc0, 0xa8,
            0x4d, 0x01, 0xef, 0x01, 0x02, 0x03,
        ]);
        let h = NetworkHeader::decode(&b).unwrap();
        assert_eq!(h.kind, NetworkKind::Ipv4);
        assert_eq!(h.sgid, Gid::from_ipv4([192, 168, 77, 1]));
        assert_eq!(h.dgid, Gid::from_ipv4([239, 1, 2, 3]));
        assert!(h.dgid.is_multicast());
        assert_eq!(h.hop_limit, 64);
        // The checksum as the kernel computed it.
        assert_eq!(ipv4_checksum(&ipv4_part(&b)), 0x9436);
        assert!(well_formed_ipv4(&ipv4_part(&b)));
    }

    #[test]
    fn both_forms_round_trip() {
        let b = NetworkHeader::encode_ipv4([10, 0, 0, 1], [10, 0, 0, 2], 100, 63, 0x28);
        let h = NetworkHeader::decode(&b).unwrap();
        assert_eq!(
            (h.kind, h.sgid, h.dgid, h.hop_limit, h.traffic_class),
            (
                NetworkKind::Ipv4,
                Gid::from_ipv4([10, 0, 0, 1]),
                Gid::from_ipv4([10, 0, 0, 2]),
                63,
                0x28
            )
        );
        let (s, d) = (Gid([0xfe; 16]), Gid([0xff; 16]));
        let b = NetworkHeader::encode_ipv6(s, d, 100, 7, 0xa5, 0x12345);
        let h = NetworkHeader::decode(&b).unwrap();
        assert_eq!(
            (
                h.kind,
                h.sgid,
                h.dgid,
                h.hop_limit,
                h.traffic_class,
                h.flow_label
            ),
            (NetworkKind::Ipv6, s, d, 7, 0xa5, 0x12345)
        );
    }

    #[test]
    fn anything_else_is_an_error() {
        assert_eq!(
            NetworkHeader::decode(&[0u8; GRH_LEN]),
            Err(GrhError::UnknownVersion {
                v6_nibble: 0,
                v4_nibble: 0
            })
        );
        // An IPv6 header whose last 20 bytes look like IPv4 with a wrong checksum stays IPv6.
        let mut b = NetworkHeader::encode_ipv4([1, 2, 3, 4], [5, 6, 7, 8], 0, 1, 0);
        b[0] = 0x60;
        assert_eq!(NetworkHeader::decode(&b).unwrap().kind, NetworkKind::Ipv4);
        b[31] ^= 1;
        assert_eq!(NetworkHeader::decode(&b).unwrap().kind, NetworkKind::Ipv6);
    }
}
