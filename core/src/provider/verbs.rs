//! The real provider: an RC [`Qp`] with its own send and receive completion queues.

use crate::completion::Completion;
use crate::params::Mtu;
use crate::params::QpCaps;
use crate::provider::{Provider, ProviderError, QueuePair, Verb};
use crate::verbs::{
    Context, Cq, CqEvents, CqOptions, Pd, PreparedQp, Qp, QpConfig, Route, VerbsError,
};
use crate::wire::Endpoint;
use crate::wr::{PostFailure, RecvRequest, WorkRequest};
use alloc::sync::Arc;

/// A queue pair of a [`VerbsProvider`] waiting for its peer's endpoint.
#[derive(Debug)]
pub struct PreparedVerbs {
    qp: PreparedQp,
    send_cq: Cq,
    recv_cq: Cq,
    events: Option<Arc<CqEvents>>,
}

impl PreparedVerbs {
    /// Creates a queue pair with a send CQ and a receive CQ sized to its queues.
    pub fn new(ctx: &Context, pd: &Pd, cfg: &QpConfig) -> Result<Self, VerbsError> {
        let send_cq = ctx.create_cq(cfg.max_send_wr)?;
        let recv_cq = ctx.create_cq(cfg.max_recv_wr)?;
        Ok(Self {
            qp: pd.create_rc_qp(&send_cq, &recv_cq, cfg)?,
            send_cq,
            recv_cq,
            events: None,
        })
    }

    /// Like [`PreparedVerbs::new`], with both completion queues on a completion channel of
    /// their own: the channel built on the provider sleeps on their events under a blocking
    /// policy (`rverbs_std_shim::WaitPolicy::Block`), and
    /// [`VerbsProvider::wakeup_source`] hands them out for an event loop.
    pub fn with_events(ctx: &Context, pd: &Pd, cfg: &QpConfig) -> Result<Self, VerbsError> {
        let channel = ctx.create_completion_channel()?;
        let send_cq = ctx.create_cq_on(cfg.max_send_wr, &channel)?;
        let recv_cq = ctx.create_cq_on(cfg.max_recv_wr, &channel)?;
        let events = CqEvents::new(&channel, &[&send_cq, &recv_cq], false)?;
        Ok(Self {
            qp: pd.create_rc_qp(&send_cq, &recv_cq, cfg)?,
            send_cq,
            recv_cq,
            events: Some(Arc::new(events)),
        })
    }

    /// Like [`PreparedVerbs::new`], with completion queues whose completions carry hardware
    /// timestamps ([`CqOptions::timestamps`]): [`VerbsProvider::send_cq`]'s
    /// [`last_timestamp`](Cq::last_timestamp) after a wait. A device without them (rxe,
    /// siw) refuses here, with [`VerbsError::TimestampsUnsupported`] naming the device and
    /// what it lacks.
    pub fn with_timestamps(ctx: &Context, pd: &Pd, cfg: &QpConfig) -> Result<Self, VerbsError> {
        let opts = CqOptions::new().timestamps(true);
        let send_cq = ctx.create_cq_with_options(cfg.max_send_wr, None, opts)?;
        let recv_cq = ctx.create_cq_with_options(cfg.max_recv_wr, None, opts)?;
        Ok(Self {
            qp: pd.create_rc_qp(&send_cq, &recv_cq, cfg)?,
            send_cq,
            recv_cq,
            events: None,
        })
    }

    /// The route chosen for this queue pair (the GID index picked automatically when the
    /// configuration left it open).
    pub fn route(&self) -> Route {
        self.qp.route()
    }

    /// What the peer needs.
    pub fn endpoint(&self) -> Endpoint {
        self.qp.endpoint()
    }

    /// Connects to the peer.
    pub fn handshake(self, remote: &Endpoint) -> Result<VerbsProvider, VerbsError> {
        Ok(VerbsProvider {
            qp: self.qp.handshake(remote)?,
            send_cq: self.send_cq,
            recv_cq: self.recv_cq,
            events: self.events,
        })
    }
}

/// For the connection manager ([`crate::cm`]), which brings the queue pair up itself.
#[cfg(feature = "rdmacm")]
impl PreparedVerbs {
    /// The queue pair, waiting in INIT.
    pub(crate) fn qp(&self) -> &PreparedQp {
        &self.qp
    }

