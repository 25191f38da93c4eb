//! Starting a rank: [`Launch::detect`] chooses how, [`connect_launch`] connects.

use super::resolve;
use crate::config::ClusterConfig;
use crate::connect::{connect, ConnectOptions, Connected};
use crate::error::{BootstrapError, LaunchError, Result};
use crate::pmix::LauncherEnv;

/// The variable that names the RDMA device of a rank started without a cluster file.
pub const DEVICE_VAR: &str = "RVERBS_DEVICE";

/// How [`connect_launch`] finds the other ranks.
///
/// ```no_run
/// use rverbs_bootstrap::{connect_launch, ConnectOptions, Launch};
///
/// # fn main() -> Result<(), rverbs_bootstrap::BootstrapError> {
/// // No cluster file: under `mpirun -n 4 app` or `srun --mpi=pmix -n 4 app` this is
/// // `Launch::Pmix`, anywhere else a clear error.
/// let launch = Launch::detect(None, None)?;
/// let connected = connect_launch(&launch, &ConnectOptions::default())?;
/// let mut session = connected.session;
/// let everyone = session.allgather(b"hello")?;
/// # let _ = everyone;
/// # Ok(())
/// # }
/// ```
#[derive(Debug, Clone)]
#[non_exhaustive]
pub enum Launch<'a> {
    /// A cluster file and this process's rank in it: TCP rendezvous at rank 0's entry, the
    /// device, port and GID index of the rank's entry. What [`connect`] does.
    Config {
        /// The cluster.
        config: &'a ClusterConfig,
        /// This process's rank.
        rank: u32,
    },
    /// The PMIx server of the launcher that started the process (`mpirun`, `srun
    /// --mpi=pmix`): rank and world from PMIx, the device from the host. Needs the `pmix`
    /// feature; without it [`connect_launch`] fails with [`LaunchError::NoLauncher`].
    Pmix(HostDevice),
}

/// The RDMA device of a rank started without a cluster file.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct HostDevice {
    /// The device; `None`: the first device with an active port. [`HostDevice::from_env`]
    /// fills it from `RVERBS_DEVICE`. Its first active port is used, and the GID index the
    /// core picks when none is given (on RoCE a v2 GID mapping an IPv4 address).
    pub device: Option<String>,
    /// Pin the calling thread to a CPU near the device, the `local rank`-th one of those it
    /// may use (counting around when the host's ranks outnumber them). Default `true`.
    pub pin: bool,
}

impl Default for HostDevice {
    fn default() -> Self {
        Self {
            device: None,
            pin: true,
        }
    }
}

impl HostDevice {
    /// The device named by `RVERBS_DEVICE` (when set and not empty), pinning on.
    #[must_use]
    pub fn from_env() -> Self {
        Self {
            device: std::env::var(DEVICE_VAR).ok().filter(|d| !d.is_empty()),
            pin: true,
        }
    }
}

impl<'a> Launch<'a> {
    /// Chooses the start: with a cluster file, [`Launch::Config`] with the rank from `rank`
    /// or the launcher's environment ([`resolve`](super::resolve), checked against the file);
    /// without one, [`Launch::Pmix`] ([`HostDevice::from_env`]) when a PMIx launcher started
    /// the process.
    ///
    /// # Errors
    /// The launcher errors of [`resolve`](super::resolve) and [`ClusterConfig::check_launch`];
    /// [`LaunchError::NoLauncher`] without a file when no PMIx launcher is there (naming
    /// the launcher that is, and what to do), or when a rank is given without a file.
    pub fn detect(config: Option<&'a ClusterConfig>, rank: Option<u32>) -> Result<Self> {
        match config {
            Some(config) => {
                let me = resolve(rank, rank.map(|_| config.world_size()))?;
                config.check_launch(&me)?;
                Ok(Self::Config {
                    config,
                    rank: me.rank,
                })
            }
            None => {
                let env = LauncherEnv::detect();
                if let Some(reason) = env.why_no_pmix() {
                    return Err(BootstrapError::Launch(LaunchError::NoLauncher { reason }));
                }
                if let Some(rank) = rank {
                    return Err(BootstrapError::Launch(LaunchError::NoLauncher {
                        reason: format!(
                            "rank {rank} was given without a cluster config; under {env} the \
                             rank comes from PMIx: drop the rank or pass a config"
                        ),
                    }));
                }
                Ok(Self::Pmix(HostDevice::from_env()))
            }
        }
    }
}

