//! RC connections by address and port: [`connect`] (active side), [`Listener`] (passive
//! side), the [`Connection`] both give, and disconnecting a channel built on one.

use core::fmt;
use core::net::{IpAddr, SocketAddr};
use core::time::Duration;

use super::error::{CmCall, CmError, CmStep};
use super::ffi::{self, sys};
use super::id::{check, CmId};
use crate::channel::Channel;
use crate::completion::Completion;
use crate::params::QpCaps;
use crate::poll::{Backoff, Deadline, StaticClock};
use crate::provider::verbs::{PreparedVerbs, VerbsProvider};
use crate::provider::{Provider, ProviderError, QueuePair};
use crate::sge::RemoteMemory;
use crate::verbs::ffi::sys::ibv_qp_state;
use crate::verbs::{Pd, QpConfig, RdAtomic};
use crate::wire::ConnectData;
use crate::wr::{PostFailure, RecvRequest, WorkRequest};

/// How to connect or accept.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct CmConfig {
    /// The queue pair: queue depths, inline size, timers and retries, MTU limit. Its port
    /// and GID index are not used: the connection manager picks the port that owns the
    /// address, and the GID of that address.
    pub qp: QpConfig,
    /// How long each step may take: resolving the address and the route and getting the
    /// peer's answer ([`connect`]), a connection request ([`Listener::accept`]) and then
    /// the handshake, the peer's answer to a disconnect.
    pub timeout: Duration,
    /// Memory this side lets the peer access, sent in the connection's private data
    /// ([`crate::wire::cm`]); the peer reads it with [`Connection::remote_memory`]. The
    /// registration must grant the remote access the peer will use.
    pub offer: Option<RemoteMemory>,
    /// The local address to connect from ([`connect`]); `None` lets the routing table pick.
    pub local: Option<IpAddr>,
    /// Create the completion queues on a completion channel, so a channel built on the
    /// connection can sleep on their events (`rverbs_std_shim::WaitPolicy::Block`).
    pub completion_events: bool,
    /// Connection requests a listener queues before it accepts them.
    pub backlog: u16,
}

impl Default for CmConfig {
    fn default() -> Self {
        Self {
            qp: QpConfig::default(),
            timeout: Duration::from_secs(5),
            offer: None,
            local: None,
            completion_events: false,
            backlog: 16,
        }
    }
}

impl CmConfig {
    /// The defaults with `timeout` as the bound of every step.
    pub fn with_timeout(timeout: Duration) -> Self {
        Self {
            timeout,
            ..Self::default()
        }
    }

    /// This configuration, offering `memory` to the peer.
    pub fn offering(mut self, memory: RemoteMemory) -> Self {
        self.offer = Some(memory);
        self
    }
}

/// The connection manager's `int` milliseconds until `deadline` (at least 1).
fn millis_left(deadline: Deadline, clock: StaticClock) -> core::ffi::c_int {
    let ms = deadline.remaining(clock).as_millis().max(1);
    core::ffi::c_int::try_from(ms).unwrap_or(core::ffi::c_int::MAX)
}

/// Creates the completion queues and the queue pair on `pd`, at the port `id` is bound to,
/// in INIT with the connection manager's partition key.
fn prepare(pd: &Pd, id: &CmId, cfg: &CmConfig) -> Result<PreparedVerbs, CmError> {
    let mut qp = cfg.qp;
    qp.port = id.port();
    qp.gid_index = None;
    let ctx = pd.context();
    let mut prepared = if cfg.completion_events {
        PreparedVerbs::with_events(ctx, pd, &qp)?
    } else {
        PreparedVerbs::new(ctx, pd, &qp)?
    };
    let (init, _) = id.qp_attr(ibv_qp_state::IBV_QPS_INIT)?;
    prepared.qp_mut().set_pkey_index(init.pkey_index)?;
    Ok(prepared)
}

/// The connection parameters that carry our queue pair number, depths and private data.
fn conn_param(
    prepared: &PreparedVerbs,
    rd: RdAtomic,
    private: &[u8; crate::wire::CONNECT_DATA_LEN],
) -> sys::rdma_conn_param {
    let cfg = prepared.qp().config();
    sys::rdma_conn_param {
        private_data: private.as_ptr().cast(),
        private_data_len: private.len() as u8,
        responder_resources: rd.responder,
        initiator_depth: rd.initiator,
        flow_control: 1,
        // 3-bit fields of the CM's messages.
        retry_count: cfg.retry_count.get().min(7),
        rnr_retry_count: cfg.rnr_retry.code().min(7),
        srq: 0,
        qp_num: prepared.qp().qp_num(),
    }
}

