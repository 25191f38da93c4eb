//! `messaging_soak`: node messaging for a while, with one receiver that pauses, through a
//! ring per peer and through one shared receive pool; reports messages per second, receive
//! memory per rank and the device's RNR counters before and after.
//!
//! It starts `--ranks` copies of itself on this machine (all on `--device`). Every rank
//! sends numbered 64-byte inline messages to every other rank, as fast as credits allow,
//! for `RVERBS_SOAK_SECS` seconds (60 by default; `--secs` overrides); rank 0 sleeps
//! `--pause-ms` every `--pause-every-ms`. Afterwards every rank checks it got every message
//! its peers sent, once and in order. Credit flow control should keep every send off an
//! empty receive queue: the RNR NAK counters (`/sys/class/infiniband/DEV/ports/1/hw_counters`
//! on rxe: `rcvd_rnr_err`, `send_rnr_err`) must not move.
//!
//! ```text
//! tools/rxe-vm --devices 1 -- target/release/messaging_soak            # 60 s per mode
//! RVERBS_SOAK_SECS=5 tools/rxe-vm --devices 1 -- target/release/messaging_soak
//! ```
#![allow(clippy::std_instead_of_core)] // a std program

use rverbs_core::node::Members;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode, Stdio};
use std::time::{Duration, Instant};

use clap::Parser;
use rverbs_bootstrap::{connect, ClusterConfig, ConnectOptions, RankConfig};
use rverbs_core::node::{Event, NodeError, Receive};
use serde::{Deserialize, Serialize};

#[derive(Parser, Debug, Clone)]
#[command(about = "rverbs messaging soak: per-peer rings vs one shared receive pool")]
struct Args {
    /// Run as this rank of the world described by --config (set by the launcher).
    #[arg(long, requires = "config")]
    rank: Option<u32>,
    /// Cluster configuration written by the launcher.
    #[arg(long)]
    config: Option<PathBuf>,
    /// Local ranks.
    #[arg(long, default_value_t = 4)]
    ranks: u32,
    /// RDMA device.
    #[arg(long, default_value = "rxe0")]
    device: String,
    /// First TCP port of the bootstrap.
    #[arg(long, default_value_t = 19515)]
    port: u16,
    /// Seconds of messaging per mode (default: RVERBS_SOAK_SECS, else 60).
    #[arg(long)]
    secs: Option<u64>,
    /// Which receive modes to run.
    #[arg(long, value_enum, default_value_t = Modes::Both)]
    modes: Modes,
    /// Ring slots per peer (per-peer mode).
    #[arg(long, default_value_t = 16)]
    ring_slots: u32,
    /// Pool slots (shared mode), for all peers together.
    #[arg(long, default_value_t = 48)]
    pool_slots: u32,
    /// Rank 0 sleeps this long...
    #[arg(long, default_value_t = 5)]
    pause_ms: u64,
    /// ...once every this many milliseconds.
    #[arg(long, default_value_t = 100)]
    pause_every_ms: u64,
    /// Shared mode (internal: set by the launcher for each child).
    #[arg(long, hide = true)]
    shared: bool,
}

#[derive(clap::ValueEnum, Debug, Clone, Copy, PartialEq, Eq)]
enum Modes {
    PerPeer,
    Shared,
    Both,
}

/// What one rank reports to the launcher (one JSON line on stdout).
#[derive(Serialize, Deserialize, Debug, Default)]
struct RankReport {
    rank: u32,
    sent: u64,
    received: u64,
    would_block: u64,
    failures: Vec<String>,
    secs: f64,
    receive_memory: usize,
    credits: usize,
    /// Credit returns that needed a write of their own (the rest rode on messages).
    credit_writes: u64,
}

use rverbs_examples::Res;

const SLOT: usize = 64;

fn main() -> ExitCode {
    let args = Args::parse();
    let r = match (&args.config, args.rank) {
        (Some(path), Some(rank)) => run_rank(&args, path, rank),
        _ => launch(&args),
    };
    rverbs_examples::exit_code("messaging_soak: error", r)
}

fn secs(args: &Args) -> u64 {
    args.secs
        .or_else(|| std::env::var("RVERBS_SOAK_SECS").ok()?.parse().ok())
        .unwrap_or(60)
}

