//! Reliable-connected queue pairs: creation, bring-up (INIT, RTR, RTS) and posting.

use core::fmt;
use core::mem::MaybeUninit;
use core::ptr::NonNull;
use core::time::Duration;

use alloc::sync::Arc;

use super::cq::{Cq, CqInner};
use super::create::{Ask, Created, Kind};
use super::destroy::Owned;
use super::device::{LinkLayer, Route};
use super::error::{Result, Verb, VerbsError};
use super::ffi::{self, sys};
use super::mr::AccessFlags;
use super::pd::Pd;
use super::recv_chain::post_recv_wrs;
use super::send_ex::{ConnectedSender, LegacyReason, PostPath};
use super::srq::{Srq, SrqInner};
use crate::params::{AckTimeout, Mtu, Psn, PsnSource, QpCaps, RetryCount, RnrRetry, RnrTimer};
use crate::wire::Endpoint;
use crate::wr::{PostFailure, RecvRequest, SendFlags, WorkRequest};

/// Typed queue-pair knobs. `Default` suits a low-latency RC link on one fabric.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct QpConfig {
    /// Port number (from 1).
    pub port: u8,
    /// Source GID index; `None` picks [`super::Context::default_route`].
    pub gid_index: Option<u8>,
    /// Path MTU; `None` uses the smaller of both ports' active MTUs.
    pub mtu: Option<Mtu>,
    /// Local ACK timeout.
    pub ack_timeout: AckTimeout,
    /// Transport retries.
    pub retry_count: RetryCount,
    /// Receiver-not-ready retries.
    pub rnr_retry: RnrRetry,
    /// Minimum RNR NAK timer we ask senders to wait.
    pub rnr_timer: RnrTimer,
    /// Send queue depth.
    pub max_send_wr: u32,
    /// Receive queue depth.
    pub max_recv_wr: u32,
    /// Scatter/gather entries per send request.
    pub max_send_sge: u32,
    /// Scatter/gather entries per receive request.
    pub max_recv_sge: u32,
    /// Largest inline payload (the device may grant more).
    pub max_inline_data: u32,
    /// Outstanding RDMA reads/atomics, as initiator and as responder: clamped to what the
    /// device allows (`max_qp_init_rd_atom` as initiator, `max_qp_rd_atom` as responder,
    /// from `ibv_query_device`) when the queue pair is created.
    pub max_rd_atomic: u8,
    /// Traffic class (RoCE DSCP/ECN bits; IB GRH traffic class).
    pub traffic_class: u8,
    /// Service level.
    pub service_level: u8,
    /// Hop limit for routed (GRH) traffic.
    pub hop_limit: u8,
    /// Where the first PSN this queue pair sends comes from (its peer expects it). The
    /// default, [`PsnSource::Predictable`], is for tests and the software model: on a network
    /// others can reach, draw it ([`PsnSource::Draw`]; rverbs' std crates do).
    pub send_psn: PsnSource,
    /// Remote access this QP accepts (by default remote read, write and atomics; each
    /// region still grants its own).
    pub access: AccessFlags,
}

impl Default for QpConfig {
    fn default() -> Self {
        Self {
            port: 1,
            gid_index: None,
            mtu: None,
            ack_timeout: AckTimeout::default(),
            retry_count: RetryCount::default(),
            rnr_retry: RnrRetry::default(),
            rnr_timer: RnrTimer::default(),
            max_send_wr: 128,
            max_recv_wr: 128,
            max_send_sge: 4,
            max_recv_sge: 4,
            max_inline_data: 64,
            max_rd_atomic: 16,
            traffic_class: 0,
            service_level: 0,
            hop_limit: 64,
            send_psn: PsnSource::Predictable,
            access: AccessFlags::LOCAL_WRITE
                .union(AccessFlags::REMOTE_WRITE)
                .union(AccessFlags::REMOTE_READ)
                .union(AccessFlags::REMOTE_ATOMIC),
        }
    }
}

