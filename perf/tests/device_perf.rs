//! rverbs-perf against itself on a real device: every test runs as two processes (server
//! and client over 127.0.0.1), both must succeed, and the client's `--json` must carry
//! perftest's columns with consistent values. Small iteration counts: this proves the tool
//! works, it measures nothing (about 10 s on SoftRoCE).
//!
//! The device comes from `RVERBS_TEST_DEVICE`; without it the test says it was skipped,
//! except under `CI=true`, where that fails.
#![allow(clippy::std_instead_of_core)]

use std::process::{Command, Stdio};
use std::time::Duration;

use rverbs_testkit::device;
use serde_json::Value;

/// Runs `test` with `args` as server and client on `port`; returns the client's JSON.
fn run(dev: &str, port: u16, test: &str, args: &[&str]) -> Value {
    let bin = env!("CARGO_BIN_EXE_rverbs-perf");
    let port = port.to_string();
    let common = |c: &mut Command| {
        c.arg(test)
            .args(["-d", dev, "-p", &port, "--json"])
            .args(args)
            .stderr(Stdio::piped())
            .stdout(Stdio::piped());
    };
    let mut server = Command::new(bin);
    common(&mut server);
    let server = server.spawn().expect("start the server");
    // The client retries its connection while the server starts.
    std::thread::sleep(Duration::from_millis(200));
    let mut client = Command::new(bin);
    common(&mut client);
    let client = client.arg("127.0.0.1").output().expect("run the client");
    let server = server.wait_with_output().expect("wait for the server");
    for (side, out) in [("client", &client), ("server", &server)] {
        assert!(
            out.status.success(),
            "{test} {args:?}: the {side} failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let text = String::from_utf8(client.stdout).expect("UTF-8");
    let v: Value = serde_json::from_str(text.trim()).unwrap_or_else(|e| panic!("{e}: {text}"));
    assert_eq!(v["test"], test);
    assert_eq!(v["side"], "client");
    v
}

fn num(v: &Value, key: &str) -> f64 {
    v["results"][key]
        .as_f64()
        .unwrap_or_else(|| panic!("no {key} in {v}"))
}

#[test]
fn every_test_runs_against_itself_and_reports_perftest_columns() {
    let Some(dev) = device() else { return };
    let mut port = 18_900;
    for (test, size) in [
        ("write_lat", "8"),
        ("write_lat", "4096"),
        ("send_lat", "8"),
        ("send_lat", "4096"),
        ("read_lat", "64"),
        ("atomic_lat", "8"),
    ] {
        port += 1;
        let v = run(&dev, port, test, &["-s", size, "-n", "200"]);
        assert_eq!(v["results"]["iterations"], 200, "{v}");
        assert_eq!(v["results"]["bytes"].as_u64(), size.parse().ok(), "{v}");
        let (min, typ, avg, max) = (
            num(&v, "t_min"),
            num(&v, "t_typical"),
            num(&v, "t_avg"),
            num(&v, "t_max"),
        );
        let (p99, p999) = (num(&v, "p99"), num(&v, "p99_9"));
        assert!(
            min > 0.0 && min <= typ && typ <= p99 && p99 <= p999,
            "{test}: {v}"
        );
        assert!(min <= avg && p999 <= max.max(p999), "{test}: {v}");
    }
    for (test, l) in [
        ("write_bw", "1"),
        ("write_bw", "32"),
        ("send_bw", "1"),
        ("send_bw", "32"),
        ("read_bw", "8"),
    ] {
        port += 1;
        let v = run(&dev, port, test, &["-s", "64", "-n", "640", "-l", l]);
        assert_eq!(v["results"]["iterations"], 640, "{v}");
        let (peak, avg, rate) = (
            num(&v, "bw_peak"),
            num(&v, "bw_average"),
            num(&v, "msg_rate"),
        );
        assert!(avg > 0.0 && peak >= avg * 0.999, "{test} -l {l}: {v}");
        // 64-byte messages: MiB/s and Mpps describe the same stream.
        let from_rate = rate * 1e6 * 64.0 / f64::from(1u32 << 20);
        assert!((from_rate - avg).abs() <= avg * 1e-6, "{test} -l {l}: {v}");
    }
}

#[test]
fn mismatched_flags_are_refused_on_both_sides() {
    let Some(dev) = device() else { return };
    let bin = env!("CARGO_BIN_EXE_rverbs-perf");
    let server = Command::new(bin)
        .args(["write_lat", "-d", &dev, "-p", "18950", "-s", "8"])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start the server");
    std::thread::sleep(Duration::from_millis(200));
    let client = Command::new(bin)
        .args([
            "write_lat",
            "-d",
            &dev,
            "-p",
            "18950",
            "-s",
            "16",
            "127.0.0.1",
        ])
        .stdout(Stdio::null())
        .output()
        .expect("run the client");
    let server = server.wait_with_output().expect("wait for the server");
    for out in [&client, &server] {
        assert!(!out.status.success());
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains("give both sides the same flags"), "{err}");
    }
}

/// `--hw-timestamps` on a device without a completion clock (rxe) fails at setup, before
/// any peer is contacted (the server would otherwise wait for its client), with an error
/// naming the device and what it lacks; on a device with one, a read latency run reports
/// from the device's times.
#[test]
fn hw_timestamps_are_refused_at_setup_where_the_device_has_no_clock() {
    let Some(dev) = device() else { return };
    if !dev.starts_with("rxe") {
        let v = run(&dev, 18951, "read_lat", &["-n", "200", "--hw-timestamps"]);
        assert_eq!(v["hw_timestamps"], true);
        assert!(num(&v, "t_typical") > 0.0, "{v}");
        return;
    }
    let bin = env!("CARGO_BIN_EXE_rverbs-perf");
    for test in ["write_lat", "read_lat", "atomic_lat"] {
        // As the server: no address, so it would listen; it must not get that far.
        let out = Command::new(bin)
            .args([test, "-d", &dev, "-p", "18952", "--hw-timestamps"])
            .stdout(Stdio::null())
            .output()
            .expect("run rverbs-perf");
        assert!(!out.status.success(), "{test} --hw-timestamps ran on {dev}");
        let err = String::from_utf8_lossy(&out.stderr);
        eprintln!("{err}");
        assert!(
            err.contains("--hw-timestamps")
                && err.contains(&format!(
                    "device {dev} cannot give hardware completion timestamps"
                ))
                && err.contains("completion_timestamp_mask"),
            "{err}"
        );
    }
}

/// A send test whose server stalls for longer than its posted receives last (descheduled on
/// a loaded machine; here stopped with SIGSTOP) still completes: the client's sends meet
/// receiver-not-ready NAKs and retry until the server reposts, as perftest's do
/// (`rnr_retry = 7`). With a bounded RNR retry (the library's default, 3.84 ms in all) the
/// client failed with "receiver-not-ready retries exceeded" and `tools/compare-perftest`
/// recorded no result for that round.
#[test]
fn send_bw_outlasts_a_server_that_stalls_longer_than_its_receives() {
    let Some(dev) = device() else { return };
    let bin = env!("CARGO_BIN_EXE_rverbs-perf");
    let iters = 64_000u32;
    let n = iters.to_string();
    // 64 receives: the client uses them up in about a millisecond of a stall.
    let args = [
        "send_bw", "-d", &dev, "-p", "18953", "--json", "-s", "64", "-l", "32", "-r", "64", "-n",
        &n,
    ];
    let server = Command::new(bin)
        .args(args)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start the server");
    std::thread::sleep(Duration::from_millis(200));
    let mut client = Command::new(bin)
        .args(args)
        .arg("127.0.0.1")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start the client");
    let signal = |sig: &str| {
        let ok = Command::new("kill")
            .args([sig, &server.id().to_string()])
            .status()
            .is_ok_and(|s| s.success());
        assert!(ok, "kill {sig} the server");
    };
    // Stall the server for 100 ms every 200 ms while the client runs (the run takes
    // seconds on rxe, so several stalls fall into its stream), at most 120 s.
    let deadline = std::time::Instant::now() + Duration::from_secs(120);
    let mut stalls = 0u32;
    while client.try_wait().expect("poll the client").is_none() {
        assert!(
            std::time::Instant::now() < deadline,
            "the client did not finish in 120 s"
        );
        std::thread::sleep(Duration::from_millis(200));
        signal("-STOP");
        std::thread::sleep(Duration::from_millis(100));
        signal("-CONT");
        stalls += 1;
    }
    let client = client.wait_with_output().expect("wait for the client");
    let server = server.wait_with_output().expect("wait for the server");
    for (side, out) in [("client", &client), ("server", &server)] {
        assert!(
            out.status.success(),
            "the {side} failed after {stalls} stalls of the server: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    assert!(stalls >= 3, "only {stalls} stalls: the run proved nothing");
    let text = String::from_utf8(client.stdout).expect("UTF-8");
    let v: Value = serde_json::from_str(text.trim()).unwrap_or_else(|e| panic!("{e}: {text}"));
    assert_eq!(v["results"]["iterations"], iters, "{v}");
    // Past 20000 iterations the run is timed whole, as perftest's noPeak: no peak, a rate.
    assert_eq!(num(&v, "bw_peak"), 0.0, "{v}");
    assert!(num(&v, "msg_rate") > 0.0, "{v}");
    eprintln!("{stalls} stalls of 100 ms; {} Mpps", num(&v, "msg_rate"));
}
