//! `cluster`: the rverbs demo and smoke test of a whole node set.
//!
//! Without `--config`, it starts `--ranks` copies of itself on this machine (all on
//! `--device`), each a rank of one world, and prints their combined summary. With
//! `--config FILE` it is one rank of a real cluster; its rank comes from `--rank`,
//! `RVERBS_RANK`, Slurm, Open MPI or PMI, so it runs under `srun`/`mpirun` unchanged.
//! Started by a PMIx launcher without `--config` (`mpirun -n 4 cluster`, `srun --mpi=pmix
//! -n 4 cluster`), it is one rank of the launcher's job and needs no file at all: the
//! device is `--device`, `RVERBS_DEVICE`, or the first with an active port.
//!
//! Every rank connects through `rverbs_bootstrap::connect`, then:
//! 1. ping-pong in pairs (0-1, 2-3, ...): 8-byte inline RDMA writes, each side spinning on
//!    its window, as `ib_write_lat` does; reports RTT/2 percentiles;
//! 2. scatter (rank 0 writes a distinct 4 KiB chunk into every peer), gather (rank 0 reads
//!    one back from every peer) and multicast (rank 0 sends one message to all): every
//!    byte checked;
//! 3. barriers: `--barriers` of each algorithm over all ranks, plus sub-group barriers
//!    over the even ranks; reports per-barrier latency percentiles;
//! 4. with `--rejoin` (local ranks only): every rank runs barriers in a loop, the launcher
//!    kills rank 2 with SIGKILL and starts it again with the same config
//!    (`rverbs_bootstrap::rejoin`), the survivors readmit it (`Connected::readmit`), and
//!    every rank runs `--barriers` of each algorithm again; reports how long it took.
#![allow(clippy::std_instead_of_core)] // a std program

use rverbs_core::node::{Components, Members};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitCode};
use std::time::{Duration, Instant};

use clap::Parser;
use hdrhistogram::Histogram;
use rverbs_bootstrap::pmix::{LauncherEnv, LauncherKind};
use rverbs_bootstrap::{
    connect_launch, rejoin, ClusterConfig, ConnectOptions, Connected, Launch, OutOfBand, RankConfig,
};
use rverbs_core::barrier::BarrierAlgorithm;
use rverbs_core::sge::Sge;
use rverbs_core::verbs::AccessFlags;
use rverbs_std_shim::counters::{PortCounters, SYSFS_INFINIBAND};
use rverbs_std_shim::{StdBackoff, WaitPolicy};
use serde::{Deserialize, Serialize};

#[derive(Parser, Debug, Clone)]
#[command(about = "rverbs demo: N ranks doing ping-pong, scatter/gather, multicast and barriers")]
struct Args {
    /// Cluster configuration (JSON). Without it, start --ranks local ranks.
    #[arg(long)]
    config: Option<PathBuf>,
    /// This process's rank (default: RVERBS_RANK, SLURM_PROCID, OMPI_COMM_WORLD_RANK, PMI_RANK).
    #[arg(long)]
    rank: Option<u32>,
    /// Local ranks to start when no --config is given.
    #[arg(long, default_value_t = 4)]
    ranks: u32,
    /// RDMA device: for local ranks (default rxe0), or under a PMIx launcher (default
    /// RVERBS_DEVICE, else the first device with an active port). A --config names its own.
    #[arg(long)]
    device: Option<String>,
    /// First TCP port for local ranks' bootstrap.
    #[arg(long, default_value_t = 18515)]
    port: u16,
    /// Ping-pong round trips per pair.
    #[arg(long, default_value_t = 2000)]
    pingpong_iters: u32,
    /// Barriers per algorithm.
    #[arg(long, default_value_t = 1000)]
    barriers: u32,
    /// Empty polls spent spinning before yielding or sleeping.
    #[arg(long, default_value_t = 64)]
    spins: u32,
    /// What a waiting rank does after --spins empty polls: spin (dedicated cores), busy
    /// (spin without the CPU's spin-wait hint: a core of its own, no busy sibling), yield,
    /// sleep (ranks outnumber cores, as in the test VM), or block (sleep on completion events
    /// until the NIC wakes the rank; best where ranks outnumber cores). The defaults of
    /// --wait, --spins and --sleep-us are the library's default, WaitPolicy::default().
    #[arg(long, value_enum, default_value_t = Wait::Sleep)]
    wait: Wait,
    /// Sleep length in microseconds for --wait sleep.
    #[arg(long, default_value_t = 20)]
    sleep_us: u64,
    /// Under a PMIx launcher: do not pin each rank to a CPU near its device (by local rank).
    #[arg(long)]
    no_pin: bool,
    /// Give up after this many seconds (bootstrap, any wait).
    #[arg(long, default_value_t = 120)]
    timeout_secs: u64,
    /// How long a rank that gives up waits for its peers to acknowledge its goodbye (the
    /// library's ExchangeOptions::goodbye_linger; 0: leave at once, the kernel delivering the
    /// goodbye on its own backed-off retries). Default: the library's.
    #[arg(long)]
    goodbye_linger_ms: Option<u64>,
    /// Local ranks only: after the checks, kill rank 2 mid-barrier, start it again with the
    /// same config and have the survivors readmit it; then barriers over all ranks again.
    #[arg(long)]
    rejoin: bool,
    /// (Set by the launcher of local ranks.) Where ranks and launcher meet for --rejoin.
    #[arg(long, hide = true)]
    rejoin_dir: Option<PathBuf>,
    /// (Set by the launcher of local ranks.) This process is rank 2 started again.
    #[arg(long, hide = true)]
    rejoined: bool,
}

