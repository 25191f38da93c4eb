//! Unit tests of the net: routing into shared completion queues, per-node keys, waits,
//! retries, deaths, flushes and completion-queue accounting. (The request-level rules are
//! the two-party model's, tested in `soft/tests.rs`; the scale tests are in
//! `tests_scale.rs`.)

use alloc::vec::Vec;

use crate::completion::{Completion, CompletionKind, WcStatus};
use crate::params::{QpCaps, RetryCount, RnrRetry};
use crate::provider::{CompletionQueue, QueuePair, Verb};
use crate::sge::{RemoteMemory, Sge, SgeMut};
use crate::wr::{Opcode, SendFlags, WorkRequest, MAX_BATCH};

use super::super::keys::KeyKind;
use super::super::tests::{recv, refused};
use super::super::{AccessFlags, SoftError, EINVAL, ENOMEM, EOVERFLOW};
use super::region::{net_key, split_net_key};
use super::{NetCq, NetQp, SoftNet, SoftNetConfig, NET_MAX_INLINE, NET_MAX_QUEUE};

pub(super) const CAPS: QpCaps = QpCaps {
    max_inline_data: 16,
    ..QpCaps::queues(4, 4).with_sges(2)
};

pub(super) const RW: AccessFlags = AccessFlags::LOCAL_WRITE
    .union(AccessFlags::REMOTE_WRITE)
    .union(AccessFlags::REMOTE_READ);

fn config(nodes: u32) -> SoftNetConfig {
    let mut c = SoftNetConfig::new(nodes, CAPS);
    c.rnr_retry = RnrRetry::Times(2);
    c.retry_count = RetryCount::new(3).unwrap();
    c
}

pub(super) fn write<'a>(id: u64, sges: &'a [Sge<'a>], remote: RemoteMemory) -> WorkRequest<'a> {
    WorkRequest {
        wr_id: id,
        opcode: Opcode::Write,
        flags: SendFlags::SIGNALED,
        sges,
        remote,
    }
}

fn op<'a>(id: u64, opcode: Opcode, sges: &'a [Sge<'a>]) -> WorkRequest<'a> {
    WorkRequest {
        wr_id: id,
        opcode,
        flags: SendFlags::SIGNALED,
        sges,
        remote: RemoteMemory::default(),
    }
}

/// A scatter entry as the entry type receive requests carry.
fn rs<'a>(x: &SgeMut<'a>) -> Sge<'a> {
    // SAFETY: same range and key; the caller keeps the SgeMut borrowed meanwhile.
    unsafe { Sge::from_raw(x.addr(), x.len(), x.lkey()) }
}

/// Everything one poll returns.
pub(super) fn poll(cq: &mut NetCq<'_>) -> Vec<Completion> {
    let mut wc = [Completion::EMPTY; 64];
    let n = cq.poll(&mut wc).unwrap();
    wc[..n].to_vec()
}

fn recv_empty(qp: &mut NetQp<'_>, id: u64) {
    let rr = [recv(id, &[])];
    // SAFETY: names no memory.
    unsafe { qp.post_recv(&rr) }.unwrap();
}

fn send_empty(qp: &mut NetQp<'_>, id: u64) {
    // SAFETY: names no memory.
    unsafe { qp.post_send(&[op(id, Opcode::Send, &[])]) }.unwrap();
}

