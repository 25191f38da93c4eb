//! What can go wrong when connecting or joining through the connection manager, named so
//! that the log says which address and which step.

use core::fmt;
use core::net::{IpAddr, SocketAddr};
use core::time::Duration;

use crate::channel::ChannelError;
use crate::verbs::error::errno_name;
use crate::verbs::VerbsError;
use crate::wire::ConnectDataError;

/// A librdmacm call, named in errors.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum CmCall {
    /// `rdma_create_event_channel`
    CreateEventChannel,
    /// `rdma_create_id`
    CreateId,
    /// `rdma_bind_addr`
    BindAddr,
    /// `rdma_listen`
    Listen,
    /// `rdma_resolve_addr`
    ResolveAddr,
    /// `rdma_resolve_route`
    ResolveRoute,
    /// `rdma_init_qp_attr`
    InitQpAttr,
    /// `rdma_connect`
    Connect,
    /// `rdma_accept`
    Accept,
    /// `rdma_establish`
    Establish,
    /// `rdma_disconnect`
    Disconnect,
    /// `rdma_get_cm_event` (or the `poll(2)` on its channel)
    GetEvent,
    /// `rdma_migrate_id`
    MigrateId,
    /// `rdma_join_multicast`
    JoinMulticast,
    /// `rdma_leave_multicast`
    LeaveMulticast,
}

impl CmCall {
    /// The C name of the call.
    pub const fn name(self) -> &'static str {
        match self {
            Self::CreateEventChannel => "rdma_create_event_channel",
            Self::CreateId => "rdma_create_id",
            Self::BindAddr => "rdma_bind_addr",
            Self::Listen => "rdma_listen",
            Self::ResolveAddr => "rdma_resolve_addr",
            Self::ResolveRoute => "rdma_resolve_route",
            Self::InitQpAttr => "rdma_init_qp_attr",
            Self::Connect => "rdma_connect",
            Self::Accept => "rdma_accept",
            Self::Establish => "rdma_establish",
            Self::Disconnect => "rdma_disconnect",
            Self::GetEvent => "rdma_get_cm_event",
            Self::MigrateId => "rdma_migrate_id",
            Self::JoinMulticast => "rdma_join_multicast",
            Self::LeaveMulticast => "rdma_leave_multicast",
        }
    }
}

/// What a wait was waiting for when its deadline passed.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum CmStep {
    /// The address to resolve to a local RDMA device (`ADDR_RESOLVED`).
    ResolveAddress,
    /// The path to the peer (`ROUTE_RESOLVED`).
    ResolveRoute,
    /// The peer's answer to our connection request (`CONNECT_RESPONSE`).
    ConnectResponse,
    /// A connection request at a listener (`CONNECT_REQUEST`).
    ConnectRequest,
    /// The peer's confirmation of an accepted connection (`ESTABLISHED`).
    Established,
    /// The peer's disconnect, waited for (`DISCONNECTED`).
    PeerDisconnect,
    /// A multicast join (`MULTICAST_JOIN`).
    Join,
}

impl CmStep {
    fn describe(self) -> &'static str {
        match self {
            Self::ResolveAddress => "resolving the address to a local RDMA device",
            Self::ResolveRoute => "resolving the route",
            Self::ConnectResponse => "waiting for the peer to accept the connection",
            Self::ConnectRequest => "waiting for a connection request",
            Self::Established => "waiting for the peer to confirm the connection",
            Self::PeerDisconnect => "waiting for the peer to disconnect",
            Self::Join => "joining the multicast group",
        }
    }
}

/// A connection manager event, as librdmacm numbers them (`enum rdma_cm_event_type`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct CmEvent(pub u32);

impl CmEvent {
    /// The event's C name without the `RDMA_CM_EVENT_` prefix.
    pub const fn name(self) -> &'static str {
        match self.0 {
            0 => "ADDR_RESOLVED",
            1 => "ADDR_ERROR",
            2 => "ROUTE_RESOLVED",
            3 => "ROUTE_ERROR",
            4 => "CONNECT_REQUEST",
            5 => "CONNECT_RESPONSE",
            6 => "CONNECT_ERROR",
            7 => "UNREACHABLE",
            8 => "REJECTED",
            9 => "ESTABLISHED",
            10 => "DISCONNECTED",
            11 => "DEVICE_REMOVAL",
            12 => "MULTICAST_JOIN",
            13 => "MULTICAST_ERROR",
            14 => "ADDR_CHANGE",
            15 => "TIMEWAIT_EXIT",
            _ => "unknown event",
        }
    }
}

