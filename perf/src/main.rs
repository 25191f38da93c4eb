//! `rverbs-perf`: perftest's tests written against rverbs, with perftest's flags, method
//! and columns, so that the two can be run side by side on the same device and compared.
//!
//! ```text
//! rverbs-perf write_lat -d mlx5_0 -s 8 -n 10000            # server: waits on -p (18515)
//! rverbs-perf write_lat -d mlx5_0 -s 8 -n 10000 server-host   # client
//! ```
//!
//! Tests: `write_lat`, `send_lat`, `read_lat`, `atomic_lat`, `write_bw`, `send_bw`,
//! `read_bw`. Flags as perftest's: `-d` device, `-i` port, `-x` GID index (automatic when
//! omitted), `-s` size, `-n` iterations, `-l` requests per post (doorbell), `-I` inline
//! size, `-Q` a completion every N requests, `-m` path MTU, `-t` send queue depth, `-p` TCP
//! port; `--json` prints one JSON object instead of the table; `--hw-timestamps` takes
//! write, read and atomic latency from the device's completion timestamps (refused at
//! setup on a device without them, such as rxe).
//!
//! Method (as perftest's, see `docs/benchmarks.md`): latency is taken between consecutive
//! posts; write and send report half the round trip, read and atomics the full round trip;
//! write latency spins on the last byte of the buffer the peer writes. Bandwidth runs keep
//! at most `-t` requests outstanding, post `-l` per doorbell, and report the best window
//! (peak) and the whole run (average, message rate) from the client's side.
#![allow(clippy::std_instead_of_core)] // a std program

mod bw;
mod lat;
mod link;
mod report;
mod session;

use std::process::ExitCode;

use clap::{Parser, ValueEnum};

pub(crate) type Res<T> = Result<T, Box<dyn std::error::Error>>;

/// The tests.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub(crate) enum Test {
    /// RDMA write ping-pong, each side spinning on the last byte (RTT/2).
    #[value(name = "write_lat")]
    WriteLat,
    /// Send/receive ping-pong (RTT/2).
    #[value(name = "send_lat")]
    SendLat,
    /// One RDMA read at a time (full round trip).
    #[value(name = "read_lat")]
    ReadLat,
    /// One 8-byte fetch-and-add at a time (full round trip).
    #[value(name = "atomic_lat")]
    AtomicLat,
    /// RDMA write stream from the client.
    #[value(name = "write_bw")]
    WriteBw,
    /// Send stream from the client into the server's receives.
    #[value(name = "send_bw")]
    SendBw,
    /// RDMA read stream by the client.
    #[value(name = "read_bw")]
    ReadBw,
}

impl Test {
    pub(crate) fn name(self) -> &'static str {
        match self {
            Self::WriteLat => "write_lat",
            Self::SendLat => "send_lat",
            Self::ReadLat => "read_lat",
            Self::AtomicLat => "atomic_lat",
            Self::WriteBw => "write_bw",
            Self::SendBw => "send_bw",
            Self::ReadBw => "read_bw",
        }
    }

    pub(crate) fn is_bw(self) -> bool {
        matches!(self, Self::WriteBw | Self::SendBw | Self::ReadBw)
    }

    /// Whether the peer receives sends (and so needs receives posted).
    pub(crate) fn is_send(self) -> bool {
        matches!(self, Self::SendLat | Self::SendBw)
    }
}

