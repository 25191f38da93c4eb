//! The engine ([`Channel`]) driven over the in-memory RC model ([`rverbs_core::model`]).
//!
//! Both channels live on one thread, so a two-sided operation needs its receive posted
//! before the send runs: the receiver posts in a [`Channel::scope`] and the sender sends
//! inside that scope's closure (or the sender posts in a scope, and the receiver's blocking
//! `recv` supplies the receive that unblocks it). The model runs work inside provider calls;
//! see its module docs.
#![allow(clippy::std_instead_of_core)]

use std::time::Duration;

use rverbs_core::channel::{Channel, ChannelConfig, ChannelError, Done, WrFailure};
use rverbs_core::completion::WcStatus;
use rverbs_core::memory::AccessFlags;
use rverbs_core::model::{Side, SoftFabric};
use rverbs_core::params::{QpCaps, RetryCount, RnrRetry};
use rverbs_core::poll::{Busy, Spin};
use rverbs_core::sge::{RemoteMemory, Sge, SgeMut};
use rverbs_testkit::{bytes, clock};

const RW: AccessFlags = AccessFlags::LOCAL_WRITE
    .union(AccessFlags::REMOTE_WRITE)
    .union(AccessFlags::REMOTE_READ);

fn caps(depth: u32) -> QpCaps {
    QpCaps::queues(depth, depth).with_sges(4)
}

fn fabric<'m>(depth: u32) -> SoftFabric<'m> {
    SoftFabric::new(caps(depth), RnrRetry::Times(3), RetryCount::new(3).unwrap())
}

fn pattern<const N: usize>(seed: u8) -> [u8; N] {
    core::array::from_fn(|i| seed.wrapping_mul(31).wrapping_add(i as u8))
}

#[test]
fn send_and_recv_move_the_bytes() {
    let (mut sbuf, mut rbuf) = ([0u8; 32], [0u8; 32]);
    let f = fabric(16);
    let src = f.register(Side::A, &mut sbuf, RW).unwrap();
    let mut dst = f.register(Side::B, &mut rbuf, RW).unwrap();
    src.write_from(0, b"hello, peer");
    let (ea, eb) = f.ends().unwrap();
    let (mut a, mut b) = (
        Channel::new(ea, ChannelConfig::default(), clock!()),
        Channel::new(eb, ChannelConfig::default(), clock!()),
    );
    let g = [src.sge(0..11).unwrap()];
    {
        let mut rs = [dst.sge_mut(0..32).unwrap()];
        let info = b
            .scope(|s| {
                let p = s.recv(&mut rs)?;
                a.send(&g)?;
                s.wait(p)
            })
            .unwrap()
            .unwrap();
        assert_eq!(
            info,
            Done {
                byte_len: 11,
                imm: None,
                written: false,
            }
        );
    }
    assert_eq!(&bytes::<11>(&dst, 0), b"hello, peer");

    // The other way round: the sender posts first (RNR-blocked), the blocking recv supplies
    // the receive.
    src.write_from(0, b"second");
    {
        let mut rs = [dst.sge_mut(16..32).unwrap()];
        let info = a
            .scope(|s| {
                let p = s.send_imm(&g[..], 0xabcd)?;
                let info = b.recv(&mut rs)?;
                s.wait(p)?;
                Ok::<_, ChannelError>(info)
            })
            .unwrap()
            .unwrap();
        assert_eq!(info.byte_len, 11);
        assert_eq!(info.imm, Some(0xabcd));
    }
    assert_eq!(&bytes::<6>(&dst, 16), b"second");
    assert_eq!(a.outstanding_sends(), 0);
    assert_eq!(b.outstanding_recvs(), 0);
    assert!(a.fault().is_none() && b.fault().is_none());
}

