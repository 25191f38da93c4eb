//! Proves that the hot-path helpers documented as "does not allocate" really do not.
//!
//! A counting global allocator tallies allocations per thread, so the test harness's own
//! threads cannot disturb the count.

use core::alloc::{GlobalAlloc, Layout};
use core::cell::Cell;
use core::time::Duration;
use std::alloc::System;

use rverbs_core::poll::{Backoff, Clock, Deadline};
use rverbs_std_shim::{StdClock, WaitPolicy};

struct Counting;

std::thread_local! {
    static ALLOCATIONS: Cell<usize> = const { Cell::new(0) };
}

// SAFETY: defers every operation to `System` unchanged; the counter is a thread-local `Cell`
// with a const initialiser and no destructor, so touching it never allocates or recurses.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        let _ = ALLOCATIONS.try_with(|n| n.set(n.get() + 1));
        // SAFETY: the caller upholds `GlobalAlloc::alloc`'s contract, which we forward.
        unsafe { System.alloc(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: `ptr` came from `System.alloc` with this layout, as the caller guarantees.
        unsafe { System.dealloc(ptr, layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        let _ = ALLOCATIONS.try_with(|n| n.set(n.get() + 1));
        // SAFETY: forwarded unchanged under the caller's guarantees.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

fn allocations_during(f: impl FnOnce()) -> usize {
    let before = ALLOCATIONS.with(Cell::get);
    f();
    ALLOCATIONS.with(Cell::get) - before
}

#[test]
fn counter_sees_allocations() {
    let n = allocations_during(|| drop(core::hint::black_box(vec![1u8; 16])));
    assert!(n >= 1);
}

#[test]
fn clock_and_deadline_do_not_allocate() {
    let clock = StdClock::new();
    let n = allocations_during(|| {
        let start = clock.now();
        let deadline = Deadline::after(&clock, Duration::from_micros(50));
        while !deadline.passed(&clock) {
            core::hint::spin_loop();
        }
        core::hint::black_box(clock.elapsed_since(start));
    });
    assert_eq!(n, 0);
}

#[test]
fn backoff_policies_do_not_allocate() {
    let policies = [
        WaitPolicy::Spin,
        WaitPolicy::Yield { spins: 4 },
        WaitPolicy::Sleep {
            spins: 4,
            pause: Duration::from_micros(1),
        },
        // Without completion events attached: the fallback sleep.
        WaitPolicy::Block { spins: 4 },
    ];
    let n = allocations_during(|| {
        for policy in policies {
            let mut b = policy.backoff();
            for _ in 0..16 {
                b.snooze();
            }
            b.reset();
            b.snooze();
        }
    });
    assert_eq!(n, 0);
}

#[cfg(target_os = "linux")]
#[test]
fn cpulist_parsing_and_iteration_do_not_allocate() {
    let n = allocations_during(|| {
        let set = rverbs_std_shim::parse_cpulist("0-3,8-11,15\n").unwrap();
        let sum: u32 = set.iter().sum();
        core::hint::black_box(sum);
        let _ = core::hint::black_box(rverbs_std_shim::parse_cpulist("1,,x"));
    });
    assert_eq!(n, 0);
}
