//! [`Datagram`]: unreliable datagrams (UD) to any peer, and multicast to many, from one
//! endpoint polled by one thread.
//!
//! **UD is unreliable, and rverbs does not pretend otherwise.** A datagram is not
//! acknowledged and not retransmitted. It is lost, silently, when the receiver has no receive
//! posted at that instant, when its Q_Key differs, when a switch or the receiving host drops
//! it, or when the receiver left the group. A send completes when the datagram *left*. What
//! rverbs offers instead: a sequence header the sender stamps ([`Sequencer`],
//! [`crate::wire::sequence`]) and a [`SequenceTracker`] that counts, at every receiver, what
//! never arrived and what arrived out of order. Losses are counted, not hidden.
//!
//! What an endpoint does for you:
//! - **Sends** ([`Datagram::send`], [`Datagram::send_parts`]) to a [`Peer`]: a port's queue
//!   pair ([`Datagram::peer`], from its [`DatagramEndpoint`]), a multicast group
//!   ([`Datagram::group_peer`]), or the sender of a datagram ([`Datagram::reply_to`]). A
//!   payload up to the queue pair's inline limit is copied into the work request; a larger
//!   one into a send slot of the endpoint's memory. Either way the caller's bytes are free
//!   the moment the call returns, and no call needs `unsafe`. A payload above the path MTU
//!   is refused with [`DatagramError::TooLarge`] before anything is posted. One post per
//!   datagram, whatever the number of group members: fan-out is the fabric's job.
//! - **Receives** from a fixed pool of receive slots in memory the endpoint owns, all posted
//!   at construction and each re-posted automatically once the datagram it held was read.
//!   The device writes a 40-byte network header (GRH) in front of every datagram; the
//!   endpoint reads it and hands over only the payload, as a borrowed slice, with the
//!   sender's GID, queue pair number and LID ([`Received`], [`Source`]). The next call
//!   re-posts the slot, so the borrow ends first.
//! - **Multicast groups** by IPv4 address ([`Group::ipv4`], mapped to the GID RoCE v2
//!   uses): [`Datagram::join`], [`Datagram::leave`].
//! - **Bounded waits**: [`Datagram::recv`] waits at most [`DatagramConfig::timeout`] (or the
//!   deadline of [`Datagram::recv_until`]) and reports [`DatagramError::TimedOut`], leaving the
//!   endpoint intact; a send that finds the send queue full waits the same bound for
//!   completions and, if the device does not deliver them, flushes the queue pair.
//!
//! ```
//! #![forbid(unsafe_code)]
//! use rverbs_core::datagram::{memory_needed, Datagram, DatagramConfig, Group};
//! use rverbs_core::memory::AccessFlags;
//! use rverbs_core::params::{Mtu, QpCaps};
//! use rverbs_core::poll::StepClock;
//! use rverbs_core::model::{SoftNet, SoftNetConfig};
//!
//! static CLOCK: StepClock = StepClock::new(core::time::Duration::from_micros(1));
//! let caps = QpCaps { max_send_wr: 16, max_recv_wr: 8, max_send_sge: 2, max_recv_sge: 1,
//!                     max_inline_data: 64 };
//! let mut cfg = DatagramConfig::default();
//! (cfg.recv_slots, cfg.send_slots) = (8, 2);
//! // On a device: `VerbsDatagram::new(&ctx, &pd, &UdConfig::default())?` for the queue pair
//! // and `pd.register_shared(PageMemory::zeroed(need)?, AccessFlags::LOCAL_WRITE)?`.
//! let need = memory_needed(Mtu::B256.bytes(), &cfg);
//! let mut mem = vec![vec![0u8; need]; 3];
//! let net = SoftNet::new(SoftNetConfig::new(3, caps));
//! let mut ends = Vec::new();
//! for (node, m) in mem.iter_mut().enumerate() {
//!     let qp = net.create_datagram(node as u32, 0x0123_4567, Mtu::B256).unwrap();
//!     let region = net.register(node as u32, m, AccessFlags::LOCAL_WRITE).unwrap();
//!     ends.push(Datagram::new(qp, region, cfg, &CLOCK).unwrap());
//! }
//! let (publisher, subscribers) = ends.split_first_mut().unwrap();
//! let group = Group::ipv4([239, 1, 2, 3]).unwrap();
//! for s in subscribers.iter_mut() {
//!     s.join(group).unwrap();
//! }
//! let to_group = publisher.group_peer(group).unwrap();
//! publisher.send(&to_group, b"tick 1").unwrap(); // one post, two receivers
//! for s in subscribers.iter_mut() {
//!     let d = s.recv().unwrap();
//!     assert_eq!(d.payload, b"tick 1"); // the 40-byte header is gone
//!     assert_eq!(d.source.qpn, publisher.endpoint().qpn);
//!     assert_eq!(d.source.group, Some(group.gid()));
//! }
//! // Above the MTU: refused before posting.
//! assert!(publisher.send(&to_group, &[0u8; 257]).is_err());
//! ```
//!
//! A multicast feed on a device: the same program publishes (`feed pub`) or subscribes
//! (`feed`), every size taken from the queue pair and the configuration, no type spelled out:
//!
//! ```no_run
//! # #[cfg(feature = "verbs")] fn main() -> Result<(), Box<dyn core::error::Error>> {
//! # use rverbs_core::poll::{Clock, Instant};
//! # struct Monotonic;
//! # impl Clock for Monotonic { fn now(&self) -> Instant { Instant::from_nanos(0) } }
//! # static MONOTONIC: Monotonic = Monotonic; // `rverbs_std_shim::MONOTONIC` in a program
//! use rverbs_core::datagram::{memory_needed, Datagram, DatagramConfig, Group};
//! use rverbs_core::memory::{AccessFlags, PageMemory};
//! use rverbs_core::provider::{datagram::DatagramProvider, verbs_ud::VerbsDatagram};
//! use rverbs_core::verbs::{open_device, UdConfig};
//!
//! let (ctx, cfg) = (open_device("rxe0")?, DatagramConfig::default());
//! let pd = ctx.alloc_pd()?;
//! let qp = VerbsDatagram::new(&ctx, &pd, &UdConfig::default())?;
//! let mem = PageMemory::zeroed(memory_needed(qp.mtu(), &cfg)).ok_or("out of memory")?;
//! let mem = pd.register_shared(mem, AccessFlags::LOCAL_WRITE)?;
//! // MONOTONIC: rverbs_std_shim::MONOTONIC, or any 'static clock; every wait is bounded on it.
//! let mut feed = Datagram::new(qp, mem, cfg, &MONOTONIC)?;
//! let group = Group::ipv4([239, 1, 2, 3]).ok_or("not a multicast address")?;
//! if std::env::args().nth(1).as_deref() == Some("pub") {
//!     let to_group = feed.group_peer(group)?;
//!     for tick in 0u64.. {
//!         feed.send(&to_group, &tick.to_le_bytes())?; // one post, every subscriber
//!     }
//! } else {
//!     feed.join(group)?;
//!     loop {
//!         let d = feed.recv()?; // at most cfg.timeout; losses are counted, not hidden
//!         println!("{:?} from {:?}", d.payload, d.source.qpn);
//!     }
//! }
//! # Ok(()) }
//! # #[cfg(not(feature = "verbs"))] fn main() {}
//! ```
//!
//! # Memory and soundness
//! The endpoint owns its provider and its memory (a [`Region`]: memory that stays allocated
//! if leaked), receive slots first, then send slots ([`memory_needed`]); the memory
//! must have local write access and no remote write or atomic access (checked), so nothing
//! but the device's receives writes it. Dropping the endpoint moves the queue pair to the
//! error state, posts one empty request behind the sends, and polls until every request it
//! posted has completed (at most [`DatagramConfig::flush_timeout`], else the process aborts)
//! before the memory is freed: the same rule as [`Channel`](crate::channel::Channel)
//! (`docs/safety.md`). The provider is never handed out mutably, so it cannot be swapped
//! away from its memory; swapping or leaking a whole endpoint moves or leaks both together.
//!
//! Dropping flushes what the device has not sent yet: [`Datagram::wait_sent`] first when
//! the last datagrams matter.
//!
//! Nothing here allocates after [`Datagram::new`], except making an address
//! ([`Datagram::peer`], [`Datagram::group_peer`], [`Datagram::reply_to`]) and joining a
//! group, which are setup.

