//! Registered memory as its owner sees it: keys, scatter/gather entries, volatile copies.

use core::fmt;
use core::ops::Range;

use crate::sge::{RemoteMemory, Sge, SgeMut};

use super::fabric::Shared;
#[cfg(doc)]
use super::SoftFabric;
use super::{Side, SoftAccess};

/// Memory registered with one side of a [`SoftFabric`]; deregistered on drop.
///
/// Peers may write it (with [`SoftAccess::REMOTE_WRITE`]) whenever the model runs, so the CPU
/// reaches its bytes only through volatile copies, never through a slice.
pub struct SoftRegion<'f> {
    pub(super) shared: &'f Shared,
    pub(super) side: Side,
    pub(super) slot: usize,
    pub(super) ptr: *mut u8,
    pub(super) len: usize,
    pub(super) lkey: u32,
    pub(super) rkey: u32,
    pub(super) access: SoftAccess,
}

impl fmt::Debug for SoftRegion<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SoftRegion")
            .field("side", &self.side)
            .field("len", &self.len)
            .field("lkey", &self.lkey)
            .field("rkey", &self.rkey)
            .field("access", &self.access)
            .finish()
    }
}

impl Drop for SoftRegion<'_> {
    fn drop(&mut self) {
        let mut st = self.shared.state.borrow_mut();
        if let Some(r) = st[self.side.index()].regions.get_mut(self.slot) {
            r.live = false;
            r.ptr = core::ptr::null_mut();
        }
    }
}

/// `offset..offset+len` if it lies inside `0..bound`.
fn in_bounds(offset: usize, len: usize, bound: usize) -> bool {
    offset.checked_add(len).is_some_and(|end| end <= bound)
}

impl SoftRegion<'_> {
    /// Length in bytes.
    #[inline]
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the region is empty (never: registration rejects empty buffers).
    #[inline]
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The side it is registered with.
    #[inline]
    pub fn side(&self) -> Side {
        self.side
    }

    /// Local key.
    #[inline]
    pub fn lkey(&self) -> u32 {
        self.lkey
    }

    /// Remote key.
    #[inline]
    pub fn rkey(&self) -> u32 {
        self.rkey
    }

    /// Access the region was registered with.
    #[inline]
    pub fn access(&self) -> SoftAccess {
        self.access
    }

    /// The descriptor the peer needs to RDMA the region (which succeeds only with the
    /// matching remote access).
    pub fn remote(&self) -> RemoteMemory {
        RemoteMemory {
            addr: self.ptr.addr() as u64,
            len: self.len as u64,
            rkey: self.rkey,
        }
    }

    fn range(&self, range: &Range<usize>) -> Option<(u64, u32)> {
        if range.start > range.end || range.end > self.len {
            return None;
        }
        let len = u32::try_from(range.end - range.start).ok()?;
        Some((self.ptr.addr() as u64 + range.start as u64, len))
    }

    /// A gather entry (the queue pair reads) for `range`, or `None` if out of bounds.
    /// Does not allocate.
    pub fn sge(&self, range: Range<usize>) -> Option<Sge<'_>> {
        let (addr, len) = self.range(&range)?;
        // SAFETY: the range lies inside this region, whose lkey stays valid while the entry
        // borrows it; the model never writes through a gather entry.
        Some(unsafe { Sge::from_raw(addr, len, self.lkey) })
    }

    /// A scatter entry (the queue pair writes) for `range`, or `None` if out of bounds or
    /// the region lacks local write access. Does not allocate.
    pub fn sge_mut(&mut self, range: Range<usize>) -> Option<SgeMut<'_>> {
        let [e] = self.sges_mut([range])?;
        Some(e)
    }

    /// Several scatter entries at once, for scatter lists into one region: `None` if one is
    /// out of bounds, two overlap, or the region lacks local write access. Does not allocate.
    pub fn sges_mut<const N: usize>(
        &mut self,
        ranges: [Range<usize>; N],
    ) -> Option<[SgeMut<'_>; N]> {
        if !self.access.contains(SoftAccess::LOCAL_WRITE) {
            return None;
        }
        let mut parts = [(0u64, 0u32); N];
        for (i, r) in ranges.iter().enumerate() {
            parts[i] = self.range(r)?;
            let overlaps = ranges[..i]
                .iter()
                .any(|o| r.start < o.end && o.start < r.end);
            if overlaps {
                return None;
            }
        }
        // SAFETY: each range lies inside this region, which has local write access and stays
        // registered while the entries borrow it mutably; the ranges are pairwise disjoint,
        // and the `&mut self` borrow keeps the CPU out of the bytes meanwhile.
        Some(parts.map(|(addr, len)| unsafe { SgeMut::from_raw(addr, len, self.lkey) }))
    }

    /// Copies `dst.len()` bytes at `offset` out of the region. Returns `false` (copying
    /// nothing) if the range is out of bounds. Does not allocate.
    pub fn read_into(&self, offset: usize, dst: &mut [u8]) -> bool {
        if !in_bounds(offset, dst.len(), self.len) {
            return false;
        }
        for (i, d) in dst.iter_mut().enumerate() {
            // SAFETY: offset + i < len, inside the buffer the region holds for 'm; volatile
            // because the peer may write it at any time, and no reference to it exists.
            *d = unsafe { self.ptr.add(offset + i).read_volatile() };
        }
        true
    }

    /// Copies `src` into the region at `offset`. Returns `false` if out of bounds.
    /// Does not allocate.
    pub fn write_from(&self, offset: usize, src: &[u8]) -> bool {
        if !in_bounds(offset, src.len(), self.len) {
            return false;
        }
        for (i, s) in src.iter().enumerate() {
            // SAFETY: as in read_into.
            unsafe { self.ptr.add(offset + i).write_volatile(*s) };
        }
        true
    }

    /// A volatile little-endian `u64` load at an 8-aligned `offset`. `None` if misaligned or
    /// out of bounds. Does not allocate.
    pub fn load_u64(&self, offset: usize) -> Option<u64> {
        if !offset.is_multiple_of(8) || !in_bounds(offset, 8, self.len) {
            return None;
        }
        let mut b = [0u8; 8];
        self.read_into(offset, &mut b);
        Some(u64::from_le_bytes(b))
    }

    /// A volatile little-endian `u64` store at an 8-aligned `offset`.
    pub fn store_u64(&self, offset: usize, v: u64) -> bool {
        offset.is_multiple_of(8) && self.write_from(offset, &v.to_le_bytes())
    }
}
