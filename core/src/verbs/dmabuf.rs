//! dma-buf memory regions: memory another driver exports (a GPU's, through CUDA or ROCm)
//! registered with the RDMA device by file descriptor (`ibv_reg_dmabuf_mr`).
//!
//! The memory is not the CPU's: there is no byte view, only keys, gather and scatter entries
//! (addressed by the region's `iova`) and the descriptor peers need. The ownership rules are
//! those of [`Pd::register_shared`]:
//! - the region owns the dma-buf descriptor ([`DmabufFd`]), so the exporter's memory stays
//!   exported as long as any key is valid;
//! - the descriptor is closed only after a successful deregistration; a failed
//!   deregistration, or a leaked region (`mem::forget`), leaks the descriptor instead, so a
//!   peer's key can never outlive the export;
//! - a refused registration closes the descriptor (no key ever existed) and says why: a
//!   device that cannot register dma-buf memory fails with
//!   [`VerbsError::DmabufUnsupported`], never a panic.
//!
//! What rverbs checks before the call: a non-zero length; `offset + len` and `iova + len` do
//! not overflow; remote write or atomic access comes with local write; a non-negative
//! descriptor. What it cannot check: that `offset..offset+len` lies inside the dma-buf (the
//! kernel refuses it, `EINVAL`), or that the exporter keeps the memory while the dma-buf is
//! attached (the exporter's contract with the kernel; CUDA's and ROCm's dma-bufs hold their
//! allocation while exported).
//!
//! ```no_run
//! # use rverbs_core::verbs::{AccessFlags, DmabufFd, Pd};
//! # fn f(pd: &Pd, raw_fd: i32, len: usize) -> Result<(), rverbs_core::verbs::VerbsError> {
//! // `raw_fd` came from the exporter (cuMemGetHandleForAddressRange,
//! // hsa_amd_portable_export_dmabuf, a DRM PRIME export) and is ours to close.
//! // SAFETY: we own raw_fd and nothing else closes it.
//! let fd = unsafe { DmabufFd::from_raw_fd(raw_fd) };
//! let access = AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE | AccessFlags::REMOTE_READ;
//! let region = pd.register_dmabuf(fd, 0, len, 0, access)?;
//! let remote = region.remote(); // send this to the peers
//! # let _ = remote; Ok(()) }
//! ```

use core::ffi::c_int;
use core::fmt;
use core::mem::ManuallyDrop;
use core::ops::Range;

use super::error::{Result, Verb, VerbsError};
use super::ffi::{close_fd, sys};
use super::mr::{check_access, registration_accessors, Registration, Start};
use super::pd::Pd;
use crate::memory::AccessFlags;
use crate::sge::{RemoteMemory, Sge, SgeMut};

use super::ffi::{ENOSYS, EOPNOTSUPP};

/// An open dma-buf file descriptor that rverbs owns: closed when dropped, or by the
/// [`DmabufRegion`] it was registered as, after deregistration.
pub struct DmabufFd {
    fd: c_int,
}

impl DmabufFd {
    /// Takes ownership of `fd`. With std: `unsafe { DmabufFd::from_raw_fd(owned.into_raw_fd()) }`
    /// for an `OwnedFd`.
    ///
    /// # Safety
    /// `fd` must be an open descriptor the caller owns, and nothing else may close it or
    /// use it after this call (it is closed when the value or its region is dropped).
    pub const unsafe fn from_raw_fd(fd: c_int) -> Self {
        Self { fd }
    }

    /// The descriptor, still owned by this value.
    pub const fn as_raw_fd(&self) -> c_int {
        self.fd
    }

    /// Gives the descriptor back to the caller, who must close it.
    pub fn into_raw_fd(self) -> c_int {
        ManuallyDrop::new(self).fd
    }
}

impl Drop for DmabufFd {
    fn drop(&mut self) {
        if self.fd >= 0 {
            close_fd(self.fd);
        }
    }
}

impl fmt::Debug for DmabufFd {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("DmabufFd").field(&self.fd).finish()
    }
}

/// Where a dma-buf region starts: its place in the dma-buf, and the device address of its
/// first byte.
#[derive(Debug)]
pub(super) struct DmabufStart {
    offset: u64,
    iova: u64,
}

