//! The flag array: the small region every rank of a node's world registers for its peers to
//! signal it with 8-byte RDMA writes, each one little-endian `u64` in a slot of its own.
//!
//! For a world of `world` ranks the array is `16 * world + 8` bytes:
//!
//! | bytes                              | slot                | written by | holds                                            |
//! |------------------------------------|---------------------|------------|--------------------------------------------------|
//! | `8r .. 8r + 8`                     | arrivals of rank `r` | rank `r`   | barrier notifications rank `r` sent us, counted  |
//! | `8(world + r) .. 8(world + r) + 8` | credits of rank `r`  | rank `r`   | how many of our messages rank `r` has consumed   |
//! | `16 world .. 16 world + 8`         | notice              | any rank   | a [failure notice](super::notice), or 0          |
//!
//! Only the offsets are fixed here; what a word means, and how much of it can be believed,
//! is the reader's business one layer up. Every peer holds the array's key and may write any
//! bytes anywhere in it, so the node checks every word it reads (a barrier count above what
//! its rank could have reached fails the barrier, a credit word above what was sent counts as
//! nothing, a notice that does not decode is ignored). A slot offset asked of a rank outside
//! the world is `None`, never a slot of someone else.

/// Bytes of one slot: every slot holds one little-endian `u64`.
pub const SLOT_LEN: usize = 8;

/// Where each slot of a world's flag array lies (see the [module docs](self)).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FlagLayout {
    world: u32,
}

impl FlagLayout {
    /// The layout of a world of `world` ranks.
    pub const fn new(world: u32) -> Self {
        Self { world }
    }

    /// The number of ranks the layout has slots for.
    pub const fn world(&self) -> u32 {
        self.world
    }

    /// Bytes of the whole array: two slots per rank and the notice.
    pub const fn len(&self) -> usize {
        self.notice() + SLOT_LEN
    }

    /// Whether the array has no bytes (never: the notice is always there).
    pub const fn is_empty(&self) -> bool {
        false
    }

    /// Offset of the slot that counts the barrier notifications rank `from` sent the owner;
    /// `None` if `from` is not a rank of the world.
    pub const fn arrivals(&self, from: u32) -> Option<usize> {
        if from < self.world {
            Some(from as usize * SLOT_LEN)
        } else {
            None
        }
    }

    /// Offset of the slot where rank `from` says how many of the owner's messages it has
    /// consumed (its credit return); `None` if `from` is not a rank of the world.
    pub const fn credits(&self, from: u32) -> Option<usize> {
        if from < self.world {
            Some((self.world as usize + from as usize) * SLOT_LEN)
        } else {
            None
        }
    }

    /// Offset of the failure notice: the last slot.
    pub const fn notice(&self) -> usize {
        2 * self.world as usize * SLOT_LEN
    }

    /// The offsets of every slot, first to last (what zeroing the whole array visits).
    pub fn slots(&self) -> impl Iterator<Item = usize> {
        (0..self.len()).step_by(SLOT_LEN)
    }

    /// The word a slot's bytes hold.
    pub const fn word(bytes: [u8; SLOT_LEN]) -> u64 {
        u64::from_le_bytes(bytes)
    }

    /// The bytes that put `word` into a slot.
    pub const fn bytes(word: u64) -> [u8; SLOT_LEN] {
        word.to_le_bytes()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_slot_is_disjoint_in_bounds_and_the_notice_comes_last() {
        for world in [1, 2, 3, 7, 64] {
            let l = FlagLayout::new(world);
            assert_eq!(l.len(), 16 * world as usize + 8);
            let mut seen = alloc::vec![false; l.len() / SLOT_LEN];
            let mut mark = |at: usize| {
                assert_eq!(at % SLOT_LEN, 0);
                assert!(at + SLOT_LEN <= l.len());
                assert!(!core::mem::replace(&mut seen[at / SLOT_LEN], true));
            };
            for r in 0..world {
                mark(l.arrivals(r).unwrap());
                mark(l.credits(r).unwrap());
            }
            mark(l.notice());
            assert!(seen.iter().all(|&s| s));
            assert_eq!(l.notice() + SLOT_LEN, l.len());
            assert_eq!(l.slots().count(), seen.len());
        }
    }

    #[test]
    fn a_rank_outside_the_world_has_no_slot() {
        let l = FlagLayout::new(3);
        assert_eq!(l.arrivals(3), None);
        assert_eq!(l.credits(u32::MAX), None);
        assert_eq!(l.arrivals(2), Some(16));
        assert_eq!(l.credits(1), Some(32));
        assert_eq!(l.notice(), 48);
    }

    #[test]
    fn a_slot_word_is_little_endian() {
        assert_eq!(
            FlagLayout::word([1, 0, 0, 0, 0, 0, 0, 2]),
            0x0200_0000_0000_0001
        );
        assert_eq!(
            FlagLayout::bytes(0x0200_0000_0000_0001),
            [1, 0, 0, 0, 0, 0, 0, 2]
        );
    }
}