/// Rejects the connection `id` is setting up, so the peer's wait ends at once with
/// [`CmError::Rejected`] instead of its timeout, and passes `e` on.
fn reject(id: &CmId, e: CmError) -> CmError {
    // SAFETY: the identifier is live; no private data.
    unsafe {
        sys::rdma_reject(id.as_raw(), core::ptr::null(), 0);
    }
    e
}

/// Connects an RC queue pair on `pd` to the listener at `to` (address and port), at most
/// [`CmConfig::timeout`] for each step: `rdma_resolve_addr`, `rdma_resolve_route`, then
/// `rdma_connect` with this side's queue pair and [`ConnectData`], and the peer's answer.
/// The queue pair is rverbs' own (so everything built on a
/// [`VerbsProvider`] works on it); the connection manager computes its path, the peer's
/// queue pair number and the PSNs.
///
/// Fails with [`CmError::Refused`] when nobody listens on that port,
/// [`CmError::Rejected`] when the peer refused, [`CmError::AddressError`] when no local
/// RDMA device reaches the address, [`CmError::WrongDevice`] when one does but it is not
/// `pd`'s, and [`CmError::TimedOut`] naming the step that did not finish.
pub fn connect(
    pd: &Pd,
    to: SocketAddr,
    cfg: &CmConfig,
    clock: StaticClock,
) -> Result<Connection, CmError> {
    use sys::rdma_cm_event_type as t;
    let timeout = cfg.timeout;
    // Each step gets the whole timeout, from when it starts.
    let fresh = || Deadline::after(clock, timeout);
    let id = CmId::new(sys::rdma_port_space::RDMA_PS_TCP)?;
    let mut dst = ffi::to_sockaddr(to);
    let mut src = cfg.local.map(ffi::ip_sockaddr);
    let src_ptr = src.as_mut().map_or(core::ptr::null_mut(), |s| {
        (s as *mut sys::sockaddr_storage).cast()
    });
    let deadline = fresh();
    // SAFETY: the identifier is live; both addresses are valid for the call (librdmacm
    // copies them).
    let rc = unsafe {
        sys::rdma_resolve_addr(
            id.as_raw(),
            src_ptr,
            (&raw mut dst).cast(),
            millis_left(deadline, clock),
        )
    };
    check(rc, CmCall::ResolveAddr)?;
    id.expect(
        t::RDMA_CM_EVENT_ADDR_RESOLVED,
        CmStep::ResolveAddress,
        to,
        deadline,
        timeout,
        clock,
    )?;
    id.check_device(pd, to)?;
    let deadline = fresh();
    // SAFETY: the identifier is live and its address resolved.
    let rc = unsafe { sys::rdma_resolve_route(id.as_raw(), millis_left(deadline, clock)) };
    check(rc, CmCall::ResolveRoute)?;
    id.expect(
        t::RDMA_CM_EVENT_ROUTE_RESOLVED,
        CmStep::ResolveRoute,
        to,
        deadline,
        timeout,
        clock,
    )?;
    let prepared = prepare(pd, &id, cfg)?;
    let ours = prepared.qp().rd_atomic();
    let private = ConnectData { memory: cfg.offer }.encode();
    let mut param = conn_param(&prepared, ours, &private);
    // SAFETY: the identifier is live with its route resolved; param and the private data it
    // points to are valid for the call (librdmacm copies them).
    let rc = unsafe { sys::rdma_connect(id.as_raw(), &mut param) };
    check(rc, CmCall::Connect)?;
    let answer = id.expect(
        t::RDMA_CM_EVENT_CONNECT_RESPONSE,
        CmStep::ConnectResponse,
        to,
        fresh(),
        timeout,
        clock,
    )?;
    let theirs = ConnectData::decode(answer.private_data())
        .map_err(|error| reject(&id, CmError::BadConnectData { peer: to, error }))?;
    // What the peer accepted: it answers our reads and atomics with its responder
    // resources and issues its own up to its initiator depth.
    let rd = RdAtomic {
        initiator: ours.initiator.min(answer.responder_resources),
        responder: ours.responder.min(answer.initiator_depth),
    };
    let provider = bring_up(&id, prepared, rd).map_err(|e| reject(&id, e))?;
    // SAFETY: the identifier is live; our queue pair is in RTS: tell the peer (RTU).
    let rc = unsafe { sys::rdma_establish(id.as_raw()) };
    check(rc, CmCall::Establish).map_err(|e| reject(&id, e))?;
    let local = id.local_addr().unwrap_or(to);
    Ok(Connection {
        provider,
        id,
        peer: to,
        local,
        remote_memory: theirs.memory,
        timeout,
        clock,
    })
}

