//! [`MultiChannel`]: one [`Channel`] per peer, addressed by peer index.
//!
//! Every peer has its own RC queue pair and completion queues (all on one protection
//! domain); waiting polls only the channels an operation used. Multi-peer operations post to
//! every peer first, then wait, so the transfers overlap. Nothing allocates after
//! construction: operations take iterators and fixed slices, and report the first failure
//! with the peer it happened on.
//!
//! Every multi-peer call waits at most each channel's timeout, and settles every channel it
//! posted on before it returns, on every path: an error, or a panic in the caller's
//! iterator or callback (then the channels with work in flight are flushed at once, so no
//! buffer borrowed by the call outlives the device's use of it).

use alloc::vec::Vec;
use core::fmt;

use crate::channel::{Batch, Channel, ChannelError, RecvInfo};
use crate::poll::Backoff;
use crate::provider::Provider;
use crate::sge::{RemoteMemory, Sge, SgeMut};

/// A channel operation that failed on one peer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PeerError {
    /// The peer index.
    pub peer: usize,
    /// What failed.
    pub error: ChannelError,
}

impl fmt::Display for PeerError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "peer {}: {}", self.peer, self.error)
    }
}

impl core::error::Error for PeerError {}

/// Errors of multi-peer operations.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum MultiError {
    /// No such peer index.
    NoSuchPeer(usize),
    /// An operation failed on a peer.
    Peer(PeerError),
}

impl fmt::Display for MultiError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::NoSuchPeer(p) => write!(f, "no peer with index {p}"),
            Self::Peer(e) => write!(f, "{e}"),
        }
    }
}

impl core::error::Error for MultiError {}

/// One channel per peer. See the [module docs](self).
pub struct MultiChannel<P: Provider, B: Backoff + Clone, const R: usize = 64> {
    chans: Vec<Channel<P, B, R>>,
}

impl<P: Provider, B: Backoff + Clone, const R: usize> fmt::Debug for MultiChannel<P, B, R> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MultiChannel")
            .field("peers", &self.chans.len())
            .finish()
    }
}

fn at(peer: usize) -> impl Fn(ChannelError) -> MultiError {
    move |error| MultiError::Peer(PeerError { peer, error })
}

impl<P: Provider, B: Backoff + Clone, const R: usize> MultiChannel<P, B, R> {
    /// Wraps connected channels; index `i` of `chans` is peer `i`.
    pub fn new(chans: Vec<Channel<P, B, R>>) -> Self {
        Self { chans }
    }

    /// Number of peers.
    #[inline]
    pub fn peers(&self) -> usize {
        self.chans.len()
    }

    /// The channel to `peer`.
    #[inline]
    pub fn channel(&mut self, peer: usize) -> Result<&mut Channel<P, B, R>, MultiError> {
        self.chans.get_mut(peer).ok_or(MultiError::NoSuchPeer(peer))
    }

    /// Polls every channel once; returns the completions seen. Does not allocate.
    pub fn poll(&mut self) -> Result<usize, MultiError> {
        let mut n = 0;
        for (i, c) in self.chans.iter_mut().enumerate() {
            n += c.poll().map_err(at(i))?;
        }
        Ok(n)
    }