/// Command line, in perftest's vocabulary.
#[derive(Parser, Debug, Clone)]
#[command(
    name = "rverbs-perf",
    about = "perftest's latency and bandwidth tests, written against rverbs",
    after_help = "Run the same command on both machines; give the client the server's address."
)]
pub(crate) struct Args {
    /// The test to run.
    pub(crate) test: Test,
    /// The server's address; without it, be the server.
    pub(crate) server: Option<String>,
    /// RDMA device (default: the first one).
    #[arg(short = 'd', long = "ib-dev")]
    pub(crate) device: Option<String>,
    /// Device port.
    #[arg(short = 'i', long = "ib-port", default_value_t = 1)]
    pub(crate) ib_port: u8,
    /// Source GID index (default: chosen automatically, RoCE v2 with an IPv4 address first).
    #[arg(short = 'x', long = "gid-index")]
    pub(crate) gid_index: Option<u8>,
    /// Message size in bytes (default 2 for latency tests, 65536 for bandwidth; atomics 8).
    #[arg(short = 's', long = "size")]
    pub(crate) size: Option<usize>,
    /// Iterations (default 1000; write_bw 5000).
    #[arg(short = 'n', long = "iters")]
    pub(crate) iters: Option<u64>,
    /// Requests per post: one doorbell for this many requests (bandwidth tests).
    #[arg(short = 'l', long = "post_list", default_value_t = 1)]
    pub(crate) post_list: u32,
    /// Largest message sent inline (default 220 for write_lat, 236 for send_lat, else 0).
    #[arg(short = 'I', long = "inline_size")]
    pub(crate) inline: Option<u32>,
    /// Ask for a completion every N requests (default 1 for latency tests, 100 for
    /// bandwidth tests, or the post list when -l is above 1).
    #[arg(short = 'Q', long = "cq-mod")]
    pub(crate) cq_mod: Option<u32>,
    /// Path MTU in bytes (256 to 4096; default: the port's active MTU).
    #[arg(short = 'm', long = "mtu")]
    pub(crate) mtu: Option<u32>,
    /// Most requests outstanding (default 128 for bandwidth tests, 1 for latency tests).
    #[arg(short = 't', long = "tx-depth")]
    pub(crate) tx_depth: Option<u32>,
    /// Receives the server keeps posted in send tests (at most 512).
    #[arg(short = 'r', long = "rx-depth", default_value_t = 512)]
    pub(crate) rx_depth: u32,
    /// Bandwidth tests: time only the whole run (from before the first post to after the
    /// last completion) and report no peak, as perftest's `-N`. perftest turns this on by
    /// itself above 20000 iterations; so does rverbs-perf.
    #[arg(short = 'N', long = "noPeak")]
    pub(crate) no_peak: bool,
    /// TCP port of the server.
    #[arg(short = 'p', long = "port", default_value_t = 18515)]
    pub(crate) port: u16,
    /// Print one JSON object (settings and results) instead of the table.
    #[arg(long)]
    pub(crate) json: bool,
    /// Latency from the device's completion timestamps (the time between consecutive
    /// completions of the requests waited for, as the device's clock saw them) instead of
    /// the CPU's clock at each post. For write_lat, read_lat and atomic_lat; a device
    /// without a completion clock (rxe, siw) refuses at setup.
    #[arg(long = "hw-timestamps")]
    pub(crate) hw_timestamps: bool,
}

/// The settings after perftest's defaults were applied.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Plan {
    pub(crate) test: Test,
    pub(crate) size: usize,
    pub(crate) iters: u64,
    pub(crate) post_list: u32,
    pub(crate) inline: u32,
    pub(crate) cq_mod: u32,
    pub(crate) tx_depth: u32,
    pub(crate) rx_depth: u32,
    /// Latency from completion timestamps (`--hw-timestamps`).
    pub(crate) hw_timestamps: bool,
    /// Bandwidth: no per-request stamps, no peak (`-N`, or more than [`NO_PEAK_ABOVE`]
    /// iterations).
    pub(crate) no_peak: bool,
}

/// Above this many iterations a bandwidth test stamps only the start and the end of the run
/// and reports no peak, as perftest does (its `noPeak` turns on by itself past 20000
/// iterations): the same measurement, with none of the per-request clock reads that
/// perftest does not make either.
pub(crate) const NO_PEAK_ABOVE: u64 = 20_000;

