//! [`Channel`]: one reliable connection to one peer, posted and polled by one thread.
//!
//! # One posting rule
//! A bare verb (`send`, `write`, `read`, `recv`, ...) posts and waits for completion. A
//! `post_*` call posts and returns a [`Ticket`]; [`Channel::wait`] (or `try_wait`,
//! `wait_until`) takes any ticket and returns what it delivered ([`Done`]). The same names
//! mean the same on [`Scope`], [`Batch`], [`MultiChannel`](crate::multi::MultiChannel) and
//! [`Node`](crate::node::Node).
//!
//! | style | how | buffers |
//! |---|---|---|
//! | blocking | [`Channel::send`], [`Channel::write`], [`Channel::read`], [`Channel::recv`], [`Channel::compare_swap`], [`Channel::fetch_add`], and the `_inline`/`_imm` forms | borrowed for the call |
//! | batched (one doorbell) | [`Channel::batch`], then [`Batch::run`] (waits) or `unsafe` [`Batch::post`] (ticket) | borrowed for the batch |
//! | scoped | [`Channel::scope`]: [`Scope::send`], [`Scope::write_inline`], ... return tickets; the scope waits for everything before it returns, even on panic | borrowed for the scope |
//! | ticket | [`Channel::post_send_inline`] and [`Channel::post_write_inline`] (safe: the bytes are copied), `unsafe` [`Channel::post_send`], [`Channel::post_write`], [`Channel::post_read`], [`Channel::post_compare_swap`], [`Channel::post_fetch_add`], [`Channel::post_recv`] | the caller's, under the [posting contract](crate#the-posting-contract) |
//!
//! Every style takes inline payloads (copied at post time, no registered memory) and
//! registered memory alike, all without `unsafe`:
//!
//! ```
//! #![forbid(unsafe_code)]
//! use rverbs_core::channel::{Channel, ChannelConfig};
//! use rverbs_core::memory::AccessFlags;
//! use rverbs_core::params::{QpCaps, RetryCount, RnrRetry};
//! use rverbs_core::poll::StepClock;
//! use rverbs_core::model::{Side, SoftFabric};
//!
//! static CLOCK: StepClock = StepClock::new(core::time::Duration::from_micros(1));
//! let caps = QpCaps::queues(32, 32).with_sges(2);
//! let (mut src, mut dst) = ([7u8; 64], [0u8; 64]);
//! let fabric = SoftFabric::new(caps, RnrRetry::default(), RetryCount::default());
//! let src = fabric.register(Side::A, &mut src, AccessFlags::LOCAL_WRITE).unwrap();
//! let dst = fabric
//!     .register(Side::B, &mut dst, AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE)
//!     .unwrap();
//! let (a, _b) = fabric.ends().unwrap();
//! let mut chan = Channel::new(a, ChannelConfig::default(), &CLOCK);
//! let (sges, at) = ([src.sge(0..8).unwrap()], |o| dst.remote().slice(o, 8).unwrap());
//!
//! // Blocking: post and wait.
//! chan.write(&sges, at(0)).unwrap();
//! chan.write_inline(b"inline-1", at(8)).unwrap();
//! // Batched: one doorbell, then wait.
//! let mut batch = chan.batch();
//! batch.write(&sges, at(16)).unwrap();
//! batch.write_inline(b"inline-2", at(24)).unwrap();
//! batch.run().unwrap();
//! // Scoped: tickets inside, everything waited for at the end.
//! chan.scope(|s| {
//!     s.write(&sges, at(32))?;
//!     s.write_inline(b"inline-3", at(40))
//! })
//! .unwrap()
//! .unwrap();
//! // Ticket: the lowest-latency write, waited for later.
//! let t = chan.post_write_inline(b"inline-4", at(48)).unwrap();
//! chan.wait(t).unwrap();
//!
//! let mut got = [0u8; 56];
//! dst.read_into(0, &mut got);
//! assert_eq!(&got[8..16], b"inline-1");
//! assert_eq!(&got[48..56], b"inline-4");
//! assert_eq!(&got[32..40], &[7u8; 8]);
//! ```
//!
//! **The lowest-latency calls**: for small payloads, [`Channel::post_write_inline`] and
//! [`Channel::post_send_inline`] (no registered memory, one doorbell, no wait; the next
//! signaled request retires them). For larger payloads, a [`Batch`] of up to
//! [`Channel::max_post`] requests per doorbell, signaled every
//! [`ChannelConfig::signal_every`] requests.
//!
//! # Completion tracking
//! Send requests get consecutive sequence numbers as their `wr_id`. RC completes a send
//! queue in order, so one signaled completion retires every request before it: the channel
//! keeps only "everything below `done` has completed" and the first failure, no map. A send
//! queue slot is reused only after a signaled completion at or past it has been polled.
//!
//! Only every [`ChannelConfig::signal_every`]-th request asks for a completion (and those a
//! call asks for), so a stream of unpolled posts costs the device one completion per k
//! requests. A wait for a ticket that no signaled request covers (its last request and
//! everything after it unsignaled) first posts one signaled zero-length RDMA write: RC
//! completes it after the ticket's requests, and the peer's device answers it without
//! reaching memory (a zero-length RDMA write carries no key to check, IBTA C9-88).
//! Receives complete in order too; their results go to a fixed slot table indexed by
//! sequence number modulo `R`.
//!
//! # Every wait is bounded
//! Every call that waits (a blocking operation, [`Channel::wait`], the end of a scope, a
//! full send queue) gives up after [`ChannelConfig::timeout`] on the channel's [`Clock`](crate::poll::Clock), or
//! at the explicit deadline of the `*_timeout`/`*_until` variants. Giving up, like a failed
//! poll, moves the queue pair to the error state and polls until the device has flushed
//! everything the channel posted, so no buffer is handed back while the device could still
//! use it. If the flush does not drain within [`ChannelConfig::flush_timeout`] (or the queue
//! pair cannot be moved to the error state), the process aborts with a message: the one
//! thing rverbs will not do is return memory the device may still write. The error names
//! the peer ([`ChannelConfig::rank`]).
//!
//! Nothing here allocates.

