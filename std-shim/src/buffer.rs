//! Page-aligned, zeroed memory to register as RDMA memory regions.
//!
//! Memory handed to `ibv_reg_mr` is pinned page by page, so it should start on a page
//! boundary and span whole pages: otherwise the registration pins, and exposes to the NIC,
//! whatever else shares its first and last page. Huge pages shrink the NIC's translation
//! table by 512× and make its cache misses rarer, which matters for buffers of many MiB.
//!
//! Both buffer types map anonymous memory with `mmap`, which the kernel hands out zeroed, and
//! unmap it on drop.

use core::fmt;
use core::ptr::NonNull;
use std::io;

/// Size of the huge pages [`HugePageBuffer`] uses: 2 MiB, the size x86-64 and arm64 (with 4
/// KiB base pages) both offer.
pub const HUGE_PAGE_SIZE: usize = 2 << 20;

/// Which kind of page backs a buffer.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum PageKind {
    /// The system's base page (4 KiB on x86-64).
    Base,
    /// 2 MiB huge pages from the hugetlbfs pool.
    Huge2M,
}

/// Options for mapping a buffer. The default does neither.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct MapOptions {
    populate: bool,
    lock: bool,
}

impl MapOptions {
    /// No populating, no locking.
    #[inline]
    pub const fn new() -> Self {
        Self {
            populate: false,
            lock: false,
        }
    }

    /// Fault every page in at construction (`MAP_POPULATE`), so neither memory registration
    /// nor the first pass over the buffer takes page faults.
    #[inline]
    #[must_use]
    pub const fn populate(mut self, yes: bool) -> Self {
        self.populate = yes;
        self
    }

    /// Lock the pages in RAM (`mlock`) so they are never swapped out. Counts against
    /// `RLIMIT_MEMLOCK` (often only 8 MiB for unprivileged users; `ulimit -l`). Memory
    /// registration pins pages anyway; this is for buffers used before or without it.
    #[inline]
    #[must_use]
    pub const fn lock(mut self, yes: bool) -> Self {
        self.lock = yes;
        self
    }

    /// Whether [`populate`](Self::populate) is set.
    #[inline]
    pub const fn populates(&self) -> bool {
        self.populate
    }

    /// Whether [`lock`](Self::lock) is set.
    #[inline]
    pub const fn locks(&self) -> bool {
        self.lock
    }
}

/// Error from allocating a buffer.
#[derive(Debug)]
#[non_exhaustive]
pub enum BufferError {
    /// A zero-length buffer was asked for; `mmap` cannot map nothing.
    ZeroLength,
    /// Rounding the length up to whole pages overflows, or exceeds `isize::MAX`.
    TooLarge {
        /// The length asked for.
        len: usize,
    },
    /// `mmap` failed for base pages.
    Map {
        /// The length, rounded up to whole pages.
        len: usize,
        /// What the operating system said (usually `ENOMEM`).
        source: io::Error,
    },
    /// `mmap` with `MAP_HUGETLB` failed: the huge-page pool has too few free 2 MiB pages (the
    /// default is none), or the kernel lacks hugetlb support.
    HugePagesUnavailable {
        /// The length, rounded up to whole huge pages.
        len: usize,
        /// What the operating system said (`ENOMEM` for an empty pool).
        source: io::Error,
    },
    /// `mlock` failed, usually because of `RLIMIT_MEMLOCK`. The mapping was released.
    Lock {
        /// The length that could not be locked.
        len: usize,
        /// What the operating system said (`ENOMEM` or `EPERM`).
        source: io::Error,
    },
}

