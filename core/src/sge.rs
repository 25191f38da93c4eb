//! Scatter/gather entries and remote memory descriptors: the plain data a work request names.
//!
//! An [`Sge`] is a slice of registered memory the device will *read* (a gather entry: the
//! source of a send or RDMA write); an [`SgeMut`] is one it will *write* (a scatter entry: the
//! target of a receive or RDMA read). Both borrow the memory region they came from, so the
//! borrow checker keeps the CPU away from the bytes while a work request names them:
//! `Sge` shares the region (the CPU may still read), `SgeMut` borrows it exclusively.
//!
//! Both have the layout of `struct ibv_sge`, so a list of them is handed to the device as is.

use core::marker::PhantomData;

/// A gather entry: `len` bytes at `addr` in a region with local key `lkey`, read by the device.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(C)]
pub struct Sge<'a> {
    addr: u64,
    len: u32,
    lkey: u32,
    _mem: PhantomData<&'a [u8]>,
}

/// A scatter entry: `len` bytes at `addr` in a region with local key `lkey`, written by the
/// device.
#[derive(Debug, PartialEq, Eq)]
#[repr(C)]
pub struct SgeMut<'a> {
    addr: u64,
    len: u32,
    lkey: u32,
    _mem: PhantomData<&'a mut [u8]>,
}

static_assertions::assert_eq_size!(Sge<'static>, [u64; 2]);
static_assertions::assert_eq_size!(SgeMut<'static>, [u64; 2]);

/// The constructor and accessors [`Sge`] and [`SgeMut`] share (one layout, two kinds of
/// access); the constructor's docs, which state each kind's safety contract, are the
/// caller's.
macro_rules! sge_common {
    ($(#[$from_raw_doc:meta])*) => {
        $(#[$from_raw_doc])*
        #[inline]
        pub const unsafe fn from_raw(addr: u64, len: u32, lkey: u32) -> Self {
            Self {
                addr,
                len,
                lkey,
                _mem: PhantomData,
            }
        }

        /// Start address.
        #[inline]
        pub const fn addr(&self) -> u64 {
            self.addr
        }

        /// Length in bytes.
        #[inline]
        pub const fn len(&self) -> u32 {
            self.len
        }

        /// Whether the entry is empty.
        #[inline]
        pub const fn is_empty(&self) -> bool {
            self.len == 0
        }

        /// Local key of the region.
        #[inline]
        pub const fn lkey(&self) -> u32 {
            self.lkey
        }
    };
}

impl<'a> Sge<'a> {
    sge_common! {
        /// An entry from raw parts.
        ///
        /// # Safety
        /// `addr..addr+len` must lie inside a memory region with local key `lkey` that
        /// outlives `'a`, and must not be written by anyone while a work request naming it is
        /// outstanding.
    }
}

impl<'a> SgeMut<'a> {
    sge_common! {
        /// An entry from raw parts.
        ///
        /// # Safety
        /// `addr..addr+len` must lie inside a memory region with local key `lkey` and local
        /// write access that outlives `'a`, and nothing else may read or write it while a work
        /// request naming it is outstanding.
    }

    /// Reborrows the entry for a shorter time, so it can be posted again later.
    #[inline]
    pub fn reborrow(&mut self) -> SgeMut<'_> {
        SgeMut {
            addr: self.addr,
            len: self.len,
            lkey: self.lkey,
            _mem: PhantomData,
        }
    }
}

/// A fixed-capacity gather list. A full list hands the rejected entry back from `push`.
pub type SgList<'a, const N: usize> = heapless::Vec<Sge<'a>, N>;

/// A fixed-capacity scatter list. A full list hands the rejected entry back from `push`.
pub type SgListMut<'a, const N: usize> = heapless::Vec<SgeMut<'a>, N>;

/// Remote memory a peer registered for RDMA: address, length and remote key.
///
/// Plain data, learned from the peer (see [`crate::wire`]); naming it in a work request is
/// safe for this side, because what the remote memory holds is the remote's business.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub struct RemoteMemory {
    /// Start address in the peer's address space.
    pub addr: u64,
    /// Length in bytes.
    pub len: u64,
    /// Remote key.
    pub rkey: u32,
}

impl RemoteMemory {
    /// The sub-range `offset..offset+len`, or `None` if it does not fit.
    #[inline]
    pub const fn slice(&self, offset: u64, len: u64) -> Option<RemoteMemory> {
        match offset.checked_add(len) {
            Some(end) if end <= self.len => Some(RemoteMemory {
                addr: self.addr + offset,
                len,
                rkey: self.rkey,
            }),
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn full_list_hands_entry_back() {
        let mut l: SgList<'static, 2> = SgList::new();
        // SAFETY: never posted; only the list logic is under test.
        let e = unsafe { Sge::from_raw(0x1000, 8, 7) };
        assert!(l.push(e).is_ok());
        assert!(l.push(e).is_ok());
        assert_eq!(l.push(e), Err(e));
    }

    #[test]
    fn remote_slice_inside_the_region_keeps_the_rkey_and_beyond_it_is_none() {
        let r = RemoteMemory {
            addr: 100,
            len: 50,
            rkey: 9,
        };
        assert_eq!(
            r.slice(10, 40),
            Some(RemoteMemory {
                addr: 110,
                len: 40,
                rkey: 9
            })
        );
        assert_eq!(r.slice(10, 41), None);
        assert_eq!(r.slice(u64::MAX, 2), None);
    }
}
