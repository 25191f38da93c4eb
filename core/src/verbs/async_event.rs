//! A device's asynchronous events (`ibv_get_async_event`, `ibv_ack_async_event`): the news
//! a device gives without being asked, such as a port going down or coming back, a queue
//! pair the device moved to the error state, or the device itself failing.
//!
//! Without them a port that goes down is noticed only when a wait times out. With them it is
//! noticed when the kernel says so: the context's descriptor ([`AsyncEvents::fd`]) becomes
//! readable, and [`AsyncEvents::poll`] hands out the event as a typed [`AsyncEvent`].
//!
//! Core never blocks: [`Context::async_events`] makes the context's descriptor non-blocking
//! (for every user of that context), and sleeping on it is the caller's (`poll(2)`, `epoll`,
//! an event loop). Every event is acknowledged (`ibv_ack_async_event`) before `poll`
//! returns it, after the fields it names were read: destroying a queue pair, completion
//! queue or shared receive queue waits until every event about it that was read has been
//! acknowledged, so with this wrapper a destroy never waits on rverbs.

use core::ffi::c_int;
use core::fmt;
use core::mem::MaybeUninit;

use super::device::Context;
use super::error::{Result, Verb, VerbsError};
use super::ffi::{self, errno, sys};
use crate::verb::errno::{EAGAIN, EINTR};

/// One asynchronous event, with the object it names (port number, queue pair number, or the
/// kernel handle of a completion queue or shared receive queue).
///
/// Events about ports name the port; events about queue pairs name the QP number (as
/// [`Qp::qp_num`](super::Qp::qp_num) gives it), so a caller can tell which peer's queue pair
/// failed; completion queues and shared receive queues are named by their kernel handle
/// ([`Cq::event_handle`](super::Cq::event_handle), [`Srq::event_handle`](super::Srq::event_handle)).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum AsyncEvent {
    /// The port became ACTIVE (its link came up, or came back).
    PortActive {
        /// The port number.
        port: u8,
    },
    /// The port left ACTIVE: its link went down. Every queue pair on it stops moving data.
    PortError {
        /// The port number.
        port: u8,
    },
    /// The port's LID changed (InfiniBand).
    LidChange {
        /// The port number.
        port: u8,
    },
    /// The port's P_Key table changed.
    PkeyChange {
        /// The port number.
        port: u8,
    },
    /// The port's GID table changed (RoCE: an IP address was added or removed).
    GidChange {
        /// The port number.
        port: u8,
    },
    /// The subnet manager serving the port changed (InfiniBand).
    SmChange {
        /// The port number.
        port: u8,
    },
    /// The subnet manager asks clients to register again (InfiniBand).
    ClientReregister {
        /// The port number.
        port: u8,
    },
    /// A queue pair hit an error no completion reports and went to the error state.
    QpFatal {
        /// The queue pair's number.
        qp_num: u32,
    },
    /// A queue pair received a request it cannot execute (a transport error on the
    /// responder side) and went to the error state.
    QpRequestError {
        /// The queue pair's number.
        qp_num: u32,
    },
    /// A peer's request broke the access rules of the queue pair (a bad rkey, bounds or
    /// rights); the queue pair went to the error state.
    QpAccessError {
        /// The queue pair's number.
        qp_num: u32,
    },
    /// A queue pair in RTR received its first packet (the connection is established).
    CommEstablished {
        /// The queue pair's number.
        qp_num: u32,
    },
    /// A queue pair that was moved to SQD has drained its send queue.
    SqDrained {
        /// The queue pair's number.
        qp_num: u32,
    },
    /// A queue pair migrated to its alternate path.
    PathMigrated {
        /// The queue pair's number.
        qp_num: u32,
    },
    /// A queue pair's path migration failed.
    PathMigrationError {
        /// The queue pair's number.
        qp_num: u32,
    },
    /// A queue pair on a shared receive queue, in the error state, consumed its last
    /// receive: it may now be destroyed without losing a receive to it.
    QpLastWqeReached {
        /// The queue pair's number.
        qp_num: u32,
    },
    /// A completion queue overran (or failed otherwise); completions were lost.
    CqError {
        /// The completion queue's kernel handle.
        cq_handle: u32,
    },
    /// A shared receive queue failed; its queue pairs go to the error state.
    SrqError {
        /// The shared receive queue's kernel handle.
        srq_handle: u32,
    },
    /// A shared receive queue fell below the limit it was armed with.
    SrqLimitReached {
        /// The shared receive queue's kernel handle.
        srq_handle: u32,
    },
    /// A work queue failed.
    WqFatal {
        /// The work queue's number.
        wq_num: u32,
    },
    /// The device failed: nothing opened on it works any more; close and reopen it.
    DeviceFatal,
    /// An event type this version does not know (newer kernels may add some).
    Unknown {
        /// The `ibv_event_type` code.
        code: u32,
    },
}