impl fmt::Display for CmEvent {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "RDMA_CM_EVENT_{}", self.name())
    }
}

/// Bytes of a device name an error keeps: real names (`rxe0`, `mlx5_0`, `irdma0`) are far
/// shorter; a longer one is cut (and shown with `...`).
const NAME_BYTES: usize = 24;

/// A device's kernel name, kept in the error (no heap in core errors).
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct DeviceName {
    bytes: [u8; NAME_BYTES],
    len: u8,
    cut: bool,
}

impl DeviceName {
    pub(crate) fn new(name: &str) -> Self {
        let mut bytes = [0u8; NAME_BYTES];
        let mut n = name.len().min(NAME_BYTES);
        while !name.is_char_boundary(n) {
            n -= 1;
        }
        bytes[..n].copy_from_slice(&name.as_bytes()[..n]);
        Self {
            bytes,
            len: n as u8,
            cut: n < name.len(),
        }
    }

    /// The name (its first 24 bytes).
    pub fn as_str(&self) -> &str {
        core::str::from_utf8(&self.bytes[..usize::from(self.len)]).unwrap_or("<non-utf8>")
    }
}

impl fmt::Debug for DeviceName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(self.as_str(), f)
    }
}

impl fmt::Display for DeviceName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())?;
        if self.cut {
            f.write_str("...")?;
        }
        Ok(())
    }
}

/// The IB CM reject reason "invalid service ID": no listener on that port.
pub(crate) const REJECT_NO_LISTENER: i32 = 8;

/// Why a connection, an accept, a disconnect or a multicast join failed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum CmError {
    /// A librdmacm call failed with this errno.
    Call {
        /// The call.
        call: CmCall,
        /// Its errno.
        errno: i32,
    },
    /// Setting up the queue pair or its completion queues failed.
    Verbs(VerbsError),
    /// Nobody listens at the address and port (the peer's connection manager rejected the
    /// request with "invalid service ID").
    Refused {
        /// Where we connected to.
        peer: SocketAddr,
    },
    /// The peer rejected the connection (its program refused it, or its connection manager
    /// did, with the IB CM reject reason `status`).
    Rejected {
        /// Where we connected to.
        peer: SocketAddr,
        /// The reject reason (28: the peer's program rejected it).
        status: i32,
    },
    /// The peer's port did not answer (`UNREACHABLE`): no host there, or it is down.
    Unreachable {
        /// Where we connected to.
        peer: SocketAddr,
        /// The event's status (an errno, or an IB CM reason).
        status: i32,
    },
    /// The address cannot be resolved (`ADDR_ERROR`): no local RDMA device routes to it, or
    /// nobody answers at it (no ARP/neighbour reply).
    AddressError {
        /// The address.
        peer: SocketAddr,
        /// The event's status (a negative errno).
        status: i32,
    },
    /// No path to the peer (`ROUTE_ERROR`).
    RouteError {
        /// The address.
        peer: SocketAddr,
        /// The event's status (a negative errno).
        status: i32,
    },
    /// The connection failed while being set up (`CONNECT_ERROR`).
    ConnectError {
        /// The peer.
        peer: SocketAddr,
        /// The event's status.
        status: i32,
    },
    /// A wait passed its deadline.
    TimedOut {
        /// The peer's address, or the listener's own for a wait for a request.
        addr: SocketAddr,
        /// What it waited for.
        step: CmStep,
        /// How long it waited.
        after: Duration,
    },
    /// The address belongs to another device than the protection domain's.
    WrongDevice {
        /// The address.
        addr: SocketAddr,
        /// The device the connection manager bound it to.
        device: DeviceName,
        /// The device of the protection domain given.
        pd_device: DeviceName,
    },
    /// The address is on another port of the device than the queue pair's.
    WrongPort {
        /// The address.
        addr: SocketAddr,
        /// The port it is on.
        port: u8,
        /// The queue pair's port.
        qp_port: u8,
    },
    /// The peer's private data is not rverbs' connect data (the peer is another program, or
    /// a different version).
    BadConnectData {
        /// The peer.
        peer: SocketAddr,
        /// What is wrong with it.
        error: ConnectDataError,
    },
    /// The peer disconnected before the connection was set up.
    Disconnected {
        /// The peer.
        peer: SocketAddr,
    },
    /// An event that does not fit the step (`DEVICE_REMOVAL`, for one).
    Unexpected {
        /// The peer or local address concerned.
        addr: SocketAddr,
        /// The event.
        event: CmEvent,
        /// Its status.
        status: i32,
    },
    /// Joining the multicast group failed (`MULTICAST_ERROR`).
    JoinFailed {
        /// The group.
        group: IpAddr,
        /// The event's status.
        status: i32,
    },
    /// The group's Q_Key, as the connection manager gave it, is not the queue pair's: its
    /// datagrams would be dropped on arrival.
    QkeyMismatch {
        /// The group.
        group: IpAddr,
        /// The group's Q_Key.
        group_qkey: u32,
        /// The queue pair's.
        qp_qkey: u32,
    },
    /// A multicast group address that is not one (IPv4 224.0.0.0/4, IPv6 ff00::/8), or no
    /// IP address at all (a GID that maps to none).
    NotMulticast,
    /// The channel failed while it was being disconnected (the work it waited for).
    Channel(ChannelError),
}

