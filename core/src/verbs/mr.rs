//! Memory regions: caller memory registered with the device.
//!
//! Two kinds, because remote access changes both who owns the memory and what the CPU may
//! assume:
//! - [`MemoryRegion`]: only this process touches it (local access only). It borrows a plain
//!   slice: the device reaches it only through work requests, and every safe way to post one
//!   waits for it, so the borrow is enough. The CPU gets ordinary slices whenever no work
//!   request borrows the bytes.
//! - [`SharedRegion`]: peers may read, write or atomically modify it at any time (any remote
//!   access). It *owns* its memory ([`OwnedMemory`]), because a peer holding the remote key
//!   can reach it whatever this process does: the memory is freed only after a successful
//!   deregistration, and leaked (never reused) if the region is leaked or deregistration
//!   fails. The CPU never gets a `&[u8]` of it, only volatile copies and loads, so no Rust
//!   reference ever aliases memory the network is changing. It is `Send` but not `Sync`:
//!   its byte views are not atomic, so only one thread uses them at a time.
//!
//! Two regions never trade memory: a region and its memory move together, so
//! `mem::swap` of two regions swaps registrations and memory alike.
//!
//! ```compile_fail,E0597
//! # use rverbs_core::verbs::{AccessFlags, Pd};
//! // A borrowed slice cannot be registered for remote access: the borrow could end (or the
//! // region be forgotten) while a peer still holds the key.
//! fn f(pd: &Pd) {
//!     let mut buf = [0u8; 64];
//!     let _r = pd.register_shared(&mut buf[..], AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE);
//! }
//! ```
//!
//! ```compile_fail,E0277
//! # use rverbs_core::verbs::SharedRegion;
//! // Byte views of memory peers write are not shared between threads.
//! fn is_sync<T: Sync>() {}
//! is_sync::<SharedRegion<'static>>();
//! ```
//!
//! ```compile_fail,E0614
//! # use rverbs_core::verbs::{OwnedRegion, SharedRegion};
//! // An owned region is a shared region; there is no inner region to swap out from under it.
//! fn f(a: &mut OwnedRegion, b: &mut OwnedRegion) {
//!     let (x, y): (&mut SharedRegion<'static>, &mut SharedRegion<'static>) = (&mut **a, &mut **b);
//!     core::mem::swap(x, y);
//! }
//! ```

use core::fmt;
use core::marker::PhantomData;
use core::ops::Range;
use core::ptr::NonNull;

use alloc::boxed::Box;

use super::error::{Result, Verb, VerbsError};
use super::ffi::{errno, sys};
use super::pd::Pd;
pub use crate::memory::AccessFlags;
use crate::memory::{volatile_byte_accessors, OwnedMemory, VolatileBytes};
use crate::sge::{RemoteMemory, Sge, SgeMut};

/// Where a registration starts: the device address of its first byte.
pub(super) trait Start: fmt::Debug {
    /// The address entries and peers use for the first byte.
    fn device_addr(&self) -> u64;
}

impl Start for NonNull<u8> {
    /// `ibv_reg_mr` addresses memory by its CPU address.
    #[inline]
    fn device_addr(&self) -> u64 {
        self.as_ptr().addr() as u64
    }
}

/// The registration every region kind is built on (the two here, and
/// [`DmabufRegion`](super::DmabufRegion)): the MR handle, where it starts (`A`: a CPU address
/// here, a place in a dma-buf there), its keys. Deregistration is the owner's call (see the
/// `Drop` impls), because what a failure means differs.
pub(super) struct Registration<A: Start = NonNull<u8>> {
    raw: NonNull<sys::ibv_mr>,
    pub(super) start: A,
    pub(super) len: usize,
    pub(super) lkey: u32,
    rkey: u32,
    pub(super) access: AccessFlags,
    pub(super) pd: Pd,
}

