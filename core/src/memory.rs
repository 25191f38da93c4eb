//! Memory a peer may reach, and who owns it.
//!
//! A peer writes, reads or atomically modifies registered memory whenever it likes, through
//! a remote key this process handed out. Nothing on this side can stop it except
//! deregistration. So memory registered for *remote* access must outlive its registration
//! whatever the caller does: drop it, `mem::forget` it, `mem::swap` it, or unwind through it.
//! rverbs guarantees that by ownership: a region registered for remote access *owns* its
//! memory (an [`OwnedMemory`]) and frees it only after a successful deregistration. If
//! deregistration fails, or the region is leaked, the memory is leaked with it and never
//! reused. Borrowing a plain slice for remote access is possible only through an `unsafe`
//! constructor whose contract says the same thing in words.
//!
//! The rules, with the tests that prove them, are listed in `docs/safety.md`.

use core::ops::Range;
use core::ptr::NonNull;

use bitflags::bitflags;

use crate::sge::{RemoteMemory, Sge, SgeMut};

bitflags! {
    /// Access a memory region grants (`ibv_access_flags`): the same flags for a device
    /// region ([`Pd::register`](crate::verbs::Pd::register) and friends) and for the
    /// software model's ([`SoftFabric::register`](crate::model::SoftFabric::register)).
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
    /// Any access that lets a peer reach the bytes.
    pub const REMOTE: Self = Self::REMOTE_MUTATION.union(Self::REMOTE_READ);
}

/// The CPU's view of registered bytes that a peer or the device may change at any time:
/// volatile copies and loads only, never a reference. One implementation for the device's
/// [`SharedRegion`](crate::verbs::SharedRegion) and the model's
/// [`SoftRegion`](crate::model::SoftRegion), so both check bounds and alignment the
/// same way.
#[derive(Clone, Copy, Debug)]
pub(crate) struct VolatileBytes {
    ptr: NonNull<u8>,
    len: usize,
}

impl VolatileBytes {
    /// The view of `ptr..ptr+len`.
    ///
    /// # Safety
    /// The bytes stay allocated while the view (or any copy) is used, and nobody holds a
    /// Rust reference to them.
    #[inline]
    pub(crate) const unsafe fn new(ptr: NonNull<u8>, len: usize) -> Self {
        Self { ptr, len }
    }

    #[inline]
    fn at(&self, offset: usize, n: usize) -> Option<*mut u8> {
        match offset.checked_add(n) {
            // SAFETY: offset + n <= len, so the pointer stays inside the bytes.
            Some(end) if end <= self.len => Some(unsafe { self.ptr.as_ptr().add(offset) }),
            _ => None,
        }
    }

    /// `(address, length)` of `range` for a scatter/gather entry, or `None` if it is out of
    /// bounds or longer than an entry can be.
    #[inline]
    pub(crate) fn entry(&self, range: &Range<usize>) -> Option<(u64, u32)> {
        if range.start > range.end || range.end > self.len {
            return None;
        }
        let len = u32::try_from(range.end - range.start).ok()?;
        Some((self.ptr.as_ptr().addr() as u64 + range.start as u64, len))
    }

    /// The descriptor a peer needs to reach these bytes with `rkey`.
    #[inline]
    pub(crate) fn remote(&self, rkey: u32) -> crate::sge::RemoteMemory {
        crate::sge::RemoteMemory {
            addr: self.ptr.as_ptr().addr() as u64,
            len: self.len as u64,
            rkey,
        }
    }

    #[inline]
    pub(crate) fn read_into(&self, offset: usize, dst: &mut [u8]) -> bool {
        let Some(p) = self.at(offset, dst.len()) else {
            return false;
        };
        for (i, d) in dst.iter_mut().enumerate() {
            // SAFETY: i < dst.len(), inside the checked range; a volatile read of a byte the
            // device may be writing yields some byte value, never UB for u8.
            *d = unsafe { p.add(i).read_volatile() };
        }
        true
    }

