//! Starting under the cluster's own launcher: the PMIx rendezvous.
//!
//! Open MPI's `mpirun` and Slurm's `srun --mpi=pmix` run a PMIx server on every host of a job
//! and tell each process where it is (`PMIX_NAMESPACE`, `PMIX_RANK`, `PMIX_SERVER_URI*`).
//! With the `pmix` feature, [`PmixSession`] uses that server instead of a cluster file and
//! rank 0's TCP listener: rank, job size, local rank and local size come from PMIx, and each
//! round is put, commit, fence, get. [`connect_launch`](crate::connect_launch) picks it when
//! there is no cluster file and [`LauncherEnv::serves_pmix`] says a PMIx launcher is there.
//!
//! [`LauncherEnv`] needs no feature: it reads the environment only, so a build without PMIx
//! can still say why it cannot start without a cluster file.
//!
//! # What a rank sends and holds
//!
//! In the exchange each rank puts its whole node blob, `32 N + 64` bytes plus an 8-byte
//! envelope (about 32 KiB at 1024 ranks), and reads every other rank's from its local PMIx
//! server, keeping only the 96-byte part made for it: O(N) bytes put and kept per rank, O(N²)
//! bytes read from the local server, and `N × (32 N + 72)` bytes held by each host's server
//! for the whole job (32 MiB at 1024 ranks).
//!
//! See `docs/launchers.md` for the commands and the design.

mod env;
#[cfg(feature = "pmix")]
mod ffi;
#[cfg(feature = "pmix")]
mod session;
#[cfg(feature = "pmix")]
mod value;

pub use self::env::{LauncherEnv, LauncherKind};
#[cfg(feature = "pmix")]
pub use self::session::PmixSession;
#[cfg(feature = "pmix")]
pub use self::value::PROTOCOL_VERSION;

/// The version of the linked libpmix, as it reports itself ("OpenPMIx 4.2.2 ...").
#[cfg(feature = "pmix")]
#[must_use]
pub fn library_version() -> String {
    ffi::library_version()
}
