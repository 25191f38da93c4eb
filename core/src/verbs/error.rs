//! Errors of the device layer: which verb failed and the errno it gave.

use core::fmt;

pub use crate::verb::Verb;

/// An error of the device layer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum VerbsError {
    /// A verb failed with this errno.
    Call {
        /// The verb that failed.
        verb: Verb,
        /// The errno it reported (or left in `errno`).
        errno: i32,
    },
    /// No RDMA device has the requested name.
    NoSuchDevice,
    /// The device has no such port.
    NoSuchPort {
        /// The port number asked for.
        port: u8,
    },
    /// The port is not ACTIVE (cable, link, or subnet manager).
    PortNotActive {
        /// The port number.
        port: u8,
        /// Its `ibv_port_state` code.
        state: u32,
    },
    /// An Ethernet (RoCE) port has no GID usable for routing.
    NoUsableGid {
        /// The port number.
        port: u8,
    },
    /// The device cannot register dma-buf memory (`ibv_reg_dmabuf_mr` answered
    /// `EOPNOTSUPP`, or `ENOSYS` from a provider library without the verb). Software devices
    /// (rxe, siw) never can; see [`Pd::register_dmabuf`](super::Pd::register_dmabuf).
    DmabufUnsupported {
        /// The errno the verb gave.
        errno: i32,
    },
    /// The device took a transport setting but set another value than the one asked for
    /// (some drivers clamp the ACK timeout or the retry counts to what their hardware
    /// supports): the wall times [`QpConfig`](super::QpConfig) promises would not hold, so
    /// the queue pair is refused. Ask for the granted value, or one the device keeps.
    Clamped {
        /// Which setting (`"ack_timeout"`, `"retry_count"`, `"rnr_retry"`, `"rnr_timer"`).
        setting: &'static str,
        /// The code asked for.
        asked: u8,
        /// The code the device reports it uses.
        granted: u8,
    },
    /// A parameter is out of the device's limits.
    InvalidArgument {
        /// Which parameter.
        what: &'static str,
    },
}

impl VerbsError {
    /// The errno, if the error came from a verb.
    pub const fn errno(&self) -> Option<i32> {
        match self {
            Self::Call { errno, .. } => Some(*errno),
            _ => None,
        }
    }
}

/// A short name for a few errnos that verbs commonly return.
pub(crate) fn errno_name(errno: i32) -> &'static str {
    match errno {
        1 => "EPERM",
        2 => "ENOENT",
        5 => "EIO",
        11 => "EAGAIN",
        12 => "ENOMEM (also: ulimit -l too low for memory registration)",
        13 => "EACCES",
        14 => "EFAULT",
        16 => "EBUSY",
        19 => "ENODEV",
        22 => "EINVAL",
        38 => "ENOSYS",
        95 => "EOPNOTSUPP",
        110 => "ETIMEDOUT",
        _ => "errno",
    }
}

impl fmt::Display for VerbsError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            Self::Call { verb, errno } => {
                write!(f, "{} failed: {} ({errno})", verb.name(), errno_name(errno))
            }
            Self::NoSuchDevice => f.write_str("no RDMA device with that name"),
            Self::NoSuchPort { port } => write!(f, "the device has no port {port}"),
            Self::PortNotActive { port, state } => {
                write!(f, "port {port} is not active (ibv_port_state {state})")
            }
            Self::NoUsableGid { port } => {
                write!(f, "port {port} has no RoCE GID usable for routing (is an IP address assigned to its netdev?)")
            }
            Self::DmabufUnsupported { errno } => write!(
                f,
                "the device does not support dma-buf registration (ibv_reg_dmabuf_mr: {} ({errno})); \
                 devices whose kernel drivers do: NVIDIA/Mellanox mlx5, AWS efa, Intel irdma, \
                 Broadcom bnxt_re (software devices such as rxe and siw do not)",
                errno_name(errno)
            ),
            Self::Clamped {
                setting,
                asked,
                granted,
            } => write!(
                f,
                "the device set the queue pair's {setting} to code {granted}, not the {asked} \
                 asked for (it clamps that setting): ask for {granted}, or a value it keeps"
            ),
            Self::InvalidArgument { what } => write!(f, "invalid argument: {what}"),
        }
    }
}

impl core::error::Error for VerbsError {}

impl VerbsError {
    /// As a provider-call failure: the verb and errno of a failed verb; anything else (an
    /// error rverbs found before or instead of calling one) keeps `fallback` as the verb
    /// and [`EINVAL`](crate::verb::errno::EINVAL), never a made-up success errno.
    pub(crate) fn provider_error(self, fallback: Verb) -> crate::verb::ProviderError {
        match self {
            Self::Call { verb, errno } => crate::verb::ProviderError { verb, errno },
            other => crate::verb::ProviderError {
                verb: fallback,
                errno: other.errno().unwrap_or(crate::verb::errno::EINVAL),
            },
        }
    }
}

/// Result of the device layer.
pub type Result<T, E = VerbsError> = core::result::Result<T, E>;
