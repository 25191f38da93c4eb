//! The provider seam: the few verbs the engine needs, behind one trait.
//!
//! [`crate::channel::Channel`] and everything above it are written against [`Provider`], not
//! against libibverbs. Two implementations exist:
//! - [`verbs`] (feature `verbs`): a real RC queue pair with its own send and receive CQs;
//! - [`soft`]: a deterministic in-memory model of an RC connection, so the engine builds
//!   and is tested without a device, under `no_std`, Miri and fuzzers. It never stands in for
//!   a device in a test that claims to test the data path.

use core::fmt;

use crate::completion::Completion;
use crate::params::QpCaps;
use crate::wr::{PostFailure, RecvRequest, WorkRequest};

#[cfg(feature = "alloc")]
pub mod shared;
pub mod soft;
#[cfg(feature = "verbs")]
pub mod verbs;

pub use crate::verb::Verb;

/// A failure of a provider call other than a post (polling, state changes): the verb and
/// the errno it reported.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ProviderError {
    /// The verb that failed ([`Verb::PollCq`], [`Verb::ModifyQpErr`], ...).
    pub verb: Verb,
    /// Its errno.
    pub errno: i32,
}

impl fmt::Display for ProviderError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} failed with errno {}", self.verb.name(), self.errno)
    }
}

impl core::error::Error for ProviderError {}

/// One connected RC queue pair: what can be posted to it. Where its completions go is the
/// business of [`Provider`] (its own two CQs) or of a completion queue several queue pairs
/// share ([`CompletionQueue`]).
///
/// Completions must be reported in posting order per queue (RC guarantees it), and a send
/// error must move the queue pair to the error state, flushing everything after it.
pub trait QueuePair {
    /// What the queue pair can hold.
    fn caps(&self) -> QpCaps;

    /// The queue pair's number: completions carry it, and a shared completion queue is
    /// routed by it.
    fn qp_num(&self) -> u32;

    /// Posts the requests as one chain (one doorbell). At most
    /// [`MAX_BATCH`](crate::wr::MAX_BATCH) requests.
    ///
    /// # Safety
    /// The [posting contract](crate#the-posting-contract).
    unsafe fn post_send(&mut self, wrs: &[WorkRequest<'_>]) -> Result<(), PostFailure>;

    /// Posts receives as one chain. At most [`MAX_BATCH`](crate::wr::MAX_BATCH) requests.
    ///
    /// # Safety
    /// The [posting contract](crate#the-posting-contract).
    unsafe fn post_recv(&mut self, wrs: &[RecvRequest<'_>]) -> Result<(), PostFailure>;

    /// Moves the queue pair to the error state: every outstanding request completes, flushed.
    fn set_error(&mut self) -> Result<(), ProviderError>;
}

/// A completion queue: polled for up to `out.len()` completions at a time.
pub trait CompletionQueue {
    /// Polls completions into `out`; returns how many.
    fn poll(&mut self, out: &mut [Completion]) -> Result<usize, ProviderError>;

    /// Most completions the queue holds.
    fn capacity(&self) -> u32;
}

/// A connected queue pair with a send and a receive completion queue of its own: what a
/// [`Channel`](crate::channel::Channel) is built on.
///
/// The engine ignores completions that carry another queue pair's number (a completion queue
/// shared by mistake).
pub trait Provider: QueuePair {
    /// Polls send completions into `out`; returns how many.
    fn poll_send(&mut self, out: &mut [Completion]) -> Result<usize, ProviderError>;

    /// Polls receive completions into `out`; returns how many.
    fn poll_recv(&mut self, out: &mut [Completion]) -> Result<usize, ProviderError>;

    /// For a queue pair whose completion queues are shared with others ([`shared`]): polls
    /// them once, keeps every completion for its queue pair, and calls `ready(qp_num)` for
    /// each queue pair with completions waiting. Returns how many completions it took, or
    /// `None` for a provider with queues of its own (the default), whose caller polls each
    /// queue pair instead.
    fn poll_shared(&mut self, ready: &mut dyn FnMut(u32)) -> Result<Option<usize>, ProviderError> {
        let _ = ready;
        Ok(None)
    }

    /// The completion events of this provider's queues, if they raise any: a channel built
    /// on it [attaches](crate::poll::Backoff::attach) them to its back-off. `None` (the
    /// default) for queues without a completion channel.
    #[cfg(feature = "alloc")]
    fn completion_events(&self) -> Option<alloc::sync::Arc<dyn crate::poll::Wakeup>> {
        None
    }
}
