//! Helpers on the verbs layer (feature `verbs`): opening the test device, polling a CQ,
//! connecting a loopback pair of channels.

use std::time::{Duration, Instant};

use rverbs_core::channel::{Channel, ChannelConfig};
use rverbs_core::completion::Completion;
use rverbs_core::provider::verbs::{PreparedVerbs, VerbsProvider};
use rverbs_core::verbs::{open_device, Context, Cq, Pd, QpConfig};
use rverbs_core::wire::Endpoint;

use super::{test_device, WALL};

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
