//! Waiting: every wait of a channel is bounded by its timeout, and a wait that gives up
//! flushes and drains the queue pair before it returns (see the
//! [module docs](super#every-wait-is-bounded)).

use super::ticket::Work;
use super::{
    Broken, Channel, ChannelError, Done, PeerName, Queues, Ticket, WrFailure, CLOCK_EVERY,
    POLL_AT_ONCE, RECV_BIT,
};
use crate::completion::{CompletionKind, WcStatus};
use crate::poll::{Backoff, Deadline, Patience};
use crate::provider::Provider;
use crate::sge::RemoteMemory;
use crate::verb::ProviderError;
use crate::wr::{Opcode, SendFlags, WorkRequest};

/// Settles the channel when dropped: held from a post until its wait returned, so that if
/// the wait unwinds (a panic in the caller's back-off, clock, or scope closure: the only
/// caller code a wait runs) no request outlives the buffers it borrowed. On that path nobody
/// waits for the work any more, so it flushes at once. The normal exit settles first (or
/// forgets the guard), leaving nothing to do.
pub(super) struct SettleOnDrop<'a, P: Provider, B: Backoff, const R: usize>(
    pub(super) &'a mut Channel<P, B, R>,
);

impl<P: Provider, B: Backoff, const R: usize> Drop for SettleOnDrop<'_, P, B, R> {
    fn drop(&mut self) {
        self.0.settle(true);
    }
}

/// Whether a receive wait that has seen `empty` empty polls polls the send queue too this
/// time: every `CLOCK_EVERY`-th. Wrapping, as the count does: a wait with a long timeout
/// outlives `u32::MAX` empty polls (minutes of spinning), and an overflow there must not
/// panic (a debug build checks it).
#[inline]
fn recv_wait_polls_sends(empty: u32) -> bool {
    empty.wrapping_add(1).is_multiple_of(CLOCK_EVERY)
}

impl<P: Provider, B: Backoff, const R: usize> Channel<P, B, R> {
    /// Polls until `done`, or until `deadline` (the channel's timeout, counted from the
    /// first clock read, when `None`: see [`Patience`]). On `Err` the channel is broken and
    /// nothing it posted is in flight any more: a timeout or a failed poll flushes and
    /// drains it first ([`Channel::flush_and_drain`]).
    pub(super) fn poll_until(
        &mut self,
        done: impl Fn(&Self) -> bool,
        deadline: Option<Deadline>,
    ) -> Result<(), ChannelError> {
        self.poll_until_on(Queues::Both, done, deadline)
    }

    /// [`Channel::poll_until`], polling only `queues`: a wait for send requests polls the
    /// send queue alone (the receive queue's completions keep until a wait needs them).
    pub(super) fn poll_until_on(
        &mut self,
        queues: Queues,
        done: impl Fn(&Self) -> bool,
        deadline: Option<Deadline>,
    ) -> Result<(), ChannelError> {
        self.backoff.reset();
        let (clock, timeout) = (self.clock, self.timeout);
        // The deadline is checked at the top of every turn, whether the last turn took
        // completions or not: a peer's traffic (receives completing while a send is awaited)
        // must not hold the wait past it.
        let mut patience = Patience::new(deadline, timeout);
        let mut empty: u32 = 0;
        loop {
            if done(self) {
                return Ok(());
            }
            if patience.run_out(clock) {
                self.broken.get_or_insert(Broken::TimedOut);
                self.flush_and_drain();
                return Err(ChannelError::TimedOut { rank: self.rank });
            }
            let polled = match queues {
                Queues::Sends => self.poll_send_cq(),
                Queues::Recvs if !recv_wait_polls_sends(empty) => self.poll_recv_cq(),
                Queues::Recvs | Queues::Both => self.poll_once(),
            };
            match polled {
                Ok(0) => {}
                Ok(_) => {
                    self.backoff.reset();
                    continue;
                }
                Err(e) => return Err(self.poll_failed(e)),
            }
            empty = empty.wrapping_add(1);
            self.backoff
                .snooze_within(&mut || patience.remaining(clock));
        }
    }

    /// A failed poll inside a wait: breaks the channel and drains it (so no buffer is handed
    /// back while the device may use it), and returns the error.
    #[cold]
    #[inline(never)]
    fn poll_failed(&mut self, e: ProviderError) -> ChannelError {
        self.broken.get_or_insert(Broken::Provider(e));
        self.flush_and_drain();
        ChannelError::Provider(e)
    }

