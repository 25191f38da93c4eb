//! What the core integration tests share: the test device, a wall clock, a counting global
//! allocator (`counting`), a child-process harness for tests between processes (`child`),
//! the checks of a multicast member child (`member`), and, with feature `verbs`, helpers on
//! the device (`device`). Each test binary compiles it with `mod support;` and uses part of
//! it.
//!
//! The device comes from `RVERBS_TEST_DEVICE` (for example `rxe0` inside the SoftRoCE VM, or
//! `mlx5_0` on real hardware). Without it a test is skipped with a message, except under
//! `CI=true`, where a missing device fails the run: CI must never pass device tests that did
//! not run.
// Test code, and no test uses all of it.
#![allow(dead_code, unused_imports, unused_macros, unreachable_pub)]
#![allow(clippy::std_instead_of_core)]

mod child;
mod counting;
#[cfg(feature = "verbs")]
mod device;
mod member;

pub use child::{hex, say, unhex, Peer};
pub use counting::{allocs, Counting};
#[cfg(feature = "verbs")]
pub use device::{channel_pair, open, poll_n};
pub use member::{receive_in_order, receive_within};

use std::time::Instant;

use rverbs_core::poll::Clock;

/// Wall-clock time for channels in tests (core cannot use std-shim's clock: that would be a
/// second copy of rverbs-core in the test binary).
#[derive(Debug)]
pub struct Wall;

/// The clock test channels keep.
pub static WALL: Wall = Wall;

impl Clock for Wall {
    fn now(&self) -> rverbs_core::poll::Instant {
        static EPOCH: std::sync::OnceLock<Instant> = std::sync::OnceLock::new();
        let since = EPOCH.get_or_init(Instant::now).elapsed();
        rverbs_core::poll::Instant::from_nanos(since.as_nanos() as u64)
    }
}

/// The device to test on, or `None` (after saying so) when the test should be skipped.
pub fn test_device(test: &str) -> Option<String> {
    match std::env::var("RVERBS_TEST_DEVICE") {
        Ok(d) if !d.is_empty() => Some(d),
        _ => {
            if std::env::var("CI").is_ok_and(|v| v == "true") {
                panic!(
                    "{test}: RVERBS_TEST_DEVICE is not set and CI=true; device tests must run \
                     on a device in CI (tools/test-all runs them inside the SoftRoCE VM)"
                );
            }
            eprintln!(
                "{test}: SKIPPED: RVERBS_TEST_DEVICE is not set (e.g. RVERBS_TEST_DEVICE=rxe0)"
            );
            None
        }
    }
}

/// A deterministic byte pattern.
pub fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed))
        .collect()
}

/// Opens the test device (`support::open`) and a protection domain on it, as `(ctx, pd)`;
/// returns from the calling test when it is to be skipped. Tests that use it declare
/// `#[macro_use] mod support;`.
#[cfg(feature = "verbs")]
macro_rules! setup {
    ($name:expr) => {{
        let Some(ctx) = support::open($name) else {
            return;
        };
        let pd = ctx.alloc_pd().unwrap();
        (ctx, pd)
    }};
}
