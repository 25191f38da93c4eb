//! Multicast groups joined through the connection manager (`rdma_join_multicast`), for a
//! datagram queue pair of rverbs' own.
//!
//! The connection manager does what [`crate::verbs::mcast`] does by hand, and more: it
//! joins the group at the subnet administrator on InfiniBand (giving the group's LID), and on
//! RoCE v2 makes the IP layer a member; its `MULTICAST_JOIN` event carries the group's
//! address attributes, queue pair number and Q_Key. The queue pair is attached to the group
//! here (`ibv_attach_mcast`), and sends to the group use the event's attributes.
//!
//! Used through [`VerbsDatagram::joining_through_cm`](crate::provider::verbs_ud::VerbsDatagram::joining_through_cm):
//! every [`Datagram::join`](crate::datagram::Datagram::join) then goes through the connection
//! manager.

use core::fmt;
use core::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use core::time::Duration;

use super::error::{CmCall, CmError, CmStep};
use super::ffi::{self, sys};
use super::id::{check, CmId};
use crate::gid::Gid;
use crate::poll::{Deadline, Patience, StaticClock};
use crate::provider::verbs_ud::{GroupJoiner, JoinedGroup, VerbsDatagram};
use crate::verb::{ProviderError, Verb};
use crate::verbs::{AhAttr, Pd};

/// What joining a group gave: where to send to reach it, and the attachment to make.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct CmJoin {
    /// The group's IP address.
    pub group: IpAddr,
    /// The address attributes of the group (its GID, its LID on InfiniBand, the local GID
    /// index to send from).
    pub ah: AhAttr,
    /// The group's GID as the device sees it (the queue pair is attached to it).
    pub mgid: Gid,
    /// The group's LID (InfiniBand; 0 on RoCE).
    pub mlid: u16,
    /// The Q_Key of the group's datagrams.
    pub qkey: u32,
}

/// The IP address a multicast group GID stands for: IPv4-mapped (`::ffff:a.b.c.d`, RoCE v2)
/// or an IPv6 multicast address. `None` for anything else.
pub(crate) fn group_ip(gid: Gid) -> Option<IpAddr> {
    if let Some(v4) = gid.ipv4() {
        let ip = Ipv4Addr::from(v4);
        return ip.is_multicast().then_some(IpAddr::V4(ip));
    }
    let ip = Ipv6Addr::from(gid.0);
    ip.is_multicast().then_some(IpAddr::V6(ip))
}

/// A connection manager identifier in the UDP port space, bound to one local address, that
/// joins and leaves multicast groups.
pub(crate) struct CmGroups {
    id: CmId,
    local: SocketAddr,
    timeout: Duration,
    clock: StaticClock,
}

impl fmt::Debug for CmGroups {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CmGroups")
            .field("local", &self.local)
            .field("timeout", &self.timeout)
            .finish()
    }
}

impl CmGroups {
    /// Binds to `local`, which must be an address of port `port` of `pd`'s device.
    pub(crate) fn bind(
        pd: &Pd,
        port: u8,
        local: IpAddr,
        timeout: Duration,
        clock: StaticClock,
    ) -> Result<Self, CmError> {
        let id = CmId::new(sys::rdma_port_space::RDMA_PS_UDP)?;
        let at = SocketAddr::new(local, 0);
        let mut sa = ffi::to_sockaddr(at);
        // SAFETY: the identifier is live; the address is valid for the call.
        let rc = unsafe { sys::rdma_bind_addr(id.as_raw(), (&raw mut sa).cast()) };
        check(rc, CmCall::BindAddr)?;
        id.check_device(pd, at)?;
        if id.port() != port {
            return Err(CmError::WrongPort {
                addr: at,
                port: id.port(),
                qp_port: port,
            });
        }
        Ok(Self {
            id,
            local: at,
            timeout,
            clock,
        })
    }