impl QpConfig {
    /// How long the device keeps retrying a request its peer does not acknowledge before it
    /// fails the request with `RetryExceeded`, as wall time: the ACK timeout once per try,
    /// `retry_count + 1` tries. `None` when the ACK timeout is infinite.
    ///
    /// The specification lets a device wait up to four times the nominal ACK timeout per try,
    /// so hardware may take up to 4x this. On SoftRoCE a retry count of 7 means "retry
    /// forever" (see [`RetryCount`]): there nothing fails on its own and the channel's
    /// timeout ([`ChannelConfig::timeout`](crate::channel::ChannelConfig)) is the bound. The
    /// defaults (67 ms, 7 retries) give 537 ms on hardware. docs/reliability.md ("Transport
    /// settings as wall time") says why.
    ///
    /// ```
    /// use core::time::Duration;
    /// use rverbs_core::verbs::QpConfig;
    /// let t = QpConfig::default().retry_wall_time().unwrap();
    /// assert!(t > Duration::from_millis(530) && t < Duration::from_millis(540));
    /// ```
    pub fn retry_wall_time(&self) -> Option<Duration> {
        let per_try = self.ack_timeout.duration()?;
        Some(per_try.saturating_mul(u32::from(self.retry_count.get()) + 1))
    }

    /// How long a sender keeps retrying a send its receiver has no buffer for (RNR NAKs)
    /// before it fails with `RnrRetryExceeded`, as wall time: the RNR timer the *receiver*
    /// asked for, once per retry. The receiver's queue pair sets that timer (its
    /// `rnr_timer`), so this assumes both sides use this configuration. `None` for
    /// [`RnrRetry::Infinite`].
    ///
    /// ```
    /// use core::time::Duration;
    /// use rverbs_core::verbs::QpConfig;
    /// // 6 retries of 0.64 ms.
    /// assert_eq!(QpConfig::default().rnr_wall_time(), Some(Duration::from_micros(3840)));
    /// ```
    pub fn rnr_wall_time(&self) -> Option<Duration> {
        match self.rnr_retry {
            RnrRetry::Infinite => None,
            RnrRetry::Times(_) => Some(
                self.rnr_timer
                    .duration()
                    .saturating_mul(u32::from(self.rnr_retry.code())),
            ),
        }
    }
}

/// How many RDMA reads and atomics a queue pair may have outstanding.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RdAtomic {
    /// As initiator (`max_rd_atomic`, at most the device's `max_qp_init_rd_atom`).
    pub initiator: u8,
    /// As responder (`max_dest_rd_atomic`, at most the device's `max_qp_rd_atom`).
    pub responder: u8,
}

/// A queue pair, destroyed on drop; its owner's field order keeps its PD and CQs alive
/// until after that.
pub(super) struct QpHandle {
    pub(super) raw: Owned<sys::ibv_qp>,
}

impl QpHandle {
    /// Moves the queue pair to the error state: outstanding requests complete as flushed.
    pub(super) fn set_error(&mut self) -> Result<()> {
        let mut attr = zeroed_attr();
        attr.qp_state = sys::ibv_qp_state::IBV_QPS_ERR;
        modify(
            self.raw.get(),
            &mut attr,
            sys::ibv_qp_attr_mask::IBV_QP_STATE.0,
            Verb::ModifyQpErr,
        )
    }
}

/// A queue pair in the INIT state, waiting for its peer's [`Endpoint`].
pub struct PreparedQp {
    handle: QpHandle,
    cfg: QpConfig,
    route: Route,
    link_layer: LinkLayer,
    lid: u16,
    port_mtu: Mtu,
    psn: Psn,
    caps: QpCaps,
    rd_atomic: RdAtomic,
    // Keep the CQs (and the shared receive queue) alive as long as the QP; polling them is
    // their owners' business.
    send_cq: Arc<CqInner>,
    recv_cq: Arc<CqInner>,
    srq: Option<Arc<SrqInner>>,
    srq_wr: u32,
    pd: Pd,
    /// The queue pair's extended form (`ibv_qp_to_qp_ex`), or why it has none.
    ex: core::result::Result<NonNull<sys::ibv_qp_ex>, LegacyReason>,
}

// SAFETY: a QP may be used from any thread; PreparedQp owns its handle exclusively.
unsafe impl Send for PreparedQp {}

impl fmt::Debug for PreparedQp {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PreparedQp")
            .field("qpn", &self.qp_num())
            .field("route", &self.route)
            .field("caps", &self.caps)
            .finish()
    }
}

pub(super) fn modify(
    qp: NonNull<sys::ibv_qp>,
    attr: &mut sys::ibv_qp_attr,
    mask: u32,
    verb: Verb,
) -> Result<()> {
    // SAFETY: qp is live; attr is a fully initialised attribute struct.
    let rc = unsafe { sys::ibv_modify_qp(qp.as_ptr(), attr, mask as core::ffi::c_int) };
    if rc == 0 {
        Ok(())
    } else {
        Err(VerbsError::Call { verb, errno: rc })
    }
}