mod error;
mod group;
mod recv;
mod send;
mod sequence;

pub use error::DatagramError;
pub use group::Group;
pub use recv::{Received, Source};
pub use sequence::{SequenceTracker, Sequencer, StreamCounts, MAX_GAP, REORDER_WINDOW};

use core::fmt;
use core::mem::ManuallyDrop;
use core::time::Duration;

use crate::completion::WcStatus;
use crate::gid::Gid;
use crate::memory::{AccessFlags, Region};
use crate::params::{Mtu, QpCaps};
use crate::poll::{Backoff, Spin, StaticClock};
use crate::provider::datagram::{DatagramProvider, Destination};
use crate::wire::datagram::DatagramEndpoint;
use crate::wire::grh::GRH_LEN;

/// Where datagrams to a port go: its GID when `global` (routed), else its LID.
fn destination(global: bool, gid: Gid, lid: u16) -> Destination {
    if global {
        Destination::Gid(gid)
    } else {
        Destination::Lid(lid)
    }
}

/// The queue pair number of a datagram sent to a multicast group.
pub const MULTICAST_QPN: u32 = 0x00ff_ffff;
/// Most payload parts one send gathers.
pub const MAX_PARTS: usize = 4;
/// Most multicast groups one endpoint is a member of at a time.
pub const MAX_GROUPS: usize = 16;