/// What the union of an `ibv_async_event` holds for an event type.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Element {
    Port,
    Qp,
    Cq,
    Srq,
    Wq,
    Device,
}

/// Which member of the event's union names its object, for each `ibv_event_type` code
/// (`None`: a code this version does not know, whose union is not read).
const fn element_of(code: u32) -> Option<Element> {
    Some(match code {
        sys::IBV_EVENT_PORT_ACTIVE
        | sys::IBV_EVENT_PORT_ERR
        | sys::IBV_EVENT_LID_CHANGE
        | sys::IBV_EVENT_PKEY_CHANGE
        | sys::IBV_EVENT_GID_CHANGE
        | sys::IBV_EVENT_SM_CHANGE
        | sys::IBV_EVENT_CLIENT_REREGISTER => Element::Port,
        sys::IBV_EVENT_QP_FATAL
        | sys::IBV_EVENT_QP_REQ_ERR
        | sys::IBV_EVENT_QP_ACCESS_ERR
        | sys::IBV_EVENT_COMM_EST
        | sys::IBV_EVENT_SQ_DRAINED
        | sys::IBV_EVENT_PATH_MIG
        | sys::IBV_EVENT_PATH_MIG_ERR
        | sys::IBV_EVENT_QP_LAST_WQE_REACHED => Element::Qp,
        sys::IBV_EVENT_CQ_ERR => Element::Cq,
        sys::IBV_EVENT_SRQ_ERR | sys::IBV_EVENT_SRQ_LIMIT_REACHED => Element::Srq,
        sys::IBV_EVENT_WQ_FATAL => Element::Wq,
        sys::IBV_EVENT_DEVICE_FATAL => Element::Device,
        _ => return None,
    })
}

impl AsyncEvent {
    /// The event for `code`, naming `object`: the port number, QP or WQ number, or kernel
    /// handle, whichever [`element_of`] says the code carries (ignored for the device and for
    /// unknown codes). A port number outside 1..=255 is no port: the event is `Unknown`.
    fn decode(code: u32, object: u32) -> Self {
        let port = u8::try_from(object).ok().filter(|p| *p != 0);
        let qp_num = object;
        match (code, port) {
            (sys::IBV_EVENT_PORT_ACTIVE, Some(port)) => Self::PortActive { port },
            (sys::IBV_EVENT_PORT_ERR, Some(port)) => Self::PortError { port },
            (sys::IBV_EVENT_LID_CHANGE, Some(port)) => Self::LidChange { port },
            (sys::IBV_EVENT_PKEY_CHANGE, Some(port)) => Self::PkeyChange { port },
            (sys::IBV_EVENT_GID_CHANGE, Some(port)) => Self::GidChange { port },
            (sys::IBV_EVENT_SM_CHANGE, Some(port)) => Self::SmChange { port },
            (sys::IBV_EVENT_CLIENT_REREGISTER, Some(port)) => Self::ClientReregister { port },
            (sys::IBV_EVENT_QP_FATAL, _) => Self::QpFatal { qp_num },
            (sys::IBV_EVENT_QP_REQ_ERR, _) => Self::QpRequestError { qp_num },
            (sys::IBV_EVENT_QP_ACCESS_ERR, _) => Self::QpAccessError { qp_num },
            (sys::IBV_EVENT_COMM_EST, _) => Self::CommEstablished { qp_num },
            (sys::IBV_EVENT_SQ_DRAINED, _) => Self::SqDrained { qp_num },
            (sys::IBV_EVENT_PATH_MIG, _) => Self::PathMigrated { qp_num },
            (sys::IBV_EVENT_PATH_MIG_ERR, _) => Self::PathMigrationError { qp_num },
            (sys::IBV_EVENT_QP_LAST_WQE_REACHED, _) => Self::QpLastWqeReached { qp_num },
            (sys::IBV_EVENT_CQ_ERR, _) => Self::CqError { cq_handle: object },
            (sys::IBV_EVENT_SRQ_ERR, _) => Self::SrqError { srq_handle: object },
            (sys::IBV_EVENT_SRQ_LIMIT_REACHED, _) => Self::SrqLimitReached { srq_handle: object },
            (sys::IBV_EVENT_WQ_FATAL, _) => Self::WqFatal { wq_num: object },
            (sys::IBV_EVENT_DEVICE_FATAL, _) => Self::DeviceFatal,
            _ => Self::Unknown { code },
        }
    }