/// The transport settings a queue pair in RTS runs with, as the verbs codes
/// ([`Qp::transport`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Transport {
    /// The ACK timeout's code ([`AckTimeout::code`]).
    pub ack_timeout: u8,
    /// The retry count.
    pub retry_count: u8,
    /// The RNR retry code ([`RnrRetry::code`]: 7 is infinite).
    pub rnr_retry: u8,
    /// The RNR timer's code ([`RnrTimer::code`]).
    pub rnr_timer: u8,
}

impl Transport {
    pub(crate) fn asked(cfg: &QpConfig) -> Self {
        Self {
            ack_timeout: cfg.ack_timeout.code(),
            retry_count: cfg.retry_count.get(),
            rnr_retry: cfg.rnr_retry.code(),
            rnr_timer: cfg.rnr_timer.code(),
        }
    }

    /// The first setting the device changed, as an error.
    pub(crate) fn check(self, granted: Self) -> Result<()> {
        let pairs = [
            ("ack_timeout", self.ack_timeout, granted.ack_timeout),
            ("retry_count", self.retry_count, granted.retry_count),
            ("rnr_retry", self.rnr_retry, granted.rnr_retry),
            ("rnr_timer", self.rnr_timer, granted.rnr_timer),
        ];
        match pairs.into_iter().find(|(_, a, g)| a != g) {
            None => Ok(()),
            Some((setting, asked, granted)) => Err(VerbsError::Clamped {
                setting,
                asked,
                granted,
            }),
        }
    }
}

/// The transport settings the device reports for `qp` (`ibv_query_qp`), or `None` when the
/// driver cannot answer (`EOPNOTSUPP`).
fn query_transport(qp: NonNull<sys::ibv_qp>) -> Result<Option<Transport>> {
    use sys::ibv_qp_attr_mask as m;
    let mut attr = zeroed_attr();
    // SAFETY: ibv_qp_init_attr is plain C data for which all-zero is valid.
    let mut init: sys::ibv_qp_init_attr = unsafe { MaybeUninit::zeroed().assume_init() };
    let mask =
        (m::IBV_QP_TIMEOUT | m::IBV_QP_RETRY_CNT | m::IBV_QP_RNR_RETRY | m::IBV_QP_MIN_RNR_TIMER).0;
    // SAFETY: qp is live; attr and init are initialised structs the verb writes into.
    let rc =
        unsafe { sys::ibv_query_qp(qp.as_ptr(), &mut attr, mask as core::ffi::c_int, &mut init) };
    match rc {
        0 => Ok(Some(Transport {
            ack_timeout: attr.timeout,
            retry_count: attr.retry_cnt,
            rnr_retry: attr.rnr_retry,
            rnr_timer: attr.min_rnr_timer,
        })),
        ffi::EOPNOTSUPP => Ok(None),
        errno => Err(VerbsError::Call {
            verb: Verb::QueryQp,
            errno,
        }),
    }
}

/// Asks the device what transport settings the queue pair runs with and refuses it if they
/// are not the ones `cfg` asked for ([`VerbsError::Clamped`]). A driver that cannot answer
/// (`EOPNOTSUPP`) is taken at its word. (A driver that answers without filling these fields
/// would have every queue pair refused; rxe and the RDMA NICs rverbs targets fill them.)
fn check_transport(qp: NonNull<sys::ibv_qp>, cfg: &QpConfig) -> Result<()> {
    match query_transport(qp)? {
        Some(granted) => Transport::asked(cfg).check(granted),
        None => Ok(()),
    }
}

pub(super) fn zeroed_attr() -> sys::ibv_qp_attr {
    // SAFETY: ibv_qp_attr is plain C data for which all-zero is valid.
    unsafe { MaybeUninit::zeroed().assume_init() }
}

impl Pd {
    /// Creates an RC queue pair on `cfg.port` and moves it to INIT.
    pub fn create_rc_qp(&self, send_cq: &Cq, recv_cq: &Cq, cfg: &QpConfig) -> Result<PreparedQp> {
        self.create_rc(send_cq, recv_cq, None, cfg)
    }

    /// Creates an RC queue pair that takes its receives from `srq` (its own receive queue
    /// is unused: `cfg.max_recv_wr` is ignored and its caps say 0), and moves it to INIT.
    /// Receive completions go to `recv_cq`. The queue pair keeps `srq` alive.
    pub fn create_rc_qp_on_srq(
        &self,
        send_cq: &Cq,
        recv_cq: &Cq,
        srq: &Srq,
        cfg: &QpConfig,
    ) -> Result<PreparedQp> {
        self.create_rc(send_cq, recv_cq, Some(srq), cfg)
    }

