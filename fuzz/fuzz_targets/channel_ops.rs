//! The posting engine ([`Channel`]) under arbitrary sequences of operations, over the
//! in-memory RC model: two channels on one `SoftFabric`, side A with only 4 receive slots so
//! the slot table wraps, side B with the default 64.
//!
//! Every operation's outcome is predicted from the model's documented semantics and checked:
//! - nothing panics, in the engine or the model;
//! - an operation succeeds exactly when the prediction says so, and a successful write, read
//!   or send leaves exactly the bytes a shadow copy of both regions says (checked after every
//!   operation, for all four regions);
//! - a failure that reached the queue pair leaves the channel broken, and its first failure
//!   never changes afterwards; every later operation on it fails;
//! - `outstanding_sends()` never exceeds the queue depth, no receive is left outstanding
//!   between operations, and `wait_all` leaves nothing outstanding.
//!
//! Operations never wait for something that cannot happen: two-sided traffic is arranged so
//! a receive is always matched or flushed (the peer is killed if it cannot be matched), and
//! lone receives use `recv_timeout` on a clock that advances on every read.
//!
//! One file of about 930 lines on purpose: the operations and the oracle that predicts them
//! share one state (the shadow memory, the tickets, the failures seen); cut apart, neither
//! half reads without the other.
#![no_main]

use std::ops::Range;
use std::time::Duration;

use libfuzzer_sys::fuzz_target;
use rverbs_core::channel::{Channel, ChannelConfig, ChannelError, Ticket};
use rverbs_core::memory::AccessFlags;
use rverbs_core::model::{Side, SoftEnd, SoftFabric, SoftRegion};
use rverbs_core::params::{QpCaps, RetryCount, RnrRetry};
use rverbs_core::poll::{Spin, StepClock};
use rverbs_core::sge::{RemoteMemory, Sge, SgeMut};

/// Bytes of each registered region.
const LEN: usize = 64;
/// Inline limit the queue pairs are created with (the model's maximum).
const INLINE: usize = 64;
/// Operations per input, so every input runs in bounded time.
const MAX_OPS: usize = 96;

const RW: AccessFlags = AccessFlags::LOCAL_WRITE
    .union(AccessFlags::REMOTE_WRITE)
    .union(AccessFlags::REMOTE_READ);

type Chan<'f, const R: usize> = Channel<SoftEnd<'f>, Spin, R>;

/// Reads input bytes; past the end it yields zeros (and says so through `done`).
struct Input<'a> {
    data: &'a [u8],
    pos: usize,
}

impl<'a> Input<'a> {
    fn done(&self) -> bool {
        self.pos >= self.data.len()
    }

    fn byte(&mut self) -> u8 {
        let b = self.data.get(self.pos).copied().unwrap_or(0);
        self.pos += 1;
        b
    }

    /// Up to `n` bytes (fewer at the end of the input).
    fn take(&mut self, n: usize) -> &'a [u8] {
        let start = self.pos.min(self.data.len());
        let end = (start + n).min(self.data.len());
        self.pos = start + n;
        &self.data[start..end]
    }
}

/// A clock that moves 1 ms every time it is read (the target runs on one thread).
static CLOCK: StepClock = StepClock::new(Duration::from_millis(1));

fn side(i: usize) -> Side {
    if i == 0 {
        Side::A
    } else {
        Side::B
    }
}

/// Bytes the source region of side `i` holds for the whole run (distinct per side and
/// offset, so a misplaced copy shows).
fn src_pattern(i: usize) -> [u8; LEN] {
    core::array::from_fn(|k| {
        (k as u8)
            .wrapping_mul(7 + 6 * i as u8)
            .wrapping_add(1 + 0x80 * i as u8)
    })
}

/// Errors the engine reports before posting anything; they do not break the channel.
fn is_validation(e: &ChannelError) -> bool {
    matches!(
        e,
        ChannelError::InlineTooLarge { .. }
            | ChannelError::TooManySges { .. }
            | ChannelError::BatchFull { .. }
            | ChannelError::RecvQueueFull
    )
}

