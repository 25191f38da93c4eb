//! Remote atomics (compare-and-swap, fetch-and-add) over the in-memory models: every posting
//! style, a counter three ranks increment at once, a losing compare-and-swap, and the two
//! ways an atomic is refused (before posting when misaligned; by the responder without
//! remote atomic access). Runs under Miri.
#![allow(clippy::std_instead_of_core)]

use rverbs_core::channel::{Channel, ChannelConfig, ChannelError};
use rverbs_core::completion::{Completion, CompletionKind, WcStatus};
use rverbs_core::memory::AccessFlags;
use rverbs_core::model::{NetCq, NetQp, Side, SoftFabric, SoftNet, SoftNetConfig};
use rverbs_core::multi::{MultiChannel, MultiError, PeerError};
use rverbs_core::params::{QpCaps, RetryCount, RnrRetry};
use rverbs_core::poll::Spin;
use rverbs_core::provider::shared::{RoutedQp, SharedCqs};
use rverbs_core::provider::{Provider, QueuePair};
use rverbs_core::sge::RemoteMemory;
use rverbs_core::wr::{AtomicFault, AtomicOp, Opcode, SendFlags, WorkRequest};
use rverbs_testkit::clock;

/// Remote atomic access (and local write, which the device requires with it).
const ATOMIC: AccessFlags = AccessFlags::LOCAL_WRITE.union(AccessFlags::REMOTE_ATOMIC);

/// Buffers whose words are 8-aligned.
#[repr(align(8))]
struct Words<const N: usize>([u8; N]);

impl<const N: usize> Words<N> {
    fn new() -> Self {
        Self([0; N])
    }
}

fn caps() -> QpCaps {
    QpCaps::queues(16, 16).with_sges(2)
}

fn fabric<'m>() -> SoftFabric<'m> {
    SoftFabric::new(caps(), RnrRetry::Times(3), RetryCount::new(3).unwrap())
}

/// Binds `$f`, a fabric; `$res`, an `$n`-byte local result region on side A; `$word`, an
/// `$m`-byte region on side B registered with `$access`; and `$a`, a channel from A to B (or
/// with `end`, side A's raw queue pair).
macro_rules! pair {
    ($f:ident, $res:ident, $word:ident, end $e:ident; $n:literal, $m:literal, $access:expr) => {
        let (mut mine, mut theirs) = (Words::<$n>::new(), Words::<$m>::new());
        let $f = fabric();
        #[allow(unused_mut)]
        let mut $res = $f
            .register(Side::A, &mut mine.0, AccessFlags::LOCAL_WRITE)
            .unwrap();
        let $word = $f.register(Side::B, &mut theirs.0, $access).unwrap();
        #[allow(unused_mut)]
        let (mut $e, _eb) = $f.ends().unwrap();
    };
    ($f:ident, $res:ident, $word:ident, $a:ident; $n:literal, $m:literal, $access:expr) => {
        pair!($f, $res, $word, end end_a; $n, $m, $access);
        let mut $a = Channel::new(end_a, ChannelConfig::default(), clock!());
    };
}