    fn create_rc(
        &self,
        send_cq: &Cq,
        recv_cq: &Cq,
        srq: Option<&Srq>,
        cfg: &QpConfig,
    ) -> Result<PreparedQp> {
        let dev = self.context().query_device()?;
        let clamp = |limit: u32| {
            cfg.max_rd_atomic
                .min(u8::try_from(limit).unwrap_or(u8::MAX))
        };
        let rd_atomic = RdAtomic {
            initiator: clamp(dev.max_qp_init_rd_atom),
            responder: clamp(dev.max_qp_rd_atom),
        };
        let ask = Ask {
            port: cfg.port,
            gid_index: cfg.gid_index,
            caps: QpCaps {
                max_send_wr: cfg.max_send_wr,
                max_recv_wr: cfg.max_recv_wr,
                max_send_sge: cfg.max_send_sge,
                max_recv_sge: cfg.max_recv_sge,
                max_inline_data: cfg.max_inline_data,
            },
            kind: Kind::Rc {
                access: cfg.access,
                srq,
            },
        };
        let Created {
            handle,
            ex,
            qpn,
            caps,
            route,
            port,
        } = self.create_at_init(send_cq, recv_cq, &ask)?;
        let psn = cfg
            .send_psn
            .first_psn(qpn)
            .ok_or(VerbsError::InvalidArgument {
                what: "the PSN source had no random bits for the queue pair's first PSN",
            })?;
        Ok(PreparedQp {
            handle,
            cfg: *cfg,
            route,
            link_layer: port.link_layer,
            lid: port.lid,
            port_mtu: port.active_mtu,
            psn,
            caps,
            rd_atomic,
            send_cq: send_cq.keep_alive(),
            recv_cq: recv_cq.keep_alive(),
            srq: srq.map(Srq::keep_alive),
            srq_wr: srq.map_or(0, Srq::max_wr),
            pd: self.clone(),
            ex,
        })
    }
}

impl PreparedQp {
    /// The QP number.
    pub fn qp_num(&self) -> u32 {
        // SAFETY: the QP is live.
        unsafe { (*self.handle.raw.as_ptr()).qp_num }
    }

    /// What the device granted.
    pub fn caps(&self) -> QpCaps {
        self.caps
    }

    /// Outstanding RDMA reads and atomics the queue pair will be set up for:
    /// [`QpConfig::max_rd_atomic`] clamped to the device's limits.
    pub fn rd_atomic(&self) -> RdAtomic {
        self.rd_atomic
    }

    /// The route this side uses.
    pub fn route(&self) -> Route {
        self.route
    }

    /// What the peer needs to connect to this QP.
    pub fn endpoint(&self) -> Endpoint {
        Endpoint {
            qpn: self.qp_num(),
            psn: self.psn,
            lid: self.lid,
            gid: self.route.gid.0,
            global: self.route.global,
            mtu: self.cfg.mtu.unwrap_or(self.port_mtu),
        }
    }