#[test]
fn writes_reads_and_writes_with_immediate_move_the_bytes() {
    let (mut abuf, mut bbuf) = ([0u8; 64], [0u8; 64]);
    let f = fabric(16);
    let mut am = f.register(Side::A, &mut abuf, RW).unwrap();
    let bm = f.register(Side::B, &mut bbuf, RW).unwrap();
    let (ea, eb) = f.ends().unwrap();
    let mut a = Channel::new(ea, ChannelConfig::default(), clock!());
    let mut b = Channel::new(eb, ChannelConfig::default(), clock!());
    let remote = bm.remote();

    am.write_from(0, &pattern::<16>(1));
    a.write(&[am.sge(0..16).unwrap()], remote.slice(8, 16).unwrap())
        .unwrap();
    assert_eq!(bytes::<16>(&bm, 8), pattern::<16>(1));

    bm.write_from(32, &pattern::<16>(2));
    a.read(
        &mut [am.sge_mut(16..32).unwrap()],
        remote.slice(32, 16).unwrap(),
    )
    .unwrap();
    assert_eq!(bytes::<16>(&am, 16), pattern::<16>(2));

    am.write_from(0, &pattern::<8>(3));
    let g = [am.sge(0..8).unwrap()];
    let info = b
        .scope(|s| {
            let p = s.recv(&mut [])?;
            a.write_imm(&g, remote.slice(56, 8).unwrap(), 77)?;
            s.wait(p)
        })
        .unwrap()
        .unwrap();
    assert_eq!(
        info,
        Done {
            byte_len: 8,
            imm: Some(77),
            written: true,
        }
    );
    assert_eq!(bytes::<8>(&bm, 56), pattern::<8>(3));
}

#[test]
fn a_send_gathers_from_several_entries_and_a_receive_scatters_into_several() {
    let (mut x, mut y, mut z, mut r) = ([0u8; 8], [0u8; 8], [0u8; 8], [0u8; 32]);
    let f = fabric(16);
    let (xm, ym, zm) = (
        f.register(Side::A, &mut x, RW).unwrap(),
        f.register(Side::A, &mut y, RW).unwrap(),
        f.register(Side::A, &mut z, RW).unwrap(),
    );
    let mut rm = f.register(Side::B, &mut r, RW).unwrap();
    xm.write_from(0, b"AAAAaaaa");
    ym.write_from(0, b"BBBBbbbb");
    zm.write_from(0, b"CCCCcccc");
    let (ea, eb) = f.ends().unwrap();
    let mut a = Channel::new(ea, ChannelConfig::default(), clock!());
    let mut b = Channel::new(eb, ChannelConfig::default(), clock!());
    let g = [
        xm.sge(0..4).unwrap(),
        ym.sge(2..8).unwrap(),
        zm.sge(4..8).unwrap(),
    ];
    {
        // 14 bytes scattered as 3 + 11 into two pieces of one region.
        let mut rs = rm.sges_mut([0..3, 16..32]).unwrap();
        let info = b
            .scope(|s| {
                let p = s.recv(&mut rs)?;
                a.send(&g)?;
                s.wait(p)
            })
            .unwrap()
            .unwrap();
        assert_eq!(info.byte_len, 14);
    }
    assert_eq!(&bytes::<3>(&rm, 0), b"AAA");
    assert_eq!(&bytes::<11>(&rm, 16), b"ABBbbbbcccc");

    // A gather write of the same three pieces.
    a.write(&g, rm.remote().slice(3, 13).unwrap()).unwrap();
    assert_eq!(&bytes::<14>(&rm, 3)[..13], b"AAAABBbbbbccc");

    // Too many entries is refused before posting.
    let five = [xm.sge(0..1).unwrap(); 5];
    assert_eq!(
        a.write(&five, rm.remote()),
        Err(ChannelError::TooManySges { max: 4, got: 5 })
    );
}

#[test]
fn inline_sends_and_writes_carry_their_bytes() {
    let mut r = [0u8; 64];
    let f = fabric(16);
    let mut rm = f.register(Side::B, &mut r, RW).unwrap();
    let (ea, eb) = f.ends().unwrap();
    let mut a = Channel::new(ea, ChannelConfig::default(), clock!());
    let mut b = Channel::new(eb, ChannelConfig::default(), clock!());
    let remote = rm.remote();
    a.write_inline(b"inline write", remote.slice(40, 12).unwrap())
        .unwrap();
    {
        let mut rs = [rm.sge_mut(0..32).unwrap()];
        let info = b
            .scope(|s| {
                let p = s.recv(&mut rs)?;
                a.send_inline(b"inline send")?;
                s.wait(p)
            })
            .unwrap()
            .unwrap();
        assert_eq!(info.byte_len, 11);
    }
    assert_eq!(&bytes::<11>(&rm, 0), b"inline send");
    assert_eq!(&bytes::<12>(&rm, 40), b"inline write");
    assert_eq!(
        a.send_inline(&[0u8; 65]),
        Err(ChannelError::InlineTooLarge { max: 64, got: 65 })
    );

    // Inline entries in a batch.
    let (d1, d2) = (*b"batch-1!", *b"batch-2!");
    let mut batch = a.batch();
    batch
        .write_inline(&d1, remote.slice(0, 8).unwrap())
        .unwrap();
    batch
        .write_inline(&d2, remote.slice(8, 8).unwrap())
        .unwrap();
    batch.run().unwrap();
    assert_eq!(&bytes::<16>(&rm, 0), b"batch-1!batch-2!");
}