#[test]
fn both_atomics_on_every_posting_style() {
    pair!(f, res, words, a; 64, 64, ATOMIC);
    let at = |i: u64| words.remote().slice(i * 8, 8).unwrap();
    words.store_u64(0, 100);
    words.store_u64(8, 5);

    // Blocking.
    a.fetch_add(&mut res.sge_mut(0..8).unwrap(), at(0), 1)
        .unwrap();
    assert_eq!((res.load_u64(0), words.load_u64(0)), (Some(100), Some(101)));
    a.compare_swap(&mut res.sge_mut(0..8).unwrap(), at(1), 5, 6)
        .unwrap();
    assert_eq!((res.load_u64(0), words.load_u64(8)), (Some(5), Some(6)));

    // Batched: both in one doorbell, run (post and wait).
    {
        let [mut r0, mut r1] = res.sges_mut([0..8, 8..16]).unwrap();
        let mut batch = a.batch();
        batch.fetch_add(&mut r0, at(0), 10).unwrap();
        batch.compare_swap(&mut r1, at(1), 6, 7).unwrap();
        assert_eq!(batch.len(), 2);
        batch.run().unwrap();
    }
    assert_eq!((res.load_u64(0), res.load_u64(8)), (Some(101), Some(6)));
    assert_eq!((words.load_u64(0), words.load_u64(8)), (Some(111), Some(7)));

    // Batched, posted for a ticket.
    {
        let [mut r0, mut r1] = res.sges_mut([16..24, 24..32]).unwrap();
        let mut batch = a.batch();
        batch.compare_swap(&mut r0, at(1), 7, 8).unwrap();
        batch.fetch_add(&mut r1, at(0), u64::MAX).unwrap(); // wraps: minus one
                                                            // SAFETY: the result entries are borrowed until the wait below, and nothing else
                                                            // touches the region meanwhile.
        let t = unsafe { batch.post() }.unwrap().unwrap();
        assert_eq!(t.len(), 2);
        a.wait(t).unwrap();
    }
    assert_eq!((res.load_u64(16), res.load_u64(24)), (Some(7), Some(111)));
    assert_eq!((words.load_u64(0), words.load_u64(8)), (Some(110), Some(8)));

    // Scoped.
    {
        let [mut r0, mut r1] = res.sges_mut([32..40, 40..48]).unwrap();
        a.scope(|s| {
            let t = s.fetch_add(&mut r0, at(2), 3)?;
            s.compare_swap(&mut r1, at(3), 0, 0xfeed)?;
            s.wait(t)
        })
        .unwrap()
        .unwrap();
    }
    assert_eq!((res.load_u64(32), res.load_u64(40)), (Some(0), Some(0)));
    assert_eq!(
        (words.load_u64(16), words.load_u64(24)),
        (Some(3), Some(0xfeed))
    );

    // Ticket.
    {
        let [mut r0, mut r1] = res.sges_mut([48..56, 56..64]).unwrap();
        // SAFETY: the result entries stay borrowed, and untouched, until the waits below.
        let t0 = unsafe { a.post_fetch_add(&mut r0, at(2), 4) }.unwrap();
        // SAFETY: as above.
        let t1 = unsafe { a.post_compare_swap(&mut r1, at(3), 0xfeed, 1) }.unwrap();
        a.wait(t0).unwrap();
        a.wait(t1).unwrap();
    }
    assert_eq!(
        (res.load_u64(48), res.load_u64(56)),
        (Some(3), Some(0xfeed))
    );
    assert_eq!((words.load_u64(16), words.load_u64(24)), (Some(7), Some(1)));
    assert_eq!(a.outstanding_sends(), 0);
    assert!(a.fault().is_none());
}

#[test]
fn losing_compare_swap_returns_the_current_value() {
    pair!(f, res, word, a; 8, 8, ATOMIC);
    word.store_u64(0, 0x1234_5678_9abc_def0);
    a.compare_swap(&mut res.sge_mut(0..8).unwrap(), word.remote(), 1, 2)
        .unwrap();
    assert_eq!(res.load_u64(0), Some(0x1234_5678_9abc_def0));
    assert_eq!(word.load_u64(0), Some(0x1234_5678_9abc_def0), "no swap");
    // Little-endian on the wire of the model, as on rxe.
    let mut b = [0u8; 8];
    word.read_into(0, &mut b);
    assert_eq!(b, 0x1234_5678_9abc_def0u64.to_le_bytes());
}

/// Channels from `ranks` nodes (1..=ranks) of a net to node 0, each on its node's shared
/// completion queues, as a node builds them.
fn to_node_0<'n>(
    net: &'n SoftNet<'_>,
    ranks: u32,
) -> Vec<Channel<RoutedQp<NetQp<'n>, NetCq<'n>>, Spin>> {
    (1..=ranks)
        .map(|r| {
            let (qp, _at_0) = net.connect(r, 0).unwrap();
            let cqs = SharedCqs::new(net.send_cq(r).unwrap(), net.recv_cq(r).unwrap(), 1);
            let routed = cqs.add(qp).map_err(|(_, e)| e).unwrap();
            let mut cfg = ChannelConfig::default();
            cfg.rank = Some(0);
            Channel::new(routed, cfg, clock!())
        })
        .collect()
}

#[test]
fn a_counter_three_ranks_increment_at_once_ends_exact() {
    const PER_RANK: u64 = if cfg!(miri) { 12 } else { 500 };
    let mut counter = Words::<8>::new();
    let mut results = [Words::<8>::new(), Words::<8>::new(), Words::<8>::new()];
    let net = SoftNet::new(SoftNetConfig::new(4, caps()));
    let target = net.register(0, &mut counter.0, ATOMIC).unwrap();
    let mut res: Vec<_> = results
        .iter_mut()
        .enumerate()
        .map(|(i, w)| {
            net.register(i as u32 + 1, &mut w.0, AccessFlags::LOCAL_WRITE)
                .unwrap()
        })
        .collect();
    let mut chans = to_node_0(&net, 3);
    // Interleaved: every rank has an increment in flight before any is waited for, and
    // every prior value a rank sees is one nobody else saw.
    let mut seen = vec![false; 3 * PER_RANK as usize];
    for _ in 0..PER_RANK {
        let mut tickets = Vec::new();
        for (c, r) in chans.iter_mut().zip(res.iter_mut()) {
            let mut e = r.sge_mut(0..8).unwrap();
            // SAFETY: the result entry is not touched until the wait below, and the region
            // outlives it.
            tickets.push(unsafe { c.post_fetch_add(&mut e, target.remote(), 1) }.unwrap());
        }
        for ((c, r), t) in chans.iter_mut().zip(res.iter()).zip(tickets) {
            c.wait(t).unwrap();
            let prior = r.load_u64(0).unwrap() as usize;
            assert!(!std::mem::replace(&mut seen[prior], true), "{prior} twice");
        }
    }
    assert_eq!(target.load_u64(0), Some(3 * PER_RANK));
    assert!(seen.iter().all(|&s| s));
}

