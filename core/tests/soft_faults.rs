//! Faults on the software model: a peer that stops answering, a panic in the caller's code,
//! a failing poll, post or state change. Every test checks the two promises of
//! `docs/safety.md`: the call returns (bounded, naming the peer), and when it returns no
//! request it posted is still in flight, so the buffers it borrowed are free again.
//!
//! Runs under Miri in CI (`tools/test-all`), except the one test that needs a child process.
#![allow(clippy::std_instead_of_core)] // test code

use std::cell::Cell;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::time::Duration;

use rverbs_core::channel::{Channel, ChannelConfig, ChannelError, WrFailure};
use rverbs_core::completion::{Completion, WcStatus};
use rverbs_core::memory::AccessFlags;
use rverbs_core::model::{Side, SoftEnd, SoftFabric};
use rverbs_core::multi::{MultiChannel, MultiError, PeerError};
use rverbs_core::params::{QpCaps, RetryCount, RnrRetry};
use rverbs_core::poll::Spin;
use rverbs_core::provider::{Provider, ProviderError, QueuePair, Verb};
use rverbs_core::sge::Sge;
use rverbs_core::wr::{PostFailure, WorkRequest};
use rverbs_testkit::{clock, PanicAfter};

const RW: AccessFlags = AccessFlags::LOCAL_WRITE
    .union(AccessFlags::REMOTE_WRITE)
    .union(AccessFlags::REMOTE_READ);

const CAPS: QpCaps = QpCaps::queues(16, 16).with_sges(2);

/// 1 ms per clock read, and a 50 ms timeout: a wait gives up after about 50 reads.
const TIMEOUT: Duration = Duration::from_millis(50);

fn cfg(peer: u32) -> ChannelConfig {
    let mut c = ChannelConfig::with_timeout(TIMEOUT);
    c.rank = Some(peer);
    c
}

fn fabric<'m>(rnr: RnrRetry) -> SoftFabric<'m> {
    SoftFabric::new(CAPS, rnr, RetryCount::new(3).unwrap())
}

/// Binds `$f` to a fabric whose queue pairs retry as `$rnr` says and `$m` to 16 bytes
/// registered on end A (the region borrows a buffer the macro binds next to it); or `$f` to
/// a fabric with three RNR retries, `$src` to `$len` bytes of ones on end A and `$dst` to
/// `$len` zeros on end B.
macro_rules! fabric_and_region {
    (let $f:ident, $src:ident -> $dst:ident = $len:literal bytes) => {
        let (mut s, mut d) = ([1u8; $len], [0u8; $len]);
        let $f = fabric(RnrRetry::Times(3));
        let $src = $f.register(Side::A, &mut s, RW).unwrap();
        let $dst = $f.register(Side::B, &mut d, RW).unwrap();
    };
    (let $f:ident, $m:ident = $rnr:expr) => {
        let mut buf = [0u8; 16];
        let $f = fabric($rnr);
        let $m = $f.register(Side::A, &mut buf, RW).unwrap();
    };
    (let $f:ident, mut $m:ident = $rnr:expr) => {
        let mut buf = [0u8; 16];
        let $f = fabric($rnr);
        let mut $m = $f.register(Side::A, &mut buf, RW).unwrap();
    };
}

/// Asserts the channel has nothing in flight: every buffer it was handed is free.
fn settled<P: Provider, const R: usize>(c: &Channel<P, Spin, R>) {
    assert_eq!(
        (c.outstanding_sends(), c.outstanding_recvs()),
        (0, 0),
        "requests still in flight after the call returned"
    );
}

/// Runs `f` on a thread with a large stack: two model fabrics and their channels do not fit
/// a test thread's default stack in a debug build.
fn big_stack(f: impl FnOnce() + Send + 'static) {
    let h = std::thread::Builder::new()
        .stack_size(64 << 20)
        .spawn(f)
        .unwrap();
    if let Err(p) = h.join() {
        std::panic::resume_unwind(p);
    }
}

fn timed_out(peer: u32) -> ChannelError {
    ChannelError::TimedOut { rank: Some(peer) }
}

