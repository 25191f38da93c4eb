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
    child_command, device, rank_env, required_env, run_children, scratch_dir, spawn_rank, RankEnv,
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
