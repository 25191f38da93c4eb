//! A failure raised on a node from another thread: [`FailureAlarm`]. It keeps the failure as
//! the word a failure notice carries on the wire ([`crate::wire::notice`]), so the node
//! reads it as it reads a peer's notice.

use crate::failure::Failure;
use crate::wire::notice;

/// A handle that raises a failure on a node from another thread (a session watcher, a
/// health checker). Cheap to clone; the node sees it on its next poll, and a node asleep in
/// a blocking wait (`rverbs_std_shim::WaitPolicy::Block`) is woken at once: its alarm wakes
/// the back-off's [waker](crate::poll::Backoff::waker).
///
/// Only the first failure raised sticks; later ones are ignored.
#[derive(Clone, Debug, Default)]
pub struct FailureAlarm {
    inner: alloc::sync::Arc<AlarmInner>,
}

#[derive(Debug, Default)]
struct AlarmInner {
    word: core::sync::atomic::AtomicU64,
    /// Woken when a failure is raised; fixed when the alarm is made, so no lock guards it.
    waker: Option<core::task::Waker>,
}

impl FailureAlarm {
    /// A new alarm, not raised.
    pub fn new() -> Self {
        Self::default()
    }

    /// A new alarm, not raised, that wakes `waker` when a failure is raised on it (so a
    /// thread asleep on something else learns of it at once).
    pub fn with_waker(waker: core::task::Waker) -> Self {
        Self {
            inner: alloc::sync::Arc::new(AlarmInner {
                word: core::sync::atomic::AtomicU64::new(0),
                waker: Some(waker),
            }),
        }
    }

    /// Raises `failure` unless a failure is already raised; returns whether this call raised
    /// it, and then wakes the alarm's waker, if it has one.
    pub fn raise(&self, failure: Failure) -> bool {
        use core::sync::atomic::Ordering;
        let Some(word) = notice::encode(&failure, 0) else {
            return false;
        };
        let raised = self
            .inner
            .word
            .compare_exchange(0, word, Ordering::AcqRel, Ordering::Acquire)
            .is_ok();
        if raised {
            if let Some(w) = &self.inner.waker {
                w.wake_by_ref();
            }
        }
        raised
    }

    /// The raw notice word (0 when not raised).
    pub(crate) fn load(&self) -> u64 {
        self.inner.word.load(core::sync::atomic::Ordering::Acquire)
    }

    /// Clears the alarm if it still holds `word`.
    pub(crate) fn clear(&self, word: u64) {
        use core::sync::atomic::Ordering;
        let _ = self
            .inner
            .word
            .compare_exchange(word, 0, Ordering::AcqRel, Ordering::Acquire);
    }
}
