//! The operations: blocking verbs and `post_*` calls, one request each (batches live in
//! `batch.rs`, scopes in `scope.rs`).

use core::time::Duration;

use super::ticket::Work;
use super::wait::SettleOnDrop;
use super::{as_gather, Batch, Channel, ChannelError, Done, Ticket};
use crate::poll::{Backoff, Deadline};
use crate::provider::Provider;
use crate::sge::{RemoteMemory, Sge, SgeMut};
use crate::wr::{Opcode, SendFlags, WorkRequest};

impl<P: Provider, B: Backoff, const R: usize> Channel<P, B, R> {
    fn one(
        &mut self,
        opcode: Opcode,
        flags: SendFlags,
        sges: &[Sge<'_>],
        remote: RemoteMemory,
    ) -> Result<(), ChannelError> {
        self.run_one(WorkRequest::new(opcode, flags, sges, remote))
    }

    /// Posts `wr` and waits for it: every blocking verb.
    #[inline(always)]
    pub(super) fn run_one(&mut self, mut wr: WorkRequest<'_>) -> Result<(), ChannelError> {
        // Waited for at once: its own completion ends the wait (no cover request).
        wr.flags |= SendFlags::SIGNALED;
        self.check_sges(wr.sges.len(), self.caps.max_send_sge)?;
        // SAFETY: the buffers are borrowed for this call, and we wait for the completion (or
        // the flush) before returning; the guard settles the channel if the wait unwinds.
        let seq = unsafe { self.post_send_one::<false>(wr) }?;
        let guard = SettleOnDrop(self);
        // The request is this channel's and signaled: no ticket to check, nothing to cover.
        let r = guard.0.wait_send_seq(seq, seq, None);
        core::mem::forget(guard);
        r
    }

    /// Posts one send-queue request.
    ///
    /// # Safety
    /// The posting contract for `sges` (none for inline requests, whose bytes are copied
    /// during the post).
    #[inline(always)]
    pub(super) unsafe fn post_one(
        &mut self,
        opcode: Opcode,
        flags: SendFlags,
        sges: &[Sge<'_>],
        remote: RemoteMemory,
    ) -> Result<Ticket, ChannelError> {
        // SAFETY: forwarded to the caller.
        unsafe { self.post_wr(WorkRequest::new(opcode, flags, sges, remote)) }
    }

    /// Posts one send-queue request made by the caller.
    ///
    /// # Safety
    /// The posting contract for the buffers `wr` names.
    #[inline(always)]
    pub(super) unsafe fn post_wr(&mut self, wr: WorkRequest<'_>) -> Result<Ticket, ChannelError> {
        self.check_sges(wr.sges.len(), self.caps.max_send_sge)?;
        // SAFETY: forwarded to the caller.
        let seq = unsafe { self.post_send_one::<false>(wr) }?;
        Ok(self.ticket(Work::Sends {
            first: seq,
            last: seq,
        }))
    }

    /// Posts one inline request: safe, because the payload is copied into the work request
    /// during the post and no local buffer is named afterwards.
    #[inline(always)]
    pub(super) fn post_inline(
        &mut self,
        opcode: Opcode,
        data: &[u8],
        remote: RemoteMemory,
    ) -> Result<Ticket, ChannelError> {
        self.inline_one(opcode, data, remote, SendFlags::INLINE)
    }

    /// [`Channel::post_inline`] with more flags (`SIGNALED` for a request waited for at
    /// once, or whose completion must show without a wait), for a caller that has just
    /// seen room for it ([`Channel::send_room`]`(1)` true, nothing in between changed the
    /// channel): the post does not look for room again (a broken channel is still
    /// refused). Inlined: its callers in the node's engine are the send path and two out
    /// of line functions (a send before messaging started, a credit return).
    #[cfg(feature = "alloc")]
    #[inline(always)]
    pub(crate) fn post_inline_in_room(
        &mut self,
        opcode: Opcode,
        data: &[u8],
        remote: RemoteMemory,
        flags: SendFlags,
    ) -> Result<Ticket, ChannelError> {
        let sge = [self.inline_sge(data)?];
        let wr = WorkRequest::new(opcode, flags | SendFlags::INLINE, &sge, remote);
        self.check_sges(wr.sges.len(), self.caps.max_send_sge)?;
        // SAFETY: inline payloads are copied during the post; remote memory is the peer's;
        // the caller saw room for the request.
        let seq = unsafe { self.post_send_one::<true>(wr) }?;
        Ok(self.ticket(Work::Sends {
            first: seq,
            last: seq,
        }))
    }

    /// One inline request with `flags`, inlined into the channel's own operations (whose
    /// opcode is then a constant in the post).
    #[inline(always)]
    fn inline_one(
        &mut self,
        opcode: Opcode,
        data: &[u8],
        remote: RemoteMemory,
        flags: SendFlags,
    ) -> Result<Ticket, ChannelError> {
        let sge = [self.inline_sge(data)?];
        // SAFETY: inline payloads are copied during the post; remote memory is the peer's.
        unsafe { self.post_one(opcode, flags | SendFlags::INLINE, &sge, remote) }
    }

    /// Sends `sges` to the peer (which must have a receive posted) and waits for the
    /// completion. Does not allocate.
    pub fn send(&mut self, sges: &[Sge<'_>]) -> Result<(), ChannelError> {
        self.one(
            Opcode::Send,
            SendFlags::empty(),
            sges,
            RemoteMemory::default(),
        )
    }

    /// Sends with a 32-bit immediate and waits. Does not allocate.
    pub fn send_imm(&mut self, sges: &[Sge<'_>], imm: u32) -> Result<(), ChannelError> {
        self.one(
            Opcode::SendImm(imm),
            SendFlags::empty(),
            sges,
            RemoteMemory::default(),
        )
    }

    /// Sends `data` inline (copied into the work request; no registered memory needed), up to
    /// the queue pair's inline limit, and waits. Does not allocate.
    pub fn send_inline(&mut self, data: &[u8]) -> Result<(), ChannelError> {
        let t = self.inline_one(
            Opcode::Send,
            data,
            RemoteMemory::default(),
            SendFlags::SIGNALED,
        )?;
        self.wait(t).map(|_| ())
    }

    /// Writes `sges` into the peer's `remote` memory and waits. Does not allocate.
    pub fn write(&mut self, sges: &[Sge<'_>], remote: RemoteMemory) -> Result<(), ChannelError> {
        self.one(Opcode::Write, SendFlags::empty(), sges, remote)
    }

    /// Writes `data` inline into the peer's `remote` memory and waits. Does not allocate.
    pub fn write_inline(&mut self, data: &[u8], remote: RemoteMemory) -> Result<(), ChannelError> {
        let t = self.inline_one(Opcode::Write, data, remote, SendFlags::SIGNALED)?;
        self.wait(t).map(|_| ())
    }

    /// Writes with an immediate (consumes one receive at the peer) and waits. Does not
    /// allocate.
    pub fn write_imm(
        &mut self,
        sges: &[Sge<'_>],
        remote: RemoteMemory,
        imm: u32,
    ) -> Result<(), ChannelError> {
        self.one(Opcode::WriteImm(imm), SendFlags::empty(), sges, remote)
    }

    /// Reads the peer's `remote` memory into `sges` and waits. Does not allocate.
    pub fn read(
        &mut self,
        sges: &mut [SgeMut<'_>],
        remote: RemoteMemory,
    ) -> Result<(), ChannelError> {
        let sges = as_gather(sges);
        self.one(Opcode::Read, SendFlags::empty(), sges, remote)
    }

    /// Posts a receive into `sges` and waits for a message, at most the channel's timeout.
    /// Does not allocate.
    pub fn recv(&mut self, sges: &mut [SgeMut<'_>]) -> Result<Done, ChannelError> {
        // SAFETY: sges is borrowed mutably for this call, and we wait for the completion; the
        // guard settles the channel if the wait unwinds.
        let r = unsafe { self.post_recv_sges(as_gather(sges)) }?;
        let guard = SettleOnDrop(self);
        let out = guard.0.wait_recv_seq(r, None);
        core::mem::forget(guard);
        out
    }

    /// Like [`Channel::recv`], but gives up after `timeout` instead of the channel's
    /// default: the channel is then broken (its queue pair flushed and drained, so the buffer
    /// is safe to reuse) and must be rebuilt.
    pub fn recv_timeout(
        &mut self,
        sges: &mut [SgeMut<'_>],
        timeout: Duration,
    ) -> Result<Done, ChannelError> {
        // Read the clock (caller code) before anything is posted.
        let deadline = Deadline::after(self.clock, timeout);
        // SAFETY: as in recv; on timeout we flush and wait for the flush before returning.
        let r = unsafe { self.post_recv_sges(as_gather(sges)) }?;
        let guard = SettleOnDrop(self);
        let out = guard.0.wait_recv_seq(r, Some(deadline));
        core::mem::forget(guard);
        out
    }

    /// Posts an inline send of `data` and returns its ticket without waiting: the
    /// lowest-latency way to send (no registered memory, one doorbell, no wait; signaled
    /// only every [`ChannelConfig::signal_every`](super::ChannelConfig::signal_every)-th
    /// request). The peer must have a receive posted. Safe: the bytes are copied during the
    /// post. Does not allocate.
    pub fn post_send_inline(&mut self, data: &[u8]) -> Result<Ticket, ChannelError> {
        self.post_inline(Opcode::Send, data, RemoteMemory::default())
    }

    /// [`Channel::post_send_inline`] with a 32-bit immediate, delivered with the message.
    /// Does not allocate.
    pub fn post_send_imm_inline(&mut self, data: &[u8], imm: u32) -> Result<Ticket, ChannelError> {
        self.post_inline(Opcode::SendImm(imm), data, RemoteMemory::default())
    }

    /// Posts an inline write of `data` into the peer's `remote` memory and returns its ticket
    /// without waiting: the lowest-latency way to write (signaled only every
    /// [`ChannelConfig::signal_every`](super::ChannelConfig::signal_every)-th request).
    /// Safe: the bytes are copied during the post; a failure shows up on a later call (the
    /// channel is then broken). Does not allocate.
    pub fn post_write_inline(
        &mut self,
        data: &[u8],
        remote: RemoteMemory,
    ) -> Result<Ticket, ChannelError> {
        self.post_inline(Opcode::Write, data, remote)
    }

    /// Posts an inline write with immediate: `data` lands in the peer's `remote` memory and
    /// `imm` consumes one of the peer's posted receives, raising a completion there (which
    /// wakes a peer sleeping on completion events). Safe: the bytes are copied during the
    /// post. Does not allocate.
    pub fn post_write_imm_inline(
        &mut self,
        data: &[u8],
        remote: RemoteMemory,
        imm: u32,
    ) -> Result<Ticket, ChannelError> {
        self.post_inline(Opcode::WriteImm(imm), data, remote)
    }

    /// Posts a receive without a buffer and returns its ticket: it can take a write with
    /// immediate (no bytes land in a receive buffer) but not a send with a payload, which
    /// fails with a length error at this end and breaks the channel. Safe: it names no
    /// memory. Does not allocate.
    pub fn post_recv_empty(&mut self) -> Result<Ticket, ChannelError> {
        // SAFETY: no scatter buffers, so nothing is lent to the device.
        let r = unsafe { self.post_recv_sges(&[]) }?;
        Ok(self.ticket(Work::Recv(r)))
    }

    /// Posts a send of `sges` and returns its ticket. Does not allocate.
    ///
    /// # Safety
    /// The [posting contract](crate#the-posting-contract): the buffers stay valid and
    /// unwritten until [`Channel::wait`] returned for the ticket (or a later one).
    #[must_use = "wait for the ticket before touching the buffers it names"]
    pub unsafe fn post_send(&mut self, sges: &[Sge<'_>]) -> Result<Ticket, ChannelError> {
        // SAFETY: forwarded to the caller.
        unsafe {
            self.post_one(
                Opcode::Send,
                SendFlags::empty(),
                sges,
                RemoteMemory::default(),
            )
        }
    }

    /// Posts a send with immediate and returns its ticket. Does not allocate.
    ///
    /// # Safety
    /// As for [`Channel::post_send`].
    #[must_use = "wait for the ticket before touching the buffers it names"]
    pub unsafe fn post_send_imm(
        &mut self,
        sges: &[Sge<'_>],
        imm: u32,
    ) -> Result<Ticket, ChannelError> {
        let none = RemoteMemory::default();
        // SAFETY: forwarded to the caller.
        unsafe { self.post_one(Opcode::SendImm(imm), SendFlags::empty(), sges, none) }
    }

    /// Posts a write of `sges` into `remote` and returns its ticket. Does not allocate.
    ///
    /// # Safety
    /// As for [`Channel::post_send`].
    #[must_use = "wait for the ticket before touching the buffers it names"]
    pub unsafe fn post_write(
        &mut self,
        sges: &[Sge<'_>],
        remote: RemoteMemory,
    ) -> Result<Ticket, ChannelError> {
        // SAFETY: forwarded to the caller.
        unsafe { self.post_one(Opcode::Write, SendFlags::empty(), sges, remote) }
    }

    /// Posts a write with immediate and returns its ticket. Does not allocate.
    ///
    /// # Safety
    /// As for [`Channel::post_send`].
    #[must_use = "wait for the ticket before touching the buffers it names"]
    pub unsafe fn post_write_imm(
        &mut self,
        sges: &[Sge<'_>],
        remote: RemoteMemory,
        imm: u32,
    ) -> Result<Ticket, ChannelError> {
        // SAFETY: forwarded to the caller.
        unsafe { self.post_one(Opcode::WriteImm(imm), SendFlags::empty(), sges, remote) }
    }

    /// Posts a read of `remote` into `sges` and returns its ticket. Does not allocate.
    ///
    /// # Safety
    /// The [posting contract](crate#the-posting-contract): the device writes the scatter
    /// buffers until [`Channel::wait`] returned for the ticket; nobody may touch them before.
    #[must_use = "wait for the ticket before touching the buffers it names"]
    pub unsafe fn post_read(
        &mut self,
        sges: &mut [SgeMut<'_>],
        remote: RemoteMemory,
    ) -> Result<Ticket, ChannelError> {
        let sges = as_gather(sges);
        // SAFETY: forwarded to the caller.
        unsafe { self.post_one(Opcode::Read, SendFlags::empty(), sges, remote) }
    }

    /// Posts a receive into `sges` and returns its ticket; [`Channel::wait`] returns what
    /// arrived. Does not allocate.
    ///
    /// # Safety
    /// The [posting contract](crate#the-posting-contract): the scatter buffers belong to the
    /// device until their receive completed (or the channel was flushed and drained).
    #[must_use = "wait for the ticket before touching the buffers it names"]
    pub unsafe fn post_recv(&mut self, sges: &mut [SgeMut<'_>]) -> Result<Ticket, ChannelError> {
        // SAFETY: forwarded to the caller.
        let r = unsafe { self.post_recv_sges(as_gather(sges)) }?;
        Ok(self.ticket(Work::Recv(r)))
    }

    /// How many send requests have completed since the channel was made (every request
    /// below this count is done). Grows as [`Channel::poll`] sees completions.
    #[inline]
    pub fn sends_completed(&self) -> u64 {
        self.done_seq
    }

    /// Starts a batch: up to [`Channel::max_post`] requests posted with one doorbell.
    #[inline]
    pub fn batch<'b>(&mut self) -> Batch<'_, 'b, P, B, R> {
        Batch::new(self)
    }
}