/// Endpoint settings.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct DatagramConfig {
    /// Receive slots: receives kept posted (at most `N`, the endpoint's slot table, and the
    /// queue pair's receive queue). A burst of more datagrams than this between two calls
    /// loses the excess.
    pub recv_slots: u32,
    /// Send slots, for payloads too large to go inline (at most `N`). A send waits for the
    /// oldest slot's previous datagram to have left.
    pub send_slots: u32,
    /// Ask for a completion every k-th send (clamped to the send slots and half the send
    /// queue, so that a slot or a queue entry is always freed by a later completion).
    pub signal_every: u32,
    /// How long a receive waits for a datagram, and a send for room, by default.
    pub timeout: Duration,
    /// How long the device may take to flush the queue pair (on drop, or after a failure)
    /// before the process aborts rather than free memory the device may still write.
    pub flush_timeout: Duration,
}

impl Default for DatagramConfig {
    fn default() -> Self {
        Self {
            recv_slots: 64,
            send_slots: 16,
            signal_every: 16,
            timeout: Duration::from_secs(10),
            flush_timeout: Duration::from_secs(2),
        }
    }
}

/// Where a send goes: an address and the queue pair number and Q_Key behind it. Made by
/// [`Datagram::peer`], [`Datagram::group_peer`] or [`Datagram::reply_to`] (setup: making
/// the address may allocate); keep it and send with it many times.
#[derive(Clone, Debug)]
pub struct Peer<A> {
    address: A,
    qpn: u32,
    qkey: u32,
    /// The largest payload this destination takes.
    mtu: u32,
}

impl<A> Peer<A> {
    /// The destination queue pair number ([`MULTICAST_QPN`] for a group).
    pub fn qpn(&self) -> u32 {
        self.qpn
    }

    /// The Q_Key datagrams to it carry.
    pub fn qkey(&self) -> u32 {
        self.qkey
    }

    /// The largest payload a datagram to it may carry.
    pub fn mtu(&self) -> u32 {
        self.mtu
    }

    /// The provider's address (an address handle on a device).
    pub fn address(&self) -> &A {
        &self.address
    }
}

/// What an endpoint counted.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct DatagramStats {
    /// Datagrams posted.
    pub sent: u64,
    /// Of those, how many went inline.
    pub sent_inline: u64,
    /// Datagrams handed to the caller.
    pub received: u64,
    /// Receives that completed with an error other than a flush (a datagram longer than a
    /// slot): re-posted, the datagram lost.
    pub receive_errors: u64,
}

/// The state of one receive slot.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Slot {
    /// Never posted (beyond `recv_slots`), or its post failed.
    Idle,
    /// Posted: the device may write it.
    Posted,
    /// Completed; waiting to be read.
    Done(crate::completion::DatagramCompletion),
    /// Read by the caller (a [`Received`] may borrow it); re-posted by the next call.
    Lent,
}

/// Why the endpoint broke.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Broke {
    recv: bool,
    status: WcStatus,
}

