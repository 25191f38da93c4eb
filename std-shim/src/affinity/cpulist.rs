//! The kernel's CPU list text format (`0-3,8-11`): [`parse_cpulist`] and its error.

use core::fmt;

use super::{CpuSet, MAX_CPUS};

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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::affinity::test_support::set;

    fn kind(text: &str) -> (CpulistErrorKind, usize) {
        let e = parse_cpulist(text).unwrap_err();
        (e.kind(), e.offset())
    }

    #[test]
    fn cpulist_parses_single_cpus_ranges_and_overlaps_as_sysfs_writes_them() {
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
    fn cpulist_ignores_whitespace_and_an_empty_list_is_empty() {
        assert!(parse_cpulist("").unwrap().is_empty());
        assert!(parse_cpulist("\n").unwrap().is_empty());
        assert!(parse_cpulist(" \t\r\n ").unwrap().is_empty());
        assert_eq!(
            parse_cpulist("  0 - 1 ,\n 4\t,5-6 \n").unwrap(),
            set(&[0, 1, 4, 5, 6])
        );
    }

    #[test]
    fn cpulist_garbage_is_refused_with_its_kind_and_offset() {
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
}
