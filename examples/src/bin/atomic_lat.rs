//! `atomic_lat`: the round-trip latency of one remote atomic, as perftest's `ib_atomic_lat`
//! measures it: one 8-byte fetch-and-add (or compare-and-swap) at a time on one queue pair,
//! each waited for by spinning, the full round trip (an atomic completes only when the
//! responder's reply arrived), `--iters` of them after `--warmup`.
//!
//! The target word is registered on a second queue pair of the same device, connected to the
//! first: the responder side of an atomic runs on the device (or the rxe kernel module) alone,
//! so where its process lives does not change what is measured. `tools/compare-perftest`
//! runs it beside `ib_atomic_lat` in one SoftRoCE VM boot.
#![allow(clippy::std_instead_of_core)] // a std program

use std::process::ExitCode;
use std::time::{Duration, Instant};

use clap::{Parser, ValueEnum};
use hdrhistogram::Histogram;
use rverbs_core::channel::{Channel, ChannelConfig};
use rverbs_core::memory::PageMemory;
use rverbs_core::provider::verbs::PreparedVerbs;
use rverbs_core::verbs::{open_device, AccessFlags, QpConfig};
use rverbs_std_shim::MONOTONIC;

#[derive(Clone, Copy, Debug, ValueEnum)]
enum Op {
    /// Fetch-and-add of 1.
    FetchAndAdd,
    /// Compare-and-swap that always succeeds (compares with the word's current value).
    CmpAndSwap,
}

#[derive(Parser, Debug)]
#[command(about = "Round-trip latency of remote atomics (like ib_atomic_lat)")]
struct Args {
    /// RDMA device.
    #[arg(long, default_value = "rxe0")]
    device: String,
    /// The atomic to measure.
    #[arg(long, value_enum, default_value_t = Op::FetchAndAdd)]
    op: Op,
    /// Measured atomics.
    #[arg(long, default_value_t = 2000)]
    iters: u32,
    /// Atomics before measuring.
    #[arg(long, default_value_t = 200)]
    warmup: u32,
}

use rverbs_examples::Res;

fn main() -> ExitCode {
    rverbs_examples::exit_code("atomic_lat", run(&Args::parse()))
}

fn run(args: &Args) -> Res<()> {
    let ctx = open_device(&args.device)?;
    let pd = ctx.alloc_pd()?;
    let mut cfg = QpConfig::default();
    // First PSNs from the OS, as every std path of rverbs draws them (docs/security.md).
    cfg.send_psn = rverbs_std_shim::PSN_SOURCE;
    let (a, b) = (
        PreparedVerbs::new(&ctx, &pd, &cfg)?,
        PreparedVerbs::new(&ctx, &pd, &cfg)?,
    );
    let (ea, eb) = (a.endpoint(), b.endpoint());
    let timeout = ChannelConfig::with_timeout(Duration::from_secs(10));
    let mut chan = Channel::new(a.handshake(&eb)?, timeout, &MONOTONIC);
    let _responder = b.handshake(&ea)?;
    let page = || PageMemory::zeroed(4096).ok_or("cannot allocate a page");
    let word = pd.register_shared(
        page()?,
        AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_ATOMIC,
    )?;
    let mut result = pd.register_shared(page()?, AccessFlags::LOCAL_WRITE)?;
    let target = word.remote().slice(0, 8).ok_or("page too small")?;
    let mut entry = result.sge_mut(0..8).ok_or("page too small")?;

    let mut hist = Histogram::<u64>::new_with_bounds(1, 60_000_000_000, 3)?;
    let mut current = 0u64;
    for i in 0..args.warmup + args.iters {
        let t0 = Instant::now();
        match args.op {
            Op::FetchAndAdd => chan.fetch_add(&mut entry, target, 1)?,
            Op::CmpAndSwap => chan.compare_swap(&mut entry, target, current, current + 1)?,
        }
        let ns = t0.elapsed().as_nanos() as u64;
        current += 1;
        if i >= args.warmup {
            hist.record(ns.max(1))?;
        }
    }
    let end = word.load_u64(0).ok_or("word out of range")?;
    if end != current {
        return Err(format!("the word is {end} after {current} atomics").into());
    }
    let us = |q: f64| hist.value_at_quantile(q) as f64 / 1000.0;
    println!(
        "atomic_lat: {:?} iters={} p50_us={:.2} p99_us={:.2} min_us={:.2} max_us={:.2}",
        args.op,
        args.iters,
        us(0.5),
        us(0.99),
        hist.min() as f64 / 1000.0,
        hist.max() as f64 / 1000.0
    );
    Ok(())
}
