//! Address handles: where a datagram goes (`ibv_create_ah`, `ibv_create_ah_from_wc`).
//!
//! A datagram (UD) queue pair is connected to nobody: every send names an
//! [`AddressHandle`] (the path to a port, or to a multicast group) and the queue pair number
//! and Q_Key behind it. On RoCE every address is routed by GID and carries a global route
//! header ([`AhAttr::global`]); on InfiniBand inside one subnet a LID will do
//! ([`AhAttr::lid`]).
//!
//! To answer a datagram, [`Pd::create_ah_from_wc`] builds the address of its sender from the
//! receive completion and the 40-byte network header the device wrote in front of it
//! (`ibv_init_ah_from_wc`, which picks the local GID index the datagram arrived on).
//!
//! ```no_run
//! use rverbs_core::verbs::{open_device, AhAttr, Gid};
//! # fn main() -> Result<(), rverbs_core::verbs::VerbsError> {
//! let ctx = open_device("rxe0")?;
//! let pd = ctx.alloc_pd()?;
//! let route = ctx.default_route(1)?;
//! let peer = Gid::from_ipv4([192, 168, 77, 2]);
//! let ah = pd.create_ah(&AhAttr::global(1, peer, route.gid_index))?;
//! # let _ = ah; Ok(()) }
//! ```

use alloc::sync::Arc;
use core::fmt;
use core::mem::MaybeUninit;
use core::ptr::NonNull;

use super::destroy::Owned;
use super::device::LinkLayer;
use super::error::{Result, Verb, VerbsError};
use super::ffi::{errno, sys};
use super::pd::Pd;
use crate::completion::DatagramCompletion;
use crate::gid::Gid;

/// The global route of an address: destination GID and the header fields the sender sets.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct GlobalRoute {
    /// The destination port's GID, or a multicast group's.
    pub dgid: Gid,
    /// The local GID index to send from (its type picks RoCE v1 or v2).
    pub sgid_index: u8,
    /// Hop limit (the IPv4 TTL on RoCE v2).
    pub hop_limit: u8,
    /// Traffic class (DSCP and ECN bits on RoCE).
    pub traffic_class: u8,
    /// IPv6 flow label (20 bits).
    pub flow_label: u32,
}

/// What an address handle is made from (`ibv_ah_attr`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct AhAttr {
    /// The local port to send from.
    pub port: u8,
    /// The destination LID (InfiniBand; ignored on RoCE).
    pub dlid: u16,
    /// Service level.
    pub sl: u8,
    /// Routed by GID, with a global route header: required on RoCE.
    pub global: Option<GlobalRoute>,
}

impl AhAttr {
    /// An address routed by GID, from the local GID at `sgid_index` (hop limit 64).
    pub const fn global(port: u8, dgid: Gid, sgid_index: u8) -> Self {
        Self {
            port,
            dlid: 0,
            sl: 0,
            global: Some(GlobalRoute {
                dgid,
                sgid_index,
                hop_limit: 64,
                traffic_class: 0,
                flow_label: 0,
            }),
        }
    }

    /// An address inside one InfiniBand subnet, by LID (no global route header).
    pub const fn lid(port: u8, dlid: u16) -> Self {
        Self {
            port,
            dlid,
            sl: 0,
            global: None,
        }
    }

    /// The attributes a verb filled in (`ibv_init_ah_from_wc`, or the connection manager's
    /// multicast join).
    pub(crate) fn from_sys(a: &sys::ibv_ah_attr) -> Self {
        AhAttr {
            port: a.port_num,
            dlid: a.dlid,
            sl: a.sl,
            global: (a.is_global != 0).then_some(GlobalRoute {
                // SAFETY: ibv_gid is a union of a byte array and two u64: any bits are bytes.
                dgid: Gid(unsafe { a.grh.dgid.raw }),
                sgid_index: a.grh.sgid_index,
                hop_limit: a.grh.hop_limit,
                traffic_class: a.grh.traffic_class,
                flow_label: a.grh.flow_label,
            }),
        }
    }

    fn to_sys(self) -> sys::ibv_ah_attr {
        // SAFETY: ibv_ah_attr is plain C data for which all-zero is valid.
        let mut a: sys::ibv_ah_attr = unsafe { MaybeUninit::zeroed().assume_init() };
        a.port_num = self.port;
        a.dlid = self.dlid;
        a.sl = self.sl;
        if let Some(g) = self.global {
            a.is_global = 1;
            a.grh.dgid.raw = g.dgid.0;
            a.grh.sgid_index = g.sgid_index;
            a.grh.hop_limit = g.hop_limit;
            a.grh.traffic_class = g.traffic_class;
            a.grh.flow_label = g.flow_label & 0xf_ffff;
        }
        a
    }
}

struct AhInner {
    // Field order is drop order: the handle is destroyed before its PD is released.
    raw: Owned<sys::ibv_ah>,
    /// The raw `ibv_pd` it was made on (`_pd`'s), here for one load on the send path.
    pd_raw: NonNull<sys::ibv_pd>,
    // Dropped after the address handle is destroyed.
    _pd: Pd,
}

