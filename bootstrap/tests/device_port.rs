//! A rank whose own port is down is told so: on rxe, the netdev under the device is taken
//! down (`ip link set DEV down`, which rxe turns into a port in state DOWN), and connecting
//! to a world whose other rank never comes fails with an error that names the local port,
//! not only the rank it could not reach. The netdev is brought back up afterwards and the
//! port must be ACTIVE again.
#![allow(clippy::std_instead_of_core)] // test code

mod support;
use rverbs_bootstrap::RdmaError;
use support::device;

use std::time::{Duration, Instant};

use rverbs_bootstrap::{connect, BootstrapError, ConnectOptions};
use rverbs_testkit::{netdev_of, port_state, set_link};

/// Waits until the port's state (as sysfs prints it, `4: ACTIVE`) contains `want`.
fn wait_state(dev: &str, want: &str) {
    let t = Instant::now();
    while !port_state(dev).contains(want) {
        assert!(
            t.elapsed() < Duration::from_secs(10),
            "port 1 of {dev} is {}, not {want}",
            port_state(dev)
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn connecting_with_the_local_port_down_names_the_port() {
    let Some(dev) = device() else {
        return;
    };
    let netdev = netdev_of(&dev);
    set_link(&netdev, "down");
    wait_state(&dev, "DOWN");
    // Bring the link back whatever happens below, so later tests find it up.
    struct Up(String, String);
    impl Drop for Up {
        fn drop(&mut self) {
            set_link(&self.0, "up");
            wait_state(&self.1, "ACTIVE");
        }
    }
    let _up = Up(netdev, dev.clone());
    let config = support::local_config(2, 24100, &dev, "port-down".into());
    let mut opts = ConnectOptions::for_config(&config);
    opts.exchange.timeout = Duration::from_secs(2);
    // Rank 0 of two; rank 1 never comes (its host is unreachable for all it knows).
    let e = connect(&config, 0, &opts).expect_err("connected with the port down");
    let text = e.to_string();
    eprintln!("{text}");
    assert!(
        matches!(
            e,
            BootstrapError::Rdma(RdmaError::LocalPortDown { port: 1, .. })
        ),
        "{e:?}"
    );
    assert!(text.contains(&format!("port 1 of {dev} is down")), "{text}");
}