    /// Sends to one peer. Does not allocate.
    pub fn send(&mut self, peer: usize, sges: &[Sge<'_>]) -> Result<(), MultiError> {
        self.channel(peer)?.send(sges).map_err(at(peer))
    }

    /// Receives from one peer. Does not allocate.
    pub fn recv(&mut self, peer: usize, sges: &mut [SgeMut<'_>]) -> Result<RecvInfo, MultiError> {
        self.channel(peer)?.recv(sges).map_err(at(peer))
    }

    /// Writes to one peer's memory. Does not allocate.
    pub fn write(
        &mut self,
        peer: usize,
        sges: &[Sge<'_>],
        remote: RemoteMemory,
    ) -> Result<(), MultiError> {
        self.channel(peer)?.write(sges, remote).map_err(at(peer))
    }

    /// Reads one peer's memory. Does not allocate.
    pub fn read(
        &mut self,
        peer: usize,
        sges: &mut [SgeMut<'_>],
        remote: RemoteMemory,
    ) -> Result<(), MultiError> {
        self.channel(peer)?.read(sges, remote).map_err(at(peer))
    }

    /// Posts one request per item to the item's peer (each its own doorbell), then waits for
    /// every channel that has work in flight, also when a post failed half way: no buffer is
    /// handed back while the device may still use it.
    fn post_each_then_wait<'a, T, I>(
        &mut self,
        ops: I,
        mut add: impl FnMut(&mut Batch<'_, 'a, P, B, R>, T) -> Result<(), ChannelError>,
    ) -> Result<(), MultiError>
    where
        I: IntoIterator<Item = (usize, T)>,
    {
        let mut guard = Settle::new(&mut self.chans);
        let mut first = None;
        for (peer, item) in ops {
            let r = match guard.chans.get_mut(peer) {
                None => Err(MultiError::NoSuchPeer(peer)),
                Some(c) => {
                    let mut b = c.batch();
                    add(&mut b, item)
                        // SAFETY: the items' buffers are borrowed for 'a, beyond this call,
                        // and the guard settles every channel before the call returns or
                        // unwinds.
                        .and_then(|()| unsafe { b.submit() }.map(|_| ()))
                        .map_err(at(peer))
                }
            };
            if let Err(e) = r {
                first = Some(e);
                break;
            }
        }
        let waited = guard.wait_all();
        first.map_or(waited, Err)
    }

    /// Writes each `(peer, sges, remote)` (one doorbell per request), then waits for all.
    /// Does not allocate.
    pub fn scatter_write<'a, I>(&mut self, ops: I) -> Result<(), MultiError>
    where
        I: IntoIterator<Item = (usize, &'a [Sge<'a>], RemoteMemory)>,
    {
        self.post_each_then_wait(ops.into_iter().map(|(p, s, r)| (p, (s, r))), |b, (s, r)| {
            b.write(s, r).map(|_| ())
        })
    }

    /// Sends each `(peer, sges)`, then waits for all. Does not allocate.
    pub fn scatter_send<'a, I>(&mut self, ops: I) -> Result<(), MultiError>
    where
        I: IntoIterator<Item = (usize, &'a [Sge<'a>])>,
    {
        self.post_each_then_wait(ops, |b, s| b.send(s).map(|_| ()))
    }

    /// Sends the same `sges` to every peer in `peers`, then waits. Does not allocate.
    pub fn multicast_send<'a, I>(&mut self, peers: I, sges: &'a [Sge<'a>]) -> Result<(), MultiError>
    where
        I: IntoIterator<Item = usize>,
    {
        self.post_each_then_wait(peers.into_iter().map(|p| (p, ())), |b, ()| {
            b.send(sges).map(|_| ())
        })
    }

    /// Reads each `(peer, sges, remote)` into local memory, then waits for all.
    /// Does not allocate.
    pub fn gather_read<'a, I>(&mut self, ops: I) -> Result<(), MultiError>
    where
        I: IntoIterator<Item = (usize, &'a mut [SgeMut<'a>], RemoteMemory)>,
    {
        self.post_each_then_wait(ops.into_iter().map(|(p, s, r)| (p, (s, r))), |b, (s, r)| {
            b.read(s, r).map(|_| ())
        })
    }

    /// Posts a receive for each `(peer, sges)` and waits until all arrived; `on_recv` sees
    /// each peer's [`RecvInfo`] in peer order. Does not allocate.
    pub fn gather_receive<'a, I>(
        &mut self,
        ops: I,
        mut on_recv: impl FnMut(usize, RecvInfo),
    ) -> Result<(), MultiError>
    where
        I: IntoIterator<Item = (usize, &'a mut [SgeMut<'a>])>,
    {
        let mut guard = Settle::new(&mut self.chans);
        let mut first = None;
        for (peer, sges) in ops {
            let r = match guard.chans.get_mut(peer) {
                None => Err(MultiError::NoSuchPeer(peer)),
                // SAFETY: 'a outlives this call, and the guard settles every channel before
                // the call returns or unwinds.
                Some(c) => unsafe { c.post_recv_unpolled(sges) }
                    .map(|_| ())
                    .map_err(at(peer)),
            };
            if let Err(e) = r {
                first = Some(e);
                break;
            }
        }
        for (i, c) in guard.chans.iter_mut().enumerate() {
            let Some(t) = c.last_pending_recv() else {
                continue;
            };
            // Bounded by the channel's timeout; on error the channel is already drained.
            match c.wait_recv(t) {
                Ok(info) => on_recv(i, info),
                Err(e) => {
                    first.get_or_insert(MultiError::Peer(PeerError { peer: i, error: e }));
                }
            }
        }
        let waited = guard.wait_all();
        first.map_or(waited, Err)
    }
}

/// Settles every channel a multi-peer call posted on, whichever way the call ends. Until
/// [`Settle::wait_all`] runs, the call may still unwind (the caller's iterator or callback
/// panicked): then dropping the guard flushes the channels with work in flight at once.
struct Settle<'m, P: Provider, B: Backoff + Clone, const R: usize> {
    chans: &'m mut [Channel<P, B, R>],
    unwinding: bool,
}

impl<'m, P: Provider, B: Backoff + Clone, const R: usize> Settle<'m, P, B, R> {
    fn new(chans: &'m mut [Channel<P, B, R>]) -> Self {
        Self {
            chans,
            unwinding: true,
        }
    }

    /// The normal exit: waits (at most each channel's timeout) for everything outstanding on
    /// every channel with work in flight, and reports the first failure.
    fn wait_all(&mut self) -> Result<(), MultiError> {
        self.unwinding = false;
        let mut first = None;
        for (i, c) in self.chans.iter_mut().enumerate() {
            if c.outstanding_sends() > 0 || c.outstanding_recvs() > 0 {
                if let Err(e) = c.wait_all() {
                    first.get_or_insert(MultiError::Peer(PeerError { peer: i, error: e }));
                }
            }
        }
        first.map_or(Ok(()), Err)
    }
}

impl<P: Provider, B: Backoff + Clone, const R: usize> Drop for Settle<'_, P, B, R> {
    fn drop(&mut self) {
        for c in self.chans.iter_mut() {
            c.settle(self.unwinding);
        }
    }
}
