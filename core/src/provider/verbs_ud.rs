//! The real datagram provider: a [`UdQp`] with its own send and receive completion queues.
//!
//! Addresses are [`AddressHandle`]s: by GID from the queue pair's route (RoCE, or
//! InfiniBand across subnets), or by LID. Joining a multicast group attaches the queue pair
//! (`ibv_attach_mcast`) and, for an IPv4 group on a RoCE v2 port with an IPv4 address, makes
//! the IP layer a member too ([`IpMembership`]; see [`crate::verbs::mcast`] for why). An
//! IPv4 group on a route whose GID is not IPv4-mapped is refused (`EAFNOSUPPORT`): nothing
//! sent to it would arrive.
//!
//! ```no_run
//! # fn main() -> Result<(), Box<dyn core::error::Error>> {
//! use rverbs_core::datagram::{memory_needed, Datagram, DatagramConfig, Group};
//! use rverbs_core::memory::PageMemory;
//! use rverbs_core::provider::datagram::DatagramProvider;
//! use rverbs_core::provider::verbs_ud::VerbsDatagram;
//! use rverbs_core::verbs::{open_device, AccessFlags, UdConfig};
//! # use rverbs_core::poll::{Clock, Instant};
//! # struct Monotonic;
//! # impl Clock for Monotonic { fn now(&self) -> Instant { Instant::from_nanos(0) } }
//! # static MONOTONIC: Monotonic = Monotonic;
//! // `MONOTONIC` is `rverbs_std_shim::MONOTONIC`.
//! let ctx = open_device("rxe0")?;
//! let pd = ctx.alloc_pd()?;
//! let qp = VerbsDatagram::new(&ctx, &pd, &UdConfig::default())?;
//! let cfg = DatagramConfig::default();
//! let mem = PageMemory::zeroed(memory_needed(qp.mtu(), &cfg)).ok_or("no memory")?;
//! let mem = pd.register_shared(mem, AccessFlags::LOCAL_WRITE)?;
//! let mut ep = Datagram::new(qp, mem, cfg, &MONOTONIC)?;
//! let group = Group::ipv4([239, 1, 2, 3]).ok_or("not a multicast address")?;
//! ep.join(group)?; // ibv_attach_mcast, and the IP layer joins 239.1.2.3 too
//! let d = ep.recv()?; // at most cfg.timeout
//! println!("{} bytes from queue pair {} at {}", d.payload.len(), d.source.qpn, d.source.gid);
//! # Ok(()) }
//! ```

use alloc::sync::Arc;
use alloc::vec::Vec;

use crate::completion::{Completion, DatagramCompletion};
use crate::gid::Gid;
use crate::params::QpCaps;
use crate::provider::datagram::{DatagramProvider, Destination};
use crate::provider::{ProviderError, Verb};
use crate::verb::errno::{EAFNOSUPPORT, EINVAL};
use crate::verbs::{
    AddressHandle, AhAttr, Context, Cq, CqEvents, IpMembership, Pd, UdConfig, UdQp, VerbsError,
};
use crate::wr::{DatagramRequest, PostFailure, RecvRequest};

/// One group this queue pair is attached to, and the membership that goes with it.
#[derive(Debug)]
struct Joined {
    group: Gid,
    /// The GID and LID the queue pair is attached to (the group's own on RoCE).
    attached: (Gid, u16),
    _ip: Option<IpMembership>,
    /// Joined through the queue pair's [`GroupJoiner`]: the attributes to send to the group
    /// with.
    through_joiner: Option<AhAttr>,
}

/// A way to join multicast groups other than attaching the queue pair to the group's GID by
/// itself: the connection manager's `rdma_join_multicast` is one
/// ([`VerbsDatagram::joining_through_cm`], feature `rdmacm`). The queue pair is attached to
/// what the join gives. It lives in the layer above (the connection manager is built on the
/// device layer, not the other way round), so the provider sees only this trait.
pub(crate) trait GroupJoiner: core::fmt::Debug + Send {
    /// Joins `group` for datagrams of Q_Key `qkey`; waits at most the joiner's own timeout.
    fn join(&self, group: Gid, qkey: u32) -> Result<JoinedGroup, ProviderError>;
    /// Leaves `group`.
    fn leave(&self, group: Gid) -> Result<(), ProviderError>;
}

/// What a [`GroupJoiner`] gave for a group.
#[derive(Clone, Copy, Debug)]
pub(crate) struct JoinedGroup {
    /// The GID and LID to attach the queue pair to.
    pub(crate) attach: (Gid, u16),
    /// The attributes to send to the group with.
    pub(crate) ah: AhAttr,
}

/// A datagram queue pair and the two completion queues it owns, as a [`DatagramProvider`].
#[derive(Debug)]
pub struct VerbsDatagram {
    // Field order is drop order: the IP memberships, then the queue pair (which detaches
    // from its groups before it is destroyed), then the connection manager's identifier
    // (whose memberships end with it), then the CQs.
    groups: Vec<Joined>,
    qp: UdQp,
    joiner: Option<alloc::boxed::Box<dyn GroupJoiner>>,
    send_cq: Cq,
    recv_cq: Cq,
    /// The completion events of both queues ([`VerbsDatagram::with_events`]); it keeps them
    /// alive until it goes, so they outlive the queue pair either way.
    events: Option<Arc<CqEvents>>,
}