    /// Joins `group` (`rdma_join_multicast`) and waits, at most the timeout, for the
    /// connection manager's answer. The group's Q_Key must be `qkey`.
    pub(crate) fn join(&self, group: IpAddr, qkey: u32) -> Result<CmJoin, CmError> {
        use sys::rdma_cm_event_type as t;
        if !group.is_multicast() {
            return Err(CmError::NotMulticast);
        }
        let mut sa = ffi::to_sockaddr(SocketAddr::new(group, 0));
        // SAFETY: the identifier is live and bound; the address is valid for the call; no
        // context pointer.
        let rc = unsafe {
            sys::rdma_join_multicast(
                self.id.as_raw(),
                (&raw mut sa).cast(),
                core::ptr::null_mut(),
            )
        };
        check(rc, CmCall::JoinMulticast)?;
        let deadline = Deadline::after(self.clock, self.timeout);
        let addr = SocketAddr::new(group, 0);
        // Other groups' answers passed over do not hold the join past its deadline.
        let mut patience = Patience::until(deadline);
        let ev = loop {
            let event = if patience.run_out(self.clock) {
                None
            } else {
                self.id.events().next(deadline, self.clock)?
            };
            let Some(ev) = event else {
                // Nothing is attached yet; leaving withdraws the pending join.
                let _ = self.leave(group);
                return Err(CmError::TimedOut {
                    addr,
                    step: CmStep::Join,
                    after: self.timeout,
                });
            };
            match ev.kind.0 {
                t::RDMA_CM_EVENT_MULTICAST_JOIN => break ev,
                t::RDMA_CM_EVENT_MULTICAST_ERROR => {
                    let _ = self.leave(group);
                    return Err(CmError::JoinFailed {
                        group,
                        status: ev.status,
                    });
                }
                // Another group's late answer, an address change: not ours to act on.
                _ => continue,
            }
        };
        let Some((ah, _qpn, group_qkey)) = ev.ud else {
            let _ = self.leave(group);
            return Err(CmError::JoinFailed { group, status: 0 });
        };
        if group_qkey != qkey {
            let _ = self.leave(group);
            return Err(CmError::QkeyMismatch {
                group,
                group_qkey,
                qp_qkey: qkey,
            });
        }
        let ah = AhAttr::from_sys(&ah);
        let Some(route) = ah.global else {
            let _ = self.leave(group);
            return Err(CmError::JoinFailed { group, status: 0 });
        };
        Ok(CmJoin {
            group,
            ah,
            mgid: route.dgid,
            mlid: ah.dlid,
            qkey: group_qkey,
        })
    }

    /// Leaves `group` (`rdma_leave_multicast`).
    pub(crate) fn leave(&self, group: IpAddr) -> Result<(), CmError> {
        let mut sa = ffi::to_sockaddr(SocketAddr::new(group, 0));
        // SAFETY: the identifier is live; the address is valid for the call.
        let rc = unsafe { sys::rdma_leave_multicast(self.id.as_raw(), (&raw mut sa).cast()) };
        check(rc, CmCall::LeaveMulticast)
    }
}

