//! A registered region that runs a callback when it is dropped: how a test sees when a layer
//! that took ownership of a buffer (an async operation, a datagram endpoint) let it go.

use core::ops::Range;

use rverbs_core::memory::{AccessFlags, Region};
use rverbs_core::sge::{RemoteMemory, Sge, SgeMut};

/// The `N` bytes at `offset` of `region`; panics if they are out of bounds.
pub fn bytes<const N: usize>(region: &(impl Region + ?Sized), offset: usize) -> [u8; N] {
    let mut b = [0u8; N];
    assert!(
        region.read_into(offset, &mut b),
        "{N} bytes at {offset} are out of the region's bounds"
    );
    b
}

/// `region`, which calls `on_drop` with itself when it is dropped; a [`Region`] like it.
#[derive(Debug)]
pub struct OnDrop<R: Region, F: FnMut(&R)> {
    region: R,
    on_drop: F,
}

impl<R: Region, F: FnMut(&R)> OnDrop<R, F> {
    /// Wraps `region`; `on_drop` runs when the wrapper is dropped, before the region is.
    pub fn new(region: R, on_drop: F) -> Self {
        Self { region, on_drop }
    }
}

impl<R: Region, F: FnMut(&R)> Drop for OnDrop<R, F> {
    fn drop(&mut self) {
        (self.on_drop)(&self.region);
    }
}

// SAFETY: every method forwards to `region`, a `Region` whose memory the wrapper owns and
// drops with itself; the callback only reads it. So the wrapper keeps every promise the
// wrapped region makes, for exactly as long.
unsafe impl<R: Region, F: FnMut(&R)> Region for OnDrop<R, F> {
    fn len(&self) -> usize {
        self.region.len()
    }
    fn remote(&self) -> RemoteMemory {
        self.region.remote()
    }
    fn access(&self) -> AccessFlags {
        self.region.access()
    }
    fn load_u64(&self, offset: usize) -> Option<u64> {
        self.region.load_u64(offset)
    }
    fn read_into(&self, offset: usize, dst: &mut [u8]) -> bool {
        self.region.read_into(offset, dst)
    }
    fn write_from(&self, offset: usize, src: &[u8]) -> bool {
        self.region.write_from(offset, src)
    }
    fn sge(&self, range: Range<usize>) -> Option<Sge<'_>> {
        self.region.sge(range)
    }
    fn sge_mut(&mut self, range: Range<usize>) -> Option<SgeMut<'_>> {
        self.region.sge_mut(range)
    }
    unsafe fn slice_unchecked(&self, range: Range<usize>) -> Option<&[u8]> {
        // SAFETY: the caller keeps `Region::slice_unchecked`'s contract, which we forward.
        unsafe { self.region.slice_unchecked(range) }
    }
}