    /// Connects to `remote`: RTR then RTS. On failure the QP is dropped (destroyed).
    pub fn handshake(self, remote: &Endpoint) -> Result<Qp> {
        let raw = self.handle.raw.get();
        let cfg = &self.cfg;
        let global = self.link_layer == LinkLayer::Ethernet || remote.global || self.route.global;
        if global && remote.gid == [0; 16] {
            return Err(VerbsError::InvalidArgument {
                what: "the peer's endpoint has no GID, but this port routes by GID (RoCE)",
            });
        }
        let mtu = cfg.mtu.unwrap_or(self.port_mtu).min(remote.mtu);
        let mut attr = zeroed_attr();
        attr.qp_state = sys::ibv_qp_state::IBV_QPS_RTR;
        attr.path_mtu = sys::ibv_mtu::from(mtu.code());
        attr.dest_qp_num = remote.qpn;
        attr.rq_psn = remote.psn.get();
        attr.max_dest_rd_atomic = self.rd_atomic.responder;
        attr.min_rnr_timer = cfg.rnr_timer.code();
        attr.ah_attr.dlid = remote.lid;
        attr.ah_attr.sl = cfg.service_level;
        attr.ah_attr.port_num = cfg.port;
        if global {
            attr.ah_attr.is_global = 1;
            attr.ah_attr.grh.dgid.raw = remote.gid;
            attr.ah_attr.grh.sgid_index = self.route.gid_index;
            attr.ah_attr.grh.hop_limit = cfg.hop_limit;
            attr.ah_attr.grh.traffic_class = cfg.traffic_class;
        }
        use sys::ibv_qp_attr_mask as m;
        modify(
            raw,
            &mut attr,
            (m::IBV_QP_STATE
                | m::IBV_QP_AV
                | m::IBV_QP_PATH_MTU
                | m::IBV_QP_DEST_QPN
                | m::IBV_QP_RQ_PSN
                | m::IBV_QP_MAX_DEST_RD_ATOMIC
                | m::IBV_QP_MIN_RNR_TIMER)
                .0,
            Verb::ModifyQpRtr,
        )?;
        let mut attr = zeroed_attr();
        attr.qp_state = sys::ibv_qp_state::IBV_QPS_RTS;
        attr.sq_psn = self.psn.get();
        attr.timeout = cfg.ack_timeout.code();
        attr.retry_cnt = cfg.retry_count.get();
        attr.rnr_retry = cfg.rnr_retry.code();
        attr.max_rd_atomic = self.rd_atomic.initiator;
        modify(
            raw,
            &mut attr,
            (m::IBV_QP_STATE
                | m::IBV_QP_SQ_PSN
                | m::IBV_QP_TIMEOUT
                | m::IBV_QP_RETRY_CNT
                | m::IBV_QP_RNR_RETRY
                | m::IBV_QP_MAX_QP_RD_ATOMIC)
                .0,
            Verb::ModifyQpRts,
        )?;
        check_transport(raw, cfg)?;
        let (route, rd_atomic) = (self.route, self.rd_atomic);
        Ok(self.into_rts(route, mtu, rd_atomic, *remote))
    }

    /// The queue pair, now in RTS on `route` with `path_mtu`, `rd_atomic` and `remote`.
    fn into_rts(self, route: Route, path_mtu: Mtu, rd_atomic: RdAtomic, remote: Endpoint) -> Qp {
        Qp {
            qpn: self.qp_num(),
            caps: self.caps,
            route,
            path_mtu,
            rd_atomic,
            remote,
            handle: self.handle,
            _send_cq: self.send_cq,
            _recv_cq: self.recv_cq,
            srq: self.srq,
            srq_wr: self.srq_wr,
            _pd: self.pd,
            // SAFETY: the extended form lives as long as the queue pair, which the Qp owns.
            sender: unsafe { ConnectedSender::new(self.ex) },
        }
    }
}

/// The bring-up the RDMA connection manager drives ([`crate::cm`]): it computes the path,
/// the peer's queue pair number and both PSNs (`rdma_init_qp_attr`); this queue pair's own
/// configuration still decides timers and retries.
#[cfg(feature = "rdmacm")]
impl PreparedQp {
    /// The configuration the queue pair was made with.
    pub(crate) fn config(&self) -> &QpConfig {
        &self.cfg
    }

    /// INIT to INIT with the partition key index of the connection manager's path.
    pub(crate) fn set_pkey_index(&mut self, index: u16) -> Result<()> {
        let mut attr = zeroed_attr();
        attr.qp_state = sys::ibv_qp_state::IBV_QPS_INIT;
        attr.pkey_index = index;
        use sys::ibv_qp_attr_mask as m;
        modify(
            self.handle.raw.get(),
            &mut attr,
            (m::IBV_QP_STATE | m::IBV_QP_PKEY_INDEX).0,
            Verb::ModifyQpInit,
        )
    }

