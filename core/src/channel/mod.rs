//! [`Channel`]: one reliable connection to one peer, posted and polled by one thread.
//!
//! # Posting styles
//! - **Blocking**: [`Channel::send`], [`Channel::write`], [`Channel::read`],
//!   [`Channel::recv`], ... post one request and poll until it completes. The borrow of the
//!   buffers ends when the call returns, and so does the device's use of them.
//! - **Batched**: [`Channel::batch`] collects up to [`MAX_BATCH`] requests and posts them
//!   with one doorbell ([`Batch::submit_and_wait`]), signaling only every k-th request.
//! - **Scoped**: [`Channel::scope`] lets a closure post and wait for requests one by one;
//!   buffers are borrowed for the whole scope, and the scope polls whatever the closure left
//!   before it returns, even on panic (like `std::thread::scope`).
//! - **Unpolled**: [`Batch::submit`] is `unsafe`: the caller upholds the
//!   [posting contract](crate#the-posting-contract) and later calls [`Channel::wait`].
//!
//! # Completion tracking
//! Send requests get consecutive sequence numbers as their `wr_id`. RC completes a send
//! queue in order, so one signaled completion retires every request before it: the channel
//! keeps only "everything below `done` has completed" and the first failure, no map. A send
//! queue slot is reused only after a signaled completion at or past it has been polled.
//! Receives complete in order too; their results go to a fixed slot table indexed by
//! sequence number modulo `R`.
//!
//! Nothing here allocates.

mod batch;
mod error;
mod scope;

pub use batch::{Batch, Ticket};
pub use error::{ChannelError, WrFailure};
pub use scope::{Pending, PendingRecv, Scope};

use core::fmt;
use core::time::Duration;

use crate::completion::{Completion, WcStatus};
use crate::params::QpCaps;
use crate::poll::{Backoff, Clock, Deadline, Spin};
use crate::provider::Provider;
use crate::sge::{RemoteMemory, Sge, SgeMut};
use crate::wr::{Opcode, RecvRequest, SendFlags, WorkRequest, MAX_BATCH};

const RECV_BIT: u64 = 1 << 63;
const POLL_AT_ONCE: usize = 16;

/// Channel settings.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct ChannelConfig {
    /// Signal (ask for a completion of) every k-th send request. The last request of every
    /// post is signaled too, so waiting for it is always possible. Clamped so that a full
    /// batch always fits in the send queue.
    pub signal_every: u32,
}

impl Default for ChannelConfig {
    fn default() -> Self {
        Self { signal_every: 16 }
    }
}

/// Names one posted receive, to wait for it with [`Channel::wait_recv`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[must_use = "wait for the receive before touching its buffers"]
pub struct RecvTicket(u64);

/// What a completed receive delivered.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RecvInfo {
    /// Bytes received.
    pub byte_len: u32,
    /// The immediate, for sends and writes with immediate.
    pub imm: Option<u32>,
}

#[derive(Clone, Copy, Debug)]
struct RecvSlot {
    info: RecvInfo,
    status: WcStatus,
    vendor_err: u32,
    /// Whether the result in this slot was handed out (or will never be asked for), so the
    /// slot may take the next receive.
    taken: bool,
}

const EMPTY_SLOT: RecvSlot = RecvSlot {
    info: RecvInfo {
        byte_len: 0,
        imm: None,
    },
    status: WcStatus::Success,
    vendor_err: 0,
    taken: true,
};

/// Why the channel broke.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Broken {
    Wr(WrFailure),
    TimedOut,
}

/// One connection to one peer. See the [module docs](self).
///
/// `P` is the provider (a real queue pair, or the in-memory model), `B` what waiting loops do
/// between empty polls, and `R` the number of receive slots (a power of two is cheapest).
pub struct Channel<P: Provider, B: Backoff = Spin, const R: usize = 64> {
    p: P,
    caps: QpCaps,
    backoff: B,
    sq_depth: u64,
    signal_every: u32,
    max_post: usize,
    next_seq: u64,
    done_seq: u64,
    since_signal: u32,
    broken: Option<Broken>,
    recv_next: u64,
    recv_done: u64,
    recv_cap: u64,
    slots: [RecvSlot; R],
}

