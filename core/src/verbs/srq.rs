//! Shared receive queues: one pool of receives for many queue pairs (`ibv_create_srq`).
//!
//! A message to any queue pair created on an [`Srq`] ([`Pd::create_rc_qp_on_srq`]) lands in
//! the oldest receive posted to the queue, and its completion goes to that queue pair's
//! receive CQ with the queue pair's number. So receive memory is sized to the traffic, not
//! to the number of peers.
//!
//! # Lifetime
//! Every queue pair on the queue holds it alive (as it holds its CQs), so it is destroyed
//! after the last of them, however they are dropped. Moving a queue pair to the error state
//! does not flush the queue's receives: they stay posted until the queue is destroyed, so
//! memory they name may be freed only after that. [`Srq::probe`] says when it happened.
//!
//! ```no_run
//! use rverbs_core::verbs::{open_device, QpConfig};
//! # fn main() -> Result<(), rverbs_core::verbs::VerbsError> {
//! let ctx = open_device("rxe0")?;
//! let pd = ctx.alloc_pd()?;
//! let srq = pd.create_srq(1024, 1)?; // clamped to the device's max_srq_wr / max_srq_sge
//! let (send_cq, recv_cq) = (ctx.create_cq(128)?, ctx.create_cq(srq.max_wr())?);
//! let qp = pd.create_rc_qp_on_srq(&send_cq, &recv_cq, &srq, &QpConfig::default())?;
//! # let _ = qp; Ok(()) }
//! ```

use core::fmt;
use core::ptr::{self, NonNull};

use alloc::sync::Arc;

use super::error::{Result, Verb, VerbsError};
use super::ffi::{self, errno, sys};
use super::pd::Pd;
use super::recv_chain::post_recv_wrs;
use crate::memory::SrqProbe;
use crate::wr::{PostFailure, RecvRequest};

pub(crate) struct SrqInner {
    raw: NonNull<sys::ibv_srq>,
    probe: SrqProbe,
    _pd: Pd,
}

impl Drop for SrqInner {
    fn drop(&mut self) {
        // SAFETY: the SRQ came from ibv_create_srq and is destroyed once; every QP on it held
        // this Arc, so none is alive now.
        let rc = unsafe { sys::ibv_destroy_srq(self.raw.as_ptr()) };
        // A failed destroy (a QP made through the raw handle still on it) leaves its
        // receives posted: the probe then never says gone, and their memory is leaked.
        if rc == 0 {
            self.probe.mark_gone();
        }
        super::destroy::check(super::destroy::Kind::Srq, rc);
    }
}

// SAFETY: libibverbs objects may be used from any thread, and posting to an SRQ is
// thread-safe in libibverbs providers (they lock the queue); the pointer is owned.
unsafe impl Send for SrqInner {}
// SAFETY: as above.
unsafe impl Sync for SrqInner {}

impl SrqInner {
    pub(crate) fn as_raw(&self) -> *mut sys::ibv_srq {
        self.raw.as_ptr()
    }

    pub(crate) fn probe(&self) -> SrqProbe {
        self.probe.clone()
    }

    /// [`Srq::set_limit`].
    pub(crate) fn set_limit(&self, limit: u32) -> Result<()> {
        let mut attr = sys::ibv_srq_attr {
            max_wr: 0,
            max_sge: 0,
            srq_limit: limit,
        };
        // SAFETY: the SRQ is live; attr is fully initialised.
        let rc = unsafe {
            sys::ibv_modify_srq(
                self.as_raw(),
                &mut attr,
                sys::IBV_SRQ_LIMIT as core::ffi::c_int,
            )
        };
        if rc == 0 {
            Ok(())
        } else {
            Err(VerbsError::Call {
                verb: Verb::ModifySrq,
                errno: rc,
            })
        }
    }
}

/// A shared receive queue. See the [module docs](self).
pub struct Srq {
    inner: Arc<SrqInner>,
    max_wr: u32,
    max_sge: u32,
}

impl fmt::Debug for Srq {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Srq")
            .field("max_wr", &self.max_wr)
            .field("max_sge", &self.max_sge)
            .finish()
    }
}

