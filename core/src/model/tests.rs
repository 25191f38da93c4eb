//! Unit tests of the model (the key encoding is tested beside it, in `keys.rs`).

use crate::completion::{Completion, CompletionKind, WcStatus};
use crate::params::{QpCaps, RetryCount, RnrRetry};
use crate::provider::{Provider, QueuePair};
use crate::sge::{RemoteMemory, Sge, SgeMut};
use crate::wr::{Opcode, PostFailure, RecvRequest, SendFlags, WorkRequest, MAX_BATCH};

use super::keys::Reach;
use super::{
    AccessFlags, Side, SoftEnd, SoftError, SoftFabric, SoftRegion, SoftStats, EINVAL, ENOMEM,
    MAX_INLINE, MAX_REGIONS, MAX_SGE, QUEUE_CAP,
};

const CAPS: QpCaps = QpCaps {
    max_inline_data: 32,
    ..QpCaps::queues(8, 8).with_sges(3)
};

const RW: AccessFlags = AccessFlags::LOCAL_WRITE
    .union(AccessFlags::REMOTE_WRITE)
    .union(AccessFlags::REMOTE_READ);

fn fabric<'m>() -> SoftFabric<'m> {
    SoftFabric::new(CAPS, RnrRetry::Times(2), RetryCount::new(3).unwrap())
}

fn wr<'a>(id: u64, op: Opcode, flags: SendFlags, sges: &'a [Sge<'a>]) -> WorkRequest<'a> {
    WorkRequest {
        wr_id: id,
        opcode: op,
        flags: flags | SendFlags::SIGNALED,
        sges,
        remote: RemoteMemory::default(),
    }
}

/// A scatter entry as the entry type receive requests carry.
/// A receive request `wr_id` scattering into `sges`.
pub(super) fn recv<'a>(wr_id: u64, sges: &'a [Sge<'a>]) -> RecvRequest<'a> {
    RecvRequest { wr_id, sges }
}

/// The failure of a post that posted `posted` requests and refused the next with `errno`.
pub(super) fn refused(posted: usize, errno: i32) -> PostFailure {
    PostFailure { posted, errno }
}

fn rs<'a>(x: &SgeMut<'a>) -> Sge<'a> {
    // SAFETY: same range and key; the caller keeps the SgeMut borrowed meanwhile.
    unsafe { Sge::from_raw(x.addr(), x.len(), x.lkey()) }
}

fn poll_s(e: &mut SoftEnd<'_>) -> ([Completion; 16], usize) {
    let mut wc = [Completion::EMPTY; 16];
    let n = e.poll_send(&mut wc).unwrap();
    (wc, n)
}

fn poll_r(e: &mut SoftEnd<'_>) -> ([Completion; 16], usize) {
    let mut wc = [Completion::EMPTY; 16];
    let n = e.poll_recv(&mut wc).unwrap();
    (wc, n)
}

#[test]
fn requested_caps_beyond_the_model_are_clamped_to_its_limits() {
    let big = QpCaps {
        max_send_wr: 10_000,
        max_recv_wr: 10_000,
        max_send_sge: 99,
        max_recv_sge: 99,
        max_inline_data: 4096,
    };
    let f = SoftFabric::new(big, RnrRetry::Infinite, RetryCount::default());
    let (a, _) = f.ends().unwrap();
    assert_eq!(
        a.caps(),
        QpCaps {
            max_send_wr: QUEUE_CAP as u32,
            max_recv_wr: QUEUE_CAP as u32,
            max_send_sge: MAX_SGE as u32,
            max_recv_sge: MAX_SGE as u32,
            max_inline_data: MAX_INLINE as u32,
        }
    );
}

