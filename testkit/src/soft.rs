//! Worlds on the software model: a fabric of two ends, a network of ranks, and nodes over it
//! with the sizes most tests need.

use rverbs_core::node::Members;
use std::time::Duration;

use rverbs_core::barrier::{BarrierAlgorithm, BarrierError};
use rverbs_core::channel::ChannelConfig;
use rverbs_core::failure::Failure;
use rverbs_core::memory::AccessFlags;
use rverbs_core::model::{SoftFabric, SoftNet, SoftNetConfig};
use rverbs_core::node::{
    soft_world_with, Component, Components, Event, NodeError, Receive, SetupError, SoftNode,
};
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

/// A barrier over the world on `node` fails at once (well before its hour-long timeout)
/// because of `news`, and its message says each of `says`.
pub fn assert_barrier_fails_with(node: &mut SoftNode<'_, Spin>, news: Failure, says: &[&str]) {
    let e = node
        .barrier_timeout(Members::World, Duration::from_secs(3600))
        .unwrap_err();
    assert_eq!(e, NodeError::Barrier(BarrierError::PeerFailed(news)));
    for what in says {
        assert!(e.to_string().contains(what), "{e}: no {what:?}");
    }
}

/// `node` (a rank of `net`) was built without messaging: starting it in `mem` with `slots`
/// slots of 64 bytes is refused, naming the missing component.
pub fn assert_built_without_messaging<'n, 'm: 'n>(
    net: &'n SoftNet<'m>,
    node: &mut SoftNode<'n, Spin>,
    mem: &'m mut [u8],
    slots: usize,
) {
    let region = net
        .register(node.rank(), mem, AccessFlags::LOCAL_WRITE)
        .expect("the model registers any buffer");
    assert_eq!(
        node.start_messaging_in(region, slots, 64),
        Err(SetupError::NotBuiltWith(Component::Messaging))
    );
}

/// Binds `$net` to a network of `$world` ranks ([`net`]) and `$nodes` to its nodes, built as
/// `$build` says on `$clock` ([`nodes`]), their arena in a binding of its own: the nodes
/// borrow the network and the arena, so one function cannot hand back all three.
#[macro_export]
macro_rules! soft_nodes {
    (let $net:ident, $nodes:ident = $world:expr, $build:expr, $clock:expr) => {
        let $net = $crate::net($world);
        let mut arena =
            ::std::vec![0u8; $crate::__core::node::soft_world_bytes($world, $crate::WINDOW)];
        let mut $nodes = $crate::nodes(&$net, &mut arena, $build, $clock);
    };
}

