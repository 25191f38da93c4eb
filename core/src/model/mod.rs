//! A deterministic in-memory model of one RC connection: two queue pairs, their completion
//! queues and their registered memory, inside one [`SoftFabric`].
//!
//! The model exists so that the engine ([`crate::channel`]) builds and is tested without a
//! device, under `no_std`, Miri and fuzzers. It follows what an RC queue pair guarantees and
//! what the engine relies on (in-order execution and completion, selective signaling, error
//! state with flushes, RNR and transport retries); it models no timing, congestion or MTU.
//!
//! For a whole world (many nodes connected pairwise, a protection domain and two shared
//! completion queues per node), the `net` module (feature `alloc`) runs the same rules.
//!
//! ```
//! use rverbs_core::completion::{Completion, CompletionKind, WcStatus};
//! use rverbs_core::params::{QpCaps, RetryCount, RnrRetry};
//! use rverbs_core::memory::AccessFlags;
//! use rverbs_core::model::{Side, SoftFabric};
//! use rverbs_core::provider::{Provider, QueuePair};
//! use rverbs_core::wr::{Opcode, SendFlags, WorkRequest};
//!
//! let caps = QpCaps::queues(16, 16).with_sges(2);
//! // Buffers outlive the fabric: it may touch them for as long as it exists.
//! let (mut src, mut dst) = ([0u8; 16], [0u8; 16]);
//! let fabric = SoftFabric::new(caps, RnrRetry::default(), RetryCount::default());
//! let a_mem = fabric.register(Side::A, &mut src, AccessFlags::LOCAL_WRITE).unwrap();
//! let b_mem = fabric
//!     .register(Side::B, &mut dst, AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE)
//!     .unwrap();
//! a_mem.write_from(0, b"hello");
//! let (mut a, _b) = fabric.ends().unwrap();
//! let sges = [a_mem.sge(0..5).unwrap()];
//! let wr = WorkRequest {
//!     wr_id: 7,
//!     opcode: Opcode::Write,
//!     flags: SendFlags::SIGNALED,
//!     sges: &sges,
//!     remote: b_mem.remote(),
//! };
//! // SAFETY: the source region outlives the request, which we poll to completion below.
//! unsafe { a.post_send(&[wr]) }.unwrap();
//! let mut wc = [Completion::EMPTY; 4];
//! assert_eq!(a.poll_send(&mut wc).unwrap(), 1);
//! assert_eq!(wc[0].wr_id, 7);
//! assert_eq!((wc[0].status, wc[0].kind), (WcStatus::Success, CompletionKind::Write));
//! let mut got = [0u8; 5];
//! b_mem.read_into(0, &mut got);
//! assert_eq!(&got, b"hello");
//! ```
//!
//! # When work executes
//! Deterministically, inside the provider calls, never behind the caller's back:
//! - every call ([`QueuePair::post_send`], [`QueuePair::post_recv`], the polls,
//!   [`QueuePair::set_error`]) runs both send queues (side A's, then side B's) from their
//!   heads as far as they can go: posts and `set_error` after doing their own job, polls
//!   before they look at their completion queue. So a write, read or a send that
//!   finds a receive completes inside the `post_send` that posted it, and a send blocked by a
//!   missing receive runs inside the peer's `post_recv` that supplies one;
//! - a request at the head of a send queue that cannot run (no receive at the peer: RNR; the
//!   peer is dead or in the error state: no ACK) waits. Each [`Provider::poll_send`] of its
//!   own side is one retry "timer tick": after the first failed attempt, `rnr_retry` (or
//!   `retry_count`) ticks that still find the peer not ready fail the request with
//!   [`WcStatus::RnrRetryExceeded`] (or [`WcStatus::RetryExceeded`]). `RnrRetry::Infinite`
//!   never gives up. Runs triggered by other calls retry for free (they succeed only if the
//!   peer became ready), so a receive posted in time always wins.
//!
//! # Semantics
//! - **Posting**: at most [`MAX_BATCH`] requests per call (else `EINVAL`, nothing posted).
//!   Queue occupancy counts a send request from its post until a send completion at or past
//!   it has been *polled* (as on hardware, where an unsignaled request's slot is freed by a
//!   later signaled one), a receive until its completion has been polled. A request that does
//!   not fit fails the post with `ENOMEM` (12), one with more entries than the caps allow, an
//!   inline read, or an inline payload over `max_inline_data` with `EINVAL` (22);
//!   [`PostFailure::posted`] says how many of the chain were posted (and will run).
//! - **Inline** sends and writes copy their bytes at post time and ignore the lkey.
//! - **Local memory** is resolved by lkey when the request executes: the range must lie inside
//!   a live region of the posting side; receive buffers and read targets also need
//!   [`AccessFlags::LOCAL_WRITE`]. A failure completes the request with
//!   [`WcStatus::LocalProtection`]. Zero-length entries are not checked.
//! - **Remote memory** is resolved by rkey on the peer: writes need
//!   [`AccessFlags::REMOTE_WRITE`], reads [`AccessFlags::REMOTE_READ`], and
//!   `remote.addr .. remote.addr + length` must lie inside the region, where the length is
//!   the total of the local entries (`RemoteMemory::len` is ignored, as the device ignores
//!   it). A failure completes the request with [`WcStatus::RemoteAccess`] and, as on rxe
//!   (class C responder error), moves the *peer* to the error state too. Zero-length RDMA
//!   is not checked.
//! - **Atomics** ([`Opcode::Atomic`](crate::wr::Opcode::Atomic)) take exactly one 8-byte
//!   local entry and no `INLINE` flag (else `EINVAL` at post, as rxe does). When the request
//!   executes, the entry needs [`AccessFlags::LOCAL_WRITE`] (else
//!   [`WcStatus::LocalProtection`]); the rkey must grant [`AccessFlags::REMOTE_ATOMIC`] on the
//!   8 bytes at `remote.addr` (else [`WcStatus::RemoteAccess`]), and the address must be
//!   8-aligned (else [`WcStatus::RemoteInvalidRequest`], the NAK-invalid-request a responder
//!   sends); both failures move the peer to the error state too. The word is read and written
//!   little-endian, and the value it held before lands in the local entry. Requests execute
//!   one at a time, so atomics are atomic with respect to each other (as on a device, not
//!   with respect to RDMA writes or the CPU's stores to the same word). The completion has
//!   kind [`CompletionKind::Atomic`] and `byte_len` 8.
//! - **Two-sided**: `Send`/`SendImm`/`WriteImm` consume the peer's oldest receive. Its
//!   completion reports kind `Recv` (or `RecvWriteImm`), `byte_len` (the message length; for
//!   a write with immediate the written length, as verbs does), and the immediate. A message
//!   longer than the receive completes the receive with [`WcStatus::LocalLength`] and the
//!   send with [`WcStatus::RemoteInvalidRequest`] (the NAK-invalid-request IB prescribes); a
//!   receive whose entries do not resolve completes with [`WcStatus::LocalProtection`] and
//!   the send with [`WcStatus::RemoteOperation`]. Both queue pairs go to the error state.
//! - **Completions**: a signaled successful request yields a send completion (kind `Send`,
//!   `Write` or `Read`, `byte_len` the transfer length, as rxe reports it); an unsignaled one
//!   yields none. A failed request yields an error completion even if unsignaled, its queue
//!   pair enters the error state, and every outstanding send and receive of that queue pair
//!   then completes with [`WcStatus::Flushed`], signaled or not (as rxe does). Error
//!   completions have kind [`CompletionKind::Other`] (verbs leaves the opcode undefined).
//! - **Error state**: [`QueuePair::set_error`] flushes everything outstanding. Posting in the
//!   error state is allowed, and the requests complete flushed (as verbs does). A queue pair
//!   stays in the error state for the life of the fabric.
//! - [`SoftFabric::kill`] makes a side dead (its queues are flushed, as if its process
//!   died): the peer's requests then get no answer and fail with [`WcStatus::RetryExceeded`]
//!   after `retry_count` ticks; its receives never complete. A peer in the error state is
//!   treated the same way, as a real responder in the error state drops requests.
//!
//! # Capacities
//! Queues are fixed arrays of [`QUEUE_CAP`] entries; [`SoftEnd::caps`](QueuePair::caps)
//! reports the requested caps clamped to [`QUEUE_CAP`], [`MAX_SGE`] and [`MAX_INLINE`]. Each
//! completion queue holds [`QUEUE_CAP`] entries, and cannot overflow: every completion
//! belongs to a request that still occupies its queue (occupancy ends only when that
//! completion, or a later one, is polled), and occupancy is bounded by the queue depth. (If
//! it ever did, polling reports `EOVERFLOW` instead of losing completions silently.)
//!
//! # Memory
//! [`SoftFabric::register`] takes a buffer borrowed for the whole life of the fabric (`'m`),
//! not just of the [`SoftRegion`]: a region that is leaked (`mem::forget`) stays in the
//! table, and the buffer must still be valid if a peer writes through the stale rkey. Keys
//! carry the side, the kind (lkey or rkey), the table slot and a generation, scrambled, so a
//! key of a dropped region, or of the other side, or an lkey used as rkey, does not resolve.
//! The CPU reaches region bytes only through volatile copies, as with the `verbs` layer's
//! `SharedRegion`, memory that peers may write at any time.
//!
//! Addresses in entries are turned back into pointers by offset from the registered base
//! pointer, which keeps provenance (Miri accepts it). Inline entries are the exception: the
//! engine makes them from an arbitrary slice (`as_ptr() as u64`, which exposes the
//! provenance), so the model reads them with [`core::ptr::with_exposed_provenance`].
//!
//! # Thread safety
//! None needed: the fabric uses `RefCell`, and neither it nor its ends are `Send` or `Sync`.

