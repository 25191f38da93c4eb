//! `ud_pingpong`: datagram (UD) ping-pong between two processes, the rverbs counterpart of
//! `ibv_ud_pingpong` from ibverbs-utils, measured the same way: `--iters` round trips of
//! `--size` bytes, each side busy-polling, and the total time divided by the iterations
//! ("usec/iter"); it also prints the percentiles of the iterations.
//!
//! ```text
//! ud_pingpong --size 64 --iters 2000 &              # server: waits on --port
//! ud_pingpong --size 64 --iters 2000 127.0.0.1      # client
//! ```
//!
//! The two exchange their datagram endpoints over TCP (one line of hex each way), as
//! `ibv_ud_pingpong` does. Each side then uses a `Datagram` endpoint: the client sends and
//! waits for the answer, the server answers each datagram to the address it came from. The
//! payload is checked on every round trip. `tools/compare-perftest` runs it beside
//! `ibv_ud_pingpong` in one SoftRoCE VM boot.
#![allow(clippy::std_instead_of_core)] // a std program

use std::io::{BufRead, BufReader, Write};
use std::net::{TcpListener, TcpStream};
use std::process::ExitCode;
use std::time::{Duration, Instant};

use clap::Parser;
use hdrhistogram::Histogram;
use rverbs_core::datagram::{memory_needed, Datagram, DatagramConfig, Peer};
use rverbs_core::memory::PageMemory;
use rverbs_core::provider::datagram::DatagramProvider;
use rverbs_core::provider::verbs_ud::VerbsDatagram;
use rverbs_core::verbs::{open_device, AccessFlags, AddressHandle, OwnedRegion, UdConfig};
use rverbs_core::wire::DatagramEndpoint;
use rverbs_std_shim::MONOTONIC;

#[derive(Parser, Debug)]
#[command(about = "Datagram ping-pong latency (like ibv_ud_pingpong)")]
struct Args {
    /// The server to connect to; without it, be the server.
    server: Option<String>,
    /// RDMA device.
    #[arg(long, default_value = "rxe0")]
    device: String,
    /// TCP port for the endpoint exchange.
    #[arg(long, default_value_t = 18525)]
    port: u16,
    /// Payload bytes per datagram (at most the path MTU).
    #[arg(long, default_value_t = 1024)]
    size: usize,
    /// Round trips.
    #[arg(long, default_value_t = 1000)]
    iters: u32,
    /// Largest payload sent inline (the queue pair may grant more).
    #[arg(long, default_value_t = 256)]
    inline: u32,
    /// Ask for a send completion every k-th datagram.
    #[arg(long, default_value_t = 16)]
    signal_every: u32,
    /// Print every iteration's time (nanoseconds) after the summary.
    #[arg(long, hide = true)]
    dump: bool,
}

use rverbs_examples::Res;

