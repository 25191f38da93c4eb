//! perftest's statistics, computed the way perftest computes them, and its columns.
//!
//! Latency: the times between consecutive posts (`tposted[i + 1] - tposted[i]`), divided by
//! 2 for write and send (a ping-pong's round trip is two one-way trips) and by 1 for read
//! and atomics (one request is the whole round trip), sorted, the two largest dropped.
//! Bandwidth: the time from the first post to the last completion (average), and the best
//! time per message over any window from a post to a later completion (peak).

use serde::Serialize;

/// Samples perftest drops from the top of a latency run before its statistics.
const TAIL: usize = 2;

/// The latency columns of perftest (`t_min` .. `99.9%`), in microseconds.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub(crate) struct LatReport {
    /// Bytes per message.
    pub(crate) bytes: usize,
    /// Iterations run.
    pub(crate) iterations: u64,
    pub(crate) t_min: f64,
    pub(crate) t_max: f64,
    /// The median.
    pub(crate) t_typical: f64,
    pub(crate) t_avg: f64,
    pub(crate) t_stdev: f64,
    pub(crate) p99: f64,
    pub(crate) p99_9: f64,
}

impl LatReport {
    /// The statistics of a run whose posts happened at `posted` (nanoseconds, one per
    /// iteration), each delta divided by `rtt_factor`. `None` with fewer than 4 posts.
    pub(crate) fn from_posts(bytes: usize, posted: &[u64], rtt_factor: u32) -> Option<Self> {
        if posted.len() < TAIL + 2 {
            return None;
        }
        let f = f64::from(rtt_factor) * 1000.0;
        let mut d: Vec<u64> = posted.windows(2).map(|w| w[1] - w[0]).collect();
        d.sort_unstable();
        let n = d.len() - TAIL;
        let us = |x: u64| x as f64 / f;
        // perftest's median of the kept samples (it averages the middle two of an even count).
        let median = if (n - 1) % 2 == 1 {
            (d[n / 2] + d[n / 2 - 1]) / 2
        } else {
            d[n / 2]
        };
        let avg = d[..n].iter().map(|&x| us(x)).sum::<f64>() / n as f64;
        let var = d[..n].iter().map(|&x| (us(x) - avg).powi(2)).sum::<f64>() / n as f64;
        let at = |q: f64| d[((n as f64 * q).ceil() as usize).min(d.len() - 1)];
        Some(Self {
            bytes,
            iterations: posted.len() as u64,
            t_min: us(d[0]),
            // perftest reads its maximum one past the kept samples.
            t_max: us(d[n]),
            t_typical: us(median),
            t_avg: avg,
            t_stdev: var.sqrt(),
            p99: us(at(0.99)),
            p99_9: us(at(0.999)),
        })
    }

    /// perftest's header line.
    pub(crate) fn header() -> &'static str {
        " #bytes #iterations    t_min[usec]    t_max[usec]  t_typical[usec]    t_avg[usec]    t_stdev[usec]   99% percentile[usec]   99.9% percentile[usec]"
    }

    /// The result line under [`LatReport::header`].
    pub(crate) fn line(&self) -> String {
        format!(
            " {:<7} {:<10}   {:<14.2} {:<12.2} {:<16.2} {:<14.2} {:<15.2} {:<22.2} {:.2}",
            self.bytes,
            self.iterations,
            self.t_min,
            self.t_max,
            self.t_typical,
            self.t_avg,
            self.t_stdev,
            self.p99,
            self.p99_9
        )
    }
}

/// The bandwidth columns of perftest.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub(crate) struct BwReport {
    /// Bytes per message.
    pub(crate) bytes: usize,
    /// Messages.
    pub(crate) iterations: u64,
    /// MiB/s over the best window.
    pub(crate) bw_peak: f64,
    /// MiB/s from the first post to the last completion.
    pub(crate) bw_average: f64,
    /// Millions of messages per second, from the first post to the last completion.
    pub(crate) msg_rate: f64,
}

/// When each request of a bandwidth run was posted and seen complete (nanoseconds).
#[derive(Debug)]
pub(crate) struct BwTimes {
    /// Post time of each request (the requests of one post share it).
    pub(crate) posted: Vec<u64>,
    /// The time each request was seen complete (a poll that retired it).
    pub(crate) completed: Vec<u64>,
    /// The index of the last request each retiring poll retired, in order.
    pub(crate) events: Vec<usize>,
}

impl BwTimes {
    /// Room for `n` requests (allocated before the run).
    pub(crate) fn with_capacity(n: usize) -> Self {
        Self {
            posted: Vec::with_capacity(n),
            completed: Vec::with_capacity(n),
            events: Vec::with_capacity(n),
        }
    }

    /// Records that every request up to (not including) `done` was seen complete at `now`.
    #[inline]
    pub(crate) fn complete_to(&mut self, done: usize, now: u64) {
        if done > self.completed.len() {
            self.completed.resize(done, now);
            self.events.push(done - 1);
        }
    }
}

/// Above this many (post, completion) pairs the peak is not computed (perftest's method is
/// quadratic); it is then reported as 0, as perftest does without a peak.
const PEAK_WORK_LIMIT: usize = 200_000_000;