#[test]
fn write_signaled_and_unsignaled() {
    // 8-aligned, so the u64 loads below are aligned by address (what they check).
    #[repr(align(8))]
    struct Aligned([u8; 16]);
    let (mut src, mut dst) = ([0u8; 16], Aligned([0u8; 16]));
    let f = fabric();
    let s = f.register(Side::A, &mut src, AccessFlags::empty()).unwrap();
    let d = f.register(Side::B, &mut dst.0, RW).unwrap();
    s.write_from(0, b"0123456789abcdef");
    let (mut a, _b) = f.ends().unwrap();
    let g1 = [s.sge(0..4).unwrap()];
    let g2 = [s.sge(4..8).unwrap(), s.sge(12..16).unwrap()];
    let mut w1 = wr(1, Opcode::Write, SendFlags::empty(), &g1);
    w1.flags = SendFlags::empty();
    w1.remote = d.remote();
    let mut w2 = wr(2, Opcode::Write, SendFlags::empty(), &g2);
    w2.remote = d.remote().slice(8, 8).unwrap();
    // SAFETY: the regions outlive the requests, which complete inside the post.
    unsafe { a.post_send(&[w1, w2]) }.unwrap();
    assert_eq!(f.send_queue_used(Side::A), 2);
    let (wc, n) = poll_s(&mut a);
    assert_eq!(n, 1);
    assert_eq!(wc[0].wr_id, 2);
    assert_eq!(wc[0].kind, CompletionKind::Write);
    assert_eq!(wc[0].byte_len, 8);
    assert_eq!(wc[0].qp_num, Side::A.qp_num());
    assert_eq!(f.send_queue_used(Side::A), 0);
    let mut got = [0u8; 16];
    assert!(d.read_into(0, &mut got));
    assert_eq!(&got, b"0123\x00\x00\x00\x004567cdef");
    assert_eq!(d.load_u64(8), Some(u64::from_le_bytes(*b"4567cdef")));
    assert_eq!(d.load_u64(3), None);
}

#[test]
fn send_recv_scatter_imm_and_write_imm() {
    let (mut src, mut dst, mut tgt) = ([0u8; 8], [0u8; 8], [0u8; 8]);
    let f = fabric();
    let s = f.register(Side::A, &mut src, AccessFlags::empty()).unwrap();
    let mut d = f
        .register(Side::B, &mut dst, AccessFlags::LOCAL_WRITE)
        .unwrap();
    let t = f.register(Side::B, &mut tgt, RW).unwrap();
    s.write_from(0, b"abcdefgh");
    let (mut a, mut b) = f.ends().unwrap();
    {
        let [x, y] = d.sges_mut([0..2, 4..8]).unwrap();
        let rs = [rs(&x), rs(&y)];
        let rr = [recv(10, &rs), recv(11, &[])];
        // SAFETY: the region outlives the receives, polled below.
        unsafe { b.post_recv(&rr) }.unwrap();
        let g = [s.sge(0..5).unwrap()];
        let sends = [wr(1, Opcode::SendImm(0xfeed), SendFlags::empty(), &g), {
            let mut w = wr(2, Opcode::WriteImm(7), SendFlags::empty(), &g[..]);
            w.remote = t.remote();
            w
        }];
        // SAFETY: as above.
        unsafe { a.post_send(&sends) }.unwrap();
    }
    let (wc, n) = poll_r(&mut b);
    assert_eq!(n, 2);
    assert_eq!(
        (wc[0].wr_id, wc[0].kind, wc[0].byte_len, wc[0].imm),
        (10, CompletionKind::Recv, 5, Some(0xfeed))
    );
    assert_eq!(wc[0].qp_num, Side::B.qp_num());
    assert_eq!(
        (wc[1].wr_id, wc[1].kind, wc[1].byte_len, wc[1].imm),
        (11, CompletionKind::RecvWriteImm, 5, Some(7))
    );
    let mut got = [0u8; 8];
    d.read_into(0, &mut got);
    assert_eq!(&got, b"ab\0\0cde\0");
    t.read_into(0, &mut got);
    assert_eq!(&got, b"abcde\0\0\0");
    let (wc, n) = poll_s(&mut a);
    assert_eq!(n, 2);
    assert_eq!(wc[0].kind, CompletionKind::Send);
    assert_eq!(f.recv_queue_used(Side::B), 0);
}

