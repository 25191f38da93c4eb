//! CPU pinning and the NUMA locality of RDMA devices.
//!
//! A polling thread should run on a core of the NUMA node its NIC is attached to: completions
//! and doorbells then stay on the local memory controller and PCIe root. This module reads
//! where a device sits from sysfs, picks a CPU there that the thread is allowed to use, and
//! pins the calling thread to it:
//!
//! ```no_run
//! # fn main() -> Result<(), rverbs_std_shim::affinity::AffinityError> {
//! // Rank 0 of this host takes the first CPU close to mlx5_0, rank 1 the second, …
//! let pinned = rverbs_std_shim::affinity::pin_near_device("mlx5_0", 0)?;
//! if !pinned.local {
//!     eprintln!("warning: CPU {} is not local to mlx5_0", pinned.cpu);
//! }
//! # Ok(())
//! # }
//! ```
//!
//! Everything that reads sysfs goes through a [`SysfsRoot`], so tests can point it at a fake
//! tree. CPU lists use the kernel's text format, parsed by [`parse_cpulist`].

use core::fmt;
use core::iter::FusedIterator;
use std::io;
use std::path::{Path, PathBuf};

/// Number of CPU ids a [`CpuSet`] can hold: ids `0..MAX_CPUS`.
///
/// Large enough for any machine an RDMA rank runs on today, small enough that a set is a
/// fixed 512-byte array that never allocates.
pub const MAX_CPUS: u32 = 4096;

/// The kernel's cpumask is an array of `unsigned long`; using the same word type lets a
/// [`CpuSet`] be handed to `sched_setaffinity` as is, on every word size and endianness.
type Word = libc::c_ulong;
const WORD_BITS: u32 = Word::BITS;
const WORDS: usize = (MAX_CPUS / WORD_BITS) as usize;

/// A set of CPU ids below [`MAX_CPUS`], stored as a fixed-size bitmap.
///
/// Never allocates. `Display` prints the kernel's cpulist format (`0-3,8`), which
/// [`parse_cpulist`] reads back.
#[derive(Clone, PartialEq, Eq, Hash)]
pub struct CpuSet {
    words: [Word; WORDS],
}

impl CpuSet {
    /// The empty set.
    #[inline]
    pub const fn new() -> Self {
        Self { words: [0; WORDS] }
    }

    /// The set holding only `cpu`, or `Err(cpu)` if `cpu >= MAX_CPUS`.
    #[inline]
    pub fn single(cpu: u32) -> Result<Self, u32> {
        let mut set = Self::new();
        set.insert(cpu)?;
        Ok(set)
    }

    /// Adds `cpu`; `Ok(true)` if it was not already present. Hands `cpu` back as `Err(cpu)`
    /// if it is not below [`MAX_CPUS`].
    #[inline]
    pub fn insert(&mut self, cpu: u32) -> Result<bool, u32> {
        if cpu >= MAX_CPUS {
            return Err(cpu);
        }
        let (w, bit) = split(cpu);
        let was = self.words[w] & bit != 0;
        self.words[w] |= bit;
        Ok(!was)
    }

    /// Adds every CPU in `first..=last`, a word at a time so that a parser fed a long list of
    /// huge ranges stays linear in its input.
    fn insert_range(&mut self, first: u32, last: u32) {
        debug_assert!(first <= last && last < MAX_CPUS);
        let (first_word, last_word) = ((first / WORD_BITS) as usize, (last / WORD_BITS) as usize);
        for w in first_word..=last_word {
            let lo = if w == first_word {
                first % WORD_BITS
            } else {
                0
            };
            let hi = if w == last_word {
                last % WORD_BITS
            } else {
                WORD_BITS - 1
            };
            let mask = (Word::MAX >> (WORD_BITS - 1 - hi)) & (Word::MAX << lo);
            self.words[w] |= mask;
        }
    }

    /// Removes `cpu`; `true` if it was present.
    #[inline]
    pub fn remove(&mut self, cpu: u32) -> bool {
        if cpu >= MAX_CPUS {
            return false;
        }
        let (w, bit) = split(cpu);
        let was = self.words[w] & bit != 0;
        self.words[w] &= !bit;
        was
    }

    /// Whether `cpu` is in the set.
    #[inline]
    pub fn contains(&self, cpu: u32) -> bool {
        if cpu >= MAX_CPUS {
            return false;
        }
        let (w, bit) = split(cpu);
        self.words[w] & bit != 0
    }

    /// Number of CPUs in the set.
    #[inline]
    pub fn len(&self) -> usize {
        self.words.iter().map(|w| w.count_ones() as usize).sum()
    }

    /// Whether the set is empty.
    #[inline]
    pub fn is_empty(&self) -> bool {
        self.words.iter().all(|&w| w == 0)
    }

    /// The lowest CPU id in the set.
    #[inline]
    pub fn first(&self) -> Option<u32> {
        self.iter().next()
    }

    /// CPU ids in ascending order.
    #[inline]
    pub fn iter(&self) -> Cpus<'_> {
        Cpus {
            set: self,
            word: 0,
            bits: self.words[0],
        }
    }

    /// CPUs in both `self` and `other`.
    pub fn intersection(&self, other: &CpuSet) -> CpuSet {
        self.zip_with(other, |a, b| a & b)
    }

    /// CPUs in `self` or `other`.
    pub fn union(&self, other: &CpuSet) -> CpuSet {
        self.zip_with(other, |a, b| a | b)
    }

    /// CPUs in `self` but not in `other`.
    pub fn difference(&self, other: &CpuSet) -> CpuSet {
        self.zip_with(other, |a, b| a & !b)
    }

    fn zip_with(&self, other: &CpuSet, f: impl Fn(Word, Word) -> Word) -> CpuSet {
        let mut out = CpuSet::new();
        for ((o, a), b) in out.words.iter_mut().zip(&self.words).zip(&other.words) {
            *o = f(*a, *b);
        }
        out
    }
}

