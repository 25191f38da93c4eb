//! Protection domains.

use alloc::sync::Arc;
use core::fmt;
use core::ptr::NonNull;

use super::device::Context;
use super::error::{Result, Verb, VerbsError};
use super::ffi::{errno, sys};

pub(crate) struct PdInner {
    pub(crate) raw: NonNull<sys::ibv_pd>,
    pub(crate) ctx: Context,
}

impl Drop for PdInner {
    fn drop(&mut self) {
        // SAFETY: every MR and QP of this PD holds an Arc to it, so none is alive now.
        // A failure (EBUSY from a resource created through the raw handle) leaks the PD rather
        // than panicking in drop; it is counted.
        let rc = unsafe { sys::ibv_dealloc_pd(self.raw.as_ptr()) };
        super::destroy::check(super::destroy::Kind::Pd, rc);
    }
}

// SAFETY: libibverbs objects may be used from any thread; the pointer is owned.
unsafe impl Send for PdInner {}
// SAFETY: as above.
unsafe impl Sync for PdInner {}

/// A protection domain. Cheap to clone; freed with its last clone and last resource.
#[derive(Clone)]
pub struct Pd {
    pub(crate) inner: Arc<PdInner>,
}

impl fmt::Debug for Pd {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Pd")
            .field("device", &self.inner.ctx.name())
            .finish()
    }
}

impl Context {
    /// Allocates a protection domain.
    pub fn alloc_pd(&self) -> Result<Pd> {
        // SAFETY: the context is open.
        let raw = unsafe { sys::ibv_alloc_pd(self.as_raw()) };
        let raw = NonNull::new(raw).ok_or(VerbsError::Call {
            verb: Verb::AllocPd,
            errno: errno(),
        })?;
        Ok(Pd {
            inner: Arc::new(PdInner {
                raw,
                ctx: self.clone(),
            }),
        })
    }
}

impl Pd {
    /// The raw `ibv_pd`, valid while `self` lives.
    pub fn as_raw(&self) -> *mut sys::ibv_pd {
        self.inner.raw.as_ptr()
    }

    /// The device context.
    pub fn context(&self) -> &Context {
        &self.inner.ctx
    }
}
