//! Remote atomics on a real device, against memory of another process: both operations in
//! every posting style, a losing compare-and-swap, a counter three ranks increment at once,
//! a misaligned target refused before posting, an atomic on memory without remote atomic
//! access failed by the device, and `max_rd_atomic` clamped to what the device allows.
//!
//! The memory the atomics target belongs to a child process: this same test binary running
//! the ignored `child_target` entry point, which registers the words, connects one queue
//! pair per initiator, and talks to the parent over its stdin and stdout (endpoints and
//! remote memory descriptors in their wire encoding, as hex). The initiators are the
//! parent's threads, one queue pair each.
#![allow(clippy::std_instead_of_core)] // test code

#[macro_use]
mod support;

use std::io::BufRead;
use std::time::Duration;

use rverbs_core::channel::{Channel, ChannelConfig, ChannelError};
use rverbs_core::completion::WcStatus;
use rverbs_core::memory::PageMemory;
use rverbs_core::provider::verbs::{PreparedVerbs, VerbsProvider};
use rverbs_core::sge::RemoteMemory;
use rverbs_core::verbs::{AccessFlags, Context, OwnedRegion, Pd, QpConfig};
use rverbs_core::wire::Endpoint;
use rverbs_core::wr::AtomicFault;
use support::{hex, unhex, Peer};

/// What the child's atomic words grant.
const ATOMIC: AccessFlags = AccessFlags::LOCAL_WRITE.union(AccessFlags::REMOTE_ATOMIC);
/// Remote read and write, but no atomics.
const RW: AccessFlags = AccessFlags::LOCAL_WRITE
    .union(AccessFlags::REMOTE_WRITE)
    .union(AccessFlags::REMOTE_READ);
/// Lines of the protocol start with this (libtest prints its own lines on the same stdout).
const TAG: &str = "ATOMICS ";
/// Words of the child's atomic region reported at the end.
const WORDS: usize = 8;

/// One 8-aligned page registered with `access` (8 words at offset 0).
fn page(pd: &Pd, access: AccessFlags) -> OwnedRegion {
    pd.register_shared(PageMemory::zeroed(4096).unwrap(), access)
        .unwrap()
}

/// The child process holding the words.
struct Target {
    child: Peer,
    /// The atomic words (`ATOMIC`) and a region without remote atomic access (`RW`).
    words: RemoteMemory,
    no_atomics: RemoteMemory,
}

impl Target {
    /// Starts the child with `qps` queue pairs and connects one channel to each.
    fn start(
        test: &str,
        ctx: &Context,
        pd: &Pd,
        qps: usize,
    ) -> (Self, Vec<Channel<VerbsProvider>>) {
        let dev = support::test_device(test).unwrap();
        let qps_env = qps.to_string();
        let env = [("RVERBS_ATOMICS_CHILD_QPS", qps_env.as_str())];
        let mut child = Peer::start("child_target", TAG, "the child", &dev, &env);
        let mem = child.line("mem");
        let mem: Vec<_> = mem
            .split(' ')
            .map(|m| RemoteMemory::decode(&unhex(m)))
            .collect();
        let chans = (0..qps)
            .map(|_| {
                let peer = Endpoint::decode(&unhex(&child.line("ep"))).unwrap();
                let mine = PreparedVerbs::new(ctx, pd, &QpConfig::default()).unwrap();
                child.say(&format!("ep {}", hex(&mine.endpoint().encode())));
                let cfg = ChannelConfig::with_timeout(Duration::from_secs(10));
                Channel::new(mine.handshake(&peer).unwrap(), cfg, &support::WALL)
            })
            .collect();
        child.line("ready");
        let t = Target {
            child,
            words: mem[0].unwrap(),
            no_atomics: mem[1].unwrap(),
        };
        (t, chans)
    }

    /// The words `at(i)` for `i < WORDS`, as the child reads them when the parent is done.
    fn finish(mut self) -> Vec<u64> {
        self.child.say("done");
        let words = self
            .child
            .line("words")
            .split(' ')
            .map(|w| w.parse().unwrap())
            .collect();
        self.child.wait();
        words
    }

    fn at(&self, i: u64) -> RemoteMemory {
        self.words.slice(i * 8, 8).unwrap()
    }
}

/// The target side, in its own process: registers the words, connects, waits for `done`,
/// and reports the words.
/// The test device and a protection domain (`setup!`), and a target process with `qps`
/// channels to it (`Target::start`), as `(ctx, pd, target, channels)`; returns from the test
/// when it is to be skipped.
macro_rules! target {
    ($test:expr, $qps:expr) => {{
        let (ctx, pd) = setup!($test);
        let (t, chans) = Target::start($test, &ctx, &pd, $qps);
        (ctx, pd, t, chans)
    }};
}