impl<P: Provider + fmt::Debug, B: Backoff, const R: usize> fmt::Debug for Channel<P, B, R> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Channel")
            .field("provider", &self.p)
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
    /// A channel over a connected provider, spinning while it waits.
    pub fn new(p: P, cfg: ChannelConfig) -> Self {
        Channel::with_backoff(p, cfg, Spin)
    }
}

impl<P: Provider, B: Backoff, const R: usize> Channel<P, B, R> {
    /// A channel that calls `backoff` between empty polls (see [`crate::poll::backoff`]).
    pub fn with_backoff(p: P, cfg: ChannelConfig, backoff: B) -> Self {
        let caps = p.caps();
        let depth = caps.max_send_wr.max(1);
        // A post of n requests needs n free slots while up to k-1 unsignaled ones may still
        // occupy slots nobody will retire: keep n + k - 1 <= depth. Small queues give up
        // half their depth to the signaling interval rather than signal every request.
        let k = cfg.signal_every.clamp(1, (depth / 2).max(1));
        let max_post = ((depth - k + 1) as usize).min(MAX_BATCH);
        Self {
            p,
            caps,
            backoff,
            sq_depth: u64::from(depth),
            signal_every: k,
            max_post,
            next_seq: 0,
            done_seq: 0,
            since_signal: 0,
            broken: None,
            recv_next: 0,
            recv_done: 0,
            recv_cap: (R as u64).min(u64::from(caps.max_recv_wr)),
            slots: [EMPTY_SLOT; R],
        }
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

    /// The provider, for inspection.
    #[inline]
    pub fn provider(&self) -> &P {
        &self.p
    }

    /// The first failure, if the channel is broken.
    pub fn failure(&self) -> Option<ChannelError> {
        self.broken.map(|b| match b {
            Broken::Wr(w) => ChannelError::Broken(w),
            Broken::TimedOut => ChannelError::TimedOut,
        })
    }

    /// Send requests posted and not yet known complete.
    #[inline]
    pub fn outstanding_sends(&self) -> u64 {
        self.next_seq - self.done_seq
    }

    /// Receives posted and not yet complete.
    #[inline]
    pub fn outstanding_recvs(&self) -> u64 {
        self.recv_next - self.recv_done
    }

    /// Polls both completion queues once and retires what completed. Returns the number of
    /// completions seen. Does not allocate.
    pub fn poll(&mut self) -> Result<usize, ChannelError> {
        let mut wc = [Completion::EMPTY; POLL_AT_ONCE];
        let n = self.p.poll_send(&mut wc)?;
        for c in &wc[..n] {
            self.on_send_completion(c);
        }
        let m = self.p.poll_recv(&mut wc)?;
        for c in &wc[..m] {
            self.on_recv_completion(c);
        }
        Ok(n + m)
    }

    fn on_send_completion(&mut self, c: &Completion) {
        // wr_ids are ours; anything beyond what we posted is ignored rather than trusted.
        if c.wr_id >= self.next_seq {
            return;
        }
        if !c.status.is_success() && self.broken.is_none() {
            self.broken = Some(Broken::Wr(WrFailure {
                wr_id: c.wr_id,
                status: c.status,
                vendor_err: c.vendor_err,
            }));
        }
        self.done_seq = self.done_seq.max(c.wr_id + 1);
    }

    fn on_recv_completion(&mut self, c: &Completion) {
        let r = c.wr_id & !RECV_BIT;
        if c.wr_id & RECV_BIT == 0 || r >= self.recv_next || R == 0 {
            return;
        }
        self.slots[(r % R as u64) as usize] = RecvSlot {
            info: RecvInfo {
                byte_len: c.byte_len,
                imm: c.imm,
            },
            status: c.status,
            vendor_err: c.vendor_err,
            taken: false,
        };
        if !c.status.is_success() && self.broken.is_none() {
            self.broken = Some(Broken::Wr(WrFailure {
                wr_id: c.wr_id,
                status: c.status,
                vendor_err: c.vendor_err,
            }));
        }
        self.recv_done = self.recv_done.max(r + 1);
    }

    fn wait_until(
        &mut self,
        done: impl Fn(&Self) -> bool,
        deadline: Option<(&dyn Clock, Deadline)>,
    ) -> Result<(), ChannelError> {
        self.backoff.reset();
        loop {
            if done(self) {
                return Ok(());
            }
            if self.poll()? > 0 {
                self.backoff.reset();
                continue;
            }
            if let Some((clock, d)) = deadline {
                if d.passed(clock) {
                    self.abort_on_timeout()?;
                    // Everything outstanding is flushed now; wait for the flush so no buffer
                    // is handed back while the device could still touch it.
                    return Err(self
                        .drain_after_break(done)
                        .unwrap_or(ChannelError::TimedOut));
                }
            }
            self.backoff.snooze();
        }
    }

    fn abort_on_timeout(&mut self) -> Result<(), ChannelError> {
        if self.broken.is_none() {
            self.broken = Some(Broken::TimedOut);
        }
        self.p.set_error()?;
        Ok(())
    }

    fn drain_after_break(&mut self, done: impl Fn(&Self) -> bool) -> Option<ChannelError> {
        while !(done(self) && self.all_done()) {
            if let Err(e) = self.poll() {
                return Some(e);
            }
            self.backoff.snooze();
        }
        None
    }

    /// Forgets every completed receive result nobody asked for (a scope that ended).
    fn release_recv_results(&mut self) {
        for s in self.slots.iter_mut() {
            s.taken = true;
        }
    }

    fn all_done(&self) -> bool {
        self.done_seq >= self.next_seq && self.recv_done >= self.recv_next
    }

    /// Waits until the requests of `ticket` completed. Does not allocate.
    pub fn wait(&mut self, ticket: Ticket) -> Result<(), ChannelError> {
        let last = ticket.last_seq;
        self.wait_until(|c| c.done_seq > last, None)?;
        self.check_send(ticket.first_seq, last)
    }

    /// Waits until everything posted has completed.
    pub fn wait_all(&mut self) -> Result<(), ChannelError> {
        self.wait_until(Self::all_done, None)?;
        match self.broken {
            None => Ok(()),
            Some(_) => Err(self.failure().unwrap_or(ChannelError::TimedOut)),
        }
    }

    fn check_send(&self, first: u64, last: u64) -> Result<(), ChannelError> {
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
            Some(_) => Err(self.failure().unwrap_or(ChannelError::TimedOut)),
        }
    }