/// The device's RNR NAK counters (name, value) from sysfs; empty if it has none.
fn rnr_counters(device: &str) -> Vec<(String, u64)> {
    let dir = Path::new("/sys/class/infiniband")
        .join(device)
        .join("ports/1/hw_counters");
    let mut out = Vec::new();
    if let Ok(entries) = std::fs::read_dir(&dir) {
        for e in entries.flatten() {
            let name = e.file_name().to_string_lossy().into_owned();
            if name.contains("rnr") {
                let v = std::fs::read_to_string(e.path())
                    .ok()
                    .and_then(|s| s.trim().parse().ok())
                    .unwrap_or(0);
                out.push((name, v));
            }
        }
    }
    out.sort();
    out
}

fn launch(args: &Args) -> Res<()> {
    if args.ranks < 2 {
        return Err("--ranks must be at least 2".into());
    }
    let modes: &[bool] = match args.modes {
        Modes::PerPeer => &[false],
        Modes::Shared => &[true],
        Modes::Both => &[false, true],
    };
    let secs = secs(args);
    let mut failed = false;
    for (i, &shared) in modes.iter().enumerate() {
        let port = args.port + (i as u16) * (args.ranks as u16 + 1);
        let ranks = (0..args.ranks)
            .map(|r| RankConfig {
                rank: r,
                host: "127.0.0.1".into(),
                port: port + r as u16,
                device: args.device.clone(),
                ib_port: 1,
                gid_index: None,
                comment: None,
            })
            .collect();
        let job = format!("soak-{}-{i}", std::process::id());
        let config = ClusterConfig::new("soak", Some(job.clone()), ranks)?;
        let path = std::env::temp_dir().join(format!("rverbs-{job}.json"));
        std::fs::write(&path, config.to_json_string())?;
        let before = rnr_counters(&args.device);
        let exe = std::env::current_exe()?;
        let kids = (0..args.ranks)
            .map(|r| {
                let mut c = Command::new(&exe);
                c.arg("--config")
                    .arg(&path)
                    .arg("--rank")
                    .arg(r.to_string())
                    .arg("--secs")
                    .arg(secs.to_string())
                    .arg("--ring-slots")
                    .arg(args.ring_slots.to_string())
                    .arg("--pool-slots")
                    .arg(args.pool_slots.to_string())
                    .arg("--pause-ms")
                    .arg(args.pause_ms.to_string())
                    .arg("--pause-every-ms")
                    .arg(args.pause_every_ms.to_string())
                    .stdout(Stdio::piped());
                if shared {
                    c.arg("--shared");
                }
                c.spawn()
            })
            .collect::<Result<Vec<_>, _>>()?;
        let mut reports = Vec::new();
        for (r, k) in kids.into_iter().enumerate() {
            let out = k.wait_with_output()?;
            if !out.status.success() {
                failed = true;
                eprintln!("rank {r}: {}", out.status);
            }
            for line in String::from_utf8_lossy(&out.stdout).lines() {
                if let Ok(rep) = serde_json::from_str::<RankReport>(line) {
                    reports.push(rep);
                }
            }
        }
        let _ = std::fs::remove_file(&path);
        let after = rnr_counters(&args.device);
        let received: u64 = reports.iter().map(|r| r.received).sum();
        let elapsed = reports.iter().map(|r| r.secs).fold(0.0, f64::max);
        let blocked: u64 = reports.iter().map(|r| r.would_block).sum();
        let credit_writes: u64 = reports.iter().map(|r| r.credit_writes).sum();
        let mode = if shared {
            format!("shared pool of {} slots", args.pool_slots)
        } else {
            format!("per-peer rings of {} slots", args.ring_slots)
        };
        println!(
            "{} ranks, {mode}: {received} messages in {elapsed:.1} s = {:.0} messages/s; \
             receive memory per rank {} bytes, {} credits per peer; {blocked} sends waited \
             for credit; {credit_writes} credit returns needed a write of their own",
            args.ranks,
            received as f64 / elapsed.max(1e-9),
            reports.first().map_or(0, |r| r.receive_memory),
            reports.first().map_or(0, |r| r.credits),
        );
        let mut moved = false;
        for ((name, b), (_, a)) in before.iter().zip(&after) {
            println!("  {name}: {b} -> {a} (+{})", a.saturating_sub(*b));
            moved |= a > b;
        }
        if before.is_empty() {
            println!(
                "  (no RNR counters under /sys/class/infiniband/{})",
                args.device
            );
        }
        for rep in &reports {
            for f in &rep.failures {
                println!("  rank {}: {f}", rep.rank);
                failed = true;
            }
        }
        if reports.len() != args.ranks as usize {
            failed = true;
            println!("  only {} of {} ranks reported", reports.len(), args.ranks);
        }
        if moved {
            failed = true;
            println!("  RNR counters moved: a send found no posted receive");
        }
    }
    if failed {
        Err("the soak failed (see above)".into())
    } else {
        Ok(())
    }
}