mod atomic;
mod batch;
mod direct;
mod error;
mod ops;
mod ring;
mod scope;
mod ticket;
mod wait;

pub use batch::Batch;
pub use error::{ChannelError, WrFailure};
pub use ring::{RecvRing, RingMessage};
pub use scope::Scope;
use ticket::Work;
pub use ticket::{Done, Ticket};

use core::fmt;
use core::time::Duration;

pub(crate) use direct::recv_number;
pub(crate) use error::PeerName;

use crate::completion::{Completion, CompletionKind, WcStatus};
use crate::params::QpCaps;
use crate::poll::{Backoff, Spin, StaticClock};
use crate::provider::Provider;
use crate::provider::ProviderError;
use crate::sge::{Sge, SgeMut};
use crate::wr::{PostFailure, RecvRequest, SendFlags, WorkRequest, MAX_BATCH};

const RECV_BIT: u64 = 1 << 63;

/// Source of channel identities: a ticket names the channel that issued it, so a ticket
/// waited on another channel is refused instead of being taken for that channel's work.
static NEXT_ID: core::sync::atomic::AtomicUsize = core::sync::atomic::AtomicUsize::new(1);
const POLL_AT_ONCE: usize = 16;
/// A receive wait polls the send queue too on every `CLOCK_EVERY`-th empty poll (the
/// deadline is read as often, by [`Patience`](crate::poll::Patience)).
const CLOCK_EVERY: u32 = crate::poll::CHECK_EVERY;

/// Which completion queues a wait polls.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Queues {
    /// The send queue alone.
    Sends,
    /// The receive queue, and the send queue as well on every `CLOCK_EVERY`-th empty poll.
    /// What ends a receive wait when the peer is gone is the receive's flush (a failed send
    /// moves the queue pair to the error state, which flushes the receive queue too); the
    /// occasional send poll records the failed send, and in the software model it is the
    /// retry tick that fails it.
    Recvs,
    /// Both.
    Both,
}

/// Channel settings.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct ChannelConfig {
    /// Signal (ask for a completion of) every k-th send request, and no other unless asked:
    /// calls that wait at once (the blocking verbs, [`Batch::run`]) ask for their last
    /// request, and [`Batch::signaled`] asks for any. Waiting for a ticket no signaled
    /// request covers yet posts one signaled zero-length RDMA write behind it (see
    /// [Completion tracking](self#completion-tracking)). Clamped so that a full batch always
    /// fits in the send queue.
    pub signal_every: u32,
    /// How long any call waits for the peer before it gives up with
    /// [`ChannelError::TimedOut`] and breaks the channel (10 s by default). Calls with an
    /// explicit deadline use theirs instead. The bound is only as good as the channel's
    /// clock: a clock that stops, or a timeout so long that the deadline saturates
    /// (`Duration::MAX`), removes it.
    pub timeout: Duration,
    /// How long the device may take to flush outstanding work after a timeout or failure
    /// before the process aborts rather than hand back memory the device may still use
    /// (2 s by default; a flush takes microseconds on a healthy device).
    pub flush_timeout: Duration,
    /// The peer's rank, named in errors. [`crate::node::Node`] sets it; `None` for a channel
    /// used on its own.
    pub rank: Option<u32>,
}

