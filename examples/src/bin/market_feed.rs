//! `market-feed`: one publisher, N subscribers on a multicast group, each in its own process.
//!
//! The publisher starts `--subscribers` copies of itself (role `subscriber`), waits until each
//! has joined the group, then publishes `--messages` datagrams of `--size` bytes at
//! `--rate` per second to the group: one post per datagram, whatever the number of
//! subscribers. Each datagram starts with a sequence header (`rverbs_core::wire::sequence`)
//! and carries the publisher's `CLOCK_MONOTONIC` time of sending. At the end it announces
//! the last sequence number (a few times: that announcement is a datagram too).
//!
//! Each subscriber prints what it received, what it lost (sequence numbers it never saw, up
//! to the announced last one) and reordered, and the one-way latency percentiles (receive
//! time minus send time: every process runs on this machine, on the same clock). Datagrams
//! are unreliable: a subscriber that falls behind by more than its receive slots loses the
//! excess, and the counts say so rather than hide it. Anybody may send to a group: a
//! subscriber takes datagrams only from the publisher's queue pair (which the publisher
//! hands it at start) and counts the others as foreign.
//!
//! The publisher reports how many packets the device sent while it published (on rxe, from
//! the device's own `sent_pkts` counter): one per datagram, whatever the number of
//! subscribers.
//!
//! ```text
//! tools/rxe-vm --devices 1 -- target/release/market-feed --subscribers 3 --messages 20000
//! ```
//!
//! With `--cm` (feature `rdmacm`) the subscribers join through the RDMA connection manager
//! (`rdma_join_multicast`) instead of attaching their queue pairs and joining the IP group
//! themselves.
#![allow(clippy::std_instead_of_core)] // a std program

use std::io::{BufRead, BufReader, Write};
use std::process::{Child, Command, ExitCode, Stdio};
use std::time::{Duration, Instant};

use clap::{Parser, ValueEnum};
use hdrhistogram::Histogram;
use rverbs_core::datagram::{
    memory_needed, Datagram, DatagramConfig, DatagramError, Group, SequenceTracker, Sequencer,
};
use rverbs_core::memory::PageMemory;
use rverbs_core::poll::{Clock, Deadline};
use rverbs_core::provider::datagram::DatagramProvider;
use rverbs_core::provider::verbs_ud::VerbsDatagram;
use rverbs_core::verbs::{open_device, AccessFlags, OwnedRegion, UdConfig};
use rverbs_core::wire::{DatagramEndpoint, SequenceHeader};
use rverbs_std_shim::{StdBackoff, WaitPolicy, MONOTONIC};

/// The stream of market data; the end announcement goes on its own stream.
const DATA: u32 = 1;
const END: u32 = 0xffff_fff0;
/// Receive slots: how far a subscriber may fall behind before it loses datagrams.
const SLOTS: usize = 512;

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
enum Role {
    Publisher,
    Subscriber,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
enum Wait {
    /// Spin (a core per process).
    Spin,
    /// Spin 64 empty polls, then yield (more processes than cores, as in the test VM).
    Yield,
}

#[derive(Parser, Debug, Clone)]
#[command(about = "Multicast market feed: one publisher, N subscriber processes")]
struct Args {
    /// Subscriber processes.
    #[arg(long, default_value_t = 3)]
    subscribers: u32,
    /// Datagrams to publish.
    #[arg(long, default_value_t = 20_000)]
    messages: u64,
    /// Datagrams per second.
    #[arg(long, default_value_t = 20_000)]
    rate: u64,
    /// Bytes per datagram (sequence header and timestamp included; at most the path MTU).
    #[arg(long, default_value_t = 64)]
    size: usize,
    /// IPv4 multicast group.
    #[arg(long, default_value = "239.1.2.3")]
    group: std::net::Ipv4Addr,
    /// RDMA device.
    #[arg(long, default_value = "rxe0")]
    device: String,
    /// What a waiting process does between empty polls.
    #[arg(long, value_enum, default_value_t = Wait::Yield)]
    wait: Wait,
    /// Subscribers join through the RDMA connection manager (`rdma_join_multicast`).
    #[cfg(feature = "rdmacm")]
    #[arg(long)]
    cm: bool,
    /// Internal: this process's role.
    #[arg(long, value_enum, default_value_t = Role::Publisher, hide = true)]
    role: Role,
    /// Internal: the subscriber's number.
    #[arg(long, default_value_t = 0, hide = true)]
    index: u32,
    /// Internal: the publisher's endpoint (hex of its wire encoding).
    #[arg(long, default_value = "", hide = true)]
    publisher: String,
}

use rverbs_examples::Res;
type Endpoint = Datagram<VerbsDatagram, OwnedRegion, StdBackoff, SLOTS>;

fn main() -> ExitCode {
    let args = Args::parse();
    let r = match args.role {
        Role::Publisher => publish(&args),
        Role::Subscriber => subscribe(&args),
    };
    let who = format!("market-feed ({:?} {})", args.role, args.index);
    rverbs_examples::exit_code(&who, r)
}

fn endpoint(args: &Args) -> Res<Endpoint> {
    let ctx = open_device(&args.device)?;
    let pd = ctx.alloc_pd()?;
    let mut ud = UdConfig::default();
    ud.max_recv_wr = SLOTS as u32;
    ud.max_send_wr = 256;
    let qp = VerbsDatagram::new(&ctx, &pd, &ud)?;
    #[cfg(feature = "rdmacm")]
    let qp = if args.cm && args.role == Role::Subscriber {
        qp.joining_through_cm(Duration::from_secs(10), &MONOTONIC)?
    } else {
        qp
    };
    let mut cfg = DatagramConfig::default();
    cfg.recv_slots = SLOTS as u32;
    cfg.timeout = Duration::from_secs(10);
    let need = memory_needed(qp.mtu(), &cfg);
    let mem = pd.register_shared(
        PageMemory::zeroed(need).ok_or("cannot allocate")?,
        AccessFlags::LOCAL_WRITE,
    )?;
    let policy = match args.wait {
        Wait::Spin => WaitPolicy::Spin,
        Wait::Yield => WaitPolicy::Yield { spins: 64 },
    };
    Ok(Datagram::with_backoff(
        qp,
        mem,
        cfg,
        policy.backoff(),
        &MONOTONIC,
    )?)
}

fn group(args: &Args) -> Res<Group> {
    Ok(Group::ipv4(args.group.octets()).ok_or("--group is not an IPv4 multicast address")?)
}

/// `--cm` for the subscribers, if the publisher was given it.
fn cm_flag(args: &Args) -> &'static [&'static str] {
    #[cfg(feature = "rdmacm")]
    if args.cm {
        return &["--cm"];
    }
    let _ = args;
    &[]
}