    /// Makes sure that a signaled request at or after send request `seq` is posted, so that a
    /// wait for `seq` ends: if none is, posts a signaled zero-length RDMA write, which names
    /// no memory at either end (its responder checks no key, IBTA C9-88) and completes after
    /// everything before it. Nothing to do on a broken channel (its flush completes
    /// everything). Does not allocate.
    pub(super) fn cover(&mut self, seq: u64) -> Result<(), ChannelError> {
        if seq < self.signaled_to || seq < self.done_seq || seq >= self.next_seq {
            return Ok(());
        }
        if self.broken.is_some() {
            return Ok(());
        }
        let mut wr = [WorkRequest {
            wr_id: 0,
            opcode: Opcode::Write,
            flags: SendFlags::SIGNALED,
            sges: &[],
            remote: RemoteMemory::default(),
        }];
        // SAFETY: the request names no memory, local or remote.
        match unsafe { self.post_send_wrs(&mut wr, 0) } {
            Ok(_) => Ok(()),
            Err(e) => {
                // Without the cover nothing may complete what the caller waits for: break the
                // channel and drain it, so no request outlives the buffers it named.
                self.broken.get_or_insert(Broken::Wr(WrFailure {
                    rank: self.rank,
                    wr_id: self.next_seq,
                    status: WcStatus::General,
                    vendor_err: 0,
                }));
                self.flush_and_drain();
                Err(e)
            }
        }
    }

    /// [`Channel::cover`] for everything posted so far.
    pub(super) fn cover_all(&mut self) -> Result<(), ChannelError> {
        match self.next_seq.checked_sub(1) {
            Some(last) => self.cover(last),
            None => Ok(()),
        }
    }

    /// Moves the queue pair to the error state and polls until everything the channel
    /// posted has completed (flushed): [`crate::poll::drain`]. Returns only when the device
    /// can no longer touch any buffer named by this channel's requests; aborts the process
    /// if the queue pair cannot be moved to the error state or the flush does not drain
    /// within the flush timeout.
    pub(super) fn flush_and_drain(&mut self) {
        let who = PeerName(self.rank);
        crate::poll::drain::flush_and_drain(self, &who);
    }

    /// Forgets the results of the receives `seqs` that nobody asked for (a scope that ended).
    pub(super) fn release_recv_results(&mut self, seqs: core::ops::Range<u64>) {
        if R == 0 {
            return;
        }
        for r in seqs {
            self.slots[(r % R as u64) as usize].taken = true;
        }
    }

    pub(super) fn all_done(&self) -> bool {
        self.done_seq >= self.next_seq && self.recv_done >= self.recv_next
    }

    /// Posts one signaled request with no data to the queue pair in the error state (the
    /// verbs "drain" idiom): it completes flushed after everything posted before it, so its
    /// completion retires unsignaled requests that ran before the flush and will never
    /// produce a completion of their own. If the post fails, the drain waits for the
    /// completions already due and aborts at the flush timeout if they do not cover
    /// everything.
    pub(super) fn post_drain_request(&mut self) {
        let wr = WorkRequest {
            wr_id: self.next_seq,
            opcode: Opcode::Send,
            flags: SendFlags::SIGNALED,
            sges: &[],
            remote: RemoteMemory::default(),
        };
        // SAFETY: the request names no memory at all.
        if unsafe { self.p.post_send(&[wr]) }.is_ok() {
            self.next_seq += 1;
        }
    }

    /// Waits until the work of `ticket` completed, at most the channel's timeout, and
    /// returns what it delivered. Does not allocate.
    #[inline]
    pub fn wait(&mut self, ticket: Ticket) -> Result<Done, ChannelError> {
        self.wait_for(ticket, None)
    }

    /// Like [`Channel::wait`] with a deadline on the channel's [`clock`](Self::clock); on
    /// timeout the channel is flushed, drained and broken.
    pub fn wait_until(&mut self, ticket: Ticket, deadline: Deadline) -> Result<Done, ChannelError> {
        self.wait_for(ticket, Some(deadline))
    }

    /// The result of `ticket` if its work has completed (handing out a receive's result
    /// frees its slot), or `None` while it is outstanding. Polls once; never waits. Does not
    /// allocate.
    pub fn try_wait(&mut self, ticket: Ticket) -> Option<Result<Done, ChannelError>> {
        if ticket.chan != self.id {
            return Some(Err(ChannelError::ForeignTicket));
        }
        if !self.is_complete(ticket) {
            if let Work::Sends { last, .. } = ticket.work {
                if let Err(e) = self.cover(last) {
                    return Some(Err(e));
                }
            }
            if let Err(e) = self.poll() {
                return Some(Err(e));
            }
        }
        self.is_complete(ticket)
            .then(|| self.wait_for(ticket, None))
    }

