//! Errors, one type per phase of starting a job: [`ConfigError`] (the cluster
//! configuration), [`LaunchError`] (rank, world size, launcher, device), [`ExchangeError`]
//! (the TCP rendezvous) and [`RdmaError`] (connecting the node); [`BootstrapError`] is any of
//! them, for the calls that run several phases ([`connect()`](crate::connect()) runs them all).

use core::fmt;
use core::time::Duration;
use std::io;
use std::path::PathBuf;

use crate::launch::LaunchSource;
use crate::wire::WireError;

/// Result alias with [`BootstrapError`] as the default error.
pub type Result<T, E = BootstrapError> = core::result::Result<T, E>;

/// Whatever went wrong while starting: the phase, then its error.
///
/// Each phase's error names what it is about: the file, the rank (`rank` is always the rank
/// that reports the error, `peer` the remote one), the address, the field or the environment
/// variable; I/O failures carry the `io::Error` as [`source`](core::error::Error::source).
#[derive(Debug)]
#[non_exhaustive]
pub enum BootstrapError {
    /// Reading or checking the cluster configuration.
    Config(ConfigError),
    /// Finding the rank, the world size, the launcher or the device.
    Launch(LaunchError),
    /// The TCP exchange of endpoint blobs.
    Exchange(ExchangeError),
    /// Connecting the node over RDMA.
    #[cfg(feature = "verbs")]
    Rdma(RdmaError),
}

impl fmt::Display for BootstrapError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Config(e) => e.fmt(f),
            Self::Launch(e) => e.fmt(f),
            Self::Exchange(e) => e.fmt(f),
            #[cfg(feature = "verbs")]
            Self::Rdma(e) => e.fmt(f),
        }
    }
}

impl core::error::Error for BootstrapError {
    fn source(&self) -> Option<&(dyn core::error::Error + 'static)> {
        // The phase's error is this error, told the same way: its source is the cause.
        match self {
            Self::Config(e) => e.source(),
            Self::Launch(e) => e.source(),
            Self::Exchange(e) => e.source(),
            #[cfg(feature = "verbs")]
            Self::Rdma(e) => e.source(),
        }
    }
}

/// Reading and checking the cluster configuration failed: the file, the entry, the field and the rule are named.
#[derive(Debug)]
#[non_exhaustive]
pub enum ConfigError {
    /// The configuration file could not be read.
    Read {
        /// Path of the file.
        path: PathBuf,
        /// The underlying error.
        source: io::Error,
    },
    /// The configuration is larger than
    /// [`MAX_CONFIG_BYTES`](crate::config::MAX_CONFIG_BYTES); it is refused before
    /// it is read or parsed.
    TooLarge {
        /// File (or origin name) of the configuration.
        file: String,
        /// Its size in bytes, or `None` when only "over the limit" is known (a pipe).
        len: Option<u64>,
        /// The limit.
        limit: u64,
    },
    /// The configuration is not valid JSON or does not fit the schema
    /// (unknown field, wrong type, missing field).
    Parse {
        /// File (or origin name) of the configuration.
        file: String,
        /// Line of the problem, 1-based.
        line: usize,
        /// Column of the problem, 1-based.
        column: usize,
        /// The parser's message.
        message: String,
    },
    /// The configuration parses but breaks a rule.
    Invalid {
        /// File (or origin name) of the configuration.
        file: String,
        /// Index of the offending entry in the rank list, when one is to blame.
        entry: Option<usize>,
        /// Rank concerned, when known.
        rank: Option<u32>,
        /// Field concerned, spelled as in the file.
        field: Option<&'static str>,
        /// What is wrong.
        reason: String,
    },
    /// A rank's device is not among the devices present.
    DeviceNotFound {
        /// File (or origin name) of the configuration.
        file: String,
        /// The rank whose device is missing.
        rank: u32,
        /// The configured device name.
        device: String,
        /// The devices that are present.
        available: Vec<String>,
    },
    /// A rank the configuration does not list was asked for.
    NoSuchRank {
        /// File (or origin name) of the configuration.
        file: String,
        /// The rank asked for.
        rank: u32,
        /// How many ranks the configuration lists.
        world_size: u32,
    },
    /// The launcher's world size disagrees with the configuration.
    WorldSizeMismatch {
        /// File (or origin name) of the configuration.
        file: String,
        /// Ranks listed in the configuration.
        configured: u32,
        /// World size the launcher reported.
        launched: u32,
        /// Where the launcher's value came from.
        source_kind: LaunchSource,
    },
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Read { path, source } => {
                write!(f, "cannot read cluster config {}: {source}", path.display())
            }
            Self::TooLarge { file, len, limit } => {
                write!(f, "cluster config {file} is ")?;
                match len {
                    Some(len) => write!(f, "{len} bytes")?,
                    None => write!(f, "more than {limit} bytes")?,
                }
                write!(
                    f,
                    ", over the limit of {limit} bytes for a cluster config (is it the right file?)"
                )
            }
            Self::Parse {
                file,
                line,
                column,
                message,
            } => write!(f, "{file}:{line}:{column}: {message}"),
            Self::Invalid {
                file,
                entry,
                rank,
                field,
                reason,
            } => {
                write!(f, "{file}")?;
                if let Some(entry) = entry {
                    write!(f, ": entry {entry}")?;
                }
                if let Some(rank) = rank {
                    write!(f, ": rank {rank}")?;
                }
                if let Some(field) = field {
                    write!(f, ": field `{field}`")?;
                }
                write!(f, ": {reason}")
            }
            Self::DeviceNotFound {
                file,
                rank,
                device,
                available,
            } => write!(
                f,
                "{file}: rank {rank}: field `device`: device {device:?} not found (present: {available:?})"
            ),
            Self::NoSuchRank {
                file,
                rank,
                world_size,
            } => write!(
                f,
                "{file} lists {world_size} ranks, so there is no rank {rank} in it"
            ),
            Self::WorldSizeMismatch {
                file,
                configured,
                launched,
                source_kind,
            } => write!(
                f,
                "{file} lists {configured} ranks but the launcher ({source_kind}) reports a world of {launched}"
            ),
        }
    }
}

