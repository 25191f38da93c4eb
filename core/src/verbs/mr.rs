//! Memory regions: caller memory registered with the device.
//!
//! Two kinds, because remote write access changes what the CPU may assume:
//! - [`MemoryRegion`]: only this process writes it (local write, and at most remote *read*
//!   access). The CPU gets ordinary slices whenever no work request borrows the bytes.
//! - [`SharedRegion`]: peers may write it at any time (remote write or atomic access). The CPU
//!   never gets a `&[u8]` of it, only volatile copies and loads, so no Rust reference ever
//!   aliases memory the network is changing.

use core::fmt;
use core::marker::PhantomData;
use core::ops::Range;
use core::ptr::NonNull;

use bitflags::bitflags;

use super::error::{Result, Verb, VerbsError};
use super::ffi::{errno, sys};
use super::pd::Pd;
use crate::sge::{RemoteMemory, Sge, SgeMut};

bitflags! {
    /// Access a memory region grants (`ibv_access_flags`).
    #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
    pub struct AccessFlags: u32 {
        /// The local device may write (receives, RDMA read targets). Required by remote write.
        const LOCAL_WRITE = 1;
        /// Peers may RDMA-write into the region.
        const REMOTE_WRITE = 2;
        /// Peers may RDMA-read the region.
        const REMOTE_READ = 4;
        /// Peers may perform atomics on the region.
        const REMOTE_ATOMIC = 8;
        /// The device may reorder writes to this memory (PCIe relaxed ordering), if supported.
        const RELAXED_ORDERING = 1 << 20;
    }
}

impl AccessFlags {
    /// Access that lets peers change the bytes behind the CPU's back.
    pub const REMOTE_MUTATION: Self = Self::REMOTE_WRITE.union(Self::REMOTE_ATOMIC);
}

fn reg(pd: &Pd, ptr: *mut u8, len: usize, access: AccessFlags) -> Result<NonNull<sys::ibv_mr>> {
    if len == 0 {
        return Err(VerbsError::InvalidArgument {
            what: "memory region length is zero",
        });
    }
    if access.intersects(AccessFlags::REMOTE_MUTATION) && !access.contains(AccessFlags::LOCAL_WRITE)
    {
        return Err(VerbsError::InvalidArgument {
            what: "remote write or atomic access needs LOCAL_WRITE too",
        });
    }
    // SAFETY: the PD is live; the caller vouches that ptr..ptr+len is memory it owns for the
    // region's lifetime (see the public constructors).
    let raw = unsafe {
        sys::ibv_reg_mr(
            pd.as_raw(),
            ptr.cast(),
            len,
            access.bits() as core::ffi::c_int,
        )
    };
    NonNull::new(raw).ok_or(VerbsError::Call {
        verb: Verb::RegMr,
        errno: errno(),
    })
}

fn dereg(raw: NonNull<sys::ibv_mr>) {
    // SAFETY: raw came from ibv_reg_mr and is deregistered once, from Drop. A failure here
    // cannot be reported from drop; the registration then leaks.
    unsafe {
        sys::ibv_dereg_mr(raw.as_ptr());
    }
}

fn keys(raw: NonNull<sys::ibv_mr>) -> (u32, u32) {
    // SAFETY: raw is a live MR; lkey/rkey are plain fields set at registration.
    unsafe { ((*raw.as_ptr()).lkey, (*raw.as_ptr()).rkey) }
}

/// Checks `range` against a region of `len` bytes and converts it to (offset, len as u32).
#[inline]
fn check_range(range: &Range<usize>, len: usize) -> Option<(usize, u32)> {
    if range.start <= range.end && range.end <= len {
        u32::try_from(range.end - range.start)
            .ok()
            .map(|l| (range.start, l))
    } else {
        None
    }
}

