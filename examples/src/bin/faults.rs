//! `faults`: rverbs' promises under faults on the wire, one rank on each of two hosts of
//! `tools/rxe-hosts` (`tools/hosts-faults` starts it; CI runs it in step `hosts-in-vm`).
//!
//! Rank 0 puts each fault on the wire itself (`tools/rxe-hosts fault ...`, see `--tool`), both
//! ranks run the same phases, and after each phase every rank's checks and counters are
//! gathered over the bootstrap session and printed by rank 0. It exits 1 if any check failed
//! on any rank.
//!
//! 1. `rc-*`: RDMA writes and reads of 4 KiB checksummed chunks, fetch-and-add counters and
//!    node messages (checksummed, numbered) under 1 % loss, 5 % loss, reordering,
//!    duplication and bit corruption (1 % of the frames, one flipped bit each) on both
//!    hosts: every byte compared, every counter and every prior value an
//!    atomic returned exact, every message once and in order. Prints the device's
//!    retransmission counters and netem's drops; asserts netem dropped frames under loss.
//! 2. `barriers-messaging`: barriers of all three algorithms and node messaging through a
//!    ring per peer and through a shared receive pool (a second node) under 1 % loss and
//!    5 ms ± 5 ms delay (`--jitter-fault`; by default netem keeps the frames' order):
//!    every barrier completes, message counts exact, the device's RNR counters do not move.
//! 3. `short-partition`: both hosts send nothing for `--short-secs` while the ranks run
//!    barriers and messages (bound: `--bound-secs`): it resumes by itself, nothing lost, no
//!    failure news.
//! 4. `multicast`: UD multicast from rank 0 to rank 1 while only the group's datagrams on
//!    host 0's wire go through a netem that loses 5 %: the subscriber's sequence tracker
//!    counts exactly the datagrams netem dropped.
//! 5. `long-partition`: both hosts send nothing for `--long-secs`, longer than the barrier
//!    timeout plus the probe grace: every rank's barrier fails naming the other rank within
//!    that time, and both views agree (each side names the other side).
#![allow(clippy::std_instead_of_core)] // a std program

use rverbs_core::node::Members;
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::process::{Child, Command, ExitCode};
use std::time::{Duration, Instant};

use clap::Parser;
use rverbs_bootstrap::{connect, ClusterConfig, ConnectOptions, Connected, RankConfig};
use rverbs_core::barrier::{BarrierAlgorithm, BarrierError};
use rverbs_core::datagram::{
    memory_needed, Datagram, DatagramConfig, DatagramError, Group, SequenceTracker, Sequencer,
};
use rverbs_core::memory::PageMemory;
use rverbs_core::node::{Event, NodeError, Receive, VerbsNode};
use rverbs_core::poll::Deadline;
use rverbs_core::provider::datagram::DatagramProvider;
use rverbs_core::provider::verbs_ud::VerbsDatagram;
use rverbs_core::sge::RemoteMemory;
use rverbs_core::verbs::{open_device, AccessFlags, OwnedRegion, UdConfig};
use rverbs_core::wire::DatagramEndpoint;
use rverbs_std_shim::{StdBackoff, WaitPolicy, MONOTONIC};
use serde::{Deserialize, Serialize};

#[derive(Parser, Debug, Clone)]
#[command(about = "rverbs under faults on the wire: one rank on each of two hosts")]
struct Args {
    /// Cluster configuration (JSON) of two ranks, one per host.
    #[arg(long)]
    config: PathBuf,
    /// This process's rank.
    #[arg(long)]
    rank: u32,
    /// The rxe-hosts tool (rank 0 puts faults on the wire with `TOOL fault ...`).
    #[arg(long, default_value = "tools/rxe-hosts")]
    tool: String,
    /// The bound: every channel's timeout, and the deadline of each wait in phases 1-3.
    #[arg(long, default_value_t = 30)]
    bound_secs: u64,
    /// 4 KiB writes, 4 KiB reads, atomics and messages per rank in each RC phase.
    #[arg(long, default_value_t = 16)]
    chunks: usize,
    /// Fetch-and-adds and messages per rank in each RC phase.
    #[arg(long, default_value_t = 48)]
    ops: u64,
    /// Barriers per algorithm in phase 2.
    #[arg(long, default_value_t = 20)]
    barriers: u32,
    /// Phase 2's fault (`rxe-hosts fault all` arguments). By default jitter without
    /// reordering: with a rate, netem sends no frame before the one ahead of it. Plain netem
    /// jitter (`netem delay 5ms 5ms loss 1%`) also reorders the frames of a burst, which
    /// rxe's go-back-N recovers from slowly (reordering is phase 1's fault; see
    /// docs/reliability.md).
    #[arg(long, default_value = "netem delay 5ms 5ms loss 1% rate 1gbit")]
    jitter_fault: String,
    /// Messages per rank and receive mode in phase 2.
    #[arg(long, default_value_t = 100)]
    messages: u64,
    /// How long the short partition lasts.
    #[arg(long, default_value_t = 3)]
    short_secs: u64,
    /// Barrier timeout in the long partition (the probe grace comes on top).
    #[arg(long, default_value_t = 8)]
    long_timeout_secs: u64,
    /// How long the long partition lasts.
    #[arg(long, default_value_t = 15)]
    long_secs: u64,
    /// Multicast datagrams in phase 4.
    #[arg(long, default_value_t = 600)]
    datagrams: u64,
    /// Which phases to run (comma-separated: rc, barriers, short, multicast, long).
    #[arg(long, default_value = "rc,barriers,short,multicast,long")]
    phases: String,
}

use rverbs_examples::Res;

/// Writes one line to stderr in a single write (two ranks share the console).
macro_rules! say {
    ($($arg:tt)*) => {{
        let mut line = format!($($arg)*);
        line.push('\n');
        let _ = std::io::Write::write_all(&mut std::io::stderr().lock(), line.as_bytes());
    }};
}