/// RTR and RTS with the connection manager's attributes.
fn bring_up(id: &CmId, prepared: PreparedVerbs, rd: RdAtomic) -> Result<VerbsProvider, CmError> {
    let rtr = id.qp_attr(ibv_qp_state::IBV_QPS_RTR)?;
    let rts = id.qp_attr(ibv_qp_state::IBV_QPS_RTS)?;
    Ok(prepared.connect_with(|qp| qp.connect_with(rtr, rts, rd))?)
}

/// Listens for RC connections on an address and port; [`Listener::accept`] takes them one
/// at a time. The queue pairs are made on the listener's protection domain.
pub struct Listener {
    id: CmId,
    pd: Pd,
    cfg: CmConfig,
    clock: StaticClock,
    addr: SocketAddr,
}

impl fmt::Debug for Listener {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Listener")
            .field("addr", &self.addr)
            .field("device", &self.pd.context().name())
            .finish()
    }
}

impl Listener {
    /// Listens on `at` (`rdma_bind_addr`, `rdma_listen`). Port 0 picks a free port
    /// ([`Listener::local_addr`] says which). An address of a device other than `pd`'s is
    /// refused with [`CmError::WrongDevice`]; a wildcard address (`0.0.0.0`) takes requests
    /// on every device, and those for another device than `pd`'s are rejected when
    /// accepted.
    pub fn bind(
        pd: &Pd,
        at: SocketAddr,
        cfg: &CmConfig,
        clock: StaticClock,
    ) -> Result<Self, CmError> {
        let id = CmId::new(sys::rdma_port_space::RDMA_PS_TCP)?;
        let mut sa = ffi::to_sockaddr(at);
        // SAFETY: the identifier is live; the address is valid for the call.
        let rc = unsafe { sys::rdma_bind_addr(id.as_raw(), (&raw mut sa).cast()) };
        check(rc, CmCall::BindAddr)?;
        if !at.ip().is_unspecified() {
            id.check_device(pd, at)?;
        }
        // SAFETY: the identifier is live and bound.
        let rc = unsafe { sys::rdma_listen(id.as_raw(), core::ffi::c_int::from(cfg.backlog)) };
        check(rc, CmCall::Listen)?;
        let addr = id.local_addr().unwrap_or(at);
        Ok(Self {
            id,
            pd: pd.clone(),
            cfg: *cfg,
            clock,
            addr,
        })
    }

    /// The address and port it listens on.
    pub fn local_addr(&self) -> SocketAddr {
        self.addr
    }

    /// Waits for a connection request, at most [`CmConfig::timeout`], and accepts it
    /// ([`Listener::accept_until`]).
    pub fn accept(&self) -> Result<Connection, CmError> {
        self.accept_until(Deadline::after(self.clock, self.cfg.timeout))
    }

