//! [`MultiChannel`]: one [`Channel`] per peer, addressed by the peer's rank.
//!
//! Every peer has its own RC queue pair and completion queues (all on one protection
//! domain); waiting polls only the channels an operation used. Multi-peer operations post to
//! every peer first, then wait, so the transfers overlap. Nothing allocates after
//! construction: operations take iterators and fixed slices, and report the first failure
//! with the rank it happened on.
//!
//! The posting vocabulary is the channel's: a bare verb (`send`, `write`, ...) waits; a
//! `post_*` returns a [`Ticket`] (which carries the rank) that [`MultiChannel::wait`] takes.
//!
//! Every multi-peer call waits at most each channel's timeout, and settles every channel it
//! posted on before it returns, on every path: an error, or a panic in the caller's
//! iterator or callback (then the channels with work in flight are flushed at once, so no
//! buffer borrowed by the call outlives the device's use of it).

use alloc::vec;
use alloc::vec::Vec;
use core::fmt;

use crate::channel::{Batch, Channel, ChannelError, Done, Ticket};
use crate::completion::Completion;
use crate::poll::Backoff;
use crate::provider::shared::QpTable;
use crate::provider::{Provider, ProviderError};
use crate::sge::{RemoteMemory, Sge, SgeMut};

/// A channel operation that failed on one peer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PeerError {
    /// The peer's rank.
    pub rank: u32,
    /// What failed.
    pub error: ChannelError,
}

impl fmt::Display for PeerError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.error {
            // These already name the rank.
            ChannelError::Failed(_) | ChannelError::Broken(_) | ChannelError::TimedOut { .. } => {
                write!(f, "{}", self.error)
            }
            _ => write!(f, "rank {}: {}", self.rank, self.error),
        }
    }
}

impl core::error::Error for PeerError {}

/// Errors of multi-peer operations.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum MultiError {
    /// No channel to this rank.
    UnknownRank(u32),
    /// An operation failed on a peer.
    Peer(PeerError),
    /// Polling the completion queues the channels share failed (every peer is affected).
    Completions(ProviderError),
}

impl fmt::Display for MultiError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::UnknownRank(r) => write!(f, "no channel to rank {r}"),
            Self::Peer(e) => write!(f, "{e}"),
            Self::Completions(e) => write!(f, "shared completion queues: {e}"),
        }
    }
}

impl core::error::Error for MultiError {}

/// Why [`MultiChannel::new`] refused its channels (a setup error; no operation fails so).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum MultiBuildError {
    /// A channel without a peer rank
    /// ([`ChannelConfig::rank`](crate::channel::ChannelConfig::rank)).
    ChannelWithoutRank,
    /// Two channels to one rank.
    DuplicateRank(u32),
    /// A channel to a rank at or above [`MAX_WORLD`](crate::wire::MAX_WORLD).
    RankTooLarge(u32),
}

impl fmt::Display for MultiBuildError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::ChannelWithoutRank => f.write_str("a channel has no peer rank"),
            Self::DuplicateRank(r) => write!(f, "two channels to rank {r}"),
            Self::RankTooLarge(r) => write!(
                f,
                "a channel to rank {r}, at or above the largest world ({})",
                crate::wire::MAX_WORLD
            ),
        }
    }
}

impl core::error::Error for MultiBuildError {}

/// No channel at this rank in [`MultiChannel`]'s lookup table.
const NONE: u32 = u32::MAX;

/// One channel per peer. See the [module docs](self).
pub struct MultiChannel<P: Provider, B: Backoff + Clone, const R: usize = 64> {
    chans: Vec<Channel<P, B, R>>,
    /// Index into `chans` -> the rank that channel was given for, fixed at construction: the
    /// rank an error names even if the caller later swaps another channel in.
    rank_at: Vec<u32>,
    /// Rank -> index into `chans` (`NONE` where there is no channel): O(1) lookup.
    index: Vec<u32>,
    /// Per channel, the last send-queue ticket of the multi-peer call in progress: the call
    /// waits for exactly that (and what came before it on that queue), not for receives
    /// posted by others (a node's messaging rings).
    last: Vec<Option<Ticket>>,
    /// Queue-pair numbers and the channels a shared poll names ready (one place: what
    /// `poll_ready`'s `ready` callback captures, one pointer).
    named: Named,
    /// Shared-queue slots and the completions a shared poll hands over (one place: what
    /// `poll_ready`'s `take` callback captures, with the channels' identities).
    hand: Handover,
    /// Channels a shared poll gave something, in order: (position, completions retired,
    /// intact before, a failed poll of its mailbox), each once (capacity: one per channel).
    touched: Vec<(u32, usize, bool, Option<ChannelError>)>,
    /// Per position, its index in `touched`, or [`UNSEEN`].
    seen: Vec<u32>,
}

