//! Sending: inline or through a send slot, one post per datagram, selective signaling.

use super::{Datagram, DatagramError, Peer, MAX_PARTS};
use crate::completion::WcStatus;
use crate::memory::Region;
use crate::poll::{Backoff, Deadline, Patience};
use crate::provider::datagram::DatagramProvider;
use crate::sge::Sge;
use crate::wr::{DatagramRequest, SendFlags};

/// A signaled request with no data from the endpoint to itself (its address `dest`, its queue
/// pair `qpn`) under `qkey`: its completion retires the unsignaled sends posted before it
/// (`wait_sent` with a Q_Key the endpoint refuses, the drain with its own).
fn to_self<A>(wr_id: u64, dest: &A, qpn: u32, qkey: u32) -> DatagramRequest<'_, A> {
    DatagramRequest {
        wr_id,
        flags: SendFlags::SIGNALED,
        sges: &[],
        imm: None,
        dest,
        remote_qpn: qpn,
        remote_qkey: qkey,
    }
}

impl<P: DatagramProvider, M: Region, B: Backoff, const N: usize> Datagram<P, M, B, N> {
    /// Sends `payload` to `to`: inline when it fits the queue pair's inline limit, else
    /// copied into the next send slot. The bytes are free again when the call returns; the
    /// call waits only when the send queue or the send slot is still busy (at most the
    /// endpoint's timeout). A payload over the MTU (the smaller of this endpoint's and the
    /// peer's) is refused before anything is posted or copied ([`DatagramError::TooLarge`]),
    /// and so is a peer whose address this queue pair cannot use, one made by an endpoint on
    /// another protection domain ([`DatagramError::ForeignPeer`]). Delivery is not confirmed: see the
    /// [module docs](super). Does not allocate.
    #[inline]
    pub fn send(&mut self, to: &Peer<P::Address>, payload: &[u8]) -> Result<(), DatagramError> {
        self.send_parts(to, &[payload])
    }

    /// Sends the concatenation of up to [`MAX_PARTS`] slices as one datagram (a header and
    /// a body, say) without joining them first: gathered inline, or copied one after the
    /// other into a send slot. Otherwise as [`Datagram::send`]. Does not allocate.
    pub fn send_parts(
        &mut self,
        to: &Peer<P::Address>,
        parts: &[&[u8]],
    ) -> Result<(), DatagramError> {
        if let Some(e) = self.failure() {
            return Err(e);
        }
        if parts.len() > MAX_PARTS {
            return Err(DatagramError::TooManyParts {
                max: MAX_PARTS,
                got: parts.len(),
            });
        }
        let total: usize = parts.iter().map(|p| p.len()).sum();
        // This endpoint's MTU too: a peer made by another endpoint may allow more, and a
        // send slot holds this endpoint's MTU.
        let max = to.mtu.min(self.mtu);
        if total > max as usize {
            return Err(DatagramError::TooLarge { max, got: total });
        }
        if !self.p.owns(&to.address) {
            return Err(DatagramError::ForeignPeer);
        }
        if !self.fits() {
            self.wait_sends(Self::fits)?;
        }
        let mut same = self.make_room_to_hold(&to.address)?;
        let seq = self.next_seq;
        let inline = total <= self.caps.max_inline_data as usize
            && parts.len() <= self.caps.max_send_sge as usize;
        // SAFETY: placeholders, never posted: only the first `n` entries are.
        let mut sges = [unsafe { Sge::from_raw(0, 0, 0) }; MAX_PARTS];
        let mut flags = SendFlags::empty();
        let n;
        let mut stage = None;
        if inline {
            for (e, p) in sges.iter_mut().zip(parts) {
                // SAFETY: inline data is copied into the work request during the post, so
                // the device never reads it through this entry later, and needs no lkey.
                *e = unsafe { Sge::from_raw(p.as_ptr() as u64, p.len() as u32, 0) };
            }
            n = parts.len();
            flags |= SendFlags::INLINE;
            // Counted here, where it is known, and taken back if the post fails.
            self.stats.sent_inline += 1;
        } else {
            let j = self.next_stage;
            let prev = self.staged[j];
            if prev > self.done_seq {
                self.wait_sends(|s| s.done_seq >= prev)?;
                // The wait polled, and may have let go of the newest run's clone: then this
                // send starts a run of its own (`hold`), or it would be held by nothing.
                same &= self.newest.is_some();
            }
            let at = self.send_base + j * self.mtu as usize;
            let mut off = at;
            for p in parts {
                if !self.mem.write_from(off, p) {
                    return Err(DatagramError::InvalidSetup {
                        what: "a send slot outside the memory",
                    });
                }
                off += p.len();
            }
            sges[0] = self
                .mem
                .sge(at..at + total)
                .ok_or(DatagramError::InvalidSetup {
                    what: "a send slot outside the memory",
                })?;
            n = 1;
            stage = Some((j, prev));
            self.staged[j] = seq + 1;
            self.next_stage = (j + 1) % self.send_slots;
        }
        let since = self.since_signal;
        self.since_signal += 1;
        if self.since_signal >= self.signal_every {
            flags |= SendFlags::SIGNALED;
            self.since_signal = 0;
        }
        let wr = DatagramRequest {
            wr_id: seq,
            flags,
            sges: &sges[..n],
            imm: None,
            dest: &to.address,
            remote_qpn: to.qpn,
            remote_qkey: to.qkey,
        };
        // SAFETY: inline entries are copied during the post; a send slot is written by the
        // CPU only once the send that used it before has completed (`staged`), and the
        // endpoint frees the memory only after draining the queue pair.
        if let Err(f) = unsafe { self.p.post_send(&[wr]) } {
            self.stats.sent_inline -= u64::from(inline);
            if f.posted > 0 {
                // Refused, yet in the send queue (a driver whose doorbell failed after it
                // queued the request): the device may still send it from its slot, so it
                // stays counted, and its slot busy and its address held, like any request
                // posted.
                self.hold(&to.address, seq, same);
                self.next_seq += 1;
                return Err(DatagramError::Post { errno: f.errno });
            }
            // One request, refused: nothing was posted.
            self.since_signal = since;
            if let Some((j, prev)) = stage {
                self.staged[j] = prev;
                self.next_stage = j;
            }
            return Err(DatagramError::Post { errno: f.errno });
        }
        self.hold(&to.address, seq, same);
        self.next_seq += 1;
        self.stats.sent += 1;
        Ok(())
    }

