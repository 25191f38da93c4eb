//! Progress lines on stderr while an exchange or round waits, so a hung job
//! says whom it is waiting for.

use core::time::Duration;
use std::time::Instant;

use super::round_timer::RoundTimer;

/// Waits shorter than this print nothing.
const LOG_AFTER: Duration = Duration::from_secs(5);
/// At most one progress line per this interval.
const LOG_EVERY: Duration = Duration::from_secs(5);

/// Rate-limited progress lines on stderr.
#[derive(Debug)]
pub(super) struct Progress {
    enabled: bool,
    start: Instant,
    total: Duration,
    last: Option<Instant>,
    last_notice: Option<Instant>,
}

impl Progress {
    pub(super) fn new(enabled: bool, clock: RoundTimer, total: Duration) -> Self {
        Self {
            enabled,
            start: clock.start,
            total,
            last: None,
            last_notice: None,
        }
    }

    pub(super) fn tick(&mut self, what: impl FnOnce() -> String) {
        if let Some(line) = self.line_at(Instant::now(), what) {
            eprintln!("{line}");
        }
    }

    /// The progress line due at `now`, if any, marking it as printed.
    fn line_at(&mut self, now: Instant, what: impl FnOnce() -> String) -> Option<String> {
        if !self.enabled {
            return None;
        }
        let waited = now.saturating_duration_since(self.start);
        if waited < LOG_AFTER
            || self
                .last
                .is_some_and(|last| now.saturating_duration_since(last) < LOG_EVERY)
        {
            return None;
        }
        self.last = Some(now);
        Some(format!(
            "rverbs-bootstrap: {} ({} s of {} s)",
            what(),
            waited.as_secs(),
            self.total.as_secs()
        ))
    }

    pub(super) fn note(&self, line: &str) {
        if self.enabled {
            eprintln!("rverbs-bootstrap: {line}");
        }
    }

    /// Prints a line at once, unless another was printed this way less than
    /// [`LOG_EVERY`] ago: for events that can repeat fast, such as retries.
    pub(super) fn notice(&mut self, line: impl FnOnce() -> String) {
        let now = Instant::now();
        if !self.enabled
            || self
                .last_notice
                .is_some_and(|last| now.saturating_duration_since(last) < LOG_EVERY)
        {
            return;
        }
        self.last_notice = Some(now);
        eprintln!("rverbs-bootstrap: {}", line());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn progress_lines_are_rate_limited() {
        let clock = RoundTimer::start(Duration::from_secs(60));
        let mut progress = Progress::new(true, clock, Duration::from_secs(60));
        let at = |secs| clock.start + Duration::from_secs(secs);
        let what = || "rank 0 waiting for ranks [3, 5]".to_owned();
        assert_eq!(progress.line_at(at(2), what), None);
        assert_eq!(
            progress.line_at(at(12), what).as_deref(),
            Some("rverbs-bootstrap: rank 0 waiting for ranks [3, 5] (12 s of 60 s)")
        );
        assert_eq!(progress.line_at(at(16), what), None);
        assert!(progress.line_at(at(17), what).is_some());
        let mut quiet = Progress::new(false, clock, Duration::from_secs(60));
        assert_eq!(quiet.line_at(at(30), what), None);
    }
}