impl From<VerbsError> for CmError {
    fn from(e: VerbsError) -> Self {
        Self::Verbs(e)
    }
}

impl From<ChannelError> for CmError {
    fn from(e: ChannelError) -> Self {
        Self::Channel(e)
    }
}

impl fmt::Display for CmError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            Self::Call { call, errno } => {
                write!(f, "{} failed: {} ({errno})", call.name(), errno_name(errno))
            }
            Self::Verbs(e) => write!(f, "setting up the queue pair: {e}"),
            Self::Refused { peer } => {
                write!(
                    f,
                    "connection refused by {peer}: nobody listens on that port"
                )
            }
            Self::Rejected { peer, status } => {
                write!(f, "connection rejected by {peer} (reject reason {status})")
            }
            Self::Unreachable { peer, status } => {
                write!(f, "{peer} is unreachable (status {status})")
            }
            Self::AddressError { peer, status } => write!(
                f,
                "cannot resolve {} (status {status}): no local RDMA device's netdev routes to \
                 it, or no host answers at that address",
                peer.ip()
            ),
            Self::RouteError { peer, status } => {
                write!(f, "no route to {peer} (status {status})")
            }
            Self::ConnectError { peer, status } => {
                write!(f, "connection to {peer} failed (status {status})")
            }
            Self::TimedOut { addr, step, after } => {
                write!(f, "{addr}: timed out after {after:?} {}", step.describe())
            }
            Self::WrongDevice {
                addr,
                device,
                pd_device,
            } => write!(
                f,
                "{addr} is on device {device}, but the protection domain is on {pd_device}"
            ),
            Self::WrongPort {
                addr,
                port,
                qp_port,
            } => write!(
                f,
                "{addr} is on port {port}, but the queue pair is on port {qp_port}"
            ),
            Self::BadConnectData { peer, error } => {
                write!(f, "{peer} sent no rverbs connect data: {error}")
            }
            Self::Disconnected { peer } => {
                write!(f, "{peer} disconnected before the connection was set up")
            }
            Self::Unexpected {
                addr,
                event,
                status,
            } => write!(f, "{addr}: unexpected {event} (status {status})"),
            Self::JoinFailed { group, status } => {
                write!(
                    f,
                    "joining multicast group {group} failed (status {status})"
                )
            }
            Self::QkeyMismatch {
                group,
                group_qkey,
                qp_qkey,
            } => write!(
                f,
                "multicast group {group} uses Q_Key {group_qkey:#x}, the queue pair {qp_qkey:#x}"
            ),
            Self::NotMulticast => f.write_str("not a multicast group address"),
            Self::Channel(e) => write!(f, "while disconnecting: {e}"),
        }
    }
}

impl core::error::Error for CmError {
    fn source(&self) -> Option<&(dyn core::error::Error + 'static)> {
        match self {
            Self::Verbs(e) => Some(e),
            Self::Channel(e) => Some(e),
            Self::BadConnectData { error, .. } => Some(error),
            _ => None,
        }
    }
}
