//! The bandwidth tests (`ib_write_bw`, `ib_send_bw`, `ib_read_bw`): the client keeps at
//! most `-t` requests outstanding, posts `-l` of them per doorbell (one [`Batch`]), lets the
//! channel signal every `-Q`-th, and stamps each request when it was posted and when a poll
//! first saw it retired. The server of a write or read test only waits; the server of a
//! send test receives every message through a ring of `-r` receives.
//!
//! [`Batch`]: rverbs_core::channel::Batch

use std::time::Instant;

use rverbs_core::sge::SgeMut;
use rverbs_core::wr::MAX_BATCH;

use crate::report::{BwReport, BwTimes};
use crate::session::{Chan, Session, PATIENCE};
use crate::{Res, Test};

/// Runs the bandwidth test of the session; the client's report.
pub(crate) fn run(s: &mut Session) -> Res<Option<BwReport>> {
    let test = s.plan.test;
    if test == Test::SendBw {
        return send_bw(s);
    }
    if s.server {
        return Ok(None);
    }
    stream(s, test).map(Some)
}

fn send_bw(s: &mut Session) -> Res<Option<BwReport>> {
    let (size, iters) = (s.plan.size, s.plan.iters);
    if !s.server {
        // The server posts its receives first.
        s.sync()?;
        return stream(s, Test::SendBw).map(Some);
    }
    let mut ring = s.take_ring()?;
    s.sync()?;
    for i in 0..iters {
        let m = ring.recv()?;
        if m.data.len() != size {
            return Err(format!("message {i}: {} bytes, expected {size}", m.data.len()).into());
        }
    }
    drop(ring);
    Ok(None)
}

/// The client's stream of writes, sends or reads.
fn stream(s: &mut Session, test: Test) -> Res<BwReport> {
    let p = s.plan;
    let (size, n, l, tx) = (
        p.size,
        p.iters as usize,
        p.post_list as usize,
        u64::from(p.tx_depth),
    );
    let target = s.target()?;
    let inline = s.inline() && test != Test::ReadBw;
    let payload = vec![7u8; size];
    let sge = [s.mem.sge(0..size).ok_or("buffer too small")?];
    // Reads of one post land in distinct slices of our half (the device writes them).
    let stride = size.div_ceil(64) * 64;
    let (base, lkey) = (s.mem.remote().addr, s.mem.lkey());
    if stride * l > s.half {
        return Err("buffer too small for the post list".into());
    }
    let chan = s.chan.as_mut().ok_or("no channel")?;
    // One post of `l` requests; `last` asks for the last one's completion, as perftest
    // signals its last request.
    let post = |chan: &mut Chan, last: bool| -> Res<()> {
        if test == Test::ReadBw {
            let mut reads: [[SgeMut<'_>; 1]; MAX_BATCH] = core::array::from_fn(|i| {
                let at = base + (stride * (i % l)) as u64;
                // SAFETY: `at..at + size` lies in our registered half (checked above), which
                // outlives the run; only the device writes it, and every read is polled
                // before the buffer goes.
                [unsafe { SgeMut::from_raw(at, size as u32, lkey) }]
            });
            let mut b = chan.batch();
            for r in reads[..l].iter_mut() {
                b.read(r, target)?;
            }
            return post_now(&mut b, last);
        }
        let mut b = chan.batch();
        for _ in 0..l {
            match test {
                Test::SendBw if inline => b.send_inline(&payload)?,
                Test::SendBw => b.send(&sge)?,
                _ if inline => b.write_inline(&payload, target)?,
                _ => b.write(&sge, target)?,
            };
        }
        post_now(&mut b, last)
    };
    // Without a peak (perftest's `-N`, on by itself above 20000 iterations) the run is timed
    // as perftest times it then: from before the first post to after the last completion,
    // with no clock read per request.
    let stamps = !p.no_peak;
    let mut times = BwTimes::with_capacity(if stamps { n } else { 0 });
    let start = Instant::now();
    let now = || start.elapsed().as_nanos() as u64;
    let mut posted = 0usize;
    let mut done = 0usize;
    // A run that stops making progress (the peer gone, a device that lost completions) ends
    // with an error after the channel's patience rather than spinning forever.
    let mut stall = Stall::new(PATIENCE.as_nanos() as u64);
    while done < n {
        while posted < n && chan.outstanding_sends() + l as u64 <= tx {
            if stamps {
                let t = now();
                post(chan, posted + l == n)?;
                times.posted.resize(posted + l, t);
            } else {
                post(chan, posted + l == n)?;
            }
            posted += l;
        }
        // The send queue alone, as perftest polls: nothing is received here.
        chan.poll_sends()?;
        // A request that failed (retries exhausted: the peer is gone) breaks the channel and
        // flushes the rest, which then retire too: report it, not a rate.
        if let Some(e) = chan.fault() {
            return Err(e.into());
        }
        let retired = posted - chan.outstanding_sends() as usize;
        if retired > done {
            if stamps {
                // Stamped only when a poll retired something, as perftest stamps completions.
                times.complete_to(retired, now());
            }
            done = retired;
            stall.progress();
            continue;
        }
        if stall.empty_poll(now) {
            return Err(format!(
                "no request completed for {} s ({done} of {n} done): is the peer alive?",
                PATIENCE.as_secs()
            )
            .into());
        }
    }
    let report = if stamps {
        BwReport::from_times(size, &times, l)
    } else {
        BwReport::whole_run(size, n, now())
    };
    report.ok_or_else(|| "no requests ran".into())
}

