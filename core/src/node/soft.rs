//! A world of [`Node`]s on the software model ([`SoftNet`]): every layer above the provider
//! (barriers, messaging, multi-peer calls) tested at hundreds of ranks in one process, one
//! thread, and under Miri. Each node gets one send and one receive completion queue shared
//! by its queue pairs, as on a device.

use alloc::vec::Vec;

use super::{flags_len, Node, NodeError, NodeParts};
use crate::barrier::BarrierAlgorithm;
use crate::channel::{Channel, ChannelConfig};
use crate::memory::AccessFlags;
use crate::poll::{Backoff, StaticClock};
use crate::provider::shared::{RoutedQp, SharedCqs};
use crate::provider::soft::{NetCq, NetQp, NetRegion, SoftNet};
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
/// long). Every channel gets `cfg` with its peer's rank, a clone of `backoff` and `clock`.
/// Allocates (setup).
pub fn soft_world<'n, 'm: 'n, B: Backoff + Clone>(
    net: &'n SoftNet<'m>,
    arena: &'m mut [u8],
    window_len: usize,
    cfg: ChannelConfig,
    algorithm: BarrierAlgorithm,
    backoff: B,
    clock: StaticClock,
) -> Result<Vec<SoftNode<'n, B>>, NodeError> {
    let world = net.nodes();
    if world == 0 || world > crate::wire::MAX_WORLD {
        return Err(NodeError::InvalidWorld { rank: 0, world });
    }
    let bad = |what| NodeError::InvalidArgument { what };
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
        shared.push(SharedCqs::new(s, rc, world as usize - 1));
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
                c.peer = Some(peer);
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
        })?);
    }
    Ok(nodes)
}