    /// Waits until every datagram posted so far has left (at most the endpoint's timeout):
    /// call it before dropping an endpoint whose last datagrams matter, because dropping
    /// flushes whatever the device has not sent yet. If the last send was not signaled,
    /// posts one empty datagram to this endpoint itself with a Q_Key it does not accept (its
    /// own device drops it on arrival), whose completion retires the sends before it. Does
    /// not allocate.
    pub fn wait_sent(&mut self) -> Result<(), DatagramError> {
        if let Some(e) = self.failure() {
            return Err(e);
        }
        if self.since_signal > 0 {
            if !self.fits() {
                self.wait_sends(Self::fits)?;
            }
            let qkey = (self.qkey ^ 1) & 0x7fff_ffff;
            let wr = to_self(self.next_seq, &*self.drain_to, self.qp_num, qkey);
            // SAFETY: the request names no memory at all.
            if let Err(f) = unsafe { self.p.post_send(&[wr]) } {
                if f.posted > 0 {
                    // Refused, yet queued (a doorbell that failed after the request went
                    // in): it stays counted, or the next send would reuse its number and its
                    // completion would retire a send still in the queue.
                    self.next_seq += 1;
                    self.since_signal = 0;
                }
                return Err(DatagramError::Post { errno: f.errno });
            }
            self.next_seq += 1;
            self.since_signal = 0;
        }
        let last = self.next_seq;
        self.wait_sends(|s| s.done_seq >= last)
    }

    /// Makes sure a send to `address` can be held: returns whether it is the address of the
    /// newest run (which then covers it with one store, the common case of a stream to one
    /// peer). Otherwise the newest run moves to `held` after the post, so room is made there
    /// now: waits (at most the endpoint's timeout) only when `N` older runs still have sends
    /// in flight.
    #[inline]
    fn make_room_to_hold(&mut self, address: &P::Address) -> Result<bool, DatagramError> {
        if self
            .newest
            .as_ref()
            .is_some_and(|a| P::same_address(a, address))
        {
            return Ok(true);
        }
        self.make_room_for_another()?;
        Ok(false)
    }