#[test]
fn read_needs_remote_read() {
    let (mut l, mut r1, mut r2) = ([0u8; 8], [0u8; 8], [0u8; 8]);
    let f = fabric();
    let mut lm = f
        .register(Side::A, &mut l, AccessFlags::LOCAL_WRITE)
        .unwrap();
    let ok = f.register(Side::B, &mut r1, RW).unwrap();
    let no = f
        .register(Side::B, &mut r2, AccessFlags::LOCAL_WRITE)
        .unwrap();
    ok.write_from(0, b"remote!!");
    let (mut a, _b) = f.ends().unwrap();
    {
        let m = lm.sge_mut(0..8).unwrap();
        let s = [rs(&m)];
        let mut w = wr(1, Opcode::Read, SendFlags::empty(), &s);
        w.remote = ok.remote();
        // SAFETY: completes in the post; polled below.
        unsafe { a.post_send(&[w]) }.unwrap();
        let (wc, n) = poll_s(&mut a);
        assert_eq!(
            (n, wc[0].kind, wc[0].byte_len),
            (1, CompletionKind::Read, 8)
        );
        w.remote = no.remote();
        w.wr_id = 2;
        // SAFETY: as above.
        unsafe { a.post_send(&[w]) }.unwrap();
    }
    let mut got = [0u8; 8];
    lm.read_into(0, &mut got);
    assert_eq!(&got, b"remote!!");
    let (wc, n) = poll_s(&mut a);
    assert_eq!(
        (n, wc[0].wr_id, wc[0].status),
        (1, 2, WcStatus::RemoteAccess)
    );
    assert!(f.in_error(Side::A) && f.in_error(Side::B));
}

#[test]
fn bad_lkey_fails_and_flushes_the_rest() {
    let mut src = [0u8; 8];
    let f = fabric();
    let s = f.register(Side::A, &mut src, RW).unwrap();
    let (mut a, mut b) = f.ends().unwrap();
    let good = [s.sge(0..8).unwrap()];
    // SAFETY: never dereferenced: the lkey does not resolve.
    let bad = [unsafe { Sge::from_raw(s.sge(0..8).unwrap().addr(), 8, s.lkey() ^ 1) }];
    let mut w = [
        wr(1, Opcode::Write, SendFlags::empty(), &bad),
        wr(2, Opcode::Write, SendFlags::empty(), &good),
        wr(3, Opcode::Write, SendFlags::empty(), &good),
    ];
    for x in &mut w {
        x.remote = s.remote();
        x.flags = SendFlags::empty();
    }
    let rr = [recv(9, &[])];
    // SAFETY: the receive names no memory.
    unsafe { a.post_recv(&rr) }.unwrap();
    // SAFETY: nothing is written (the first fails, the rest flush).
    unsafe { a.post_send(&w) }.unwrap();
    let (wc, n) = poll_s(&mut a);
    assert_eq!(n, 3, "unsignaled requests flush too");
    assert_eq!((wc[0].wr_id, wc[0].status), (1, WcStatus::LocalProtection));
    assert_eq!(wc[0].kind, CompletionKind::Other);
    assert_eq!((wc[1].wr_id, wc[1].status), (2, WcStatus::Flushed));
    assert_eq!((wc[2].wr_id, wc[2].status), (3, WcStatus::Flushed));
    let (wc, n) = poll_r(&mut a);
    assert_eq!((n, wc[0].wr_id, wc[0].status), (1, 9, WcStatus::Flushed));
    assert!(!f.in_error(Side::B));
    // Posting in the error state works and flushes.
    // SAFETY: as above.
    unsafe { a.post_send(&w[1..2]) }.unwrap();
    assert_eq!(poll_s(&mut a).0[0].status, WcStatus::Flushed);
    let (wc, n) = poll_r(&mut b);
    assert_eq!(n, 0, "{:?}", wc[0]);
}

