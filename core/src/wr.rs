//! Work requests in a provider-neutral form: what the engine hands a provider to post.

use bitflags::bitflags;

use crate::sge::{RemoteMemory, Sge};

/// Most work requests one post rings one doorbell for.
pub const MAX_BATCH: usize = 64;

bitflags! {
    /// Per-work-request flags.
    #[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
    pub struct SendFlags: u32 {
        /// Wait for earlier RDMA reads and atomics on this QP before starting.
        const FENCE = 1;
        /// Produce a completion for this request.
        const SIGNALED = 2;
        /// Wake a receiver that waits for solicited events only.
        const SOLICITED = 4;
        /// Copy the payload into the work request (no lkey needed; bounded by the QP's
        /// inline limit): the buffer is reusable as soon as the post returns.
        const INLINE = 8;
    }
}

/// The operation of a send-queue work request.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Opcode {
    /// Two-sided send: consumes one receive at the peer.
    Send,
    /// Send with a 32-bit immediate delivered in the peer's receive completion.
    SendImm(u32),
    /// One-sided write into `remote`.
    Write,
    /// Write with an immediate: also consumes one receive at the peer, which learns the
    /// immediate (and the write is visible when that completion is seen).
    WriteImm(u32),
    /// One-sided read from `remote` into the scatter list.
    Read,
}

impl Opcode {
    /// Whether the operation names remote memory.
    #[inline]
    pub const fn is_rdma(self) -> bool {
        matches!(self, Self::Write | Self::WriteImm(_) | Self::Read)
    }

    /// Whether the operation consumes a receive at the peer.
    #[inline]
    pub const fn consumes_remote_recv(self) -> bool {
        matches!(self, Self::Send | Self::SendImm(_) | Self::WriteImm(_))
    }
}

/// One send-queue work request.
#[derive(Clone, Copy, Debug)]
pub struct WorkRequest<'a> {
    /// Identifier returned in the completion.
    pub wr_id: u64,
    /// The operation.
    pub opcode: Opcode,
    /// Flags.
    pub flags: SendFlags,
    /// Local memory: read by the device for sends and writes, written for reads.
    pub sges: &'a [Sge<'a>],
    /// Remote memory for writes and reads (ignored for sends).
    pub remote: RemoteMemory,
}

/// One receive-queue work request. The scatter list is written by the device.
#[derive(Clone, Copy, Debug)]
pub struct RecvRequest<'a> {
    /// Identifier returned in the completion.
    pub wr_id: u64,
    /// Where the message lands (same layout as [`crate::sge::SgeMut`]).
    pub sges: &'a [Sge<'a>],
}

/// A post that the device refused.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PostFailure {
    /// How many requests of the batch were posted before the one that failed.
    pub posted: usize,
    /// The errno (`ENOMEM`: queue full; `EINVAL`: a bad request).
    pub errno: i32,
}
