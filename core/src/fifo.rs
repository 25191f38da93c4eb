//! The one first-in, first-out queue of the crate: a fixed number of slots allocated once,
//! at setup, so that nothing on the data path allocates. Shared completion queues keep their
//! mailboxes and ready list in it, the instant device its completion entries (and the
//! entries an extended post stages), a node the peers it has to serve.
//!
//! Why not `heapless::Deque`: its capacity is a const generic, and these capacities are known
//! only when the queue is built (queue depths, the number of peers); its run-time sized
//! form (`DequeView`) can only be borrowed from a `Deque` of a const capacity. It also has no
//! place for entries written behind the last one before they count (see
//! [`Fifo::behind_mut`]), which a driver's extended post needs.
//!
//! Slots are found by adding and subtracting the capacity once, never by `%`: a division
//! costs an instruction sequence on every push and pop of a path that `tools/cost` counts.

use alloc::boxed::Box;
use alloc::vec;

/// A FIFO of at most [`Fifo::capacity`] values, its slots allocated by [`Fifo::new`] and
/// never again. A full queue hands a pushed value back.
pub(crate) struct Fifo<T> {
    slots: Box<[T]>,
    /// The slot of the oldest value (0 when empty and never used). Always below the
    /// capacity when there is one.
    head: usize,
    len: usize,
}

impl<T: Copy> Fifo<T> {
    /// An empty queue of `cap` slots, each holding `fill` until a value is written there.
    /// Allocates (setup).
    pub(crate) fn new(cap: usize, fill: T) -> Self {
        Self {
            slots: vec![fill; cap].into_boxed_slice(),
            head: 0,
            len: 0,
        }
    }

    /// The slot `offset` places after the oldest value's (`offset` at most the capacity).
    #[inline(always)]
    fn slot(&self, offset: usize) -> usize {
        let at = self.head + offset;
        if at >= self.slots.len() {
            at - self.slots.len()
        } else {
            at
        }
    }

    /// Values it can hold.
    #[inline]
    pub(crate) fn capacity(&self) -> usize {
        self.slots.len()
    }

    /// Values it holds.
    #[inline]
    pub(crate) fn len(&self) -> usize {
        self.len
    }

    #[inline]
    pub(crate) fn is_empty(&self) -> bool {
        self.len == 0
    }

    #[cfg_attr(not(feature = "instant"), allow(dead_code))]
    #[inline]
    pub(crate) fn is_full(&self) -> bool {
        self.len == self.slots.len()
    }

    /// Adds `v` after the newest value; `Err(v)` if the queue is full. Does not allocate.
    #[inline]
    pub(crate) fn push(&mut self, v: T) -> Result<(), T> {
        match self.behind_mut(0) {
            Some(s) => {
                *s = v;
                self.len += 1;
                Ok(())
            }
            None => Err(v),
        }
    }

    /// Takes the oldest value. Does not allocate.
    #[inline]
    pub(crate) fn pop(&mut self) -> Option<T> {
        if self.len == 0 {
            return None;
        }
        let v = self.slots[self.head];
        self.head += 1;
        if self.head == self.slots.len() {
            self.head = 0;
        }
        self.len -= 1;
        Some(v)
    }

    /// Takes the oldest values into `out`, as many as it holds or `out` has room for; how
    /// many. Does not allocate.
    #[inline]
    pub(crate) fn pop_into(&mut self, out: &mut [T]) -> usize {
        let mut n = 0;
        while n < out.len() {
            match self.pop() {
                Some(v) => {
                    out[n] = v;
                    n += 1;
                }
                None => break,
            }
        }
        n
    }

    /// Forgets every value (slots keep their bytes; nothing is dropped, `T` is `Copy`).
    pub(crate) fn clear(&mut self) {
        self.head = 0;
        self.len = 0;
    }

    /// Which of the `capacity` slots holds the oldest value (when there is one): for a
    /// caller that keeps more about each value in an array of its own, by slot.
    #[cfg_attr(not(feature = "instant"), allow(dead_code))]
    #[inline]
    pub(crate) fn front_slot(&self) -> usize {
        self.head
    }