#[test]
fn short_receive_is_a_length_error_on_both_sides() {
    let (mut src, mut dst) = ([0u8; 8], [0u8; 4]);
    let f = fabric();
    let s = f.register(Side::A, &mut src, AccessFlags::empty()).unwrap();
    let mut d = f
        .register(Side::B, &mut dst, AccessFlags::LOCAL_WRITE)
        .unwrap();
    let (mut a, mut b) = f.ends().unwrap();
    {
        let m = d.sge_mut(0..4).unwrap();
        let rs = [rs(&m)];
        let rr = [recv(1, &rs), recv(2, &rs)];
        // SAFETY: nothing is written (too short), the second flushes.
        unsafe { b.post_recv(&rr) }.unwrap();
        let g = [s.sge(0..8).unwrap()];
        // SAFETY: as above.
        unsafe { a.post_send(&[wr(5, Opcode::Send, SendFlags::empty(), &g)]) }.unwrap();
    }
    let (wc, n) = poll_s(&mut a);
    assert_eq!((n, wc[0].status), (1, WcStatus::RemoteInvalidRequest));
    let (wc, n) = poll_r(&mut b);
    assert_eq!(n, 2);
    assert_eq!((wc[0].wr_id, wc[0].status), (1, WcStatus::LocalLength));
    assert_eq!((wc[1].wr_id, wc[1].status), (2, WcStatus::Flushed));
}

#[test]
fn rnr_waits_for_a_receive_then_gives_up() {
    let mut src = [0u8; 4];
    let f = fabric();
    let s = f.register(Side::A, &mut src, AccessFlags::empty()).unwrap();
    let (mut a, mut b) = f.ends().unwrap();
    let g = [s.sge(0..4).unwrap()];
    let w = [wr(1, Opcode::Send, SendFlags::empty(), &g)];
    // SAFETY: the region outlives the request, polled below.
    unsafe { a.post_send(&w) }.unwrap();
    assert_eq!(poll_s(&mut a).1, 0); // retry 1 of 2
    let rr = [recv(3, &[])];
    // A receive posted in time unblocks the send; a zero-length receive cannot hold 4 bytes.
    // SAFETY: names no memory.
    unsafe { b.post_recv(&rr) }.unwrap();
    let (wc, n) = poll_s(&mut a);
    assert_eq!((n, wc[0].status), (1, WcStatus::RemoteInvalidRequest));

    let f = SoftFabric::new(CAPS, RnrRetry::Times(2), RetryCount::default());
    let (mut a, _b) = f.ends().unwrap();
    let w = [wr(1, Opcode::Send, SendFlags::empty(), &[])];
    // SAFETY: names no memory.
    unsafe { a.post_send(&w) }.unwrap();
    assert_eq!(poll_s(&mut a).1, 0);
    let (wc, n) = poll_s(&mut a);
    assert_eq!((n, wc[0].status), (1, WcStatus::RnrRetryExceeded));
    assert_eq!(f.stats(Side::A).rnr_retries, 2);

    let f = SoftFabric::new(CAPS, RnrRetry::Infinite, RetryCount::default());
    let (mut a, mut b) = f.ends().unwrap();
    // SAFETY: names no memory.
    unsafe { a.post_send(&w) }.unwrap();
    for _ in 0..50 {
        assert_eq!(poll_s(&mut a).1, 0);
    }
    // SAFETY: names no memory.
    unsafe { b.post_recv(&rr) }.unwrap();
    assert_eq!(poll_s(&mut a).0[0].status, WcStatus::Success);
    assert_eq!(poll_r(&mut b).0[0].byte_len, 0);
}

#[test]
fn rnr_retry_zero_fails_at_once() {
    let f = SoftFabric::new(CAPS, RnrRetry::Times(0), RetryCount::default());
    let (mut a, _b) = f.ends().unwrap();
    let w = [wr(1, Opcode::Send, SendFlags::empty(), &[])];
    // SAFETY: names no memory.
    unsafe { a.post_send(&w) }.unwrap();
    assert_eq!(poll_s(&mut a).0[0].status, WcStatus::RnrRetryExceeded);
}

#[test]
fn dead_peer_is_retry_exceeded() {
    let f = fabric(); // retry_count 3
    let (mut a, mut b) = f.ends().unwrap();
    let rr = [recv(3, &[])];
    // SAFETY: names no memory.
    unsafe { b.post_recv(&rr) }.unwrap();
    f.kill(Side::B);
    assert_eq!(poll_r(&mut b).0[0].status, WcStatus::Flushed);
    let w = [wr(1, Opcode::Send, SendFlags::empty(), &[])];
    // SAFETY: names no memory.
    unsafe { a.post_send(&w) }.unwrap();
    for _ in 0..2 {
        assert_eq!(poll_s(&mut a).1, 0);
    }
    assert_eq!(poll_s(&mut a).0[0].status, WcStatus::RetryExceeded);
    assert_eq!(f.stats(Side::A).transport_retries, 3);
}