/// Registered memory that only this process writes. See the [module docs](self).
pub struct MemoryRegion<'b> {
    raw: NonNull<sys::ibv_mr>,
    ptr: NonNull<u8>,
    len: usize,
    lkey: u32,
    rkey: u32,
    access: AccessFlags,
    _pd: Pd,
    _buf: PhantomData<&'b mut [u8]>,
}

// SAFETY: the region owns an exclusive borrow of its bytes and an MR handle that libibverbs
// lets any thread use; moving it moves that ownership.
unsafe impl Send for MemoryRegion<'_> {}
// SAFETY: &MemoryRegion gives only shared reads of the bytes and of plain key fields.
unsafe impl Sync for MemoryRegion<'_> {}

impl Pd {
    /// Registers `buf`. `access` may not include [`AccessFlags::REMOTE_WRITE`] or
    /// [`AccessFlags::REMOTE_ATOMIC`]: memory peers can change goes in a [`SharedRegion`].
    pub fn register<'b>(&self, buf: &'b mut [u8], access: AccessFlags) -> Result<MemoryRegion<'b>> {
        if access.intersects(AccessFlags::REMOTE_MUTATION) {
            return Err(VerbsError::InvalidArgument {
                what: "remote write/atomic access needs Pd::register_shared",
            });
        }
        let len = buf.len();
        let ptr = NonNull::from(buf).cast::<u8>();
        let raw = reg(self, ptr.as_ptr(), len, access)?;
        let (lkey, rkey) = keys(raw);
        Ok(MemoryRegion {
            raw,
            ptr,
            len,
            lkey,
            rkey,
            access,
            _pd: self.clone(),
            _buf: PhantomData,
        })
    }

    /// Registers `buf` with any access, including remote write and atomics.
    pub fn register_shared<'b>(
        &self,
        buf: &'b mut [u8],
        access: AccessFlags,
    ) -> Result<SharedRegion<'b>> {
        let len = buf.len();
        let ptr = NonNull::from(buf).cast::<u8>();
        // SAFETY: buf is exclusively borrowed for 'b, which the region carries.
        unsafe { self.register_raw(ptr.as_ptr(), len, access) }
    }

    /// Registers memory the caller manages itself (mmap, huge pages, device memory).
    ///
    /// # Safety
    /// `ptr..ptr+len` must stay allocated, and must be accessed by nobody but through the
    /// returned region, until the region is dropped and `'b` ends.
    pub unsafe fn register_raw<'b>(
        &self,
        ptr: *mut u8,
        len: usize,
        access: AccessFlags,
    ) -> Result<SharedRegion<'b>> {
        let nn = NonNull::new(ptr).ok_or(VerbsError::InvalidArgument {
            what: "null memory region address",
        })?;
        let raw = reg(self, ptr, len, access)?;
        let (lkey, rkey) = keys(raw);
        Ok(SharedRegion {
            raw,
            ptr: nn,
            len,
            lkey,
            rkey,
            access,
            _pd: self.clone(),
            _buf: PhantomData,
        })
    }
}

impl<'b> MemoryRegion<'b> {
    /// Length in bytes.
    #[inline]
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the region is empty (never: registration rejects zero length).
    #[inline]
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Local key.
    #[inline]
    pub fn lkey(&self) -> u32 {
        self.lkey
    }

    /// Access the region was registered with.
    #[inline]
    pub fn access(&self) -> AccessFlags {
        self.access
    }

    /// The bytes. Borrowing them shares the region, so no [`SgeMut`] can be outstanding.
    #[inline]
    pub fn as_slice(&self) -> &[u8] {
        // SAFETY: ptr..ptr+len is the buffer borrowed for 'b; nobody but this process writes
        // it (no remote-write access), and device writes need an SgeMut, which borrows self
        // mutably and therefore cannot coexist with this shared borrow.
        unsafe { core::slice::from_raw_parts(self.ptr.as_ptr(), self.len) }
    }

