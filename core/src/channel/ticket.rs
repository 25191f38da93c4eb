//! What posting hands back and waiting takes: one [`Ticket`] for every kind of request, and
//! the [`Done`] a wait returns.

/// Names the work of one post (one request, or a whole batch posted with one doorbell), to
/// wait for it with `wait` on the channel, scope, multi-channel or node that posted it.
/// Carries the peer's rank, so a multi-peer `wait` finds the right channel.
///
/// Dropping a ticket is fine where nothing waits on it: the `unsafe` `post_*` calls are
/// `#[must_use]` (their buffers are the caller's to keep until the wait), while a ticket of a
/// scope (the scope waits) or of an inline post (no buffer) may be ignored.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Ticket {
    pub(super) work: Work,
    /// The channel that issued it.
    pub(super) chan: usize,
    pub(super) rank: Option<u32>,
}

/// What a ticket covers: send-queue requests by sequence number, or one receive.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Work {
    Sends { first: u64, last: u64 },
    Recv(u64),
}

impl Ticket {
    /// The peer's rank, if the channel knows it.
    #[inline]
    pub fn peer(&self) -> Option<u32> {
        self.rank
    }

    /// Whether the ticket names a receive.
    #[inline]
    pub fn is_recv(&self) -> bool {
        matches!(self.work, Work::Recv(_))
    }

    /// Number of requests the ticket covers (at least 1).
    #[inline]
    pub fn len(&self) -> u64 {
        match self.work {
            Work::Sends { first, last } => last - first + 1,
            Work::Recv(_) => 1,
        }
    }

    /// Always false: an empty post has no ticket.
    #[inline]
    pub fn is_empty(&self) -> bool {
        false
    }
}

/// What a completed request delivered. For a receive: the message length and its
/// immediate, if any (a write with immediate reports the written length). For sends,
/// writes and reads: zero and `None`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Done {
    /// Bytes received.
    pub byte_len: u32,
    /// The immediate, for sends and writes with immediate.
    pub imm: Option<u32>,
    /// The receive was consumed by an RDMA write with immediate: the bytes went to the
    /// memory the peer wrote, none to the receive buffer (`byte_len` is the written length).
    pub written: bool,
}