/// Refuses remote write or atomics without local write (the verbs require it).
pub(super) fn check_access(access: AccessFlags) -> Result<()> {
    if access.intersects(AccessFlags::REMOTE_MUTATION) && !access.contains(AccessFlags::LOCAL_WRITE)
    {
        return Err(VerbsError::InvalidArgument {
            what: "remote write or atomic access needs LOCAL_WRITE too",
        });
    }
    Ok(())
}

impl Registration {
    /// Registers `ptr..ptr+len`; the caller keeps the memory valid as its constructor says.
    fn new(pd: &Pd, ptr: NonNull<u8>, len: usize, access: AccessFlags) -> Result<Self> {
        if len == 0 {
            return Err(VerbsError::InvalidArgument {
                what: "memory region length is zero",
            });
        }
        check_access(access)?;
        // SAFETY: the PD is live; every caller owns or borrows ptr..ptr+len for at least the
        // registration's life (see the public constructors). What ibv_reg_mr returns is
        // taken at once.
        unsafe {
            Self::taken(
                sys::ibv_reg_mr(
                    pd.as_raw(),
                    ptr.as_ptr().cast(),
                    len,
                    access.bits() as core::ffi::c_int,
                ),
                ptr,
                len,
                access,
                pd,
                |errno| VerbsError::Call {
                    verb: Verb::RegMr,
                    errno,
                },
            )
        }
    }

    /// The CPU's volatile view of the bytes.
    #[inline]
    fn bytes(&self) -> VolatileBytes {
        // SAFETY: the registered memory outlives the registration (owned, or borrowed for
        // 'b), and the regions never form references to it except as documented.
        unsafe { VolatileBytes::new(self.start, self.len) }
    }
}

impl<A: Start> Registration<A> {
    /// Takes the MR a registering verb returned for `len` bytes at `start` on `pd` with
    /// `access`: null is a refusal, which `refused` names from the errno.
    ///
    /// # Safety
    /// `raw` is what the verb returned just now (nothing ran in between that could change
    /// errno), and its registration is this value's to deregister.
    pub(super) unsafe fn taken(
        raw: *mut sys::ibv_mr,
        start: A,
        len: usize,
        access: AccessFlags,
        pd: &Pd,
        refused: impl FnOnce(i32) -> VerbsError,
    ) -> Result<Self> {
        let raw = NonNull::new(raw).ok_or_else(|| refused(errno()))?;
        // SAFETY: raw is a live MR; lkey/rkey are plain fields set at registration.
        let (lkey, rkey) = unsafe { ((*raw.as_ptr()).lkey, (*raw.as_ptr()).rkey) };
        Ok(Self {
            raw,
            start,
            len,
            lkey,
            rkey,
            access,
            pd: pd.clone(),
        })
    }

    /// Deregisters; `Err(errno)` if the device refused (the keys then stay valid).
    pub(super) fn deregister(&mut self) -> core::result::Result<(), i32> {
        // SAFETY: raw came from the registering verb and is deregistered once, from the
        // owner's Drop.
        match unsafe { sys::ibv_dereg_mr(self.raw.as_ptr()) } {
            0 => Ok(()),
            e => Err(if e > 0 { e } else { errno() }),
        }
    }

    /// The raw `ibv_mr`.
    #[inline]
    pub(super) fn as_raw(&self) -> *mut sys::ibv_mr {
        self.raw.as_ptr()
    }

    /// The descriptor peers need to RDMA the region (addressed as the device addresses it).
    #[inline]
    pub(super) fn remote(&self) -> RemoteMemory {
        RemoteMemory {
            addr: self.start.device_addr(),
            len: self.len as u64,
            rkey: self.rkey,
        }
    }

    /// `(device address, length)` of `range`, or `None` if it is out of bounds or longer
    /// than an entry can be.
    #[inline]
    pub(super) fn entry(&self, range: &Range<usize>) -> Option<(u64, u32)> {
        if range.start > range.end || range.end > self.len {
            return None;
        }
        let len = u32::try_from(range.end - range.start).ok()?;
        // No overflow: start + len fits (an allocation's end, or checked at registration of
        // a dma-buf), and range.start <= len.
        Some((self.start.device_addr() + range.start as u64, len))
    }