impl fmt::Display for BufferError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::ZeroLength => f.write_str("cannot map a zero-length buffer"),
            Self::TooLarge { len } => write!(f, "buffer of {len} bytes is too large to map"),
            Self::Map { len, .. } => write!(f, "mmap of {len} bytes failed"),
            Self::HugePagesUnavailable { len, .. } => write!(
                f,
                "no 2 MiB huge pages available for {len} bytes (reserve some with \
                 `echo N > /proc/sys/vm/nr_hugepages`, or use AlignedBuffer::new_prefer_huge)"
            ),
            Self::Lock { len, .. } => write!(
                f,
                "mlock of {len} bytes failed (check `ulimit -l`, RLIMIT_MEMLOCK)"
            ),
        }
    }
}

impl core::error::Error for BufferError {
    fn source(&self) -> Option<&(dyn core::error::Error + 'static)> {
        match self {
            Self::Map { source, .. }
            | Self::HugePagesUnavailable { source, .. }
            | Self::Lock { source, .. } => Some(source),
            Self::ZeroLength | Self::TooLarge { .. } => None,
        }
    }
}

// SAFETY: the mapping is owned by the buffer alone, does not move when the buffer moves, and
// is unmapped only when the buffer is dropped, so registering it for remote access is sound
// (rverbs leaks the buffer rather than drop it while a peer could still reach it).
unsafe impl rverbs_core::memory::OwnedMemory for AlignedBuffer {
    fn base(&mut self) -> NonNull<u8> {
        self.ptr
    }
    fn size(&self) -> usize {
        self.len
    }
}

// SAFETY: as for AlignedBuffer, which it wraps.
unsafe impl rverbs_core::memory::OwnedMemory for HugePageBuffer {
    fn base(&mut self) -> NonNull<u8> {
        self.0.ptr
    }
    fn size(&self) -> usize {
        self.0.len
    }
}

/// A page-aligned, zero-initialised buffer of whole pages, owned and unmapped on drop.
///
/// Usually backed by base pages ([`new`](Self::new)); [`new_prefer_huge`](Self::new_prefer_huge)
/// may back it with 2 MiB pages instead, and [`page_kind`](Self::page_kind) says which.
pub struct AlignedBuffer {
    ptr: NonNull<u8>,
    /// Mapped length: a multiple of `page_size`, at most `isize::MAX`.
    len: usize,
    page_size: usize,
    kind: PageKind,
    locked: bool,
}

// SAFETY: an `AlignedBuffer` is the sole owner of a private anonymous mapping, like a
// `Box<[u8]>`: nothing else holds its address, and no thread-local state is involved in using
// or unmapping it (`munmap` may run on any thread). Moving it to another thread moves that
// ownership along.
unsafe impl Send for AlignedBuffer {}

// SAFETY: `&AlignedBuffer` only gives out `&[u8]` and a `*const u8`; writing needs
// `&mut AlignedBuffer`. Sharing it across threads is therefore as sound as sharing `&[u8]`.
unsafe impl Sync for AlignedBuffer {}

impl AlignedBuffer {
    /// Maps `len` bytes, rounded up to whole base pages, with default [`MapOptions`].
    pub fn new(len: usize) -> Result<Self, BufferError> {
        Self::with_options(len, MapOptions::new())
    }

    /// Maps `len` bytes, rounded up to whole base pages.
    pub fn with_options(len: usize, options: MapOptions) -> Result<Self, BufferError> {
        map(len, PageKind::Base, options)
    }

    /// Maps `len` bytes on 2 MiB huge pages if the pool has enough free ones, and on base
    /// pages otherwise. [`page_kind`](Self::page_kind) says which it got.
    ///
    /// Only a failure to obtain huge pages triggers the fallback; other errors (such as
    /// [`BufferError::Lock`]) are returned as they are.
    pub fn new_prefer_huge(len: usize, options: MapOptions) -> Result<Self, BufferError> {
        prefer_huge_with(len, options, |len, options| {
            map(len, PageKind::Huge2M, options)
        })
    }

