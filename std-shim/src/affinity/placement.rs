//! NUMA placement: choosing a CPU near an RDMA device, and pinning the calling thread to it.

use super::{current_thread_affinity, pin_current_thread, AffinityError, CpuSet, SysfsRoot};

/// Picks the `nth` CPU near `device` among those the calling thread may use, and pins the
/// calling thread to it. Reads the real `/sys`; see [`SysfsRoot::pin_near_device`].
pub fn pin_near_device(device: &str, nth: usize) -> Result<PinnedTo, AffinityError> {
    SysfsRoot::default().pin_near_device(device, nth)
}

// Kept beside `choose` rather than with the sysfs readers: this is where reading the
// topology, choosing and pinning meet.
impl SysfsRoot {
    /// Chooses a CPU for the `nth` thread near `device` (see [`DeviceLocality::choose`])
    /// among the calling thread's allowed CPUs, and pins the calling thread to it.
    pub fn pin_near_device(&self, device: &str, nth: usize) -> Result<PinnedTo, AffinityError> {
        let locality = self.device_locality(device)?;
        let allowed = current_thread_affinity()?;
        let choice = locality.choose(&allowed, nth)?;
        pin_current_thread(choice.cpu)?;
        Ok(choice)
    }
}

/// Where an RDMA device sits, as far as sysfs says. Returned by
/// [`SysfsRoot::device_locality`].
#[derive(Clone, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct DeviceLocality {
    /// The device's NUMA node, if known.
    pub numa_node: Option<u32>,
    /// The CPUs local to the device, if known.
    pub local_cpus: Option<CpuSet>,
}

impl DeviceLocality {
    /// Locality for a device at `numa_node` with `local_cpus`; mostly for tests and for
    /// callers that learn the topology some other way.
    #[inline]
    pub fn new(numa_node: Option<u32>, local_cpus: Option<CpuSet>) -> Self {
        Self {
            numa_node,
            local_cpus,
        }
    }

    /// Chooses the CPU for the `nth` thread (counting from zero) that wants to run near this
    /// device, among `allowed`. Does not pin anything.
    ///
    /// Candidates are ordered: first the allowed CPUs local to the device, ascending, then
    /// the other allowed CPUs, ascending. So with `k` local CPUs, threads `0..k` land on the
    /// device's node and later ones spill over to remote CPUs (reported as `local: false`)
    /// instead of doubling up on a core. When the device's locality is unknown every allowed
    /// CPU is a candidate and the result says `locality_known: false`.
    ///
    /// Fails with [`AffinityError::NotEnoughCpus`] when `nth >= allowed.len()`.
    pub fn choose(&self, allowed: &CpuSet, nth: usize) -> Result<PinnedTo, AffinityError> {
        let (local, remote) = match &self.local_cpus {
            Some(local) => (local.intersection(allowed), allowed.difference(local)),
            None => (CpuSet::new(), allowed.clone()),
        };
        let local_count = local.len();
        let (cpu, is_local) = if nth < local_count {
            (local.iter().nth(nth), true)
        } else {
            (remote.iter().nth(nth - local_count), false)
        };
        match cpu {
            Some(cpu) => Ok(PinnedTo {
                cpu,
                numa_node: self.numa_node,
                local: is_local,
                locality_known: self.local_cpus.is_some(),
            }),
            None => Err(AffinityError::NotEnoughCpus {
                requested: nth,
                available: local_count + remote.len(),
            }),
        }
    }
}

/// The outcome of [`pin_near_device`]: which CPU was chosen and how close it is to the device.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub struct PinnedTo {
    /// The CPU the thread now runs on.
    pub cpu: u32,
    /// The device's NUMA node, if sysfs knows it.
    pub numa_node: Option<u32>,
    /// Whether `cpu` is one of the device's local CPUs. `false` when the locality is unknown
    /// or when all local CPUs were taken by lower `nth` and the choice spilled over.
    pub local: bool,
    /// Whether sysfs said which CPUs are local to the device at all. When `false` the CPU was
    /// chosen from the allowed set blindly.
    pub locality_known: bool,
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::affinity::test_support::{set, TempTree, DEV};

    // ---- choosing ----

    #[test]
    fn choose_prefers_local_then_spills_over() {
        let loc = DeviceLocality::new(Some(1), Some(set(&[4, 5, 6, 7])));
        let allowed = set(&[0, 1, 5, 6, 7]);
        let picks: Vec<(u32, bool)> = (0..5)
            .map(|n| {
                let p = loc.choose(&allowed, n).unwrap();
                assert_eq!(p.numa_node, Some(1));
                assert!(p.locality_known);
                (p.cpu, p.local)
            })
            .collect();
        assert_eq!(
            picks,
            [(5, true), (6, true), (7, true), (0, false), (1, false)]
        );
        match loc.choose(&allowed, 5) {
            Err(AffinityError::NotEnoughCpus {
                requested: 5,
                available: 5,
            }) => {}
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn choose_with_no_allowed_local_cpu() {
        // The cpuset confines us to the other socket: still works, says so.
        let loc = DeviceLocality::new(Some(0), Some(set(&[0, 1])));
        let p = loc.choose(&set(&[2, 3]), 0).unwrap();
        assert_eq!((p.cpu, p.local, p.locality_known), (2, false, true));
    }

    #[test]
    fn choose_with_unknown_locality() {
        let loc = DeviceLocality::default();
        let p = loc.choose(&set(&[3, 9]), 1).unwrap();
        assert_eq!(
            (p.cpu, p.numa_node, p.local, p.locality_known),
            (9, None, false, false)
        );
        assert!(loc.choose(&CpuSet::new(), 0).is_err());
    }

    // ---- real pinning (in a spawned thread, so the test harness's threads keep their mask) --

    #[test]
    fn pin_near_fake_device() {
        std::thread::spawn(|| {
            let allowed = current_thread_affinity().unwrap();
            let local_cpu = allowed.iter().last().unwrap();
            let t = TempTree::new();
            t.file(&format!("{DEV}/numa_node"), "0\n")
                .file(&format!("{DEV}/local_cpulist"), &format!("{local_cpu}\n"));
            let pinned = t.root().pin_near_device("mlx5_0", 0).unwrap();
            assert_eq!(
                (
                    pinned.cpu,
                    pinned.numa_node,
                    pinned.local,
                    pinned.locality_known
                ),
                (local_cpu, Some(0), true, true)
            );
            assert_eq!(
                current_thread_affinity().unwrap(),
                CpuSet::single(local_cpu).unwrap()
            );
            // The thread is now confined to one CPU, so a second rank does not fit.
            assert!(matches!(
                t.root().pin_near_device("mlx5_0", 1),
                Err(AffinityError::NotEnoughCpus { .. })
            ));
        })
        .join()
        .unwrap();
    }

    #[test]
    fn pin_near_device_with_unknown_locality() {
        std::thread::spawn(|| {
            let allowed = current_thread_affinity().unwrap();
            let t = TempTree::new();
            t.dir("class/infiniband/rxe0");
            let pinned = t.root().pin_near_device("rxe0", 0).unwrap();
            assert_eq!(pinned.cpu, allowed.first().unwrap());
            assert!(!pinned.local && !pinned.locality_known);
            assert_eq!(pinned.numa_node, None);
        })
        .join()
        .unwrap();
    }
}