/// What one rank found in one phase.
#[derive(Serialize, Deserialize, Debug, Default)]
struct Report {
    rank: u32,
    phase: String,
    checks: Vec<(String, bool)>,
    /// Growth of the device's non-zero hw_counters over the phase.
    counters: BTreeMap<String, u64>,
    /// Frames netem dropped on this host's wire during the phase.
    netem_dropped: u64,
    notes: Vec<String>,
}

impl Report {
    fn check(&mut self, what: impl Into<String>, ok: bool) {
        self.checks.push((what.into(), ok));
    }
}

const SLOT: usize = 64;
const CHUNK: usize = 4096;
/// The multicast group of phase 4 (its frames alone go through netem on host 0).
const GROUP: [u8; 4] = [239, 77, 9, 9];
const STREAM: u32 = 7;
/// A round of the short partition's loop this slow was stopped by the partition.
const STALL: Duration = Duration::from_secs(2);

fn main() -> ExitCode {
    let args = Args::parse();
    match run(&args) {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => {
            say!("faults: rank {}: checks failed (see above)", args.rank);
            ExitCode::FAILURE
        }
        Err(e) => {
            say!("faults: rank {}: error: {e}", args.rank);
            ExitCode::FAILURE
        }
    }
}

/// FNV-1a: the checksum every payload carries in its last 8 bytes.
fn fnv(b: &[u8]) -> u64 {
    b.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, &x| {
        (h ^ u64::from(x)).wrapping_mul(0x0000_0100_0000_01b3)
    })
}

/// `len` bytes made of `seed`, the last 8 their checksum.
fn payload(seed: u64, len: usize) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    let mut v: Vec<u8> = (0..len - 8)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect();
    let sum = fnv(&v);
    v.extend_from_slice(&sum.to_le_bytes());
    v
}

/// Whether `b` carries its own checksum and is exactly `payload(seed, len)`.
fn intact(b: &[u8], seed: u64) -> bool {
    let (body, sum) = b.split_at(b.len() - 8);
    fnv(body).to_le_bytes() == sum && b == payload(seed, b.len())
}

fn seed(rank: u32, phase: u32, i: u64) -> u64 {
    (u64::from(rank) << 48) ^ (u64::from(phase) << 32) ^ i
}

/// The device's hw_counters (rxe's retransmission, sequence, RNR counters...).
fn hw_counters() -> BTreeMap<String, u64> {
    let mut out = BTreeMap::new();
    let dir = "/sys/class/infiniband/rxe0/ports/1/hw_counters";
    if let Ok(entries) = std::fs::read_dir(dir) {
        for e in entries.flatten() {
            if let Some(v) = std::fs::read_to_string(e.path())
                .ok()
                .and_then(|s| s.trim().parse().ok())
            {
                out.insert(e.file_name().to_string_lossy().into_owned(), v);
            }
        }
    }
    out
}

fn grew(before: &BTreeMap<String, u64>, after: &BTreeMap<String, u64>) -> BTreeMap<String, u64> {
    after
        .iter()
        .filter_map(|(k, a)| {
            let d = a.saturating_sub(before.get(k).copied().unwrap_or(0));
            (d > 0).then(|| (k.clone(), d))
        })
        .collect()
}

/// The `Sent N pkt` and `dropped N` of every qdisc on eth0 (`tc -s qdisc show`; `handle`
/// picks one), summed.
fn qdisc_stats(handle: Option<&str>) -> Res<(u64, u64)> {
    let out = Command::new("tc")
        .args(["-s", "qdisc", "show", "dev", "eth0"])
        .output()?;
    Ok(parse_qdisc_stats(
        &String::from_utf8_lossy(&out.stdout),
        handle,
    ))
}

/// Packets sent and dropped in `tc -s qdisc show` output, over the qdiscs whose handle is
/// `handle` (all when `None`).
fn parse_qdisc_stats(text: &str, handle: Option<&str>) -> (u64, u64) {
    let (mut sent, mut dropped) = (0u64, 0u64);
    let mut take = handle.is_none();
    for line in text.lines() {
        let words: Vec<&str> = line.split_whitespace().collect();
        if words.first() == Some(&"qdisc") {
            take = handle.is_none_or(|h| words.get(2) == Some(&h));
        }
        if !take {
            continue;
        }
        let num = |j: usize| -> u64 {
            words
                .get(j)
                .map_or(0, |s| s.trim_end_matches(',').parse().unwrap_or(0))
        };
        for (i, w) in words.iter().enumerate() {
            if *w == "Sent" && words.get(i + 2) == Some(&"bytes") {
                sent += num(i + 3);
            }
            if *w == "(dropped" || *w == "dropped" {
                dropped += num(i + 1);
            }
        }
    }
    (sent, dropped)
}

/// Runs the rxe-hosts tool with `args`; an error if it fails.
fn tool(args: &Args, words: &[&str]) -> Res<()> {
    let out = Command::new(&args.tool).args(words).output()?;
    if !out.status.success() {
        return Err(format!(
            "{} {}: {} ({})",
            args.tool,
            words.join(" "),
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        )
        .into());
    }
    let text = String::from_utf8_lossy(&out.stdout);
    for l in text.lines().filter(|l| !l.trim().is_empty()) {
        say!("[rank 0] {l}");
    }
    Ok(())
}

/// Starts a partition of `secs` on both hosts at once (one `fault H partition` each, so
/// the two directions are cut together; `fault all` would do one host after the other, and
/// each takes seconds on a busy machine), without waiting for them.
fn partition_spawn(args: &Args, secs: u64) -> Res<Vec<Child>> {
    let secs = secs.to_string();
    (0..2)
        .map(|h| {
            Ok(Command::new(&args.tool)
                .args(["fault", &h.to_string(), "partition", &secs])
                .spawn()?)
        })
        .collect()
}