    fn failure_seq(&self) -> u64 {
        match self.broken {
            Some(Broken::Wr(w)) if w.wr_id & RECV_BIT == 0 => w.wr_id,
            _ => 0,
        }
    }

    /// Posts `wrs` (assigning ids and signal flags) with one doorbell; returns the ticket.
    ///
    /// # Safety
    /// The posting contract for every buffer the requests name.
    unsafe fn post_send_wrs(
        &mut self,
        wrs: &mut [WorkRequest<'_>],
    ) -> Result<Ticket, ChannelError> {
        if let Some(e) = self.failure() {
            return Err(e);
        }
        let n = wrs.len();
        debug_assert!(n > 0 && n <= self.max_post);
        let need = n as u64;
        // Retire completed requests until n slots are free.
        if self.next_seq + need - self.done_seq > self.sq_depth {
            let (depth, next) = (self.sq_depth, self.next_seq);
            self.wait_until(|c| next + need - c.done_seq <= depth, None)?;
            if let Some(e) = self.failure() {
                return Err(e);
            }
        }
        let first = self.next_seq;
        for (i, w) in wrs.iter_mut().enumerate() {
            w.wr_id = first + i as u64;
            self.since_signal += 1;
            let asked = w.flags.contains(SendFlags::SIGNALED);
            if asked || i + 1 == n || self.since_signal >= self.signal_every {
                w.flags |= SendFlags::SIGNALED;
            } else {
                w.flags &= !SendFlags::SIGNALED;
            }
            if w.flags.contains(SendFlags::SIGNALED) {
                self.since_signal = 0;
            }
        }
        // SAFETY: forwarded contract.
        match unsafe { self.p.post_send(wrs) } {
            Ok(()) => {
                self.next_seq += need;
                Ok(Ticket {
                    first_seq: first,
                    last_seq: first + need - 1,
                })
            }
            Err(f) => {
                self.next_seq += f.posted as u64;
                if f.posted > 0 {
                    // The posted prefix may end unsignaled: flush it so it completes.
                    self.broken.get_or_insert(Broken::Wr(WrFailure {
                        wr_id: first + f.posted as u64,
                        status: WcStatus::General,
                        vendor_err: 0,
                    }));
                    self.p.set_error()?;
                    let _ = self.drain_after_break(|_| true);
                }
                Err(ChannelError::Post { errno: f.errno })
            }
        }
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
        if let Some(e) = self.failure() {
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

    fn recv_result(&mut self, r: u64) -> Result<RecvInfo, ChannelError> {
        let slot = &mut self.slots[(r % R as u64) as usize];
        slot.taken = true;
        let slot = *slot;
        if slot.status.is_success() {
            Ok(slot.info)
        } else {
            let w = WrFailure {
                wr_id: r | RECV_BIT,
                status: slot.status,
                vendor_err: slot.vendor_err,
            };
            match self.broken {
                Some(Broken::TimedOut) => Err(ChannelError::TimedOut),
                Some(Broken::Wr(first)) if first != w && slot.status == WcStatus::Flushed => {
                    Err(ChannelError::Broken(first))
                }
                _ => Err(ChannelError::Failed(w)),
            }
        }
    }

    fn wait_recv_seq(
        &mut self,
        r: u64,
        deadline: Option<(&dyn Clock, Deadline)>,
    ) -> Result<RecvInfo, ChannelError> {
        match self.wait_until(|c| c.recv_done > r, deadline) {
            Ok(()) => self.recv_result(r),
            Err(e) => Err(e),
        }
    }

    fn one(
        &mut self,
        opcode: Opcode,
        flags: SendFlags,
        sges: &[Sge<'_>],
        remote: RemoteMemory,
    ) -> Result<(), ChannelError> {
        self.check_sges(sges.len(), self.caps.max_send_sge)?;
        let mut wr = [WorkRequest {
            wr_id: 0,
            opcode,
            flags,
            sges,
            remote,
        }];
        // SAFETY: the buffers are borrowed for this call, and we wait for the completion (or
        // the flush) before returning.
        let t = unsafe { self.post_send_wrs(&mut wr) }?;
        self.wait(t)
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

    /// Sends with a 32-bit immediate. Does not allocate.
    pub fn send_imm(&mut self, sges: &[Sge<'_>], imm: u32) -> Result<(), ChannelError> {
        self.one(
            Opcode::SendImm(imm),
            SendFlags::empty(),
            sges,
            RemoteMemory::default(),
        )
    }

    /// Sends `data` inline (copied into the work request; no registered memory needed), up to
    /// the queue pair's inline limit. Does not allocate.
    pub fn send_inline(&mut self, data: &[u8]) -> Result<(), ChannelError> {
        let sge = self.inline_sge(data)?;
        self.one(
            Opcode::Send,
            SendFlags::INLINE,
            &[sge],
            RemoteMemory::default(),
        )
    }

    /// Writes `sges` into the peer's `remote` memory and waits. Does not allocate.
    pub fn write(&mut self, sges: &[Sge<'_>], remote: RemoteMemory) -> Result<(), ChannelError> {
        self.one(Opcode::Write, SendFlags::empty(), sges, remote)
    }

    /// Writes `data` inline into the peer's `remote` memory. Does not allocate.
    pub fn write_inline(&mut self, data: &[u8], remote: RemoteMemory) -> Result<(), ChannelError> {
        let sge = self.inline_sge(data)?;
        self.one(Opcode::Write, SendFlags::INLINE, &[sge], remote)
    }

    /// Posts an inline send of `data` and returns without waiting (see
    /// [`Channel::write_inline_nowait`]). The peer must have a receive posted. Does not
    /// allocate.
    pub fn send_inline_nowait(&mut self, data: &[u8]) -> Result<(), ChannelError> {
        self.post_inline_nowait(Opcode::Send, data, RemoteMemory::default())
    }

    /// Posts an inline write of `data` into the peer's `remote` memory and returns without
    /// waiting. Safe, because inline data is copied into the work request during the post;
    /// a failure shows up on a later call (the channel is then broken). Does not allocate.
    pub fn write_inline_nowait(
        &mut self,
        data: &[u8],
        remote: RemoteMemory,
    ) -> Result<(), ChannelError> {
        self.post_inline_nowait(Opcode::Write, data, remote)
    }

    /// Posts one inline request without waiting: the one place the `*_inline_nowait` calls
    /// reach the provider.
    fn post_inline_nowait(
        &mut self,
        opcode: Opcode,
        data: &[u8],
        remote: RemoteMemory,
    ) -> Result<(), ChannelError> {
        let sge = [self.inline_sge(data)?];
        let mut wr = [WorkRequest {
            wr_id: 0,
            opcode,
            flags: SendFlags::INLINE,
            sges: &sge,
            remote,
        }];
        // SAFETY: inline payloads are copied during the post; no local buffer is named
        // afterwards, and remote memory is the peer's business.
        unsafe { self.post_send_wrs(&mut wr) }.map(|_| ())
    }

    /// Writes with an immediate (consumes one receive at the peer). Does not allocate.
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

    /// Posts a receive into `sges` and waits for a message. Does not allocate.
    ///
    /// Waits forever if the peer never sends; see [`Channel::recv_timeout`].
    pub fn recv(&mut self, sges: &mut [SgeMut<'_>]) -> Result<RecvInfo, ChannelError> {
        // SAFETY: sges is borrowed mutably for this call, and we wait for the completion.
        let r = unsafe { self.post_recv_sges(as_gather(sges)) }?;
        self.wait_recv_seq(r, None)
    }

    /// Like [`Channel::recv`], but gives up after `timeout` on `clock`: the channel is then
    /// broken (its queue pair flushed, so the buffer is safe to reuse) and must be rebuilt.
    pub fn recv_timeout<C: Clock>(
        &mut self,
        sges: &mut [SgeMut<'_>],
        clock: &C,
        timeout: Duration,
    ) -> Result<RecvInfo, ChannelError> {
        // SAFETY: as in recv; on timeout we flush and wait for the flush before returning.
        let r = unsafe { self.post_recv_sges(as_gather(sges)) }?;
        self.wait_recv_seq(r, Some((clock, Deadline::after(clock, timeout))))
    }

    /// Posts a receive without waiting for it; wait with [`Channel::wait_recv`].
    /// Does not allocate.
    ///
    /// # Safety
    /// The [posting contract](crate#the-posting-contract): the scatter buffers belong to the
    /// device until their receive completed (or the channel was flushed and drained).
    pub unsafe fn post_recv_unpolled(
        &mut self,
        sges: &mut [SgeMut<'_>],
    ) -> Result<RecvTicket, ChannelError> {
        // SAFETY: forwarded to the caller.
        unsafe { self.post_recv_sges(as_gather(sges)) }.map(RecvTicket)
    }

    /// The result of receive `t` if it has completed (handing it out frees its slot), or
    /// `None` if it is still outstanding. Never waits. Does not allocate.
    pub fn try_recv(&mut self, t: RecvTicket) -> Option<Result<RecvInfo, ChannelError>> {
        (self.recv_done > t.0).then(|| self.recv_result(t.0))
    }

    /// How many send requests have completed since the channel was made (every request
    /// below this count is done). Grows as [`Channel::poll`] sees completions.
    #[inline]
    pub fn sends_completed(&self) -> u64 {
        self.done_seq
    }

    /// The most recently posted receive, if it has not completed yet.
    pub fn last_pending_recv(&self) -> Option<RecvTicket> {
        (self.recv_next > self.recv_done).then(|| RecvTicket(self.recv_next - 1))
    }

    /// Waits for a receive and returns what it delivered. Does not allocate. Waits forever
    /// if the peer never sends; see [`Channel::wait_recv_until`].
    pub fn wait_recv(&mut self, t: RecvTicket) -> Result<RecvInfo, ChannelError> {
        self.wait_recv_seq(t.0, None)
    }

    /// Like [`Channel::wait_recv`] with a deadline on `clock`; on timeout the channel is
    /// flushed, drained and broken.
    pub fn wait_recv_until<C: Clock>(
        &mut self,
        t: RecvTicket,
        clock: &C,
        deadline: Deadline,
    ) -> Result<RecvInfo, ChannelError> {
        self.wait_recv_seq(t.0, Some((clock, deadline)))
    }

    /// Starts a batch: up to [`Channel::max_post`] requests posted with one doorbell.
    pub fn batch<'b>(&mut self) -> Batch<'_, 'b, P, B, R> {
        Batch::new(self)
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
