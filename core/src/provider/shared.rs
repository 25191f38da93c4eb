//! One send and one receive completion queue shared by many queue pairs (a node's), with
//! completions routed to their queue pair by number in O(1).
//!
//! [`SharedCqs`] owns the two queues and a mailbox per queue pair; [`RoutedQp`] is a queue
//! pair on them that is a full [`Provider`], so a [`Channel`](crate::channel::Channel) runs on
//! it unchanged. Polling a `RoutedQp` first empties its own mailbox; only when that is empty
//! does it poll the shared queue (until it is seen empty: see `State::poll_into_mailboxes`),
//! keeping its own completions and dropping the others' into their mailboxes (each such
//! queue pair then goes on a ready list). A layer that serves many
//! queue pairs ([`MultiChannel::poll_ready`](crate::multi::MultiChannel::poll_ready)) polls
//! the shared queues once through [`Provider::poll_shared_with`] and serves only the queue
//! pairs on the ready list: an idle poll is one poll of each queue, whatever the number of
//! peers. It also takes the completions of its own channels straight from the poll (those of
//! a queue pair with nothing of their kind in its mailbox), and hands them to the channels
//! itself: no copy into a mailbox and out again, one take of the shared state per poll.
//!
//! With a shared receive queue ([`SharedCqs::with_srq`]) the queue pairs have no receives of
//! their own: every receive completion is one of the shared queue's, kept in arrival order
//! for [`Provider::poll_srq`] rather than routed (its `qp_num` still names the queue pair it
//! arrived on).
//!
//! # Capacity
//! Mailboxes are sized to their queue pair's queues and the completion queues to the sum, so
//! neither can overflow while every queue pair keeps at most its queue depth in flight (the
//! engine does; a send mailbox has one more entry for the drain request of a flush). If a
//! mailbox ever is full, that queue pair's polls fail with `EOVERFLOW` from then on rather
//! than lose a completion silently; the other queue pairs go on.
//!
//! All channels of one [`MultiChannel`](crate::multi::MultiChannel) must share one
//! `SharedCqs` (or none): its `poll_ready` polls the queues of the first channel's.
//!
//! # Threads
//! The queue pairs of one `SharedCqs` may move to different threads (each is `Send` if its
//! parts are). The shared state is behind a try-lock: a poll that finds it taken by another
//! thread returns no completions rather than wait (that thread routes them to the mailboxes).

use alloc::sync::Arc;
use alloc::vec;
use alloc::vec::Vec;
use core::cell::UnsafeCell;
use core::fmt;
use core::sync::atomic::{AtomicBool, Ordering};

use crate::completion::Completion;
use crate::fifo::Fifo;
use crate::params::QpCaps;
use crate::provider::{CompletionQueue, Provider, ProviderError, QueuePair, Verb};
use crate::verb::errno::EOVERFLOW;
use crate::wr::{PostFailure, RecvRequest, WorkRequest};

/// Completions taken from a shared queue per poll.
const POLL_BATCH: usize = 32;

/// Queue-pair number -> mailbox index: open addressing, linear probing, built at setup.
/// Each entry holds its key and value side by side, so a lookup's hit is one bounds check
/// and one load of the pair.
#[derive(Debug)]
pub(crate) struct QpTable {
    /// `(queue-pair number, value)`; `EMPTY_KEY` marks a free entry.
    entries: Vec<(u32, u32)>,
    mask: usize,
}

const EMPTY_KEY: u32 = u32::MAX;

impl QpTable {
    pub(crate) fn new(entries: usize) -> Self {
        let cap = (entries * 2).next_power_of_two().max(2);
        Self {
            entries: vec![(EMPTY_KEY, 0); cap],
            mask: cap - 1,
        }
    }

    #[inline(always)]
    fn home(&self, qpn: u32) -> usize {
        (qpn.wrapping_mul(0x9e37_79b1) as usize) & self.mask
    }

    /// Adds `qpn -> val`; false if the number is already there (or the table is full, or
    /// the number is the empty marker, which no 24-bit queue-pair number is).
    pub(crate) fn insert(&mut self, qpn: u32, val: u32) -> bool {
        if qpn == EMPTY_KEY {
            return false;
        }
        let mut i = self.home(qpn);
        for _ in 0..=self.mask {
            let e = &mut self.entries[i];
            if e.0 == qpn {
                return false;
            }
            if e.0 == EMPTY_KEY {
                *e = (qpn, val);
                return true;
            }
            i = (i + 1) & self.mask;
        }
        false
    }

