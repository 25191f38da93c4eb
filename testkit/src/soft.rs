//! Worlds on the software model: a fabric of two ends, a network of ranks, and nodes over it
//! with the sizes most tests need.

use rverbs_core::node::Members;
use std::time::Duration;

use rverbs_core::barrier::BarrierAlgorithm;
use rverbs_core::channel::ChannelConfig;
use rverbs_core::model::{SoftFabric, SoftNet, SoftNetConfig};
use rverbs_core::node::{soft_world_with, Components, NodeError, Receive, SoftNode};
use rverbs_core::params::{QpCaps, RetryCount, RnrRetry};
use rverbs_core::poll::{Spin, StaticClock};

/// The queue sizes most tests use: 16 send and 16 receive requests of one entry each.
pub const CAPS: QpCaps = QpCaps::queues(16, 16);

/// `send` send and `recv` receive requests, each of up to `sges` entries.
pub const fn caps(send: u32, recv: u32, sges: u32) -> QpCaps {
    QpCaps::queues(send, recv).with_sges(sges)
}

/// A fabric of two ends with queues of `caps`, three receiver-not-ready retries and three
/// transport retries: a peer that does not answer fails within a few polls.
pub fn fabric<'m>(caps: QpCaps) -> SoftFabric<'m> {
    SoftFabric::new(
        caps,
        RnrRetry::Times(3),
        RetryCount::new(3).expect("3 is a valid retry count"),
    )
}

/// A network of `world` ranks with queues of [`CAPS`].
pub fn net<'m>(world: u32) -> SoftNet<'m> {
    SoftNet::new(SoftNetConfig::new(world, CAPS))
}

/// The window every node of [`nodes`] exposes to its peers, in bytes.
pub const WINDOW: usize = 64;

/// How [`nodes`] builds each node beyond its network: its channels, its barrier algorithm
/// and its components. Each part alone converts into the rest at their defaults.
#[derive(Clone, Copy, Debug, Default)]
pub struct Build {
    /// Every channel's configuration.
    pub channel: ChannelConfig,
    /// The barrier algorithm.
    pub barrier: BarrierAlgorithm,
    /// What the node carries (messaging, barrier wake-ups, readmission).
    pub components: Components,
}

impl From<BarrierAlgorithm> for Build {
    fn from(barrier: BarrierAlgorithm) -> Self {
        Self {
            barrier,
            ..Self::default()
        }
    }
}

impl From<Components> for Build {
    fn from(components: Components) -> Self {
        Self {
            components,
            ..Self::default()
        }
    }
}

impl From<Receive> for Build {
    fn from(receive: Receive) -> Self {
        Components::from(receive).into()
    }
}

impl From<(BarrierAlgorithm, Components)> for Build {
    fn from((barrier, components): (BarrierAlgorithm, Components)) -> Self {
        Self {
            barrier,
            components,
            ..Self::default()
        }
    }
}

/// Every rank of `net` as a node, fully connected, with windows of [`WINDOW`] bytes, built as
/// `build` says (a barrier algorithm, components, where messages land, or all in a
/// [`Build`]), spinning, on `clock`; memory from `arena` (at least
/// `soft_world_bytes(world, WINDOW)` long).
pub fn nodes<'n, 'm: 'n>(
    net: &'n SoftNet<'m>,
    arena: &'m mut [u8],
    build: impl Into<Build>,
    clock: StaticClock,
) -> Vec<SoftNode<'n, Spin>> {
    let build = build.into();
    soft_world_with(
        net,
        arena,
        WINDOW,
        build.channel,
        (build.barrier, Spin, clock),
        build.components,
    )
    .expect("a world of the model's own ranks connects")
}

/// Starts a barrier (of `timeout`) on each of `nodes`, then polls the open ones in turn until
/// each has an answer; the answers by rank, in rank order.
pub fn barrier_answers<'a, 'n: 'a>(
    nodes: impl IntoIterator<Item = &'a mut SoftNode<'n, Spin>>,
    timeout: Duration,
) -> Vec<(u32, Result<(), NodeError>)> {
    let mut open = Vec::new();
    let mut answers = Vec::new();
    for n in nodes {
        match n.barrier_start_timeout(Members::World, timeout) {
            Ok(()) => open.push(n),
            Err(e) => answers.push((n.rank(), Err(e))),
        }
    }
    while !open.is_empty() {
        open.retain_mut(|n| match n.barrier_poll() {
            Ok(false) => true,
            Ok(true) => {
                answers.push((n.rank(), Ok(())));
                false
            }
            Err(e) => {
                answers.push((n.rank(), Err(e)));
                false
            }
        });
    }
    answers.sort_by_key(|(r, _)| *r);
    answers
}

/// Inside an `impl QueuePair for Stub`, where the field `$inner` is itself a `QueuePair`: the
/// methods that say which queue pair this is (`caps`, `qp_num`) and `post_recv`, forwarded to
/// it. A stub writes only the methods it changes.
#[macro_export]
macro_rules! forward_queue_pair {
    ($inner:tt) => {
        fn caps(&self) -> $crate::__core::params::QpCaps {
            $crate::__core::provider::QueuePair::caps(&self.$inner)
        }
        fn qp_num(&self) -> u32 {
            $crate::__core::provider::QueuePair::qp_num(&self.$inner)
        }
        unsafe fn post_recv(
            &mut self,
            wrs: &[$crate::__core::wr::RecvRequest<'_>],
        ) -> Result<(), $crate::__core::wr::PostFailure> {
            // SAFETY: the caller keeps the posting contract, which we forward unchanged.
            unsafe { $crate::__core::provider::QueuePair::post_recv(&mut self.$inner, wrs) }
        }
    };
}

/// Inside an `impl DatagramProvider for Stub`, where the field `$inner` is itself a
/// `DatagramProvider`: the methods that say which queue pair this is (`caps`, `qp_num`,
/// `qkey`, `gid`, `lid`, `mtu`), forwarded to it.
#[macro_export]
macro_rules! forward_datagram_identity {
    ($inner:tt) => {
        $crate::forward_datagram_identity!(@each $inner;
            caps -> $crate::__core::params::QpCaps,
            qp_num -> u32,
            qkey -> u32,
            gid -> $crate::__core::gid::Gid,
            lid -> u16,
            mtu -> u32);
    };
    (@each $inner:tt; $($name:ident -> $ty:ty),*) => {
        $(
            fn $name(&self) -> $ty {
                $crate::__core::provider::datagram::DatagramProvider::$name(&self.$inner)
            }
        )*
    };
}
