//! Every Channel operation on a real device, bytes checked on the receiving side.
#![allow(clippy::std_instead_of_core)] // test code

#[macro_use]
mod support;

use rverbs_core::channel::{Channel, ChannelConfig, ChannelError, Done};
use rverbs_core::completion::WcStatus;
use rverbs_core::provider::verbs::VerbsProvider;
use rverbs_core::sge::{RemoteMemory, SgeMut};
use rverbs_core::verbs::{AccessFlags, QpConfig};

const RW: AccessFlags = AccessFlags::LOCAL_WRITE
    .union(AccessFlags::REMOTE_WRITE)
    .union(AccessFlags::REMOTE_READ);

/// `b` receives into `scatter` while `send` sends it a message from the other end: the
/// receive's completion.
fn received<'s>(
    b: &mut Channel<VerbsProvider>,
    scatter: &'s mut [SgeMut<'s>],
    send: impl FnOnce(),
) -> Done {
    b.scope(|s| {
        let r = s.recv(scatter).unwrap();
        send();
        s.wait(r).unwrap()
    })
    .unwrap()
}

#[test]
fn a_send_gathered_from_three_entries_lands_in_two_with_its_immediate() {
    let (_ctx, pd, mut a, mut b) = setup!("a_send_gathered_from_three_entries_lands_in_two_with_its_immediate", default channels);
    let mut src = support::pattern(300, 1);
    let expected = src.clone();
    let mut dst = vec![0u8; 512];
    let src_mr = pd.register(&mut src, AccessFlags::LOCAL_WRITE).unwrap();
    let mut dst_mr = pd.register(&mut dst, AccessFlags::LOCAL_WRITE).unwrap();
    // Three gather entries on the sender, two scatter entries on the receiver.
    let gather = [
        src_mr.sge(0..100).unwrap(),
        src_mr.sge(100..250).unwrap(),
        src_mr.sge(250..300).unwrap(),
    ];
    {
        let mut parts = dst_mr.chunks_mut(256);
        let mut scatter = [parts.next().unwrap(), parts.next().unwrap()];
        let info = received(&mut b, &mut scatter, || {
            a.send_imm(&gather, 0xfeed_beef).unwrap();
        });
        assert_eq!(info.byte_len, 300);
        assert_eq!(info.imm, Some(0xfeed_beef));
    }
    assert_eq!(&dst_mr.as_slice()[..300], &expected[..]);

    // A plain send carries no immediate.
    {
        let mut scatter = [dst_mr.sge_mut(0..512).unwrap()];
        let info = received(&mut b, &mut scatter, || {
            a.send(&gather[..1]).unwrap();
        });
        assert_eq!(
            info,
            rverbs_core::channel::Done {
                byte_len: 100,
                imm: None,
                written: false,
            }
        );
    }
}

#[test]
fn a_write_a_read_and_a_write_with_immediate_move_every_byte() {
    let (_ctx, pd, mut a, mut b) =
        setup!("a_write_a_read_and_a_write_with_immediate_move_every_byte", default channels);
    let mut local = support::pattern(8192, 7);
    let expected = local.clone();
    let remote_buf = vec![0u8; 8192].into_boxed_slice();
    let mut back = vec![0u8; 8192];
    let local_mr = pd.register(&mut local, AccessFlags::LOCAL_WRITE).unwrap();
    let remote_mr = pd.register_shared(remote_buf, RW).unwrap();
    let mut back_mr = pd.register(&mut back, AccessFlags::LOCAL_WRITE).unwrap();
    let remote = remote_mr.remote();

    a.write(&[local_mr.sge(0..8192).unwrap()], remote).unwrap();
    let mut got = vec![0u8; 8192];
    remote_mr.read_into(0, &mut got);
    assert_eq!(got, expected);

    a.read(&mut [back_mr.sge_mut(0..8192).unwrap()], remote)
        .unwrap();
    assert_eq!(back_mr.as_slice(), &expected[..]);

    // Write with immediate: the bytes land and the peer's receive reports the immediate.
    let mut rbuf = vec![0u8; 16];
    let mut rmr = pd.register(&mut rbuf, AccessFlags::LOCAL_WRITE).unwrap();
    let mut scatter = [rmr.sge_mut(0..16).unwrap()];
    let part = remote.slice(4096, 64).unwrap();
    let info = received(&mut b, &mut scatter, || {
        a.write_imm(&[local_mr.sge(0..64).unwrap()], part, 77)
            .unwrap();
    });
    assert_eq!(info.imm, Some(77));
    assert_eq!(info.byte_len, 64);
    let mut got = [0u8; 64];
    remote_mr.read_into(4096, &mut got);
    assert_eq!(&got[..], &expected[..64]);
}

