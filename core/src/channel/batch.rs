//! Doorbell batches: many work requests, one post.

use core::fmt;
use core::mem::MaybeUninit;

use super::ticket::Work;
use super::wait::SettleOnDrop;
use super::{as_gather, Channel, ChannelError, Ticket};
use crate::poll::Backoff;
use crate::provider::{Provider, SendList};
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
    /// The queue pair's own list of device requests, where its provider has one
    /// ([`QueuePair::send_list`](crate::provider::QueuePair::send_list)): each push writes
    /// the device's request there, numbered and signaled, and the post hands the list to the
    /// device (one pass). `None` (the model): pushes stage provider-neutral requests in
    /// `wrs`, which the provider's post reads again.
    list: Option<SendList>,
    /// Requests pushed.
    len: usize,
    /// The staged requests (without a list). Its type also keeps the buffers a list's
    /// requests name borrowed for `'b`.
    wrs: Staged<WorkRequest<'b>>,
    /// The position and entry of each inline request (the request is pointed here when the
    /// batch is posted: a batch cannot borrow from itself while it is built, and may move
    /// between pushes). Empty for a batch without inline requests.
    inline: Staged<(u8, Sge<'b>)>,
    /// How many of the requests consume a receive at the peer (counted as they are pushed),
    /// and which (bit i: request i), to count those a refused post took.
    consumes: u64,
    consuming: u64,
    /// With a list: the signaling interval's count after the last request pushed, and one
    /// past the last signaled request; the channel takes both once the post succeeded.
    since_signal: u32,
    signaled_to: u64,
}

// A batch's `consuming` has a bit per request, and its inline entries a `u8` index.
const _: () = assert!(MAX_BATCH <= u64::BITS as usize);

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
        let mut d = f.debug_struct("Batch");
        d.field("len", &self.len)
            .field("built_in_place", &self.list.is_some());
        if self.list.is_none() {
            d.field("wrs", &self.wrs.as_slice());
        }
        d.finish()
    }
}

