//! What sysfs says about CPUs and RDMA devices: online CPUs, NUMA nodes, device locality.

use std::io;
use std::path::{Path, PathBuf};

use super::{parse_cpulist, AffinityError, CpuSet, DeviceLocality, MAX_CPUS};

/// The CPUs currently online, from `/sys/devices/system/cpu/online`.
///
/// Where sysfs is not mounted (some containers), falls back to `0..n` with `n` from
/// `sysconf(_SC_NPROCESSORS_ONLN)`, which is exact unless CPUs were taken offline.
pub fn online_cpus() -> Result<CpuSet, AffinityError> {
    let root = SysfsRoot::default();
    let path = root.0.join("devices/system/cpu/online");
    if let Some(text) = read_optional(&path)? {
        return parse_file(&path, &text);
    }
    // SAFETY: sysconf has no preconditions; it only reads system configuration.
    let n = unsafe { libc::sysconf(libc::_SC_NPROCESSORS_ONLN) };
    let n = u32::try_from(n.max(1)).unwrap_or(MAX_CPUS).min(MAX_CPUS);
    let mut set = CpuSet::new();
    set.insert_range(0, n - 1);
    Ok(set)
}

/// Where sysfs is mounted: `/sys` by default, a temporary directory in tests.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct SysfsRoot(pub PathBuf);

impl Default for SysfsRoot {
    #[inline]
    fn default() -> Self {
        Self(PathBuf::from("/sys"))
    }
}

impl SysfsRoot {
    /// A sysfs tree rooted at `path`.
    #[inline]
    pub fn new(path: impl Into<PathBuf>) -> Self {
        Self(path.into())
    }

    /// The root directory.
    #[inline]
    pub fn path(&self) -> &Path {
        &self.0
    }

    /// The CPUs listed in `devices/system/cpu/online`.
    pub fn online_cpus(&self) -> Result<CpuSet, AffinityError> {
        read_cpulist(&self.0.join("devices/system/cpu/online"))
    }

    /// The CPUs of NUMA node `node`, from `devices/system/node/node<node>/cpulist`.
    pub fn node_cpus(&self, node: u32) -> Result<CpuSet, AffinityError> {
        read_cpulist(
            &self
                .0
                .join(format!("devices/system/node/node{node}/cpulist")),
        )
    }

    /// The NUMA node of RDMA device `device`, from
    /// `class/infiniband/<device>/device/numa_node`; `None` when the file is missing or holds
    /// `-1` (no NUMA, or a virtual device such as SoftRoCE's `rxe0`).
    pub fn device_numa_node(&self, device: &str) -> Result<Option<u32>, AffinityError> {
        let dir = self.device_dir(device)?;
        read_numa_node(&dir.join("device/numa_node"))
    }

    /// The CPUs local to RDMA device `device`, from its `device/local_cpulist`, or else the
    /// CPU list of its NUMA node. `None` when neither is known (or the list is empty).
    pub fn device_local_cpus(&self, device: &str) -> Result<Option<CpuSet>, AffinityError> {
        Ok(self.device_locality(device)?.local_cpus)
    }

    /// Both the NUMA node and the local CPUs of RDMA device `device`.
    ///
    /// Fails with [`AffinityError::NoSuchDevice`] when `class/infiniband/<device>` does not
    /// exist; a device whose locality is unknown is not an error.
    pub fn device_locality(&self, device: &str) -> Result<DeviceLocality, AffinityError> {
        let dir = self.device_dir(device)?;
        let numa_node = read_numa_node(&dir.join("device/numa_node"))?;
        let local_path = dir.join("device/local_cpulist");
        let mut local_cpus = match read_optional(&local_path)? {
            Some(text) => Some(parse_file(&local_path, &text)?),
            None => None,
        };
        if local_cpus.is_none() {
            if let Some(node) = numa_node {
                let node_path = self
                    .0
                    .join(format!("devices/system/node/node{node}/cpulist"));
                if let Some(text) = read_optional(&node_path)? {
                    local_cpus = Some(parse_file(&node_path, &text)?);
                }
            }
        }
        Ok(DeviceLocality {
            numa_node,
            local_cpus: local_cpus.filter(|set| !set.is_empty()),
        })
    }