    /// The bytes, mutably. No work request can name the region while this borrow lives.
    #[inline]
    pub fn as_mut_slice(&mut self) -> &mut [u8] {
        // SAFETY: as for as_slice, and &mut self excludes every Sge and SgeMut.
        unsafe { core::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.len) }
    }

    /// A gather entry (the device reads) for `range`, or `None` if it is out of bounds.
    /// Does not allocate.
    #[inline]
    pub fn sge(&self, range: Range<usize>) -> Option<Sge<'_>> {
        let (off, len) = check_range(&range, self.len)?;
        // SAFETY: in bounds of this region, whose lkey we pass; the shared borrow keeps the
        // CPU from writing while the entry lives.
        Some(unsafe { Sge::from_raw(self.ptr.as_ptr() as u64 + off as u64, len, self.lkey) })
    }

    /// A scatter entry (the device writes) for `range`, or `None` if it is out of bounds or
    /// the region lacks local write access. Does not allocate.
    #[inline]
    pub fn sge_mut(&mut self, range: Range<usize>) -> Option<SgeMut<'_>> {
        if !self.access.contains(AccessFlags::LOCAL_WRITE) {
            return None;
        }
        let (off, len) = check_range(&range, self.len)?;
        // SAFETY: in bounds, local write granted, and the exclusive borrow keeps everyone else
        // out while the entry lives.
        Some(unsafe { SgeMut::from_raw(self.ptr.as_ptr() as u64 + off as u64, len, self.lkey) })
    }

    /// Splits the region into consecutive scatter entries of `chunk` bytes (the last may be
    /// shorter), for posting many receives. Does not allocate.
    pub fn chunks_mut(&mut self, chunk: usize) -> impl Iterator<Item = SgeMut<'_>> + '_ {
        let writable = self.access.contains(AccessFlags::LOCAL_WRITE) && chunk > 0;
        let (base, len, lkey) = (self.ptr.as_ptr() as u64, self.len, self.lkey);
        let n = if writable { len.div_ceil(chunk) } else { 0 };
        (0..n).map(move |i| {
            let start = i * chunk;
            let l = chunk.min(len - start);
            // SAFETY: the chunks are disjoint and inside the region, which stays mutably
            // borrowed for as long as any of them lives.
            unsafe { SgeMut::from_raw(base + start as u64, l as u32, lkey) }
        })
    }

    /// The descriptor peers need to RDMA-read this region, if it grants remote read.
    pub fn remote(&self) -> Option<RemoteMemory> {
        self.access
            .contains(AccessFlags::REMOTE_READ)
            .then_some(RemoteMemory {
                addr: self.ptr.as_ptr() as u64,
                len: self.len as u64,
                rkey: self.rkey,
            })
    }

    /// The raw `ibv_mr`.
    pub fn as_raw(&self) -> *mut sys::ibv_mr {
        self.raw.as_ptr()
    }
}

impl Drop for MemoryRegion<'_> {
    fn drop(&mut self) {
        dereg(self.raw);
    }
}

impl fmt::Debug for MemoryRegion<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MemoryRegion")
            .field("addr", &self.ptr)
            .field("len", &self.len)
            .field("lkey", &self.lkey)
            .field("access", &self.access)
            .finish()
    }
}

/// Registered memory peers may write at any time. See the [module docs](self).
pub struct SharedRegion<'b> {
    raw: NonNull<sys::ibv_mr>,
    ptr: NonNull<u8>,
    len: usize,
    lkey: u32,
    rkey: u32,
    access: AccessFlags,
    _pd: Pd,
    _buf: PhantomData<&'b mut [u8]>,
}

// SAFETY: as for MemoryRegion; every CPU access goes through volatile raw-pointer copies.
unsafe impl Send for SharedRegion<'_> {}
// SAFETY: concurrent volatile reads and writes of plain bytes through raw pointers are no
// worse than what the network already does to this memory; no reference is ever formed.
unsafe impl Sync for SharedRegion<'_> {}