impl VerbsDatagram {
    /// Creates a datagram queue pair with a send CQ and a receive CQ sized to its queues.
    pub fn new(ctx: &Context, pd: &Pd, cfg: &UdConfig) -> Result<Self, VerbsError> {
        let send_cq = ctx.create_cq(cfg.max_send_wr)?;
        let recv_cq = ctx.create_cq(cfg.max_recv_wr)?;
        Self::from_cqs(pd, cfg, send_cq, recv_cq, None)
    }

    /// Like [`VerbsDatagram::new`], with both completion queues on a completion channel of
    /// their own (opt-in: an armed queue costs the device an event per wake-up).
    /// [`wakeup_source`](DatagramProvider::wakeup_source) hands them out, so an
    /// event loop can sleep until a datagram arrives instead of polling: rverbs-async's
    /// `AsyncDatagram` with `TokioEvents`. The receive queue is what wakes a subscriber;
    /// the send queue is on the channel too, so that a waiter for room to send is woken as
    /// well (a completion of either queue wakes the one waiter, which polls both).
    ///
    /// The endpoint's own blocking waits ([`Datagram::recv`](crate::datagram::Datagram::recv))
    /// still poll with their back-off; they do not sleep on these events.
    pub fn with_events(ctx: &Context, pd: &Pd, cfg: &UdConfig) -> Result<Self, VerbsError> {
        let channel = ctx.create_completion_channel()?;
        let send_cq = ctx.create_cq_on(cfg.max_send_wr, &channel)?;
        let recv_cq = ctx.create_cq_on(cfg.max_recv_wr, &channel)?;
        let events = CqEvents::new(&channel, &[&send_cq, &recv_cq], false)?;
        Self::from_cqs(pd, cfg, send_cq, recv_cq, Some(Arc::new(events)))
    }

    fn from_cqs(
        pd: &Pd,
        cfg: &UdConfig,
        send_cq: Cq,
        recv_cq: Cq,
        events: Option<Arc<CqEvents>>,
    ) -> Result<Self, VerbsError> {
        Ok(Self {
            groups: Vec::new(),
            qp: pd.create_ud_qp(&send_cq, &recv_cq, cfg)?,
            joiner: None,
            send_cq,
            recv_cq,
            events,
        })
    }

    /// The completion events of the two queues, if they were created on a completion
    /// channel ([`VerbsDatagram::with_events`]).
    pub fn events(&self) -> Option<&CqEvents> {
        self.events.as_deref()
    }

    /// Joins groups through `joiner` from now on (the groups joined so far stay as they
    /// are).
    #[cfg_attr(not(feature = "rdmacm"), allow(dead_code))]
    pub(crate) fn set_joiner(&mut self, joiner: alloc::boxed::Box<dyn GroupJoiner>) {
        self.joiner = Some(joiner);
    }

    /// What joining `group` through the connection manager gave, if it was joined that way.
    #[cfg(feature = "rdmacm")]
    pub fn cm_join(&self, group: Gid) -> Option<AhAttr> {
        self.groups
            .iter()
            .find(|j| j.group == group)
            .and_then(|j| j.through_joiner)
    }

    /// The queue pair.
    pub fn qp(&self) -> &UdQp {
        &self.qp
    }

    /// The groups joined, in joining order.
    pub fn groups(&self) -> impl Iterator<Item = Gid> + '_ {
        self.groups.iter().map(|j| j.group)
    }
}

impl DatagramProvider for VerbsDatagram {
    type Address = AddressHandle;

    #[inline]
    fn same_address(a: &AddressHandle, b: &AddressHandle) -> bool {
        a.same(b)
    }

    #[inline]
    fn caps(&self) -> QpCaps {
        // Never more in flight than the CQs (sized to the request) can hold.
        let mut caps = self.qp.caps();
        caps.max_send_wr = caps.max_send_wr.min(self.send_cq.capacity());
        caps.max_recv_wr = caps.max_recv_wr.min(self.recv_cq.capacity());
        caps
    }

    #[inline]
    fn qp_num(&self) -> u32 {
        self.qp.qp_num()
    }

    #[inline]
    fn qkey(&self) -> u32 {
        self.qp.qkey()
    }

    #[inline]
    fn gid(&self) -> Gid {
        self.qp.route().gid
    }

    #[inline]
    fn lid(&self) -> u16 {
        self.qp.lid()
    }

    #[inline]
    fn mtu(&self) -> u32 {
        self.qp.mtu().bytes()
    }

    fn address(&mut self, to: Destination) -> Result<AddressHandle, ProviderError> {
        let port = self.qp.port();
        let attr = match to {
            Destination::Gid(g) => self
                .joined_attr(g)
                .unwrap_or_else(|| AhAttr::global(port, g, self.qp.route().gid_index)),
            Destination::Lid(l) => AhAttr::lid(port, l),
        };
        self.qp
            .pd()
            .create_ah(&attr)
            .map_err(|e| e.provider_error(Verb::CreateAh))
    }

