//! Unpredictable initial packet sequence numbers, from the operating system's CSPRNG.
//!
//! `rverbs-core` cannot draw random bits (it is `no_std`), so its queue pairs take their
//! first PSN from a [`PsnSource`] their caller picks. On a network that others can reach,
//! the first PSN is what a forged RoCE packet must guess (docs/security.md): [`PSN_SOURCE`]
//! gives every queue pair 24 fresh bits from the OS (`getrandom(2)` on Linux).

use rverbs_core::params::{Psn, PsnSource};

/// 24 random bits from the operating system's CSPRNG as a PSN, or `None` if the OS gave none
/// (the queue pair is then not created: rverbs never falls back to a predictable PSN).
pub fn random_psn() -> Option<Psn> {
    let mut b = [0u8; 4];
    getrandom::fill(&mut b[..3]).ok()?;
    Psn::new(u32::from_le_bytes(b))
}

/// The source every std path of rverbs gives its queue pairs: [`random_psn`] per queue pair.
pub const PSN_SOURCE: PsnSource = PsnSource::Draw(random_psn);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn random_psns_fit_24_bits_and_differ() {
        let draws: Vec<u32> = (0..64).map(|_| random_psn().unwrap().get()).collect();
        assert!(draws.iter().all(|&p| p < 1 << 24));
        // 64 draws of 24 bits all equal, or all within one byte of each other, would mean
        // the bits are not random (probability far below 2^-400).
        let (min, max) = (draws.iter().min().unwrap(), draws.iter().max().unwrap());
        assert!(
            max - min > 0xff,
            "64 draws span only {:#x}..{:#x}",
            min,
            max
        );
        // Every bit position takes both values somewhere in 64 draws.
        let (or, and) = draws
            .iter()
            .fold((0, 0xff_ffff), |(o, a), &p| (o | p, a & p));
        assert_eq!((or, and), (0xff_ffff, 0));
        assert!(PSN_SOURCE.is_drawn());
    }
}