/// Notices a stream that stopped making progress without reading the clock on the way: the
/// clock is read once per [`Stall::EVERY`] consecutive empty polls, and the stream has
/// stalled when no poll retired anything for `patience` after the first such read.
#[derive(Debug)]
struct Stall {
    /// Consecutive empty polls.
    empty: u32,
    /// When a check first found no progress since the last one (nanoseconds).
    since: Option<u64>,
    patience: u64,
}

impl Stall {
    /// Empty polls between two clock reads: the check costs the loop nothing.
    const EVERY: u32 = 4096;

    fn new(patience: u64) -> Self {
        Self {
            empty: 0,
            since: None,
            patience,
        }
    }

    /// A poll retired something.
    #[inline]
    fn progress(&mut self) {
        self.empty = 0;
        self.since = None;
    }

    /// A poll retired nothing; reads `now` when a check is due. Whether the stream stalled.
    #[inline]
    fn empty_poll(&mut self, now: impl FnOnce() -> u64) -> bool {
        self.empty = self.empty.wrapping_add(1);
        if !self.empty.is_multiple_of(Self::EVERY) {
            return false;
        }
        let t = now();
        match self.since {
            None => {
                self.since = Some(t);
                false
            }
            Some(s) => t.saturating_sub(s) > self.patience,
        }
    }
}

/// Posts a batch (one doorbell), signaling its last request if `last`.
fn post_now(
    b: &mut rverbs_core::channel::Batch<
        '_,
        '_,
        rverbs_core::provider::verbs::VerbsProvider,
        rverbs_core::poll::Busy,
        { crate::session::MAX_RX },
    >,
    last: bool,
) -> Res<()> {
    if last {
        b.signaled();
    }
    // SAFETY: every buffer the requests name lives in our registered region for the whole
    // run and is not written by the CPU; the caller polls until every request completed.
    let _ticket = unsafe { b.post() }?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::Stall;

    #[test]
    fn a_stall_is_seen_only_after_patience_without_progress_and_progress_resets_it() {
        let mut s = Stall::new(1000);
        let mut reads = 0;
        let mut clock = |t: u64| {
            reads += 1;
            t
        };
        // No clock read before EVERY empty polls.
        for _ in 0..Stall::EVERY - 1 {
            assert!(!s.empty_poll(|| clock(0)));
        }
        // The first due check only notes when the waiting began.
        assert!(!s.empty_poll(|| clock(500)));
        for _ in 0..Stall::EVERY - 1 {
            assert!(!s.empty_poll(|| clock(0)));
        }
        // 1000 ns after it: not yet more than the patience.
        assert!(!s.empty_poll(|| clock(1500)));
        // Progress forgets the waiting: the next due check starts it again.
        s.progress();
        for _ in 0..Stall::EVERY - 1 {
            assert!(!s.empty_poll(|| clock(0)));
        }
        assert!(!s.empty_poll(|| clock(10_000)));
        for _ in 0..Stall::EVERY - 1 {
            assert!(!s.empty_poll(|| clock(0)));
        }
        assert!(s.empty_poll(|| clock(11_001)), "1001 ns without progress");
        assert_eq!(reads, 4, "the clock is read once per EVERY empty polls");
    }
}
