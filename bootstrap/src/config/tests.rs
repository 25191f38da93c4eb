//! Unit tests of the parent module.

use super::*;

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

fn invalid_parts(err: BootstrapError) -> (Option<usize>, Option<u32>, Option<&'static str>) {
    match err {
        BootstrapError::ConfigInvalid {
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
fn parses_legacy_layout() {
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
    assert!(matches!(err, BootstrapError::ConfigParse { line: 1, .. }));
    let err = ClusterConfig::from_json_str("[]", "cfg.json").unwrap_err();
    assert!(matches!(err, BootstrapError::ConfigInvalid { .. }));
}

#[test]
fn empty_list() {
    let err = ClusterConfig::from_json_str(r#"{"ranks": []}"#, "cfg.json").unwrap_err();
    assert!(err.to_string().contains("cfg.json"));
    assert_eq!(invalid_parts(err), (None, None, Some("ranks")));
    let err = ClusterConfig::from_json_str(r#"{"hosts": []}"#, "cfg.json").unwrap_err();
    assert_eq!(invalid_parts(err), (None, None, Some("hosts")));
}

#[test]
fn duplicate_rank() {
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
fn bad_ports() {
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
fn device_validation() {
    let config = ClusterConfig::from_json_str(LEGACY, "legacy.json").unwrap();
    config.validate_local_device(0, &["mlx5_0"]).unwrap();
    let err = config.validate_devices(&["mlx5_0"]).unwrap_err();
    assert!(matches!(
        &err,
        BootstrapError::DeviceNotFound { rank: 1, device, .. } if device == "mlx5_1"
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
fn new_validates_too() {
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