impl Default for ChannelConfig {
    fn default() -> Self {
        Self {
            signal_every: 16,
            timeout: Duration::from_secs(10),
            flush_timeout: Duration::from_secs(2),
            rank: None,
        }
    }
}

impl ChannelConfig {
    /// The defaults with `timeout` as the wait bound.
    pub fn with_timeout(timeout: Duration) -> Self {
        Self {
            timeout,
            ..Self::default()
        }
    }
}

#[derive(Clone, Copy, Debug)]
struct RecvSlot {
    info: Done,
    status: WcStatus,
    vendor_err: u32,
    /// Whether the result in this slot was handed out (or will never be asked for), so the
    /// slot may take the next receive.
    taken: bool,
}

const EMPTY_SLOT: RecvSlot = RecvSlot {
    info: Done {
        byte_len: 0,
        imm: None,
        written: false,
    },
    status: WcStatus::Success,
    vendor_err: 0,
    taken: true,
};

/// A snapshot of one channel's counters ([`Channel::counters`]).
///
/// Counts start at 0 when the channel is built and again when it is renewed. Request counts
/// include the requests rverbs posts itself (a cover request that makes a wait's completion
/// signaled, credit returns and barrier notifications on a node's channels).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct ChannelCounters {
    /// The peer's rank, if the channel was told it.
    pub rank: Option<u32>,
    /// Send-queue requests posted (sends, writes, reads, atomics).
    pub requests_posted: u64,
    /// Send-queue requests known complete (successfully, or flushed after a failure).
    pub requests_completed: u64,
    /// Receives posted.
    pub receives_posted: u64,
    /// Receives completed.
    pub receives_completed: u64,
    /// Whether a wait reached its deadline without the peer answering (the channel broke
    /// then: a channel times out at most once).
    pub timed_out: bool,
    /// The first failure, if the channel is broken ([`Channel::fault`]).
    pub failure: Option<ChannelError>,
}

/// Why the channel broke.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Broken {
    Wr(WrFailure),
    TimedOut,
    Provider(ProviderError),
    /// Closed by a connection manager disconnect (`cm`, feature `rdmacm`).
    #[cfg_attr(not(feature = "rdmacm"), allow(dead_code))]
    Disconnected,
}

/// One connection to one peer. See the [module docs](self).
///
/// `P` is the provider (a real queue pair, or the in-memory model), `B` what waiting loops do
/// between empty polls, and `R` the number of receive slots (a power of two is cheapest).
pub struct Channel<P: Provider, B: Backoff = Spin, const R: usize = 64> {
    p: P,
    id: usize,
    qp_num: u32,
    caps: QpCaps,
    backoff: B,
    clock: StaticClock,
    timeout: Duration,
    flush_timeout: Duration,
    rank: Option<u32>,
    sq_depth: u64,
    signal_every: u32,
    max_post: usize,
    next_seq: u64,
    done_seq: u64,
    /// One past the last signaled send request posted: a wait for requests below it needs
    /// no cover request.
    signaled_to: u64,
    /// Posted requests that consume a receive at the peer (sends, writes with immediate).
    remote_recvs_used: u64,
    since_signal: u32,
    broken: Option<Broken>,
    recv_next: u64,
    recv_done: u64,
    recv_cap: u64,
    slots: [RecvSlot; R],
    /// Where polls put completions: kept across polls, so an empty poll (the common case of
    /// a spinning wait) writes nothing but what the provider writes.
    wc: [Completion; POLL_AT_ONCE],
}

impl<P: Provider + fmt::Debug, B: Backoff, const R: usize> fmt::Debug for Channel<P, B, R> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Channel")
            .field("provider", &self.p)
            .field("rank", &self.rank)
            .field("caps", &self.caps)
            .field("posted", &self.next_seq)
            .field("completed", &self.done_seq)
            .field("recv_posted", &self.recv_next)
            .field("recv_completed", &self.recv_done)
            .field("broken", &self.broken)
            .finish()
    }
}

impl<P: Provider> Channel<P> {
    /// A channel over a connected provider, spinning while it waits, measuring its
    /// timeouts on `clock` (`rverbs_std_shim::MONOTONIC` in std programs).
    pub fn new(p: P, cfg: ChannelConfig, clock: StaticClock) -> Self {
        Channel::with_backoff(p, cfg, Spin, clock)
    }
}