#[test]
fn a_multichannel_runs_atomics_addressed_by_rank() {
    let mut words = [Words::<8>::new(), Words::<8>::new(), Words::<8>::new()];
    let mut mine = Words::<8>::new();
    let net = SoftNet::new(SoftNetConfig::new(4, caps()));
    let targets: Vec<_> = words
        .iter_mut()
        .enumerate()
        .map(|(i, w)| net.register(i as u32 + 1, &mut w.0, ATOMIC).unwrap())
        .collect();
    let mut res = net
        .register(0, &mut mine.0, AccessFlags::LOCAL_WRITE)
        .unwrap();
    let cqs = SharedCqs::new(net.send_cq(0).unwrap(), net.recv_cq(0).unwrap(), 3);
    let chans = (1..=3)
        .map(|r| {
            let (qp, _peer) = net.connect(0, r).unwrap();
            let mut cfg = ChannelConfig::default();
            cfg.rank = Some(r);
            let routed = cqs.add(qp).map_err(|(_, e)| e).unwrap();
            Channel::new(routed, cfg, clock!())
        })
        .collect();
    let mut multi = MultiChannel::new(chans).unwrap();
    for (rank, t) in (1..=3).zip(&targets) {
        t.store_u64(0, u64::from(rank) * 10);
        multi
            .fetch_add(rank, &mut res.sge_mut(0..8).unwrap(), t.remote(), 1)
            .unwrap();
        assert_eq!(res.load_u64(0), Some(u64::from(rank) * 10));
        multi
            .compare_swap(rank, &mut res.sge_mut(0..8).unwrap(), t.remote(), 0, 9)
            .unwrap();
        assert_eq!(res.load_u64(0), Some(u64::from(rank) * 10 + 1), "lost");
        {
            let mut e = res.sge_mut(0..8).unwrap();
            let cur = u64::from(rank) * 10 + 1;
            // SAFETY: the entry stays borrowed and untouched until the wait below.
            let tk = unsafe { multi.post_compare_swap(rank, &mut e, t.remote(), cur, 0) }.unwrap();
            assert_eq!(tk.peer(), Some(rank));
            multi.wait(tk).unwrap();
        }
        assert_eq!(t.load_u64(0), Some(0), "won");
    }
    let misaligned = targets[0].remote().slice(4, 4).unwrap();
    let err = multi
        .fetch_add(1, &mut res.sge_mut(0..8).unwrap(), misaligned, 1)
        .unwrap_err();
    assert!(
        matches!(
            err,
            MultiError::Peer(PeerError {
                rank: 1,
                error: ChannelError::InvalidAtomic(AtomicFault::RemoteMisaligned { .. })
            })
        ),
        "{err}"
    );
}

#[test]
fn misaligned_or_wrongly_sized_atomics_are_refused_before_posting() {
    pair!(f, res, word, a; 16, 16, ATOMIC);
    let remote = word.remote();
    let cases: [(RemoteMemory, core::ops::Range<usize>, AtomicFault); 4] = [
        (
            remote.slice(4, 8).unwrap(),
            0..8,
            AtomicFault::RemoteMisaligned {
                addr: remote.addr + 4,
            },
        ),
        (
            remote.slice(8, 4).unwrap(),
            0..8,
            AtomicFault::RemoteTooShort { len: 4 },
        ),
        (
            remote.slice(8, 8).unwrap(),
            4..12,
            AtomicFault::ResultMisaligned {
                addr: res.sge_mut(4..12).unwrap().addr(),
            },
        ),
        (
            remote.slice(8, 8).unwrap(),
            0..4,
            AtomicFault::ResultLength { len: 4 },
        ),
    ];
    for (target, range, fault) in cases {
        let want = ChannelError::InvalidAtomic(fault);
        let mut e = res.sge_mut(range.clone()).unwrap();
        assert_eq!(a.fetch_add(&mut e, target, 1), Err(want));
        assert_eq!(a.compare_swap(&mut e, target, 0, 1), Err(want));
        // SAFETY: nothing is posted (the call fails before); were it posted, the wait
        // below would cover it.
        assert_eq!(unsafe { a.post_fetch_add(&mut e, target, 1) }, Err(want));
        {
            let mut batch = a.batch();
            assert_eq!(batch.compare_swap(&mut e, target, 0, 1).err(), Some(want));
            assert!(batch.is_empty(), "nothing added");
        }
        let mut e = res.sge_mut(range).unwrap();
        let scoped = a.scope(|s| s.fetch_add(&mut e, target, 1)).unwrap();
        assert_eq!(scoped, Err(want));
        assert!(want
            .to_string()
            .starts_with("atomic refused before posting: "));
    }
    assert_eq!(f.stats(Side::A).sends_posted, 0, "nothing was posted");
    assert!(a.fault().is_none(), "a refusal does not break the channel");
    assert_eq!((word.load_u64(0), word.load_u64(8)), (Some(0), Some(0)));
    // The channel still works.
    a.fetch_add(&mut res.sge_mut(0..8).unwrap(), remote, 1)
        .unwrap();
    assert_eq!(word.load_u64(0), Some(1));
}