/// What [`MultiChannel::poll_ready`]'s `ready` callback reads and fills.
struct Named {
    /// Queue-pair number -> position, for providers that share completion queues.
    qpns: QpTable,
    /// Positions named ready by a shared poll (capacity: one per channel). Empty outside
    /// `poll_ready`: the serving empties it, also when it unwinds (see [`Spent`]).
    ready: Vec<u32>,
}

/// What [`MultiChannel::poll_ready`]'s `take` callback reads and fills.
struct Handover {
    /// Shared-queue slot ([`Provider::shared_slot`]) -> the position of our channel on it
    /// ([`UNSEEN`] for none of ours) and that channel's identity when it was placed there
    /// (by `new` or `renew`): a completion a shared poll offers is handed only to that
    /// channel, never to one a caller swapped in since.
    by_slot: Vec<(u32, usize)>,
    /// The identity of the channel placed at position 0 (by `new` or `renew`): a shared poll
    /// polls the queues that channel's provider names, which `by_slot` describes only while
    /// it is still ours (one swapped in from another node names that node's queues, whose
    /// slots and queue-pair numbers may be the same as ours).
    first: usize,
    /// Completions a shared poll handed over (position, from the receive queue, the
    /// completion), to give to their channels once the poll returned (capacity
    /// [`DIRECT`]; more wait in the mailboxes). Empty outside `poll_ready`, as
    /// [`Named::ready`].
    direct: heapless::Vec<(u32, bool, Completion), DIRECT>,
}

/// Empties the lists a shared poll filled when the serving of them ends, returning or
/// unwinding (a panicking `f`, or a channel's poll): so `poll_ready` need not empty them
/// before each poll (an idle poll writes neither), and no entry, given to its channel
/// already, is ever given again by a later poll: delivery is once.
struct Spent<'a>(&'a mut Handover, &'a mut Named);

impl Drop for Spent<'_> {
    #[inline]
    fn drop(&mut self) {
        self.0.direct.clear();
        self.1.ready.clear();
    }
}

/// Completions one `poll_ready` hands to channels directly; more wait in the shared
/// queues' mailboxes (their channels poll them).
const DIRECT: usize = 32;
/// A channel not in `touched`.
const UNSEEN: u32 = u32::MAX;

impl<P: Provider, B: Backoff + Clone, const R: usize> fmt::Debug for MultiChannel<P, B, R> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MultiChannel")
            .field("peers", &self.chans.len())
            .finish()
    }
}