impl Start for DmabufStart {
    #[inline]
    fn device_addr(&self) -> u64 {
        self.iova
    }
}

/// Device memory registered from a dma-buf; owns the descriptor. See the
/// [module docs](self).
pub struct DmabufRegion {
    reg: Registration<DmabufStart>,
    // Closed (dropped) only after a successful deregistration: see `release`.
    fd: ManuallyDrop<DmabufFd>,
}

// SAFETY: the region holds an MR handle libibverbs lets any thread use and a descriptor it
// owns; it gives no CPU access to the memory, so nothing in it is tied to a thread.
unsafe impl Send for DmabufRegion {}
// SAFETY: &DmabufRegion reads plain key fields and builds entries (values); no CPU view of
// the memory exists to race on.
unsafe impl Sync for DmabufRegion {}

/// The checks rverbs makes before `ibv_reg_dmabuf_mr` (the kernel checks the range
/// against the dma-buf's size).
pub(crate) fn check_dmabuf_args(
    fd: c_int,
    offset: u64,
    len: usize,
    iova: u64,
    access: AccessFlags,
) -> Result<()> {
    let invalid = |what| Err(VerbsError::InvalidArgument { what });
    if fd < 0 {
        return invalid("negative dma-buf descriptor");
    }
    if len == 0 {
        return invalid("memory region length is zero");
    }
    let len = len as u64;
    if offset.checked_add(len).is_none() {
        return invalid("dma-buf offset + length overflows");
    }
    if iova.checked_add(len).is_none() {
        return invalid("dma-buf iova + length overflows");
    }
    check_access(access)
}

/// What a refused `ibv_reg_dmabuf_mr` means.
pub(crate) fn refusal(errno: i32) -> VerbsError {
    match errno {
        EOPNOTSUPP | ENOSYS => VerbsError::DmabufUnsupported { errno },
        errno => VerbsError::Call {
            verb: Verb::RegDmabufMr,
            errno,
        },
    }
}

/// Releases a registration and the owner of what it names, in the only safe order:
/// deregister, then drop the owner if and only if deregistration succeeded (otherwise the
/// keys stay valid and the owner is leaked). One function for the device and the tests.
pub(crate) fn release<T>(deregister: impl FnOnce() -> core::result::Result<(), i32>, owner: T) {
    match deregister() {
        Ok(()) => drop(owner),
        Err(_) => core::mem::forget(owner),
    }
}

impl Pd {
    /// Registers `len` bytes at `offset` of the dma-buf `fd` (memory another driver
    /// exported, a GPU's through CUDA or ROCm), addressed by the device as `iova..iova+len`.
    /// The region owns `fd`, closes it after deregistering, and leaks it if deregistration
    /// fails or the region is leaked. There is no CPU view of the memory.
    ///
    /// `access` may hold any flags; remote write or atomics need
    /// [`AccessFlags::LOCAL_WRITE`] too. A device that cannot register dma-buf memory
    /// (rxe, siw, a provider library before rdma-core 34) fails with
    /// [`VerbsError::DmabufUnsupported`]; a refused registration closes `fd`. See the
    /// [module docs](super::dmabuf) for what is checked.
    pub fn register_dmabuf(
        &self,
        fd: DmabufFd,
        offset: u64,
        len: usize,
        iova: u64,
        access: AccessFlags,
    ) -> Result<DmabufRegion> {
        check_dmabuf_args(fd.as_raw_fd(), offset, len, iova, access)?;
        // On failure `fd` drops at the `?` and is closed: no key to it ever existed.
        // SAFETY: the PD is live; the descriptor is open and owned by `fd`, which outlives the
        // call (and, on success, the registration); ibv_reg_dmabuf_mr reads no memory of ours.
        // What it returns is taken at once.
        let reg = unsafe {
            Registration::taken(
                sys::ibv_reg_dmabuf_mr(
                    self.as_raw(),
                    offset,
                    len,
                    iova,
                    fd.as_raw_fd(),
                    access.bits() as c_int,
                ),
                DmabufStart { offset, iova },
                len,
                access,
                self,
                refusal,
            )
        }?;
        Ok(DmabufRegion {
            reg,
            fd: ManuallyDrop::new(fd),
        })
    }
}