/// [`soft_nodes!`] at the default build, with messaging started on every node in a ring
/// region of its own: `$slots` slots of `$slot` bytes per peer. The rings' memory is a
/// binding of the caller's scope too, declared before the nodes, which borrow it.
#[macro_export]
macro_rules! messaging_world {
    (let $net:ident, $nodes:ident = $world:expr, $slots:expr, $slot:expr, $clock:expr) => {
        let world_size: u32 = $world;
        let mem_len = (world_size as usize - 1) * $slots * $slot;
        let mut rings = ::std::vec![0u8; world_size as usize * mem_len];
        $crate::soft_nodes!(let $net, $nodes = world_size,
            $crate::__core::barrier::BarrierAlgorithm::default(), $clock);
        for (n, mem) in $nodes.iter_mut().zip(rings.chunks_mut(mem_len)) {
            let region = $net
                .register(n.rank(), mem, $crate::__core::memory::AccessFlags::LOCAL_WRITE)
                .unwrap();
            n.start_messaging_in(region, $slots, $slot).unwrap();
        }
    };
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

/// Inside an `impl DatagramProvider for Stub`, where the field `$inner` is itself a
/// `DatagramProvider` of the same `Address`: each method named, forwarded to it. A stub
/// writes only the methods it changes. `set_error => flushing` forwards `set_error` after
/// setting the stub's field `flushing` (a stub that completes what it holds as flushed from
/// then on).
#[macro_export]
macro_rules! forward_datagram {
    ($inner:tt; $($method:ident $(=> $flag:ident)?),* $(,)?) => {
        $( $crate::forward_datagram!(@one $inner $method $(=> $flag)?); )*
    };
    // Each method's parameter and success type, then one arm that writes a forward.
    (@one $inner:tt address) => {
        $crate::forward_datagram!(@fn $inner address(
            to: $crate::__core::provider::datagram::Destination) -> Self::Address);
    };
    (@one $inner:tt poll_send) => {
        $crate::forward_datagram!(@fn $inner poll_send(
            out: &mut [$crate::__core::completion::Completion]) -> usize);
    };
    (@one $inner:tt poll_recv) => {
        $crate::forward_datagram!(@fn $inner poll_recv(
            out: &mut [$crate::__core::completion::DatagramCompletion]) -> usize);
    };
    (@one $inner:tt join_group) => {
        $crate::forward_datagram!(@fn $inner join_group(group: $crate::__core::gid::Gid) -> ());
    };
    (@one $inner:tt leave_group) => {
        $crate::forward_datagram!(@fn $inner leave_group(group: $crate::__core::gid::Gid) -> ());
    };
    (@one $inner:tt set_error) => {
        $crate::forward_datagram!(@fn $inner set_error() -> ());
    };
    (@one $inner:tt set_error => $flag:ident) => {
        fn set_error(&mut self) -> Result<(), $crate::__core::provider::ProviderError> {
            self.$flag = true;
            $crate::__core::provider::datagram::DatagramProvider::set_error(&mut self.$inner)
        }
    };
    (@one $inner:tt post_send) => {
        $crate::forward_datagram!(@post $inner post_send(
            wrs: &[$crate::__core::wr::DatagramRequest<'_, Self::Address>]));
    };
    (@one $inner:tt post_recv) => {
        $crate::forward_datagram!(@post $inner post_recv(
            wrs: &[$crate::__core::wr::RecvRequest<'_>]));
    };
    (@fn $inner:tt $name:ident($($arg:ident: $ty:ty)?) -> $ok:ty) => {
        fn $name(&mut self $(, $arg: $ty)?) -> Result<$ok, $crate::__core::provider::ProviderError> {
            $crate::__core::provider::datagram::DatagramProvider::$name(&mut self.$inner $(, $arg)?)
        }
    };
    (@post $inner:tt $name:ident($arg:ident: $ty:ty)) => {
        unsafe fn $name(&mut self, $arg: $ty) -> Result<(), $crate::__core::wr::PostFailure> {
            // SAFETY: the caller keeps the posting contract, which we forward unchanged.
            unsafe { $crate::__core::provider::datagram::DatagramProvider::$name(&mut self.$inner, $arg) }
        }
    };
}

/// Rank `from` sends `total` numbered messages (each its number as 4 little-endian bytes) to
/// rank `to` as its credits allow, both progressing, and `to` hands them out once each and
/// in order within `rounds` rounds: the ring between them goes on (slots re-posted, credits
/// returned) after whatever the test did to it.
pub fn assert_messages_flow_in_order(
    nodes: &mut [SoftNode<'_, Spin>],
    from: u32,
    to: u32,
    total: usize,
    rounds: usize,
) {
    let (sender, receiver) = (from as usize, to as usize);
    let (mut sent, mut delivered) = (0usize, 0usize);
    for _ in 0..rounds {
        if sent < total {
            match nodes[sender].post_send_inline(to, &(sent as u32).to_le_bytes()) {
                Ok(_) => sent += 1,
                Err(NodeError::WouldBlock { .. }) => {}
                Err(e) => panic!("send {sent}: {e}"),
            }
        }
        nodes[sender].progress(8, |_| {}).unwrap();
        nodes[receiver]
            .progress(8, |ev| {
                if let Event::Message { data, .. } = ev {
                    assert_eq!(data, (delivered as u32).to_le_bytes(), "in order");
                    delivered += 1;
                }
            })
            .unwrap();
        if delivered == total {
            break;
        }
    }
    assert_eq!((sent, delivered), (total, total));
}