#[inline]
fn split(cpu: u32) -> (usize, Word) {
    ((cpu / WORD_BITS) as usize, 1 << (cpu % WORD_BITS))
}

impl Default for CpuSet {
    #[inline]
    fn default() -> Self {
        Self::new()
    }
}

impl fmt::Display for CpuSet {
    /// The kernel's cpulist format: `0-3,8,10-11`; the empty set prints nothing.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut iter = self.iter().peekable();
        let mut sep = "";
        while let Some(first) = iter.next() {
            let mut last = first;
            while iter.peek() == Some(&(last + 1)) {
                last += 1;
                iter.next();
            }
            if first == last {
                write!(f, "{sep}{first}")?;
            } else {
                write!(f, "{sep}{first}-{last}")?;
            }
            sep = ",";
        }
        Ok(())
    }
}

impl fmt::Debug for CpuSet {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "CpuSet({self})")
    }
}

impl<'a> IntoIterator for &'a CpuSet {
    type Item = u32;
    type IntoIter = Cpus<'a>;

    #[inline]
    fn into_iter(self) -> Cpus<'a> {
        self.iter()
    }
}

/// Iterator over the CPU ids of a [`CpuSet`], ascending. Returned by [`CpuSet::iter`].
#[derive(Clone, Debug)]
pub struct Cpus<'a> {
    set: &'a CpuSet,
    word: usize,
    /// Bits of `set.words[word]` not yet yielded.
    bits: Word,
}

impl Iterator for Cpus<'_> {
    type Item = u32;

    #[inline]
    fn next(&mut self) -> Option<u32> {
        loop {
            if self.bits != 0 {
                let bit = self.bits.trailing_zeros();
                self.bits &= self.bits - 1;
                // `word < WORDS`, so the id is below MAX_CPUS and fits in u32.
                return Some(self.word as u32 * WORD_BITS + bit);
            }
            self.word += 1;
            self.bits = *self.set.words.get(self.word)?;
        }
    }
}

impl FusedIterator for Cpus<'_> {}

/// What is wrong with a CPU list, found by [`parse_cpulist`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum CpulistErrorKind {
    /// A CPU number was expected (at the start, after `,` or after `-`).
    ExpectedNumber,
    /// A CPU number is not below [`MAX_CPUS`].
    CpuOutOfRange,
    /// A range whose end is below its start, such as `5-3`.
    ReversedRange,
    /// A character that is not a digit, `-`, `,` or whitespace, or one in the wrong place.
    UnexpectedChar,
}

/// Error returned by [`parse_cpulist`]: what went wrong and at which byte of the input.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct ParseCpulistError {
    kind: CpulistErrorKind,
    offset: usize,
}

impl ParseCpulistError {
    /// What went wrong.
    #[inline]
    pub const fn kind(&self) -> CpulistErrorKind {
        self.kind
    }

    /// Byte offset in the input where the problem starts.
    #[inline]
    pub const fn offset(&self) -> usize {
        self.offset
    }
}

impl fmt::Display for ParseCpulistError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let what = match self.kind {
            CpulistErrorKind::ExpectedNumber => "expected a CPU number",
            CpulistErrorKind::CpuOutOfRange => "CPU number too large",
            CpulistErrorKind::ReversedRange => "range ends before it starts",
            CpulistErrorKind::UnexpectedChar => "unexpected character",
        };
        write!(f, "invalid CPU list at byte {}: {what}", self.offset)?;
        if self.kind == CpulistErrorKind::CpuOutOfRange {
            write!(f, " (at most {})", MAX_CPUS - 1)?;
        }
        Ok(())
    }
}

impl core::error::Error for ParseCpulistError {}

/// Parses the kernel's CPU list format: comma-separated CPU ids and inclusive ranges, such as
/// `0-3,8-11,15`, as found in sysfs `cpulist` files.
///
/// Whitespace (including the trailing newline sysfs adds) is accepted around numbers and
/// separators; an input of only whitespace is the empty set. Anything else — empty items,
/// a trailing comma, signs, reversed ranges, ids of [`MAX_CPUS`] or more — is an error that
/// says where it is. Never panics and never allocates, whatever the input; runs in time
/// linear in the input.
///
/// ```
/// use rverbs_std_shim::affinity::parse_cpulist;
///
/// let set = parse_cpulist("0-3,8-11,15\n").unwrap();
/// assert_eq!(set.len(), 9);
/// assert_eq!(set.to_string(), "0-3,8-11,15");
/// assert!(parse_cpulist("0-3,,4").is_err());
/// ```
pub fn parse_cpulist(text: &str) -> Result<CpuSet, ParseCpulistError> {
    let bytes = text.as_bytes();
    let mut set = CpuSet::new();
    let mut at = skip_whitespace(bytes, 0);
    if at == bytes.len() {
        return Ok(set);
    }
    loop {
        let (first, next) = parse_cpu(bytes, at)?;
        at = skip_whitespace(bytes, next);
        let last = if bytes.get(at) == Some(&b'-') {
            let start = skip_whitespace(bytes, at + 1);
            let (last, next) = parse_cpu(bytes, start)?;
            if last < first {
                return Err(ParseCpulistError {
                    kind: CpulistErrorKind::ReversedRange,
                    offset: start,
                });
            }
            at = skip_whitespace(bytes, next);
            last
        } else {
            first
        };
        set.insert_range(first, last);
        match bytes.get(at) {
            None => return Ok(set),
            Some(b',') => at = skip_whitespace(bytes, at + 1),
            Some(_) => {
                return Err(ParseCpulistError {
                    kind: CpulistErrorKind::UnexpectedChar,
                    offset: at,
                })
            }
        }
    }
}

fn skip_whitespace(bytes: &[u8], mut at: usize) -> usize {
    while bytes.get(at).is_some_and(u8::is_ascii_whitespace) {
        at += 1;
    }
    at
}