    /// RTR, then RTS, from the attributes the connection manager computed for each
    /// (`rtr`/`rts` with their masks), with this queue pair's RNR timer, ACK timeout and
    /// retry counts, its MTU limit, and the read/atomic depths `rd_atomic` negotiated with
    /// the peer. On failure the queue pair is dropped (destroyed).
    pub(crate) fn connect_with(
        self,
        rtr: (sys::ibv_qp_attr, core::ffi::c_int),
        rts: (sys::ibv_qp_attr, core::ffi::c_int),
        rd_atomic: RdAtomic,
    ) -> Result<Qp> {
        use sys::ibv_qp_attr_mask as m;
        let cfg = self.cfg;
        let (mut attr, mask) = rtr;
        let cm_mtu = u8::try_from(attr.path_mtu)
            .ok()
            .and_then(Mtu::from_code)
            .ok_or(VerbsError::InvalidArgument {
                what: "the connection manager gave no valid path MTU",
            })?;
        let mtu = cfg.mtu.map_or(cm_mtu, |limit| limit.min(cm_mtu));
        attr.path_mtu = sys::ibv_mtu::from(mtu.code());
        attr.min_rnr_timer = cfg.rnr_timer.code();
        attr.max_dest_rd_atomic = rd_atomic.responder;
        let extra = (m::IBV_QP_PATH_MTU | m::IBV_QP_MIN_RNR_TIMER | m::IBV_QP_MAX_DEST_RD_ATOMIC).0;
        // The masks are bit sets of non-negative flags: the casts keep every bit.
        modify(
            self.handle.raw.get(),
            &mut attr,
            mask as u32 | extra,
            Verb::ModifyQpRtr,
        )?;
        let global = attr.ah_attr.is_global != 0;
        let route = if global {
            self.pd
                .context()
                .route(attr.ah_attr.port_num, Some(attr.ah_attr.grh.sgid_index))?
        } else {
            self.route
        };
        let remote = Endpoint {
            qpn: attr.dest_qp_num,
            psn: Psn::wrapping(attr.rq_psn),
            lid: attr.ah_attr.dlid,
            // SAFETY: every bit pattern is a valid GID; `raw` is the union's byte view.
            gid: unsafe { attr.ah_attr.grh.dgid.raw },
            global,
            mtu,
        };
        let (mut attr, mask) = rts;
        attr.timeout = cfg.ack_timeout.code();
        attr.retry_cnt = cfg.retry_count.get();
        attr.rnr_retry = cfg.rnr_retry.code();
        attr.max_rd_atomic = rd_atomic.initiator;
        let extra = (m::IBV_QP_TIMEOUT
            | m::IBV_QP_RETRY_CNT
            | m::IBV_QP_RNR_RETRY
            | m::IBV_QP_MAX_QP_RD_ATOMIC)
            .0;
        modify(
            self.handle.raw.get(),
            &mut attr,
            mask as u32 | extra,
            Verb::ModifyQpRts,
        )?;
        check_transport(self.handle.raw.get(), &cfg)?;
        Ok(self.into_rts(route, mtu, rd_atomic, remote))
    }
}

/// A connected RC queue pair (RTS).
pub struct Qp {
    qpn: u32,
    caps: QpCaps,
    route: Route,
    path_mtu: Mtu,
    rd_atomic: RdAtomic,
    remote: Endpoint,
    // Field order is drop order: the QP goes before its CQs, SRQ and PD.
    handle: QpHandle,
    _send_cq: Arc<CqInner>,
    _recv_cq: Arc<CqInner>,
    srq: Option<Arc<SrqInner>>,
    srq_wr: u32,
    _pd: Pd,
    sender: ConnectedSender,
}

// SAFETY: a QP may be posted to from any thread; Qp owns its handle and posting needs &mut
// (its send chain holds pointers only the posting thread writes and the driver reads during
// a post; its extended queue pair's `wr_id`/`wr_flags` and critical sections are used only
// inside a post).
unsafe impl Send for Qp {}

impl fmt::Debug for Qp {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Qp")
            .field("qpn", &self.qpn)
            .field("remote_qpn", &self.remote.qpn)
            .field("path_mtu", &self.path_mtu)
            .field("caps", &self.caps)
            .finish()
    }
}

impl Qp {
    /// The QP number.
    #[inline]
    pub fn qp_num(&self) -> u32 {
        self.qpn
    }

    /// What the device granted.
    #[inline]
    pub fn caps(&self) -> QpCaps {
        self.caps
    }

    /// Whether `send` and `recv` are the completion queues this queue pair was created with,
    /// and nothing else completes into them (no other queue pair keeps them alive).
    pub(crate) fn owns_cqs(&self, send: &Cq, recv: &Cq) -> bool {
        let exclusive = |mine: &Arc<CqInner>, given: &Cq| {
            let given = given.keep_alive();
            // Ours, the Cq handle's and the clone just taken: nobody else's.
            Arc::ptr_eq(mine, &given) && Arc::strong_count(&given) == 3
        };
        exclusive(&self._send_cq, send) && exclusive(&self._recv_cq, recv)
    }

    /// The route this side sends on (GID index and GID, or LID routing).
    #[inline]
    pub fn route(&self) -> Route {
        self.route
    }

    /// Outstanding RDMA reads and atomics it was set up for ([`PreparedQp::rd_atomic`]).
    #[inline]
    pub fn rd_atomic(&self) -> RdAtomic {
        self.rd_atomic
    }