    /// Waits for a connection request until `deadline` (on the listener's clock) and accepts
    /// it: a queue pair on the listener's protection domain, brought up with the connection
    /// manager's attributes, then `rdma_accept` with this side's [`ConnectData`], and the
    /// peer's confirmation (at most [`CmConfig::timeout`] more).
    ///
    /// A request that is not from rverbs (its private data does not decode), or for another
    /// device, is rejected and reported ([`CmError::BadConnectData`],
    /// [`CmError::WrongDevice`]); the listener goes on listening, so call again for the next.
    pub fn accept_until(&self, deadline: Deadline) -> Result<Connection, CmError> {
        use sys::rdma_cm_event_type as t;
        let (timeout, clock) = (self.cfg.timeout, self.clock);
        let req = self.id.expect(
            t::RDMA_CM_EVENT_CONNECT_REQUEST,
            CmStep::ConnectRequest,
            self.addr,
            deadline,
            timeout,
            clock,
        )?;
        // SAFETY: a connection request's identifier is new and ours; its request event was
        // acknowledged when it was read.
        let id = unsafe { CmId::adopt(req.id) }?;
        let peer = id.peer_addr().unwrap_or(self.addr);
        let local = id.local_addr().unwrap_or(self.addr);
        let theirs = ConnectData::decode(req.private_data())
            .map_err(|error| reject(&id, CmError::BadConnectData { peer, error }))?;
        id.check_device(&self.pd, local)
            .map_err(|e| reject(&id, e))?;
        let prepared = prepare(&self.pd, &id, &self.cfg).map_err(|e| reject(&id, e))?;
        let ours = prepared.qp().rd_atomic();
        // The peer asked to read and use atomics up to its initiator depth and answers ours
        // up to its responder resources: take no more than either side can.
        let rd = RdAtomic {
            initiator: ours.initiator.min(req.responder_resources),
            responder: ours.responder.min(req.initiator_depth),
        };
        let private = ConnectData {
            memory: self.cfg.offer,
        }
        .encode();
        let mut param = conn_param(&prepared, rd, &private);
        let provider = bring_up(&id, prepared, rd).map_err(|e| reject(&id, e))?;
        // SAFETY: the identifier is live with a request pending; param and the private data
        // are valid for the call (librdmacm copies them).
        let rc = unsafe { sys::rdma_accept(id.as_raw(), &mut param) };
        check(rc, CmCall::Accept).map_err(|e| reject(&id, e))?;
        id.expect(
            t::RDMA_CM_EVENT_ESTABLISHED,
            CmStep::Established,
            peer,
            Deadline::after(clock, timeout),
            timeout,
            clock,
        )?;
        Ok(Connection {
            provider,
            id,
            peer,
            local,
            remote_memory: theirs.memory,
            timeout,
            clock,
        })
    }
}

/// A connected RC queue pair from the connection manager, as a [`Provider`]: build a
/// [`Channel`] on it. It keeps its connection manager identifier, so that
/// [`Channel::disconnect`] and [`Channel::peer_disconnected`] can end the connection
/// properly.
///
/// Dropping it without disconnecting destroys the queue pair and then the identifier (the
/// connection manager tells the peer).
pub struct Connection {
    // Field order is drop order: the queue pair and its completion queues go before the
    // identifier.
    provider: VerbsProvider,
    id: CmId,
    peer: SocketAddr,
    local: SocketAddr,
    remote_memory: Option<RemoteMemory>,
    timeout: Duration,
    clock: StaticClock,
}

impl fmt::Debug for Connection {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Connection")
            .field("local", &self.local)
            .field("peer", &self.peer)
            .field("qp", self.provider.qp())
            .field("remote_memory", &self.remote_memory)
            .finish()
    }
}

impl Connection {
    /// The peer's address and port.
    pub fn peer_addr(&self) -> SocketAddr {
        self.peer
    }

    /// This side's address and port.
    pub fn local_addr(&self) -> SocketAddr {
        self.local
    }

    /// The memory the peer offered in its connect data ([`CmConfig::offer`]), to name in
    /// RDMA writes, reads and atomics.
    pub fn remote_memory(&self) -> Option<RemoteMemory> {
        self.remote_memory
    }

    /// The queue pair with its completion queues (route, path MTU, the queue pair itself).
    pub fn verbs(&self) -> &VerbsProvider {
        &self.provider
    }

    /// Reads the peer's disconnect, if it came: `Ok(true)` then. Never blocks.
    fn take_disconnect(&self) -> Result<bool, CmError> {
        use sys::rdma_cm_event_type as t;
        while let Some(ev) = self.id.events().try_next()? {
            if ev.kind.0 == t::RDMA_CM_EVENT_DISCONNECTED {
                return Ok(true);
            }
        }
        Ok(false)
    }

    /// `rdma_disconnect`. Fails only if the connection is still up.
    fn send_disconnect(&self) -> Result<(), CmError> {
        // SAFETY: the identifier is live.
        let rc = unsafe { sys::rdma_disconnect(self.id.as_raw()) };
        check(rc, CmCall::Disconnect)
    }
}

impl QueuePair for Connection {
    #[inline]
    fn caps(&self) -> QpCaps {
        self.provider.caps()
    }

    #[inline]
    fn qp_num(&self) -> u32 {
        self.provider.qp_num()
    }