#[test]
fn thirty_two_writes_in_one_post_each_land_in_their_place() {
    let (_ctx, pd, mut a, _b) =
        setup!("thirty_two_writes_in_one_post_each_land_in_their_place", default channels);
    let mut src = support::pattern(32 * 128, 3);
    let expected = src.clone();
    let dst = vec![0u8; 32 * 128].into_boxed_slice();
    let src_mr = pd.register(&mut src, AccessFlags::LOCAL_WRITE).unwrap();
    let dst_mr = pd.register_shared(dst, RW).unwrap();
    let sges: Vec<[_; 1]> = (0..32)
        .map(|i| [src_mr.sge(i * 128..(i + 1) * 128).unwrap()])
        .collect();
    let mut batch = a.batch();
    for (i, s) in sges.iter().enumerate() {
        // Reverse order on the remote side, so a mix-up would show.
        let r = dst_mr.remote().slice(((31 - i) * 128) as u64, 128).unwrap();
        batch.write(s, r).unwrap();
    }
    assert_eq!(batch.len(), 32);
    batch.run().unwrap();
    for i in 0..32 {
        let mut got = [0u8; 128];
        dst_mr.read_into((31 - i) * 128, &mut got);
        assert_eq!(&got[..], &expected[i * 128..(i + 1) * 128], "chunk {i}");
    }
    assert_eq!(a.outstanding_sends(), 0);
}

#[test]
fn inline_writes_and_sends_carry_unregistered_bytes_up_to_the_inline_limit() {
    let (_ctx, pd, mut a, mut b) = setup!("inline_writes_and_sends_carry_unregistered_bytes_up_to_the_inline_limit", default channels);
    let max = a.caps().max_inline_data as usize;
    assert!(max >= 32, "device granted only {max} bytes of inline data");
    let payload = support::pattern(32, 9); // not registered: inline needs no memory region
    let dst = vec![0u8; 64].into_boxed_slice();
    let dst_mr = pd.register_shared(dst, RW).unwrap();
    a.write_inline(&payload, dst_mr.remote()).unwrap();
    let mut got = [0u8; 32];
    dst_mr.read_into(0, &mut got);
    assert_eq!(&got[..], &payload[..]);

    let mut rbuf = vec![0u8; 64];
    let mut rmr = pd.register(&mut rbuf, AccessFlags::LOCAL_WRITE).unwrap();
    {
        let mut scatter = [rmr.sge_mut(0..64).unwrap()];
        let info = received(&mut b, &mut scatter, || {
            a.send_inline(&payload[..20]).unwrap();
        });
        assert_eq!(info.byte_len, 20);
    }
    assert_eq!(&rmr.as_slice()[..20], &payload[..20]);
    let too_big = vec![0u8; max + 1];
    assert!(matches!(
        a.send_inline(&too_big),
        Err(ChannelError::InlineTooLarge { .. })
    ));
}

/// Unpolled posts are signaled every k-th request only; waiting for a ticket after the last
/// signaled one posts a signaled zero-length RDMA write (no key, no memory) that the device
/// completes behind it.
#[test]
fn waiting_for_an_unsignaled_ticket_posts_a_zero_length_cover() {
    let (ctx, pd) = setup!("waiting_for_an_unsignaled_ticket_posts_a_zero_length_cover");
    let mut cfg = ChannelConfig::default();
    cfg.signal_every = 8;
    let (mut a, _b) = support::channel_pair(&ctx, &pd, &QpConfig::default(), cfg);
    let dst = vec![0u8; 8 * 20].into_boxed_slice();
    let dst_mr = pd.register_shared(dst, RW).unwrap();
    let mut last = None;
    for i in 0..20u64 {
        let at = dst_mr.remote().slice(i * 8, 8).unwrap();
        last = Some(a.post_write_inline(&i.to_le_bytes(), at).unwrap());
    }
    let before = a.sends_completed() + a.outstanding_sends();
    assert_eq!(before, 20);
    a.wait(last.unwrap()).unwrap();
    // One more request: the cover, completed with everything before it.
    assert_eq!(a.sends_completed(), 21);
    assert_eq!(a.outstanding_sends(), 0);
    for i in 0..20u64 {
        let mut got = [0u8; 8];
        dst_mr.read_into(i as usize * 8, &mut got);
        assert_eq!(u64::from_le_bytes(got), i);
    }
    // The channel goes on working after it.
    a.write_inline(&[7; 8], dst_mr.remote().slice(0, 8).unwrap())
        .unwrap();
}

