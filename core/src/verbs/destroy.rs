//! Owning ibverbs objects, and counting the destroys the device refused.
//!
//! Every object rverbs creates and destroys itself (context, protection domain, completion
//! channel and queue, queue pair, address handle) is held as an `Owned`: the pointer the
//! creating verb returned, destroyed by its one `Drop`. What each kind of object may do
//! between threads, which verb destroys it, and whether a refusal is counted stand in one
//! table at the end of this file.
//!
//! Destroying happens in `Drop`, which cannot return an error, and a refusal there leaks
//! the object (and keeps the objects it depends on alive: a queue pair the kernel would
//! not destroy keeps its completion queues and protection domain busy too). Such a refusal
//! is a bug, in rverbs or in code that used a raw handle (`as_raw`); the library never
//! panics in `Drop` for it. It counts it instead, process-wide, so that tests and
//! long-running programs can check that teardown leaves nothing behind:
//!
//! ```no_run
//! use rverbs_core::verbs::failed_destroys;
//! let before = failed_destroys();
//! // ... create and drop queue pairs ...
//! assert_eq!(failed_destroys(), before, "a destroy was refused: resources leaked");
//! ```

use core::ffi::c_int;
use core::ptr::NonNull;
use core::sync::atomic::{AtomicU64, Ordering};

use super::error::{Result, Verb, VerbsError};
use super::ffi::{errno, sys};

/// How many destroys of each kind the device refused, since the process started.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct FailedDestroys {
    /// `ibv_destroy_qp` (RC and UD queue pairs).
    pub qp: u64,
    /// `ibv_destroy_cq`.
    pub cq: u64,
    /// `ibv_dealloc_pd`.
    pub pd: u64,
    /// `ibv_destroy_ah`.
    pub ah: u64,
    /// `ibv_destroy_srq`.
    pub srq: u64,
}

/// What one counter counts.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Kind {
    Qp = 0,
    Cq = 1,
    Pd = 2,
    Ah = 3,
    Srq = 4,
}

static FAILED: [AtomicU64; 5] = [const { AtomicU64::new(0) }; 5];

/// Counts a refused destroy of `kind` when `rc` (the verb's return value) is not 0.
pub(crate) fn check(kind: Kind, rc: c_int) {
    if rc != 0 {
        FAILED[kind as usize].fetch_add(1, Ordering::Relaxed);
    }
}

/// The destroys the device refused so far, in this process.
pub fn failed_destroys() -> FailedDestroys {
    let n = |k: Kind| FAILED[k as usize].load(Ordering::Relaxed);
    FailedDestroys {
        qp: n(Kind::Qp),
        cq: n(Kind::Cq),
        pd: n(Kind::Pd),
        ah: n(Kind::Ah),
        srq: n(Kind::Srq),
    }
}

/// An object [`Owned`] can hold: the verb that destroys it, and the counter a refusal goes
/// to.
///
/// # Safety
/// libibverbs lets any thread use the object through a shared pointer and destroy it, so
/// that an [`Owned`] of it may be `Send` and `Sync` (each implementation says why; what
/// rverbs keeps beside the object is its owner's to reason about).
pub(crate) unsafe trait Destroy {
    /// The counter a refusal goes to (`None`: the verb cannot refuse, or nothing counts it).
    const COUNTED: Option<Kind>;

    /// Destroys `raw`; the verb's return value.
    ///
    /// # Safety
    /// `raw` is live, destroyed once, and unused from now on.
    unsafe fn destroy(raw: *mut Self) -> c_int;
}

/// An ibverbs object rverbs created: destroyed when this is dropped, and a refusal counted
/// ([`failed_destroys`]), never a panic. The holder's field order decides what goes after it:
/// the objects it was made from.
pub(crate) struct Owned<T: Destroy> {
    raw: NonNull<T>,
}

impl<T: Destroy> Owned<T> {
    /// Takes `raw` over.
    ///
    /// # Safety
    /// `raw` came from the verb [`Destroy::destroy`] undoes and nothing else destroys it; the
    /// holder keeps this until nothing made from the object uses it any more, so that
    /// dropping it destroys an unused object.
    pub(crate) unsafe fn new(raw: NonNull<T>) -> Self {
        Self { raw }
    }

