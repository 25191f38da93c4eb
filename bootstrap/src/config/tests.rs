//! Unit tests of the parent module.

use super::*;
use crate::error::ConfigError;

const NATIVE: &str = r#"{
    "job": "unit",
    "ranks": [
        {"rank": 1, "host": "10.0.0.2", "port": 17001, "device": "rxe0", "gid_index": 1},
        {"rank": 0, "host": "10.0.0.1", "port": 17000, "device": "rxe0", "ib_port": 2,
         "comment": "leader"}
    ]
}"#;

const LEGACY: &str = r#"{"hosts": [
    {"hostname": "node1", "port": 10000, "ibdev": "mlx5_0", "rankid": 0, "comment": "x"},
    {"hostname": "node2", "port": 10000, "ibdev": "mlx5_1", "rankid": 1}
]}"#;

fn invalid_parts(err: ConfigError) -> (Option<usize>, Option<u32>, Option<&'static str>) {
    match err {
        ConfigError::Invalid {
            entry, rank, field, ..
        } => (entry, rank, field),
        other => panic!("expected ConfigInvalid, got {other:?}"),
    }
}

#[test]
fn parses_native_layout_sorted_by_rank() {
    let config = ClusterConfig::from_json_str(NATIVE, "native.json").unwrap();
    assert_eq!(config.layout(), ConfigLayout::Native);
    assert_eq!(config.world_size(), 2);
    assert_eq!(config.job(), Some("unit"));
    assert_ne!(config.job_id(), 0);
    let zero = config.rank(0);
    assert_eq!(zero.host, "10.0.0.1");
    assert_eq!(zero.ib_port, 2);
    assert_eq!(zero.gid_index, None);
    assert_eq!(zero.comment.as_deref(), Some("leader"));
    let one = config.rank(1);
    assert_eq!(one.port, 17001);
    assert_eq!(one.ib_port, 1);
    assert_eq!(one.gid_index, Some(1));
    assert!(config.get(2).is_none());
}

#[test]
fn legacy_hosts_layout_parses_into_ranks_with_their_fields() {
    let config = ClusterConfig::from_json_str(LEGACY, "legacy.json").unwrap();
    assert_eq!(config.layout(), ConfigLayout::Legacy);
    assert_eq!(config.world_size(), 2);
    assert_eq!(config.job_id(), 0);
    assert_eq!(config.rank(1).host, "node2");
    assert_eq!(config.rank(1).device, "mlx5_1");
    assert_eq!(config.rank(0).comment.as_deref(), Some("x"));
}

#[test]
fn native_json_round_trips() {
    for text in [NATIVE, LEGACY] {
        let config = ClusterConfig::from_json_str(text, "a").unwrap();
        let again = ClusterConfig::from_json_str(&config.to_json_string(), "a").unwrap();
        assert_eq!(again.ranks(), config.ranks());
        assert_eq!(again.job(), config.job());
    }
}

#[test]
fn unknown_field_names_field_and_position() {
    let text = "{\"ranks\": [\n {\"rank\": 0, \"host\": \"h\", \"port\": 1, \"device\": \"d\", \"colour\": 1}]}";
    let err = ClusterConfig::from_json_str(text, "cfg.json").unwrap_err();
    let shown = err.to_string();
    assert!(shown.starts_with("cfg.json:2:"), "{shown}");
    assert!(shown.contains("colour"), "{shown}");
    let legacy =
        r#"{"hosts": [{"hostname": "h", "port": 1, "ibdev": "d", "rankid": 0, "gpu": 1}]}"#;
    let shown = ClusterConfig::from_json_str(legacy, "old.json")
        .unwrap_err()
        .to_string();
    assert!(shown.starts_with("old.json:1:"), "{shown}");
    assert!(shown.contains("gpu"), "{shown}");
}

