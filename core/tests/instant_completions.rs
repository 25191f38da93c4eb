//! Completions through the extended poll (`ibv_start_poll`/`ibv_next_poll`/`ibv_end_poll`,
//! `verbs/cq_ex.rs`) on the instant device, whose queues are `ibv_cq_ex` with a driver's
//! poll functions: the extended path reads the same completions as the legacy `ibv_poll_cq`
//! path, the poll protocol holds (a full `out` ends the batch, the rest stays queued), and
//! hardware timestamps flow from the device's clock to a `Completion`, to a provider and
//! through a `Channel`'s waits.

mod support;

use rverbs_core::completion::{Completion, CompletionKind, WcStatus};
use rverbs_core::instant::{InstantCq, InstantDevice};
use rverbs_core::params::QpCaps;
use rverbs_core::provider::{CompletionQueue, Provider, QueuePair};
use rverbs_core::wr::{AtomicOp, Opcode, RecvRequest};
use rverbs_testkit::signaled;

#[global_allocator]
static GLOBAL: support::Counting = support::Counting;

fn caps() -> QpCaps {
    QpCaps::queues(64, 16)
}

/// Every kind of completion the device makes, into `send_cq` and `recv_cq` of one queue
/// pair: each send opcode, receives with and without an immediate, then the queue pair's
/// error state flushing a posted receive and a send.
fn make_completions(dev: &InstantDevice, send_cq: &InstantCq, recv_cq: &InstantCq) {
    let mut qp = dev.qp(send_cq, recv_cq, caps());
    let wrs = [
        signaled(1, Opcode::Send),
        signaled(2, Opcode::WriteImm(6)),
        signaled(3, Opcode::Read),
        signaled(4, Opcode::Atomic(AtomicOp::FetchAdd(3))),
        signaled(
            5,
            Opcode::Atomic(AtomicOp::CompareSwap {
                compare: 1,
                swap: 2,
            }),
        ),
    ];
    // SAFETY: the instant device touches no memory.
    unsafe { qp.post_send(&wrs) }.unwrap();
    let recvs: Vec<_> = (10..13)
        .map(|wr_id| RecvRequest { wr_id, sges: &[] })
        .collect();
    // SAFETY: as above.
    unsafe { qp.post_recv(&recvs) }.unwrap();
    let arrivals = qp.arrivals();
    assert!(arrivals.deliver(40, Some(0xdead_beef)));
    assert!(arrivals.deliver(7, None));
    qp.set_error().unwrap();
    // SAFETY: as above.
    unsafe { qp.post_send(&[signaled(6, Opcode::Write)]) }.unwrap();
}

fn drain(mut poll: impl FnMut(&mut [Completion]) -> usize) -> Vec<Completion> {
    let mut out = Vec::new();
    let mut wc = [Completion::EMPTY; 16];
    loop {
        let n = poll(&mut wc);
        if n == 0 {
            return out;
        }
        out.extend_from_slice(&wc[..n]);
    }
}