/// The rank `--rejoin` kills and starts again.
const VICTIM: u32 = 2;
/// Barriers every rank runs in the --rejoin loop before the launcher kills the victim.
const REJOIN_WARM: u32 = 50;

#[derive(clap::ValueEnum, Debug, Clone, Copy, PartialEq, Eq)]
enum Wait {
    Spin,
    Busy,
    Yield,
    Sleep,
    Block,
}

impl Args {
    /// --wait, --spins and --sleep-us as the one value the library takes.
    fn wait_policy(&self) -> WaitPolicy {
        match self.wait {
            Wait::Spin => WaitPolicy::Spin,
            Wait::Busy => WaitPolicy::Busy,
            Wait::Yield => WaitPolicy::Yield { spins: self.spins },
            Wait::Sleep => WaitPolicy::Sleep {
                spins: self.spins,
                pause: Duration::from_micros(self.sleep_us),
            },
            Wait::Block => WaitPolicy::Block { spins: self.spins },
        }
    }
}

#[derive(Serialize, Deserialize, Debug, Clone, Copy)]
struct Pct {
    p50_ns: u64,
    p99_ns: u64,
    p999_ns: u64,
    max_ns: u64,
    count: u64,
}

impl Pct {
    fn of(h: &Histogram<u64>) -> Self {
        Self {
            p50_ns: h.value_at_quantile(0.50),
            p99_ns: h.value_at_quantile(0.99),
            p999_ns: h.value_at_quantile(0.999),
            max_ns: h.max(),
            count: h.len(),
        }
    }
}

#[derive(Serialize, Deserialize, Debug)]
struct Report {
    rank: u32,
    connect_ms: u64,
    pingpong: Option<(u32, Pct)>,
    barriers: Vec<(String, Pct)>,
    group_barriers: Option<Pct>,
    checks: Vec<(String, bool)>,
    /// With --rejoin: milliseconds from the failed barrier to the end of the readmission (a
    /// survivor), or from the start to the end of `rejoin` (the new process).
    rejoin_ms: Option<u64>,
    /// What this rank did with each peer (`Node::peer_counters`).
    peers: Vec<PeerLine>,
    /// The device port's counters that grew during the demo (name, growth), if readable.
    device_counters: Vec<(String, u64)>,
}

/// One peer's counters, as a rank saw them at the end of the demo.
#[derive(Serialize, Deserialize, Debug)]
struct PeerLine {
    rank: u32,
    requests_posted: u64,
    requests_completed: u64,
    messages_sent: u64,
    messages_received: u64,
    credits_refused: u64,
    barrier_timeouts: u32,
    failed: Option<String>,
}

/// Every peer's counters of `node` (a snapshot, at the end of the demo).
fn peer_lines(node: &rverbs_core::node::VerbsNode<StdBackoff>) -> Vec<PeerLine> {
    (0..node.world_size())
        .filter_map(|r| node.peer_counters(r))
        .map(|c| PeerLine {
            rank: c.rank,
            requests_posted: c.channel.requests_posted,
            requests_completed: c.channel.requests_completed,
            messages_sent: c.messages_sent,
            messages_received: c.messages_received,
            credits_refused: c.credits_refused,
            barrier_timeouts: c.barrier_timeouts,
            failed: c.failed.map(|f| f.to_string()),
        })
        .collect()
}

fn hist() -> Histogram<u64> {
    Histogram::new_with_bounds(1, 60_000_000_000, 3).expect("valid histogram bounds")
}

fn us(ns: u64) -> String {
    format!("{:.1} us", ns as f64 / 1000.0)
}

/// Writes one line to stderr in a single write, so lines of ranks sharing the terminal never
/// interleave mid-line (`eprintln!` may write a line in pieces).
macro_rules! say {
    ($($arg:tt)*) => {{
        let mut line = format!($($arg)*);
        line.push('\n');
        let _ = std::io::Write::write_all(&mut std::io::stderr().lock(), line.as_bytes());
    }};
}

fn main() -> ExitCode {
    let args = Args::parse();
    let result = match &args.config {
        // Started by mpirun or srun: one rank of the launcher's job (PMIx), or a clear error.
        None if LauncherEnv::detect().kind != LauncherKind::None => run_launched(&args),
        None => launch_local(&args),
        Some(path) => run_config(&args, path.clone()),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            say!("cluster: error: {e}");
            ExitCode::FAILURE
        }
    }
}

