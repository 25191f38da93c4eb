//! Memory keys: (generation, kind, side, slot) scrambled into one `u32`, so that a stale,
//! foreign or wrong-kind key does not resolve. The scrambling is shared with the net's keys
//! (`net::region`), which pack other fields.

use super::entry::RawSge;
use super::AccessFlags;

const KEY_MIX: u32 = 0x9e37_79b9;
const KEY_UNMIX: u32 = inverse_odd(KEY_MIX);
const GEN_BITS: u32 = 22;
pub(super) const GEN_MASK: u32 = (1 << GEN_BITS) - 1;

/// The multiplicative inverse of an odd number modulo 2^32 (Newton's iteration).
const fn inverse_odd(a: u32) -> u32 {
    let mut x = a; // correct to 3 bits for odd a
    let mut i = 0;
    while i < 5 {
        x = x.wrapping_mul(2u32.wrapping_sub(a.wrapping_mul(x)));
        i += 1;
    }
    x
}

/// Scrambles packed key fields, so that neighbouring registrations get unrelated keys (and
/// off-by-one mistakes in a test do not hit a live key by accident).
pub(super) const fn scramble(raw: u32) -> u32 {
    raw.wrapping_mul(KEY_MIX)
}

/// The packed fields of a scrambled key.
pub(super) const fn unscramble(key: u32) -> u32 {
    key.wrapping_mul(KEY_UNMIX)
}

/// What a request names to reach memory: a key of `kind` with the bytes it should cover (an
/// entry's lkey and range, or a request's rkey and remote range), and the access it needs
/// there. A side's or node's region table resolves it.
#[derive(Clone, Copy, Debug)]
pub(super) struct Reach {
    pub(super) kind: KeyKind,
    pub(super) sge: RawSge,
    pub(super) need: AccessFlags,
}

impl Reach {
    /// The bytes of a local entry, by its lkey.
    pub(super) fn entry(sge: &RawSge, need: AccessFlags) -> Self {
        let (kind, sge) = (KeyKind::Local, *sge);
        Self { kind, sge, need }
    }

    /// The bytes a peer names by an rkey.
    pub(super) fn remote(key: u32, addr: u64, len: u32, need: AccessFlags) -> Self {
        let (kind, sge) = (KeyKind::Remote, RawSge { addr, len, key });
        Self { kind, sge, need }
    }
}

/// Whether a key names local memory (an lkey, for the owner's own work requests) or remote
/// memory (an rkey, for peers).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum KeyKind {
    Local,
    Remote,
}

/// Scrambles (gen, kind, side, slot) into a key. Generation 0 is never live, so key 0 (and
/// every key whose generation field decodes to 0) resolves to nothing.
pub(super) const fn make_key(gen: u32, kind: KeyKind, side: usize, slot: usize) -> u32 {
    let kind = match kind {
        KeyKind::Local => 0,
        KeyKind::Remote => 1,
    };
    let raw = ((gen & GEN_MASK) << 10) | (kind << 9) | ((side as u32 & 1) << 8) | slot as u32;
    scramble(raw)
}

/// (gen, kind, side, slot) of a key.
pub(super) const fn split_key(key: u32) -> (u32, KeyKind, usize, usize) {
    let raw = unscramble(key);
    let kind = if raw & (1 << 9) == 0 {
        KeyKind::Local
    } else {
        KeyKind::Remote
    };
    (
        raw >> 10,
        kind,
        ((raw >> 8) & 1) as usize,
        (raw & 0xff) as usize,
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_round_trip_and_differ() {
        assert_eq!(KEY_MIX.wrapping_mul(KEY_UNMIX), 1);
        let k = make_key(5, KeyKind::Remote, 1, 9);
        assert_eq!(split_key(k), (5, KeyKind::Remote, 1, 9));
        assert_ne!(k, make_key(5, KeyKind::Local, 1, 9));
        assert_eq!(split_key(0).0, 0);
    }
}