#[test]
fn an_atomic_on_memory_without_remote_atomic_access_fails_at_the_peer() {
    let rw = AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE | AccessFlags::REMOTE_READ;
    pair!(f, res, word, a; 8, 8, rw);
    word.store_u64(0, 5);
    let err = a
        .fetch_add(&mut res.sge_mut(0..8).unwrap(), word.remote(), 1)
        .unwrap_err();
    match err {
        ChannelError::Failed(w) => assert_eq!(w.status, WcStatus::RemoteAccess, "{w}"),
        other => panic!("expected a failed completion, got {other:?}"),
    }
    assert_eq!(word.load_u64(0), Some(5), "untouched");
    assert_eq!(res.load_u64(0), Some(0), "no prior value delivered");
    assert!(
        f.in_error(Side::B),
        "the responder moves to the error state"
    );
    assert!(matches!(
        a.compare_swap(&mut res.sge_mut(0..8).unwrap(), word.remote(), 5, 6),
        Err(ChannelError::Broken(_))
    ));
}

/// What the model does with atomics the channel would refuse: the responder's answers
/// (a misaligned address is a NAK-invalid-request) and the post-time `EINVAL`s.
#[test]
fn the_model_answers_raw_atomics_as_a_responder_does() {
    pair!(f, res, word, end ea; 16, 16, ATOMIC);
    let fa = Opcode::Atomic(AtomicOp::FetchAdd(1));
    let mut wc = [Completion::EMPTY; 4];

    // A 4-byte result entry, or an inline atomic: refused at post.
    let short = [res.sge(0..4).unwrap()];
    let inline = [res.sge(0..8).unwrap()];
    for (sges, flags) in [(&short, SendFlags::SIGNALED), (&inline, SendFlags::INLINE)] {
        let wr = WorkRequest::new(fa, flags, sges, word.remote());
        // SAFETY: refused at post, so nothing names the buffers afterwards.
        let e = unsafe { ea.post_send(&[wr]) }.unwrap_err();
        assert_eq!((e.posted, e.errno), (0, 22));
    }

    // A well-formed one completes as an atomic of 8 bytes.
    let e = [res.sge(8..16).unwrap()];
    let mut wr = WorkRequest::atomic(AtomicOp::FetchAdd(2), &e[0], word.remote()).unwrap();
    wr.flags = SendFlags::SIGNALED;
    // SAFETY: the result region outlives the request, polled to completion below.
    unsafe { ea.post_send(&[wr]) }.unwrap();
    assert_eq!(ea.poll_send(&mut wc).unwrap(), 1);
    assert_eq!(
        (wc[0].status, wc[0].kind, wc[0].byte_len),
        (WcStatus::Success, CompletionKind::Atomic, 8)
    );
    assert_eq!(word.load_u64(0), Some(2));

    // Misaligned: the responder's NAK-invalid-request, and both ends in the error state.
    let mut wr = WorkRequest::new(
        fa,
        SendFlags::SIGNALED,
        &e,
        word.remote().slice(4, 8).unwrap(),
    );
    wr.wr_id = 9;
    // SAFETY: as above.
    unsafe { ea.post_send(&[wr]) }.unwrap();
    assert_eq!(ea.poll_send(&mut wc).unwrap(), 1);
    assert_eq!(
        (wc[0].wr_id, wc[0].status),
        (9, WcStatus::RemoteInvalidRequest)
    );
    assert!(f.in_error(Side::A) && f.in_error(Side::B));
    assert_eq!(word.load_u64(0), Some(2), "untouched");
    let _ = res.sge_mut(0..8); // the region is ours again
}
