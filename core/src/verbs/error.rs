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
    /// Hardware completion timestamps were asked for
    /// ([`CqOptions::timestamps`](super::cq::CqOptions::timestamps)) and the device cannot
    /// give them: the completion queue is refused at setup, so no completion ever carries a
    /// made-up time.
    TimestampsUnsupported {
        /// The device.
        device: DeviceName,
        /// What it lacks.
        reason: TimestampRefusal,
    },
}

/// Why a device cannot give completion timestamps ([`VerbsError::TimestampsUnsupported`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum TimestampRefusal {
    /// `ibv_query_device_ex` failed with this errno (`EOPNOTSUPP`: the provider cannot be
    /// asked), so whether its clock runs is unknown.
    NoQuery {
        /// The errno.
        errno: i32,
    },
    /// `ibv_query_device_ex` reports no completion clock (`completion_timestamp_mask` or
    /// `hca_core_clock` is 0): software devices such as rxe and siw.
    NoDeviceClock,
    /// `ibv_create_cq_ex` refused a queue with wall-clock completion timestamps
    /// (`IBV_WC_EX_WITH_COMPLETION_TIMESTAMP_WALLCLOCK`), or the provider gave it no reader
    /// for them.
    NoWallClock {
        /// The errno of the refusal.
        errno: i32,
    },
}

impl fmt::Display for TimestampRefusal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            Self::NoQuery { errno } => write!(
                f,
                "ibv_query_device_ex failed ({} ({errno})), so its completion clock is unknown",
                errno_name(errno)
            ),
            Self::NoDeviceClock => f.write_str(
                "it keeps no completion clock (ibv_query_device_ex reports \
                 completion_timestamp_mask or hca_core_clock 0, as software devices such as \
                 rxe and siw do)",
            ),
            Self::NoWallClock { errno } => write!(
                f,
                "ibv_create_cq_ex refused wall-clock completion timestamps \
                 (IBV_WC_EX_WITH_COMPLETION_TIMESTAMP_WALLCLOCK: {} ({errno}))",
                errno_name(errno)
            ),
        }
    }
}

/// A device's kernel name, held by value so that errors stay `Copy` (up to 64 bytes, the
/// kernel's limit; a longer name is cut at a character boundary).
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct DeviceName {
    bytes: [u8; 64],
    len: u8,
}

impl DeviceName {
    /// The name `name` (cut to 64 bytes).
    pub fn new(name: &str) -> Self {
        let mut len = name.len().min(64);
        while !name.is_char_boundary(len) {
            len -= 1;
        }
        let mut bytes = [0u8; 64];
        bytes[..len].copy_from_slice(&name.as_bytes()[..len]);
        Self {
            bytes,
            len: len as u8,
        }
    }

    /// The name.
    pub fn as_str(&self) -> &str {
        // Made from a &str cut at a character boundary.
        core::str::from_utf8(&self.bytes[..usize::from(self.len)]).unwrap_or("<device>")
    }
}

impl fmt::Debug for DeviceName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(self.as_str(), f)
    }
}

impl fmt::Display for DeviceName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
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
            Self::TimestampsUnsupported { device, reason } => write!(
                f,
                "device {device} cannot give hardware completion timestamps: {reason}"
            ),
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