    /// The result of `ticket` if what the channel already polled completed it; never polls.
    #[cfg(feature = "alloc")]
    #[inline]
    pub(crate) fn take_if_complete(
        &mut self,
        ticket: Ticket,
    ) -> Option<Result<Done, ChannelError>> {
        self.is_complete(ticket)
            .then(|| self.wait_for(ticket, None))
    }

    /// Whether this channel's `ticket` completed (false for another channel's).
    pub(crate) fn is_complete(&self, ticket: Ticket) -> bool {
        if ticket.chan != self.id {
            return false;
        }
        match ticket.work {
            Work::Sends { last, .. } => self.done_seq > last,
            Work::Recv(r) => self.recv_done > r,
        }
    }

    pub(super) fn wait_for(
        &mut self,
        ticket: Ticket,
        deadline: Option<Deadline>,
    ) -> Result<Done, ChannelError> {
        if ticket.chan != self.id {
            return Err(ChannelError::ForeignTicket);
        }
        match ticket.work {
            Work::Sends { first, last } => {
                if self.done_seq <= last {
                    self.cover(last)?;
                    self.poll_until_on(Queues::Sends, |c| c.done_seq > last, deadline)?;
                }
                self.check_send(first, last).map(|()| Done::default())
            }
            Work::Recv(r) => self.wait_recv_seq(r, deadline),
        }
    }

    /// Waits until everything posted has completed, at most the channel's timeout.
    pub fn wait_all(&mut self) -> Result<(), ChannelError> {
        self.cover_all()?;
        self.poll_until(Self::all_done, None)?;
        self.fault().map_or(Ok(()), Err)
    }

    /// Returns once nothing posted on this channel can still touch memory: everything
    /// completed, or was flushed after a timeout. Used by guards on every exit path
    /// (including unwinding); `flush_now` skips the wait and flushes at once.
    pub(crate) fn settle(&mut self, flush_now: bool) {
        if self.all_done() {
            return;
        }
        if flush_now {
            self.broken.get_or_insert(Broken::TimedOut);
            self.flush_and_drain();
        } else {
            // poll_until drains before it returns an error; so does a cover that failed.
            let _ = self.cover_all();
            let _ = self.poll_until(Self::all_done, None);
        }
    }

    /// Moves the queue pair to the error state at once, even with nothing posted, and drains
    /// what was: from then on the device executes no request arriving on it, so a peer that
    /// is gone cannot be impersonated through it by a forged packet at the PSN it expected
    /// (docs/security.md). Later calls fail as after a timeout, until the channel is renewed.
    #[cfg(feature = "alloc")]
    pub(crate) fn shut(&mut self) {
        self.broken.get_or_insert(Broken::TimedOut);
        self.flush_and_drain();
    }

    /// Waits for the send requests `first..=seq` of this channel (a blocking verb's or a run
    /// batch's, `seq` signaled), at most the channel's timeout or `deadline`, and says how
    /// they went: [`Channel::wait_for`] without the ticket's checks and the cover, which
    /// requests the channel has just posted, the last signaled, need neither of.
    ///
    /// `seq` must be signaled (both callers force it): no cover is posted here, so the wait
    /// for an unsignaled `seq` would end only with the timeout's flush. Checked in debug
    /// builds.
    #[inline(always)]
    pub(super) fn wait_send_seq(
        &mut self,
        first: u64,
        seq: u64,
        deadline: Option<Deadline>,
    ) -> Result<(), ChannelError> {
        debug_assert!(seq < self.signaled_to);
        // One poll before the waiting loop is set up: on a device that is done by the time
        // it is polled, the wait ends here. The same poll the loop's first turn makes (that
        // turn reads no clock either); its failure is handled as the loop handles it.
        if self.done_seq <= seq {
            // A blocking verb's one request completes alone; a batch's signals every
            // `signal_every`-th request as well, so its first poll takes all it can.
            let max = if first == seq { 1 } else { POLL_AT_ONCE };
            if let Err(e) = self.poll_send_cq_max(max) {
                return Err(self.poll_failed(e));
            }
            if self.done_seq <= seq {
                self.wait_send_loop(seq, deadline)?;
            }
        }
        if self.broken.is_none() {
            Ok(())
        } else {
            self.check_send_cold(first, seq)
        }
    }

