//! Receive rings: receives that stay posted across calls (see [`RecvRing`]).

use core::fmt;
use core::mem::ManuallyDrop;

use super::{Channel, ChannelError, Done};
use crate::memory::{AccessFlags, Region};
use crate::poll::{Backoff, Deadline, Spin};
use crate::provider::Provider;
use crate::sge::Sge;

/// A channel with a ring of receives posted in memory the ring owns.
///
/// [`RecvRing`]: receives that stay posted across calls, in memory the ring owns, so a
/// two-sided protocol (a SEND/RECV ping-pong, a request stream) needs no `unsafe`.
///
/// The ring takes a channel and a registered region, cuts the region into slots and posts
/// one receive per slot. [`RecvRing::recv`] hands out the oldest message as a slice of its
/// slot; the slot goes back to the device at the next `recv`/`try_recv` (the borrow of the
/// message ends first), so a ring of `n` slots keeps at least `n - 1` receives posted.
///
/// Sound whatever the caller does:
/// - the ring owns the memory, and the memory must not be remotely writable (checked), so
///   while a message is borrowed neither the device (its slot has no receive posted) nor a
///   peer writes it;
/// - dropping the ring flushes and drains its channel before it frees the memory, whatever
///   the provider does on drop; a panic in the middle leaves at worst a slot un-posted;
/// - [`RecvRing::channel`] hands out `&mut Channel` (to send and write): if the caller swaps
///   that channel for another, the ring notices (it keeps the identity of the channel it
///   posted on and compares it before every post and wait), refuses to go on
///   ([`ChannelError::Replaced`]), and on drop leaks the memory rather than free it while
///   the displaced channel may still receive into it.
///
/// Do not post receives of your own on a ring's channel: the peer's messages consume
/// receives in posting order, so yours would wait behind the ring's slots.
///
/// ```
/// #![forbid(unsafe_code)]
/// use rverbs_core::channel::{Channel, ChannelConfig, RecvRing};
/// use rverbs_core::memory::AccessFlags;
/// use rverbs_core::params::{QpCaps, RetryCount, RnrRetry};
/// use rverbs_core::poll::StepClock;
/// use rverbs_core::model::{Side, SoftFabric};
///
/// static CLOCK: StepClock = StepClock::new(core::time::Duration::from_micros(1));
/// let caps = QpCaps::queues(16, 16);
/// // On a device: `pd.register_shared(PageMemory::zeroed(4 * 64)?, AccessFlags::LOCAL_WRITE)`.
/// let (mut ma, mut mb) = ([0u8; 4 * 64], [0u8; 4 * 64]);
/// let fabric = SoftFabric::new(caps, RnrRetry::default(), RetryCount::default());
/// let ra = fabric.register(Side::A, &mut ma, AccessFlags::LOCAL_WRITE).unwrap();
/// let rb = fabric.register(Side::B, &mut mb, AccessFlags::LOCAL_WRITE).unwrap();
/// let (a, b) = fabric.ends().unwrap();
/// let cfg = ChannelConfig::default();
/// let mut ping = RecvRing::new(Channel::new(a, cfg, &CLOCK), ra, 64).unwrap();
/// let mut pong = RecvRing::new(Channel::new(b, cfg, &CLOCK), rb, 64).unwrap();
/// for i in 0u8..10 {
///     ping.channel().send_inline(&[i; 8]).unwrap();
///     let mut echo = [0u8; 8];
///     echo.copy_from_slice(pong.recv().unwrap().data);
///     pong.channel().send_inline(&echo).unwrap();
///     assert_eq!(ping.recv().unwrap().data, &[i; 8]);
/// }
/// ```
pub struct RecvRing<P: Provider, M: Region, B: Backoff = Spin, const R: usize = 64> {
    // Dropped by hand (see `Drop`): the channel is drained before the memory goes.
    chan: ManuallyDrop<Channel<P, B, R>>,
    mem: ManuallyDrop<M>,
    /// The channel the slots were posted on.
    chan_id: usize,
    slot_size: usize,
    slots: usize,
    /// The slots' scatter entry, made once: slot `i` is `slot_size` bytes at `addr + i *
    /// slot_size` (the region's entries stay valid while it lives, moved or not: see
    /// [`Region`]'s contract; a receive posted in `new` already relies on it).
    addr: u64,
    lkey: u32,
    /// The sequence number of each slot's outstanding receive on the channel (`None`: lent
    /// out, or never re-posted): the channel's receive results are taken by it.
    seqs: [Option<u64>; R],
    /// The slot the next message lands in (receives complete in posting order).
    head: usize,
    /// The slot of the last message handed out, re-posted by the next call.
    lent: Option<usize>,
}

