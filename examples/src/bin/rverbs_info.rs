//! rverbs-info: what the RDMA devices of this host look like to rverbs, and what they say.
//!
//! ```text
//! rverbs-info                       every device: ports (state, MTU, link layer), GIDs and
//!                                   the non-zero port counters
//! rverbs-info --events [--secs N]   print the devices' asynchronous events as they happen
//!                                   (port down / active, GID change, queue pair fatal, ...)
//!                                   for N seconds (default 60), then the counters that grew
//! ```
//!
//! `--device NAME` limits either to one device. Counters come from sysfs
//! (`rverbs_std_shim::counters`), events from `rverbs_core::verbs::AsyncEvents`.
#![allow(clippy::std_instead_of_core)]

use std::process::ExitCode;
use std::time::{Duration, Instant};

use clap::Parser;
use rverbs_core::verbs::{AsyncEvents, Context, DeviceList};
use rverbs_std_shim::counters::{PortCounters, SYSFS_INFINIBAND};
use rverbs_std_shim::readable::wait_readable;

#[derive(Parser, Debug)]
#[command(
    name = "rverbs-info",
    about = "RDMA devices, ports, GIDs, counters and asynchronous events"
)]
struct Args {
    /// Only this device (e.g. rxe0, mlx5_0).
    #[arg(long)]
    device: Option<String>,
    /// Print asynchronous events as they happen instead of the device summary.
    #[arg(long)]
    events: bool,
    /// With --events: how long to watch.
    #[arg(long, default_value_t = 60)]
    secs: u64,
}

use rverbs_examples::Res;

fn ports(ctx: &Context) -> Res<u8> {
    Ok(ctx.query_device()?.phys_port_cnt)
}

fn summary(ctx: &Context) -> Res<()> {
    let name = ctx.name().to_owned();
    println!("{name}");
    for p in 1..=ports(ctx)? {
        let a = ctx.query_port(p)?;
        println!(
            "  port {p}: {} (state {}), active MTU {} of {}, {:?}",
            if a.active { "ACTIVE" } else { "not active" },
            a.state,
            a.active_mtu.bytes(),
            a.max_mtu.bytes(),
            a.link_layer
        );
        for g in ctx.gid_table(p)? {
            let g = g?;
            println!("    gid {:>3}: {} {:?}", g.index, g.gid, g.kind);
        }
        match PortCounters::read(SYSFS_INFINIBAND.as_ref(), &name, p) {
            Ok(c) => {
                for (n, v) in c.values.iter().filter(|(_, v)| *v != 0) {
                    println!("    {n} = {v}");
                }
            }
            Err(e) => println!("    counters: {e}"),
        }
    }
    Ok(())
}

fn watch(ctxs: &[Context], secs: u64) -> Res<()> {
    let streams: Vec<(String, AsyncEvents)> = ctxs
        .iter()
        .map(|c| Ok((c.name().to_owned(), c.async_events()?)))
        .collect::<Res<_>>()?;
    let before: Vec<Vec<PortCounters>> = ctxs
        .iter()
        .map(|c| {
            (1..=ports(c).unwrap_or(1))
                .map(|p| {
                    PortCounters::read(SYSFS_INFINIBAND.as_ref(), c.name(), p).unwrap_or_default()
                })
                .collect()
        })
        .collect();
    let start = Instant::now();
    let end = start + Duration::from_secs(secs);
    eprintln!(
        "rverbs-info: watching {} device(s) for {secs} s",
        streams.len()
    );
    while Instant::now() < end {
        // One descriptor per device; a short sleep on each keeps every device's latency within
        // the slice (a handful of devices at most).
        let slice =
            Duration::from_millis(50 / streams.len().max(1) as u64).max(Duration::from_millis(1));
        for (name, s) in &streams {
            if !wait_readable(s.fd(), slice)? {
                continue;
            }
            while let Some(e) = s.poll()? {
                println!("{:>10.3} s  {name}: {e}", start.elapsed().as_secs_f64());
            }
        }
    }
    for (c, before) in ctxs.iter().zip(before) {
        for (i, b) in before.iter().enumerate() {
            let p = i as u8 + 1;
            let now =
                PortCounters::read(SYSFS_INFINIBAND.as_ref(), c.name(), p).unwrap_or_default();
            for (n, d) in now.since(b) {
                println!("{} port {p}: {n} +{d}", c.name());
            }
        }
    }
    Ok(())
}

fn run(args: &Args) -> Res<()> {
    let list = DeviceList::new()?;
    let ctxs: Vec<Context> = list
        .iter()
        .filter(|d| args.device.as_deref().is_none_or(|n| n == d.name()))
        .map(|d| d.open())
        .collect::<Result<_, _>>()?;
    if ctxs.is_empty() {
        return Err(match &args.device {
            Some(d) => format!("no RDMA device named {d}").into(),
            None => "no RDMA devices".into(),
        });
    }
    if args.events {
        return watch(&ctxs, args.secs);
    }
    for c in &ctxs {
        summary(c)?;
    }
    Ok(())
}

fn main() -> ExitCode {
    rverbs_examples::exit_code("rverbs-info", run(&Args::parse()))
}
