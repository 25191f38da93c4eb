//! Caller-supplied time.
//!
//! `rverbs-core` never asks the operating system for the time: a `no_std` engine has no
//! clock, and a pinned trading thread usually wants to choose its own (TSC, `CLOCK_MONOTONIC`,
//! a simulated clock in tests). Anything that waits with a deadline takes a [`Clock`].
//! `rverbs-std-shim` provides one backed by `std::time::Instant`.

use core::ops::Add;
use core::time::Duration;

/// A point in time, in nanoseconds since an epoch chosen by the [`Clock`] that made it.
///
/// Instants from different clocks must not be compared.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Instant(u64);

impl Instant {
    /// An instant `nanos` nanoseconds after the clock's epoch.
    #[inline]
    pub const fn from_nanos(nanos: u64) -> Self {
        Self(nanos)
    }

    /// Nanoseconds since the clock's epoch.
    #[inline]
    pub const fn as_nanos(self) -> u64 {
        self.0
    }

    /// Time elapsed from `earlier` to `self`, or zero if `earlier` is later.
    #[inline]
    pub const fn saturating_duration_since(self, earlier: Instant) -> Duration {
        Duration::from_nanos(self.0.saturating_sub(earlier.0))
    }
}

impl Add<Duration> for Instant {
    type Output = Instant;

    /// Saturates at the end of time instead of overflowing: a deadline of "never" is fine.
    #[inline]
    fn add(self, rhs: Duration) -> Instant {
        let nanos = u64::try_from(rhs.as_nanos()).unwrap_or(u64::MAX);
        Instant(self.0.saturating_add(nanos))
    }
}

/// A source of monotonic time.
pub trait Clock {
    /// The current time. Must never go backwards.
    fn now(&self) -> Instant;
}

impl<C: Clock + ?Sized> Clock for &C {
    #[inline]
    fn now(&self) -> Instant {
        (**self).now()
    }
}

/// The clock a channel keeps for its timeouts: any [`Clock`] that lives for the whole program
/// and may be read from any thread (a `static`, or a unit struct such as
/// `rverbs_std_shim::MONOTONIC`). A reference, so a channel stays one pointer larger whatever
/// the clock is, and no type parameter spreads through every layer.
pub type StaticClock = &'static (dyn Clock + Sync);

/// A deadline measured on a [`Clock`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Deadline {
    at: Instant,
}

impl Deadline {
    /// The deadline `timeout` after `clock.now()`.
    #[inline]
    pub fn after<C: Clock + ?Sized>(clock: &C, timeout: Duration) -> Self {
        Self {
            at: clock.now() + timeout,
        }
    }

    /// A deadline that never passes.
    #[inline]
    pub const fn never() -> Self {
        Self {
            at: Instant(u64::MAX),
        }
    }

    /// The instant at which the deadline passes.
    #[inline]
    pub const fn instant(self) -> Instant {
        self.at
    }

    /// Time left until the deadline (zero once it passed; [`Duration::MAX`] for
    /// [`never`](Self::never)).
    #[inline]
    pub fn remaining<C: Clock + ?Sized>(self, clock: &C) -> Duration {
        if self.at == Instant(u64::MAX) {
            Duration::MAX
        } else {
            self.at.saturating_duration_since(clock.now())
        }
    }

    /// Whether the deadline has passed.
    #[inline]
    pub fn passed<C: Clock + ?Sized>(self, clock: &C) -> bool {
        self.at != Instant(u64::MAX) && clock.now() >= self.at
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn adding_a_duration_past_the_end_of_time_saturates() {
        let t = Instant::from_nanos(u64::MAX - 1) + Duration::from_secs(1);
        assert_eq!(t.as_nanos(), u64::MAX);
    }

    #[test]
    fn duration_since_a_later_instant_saturates_to_zero() {
        let a = Instant::from_nanos(10);
        let b = Instant::from_nanos(25);
        assert_eq!(b.saturating_duration_since(a), Duration::from_nanos(15));
        assert_eq!(a.saturating_duration_since(b), Duration::ZERO);
    }
}

/// A clock for tests and simulations: every read advances it by a fixed step, so a wait
/// with a deadline ends after a known number of reads, whatever the machine's speed (and
/// under Miri, where real time crawls). `static CLOCK: StepClock = StepClock::new(...)`
/// makes it a [`StaticClock`].
#[cfg(target_has_atomic = "64")]
#[derive(Debug)]
pub struct StepClock {
    now: core::sync::atomic::AtomicU64,
    step: u64,
}

#[cfg(target_has_atomic = "64")]
impl StepClock {
    /// A clock at zero that advances by `step` on every read.
    pub const fn new(step: Duration) -> Self {
        Self {
            now: core::sync::atomic::AtomicU64::new(0),
            step: step.as_nanos() as u64,
        }
    }

    /// Moves the clock forward by `d` without a read.
    pub fn advance(&self, d: Duration) {
        let nanos = u64::try_from(d.as_nanos()).unwrap_or(u64::MAX);
        self.now
            .fetch_add(nanos, core::sync::atomic::Ordering::Relaxed);
    }
}

#[cfg(target_has_atomic = "64")]
impl Clock for StepClock {
    fn now(&self) -> Instant {
        let step = self.step;
        Instant(
            self.now
                .fetch_add(step, core::sync::atomic::Ordering::Relaxed)
                .saturating_add(step),
        )
    }
}