    /// The buffer's contents.
    #[inline]
    pub fn as_slice(&self) -> &[u8] {
        // SAFETY: `ptr` points to a live mapping of `len` readable bytes that this value owns
        // until drop; the kernel zero-filled it, so every byte is initialised; `len` is at
        // most `isize::MAX` (checked in `map`); the shared borrow of `self` excludes writes
        // through `as_mut_slice` for the slice's lifetime.
        unsafe { core::slice::from_raw_parts(self.ptr.as_ptr(), self.len) }
    }

    /// The buffer's contents, writable.
    #[inline]
    pub fn as_mut_slice(&mut self) -> &mut [u8] {
        // SAFETY: as in `as_slice`, and the mapping is writable; the exclusive borrow of
        // `self` makes this the only reference to the bytes for its lifetime.
        unsafe { core::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.len) }
    }

    /// Address of the first byte: a multiple of [`page_size`](Self::page_size). This is what
    /// memory registration takes.
    #[inline]
    pub fn as_ptr(&self) -> *const u8 {
        self.ptr.as_ptr()
    }

    /// Mutable address of the first byte, for handing to the NIC as a write target.
    #[inline]
    pub fn as_mut_ptr(&mut self) -> *mut u8 {
        self.ptr.as_ptr()
    }

    /// Mapped length in bytes: the requested length rounded up to whole pages. Never zero.
    #[inline]
    pub fn len(&self) -> usize {
        self.len
    }

    /// Always `false`: a buffer spans at least one page. Present because clippy expects it
    /// next to `len`.
    #[inline]
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Size of the pages backing the buffer: the base page size, or [`HUGE_PAGE_SIZE`].
    #[inline]
    pub fn page_size(&self) -> usize {
        self.page_size
    }

    /// Which kind of page backs the buffer.
    #[inline]
    pub fn page_kind(&self) -> PageKind {
        self.kind
    }

    /// Whether the pages were locked with `mlock`.
    #[inline]
    pub fn is_locked(&self) -> bool {
        self.locked
    }
}

impl fmt::Debug for AlignedBuffer {
    /// Shows where the buffer is and how it is backed, not its contents.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("AlignedBuffer")
            .field("ptr", &self.ptr)
            .field("len", &self.len)
            .field("page_kind", &self.kind)
            .field("locked", &self.locked)
            .finish()
    }
}

/// Both buffer types are their bytes: `AsRef<[u8]>` and `AsMut<[u8]>` through their
/// `as_slice` and `as_mut_slice`.
macro_rules! byte_views {
    ($($t:ty),+) => {$(
        impl AsRef<[u8]> for $t {
            #[inline]
            fn as_ref(&self) -> &[u8] {
                self.as_slice()
            }
        }

        impl AsMut<[u8]> for $t {
            #[inline]
            fn as_mut(&mut self) -> &mut [u8] {
                self.as_mut_slice()
            }
        }
    )+};
}

byte_views!(AlignedBuffer, HugePageBuffer);

impl Drop for AlignedBuffer {
    fn drop(&mut self) {
        // SAFETY: `ptr`/`len` describe exactly the mapping `map` created, which this value
        // owns; no reference into it can outlive `self`. Unmapping also drops any mlock.
        let rc = unsafe { libc::munmap(self.ptr.as_ptr().cast(), self.len) };
        // munmap of a mapping we own cannot fail; there is nothing to do if it did.
        debug_assert_eq!(rc, 0, "munmap failed: {}", io::Error::last_os_error());
    }
}

/// A buffer guaranteed to be backed by 2 MiB huge pages.
///
/// Needs free pages in the kernel's hugetlb pool (`/proc/sys/vm/nr_hugepages`; zero by
/// default), and fails with [`BufferError::HugePagesUnavailable`] rather than falling back.
/// Use [`AlignedBuffer::new_prefer_huge`] when base pages would do.
#[derive(Debug)]
pub struct HugePageBuffer(AlignedBuffer);

impl HugePageBuffer {
    /// Maps `len` bytes, rounded up to whole 2 MiB pages, with default [`MapOptions`].
    pub fn new(len: usize) -> Result<Self, BufferError> {
        Self::with_options(len, MapOptions::new())
    }

