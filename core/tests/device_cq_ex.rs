//! Extended completion queues on a real device: a queue is created with `ibv_create_cq_ex`
//! where the provider has it (rxe does) and says so, its poll (`ibv_start_poll`/
//! `ibv_next_poll`/`ibv_end_poll`, fields read one at a time) reads every kind of completion
//! as the legacy `ibv_poll_cq` path reads it, and hardware completion timestamps are refused
//! at setup, naming the device and the reason, where the device keeps no completion clock
//! (rxe), or flow rising where it does.
#![allow(clippy::std_instead_of_core)] // test code: std is the natural vocabulary here

mod support;

use std::time::Duration;

use rverbs_core::completion::{Completion, CompletionKind, WcStatus};
use rverbs_core::provider::verbs::PreparedVerbs;
use rverbs_core::sge::Sge;
use rverbs_core::verbs::{
    AccessFlags, Context, Cq, CqOptions, PollPath, QpConfig, TimestampRefusal, VerbsError,
};
use rverbs_core::wr::{Opcode, RecvRequest, SendFlags, WorkRequest};

fn is_rxe(ctx: &Context) -> bool {
    ctx.name().starts_with("rxe")
}

/// Runs one of each completion kind between two queue pairs that complete into `cq`: a
/// send with and without an immediate, a write with an immediate (each consuming one of
/// three posted receives of 64 bytes) and a read of 16 bytes. Returns the completions in
/// `wr_id` order, each queue pair's number replaced by 1 (the sender) or 2 (the receiver).
fn every_kind(ctx: &Context, cq: &mut Cq) -> Vec<Completion> {
    let pd = ctx.alloc_pd().unwrap();
    let cfg = QpConfig::default();
    let a = pd.create_rc_qp(cq, cq, &cfg).unwrap();
    let b = pd.create_rc_qp(cq, cq, &cfg).unwrap();
    let (ea, eb) = (a.endpoint(), b.endpoint());
    let mut a = a.handshake(&eb).unwrap();
    let mut b = b.handshake(&ea).unwrap();
    let (qa, qb) = (a.qp_num(), b.qp_num());

    let mut src = *b"0123456789abcdef0123456789abcdef";
    let src_mr = pd.register(&mut src, AccessFlags::LOCAL_WRITE).unwrap();
    let mut dst = pd
        .register_shared(
            vec![0u8; 4096].into_boxed_slice(),
            AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE | AccessFlags::REMOTE_READ,
        )
        .unwrap();
    let recv_entries: Vec<_> = (0..3)
        .map(|i| {
            let e = dst.sge_mut(1024 + 64 * i..1024 + 64 * i + 64).unwrap();
            // SAFETY: 64 bytes of `dst`, which outlives the receives (they complete below,
            // before it is dropped).
            [unsafe { Sge::from_raw(e.addr(), e.len(), e.lkey()) }]
        })
        .collect();
    let recvs: Vec<_> = recv_entries
        .iter()
        .enumerate()
        .map(|(i, s)| RecvRequest {
            wr_id: 100 + i as u64,
            sges: s,
        })
        .collect();
    // SAFETY: as above; the receive buffers are read only after the completions.
    unsafe { b.post_recv(&recvs) }.unwrap();

    let mut back = vec![0u8; 64];
    let back_mr = pd.register(&mut back, AccessFlags::LOCAL_WRITE).unwrap();
    let e = back_mr.sge(0..16).unwrap();
    // SAFETY: 16 bytes of `back`, which outlives the read polled below.
    let read_into = [unsafe { Sge::from_raw(e.addr(), e.len(), e.lkey()) }];
    let remote = dst.remote();
    let w = |wr_id, opcode, sges| WorkRequest {
        wr_id,
        opcode,
        flags: SendFlags::SIGNALED,
        sges,
        remote,
    };
    let src5 = [src_mr.sge(0..5).unwrap()];
    let src7 = [src_mr.sge(0..7).unwrap()];
    let src9 = [src_mr.sge(0..9).unwrap()];
    let wrs = [
        w(1, Opcode::SendImm(0x0102_0304), &src5[..]),
        w(2, Opcode::Send, &src7[..]),
        w(3, Opcode::WriteImm(0xfeed_f00d), &src9[..]),
        w(4, Opcode::Read, &read_into[..]),
    ];
    // SAFETY: every buffer outlives the completions polled just below.
    unsafe { a.post_send(&wrs) }.unwrap();
    let mut got = support::poll_n(cq, 7, Duration::from_secs(20));
    got.sort_by_key(|c| c.wr_id);
    for c in &mut got {
        assert!(c.qp_num == qa || c.qp_num == qb, "{c:?}");
        c.qp_num = if c.qp_num == qa { 1 } else { 2 };
    }
    got
}