use crate::memory::AccessFlags;
use core::fmt;

// Named only by links in the module docs above.
use crate::verb::errno::{EINVAL, ENOMEM, EOVERFLOW};
#[cfg(doc)]
use crate::{
    completion::{CompletionKind, WcStatus},
    provider::{Provider, QueuePair},
    wr::{PostFailure, MAX_BATCH},
};

mod entry;
mod execute;
mod fabric;
mod keys;
#[cfg(feature = "alloc")]
pub mod net;
mod pair;
mod queues;
mod region;
mod spans;
#[cfg(test)]
mod tests;

pub use fabric::{SoftEnd, SoftFabric};
#[cfg(feature = "alloc")]
pub use net::{NetAddress, NetCq, NetDatagram, NetQp, NetRegion, SoftNet, SoftNetConfig};
pub use region::SoftRegion;

/// Entries of every queue (send, receive and both completion queues) of each side.
pub const QUEUE_CAP: usize = 256;
/// Most scatter/gather entries per request.
pub const MAX_SGE: usize = 8;
/// Largest inline payload in bytes.
pub const MAX_INLINE: usize = 64;
/// Memory regions per side.
pub const MAX_REGIONS: usize = 16;

const QP_NUMS: [u32; 2] = [0x0000_0b11, 0x0000_0b12];