    /// The waiting loop of [`Channel::wait_send_seq`], out of line: reached only when one
    /// poll did not find the request done.
    #[inline(never)]
    fn wait_send_loop(&mut self, seq: u64, deadline: Option<Deadline>) -> Result<(), ChannelError> {
        self.poll_until_on(Queues::Sends, |c| c.done_seq > seq, deadline)
    }

    /// [`Channel::check_send`] on a broken channel, out of line.
    #[cold]
    #[inline(never)]
    fn check_send_cold(&self, first: u64, last: u64) -> Result<(), ChannelError> {
        self.check_send(first, last)
    }

    /// Waits, at most the channel's timeout, until every send posted so far completed (a
    /// connection that is about to be closed delivers what it was given first).
    #[cfg(feature = "rdmacm")]
    pub(crate) fn wait_sends(&mut self) -> Result<(), ChannelError> {
        self.poll_until(|c| c.done_seq >= c.next_seq, None)?;
        self.fault().map_or(Ok(()), Err)
    }

    /// Closes the channel for good: every later call fails with
    /// [`ChannelError::Disconnected`] (unless it broke earlier: the first failure stays),
    /// and everything still posted is flushed and drained before this returns.
    #[cfg(feature = "rdmacm")]
    pub(crate) fn close(&mut self) {
        self.broken.get_or_insert(Broken::Disconnected);
        self.flush_and_drain();
    }

    /// Whether the channel was closed ([`Channel::close`]).
    #[cfg(feature = "rdmacm")]
    pub(crate) fn is_closed(&self) -> bool {
        self.broken.is_some_and(|b| b == Broken::Disconnected)
    }

    pub(super) fn check_send(&self, first: u64, last: u64) -> Result<(), ChannelError> {
        match self.broken {
            None => Ok(()),
            Some(Broken::Wr(w))
                if w.wr_id & RECV_BIT == 0 && w.wr_id >= first && w.wr_id <= last =>
            {
                Err(ChannelError::Failed(w))
            }
            Some(Broken::Wr(w)) if w.wr_id & RECV_BIT == 0 && w.wr_id < first => {
                Err(ChannelError::Broken(w))
            }
            // The failure came after these requests (or on the receive side): if they
            // completed, they completed successfully.
            Some(_) if last < self.failure_seq() => Ok(()),
            Some(_) => self.fault().map_or(Ok(()), Err),
        }
    }

    pub(super) fn failure_seq(&self) -> u64 {
        match self.broken {
            Some(Broken::Wr(w)) if w.wr_id & RECV_BIT == 0 => w.wr_id,
            _ => 0,
        }
    }

    #[inline]
    pub(super) fn recv_result(&mut self, r: u64) -> Result<Done, ChannelError> {
        let slot = &mut self.slots[(r % R as u64) as usize];
        slot.taken = true;
        let slot = *slot;
        if slot.status.is_success() {
            Ok(slot.info)
        } else {
            Err(self.recv_failure(r, slot))
        }
    }

    /// What a failed receive's result says, out of line: the failure that broke the channel
    /// first where this receive was only flushed by it.
    #[cold]
    #[inline(never)]
    fn recv_failure(&self, r: u64, slot: super::RecvSlot) -> ChannelError {
        {
            let w = WrFailure {
                rank: self.rank,
                wr_id: r | RECV_BIT,
                status: slot.status,
                vendor_err: slot.vendor_err,
            };
            match self.broken {
                Some(Broken::TimedOut) => ChannelError::TimedOut { rank: self.rank },
                Some(Broken::Provider(e)) => ChannelError::Provider(e),
                Some(Broken::Disconnected) if slot.status == WcStatus::Flushed => {
                    ChannelError::Disconnected { rank: self.rank }
                }
                Some(Broken::Wr(first)) if first != w && slot.status == WcStatus::Flushed => {
                    ChannelError::Broken(first)
                }
                _ => ChannelError::Failed(w),
            }
        }
    }

    pub(super) fn wait_recv_seq(
        &mut self,
        r: u64,
        deadline: Option<Deadline>,
    ) -> Result<Done, ChannelError> {
        match self.poll_until_on(Queues::Recvs, |c| c.recv_done > r, deadline) {
            Ok(()) => self.recv_result(r),
            Err(e) => Err(e),
        }
    }

