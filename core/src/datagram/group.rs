//! Multicast groups: joining, leaving, and sending to one.

use super::{Datagram, DatagramError, Peer, MAX_GROUPS, MULTICAST_QPN};
use crate::gid::Gid;
use crate::memory::Region;
use crate::poll::Backoff;
use crate::provider::datagram::{DatagramProvider, Destination};

/// A multicast group: a GID that names one ([`Gid::is_multicast`]), which the type
/// guarantees.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Group(Gid);

impl Group {
    /// The IPv4 multicast group `addr` (224.0.0.0/4), as RoCE v2 addresses it: the GID
    /// `::ffff:a.b.c.d` ([`Gid::ipv4_multicast`]). `None` for any other address.
    pub const fn ipv4(addr: [u8; 4]) -> Option<Self> {
        match Gid::ipv4_multicast(addr) {
            Some(g) => Some(Self(g)),
            None => None,
        }
    }

    /// The group a multicast GID names (IPv6 `ff00::/8`, the InfiniBand and RoCE v1 form,
    /// or IPv4-mapped multicast); `None` if `gid` is not a multicast address.
    pub const fn from_gid(gid: Gid) -> Option<Self> {
        if gid.is_multicast() {
            Some(Self(gid))
        } else {
            None
        }
    }

    /// Its GID.
    pub const fn gid(&self) -> Gid {
        self.0
    }
}

impl<P: DatagramProvider, M: Region, B: Backoff, const N: usize> Datagram<P, M, B, N> {
    /// Joins `group`: datagrams sent to it from now on are delivered to this endpoint too
    /// (not those sent before: a late joiner gets what follows). On a device this attaches
    /// the queue pair and, on RoCE v2, makes the IP layer a member
    /// ([`crate::verbs::mcast`]). Setup: may allocate.
    ///
    /// Every member of a group must use the same Q_Key (a datagram carries the sender's
    /// idea of it, [`Datagram::group_peer`] uses the sender's own). An IPv4 group
    /// ([`Group::ipv4`]) needs an endpoint whose port sends from an IPv4 address (RoCE v2
    /// over IPv4: an IPv4-mapped GID), since the group's datagrams are IPv4 packets; on any
    /// other route it is refused ([`DatagramError::Ipv4GroupWithoutIpv4Route`]) rather than
    /// joined to receive nothing.
    pub fn join(&mut self, group: Group) -> Result<(), DatagramError> {
        if group.0.ipv4().is_some() && self.gid.ipv4().is_none() {
            return Err(DatagramError::Ipv4GroupWithoutIpv4Route {
                group: group.0,
                local: self.gid,
            });
        }
        if self.groups.contains(&Some(group.0)) {
            return Err(DatagramError::AlreadyJoined(group.0));
        }
        let Some(free) = self.groups.iter().position(Option::is_none) else {
            return Err(DatagramError::TooManyGroups { max: MAX_GROUPS });
        };
        self.p.join_group(group.0)?;
        self.groups[free] = Some(group.0);
        Ok(())
    }

    /// Leaves `group`: nothing sent to it after this call returns is delivered here
    /// (datagrams that arrived before stay in the receive slots and are handed over).
    pub fn leave(&mut self, group: Group) -> Result<(), DatagramError> {
        let Some(i) = self.groups.iter().position(|g| *g == Some(group.0)) else {
            return Err(DatagramError::NotJoined(group.0));
        };
        self.p.leave_group(group.0)?;
        self.groups[i] = None;
        Ok(())
    }

    /// The groups joined.
    pub fn groups(&self) -> impl Iterator<Item = Group> + '_ {
        self.groups.iter().flatten().map(|g| Group(*g))
    }

    /// An address to send to `group` with (setup: may allocate; keep it). A sender need not
    /// be a member. Its datagrams carry this endpoint's Q_Key and at most its MTU.
    pub fn group_peer(&mut self, group: Group) -> Result<Peer<P::Address>, DatagramError> {
        Ok(Peer {
            address: self.p.address(Destination::Gid(group.0))?,
            qpn: MULTICAST_QPN,
            qkey: self.qkey,
            mtu: self.mtu,
        })
    }
}