/// One of the two queue pairs of a [`SoftFabric`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Side {
    /// The first end (`ends().0`).
    A,
    /// The second end (`ends().1`).
    B,
}

impl Side {
    /// The other side.
    #[inline]
    pub const fn peer(self) -> Side {
        match self {
            Side::A => Side::B,
            Side::B => Side::A,
        }
    }

    #[inline]
    const fn index(self) -> usize {
        match self {
            Side::A => 0,
            Side::B => 1,
        }
    }

    /// The queue pair number completions of this side carry.
    #[inline]
    pub const fn qp_num(self) -> u32 {
        QP_NUMS[self.index()]
    }
}

/// Why a registration failed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum SoftError {
    /// The buffer is empty.
    EmptyBuffer,
    /// `REMOTE_WRITE` or `REMOTE_ATOMIC` without `LOCAL_WRITE` (as the device requires).
    RemoteWriteNeedsLocalWrite,
    /// All slots of the region table are in use ([`MAX_REGIONS`] per side of a fabric,
    /// `max_regions` per node of a net).
    TableFull,
    /// A net has no node of that number.
    NoSuchNode,
    /// A net has issued all its key generations (one per registration; see "Memory and
    /// keys" in the docs of the `net` module).
    KeysExhausted,
}

impl fmt::Display for SoftError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::EmptyBuffer => "soft register: the buffer is empty",
            Self::RemoteWriteNeedsLocalWrite => {
                "soft register: remote write or atomic access needs local write access too"
            }
            Self::TableFull => "soft register: the region table is full",
            Self::NoSuchNode => "soft register: no node of that number in the net",
            Self::KeysExhausted => "soft register: the net has issued all its key generations",
        })
    }
}

impl core::error::Error for SoftError {}

/// Counters of one side, for tests that check what the engine asked for.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct SoftStats {
    /// Send-queue requests accepted.
    pub sends_posted: u64,
    /// Receive requests accepted.
    pub recvs_posted: u64,
    /// Send completions generated (signaled successes, errors and flushes).
    pub send_cqes: u64,
    /// Receive completions generated.
    pub recv_cqes: u64,
    /// RNR retries (ticks that found no receive at the peer).
    pub rnr_retries: u64,
    /// Transport retries (ticks that found the peer dead or in the error state).
    pub transport_retries: u64,
    /// Datagrams that reached a datagram queue pair of this node and were dropped: no
    /// receive posted, a Q_Key it does not expect, or the queue pair in the error state.
    pub datagrams_dropped: u64,
}