/// The verbs [`MultiChannel`] forwards to the channel of one rank: each calls the channel's
/// method of the same name and names the rank in its error (one idea, written once).
macro_rules! to_rank {
    ($($(#[doc = $doc:literal])* fn $verb:ident($($arg:ident: $ty:ty),*) -> $ok:ty;)*) => {$(
        $(#[doc = $doc])*
        pub fn $verb(&mut self, rank: u32, $($arg: $ty),*) -> Result<$ok, MultiError> {
            self.channel(rank)?.$verb($($arg),*).map_err(at(rank))
        }
    )*};
}

/// What [`MultiChannel::poll_ready`] tells its caller about channel `who` after polling it
/// (`polled`: how many completions it retired, or why the poll failed), adding them to `n`:
/// nothing for none; a channel this poll broke (an error completion, `intact` before) once,
/// as `Err(ChannelError::Failed)`; later polls say `Ok`.
#[inline(always)]
fn report<P: Provider, B: Backoff, const R: usize>(
    f: &mut impl FnMut((usize, u32), Result<usize, ChannelError>),
    n: &mut usize,
    who: (usize, u32),
    c: &Channel<P, B, R>,
    intact: bool,
    polled: Result<usize, ChannelError>,
) {
    match polled {
        Ok(0) => {}
        Ok(k) => {
            *n += k;
            match c.fault() {
                Some(ChannelError::Broken(w)) if intact => f(who, Err(ChannelError::Failed(w))),
                _ => f(who, Ok(k)),
            }
        }
        Err(e) => f(who, Err(e)),
    }
}

fn at(rank: u32) -> impl Fn(ChannelError) -> MultiError {
    move |error| MultiError::Peer(PeerError { rank, error })
}

impl<P: Provider, B: Backoff + Clone, const R: usize> MultiChannel<P, B, R> {
    /// Wraps connected channels, each of which knows its peer's rank
    /// ([`ChannelConfig::rank`](crate::channel::ChannelConfig::rank)), below
    /// [`MAX_WORLD`](crate::wire::MAX_WORLD). Allocates (setup).
    pub fn new(chans: Vec<Channel<P, B, R>>) -> Result<Self, MultiBuildError> {
        let mut top = 0;
        let mut rank_at = Vec::with_capacity(chans.len());
        for c in &chans {
            let r = c.peer().ok_or(MultiBuildError::ChannelWithoutRank)?;
            rank_at.push(r);
            // The lookup table is sized by the largest rank.
            if r >= crate::wire::MAX_WORLD {
                return Err(MultiBuildError::RankTooLarge(r));
            }
            top = top.max(r as usize + 1);
        }
        let mut index = vec![NONE; top];
        for (i, &r) in rank_at.iter().enumerate() {
            let r = r as usize;
            if index[r] != NONE {
                return Err(MultiBuildError::DuplicateRank(r as u32));
            }
            index[r] = i as u32;
        }
        let last = vec![None; chans.len()];
        let mut qpns = QpTable::new(chans.len());
        for (i, c) in chans.iter().enumerate() {
            qpns.insert(c.provider().qp_num(), i as u32);
        }
        let ready = Vec::with_capacity(chans.len());
        let touched = Vec::with_capacity(chans.len());
        let seen = vec![UNSEEN; chans.len()];
        let mut by_slot = Vec::new();
        for (i, c) in chans.iter().enumerate() {
            if let Some(s) = c.provider().shared_slot() {
                if by_slot.len() <= s {
                    by_slot.resize(s + 1, (UNSEEN, 0));
                }
                by_slot[s] = (i as u32, c.id());
            }
        }
        let first = chans.first().map_or(0, Channel::id);
        Ok(Self {
            chans,
            rank_at,
            index,
            last,
            named: Named { qpns, ready },
            hand: Handover {
                by_slot,
                first,
                direct: heapless::Vec::new(),
            },
            touched,
            seen,
        })
    }

    /// Number of peers.
    #[inline]
    pub fn peers(&self) -> usize {
        self.chans.len()
    }

    /// The peers' ranks, in the order the channels were given.
    pub fn ranks(&self) -> impl Iterator<Item = u32> + '_ {
        self.rank_at.iter().copied()
    }

    /// The rank whose channel runs on queue pair `qp_num` (how a device's asynchronous event
    /// names a connection), if one does.
    pub fn rank_of_qp(&self, qp_num: u32) -> Option<u32> {
        let i = self.named.qpns.get(qp_num)?;
        self.rank_at.get(i as usize).copied()
    }

    /// Every channel's queue pair number with the rank it leads to (what a thread watching
    /// the device's events needs to name the rank of a failed queue pair).
    pub fn qp_ranks(&self) -> impl Iterator<Item = (u32, u32)> + '_ {
        self.chans
            .iter()
            .zip(&self.rank_at)
            .map(|(c, &rank)| (c.provider().qp_num(), rank))
    }

    /// The channel to `rank`.
    #[inline]
    pub fn channel(&mut self, rank: u32) -> Result<&mut Channel<P, B, R>, MultiError> {
        match self.index.get(rank as usize) {
            Some(&i) if i != NONE => Ok(&mut self.chans[i as usize]),
            _ => Err(MultiError::UnknownRank(rank)),
        }
    }

    /// The position of `rank`'s channel in the list given to [`MultiChannel::new`].
    #[inline]
    pub(crate) fn position(&self, rank: u32) -> Option<usize> {
        match self.index.get(rank as usize) {
            Some(&i) if i != NONE => Some(i as usize),
            _ => None,
        }
    }

    /// The channel at position `i` of the list given to [`MultiChannel::new`] (for layers
    /// that keep per-peer state in arrays of the same order).
    #[inline]
    pub(crate) fn by_index(&mut self, i: usize) -> Option<&mut Channel<P, B, R>> {
        self.chans.get_mut(i)
    }

    /// [`MultiChannel::by_index`], to read.
    #[inline]
    pub(crate) fn at(&self, i: usize) -> Option<&Channel<P, B, R>> {
        self.chans.get(i)
    }

    /// Replaces the queue pair under `rank`'s channel with `swap` and starts the channel
    /// afresh on it (see [`Channel::renew`]), keeping its position; the lookup by queue-pair
    /// number follows. `None` if there is no channel to `rank` or it has work in flight.
    pub(crate) fn renew<E>(
        &mut self,
        rank: u32,
        swap: impl FnOnce(&mut P) -> Result<(), E>,
    ) -> Option<Result<(), E>> {
        let i = self.position(rank)?;
        let c = &mut self.chans[i];
        let old = c.provider().qp_num();
        let r = c.renew(swap).ok()?;
        if r.is_ok() {
            let new = c.provider().qp_num();
            self.named.qpns.remove(old);
            self.named.qpns.insert(new, i as u32);
            self.last[i] = None;
            // A new identity; the slot stays.
            if let Some(e) = c
                .provider()
                .shared_slot()
                .and_then(|s| self.hand.by_slot.get_mut(s))
            {
                *e = (i as u32, c.id());
            }
            if i == 0 {
                self.hand.first = c.id();
            }
        }
        Some(r)
    }

    /// The identities of the channels, in the order given to [`MultiChannel::new`].
    pub(crate) fn ids(&self) -> impl Iterator<Item = usize> + '_ {
        self.chans.iter().map(Channel::id)
    }

    /// Every channel with the rank it was given for (fixed at construction, whatever channel
    /// the caller has swapped in since).
    pub(crate) fn ranked(&mut self) -> impl Iterator<Item = (u32, &mut Channel<P, B, R>)> + '_ {
        self.rank_at.iter().copied().zip(self.chans.iter_mut())
    }

    /// Every channel, each of which names its rank ([`Channel::peer`]).
    pub fn channels(&mut self) -> impl Iterator<Item = &mut Channel<P, B, R>> + '_ {
        self.chans.iter_mut()
    }

    /// Polls for completions once and retires them; returns how many. With completion
    /// queues shared by the channels ([`crate::provider::shared`]) that is one poll of each
    /// shared queue plus the channels that got something, whatever the number of peers;
    /// otherwise every channel is polled. Fails with the first channel that failed. Does not
    /// allocate.
    pub fn poll(&mut self) -> Result<usize, MultiError> {
        let mut first = None;
        let n = self.poll_ready(|p, r| {
            if let Err(e) = r {
                first.get_or_insert(MultiError::Peer(PeerError {
                    rank: p.1,
                    error: e,
                }));
            }
        })?;
        first.map_or(Ok(n), Err)
    }

    /// Like [`MultiChannel::poll`], and calls `f((position, rank), result)` for every channel
    /// it polled that had completions, or whose poll failed or broke it (an error completion:
    /// `Err(ChannelError::Failed)`, reported by the poll that saw it, later ones say `Ok`).
    /// Positions are in the order given to [`MultiChannel::new`]. Does not allocate.
    pub fn poll_ready(
        &mut self,
        f: impl FnMut((usize, u32), Result<usize, ChannelError>),
    ) -> Result<usize, MultiError> {
        self.poll_claiming(|_, _| false, f)
    }

    /// [`MultiChannel::poll_ready`], offering each receive completion a shared poll would
    /// hand to its channel to `claim((position, channel identity), completion)` first: one
    /// it claims (true) is the caller's to retire on that channel
    /// ([`Channel::retire_claimed_recv`]) and deliver, and goes neither to the channel nor
    /// to `f`. Offered under the same rules as a hand-over (a channel of ours still the one
    /// placed there, nothing of its receive queue's waiting in its mailbox), so a claimed
    /// completion is the next of its channel's receive queue. A node's rings claim their
    /// heads this way. Does not allocate.
    #[inline(always)]
    pub(crate) fn poll_claiming(
        &mut self,
        mut claim: impl FnMut((usize, usize), &Completion) -> bool,
        mut f: impl FnMut((usize, u32), Result<usize, ChannelError>),
    ) -> Result<usize, MultiError> {
        if self
            .chans
            .first()
            .is_some_and(|c| c.id() != self.hand.first)
        {
            // The first channel was swapped for another: its provider's shared queues may be
            // another node's, so nothing it polls is handed over or claimed by slot; every
            // channel polls its own queues, as a channel polled directly does.
            return Ok(self.poll_each(&mut f));
        }
        let Some((first, rest)) = self.chans.split_first_mut() else {
            return Ok(0);
        };
        // `direct` and `ready` are empty here (`Spent`); the callbacks capture little (one
        // pointer each, and the channels' identities), built on every poll.
        let (hand, named, first_id) = (&mut self.hand, &mut self.named, first.id());
        let rest: &[Channel<P, B, R>] = rest;
        let shared = first.provider_mut().poll_shared_with(
            &mut move |slot, recv, c| {
                // Taken only for a channel of ours that is still the one placed there
                // (one swapped out keeps its completions in its mailbox, for its new
                // owner), and while there is room; the rest waits in the mailboxes.
                let Some(&(i, placed)) = hand.by_slot.get(slot) else {
                    return false;
                };
                let id = match (i as usize).checked_sub(1) {
                    None => first_id,
                    Some(j) => match rest.get(j) {
                        Some(c) => c.id(),
                        // `UNSEEN`: a queue pair of someone else's.
                        None => return false,
                    },
                };
                if id != placed {
                    return false;
                }
                (recv && claim((i as usize, id), c)) || hand.direct.push((i, recv, *c)).is_ok()
            },
            &mut move |qpn| {
                // Every channel named here is polled below, before this call returns (and
                // `&mut self` keeps anyone else from polling it meanwhile).
                match named.qpns.get(qpn) {
                    Some(i) if named.ready.len() < named.ready.capacity() => {
                        named.ready.push(i);
                        true
                    }
                    _ => false,
                }
            },
        );
        match shared {
            Ok(Some(_)) if self.hand.direct.is_empty() && self.named.ready.is_empty() => Ok(0),
            Ok(Some(_)) => Ok(self.serve_polled(&mut f)),
            Ok(None) => Ok(self.poll_each(&mut f)),
            Err(e) => Err(self.poll_failed(e)),
        }
    }

    /// A shared poll that failed after it had handed completions over (one queue polled,
    /// the other failing): they are the channels' (gone from the shared queues), so they are
    /// given to them before the error is returned; the caller, told the poll failed, hears
    /// of them from the channels. Out of line: the rare case.
    #[cold]
    #[inline(never)]
    fn poll_failed(&mut self, e: ProviderError) -> MultiError {
        let spent = Spent(&mut self.hand, &mut self.named);
        for &(i, recv, ref comp) in spent.0.direct.iter() {
            if let Some(c) = self.chans.get_mut(i as usize) {
                c.accept(recv, comp);
            }
        }
        MultiError::Completions(e)
    }

    /// [`MultiChannel::poll_ready`] for providers with queues of their own: every channel
    /// polls its own. Out of line, as [`MultiChannel::serve_polled`].
    #[inline(never)]
    fn poll_each(
        &mut self,
        f: &mut impl FnMut((usize, u32), Result<usize, ChannelError>),
    ) -> usize {
        // A provider that says it has queues of its own hands nothing over; were it to, its
        // lists would not outlive this poll.
        drop(Spent(&mut self.hand, &mut self.named));
        let mut n = 0;
        for (i, c) in self.chans.iter_mut().enumerate() {
            let intact = c.fault().is_none();
            let polled = c.poll();
            report(f, &mut n, (i, self.rank_at[i]), c, intact, polled);
        }
        n
    }

    /// After a shared poll: gives the channels what it handed over (`direct`) and lets
    /// those it named (`ready`) take what waits in their mailboxes, then reports each
    /// channel that got anything once. Out of line: a poll that found nothing (an idle
    /// `progress`, a barrier's poll) pays for none of it.
    ///
    /// Order: each channel's completions handed over are newer than any of its kind that
    /// waited in its mailbox (those are never handed over, see
    /// [`Provider::poll_shared_with`]), and no mailbox of a channel that got some could
    /// have been filled after them within the poll, so handed-over completions first, then
    /// the mailboxes, keep every channel's completions in the order its queues gave them.
    #[inline(never)]
    fn serve_polled(
        &mut self,
        f: &mut impl FnMut((usize, u32), Result<usize, ChannelError>),
    ) -> usize {
        let mut n = 0;
        // Both lists are emptied when this returns or unwinds, whatever `f` does.
        let spent = Spent(&mut self.hand, &mut self.named);
        let (direct, ready) = (&spent.0.direct, &spent.1.ready);
        if let (true, Some(&(i, _, _))) = (ready.is_empty(), direct.first()) {
            if direct.iter().all(|e| e.0 == i) {
                // The common case (one peer's traffic): one channel, reported once.
                let i = i as usize;
                if let Some(c) = self.chans.get_mut(i) {
                    let intact = c.fault().is_none();
                    let mut k = 0;
                    for &(_, recv, ref comp) in direct.iter() {
                        k += usize::from(c.accept(recv, comp));
                    }
                    report(f, &mut n, (i, self.rank_at[i]), c, intact, Ok(k));
                }
                return n;
            }
        }
        let (touched, seen) = (&mut self.touched, &mut self.seen);
        touched.clear();
        for &(i, recv, ref comp) in direct.iter() {
            let i = i as usize;
            let Some(c) = self.chans.get_mut(i) else {
                continue;
            };
            if seen[i] == UNSEEN {
                seen[i] = touched.len() as u32;
                touched.push((i as u32, 0, c.fault().is_none(), None));
            }
            let t = &mut touched[seen[i] as usize];
            t.1 += usize::from(c.accept(recv, comp));
        }
        for &i in ready.iter() {
            let i = i as usize;
            let Some(c) = self.chans.get_mut(i) else {
                continue;
            };
            if seen[i] == UNSEEN {
                seen[i] = touched.len() as u32;
                touched.push((i as u32, 0, c.fault().is_none(), None));
            }
            let t = &mut touched[seen[i] as usize];
            match c.poll() {
                Ok(k) => t.1 += k,
                Err(e) => t.3 = Some(e),
            }
        }
        drop(spent);
        // Every mark undone before `f` runs: one that panics leaves none for the next poll.
        for &(i, ..) in touched.iter() {
            seen[i as usize] = UNSEEN;
        }
        for &(i, k, intact, err) in touched.iter() {
            let i = i as usize;
            if let Some(c) = self.chans.get_mut(i) {
                let polled = err.map_or(Ok(k), Err);
                report(f, &mut n, (i, self.rank_at[i]), c, intact, polled);
            }
        }
        n
    }

    to_rank! {
        /// Sends to `rank` and waits. Does not allocate.
        fn send(sges: &[Sge<'_>]) -> ();
        /// Sends `data` inline to `rank` and waits. Does not allocate.
        fn send_inline(data: &[u8]) -> ();
        /// Receives from `rank` and waits. Does not allocate.
        fn recv(sges: &mut [SgeMut<'_>]) -> Done;
        /// Writes to `rank`'s memory and waits. Does not allocate.
        fn write(sges: &[Sge<'_>], remote: RemoteMemory) -> ();
        /// Writes `data` inline to `rank`'s memory and waits. Does not allocate.
        fn write_inline(data: &[u8], remote: RemoteMemory) -> ();
        /// Reads `rank`'s memory and waits. Does not allocate.
        fn read(sges: &mut [SgeMut<'_>], remote: RemoteMemory) -> ();
        /// Compare-and-swap on `rank`'s 8 bytes at `remote` and waits; the prior value lands in
        /// `result` (see [`Channel::compare_swap`]). Does not allocate.
        fn compare_swap(
            result: &mut SgeMut<'_>, remote: RemoteMemory, compare: u64, swap: u64
        ) -> ();
        /// Fetch-and-add on `rank`'s 8 bytes at `remote` and waits; the prior value lands in
        /// `result` (see [`Channel::fetch_add`]). Does not allocate.
        fn fetch_add(result: &mut SgeMut<'_>, remote: RemoteMemory, add: u64) -> ();
        /// Posts an inline send to `rank` and returns its ticket (the lowest-latency send).
        /// Does not allocate.
        fn post_send_inline(data: &[u8]) -> Ticket;
        /// Posts an inline write to `rank`'s memory and returns its ticket (the lowest-latency
        /// write). Does not allocate.
        fn post_write_inline(data: &[u8], remote: RemoteMemory) -> Ticket;
    }

    /// Posts a compare-and-swap on `rank`'s memory and returns its ticket, for
    /// [`MultiChannel::wait`] (see [`Channel::post_compare_swap`]). Does not allocate.
    ///
    /// # Safety
    /// The [posting contract](crate#the-posting-contract): the device writes `result` until
    /// the wait for the ticket returned.
    #[must_use = "wait for the ticket before touching the buffers it names"]
    pub unsafe fn post_compare_swap(
        &mut self,
        rank: u32,
        result: &mut SgeMut<'_>,
        remote: RemoteMemory,
        compare: u64,
        swap: u64,
    ) -> Result<Ticket, MultiError> {
        let c = self.channel(rank)?;
        // SAFETY: forwarded to the caller.
        unsafe { c.post_compare_swap(result, remote, compare, swap) }.map_err(at(rank))
    }

    /// Posts a fetch-and-add on `rank`'s memory and returns its ticket, for
    /// [`MultiChannel::wait`] (see [`Channel::post_fetch_add`]). Does not allocate.
    ///
    /// # Safety
    /// As for [`MultiChannel::post_compare_swap`].
    #[must_use = "wait for the ticket before touching the buffers it names"]
    pub unsafe fn post_fetch_add(
        &mut self,
        rank: u32,
        result: &mut SgeMut<'_>,
        remote: RemoteMemory,
        add: u64,
    ) -> Result<Ticket, MultiError> {
        let c = self.channel(rank)?;
        // SAFETY: forwarded to the caller.
        unsafe { c.post_fetch_add(result, remote, add) }.map_err(at(rank))
    }

    /// Waits for a ticket of one of these channels (it names its rank). Does not allocate.
    pub fn wait(&mut self, t: Ticket) -> Result<Done, MultiError> {
        let rank = t.peer().unwrap_or(NONE);
        self.channel(rank)?.wait(t).map_err(at(rank))
    }

    /// Posts one request per item to the item's rank (each its own doorbell), then waits for
    /// every channel that has work in flight, also when a post failed half way: no buffer is
    /// handed back while the device may still use it.
    fn post_each_then_wait<'a, T, I>(
        &mut self,
        ops: I,
        mut add: impl FnMut(&mut Batch<'_, 'a, P, B, R>, T) -> Result<(), ChannelError>,
    ) -> Result<(), MultiError>
    where
        I: IntoIterator<Item = (u32, T)>,
    {
        let post = |c: &mut Channel<P, B, R>, item| {
            let mut b = c.batch();
            add(&mut b, item)?;
            // SAFETY: the items' buffers are borrowed for 'a, beyond this call, and the
            // guard of `post_all_then_wait` settles every channel before the call returns or
            // unwinds.
            unsafe { b.post() }
        };
        self.post_all_then_wait(ops, post, |_, _| {})
    }

    /// Posts each item on its rank's channel with `post` (which answers the ticket to wait
    /// for, if it posted anything), stopping at the first failure, then waits for the last
    /// ticket of every channel posted on, handing each completion to `on_done` with its
    /// rank. Settles every channel whichever way it ends ([`Settle`]). The first failure,
    /// posting or waiting, is the answer. Does not allocate.
    fn post_all_then_wait<T>(
        &mut self,
        ops: impl IntoIterator<Item = (u32, T)>,
        mut post: impl FnMut(&mut Channel<P, B, R>, T) -> Result<Option<Ticket>, ChannelError>,
        on_done: impl FnMut(u32, Done),
    ) -> Result<(), MultiError> {
        let mut guard = Settle::new(
            &mut self.chans,
            (&self.index, &self.rank_at),
            &mut self.last,
        );
        let mut first = None;
        for (rank, item) in ops {
            let r = match guard.channel(rank) {
                None => Err(MultiError::UnknownRank(rank)),
                Some((c, last)) => post(c, item)
                    .map(|t| {
                        if t.is_some() {
                            *last = t;
                        }
                    })
                    .map_err(at(rank)),
            };
            if let Err(e) = r {
                first = Some(e);
                break;
            }
        }
        let waited = guard.wait_all(on_done);
        first.map_or(waited, Err)
    }

    /// Writes each `(rank, sges, remote)` (one doorbell per request), then waits for all.
    /// Does not allocate.
    pub fn scatter_write<'a, I>(&mut self, ops: I) -> Result<(), MultiError>
    where
        I: IntoIterator<Item = (u32, &'a [Sge<'a>], RemoteMemory)>,
    {
        self.post_each_then_wait(ops.into_iter().map(|(p, s, r)| (p, (s, r))), |b, (s, r)| {
            b.write(s, r).map(|_| ())
        })
    }

    /// Sends each `(rank, sges)`, then waits for all. Does not allocate.
    pub fn scatter_send<'a, I>(&mut self, ops: I) -> Result<(), MultiError>
    where
        I: IntoIterator<Item = (u32, &'a [Sge<'a>])>,
    {
        self.post_each_then_wait(ops, |b, s| b.send(s).map(|_| ()))
    }

    /// Sends the same `sges` to every rank in `ranks`, one send on each rank's channel, then
    /// waits for all: a fan-out over reliable connections, not a multicast (for one post
    /// that the fabric delivers to every member of a group, see
    /// [`Datagram`](crate::datagram::Datagram) and [`Group`](crate::datagram::Group)). Does
    /// not allocate.
    pub fn send_to_each<'a, I>(&mut self, ranks: I, sges: &'a [Sge<'a>]) -> Result<(), MultiError>
    where
        I: IntoIterator<Item = u32>,
    {
        self.post_each_then_wait(ranks.into_iter().map(|p| (p, ())), |b, ()| {
            b.send(sges).map(|_| ())
        })
    }

    /// Reads each `(rank, sges, remote)` into local memory, then waits for all.
    /// Does not allocate.
    pub fn gather_read<'a, I>(&mut self, ops: I) -> Result<(), MultiError>
    where
        I: IntoIterator<Item = (u32, &'a mut [SgeMut<'a>], RemoteMemory)>,
    {
        self.post_each_then_wait(ops.into_iter().map(|(p, s, r)| (p, (s, r))), |b, (s, r)| {
            b.read(s, r).map(|_| ())
        })
    }

    /// Posts a receive for each `(rank, sges)` and waits until all arrived; `on_recv` sees
    /// each rank's [`Done`] in the order the channels were given. Does not allocate.
    pub fn gather_receive<'a, I>(
        &mut self,
        ops: I,
        on_recv: impl FnMut(u32, Done),
    ) -> Result<(), MultiError>
    where
        I: IntoIterator<Item = (u32, &'a mut [SgeMut<'a>])>,
    {
        let post = |c: &mut Channel<P, B, R>, sges: &'a mut [SgeMut<'a>]| {
            // SAFETY: 'a outlives this call, and the guard of `post_all_then_wait` settles
            // every channel before the call returns or unwinds.
            unsafe { c.post_recv(sges) }.map(Some)
        };
        self.post_all_then_wait(ops, post, on_recv)
    }
}

/// Settles every channel a multi-peer call posted on, whichever way the call ends. Until
/// [`Settle::wait_all`] runs, the call may still unwind (the caller's iterator or callback
/// panicked): then dropping the guard flushes the channels with work in flight at once.
struct Settle<'m, P: Provider, B: Backoff + Clone, const R: usize> {
    chans: &'m mut [Channel<P, B, R>],
    index: &'m [u32],
    rank_at: &'m [u32],
    /// The last ticket the call posted on each channel.
    last: &'m mut [Option<Ticket>],
    unwinding: bool,
}

impl<'m, P: Provider, B: Backoff + Clone, const R: usize> Settle<'m, P, B, R> {
    fn new(
        chans: &'m mut [Channel<P, B, R>],
        (index, rank_at): (&'m [u32], &'m [u32]),
        last: &'m mut [Option<Ticket>],
    ) -> Self {
        last.fill(None);
        Self {
            chans,
            index,
            rank_at,
            last,
            unwinding: true,
        }
    }

    fn channel(&mut self, rank: u32) -> Option<(&mut Channel<P, B, R>, &mut Option<Ticket>)> {
        match self.index.get(rank as usize) {
            Some(&i) if i != NONE => {
                let i = i as usize;
                Some((self.chans.get_mut(i)?, self.last.get_mut(i)?))
            }
            _ => None,
        }
    }

    /// The normal exit: waits (at most each channel's timeout) for the last ticket the call
    /// posted on each channel, hands each completion to `on_done` with its rank, and reports
    /// the first failure.
    fn wait_all(&mut self, mut on_done: impl FnMut(u32, Done)) -> Result<(), MultiError> {
        let mut first = None;
        for ((c, last), &rank) in self
            .chans
            .iter_mut()
            .zip(self.last.iter_mut())
            .zip(self.rank_at)
        {
            if let Some(t) = *last {
                // Forgotten only after the wait returned: a wait that unwinds (a panic in the
                // caller's back-off or clock) leaves the ticket for `Drop` to settle.
                let r = c.wait(t);
                *last = None;
                match r {
                    Ok(done) => on_done(rank, done),
                    Err(error) => {
                        first.get_or_insert(MultiError::Peer(PeerError { rank, error }));
                    }
                }
            }
        }
        self.unwinding = false;
        first.map_or(Ok(()), Err)
    }
}

impl<P: Provider, B: Backoff + Clone, const R: usize> Drop for Settle<'_, P, B, R> {
    fn drop(&mut self) {
        // Every ticket still here was not waited for to the end (the call is unwinding):
        // flush its channel at once.
        for (c, last) in self.chans.iter_mut().zip(self.last.iter()) {
            if last.is_some() {
                c.settle(self.unwinding);
            }
        }
    }
}
