#![no_std]
#![deny(unsafe_op_in_unsafe_fn)]
#![deny(unsafe_code)]
#![cfg_attr(docsrs, feature(doc_auto_cfg))]
//! rverbs-core: an RDMA verbs engine for one busy-polling thread per node.
//!
//! `#![no_std]`, and no heap use on the data path once connected.
//!
//! # Quick start
//!
//! Two queue pairs on one device connected to each other, one RDMA write:
//!
//! ```no_run
//! # #[cfg(feature = "verbs")] fn main() -> Result<(), Box<dyn core::error::Error>> {
//! use core::time::Duration;
//! use rverbs_core::channel::{Channel, ChannelConfig};
//! use rverbs_core::provider::verbs::PreparedVerbs;
//! use rverbs_core::verbs::{open_device, AccessFlags, QpConfig};
//! # use rverbs_core::poll::{Clock, Instant};
//! # struct Monotonic;
//! # impl Clock for Monotonic { fn now(&self) -> Instant { Instant::from_nanos(0) } }
//! # static MONOTONIC: Monotonic = Monotonic;
//! // `MONOTONIC` is `rverbs_std_shim::MONOTONIC`: any `'static` clock will do, and every
//! // wait of the channel is bounded by its timeout on that clock.
//!
//! let ctx = open_device("rxe0")?;
//! let pd = ctx.alloc_pd()?;
//! let (a, b) = (PreparedVerbs::new(&ctx, &pd, &QpConfig::default())?,
//!               PreparedVerbs::new(&ctx, &pd, &QpConfig::default())?);
//! // Between hosts, endpoints travel as bytes: `a.endpoint().encode()`.
//! let (ea, eb) = (a.endpoint(), b.endpoint());
//! let cfg = ChannelConfig::with_timeout(Duration::from_secs(5));
//! let mut chan = Channel::new(a.handshake(&eb)?, cfg, &MONOTONIC);
//! let _peer = b.handshake(&ea)?;
//!
//! let mut src = [7u8; 64];
//! let src = pd.register(&mut src, AccessFlags::LOCAL_WRITE)?; // local only: a borrow will do
//! // Memory a peer may write is owned by its registration.
//! let dst = pd.register_shared(vec![0u8; 64].into_boxed_slice(),
//!                              AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE)?;
//! chan.write(&[src.sge(0..64).unwrap()], dst.remote())?; // blocks until complete, at most 5 s
//! let mut got = [0u8; 64];
//! dst.read_into(0, &mut got);
//! assert_eq!(got, [7u8; 64]);
//! # Ok(()) }
//! # #[cfg(not(feature = "verbs"))] fn main() {}
//! ```
//!
//! More to start from, each a doctest without `unsafe`: a barrier loop of four ranks on the
//! software model ([`node`]'s "A barrier loop"), a two-process RC ping-pong in
//! `rverbs-bootstrap`'s crate docs (and the README's quick look), and a multicast feed on a
//! device ([`datagram`]).
//!
//! # Map
//! - [`verbs`]: safe wrappers over `ibverbs-sys` (device, port, GID, PD, MR, CQ, QP).
//! - [`provider`]: the seam the engine is written against (a real QP implements it);
//!   [`model`]: the software model, an in-memory fabric that implements it too; `instant`
//!   (feature `instant`): the instant device, for counting rverbs' own cost.
//! - [`channel`]: one peer — blocking, batched, scoped and ticket posting (a bare verb waits;
//!   `post_*` returns a ticket); the lowest-latency call for each operation is named there.
//! - [`multi`], [`node`], [`barrier`]: many peers, ranks, barriers.
//! - [`datagram`]: unreliable datagrams (UD) to any peer and multicast to many, with the
//!   network header stripped and losses counted; [`gid`]: port and group addresses.
//! - `cm` (feature `rdmacm`): the RDMA connection manager: connect a channel by address and
//!   port, listen and accept, disconnect; join multicast groups through it.
//! - [`wire`]: the bytes exchanged with peers; [`params`]: typed QP knobs;
//!   [`poll`]: clocks, deadlines and back-off.
//!
//! Every word these modules use (rank, post, ticket, region, window, failure, wake-up, ...)
//! has one meaning, defined in the repository's `docs/glossary.md`.
//!
//! # Layers
//! Bottom first. A module uses only the modules before it in this list, never one after,
//! so no two modules form a circle; `tools/layers` checks it in CI (a link in a doc comment
//! is not a use).
//! 1. Words: [`verb`] (the verbs' names, [`ProviderError`](verb::ProviderError), errno
//!    values), [`gid`], [`sge`], [`params`], `fatal`, [`wr`], [`completion`], [`failure`]
//!    (what a failure is, not how news of it travels), and `fifo` (the one fixed-capacity
//!    queue every layer keeps its rings in).
//! 2. Memory and time: [`memory`] (regions and who owns what a device can reach), [`poll`].
//! 3. Wire formats: [`wire`], every byte layout a peer reads (endpoints, node flags,
//!    notices, datagram headers).
//! 4. The device: [`verbs`], the safe wrappers over libibverbs.
//! 5. Providers: [`provider`], the seam the engine is written against and the device's
//!    implementation of it; then [`model`] (the software model) and `instant` (the instant
//!    device), each in a folder of its own.
//! 6. One peer: [`channel`] (connected), [`datagram`] (unreliable datagrams and multicast).
//! 7. The connection manager: `cm` (it connects channels, so it sits above them; a
//!    datagram queue pair joins groups through it by the provider's `GroupJoiner`).
//! 8. Many peers: [`multi`], then [`barrier`], then [`node`].
//!
//! # Cargo features
//! - `verbs` (default): the device layer, linking libibverbs through `ibverbs-sys`.
//!   Implies `alloc` (reference-counted setup-time handles; never touched on the data path).
//! - `alloc`: [`multi`], [`barrier`] (allocate only at setup).
//! - `rdmacm`: the `cm` module, linking the system's librdmacm (Debian `librdmacm-dev`;
//!   bindings generated at build time, so libclang too). Implies `verbs`.
//! - `serde`: serde traits on configuration types.
//! - `instant`: the `instant` module, a driver that completes every request at once without
//!   touching memory, for measuring rverbs' own cost (implies `verbs`).
//! - `device-tests`: builds the tests that need an RDMA device.
//!
//! Without default features the crate needs neither std nor alloc nor libibverbs, and builds
//! for `x86_64-unknown-none`.
//!
//! # Thread safety
//! A [`channel::Channel`] is `Send` when its provider is (the verbs provider is): move it to
//! the thread that polls it. Nothing is `Sync`-shared on the data path; one thread owns a
//! channel, as the busy-poll model wants. `Context` and `Pd` are `Send + Sync` and cheap to
//! clone. A `Cq` is `Send` but neither `Sync` nor `Clone` (polling needs `&mut`), and a
//! `SharedRegion` is `Send` but not `Sync` (its byte views are not atomic): safe code never
//! polls one queue or touches one region from two threads at once.
//!
//! # Memory and waits
//! Memory a peer can reach is owned by its registration ([`memory`], `verbs::mr`), so no
//! safe code can free it while a key to it is valid. Every wait is bounded by the channel's
//! timeout ([`channel::ChannelConfig::timeout`]); on expiry the queue pair is flushed and
//! drained before the call returns. `docs/safety.md` lists every rule beside its test.
//!
//! # Resource cleanup
//! Every verbs object is released on drop, children before parents (a queue pair keeps its
//! CQs and PD alive; an MR keeps its PD alive). Dropping a channel with work in flight is
//! safe for memory, because the posting contract already required the buffers to outlive
//! the work; destroying the queue pair flushes it. A datagram queue pair is detached from
//! its multicast groups before it is destroyed (the kernel refuses to destroy an attached
//! one). A destroy the device refuses anyway cannot be reported from `Drop`: it leaks the
//! object and is counted (`verbs::failed_destroys`).
//!
//! # The posting contract
//!
//! Every `unsafe` posting function in rverbs has the same contract, stated here once:
//! **every buffer named by a work request stays valid, and is not accessed by the CPU in a way
//! that conflicts with the device (no writes to a buffer the device reads, no access at all to
//! one it writes), until that request's completion has been polled** (or the completion of a
//! later signaled request on the same send queue, which implies it). Dropping or reusing a
//! buffer earlier is undefined behaviour: the device reads or writes it by DMA regardless of
//! what Rust believes.
//!
//! The blocking and scoped APIs uphold it for you with borrows, and on every exit path
//! (error, timeout, panic) they wait for or flush what they posted before the borrows end.