/// One decimal CPU id starting at `at`; returns it and the offset just past it.
fn parse_cpu(bytes: &[u8], at: usize) -> Result<(u32, usize), ParseCpulistError> {
    let mut value: u32 = 0;
    let mut end = at;
    while let Some(&b) = bytes.get(end) {
        if !b.is_ascii_digit() {
            break;
        }
        // `value < MAX_CPUS` here, so this cannot overflow.
        value = value * 10 + u32::from(b - b'0');
        if value >= MAX_CPUS {
            return Err(ParseCpulistError {
                kind: CpulistErrorKind::CpuOutOfRange,
                offset: at,
            });
        }
        end += 1;
    }
    if end == at {
        return Err(ParseCpulistError {
            kind: CpulistErrorKind::ExpectedNumber,
            offset: at,
        });
    }
    Ok((value, end))
}

/// Error from reading CPU topology or changing a thread's affinity.
#[derive(Debug)]
#[non_exhaustive]
pub enum AffinityError {
    /// Reading a sysfs file failed for a reason other than its absence.
    Read {
        /// The file.
        path: PathBuf,
        /// What the operating system said.
        source: io::Error,
    },
    /// A sysfs CPU list could not be parsed.
    Parse {
        /// The file.
        path: PathBuf,
        /// What is wrong with its contents.
        source: ParseCpulistError,
    },
    /// A sysfs `numa_node` file did not hold an integer.
    BadNumaNode {
        /// The file.
        path: PathBuf,
        /// Its contents, trimmed.
        contents: String,
    },
    /// No RDMA device of that name exists under `class/infiniband`.
    NoSuchDevice {
        /// The name asked for.
        device: String,
        /// The directory that does not exist.
        path: PathBuf,
    },
    /// The device name is empty, `.`, `..`, or contains `/` or NUL: not a name sysfs uses, and
    /// not something to join to a path.
    InvalidDeviceName {
        /// The name given.
        device: String,
    },
    /// `sched_setaffinity` or `sched_getaffinity` failed; `EINVAL` usually means the CPU is
    /// offline or outside the thread's cgroup cpuset.
    Syscall {
        /// The system call that failed.
        call: &'static str,
        /// What the operating system said.
        source: io::Error,
    },
    /// A CPU id not below [`MAX_CPUS`].
    CpuOutOfRange {
        /// The id given.
        cpu: u32,
    },
    /// Asked for the `requested`-th CPU (counting from zero) of a set with only `available`
    /// CPUs the thread may run on.
    NotEnoughCpus {
        /// The index asked for.
        requested: usize,
        /// How many CPUs there were to choose from.
        available: usize,
    },
}

impl fmt::Display for AffinityError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Read { path, .. } => write!(f, "cannot read {}", path.display()),
            Self::Parse { path, .. } => write!(f, "bad CPU list in {}", path.display()),
            Self::BadNumaNode { path, contents } => {
                write!(
                    f,
                    "bad NUMA node {contents:?} in {}: expected an integer",
                    path.display()
                )
            }
            Self::NoSuchDevice { device, path } => write!(
                f,
                "no RDMA device named {device:?} ({} does not exist)",
                path.display()
            ),
            Self::InvalidDeviceName { device } => {
                write!(f, "{device:?} is not a valid RDMA device name")
            }
            Self::Syscall { call, .. } => write!(f, "{call} failed"),
            Self::CpuOutOfRange { cpu } => {
                write!(f, "CPU {cpu} out of range (at most {})", MAX_CPUS - 1)
            }
            Self::NotEnoughCpus {
                requested,
                available,
            } => write!(
                f,
                "asked for CPU index {requested} but only {available} CPUs are allowed"
            ),
        }
    }
}

impl core::error::Error for AffinityError {
    fn source(&self) -> Option<&(dyn core::error::Error + 'static)> {
        match self {
            Self::Read { source, .. } | Self::Syscall { source, .. } => Some(source),
            Self::Parse { source, .. } => Some(source),
            _ => None,
        }
    }
}

/// Pins the calling thread to `cpu` alone.
///
/// Affects only the calling thread (threads it spawns afterwards inherit the mask). Fails
/// with [`AffinityError::Syscall`] (`EINVAL`) when the CPU is offline or outside the
/// thread's cgroup cpuset.
pub fn pin_current_thread(cpu: u32) -> Result<(), AffinityError> {
    let set = CpuSet::single(cpu).map_err(|cpu| AffinityError::CpuOutOfRange { cpu })?;
    set_current_thread_affinity(&set)
}

/// Restricts the calling thread to the CPUs in `set`.
pub fn set_current_thread_affinity(set: &CpuSet) -> Result<(), AffinityError> {
    // SAFETY: the pointer and size describe `set.words`, which lives across the call and is
    // only read. Its layout is the kernel's cpumask (an array of `unsigned long`), and
    // `cpu_set_t` has the same alignment; glibc passes a size larger than `cpu_set_t`
    // through to the kernel unchanged. pid 0 names the calling thread.
    let rc = unsafe {
        libc::sched_setaffinity(
            0,
            core::mem::size_of_val(&set.words),
            set.words.as_ptr().cast::<libc::cpu_set_t>(),
        )
    };
    if rc == 0 {
        Ok(())
    } else {
        Err(AffinityError::Syscall {
            call: "sched_setaffinity",
            source: io::Error::last_os_error(),
        })
    }
}