    /// Whether the event means traffic stopped: a port down, a queue pair, queue or the
    /// device in the error state. (A port coming back, a GID change or an SRQ limit do not.)
    pub const fn stops_traffic(&self) -> bool {
        matches!(
            self,
            Self::PortError { .. }
                | Self::QpFatal { .. }
                | Self::QpRequestError { .. }
                | Self::QpAccessError { .. }
                | Self::PathMigrationError { .. }
                | Self::CqError { .. }
                | Self::SrqError { .. }
                | Self::WqFatal { .. }
                | Self::DeviceFatal
        )
    }

    /// The port the event is about, if it is about a port.
    pub const fn port(&self) -> Option<u8> {
        match *self {
            Self::PortActive { port }
            | Self::PortError { port }
            | Self::LidChange { port }
            | Self::PkeyChange { port }
            | Self::GidChange { port }
            | Self::SmChange { port }
            | Self::ClientReregister { port } => Some(port),
            _ => None,
        }
    }

    /// The queue pair the event is about, if it is about a queue pair.
    pub const fn qp_num(&self) -> Option<u32> {
        match *self {
            Self::QpFatal { qp_num }
            | Self::QpRequestError { qp_num }
            | Self::QpAccessError { qp_num }
            | Self::CommEstablished { qp_num }
            | Self::SqDrained { qp_num }
            | Self::PathMigrated { qp_num }
            | Self::PathMigrationError { qp_num }
            | Self::QpLastWqeReached { qp_num } => Some(qp_num),
            _ => None,
        }
    }
}

impl fmt::Display for AsyncEvent {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            Self::PortActive { port } => write!(f, "port {port} is active"),
            Self::PortError { port } => write!(f, "port {port} went down"),
            Self::LidChange { port } => write!(f, "port {port}: LID changed"),
            Self::PkeyChange { port } => write!(f, "port {port}: P_Key table changed"),
            Self::GidChange { port } => write!(f, "port {port}: GID table changed"),
            Self::SmChange { port } => write!(f, "port {port}: subnet manager changed"),
            Self::ClientReregister { port } => {
                write!(f, "port {port}: subnet manager asks to register again")
            }
            Self::QpFatal { qp_num } => write!(f, "queue pair {qp_num:#x}: fatal error"),
            Self::QpRequestError { qp_num } => {
                write!(f, "queue pair {qp_num:#x}: invalid request received")
            }
            Self::QpAccessError { qp_num } => {
                write!(f, "queue pair {qp_num:#x}: remote access error")
            }
            Self::CommEstablished { qp_num } => {
                write!(f, "queue pair {qp_num:#x}: communication established")
            }
            Self::SqDrained { qp_num } => write!(f, "queue pair {qp_num:#x}: send queue drained"),
            Self::PathMigrated { qp_num } => write!(f, "queue pair {qp_num:#x}: path migrated"),
            Self::PathMigrationError { qp_num } => {
                write!(f, "queue pair {qp_num:#x}: path migration failed")
            }
            Self::QpLastWqeReached { qp_num } => {
                write!(f, "queue pair {qp_num:#x}: last receive consumed")
            }
            Self::CqError { cq_handle } => write!(f, "completion queue {cq_handle}: error"),
            Self::SrqError { srq_handle } => {
                write!(f, "shared receive queue {srq_handle}: error")
            }
            Self::SrqLimitReached { srq_handle } => {
                write!(
                    f,
                    "shared receive queue {srq_handle}: fewer receives posted than its limit \
                     (its receivers are falling behind their senders)"
                )
            }
            Self::WqFatal { wq_num } => write!(f, "work queue {wq_num:#x}: fatal error"),
            Self::DeviceFatal => f.write_str("the device failed"),
            Self::Unknown { code } => write!(f, "unknown asynchronous event {code}"),
        }
    }
}