    /// A gather entry (the device reads) for `range`. The caller's borrow of the region is
    /// the entry's.
    #[inline]
    pub(super) fn sge(&self, range: Range<usize>) -> Option<Sge<'_>> {
        let (addr, len) = self.entry(&range)?;
        // SAFETY: in bounds of this registration, whose lkey we pass; the entry borrows the
        // region, which keeps it registered while the entry lives.
        Some(unsafe { Sge::from_raw(addr, len, self.lkey) })
    }

    /// A scatter entry (the device writes) for `range`, if local write is granted.
    #[inline]
    pub(super) fn sge_mut(&mut self, range: Range<usize>) -> Option<SgeMut<'_>> {
        if !self.access.contains(AccessFlags::LOCAL_WRITE) {
            return None;
        }
        let (addr, len) = self.entry(&range)?;
        // SAFETY: in bounds, local write granted, and the exclusive borrow of the region keeps
        // every other local user out while the entry lives.
        Some(unsafe { SgeMut::from_raw(addr, len, self.lkey) })
    }

    /// The region's `Debug`: where it starts, its length, keys and access; the caller may
    /// add fields of its own.
    pub(super) fn debug<'a, 'b>(
        &self,
        name: &str,
        f: &'a mut fmt::Formatter<'b>,
    ) -> fmt::DebugStruct<'a, 'b> {
        let mut d = f.debug_struct(name);
        d.field("addr", &self.start)
            .field("len", &self.len)
            .field("lkey", &self.lkey)
            .field("rkey", &self.rkey)
            .field("access", &self.access);
        d
    }
}

/// Registered memory only this process touches: local access only. See the
/// [module docs](self).
pub struct MemoryRegion<'b> {
    reg: Registration,
    _buf: PhantomData<&'b mut [u8]>,
}

// SAFETY: the region owns an exclusive borrow of its bytes and an MR handle that libibverbs
// lets any thread use; moving it moves that ownership.
unsafe impl Send for MemoryRegion<'_> {}
// SAFETY: &MemoryRegion gives only shared reads of the bytes (as_slice, gather entries) and of
// plain key fields; nobody but this process writes the bytes, and only through &mut.
unsafe impl Sync for MemoryRegion<'_> {}

impl Pd {
    /// Registers `buf` for local use: sources of sends and writes, targets of receives and
    /// reads. `access` may hold only [`AccessFlags::LOCAL_WRITE`] (and
    /// [`AccessFlags::RELAXED_ORDERING`]): memory a peer can reach must be owned by its
    /// registration, see [`Pd::register_shared`].
    pub fn register<'b>(&self, buf: &'b mut [u8], access: AccessFlags) -> Result<MemoryRegion<'b>> {
        if access.intersects(AccessFlags::REMOTE) {
            return Err(VerbsError::InvalidArgument {
                what: "remote access needs memory the region owns: use Pd::register_shared",
            });
        }
        let len = buf.len();
        let reg = Registration::new(self, NonNull::from(buf).cast(), len, access)?;
        Ok(MemoryRegion {
            reg,
            _buf: PhantomData,
        })
    }

    /// Registers memory the region will own, with any access including remote read, write and
    /// atomics: a `Box<[u8]>`, a `&'static mut [u8]`, a [`PageMemory`](crate::memory::PageMemory), or a page-aligned or
    /// huge-page buffer from `rverbs-std-shim`. The memory is freed when the region is dropped
    /// and its deregistration succeeded; otherwise it is leaked, never reused.
    pub fn register_shared<M: OwnedMemory>(
        &self,
        mem: M,
        access: AccessFlags,
    ) -> Result<SharedRegion<'static>> {
        // Box first, then take the pointer: moving the owner into the box after taking it
        // would retag the memory and invalidate the pointer (Miri's aliasing models agree).
        let mut owner: Box<dyn OwnedMemory> = Box::new(mem);
        let (ptr, len) = (owner.base(), owner.size());
        let reg = Registration::new(self, ptr, len, access)?;
        Ok(SharedRegion {
            reg,
            owner: Some(owner),
            _buf: PhantomData,
        })
    }

    /// Registers memory the caller manages itself (an mmap it keeps, device memory), with
    /// any access.
    ///
    /// # Safety
    /// `ptr..ptr+len` must stay allocated, and be accessed by nobody but through the returned
    /// region, until the region is dropped; if the region is leaked (`mem::forget`), forever,
    /// because the peers' keys then stay valid. (If deregistration fails on drop, the process
    /// aborts rather than let the caller free memory a peer can still reach.)
    pub unsafe fn register_raw<'b>(
        &self,
        ptr: *mut u8,
        len: usize,
        access: AccessFlags,
    ) -> Result<SharedRegion<'b>> {
        let ptr = NonNull::new(ptr).ok_or(VerbsError::InvalidArgument {
            what: "null memory region address",
        })?;
        let reg = Registration::new(self, ptr, len, access)?;
        Ok(SharedRegion {
            reg,
            owner: None,
            _buf: PhantomData,
        })
    }
}

