//! Both send paths through the instant device's driver: the extended one
//! (`verbs/send_ex.rs`: `ibv_wr_start`, a builder per request, `ibv_wr_complete`) on
//! `InstantDevice::new`, and the legacy send chain (`verbs/send_chain.rs`) on
//! `InstantDevice::legacy`, whose driver walks the `ibv_send_wr` list it is given the way a
//! real driver does. On both, every post hands the driver exactly its own requests (the list
//! ends after the last one, whatever longer post came before), with their ids and opcodes,
//! and a post longer than a chain is refused whole. The legacy device says why it falls back;
//! a failed `ibv_wr_complete` runs nothing and counts the batch posted. And the device's
//! `Arrivals`, with which the cost bench plays a peer's sends.

use rverbs_core::completion::{Completion, CompletionKind};
use rverbs_core::instant::{InstantCq, InstantDevice, InstantQp};
use rverbs_core::params::QpCaps;
use rverbs_core::provider::{CompletionQueue, QueuePair};
use rverbs_core::verbs::{LegacyReason, PostPath};
use rverbs_core::wr::{AtomicOp, Opcode, PostFailure, SendFlags, WorkRequest, MAX_BATCH};
use rverbs_testkit::signaled;

/// Both kinds of instant device, and the path rverbs must take on each.
fn devices() -> [(InstantDevice, PostPath); 2] {
    [
        (InstantDevice::new(), PostPath::Extended),
        (
            InstantDevice::legacy(),
            PostPath::Legacy(LegacyReason::MissingOp { op: "wr_start" }),
        ),
    ]
}

/// On each kind of instant device, a queue pair of [`caps`] whose sends complete into a queue
/// of `send_depth`, checked to post on the path rverbs must take there; `test` gets it, its
/// send completion queue and that path.
fn on_each_device(send_depth: u32, test: impl Fn(&mut InstantQp, &mut InstantCq, PostPath)) {
    for (dev, path) in devices() {
        let mut send_cq = dev.cq(send_depth);
        let recv_cq = dev.cq(16);
        let mut qp = dev.qp(&send_cq, &recv_cq, caps());
        assert_eq!(qp.post_path(), path);
        test(&mut qp, &mut send_cq, path);
    }
}

fn caps() -> QpCaps {
    QpCaps::queues(256, 16)
}

/// Everything the send queue completed so far.
fn drain(cq: &mut impl CompletionQueue) -> Vec<Completion> {
    let mut out = Vec::new();
    let mut wc = [Completion::EMPTY; 16];
    loop {
        let n = cq.poll(&mut wc).unwrap();
        if n == 0 {
            return out;
        }
        out.extend_from_slice(&wc[..n]);
    }
}

#[test]
fn each_post_hands_the_driver_exactly_its_requests() {
    on_each_device(1024, each_post_hands_the_driver_exactly_its_requests_on);
}

fn each_post_hands_the_driver_exactly_its_requests_on(
    qp: &mut InstantQp,
    send_cq: &mut InstantCq,
    _: PostPath,
) {
    let ids = |c: &[Completion]| c.iter().map(|c| c.wr_id).collect::<Vec<_>>();

    // A full chain, then shorter ones: a list not ended after its last request would run on
    // into the stale entries of the longer post before it.
    let full: Vec<_> = (0..MAX_BATCH as u64)
        .map(|i| signaled(100 + i, Opcode::Write))
        .collect();
    // SAFETY: the instant device touches no memory.
    unsafe { qp.post_send(&full) }.unwrap();
    assert_eq!(
        ids(&drain(send_cq)),
        (100..100 + MAX_BATCH as u64).collect::<Vec<_>>()
    );
    for n in [3usize, 1, 2, 1] {
        let wrs: Vec<_> = (0..n as u64)
            .map(|i| signaled(1000 * n as u64 + i, Opcode::Send))
            .collect();
        // SAFETY: as above.
        unsafe { qp.post_send(&wrs) }.unwrap();
        assert_eq!(ids(&drain(send_cq)), ids_of(&wrs), "a post of {n}");
    }

    // Empty: nothing posted, nothing completes.
    // SAFETY: as above.
    unsafe { qp.post_send(&[]) }.unwrap();
    assert!(drain(send_cq).is_empty());

    // Longer than a chain: refused whole with EINVAL.
    let over: Vec<_> = (0..MAX_BATCH as u64 + 1)
        .map(|i| signaled(i, Opcode::Write))
        .collect();
    // SAFETY: as above.
    let f = unsafe { qp.post_send(&over) }.unwrap_err();
    assert_eq!((f.posted, f.errno), (0, 22));
    assert!(drain(send_cq).is_empty());

    // After the refusal the chain still serves full and single posts.
    // SAFETY: as above.
    unsafe { qp.post_send(&full) }.unwrap();
    assert_eq!(drain(send_cq).len(), MAX_BATCH);
    // SAFETY: as above.
    unsafe { qp.post_send(&full[..1]) }.unwrap();
    assert_eq!(ids(&drain(send_cq)), vec![100]);
}