    /// The negotiated path MTU.
    #[inline]
    pub fn path_mtu(&self) -> Mtu {
        self.path_mtu
    }

    /// The peer's endpoint.
    #[inline]
    pub fn remote(&self) -> &Endpoint {
        &self.remote
    }

    /// The raw `ibv_qp`.
    #[inline]
    pub fn as_raw(&self) -> *mut sys::ibv_qp {
        self.handle.raw.as_ptr()
    }

    /// The addresses of the `ibv_cq`s its send and receive queues complete into (compare
    /// with [`Cq::as_raw`](super::Cq::as_raw)).
    pub fn cq_addresses(&self) -> [usize; 2] {
        // SAFETY: the queue pair is live while `self` is; libibverbs set these two fields
        // when it created it and never changes them.
        let (send, recv) = unsafe { ((*self.as_raw()).send_cq, (*self.as_raw()).recv_cq) };
        [send as usize, recv as usize]
    }

    /// Receives the shared receive queue this QP takes its receives from holds (0: none).
    #[inline]
    pub fn srq_max_wr(&self) -> u32 {
        self.srq_wr
    }

    /// Arms the limit event of this QP's shared receive queue ([`super::Srq::set_limit`]):
    /// the device raises `IBV_EVENT_SRQ_LIMIT_REACHED` once fewer than `limit` receives are
    /// posted. Fails with `EOPNOTSUPP` without one.
    pub fn arm_srq_limit(&self, limit: u32) -> Result<()> {
        match &self.srq {
            Some(s) => s.set_limit(limit),
            None => Err(VerbsError::Call {
                verb: Verb::ModifySrq,
                errno: ffi::EOPNOTSUPP,
            }),
        }
    }

    /// The transport settings the device reports this queue pair runs with
    /// (`ibv_query_qp`); `None` if the driver cannot say. Connecting already checked them
    /// against the configuration ([`VerbsError::Clamped`]).
    pub fn transport(&self) -> Result<Option<Transport>> {
        query_transport(self.handle.raw.get())
    }

    /// Says when this QP's shared receive queue is destroyed; `None` without one.
    pub fn srq_probe(&self) -> Option<crate::memory::SrqProbe> {
        self.srq.as_ref().map(|s| s.probe())
    }