/// [`connect`] for any [`Launch`]: from a cluster file as `connect` does, or under a PMIx
/// launcher with no file. There, [`PmixSession`](crate::pmix::PmixSession) gives rank and
/// world, [`HostDevice`] the device, each rank pins itself near it by its local rank, the node
/// blobs go through PMIx put/commit/fence/get, and [`Connected::session`] is
/// [`OutOfBand::Pmix`](crate::OutOfBand::Pmix). `opts.exchange.timeout` bounds every fence;
/// the job id, I/O timeout and retry interval are unused under PMIx.
///
/// # Errors
/// Those of [`connect`]; under PMIx those of
/// [`PmixSession::exchange`](crate::pmix::PmixSession::exchange),
/// [`LaunchError::NoActiveDevice`] when the host has no usable device, and
/// [`LaunchError::NoLauncher`] in a build without the `pmix` feature.
pub fn connect_launch(launch: &Launch<'_>, opts: &ConnectOptions) -> Result<Connected> {
    match launch {
        Launch::Config { config, rank } => connect(config, *rank, opts),
        #[cfg(feature = "pmix")]
        Launch::Pmix(host) => pmix_start::connect_pmix(host, opts),
        #[cfg(not(feature = "pmix"))]
        Launch::Pmix(_) => Err(BootstrapError::Launch(LaunchError::NoLauncher {
            reason: format!(
                "started by {} without a cluster config, but this program was built without \
                 PMIx support (feature `pmix` of rverbs-bootstrap): rebuild with it, or pass a \
                 cluster config",
                LauncherEnv::detect()
            ),
        })),
    }
}

#[cfg(feature = "pmix")]
mod pmix_start {
    use rverbs_core::verbs::{Context, DeviceList, VerbsError};

    use super::HostDevice;
    use crate::connect::{establish, ConnectOptions, Connected, Placement};
    use crate::error::{BootstrapError, LaunchError, Result};
    use crate::oob::OutOfBand;
    use crate::pmix::PmixSession;

    pub(super) fn connect_pmix(host: &HostDevice, opts: &ConnectOptions) -> Result<Connected> {
        let mut pmix = PmixSession::init(&opts.exchange)?;
        let rank = pmix.rank();
        let (device, port) = choose_device(rank, host.device.as_deref())?;
        if host.pin {
            pin(rank, &device, pmix.local_rank(), opts.exchange.progress);
        }
        let place = Placement {
            rank,
            world: pmix.world_size(),
            device,
            port,
            gid_index: None,
        };
        establish(&place, opts, |blob, exchange_opts| {
            let blobs = pmix.exchange(blob, exchange_opts.personalize)?;
            Ok((OutOfBand::Pmix(pmix), blobs))
        })
    }

    /// Pins the calling thread near `device`, the `local_rank`-th of its allowed CPUs counted
    /// around. Not fatal: a rank runs unpinned rather than not at all (a container may forbid
    /// it); with progress lines on it says so.
    fn pin(rank: u32, device: &str, local_rank: u32, say: bool) {
        #[cfg(target_os = "linux")]
        {
            use rverbs_std_shim::affinity::{current_thread_affinity, pin_near_device};
            let outcome = current_thread_affinity().and_then(|allowed| {
                let nth = local_rank as usize % allowed.len().max(1);
                pin_near_device(device, nth)
            });
            if let Err(e) = outcome {
                if say {
                    eprintln!("rverbs: rank {rank}: not pinned near {device}: {e}");
                }
            }
        }
        #[cfg(not(target_os = "linux"))]
        let _ = (rank, device, local_rank, say);
    }

    /// The device and port a rank without a cluster file uses: `wanted`'s first active port, or
    /// the first device with an active port. Devices that cannot be opened or queried count as
    /// having none; the error lists what each one had.
    fn choose_device(rank: u32, wanted: Option<&str>) -> Result<(String, u8)> {
        let list = DeviceList::new().map_err(|e| {
            BootstrapError::Launch(LaunchError::NoActiveDevice {
                rank,
                wanted: wanted.map(str::to_owned),
                checked: vec![format!("listing devices failed: {e}")],
            })
        })?;
        let mut checked = Vec::new();
        for device in list.iter() {
            let name = device.name();
            if wanted.is_some_and(|w| w != name) {
                continue;
            }
            match device.open() {
                Ok(ctx) => match first_active_port(&ctx) {
                    Ok(Some(port)) => return Ok((name.to_owned(), port)),
                    Ok(None) => checked.push(format!("{name}: no active port")),
                    Err(e) => checked.push(format!("{name}: {e}")),
                },
                Err(e) => checked.push(format!("{name}: cannot open: {e}")),
            }
        }
        if checked.is_empty() {
            let present: Vec<&str> = list.iter().map(|d| d.name()).collect();
            checked.push(match wanted {
                Some(w) => format!("{w}: not present (present: {present:?})"),
                None => "no RDMA devices".to_owned(),
            });
        }
        Err(BootstrapError::Launch(LaunchError::NoActiveDevice {
            rank,
            wanted: wanted.map(str::to_owned),
            checked,
        }))
    }

    fn first_active_port(ctx: &Context) -> core::result::Result<Option<u8>, VerbsError> {
        let ports = ctx.query_device()?.phys_port_cnt;
        for port in 1..=ports {
            if ctx.query_port(port)?.active {
                return Ok(Some(port));
            }
        }
        Ok(None)
    }
}
