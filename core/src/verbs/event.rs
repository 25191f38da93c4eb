//! Completion channels: completion queues that raise an event a sleeping thread can wait
//! for (`ibv_create_comp_channel`, `ibv_req_notify_cq`, `ibv_get_cq_event`,
//! `ibv_ack_cq_events`).
//!
//! The cycle, as the verbs man pages require it:
//! 1. arm every queue the waiter depends on ([`CqEvents::arm`], `ibv_req_notify_cq`);
//! 2. poll the queues once more: a completion that arrived before the arm raised no event;
//! 3. sleep until the channel's descriptor ([`CompletionChannel::fd`]) is readable or the
//!    deadline passes (std code: `rverbs_std_shim::WaitPolicy::Block`);
//! 4. take the events ([`CqEvents::take_events`]): each one disarms its queue, and all of
//!    them are acknowledged in one batch per queue before the call returns. A sleep that no
//!    event ended re-arms every queue next time ([`CqEvents::forget_armed`]), so one lost
//!    event costs one sleep, not every later one.
//!
//! Core never blocks: the descriptor is non-blocking, and sleeping on it is the caller's
//! (`poll(2)`, `epoll`, or an event loop). Every event read is acknowledged before
//! `take_events` returns, so destroying a queue (which waits for its acknowledgements)
//! never waits on rverbs.

use alloc::sync::Arc;
use alloc::vec::Vec;
use core::ffi::{c_int, c_void};
use core::fmt;
use core::ptr::NonNull;
use core::sync::atomic::{AtomicBool, Ordering};

use super::cq::{Cq, CqInner};
use super::destroy::Owned;
use super::device::Context;
use super::error::{Result, Verb, VerbsError};
use super::ffi::{self, errno, sys};
use crate::poll::Wakeup;
use crate::verb::ProviderError;

pub(crate) struct ChannelInner {
    // Field order is drop order: the channel is destroyed before its context is released.
    pub(crate) raw: Owned<sys::ibv_comp_channel>,
    _ctx: Context,
}

/// A completion channel: completion queues created on it ([`Context::create_cq_on`]) raise
/// an event on its file descriptor after they are armed and a completion arrives.
#[derive(Clone)]
pub struct CompletionChannel {
    pub(super) inner: Arc<ChannelInner>,
}

impl fmt::Debug for CompletionChannel {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CompletionChannel")
            .field("fd", &self.fd())
            .finish()
    }
}

impl Context {
    /// Creates a completion channel with a non-blocking descriptor.
    pub fn create_completion_channel(&self) -> Result<CompletionChannel> {
        // SAFETY: the context is open. Every CQ created on the channel holds an Arc to the
        // `ChannelInner` that owns it, so none is alive when it is destroyed.
        let raw = unsafe {
            Owned::create(
                sys::ibv_create_comp_channel(self.as_raw()),
                Verb::CreateCompChannel,
            )
        }?;
        // SAFETY: raw is a live channel; fd is its descriptor.
        let fd = unsafe { (*raw.as_ptr()).fd };
        let inner = Arc::new(ChannelInner {
            raw,
            _ctx: self.clone(),
        });
        // Non-blocking, so `take_events` returns when the events are gone instead of waiting
        // for the next one: sleeping is the caller's choice, with its own deadline.
        ffi::set_nonblocking(fd).map_err(|errno| VerbsError::Call {
            verb: Verb::CreateCompChannel,
            errno,
        })?;
        Ok(CompletionChannel { inner })
    }

    /// Creates a completion queue with room for at least `min_entries` completions that
    /// raises its events on `channel` (see [`CqEvents`]).
    pub fn create_cq_on(&self, min_entries: u32, channel: &CompletionChannel) -> Result<Cq> {
        self.create_cq_with(min_entries, Some(channel.inner.clone()))
    }
}

impl CompletionChannel {
    /// The descriptor that becomes readable when an armed queue has a completion; for
    /// `poll(2)`/`epoll`. Non-blocking; owned by the channel (do not close it).
    pub fn fd(&self) -> c_int {
        // SAFETY: the channel is live while self is.
        unsafe { (*self.inner.raw.as_ptr()).fd }
    }

    pub(crate) fn from_inner(inner: Arc<ChannelInner>) -> Self {
        Self { inner }
    }

    pub(crate) fn raw(&self) -> *mut sys::ibv_comp_channel {
        self.inner.raw.as_ptr()
    }

    pub(crate) fn inner_raw(&self) -> NonNull<sys::ibv_comp_channel> {
        self.inner.raw.get()
    }
}

/// A queue a [`CqEvents`] arms, kept alive by it. Its armed flag lives with the queue, so
/// every `CqEvents` over it (and every reader of the channel) agrees on it.
struct Armed {
    cq: Arc<CqInner>,
}

/// The completion queues one waiter depends on, with the channel they raise events on: the
/// [`Wakeup`] a blocking back-off sleeps on.
///
/// Holds the queues alive (not their polling: the owner of each [`Cq`] still polls it).
/// `Send + Sync`, so the clones of a node's back-off share it.
pub struct CqEvents {
    channel: CompletionChannel,
    cqs: Vec<Armed>,
    solicited_only: bool,
}

impl fmt::Debug for CqEvents {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CqEvents")
            .field("fd", &self.channel.fd())
            .field("queues", &self.cqs.len())
            .field("solicited_only", &self.solicited_only)
            .finish()
    }
}

