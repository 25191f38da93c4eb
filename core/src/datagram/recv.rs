//! Receiving: the pool of receive slots, polling, and handing datagrams over without their
//! network header.

use super::{destination, Datagram, DatagramError, Peer, Slot};
use crate::completion::{Completion, DatagramCompletion, WcStatus};
use crate::gid::Gid;
use crate::poll::{Backoff, Deadline, Patience};
use crate::provider::datagram::DatagramProvider;
use crate::provider::ProviderError;
use crate::wire::grh::{NetworkHeader, GRH_LEN};
use crate::wr::RecvRequest;

/// Receive work requests carry this bit and the slot index; sends their sequence number.
pub(super) const RECV_BIT: u64 = 1 << 63;
/// Completions taken per poll of each queue: a receive is handed over one at a time, and the
/// arrays are filled afresh on every (mostly empty) poll of a busy-polling wait.
const POLL_AT_ONCE: usize = 4;

/// Who sent a datagram.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Source {
    /// The sender's GID (zero when the datagram came without a network header: InfiniBand
    /// inside one subnet).
    pub gid: Gid,
    /// The sender's queue pair number.
    pub qpn: u32,
    /// The sender's LID (InfiniBand; 0 on RoCE).
    pub lid: u16,
    /// The Q_Key it carried: this endpoint's, always (the device drops datagrams with any
    /// other).
    pub qkey: u32,
    /// The multicast group it was sent to, or `None` if it was sent to this queue pair.
    pub group: Option<Gid>,
}

/// A datagram handed over by [`Datagram::recv`]: valid until the next call on the endpoint,
/// which re-posts its slot.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Received<'a> {
    /// The payload, without the 40-byte network header the device wrote in front of it.
    pub payload: &'a [u8],
    /// Who sent it.
    pub source: Source,
    /// The immediate it carried, if any.
    pub imm: Option<u32>,
}

