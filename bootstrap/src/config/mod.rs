//! Cluster configuration: which host, port and RDMA device each rank uses.
//!
//! Two JSON layouts are read. The native one:
//!
//! ```json
//! {"job": "allreduce-test",
//!  "ranks": [{"rank": 0, "host": "10.0.0.1", "port": 17000, "device": "rxe0",
//!             "ib_port": 1, "gid_index": 3, "comment": "optional"}]}
//! ```
//!
//! (`job`, `ib_port` (default 1), `gid_index` and `comment` are optional), and the
//! legacy layout of ibverbs-rs, read unchanged:
//!
//! ```json
//! {"hosts": [{"hostname": "node1", "port": 10000, "ibdev": "mlx5_0", "rankid": 0,
//!             "comment": "optional"}]}
//! ```
//!
//! Unknown fields are errors in both. Ranks must be exactly `0..n`, each once.

use std::collections::HashMap;
use std::path::Path;

use serde::{Deserialize, Serialize};

use crate::error::{BootstrapError, Result};
use crate::launcher::LaunchInfo;

/// Which JSON layout a configuration was read from.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ConfigLayout {
    /// `{"ranks": [{"rank", "host", "port", "device", ...}]}`.
    Native,
    /// `{"hosts": [{"hostname", "port", "ibdev", "rankid"}]}` (ibverbs-rs).
    Legacy,
}

/// One rank's entry.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct RankConfig {
    /// The rank, `0..world_size`.
    pub rank: u32,
    /// Host name or address the rank is reached at (rank 0 listens here).
    pub host: String,
    /// TCP port for the bootstrap exchange (only rank 0's is used to listen).
    pub port: u16,
    /// RDMA device name, such as `rxe0` or `mlx5_0`.
    pub device: String,
    /// Physical port of the device, 1-based.
    pub ib_port: u8,
    /// GID table index to route with (RoCE needs one), if chosen.
    pub gid_index: Option<u8>,
    /// Free text.
    pub comment: Option<String>,
}