    /// Whether the address handle was made on this queue pair's protection domain (one
    /// pointer compare).
    #[inline]
    fn owns(&self, address: &AddressHandle) -> bool {
        address.pd_raw() == self.qp.pd().as_raw()
    }

    #[inline]
    unsafe fn post_send(
        &mut self,
        wrs: &[DatagramRequest<'_, AddressHandle>],
    ) -> Result<(), PostFailure> {
        // SAFETY: the caller upholds the posting contract.
        unsafe { self.qp.post_send(wrs) }
    }

    #[inline]
    unsafe fn post_recv(&mut self, wrs: &[RecvRequest<'_>]) -> Result<(), PostFailure> {
        // SAFETY: the caller upholds the posting contract.
        unsafe { self.qp.post_recv(wrs) }
    }

    #[inline]
    fn poll_send(&mut self, out: &mut [Completion]) -> Result<usize, ProviderError> {
        self.send_cq
            .poll(out)
            .map_err(|e| e.provider_error(Verb::PollCq))
    }

    #[inline]
    fn poll_recv(&mut self, out: &mut [DatagramCompletion]) -> Result<usize, ProviderError> {
        self.recv_cq
            .poll_datagrams(out)
            .map_err(|e| e.provider_error(Verb::PollCq))
    }

    fn set_error(&mut self) -> Result<(), ProviderError> {
        self.qp
            .set_error()
            .map_err(|e| e.provider_error(Verb::ModifyQpErr))
    }

    fn wakeup_source(&self) -> Option<Arc<dyn crate::poll::Wakeup>> {
        self.events
            .as_ref()
            .map(|e| e.clone() as Arc<dyn crate::poll::Wakeup>)
    }

    fn join_group(&mut self, group: Gid) -> Result<(), ProviderError> {
        let refuse = ProviderError {
            verb: Verb::AttachMcast,
            errno: EINVAL,
        };
        if !group.is_multicast() || self.groups.iter().any(|j| j.group == group) {
            return Err(refuse);
        }
        if self.joiner.is_some() {
            return self.join_through_joiner(group);
        }
        // The IP layer first: if it refuses, nothing is attached.
        let ip = match (group.ipv4(), self.gid().ipv4()) {
            (Some(g), Some(local)) => Some(
                IpMembership::join(g, local)
                    .map_err(|e| e.provider_error(Verb::IpAddMembership))?,
            ),
            // An IPv4 group's datagrams are IPv4 packets (RoCE v2): a queue pair sending and
            // receiving on another route (IPv6, RoCE v1, InfiniBand) would get none of them.
            (Some(_), None) => {
                return Err(ProviderError {
                    verb: Verb::AttachMcast,
                    errno: EAFNOSUPPORT,
                })
            }
            _ => None,
        };
        self.qp
            .attach_mcast(&group, 0)
            .map_err(|e| e.provider_error(Verb::AttachMcast))?;
        self.groups.push(Joined {
            group,
            attached: (group, 0),
            _ip: ip,
            through_joiner: None,
        });
        Ok(())
    }

    fn leave_group(&mut self, group: Gid) -> Result<(), ProviderError> {
        let Some(i) = self.groups.iter().position(|j| j.group == group) else {
            return Err(ProviderError {
                verb: Verb::DetachMcast,
                errno: EINVAL,
            });
        };
        let (gid, lid) = self.groups[i].attached;
        self.qp
            .detach_mcast(&gid, lid)
            .map_err(|e| e.provider_error(Verb::DetachMcast))?;
        // Dropping the membership ends the IP layer's too.
        let left = self.groups.swap_remove(i);
        if let (Some(joiner), Some(_)) = (&self.joiner, left.through_joiner) {
            joiner.leave(group)?;
        }
        Ok(())
    }
}

impl VerbsDatagram {
    /// The attributes a connection manager join gave for `group`, if it was joined so.
    fn joined_attr(&self, group: Gid) -> Option<AhAttr> {
        self.groups
            .iter()
            .find(|j| j.group == group)
            .and_then(|j| j.through_joiner)
    }

    /// The joiner's join, then the attachment to what it names.
    fn join_through_joiner(&mut self, group: Gid) -> Result<(), ProviderError> {
        let Some(joiner) = &self.joiner else {
            return Err(ProviderError {
                verb: Verb::JoinMulticast,
                errno: EINVAL,
            });
        };
        let joined = joiner.join(group, self.qp.qkey())?;
        let (gid, lid) = joined.attach;
        if let Err(e) = self.qp.attach_mcast(&gid, lid) {
            let _ = joiner.leave(group);
            return Err(e.provider_error(Verb::AttachMcast));
        }
        self.groups.push(Joined {
            group,
            attached: joined.attach,
            _ip: None,
            through_joiner: Some(joined.ah),
        });
        Ok(())
    }
}