/// The extended path (what `InstantCq`'s `CompletionQueue::poll` and a device `Cq` use)
/// reads every completion as the legacy conversion does: same ids, statuses, kinds,
/// lengths (only where defined), immediates and queue pair numbers; and neither carries a
/// timestamp on a queue made without them.
#[test]
fn the_extended_poll_reads_what_the_legacy_poll_reads() {
    let dev = InstantDevice::new();
    let (mut s1, mut r1) = (dev.cq(64), dev.cq(64));
    let (mut s2, mut r2) = (dev.cq(64), dev.cq(64));
    make_completions(&dev, &s1, &r1);
    make_completions(&dev, &s2, &r2);
    let ext_send = drain(|o| s1.poll(o).unwrap());
    let ext_recv = drain(|o| r1.poll(o).unwrap());
    let leg_send = drain(|o| s2.poll_legacy(o).unwrap());
    let leg_recv = drain(|o| r2.poll_legacy(o).unwrap());
    // The two queue pairs have different numbers; compare everything else.
    let strip = |v: &[Completion]| {
        v.iter()
            .map(|c| Completion { qp_num: 0, ..*c })
            .collect::<Vec<_>>()
    };
    assert_eq!(strip(&ext_send), strip(&leg_send));
    assert_eq!(strip(&ext_recv), strip(&leg_recv));
    assert!(ext_send.iter().all(|c| c.qp_num == ext_send[0].qp_num));
    assert_ne!(ext_send[0].qp_num, leg_send[0].qp_num);

    // And what they read is what was made.
    let kinds: Vec<_> = ext_send
        .iter()
        .map(|c| (c.wr_id, c.kind, c.byte_len))
        .collect();
    assert_eq!(
        kinds,
        vec![
            (1, CompletionKind::Send, 0),
            (2, CompletionKind::Write, 0),
            (3, CompletionKind::Read, 0),
            (4, CompletionKind::Atomic, 0),
            (5, CompletionKind::Atomic, 0),
            (6, CompletionKind::Other, 0),
        ]
    );
    assert_eq!(ext_send[5].status, WcStatus::Flushed);
    let recv: Vec<_> = ext_recv
        .iter()
        .map(|c| (c.wr_id, c.status, c.kind, c.byte_len, c.imm))
        .collect();
    assert_eq!(
        recv,
        vec![
            (
                10,
                WcStatus::Success,
                CompletionKind::Recv,
                40,
                Some(0xdead_beef)
            ),
            (11, WcStatus::Success, CompletionKind::Recv, 7, None),
            (12, WcStatus::Flushed, CompletionKind::Other, 0, None),
        ]
    );
    assert!(ext_send
        .iter()
        .chain(&ext_recv)
        .all(|c| c.timestamp.is_none()));
}

/// A poll takes at most `out.len()` completions (ending the batch there) and leaves the rest
/// queued in order; an empty queue answers 0 (the driver's `ENOENT`), again and again.
#[test]
fn a_short_out_ends_the_batch_and_keeps_the_rest() {
    let dev = InstantDevice::new();
    let (mut send_cq, recv_cq) = (dev.cq(64), dev.cq(16));
    let mut qp = dev.qp(&send_cq, &recv_cq, caps());
    let wrs: Vec<_> = (0..5).map(|i| signaled(i, Opcode::Write)).collect();
    // SAFETY: the instant device touches no memory.
    unsafe { qp.post_send(&wrs) }.unwrap();
    let mut two = [Completion::EMPTY; 2];
    let mut ids = Vec::new();
    for want in [2, 2, 1, 0, 0] {
        let n = send_cq.poll(&mut two).unwrap();
        assert_eq!(n, want);
        ids.extend(two[..n].iter().map(|c| c.wr_id));
    }
    assert_eq!(ids, vec![0, 1, 2, 3, 4]);
    assert_eq!(
        send_cq.poll(&mut []).unwrap(),
        0,
        "an empty out takes nothing"
    );
}

