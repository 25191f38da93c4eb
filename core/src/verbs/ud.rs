//! Datagram (unreliable datagram, UD) queue pairs: creation, bring-up with a Q_Key, posting,
//! and attaching to multicast groups.
//!
//! A UD queue pair is connected to nobody. It is ready to send and receive as soon as it is
//! created (INIT with its Q_Key, RTR, RTS: no peer is needed for any of them); each send
//! names an [`AddressHandle`], the destination queue pair number and its Q_Key. What UD does
//! not do, and RC does: acknowledge, retransmit, or report a lost datagram. A send completes
//! once the datagram left; one that finds no receive posted, or a Q_Key it does not expect,
//! or that is dropped on the way, is gone without a trace.
//!
//! Every received datagram is preceded, in the receive buffer, by the 40 bytes of its network
//! header (the GRH, on RoCE v2 an IPv4 header in its last 20 bytes): receives must be 40
//! bytes longer than the largest payload, and a payload is at most the path MTU
//! ([`UdQp::mtu`]).
//!
//! ```no_run
//! use rverbs_core::verbs::{open_device, UdConfig};
//! # fn main() -> Result<(), rverbs_core::verbs::VerbsError> {
//! let ctx = open_device("rxe0")?;
//! let pd = ctx.alloc_pd()?;
//! let (send_cq, recv_cq) = (ctx.create_cq(64)?, ctx.create_cq(64)?);
//! let qp = pd.create_ud_qp(&send_cq, &recv_cq, &UdConfig::default())?;
//! println!("qpn {} q_key {:#x} mtu {:?}", qp.qp_num(), qp.qkey(), qp.mtu());
//! # Ok(()) }
//! ```

use core::fmt;

use alloc::sync::Arc;
use alloc::vec::Vec;

use super::ah::AddressHandle;
use super::cq::{Cq, CqInner};
use super::create::{Ask, Created, Kind};
use super::device::{LinkLayer, Route};
use super::error::{Result, Verb, VerbsError};
use super::ffi::{sys, EINVAL};
use super::pd::Pd;
use super::qp::{modify, post_recv_chain, zeroed_attr, QpHandle};
use super::send_ex::{DatagramSender, PostPath};
use crate::gid::Gid;
use crate::params::{Mtu, QpCaps};
use crate::wr::{DatagramRequest, PostFailure, RecvRequest, SendFlags};

/// The Q_Key a datagram queue pair takes by default: the one the RDMA connection manager
/// gives UD and multicast queue pairs (`RDMA_UDP_QKEY`), so endpoints made here and there
/// can talk. Its high bit is clear, as it must be: Q_Keys with the high bit set are
/// "controlled", for privileged queue pairs only.
pub const DEFAULT_QKEY: u32 = 0x0123_4567;

/// The queue pair number a datagram is sent to when it goes to a multicast group.
pub const MULTICAST_QPN: u32 = 0x00ff_ffff;

/// Bytes of the network header (GRH) in front of every received datagram.
pub const GRH_LEN: usize = 40;

/// How to make a datagram queue pair.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct UdConfig {
    /// Port number (from 1).
    pub port: u8,
    /// Source GID index for the addresses made for this queue pair; `None` picks
    /// [`Context::default_route`](super::Context::default_route).
    pub gid_index: Option<u8>,
    /// The Q_Key: datagrams carrying another are dropped on arrival. High bit clear.
    pub qkey: u32,
    /// Send queue depth.
    pub max_send_wr: u32,
    /// Receive queue depth.
    pub max_recv_wr: u32,
    /// Scatter/gather entries per send.
    pub max_send_sge: u32,
    /// Scatter/gather entries per receive.
    pub max_recv_sge: u32,
    /// Largest inline payload (the device may grant more).
    pub max_inline_data: u32,
}

impl Default for UdConfig {
    fn default() -> Self {
        Self {
            port: 1,
            gid_index: None,
            qkey: DEFAULT_QKEY,
            max_send_wr: 128,
            max_recv_wr: 128,
            max_send_sge: 4,
            max_recv_sge: 1,
            max_inline_data: 64,
        }
    }
}

/// A datagram queue pair, ready to send and receive (RTS). See the [module docs](self).
pub struct UdQp {
    qpn: u32,
    qkey: u32,
    caps: QpCaps,
    route: Route,
    port: u8,
    link_layer: LinkLayer,
    lid: u16,
    mtu: Mtu,
    /// The groups attached (GID and LID), detached on drop: the kernel refuses to destroy a
    /// queue pair still attached to one.
    attached: Vec<(Gid, u16)>,
    sender: DatagramSender,
    // Field order is drop order: the QP goes before its CQs and PD.
    handle: QpHandle,
    _send_cq: Arc<CqInner>,
    _recv_cq: Arc<CqInner>,
    pd: Pd,
}

// SAFETY: a QP may be posted to from any thread; UdQp owns its handle and posting needs &mut.
unsafe impl Send for UdQp {}

impl fmt::Debug for UdQp {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("UdQp")
            .field("qpn", &self.qpn)
            .field("qkey", &self.qkey)
            .field("route", &self.route)
            .field("mtu", &self.mtu)
            .field("caps", &self.caps)
            .finish()
    }
}