struct World<'f, 'm> {
    fabric: &'f SoftFabric<'m>,
    /// Per side: the region peers write, read and send into.
    mem: [SoftRegion<'f>; 2],
    /// Per side: the gather source of writes and sends, never written.
    src: [SoftRegion<'f>; 2],
    shadow: [[u8; LEN]; 2],
    depth: u64,
    /// Per side: tickets of unsafely submitted batches, with whether they should succeed.
    tickets: [Vec<(Ticket, bool)>; 2],
    /// Per side: the failure each channel reported after the last operation.
    failure: [Option<ChannelError>; 2],
}

impl World<'_, '_> {
    fn healthy(&self) -> bool {
        !self.fabric.in_error(Side::A) && !self.fabric.in_error(Side::B)
    }

    /// A remote descriptor for `x`'s memory, `len` bytes, chosen by two input bytes; and
    /// whether the model will accept it for a transfer of `len` bytes (zero-length transfers
    /// are never checked).
    fn remote(&self, x: usize, len: usize, inp: &mut Input<'_>) -> (RemoteMemory, bool) {
        let (k, o) = (inp.byte(), inp.byte());
        let target = &self.mem[x];
        let (rkey, key_ok) = match k % 8 {
            0..=4 => (target.rkey(), true),
            5 => (self.src[x].rkey(), false), // no remote access
            6 => (self.mem[1 - x].rkey(), false), // the other side's key
            _ => (target.lkey(), false),      // an lkey is no rkey
        };
        let base = target.remote().addr;
        if o == 0xff {
            let addr = u64::MAX - 3;
            return (
                RemoteMemory {
                    addr,
                    len: len as u64,
                    rkey,
                },
                len == 0,
            );
        }
        let off = i64::from(o % 96) - 8;
        let in_bounds = off >= 0 && off as usize + len <= LEN;
        let addr = base.wrapping_add_signed(off);
        let r = RemoteMemory {
            addr,
            len: len as u64,
            rkey,
        };
        (r, len == 0 || (key_ok && in_bounds))
    }

    /// Offset into the peer memory a valid remote descriptor names.
    fn remote_offset(&self, x: usize, r: &RemoteMemory) -> usize {
        (r.addr - self.mem[x].remote().addr) as usize
    }

    /// Up to two gather entries from `y`'s source region (maybe with a bad lkey), the bytes
    /// they name, and whether they resolve.
    fn gather<'r>(&'r self, y: usize, inp: &mut Input<'_>) -> (Vec<Sge<'r>>, Vec<u8>, bool) {
        let n = 1 + (inp.byte() % 2) as usize;
        let src = &self.src[y];
        let pattern = src_pattern(y);
        let mut sges = Vec::new();
        let mut bytes = Vec::new();
        let mut ok = true;
        for _ in 0..n {
            let (l, o) = (inp.byte(), inp.byte());
            let len = (l % 33) as usize;
            let off = o as usize % (LEN - len + 1);
            let e = src.sge(off..off + len).expect("in bounds by construction");
            if l >= 0xf0 {
                // SAFETY: the entry names live memory of the source region; with a key that
                // resolves to no region the model never touches it.
                sges.push(unsafe { Sge::from_raw(e.addr(), e.len(), e.lkey() ^ 0x5a5a_5a5a) });
                ok &= len == 0;
            } else {
                sges.push(e);
            }
            bytes.extend_from_slice(&pattern[off..off + len]);
        }
        (sges, bytes, ok)
    }

    fn apply(&mut self, x: usize, off: usize, bytes: &[u8]) {
        self.shadow[x][off..off + bytes.len()].copy_from_slice(bytes);
    }
}

/// After an operation: regions match their shadows, queue accounting holds, failures stick.
fn check<const RA: usize, const RB: usize>(
    w: &mut World<'_, '_>,
    a: &Chan<'_, RA>,
    b: &Chan<'_, RB>,
) {
    for i in 0..2 {
        let mut got = [0u8; LEN];
        assert!(w.mem[i].read_into(0, &mut got));
        assert_eq!(
            got, w.shadow[i],
            "memory of side {i} differs from its shadow"
        );
        assert!(w.src[i].read_into(0, &mut got));
        assert_eq!(got, src_pattern(i), "source region of side {i} was written");
    }
    let now = [
        (a.fault(), a.outstanding_sends(), a.outstanding_recvs()),
        (b.fault(), b.outstanding_sends(), b.outstanding_recvs()),
    ];
    for (i, (failure, sends, recvs)) in now.into_iter().enumerate() {
        assert!(
            sends <= w.depth,
            "side {i}: {sends} sends outstanding, depth {}",
            w.depth
        );
        assert_eq!(
            recvs, 0,
            "side {i}: receives left outstanding between operations"
        );
        if let Some(before) = w.failure[i] {
            assert_eq!(failure, Some(before), "side {i}: the first failure changed");
        }
        w.failure[i] = failure;
    }
}

/// Checks the result of an operation on channel `y` against the prediction.
fn expect<T: core::fmt::Debug>(
    what: &str,
    broken_before: bool,
    predicted_ok: bool,
    r: &Result<T, ChannelError>,
    broken_after: bool,
) {
    if broken_before {
        assert!(r.is_err(), "{what} on a broken channel returned {r:?}");
    }
    assert_eq!(
        r.is_ok(),
        predicted_ok,
        "{what}: predicted ok={predicted_ok}, got {r:?}"
    );
    if let Err(e) = r {
        if !is_validation(e) {
            assert!(
                broken_after,
                "{what} failed with {e:?} but the channel is not broken"
            );
        }
    }
}

fn op_write<const RY: usize>(
    w: &mut World<'_, '_>,
    y: usize,
    ch: &mut Chan<'_, RY>,
    inp: &mut Input<'_>,
) {
    let x = 1 - y;
    let broken = ch.fault().is_some();
    let healthy = w.healthy();
    let (sges, bytes, local_ok) = w.gather(y, inp);
    let (remote, remote_ok) = w.remote(x, bytes.len(), inp);
    let ok = !broken && healthy && local_ok && remote_ok;
    let off = if ok && !bytes.is_empty() {
        w.remote_offset(x, &remote)
    } else {
        0
    };
    let r = ch.write(&sges, remote);
    drop(sges);
    expect("write", broken, ok, &r, ch.fault().is_some());
    if ok {
        w.apply(x, off, &bytes);
    }
}

fn op_read<const RY: usize>(
    w: &mut World<'_, '_>,
    y: usize,
    ch: &mut Chan<'_, RY>,
    inp: &mut Input<'_>,
) {
    let x = 1 - y;
    let broken = ch.fault().is_some();
    let healthy = w.healthy();
    let (l, d) = (inp.byte(), inp.byte());
    let len = (l % 40) as usize;
    let dst = d as usize % (LEN - len + 1);
    let (remote, remote_ok) = w.remote(x, len, inp);
    let ok = !broken && healthy && remote_ok;
    let off = if ok && len > 0 {
        w.remote_offset(x, &remote)
    } else {
        0
    };
    let r = {
        let mut s = [w.mem[y].sge_mut(dst..dst + len).expect("in bounds")];
        ch.read(&mut s, remote)
    };
    expect("read", broken, ok, &r, ch.fault().is_some());
    if ok {
        let got: Vec<u8> = w.shadow[x][off..off + len].to_vec();
        w.apply(y, dst, &got);
    }
}

fn op_write_inline<const RY: usize>(
    w: &mut World<'_, '_>,
    y: usize,
    ch: &mut Chan<'_, RY>,
    inp: &mut Input<'_>,
) {
    let x = 1 - y;
    let broken = ch.fault().is_some();
    let healthy = w.healthy();
    let l = inp.byte();
    let nowait = l & 0x80 != 0;
    let data = inp.take((l & 0x7f) as usize % (INLINE + 9));
    let (remote, remote_ok) = w.remote(x, data.len(), inp);
    let fits = data.len() <= INLINE;
    let ok = !broken && healthy && remote_ok && fits;
    let off = if ok && !data.is_empty() {
        w.remote_offset(x, &remote)
    } else {
        0
    };
    if nowait {
        let r = ch.post_write_inline(data, remote);
        if broken || !fits {
            assert!(
                r.is_err(),
                "write_inline_nowait: expected an error, got {r:?}"
            );
        }
        // Making room in the send queue may poll an earlier failure first.
        if let Err(e) = &r {
            assert!(
                broken || !healthy || is_validation(e),
                "write_inline_nowait: {e:?} on a healthy channel"
            );
        }
        // The model runs the write inside the post, so its effect is known now; a failure
        // surfaces on a later call.
        if r.is_ok() && ok {
            w.apply(x, off, data);
        }
    } else {
        let r = ch.write_inline(data, remote);
        expect("write_inline", broken, ok, &r, ch.fault().is_some());
        if ok {
            w.apply(x, off, data);
        }
    }
}

/// A send with no receive posted at the peer: it must fail (RNR, or no answer).
fn op_send_inline<const RY: usize>(
    _w: &mut World<'_, '_>,
    _y: usize,
    ch: &mut Chan<'_, RY>,
    inp: &mut Input<'_>,
) {
    let broken = ch.fault().is_some();
    let l = inp.byte();
    let data = inp.take(l as usize % (INLINE + 9));
    let r = ch.send_inline(data);
    expect(
        "send_inline without a receive",
        broken,
        false,
        &r,
        ch.fault().is_some(),
    );
}

enum Item<'r> {
    Gather(Vec<Sge<'r>>),
    Inline(&'r [u8]),
}

fn op_batch<const RY: usize>(
    w: &mut World<'_, '_>,
    y: usize,
    ch: &mut Chan<'_, RY>,
    inp: &mut Input<'_>,
) {
    let x = 1 - y;
    let broken = ch.fault().is_some();
    let healthy = w.healthy();
    let n = 1 + (inp.byte() % 12) as usize;
    let mode = inp.byte();
    // (item, remote, bytes, valid)
    let mut items = Vec::new();
    for _ in 0..n {
        if inp.byte() & 1 == 0 {
            let (sges, bytes, local_ok) = w.gather(y, inp);
            let (remote, remote_ok) = w.remote(x, bytes.len(), inp);
            items.push((Item::Gather(sges), remote, bytes, local_ok && remote_ok));
        } else {
            let l = inp.byte();
            let data = inp.take(l as usize % (INLINE + 9));
            let (remote, remote_ok) = w.remote(x, data.len(), inp);
            items.push((Item::Inline(data), remote, data.to_vec(), remote_ok));
        }
    }
    let max_post = ch.max_post();
    let mut added = Vec::new();
    let mut batch = ch.batch();
    for (item, remote, bytes, valid) in items.iter() {
        let r = match item {
            Item::Gather(sges) => batch.write(sges, *remote).map(|_| ()),
            Item::Inline(data) => batch.write_inline(data, *remote).map(|_| ()),
        };
        let too_big = matches!(item, Item::Inline(d) if d.len() > INLINE);
        match r {
            Ok(()) => {
                assert!(
                    !too_big && added.len() < max_post,
                    "batch accepted a bad request"
                );
                added.push((*remote, bytes.as_slice(), *valid));
            }
            Err(ChannelError::InlineTooLarge { .. }) => assert!(too_big),
            Err(ChannelError::BatchFull { .. }) => assert!(added.len() >= max_post),
            Err(e) => panic!("batch push failed with {e:?}"),
        }
    }
    // Outcome if posted now: requests run in order inside the post; the first bad one fails
    // and flushes the rest.
    let ok = !broken && healthy && added.iter().all(|a| a.2);
    let mut effects = Vec::new();
    if !broken && healthy {
        for (remote, bytes, valid) in &added {
            if !valid {
                break;
            }
            if !bytes.is_empty() {
                effects.push((w.remote_offset(x, remote), bytes.to_vec()));
            }
        }
    }
    let empty = added.is_empty();
    if mode & 1 == 0 {
        let r = batch.run();
        expect(
            "batch",
            broken && !empty,
            ok || empty,
            &r,
            ch.fault().is_some(),
        );
    } else {
        // SAFETY: gather entries name the source regions and inline data the input, both
        // alive and never written for the whole run; tickets are waited for or the channel
        // is drained before the fabric (and the buffers) go away.
        let r = unsafe { batch.post() };
        match r {
            Ok(Some(t)) => {
                assert!(
                    !broken && !empty,
                    "submit on a broken channel or of nothing posted"
                );
                assert_eq!(t.len(), added.len() as u64);
                w.tickets[y].push((t, ok));
            }
            Ok(None) => assert!(empty),
            Err(e) => {
                assert!(
                    !empty && !healthy,
                    "submit failed with {e:?} on a healthy fabric"
                );
                assert!(
                    ch.fault().is_some(),
                    "submit failed with {e:?}, channel not broken"
                );
            }
        }
        if r.is_err() {
            effects.clear();
        }
    }
    for (off, bytes) in effects {
        w.apply(x, off, &bytes);
    }
}

fn op_wait<const RY: usize>(
    w: &mut World<'_, '_>,
    y: usize,
    ch: &mut Chan<'_, RY>,
    inp: &mut Input<'_>,
) {
    let b = inp.byte();
    if w.tickets[y].is_empty() {
        return;
    }
    let i = b as usize % w.tickets[y].len();
    let (t, ok) = w.tickets[y].remove(i);
    let r = ch.wait(t);
    if r.is_ok() {
        assert!(
            ok,
            "wait reported success for requests that failed or were flushed"
        );
    }
    if ch.fault().is_none() {
        assert!(
            r.is_ok() && ok,
            "wait: {r:?} (predicted ok={ok}) on a channel not broken"
        );
    }
}

fn op_wait_all<const RY: usize>(w: &mut World<'_, '_>, y: usize, ch: &mut Chan<'_, RY>) {
    let r = ch.wait_all();
    if !matches!(r, Err(ChannelError::Provider(_))) {
        assert_eq!(
            ch.outstanding_sends(),
            0,
            "wait_all left sends outstanding: {r:?}"
        );
        assert_eq!(
            ch.outstanding_recvs(),
            0,
            "wait_all left receives outstanding"
        );
    }
    assert_eq!(
        r.is_ok(),
        ch.fault().is_none(),
        "wait_all: {r:?} vs {:?}",
        ch.fault()
    );
    if r.is_ok() {
        // Everything completed successfully: every ticket of this side was good.
        for (_, ok) in &w.tickets[y] {
            assert!(ok, "wait_all succeeded although a submitted batch failed");
        }
    }
    w.tickets[y].clear();
}

struct RecvRec {
    range: Range<usize>,
    bad: bool,
    /// `None` until a send consumed it; then its length or the failure.
    msg: Option<Result<u32, ()>>,
    waited: bool,
}

/// One two-sided message from `y` to `x`, predicted against the receives `recs` posted at
/// `x` (of which `consumed` have been matched).
#[allow(clippy::too_many_arguments)]
fn send_one<const RY: usize>(
    fabric: &SoftFabric<'_>,
    shadow_x: &mut [u8; LEN],
    ysrc: &SoftRegion<'_>,
    y: usize,
    ch: &mut Chan<'_, RY>,
    recs: &mut [RecvRec],
    consumed: &mut usize,
    len: usize,
    inline: Option<&[u8]>,
) {
    let broken = ch.fault().is_some();
    let healthy = !fabric.in_error(Side::A) && !fabric.in_error(Side::B);
    let pattern = src_pattern(y);
    let bytes: &[u8] = match inline {
        Some(d) => d,
        None => &pattern[..len],
    };
    let fits = bytes.len() <= INLINE || inline.is_none();
    let posted = !broken && fits;
    let mut ok = false;
    if posted && healthy {
        if let Some(rec) = recs.get_mut(*consumed) {
            if (rec.bad && !rec.range.is_empty()) || bytes.len() > rec.range.len() {
                rec.msg = Some(Err(()));
            } else {
                rec.msg = Some(Ok(bytes.len() as u32));
                shadow_x[rec.range.start..rec.range.start + bytes.len()].copy_from_slice(bytes);
                ok = true;
            }
            *consumed += 1;
        }
    }
    let r = match inline {
        Some(d) => ch.send_inline(d),
        None => {
            let g = [ysrc.sge(0..len).expect("in bounds")];
            ch.send(&g)
        }
    };
    expect("send", broken, ok, &r, ch.fault().is_some());
}

/// `x` posts receives in a scope while `y` sends (and `x` waits for some of them).
fn op_scoped_pair<const RX: usize, const RY: usize>(
    w: &mut World<'_, '_>,
    x: usize,
    xc: &mut Chan<'_, RX>,
    yc: &mut Chan<'_, RY>,
    inp: &mut Input<'_>,
) {
    let y = 1 - x;
    let cap = (RX as u64).min(w.depth) as usize;
    let k = 1 + (inp.byte() % 6) as usize;
    let mut at = (inp.byte() % 16) as usize;
    let mut ranges: [Range<usize>; 6] = core::array::from_fn(|_| LEN..LEN);
    // Receive buffers, laid out one after the other; `bad` ones get a key that resolves to
    // nothing.
    let mut layout = Vec::new();
    for r in ranges.iter_mut().take(k) {
        let b = inp.byte();
        let len = (b % 21) as usize;
        if at + len > LEN {
            break;
        }
        *r = at..at + len;
        layout.push((at..at + len, b >= 0xf0));
        at += len;
    }
    let nsteps = 1 + (inp.byte() % 12) as usize;
    let x_broken = xc.fault().is_some();

    let World {
        fabric,
        mem,
        src,
        shadow,
        ..
    } = w;
    let fabric: &SoftFabric<'_> = fabric;
    let (xmem, ysrc) = (&mut mem[x], &src[y]);
    let shadow_x = &mut shadow[x];
    let entries = xmem.sges_mut(ranges).expect("disjoint, in bounds");
    let mut ents = entries.map(|e| [e]);
    for (e, (_, bad)) in ents.iter_mut().zip(&layout) {
        if *bad {
            let (a, l, k) = (e[0].addr(), e[0].len(), e[0].lkey());
            // SAFETY: the entry names live memory of `x`'s region (which `e` borrows); with a
            // key that resolves to nothing the model never writes it.
            e[0] = unsafe { SgeMut::from_raw(a, l, k ^ 0x5a5a_5a5a) };
        }
    }
    let mut it = ents.iter_mut().zip(&layout);
    // Posted receives, in posting order.
    let mut recs: Vec<RecvRec> = Vec::new();
    let mut pendings = Vec::new();
    let mut consumed = 0usize;
    let mut polled = 0usize;

    let r = xc.scope(|s| {
        for _ in 0..nsteps {
            match inp.byte() % 4 {
                0 => {
                    let Some((e, (range, bad))) = it.next() else {
                        continue;
                    };
                    let j = pendings.len();
                    let full = j - polled.min(j) >= cap || (j >= RX && !recs[j - RX].waited);
                    match s.recv(&mut e[..]) {
                        Ok(p) => {
                            assert!(
                                !x_broken && !full,
                                "receive {j} posted (cap {cap}, polled {polled})"
                            );
                            pendings.push(p);
                            recs.push(RecvRec {
                                range: range.clone(),
                                bad: *bad,
                                msg: None,
                                waited: false,
                            });
                        }
                        Err(ChannelError::RecvQueueFull) => {
                            assert!(full, "receive {j} refused (cap {cap}, polled {polled})")
                        }
                        Err(e) => assert!(
                            x_broken || fabric.in_error(side(x)),
                            "receive {j}: {e:?} on a healthy channel"
                        ),
                    }
                }
                2 => {
                    let b = inp.byte();
                    let in_error = fabric.in_error(side(x));
                    let ready: Vec<usize> = (0..pendings.len())
                        .filter(|&i| !recs[i].waited && (i < consumed || in_error))
                        .collect();
                    if ready.is_empty() {
                        continue;
                    }
                    let i = ready[b as usize % ready.len()];
                    let completed = if in_error { pendings.len() } else { consumed };
                    let r = s.wait(pendings[i]);
                    if i >= polled {
                        polled = completed;
                    }
                    recs[i].waited = true;
                    match recs[i].msg {
                        Some(Ok(len)) => {
                            let info = r.expect("a matched receive completes");
                            assert_eq!((info.byte_len, info.imm), (len, None));
                        }
                        _ => assert!(r.is_err(), "receive {i} never matched, got {r:?}"),
                    }
                }
                step => {
                    let l = inp.byte();
                    let posted = &mut recs[..];
                    if step == 3 {
                        let data = inp.take(l as usize % (INLINE + 9));
                        send_one(
                            fabric,
                            shadow_x,
                            ysrc,
                            y,
                            yc,
                            posted,
                            &mut consumed,
                            0,
                            Some(data),
                        );
                    } else {
                        let len = l as usize % (LEN + 1);
                        send_one(
                            fabric,
                            shadow_x,
                            ysrc,
                            y,
                            yc,
                            posted,
                            &mut consumed,
                            len,
                            None,
                        );
                    }
                }
            }
        }
        // Match what is left, or the scope would wait forever: empty messages if `y` can
        // still send, else `x` dies (which flushes its receives).
        let posted = &mut recs[..];
        while !fabric.in_error(side(x)) && consumed < posted.len() {
            let before = consumed;
            send_one(
                fabric,
                shadow_x,
                ysrc,
                y,
                yc,
                posted,
                &mut consumed,
                0,
                Some(&[]),
            );
            if consumed == before || yc.fault().is_some() {
                break;
            }
        }
        if !fabric.in_error(side(x)) && consumed < posted.len() {
            fabric.kill(side(x));
        }
    });
    // A scope reports failures of its own requests; one that began broken returns the
    // closure's value.
    if r.is_err() {
        assert!(
            xc.fault().is_some(),
            "scope failed with {r:?}, channel not broken"
        );
    }
}

/// `x` waits for one message with a deadline; `y` may have posted a send first (which the
/// receive then unblocks), or not (then the receive times out and breaks `x`).
fn op_recv_timeout<const RX: usize, const RY: usize>(
    w: &mut World<'_, '_>,
    x: usize,
    xc: &mut Chan<'_, RX>,
    yc: &mut Chan<'_, RY>,
    inp: &mut Input<'_>,
) {
    let y = 1 - x;
    let (f, l, rl, ro, t) = (inp.byte(), inp.byte(), inp.byte(), inp.byte(), inp.byte());
    let with_send = f & 1 == 1;
    let len = l as usize % (LEN + 1);
    let rlen = rl as usize % (LEN + 1);
    let roff = ro as usize % (LEN - rlen + 1);
    let timeout = Duration::from_millis(u64::from(t));
    let (xb, yb) = (xc.fault().is_some(), yc.fault().is_some());
    let healthy = w.healthy();
    let matched = with_send && !xb && !yb && healthy;
    let ok = matched && len <= rlen;
    let World {
        mem, src, shadow, ..
    } = w;
    let g = [src[y].sge(0..len).expect("in bounds")];
    let mut rs = [mem[x].sge_mut(roff..roff + rlen).expect("in bounds")];
    let (recv, send) = if with_send {
        let mut recv = None;
        let send = yc.scope(|s| {
            let p = s.send(&g);
            // Making room in the send queue may poll an earlier failure first.
            let expected = if yb {
                p.is_err()
            } else {
                p.is_ok() || !healthy
            };
            assert!(expected, "scoped send: {p:?}");
            recv = Some(xc.recv_timeout(&mut rs, timeout));
            if let Ok(p) = p {
                let r = s.wait(p);
                assert_eq!(r.is_ok(), ok, "scoped send: predicted ok={ok}, got {r:?}");
            }
        });
        (recv.expect("ran"), Some(send))
    } else {
        (xc.recv_timeout(&mut rs, timeout), None)
    };
    expect("recv_timeout", xb, ok, &recv, xc.fault().is_some());
    if let Ok(info) = recv {
        assert_eq!((info.byte_len, info.imm), (len as u32, None));
    }
    if let Some(send) = send {
        if send.is_ok() && !yb {
            assert!(
                ok || yc.fault().is_none(),
                "scope hid a failure of its send"
            );
        }
    }
    if ok {
        shadow[x][roff..roff + len].copy_from_slice(&src_pattern(y)[..len]);
    }
}

fn run(data: &[u8]) {
    let mut inp = Input { data, pos: 0 };
    let depth = [4u32, 8, 16][(inp.byte() % 3) as usize];
    let signal_every = 1 + u32::from(inp.byte() % 20);
    let caps = QpCaps {
        max_send_wr: depth,
        max_recv_wr: depth,
        max_send_sge: 2,
        max_recv_sge: 2,
        max_inline_data: INLINE as u32,
    };
    let (mut ma, mut mb) = ([0u8; LEN], [0u8; LEN]);
    let (mut sa, mut sb) = (src_pattern(0), src_pattern(1));
    let retry = RetryCount::new(3).expect("3 is a retry count");
    let fabric = SoftFabric::new(caps, RnrRetry::Times(3), retry);
    let mem = [
        fabric.register(Side::A, &mut ma[..], RW).expect("register"),
        fabric.register(Side::B, &mut mb[..], RW).expect("register"),
    ];
    let src = [
        fabric
            .register(Side::A, &mut sa[..], AccessFlags::empty())
            .expect("register"),
        fabric
            .register(Side::B, &mut sb[..], AccessFlags::empty())
            .expect("register"),
    ];
    let mut w = World {
        fabric: &fabric,
        mem,
        src,
        shadow: [[0; LEN]; 2],
        depth: u64::from(depth),
        tickets: [Vec::new(), Vec::new()],
        failure: [None, None],
    };
    let mut cfg = ChannelConfig::default();
    cfg.signal_every = signal_every;
    let (ea, eb) = fabric.ends().unwrap();
    let mut a: Chan<'_, 4> = Channel::with_backoff(ea, cfg, Spin, &CLOCK);
    let mut b: Chan<'_, 64> = Channel::with_backoff(eb, cfg, Spin, &CLOCK);
    assert!(a.max_post() as u64 <= w.depth && a.max_post() >= 1);

    for _ in 0..MAX_OPS {
        if inp.done() {
            break;
        }
        let op = inp.byte();
        let y = usize::from(op & 1);
        macro_rules! on {
            ($f:ident $(, $arg:expr)*) => {
                if y == 0 { $f(&mut w, 0, &mut a $(, $arg)*) } else { $f(&mut w, 1, &mut b $(, $arg)*) }
            };
        }
        match (op >> 1) % 10 {
            0 => on!(op_write, &mut inp),
            1 => on!(op_read, &mut inp),
            2 => on!(op_write_inline, &mut inp),
            3 => on!(op_send_inline, &mut inp),
            4 => on!(op_batch, &mut inp),
            5 => on!(op_wait, &mut inp),
            6 => on!(op_wait_all),
            7 => {
                if y == 0 {
                    op_scoped_pair(&mut w, 0, &mut a, &mut b, &mut inp)
                } else {
                    op_scoped_pair(&mut w, 1, &mut b, &mut a, &mut inp)
                }
            }
            8 => {
                if y == 0 {
                    op_recv_timeout(&mut w, 0, &mut a, &mut b, &mut inp)
                } else {
                    op_recv_timeout(&mut w, 1, &mut b, &mut a, &mut inp)
                }
            }
            _ => fabric.kill(side(y)),
        }
        check(&mut w, &a, &b);
    }
    // Drain before the buffers go: unsafely submitted batches may still be outstanding.
    let _ = a.wait_all();
    let _ = b.wait_all();
    assert_eq!((a.outstanding_sends(), b.outstanding_sends()), (0, 0));
}

fuzz_target!(|data: &[u8]| run(data));
