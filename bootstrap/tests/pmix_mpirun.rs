//! The PMIx rendezvous under a real PMIx server: Open MPI's `mpirun` starts this test binary
//! N times, each copy running the ignored `child_rank` entry point as one rank of a scenario.
//! No RDMA device is needed: only the rendezvous is under test here (the demo in the VM runs
//! the whole `connect_launch` under mpirun).
//!
//! Needs `mpirun` (Debian `openmpi-bin`, installed by tools/setup). Without it the tests fail,
//! unless `RVERBS_NO_MPIRUN` is set, which CI never does.
#![cfg(feature = "pmix")]
#![allow(clippy::std_instead_of_core, unreachable_pub)] // test code

use rverbs_bootstrap::{ExchangeError, LaunchError};
use std::process::{Command, Output};
use std::time::{Duration, Instant};

use rverbs_bootstrap::pmix::{LauncherEnv, PmixSession, PROTOCOL_VERSION};
use rverbs_bootstrap::{BootstrapError, ExchangeOptions, Launch, NodeBlobs};
use rverbs_core::params::{Mtu, Psn};
use rverbs_core::sge::RemoteMemory;
use rverbs_core::wire::node::{node_blob_len, NodeBlob};
use rverbs_core::wire::Endpoint;

const SCENARIO: &str = "RVERBS_PMIX_SCENARIO";
/// A directory where each rank that passed leaves a file named after its rank.
const PASSED_DIR: &str = "RVERBS_PMIX_PASSED_DIR";

/// How long one mpirun world may take before coreutils' `timeout` ends it.
const WORLD_LIMIT_SECS: u32 = 180;

/// Runs `world` ranks of `scenario` under mpirun (bounded by [`WORLD_LIMIT_SECS`]); `None`
/// (after saying so) when mpirun is missing and `RVERBS_NO_MPIRUN` allows skipping.
fn mpirun(world: u32, scenario: &str, passed: &std::path::Path) -> Option<(Output, Duration)> {
    if let Err(e) = Command::new("mpirun").arg("--version").output() {
        assert!(
            std::env::var_os("RVERBS_NO_MPIRUN").is_some(),
            "cannot run mpirun (install openmpi-bin, see tools/setup): {e}"
        );
        eprintln!("SKIPPED: cannot run mpirun: {e}");
        return None;
    }
    let exe = std::env::current_exe().unwrap();
    let start = Instant::now();
    let out = Command::new("timeout")
        .args(["--kill-after=10", &WORLD_LIMIT_SECS.to_string(), "mpirun"])
        .args([
            "--allow-run-as-root",
            "--oversubscribe",
            "--bind-to",
            "none",
        ])
        .args(["-n", &world.to_string()])
        .args(["-x", SCENARIO, "-x", PASSED_DIR])
        .arg(exe)
        .args(["--exact", "child_rank", "--ignored", "--nocapture"])
        .args(["--test-threads=1"])
        .env(SCENARIO, scenario)
        .env(PASSED_DIR, passed)
        .output()
        .expect("coreutils timeout runs");
    Some((out, start.elapsed()))
}