/// A datagram endpoint. See the [module docs](self).
///
/// `P` is the provider (a [`VerbsDatagram`](crate::provider::verbs_ud::VerbsDatagram), or
/// a [`NetDatagram`](crate::model::NetDatagram) of the model), `M` the memory it
/// receives into and stages large sends in, `B` what waits do between empty polls, and `N`
/// the size of its slot tables (receive slots and send slots, each at most `N`).
pub struct Datagram<P: DatagramProvider, M: Region, B: Backoff = Spin, const N: usize = 64> {
    // Dropped by hand (see `Drop`): the queue pair is drained before the memory goes.
    p: ManuallyDrop<P>,
    mem: ManuallyDrop<M>,
    /// An address of this endpoint itself, for the drain request a flush posts.
    drain_to: ManuallyDrop<P::Address>,
    backoff: B,
    clock: StaticClock,
    timeout: Duration,
    flush_timeout: Duration,
    caps: QpCaps,
    qp_num: u32,
    qkey: u32,
    gid: Gid,
    lid: u16,
    global: bool,
    mtu: u32,
    slot_size: usize,
    recv_slots: usize,
    send_slots: usize,
    /// Where the send slots start in the memory.
    send_base: usize,
    slots: [Slot; N],
    /// The slot the next datagram lands in (a receive queue completes in posting order).
    head: usize,
    /// Posted receives not yet completed.
    recv_outstanding: usize,
    /// Send sequence: requests posted, and every request below `done_seq` has completed.
    next_seq: u64,
    done_seq: u64,
    since_signal: u32,
    signal_every: u32,
    sq_depth: u64,
    /// For each send slot, one past the sequence number of the send that last used it.
    staged: [u64; N],
    next_stage: usize,
    groups: [Option<Gid>; MAX_GROUPS],
    broken: Option<Broke>,
    stats: DatagramStats,
    /// The address of the newest run of sends (the last send posted named it), with the
    /// sequence number of that last send in `newest_last`: a device may look an address
    /// handle up when it executes the send, so a handle lives until then whatever the caller
    /// did with its [`Peer`]. A send to the same address only moves `newest_last` (one
    /// compare and one store); one to another address moves this run to `held`. Let go of
    /// when a completion shows its last send done; dropped after the queue pair is drained.
    newest: Option<P::Address>,
    newest_last: u64,
    /// The addresses of older runs not yet known to have completed, oldest first, each with
    /// the sequence number of the last send that named it (a run of sends to one address
    /// keeps one clone). Let go of in bulk when completions are polled; dropped after the
    /// queue pair is drained.
    held: heapless::Deque<(P::Address, u64), N>,
}

impl<P, M, B, const N: usize> fmt::Debug for Datagram<P, M, B, N>
where
    P: DatagramProvider + fmt::Debug,
    M: Region,
    B: Backoff,
{
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Datagram")
            .field("provider", &*self.p)
            .field("qp_num", &self.qp_num)
            .field("mtu", &self.mtu)
            .field("recv_slots", &self.recv_slots)
            .field("send_slots", &self.send_slots)
            .field("stats", &self.stats)
            .field("broken", &self.broken)
            .finish()
    }
}

/// Rounds a slot up to whole cache lines, so that slots never share one.
const fn slot_size(mtu: u32) -> usize {
    (GRH_LEN + mtu as usize).next_multiple_of(64)
}

impl<P: DatagramProvider, M: Region> Datagram<P, M> {
    /// An endpoint that spins while it waits: see [`Datagram::with_backoff`].
    pub fn new(
        p: P,
        mem: M,
        cfg: DatagramConfig,
        clock: StaticClock,
    ) -> Result<Self, DatagramError> {
        Datagram::with_backoff(p, mem, cfg, Spin, clock)
    }
}

/// Bytes of memory an endpoint with `cfg` needs on a path of `mtu` bytes (the provider's
/// MTU): the receive slots (40 bytes of network header and `mtu` of payload each, rounded up
/// to 64), then the send slots (`mtu` each).
pub const fn memory_needed(mtu: u32, cfg: &DatagramConfig) -> usize {
    cfg.recv_slots as usize * slot_size(mtu) + cfg.send_slots as usize * mtu as usize
}

