//! Spans: resolved memory, ready to copy.

use super::entry::RawSge;
use super::MAX_SGE;

#[derive(Clone, Copy)]
pub(super) struct Span {
    ptr: *mut u8,
    len: usize,
}

const NO_SPAN: Span = Span {
    ptr: core::ptr::null_mut(),
    len: 0,
};

#[derive(Clone, Copy)]
pub(super) struct Spans {
    list: [Span; MAX_SGE],
    n: usize,
    pub(super) total: u64,
}

impl Spans {
    pub(super) const EMPTY: Spans = Spans {
        list: [NO_SPAN; MAX_SGE],
        n: 0,
        total: 0,
    };

    pub(super) fn one(ptr: *mut u8, len: usize) -> Spans {
        let mut s = Spans::EMPTY;
        s.list[0] = Span { ptr, len };
        s.n = 1;
        s.total = len as u64;
        s
    }

    /// The spans without their first `n` bytes (empty if they hold fewer).
    #[cfg(feature = "alloc")]
    pub(super) fn skip(&self, mut n: u64) -> Spans {
        let mut out = Spans::EMPTY;
        for s in self.as_slice() {
            let len = s.len as u64;
            if n >= len {
                n -= len;
                continue;
            }
            let at = n as usize;
            n = 0;
            out.list[out.n] = Span {
                // Inside the span: keeps its provenance (wrapping_add only because it needs
                // no unsafe).
                ptr: s.ptr.wrapping_add(at),
                len: s.len - at,
            };
            out.n += 1;
            out.total += (s.len - at) as u64;
        }
        out
    }

    pub(super) fn as_slice(&self) -> &[Span] {
        &self.list[..self.n.min(MAX_SGE)]
    }
}

/// Resolves a list of entries into spans with `resolve` (which checks key, bounds and
/// access), skipping zero-length entries (which are not checked). `None` if one does not
/// resolve.
pub(super) fn gather(
    sges: &[RawSge],
    mut resolve: impl FnMut(&RawSge) -> Option<*mut u8>,
) -> Option<Spans> {
    let mut out = Spans::EMPTY;
    for s in sges {
        if s.len == 0 {
            continue;
        }
        let ptr = resolve(s)?;
        *out.list.get_mut(out.n)? = Span {
            ptr,
            len: s.len as usize,
        };
        out.n += 1;
        out.total += u64::from(s.len);
    }
    Some(out)
}

/// Copies from `src` into `dst`, in order, until either runs out.
///
/// # Safety
/// Every span of `src` must be valid for reads and every span of `dst` for writes of its
/// length, and nothing may hold a Rust reference to the bytes of `dst`.
pub(super) unsafe fn copy_spans(src: &[Span], dst: &[Span]) {
    let (mut si, mut so, mut di, mut doff) = (0, 0, 0, 0);
    while let (Some(s), Some(d)) = (src.get(si), dst.get(di)) {
        let n = (s.len - so).min(d.len - doff);
        if n > 0 {
            // SAFETY: so + n <= s.len and doff + n <= d.len, so both ranges lie inside spans
            // the caller vouches for; `copy` allows them to overlap.
            unsafe { core::ptr::copy(s.ptr.add(so), d.ptr.add(doff), n) };
        }
        so += n;
        doff += n;
        if so == s.len {
            si += 1;
            so = 0;
        }
        if doff == d.len {
            di += 1;
            doff = 0;
        }
    }
}