impl SharedRegion<'_> {
    /// Length in bytes.
    #[inline]
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the region is empty.
    #[inline]
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Local key.
    #[inline]
    pub fn lkey(&self) -> u32 {
        self.lkey
    }

    /// Access the region was registered with.
    #[inline]
    pub fn access(&self) -> AccessFlags {
        self.access
    }

    /// The descriptor peers need to RDMA this region.
    #[inline]
    pub fn remote(&self) -> RemoteMemory {
        RemoteMemory {
            addr: self.ptr.as_ptr() as u64,
            len: self.len as u64,
            rkey: self.rkey,
        }
    }

    /// Copies `dst.len()` bytes at `offset` out of the region. Returns `false` (copying
    /// nothing) if the range is out of bounds. Does not allocate.
    #[inline]
    pub fn read_into(&self, offset: usize, dst: &mut [u8]) -> bool {
        match offset.checked_add(dst.len()) {
            Some(end) if end <= self.len => {}
            _ => return false,
        }
        for (i, d) in dst.iter_mut().enumerate() {
            // SAFETY: offset+i < len, inside the registered buffer; a volatile read of a byte
            // the device may be writing yields some byte value, never UB for u8.
            *d = unsafe { self.ptr.as_ptr().add(offset + i).read_volatile() };
        }
        true
    }

    /// Copies `src` into the region at `offset`. Returns `false` if out of bounds.
    #[inline]
    pub fn write_from(&self, offset: usize, src: &[u8]) -> bool {
        match offset.checked_add(src.len()) {
            Some(end) if end <= self.len => {}
            _ => return false,
        }
        for (i, s) in src.iter().enumerate() {
            // SAFETY: in bounds, as above.
            unsafe { self.ptr.as_ptr().add(offset + i).write_volatile(*s) };
        }
        true
    }

    /// The bytes of `range` as a slice, or `None` if out of bounds. Does not allocate.
    ///
    /// # Safety
    /// Nobody may write the range while the slice lives: no peer (the region grants no
    /// remote write, or the protocol rules it out) and no local work request (no receive or
    /// read targets it until the slice is gone).
    #[inline]
    pub unsafe fn slice_unchecked(&self, range: Range<usize>) -> Option<&[u8]> {
        let (off, len) = check_range(&range, self.len)?;
        // SAFETY: in bounds; the caller guarantees nobody writes the bytes meanwhile.
        Some(unsafe { core::slice::from_raw_parts(self.ptr.as_ptr().add(off), len as usize) })
    }

    /// A volatile little-endian `u64` load at an 8-aligned `offset` (for flags and counters a
    /// peer RDMA-writes). `None` if misaligned or out of bounds. Does not allocate.
    #[inline]
    pub fn load_u64(&self, offset: usize) -> Option<u64> {
        let p = self.u64_ptr(offset)?;
        // SAFETY: u64_ptr checked bounds and alignment; an 8-byte aligned volatile load is
        // single-copy atomic on the platforms rverbs supports.
        Some(u64::from_le(unsafe { p.read_volatile() }))
    }

    /// A volatile little-endian `u64` store at an 8-aligned `offset`.
    #[inline]
    pub fn store_u64(&self, offset: usize, v: u64) -> bool {
        match self.u64_ptr(offset) {
            Some(p) => {
                // SAFETY: bounds and alignment checked.
                unsafe { p.write_volatile(v.to_le()) };
                true
            }
            None => false,
        }
    }

    #[inline]
    fn u64_ptr(&self, offset: usize) -> Option<*mut u64> {
        let end = offset.checked_add(8)?;
        if end > self.len {
            return None;
        }
        // SAFETY: offset + 8 <= len, so the pointer stays inside the buffer.
        let p = unsafe { self.ptr.as_ptr().add(offset) };
        (p as usize).is_multiple_of(8).then_some(p.cast::<u64>())
    }

    /// A gather entry for `range`. The bytes may change under it if peers write them.
    #[inline]
    pub fn sge(&self, range: Range<usize>) -> Option<Sge<'_>> {
        let (off, len) = check_range(&range, self.len)?;
        // SAFETY: in bounds of this region with our lkey.
        Some(unsafe { Sge::from_raw(self.ptr.as_ptr() as u64 + off as u64, len, self.lkey) })
    }

    /// A scatter entry for `range`, if the region has local write access.
    #[inline]
    pub fn sge_mut(&mut self, range: Range<usize>) -> Option<SgeMut<'_>> {
        if !self.access.contains(AccessFlags::LOCAL_WRITE) {
            return None;
        }
        let (off, len) = check_range(&range, self.len)?;
        // SAFETY: in bounds, local write granted, exclusively borrowed.
        Some(unsafe { SgeMut::from_raw(self.ptr.as_ptr() as u64 + off as u64, len, self.lkey) })
    }

    /// The raw `ibv_mr`.
    pub fn as_raw(&self) -> *mut sys::ibv_mr {
        self.raw.as_ptr()
    }
}