#[test]
#[ignore = "child-process entry point; the tests above run it"]
fn child_target() {
    let say = |l: &str| support::say(TAG, l);
    let qps: usize = std::env::var("RVERBS_ATOMICS_CHILD_QPS")
        .unwrap()
        .parse()
        .unwrap();
    let ctx = support::open("child_target").unwrap();
    let pd = ctx.alloc_pd().unwrap();
    let words = page(&pd, ATOMIC);
    let plain = page(&pd, RW);
    say(&format!(
        "mem {} {}",
        hex(&words.remote().slice(0, 64).unwrap().encode()),
        hex(&plain.remote().slice(0, 64).unwrap().encode())
    ));
    let stdin = std::io::stdin();
    let mut lines = stdin.lock().lines();
    let mut next = |what: &str| {
        let l = lines.next().unwrap().unwrap();
        let rest = l.strip_prefix(what).unwrap_or_else(|| panic!("{l}"));
        rest.trim().to_owned()
    };
    let mut keep = Vec::new();
    for _ in 0..qps {
        let mine = PreparedVerbs::new(&ctx, &pd, &QpConfig::default()).unwrap();
        say(&format!("ep {}", hex(&mine.endpoint().encode())));
        let peer = Endpoint::decode(&unhex(&next("ep"))).unwrap();
        keep.push(mine.handshake(&peer).unwrap());
    }
    say("ready");
    next("done");
    let w: Vec<String> = (0..WORDS)
        .map(|i| words.load_u64(i * 8).unwrap().to_string())
        .collect();
    say(&format!("words {}", w.join(" ")));
    drop(keep);
}

#[test]
fn both_operations_in_every_style_against_another_process() {
    let (_ctx, pd, t, mut chans) =
        target!("both_operations_in_every_style_against_another_process", 1);
    let a = &mut chans[0];
    let (mut r0, mut r1) = (
        page(&pd, AccessFlags::LOCAL_WRITE),
        page(&pd, AccessFlags::LOCAL_WRITE),
    );

    // Blocking: word 0 counts, word 1 is a lock.
    a.fetch_add(&mut r0.sge_mut(0..8).unwrap(), t.at(0), 5)
        .unwrap();
    a.fetch_add(&mut r0.sge_mut(0..8).unwrap(), t.at(0), 2)
        .unwrap();
    assert_eq!(r0.load_u64(0), Some(5));
    a.compare_swap(&mut r0.sge_mut(0..8).unwrap(), t.at(1), 0, 0xaa)
        .unwrap();
    assert_eq!(r0.load_u64(0), Some(0), "won");
    // A compare-and-swap that loses returns the current value and changes nothing.
    a.compare_swap(&mut r0.sge_mut(0..8).unwrap(), t.at(1), 0, 0xbb)
        .unwrap();
    assert_eq!(r0.load_u64(0), Some(0xaa), "lost, and saw the holder");

    // Batched, one doorbell.
    {
        let (mut e0, mut e1) = (r0.sge_mut(0..8).unwrap(), r1.sge_mut(0..8).unwrap());
        let mut batch = a.batch();
        batch.fetch_add(&mut e0, t.at(0), 10).unwrap();
        batch.compare_swap(&mut e1, t.at(1), 0xaa, 0xcc).unwrap();
        batch.run().unwrap();
    }
    assert_eq!((r0.load_u64(0), r1.load_u64(0)), (Some(7), Some(0xaa)));

    // Scoped.
    {
        let (mut e0, mut e1) = (r0.sge_mut(8..16).unwrap(), r1.sge_mut(8..16).unwrap());
        a.scope(|s| {
            s.fetch_add(&mut e0, t.at(2), 1)?;
            s.compare_swap(&mut e1, t.at(3), 0, u64::MAX)
        })
        .unwrap()
        .unwrap();
    }
    assert_eq!((r0.load_u64(8), r1.load_u64(8)), (Some(0), Some(0)));

    // Tickets.
    {
        let (mut e0, mut e1) = (r0.sge_mut(16..24).unwrap(), r1.sge_mut(16..24).unwrap());
        // SAFETY: both entries stay borrowed and untouched until the waits below.
        let t0 = unsafe { a.post_fetch_add(&mut e0, t.at(0), 100) }.unwrap();
        // SAFETY: as above.
        let t1 = unsafe { a.post_compare_swap(&mut e1, t.at(3), u64::MAX, 3) }.unwrap();
        a.wait(t0).unwrap();
        a.wait(t1).unwrap();
    }
    assert_eq!(
        (r0.load_u64(16), r1.load_u64(16)),
        (Some(17), Some(u64::MAX))
    );
    assert!(a.fault().is_none());
    drop(chans);
    let words = t.finish();
    assert_eq!(&words[..4], &[117, 0xcc, 1, 3], "{words:?}");
}

