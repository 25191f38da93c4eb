//! [`AffinityError`], the one error type of this module.

use core::fmt;
use std::io;
use std::path::PathBuf;

use super::{ParseCpulistError, MAX_CPUS};

/// Error from reading CPU topology or changing a thread's affinity.
#[derive(Debug)]
#[non_exhaustive]
pub enum AffinityError {
    /// Reading a sysfs file failed for a reason other than its absence.
    Read {
        /// The file.
        path: PathBuf,
        /// What the operating system said.
        source: io::Error,
    },
    /// A sysfs CPU list could not be parsed.
    Parse {
        /// The file.
        path: PathBuf,
        /// What is wrong with its contents.
        source: ParseCpulistError,
    },
    /// A sysfs `numa_node` file did not hold an integer.
    BadNumaNode {
        /// The file.
        path: PathBuf,
        /// Its contents, trimmed.
        contents: String,
    },
    /// No RDMA device of that name exists under `class/infiniband`.
    NoSuchDevice {
        /// The name asked for.
        device: String,
        /// The directory that does not exist.
        path: PathBuf,
    },
    /// The device name is empty, `.`, `..`, or contains `/` or NUL: not a name sysfs uses, and
    /// not something to join to a path.
    InvalidDeviceName {
        /// The name given.
        device: String,
    },
    /// `sched_setaffinity` or `sched_getaffinity` failed; `EINVAL` usually means the CPU is
    /// offline or outside the thread's cgroup cpuset.
    Syscall {
        /// The system call that failed.
        call: &'static str,
        /// What the operating system said.
        source: io::Error,
    },
    /// A CPU id not below [`MAX_CPUS`].
    CpuOutOfRange {
        /// The id given.
        cpu: u32,
    },
    /// Asked for the `requested`-th CPU (counting from zero) of a set with only `available`
    /// CPUs the thread may run on.
    NotEnoughCpus {
        /// The index asked for.
        requested: usize,
        /// How many CPUs there were to choose from.
        available: usize,
    },
}

impl fmt::Display for AffinityError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Read { path, .. } => write!(f, "cannot read {}", path.display()),
            Self::Parse { path, .. } => write!(f, "bad CPU list in {}", path.display()),
            Self::BadNumaNode { path, contents } => {
                write!(
                    f,
                    "bad NUMA node {contents:?} in {}: expected an integer",
                    path.display()
                )
            }
            Self::NoSuchDevice { device, path } => write!(
                f,
                "no RDMA device named {device:?} ({} does not exist)",
                path.display()
            ),
            Self::InvalidDeviceName { device } => {
                write!(f, "{device:?} is not a valid RDMA device name")
            }
            Self::Syscall { call, .. } => write!(f, "{call} failed"),
            Self::CpuOutOfRange { cpu } => {
                write!(f, "CPU {cpu} out of range (at most {})", MAX_CPUS - 1)
            }
            Self::NotEnoughCpus {
                requested,
                available,
            } => write!(
                f,
                "asked for CPU index {requested} but only {available} CPUs are allowed"
            ),
        }
    }
}

impl core::error::Error for AffinityError {
    fn source(&self) -> Option<&(dyn core::error::Error + 'static)> {
        match self {
            Self::Read { source, .. } | Self::Syscall { source, .. } => Some(source),
            Self::Parse { source, .. } => Some(source),
            _ => None,
        }
    }
}