impl core::error::Error for ConfigError {
    fn source(&self) -> Option<&(dyn core::error::Error + 'static)> {
        match self {
            Self::Read { source, .. } => Some(source),
            _ => None,
        }
    }
}

impl From<ConfigError> for BootstrapError {
    fn from(e: ConfigError) -> Self {
        Self::Config(e)
    }
}

/// Finding this rank and the world size (environment, launcher, PMIx) failed, or no device to run on was found.
#[derive(Debug)]
#[non_exhaustive]
pub enum LaunchError {
    /// Only one of a rank / world-size pair is set.
    Incomplete {
        /// The variable (or flag) that is set.
        set: &'static str,
        /// Its partner that is missing.
        missing: &'static str,
    },
    /// A launch variable is not a non-negative integer.
    NotNumeric {
        /// The variable (or flag).
        variable: &'static str,
        /// Its value.
        value: String,
    },
    /// The rank is not below the world size.
    RankOutOfRange {
        /// The rank variable.
        variable: &'static str,
        /// The rank.
        rank: u32,
        /// The world size.
        world_size: u32,
    },
    /// The world size is zero.
    ZeroWorld {
        /// The world-size variable.
        variable: &'static str,
    },
    /// No source gave a rank and world size.
    Unset,
    /// There is no cluster config and no PMIx launcher to start without one (see
    /// [`LauncherEnv::why_no_pmix`](crate::pmix::LauncherEnv::why_no_pmix)), or this build
    /// lacks the `pmix` feature.
    NoLauncher {
        /// What is missing and what to do instead.
        reason: String,
    },
    /// A rank started without a cluster config found no RDMA device with an active port, or
    /// the device it was told to use is missing or has none.
    NoActiveDevice {
        /// The calling rank.
        rank: u32,
        /// The device asked for (flag or `RVERBS_DEVICE`), if any.
        wanted: Option<String>,
        /// What each device checked had, or why none was.
        checked: Vec<String>,
    },
    /// A PMIx call failed (feature `pmix`).
    Pmix {
        /// The calling rank, once PMIx has told it.
        rank: Option<u32>,
        /// The rank whose value was asked for, when one was.
        peer: Option<u32>,
        /// The launcher and its PMIx namespace.
        launcher: String,
        /// The call.
        op: &'static str,
        /// The PMIx status, by name and number, or what was wrong with the answer.
        status: String,
    },
    /// A peer put a value of another rverbs PMIx protocol version, or one that is not an
    /// rverbs value at all (feature `pmix`).
    PmixVersion {
        /// The calling rank.
        rank: u32,
        /// The rank whose value it is.
        peer: u32,
        /// The launcher and its PMIx namespace.
        launcher: String,
        /// This rank's version.
        ours: u16,
        /// The peer's version; `None` when the value is not an rverbs envelope.
        theirs: Option<u16>,
    },
    /// A peer's value has the right version but unusable contents (feature `pmix`).
    PmixValue {
        /// The calling rank.
        rank: u32,
        /// The rank whose value it is.
        peer: u32,
        /// The launcher and its PMIx namespace.
        launcher: String,
        /// What is wrong.
        reason: String,
    },
}