#[test]
fn operations_complete_into_their_nodes_queues() {
    let mut bufs = [[0u8; 32]; 5];
    let net = SoftNet::new(config(4));
    let [b0, b1, b2, b3, b4] = &mut bufs;
    let r0 = net.register(0, b0, RW).unwrap();
    let mut r1 = net.register(1, b1, RW).unwrap();
    let r2 = net.register(2, b2, RW).unwrap();
    let mut r3 = net.register(3, b3, RW).unwrap();
    let mut t0 = net.register(0, b4, AccessFlags::LOCAL_WRITE).unwrap();
    let (mut q01, mut q10) = net.connect(0, 1).unwrap();
    let (mut q02, _q20) = net.connect(0, 2).unwrap();
    let (mut q30, mut q03) = net.connect(3, 0).unwrap();
    let nums = [
        q01.qp_num(),
        q10.qp_num(),
        q02.qp_num(),
        q30.qp_num(),
        q03.qp_num(),
    ];
    for (i, a) in nums.iter().enumerate() {
        assert!(nums[i + 1..].iter().all(|b| b != a), "qp_num unique");
    }
    let (mut s0, mut s1, mut s3) = (
        net.send_cq(0).unwrap(),
        net.send_cq(1).unwrap(),
        net.send_cq(3).unwrap(),
    );
    let (mut v0, mut v1, mut v3) = (
        net.recv_cq(0).unwrap(),
        net.recv_cq(1).unwrap(),
        net.recv_cq(3).unwrap(),
    );
    r0.write_from(0, b"write-to-1");
    r2.write_from(0, b"two!");
    {
        let m = r1.sge_mut(16..26).unwrap();
        let into = [rs(&m)];
        let rr = [recv(100, &into)];
        // SAFETY: the region outlives the receive, polled below.
        unsafe { q10.post_recv(&rr) }.unwrap();
        let m = r3.sge_mut(0..8).unwrap();
        let into = [rs(&m)];
        let rr = [recv(300, &into)];
        // SAFETY: as above.
        unsafe { q30.post_recv(&rr) }.unwrap();
    }
    let g = [r0.sge(0..10).unwrap()];
    let m = t0.sge_mut(0..4).unwrap();
    let target = [rs(&m)];
    // SAFETY: every region outlives the requests, which complete inside the posts.
    unsafe {
        q01.post_send(&[
            write(1, &g, r1.remote()),
            op(2, Opcode::SendImm(0xab), &g[..]),
        ])
        .unwrap();
        let mut rd = op(3, Opcode::Read, &target);
        rd.remote = r2.remote();
        q02.post_send(&[rd]).unwrap();
        q03.post_send(&[op(4, Opcode::Send, &[r0.sge(0..4).unwrap()])])
            .unwrap();
    }
    let wc = poll(&mut s0);
    let got: Vec<_> = wc.iter().map(|c| (c.wr_id, c.qp_num, c.kind)).collect();
    assert_eq!(
        got,
        [
            (1, q01.qp_num(), CompletionKind::Write),
            (2, q01.qp_num(), CompletionKind::Send),
            (3, q02.qp_num(), CompletionKind::Read),
            (4, q03.qp_num(), CompletionKind::Send),
        ]
    );
    assert!(wc.iter().all(|c| c.status == WcStatus::Success));
    assert!(poll(&mut s1).is_empty() && poll(&mut s3).is_empty());
    assert!(poll(&mut v0).is_empty());
    let wc = poll(&mut v1);
    assert_eq!(wc.len(), 1);
    assert_eq!(
        (
            wc[0].wr_id,
            wc[0].qp_num,
            wc[0].kind,
            wc[0].byte_len,
            wc[0].imm
        ),
        (100, q10.qp_num(), CompletionKind::Recv, 10, Some(0xab))
    );
    let wc = poll(&mut v3);
    assert_eq!(
        (wc[0].wr_id, wc[0].qp_num, wc[0].byte_len, wc[0].imm),
        (300, q30.qp_num(), 4, None)
    );
    let mut got = [0u8; 10];
    r1.read_into(0, &mut got);
    assert_eq!(&got, b"write-to-1");
    r1.read_into(16, &mut got[..8]);
    assert_eq!(&got[..8], b"write-to");
    t0.read_into(0, &mut got[..4]);
    assert_eq!(&got[..4], b"two!");
    r3.read_into(0, &mut got[..4]);
    assert_eq!(&got[..4], b"writ");
    assert_eq!(net.stats(0).sends_posted, 4);
    assert_eq!(net.stats(0).send_cqes, 4);
    assert_eq!((net.stats(1).recv_cqes, net.stats(3).recv_cqes), (1, 1));
    assert_eq!(net.send_queue_used(q01.qp_num()), 0);
    assert_eq!(net.recv_queue_used(q10.qp_num()), 0);
}