/// The accessors every region type shares (here and in `dmabuf.rs`): what its registration
/// says.
macro_rules! registration_accessors {
    () => {
        /// Length in bytes.
        #[inline]
        pub fn len(&self) -> usize {
            self.reg.len
        }

        /// Whether the region is empty (never: registration rejects zero length).
        #[inline]
        pub fn is_empty(&self) -> bool {
            self.reg.len == 0
        }

        /// Local key.
        #[inline]
        pub fn lkey(&self) -> u32 {
            self.reg.lkey
        }

        /// Access the region was registered with.
        #[inline]
        pub fn access(&self) -> AccessFlags {
            self.reg.access
        }

        /// A gather entry (the device reads) for `range`, or `None` if it is out of bounds.
        /// Does not allocate.
        #[inline]
        pub fn sge(&self, range: Range<usize>) -> Option<Sge<'_>> {
            self.reg.sge(range)
        }

        /// A scatter entry (the device writes) for `range`, or `None` if it is out of bounds
        /// or the region lacks local write access. Does not allocate.
        #[inline]
        pub fn sge_mut(&mut self, range: Range<usize>) -> Option<SgeMut<'_>> {
            self.reg.sge_mut(range)
        }

        /// The raw `ibv_mr`.
        pub fn as_raw(&self) -> *mut sys::ibv_mr {
            self.reg.as_raw()
        }
    };
}

pub(super) use registration_accessors;

impl MemoryRegion<'_> {
    registration_accessors!();

    /// The bytes. Borrowing them shares the region, so no [`SgeMut`] can be outstanding.
    #[inline]
    pub fn as_slice(&self) -> &[u8] {
        // SAFETY: ptr..ptr+len is the buffer borrowed for 'b; no peer can reach it (local
        // access only), and device writes need an SgeMut, which borrows self mutably and
        // therefore cannot coexist with this shared borrow.
        unsafe { core::slice::from_raw_parts(self.reg.start.as_ptr(), self.reg.len) }
    }

    /// The bytes, mutably. No work request can name the region while this borrow lives.
    #[inline]
    pub fn as_mut_slice(&mut self) -> &mut [u8] {
        // SAFETY: as for as_slice, and &mut self excludes every Sge and SgeMut.
        unsafe { core::slice::from_raw_parts_mut(self.reg.start.as_ptr(), self.reg.len) }
    }

    /// Splits the region into consecutive scatter entries of `chunk` bytes (the last may be
    /// shorter), for posting many receives. Does not allocate.
    pub fn chunks_mut(&mut self, chunk: usize) -> impl Iterator<Item = SgeMut<'_>> + '_ {
        let r = &self.reg;
        let writable = r.access.contains(AccessFlags::LOCAL_WRITE) && chunk > 0;
        let (base, len, lkey) = (r.start.as_ptr() as u64, r.len, r.lkey);
        let n = if writable { len.div_ceil(chunk) } else { 0 };
        (0..n).map(move |i| {
            let start = i * chunk;
            let l = chunk.min(len - start);
            // SAFETY: the chunks are disjoint and inside the region, which stays mutably
            // borrowed for as long as any of them lives.
            unsafe { SgeMut::from_raw(base + start as u64, l as u32, lkey) }
        })
    }
}