fn ids_of(wrs: &[WorkRequest<'_>]) -> Vec<u64> {
    wrs.iter().map(|w| w.wr_id).collect()
}

#[test]
fn every_opcode_reaches_the_driver_as_its_verb() {
    on_each_device(64, every_opcode_reaches_the_driver_as_its_verb_on);
}

fn every_opcode_reaches_the_driver_as_its_verb_on(
    qp: &mut InstantQp,
    send_cq: &mut InstantCq,
    _: PostPath,
) {
    let cases = [
        (Opcode::Send, CompletionKind::Send),
        (Opcode::SendImm(5), CompletionKind::Send),
        (Opcode::Write, CompletionKind::Write),
        (Opcode::WriteImm(6), CompletionKind::Write),
        (Opcode::Read, CompletionKind::Read),
        (
            Opcode::Atomic(AtomicOp::CompareSwap {
                compare: 1,
                swap: 2,
            }),
            CompletionKind::Atomic,
        ),
        (
            Opcode::Atomic(AtomicOp::FetchAdd(3)),
            CompletionKind::Atomic,
        ),
    ];
    let wrs: Vec<_> = cases
        .iter()
        .enumerate()
        .map(|(i, (op, _))| signaled(i as u64, *op))
        .collect();
    // SAFETY: the instant device touches no memory.
    unsafe { qp.post_send(&wrs) }.unwrap();
    let done = drain(send_cq);
    assert_eq!(done.len(), cases.len());
    for (c, (op, kind)) in done.iter().zip(cases) {
        assert_eq!(c.kind, kind, "{op:?}");
        assert!(c.status.is_success());
    }
    // Unsignaled requests complete silently; the signaled one after them does.
    let mut quiet = signaled(50, Opcode::Write);
    quiet.flags = SendFlags::empty();
    let wrs = [quiet, quiet, signaled(52, Opcode::Write)];
    // SAFETY: as above.
    unsafe { qp.post_send(&wrs) }.unwrap();
    assert_eq!(
        drain(send_cq).iter().map(|c| c.wr_id).collect::<Vec<_>>(),
        vec![52]
    );
}

/// `Arrivals` completes the oldest posted receive with the length and immediate given (so a
/// `RecvRing` hands out its slots in order), and refuses when no receive is posted.
#[test]
fn arrivals_complete_the_oldest_posted_receive() {
    use rverbs_core::channel::{Channel, ChannelConfig, RecvRing};
    use rverbs_core::memory::AccessFlags;
    use rverbs_core::poll::StepClock;

    static CLOCK: StepClock = StepClock::new(core::time::Duration::from_micros(1));
    let dev = InstantDevice::new();
    let prov = dev.provider(caps());
    let arrivals = prov.arrivals();
    assert!(!arrivals.deliver(8, None), "no receive is posted yet");
    let chan = Channel::new(prov, ChannelConfig::default(), &CLOCK);
    let mut ring = RecvRing::new(chan, dev.region(4 * 16, AccessFlags::LOCAL_WRITE), 16).unwrap();
    assert_eq!(ring.slots(), 4);
    assert!(ring.try_recv().is_none(), "nothing arrived");
    for (len, imm) in [(5, Some(9)), (16, None), (1, Some(0xdead_beef))] {
        assert!(arrivals.deliver(len, imm));
        let m = ring.try_recv().expect("arrived").expect("received");
        assert_eq!(
            (m.data.len(), m.done.imm, m.done.written),
            (len as usize, imm, false)
        );
    }
    // Four slots, three re-posted so far (the last lent out): three more arrive, then none.
    for _ in 0..3 {
        assert!(arrivals.deliver(8, None));
    }
    assert!(!arrivals.deliver(8, None), "every posted receive is taken");
}

/// The instant device's datagram queue pair under a `Datagram` endpoint (what the cost bench
/// measures datagram sends on): inline and slot sends complete, `wait_sent` retires them,
/// nothing ever arrives, multicast is refused, and dropping the endpoint drains it.
#[test]
fn datagram_sends_complete_on_the_instant_device() {
    for (dev, path) in devices() {
        datagram_sends_complete_on(&dev, path);
    }
}

fn datagram_sends_complete_on(dev: &InstantDevice, path: PostPath) {
    use rverbs_core::datagram::{memory_needed, Datagram, DatagramConfig, Group};
    use rverbs_core::memory::AccessFlags;
    use rverbs_core::poll::StepClock;
    use rverbs_core::provider::datagram::DatagramProvider;

    static CLOCK: StepClock = StepClock::new(core::time::Duration::from_micros(1));
    let dg = dev.datagram(caps());
    assert_eq!(dg.post_path(), path);
    let mut cfg = DatagramConfig::default();
    cfg.recv_slots = 8;
    let mem = dev.region(memory_needed(dg.mtu(), &cfg), AccessFlags::LOCAL_WRITE);
    let mut ep = Datagram::new(dg, mem, cfg, &CLOCK).unwrap();
    let to = ep.peer(&ep.endpoint()).unwrap();
    for _ in 0..40 {
        ep.send(&to, b"12345678").unwrap();
    }
    // Past the inline limit (64): through a send slot.
    ep.send(&to, &[7u8; 200]).unwrap();
    ep.wait_sent().unwrap();
    assert_eq!(ep.outstanding_sends(), 0);
    let stats = ep.stats();
    assert_eq!((stats.sent, stats.sent_inline), (41, 40));
    assert!(
        ep.try_recv().is_none(),
        "the instant device delivers nothing"
    );
    assert!(ep.join(Group::ipv4([239, 1, 2, 3]).unwrap()).is_err());
    drop(ep);
}

/// The legacy device models a provider whose queue pairs lack the `ibv_wr_*` entry points:
/// rverbs says so (the first one it missed) and posts through `ibv_post_send`, and a channel
/// on it works as on the extended device.
#[test]
fn the_legacy_fallback_works_and_says_why() {
    use rverbs_core::channel::{Channel, ChannelConfig};
    use rverbs_core::memory::AccessFlags;
    use rverbs_core::poll::StepClock;

    static CLOCK: StepClock = StepClock::new(core::time::Duration::from_micros(1));
    let dev = InstantDevice::legacy();
    let prov = dev.provider(caps());
    let why = PostPath::Legacy(LegacyReason::MissingOp { op: "wr_start" });
    assert_eq!(prov.post_path(), why);
    assert!(prov.raw_qp_ex().is_none());
    assert_eq!(
        why.to_string(),
        "legacy verbs (ibv_post_send): the provider's queue pair has no wr_start"
    );
    let src = dev.region(64, AccessFlags::LOCAL_WRITE);
    let dst = dev.region(64, AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE);
    let mut chan = Channel::new(prov, ChannelConfig::default(), &CLOCK);
    for _ in 0..40 {
        chan.write(&[src.sge(0..8).unwrap()], dst.remote().slice(0, 8).unwrap())
            .unwrap();
        chan.write_inline(b"12345678", dst.remote().slice(8, 8).unwrap())
            .unwrap();
    }
    assert_eq!(chan.outstanding_sends(), 0);
    assert_eq!(chan.counters().requests_posted, 80);

    let ext = InstantDevice::new().provider(caps());
    assert_eq!(ext.post_path(), PostPath::Extended);
    assert!(ext.raw_qp_ex().is_some());
}

/// A post the driver cannot take whole (no room in the send completion queue for its
/// completions): on the extended path `ibv_wr_complete` fails and runs none of it, and rverbs
/// counts the whole batch posted (rxe's `wr_complete` can fail after publishing it: see
/// `verbs::send_ex`); on the legacy path the driver names the first request it refused and
/// has run those before it.
#[test]
fn a_refused_post_reports_what_the_device_may_run() {
    on_each_device(2, |qp, send_cq, path| {
        let wrs: Vec<_> = (0..3).map(|i| signaled(i, Opcode::Write)).collect();
        // SAFETY: the instant device touches no memory.
        let f = unsafe { qp.post_send(&wrs) }.unwrap_err();
        let done = drain(send_cq);
        if path.is_extended() {
            assert_eq!(
                f,
                PostFailure {
                    posted: 3,
                    errno: 12
                }
            );
            assert!(done.is_empty(), "nothing of a failed section runs");
        } else {
            assert_eq!(
                f,
                PostFailure {
                    posted: 2,
                    errno: 12
                }
            );
            assert_eq!(done.iter().map(|c| c.wr_id).collect::<Vec<_>>(), [0, 1]);
        }
        // The queue pair takes posts again afterwards.
        // SAFETY: as above.
        unsafe { qp.post_send(&wrs[..1]) }.unwrap();
        assert_eq!(drain(send_cq).len(), 1);
    });
}

/// A request of several gather entries goes through the legacy chain even on the extended
/// path (rxe sums an entry list wrongly in `wr_set_sge_list`: see `verbs::send_ex`); the
/// batch it is in completes whole, and the next one-entry post is extended again.
#[test]
fn a_many_entry_request_is_posted_whole() {
    use rverbs_core::memory::AccessFlags;

    let dev = InstantDevice::new();
    let mut send_cq = dev.cq(64);
    let recv_cq = dev.cq(16);
    let mut qp = dev.qp(&send_cq, &recv_cq, caps());
    let src = dev.region(64, AccessFlags::LOCAL_WRITE);
    let two = [src.sge(0..8).unwrap(), src.sge(8..16).unwrap()];
    let one = [src.sge(0..8).unwrap()];
    let mut wrs = [
        signaled(1, Opcode::Write),
        signaled(2, Opcode::Send),
        signaled(3, Opcode::Write),
    ];
    wrs[0].sges = &one;
    wrs[1].sges = &two;
    wrs[2].sges = &one;
    // SAFETY: the instant device touches no memory.
    unsafe { qp.post_send(&wrs) }.unwrap();
    assert_eq!(
        drain(&mut send_cq)
            .iter()
            .map(|c| c.wr_id)
            .collect::<Vec<_>>(),
        [1, 2, 3]
    );
    // SAFETY: as above.
    unsafe { qp.post_send(&wrs[2..]) }.unwrap();
    assert_eq!(
        drain(&mut send_cq)
            .iter()
            .map(|c| c.wr_id)
            .collect::<Vec<_>>(),
        [3]
    );
    assert_eq!(qp.post_path(), PostPath::Extended);
}

mod batches {
    //! Batches built in the queue pair's own `ibv_send_wr` list as they are pushed (the
    //! instant device, both kinds) against the staged batches of the model: one program of
    //! batches runs on each, and the device must see the same requests signaled, with the
    //! same ids, in the same order, and the channel must count the same receives consumed at
    //! the peer and the same requests completed.

    use core::cell::RefCell;
    use std::rc::Rc;

    use rverbs_core::channel::{Channel, ChannelConfig, ChannelError};
    use rverbs_core::completion::{Completion, WcStatus};
    use rverbs_core::instant::InstantDevice;
    use rverbs_core::memory::AccessFlags;
    use rverbs_core::model::{Side, SoftFabric};
    use rverbs_core::params::{QpCaps, RetryCount, RnrRetry};
    use rverbs_core::poll::StepClock;
    use rverbs_core::provider::{Provider, ProviderError, QueuePair, SendList};
    use rverbs_core::sge::{RemoteMemory, Sge, SgeMut};
    use rverbs_core::wr::{PostFailure, WorkRequest};

    static CLOCK: StepClock = StepClock::new(core::time::Duration::from_micros(1));

    /// A provider that keeps a copy of every send completion it hands the channel.
    struct Recording<P> {
        inner: P,
        seen: Rc<RefCell<Vec<(u64, WcStatus)>>>,
    }

    impl<P: Provider> QueuePair for Recording<P> {
        rverbs_testkit::forward_queue_pair!(inner);

        unsafe fn post_send(&mut self, wrs: &[WorkRequest<'_>]) -> Result<(), PostFailure> {
            // SAFETY: forwarded contract.
            unsafe { self.inner.post_send(wrs) }
        }
        unsafe fn send_list(&mut self) -> Option<SendList> {
            // SAFETY: forwarded contract: the list is the wrapped queue pair's, which this
            // provider posts to and reports the completions of.
            unsafe { self.inner.send_list() }
        }
        fn set_error(&mut self) -> Result<(), ProviderError> {
            self.inner.set_error()
        }
    }

    impl<P: Provider> Provider for Recording<P> {
        fn poll_send(&mut self, out: &mut [Completion]) -> Result<usize, ProviderError> {
            let n = self.inner.poll_send(out)?;
            let mut seen = self.seen.borrow_mut();
            seen.extend(out[..n].iter().map(|c| (c.wr_id, c.status)));
            Ok(n)
        }
        fn poll_recv(&mut self, out: &mut [Completion]) -> Result<usize, ProviderError> {
            self.inner.poll_recv(out)
        }
    }

    /// What a run of [`program`] leaves behind.
    #[derive(Debug, PartialEq)]
    struct Outcome {
        signaled: Vec<(u64, WcStatus)>,
        remote_recvs_used: u64,
        sends_completed: u64,
        full: ChannelError,
    }

    fn caps() -> QpCaps {
        QpCaps::queues(64, 16).with_sges(2)
    }

    /// Batches of every kind of push, the flags set after a push, a full batch, a forgotten
    /// one and a posted one; `in_place` is whether this channel's batches are built in the
    /// queue pair's list (checked, so the test cannot pass on the wrong path).
    fn program<'b, P: Provider>(
        chan: &mut Channel<Recording<P>>,
        seen: &Rc<RefCell<Vec<(u64, WcStatus)>>>,
        in_place: bool,
        src: &'b [Sge<'b>],
        scatter: &'b mut [SgeMut<'b>],
        at: &dyn Fn(u64) -> RemoteMemory,
    ) -> Outcome {
        assert_eq!(chan.signal_every(), 16);
        let mut b = chan.batch();
        assert!(format!("{b:?}").contains(&format!("built_in_place: {in_place}")));
        // 20 writes cross the signaling interval (the 16th is signaled).
        for i in 0..20 {
            b.write(src, at(i * 8)).unwrap();
        }
        b.write_imm(src, at(160), 7).unwrap().fence();
        b.send_inline(b"").unwrap();
        b.write_inline(b"12345678", at(168)).unwrap().solicited();
        b.read(scatter, at(176)).unwrap();
        // Signaled mid-batch: the interval counts on from it.
        b.write(src, at(184)).unwrap().signaled();
        for i in 0..3 {
            b.write(src, at(192 + i * 8)).unwrap();
        }
        assert_eq!(b.len(), 28);
        b.run().unwrap();
        assert!(b.is_empty());
        drop(b);
        assert_eq!(chan.outstanding_sends(), 0);

        // A full batch refuses the push after max_post, and posts those it holds.
        let max = chan.max_post();
        let mut b = chan.batch();
        for _ in 0..max {
            b.write(src, at(0)).unwrap();
        }
        let full = b.write(src, at(0)).map(|_| ()).unwrap_err();
        b.run().unwrap();
        drop(b);

        // A forgotten batch leaves nothing posted and the list usable.
        let mut b = chan.batch();
        for i in 0..5 {
            b.write(src, at(i * 8)).unwrap();
        }
        // `Batch` has no `Drop`: forgetting it is dropping it, which is the point (nothing
        // it built is left open); kept as `forget` so a `Drop` added later is tested too.
        #[allow(clippy::forget_non_drop)]
        core::mem::forget(b);
        let before = chan.sends_completed();
        chan.write(src, at(0)).unwrap();
        assert_eq!(chan.sends_completed(), before + 1);

        // A posted batch, waited for by its ticket; an empty one posts nothing.
        let mut b = chan.batch();
        b.send_inline(b"").unwrap();
        b.write(src, at(8)).unwrap();
        b.write(src, at(16)).unwrap();
        // SAFETY: the buffers live past the wait below.
        let t = unsafe { b.post() }.unwrap().expect("three requests");
        // SAFETY: as above.
        assert_eq!(unsafe { b.post() }.unwrap(), None);
        b.run().unwrap();
        drop(b);
        chan.wait(t).unwrap();
        chan.wait_all().unwrap();
        let signaled = seen.borrow().clone();
        Outcome {
            signaled,
            remote_recvs_used: chan.remote_recvs_used(),
            sends_completed: chan.sends_completed(),
            full,
        }
    }

    fn on_instant(dev: &InstantDevice) -> Outcome {
        let src = dev.region(64, AccessFlags::LOCAL_WRITE);
        let mut scratch = dev.region(8, AccessFlags::LOCAL_WRITE);
        let dst = dev.region(256, AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE);
        let seen = Rc::new(RefCell::new(Vec::new()));
        let p = Recording {
            inner: dev.provider(caps()),
            seen: seen.clone(),
        };
        let mut chan = Channel::new(p, ChannelConfig::default(), &CLOCK);
        let g = [src.sge(0..8).unwrap()];
        let mut s = [scratch.sge_mut(0..8).unwrap()];
        let at = |o| dst.remote().slice(o, 8).unwrap();
        program(&mut chan, &seen, true, &g, &mut s, &at)
    }

    fn on_model() -> Outcome {
        let (mut src, mut dst, mut scratch) = ([7u8; 64], [0u8; 256], [0u8; 8]);
        let fabric = SoftFabric::new(caps(), RnrRetry::default(), RetryCount::default());
        let src = fabric
            .register(Side::A, &mut src, AccessFlags::LOCAL_WRITE)
            .unwrap();
        let dst = fabric
            .register(
                Side::B,
                &mut dst,
                AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE | AccessFlags::REMOTE_READ,
            )
            .unwrap();
        let (a, b) = fabric.ends().unwrap();
        let seen = Rc::new(RefCell::new(Vec::new()));
        let p = Recording {
            inner: a,
            seen: seen.clone(),
        };
        let mut chan = Channel::new(p, ChannelConfig::default(), &CLOCK);
        let mut peer = Channel::new(b, ChannelConfig::default(), &CLOCK);
        // The receives the program's sends and writes with immediate consume.
        let recvs: Vec<_> = (0..3).map(|_| peer.post_recv_empty().unwrap()).collect();
        let mut scratch = fabric
            .register(Side::A, &mut scratch, AccessFlags::LOCAL_WRITE)
            .unwrap();
        let g = [src.sge(0..8).unwrap()];
        let mut s = [scratch.sge_mut(0..8).unwrap()];
        let at = |o| dst.remote().slice(o, 8).unwrap();
        let out = program(&mut chan, &seen, false, &g, &mut s, &at);
        for t in recvs {
            peer.wait(t).unwrap();
        }
        out
    }

    #[test]
    fn a_batch_built_in_the_list_posts_what_a_staged_batch_posts() {
        let model = on_model();
        // 28 + max_post + 1 + 3 requests; 2 + 1 of them consume a receive at the peer.
        assert_eq!(model.remote_recvs_used, 3);
        assert!(matches!(model.full, ChannelError::BatchFull { .. }));
        assert!(model.signaled.iter().all(|(_, s)| *s == WcStatus::Success));
        // The 16th write (id 15), the one marked signaled (id 24), the last of the batch
        // (27): the interval and the flags set after a push.
        assert_eq!(
            &model.signaled[..3],
            &[15, 24, 27].map(|id| (id, WcStatus::Success))
        );
        for dev in [InstantDevice::new(), InstantDevice::legacy()] {
            assert_eq!(on_instant(&dev), model);
        }
    }

    /// An instant queue pair with a send completion queue smaller than its send queue, so
    /// that the driver refuses a post half way (no room for a completion), naming the request
    /// it refused.
    struct Cramped {
        qp: rverbs_core::instant::InstantQp,
        send: rverbs_core::instant::InstantCq,
        recv: rverbs_core::instant::InstantCq,
    }

    impl QueuePair for Cramped {
        rverbs_testkit::forward_queue_pair!(qp);

        unsafe fn post_send(&mut self, wrs: &[WorkRequest<'_>]) -> Result<(), PostFailure> {
            // SAFETY: forwarded contract.
            unsafe { self.qp.post_send(wrs) }
        }
        unsafe fn send_list(&mut self) -> Option<SendList> {
            // SAFETY: forwarded contract: the list is the queue pair's this provider posts to
            // and reports the completions of.
            unsafe { self.qp.send_list() }
        }
        fn set_error(&mut self) -> Result<(), ProviderError> {
            self.qp.set_error()
        }
    }

    impl Provider for Cramped {
        fn poll_send(&mut self, out: &mut [Completion]) -> Result<usize, ProviderError> {
            rverbs_core::provider::CompletionQueue::poll(&mut self.send, out)
        }
        fn poll_recv(&mut self, out: &mut [Completion]) -> Result<usize, ProviderError> {
            rverbs_core::provider::CompletionQueue::poll(&mut self.recv, out)
        }
    }

    /// A post the device refuses half way: the requests it took are counted (their ids, the
    /// receives they consume at the peer), the channel breaks and waits for them before it
    /// returns the error, and the batch is empty afterwards.
    #[test]
    fn a_batch_refused_half_way_counts_what_the_device_took() {
        for dev in [InstantDevice::new(), InstantDevice::legacy()] {
            let send = dev.cq(4);
            let cap = rverbs_core::provider::CompletionQueue::capacity(&send) as usize;
            let recv = dev.cq(16);
            let qp = dev.qp(&send, &recv, caps());
            let mut chan =
                Channel::new(Cramped { qp, send, recv }, ChannelConfig::default(), &CLOCK);
            let src = dev.region(8, AccessFlags::LOCAL_WRITE);
            let dst = dev.region(8, AccessFlags::REMOTE_WRITE | AccessFlags::LOCAL_WRITE);
            let g = [src.sge(0..8).unwrap()];
            let to = dst.remote();
            let mut b = chan.batch();
            assert!(format!("{b:?}").contains("built_in_place: true"));
            // Every request signaled, two more than the completion queue holds; of those
            // the device takes, every other one consumes a receive at the peer.
            for i in 0..cap + 2 {
                if i % 2 == 0 {
                    b.write_imm(&g, to, i as u32).unwrap().signaled();
                } else {
                    b.write(&g, to).unwrap().signaled();
                }
            }
            let e = b.run().unwrap_err();
            assert_eq!(e, ChannelError::Post { errno: 12 });
            assert!(b.is_empty());
            drop(b);
            assert_eq!(chan.sends_completed(), cap as u64);
            assert_eq!(chan.outstanding_sends(), 0);
            assert_eq!(chan.remote_recvs_used(), cap.div_ceil(2) as u64);
            assert!(chan.fault().is_some());
            // The same batch pushed on after the refusal posts nothing: the channel is
            // broken, and the requests left in the list go nowhere.
            let seen = chan.sends_completed();
            b = chan.batch();
            b.write_imm(&g, to, 1).unwrap();
            b.write(&g, to).unwrap();
            assert!(matches!(b.run(), Err(ChannelError::Broken(_))));
            assert!(b.is_empty());
            drop(b);
            assert_eq!(chan.sends_completed(), seen);
            assert_eq!(chan.remote_recvs_used(), cap.div_ceil(2) as u64);
        }
    }

    /// Batches never posted (one forgotten after crossing the signaling interval, with
    /// inline entries and a request marked signaled; one dropped by a panic between pushes)
    /// leave the channel as they found it: the batches posted next are numbered from 0 and
    /// signaled as if the others had never been built. Returns the signaled ids.
    fn unposted<'b, P: Provider>(
        chan: &mut Channel<Recording<P>>,
        seen: &Rc<RefCell<Vec<(u64, WcStatus)>>>,
        src: &'b [Sge<'b>],
        at: &dyn Fn(u64) -> RemoteMemory,
    ) -> Vec<(u64, WcStatus)> {
        assert_eq!(chan.signal_every(), 16);
        let mut b = chan.batch();
        for i in 0..18 {
            b.write(src, at(i * 8 % 64)).unwrap();
        }
        b.write_imm(src, at(0), 3).unwrap().signaled();
        b.write_inline(b"abcdefgh", at(8)).unwrap();
        b.send_inline(b"").unwrap();
        #[allow(clippy::forget_non_drop)]
        core::mem::forget(b);
        let r = std::panic::catch_unwind(core::panic::AssertUnwindSafe(|| {
            let mut b = chan.batch();
            b.write(src, at(0)).unwrap();
            b.send_inline(b"x").unwrap();
            panic!("between pushes");
        }));
        assert!(r.is_err());
        assert_eq!((chan.sends_completed(), chan.outstanding_sends()), (0, 0));
        assert_eq!(chan.remote_recvs_used(), 0);
        // 20 writes: the 16th (id 15) signaled by the interval, the last (19) by `run`.
        let mut b = chan.batch();
        for i in 0..20 {
            b.write(src, at(i * 8 % 64)).unwrap();
        }
        b.run().unwrap();
        // 17 writes and an inline one: the interval counts from id 19, so id 35, then 37.
        let mut b = chan.batch();
        for i in 0..17 {
            b.write(src, at(i * 8 % 64)).unwrap();
        }
        b.write_inline(b"12345678", at(8)).unwrap();
        b.run().unwrap();
        drop(b);
        chan.wait_all().unwrap();
        assert_eq!(chan.sends_completed(), 38);
        assert_eq!(chan.remote_recvs_used(), 0);
        let ids = seen.borrow().clone();
        ids
    }

    #[test]
    fn batches_never_posted_leave_the_ids_and_the_interval_alone() {
        let want = [15, 19, 35, 37].map(|id| (id, WcStatus::Success)).to_vec();
        let (mut src, mut dst) = ([7u8; 8], [0u8; 64]);
        let fabric = SoftFabric::new(caps(), RnrRetry::default(), RetryCount::default());
        let src = fabric
            .register(Side::A, &mut src, AccessFlags::LOCAL_WRITE)
            .unwrap();
        let dst = fabric
            .register(
                Side::B,
                &mut dst,
                AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE,
            )
            .unwrap();
        let (a, _b) = fabric.ends().unwrap();
        let seen = Rc::new(RefCell::new(Vec::new()));
        let p = Recording {
            inner: a,
            seen: seen.clone(),
        };
        let mut chan = Channel::new(p, ChannelConfig::default(), &CLOCK);
        let g = [src.sge(0..8).unwrap()];
        let at = |o| dst.remote().slice(o, 8).unwrap();
        assert_eq!(unposted(&mut chan, &seen, &g, &at), want, "model");
        for dev in [InstantDevice::new(), InstantDevice::legacy()] {
            let src = dev.region(8, AccessFlags::LOCAL_WRITE);
            let dst = dev.region(64, AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE);
            let seen = Rc::new(RefCell::new(Vec::new()));
            let p = Recording {
                inner: dev.provider(caps()),
                seen: seen.clone(),
            };
            let mut chan = Channel::new(p, ChannelConfig::default(), &CLOCK);
            let g = [src.sge(0..8).unwrap()];
            let at = |o| dst.remote().slice(o, 8).unwrap();
            assert_eq!(unposted(&mut chan, &seen, &g, &at), want, "instant");
        }
    }
}

