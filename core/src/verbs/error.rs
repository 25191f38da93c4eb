//! Errors of the device layer: which verb failed and the errno it gave.

use core::fmt;

/// A verb, named in errors so a failure says which call failed.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Verb {
    /// `ibv_get_device_list`
    GetDeviceList,
    /// `ibv_open_device`
    OpenDevice,
    /// `ibv_query_device`
    QueryDevice,
    /// `ibv_query_port`
    QueryPort,
    /// `ibv_query_gid_ex`
    QueryGid,
    /// `ibv_alloc_pd`
    AllocPd,
    /// `ibv_reg_mr`
    RegMr,
    /// `ibv_create_cq`
    CreateCq,
    /// `ibv_create_qp`
    CreateQp,
    /// `ibv_modify_qp` to INIT
    ModifyQpInit,
    /// `ibv_modify_qp` to RTR
    ModifyQpRtr,
    /// `ibv_modify_qp` to RTS
    ModifyQpRts,
    /// `ibv_modify_qp` to ERR
    ModifyQpErr,
    /// `ibv_query_qp`
    QueryQp,
    /// `ibv_post_send`
    PostSend,
    /// `ibv_post_recv`
    PostRecv,
    /// `ibv_poll_cq`
    PollCq,
}

impl Verb {
    /// The C name of the verb.
    pub const fn name(self) -> &'static str {
        match self {
            Self::GetDeviceList => "ibv_get_device_list",
            Self::OpenDevice => "ibv_open_device",
            Self::QueryDevice => "ibv_query_device",
            Self::QueryPort => "ibv_query_port",
            Self::QueryGid => "ibv_query_gid_ex",
            Self::AllocPd => "ibv_alloc_pd",
            Self::RegMr => "ibv_reg_mr",
            Self::CreateCq => "ibv_create_cq",
            Self::CreateQp => "ibv_create_qp",
            Self::ModifyQpInit => "ibv_modify_qp(INIT)",
            Self::ModifyQpRtr => "ibv_modify_qp(RTR)",
            Self::ModifyQpRts => "ibv_modify_qp(RTS)",
            Self::ModifyQpErr => "ibv_modify_qp(ERR)",
            Self::QueryQp => "ibv_query_qp",
            Self::PostSend => "ibv_post_send",
            Self::PostRecv => "ibv_post_recv",
            Self::PollCq => "ibv_poll_cq",
        }
    }
}

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
fn errno_name(errno: i32) -> &'static str {
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
            Self::InvalidArgument { what } => write!(f, "invalid argument: {what}"),
        }
    }
}

impl core::error::Error for VerbsError {}

/// Result of the device layer.
pub type Result<T, E = VerbsError> = core::result::Result<T, E>;