    /// The queue pair, to set attributes of INIT.
    pub(crate) fn qp_mut(&mut self) -> &mut PreparedQp {
        &mut self.qp
    }

    /// Connects the queue pair with `bring_up` and keeps its completion queues.
    pub(crate) fn connect_with(
        self,
        bring_up: impl FnOnce(PreparedQp) -> Result<Qp, VerbsError>,
    ) -> Result<VerbsProvider, VerbsError> {
        Ok(VerbsProvider {
            qp: bring_up(self.qp)?,
            send_cq: self.send_cq,
            recv_cq: self.recv_cq,
            events: self.events,
        })
    }
}

/// A connected RC queue pair as a [`Provider`], with the two completion queues it owns.
#[derive(Debug)]
pub struct VerbsProvider {
    // Field order is drop order: the queue pair goes before its completion queues.
    qp: Qp,
    send_cq: Cq,
    recv_cq: Cq,
    events: Option<Arc<CqEvents>>,
}

impl VerbsProvider {
    /// Wraps a connected queue pair and the two CQs it was created with, which must be its
    /// own: no other queue pair may complete into them (the engine counts completions per
    /// queue). Fails with [`VerbsError::InvalidArgument`] otherwise.
    pub fn from_parts(qp: Qp, send_cq: Cq, recv_cq: Cq) -> Result<Self, VerbsError> {
        if !qp.owns_cqs(&send_cq, &recv_cq) {
            return Err(VerbsError::InvalidArgument {
                what: "the completion queues are not this queue pair's alone",
            });
        }
        let events = match (send_cq.channel(), recv_cq.channel()) {
            (Some(a), Some(b)) if a.fd() == b.fd() => {
                Some(Arc::new(CqEvents::new(&a, &[&send_cq, &recv_cq], false)?))
            }
            _ => None,
        };
        Ok(Self {
            qp,
            send_cq,
            recv_cq,
            events,
        })
    }

    /// The completion events of the two queues, if they were created on one completion
    /// channel ([`PreparedVerbs::with_events`]).
    pub fn events(&self) -> Option<&CqEvents> {
        self.events.as_deref()
    }

    /// The queue pair.
    pub fn qp(&self) -> &Qp {
        &self.qp
    }

    /// The send completion queue (to ask its [`poll_path`](Cq::poll_path), or its
    /// [`last_timestamp`](Cq::last_timestamp)).
    pub fn send_cq(&self) -> &Cq {
        &self.send_cq
    }

    /// The receive completion queue.
    pub fn recv_cq(&self) -> &Cq {
        &self.recv_cq
    }

    /// The route this side sends on (GID index and GID, chosen automatically unless the
    /// configuration named one), readable from a connected channel:
    ///
    /// ```no_run
    /// #![forbid(unsafe_code)]
    /// # fn f(chan: &rverbs_core::channel::Channel<rverbs_core::provider::verbs::VerbsProvider>) {
    /// let route = chan.provider().route();
    /// let mtu = chan.provider().path_mtu();
    /// println!("GID index {} ({:?}), path MTU {mtu:?}", route.gid_index, route.gid);
    /// # }
    /// ```
    pub fn route(&self) -> Route {
        self.qp.route()
    }

    /// The path MTU negotiated with the peer: `channel.provider().path_mtu()`.
    pub fn path_mtu(&self) -> Mtu {
        self.qp.path_mtu()
    }
}

impl QueuePair for VerbsProvider {
    #[inline]
    fn qp_num(&self) -> u32 {
        self.qp.qp_num()
    }

    #[inline]
    fn caps(&self) -> QpCaps {
        // The device may grant deeper queues than asked for, and so more than the CQs (sized
        // to the request) can hold: never let the engine have more in flight than fits.
        let mut caps = self.qp.caps();
        caps.max_send_wr = caps.max_send_wr.min(self.send_cq.capacity());
        caps.max_recv_wr = caps.max_recv_wr.min(self.recv_cq.capacity());
        caps
    }

