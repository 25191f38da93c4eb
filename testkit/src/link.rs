//! A device's link, for the tests that take a port down under a job (they need root, and a
//! RoCE device such as rxe whose port sits on a network interface).

use std::process::Command;
use std::time::{Duration, Instant};

/// The network interface under `dev`'s port 1 (`gid_attrs/ndevs/0` in sysfs); panics naming
/// the device when it has none (not RoCE?).
pub fn netdev_of(dev: &str) -> String {
    port_file(dev, "gid_attrs/ndevs/0", "no network interface; not RoCE?")
}

/// The state of `dev`'s port 1 as sysfs prints it (`4: ACTIVE`).
pub fn port_state(dev: &str) -> String {
    port_file(dev, "state", "no port state")
}

/// The file `name` under `dev`'s port 1 in sysfs, trimmed; panics naming the device and
/// `missing` when it cannot be read.
fn port_file(dev: &str, name: &str, missing: &str) -> String {
    let path = format!("/sys/class/infiniband/{dev}/ports/1/{name}");
    std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("{dev}: {missing} ({path}: {e})"))
        .trim()
        .to_owned()
}

/// `ip link set dev NETDEV STATE` (`up` or `down`); whether it succeeded.
pub fn ip_link(netdev: &str, state: &str) -> bool {
    Command::new("ip")
        .args(["link", "set", "dev", netdev, state])
        .status()
        .is_ok_and(|s| s.success())
}

/// [`ip_link`], which must succeed.
pub fn set_link(netdev: &str, state: &str) {
    assert!(
        ip_link(netdev, state),
        "ip link set dev {netdev} {state} failed (this test needs root)"
    );
}

/// Waits until `done` holds, checking every 10 ms; panics naming `what` after `limit`.
pub fn wait_for(what: &str, limit: Duration, mut done: impl FnMut() -> bool) {
    let start = Instant::now();
    while !done() {
        assert!(start.elapsed() < limit, "{what}: not within {limit:?}");
        std::thread::sleep(Duration::from_millis(10));
    }
}