#[test]
fn keys_work_on_every_queue_pair_of_their_node_only() {
    let (mut x, mut y, mut z) = ([0u8; 8], [0u8; 8], [0u8; 8]);
    let net = SoftNet::new(config(3));
    let mut s1 = net.send_cq(1).unwrap();
    let mut s0 = net.send_cq(0).unwrap();
    let mut s2 = net.send_cq(2).unwrap();
    // Node 1's region and node 2's, registered in the same slot with the same access.
    let mut one = net.register(1, &mut x, RW).unwrap();
    let two = net.register(2, &mut y, RW).unwrap();
    let src = net.register(0, &mut z, RW).unwrap();
    assert_ne!(one.rkey(), two.rkey(), "unique generations, unique keys");
    src.write_from(0, b"abcdefgh");
    let (mut q01, mut q10) = net.connect(0, 1).unwrap();
    let (mut q21, mut q12) = net.connect(2, 1).unwrap();
    let (mut q02, _q20) = net.connect(0, 2).unwrap();
    let g = [src.sge(0..4).unwrap()];
    // One rkey of node 1, published to both of its peers.
    // SAFETY: regions outlive the requests, which complete inside the posts.
    unsafe { q01.post_send(&[write(1, &g, one.remote())]) }.unwrap();
    let g2 = [two.sge(4..8).unwrap()];
    let mut w = write(2, &g2, one.remote());
    w.remote.addr += 4;
    // SAFETY: as above.
    unsafe { q21.post_send(&[w]) }.unwrap();
    assert_eq!(poll(&mut s0)[0].status, WcStatus::Success);
    assert_eq!(poll(&mut s2)[0].status, WcStatus::Success);
    let mut got = [0u8; 8];
    one.read_into(0, &mut got);
    assert_eq!(&got, b"abcd\0\0\0\0");
    // One lkey of node 1, good on both of its queue pairs.
    {
        let m = one.sge_mut(0..8).unwrap();
        let l = [rs(&m)];
        let mut rd = op(3, Opcode::Read, &l);
        rd.remote = src.remote();
        // SAFETY: as above.
        unsafe { q10.post_send(&[rd]) }.unwrap();
        rd.wr_id = 4;
        rd.remote = RemoteMemory {
            addr: two.remote().addr,
            ..two.remote()
        };
        // SAFETY: as above.
        unsafe { q12.post_send(&[rd]) }.unwrap();
    }
    let wc = poll(&mut s1);
    assert_eq!(wc.len(), 2);
    assert!(wc.iter().all(|c| c.status == WcStatus::Success));
    // Node 1's rkey on node 2: another node's key does not resolve.
    let mut foreign = write(5, &g, one.remote());
    foreign.remote.addr = two.remote().addr;
    // SAFETY: nothing is written: the key does not resolve.
    unsafe { q02.post_send(&[foreign]) }.unwrap();
    assert_eq!(poll(&mut s0)[0].status, WcStatus::RemoteAccess);
    // Node 1's lkey on a queue pair of node 0: a local protection error.
    // SAFETY: never dereferenced: the lkey does not resolve on node 0.
    let alien = [unsafe { Sge::from_raw(one.remote().addr, 8, one.lkey()) }];
    // SAFETY: as above.
    unsafe { q01.post_send(&[write(6, &alien, one.remote())]) }.unwrap();
    assert_eq!(poll(&mut s0)[0].status, WcStatus::LocalProtection);
    // The key layout: kind and slot survive, generations differ.
    let (g1, k1, slot1) = split_net_key(one.rkey());
    let (g2, _, slot2) = split_net_key(two.rkey());
    assert_eq!((k1, slot1, slot2), (KeyKind::Remote, 0, 0));
    assert_ne!(g1, g2);
    assert_eq!(net_key(g1, KeyKind::Local, 0), one.lkey());
}

#[test]
fn a_dropped_region_invalidates_its_keys() {
    let (mut x, mut y, mut z) = ([0u8; 8], [0u8; 8], [0u8; 8]);
    let net = SoftNet::new(config(2));
    let src = net.register(0, &mut x, RW).unwrap();
    let (old, old_lkey) = {
        let r = net.register(1, &mut y, RW).unwrap();
        (r.remote(), r.lkey())
    };
    // The same slot again, a new generation.
    let fresh = net.register(1, &mut z, RW).unwrap();
    assert_ne!(old.rkey, fresh.rkey());
    assert_ne!(old_lkey, fresh.lkey());
    let (mut a, _b) = net.connect(0, 1).unwrap();
    let mut s0 = net.send_cq(0).unwrap();
    let g = [src.sge(0..8).unwrap()];
    let stale = RemoteMemory {
        addr: fresh.remote().addr,
        ..old
    };
    // SAFETY: the stale rkey resolves to nothing, so nothing is written.
    unsafe { a.post_send(&[write(1, &g, stale)]) }.unwrap();
    assert_eq!(poll(&mut s0)[0].status, WcStatus::RemoteAccess);
    assert!(
        net.in_error(a.qp_num()),
        "the error moved the requester to error"
    );
}

