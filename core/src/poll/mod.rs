//! Busy-polling: caller-supplied clocks, back-off policies and spin-with-deadline helpers.

pub mod backoff;
pub mod clock;

pub use backoff::{Backoff, Spin, SpinThen};
pub use clock::{Clock, Deadline, Instant};