    /// Removes `qpn`; its value, or `None` if it was not there. Entries after it in its
    /// probe run move back (no tombstones), so lookups stay as short as before.
    pub(crate) fn remove(&mut self, qpn: u32) -> Option<u32> {
        let mut hole = self.slot_of(qpn)?;
        let val = self.entries[hole].1;
        let mut j = hole;
        loop {
            j = (j + 1) & self.mask;
            let key = self.entries[j].0;
            if key == EMPTY_KEY {
                break;
            }
            // An entry whose home lies cyclically in (hole, j] is still reachable; any
            // other one would be cut off by the hole and moves into it.
            let home = self.home(key);
            let reachable = if hole <= j {
                hole < home && home <= j
            } else {
                hole < home || home <= j
            };
            if !reachable {
                self.entries[hole] = self.entries[j];
                hole = j;
            }
        }
        self.entries[hole].0 = EMPTY_KEY;
        Some(val)
    }

    /// Where `qpn` is stored. At most one probe per entry (a full table of other numbers
    /// ends the search), counted down rather than by a range: the hit on the first probe,
    /// the common case, is a load, a compare and a branch.
    #[inline]
    fn slot_of(&self, qpn: u32) -> Option<usize> {
        if qpn == EMPTY_KEY {
            return None;
        }
        let mut i = self.home(qpn);
        let mut left = self.mask;
        loop {
            let key = self.entries.get(i)?.0;
            if key == qpn {
                return Some(i);
            }
            if key == EMPTY_KEY || left == 0 {
                return None;
            }
            left -= 1;
            i = (i + 1) & self.mask;
        }
    }

    #[inline]
    pub(crate) fn get(&self, qpn: u32) -> Option<u32> {
        if qpn == EMPTY_KEY {
            return None;
        }
        let mut i = self.home(qpn);
        let mut left = self.mask;
        loop {
            let (key, val) = *self.entries.get(i)?;
            if key == qpn {
                return Some(val);
            }
            if key == EMPTY_KEY || left == 0 {
                return None;
            }
            left -= 1;
            i = (i + 1) & self.mask;
        }
    }
}

/// A queue pair's completions of one kind, oldest first.
type Mailbox = Fifo<Completion>;

/// A mailbox of `cap` completions, at least one (as the mailboxes always had: `add` and
/// `replace_qp` check capacities, and report them, from the mailboxes' own).
fn mailbox(cap: u32) -> Mailbox {
    Fifo::new(cap.max(1) as usize, Completion::EMPTY)
}

struct Slot {
    send: Mailbox,
    recv: Mailbox,
    qp_num: u32,
    /// On the ready list.
    queued: bool,
    /// Named ready by [`Provider::poll_shared`] just now, which polled both shared queues
    /// until it saw them empty, to a caller that polls this queue pair (both kinds) right
    /// away, before anyone else can (`MultiChannel::poll_ready`, which holds the channel
    /// mutably): that next take of each kind does not poll the shared queues again. The
    /// skipped poll is the one that would find a queue just seen empty; a completion
    /// arriving in between waits for the next poll, as it would one instant later. A waiter
    /// that arms completion events polls after arming with a take of its own, which these
    /// flags never skip: they were spent inside the `poll_ready` that set them.
    fresh: [bool; 2],
    /// A completion for this queue pair found its mailbox full (cannot happen while the
    /// queue pair keeps its depth; if it does, this queue pair's polls fail from then on).
    overflowed: bool,
}

struct State<C> {
    send_cq: C,
    recv_cq: C,
    /// Where a poll of a shared queue lands when its queue cannot hand each completion over
    /// as it reads it ([`CompletionQueue::poll_each`]'s default), kept across polls (an
    /// empty poll then writes nothing).
    scratch: [Completion; POLL_BATCH],
    /// Where completions go: apart from the queues, so a queue can be polled while each
    /// completion it reads is routed.
    routes: Routes,
}

/// The routing: which queue pair a number names, their mailboxes, the ready list.
struct Routes {
    table: QpTable,
    slots: Vec<Slot>,
    /// Slots with completions in their mailboxes, oldest first (each at most once).
    ready: Fifo<u32>,
    /// With a shared receive queue: every receive completion, in arrival order (the queue
    /// pairs have no receives of their own), and whether one found it full.
    pool: Option<(Mailbox, bool)>,
}

