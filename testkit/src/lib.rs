//! What rverbs' own tests share, so that each test file holds only its test: a counting
//! global allocator ([`Counting`]), clocks ([`WALL`], [`clock!`]), queue sizes ([`caps`]),
//! software-model worlds ([`fabric`], [`net`], [`nodes`], [`barrier_answers`]), the test
//! device ([`device`]) and a child-process harness ([`child_command`], [`Peer`],
//! [`run_children`]), and for async tests, futures polled by hand ([`block_on`]) and regions
//! that say when they are dropped ([`OnDrop`]).
//!
//! A dev-dependency of the workspace's crates, never published. Integration tests link the
//! same `rverbs-core` as the kit, so its types are theirs; a crate's unit tests (inside
//! `src/`) see two copies of that crate and must not use the kit.
//!
//! # Device tests
//!
//! The device comes from `RVERBS_TEST_DEVICE` (`rxe0` inside the SoftRoCE VM, `mlx5_0` on real
//! hardware). Without it a device test is skipped with a message, except under `CI=true`,
//! where a missing device fails the test: CI must never pass device tests that did not run.
// Test code: std throughout, and every helper is someone's, not every test's.
#![allow(clippy::std_instead_of_core, clippy::std_instead_of_alloc)]

mod child;
mod clock;
mod counting;
mod device;
mod future;
mod link;
mod region;
mod soft;

pub use child::{
    child_command, hex, rank_env, required_env, run_children, say, scratch_dir, spawn_rank, unhex,
    world_env, Peer, RankEnv,
};
pub use clock::{PanicAfter, Wall, WALL};
pub use counting::{allocs, allocs_all, counted, Counting};
pub use device::{device, test_device};
pub use future::{block_on, poll_once};
pub use link::{ip_link, netdev_of, port_state, set_link, wait_for};
pub use region::{bytes, OnDrop};
pub use soft::{
    assert_barrier_fails_with, assert_built_without_messaging, assert_messages_flow_in_order,
    barrier_answers, caps, fabric, net, nodes, Build, CAPS, WINDOW,
};

use rverbs_core::sge::RemoteMemory;
use rverbs_core::wr::{Opcode, SendFlags, WorkRequest};

/// The kit's own `rverbs-core`, for its macros.
#[doc(hidden)]
pub use rverbs_core as __core;

/// A deterministic byte pattern of `len` bytes, different for each `seed`.
pub fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed))
        .collect()
}

/// A signaled work request `wr_id` of `opcode` with no local entries, naming 8 bytes of a
/// remote region (address 0x1000, rkey 7): enough for the instant device, which touches no
/// memory.
pub fn signaled(wr_id: u64, opcode: Opcode) -> WorkRequest<'static> {
    let mut w = WorkRequest::new(
        opcode,
        SendFlags::SIGNALED,
        &[],
        RemoteMemory {
            addr: 0x1000,
            len: 8,
            rkey: 7,
        },
    );
    w.wr_id = wr_id;
    w
}
