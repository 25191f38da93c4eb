//! Work requests in a provider-neutral form: what the engine hands a provider to post.

use core::fmt;

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
///
/// A one-byte tag (`repr(u8)`) rather than a niche in the atomic's fields: posting reads the
/// operation of every request, and a byte is decoded with one load.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(u8)]
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
    /// Remote atomic on the 8 bytes at `remote.addr`; the prior value lands in the one
    /// 8-byte scatter entry. Build it with [`WorkRequest::atomic`], which checks it.
    Atomic(AtomicOp),
}

/// A remote atomic operation on an 8-byte, 8-aligned word of the peer's memory, atomic with
/// respect to every other atomic on that memory through the same device. The word is read
/// and written in little-endian order (the host order of every platform rverbs supports, and
/// what SoftRoCE uses); the value it held before the operation is returned.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum AtomicOp {
    /// If the word equals `compare`, replace it with `swap` (`IBV_WR_ATOMIC_CMP_AND_SWP`).
    CompareSwap {
        /// The value the word must hold for the swap to happen.
        compare: u64,
        /// The value written if it does.
        swap: u64,
    },
    /// Add to the word, wrapping (`IBV_WR_ATOMIC_FETCH_AND_ADD`).
    FetchAdd(u64),
}

impl AtomicOp {
    /// The word after the operation, given the word before it.
    #[inline]
    pub const fn apply(self, prior: u64) -> u64 {
        match self {
            Self::CompareSwap { compare, swap } if prior == compare => swap,
            Self::CompareSwap { .. } => prior,
            Self::FetchAdd(add) => prior.wrapping_add(add),
        }
    }
}

/// Bytes an atomic operates on, remotely and in the local result buffer.
pub const ATOMIC_LEN: u32 = 8;

/// Why an atomic was refused before posting (nothing was posted).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum AtomicFault {
    /// The remote address is not 8-byte aligned.
    RemoteMisaligned {
        /// The remote address.
        addr: u64,
    },
    /// The remote memory is shorter than the 8 bytes an atomic touches.
    RemoteTooShort {
        /// Its length.
        len: u64,
    },
    /// The local result buffer is not 8-byte aligned.
    ResultMisaligned {
        /// Its address.
        addr: u64,
    },
    /// The local result buffer is not exactly 8 bytes long.
    ResultLength {
        /// Its length.
        len: u32,
    },
}

impl fmt::Display for AtomicFault {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::RemoteMisaligned { addr } => {
                write!(f, "remote address {addr:#x} is not 8-byte aligned")
            }
            Self::RemoteTooShort { len } => {
                write!(f, "remote memory of {len} bytes is shorter than 8")
            }
            Self::ResultMisaligned { addr } => {
                write!(f, "result buffer at {addr:#x} is not 8-byte aligned")
            }
            Self::ResultLength { len } => {
                write!(
                    f,
                    "result buffer of {len} bytes, an atomic returns exactly 8"
                )
            }
        }
    }
}

impl core::error::Error for AtomicFault {}

/// Checks an atomic's target and result buffer: both 8-byte aligned, the remote at least and
/// the result exactly 8 bytes. (Access is checked elsewhere: the result entry has local write
/// access by construction, and the responder enforces `REMOTE_ATOMIC`.) Does not allocate.
#[inline]
pub const fn check_atomic(result: &Sge<'_>, remote: &RemoteMemory) -> Result<(), AtomicFault> {
    if !remote.addr.is_multiple_of(8) {
        Err(AtomicFault::RemoteMisaligned { addr: remote.addr })
    } else if remote.len < ATOMIC_LEN as u64 {
        Err(AtomicFault::RemoteTooShort { len: remote.len })
    } else if !result.addr().is_multiple_of(8) {
        Err(AtomicFault::ResultMisaligned {
            addr: result.addr(),
        })
    } else if result.len() != ATOMIC_LEN {
        Err(AtomicFault::ResultLength { len: result.len() })
    } else {
        Ok(())
    }
}

impl Opcode {
    /// Whether the operation names remote memory.
    #[inline]
    pub const fn is_rdma(self) -> bool {
        matches!(
            self,
            Self::Write | Self::WriteImm(_) | Self::Read | Self::Atomic(_)
        )
    }

    /// Whether the device writes the local entries (reads and atomics).
    #[inline]
    pub const fn writes_local(self) -> bool {
        matches!(self, Self::Read | Self::Atomic(_))
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

impl<'a> WorkRequest<'a> {
    /// A request with id 0 (a channel assigns ids and the signaled flag when it posts).
    #[inline]
    pub const fn new(
        opcode: Opcode,
        flags: SendFlags,
        sges: &'a [Sge<'a>],
        remote: RemoteMemory,
    ) -> Self {
        Self {
            wr_id: 0,
            opcode,
            flags,
            sges,
            remote,
        }
    }

    /// The one place an atomic request is made: `op` on the 8 bytes at `remote.addr`, the
    /// prior value landing in `result` (an entry the device writes: made from a scatter
    /// entry, so from a region with local write access). Refused with the
    /// [`AtomicFault`] of [`check_atomic`]. Does not allocate.
    #[inline]
    pub const fn atomic(
        op: AtomicOp,
        result: &'a Sge<'a>,
        remote: RemoteMemory,
    ) -> Result<Self, AtomicFault> {
        match check_atomic(result, &remote) {
            Ok(()) => Ok(Self::new(
                Opcode::Atomic(op),
                SendFlags::empty(),
                core::slice::from_ref(result),
                remote,
            )),
            Err(e) => Err(e),
        }
    }
}

/// One receive-queue work request. The scatter list is written by the device.
#[derive(Clone, Copy, Debug)]
pub struct RecvRequest<'a> {
    /// Identifier returned in the completion.
    pub wr_id: u64,
    /// Where the message lands (same layout as [`crate::sge::SgeMut`]).
    pub sges: &'a [Sge<'a>],
}

/// One send request of a datagram (UD) queue pair: a send (with an optional immediate) to
/// the queue pair `remote_qpn` behind the address `dest`, which must carry `remote_qkey`.
///
/// `A` is the provider's address type: an address handle on a device
/// (`verbs::AddressHandle`), a node or group of the software model.
#[derive(Clone, Copy, Debug)]
pub struct DatagramRequest<'a, A> {
    /// Identifier returned in the completion.
    pub wr_id: u64,
    /// Flags (`SIGNALED`, `INLINE`, `SOLICITED`; `FENCE` means nothing for datagrams).
    pub flags: SendFlags,
    /// The payload, gathered (or copied at post time when `INLINE`).
    pub sges: &'a [Sge<'a>],
    /// An immediate delivered in the receiver's completion.
    pub imm: Option<u32>,
    /// Where the datagram goes: a port, or a multicast group.
    pub dest: &'a A,
    /// The destination queue pair (`0xFF_FFFF` for a multicast group).
    pub remote_qpn: u32,
    /// The Q_Key the destination queue pair expects; a datagram with another is dropped.
    pub remote_qkey: u32,
}

/// A post that the device refused.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PostFailure {
    /// How many requests of the batch were posted (the device may run them): those before
    /// the one that failed, or every one when the failure names none (a failed
    /// `ibv_wr_complete`, an `ibv_post_send` that names no request: the device may hold
    /// them all, so the caller must flush and wait before reusing their buffers).
    pub posted: usize,
    /// The errno (`ENOMEM`: queue full; `EINVAL`: a bad request).
    pub errno: i32,
}