    fn device_dir(&self, device: &str) -> Result<PathBuf, AffinityError> {
        if device.is_empty() || device == "." || device == ".." || device.contains(['/', '\0']) {
            return Err(AffinityError::InvalidDeviceName {
                device: device.to_owned(),
            });
        }
        let dir = self.0.join("class/infiniband").join(device);
        match dir.try_exists() {
            Ok(true) => Ok(dir),
            Ok(false) => Err(AffinityError::NoSuchDevice {
                device: device.to_owned(),
                path: dir,
            }),
            Err(source) => Err(AffinityError::Read { path: dir, source }),
        }
    }
}

/// Reads a file, mapping "does not exist" to `None`.
fn read_optional(path: &Path) -> Result<Option<String>, AffinityError> {
    match std::fs::read_to_string(path) {
        Ok(text) => Ok(Some(text)),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
        Err(source) => Err(AffinityError::Read {
            path: path.to_owned(),
            source,
        }),
    }
}

fn read_cpulist(path: &Path) -> Result<CpuSet, AffinityError> {
    let text = std::fs::read_to_string(path).map_err(|source| AffinityError::Read {
        path: path.to_owned(),
        source,
    })?;
    parse_file(path, &text)
}

fn parse_file(path: &Path, text: &str) -> Result<CpuSet, AffinityError> {
    parse_cpulist(text).map_err(|source| AffinityError::Parse {
        path: path.to_owned(),
        source,
    })
}