#[test]
fn a_receive_posted_while_the_send_waits_wins() {
    let (mut x, mut y) = ([0u8; 8], [0u8; 8]);
    let net = SoftNet::new(config(3));
    let src = net.register(0, &mut x, RW).unwrap();
    let mut dst = net.register(2, &mut y, RW).unwrap();
    let (mut q01, _q10) = net.connect(0, 1).unwrap();
    let (mut q02, mut q20) = net.connect(0, 2).unwrap();
    let mut s0 = net.send_cq(0).unwrap();
    let mut v2 = net.recv_cq(2).unwrap();
    {
        let data = *b"inline!!";
        // SAFETY: a live slice; inline entries are read during the post only.
        let g = [unsafe { Sge::from_raw(data.as_ptr() as u64, 8, 0) }];
        let mut w = op(1, Opcode::Send, &g);
        w.flags |= SendFlags::INLINE;
        // SAFETY: as above.
        unsafe { q02.post_send(&[w]) }.unwrap(); // no receive at node 2: waits
    }
    assert_eq!(net.waiting(0), 1);
    // Other queue pairs of the node carry on meanwhile.
    let g = [src.sge(0..0).unwrap()];
    // SAFETY: a zero-length write names no memory.
    unsafe { q01.post_send(&[write(2, &g, RemoteMemory::default())]) }.unwrap();
    let wc = poll(&mut s0);
    assert_eq!(
        (wc.len(), wc[0].wr_id),
        (1, 2),
        "tick 1 of 2: the send still waits"
    );
    assert_eq!(net.waiting(0), 1);
    {
        let m = dst.sge_mut(0..8).unwrap();
        let into = [rs(&m)];
        let rr = [recv(20, &into)];
        // The send runs inside this post.
        // SAFETY: the region outlives the receive, polled below.
        unsafe { q20.post_recv(&rr) }.unwrap();
    }
    assert_eq!(net.waiting(0), 0);
    let wc = poll(&mut v2);
    assert_eq!((wc[0].wr_id, wc[0].byte_len), (20, 8));
    let wc = poll(&mut s0);
    assert_eq!((wc[0].wr_id, wc[0].status), (1, WcStatus::Success));
    let mut got = [0u8; 8];
    dst.read_into(0, &mut got);
    assert_eq!(&got, b"inline!!");
    assert_eq!(net.stats(0).rnr_retries, 1);
}

#[test]
fn rnr_retries_run_out() {
    let net = SoftNet::new(config(3));
    let (mut q01, _q10) = net.connect(0, 1).unwrap();
    let (mut q02, _q20) = net.connect(0, 2).unwrap();
    let mut s0 = net.send_cq(0).unwrap();
    send_empty(&mut q01, 1);
    // SAFETY: names no memory.
    unsafe { q01.post_send(&[op(2, Opcode::Write, &[])]) }.unwrap();
    send_empty(&mut q02, 3);
    assert_eq!(net.waiting(0), 2);
    assert!(poll(&mut s0).is_empty());
    let wc = poll(&mut s0);
    let got: Vec<_> = wc.iter().map(|c| (c.wr_id, c.qp_num, c.status)).collect();
    assert_eq!(
        got,
        [
            (1, q01.qp_num(), WcStatus::RnrRetryExceeded),
            (2, q01.qp_num(), WcStatus::Flushed),
            (3, q02.qp_num(), WcStatus::RnrRetryExceeded),
        ]
    );
    assert_eq!(net.stats(0).rnr_retries, 4);
    assert_eq!(net.waiting(0), 0);
    assert!(net.in_error(q01.qp_num()) && net.in_error(q02.qp_num()));

    // RnrRetry::Times(0): fails at the first tick.
    let mut cfg = config(2);
    cfg.rnr_retry = RnrRetry::Times(0);
    let net = SoftNet::new(cfg);
    let (mut a, _b) = net.connect(0, 1).unwrap();
    let mut s0 = net.send_cq(0).unwrap();
    send_empty(&mut a, 1);
    assert_eq!(poll(&mut s0)[0].status, WcStatus::RnrRetryExceeded);

    // RnrRetry::Infinite: never gives up.
    let mut cfg = config(2);
    cfg.rnr_retry = RnrRetry::Infinite;
    let net = SoftNet::new(cfg);
    let (mut a, mut b) = net.connect(0, 1).unwrap();
    let mut s0 = net.send_cq(0).unwrap();
    send_empty(&mut a, 1);
    for _ in 0..50 {
        assert!(poll(&mut s0).is_empty());
    }
    recv_empty(&mut b, 9);
    assert_eq!(poll(&mut s0)[0].status, WcStatus::Success);
    assert_eq!(net.stats(0).rnr_retries, 50);
}