/// A message a [`RecvRing`] received: valid until the next call on the ring.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RingMessage<'a> {
    /// The payload (empty for a write with immediate: its bytes went to the memory written).
    pub data: &'a [u8],
    /// What the completion said (length, immediate, whether it was a write with immediate).
    pub done: Done,
}

impl<P: Provider, M: Region, B: Backoff, const R: usize> fmt::Debug for RecvRing<P, M, B, R> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RecvRing")
            .field("peer", &self.chan.peer())
            .field("slots", &self.slots)
            .field("slot_size", &self.slot_size)
            .field("head", &self.head)
            .finish()
    }
}

impl<P: Provider, M: Region, B: Backoff, const R: usize> RecvRing<P, M, B, R> {
    /// Cuts `mem` into slots of `slot_size` bytes (as many as fit, at most the channel's free
    /// receive capacity) and posts a receive into each. `mem` needs local write access and
    /// must not grant remote write or atomic access (a peer could then change a message
    /// while it is read). On error nothing stays posted. Does not allocate.
    pub fn new(chan: Channel<P, B, R>, mem: M, slot_size: usize) -> Result<Self, ChannelError> {
        if let Some(e) = chan.fault() {
            return Err(e);
        }
        let access = mem.access();
        let free = chan.recv_capacity() - chan.outstanding_recvs();
        let why = if slot_size == 0 || slot_size > u32::MAX as usize {
            Some("slots must hold 1 byte to 4 GiB")
        } else if !access.contains(AccessFlags::LOCAL_WRITE) {
            Some("the ring memory needs local write access")
        } else if access.intersects(AccessFlags::REMOTE_WRITE | AccessFlags::REMOTE_ATOMIC) {
            Some("the ring memory must not be remotely writable")
        } else if mem.len() < slot_size {
            Some("the ring memory holds no slot")
        } else if free == 0 {
            Some("the channel has no free receive queue entry")
        } else {
            None
        };
        if let Some(what) = why {
            return Err(ChannelError::InvalidRing { what });
        }
        let slots = (mem.len() / slot_size).min(free as usize).min(R);
        let mut mem = mem;
        let Some(all) = mem.sge_mut(0..slots * slot_size) else {
            return Err(ChannelError::InvalidRing {
                what: "a slot outside the ring memory",
            });
        };
        let (addr, lkey) = (all.addr(), all.lkey());
        let mut ring = Self {
            chan_id: chan.id,
            chan: ManuallyDrop::new(chan),
            mem: ManuallyDrop::new(mem),
            slot_size,
            slots,
            addr,
            lkey,
            seqs: [None; R],
            head: 0,
            lent: None,
        };
        for i in 0..slots {
            // On error, dropping the ring drains what was posted before freeing the memory.
            ring.post(i)?;
        }
        Ok(ring)
    }

    /// Number of slots.
    #[inline]
    pub fn slots(&self) -> usize {
        self.slots
    }

    /// Bytes per slot: the largest message the ring takes (a longer one breaks the channel
    /// with a length error).
    #[inline]
    pub fn slot_size(&self) -> usize {
        self.slot_size
    }

    /// The channel, to send and write (do not post receives on it: see the
    /// [type's docs](RecvRing)).
    #[inline]
    pub fn channel(&mut self) -> &mut Channel<P, B, R> {
        &mut self.chan
    }

    /// Posts slot `i`'s receive (`i < slots`).
    #[inline(always)]
    fn post(&mut self, i: usize) -> Result<(), ChannelError> {
        debug_assert!(i < self.slots);
        // SAFETY: `i < slots`, so the entry lies inside the one `new` took from the region
        // for all slots (`slots * slot_size` bytes at `addr`, key `lkey`, local write access
        // checked), which stays valid while the ring holds the region. The ring owns the
        // memory and frees it only after the channel is drained (or leaks it if the channel
        // was swapped out); the slot is read only after its receive completed and is
        // re-posted only after the reader's borrow ended, so nothing else touches it while
        // the receive is outstanding.
        let sge = unsafe {
            Sge::from_raw(
                self.addr + (i * self.slot_size) as u64,
                self.slot_size as u32,
                self.lkey,
            )
        };
        // SAFETY: as above.
        let r = unsafe { self.chan.post_recv_one(sge) }?;
        self.seqs[i] = Some(r);
        Ok(())
    }