#[test]
fn queue_full_is_enomem_with_posted_count() {
    let f = fabric();
    let (mut a, mut b) = f.ends().unwrap();
    let w = [wr(0, Opcode::Write, SendFlags::empty(), &[]); 6];
    // SAFETY: zero-length writes name no memory.
    unsafe { a.post_send(&w) }.unwrap();
    // SAFETY: as above.
    let e = unsafe { a.post_send(&w) }.unwrap_err();
    assert_eq!(e, refused(2, ENOMEM));
    let (_, n) = poll_s(&mut a);
    assert_eq!(n, 8);
    assert_eq!(f.send_queue_used(Side::A), 0);
    // SAFETY: as above.
    unsafe { a.post_send(&w) }.unwrap();
    let too_many = [wr(0, Opcode::Write, SendFlags::empty(), &[]); MAX_BATCH + 1];
    // SAFETY: as above.
    let e = unsafe { a.post_send(&too_many) }.unwrap_err();
    assert_eq!(e.errno, EINVAL);

    let rr = [recv(0, &[]); 9];
    // SAFETY: names no memory.
    let e = unsafe { b.post_recv(&rr) }.unwrap_err();
    assert_eq!(e, refused(8, ENOMEM));
}

#[test]
fn einval_for_sges_and_inline() {
    let mut buf = [0u8; 64];
    let f = fabric();
    let s = f.register(Side::A, &mut buf, RW).unwrap();
    let (mut a, mut b) = f.ends().unwrap();
    let four = [s.sge(0..1).unwrap(); 4];
    let w = [
        wr(1, Opcode::Write, SendFlags::empty(), &four[..3]),
        wr(2, Opcode::Write, SendFlags::empty(), &four),
    ];
    // SAFETY: zero rkey: nothing is written remotely; the first fails with RemoteAccess.
    let e = unsafe { a.post_send(&w) }.unwrap_err();
    assert_eq!(e, refused(1, EINVAL));
    let data = [7u8; 33];
    // SAFETY: inline data is a live slice.
    let big = [unsafe { Sge::from_raw(data.as_ptr() as u64, 33, 0) }];
    let w = [wr(3, Opcode::Send, SendFlags::INLINE, &big)];
    // SAFETY: rejected before reading.
    let e = unsafe { a.post_send(&w) }.unwrap_err();
    assert_eq!(e, refused(0, EINVAL));
    let rr = [recv(0, &four)];
    // SAFETY: rejected.
    let e = unsafe { b.post_recv(&rr) }.unwrap_err();
    assert_eq!(e, refused(0, EINVAL));
}

#[test]
fn inline_is_copied_at_post_time() {
    let mut dst = [0u8; 8];
    let f = fabric();
    let mut d = f
        .register(Side::B, &mut dst, AccessFlags::LOCAL_WRITE)
        .unwrap();
    let (mut a, mut b) = f.ends().unwrap();
    let mut data = *b"inline!!";
    {
        // SAFETY: a live slice; inline entries are read during the post only.
        let g = [unsafe { Sge::from_raw(data.as_ptr() as u64, 8, 0) }];
        let w = [wr(1, Opcode::Send, SendFlags::INLINE, &g)];
        // SAFETY: as above.
        unsafe { a.post_send(&w) }.unwrap(); // RNR-blocked: no receive yet
    }
    data.fill(0);
    assert_eq!(data, [0; 8]);
    {
        let m = d.sge_mut(0..8).unwrap();
        let rs = [rs(&m)];
        let rr = [recv(4, &rs)];
        // SAFETY: the region outlives the receive, polled below.
        unsafe { b.post_recv(&rr) }.unwrap();
    }
    assert_eq!(poll_r(&mut b).0[0].byte_len, 8);
    let mut got = [0u8; 8];
    d.read_into(0, &mut got);
    assert_eq!(&got, b"inline!!");
}