#[test]
fn selective_signaling_over_ten_times_the_queue_depth() {
    let (ctx, pd) = setup!("selective_signaling_over_ten_times_the_queue_depth");
    let mut qp = QpConfig::default();
    qp.max_send_wr = 32;
    let mut cfg = ChannelConfig::default();
    cfg.signal_every = 8;
    let (mut a, _b) = support::channel_pair(&ctx, &pd, &qp, cfg);
    let depth = a.caps().max_send_wr as usize;
    let total = depth * 10 + 7;
    let mut src = support::pattern(total * 8, 5);
    let expected = src.clone();
    let dst = vec![0u8; total * 8].into_boxed_slice();
    let src_mr = pd.register(&mut src, AccessFlags::LOCAL_WRITE).unwrap();
    let dst_mr = pd.register_shared(dst, RW).unwrap();
    let sges: Vec<[_; 1]> = (0..total)
        .map(|i| [src_mr.sge(i * 8..i * 8 + 8).unwrap()])
        .collect();
    let per_post = a.max_post().min(12);
    let mut posted = 0;
    let mut max_outstanding = 0;
    while posted < total {
        let n = per_post.min(total - posted);
        let mut batch = a.batch();
        for (i, sge) in sges.iter().enumerate().skip(posted).take(n) {
            batch
                .write(sge, dst_mr.remote().slice((i * 8) as u64, 8).unwrap())
                .unwrap();
        }
        // SAFETY: every buffer lives until wait_all below, and none is touched before it.
        let _ticket = unsafe { batch.post() }.unwrap();
        posted += n;
        max_outstanding = max_outstanding.max(a.outstanding_sends());
        assert!(a.outstanding_sends() <= depth as u64, "send queue overrun");
    }
    a.wait_all().unwrap();
    assert_eq!(a.outstanding_sends(), 0);
    let mut got = vec![0u8; total * 8];
    dst_mr.read_into(0, &mut got);
    assert_eq!(got, expected);
    eprintln!("{total} writes through a {depth}-deep send queue, signal every {}, at most {max_outstanding} outstanding", a.signal_every());
}

#[test]
fn write_to_bad_rkey_fails_and_breaks_the_channel() {
    let (ctx, pd) = setup!("write_to_bad_rkey_fails_and_breaks_the_channel");
    let mut qp = QpConfig::default();
    qp.retry_count = rverbs_core::params::RetryCount::new(1).unwrap();
    let (mut a, _b) = support::channel_pair(&ctx, &pd, &qp, ChannelConfig::default());
    let mut src = vec![1u8; 64];
    let dst = vec![0u8; 64].into_boxed_slice();
    let src_mr = pd.register(&mut src, AccessFlags::LOCAL_WRITE).unwrap();
    let dst_mr = pd.register_shared(dst, RW).unwrap();
    let bad = RemoteMemory {
        rkey: dst_mr.remote().rkey ^ 0x5a5a_0000,
        ..dst_mr.remote()
    };
    let err = a.write(&[src_mr.sge(0..64).unwrap()], bad).unwrap_err();
    match err {
        ChannelError::Failed(w) => {
            assert_eq!(w.status, WcStatus::RemoteAccess, "{w}");
            eprintln!("bad rkey: {w}");
        }
        other => panic!("expected a failed completion, got {other:?}"),
    }
    let again = a
        .write(&[src_mr.sge(0..64).unwrap()], dst_mr.remote())
        .unwrap_err();
    assert!(
        matches!(again, ChannelError::Broken(w) if w.status == WcStatus::RemoteAccess),
        "{again:?}"
    );
    let mut got = [9u8; 64];
    dst_mr.read_into(0, &mut got);
    assert_eq!(got, [0u8; 64], "nothing may land through a bad rkey");
}

#[test]
fn send_recv_ping_pong_through_receive_rings_without_unsafe() {
    let (_ctx, pd, a, b) =
        setup!("send_recv_ping_pong_through_receive_rings_without_unsafe", default channels);
    let ring = |chan| {
        // One page: 16 slots of 256 bytes.
        let mem = rverbs_core::memory::PageMemory::zeroed(4096).unwrap();
        let mr = pd.register_shared(mem, AccessFlags::LOCAL_WRITE).unwrap();
        rverbs_core::channel::RecvRing::new(chan, mr, 256).unwrap()
    };
    let (mut ping, mut pong) = (ring(a), ring(b));
    assert_eq!(ping.slots(), 16);
    // More round trips than slots: every slot is re-posted as it is consumed.
    for i in 0u32..1000 {
        ping.channel().send_inline(&i.to_le_bytes()).unwrap();
        let mut echo = [0u8; 4];
        echo.copy_from_slice(pong.recv().unwrap().data);
        pong.channel().send_inline(&echo).unwrap();
        let back = ping.recv().unwrap();
        assert_eq!(back.data, &i.to_le_bytes());
        assert_eq!(back.done.byte_len, 4);
    }
}