#[test]
fn missing_field_and_bad_json_are_parse_errors() {
    let text = r#"{"ranks": [{"rank": 0, "host": "h", "device": "d"}]}"#;
    let shown = ClusterConfig::from_json_str(text, "cfg.json")
        .unwrap_err()
        .to_string();
    assert!(shown.contains("port"), "{shown}");
    let err = ClusterConfig::from_json_str("{\"ranks\": [", "cfg.json").unwrap_err();
    assert!(matches!(err, ConfigError::Parse { line: 1, .. }));
    let err = ClusterConfig::from_json_str("[]", "cfg.json").unwrap_err();
    assert!(matches!(err, ConfigError::Invalid { .. }));
}

#[test]
fn an_empty_rank_list_is_refused_naming_the_file_and_the_field() {
    let err = ClusterConfig::from_json_str(r#"{"ranks": []}"#, "cfg.json").unwrap_err();
    assert!(err.to_string().contains("cfg.json"));
    assert_eq!(invalid_parts(err), (None, None, Some("ranks")));
    let err = ClusterConfig::from_json_str(r#"{"hosts": []}"#, "cfg.json").unwrap_err();
    assert_eq!(invalid_parts(err), (None, None, Some("hosts")));
}

#[test]
fn a_duplicate_rank_is_refused_naming_the_entry_and_the_rank() {
    let text = r#"{"ranks": [
        {"rank": 0, "host": "a", "port": 1, "device": "d"},
        {"rank": 0, "host": "b", "port": 1, "device": "d"}]}"#;
    let err = ClusterConfig::from_json_str(text, "dup.json").unwrap_err();
    let shown = err.to_string();
    assert!(
        shown.contains("dup.json") && shown.contains("duplicate"),
        "{shown}"
    );
    assert_eq!(invalid_parts(err), (Some(1), Some(0), Some("rank")));
}

#[test]
fn missing_rank_names_gap_and_culprit() {
    let text = r#"{"hosts": [
        {"hostname": "a", "port": 1, "ibdev": "d", "rankid": 0},
        {"hostname": "b", "port": 1, "ibdev": "d", "rankid": 5}]}"#;
    let err = ClusterConfig::from_json_str(text, "gap.json").unwrap_err();
    let shown = err.to_string();
    assert!(shown.contains("entry 1 has rank 5"), "{shown}");
    assert_eq!(invalid_parts(err), (None, Some(1), Some("rankid")));
}