fn run_rank(args: &Args, path: &Path, rank: u32) -> Res<()> {
    let config = ClusterConfig::from_file(path)?;
    let world = config.world_size();
    let mut opts = ConnectOptions::for_config(&config);
    opts.node.components.messaging = Some(if args.shared {
        Receive::Shared {
            slots: args.pool_slots,
        }
    } else {
        Receive::PerPeer
    });
    let c = connect(&config, rank, &opts)?;
    let (mut node, mut session) = (c.node, c.session);
    let slots = if args.shared {
        args.pool_slots
    } else {
        args.ring_slots
    } as usize;
    node.start_messaging(slots, SLOT)?;
    // Nobody sends before every ring (or pool) is posted.
    node.barrier_timeout(Members::World, Duration::from_secs(60))?;
    let peers: Vec<u32> = (0..world).filter(|&r| r != rank).collect();
    let w = world as usize;
    let mut sent = vec![0u64; w];
    let mut got = vec![0u64; w];
    let mut rep = RankReport {
        rank,
        receive_memory: node.receive_memory(),
        credits: node.credits_per_peer(),
        ..RankReport::default()
    };
    let handle = |ev: Event<'_>, got: &mut Vec<u64>, rep: &mut RankReport| match ev {
        Event::Message {
            rank: from, data, ..
        } => {
            let seq = data.get(..8).map_or(u64::MAX, |b| {
                u64::from_le_bytes(b.try_into().unwrap_or([0; 8]))
            });
            if seq != got[from as usize] && rep.failures.len() < 8 {
                rep.failures.push(format!(
                    "message {seq} from {from}, expected {}",
                    got[from as usize]
                ));
            }
            got[from as usize] += 1;
            rep.received += 1;
        }
        Event::Failed { rank, error } => rep.failures.push(format!("rank {rank}: {error}")),
        _ => {}
    };
    let run = Duration::from_secs(secs(args));
    let (pause, every) = (
        Duration::from_millis(args.pause_ms),
        Duration::from_millis(args.pause_every_ms.max(1)),
    );
    let t0 = Instant::now();
    let mut next_pause = t0 + every;
    let mut k = 0;
    let mut msg = [0u8; SLOT];
    while t0.elapsed() < run && rep.failures.is_empty() {
        if rank == 0 && Instant::now() >= next_pause {
            std::thread::sleep(pause);
            next_pause += every;
        }
        // One send attempt to each peer per round, then one progress.
        for _ in 0..peers.len() {
            let to = peers[k % peers.len()];
            k += 1;
            msg[..8].copy_from_slice(&sent[to as usize].to_le_bytes());
            match node.post_send_inline(to, &msg) {
                Ok(_) => sent[to as usize] += 1,
                Err(NodeError::WouldBlock { .. }) => rep.would_block += 1,
                Err(e) => return Err(e.into()),
            }
        }
        node.progress(64, |ev| handle(ev, &mut got, &mut rep))?;
    }
    rep.sent = sent.iter().sum();
    // Everyone stops sending, then learns how many messages each peer sent it.
    let mine: Vec<u8> = sent.iter().flat_map(|n| n.to_le_bytes()).collect();
    let all = session.allgather(&mine)?;
    let expect: Vec<u64> = (0..w)
        .map(|from| {
            all.get(from)
                .and_then(|b| b.get(8 * rank as usize..8 * rank as usize + 8))
                .map_or(0, |b| u64::from_le_bytes(b.try_into().unwrap_or([0; 8])))
        })
        .collect();
    let drain = Instant::now();
    while got != expect && rep.failures.is_empty() {
        if drain.elapsed() > Duration::from_secs(60) {
            rep.failures
                .push(format!("drain timed out: got {got:?}, expected {expect:?}"));
            break;
        }
        node.progress(64, |ev| handle(ev, &mut got, &mut rep))?;
    }
    rep.secs = t0.elapsed().as_secs_f64();
    rep.credit_writes = node.credit_writes();
    println!("{}", serde_json::to_string(&rep)?);
    // Nobody tears down its queue pairs while a peer may still send to it.
    session.allgather(b"done")?;
    Ok(())
}