/// The CPUs the calling thread is allowed to run on.
///
/// This is the thread's affinity mask, already narrowed by its cgroup cpuset and by any
/// `taskset`/`numactl` the process was started under, so it is the set to choose from.
pub fn current_thread_affinity() -> Result<CpuSet, AffinityError> {
    let mut set = CpuSet::new();
    // SAFETY: the pointer and size describe `set.words`, which is exclusively borrowed for
    // the call; the kernel writes at most that many bytes and glibc zeroes the rest of the
    // buffer. Every bit pattern is a valid `[c_ulong; N]`. pid 0 names the calling thread.
    let rc = unsafe {
        libc::sched_getaffinity(
            0,
            core::mem::size_of_val(&set.words),
            set.words.as_mut_ptr().cast::<libc::cpu_set_t>(),
        )
    };
    if rc == 0 {
        Ok(set)
    } else {
        Err(AffinityError::Syscall {
            call: "sched_getaffinity",
            source: io::Error::last_os_error(),
        })
    }
}

/// The CPUs currently online, from `/sys/devices/system/cpu/online`.
///
/// Where sysfs is not mounted (some containers), falls back to `0..n` with `n` from
/// `sysconf(_SC_NPROCESSORS_ONLN)`, which is exact unless CPUs were taken offline.
pub fn online_cpus() -> Result<CpuSet, AffinityError> {
    let root = SysfsRoot::default();
    let path = root.0.join("devices/system/cpu/online");
    if let Some(text) = read_optional(&path)? {
        return parse_file(&path, &text);
    }
    // SAFETY: sysconf has no preconditions; it only reads system configuration.
    let n = unsafe { libc::sysconf(libc::_SC_NPROCESSORS_ONLN) };
    let n = u32::try_from(n.max(1)).unwrap_or(MAX_CPUS).min(MAX_CPUS);
    let mut set = CpuSet::new();
    set.insert_range(0, n - 1);
    Ok(set)
}

/// Picks the `nth` CPU near `device` among those the calling thread may use, and pins the
/// calling thread to it. Reads the real `/sys`; see [`SysfsRoot::pin_near_device`].
pub fn pin_near_device(device: &str, nth: usize) -> Result<PinnedTo, AffinityError> {
    SysfsRoot::default().pin_near_device(device, nth)
}

/// Where sysfs is mounted: `/sys` by default, a temporary directory in tests.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct SysfsRoot(pub PathBuf);

impl Default for SysfsRoot {
    #[inline]
    fn default() -> Self {
        Self(PathBuf::from("/sys"))
    }
}

impl SysfsRoot {
    /// A sysfs tree rooted at `path`.
    #[inline]
    pub fn new(path: impl Into<PathBuf>) -> Self {
        Self(path.into())
    }

    /// The root directory.
    #[inline]
    pub fn path(&self) -> &Path {
        &self.0
    }

    /// The CPUs listed in `devices/system/cpu/online`.
    pub fn online_cpus(&self) -> Result<CpuSet, AffinityError> {
        read_cpulist(&self.0.join("devices/system/cpu/online"))
    }

    /// The CPUs of NUMA node `node`, from `devices/system/node/node<node>/cpulist`.
    pub fn node_cpus(&self, node: u32) -> Result<CpuSet, AffinityError> {
        read_cpulist(
            &self
                .0
                .join(format!("devices/system/node/node{node}/cpulist")),
        )
    }

    /// The NUMA node of RDMA device `device`, from
    /// `class/infiniband/<device>/device/numa_node`; `None` when the file is missing or holds
    /// `-1` (no NUMA, or a virtual device such as SoftRoCE's `rxe0`).
    pub fn device_numa_node(&self, device: &str) -> Result<Option<u32>, AffinityError> {
        let dir = self.device_dir(device)?;
        read_numa_node(&dir.join("device/numa_node"))
    }

    /// The CPUs local to RDMA device `device`, from its `device/local_cpulist`, or else the
    /// CPU list of its NUMA node. `None` when neither is known (or the list is empty).
    pub fn device_local_cpus(&self, device: &str) -> Result<Option<CpuSet>, AffinityError> {
        Ok(self.device_locality(device)?.local_cpus)
    }

    /// Both the NUMA node and the local CPUs of RDMA device `device`.
    ///
    /// Fails with [`AffinityError::NoSuchDevice`] when `class/infiniband/<device>` does not
    /// exist; a device whose locality is unknown is not an error.
    pub fn device_locality(&self, device: &str) -> Result<DeviceLocality, AffinityError> {
        let dir = self.device_dir(device)?;
        let numa_node = read_numa_node(&dir.join("device/numa_node"))?;
        let local_path = dir.join("device/local_cpulist");
        let mut local_cpus = match read_optional(&local_path)? {
            Some(text) => Some(parse_file(&local_path, &text)?),
            None => None,
        };
        if local_cpus.is_none() {
            if let Some(node) = numa_node {
                let node_path = self
                    .0
                    .join(format!("devices/system/node/node{node}/cpulist"));
                if let Some(text) = read_optional(&node_path)? {
                    local_cpus = Some(parse_file(&node_path, &text)?);
                }
            }
        }
        Ok(DeviceLocality {
            numa_node,
            local_cpus: local_cpus.filter(|set| !set.is_empty()),
        })
    }

    /// Chooses a CPU for the `nth` thread near `device` (see [`DeviceLocality::choose`])
    /// among the calling thread's allowed CPUs, and pins the calling thread to it.
    pub fn pin_near_device(&self, device: &str, nth: usize) -> Result<PinnedTo, AffinityError> {
        let locality = self.device_locality(device)?;
        let allowed = current_thread_affinity()?;
        let choice = locality.choose(&allowed, nth)?;
        pin_current_thread(choice.cpu)?;
        Ok(choice)
    }

    fn device_dir(&self, device: &str) -> Result<PathBuf, AffinityError> {
        if device.is_empty() || device == "." || device == ".." || device.contains(['/', '\0']) {
            return Err(AffinityError::InvalidDeviceName {
                device: device.to_owned(),
            });
        }
        let dir = self.0.join("class/infiniband").join(device);
        match dir.try_exists() {
            Ok(true) => Ok(dir),
            Ok(false) => Err(AffinityError::NoSuchDevice {
                device: device.to_owned(),
                path: dir,
            }),
            Err(source) => Err(AffinityError::Read { path: dir, source }),
        }
    }
}