    #[inline]
    unsafe fn post_send(&mut self, wrs: &[WorkRequest<'_>]) -> Result<(), PostFailure> {
        // SAFETY: the caller upholds the posting contract.
        unsafe { self.provider.post_send(wrs) }
    }

    /// The connection's queue pair's own list: a batch on an rdmacm connection is built in
    /// place like any verbs queue pair's.
    #[inline(always)]
    unsafe fn send_list(&mut self) -> Option<crate::provider::SendList> {
        // SAFETY: forwarded: the list is this connection's own queue pair's, whose
        // completions this connection's polls report (they forward to the same provider).
        unsafe { self.provider.send_list() }
    }

    #[inline]
    unsafe fn post_recv(&mut self, wrs: &[RecvRequest<'_>]) -> Result<(), PostFailure> {
        // SAFETY: the caller upholds the posting contract.
        unsafe { self.provider.post_recv(wrs) }
    }

    fn set_error(&mut self) -> Result<(), ProviderError> {
        self.provider.set_error()
    }
}

impl Provider for Connection {
    #[inline]
    fn poll_send(&mut self, out: &mut [Completion]) -> Result<usize, ProviderError> {
        self.provider.poll_send(out)
    }

    #[inline]
    fn poll_recv(&mut self, out: &mut [Completion]) -> Result<usize, ProviderError> {
        self.provider.poll_recv(out)
    }

    fn wakeup_source(&self) -> Option<alloc::sync::Arc<dyn crate::poll::Wakeup>> {
        self.provider.wakeup_source()
    }
}

/// Ending a connection made by the connection manager.
impl<B: Backoff, const R: usize> Channel<Connection, B, R> {
    /// Ends the connection from this side: waits (at most the channel's timeout) until the
    /// sends posted so far completed, so they reach the peer; disconnects
    /// (`rdma_disconnect`: the peer's connection manager reports `DISCONNECTED`, see
    /// [`Channel::peer_disconnected`]); and flushes the receives still posted. It does not
    /// wait for the peer to answer: the connection manager finishes that on its own. Every
    /// later call on the channel fails with
    /// [`ChannelError::Disconnected`](crate::channel::ChannelError::Disconnected).
    /// Disconnecting a channel that is closed already (by either side) is not an error.
    ///
    /// If the sends do not complete in time the channel is closed all the same, and the
    /// error says why.
    pub fn disconnect(&mut self) -> Result<(), CmError> {
        if self.is_closed() {
            return Ok(());
        }
        let sent = self.wait_sends();
        let told = self.provider().send_disconnect();
        self.close();
        sent?;
        if told.is_err() && self.provider().take_disconnect()? {
            // The peer was first; our call found the connection down already.
            return Ok(());
        }
        told
    }

    /// Whether the peer disconnected; never blocks, does not allocate. When it did, this
    /// side answers (`rdma_disconnect`) and the channel is closed as by
    /// [`Channel::disconnect`]: outstanding work is flushed, later calls fail with
    /// [`ChannelError::Disconnected`](crate::channel::ChannelError::Disconnected).
    ///
    /// The channel's own waits do not watch for a disconnect: a receive the peer will never
    /// answer ends at the channel's timeout. Loops that wait for a peer that may leave call
    /// this between waits.
    pub fn peer_disconnected(&mut self) -> Result<bool, CmError> {
        if self.is_closed() {
            return Ok(true);
        }
        if !self.provider().take_disconnect()? {
            return Ok(false);
        }
        // Answer the peer (its disconnect completes at once instead of timing out); the
        // connection is down either way.
        let _ = self.provider().send_disconnect();
        self.close();
        Ok(true)
    }

    /// Waits until the peer disconnects, at most until `deadline` on the channel's clock;
    /// then as [`Channel::peer_disconnected`]. Fails with [`CmError::TimedOut`] if it did
    /// not (the channel stays open).
    pub fn wait_disconnect(&mut self, deadline: Deadline) -> Result<(), CmError> {
        use sys::rdma_cm_event_type as t;
        if self.is_closed() {
            return Ok(());
        }
        let conn = self.provider();
        let (peer, timeout, clock) = (conn.peer, conn.timeout, conn.clock);
        let waited = deadline.remaining(clock);
        match conn.id.expect(
            t::RDMA_CM_EVENT_DISCONNECTED,
            CmStep::PeerDisconnect,
            peer,
            deadline,
            timeout,
            clock,
        ) {
            Ok(_) | Err(CmError::Disconnected { .. }) => {}
            Err(CmError::TimedOut { addr, step, .. }) => {
                return Err(CmError::TimedOut {
                    addr,
                    step,
                    after: waited,
                })
            }
            Err(e) => return Err(e),
        }
        let _ = self.provider().send_disconnect();
        self.close();
        Ok(())
    }
}
