//! Readmitting a rank that failed and was started again: the survivors' side (see
//! [the module docs](crate::node#when-a-rank-rejoins)).
//!
//! The survivors cannot tell the new process's writes from the old one's unless every count
//! starts again, so readmitting is collective and happens between two out-of-band rounds:
//!
//! 1. every survivor calls [`Node::readmit_begin`]: its barrier state is poisoned (no
//!    barrier starts), everything it posted to a live rank completes, and its queue pair to
//!    the failed rank is moved to the error state (it executes nothing more, forged packets
//!    included) and drained;
//! 2. round one: once every survivor has begun, nobody writes into anybody's flag array any
//!    more; the survivors exchange fresh endpoints with the new process;
//! 3. every survivor calls [`Node::readmit_finish`] with its new queue pair to the new
//!    process and the new process's flag array and window: the queue pair takes the old
//!    one's place, the counters restart from zero, the flag array is zeroed (notice slot
//!    included) and the news about the rank is forgotten;
//! 4. round two: once every rank has finished (the new process has connected too), barriers
//!    run again, over all ranks.

use core::fmt;

use super::{flags_len, Node, NodeError};
use crate::channel::ChannelError;
use crate::failure::Failure;
use crate::memory::Region;
use crate::poll::Backoff;
use crate::provider::shared::{RoutedQp, SharedCqError};
use crate::provider::{CompletionQueue, Provider, QueuePair};
use crate::sge::RemoteMemory;
use crate::wire::flags::FlagLayout;
use crate::wire::node::NodeBlobError;

/// Why a node cannot readmit a rank ([`NodeError::Readmit`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum ReadmitError {
    /// The node knows of a failure of another rank: only the rank the news names can be
    /// readmitted (only the first failure is kept).
    OtherFailure(Failure),
    /// The channel to a live rank is broken, or its work did not complete: a second rank
    /// (or the path to it) failed, which readmitting one rank does not repair.
    Channel {
        /// The live rank.
        rank: u32,
        /// Its channel's error.
        error: ChannelError,
    },
    /// [`Node::readmit_finish`] without [`Node::readmit_begin`] for this rank, or with work
    /// posted to the rank in between.
    NotBegun,
    /// The new queue pair does not fit the place of the old one.
    QueuePair(SharedCqError),
    /// The new process's blob is malformed, or its flag array too small.
    Blob(NodeBlobError),
    /// Creating the new queue pair failed.
    #[cfg(feature = "verbs")]
    Verbs(crate::verbs::VerbsError),
    /// Connecting the new queue pair to the new process failed.
    #[cfg(feature = "verbs")]
    Connect(crate::verbs::VerbsError),
}

impl fmt::Display for ReadmitError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::OtherFailure(failure) => write!(
                f,
                "this node knows of another failure ({failure}): only the rank the news names \
                 can be readmitted"
            ),
            Self::Channel { rank, error } => write!(
                f,
                "the channel to live rank {rank} failed while settling ({error}): a second \
                 failure, which readmitting one rank does not repair"
            ),
            Self::NotBegun => {
                f.write_str("readmit_finish without readmit_begin, or work posted in between")
            }
            Self::QueuePair(e) => {
                write!(f, "the new queue pair cannot take the old one's place: {e}")
            }
            Self::Blob(e) => write!(f, "the new process's endpoint blob: {e}"),
            #[cfg(feature = "verbs")]
            Self::Verbs(e) => write!(f, "creating the new queue pair: {e}"),
            #[cfg(feature = "verbs")]
            Self::Connect(e) => write!(f, "connecting the new queue pair: {e}"),
        }
    }
}

impl core::error::Error for ReadmitError {}