    /// Word by word where the destination is 8-aligned (a byte loop costs eight times the
    /// stores, which shows in a datagram's staging copy), byte by byte at the edges.
    #[inline]
    pub(crate) fn write_from(&self, offset: usize, src: &[u8]) -> bool {
        let Some(p) = self.at(offset, src.len()) else {
            return false;
        };
        let head = p.align_offset(8).min(src.len());
        let (edge, rest) = src.split_at(head);
        for (i, s) in edge.iter().enumerate() {
            // SAFETY: in the checked range, as above.
            unsafe { p.add(i).write_volatile(*s) };
        }
        let mut words = rest.chunks_exact(8);
        let mut at = head;
        for w in &mut words {
            let mut b = [0u8; 8];
            b.copy_from_slice(w);
            // SAFETY: at..at + 8 is in the checked range, and `p + at` is 8-aligned (`head`
            // aligned it, and `at` grows by 8).
            unsafe {
                p.add(at)
                    .cast::<u64>()
                    .write_volatile(u64::from_ne_bytes(b))
            };
            at += 8;
        }
        for (i, s) in words.remainder().iter().enumerate() {
            // SAFETY: in the checked range, as above.
            unsafe { p.add(at + i).write_volatile(*s) };
        }
        true
    }

    /// A pointer to a naturally aligned `T` at `offset`: the *address* must be aligned (what
    /// single-copy atomicity needs), not just the offset.
    #[inline]
    fn aligned<T>(&self, offset: usize) -> Option<*mut T> {
        let p = self.at(offset, size_of::<T>())?;
        p.addr()
            .is_multiple_of(align_of::<T>())
            .then_some(p.cast::<T>())
    }

    #[inline]
    pub(crate) fn load_u8(&self, offset: usize) -> Option<u8> {
        let p = self.at(offset, 1)?;
        // SAFETY: in bounds; bytes are always valid u8 values.
        Some(unsafe { p.read_volatile() })
    }

    #[inline]
    pub(crate) fn load_u32(&self, offset: usize) -> Option<u32> {
        let p = self.aligned::<u32>(offset)?;
        // SAFETY: bounds and alignment checked; an aligned 4-byte volatile load is
        // single-copy atomic on the platforms rverbs supports.
        Some(u32::from_le(unsafe { p.read_volatile() }))
    }

    #[inline]
    pub(crate) fn load_u64(&self, offset: usize) -> Option<u64> {
        let p = self.aligned::<u64>(offset)?;
        // SAFETY: bounds and alignment checked; an aligned 8-byte volatile load is
        // single-copy atomic on the platforms rverbs supports.
        Some(u64::from_le(unsafe { p.read_volatile() }))
    }

    #[inline]
    pub(crate) fn store_u64(&self, offset: usize, v: u64) -> bool {
        match self.aligned::<u64>(offset) {
            Some(p) => {
                // SAFETY: bounds and alignment checked.
                unsafe { p.write_volatile(v.to_le()) };
                true
            }
            None => false,
        }
    }
}

/// The byte accessors every region kind offers on top of a [`VolatileBytes`]: one set of
/// docs and one behaviour for the device's `SharedRegion` and the model's `SoftRegion`.
macro_rules! volatile_byte_accessors {
    () => {
        /// Copies `dst.len()` bytes at `offset` out of the region. Returns `false` (copying
        /// nothing) if the range is out of bounds. Does not allocate.
        #[inline]
        pub fn read_into(&self, offset: usize, dst: &mut [u8]) -> bool {
            self.bytes().read_into(offset, dst)
        }

        /// Copies `src` into the region at `offset`. Returns `false` if out of bounds.
        /// Does not allocate.
        #[inline]
        pub fn write_from(&self, offset: usize, src: &[u8]) -> bool {
            self.bytes().write_from(offset, src)
        }

        /// A volatile load of the byte at `offset` (a flag a peer RDMA-writes), or `None` if
        /// out of bounds. Does not allocate.
        #[inline]
        pub fn load_u8(&self, offset: usize) -> Option<u8> {
            self.bytes().load_u8(offset)
        }

        /// A volatile little-endian `u32` load at `offset`, whose address must be 4-aligned.
        /// `None` if misaligned or out of bounds. Does not allocate.
        #[inline]
        pub fn load_u32(&self, offset: usize) -> Option<u32> {
            self.bytes().load_u32(offset)
        }

        /// A volatile little-endian `u64` load at `offset`, whose address must be 8-aligned
        /// (for flags and counters a peer RDMA-writes: such a load is single-copy atomic).
        /// `None` if misaligned or out of bounds. Does not allocate.
        #[inline]
        pub fn load_u64(&self, offset: usize) -> Option<u64> {
            self.bytes().load_u64(offset)
        }

        /// A volatile little-endian `u64` store at an 8-aligned address. Returns `false` if
        /// misaligned or out of bounds. Does not allocate.
        #[inline]
        pub fn store_u64(&self, offset: usize, v: u64) -> bool {
            self.bytes().store_u64(offset, v)
        }
    };
}
pub(crate) use volatile_byte_accessors;