    /// The slow side of `make_room_to_hold`: a send to another address than the newest run's.
    #[inline(never)]
    fn make_room_for_another(&mut self) -> Result<(), DatagramError> {
        self.let_go_of_sent();
        if self.newest.is_some() && self.held.is_full() {
            // A poll lets go of what completed, so room may come from it or from here.
            self.wait_sends(|s| {
                !s.held.is_full() || s.held.front().is_some_and(|&(_, last)| last < s.done_seq)
            })?;
            self.let_go_of_sent();
        }
        Ok(())
    }

    /// Records that send `seq` names `address` (room was made by `make_room_to_hold`, which
    /// said whether it is the newest run's address: `same`).
    #[inline]
    fn hold(&mut self, address: &P::Address, seq: u64, same: bool) {
        if same {
            self.newest_last = seq;
            return;
        }
        self.hold_another(address, seq);
    }

    /// Starts a new newest run with a clone of `address`, the old one moving to `held`.
    #[inline(never)]
    fn hold_another(&mut self, address: &P::Address, seq: u64) {
        if let Some(old) = self.newest.take() {
            // Room was made before the post; if it were not there, keeping the send counted
            // matters more than the clone, and the endpoint breaks rather than send on.
            if let Err(old) = self.held.push_back((old, self.newest_last)) {
                // Leaked rather than dropped: a send may still name it, and the endpoint,
                // broken from here on, no longer knows when it is done.
                core::mem::forget(old);
                self.break_with(false, WcStatus::General);
            }
        }
        self.newest = Some(address.clone());
        self.newest_last = seq;
    }

    /// Drops the clones of addresses whose last send has completed (older runs first, then
    /// the newest run). Called when completions were polled and before a new run starts.
    #[inline]
    pub(super) fn let_go_of_sent(&mut self) {
        while self
            .held
            .front()
            .is_some_and(|&(_, last)| last < self.done_seq)
        {
            self.held.pop_front();
        }
        if self.newest.is_some() && self.newest_last < self.done_seq {
            self.newest = None;
        }
    }

    /// Whether one more send fits next to those not yet retired.
    #[inline]
    fn fits(&self) -> bool {
        self.next_seq - self.done_seq < self.sq_depth
    }

    /// Polls until `done`, at most the endpoint's timeout; if the device does not complete
    /// the sends in time (or a poll fails), flushes and drains the queue pair and breaks
    /// the endpoint.
    fn wait_sends(&mut self, done: impl Fn(&Self) -> bool) -> Result<(), DatagramError> {
        self.backoff.reset();
        let (clock, timeout) = (self.clock, self.timeout);
        let mut patience = Patience::until(Deadline::after(clock, timeout));
        loop {
            if done(self) {
                return Ok(());
            }
            if let Some(e) = self.failure() {
                return Err(e);
            }
            // Checked whatever the last turn took: receives completing keep a poll busy
            // without freeing a send.
            if patience.run_out(clock) {
                let outstanding = self.outstanding_sends();
                self.break_with(false, WcStatus::General);
                self.flush_and_drain();
                return Err(DatagramError::SendsStuck { outstanding });
            }
            match self.poll_once() {
                Ok(0) => {}
                Ok(_) => {
                    self.backoff.reset();
                    continue;
                }
                Err(e) => {
                    self.break_with(false, WcStatus::General);
                    self.flush_and_drain();
                    return Err(DatagramError::Provider(e));
                }
            }
            self.backoff
                .snooze_within(&mut || patience.remaining(clock));
        }
    }

    /// Posts one signaled request with no data, to this endpoint itself, to the queue pair
    /// in the error state (the verbs drain idiom): it completes flushed after everything
    /// posted before it, retiring unsignaled sends that will never complete on their own.
    pub(super) fn post_drain_request(&mut self) {
        let wr = to_self(self.next_seq, &*self.drain_to, self.qp_num, self.qkey);
        // SAFETY: the request names no memory at all.
        match unsafe { self.p.post_send(&[wr]) } {
            // Queued, even if the post reports a failure after that: counted, so the drain
            // waits for its completion.
            Ok(()) => self.next_seq += 1,
            Err(f) if f.posted > 0 => self.next_seq += 1,
            Err(_) => {}
        }
    }
}
