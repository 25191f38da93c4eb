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
