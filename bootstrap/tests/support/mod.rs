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

/// [`local_config`] and connect options for it, as a child rank starts from.
pub fn local_options(
    world: u32,
    port: u16,
    dev: &str,
    job: String,
) -> (ClusterConfig, rverbs_bootstrap::ConnectOptions) {
    let config = local_config(world, port, dev, job);
    let opts = rverbs_bootstrap::ConnectOptions::for_config(&config);
    (config, opts)
}

/// In a child started by `spawn_rank` with `prefix` and told a scenario in
/// `{prefix}SCENARIO`: the scenario and the rest of what it was told ([`rank_env`]).
pub fn scenario_env(prefix: &str) -> (String, RankEnv) {
    (required_env(&format!("{prefix}SCENARIO")), rank_env(prefix))
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
