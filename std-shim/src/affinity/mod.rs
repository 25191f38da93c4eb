//! CPU pinning and the NUMA locality of RDMA devices.
//!
//! A polling thread should run on a core of the NUMA node its NIC is attached to: completions
//! and doorbells then stay on the local memory controller and PCIe root. This module reads
//! where a device sits from sysfs, picks a CPU there that the thread is allowed to use, and
//! pins the calling thread to it:
//!
//! ```no_run
//! # fn main() -> Result<(), rverbs_std_shim::affinity::AffinityError> {
//! // Rank 0 of this host takes the first CPU close to mlx5_0, rank 1 the second, …
//! let pinned = rverbs_std_shim::affinity::pin_near_device("mlx5_0", 0)?;
//! if !pinned.local {
//!     eprintln!("warning: CPU {} is not local to mlx5_0", pinned.cpu);
//! }
//! # Ok(())
//! # }
//! ```
//!
//! Everything that reads sysfs goes through a [`SysfsRoot`], so tests can point it at a fake
//! tree. CPU lists use the kernel's text format, parsed by [`parse_cpulist`].

mod cpulist;
mod cpuset;
mod error;
mod placement;
mod syscall;
mod sysfs;
#[cfg(test)]
mod test_support;

pub use cpulist::{parse_cpulist, CpulistErrorKind, ParseCpulistError};
pub use cpuset::{CpuSet, Cpus, MAX_CPUS};
pub use error::AffinityError;
pub use placement::{pin_near_device, DeviceLocality, PinnedTo};
pub use syscall::{current_thread_affinity, pin_current_thread, set_current_thread_affinity};
pub use sysfs::{online_cpus, SysfsRoot};