impl Pd {
    /// Creates a datagram queue pair on `cfg.port` and brings it up to RTS with `cfg.qkey`.
    /// Fails with [`VerbsError::InvalidArgument`] for a Q_Key with the high bit set.
    pub fn create_ud_qp(&self, send_cq: &Cq, recv_cq: &Cq, cfg: &UdConfig) -> Result<UdQp> {
        if cfg.qkey & 0x8000_0000 != 0 {
            return Err(VerbsError::InvalidArgument {
                what: "a Q_Key with the high bit set is for privileged queue pairs only",
            });
        }
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
            kind: Kind::Ud { qkey: cfg.qkey },
        };
        let Created {
            handle,
            ex,
            qpn,
            caps,
            route,
            port,
        } = self.create_at_init(send_cq, recv_cq, &ask)?;
        let raw = handle.raw.get();
        use sys::ibv_qp_attr_mask as m;
        let mut attr = zeroed_attr();
        attr.qp_state = sys::ibv_qp_state::IBV_QPS_RTR;
        modify(raw, &mut attr, m::IBV_QP_STATE.0, Verb::ModifyQpRtr)?;
        let mut attr = zeroed_attr();
        attr.qp_state = sys::ibv_qp_state::IBV_QPS_RTS;
        attr.sq_psn = 0;
        modify(
            raw,
            &mut attr,
            (m::IBV_QP_STATE | m::IBV_QP_SQ_PSN).0,
            Verb::ModifyQpRts,
        )?;
        Ok(UdQp {
            qpn,
            qkey: cfg.qkey,
            caps,
            route,
            port: cfg.port,
            link_layer: port.link_layer,
            lid: port.lid,
            mtu: port.active_mtu,
            attached: Vec::new(),
            // SAFETY: the extended form lives as long as the queue pair, which the UdQp owns.
            sender: unsafe { DatagramSender::new(ex) },
            handle,
            _send_cq: send_cq.keep_alive(),
            _recv_cq: recv_cq.keep_alive(),
            pd: self.clone(),
        })
    }
}

impl Drop for UdQp {
    fn drop(&mut self) {
        // Before the handle's ibv_destroy_qp, which fails (EBUSY) while the queue pair is
        // attached to a group and would leak it, its CQs and its PD. A refused detach leaves
        // that for the destroy to count (`verbs::failed_destroys`).
        for (gid, lid) in core::mem::take(&mut self.attached) {
            let g = sys::ibv_gid { raw: gid.0 };
            // SAFETY: the QP is live (destroyed after this, by the handle); g is read only
            // during the call.
            unsafe { sys::ibv_detach_mcast(self.as_raw(), &g, lid) };
        }
    }
}

impl UdQp {
    /// The QP number.
    #[inline]
    pub fn qp_num(&self) -> u32 {
        self.qpn
    }

    /// The Q_Key datagrams to this queue pair must carry.
    #[inline]
    pub fn qkey(&self) -> u32 {
        self.qkey
    }

    /// What the device granted.
    #[inline]
    pub fn caps(&self) -> QpCaps {
        self.caps
    }

    /// The route addresses made for this queue pair send from (GID index and GID).
    #[inline]
    pub fn route(&self) -> Route {
        self.route
    }

    /// The port it is on.
    #[inline]
    pub fn port(&self) -> u8 {
        self.port
    }

    /// The port's link layer (RoCE ports route every datagram by GID).
    #[inline]
    pub fn link_layer(&self) -> LinkLayer {
        self.link_layer
    }

    /// The port's LID (InfiniBand).
    #[inline]
    pub fn lid(&self) -> u16 {
        self.lid
    }

    /// The port's active MTU when the queue pair was made: the largest datagram payload.
    #[inline]
    pub fn mtu(&self) -> Mtu {
        self.mtu
    }

    /// The protection domain (to make address handles and register memory on).
    #[inline]
    pub fn pd(&self) -> &Pd {
        &self.pd
    }

    /// The raw `ibv_qp`.
    #[inline]
    pub fn as_raw(&self) -> *mut sys::ibv_qp {
        self.handle.raw.as_ptr()
    }

    /// Attaches the queue pair to the multicast group `gid` (`ibv_attach_mcast`; `lid` is the
    /// group's LID on InfiniBand, 0 on RoCE): datagrams sent to the group are delivered to it
    /// too. On RoCE v2 the IP layer must be a member of the group as well (see
    /// [`super::mcast`]). Dropping the queue pair detaches it from every group still attached
    /// (the kernel would refuse to destroy it otherwise). Setup: allocates.
    pub fn attach_mcast(&mut self, gid: &Gid, lid: u16) -> Result<()> {
        self.attached.reserve(1);
        let g = sys::ibv_gid { raw: gid.0 };
        // SAFETY: the QP is live; g is read only during the call.
        let rc = unsafe { sys::ibv_attach_mcast(self.as_raw(), &g, lid) };
        if rc == 0 {
            self.attached.push((*gid, lid));
            Ok(())
        } else {
            Err(VerbsError::Call {
                verb: Verb::AttachMcast,
                errno: rc,
            })
        }
    }

