//! A world of [`Node`]s on the software model ([`SoftNet`]): every layer above the provider
//! (barriers, messaging, multi-peer calls) tested at hundreds of ranks in one process, one
//! thread, and under Miri. Each node gets one send and one receive completion queue shared
//! by its queue pairs, as on a device, and optionally one shared receive queue.

use alloc::vec;
use alloc::vec::Vec;

use super::{flags_len, Components, Node, NodeError, NodeParts, Receive, SetupError};
use crate::barrier::BarrierAlgorithm;
use crate::channel::{Channel, ChannelConfig};
use crate::memory::AccessFlags;
use crate::model::{NetCq, NetQp, NetRegion, SoftNet};
use crate::poll::{Backoff, StaticClock};
use crate::provider::shared::{RoutedQp, SharedCqs};
use crate::sge::RemoteMemory;

/// A node on the software model.
pub type SoftNode<'n, B> = Node<RoutedQp<NetQp<'n>, NetCq<'n>>, NetRegion<'n>, B>;

/// Bytes of memory [`soft_world`] needs for `world` nodes with windows of `window_len`.
pub const fn soft_world_bytes(world: u32, window_len: usize) -> usize {
    let w = window_len.next_multiple_of(8);
    let per = flags_len(world) + if w == 0 { 8 } else { w };
    world as usize * per + 8
}

/// Builds all `net.nodes()` nodes of a world, fully connected, with the flag arrays and
/// windows (`window_len` bytes each) carved out of `arena` (at least [`soft_world_bytes`]
/// long). Every channel gets `cfg` with its peer's rank, a clone of `backoff` and `clock`;
/// the node keeps `clock` and takes `cfg.timeout` as its default [timeout](Node::timeout).
/// The nodes have the default [`Components`] (messaging into a ring per peer; see
/// [`soft_world_with`]). Allocates (setup).
pub fn soft_world<'n, 'm: 'n, B: Backoff + Clone>(
    net: &'n SoftNet<'m>,
    arena: &'m mut [u8],
    window_len: usize,
    cfg: ChannelConfig,
    algorithm: BarrierAlgorithm,
    backoff: B,
    clock: StaticClock,
) -> Result<Vec<SoftNode<'n, B>>, SetupError> {
    soft_world_with(
        net,
        arena,
        window_len,
        cfg,
        (algorithm, backoff, clock),
        Components::default(),
    )
}