impl<'c, 'b, P: Provider, B: Backoff, const R: usize> Batch<'c, 'b, P, B, R> {
    #[inline]
    pub(super) fn new(chan: &'c mut Channel<P, B, R>) -> Self {
        // SAFETY: the batch holds the channel, and with it the provider, borrowed mutably for
        // as long as it holds the list, and posts through it only requests numbered on this
        // channel, whose completions the channel polls from this provider: it waits for them
        // (`run`), or hands out their ticket under the posting contract (`post`).
        let list = unsafe { chan.p.send_list() };
        Self {
            list,
            len: 0,
            wrs: Staged::new(),
            inline: Staged::new(),
            consumes: 0,
            consuming: 0,
            since_signal: chan.since_signal,
            signaled_to: chan.signaled_to,
            chan,
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

    /// Adds a request made by the caller: with a list, written into it numbered and signaled
    /// (the channel's loop of [`Channel::post_send_wrs`], a request at a time), else staged.
    #[inline(always)]
    pub(super) fn push_wr(&mut self, mut wr: WorkRequest<'b>) -> Result<&mut Self, ChannelError> {
        self.chan
            .check_sges(wr.sges.len(), self.chan.caps.max_send_sge)?;
        let i = self.len;
        if i >= self.chan.max_post {
            return Err(ChannelError::BatchFull {
                max: self.chan.max_post,
            });
        }
        match self.list {
            Some(list) => {
                let id = self.chan.next_seq + i as u64;
                let since = self.since_signal + 1;
                if since >= self.chan.signal_every || wr.flags.contains(SendFlags::SIGNALED) {
                    wr.flags |= SendFlags::SIGNALED;
                    self.since_signal = 0;
                    self.signaled_to = id + 1;
                } else {
                    self.since_signal = since;
                }
                wr.wr_id = id;
                // SAFETY: i < max_post <= MAX_BATCH; the list is the queue pair's, which the
                // borrowed channel keeps alive (`send_list`'s contract), and no reference into
                // it is alive. The only other post while the batch lives is the channel's drain
                // (after a post or wait of this batch failed), which writes what it posts
                // and leaves the channel broken, so this batch posts nothing after it. The
                // buffers `wr` names are borrowed for 'b.
                unsafe { list.set(i, &wr) };
            }
            None => {
                self.wrs
                    .push(wr)
                    .map_err(|_| ChannelError::BatchFull { max: MAX_BATCH })?;
            }
        }
        let consumes = wr.opcode.consumes_remote_recv();
        self.consumes += u64::from(consumes);
        // i < max_post <= MAX_BATCH <= 64 (asserted at the top): the shift stays inside the word.
        self.consuming |= u64::from(consumes) << i;
        self.len = i + 1;
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
        let i = self.len;
        self.push(opcode, SendFlags::INLINE, &[], remote)?;
        // As many inline entries as requests, at most MAX_BATCH (< 256): cannot be full.
        let _ = self.inline.push((i as u8, sge));
        Ok(self)
    }

    /// Posts the requests with one doorbell. Posting empties the batch (whether or not the
    /// post succeeded), so a batch never posts the same requests twice.
    ///
    /// # Safety
    /// The posting contract for every buffer the requests name.
    unsafe fn post_now(&mut self) -> Result<Ticket, ChannelError> {
        let r = match self.list {
            // SAFETY: forwarded contract.
            Some(list) => unsafe { self.post_list(list) },
            // SAFETY: forwarded contract.
            None => unsafe { self.post_staged() },
        };
        self.len = 0;
        self.wrs.clear();
        self.inline.clear();
        self.consumes = 0;
        self.consuming = 0;
        self.since_signal = self.chan.since_signal;
        self.signaled_to = self.chan.signaled_to;
        r
    }

    /// Posts the requests built in the queue pair's list: the checks and the bookkeeping of
    /// [`Channel::post_send_wrs`] (the channel's state and the room in the send queue before,
    /// the sequence numbers, the signaling interval and the receives consumed after), without
    /// its loop: the requests were numbered and signaled as they were pushed.
    ///
    /// # Safety
    /// The posting contract for every buffer the requests name.
    #[inline(always)]
    unsafe fn post_list(&mut self, list: SendList) -> Result<Ticket, ChannelError> {
        let n = self.len;
        let need = n as u64;
        let chan = &mut *self.chan;
        if chan.broken.is_some() || !chan.fits(need) {
            chan.make_room(need)?;
        }
        // Each inline request's entry, in the batch, which does not move while it posts (the
        // payload is copied during the post).
        for (i, e) in self.inline.as_slice() {
            // SAFETY: the request was set by its push (i < len); the entry outlives the post.
            unsafe { list.set_entry(usize::from(*i), e) };
        }
        // SAFETY: n requests were set by the pushes (0 < n <= max_post <= MAX_BATCH), the
        // queue pair is the borrowed channel's; the posting contract is forwarded.
        match unsafe { list.post(n) } {
            Ok(()) => {
                // Counted only once posted, as in `post_send_wrs`.
                let first = chan.next_seq;
                chan.next_seq = first + need;
                chan.since_signal = self.since_signal;
                chan.signaled_to = self.signaled_to;
                chan.remote_recvs_used += self.consumes;
                Ok(chan.ticket(Work::Sends {
                    first,
                    last: first + need - 1,
                }))
            }
            Err(f) => {
                let posted = f.posted.min(n);
                // posted <= n <= 64; a prefix of 64 is the whole word.
                let prefix = u64::MAX.checked_shr(64 - posted as u32).unwrap_or(0);
                let consumed = u64::from((self.consuming & prefix).count_ones());
                Err(chan.post_refused_counted(posted, consumed, f.errno))
            }
        }
    }

    /// Posts the staged requests, their inline entries pointing into a copy of the table that
    /// lives for the post.
    ///
    /// # Safety
    /// The posting contract for every buffer the requests name.
    unsafe fn post_staged(&mut self) -> Result<Ticket, ChannelError> {
        if self.inline.len == 0 {
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
        }
    }

    fn last_flags(&mut self, f: SendFlags) -> &mut Self {
        let Some(last) = self.len.checked_sub(1) else {
            return self;
        };
        match self.list {
            Some(list) => {
                // SAFETY: request `last` was set by its push; the list is valid (as in
                // `push_wr`).
                unsafe { list.add_flags(last, f) };
                if f.contains(SendFlags::SIGNALED) {
                    // The last request: the interval counts on from it.
                    self.since_signal = 0;
                    self.signaled_to = self.chan.next_seq + self.len as u64;
                }
            }
            None => {
                if let Some(w) = self.wrs.as_mut_slice().last_mut() {
                    w.flags |= f;
                }
            }
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

    /// The identity of the channel the batch posts on (a scope checks that it is its own).
    pub(super) fn channel_id(&self) -> usize {
        self.chan.id
    }

    /// Requests collected so far.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the batch is empty.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Posts the batch with one doorbell and waits until all of it completed (at most the
    /// channel's timeout); the batch is then empty. Does not allocate.
    ///
    /// Takes the batch by reference rather than by value: a batch holds up to
    /// [`MAX_BATCH`] requests in place, and moving kilobytes into the call cost more than
    /// posting a few requests.
    #[inline]
    pub fn run(&mut self) -> Result<(), ChannelError> {
        if self.len == 0 {
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
        if self.len == 0 {
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

    /// A batch is `Send` when its channel is (it was before it could hold a queue pair's
    /// request list): a task that builds one may move between threads.
    #[cfg(feature = "verbs")]
    #[test]
    fn a_batch_on_a_sendable_channel_is_send() {
        fn send<T: Send>() {}
        send::<
            crate::channel::Batch<
                '_,
                '_,
                crate::provider::verbs::VerbsProvider,
                crate::poll::Spin,
                64,
            >,
        >();
    }

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
