//! `async_pingpong`: rverbs-async under tokio. Two queue pairs of one device, connected to
//! each other, each driven by its own tokio task: the client sends a message and awaits the
//! reply, the server awaits a message and sends it back. Receives stay posted in a ring the
//! ring owns (`AsyncRing`), sends are inline (copied at post time), so no future ever holds
//! memory the NIC touches. A waiting task sleeps on its queue pair's completion channel
//! (`TokioEvents`, tokio's reactor) until the NIC wakes it, with the channel's timeout as a
//! tokio timer. `--busy` re-polls on every turn instead, for comparison.
//!
//! ```sh
//! cargo build --release -p rverbs-examples --bin async_pingpong
//! tools/rxe-vm --devices 1 -- target/release/async_pingpong --device rxe0 --iters 2000
//! ```
#![allow(clippy::std_instead_of_core)] // a std program

use std::process::ExitCode;
use std::time::{Duration, Instant};

use clap::Parser;
use rverbs_async::{AsyncRing, Events, TokioEvents, YieldEvents};
use rverbs_core::channel::{Channel, ChannelConfig, RecvRing};
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
    /// Re-poll on every turn (`YieldEvents`) instead of sleeping on the completion channel:
    /// a busy-polling task, for comparison.
    #[arg(long)]
    busy: bool,
}

fn main() -> ExitCode {
    let args = Args::parse();
    let r = if args.busy {
        run(&args, |_| Ok(YieldEvents))
    } else {
        run(&args, |p| {
            TokioEvents::new(p.wakeup_source().expect("queues on a channel"))
        })
    };
    rverbs_examples::exit_code("async_pingpong", r)
}

fn run<E: Events + 'static>(
    args: &Args,
    events: fn(&VerbsProvider) -> std::io::Result<E>,
) -> Result<(), Box<dyn std::error::Error>> {
    let ctx = open_device(&args.device)?;
    let pd = ctx.alloc_pd()?;
    let qp = QpConfig::default();
    // Both queues of each queue pair on a completion channel of their own.
    let a = PreparedVerbs::with_events(&ctx, &pd, &qp)?;
    let b = PreparedVerbs::with_events(&ctx, &pd, &qp)?;
    let (ea, eb) = (a.endpoint(), b.endpoint());
    let (a, b) = (a.handshake(&eb)?, b.handshake(&ea)?);
    let cfg = ChannelConfig::with_timeout(Duration::from_secs(10));
    if args.size > 256 {
        return Err("--size: at most 256 bytes (sent inline)".into());
    }
    // Each side keeps its receives posted in a ring of 16 slots the ring owns, so a message
    // never finds the peer without a receive, and an abandoned receive loses nothing.
    let slots = 16;
    let ring_mem = || {
        pd.register_shared(
            vec![0u8; slots * args.size.max(8)].into_boxed_slice(),
            AccessFlags::LOCAL_WRITE,
        )
    };
    let (cmem, smem) = (ring_mem()?, ring_mem()?);
    let (iters, size) = (args.iters, args.size);

    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let local = tokio::task::LocalSet::new();
    let t0 = Instant::now();
    local.block_on(&rt, async move {
        let ring = |p: VerbsProvider, mem: OwnedRegion| -> Result<_, Box<dyn std::error::Error>> {
            let ev = events(&p)?;
            let ring = RecvRing::new(Channel::new(p, cfg, &MONOTONIC), mem, size.max(8))?;
            Ok(AsyncRing::new(ring, ev))
        };
        let (mut client, mut server) = (ring(a, cmem)?, ring(b, smem)?);
        let server = tokio::task::spawn_local(async move {
            let mut echo = [0u8; 256];
            for _ in 0..iters {
                let n = server
                    .recv_with(|m| {
                        echo[..m.data.len()].copy_from_slice(m.data);
                        m.data.len()
                    })
                    .await?;
                server.send_inline(&echo[..n]).await?;
            }
            Ok::<_, rverbs_async::AsyncError>(())
        });
        let mut msg = [0u8; 256];
        for i in 0..iters {
            let stamp = i.to_le_bytes();
            let k = size.min(8);
            msg[..k].copy_from_slice(&stamp[..k]);
            client.send_inline(&msg[..size]).await?;
            let same = client
                .recv_with(|m| m.data.len() == size && m.data[..k] == stamp[..k])
                .await?;
            if !same {
                return Err(format!("round trip {i}: the echo differs").into());
            }
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