// SAFETY: an address handle is immutable after creation and libibverbs lets any thread post
// with it or destroy it; the pointer is owned.
unsafe impl Send for AhInner {}
// SAFETY: as above.
unsafe impl Sync for AhInner {}

/// The path to a port or a multicast group, for datagram sends. Cheap to clone; destroyed
/// with its last clone (it keeps its protection domain alive).
#[derive(Clone)]
pub struct AddressHandle {
    inner: Arc<AhInner>,
    attr: AhAttr,
}

impl fmt::Debug for AddressHandle {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("AddressHandle")
            .field("attr", &self.attr)
            .finish()
    }
}

impl AddressHandle {
    /// The raw `ibv_ah`, valid while `self` lives.
    #[inline]
    pub fn as_raw(&self) -> *mut sys::ibv_ah {
        self.inner.raw.as_ptr()
    }

    /// The raw `ibv_pd` it was made on: a queue pair may send with it only if it was made on
    /// the same protection domain.
    #[inline]
    pub fn pd_raw(&self) -> *mut sys::ibv_pd {
        self.inner.pd_raw.as_ptr()
    }

    /// What it was made from.
    pub fn attr(&self) -> AhAttr {
        self.attr
    }

    /// Whether `other` is this handle or one of its clones (one `ibv_ah`). Does not
    /// allocate.
    #[inline]
    pub fn same(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.inner, &other.inner)
    }
}

impl Pd {
    /// Creates an address handle (`ibv_create_ah`). On an Ethernet (RoCE) port the address
    /// must be routed by GID: [`AhAttr::global`]. Allocates (setup, not the data path: keep
    /// the handle and send with it many times).
    pub fn create_ah(&self, attr: &AhAttr) -> Result<AddressHandle> {
        let port = self.context().query_port(attr.port)?;
        if port.link_layer == LinkLayer::Ethernet && attr.global.is_none() {
            return Err(VerbsError::InvalidArgument {
                what: "a RoCE address must be routed by GID (AhAttr::global)",
            });
        }
        let mut a = attr.to_sys();
        // SAFETY: the PD is live (we hold it); a is fully initialised. The handle is
        // destroyed once, by the last clone. A device may read it when it executes a send,
        // not when the send was posted (rxe looks it up by number then), so a datagram
        // endpoint keeps a clone until every send that named it has completed.
        let raw =
            unsafe { Owned::create(sys::ibv_create_ah(self.as_raw(), &mut a), Verb::CreateAh) }?;
        Ok(AddressHandle {
            inner: Arc::new(AhInner {
                raw,
                pd_raw: self.inner.raw.get(),
                _pd: self.clone(),
            }),
            attr: *attr,
        })
    }

    /// The address of the sender of a received datagram, to answer it: from its completion
    /// and the 40 bytes the device wrote in front of its payload (`grh`, read only when
    /// `wc.grh` says they are valid), as `ibv_create_ah_from_wc` does it: `ibv_init_ah_from_wc`
    /// works out the attributes (the sender's GID, and the local GID index the datagram
    /// arrived on), then `ibv_create_ah`. libibverbs refuses (`EINVAL`) a datagram that was
    /// sent to a multicast group: answer those with [`Pd::create_ah`] and the sender's GID
    /// from the header ([`crate::wire::grh`]). Allocates.
    pub fn create_ah_from_wc(
        &self,
        port: u8,
        wc: &DatagramCompletion,
        grh: &[u8; 40],
    ) -> Result<AddressHandle> {
        // ibv_init_ah_from_wc reads only the public fields set here.
        let mut c = sys::ibv_wc::default();
        c.src_qp = wc.src_qp;
        c.slid = wc.slid;
        c.sl = wc.sl;
        c.dlid_path_bits = wc.path_bits;
        c.qp_num = wc.wc.qp_num;
        if wc.grh {
            c.wc_flags = sys::ibv_wc_flags::IBV_WC_GRH;
        }
        let mut h = MaybeUninit::<sys::ibv_grh>::zeroed();
        // SAFETY: ibv_grh is 40 bytes of plain C data (checked below at compile time); any
        // byte pattern is a valid value.
        let mut h = unsafe {
            core::ptr::copy_nonoverlapping(grh.as_ptr(), h.as_mut_ptr().cast::<u8>(), 40);
            h.assume_init()
        };
        let mut a = AhAttr::lid(port, 0).to_sys();
        // SAFETY: the context is open; c, h and a are initialised; the call reads c and h and
        // writes a.
        let rc = unsafe {
            sys::ibv_init_ah_from_wc(self.context().as_raw(), port, &mut c, &mut h, &mut a)
        };
        if rc != 0 {
            return Err(VerbsError::Call {
                verb: Verb::InitAhFromWc,
                errno: errno(),
            });
        }
        let attr = AhAttr::from_sys(&a);
        self.create_ah(&attr)
    }
}

static_assertions::assert_eq_size!(sys::ibv_grh, [u8; 40]);