    #[inline(always)]
    unsafe fn post_send(&mut self, wrs: &[WorkRequest<'_>]) -> Result<(), PostFailure> {
        // SAFETY: the caller upholds the posting contract.
        unsafe { self.qp.post_send(wrs) }
    }

    #[inline(always)]
    unsafe fn send_list(&mut self) -> Option<crate::provider::SendList> {
        // The queue pair this provider owns, posts to and polls the completions of.
        Some(self.qp.send_list())
    }

    #[inline]
    unsafe fn post_recv(&mut self, wrs: &[RecvRequest<'_>]) -> Result<(), PostFailure> {
        // SAFETY: the caller upholds the posting contract.
        unsafe { self.qp.post_recv(wrs) }
    }

    fn set_error(&mut self) -> Result<(), ProviderError> {
        self.qp
            .set_error()
            .map_err(|e| e.provider_error(Verb::ModifyQpErr))
    }
}

impl Provider for VerbsProvider {
    #[inline]
    fn poll_send(&mut self, out: &mut [Completion]) -> Result<usize, ProviderError> {
        self.send_cq
            .poll(out)
            .map_err(|e| e.provider_error(Verb::PollCq))
    }
    #[inline]
    fn poll_recv(&mut self, out: &mut [Completion]) -> Result<usize, ProviderError> {
        self.recv_cq
            .poll(out)
            .map_err(|e| e.provider_error(Verb::PollCq))
    }

    fn wakeup_source(&self) -> Option<Arc<dyn crate::poll::Wakeup>> {
        self.events
            .clone()
            .map(|e| e as Arc<dyn crate::poll::Wakeup>)
    }

    fn last_send_timestamp(&self) -> Option<core::num::NonZeroU64> {
        self.send_cq.last_timestamp()
    }
}

/// A verbs completion queue can be shared by a node's queue pairs
/// ([`crate::provider::shared::SharedCqs`]).
impl crate::provider::CompletionQueue for Cq {
    #[inline]
    fn poll(&mut self, out: &mut [Completion]) -> Result<usize, ProviderError> {
        Cq::poll(self, out).map_err(|e| e.provider_error(Verb::PollCq))
    }

    #[inline]
    fn poll_each(
        &mut self,
        scratch: &mut [Completion],
        each: impl FnMut(&Completion),
    ) -> Result<usize, ProviderError> {
        Cq::poll_each(self, scratch, each)
    }

    #[inline]
    fn capacity(&self) -> u32 {
        Cq::capacity(self)
    }

    fn id(&self) -> Option<crate::provider::CqId> {
        Some(crate::provider::CqId {
            owner: self.as_raw() as usize,
            index: 0,
        })
    }
}

/// A connected verbs queue pair, for completion queues it shares with others.
impl QueuePair for Qp {
    #[inline]
    fn qp_num(&self) -> u32 {
        Qp::qp_num(self)
    }

    #[inline]
    fn caps(&self) -> QpCaps {
        Qp::caps(self)
    }

    #[inline(always)]
    unsafe fn post_send(&mut self, wrs: &[WorkRequest<'_>]) -> Result<(), PostFailure> {
        // SAFETY: the caller upholds the posting contract.
        unsafe { Qp::post_send(self, wrs) }
    }

    #[inline(always)]
    unsafe fn send_list(&mut self) -> Option<crate::provider::SendList> {
        Some(Qp::send_list(self))
    }

    #[inline]
    unsafe fn post_recv(&mut self, wrs: &[RecvRequest<'_>]) -> Result<(), PostFailure> {
        // SAFETY: the caller upholds the posting contract.
        unsafe { Qp::post_recv(self, wrs) }
    }

    fn set_error(&mut self) -> Result<(), ProviderError> {
        Qp::set_error(self).map_err(|e| e.provider_error(Verb::ModifyQpErr))
    }

    #[inline]
    fn srq_capacity(&self) -> u32 {
        Qp::srq_max_wr(self)
    }

    #[inline]
    unsafe fn post_srq_recv(&mut self, wrs: &[RecvRequest<'_>]) -> Result<(), PostFailure> {
        // SAFETY: the caller upholds the posting contract.
        unsafe { Qp::post_srq_recv(self, wrs) }
    }

    fn srq_probe(&self) -> Option<crate::memory::SrqProbe> {
        Qp::srq_probe(self)
    }

    fn arm_srq_limit(&mut self, limit: u32) -> Result<(), ProviderError> {
        Qp::arm_srq_limit(self, limit).map_err(|e| e.provider_error(Verb::ModifySrq))
    }

    fn completion_queues(&self) -> Option<[crate::provider::CqId; 2]> {
        let id = |owner| crate::provider::CqId { owner, index: 0 };
        let [send, recv] = self.cq_addresses();
        Some([id(send), id(recv)])
    }
}
