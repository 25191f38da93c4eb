//! Registered memory: the table slot the model resolves keys against, and the region as its
//! owner sees it (keys, scatter/gather entries, volatile copies). Shared by the fabric's
//! [`SoftRegion`] and the net's `NetRegion`.

use core::fmt;
use core::ops::Range;
use core::ptr::NonNull;

use crate::memory::VolatileBytes;
use crate::sge::{RemoteMemory, Sge, SgeMut};

use super::fabric::Shared;
use super::keys::{KeyKind, Reach};
#[cfg(doc)]
use super::SoftFabric;
use super::{AccessFlags, Side, SoftError};

/// Checks a buffer and access flags before registration.
pub(super) fn check_registration(len: usize, access: AccessFlags) -> Result<(), SoftError> {
    if len == 0 {
        return Err(SoftError::EmptyBuffer);
    }
    if access.intersects(AccessFlags::REMOTE_MUTATION) && !access.contains(AccessFlags::LOCAL_WRITE)
    {
        return Err(SoftError::RemoteWriteNeedsLocalWrite);
    }
    Ok(())
}

/// Registers `buf` (already passed by [`check_registration`]) in the first free slot of
/// `table`: `next_gen` picks the generation from the slot's last one, `key` makes the keys
/// of (generation, kind, slot). The fabric and the net differ only in those two.
pub(super) fn register_in(
    table: &mut [RegionSlot],
    buf: &mut [u8],
    access: AccessFlags,
    next_gen: impl FnOnce(u32) -> Result<u32, SoftError>,
    key: impl Fn(u32, KeyKind, usize) -> u32,
) -> Result<(usize, Registered), SoftError> {
    let len = buf.len();
    // One pointer for the model's table and the region's view, so neither invalidates
    // the other (Miri's aliasing models check this).
    let base = NonNull::from(buf).cast::<u8>();
    let (slot, r) = table
        .iter_mut()
        .enumerate()
        .find(|(_, r)| !r.live)
        .ok_or(SoftError::TableFull)?;
    let gen = next_gen(r.gen)?;
    *r = RegionSlot {
        ptr: base.as_ptr(),
        len,
        access,
        gen,
        live: true,
    };
    let reg = Registered {
        ptr: base,
        len,
        lkey: key(gen, KeyKind::Local, slot),
        rkey: key(gen, KeyKind::Remote, slot),
        access,
    };
    Ok((slot, reg))
}

/// One entry of a region table, what keys resolve against.
#[derive(Clone, Copy)]
pub(super) struct RegionSlot {
    /// The registered buffer (with the provenance of the `&'m mut [u8]` it came from).
    pub(super) ptr: *mut u8,
    pub(super) len: usize,
    pub(super) access: AccessFlags,
    /// Generation of the current (or last) registration; 0 = never used.
    pub(super) gen: u32,
    pub(super) live: bool,
}

pub(super) const NO_REGION: RegionSlot = RegionSlot {
    ptr: core::ptr::null_mut(),
    len: 0,
    access: AccessFlags::empty(),
    gen: 0,
    live: false,
};

impl RegionSlot {
    /// A pointer to `at`'s bytes if the slot holds a live registration of generation `gen`
    /// (never 0) that grants `at.need` and covers the range (`at`'s key already led here).
    pub(super) fn reach(&self, gen: u32, at: &Reach) -> Option<*mut u8> {
        if gen == 0 || !self.live || self.gen != gen || !self.access.contains(at.need) {
            return None;
        }
        let off = at.sge.addr.checked_sub(self.ptr.addr() as u64)?;
        let end = off.checked_add(u64::from(at.sge.len))?;
        if end > self.len as u64 {
            return None;
        }
        // In bounds of the registered buffer, so this keeps its provenance and stays inside
        // the allocation (wrapping_add only because it needs no unsafe).
        Some(self.ptr.wrapping_add(off as usize))
    }

    /// Ends the registration: its keys stop resolving.
    pub(super) fn release(&mut self) {
        self.live = false;
        self.ptr = core::ptr::null_mut();
    }
}

