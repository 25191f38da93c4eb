//! The send chain (`verbs/send_chain.rs`) through the instant device's driver, which walks
//! the `ibv_send_wr` list it is given the way a real driver does: every post hands the
//! driver exactly its own requests (the list ends after the last one, whatever longer post
//! came before), with their ids and opcodes, and a post longer than a chain is refused
//! whole. And the device's `Arrivals`, with which the cost bench plays a peer's sends.

use rverbs_core::completion::{Completion, CompletionKind};
use rverbs_core::params::QpCaps;
use rverbs_core::provider::instant::InstantDevice;
use rverbs_core::provider::{CompletionQueue, QueuePair};
use rverbs_core::sge::RemoteMemory;
use rverbs_core::wr::{AtomicOp, Opcode, SendFlags, WorkRequest, MAX_BATCH};

fn caps() -> QpCaps {
    QpCaps {
        max_send_wr: 256,
        max_recv_wr: 16,
        max_send_sge: 1,
        max_recv_sge: 1,
        max_inline_data: 64,
    }
}

fn signaled(wr_id: u64, opcode: Opcode) -> WorkRequest<'static> {
    let mut w = WorkRequest::new(
        opcode,
        SendFlags::SIGNALED,
        &[],
        RemoteMemory {
            addr: 0x1000,
            len: 8,
            rkey: 7,
        },
    );
    w.wr_id = wr_id;
    w
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
    let dev = InstantDevice::new();
    let mut send_cq = dev.cq(1024);
    let recv_cq = dev.cq(16);
    let mut qp = dev.qp(&send_cq, &recv_cq, caps());
    let ids = |c: &[Completion]| c.iter().map(|c| c.wr_id).collect::<Vec<_>>();

    // A full chain, then shorter ones: a list not ended after its last request would run on
    // into the stale entries of the longer post before it.
    let full: Vec<_> = (0..MAX_BATCH as u64)
        .map(|i| signaled(100 + i, Opcode::Write))
        .collect();
    // SAFETY: the instant device touches no memory.
    unsafe { qp.post_send(&full) }.unwrap();
    assert_eq!(
        ids(&drain(&mut send_cq)),
        (100..100 + MAX_BATCH as u64).collect::<Vec<_>>()
    );
    for n in [3usize, 1, 2, 1] {
        let wrs: Vec<_> = (0..n as u64)
            .map(|i| signaled(1000 * n as u64 + i, Opcode::Send))
            .collect();
        // SAFETY: as above.
        unsafe { qp.post_send(&wrs) }.unwrap();
        assert_eq!(ids(&drain(&mut send_cq)), ids_of(&wrs), "a post of {n}");
    }

    // Empty: nothing posted, nothing completes.
    // SAFETY: as above.
    unsafe { qp.post_send(&[]) }.unwrap();
    assert!(drain(&mut send_cq).is_empty());

    // Longer than a chain: refused whole with EINVAL.
    let over: Vec<_> = (0..MAX_BATCH as u64 + 1)
        .map(|i| signaled(i, Opcode::Write))
        .collect();
    // SAFETY: as above.
    let f = unsafe { qp.post_send(&over) }.unwrap_err();
    assert_eq!((f.posted, f.errno), (0, 22));
    assert!(drain(&mut send_cq).is_empty());

    // After the refusal the chain still serves full and single posts.
    // SAFETY: as above.
    unsafe { qp.post_send(&full) }.unwrap();
    assert_eq!(drain(&mut send_cq).len(), MAX_BATCH);
    // SAFETY: as above.
    unsafe { qp.post_send(&full[..1]) }.unwrap();
    assert_eq!(ids(&drain(&mut send_cq)), vec![100]);
}

fn ids_of(wrs: &[WorkRequest<'_>]) -> Vec<u64> {
    wrs.iter().map(|w| w.wr_id).collect()
}

#[test]
fn every_opcode_reaches_the_driver_as_its_verb() {
    let dev = InstantDevice::new();
    let mut send_cq = dev.cq(64);
    let recv_cq = dev.cq(16);
    let mut qp = dev.qp(&send_cq, &recv_cq, caps());
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
    let done = drain(&mut send_cq);
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
        drain(&mut send_cq)
            .iter()
            .map(|c| c.wr_id)
            .collect::<Vec<_>>(),
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
    use rverbs_core::datagram::{memory_needed, Datagram, DatagramConfig, Group};
    use rverbs_core::memory::AccessFlags;
    use rverbs_core::poll::StepClock;
    use rverbs_core::provider::datagram::DatagramProvider;

    static CLOCK: StepClock = StepClock::new(core::time::Duration::from_micros(1));
    let dev = InstantDevice::new();
    let dg = dev.datagram(caps());
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