    /// Posts up to [`MAX_BATCH`](crate::wr::MAX_BATCH) receives to this QP's shared receive queue (any QP on it
    /// may receive into them). Fails with `EOPNOTSUPP` without one. Does not allocate.
    ///
    /// # Safety
    /// As for [`super::Srq::post_recv`].
    #[inline]
    pub unsafe fn post_srq_recv(
        &mut self,
        wrs: &[RecvRequest<'_>],
    ) -> core::result::Result<(), PostFailure> {
        match &self.srq {
            // SAFETY: the SRQ is live (we hold it); forwarded contract.
            Some(s) => unsafe { super::srq::post_srq_chain(s.as_raw(), wrs) },
            None => Err(PostFailure {
                posted: 0,
                errno: 95,
            }),
        }
    }

    /// Moves the QP to the error state: outstanding requests complete as flushed.
    pub fn set_error(&mut self) -> Result<()> {
        self.handle.set_error()
    }

    /// Posts up to [`MAX_BATCH`](crate::wr::MAX_BATCH) send-queue requests with one doorbell:
    /// in one `ibv_wr_start`/`ibv_wr_complete` section, or as one `ibv_post_send` chain
    /// ([`Qp::post_path`]). Does not allocate.
    ///
    /// On failure, [`PostFailure::posted`] counts the requests the device may run: those
    /// ahead of the one `ibv_post_send` names, or the whole batch when `ibv_wr_complete`
    /// fails or `ibv_post_send` names none (see `verbs::send_ex`).
    ///
    /// # Safety
    /// The [posting contract](crate#the-posting-contract): every buffer the requests name
    /// stays valid, and is neither read (for reads) nor written by the CPU, until the
    /// completion of that request (or of a later signaled one) has been polled.
    #[inline(always)]
    pub unsafe fn post_send(
        &mut self,
        wrs: &[WorkRequest<'_>],
    ) -> core::result::Result<(), PostFailure> {
        // SAFETY: the QP is live; forwarded contract.
        unsafe { self.sender.post(self.handle.raw.as_ptr(), wrs) }
    }

    /// The queue pair's own `ibv_send_wr` list, lent to a batch that builds its requests in
    /// it ([`SendList`](super::send_chain::SendList)).
    #[inline(always)]
    pub(crate) fn send_list(&mut self) -> super::send_chain::SendList {
        self.sender.chain.list(self.handle.raw.get())
    }

    /// How this queue pair posts: through the extended `ibv_wr_*` entry points, or through
    /// `ibv_post_send` and why (the provider lacks them). Decided once, when it was created.
    pub fn post_path(&self) -> PostPath {
        self.sender.path()
    }

    /// Posts up to [`MAX_BATCH`](crate::wr::MAX_BATCH) receives as one chain. Does not allocate.
    ///
    /// # Safety
    /// As for [`Qp::post_send`]: the scatter buffers are the device's until their receive
    /// completions are polled.
    #[inline]
    pub unsafe fn post_recv(
        &mut self,
        wrs: &[RecvRequest<'_>],
    ) -> core::result::Result<(), PostFailure> {
        // SAFETY: the QP is live; forwarded contract.
        unsafe { post_recv_chain(self.as_raw(), wrs) }
    }
}

/// Posts `wrs` to the receive queue of `qp` as one chain (at most [`MAX_BATCH`](crate::wr::MAX_BATCH)).
///
/// # Safety
/// `qp` is live; the posting contract for the buffers.
#[inline(always)]
pub(crate) unsafe fn post_recv_chain(
    qp: *mut sys::ibv_qp,
    wrs: &[RecvRequest<'_>],
) -> core::result::Result<(), PostFailure> {
    // SAFETY: forwarded contract; ffi::post_recv takes a queue pair.
    unsafe { post_recv_wrs(qp, ffi::post_recv, wrs) }
}

/// Flags as the device sees them; checked against the header's values at compile time.
const _: () = {
    assert!(SendFlags::FENCE.bits() == sys::ibv_send_flags::IBV_SEND_FENCE.0);
    assert!(SendFlags::SIGNALED.bits() == sys::ibv_send_flags::IBV_SEND_SIGNALED.0);
    assert!(SendFlags::SOLICITED.bits() == sys::ibv_send_flags::IBV_SEND_SOLICITED.0);
    assert!(SendFlags::INLINE.bits() == sys::ibv_send_flags::IBV_SEND_INLINE.0);
};

#[cfg(test)]
mod tests {
    use super::*;
    use crate::params::RnrTimer;

    #[test]
    fn a_device_that_clamps_a_transport_setting_is_refused_naming_it() {
        let cfg = QpConfig::default();
        let asked = Transport::asked(&cfg);
        assert_eq!(asked.check(asked), Ok(()));
        // A driver with a larger minimal ACK timeout than asked for.
        let granted = Transport {
            ack_timeout: 16,
            ..asked
        };
        let e = asked.check(granted).unwrap_err();
        assert_eq!(
            e,
            VerbsError::Clamped {
                setting: "ack_timeout",
                asked: 14,
                granted: 16
            }
        );
        let msg = alloc::format!("{e}");
        assert!(msg.contains("ack_timeout to code 16, not the 14"), "{msg}");
        let granted = Transport {
            rnr_retry: 6,
            ..asked
        };
        assert!(matches!(
            Transport {
                rnr_retry: 7,
                ..asked
            }
            .check(granted),
            Err(VerbsError::Clamped {
                setting: "rnr_retry",
                asked: 7,
                granted: 6
            })
        ));
    }

    #[test]
    fn transport_settings_read_as_wall_time() {
        let mut cfg = QpConfig::default();
        // 4.096 us * 2^14 = 67.1 ms per try, 8 tries.
        assert_eq!(
            cfg.retry_wall_time(),
            Some(Duration::from_nanos((4096u64 << 14) * 8))
        );
        cfg.retry_count = RetryCount::new(0).unwrap();
        assert_eq!(
            cfg.retry_wall_time(),
            Some(Duration::from_nanos(4096u64 << 14))
        );
        cfg.ack_timeout = AckTimeout::INFINITE;
        assert_eq!(cfg.retry_wall_time(), None);
        cfg.rnr_retry = RnrRetry::Times(3);
        cfg.rnr_timer = RnrTimer::at_least(Duration::from_millis(10));
        assert_eq!(cfg.rnr_wall_time(), Some(Duration::from_micros(3 * 10_240)));
        cfg.rnr_retry = RnrRetry::Infinite;
        assert_eq!(cfg.rnr_wall_time(), None);
    }
}
