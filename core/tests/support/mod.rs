//! Shared plumbing for tests that need a real RDMA device.
//!
//! The device comes from `RVERBS_TEST_DEVICE` (for example `rxe0` inside the SoftRoCE VM, or
//! `mlx5_0` on real hardware). Without it a test is skipped with a message, except under
//! `CI=true`, where a missing device fails the run: CI must never pass device tests that did
//! not run.
#![allow(dead_code, unreachable_pub, clippy::std_instead_of_core)]

use std::time::{Duration, Instant};

use rverbs_core::completion::Completion;
use rverbs_core::poll::Clock;
use rverbs_core::verbs::{open_device, Context, Cq};

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

/// Opens the test device; a named device that cannot be opened fails the test.
pub fn open(test: &str) -> Option<Context> {
    let name = test_device(test)?;
    match open_device(&name) {
        Ok(ctx) => Some(ctx),
        Err(e) => panic!("{test}: cannot open RVERBS_TEST_DEVICE={name}: {e}"),
    }
}

/// Polls `cq` until `n` completions arrived or `timeout` passed; returns them.
pub fn poll_n(cq: &mut Cq, n: usize, timeout: Duration) -> Vec<Completion> {
    let deadline = Instant::now() + timeout;
    let mut out = Vec::with_capacity(n);
    let mut buf = [Completion::EMPTY; 16];
    while out.len() < n {
        let got = cq.poll(&mut buf).expect("ibv_poll_cq failed");
        out.extend_from_slice(&buf[..got]);
        if got == 0 {
            assert!(
                Instant::now() < deadline,
                "timed out after {timeout:?} with {} of {n} completions: {out:?}",
                out.len()
            );
            std::thread::yield_now();
        }
    }
    out
}

use rverbs_core::channel::{Channel, ChannelConfig};
use rverbs_core::provider::verbs::{PreparedVerbs, VerbsProvider};
use rverbs_core::verbs::{Pd, QpConfig};
use rverbs_core::wire::Endpoint;

/// Two channels on the test device connected to each other (a loopback pair), with the
/// endpoints passed through their wire encoding as they would be between hosts.
pub fn channel_pair(
    ctx: &Context,
    pd: &Pd,
    qp: &QpConfig,
    cfg: ChannelConfig,
) -> (Channel<VerbsProvider>, Channel<VerbsProvider>) {
    let a = PreparedVerbs::new(ctx, pd, qp).expect("create QP a");
    let b = PreparedVerbs::new(ctx, pd, qp).expect("create QP b");
    let ea = Endpoint::decode(&a.endpoint().encode()).unwrap();
    let eb = Endpoint::decode(&b.endpoint().encode()).unwrap();
    let a = a.handshake(&eb).expect("connect a");
    let b = b.handshake(&ea).expect("connect b");
    (Channel::new(a, cfg, &WALL), Channel::new(b, cfg, &WALL))
}

/// A deterministic byte pattern.
pub fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed))
        .collect()
}