impl Args {
    /// perftest's defaults for what was not given, and its consistency checks.
    pub(crate) fn plan(&self) -> Res<Plan> {
        let t = self.test;
        let size = match (t, self.size) {
            (Test::AtomicLat, Some(s)) if s != 8 => {
                return Err("atomics are 8 bytes: -s cannot be changed for atomic_lat".into())
            }
            (Test::AtomicLat, _) => 8,
            (_, Some(0)) => return Err("-s must be at least 1".into()),
            (_, Some(s)) => s,
            (t, None) if t.is_bw() => 65536,
            (_, None) => 2,
        };
        if size > u32::MAX as usize {
            return Err("-s must fit one scatter entry (below 4 GiB)".into());
        }
        let iters = self
            .iters
            .unwrap_or(if t == Test::WriteBw { 5000 } else { 1000 });
        if iters < 5 {
            return Err("-n must be at least 5".into());
        }
        let post_list = self.post_list;
        if post_list == 0 || post_list as usize > rverbs_core::wr::MAX_BATCH {
            return Err(format!("-l must be 1 to {}", rverbs_core::wr::MAX_BATCH).into());
        }
        if post_list > 1 && !t.is_bw() {
            return Err("-l is for bandwidth tests".into());
        }
        if !iters.is_multiple_of(u64::from(post_list)) {
            return Err("-n must be a multiple of -l".into());
        }
        let inline = self.inline.unwrap_or(match t {
            Test::WriteLat => 220,
            Test::SendLat => 236,
            _ => 0,
        });
        let inline = if matches!(t, Test::ReadLat | Test::ReadBw | Test::AtomicLat) {
            0
        } else {
            inline
        };
        let tx_depth = self.tx_depth.unwrap_or(if t.is_bw() { 128 } else { 1 });
        if tx_depth == 0 || tx_depth < post_list {
            return Err("-t must be at least -l".into());
        }
        let cq_mod = match self.cq_mod {
            Some(0) => return Err("-Q must be at least 1".into()),
            Some(q) => q,
            None if !t.is_bw() => 1,
            None if post_list > 1 => post_list,
            // perftest signals every request of large messages unless told otherwise.
            None if size > 8192 => 1,
            None => 100,
        }
        .min(tx_depth);
        if post_list > 1 && !post_list.is_multiple_of(cq_mod) {
            return Err("-l must be a multiple of -Q".into());
        }
        let rx_depth = self.rx_depth.clamp(1, session::MAX_RX as u32);
        if self.hw_timestamps && !matches!(t, Test::WriteLat | Test::ReadLat | Test::AtomicLat) {
            return Err(
                "--hw-timestamps is for write_lat, read_lat and atomic_lat (the tests \
                        that wait for every request)"
                    .into(),
            );
        }
        Ok(Plan {
            test: t,
            size,
            iters,
            post_list,
            inline,
            cq_mod,
            tx_depth,
            rx_depth,
            hw_timestamps: self.hw_timestamps,
            no_peak: t.is_bw() && (self.no_peak || iters > NO_PEAK_ABOVE),
        })
    }
}

fn main() -> ExitCode {
    let args = Args::parse();
    match run(&args) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("rverbs-perf {}: {e}", args.test.name());
            ExitCode::FAILURE
        }
    }
}

fn run(args: &Args) -> Res<()> {
    let plan = args.plan()?;
    let mut s = session::Session::open(args, &plan)?;
    if !args.json {
        s.print_header();
    }
    let result = match plan.test {
        Test::WriteLat => lat::write_lat(&mut s)?.map(Outcome::Lat),
        Test::SendLat => lat::send_lat(&mut s)?.map(Outcome::Lat),
        Test::ReadLat => lat::read_lat(&mut s)?.map(Outcome::Lat),
        Test::AtomicLat => lat::atomic_lat(&mut s)?.map(Outcome::Lat),
        Test::WriteBw | Test::SendBw | Test::ReadBw => bw::run(&mut s)?.map(Outcome::Bw),
    };
    s.finish()?;
    match (&result, args.json) {
        (None, false) => println!(" (this side only serves; the client reports)"),
        (None, true) => println!("{}", s.json(serde_json::Value::Null)),
        (Some(Outcome::Lat(r)), false) => print_table(report::LatReport::header(), &r.line()),
        (Some(Outcome::Bw(r)), false) => print_table(report::BwReport::header(), &r.line()),
        (Some(Outcome::Lat(r)), true) => println!("{}", s.json(serde_json::to_value(r)?)),
        (Some(Outcome::Bw(r)), true) => println!("{}", s.json(serde_json::to_value(r)?)),
    }
    Ok(())
}

