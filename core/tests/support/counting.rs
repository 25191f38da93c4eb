//! A global allocator that counts the allocations each thread makes, for the tests proving
//! that a path allocates nothing. The allocator must be the binary's own, so each test that
//! counts installs it:
//!
//! ```ignore
//! #[global_allocator]
//! static GLOBAL: support::Counting = support::Counting;
//! ```

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;

/// Forwards to the system allocator and counts, per thread, every allocation it makes.
pub struct Counting;

thread_local! {
    /// Allocations made by this thread (the test harness's own threads do not count).
    static ALLOCS: Cell<u64> = const { Cell::new(0) };
}

fn count() {
    // `try_with`: the slot may be gone while the thread exits.
    let _ = ALLOCS.try_with(|a| a.set(a.get() + 1));
}

/// Allocations this thread has made so far (through `Counting`, once installed).
pub fn allocs() -> u64 {
    ALLOCS.with(Cell::get)
}

// SAFETY: forwards to the system allocator; only counts.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, l: Layout) -> *mut u8 {
        count();
        // SAFETY: same contract as ours.
        unsafe { System.alloc(l) }
    }
    unsafe fn dealloc(&self, p: *mut u8, l: Layout) {
        // SAFETY: same contract as ours.
        unsafe { System.dealloc(p, l) }
    }
    unsafe fn alloc_zeroed(&self, l: Layout) -> *mut u8 {
        count();
        // SAFETY: same contract as ours.
        unsafe { System.alloc_zeroed(l) }
    }
    unsafe fn realloc(&self, p: *mut u8, l: Layout, n: usize) -> *mut u8 {
        count();
        // SAFETY: same contract as ours.
        unsafe { System.realloc(p, l, n) }
    }
}