    /// Which slot [`Fifo::behind_mut`]`(i)` writes; `None` likewise.
    #[inline(always)]
    pub(crate) fn slot_behind(&self, i: usize) -> Option<usize> {
        // `len` is at most the capacity (a caller that publishes more than it staged breaks
        // that; a debug build stops it in `publish`), so neither side overflows.
        if i >= self.slots.len() - self.len {
            return None;
        }
        Some(self.slot(self.len + i))
    }

    /// The slot `i` places behind the newest value, to write a value there that is not in
    /// the queue until [`Fifo::publish`] counts it (a driver writing queue entries before it
    /// rings the doorbell); `None` if the queue has no room for `i + 1` more. What a slot
    /// behind the newest value holds is whatever was last written there. Does not allocate.
    #[inline(always)]
    pub(crate) fn behind_mut(&mut self, i: usize) -> Option<&mut T> {
        let at = self.slot_behind(i)?;
        self.slots.get_mut(at)
    }

    /// Makes the `n` slots behind the newest value (written through
    /// [`Fifo::behind_mut`]) its newest values, oldest first. The caller found room for them
    /// with `behind_mut(n - 1)`: more would be a bug of the caller's, which corrupts no
    /// memory (every slot is reached through a checked index) but the queue's order.
    /// Does not allocate.
    #[cfg_attr(not(feature = "instant"), allow(dead_code))]
    #[inline(always)]
    pub(crate) fn publish(&mut self, n: usize) {
        debug_assert!(
            n <= self.slots.len() - self.len,
            "published {n} values into room for {}",
            self.slots.len() - self.len
        );
        self.len += n;
    }
}

#[cfg(test)]
mod tests {
    use super::Fifo;

    /// A queue of `cap` slots, `values` pushed into it.
    fn holding(cap: usize, values: impl IntoIterator<Item = u32>) -> Fifo<u32> {
        let mut q = Fifo::new(cap, 0);
        for v in values {
            assert_eq!(q.push(v), Ok(()));
        }
        q
    }

    /// The values of `q`, oldest first, taken out.
    fn drain(q: &mut Fifo<u32>) -> alloc::vec::Vec<u32> {
        core::iter::from_fn(|| q.pop()).collect()
    }

    #[test]
    fn values_come_out_in_order_across_the_end_of_the_slots() {
        let mut q = Fifo::new(3, 0u32);
        // Every head position, each with a full queue that wraps past the last slot.
        for round in 0..7u32 {
            let base = round * 10;
            for v in base..base + 3 {
                assert_eq!(q.push(v), Ok(()));
            }
            assert_eq!(q.len(), 3);
            assert_eq!(q.pop(), Some(base));
            assert_eq!(q.push(base + 3), Ok(()));
            assert_eq!(drain(&mut q), [base + 1, base + 2, base + 3]);
            assert!(q.is_empty());
            // Moves the head one slot on for the next round.
            assert_eq!(q.push(99), Ok(()));
            assert_eq!(q.pop(), Some(99));
        }
    }

    #[test]
    fn a_full_queue_hands_the_value_back_and_keeps_its_own() {
        let mut q = holding(2, [1, 2]);
        assert_eq!(q.push(3), Err(3));
        assert_eq!(q.len(), 2);
        assert_eq!(q.pop(), Some(1));
        assert_eq!(q.push(4), Ok(()));
        assert_eq!(q.push(5), Err(5));
        assert_eq!(drain(&mut q), [2, 4]);
        assert_eq!(q.pop(), None);
    }

    #[test]
    fn a_queue_of_no_slots_takes_nothing() {
        let mut q = Fifo::new(0, 0u32);
        assert_eq!(q.capacity(), 0);
        assert_eq!(q.push(1), Err(1));
        assert_eq!(q.pop(), None);
        assert!(q.behind_mut(0).is_none());
        assert_eq!(q.pop_into(&mut [0; 4]), 0);
    }

    #[test]
    fn clear_empties_the_queue_wherever_its_head_was() {
        let mut q = holding(4, 0..4);
        assert_eq!(q.pop(), Some(0));
        q.clear();
        assert!(q.is_empty());
        assert_eq!(q.pop(), None);
        for v in 10..14 {
            assert_eq!(q.push(v), Ok(()));
        }
        assert_eq!(
            q.push(14),
            Err(14),
            "cleared, it holds its capacity again, no more"
        );
        assert_eq!(drain(&mut q), [10, 11, 12, 13]);
    }

