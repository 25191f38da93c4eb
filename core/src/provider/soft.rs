//! A deterministic in-memory model of one RC connection: two queue pairs, their completion
//! queues and their registered memory, inside one [`SoftFabric`].
//!
//! The model exists so that the engine ([`crate::channel`]) builds and is tested without a
//! device, under `no_std`, Miri and fuzzers. It follows what an RC queue pair guarantees and
//! what the engine relies on (in-order execution and completion, selective signaling, error
//! state with flushes, RNR and transport retries); it models no timing, congestion or MTU.
//!
//! ```
//! use rverbs_core::completion::{Completion, CompletionKind, WcStatus};
//! use rverbs_core::params::{QpCaps, RetryCount, RnrRetry};
//! use rverbs_core::provider::soft::{Side, SoftAccess, SoftFabric};
//! use rverbs_core::provider::Provider;
//! use rverbs_core::wr::{Opcode, SendFlags, WorkRequest};
//!
//! let caps = QpCaps { max_send_wr: 16, max_recv_wr: 16, max_send_sge: 2, max_recv_sge: 2,
//!                     max_inline_data: 64 };
//! // Buffers outlive the fabric: it may touch them for as long as it exists.
//! let (mut src, mut dst) = ([0u8; 16], [0u8; 16]);
//! let fabric = SoftFabric::new(caps, RnrRetry::default(), RetryCount::default());
//! let a_mem = fabric.register(Side::A, &mut src, SoftAccess::LOCAL_WRITE).unwrap();
//! let b_mem = fabric
//!     .register(Side::B, &mut dst, SoftAccess::LOCAL_WRITE | SoftAccess::REMOTE_WRITE)
//!     .unwrap();
//! a_mem.write_from(0, b"hello");
//! let (mut a, _b) = fabric.ends();
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
//! - every call ([`Provider::post_send`], [`Provider::post_recv`], the polls,
//!   [`Provider::set_error`]) runs both send queues (side A's, then side B's) from their
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
//!   [`SoftAccess::LOCAL_WRITE`]. A failure completes the request with
//!   [`WcStatus::LocalProtection`]. Zero-length entries are not checked.
//! - **Remote memory** is resolved by rkey on the peer: writes need
//!   [`SoftAccess::REMOTE_WRITE`], reads [`SoftAccess::REMOTE_READ`], and
//!   `remote.addr .. remote.addr + length` must lie inside the region, where the length is
//!   the total of the local entries (`RemoteMemory::len` is ignored, as the device ignores
//!   it). A failure completes the request with [`WcStatus::RemoteAccess`] and, as on rxe
//!   (class C responder error), moves the *peer* to the error state too. Zero-length RDMA
//!   is not checked.
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
//! - **Error state**: [`Provider::set_error`] flushes everything outstanding. Posting in the
//!   error state is allowed, and the requests complete flushed (as verbs does). A queue pair
//!   stays in the error state for the life of the fabric.
//! - [`SoftFabric::kill`] makes a side dead (its queues are flushed, as if its process
//!   died): the peer's requests then get no answer and fail with [`WcStatus::RetryExceeded`]
//!   after `retry_count` ticks; its receives never complete. A peer in the error state is
//!   treated the same way, as a real responder in the error state drops requests.
//!
//! # Capacities
//! Queues are fixed arrays of [`QUEUE_CAP`] entries; [`SoftEnd::caps`](Provider::caps)
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

use core::cell::RefCell;
use core::fmt;
use core::marker::PhantomData;
use core::ops::Range;

use bitflags::bitflags;

use crate::completion::{Completion, CompletionKind, WcStatus};
use crate::params::{QpCaps, RetryCount, RnrRetry};
use crate::provider::{Provider, ProviderError};
use crate::sge::{RemoteMemory, Sge, SgeMut};
use crate::wr::{Opcode, PostFailure, RecvRequest, SendFlags, WorkRequest, MAX_BATCH};

/// Entries of every queue (send, receive and both completion queues) of each side.
pub const QUEUE_CAP: usize = 256;
/// Most scatter/gather entries per request.
pub const MAX_SGE: usize = 8;
/// Largest inline payload in bytes.
pub const MAX_INLINE: usize = 64;
/// Memory regions per side.
pub const MAX_REGIONS: usize = 16;

const ENOMEM: i32 = 12;
const EINVAL: i32 = 22;
const EOVERFLOW: i32 = 75;
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

bitflags! {
    /// Access a [`SoftRegion`] grants (same bits as `ibv_access_flags`).
    #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
    pub struct SoftAccess: u32 {
        /// The local queue pair may write (receive buffers, read targets).
        const LOCAL_WRITE = 1;
        /// The peer may RDMA-write. Needs `LOCAL_WRITE` too, as in verbs.
        const REMOTE_WRITE = 2;
        /// The peer may RDMA-read.
        const REMOTE_READ = 4;
    }
}

/// Why a registration failed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum SoftError {
    /// The buffer is empty.
    EmptyBuffer,
    /// `REMOTE_WRITE` without `LOCAL_WRITE`.
    RemoteWriteNeedsLocalWrite,
    /// All [`MAX_REGIONS`] slots of the side are in use.
    TableFull,
}

impl fmt::Display for SoftError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::EmptyBuffer => "soft register: the buffer is empty",
            Self::RemoteWriteNeedsLocalWrite => {
                "soft register: remote write access needs local write access too"
            }
            Self::TableFull => "soft register: the region table of this side is full",
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
}

// ---------------------------------------------------------------------------------------
// Keys

const KEY_MIX: u32 = 0x9e37_79b9;
const KEY_UNMIX: u32 = inverse_odd(KEY_MIX);
const GEN_BITS: u32 = 22;
const GEN_MASK: u32 = (1 << GEN_BITS) - 1;