impl Routes {
    /// Moves a completion into its queue pair's mailbox (unknown numbers are not ours:
    /// dropped), unless `take` takes it: it is offered only when nothing of that queue pair's
    /// kind waits in the mailbox (so a queue pair's completions of one kind still come out in
    /// the order they were polled) and the mailbox never overflowed. Out of line: inlined
    /// into the loop over a poll's completions, the loads it hoists out of the loop cost
    /// more than the call for the one or two completions a poll usually takes.
    /// One instance per queue (`RECV`), so neither tests which it serves.
    #[inline(never)]
    fn route<const RECV: bool, T: FnMut(usize, bool, &Completion) -> bool>(
        &mut self,
        c: &Completion,
        take: &mut T,
    ) {
        let recv = RECV;
        if let (true, Some((pool, overflowed))) = (recv, &mut self.pool) {
            if self.table.get(c.qp_num).is_some() && pool.push(*c).is_err() {
                *overflowed = true;
            }
            return;
        }
        let Some(i) = self.table.get(c.qp_num) else {
            return;
        };
        let slot = &mut self.slots[i as usize];
        let mbox = if recv { &mut slot.recv } else { &mut slot.send };
        if mbox.is_empty() && !slot.overflowed {
            // A caller's `take` that panics must not lose the completion (it may be another
            // queue pair's): it goes to its mailbox on the way out, as if refused.
            let keep = MailOnUnwind(self, i as usize, recv, c);
            let taken = take(i as usize, recv, c);
            core::mem::forget(keep);
            if taken {
                return;
            }
        }
        self.put_in_mailbox(i as usize, recv, c);
    }

    /// [`Routes::route`] for a completion not taken: into slot `i`'s mailbox, and the slot
    /// onto the ready list. Out of line, so the hand-over path keeps its registers.
    #[inline(never)]
    fn put_in_mailbox(&mut self, i: usize, recv: bool, c: &Completion) {
        let Some(slot) = self.slots.get_mut(i) else {
            return;
        };
        let mbox = if recv { &mut slot.recv } else { &mut slot.send };
        if mbox.push(*c).is_err() {
            slot.overflowed = true;
        }
        self.enqueue(i);
    }

    /// Puts slot `i` on the ready list unless it is there.
    fn enqueue(&mut self, i: usize) {
        let slot = &mut self.slots[i];
        if !slot.queued {
            slot.queued = true;
            // The list holds every slot at most once and has room for all of them.
            let _ = self.ready.push(i as u32);
        }
    }
}

/// Puts a completion offered to a `take` into its mailbox when dropped: armed around the
/// `take` and forgotten when it returns, so only a panic drops it.
struct MailOnUnwind<'a>(&'a mut Routes, usize, bool, &'a Completion);

impl Drop for MailOnUnwind<'_> {
    fn drop(&mut self) {
        self.0.put_in_mailbox(self.1, self.2, self.3);
    }
}

impl<C: CompletionQueue> State<C> {
    /// Whether `qp` completes into these queues, as far as the providers can tell (a
    /// provider that cannot name its queues is taken at its word).
    fn completes_here<Q: QueuePair>(&self, qp: &Q) -> bool {
        match (qp.completion_queues(), self.send_cq.id(), self.recv_cq.id()) {
            (Some(q), Some(s), Some(r)) => q == [s, r],
            _ => true,
        }
    }

    /// Polls one shared queue until a poll comes back short of a full batch (the queue was
    /// seen empty), routing everything into mailboxes; returns how many it took.
    ///
    /// Why not one batch: a caller that finds nothing of its own takes the poll for an
    /// empty queue, and a waiter sleeping on completion events then arms the queue and
    /// sleeps. A completion that arrived before the arm raises no event, so if it still
    /// sat in the queue behind a full batch of other queue pairs' completions, the sleep
    /// would last until its deadline. Bounded: at most one batch more than the queue holds,
    /// so completions arriving as fast as they are taken cannot keep the caller here.
    #[inline(always)]
    fn poll_into_mailboxes(&mut self, recv: bool) -> Result<usize, ProviderError> {
        self.poll_routed(recv, &mut |_, _, _| false)
    }

    /// [`State::poll_into_mailboxes`], offering each completion to `take` first (see
    /// [`Routes::route`]).
    #[inline(always)]
    fn poll_routed<T: FnMut(usize, bool, &Completion) -> bool>(
        &mut self,
        recv: bool,
        take: &mut T,
    ) -> Result<usize, ProviderError> {
        let n = self.poll_batch(recv, take)?;
        if n < POLL_BATCH {
            return Ok(n);
        }
        self.poll_rest(recv, n, take)
    }

    /// One poll of a shared queue, routed: how many it took. Each completion is routed as
    /// the queue reads it ([`CompletionQueue::poll_each`]: on a device, while the queue is
    /// positioned on it, with no array written and read back). `take` runs inside the
    /// device's poll batch: it cannot poll these queues (their state is held), and should it
    /// panic the batch is ended on the way out; rverbs' own `take`s (the multi-channel's
    /// hand-over, the node's claim) run no user code.
    #[inline(always)]
    fn poll_batch<T: FnMut(usize, bool, &Completion) -> bool>(
        &mut self,
        recv: bool,
        take: &mut T,
    ) -> Result<usize, ProviderError> {
        let (cq, routes) = if recv {
            (&mut self.recv_cq, &mut self.routes)
        } else {
            (&mut self.send_cq, &mut self.routes)
        };
        // Passed by value, so an empty poll builds nothing of it.
        let n = if recv {
            cq.poll_each(&mut self.scratch, move |c: &Completion| {
                routes.route::<true, T>(c, take)
            })?
        } else {
            cq.poll_each(&mut self.scratch, move |c: &Completion| {
                routes.route::<false, T>(c, take)
            })?
        };
        Ok(n.min(POLL_BATCH))
    }