/// Distinct queues whose events one `take_events` call acknowledges in one batch each
/// (a further queue is acknowledged event by event).
const ACK_BATCHES: usize = 4;

impl CqEvents {
    /// Events of `cqs`, which must all have been created on `channel`
    /// ([`VerbsError::InvalidArgument`] otherwise). With `solicited_only`, only a receive
    /// the sender marked solicited (`IBV_SEND_SOLICITED`) and an error completion raise an
    /// event (`ibv_req_notify_cq(3)`): a successful send completion raises none, so a waiter
    /// for send completions must not sleep on a queue armed that way (it would sleep to its
    /// limit). Allocates (setup).
    pub fn new(channel: &CompletionChannel, cqs: &[&Cq], solicited_only: bool) -> Result<Self> {
        let mut list = Vec::with_capacity(cqs.len());
        for cq in cqs {
            if !cq.is_on(channel) {
                return Err(VerbsError::InvalidArgument {
                    what: "a completion queue was not created on this completion channel",
                });
            }
            list.push(Armed {
                cq: cq.keep_alive(),
            });
        }
        Ok(Self {
            channel: channel.clone(),
            cqs: list,
            solicited_only,
        })
    }

    /// The channel's descriptor.
    pub fn fd(&self) -> c_int {
        self.channel.fd()
    }

    /// Arms every queue that is not armed yet; `Ok(true)` if it armed one, and then the
    /// caller must poll once more before it sleeps. Does not allocate.
    pub fn arm(&self) -> Result<bool> {
        let mut newly = false;
        for a in &self.cqs {
            if a.cq.armed.load(Ordering::Acquire) {
                continue;
            }
            // SAFETY: the CQ is alive (held by `a.cq`).
            let rc = unsafe { ffi::req_notify_cq(a.cq.raw.as_ptr(), self.solicited_only) };
            if rc != 0 {
                return Err(VerbsError::Call {
                    verb: Verb::ReqNotifyCq,
                    errno: rc,
                });
            }
            a.cq.armed.store(true, Ordering::Release);
            newly = true;
        }
        Ok(newly)
    }

    /// Forgets which queues are armed: the next [`arm`](Self::arm) arms every queue again
    /// (on an armed queue, `ibv_req_notify_cq` changes nothing). For a waiter whose sleep no
    /// event ended: a queue whose event was lost (the kernel drops an event it cannot
    /// allocate) would otherwise stay unarmed for good. Does not allocate.
    pub fn forget_armed(&self) {
        for a in &self.cqs {
            a.cq.armed.store(false, Ordering::Release);
        }
    }

    /// Reads every pending event without blocking, disarms the queues that raised them, and
    /// acknowledges all of them (in one batch per queue) before returning. Returns how many
    /// it read. Does not allocate.
    pub fn take_events(&self) -> Result<u32> {
        let mut batches: heapless::Vec<(*mut sys::ibv_cq, u32), ACK_BATCHES> = heapless::Vec::new();
        let mut total = 0u32;
        let result = loop {
            let mut cq: *mut sys::ibv_cq = core::ptr::null_mut();
            let mut ctx: *mut c_void = core::ptr::null_mut();
            // SAFETY: the channel is live; the out-pointers are valid locals.
            let rc = unsafe { sys::ibv_get_cq_event(self.channel.raw(), &mut cq, &mut ctx) };
            if rc != 0 {
                let e = errno();
                break if e == ffi::EAGAIN { Ok(total) } else { Err(e) };
            }
            total += 1;
            // Every queue on one of our channels was made by `create_cq_with`, whose
            // `cq_context` points at its armed flag.
            if let Some(flag) = NonNull::new(ctx.cast::<AtomicBool>()) {
                // SAFETY: the flag outlives the queue, and the queue cannot be destroyed
                // before this event is acknowledged (below), so the flag is alive; it is only
                // ever accessed through shared references.
                unsafe { flag.as_ref() }.store(false, Ordering::Release);
            }
            match batches.iter_mut().find(|(c, _)| *c == cq) {
                Some((_, n)) => *n += 1,
                None => {
                    if batches.push((cq, 1)).is_err() {
                        // SAFETY: cq raised an event that is not yet acknowledged, so it is
                        // alive (destroying it waits for this acknowledgement).
                        unsafe { sys::ibv_ack_cq_events(cq, 1) };
                    }
                }
            }
        };
        for (cq, n) in batches {
            // SAFETY: as above: every one of these events is still unacknowledged.
            unsafe { sys::ibv_ack_cq_events(cq, n) };
        }
        result.map_err(|errno| VerbsError::Call {
            verb: Verb::GetCqEvent,
            errno,
        })
    }
}

// SAFETY: the descriptor is the completion channel's, which this value keeps open (the
// channel is destroyed only after its last holder is gone).
unsafe impl Wakeup for CqEvents {
    fn arm(&self) -> core::result::Result<bool, ProviderError> {
        CqEvents::arm(self).map_err(|e| e.provider_error(Verb::ReqNotifyCq))
    }

    fn fd(&self) -> i32 {
        CqEvents::fd(self)
    }

    fn take_events(&self) -> core::result::Result<u32, ProviderError> {
        CqEvents::take_events(self).map_err(|e| e.provider_error(Verb::GetCqEvent))
    }

    fn forget_armed(&self) {
        CqEvents::forget_armed(self);
    }
}
