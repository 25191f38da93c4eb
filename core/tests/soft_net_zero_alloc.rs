//! Proof that the software net's data path does not allocate: a counting global allocator
//! watches posts, polls, waits, retries, flushes and a node's death on an 8-node world after
//! setup. (Its allocations happen in `SoftNet::new` and `SoftNet::connect` only.)
#![allow(clippy::std_instead_of_core)] // test code

mod support;

use rverbs_core::completion::{Completion, WcStatus};
use rverbs_core::memory::AccessFlags;
use rverbs_core::model::{NetQp, NetRegion, SoftNet, SoftNetConfig};
use rverbs_core::params::QpCaps;
use rverbs_core::provider::{CompletionQueue, QueuePair};
use rverbs_core::sge::{RemoteMemory, Sge};
use rverbs_core::wr::{Opcode, RecvRequest, SendFlags, WorkRequest};
use support::allocs;

#[global_allocator]
static GLOBAL: support::Counting = support::Counting;

const N: u32 = 8;
const CAPS: QpCaps = QpCaps::queues(16, 16);
const RW: AccessFlags = AccessFlags::LOCAL_WRITE
    .union(AccessFlags::REMOTE_WRITE)
    .union(AccessFlags::REMOTE_READ);

fn poll(cq: &mut impl CompletionQueue) -> usize {
    let mut wc = [Completion::EMPTY; 32];
    let n = cq.poll(&mut wc).unwrap();
    assert!(wc[..n].iter().all(|c| c.status == WcStatus::Success
        || c.status == WcStatus::Flushed
        || c.status == WcStatus::RetryExceeded));
    n
}

fn recv(qp: &mut NetQp<'_>, into: &mut NetRegion<'_>, n: usize) {
    let m = into.sge_mut(0..8).unwrap();
    // SAFETY: the same range and key as the scatter entry, which stays borrowed meanwhile.
    let s = [unsafe { Sge::from_raw(m.addr(), m.len(), m.lkey()) }];
    let rr = [RecvRequest { wr_id: 1, sges: &s }; 4];
    // SAFETY: the region outlives the net; every receive is polled or flushed below.
    unsafe { qp.post_recv(&rr[..n]) }.unwrap();
}

#[test]
fn posts_and_polls_allocate_nothing() {
    let mut bufs = vec![0u8; N as usize * 64];
    let mut rbufs = vec![0u8; N as usize * 8];
    let net = SoftNet::new(SoftNetConfig::new(N, CAPS));
    let regions: Vec<_> = bufs
        .chunks_mut(64)
        .enumerate()
        .map(|(i, b)| net.register(i as u32, b, RW).unwrap())
        .collect();
    let mut rings: Vec<_> = rbufs
        .chunks_mut(8)
        .enumerate()
        .map(|(i, b)| net.register(i as u32, b, AccessFlags::LOCAL_WRITE).unwrap())
        .collect();
    let mut ends = Vec::new();
    for a in 0..N {
        for b in a + 1..N {
            ends.push(net.connect(a, b).unwrap());
        }
    }
    let mut scqs: Vec<_> = (0..N).map(|i| net.send_cq(i).unwrap()).collect();
    let mut rcqs: Vec<_> = (0..N).map(|i| net.recv_cq(i).unwrap()).collect();
    let inline = [9u8; 8];

    let before = allocs();
    assert!(before > 0, "the counter sees the setup's allocations");
    for round in 0..200u64 {
        for (x, y) in ends.iter_mut() {
            let (a, b) = (x.node() as usize, y.node() as usize);
            let g = [regions[a].sge(0..8).unwrap()];
            // SAFETY: a live slice; inline entries are read during the post only.
            let gi = [unsafe { Sge::from_raw(inline.as_ptr() as u64, 8, 0) }];
            let mut remote = regions[b].remote();
            remote.addr += 8;
            let wrs = [
                WorkRequest {
                    wr_id: round,
                    opcode: Opcode::Write,
                    flags: SendFlags::SIGNALED,
                    sges: &g,
                    remote,
                },
                WorkRequest {
                    wr_id: round,
                    opcode: Opcode::Send,
                    flags: SendFlags::SIGNALED | SendFlags::INLINE,
                    sges: &gi,
                    remote: RemoteMemory::default(),
                },
            ];
            // The send waits for its receive (RNR), posted after a tick.
            // SAFETY: the regions outlive the net; everything is polled below.
            unsafe { x.post_send(&wrs) }.unwrap();
            poll(&mut scqs[a]);
            recv(y, &mut rings[b], 1);
            poll(&mut scqs[a]);
            poll(&mut rcqs[b]);
        }
    }
    // Errors, flushes and a death.
    let (x, y) = &mut ends[0];
    recv(y, &mut rings[1], 4);
    y.set_error().unwrap();
    poll(&mut rcqs[1]);
    net.kill(2);
    for cq in scqs.iter_mut().chain(rcqs.iter_mut()) {
        while poll(cq) > 0 {}
    }
    let _ = x.qp_num();
    assert_eq!(allocs() - before, 0, "the data path allocated");
    assert!(net.stats(0).rnr_retries > 0, "the waits were exercised");
}