impl Drop for SharedRegion<'_> {
    fn drop(&mut self) {
        dereg(self.raw);
    }
}

impl fmt::Debug for SharedRegion<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SharedRegion")
            .field("addr", &self.ptr)
            .field("len", &self.len)
            .field("lkey", &self.lkey)
            .field("rkey", &self.rkey)
            .field("access", &self.access)
            .finish()
    }
}

/// Page-aligned, zeroed memory that rverbs allocates (at setup time) and registers itself:
/// a [`SharedRegion`] that owns its bytes. Used for barrier flags and data windows.
pub struct OwnedRegion {
    // Field order is drop order: deregister before freeing.
    region: SharedRegion<'static>,
    _mem: OwnedMem,
}

/// A heap allocation freed on drop.
struct OwnedMem {
    ptr: NonNull<u8>,
    layout: core::alloc::Layout,
}

impl Drop for OwnedMem {
    fn drop(&mut self) {
        // SAFETY: allocated with this layout in Pd::alloc_region; the region that used it was
        // dropped first (it is declared before this field in OwnedRegion).
        unsafe { alloc::alloc::dealloc(self.ptr.as_ptr(), self.layout) }
    }
}

// SAFETY: owns its allocation exclusively; the region is Send + Sync.
unsafe impl Send for OwnedRegion {}
// SAFETY: shared access goes through SharedRegion's volatile accessors.
unsafe impl Sync for OwnedRegion {}

impl Pd {
    /// Allocates `len` zeroed, page-aligned bytes and registers them with `access`.
    pub fn alloc_region(&self, len: usize, access: AccessFlags) -> Result<OwnedRegion> {
        let layout = core::alloc::Layout::from_size_align(len.max(1), 4096).map_err(|_| {
            VerbsError::InvalidArgument {
                what: "region length",
            }
        })?;
        // SAFETY: the layout has non-zero size.
        let ptr = NonNull::new(unsafe { alloc::alloc::alloc_zeroed(layout) }).ok_or(
            VerbsError::Call {
                verb: Verb::RegMr,
                errno: 12,
            },
        )?;
        let mem = OwnedMem { ptr, layout };
        // SAFETY: ptr..ptr+len is our fresh allocation, freed only after the region is
        // dropped (field order), and reached only through the region.
        let region = unsafe { self.register_raw(ptr.as_ptr(), layout.size(), access) }?;
        Ok(OwnedRegion { region, _mem: mem })
    }
}

impl core::ops::Deref for OwnedRegion {
    type Target = SharedRegion<'static>;
    fn deref(&self) -> &Self::Target {
        &self.region
    }
}

impl core::ops::DerefMut for OwnedRegion {
    fn deref_mut(&mut self) -> &mut Self::Target {
        &mut self.region
    }
}

impl fmt::Debug for OwnedRegion {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.region.fmt(f)
    }
}