    #[test]
    fn pop_into_takes_what_fits_oldest_first() {
        let mut q = holding(4, 1..=4);
        let mut out = [0; 3];
        assert_eq!(q.pop_into(&mut out), 3);
        assert_eq!(out, [1, 2, 3]);
        assert_eq!(q.push(5), Ok(()));
        let mut out = [0; 8];
        assert_eq!(q.pop_into(&mut out), 2);
        assert_eq!(out[..2], [4, 5]);
    }

    #[test]
    fn staged_values_count_only_once_published_and_wrap_like_pushed_ones() {
        // Head on the third slot: the staged slots run past the last one.
        let mut q = holding(4, 0..3);
        assert_eq!(q.pop(), Some(0));
        assert_eq!(q.pop(), Some(1));
        // One value in (2), room for three behind it.
        *q.behind_mut(0).unwrap() = 20;
        *q.behind_mut(1).unwrap() = 21;
        *q.behind_mut(2).unwrap() = 22;
        assert!(q.behind_mut(3).is_none(), "no room for a fourth");
        assert!(q.behind_mut(usize::MAX).is_none());
        assert_eq!(q.len(), 1, "staged values are not in the queue");
        // An aborted section: staged values are overwritten by the next writes.
        *q.behind_mut(0).unwrap() = 30;
        *q.behind_mut(1).unwrap() = 31;
        q.publish(2);
        assert_eq!(q.len(), 3);
        assert_eq!(q.push(32), Ok(()));
        assert_eq!(q.push(33), Err(33));
        assert!(q.behind_mut(0).is_none());
        assert_eq!(drain(&mut q), [2, 30, 31, 32]);
        q.publish(0);
        assert!(q.is_empty());
    }

    #[test]
    fn slots_say_where_each_value_sits_for_an_array_kept_beside_it() {
        // As the instant device keeps a time per entry: written by the slot a staged value
        // goes to, read by the slot of the value taken.
        let mut q = holding(3, [1, 2]);
        assert_eq!(q.pop(), Some(1));
        let mut beside = [0u64; 3];
        for (i, v) in [(0, 100u32), (1, 101)] {
            beside[q.slot_behind(i).unwrap()] = u64::from(v) * 10;
            *q.behind_mut(i).unwrap() = v;
        }
        assert_eq!(q.slot_behind(0), Some(2));
        assert_eq!(q.slot_behind(1), Some(0), "past the last slot, the first");
        assert!(q.slot_behind(2).is_none());
        q.publish(2);
        let mut seen = alloc::vec::Vec::new();
        while !q.is_empty() {
            let at = q.front_slot();
            seen.push((q.pop().unwrap(), beside[at]));
        }
        assert_eq!(seen, [(2, 0), (100, 1000), (101, 1010)]);
    }

    #[test]
    fn the_head_runs_round_every_slot_under_a_mixed_load() {
        // Pushes, staged sections and pops against a model of the queue.
        let mut q = Fifo::new(5, 0u32);
        let mut model = alloc::collections::VecDeque::new();
        let mut next = 0u32;
        for step in 0..200u32 {
            match step % 4 {
                0 | 1 => match q.push(next) {
                    Ok(()) => model.push_back(next),
                    Err(v) => assert_eq!((v, model.len()), (next, 5)),
                },
                2 => {
                    let k = (step as usize / 4) % 3;
                    let staged = (0..k).all(|i| q.behind_mut(i).is_some());
                    assert_eq!(staged, model.len() + k <= 5);
                    if staged {
                        for i in 0..k {
                            *q.behind_mut(i).unwrap() = next + i as u32;
                            model.push_back(next + i as u32);
                        }
                        q.publish(k);
                    }
                }
                _ => {
                    assert_eq!(q.pop(), model.pop_front());
                    assert_eq!(q.pop(), model.pop_front());
                }
            }
            next += 10;
            assert_eq!(q.len(), model.len());
        }
    }
}
