//! What a busy-poll loop does between two empty polls.
//!
//! A pinned thread with a core of its own should spin: yielding costs microseconds it does
//! not have. A thread that shares its core (more ranks than cores, as in a test VM) must
//! give the core away, or its peer never runs and every wait lasts a scheduler period.
//! [`Spin`] does the first; [`SpinThen`] spins a configurable number of rounds, then calls a
//! relax step the caller brings (`no_std` code can neither yield nor sleep).
//!
//! std programs do not build their own: `rverbs_std_shim::WaitPolicy` describes spin, yield
//! or sleep as one `Copy` value, and its `StdBackoff` implements [`Backoff`] here.

/// A waiting policy for busy-poll loops.
pub trait Backoff {
    /// Called after a poll that found nothing.
    fn snooze(&mut self);
    /// Called after a poll that made progress: the next wait starts spinning again.
    fn reset(&mut self);
}

impl<B: Backoff + ?Sized> Backoff for &mut B {
    #[inline]
    fn snooze(&mut self) {
        (**self).snooze();
    }
    #[inline]
    fn reset(&mut self) {
        (**self).reset();
    }
}

/// Spins forever: the right choice for a thread pinned to a core of its own.
#[derive(Clone, Copy, Debug, Default)]
pub struct Spin;

impl Backoff for Spin {
    #[inline]
    fn snooze(&mut self) {
        core::hint::spin_loop();
    }
    #[inline]
    fn reset(&mut self) {}
}

/// Spins `spins` times, then calls `relax` on every further empty poll (a thread yield or a
/// short sleep, supplied by the caller because `no_std` code cannot do either).
#[derive(Clone, Copy, Debug)]
pub struct SpinThen<R: FnMut()> {
    spins: u32,
    count: u32,
    relax: R,
}

impl<R: FnMut()> SpinThen<R> {
    /// Spin `spins` rounds before calling `relax` on each empty poll.
    pub const fn new(spins: u32, relax: R) -> Self {
        Self {
            spins,
            count: 0,
            relax,
        }
    }
}

impl<R: FnMut()> Backoff for SpinThen<R> {
    #[inline]
    fn snooze(&mut self) {
        if self.count < self.spins {
            self.count += 1;
            core::hint::spin_loop();
        } else {
            (self.relax)();
        }
    }
    #[inline]
    fn reset(&mut self) {
        self.count = 0;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn spins_then_relaxes_then_resets() {
        let mut relaxed = 0u32;
        {
            let mut b = SpinThen::new(3, || relaxed += 1);
            for _ in 0..5 {
                b.snooze();
            }
            b.reset();
            for _ in 0..4 {
                b.snooze();
            }
        }
        assert_eq!(relaxed, 2 + 1);
    }
}
