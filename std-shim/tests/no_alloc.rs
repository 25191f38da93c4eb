//! Proves that the hot-path helpers documented as "does not allocate" really do not.
//!
//! A counting global allocator tallies allocations per thread, so the test harness's own
//! threads cannot disturb the count.

use core::time::Duration;

use rverbs_core::poll::{Backoff, Clock, Deadline};
use rverbs_std_shim::{StdClock, WaitPolicy};

#[global_allocator]
static GLOBAL: rverbs_testkit::Counting = rverbs_testkit::Counting;

/// The allocations this thread makes while running `f`.
fn allocations_during(f: impl FnOnce()) -> u64 {
    rverbs_testkit::counted(f).1
}

#[test]
fn the_allocation_counter_sees_a_vec_allocation() {
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