/// The connection manager joins the groups of a datagram queue pair built on it.
impl VerbsDatagram {
    /// From now on, joins and leaves go through the RDMA connection manager (feature
    /// `rdmacm`): `rdma_join_multicast` from the queue pair's own address (the IP address
    /// its GID maps to), waiting at most `timeout` on `clock` for the answer; then the queue
    /// pair is attached to the group the answer names, and sends to the group use the
    /// answer's address attributes (on InfiniBand, the group's LID from the subnet
    /// administrator). The IP-layer membership RoCE v2 needs is the connection manager's
    /// business then. The group's Q_Key must be the queue pair's (the connection manager's
    /// is [`crate::verbs::DEFAULT_QKEY`]).
    ///
    /// ```no_run
    /// # fn main() -> Result<(), Box<dyn core::error::Error>> {
    /// use core::time::Duration;
    /// use rverbs_core::datagram::{memory_needed, Datagram, DatagramConfig, Group};
    /// use rverbs_core::memory::PageMemory;
    /// use rverbs_core::provider::datagram::DatagramProvider;
    /// use rverbs_core::provider::verbs_ud::VerbsDatagram;
    /// use rverbs_core::verbs::{open_device, AccessFlags, UdConfig};
    /// # use rverbs_core::poll::{Clock, Instant};
    /// # struct Monotonic;
    /// # impl Clock for Monotonic { fn now(&self) -> Instant { Instant::from_nanos(0) } }
    /// # static MONOTONIC: Monotonic = Monotonic;
    /// let ctx = open_device("rxe0")?;
    /// let pd = ctx.alloc_pd()?;
    /// let qp = VerbsDatagram::new(&ctx, &pd, &UdConfig::default())?
    ///     .joining_through_cm(Duration::from_secs(5), &MONOTONIC)?;
    /// let cfg = DatagramConfig::default();
    /// let mem = PageMemory::zeroed(memory_needed(qp.mtu(), &cfg)).ok_or("no memory")?;
    /// let mem = pd.register_shared(mem, AccessFlags::LOCAL_WRITE)?;
    /// let mut ep = Datagram::new(qp, mem, cfg, &MONOTONIC)?;
    /// ep.join(Group::ipv4([239, 1, 2, 3]).ok_or("not a group")?)?; // rdma_join_multicast
    /// # Ok(()) }
    /// ```
    pub fn joining_through_cm(
        mut self,
        timeout: core::time::Duration,
        clock: StaticClock,
    ) -> Result<Self, CmError> {
        let gid = self.qp().route().gid;
        let local = match gid.ipv4() {
            Some(v4) => core::net::IpAddr::from(v4),
            None => core::net::IpAddr::from(gid.0),
        };
        let groups = CmGroups::bind(self.qp().pd(), self.qp().port(), local, timeout, clock)?;
        self.set_joiner(alloc::boxed::Box::new(groups));
        Ok(self)
    }
}

impl GroupJoiner for CmGroups {
    fn join(&self, group: Gid, qkey: u32) -> Result<JoinedGroup, ProviderError> {
        let ip = group_ip(group).ok_or(ProviderError {
            verb: Verb::JoinMulticast,
            errno: crate::verb::errno::EINVAL,
        })?;
        let joined =
            CmGroups::join(self, ip, qkey).map_err(|e| cm_error(e, Verb::JoinMulticast))?;
        Ok(JoinedGroup {
            attach: (joined.mgid, joined.mlid),
            ah: joined.ah,
        })
    }

    fn leave(&self, group: Gid) -> Result<(), ProviderError> {
        let ip = group_ip(group).ok_or(ProviderError {
            verb: Verb::LeaveMulticast,
            errno: crate::verb::errno::EINVAL,
        })?;
        CmGroups::leave(self, ip).map_err(|e| cm_error(e, Verb::LeaveMulticast))
    }
}

/// A connection manager failure as a provider error: the call and its errno, `ETIMEDOUT`
/// for a join that got no answer, `EINVAL` for a group the queue pair cannot take.
fn cm_error(e: CmError, verb: Verb) -> ProviderError {
    use CmError as E;
    let errno = match e {
        E::Call { errno, .. } => errno,
        E::TimedOut { .. } => crate::verb::errno::ETIMEDOUT,
        E::JoinFailed { status, .. } if status < 0 => -status,
        E::JoinFailed { .. } => crate::verb::errno::EIO,
        _ => crate::verb::errno::EINVAL,
    };
    ProviderError { verb, errno }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn group_ips_from_gids() {
        let v4 = Gid::ipv4_multicast([239, 1, 2, 3]).unwrap();
        assert_eq!(group_ip(v4), Some(IpAddr::V4(Ipv4Addr::new(239, 1, 2, 3))));
        assert_eq!(group_ip(Gid::from_ipv4([192, 168, 77, 1])), None);
        let v6: Ipv6Addr = "ff12::1".parse().unwrap();
        assert_eq!(group_ip(Gid(v6.octets())), Some(IpAddr::V6(v6)));
        assert_eq!(group_ip(Gid([0; 16])), None);
    }
}