impl fmt::Display for LaunchError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Incomplete { set, missing } => {
                write!(f, "{set} is set but {missing} is not")
            }
            Self::NotNumeric { variable, value } => {
                write!(f, "{variable}={value:?} is not a non-negative integer")
            }
            Self::RankOutOfRange {
                variable,
                rank,
                world_size,
            } => write!(
                f,
                "{variable}={rank} is out of range for a world of {world_size} ranks"
            ),
            Self::ZeroWorld { variable } => write!(f, "{variable} is 0"),
            Self::Unset => write!(
                f,
                "no rank given: pass an explicit rank and world size or set \
                 RVERBS_RANK/RVERBS_WORLD_SIZE (or run under Slurm, Open MPI or a PMI launcher)"
            ),
            Self::NoLauncher { reason } => write!(f, "cannot start: {reason}"),
            Self::NoActiveDevice {
                rank,
                wanted,
                checked,
            } => {
                match wanted {
                    Some(w) => write!(
                        f,
                        "rank {rank}: RDMA device {w} is missing or has no active port"
                    )?,
                    None => write!(f, "rank {rank}: no RDMA device with an active port")?,
                }
                write!(
                    f,
                    " ({}); name one with RVERBS_DEVICE or pass a cluster config",
                    checked.join("; ")
                )
            }
            Self::Pmix {
                rank,
                peer,
                launcher,
                op,
                status,
            } => {
                match rank {
                    Some(rank) => write!(f, "rank {rank} under {launcher}: ")?,
                    None => write!(f, "under {launcher}: ")?,
                }
                write!(f, "{op}")?;
                if let Some(peer) = peer {
                    write!(f, " for rank {peer}")?;
                }
                write!(f, " failed: {status}")
            }
            Self::PmixVersion {
                rank,
                peer,
                launcher,
                ours,
                theirs,
            } => match theirs {
                Some(theirs) => write!(
                    f,
                    "rank {rank} under {launcher}: rank {peer} speaks rverbs PMIx protocol \
                     version {theirs}, this rank {ours}: every rank of a job must run the same \
                     rverbs version"
                ),
                None => write!(
                    f,
                    "rank {rank} under {launcher}: rank {peer} put a value that is not an \
                     rverbs PMIx envelope (this rank speaks version {ours})"
                ),
            },
            Self::PmixValue {
                rank,
                peer,
                launcher,
                reason,
            } => write!(
                f,
                "rank {rank} under {launcher}: the value of rank {peer} is unusable: {reason}"
            ),
        }
    }
}

impl core::error::Error for LaunchError {}

impl From<LaunchError> for BootstrapError {
    fn from(e: LaunchError) -> Self {
        Self::Launch(e)
    }
}

