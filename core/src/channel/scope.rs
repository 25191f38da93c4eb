//! Scoped posting: post now, wait later, and never hand a buffer back early.

use core::fmt;
use core::marker::PhantomData;

use super::wait::SettleOnDrop;
use super::{as_gather, Batch, Channel, ChannelError, Done, Ticket};
use crate::poll::Backoff;
use crate::provider::Provider;
use crate::sge::{RemoteMemory, Sge, SgeMut};
use crate::wr::{Opcode, SendFlags, WorkRequest};

/// Posting inside [`Channel::scope`]. Buffers are borrowed for `'env`, which outlives the
/// scope, so the memory they point into stays untouchable until the scope has polled
/// everything it posted:
///
/// ```compile_fail
/// # use rverbs_core::channel::Channel;
/// # use rverbs_core::model::{SoftEnd, SoftRegion};
/// # use rverbs_core::sge::RemoteMemory;
/// fn f(chan: &mut Channel<SoftEnd<'_>>, mr: &mut SoftRegion<'_>, remote: RemoteMemory) {
///     let sges = [mr.sge(0..8).unwrap()];
///     chan.scope(|s| {
///         let p = s.write(&sges, remote).unwrap();
///         let _ = mr.sge_mut(0..8); // error: `mr` is still borrowed by `sges`
///         s.wait(p).unwrap();
///     })
///     .unwrap();
/// }
/// ```
///
/// A buffer made inside the scope's closure cannot be posted: it does not live for `'env`,
/// which outlives the whole call to [`Channel::scope`].
///
/// ```compile_fail,E0597
/// # use rverbs_core::channel::Channel;
/// # use rverbs_core::model::{SoftEnd, SoftRegion};
/// fn f(chan: &mut Channel<SoftEnd<'_>>, mr: &mut SoftRegion<'_>) {
///     chan.scope(|s| {
///         let mut inner = [mr.sge_mut(0..8).unwrap()];
///         let _p = s.recv(&mut inner).unwrap(); // error: `inner` does not live long enough
///     })
///     .unwrap();
/// }
/// ```
pub struct Scope<'s, 'env, P: Provider, B: Backoff, const R: usize> {
    chan: &'s mut Channel<P, B, R>,
    // Invariant in 'env, and without an implied `'env: 's`: rustc before 1.94 could not use
    // that bound inside the `for<'s>` closure and refused ordinary scoped receives (the
    // declared MSRV, 1.88, is checked in CI). 'env is a lifetime parameter of `scope`, so it
    // outlives the call whatever the bound says.
    _env: PhantomData<(&'s mut (), Invariant<'env>)>,
}

/// A marker invariant in `'a` that implies no bound on any other lifetime.
type Invariant<'a> = fn(&'a ()) -> &'a ();

impl<P: Provider, B: Backoff, const R: usize> fmt::Debug for Scope<'_, '_, P, B, R> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Scope")
            .field("outstanding_sends", &self.chan.outstanding_sends())
            .field("outstanding_recvs", &self.chan.outstanding_recvs())
            .finish()
    }
}

impl<P: Provider, B: Backoff, const R: usize> Channel<P, B, R> {
    /// Runs `f` with a [`Scope`] for posting requests whose buffers live at least as long as
    /// the call, then polls until everything posted in it completed (also if `f` panics).
    /// Returns `f`'s result, or the first failure of the scope's requests. Does not allocate.
    ///
    /// A scope waits for every receive it posted: post receives in a scope only when the
    /// peer will send.
    pub fn scope<'env, T, F>(&mut self, f: F) -> Result<T, ChannelError>
    where
        F: for<'s> FnOnce(&mut Scope<'s, 'env, P, B, R>) -> T,
    {
        let already_broken = self.broken;
        let recv_start = self.recv_next;
        // Settles the channel if the closure panics: nothing the scope posted may outlive the
        // borrows it held.
        let guard = SettleOnDrop(self);
        let mut scope = Scope {
            chan: &mut *guard.0,
            _env: PhantomData,
        };
        let out = f(&mut scope);
        let chan = &mut *guard.0;
        // Exactly what the scope posted: every send so far (sends complete in order, so the
        // earlier ones come with them) and the receives posted in the scope, but not
        // receives posted before it (a receive ring's), which wait for their messages.
        let (send_end, recv_end) = (chan.next_seq, chan.recv_next);
        // Bounded by the channel's timeout, and drained before it returns an error (as a
        // failed cover's post is), so the guard below has nothing left to do on this path.
        let r = chan.cover_all().and_then(|()| {
            chan.poll_until(
                |c| c.done_seq >= send_end && (recv_end == recv_start || c.recv_done >= recv_end),
                None,
            )
        });
        chan.release_recv_results(recv_start..recv_end);
        // Nothing of the scope's is in flight any more (or it was drained): the guard is
        // only for unwinding, and would flush receives posted before the scope.
        core::mem::forget(guard);
        r?;
        if self.broken != already_broken {
            if let Some(e) = self.fault() {
                return Err(e);
            }
        }
        Ok(out)
    }
}

