//! `rdmacm_pingpong`: an RC ping-pong between two processes connected through the RDMA
//! connection manager, by address and port (no TCP exchange, no cluster file).
//!
//! ```text
//! rdmacm_pingpong --listen 192.168.77.1:7471 &      # server: accepts one connection
//! rdmacm_pingpong 192.168.77.1:7471                 # client
//! rdmacm_pingpong --pair 192.168.77.1:7471          # both: starts the server as a child
//! ```
//!
//! In the SoftRoCE VM: `tools/rxe-vm --devices 1 -- target/release/rdmacm_pingpong --pair
//! 192.168.77.1:7471`.
//!
//! Each side offers a window of its memory in the connection's private data. One iteration:
//! the client RDMA-writes `--size` bytes into the server's window and sends the iteration
//! number, in one doorbell; the server checks the bytes when the number arrives (RC delivers
//! the write first) and answers the same way into the client's window. The client prints
//! the round trips' percentiles, then disconnects; the server sees the disconnect and ends.
#![allow(clippy::std_instead_of_core)] // a std program

use std::net::SocketAddr;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use clap::Parser;
use hdrhistogram::Histogram;
use rverbs_core::channel::{Channel, ChannelConfig, RecvRing};
use rverbs_core::cm::{connect, CmConfig, CmError, Connection, Listener};
use rverbs_core::memory::PageMemory;
use rverbs_core::poll::Deadline;
use rverbs_core::sge::RemoteMemory;
use rverbs_core::verbs::{open_device, AccessFlags, OwnedRegion, Pd};
use rverbs_std_shim::{StdBackoff, WaitPolicy, MONOTONIC};

#[derive(Parser, Debug, Clone)]
#[command(about = "RC ping-pong over a connection made by the RDMA connection manager")]
struct Args {
    /// The server's address and port; without it, be the server (see --listen).
    server: Option<SocketAddr>,
    /// Listen on this address and port, accept one connection, and answer it.
    #[arg(long, conflicts_with = "server")]
    listen: Option<SocketAddr>,
    /// Be both: start a server process listening here, and connect to it.
    #[arg(long, conflicts_with_all = ["server", "listen"])]
    pair: Option<SocketAddr>,
    /// RDMA device: must own the address (the connection manager picks the port).
    #[arg(long, default_value = "rxe0")]
    device: String,
    /// Bytes written per iteration (at most 65536).
    #[arg(long, default_value_t = 64)]
    size: usize,
    /// Round trips.
    #[arg(long, default_value_t = 1000)]
    iters: u32,
    /// How waits wait: `spin` on a core of its own, `sleep` (64 spins, then 20 us naps)
    /// where processes outnumber cores, as in the SoftRoCE VM.
    #[arg(long, default_value = "sleep")]
    wait: String,
    /// Keep retrying a refused connect for this long (the server may not listen yet).
    #[arg(long, default_value_t = 5.0)]
    retry_secs: f64,
    /// Bound of every connection manager step and every wait, in seconds.
    #[arg(long, default_value_t = 10.0)]
    timeout_secs: f64,
}

use rverbs_examples::Res;
type Ring = RecvRing<Connection, OwnedRegion, StdBackoff, 64>;

/// The most a write carries, and so the window each side offers.
const WINDOW: usize = 1 << 16;
const SLOT: usize = 64;

fn main() -> ExitCode {
    rverbs_examples::exit_code("rdmacm_pingpong", run(&Args::parse()))
}

fn region(pd: &Pd, len: usize, access: AccessFlags) -> Res<OwnedRegion> {
    let mem = PageMemory::zeroed(len).ok_or("cannot allocate memory")?;
    Ok(pd.register_shared(mem, access)?)
}

/// The byte at offset `k` of the payload of iteration `i`.
fn byte(i: u32, k: usize) -> u8 {
    (i as u8).wrapping_add(k as u8)
}