/// The asynchronous events of one device context: a descriptor to sleep on and a
/// non-blocking [`poll`](Self::poll).
///
/// Holds the context open. `Send + Sync`: each event is read by exactly one caller (a read
/// on the descriptor), so several threads may poll one context's events, each seeing some.
#[derive(Clone)]
pub struct AsyncEvents {
    ctx: Context,
}

impl fmt::Debug for AsyncEvents {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("AsyncEvents")
            .field("device", &self.ctx.name())
            .field("fd", &self.fd())
            .finish()
    }
}

impl Context {
    /// The context's asynchronous events. Makes the context's event descriptor
    /// non-blocking, so no read of it (by rverbs or by C code handed [`Context::as_raw`])
    /// waits for the next event any more.
    pub fn async_events(&self) -> Result<AsyncEvents> {
        // SAFETY: the context is open while self lives; async_fd is its descriptor.
        let fd = unsafe { (*self.as_raw()).async_fd };
        ffi::set_nonblocking(fd).map_err(|errno| VerbsError::Call {
            verb: Verb::GetAsyncEvent,
            errno,
        })?;
        Ok(AsyncEvents { ctx: self.clone() })
    }
}

impl AsyncEvents {
    /// The descriptor that becomes readable when an event is pending; for `poll(2)`/`epoll`.
    /// Non-blocking; owned by the context (do not close it).
    pub fn fd(&self) -> c_int {
        // SAFETY: the context is open while self lives.
        unsafe { (*self.ctx.as_raw()).async_fd }
    }

    /// The next pending event, acknowledged; `Ok(None)` when none is pending. Never blocks.
    ///
    /// Does not allocate.
    pub fn poll(&self) -> Result<Option<AsyncEvent>> {
        loop {
            let mut raw = MaybeUninit::<sys::ibv_async_event>::uninit();
            // SAFETY: the context is open; `raw` is a valid out-pointer the call fills on
            // success. The descriptor is non-blocking, so the call returns at once.
            let rc = unsafe { sys::ibv_get_async_event(self.ctx.as_raw(), raw.as_mut_ptr()) };
            if rc != 0 {
                return match errno() {
                    EAGAIN => Ok(None),
                    EINTR => continue,
                    errno => Err(VerbsError::Call {
                        verb: Verb::GetAsyncEvent,
                        errno,
                    }),
                };
            }
            // SAFETY: ibv_get_async_event returned 0, so it filled the event.
            let mut raw = unsafe { raw.assume_init() };
            let code = raw.event_type;
            // SAFETY: the union member read is the one the event type names (element_of),
            // and an object an event names stays alive until the event is acknowledged
            // (its destroy waits for that), which happens below, after these reads.
            let object = unsafe {
                match element_of(code) {
                    Some(Element::Port) => u32::try_from(raw.element.port_num).unwrap_or(0),
                    Some(Element::Qp) => (*raw.element.qp).qp_num,
                    Some(Element::Cq) => (*raw.element.cq).handle,
                    Some(Element::Srq) => (*raw.element.srq).handle,
                    Some(Element::Wq) => (*raw.element.wq).wq_num,
                    Some(Element::Device) | None => 0,
                }
            };
            // SAFETY: `raw` is the event just read, acknowledged exactly once.
            unsafe { sys::ibv_ack_async_event(&mut raw) };
            return Ok(Some(AsyncEvent::decode(code, object)));
        }
    }
}

impl super::Cq {
    /// The queue's kernel handle: how a [`AsyncEvent::CqError`] names it.
    pub fn event_handle(&self) -> u32 {
        // SAFETY: the queue is live while self is.
        unsafe { (*self.as_raw()).handle }
    }
}