/// [`soft_world`] with every node built with `components` (a [`Receive`] converts: messaging
/// landing as it says). With messaging into [`Receive::Shared`] every node gets a shared
/// receive queue of `slots` receives ([`SoftNet::create_srq`]) before any connection, so all
/// its queue pairs take their receives from it, and its receive completions are kept for the
/// pool ([`SharedCqs::with_srq`]). The net must have no connections yet. Components that
/// cannot work together are refused before anything is built ([`SetupError::Incompatible`]).
/// Allocates (setup).
///
/// ```
/// use rverbs_core::barrier::BarrierAlgorithm;
/// use rverbs_core::channel::ChannelConfig;
/// use rverbs_core::memory::AccessFlags;
/// use rverbs_core::node::{soft_world_bytes, soft_world_with, Event, Receive};
/// use rverbs_core::params::QpCaps;
/// use rverbs_core::poll::{Spin, StepClock};
/// use rverbs_core::model::{SoftNet, SoftNetConfig};
///
/// static CLOCK: StepClock = StepClock::new(core::time::Duration::from_micros(1));
/// let caps = QpCaps::queues(16, 16);
/// // Buffers outlive the net. One pool of 8 slots of 32 bytes per node, whatever the world.
/// let mut arena = vec![0u8; soft_world_bytes(3, 64)];
/// let mut pools = vec![0u8; 3 * 8 * 32];
/// let net = SoftNet::new(SoftNetConfig::new(3, caps));
/// let mut nodes = soft_world_with(&net, &mut arena, 64, ChannelConfig::default(),
///     (BarrierAlgorithm::default(), Spin, &CLOCK), Receive::Shared { slots: 8 }).unwrap();
/// for (n, mem) in nodes.iter_mut().zip(pools.chunks_mut(8 * 32)) {
///     let pool = net.register(n.rank(), mem, AccessFlags::LOCAL_WRITE).unwrap();
///     n.start_messaging_in(pool, 8, 32).unwrap();
///     assert_eq!((n.receive_memory(), n.credits_per_peer()), (8 * 32, 4));
/// }
/// nodes[1].post_send_inline(0, b"one").unwrap();
/// nodes[2].post_send_inline(0, b"two").unwrap();
/// let mut got = Vec::new();
/// while got.len() < 2 {
///     nodes[0].progress(8, |ev| if let Event::Message { rank, data, .. } = ev {
///         got.push((rank, data.to_vec()));
///     }).unwrap();
/// }
/// assert_eq!(got, [(1, b"one".to_vec()), (2, b"two".to_vec())]);
/// ```
pub fn soft_world_with<'n, 'm: 'n, B: Backoff + Clone>(
    net: &'n SoftNet<'m>,
    arena: &'m mut [u8],
    window_len: usize,
    cfg: ChannelConfig,
    (algorithm, backoff, clock): (BarrierAlgorithm, B, StaticClock),
    components: impl Into<Components>,
) -> Result<Vec<SoftNode<'n, B>>, SetupError> {
    let components = components.into();
    components.check()?;
    let world = net.nodes();
    if world == 0 || world > crate::wire::MAX_WORLD {
        return Err(SetupError::InvalidWorld { rank: 0, world });
    }
    let bad = |what| SetupError::InvalidArgument { what };
    if arena.len() < soft_world_bytes(world, window_len) {
        return Err(bad(
            "the arena is smaller than soft_world_bytes(world, window_len)",
        ));
    }
    // Flag arrays hold u64 counters: carve from an 8-aligned start.
    let skip = arena.as_ptr().align_offset(8).min(8);
    let mut rest = &mut arena[skip..];
    let window_len = window_len.next_multiple_of(8).max(8);
    let mut flags = Vec::with_capacity(world as usize);
    let mut windows = Vec::with_capacity(world as usize);
    for r in 0..world {
        let (f, more) = rest.split_at_mut(flags_len(world));
        let (w, more) = more.split_at_mut(window_len);
        rest = more;
        let reg = |buf, access| {
            net.register(r, buf, access)
                .map_err(|_| bad("soft register"))
        };
        flags.push(reg(f, super::FLAG_ACCESS)?);
        windows.push(reg(
            w,
            AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE | AccessFlags::REMOTE_READ,
        )?);
    }
    let peer_flags: Vec<RemoteMemory> = flags.iter().map(|f| f.remote()).collect();
    let peer_windows: Vec<RemoteMemory> = windows.iter().map(|w| w.remote()).collect();
    let mut shared = Vec::with_capacity(world as usize);
    for r in 0..world {
        let (s, rc) = (net.send_cq(r), net.recv_cq(r));
        let (Some(s), Some(rc)) = (s, rc) else {
            return Err(bad("the net's completion queues were taken already"));
        };
        let peers = world as usize - 1;
        shared.push(match components.messaging {
            None | Some(Receive::PerPeer) => SharedCqs::new(s, rc, peers),
            Some(Receive::Shared { slots }) => {
                let depth = net.create_srq(r, slots).ok_or(bad(
                    "the net refused a shared receive queue (connected already?)",
                ))?;
                SharedCqs::with_srq(s, rc, peers, depth)
            }
        });
    }
    let mut channels: Vec<Vec<Channel<RoutedQp<NetQp<'n>, NetCq<'n>>, B>>> = (0..world)
        .map(|_| Vec::with_capacity(world as usize - 1))
        .collect();
    for a in 0..world {
        for b in a + 1..world {
            let (qa, qb) = net
                .connect(a, b)
                .ok_or(bad("the net refused a connection"))?;
            for (me, peer, qp) in [(a, b, qa), (b, a, qb)] {
                let routed = shared[me as usize]
                    .add(qp)
                    .map_err(|_| bad("the shared completion queues refused a queue pair"))?;
                let mut c = cfg;
                c.rank = Some(peer);
                channels[me as usize].push(Channel::with_backoff(
                    routed,
                    c,
                    backoff.clone(),
                    clock,
                ));
            }
        }
    }
    let mut nodes = Vec::with_capacity(world as usize);
    for (r, ((chans, f), w)) in channels.into_iter().zip(flags).zip(windows).enumerate() {
        nodes.push(Node::from_parts(NodeParts {
            rank: r as u32,
            world,
            channels: chans,
            flags: f,
            window: w,
            peer_flags: peer_flags.clone(),
            peer_windows: peer_windows.clone(),
            algorithm,
            backoff: backoff.clone(),
            clock,
            timeout: cfg.timeout,
            components,
        })?);
    }
    Ok(nodes)
}

