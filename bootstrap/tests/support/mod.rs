//! What the bootstrap device tests share: the device to run on, and a world of child
//! processes (this same test binary, running its ignored `child_rank` entry point).
#![allow(dead_code, unreachable_pub, clippy::std_instead_of_core)] // test code; not every test uses all of it

use std::process::Command;

use rverbs_bootstrap::{ClusterConfig, RankConfig};
use std::time::{Duration, Instant};

/// The device from `RVERBS_TEST_DEVICE`, or `None` (after saying so) when the test should be
/// skipped; under `CI=true` a missing device fails the test instead.
pub fn device() -> Option<String> {
    match std::env::var("RVERBS_TEST_DEVICE") {
        Ok(d) if !d.is_empty() => Some(d),
        _ => {
            assert!(
                std::env::var("CI").map_or(true, |v| v != "true"),
                "RVERBS_TEST_DEVICE is not set and CI=true: device tests must run on a device"
            );
            eprintln!("SKIPPED: RVERBS_TEST_DEVICE is not set");
            None
        }
    }
}

/// Runs `world` child processes of `scenario` on `dev`, each told its rank, the world size and
/// the bootstrap port through `{prefix}SCENARIO`, `{prefix}RANK`, `{prefix}WORLD` and
/// `{prefix}PORT`; kills any still running after 600 s. Returns what failed and how long the
/// world took.
pub fn run_children(
    prefix: &str,
    scenario: &str,
    world: u32,
    port: u16,
    dev: &str,
) -> (Vec<String>, Duration) {
    let exe = std::env::current_exe().unwrap();
    let start = Instant::now();
    let mut kids: Vec<_> = (0..world)
        .map(|r| {
            Command::new(&exe)
                .args([
                    "--exact",
                    "child_rank",
                    "--ignored",
                    "--nocapture",
                    "--test-threads=1",
                ])
                .env(format!("{prefix}SCENARIO"), scenario)
                .env(format!("{prefix}RANK"), r.to_string())
                .env(format!("{prefix}WORLD"), world.to_string())
                .env(format!("{prefix}PORT"), port.to_string())
                .env("RVERBS_TEST_DEVICE", dev)
                .spawn()
                .unwrap()
        })
        .collect();
    let limit = Duration::from_secs(600);
    let mut failed = Vec::new();
    for (r, k) in kids.iter_mut().enumerate() {
        loop {
            if let Some(st) = k.try_wait().unwrap() {
                if !st.success() {
                    failed.push(format!("rank {r}: {st}"));
                }
                break;
            }
            if start.elapsed() > limit {
                let _ = k.kill();
                failed.push(format!("rank {r}: killed after {limit:?}"));
                break;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
    (failed, start.elapsed())
}

/// A world of `world` ranks on this host, all on device `dev`, rank `r` listening on
/// `port + r`, under the job name `job` (which sets the job id, so worlds of different tests
/// never take each other's connections).
pub fn local_config(world: u32, port: u16, dev: &str, job: String) -> ClusterConfig {
    let ranks = (0..world)
        .map(|r| RankConfig {
            rank: r,
            host: "127.0.0.1".into(),
            port: port + r as u16,
            device: dev.to_owned(),
            ib_port: 1,
            gid_index: None,
            comment: None,
        })
        .collect();
    ClusterConfig::new("test", Some(job), ranks).unwrap()
}
