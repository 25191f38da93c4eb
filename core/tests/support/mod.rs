//! What the core integration tests share beyond the test kit (`rverbs-testkit`, re-exported
//! here): the checks of a multicast member child (`member`) and, with feature `verbs`,
//! helpers on the device (`device`). Each test binary compiles it with `mod support;` and
//! uses part of it.
// Test code, and no test uses all of it.
#![allow(dead_code, unused_imports, unused_macros, unreachable_pub)]
#![allow(clippy::std_instead_of_core)]

#[cfg(feature = "verbs")]
mod device;
mod member;

#[cfg(feature = "verbs")]
pub use device::{channel_pair, open, poll_n};
pub use member::{receive_in_order, receive_within};
pub use rverbs_testkit::{
    allocs, hex, pattern, say, test_device, unhex, Counting, Peer, Wall, WALL,
};

/// Opens the test device (`support::open`) and a protection domain on it, as `(ctx, pd)`
/// (with `default channels`, also two connected channels); returns from the calling test
/// when it is to be skipped. Tests that use it declare
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
    // And a loopback pair of channels (`support::channel_pair`) of default settings, as
    // `(ctx, pd, a, b)`.
    ($name:expr, default channels) => {{
        let (ctx, pd) = setup!($name);
        let (a, b) = support::channel_pair(
            &ctx,
            &pd,
            &rverbs_core::verbs::QpConfig::default(),
            rverbs_core::channel::ChannelConfig::default(),
        );
        (ctx, pd, a, b)
    }};
}