#[test]
fn a_killed_node_flushes_and_its_peers_get_no_answer() {
    let net = SoftNet::new(config(4)); // retry_count 3
    let (mut q03, mut q30) = net.connect(0, 3).unwrap();
    let (mut q13, mut q31) = net.connect(1, 3).unwrap();
    let (mut q01, mut q10) = net.connect(0, 1).unwrap();
    let (mut s0, mut s1, mut v3) = (
        net.send_cq(0).unwrap(),
        net.send_cq(1).unwrap(),
        net.recv_cq(3).unwrap(),
    );
    recv_empty(&mut q30, 1);
    recv_empty(&mut q31, 2);
    send_empty(&mut q30, 3); // no receive at node 0: waits
    net.kill(3);
    assert!(net.is_dead(3));
    let wc = poll(&mut v3);
    let got: Vec<_> = wc.iter().map(|c| (c.wr_id, c.qp_num, c.status)).collect();
    assert_eq!(
        got,
        [
            (1, q30.qp_num(), WcStatus::Flushed),
            (2, q31.qp_num(), WcStatus::Flushed)
        ]
    );
    assert_eq!(
        poll(&mut net.send_cq(3).unwrap())[0].status,
        WcStatus::Flushed
    );
    assert_eq!(net.waiting(3), 0);
    send_empty(&mut q03, 10);
    // SAFETY: names no memory.
    unsafe { q13.post_send(&[op(11, Opcode::Write, &[])]) }.unwrap();
    // The connection between the living nodes works meanwhile.
    recv_empty(&mut q10, 12);
    send_empty(&mut q01, 13);
    let wc = poll(&mut s0);
    assert_eq!((wc.len(), wc[0].wr_id), (1, 13), "tick 1 of 3");
    assert!(poll(&mut s0).is_empty());
    let wc = poll(&mut s0);
    assert_eq!((wc[0].wr_id, wc[0].status), (10, WcStatus::RetryExceeded));
    // A zero-length write also needs an answer.
    for _ in 0..2 {
        assert!(poll(&mut s1).is_empty());
    }
    let wc = poll(&mut s1);
    assert_eq!((wc[0].wr_id, wc[0].status), (11, WcStatus::RetryExceeded));
    assert_eq!(net.stats(0).transport_retries, 3);
    assert_eq!(net.stats(1).transport_retries, 3);
    // Receives posted by node 3's peers are never consumed by it.
    recv_empty(&mut q03, 14);
    assert_eq!(net.recv_queue_used(q03.qp_num()), 1);
}

#[test]
fn the_error_state_flushes_into_the_shared_queues() {
    let net = SoftNet::new(config(3));
    let (mut q01, mut q10) = net.connect(0, 1).unwrap();
    let (mut q02, mut q20) = net.connect(0, 2).unwrap();
    let (mut s0, mut v0, mut s1) = (
        net.send_cq(0).unwrap(),
        net.recv_cq(0).unwrap(),
        net.send_cq(1).unwrap(),
    );
    recv_empty(&mut q01, 1);
    recv_empty(&mut q02, 2);
    let mut unsignaled = op(3, Opcode::Send, &[]);
    unsignaled.flags = SendFlags::empty();
    // SAFETY: names no memory.
    unsafe { q01.post_send(&[unsignaled, op(4, Opcode::Send, &[])]) }.unwrap(); // both wait
    q01.set_error().unwrap();
    assert_eq!(net.waiting(0), 0);
    let got: Vec<_> = poll(&mut s0)
        .iter()
        .map(|c| (c.wr_id, c.qp_num, c.status, c.kind))
        .collect();
    let f = (q01.qp_num(), WcStatus::Flushed, CompletionKind::Other);
    assert_eq!(
        got,
        [(3, f.0, f.1, f.2), (4, f.0, f.1, f.2)],
        "unsignaled too"
    );
    let got: Vec<_> = poll(&mut v0).iter().map(|c| (c.wr_id, c.qp_num)).collect();
    assert_eq!(
        got,
        [(1, q01.qp_num())],
        "the other queue pair's receive stays"
    );
    assert_eq!(net.send_queue_used(q01.qp_num()), 0);
    // Posting in the error state completes flushed.
    send_empty(&mut q01, 5);
    recv_empty(&mut q01, 6);
    assert_eq!(poll(&mut s0)[0].status, WcStatus::Flushed);
    assert_eq!(poll(&mut v0)[0].wr_id, 6);
    // The peer gets no answer; the other connection works.
    send_empty(&mut q10, 7);
    for _ in 0..2 {
        assert!(poll(&mut s1).is_empty());
    }
    assert_eq!(poll(&mut s1)[0].status, WcStatus::RetryExceeded);
    send_empty(&mut q20, 8);
    assert_eq!(poll(&mut v0)[0].wr_id, 2);
}