/// A queue pair on shared completion queues (`RoutedQp`, what a node's channels are) lends
/// its queue pair's send list, so a batch builds the device's requests in it and posts them
/// with no staged copy and no call of `post_send`; their completions come back through the
/// shared queues to the channel as those of any post.
mod routed_batch {
    use core::cell::Cell;
    use std::rc::Rc;

    use rverbs_core::channel::{Channel, ChannelConfig};
    use rverbs_core::instant::{InstantDevice, InstantQp};
    use rverbs_core::memory::AccessFlags;
    use rverbs_core::params::QpCaps;
    use rverbs_core::poll::StepClock;
    use rverbs_core::provider::shared::SharedCqs;
    use rverbs_core::provider::{QueuePair, SendList};
    use rverbs_core::wr::{PostFailure, WorkRequest};

    static CLOCK: StepClock = StepClock::new(core::time::Duration::from_micros(1));

    /// An instant queue pair that counts the posts made through `post_send` (a batch
    /// without the list makes one per run), and lends its list only if told to.
    struct Counting {
        qp: InstantQp,
        posts: Rc<Cell<u32>>,
        lend: bool,
    }

    impl QueuePair for Counting {
        rverbs_testkit::forward_queue_pair!(qp);

        unsafe fn post_send(&mut self, wrs: &[WorkRequest<'_>]) -> Result<(), PostFailure> {
            self.posts.set(self.posts.get() + 1);
            // SAFETY: forwarded contract.
            unsafe { self.qp.post_send(wrs) }
        }
        unsafe fn send_list(&mut self) -> Option<SendList> {
            if !self.lend {
                return None;
            }
            // SAFETY: forwarded contract: the list is the wrapped queue pair's, which this
            // provider posts to and whose completions the shared queues route to it.
            unsafe { self.qp.send_list() }
        }
        fn set_error(&mut self) -> Result<(), rverbs_core::provider::ProviderError> {
            self.qp.set_error()
        }
        fn completion_queues(&self) -> Option<[rverbs_core::provider::CqId; 2]> {
            self.qp.completion_queues()
        }
    }