/// Waits for the children of [`partition_spawn`]; whether both put their fault in place.
fn partition_wait(children: &mut [Child]) -> Res<bool> {
    let mut ok = true;
    for c in children {
        ok &= c.wait()?.success();
    }
    Ok(ok)
}

/// Whether every child of [`partition_spawn`] has ended (both faults are in place).
fn partition_done(children: &mut [Child]) -> Res<bool> {
    let mut done = true;
    for c in children {
        done &= c.try_wait()?.is_some();
    }
    Ok(done)
}

/// A rank's state across phases.
struct Rank<'a> {
    args: &'a Args,
    c: Connected,
    rank: u32,
    peer: u32,
    bound: Duration,
    /// Messages sent to / received from the peer so far (every phase continues the count).
    sent: u64,
    got: u64,
    src: OwnedRegion,
    dst: OwnedRegion,
    atomics: OwnedRegion,
    result: OwnedRegion,
    peer_atomics: RemoteMemory,
    ok: bool,
}

fn encode_remote(m: RemoteMemory) -> Vec<u8> {
    let mut v = m.addr.to_le_bytes().to_vec();
    v.extend_from_slice(&m.len.to_le_bytes());
    v.extend_from_slice(&m.rkey.to_le_bytes());
    v
}

fn decode_remote(b: &[u8]) -> Option<RemoteMemory> {
    Some(RemoteMemory {
        addr: u64::from_le_bytes(b.get(0..8)?.try_into().ok()?),
        len: u64::from_le_bytes(b.get(8..16)?.try_into().ok()?),
        rkey: u32::from_le_bytes(b.get(16..20)?.try_into().ok()?),
    })
}

fn region(node: &VerbsNode<StdBackoff>, len: usize, access: AccessFlags) -> Res<OwnedRegion> {
    Ok(node
        .pd()
        .register_shared(PageMemory::zeroed(len).ok_or("cannot allocate")?, access)?)
}

fn options(config: &ClusterConfig, bound: Duration) -> ConnectOptions {
    let mut opts = ConnectOptions::for_config(config);
    opts.node.channel.timeout = bound;
    opts.node.window_len = 2 * 16 * CHUNK;
    opts.exchange.timeout = Duration::from_secs(180);
    opts.first_barrier_timeout = bound;
    // Waits in the long partition are expected: no progress lines.
    opts.exchange.progress = false;
    opts.wait = WaitPolicy::default();
    opts
}

fn run(args: &Args) -> Res<bool> {
    let config = ClusterConfig::from_file(&args.config)?;
    if config.world_size() != 2 {
        return Err("faults runs one rank on each of two hosts (a config of 2 ranks)".into());
    }
    if args.chunks == 0 || args.chunks > 16 {
        return Err("--chunks takes 1..=16".into());
    }
    let bound = Duration::from_secs(args.bound_secs);
    let rank = args.rank;
    let mut c = connect(&config, rank, &options(&config, bound))?;
    c.node.start_messaging(16, SLOT)?;
    let atomics = region(
        &c.node,
        4096,
        AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_ATOMIC,
    )?;
    let all = c.session.allgather(&encode_remote(atomics.remote()))?;
    let peer = 1 - rank;
    let peer_atomics = all
        .get(peer as usize)
        .and_then(|b| decode_remote(b))
        .ok_or("the peer's atomic counters")?;
    let mut r = Rank {
        args,
        src: region(&c.node, 16 * CHUNK, AccessFlags::LOCAL_WRITE)?,
        dst: region(&c.node, 16 * CHUNK, AccessFlags::LOCAL_WRITE)?,
        result: region(&c.node, 4096, AccessFlags::LOCAL_WRITE)?,
        atomics,
        peer_atomics,
        c,
        rank,
        peer,
        bound,
        sent: 0,
        got: 0,
        ok: true,
    };
    // Nobody sends before every ring is posted; the demo before us may have left netem on.
    r.c.node.barrier_timeout(Members::World, bound)?;
    if rank == 0 {
        tool(args, &["fault", "all", "clear"])?;
    }
    let phases: Vec<&str> = args.phases.split(',').collect();
    let t0 = Instant::now();
    if phases.contains(&"rc") {
        let faults: [(&str, &[&str]); 5] = [
            ("rc-loss-1%", &["loss", "1%"]),
            ("rc-loss-5%", &["loss", "5%"]),
            ("rc-reorder-25%-5ms", &["reorder", "25%", "5ms"]),
            ("rc-duplicate-5%", &["duplicate", "5%"]),
            // One flipped bit in 1 % of the frames: the receiver's checks (IP header
            // checksum, rxe's ICRC) must drop them, so not one corrupted byte reaches memory.
            ("rc-corrupt-1%", &["corrupt", "1%"]),
        ];
        for (i, (name, fault)) in faults.iter().enumerate() {
            r.phase(name, fault, |r, rep| r.rc_integrity(i as u32 + 1, rep))?;
        }
    }
    if phases.contains(&"barriers") {
        let fault: Vec<&str> = args.jitter_fault.split_whitespace().collect();
        r.phase("barriers-messaging", &fault, |r, rep| {
            r.barriers_and_messages(&config, rep)
        })?;
    }
    if phases.contains(&"short") {
        r.phase("short-partition", &[], |r, rep| r.short_partition(rep))?;
    }
    if phases.contains(&"multicast") {
        r.phase("multicast", &[], |r, rep| r.multicast(rep))?;
    }
    if phases.contains(&"long") {
        r.long_partition()?;
    }
    let total =
        r.c.session
            .allgather(&[u8::from(r.ok)])?
            .iter()
            .all(|b| b.first() == Some(&1));
    if rank == 0 {
        say!(
            "faults: {} in {:.1} s",
            if total {
                "every check passed on both ranks"
            } else {
                "CHECKS FAILED"
            },
            t0.elapsed().as_secs_f64()
        );
    }
    let Connected { session, node, .. } = r.c;
    session.close()?;
    drop(node);
    Ok(total)
}