    /// [`State::poll_routed`] after a first poll took a full batch (`total`): the rare
    /// case, out of the idle path.
    #[cold]
    #[inline(never)]
    fn poll_rest<T: FnMut(usize, bool, &Completion) -> bool>(
        &mut self,
        recv: bool,
        mut total: usize,
        take: &mut T,
    ) -> Result<usize, ProviderError> {
        let capacity = if recv {
            self.recv_cq.capacity()
        } else {
            self.send_cq.capacity()
        };
        // One poll was made; `capacity / POLL_BATCH + 1` in all.
        for _ in 0..capacity as usize / POLL_BATCH {
            let n = self.poll_batch(recv, take)?;
            total += n;
            if n < POLL_BATCH {
                break;
            }
        }
        Ok(total)
    }

    /// Empties the ready list, calling `ready(qp_num)` for each queue pair on it (oldest
    /// first) and marking those its caller polls at once as fresh: out of line, so an idle
    /// poll pays only for the list's length test.
    #[inline(never)]
    fn name_ready(&mut self, ready: &mut dyn FnMut(u32) -> bool) {
        while let Some(i) = self.routes.ready.pop() {
            let s = &mut self.routes.slots[i as usize];
            s.queued = false;
            s.fresh = [ready(s.qp_num); 2];
        }
    }

    /// Takes `slot`'s completions of one kind into `out`; polls the shared queue first when
    /// the mailbox is empty.
    fn take(
        &mut self,
        slot: usize,
        recv: bool,
        out: &mut [Completion],
    ) -> Result<usize, ProviderError> {
        let empty = |s: &Slot| {
            if recv {
                s.recv.is_empty()
            } else {
                s.send.is_empty()
            }
        };
        let fresh = core::mem::take(&mut self.routes.slots[slot].fresh[usize::from(recv)]);
        if empty(&self.routes.slots[slot]) && !fresh {
            self.poll_into_mailboxes(recv)?;
        }
        if self.routes.slots[slot].overflowed {
            return Err(ProviderError {
                verb: Verb::PollCq,
                errno: EOVERFLOW,
            });
        }
        let s = &mut self.routes.slots[slot];
        let mbox = if recv { &mut s.recv } else { &mut s.send };
        let n = mbox.pop_into(out);
        if !(s.send.is_empty() && s.recv.is_empty()) {
            // More than `out` held: whoever serves the ready list comes back for the rest.
            self.routes.enqueue(slot);
        }
        Ok(n)
    }

    /// Takes receive completions of the shared receive queue into `out`; polls the receive
    /// queue first when none is waiting.
    fn take_pool(&mut self, out: &mut [Completion]) -> Result<usize, ProviderError> {
        if self.routes.pool.as_ref().is_some_and(|(p, _)| p.is_empty()) {
            self.poll_into_mailboxes(true)?;
        }
        let Some((pool, overflowed)) = &mut self.routes.pool else {
            return Ok(0);
        };
        if *overflowed {
            return Err(ProviderError {
                verb: Verb::PollCq,
                errno: EOVERFLOW,
            });
        }
        Ok(pool.pop_into(out))
    }
}

struct Inner<C> {
    busy: AtomicBool,
    state: UnsafeCell<State<C>>,
}

// SAFETY: the state is reached only under the `busy` try-lock (see `with`), so at most one
// thread touches it at a time; it holds the completion queues, which must be `Send`.
unsafe impl<C: Send> Sync for Inner<C> {}
// SAFETY: as above; moving the `Arc` between threads moves no access with it.
unsafe impl<C: Send> Send for Inner<C> {}

impl<C> Inner<C> {
    /// The state, if no other thread holds it (`None` if one does), until the guard drops.
    #[inline(always)]
    fn try_lock(&self) -> Option<Locked<'_, C>> {
        if self
            .busy
            .compare_exchange(false, true, Ordering::Acquire, Ordering::Relaxed)
            .is_err()
        {
            return None;
        }
        Some(Locked(self))
    }

    /// Runs `f` on the state if no other thread holds it; `None` if one does.
    fn with<T>(&self, f: impl FnOnce(&mut State<C>) -> T) -> Option<T> {
        let mut st = self.try_lock()?;
        Some(f(&mut st))
    }
}

