//! Back-off policies that need the operating system's scheduler.
//!
//! # Which one to pick
//!
//! | Situation | Policy |
//! |---|---|
//! | Thread pinned to a core nobody else uses (the production setup) | [`Spin`]: never give the core away, every yield costs microseconds |
//! | More polling threads than cores (a laptop, a CI VM, SoftRoCE tests) | [`spin_then_yield`]: spin briefly, then let the peer that must make progress run |
//! | A wait expected to last milliseconds or more (connection setup, a barrier behind a slow rank) | [`spin_then_sleep`]: stop burning a core altogether |
//!
//! A spin count in the low thousands covers a round trip on a real NIC (a few microseconds);
//! past that, the peer is most likely not running at all, which is what yielding fixes.

use core::time::Duration;

use rverbs_core::poll::{Backoff, SpinThen};

#[cfg(doc)]
use rverbs_core::poll::Spin;

/// Spins `spins` rounds, then calls [`std::thread::yield_now`] on every further empty poll.
///
/// Use it when threads outnumber cores: without the yield, a poller can hold the core for a
/// whole scheduler slice while the thread it waits for is runnable but not running. The
/// returned value is a plain [`SpinThen`] with a function pointer, so it is `Copy`, `Send`
/// and can be named in a struct field. Neither construction nor
/// [`snooze`](Backoff::snooze) allocates.
#[inline]
pub fn spin_then_yield(spins: u32) -> SpinThen<fn()> {
    SpinThen::new(spins, std::thread::yield_now as fn())
}

/// Spins `spins` rounds, then sleeps `pause` on every further empty poll.
///
/// For waits long enough that spinning wastes a core (bootstrap barriers, connection setup).
/// Linux sleeps at least about 50 µs (timer slack) whatever `pause` says, so this is wrong for
/// anything latency-sensitive.
#[inline]
pub fn spin_then_sleep(spins: u32, pause: Duration) -> SpinThenSleep {
    SpinThenSleep {
        spins,
        count: 0,
        pause,
    }
}

/// The policy returned by [`spin_then_sleep`].
///
/// Its own type rather than a [`SpinThen`] because a closure capturing the pause cannot be
/// named in a struct field, and boxing it would allocate.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SpinThenSleep {
    spins: u32,
    count: u32,
    pause: Duration,
}

impl SpinThenSleep {
    /// How long each empty poll sleeps once spinning is over.
    #[inline]
    pub const fn pause(&self) -> Duration {
        self.pause
    }

    /// How many empty polls spin before the first sleep.
    #[inline]
    pub const fn spins(&self) -> u32 {
        self.spins
    }
}

impl Backoff for SpinThenSleep {
    /// Spins or sleeps; never allocates.
    #[inline]
    fn snooze(&mut self) {
        if self.count < self.spins {
            self.count += 1;
            core::hint::spin_loop();
        } else {
            std::thread::sleep(self.pause);
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
    use std::time::Instant;

    #[test]
    fn yield_policy_is_copy_and_send() {
        fn assert_send_copy<T: Send + Copy + 'static>(_: &T) {}
        let b = spin_then_yield(10);
        assert_send_copy(&b);
        let s = spin_then_sleep(10, Duration::from_micros(1));
        assert_send_copy(&s);
    }

    #[test]
    fn yield_policy_runs() {
        let mut b = spin_then_yield(2);
        for _ in 0..10 {
            b.snooze();
        }
        b.reset();
        b.snooze();
    }

    #[test]
    fn sleep_policy_sleeps_only_after_spinning() {
        let pause = Duration::from_millis(2);
        let mut b = spin_then_sleep(1000, pause);
        assert_eq!(b.spins(), 1000);
        assert_eq!(b.pause(), pause);

        // 1000 spins take microseconds; a sleep among them would take at least `pause`.
        // Not a timing assertion on speed, only on the lower bound a sleep guarantees.
        for _ in 0..1000 {
            b.snooze();
        }
        let before = Instant::now();
        b.snooze();
        assert!(before.elapsed() >= pause);

        b.reset();
        assert_eq!(b.count, 0);
    }

    #[test]
    fn zero_spins_sleeps_at_once() {
        let pause = Duration::from_millis(1);
        let mut b = spin_then_sleep(0, pause);
        let before = Instant::now();
        b.snooze();
        assert!(before.elapsed() >= pause);
    }
}

/// A waiting policy chosen at run time (from a flag or a config file), as one `Copy` type.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WaitPolicy {
    /// Spin forever: a pinned thread with a core of its own.
    Spin,
    /// Spin `spins` empty polls, then yield the CPU on each further one.
    Yield {
        /// Empty polls spent spinning first.
        spins: u32,
    },
    /// Spin `spins` empty polls, then sleep `pause` on each further one: for ranks that
    /// outnumber cores, where a yield may hand the core straight back.
    Sleep {
        /// Empty polls spent spinning first.
        spins: u32,
        /// How long each sleep lasts.
        pause: Duration,
    },
}

impl WaitPolicy {
    /// A fresh back-off following this policy.
    pub const fn backoff(self) -> StdBackoff {
        StdBackoff {
            policy: self,
            count: 0,
        }
    }
}

/// The [`Backoff`] of a [`WaitPolicy`]. Never allocates.
#[derive(Clone, Copy, Debug)]
pub struct StdBackoff {
    policy: WaitPolicy,
    count: u32,
}

impl StdBackoff {
    /// The policy.
    pub const fn policy(&self) -> WaitPolicy {
        self.policy
    }
}

impl Backoff for StdBackoff {
    #[inline]
    fn snooze(&mut self) {
        let spins = match self.policy {
            WaitPolicy::Spin => u32::MAX,
            WaitPolicy::Yield { spins } | WaitPolicy::Sleep { spins, .. } => spins,
        };
        if self.count < spins {
            self.count += 1;
            core::hint::spin_loop();
            return;
        }
        match self.policy {
            WaitPolicy::Sleep { pause, .. } => std::thread::sleep(pause),
            _ => std::thread::yield_now(),
        }
    }

    #[inline]
    fn reset(&mut self) {
        self.count = 0;
    }
}
