//! Connection manager identifiers (`rdma_cm_id`), each with an event channel of its own.

use core::ffi::{c_int, CStr};
use core::mem::MaybeUninit;
use core::net::SocketAddr;
use core::ptr::NonNull;
use core::time::Duration;

use super::error::{CmCall, CmError, CmEvent, CmStep, DeviceName, REJECT_NO_LISTENER};
use super::event::{Event, EventChannel};
use super::ffi::{self, errno, sys};
use crate::poll::{Deadline, Patience, StaticClock};
use crate::verbs::ffi::sys as ibv;
use crate::verbs::Pd;

/// An identifier and the event channel its events arrive on. Every identifier has a
/// channel of its own (a listener's new connections are moved to one), so waiting for one
/// connection's events never takes another's.
pub(crate) struct CmId {
    raw: NonNull<sys::rdma_cm_id>,
    // Field order is drop order: the identifier goes before its channel.
    events: EventChannel,
}

// SAFETY: librdmacm identifiers may be used from any thread; CmId owns its identifier and
// its channel exclusively.
unsafe impl Send for CmId {}

/// A librdmacm return code as a result.
pub(crate) fn check(rc: c_int, call: CmCall) -> Result<(), CmError> {
    if rc == 0 {
        Ok(())
    } else {
        Err(CmError::Call {
            call,
            errno: errno(),
        })
    }
}

impl CmId {
    /// A new identifier in port space `ps` (`RDMA_PS_TCP` for RC, `RDMA_PS_UDP` for
    /// datagrams and multicast), on a new channel.
    pub(crate) fn new(ps: sys::rdma_port_space::Type) -> Result<Self, CmError> {
        let events = EventChannel::new()?;
        let mut raw: *mut sys::rdma_cm_id = core::ptr::null_mut();
        // SAFETY: the channel is live; raw is a valid out-pointer; no context pointer.
        let rc =
            unsafe { sys::rdma_create_id(events.as_raw(), &mut raw, core::ptr::null_mut(), ps) };
        check(rc, CmCall::CreateId)?;
        let raw = NonNull::new(raw).ok_or(CmError::Call {
            call: CmCall::CreateId,
            errno: 5,
        })?;
        Ok(Self { raw, events })
    }

    /// Takes ownership of `raw` (a listener's new connection, its request acknowledged) and
    /// moves it to a channel of its own. On failure `raw` is destroyed.
    ///
    /// # Safety
    /// `raw` is a live identifier nobody else owns, with no unacknowledged event.
    pub(crate) unsafe fn adopt(raw: *mut sys::rdma_cm_id) -> Result<Self, CmError> {
        let destroy = |e: CmError| {
            // SAFETY: the caller hands us raw; it is destroyed once, here.
            unsafe { sys::rdma_destroy_id(raw) };
            e
        };
        let raw_nn = NonNull::new(raw).ok_or(CmError::Call {
            call: CmCall::MigrateId,
            errno: 22,
        })?;
        let events = EventChannel::new().map_err(destroy)?;
        // SAFETY: raw is live and its events are acknowledged (rdma_migrate_id waits for
        // that); the new channel is live.
        let rc = unsafe { sys::rdma_migrate_id(raw, events.as_raw()) };
        check(rc, CmCall::MigrateId).map_err(destroy)?;
        Ok(Self {
            raw: raw_nn,
            events,
        })
    }

    pub(crate) fn as_raw(&self) -> *mut sys::rdma_cm_id {
        self.raw.as_ptr()
    }

    pub(crate) fn events(&self) -> &EventChannel {
        &self.events
    }

    /// The port the identifier is bound to (from 1; 0 before it is bound to a device).
    pub(crate) fn port(&self) -> u8 {
        // SAFETY: the identifier is live.
        unsafe { (*self.as_raw()).port_num }
    }

    /// The local address (after binding or resolving).
    pub(crate) fn local_addr(&self) -> Option<SocketAddr> {
        // SAFETY: the identifier is live; the source address is a sockaddr_storage union.
        unsafe {
            let a = &raw const (*self.as_raw()).route.addr.__bindgen_anon_1.src_addr;
            ffi::from_sockaddr(a)
        }
    }

    /// The peer's address (after resolving, or on a connection request).
    pub(crate) fn peer_addr(&self) -> Option<SocketAddr> {
        // SAFETY: as for local_addr, for the destination.
        unsafe {
            let a = &raw const (*self.as_raw()).route.addr.__bindgen_anon_2.dst_addr;
            ffi::from_sockaddr(a)
        }
    }

