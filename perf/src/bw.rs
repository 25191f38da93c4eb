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
    let mut times = BwTimes::with_capacity(n);
    let start = Instant::now();
    let now = || start.elapsed().as_nanos() as u64;
    let mut posted = 0usize;
    let mut done = 0usize;
    // A run that stops making progress (the peer gone, a device that lost completions) ends
    // with an error after the channel's patience rather than spinning forever. The clock is
    // read for it once per 4096 empty polls, so the check costs the loop nothing.
    let patience = PATIENCE.as_nanos() as u64;
    let mut last_progress = now();
    let mut empty = 0u32;
    while done < n {
        while posted < n && chan.outstanding_sends() + l as u64 <= tx {
            let t = now();
            post(chan, posted + l == n)?;
            times.posted.resize(posted + l, t);
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
            // Stamped only when a poll retired something, as perftest stamps completions.
            let t = now();
            times.complete_to(retired, t);
            done = retired;
            empty = 0;
            last_progress = t;
            continue;
        }
        empty = empty.wrapping_add(1);
        if empty.is_multiple_of(4096) && now() - last_progress > patience {
            return Err(format!(
                "no request completed for {} s ({done} of {n} done): is the peer alive?",
                PATIENCE.as_secs()
            )
            .into());
        }
    }
    BwReport::from_times(size, &times, l).ok_or_else(|| "no requests ran".into())
}

/// Posts a batch (one doorbell), signaling its last request if `last`.
fn post_now(
    b: &mut rverbs_core::channel::Batch<
        '_,
        '_,
        rverbs_core::provider::verbs::VerbsProvider,
        rverbs_core::poll::Spin,
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