#[test]
fn queues_take_the_extended_path_and_read_as_the_legacy_ones() {
    let Some(ctx) = support::open("queues_take_the_extended_path_and_read_as_the_legacy_ones")
    else {
        return;
    };
    let mut ext = ctx.create_cq(64).unwrap();
    let mut legacy = ctx
        .create_cq_with_options(64, None, CqOptions::new().legacy(true))
        .unwrap();
    eprintln!(
        "{}: default queue {:?}, legacy queue {:?}",
        ctx.name(),
        ext.poll_path(),
        legacy.poll_path()
    );
    assert_eq!(
        legacy.poll_path(),
        PollPath::Legacy {
            create_cq_ex_errno: None
        }
    );
    assert!(legacy.as_raw_ex().is_none());
    if is_rxe(&ctx) {
        // rxe implements ibv_create_cq_ex: the fallback is for providers that do not.
        assert_eq!(ext.poll_path(), PollPath::Extended);
        assert!(ext.as_raw_ex().is_some());
    }
    assert!(!ext.has_timestamps() && !legacy.has_timestamps());

    let a = every_kind(&ctx, &mut ext);
    let b = every_kind(&ctx, &mut legacy);
    assert_eq!(a, b, "the two paths read different completions");
    let summary: Vec<_> = a
        .iter()
        .map(|c| (c.wr_id, c.qp_num, c.status, c.kind, c.byte_len, c.imm))
        .collect();
    let ok = WcStatus::Success;
    assert_eq!(
        summary,
        vec![
            (1, 1, ok, CompletionKind::Send, 0, None),
            (2, 1, ok, CompletionKind::Send, 0, None),
            (3, 1, ok, CompletionKind::Write, 0, None),
            (4, 1, ok, CompletionKind::Read, 16, None),
            (100, 2, ok, CompletionKind::Recv, 5, Some(0x0102_0304)),
            (101, 2, ok, CompletionKind::Recv, 7, None),
            (
                102,
                2,
                ok,
                CompletionKind::RecvWriteImm,
                9,
                Some(0xfeed_f00d)
            ),
        ]
    );
    assert!(a.iter().all(|c| c.timestamp.is_none()));
    // An empty queue answers nothing, on both paths (start_poll's ENOENT, no end_poll).
    let mut out = [Completion::EMPTY; 4];
    assert_eq!(ext.poll(&mut out).unwrap(), 0);
    assert_eq!(legacy.poll(&mut out).unwrap(), 0);
}

/// Timestamps asked for on a device without a completion clock are refused when the queue
/// is created (never a completion with a made-up time), by a `Cq` and by a provider, with an
/// error that names the device and what it lacks; on a device with a clock they come with
/// every successful completion, not falling.
#[test]
fn timestamps_are_refused_at_setup_where_the_device_has_no_clock() {
    let Some(ctx) = support::open("timestamps_are_refused_at_setup_where_the_device_has_no_clock")
    else {
        return;
    };
    let asked = CqOptions::new().timestamps(true);
    let pd = ctx.alloc_pd().unwrap();
    let cfg = QpConfig::default();
    match ctx.create_cq_with_options(16, None, asked) {
        Err(e @ VerbsError::TimestampsUnsupported { device, reason }) => {
            let msg = e.to_string();
            eprintln!("{msg}");
            assert_eq!(device.as_str(), ctx.name());
            assert!(
                msg.contains(ctx.name()) && msg.contains("completion timestamps"),
                "{msg}"
            );
            if is_rxe(&ctx) {
                // rxe answers ibv_query_device_ex, with no completion clock.
                assert_eq!(reason, TimestampRefusal::NoDeviceClock, "{msg}");
                assert!(msg.contains("completion_timestamp_mask"), "{msg}");
            }
            let p = PreparedVerbs::with_timestamps(&ctx, &pd, &cfg).unwrap_err();
            assert_eq!(p, e, "the provider refuses as the queue does");
        }
        Err(other) => panic!("timestamps refused with an unrelated error: {other}"),
        Ok(mut cq) => {
            assert!(
                !is_rxe(&ctx),
                "rxe has no completion clock, yet the queue was made"
            );
            assert!(cq.has_timestamps());
            let got = every_kind(&ctx, &mut cq);
            let times: Vec<_> = got
                .iter()
                .map(|c| {
                    c.timestamp
                        .expect("a successful completion has a time")
                        .get()
                })
                .collect();
            eprintln!("{}: completion times {times:?}", ctx.name());
            // The sender's four requests complete in order on their queue pair.
            let sender: Vec<_> = got
                .iter()
                .zip(&times)
                .filter(|(c, _)| c.qp_num == 1)
                .map(|(_, t)| *t)
                .collect();
            assert!(sender.windows(2).all(|w| w[0] <= w[1]), "{sender:?}");
            assert!(cq.last_timestamp().is_some());
        }
    }
    // Timestamps need the extended verbs: with the legacy ones they are refused too.
    let both = ctx
        .create_cq_with_options(16, None, asked.legacy(true))
        .unwrap_err();
    assert!(matches!(both, VerbsError::InvalidArgument { .. }), "{both}");
}

