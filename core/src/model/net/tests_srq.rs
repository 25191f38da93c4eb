//! The net's shared receive queues: which receive a message takes, what a flush leaves, and
//! that a send finding the queue empty waits like one finding a receive queue empty.

use alloc::vec::Vec;

use crate::completion::{CompletionKind, WcStatus};
use crate::provider::QueuePair;
use crate::sge::Sge;
use crate::wr::{Opcode, SendFlags, WorkRequest};

use super::super::tests::recv;
use super::super::{AccessFlags, EINVAL};
use super::tests::{poll, CAPS};
use super::{SoftNet, SoftNetConfig};

#[test]
fn queue_pairs_on_a_shared_receive_queue_take_its_oldest_receive_and_flush_none_of_it() {
    let (mut pool_buf, mut src1, mut src2) = ([0u8; 64], [0u8; 16], [0u8; 16]);
    let net = SoftNet::new(SoftNetConfig::new(3, CAPS));
    assert_eq!(net.create_srq(0, 4), Some(4));
    assert_eq!(net.create_srq(0, 4), None, "one per node");
    let mut pool = net
        .register(0, &mut pool_buf, AccessFlags::LOCAL_WRITE)
        .unwrap();
    // What nodes 1 and 2 send, each from its own memory.
    let srcs = [
        net.register(1, &mut src1, AccessFlags::LOCAL_WRITE)
            .unwrap(),
        net.register(2, &mut src2, AccessFlags::LOCAL_WRITE)
            .unwrap(),
    ];
    for s in &srcs {
        s.write_from(0, b"hello");
    }
    let (mut r1, mut s1) = net.connect(0, 1).unwrap();
    let (mut r2, mut s2) = net.connect(0, 2).unwrap();
    assert_eq!(net.create_srq(1, 4), None, "node 1 has queue pairs already");
    assert_eq!((r1.srq_capacity(), s1.srq_capacity()), (4, 0));
    let own = [recv(9, &[])];
    // SAFETY: names no memory.
    let e = unsafe { r1.post_recv(&own) }.unwrap_err();
    assert_eq!(
        e.errno, EINVAL,
        "a queue pair on a shared queue has no receive queue"
    );
    let (mut recv0, mut send1, mut send2) = (
        net.recv_cq(0).unwrap(),
        net.send_cq(1).unwrap(),
        net.send_cq(2).unwrap(),
    );
    let send = |qp: &mut super::NetQp<'_>, id: u64| {
        let sges = [srcs[qp.node() as usize - 1].sge(0..5).unwrap()];
        let wr = WorkRequest {
            wr_id: id,
            opcode: Opcode::Send,
            flags: SendFlags::SIGNALED,
            sges: &sges,
            remote: Default::default(),
        };
        // SAFETY: src outlives the net's use of it (borrowed for the net's life).
        unsafe { qp.post_send(&[wr]) }.unwrap();
    };
    // Nothing posted: the send waits (RNR).
    send(&mut s1, 1);
    assert_eq!(net.waiting(1), 1);
    let slots: Vec<Sge<'_>> = (0..3)
        .map(|i| {
            let e = pool.sge_mut(16 * i..16 * i + 16).unwrap();
            // SAFETY: slot i of the pool; the pool outlives the net's use of it.
            unsafe { Sge::from_raw(e.addr(), e.len(), e.lkey()) }
        })
        .collect();
    let post = |qp: &mut super::NetQp<'_>, i: usize| {
        let rr = [recv(100 + i as u64, core::slice::from_ref(&slots[i]))];
        // SAFETY: the pool's slots stay registered and are read only after completion.
        unsafe { qp.post_srq_recv(&rr) }.unwrap();
    };
    // Posted through the other queue pair: the queue is the node's.
    post(&mut r2, 0);
    post(&mut r2, 1);
    assert_eq!(net.srq_posted(0), 2);
    // The waiting send is retried at its node's tick and takes the oldest receive.
    let wc = poll(&mut send1);
    assert_eq!((wc[0].wr_id, wc[0].status), (1, WcStatus::Success));
    assert_eq!(net.waiting(1), 0);
    send(&mut s2, 2);
    assert_eq!(poll(&mut send2)[0].status, WcStatus::Success);
    let wc = poll(&mut recv0);
    assert_eq!(wc.len(), 2);
    assert_eq!((wc[0].wr_id, wc[0].qp_num), (100, r1.qp_num()));
    assert_eq!((wc[1].wr_id, wc[1].qp_num), (101, r2.qp_num()));
    assert_eq!((wc[0].kind, wc[0].byte_len), (CompletionKind::Recv, 5));
    let mut got = [0u8; 5];
    pool.read_into(16, &mut got);
    assert_eq!(&got, b"hello");
    // A flushed queue pair flushes none of the shared queue's receives.
    post(&mut r1, 2);
    r1.set_error().unwrap();
    assert!(poll(&mut recv0).is_empty());
    assert_eq!(net.srq_posted(0), 1);
    send(&mut s2, 3);
    let wc = poll(&mut recv0);
    assert_eq!((wc[0].wr_id, wc[0].qp_num), (102, r2.qp_num()));
}