fn main() -> ExitCode {
    rverbs_examples::exit_code("ud_pingpong", run(&Args::parse()))
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

/// The bytes of a hex string; an error for anything else (odd length, non-hex characters,
/// whatever the peer sent).
fn unhex(s: &str) -> Res<Vec<u8>> {
    let digit = |c: u8| char::from(c).to_digit(16).ok_or("the endpoint is not hex");
    let b = s.as_bytes();
    if !b.len().is_multiple_of(2) {
        return Err("the endpoint has an odd number of hex digits".into());
    }
    b.chunks_exact(2)
        .map(|p| Ok((digit(p[0])? * 16 + digit(p[1])?) as u8))
        .collect()
}

/// The client sends its endpoint first; the server reads it, makes its address of the
/// client, and only then answers with its own, so that neither side's setup falls inside
/// the timed loop (as `ibv_ud_pingpong` orders it).
fn exchange(
    stream: TcpStream,
    ep: &mut Datagram<VerbsDatagram, OwnedRegion>,
    client: bool,
) -> Res<(DatagramEndpoint, Peer<AddressHandle>)> {
    let mut w = stream.try_clone()?;
    let mut r = BufReader::new(stream);
    let mut read = || -> Res<DatagramEndpoint> {
        let mut line = String::new();
        r.read_line(&mut line)?;
        Ok(DatagramEndpoint::decode(&unhex(line.trim())?)?)
    };
    let mine = hex(&ep.endpoint().encode());
    if client {
        writeln!(w, "{mine}")?;
        let theirs = read()?;
        Ok((theirs, ep.peer(&theirs)?))
    } else {
        let theirs = read()?;
        let to = ep.peer(&theirs)?;
        writeln!(w, "{mine}")?;
        Ok((theirs, to))
    }
}

fn run(args: &Args) -> Res<()> {
    let ctx = open_device(&args.device)?;
    let pd = ctx.alloc_pd()?;
    let mut ud = UdConfig::default();
    ud.max_inline_data = args.inline;
    let qp = VerbsDatagram::new(&ctx, &pd, &ud)?;
    let mtu = qp.mtu();
    if args.size > mtu as usize {
        return Err(format!("--size {} is larger than the path MTU ({mtu})", args.size).into());
    }
    let mut cfg = DatagramConfig::default();
    cfg.timeout = Duration::from_secs(30);
    cfg.signal_every = args.signal_every;
    let mem = PageMemory::zeroed(memory_needed(mtu, &cfg)).ok_or("cannot allocate")?;
    let mem = pd.register_shared(mem, AccessFlags::LOCAL_WRITE)?;
    let mut ep = Datagram::new(qp, mem, cfg, &MONOTONIC)?;
    let stream = match &args.server {
        Some(host) => TcpStream::connect((host.as_str(), args.port))?,
        None => TcpListener::bind(("0.0.0.0", args.port))?.accept()?.0,
    };
    let (theirs, to) = exchange(stream, &mut ep, args.server.is_some())?;
    let payload: Vec<u8> = (0..args.size).map(|i| (i * 7) as u8).collect();
    let mut hist = Histogram::<u64>::new_with_bounds(1, 60_000_000_000, 3)?;
    let client = args.server.is_some();
    // As ibv_ud_pingpong does, the client posts its first datagram before the clock starts;
    // an iteration then ends with the receipt of an answer (client) or of a datagram and the
    // posting of the answer (server).
    if client {
        ep.send(&to, &payload)?;
    }
    let t0 = Instant::now();
    let mut last = t0;
    let mut times = Vec::with_capacity(args.iters as usize);
    let mut foreign = 0u64;
    for i in 0..args.iters {
        // Anybody may send to this queue pair: datagrams from others are counted and
        // ignored.
        loop {
            let d = ep.recv()?;
            if d.source.qpn == theirs.qpn && d.source.gid == theirs.gid {
                if client && d.payload != payload {
                    return Err(format!("round trip {i}: the answer differs").into());
                }
                if d.payload.len() != args.size {
                    return Err(format!("round trip {i}: a datagram of the wrong size").into());
                }
                break;
            }
            foreign += 1;
        }
        if !client || i + 1 < args.iters {
            ep.send(&to, &payload)?;
        }
        let now = Instant::now();
        hist.saturating_record((now - last).as_nanos().max(1) as u64);
        times.push((now - last).as_nanos() as u64);
        last = now;
    }
    let us = t0.elapsed().as_secs_f64() * 1e6;
    // The last answer must leave before the endpoint is dropped (which flushes).
    ep.wait_sent()?;
    let s = ep.stats();
    let q = |q: f64| hist.value_at_quantile(q) as f64 / 1000.0;
    println!(
        "ud_pingpong: size={} iters={} usec_per_iter={:.2} p50_us={:.2} p99_us={:.2} max_us={:.2} inline={} sent={} received={} foreign={foreign}",
        args.size,
        args.iters,
        us / f64::from(args.iters),
        q(0.5),
        q(0.99),
        hist.max() as f64 / 1000.0,
        s.sent_inline == s.sent,
        s.sent,
        s.received
    );
    if args.dump {
        println!("{times:?}");
    }
    Ok(())
}