impl<P: Provider, B: Backoff, const R: usize> Channel<P, B, R> {
    /// A channel that calls `backoff` between empty polls (see [`crate::poll::backoff`]) and
    /// measures its timeouts on `clock`.
    ///
    /// If the provider's queues raise completion events
    /// ([`Provider::wakeup_source`]), they are attached to `backoff`, so a blocking
    /// policy sleeps on them.
    #[cfg_attr(not(feature = "alloc"), allow(unused_mut))]
    pub fn with_backoff(p: P, cfg: ChannelConfig, mut backoff: B, clock: StaticClock) -> Self {
        #[cfg(feature = "alloc")]
        if let Some(w) = p.wakeup_source() {
            backoff.attach(&w);
        }
        let mut c = Self {
            id: 0,
            qp_num: 0,
            caps: p.caps(),
            p,
            backoff,
            clock,
            timeout: cfg.timeout,
            flush_timeout: cfg.flush_timeout,
            rank: cfg.rank,
            sq_depth: 1,
            signal_every: 1,
            max_post: 1,
            next_seq: 0,
            done_seq: 0,
            signaled_to: 0,
            remote_recvs_used: 0,
            since_signal: 0,
            broken: None,
            recv_next: 0,
            recv_done: 0,
            recv_cap: 0,
            slots: [EMPTY_SLOT; R],
            wc: [Completion::EMPTY; POLL_AT_ONCE],
        };
        c.start_afresh(cfg.signal_every);
        c
    }

    /// Sets everything that follows from the provider (identity, queue-pair number, caps and
    /// the posting geometry) and forgets every request: the state of a new channel.
    fn start_afresh(&mut self, signal_every: u32) {
        let caps = self.p.caps();
        // One send-queue slot stays free for the drain request of `flush_and_drain`.
        let depth = caps.max_send_wr.saturating_sub(1).max(1);
        // A post of n requests needs n free slots while up to k-1 unsignaled ones may still
        // occupy slots nobody will retire: keep n + k - 1 <= depth. Small queues give up
        // half their depth to the signaling interval rather than signal every request.
        let k = signal_every.clamp(1, (depth / 2).max(1));
        // A new identity: tickets of the old queue pair are foreign to the new one.
        self.id = NEXT_ID.fetch_add(1, core::sync::atomic::Ordering::Relaxed);
        self.qp_num = self.p.qp_num();
        self.caps = caps;
        self.sq_depth = u64::from(depth);
        self.signal_every = k;
        self.max_post = ((depth - k + 1) as usize).min(MAX_BATCH);
        self.next_seq = 0;
        self.signaled_to = 0;
        self.done_seq = 0;
        self.remote_recvs_used = 0;
        self.since_signal = 0;
        self.broken = None;
        self.recv_next = 0;
        self.recv_done = 0;
        self.recv_cap = (R as u64).min(u64::from(caps.max_recv_wr));
        self.slots = [EMPTY_SLOT; R];
    }

    /// Lets `swap` replace the queue pair under the provider (a peer that restarted, see
    /// [`Node::readmit_finish`](crate::node::Node::readmit_finish)), then starts the channel
    /// afresh on it: new identity, sequence numbers from zero, not broken. The channel must
    /// have nothing in flight (flushed and drained, or all completed); `swap` is not called
    /// otherwise. Allocates nothing.
    #[cfg(feature = "alloc")]
    pub(crate) fn renew<E>(
        &mut self,
        swap: impl FnOnce(&mut P) -> Result<(), E>,
    ) -> Result<Result<(), E>, ()> {
        if !self.all_done() {
            return Err(());
        }
        let r = swap(&mut self.p);
        if r.is_ok() {
            let k = self.signal_every;
            self.start_afresh(k);
        }
        Ok(r)
    }

    /// The back-off this channel waits with (to read what a policy recorded, such as
    /// `rverbs_std_shim::StdBackoff::blocked_sleeps`).
    pub fn backoff(&self) -> &B {
        &self.backoff
    }

    /// What the queue pair can hold.
    #[inline]
    pub fn caps(&self) -> QpCaps {
        self.caps
    }

    /// The effective "signal every k-th request".
    #[inline]
    pub fn signal_every(&self) -> u32 {
        self.signal_every
    }

    /// Most requests one post (one doorbell) can carry on this channel.
    #[inline]
    pub fn max_post(&self) -> usize {
        self.max_post
    }

    /// The clock the channel's timeouts are measured on (build explicit deadlines with it).
    #[inline]
    pub fn clock(&self) -> StaticClock {
        self.clock
    }

    /// This channel's identity (the one its tickets carry).
    #[cfg(feature = "alloc")]
    #[inline]
    pub(crate) fn id(&self) -> usize {
        self.id
    }

    /// The peer's rank, if the channel was told it.
    #[inline]
    pub fn peer(&self) -> Option<u32> {
        self.rank
    }