fn now_ns() -> u64 {
    MONOTONIC.now().as_nanos()
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

/// The bytes of a hex string; `None` for anything else (odd length, non-hex characters).
fn unhex(s: &str) -> Option<Vec<u8>> {
    let digit = |c: u8| char::from(c).to_digit(16);
    let b = s.as_bytes();
    if !b.len().is_multiple_of(2) {
        return None;
    }
    b.chunks_exact(2)
        .map(|p| Some((digit(p[0])? * 16 + digit(p[1])?) as u8))
        .collect()
}

/// Packets the device's port 1 sent so far, by its own counter, where it has one (rxe).
fn device_sent_packets(device: &str) -> Option<u64> {
    std::fs::read_to_string(format!(
        "/sys/class/infiniband/{device}/ports/1/hw_counters/sent_pkts"
    ))
    .ok()?
    .trim()
    .parse()
    .ok()
}

fn publish(args: &Args) -> Res<()> {
    let group = group(args)?;
    let mut ep = endpoint(args)?;
    let min = rverbs_core::wire::SEQUENCE_HEADER_LEN + 8;
    if args.size < min || args.size > ep.mtu() as usize {
        return Err(format!("--size must be {min} ..= {} (the path MTU)", ep.mtu()).into());
    }
    let to_group = ep.group_peer(group)?;
    let exe = std::env::current_exe()?;
    let mut subs: Vec<(Child, BufReader<std::process::ChildStdout>)> = Vec::new();
    for i in 0..args.subscribers {
        let mut c = Command::new(&exe)
            .args(["--role", "subscriber", "--index", &i.to_string()])
            .args(["--device", &args.device, "--group", &args.group.to_string()])
            .args(["--messages", &args.messages.to_string()])
            .args(["--publisher", &hex(&ep.endpoint().encode())])
            .args([
                "--wait",
                if args.wait == Wait::Spin {
                    "spin"
                } else {
                    "yield"
                },
            ])
            .args(cm_flag(args))
            .stdout(Stdio::piped())
            .spawn()?;
        let out = BufReader::new(c.stdout.take().ok_or("no pipe")?);
        subs.push((c, out));
    }
    for (i, (_, out)) in subs.iter_mut().enumerate() {
        let mut l = String::new();
        out.read_line(&mut l)?;
        if l.trim() != "READY" {
            return Err(format!("subscriber {i} did not join the group: {l:?}").into());
        }
    }
    let mut seq = Sequencer::new(DATA);
    let filler = vec![0x42u8; args.size - min];
    let gap = Duration::from_secs_f64(1.0 / args.rate.max(1) as f64);
    let packets0 = device_sent_packets(&args.device);
    let t0 = Instant::now();
    let mut next = t0;
    for _ in 0..args.messages {
        while Instant::now() < next {
            std::hint::spin_loop();
        }
        next += gap;
        let h = seq.stamp();
        ep.send_parts(&to_group, &[&h, &now_ns().to_le_bytes(), &filler])?;
    }
    let elapsed = t0.elapsed();
    // Every datagram left (at most one more packet: the request wait_sent may post).
    ep.wait_sent()?;
    let packets = packets0
        .zip(device_sent_packets(&args.device))
        .map(|(a, b)| b.saturating_sub(a));
    let last = seq.next_sequence().saturating_sub(1);
    let mut end = Sequencer::new(END);
    for _ in 0..5 {
        std::thread::sleep(Duration::from_millis(20));
        ep.send_parts(&to_group, &[&end.stamp(), &last.to_le_bytes()])?;
    }
    ep.wait_sent()?;
    let packets = match packets {
        Some(p) => format!(
            "{p} device packets ({:.2} per datagram)",
            p as f64 / args.messages.max(1) as f64
        ),
        None => "device packets not counted (no hw_counters/sent_pkts)".to_owned(),
    };
    println!(
        "publisher: {} datagrams of {} bytes to {} in {:.2} s ({:.0}/s), {packets}, {} subscribers",
        args.messages,
        args.size,
        args.group,
        elapsed.as_secs_f64(),
        args.messages as f64 / elapsed.as_secs_f64(),
        args.subscribers
    );
    let mut failed = 0;
    for (i, (mut c, mut out)) in subs.into_iter().enumerate() {
        let mut report = String::new();
        out.read_to_string_lossy(&mut report)?;
        print!("{report}");
        if !c.wait()?.success() {
            eprintln!("subscriber {i} failed");
            failed += 1;
        }
    }
    if failed > 0 {
        return Err(format!("{failed} subscribers failed").into());
    }
    Ok(())
}

trait ReadAll {
    fn read_to_string_lossy(&mut self, s: &mut String) -> std::io::Result<()>;
}

impl<R: BufRead> ReadAll for R {
    fn read_to_string_lossy(&mut self, s: &mut String) -> std::io::Result<()> {
        let mut b = Vec::new();
        self.read_to_end(&mut b)?;
        s.push_str(&String::from_utf8_lossy(&b));
        Ok(())
    }
}

fn subscribe(args: &Args) -> Res<()> {
    let group = group(args)?;
    let publisher = unhex(&args.publisher)
        .and_then(|b| DatagramEndpoint::decode(&b).ok())
        .ok_or("--publisher is not an encoded datagram endpoint")?;
    let mut ep = endpoint(args)?;
    ep.join(group)?;
    println!("READY");
    std::io::stdout().flush()?;
    let mut tracker = SequenceTracker::for_stream(DATA);
    let mut lat = Histogram::<u64>::new_with_bounds(1, 60_000_000_000, 3)?;
    let mut last = None;
    let mut foreign = 0u64;
    // Before the first datagram, wait as long as the publisher may take to start; after it,
    // a silence of 2 s ends the run (the end announcement may be lost too).
    let mut idle = Duration::from_secs(30);
    loop {
        let deadline = Deadline::after(&MONOTONIC, idle);
        let d = match ep.recv_until(deadline) {
            Ok(d) => d,
            Err(DatagramError::TimedOut { .. }) => break,
            Err(e) => return Err(e.into()),
        };
        let at = now_ns();
        if d.source.qpn != publisher.qpn || d.source.gid != publisher.gid {
            foreign += 1;
            continue;
        }
        idle = Duration::from_secs(2);
        if let Ok((h, body)) = SequenceHeader::decode(d.payload) {
            if h.stream == END {
                last = body.first_chunk::<8>().map(|b| u64::from_le_bytes(*b));
                break;
            }
        }
        if let Ok((_, body)) = tracker.observe(d.payload) {
            if let Some(ts) = body.first_chunk::<8>() {
                // Out of the histogram's range (a clock gone wrong) counts at its edge.
                lat.saturating_record(at.saturating_sub(u64::from_le_bytes(*ts)).max(1));
            }
        }
    }
    let c = tracker.counts();
    let (lost, how) = match (last, c.first) {
        // The subscriber joined before the publisher started: 0 .. first never arrived.
        (Some(l), Some(first)) => (
            tracker.missing_through(l).saturating_add(first),
            "up to the announced last",
        ),
        (Some(l), None) => (l.saturating_add(1), "up to the announced last"),
        (None, _) => (
            args.messages.saturating_sub(c.received),
            "end announcement lost; counted against --messages",
        ),
    };
    let us = |q: f64| lat.value_at_quantile(q) as f64 / 1000.0;
    println!(
        "subscriber {}: received {} lost {} ({how}) reordered {} duplicates {} stale {} \
         foreign {foreign} latency_us p50={:.1} p99={:.1} max={:.1}",
        args.index,
        c.received,
        lost,
        c.reordered,
        c.duplicates,
        c.stale + c.out_of_range,
        us(0.5),
        us(0.99),
        lat.max() as f64 / 1000.0
    );
    Ok(())
}
