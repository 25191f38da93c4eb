//! One side of a test: the device, a connected channel, the registered buffer, the peer's
//! buffer and the TCP link, set up as perftest sets up its (one queue pair, one buffer the
//! peer may write, read and modify atomically).

use std::time::Duration;

use rverbs_core::channel::{Channel, ChannelConfig, RecvRing};
use rverbs_core::memory::PageMemory;
use rverbs_core::params::{Mtu, RnrRetry};
use rverbs_core::poll::Busy;
use rverbs_core::provider::verbs::{PreparedVerbs, VerbsProvider};
use rverbs_core::sge::RemoteMemory;
use rverbs_core::verbs::{AccessFlags, DeviceList, Pd, QpConfig, Route, SharedRegion};
use rverbs_std_shim::MONOTONIC;
use serde_json::{json, Value};

use crate::link::{Hello, Link, Settings};
use crate::{Args, Plan, Res};

/// Most receives a send test keeps posted (the channel's receive slot table).
pub(crate) const MAX_RX: usize = 512;

/// The channel type every test runs on: a device queue pair, waits that poll again at once
/// ([`Busy`]: no spin-wait hint between polls, as perftest's loops), room for [`MAX_RX`]
/// receives.
pub(crate) type Chan = Channel<VerbsProvider, Busy, MAX_RX>;
/// A send test's receive side ([`Session::take_ring`]).
pub(crate) type Ring = RecvRing<VerbsProvider, SharedRegion<'static>, Busy, MAX_RX>;

/// How long any wait of a test may take before it fails (a dead peer, a lost message).
pub(crate) const PATIENCE: Duration = Duration::from_secs(30);

/// Receiver-not-ready retries: without end, as perftest sets them (`rnr_retry = 7`). A send
/// test's client streams faster than the server reposts whenever the server is descheduled
/// for longer than its posted receives last plus the RNR budget; with the library's default
/// (6 retries of 0.64 ms, 3.84 ms) a loaded machine failed one run in about fifteen with
/// "receiver-not-ready retries exceeded" where perftest waits. The wait stays bounded: a
/// client that sees no completion for [`PATIENCE`] gives up (`bw::stream`).
pub(crate) const RNR_RETRY: RnrRetry = RnrRetry::Infinite;

/// One side of a connected test.
pub(crate) struct Session {
    pub(crate) plan: Plan,
    /// Whether this side is the server (listens, starts the write ping-pong).
    pub(crate) server: bool,
    // Field order is drop order: the channel (and its queue pair) goes before the memory
    // its requests named.
    pub(crate) chan: Option<Chan>,
    /// Our buffer: bytes `0..half` are what we send or read into (room for one post list of
    /// messages), the `size` bytes from `half` on what the peer writes, reads or modifies.
    pub(crate) mem: SharedRegion<'static>,
    /// The offset of the part the peer targets.
    pub(crate) half: usize,
    /// The peer's whole buffer.
    pub(crate) peer: RemoteMemory,
    pd: Pd,
    link: Link,
    device: String,
    route: Route,
    mtu: Mtu,
    /// How the queue pair posts (extended `ibv_wr_*`, or `ibv_post_send` and why).
    post_path: rverbs_core::verbs::PostPath,
}

impl std::fmt::Debug for Session {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Session")
            .field("plan", &self.plan)
            .field("server", &self.server)
            .field("device", &self.device)
            .finish()
    }
}

fn mtu_of(bytes: u32) -> Res<Mtu> {
    (1..=5)
        .filter_map(Mtu::from_code)
        .find(|m| m.bytes() == bytes)
        .ok_or_else(|| format!("-m {bytes}: the MTU must be 256, 512, 1024, 2048 or 4096").into())
}