impl<'env, P: Provider, B: Backoff, const R: usize> Scope<'_, 'env, P, B, R> {
    fn one(
        &mut self,
        opcode: Opcode,
        sges: &'env [Sge<'env>],
        remote: RemoteMemory,
    ) -> Result<Ticket, ChannelError> {
        self.post(WorkRequest::new(opcode, SendFlags::empty(), sges, remote))
    }

    /// Posts `wr`, whose buffers are borrowed for the scope's environment.
    pub(super) fn post(&mut self, wr: WorkRequest<'env>) -> Result<Ticket, ChannelError> {
        // SAFETY: the buffers are borrowed for 'env, which outlives the scope, and the scope
        // polls this request to completion before it returns.
        unsafe { self.chan.post_wr(wr) }
    }

    /// Posts a send.
    pub fn send(&mut self, sges: &'env [Sge<'env>]) -> Result<Ticket, ChannelError> {
        self.one(Opcode::Send, sges, RemoteMemory::default())
    }

    /// Posts a send with immediate.
    pub fn send_imm(&mut self, sges: &'env [Sge<'env>], imm: u32) -> Result<Ticket, ChannelError> {
        self.one(Opcode::SendImm(imm), sges, RemoteMemory::default())
    }

    /// Posts an inline send of `data` (copied during the post).
    pub fn send_inline(&mut self, data: &[u8]) -> Result<Ticket, ChannelError> {
        self.chan.post_send_inline(data)
    }

    /// Posts an RDMA write.
    pub fn write(
        &mut self,
        sges: &'env [Sge<'env>],
        remote: RemoteMemory,
    ) -> Result<Ticket, ChannelError> {
        self.one(Opcode::Write, sges, remote)
    }

    /// Posts an inline RDMA write of `data` (copied during the post).
    pub fn write_inline(
        &mut self,
        data: &[u8],
        remote: RemoteMemory,
    ) -> Result<Ticket, ChannelError> {
        self.chan.post_write_inline(data, remote)
    }

    /// Posts an RDMA write with immediate.
    pub fn write_imm(
        &mut self,
        sges: &'env [Sge<'env>],
        remote: RemoteMemory,
        imm: u32,
    ) -> Result<Ticket, ChannelError> {
        self.one(Opcode::WriteImm(imm), sges, remote)
    }

    /// Posts an RDMA read.
    pub fn read(
        &mut self,
        sges: &'env mut [SgeMut<'env>],
        remote: RemoteMemory,
    ) -> Result<Ticket, ChannelError> {
        self.one(Opcode::Read, as_gather(sges), remote)
    }

    /// Posts a receive. The scope's end waits for it, at most the channel's timeout.
    pub fn recv(&mut self, sges: &'env mut [SgeMut<'env>]) -> Result<Ticket, ChannelError> {
        // SAFETY: as in `one`: 'env outlives the scope, which polls the receive.
        unsafe { self.chan.post_recv(sges) }
    }

    /// Posts a batch built by `build` with one doorbell. Fails with
    /// [`ChannelError::Replaced`], posting nothing, if `build` put a batch of another channel
    /// in the place of the scope's (`mem::swap`).
    pub fn batch<E>(
        &mut self,
        build: impl FnOnce(&mut Batch<'_, 'env, P, B, R>) -> Result<(), E>,
    ) -> Result<Option<Ticket>, E>
    where
        E: From<ChannelError>,
    {
        let own = self.chan.id;
        let mut b = Batch::new(self.chan);
        build(&mut b)?;
        // The borrow checker lets `build` swap in a batch of another channel (one borrowed
        // for longer than this call: a leaked one). This scope waits for its own channel
        // alone, so it must not post that batch; dropped here, it posts nothing.
        if b.channel_id() != own {
            return Err(ChannelError::Replaced.into());
        }
        // SAFETY: the batch's buffers are borrowed for 'env, and the scope polls them.
        Ok(unsafe { b.post() }?)
    }

    /// Waits for `t` (at most the channel's timeout) and returns what it delivered. Does not
    /// allocate.
    pub fn wait(&mut self, t: Ticket) -> Result<Done, ChannelError> {
        self.chan.wait(t)
    }

    /// Whether `t` completed (polls once).
    pub fn is_done(&mut self, t: Ticket) -> Result<bool, ChannelError> {
        self.chan.poll()?;
        Ok(self.chan.is_complete(t))
    }

    /// Polls once.
    pub fn poll(&mut self) -> Result<usize, ChannelError> {
        self.chan.poll()
    }
}