    /// Maps `len` bytes, rounded up to whole 2 MiB pages.
    pub fn with_options(len: usize, options: MapOptions) -> Result<Self, BufferError> {
        map(len, PageKind::Huge2M, options).map(Self)
    }

    /// The buffer's contents.
    #[inline]
    pub fn as_slice(&self) -> &[u8] {
        self.0.as_slice()
    }

    /// The buffer's contents, writable.
    #[inline]
    pub fn as_mut_slice(&mut self) -> &mut [u8] {
        self.0.as_mut_slice()
    }

    /// Address of the first byte, a multiple of [`HUGE_PAGE_SIZE`].
    #[inline]
    pub fn as_ptr(&self) -> *const u8 {
        self.0.as_ptr()
    }

    /// Mutable address of the first byte.
    #[inline]
    pub fn as_mut_ptr(&mut self) -> *mut u8 {
        self.0.as_mut_ptr()
    }

    /// Mapped length in bytes, a non-zero multiple of [`HUGE_PAGE_SIZE`].
    #[inline]
    pub fn len(&self) -> usize {
        self.0.len()
    }

    /// Always `false`; see [`AlignedBuffer::is_empty`].
    #[inline]
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// Always [`HUGE_PAGE_SIZE`].
    #[inline]
    pub fn page_size(&self) -> usize {
        self.0.page_size()
    }

    /// Whether the pages were locked with `mlock`.
    #[inline]
    pub fn is_locked(&self) -> bool {
        self.0.is_locked()
    }

    /// The underlying buffer, for code that takes any [`AlignedBuffer`].
    #[inline]
    pub fn into_inner(self) -> AlignedBuffer {
        self.0
    }
}

impl AsRef<AlignedBuffer> for HugePageBuffer {
    #[inline]
    fn as_ref(&self) -> &AlignedBuffer {
        &self.0
    }
}

/// The fallback policy of [`AlignedBuffer::new_prefer_huge`], with the huge-page attempt
/// injectable so tests can exercise the fallback on machines that do have huge pages.
fn prefer_huge_with(
    len: usize,
    options: MapOptions,
    try_huge: impl FnOnce(usize, MapOptions) -> Result<AlignedBuffer, BufferError>,
) -> Result<AlignedBuffer, BufferError> {
    match try_huge(len, options) {
        Err(BufferError::HugePagesUnavailable { .. }) => map(len, PageKind::Base, options),
        other => other,
    }
}

fn base_page_size() -> usize {
    // SAFETY: sysconf has no preconditions; it only reads system configuration.
    let size = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    // POSIX guarantees a page size; 4 KiB is right wherever this could somehow fail.
    usize::try_from(size)
        .ok()
        .filter(|&s| s > 0)
        .unwrap_or(4096)
}