/// Bytes that can be handed to the device for as long as the value lives, wherever the value
/// moves.
///
/// # Safety
/// Implementors promise that:
/// - [`base`](Self::base) returns the start of [`size`](Self::size) bytes that this value owns
///   exclusively (nothing else reads or writes them while the value is owned), the same
///   pointer and length on every call;
/// - moving the value does not move the bytes (they live on the heap, in a mapping, or in a
///   `static`), and the bytes stay allocated until the value is dropped;
/// - dropping the value is the only thing that frees them, so leaking the value (which
///   rverbs does when the device might still reach them) leaks the bytes.
///
/// (The methods are not called `as_ptr` and `len` so that they never shadow the slice methods
/// of the same names where this trait is in scope.)
pub unsafe trait OwnedMemory: Send + 'static {
    /// Start of the bytes.
    fn base(&mut self) -> NonNull<u8>;
    /// Number of bytes.
    fn size(&self) -> usize;
}

#[cfg(feature = "alloc")]
// SAFETY: a boxed slice owns its heap allocation, which does not move with the box and is
// freed only when the box is dropped.
unsafe impl OwnedMemory for alloc::boxed::Box<[u8]> {
    fn base(&mut self) -> NonNull<u8> {
        NonNull::from(&mut **self).cast()
    }
    fn size(&self) -> usize {
        <[u8]>::len(self)
    }
}

// SAFETY: a `'static` exclusive borrow is never freed, and nobody else can reach the bytes
// while it is held; moving the reference does not move them.
unsafe impl OwnedMemory for &'static mut [u8] {
    fn base(&mut self) -> NonNull<u8> {
        NonNull::from(&mut **self).cast()
    }
    fn size(&self) -> usize {
        <[u8]>::len(self)
    }
}

/// Zeroed, page-aligned heap memory (4 KiB pages), the memory rverbs allocates for barrier
/// flags, data windows and receive rings. Allocates once, at setup.
#[cfg(feature = "alloc")]
pub struct PageMemory {
    ptr: NonNull<u8>,
    layout: core::alloc::Layout,
}

#[cfg(feature = "alloc")]
impl PageMemory {
    /// Page size this memory is aligned to.
    pub const PAGE: usize = 4096;

    /// `len` zeroed bytes rounded up to whole pages, or `None` if `len` is zero, too large,
    /// or the allocator has no memory.
    pub fn zeroed(len: usize) -> Option<Self> {
        if len == 0 {
            return None;
        }
        let size = len.checked_next_multiple_of(Self::PAGE)?;
        let layout = core::alloc::Layout::from_size_align(size, Self::PAGE).ok()?;
        // SAFETY: the layout has non-zero size.
        let ptr = NonNull::new(unsafe { alloc::alloc::alloc_zeroed(layout) })?;
        Some(Self { ptr, layout })
    }
}

#[cfg(feature = "alloc")]
impl Drop for PageMemory {
    fn drop(&mut self) {
        // SAFETY: allocated in `zeroed` with this layout, freed once.
        unsafe { alloc::alloc::dealloc(self.ptr.as_ptr(), self.layout) }
    }
}

#[cfg(feature = "alloc")]
// SAFETY: the allocation is owned exclusively, like a Box's, and freed only on drop.
unsafe impl Send for PageMemory {}

#[cfg(feature = "alloc")]
// SAFETY: a heap allocation this value owns alone, freed only on drop; moving the value does
// not move it.
unsafe impl OwnedMemory for PageMemory {
    fn base(&mut self) -> NonNull<u8> {
        self.ptr
    }
    fn size(&self) -> usize {
        self.layout.size()
    }
}

#[cfg(feature = "alloc")]
impl core::fmt::Debug for PageMemory {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("PageMemory")
            .field("addr", &self.ptr)
            .field("len", &self.layout.size())
            .finish()
    }
}

#[cfg(all(test, feature = "alloc"))]
mod tests {
    use super::*;

