//! Criterion benchmarks for rverbs; the benchmarks themselves live in `benches/`:
//! - `wire`: endpoint encode/decode and node blob decode (world 64);
//! - `engine`: the [`Channel`] engine over the in-memory
//!   provider, per operation and per work request;
//! - `library` (feature `instant`): rverbs beside hand-written raw verbs on the instant
//!   device, timed by criterion;
//! - `cost` (feature `instant`): the same comparison in instructions per operation, counted
//!   by callgrind: run it through `tools/cost` (docs/benchmarks.md).
//!
//! They need no RDMA device (`library` and `cost` link libibverbs, the others do not). The
//! engine numbers are the engine's own cost plus the in-memory model's bookkeeping and
//! copies: use them to compare engine changes and posting styles, never as device
//! latencies.
//!
//! ```sh
//! cargo bench -p rverbs-benches
//! ```

use rverbs_core::barrier::BarrierAlgorithm;
use rverbs_core::channel::Channel;
use rverbs_core::memory::{AccessFlags, Region};
use rverbs_core::node::{Components, Node, NodeParts};
use rverbs_core::poll::{Spin, StaticClock};
use rverbs_core::provider::Provider;
use rverbs_core::sge::{RemoteMemory, Sge};

/// What the engine and library benches register their regions with: local write, remote
/// write and read.
pub const RW: AccessFlags = AccessFlags::LOCAL_WRITE
    .union(AccessFlags::REMOTE_WRITE)
    .union(AccessFlags::REMOTE_READ);

/// A write of `g` to each of `remotes` in one batch (one doorbell), run to completion: what
/// the `batch` benches of `engine` and `library` time.
#[inline]
pub fn write_batch<P: Provider>(chan: &mut Channel<P>, g: &[Sge<'_>], remotes: &[RemoteMemory]) {
    let mut batch = chan.batch();
    for r in remotes {
        batch.write(g, *r).expect("push");
    }
    batch.run().expect("batch");
}

/// Rank 0 of a `world` whose peers are played by the bench: a node over `channels` (one
/// per peer), dissemination barriers, spinning, its waits bounded by `timeout` on `clock`,
/// built with the default components; each peer's flag array doubles as its
/// window (the benches write neither). Setup only: what the benches share of a node.
pub fn rank_zero<P: Provider, M: Region>(
    world: u32,
    channels: Vec<Channel<P, Spin>>,
    flags: M,
    window: M,
    peer_flags: Vec<RemoteMemory>,
    clock: StaticClock,
    timeout: core::time::Duration,
) -> Node<P, M, Spin> {
    Node::from_parts(NodeParts {
        rank: 0,
        world,
        channels,
        flags,
        window,
        peer_flags: peer_flags.clone(),
        peer_windows: peer_flags,
        algorithm: BarrierAlgorithm::Dissemination,
        backoff: Spin,
        clock,
        timeout,
        components: Components::default(),
    })
    .expect("a node of well-formed parts")
}
