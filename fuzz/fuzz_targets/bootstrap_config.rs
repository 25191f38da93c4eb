//! Cluster files are written by hand and copied between machines; a malformed
//! one must produce an error, never a panic. An accepted file (either layout)
//! written back out in the native layout must describe the same cluster.
#![no_main]

use libfuzzer_sys::fuzz_target;
use rverbs_bootstrap::ClusterConfig;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = core::str::from_utf8(data) else {
        return;
    };
    let Ok(config) = ClusterConfig::from_json_str(text, "fuzz") else {
        return;
    };
    assert!(config.world_size() > 0);
    for (index, rank) in config.ranks().iter().enumerate() {
        assert_eq!(rank.rank as usize, index);
    }
    let written = config.to_json_string();
    let again = ClusterConfig::from_json_str(&written, "fuzz")
        .unwrap_or_else(|err| panic!("re-parsing our own output failed: {err}\n{written}"));
    assert_eq!(again.world_size(), config.world_size());
    assert_eq!(again.ranks(), config.ranks());
    assert_eq!(again.job(), config.job());
    assert_eq!(again.job_id(), config.job_id());
});