/// Where an RDMA device sits, as far as sysfs says. Returned by
/// [`SysfsRoot::device_locality`].
#[derive(Clone, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct DeviceLocality {
    /// The device's NUMA node, if known.
    pub numa_node: Option<u32>,
    /// The CPUs local to the device, if known.
    pub local_cpus: Option<CpuSet>,
}

impl DeviceLocality {
    /// Locality for a device at `numa_node` with `local_cpus`; mostly for tests and for
    /// callers that learn the topology some other way.
    #[inline]
    pub fn new(numa_node: Option<u32>, local_cpus: Option<CpuSet>) -> Self {
        Self {
            numa_node,
            local_cpus,
        }
    }

    /// Chooses the CPU for the `nth` thread (counting from zero) that wants to run near this
    /// device, among `allowed`. Does not pin anything.
    ///
    /// Candidates are ordered: first the allowed CPUs local to the device, ascending, then
    /// the other allowed CPUs, ascending. So with `k` local CPUs, threads `0..k` land on the
    /// device's node and later ones spill over to remote CPUs (reported as `local: false`)
    /// instead of doubling up on a core. When the device's locality is unknown every allowed
    /// CPU is a candidate and the result says `locality_known: false`.
    ///
    /// Fails with [`AffinityError::NotEnoughCpus`] when `nth >= allowed.len()`.
    pub fn choose(&self, allowed: &CpuSet, nth: usize) -> Result<PinnedTo, AffinityError> {
        let (local, remote) = match &self.local_cpus {
            Some(local) => (local.intersection(allowed), allowed.difference(local)),
            None => (CpuSet::new(), allowed.clone()),
        };
        let local_count = local.len();
        let (cpu, is_local) = if nth < local_count {
            (local.iter().nth(nth), true)
        } else {
            (remote.iter().nth(nth - local_count), false)
        };
        match cpu {
            Some(cpu) => Ok(PinnedTo {
                cpu,
                numa_node: self.numa_node,
                local: is_local,
                locality_known: self.local_cpus.is_some(),
            }),
            None => Err(AffinityError::NotEnoughCpus {
                requested: nth,
                available: local_count + remote.len(),
            }),
        }
    }
}

/// The outcome of [`pin_near_device`]: which CPU was chosen and how close it is to the device.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub struct PinnedTo {
    /// The CPU the thread now runs on.
    pub cpu: u32,
    /// The device's NUMA node, if sysfs knows it.
    pub numa_node: Option<u32>,
    /// Whether `cpu` is one of the device's local CPUs. `false` when the locality is unknown
    /// or when all local CPUs were taken by lower `nth` and the choice spilled over.
    pub local: bool,
    /// Whether sysfs said which CPUs are local to the device at all. When `false` the CPU was
    /// chosen from the allowed set blindly.
    pub locality_known: bool,
}

/// Reads a file, mapping "does not exist" to `None`.
fn read_optional(path: &Path) -> Result<Option<String>, AffinityError> {
    match std::fs::read_to_string(path) {
        Ok(text) => Ok(Some(text)),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
        Err(source) => Err(AffinityError::Read {
            path: path.to_owned(),
            source,
        }),
    }
}

fn read_cpulist(path: &Path) -> Result<CpuSet, AffinityError> {
    let text = std::fs::read_to_string(path).map_err(|source| AffinityError::Read {
        path: path.to_owned(),
        source,
    })?;
    parse_file(path, &text)
}

fn parse_file(path: &Path, text: &str) -> Result<CpuSet, AffinityError> {
    parse_cpulist(text).map_err(|source| AffinityError::Parse {
        path: path.to_owned(),
        source,
    })
}

