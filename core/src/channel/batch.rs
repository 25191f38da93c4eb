//! Doorbell batches: many work requests, one post.

use core::fmt;
use core::mem::MaybeUninit;

use super::ticket::Work;
use super::wait::SettleOnDrop;
use super::{as_gather, Channel, ChannelError, Ticket};
use crate::poll::Backoff;
use crate::provider::Provider;
use crate::sge::{RemoteMemory, Sge, SgeMut};
use crate::wr::{Opcode, SendFlags, WorkRequest, MAX_BATCH};

/// Work requests collected for one post (one doorbell). Nothing is posted until
/// [`Batch::run`] (post and wait) or [`Batch::post`] (post, return a ticket); dropping the
/// batch discards it.
///
/// The batch borrows the channel mutably, so no other post can slip in between, and it
/// cannot outlive that borrow:
///
/// ```compile_fail
/// # use rverbs_core::channel::Channel;
/// # use rverbs_core::model::SoftEnd;
/// fn f(chan: &mut Channel<SoftEnd<'_>>) {
///     let batch = chan.batch();
///     chan.poll().unwrap(); // error: `chan` is still borrowed by `batch`
///     batch.run().unwrap();
/// }
/// ```
#[must_use = "a batch posts nothing until it is run or posted"]
pub struct Batch<'c, 'b, P: Provider, B: Backoff, const R: usize> {
    chan: &'c mut Channel<P, B, R>,
    wrs: Staged<WorkRequest<'b>>,
    /// The position and entry of each inline request (the request's own `sges` is patched
    /// to point here when the batch is posted: a batch cannot borrow from itself while it is
    /// built). Empty for a batch without inline requests.
    inline: Staged<(u8, Sge<'b>)>,
    /// How many of the requests consume a receive at the peer (counted as they are pushed).
    consumes: u64,
}

/// Up to [`MAX_BATCH`] values, none written in advance: making a batch writes one length,
/// not kilobytes (`heapless::Vec::new` is a constant whose uninitialised storage is emitted
/// as zeros, a 5 KiB `memset` per batch).
struct Staged<T: Copy> {
    len: usize,
    items: [MaybeUninit<T>; MAX_BATCH],
}

impl<T: Copy> Staged<T> {
    #[inline]
    fn new() -> Self {
        Self {
            len: 0,
            items: [const { MaybeUninit::uninit() }; MAX_BATCH],
        }
    }

    /// Appends `item`; `Err(item)` when full.
    #[inline]
    fn push(&mut self, item: T) -> Result<(), T> {
        match self.items.get_mut(self.len) {
            Some(slot) => {
                slot.write(item);
                self.len += 1;
                Ok(())
            }
            None => Err(item),
        }
    }

    #[inline]
    fn as_slice(&self) -> &[T] {
        // SAFETY: the first `len` items were written by `push` (and `T: Copy` has no drop).
        unsafe { core::slice::from_raw_parts(self.items.as_ptr().cast::<T>(), self.len) }
    }

    #[inline]
    fn as_mut_slice(&mut self) -> &mut [T] {
        // SAFETY: as in `as_slice`; borrowed mutably through `self`.
        unsafe { core::slice::from_raw_parts_mut(self.items.as_mut_ptr().cast::<T>(), self.len) }
    }

    #[inline]
    fn clear(&mut self) {
        self.len = 0;
    }
}

impl<P: Provider, B: Backoff, const R: usize> fmt::Debug for Batch<'_, '_, P, B, R> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Batch")
            .field("wrs", &self.wrs.as_slice())
            .finish()
    }
}

impl<'c, 'b, P: Provider, B: Backoff, const R: usize> Batch<'c, 'b, P, B, R> {
    #[inline]
    pub(super) fn new(chan: &'c mut Channel<P, B, R>) -> Self {
        Self {
            chan,
            wrs: Staged::new(),
            inline: Staged::new(),
            consumes: 0,
        }
    }