/// The multiplicative inverse of an odd number modulo 2^32 (Newton's iteration).
const fn inverse_odd(a: u32) -> u32 {
    let mut x = a; // correct to 3 bits for odd a
    let mut i = 0;
    while i < 5 {
        x = x.wrapping_mul(2u32.wrapping_sub(a.wrapping_mul(x)));
        i += 1;
    }
    x
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum KeyKind {
    Local,
    Remote,
}

/// Scrambles (gen, kind, side, slot) into a key. Generation 0 is never live, so key 0 (and
/// every key whose generation field decodes to 0) resolves to nothing.
const fn make_key(gen: u32, kind: KeyKind, side: usize, slot: usize) -> u32 {
    let kind = match kind {
        KeyKind::Local => 0,
        KeyKind::Remote => 1,
    };
    let raw = ((gen & GEN_MASK) << 10) | (kind << 9) | ((side as u32 & 1) << 8) | slot as u32;
    raw.wrapping_mul(KEY_MIX)
}

/// (gen, kind, side, slot) of a key.
const fn split_key(key: u32) -> (u32, KeyKind, usize, usize) {
    let raw = key.wrapping_mul(KEY_UNMIX);
    let kind = if raw & (1 << 9) == 0 {
        KeyKind::Local
    } else {
        KeyKind::Remote
    };
    (
        raw >> 10,
        kind,
        ((raw >> 8) & 1) as usize,
        (raw & 0xff) as usize,
    )
}

// ---------------------------------------------------------------------------------------
// Queues

/// A fixed-capacity FIFO. A full ring hands the rejected value back.
struct Ring<T: Copy> {
    buf: [T; QUEUE_CAP],
    head: usize,
    len: usize,
}

impl<T: Copy> Ring<T> {
    const fn new(fill: T) -> Self {
        Self {
            buf: [fill; QUEUE_CAP],
            head: 0,
            len: 0,
        }
    }

    fn push(&mut self, v: T) -> Result<(), T> {
        if self.len == QUEUE_CAP {
            return Err(v);
        }
        self.buf[(self.head + self.len) % QUEUE_CAP] = v;
        self.len += 1;
        Ok(())
    }

    fn front_mut(&mut self) -> Option<&mut T> {
        if self.len == 0 {
            None
        } else {
            Some(&mut self.buf[self.head])
        }
    }

    fn pop(&mut self) -> Option<T> {
        if self.len == 0 {
            return None;
        }
        let v = self.buf[self.head];
        self.head = (self.head + 1) % QUEUE_CAP;
        self.len -= 1;
        Some(v)
    }

    fn is_empty(&self) -> bool {
        self.len == 0
    }
}

#[derive(Clone, Copy)]
struct RawSge {
    addr: u64,
    len: u32,
    key: u32,
}

const NO_SGE: RawSge = RawSge {
    addr: 0,
    len: 0,
    key: 0,
};

#[derive(Clone, Copy)]
struct SendWqe {
    /// Position in this side's send queue (for occupancy accounting).
    seq: u64,
    wr_id: u64,
    opcode: Opcode,
    signaled: bool,
    inline: bool,
    nsge: usize,
    sges: [RawSge; MAX_SGE],
    inline_len: usize,
    inline_data: [u8; MAX_INLINE],
    remote: RemoteMemory,
    /// Whether the first attempt happened (later ones are retries).
    tried: bool,
    retries: u8,
}

const NO_SEND: SendWqe = SendWqe {
    seq: 0,
    wr_id: 0,
    opcode: Opcode::Send,
    signaled: false,
    inline: false,
    nsge: 0,
    sges: [NO_SGE; MAX_SGE],
    inline_len: 0,
    inline_data: [0; MAX_INLINE],
    remote: RemoteMemory {
        addr: 0,
        len: 0,
        rkey: 0,
    },
    tried: false,
    retries: 0,
};

#[derive(Clone, Copy)]
struct RecvWqe {
    wr_id: u64,
    nsge: usize,
    sges: [RawSge; MAX_SGE],
}

const NO_RECV: RecvWqe = RecvWqe {
    wr_id: 0,
    nsge: 0,
    sges: [NO_SGE; MAX_SGE],
};

/// A send completion and the send-queue position it retires up to.
#[derive(Clone, Copy)]
struct SendCqe {
    wc: Completion,
    seq: u64,
}

const NO_SEND_CQE: SendCqe = SendCqe {
    wc: Completion::EMPTY,
    seq: 0,
};

#[derive(Clone, Copy)]
struct RegionSlot {
    /// The registered buffer (with the provenance of the `&'m mut [u8]` it came from).
    ptr: *mut u8,
    len: usize,
    access: SoftAccess,
    /// Generation of the current (or last) registration; 0 = never used.
    gen: u32,
    live: bool,
}

const NO_REGION: RegionSlot = RegionSlot {
    ptr: core::ptr::null_mut(),
    len: 0,
    access: SoftAccess::empty(),
    gen: 0,
    live: false,
};

struct QpState {
    sq: Ring<SendWqe>,
    rq: Ring<RecvWqe>,
    scq: Ring<SendCqe>,
    rcq: Ring<Completion>,
    sq_posted: u64,
    sq_retired: u64,
    rq_posted: u64,
    rq_retired: u64,
    error: bool,
    dead: bool,
    cq_overflow: bool,
    regions: [RegionSlot; MAX_REGIONS],
    stats: SoftStats,
}

impl QpState {
    const fn new() -> Self {
        Self {
            sq: Ring::new(NO_SEND),
            rq: Ring::new(NO_RECV),
            scq: Ring::new(NO_SEND_CQE),
            rcq: Ring::new(Completion::EMPTY),
            sq_posted: 0,
            sq_retired: 0,
            rq_posted: 0,
            rq_retired: 0,
            error: false,
            dead: false,
            cq_overflow: false,
            regions: [NO_REGION; MAX_REGIONS],
            stats: SoftStats {
                sends_posted: 0,
                recvs_posted: 0,
                send_cqes: 0,
                recv_cqes: 0,
                rnr_retries: 0,
                transport_retries: 0,
            },
        }
    }

    fn push_send_cqe(&mut self, cqe: SendCqe) {
        self.stats.send_cqes += 1;
        if self.scq.push(cqe).is_err() {
            self.cq_overflow = true;
        }
    }

    fn push_recv_cqe(&mut self, wc: Completion) {
        self.stats.recv_cqes += 1;
        if self.rcq.push(wc).is_err() {
            self.cq_overflow = true;
        }
    }

    /// Resolves `addr..addr+len` against the region named by `key`, or `None`.
    fn resolve(
        &self,
        side: usize,
        kind: KeyKind,
        key: u32,
        addr: u64,
        len: u64,
        need: SoftAccess,
    ) -> Option<*mut u8> {
        let (gen, k, s, slot) = split_key(key);
        let r = self.regions.get(slot)?;
        if k != kind || s != side || gen == 0 || !r.live || r.gen != gen {
            return None;
        }
        if !r.access.contains(need) {
            return None;
        }
        let off = addr.checked_sub(r.ptr.addr() as u64)?;
        let end = off.checked_add(len)?;
        if end > r.len as u64 {
            return None;
        }
        // In bounds of the registered buffer, so this keeps its provenance and stays inside
        // the allocation (wrapping_add only because it needs no unsafe).
        Some(r.ptr.wrapping_add(off as usize))
    }
}

const fn completion(wr_id: u64, status: WcStatus, kind: CompletionKind, qp: usize) -> Completion {
    Completion {
        wr_id,
        status,
        vendor_err: 0,
        kind,
        byte_len: 0,
        imm: None,
        qp_num: QP_NUMS[qp],
    }
}

// ---------------------------------------------------------------------------------------
// Spans: resolved memory, ready to copy

#[derive(Clone, Copy)]
struct Span {
    ptr: *mut u8,
    len: usize,
}

const NO_SPAN: Span = Span {
    ptr: core::ptr::null_mut(),
    len: 0,
};

#[derive(Clone, Copy)]
struct Spans {
    list: [Span; MAX_SGE],
    n: usize,
    total: u64,
}

impl Spans {
    const EMPTY: Spans = Spans {
        list: [NO_SPAN; MAX_SGE],
        n: 0,
        total: 0,
    };

    fn one(ptr: *mut u8, len: usize) -> Spans {
        let mut s = Spans::EMPTY;
        s.list[0] = Span { ptr, len };
        s.n = 1;
        s.total = len as u64;
        s
    }

    fn as_slice(&self) -> &[Span] {
        &self.list[..self.n.min(MAX_SGE)]
    }
}

/// Resolves a list of local entries of `side` (lkeys), each needing `need`.
fn resolve_local(qp: &QpState, side: usize, sges: &[RawSge], need: SoftAccess) -> Option<Spans> {
    let mut out = Spans::EMPTY;
    for s in sges {
        if s.len == 0 {
            continue;
        }
        let ptr = qp.resolve(side, KeyKind::Local, s.key, s.addr, u64::from(s.len), need)?;
        *out.list.get_mut(out.n)? = Span {
            ptr,
            len: s.len as usize,
        };
        out.n += 1;
        out.total += u64::from(s.len);
    }
    Some(out)
}

/// Copies from `src` into `dst`, in order, until either runs out.
///
/// # Safety
/// Every span of `src` must be valid for reads and every span of `dst` for writes of its
/// length, and nothing may hold a Rust reference to the bytes of `dst`.
unsafe fn copy_spans(src: &[Span], dst: &[Span]) {
    let (mut si, mut so, mut di, mut doff) = (0, 0, 0, 0);
    while let (Some(s), Some(d)) = (src.get(si), dst.get(di)) {
        let n = (s.len - so).min(d.len - doff);
        if n > 0 {
            // SAFETY: so + n <= s.len and doff + n <= d.len, so both ranges lie inside spans
            // the caller vouches for; `copy` allows them to overlap.
            unsafe { core::ptr::copy(s.ptr.add(so), d.ptr.add(doff), n) };
        }
        so += n;
        doff += n;
        if so == s.len {
            si += 1;
            so = 0;
        }
        if doff == d.len {
            di += 1;
            doff = 0;
        }
    }
}

// ---------------------------------------------------------------------------------------
// The fabric

/// What a send-queue head attempt came to.
enum Outcome {
    Done {
        status: WcStatus,
        byte_len: u32,
    },
    /// The peer posted no receive.
    Rnr,
    /// The peer does not answer (dead or in the error state).
    NoAck,
}

const fn done(status: WcStatus) -> Outcome {
    Outcome::Done {
        status,
        byte_len: 0,
    }
}

/// The state both ends share (no lifetime: the region table holds raw pointers whose
/// validity [`SoftFabric`]'s `'m` vouches for).
struct Shared {
    caps: QpCaps,
    /// `None`: retry forever.
    rnr_limit: Option<u8>,
    retry_limit: u8,
    state: RefCell<[QpState; 2]>,
}

/// A marker invariant in `'m` that also says "holds `&'m mut [u8]`".
type Invariant<'m> = PhantomData<fn(&'m mut [u8]) -> &'m mut [u8]>;

