//! Protection domains.

use alloc::sync::Arc;
use core::fmt;

use super::destroy::Owned;
use super::device::Context;
use super::error::{Result, Verb};
use super::ffi::sys;

pub(crate) struct PdInner {
    // Field order is drop order: the PD is deallocated before its context is released.
    pub(crate) raw: Owned<sys::ibv_pd>,
    pub(crate) ctx: Context,
}

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
        // SAFETY: the context is open. Every MR, QP, SRQ and address handle made on the PD
        // holds an Arc to the `PdInner` that owns it, so none is alive when it is deallocated.
        let raw = unsafe { Owned::create(sys::ibv_alloc_pd(self.as_raw()), Verb::AllocPd) }?;
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