    #[inline(always)]
    fn push(
        &mut self,
        opcode: Opcode,
        flags: SendFlags,
        sges: &'b [Sge<'b>],
        remote: RemoteMemory,
    ) -> Result<&mut Self, ChannelError> {
        self.push_wr(WorkRequest::new(opcode, flags, sges, remote))
    }

    /// Adds a request made by the caller.
    #[inline(always)]
    pub(super) fn push_wr(&mut self, wr: WorkRequest<'b>) -> Result<&mut Self, ChannelError> {
        self.chan
            .check_sges(wr.sges.len(), self.chan.caps.max_send_sge)?;
        if self.wrs.len >= self.chan.max_post {
            return Err(ChannelError::BatchFull {
                max: self.chan.max_post,
            });
        }
        self.wrs
            .push(wr)
            .map_err(|_| ChannelError::BatchFull { max: MAX_BATCH })?;
        self.consumes += u64::from(wr.opcode.consumes_remote_recv());
        Ok(self)
    }

    /// Adds a send.
    pub fn send(&mut self, sges: &'b [Sge<'b>]) -> Result<&mut Self, ChannelError> {
        self.push(
            Opcode::Send,
            SendFlags::empty(),
            sges,
            RemoteMemory::default(),
        )
    }

    /// Adds a send with immediate.
    pub fn send_imm(&mut self, sges: &'b [Sge<'b>], imm: u32) -> Result<&mut Self, ChannelError> {
        self.push(
            Opcode::SendImm(imm),
            SendFlags::empty(),
            sges,
            RemoteMemory::default(),
        )
    }

    /// Adds an RDMA write.
    pub fn write(
        &mut self,
        sges: &'b [Sge<'b>],
        remote: RemoteMemory,
    ) -> Result<&mut Self, ChannelError> {
        self.push(Opcode::Write, SendFlags::empty(), sges, remote)
    }

    /// Adds an RDMA write with immediate.
    pub fn write_imm(
        &mut self,
        sges: &'b [Sge<'b>],
        remote: RemoteMemory,
        imm: u32,
    ) -> Result<&mut Self, ChannelError> {
        self.push(Opcode::WriteImm(imm), SendFlags::empty(), sges, remote)
    }

    /// Adds an RDMA read into `sges`.
    pub fn read(
        &mut self,
        sges: &'b mut [SgeMut<'b>],
        remote: RemoteMemory,
    ) -> Result<&mut Self, ChannelError> {
        self.push(Opcode::Read, SendFlags::empty(), as_gather(sges), remote)
    }

    /// Adds an inline send of `data` (copied into the request when the batch is posted, so
    /// it needs no registered memory).
    pub fn send_inline(&mut self, data: &'b [u8]) -> Result<&mut Self, ChannelError> {
        self.push_inline(Opcode::Send, data, RemoteMemory::default())
    }

    /// Adds an inline RDMA write of `data` (copied into the request when the batch is
    /// posted).
    pub fn write_inline(
        &mut self,
        data: &'b [u8],
        remote: RemoteMemory,
    ) -> Result<&mut Self, ChannelError> {
        self.push_inline(Opcode::Write, data, remote)
    }

    fn push_inline(
        &mut self,
        opcode: Opcode,
        data: &'b [u8],
        remote: RemoteMemory,
    ) -> Result<&mut Self, ChannelError> {
        let sge = self.chan.inline_sge(data)?;
        let i = self.wrs.len;
        self.push(opcode, SendFlags::INLINE, &[], remote)?;
        // As many inline entries as requests, at most MAX_BATCH (< 256): cannot be full.
        let _ = self.inline.push((i as u8, sge));
        Ok(self)
    }

    /// Posts the requests with one doorbell, their inline entries pointing into a copy of the
    /// table that lives for the post.
    ///
    /// # Safety
    /// The posting contract for every buffer the requests name.
    /// Posting empties the batch (whether or not the post succeeded), so a batch never posts
    /// the same requests twice.
    unsafe fn post_now(&mut self) -> Result<Ticket, ChannelError> {
        let r = if self.inline.len == 0 {
            // SAFETY: forwarded contract.
            unsafe {
                self.chan
                    .post_send_wrs(self.wrs.as_mut_slice(), self.consumes)
            }
        } else {
            // Point each inline request at its entry, in a copy of the table that lives for
            // the post (the batch cannot hold references into itself).
            let entries = self.inline.as_slice();
            let wrs = self.wrs.as_mut_slice();
            let mut patched: Staged<WorkRequest<'_>> = Staged::new();
            for w in wrs.iter() {
                // As many as the batch holds: cannot be full.
                let _ = patched.push(*w);
            }
            for (i, e) in entries {
                if let Some(w) = patched.as_mut_slice().get_mut(usize::from(*i)) {
                    w.sges = core::slice::from_ref(e);
                }
            }
            // SAFETY: forwarded contract; inline payloads are copied during the post.
            unsafe {
                self.chan
                    .post_send_wrs(patched.as_mut_slice(), self.consumes)
            }
        };
        self.wrs.clear();
        self.inline.clear();
        self.consumes = 0;
        r
    }

    fn last_flags(&mut self, f: SendFlags) -> &mut Self {
        if let Some(w) = self.wrs.as_mut_slice().last_mut() {
            w.flags |= f;
        }
        self
    }

    /// Fences the last added request: it starts only after earlier reads on the QP finished.
    pub fn fence(&mut self) -> &mut Self {
        self.last_flags(SendFlags::FENCE)
    }

    /// Marks the last added request solicited.
    pub fn solicited(&mut self) -> &mut Self {
        self.last_flags(SendFlags::SOLICITED)
    }

    /// Asks for a completion of the last added request even if it is not a k-th one.
    pub fn signaled(&mut self) -> &mut Self {
        self.last_flags(SendFlags::SIGNALED)
    }

    /// Requests collected so far.
    pub fn len(&self) -> usize {
        self.wrs.len
    }

    /// Whether the batch is empty.
    pub fn is_empty(&self) -> bool {
        self.wrs.len == 0
    }

    /// Posts the batch with one doorbell and waits until all of it completed (at most the
    /// channel's timeout); the batch is then empty. Does not allocate.
    ///
    /// Takes the batch by reference rather than by value: a batch holds up to
    /// [`MAX_BATCH`] requests in place, and moving kilobytes into the call cost more than
    /// posting a few requests.
    #[inline]
    pub fn run(&mut self) -> Result<(), ChannelError> {
        if self.wrs.len == 0 {
            return Ok(());
        }
        // Waited for at once: the last request's own completion ends the wait.
        self.signaled();
        // SAFETY: the buffers are borrowed for 'b, which outlives this call, and we wait
        // for the batch (or its flush) before returning; the guard settles the channel if
        // the wait unwinds.
        let t = unsafe { self.post_now() }?;
        // The guard first: nothing between the post and it may unwind unguarded.
        let guard = SettleOnDrop(&mut *self.chan);
        let Work::Sends { first, last } = t.work else {
            unreachable!("a send batch's ticket names sends")
        };
        // The channel's own ticket, its last request signaled: nothing to check or cover.
        let r = guard.0.wait_send_seq(first, last, None);
        core::mem::forget(guard);
        r
    }

    /// Posts the batch with one doorbell and returns its ticket without waiting; the batch
    /// is then empty. `None` for an empty batch. Does not allocate.
    ///
    /// # Safety
    /// The [posting contract](crate#the-posting-contract): the buffers must stay valid and
    /// untouched until [`Channel::wait`] returned for the ticket (or a later one), even though
    /// the borrow checker forgets them when this call returns.
    #[must_use = "wait for the ticket before touching the buffers it names"]
    #[inline]
    pub unsafe fn post(&mut self) -> Result<Option<Ticket>, ChannelError> {
        if self.wrs.len == 0 {
            return Ok(None);
        }
        // SAFETY: forwarded to the caller.
        unsafe { self.post_now() }.map(Some)
    }
}