/// Shared state of two connected in-memory RC queue pairs. See the [module docs](self).
///
/// `'m` is the lifetime of the memory registered with it: every registered buffer stays
/// borrowed for as long as the fabric is in use.
pub struct SoftFabric<'m> {
    shared: Shared,
    /// Invariant in `'m`: shortening it would let a shorter-lived buffer be registered.
    _mem: Invariant<'m>,
}

impl fmt::Debug for SoftFabric<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let st = self.shared.state.borrow();
        f.debug_struct("SoftFabric")
            .field("caps", &self.shared.caps)
            .field("rnr_limit", &self.shared.rnr_limit)
            .field("retry_limit", &self.shared.retry_limit)
            .field("a", &QpDebug(&st[0]))
            .field("b", &QpDebug(&st[1]))
            .finish()
    }
}

struct QpDebug<'a>(&'a QpState);

impl fmt::Debug for QpDebug<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let q = self.0;
        f.debug_struct("Qp")
            .field("send_used", &(q.sq_posted - q.sq_retired))
            .field("recv_used", &(q.rq_posted - q.rq_retired))
            .field("unexecuted_sends", &q.sq.len)
            .field("posted_recvs", &q.rq.len)
            .field("error", &q.error)
            .field("dead", &q.dead)
            .field("stats", &q.stats)
            .finish()
    }
}

const fn min_u32(a: u32, b: u32) -> u32 {
    if a < b {
        a
    } else {
        b
    }
}

impl<'m> SoftFabric<'m> {
    /// Two connected queue pairs with `caps` (clamped to the model's capacities), giving up
    /// on a missing receive after `rnr_retry` retries and on a dead peer after `retry_count`.
    pub const fn new(caps: QpCaps, rnr_retry: RnrRetry, retry_count: RetryCount) -> Self {
        let caps = QpCaps {
            max_send_wr: min_u32(caps.max_send_wr, QUEUE_CAP as u32),
            max_recv_wr: min_u32(caps.max_recv_wr, QUEUE_CAP as u32),
            max_send_sge: min_u32(caps.max_send_sge, MAX_SGE as u32),
            max_recv_sge: min_u32(caps.max_recv_sge, MAX_SGE as u32),
            max_inline_data: min_u32(caps.max_inline_data, MAX_INLINE as u32),
        };
        let rnr_limit = match rnr_retry {
            RnrRetry::Infinite => None,
            r => Some(r.code()),
        };
        Self {
            shared: Shared {
                caps,
                rnr_limit,
                retry_limit: retry_count.get(),
                state: RefCell::new([QpState::new(), QpState::new()]),
            },
            _mem: PhantomData,
        }
    }

    /// The two ends. Calling it again gives more handles to the same two queue pairs.
    pub fn ends(&self) -> (SoftEnd<'_>, SoftEnd<'_>) {
        (
            SoftEnd {
                shared: &self.shared,
                side: Side::A,
            },
            SoftEnd {
                shared: &self.shared,
                side: Side::B,
            },
        )
    }

    /// The caps both queue pairs have (after clamping).
    pub fn caps(&self) -> QpCaps {
        self.shared.caps
    }

    /// Registers `buf` with `side`'s queue pair. The region is deregistered when dropped; the
    /// buffer stays borrowed for the fabric's `'m` regardless (see the
    /// [module docs](self#memory)).
    pub fn register(
        &self,
        side: Side,
        buf: &'m mut [u8],
        access: SoftAccess,
    ) -> Result<SoftRegion<'_>, SoftError> {
        if buf.is_empty() {
            return Err(SoftError::EmptyBuffer);
        }
        if access.contains(SoftAccess::REMOTE_WRITE) && !access.contains(SoftAccess::LOCAL_WRITE) {
            return Err(SoftError::RemoteWriteNeedsLocalWrite);
        }
        let len = buf.len();
        let ptr = buf.as_mut_ptr();
        let s = side.index();
        let mut st = self.shared.state.borrow_mut();
        let qp = &mut st[s];
        let (slot, r) = qp
            .regions
            .iter_mut()
            .enumerate()
            .find(|(_, r)| !r.live)
            .ok_or(SoftError::TableFull)?;
        let gen = match (r.gen + 1) & GEN_MASK {
            0 => 1,
            g => g,
        };
        *r = RegionSlot {
            ptr,
            len,
            access,
            gen,
            live: true,
        };
        Ok(SoftRegion {
            shared: &self.shared,
            side,
            slot,
            ptr,
            len,
            lkey: make_key(gen, KeyKind::Local, s, slot),
            rkey: make_key(gen, KeyKind::Remote, s, slot),
            access,
        })
    }

    /// Simulates the death of `side`'s process: its queues are flushed, and the peer's
    /// requests fail with [`WcStatus::RetryExceeded`] from now on.
    pub fn kill(&self, side: Side) {
        let mut st = self.shared.state.borrow_mut();
        st[side.index()].dead = true;
        enter_error(&mut st, side.index());
    }

    /// Whether `side`'s queue pair is in the error state.
    pub fn in_error(&self, side: Side) -> bool {
        self.shared.state.borrow()[side.index()].error
    }

    /// Send-queue slots of `side` in use (posted, not yet retired by a polled completion).
    pub fn send_queue_used(&self, side: Side) -> u64 {
        let st = self.shared.state.borrow();
        st[side.index()].sq_posted - st[side.index()].sq_retired
    }

    /// Receive-queue slots of `side` in use (posted, completion not yet polled).
    pub fn recv_queue_used(&self, side: Side) -> u64 {
        let st = self.shared.state.borrow();
        st[side.index()].rq_posted - st[side.index()].rq_retired
    }

    /// Counters of `side`.
    pub fn stats(&self, side: Side) -> SoftStats {
        self.shared.state.borrow()[side.index()].stats
    }
}

/// Moves `s` to the error state and flushes everything outstanding on it.
fn enter_error(st: &mut [QpState; 2], s: usize) {
    let qp = &mut st[s];
    qp.error = true;
    while let Some(w) = qp.sq.pop() {
        qp.push_send_cqe(SendCqe {
            wc: completion(w.wr_id, WcStatus::Flushed, CompletionKind::Other, s),
            seq: w.seq,
        });
    }
    while let Some(r) = qp.rq.pop() {
        qp.push_recv_cqe(completion(
            r.wr_id,
            WcStatus::Flushed,
            CompletionKind::Other,
            s,
        ));
    }
}

/// Fails the receive at the head of `p`'s queue with `status` and moves `p` to the error
/// state (a responder-side error that consumed a receive).
fn fail_recv(st: &mut [QpState; 2], p: usize, status: WcStatus) {
    if let Some(r) = st[p].rq.pop() {
        st[p].push_recv_cqe(completion(r.wr_id, status, CompletionKind::Other, p));
    }
    enter_error(st, p);
}

impl Shared {
    /// Builds the queue entry for `wr`, or the errno that rejects it.
    ///
    /// # Safety
    /// The posting contract: inline entries must name readable memory.
    unsafe fn build_send(&self, wr: &WorkRequest<'_>) -> Result<SendWqe, i32> {
        if wr.sges.len() > self.caps.max_send_sge as usize {
            return Err(EINVAL);
        }
        let mut w = NO_SEND;
        w.wr_id = wr.wr_id;
        w.opcode = wr.opcode;
        w.signaled = wr.flags.contains(SendFlags::SIGNALED);
        w.remote = wr.remote;
        if wr.flags.contains(SendFlags::INLINE) {
            if wr.opcode == Opcode::Read {
                return Err(EINVAL);
            }
            let total: u64 = wr.sges.iter().map(|s| u64::from(s.len())).sum();
            if total > u64::from(self.caps.max_inline_data) {
                return Err(EINVAL);
            }
            w.inline = true;
            for s in wr.sges {
                let len = s.len() as usize;
                if len == 0 {
                    continue;
                }
                let addr = usize::try_from(s.addr()).map_err(|_| EINVAL)?;
                let dst = w
                    .inline_data
                    .get_mut(w.inline_len..w.inline_len + len)
                    .ok_or(EINVAL)?;
                let src = core::ptr::with_exposed_provenance::<u8>(addr);
                // SAFETY: the posting contract makes `addr..addr+len` of an inline entry
                // readable memory for the duration of the post; the engine makes inline
                // entries from a live slice with `as_ptr() as u64`, which exposes its
                // provenance for `with_exposed_provenance` to pick up. `dst` is our own array,
                // so the ranges do not overlap.
                unsafe { core::ptr::copy_nonoverlapping(src, dst.as_mut_ptr(), len) };
                w.inline_len += len;
            }
        } else {
            for (d, s) in w.sges.iter_mut().zip(wr.sges) {
                *d = RawSge {
                    addr: s.addr(),
                    len: s.len(),
                    key: s.lkey(),
                };
            }
            w.nsge = wr.sges.len();
        }
        Ok(w)
    }