/// The shared state, held: the try-lock is released when this drops (a panic included).
struct Locked<'a, C>(&'a Inner<C>);

impl<C> core::ops::Deref for Locked<'_, C> {
    type Target = State<C>;
    #[inline(always)]
    fn deref(&self) -> &State<C> {
        // SAFETY: this guard holds the try-lock (taken in `try_lock`, released only in its
        // `drop`), so no other reference to the state exists while it lives.
        unsafe { &*self.0.state.get() }
    }
}

impl<C> core::ops::DerefMut for Locked<'_, C> {
    #[inline(always)]
    fn deref_mut(&mut self) -> &mut State<C> {
        // SAFETY: as in `deref`; `&mut self` makes this the only reference made through
        // the guard.
        unsafe { &mut *self.0.state.get() }
    }
}

impl<C> Drop for Locked<'_, C> {
    #[inline(always)]
    fn drop(&mut self) {
        self.0.busy.store(false, Ordering::Release);
    }
}

/// Two completion queues shared by many queue pairs. See the [module docs](self).
pub struct SharedCqs<C: CompletionQueue> {
    inner: Arc<Inner<C>>,
}

impl<C: CompletionQueue> fmt::Debug for SharedCqs<C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SharedCqs").finish_non_exhaustive()
    }
}

/// Why a queue pair could not be added to a [`SharedCqs`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum SharedCqError {
    /// Another queue pair with this number is already routed here.
    DuplicateQpNum(u32),
    /// The queue pairs added so far would need more entries than the completion queues
    /// hold.
    TooSmall {
        /// Entries the queue pairs need.
        needed: u64,
        /// Entries the completion queue holds.
        capacity: u32,
    },
    /// More queue pairs than the table was built for.
    Full,
    /// Queues built [`with_srq`](SharedCqs::with_srq) take only queue pairs on a shared
    /// receive queue no deeper than they were built for.
    NotOnTheSrq,
    /// Another thread was polling the shared queues at that moment; nothing was changed.
    Busy,
    /// The queue pair completes into other completion queues than these (its completions
    /// would never reach its mailboxes).
    ForeignQueues,
}

impl fmt::Display for SharedCqError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::DuplicateQpNum(n) => write!(f, "queue pair {n} is already routed here"),
            Self::TooSmall { needed, capacity } => write!(
                f,
                "the queue pairs need {needed} completion entries, the queue holds {capacity}"
            ),
            Self::Full => f.write_str("more queue pairs than the shared queues were built for"),
            Self::NotOnTheSrq => f.write_str(
                "the queue pair is not on a shared receive queue these completion queues were built for",
            ),
            Self::Busy => f.write_str("another thread was polling the shared completion queues"),
            Self::ForeignQueues => f.write_str(
                "the queue pair completes into other completion queues than the shared ones",
            ),
        }
    }
}

impl core::error::Error for SharedCqError {}

impl<C: CompletionQueue> SharedCqs<C> {
    /// Shares `send_cq` and `recv_cq` among at most `max_qps` queue pairs. Allocates.
    pub fn new(send_cq: C, recv_cq: C, max_qps: usize) -> Self {
        Self::build(send_cq, recv_cq, max_qps, None)
    }

    /// Shares `send_cq` and `recv_cq` among at most `max_qps` queue pairs that all take
    /// their receives from one shared receive queue of `slots` receives: receive
    /// completions are not routed to the queue pairs but kept in arrival order for
    /// [`Provider::poll_srq`] (of any of them). `recv_cq` must hold `slots` completions.
    /// Allocates.
    pub fn with_srq(send_cq: C, recv_cq: C, max_qps: usize, slots: u32) -> Self {
        Self::build(send_cq, recv_cq, max_qps, Some((mailbox(slots), false)))
    }

    fn build(send_cq: C, recv_cq: C, max_qps: usize, pool: Option<(Mailbox, bool)>) -> Self {
        Self {
            inner: Arc::new(Inner {
                busy: AtomicBool::new(false),
                state: UnsafeCell::new(State {
                    send_cq,
                    recv_cq,
                    scratch: [Completion::EMPTY; POLL_BATCH],
                    routes: Routes {
                        table: QpTable::new(max_qps),
                        slots: Vec::with_capacity(max_qps),
                        ready: Fifo::new(max_qps, 0),
                        pool,
                    },
                }),
            }),
        }
    }