impl<P: DatagramProvider, M: crate::memory::Region, B: Backoff, const N: usize>
    Datagram<P, M, B, N>
{
    /// Posts a receive into slot `i`.
    pub(super) fn post_slot(&mut self, i: usize) -> Result<(), DatagramError> {
        let at = i * self.slot_size;
        let sge = self
            .mem
            .sge_mut(at..at + GRH_LEN + self.mtu as usize)
            .ok_or(DatagramError::InvalidSetup {
                what: "a receive slot outside the memory",
            })?;
        // SgeMut and Sge have one layout; the receive entry is written by the device only.
        // SAFETY: the endpoint owns the memory and frees it only after the queue pair is
        // drained (or leaks it with the endpoint); the slot is read only after its receive
        // completed, and re-posted only after the reader's borrow ended (the next call).
        let entry = unsafe { crate::sge::Sge::from_raw(sge.addr(), sge.len(), sge.lkey()) };
        let wr = RecvRequest {
            wr_id: RECV_BIT | i as u64,
            sges: core::slice::from_ref(&entry),
        };
        // SAFETY: as above; the entry lies in memory with local write access that nothing
        // but this receive writes until its completion is polled.
        unsafe { self.p.post_recv(&[wr]) }.map_err(|f| DatagramError::Post { errno: f.errno })?;
        self.slots[i] = Slot::Posted;
        self.recv_outstanding += 1;
        Ok(())
    }

    /// Polls both completion queues once. Returns how many completions it took.
    pub(super) fn poll_once(&mut self) -> Result<usize, ProviderError> {
        let mut wc = [Completion::EMPTY; POLL_AT_ONCE];
        let n = self.p.poll_send(&mut wc)?;
        for c in &wc[..n] {
            self.on_send_completion(c);
        }
        if n > 0 {
            // In bulk, once per poll: the addresses whose last send is now done.
            self.let_go_of_sent();
        }
        let mut rc = [DatagramCompletion::EMPTY; POLL_AT_ONCE];
        let m = self.p.poll_recv(&mut rc)?;
        for c in &rc[..m] {
            self.on_recv_completion(c);
        }
        Ok(n + m)
    }

    fn on_send_completion(&mut self, c: &Completion) {
        // wr_ids are ours; anything else is ignored rather than trusted.
        if c.qp_num != self.qp_num || c.wr_id & super::recv::RECV_BIT != 0 {
            return;
        }
        if c.wr_id >= self.next_seq {
            return;
        }
        if !c.status.is_success() {
            self.break_with(false, c.status);
        }
        self.done_seq = self.done_seq.max(c.wr_id + 1);
    }

    fn on_recv_completion(&mut self, c: &DatagramCompletion) {
        let i = (c.wc.wr_id & !RECV_BIT) as usize;
        if c.wc.qp_num != self.qp_num || c.wc.wr_id & RECV_BIT == 0 || i >= self.recv_slots {
            return;
        }
        if self.slots[i] != Slot::Posted {
            // A completion for a slot that is not posted: not ours to believe.
            return;
        }
        self.slots[i] = Slot::Done(*c);
        self.recv_outstanding -= 1;
        match c.wc.status {
            WcStatus::Success => {}
            // The queue pair is in the error state: the endpoint broke before this.
            WcStatus::Flushed => self.break_with(true, WcStatus::Flushed),
            // A datagram longer than a slot: counted and re-posted when its turn comes.
            WcStatus::LocalLength => {}
            s => self.break_with(true, s),
        }
    }

    /// Re-posts the slots handed out (or whose post failed) behind the head, oldest
    /// first: the device fills receives in posting order, and the head follows ring order,
    /// so re-posting in ring order keeps the two the same.
    fn give_back(&mut self) -> Result<(), DatagramError> {
        if let Some(e) = self.failure() {
            return Err(e);
        }
        let n = self.recv_slots;
        let behind_head = |k: usize| (self.head + n - 1 - k) % n;
        let mut behind = 0;
        while behind < n && matches!(self.slots[behind_head(behind)], Slot::Lent | Slot::Idle) {
            behind += 1;
        }
        for k in (0..behind).rev() {
            self.post_slot((self.head + n - 1 - k) % n)?;
        }
        Ok(())
    }

    /// The slot of the next datagram, re-posting the previous one first: waits until
    /// `deadline` (the endpoint's timeout when `None`) if `wait`, else polls once.
    ///
    /// The deadline is checked at the top of every turn ([`Patience`]), whatever the last
    /// turn brought: a sender streaming datagrams this endpoint throws away (longer than a
    /// slot) must not hold a receive past its deadline. Without `wait`, one poll at most:
    /// a stream of such datagrams cannot keep `try_recv` looping either.
    fn next_datagram(
        &mut self,
        deadline: Option<Deadline>,
        wait: bool,
    ) -> Result<Option<(usize, DatagramCompletion)>, DatagramError> {
        self.give_back()?;
        self.backoff.reset();
        let (clock, timeout) = (self.clock, self.timeout);
        let started = wait.then(|| clock.now());
        let mut patience = Patience::new(deadline, timeout);
        let mut polled = false;
        loop {
            if let Slot::Done(c) = self.slots[self.head] {
                let i = self.head;
                self.head = (i + 1) % self.recv_slots;
                self.slots[i] = Slot::Lent;
                match c.wc.status {
                    WcStatus::Success => {
                        self.stats.received += 1;
                        return Ok(Some((i, c)));
                    }
                    WcStatus::LocalLength => {
                        // A datagram longer than a slot (a sender with a larger MTU): lost,
                        // counted, and its slot goes straight back.
                        self.stats.receive_errors += 1;
                        self.give_back()?;
                    }
                    status if status != WcStatus::Flushed => {
                        return Err(DatagramError::Failed {
                            recv: true,
                            status,
                            vendor_err: c.wc.vendor_err,
                        });
                    }
                    _ => {}
                }
            }
            if let Some(e) = self.failure() {
                return Err(e);
            }
            if !wait && polled {
                // Slots that completed in the one poll were looked at above, one per turn.
                if matches!(self.slots[self.head], Slot::Done(_)) {
                    continue;
                }
                return Ok(None);
            }
            if wait && patience.run_out(clock) {
                return Err(DatagramError::TimedOut {
                    waited: started.map_or(timeout, |s| clock.now().saturating_duration_since(s)),
                });
            }
            let took = match self.poll_once() {
                Ok(n) => n,
                Err(e) => {
                    self.break_with(false, WcStatus::General);
                    self.flush_and_drain();
                    return Err(DatagramError::Provider(e));
                }
            };
            polled = true;
            if took > 0 || !wait {
                self.backoff.reset();
                continue;
            }
            self.backoff
                .snooze_within(&mut || patience.remaining(clock));
        }
    }

    /// The datagram in slot `i`, which completed with `c`.
    fn received(&self, i: usize, c: &DatagramCompletion) -> Received<'_> {
        let at = i * self.slot_size;
        let mut grh = [0u8; GRH_LEN];
        let header = if c.grh && self.mem.read_into(at, &mut grh) {
            NetworkHeader::decode(&grh).ok()
        } else {
            None
        };
        let len = (c.wc.byte_len as usize)
            .saturating_sub(GRH_LEN)
            .min(self.mtu as usize);
        let start = at + GRH_LEN;
        // SAFETY: the slot's receive completed and the slot is re-posted only by the next
        // call, which needs the `&mut self` this borrow holds; the memory grants no remote
        // write access (checked at construction), so nothing else writes it meanwhile.
        let payload = unsafe { self.mem.slice_unchecked(start..start + len) }.unwrap_or(&[]);
        Received {
            payload,
            source: Source {
                gid: header.map_or(Gid::default(), |h| h.sgid),
                qpn: c.src_qp,
                lid: c.slid,
                qkey: self.qkey,
                group: header.and_then(|h| h.dgid.is_multicast().then_some(h.dgid)),
            },
            imm: c.wc.imm,
        }
    }

    /// Waits for the next datagram, at most [`DatagramConfig::timeout`](super::DatagramConfig)
    /// ([`DatagramError::TimedOut`], after which the endpoint is intact), and hands it over
    /// without its network header. Re-posts the slot of the previous datagram first. Does
    /// not allocate.
    pub fn recv(&mut self) -> Result<Received<'_>, DatagramError> {
        let (i, c) = self
            .next_datagram(None, true)?
            .ok_or(DatagramError::TimedOut {
                waited: self.timeout,
            })?;
        Ok(self.received(i, &c))
    }

    /// Like [`Datagram::recv`], waiting until `deadline` on the endpoint's clock. Does not
    /// allocate.
    pub fn recv_until(&mut self, deadline: Deadline) -> Result<Received<'_>, DatagramError> {
        let (i, c) = self
            .next_datagram(Some(deadline), true)?
            .ok_or(DatagramError::TimedOut {
                waited: self.timeout,
            })?;
        Ok(self.received(i, &c))
    }

    /// The next datagram if one arrived, without waiting (polls once). Does not allocate.
    pub fn try_recv(&mut self) -> Option<Result<Received<'_>, DatagramError>> {
        match self.next_datagram(None, false) {
            Ok(Some((i, c))) => Some(Ok(self.received(i, &c))),
            Ok(None) => None,
            Err(e) => Some(Err(e)),
        }
    }

    /// An address to answer the sender of a datagram with (setup: may allocate; keep it).
    /// It assumes the sender's queue pair takes this endpoint's Q_Key, the convention of
    /// endpoints that talk to each other; use [`Datagram::peer`] with its endpoint
    /// otherwise.
    pub fn reply_to(&mut self, from: &Source) -> Result<Peer<P::Address>, DatagramError> {
        let dest = destination(!from.gid.is_zero(), from.gid, from.lid);
        self.peer_at(dest, from.qpn, self.qkey, self.mtu)
    }
}