fn read_numa_node(path: &Path) -> Result<Option<u32>, AffinityError> {
    let Some(text) = read_optional(path)? else {
        return Ok(None);
    };
    let trimmed = text.trim();
    match trimmed.parse::<i64>() {
        Ok(n) if n < 0 => Ok(None),
        Ok(n) => u32::try_from(n)
            .map(Some)
            .map_err(|_| AffinityError::BadNumaNode {
                path: path.to_owned(),
                contents: trimmed.to_owned(),
            }),
        Err(_) => Err(AffinityError::BadNumaNode {
            path: path.to_owned(),
            // A real numa_node file is a few bytes; bound what a broken one can put in an
            // error message.
            contents: trimmed.chars().take(64).collect(),
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::affinity::current_thread_affinity;
    use crate::affinity::test_support::{set, TempTree, DEV};

    #[test]
    fn default_root_is_sys() {
        assert_eq!(SysfsRoot::default().path(), Path::new("/sys"));
    }

    #[test]
    fn device_with_local_cpulist() {
        let t = TempTree::new();
        t.file(&format!("{DEV}/numa_node"), "1\n")
            .file(&format!("{DEV}/local_cpulist"), "8-15\n")
            // Must not be consulted when local_cpulist exists.
            .file("devices/system/node/node1/cpulist", "garbage");
        let root = t.root();
        assert_eq!(root.device_numa_node("mlx5_0").unwrap(), Some(1));
        let loc = root.device_locality("mlx5_0").unwrap();
        assert_eq!(loc.numa_node, Some(1));
        assert_eq!(loc.local_cpus.unwrap().to_string(), "8-15");
    }

    #[test]
    fn falls_back_to_node_cpulist() {
        let t = TempTree::new();
        t.file(&format!("{DEV}/numa_node"), "1\n")
            .file("devices/system/node/node1/cpulist", "4-7\n");
        let cpus = t.root().device_local_cpus("mlx5_0").unwrap().unwrap();
        assert_eq!(cpus.to_string(), "4-7");
        assert_eq!(t.root().node_cpus(1).unwrap().to_string(), "4-7");
    }

    #[test]
    fn devices_without_node_or_cpu_list_have_unknown_locality() {
        // numa_node = -1 and no cpulist anywhere: a virtual device such as rxe0.
        let t = TempTree::new();
        t.file(&format!("{DEV}/numa_node"), "-1\n");
        let loc = t.root().device_locality("mlx5_0").unwrap();
        assert_eq!(loc, DeviceLocality::new(None, None));

        // No device/ directory at all.
        let t = TempTree::new();
        t.dir("class/infiniband/rxe0");
        assert_eq!(t.root().device_numa_node("rxe0").unwrap(), None);
        assert_eq!(t.root().device_local_cpus("rxe0").unwrap(), None);

        // Node known but its cpulist missing, and an empty local list.
        let t = TempTree::new();
        t.file(&format!("{DEV}/numa_node"), "3\n")
            .file(&format!("{DEV}/local_cpulist"), "\n");
        let loc = t.root().device_locality("mlx5_0").unwrap();
        assert_eq!(loc, DeviceLocality::new(Some(3), None));
    }

    #[test]
    fn single_socket_vm_local_list_without_node() {
        // Common on VMs: numa_node -1 yet a local_cpulist covering every CPU.
        let t = TempTree::new();
        t.file(&format!("{DEV}/numa_node"), "-1\n")
            .file(&format!("{DEV}/local_cpulist"), "0-3\n");
        let loc = t.root().device_locality("mlx5_0").unwrap();
        let pick = loc.choose(&set(&[0, 1, 2, 3]), 2).unwrap();
        assert_eq!(
            (pick.cpu, pick.numa_node, pick.local, pick.locality_known),
            (2, None, true, true)
        );
    }

    #[test]
    fn missing_and_invalid_devices() {
        let t = TempTree::new();
        t.dir("class/infiniband/mlx5_0");
        match t.root().device_locality("mlx5_9") {
            Err(AffinityError::NoSuchDevice { device, path }) => {
                assert_eq!(device, "mlx5_9");
                assert!(path.ends_with("class/infiniband/mlx5_9"));
            }
            other => panic!("{other:?}"),
        }
        for bad in ["", ".", "..", "../mlx5_0", "a/b", "x\0"] {
            assert!(
                matches!(
                    t.root().device_locality(bad),
                    Err(AffinityError::InvalidDeviceName { .. })
                ),
                "{bad:?}"
            );
        }
    }

    #[test]
    fn malformed_or_unreadable_sysfs_files_are_errors_naming_the_file() {
        let t = TempTree::new();
        t.file(&format!("{DEV}/numa_node"), "zero\n");
        let e = t.root().device_numa_node("mlx5_0").unwrap_err();
        assert!(matches!(&e, AffinityError::BadNumaNode { contents, .. } if contents == "zero"));
        assert!(e.to_string().contains("numa_node"), "{e}");

        let t = TempTree::new();
        t.file(&format!("{DEV}/numa_node"), "99999999999\n");
        assert!(matches!(
            t.root().device_numa_node("mlx5_0"),
            Err(AffinityError::BadNumaNode { .. })
        ));

        let t = TempTree::new();
        t.file(&format!("{DEV}/local_cpulist"), "0-3,oops\n");
        let e = t.root().device_locality("mlx5_0").unwrap_err();
        match &e {
            AffinityError::Parse { path, source } => {
                assert!(path.ends_with("local_cpulist"));
                assert_eq!(source.offset(), 4);
            }
            other => panic!("{other:?}"),
        }
        assert!(core::error::Error::source(&e).is_some());

        // A directory where a file should be is a read error, not "unknown".
        let t = TempTree::new();
        t.dir(&format!("{DEV}/numa_node"));
        let e = t.root().device_numa_node("mlx5_0").unwrap_err();
        assert!(matches!(&e, AffinityError::Read { path, .. } if path.ends_with("numa_node")));
        assert!(core::error::Error::source(&e).is_some());
    }

    #[test]
    fn online_cpus_from_fake_tree() {
        let t = TempTree::new();
        t.file("devices/system/cpu/online", "0-5,7\n");
        assert_eq!(t.root().online_cpus().unwrap().to_string(), "0-5,7");
        let empty = TempTree::new();
        assert!(matches!(
            empty.root().online_cpus(),
            Err(AffinityError::Read { .. })
        ));
    }

    #[test]
    fn online_cpus_of_this_machine() {
        let online = online_cpus().unwrap();
        assert!(!online.is_empty());
        // Every CPU this thread may use is online.
        let allowed = current_thread_affinity().unwrap();
        assert_eq!(allowed.difference(&online), CpuSet::new());
    }
}