fn read_numa_node(path: &Path) -> Result<Option<u32>, AffinityError> {
    let Some(text) = read_optional(path)? else {
        return Ok(None);
    };
    let trimmed = text.trim();
    match trimmed.parse::<i64>() {
        Ok(n) if n < 0 => Ok(None),
        Ok(n) => u32::try_from(n)
            .map(Some)
            .map_err(|_| AffinityError::BadNumaNode {
                path: path.to_owned(),
                contents: trimmed.to_owned(),
            }),
        Err(_) => Err(AffinityError::BadNumaNode {
            path: path.to_owned(),
            // A real numa_node file is a few bytes; bound what a broken one can put in an
            // error message.
            contents: trimmed.chars().take(64).collect(),
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use core::sync::atomic::{AtomicU32, Ordering};

    fn set(cpus: &[u32]) -> CpuSet {
        let mut s = CpuSet::new();
        for &c in cpus {
            s.insert(c).unwrap();
        }
        s
    }

    fn kind(text: &str) -> (CpulistErrorKind, usize) {
        let e = parse_cpulist(text).unwrap_err();
        (e.kind(), e.offset())
    }

    // ---- CpuSet ----

    #[test]
    fn cpuset_basics() {
        let mut s = CpuSet::new();
        assert!(s.is_empty());
        assert_eq!(s.first(), None);
        assert_eq!(s.insert(3), Ok(true));
        assert_eq!(s.insert(3), Ok(false));
        assert_eq!(s.insert(MAX_CPUS - 1), Ok(true));
        assert_eq!(s.insert(MAX_CPUS), Err(MAX_CPUS));
        assert_eq!(s.insert(u32::MAX), Err(u32::MAX));
        assert!(s.contains(3) && s.contains(MAX_CPUS - 1));
        assert!(!s.contains(MAX_CPUS) && !s.contains(u32::MAX));
        assert_eq!(s.len(), 2);
        assert_eq!(s.iter().collect::<Vec<_>>(), [3, MAX_CPUS - 1]);
        assert!(s.remove(3));
        assert!(!s.remove(3));
        assert!(!s.remove(u32::MAX));
        assert_eq!(s.first(), Some(MAX_CPUS - 1));
        assert_eq!(CpuSet::single(MAX_CPUS), Err(MAX_CPUS));
    }

    #[test]
    fn cpuset_set_operations() {
        let a = set(&[0, 1, 2, 64, 100]);
        let b = set(&[1, 2, 3, 100]);
        assert_eq!(a.intersection(&b), set(&[1, 2, 100]));
        assert_eq!(a.union(&b), set(&[0, 1, 2, 3, 64, 100]));
        assert_eq!(a.difference(&b), set(&[0, 64]));
    }

    #[test]
    fn cpuset_ranges_across_words() {
        for (first, last) in [
            (0, 0),
            (0, 63),
            (63, 64),
            (5, 200),
            (0, MAX_CPUS - 1),
            (4000, 4095),
        ] {
            let mut s = CpuSet::new();
            s.insert_range(first, last);
            let expected: Vec<u32> = (first..=last).collect();
            assert_eq!(s.iter().collect::<Vec<_>>(), expected, "{first}-{last}");
        }
    }

    #[test]
    fn cpuset_display_and_debug() {
        assert_eq!(CpuSet::new().to_string(), "");
        assert_eq!(set(&[0, 1, 2, 3, 8, 10, 11]).to_string(), "0-3,8,10-11");
        assert_eq!(format!("{:?}", set(&[5])), "CpuSet(5)");
        let mut all = CpuSet::new();
        all.insert_range(0, MAX_CPUS - 1);
        assert_eq!(all.to_string(), "0-4095");
    }

    // ---- parse_cpulist ----

    #[test]
    fn parses_sysfs_formats() {
        assert_eq!(parse_cpulist("0").unwrap(), set(&[0]));
        assert_eq!(parse_cpulist("0-3\n").unwrap(), set(&[0, 1, 2, 3]));
        assert_eq!(
            parse_cpulist("0-3,8-11,15").unwrap().to_string(),
            "0-3,8-11,15"
        );
        assert_eq!(parse_cpulist("2,1,0").unwrap(), set(&[0, 1, 2]));
        assert_eq!(parse_cpulist("1-3,2-5").unwrap(), set(&[1, 2, 3, 4, 5]));
        assert_eq!(parse_cpulist("7-7").unwrap(), set(&[7]));
        assert_eq!(parse_cpulist("007").unwrap(), set(&[7]));
        assert_eq!(parse_cpulist("4095").unwrap(), set(&[4095]));
    }

    #[test]
    fn tolerates_whitespace() {
        assert!(parse_cpulist("").unwrap().is_empty());
        assert!(parse_cpulist("\n").unwrap().is_empty());
        assert!(parse_cpulist(" \t\r\n ").unwrap().is_empty());
        assert_eq!(
            parse_cpulist("  0 - 1 ,\n 4\t,5-6 \n").unwrap(),
            set(&[0, 1, 4, 5, 6])
        );
    }

    #[test]
    fn rejects_garbage() {
        use CpulistErrorKind::*;
        assert_eq!(kind(","), (ExpectedNumber, 0));
        assert_eq!(kind("0,"), (ExpectedNumber, 2));
        assert_eq!(kind("0,,1"), (ExpectedNumber, 2));
        assert_eq!(kind("-1"), (ExpectedNumber, 0));
        assert_eq!(kind("1-"), (ExpectedNumber, 2));
        assert_eq!(kind("1--2"), (ExpectedNumber, 2));
        assert_eq!(kind("+1"), (ExpectedNumber, 0));
        assert_eq!(kind("a"), (ExpectedNumber, 0));
        assert_eq!(kind("1 2"), (UnexpectedChar, 2));
        assert_eq!(kind("1;2"), (UnexpectedChar, 1));
        assert_eq!(kind("0-3x"), (UnexpectedChar, 3));
        assert_eq!(kind("0-9:2/5"), (UnexpectedChar, 3));
        assert_eq!(kind("1-2-3"), (UnexpectedChar, 3));
        assert_eq!(kind("0x10"), (UnexpectedChar, 1));
        assert_eq!(kind("1\0"), (UnexpectedChar, 1));
        assert_eq!(kind("1é"), (UnexpectedChar, 1));
        assert_eq!(kind("5-3"), (ReversedRange, 2));
        assert_eq!(kind("4096"), (CpuOutOfRange, 0));
        assert_eq!(kind("0-4096"), (CpuOutOfRange, 2));
        assert_eq!(kind("99999999999999999999999999"), (CpuOutOfRange, 0));
        assert_eq!(kind("1,00000000000000000000004096"), (CpuOutOfRange, 2));
    }

    #[test]
    fn error_messages_say_where() {
        let e = parse_cpulist("1,x").unwrap_err();
        assert_eq!(
            e.to_string(),
            "invalid CPU list at byte 2: expected a CPU number"
        );
        let e = parse_cpulist("5000").unwrap_err();
        assert!(e.to_string().contains("at most 4095"), "{e}");
    }

    #[test]
    fn never_panics_on_arbitrary_bytes() {
        // A cheap deterministic stand-in for the fuzz target: every short string over the
        // alphabet the parser cares about, plus a few others.
        const ALPHABET: &[u8] = b"0149-, \nx";
        let mut buf = Vec::new();
        for len in 0..=5u32 {
            for mut code in 0..ALPHABET.len().pow(len) {
                buf.clear();
                for _ in 0..len {
                    buf.push(ALPHABET[code % ALPHABET.len()]);
                    code /= ALPHABET.len();
                }
                let text = core::str::from_utf8(&buf).unwrap();
                if let Ok(s) = parse_cpulist(text) {
                    // Whatever parses must survive a round trip through Display.
                    assert_eq!(parse_cpulist(&s.to_string()).unwrap(), s, "{text:?}");
                }
            }
        }
    }

    #[test]
    fn long_input_is_linear() {
        let text = "0-4095,".repeat(20_000) + "0";
        let s = parse_cpulist(&text).unwrap();
        assert_eq!(s.len(), MAX_CPUS as usize);
    }

    // ---- fake sysfs ----

    /// A temporary directory removed on drop.
    struct TempTree(PathBuf);

    impl TempTree {
        fn new() -> Self {
            static NEXT: AtomicU32 = AtomicU32::new(0);
            let dir = std::env::temp_dir().join(format!(
                "rverbs-std-shim-{}-{}",
                std::process::id(),
                NEXT.fetch_add(1, Ordering::Relaxed)
            ));
            let _ = std::fs::remove_dir_all(&dir);
            std::fs::create_dir_all(&dir).unwrap();
            Self(dir)
        }

        fn file(&self, rel: &str, contents: &str) -> &Self {
            let path = self.0.join(rel);
            std::fs::create_dir_all(path.parent().unwrap()).unwrap();
            std::fs::write(path, contents).unwrap();
            self
        }

        fn dir(&self, rel: &str) -> &Self {
            std::fs::create_dir_all(self.0.join(rel)).unwrap();
            self
        }

        fn root(&self) -> SysfsRoot {
            SysfsRoot::new(&self.0)
        }
    }

    impl Drop for TempTree {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }

    const DEV: &str = "class/infiniband/mlx5_0/device";

    #[test]
    fn default_root_is_sys() {
        assert_eq!(SysfsRoot::default().path(), Path::new("/sys"));
    }

    #[test]
    fn device_with_local_cpulist() {
        let t = TempTree::new();
        t.file(&format!("{DEV}/numa_node"), "1\n")
            .file(&format!("{DEV}/local_cpulist"), "8-15\n")
            // Must not be consulted when local_cpulist exists.
            .file("devices/system/node/node1/cpulist", "garbage");
        let root = t.root();
        assert_eq!(root.device_numa_node("mlx5_0").unwrap(), Some(1));
        let loc = root.device_locality("mlx5_0").unwrap();
        assert_eq!(loc.numa_node, Some(1));
        assert_eq!(loc.local_cpus.unwrap().to_string(), "8-15");
    }

    #[test]
    fn falls_back_to_node_cpulist() {
        let t = TempTree::new();
        t.file(&format!("{DEV}/numa_node"), "1\n")
            .file("devices/system/node/node1/cpulist", "4-7\n");
        let cpus = t.root().device_local_cpus("mlx5_0").unwrap().unwrap();
        assert_eq!(cpus.to_string(), "4-7");
        assert_eq!(t.root().node_cpus(1).unwrap().to_string(), "4-7");
    }

    #[test]
    fn unknown_locality() {
        // numa_node = -1 and no cpulist anywhere: a virtual device such as rxe0.
        let t = TempTree::new();
        t.file(&format!("{DEV}/numa_node"), "-1\n");
        let loc = t.root().device_locality("mlx5_0").unwrap();
        assert_eq!(loc, DeviceLocality::new(None, None));

        // No device/ directory at all.
        let t = TempTree::new();
        t.dir("class/infiniband/rxe0");
        assert_eq!(t.root().device_numa_node("rxe0").unwrap(), None);
        assert_eq!(t.root().device_local_cpus("rxe0").unwrap(), None);

        // Node known but its cpulist missing, and an empty local list.
        let t = TempTree::new();
        t.file(&format!("{DEV}/numa_node"), "3\n")
            .file(&format!("{DEV}/local_cpulist"), "\n");
        let loc = t.root().device_locality("mlx5_0").unwrap();
        assert_eq!(loc, DeviceLocality::new(Some(3), None));
    }

    #[test]
    fn single_socket_vm_local_list_without_node() {
        // Common on VMs: numa_node -1 yet a local_cpulist covering every CPU.
        let t = TempTree::new();
        t.file(&format!("{DEV}/numa_node"), "-1\n")
            .file(&format!("{DEV}/local_cpulist"), "0-3\n");
        let loc = t.root().device_locality("mlx5_0").unwrap();
        let pick = loc.choose(&set(&[0, 1, 2, 3]), 2).unwrap();
        assert_eq!(
            (pick.cpu, pick.numa_node, pick.local, pick.locality_known),
            (2, None, true, true)
        );
    }

    #[test]
    fn missing_and_invalid_devices() {
        let t = TempTree::new();
        t.dir("class/infiniband/mlx5_0");
        match t.root().device_locality("mlx5_9") {
            Err(AffinityError::NoSuchDevice { device, path }) => {
                assert_eq!(device, "mlx5_9");
                assert!(path.ends_with("class/infiniband/mlx5_9"));
            }
            other => panic!("{other:?}"),
        }
        for bad in ["", ".", "..", "../mlx5_0", "a/b", "x\0"] {
            assert!(
                matches!(
                    t.root().device_locality(bad),
                    Err(AffinityError::InvalidDeviceName { .. })
                ),
                "{bad:?}"
            );
        }
    }

    #[test]
    fn malformed_sysfs_files() {
        let t = TempTree::new();
        t.file(&format!("{DEV}/numa_node"), "zero\n");
        let e = t.root().device_numa_node("mlx5_0").unwrap_err();
        assert!(matches!(&e, AffinityError::BadNumaNode { contents, .. } if contents == "zero"));
        assert!(e.to_string().contains("numa_node"), "{e}");

        let t = TempTree::new();
        t.file(&format!("{DEV}/numa_node"), "99999999999\n");
        assert!(matches!(
            t.root().device_numa_node("mlx5_0"),
            Err(AffinityError::BadNumaNode { .. })
        ));

        let t = TempTree::new();
        t.file(&format!("{DEV}/local_cpulist"), "0-3,oops\n");
        let e = t.root().device_locality("mlx5_0").unwrap_err();
        match &e {
            AffinityError::Parse { path, source } => {
                assert!(path.ends_with("local_cpulist"));
                assert_eq!(source.offset(), 4);
            }
            other => panic!("{other:?}"),
        }
        assert!(core::error::Error::source(&e).is_some());

        // A directory where a file should be is a read error, not "unknown".
        let t = TempTree::new();
        t.dir(&format!("{DEV}/numa_node"));
        let e = t.root().device_numa_node("mlx5_0").unwrap_err();
        assert!(matches!(&e, AffinityError::Read { path, .. } if path.ends_with("numa_node")));
        assert!(core::error::Error::source(&e).is_some());
    }

    #[test]
    fn online_cpus_from_fake_tree() {
        let t = TempTree::new();
        t.file("devices/system/cpu/online", "0-5,7\n");
        assert_eq!(t.root().online_cpus().unwrap().to_string(), "0-5,7");
        let empty = TempTree::new();
        assert!(matches!(
            empty.root().online_cpus(),
            Err(AffinityError::Read { .. })
        ));
    }

    #[test]
    fn online_cpus_of_this_machine() {
        let online = online_cpus().unwrap();
        assert!(!online.is_empty());
        // Every CPU this thread may use is online.
        let allowed = current_thread_affinity().unwrap();
        assert_eq!(allowed.difference(&online), CpuSet::new());
    }

    // ---- choosing ----

    #[test]
    fn choose_prefers_local_then_spills_over() {
        let loc = DeviceLocality::new(Some(1), Some(set(&[4, 5, 6, 7])));
        let allowed = set(&[0, 1, 5, 6, 7]);
        let picks: Vec<(u32, bool)> = (0..5)
            .map(|n| {
                let p = loc.choose(&allowed, n).unwrap();
                assert_eq!(p.numa_node, Some(1));
                assert!(p.locality_known);
                (p.cpu, p.local)
            })
            .collect();
        assert_eq!(
            picks,
            [(5, true), (6, true), (7, true), (0, false), (1, false)]
        );
        match loc.choose(&allowed, 5) {
            Err(AffinityError::NotEnoughCpus {
                requested: 5,
                available: 5,
            }) => {}
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn choose_with_no_allowed_local_cpu() {
        // The cpuset confines us to the other socket: still works, says so.
        let loc = DeviceLocality::new(Some(0), Some(set(&[0, 1])));
        let p = loc.choose(&set(&[2, 3]), 0).unwrap();
        assert_eq!((p.cpu, p.local, p.locality_known), (2, false, true));
    }

    #[test]
    fn choose_with_unknown_locality() {
        let loc = DeviceLocality::default();
        let p = loc.choose(&set(&[3, 9]), 1).unwrap();
        assert_eq!(
            (p.cpu, p.numa_node, p.local, p.locality_known),
            (9, None, false, false)
        );
        assert!(loc.choose(&CpuSet::new(), 0).is_err());
    }

    // ---- real pinning (in a spawned thread, so the test harness's threads keep their mask) --

    #[test]
    fn pin_current_thread_and_read_back() {
        std::thread::spawn(|| {
            let allowed = current_thread_affinity().unwrap();
            assert!(!allowed.is_empty());
            let cpu = allowed.iter().last().unwrap();
            pin_current_thread(cpu).unwrap();
            assert_eq!(
                current_thread_affinity().unwrap(),
                CpuSet::single(cpu).unwrap()
            );

            // Restore a wider mask and check it sticks.
            set_current_thread_affinity(&allowed).unwrap();
            assert_eq!(current_thread_affinity().unwrap(), allowed);
        })
        .join()
        .unwrap();
    }

    #[test]
    fn pin_errors() {
        std::thread::spawn(|| {
            assert!(matches!(
                pin_current_thread(MAX_CPUS),
                Err(AffinityError::CpuOutOfRange { cpu: MAX_CPUS })
            ));
            // An empty mask is refused by the kernel.
            let e = set_current_thread_affinity(&CpuSet::new()).unwrap_err();
            assert!(matches!(
                &e,
                AffinityError::Syscall {
                    call: "sched_setaffinity",
                    ..
                }
            ));
            assert_eq!(e.to_string(), "sched_setaffinity failed");
        })
        .join()
        .unwrap();
    }

    #[test]
    fn pin_near_fake_device() {
        std::thread::spawn(|| {
            let allowed = current_thread_affinity().unwrap();
            let local_cpu = allowed.iter().last().unwrap();
            let t = TempTree::new();
            t.file(&format!("{DEV}/numa_node"), "0\n")
                .file(&format!("{DEV}/local_cpulist"), &format!("{local_cpu}\n"));
            let pinned = t.root().pin_near_device("mlx5_0", 0).unwrap();
            assert_eq!(
                (
                    pinned.cpu,
                    pinned.numa_node,
                    pinned.local,
                    pinned.locality_known
                ),
                (local_cpu, Some(0), true, true)
            );
            assert_eq!(
                current_thread_affinity().unwrap(),
                CpuSet::single(local_cpu).unwrap()
            );
            // The thread is now confined to one CPU, so a second rank does not fit.
            assert!(matches!(
                t.root().pin_near_device("mlx5_0", 1),
                Err(AffinityError::NotEnoughCpus { .. })
            ));
        })
        .join()
        .unwrap();
    }

    #[test]
    fn pin_near_device_with_unknown_locality() {
        std::thread::spawn(|| {
            let allowed = current_thread_affinity().unwrap();
            let t = TempTree::new();
            t.dir("class/infiniband/rxe0");
            let pinned = t.root().pin_near_device("rxe0", 0).unwrap();
            assert_eq!(pinned.cpu, allowed.first().unwrap());
            assert!(!pinned.local && !pinned.locality_known);
            assert_eq!(pinned.numa_node, None);
        })
        .join()
        .unwrap();
    }
}
