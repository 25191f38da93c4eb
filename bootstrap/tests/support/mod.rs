//! What the bootstrap device tests share beyond the test kit (`rverbs-testkit`, whose device
//! and child-process helpers are re-exported here): the cluster config of a world on this
//! host.
#![allow(
    dead_code,
    unused_imports,
    unreachable_pub,
    clippy::std_instead_of_core
)] // test code; not every test uses all of it

use rverbs_bootstrap::{ClusterConfig, RankConfig};

pub use rverbs_testkit::{
    child_command, device, rank_env, required_env, run_children, scratch_dir, spawn_rank,
    world_env, RankEnv,
};

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

/// `world` nodes on one device, connected to each other in this process (each rank's blob
/// handed to all), on the wall clock.
#[cfg(feature = "verbs")]
pub fn loopback_nodes<B: rverbs_core::poll::Backoff + Clone>(
    ctx: &rverbs_core::verbs::Context,
    world: u32,
    cfg: rverbs_core::node::NodeConfig,
    backoff: B,
) -> Vec<rverbs_core::node::VerbsNode<B>> {
    let prepared: Vec<_> = (0..world)
        .map(|r| {
            rverbs_core::node::PreparedNode::new(
                ctx,
                r,
                world,
                cfg,
                backoff.clone(),
                &rverbs_std_shim::MONOTONIC,
            )
            .unwrap()
        })
        .collect();
    let blobs: Vec<Vec<u8>> = prepared.iter().map(|p| p.blob()).collect();
    prepared
        .into_iter()
        .map(|p| p.handshake(&blobs).unwrap())
        .collect()
}