#[cfg(feature = "alloc")]
extern crate alloc;

// `unsafe` is denied crate-wide; the modules below that need it say why. Everything else
// (barrier algorithms, completions, parameters, clocks, wire formats, work requests) is
// safe code.
#[cfg(feature = "alloc")]
pub mod barrier;
// Posting hands the device raw addresses; the posting contract is enforced here.
#[allow(unsafe_code)]
pub mod channel;
// The second FFI boundary: every call into librdmacm.
#[cfg(feature = "rdmacm")]
#[allow(unsafe_code)]
pub mod cm;
pub mod completion;
// Receive slots are read after their completion; inline entries are made from slices.
#[allow(unsafe_code)]
pub mod datagram;
pub mod failure;
mod fatal;
#[cfg(feature = "alloc")]
mod fifo;
pub mod gid;
// The instant device is a driver: the C structures libibverbs hands to one, and its
// operations, written in Rust.
#[cfg(feature = "instant")]
#[allow(unsafe_code)]
pub mod instant;
// Owned memory is an `unsafe trait`; volatile access to bytes the device writes.
#[allow(unsafe_code)]
pub mod memory;
// The software model executes work requests on raw memory, as a device does.
#[allow(unsafe_code)]
pub mod model;
// Multi-peer calls post through the channel's `unsafe` calls under a drain guard.
#[cfg(feature = "alloc")]
#[allow(unsafe_code)]
pub mod multi;
// Receive rings are posted through `Channel::post_recv` and read after completion.
#[cfg(feature = "alloc")]
#[allow(unsafe_code)]
pub mod node;
pub mod params;
pub mod poll;
// The provider trait's posts are `unsafe fn`; the model executes work on raw memory; the
// verbs provider forwards to FFI.
#[allow(unsafe_code)]
pub mod provider;
// Scatter/gather entries are built from raw parts by the regions that own the memory.
#[allow(unsafe_code)]
pub mod sge;
pub mod verb;
// The FFI boundary: every call into libibverbs.
#[cfg(feature = "verbs")]
#[allow(unsafe_code)]
pub mod verbs;
pub mod wire;
pub mod wr;