/// What a side measured: the client measures every test, the server of a ping-pong too
/// (as perftest's does); the passive server of the other tests measures nothing.
enum Outcome {
    Lat(report::LatReport),
    Bw(report::BwReport),
}

const LINE: &str =
    "---------------------------------------------------------------------------------------";

fn print_table(header: &str, line: &str) {
    println!("{LINE}");
    println!("{header}");
    println!("{line}");
    println!("{LINE}");
}

#[cfg(test)]
mod tests {
    use super::*;

    fn plan(cmd: &str) -> Res<Plan> {
        Args::parse_from(cmd.split_whitespace()).plan()
    }

    #[test]
    fn each_test_gets_the_perftest_default_size_iterations_inline_and_cq_moderation() {
        let p = plan("rverbs-perf write_lat").unwrap();
        assert_eq!((p.size, p.iters, p.inline, p.cq_mod), (2, 1000, 220, 1));
        let p = plan("rverbs-perf send_lat -s 8").unwrap();
        assert_eq!((p.size, p.inline), (8, 236));
        let p = plan("rverbs-perf read_lat -I 64").unwrap();
        assert_eq!(p.inline, 0, "reads carry no payload to inline");
        let p = plan("rverbs-perf write_bw 10.0.0.1").unwrap();
        assert_eq!(
            (p.size, p.iters, p.tx_depth, p.cq_mod),
            (65536, 5000, 128, 1)
        );
        let p = plan("rverbs-perf write_bw -s 64 -n 3200 -l 32").unwrap();
        assert_eq!((p.post_list, p.cq_mod), (32, 32));
        let p = plan("rverbs-perf send_bw -s 64").unwrap();
        assert_eq!(p.cq_mod, 100);
        assert_eq!(plan("rverbs-perf atomic_lat").unwrap().size, 8);
    }

    #[test]
    fn bandwidth_tests_drop_the_peak_past_20000_iterations_or_with_n_as_perftest() {
        let no_peak = |cmd: &str| plan(cmd).unwrap().no_peak;
        assert!(!no_peak("rverbs-perf write_bw -s 64 -n 20000"));
        assert!(no_peak("rverbs-perf write_bw -s 64 -n 20001"));
        assert!(no_peak("rverbs-perf send_bw -s 64 -n 32000 -l 32"));
        assert!(no_peak("rverbs-perf read_bw -N"));
        assert!(
            !no_peak("rverbs-perf send_lat -n 32000"),
            "latency has no peak to drop"
        );
    }

    #[test]
    fn impossible_settings_are_refused_but_read_lat_accepts_hw_timestamps() {
        assert!(plan("rverbs-perf atomic_lat -s 16").is_err());
        assert!(plan("rverbs-perf write_bw -n 100 -l 32").is_err());
        assert!(plan("rverbs-perf write_lat -l 4").is_err());
        assert!(plan("rverbs-perf write_bw -l 32 -Q 5 -n 3200").is_err());
        assert!(plan("rverbs-perf write_bw -l 65 -n 6500").is_err());
        assert!(plan("rverbs-perf write_lat -s 0").is_err());
        assert!(plan("rverbs-perf send_lat --hw-timestamps").is_err());
        assert!(plan("rverbs-perf write_bw --hw-timestamps").is_err());
        assert!(
            plan("rverbs-perf read_lat --hw-timestamps")
                .unwrap()
                .hw_timestamps
        );
    }
}