/// A registration as its owner holds it: the bytes and the keys.
pub(super) struct Registered {
    pub(super) ptr: NonNull<u8>,
    pub(super) len: usize,
    pub(super) lkey: u32,
    pub(super) rkey: u32,
    pub(super) access: AccessFlags,
}

impl Registered {
    /// The CPU's volatile view of the bytes (the same implementation as the device's
    /// `SharedRegion`).
    #[inline]
    pub(super) fn bytes(&self) -> VolatileBytes {
        // SAFETY: the buffer is borrowed for the model's 'm, which outlives the region that
        // holds this, and no reference to it exists while the model owns it.
        unsafe { VolatileBytes::new(self.ptr, self.len) }
    }

    pub(super) fn remote(&self) -> RemoteMemory {
        self.bytes().remote(self.rkey)
    }

    pub(super) fn sge(&self, range: Range<usize>) -> Option<Sge<'_>> {
        let (addr, len) = self.bytes().entry(&range)?;
        // SAFETY: the range lies inside this region, whose lkey stays valid while the entry
        // borrows it; the model never writes through a gather entry.
        Some(unsafe { Sge::from_raw(addr, len, self.lkey) })
    }

    pub(super) fn sges_mut<const N: usize>(
        &mut self,
        ranges: [Range<usize>; N],
    ) -> Option<[SgeMut<'_>; N]> {
        if !self.access.contains(AccessFlags::LOCAL_WRITE) {
            return None;
        }
        let mut parts = [(0u64, 0u32); N];
        for (i, r) in ranges.iter().enumerate() {
            parts[i] = self.bytes().entry(r)?;
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

    /// # Safety
    /// Nobody may write the range while the slice lives.
    pub(super) unsafe fn slice_unchecked(&self, range: Range<usize>) -> Option<&[u8]> {
        let (_, len) = self.bytes().entry(&range)?;
        // SAFETY: `entry` checked the range against the region, which stays registered (and
        // its buffer borrowed) while `self` is; the caller guarantees nobody writes the bytes
        // meanwhile, and the model creates no reference to them.
        Some(unsafe {
            core::slice::from_raw_parts(self.ptr.as_ptr().add(range.start), len as usize)
        })
    }
}

impl Registered {
    /// The `Debug` of a region type: its name, its owner (`side` or `node`), then this.
    pub(super) fn debug_as(
        &self,
        f: &mut fmt::Formatter<'_>,
        name: &str,
        owner: (&str, &dyn fmt::Debug),
    ) -> fmt::Result {
        f.debug_struct(name)
            .field(owner.0, owner.1)
            .field("len", &self.len)
            .field("lkey", &self.lkey)
            .field("rkey", &self.rkey)
            .field("access", &self.access)
            .finish()
    }
}

/// Memory registered with one side of a [`SoftFabric`]; deregistered on drop.
///
/// Peers may write it (with [`AccessFlags::REMOTE_WRITE`]) whenever the model runs, so the CPU
/// reaches its bytes only through volatile copies and loads, never through a slice; the
/// loads are as narrow as the flag a peer writes (the device's `SharedRegion` has the same):
///
/// ```
/// #![forbid(unsafe_code)]
/// use rverbs_core::memory::AccessFlags;
/// use rverbs_core::params::{QpCaps, RetryCount, RnrRetry};
/// use rverbs_core::model::{Side, SoftFabric};
///
/// #[repr(align(8))]
/// struct Flags([u8; 16]);
/// let mut flags = Flags([0; 16]);
/// let caps = QpCaps { max_send_wr: 4, max_recv_wr: 4, max_send_sge: 1, max_recv_sge: 1,
///                     max_inline_data: 16 };
/// let fabric = SoftFabric::new(caps, RnrRetry::default(), RetryCount::default());
/// let r = fabric.register(Side::A, &mut flags.0, AccessFlags::LOCAL_WRITE).unwrap();
/// r.write_from(0, &[1, 0, 0, 0, 0xef, 0xbe, 0xad, 0xde]);
/// assert_eq!(r.load_u8(0), Some(1));
/// assert_eq!(r.load_u32(4), Some(0xdead_beef));
/// assert_eq!(r.load_u32(2), None); // misaligned
/// assert_eq!(r.load_u64(0), Some(0xdead_beef_0000_0001));
/// ```
pub struct SoftRegion<'f> {
    pub(super) shared: &'f Shared,
    pub(super) side: Side,
    pub(super) slot: usize,
    pub(super) reg: Registered,
}