fn assert_world_ok(world: u32, scenario: &str) {
    let passed =
        std::env::temp_dir().join(format!("rverbs-pmix-{scenario}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&passed);
    std::fs::create_dir_all(&passed).unwrap();
    let Some((out, took)) = mpirun(world, scenario, &passed) else {
        return;
    };
    let stderr = String::from_utf8_lossy(&out.stderr);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{scenario} with {world} ranks failed: {}\n{stdout}\n{stderr}",
        out.status
    );
    // Every rank ran its part to the end (mpirun's status alone would also pass a world in
    // which the child test was filtered out everywhere).
    let mut ranks: Vec<String> = std::fs::read_dir(&passed)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    ranks.sort();
    let want: Vec<String> = (0..world).map(|r| r.to_string()).collect();
    assert_eq!(ranks, want, "{stdout}\n{stderr}");
    let _ = std::fs::remove_dir_all(&passed);
    eprintln!("{scenario}: {world} ranks in {took:?}");
}

#[test]
fn exchange_and_allgather_4_ranks() {
    assert_world_ok(4, "exchange");
}

#[test]
fn personalized_node_blobs_3_ranks() {
    assert_world_ok(3, "node_blobs");
}

#[test]
fn a_rank_that_never_reaches_the_fence_is_named() {
    assert_world_ok(3, "late");
}

#[test]
fn ranks_of_another_protocol_version_are_named() {
    assert_world_ok(2, "version");
}

/// Open MPI's variables without its PMIx server: a launcher that serves no PMIx.
#[test]
fn a_launcher_without_pmix_is_named() {
    let exe = std::env::current_exe().unwrap();
    let out = Command::new(exe)
        .args(["--exact", "child_rank", "--ignored", "--nocapture"])
        .env(SCENARIO, "no_pmix")
        .env("OMPI_COMM_WORLD_RANK", "1")
        .env("OMPI_COMM_WORLD_SIZE", "2")
        .env_remove("PMIX_NAMESPACE")
        .env_remove("PMIX_RANK")
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// One rank of a scenario; run by `mpirun` through the tests above, ignored otherwise.
#[test]
#[ignore = "run by the tests above, one copy per rank"]
fn child_rank() {
    let scenario = std::env::var(SCENARIO).expect("run through mpirun by the tests above");
    match scenario.as_str() {
        "exchange" => exchange(),
        "node_blobs" => node_blobs(),
        "late" => late(),
        "version" => version(),
        "no_pmix" => no_pmix(),
        other => panic!("unknown scenario {other}"),
    }
    if let Some(dir) = std::env::var_os(PASSED_DIR) {
        let rank = std::env::var("OMPI_COMM_WORLD_RANK").unwrap();
        std::fs::write(std::path::Path::new(&dir).join(rank), b"").unwrap();
    }
}

fn options(timeout: Duration) -> ExchangeOptions {
    ExchangeOptions {
        timeout,
        ..ExchangeOptions::default()
    }
}

fn init(timeout: Duration) -> PmixSession {
    PmixSession::init(&options(timeout)).unwrap_or_else(|e| panic!("{e}"))
}

fn exchange() {
    let env = LauncherEnv::detect();
    assert!(env.serves_pmix(), "{env:?}");
    assert!(matches!(Launch::detect(None, None), Ok(Launch::Pmix(_))));
    let mut s = init(Duration::from_secs(60));
    let (rank, world) = (s.rank(), s.world_size());
    assert_eq!(world, 4);
    // The launcher's own view agrees with PMIx's.
    let ompi_rank: u32 = std::env::var("OMPI_COMM_WORLD_RANK")
        .unwrap()
        .parse()
        .unwrap();
    assert_eq!(rank, ompi_rank);
    assert_eq!(s.local_size(), 4, "one host");
    assert!(s.local_rank() < 4);
    // Blobs of different lengths, one of them empty.
    let blob = |r: u32| vec![r as u8; (r as usize) * 100];
    let got = s.exchange(&blob(rank), None).unwrap();
    assert_eq!(got.len(), world as usize);
    for (r, b) in got.iter().enumerate() {
        assert_eq!(b, &blob(r as u32), "rank {rank}: blob of rank {r}");
    }
    for round in 0..3u8 {
        let mine = [round, rank as u8, 0xa5];
        let all = s.allgather(&mine).unwrap();
        for (r, b) in all.iter().enumerate() {
            assert_eq!(b, &[round, r as u8, 0xa5], "rank {rank} round {round}");
        }
    }
    // Over the blob limit: refused locally, the session stays usable.
    let big = vec![0u8; s.options().max_blob_size + 1];
    assert!(matches!(
        s.allgather(&big),
        Err(BootstrapError::Exchange(ExchangeError::BlobTooLarge { .. }))
    ));
    assert_eq!(s.allgather(b"end").unwrap().len(), 4);
    s.close().unwrap();
}

fn node_blob(rank: u32, world: u32) -> Vec<u8> {
    let mut out = vec![0; node_blob_len(world)];
    let endpoint = |peer: u32| Endpoint {
        qpn: rank * 16 + peer,
        psn: Psn::new(peer).unwrap(),
        lid: 1,
        gid: [0; 16],
        global: false,
        mtu: Mtu::B1024,
    };
    let flags = RemoteMemory {
        addr: 4096 * u64::from(rank + 1),
        len: 8 * u64::from(world),
        rkey: rank,
    };
    NodeBlob::encode_into(&mut out, rank, world, endpoint, flags, flags).unwrap();
    out
}

fn node_blobs() {
    let mut s = init(Duration::from_secs(60));
    let (rank, world) = (s.rank(), s.world_size());
    let got = s
        .exchange(&node_blob(rank, world), Some(&NodeBlobs))
        .unwrap();
    assert_eq!(got[rank as usize], node_blob(rank, world));
    for (r, b) in got.iter().enumerate() {
        let r = r as u32;
        if r == rank {
            continue;
        }
        // Only the addressed form for this rank is kept: 96 bytes, the endpoint rank `r`
        // made for us.
        let d = NodeBlob::decode(b).unwrap();
        assert_eq!((d.rank, d.addressee()), (r, Some(rank)));
        assert_eq!(d.endpoint_for(rank).map(|e| e.qpn), Some(r * 16 + rank));
    }
}

fn late() {
    let rank: u32 = std::env::var("OMPI_COMM_WORLD_RANK")
        .unwrap()
        .parse()
        .unwrap();
    let mut s = init(Duration::from_secs(2));
    if rank == 2 {
        // Never reaches the fence: outlives the others' timeout and diagnosis, then leaves
        // (finalizing PMIx, so that mpirun sees an orderly exit).
        std::thread::sleep(Duration::from_secs(8));
        return;
    }
    let t = Instant::now();
    let err = s.allgather(b"x").unwrap_err();
    let waited = t.elapsed();
    let text = err.to_string();
    eprintln!("rank {rank}: {text}");
    match &err {
        BootstrapError::Exchange(ExchangeError::Timeout {
            rank: r, missing, ..
        }) => {
            assert_eq!(*r, rank);
            assert_eq!(missing, &[2], "{text}");
        }
        other => panic!("rank {rank}: expected a timeout, got {other:?}"),
    }
    assert!(text.contains("Open MPI mpirun (PMIx namespace "), "{text}");
    assert!(waited < Duration::from_secs(7), "{waited:?}");
    // A failed round poisons the session.
    assert!(matches!(
        s.allgather(b"y"),
        Err(BootstrapError::Exchange(ExchangeError::Poisoned { .. }))
    ));
}

fn version() {
    let mut s = init(Duration::from_secs(30));
    let rank = s.rank();
    if rank == 1 {
        s.set_protocol_version_for_tests(PROTOCOL_VERSION + 1);
    }
    let outcome = s.exchange(b"blob", None);
    if rank == 1 {
        // Rank 0 speaks this build's version: rank 1 accepts it.
        outcome.unwrap();
        return;
    }
    let err = outcome.unwrap_err();
    let text = err.to_string();
    match err {
        BootstrapError::Launch(LaunchError::PmixVersion {
            rank: 0,
            peer: 1,
            ours,
            theirs,
            ..
        }) => {
            assert_eq!(ours, PROTOCOL_VERSION);
            assert_eq!(theirs, Some(PROTOCOL_VERSION + 1));
        }
        other => panic!("expected a version error, got {other:?}"),
    }
    assert!(
        text.contains("rank 1 speaks rverbs PMIx protocol version 2"),
        "{text}"
    );
    assert!(text.contains("Open MPI mpirun"), "{text}");
}

fn no_pmix() {
    let err = PmixSession::init(&ExchangeOptions::default()).unwrap_err();
    let text = err.to_string();
    assert!(
        matches!(err, BootstrapError::Launch(LaunchError::NoLauncher { .. })),
        "{text}"
    );
    assert!(text.contains("Open MPI mpirun"), "{text}");
    assert!(text.contains("PMIX_NAMESPACE"), "{text}");
    let err = Launch::detect(None, None).unwrap_err();
    assert!(
        matches!(err, BootstrapError::Launch(LaunchError::NoLauncher { .. })),
        "{err}"
    );
}