    /// Routes `qp`'s completions (its queues must complete into this object's CQs: refused
    /// with [`SharedCqError::ForeignQueues`] otherwise, where the providers can tell) and
    /// returns it as a [`Provider`] whose queue depths are at most an equal share of the
    /// CQs (capacity / `max_qps`), so that all of them together cannot overflow the CQs even
    /// if the device granted deeper queues than asked for. Allocates (its mailboxes).
    pub fn add<Q: QueuePair>(&self, qp: Q) -> Result<RoutedQp<Q, C>, (Q, SharedCqError)> {
        let mut caps = qp.caps();
        let qpn = qp.qp_num();
        let r = self.inner.with(|st| {
            if !st.completes_here(&qp) {
                return Err(SharedCqError::ForeignQueues);
            }
            // A send queue keeps one entry for the drain request a flush posts, which also
            // completes here: a share of `cap` entries allows `cap - 1` requests.
            let share = |cap: u32| cap / (st.routes.slots.capacity().max(1) as u32);
            caps.max_send_wr = caps
                .max_send_wr
                .min(share(st.send_cq.capacity()).saturating_sub(1));
            let pooled = st.routes.pool.is_some();
            if let Some((pool, _)) = &st.routes.pool {
                // Receives come from the shared queue only; its completions fit the CQ.
                caps.max_recv_wr = 0;
                let (needed, capacity) = (pool.capacity() as u64, st.recv_cq.capacity());
                if qp.srq_capacity() == 0 || u64::from(qp.srq_capacity()) > needed {
                    return Err(SharedCqError::NotOnTheSrq);
                }
                if needed > u64::from(capacity) {
                    return Err(SharedCqError::TooSmall { needed, capacity });
                }
            } else {
                caps.max_recv_wr = caps.max_recv_wr.min(share(st.recv_cq.capacity()));
            }
            if caps.max_send_wr < 2 || (caps.max_recv_wr < 1 && !pooled) {
                return Err(SharedCqError::TooSmall {
                    needed: 3 * st.routes.slots.capacity() as u64,
                    capacity: st.send_cq.capacity().min(st.recv_cq.capacity()),
                });
            }
            if st.routes.slots.len() == st.routes.slots.capacity() {
                return Err(SharedCqError::Full);
            }
            let (mut send, mut recv) = (u64::from(caps.max_send_wr), u64::from(caps.max_recv_wr));
            for s in &st.routes.slots {
                send += s.send.capacity() as u64;
                recv += s.recv.capacity() as u64;
            }
            for (needed, capacity) in [(send, st.send_cq.capacity()), (recv, st.recv_cq.capacity())]
            {
                if needed > u64::from(capacity) {
                    return Err(SharedCqError::TooSmall { needed, capacity });
                }
            }
            let i = st.routes.slots.len() as u32;
            if !st.routes.table.insert(qpn, i) {
                return Err(SharedCqError::DuplicateQpNum(qpn));
            }
            st.routes.slots.push(Slot {
                // The drain request's completion on top of the queue's depth.
                send: mailbox(caps.max_send_wr + 1),
                recv: mailbox(caps.max_recv_wr),
                qp_num: qpn,
                queued: false,
                fresh: [false; 2],
                overflowed: false,
            });
            Ok(i as usize)
        });
        match r {
            Some(Ok(slot)) => Ok(RoutedQp {
                qp,
                caps,
                slot,
                shared: Arc::clone(&self.inner),
            }),
            Some(Err(e)) => Err((qp, e)),
            None => Err((qp, SharedCqError::Busy)),
        }
    }
}

/// A queue pair whose completions go to [`SharedCqs`]: a [`Provider`] like one with its own
/// queues. Field order is drop order: the queue pair goes before the shared queues it uses.
pub struct RoutedQp<Q: QueuePair, C: CompletionQueue> {
    qp: Q,
    /// The queue pair's caps, clamped to its share of the completion queues.
    caps: QpCaps,
    slot: usize,
    shared: Arc<Inner<C>>,
}

impl<Q: QueuePair + fmt::Debug, C: CompletionQueue> fmt::Debug for RoutedQp<Q, C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RoutedQp")
            .field("qp", &self.qp)
            .field("slot", &self.slot)
            .finish()
    }
}

impl<Q: QueuePair, C: CompletionQueue> RoutedQp<Q, C> {
    /// The queue pair.
    pub fn qp(&self) -> &Q {
        &self.qp
    }

    /// Lends `f` the two shared completion queues (send, receive), to create another queue
    /// pair on them (see [`RoutedQp::replace_qp`]). `None` if another thread was polling them
    /// at that moment.
    pub fn with_cqs<T>(&self, f: impl FnOnce(&C, &C) -> T) -> Option<T> {
        self.shared.with(|st| f(&st.send_cq, &st.recv_cq))
    }