#[test]
fn length_and_protection_errors_fail_both_ends() {
    let (mut x, mut y) = ([0u8; 8], [0u8; 4]);
    let net = SoftNet::new(config(2));
    let src = net.register(0, &mut x, RW).unwrap();
    let mut dst = net.register(1, &mut y, AccessFlags::LOCAL_WRITE).unwrap();
    let (mut a, mut b) = net.connect(0, 1).unwrap();
    let (mut s0, mut v1) = (net.send_cq(0).unwrap(), net.recv_cq(1).unwrap());
    {
        let m = dst.sge_mut(0..4).unwrap();
        let into = [rs(&m)];
        let rr = [recv(1, &into), recv(2, &into)];
        // SAFETY: nothing is written (too short), the second flushes.
        unsafe { b.post_recv(&rr) }.unwrap();
        // SAFETY: as above.
        unsafe { a.post_send(&[op(5, Opcode::Send, &[src.sge(0..8).unwrap()])]) }.unwrap();
    }
    assert_eq!(poll(&mut s0)[0].status, WcStatus::RemoteInvalidRequest);
    let got: Vec<_> = poll(&mut v1).iter().map(|c| (c.wr_id, c.status)).collect();
    assert_eq!(got, [(1, WcStatus::LocalLength), (2, WcStatus::Flushed)]);
    assert!(net.in_error(a.qp_num()) && net.in_error(b.qp_num()));
}

#[test]
fn completion_queues_account_and_report_overflow() {
    let mut cfg = config(3);
    cfg.cq_capacity = 3;
    let net = SoftNet::new(cfg);
    let (mut q01, _q10) = net.connect(0, 1).unwrap();
    let (mut q02, _q20) = net.connect(0, 2).unwrap();
    let mut s0 = net.send_cq(0).unwrap();
    assert_eq!(s0.capacity(), 3);
    assert!(s0.is_send() && s0.is_empty());
    let w = [op(0, Opcode::Write, &[]); 2];
    // Three requests outstanding on the node: they fit.
    // SAFETY: zero-length writes name no memory.
    unsafe { q01.post_send(&w) }.unwrap();
    // SAFETY: as above.
    unsafe { q02.post_send(&w[..1]) }.unwrap();
    assert_eq!(s0.len(), 3);
    assert_eq!(net.send_queue_used(q01.qp_num()), 2);
    assert_eq!(poll(&mut s0).len(), 3);
    assert_eq!(net.send_queue_used(q01.qp_num()), 0);
    // Four outstanding on a queue of three: the poll says so, it does not drop one silently.
    // SAFETY: as above.
    unsafe { q01.post_send(&w) }.unwrap();
    // SAFETY: as above.
    unsafe { q02.post_send(&w) }.unwrap();
    let mut wc = [Completion::EMPTY; 8];
    let e = s0.poll(&mut wc).unwrap_err();
    assert_eq!((e.verb, e.errno), (Verb::PollCq, EOVERFLOW));
    assert_eq!(s0.poll(&mut wc).unwrap_err().errno, EOVERFLOW, "sticky");
    assert_eq!(net.stats(0).send_cqes, 7);
    // The default capacity covers every queue pair of the node full.
    let net = SoftNet::new(SoftNetConfig::new(5, CAPS));
    assert_eq!(net.cq_capacity(), 4 * CAPS.max_send_wr);
}