#[test]
fn a_batch_of_32_writes_and_one_of_32_sends_each_land_in_their_place() {
    let n: usize = 32;
    let (mut sbuf, mut wbuf, mut rbuf) = ([0u8; 256], [0u8; 256], [0u8; 256]);
    let f = fabric(64);
    let src = f.register(Side::A, &mut sbuf, RW).unwrap();
    let wm = f.register(Side::B, &mut wbuf, RW).unwrap();
    let mut rm = f.register(Side::B, &mut rbuf, RW).unwrap();
    src.write_from(0, &pattern::<256>(9));
    let (ea, eb) = f.ends().unwrap();
    let mut a = Channel::new(ea, ChannelConfig::default(), clock!());
    let mut b = Channel::new(eb, ChannelConfig::default(), clock!());
    assert!(a.max_post() >= n);
    let g: [Sge<'_>; 32] = core::array::from_fn(|i| src.sge(i * 8..i * 8 + 8).unwrap());
    let remote = wm.remote();

    let mut batch = a.batch();
    for i in 0..n {
        // Reverse order, so a write landing in the wrong place shows.
        let j = n - 1 - i;
        batch
            .write(&g[i..=i], remote.slice(j as u64 * 8, 8).unwrap())
            .unwrap();
    }
    assert_eq!(batch.len(), n);
    batch.run().unwrap();
    let got = bytes::<256>(&wm, 0);
    let want = pattern::<256>(9);
    for i in 0..n {
        let j = n - 1 - i;
        assert_eq!(got[j * 8..j * 8 + 8], want[i * 8..i * 8 + 8], "write {i}");
    }

    {
        let mut rs: [SgeMut<'_>; 32] = rm
            .sges_mut(core::array::from_fn(|i| i * 8..i * 8 + 8))
            .unwrap();
        let infos = b
            .scope(|s| {
                let mut pending = [None; 32];
                for (p, e) in pending.iter_mut().zip(rs.iter_mut()) {
                    *p = Some(s.recv(core::slice::from_mut(e))?);
                }
                let mut batch = a.batch();
                for (i, e) in g.iter().enumerate() {
                    batch.send_imm(core::slice::from_ref(e), i as u32)?;
                }
                batch.run()?;
                let mut infos = [Done::default(); 32];
                for (info, p) in infos.iter_mut().zip(pending) {
                    *info = s.wait(p.unwrap())?;
                }
                Ok::<_, ChannelError>(infos)
            })
            .unwrap()
            .unwrap();
        for (i, info) in infos.iter().enumerate() {
            assert_eq!((info.byte_len, info.imm), (8, Some(i as u32)));
        }
    }
    assert_eq!(bytes::<256>(&rm, 0), pattern::<256>(9));
    assert_eq!(b.outstanding_recvs(), 0);
}

/// Many small writes through batches of varying size and unpolled submits, 10x the queue
/// depth, then one wait: every slot must be reclaimed and every byte must land.
fn selective_signaling(depth: u32, signal_every: u32, writes: usize) -> (u64, u64) {
    let mut sbuf = [0u8; 2048];
    let mut dbuf = [0u8; 2048];
    let f = fabric(depth);
    let src = f.register(Side::A, &mut sbuf, RW).unwrap();
    let dst = f.register(Side::B, &mut dbuf, RW).unwrap();
    let (ea, _eb) = f.ends().unwrap();
    let mut cfg = ChannelConfig::default();
    cfg.signal_every = signal_every;
    let mut a = Channel::new(ea, cfg, clock!());
    let chunk = 2048 / writes;
    assert!(chunk >= 1);
    let data: [u8; 2048] = core::array::from_fn(|i| (i * 7 + i / 256) as u8);
    src.write_from(0, &data);
    let g: [Sge<'_>; 1024] = core::array::from_fn(|i| {
        let i = i.min(writes - 1);
        src.sge(i * chunk..(i + 1) * chunk).unwrap()
    });
    let remote = dst.remote();
    let mut done = 0usize;
    let mut round = 0usize;
    let mut last = None;
    while done < writes {
        let size = (1 + round * 5 % a.max_post()).min(writes - done);
        let mut batch = a.batch();
        for i in done..done + size {
            batch
                .write(
                    &g[i..=i],
                    remote.slice((i * chunk) as u64, chunk as u64).unwrap(),
                )
                .unwrap();
        }
        if round.is_multiple_of(3) {
            batch.run().unwrap();
        } else {
            // SAFETY: the buffers are registered regions that outlive the channel's use of
            // them: `wait_all` below waits for everything before they are read or dropped.
            last = unsafe { batch.post() }.unwrap();
        }
        done += size;
        round += 1;
        assert!(a.outstanding_sends() <= u64::from(depth));
        assert!(f.send_queue_used(Side::A) <= u64::from(depth));
    }
    assert!(last.is_some());
    a.wait_all().unwrap();
    assert_eq!(a.outstanding_sends(), 0);
    assert_eq!(f.send_queue_used(Side::A), 0);
    let mut got = [0u8; 2048];
    assert!(dst.read_into(0, &mut got));
    let n = writes * chunk;
    assert_eq!(got[..n], data[..n]);
    let stats = f.stats(Side::A);
    // wait_all adds one zero-length write when the last post ended unsignaled.
    assert!(
        stats.sends_posted == writes as u64 || stats.sends_posted == writes as u64 + 1,
        "{} requests for {writes} writes",
        stats.sends_posted
    );
    (stats.send_cqes, u64::from(a.signal_every()))
}

#[test]
fn selective_signaling_reclaims_slots_depth_16() {
    let writes = if cfg!(miri) { 160 } else { 256 };
    let (cqes, _k) = selective_signaling(16, 16, writes);
    assert!(cqes <= writes as u64);
}

#[test]
fn selective_signaling_reclaims_slots_depth_128() {
    let writes = if cfg!(miri) { 256 } else { 1024 };
    let (cqes, k) = selective_signaling(128, 16, writes);
    assert!(k > 1, "signal_every was clamped to {k}");
    assert!(
        cqes < writes as u64 / 2,
        "{cqes} completions for {writes} writes"
    );
}

/// Queues no deeper than MAX_BATCH still signal selectively (the engine gives up batch size,
/// not signaling).
#[test]
fn small_queues_still_signal_selectively() {
    let (cqes, k) = selective_signaling(16, 16, 160);
    assert!(k > 1, "signal_every was clamped to {k}");
    assert!(cqes < 160 / 2);
}

#[test]
fn bad_rkey_fails_then_the_channel_is_broken() {
    let (mut sbuf, mut dbuf) = ([0u8; 16], [0u8; 16]);
    let f = fabric(16);
    let src = f.register(Side::A, &mut sbuf, RW).unwrap();
    let dst = f.register(Side::B, &mut dbuf, RW).unwrap();
    let (ea, _eb) = f.ends().unwrap();
    let mut a = Channel::new(ea, ChannelConfig::default(), clock!());
    let g = [src.sge(0..8).unwrap()];
    a.write(&g, dst.remote()).unwrap();
    let bad = RemoteMemory {
        rkey: dst.rkey() ^ 0x100,
        ..dst.remote()
    };
    let first = match a.write(&g, bad) {
        Err(ChannelError::Failed(w)) => w,
        other => panic!("expected Failed, got {other:?}"),
    };
    assert_eq!(first.status, WcStatus::RemoteAccess);
    assert_eq!(first.wr_id, 1);
    assert_eq!(a.fault(), Some(ChannelError::Broken(first)));
    assert_eq!(a.write(&g, dst.remote()), Err(ChannelError::Broken(first)));
    assert_eq!(a.outstanding_sends(), 0);
    // Out of bounds is a remote access error too.
    let f = fabric(16);
    let (mut s2, mut d2) = ([0u8; 16], [0u8; 16]);
    let src = f.register(Side::A, &mut s2, RW).unwrap();
    let dst = f.register(Side::B, &mut d2, RW).unwrap();
    let mut a = Channel::new(f.ends().unwrap().0, ChannelConfig::default(), clock!());
    let oob = RemoteMemory {
        addr: dst.remote().addr + 12,
        ..dst.remote()
    };
    assert!(matches!(
        a.write(&[src.sge(0..8).unwrap()], oob),
        Err(ChannelError::Failed(WrFailure {
            status: WcStatus::RemoteAccess,
            ..
        }))
    ));
}

#[test]
fn a_send_to_a_peer_without_receives_fails_with_rnr_retries_exceeded() {
    let mut sbuf = [0u8; 16];
    let f = fabric(16);
    let src = f.register(Side::A, &mut sbuf, RW).unwrap();
    let (ea, _eb) = f.ends().unwrap();
    let mut a = Channel::new(ea, ChannelConfig::default(), clock!());
    match a.send(&[src.sge(0..8).unwrap()]) {
        Err(ChannelError::Failed(w)) => assert_eq!(w.status, WcStatus::RnrRetryExceeded),
        other => panic!("expected RNR failure, got {other:?}"),
    }
    assert_eq!(f.stats(Side::A).rnr_retries, 3);
}

#[test]
fn a_send_to_a_dead_peer_fails_with_retries_exceeded() {
    let (mut sbuf, mut dbuf) = ([0u8; 16], [0u8; 16]);
    let f = fabric(16);
    let src = f.register(Side::A, &mut sbuf, RW).unwrap();
    let dst = f.register(Side::B, &mut dbuf, RW).unwrap();
    let (ea, _eb) = f.ends().unwrap();
    let mut a = Channel::new(ea, ChannelConfig::default(), clock!());
    f.kill(Side::B);
    match a.write(&[src.sge(0..8).unwrap()], dst.remote()) {
        Err(ChannelError::Failed(w)) => assert_eq!(w.status, WcStatus::RetryExceeded),
        other => panic!("expected a transport failure, got {other:?}"),
    }
}

/// [`Busy`] never pauses between polls, and a wait with it is still bounded: the deadline
/// is checked on every empty poll, not by the back-off.
#[test]
fn a_busy_wait_still_ends_at_its_deadline() {
    let mut rbuf = [0u8; 16];
    let f = fabric(16);
    let mut rm = f.register(Side::B, &mut rbuf, RW).unwrap();
    let (_ea, eb) = f.ends().unwrap();
    let mut b: Channel<_, Busy> =
        Channel::with_backoff(eb, ChannelConfig::default(), Busy, clock!());
    let r = b.recv_timeout(&mut [rm.sge_mut(0..16).unwrap()], Duration::from_millis(10));
    assert_eq!(r, Err(ChannelError::TimedOut { rank: None }));
    let t = b.clock().now().as_nanos();
    assert!((10_000_000..100_000_000).contains(&t), "clock read {t} ns");
}

#[test]
fn recv_timeout_flushes_and_times_out() {
    let mut rbuf = [0u8; 16];
    let f = fabric(16);
    let mut rm = f.register(Side::B, &mut rbuf, RW).unwrap();
    let (_ea, eb) = f.ends().unwrap();
    let mut b = Channel::new(eb, ChannelConfig::default(), clock!());
    let r = b.recv_timeout(&mut [rm.sge_mut(0..16).unwrap()], Duration::from_millis(10));
    assert_eq!(r, Err(ChannelError::TimedOut { rank: None }));
    assert_eq!(b.outstanding_recvs(), 0);
    assert_eq!(f.recv_queue_used(Side::B), 0);
    assert!(f.in_error(Side::B));
    assert_eq!(b.fault(), Some(ChannelError::TimedOut { rank: None }));
    // The buffer is ours again.
    assert!(rm.write_from(0, b"reusable"));
    let t = b.clock().now().as_nanos();
    assert!((10_000_000..100_000_000).contains(&t), "clock read {t} ns");
}

#[test]
fn recv_timeout_returns_data_in_time() {
    let (mut sbuf, mut rbuf) = ([0u8; 16], [0u8; 16]);
    let f = SoftFabric::new(caps(16), RnrRetry::Infinite, RetryCount::default());
    let src = f.register(Side::A, &mut sbuf, RW).unwrap();
    let mut rm = f.register(Side::B, &mut rbuf, RW).unwrap();
    src.write_from(0, b"on time!");
    let (ea, eb) = f.ends().unwrap();
    let mut a = Channel::new(ea, ChannelConfig::default(), clock!());
    let mut b = Channel::new(eb, ChannelConfig::default(), clock!());
    let g = [src.sge(0..8).unwrap()];
    let info = a
        .scope(|s| {
            let p = s.send(&g)?;
            let info =
                b.recv_timeout(&mut [rm.sge_mut(0..16).unwrap()], Duration::from_millis(10))?;
            s.wait(p)?;
            Ok::<_, ChannelError>(info)
        })
        .unwrap()
        .unwrap();
    assert_eq!(info.byte_len, 8);
    assert_eq!(&bytes::<8>(&rm, 0), b"on time!");
}

#[test]
fn scope_drains_on_early_return() {
    let (mut sbuf, mut wbuf, mut rbuf) = ([0u8; 16], [0u8; 64], [0u8; 16]);
    let f = fabric(16);
    let src = f.register(Side::A, &mut sbuf, RW).unwrap();
    let wm = f.register(Side::B, &mut wbuf, RW).unwrap();
    let mut rm = f.register(Side::B, &mut rbuf, RW).unwrap();
    src.write_from(0, b"early!!!");
    let (ea, eb) = f.ends().unwrap();
    let mut a = Channel::new(ea, ChannelConfig::default(), clock!());
    let mut b = Channel::new(eb, ChannelConfig::default(), clock!());
    let g = [src.sge(0..8).unwrap()];
    let remote = wm.remote();

    // Writes posted and never waited for inside the scope.
    let r: Result<Result<(), &str>, ChannelError> = a.scope(|s| {
        for i in 0..4 {
            s.write(&g, remote.slice(i * 8, 8).unwrap())
                .map_err(|_| "post")?;
        }
        Err("early return")
    });
    assert_eq!(r, Ok(Err("early return")));
    assert_eq!(a.outstanding_sends(), 0);
    assert_eq!(&bytes::<32>(&wm, 0)[24..], b"early!!!");

    // A receive posted in a scope that returns before waiting for it.
    {
        let mut rs = [rm.sge_mut(0..16).unwrap()];
        let r = b.scope(|s| {
            let _p = s.recv(&mut rs)?;
            a.send(&g)?;
            Err::<(), _>(ChannelError::RecvQueueFull) // any early exit
        });
        assert_eq!(r, Ok(Err(ChannelError::RecvQueueFull)));
    }
    assert_eq!(b.outstanding_recvs(), 0);
    assert_eq!(&bytes::<8>(&rm, 0), b"early!!!");
}

#[test]
fn scope_drains_on_panic() {
    let (mut sbuf, mut wbuf) = ([0u8; 16], [0u8; 64]);
    let f = fabric(16);
    let src = f.register(Side::A, &mut sbuf, RW).unwrap();
    let wm = f.register(Side::B, &mut wbuf, RW).unwrap();
    src.write_from(0, b"panic!!!");
    let (ea, _eb) = f.ends().unwrap();
    let mut a = Channel::new(ea, ChannelConfig::default(), clock!());
    let g = [src.sge(0..8).unwrap()];
    let remote = wm.remote();
    let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        let _ = a.scope(|s| {
            s.write(&g, remote.slice(8, 8).unwrap()).unwrap();
            panic!("in scope");
        });
    }));
    assert!(r.is_err());
    assert_eq!(a.outstanding_sends(), 0);
    assert_eq!(&bytes::<8>(&wm, 8), b"panic!!!");
}