#[test]
fn recv_from_a_dead_peer_times_out_naming_it() {
    fabric_and_region!(let f, mut m = RnrRetry::Times(3));
    f.kill(Side::B);
    let mut a = Channel::new(f.ends().unwrap().0, cfg(7), clock!());
    let t0 = a.clock().now();
    let r = a.recv(&mut [m.sge_mut(0..16).unwrap()]);
    let waited = a.clock().now().saturating_duration_since(t0);
    assert_eq!(r, Err(timed_out(7)));
    assert!(r.unwrap_err().to_string().contains("rank 7"));
    assert!(waited >= TIMEOUT && waited < TIMEOUT * 3, "{waited:?}");
    settled(&a);
    assert!(f.in_error(Side::A));
    assert!(m.write_from(0, b"mine again"));
}

#[test]
fn send_that_retries_forever_is_bounded() {
    // The peer lives but never posts a receive, and the sender retries RNR forever: before
    // every wait was bounded, this spun for ever.
    fabric_and_region!(let f, m = RnrRetry::Infinite);
    let mut a = Channel::new(f.ends().unwrap().0, cfg(3), clock!());
    let r = a.send(&[m.sge(0..8).unwrap()]);
    assert_eq!(r, Err(timed_out(3)));
    settled(&a);
    assert_eq!(f.send_queue_used(Side::A), 0);
}

#[test]
fn scope_exit_is_bounded_and_drains() {
    fabric_and_region!(let f, mut m = RnrRetry::Times(3));
    f.kill(Side::B);
    let mut a = Channel::new(f.ends().unwrap().0, cfg(2), clock!());
    {
        let mut rs = [m.sge_mut(0..16).unwrap()];
        let r = a.scope(|s| s.recv(&mut rs).map(|_| ()));
        assert_eq!(r, Err(timed_out(2)));
    }
    settled(&a);
    assert!(m.write_from(0, b"free"));
}

#[test]
fn panic_inside_a_scope_flushes_at_once() {
    // The closure panics with a receive posted that no peer will ever complete: the scope
    // must not hand the buffer back (the unwind frees it) while the device owns it.
    fabric_and_region!(let f, mut m = RnrRetry::Times(3));
    let (ea, _eb) = f.ends().unwrap();
    let mut a = Channel::new(ea, cfg(1), clock!());
    let t0 = a.clock().now();
    let r = catch_unwind(AssertUnwindSafe(|| {
        let mut rs = [m.sge_mut(0..16).unwrap()];
        let _ = a.scope(|s| {
            s.recv(&mut rs).unwrap();
            panic!("caller bug");
        });
    }));
    assert!(r.is_err());
    settled(&a);
    // Flushed at once, not after the timeout.
    let waited = a.clock().now().saturating_duration_since(t0);
    assert!(waited < TIMEOUT, "{waited:?}");
    assert!(f.in_error(Side::A));
}

/// Two peers (ranks 1 and 2) of a receiver, each over a fabric of its own.
struct Pair<'f> {
    multi: MultiChannel<SoftEnd<'f>, Spin>,
    senders: Vec<Channel<SoftEnd<'f>>>,
}