    /// How long a call waits before it gives up ([`ChannelConfig::timeout`]): what callers
    /// that drive waits themselves (`rverbs-async`) bound them with.
    #[inline]
    pub fn timeout(&self) -> Duration {
        self.timeout
    }

    /// The provider, for inspection.
    #[inline]
    pub fn provider(&self) -> &P {
        &self.p
    }

    /// The provider, to poll queues it shares with other channels.
    #[cfg(feature = "alloc")]
    #[inline]
    pub(crate) fn provider_mut(&mut self) -> &mut P {
        &mut self.p
    }

    /// The channel's fault: the first error that broke it, if it is broken (a failure, in
    /// rverbs' words, is news about a rank: [`crate::failure::Failure`]).
    pub fn fault(&self) -> Option<ChannelError> {
        self.broken.map(|b| match b {
            Broken::Wr(w) => ChannelError::Broken(w),
            Broken::TimedOut => ChannelError::TimedOut { rank: self.rank },
            Broken::Provider(e) => ChannelError::Provider(e),
            Broken::Disconnected => ChannelError::Disconnected { rank: self.rank },
        })
    }

    /// What this channel did so far, for an operator: a snapshot of counters the channel
    /// keeps anyway (reading them costs the data path nothing). Does not allocate.
    pub fn counters(&self) -> ChannelCounters {
        ChannelCounters {
            rank: self.rank,
            requests_posted: self.next_seq,
            requests_completed: self.done_seq,
            receives_posted: self.recv_next,
            receives_completed: self.recv_done,
            timed_out: matches!(self.broken, Some(Broken::TimedOut)),
            failure: self.fault(),
        }
    }

    /// Send requests posted and not yet known complete.
    #[inline]
    pub fn outstanding_sends(&self) -> u64 {
        self.next_seq - self.done_seq
    }

    /// Most receives this channel can have outstanding (the queue pair's receive queue, or
    /// the slot table `R` if smaller).
    #[inline]
    pub fn recv_capacity(&self) -> u64 {
        self.recv_cap
    }

    /// Receives posted and not yet complete.
    #[inline]
    pub fn outstanding_recvs(&self) -> u64 {
        self.recv_next - self.recv_done
    }

    /// Requests posted so far that consume a receive at the peer (sends, sends and writes
    /// with immediate): what a receiver's credit returns are counted against.
    #[inline]
    pub fn remote_recvs_used(&self) -> u64 {
        self.remote_recvs_used
    }

    /// Whether `n` more send-queue requests fit without waiting, after one poll if they do
    /// not fit yet (a failed poll breaks the channel and answers `false`). For callers that
    /// must never spin inside a post. Does not allocate.
    pub fn send_room(&mut self, n: usize) -> bool {
        let n = n as u64;
        if self.fits(n) {
            return true;
        }
        self.poll().is_ok() && self.fits(n)
    }

    /// Whether `n` more send-queue requests fit next to those not yet retired.
    #[inline]
    fn fits(&self, n: u64) -> bool {
        // Subtracted, not added: `n` is the caller's (`send_room(usize::MAX)` must say no,
        // not overflow).
        n <= self.sq_depth.saturating_sub(self.next_seq - self.done_seq)
    }

    /// Polls both completion queues once and retires what completed. Returns the number of
    /// completions seen. A failed poll breaks the channel (the next wait flushes and drains
    /// it). Does not allocate.
    pub fn poll(&mut self) -> Result<usize, ChannelError> {
        self.poll_once().map_err(|e| {
            self.broken.get_or_insert(Broken::Provider(e));
            ChannelError::Provider(e)
        })
    }

    /// Polls the send completion queue alone, once, and retires what completed: what a
    /// sender that never receives needs (a bandwidth loop), without the empty poll of the
    /// receive queue that [`Channel::poll`] adds. Returns the number of completions seen. A
    /// failed poll breaks the channel. Does not allocate.
    pub fn poll_sends(&mut self) -> Result<usize, ChannelError> {
        self.poll_send_cq().map_err(|e| {
            self.broken.get_or_insert(Broken::Provider(e));
            ChannelError::Provider(e)
        })
    }

    fn poll_once(&mut self) -> Result<usize, ProviderError> {
        Ok(self.poll_send_cq()? + self.poll_recv_cq()?)
    }

    /// Polls the send completion queue once: what a wait for send requests needs (their
    /// completions come on that queue alone).
    #[inline]
    fn poll_send_cq(&mut self) -> Result<usize, ProviderError> {
        self.poll_cq(P::poll_send, Self::on_send_completion, POLL_AT_ONCE)
    }