impl<P: DatagramProvider, M: Region, B: Backoff, const N: usize> Datagram<P, M, B, N> {
    /// An endpoint over `p`, receiving into and staging sends in `mem`, calling `backoff`
    /// between empty polls and measuring its waits on `clock`. Posts every receive slot.
    /// Fails with [`DatagramError::InvalidSetup`] if the memory is too small
    /// ([`memory_needed`] with the provider's MTU), lacks local write access or
    /// grants remote write or atomic access, or if the slots do not fit `N` or the queue
    /// pair. On error nothing stays posted. Setup: makes one address (of itself, for
    /// flushing), which may allocate; nothing after it does.
    pub fn with_backoff(
        mut p: P,
        mem: M,
        cfg: DatagramConfig,
        backoff: B,
        clock: StaticClock,
    ) -> Result<Self, DatagramError> {
        let caps = p.caps();
        let mtu = p.mtu();
        let access = mem.access();
        let (recv_slots, send_slots) = (cfg.recv_slots as usize, cfg.send_slots as usize);
        let why = if mtu == 0 {
            Some("the provider reports an MTU of 0")
        } else if !access.contains(AccessFlags::LOCAL_WRITE) {
            Some("the memory needs local write access")
        } else if access.intersects(AccessFlags::REMOTE_WRITE | AccessFlags::REMOTE_ATOMIC) {
            Some("the memory must not be remotely writable")
        } else if recv_slots == 0
            || recv_slots > N
            || recv_slots as u64 > u64::from(caps.max_recv_wr)
        {
            Some("receive slots must be 1 ..= N and fit the receive queue")
        } else if send_slots == 0 || send_slots > N {
            Some("send slots must be 1 ..= N")
        } else if caps.max_send_wr < 2 || caps.max_send_sge == 0 || caps.max_recv_sge == 0 {
            Some("the queue pair needs 2 send entries and a scatter/gather entry each way")
        } else if mem.len() < memory_needed(mtu, &cfg) {
            Some("the memory is smaller than memory_needed(mtu, cfg)")
        } else {
            None
        };
        if let Some(what) = why {
            return Err(DatagramError::InvalidSetup { what });
        }
        let (gid, lid) = (p.gid(), p.lid());
        let global = !gid.is_zero();
        let drain_to = p.address(destination(global, gid, lid))?;
        // One send-queue entry stays free for the drain request of a flush.
        let depth = caps.max_send_wr - 1;
        let k = cfg
            .signal_every
            .clamp(1, (depth / 2).max(1))
            .min(cfg.send_slots.max(1));
        let mut d = Self {
            p: ManuallyDrop::new(p),
            mem: ManuallyDrop::new(mem),
            drain_to: ManuallyDrop::new(drain_to),
            backoff,
            clock,
            timeout: cfg.timeout,
            flush_timeout: cfg.flush_timeout,
            caps,
            qp_num: 0,
            qkey: 0,
            gid,
            lid,
            global,
            mtu,
            slot_size: slot_size(mtu),
            recv_slots,
            send_slots,
            send_base: recv_slots * slot_size(mtu),
            slots: [Slot::Idle; N],
            head: 0,
            recv_outstanding: 0,
            next_seq: 0,
            done_seq: 0,
            since_signal: 0,
            signal_every: k,
            sq_depth: u64::from(depth),
            staged: [0; N],
            next_stage: 0,
            groups: [None; MAX_GROUPS],
            broken: None,
            stats: DatagramStats::default(),
            newest: None,
            newest_last: 0,
            held: heapless::Deque::new(),
        };
        d.qp_num = d.p.qp_num();
        d.qkey = d.p.qkey();
        for i in 0..recv_slots {
            // On error, dropping `d` drains what was posted before freeing the memory.
            d.post_slot(i)?;
        }
        Ok(d)
    }

    /// What a peer needs to send to this endpoint (exchange it encoded:
    /// [`DatagramEndpoint::encode`]).
    pub fn endpoint(&self) -> DatagramEndpoint {
        DatagramEndpoint {
            gid: self.gid,
            global: self.global,
            lid: self.lid,
            qpn: self.qp_num,
            qkey: self.qkey,
            mtu: largest_mtu_within(self.mtu),
        }
    }

    /// The largest payload one datagram carries (the path MTU).
    #[inline]
    pub fn mtu(&self) -> u32 {
        self.mtu
    }

    /// Receive slots kept posted.
    #[inline]
    pub fn recv_slots(&self) -> usize {
        self.recv_slots
    }

    /// The effective "ask for a completion every k-th send".
    #[inline]
    pub fn signal_every(&self) -> u32 {
        self.signal_every
    }

    /// What the queue pair can hold.
    #[inline]
    pub fn caps(&self) -> QpCaps {
        self.caps
    }

    /// What the endpoint counted so far.
    #[inline]
    pub fn stats(&self) -> DatagramStats {
        self.stats
    }

    /// The provider, for inspection (never mutably: it stays with its memory, so it cannot
    /// be swapped away from the receives it has posted into that memory).
    ///
    /// ```compile_fail,E0308
    /// use rverbs_core::datagram::Datagram;
    /// use rverbs_core::model::{NetDatagram, NetRegion};
    /// type End<'n> = Datagram<NetDatagram<'n>, NetRegion<'n>>;
    /// fn separate<'n>(a: &mut End<'n>, b: &mut End<'n>) {
    ///     core::mem::swap(a.provider(), b.provider());
    /// }
    /// ```
    #[inline]
    pub fn provider(&self) -> &P {
        &self.p
    }