impl super::Srq {
    /// The queue's kernel handle: how [`AsyncEvent::SrqError`] and
    /// [`AsyncEvent::SrqLimitReached`] name it.
    pub fn event_handle(&self) -> u32 {
        // SAFETY: the queue is live while self is.
        unsafe { (*self.as_raw()).handle }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_known_code_decodes_to_its_event_naming_its_object() {
        // Codes 0..=19 are the ibv_event_type values of rdma-core's verbs.h.
        let expect = [
            (sys::IBV_EVENT_CQ_ERR, AsyncEvent::CqError { cq_handle: 7 }),
            (sys::IBV_EVENT_QP_FATAL, AsyncEvent::QpFatal { qp_num: 7 }),
            (
                sys::IBV_EVENT_QP_REQ_ERR,
                AsyncEvent::QpRequestError { qp_num: 7 },
            ),
            (
                sys::IBV_EVENT_QP_ACCESS_ERR,
                AsyncEvent::QpAccessError { qp_num: 7 },
            ),
            (
                sys::IBV_EVENT_COMM_EST,
                AsyncEvent::CommEstablished { qp_num: 7 },
            ),
            (
                sys::IBV_EVENT_SQ_DRAINED,
                AsyncEvent::SqDrained { qp_num: 7 },
            ),
            (
                sys::IBV_EVENT_PATH_MIG,
                AsyncEvent::PathMigrated { qp_num: 7 },
            ),
            (
                sys::IBV_EVENT_PATH_MIG_ERR,
                AsyncEvent::PathMigrationError { qp_num: 7 },
            ),
            (sys::IBV_EVENT_DEVICE_FATAL, AsyncEvent::DeviceFatal),
            (
                sys::IBV_EVENT_PORT_ACTIVE,
                AsyncEvent::PortActive { port: 7 },
            ),
            (sys::IBV_EVENT_PORT_ERR, AsyncEvent::PortError { port: 7 }),
            (sys::IBV_EVENT_LID_CHANGE, AsyncEvent::LidChange { port: 7 }),
            (
                sys::IBV_EVENT_PKEY_CHANGE,
                AsyncEvent::PkeyChange { port: 7 },
            ),
            (sys::IBV_EVENT_SM_CHANGE, AsyncEvent::SmChange { port: 7 }),
            (
                sys::IBV_EVENT_SRQ_ERR,
                AsyncEvent::SrqError { srq_handle: 7 },
            ),
            (
                sys::IBV_EVENT_SRQ_LIMIT_REACHED,
                AsyncEvent::SrqLimitReached { srq_handle: 7 },
            ),
            (
                sys::IBV_EVENT_QP_LAST_WQE_REACHED,
                AsyncEvent::QpLastWqeReached { qp_num: 7 },
            ),
            (
                sys::IBV_EVENT_CLIENT_REREGISTER,
                AsyncEvent::ClientReregister { port: 7 },
            ),
            (sys::IBV_EVENT_GID_CHANGE, AsyncEvent::GidChange { port: 7 }),
            (sys::IBV_EVENT_WQ_FATAL, AsyncEvent::WqFatal { wq_num: 7 }),
        ];
        for (code, event) in expect {
            assert!(element_of(code).is_some(), "code {code} has an element");
            assert_eq!(AsyncEvent::decode(code, 7), event, "code {code}");
        }
        assert_eq!(expect.len(), 20, "every code 0..=19");
    }

    #[test]
    fn unknown_codes_and_impossible_ports_stay_unknown() {
        assert_eq!(element_of(20), None);
        assert_eq!(AsyncEvent::decode(20, 3), AsyncEvent::Unknown { code: 20 });
        // Port 0 and ports above 255 do not exist: not a port event with a made-up number.
        let err = sys::IBV_EVENT_PORT_ERR;
        assert_eq!(
            AsyncEvent::decode(err, 0),
            AsyncEvent::Unknown { code: err }
        );
        assert_eq!(
            AsyncEvent::decode(err, 256),
            AsyncEvent::Unknown { code: err }
        );
    }

    #[test]
    fn only_port_error_qp_fatal_and_device_fatal_stop_traffic() {
        assert!(AsyncEvent::PortError { port: 1 }.stops_traffic());
        assert!(AsyncEvent::QpFatal { qp_num: 1 }.stops_traffic());
        assert!(AsyncEvent::DeviceFatal.stops_traffic());
        assert!(!AsyncEvent::PortActive { port: 1 }.stops_traffic());
        assert!(!AsyncEvent::GidChange { port: 1 }.stops_traffic());
        assert!(!AsyncEvent::SrqLimitReached { srq_handle: 1 }.stops_traffic());
        assert!(!AsyncEvent::QpLastWqeReached { qp_num: 1 }.stops_traffic());
        assert_eq!(AsyncEvent::QpFatal { qp_num: 9 }.qp_num(), Some(9));
        assert_eq!(AsyncEvent::PortError { port: 2 }.port(), Some(2));
        assert_eq!(AsyncEvent::DeviceFatal.port(), None);
    }
}