    /// Detaches the queue pair from the multicast group `gid` (`ibv_detach_mcast`).
    pub fn detach_mcast(&mut self, gid: &Gid, lid: u16) -> Result<()> {
        let g = sys::ibv_gid { raw: gid.0 };
        // SAFETY: the QP is live; g is read only during the call.
        let rc = unsafe { sys::ibv_detach_mcast(self.as_raw(), &g, lid) };
        if rc == 0 {
            if let Some(i) = self.attached.iter().position(|a| *a == (*gid, lid)) {
                self.attached.swap_remove(i);
            }
            Ok(())
        } else {
            Err(VerbsError::Call {
                verb: Verb::DetachMcast,
                errno: rc,
            })
        }
    }

    /// Moves the QP to the error state: outstanding requests complete as flushed.
    pub fn set_error(&mut self) -> Result<()> {
        self.handle.set_error()
    }

    /// How this queue pair posts: through the extended `ibv_wr_*` entry points, or through
    /// `ibv_post_send` and why. Decided once, when it was created.
    pub fn post_path(&self) -> PostPath {
        self.sender.path()
    }

    /// Posts up to [`MAX_BATCH`](crate::wr::MAX_BATCH) datagram sends with one doorbell (one
    /// `ibv_wr_*` section or one `ibv_post_send` chain: [`UdQp::post_path`]). Does not
    /// allocate.
    ///
    /// An address handle made on another protection domain than the queue pair's is refused
    /// (`EINVAL`, nothing posted): libibverbs requires the same one, and a device may fail the
    /// send or use the handle of the wrong domain otherwise.
    ///
    /// # Safety
    /// The [posting contract](crate#the-posting-contract) for the buffers the requests name
    /// (inline ones are copied during the post). The address handles must stay alive until
    /// the post returns (the borrow in each request sees to it).
    #[inline(always)]
    pub unsafe fn post_send(
        &mut self,
        wrs: &[DatagramRequest<'_, AddressHandle>],
    ) -> core::result::Result<(), PostFailure> {
        let pd = self.pd.as_raw();
        if let Some(wr) = self.sender.extended() {
            // SAFETY: the QP is live; the address handles are alive (borrowed by the
            // requests); forwarded contract for the buffers.
            let r = unsafe {
                wr.post(wrs, |dest| {
                    if dest.pd_raw() == pd {
                        Ok(dest.as_raw())
                    } else {
                        Err(EINVAL)
                    }
                })
            };
            match r {
                Ok(()) => return Ok(()),
                Err(Some(f)) => return Err(f),
                // A request of several entries: the batch goes through the chain.
                Err(None) => {}
            }
        }
        // SAFETY: forwarded contract.
        unsafe { self.post_chain(wrs) }
    }

    /// Posts `wrs` as one `ibv_send_wr` chain: without the extended entry points, or for a
    /// batch the extended path handed over. Out of line: where they exist, the extended path
    /// is the common one.
    ///
    /// # Safety
    /// As for [`UdQp::post_send`].
    #[inline(never)]
    unsafe fn post_chain(
        &mut self,
        wrs: &[DatagramRequest<'_, AddressHandle>],
    ) -> core::result::Result<(), PostFailure> {
        let pd = self.pd.as_raw();
        let qp = self.as_raw();
        // SAFETY: the QP is live; the address handles are alive (borrowed by the requests);
        // forwarded contract for the buffers; the index is below wrs.len() == n.
        unsafe {
            self.sender.chain.post(qp, wrs.len(), |i, wr| {
                let w = wrs.get_unchecked(i);
                if w.dest.pd_raw() != pd {
                    return Err(EINVAL);
                }
                wr.wr_id = w.wr_id;
                // Sge is #[repr(C)] with the layout of ibv_sge (checked in verbs::mod).
                wr.sg_list = w.sges.as_ptr().cast_mut().cast();
                wr.num_sge = w.sges.len() as core::ffi::c_int;
                (wr.opcode, wr.__bindgen_anon_1.imm_data) = match w.imm {
                    Some(imm) => (sys::ibv_wr_opcode::IBV_WR_SEND_WITH_IMM, imm.to_be()),
                    None => (sys::ibv_wr_opcode::IBV_WR_SEND, 0),
                };
                wr.send_flags = (w.flags & !SendFlags::FENCE).bits();
                wr.wr.ud = sys::ibv_send_wr__bindgen_ty_2__bindgen_ty_3 {
                    ah: w.dest.as_raw(),
                    remote_qpn: w.remote_qpn,
                    remote_qkey: w.remote_qkey,
                };
                Ok(())
            })
        }
    }

    /// Posts up to [`MAX_BATCH`](crate::wr::MAX_BATCH) receives as one chain. Each must hold [`GRH_LEN`] bytes
    /// more than the largest payload it takes. Does not allocate.
    ///
    /// # Safety
    /// As for [`UdQp::post_send`]: the scatter buffers are the device's until their receive
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
