//! The one queue-pair creation path, shared by RC ([`super::qp`]) and UD ([`super::ud`]):
//! check the port, pick the route, create the queue pair (extended form where the provider
//! has it, [`send_ex::create_qp`]) and move it to INIT. What follows INIT differs (RC waits
//! for its peer's endpoint, UD goes on to RTS alone) and stays with each transport.

use core::ptr::{self, NonNull};

use super::cq::Cq;
use super::destroy::Owned;
use super::device::{PortAttr, Route};
use super::error::{Result, Verb, VerbsError};
use super::ffi::sys;
use super::mr::AccessFlags;
use super::pd::Pd;
use super::qp::{modify, zeroed_attr, QpHandle};
use super::send_ex::{self, LegacyReason};
use super::srq::Srq;
use crate::params::QpCaps;

/// The transport and the one INIT attribute that comes with it.
pub(super) enum Kind<'a> {
    /// Reliable connected: the remote access it grants, and the shared receive queue it
    /// takes its receives from, if any.
    Rc {
        access: AccessFlags,
        srq: Option<&'a Srq>,
    },
    /// Unreliable datagram, with its Q_Key.
    Ud { qkey: u32 },
}

/// What a queue pair asks for at creation.
pub(super) struct Ask<'a> {
    pub(super) port: u8,
    pub(super) gid_index: Option<u8>,
    pub(super) caps: QpCaps,
    pub(super) kind: Kind<'a>,
}

/// A queue pair in INIT, and what its creation learned.
pub(super) struct Created {
    pub(super) handle: QpHandle,
    pub(super) ex: core::result::Result<NonNull<sys::ibv_qp_ex>, LegacyReason>,
    pub(super) qpn: u32,
    /// The capabilities granted; on a shared receive queue the queue pair's own receive
    /// queue takes nothing, whatever the provider reports.
    pub(super) caps: QpCaps,
    pub(super) route: Route,
    pub(super) port: PortAttr,
}

impl Pd {
    /// Creates a queue pair on `ask.port` for `send_cq` and `recv_cq` and moves it to INIT
    /// (P_Key index 0). Fails with [`VerbsError::PortNotActive`] before creating anything
    /// on a port that is down. On an error after creation the queue pair is destroyed.
    pub(super) fn create_at_init(
        &self,
        send_cq: &Cq,
        recv_cq: &Cq,
        ask: &Ask<'_>,
    ) -> Result<Created> {
        let ctx = self.context();
        let port = ctx.query_port(ask.port)?;
        if !port.active {
            return Err(VerbsError::PortNotActive {
                port: ask.port,
                state: port.state,
            });
        }
        let route = ctx.route(ask.port, ask.gid_index)?;
        let (qp_type, srq, send_ops) = match ask.kind {
            Kind::Rc { srq, .. } => (
                sys::ibv_qp_type::IBV_QPT_RC,
                srq,
                send_ex::CONNECTED_SEND_OPS,
            ),
            Kind::Ud { .. } => (
                sys::ibv_qp_type::IBV_QPT_UD,
                None,
                send_ex::DATAGRAM_SEND_OPS,
            ),
        };
        // On a shared receive queue the queue pair's own receive queue is unused.
        let own_recv = |n: u32| if srq.is_some() { 0 } else { n };
        let mut init = sys::ibv_qp_init_attr {
            qp_context: ptr::null_mut(),
            send_cq: send_cq.as_raw(),
            recv_cq: recv_cq.as_raw(),
            srq: srq.map_or(ptr::null_mut(), Srq::as_raw),
            cap: sys::ibv_qp_cap {
                max_send_wr: ask.caps.max_send_wr,
                max_recv_wr: own_recv(ask.caps.max_recv_wr),
                max_send_sge: ask.caps.max_send_sge,
                max_recv_sge: own_recv(ask.caps.max_recv_sge),
                max_inline_data: ask.caps.max_inline_data,
            },
            qp_type,
            // Selective signaling: only requests flagged SIGNALED complete.
            sq_sig_all: 0,
        };
        // SAFETY: the PD, both CQs and the SRQ are live (we hold them); init is fully
        // initialised.
        let created =
            unsafe { send_ex::create_qp(self.as_raw(), &mut init, send_ops) }.map_err(|errno| {
                VerbsError::Call {
                    verb: Verb::CreateQp,
                    errno,
                }
            })?;
        let raw = created.raw;
        // From here an early return destroys the queue pair.
        let handle = QpHandle {
            // SAFETY: raw came from ibv_create_qp(_ex) and nothing else destroys it; its
            // owner (this function, then `PreparedQp`, `Qp` or `UdQp`) keeps the PD and the
            // CQs alive until after it is destroyed (field order).
            raw: unsafe { Owned::new(raw) },
        };
        let caps = QpCaps {
            max_send_wr: init.cap.max_send_wr,
            max_recv_wr: own_recv(init.cap.max_recv_wr),
            max_send_sge: init.cap.max_send_sge,
            max_recv_sge: own_recv(init.cap.max_recv_sge),
            max_inline_data: init.cap.max_inline_data,
        };
        use sys::ibv_qp_attr_mask as m;
        let mut attr = zeroed_attr();
        attr.qp_state = sys::ibv_qp_state::IBV_QPS_INIT;
        attr.pkey_index = 0;
        attr.port_num = ask.port;
        let mut mask = m::IBV_QP_STATE | m::IBV_QP_PKEY_INDEX | m::IBV_QP_PORT;
        match ask.kind {
            Kind::Rc { access, .. } => {
                attr.qp_access_flags = access.bits();
                mask |= m::IBV_QP_ACCESS_FLAGS;
            }
            Kind::Ud { qkey } => {
                attr.qkey = qkey;
                mask |= m::IBV_QP_QKEY;
            }
        }
        modify(raw, &mut attr, mask.0, Verb::ModifyQpInit)?;
        // SAFETY: raw is live; qp_num is set at creation.
        let qpn = unsafe { (*raw.as_ptr()).qp_num };
        Ok(Created {
            handle,
            ex: created.ex,
            qpn,
            caps,
            route,
            port,
        })
    }
}
