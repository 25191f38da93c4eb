//! How a node keeps, checks and spreads failure news (see [`crate::failure`]).

use super::FailureAlarm;
use crate::barrier::BarrierError;
use crate::channel::ChannelError;
use crate::completion::WcStatus;
use crate::failure::{Failure, FailureCause};
use crate::memory::Region;
use crate::multi::MultiChannel;
use crate::poll::Backoff;
use crate::provider::Provider;
use crate::sge::RemoteMemory;
use crate::wire::flags::{FlagLayout, SLOT_LEN};
use crate::wire::notice;

/// Asks the node's device whether its own link is down (a port no longer ACTIVE), and if so
/// what to call it: consulted when a request fails on the local side, because a port going
/// down fails the requests in flight (rxe: "local QP operation error") before the device's
/// asynchronous event has been read by anyone.
#[derive(Clone)]
pub(crate) struct LinkProbe(
    pub(crate) alloc::sync::Arc<dyn Fn() -> Option<FailureCause> + Send + Sync>,
);

impl core::fmt::Debug for LinkProbe {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.write_str("LinkProbe")
    }
}

/// The failure a node knows of, and where news comes from.
#[derive(Debug)]
pub(crate) struct Failures {
    me: u32,
    world: u32,
    alarm: FailureAlarm,
    known: Option<Failure>,
    link: Option<LinkProbe>,
}

impl Failures {
    /// `waker`: what the alarm wakes when a failure is raised on it (the back-off's, so a
    /// node asleep in a blocking wait learns of it at once).
    pub(crate) fn new(me: u32, world: u32, waker: Option<core::task::Waker>) -> Self {
        Self {
            me,
            world,
            alarm: waker.map_or_else(FailureAlarm::new, FailureAlarm::with_waker),
            known: None,
            link: None,
        }
    }

    /// Sets the probe asked about the node's own link when a request fails locally (only a
    /// verbs node has one to set).
    #[cfg_attr(not(feature = "verbs"), allow(dead_code))]
    pub(crate) fn set_link_probe(&mut self, probe: LinkProbe) {
        self.link = Some(probe);
    }

    /// Who failed, if a channel error to `rank` says so: the peer ([`peer_cause`]), or this
    /// node itself when the error is not the peer's and the link probe finds the link down.
    pub(crate) fn cause_of(&self, rank: u32, error: &ChannelError) -> Option<(u32, FailureCause)> {
        if let Some(cause) = peer_cause(error) {
            return Some((rank, cause));
        }
        match error {
            ChannelError::Failed(_) | ChannelError::Broken(_) => {
                let cause = (self.link.as_ref()?.0)()?;
                Some((self.me, cause))
            }
            _ => None,
        }
    }

    /// This node's rank.
    pub(crate) fn me(&self) -> u32 {
        self.me
    }

    /// The failure already taken as news (without looking for new news).
    pub(crate) fn known(&self) -> Option<Failure> {
        self.known
    }

    pub(crate) fn alarm(&self) -> &FailureAlarm {
        &self.alarm
    }

    /// The failure this node knows of: the first one seen, raised on the alarm, or written
    /// into `flags`' notice slot by a peer; one raised on the alarm is passed on to every other
    /// rank the first time it is seen. Two loads when nothing is known. Does not allocate.
    #[inline]
    pub(crate) fn news<P: Provider, B: Backoff + Clone>(
        &mut self,
        flags: &impl Region,
        multi: &mut MultiChannel<P, B>,
        peer_flags: &[RemoteMemory],
    ) -> Option<Failure> {
        if self.known.is_none() {
            let local = self.alarm.load();
            // The alarm is raised in this process: always about the rank's current life.
            self.known = self.accept(local, true);
            if let Some(f) = self.known {
                self.tell_all(&f, multi, peer_flags);
            } else {
                if local != 0 {
                    // Not about this world: make room for real news.
                    self.alarm.clear(local);
                }
                let remote = flags
                    .load_u64(FlagLayout::new(self.world).notice())
                    .unwrap_or(0);
                self.known = self.accept(remote, false);
            }
        }
        self.known
    }

    /// A failure raised on the alarm (by a thread watching the session or the device), if
    /// one about this world is there; passed on to every other rank the first time it is
    /// seen, as [`Failures::news`] does. Does not look at the notice slot.
    pub(crate) fn raised<P: Provider, B: Backoff + Clone>(
        &mut self,
        multi: &mut MultiChannel<P, B>,
        peer_flags: &[RemoteMemory],
    ) -> Option<Failure> {
        if self.known.is_none() {
            self.known = self.accept(self.alarm.load(), true);
            if let Some(f) = self.known {
                self.tell_all(&f, multi, peer_flags);
            }
        }
        self.known
    }

    /// Forgets news about `rank` (readmitted): the failure known, and the alarm if it holds
    /// news about it. News about another rank stays.
    pub(crate) fn forget(&mut self, rank: u32) {
        if self.known.is_some_and(|f| f.rank == rank) {
            self.known = None;
        }
        let word = self.alarm.load();
        if notice::decode(word).is_some_and(|(f, _)| f.rank == rank) {
            self.alarm.clear(word);
        }
    }

