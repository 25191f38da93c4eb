//! The seam for datagrams: what the [`Datagram`](crate::datagram::Datagram) endpoint needs
//! from an unreliable-datagram (UD) queue pair, behind one trait.
//!
//! Two implementations exist, as for RC:
//! - [`verbs_ud`](super::verbs_ud) (feature `verbs`): a [`UdQp`](crate::verbs::UdQp) with
//!   its own two completion queues, address handles for addresses, and multicast groups
//!   joined on the device and in the IP layer;
//! - the software model's [`NetDatagram`](crate::model::NetDatagram) (feature `alloc`):
//!   datagram queue pairs on the nodes of a [`SoftNet`](crate::model::SoftNet), unicast and
//!   multicast fan-out, executed deterministically inside the calls.
//!
//! What both promise: a send completes once the datagram left (whether anybody received it
//! or not), in posting order; a receive completes with the 40-byte network header
//! ([`crate::wire::grh`]) in front of the payload, `byte_len` counting both, and the
//! sender's queue pair number; [`DatagramProvider::set_error`] flushes every outstanding
//! request, and requests posted after it complete flushed.

use crate::completion::{Completion, DatagramCompletion};
use crate::gid::Gid;
use crate::params::QpCaps;
use crate::provider::ProviderError;
use crate::wr::{DatagramRequest, PostFailure, RecvRequest};

/// Where a datagram goes, before the provider makes an address of it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Destination {
    /// A port (or a multicast group) by GID: a routed address with a global route header,
    /// what RoCE requires.
    Gid(Gid),
    /// A port inside one InfiniBand subnet, by LID.
    Lid(u16),
}

/// One datagram queue pair with its own send and receive completion queues. See the
/// [module docs](self).
pub trait DatagramProvider {
    /// What a send names as its destination: an address handle on a device. Cloned by the
    /// endpoint and kept until every send that named it has completed (a device may read
    /// the handle when it executes the send, not when it was posted).
    ///
    /// Part of the contract an implementation of [`post_send`](Self::post_send) accepts
    /// with its `unsafe`: the clone must not panic (the endpoint clones an address for a
    /// new run of sends after the post, and a send whose clone unwound would be held by
    /// nothing).
    type Address: Clone;

    /// Whether `a` and `b` are the same address (one handle and its clones), so that a
    /// stream of sends to one destination keeps one clone, not one per send. The default
    /// says no, which is always safe. Does not allocate.
    ///
    /// The endpoint's soundness rests on the answer, as on [`post_send`](Self::post_send)'s
    /// contract: say `true` only when a clone of `a` keeps `b`'s device handle alive (the
    /// verbs provider compares the shared handle's pointer; the model's addresses are plain
    /// values that own nothing).
    #[inline]
    fn same_address(a: &Self::Address, b: &Self::Address) -> bool {
        let _ = (a, b);
        false
    }

    /// What the queue pair can hold.
    fn caps(&self) -> QpCaps;

    /// The queue pair's number: what senders address and receivers see as the source.
    fn qp_num(&self) -> u32;

    /// The Q_Key datagrams to this queue pair must carry.
    fn qkey(&self) -> u32;

    /// The GID of the port this queue pair sends from (its address for senders on RoCE).
    fn gid(&self) -> Gid;

    /// The LID of the port (InfiniBand; 0 on RoCE).
    fn lid(&self) -> u16;

    /// The largest payload a datagram may carry (the path MTU, in bytes).
    fn mtu(&self) -> u32;

    /// The address of `to`, to send to. Setup: may allocate (an address handle); keep it.
    fn address(&mut self, to: Destination) -> Result<Self::Address, ProviderError>;

    /// Whether this queue pair may send with `address` (made by another provider, say): on a
    /// device, whether the address handle belongs to the queue pair's protection domain. The
    /// default takes every address (the model's are plain values). Does not allocate.
    #[inline]
    fn owns(&self, address: &Self::Address) -> bool {
        let _ = address;
        true
    }

    /// Posts the sends as one chain (one doorbell). At most
    /// [`MAX_BATCH`](crate::wr::MAX_BATCH) requests.
    ///
    /// # Safety
    /// The [posting contract](crate#the-posting-contract).
    unsafe fn post_send(
        &mut self,
        wrs: &[DatagramRequest<'_, Self::Address>],
    ) -> Result<(), PostFailure>;

    /// Posts receives as one chain. At most [`MAX_BATCH`](crate::wr::MAX_BATCH) requests.
    ///
    /// # Safety
    /// The [posting contract](crate#the-posting-contract).
    unsafe fn post_recv(&mut self, wrs: &[RecvRequest<'_>]) -> Result<(), PostFailure>;

    /// Polls send completions into `out`; returns how many.
    fn poll_send(&mut self, out: &mut [Completion]) -> Result<usize, ProviderError>;

    /// Polls receive completions into `out`; returns how many.
    fn poll_recv(&mut self, out: &mut [DatagramCompletion]) -> Result<usize, ProviderError>;

    /// Moves the queue pair to the error state: every outstanding request completes,
    /// flushed.
    fn set_error(&mut self) -> Result<(), ProviderError>;

    /// Makes the queue pair a member of the multicast group `group`: datagrams sent to the
    /// group are delivered to it too. Setup: may allocate. Joining a group twice is refused (`EINVAL`).
    fn join_group(&mut self, group: Gid) -> Result<(), ProviderError>;

    /// Ends the membership in `group`: nothing sent to it after this is delivered here.
    /// Leaving a group not joined is refused (`EINVAL`).
    fn leave_group(&mut self, group: Gid) -> Result<(), ProviderError>;

    /// The wake-up source of this queue pair's completion queues (their completion events),
    /// if they raise any
    /// ([`VerbsDatagram::with_events`](super::verbs_ud::VerbsDatagram::with_events)): what
    /// an event loop sleeps on until a datagram arrives (rverbs-async's `AsyncDatagram`).
    /// `None` (the default) for queues without a completion channel, and on the model.
    #[cfg(feature = "alloc")]
    fn wakeup_source(&self) -> Option<alloc::sync::Arc<dyn crate::poll::Wakeup>> {
        None
    }
}