    #[test]
    fn volatile_bytes_check_bounds_and_address_alignment() {
        let mut m = PageMemory::zeroed(64).unwrap();
        // SAFETY: the page is owned here and no reference to it exists.
        let v = unsafe { VolatileBytes::new(m.base(), 64) };
        assert!(v.store_u64(8, 0x0102_0304_0506_0708));
        assert_eq!(v.load_u64(8), Some(0x0102_0304_0506_0708));
        assert_eq!(v.load_u32(8), Some(0x0506_0708));
        assert_eq!(v.load_u8(8), Some(8));
        assert_eq!(v.load_u64(4), None, "misaligned address");
        assert_eq!(v.load_u32(2), None, "misaligned address");
        assert_eq!(v.load_u64(64), None, "out of bounds");
        assert_eq!(v.load_u8(64), None, "out of bounds");
        assert!(!v.write_from(60, &[0; 8]));
        let mut out = [0u8; 4];
        assert!(v.read_into(8, &mut out));
        assert_eq!(out, [8, 7, 6, 5]);
        // An unaligned base: offset 0 is misaligned for u64, offset 7 is aligned.
        // SAFETY: a sub-range of the same page.
        let off = unsafe { VolatileBytes::new(m.base().add(1), 63) };
        assert_eq!(off.load_u64(0), None);
        assert_eq!(off.load_u64(7), Some(0x0102_0304_0506_0708));
        assert_eq!(off.entry(&(0..8)).map(|e| e.1), Some(8));
        assert_eq!(off.entry(&(0..64)), None);
    }

    #[test]
    fn copies_in_land_byte_exact_at_any_alignment_and_length() {
        let mut m = PageMemory::zeroed(128).unwrap();
        // SAFETY: the page is owned here and no reference to it exists.
        let v = unsafe { VolatileBytes::new(m.base(), 128) };
        let src: [u8; 48] = core::array::from_fn(|i| i as u8 + 1);
        for offset in 0..17 {
            for len in 0..=src.len() {
                assert!(v.write_from(0, &[0u8; 128]));
                assert!(v.write_from(offset, &src[..len]));
                let mut back = [0u8; 128];
                assert!(v.read_into(0, &mut back));
                assert!(back[..offset].iter().all(|&b| b == 0));
                assert_eq!(&back[offset..offset + len], &src[..len]);
                assert!(back[offset + len..].iter().all(|&b| b == 0));
            }
        }
        assert!(!v.write_from(100, &src[..29]), "out of bounds");
    }

    #[test]
    fn page_memory_is_zeroed_aligned_and_rounded() {
        let mut m = PageMemory::zeroed(5000).unwrap();
        assert_eq!(m.size(), 8192);
        let p = m.base();
        assert_eq!(p.as_ptr() as usize % PageMemory::PAGE, 0);
        // SAFETY: p..p+len is the allocation, owned here.
        let bytes = unsafe { core::slice::from_raw_parts(p.as_ptr(), m.size()) };
        assert!(bytes.iter().all(|&b| b == 0));
        assert!(PageMemory::zeroed(0).is_none());
        assert!(PageMemory::zeroed(usize::MAX).is_none());
    }
}

/// Registered memory as the node layer and receive rings use it, on the device
/// (`SharedRegion`) or on the software model: a key for peers, volatile loads of flags peers
/// write, and entries for local work requests. Implemented by rverbs' region types.
///
/// # Safety
/// [`RecvRing`](crate::channel::RecvRing) and [`Node`](crate::node::Node) hand the device
/// entries from this trait and, when a caller swapped a channel out from under them, leak the
/// region instead of dropping it. Implementors promise that:
/// - the entries ([`sge`](Self::sge), [`sge_mut`](Self::sge_mut)) and slices point into
///   memory the region owns or borrows for at least as long as any queue pair that could use
///   them exists, **and that leaking the region (`mem::forget`) keeps that memory allocated
///   and unused by anything else for ever** (owned memory: leaked with it; borrowed memory:
///   borrowed for the life of the whole fabric, as the software model's are);
/// - an entry's address and key stay those of the same bytes while the region lives, moved
///   or not (the memory is not inside the region value itself), so an entry taken once may
///   be posted again later: a [`RecvRing`](crate::channel::RecvRing) takes its slots' entry
///   once, when it is made;
/// - nothing but the region's own methods, called by whoever holds it, writes the memory
///   locally, and nothing lets a peer write it unless its access says so (no handle that
///   outlives a move of the region into a ring writes memory registered without remote
///   write or atomic access);
/// - [`len`](Self::len) and [`access`](Self::access) tell the truth about the registration.
///
/// A region over a plain borrow (`MemoryRegion<'b>`) cannot promise the first point: leaking
/// it ends the borrow while the device may still write.
pub unsafe trait Region {
    /// Length in bytes.
    fn len(&self) -> usize;
    /// Whether the region is empty.
    fn is_empty(&self) -> bool {
        self.len() == 0
    }
    /// The descriptor peers need to RDMA this region.
    fn remote(&self) -> RemoteMemory;
    /// The access it was registered with.
    fn access(&self) -> AccessFlags;
    /// A volatile little-endian `u64` load at an 8-aligned address; `None` if misaligned or
    /// out of bounds.
    fn load_u64(&self, offset: usize) -> Option<u64>;
    /// Copies bytes at `offset` out of the region; `false` (copying nothing) if out of bounds.
    fn read_into(&self, offset: usize, dst: &mut [u8]) -> bool;
    /// Copies `src` into the region at `offset`; `false` if out of bounds.
    fn write_from(&self, offset: usize, src: &[u8]) -> bool;
    /// A gather entry for `range`.
    fn sge(&self, range: Range<usize>) -> Option<Sge<'_>>;
    /// A scatter entry for `range`, if the region has local write access.
    fn sge_mut(&mut self, range: Range<usize>) -> Option<SgeMut<'_>>;
    /// The bytes of `range` as a slice, or `None` if out of bounds.
    ///
    /// # Safety
    /// Nobody may write the range while the slice lives: no peer and no local work request.
    unsafe fn slice_unchecked(&self, range: Range<usize>) -> Option<&[u8]>;
}

