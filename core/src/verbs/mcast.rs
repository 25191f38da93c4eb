//! Multicast on RoCE v2: what `ibv_attach_mcast` does not do.
//!
//! `ibv_attach_mcast` ([`UdQp::attach_mcast`](super::UdQp::attach_mcast)) tells the device
//! to hand datagrams addressed to a group to a queue pair. On RoCE v2 a datagram is an IPv4
//! (or IPv6) packet, and the host's IP layer sees it first:
//!
//! - on SoftRoCE (rxe, Linux 6.1 as in our VM), the packet reaches rxe only through the
//!   kernel's UDP socket, and the IP layer delivers a multicast packet (including the copy it
//!   loops back to the sending host) only to an interface that is a member of the group. rxe
//!   itself registers the link-layer address of the group, not an IP membership: a queue pair
//!   attached with nothing else receives nothing (tried in the VM: no completion; with the
//!   membership below: every datagram);
//! - on a NIC, a switch with IGMP snooping forwards a group only to ports whose host sent an
//!   IGMP report for it, which the IP layer does once it is a member.
//!
//! The RDMA connection manager (`rdma_join_multicast`) joins the IP group in the kernel for
//! the same reasons. [`IpMembership`] does it from user space: a socket that is a member of
//! the group on the interface of the port's IPv4 address, for as long as it lives.
//! [`VerbsDatagram`](crate::provider::verbs_ud::VerbsDatagram) joins one alongside each
//! attach.

use core::fmt;

use super::error::{Result, Verb, VerbsError};
use super::ffi;

/// Membership of the IP layer in an IPv4 multicast group, on the interface with a given
/// address, for as long as the value lives (an `IP_ADD_MEMBERSHIP` socket).
pub struct IpMembership {
    fd: core::ffi::c_int,
    group: [u8; 4],
    local: [u8; 4],
}

impl fmt::Debug for IpMembership {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let [a, b, c, d] = self.group;
        let [w, x, y, z] = self.local;
        write!(f, "IpMembership({a}.{b}.{c}.{d} on {w}.{x}.{y}.{z})")
    }
}

impl IpMembership {
    /// Makes the IP layer a member of `group` (224.0.0.0/4) on the interface whose address
    /// is `local` (the IPv4 address of the RDMA port's GID). Fails with
    /// [`VerbsError::InvalidArgument`] for a group that is not a multicast address, and with
    /// [`Verb::IpAddMembership`] and the errno (`ENODEV`: no interface has `local`).
    pub fn join(group: [u8; 4], local: [u8; 4]) -> Result<Self> {
        if group[0] & 0xf0 != 0xe0 {
            return Err(VerbsError::InvalidArgument {
                what: "not an IPv4 multicast group (224.0.0.0/4)",
            });
        }
        let fd = ffi::join_ipv4_group(group, local).map_err(|errno| VerbsError::Call {
            verb: Verb::IpAddMembership,
            errno,
        })?;
        Ok(Self { fd, group, local })
    }

    /// The group.
    pub fn group(&self) -> [u8; 4] {
        self.group
    }
}

impl Drop for IpMembership {
    fn drop(&mut self) {
        // Closing the socket drops the membership.
        ffi::close_fd(self.fd);
    }
}