    /// The failure in `word`, if it is one about a rank of this world (and, for a notice from
    /// a peer, of incarnation 0, the only one written: a readmission forgets the news between
    /// two rounds in which nobody writes, so no notice of an earlier life can arrive later).
    ///
    /// A notice from a peer is a peer's word: besides decoding, its ranks must be of this
    /// world, and it must not name this node as the failed rank. No rank ever writes that
    /// ([`Failures::tell_all`] skips the failed rank), and taking it would leave the node
    /// failed for good: only the named rank's readmission forgets news, and a node cannot
    /// readmit itself. Any other word is ignored, as if the slot were empty.
    fn accept(&self, word: u64, local: bool) -> Option<Failure> {
        if word == 0 {
            return None;
        }
        let (f, life) = notice::decode(word)?;
        let in_world = f.rank < self.world && f.reporter < self.world;
        (in_world && (local || (life == 0 && f.rank != self.me))).then_some(f)
    }

    /// Records that this node saw `rank` fail, and tells every other rank (one 8-byte inline
    /// write each, best effort: a peer that cannot be told will see the failure itself or hear
    /// it from another). Only the first failure is recorded and spread; the known one is
    /// returned.
    pub(crate) fn declare<P: Provider, B: Backoff + Clone>(
        &mut self,
        rank: u32,
        cause: FailureCause,
        multi: &mut MultiChannel<P, B>,
        peer_flags: &[RemoteMemory],
    ) -> Failure {
        if let Some(f) = self.known {
            return f;
        }
        let f = Failure {
            rank,
            cause,
            reporter: self.me,
        };
        self.known = Some(f);
        self.tell_all(&f, multi, peer_flags);
        f
    }

    /// Writes the notice of `f` into every other rank's flag array but the failed rank's.
    fn tell_all<P: Provider, B: Backoff + Clone>(
        &self,
        f: &Failure,
        multi: &mut MultiChannel<P, B>,
        peer_flags: &[RemoteMemory],
    ) {
        let Some(word) = notice::encode(f, 0) else {
            return;
        };
        let at = FlagLayout::new(self.world).notice() as u64;
        for q in 0..self.world {
            if q == self.me || q == f.rank {
                continue;
            }
            if let Some(slot) = peer_flags
                .get(q as usize)
                .and_then(|m| m.slice(at, SLOT_LEN as u64))
            {
                // Not waited for: the next signaled request retires it, and a channel that
                // cannot carry it is broken already.
                let _ = multi.post_write_inline(q, &FlagLayout::bytes(word), slot);
            }
        }
    }
}

/// Whether a channel error says the peer (or the path to it) failed, and how. Only statuses
/// a dead or unreachable peer causes count: the transport gave up (no answer), or the peer's
/// queue pair answered that it is broken. Our own mistakes do not (a bad key or address of
/// ours comes back as a remote access or invalid request error, a local error flushes the
/// rest), nor does a slow receiver (receiver-not-ready retries running out).
pub(crate) fn peer_cause(error: &ChannelError) -> Option<FailureCause> {
    match error {
        ChannelError::Failed(w) | ChannelError::Broken(w) => match w.status {
            s @ (WcStatus::RetryExceeded
            | WcStatus::ResponseTimeout
            | WcStatus::RemoteOperation) => Some(FailureCause::Completion(s)),
            _ => None,
        },
        ChannelError::TimedOut { .. } => Some(FailureCause::TimedOut),
        _ => None,
    }
}

/// Whether a channel error is the peer's refusal of a request: a remote access or remote
/// invalid request error (see `Node::after_refusal`).
pub(crate) fn is_refusal(error: &ChannelError) -> bool {
    matches!(
        error,
        ChannelError::Failed(w) | ChannelError::Broken(w)
            if matches!(w.status, WcStatus::RemoteAccess | WcStatus::RemoteInvalidRequest)
    )
}

/// A barrier error with a peer's failure in it made into the failure news it is.
pub(crate) fn barrier_news<P: Provider, B: Backoff + Clone>(
    e: BarrierError,
    failures: &mut Failures,
    multi: &mut MultiChannel<P, B>,
    peer_flags: &[RemoteMemory],
) -> BarrierError {
    match &e {
        BarrierError::Transport { rank, error } => match failures.cause_of(*rank, error) {
            Some((failed, cause)) => {
                BarrierError::PeerFailed(failures.declare(failed, cause, multi, peer_flags))
            }
            // A local error with news already raised (the device watch read the port going
            // down a moment before the port's state said so): the news is the cause, if it
            // is about this rank or the one the error names. News about a third rank
            // explains nothing here (only the first news is kept), and taken as the cause it
            // would read as news about a stranger, which a group's barrier ignores.
            None => match failures.raised(multi, peer_flags) {
                Some(f) if f.rank == *rank || f.rank == failures.me() => {
                    BarrierError::PeerFailed(f)
                }
                _ => e,
            },
        },
        _ => e,
    }
}
