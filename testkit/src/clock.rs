//! Time for tests: the wall clock for channels on a device, a step clock per call site for
//! the software model (where time must advance by itself however fast the test polls), and
//! a back-off that panics.

use std::sync::OnceLock;
use std::time::Instant;

use rverbs_core::poll::Clock;

/// Wall-clock time, counted from the first reading in the process.
#[derive(Debug)]
pub struct Wall;

/// The clock test channels on a device keep.
pub static WALL: Wall = Wall;

impl Clock for Wall {
    fn now(&self) -> rverbs_core::poll::Instant {
        static EPOCH: OnceLock<Instant> = OnceLock::new();
        let since = EPOCH.get_or_init(Instant::now).elapsed();
        rverbs_core::poll::Instant::from_nanos(u64::try_from(since.as_nanos()).unwrap_or(u64::MAX))
    }
}

/// A `StaticClock` of its own for the call site: a `StepClock` that advances by the given
/// step (a const `Duration`; 1 ms when left out) at every reading. Each expansion is a
/// separate static, so tests running side by side do not move each other's time.
///
/// ```
/// use std::time::Duration;
/// let clock = rverbs_testkit::clock!(Duration::from_micros(1));
/// assert!(clock.now() < clock.now());
/// ```
#[macro_export]
macro_rules! clock {
    () => {
        $crate::clock!(::std::time::Duration::from_millis(1))
    };
    ($step:expr) => {{
        static CLOCK: $crate::__core::poll::StepClock = $crate::__core::poll::StepClock::new($step);
        &CLOCK as $crate::__core::poll::StaticClock
    }};
}

/// A back-off that panics after `n` empty polls: caller code that runs inside every wait,
/// for the tests proving a wait that unwinds leaves nothing posted behind.
#[derive(Debug)]
pub struct PanicAfter(pub u32);

impl rverbs_core::poll::Backoff for PanicAfter {
    fn snooze(&mut self) {
        self.0 = self.0.saturating_sub(1);
        assert!(self.0 > 0, "the caller's back-off panics");
    }
    fn reset(&mut self) {}
}