    /// # Safety
    /// The posting contract.
    unsafe fn post_send(&self, side: usize, wrs: &[WorkRequest<'_>]) -> Result<(), PostFailure> {
        if wrs.len() > MAX_BATCH {
            return Err(PostFailure {
                posted: 0,
                errno: EINVAL,
            });
        }
        let mut st = self.state.borrow_mut();
        let mut result = Ok(());
        for (i, wr) in wrs.iter().enumerate() {
            let fail = |errno| PostFailure { posted: i, errno };
            // SAFETY: forwarded posting contract.
            let mut w = match unsafe { self.build_send(wr) } {
                Ok(w) => w,
                Err(errno) => {
                    result = Err(fail(errno));
                    break;
                }
            };
            let qp = &mut st[side];
            if qp.sq_posted - qp.sq_retired >= u64::from(self.caps.max_send_wr) {
                result = Err(fail(ENOMEM));
                break;
            }
            w.seq = qp.sq_posted;
            if qp.sq.push(w).is_err() {
                result = Err(fail(ENOMEM));
                break;
            }
            qp.sq_posted += 1;
            qp.stats.sends_posted += 1;
        }
        self.progress(&mut st, None);
        result
    }

    fn post_recv(&self, side: usize, wrs: &[RecvRequest<'_>]) -> Result<(), PostFailure> {
        if wrs.len() > MAX_BATCH {
            return Err(PostFailure {
                posted: 0,
                errno: EINVAL,
            });
        }
        let mut st = self.state.borrow_mut();
        let mut result = Ok(());
        for (i, wr) in wrs.iter().enumerate() {
            let qp = &mut st[side];
            let errno = if wr.sges.len() > self.caps.max_recv_sge as usize {
                EINVAL
            } else if qp.rq_posted - qp.rq_retired >= u64::from(self.caps.max_recv_wr) {
                ENOMEM
            } else {
                let mut r = NO_RECV;
                r.wr_id = wr.wr_id;
                for (d, s) in r.sges.iter_mut().zip(wr.sges) {
                    *d = RawSge {
                        addr: s.addr(),
                        len: s.len(),
                        key: s.lkey(),
                    };
                }
                r.nsge = wr.sges.len();
                match qp.rq.push(r) {
                    Ok(()) => {
                        qp.rq_posted += 1;
                        qp.stats.recvs_posted += 1;
                        continue;
                    }
                    Err(_) => ENOMEM,
                }
            };
            result = Err(PostFailure { posted: i, errno });
            break;
        }
        self.progress(&mut st, None);
        result
    }

    fn poll_send(&self, side: usize, out: &mut [Completion]) -> Result<usize, ProviderError> {
        let mut st = self.state.borrow_mut();
        self.progress(&mut st, Some(side));
        let qp = &mut st[side];
        if qp.cq_overflow {
            return Err(ProviderError {
                op: "soft poll_send",
                errno: EOVERFLOW,
            });
        }
        let mut n = 0;
        for slot in out.iter_mut() {
            let Some(c) = qp.scq.pop() else { break };
            *slot = c.wc;
            qp.sq_retired = qp.sq_retired.max(c.seq + 1);
            n += 1;
        }
        Ok(n)
    }

    fn poll_recv(&self, side: usize, out: &mut [Completion]) -> Result<usize, ProviderError> {
        let mut st = self.state.borrow_mut();
        self.progress(&mut st, None);
        let qp = &mut st[side];
        if qp.cq_overflow {
            return Err(ProviderError {
                op: "soft poll_recv",
                errno: EOVERFLOW,
            });
        }
        let mut n = 0;
        for slot in out.iter_mut() {
            let Some(c) = qp.rcq.pop() else { break };
            *slot = c;
            qp.rq_retired += 1;
            n += 1;
        }
        Ok(n)
    }

    fn set_error(&self, side: usize) {
        let mut st = self.state.borrow_mut();
        enter_error(&mut st, side);
        self.progress(&mut st, None);
    }

    /// Runs both send queues as far as they go; `tick` names the side whose retry timer
    /// fires in this call.
    fn progress(&self, st: &mut [QpState; 2], tick: Option<usize>) {
        for s in 0..2 {
            self.run_send_queue(st, s, tick == Some(s));
        }
    }

    fn run_send_queue(&self, st: &mut [QpState; 2], s: usize, mut tick: bool) {
        loop {
            if st[s].error {
                // Requests posted in the error state, or left over by an error elsewhere.
                enter_error(st, s);
                return;
            }
            let Some(head) = st[s].sq.front_mut() else {
                return;
            };
            // A copy: execution reads the inline bytes while it changes the queues.
            let w = *head;
            let (status, byte_len) = match self.execute(st, s, &w) {
                Outcome::Done { status, byte_len } => (status, byte_len),
                blocked => {
                    let (limit, fail) = match blocked {
                        Outcome::Rnr => (self.rnr_limit, WcStatus::RnrRetryExceeded),
                        _ => (Some(self.retry_limit), WcStatus::RetryExceeded),
                    };
                    let qp = &mut st[s];
                    let Some(head) = qp.sq.front_mut() else {
                        return;
                    };
                    if !head.tried {
                        head.tried = true;
                    } else if tick {
                        tick = false;
                        head.retries = head.retries.saturating_add(1);
                        if fail == WcStatus::RnrRetryExceeded {
                            qp.stats.rnr_retries += 1;
                        } else {
                            qp.stats.transport_retries += 1;
                        }
                    } else {
                        return;
                    }
                    match limit {
                        Some(l) if head.retries >= l => (fail, 0),
                        _ => return,
                    }
                }
            };
            let qp = &mut st[s];
            let _ = qp.sq.pop();
            let kind = match w.opcode {
                Opcode::Send | Opcode::SendImm(_) => CompletionKind::Send,
                Opcode::Write | Opcode::WriteImm(_) => CompletionKind::Write,
                Opcode::Read => CompletionKind::Read,
            };
            if status.is_success() {
                if w.signaled {
                    let mut wc = completion(w.wr_id, status, kind, s);
                    wc.byte_len = byte_len;
                    qp.push_send_cqe(SendCqe { wc, seq: w.seq });
                }
            } else {
                let wc = completion(w.wr_id, status, CompletionKind::Other, s);
                qp.push_send_cqe(SendCqe { wc, seq: w.seq });
                enter_error(st, s);
            }
        }
    }

    /// One attempt at the request `w` at the head of `s`'s send queue.
    fn execute(&self, st: &mut [QpState; 2], s: usize, w: &SendWqe) -> Outcome {
        let p = 1 - s;
        let sges = &w.sges[..w.nsge.min(MAX_SGE)];
        // The local side of the transfer: gathered (sends, writes) or scattered (reads).
        let local = if w.inline {
            Spans::one(w.inline_data.as_ptr().cast_mut(), w.inline_len)
        } else {
            let need = if w.opcode == Opcode::Read {
                SoftAccess::LOCAL_WRITE
            } else {
                SoftAccess::empty()
            };
            match resolve_local(&st[s], s, sges, need) {
                Some(l) => l,
                None => return done(WcStatus::LocalProtection),
            }
        };
        let Ok(total) = u32::try_from(local.total) else {
            return done(WcStatus::LocalLength);
        };
        if st[p].error || st[p].dead {
            return Outcome::NoAck;
        }
        if w.opcode.consumes_remote_recv() && st[p].rq.is_empty() {
            return Outcome::Rnr;
        }
        let remote = if w.opcode.is_rdma() && total > 0 {
            let need = if w.opcode == Opcode::Read {
                SoftAccess::REMOTE_READ
            } else {
                SoftAccess::REMOTE_WRITE
            };
            let r = &w.remote;
            match st[p].resolve(p, KeyKind::Remote, r.rkey, r.addr, u64::from(total), need) {
                Some(ptr) => Spans::one(ptr, total as usize),
                None => {
                    // Class C responder error: NAK to the requester, responder to error.
                    enter_error(st, p);
                    return done(WcStatus::RemoteAccess);
                }
            }
        } else {
            Spans::EMPTY
        };
        let imm = match w.opcode {
            Opcode::SendImm(i) | Opcode::WriteImm(i) => Some(i),
            _ => None,
        };
        match w.opcode {
            Opcode::Send | Opcode::SendImm(_) => {
                let Some(r) = st[p].rq.front_mut().map(|r| *r) else {
                    return Outcome::Rnr;
                };
                let rsges = &r.sges[..r.nsge.min(MAX_SGE)];
                let Some(dst) = resolve_local(&st[p], p, rsges, SoftAccess::LOCAL_WRITE) else {
                    fail_recv(st, p, WcStatus::LocalProtection);
                    return done(WcStatus::RemoteOperation);
                };
                if dst.total < local.total {
                    fail_recv(st, p, WcStatus::LocalLength);
                    return done(WcStatus::RemoteInvalidRequest);
                }
                // SAFETY: `local` spans are resolved, live registered ranges of `s` (or our
                // copy of the inline bytes), `dst` live ranges of `p` with local write
                // access; the posting contract keeps the buffers valid and unreferenced
                // while the requests are outstanding.
                unsafe { copy_spans(local.as_slice(), dst.as_slice()) };
                self.complete_recv(st, p, CompletionKind::Recv, total, imm);
            }
            Opcode::Write | Opcode::WriteImm(_) => {
                // SAFETY: as above; `remote` is a live range of `p` granting remote write.
                unsafe { copy_spans(local.as_slice(), remote.as_slice()) };
                if imm.is_some() {
                    self.complete_recv(st, p, CompletionKind::RecvWriteImm, total, imm);
                }
            }
            Opcode::Read => {
                // SAFETY: as above; `remote` grants remote read, `local` local write.
                unsafe { copy_spans(remote.as_slice(), local.as_slice()) };
            }
        }
        Outcome::Done {
            status: WcStatus::Success,
            byte_len: total,
        }
    }

    fn complete_recv(
        &self,
        st: &mut [QpState; 2],
        p: usize,
        kind: CompletionKind,
        byte_len: u32,
        imm: Option<u32>,
    ) {
        if let Some(r) = st[p].rq.pop() {
            let mut wc = completion(r.wr_id, WcStatus::Success, kind, p);
            wc.byte_len = byte_len;
            wc.imm = imm;
            st[p].push_recv_cqe(wc);
        }
    }
}

/// One end of a [`SoftFabric`]: a [`Provider`].
pub struct SoftEnd<'f> {
    shared: &'f Shared,
    side: Side,
}

impl fmt::Debug for SoftEnd<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SoftEnd")
            .field("side", &self.side)
            .field("qp_num", &self.side.qp_num())
            .finish()
    }
}