    /// Runs two batches of three inline writes on a routed channel; how many `post_send`
    /// calls they made.
    fn posts_of_two_batches(lend: bool) -> u32 {
        let dev = InstantDevice::new();
        let (scq, rcq) = (dev.cq(64), dev.cq(64));
        let posts = Rc::new(Cell::new(0));
        let qp = Counting {
            qp: dev.qp(&scq, &rcq, QpCaps::queues(64, 16)),
            posts: posts.clone(),
            lend,
        };
        let shared = SharedCqs::new(scq, rcq, 1);
        let routed = shared.add(qp).map_err(|(_, e)| e).unwrap();
        let mut chan = Channel::new(routed, ChannelConfig::default(), &CLOCK);
        let dst = dev.region(64, AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE);
        let data = [7u8; 8];
        for _ in 0..2 {
            let mut b = chan.batch();
            for i in 0..3 {
                b.write_inline(&data, dst.remote().slice(8 * i, 8).unwrap())
                    .unwrap();
            }
            // Posted and waited for: the completion came back through the shared queues.
            b.run().unwrap();
        }
        assert_eq!(chan.sends_completed(), 6);
        posts.get()
    }

    #[test]
    fn a_batch_on_shared_queues_posts_through_the_queue_pairs_list() {
        assert_eq!(posts_of_two_batches(true), 0);
        // The control: without the list, each run stages and posts once.
        assert_eq!(posts_of_two_batches(false), 2);
    }
}