impl<P: Provider, M: Region, B: Backoff + Clone> Node<P, M, B> {
    /// Step one of readmitting `rank`, which failed and was started again (see [the module
    /// docs](crate::node#when-a-rank-rejoins)); every other surviving rank takes it at the same
    /// time. Abandons any barrier in progress and refuses new ones until
    /// [`Node::readmit_finish`]; waits until everything posted to the live ranks completed
    /// (at most each channel's timeout); moves the queue pair to `rank` to the error state
    /// (even with nothing posted, so that it executes no forged packet meanwhile) and drains it.
    ///
    /// Fails, changing nothing that matters, for a node built without readmission
    /// ([`NodeError::NotBuiltWith`]; one built with it has neither messaging nor barrier
    /// wake-ups nor a shared receive queue, see [`Components`](super::Components)), when this
    /// node knows of another rank's failure, and (after the drain) when a channel to a live
    /// rank is broken. Allocates nothing.
    pub fn readmit_begin(&mut self, rank: u32) -> Result<(), NodeError> {
        if rank == self.rank || rank >= self.world {
            return Err(NodeError::UnknownRank(rank));
        }
        let refuse = |error| Err(NodeError::Readmit { rank, error });
        if !self.components.readmission {
            // Chosen at build, where it excludes messaging, wake-ups and a shared receive
            // queue (`Components::check`, `from_parts`): none of them can be here.
            return Err(NodeError::NotBuiltWith(super::Component::Readmission));
        }
        if let Some(f) = self.failure().filter(|f| f.rank != rank) {
            return refuse(ReadmitError::OtherFailure(f));
        }
        self.barrier.poison();
        self.readmitting = Some(rank);
        for (peer, c) in self.multi.ranked() {
            if peer == rank {
                // Nothing to wait for: the process it led to is gone. The queue pair goes to
                // the error state even with nothing posted: left ready until the new one
                // replaces it, it would still execute a forged write at the PSN it expects
                // into this node's window (measured on rxe: bootstrap/tests/device_inject.rs).
                c.shut();
                continue;
            }
            if let Some(error) = c.fault() {
                return refuse(ReadmitError::Channel { rank: peer, error });
            }
            if let Err(error) = c.wait_all() {
                return refuse(ReadmitError::Channel { rank: peer, error });
            }
        }
        Ok(())
    }

    /// This node's flag array as peers address it (what a node built for a restarted rank
    /// needs of every survivor, with [`Node::window`]'s).
    pub fn flags_remote(&self) -> RemoteMemory {
        self.flags.remote()
    }
}

impl<Q, C, M, B> Node<RoutedQp<Q, C>, M, B>
where
    Q: QueuePair,
    C: CompletionQueue,
    M: Region,
    B: Backoff + Clone,
{
    /// Step two of readmitting `rank` (after [`Node::readmit_begin`], and after every other
    /// survivor began too): `qp`, connected to the new process and completing into this
    /// node's completion queues (made with [`RoutedQp::with_cqs`]), takes the old queue
    /// pair's place, which is dropped; `flags` and `window` are the new process's flag array
    /// and window. Then every barrier count starts from zero, this node's flag array is
    /// zeroed (the failure notice too) and the news about `rank` is forgotten.
    ///
    /// No rank may start a barrier before every rank (the new process included) has
    /// finished: an out-of-band round does that. Allocates nothing.
    pub fn readmit_finish(
        &mut self,
        rank: u32,
        qp: Q,
        flags: RemoteMemory,
        window: RemoteMemory,
    ) -> Result<(), NodeError> {
        let refuse = |error| Err(NodeError::Readmit { rank, error });
        if self.readmitting != Some(rank) {
            return refuse(ReadmitError::NotBegun);
        }
        if (flags.len as usize) < flags_len(self.world) {
            return refuse(ReadmitError::Blob(NodeBlobError::FlagsTooSmall));
        }
        let swapped = self
            .multi
            .renew(rank, |p| p.replace_qp(qp).map(drop).map_err(|(_, e)| e));
        match swapped {
            None => return refuse(ReadmitError::NotBegun),
            Some(Err(e)) => return refuse(ReadmitError::QueuePair(e)),
            Some(Ok(())) => {}
        }
        self.peer_flags[rank as usize] = flags;
        // The channel kept its position (renewed in place): only the slot is new.
        if let Some(Some(to)) = self.notify_to.get_mut(rank as usize) {
            to.slot = super::arrival_slot(self.rank, self.world, rank, &flags).unwrap_or(to.slot);
        }
        self.peer_windows[rank as usize] = window;
        self.barrier.reset();
        for at in FlagLayout::new(self.world).slots() {
            self.flags.write_from(at, &FlagLayout::bytes(0));
        }
        self.failures.forget(rank);
        self.readmitting = None;
        Ok(())
    }
}