    /// Puts `qp` (its queues completing into these completion queues, else
    /// [`SharedCqError::ForeignQueues`]) in the place of the
    /// queue pair routed here, and returns the old one: the slot, its mailboxes and its
    /// share of the queues stay, its queue-pair number changes. `qp`'s caps are clamped to
    /// the slot's share. For a peer that restarted: see
    /// [`Node::readmit_finish`](crate::node::Node::readmit_finish).
    ///
    /// The old queue pair must have nothing in flight (everything it posted completed and
    /// polled, or flushed and drained): its completions still waiting here are dropped, and
    /// any that arrive later are no longer routed to anyone. Allocates nothing.
    pub fn replace_qp(&mut self, qp: Q) -> Result<Q, (Q, SharedCqError)> {
        let (slot, new) = (self.slot, qp.qp_num());
        let mut caps = qp.caps();
        let r = self.shared.with(|st| {
            if !st.completes_here(&qp) {
                return Err(SharedCqError::ForeignQueues);
            }
            let pooled = st.routes.pool.is_some();
            let srq = qp.srq_capacity() as usize;
            if st
                .routes
                .pool
                .as_ref()
                .is_some_and(|(p, _)| srq == 0 || srq > p.capacity())
            {
                return Err(SharedCqError::NotOnTheSrq);
            }
            if st.routes.table.get(new).is_some() {
                return Err(SharedCqError::DuplicateQpNum(new));
            }
            let s = &st.routes.slots[slot];
            // The mailboxes were sized for the old queue pair's share: the new one gets no
            // more (one send entry stays for a flush's drain request).
            caps.max_send_wr = caps
                .max_send_wr
                .min((s.send.capacity() as u32).saturating_sub(1));
            caps.max_recv_wr = if pooled {
                0
            } else {
                caps.max_recv_wr.min(s.recv.capacity() as u32)
            };
            if caps.max_send_wr < 2 || (caps.max_recv_wr < 1 && !pooled) {
                return Err(SharedCqError::TooSmall {
                    needed: 3,
                    capacity: s.send.capacity().min(s.recv.capacity()) as u32,
                });
            }
            let old = s.qp_num;
            st.routes.table.remove(old);
            // The old number is gone and the new one was not there: there is room.
            st.routes.table.insert(new, slot as u32);
            let s = &mut st.routes.slots[slot];
            s.qp_num = new;
            s.send.clear();
            s.recv.clear();
            s.overflowed = false;
            s.fresh = [false; 2];
            Ok(())
        });
        match r {
            Some(Ok(())) => {
                self.caps = caps;
                Ok(core::mem::replace(&mut self.qp, qp))
            }
            Some(Err(e)) => Err((qp, e)),
            None => Err((qp, SharedCqError::Busy)),
        }
    }
}

