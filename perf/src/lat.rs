//! The latency tests, each the loop of its perftest counterpart with rverbs calls in place
//! of the verbs: a post time per iteration, nothing else measured. With `--hw-timestamps`
//! (write, read and atomic latency, which wait for every request) the time per iteration is
//! the device's completion time of the request waited for instead, so the differences are
//! round trips as the device's clock saw them, without the CPU's share.

use std::time::Instant;

use crate::report::LatReport;
use crate::session::{Chan, Session, PATIENCE};
use crate::Res;

/// Nanoseconds since the run started.
struct Stamp(Instant);

impl Stamp {
    fn new() -> Self {
        Self(Instant::now())
    }

    #[inline]
    fn now(&self) -> u64 {
        self.0.elapsed().as_nanos() as u64
    }
}

/// The device's completion time of the request just waited for (`--hw-timestamps`); an
/// error, never a made-up time, if the completion carried none.
fn completion_time(chan: &Chan, iteration: u64) -> Res<u64> {
    chan.provider()
        .send_cq()
        .last_timestamp()
        .map(|t| t.get())
        .ok_or_else(|| {
            format!("iteration {iteration}: the device reported no completion timestamp").into()
        })
}

/// `ib_write_lat`: both sides write `size` bytes into the other's buffer, the last byte
/// carrying the iteration number (mod 256), and spin on the last byte of their own buffer
/// until the peer's write of the same number lands. The server writes first. Every write is
/// signaled and its completion polled after the spin, as perftest polls it. Inline when
/// `size` fits `-I`.
pub(crate) fn write_lat(s: &mut Session) -> Res<Option<LatReport>> {
    let (size, iters) = (s.plan.size, s.plan.iters);
    let target = s.target()?;
    let inline = s.inline();
    let last = size - 1;
    let watch = s.half + last;
    let mut payload = vec![0u8; size];
    let mut posted = Vec::with_capacity(iters as usize);
    let server = s.server;
    let hw = s.plan.hw_timestamps;
    let sge = [s.mem.sge(0..size).ok_or("buffer too small")?];
    let chan = s.chan.as_mut().ok_or("no channel")?;
    let clock = Stamp::new();
    let (mut scnt, mut rcnt, mut ccnt) = (0u64, 0u64, 0u64);
    while scnt < iters || rcnt < iters || ccnt < iters {
        if rcnt < iters && !(scnt == 0 && server) {
            rcnt += 1;
            spin_for(&s.mem, watch, rcnt as u8, rcnt)?;
        }
        if scnt < iters {
            if !hw {
                posted.push(clock.now());
            }
            scnt += 1;
            let t = if inline {
                payload[last] = scnt as u8;
                chan.post_write_inline(&payload, target)?
            } else {
                s.mem.write_from(last, &[scnt as u8]);
                // SAFETY: the source bytes stay registered and unwritten until the wait just
                // below returned for this ticket (the next iteration writes them again only
                // after it).
                unsafe { chan.post_write(&sge, target) }?
            };
            chan.wait(t)?;
            if hw {
                posted.push(completion_time(chan, scnt)?);
            }
            ccnt += 1;
        }
    }
    Ok(LatReport::from_posts(size, &posted, 2))
}

/// Spins until the byte at `offset` of `mem` reads `value`, at most [`PATIENCE`]. No
/// spin-wait hint between reads: perftest's loop has none, and under emulation `pause`
/// alone adds about 0.14 us to every round trip.
fn spin_for(
    mem: &rverbs_core::verbs::SharedRegion<'_>,
    offset: usize,
    value: u8,
    iteration: u64,
) -> Res<()> {
    let mut spins = 0u32;
    let mut start = None;
    while mem.load_u8(offset) != Some(value) {
        spins = spins.wrapping_add(1);
        if spins.is_multiple_of(1 << 16) {
            let t0 = *start.get_or_insert_with(Instant::now);
            if t0.elapsed() > PATIENCE {
                return Err(format!(
                    "iteration {iteration}: the peer's write did not arrive within {PATIENCE:?}"
                )
                .into());
            }
        }
    }
    Ok(())
}