    /// Re-posts the slot lent out by the previous call.
    fn give_back(&mut self) -> Result<(), ChannelError> {
        if self.chan.id != self.chan_id {
            return Err(ChannelError::Replaced);
        }
        if let Some(i) = self.lent {
            // Forgotten only once posted: a failed post leaves it for the next call.
            self.post(i)?;
            self.lent = None;
        }
        Ok(())
    }

    fn message(&self, i: usize, done: Done) -> RingMessage<'_> {
        let at = i * self.slot_size;
        let len = if done.written {
            0
        } else {
            (done.byte_len as usize).min(self.slot_size)
        };
        // SAFETY: the slot's receive completed and it is not re-posted while the message
        // borrows the ring; the memory grants no remote write access (checked in `new`).
        let data = unsafe { self.mem.slice_unchecked(at..at + len) }.unwrap_or(&[]);
        RingMessage { data, done }
    }

    /// Takes the head slot's result, lending the slot out on success.
    #[inline]
    fn take_head(
        &mut self,
        r: Result<Done, ChannelError>,
    ) -> Result<RingMessage<'_>, ChannelError> {
        match r {
            Ok(done) => {
                let i = self.step_head();
                self.lent = Some(i);
                Ok(self.message(i, done))
            }
            Err(e) => Err(self.head_failed(e)),
        }
    }

    /// Steps the head past its slot, which no longer has a receive posted; returns that slot.
    #[inline]
    fn step_head(&mut self) -> usize {
        let i = self.head;
        self.seqs[i] = None;
        // No division on the hot path: the head steps to the next slot, wrapping.
        self.head = if i + 1 == self.slots { 0 } else { i + 1 };
        i
    }

    /// The head's receive failed (the channel is broken): the head steps past it all the
    /// same, its slot lent to nobody. Out of line.
    #[cold]
    #[inline(never)]
    fn head_failed(&mut self, e: ChannelError) -> ChannelError {
        self.step_head();
        e
    }

    /// Why the head slot has no receive posted: the failure that broke the channel (a
    /// failed receive steps the head past its slot without re-posting it, so after a ring's
    /// worth of calls on a broken channel every slot is bare), else a full receive queue.
    #[cold]
    #[inline(never)]
    fn no_receive(&self) -> ChannelError {
        self.chan.fault().unwrap_or(ChannelError::RecvQueueFull)
    }

    /// Waits for the next message, at most the channel's timeout. Does not allocate.
    pub fn recv(&mut self) -> Result<RingMessage<'_>, ChannelError> {
        self.recv_inner(None)
    }

    /// Waits for the next message until `deadline` on the channel's clock; on timeout the
    /// channel is flushed and broken. Does not allocate.
    pub fn recv_until(&mut self, deadline: Deadline) -> Result<RingMessage<'_>, ChannelError> {
        self.recv_inner(Some(deadline))
    }

    fn recv_inner(&mut self, deadline: Option<Deadline>) -> Result<RingMessage<'_>, ChannelError> {
        self.give_back()?;
        let Some(r) = self.seqs[self.head] else {
            return Err(self.no_receive());
        };
        // The channel is the ring's (`give_back` checked it), and `r` its head's receive.
        let res = self.chan.wait_recv_next(r, deadline);
        self.take_head(res)
    }

    /// The next message if one arrived, without waiting (polls once). Does not allocate.
    pub fn try_recv(&mut self) -> Option<Result<RingMessage<'_>, ChannelError>> {
        if let Err(e) = self.give_back() {
            return Some(Err(e));
        }
        let Some(r) = self.seqs[self.head] else {
            return Some(Err(self.no_receive()));
        };
        let res = self.chan.try_recv_seq(r)?;
        Some(self.take_head(res))
    }
}

impl<P: Provider, M: Region, B: Backoff, const R: usize> Drop for RecvRing<P, M, B, R> {
    fn drop(&mut self) {
        let ours = self.chan.id == self.chan_id;
        if ours {
            // Nothing may still receive into the memory once it is freed: flush and drain
            // (or abort), whatever dropping the provider would do.
            self.chan.settle(true);
        }
        // SAFETY: each field is dropped exactly once, here, and never used again.
        unsafe { ManuallyDrop::drop(&mut self.chan) };
        if ours {
            // SAFETY: as above; the channel that received into it is drained and gone.
            unsafe { ManuallyDrop::drop(&mut self.mem) };
        }
        // Otherwise the caller swapped the channel out: it may still receive into the
        // memory, which is therefore leaked.
    }
}