/// Bytes of memory [`soft_rejoin`] needs for one node of a world of `world` ranks with a
/// window of `window_len`.
pub const fn soft_rejoin_bytes(world: u32, window_len: usize) -> usize {
    let w = window_len.next_multiple_of(8);
    flags_len(world) + if w == 0 { 8 } else { w } + 8
}

/// Readmits rank `rank` of a soft world after [`SoftNet::kill`]: every survivor in
/// `survivors` (every other rank of the world, in any order) takes step one
/// ([`Node::readmit_begin`]); the net gives the rank a new life ([`SoftNet::restart`]); a new
/// node for it is built (flag array and window carved out of `arena`, at least
/// [`soft_rejoin_bytes`] long, its channels with `cfg`, `backoff` and `clock`) and connected
/// to every survivor; every survivor takes step two ([`Node::readmit_finish`]) with its end of
/// the new connection. Every survivor must have been built with readmission
/// ([`Components::readmission`]); so is the new node. Returns the new node: barriers run over
/// all ranks again. One thread
/// plays every rank, so the out-of-band rounds a real world needs are the order of these
/// steps. Allocates (setup).
///
/// ```
/// use rverbs_core::barrier::BarrierAlgorithm;
/// use rverbs_core::channel::ChannelConfig;
/// use rverbs_core::node::{soft_rejoin, soft_rejoin_bytes, soft_world_bytes, soft_world_with};
/// use rverbs_core::node::{Components, Members};
/// use rverbs_core::params::QpCaps;
/// use rverbs_core::poll::{Spin, StepClock};
/// use rverbs_core::model::{SoftNet, SoftNetConfig};
///
/// static CLOCK: StepClock = StepClock::new(core::time::Duration::from_micros(1));
/// let caps = QpCaps::queues(16, 16);
/// let mut arena = vec![0u8; soft_world_bytes(3, 64)];
/// let mut again = vec![0u8; soft_rejoin_bytes(3, 64)];
/// let net = SoftNet::new(SoftNetConfig::new(3, caps));
/// let alg = BarrierAlgorithm::Dissemination;
/// let cfg = ChannelConfig::default();
/// let mut nodes = soft_world_with(&net, &mut arena, 64, cfg, (alg, Spin, &CLOCK),
///     Components::readmission()).unwrap();
/// // Rank 1's process dies; the others learn of it (here: from a failed barrier).
/// net.kill(1);
/// drop(nodes.remove(1));
/// let reborn = soft_rejoin(&net, 1, &mut again, 64, cfg, (alg, Spin, &CLOCK), &mut nodes)
///     .unwrap();
/// nodes.insert(1, reborn);
/// // Counts start again from zero on every rank: barriers over all three work.
/// for n in nodes.iter_mut() {
///     n.barrier_start(Members::World).unwrap();
/// }
/// while !nodes.iter_mut().all(|n| n.barrier_poll().unwrap()) {}
/// ```
pub fn soft_rejoin<'n, 'm: 'n, B: Backoff + Clone>(
    net: &'n SoftNet<'m>,
    rank: u32,
    arena: &'m mut [u8],
    window_len: usize,
    cfg: ChannelConfig,
    (algorithm, backoff, clock): (BarrierAlgorithm, B, StaticClock),
    survivors: &mut [SoftNode<'n, B>],
) -> Result<SoftNode<'n, B>, SetupError> {
    let world = net.nodes();
    let bad = |what| SetupError::InvalidArgument { what };
    // What a survivor's readmission step fails with (the rank and the world were checked).
    let survivor = |e: NodeError| match e {
        NodeError::Readmit { rank, error } => SetupError::Readmit { rank, error },
        NodeError::NotBuiltWith(c) => SetupError::NotBuiltWith(c),
        _ => bad("a survivor cannot take part in readmission"),
    };
    if rank >= world {
        return Err(SetupError::InvalidWorld { rank, world });
    }
    if survivors.len() != world as usize - 1
        || survivors
            .iter()
            .any(|n| n.rank() == rank || n.world_size() != world)
    {
        return Err(bad("soft_rejoin needs every other rank of the world"));
    }
    if arena.len() < soft_rejoin_bytes(world, window_len) {
        return Err(bad(
            "the arena is smaller than soft_rejoin_bytes(world, window_len)",
        ));
    }
    if !net.is_dead(rank) {
        return Err(bad("soft_rejoin readmits a rank the net killed"));
    }
    for s in survivors.iter_mut() {
        s.readmit_begin(rank).map_err(survivor)?;
    }
    if !net.restart(rank) {
        return Err(bad("the net did not restart the rank"));
    }
    let skip = arena.as_ptr().align_offset(8).min(8);
    let (f, w) = arena[skip..].split_at_mut(flags_len(world));
    let w = &mut w[..window_len.next_multiple_of(8).max(8)];
    let reg = |buf, access| {
        net.register(rank, buf, access)
            .map_err(|_| bad("soft register"))
    };
    let flags = reg(f, super::FLAG_ACCESS)?;
    let window = reg(
        w,
        AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE | AccessFlags::REMOTE_READ,
    )?;
    let (Some(s), Some(rc)) = (net.send_cq(rank), net.recv_cq(rank)) else {
        return Err(bad("the net's completion queues were taken already"));
    };
    let shared = SharedCqs::new(s, rc, world as usize - 1);
    let mut peer_flags = vec![RemoteMemory::default(); world as usize];
    let mut peer_windows = vec![RemoteMemory::default(); world as usize];
    let mut channels = Vec::with_capacity(world as usize - 1);
    let mut theirs = Vec::with_capacity(survivors.len());
    for s in survivors.iter() {
        let peer = s.rank();
        let (mine, other) = net
            .connect(rank, peer)
            .ok_or(bad("the net refused a connection"))?;
        let routed = shared
            .add(mine)
            .map_err(|_| bad("the shared completion queues refused a queue pair"))?;
        let mut c = cfg;
        c.rank = Some(peer);
        channels.push(Channel::with_backoff(routed, c, backoff.clone(), clock));
        peer_flags[peer as usize] = s.flags_remote();
        peer_windows[peer as usize] = s.window().remote();
        theirs.push(other);
    }
    let (my_flags, my_window) = (flags.remote(), window.remote());
    let node = Node::from_parts(NodeParts {
        rank,
        world,
        channels,
        flags,
        window,
        peer_flags,
        peer_windows,
        algorithm,
        backoff,
        clock,
        timeout: cfg.timeout,
        components: Components::readmission(),
    })?;
    for (s, qp) in survivors.iter_mut().zip(theirs) {
        s.readmit_finish(rank, qp, my_flags, my_window)
            .map_err(survivor)?;
    }
    Ok(node)
}