/// `ib_send_lat`: a send/receive ping-pong. Each side keeps `-r` receives posted (a
/// [`RecvRing`](rverbs_core::channel::RecvRing), which re-posts each slot after its message was read); the client sends
/// first; each side sends after it received. Sends are signaled every `-Q` and that
/// completion is waited for, as perftest polls it. Inline when `size` fits `-I`.
pub(crate) fn send_lat(s: &mut Session) -> Res<Option<LatReport>> {
    let (size, iters) = (s.plan.size, s.plan.iters);
    let inline = s.inline();
    let payload = vec![7u8; size];
    let mut ring = s.take_ring()?;
    // The peer's receives must be posted before the first send.
    s.sync()?;
    let sge = [s.mem.sge(0..size).ok_or("buffer too small")?];
    let client = !s.server;
    let q = u64::from(s.plan.cq_mod);
    let mut posted = Vec::with_capacity(iters as usize);
    let clock = Stamp::new();
    let (mut scnt, mut rcnt) = (0u64, 0u64);
    while scnt < iters || rcnt < iters {
        if rcnt < iters && !(scnt == 0 && client) {
            let m = ring.recv()?;
            if m.data.len() != size {
                return Err(
                    format!("message {rcnt}: {} bytes, expected {size}", m.data.len()).into(),
                );
            }
            rcnt += 1;
        }
        if scnt < iters {
            posted.push(clock.now());
            scnt += 1;
            let chan = ring.channel();
            let t = if inline {
                chan.post_send_inline(&payload)?
            } else {
                // SAFETY: the source bytes stay registered and are never written during the
                // run; the last send is waited for (so every send before it completed) before
                // they are freed.
                unsafe { chan.post_send(&sge) }?
            };
            // As perftest polls: every -Q-th send, and the last.
            if scnt.is_multiple_of(q) || scnt == iters {
                chan.wait(t)?;
            }
        }
    }
    // Every send was waited for (the last one above). The ring's receives stay posted: it
    // drains them when it is dropped, before its memory goes.
    drop(ring);
    Ok(LatReport::from_posts(size, &posted, 2))
}

/// `ib_read_lat`: the client reads `size` bytes of the server's buffer, one read at a
/// time, each waited for; the full round trip. The server only waits.
pub(crate) fn read_lat(s: &mut Session) -> Res<Option<LatReport>> {
    if s.server {
        return Ok(None);
    }
    let (size, iters) = (s.plan.size, s.plan.iters);
    let target = s.target()?;
    let mut posted = Vec::with_capacity(iters as usize);
    let chan = s.chan.as_mut().ok_or("no channel")?;
    let mut sge = [s.mem.sge_mut(0..size).ok_or("buffer too small")?];
    let clock = Stamp::new();
    let hw = s.plan.hw_timestamps;
    for i in 0..iters {
        if !hw {
            posted.push(clock.now());
        }
        chan.read(&mut sge, target)?;
        if hw {
            posted.push(completion_time(chan, i + 1)?);
        }
    }
    Ok(LatReport::from_posts(size, &posted, 1))
}

/// `ib_atomic_lat` (fetch-and-add): the client adds 1 to the first 8 bytes of the server's
/// buffer, one atomic at a time, each waited for; the full round trip. The server checks
/// the word afterwards.
pub(crate) fn atomic_lat(s: &mut Session) -> Res<Option<LatReport>> {
    let iters = s.plan.iters;
    if s.server {
        // After the client's last atomic, the word holds their count.
        s.sync()?;
        let word = s.mem.load_u64(s.half).ok_or("buffer too small")?;
        if word != iters {
            return Err(format!("the word is {word} after {iters} fetch-and-adds").into());
        }
        return Ok(None);
    }
    let target = s
        .target()?
        .slice(0, 8)
        .ok_or("the peer's buffer is too small")?;
    let mut posted = Vec::with_capacity(iters as usize);
    let chan = s.chan.as_mut().ok_or("no channel")?;
    let mut result = s.mem.sge_mut(0..8).ok_or("buffer too small")?;
    let clock = Stamp::new();
    let hw = s.plan.hw_timestamps;
    for i in 0..iters {
        if !hw {
            posted.push(clock.now());
        }
        chan.fetch_add(&mut result, target, 1)?;
        if hw {
            posted.push(completion_time(chan, i + 1)?);
        }
    }
    s.sync()?;
    Ok(LatReport::from_posts(8, &posted, 1))
}