#[test]
fn port_zero_or_beyond_65535_is_refused_naming_the_entry() {
    for (port, needle) in [("0", "port 0"), ("65536", "out of range")] {
        let text =
            format!(r#"{{"ranks": [{{"rank": 0, "host": "a", "port": {port}, "device": "d"}}]}}"#);
        let err = ClusterConfig::from_json_str(&text, "p.json").unwrap_err();
        assert!(err.to_string().contains(needle), "{err}");
        assert_eq!(invalid_parts(err), (Some(0), Some(0), Some("port")));
    }
}

#[test]
fn empty_host_and_device() {
    let text = r#"{"ranks": [{"rank": 0, "host": " ", "port": 1, "device": "d"}]}"#;
    let err = ClusterConfig::from_json_str(text, "h.json").unwrap_err();
    assert_eq!(invalid_parts(err), (Some(0), Some(0), Some("host")));
    let text = r#"{"hosts": [{"hostname": "a", "port": 1, "ibdev": "", "rankid": 0}]}"#;
    let err = ClusterConfig::from_json_str(text, "h.json").unwrap_err();
    assert_eq!(invalid_parts(err), (Some(0), Some(0), Some("ibdev")));
}

#[test]
fn ib_port_and_gid_ranges() {
    let text = r#"{"ranks": [{"rank": 0, "host": "a", "port": 1, "device": "d", "ib_port": 0}]}"#;
    let err = ClusterConfig::from_json_str(text, "i.json").unwrap_err();
    assert_eq!(invalid_parts(err), (Some(0), Some(0), Some("ib_port")));
    let text =
        r#"{"ranks": [{"rank": 0, "host": "a", "port": 1, "device": "d", "gid_index": 256}]}"#;
    let err = ClusterConfig::from_json_str(text, "i.json").unwrap_err();
    assert_eq!(invalid_parts(err), (Some(0), Some(0), Some("gid_index")));
}

#[test]
fn a_rank_whose_device_is_missing_is_refused_naming_rank_device_and_file() {
    let config = ClusterConfig::from_json_str(LEGACY, "legacy.json").unwrap();
    config.validate_local_device(0, &["mlx5_0"]).unwrap();
    let err = config.validate_devices(&["mlx5_0"]).unwrap_err();
    assert!(matches!(
        &err,
        ConfigError::DeviceNotFound { rank: 1, device, .. } if device == "mlx5_1"
    ));
    assert!(err.to_string().contains("legacy.json"));
    assert!(config.validate_local_device(7, &[]).is_err());
}

#[test]
fn from_file_names_path() {
    let err = ClusterConfig::from_file("/nonexistent/rverbs.json").unwrap_err();
    assert!(err.to_string().contains("/nonexistent/rverbs.json"));
    let dir = std::env::temp_dir().join(format!("rverbs-bootstrap-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("cluster.json");
    std::fs::write(&path, NATIVE).unwrap();
    let config = ClusterConfig::from_file(&path).unwrap();
    assert_eq!(config.origin(), path.display().to_string());
    std::fs::write(&path, r#"{"ranks": []}"#).unwrap();
    let shown = ClusterConfig::from_file(&path).unwrap_err().to_string();
    assert!(shown.contains(&path.display().to_string()), "{shown}");
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn config_built_in_code_is_validated_like_a_parsed_one() {
    let rank = |rank| RankConfig {
        rank,
        host: "127.0.0.1".to_owned(),
        port: 1,
        device: "rxe0".to_owned(),
        ib_port: 1,
        gid_index: None,
        comment: None,
    };
    let config = ClusterConfig::new("code", None, vec![rank(1), rank(0)]).unwrap();
    assert_eq!(config.rank(1).rank, 1);
    assert!(ClusterConfig::new("code", None, vec![rank(1)]).is_err());
}

// ---- bounded input ----

/// A native config of `n` ranks with long host names and comments.
fn big_native(n: u32) -> String {
    let ranks: Vec<RankConfig> = (0..n)
        .map(|rank| RankConfig {
            rank,
            host: format!(
                "compute-node-{rank:05}.rack-{:03}.cluster.example.org",
                rank / 40
            ),
            port: 18515,
            device: "mlx5_0".to_owned(),
            ib_port: 1,
            gid_index: Some(3),
            comment: Some(format!("rack {} slot {}, spare PSU", rank / 40, rank % 40)),
        })
        .collect();
    let mut out = String::from("{\"job\": \"big\", \"ranks\": [\n");
    for (index, rank) in ranks.iter().enumerate() {
        if index > 0 {
            out.push_str(",\n");
        }
        out.push_str(&format!(
            "  {{\"rank\": {}, \"host\": \"{}\", \"port\": {}, \"device\": \"{}\", \"ib_port\": 1, \"gid_index\": 3, \"comment\": \"{}\"}}",
            rank.rank,
            rank.host,
            rank.port,
            rank.device,
            rank.comment.as_deref().unwrap_or_default()
        ));
    }
    out.push_str("\n]}\n");
    out
}

#[test]
fn the_largest_world_fits_the_size_cap_several_times() {
    let text = big_native(MAX_WORLD);
    assert!(
        (text.len() as u64) * 4 < MAX_CONFIG_BYTES,
        "{} bytes for {MAX_WORLD} ranks",
        text.len()
    );
    let config = ClusterConfig::from_json_str(&text, "big.json").unwrap();
    assert_eq!(config.world_size(), MAX_WORLD);
    // Our own pretty output of it fits too.
    assert!((config.to_json_string().len() as u64) * 4 < MAX_CONFIG_BYTES);
}

#[test]
fn a_world_above_the_maximum_is_refused_at_parse_time() {
    let text = big_native(MAX_WORLD + 1);
    let err = ClusterConfig::from_json_str(&text, "big.json").unwrap_err();
    let shown = err.to_string();
    assert!(
        shown.contains("big.json")
            && shown.contains("lists 4097 ranks")
            && shown.contains("maximum world size of 4096"),
        "{shown}"
    );
    assert_eq!(invalid_parts(err), (None, None, Some("ranks")));
    let hosts: Vec<String> = (0..=MAX_WORLD)
        .map(|rank| format!(r#"{{"hostname": "h", "port": 1, "ibdev": "d", "rankid": {rank}}}"#))
        .collect();
    let legacy = format!(r#"{{"hosts": [{}]}}"#, hosts.join(","));
    let err = ClusterConfig::from_json_str(&legacy, "old.json").unwrap_err();
    assert!(
        err.to_string().contains("maximum world size of 4096"),
        "{err}"
    );
    assert_eq!(invalid_parts(err), (None, None, Some("hosts")));
    // Built in code, the same rule.
    let entry = |rank| RankConfig {
        rank,
        host: "h".to_owned(),
        port: 1,
        device: "d".to_owned(),
        ib_port: 1,
        gid_index: None,
        comment: None,
    };
    let err = ClusterConfig::new("code", None, (0..=MAX_WORLD).map(entry).collect()).unwrap_err();
    assert!(
        err.to_string().contains("maximum world size of 4096"),
        "{err}"
    );
}

#[test]
fn oversized_text_is_refused_before_parsing() {
    // Not even JSON: the size alone decides.
    let text = " ".repeat(MAX_CONFIG_BYTES as usize + 1);
    let err = ClusterConfig::from_json_str(&text, "huge.json").unwrap_err();
    assert!(
        matches!(&err, ConfigError::TooLarge { file, len: Some(len), limit }
            if file == "huge.json" && *len == MAX_CONFIG_BYTES + 1 && *limit == MAX_CONFIG_BYTES),
        "{err:?}"
    );
    assert!(
        err.to_string().starts_with(
            "cluster config huge.json is 4194305 bytes, over the limit of 4194304 bytes"
        ),
        "{err}"
    );
}

#[test]
fn oversized_files_are_refused_before_reading() {
    let dir = std::env::temp_dir().join(format!("rverbs-bootstrap-big-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("cluster.json");
    // A sparse 100 MB file: nothing is written, and nothing must be read.
    let file = std::fs::File::create(&path).unwrap();
    file.set_len(100_000_000).unwrap();
    let start = std::time::Instant::now();
    let err = ClusterConfig::from_file(&path).unwrap_err();
    assert!(start.elapsed() < core::time::Duration::from_secs(1));
    let shown = err.to_string();
    assert!(
        shown.contains(&path.display().to_string()) && shown.contains("is 100000000 bytes"),
        "{shown}"
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn one_pass_still_tells_the_layouts_apart() {
    let both = r#"{"ranks": [], "hosts": []}"#;
    let shown = ClusterConfig::from_json_str(both, "b.json")
        .unwrap_err()
        .to_string();
    assert!(shown.contains("a second rank list"), "{shown}");
    let job_in_legacy =
        r#"{"hosts": [{"hostname": "h", "port": 1, "ibdev": "d", "rankid": 0}], "job": "x"}"#;
    let shown = ClusterConfig::from_json_str(job_in_legacy, "j.json")
        .unwrap_err()
        .to_string();
    assert!(shown.contains("unknown field `job`"), "{shown}");
    let unknown = r#"{"rank": []}"#;
    let shown = ClusterConfig::from_json_str(unknown, "u.json")
        .unwrap_err()
        .to_string();
    assert!(
        shown.contains("unknown field `rank`") && shown.contains("`ranks`"),
        "{shown}"
    );
    let neither = r#"{"job": "x"}"#;
    let shown = ClusterConfig::from_json_str(neither, "n.json")
        .unwrap_err()
        .to_string();
    assert!(shown.contains("missing field `ranks`"), "{shown}");
    for top in ["null", "  [1]", "\"x\""] {
        let err = ClusterConfig::from_json_str(top, "t.json").unwrap_err();
        assert_eq!(invalid_parts(err), (None, None, None));
    }
    // A null job is no job, in either order of keys.
    let text = r#"{"ranks": [{"rank": 0, "host": "h", "port": 1, "device": "d"}], "job": null}"#;
    assert_eq!(
        ClusterConfig::from_json_str(text, "n.json").unwrap().job(),
        None
    );
}
