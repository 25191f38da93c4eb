//! Helpers shared by the unit tests of the `affinity` modules: building sets and fake sysfs
//! trees.

use core::sync::atomic::{AtomicU32, Ordering};
use std::path::PathBuf;

use super::{CpuSet, SysfsRoot};

pub(super) fn set(cpus: &[u32]) -> CpuSet {
    let mut s = CpuSet::new();
    for &c in cpus {
        s.insert(c).unwrap();
    }
    s
}

/// A temporary directory removed on drop.
pub(super) struct TempTree(PathBuf);

impl TempTree {
    pub(super) fn new() -> Self {
        static NEXT: AtomicU32 = AtomicU32::new(0);
        let dir = std::env::temp_dir().join(format!(
            "rverbs-std-shim-{}-{}",
            std::process::id(),
            NEXT.fetch_add(1, Ordering::Relaxed)
        ));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        Self(dir)
    }

    pub(super) fn file(&self, rel: &str, contents: &str) -> &Self {
        let path = self.0.join(rel);
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(path, contents).unwrap();
        self
    }

    pub(super) fn dir(&self, rel: &str) -> &Self {
        std::fs::create_dir_all(self.0.join(rel)).unwrap();
        self
    }

    pub(super) fn root(&self) -> SysfsRoot {
        SysfsRoot::new(&self.0)
    }
}

impl Drop for TempTree {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

pub(super) const DEV: &str = "class/infiniband/mlx5_0/device";