    /// The clock the endpoint's waits are measured on.
    #[inline]
    pub fn clock(&self) -> StaticClock {
        self.clock
    }

    /// How long a receive waits by default ([`DatagramConfig::timeout`]).
    #[inline]
    pub fn timeout(&self) -> Duration {
        self.timeout
    }

    /// The first failure, if the endpoint is broken.
    pub fn failure(&self) -> Option<DatagramError> {
        self.broken.map(|b| DatagramError::Broken {
            recv: b.recv,
            status: b.status,
        })
    }

    /// Sends posted and not yet known to have left.
    #[inline]
    pub fn outstanding_sends(&self) -> u64 {
        self.next_seq - self.done_seq
    }

    /// Makes an address for the endpoint `to` (setup: may allocate; keep the peer). Its
    /// payloads are limited to the smaller of both MTUs.
    pub fn peer(&mut self, to: &DatagramEndpoint) -> Result<Peer<P::Address>, DatagramError> {
        let mtu = self.mtu.min(to.mtu.bytes());
        self.peer_at(destination(to.global, to.gid, to.lid), to.qpn, to.qkey, mtu)
    }

    /// A peer at `dest` (setup: may allocate): queue pair `qpn` taking `qkey`, payloads of
    /// at most `mtu` bytes.
    fn peer_at(
        &mut self,
        dest: Destination,
        qpn: u32,
        qkey: u32,
        mtu: u32,
    ) -> Result<Peer<P::Address>, DatagramError> {
        Ok(Peer {
            address: self.p.address(dest)?,
            qpn,
            qkey,
            mtu,
        })
    }

    /// Moves the queue pair to the error state and polls until everything this endpoint
    /// posted has completed ([`crate::poll::drain`]); aborts the process if that cannot be
    /// done within the flush timeout. Returns only when the device can no longer touch the
    /// memory.
    fn flush_and_drain(&mut self) {
        let qp_num = self.qp_num;
        crate::poll::drain::flush_and_drain(self, &format_args!("datagram queue pair {qp_num}"));
    }

    fn all_done(&self) -> bool {
        self.done_seq >= self.next_seq && self.recv_outstanding == 0
    }

    /// Marks the endpoint broken (keeping the first cause).
    fn break_with(&mut self, recv: bool, status: WcStatus) {
        self.broken.get_or_insert(Broke { recv, status });
    }
}

impl<P: DatagramProvider, M: Region, B: Backoff, const N: usize> crate::poll::drain::Drain
    for Datagram<P, M, B, N>
{
    fn set_error(&mut self) -> Result<(), crate::verb::ProviderError> {
        self.p.set_error()
    }

    fn in_flight(&self) -> (u64, u64) {
        (
            self.next_seq.saturating_sub(self.done_seq),
            self.recv_outstanding as u64,
        )
    }

    fn post_drain_request(&mut self) {
        Datagram::post_drain_request(self);
    }

    fn poll_once(&mut self) -> Result<usize, crate::verb::ProviderError> {
        Datagram::poll_once(self)
    }

    fn snooze(&mut self) {
        self.backoff.snooze();
    }

    fn flush_limit(&self) -> (StaticClock, Duration) {
        (self.clock, self.flush_timeout)
    }
}

/// The largest MTU code whose size is at most `bytes` (256 if smaller).
fn largest_mtu_within(bytes: u32) -> Mtu {
    [Mtu::B4096, Mtu::B2048, Mtu::B1024, Mtu::B512]
        .into_iter()
        .find(|m| m.bytes() <= bytes)
        .unwrap_or(Mtu::B256)
}

impl<P: DatagramProvider, M: Region, B: Backoff, const N: usize> Drop for Datagram<P, M, B, N> {
    fn drop(&mut self) {
        if !self.all_done() {
            // Nothing may still write the memory once it is freed: flush and drain (or
            // abort), whatever dropping the provider would do.
            self.flush_and_drain();
        }
        // SAFETY: each field is dropped exactly once, here, and never used again; the queue
        // pair has nothing in flight (drained above), and goes before the memory.
        unsafe {
            ManuallyDrop::drop(&mut self.drain_to);
            ManuallyDrop::drop(&mut self.p);
            ManuallyDrop::drop(&mut self.mem);
        }
    }
}