/// Exchanging endpoint blobs over TCP failed: the calling rank, the peer (when known), the address and the cause are named.
#[derive(Debug)]
#[non_exhaustive]
pub enum ExchangeError {
    /// A call received a rank that is not below the world size.
    RankOutOfRange {
        /// The rank.
        rank: u32,
        /// The world size.
        world_size: u32,
    },
    /// A blob is larger than the configured limit.
    BlobTooLarge {
        /// The rank whose blob it is.
        rank: u32,
        /// Its length.
        len: usize,
        /// The limit.
        limit: usize,
    },
    /// The arguments of an exchange do not fit together.
    InvalidArgument {
        /// The calling rank.
        rank: u32,
        /// What is wrong.
        reason: String,
    },
    /// The job secret file could not be read.
    SecretRead {
        /// Path of the file.
        path: PathBuf,
        /// The underlying error.
        source: io::Error,
    },
    /// A job secret is unusable (too short, too long, both sources set, ...). The
    /// message never contains the secret.
    SecretInvalid {
        /// Where it came from: a file, an environment variable, or the API.
        from: String,
        /// What is wrong.
        reason: String,
    },
    /// The other end of a connection could not prove it holds this job's secret, or
    /// holds one where this end has none (or the other way round).
    Auth {
        /// The calling rank.
        rank: u32,
        /// The remote rank, when known.
        peer: Option<u32>,
        /// The remote address.
        addr: String,
        /// What failed, such as "MAC mismatch: wrong job secret".
        reason: String,
    },
    /// Rank 0 could not listen on its address.
    Bind {
        /// The address.
        addr: String,
        /// The underlying error.
        source: io::Error,
    },
    /// A rank could not reach rank 0 before the deadline.
    Connect {
        /// The calling rank.
        rank: u32,
        /// Rank 0's address.
        addr: String,
        /// How long it tried.
        waited: Duration,
        /// The last connection error.
        source: io::Error,
    },
    /// A socket operation failed.
    Io {
        /// The calling rank.
        rank: u32,
        /// The remote rank, when known.
        peer: Option<u32>,
        /// The remote (or listening) address.
        addr: String,
        /// The operation that failed.
        op: &'static str,
        /// The underlying error.
        source: io::Error,
    },
    /// The remote side sent bytes that are not a valid frame.
    Protocol {
        /// The calling rank.
        rank: u32,
        /// The remote rank, when known.
        peer: Option<u32>,
        /// The remote address.
        addr: String,
        /// What the decoder found.
        source: WireError,
    },
    /// A well-formed frame that makes no sense here (wrong kind, wrong job,
    /// a table that does not echo our blob, ...).
    Unexpected {
        /// The calling rank.
        rank: u32,
        /// The remote rank, when known.
        peer: Option<u32>,
        /// The remote address.
        addr: String,
        /// What is wrong.
        reason: String,
    },
    /// Rank 0 refused this rank or aborted the round.
    Rejected {
        /// The calling rank.
        rank: u32,
        /// Rank 0's address.
        addr: String,
        /// Rank 0's reason.
        reason: String,
    },
    /// The remote side closed the connection mid-exchange.
    Disconnected {
        /// The calling rank.
        rank: u32,
        /// The remote rank, when known.
        peer: Option<u32>,
        /// The remote address.
        addr: String,
    },
    /// The deadline passed before every rank was heard from.
    Timeout {
        /// The calling rank.
        rank: u32,
        /// Ranks never heard from (for a rank other than 0: rank 0).
        missing: Vec<u32>,
        /// How long the rank waited.
        waited: Duration,
        /// Extra context, such as connections that were rejected meanwhile.
        detail: String,
    },
    /// An earlier round of this session failed; the session cannot be used.
    Poisoned {
        /// The calling rank.
        rank: u32,
    },
    /// A restarted rank cannot rejoin the running world (see
    /// [`Connected::readmit`](crate::Connected::readmit) and [`rejoin`](crate::rejoin)), for
    /// a reason no retry changes: rank 0 failed, the job was started under a PMIx launcher,
    /// the node uses messaging or barrier wake-ups, ...
    Readmit {
        /// The calling rank.
        rank: u32,
        /// The rank to readmit.
        rejoiner: u32,
        /// Why it cannot.
        reason: String,
    },
}

impl fmt::Display for ExchangeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::RankOutOfRange { rank, world_size } => {
                write!(f, "rank {rank} is out of range for a world of {world_size}")
            }
            Self::BlobTooLarge { rank, len, limit } => write!(
                f,
                "rank {rank}: blob of {len} bytes exceeds the limit of {limit} bytes"
            ),
            Self::InvalidArgument { rank, reason } => write!(f, "rank {rank}: {reason}"),
            Self::SecretRead { path, source } => {
                write!(
                    f,
                    "cannot read job secret file {}: {source}",
                    path.display()
                )
            }
            Self::SecretInvalid { from, reason } => write!(f, "job secret from {from} {reason}"),
            Self::Auth {
                rank,
                peer,
                addr,
                reason,
            } => write!(
                f,
                "rank {rank}: authentication with {} at {addr} failed: {reason}",
                opt_peer(*peer)
            ),
            Self::Bind { addr, source } => write!(f, "rank 0 cannot listen on {addr}: {source}"),
            Self::Connect {
                rank,
                addr,
                waited,
                source,
            } => write!(
                f,
                "rank {rank} could not connect to rank 0 at {addr} within {waited:.1?}: {source}"
            ),
            Self::Io {
                rank,
                peer,
                addr,
                op,
                source,
            } => write!(
                f,
                "rank {rank}: {op} with {} at {addr} failed: {source}",
                opt_peer(*peer)
            ),
            Self::Protocol {
                rank,
                peer,
                addr,
                source,
            } => write!(
                f,
                "rank {rank}: invalid frame from {} at {addr}: {source}",
                opt_peer(*peer)
            ),
            Self::Unexpected {
                rank,
                peer,
                addr,
                reason,
            } => write!(
                f,
                "rank {rank}: unexpected frame from {} at {addr}: {reason}",
                opt_peer(*peer)
            ),
            Self::Rejected { rank, addr, reason } => {
                write!(f, "rank {rank} was rejected by rank 0 at {addr}: {reason}")
            }
            Self::Disconnected { rank, peer, addr } => write!(
                f,
                "rank {rank}: {} at {addr} closed the connection mid-exchange",
                opt_peer(*peer)
            ),
            Self::Timeout {
                rank,
                missing,
                waited,
                detail,
            } => {
                write!(
                    f,
                    "rank {rank} timed out after {waited:.1?} waiting for ranks {missing:?}"
                )?;
                if !detail.is_empty() {
                    write!(f, " ({detail})")?;
                }
                Ok(())
            }
            Self::Poisoned { rank } => write!(
                f,
                "rank {rank}: an earlier round of this bootstrap session failed"
            ),
            Self::Readmit {
                rank,
                rejoiner,
                reason,
            } => write!(f, "rank {rank}: rank {rejoiner} cannot rejoin: {reason}"),
        }
    }
}

