//! `async_pingpong`: rverbs-async under tokio. Two queue pairs of one device, connected to
//! each other, each driven by its own tokio task: the client sends a message and awaits the
//! reply, the server awaits a message and sends it back. A waiting task sleeps on its queue
//! pair's completion channel (`TokioEvents`, tokio's reactor) until the NIC wakes it, with the
//! channel's timeout as a tokio timer; every buffer is an owned registration, handed to the
//! operation and handed back with its result.
//!
//! ```sh
//! cargo build --release -p rverbs-examples --bin async_pingpong
//! tools/rxe-vm --devices 1 -- target/release/async_pingpong --device rxe0 --iters 2000
//! ```
#![allow(clippy::std_instead_of_core)] // a std program

use std::process::ExitCode;
use std::time::{Duration, Instant};

use clap::Parser;
use rverbs_async::{AsyncChannel, TokioEvents};
use rverbs_core::channel::{Channel, ChannelConfig};
use rverbs_core::provider::verbs::{PreparedVerbs, VerbsProvider};
use rverbs_core::provider::Provider;
use rverbs_core::verbs::{open_device, AccessFlags, OwnedRegion, QpConfig};
use rverbs_std_shim::MONOTONIC;

/// Ping-pong over two queue pairs of one device with rverbs-async and tokio.
#[derive(Parser, Debug)]
struct Args {
    /// RDMA device (e.g. rxe0, mlx5_0).
    #[arg(long, default_value = "rxe0")]
    device: String,
    /// Round trips.
    #[arg(long, default_value_t = 1000)]
    iters: u64,
    /// Message size in bytes.
    #[arg(long, default_value_t = 64)]
    size: usize,
}

type Chan = AsyncChannel<VerbsProvider, OwnedRegion, TokioEvents>;

fn main() -> ExitCode {
    let args = Args::parse();
    match run(&args) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("async_pingpong: {e}");
            ExitCode::FAILURE
        }
    }
}

fn run(args: &Args) -> Result<(), Box<dyn std::error::Error>> {
    let ctx = open_device(&args.device)?;
    let pd = ctx.alloc_pd()?;
    let qp = QpConfig::default();
    // Both queues of each queue pair on a completion channel of their own.
    let a = PreparedVerbs::with_events(&ctx, &pd, &qp)?;
    let b = PreparedVerbs::with_events(&ctx, &pd, &qp)?;
    let (ea, eb) = (a.endpoint(), b.endpoint());
    let (a, b) = (a.handshake(&eb)?, b.handshake(&ea)?);
    let cfg = ChannelConfig::with_timeout(Duration::from_secs(10));
    let buf = || {
        pd.register_shared(
            vec![0u8; args.size].into_boxed_slice(),
            AccessFlags::LOCAL_WRITE,
        )
    };
    let (cbuf, sbuf) = (buf()?, buf()?);
    let (iters, size) = (args.iters, args.size);

    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let local = tokio::task::LocalSet::new();
    let t0 = Instant::now();
    local.block_on(&rt, async move {
        let chan = |p: VerbsProvider| -> Result<Chan, std::io::Error> {
            let events = TokioEvents::new(p.completion_events().expect("queues on a channel"))?;
            Ok(AsyncChannel::new(Channel::new(p, cfg, &MONOTONIC), events))
        };
        let (mut client, mut server) = (chan(a)?, chan(b)?);
        let server = tokio::task::spawn_local(async move {
            let mut buf = sbuf;
            for _ in 0..iters {
                let (r, b) = server.recv(buf, 0..size).await;
                r?;
                let (r, b) = server.send(b, 0..size).await;
                r?;
                buf = b;
            }
            Ok::<_, rverbs_async::AsyncError>(())
        });
        let mut buf = cbuf;
        for i in 0..iters {
            buf.write_from(0, &i.to_le_bytes()[..size.min(8)]);
            let (r, b) = client.send(buf, 0..size).await;
            r?;
            let (r, b) = client.recv(b, 0..size).await;
            let done = r?;
            let mut echo = [0u8; 8];
            b.read_into(0, &mut echo[..size.min(8)]);
            if done.byte_len as usize != size
                || echo[..size.min(8)] != i.to_le_bytes()[..size.min(8)]
            {
                return Err(format!("round trip {i}: the echo differs").into());
            }
            buf = b;
        }
        server.await??;
        Ok::<_, Box<dyn std::error::Error>>(())
    })?;
    let took = t0.elapsed();
    println!(
        "async_pingpong: {iters} round trips of {size} bytes on {} in {took:.2?}: {:.1} us per round trip",
        args.device,
        took.as_secs_f64() * 1e6 / iters as f64
    );
    Ok(())
}
