//! Event channels, and events copied out of librdmacm before they are acknowledged.
//!
//! Every wait for an event is bounded: the channel's descriptor is non-blocking, and a wait
//! sleeps in `poll(2)` for at most what is left until its deadline. An event is copied (its
//! kind, status, the peer's private data, the multicast address attributes) and acknowledged
//! at once, so no identifier ever waits in `rdma_destroy_id` for an event we hold.

use core::ptr::NonNull;

use super::error::{CmCall, CmError, CmEvent};
use super::ffi::{self, errno, sys};
use crate::poll::{Clock, Deadline};
use crate::verbs::ffi::sys::ibv_ah_attr;

/// Most private data an event carries (a connection reply's 196 bytes, rounded up).
pub(crate) const MAX_PRIVATE_DATA: usize = 256;

/// `rdma_event_channel`: a descriptor events arrive on. Destroyed on drop, which the
/// identifiers on it must precede ([`super::id::CmId`] owns its channel for that reason).
pub(crate) struct EventChannel {
    raw: NonNull<sys::rdma_event_channel>,
}

// SAFETY: librdmacm's event channels may be used from any thread; the pointer is owned.
unsafe impl Send for EventChannel {}

impl EventChannel {
    /// A new channel with a non-blocking descriptor.
    pub(crate) fn new() -> Result<Self, CmError> {
        // SAFETY: no arguments; NULL on failure.
        let raw = unsafe { sys::rdma_create_event_channel() };
        let raw = NonNull::new(raw).ok_or(CmError::Call {
            call: CmCall::CreateEventChannel,
            errno: errno(),
        })?;
        let ch = Self { raw };
        ffi::set_nonblocking(ch.fd()).map_err(|errno| CmError::Call {
            call: CmCall::CreateEventChannel,
            errno,
        })?;
        Ok(ch)
    }

    pub(crate) fn as_raw(&self) -> *mut sys::rdma_event_channel {
        self.raw.as_ptr()
    }

    /// The descriptor, readable when an event is waiting.
    pub(crate) fn fd(&self) -> core::ffi::c_int {
        // SAFETY: the channel is live; fd is set at creation.
        unsafe { (*self.raw.as_ptr()).fd }
    }

    /// The next event, if one is waiting; never blocks.
    pub(crate) fn try_next(&self) -> Result<Option<Event>, CmError> {
        let mut ev: *mut sys::rdma_cm_event = core::ptr::null_mut();
        // SAFETY: the channel is live; ev is a valid out-pointer.
        let rc = unsafe { sys::rdma_get_cm_event(self.as_raw(), &mut ev) };
        if rc != 0 {
            let e = errno();
            return if e == ffi::EAGAIN {
                Ok(None)
            } else {
                Err(CmError::Call {
                    call: CmCall::GetEvent,
                    errno: e,
                })
            };
        }
        // SAFETY: librdmacm returned a valid event, which we copy and then acknowledge
        // exactly once; nothing keeps a pointer into it.
        unsafe {
            let copy = Event::copy(&*ev);
            sys::rdma_ack_cm_event(ev);
            Ok(Some(copy))
        }
    }

    /// The next event, waiting until `deadline` at most (`Ok(None)` then).
    pub(crate) fn next(
        &self,
        deadline: Deadline,
        clock: &(dyn Clock + Sync),
    ) -> Result<Option<Event>, CmError> {
        loop {
            if let Some(e) = self.try_next()? {
                return Ok(Some(e));
            }
            let left = deadline.remaining(clock);
            if left.is_zero() {
                return Ok(None);
            }
            // Round up, so a wait never ends a little before the deadline and spins.
            let ms = left.as_nanos().div_ceil(1_000_000);
            let ms = core::ffi::c_int::try_from(ms).unwrap_or(core::ffi::c_int::MAX);
            ffi::wait_readable(self.fd(), ms).map_err(|errno| CmError::Call {
                call: CmCall::GetEvent,
                errno,
            })?;
        }
    }
}

impl Drop for EventChannel {
    fn drop(&mut self) {
        // SAFETY: created by rdma_create_event_channel and destroyed once, after every
        // identifier on it (their owners drop first).
        unsafe { sys::rdma_destroy_event_channel(self.raw.as_ptr()) }
    }
}

/// What an event said, copied before it was acknowledged.
pub(crate) struct Event {
    pub(crate) kind: CmEvent,
    pub(crate) status: i32,
    /// The identifier it is about (for a connection request: the new one, now ours).
    pub(crate) id: *mut sys::rdma_cm_id,
    /// The peer's private data (connection events).
    pub(crate) private: [u8; MAX_PRIVATE_DATA],
    pub(crate) private_len: usize,
    /// Connection events: the read/atomic depths the peer offers or accepted.
    pub(crate) responder_resources: u8,
    pub(crate) initiator_depth: u8,
    /// Multicast joins: the group's address attributes, QP number and Q_Key.
    pub(crate) ud: Option<(ibv_ah_attr, u32, u32)>,
}

impl Event {
    /// # Safety
    /// `ev` is an event librdmacm returned and that is not yet acknowledged.
    unsafe fn copy(ev: &sys::rdma_cm_event) -> Self {
        use sys::rdma_cm_event_type as t;
        let kind = CmEvent(ev.event);
        let mut out = Self {
            kind,
            status: ev.status,
            id: ev.id,
            private: [0; MAX_PRIVATE_DATA],
            private_len: 0,
            responder_resources: 0,
            initiator_depth: 0,
            ud: None,
        };
        match ev.event {
            t::RDMA_CM_EVENT_MULTICAST_JOIN => {
                // SAFETY: a join event carries the UD view of the parameter union.
                let ud = unsafe { ev.param.ud.as_ref() };
                out.ud = Some((ud.ah_attr, ud.qp_num, ud.qkey));
            }
            t::RDMA_CM_EVENT_CONNECT_REQUEST
            | t::RDMA_CM_EVENT_CONNECT_RESPONSE
            | t::RDMA_CM_EVENT_ESTABLISHED
            | t::RDMA_CM_EVENT_REJECTED => {
                // SAFETY: connection events carry the connection view of the union.
                let c = unsafe { ev.param.conn.as_ref() };
                out.responder_resources = c.responder_resources;
                out.initiator_depth = c.initiator_depth;
                let n = usize::from(c.private_data_len).min(MAX_PRIVATE_DATA);
                if n > 0 && !c.private_data.is_null() {
                    // SAFETY: librdmacm keeps private_data_len bytes there until the ack.
                    let src = unsafe { core::slice::from_raw_parts(c.private_data.cast(), n) };
                    out.private[..n].copy_from_slice(src);
                    out.private_len = n;
                }
            }
            _ => {}
        }
        out
    }

    /// The peer's private data.
    pub(crate) fn private_data(&self) -> &[u8] {
        &self.private[..self.private_len]
    }
}