/// Implements [`Region`] for a region type by forwarding to its inherent methods of the same
/// names (which take precedence over the trait's in `Self::` paths).
macro_rules! region_by_inherent_methods {
    ($t:ty) => {
        // SAFETY: the region owns its memory (or borrows it for the fabric's whole life) and
        // leaking it leaks that memory; its length and access are those it was registered
        // with (see each type's registration).
        unsafe impl $crate::memory::Region for $t {
            #[inline]
            fn len(&self) -> usize {
                Self::len(self)
            }
            #[inline]
            fn remote(&self) -> $crate::sge::RemoteMemory {
                Self::remote(self)
            }
            #[inline]
            fn access(&self) -> $crate::memory::AccessFlags {
                Self::access(self)
            }
            #[inline]
            fn load_u64(&self, offset: usize) -> Option<u64> {
                Self::load_u64(self, offset)
            }
            #[inline]
            fn read_into(&self, offset: usize, dst: &mut [u8]) -> bool {
                Self::read_into(self, offset, dst)
            }
            #[inline]
            fn write_from(&self, offset: usize, src: &[u8]) -> bool {
                Self::write_from(self, offset, src)
            }
            #[inline]
            fn sge(&self, range: core::ops::Range<usize>) -> Option<$crate::sge::Sge<'_>> {
                Self::sge(self, range)
            }
            #[inline]
            fn sge_mut(
                &mut self,
                range: core::ops::Range<usize>,
            ) -> Option<$crate::sge::SgeMut<'_>> {
                Self::sge_mut(self, range)
            }
            #[inline]
            unsafe fn slice_unchecked(&self, range: core::ops::Range<usize>) -> Option<&[u8]> {
                // SAFETY: forwarded contract.
                unsafe { Self::slice_unchecked(self, range) }
            }
        }
    };
}
pub(crate) use region_by_inherent_methods;

/// Whether a shared receive queue is gone: after that no receive posted to it can reach
/// memory. Its owner marks it when the queue is destroyed; whoever freed memory its
/// receives named asks it first (and leaks the memory if the queue lives on).
#[cfg(feature = "alloc")]
#[derive(Clone, Debug)]
pub struct SrqProbe(Option<alloc::sync::Arc<core::sync::atomic::AtomicBool>>);

#[cfg(feature = "alloc")]
impl SrqProbe {
    /// A probe for a queue that is still there; [`SrqProbe::mark_gone`] once it is
    /// destroyed. Allocates.
    pub fn pending() -> Self {
        Self(Some(alloc::sync::Arc::new(
            core::sync::atomic::AtomicBool::new(false),
        )))
    }

    /// A probe for receives that can never reach memory whose region was dropped (the
    /// software model resolves keys when a message arrives, and its buffers are borrowed for
    /// the whole life of the net).
    pub const fn released() -> Self {
        Self(None)
    }

    /// Records that the queue is destroyed.
    pub fn mark_gone(&self) {
        if let Some(f) = &self.0 {
            f.store(true, core::sync::atomic::Ordering::Release);
        }
    }

    /// Whether no receive posted to the queue can reach memory any more.
    pub fn is_gone(&self) -> bool {
        self.0
            .as_ref()
            .is_none_or(|f| f.load(core::sync::atomic::Ordering::Acquire))
    }
}