impl Rank<'_> {
    /// One phase: rank 0 puts `fault` on both hosts (none if empty), both run `body`, the
    /// counters' growth and netem's drops are added, the reports gathered and printed, and
    /// the fault cleared.
    fn phase(
        &mut self,
        name: &str,
        fault: &[&str],
        body: impl FnOnce(&mut Self, &mut Report) -> Res<()>,
    ) -> Res<()> {
        let args = self.args;
        if self.rank == 0 && !fault.is_empty() {
            let mut words = vec!["fault", "all"];
            words.extend_from_slice(fault);
            tool(args, &words)?;
        }
        self.c.session.allgather(name.as_bytes())?;
        let before = hw_counters();
        let (_, dropped0) = qdisc_stats(None)?;
        let t = Instant::now();
        let mut rep = Report {
            rank: self.rank,
            phase: name.to_owned(),
            ..Report::default()
        };
        body(self, &mut rep)?;
        rep.notes
            .push(format!("took {:.1} s", t.elapsed().as_secs_f64()));
        rep.counters = grew(&before, &hw_counters());
        // (A phase that removed its own qdisc counted its drops itself.)
        let dropped = qdisc_stats(None)?.1.saturating_sub(dropped0);
        rep.netem_dropped = rep.netem_dropped.max(dropped);
        self.gather(rep)?;
        if self.rank == 0 && !fault.is_empty() {
            tool(args, &["fault", "all", "clear"])?;
        }
        self.c.session.allgather(b"cleared")?;
        Ok(())
    }

    /// Gathers every rank's report of a phase; rank 0 prints them and checks netem's drops.
    fn gather(&mut self, rep: Report) -> Res<()> {
        let all = self
            .c
            .session
            .allgather(serde_json::to_string(&rep)?.as_bytes())?;
        let reports: Vec<Report> = all
            .iter()
            .map(|b| serde_json::from_slice(b))
            .collect::<Result<_, _>>()?;
        let mut ok = reports.iter().all(|r| r.checks.iter().all(|c| c.1));
        if self.rank == 0 {
            let name = &rep.phase;
            let dropped: u64 = reports.iter().map(|r| r.netem_dropped).sum();
            println!("== {name}: netem dropped {dropped} frames on the wire (both hosts)");
            for r in &reports {
                let keys = [
                    "completer_retry_err",
                    "rcvd_seq_err",
                    "out_of_seq_request",
                    "duplicate_request",
                    "rcvd_rnr_err",
                    "send_rnr_err",
                    "retry_exceeded_err",
                    "sent_pkts",
                    "rcvd_pkts",
                ];
                let counters: Vec<String> = keys
                    .iter()
                    .filter_map(|k| r.counters.get(*k).map(|v| format!("{k} +{v}")))
                    .collect();
                println!(
                    "  rank {}: rxe {}; netem dropped {}",
                    r.rank,
                    if counters.is_empty() {
                        "no counter grew".to_owned()
                    } else {
                        counters.join(", ")
                    },
                    r.netem_dropped
                );
                for n in &r.notes {
                    println!("  rank {}: {n}", r.rank);
                }
                for (what, pass) in &r.checks {
                    println!(
                        "  rank {}: [{}] {what}",
                        r.rank,
                        if *pass { "ok" } else { "FAILED" }
                    );
                }
            }
            if name.starts_with("rc-loss") || name == "barriers-messaging" {
                let pass = dropped > 0;
                println!(
                    "  [{}] netem dropped frames (the fault was on the wire)",
                    if pass { "ok" } else { "FAILED" }
                );
                ok &= pass;
            }
        }
        self.ok &= ok;
        Ok(())
    }

    /// Sends `n` numbered, checksummed messages to the peer while receiving as many from it,
    /// every wait bounded by the bound; `aux` rides in every message (rank 0's stop flag).
    /// Returns the last `aux` the peer sent and how many messages arrived out of order,
    /// corrupted or with the wrong bytes.
    fn messages(&mut self, n: u64, tag: u32, aux: u64) -> Res<(u64, u64)> {
        let (peer, rank) = (self.peer, self.rank);
        let (sent_end, got_end) = (self.sent + n, self.got + n);
        let deadline = Instant::now() + self.bound;
        let mut last_aux = 0u64;
        let mut bad = 0u64;
        let mut failed: Option<String> = None;
        while self.sent < sent_end || self.got < got_end {
            if self.sent < sent_end {
                let mut m = payload(seed(rank, tag, self.sent), SLOT);
                m[..8].copy_from_slice(&self.sent.to_le_bytes());
                m[8..16].copy_from_slice(&aux.to_le_bytes());
                let sum = fnv(&m[..SLOT - 8]);
                m[SLOT - 8..].copy_from_slice(&sum.to_le_bytes());
                match self.c.node.post_send_inline(peer, &m) {
                    Ok(_) => self.sent += 1,
                    Err(NodeError::WouldBlock { .. }) => {}
                    Err(e) => return Err(format!("message to rank {peer}: {e}").into()),
                }
            }
            let got = &mut self.got;
            self.c.node.progress(16, |ev| match ev {
                Event::Message { data, .. } => {
                    let seq = data.get(..8).map_or(u64::MAX, |b| {
                        u64::from_le_bytes(b.try_into().unwrap_or([0; 8]))
                    });
                    let sum_ok = data.len() == SLOT
                        && fnv(&data[..SLOT - 8]).to_le_bytes() == data[SLOT - 8..];
                    let body_ok = data.len() == SLOT
                        && data[16..SLOT - 8] == payload(seed(peer, tag, seq), SLOT)[16..SLOT - 8];
                    if seq != *got || !sum_ok || !body_ok {
                        bad += 1;
                    }
                    last_aux = data
                        .get(8..16)
                        .map_or(0, |b| u64::from_le_bytes(b.try_into().unwrap_or([0; 8])));
                    *got += 1;
                }
                Event::Failed { rank, error } => failed = Some(format!("rank {rank}: {error}")),
                _ => {}
            })?;
            if let Some(f) = failed.take() {
                return Err(f.into());
            }
            if let Some(f) = self.c.node.failure() {
                return Err(format!("messages: {f}").into());
            }
            if Instant::now() > deadline {
                // With the device's counters as they stand, to tell a stuck wire from a slow one.
                let hw: Vec<String> = hw_counters()
                    .into_iter()
                    .filter(|(k, v)| *v > 0 && !k.ends_with("_pkts"))
                    .map(|(k, v)| format!("{k} {v}"))
                    .collect();
                return Err(format!(
                    "messages: sent {} of {sent_end}, received {} of {got_end} within {:?} \
                     (rxe counters now: {})",
                    self.sent,
                    self.got,
                    self.bound,
                    hw.join(", ")
                )
                .into());
            }
        }
        Ok((last_aux, bad))
    }

    /// Phase 1: writes, reads, atomics and messages with checksummed payloads.
    fn rc_integrity(&mut self, phase: u32, rep: &mut Report) -> Res<()> {
        let (rank, peer, n) = (self.rank, self.peer, self.args.chunks);
        let win = self.c.node.peer_window(peer).ok_or("no peer window")?;
        // What the peer will read: our chunks in the upper half of our window.
        for i in 0..n {
            let data = payload(seed(rank, phase, 1000 + i as u64), CHUNK);
            self.c.node.window().write_from((16 + i) * CHUNK, &data);
            self.src
                .write_from(i * CHUNK, &payload(seed(rank, phase, i as u64), CHUNK));
        }
        self.c.session.allgather(b"filled")?;
        for i in 0..n {
            let sge = [self.src.sge(i * CHUNK..(i + 1) * CHUNK).ok_or("range")?];
            let to = win
                .slice((i * CHUNK) as u64, CHUNK as u64)
                .ok_or("window")?;
            self.c.node.multi().write(peer, &sge, to)?;
            let mut out = [self
                .dst
                .sge_mut(i * CHUNK..(i + 1) * CHUNK)
                .ok_or("range")?];
            let from = win
                .slice(((16 + i) * CHUNK) as u64, CHUNK as u64)
                .ok_or("window")?;
            self.c.node.multi().read(peer, &mut out, from)?;
        }
        // Fetch-and-add on the peer's counter of this phase: we are its only adder, so the
        // prior values must be 0, step, 2 step, ...
        let step = u64::from(rank) + 1;
        let counter = self
            .peer_atomics
            .slice(8 * u64::from(phase), 8)
            .ok_or("atomics")?;
        let mut priors_ok = true;
        for k in 0..self.args.ops {
            let mut res = self.result.sge_mut(0..8).ok_or("range")?;
            self.c
                .node
                .multi()
                .fetch_add(peer, &mut res, counter, step)?;
            priors_ok &= self.result.load_u64(0) == Some(k * step);
        }
        rep.check(
            format!(
                "{} fetch-and-adds returned 0, {step}, 2*{step}, ... in turn",
                self.args.ops
            ),
            priors_ok,
        );
        let ops = self.args.ops;
        let (s0, g0) = (self.sent, self.got);
        let (_, bad) = self.messages(ops, phase, 0)?;
        rep.check(
            format!(
                "{} messages sent, {} received, {bad} out of order or with wrong bytes or checksum",
                self.sent - s0,
                self.got - g0
            ),
            self.sent - s0 == ops && self.got - g0 == ops && bad == 0,
        );
        self.c.node.barrier_timeout(Members::World, self.bound)?;
        // The peer is done with us: check what it wrote and what we read.
        let mut got = vec![0u8; CHUNK];
        let (mut wrote_ok, mut read_ok) = (0, 0);
        for i in 0..n {
            self.c.node.window().read_into(i * CHUNK, &mut got);
            wrote_ok += usize::from(intact(&got, seed(peer, phase, i as u64)));
            self.dst.read_into(i * CHUNK, &mut got);
            read_ok += usize::from(intact(&got, seed(peer, phase, 1000 + i as u64)));
        }
        rep.check(
            format!("{wrote_ok} of {n} 4 KiB chunks the peer wrote arrived intact"),
            wrote_ok == n,
        );
        rep.check(
            format!("{read_ok} of {n} 4 KiB chunks read from the peer intact"),
            read_ok == n,
        );
        let peer_step = u64::from(peer) + 1;
        let have = self.atomics.load_u64(8 * phase as usize);
        rep.check(
            format!(
                "our counter holds {have:?} = {ops} x {peer_step} after the peer's fetch-and-adds"
            ),
            have == Some(ops * peer_step),
        );
        Ok(())
    }

    /// Phase 2: barriers of every algorithm, then messaging through rings and a shared pool.
    fn barriers_and_messages(&mut self, config: &ClusterConfig, rep: &mut Report) -> Res<()> {
        let rnr = |m: &BTreeMap<String, u64>| -> u64 {
            m.iter()
                .filter(|(k, _)| k.contains("rnr"))
                .map(|(_, v)| *v)
                .sum()
        };
        let rnr0 = rnr(&hw_counters());
        let names: Vec<String> = hw_counters()
            .into_keys()
            .filter(|k| k.contains("rnr"))
            .collect();
        let mut completed = 0u32;
        for alg in BarrierAlgorithm::ALL {
            self.c.node.set_algorithm(alg);
            let t = Instant::now();
            let mut worst = Duration::ZERO;
            for _ in 0..self.args.barriers {
                let b = Instant::now();
                self.c.node.barrier_timeout(Members::World, self.bound)?;
                completed += 1;
                worst = worst.max(b.elapsed());
            }
            rep.notes.push(format!(
                "{} {} barriers in {:.2} s (slowest {} ms)",
                self.args.barriers,
                alg.name(),
                t.elapsed().as_secs_f64(),
                worst.as_millis()
            ));
        }
        rep.check(
            format!(
                "{completed} of {} barriers (all three algorithms) completed",
                3 * self.args.barriers
            ),
            completed == 3 * self.args.barriers,
        );
        self.c.node.set_algorithm(BarrierAlgorithm::Dissemination);
        let n = self.args.messages;
        let (s0, g0) = (self.sent, self.got);
        let (_, bad) = self.messages(n, 100, 0)?;
        self.c.node.barrier_timeout(Members::World, self.bound)?;
        let waited = self.c.node.credit_writes();
        rep.check(
            format!(
                "per-peer rings (16 credits): {} sent, {} received, {bad} out of order or corrupted ({waited} credit returns needed a write)",
                self.sent - s0,
                self.got - g0
            ),
            self.sent - s0 == n && self.got - g0 == n && bad == 0,
        );
        // A shared receive pool needs a node built on a shared receive queue: a second one.
        let ranks = config
            .ranks()
            .iter()
            .map(|r| RankConfig {
                port: r.port + 10,
                ..r.clone()
            })
            .collect();
        let cfg2 = ClusterConfig::new("faults-shared", Some("faults-shared".into()), ranks)?;
        let mut opts = options(&cfg2, self.bound);
        opts.node.components.messaging = Some(Receive::Shared { slots: 8 });
        let mut c2 = connect(&cfg2, self.rank, &opts)?;
        c2.node.start_messaging(8, SLOT)?;
        c2.node.barrier_timeout(Members::World, self.bound)?;
        let (peer, rank) = (self.peer, self.rank);
        let (mut sent, mut got, mut bad) = (0u64, 0u64, 0u64);
        let deadline = Instant::now() + self.bound;
        while sent < n || got < n {
            if sent < n {
                let mut m = payload(seed(rank, 200, sent), SLOT);
                m[..8].copy_from_slice(&sent.to_le_bytes());
                let sum = fnv(&m[..SLOT - 8]);
                m[SLOT - 8..].copy_from_slice(&sum.to_le_bytes());
                match c2.node.post_send_inline(peer, &m) {
                    Ok(_) => sent += 1,
                    Err(NodeError::WouldBlock { .. }) => {}
                    Err(e) => {
                        return Err(format!("shared pool: message to rank {peer}: {e}").into())
                    }
                }
            }
            c2.node.progress(16, |ev| {
                if let Event::Message { data, .. } = ev {
                    let seq = data.get(..8).map_or(u64::MAX, |b| {
                        u64::from_le_bytes(b.try_into().unwrap_or([0; 8]))
                    });
                    let ok = data.len() == SLOT
                        && fnv(&data[..SLOT - 8]).to_le_bytes() == data[SLOT - 8..]
                        && data[8..SLOT - 8] == payload(seed(peer, 200, seq), SLOT)[8..SLOT - 8];
                    if seq != got || !ok {
                        bad += 1;
                    }
                    got += 1;
                }
            })?;
            if let Some(f) = c2.node.failure() {
                return Err(format!("shared pool: {f}").into());
            }
            if Instant::now() > deadline {
                return Err(format!(
                    "shared pool: sent {sent} of {n}, received {got} of {n} within {:?}",
                    self.bound
                )
                .into());
            }
        }
        c2.node.barrier_timeout(Members::World, self.bound)?;
        rep.check(
            format!(
                "shared receive pool (8 slots, {} credits): {sent} sent, {got} received, {bad} out of order or corrupted",
                c2.node.credits_per_peer()
            ),
            sent == n && got == n && bad == 0,
        );
        c2.session.allgather(b"shared done")?;
        let Connected { session, node, .. } = c2;
        session.close()?;
        drop(node);
        let rnr1 = rnr(&hw_counters());
        rep.check(
            format!(
                "the device's RNR counters ({}) did not move: {rnr0} -> {rnr1}",
                names.join(", ")
            ),
            rnr1 == rnr0 && !names.is_empty(),
        );
        Ok(())
    }

    /// Phase 3: a partition shorter than the bound, while barriers and messages run.
    fn short_partition(&mut self, rep: &mut Report) -> Res<()> {
        let args = self.args;
        let mut fault: Option<Vec<Child>> = None;
        let mut fault_done: Option<Instant> = None;
        let (mut rounds, mut after_stall) = (0u64, 0u64);
        let mut worst = Duration::ZERO;
        let t0 = Instant::now();
        let mut last = Instant::now();
        let (s0, g0) = (self.sent, self.got);
        let mut bad = 0u64;
        loop {
            // Rank 0 decides when to stop and says so in its message of the round.
            // (or when the partition never showed, after a minute).
            let stop = self.rank == 0
                && ((fault_done.is_some() && worst >= STALL && after_stall >= 20)
                    || t0.elapsed() > Duration::from_secs(args.short_secs + 60));
            let (peer_stop, b) = self.messages(1, 300, u64::from(stop))?;
            bad += b;
            self.c.node.barrier_timeout(Members::World, self.bound)?;
            rounds += 1;
            let gap = last.elapsed();
            last = Instant::now();
            // Only rounds after the fault was started count: a slow round before it is the
            // machine, not the partition.
            if rounds > 10 && gap > worst {
                worst = gap;
                after_stall = 0;
            } else {
                after_stall += 1;
            }
            if self.rank == 0 && rounds == 10 {
                fault = Some(partition_spawn(args, args.short_secs)?);
            }
            if let Some(f) = &mut fault {
                if fault_done.is_none() && partition_done(f)? {
                    fault_done = Some(Instant::now());
                }
            }
            if stop || (self.rank == 1 && peer_stop == 1) {
                break;
            }
        }
        if let Some(mut f) = fault {
            let ok = partition_wait(&mut f)?;
            rep.check("the partition was put on both hosts' wire", ok);
        }
        let failure = self.c.node.failure();
        rep.check(
            format!(
                "traffic resumed by itself: {rounds} rounds (a message each way and a barrier), the longest took {:.2} s",
                worst.as_secs_f64()
            ),
            worst >= STALL,
        );
        rep.check(
            format!(
                "nothing lost: {} messages sent, {} received, {bad} out of order or corrupted",
                self.sent - s0,
                self.got - g0
            ),
            self.sent - s0 == rounds && self.got - g0 == rounds && bad == 0,
        );
        rep.check(format!("no failure news ({failure:?})"), failure.is_none());
        Ok(())
    }

    /// Phase 4: multicast datagrams from rank 0 to rank 1; only the group's frames on host
    /// 0's wire go through netem (loss 5 %), so netem's drops are exactly the datagrams lost.
    fn multicast(&mut self, rep: &mut Report) -> Res<()> {
        let group = Group::ipv4(GROUP).ok_or("group")?;
        let ctx = open_device("rxe0")?;
        let pd = ctx.alloc_pd()?;
        let mut ud = UdConfig::default();
        ud.max_recv_wr = 512;
        ud.max_send_wr = 256;
        let qp = VerbsDatagram::new(&ctx, &pd, &ud)?;
        let mut cfg = DatagramConfig::default();
        cfg.recv_slots = 512;
        cfg.timeout = self.bound;
        let mem = pd.register_shared(
            PageMemory::zeroed(memory_needed(qp.mtu(), &cfg)).ok_or("cannot allocate")?,
            AccessFlags::LOCAL_WRITE,
        )?;
        let mut ep: Datagram<VerbsDatagram, OwnedRegion, StdBackoff, 512> =
            Datagram::with_backoff(qp, mem, cfg, WaitPolicy::default().backoff(), &MONOTONIC)?;
        if self.rank == 1 {
            ep.join(group)?;
        }
        let all = self.c.session.allgather(&ep.endpoint().encode())?;
        let publisher = all
            .first()
            .and_then(|b| DatagramEndpoint::decode(b).ok())
            .ok_or("the publisher's endpoint")?;
        let n = self.args.datagrams;
        let ip = format!("{}.{}.{}.{}", GROUP[0], GROUP[1], GROUP[2], GROUP[3]);
        if self.rank == 0 {
            // Everything else on the wire goes through band 1:2 untouched; the group's frames
            // go through band 1:3, a netem that loses 5 %.
            let script = format!(
                "tc qdisc replace dev eth0 root handle 1: prio bands 3 priomap 1 1 1 1 1 1 1 1 1 1 1 1 1 1 1 1 && \
                 tc qdisc add dev eth0 parent 1:3 handle 30: netem loss 5% && \
                 tc filter add dev eth0 parent 1: protocol ip prio 1 u32 match ip dst {ip}/32 flowid 1:3"
            );
            let st = Command::new("sh").args(["-c", &script]).status()?;
            if !st.success() {
                return Err(format!("setting up netem for the group's frames: {st}").into());
            }
        }
        self.c.session.allgather(b"publish")?;
        let mut lines = Vec::new();
        if self.rank == 0 {
            let to = ep.group_peer(group)?;
            let mut seq = Sequencer::new(STREAM);
            let gap = Duration::from_millis(4);
            let body = payload(7, 56);
            let t = Instant::now();
            for _ in 0..n {
                ep.send_parts(&to, &[&seq.stamp(), &body])?;
                std::thread::sleep(gap);
            }
            ep.wait_sent()?;
            let (sent, dropped) = qdisc_stats(Some("30:"))?;
            let _ = Command::new("tc")
                .args(["qdisc", "del", "dev", "eth0", "root"])
                .status();
            lines.push(format!(
                "published {n} datagrams in {:.1} s; netem on the group's frames: {sent} sent, {dropped} dropped",
                t.elapsed().as_secs_f64()
            ));
            rep.netem_dropped = dropped;
            rep.check(
                format!("every datagram went through the group's netem: {sent} sent + {dropped} dropped = {n}"),
                sent + dropped == n,
            );
            rep.check(format!("netem dropped datagrams ({dropped})"), dropped > 0);
            // Rank 1 compares its tracker's count with this.
            self.c.session.allgather(&dropped.to_le_bytes())?;
        } else {
            let mut tracker = SequenceTracker::for_stream(STREAM);
            let mut foreign = 0u64;
            let start = Instant::now();
            let mut idle = self.bound;
            // The whole receive is bounded, whatever arrives: other senders on the group too.
            while start.elapsed() <= 4 * self.bound {
                let d = match ep.recv_until(Deadline::after(&MONOTONIC, idle)) {
                    Ok(d) => d,
                    Err(DatagramError::TimedOut { .. }) => break,
                    Err(e) => return Err(e.into()),
                };
                if d.source.qpn != publisher.qpn || d.source.gid != publisher.gid {
                    foreign += 1;
                    continue;
                }
                idle = Duration::from_secs(3);
                let _ = tracker.observe(d.payload);
                if tracker.counts().highest == Some(n - 1) {
                    break;
                }
            }
            let c = tracker.counts();
            let lost = tracker
                .missing_through(n - 1)
                .saturating_add(c.first.unwrap_or(n));
            let theirs = self.c.session.allgather(&[])?;
            let dropped = theirs
                .first()
                .and_then(|b| b.get(..8))
                .map_or(u64::MAX, |b| {
                    u64::from_le_bytes(b.try_into().unwrap_or([0; 8]))
                });
            lines.push(format!(
                "received {} lost {lost} (sequence tracker, up to {}) reordered {} duplicates {} foreign {foreign}",
                c.received,
                n - 1,
                c.reordered,
                c.duplicates
            ));
            rep.check(
                format!("the tracker's loss count {lost} equals the datagrams netem dropped on the sender's wire ({dropped})"),
                lost == dropped,
            );
            rep.check(
                format!(
                    "received {} + lost {lost} = {n} published, no duplicates",
                    c.received
                ),
                c.received + lost == n && c.duplicates == 0,
            );
        }
        rep.notes.extend(lines);
        Ok(())
    }

    /// Phase 5: a partition longer than the barrier timeout plus the probe grace.
    fn long_partition(&mut self) -> Res<()> {
        let args = self.args;
        let timeout = Duration::from_secs(args.long_timeout_secs);
        let grace = rverbs_core::node::DEFAULT_PROBE_GRACE;
        let mut rep = Report {
            rank: self.rank,
            phase: "long-partition".into(),
            ..Report::default()
        };
        self.c.session.allgather(b"long")?;
        let before = hw_counters();
        // The fault's children are waited for on a thread, which notes when both faults were
        // in place (the barrier that fails blocks this one).
        let mut fault: Option<(Instant, std::thread::JoinHandle<(bool, Instant)>)> = None;
        let mut barriers = 0u64;
        let t0 = Instant::now();
        let (error, took) = loop {
            let b = Instant::now();
            match self.c.node.barrier_timeout(Members::World, timeout) {
                Ok(()) => barriers += 1,
                Err(e) => break (e, b.elapsed()),
            }
            if self.rank == 0 && barriers == 10 {
                let started = Instant::now();
                let mut children = partition_spawn(args, args.long_secs)?;
                let waiter = std::thread::spawn(move || {
                    let ok = partition_wait(&mut children).unwrap_or(false);
                    (ok, Instant::now())
                });
                fault = Some((started, waiter));
            }
            if t0.elapsed() > Duration::from_secs(args.long_secs + 120) {
                return Err("long partition: the barriers never failed".into());
            }
        };
        let failed_at = Instant::now();
        let named: Vec<u32> = match &error {
            NodeError::Barrier(BarrierError::Timeout { missing, .. }) => missing.to_vec(),
            NodeError::Barrier(BarrierError::PeerFailed(f)) | NodeError::PeerFailed(f) => {
                vec![f.rank]
            }
            _ => Vec::new(),
        };
        say!(
            "[rank {}] long partition: barrier {} failed after {:.2} s: {error}",
            self.rank,
            barriers + 1,
            took.as_secs_f64()
        );
        rep.notes.push(format!("the error: \"{error}\""));
        let bound = timeout + grace + Duration::from_secs(3);
        rep.check(
            format!(
                "the failed barrier (after {barriers} that passed) names the unreachable rank {}: {named:?}",
                self.peer
            ),
            named == [self.peer],
        );
        rep.check(
            format!(
                "it failed {:.2} s after it began: within timeout {} s + grace {} s (+3 s slack), not before the timeout",
                took.as_secs_f64(),
                timeout.as_secs(),
                grace.as_secs()
            ),
            took <= bound && took >= timeout,
        );
        if let Some((started, waiter)) = fault {
            let (ok, in_place) = waiter.join().map_err(|_| "the fault's waiter panicked")?;
            rep.check("the partition was put on both hosts' wire", ok);
            // The partition began between the two: starting the fault took seconds.
            let (most, least) = (
                failed_at.saturating_duration_since(started),
                failed_at.saturating_duration_since(in_place),
            );
            rep.notes.push(format!(
                "the error came {:.2} s after the fault was started, {:.2} s after it was in place on both hosts",
                most.as_secs_f64(),
                least.as_secs_f64()
            ));
            rep.check(
                format!(
                    "named within timeout + grace + 3 s of the partition being in place ({:.2} s)",
                    least.as_secs_f64()
                ),
                least <= bound,
            );
        }
        // Through the session once the wire is back (TCP waits out the partition).
        let views = self.c.session.allgather(
            &named
                .iter()
                .flat_map(|r| r.to_le_bytes())
                .collect::<Vec<u8>>(),
        )?;
        let view = |r: usize| -> Vec<u32> {
            views.get(r).map_or(Vec::new(), |b| {
                b.chunks_exact(4)
                    .map(|c| u32::from_le_bytes(c.try_into().unwrap_or([0; 4])))
                    .collect()
            })
        };
        rep.check(
            format!(
                "both sides' views agree: rank 0 names {:?}, rank 1 names {:?} (each side the other)",
                view(0),
                view(1)
            ),
            view(0) == [1] && view(1) == [0],
        );
        rep.counters = grew(&before, &hw_counters());
        self.gather(rep)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_flipped_bit_or_a_wrong_seed_is_not_intact() {
        let p = payload(seed(1, 2, 3), CHUNK);
        assert!(intact(&p, seed(1, 2, 3)));
        assert!(!intact(&p, seed(0, 2, 3)));
        for at in [0, 100, CHUNK - 1] {
            let mut q = p.clone();
            q[at] ^= 0x10;
            assert!(!intact(&q, seed(1, 2, 3)), "bit flipped at {at}");
        }
    }

    #[test]
    fn qdisc_counts_of_one_handle_or_all() {
        let text = "qdisc prio 1: root refcnt 2 bands 3 priomap 1 1 1 1 1 1 1 1 1 1 1 1 1 1 1 1
 Sent 120000 bytes 1500 pkt (dropped 0, overlimits 0 requeues 0)
 backlog 0b 0p requeues 0
qdisc netem 30: parent 1:3 limit 1000 loss 5%
 Sent 45920 bytes 574 pkt (dropped 26, overlimits 0 requeues 0)
 backlog 0b 0p requeues 0
";
        assert_eq!(parse_qdisc_stats(text, Some("30:")), (574, 26));
        assert_eq!(parse_qdisc_stats(text, None), (2074, 26));
        assert_eq!(parse_qdisc_stats("", None), (0, 0));
    }
}