impl Drop for MemoryRegion<'_> {
    fn drop(&mut self) {
        // A failure leaves a registration no peer can use (no remote key was ever valid) and
        // no safe work request can name (entries borrow the region, which is gone), so the
        // borrow may end: the registration leaks, the memory does not matter to the device.
        let _ = self.reg.deregister();
    }
}

impl fmt::Debug for MemoryRegion<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.reg.debug("MemoryRegion", f).finish()
    }
}

/// Registered memory peers may reach at any time; owns its memory unless made with the
/// `unsafe` [`Pd::register_raw`]. See the [module docs](self). The bytes a gather entry of
/// it names may change under the entry if peers write them.
pub struct SharedRegion<'b> {
    // Field order is drop order: `Drop` deregisters before `owner` frees the memory.
    reg: Registration,
    owner: Option<Box<dyn OwnedMemory>>,
    _buf: PhantomData<&'b mut [u8]>,
}

/// A [`SharedRegion`] that owns its memory (what [`Pd::register_shared`] returns).
pub type OwnedRegion = SharedRegion<'static>;

// SAFETY: the region owns its memory (OwnedMemory is Send) or an exclusive borrow of it, and an
// MR handle any thread may use. It is deliberately not Sync: its byte accessors are plain
// volatile loops, which would race between CPUs.
unsafe impl Send for SharedRegion<'_> {}

impl SharedRegion<'_> {
    /// The protection domain the region is registered on (the region keeps it alive).
    #[inline]
    pub fn pd(&self) -> &Pd {
        &self.reg.pd
    }

    registration_accessors!();

    /// The descriptor peers need to RDMA this region.
    #[inline]
    pub fn remote(&self) -> RemoteMemory {
        self.reg.remote()
    }

    #[inline]
    fn bytes(&self) -> VolatileBytes {
        self.reg.bytes()
    }

    volatile_byte_accessors!();

    /// The bytes of `range` as a slice, or `None` if out of bounds. Does not allocate.
    ///
    /// # Safety
    /// Nobody may write the range while the slice lives: no peer (the region grants no
    /// remote write, or the protocol rules it out) and no local work request (no receive or
    /// read targets it until the slice is gone).
    #[inline]
    pub unsafe fn slice_unchecked(&self, range: Range<usize>) -> Option<&[u8]> {
        let (_, len) = self.bytes().entry(&range)?;
        // SAFETY: `entry` checked the range against the region; the caller guarantees nobody
        // writes the bytes meanwhile.
        Some(unsafe {
            core::slice::from_raw_parts(self.reg.start.as_ptr().add(range.start), len as usize)
        })
    }
}

impl Drop for SharedRegion<'_> {
    fn drop(&mut self) {
        if let Err(errno) = self.reg.deregister() {
            match self.owner.take() {
                // Peers may still hold a valid key: the memory must never be reused.
                Some(mem) => core::mem::forget(mem),
                None => crate::fatal::abort(format_args!(
                    "ibv_dereg_mr failed (errno {errno}) for caller-managed memory that peers \
                     may still reach; aborting before the caller can free it"
                )),
            }
        }
    }
}

impl fmt::Debug for SharedRegion<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.reg.debug("SharedRegion", f).finish()
    }
}

crate::memory::region_by_inherent_methods!(SharedRegion<'_>);