#[test]
fn posts_are_checked_like_the_two_party_model() {
    let mut buf = [0u8; 64];
    let net = SoftNet::new(config(2));
    let s = net.register(0, &mut buf, RW).unwrap();
    let (mut a, mut b) = net.connect(0, 1).unwrap();
    let mut s0 = net.send_cq(0).unwrap();
    let w = [op(0, Opcode::Write, &[]); 3];
    // SAFETY: zero-length writes name no memory.
    unsafe { a.post_send(&w) }.unwrap();
    // SAFETY: as above.
    let e = unsafe { a.post_send(&w) }.unwrap_err();
    assert_eq!(e, refused(1, ENOMEM));
    assert_eq!(poll(&mut s0).len(), 4);
    let too_many = [op(0, Opcode::Write, &[]); MAX_BATCH + 1];
    // SAFETY: as above.
    assert_eq!(unsafe { a.post_send(&too_many) }.unwrap_err().errno, EINVAL);
    let three = [s.sge(0..1).unwrap(); 3];
    // SAFETY: rejected before anything runs.
    let e = unsafe { a.post_send(&[op(1, Opcode::Write, &three)]) }.unwrap_err();
    assert_eq!((e.posted, e.errno), (0, EINVAL));
    let data = [7u8; 17];
    // SAFETY: inline data is a live slice.
    let big = [unsafe { Sge::from_raw(data.as_ptr() as u64, 17, 0) }];
    let mut w = op(2, Opcode::Send, &big);
    w.flags |= SendFlags::INLINE;
    // SAFETY: rejected before reading.
    assert_eq!(unsafe { a.post_send(&[w]) }.unwrap_err().errno, EINVAL);
    let rr = [recv(0, &three)];
    // SAFETY: rejected.
    assert_eq!(unsafe { b.post_recv(&rr) }.unwrap_err().errno, EINVAL);
    let rr = [recv(0, &[]); 5];
    // SAFETY: names no memory.
    let e = unsafe { b.post_recv(&rr) }.unwrap_err();
    assert_eq!((e.posted, e.errno), (4, ENOMEM));
}

#[test]
fn setup_calls_hand_out_each_handle_once() {
    let mut bufs = [[0u8; 1]; 4];
    let mut empty = [0u8; 0];
    let mut cfg = config(3);
    cfg.max_regions = 2;
    cfg.caps.max_send_wr = u32::MAX;
    cfg.caps.max_inline_data = u32::MAX;
    cfg.caps.max_send_sge = 99;
    let net = SoftNet::new(cfg);
    assert_eq!(
        (net.caps().max_send_wr, net.caps().max_inline_data),
        (NET_MAX_QUEUE, NET_MAX_INLINE)
    );
    assert_eq!(net.caps().max_send_sge, super::super::MAX_SGE as u32);
    assert!(net.connect(0, 0).is_none());
    assert!(net.connect(0, 3).is_none());
    let (a, b) = net.connect(2, 0).unwrap();
    assert_eq!(
        (a.node(), a.peer_node(), b.node(), b.peer_node()),
        (2, 0, 0, 2)
    );
    assert_eq!(a.caps(), net.caps());
    assert!(net.connect(0, 2).is_none(), "once per unordered pair");
    assert_eq!(net.connections(), 1);
    assert!(net.send_cq(1).is_some() && net.send_cq(1).is_none());
    assert!(net.recv_cq(1).is_some() && net.recv_cq(1).is_none());
    assert!(net.send_cq(3).is_none());
    let [b0, b1, b2, b3] = &mut bufs;
    assert_eq!(
        net.register(0, &mut empty, RW).unwrap_err(),
        SoftError::EmptyBuffer
    );
    assert_eq!(net.register(3, b0, RW).unwrap_err(), SoftError::NoSuchNode);
    let _r1 = net.register(0, b1, RW).unwrap();
    let _r2 = net.register(0, b2, RW).unwrap();
    assert_eq!(
        net.register(0, b3, AccessFlags::REMOTE_WRITE).unwrap_err(),
        SoftError::RemoteWriteNeedsLocalWrite
    );
    assert!(net.footprint() > 0);
}

#[test]
fn key_generations_run_out_loudly() {
    let mut bufs = [[0u8; 1]; 2];
    let net = SoftNet::new(config(1));
    net.state.borrow_mut().world.next_gen = super::NET_MAX_REGISTRATIONS;
    let [b0, b1] = &mut bufs;
    let last = net.register(0, b0, RW).unwrap();
    drop(last);
    assert_eq!(
        net.register(0, b1, RW).unwrap_err(),
        SoftError::KeysExhausted
    );
}
