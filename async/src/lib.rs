//! async/await for rverbs that stays sound when futures are cancelled.
//!
//! In async Rust a future can be dropped, or `mem::forget`-ten, at any await point, so a
//! future cannot keep a *borrowed* buffer safe while the NIC writes it: the borrow ends with
//! the future, and the device does not know. rverbs-async therefore never lends the device
//! a borrow: an operation takes an owned registered buffer (any
//! [`Region`](rverbs_core::memory::Region): an `OwnedRegion`, a std-shim huge-page region,
//! a software-model region) and gives it back with the result. The moment before it posts,
//! the buffer moves into the [`AsyncChannel`]; if the future is dropped, the buffer stays
//! there until the completion is polled (or the channel was flushed and drained at its
//! deadline), and only then is it released. See [`AsyncChannel`]'s "Cancellation".
//!
//! ```no_run
//! # #[cfg(feature = "tokio")]
//! # async fn f<P: rverbs_core::provider::Provider, M: rverbs_core::memory::Region>(
//! #     chan: rverbs_core::channel::Channel<P>, // a `VerbsProvider`'s, on a device
//! #     buf: M,                                 // an `OwnedRegion`, on a device
//! #     remote: rverbs_core::sge::RemoteMemory,
//! # ) -> Result<(), Box<dyn std::error::Error>> {
//! use rverbs_async::{AsyncChannel, TokioEvents};
//!
//! // The completion channel of the channel's queues (`PreparedVerbs::with_events`; for a
//! // node, `Node::wakeup_source_shared()`).
//! let events = chan.provider().wakeup_source().ok_or("no completion channel")?;
//! let mut chan = AsyncChannel::new(chan, TokioEvents::new(events)?);
//! let (r, buf) = chan.write(buf, 0..64, remote).await; // the task sleeps until the NIC wakes it
//! r?;
//! let (r, buf) = chan.fetch_add(buf, 64, remote.slice(0, 8).unwrap(), 1).await;
//! println!("previous value {}", r?);
//! # let _ = buf; Ok(()) }
//! ```
//!
//! [`AsyncNode`] awaits a node's barriers and messages the same way; they use only memory
//! the node owns, so a dropped barrier is simply resumed by the next call.
//! [`AsyncDatagram`] awaits datagrams (UD, multicast) on a
//! [`Datagram`](rverbs_core::datagram::Datagram) endpoint, which owns its receive slots and
//! keeps them posted: a multicast subscriber sleeps on the endpoint's completion channel
//! (`VerbsDatagram::with_events`), and a dropped receive lends the device nothing and loses
//! no datagram.
//!
//! # Waking
//! [`TokioEvents`] (feature `tokio`) arms the completion queues, polls once more, then sleeps
//! on the completion channel's descriptor through tokio's reactor (`AsyncFd`) and a tokio
//! timer at the wait's deadline; the deadline is the channel's timeout from the post, so
//! every wait is bounded as every blocking wait is. The [`Events`] trait is the seam: the
//! software model (and Miri) uses [`YieldEvents`], which re-polls on every turn.
//!
//! # Cargo features
//! - `tokio` (default): [`TokioEvents`]. Without it the crate has no runtime dependency.
//!
//! # Thread safety
//! An [`AsyncChannel`] is one queue pair polled by one task at a time (`&mut self`), like a
//! `Channel`. It is `Send` when its parts are, so a task holding it may move between
//! worker threads.
//!
//! # Resource cleanup
//! Dropping an [`AsyncChannel`] with an orphaned operation (its future was dropped after it
//! posted) blocks the dropping thread until that operation completed, at most the
//! channel's timeout, after which the queue pair is flushed and drained; then the buffer is
//! dropped. A runtime shut down with operations in flight drops their tasks, and with them
//! the channels: the same rule applies. Forgetting the channel leaks its buffer.
//!
//! # Allocation
//! Operations allocate nothing: futures are state machines inside the task, buffers move
//! into a slot the channel owns, and [`TokioEvents`] reuses its reactor registration and
//! timer. tokio itself allocates when a task is spawned and when a descriptor is first
//! registered (setup), not per wait (`tests/model.rs` counts).

#![deny(unsafe_op_in_unsafe_fn)]

mod channel;
mod datagram;
mod error;
mod events;
mod node;
mod ring;

pub use channel::AsyncChannel;
pub use datagram::AsyncDatagram;
pub use error::AsyncError;
#[cfg(feature = "tokio")]
pub use events::TokioEvents;
pub use events::{Events, YieldEvents};
pub use node::AsyncNode;
pub use ring::AsyncRing;

/// The code of this crate's README (`README.md`, repeated verbatim in the workspace
/// README's async section: `tests/readme.rs` checks), compiled by `cargo test --doc`.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
struct ReadmeDoctests;
