//! Busy-polling: caller-supplied clocks, back-off policies and spin-with-deadline helpers.

pub mod backoff;
pub mod clock;
pub(crate) mod drain;
pub mod patience;

pub use backoff::{Backoff, Busy, Spin, SpinThen, Wakeup};
#[cfg(target_has_atomic = "64")]
pub use clock::StepClock;
pub use clock::{Clock, Deadline, Instant, StaticClock};
pub use patience::{Patience, CHECK_EVERY};
