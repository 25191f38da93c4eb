//! A device port's counters as the kernel exports them in sysfs: a snapshot, and the growth
//! between two snapshots. For telemetry and for tests that must show a fault really
//! happened on the wire (retransmissions, sequence errors, packets sent and received).
//!
//! Two sets per port: `counters/` (the InfiniBand port counters every device has, such as
//! `port_xmit_packets`) and `hw_counters/` (the driver's own: on rxe `sent_pkts`,
//! `rcvd_pkts`, `duplicate_request`, `out_of_seq_request`, `rcvd_seq_err`,
//! `retry_exceeded_err`, `rcvd_rnr_err`, `send_rnr_err`, `link_downed`, ...). Names are
//! given as `hw_counters/sent_pkts` so the two sets cannot collide.

use std::io;
use std::path::{Path, PathBuf};

/// Where sysfs puts the devices; a test may point at a copy.
pub const SYSFS_INFINIBAND: &str = "/sys/class/infiniband";

/// One port's counters at one moment, sorted by name.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PortCounters {
    /// `(set/name, value)`, sorted by name.
    pub values: Vec<(String, u64)>,
}

impl PortCounters {
    /// Reads every counter of `device`'s `port` under `root` (normally [`SYSFS_INFINIBAND`]).
    /// A counter that cannot be read or parsed (some are write-only or not numbers) is left
    /// out.
    ///
    /// # Errors
    /// Neither counter directory of the port can be listed (no such device or port).
    pub fn read(root: &Path, device: &str, port: u8) -> io::Result<Self> {
        let base: PathBuf = root.join(device).join("ports").join(port.to_string());
        let mut values = Vec::new();
        let mut listed = 0;
        let mut last_err = None;
        for set in ["counters", "hw_counters"] {
            let entries = match std::fs::read_dir(base.join(set)) {
                Ok(e) => e,
                Err(e) => {
                    last_err = Some(e);
                    continue;
                }
            };
            listed += 1;
            for entry in entries.flatten() {
                let name = entry.file_name().to_string_lossy().into_owned();
                let value = std::fs::read_to_string(entry.path())
                    .ok()
                    .and_then(|s| s.trim().parse::<u64>().ok());
                if let Some(v) = value {
                    values.push((format!("{set}/{name}"), v));
                }
            }
        }
        if listed == 0 {
            return Err(last_err.unwrap_or_else(|| io::Error::other("no counters")));
        }
        values.sort();
        Ok(Self { values })
    }

    /// The value of counter `name` (`"hw_counters/sent_pkts"`), if it was read.
    pub fn get(&self, name: &str) -> Option<u64> {
        self.values
            .binary_search_by(|(n, _)| n.as_str().cmp(name))
            .ok()
            .map(|i| self.values[i].1)
    }

    /// How much each counter grew since `earlier` (saturating: a counter that was reset reads
    /// as 0), for the counters both snapshots have; only those that changed.
    pub fn since(&self, earlier: &Self) -> Vec<(String, u64)> {
        self.values
            .iter()
            .filter_map(|(n, v)| {
                let d = v.saturating_sub(earlier.get(n)?);
                (d > 0).then(|| (n.clone(), d))
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_both_sets_skips_what_is_not_a_number_and_diffs() {
        let root = std::env::temp_dir().join(format!("rverbs-counters-{}", std::process::id()));
        let port = root.join("rxe9/ports/1");
        std::fs::create_dir_all(port.join("counters")).unwrap();
        std::fs::create_dir_all(port.join("hw_counters")).unwrap();
        std::fs::write(port.join("counters/port_xmit_packets"), "10\n").unwrap();
        std::fs::write(port.join("hw_counters/sent_pkts"), "7\n").unwrap();
        std::fs::write(port.join("hw_counters/lifespan"), "x\n").unwrap();
        let a = PortCounters::read(&root, "rxe9", 1).unwrap();
        assert_eq!(a.get("hw_counters/sent_pkts"), Some(7));
        assert_eq!(a.get("hw_counters/lifespan"), None);
        std::fs::write(port.join("hw_counters/sent_pkts"), "12\n").unwrap();
        let b = PortCounters::read(&root, "rxe9", 1).unwrap();
        assert_eq!(b.since(&a), vec![("hw_counters/sent_pkts".to_owned(), 5)]);
        assert!(PortCounters::read(&root, "rxe9", 2).is_err());
        let _ = std::fs::remove_dir_all(&root);
    }
}