#[cfg(test)]
mod tests {
    use crate::channel::{Channel, ChannelConfig};
    use crate::memory::AccessFlags;
    use crate::model::{Side, SoftFabric};
    use crate::params::{QpCaps, RetryCount, RnrRetry};
    use crate::poll::StepClock;

    static CLOCK: StepClock = StepClock::new(core::time::Duration::from_micros(1));

    /// A batch counts the requests that consume a receive at the peer as they are pushed
    /// (sends and writes with immediate, not writes): what node credits are counted against.
    #[test]
    fn a_run_batch_counts_the_requests_that_consume_a_peers_receive() {
        let caps = QpCaps::queues(32, 32).with_sges(2);
        let (mut src, mut dst) = ([7u8; 64], [0u8; 64]);
        let fabric = SoftFabric::new(caps, RnrRetry::default(), RetryCount::default());
        let src = fabric
            .register(Side::A, &mut src, AccessFlags::LOCAL_WRITE)
            .unwrap();
        let dst = fabric
            .register(
                Side::B,
                &mut dst,
                AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE,
            )
            .unwrap();
        let (a, b) = fabric.ends().unwrap();
        let mut chan = Channel::new(a, ChannelConfig::default(), &CLOCK);
        let mut peer = Channel::new(b, ChannelConfig::default(), &CLOCK);
        let t1 = peer.post_recv_empty().unwrap();
        let t2 = peer.post_recv_empty().unwrap();
        let sges = [src.sge(0..8).unwrap()];
        let at = |o| dst.remote().slice(o, 8).unwrap();
        let mut batch = chan.batch();
        batch.write(&sges, at(0)).unwrap();
        batch.write_imm(&sges, at(8), 1).unwrap();
        batch.send_inline(b"").unwrap();
        batch.write_inline(b"12345678", at(16)).unwrap();
        batch.run().unwrap();
        assert_eq!(chan.remote_recvs_used(), 2);
        peer.wait(t1).unwrap();
        peer.wait(t2).unwrap();
        // A second batch counts on from there.
        let t3 = peer.post_recv_empty().unwrap();
        let mut batch = chan.batch();
        batch.write_imm(&sges, at(24), 2).unwrap();
        batch.run().unwrap();
        assert_eq!(chan.remote_recvs_used(), 3);
        peer.wait(t3).unwrap();
    }
}