impl SoftEnd<'_> {
    /// Which side this end is.
    #[inline]
    pub fn side(&self) -> Side {
        self.side
    }

    /// The queue pair number its completions carry.
    #[inline]
    pub fn qp_num(&self) -> u32 {
        self.side.qp_num()
    }
}

impl Provider for SoftEnd<'_> {
    fn caps(&self) -> QpCaps {
        self.shared.caps
    }

    /// Posts and runs what can run (see [When work executes](self#when-work-executes)).
    /// Does not allocate.
    unsafe fn post_send(&mut self, wrs: &[WorkRequest<'_>]) -> Result<(), PostFailure> {
        // SAFETY: forwarded posting contract.
        unsafe { self.shared.post_send(self.side.index(), wrs) }
    }

    /// Does not allocate.
    unsafe fn post_recv(&mut self, wrs: &[RecvRequest<'_>]) -> Result<(), PostFailure> {
        self.shared.post_recv(self.side.index(), wrs)
    }

    /// One retry tick for a blocked request of this side, then the polling. Does not
    /// allocate.
    fn poll_send(&mut self, out: &mut [Completion]) -> Result<usize, ProviderError> {
        self.shared.poll_send(self.side.index(), out)
    }

    /// Does not allocate.
    fn poll_recv(&mut self, out: &mut [Completion]) -> Result<usize, ProviderError> {
        self.shared.poll_recv(self.side.index(), out)
    }

    fn set_error(&mut self) -> Result<(), ProviderError> {
        self.shared.set_error(self.side.index());
        Ok(())
    }
}

/// Memory registered with one side of a [`SoftFabric`]; deregistered on drop.
///
/// Peers may write it (with [`SoftAccess::REMOTE_WRITE`]) whenever the model runs, so the CPU
/// reaches its bytes only through volatile copies, never through a slice.
pub struct SoftRegion<'f> {
    shared: &'f Shared,
    side: Side,
    slot: usize,
    ptr: *mut u8,
    len: usize,
    lkey: u32,
    rkey: u32,
    access: SoftAccess,
}

impl fmt::Debug for SoftRegion<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SoftRegion")
            .field("side", &self.side)
            .field("len", &self.len)
            .field("lkey", &self.lkey)
            .field("rkey", &self.rkey)
            .field("access", &self.access)
            .finish()
    }
}

impl Drop for SoftRegion<'_> {
    fn drop(&mut self) {
        let mut st = self.shared.state.borrow_mut();
        if let Some(r) = st[self.side.index()].regions.get_mut(self.slot) {
            r.live = false;
            r.ptr = core::ptr::null_mut();
        }
    }
}

/// `offset..offset+len` if it lies inside `0..bound`.
fn in_bounds(offset: usize, len: usize, bound: usize) -> bool {
    offset.checked_add(len).is_some_and(|end| end <= bound)
}