impl<Q: QueuePair, C: CompletionQueue> QueuePair for RoutedQp<Q, C> {
    #[inline]
    fn caps(&self) -> QpCaps {
        self.caps
    }
    #[inline]
    fn qp_num(&self) -> u32 {
        self.qp.qp_num()
    }
    #[inline(always)]
    unsafe fn post_send(&mut self, wrs: &[WorkRequest<'_>]) -> Result<(), PostFailure> {
        // SAFETY: forwarded contract.
        unsafe { self.qp.post_send(wrs) }
    }
    #[inline(always)]
    unsafe fn send_list(&mut self) -> Option<crate::provider::SendList> {
        // SAFETY: forwarded contract: the list is that of the queue pair this wrapper owns
        // and posts to, whose completions it reports (routed from the shared queues by its
        // number, exactly as those of a request posted through `post_send`).
        unsafe { self.qp.send_list() }
    }
    #[inline(always)]
    unsafe fn post_recv(&mut self, wrs: &[RecvRequest<'_>]) -> Result<(), PostFailure> {
        // SAFETY: forwarded contract.
        unsafe { self.qp.post_recv(wrs) }
    }
    fn set_error(&mut self) -> Result<(), ProviderError> {
        self.qp.set_error()
    }
    #[inline]
    fn srq_capacity(&self) -> u32 {
        self.qp.srq_capacity()
    }
    #[inline]
    unsafe fn post_srq_recv(&mut self, wrs: &[RecvRequest<'_>]) -> Result<(), PostFailure> {
        // SAFETY: forwarded contract.
        unsafe { self.qp.post_srq_recv(wrs) }
    }
    fn srq_probe(&self) -> Option<crate::memory::SrqProbe> {
        self.qp.srq_probe()
    }
    fn arm_srq_limit(&mut self, limit: u32) -> Result<(), ProviderError> {
        self.qp.arm_srq_limit(limit)
    }
    fn completion_queues(&self) -> Option<[crate::provider::CqId; 2]> {
        self.qp.completion_queues()
    }
}

impl<Q: QueuePair, C: CompletionQueue> Provider for RoutedQp<Q, C> {
    #[inline]
    fn shared_slot(&self) -> Option<usize> {
        Some(self.slot)
    }

    /// This queue pair's send completions: its mailbox, else the shared queue polled until
    /// it is seen empty (so `Ok(0)` means no completion of it was waiting). Does not
    /// allocate.
    fn poll_send(&mut self, out: &mut [Completion]) -> Result<usize, ProviderError> {
        let slot = self.slot;
        self.shared
            .with(|st| st.take(slot, false, out))
            .unwrap_or(Ok(0))
    }

    /// This queue pair's receive completions: its mailbox, else the shared queue polled
    /// until it is seen empty (so `Ok(0)` means no completion of it was waiting). Does not
    /// allocate.
    fn poll_recv(&mut self, out: &mut [Completion]) -> Result<usize, ProviderError> {
        let slot = self.slot;
        self.shared
            .with(|st| st.take(slot, true, out))
            .unwrap_or(Ok(0))
    }

    /// Polls both shared queues until each is seen empty and names every queue pair with
    /// completions waiting in its mailbox (each once, oldest first). Does not allocate.
    ///
    /// Inlined whole into its caller: when nothing arrived (an idle `progress`) this is the
    /// try-lock, one `start_poll` per queue and a test of the ready list; routing, naming
    /// and the drain of full batches are out of line.
    #[inline(always)]
    fn poll_shared(
        &mut self,
        ready: &mut dyn FnMut(u32) -> bool,
    ) -> Result<Option<usize>, ProviderError> {
        self.poll_shared_with(&mut |_, _, _| false, ready)
    }

    /// [`Provider::poll_shared`], handing each completion whose queue pair has nothing of its
    /// kind waiting to `take` first: a caller that owns the queue pair delivers it to its
    /// channel directly, with no copy into the mailbox and out again, and no take of the
    /// shared state per queue pair and kind. One take of the try-lock for the whole poll.
    /// Does not allocate.
    ///
    /// Inlined whole into its caller, as `poll_shared`: when nothing arrived this is the
    /// try-lock, one `start_poll` per queue and a test of the ready list.
    #[inline(always)]
    fn poll_shared_with<T: FnMut(usize, bool, &Completion) -> bool>(
        &mut self,
        take: &mut T,
        ready: &mut dyn FnMut(u32) -> bool,
    ) -> Result<Option<usize>, ProviderError> {
        let Some(mut st) = self.shared.try_lock() else {
            return Ok(Some(0));
        };
        let n = st.poll_routed(false, take)? + st.poll_routed(true, take)?;
        if !st.routes.ready.is_empty() {
            st.name_ready(ready);
        }
        Ok(Some(n))
    }

    /// Receive completions of the shared receive queue, whichever queue pair they arrived
    /// on, oldest first; polls the shared receive queue until it is seen empty when none
    /// waits. Does not allocate.
    fn poll_srq(&mut self, out: &mut [Completion]) -> Result<usize, ProviderError> {
        self.shared.with(|st| st.take_pool(out)).unwrap_or(Ok(0))
    }
}

#[cfg(test)]
mod tests {
    use super::QpTable;

    #[test]
    fn the_table_finds_every_number_it_was_given_and_no_other() {
        let mut t = QpTable::new(300);
        for i in 0..300u32 {
            // Numbers that collide in the low bits, as QP numbers of one device do.
            assert!(t.insert(0x11 + i * 1024, i));
        }
        assert!(!t.insert(0x11, 7), "a number routes to one queue pair");
        for i in 0..300u32 {
            assert_eq!(t.get(0x11 + i * 1024), Some(i));
        }
        assert_eq!(t.get(0x12), None);
        assert_eq!(t.get(u32::MAX - 1), None);
        // The empty marker is never a key.
        assert!(!t.insert(u32::MAX, 1));
        assert_eq!(t.get(u32::MAX), None);
    }

    #[test]
    fn removing_keeps_every_other_number_reachable() {
        let mut t = QpTable::new(64);
        // Colliding numbers build long probe runs that wrap around the table's end.
        let n: [u32; 64] = core::array::from_fn(|i| 0x11 + i as u32 * 4096);
        for (i, &q) in n.iter().enumerate() {
            assert!(t.insert(q, i as u32));
        }
        for (k, &gone) in n.iter().enumerate().filter(|(k, _)| k % 3 == 1) {
            assert_eq!(t.remove(gone), Some(k as u32));
            assert_eq!(t.remove(gone), None);
        }
        for (i, &q) in n.iter().enumerate() {
            let want = (i % 3 != 1).then_some(i as u32);
            assert_eq!(t.get(q), want, "number {q:#x}");
        }
        // A removed number can come back, with another value.
        assert!(t.insert(n[1], 99));
        assert_eq!(t.get(n[1]), Some(99));
        assert_eq!(t.remove(0x12), None);
    }
}