    /// Waits for receive `r` of this channel, at most the channel's timeout or `deadline`,
    /// and returns what it delivered: [`Channel::wait_for`] without the ticket, for a caller
    /// that holds the receive's sequence number itself and has checked that this is the
    /// channel it posted on (a [`RecvRing`](super::RecvRing), whose receives complete in the
    /// order of its slots).
    ///
    /// One poll of one receive completion comes before the waiting loop is set up: a ring
    /// whose next message has arrived is served by it, the way the raw loop polls and takes
    /// what it found. That poll is the loop's first turn, which reads no clock either (the
    /// deadline is read every [`CLOCK_EVERY`]-th turn); the loop, out of line, takes the
    /// turns after it, each checking the deadline and the channel's state.
    #[inline(always)]
    pub(super) fn wait_recv_next(
        &mut self,
        r: u64,
        deadline: Option<Deadline>,
    ) -> Result<Done, ChannelError> {
        if self.recv_done <= r {
            match self.poll_recv_head(r) {
                Ok(Some(done)) => return Ok(done),
                Ok(None) => {}
                Err(e) => return Err(self.poll_failed(e)),
            }
            if self.recv_done <= r {
                self.wait_recv_loop(r, deadline)?;
            }
        }
        self.recv_result(r)
    }

    /// Polls one receive completion. If it is receive `r`'s and successful, retires `r` and
    /// returns what it delivered straight from the completion: the result slot is neither
    /// written nor read (it still says "taken", as it did when `r` was posted into it, and
    /// no other receive can use it while `r` is outstanding: the queue holds at most `R`).
    /// Anything else (another receive, a failure, another queue pair's completion) is
    /// retired the usual way and `None` returned. Called only while `r` is outstanding
    /// (`recv_done <= r`), so retiring `r` is `recv_done = r + 1`.
    #[inline(always)]
    fn poll_recv_head(&mut self, r: u64) -> Result<Option<Done>, ProviderError> {
        debug_assert!(self.recv_done <= r && r < self.recv_next);
        let n = P::poll_recv(&mut self.p, &mut self.wc[..1])?.min(1);
        if n == 1 {
            let c = self.wc[0];
            if c.qp_num == self.qp_num {
                if c.wr_id == r | RECV_BIT && c.status.is_success() {
                    self.recv_done = r + 1;
                    return Ok(Some(Done {
                        byte_len: c.byte_len,
                        imm: c.imm,
                        written: c.kind == CompletionKind::RecvWriteImm,
                    }));
                }
                self.on_recv_completion(&c);
            }
        }
        Ok(None)
    }

    /// The waiting loop of [`Channel::wait_recv_next`], out of line: reached only when one
    /// poll did not find the receive done.
    #[inline(never)]
    fn wait_recv_loop(&mut self, r: u64, deadline: Option<Deadline>) -> Result<(), ChannelError> {
        self.poll_until_on(Queues::Recvs, |c| c.recv_done > r, deadline)
    }

    /// Receive `r`'s result if what the channel has polled, or one more poll of both
    /// queues, completed it; `None` while it is outstanding. Never waits: the ticket-free
    /// [`Channel::try_wait`] of a caller that checked the channel (a ring).
    pub(super) fn try_recv_seq(&mut self, r: u64) -> Option<Result<Done, ChannelError>> {
        if self.recv_done <= r {
            if let Err(e) = self.poll() {
                return Some(Err(e));
            }
        }
        (self.recv_done > r).then(|| self.recv_result(r))
    }
}

impl<P: Provider, B: Backoff, const R: usize> crate::poll::drain::Drain for Channel<P, B, R> {
    fn set_error(&mut self) -> Result<(), ProviderError> {
        self.p.set_error()
    }

    fn in_flight(&self) -> (u64, u64) {
        (
            self.next_seq.saturating_sub(self.done_seq),
            self.recv_next.saturating_sub(self.recv_done),
        )
    }

    fn post_drain_request(&mut self) {
        Channel::post_drain_request(self);
    }

    fn poll_once(&mut self) -> Result<usize, ProviderError> {
        Channel::poll_once(self)
    }

    fn snooze(&mut self) {
        self.backoff.snooze();
    }

    fn flush_limit(&self) -> (crate::poll::StaticClock, core::time::Duration) {
        (self.clock, self.flush_timeout)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_receive_wait_polls_the_send_queue_every_clock_every_th_empty_poll_without_overflow() {
        for e in 0..3 * CLOCK_EVERY {
            assert_eq!(
                recv_wait_polls_sends(e),
                e % CLOCK_EVERY == CLOCK_EVERY - 1,
                "{e}"
            );
        }
        // The count wraps after u32::MAX empty polls; the decision must too.
        assert!(recv_wait_polls_sends(u32::MAX));
        assert!(!recv_wait_polls_sends(u32::MAX - 1));
    }
}