fn map(len: usize, kind: PageKind, options: MapOptions) -> Result<AlignedBuffer, BufferError> {
    if len == 0 {
        return Err(BufferError::ZeroLength);
    }
    let page_size = match kind {
        PageKind::Base => base_page_size(),
        PageKind::Huge2M => HUGE_PAGE_SIZE,
    };
    let rounded = len
        .checked_next_multiple_of(page_size)
        .filter(|&n| isize::try_from(n).is_ok())
        .ok_or(BufferError::TooLarge { len })?;

    let mut flags = libc::MAP_PRIVATE | libc::MAP_ANONYMOUS;
    if options.populate {
        flags |= libc::MAP_POPULATE;
    }
    if kind == PageKind::Huge2M {
        flags |= libc::MAP_HUGETLB | libc::MAP_HUGE_2MB;
    }
    let map_error = |source| match kind {
        PageKind::Base => BufferError::Map {
            len: rounded,
            source,
        },
        PageKind::Huge2M => BufferError::HugePagesUnavailable {
            len: rounded,
            source,
        },
    };

    // SAFETY: an anonymous mapping at an address of the kernel's choosing (null hint, no
    // MAP_FIXED) cannot alias any existing Rust object; fd -1 and offset 0 are what
    // MAP_ANONYMOUS requires.
    let addr = unsafe {
        libc::mmap(
            core::ptr::null_mut(),
            rounded,
            libc::PROT_READ | libc::PROT_WRITE,
            flags,
            -1,
            0,
        )
    };
    if addr == libc::MAP_FAILED {
        return Err(map_error(io::Error::last_os_error()));
    }
    let Some(ptr) = NonNull::new(addr.cast::<u8>()) else {
        // Only possible with vm.mmap_min_addr = 0; a null slice pointer is not allowed, so
        // give the mapping back and report failure.
        // SAFETY: `addr`/`rounded` is the mapping just created, not yet shared with anyone.
        unsafe { libc::munmap(addr, rounded) };
        return Err(map_error(io::Error::other("mmap returned address 0")));
    };
    let mut buffer = AlignedBuffer {
        ptr,
        len: rounded,
        page_size,
        kind,
        locked: false,
    };

    if options.lock {
        // SAFETY: locks pages of the mapping `buffer` owns; mlock does not touch its contents.
        let rc = unsafe { libc::mlock(buffer.ptr.as_ptr().cast(), buffer.len) };
        if rc != 0 {
            // `buffer` unmaps on drop.
            return Err(BufferError::Lock {
                len: rounded,
                source: io::Error::last_os_error(),
            });
        }
        buffer.locked = true;
    }
    Ok(buffer)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn base() -> usize {
        base_page_size()
    }

    #[test]
    fn page_size_is_a_power_of_two() {
        assert!(base().is_power_of_two());
        assert!(base() >= 4096);
    }

    #[test]
    fn rounds_up_to_whole_pages() {
        let page = base();
        for (asked, expect) in [
            (1, page),
            (page, page),
            (page + 1, 2 * page),
            (3 * page - 1, 3 * page),
        ] {
            let b = AlignedBuffer::new(asked).unwrap();
            assert_eq!(b.len(), expect, "asked {asked}");
            assert!(!b.is_empty());
            assert_eq!(b.page_size(), page);
            assert_eq!(b.page_kind(), PageKind::Base);
            assert!(!b.is_locked());
        }
    }

    #[test]
    fn aligned_zeroed_and_writable() {
        let mut b = AlignedBuffer::new(5 * base() + 17).unwrap();
        assert_eq!(b.as_ptr() as usize % base(), 0);
        assert!(b.as_slice().iter().all(|&x| x == 0));
        for (i, byte) in b.as_mut_slice().iter_mut().enumerate() {
            *byte = i as u8;
        }
        assert!(b.as_slice().iter().enumerate().all(|(i, &x)| x == i as u8));
        let p = b.as_mut_ptr();
        assert_eq!(p.cast_const(), b.as_ptr());
        let r: &[u8] = b.as_ref();
        assert_eq!(r.len(), b.len());
    }

    #[test]
    fn a_populated_buffer_is_mapped_unlocked_and_zeroed() {
        let opts = MapOptions::new().populate(true);
        assert!(opts.populates() && !opts.locks());
        let b = AlignedBuffer::with_options(1 << 20, opts).unwrap();
        assert!(b.as_slice().iter().all(|&x| x == 0));
    }

    #[test]
    fn lock_option_locks_or_reports_the_limit() {
        match AlignedBuffer::with_options(1, MapOptions::new().lock(true)) {
            Ok(b) => assert!(b.is_locked()),
            // RLIMIT_MEMLOCK can be 0 in some containers.
            Err(BufferError::Lock { len, .. }) => assert_eq!(len, base()),
            Err(e) => panic!("{e}"),
        }
    }

    #[test]
    fn zero_or_oversized_buffer_lengths_are_refused_with_their_cause() {
        assert!(matches!(
            AlignedBuffer::new(0),
            Err(BufferError::ZeroLength)
        ));
        assert!(matches!(
            HugePageBuffer::new(0),
            Err(BufferError::ZeroLength)
        ));
        assert!(matches!(
            AlignedBuffer::new(usize::MAX),
            Err(BufferError::TooLarge { len: usize::MAX })
        ));
        let too_big = isize::MAX as usize;
        assert!(matches!(
            AlignedBuffer::new(too_big),
            Err(BufferError::TooLarge { .. })
        ));
        // Representable but beyond any address space: the kernel refuses.
        let e = AlignedBuffer::new(1 << 62).unwrap_err();
        assert!(matches!(e, BufferError::Map { .. }), "{e:?}");
        assert!(core::error::Error::source(&e).is_some());
    }

    #[test]
    fn huge_pages_or_a_clear_error() {
        match HugePageBuffer::new(1) {
            Ok(mut b) => {
                assert_eq!(b.len(), HUGE_PAGE_SIZE);
                assert_eq!(b.page_size(), HUGE_PAGE_SIZE);
                assert_eq!(b.as_ptr() as usize % HUGE_PAGE_SIZE, 0);
                assert!(b.as_slice().iter().all(|&x| x == 0));
                b.as_mut_slice()[HUGE_PAGE_SIZE - 1] = 7;
                assert_eq!(b.into_inner().page_kind(), PageKind::Huge2M);
            }
            Err(e) => {
                assert!(
                    matches!(
                        e,
                        BufferError::HugePagesUnavailable {
                            len: HUGE_PAGE_SIZE,
                            ..
                        }
                    ),
                    "{e:?}"
                );
                assert!(e.to_string().contains("nr_hugepages"), "{e}");
            }
        }
    }

    #[test]
    fn prefer_huge_always_gets_memory() {
        let mut b = AlignedBuffer::new_prefer_huge(3 * base(), MapOptions::new()).unwrap();
        match b.page_kind() {
            PageKind::Huge2M => assert_eq!(b.len(), HUGE_PAGE_SIZE),
            PageKind::Base => assert_eq!(b.len(), 3 * base()),
        }
        assert_eq!(b.as_ptr() as usize % b.page_size(), 0);
        b.as_mut_slice()[0] = 1;
    }

    #[test]
    fn prefer_huge_falls_back_when_pool_is_empty() {
        // Simulate an empty pool even on machines that have huge pages.
        let b = prefer_huge_with(base() + 1, MapOptions::new(), |len, _| {
            Err(BufferError::HugePagesUnavailable {
                len,
                source: io::Error::from_raw_os_error(libc::ENOMEM),
            })
        })
        .unwrap();
        assert_eq!(b.page_kind(), PageKind::Base);
        assert_eq!(b.len(), 2 * base());

        // Other errors are not papered over.
        let e = prefer_huge_with(1, MapOptions::new(), |len, _| {
            Err(BufferError::Lock {
                len,
                source: io::Error::from_raw_os_error(libc::EPERM),
            })
        })
        .unwrap_err();
        assert!(matches!(e, BufferError::Lock { .. }));
    }

    #[test]
    fn a_buffer_moves_to_and_is_shared_between_threads_keeping_its_bytes() {
        let mut b = AlignedBuffer::new(100).unwrap();
        b.as_mut_slice()[0] = 42;
        let b = std::thread::spawn(move || {
            assert_eq!(b.as_slice()[0], 42);
            b
        })
        .join()
        .unwrap();
        std::thread::scope(|s| {
            s.spawn(|| assert_eq!(b.as_slice()[0], 42));
            s.spawn(|| assert_eq!(b.as_slice()[1], 0));
        });
    }

    #[test]
    fn debug_shows_layout_not_contents() {
        let b = AlignedBuffer::new(1).unwrap();
        let s = format!("{b:?}");
        assert!(s.contains("len") && s.contains("Base"), "{s}");
    }
}
