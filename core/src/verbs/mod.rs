//! The device layer: safe wrappers over `ibverbs-sys` (feature `verbs`).
//!
//! Where each verb is wrapped: devices, contexts, ports and GIDs in [`device`]; protection
//! domains in [`pd`]; memory regions in [`mr`]; completion queues in [`cq`] (created with
//! `ibv_create_cq_ex` where the provider has it, and then polled by `cq_ex.rs` with
//! `ibv_start_poll`/`ibv_end_poll`; the context's extended verbs, which
//! `verbs.h` reaches through `struct verbs_context`, in `ext.rs`); completion
//! channels and events in [`event`]; the device's asynchronous events (port down, queue pair
//! fatal, ...) in [`async_event`]; RC queue pairs and posting in [`qp`]; shared receive
//! queues in [`srq`] (the receive chain both kinds of queue post is built in `recv_chain.rs`,
//! the send chain of connected and datagram queue pairs in `send_chain.rs`, their
//! extended `ibv_wr_*` path and its fallback to that chain in `send_ex.rs`);
//! datagram (UD) queue pairs and multicast attach in [`ud`], their address handles in
//! [`ah`], and the IP-layer membership RoCE v2 multicast needs in [`mcast`]; destroys the
//! device refused are counted in [`destroy`]. Every wrapper hands out its raw handle
//! (`as_raw`) for verbs rverbs does not wrap, and [`ffi`] re-exports the bindings.

pub mod ah;
pub mod async_event;
pub mod cq;
pub(crate) mod cq_ex;
mod create;
pub mod destroy;
pub mod device;
pub mod dmabuf;
pub mod error;
pub mod event;
mod ext;
pub mod ffi;
pub mod mcast;
pub mod mr;
pub mod pd;
pub mod qp;
mod recv_chain;
pub(crate) mod send_chain;
pub(crate) mod send_ex;
pub mod srq;
pub mod ud;

pub use crate::params::QpCaps;
pub use ah::{AddressHandle, AhAttr, GlobalRoute};
pub use async_event::{AsyncEvent, AsyncEvents};
pub use cq::{Cq, CqOptions, PollPath, POLL_BATCH};
pub use destroy::{failed_destroys, FailedDestroys};
pub use device::{
    open_device, Context, Device, DeviceAttr, DeviceList, Gid, GidEntry, GidTable, GidType,
    LinkLayer, PortAttr, Route,
};
pub use dmabuf::{DmabufFd, DmabufRegion};
pub use error::{DeviceName, TimestampRefusal, Verb, VerbsError};
pub use event::{CompletionChannel, CqEvents};
pub use mcast::IpMembership;
pub use mr::{AccessFlags, MemoryRegion, OwnedRegion, SharedRegion};
pub use pd::Pd;
pub use qp::{PreparedQp, Qp, QpConfig, RdAtomic, Transport};
pub use send_ex::{LegacyReason, PostPath};
pub use srq::Srq;
pub use ud::{UdConfig, UdQp, DEFAULT_QKEY, GRH_LEN, MULTICAST_QPN};

static_assertions::assert_eq_size!(crate::sge::Sge<'static>, ffi::sys::ibv_sge);
static_assertions::assert_eq_align!(crate::sge::Sge<'static>, ffi::sys::ibv_sge);
static_assertions::const_assert_eq!(core::mem::offset_of!(ffi::sys::ibv_sge, addr), 0);
static_assertions::const_assert_eq!(core::mem::offset_of!(ffi::sys::ibv_sge, length), 8);
static_assertions::const_assert_eq!(core::mem::offset_of!(ffi::sys::ibv_sge, lkey), 12);
