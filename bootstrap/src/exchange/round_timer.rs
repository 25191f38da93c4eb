//! The start and deadline of one exchange or round, fixed when it begins.

use core::time::Duration;
use std::time::Instant;

/// Start and deadline of one exchange or round (not a clock: it reads the system's
/// monotonic time, and only says how long is left and how long it has been).
#[derive(Clone, Copy, Debug)]
pub(super) struct RoundTimer {
    pub(super) start: Instant,
    pub(super) deadline: Instant,
}

impl RoundTimer {
    pub(super) fn start(total: Duration) -> Self {
        let start = Instant::now();
        let deadline = start
            .checked_add(total)
            .unwrap_or_else(|| start + Duration::from_secs(365 * 86_400));
        Self { start, deadline }
    }

    pub(super) fn remaining(&self) -> Duration {
        self.deadline.saturating_duration_since(Instant::now())
    }

    pub(super) fn waited(&self) -> Duration {
        self.start.elapsed()
    }
}