impl fmt::Debug for SoftRegion<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.reg.debug_as(f, "SoftRegion", ("side", &self.side))
    }
}

impl Drop for SoftRegion<'_> {
    fn drop(&mut self) {
        let mut st = self.shared.state.borrow_mut();
        if let Some(r) = st[self.side.index()].regions.get_mut(self.slot) {
            r.release();
        }
    }
}

impl SoftRegion<'_> {
    registered_accessors!();

    /// The side it is registered with.
    #[inline]
    pub fn side(&self) -> Side {
        self.side
    }
}

crate::memory::region_by_inherent_methods!(SoftRegion<'_>);

/// The accessors both region types (`SoftRegion`, the net's `NetRegion`) offer over their
/// `reg: Registered` core: one set of docs and one behaviour, beside the methods that differ
/// (side or node). The keys' scope is the owner's: the queue pairs of its side or node take
/// the local key, the peers that reach it the remote one.
macro_rules! registered_accessors {
    () => {
        /// Local key: good in work requests of the queue pairs of the side or node the region
        /// is registered with.
        #[inline]
        pub fn lkey(&self) -> u32 {
            self.reg.lkey
        }

        /// Remote key: good in work requests that peers of that side or node send it.
        #[inline]
        pub fn rkey(&self) -> u32 {
            self.reg.rkey
        }

        /// The descriptor peers need to RDMA the region (which succeeds only with the matching
        /// remote access). One descriptor serves every peer.
        pub fn remote(&self) -> $crate::sge::RemoteMemory {
            self.reg.remote()
        }

        /// Length in bytes.
        #[inline]
        pub fn len(&self) -> usize {
            self.reg.len
        }

        /// Whether the region is empty (never: registration rejects empty buffers).
        #[inline]
        pub fn is_empty(&self) -> bool {
            self.reg.len == 0
        }

        /// Access the region was registered with.
        #[inline]
        pub fn access(&self) -> $crate::memory::AccessFlags {
            self.reg.access
        }

        #[inline]
        fn bytes(&self) -> $crate::memory::VolatileBytes {
            self.reg.bytes()
        }

        $crate::memory::volatile_byte_accessors!();

        /// The bytes of `range` as a slice, or `None` if out of bounds. Does not allocate.
        ///
        /// # Safety
        /// Nobody may write the range while the slice lives: no peer (the region grants no
        /// remote write, or the protocol rules it out) and no local work request (no receive
        /// or read targets it until the slice is gone). The model writes only inside calls of
        /// its handles, so calling none that could write the range suffices.
        pub unsafe fn slice_unchecked(&self, range: core::ops::Range<usize>) -> Option<&[u8]> {
            // SAFETY: forwarded contract.
            unsafe { self.reg.slice_unchecked(range) }
        }

        /// A gather entry (the queue pair reads) for `range`, or `None` if out of bounds.
        /// Does not allocate.
        pub fn sge(&self, range: core::ops::Range<usize>) -> Option<$crate::sge::Sge<'_>> {
            self.reg.sge(range)
        }

        /// A scatter entry (the queue pair writes) for `range`, or `None` if out of bounds or
        /// the region lacks local write access. Does not allocate.
        pub fn sge_mut(
            &mut self,
            range: core::ops::Range<usize>,
        ) -> Option<$crate::sge::SgeMut<'_>> {
            let [e] = self.reg.sges_mut([range])?;
            Some(e)
        }

        /// Several scatter entries at once, for scatter lists into one region: `None` if one
        /// is out of bounds, two overlap, or the region lacks local write access. Does not
        /// allocate.
        pub fn sges_mut<const N: usize>(
            &mut self,
            ranges: [core::ops::Range<usize>; N],
        ) -> Option<[$crate::sge::SgeMut<'_>; N]> {
            self.reg.sges_mut(ranges)
        }
    };
}
pub(super) use registered_accessors;