    /// [`Owned::new`] for what a creating verb returned, read at once: null is `verb`'s
    /// failure, with its errno.
    ///
    /// # Safety
    /// As for [`Owned::new`].
    pub(crate) unsafe fn create(raw: *mut T, verb: Verb) -> Result<Self> {
        match NonNull::new(raw) {
            // SAFETY: forwarded contract.
            Some(raw) => Ok(unsafe { Self::new(raw) }),
            None => Err(VerbsError::Call {
                verb,
                errno: errno(),
            }),
        }
    }

    /// The object, valid while `self` lives.
    #[inline]
    pub(crate) fn get(&self) -> NonNull<T> {
        self.raw
    }

    /// The object, valid while `self` lives.
    #[inline]
    pub(crate) fn as_ptr(&self) -> *mut T {
        self.raw.as_ptr()
    }
}

impl<T: Destroy> Drop for Owned<T> {
    fn drop(&mut self) {
        // SAFETY: `new`'s contract: created by the verb this undoes, destroyed only here,
        // and nothing made from it is alive now.
        let rc = unsafe { T::destroy(self.raw.as_ptr()) };
        if let Some(kind) = T::COUNTED {
            // A refusal leaks the object (and what it was made from stays busy).
            check(kind, rc);
        }
    }
}

// SAFETY: `Destroy`'s contract: any thread may use and destroy the object; the `Owned` is
// its only owner.
unsafe impl<T: Destroy> Send for Owned<T> {}
// SAFETY: as above; `&Owned` gives only the pointer.
unsafe impl<T: Destroy> Sync for Owned<T> {}

/// Implements [`Destroy`] for each object: `type => verb, counter`. The comment above each
/// line is the safety argument `Destroy` asks for.
macro_rules! destroyed_by {
    ($($t:ty => $verb:path, $counted:expr;)+) => {$(
        // SAFETY: the comment on this object's line in the table below.
        unsafe impl Destroy for $t {
            const COUNTED: Option<Kind> = $counted;
            unsafe fn destroy(raw: *mut Self) -> c_int {
                // SAFETY: forwarded contract.
                unsafe { $verb(raw) }
            }
        }
    )+};
}

destroyed_by! {
    // Contexts are thread-safe (ibv_open_device(3)). Closing is not counted (there is no
    // counter for it): every child (PD, CQ, QP, MR) holds an Arc to the context's owner.
    sys::ibv_context => sys::ibv_close_device, None;
    // A PD is immutable after allocation; registering, creating on and deallocating it are
    // allowed from any thread. Refused (EBUSY) for a resource made through the raw handle.
    sys::ibv_pd => sys::ibv_dealloc_pd, Some(Kind::Pd);
    // A channel is a file descriptor: reading events from it and destroying it from any
    // thread is allowed (`ibv_get_cq_event` is a read(2)). Destroying one without CQs, which
    // their Arcs to it ensure, cannot fail: not counted.
    sys::ibv_comp_channel => sys::ibv_destroy_comp_channel, None;
    // Only the one `Cq` handle polls (it needs &mut and is neither Clone nor Sync, because
    // providers may drop their locks); arming, acknowledging and destroying from any thread
    // is allowed. Refused (EBUSY) while a queue pair on it was not destroyed.
    sys::ibv_cq => sys::ibv_destroy_cq, Some(Kind::Cq);
    // Modifying, posting to and destroying a QP from any thread is allowed; what rverbs
    // keeps beside it (the send chain) makes its owners `Send`, not `Sync`. Refused (EBUSY)
    // while attached to a multicast group.
    sys::ibv_qp => sys::ibv_destroy_qp, Some(Kind::Qp);
    // An address handle is immutable after creation; any thread may send with it or
    // destroy it.
    sys::ibv_ah => sys::ibv_destroy_ah, Some(Kind::Ah);
}