#[test]
fn a_failure_in_a_scope_is_reported_by_the_scope() {
    let (mut sbuf, mut dbuf) = ([0u8; 16], [0u8; 16]);
    let f = fabric(16);
    let src = f.register(Side::A, &mut sbuf, RW).unwrap();
    let dst = f.register(Side::B, &mut dbuf, RO).unwrap();
    let (ea, _eb) = f.ends().unwrap();
    let mut a = Channel::new(ea, ChannelConfig::default(), clock!());
    let g = [src.sge(0..8).unwrap()];
    let remote = dst.remote(); // no remote write access
    let r = a.scope(|s| {
        let _ = s.write(&g, remote);
    });
    match r {
        Err(ChannelError::Broken(w)) | Err(ChannelError::Failed(w)) => {
            assert_eq!(w.status, WcStatus::RemoteAccess)
        }
        other => panic!("expected the write's failure, got {other:?}"),
    }
}

const RO: AccessFlags = AccessFlags::REMOTE_READ;

/// Receive results live in a table of `R` slots indexed by sequence number: a scope that
/// posts more than `R` receives over its life must not have an unread result overwritten.
#[test]
fn scoped_receive_results_are_not_overwritten() {
    let (mut sbuf, mut rbuf) = ([0u8; 16], [0u8; 64]);
    let f = SoftFabric::new(caps(16), RnrRetry::Infinite, RetryCount::default());
    let src = f.register(Side::A, &mut sbuf, RW).unwrap();
    let mut rm = f.register(Side::B, &mut rbuf, RW).unwrap();
    let (ea, eb) = f.ends().unwrap();
    let mut a = Channel::new(ea, ChannelConfig::default(), clock!());
    let mut b: Channel<_, Spin, 4> =
        Channel::with_backoff(eb, ChannelConfig::default(), Spin, clock!());
    let g: [Sge<'_>; 5] = core::array::from_fn(|i| src.sge(0..i + 1).unwrap());
    let mut rs: [SgeMut<'_>; 6] = rm
        .sges_mut(core::array::from_fn(|i| i * 8..i * 8 + 8))
        .unwrap();
    let (first, refused, last) = b
        .scope(|s| {
            let mut it = rs.iter_mut();
            let p0 = s.recv(core::slice::from_mut(it.next().unwrap()))?;
            a.send(&g[0..1])?; // completes receive 0 (1 byte), left unread for now
            s.poll()?;
            for i in 1..4 {
                let p = s.recv(core::slice::from_mut(it.next().unwrap()))?;
                a.send(&g[i..i + 1])?;
                s.wait(p)?;
            }
            // Receive 4 would reuse receive 0's slot while its result is unread: refused.
            let e4 = it.next().unwrap();
            let refused = s.recv(core::slice::from_mut(e4));
            let first = s.wait(p0)?;
            // Once it is read, the slot is free again.
            let p4 = s.recv(core::slice::from_mut(it.next().unwrap()))?;
            a.send(&g[4..5])?;
            let last = s.wait(p4)?;
            Ok::<_, rverbs_core::channel::ChannelError>((first, refused.err(), last))
        })
        .unwrap()
        .unwrap();
    assert_eq!(
        first.byte_len, 1,
        "receive 0 reports another receive's result"
    );
    assert_eq!(
        refused,
        Some(rverbs_core::channel::ChannelError::RecvQueueFull)
    );
    assert_eq!(last.byte_len, 5);
}

/// `Batch::signaled` asks for a completion of a request that is not a k-th one; the engine
/// clears the flag again when it assigns signal flags.
#[test]
fn batch_signaled_requests_a_completion() {
    let (mut sbuf, mut dbuf) = ([0u8; 64], [0u8; 64]);
    let f = fabric(128);
    let src = f.register(Side::A, &mut sbuf, RW).unwrap();
    let dst = f.register(Side::B, &mut dbuf, RW).unwrap();
    let (ea, _eb) = f.ends().unwrap();
    let mut a = Channel::new(ea, ChannelConfig::default(), clock!());
    assert!(a.signal_every() > 8);
    let g = [src.sge(0..8).unwrap()];
    let mut batch = a.batch();
    for i in 0..8 {
        batch
            .write(&g, dst.remote().slice(i * 8, 8).unwrap())
            .unwrap();
        if i == 2 {
            batch.signaled();
        }
    }
    batch.run().unwrap();
    assert_eq!(f.stats(Side::A).send_cqes, 2);
}

/// A receive flushed because the queue pair went to the error state (here: killed) is a
/// failure like any other: the channel must report itself broken afterwards. (Found by the
/// `channel_ops` fuzz target.)
#[test]
fn flushed_receive_breaks_the_channel() {
    let mut rbuf = [0u8; 16];
    let f = fabric(4);
    let mut rm = f.register(Side::A, &mut rbuf, RW).unwrap();
    let (ea, _eb) = f.ends().unwrap();
    let mut a = Channel::new(ea, ChannelConfig::default(), clock!());
    f.kill(Side::A);
    let r = a.recv_timeout(&mut [rm.sge_mut(0..0).unwrap()], Duration::from_millis(10));
    assert!(r.is_err(), "{r:?}");
    assert!(
        a.fault().is_some(),
        "an error reached the QP but the channel is not broken"
    );
    assert!(a
        .post_write_inline(b"x", rverbs_core::sge::RemoteMemory::default())
        .is_err());
}

/// Unpolled posts ask for a completion only every k-th request; a wait for a ticket no
/// signaled request covers posts one signaled zero-length write behind it (which touches no
/// memory), and calls that wait at once signal their own request instead.
#[test]
fn unpolled_posts_signal_every_kth_and_waits_cover_the_rest() {
    let (mut sbuf, mut dbuf) = ([0u8; 8], [0u8; 256]);
    let f = fabric(64);
    let _src = f.register(Side::A, &mut sbuf, RW).unwrap();
    let dst = f.register(Side::B, &mut dbuf, RW).unwrap();
    let (ea, _eb) = f.ends().unwrap();
    let mut cfg = ChannelConfig::default();
    cfg.signal_every = 8;
    let mut a = Channel::new(ea, cfg, clock!());
    let at = |i: u64| dst.remote().slice(i * 8, 8).unwrap();

    // 20 unpolled writes: requests 8 and 16 are signaled, the last 4 are not.
    let mut tickets = Vec::new();
    for i in 0..20u64 {
        tickets.push(a.post_write_inline(&i.to_le_bytes(), at(i)).unwrap());
    }
    a.poll().unwrap();
    let s = f.stats(Side::A);
    assert_eq!((s.sends_posted, s.send_cqes), (20, 2));
    assert_eq!(a.outstanding_sends(), 4, "only the signaled ones retire");
    // A covered ticket needs no cover.
    a.wait(tickets[3]).unwrap();
    assert_eq!(f.stats(Side::A).sends_posted, 20);
    // The last one is covered by one zero-length write.
    a.wait(tickets[19]).unwrap();
    let s = f.stats(Side::A);
    assert_eq!((s.sends_posted, s.send_cqes), (21, 3));
    assert_eq!(a.outstanding_sends(), 0);
    for i in 0..20u64 {
        // Bytes, not load_u64: the stack buffer need not be 8-aligned (Miri moves it).
        assert_eq!(bytes::<8>(&dst, i as usize * 8), i.to_le_bytes());
    }
    assert_eq!(bytes::<8>(&dst, 160), [0; 8], "the cover wrote nothing");

    // try_wait covers too, and comes back complete.
    let t = a.post_write_inline(&[9; 8], at(21)).unwrap();
    let mut polls = 0;
    while a.try_wait(t).is_none() {
        polls += 1;
        assert!(polls < 100, "try_wait never completed an unsignaled ticket");
    }
    assert_eq!(f.stats(Side::A).sends_posted, 23);

    // Blocking calls and Batch::run signal their own last request: no cover.
    a.write_inline(&[1; 8], at(22)).unwrap();
    let mut b = a.batch();
    b.write_inline(&[2; 8], at(23)).unwrap();
    b.write_inline(&[3; 8], at(24)).unwrap();
    b.run().unwrap();
    // Posting empties the batch: running it again posts nothing.
    assert!(b.is_empty());
    b.run().unwrap();
    assert_eq!(f.stats(Side::A).sends_posted, 26);
    assert_eq!(a.outstanding_sends(), 0);

    // A scope's end covers what it posted unsignaled.
    a.scope(|s| s.write_inline(&[4; 8], at(25)))
        .unwrap()
        .unwrap();
    assert_eq!(a.outstanding_sends(), 0);
    assert_eq!(bytes::<8>(&dst, 25 * 8), [4; 8]);
}

/// The closure of [`Scope::batch`](rverbs_core::channel::Scope::batch) gets `&mut Batch`,
/// and safe code can put a batch of another channel there (`mem::swap`: the borrow checker
/// allows a batch of a channel borrowed for as long as the providers' own lifetime). The scope
/// must not post it: it waits only for its own channel, and would hand the buffers back while
/// the other channel's request still waits to run (a send blocked until the peer posts a
/// receive), reading them later.
#[test]
fn a_scope_posts_no_batch_of_another_channel() {
    let (mut sbuf, mut dbuf) = ([1u8; 8], [0u8; 8]);
    let waits = || SoftFabric::new(caps(16), RnrRetry::Infinite, RetryCount::new(3).unwrap());
    // On the heap: two fabrics overflow a test thread's stack.
    let (mine, theirs) = (Box::new(waits()), Box::new(waits()));
    let src = theirs.register(Side::A, &mut sbuf, RW).unwrap();
    let mut dst = theirs.register(Side::B, &mut dbuf, RW).unwrap();
    let (ea, _eb) = mine.ends().unwrap();
    let (oa, ob) = theirs.ends().unwrap();
    let mut chan = Channel::new(ea, ChannelConfig::default(), clock!());
    let mut other = Channel::new(oa, ChannelConfig::default(), clock!());
    // A short timeout: the receive below waits it out when nothing was posted.
    let mut peer = Channel::new(
        ob,
        ChannelConfig::with_timeout(Duration::from_millis(20)),
        clock!(),
    );
    let g = [src.sge(0..8).unwrap()];
    let g = &g;
    let other = &mut other;
    let r = chan.scope(move |s| {
        s.batch(move |b| {
            let mut foreign = other.batch();
            foreign.send(g)?;
            core::mem::swap(b, &mut foreign);
            Ok::<(), ChannelError>(())
        })
    });
    // The scope has returned: the buffer is the caller's again, and it writes new bytes.
    src.write_from(0, &[2u8; 8]);
    // A receive at the peer: a send still posted would run now and read them.
    let got = {
        let mut rs = [dst.sge_mut(0..8).unwrap()];
        peer.recv(&mut rs)
    };
    assert!(
        r == Ok(Err(ChannelError::Replaced)) && got == Err(ChannelError::TimedOut { rank: None }),
        "the scope posted a batch of another channel ({r:?}), whose send ran after the \
         scope returned ({got:?}) and read the bytes written since: {:?}",
        bytes::<8>(&dst, 0)
    );
}