    /// Polls the send completion queue for at most `max` completions (and at most
    /// `POLL_AT_ONCE`): the first poll of a blocking wait, which for one request usually
    /// needs just that request's completion, and so need not ask the device whether there
    /// is a second (a wait that needs more polls again, `POLL_AT_ONCE` at a time).
    #[inline]
    pub(super) fn poll_send_cq_max(&mut self, max: usize) -> Result<usize, ProviderError> {
        self.poll_cq(P::poll_send, Self::on_send_completion, max)
    }

    #[inline]
    fn poll_recv_cq(&mut self) -> Result<usize, ProviderError> {
        self.poll_cq(P::poll_recv, Self::on_recv_completion, POLL_AT_ONCE)
    }

    /// Polls one completion queue once with `poll` and hands the completions of this
    /// channel's queue pair to `on` (a shared queue may hold other queue pairs'); returns
    /// how many were this channel's.
    #[inline(always)]
    fn poll_cq(
        &mut self,
        poll: fn(&mut P, &mut [Completion]) -> Result<usize, ProviderError>,
        on: fn(&mut Self, &Completion),
        max: usize,
    ) -> Result<usize, ProviderError> {
        let max = max.min(POLL_AT_ONCE);
        let n = poll(&mut self.p, &mut self.wc[..max])?.min(max);
        let mut seen = 0;
        for i in 0..n {
            let c = self.wc[i];
            if c.qp_num == self.qp_num {
                on(self, &c);
                seen += 1;
            }
        }
        Ok(seen)
    }

    fn on_send_completion(&mut self, c: &Completion) {
        // wr_ids are ours; anything beyond what we posted is ignored rather than trusted.
        if c.wr_id >= self.next_seq {
            return;
        }
        self.note_failure(c);
        self.done_seq = self.done_seq.max(c.wr_id + 1);
    }

    /// Breaks the channel on `c` if it failed and nothing broke it before: the first
    /// failure is the one reported.
    fn note_failure(&mut self, c: &Completion) {
        if !c.status.is_success() && self.broken.is_none() {
            self.broken = Some(Broken::Wr(WrFailure {
                rank: self.rank,
                wr_id: c.wr_id,
                status: c.status,
                vendor_err: c.vendor_err,
            }));
        }
    }

    fn on_recv_completion(&mut self, c: &Completion) {
        let r = c.wr_id & !RECV_BIT;
        if c.wr_id & RECV_BIT == 0 || r >= self.recv_next || R == 0 {
            return;
        }
        self.slots[(r % R as u64) as usize] = RecvSlot {
            info: Done {
                byte_len: c.byte_len,
                imm: c.imm,
                written: c.kind == CompletionKind::RecvWriteImm,
            },
            status: c.status,
            vendor_err: c.vendor_err,
            taken: false,
        };
        self.note_failure(c);
        self.recv_done = self.recv_done.max(r + 1);
    }

    fn ticket(&self, work: Work) -> Ticket {
        Ticket {
            work,
            chan: self.id,
            rank: self.rank,
        }
    }