impl Session {
    /// Opens the device, makes a queue pair and the buffer, exchanges both with the peer
    /// over TCP and connects.
    pub(crate) fn open(args: &Args, plan: &Plan) -> Res<Self> {
        let list = DeviceList::new()?;
        let dev = match &args.device {
            Some(name) => list
                .find(name)
                .ok_or_else(|| format!("no RDMA device called {name}"))?,
            None => list.iter().next().ok_or("no RDMA device")?,
        };
        let device = dev.name().to_owned();
        let ctx = dev.open()?;
        let pd = ctx.alloc_pd()?;
        let mtu = args.mtu.map(mtu_of).transpose()?;
        let mut cfg = QpConfig::default();
        cfg.port = args.ib_port;
        cfg.gid_index = args.gid_index;
        cfg.mtu = mtu;
        // Room for tx_depth outstanding requests next to the signaling interval and the
        // slot the channel keeps for a drain.
        cfg.max_send_wr = plan.tx_depth + plan.cq_mod + plan.post_list + 2;
        cfg.max_recv_wr = plan.rx_depth + 1;
        cfg.max_send_sge = 1;
        cfg.max_recv_sge = 1;
        cfg.max_inline_data = plan.inline;
        cfg.rnr_retry = RNR_RETRY;
        // A first PSN nobody can predict from the queue pair number (docs/security.md).
        cfg.send_psn = rverbs_std_shim::PSN_SOURCE;
        // Before the peer is contacted: a device without completion timestamps refuses here,
        // naming itself and what it lacks.
        let prepared = if plan.hw_timestamps {
            PreparedVerbs::with_timestamps(&ctx, &pd, &cfg)
                .map_err(|e| format!("--hw-timestamps: {e}"))?
        } else {
            PreparedVerbs::new(&ctx, &pd, &cfg)?
        };
        let route = prepared.route();

        // Our half holds a post list of messages (reads of one post land side by side).
        let half = plan.size.div_ceil(64) * 64 * plan.post_list as usize;
        let access = AccessFlags::LOCAL_WRITE
            | AccessFlags::REMOTE_WRITE
            | AccessFlags::REMOTE_READ
            | AccessFlags::REMOTE_ATOMIC;
        let mem = PageMemory::zeroed(half + plan.size.div_ceil(64) * 64)
            .ok_or("cannot allocate the buffer")?;
        let mem = pd.register_shared(mem, access)?;

        let server = args.server.is_none();
        let mut link = match &args.server {
            Some(host) => Link::connect(host, args.port, Duration::from_secs(10))?,
            None => Link::accept(args.port)?,
        };
        let mine = Hello {
            settings: Settings {
                test: plan.test as u8,
                mtu: mtu.map_or(0, Mtu::code),
                post_list: plan.post_list,
                size: plan.size as u64,
                iters: plan.iters,
                inline: plan.inline,
                cq_mod: plan.cq_mod,
                tx_depth: plan.tx_depth,
            },
            endpoint: prepared.endpoint(),
            memory: mem.remote(),
        };
        let theirs = link.exchange(&mine)?;
        let provider = prepared.handshake(&theirs.endpoint)?;
        let mtu = provider.path_mtu();
        let post_path = provider.qp().post_path();
        let mut ccfg = ChannelConfig::with_timeout(PATIENCE);
        ccfg.signal_every = plan.cq_mod;
        ccfg.rank = Some(u32::from(server));
        let chan: Chan = Channel::with_backoff(provider, ccfg, Busy, &MONOTONIC);
        if chan.caps().max_inline_data < plan.inline {
            return Err(format!(
                "the device grants {} inline bytes, -I asked for {}",
                chan.caps().max_inline_data,
                plan.inline
            )
            .into());
        }
        if plan.post_list as usize > chan.max_post() {
            return Err(format!(
                "-l {} exceeds one post ({})",
                plan.post_list,
                chan.max_post()
            )
            .into());
        }
        // Both queue pairs are connected before either side starts.
        link.sync()?;
        Ok(Self {
            plan: *plan,
            server,
            chan: Some(chan),
            mem,
            half,
            peer: theirs.memory,
            pd,
            link,
            device,
            route,
            mtu,
            post_path,
        })
    }

    /// Takes the channel (a send test builds a receive ring on it).
    pub(crate) fn take_chan(&mut self) -> Chan {
        self.chan.take().expect("the channel is taken once")
    }

    /// Takes the channel into a receive ring of `size`-byte slots: as many as the receive
    /// depth allows, and no more than one per iteration.
    pub(crate) fn take_ring(&mut self) -> Res<Ring> {
        let (size, iters) = (self.plan.size, self.plan.iters);
        let slots = (self.plan.rx_depth as usize).min(iters as usize);
        let mem = self.pd.register_shared(
            PageMemory::zeroed(slots * size).ok_or("cannot allocate the receive ring")?,
            AccessFlags::LOCAL_WRITE,
        )?;
        Ok(RecvRing::new(self.take_chan(), mem, size)?)
    }

    /// The `size` bytes of the peer's buffer this side targets.
    pub(crate) fn target(&self) -> Res<RemoteMemory> {
        self.peer
            .slice(self.half as u64, self.plan.size as u64)
            .ok_or_else(|| "the peer's buffer is smaller than the test".into())
    }

    /// Waits for the peer (before tearing down: the passive side must not leave while the
    /// active one still reads or writes its memory).
    pub(crate) fn sync(&mut self) -> Res<()> {
        self.link.sync()
    }

    /// Ends the test on both sides.
    pub(crate) fn finish(&mut self) -> Res<()> {
        if let Some(c) = self.chan.as_mut() {
            c.wait_all()?;
        }
        self.link.sync()
    }

    /// Whether inline sends apply to this test's messages.
    pub(crate) fn inline(&self) -> bool {
        self.plan.size <= self.plan.inline as usize
    }

    /// The lines perftest prints before its table.
    pub(crate) fn print_header(&self) {
        let p = &self.plan;
        let line = "---------------------------------------------------------------------------------------";
        println!("{line}");
        println!(
            "                    rverbs-perf {} ({})",
            p.test.name(),
            if self.server { "server" } else { "client" }
        );
        println!(" Device         : {}", self.device);
        println!(" Transport      : RC");
        println!(" Post path      : {}", self.post_path);
        println!(
            " GID index      : {} ({:?})",
            self.route.gid_index, self.route.gid
        );
        println!(" Path MTU       : {}[B]", self.mtu.bytes());
        println!(" TX depth       : {}", p.tx_depth);
        println!(" Post list      : {}", p.post_list);
        println!(" CQ moderation  : {}", p.cq_mod);
        println!(
            " Inline size    : {}[B]{}",
            p.inline,
            if self.inline() { " (used)" } else { "" }
        );
        if p.test.is_send() {
            println!(" RX depth       : {}", p.rx_depth);
        }
    }

    /// The JSON object `--json` prints: the settings and `results`.
    pub(crate) fn json(&self, results: Value) -> Value {
        let p = &self.plan;
        json!({
            "tool": "rverbs-perf",
            "test": p.test.name(),
            "side": if self.server { "server" } else { "client" },
            "device": self.device,
            "gid_index": self.route.gid_index,
            "mtu": self.mtu.bytes(),
            "size": p.size,
            "iterations": p.iters,
            "post_list": p.post_list,
            "cq_mod": p.cq_mod,
            "tx_depth": p.tx_depth,
            "inline_size": p.inline,
            "inline_used": self.inline(),
            "post_path": self.post_path.to_string(),
            "hw_timestamps": p.hw_timestamps,
            "results": results,
        })
    }
}
