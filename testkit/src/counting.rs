//! A global allocator that counts, for the tests proving that a path allocates nothing. The
//! allocator must be the test binary's own, so each test that counts installs it:
//!
//! ```ignore
//! #[global_allocator]
//! static GLOBAL: rverbs_testkit::Counting = rverbs_testkit::Counting;
//! ```

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::sync::atomic::{AtomicU64, Ordering};

/// Forwards to the system allocator and counts every allocation it makes, per thread
/// ([`allocs`]) and over all threads ([`allocs_all`]).
#[derive(Debug)]
pub struct Counting;

thread_local! {
    /// Allocations made by this thread, so that the test harness's other threads (and other
    /// tests running beside this one) do not count.
    static ALLOCS: Cell<u64> = const { Cell::new(0) };
}

/// Allocations made by every thread: for a process whose library may allocate on a thread
/// of its own (a child process of a multi-process test, which runs one test alone).
static ALL: AtomicU64 = AtomicU64::new(0);

fn count() {
    ALL.fetch_add(1, Ordering::Relaxed);
    // `try_with`: the slot may be gone while the thread exits.
    let _ = ALLOCS.try_with(|a| a.set(a.get() + 1));
}

/// Allocations this thread has made so far (through [`Counting`], once installed).
pub fn allocs() -> u64 {
    ALLOCS.with(Cell::get)
}

/// Allocations every thread of the process has made so far (through [`Counting`]).
pub fn allocs_all() -> u64 {
    ALL.load(Ordering::Relaxed)
}

/// Runs `f`; its result and the allocations this thread made meanwhile.
pub fn counted<T>(f: impl FnOnce() -> T) -> (T, u64) {
    let before = allocs();
    let out = f();
    (out, allocs() - before)
}

// SAFETY: forwards every call to the system allocator unchanged; counting touches only a
// thread-local cell and an atomic, neither of which allocates.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, l: Layout) -> *mut u8 {
        count();
        // SAFETY: the caller keeps `GlobalAlloc::alloc`'s contract, which we forward.
        unsafe { System.alloc(l) }
    }
    unsafe fn dealloc(&self, p: *mut u8, l: Layout) {
        // SAFETY: `p` came from `System` (every allocation here does) with layout `l`.
        unsafe { System.dealloc(p, l) }
    }
    unsafe fn alloc_zeroed(&self, l: Layout) -> *mut u8 {
        count();
        // SAFETY: the caller keeps `GlobalAlloc::alloc_zeroed`'s contract, which we forward.
        unsafe { System.alloc_zeroed(l) }
    }
    unsafe fn realloc(&self, p: *mut u8, l: Layout, n: usize) -> *mut u8 {
        count();
        // SAFETY: the caller keeps `GlobalAlloc::realloc`'s contract; `p` came from `System`.
        unsafe { System.realloc(p, l, n) }
    }
}
