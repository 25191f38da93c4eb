//! The RDMA connection manager (librdmacm, feature `rdmacm`): RC connections by address
//! and port, and multicast groups joined through `rdma_join_multicast`. No endpoint
//! exchange of one's own, no cluster file: the listener's IP address and port are all a
//! client needs.
//!
//! ```no_run
//! # fn main() -> Result<(), Box<dyn core::error::Error>> {
//! use core::time::Duration;
//! use rverbs_core::channel::{Channel, ChannelConfig};
//! use rverbs_core::cm::{connect, CmConfig, Listener};
//! use rverbs_core::memory::PageMemory;
//! use rverbs_core::verbs::{open_device, AccessFlags};
//! # use rverbs_core::poll::{Clock, Instant};
//! # struct Monotonic;
//! # impl Clock for Monotonic { fn now(&self) -> Instant { Instant::from_nanos(0) } }
//! # static MONOTONIC: Monotonic = Monotonic;
//! // `MONOTONIC` is `rverbs_std_shim::MONOTONIC`.
//! let ctx = open_device("rxe0")?;
//! let pd = ctx.alloc_pd()?;
//! // Memory the peer may write into, offered in the connection's private data.
//! let window = pd.register_shared(
//!     PageMemory::zeroed(4096).ok_or("no memory")?,
//!     AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE,
//! )?;
//! let cfg = CmConfig::with_timeout(Duration::from_secs(5)).offering(window.remote());
//! let server = true;
//! let conn = if server {
//!     let listener = Listener::bind(&pd, "192.168.77.1:7471".parse()?, &cfg, &MONOTONIC)?;
//!     listener.accept()? // at most cfg.timeout
//! } else {
//!     connect(&pd, "192.168.77.1:7471".parse()?, &cfg, &MONOTONIC)?
//! };
//! let theirs = conn.remote_memory().ok_or("the peer offered no memory")?;
//! let mut chan = Channel::new(conn, ChannelConfig::default(), &MONOTONIC);
//! chan.write_inline(b"hello", theirs.slice(0, 5).ok_or("small window")?)?;
//! chan.disconnect()?; // the peer sees it: `peer_disconnected`, `wait_disconnect`
//! # Ok(()) }
//! ```
//!
//! # How a connection comes up
//! The queue pair is rverbs' own ([`Pd::create_rc_qp`](crate::verbs::Pd::create_rc_qp) on
//! the protection domain given), not librdmacm's, so a [`Connection`] is a
//! [`Provider`](crate::provider::Provider) like any other and a [`Channel`] is built on
//! it. The connection manager resolves the address to a device and port (which must be the
//! protection domain's: [`CmError::WrongDevice`]) and the route; the queue pair's number
//! travels in `rdma_connect`/`rdma_accept`, the connection manager computes the path, the
//! peer's queue pair number and both PSNs (`rdma_init_qp_attr`), and the queue pair's own
//! [`QpConfig`](crate::verbs::QpConfig) keeps its timers, retry counts and MTU limit.
//! Each side's [`ConnectData`](crate::wire::ConnectData) (32 bytes of private data, with
//! the memory it offers, decoded by a total decoder) travels with the request and the
//! reply.
//!
//! # Every wait is bounded
//! Each step (address, route, the peer's answer; a connection request, the peer's
//! confirmation; a multicast join) waits at most [`CmConfig::timeout`] (or the deadline
//! given), sleeping in `poll(2)` on the identifier's event channel, and the error names the
//! address and the step ([`CmError::TimedOut`]). A connect to a port nobody listens on is
//! [`CmError::Refused`] ("connection refused by 192.168.77.1:7999: nobody listens on that
//! port"), as soon as the peer's connection manager says so.
//!
//! # Disconnecting, and what is dropped when
//! [`Channel::disconnect`] delivers the sends posted so far, disconnects and flushes;
//! the peer sees it through [`Channel::peer_disconnected`] (never blocks) or
//! [`Channel::wait_disconnect`]. The channel's own waits do not watch for a disconnect (a
//! receive the peer will never answer ends at the channel's timeout), so loops that wait on
//! a peer that may leave ask between waits. A closed channel fails every call with
//! [`ChannelError::Disconnected`](crate::channel::ChannelError::Disconnected).
//!
//! A [`Connection`] drops its queue pair (and completion queues) before its identifier, and
//! the identifier before its event channel; memory regions are separate objects that
//! outlive whatever the peer could reach them through, as everywhere in rverbs (the
//! channel drains before its queue pair goes; `docs/safety.md`).
//!
//! # Multicast
//! [`VerbsDatagram::joining_through_cm`](crate::provider::verbs_ud::VerbsDatagram::joining_through_cm)
//! makes every [`Datagram::join`](crate::datagram::Datagram::join) go through
//! `rdma_join_multicast` ([`multicast`]).
//!
//! # Thread safety
//! A [`Connection`] is `Send` (move it, or the channel on it, to the thread that polls); a
//! [`Listener`] is `Send`, and accepts on one thread at a time (`&self`, but not `Sync`).
//!
//! Nothing here allocates once connected; connecting, accepting and joining allocate (the
//! queue pair and its queues).

pub mod connect;
mod error;
mod event;
pub(crate) mod ffi;
mod id;
pub mod multicast;

#[allow(unused_imports)] // for the docs above
use crate::channel::Channel;
pub use connect::{connect, CmConfig, Connection, Listener};
pub use error::{CmCall, CmError, CmEvent, CmStep, DeviceName};
pub use multicast::CmJoin;