impl DmabufRegion {
    /// The protection domain the region is registered on (the region keeps it alive).
    #[inline]
    pub fn pd(&self) -> &Pd {
        &self.reg.pd
    }

    registration_accessors!();

    /// Where the region starts inside the dma-buf.
    #[inline]
    pub fn offset(&self) -> u64 {
        self.reg.start.offset
    }

    /// The device address of the region's first byte (what entries and peers use).
    #[inline]
    pub fn iova(&self) -> u64 {
        self.reg.start.iova
    }

    /// The dma-buf descriptor the region owns.
    #[inline]
    pub fn dmabuf_fd(&self) -> c_int {
        self.fd.as_raw_fd()
    }

    /// The descriptor peers need to RDMA this region (addressed by `iova`).
    #[inline]
    pub fn remote(&self) -> RemoteMemory {
        self.reg.remote()
    }
}

impl Drop for DmabufRegion {
    fn drop(&mut self) {
        // SAFETY: the descriptor is taken once, here; the field is never used again.
        let fd = unsafe { ManuallyDrop::take(&mut self.fd) };
        release(|| self.reg.deregister(), fd);
    }
}

impl fmt::Debug for DmabufRegion {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.reg
            .debug("DmabufRegion", f)
            .field("fd", &self.fd.as_raw_fd())
            .finish()
    }
}

#[cfg(test)]
mod tests {
    //! The ownership rules without a device (the software model has no dma-buf): the
    //! release order and the argument checks. On rxe, `device_dmabuf` offers a real dma-buf.
    use super::*;
    use core::cell::RefCell;

    /// Records when it is dropped (stands in for the descriptor).
    struct Owner<'a>(&'a RefCell<heapless::Vec<&'static str, 4>>);
    impl Drop for Owner<'_> {
        fn drop(&mut self) {
            self.0.borrow_mut().push("close").unwrap();
        }
    }

    #[test]
    fn the_descriptor_is_closed_after_a_successful_deregistration_and_leaked_after_a_failed_one() {
        let closed: &[&str] = &["deregister", "close"];
        let leaked: &[&str] = &["deregister"];
        for (deregistered, expect) in [(Ok(()), closed), (Err(16), leaked)] {
            let log = RefCell::new(heapless::Vec::new());
            release(
                || {
                    log.borrow_mut().push("deregister").unwrap();
                    deregistered
                },
                Owner(&log),
            );
            assert_eq!(log.borrow().as_slice(), expect, "{deregistered:?}");
        }
    }

    #[test]
    fn arguments_are_checked_before_the_call() {
        let rw = AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE;
        assert!(check_dmabuf_args(3, 0, 4096, 0, rw).is_ok());
        let remote_write = AccessFlags::REMOTE_WRITE;
        for (fd, offset, len, iova, access, what) in [
            (-1, 0, 4096, 0, rw, "negative dma-buf descriptor"),
            (3, 0, 0, 0, rw, "memory region length is zero"),
            (3, u64::MAX, 2, 0, rw, "dma-buf offset + length overflows"),
            (3, 0, 2, u64::MAX - 1, rw, "dma-buf iova + length overflows"),
            (
                3,
                0,
                8,
                0,
                remote_write,
                "remote write or atomic access needs LOCAL_WRITE too",
            ),
        ] {
            assert_eq!(
                check_dmabuf_args(fd, offset, len, iova, access),
                Err(VerbsError::InvalidArgument { what }),
                "{what}"
            );
        }
    }

    #[test]
    fn unsupported_devices_are_named_as_such() {
        assert_eq!(refusal(95), VerbsError::DmabufUnsupported { errno: 95 });
        assert_eq!(refusal(38), VerbsError::DmabufUnsupported { errno: 38 });
        assert_eq!(
            refusal(22),
            VerbsError::Call {
                verb: Verb::RegDmabufMr,
                errno: 22
            }
        );
        extern crate std;
        use std::string::ToString;
        let msg = refusal(95).to_string();
        assert!(
            msg.starts_with("the device does not support dma-buf registration"),
            "{msg}"
        );
        assert!(msg.contains("mlx5") && msg.contains("EOPNOTSUPP"), "{msg}");
    }
}
