//! A rank that rejoins, on a real device: 4 ranks as separate processes run barriers in a
//! loop (every algorithm in turn); rank 2 is killed with SIGKILL mid-loop; every survivor's
//! barrier fails naming rank 2, and each calls `Connected::readmit(2)`; the parent starts
//! rank 2 again with the same configuration, and it calls `rejoin`. Then barriers run on all
//! four again, and the same happens to rank 1 (so a rank readmitted once, rank 2, readmits
//! another, and rank 0's session watch, started again by the first readmission, sees the
//! second death). Finally every rank runs [`FINAL`] barriers of every algorithm.
//!
//! The parent test starts one child process per rank: this same test binary, running the
//! ignored `child_rank` entry point with the scenario in environment variables.
#![allow(clippy::std_instead_of_core)] // test code

mod support;
use rverbs_core::node::Members;
use support::device;

use std::path::Path;
use std::process::Child;
use std::time::{Duration, Instant};

use rverbs_bootstrap::{connect, rejoin, ConnectOptions};
use rverbs_core::barrier::BarrierAlgorithm;
use rverbs_core::poll::Clock;
use rverbs_std_shim::MONOTONIC;

const WORLD: u32 = 4;
/// The rank killed in each phase, in turn.
const VICTIMS: [u32; 2] = [2, 1];
/// Barrier timeout: the survivors must name the victim well inside it.
const TIMEOUT: Duration = Duration::from_secs(10);
/// How long a readmission may take (the new process starts meanwhile).
const READMIT_TIMEOUT: Duration = Duration::from_secs(30);
/// Barriers every rank runs in a phase before the parent kills the phase's victim.
const WARM: u64 = 30;
/// Barriers of each algorithm every rank runs at the end.
const FINAL: u64 = 100;

fn now_ns() -> u64 {
    MONOTONIC.now().as_nanos()
}

/// Starts rank `rank` from phase `phase` on.
fn spawn(rank: u32, phase: usize, port: u16, dev: &str, dir: &Path) -> Child {
    let phase = phase.to_string();
    support::spawn_rank("RVERBS_REJOIN_", rank, port, dev, dir, &[("PHASE", &phase)])
}

fn read(dir: &Path, name: &str) -> String {
    std::fs::read_to_string(dir.join(name)).unwrap_or_else(|_| panic!("no {name}"))
}

fn kill_all(kids: &mut [Child]) {
    for k in kids {
        let _ = k.kill();
        let _ = k.wait();
    }
}