#[test]
fn a_counter_three_ranks_increment_at_once_ends_exact() {
    const PER_RANK: u64 = 1000;
    let (_ctx, pd, t, chans) = target!("a_counter_three_ranks_increment_at_once_ends_exact", 3);
    let counter = t.at(0);
    let priors: Vec<Vec<u64>> = std::thread::scope(|s| {
        let ranks: Vec<_> = chans
            .into_iter()
            .map(|mut c| {
                let pd = pd.clone();
                s.spawn(move || {
                    let mut r = page(&pd, AccessFlags::LOCAL_WRITE);
                    (0..PER_RANK)
                        .map(|_| {
                            c.fetch_add(&mut r.sge_mut(0..8).unwrap(), counter, 1)
                                .unwrap();
                            r.load_u64(0).unwrap()
                        })
                        .collect()
                })
            })
            .collect();
        ranks.into_iter().map(|h| h.join().unwrap()).collect()
    });
    let mut all: Vec<u64> = priors.concat();
    all.sort_unstable();
    let expected: Vec<u64> = (0..3 * PER_RANK).collect();
    assert!(all == expected, "every prior value exactly once");
    for (rank, p) in priors.iter().enumerate() {
        assert!(
            p.windows(2).all(|w| w[0] < w[1]),
            "rank {rank}: not increasing"
        );
    }
    assert_eq!(t.finish()[0], 3 * PER_RANK);
}

#[test]
fn a_misaligned_target_is_refused_before_posting() {
    let (_ctx, pd, t, mut chans) = target!("a_misaligned_target_is_refused_before_posting", 1);
    let a = &mut chans[0];
    let mut r = page(&pd, AccessFlags::LOCAL_WRITE);
    let odd = t.words.slice(4, 8).unwrap();
    let err = a
        .fetch_add(&mut r.sge_mut(0..8).unwrap(), odd, 1)
        .unwrap_err();
    assert_eq!(
        err,
        ChannelError::InvalidAtomic(AtomicFault::RemoteMisaligned { addr: odd.addr })
    );
    let err = a
        .compare_swap(&mut r.sge_mut(4..12).unwrap(), t.at(0), 0, 1)
        .unwrap_err();
    assert!(
        matches!(
            err,
            ChannelError::InvalidAtomic(AtomicFault::ResultMisaligned { .. })
        ),
        "{err}"
    );
    assert_eq!(a.sends_completed(), 0, "nothing was posted");
    assert_eq!(a.outstanding_sends(), 0, "nothing was posted");
    // The channel is intact.
    a.fetch_add(&mut r.sge_mut(0..8).unwrap(), t.at(0), 1)
        .unwrap();
    drop(chans);
    assert_eq!(t.finish()[0], 1);
}

#[test]
fn an_atomic_on_memory_without_remote_atomic_access_fails_on_the_device() {
    let (_ctx, pd, t, mut chans) = target!(
        "an_atomic_on_memory_without_remote_atomic_access_fails_on_the_device",
        1
    );
    let a = &mut chans[0];
    let mut r = page(&pd, AccessFlags::LOCAL_WRITE);
    let err = a
        .fetch_add(&mut r.sge_mut(0..8).unwrap(), t.no_atomics, 1)
        .unwrap_err();
    match err {
        ChannelError::Failed(w) => {
            assert_eq!(w.status, WcStatus::RemoteAccess, "{w}");
            eprintln!("atomic without REMOTE_ATOMIC: {w}");
        }
        other => panic!("expected a failed completion, got {other:?}"),
    }
    assert!(matches!(
        a.fetch_add(&mut r.sge_mut(0..8).unwrap(), t.at(0), 1),
        Err(ChannelError::Broken(_))
    ));
    drop(chans);
    assert_eq!(t.finish()[0], 0, "nothing landed");
}

#[test]
fn max_rd_atomic_is_clamped_to_the_device() {
    let (ctx, pd) = setup!("max_rd_atomic_is_clamped_to_the_device");
    let dev = ctx.query_device().unwrap();
    let mut qp = QpConfig::default();
    qp.max_rd_atomic = u8::MAX;
    let a = PreparedVerbs::new(&ctx, &pd, &qp).unwrap();
    let b = PreparedVerbs::new(&ctx, &pd, &qp).unwrap();
    let (ea, eb) = (a.endpoint(), b.endpoint());
    let a = a
        .handshake(&eb)
        .expect("RTR/RTS with a clamped max_rd_atomic");
    let _b = b.handshake(&ea).unwrap();
    let rd = a.qp().rd_atomic();
    eprintln!(
        "device: max_qp_init_rd_atom {}, max_qp_rd_atom {}; queue pair: {rd:?}",
        dev.max_qp_init_rd_atom, dev.max_qp_rd_atom
    );
    assert_eq!(u32::from(rd.initiator), dev.max_qp_init_rd_atom.min(255));
    assert_eq!(u32::from(rd.responder), dev.max_qp_rd_atom.min(255));
}
