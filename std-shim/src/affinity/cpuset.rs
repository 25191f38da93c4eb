//! [`CpuSet`]: a fixed-size CPU bitmap laid out like the kernel's cpumask.

use core::fmt;
use core::iter::FusedIterator;

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
/// [`parse_cpulist`](super::parse_cpulist) reads back.
#[derive(Clone, PartialEq, Eq, Hash)]
pub struct CpuSet {
    // Visible to the sibling modules because `syscall` hands it to the kernel as a cpumask.
    pub(super) words: [Word; WORDS],
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
    pub(super) fn insert_range(&mut self, first: u32, last: u32) {
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::affinity::test_support::set;

    #[test]
    fn cpuset_inserts_removes_and_refuses_cpus_beyond_max_cpus() {
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
    fn cpuset_intersection_union_and_difference_hold_the_right_cpus() {
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
}