#[test]
fn a_killed_rank_restarted_with_the_same_config_rejoins_and_barriers_continue() {
    let Some(dev) = device() else {
        return;
    };
    let port = 23300;
    let dir = support::scratch_dir(&format!("rejoin-{port}"));
    let start = Instant::now();
    let mut kids: Vec<Child> = (0..WORLD).map(|r| spawn(r, 0, port, &dev, &dir)).collect();
    let mut killed_at = Vec::new();
    for (phase, &victim) in VICTIMS.iter().enumerate() {
        let warmed = |r: u32| dir.join(format!("warm.{phase}.{r}")).exists();
        while !(0..WORLD).all(warmed) {
            if start.elapsed() > Duration::from_secs(120) {
                kill_all(&mut kids);
                panic!("phase {phase}: the world did not warm up in 120 s");
            }
            if let Some((r, st)) = kids
                .iter_mut()
                .enumerate()
                .find_map(|(r, k)| k.try_wait().unwrap().map(|st| (r, st)))
            {
                kill_all(&mut kids);
                panic!("phase {phase}: rank {r} exited early with {st}");
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        killed_at.push(now_ns());
        let k = &mut kids[victim as usize];
        k.kill().unwrap();
        let _ = k.wait();
        // The same configuration, started again.
        kids[victim as usize] = spawn(victim, phase + 1, port, &dev, &dir);
    }
    let limit = Duration::from_secs(180);
    for (r, k) in kids.iter_mut().enumerate() {
        loop {
            if let Some(st) = k.try_wait().unwrap() {
                assert!(st.success(), "rank {r} exited with {st}");
                break;
            }
            if start.elapsed() > limit {
                kill_all(&mut kids);
                panic!("rank {r} still runs after {limit:?}");
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
    for (phase, &victim) in VICTIMS.iter().enumerate() {
        let kill = killed_at[phase];
        let since = |ns: &str| Duration::from_nanos(ns.trim().parse::<u64>().unwrap() - kill);
        for r in (0..WORLD).filter(|&r| r != victim) {
            let answer = read(&dir, &format!("answer.{phase}.{r}"));
            let (at, error) = answer.split_once('\n').unwrap();
            assert!(
                error.contains(&format!("rank {victim} failed")),
                "phase {phase}: rank {r} does not name rank {victim}: {error}"
            );
            let readmitted = read(&dir, &format!("readmitted.{phase}.{r}"));
            eprintln!(
                "phase {phase}: rank {r} named rank {victim} {:?} after the kill, readmitted it \
                 {:?} after the kill",
                since(at),
                since(&readmitted)
            );
            assert!(since(at) < TIMEOUT, "phase {phase}: rank {r} took too long");
        }
        let rejoined = read(&dir, &format!("rejoined.{}.{victim}", phase + 1));
        eprintln!(
            "phase {phase}: the new rank {victim} rejoined {:?} after the kill",
            since(&rejoined)
        );
    }
    for r in 0..WORLD {
        let done = read(&dir, &format!("done.{r}"));
        assert_eq!(
            done.trim(),
            (FINAL * BarrierAlgorithm::ALL.len() as u64).to_string(),
            "rank {r}"
        );
    }
    eprintln!("the whole test took {:?}", start.elapsed());
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
#[ignore = "a child rank of the test above, started by it"]
fn child_rank() {
    let env = support::rank_env("RVERBS_REJOIN_");
    let (rank, port, dir, dev) = (env.rank, env.port, env.dir, env.dev);
    let first: usize = support::required_env("RVERBS_REJOIN_PHASE")
        .parse()
        .unwrap();
    let write = |name: String, text: String| std::fs::write(dir.join(name), text).unwrap();
    let config = support::local_config(WORLD, port, &dev, format!("rejoin-{port}"));
    let mut opts = ConnectOptions::for_config(&config);
    opts.node.algorithm = BarrierAlgorithm::Dissemination;
    // Every rank is built to readmit (and the new process to be readmitted again).
    opts.node.components = rverbs_core::node::Components::readmission();
    let mut c = if first == 0 {
        connect(&config, rank, &opts)
    } else {
        rejoin(&config, rank, &opts)
    }
    .unwrap_or_else(|e| panic!("rank {rank} (phase {first}): {e}"));
    if first > 0 {
        write(format!("rejoined.{first}.{rank}"), now_ns().to_string());
    }
    for (phase, &victim) in VICTIMS.iter().enumerate().skip(first) {
        let mut done = 0u64;
        let error = loop {
            // Every rank runs barrier `done` of the phase with the same algorithm.
            c.node
                .set_algorithm(BarrierAlgorithm::ALL[done as usize % 3]);
            if let Err(e) = c.node.barrier_timeout(Members::World, TIMEOUT) {
                break e;
            }
            done += 1;
            if done == WARM {
                write(format!("warm.{phase}.{rank}"), String::new());
            }
            if done > WARM {
                // Slow down after warming up, so the kill lands in a barrier.
                std::thread::sleep(Duration::from_micros(200));
            }
        };
        write(
            format!("answer.{phase}.{rank}"),
            format!("{}\n{error}", now_ns()),
        );
        assert!(
            error.to_string().contains(&format!("rank {victim} failed")),
            "rank {rank}, phase {phase}: {error}"
        );
        c.readmit(victim, READMIT_TIMEOUT)
            .unwrap_or_else(|e| panic!("rank {rank} readmitting rank {victim}: {e}"));
        assert!(!c.node.is_poisoned());
        assert_eq!(c.node.failure(), None);
        write(format!("readmitted.{phase}.{rank}"), now_ns().to_string());
    }
    let mut done = 0u64;
    for alg in BarrierAlgorithm::ALL {
        c.node.set_algorithm(alg);
        for i in 0..FINAL {
            c.node
                .barrier_timeout(Members::World, TIMEOUT)
                .unwrap_or_else(|e| panic!("rank {rank}, {} barrier {i}: {e}", alg.name()));
            done += 1;
        }
    }
    // Every rank has passed its last barrier (so every notification arrived) before any
    // destroys its queue pairs.
    c.session.allgather(b"done").unwrap();
    write(format!("done.{rank}"), done.to_string());
    drop(c.watch);
    c.session.close().unwrap();
}
