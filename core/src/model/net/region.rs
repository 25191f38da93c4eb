//! Memory registered with a node of a net: its keys, and the region as its owner sees it.

use core::cell::RefCell;
use core::fmt;

use super::super::keys::{scramble, unscramble, KeyKind};
use super::super::region::Registered;
#[cfg(doc)]
use super::super::AccessFlags;
use super::calls::NetState;
#[cfg(doc)]
use super::SoftNet;

/// Bits of a key that name the slot in the node's region table.
pub(super) const SLOT_BITS: u32 = 10;
const SLOT_MASK: u32 = (1 << SLOT_BITS) - 1;
/// Bits of a key that hold the registration's generation (all but the slot and the kind).
const GEN_BITS: u32 = 32 - SLOT_BITS - 1;
/// The largest generation; generation 0 is never issued.
pub(super) const GEN_MASK: u32 = (1 << GEN_BITS) - 1;

/// Scrambles (generation, kind, slot) into a key. The node is not in the key: generations
/// are unique in the net, so the slot of another node that the key names holds another
/// generation (or nothing).
pub(super) const fn net_key(gen: u32, kind: KeyKind, slot: usize) -> u32 {
    let kind = match kind {
        KeyKind::Local => 0,
        KeyKind::Remote => 1,
    };
    scramble(
        ((gen & GEN_MASK) << (SLOT_BITS + 1)) | (kind << SLOT_BITS) | (slot as u32 & SLOT_MASK),
    )
}

/// (generation, kind, slot) of a key.
pub(super) const fn split_net_key(key: u32) -> (u32, KeyKind, usize) {
    let raw = unscramble(key);
    let kind = if raw & (1 << SLOT_BITS) == 0 {
        KeyKind::Local
    } else {
        KeyKind::Remote
    };
    (raw >> (SLOT_BITS + 1), kind, (raw & SLOT_MASK) as usize)
}

/// Memory registered with one node of a [`SoftNet`]: its keys work on every queue pair of
/// that node, and on no other node's. Deregistered on drop.
///
/// Peers may write it (with [`AccessFlags::REMOTE_WRITE`]) whenever the model runs, so the CPU
/// reaches its bytes only through volatile copies, never through a slice (except the
/// `unsafe` [`NetRegion::slice_unchecked`]).
pub struct NetRegion<'n> {
    pub(super) state: &'n RefCell<NetState>,
    pub(super) node: u32,
    pub(super) slot: usize,
    pub(super) reg: Registered,
}

impl fmt::Debug for NetRegion<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.reg.debug_as(f, "NetRegion", ("node", &self.node))
    }
}

impl Drop for NetRegion<'_> {
    fn drop(&mut self) {
        let mut st = self.state.borrow_mut();
        if let Some(node) = st.world.nodes.get_mut(self.node as usize) {
            // After a restart the slot may hold a registration of the node's new life.
            let (gen, _, _) = split_net_key(self.reg.lkey);
            if let Some(r) = node.regions.get_mut(self.slot).filter(|r| r.gen == gen) {
                r.release();
            }
        }
    }
}

impl NetRegion<'_> {
    super::super::region::registered_accessors!();

    /// The node it is registered with.
    #[inline]
    pub fn node(&self) -> u32 {
        self.node
    }
}

crate::memory::region_by_inherent_methods!(NetRegion<'_>);
