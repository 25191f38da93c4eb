#![deny(unsafe_op_in_unsafe_fn)]
//! What only `std` can give `rverbs-core`: a monotonic clock, back-off policies that yield
//! or sleep, CPU/NUMA pinning near an RDMA device, page-aligned or huge-page memory for
//! memory regions, and random initial packet sequence numbers ([`random`]).
//!
//! `rverbs-core` is `no_std`: it takes time from a [`Clock`](rverbs_core::poll::Clock) and
//! waits through a [`Backoff`](rverbs_core::poll::Backoff) supplied by the caller. This crate
//! supplies the operating-system-backed ones.
//!
//! # Quick start
//!
//! ```
//! use core::time::Duration;
//! use rverbs_core::poll::{Backoff, Clock, Deadline};
//! use rverbs_std_shim::{AlignedBuffer, MapOptions, StdClock, WaitPolicy};
//!
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! // Memory to register as a memory region: page-aligned, zeroed, whole pages.
//! let mut buf = AlignedBuffer::with_options(10_000, MapOptions::new().populate(true))?;
//! assert_eq!(buf.as_ptr() as usize % buf.page_size(), 0);
//! assert!(buf.len() >= 10_000);
//! buf.as_mut_slice()[..5].copy_from_slice(b"hello");
//!
//! // Wait for something with a deadline, the way core's polling loops do.
//! let clock = StdClock::new();
//! let deadline = Deadline::after(&clock, Duration::from_millis(1));
//! // Spin 64 empty polls, then sleep 20 µs each: the default, right when ranks share cores.
//! let mut backoff = WaitPolicy::default().backoff();
//! while !deadline.passed(&clock) {
//!     backoff.snooze(); // a real loop would poll a completion queue here
//! }
//! assert!(clock.now() >= deadline.instant());
//! # Ok(())
//! # }
//! ```
//!
//! Pinning a polling thread next to its NIC (needs a real device, hence `no_run`):
//!
//! ```no_run
//! # fn main() -> Result<(), rverbs_std_shim::affinity::AffinityError> {
//! let pinned = rverbs_std_shim::pin_near_device("mlx5_0", 0)?;
//! println!("on CPU {} (NUMA node {:?}, local: {})", pinned.cpu, pinned.numa_node, pinned.local);
//! # Ok(())
//! # }
//! ```
//!
//! # Cargo features
//!
//! None. The crate always needs `std`. [`affinity`] and [`buffer`] use Linux system calls
//! (`sched_setaffinity`, `mmap` with `MAP_POPULATE`/`MAP_HUGETLB`) and sysfs, and exist only
//! when compiling for Linux; [`clock`] and [`backoff`] are portable.
//!
//! # Thread safety
//!
//! - [`StdClock`] is `Copy + Send + Sync`; copies share the epoch, so instants from copies
//!   compare meaningfully.
//! - [`AlignedBuffer`] and [`HugePageBuffer`] are `Send + Sync`, with the same rules as a
//!   `Box<[u8]>`: writing needs `&mut`. Once registered with a NIC, the hardware is a second
//!   writer the borrow checker cannot see; `rverbs-core`'s posting contract (a buffer named
//!   by a work request stays valid and unaliased until its completion is polled) covers that.
//! - The affinity functions act on the *calling* thread only, and threads it spawns later
//!   inherit its mask. Pin from inside the thread that will poll.
//!
//! # Resource cleanup
//!
//! Buffers unmap their memory on drop (which also releases any `mlock`). Deregister a memory
//! region before dropping the buffer behind it: `rverbs-core` ties the two lifetimes together
//! so safe code cannot get this wrong. Pinning is not undone when a value drops; it lasts
//! until the thread exits or changes its mask again
//! ([`set_current_thread_affinity`] with a saved [`current_thread_affinity`]).

pub mod backoff;
pub mod clock;
#[cfg(target_os = "linux")]
pub mod counters;
#[cfg(unix)]
pub mod hangup;
pub mod random;
#[cfg(unix)]
pub mod readable;
#[cfg(unix)]
pub mod unacked;

#[cfg(target_os = "linux")]
pub mod affinity;
#[cfg(target_os = "linux")]
pub mod buffer;

pub use backoff::{wakeup_fd, BlockedSleeps, StdBackoff, WaitPolicy, BLOCK_FALLBACK_PAUSE};
pub use clock::{Monotonic, StdClock, MONOTONIC};
pub use random::{random_psn, PSN_SOURCE};

#[cfg(target_os = "linux")]
pub use affinity::{
    current_thread_affinity, online_cpus, parse_cpulist, pin_current_thread, pin_near_device,
    set_current_thread_affinity, AffinityError, CpuSet, CpulistErrorKind, DeviceLocality,
    ParseCpulistError, PinnedTo, SysfsRoot,
};
#[cfg(target_os = "linux")]
pub use buffer::{
    AlignedBuffer, BufferError, HugePageBuffer, MapOptions, PageKind, HUGE_PAGE_SIZE,
};
