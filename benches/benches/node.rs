//! The node engine at scale, on the software model: what an idle `progress` and one poll of a
//! waiting barrier cost for 2, 16, 128 and 512 peers.
//!
//! One node is connected to N peers (a star: the peers are queue pairs and flag arrays on
//! the model, nothing polls them). Its queue pairs share one send and one receive completion
//! queue, so an idle `progress` is one poll of each, whatever N: the target is that 512 peers
//! cost within 1.2x of 2. A barrier poll while waiting costs what the algorithm checks: one
//! counter for dissemination, N for a centralized leader.
#![allow(missing_docs)] // criterion_main! generates an undocumented `main`.

use core::time::Duration;
use rverbs_core::node::Members;
use rverbs_core::wire::FlagLayout;

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion};
use rverbs_core::barrier::BarrierAlgorithm;
use rverbs_core::channel::{Channel, ChannelConfig};
use rverbs_core::memory::AccessFlags;
use rverbs_core::model::{NetQp, NetRegion, SoftNet, SoftNetConfig};
use rverbs_core::node::SoftNode;
use rverbs_core::params::QpCaps;
use rverbs_core::poll::Spin;
use rverbs_core::provider::shared::SharedCqs;
use rverbs_core::sge::RemoteMemory;
use rverbs_std_shim::MONOTONIC;

const PEERS: [u32; 4] = [2, 16, 128, 512];

fn caps() -> QpCaps {
    QpCaps::queues(16, 16)
}

/// The memory and handles a star keeps alive besides the node.
struct Star<'n> {
    _far_ends: Vec<NetQp<'n>>,
    _far_flags: Vec<NetRegion<'n>>,
}

/// Node 0 of a world of `peers + 1`, connected to every other node.
fn star<'n, 'm: 'n>(
    net: &'n SoftNet<'m>,
    bufs: &'m mut [Vec<u8>],
) -> (SoftNode<'n, Spin>, Star<'n>) {
    let world = net.nodes();
    let flags_len = FlagLayout::new(world).len();
    let mut it = bufs.iter_mut();
    let mut reg = |node, access| {
        net.register(node, it.next().expect("a buffer per region"), access)
            .expect("register")
    };
    let lw_rw = AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE;
    let flags = reg(0, lw_rw);
    let window = reg(0, lw_rw | AccessFlags::REMOTE_READ);
    let mut far_flags = Vec::new();
    let mut peer_flags = vec![RemoteMemory::default(); world as usize];
    for r in 1..world {
        let f = reg(r, lw_rw);
        peer_flags[r as usize] = f.remote();
        far_flags.push(f);
    }
    peer_flags[0] = flags.remote();
    assert!(flags.len() >= flags_len);
    let shared = SharedCqs::new(
        net.send_cq(0).expect("cq"),
        net.recv_cq(0).expect("cq"),
        world as usize - 1,
    );
    let mut channels = Vec::new();
    let mut far_ends = Vec::new();
    for r in 1..world {
        let (near, far) = net.connect(0, r).expect("connect");
        far_ends.push(far);
        let mut cfg = ChannelConfig::with_timeout(Duration::from_secs(3600));
        cfg.rank = Some(r);
        let routed = shared.add(near).map_err(|(_, e)| e).expect("route");
        channels.push(Channel::with_backoff(routed, cfg, Spin, &MONOTONIC));
    }
    let node = rverbs_benches::rank_zero(
        world,
        channels,
        flags,
        window,
        peer_flags,
        &MONOTONIC,
        Duration::from_secs(3600),
    );
    (
        node,
        Star {
            _far_ends: far_ends,
            _far_flags: far_flags,
        },
    )
}

fn buffers(world: u32, messaging: bool) -> Vec<Vec<u8>> {
    let flags = FlagLayout::new(world).len();
    // Node 0: flags, window, ring; every peer: flags.
    let mut v = vec![vec![0u8; flags], vec![0u8; 64]];
    v.extend((1..world).map(|_| vec![0u8; flags]));
    if messaging {
        v.push(vec![0u8; (world as usize - 1) * 2 * 64]);
    }
    v
}

fn net<'m>(world: u32) -> SoftNet<'m> {
    let mut cfg = SoftNetConfig::new(world, caps());
    cfg.cq_capacity = (world - 1) * 16;
    SoftNet::new(cfg)
}

fn idle_progress(c: &mut Criterion) {
    let mut g = c.benchmark_group("node_idle_progress");
    for peers in PEERS {
        let world = peers + 1;
        let mut bufs = buffers(world, true);
        let (ring_buf, rest) = bufs.split_last_mut().expect("ring buffer");
        let net = net(world);
        let (mut node, _keep) = star(&net, rest);
        let ring = net
            .register(0, ring_buf, AccessFlags::LOCAL_WRITE)
            .expect("ring");
        node.start_messaging_in(ring, 2, 64).expect("messaging");
        g.bench_with_input(BenchmarkId::from_parameter(peers), &peers, |b, _| {
            b.iter(|| node.progress(64, |_| {}).expect("progress"))
        });
    }
    g.finish();
}

fn barrier_poll(c: &mut Criterion) {
    let mut g = c.benchmark_group("node_barrier_poll_waiting");
    for alg in [
        BarrierAlgorithm::Dissemination,
        BarrierAlgorithm::Centralized,
    ] {
        for peers in PEERS {
            let world = peers + 1;
            let mut bufs = buffers(world, false);
            let net = net(world);
            let (mut node, _keep) = star(&net, &mut bufs);
            node.set_algorithm(alg);
            // Nobody else arrives: every poll is one step of a waiting barrier.
            node.barrier_start_timeout(Members::World, Duration::from_secs(3600))
                .expect("start");
            let id = BenchmarkId::new(alg.name(), peers);
            g.bench_with_input(id, &peers, |b, _| {
                b.iter(|| assert!(!node.barrier_poll().expect("poll")))
            });
        }
    }
    g.finish();
}

criterion_group!(benches, idle_progress, barrier_poll);
criterion_main!(benches);