impl core::error::Error for ExchangeError {
    fn source(&self) -> Option<&(dyn core::error::Error + 'static)> {
        match self {
            Self::SecretRead { source, .. } => Some(source),
            Self::Bind { source, .. } => Some(source),
            Self::Connect { source, .. } => Some(source),
            Self::Io { source, .. } => Some(source),
            Self::Protocol { source, .. } => Some(source),
            _ => None,
        }
    }
}

impl From<ExchangeError> for BootstrapError {
    fn from(e: ExchangeError) -> Self {
        Self::Exchange(e)
    }
}

/// Setting up RDMA (device, queue pairs, memory, handshake, first barrier) failed.
#[cfg(feature = "verbs")]
#[derive(Debug)]
#[non_exhaustive]
pub enum RdmaError {
    /// A step of connecting failed while this rank's own port was not active: the port is
    /// what failed (a link down, a cable, a switch port), not the peers it could not reach.
    LocalPortDown {
        /// The calling rank.
        rank: u32,
        /// Its RDMA device.
        device: String,
        /// The port.
        port: u8,
        /// The port's state, by name (`DOWN`, `INIT`, ...).
        state: &'static str,
        /// The step's own error.
        source: Box<BootstrapError>,
    },
    /// Setting up RDMA (device, queue pairs, memory, handshake) failed.
    Setup {
        /// The calling rank.
        rank: u32,
        /// The RDMA device it used.
        device: String,
        /// What failed.
        source: Box<rverbs_core::node::SetupError>,
    },
    /// A call on the node failed while connecting or readmitting: the first barrier, a
    /// survivor's readmission steps and the barrier after them.
    Node {
        /// The calling rank.
        rank: u32,
        /// The RDMA device it used.
        device: String,
        /// What failed.
        source: Box<rverbs_core::node::NodeError>,
    },
}

#[cfg(feature = "verbs")]
impl fmt::Display for RdmaError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::LocalPortDown {
                rank,
                device,
                port,
                state,
                source,
            } => write!(
                f,
                "rank {rank}: port {port} of {device} is down (state {state}), so: {source}"
            ),
            Self::Setup {
                rank,
                device,
                source,
            } => write!(f, "rank {rank} on RDMA device {device}: {source}"),
            Self::Node {
                rank,
                device,
                source,
            } => write!(f, "rank {rank} on RDMA device {device}: {source}"),
        }
    }
}

#[cfg(feature = "verbs")]
impl core::error::Error for RdmaError {
    fn source(&self) -> Option<&(dyn core::error::Error + 'static)> {
        match self {
            Self::LocalPortDown { source, .. } => Some(source.as_ref()),
            Self::Setup { source, .. } => Some(source.as_ref()),
            Self::Node { source, .. } => Some(source.as_ref()),
        }
    }
}

#[cfg(feature = "verbs")]
impl From<RdmaError> for BootstrapError {
    fn from(e: RdmaError) -> Self {
        Self::Rdma(e)
    }
}

fn opt_peer(peer: Option<u32>) -> String {
    peer.map_or_else(|| "peer".to_owned(), |peer| format!("rank {peer}"))
}