#[test]
fn stale_and_foreign_keys_do_not_resolve() {
    let (mut x, mut y, mut z) = ([0u8; 8], [0u8; 8], [0u8; 8]);
    let f = fabric();
    let s = f.register(Side::A, &mut x, RW).unwrap();
    let old = {
        let r = f.register(Side::B, &mut y, RW).unwrap();
        r.remote()
    };
    let fresh = f.register(Side::B, &mut z, RW).unwrap();
    assert_ne!(old.rkey, fresh.rkey());
    let (mut a, _b) = f.ends().unwrap();
    let g = [s.sge(0..8).unwrap()];
    let mut w = wr(1, Opcode::Write, SendFlags::empty(), &g);
    w.remote = RemoteMemory {
        addr: fresh.remote().addr,
        ..old
    };
    // SAFETY: the stale rkey resolves to nothing, so nothing is written.
    unsafe { a.post_send(&[w]) }.unwrap();
    assert_eq!(poll_s(&mut a).0[0].status, WcStatus::RemoteAccess);
    // An rkey of side A used against side B, and an lkey used as rkey.
    let st = f.shared.state.borrow();
    let at = fresh.remote().addr;
    assert!(st[1]
        .resolve(1, &Reach::remote(fresh.rkey(), at, 8, RW))
        .is_some());
    assert!(st[1]
        .resolve(1, &Reach::remote(fresh.rkey(), at + 1, 8, RW))
        .is_none());
    assert!(st[1]
        .resolve(1, &Reach::remote(fresh.lkey(), at, 8, RW))
        .is_none());
    let sa = s.remote();
    assert!(st[1]
        .resolve(1, &Reach::remote(sa.rkey, sa.addr, 8, RW))
        .is_none());
    assert!(st[0]
        .resolve(0, &Reach::remote(sa.rkey, sa.addr, 8, RW))
        .is_some());
}

#[test]
fn registration_refuses_empty_buffers_remote_write_without_local_write_and_a_full_table() {
    let mut bufs = [[0u8; 1]; MAX_REGIONS + 2];
    let mut empty = [0u8; 0];
    let f = fabric();
    assert_eq!(
        f.register(Side::A, &mut empty, RW).unwrap_err(),
        SoftError::EmptyBuffer
    );
    let mut regs = heapless::Vec::<SoftRegion<'_>, MAX_REGIONS>::new();
    let mut it = bufs.iter_mut();
    for b in it.by_ref().take(MAX_REGIONS) {
        assert!(regs.push(f.register(Side::A, b, RW).unwrap()).is_ok());
    }
    assert_eq!(
        f.register(Side::A, it.next().unwrap(), AccessFlags::REMOTE_WRITE)
            .unwrap_err(),
        SoftError::RemoteWriteNeedsLocalWrite
    );
    assert_eq!(
        f.register(Side::A, it.next().unwrap(), RW).unwrap_err(),
        SoftError::TableFull
    );
    regs.clear();
    assert_eq!(f.stats(Side::A), SoftStats::default());
}

#[test]
fn set_error_flushes_and_peer_sees_no_ack() {
    let f = fabric();
    let (mut a, mut b) = f.ends().unwrap();
    let rr = [recv(1, &[]); 2];
    // SAFETY: names no memory.
    unsafe { b.post_recv(&rr) }.unwrap();
    b.set_error().unwrap();
    let (wc, n) = poll_r(&mut b);
    assert_eq!((n, wc[1].status), (2, WcStatus::Flushed));
    assert_eq!(f.recv_queue_used(Side::B), 0);
    let w = [wr(1, Opcode::Write, SendFlags::empty(), &[])];
    // SAFETY: names no memory.
    unsafe { a.post_send(&w) }.unwrap();
    let mut polls = 0;
    let status = loop {
        let (wc, n) = poll_s(&mut a);
        polls += 1;
        if n > 0 {
            break wc[0].status;
        }
    };
    assert_eq!((status, polls), (WcStatus::RetryExceeded, 3));
}
