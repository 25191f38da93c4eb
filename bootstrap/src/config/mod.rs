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
//! Unknown fields are errors in both. Ranks must be exactly `0..n`, each once, and
//! `n` at most [`MAX_WORLD`]. A file is read only up to [`MAX_CONFIG_BYTES`] and
//! parsed once, straight into the entries of its layout: a wrong or hostile file
//! costs at most that much memory and time.

use crate::error::ConfigError;
use core::fmt;
use core::marker::PhantomData;
use std::collections::HashMap;
use std::fs::File;
use std::io::Read;
use std::path::Path;

use rverbs_core::wire::MAX_WORLD;
use serde::de::{self, Deserializer, IgnoredAny, MapAccess, SeqAccess, Visitor};
use serde::{Deserialize, Serialize};

use crate::launch::LaunchInfo;

/// Largest cluster config read or parsed, in bytes: 4 MiB.
///
/// A config of the largest world, [`MAX_WORLD`] (4096) ranks, takes about 200 bytes
/// per rank with long host names and a comment (about 800 KiB in all; a test keeps
/// that true), so this leaves several times the room a real config needs, while a
/// wrong file (a log, a core dump, a generated monster) is refused before it is read.
pub const MAX_CONFIG_BYTES: u64 = 4 << 20;

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
struct RawHost {
    hostname: String,
    port: u64,
    ibdev: String,
    rankid: u64,
    #[serde(default)]
    comment: Option<String>,
}

/// A whole file of either layout, as parsed in its one pass.
struct RawConfig {
    job: Option<String>,
    list: RawList,
}

/// The rank list, whose key picks the layout.
enum RawList {
    Native(Bounded<Entry>),
    Legacy(Bounded<RawHost>),
}

/// The keys of the top level (any other is an error that lists these).
#[derive(Deserialize)]
#[serde(field_identifier, rename_all = "lowercase")]
enum TopField {
    Job,
    Ranks,
    Hosts,
}

impl<'de> Deserialize<'de> for RawConfig {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> core::result::Result<Self, D::Error> {
        deserializer.deserialize_map(TopVisitor)
    }
}

struct TopVisitor;

impl<'de> Visitor<'de> for TopVisitor {
    type Value = RawConfig;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("an object with a `ranks` (or legacy `hosts`) list")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> core::result::Result<RawConfig, A::Error> {
        let mut job: Option<Option<String>> = None;
        let mut list: Option<RawList> = None;
        while let Some(key) = map.next_key::<TopField>()? {
            match key {
                TopField::Job if job.is_some() => return Err(de::Error::duplicate_field("job")),
                TopField::Job => job = Some(map.next_value()?),
                TopField::Ranks | TopField::Hosts if list.is_some() => {
                    return Err(de::Error::custom(
                        "a second rank list: give either `ranks` (native layout) or `hosts` (legacy layout), once",
                    ));
                }
                TopField::Ranks => list = Some(RawList::Native(map.next_value()?)),
                TopField::Hosts => list = Some(RawList::Legacy(map.next_value()?)),
            }
        }
        let job = job.flatten();
        match list {
            None => Err(de::Error::missing_field("ranks")),
            Some(RawList::Legacy(_)) if job.is_some() => Err(de::Error::custom(
                "unknown field `job` in the legacy `hosts` layout; name a job with the native `ranks` layout",
            )),
            Some(list) => Ok(RawConfig { job, list }),
        }
    }
}

/// A list kept to its first [`MAX_WORLD`] entries; the rest are only counted
/// (and not stored), so an oversized list is refused with its size.
struct Bounded<T> {
    items: Vec<T>,
    total: usize,
}

impl<'de, T: Deserialize<'de>> Deserialize<'de> for Bounded<T> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> core::result::Result<Self, D::Error> {
        deserializer.deserialize_seq(BoundedVisitor(PhantomData))
    }
}

struct BoundedVisitor<T>(PhantomData<T>);