    /// The kernel name of the device the identifier is bound to, if it is.
    fn device_name(&self) -> Option<DeviceName> {
        // SAFETY: the identifier is live; verbs is NULL or a context librdmacm keeps open
        // while the identifier lives, and its device name is a NUL-terminated string.
        unsafe {
            let ctx = (*self.as_raw()).verbs;
            if ctx.is_null() {
                return None;
            }
            let name = CStr::from_ptr(ibv::ibv_get_device_name((*ctx).device));
            Some(DeviceName::new(name.to_str().unwrap_or("<non-utf8>")))
        }
    }

    /// Checks that the identifier is bound to the device of `pd` (queue pairs and memory
    /// live there): the address `addr` must belong to that device's port.
    pub(crate) fn check_device(&self, pd: &Pd, addr: SocketAddr) -> Result<(), CmError> {
        let pd_device = DeviceName::new(pd.context().name());
        match self.device_name() {
            Some(device) if device == pd_device => Ok(()),
            Some(device) => Err(CmError::WrongDevice {
                addr,
                device,
                pd_device,
            }),
            None => Err(CmError::AddressError {
                peer: addr,
                status: -19,
            }),
        }
    }

    /// The attributes to move a queue pair to `state` with, as the connection manager
    /// computed them for this identifier's path and peer (`rdma_init_qp_attr`).
    pub(crate) fn qp_attr(
        &self,
        state: ibv::ibv_qp_state::Type,
    ) -> Result<(ibv::ibv_qp_attr, c_int), CmError> {
        // SAFETY: ibv_qp_attr is plain C data for which all-zero is valid.
        let mut attr: ibv::ibv_qp_attr = unsafe { MaybeUninit::zeroed().assume_init() };
        attr.qp_state = state;
        let mut mask: c_int = 0;
        // SAFETY: the identifier is live; attr and mask are valid out-pointers.
        let rc = unsafe { sys::rdma_init_qp_attr(self.as_raw(), &mut attr, &mut mask) };
        check(rc, CmCall::InitQpAttr)?;
        Ok((attr, mask))
    }

    /// Waits, until `deadline`, for an event of kind `want`. Failure events become the
    /// error that names them; `TIMEWAIT_EXIT` and `ADDR_CHANGE` are passed over; anything
    /// else is [`CmError::Unexpected`]. `addr` is the address errors name.
    pub(crate) fn expect(
        &self,
        want: sys::rdma_cm_event_type::Type,
        step: CmStep,
        addr: SocketAddr,
        deadline: Deadline,
        timeout: Duration,
        clock: StaticClock,
    ) -> Result<Event, CmError> {
        use sys::rdma_cm_event_type as t;
        // Events passed over (a stream of address changes) do not hold the wait past its
        // deadline: checked every turn.
        let mut patience = Patience::until(deadline);
        loop {
            let event = if patience.run_out(clock) {
                None
            } else {
                self.events.next(deadline, clock)?
            };
            let Some(ev) = event else {
                return Err(CmError::TimedOut {
                    addr,
                    step,
                    after: timeout,
                });
            };
            if ev.kind.0 == want {
                return Ok(ev);
            }
            let (peer, status) = (addr, ev.status);
            return Err(match ev.kind.0 {
                t::RDMA_CM_EVENT_TIMEWAIT_EXIT | t::RDMA_CM_EVENT_ADDR_CHANGE => continue,
                t::RDMA_CM_EVENT_REJECTED if status == REJECT_NO_LISTENER => {
                    CmError::Refused { peer }
                }
                t::RDMA_CM_EVENT_REJECTED => CmError::Rejected { peer, status },
                t::RDMA_CM_EVENT_UNREACHABLE => CmError::Unreachable { peer, status },
                t::RDMA_CM_EVENT_ADDR_ERROR => CmError::AddressError { peer, status },
                t::RDMA_CM_EVENT_ROUTE_ERROR => CmError::RouteError { peer, status },
                t::RDMA_CM_EVENT_CONNECT_ERROR => CmError::ConnectError { peer, status },
                t::RDMA_CM_EVENT_DISCONNECTED => CmError::Disconnected { peer },
                _ => CmError::Unexpected {
                    addr,
                    event: CmEvent(ev.kind.0),
                    status,
                },
            });
        }
    }
}

impl Drop for CmId {
    fn drop(&mut self) {
        // SAFETY: the identifier is ours and destroyed once; every event on it was
        // acknowledged when it was read, so this does not wait; no queue pair of
        // librdmacm's hangs on it (rverbs creates its own); the channel is dropped after.
        unsafe {
            sys::rdma_destroy_id(self.raw.as_ptr());
        }
    }
}
