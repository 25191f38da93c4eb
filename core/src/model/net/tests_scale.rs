//! The net at scale: every pair of nodes connected, one write on every queue pair. 256 nodes
//! on the host (32,640 connections), 4 under Miri.

extern crate std;

use alloc::vec::Vec;
use std::println;
use std::time::Instant;

use crate::params::QpCaps;
use crate::provider::{CompletionQueue, QueuePair};
use crate::sge::Sge;
use crate::wr::SendFlags;

use super::tests::{poll, write, RW};
use super::{SoftNet, SoftNetConfig};

/// The caps the node layer runs its large worlds with.
const CAPS: QpCaps = QpCaps::queues(16, 16);

/// Resident set size of this process in bytes (Linux), for the report.
fn rss() -> Option<usize> {
    #[cfg(all(target_os = "linux", not(miri)))]
    {
        let statm = std::fs::read_to_string("/proc/self/statm").ok()?;
        let pages: usize = statm.split_whitespace().nth(1)?.parse().ok()?;
        Some(pages * 4096)
    }
    #[cfg(not(all(target_os = "linux", not(miri))))]
    None
}

/// Connects `n` nodes pairwise and has every queue pair write 8 bytes into its peer's
/// region (node `a` writes `a + 1` at offset `8 a` of every peer's region; odd nodes
/// inline), then checks every completion's node and `qp_num` and every byte.
fn full_mesh(n: u32) {
    let nn = n as usize;
    let mut bufs = alloc::vec![0u8; nn * nn * 8];
    let rss0 = rss();
    let t0 = Instant::now();
    let net = SoftNet::new(SoftNetConfig::new(n, CAPS));
    let regions: Vec<_> = bufs
        .chunks_mut(nn * 8)
        .enumerate()
        .map(|(i, b)| net.register(i as u32, b, RW).unwrap())
        .collect();
    let mut ends = Vec::with_capacity(nn * (nn - 1));
    for a in 0..n {
        for b in a + 1..n {
            let (x, y) = net.connect(a, b).unwrap();
            ends.push(x);
            ends.push(y);
        }
    }
    let mut cqs: Vec<_> = (0..n).map(|i| net.send_cq(i).unwrap()).collect();
    let built = t0.elapsed();
    let footprint = net.footprint();
    let rss1 = rss();

    for (i, r) in regions.iter().enumerate() {
        r.write_from(i * 8, &(i as u64 + 1).to_le_bytes());
    }
    let t1 = Instant::now();
    for qp in ends.iter_mut() {
        let (a, b) = (qp.node() as usize, qp.peer_node() as usize);
        let mut remote = regions[b].remote();
        remote.addr += (a * 8) as u64;
        let value = (a as u64 + 1).to_le_bytes();
        let g = if a % 2 == 1 {
            // SAFETY: a live slice; inline entries are read during the post only.
            [unsafe { Sge::from_raw(value.as_ptr() as u64, 8, 0) }]
        } else {
            [regions[a].sge(a * 8..a * 8 + 8).unwrap()]
        };
        let mut w = write(u64::from(qp.qp_num()), &g, remote);
        if a % 2 == 1 {
            w.flags |= SendFlags::INLINE;
        }
        // SAFETY: the regions outlive the net; the write completes inside the post.
        unsafe { qp.post_send(&[w]) }.unwrap();
    }
    let mut seen = alloc::vec![false; ends.len()];
    for (node, cq) in cqs.iter_mut().enumerate() {
        let mut got = 0;
        loop {
            let wc = poll(cq);
            if wc.is_empty() {
                break;
            }
            for c in wc {
                assert!(c.status.is_success(), "{c:?}");
                // The wr_id is the qp_num of the queue pair that posted it.
                assert_eq!(c.wr_id, u64::from(c.qp_num));
                // Connections number their ends in order, so the end's index is its
                // number's distance from the first.
                let end = (c.qp_num - ends[0].qp_num()) as usize;
                assert_eq!(ends[end].qp_num(), c.qp_num);
                assert_eq!(ends[end].node() as usize, node, "routed to its node");
                assert!(!seen[end]);
                seen[end] = true;
                got += 1;
            }
        }
        assert_eq!(got, nn - 1);
        assert_eq!(cq.capacity(), (n - 1) * CAPS.max_send_wr);
    }
    let ran = t1.elapsed();
    for (b, r) in regions.iter().enumerate() {
        for a in 0..nn {
            // Not `load_u64`: the buffer's address need not be 8-aligned (Miri picks it).
            let mut v = [0u8; 8];
            assert!(r.read_into(a * 8, &mut v));
            let want = if a == b { b as u64 + 1 } else { a as u64 + 1 };
            assert_eq!(u64::from_le_bytes(v), want, "node {a} -> node {b}");
        }
        assert_eq!(net.stats(b as u32).rnr_retries, 0);
    }
    println!(
        "SoftNet full mesh: {n} nodes, {} connections, {} queue pairs: built in {built:?}, \
         {} writes + polls in {ran:?}; model state {:.1} MB; RSS {:?} -> {:?} MB",
        net.connections(),
        ends.len(),
        ends.len(),
        footprint as f64 / 1e6,
        rss0.map(|b| b / 1_000_000),
        rss1.map(|b| b / 1_000_000),
    );
}

#[test]
#[cfg_attr(miri, ignore)]
fn full_mesh_of_256_nodes() {
    full_mesh(256);
}

#[test]
fn full_mesh_of_4_nodes() {
    full_mesh(4);
}
