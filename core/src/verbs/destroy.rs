//! Counting the destroys the device refused.
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

use core::sync::atomic::{AtomicU64, Ordering};

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
pub(crate) fn check(kind: Kind, rc: core::ffi::c_int) {
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