/// A queue made with timestamps gives each successful completion the device's time (its
/// clock ticks once per completion written, so the times rise by one in posting order), the
/// queue remembers the last one polled, and an error completion carries none. The legacy
/// poll of the same queue cannot read them: it gives none.
#[test]
fn timestamps_flow_from_the_device_clock_into_completions() {
    let dev = InstantDevice::new();
    let (mut send_cq, recv_cq) = (dev.cq_with_timestamps(64), dev.cq_with_timestamps(16));
    assert_eq!(send_cq.last_timestamp(), None);
    make_completions(&dev, &send_cq, &recv_cq);
    let done = drain(|o| send_cq.poll(o).unwrap());
    let stamps: Vec<_> = done.iter().map(|c| c.timestamp.map(|t| t.get())).collect();
    assert_eq!(
        stamps,
        vec![Some(1), Some(2), Some(3), Some(4), Some(5), None],
        "one tick per completion; none on the flushed one"
    );
    assert_eq!(
        send_cq.last_timestamp(),
        None,
        "the last poll ended on the flushed completion"
    );
    let mut qp = dev.qp(&send_cq, &recv_cq, caps());
    // SAFETY: the instant device touches no memory.
    unsafe { qp.post_send(&[signaled(7, Opcode::Write), signaled(8, Opcode::Write)]) }.unwrap();
    let mut one = [Completion::EMPTY; 1];
    assert_eq!(send_cq.poll(&mut one).unwrap(), 1);
    assert_eq!(one[0].timestamp.map(|t| t.get()), Some(7));
    assert_eq!(send_cq.last_timestamp().map(|t| t.get()), Some(7));
    assert_eq!(send_cq.poll_legacy(&mut one).unwrap(), 1);
    assert_eq!((one[0].wr_id, one[0].timestamp), (8, None));
}

/// End to end: a `Channel` on a provider whose queues carry timestamps waits for its writes
/// as ever, and after each wait the provider reports the completion time of the request
/// just waited for, rising from write to write; a provider without timestamps reports none.
#[test]
fn a_channel_on_a_timestamped_provider_exposes_each_waited_completion_time() {
    use rverbs_core::channel::{Channel, ChannelConfig};
    use rverbs_core::memory::AccessFlags;
    use rverbs_core::poll::StepClock;

    static CLOCK: StepClock = StepClock::new(core::time::Duration::from_micros(1));
    let dev = InstantDevice::new();
    let src = dev.region(64, AccessFlags::LOCAL_WRITE);
    let peer = dev.region(64, AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE);
    let cfg = ChannelConfig::default();
    let mut chan = Channel::new(dev.provider_with_timestamps(caps()), cfg, &CLOCK);
    assert_eq!(chan.provider().last_send_timestamp(), None);
    let mut seen = Vec::new();
    for _ in 0..3 {
        chan.write(
            &[src.sge(0..8).unwrap()],
            peer.remote().slice(0, 8).unwrap(),
        )
        .unwrap();
        seen.push(
            chan.provider()
                .last_send_timestamp()
                .expect("a waited write has a time")
                .get(),
        );
    }
    assert!(seen.windows(2).all(|w| w[0] < w[1]), "{seen:?}");

    let mut plain = Channel::new(dev.provider(caps()), cfg, &CLOCK);
    plain
        .write(
            &[src.sge(0..8).unwrap()],
            peer.remote().slice(0, 8).unwrap(),
        )
        .unwrap();
    assert_eq!(plain.provider().last_send_timestamp(), None);
}

/// The extended poll allocates nothing, with and without timestamps, full or empty (its
/// documentation says so; the hot path of every wait runs through it).
#[test]
fn the_extended_poll_does_not_allocate() {
    let at_start = support::allocs();
    let dev = InstantDevice::new();
    assert!(
        support::allocs() > at_start,
        "the counting allocator is installed (setup allocates)"
    );
    for timestamps in [false, true] {
        let (mut send_cq, recv_cq) = if timestamps {
            (dev.cq_with_timestamps(64), dev.cq_with_timestamps(16))
        } else {
            (dev.cq(64), dev.cq(16))
        };
        let mut qp = dev.qp(&send_cq, &recv_cq, caps());
        let wrs: Vec<_> = (0..8).map(|i| signaled(i, Opcode::Write)).collect();
        let mut out = [Completion::EMPTY; 16];
        let before = support::allocs();
        let mut taken = 0;
        for _ in 0..100 {
            // SAFETY: the instant device touches no memory.
            unsafe { qp.post_send(&wrs) }.unwrap();
            taken += send_cq.poll(&mut out).unwrap();
            taken += send_cq.poll(&mut out).unwrap();
        }
        assert_eq!(support::allocs() - before, 0, "timestamps {timestamps}");
        assert_eq!(taken, 800);
    }
}
