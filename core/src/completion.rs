//! Work completions in a provider-neutral form.

use core::fmt;

/// The status of a work completion (`ibv_wc_status`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum WcStatus {
    /// The work request completed.
    Success,
    /// Local length error (a receive buffer too small, or a message too large).
    LocalLength,
    /// Local QP operation error.
    LocalQpOperation,
    /// Local protection error (an lkey that does not cover the buffer).
    LocalProtection,
    /// Flushed: the QP went to the error state before this request ran.
    Flushed,
    /// The responder rejected the request as invalid.
    RemoteInvalidRequest,
    /// Remote access error (bad rkey, address or permissions).
    RemoteAccess,
    /// The responder failed the operation.
    RemoteOperation,
    /// Transport retries exhausted: the peer did not answer (dead, or wrong address).
    RetryExceeded,
    /// Receiver-not-ready retries exhausted: the peer posted no receive in time.
    RnrRetryExceeded,
    /// Local access error.
    LocalAccess,
    /// Fatal error.
    Fatal,
    /// Response timeout.
    ResponseTimeout,
    /// General error.
    General,
    /// Any other status code.
    Other(u32),
}

impl WcStatus {
    /// The status for an `ibv_wc_status` code.
    pub const fn from_code(code: u32) -> Self {
        match code {
            0 => Self::Success,
            1 => Self::LocalLength,
            2 => Self::LocalQpOperation,
            4 => Self::LocalProtection,
            5 => Self::Flushed,
            9 => Self::RemoteInvalidRequest,
            10 => Self::RemoteAccess,
            11 => Self::RemoteOperation,
            12 => Self::RetryExceeded,
            13 => Self::RnrRetryExceeded,
            8 => Self::LocalAccess,
            19 => Self::Fatal,
            20 => Self::ResponseTimeout,
            21 => Self::General,
            c => Self::Other(c),
        }
    }

    /// The `ibv_wc_status` code.
    pub const fn code(self) -> u32 {
        match self {
            Self::Success => 0,
            Self::LocalLength => 1,
            Self::LocalQpOperation => 2,
            Self::LocalProtection => 4,
            Self::Flushed => 5,
            Self::LocalAccess => 8,
            Self::RemoteInvalidRequest => 9,
            Self::RemoteAccess => 10,
            Self::RemoteOperation => 11,
            Self::RetryExceeded => 12,
            Self::RnrRetryExceeded => 13,
            Self::Fatal => 19,
            Self::ResponseTimeout => 20,
            Self::General => 21,
            Self::Other(c) => c,
        }
    }

    /// Whether the status names a failure on this side of the connection (our queue pair,
    /// our memory keys, our device), not the peer's: a local length, QP operation,
    /// protection or access error, or a fatal device error. Such a failure is never news
    /// about the peer. Does not allocate.
    #[inline]
    pub const fn is_local(self) -> bool {
        matches!(
            self,
            Self::LocalLength
                | Self::LocalQpOperation
                | Self::LocalProtection
                | Self::LocalAccess
                | Self::Fatal
        )
    }

    /// Whether the work request succeeded.
    #[inline]
    pub const fn is_success(self) -> bool {
        matches!(self, Self::Success)
    }

    /// A short description.
    pub const fn describe(self) -> &'static str {
        match self {
            Self::Success => "success",
            Self::LocalLength => "local length error",
            Self::LocalQpOperation => "local QP operation error",
            Self::LocalProtection => "local protection error (bad lkey or range)",
            Self::Flushed => "flushed (the queue pair is in the error state)",
            Self::RemoteInvalidRequest => "remote invalid request",
            Self::RemoteAccess => "remote access error (bad rkey, address or permission)",
            Self::RemoteOperation => "remote operation error",
            Self::RetryExceeded => "transport retries exceeded (peer unreachable or dead)",
            Self::RnrRetryExceeded => "receiver-not-ready retries exceeded (no receive posted)",
            Self::LocalAccess => "local access error",
            Self::Fatal => "fatal error",
            Self::ResponseTimeout => "response timeout",
            Self::General => "general error",
            Self::Other(_) => "unknown status",
        }
    }
}

impl fmt::Display for WcStatus {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} ({})", self.describe(), self.code())
    }
}

/// What a completion finished.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum CompletionKind {
    /// A send (with or without immediate).
    Send,
    /// An RDMA write (with or without immediate).
    Write,
    /// An RDMA read.
    Read,
    /// An atomic.
    Atomic,
    /// A receive of a send.
    Recv,
    /// A receive consumed by an RDMA write with immediate.
    RecvWriteImm,
    /// Anything else, and the opcode of error completions (which the device leaves undefined).
    Other,
}

impl CompletionKind {
    /// Whether this completes a receive-queue entry.
    #[inline]
    pub const fn is_recv(self) -> bool {
        matches!(self, Self::Recv | Self::RecvWriteImm)
    }
}

/// One work completion.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Completion {
    /// The work request id it completes.
    pub wr_id: u64,
    /// Its status.
    pub status: WcStatus,
    /// The vendor error syndrome (non-zero only on errors).
    pub vendor_err: u32,
    /// What completed (undefined on error completions).
    pub kind: CompletionKind,
    /// Bytes received (receives) or read.
    pub byte_len: u32,
    /// Immediate data, if the message carried one.
    pub imm: Option<u32>,
    /// The local QP number the completion belongs to.
    pub qp_num: u32,
    /// When the device completed the request: wall-clock nanoseconds since the Unix epoch,
    /// as the device's clock reports them. Only on a completion queue created with hardware
    /// timestamps (a device without them refuses such a queue at creation, so `None` never
    /// stands for a missing clock), and only for successful completions; `None` elsewhere,
    /// at no cost to queues without timestamps.
    pub timestamp: Option<core::num::NonZeroU64>,
}

impl Completion {
    /// An empty completion, for initialising poll arrays.
    pub const EMPTY: Completion = Completion {
        wr_id: 0,
        status: WcStatus::Success,
        vendor_err: 0,
        kind: CompletionKind::Other,
        byte_len: 0,
        imm: None,
        qp_num: 0,
        timestamp: None,
    };
}

impl Default for Completion {
    fn default() -> Self {
        Self::EMPTY
    }
}

/// A completion of a datagram (UD) queue pair: a [`Completion`] and what a receive learns
/// about the datagram's sender.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DatagramCompletion {
    /// The completion itself (`byte_len` of a receive counts the 40 bytes of the network
    /// header in front of the payload).
    pub wc: Completion,
    /// The sender's queue pair number (receives only).
    pub src_qp: u32,
    /// The sender's LID (receives on InfiniBand; 0 on RoCE).
    pub slid: u16,
    /// The service level the datagram came with.
    pub sl: u8,
    /// The destination LID path bits (InfiniBand; 0 for multicast and on RoCE).
    pub path_bits: u8,
    /// Whether the first 40 bytes of the receive buffer hold the datagram's network header
    /// (always on RoCE; on InfiniBand only for routed or multicast traffic).
    pub grh: bool,
}

impl DatagramCompletion {
    /// An empty completion, for initialising poll arrays.
    pub const EMPTY: DatagramCompletion = DatagramCompletion {
        wc: Completion::EMPTY,
        src_qp: 0,
        slid: 0,
        sl: 0,
        path_bits: 0,
        grh: false,
    };
}

impl Default for DatagramCompletion {
    fn default() -> Self {
        Self::EMPTY
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn status_codes_round_trip() {
        for code in 0..32 {
            assert_eq!(WcStatus::from_code(code).code(), code);
        }
    }
}