impl Pd {
    /// Creates a shared receive queue of `max_wr` receives with `max_sge` entries each, both
    /// clamped to the device's limits (`max_srq_wr`, `max_srq_sge`); [`Srq::max_wr`] says
    /// what was granted. Fails with [`VerbsError::InvalidArgument`] on a device without
    /// shared receive queues.
    pub fn create_srq(&self, max_wr: u32, max_sge: u32) -> Result<Srq> {
        let dev = self.context().query_device()?;
        if dev.max_srq == 0 || dev.max_srq_wr == 0 {
            return Err(VerbsError::InvalidArgument {
                what: "the device has no shared receive queues",
            });
        }
        let mut init = sys::ibv_srq_init_attr {
            srq_context: ptr::null_mut(),
            attr: sys::ibv_srq_attr {
                max_wr: max_wr.clamp(1, dev.max_srq_wr),
                max_sge: max_sge.clamp(1, dev.max_srq_sge.max(1)),
                srq_limit: 0,
            },
        };
        // SAFETY: the PD is live (we hold it); init is fully initialised.
        let raw = unsafe { sys::ibv_create_srq(self.as_raw(), &mut init) };
        let raw = NonNull::new(raw).ok_or(VerbsError::Call {
            verb: Verb::CreateSrq,
            errno: errno(),
        })?;
        // ibv_create_srq writes back what it granted (at least what was asked for).
        Ok(Srq {
            inner: Arc::new(SrqInner {
                raw,
                probe: SrqProbe::pending(),
                _pd: self.clone(),
            }),
            max_wr: init.attr.max_wr,
            max_sge: init.attr.max_sge,
        })
    }
}

impl Srq {
    /// Receives the queue holds.
    #[inline]
    pub fn max_wr(&self) -> u32 {
        self.max_wr
    }

    /// Scatter/gather entries per receive.
    #[inline]
    pub fn max_sge(&self) -> u32 {
        self.max_sge
    }

    /// The raw `ibv_srq`, valid while `self` lives.
    #[inline]
    pub fn as_raw(&self) -> *mut sys::ibv_srq {
        self.inner.as_raw()
    }

    /// Says when the queue is destroyed (after this handle and every queue pair on it).
    pub fn probe(&self) -> SrqProbe {
        self.inner.probe()
    }

    pub(crate) fn keep_alive(&self) -> Arc<SrqInner> {
        Arc::clone(&self.inner)
    }

    /// Arms the limit event: once fewer than `limit` receives are posted, the device raises
    /// `IBV_EVENT_SRQ_LIMIT_REACHED` on the context's async event queue (once; arm again
    /// after it). 0 disarms it.
    pub fn set_limit(&self, limit: u32) -> Result<()> {
        self.inner.set_limit(limit)
    }

    /// Posts up to [`MAX_BATCH`](crate::wr::MAX_BATCH) receives as one chain. Does not allocate.
    ///
    /// # Safety
    /// The [posting contract](crate#the-posting-contract): each scatter buffer is the
    /// device's until its receive completion is polled, or until the queue is destroyed
    /// ([`Srq::probe`]); flushing the queue pairs on it does not return it.
    #[inline]
    pub unsafe fn post_recv(
        &self,
        wrs: &[RecvRequest<'_>],
    ) -> core::result::Result<(), PostFailure> {
        // SAFETY: forwarded contract; the SRQ is live.
        unsafe { post_srq_chain(self.as_raw(), wrs) }
    }
}

/// Posts `wrs` to `srq` as one chain.
///
/// # Safety
/// `srq` is live; the posting contract for the buffers.
pub(crate) unsafe fn post_srq_chain(
    srq: *mut sys::ibv_srq,
    wrs: &[RecvRequest<'_>],
) -> core::result::Result<(), PostFailure> {
    // SAFETY: forwarded contract; ffi::post_srq_recv takes a shared receive queue.
    unsafe { post_recv_wrs(srq, ffi::post_srq_recv, wrs) }
}
