//! Global identifiers: the 128-bit addresses of ports and multicast groups (an IPv6 address
//! on RoCE, where an IPv4 address is written IPv4-mapped, `::ffff:a.b.c.d`).
//!
//! Here rather than in [`verbs`](crate::verbs) because the engine names ports and groups by
//! GID without a device too: the software model gives its nodes GIDs, and the
//! [`datagram`](crate::datagram) layer reports the GID a datagram came from.

use core::fmt;

/// A 128-bit global identifier (an IPv6 address on RoCE).
#[derive(Clone, Copy, Default, PartialEq, Eq, Hash)]
#[repr(transparent)]
pub struct Gid(pub [u8; 16]);

impl Gid {
    /// Whether every byte is zero (an empty table slot).
    pub const fn is_zero(&self) -> bool {
        let mut i = 0;
        while i < 16 {
            if self.0[i] != 0 {
                return false;
            }
            i += 1;
        }
        true
    }

    /// Whether this is an IPv4-mapped address (`::ffff:a.b.c.d`), as RoCE v2 uses for IPv4.
    pub const fn is_ipv4_mapped(&self) -> bool {
        let mut i = 0;
        while i < 10 {
            if self.0[i] != 0 {
                return false;
            }
            i += 1;
        }
        self.0[10] == 0xff && self.0[11] == 0xff
    }

    /// The IPv4-mapped GID of `addr` (`::ffff:a.b.c.d`): how RoCE v2 writes an IPv4 address,
    /// a port's or a group's.
    pub const fn from_ipv4(addr: [u8; 4]) -> Self {
        let mut g = [0u8; 16];
        g[10] = 0xff;
        g[11] = 0xff;
        g[12] = addr[0];
        g[13] = addr[1];
        g[14] = addr[2];
        g[15] = addr[3];
        Self(g)
    }

    /// The IPv4 address of an IPv4-mapped GID, else `None`.
    pub const fn ipv4(&self) -> Option<[u8; 4]> {
        if self.is_ipv4_mapped() {
            Some([self.0[12], self.0[13], self.0[14], self.0[15]])
        } else {
            None
        }
    }

    /// The GID of the IPv4 multicast group `addr` (224.0.0.0/4) as RoCE v2 addresses it: the
    /// IPv4-mapped address `::ffff:a.b.c.d`, which is what a RoCE v2 device compares the
    /// destination of an incoming IPv4 packet with, and what the RDMA connection manager
    /// derives for an IPv4 group on a RoCE v2 port. `None` if `addr` is not a multicast
    /// address.
    pub const fn ipv4_multicast(addr: [u8; 4]) -> Option<Self> {
        if addr[0] & 0xf0 == 0xe0 {
            Some(Self::from_ipv4(addr))
        } else {
            None
        }
    }

    /// Whether the GID names a multicast group: an IPv6 multicast address (`ff00::/8`, the
    /// InfiniBand and RoCE v1 form) or an IPv4-mapped multicast address (RoCE v2).
    pub const fn is_multicast(&self) -> bool {
        self.0[0] == 0xff || (self.is_ipv4_mapped() && self.0[12] & 0xf0 == 0xe0)
    }
}

impl fmt::Display for Gid {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if let Some([a, b, c, d]) = self.ipv4() {
            return write!(f, "::ffff:{a}.{b}.{c}.{d}");
        }
        for i in 0..8 {
            if i > 0 {
                f.write_str(":")?;
            }
            write!(
                f,
                "{:x}",
                u16::from_be_bytes([self.0[2 * i], self.0[2 * i + 1]])
            )?;
        }
        Ok(())
    }
}

impl fmt::Debug for Gid {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Gid({self})")
    }
}

#[cfg(test)]
mod tests {
    use super::Gid;

    #[test]
    fn ipv4_groups_map_as_roce_v2_does() {
        let g = Gid::ipv4_multicast([239, 1, 2, 3]).unwrap();
        assert_eq!(
            g.0,
            [0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 239, 1, 2, 3]
        );
        assert!(g.is_multicast() && g.is_ipv4_mapped());
        assert_eq!(g.ipv4(), Some([239, 1, 2, 3]));
        assert_eq!(Gid::ipv4_multicast([192, 168, 77, 1]), None);
        assert!(!Gid::from_ipv4([192, 168, 77, 1]).is_multicast());
        let mut v6 = [0u8; 16];
        v6[0] = 0xff;
        v6[1] = 0x0e;
        assert!(Gid(v6).is_multicast());
        assert!(Gid::default().is_zero());
        assert_eq!(
            alloc_free_display(Gid::from_ipv4([10, 0, 0, 7])),
            *b"::ffff:10.0.0.7"
        );
    }

    /// Display into a fixed buffer (the crate has no alloc in every configuration).
    fn alloc_free_display(g: Gid) -> [u8; 15] {
        use core::fmt::Write;
        struct Buf([u8; 15], usize);
        impl Write for Buf {
            fn write_str(&mut self, s: &str) -> core::fmt::Result {
                let end = self.1 + s.len();
                self.0
                    .get_mut(self.1..end)
                    .ok_or(core::fmt::Error)?
                    .copy_from_slice(s.as_bytes());
                self.1 = end;
                Ok(())
            }
        }
        let mut b = Buf([0; 15], 0);
        write!(b, "{g}").unwrap();
        b.0
    }
}
