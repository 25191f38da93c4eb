//! [`Patience`]: the one rule every waiting loop of the library keeps.
//!
//! A wait ends at its deadline whether or not it made progress: a peer that keeps traffic
//! coming (completions that are not the one awaited, oversize datagrams, messages for a
//! handler) must not hold a caller past the time it asked for. So a waiting loop calls
//! [`Patience::run_out`] at the top of **every** iteration, before it looks at what the
//! iteration brought, and gives up when it says so; the loop's failure checks sit next to
//! it. Reading the clock costs about as much as an empty poll, so `run_out` reads it only
//! on every [`CHECK_EVERY`]-th turn (and the first read is that turn, so a wait that ends
//! within a few polls reads no clock at all): a wait overruns its deadline by at most
//! `CHECK_EVERY - 1` turns, each a poll and at most one back-off step bounded by
//! [`Patience::remaining`].
//!
//! `docs/safety.md` ("Every wait is bounded") lists each waiting loop with the test that
//! drives it past its deadline while traffic keeps coming.

use core::time::Duration;

use super::clock::{Clock, Deadline};

/// Turns of a waiting loop between two reads of the clock.
pub const CHECK_EVERY: u32 = 16;

/// The deadline of one waiting loop and the count of its turns. See the
/// [module docs](self). Does not allocate.
#[derive(Clone, Copy, Debug)]
pub struct Patience {
    deadline: Option<Deadline>,
    /// The timeout a lazily started deadline counts from its first clock read.
    timeout: Duration,
    turns: u32,
}

impl Patience {
    /// A wait that ends at `deadline`.
    #[inline]
    pub const fn until(deadline: Deadline) -> Self {
        Self {
            deadline: Some(deadline),
            timeout: Duration::ZERO,
            turns: 0,
        }
    }

    /// A wait of `timeout`, counted from the first time the clock is read (the
    /// [`CHECK_EVERY`]-th turn, or an earlier [`Patience::remaining`]): a wait that ends
    /// sooner never reads the clock.
    #[inline]
    pub const fn lazy(timeout: Duration) -> Self {
        Self {
            deadline: None,
            timeout,
            turns: 0,
        }
    }

    /// `until(d)` for `Some(d)`, else `lazy(timeout)`.
    #[inline]
    pub const fn new(deadline: Option<Deadline>, timeout: Duration) -> Self {
        match deadline {
            Some(d) => Self::until(d),
            None => Self::lazy(timeout),
        }
    }

    /// Counts one turn of the loop and says whether the deadline has passed: call it at the
    /// top of every iteration, whatever the last one did. Reads the clock on every
    /// [`CHECK_EVERY`]-th call only. Does not allocate.
    #[inline]
    pub fn run_out<C: Clock + ?Sized>(&mut self, clock: &C) -> bool {
        self.turns = self.turns.wrapping_add(1);
        if !self.turns.is_multiple_of(CHECK_EVERY) {
            return false;
        }
        self.deadline(clock).passed(clock)
    }

    /// Time left (starting a lazy deadline if none was started): what a back-off step may
    /// sleep at most.
    #[inline]
    pub fn remaining<C: Clock + ?Sized>(&mut self, clock: &C) -> Duration {
        self.deadline(clock).remaining(clock)
    }

    /// Whether the deadline has passed, reading the clock now (for a last check after the
    /// loop, or a loop whose turns are rare and long).
    #[inline]
    pub fn passed<C: Clock + ?Sized>(&mut self, clock: &C) -> bool {
        self.deadline(clock).passed(clock)
    }

    /// Turns counted so far (wrapping).
    #[inline]
    pub fn turns(&self) -> u32 {
        self.turns
    }

    #[inline]
    fn deadline<C: Clock + ?Sized>(&mut self, clock: &C) -> Deadline {
        let timeout = self.timeout;
        *self
            .deadline
            .get_or_insert_with(|| Deadline::after(clock, timeout))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::poll::StepClock;

    #[test]
    fn the_deadline_is_read_every_check_every_turns_whatever_the_turns_did() {
        let clock = StepClock::new(Duration::from_millis(1));
        let mut p = Patience::until(Deadline::after(&clock, Duration::from_millis(5)));
        let mut turns = 0u32;
        while !p.run_out(&clock) {
            turns += 1;
            assert!(turns < 1000, "never ran out");
        }
        // The clock is read on turns 16, 32, ...; each read advances it 1 ms: the sixth read
        // (turn 96) is the first at or past 5 ms after the start.
        assert_eq!(p.turns() % CHECK_EVERY, 0);
        assert!(p.turns() <= 6 * CHECK_EVERY, "{} turns", p.turns());
    }

    #[test]
    fn a_lazy_wait_reads_no_clock_before_its_check_every_th_turn() {
        let clock = StepClock::new(Duration::from_millis(1));
        let start = clock.now();
        let mut p = Patience::lazy(Duration::from_secs(1));
        for _ in 0..CHECK_EVERY - 1 {
            assert!(!p.run_out(&clock));
        }
        // `now()` above advanced the clock once; nothing else read it.
        assert_eq!(
            clock.now().saturating_duration_since(start),
            Duration::from_millis(1)
        );
    }

    #[test]
    fn the_turn_count_wraps_without_panicking() {
        let clock = StepClock::new(Duration::from_nanos(1));
        let mut p = Patience::lazy(Duration::from_secs(3600));
        p.turns = u32::MAX;
        assert!(!p.run_out(&clock));
        assert_eq!(p.turns(), 0);
    }
}