impl<'de, T: Deserialize<'de>> Visitor<'de> for BoundedVisitor<T> {
    type Value = Bounded<T>;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a list of rank entries")
    }

    fn visit_seq<A: SeqAccess<'de>>(
        self,
        mut seq: A,
    ) -> core::result::Result<Bounded<T>, A::Error> {
        let keep = MAX_WORLD as usize;
        let mut items = Vec::with_capacity(seq.size_hint().unwrap_or(0).min(keep));
        let mut total = 0usize;
        loop {
            let more = if items.len() < keep {
                seq.next_element::<T>()?.map(|item| items.push(item))
            } else {
                seq.next_element::<IgnoredAny>()?.map(|_| ())
            };
            if more.is_none() {
                break;
            }
            total += 1;
        }
        Ok(Bounded { items, total })
    }
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

/// Layout-neutral entry before validation; the native layout's entries parse straight into
/// it (the legacy layout's are mapped).
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Entry {
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

impl ClusterConfig {
    /// Reads and validates a configuration file (either layout).
    ///
    /// # Errors
    /// [`ConfigError::Read`] if the file cannot be read;
    /// [`ConfigError::TooLarge`] if it is larger than [`MAX_CONFIG_BYTES`]
    /// (judged before reading it); otherwise as [`ClusterConfig::from_json_str`]
    /// with the path as origin.
    pub fn from_file(path: impl AsRef<Path>) -> Result<Self, ConfigError> {
        let path = path.as_ref();
        let read_error = |source| ConfigError::Read {
            path: path.to_path_buf(),
            source,
        };
        let too_large = |len| ConfigError::TooLarge {
            file: path.display().to_string(),
            len,
            limit: MAX_CONFIG_BYTES,
        };
        let file = File::open(path).map_err(read_error)?;
        let len = file.metadata().map_err(read_error)?.len();
        if len > MAX_CONFIG_BYTES {
            return Err(too_large(Some(len)));
        }
        // The file may grow meanwhile, or be a pipe with no length: read one byte
        // past the cap at most.
        let mut text = String::new();
        file.take(MAX_CONFIG_BYTES + 1)
            .read_to_string(&mut text)
            .map_err(read_error)?;
        if text.len() as u64 > MAX_CONFIG_BYTES {
            return Err(too_large(None));
        }
        Self::from_json_str(&text, &path.display().to_string())
    }

    /// Parses and validates a configuration; `origin` names it in errors
    /// (usually the file path).
    ///
    /// # Errors
    /// [`ConfigError::TooLarge`] for a text over [`MAX_CONFIG_BYTES`];
    /// [`ConfigError::Parse`] for malformed JSON, unknown, repeated or
    /// missing fields and wrong types (with line and column);
    /// [`ConfigError::Invalid`] for a top level that is not an object,
    /// an empty list, more than [`MAX_WORLD`] ranks, duplicate or missing ranks,
    /// port 0 or above 65535, an empty host or device, `ib_port` outside 1..=255
    /// or `gid_index` above 255.
    pub fn from_json_str(text: &str, origin: &str) -> Result<Self, ConfigError> {
        if text.len() as u64 > MAX_CONFIG_BYTES {
            return Err(ConfigError::TooLarge {
                file: origin.to_owned(),
                len: Some(text.len() as u64),
                limit: MAX_CONFIG_BYTES,
            });
        }
        // Only an object can be a config; say so in the file's terms rather than
        // the parser's ("invalid type: sequence").
        if text
            .trim_start_matches([' ', '\t', '\n', '\r'])
            .chars()
            .next()
            .is_some_and(|first| first != '{')
        {
            return Err(ConfigError::Invalid {
                file: origin.to_owned(),
                entry: None,
                rank: None,
                field: None,
                reason: "the top level must be an object with a `ranks` (or legacy `hosts`) list"
                    .to_owned(),
            });
        }
        // One pass, straight into the entries of the layout the list's key names.
        let raw: RawConfig = serde_json::from_str(text).map_err(|error| ConfigError::Parse {
            file: origin.to_owned(),
            line: error.line(),
            column: error.column(),
            message: error.to_string(),
        })?;
        let (layout, total, entries) = match raw.list {
            RawList::Legacy(hosts) => {
                let entries = hosts
                    .items
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
                (ConfigLayout::Legacy, hosts.total, entries)
            }
            RawList::Native(ranks) => (ConfigLayout::Native, ranks.total, ranks.items),
        };
        let ranks = validate(origin, layout, entries, total)?;
        Ok(Self {
            origin: origin.to_owned(),
            layout,
            job: raw.job,
            ranks,
        })
    }

    /// Builds a configuration in code, with the same validation as the parser
    /// (`origin` names it in errors), [`MAX_WORLD`] included. The entries may come
    /// in any order.
    ///
    /// # Errors
    /// [`ConfigError::Invalid`] as for [`ClusterConfig::from_json_str`].
    pub fn new(
        origin: &str,
        job: Option<String>,
        ranks: Vec<RankConfig>,
    ) -> Result<Self, ConfigError> {
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
            .collect::<Vec<_>>();
        let total = entries.len();
        let ranks = validate(origin, ConfigLayout::Native, entries, total)?;
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
        // Validation caps the list at MAX_WORLD entries.
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
    /// [`ConfigError::DeviceNotFound`] for the first rank whose device is absent.
    pub fn validate_devices(&self, available: &[&str]) -> Result<(), ConfigError> {
        self.ranks
            .iter()
            .try_for_each(|entry| self.check_device(entry, available))
    }

    /// Checks that `rank`'s device is among the local devices in `available`.
    ///
    /// # Errors
    /// [`ConfigError::NoSuchRank`] or [`ConfigError::DeviceNotFound`].
    pub fn validate_local_device(&self, rank: u32, available: &[&str]) -> Result<(), ConfigError> {
        let entry = self.get(rank).ok_or_else(|| ConfigError::NoSuchRank {
            file: self.origin.clone(),
            rank,
            world_size: self.world_size(),
        })?;
        self.check_device(entry, available)
    }

    /// Checks that the launcher's world size matches the number of ranks here.
    ///
    /// # Errors
    /// [`ConfigError::WorldSizeMismatch`].
    pub fn check_launch(&self, launch: &LaunchInfo) -> Result<(), ConfigError> {
        if launch.world_size == self.world_size() {
            Ok(())
        } else {
            Err(ConfigError::WorldSizeMismatch {
                file: self.origin.clone(),
                configured: self.world_size(),
                launched: launch.world_size,
                source_kind: launch.source,
            })
        }
    }

    fn check_device(&self, entry: &RankConfig, available: &[&str]) -> Result<(), ConfigError> {
        if available.contains(&entry.device.as_str()) {
            Ok(())
        } else {
            Err(ConfigError::DeviceNotFound {
                file: self.origin.clone(),
                rank: entry.rank,
                device: entry.device.clone(),
                available: available.iter().map(|name| (*name).to_owned()).collect(),
            })
        }
    }
}

/// Checks `entries`, the first of `total` listed (the parser keeps at most
/// [`MAX_WORLD`]), and returns them sorted by rank.
fn validate(
    origin: &str,
    layout: ConfigLayout,
    entries: Vec<Entry>,
    total: usize,
) -> Result<Vec<RankConfig>, ConfigError> {
    let names = match layout {
        ConfigLayout::Native => &NATIVE_FIELDS,
        ConfigLayout::Legacy => &LEGACY_FIELDS,
    };
    let invalid =
        |entry: Option<usize>, rank: Option<u64>, field, reason: String| ConfigError::Invalid {
            file: origin.to_owned(),
            entry,
            rank: rank.and_then(|rank| u32::try_from(rank).ok()),
            field: Some(field),
            reason,
        };
    if entries.is_empty() {
        return Err(invalid(
            None,
            None,
            names.list,
            "the list is empty".to_owned(),
        ));
    }
    if total > MAX_WORLD as usize {
        return Err(invalid(
            None,
            None,
            names.list,
            format!(
                "lists {total} ranks, above the maximum world size of {MAX_WORLD} (rverbs_core::wire::MAX_WORLD)"
            ),
        ));
    }
    let count = entries.len();

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