fn pair<'f>(fabrics: &'f [SoftFabric<'_>; 2]) -> Pair<'f> {
    let mut chans = Vec::new();
    let mut senders = Vec::new();
    for (i, f) in fabrics.iter().enumerate() {
        let (ea, eb) = f.ends().unwrap();
        chans.push(Channel::with_backoff(ea, cfg(i as u32 + 1), Spin, clock!()));
        senders.push(Channel::new(eb, cfg(0), clock!()));
    }
    Pair {
        multi: MultiChannel::new(chans).unwrap(),
        senders,
    }
}

#[test]
fn panic_in_the_scatter_iterator_settles_every_posted_write() {
    big_stack(|| {
        let (mut sbuf, mut d0, mut d1) = ([5u8; 16], [0u8; 16], [0u8; 16]);
        let fabrics = [fabric(RnrRetry::Times(3)), fabric(RnrRetry::Times(3))];
        let src = fabrics[0].register(Side::A, &mut sbuf, RW).unwrap();
        let dst = [
            fabrics[0].register(Side::B, &mut d0, RW).unwrap(),
            fabrics[1].register(Side::B, &mut d1, RW).unwrap(),
        ];
        let mut p = pair(&fabrics);
        let g = [src.sge(0..16).unwrap()];
        let r = catch_unwind(AssertUnwindSafe(|| {
            let ops = (0..2).map(|i| {
                assert!(i == 0, "the caller's iterator panics after the first write");
                (1u32, &g[..], dst[0].remote())
            });
            let _ = p.multi.scatter_write(ops);
        }));
        assert!(r.is_err());
        // The first write was posted; the guard polled it to completion during the unwind.
        settled(p.multi.channel(1).unwrap());
        let mut got = [0u8; 16];
        dst[0].read_into(0, &mut got);
        assert_eq!(got, [5u8; 16]);
        drop(p.senders);
    });
}

#[test]
fn panic_in_the_gather_callback_flushes_the_other_receives() {
    big_stack(|| {
        let (mut r0, mut r1, mut s) = ([0u8; 16], [0u8; 16], [9u8; 16]);
        let fabrics = [fabric(RnrRetry::Infinite), fabric(RnrRetry::Infinite)];
        let mut m0 = fabrics[0].register(Side::A, &mut r0, RW).unwrap();
        let mut m1 = fabrics[1].register(Side::A, &mut r1, RW).unwrap();
        let _src = fabrics[0].register(Side::B, &mut s, RW).unwrap();
        let mut p = pair(&fabrics);
        // Rank 1 sends (it waits in the model until the receive is posted); rank 2 never does.
        p.senders[0].post_send_inline(b"from rank 1").unwrap();
        let r = catch_unwind(AssertUnwindSafe(|| {
            let (mut a, mut b) = ([m0.sge_mut(0..16).unwrap()], [m1.sge_mut(0..16).unwrap()]);
            let ops = [(1u32, &mut a[..]), (2u32, &mut b[..])];
            let _ = p
                .multi
                .gather_receive(ops, |peer, _| panic!("callback bug at peer {peer}"));
        }));
        assert!(r.is_err());
        // Peer 1's receive was never going to complete: it was flushed, not left posted.
        settled(p.multi.channel(1).unwrap());
        settled(p.multi.channel(2).unwrap());
        assert!(fabrics[1].in_error(Side::A));
        assert!(m1.write_from(0, b"ours"));
    });
}

#[test]
fn gather_from_a_silent_peer_names_it() {
    big_stack(|| {
        let (mut r0, mut r1) = ([0u8; 16], [0u8; 16]);
        let fabrics = [fabric(RnrRetry::Infinite), fabric(RnrRetry::Infinite)];
        let mut m0 = fabrics[0].register(Side::A, &mut r0, RW).unwrap();
        let mut m1 = fabrics[1].register(Side::A, &mut r1, RW).unwrap();
        let mut p = pair(&fabrics);
        p.senders[0].post_send_inline(b"hello").unwrap();
        let (mut a, mut b) = ([m0.sge_mut(0..16).unwrap()], [m1.sge_mut(0..16).unwrap()]);
        let mut seen = Vec::new();
        let r = p
            .multi
            .gather_receive([(1, &mut a[..]), (2, &mut b[..])], |peer, info| {
                seen.push((peer, info.byte_len))
            });
        assert_eq!(seen, [(1, 5)]);
        assert_eq!(
            r,
            Err(MultiError::Peer(PeerError {
                rank: 2,
                error: timed_out(2)
            }))
        );
        settled(p.multi.channel(2).unwrap());
    });
}

/// A provider wrapper that fails on command.
struct Faulty<P> {
    inner: P,
    /// Fail this many polls (send side) from now on.
    fail_polls: Cell<u32>,
    /// `set_error` fails.
    fail_set_error: bool,
    /// Post only the first n requests of the next chain, then fail.
    post_prefix: Option<usize>,
}

impl<P> Faulty<P> {
    fn new(inner: P) -> Self {
        Self {
            inner,
            fail_polls: Cell::new(0),
            fail_set_error: false,
            post_prefix: None,
        }
    }

    /// Over `inner`, posting only the first `n` requests of the next chain, then failing it.
    fn posting_prefix(inner: P, n: usize) -> Self {
        Self {
            post_prefix: Some(n),
            ..Self::new(inner)
        }
    }
}

impl<P: Provider> QueuePair for Faulty<P> {
    rverbs_testkit::forward_queue_pair!(inner);

    unsafe fn post_send(&mut self, wrs: &[WorkRequest<'_>]) -> Result<(), PostFailure> {
        if let Some(k) = self.post_prefix.take() {
            let k = k.min(wrs.len());
            // SAFETY: forwarded contract, for a prefix of the caller's chain.
            unsafe { self.inner.post_send(&wrs[..k]) }?;
            return Err(PostFailure {
                posted: k,
                errno: 22,
            });
        }
        // SAFETY: forwarded contract.
        unsafe { self.inner.post_send(wrs) }
    }

    fn set_error(&mut self) -> Result<(), ProviderError> {
        if self.fail_set_error {
            return Err(ProviderError {
                verb: Verb::ModifyQpErr,
                errno: 22,
            });
        }
        self.inner.set_error()
    }
}

impl<P: Provider> Provider for Faulty<P> {
    fn poll_send(&mut self, out: &mut [Completion]) -> Result<usize, ProviderError> {
        let n = self.fail_polls.get();
        if n > 0 {
            self.fail_polls.set(n - 1);
            return Err(ProviderError {
                verb: Verb::PollCq,
                errno: 5,
            });
        }
        self.inner.poll_send(out)
    }
    fn poll_recv(&mut self, out: &mut [Completion]) -> Result<usize, ProviderError> {
        self.inner.poll_recv(out)
    }
}

#[test]
fn failed_poll_drains_before_returning() {
    fabric_and_region!(let f, src -> dst = 16 bytes);
    let faulty = Faulty::new(f.ends().unwrap().0);
    faulty.fail_polls.set(1);
    let mut a = Channel::new(faulty, cfg(4), clock!());
    let r = a.write(&[src.sge(0..16).unwrap()], dst.remote());
    assert!(matches!(r, Err(ChannelError::Provider(_))), "{r:?}");
    // Before, the error came back with the write still outstanding.
    settled(&a);
    assert!(f.in_error(Side::A));
    // The channel stays broken.
    assert!(a.write(&[src.sge(0..16).unwrap()], dst.remote()).is_err());
}

#[test]
fn half_posted_chain_is_drained_before_the_error() {
    fabric_and_region!(let f, src -> dst = 64 bytes);
    let faulty = Faulty::posting_prefix(f.ends().unwrap().0, 2);
    let mut a = Channel::new(faulty, cfg(5), clock!());
    let g: Vec<[Sge<'_>; 1]> = (0..4)
        .map(|i| [src.sge(i * 16..i * 16 + 16).unwrap()])
        .collect();
    let mut b = a.batch();
    for (i, s) in g.iter().enumerate() {
        b.write(s, dst.remote().slice(i as u64 * 16, 16).unwrap())
            .unwrap();
    }
    let r = b.run();
    assert_eq!(r, Err(ChannelError::Post { errno: 22 }));
    settled(&a);
    match a.fault() {
        Some(ChannelError::Broken(WrFailure { rank: peer, .. })) => assert_eq!(peer, Some(5)),
        other => panic!("{other:?}"),
    }
    let _ = WcStatus::Flushed;
}

/// A single request (a blocking verb's own path) that the provider takes and then refuses:
/// it is counted as consuming the peer's receive, the channel breaks and the drain request
/// retires it before the error returns.
#[test]
fn a_single_post_taken_then_refused_is_counted_and_drained() {
    fabric_and_region!(let f, src -> _dst = 64 bytes);
    let faulty = Faulty::posting_prefix(f.ends().unwrap().0, 1);
    let mut a = Channel::new(faulty, cfg(5), clock!());
    let r = a.send(&[src.sge(0..16).unwrap()]);
    assert_eq!(r, Err(ChannelError::Post { errno: 22 }));
    assert_eq!(a.outstanding_sends(), 0);
    assert_eq!(a.remote_recvs_used(), 1);
    assert_eq!(
        a.counters().requests_posted,
        2,
        "the send and the drain request"
    );
    assert!(a.fault().is_some());
}

/// The abort path cannot run in this process: the test binary runs itself as a child.
#[cfg(not(miri))]
#[test]
fn a_queue_pair_that_cannot_be_flushed_aborts_the_process() {
    let exe = std::env::current_exe().unwrap();
    let out = std::process::Command::new(exe)
        .args([
            "--exact",
            "unflushable_child",
            "--ignored",
            "--nocapture",
            "--test-threads=1",
        ])
        .env("RVERBS_UNFLUSHABLE_CHILD", "1")
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    use std::os::unix::process::ExitStatusExt;
    assert_eq!(
        out.status.signal(),
        Some(libc_sigabrt()),
        "expected SIGABRT; status {:?}, stderr:\n{stderr}",
        out.status
    );
    assert!(
        stderr.contains("rank 6") && stderr.contains("cannot flush"),
        "the abort message names the peer and the cause:\n{stderr}"
    );
    assert!(
        !stderr.contains("returned with a buffer in flight"),
        "{stderr}"
    );
}

#[cfg(not(miri))]
const fn libc_sigabrt() -> i32 {
    6
}

#[cfg(not(miri))]
#[test]
#[ignore = "child-process entry point of a_queue_pair_that_cannot_be_flushed_aborts_the_process"]
fn unflushable_child() {
    if std::env::var("RVERBS_UNFLUSHABLE_CHILD").is_err() {
        return;
    }
    fabric_and_region!(let f, mut m = RnrRetry::Times(3));
    f.kill(Side::B);
    let mut faulty = Faulty::new(f.ends().unwrap().0);
    faulty.fail_set_error = true;
    let mut a = Channel::new(faulty, cfg(6), clock!());
    let _ = a.recv(&mut [m.sge_mut(0..16).unwrap()]);
    eprintln!("returned with a buffer in flight");
}

#[test]
fn panic_in_the_backoff_of_a_blocking_call_settles_the_channel() {
    fabric_and_region!(let f, mut m = RnrRetry::Times(3));
    let (ea, eb) = f.ends().unwrap();
    let mut a: Channel<_, PanicAfter> = Channel::with_backoff(ea, cfg(1), PanicAfter(5), clock!());
    let r = catch_unwind(AssertUnwindSafe(|| {
        let _ = a.recv(&mut [m.sge_mut(0..16).unwrap()]);
    }));
    assert!(r.is_err());
    // Before, the receive stayed posted into `m` after the unwind; now it was flushed.
    assert_eq!((a.outstanding_sends(), a.outstanding_recvs()), (0, 0));
    assert!(f.in_error(Side::A));
    // The peer's send can no longer land in memory the caller got back.
    let mut b = Channel::new(eb, cfg(0), clock!());
    let _ = b.post_send_inline(b"late");
    assert!(m.write_from(0, b"mine"));
    assert_eq!(&rverbs_testkit::bytes::<4>(&m, 0), b"mine");
}

#[test]
fn a_ticket_is_waited_only_on_its_own_channel() {
    let (mut s, mut d) = ([1u8; 16], [0u8; 16]);
    let f1 = fabric(RnrRetry::Times(3));
    let f2 = fabric(RnrRetry::Times(3));
    let _src = f1.register(Side::A, &mut s, RW).unwrap();
    let dst = f1.register(Side::B, &mut d, RW).unwrap();
    let mut x = Channel::new(f1.ends().unwrap().0, cfg(1), clock!());
    let mut y = Channel::new(f2.ends().unwrap().0, cfg(2), clock!());
    let t = x.post_write_inline(b"abcd", dst.remote()).unwrap();
    assert_eq!(y.wait(t), Err(ChannelError::ForeignTicket));
    assert_eq!(y.try_wait(t), Some(Err(ChannelError::ForeignTicket)));
    assert!(
        y.fault().is_none(),
        "a foreign ticket does not break the channel"
    );
    assert_eq!(x.wait(t), Ok(rverbs_core::channel::Done::default()));
    // A fabric hands its two ends out once: two channels on one queue pair could take each
    // other's completions.
    assert!(f1.ends().is_none());
}
