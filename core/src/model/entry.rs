//! Work-queue entries as the models store them, and the checks and copies that make one
//! from a work request at post time. Shared by [`SoftFabric`](super::SoftFabric) and the
//! net, which store the parts of an entry in different places (one array per entry, or
//! storage sized from the caps).

use crate::completion::{Completion, CompletionKind, WcStatus};
use crate::params::QpCaps;
use crate::provider::{ProviderError, Verb};
use crate::sge::Sge;
use crate::wr::{Opcode, SendFlags, WorkRequest, ATOMIC_LEN};

use super::{EINVAL, EOVERFLOW};

/// A scatter/gather entry as posted: resolved (by key) only when the request executes.
#[derive(Clone, Copy, Debug)]
pub(super) struct RawSge {
    pub(super) addr: u64,
    pub(super) len: u32,
    pub(super) key: u32,
}

pub(super) const NO_SGE: RawSge = RawSge {
    addr: 0,
    len: 0,
    key: 0,
};

impl RawSge {
    pub(super) fn of(s: &Sge<'_>) -> Self {
        Self {
            addr: s.addr(),
            len: s.len(),
            key: s.lkey(),
        }
    }
}

/// Everything of a send-queue entry but its local entries or inline bytes, which the model
/// keeps beside it.
#[derive(Clone, Copy, Debug)]
pub(super) struct SendHeader {
    pub(super) wr_id: u64,
    pub(super) opcode: Opcode,
    /// The remote address (the remote length is not kept: the device ignores it).
    pub(super) raddr: u64,
    pub(super) rkey: u32,
    pub(super) signaled: bool,
    /// Whether the payload is inline (`inline_len` bytes) rather than `nsge` entries.
    pub(super) inline: bool,
    pub(super) nsge: u8,
    pub(super) inline_len: u16,
    /// Whether the first attempt happened (later ones are retries).
    pub(super) tried: bool,
    pub(super) retries: u8,
}

pub(super) const NO_HEADER: SendHeader = SendHeader {
    wr_id: 0,
    opcode: Opcode::Send,
    raddr: 0,
    rkey: 0,
    signaled: false,
    inline: false,
    nsge: 0,
    inline_len: 0,
    tried: false,
    retries: 0,
};

/// Checks `wr` against `caps` before anything is stored: the `EINVAL` cases of a post (too
/// many entries, an inline read, an inline payload over the limit, an atomic without exactly
/// one 8-byte entry).
pub(super) fn check_send(caps: &QpCaps, wr: &WorkRequest<'_>) -> Result<(), i32> {
    if wr.sges.len() > caps.max_send_sge as usize {
        return Err(EINVAL);
    }
    if let Opcode::Atomic(_) = wr.opcode {
        // One 8-byte entry for the prior value, as the device requires (rxe refuses anything
        // else at post time).
        let one_word = matches!(wr.sges, [e] if e.len() == ATOMIC_LEN);
        if !one_word || wr.flags.contains(SendFlags::INLINE) {
            return Err(EINVAL);
        }
    }
    if wr.flags.contains(SendFlags::INLINE) {
        if wr.opcode == Opcode::Read {
            return Err(EINVAL);
        }
        let total: u64 = wr.sges.iter().map(|s| u64::from(s.len())).sum();
        if total > u64::from(caps.max_inline_data) {
            return Err(EINVAL);
        }
    }
    Ok(())
}

/// Writes a request that passed [`check_send`] into a model's entry storage: its entries
/// into `sges`, or its inline payload (copied now, as the device copies it at post time)
/// into `inline`. Returns the header.
///
/// # Safety
/// The posting contract: inline entries must name readable memory.
pub(super) unsafe fn build_send(
    wr: &WorkRequest<'_>,
    sges: &mut [RawSge],
    inline: &mut [u8],
) -> Result<SendHeader, i32> {
    let mut h = NO_HEADER;
    h.wr_id = wr.wr_id;
    h.opcode = wr.opcode;
    h.signaled = wr.flags.contains(SendFlags::SIGNALED);
    h.raddr = wr.remote.addr;
    h.rkey = wr.remote.rkey;
    if wr.flags.contains(SendFlags::INLINE) {
        h.inline = true;
        let mut at = 0usize;
        for s in wr.sges {
            let len = s.len() as usize;
            if len == 0 {
                continue;
            }
            let addr = usize::try_from(s.addr()).map_err(|_| EINVAL)?;
            let end = at.checked_add(len).ok_or(EINVAL)?;
            let dst = inline.get_mut(at..end).ok_or(EINVAL)?;
            let src = core::ptr::with_exposed_provenance::<u8>(addr);
            // SAFETY: the posting contract makes `addr..addr+len` of an inline entry readable
            // memory for the duration of the post; the engine makes inline entries from a
            // live slice with `as_ptr() as u64`, which exposes its provenance for
            // `with_exposed_provenance` to pick up. `dst` is the model's own storage, so the
            // ranges do not overlap.
            unsafe { core::ptr::copy_nonoverlapping(src, dst.as_mut_ptr(), len) };
            at = end;
        }
        h.inline_len = u16::try_from(at).map_err(|_| EINVAL)?;
    } else {
        let dst = sges.get_mut(..wr.sges.len()).ok_or(EINVAL)?;
        for (d, s) in dst.iter_mut().zip(wr.sges) {
            *d = RawSge::of(s);
        }
        h.nsge = u8::try_from(wr.sges.len()).map_err(|_| EINVAL)?;
    }
    Ok(h)
}

/// A completion of the queue pair numbered `qp_num` (error completions have kind `Other`,
/// as verbs leaves the opcode undefined).
pub(super) const fn completion(
    wr_id: u64,
    status: WcStatus,
    kind: CompletionKind,
    qp_num: u32,
) -> Completion {
    Completion {
        wr_id,
        status,
        vendor_err: 0,
        kind,
        byte_len: 0,
        imm: None,
        qp_num,
        timestamp: None,
    }
}

/// The requests a work queue holds, as a device counts them: posted, and retired by a
/// polled completion (a send completion retires every send before it). The same count for
/// the fabric's queue pairs, the net's and its datagram queue pairs.
#[derive(Clone, Copy, Debug)]
pub(super) struct Count {
    /// Requests posted; for a send queue also the position the next one takes.
    pub(super) posted: u64,
    /// Requests retired (for a send queue: every position before this one).
    pub(super) retired: u64,
}

impl Count {
    pub(super) const ZERO: Self = Self {
        posted: 0,
        retired: 0,
    };

    /// Slots in use.
    #[inline]
    pub(super) fn used(&self) -> u64 {
        self.posted - self.retired
    }

    /// A send completion of position `seq` was polled: it retires `seq` and every send
    /// before it (unsignaled ones included).
    #[inline]
    pub(super) fn retire_to(&mut self, seq: u64) {
        self.retired = self.retired.max(seq + 1);
    }
}

/// The poll of every completion queue of the models: `Err` once the queue overflowed (a
/// device's poll fails then), else up to `out.len()` completions, each popped by `next`
/// (which also retires the request the completion ends). Does not allocate.
pub(super) fn poll_into<T>(
    overflowed: bool,
    out: &mut [T],
    mut next: impl FnMut() -> Option<T>,
) -> Result<usize, ProviderError> {
    if overflowed {
        return Err(ProviderError {
            verb: Verb::PollCq,
            errno: EOVERFLOW,
        });
    }
    let mut n = 0;
    for slot in out.iter_mut() {
        let Some(c) = next() else { break };
        *slot = c;
        n += 1;
    }
    Ok(n)
}