    /// Posts `wrs` (assigning ids and signal flags) with one doorbell; returns the ticket.
    /// `consumes` is how many of them consume a receive at the peer, counted by the caller
    /// as it made them (a batch, as each request is pushed, where the opcode is a constant).
    /// The common case (channel healthy, room in the send queue, post accepted) stays in
    /// this function; the rest lives in cold functions out of line.
    ///
    /// # Safety
    /// The posting contract for every buffer the requests name.
    #[inline]
    unsafe fn post_send_wrs(
        &mut self,
        wrs: &mut [WorkRequest<'_>],
        consumes: u64,
    ) -> Result<Ticket, ChannelError> {
        let n = wrs.len();
        debug_assert!(n > 0 && n <= self.max_post);
        // The caller's count must match the requests: the node's credits are built on it.
        debug_assert_eq!(
            consumes,
            wrs.iter()
                .filter(|w| w.opcode.consumes_remote_recv())
                .count() as u64
        );
        let need = n as u64;
        if self.broken.is_some() || !self.fits(need) {
            self.make_room(need)?;
        }
        let first = self.next_seq;
        let mut signaled_to = self.signaled_to;
        let mut since_signal = self.since_signal;
        let mut id = first;
        for w in wrs.iter_mut() {
            w.wr_id = id;
            id += 1;
            since_signal += 1;
            if w.flags.contains(SendFlags::SIGNALED) || since_signal >= self.signal_every {
                w.flags |= SendFlags::SIGNALED;
                since_signal = 0;
                signaled_to = id;
            }
        }
        // SAFETY: forwarded contract.
        match unsafe { self.p.post_send(wrs) } {
            Ok(()) => {
                // Counted only once posted: a refused request must not stand in for the
                // signaled one the next k requests need (or every later post could wait
                // for room no completion frees).
                self.since_signal = since_signal;
                self.remote_recvs_used += consumes;
                self.signaled_to = signaled_to;
                self.next_seq = id;
                Ok(self.ticket(Work::Sends {
                    first,
                    last: id - 1,
                }))
            }
            Err(f) => Err(self.post_refused(wrs, f)),
        }
    }

    /// Posts one request (assigning its id and signal flag) with one doorbell; returns its
    /// sequence number. [`Channel::post_send_wrs`] for a batch of one, inlined into each
    /// operation, so that its opcode and flags are constants there: the provider's post,
    /// inlined as well, then builds the device's request straight from the operation's
    /// arguments (on the extended path: `ibv_wr_start`, the one builder and data setter the
    /// opcode needs, `ibv_wr_complete`), with no loop and no `match` on the opcode left. The
    /// checks are the batch's: the channel's state and the room in the send queue (cold
    /// when they fail), the id and the signaling interval.
    ///
    /// # Safety
    /// The posting contract for every buffer the request names.
    ///
    /// `ROOM_SEEN`: the caller has just seen room for the request (`send_room(1)`, nothing
    /// in between changed the channel), so the room is not looked for again; a broken
    /// channel is still refused.
    #[inline(always)]
    unsafe fn post_send_one<const ROOM_SEEN: bool>(
        &mut self,
        mut wr: WorkRequest<'_>,
    ) -> Result<u64, ChannelError> {
        debug_assert!(!ROOM_SEEN || self.fits(1), "room seen by the caller");
        if self.broken.is_some() || (!ROOM_SEEN && !self.fits(1)) {
            self.make_room(1)?;
        }
        let id = self.next_seq;
        let since_signal = self.since_signal + 1;
        let signal = wr.flags.contains(SendFlags::SIGNALED) || since_signal >= self.signal_every;
        wr.wr_id = id;
        if signal {
            wr.flags |= SendFlags::SIGNALED;
        }
        // SAFETY: forwarded contract.
        match unsafe { self.p.post_send(core::slice::from_ref(&wr)) } {
            Ok(()) => {
                // Counted only once posted, as in `post_send_wrs`.
                self.since_signal = if signal { 0 } else { since_signal };
                if signal {
                    self.signaled_to = id + 1;
                }
                self.remote_recvs_used += u64::from(wr.opcode.consumes_remote_recv());
                self.next_seq = id + 1;
                Ok(id)
            }
            Err(f) => {
                let posted = f.posted.min(1);
                let consumed = if posted == 1 {
                    u64::from(wr.opcode.consumes_remote_recv())
                } else {
                    0
                };
                Err(self.post_refused_counted(posted, consumed, f.errno))
            }
        }
    }

    /// Before a post: the channel's failure if it is broken, else polls until `need`
    /// requests fit next to those not yet retired (bounded by the channel's timeout).
    #[cold]
    #[inline(never)]
    fn make_room(&mut self, need: u64) -> Result<(), ChannelError> {
        if let Some(e) = self.fault() {
            return Err(e);
        }
        if !self.fits(need) {
            self.poll_until_on(Queues::Sends, |c| c.fits(need), None)?;
            if let Some(e) = self.fault() {
                return Err(e);
            }
        }
        Ok(())
    }

    /// After the provider refused a post (of which it may have taken a prefix): counts what
    /// it took, and if it took any, breaks the channel and waits for the flush, so no buffer
    /// is handed back while the device may still read it.
    #[cold]
    #[inline(never)]
    fn post_refused(&mut self, wrs: &[WorkRequest<'_>], f: PostFailure) -> ChannelError {
        let posted = f.posted.min(wrs.len());
        let consumed = wrs[..posted]
            .iter()
            .filter(|w| w.opcode.consumes_remote_recv())
            .count() as u64;
        self.post_refused_counted(posted, consumed, f.errno)
    }

    /// [`Channel::post_refused`] once the requests the provider took (`posted`, of which
    /// `consumed` consume a receive at the peer) are counted: the single-request path's,
    /// which keeps no request in memory to count from.
    #[cold]
    #[inline(never)]
    fn post_refused_counted(&mut self, posted: usize, consumed: u64, errno: i32) -> ChannelError {
        let first = self.next_seq;
        self.remote_recvs_used += consumed;
        self.next_seq += posted as u64;
        if posted > 0 {
            // The posted prefix may end unsignaled: flush it so it completes, and do not
            // return (handing the buffers back) before it has.
            self.broken.get_or_insert(Broken::Wr(WrFailure {
                rank: self.rank,
                wr_id: first + posted as u64,
                status: WcStatus::General,
                vendor_err: 0,
            }));
            self.flush_and_drain();
        }
        ChannelError::Post { errno }
    }

    fn check_sges(&self, n: usize, max: u32) -> Result<(), ChannelError> {
        if n > max as usize {
            Err(ChannelError::TooManySges { max, got: n })
        } else {
            Ok(())
        }
    }

    /// Posts one receive. Returns its sequence number.
    ///
    /// # Safety
    /// The posting contract for the scatter buffers.
    unsafe fn post_recv_sges(&mut self, sges: &[Sge<'_>]) -> Result<u64, ChannelError> {
        if let Some(e) = self.fault() {
            return Err(e);
        }
        self.check_sges(sges.len(), self.caps.max_recv_sge)?;
        let r = self.recv_next;
        // A slot still holding a result nobody has taken must not be overwritten.
        if self.recv_next - self.recv_done >= self.recv_cap
            || !self.slots[(r % R as u64) as usize].taken
        {
            return Err(ChannelError::RecvQueueFull);
        }
        let wr = RecvRequest {
            wr_id: r | RECV_BIT,
            sges,
        };
        // SAFETY: forwarded contract.
        unsafe { self.p.post_recv(&[wr]) }.map_err(|f| ChannelError::Post { errno: f.errno })?;
        self.recv_next += 1;
        Ok(r)
    }

    /// Posts one receive into `sge` and returns its sequence number: [`Channel::post_recv`]
    /// for a caller that needs no ticket (a ring, which keeps its slots' sequence numbers),
    /// with one scatter entry, so the request the provider builds has a constant shape. The
    /// checks are `post_recv`'s (the channel's state, the receive queue's room, a result
    /// nobody took still in the slot the receive would use), cold when they fail.
    ///
    /// # Safety
    /// The posting contract for the scatter buffer.
    #[inline(always)]
    pub(super) unsafe fn post_recv_one(&mut self, sge: Sge<'_>) -> Result<u64, ChannelError> {
        if self.broken.is_some() || self.caps.max_recv_sge == 0 {
            return Err(self.recv_refused());
        }
        // SAFETY: forwarded contract; the state and the entry count were just checked.
        unsafe { self.post_recv_counted(sge) }
    }

    /// [`Channel::post_recv_one`] after its checks of the channel's state and entry count:
    /// checks what the receive accounting needs (room in the queue, a result nobody took
    /// still in the slot the receive would use), then posts.
    ///
    /// # Safety
    /// The posting contract for the scatter buffer.
    #[inline(always)]
    pub(super) unsafe fn post_recv_counted(&mut self, sge: Sge<'_>) -> Result<u64, ChannelError> {
        let r = self.recv_next;
        if r - self.recv_done >= self.recv_cap || !self.slots[(r % R as u64) as usize].taken {
            return Err(self.recv_refused());
        }
        let sges = [sge];
        let wr = RecvRequest {
            wr_id: r | RECV_BIT,
            sges: &sges,
        };
        // SAFETY: forwarded contract.
        match unsafe { self.p.post_recv(core::slice::from_ref(&wr)) } {
            Ok(()) => {
                self.recv_next = r + 1;
                Ok(r)
            }
            Err(f) => Err(ChannelError::Post { errno: f.errno }),
        }
    }

    /// Why [`Channel::post_recv_one`] refused a receive, out of line.
    #[cold]
    #[inline(never)]
    fn recv_refused(&self) -> ChannelError {
        if let Some(e) = self.fault() {
            return e;
        }
        if let Err(e) = self.check_sges(1, self.caps.max_recv_sge) {
            return e;
        }
        ChannelError::RecvQueueFull
    }

    fn inline_sge<'d>(&self, data: &'d [u8]) -> Result<Sge<'d>, ChannelError> {
        let max = self.caps.max_inline_data;
        if data.len() > max as usize {
            return Err(ChannelError::InlineTooLarge {
                max,
                got: data.len(),
            });
        }
        // SAFETY: inline data is copied into the work request during the post, so the
        // device never reads it through this entry later, and needs no lkey.
        Ok(unsafe { Sge::from_raw(data.as_ptr() as u64, data.len() as u32, 0) })
    }
}

/// Views scatter entries as the entry type work requests carry (same layout); the `&mut`
/// borrow the caller holds keeps the exclusivity the device needs.
#[inline]
fn as_gather<'s, 'a>(sges: &'s mut [SgeMut<'a>]) -> &'s [Sge<'a>] {
    // SAFETY: SgeMut and Sge are #[repr(C)] with identical fields; the slice stays mutably
    // borrowed for 's, so nobody else reads or writes the bytes meanwhile.
    unsafe { core::slice::from_raw_parts(sges.as_ptr().cast::<Sge<'a>>(), sges.len()) }
}