use rverbs_examples::Res;

/// Writes a config for `--ranks` local ranks and runs one child process per rank.
fn launch_local(args: &Args) -> Res<()> {
    if args.ranks == 0 {
        return Err("--ranks must be at least 1".into());
    }
    if args.rejoin && args.ranks <= VICTIM {
        return Err(format!(
            "--rejoin kills rank {VICTIM}: it needs at least {} ranks",
            VICTIM + 1
        )
        .into());
    }
    if args.rejoin && args.wait == Wait::Block {
        return Err(
            "--rejoin cannot run with --wait block: the barrier wake-ups it turns on keep \
             receives posted on every connection, which are not rebuilt for a restarted rank"
                .into(),
        );
    }
    let rejoin_dir =
        std::env::temp_dir().join(format!("rverbs-cluster-rejoin-{}", std::process::id()));
    if args.rejoin {
        let _ = std::fs::remove_dir_all(&rejoin_dir);
        std::fs::create_dir_all(&rejoin_dir)?;
    }
    let device = args.device.clone().unwrap_or_else(|| "rxe0".to_owned());
    let ranks = (0..args.ranks)
        .map(|r| RankConfig {
            rank: r,
            host: "127.0.0.1".into(),
            port: args.port + r as u16,
            device: device.clone(),
            ib_port: 1,
            gid_index: None,
            comment: None,
        })
        .collect();
    let config = ClusterConfig::new(
        "local",
        Some(format!("local-{}", std::process::id())),
        ranks,
    )?;
    let path = std::env::temp_dir().join(format!("rverbs-cluster-{}.json", std::process::id()));
    std::fs::write(&path, config.to_json_string())?;
    say!(
        "cluster: starting {} ranks on {} (config {})",
        args.ranks,
        device,
        path.display()
    );
    let exe = std::env::current_exe()?;
    let spawn = |r: u32, rejoined: bool| -> std::io::Result<Child> {
        let mut cmd = Command::new(&exe);
        if args.rejoin {
            cmd.arg("--rejoin-dir").arg(&rejoin_dir);
        }
        if rejoined {
            cmd.arg("--rejoined");
        }
        cmd.arg("--config")
            .arg(&path)
            .arg("--rank")
            .arg(r.to_string())
            .arg("--pingpong-iters")
            .arg(args.pingpong_iters.to_string())
            .arg("--barriers")
            .arg(args.barriers.to_string())
            .arg("--spins")
            .arg(args.spins.to_string())
            .arg("--wait")
            .arg(format!("{:?}", args.wait).to_lowercase())
            .arg("--sleep-us")
            .arg(args.sleep_us.to_string())
            .arg("--timeout-secs")
            .arg(args.timeout_secs.to_string())
            .spawn()
    };
    let mut children: Vec<(u32, Child)> = Vec::new();
    for r in 0..args.ranks {
        children.push((r, spawn(r, false)?));
    }
    if args.rejoin {
        // Every rank is in its barrier loop: kill the victim, start it again.
        let limit = Instant::now() + Duration::from_secs(args.timeout_secs);
        let warm = |r: u32| rejoin_dir.join(format!("warm.{r}")).exists();
        while !(0..args.ranks).all(warm) {
            let early = children.iter_mut().find_map(|(r, c)| match c.try_wait() {
                Ok(Some(st)) => Some(format!("rank {r} exited with {st} before the kill")),
                _ => None,
            });
            let late = || {
                (Instant::now() > limit)
                    .then(|| "the ranks did not reach the --rejoin loop in time".to_owned())
            };
            if let Some(why) = early.or_else(late) {
                for (_, c) in &mut children {
                    let _ = c.kill();
                    let _ = c.wait();
                }
                return Err(why.into());
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        let victim = &mut children[VICTIM as usize].1;
        victim.kill()?;
        victim.wait()?;
        say!("cluster: killed rank {VICTIM} (SIGKILL) mid-barrier; starting it again with the same config");
        children[VICTIM as usize].1 = spawn(VICTIM, true)?;
    }
    let deadline = Instant::now() + Duration::from_secs(args.timeout_secs + 30);
    let mut failed = Vec::new();
    let mut running = children;
    while !running.is_empty() {
        let mut still = Vec::new();
        for (r, mut c) in running {
            match c.try_wait()? {
                Some(st) if st.success() => {}
                Some(st) => failed.push(format!("rank {r} exited with {st}")),
                None if Instant::now() > deadline => {
                    let _ = c.kill();
                    let _ = c.wait();
                    failed.push(format!(
                        "rank {r} killed after {} s",
                        args.timeout_secs + 30
                    ));
                }
                None => still.push((r, c)),
            }
        }
        running = still;
        std::thread::sleep(Duration::from_millis(20));
    }
    let _ = std::fs::remove_file(&path);
    if args.rejoin {
        let _ = std::fs::remove_dir_all(&rejoin_dir);
    }
    if failed.is_empty() {
        Ok(())
    } else {
        Err(failed.join("; ").into())
    }
}

/// One rank of a cluster file.
fn run_config(args: &Args, path: PathBuf) -> Res<()> {
    let config = ClusterConfig::from_file(&path)?;
    let launch = Launch::detect(Some(&config), args.rank)?;
    run_rank(args, &launch, ConnectOptions::for_config(&config))
}

/// One rank of a job started by a PMIx launcher, with no file.
fn run_launched(args: &Args) -> Res<()> {
    let mut launch = Launch::detect(None, args.rank)?;
    if let Launch::Pmix(host) = &mut launch {
        if let Some(device) = &args.device {
            host.device = Some(device.clone());
        }
        host.pin = !args.no_pin;
    }
    run_rank(args, &launch, ConnectOptions::default())
}

/// Prints one asynchronous event of the rank's device, and the failure news it became.
fn print_device_event(rank: u32, e: &rverbs_bootstrap::device_watch::SeenEvent) {
    match e.failure {
        Some(f) => say!(
            "[rank {rank}] device event: {} -> failure news: {f}",
            e.event
        ),
        None => say!("[rank {rank}] device event: {}", e.event),
    }
}

fn run_rank(args: &Args, launch: &Launch<'_>, mut opts: ConnectOptions) -> Res<()> {
    let timeout = Duration::from_secs(args.timeout_secs);
    opts.wait = args.wait_policy();
    opts.exchange.timeout = timeout;
    if let Some(ms) = args.goodbye_linger_ms {
        opts.exchange.goodbye_linger = Duration::from_millis(ms);
    }
    opts.first_barrier_timeout = timeout;
    // The demo sends no node messages. A blocking rank sleeps until its peers' barrier
    // notifications wake it: they must raise completions (barrier wake-ups). A world that
    // readmits a rank is built for it; both at once is refused when the node is built.
    opts.node.components = Components::one_sided();
    opts.node.components.barrier_wakeups = args.wait == Wait::Block;
    opts.node.components.readmission = args.rejoin_dir.is_some() || args.rejoined;
    // Port down, port back, a queue pair in the error state: printed as the device says so.
    opts.on_device_event = Some(print_device_event);
    let t0 = Instant::now();
    if args.rejoined {
        return run_rejoined(args, launch, &opts, t0);
    }
    let mut c = connect_launch(launch, &opts)?;
    let connect_ms = t0.elapsed().as_millis() as u64;
    match demo(args, &mut c, connect_ms, timeout) {
        Ok(report) => finish(args, c, &report),
        Err(e) => {
            // Not a normal exit: the peers are told so, and why, at once (their next wait
            // fails naming this rank), instead of waiting out their timeouts.
            let e = with_departures(&c, e);
            // Said now: leaving waits (bounded) until the peers acknowledged the goodbye,
            // which takes until the link is back when this rank's own link went down.
            say!("[rank {}] leaving on error: {e}", c.node.rank());
            let _ = c.leave_on_error(&e.to_string());
            Err(e)
        }
    }
}

/// `e`, followed by what the ranks that gave up said (their goodbyes' reasons), if any did,
/// and by this rank's own port being down, if it is.
fn with_departures(c: &Connected, e: Box<dyn std::error::Error>) -> Box<dyn std::error::Error> {
    let mut said: Vec<String> = (0..c.node.world_size())
        .filter_map(|r| {
            c.departure(r)
                .map(|why| format!("rank {r} left saying: {why}"))
        })
        .collect();
    said.extend(c.port_note());
    if said.is_empty() {
        e
    } else {
        format!("{e} ({})", said.join("; ")).into()
    }
}

/// The demo's steps on a connected rank: its report, or the first error.
fn demo(args: &Args, c: &mut Connected, connect_ms: u64, timeout: Duration) -> Res<Report> {
    // The watch (in `c`) stays alive until the end: a rank that dies is named by every
    // survivor.
    let port = c.port();
    let (node, session) = (&mut c.node, &mut c.session);
    let (rank, world) = (session.rank(), session.world_size());
    let how = match &session {
        OutOfBand::Tcp(_) => "TCP rendezvous".to_owned(),
        #[cfg(feature = "pmix")]
        OutOfBand::Pmix(p) => format!(
            "PMIx, local rank {} of {}, CPUs {}",
            p.local_rank(),
            p.local_size(),
            rverbs_std_shim::current_thread_affinity()
                .map_or_else(|e| e.to_string(), |set| format!("{set}"))
        ),
        _ => "another rendezvous".to_owned(),
    };
    say!(
        "[rank {rank}] connected to {} peers on {} in {connect_ms} ms ({how})",
        world - 1,
        node.pd().context().name()
    );
    let device_at_start = PortCounters::read(
        Path::new(SYSFS_INFINIBAND),
        node.pd().context().name(),
        port,
    )
    .ok();
    let mut checks = Vec::new();

    // 1. Ping-pong in pairs.
    let pingpong = {
        let peer = rank ^ 1;
        let r = if peer < world {
            let window = node
                .peer_window(peer)
                .and_then(|w| w.slice(0, 8))
                .ok_or("no peer window")?;
            let iters = args.pingpong_iters;
            let warmup = iters / 10;
            let mut h = hist();
            for i in 1..=(iters + warmup) as u64 {
                let t = Instant::now();
                if rank % 2 == 0 {
                    // Not waited for: the next signaled write retires it.
                    let _ = node
                        .multi()
                        .post_write_inline(peer, &i.to_le_bytes(), window)?;
                    spin_for(node, peer, i, timeout)?;
                } else {
                    spin_for(node, peer, i, timeout)?;
                    let _ = node
                        .multi()
                        .post_write_inline(peer, &i.to_le_bytes(), window)?;
                }
                if rank % 2 == 0 && i > u64::from(warmup) {
                    h.record((t.elapsed().as_nanos() as u64 / 2).max(1))?;
                }
            }
            node.channel(peer)?.wait_all()?;
            (rank % 2 == 0).then(|| (peer, Pct::of(&h)))
        } else {
            None
        };
        node.barrier_timeout(Members::World, timeout)?;
        r
    };

    // 2. Scatter, gather, multicast.
    const CHUNK: usize = 4096;
    let pat = |r: u32, salt: u8| -> Vec<u8> {
        (0..CHUNK)
            .map(|i| {
                (i as u8)
                    .wrapping_mul(13)
                    .wrapping_add(r as u8)
                    .wrapping_add(salt)
            })
            .collect()
    };
    {
        let mut src = vec![0u8; CHUNK * world as usize];
        let mut back = vec![0u8; CHUNK * world as usize];
        let mut msg_buf = vec![0u8; 64];
        for r in 0..world {
            src[r as usize * CHUNK..(r as usize + 1) * CHUNK].copy_from_slice(&pat(r, 1));
        }
        let pd = node.pd().clone();
        let src_mr = pd.register(&mut src, AccessFlags::LOCAL_WRITE)?;
        let mut back_mr = pd.register(&mut back, AccessFlags::LOCAL_WRITE)?;
        let mut msg_mr = pd.register(&mut msg_buf, AccessFlags::LOCAL_WRITE)?;
        // Each rank puts its own gather chunk into its window.
        node.window().write_from(2 * CHUNK, &pat(rank, 2));
        let msg = b"multicast from rank 0: hello, all ranks";
        // Receivers post their multicast receive before the barrier that releases rank 0.
        let mut recv_sge = [msg_mr.sge_mut(0..64).ok_or("range")?];
        // With barrier wake-ups the node's receive queues hold buffer-less receives for the
        // notifications: a send would land on one, so the two-sided part is skipped.
        let two_sided = !node.barrier_wakeups();
        let pending = if rank != 0 && two_sided {
            // SAFETY: msg_mr's bytes are not touched until the wait below returns.
            Some(unsafe { node.channel(0)?.post_recv(&mut recv_sge) }?)
        } else {
            None
        };
        node.barrier_timeout(Members::World, timeout)?;
        if rank == 0 {
            let sges: Vec<[Sge<'_>; 1]> = (0..world)
                .map(|r| {
                    [src_mr
                        .sge(r as usize * CHUNK..(r as usize + 1) * CHUNK)
                        .expect("in range")]
                })
                .collect();
            let targets: Vec<_> = (1..world)
                .map(|r| {
                    node.peer_window(r)
                        .and_then(|w| w.slice(CHUNK as u64, CHUNK as u64))
                        .expect("window")
                })
                .collect();
            node.multi().scatter_write(
                (1..world).map(|r| (r, &sges[r as usize][..], targets[r as usize - 1])),
            )?;
            let mut outs: Vec<[rverbs_core::sge::SgeMut<'_>; 1]> =
                back_mr.chunks_mut(CHUNK).map(|s| [s]).collect();
            let sources: Vec<_> = (0..world)
                .map(|r| {
                    node.peer_window(r)
                        .and_then(|w| w.slice(2 * CHUNK as u64, CHUNK as u64))
                })
                .collect();
            node.multi().gather_read(
                outs.iter_mut()
                    .enumerate()
                    .skip(1)
                    .map(|(r, s)| (r as u32, &mut s[..], sources[r].expect("window"))),
            )?;
            let mut ok = true;
            for r in 1..world as usize {
                ok &= back_mr.as_slice()[r * CHUNK..(r + 1) * CHUNK] == pat(r as u32, 2)[..];
            }
            checks.push(("gather_read bytes from every peer".to_owned(), ok));
            if two_sided {
                multicast(node, &pd, msg, world)?;
            }
        }
        node.barrier_timeout(Members::World, timeout)?;
        if let Some(t) = pending {
            let info = node.wait(t)?;
            let ok = info.byte_len as usize == msg.len() && &msg_mr.as_slice()[..msg.len()] == msg;
            checks.push(("multicast message received intact".to_owned(), ok));
            let mut got = vec![0u8; CHUNK];
            node.window().read_into(CHUNK, &mut got);
            checks.push((
                "scatter_write chunk landed intact".to_owned(),
                got == pat(rank, 1),
            ));
        }
        node.barrier_timeout(Members::World, timeout)?;
    }

    // 3. Barriers. A blocking rank sleeps until its peers' notifications wake it (barrier
    // wake-ups, chosen when the node was built; live from the first barrier over the world).
    let mut barriers = Vec::new();
    for alg in BarrierAlgorithm::ALL {
        node.set_algorithm(alg);
        node.barrier_timeout(Members::World, timeout)?;
        let mut h = hist();
        for _ in 0..args.barriers {
            let t = Instant::now();
            node.barrier_timeout(Members::World, timeout)?;
            h.record((t.elapsed().as_nanos() as u64).max(1))?;
        }
        barriers.push((alg.name().to_owned(), Pct::of(&h)));
    }
    let evens: Vec<u32> = (0..world).step_by(2).collect();
    let group_barriers = if rank % 2 == 0 && evens.len() > 1 {
        let mut h = hist();
        node.set_algorithm(BarrierAlgorithm::Dissemination);
        for _ in 0..args.barriers.min(200) {
            let t = Instant::now();
            node.barrier_timeout(&evens, timeout)?;
            h.record((t.elapsed().as_nanos() as u64).max(1))?;
        }
        Some(Pct::of(&h))
    } else {
        None
    };
    node.set_algorithm(BarrierAlgorithm::Dissemination);
    node.barrier_timeout(Members::World, timeout)?;

    // 4. A rank that rejoins.
    let rejoin_ms = match &args.rejoin_dir {
        Some(dir) => Some(survive_a_rejoin(
            c,
            dir,
            args.barriers,
            timeout,
            &mut checks,
        )?),
        None => None,
    };
    let device_counters = device_at_start
        .and_then(|start| {
            let now = PortCounters::read(
                Path::new(SYSFS_INFINIBAND),
                c.node.pd().context().name(),
                port,
            )
            .ok()?;
            Some(now.since(&start))
        })
        .unwrap_or_default();
    let report = Report {
        rank,
        connect_ms,
        pingpong,
        barriers,
        group_barriers,
        checks,
        rejoin_ms,
        peers: peer_lines(&c.node),
        device_counters,
    };
    Ok(report)
}

/// Every rank loops over barriers until the launcher kills [`VICTIM`]; each survivor checks
/// that its barrier names it, readmits it, and runs `barriers` of each algorithm with the new
/// process. Returns how long the readmission took, from the failed barrier.
fn survive_a_rejoin(
    c: &mut Connected,
    dir: &std::path::Path,
    barriers: u32,
    timeout: Duration,
    checks: &mut Vec<(String, bool)>,
) -> Res<u64> {
    let rank = c.node.rank();
    c.session.allgather(b"rejoin loop")?;
    let mut done = 0u32;
    let error = loop {
        // Every rank runs barrier `done` of the loop with the same algorithm.
        c.node
            .set_algorithm(BarrierAlgorithm::ALL[done as usize % 3]);
        if let Err(e) = c.node.barrier_timeout(Members::World, timeout) {
            break e;
        }
        done += 1;
        if done == REJOIN_WARM {
            std::fs::write(dir.join(format!("warm.{rank}")), b"")?;
        }
        if done > REJOIN_WARM {
            // So that the kill lands in a barrier.
            std::thread::sleep(Duration::from_micros(200));
        }
    };
    let t = Instant::now();
    say!("[rank {rank}] {error}; readmitting rank {VICTIM}");
    checks.push((
        format!("the failed barrier names rank {VICTIM}"),
        error.to_string().contains(&format!("rank {VICTIM} failed")),
    ));
    c.readmit(VICTIM, timeout)?;
    let ms = t.elapsed().as_millis() as u64;
    say!("[rank {rank}] readmitted rank {VICTIM} in {ms} ms");
    checks.push((
        format!("barriers over all ranks after rank {VICTIM} rejoined"),
        barriers_again(c, barriers, timeout)?,
    ));
    Ok(ms)
}

/// `barriers` of each algorithm over all ranks; whether every one completed.
fn barriers_again(c: &mut Connected, barriers: u32, timeout: Duration) -> Res<bool> {
    for alg in BarrierAlgorithm::ALL {
        c.node.set_algorithm(alg);
        for _ in 0..barriers {
            c.node.barrier_timeout(Members::World, timeout)?;
        }
    }
    c.node.set_algorithm(BarrierAlgorithm::Dissemination);
    Ok(true)
}

/// The new process of [`VICTIM`]: rejoins, runs the barriers the survivors run after the
/// readmission, and sends its report.
fn run_rejoined(args: &Args, launch: &Launch<'_>, opts: &ConnectOptions, t0: Instant) -> Res<()> {
    let Launch::Config { config, rank } = launch else {
        return Err("--rejoined needs a cluster config".into());
    };
    let timeout = Duration::from_secs(args.timeout_secs);
    let mut c = rejoin(config, *rank, opts)?;
    let ms = t0.elapsed().as_millis() as u64;
    say!("[rank {rank}] started again and rejoined in {ms} ms");
    let ok = barriers_again(&mut c, args.barriers, timeout)?;
    let report = Report {
        rank: *rank,
        connect_ms: ms,
        pingpong: None,
        barriers: Vec::new(),
        group_barriers: None,
        checks: vec![("barriers over all ranks after rejoining".to_owned(), ok)],
        rejoin_ms: Some(ms),
        peers: peer_lines(&c.node),
        device_counters: Vec::new(),
    };
    finish(args, c, &report)
}

/// Gathers every rank's report, closes the session, and prints the summary on rank 0.
fn finish(args: &Args, c: Connected, report: &Report) -> Res<()> {
    let rank = report.rank;
    let (mut session, node) = (c.session, c.node);
    let all = session.allgather(serde_json::to_string(report)?.as_bytes())?;
    let reports: Vec<Report> = all
        .iter()
        .map(|b| serde_json::from_slice(b))
        .collect::<Result<_, _>>()?;
    session.close()?;
    let failed: Vec<String> = reports
        .iter()
        .flat_map(|r| {
            r.checks
                .iter()
                .filter(|(_, ok)| !ok)
                .map(move |(n, _)| format!("rank {}: {n}", r.rank))
        })
        .collect();
    if rank == 0 {
        print_summary(args, node.pd().context().name(), &reports);
    }
    if failed.is_empty() {
        Ok(())
    } else {
        Err(format!("checks failed: {}", failed.join(", ")).into())
    }
}

/// Rank 0's multicast: register the message and send it to every peer with one call.
fn multicast(
    node: &mut rverbs_core::node::VerbsNode<StdBackoff>,
    pd: &rverbs_core::verbs::Pd,
    msg: &[u8],
    world: u32,
) -> Res<()> {
    let mut buf = msg.to_vec();
    let mr = pd.register(&mut buf, AccessFlags::LOCAL_WRITE)?;
    let sge = [mr.sge(0..msg.len()).ok_or("range")?];
    node.multi().send_to_each(1..world, &sge)?;
    Ok(())
}

/// Spins until our window's first word reaches `want`, at most `timeout` from now (that is,
/// from `peer`'s previous answer).
fn spin_for(
    node: &mut rverbs_core::node::VerbsNode<StdBackoff>,
    peer: u32,
    want: u64,
    timeout: Duration,
) -> Res<()> {
    let start = Instant::now();
    let mut n = 0u32;
    loop {
        if node.window().load_u64(0) == Some(want) {
            return Ok(());
        }
        n = n.wrapping_add(1);
        if n.is_multiple_of(1024) {
            // Retire our own writes' completions and notice a broken channel.
            if let Err(e) = node.multi().poll() {
                return Err(format!("ping-pong with rank {peer}: {e}").into());
            }
            // A failure anywhere in the world (news from a peer or the session watch).
            if let Some(f) = node.failure() {
                return Err(format!("ping-pong with rank {peer}: {f}").into());
            }
            if start.elapsed() > timeout {
                return Err(format!(
                    "ping-pong: rank {peer} sent no answer for value {want} within {timeout:?}"
                )
                .into());
            }
            std::thread::yield_now();
        }
        std::hint::spin_loop();
    }
}

fn print_summary(args: &Args, device: &str, reports: &[Report]) {
    let world = reports.len();
    let max_connect = reports.iter().map(|r| r.connect_ms).max().unwrap_or(0);
    println!();
    println!(
        "rverbs cluster: {world} ranks, device {device}, all connected within {max_connect} ms"
    );
    println!(
        "ping-pong: 8-byte inline RDMA write, spin on memory, RTT/2 over {} round trips",
        args.pingpong_iters
    );
    for r in reports {
        if let Some((peer, p)) = &r.pingpong {
            println!(
                "  ranks {}-{}: p50 {}  p99 {}  p99.9 {}  max {}",
                r.rank,
                peer,
                us(p.p50_ns),
                us(p.p99_ns),
                us(p.p999_ns),
                us(p.max_ns)
            );
        }
    }
    println!("barriers over all {world} ranks, {} each (per-barrier latency; p50 is the median over ranks):", args.barriers);
    // A rank started again (--rejoin) measured none: its first process did.
    let timed = || {
        reports
            .iter()
            .filter_map(|r| r.barriers.get(..BarrierAlgorithm::ALL.len()))
    };
    for (i, alg) in BarrierAlgorithm::ALL.iter().enumerate() {
        let mut p50: Vec<u64> = timed().map(|b| b[i].1.p50_ns).collect();
        p50.sort_unstable();
        let p99 = timed().map(|b| b[i].1.p99_ns).max().unwrap_or(0);
        let max = timed().map(|b| b[i].1.max_ns).max().unwrap_or(0);
        println!(
            "  {:<14} p50 {:>9}  p99 (worst rank) {:>9}  max {:>9}",
            alg.name(),
            us(p50[p50.len() / 2]),
            us(p99),
            us(max)
        );
    }
    if let Some(p) = reports[0].group_barriers {
        println!(
            "sub-group barrier over the {} even ranks (dissemination): p50 {}  p99 {}",
            world.div_ceil(2),
            us(p.p50_ns),
            us(p.p99_ns)
        );
    }
    let checks: usize = reports.iter().map(|r| r.checks.len()).sum();
    let ok: usize = reports
        .iter()
        .map(|r| r.checks.iter().filter(|c| c.1).count())
        .sum();
    println!("data checks (scatter_write, gather_read, send_to_each; bytes compared): {ok} of {checks} passed");
    print_counters(reports);
    let readmitted: Vec<u64> = reports
        .iter()
        .filter(|r| r.rank != VICTIM)
        .filter_map(|r| r.rejoin_ms)
        .collect();
    if let (Some(worst), Some(new)) = (
        readmitted.iter().max(),
        reports.get(VICTIM as usize).and_then(|r| r.rejoin_ms),
    ) {
        println!(
            "rejoin: rank {VICTIM} killed mid-barrier and started again; the survivors readmitted \
             it within {worst} ms of their failed barrier (the new process: {new} ms from its \
             start); then {} barriers of each algorithm over all {world} ranks",
            args.barriers
        );
    }
}

/// The device counters worth an operator's eye: traffic, retransmissions, sequence errors,
/// receiver-not-ready NAKs, a link that went down.
const DEVICE_COUNTERS: [&str; 10] = [
    "hw_counters/sent_pkts",
    "hw_counters/rcvd_pkts",
    "hw_counters/duplicate_request",
    "hw_counters/out_of_seq_request",
    "hw_counters/rcvd_seq_err",
    "hw_counters/completer_retry_err",
    "hw_counters/retry_exceeded_err",
    "hw_counters/rcvd_rnr_err",
    "hw_counters/send_rnr_err",
    "hw_counters/link_downed",
];

/// Each rank's counters: its requests and messages over all peers, the peers that timed out
/// a barrier, refused a send or failed, and its device port's growth during the demo (ranks
/// on one device share it).
fn print_counters(reports: &[Report]) {
    println!("counters per rank (over its peers; rverbs' own, then the device port's growth):");
    for r in reports {
        // Ranks' reports are a peer's bytes: summed without overflow.
        let sum = |f: fn(&PeerLine) -> u64| r.peers.iter().map(f).fold(0u64, u64::saturating_add);
        let mut notes: Vec<String> = Vec::new();
        for p in &r.peers {
            if p.barrier_timeouts > 0 {
                notes.push(format!(
                    "{} barrier timeout(s) on rank {}",
                    p.barrier_timeouts, p.rank
                ));
            }
            if p.credits_refused > 0 {
                notes.push(format!(
                    "{} send(s) to rank {} refused for credit",
                    p.credits_refused, p.rank
                ));
            }
            if let Some(f) = &p.failed {
                notes.push(format!("rank {}: {f}", p.rank));
            }
        }
        println!(
            "  rank {}: requests {} posted, {} completed; messages {} sent, {} received{}{}",
            r.rank,
            sum(|p| p.requests_posted),
            sum(|p| p.requests_completed),
            sum(|p| p.messages_sent),
            sum(|p| p.messages_received),
            if notes.is_empty() { "" } else { "; " },
            notes.join(", ")
        );
        let device: Vec<String> = r
            .device_counters
            .iter()
            .filter(|(n, _)| DEVICE_COUNTERS.contains(&n.as_str()))
            .map(|(n, v)| format!("{} +{v}", n.trim_start_matches("hw_counters/")))
            .collect();
        if !device.is_empty() {
            println!("    device: {}", device.join(", "));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The flags' defaults, `ConnectOptions::for_config` and the README's "Testing on
    /// SoftRoCE" section all name the same policy: `WaitPolicy::default()`.
    #[test]
    fn default_flags_are_the_library_default_the_readme_names() {
        let args = Args::parse_from(["cluster"]);
        assert_eq!(args.wait_policy(), WaitPolicy::default());
        let rank = RankConfig {
            rank: 0,
            host: "127.0.0.1".into(),
            port: 18515,
            device: "rxe0".into(),
            ib_port: 1,
            gid_index: None,
            comment: None,
        };
        let config = ClusterConfig::new("test", None, vec![rank]).expect("one-rank config");
        assert_eq!(
            ConnectOptions::for_config(&config).wait,
            WaitPolicy::default()
        );

        let WaitPolicy::Sleep { spins, pause } = WaitPolicy::default() else {
            panic!("the default is a Sleep policy, as the README says");
        };
        let readme = include_str!("../../../README.md");
        for said in [
            format!(
                "`--wait sleep --spins {spins} --sleep-us {}`",
                pause.as_micros()
            ),
            format!(
                "`WaitPolicy::Sleep {{ spins: {spins}, pause: Duration::from_micros({}) }}`",
                pause.as_micros()
            ),
        ] {
            assert!(readme.contains(&said), "README.md does not say {said}");
        }
    }
}