fn run(args: &Args) -> Res<()> {
    if let Some(at) = args.pair {
        return pair(args, at);
    }
    if args.size == 0 || args.size > WINDOW {
        return Err(format!("--size must be 1..={WINDOW}").into());
    }
    let policy = match args.wait.as_str() {
        "spin" => WaitPolicy::Spin,
        "sleep" => WaitPolicy::default(),
        w => return Err(format!("--wait {w}: spin or sleep").into()),
    };
    let timeout = Duration::from_secs_f64(args.timeout_secs);
    let ctx = open_device(&args.device)?;
    let pd = ctx.alloc_pd()?;
    // The peer writes here; we write from `src`; the ring takes the peer's sends.
    let window = region(
        &pd,
        WINDOW,
        AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE,
    )?;
    let src = region(&pd, WINDOW, AccessFlags::LOCAL_WRITE)?;
    let cfg = CmConfig::with_timeout(timeout).offering(window.remote());
    let t0 = Instant::now();
    let conn = match (args.server, args.listen) {
        (Some(to), _) => connect_retrying(&pd, to, &cfg, Duration::from_secs_f64(args.retry_secs))?,
        (None, Some(at)) => {
            let l = Listener::bind(&pd, at, &cfg, &MONOTONIC)?;
            eprintln!("rdmacm_pingpong: listening on {}", l.local_addr());
            l.accept_until(Deadline::after(&MONOTONIC, Duration::from_secs(600)))?
        }
        (None, None) => return Err("give the server's address, or --listen ADDR:PORT".into()),
    };
    let setup = t0.elapsed();
    let client = args.server.is_some();
    let theirs = conn
        .remote_memory()
        .ok_or("the peer offered no memory (is it rdmacm_pingpong?)")?;
    if theirs.len < args.size as u64 {
        return Err(format!("the peer's window holds {} bytes", theirs.len).into());
    }
    eprintln!(
        "rdmacm_pingpong: connected {} -> {} in {setup:?} (path MTU {:?})",
        conn.local_addr(),
        conn.peer_addr(),
        conn.verbs().path_mtu()
    );
    let chan = Channel::with_backoff(
        conn,
        ChannelConfig::with_timeout(timeout),
        policy.backoff(),
        &MONOTONIC,
    );
    let mut ring: Ring = RecvRing::new(
        chan,
        region(&pd, 16 * SLOT, AccessFlags::LOCAL_WRITE)?,
        SLOT,
    )?;
    let mut hist = Histogram::<u64>::new_with_bounds(1, 60_000_000_000, 3)?;
    let to = theirs
        .slice(0, args.size as u64)
        .ok_or("window too small")?;
    let t0 = Instant::now();
    for i in 0..args.iters {
        let start = Instant::now();
        if client {
            send(&mut ring, &src, to, i, args.size)?;
            expect(&mut ring, &window, i, args.size)?;
        } else {
            expect(&mut ring, &window, i, args.size)?;
            send(&mut ring, &src, to, i, args.size)?;
        }
        hist.record(start.elapsed().as_nanos().max(1) as u64)?;
    }
    let total = t0.elapsed();
    if client {
        let q = |q: f64| hist.value_at_quantile(q) as f64 / 1000.0;
        println!(
            "rdmacm_pingpong: size={} iters={} usec_per_iter={:.2} p50_us={:.2} p90_us={:.2} \
             p99_us={:.2} max_us={:.2} connect_ms={:.2}",
            args.size,
            args.iters,
            total.as_secs_f64() * 1e6 / f64::from(args.iters),
            q(0.5),
            q(0.9),
            q(0.99),
            hist.max() as f64 / 1000.0,
            setup.as_secs_f64() * 1e3
        );
        ring.channel().disconnect()?;
    } else {
        ring.channel()
            .wait_disconnect(Deadline::after(&MONOTONIC, timeout))?;
        eprintln!(
            "rdmacm_pingpong: the client disconnected after {} iterations",
            args.iters
        );
    }
    Ok(())
}

/// Starts a server on `at` (this program with `--listen`) and runs the client against it.
fn pair(args: &Args, at: SocketAddr) -> Res<()> {
    let mut server = std::process::Command::new(std::env::current_exe()?)
        .args(["--listen", &at.to_string(), "--device", &args.device])
        .args([
            "--size",
            &args.size.to_string(),
            "--iters",
            &args.iters.to_string(),
        ])
        .args([
            "--wait",
            &args.wait,
            "--timeout-secs",
            &args.timeout_secs.to_string(),
        ])
        .spawn()?;
    let client = Args {
        server: Some(at),
        pair: None,
        ..args.clone()
    };
    let r = run(&client);
    if r.is_err() {
        // It may be waiting for a connection that will not come.
        let _ = server.kill();
    }
    let status = server.wait()?;
    r?;
    if !status.success() {
        return Err(format!("the server process failed ({status})").into());
    }
    Ok(())
}

/// Connects, retrying while nobody listens yet, until `retry` has passed.
fn connect_retrying(
    pd: &Pd,
    to: SocketAddr,
    cfg: &CmConfig,
    retry: Duration,
) -> Result<Connection, CmError> {
    let until = Instant::now() + retry;
    loop {
        match connect(pd, to, cfg, &MONOTONIC) {
            Err(CmError::Refused { .. }) if Instant::now() < until => {
                std::thread::sleep(Duration::from_millis(100));
            }
            r => return r,
        }
    }
}

/// Writes iteration `i`'s payload into the peer's window and sends `i`, in one doorbell.
fn send(ring: &mut Ring, src: &OwnedRegion, to: RemoteMemory, i: u32, size: usize) -> Res<()> {
    // The previous iteration's write completed (the batch waits), so the source is ours.
    src.write_from(0, &[byte(i, 0)]);
    src.write_from(size - 1, &[byte(i, size - 1)]);
    let sge = [src.sge(0..size).ok_or("bad size")?];
    let seq = i.to_le_bytes();
    let mut batch = ring.channel().batch();
    batch.write(&sge, to)?;
    batch.send_inline(&seq)?;
    batch.run()?;
    Ok(())
}

/// Waits for the peer's iteration `i` and checks what it wrote.
fn expect(ring: &mut Ring, window: &OwnedRegion, i: u32, size: usize) -> Res<()> {
    let m = ring.recv()?;
    if m.data != i.to_le_bytes() {
        return Err(format!("iteration {i}: the peer sent {:?}", m.data).into());
    }
    let (mut first, mut last) = ([0u8], [0u8]);
    window.read_into(0, &mut first);
    window.read_into(size - 1, &mut last);
    if first[0] != byte(i, 0) || last[0] != byte(i, size - 1) {
        return Err(format!("iteration {i}: the peer's write is not there").into());
    }
    Ok(())
}
