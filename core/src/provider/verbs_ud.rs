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

use alloc::vec::Vec;

use crate::completion::{Completion, DatagramCompletion};
use crate::gid::Gid;
use crate::params::QpCaps;
use crate::provider::datagram::{DatagramProvider, Destination};
use crate::provider::{ProviderError, Verb};
use crate::verbs::{
    AddressHandle, AhAttr, Context, Cq, IpMembership, Pd, UdConfig, UdQp, VerbsError,
};
use crate::wr::{DatagramRequest, PostFailure, RecvRequest};

const EINVAL: i32 = 22;
const EAFNOSUPPORT: i32 = 97;

/// The verb and errno of a device-layer failure; a failure that is not a verb's keeps
/// `fallback` as the verb and `EINVAL`.
fn provider_error(e: VerbsError, fallback: Verb) -> ProviderError {
    match e {
        VerbsError::Call { verb, errno } => ProviderError { verb, errno },
        other => ProviderError {
            verb: fallback,
            errno: other.errno().unwrap_or(EINVAL),
        },
    }
}

/// One group this queue pair is attached to, and the IP membership that goes with it.
#[derive(Debug)]
struct Joined {
    group: Gid,
    _ip: Option<IpMembership>,
}

/// A datagram queue pair and the two completion queues it owns, as a [`DatagramProvider`].
#[derive(Debug)]
pub struct VerbsDatagram {
    // Field order is drop order: the IP memberships, then the queue pair (which detaches
    // from its groups before it is destroyed), then the CQs.
    groups: Vec<Joined>,
    qp: UdQp,
    send_cq: Cq,
    recv_cq: Cq,
}

impl VerbsDatagram {
    /// Creates a datagram queue pair with a send CQ and a receive CQ sized to its queues.
    pub fn new(ctx: &Context, pd: &Pd, cfg: &UdConfig) -> Result<Self, VerbsError> {
        let send_cq = ctx.create_cq(cfg.max_send_wr)?;
        let recv_cq = ctx.create_cq(cfg.max_recv_wr)?;
        Ok(Self {
            groups: Vec::new(),
            qp: pd.create_ud_qp(&send_cq, &recv_cq, cfg)?,
            send_cq,
            recv_cq,
        })
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
            Destination::Gid(g) => AhAttr::global(port, g, self.qp.route().gid_index),
            Destination::Lid(l) => AhAttr::lid(port, l),
        };
        self.qp
            .pd()
            .create_ah(&attr)
            .map_err(|e| provider_error(e, Verb::CreateAh))
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
            .map_err(|e| provider_error(e, Verb::PollCq))
    }

    #[inline]
    fn poll_recv(&mut self, out: &mut [DatagramCompletion]) -> Result<usize, ProviderError> {
        self.recv_cq
            .poll_datagrams(out)
            .map_err(|e| provider_error(e, Verb::PollCq))
    }

    fn set_error(&mut self) -> Result<(), ProviderError> {
        self.qp
            .set_error()
            .map_err(|e| provider_error(e, Verb::ModifyQpErr))
    }

    fn join_group(&mut self, group: Gid) -> Result<(), ProviderError> {
        let refuse = ProviderError {
            verb: Verb::AttachMcast,
            errno: EINVAL,
        };
        if !group.is_multicast() || self.groups.iter().any(|j| j.group == group) {
            return Err(refuse);
        }
        // The IP layer first: if it refuses, nothing is attached.
        let ip = match (group.ipv4(), self.gid().ipv4()) {
            (Some(g), Some(local)) => Some(
                IpMembership::join(g, local)
                    .map_err(|e| provider_error(e, Verb::IpAddMembership))?,
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
            .map_err(|e| provider_error(e, Verb::AttachMcast))?;
        self.groups.push(Joined { group, _ip: ip });
        Ok(())
    }

    fn leave_group(&mut self, group: Gid) -> Result<(), ProviderError> {
        let Some(i) = self.groups.iter().position(|j| j.group == group) else {
            return Err(ProviderError {
                verb: Verb::DetachMcast,
                errno: EINVAL,
            });
        };
        self.qp
            .detach_mcast(&group, 0)
            .map_err(|e| provider_error(e, Verb::DetachMcast))?;
        // Dropping the membership ends the IP layer's too.
        self.groups.swap_remove(i);
        Ok(())
    }
}
