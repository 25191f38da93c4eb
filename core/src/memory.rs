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

use core::ptr::NonNull;

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