impl BwReport {
    /// perftest's report for `times` of messages of `bytes`, posted `post_list` at a time.
    pub(crate) fn from_times(bytes: usize, times: &BwTimes, post_list: usize) -> Option<Self> {
        let n = times.posted.len();
        if n == 0 || times.completed.len() != n {
            return None;
        }
        let total_ns = times.completed[n - 1].saturating_sub(times.posted[0]);
        let mib = (1u64 << 20) as f64;
        let step = post_list.max(1);
        let mut best = f64::INFINITY;
        if (n / step).saturating_mul(times.events.len()) <= PEAK_WORK_LIMIT {
            for i in (0..n).step_by(step) {
                let first = times.events.partition_point(|&j| j < i);
                for &j in &times.events[first..] {
                    let t = times.completed[j].saturating_sub(times.posted[i]) as f64
                        / (j - i + 1) as f64;
                    best = best.min(t);
                }
            }
        }
        let bw_peak = if best.is_finite() && best > 0.0 {
            bytes as f64 / mib / (best * 1e-9)
        } else {
            0.0
        };
        Some(Self {
            bw_peak,
            ..Self::whole_run(bytes, n, total_ns)?
        })
    }

    /// perftest's report without a peak (its `-N`): `n` messages of `bytes` in `total_ns`
    /// from before the first post to after the last completion; the peak is 0, as perftest
    /// prints it then. `None` for no messages.
    pub(crate) fn whole_run(bytes: usize, n: usize, total_ns: u64) -> Option<Self> {
        if n == 0 {
            return None;
        }
        let secs = total_ns.max(1) as f64 * 1e-9;
        Some(Self {
            bytes,
            iterations: n as u64,
            bw_peak: 0.0,
            bw_average: (bytes * n) as f64 / (1u64 << 20) as f64 / secs,
            msg_rate: n as f64 / secs / 1e6,
        })
    }

    /// perftest's header line.
    pub(crate) fn header() -> &'static str {
        " #bytes     #iterations    BW peak[MiB/sec]    BW average[MiB/sec]   MsgRate[Mpps]"
    }

    /// The result line under [`BwReport::header`].
    pub(crate) fn line(&self) -> String {
        format!(
            " {:<7}    {:<10}       {:<7.2}            {:<7.2}               {:.6}",
            self.bytes, self.iterations, self.bw_peak, self.bw_average, self.msg_rate
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn latency_is_perftests_statistics_of_post_deltas() {
        // Deltas 10, 20, ..., 100 ns (10 of them), then two outliers of 1000 ns that perftest
        // drops; write halves every delta.
        let mut posted = vec![0u64];
        for d in (1..=10).map(|i| i * 10).chain([1000, 1000]) {
            posted.push(posted.last().unwrap() + d);
        }
        let r = LatReport::from_posts(8, &posted, 2).unwrap();
        assert_eq!(r.iterations, 13);
        assert!((r.t_min - 0.005).abs() < 1e-9, "{r:?}");
        // Ten kept samples: the median averages the 5th and 6th (50 and 60 ns), halved.
        assert!((r.t_typical - 0.0275).abs() < 1e-9, "{r:?}");
        assert!((r.t_avg - 0.0275).abs() < 1e-9, "{r:?}");
        // One past the kept samples: the first dropped outlier.
        assert!((r.t_max - 0.5).abs() < 1e-9, "{r:?}");
        // The population standard deviation of 5, 10, ..., 50 ns.
        let expect = ((1..=10)
            .map(|i| (5.0 * i as f64 - 27.5).powi(2))
            .sum::<f64>()
            / 10.0)
            .sqrt()
            / 1000.0;
        assert!((r.t_stdev - expect).abs() < 1e-9, "{r:?}");
        // Read does not halve.
        let full = LatReport::from_posts(8, &posted, 1).unwrap();
        assert!((full.t_typical - 2.0 * r.t_typical).abs() < 1e-9);
        assert!(LatReport::from_posts(8, &posted[..3], 1).is_none());
    }

    #[test]
    fn bandwidth_average_and_peak() {
        // 4 requests of 1 MiB posted 2 at a time at 0 and 10 ns; the first pair seen complete
        // at 20, the second only at 200.
        let mut t = BwTimes::with_capacity(4);
        t.posted.extend([0, 0, 10, 10]);
        t.complete_to(2, 20);
        t.complete_to(2, 30); // nothing new: no event
        t.complete_to(4, 200);
        assert_eq!(t.completed, [20, 20, 200, 200]);
        assert_eq!(t.events, [1, 3]);
        let r = BwReport::from_times(1 << 20, &t, 2).unwrap();
        // 4 MiB in 200 ns.
        assert!(
            (r.bw_average - 4.0 / 200e-9).abs() / r.bw_average < 1e-9,
            "{r:?}"
        );
        assert!((r.msg_rate - 4.0 / 200e-9 / 1e6).abs() / r.msg_rate < 1e-9);
        // Best window: the first pair, 20 ns for 2 messages = 10 ns each.
        assert!((r.bw_peak - 1.0 / 10e-9).abs() / r.bw_peak < 1e-9, "{r:?}");
        // The same run timed whole, as perftest's -N: the same average, no peak.
        let w = BwReport::whole_run(1 << 20, 4, 200).unwrap();
        assert_eq!((w.bw_average, w.msg_rate), (r.bw_average, r.msg_rate));
        assert_eq!(w.bw_peak, 0.0);
        assert!(BwReport::whole_run(64, 0, 200).is_none());
    }
}