/// A validated cluster configuration.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ClusterConfig {
    origin: String,
    layout: ConfigLayout,
    job: Option<String>,
    /// Sorted by rank: `ranks[i].rank == i`.
    ranks: Vec<RankConfig>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawNative {
    #[serde(default)]
    job: Option<String>,
    ranks: Vec<RawRank>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawRank {
    rank: u64,
    host: String,
    port: u64,
    device: String,
    #[serde(default)]
    ib_port: Option<u64>,
    #[serde(default)]
    gid_index: Option<u64>,
    #[serde(default)]
    comment: Option<String>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawLegacy {
    hosts: Vec<RawHost>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawHost {
    hostname: String,
    port: u64,
    ibdev: String,
    rankid: u64,
    #[serde(default)]
    comment: Option<String>,
}

#[derive(Serialize)]
struct OutNative<'a> {
    #[serde(skip_serializing_if = "Option::is_none")]
    job: Option<&'a str>,
    ranks: Vec<OutRank<'a>>,
}

#[derive(Serialize)]
struct OutRank<'a> {
    rank: u32,
    host: &'a str,
    port: u16,
    device: &'a str,
    ib_port: u8,
    #[serde(skip_serializing_if = "Option::is_none")]
    gid_index: Option<u8>,
    #[serde(skip_serializing_if = "Option::is_none")]
    comment: Option<&'a str>,
}

/// Field names as spelled in each layout, so errors quote the file's own words.
#[derive(Debug)]
struct FieldNames {
    list: &'static str,
    rank: &'static str,
    host: &'static str,
    port: &'static str,
    device: &'static str,
}

const NATIVE_FIELDS: FieldNames = FieldNames {
    list: "ranks",
    rank: "rank",
    host: "host",
    port: "port",
    device: "device",
};

const LEGACY_FIELDS: FieldNames = FieldNames {
    list: "hosts",
    rank: "rankid",
    host: "hostname",
    port: "port",
    device: "ibdev",
};

/// Layout-neutral entry before validation.
#[derive(Debug)]
struct Entry {
    rank: u64,
    host: String,
    port: u64,
    device: String,
    ib_port: Option<u64>,
    gid_index: Option<u64>,
    comment: Option<String>,
}

impl ClusterConfig {
    /// Reads and validates a configuration file (either layout).
    ///
    /// # Errors
    /// [`BootstrapError::ConfigRead`] if the file cannot be read, otherwise as
    /// [`ClusterConfig::from_json_str`] with the path as origin.
    pub fn from_file(path: impl AsRef<Path>) -> Result<Self> {
        let path = path.as_ref();
        let text = std::fs::read_to_string(path).map_err(|source| BootstrapError::ConfigRead {
            path: path.to_path_buf(),
            source,
        })?;
        Self::from_json_str(&text, &path.display().to_string())
    }

    /// Parses and validates a configuration; `origin` names it in errors
    /// (usually the file path).
    ///
    /// # Errors
    /// [`BootstrapError::ConfigParse`] for malformed JSON, unknown or missing
    /// fields and wrong types (with line and column);
    /// [`BootstrapError::ConfigInvalid`] for an empty list, duplicate or missing
    /// ranks, port 0 or above 65535, an empty host or device, `ib_port` outside
    /// 1..=255 or `gid_index` above 255.
    pub fn from_json_str(text: &str, origin: &str) -> Result<Self> {
        let parse_error = |error: serde_json::Error| BootstrapError::ConfigParse {
            file: origin.to_owned(),
            line: error.line(),
            column: error.column(),
            message: error.to_string(),
        };
        // Peek at the top level only to pick the layout; the typed parse below
        // then reports errors with positions in the original text.
        let probe: serde_json::Value = serde_json::from_str(text).map_err(parse_error)?;
        let Some(top) = probe.as_object() else {
            return Err(BootstrapError::ConfigInvalid {
                file: origin.to_owned(),
                entry: None,
                rank: None,
                field: None,
                reason: "the top level must be an object with a `ranks` (or legacy `hosts`) list"
                    .to_owned(),
            });
        };
        let legacy = top.contains_key("hosts") && !top.contains_key("ranks");
        let (layout, job, entries) = if legacy {
            let raw: RawLegacy = serde_json::from_str(text).map_err(parse_error)?;
            let entries = raw
                .hosts
                .into_iter()
                .map(|host| Entry {
                    rank: host.rankid,
                    host: host.hostname,
                    port: host.port,
                    device: host.ibdev,
                    ib_port: None,
                    gid_index: None,
                    comment: host.comment,
                })
                .collect();
            (ConfigLayout::Legacy, None, entries)
        } else {
            let raw: RawNative = serde_json::from_str(text).map_err(parse_error)?;
            let entries = raw
                .ranks
                .into_iter()
                .map(|rank| Entry {
                    rank: rank.rank,
                    host: rank.host,
                    port: rank.port,
                    device: rank.device,
                    ib_port: rank.ib_port,
                    gid_index: rank.gid_index,
                    comment: rank.comment,
                })
                .collect();
            (ConfigLayout::Native, raw.job, entries)
        };
        let ranks = validate(origin, layout, entries)?;
        Ok(Self {
            origin: origin.to_owned(),
            layout,
            job,
            ranks,
        })
    }

    /// Builds a configuration in code, with the same validation as the parser
    /// (`origin` names it in errors). The entries may come in any order.
    ///
    /// # Errors
    /// [`BootstrapError::ConfigInvalid`] as for [`ClusterConfig::from_json_str`].
    pub fn new(origin: &str, job: Option<String>, ranks: Vec<RankConfig>) -> Result<Self> {
        let entries = ranks
            .into_iter()
            .map(|rank| Entry {
                rank: u64::from(rank.rank),
                host: rank.host,
                port: u64::from(rank.port),
                device: rank.device,
                ib_port: Some(u64::from(rank.ib_port)),
                gid_index: rank.gid_index.map(u64::from),
                comment: rank.comment,
            })
            .collect();
        let ranks = validate(origin, ConfigLayout::Native, entries)?;
        Ok(Self {
            origin: origin.to_owned(),
            layout: ConfigLayout::Native,
            job,
            ranks,
        })
    }

    /// Number of ranks.
    #[must_use]
    pub fn world_size(&self) -> u32 {
        // Validation caps the list at u32::MAX entries.
        u32::try_from(self.ranks.len()).unwrap_or(u32::MAX)
    }

    /// The entry of `rank`.
    ///
    /// # Panics
    /// If `rank >= self.world_size()`; use [`ClusterConfig::get`] otherwise.
    #[must_use]
    pub fn rank(&self, rank: u32) -> &RankConfig {
        match self.get(rank) {
            Some(entry) => entry,
            None => panic!(
                "rank {rank} out of range for {} (world size {})",
                self.origin,
                self.ranks.len()
            ),
        }
    }

    /// The entry of `rank`, or `None` if it is out of range.
    #[must_use]
    pub fn get(&self, rank: u32) -> Option<&RankConfig> {
        self.ranks.get(usize::try_from(rank).ok()?)
    }

    /// All entries, indexed by rank.
    #[must_use]
    pub fn ranks(&self) -> &[RankConfig] {
        &self.ranks
    }

    /// The job name, if the file gave one.
    #[must_use]
    pub fn job(&self) -> Option<&str> {
        self.job.as_deref()
    }

    /// A 64-bit job id derived from the job name (FNV-1a), or 0 without one.
    ///
    /// Every rank computes the same id from the same file, so it can serve as
    /// the exchange's job id and keep two jobs on one port apart.
    #[must_use]
    pub fn job_id(&self) -> u64 {
        self.job.as_deref().map_or(0, |job| {
            job.bytes().fold(0xcbf2_9ce4_8422_2325u64, |hash, byte| {
                (hash ^ u64::from(byte)).wrapping_mul(0x0000_0100_0000_01b3)
            })
        })
    }

    /// Where the configuration came from (the path, or the origin name given).
    #[must_use]
    pub fn origin(&self) -> &str {
        &self.origin
    }

    /// The layout the configuration was read from.
    #[must_use]
    pub fn layout(&self) -> ConfigLayout {
        self.layout
    }

    /// Serializes the configuration in the native layout (pretty-printed).
    #[must_use]
    pub fn to_json_string(&self) -> String {
        let out = OutNative {
            job: self.job.as_deref(),
            ranks: self
                .ranks
                .iter()
                .map(|rank| OutRank {
                    rank: rank.rank,
                    host: &rank.host,
                    port: rank.port,
                    device: &rank.device,
                    ib_port: rank.ib_port,
                    gid_index: rank.gid_index,
                    comment: rank.comment.as_deref(),
                })
                .collect(),
        };
        // Plain structs of strings and integers always serialize.
        serde_json::to_string_pretty(&out).expect("config serializes")
    }

    /// Checks every rank's device against `available`.
    ///
    /// Useful when all hosts have the same devices; otherwise use
    /// [`ClusterConfig::validate_local_device`], since a process can only list
    /// its own machine's devices.
    ///
    /// # Errors
    /// [`BootstrapError::DeviceNotFound`] for the first rank whose device is absent.
    pub fn validate_devices(&self, available: &[&str]) -> Result<()> {
        self.ranks
            .iter()
            .try_for_each(|entry| self.check_device(entry, available))
    }

    /// Checks that `rank`'s device is among the local devices in `available`.
    ///
    /// # Errors
    /// [`BootstrapError::RankOutOfRange`] or [`BootstrapError::DeviceNotFound`].
    pub fn validate_local_device(&self, rank: u32, available: &[&str]) -> Result<()> {
        let entry = self.get(rank).ok_or(BootstrapError::RankOutOfRange {
            rank,
            world_size: self.world_size(),
        })?;
        self.check_device(entry, available)
    }

    /// Checks that the launcher's world size matches the number of ranks here.
    ///
    /// # Errors
    /// [`BootstrapError::WorldSizeMismatch`].
    pub fn check_launch(&self, launch: &LaunchInfo) -> Result<()> {
        if launch.world_size == self.world_size() {
            Ok(())
        } else {
            Err(BootstrapError::WorldSizeMismatch {
                file: self.origin.clone(),
                configured: self.world_size(),
                launched: launch.world_size,
                source_kind: launch.source,
            })
        }
    }

    fn check_device(&self, entry: &RankConfig, available: &[&str]) -> Result<()> {
        if available.contains(&entry.device.as_str()) {
            Ok(())
        } else {
            Err(BootstrapError::DeviceNotFound {
                file: self.origin.clone(),
                rank: entry.rank,
                device: entry.device.clone(),
                available: available.iter().map(|name| (*name).to_owned()).collect(),
            })
        }
    }
}

fn validate(origin: &str, layout: ConfigLayout, entries: Vec<Entry>) -> Result<Vec<RankConfig>> {
    let names = match layout {
        ConfigLayout::Native => &NATIVE_FIELDS,
        ConfigLayout::Legacy => &LEGACY_FIELDS,
    };
    let invalid = |entry: Option<usize>, rank: Option<u64>, field, reason: String| {
        BootstrapError::ConfigInvalid {
            file: origin.to_owned(),
            entry,
            rank: rank.and_then(|rank| u32::try_from(rank).ok()),
            field: Some(field),
            reason,
        }
    };
    if entries.is_empty() {
        return Err(invalid(
            None,
            None,
            names.list,
            "the list is empty".to_owned(),
        ));
    }
    let count = entries.len();
    if u32::try_from(count).is_err() {
        return Err(invalid(
            None,
            None,
            names.list,
            format!("{count} entries is too many"),
        ));
    }

    let mut seen: HashMap<u64, usize> = HashMap::with_capacity(count);
    for (index, entry) in entries.iter().enumerate() {
        if let Some(first) = seen.insert(entry.rank, index) {
            return Err(invalid(
                Some(index),
                Some(entry.rank),
                names.rank,
                format!("duplicate rank {} (also in entry {first})", entry.rank),
            ));
        }
    }
    if let Some(missing) = (0..count as u64).find(|rank| !seen.contains_key(rank)) {
        // With no duplicates and `count` entries, some entry is out of range.
        let culprit = entries
            .iter()
            .enumerate()
            .find(|(_, entry)| entry.rank >= count as u64)
            .map(|(index, entry)| format!(" (entry {index} has rank {})", entry.rank))
            .unwrap_or_default();
        return Err(invalid(
            None,
            Some(missing),
            names.rank,
            format!(
                "rank {missing} is missing: ranks must be exactly 0..={}{culprit}",
                count - 1
            ),
        ));
    }

    let mut ranks: Vec<Option<RankConfig>> = vec![None; count];
    for (index, entry) in entries.into_iter().enumerate() {
        let at = Some(index);
        let rank = Some(entry.rank);
        if entry.host.trim().is_empty() {
            return Err(invalid(at, rank, names.host, "is empty".to_owned()));
        }
        let port = match u16::try_from(entry.port) {
            Ok(0) => {
                return Err(invalid(
                    at,
                    rank,
                    names.port,
                    "port 0 is not allowed".to_owned(),
                ));
            }
            Ok(port) => port,
            Err(_) => {
                return Err(invalid(
                    at,
                    rank,
                    names.port,
                    format!("port {} is out of range 1..=65535", entry.port),
                ));
            }
        };
        if entry.device.trim().is_empty() {
            return Err(invalid(at, rank, names.device, "is empty".to_owned()));
        }
        let ib_port = match entry.ib_port.map(u8::try_from) {
            None => 1,
            Some(Ok(port)) if port > 0 => port,
            Some(_) => {
                return Err(invalid(
                    at,
                    rank,
                    "ib_port",
                    format!(
                        "{} is out of range 1..=255",
                        entry.ib_port.unwrap_or_default()
                    ),
                ));
            }
        };
        let gid_index = match entry.gid_index.map(u8::try_from) {
            None => None,
            Some(Ok(gid)) => Some(gid),
            Some(Err(_)) => {
                return Err(invalid(
                    at,
                    rank,
                    "gid_index",
                    format!(
                        "{} is out of range 0..=255",
                        entry.gid_index.unwrap_or_default()
                    ),
                ));
            }
        };
        // In range: checked against `count`, which fits in u32, above.
        let rank_u32 = u32::try_from(entry.rank).expect("rank below count");
        ranks[rank_u32 as usize] = Some(RankConfig {
            rank: rank_u32,
            host: entry.host,
            port,
            device: entry.device,
            ib_port,
            gid_index,
            comment: entry.comment,
        });
    }
    Ok(ranks.into_iter().flatten().collect())
}

#[cfg(test)]
mod tests;