impl SoftRegion<'_> {
    /// Length in bytes.
    #[inline]
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the region is empty (never: registration rejects empty buffers).
    #[inline]
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The side it is registered with.
    #[inline]
    pub fn side(&self) -> Side {
        self.side
    }

    /// Local key.
    #[inline]
    pub fn lkey(&self) -> u32 {
        self.lkey
    }

    /// Remote key.
    #[inline]
    pub fn rkey(&self) -> u32 {
        self.rkey
    }

    /// Access the region was registered with.
    #[inline]
    pub fn access(&self) -> SoftAccess {
        self.access
    }

    /// The descriptor the peer needs to RDMA the region (which succeeds only with the
    /// matching remote access).
    pub fn remote(&self) -> RemoteMemory {
        RemoteMemory {
            addr: self.ptr.addr() as u64,
            len: self.len as u64,
            rkey: self.rkey,
        }
    }

    fn range(&self, range: &Range<usize>) -> Option<(u64, u32)> {
        if range.start > range.end || range.end > self.len {
            return None;
        }
        let len = u32::try_from(range.end - range.start).ok()?;
        Some((self.ptr.addr() as u64 + range.start as u64, len))
    }

    /// A gather entry (the queue pair reads) for `range`, or `None` if out of bounds.
    /// Does not allocate.
    pub fn sge(&self, range: Range<usize>) -> Option<Sge<'_>> {
        let (addr, len) = self.range(&range)?;
        // SAFETY: the range lies inside this region, whose lkey stays valid while the entry
        // borrows it; the model never writes through a gather entry.
        Some(unsafe { Sge::from_raw(addr, len, self.lkey) })
    }

    /// A scatter entry (the queue pair writes) for `range`, or `None` if out of bounds or
    /// the region lacks local write access. Does not allocate.
    pub fn sge_mut(&mut self, range: Range<usize>) -> Option<SgeMut<'_>> {
        let [e] = self.sges_mut([range])?;
        Some(e)
    }

    /// Several scatter entries at once, for scatter lists into one region: `None` if one is
    /// out of bounds, two overlap, or the region lacks local write access. Does not allocate.
    pub fn sges_mut<const N: usize>(
        &mut self,
        ranges: [Range<usize>; N],
    ) -> Option<[SgeMut<'_>; N]> {
        if !self.access.contains(SoftAccess::LOCAL_WRITE) {
            return None;
        }
        let mut parts = [(0u64, 0u32); N];
        for (i, r) in ranges.iter().enumerate() {
            parts[i] = self.range(r)?;
            let overlaps = ranges[..i]
                .iter()
                .any(|o| r.start < o.end && o.start < r.end);
            if overlaps {
                return None;
            }
        }
        // SAFETY: each range lies inside this region, which has local write access and stays
        // registered while the entries borrow it mutably; the ranges are pairwise disjoint,
        // and the `&mut self` borrow keeps the CPU out of the bytes meanwhile.
        Some(parts.map(|(addr, len)| unsafe { SgeMut::from_raw(addr, len, self.lkey) }))
    }

    /// Copies `dst.len()` bytes at `offset` out of the region. Returns `false` (copying
    /// nothing) if the range is out of bounds. Does not allocate.
    pub fn read_into(&self, offset: usize, dst: &mut [u8]) -> bool {
        if !in_bounds(offset, dst.len(), self.len) {
            return false;
        }
        for (i, d) in dst.iter_mut().enumerate() {
            // SAFETY: offset + i < len, inside the buffer the region holds for 'm; volatile
            // because the peer may write it at any time, and no reference to it exists.
            *d = unsafe { self.ptr.add(offset + i).read_volatile() };
        }
        true
    }

    /// Copies `src` into the region at `offset`. Returns `false` if out of bounds.
    /// Does not allocate.
    pub fn write_from(&self, offset: usize, src: &[u8]) -> bool {
        if !in_bounds(offset, src.len(), self.len) {
            return false;
        }
        for (i, s) in src.iter().enumerate() {
            // SAFETY: as in read_into.
            unsafe { self.ptr.add(offset + i).write_volatile(*s) };
        }
        true
    }

    /// A volatile little-endian `u64` load at an 8-aligned `offset`. `None` if misaligned or
    /// out of bounds. Does not allocate.
    pub fn load_u64(&self, offset: usize) -> Option<u64> {
        if !offset.is_multiple_of(8) || !in_bounds(offset, 8, self.len) {
            return None;
        }
        let mut b = [0u8; 8];
        self.read_into(offset, &mut b);
        Some(u64::from_le_bytes(b))
    }

    /// A volatile little-endian `u64` store at an 8-aligned `offset`.
    pub fn store_u64(&self, offset: usize, v: u64) -> bool {
        offset.is_multiple_of(8) && self.write_from(offset, &v.to_le_bytes())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const CAPS: QpCaps = QpCaps {
        max_send_wr: 8,
        max_recv_wr: 8,
        max_send_sge: 3,
        max_recv_sge: 3,
        max_inline_data: 32,
    };

    const RW: SoftAccess = SoftAccess::LOCAL_WRITE
        .union(SoftAccess::REMOTE_WRITE)
        .union(SoftAccess::REMOTE_READ);

    fn fabric<'m>() -> SoftFabric<'m> {
        SoftFabric::new(CAPS, RnrRetry::Times(2), RetryCount::new(3).unwrap())
    }

    fn wr<'a>(id: u64, op: Opcode, flags: SendFlags, sges: &'a [Sge<'a>]) -> WorkRequest<'a> {
        WorkRequest {
            wr_id: id,
            opcode: op,
            flags: flags | SendFlags::SIGNALED,
            sges,
            remote: RemoteMemory::default(),
        }
    }

    /// A scatter entry as the entry type receive requests carry.
    fn rs<'a>(x: &SgeMut<'a>) -> Sge<'a> {
        // SAFETY: same range and key; the caller keeps the SgeMut borrowed meanwhile.
        unsafe { Sge::from_raw(x.addr(), x.len(), x.lkey()) }
    }

    fn poll_s(e: &mut SoftEnd<'_>) -> ([Completion; 16], usize) {
        let mut wc = [Completion::EMPTY; 16];
        let n = e.poll_send(&mut wc).unwrap();
        (wc, n)
    }

    fn poll_r(e: &mut SoftEnd<'_>) -> ([Completion; 16], usize) {
        let mut wc = [Completion::EMPTY; 16];
        let n = e.poll_recv(&mut wc).unwrap();
        (wc, n)
    }

    #[test]
    fn keys_round_trip_and_differ() {
        assert_eq!(KEY_MIX.wrapping_mul(KEY_UNMIX), 1);
        let k = make_key(5, KeyKind::Remote, 1, 9);
        assert_eq!(split_key(k), (5, KeyKind::Remote, 1, 9));
        assert_ne!(k, make_key(5, KeyKind::Local, 1, 9));
        assert_eq!(split_key(0).0, 0);
    }

    #[test]
    fn caps_are_clamped() {
        let big = QpCaps {
            max_send_wr: 10_000,
            max_recv_wr: 10_000,
            max_send_sge: 99,
            max_recv_sge: 99,
            max_inline_data: 4096,
        };
        let f = SoftFabric::new(big, RnrRetry::Infinite, RetryCount::default());
        let (a, _) = f.ends();
        assert_eq!(
            a.caps(),
            QpCaps {
                max_send_wr: QUEUE_CAP as u32,
                max_recv_wr: QUEUE_CAP as u32,
                max_send_sge: MAX_SGE as u32,
                max_recv_sge: MAX_SGE as u32,
                max_inline_data: MAX_INLINE as u32,
            }
        );
    }

    #[test]
    fn write_signaled_and_unsignaled() {
        let (mut src, mut dst) = ([0u8; 16], [0u8; 16]);
        let f = fabric();
        let s = f.register(Side::A, &mut src, SoftAccess::empty()).unwrap();
        let d = f.register(Side::B, &mut dst, RW).unwrap();
        s.write_from(0, b"0123456789abcdef");
        let (mut a, _b) = f.ends();
        let g1 = [s.sge(0..4).unwrap()];
        let g2 = [s.sge(4..8).unwrap(), s.sge(12..16).unwrap()];
        let mut w1 = wr(1, Opcode::Write, SendFlags::empty(), &g1);
        w1.flags = SendFlags::empty();
        w1.remote = d.remote();
        let mut w2 = wr(2, Opcode::Write, SendFlags::empty(), &g2);
        w2.remote = d.remote().slice(8, 8).unwrap();
        // SAFETY: the regions outlive the requests, which complete inside the post.
        unsafe { a.post_send(&[w1, w2]) }.unwrap();
        assert_eq!(f.send_queue_used(Side::A), 2);
        let (wc, n) = poll_s(&mut a);
        assert_eq!(n, 1);
        assert_eq!(wc[0].wr_id, 2);
        assert_eq!(wc[0].kind, CompletionKind::Write);
        assert_eq!(wc[0].byte_len, 8);
        assert_eq!(wc[0].qp_num, Side::A.qp_num());
        assert_eq!(f.send_queue_used(Side::A), 0);
        let mut got = [0u8; 16];
        assert!(d.read_into(0, &mut got));
        assert_eq!(&got, b"0123\x00\x00\x00\x004567cdef");
        assert_eq!(d.load_u64(8), Some(u64::from_le_bytes(*b"4567cdef")));
        assert_eq!(d.load_u64(3), None);
    }

    #[test]
    fn send_recv_scatter_imm_and_write_imm() {
        let (mut src, mut dst, mut tgt) = ([0u8; 8], [0u8; 8], [0u8; 8]);
        let f = fabric();
        let s = f.register(Side::A, &mut src, SoftAccess::empty()).unwrap();
        let mut d = f
            .register(Side::B, &mut dst, SoftAccess::LOCAL_WRITE)
            .unwrap();
        let t = f.register(Side::B, &mut tgt, RW).unwrap();
        s.write_from(0, b"abcdefgh");
        let (mut a, mut b) = f.ends();
        {
            let [x, y] = d.sges_mut([0..2, 4..8]).unwrap();
            let rs = [rs(&x), rs(&y)];
            let rr = [
                RecvRequest {
                    wr_id: 10,
                    sges: &rs,
                },
                RecvRequest {
                    wr_id: 11,
                    sges: &[],
                },
            ];
            // SAFETY: the region outlives the receives, polled below.
            unsafe { b.post_recv(&rr) }.unwrap();
            let g = [s.sge(0..5).unwrap()];
            let sends = [wr(1, Opcode::SendImm(0xfeed), SendFlags::empty(), &g), {
                let mut w = wr(2, Opcode::WriteImm(7), SendFlags::empty(), &g[..]);
                w.remote = t.remote();
                w
            }];
            // SAFETY: as above.
            unsafe { a.post_send(&sends) }.unwrap();
        }
        let (wc, n) = poll_r(&mut b);
        assert_eq!(n, 2);
        assert_eq!(
            (wc[0].wr_id, wc[0].kind, wc[0].byte_len, wc[0].imm),
            (10, CompletionKind::Recv, 5, Some(0xfeed))
        );
        assert_eq!(wc[0].qp_num, Side::B.qp_num());
        assert_eq!(
            (wc[1].wr_id, wc[1].kind, wc[1].byte_len, wc[1].imm),
            (11, CompletionKind::RecvWriteImm, 5, Some(7))
        );
        let mut got = [0u8; 8];
        d.read_into(0, &mut got);
        assert_eq!(&got, b"ab\0\0cde\0");
        t.read_into(0, &mut got);
        assert_eq!(&got, b"abcde\0\0\0");
        let (wc, n) = poll_s(&mut a);
        assert_eq!(n, 2);
        assert_eq!(wc[0].kind, CompletionKind::Send);
        assert_eq!(f.recv_queue_used(Side::B), 0);
    }

    #[test]
    fn read_needs_remote_read() {
        let (mut l, mut r1, mut r2) = ([0u8; 8], [0u8; 8], [0u8; 8]);
        let f = fabric();
        let mut lm = f
            .register(Side::A, &mut l, SoftAccess::LOCAL_WRITE)
            .unwrap();
        let ok = f.register(Side::B, &mut r1, RW).unwrap();
        let no = f
            .register(Side::B, &mut r2, SoftAccess::LOCAL_WRITE)
            .unwrap();
        ok.write_from(0, b"remote!!");
        let (mut a, _b) = f.ends();
        {
            let m = lm.sge_mut(0..8).unwrap();
            let s = [rs(&m)];
            let mut w = wr(1, Opcode::Read, SendFlags::empty(), &s);
            w.remote = ok.remote();
            // SAFETY: completes in the post; polled below.
            unsafe { a.post_send(&[w]) }.unwrap();
            let (wc, n) = poll_s(&mut a);
            assert_eq!(
                (n, wc[0].kind, wc[0].byte_len),
                (1, CompletionKind::Read, 8)
            );
            w.remote = no.remote();
            w.wr_id = 2;
            // SAFETY: as above.
            unsafe { a.post_send(&[w]) }.unwrap();
        }
        let mut got = [0u8; 8];
        lm.read_into(0, &mut got);
        assert_eq!(&got, b"remote!!");
        let (wc, n) = poll_s(&mut a);
        assert_eq!(
            (n, wc[0].wr_id, wc[0].status),
            (1, 2, WcStatus::RemoteAccess)
        );
        assert!(f.in_error(Side::A) && f.in_error(Side::B));
    }

    #[test]
    fn bad_lkey_fails_and_flushes_the_rest() {
        let mut src = [0u8; 8];
        let f = fabric();
        let s = f.register(Side::A, &mut src, RW).unwrap();
        let (mut a, mut b) = f.ends();
        let good = [s.sge(0..8).unwrap()];
        // SAFETY: never dereferenced: the lkey does not resolve.
        let bad = [unsafe { Sge::from_raw(s.sge(0..8).unwrap().addr(), 8, s.lkey() ^ 1) }];
        let mut w = [
            wr(1, Opcode::Write, SendFlags::empty(), &bad),
            wr(2, Opcode::Write, SendFlags::empty(), &good),
            wr(3, Opcode::Write, SendFlags::empty(), &good),
        ];
        for x in &mut w {
            x.remote = s.remote();
            x.flags = SendFlags::empty();
        }
        let rr = [RecvRequest {
            wr_id: 9,
            sges: &[],
        }];
        // SAFETY: the receive names no memory.
        unsafe { a.post_recv(&rr) }.unwrap();
        // SAFETY: nothing is written (the first fails, the rest flush).
        unsafe { a.post_send(&w) }.unwrap();
        let (wc, n) = poll_s(&mut a);
        assert_eq!(n, 3, "unsignaled requests flush too");
        assert_eq!((wc[0].wr_id, wc[0].status), (1, WcStatus::LocalProtection));
        assert_eq!(wc[0].kind, CompletionKind::Other);
        assert_eq!((wc[1].wr_id, wc[1].status), (2, WcStatus::Flushed));
        assert_eq!((wc[2].wr_id, wc[2].status), (3, WcStatus::Flushed));
        let (wc, n) = poll_r(&mut a);
        assert_eq!((n, wc[0].wr_id, wc[0].status), (1, 9, WcStatus::Flushed));
        assert!(!f.in_error(Side::B));
        // Posting in the error state works and flushes.
        // SAFETY: as above.
        unsafe { a.post_send(&w[1..2]) }.unwrap();
        assert_eq!(poll_s(&mut a).0[0].status, WcStatus::Flushed);
        let (wc, n) = poll_r(&mut b);
        assert_eq!(n, 0, "{:?}", wc[0]);
    }

    #[test]
    fn short_receive_is_a_length_error_on_both_sides() {
        let (mut src, mut dst) = ([0u8; 8], [0u8; 4]);
        let f = fabric();
        let s = f.register(Side::A, &mut src, SoftAccess::empty()).unwrap();
        let mut d = f
            .register(Side::B, &mut dst, SoftAccess::LOCAL_WRITE)
            .unwrap();
        let (mut a, mut b) = f.ends();
        {
            let m = d.sge_mut(0..4).unwrap();
            let rs = [rs(&m)];
            let rr = [
                RecvRequest {
                    wr_id: 1,
                    sges: &rs,
                },
                RecvRequest {
                    wr_id: 2,
                    sges: &rs,
                },
            ];
            // SAFETY: nothing is written (too short), the second flushes.
            unsafe { b.post_recv(&rr) }.unwrap();
            let g = [s.sge(0..8).unwrap()];
            // SAFETY: as above.
            unsafe { a.post_send(&[wr(5, Opcode::Send, SendFlags::empty(), &g)]) }.unwrap();
        }
        let (wc, n) = poll_s(&mut a);
        assert_eq!((n, wc[0].status), (1, WcStatus::RemoteInvalidRequest));
        let (wc, n) = poll_r(&mut b);
        assert_eq!(n, 2);
        assert_eq!((wc[0].wr_id, wc[0].status), (1, WcStatus::LocalLength));
        assert_eq!((wc[1].wr_id, wc[1].status), (2, WcStatus::Flushed));
    }

    #[test]
    fn rnr_waits_for_a_receive_then_gives_up() {
        let mut src = [0u8; 4];
        let f = fabric();
        let s = f.register(Side::A, &mut src, SoftAccess::empty()).unwrap();
        let (mut a, mut b) = f.ends();
        let g = [s.sge(0..4).unwrap()];
        let w = [wr(1, Opcode::Send, SendFlags::empty(), &g)];
        // SAFETY: the region outlives the request, polled below.
        unsafe { a.post_send(&w) }.unwrap();
        assert_eq!(poll_s(&mut a).1, 0); // retry 1 of 2
        let rr = [RecvRequest {
            wr_id: 3,
            sges: &[],
        }];
        // A receive posted in time unblocks the send; a zero-length receive cannot hold 4 bytes.
        // SAFETY: names no memory.
        unsafe { b.post_recv(&rr) }.unwrap();
        let (wc, n) = poll_s(&mut a);
        assert_eq!((n, wc[0].status), (1, WcStatus::RemoteInvalidRequest));

        let f = SoftFabric::new(CAPS, RnrRetry::Times(2), RetryCount::default());
        let (mut a, _b) = f.ends();
        let w = [wr(1, Opcode::Send, SendFlags::empty(), &[])];
        // SAFETY: names no memory.
        unsafe { a.post_send(&w) }.unwrap();
        assert_eq!(poll_s(&mut a).1, 0);
        let (wc, n) = poll_s(&mut a);
        assert_eq!((n, wc[0].status), (1, WcStatus::RnrRetryExceeded));
        assert_eq!(f.stats(Side::A).rnr_retries, 2);

        let f = SoftFabric::new(CAPS, RnrRetry::Infinite, RetryCount::default());
        let (mut a, mut b) = f.ends();
        // SAFETY: names no memory.
        unsafe { a.post_send(&w) }.unwrap();
        for _ in 0..50 {
            assert_eq!(poll_s(&mut a).1, 0);
        }
        // SAFETY: names no memory.
        unsafe { b.post_recv(&rr) }.unwrap();
        assert_eq!(poll_s(&mut a).0[0].status, WcStatus::Success);
        assert_eq!(poll_r(&mut b).0[0].byte_len, 0);
    }

    #[test]
    fn rnr_retry_zero_fails_at_once() {
        let f = SoftFabric::new(CAPS, RnrRetry::Times(0), RetryCount::default());
        let (mut a, _b) = f.ends();
        let w = [wr(1, Opcode::Send, SendFlags::empty(), &[])];
        // SAFETY: names no memory.
        unsafe { a.post_send(&w) }.unwrap();
        assert_eq!(poll_s(&mut a).0[0].status, WcStatus::RnrRetryExceeded);
    }

    #[test]
    fn dead_peer_is_retry_exceeded() {
        let f = fabric(); // retry_count 3
        let (mut a, mut b) = f.ends();
        let rr = [RecvRequest {
            wr_id: 3,
            sges: &[],
        }];
        // SAFETY: names no memory.
        unsafe { b.post_recv(&rr) }.unwrap();
        f.kill(Side::B);
        assert_eq!(poll_r(&mut b).0[0].status, WcStatus::Flushed);
        let w = [wr(1, Opcode::Send, SendFlags::empty(), &[])];
        // SAFETY: names no memory.
        unsafe { a.post_send(&w) }.unwrap();
        for _ in 0..2 {
            assert_eq!(poll_s(&mut a).1, 0);
        }
        assert_eq!(poll_s(&mut a).0[0].status, WcStatus::RetryExceeded);
        assert_eq!(f.stats(Side::A).transport_retries, 3);
    }

    #[test]
    fn queue_full_is_enomem_with_posted_count() {
        let f = fabric();
        let (mut a, mut b) = f.ends();
        let w = [wr(0, Opcode::Write, SendFlags::empty(), &[]); 6];
        // SAFETY: zero-length writes name no memory.
        unsafe { a.post_send(&w) }.unwrap();
        // SAFETY: as above.
        let e = unsafe { a.post_send(&w) }.unwrap_err();
        assert_eq!(
            e,
            PostFailure {
                posted: 2,
                errno: ENOMEM
            }
        );
        let (_, n) = poll_s(&mut a);
        assert_eq!(n, 8);
        assert_eq!(f.send_queue_used(Side::A), 0);
        // SAFETY: as above.
        unsafe { a.post_send(&w) }.unwrap();
        let too_many = [wr(0, Opcode::Write, SendFlags::empty(), &[]); MAX_BATCH + 1];
        // SAFETY: as above.
        let e = unsafe { a.post_send(&too_many) }.unwrap_err();
        assert_eq!(e.errno, EINVAL);

        let rr = [RecvRequest {
            wr_id: 0,
            sges: &[],
        }; 9];
        // SAFETY: names no memory.
        let e = unsafe { b.post_recv(&rr) }.unwrap_err();
        assert_eq!(
            e,
            PostFailure {
                posted: 8,
                errno: ENOMEM
            }
        );
    }

    #[test]
    fn einval_for_sges_and_inline() {
        let mut buf = [0u8; 64];
        let f = fabric();
        let s = f.register(Side::A, &mut buf, RW).unwrap();
        let (mut a, mut b) = f.ends();
        let four = [s.sge(0..1).unwrap(); 4];
        let w = [
            wr(1, Opcode::Write, SendFlags::empty(), &four[..3]),
            wr(2, Opcode::Write, SendFlags::empty(), &four),
        ];
        // SAFETY: zero rkey: nothing is written remotely; the first fails with RemoteAccess.
        let e = unsafe { a.post_send(&w) }.unwrap_err();
        assert_eq!(
            e,
            PostFailure {
                posted: 1,
                errno: EINVAL
            }
        );
        let data = [7u8; 33];
        // SAFETY: inline data is a live slice.
        let big = [unsafe { Sge::from_raw(data.as_ptr() as u64, 33, 0) }];
        let w = [wr(3, Opcode::Send, SendFlags::INLINE, &big)];
        // SAFETY: rejected before reading.
        let e = unsafe { a.post_send(&w) }.unwrap_err();
        assert_eq!(
            e,
            PostFailure {
                posted: 0,
                errno: EINVAL
            }
        );
        let rr = [RecvRequest {
            wr_id: 0,
            sges: &four,
        }];
        // SAFETY: rejected.
        let e = unsafe { b.post_recv(&rr) }.unwrap_err();
        assert_eq!(
            e,
            PostFailure {
                posted: 0,
                errno: EINVAL
            }
        );
    }

    #[test]
    fn inline_is_copied_at_post_time() {
        let mut dst = [0u8; 8];
        let f = fabric();
        let mut d = f
            .register(Side::B, &mut dst, SoftAccess::LOCAL_WRITE)
            .unwrap();
        let (mut a, mut b) = f.ends();
        let mut data = *b"inline!!";
        {
            // SAFETY: a live slice; inline entries are read during the post only.
            let g = [unsafe { Sge::from_raw(data.as_ptr() as u64, 8, 0) }];
            let w = [wr(1, Opcode::Send, SendFlags::INLINE, &g)];
            // SAFETY: as above.
            unsafe { a.post_send(&w) }.unwrap(); // RNR-blocked: no receive yet
        }
        data.fill(0);
        assert_eq!(data, [0; 8]);
        {
            let m = d.sge_mut(0..8).unwrap();
            let rs = [rs(&m)];
            let rr = [RecvRequest {
                wr_id: 4,
                sges: &rs,
            }];
            // SAFETY: the region outlives the receive, polled below.
            unsafe { b.post_recv(&rr) }.unwrap();
        }
        assert_eq!(poll_r(&mut b).0[0].byte_len, 8);
        let mut got = [0u8; 8];
        d.read_into(0, &mut got);
        assert_eq!(&got, b"inline!!");
    }

    #[test]
    fn stale_and_foreign_keys_do_not_resolve() {
        let (mut x, mut y, mut z) = ([0u8; 8], [0u8; 8], [0u8; 8]);
        let f = fabric();
        let s = f.register(Side::A, &mut x, RW).unwrap();
        let old = {
            let r = f.register(Side::B, &mut y, RW).unwrap();
            r.remote()
        };
        let fresh = f.register(Side::B, &mut z, RW).unwrap();
        assert_ne!(old.rkey, fresh.rkey());
        let (mut a, _b) = f.ends();
        let g = [s.sge(0..8).unwrap()];
        let mut w = wr(1, Opcode::Write, SendFlags::empty(), &g);
        w.remote = RemoteMemory {
            addr: fresh.remote().addr,
            ..old
        };
        // SAFETY: the stale rkey resolves to nothing, so nothing is written.
        unsafe { a.post_send(&[w]) }.unwrap();
        assert_eq!(poll_s(&mut a).0[0].status, WcStatus::RemoteAccess);
        // An rkey of side A used against side B, and an lkey used as rkey.
        let st = f.shared.state.borrow();
        let at = fresh.remote().addr;
        assert!(st[1]
            .resolve(1, KeyKind::Remote, fresh.rkey(), at, 8, RW)
            .is_some());
        assert!(st[1]
            .resolve(1, KeyKind::Remote, fresh.rkey(), at + 1, 8, RW)
            .is_none());
        assert!(st[1]
            .resolve(1, KeyKind::Remote, fresh.lkey(), at, 8, RW)
            .is_none());
        let sa = s.remote();
        assert!(st[1]
            .resolve(1, KeyKind::Remote, sa.rkey, sa.addr, 8, RW)
            .is_none());
        assert!(st[0]
            .resolve(0, KeyKind::Remote, sa.rkey, sa.addr, 8, RW)
            .is_some());
    }

    #[test]
    fn registration_errors() {
        let mut bufs = [[0u8; 1]; MAX_REGIONS + 2];
        let mut empty = [0u8; 0];
        let f = fabric();
        assert_eq!(
            f.register(Side::A, &mut empty, RW).unwrap_err(),
            SoftError::EmptyBuffer
        );
        let mut regs = heapless::Vec::<SoftRegion<'_>, MAX_REGIONS>::new();
        let mut it = bufs.iter_mut();
        for b in it.by_ref().take(MAX_REGIONS) {
            assert!(regs.push(f.register(Side::A, b, RW).unwrap()).is_ok());
        }
        assert_eq!(
            f.register(Side::A, it.next().unwrap(), SoftAccess::REMOTE_WRITE)
                .unwrap_err(),
            SoftError::RemoteWriteNeedsLocalWrite
        );
        assert_eq!(
            f.register(Side::A, it.next().unwrap(), RW).unwrap_err(),
            SoftError::TableFull
        );
        regs.clear();
        assert_eq!(f.stats(Side::A), SoftStats::default());
    }

    #[test]
    fn set_error_flushes_and_peer_sees_no_ack() {
        let f = fabric();
        let (mut a, mut b) = f.ends();
        let rr = [RecvRequest {
            wr_id: 1,
            sges: &[],
        }; 2];
        // SAFETY: names no memory.
        unsafe { b.post_recv(&rr) }.unwrap();
        b.set_error().unwrap();
        let (wc, n) = poll_r(&mut b);
        assert_eq!((n, wc[1].status), (2, WcStatus::Flushed));
        assert_eq!(f.recv_queue_used(Side::B), 0);
        let w = [wr(1, Opcode::Write, SendFlags::empty(), &[])];
        // SAFETY: names no memory.
        unsafe { a.post_send(&w) }.unwrap();
        let mut polls = 0;
        let status = loop {
            let (wc, n) = poll_s(&mut a);
            polls += 1;
            if n > 0 {
                break wc[0].status;
            }
        };
        assert_eq!((status, polls), (WcStatus::RetryExceeded, 3));
    }
}
