//! Bootstrap for rverbs: cluster configuration, rank discovery, and the TCP
//! exchange of endpoint blobs that must happen before RDMA connections exist.
//!
//! ```no_run
//! use rverbs_bootstrap::{exchange, launch, ClusterConfig, ExchangeOptions, JobSecret};
//!
//! # fn main() -> Result<(), rverbs_bootstrap::BootstrapError> {
//! let config = ClusterConfig::from_file("cluster.json")?;
//! // Flags first, then RVERBS_RANK/RVERBS_WORLD_SIZE, Slurm, Open MPI, PMI.
//! let me = launch::resolve(None, None)?;
//! config.check_launch(&me)?;
//!
//! // The bytes rverbs-core produced for this rank (QP numbers, GIDs, rkeys).
//! let endpoint: Vec<u8> = vec![0; 22];
//! let options = ExchangeOptions {
//!     job_id: config.job_id(),
//!     // From RVERBS_JOB_SECRET_FILE or RVERBS_JOB_SECRET; None runs unauthenticated.
//!     secret: JobSecret::from_env()?,
//!     ..ExchangeOptions::default()
//! };
//! let (mut session, endpoints) = exchange(&config, me.rank, &endpoint, &options)?;
//! assert_eq!(endpoints.len() as u32, config.world_size());
//!
//! // ... connect queue pairs with `endpoints[peer]` ...
//!
//! // Out-of-band barrier: nobody posts work before everybody is connected.
//! session.allgather(b"ready")?;
//! session.close()?;
//! # Ok(())
//! # }
//! ```
//!
//! With the `verbs` feature, [`connect()`] does all of the above plus opening the device,
//! connecting every queue pair and a first barrier, returning a ready `Node`. A two-process
//! RC ping-pong (run it as rank 0 and rank 1; the README's quick look shows the same code):
//!
//! ```no_run
//! # #[cfg(feature = "verbs")] fn main() -> Result<(), Box<dyn std::error::Error>> {
//! use std::cell::Cell;
//! use rverbs_bootstrap::{connect, launch, ClusterConfig, ConnectOptions};
//! use rverbs_core::node::{Event, Members};
//!
//! let config = ClusterConfig::from_file("cluster.json")?; // two ranks
//! let rank = launch::resolve(None, None)?.rank; // flags, RVERBS_RANK, Slurm, MPI
//! let mut node = connect(&config, rank, &ConnectOptions::for_config(&config))?.node;
//! node.start_messaging(4, 64)?; // 4 receive buffers of 64 bytes for the peer
//! node.barrier(Members::World)?; // both rings are posted before anyone sends
//! let peer = 1 - rank;
//! for _ in 0..1000 {
//!     if rank == 0 {
//!         node.post_send_inline(peer, b"ping")?;
//!     }
//!     let got = Cell::new(false); // one message in, within the node's timeout
//!     let on_event = |e: Event<'_>| got.set(got.get() || matches!(e, Event::Message { .. }));
//!     node.progress_wait(on_event, || got.get())?;
//!     if rank == 1 {
//!         node.post_send_inline(peer, b"pong")?;
//!     }
//! }
//! node.barrier(Members::World)?; // nobody leaves while the other still sends
//! # Ok(()) }
//! # #[cfg(not(feature = "verbs"))] fn main() {}
//! ```
//!
//! Every rank above receives every blob whole. For blobs that hold one part per
//! peer, such as rverbs-core's node blobs (32 bytes per rank), set
//! [`ExchangeOptions::personalize`] to [`NodeBlobs`] (or another [`Personalize`]):
//! rank 0 then sends each rank only the parts meant for it, about 104 bytes per
//! peer instead of a whole blob, and the frame limits follow from the world size.
//! `connect()` always does.
//!
//! Anyone who can reach rank 0's port can take part in the rendezvous unless the
//! job has a secret ([`JobSecret`], from a file or the environment, never from the
//! cluster file): then every frame carries an HMAC-SHA256 bound to its connection,
//! and a client without the secret is refused. Clients that are not ranks (port
//! scanners, idle or slow connections) cannot keep real ranks out: see
//! [`exchange`](mod@exchange).
//!
//! Modules: [`config`] reads the JSON cluster file (native and ibverbs-rs
//! layouts, at most [`config::MAX_CONFIG_BYTES`]), [`launch`] finds rank and
//! world size, [`secret`] loads the job secret, [`exchange`](mod@exchange) runs
//! the rendezvous, [`wire`] defines and decodes the frames and their MACs,
//! [`pmix`] starts without a file under a PMIx launcher (`mpirun`, `srun --mpi=pmix`).
//!
//! Under such a launcher no cluster file is needed: `Launch::detect(None, None)`
//! and `connect_launch` (feature `verbs`) take rank, world and the endpoint
//! exchange from the launcher's PMIx server, and the device from the host (see
//! `docs/launchers.md`).
//!
//! # Cargo features
//!
//! - `verbs` (default): [`connect()`], one call from a config and a rank to a connected
//!   `rverbs_core::node::Node`; links libibverbs. Without it the crate is the
//!   configuration, launcher detection and TCP exchange only (which is what the fuzzers
//!   build).
//! - `pmix`: [`pmix::PmixSession`], the rendezvous through the launcher's PMIx
//!   server, and the PMIx start of `connect_launch`. Links the system's OpenPMIx
//!   (pkg-config `pmix`, Debian `libpmix-dev`; `RVERBS_PMIX_DIR` names another
//!   prefix); bindings are generated from its header at build time.
//!
//! The crate needs `std` (sockets, threads, files).
//!
//! # Thread safety
//!
//! Every type is `Send` and `Sync` where its fields allow; a [`Session`] is
//! used through `&mut self`, so one thread drives a round at a time. Rank 0
//! starts short-lived threads of its own while it waits: one per accepted
//! connection during the exchange, one per peer during an all-gather round.
//! Each ends by the round's deadline at the latest.
//!
//! # Resource cleanup
//!
//! Rank 0's listener is closed when the exchange returns. A [`Session`] keeps
//! one TCP connection per peer (rank 0) or one to rank 0 (other ranks) until
//! it is dropped or [`Session::close`]d. When the exchange returns, rank 0
//! shuts the connections of clients whose hello it was still reading, so their
//! reader threads end at once rather than at their deadline. A `pmix::PmixSession`
//! calls `PMIx_Finalize` when dropped or closed; the values its rounds put stay in
//! the launcher's store until the job ends (PMIx has no delete).

// Only `pmix::ffi`, the libpmix binding of the `pmix` feature, allows it.
#![deny(unsafe_code)]

pub mod config;
#[cfg(feature = "verbs")]
pub mod connect;
#[cfg(feature = "verbs")]
pub mod device_watch;
pub mod error;
pub mod exchange;
pub mod launch;
mod oob;
pub mod pmix;
pub mod secret;
pub mod wire;

pub use config::{ClusterConfig, ConfigLayout, RankConfig};
#[cfg(feature = "verbs")]
pub use connect::{connect, rejoin, ConnectOptions, Connected};
#[cfg(feature = "verbs")]
pub use error::RdmaError;
pub use error::{BootstrapError, ConfigError, ExchangeError, LaunchError, Result};
pub use exchange::{
    exchange, exchange_at, exchange_rejoin, Departure, ExchangeOptions, NodeBlobs, Personalize,
    Rendezvous, Session, DROPPED_REASON,
};
#[cfg(feature = "verbs")]
pub use launch::{connect_launch, HostDevice, Launch, DEVICE_VAR};
pub use launch::{LaunchInfo, LaunchSource};
pub use oob::OutOfBand;
pub use secret::JobSecret;
pub use wire::WireError;