/// The legacy path hands completions to a router one `ibv_poll_cq` at a time: a router
/// (`CompletionQueue::poll_each`'s `each`, a caller's `take` behind it) that panics on the
/// second of three completions strands none behind it; the third is the next poll's.
#[test]
fn a_panicking_router_strands_no_completion_on_the_legacy_path() {
    use rverbs_core::provider::CompletionQueue;
    let Some(ctx) = support::open("a_panicking_router_strands_no_completion_on_the_legacy_path")
    else {
        return;
    };
    let mut cq = ctx
        .create_cq_with_options(64, None, CqOptions::new().legacy(true))
        .unwrap();
    let pd = ctx.alloc_pd().unwrap();
    let cfg = QpConfig::default();
    let a = pd.create_rc_qp(&cq, &cq, &cfg).unwrap();
    let b = pd.create_rc_qp(&cq, &cq, &cfg).unwrap();
    let (ea, eb) = (a.endpoint(), b.endpoint());
    let mut a = a.handshake(&eb).unwrap();
    let _b = b.handshake(&ea).unwrap();
    let src = *b"abc";
    let mut src = src;
    let src_mr = pd.register(&mut src, AccessFlags::LOCAL_WRITE).unwrap();
    let dst = pd
        .register_shared(
            vec![0u8; 64].into_boxed_slice(),
            AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE,
        )
        .unwrap();
    let entries: Vec<[Sge<'_>; 1]> = (0..3).map(|i| [src_mr.sge(i..i + 1).unwrap()]).collect();
    let wrs: Vec<WorkRequest<'_>> = (0..3)
        .map(|i| WorkRequest {
            wr_id: i as u64 + 1,
            opcode: Opcode::Write,
            flags: SendFlags::SIGNALED,
            sges: &entries[i][..],
            remote: dst.remote().slice(i as u64, 1).unwrap(),
        })
        .collect();
    // SAFETY: `src` outlives the writes, whose completions are polled below.
    unsafe { a.post_send(&wrs) }.unwrap();
    // All three in the queue before the poll: the last byte written, then time for the
    // requester's completions to follow the acknowledgement.
    let until = std::time::Instant::now() + Duration::from_secs(20);
    let mut seen = [0u8; 3];
    while seen != *b"abc" {
        assert!(
            std::time::Instant::now() < until,
            "the writes did not land: {seen:?}"
        );
        assert!(dst.read_into(0, &mut seen));
        std::thread::sleep(Duration::from_millis(10));
    }
    std::thread::sleep(Duration::from_secs(1));
    let mut scratch = [Completion::EMPTY; 16];
    let mut handed = Vec::new();
    let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        CompletionQueue::poll_each(&mut cq, &mut scratch, |c| {
            handed.push(c.wr_id);
            assert_ne!(c.wr_id, 2, "the router panics on the second");
        })
    }));
    assert!(r.is_err(), "the router panicked: {r:?}");
    assert_eq!(handed, [1, 2]);
    let rest = support::poll_n(&mut cq, 1, Duration::from_secs(20));
    assert_eq!(rest[0].wr_id, 3, "{rest:?}");
    assert_eq!(rest[0].status, WcStatus::Success);
    let mut out = [Completion::EMPTY; 4];
    assert_eq!(cq.poll(&mut out).unwrap(), 0);
}
