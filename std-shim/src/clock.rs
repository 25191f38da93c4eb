//! A [`Clock`] backed by the operating system's monotonic clock.

use core::time::Duration;

use rverbs_core::poll::{Clock, Instant};

/// A monotonic [`Clock`] whose epoch is the moment it was constructed.
///
/// Backed by [`std::time::Instant`] (`CLOCK_MONOTONIC` on Linux, read through the vDSO, so
/// [`now`](Clock::now) costs tens of nanoseconds and never enters the kernel).
///
/// [`Instant`]s it hands out count nanoseconds since its own epoch: compare them only with
/// instants from the same `StdClock` (or a copy of it, which shares the epoch).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct StdClock {
    epoch: std::time::Instant,
}

impl StdClock {
    /// A clock whose epoch is now.
    #[inline]
    pub fn new() -> Self {
        Self {
            epoch: std::time::Instant::now(),
        }
    }

    /// The moment this clock reads zero.
    #[inline]
    pub const fn epoch(&self) -> std::time::Instant {
        self.epoch
    }

    /// Time elapsed since `earlier` (an instant from this clock), or zero if `earlier` lies in
    /// the future. Does not allocate.
    #[inline]
    pub fn elapsed_since(&self, earlier: Instant) -> Duration {
        self.now().saturating_duration_since(earlier)
    }

    /// Converts a [`std::time::Instant`] to this clock's time base. Moments before the epoch
    /// map to zero; moments more than ~584 years after it saturate.
    #[inline]
    pub fn from_std(&self, at: std::time::Instant) -> Instant {
        Instant::from_nanos(nanos_saturating(at.saturating_duration_since(self.epoch)))
    }

    /// Converts an instant of this clock back to a [`std::time::Instant`], for APIs such as
    /// `Condvar::wait_timeout` that want one. Returns `None` if the result is not
    /// representable.
    #[inline]
    pub fn to_std(&self, at: Instant) -> Option<std::time::Instant> {
        self.epoch.checked_add(Duration::from_nanos(at.as_nanos()))
    }
}

/// The process-wide monotonic clock: `CLOCK_MONOTONIC` in nanoseconds since boot, as a unit
/// struct, so `&MONOTONIC` is the `'static` clock channels keep
/// ([`StaticClock`](rverbs_core::poll::StaticClock)). Instants of all `Monotonic` reads are
/// comparable with each other (not with a [`StdClock`]'s).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct Monotonic;

/// The one [`Monotonic`] clock: `Channel::new(provider, config, &MONOTONIC)`.
pub static MONOTONIC: Monotonic = Monotonic;

impl Clock for Monotonic {
    /// Reads `CLOCK_MONOTONIC` (through the vDSO on Linux: no system call). Does not allocate.
    #[inline]
    fn now(&self) -> Instant {
        let mut ts = libc::timespec {
            tv_sec: 0,
            tv_nsec: 0,
        };
        // SAFETY: ts is a valid timespec to write; CLOCK_MONOTONIC always exists on Linux.
        let rc = unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
        debug_assert_eq!(rc, 0, "clock_gettime(CLOCK_MONOTONIC) failed");
        let nanos = (ts.tv_sec as u64)
            .saturating_mul(1_000_000_000)
            .saturating_add(ts.tv_nsec as u64);
        Instant::from_nanos(nanos)
    }
}

impl Default for StdClock {
    #[inline]
    fn default() -> Self {
        Self::new()
    }
}

impl Clock for StdClock {
    /// Nanoseconds since this clock's epoch. Does not allocate and does not make a system call
    /// on Linux (vDSO).
    #[inline]
    fn now(&self) -> Instant {
        Instant::from_nanos(nanos_saturating(self.epoch.elapsed()))
    }
}

#[inline]
fn nanos_saturating(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;
    use rverbs_core::poll::Deadline;

    #[test]
    fn starts_near_zero_and_never_goes_backwards() {
        let clock = StdClock::new();
        let mut last = clock.now();
        // A fresh clock reads far less than a minute; anything else means a wrong epoch.
        assert!(last.as_nanos() < 60_000_000_000);
        for _ in 0..10_000 {
            let t = clock.now();
            assert!(t >= last);
            last = t;
        }
    }

    #[test]
    fn copies_share_the_epoch() {
        let a = StdClock::new();
        let b = a;
        let ta = a.now();
        let tb = b.now();
        assert!(tb >= ta);
        assert_eq!(a.epoch(), b.epoch());
    }

    #[test]
    fn elapsed_since_future_is_zero() {
        let clock = StdClock::new();
        let future = clock.now() + Duration::from_secs(3600);
        assert_eq!(clock.elapsed_since(future), Duration::ZERO);
    }

    #[test]
    fn elapsed_since_measures_a_sleep() {
        let clock = StdClock::new();
        let start = clock.now();
        std::thread::sleep(Duration::from_millis(5));
        assert!(clock.elapsed_since(start) >= Duration::from_millis(5));
    }

    #[test]
    fn std_instants_convert_back_exactly_and_before_the_epoch_clamps_to_zero() {
        let clock = StdClock::new();
        let std_now = std::time::Instant::now();
        let ours = clock.from_std(std_now);
        assert_eq!(clock.to_std(ours), Some(std_now));
        // Before the epoch clamps to zero.
        if let Some(before) = clock.epoch().checked_sub(Duration::from_secs(1)) {
            assert_eq!(clock.from_std(before), Instant::from_nanos(0));
        }
        assert_eq!(clock.to_std(Instant::from_nanos(u64::MAX)).is_some(), {
            clock
                .epoch()
                .checked_add(Duration::from_nanos(u64::MAX))
                .is_some()
        });
    }

    #[test]
    fn a_deadline_passes_after_its_duration_and_never_does_not() {
        let clock = StdClock::new();
        let d = Deadline::after(&clock, Duration::from_millis(1));
        assert!(!Deadline::never().passed(&clock));
        while !d.passed(&clock) {
            core::hint::spin_loop();
        }
        assert!(clock.now() >= d.instant());
    }
}

#[cfg(test)]
mod monotonic_tests {
    use super::*;

    #[test]
    fn monotonic_advances_with_real_time() {
        let a = MONOTONIC.now();
        std::thread::sleep(Duration::from_millis(5));
        let b = MONOTONIC.now();
        assert!(b.saturating_duration_since(a) >= Duration::from_millis(5));
    }
}
