//! Messaging through one receive pool every peer shares ([`Receive::Shared`]): the pool's
//! slots are posted to the queue pairs' shared receive queue, a completion names the queue
//! pair it arrived on (and so the sender), and each slot goes back to the queue after its
//! handler returned. Credits, credit returns and the per-peer events are
//! [`messaging`](super::messaging)'s, shared with the per-peer rings.
//!
//! The pool cannot be drained: moving queue pairs to the error state flushes no receive of
//! a shared queue. Its memory is freed only once the queue is destroyed (the `Rings` drop
//! asks the queue's [`SrqProbe`], after the node's queue pairs are gone), and leaked if
//! anything keeps the queue alive.

use alloc::vec;
use alloc::vec::Vec;

#[cfg(doc)]
use super::messaging::Receive;
use super::messaging::{deliver, Event, Rings};
use super::{Node, NodeError, SetupError};
use crate::channel::{Channel, ChannelError, Done, WrFailure};
use crate::completion::{Completion, CompletionKind};
use crate::memory::Region;
use crate::memory::SrqProbe;
use crate::multi::MultiChannel;
use crate::poll::Backoff;
use crate::provider::shared::QpTable;
use crate::provider::Provider;
use crate::sge::Sge;
use crate::wr::{RecvRequest, MAX_BATCH};

/// Completions one poll of the pool takes at most.
const POOL_POLL: usize = 16;

/// One receive pool shared by every peer: slot `i` is bytes `i * slot_size..` of the region,
/// posted to the shared receive queue with `wr_id` `i`.
pub(super) struct Pool {
    /// Queue-pair number of each peer's channel -> its position.
    pub(super) peers: QpTable,
    /// Whether slot `i` is posted (a completion for a slot that is not is ignored).
    pub(super) posted: Vec<bool>,
    /// A slot handed to a handler and not yet re-posted.
    pub(super) repost: Option<usize>,
    /// Completions polled and not yet served, oldest first: kept here, not on the stack, so
    /// that a handler that panics (or a re-post that fails) half way through a poll's
    /// completions loses none of the rest; the next `progress` serves them.
    pub(super) pending: heapless::Deque<Completion, POOL_POLL>,
    /// Says when the shared queue is gone, after which the memory may be freed.
    pub(super) probe: SrqProbe,
}

/// The pool's low-water mark, as a fraction of its slots: `slots / POOL_LOW_WATER` posted
/// receives left.
const POOL_LOW_WATER: usize = 4;

impl<P: Provider, M: Region, B: Backoff + Clone> Node<P, M, B> {
    /// [`Node::start_messaging_in`] on a node whose queue pairs share a receive queue.
    pub(super) fn start_pool(
        &mut self,
        region: M,
        slots: usize,
        slot_size: usize,
    ) -> Result<(), SetupError> {
        let bad = |what| Err(SetupError::InvalidArgument { what });
        let peers = self.multi.peers();
        let depth = self.shared_receive_slots() as usize;
        if slots > depth {
            return bad("more pool slots than the shared receive queue holds");
        }
        if slots < peers.max(1) {
            return bad("a shared pool needs at least one slot per peer (world - 1)");
        }
        if slots
            .checked_mul(slot_size)
            .is_none_or(|l| l > region.len())
        {
            return bad("the pool region is smaller than slots * slot_size");
        }
        let mut table = QpTable::new(peers);
        let mut probe = None;
        for (p, (rank, c)) in self.multi.ranked().enumerate() {
            if let Some(error) = c.fault() {
                return Err(SetupError::Channel { rank, error });
            }
            if c.provider().srq_capacity() as usize != depth {
                return bad("every channel of a pooled node must be on the shared receive queue");
            }
            if !table.insert(c.provider().qp_num(), p as u32) {
                return bad("two channels with one queue-pair number");
            }
            probe = probe.or_else(|| c.provider().srq_probe());
        }
        let Some(probe) = probe else {
            return bad("the shared receive queue gives no way to know when it is gone");
        };
        let mut rings = Rings::new(
            &mut self.multi,
            region,
            (slots, slot_size, slots / peers.max(1)),
            Some(Pool {
                peers: table,
                posted: vec![false; slots],
                repost: None,
                pending: heapless::Deque::new(),
                probe,
            }),
            Vec::new(),
        );
        // A failed post leaves receives in the shared queue, which no flush takes back:
        // dropping `rings` then leaks the memory (its probe says the queue lives on).
        let mut first = 0;
        while first < slots {
            let n = (slots - first).min(MAX_BATCH);
            post_pool(&mut self.multi, &mut rings, first, n).map_err(SetupError::posting)?;
            first += n;
        }
        // A warning for the operator, where the device has one: once fewer than a quarter
        // of the pool's receives are posted, the receivers are falling behind their senders
        // (credits keep the pool from running dry, not from running low), and the device
        // raises `SrqLimitReached` on its event queue (a device watch logs it). Armed once:
        // the device disarms it when it fires. A device without the event changes nothing.
        let limit = u32::try_from(slots / POOL_LOW_WATER)
            .unwrap_or(u32::MAX)
            .max(1);
        if let Ok((_, c)) = pool_channel(&mut self.multi, &rings) {
            let _ = c.provider_mut().arm_srq_limit(limit);
        }
        self.rings = Some(rings);
        Ok(())
    }
}

/// The channel the pool is posted and polled through: the first one, if it is still the
/// channel messaging started with (a swapped-in channel may be on another shared queue).
fn pool_channel<'a, P: Provider, M, B: Backoff + Clone>(
    multi: &'a mut MultiChannel<P, B>,
    rings: &Rings<M>,
) -> Result<(u32, &'a mut Channel<P, B>), NodeError> {
    // A pooled node has at least one peer (`start_pool` refuses none): rank and channel id
    // of position 0 are there whenever rings are.
    let Some(&super::messaging::Peer {
        rank, chan_id: id, ..
    }) = rings.heads.peers.first()
    else {
        return Err(NodeError::InvalidArgument {
            what: "a pooled node without peers has no pool channel",
        });
    };
    match multi.by_index(0) {
        Some(c) if c.id() == id => Ok((rank, c)),
        _ => Err(NodeError::Channel {
            rank,
            error: ChannelError::Replaced,
        }),
    }
}

/// Posts pool slots `first..first + n` (at most [`MAX_BATCH`]) to the shared queue.
fn post_pool<P: Provider, M: Region, B: Backoff + Clone>(
    multi: &mut MultiChannel<P, B>,
    rings: &mut Rings<M>,
    first: usize,
    n: usize,
) -> Result<(), NodeError> {
    let size = rings.slot_size;
    let mut sges = [const { None::<Sge<'_>> }; MAX_BATCH];
    for (k, s) in sges.iter_mut().enumerate().take(n) {
        let at = (first + k) * size;
        let e = rings
            .region
            .sge_mut(at..at + size)
            .ok_or(NodeError::InvalidArgument {
                what: "pool slot outside the pool",
            })?;
        // SAFETY: the entry names slot `first + k` of the pool, which the node owns (see the
        // posting below); the slots are disjoint, and none of them is posted or lent out.
        *s = Some(unsafe { Sge::from_raw(e.addr(), e.len(), e.lkey()) });
    }
    let mut reqs = [const {
        RecvRequest {
            wr_id: 0,
            sges: &[],
        }
    }; MAX_BATCH];
    for (k, (r, s)) in reqs.iter_mut().zip(sges.iter()).enumerate().take(n) {
        *r = RecvRequest {
            wr_id: (first + k) as u64,
            sges: s.as_ref().map_or(&[], core::slice::from_ref),
        };
    }
    let (rank, chan) = pool_channel(multi, rings)?;
    // SAFETY: the pool memory is owned by the node and freed only once the shared queue is
    // gone (`Rings` drop asks its probe, and leaks it otherwise); each slot is read only
    // after its completion was polled, and re-posted after the handler's borrow ended.
    let r = unsafe { chan.provider_mut().post_srq_recv(&reqs[..n]) };
    let posted = match r {
        Ok(()) => n,
        Err(f) => f.posted.min(n),
    };
    if let Some(pool) = rings.pool.as_mut() {
        for k in 0..posted {
            pool.posted[first + k] = true;
        }
    }
    r.map_err(|f| NodeError::Channel {
        rank,
        error: ChannelError::Post { errno: f.errno },
    })
}

/// Polls the pool and hands up to `budget` of its messages out (re-posting each slot after
/// its handler); marks their senders for credit returns. Returns how many it handed.
pub(super) fn serve_pool<P: Provider, M: Region, B: Backoff + Clone>(
    multi: &mut MultiChannel<P, B>,
    rings: &mut Rings<M>,
    budget: usize,
    handler: &mut impl FnMut(Event<'_>),
) -> Result<usize, NodeError> {
    if let Some(i) = rings.pool.as_mut().and_then(|p| p.repost.take()) {
        if let Err(e) = post_pool(multi, rings, i, 1) {
            if let Some(pool) = rings.pool.as_mut() {
                // Not lost: the next call tries again.
                pool.repost = Some(i);
            }
            return Err(e);
        }
    }
    let mut handed = 0;
    while handed < budget {
        let Some(c) = next_pool_completion(multi, rings, budget - handed)? else {
            break;
        };
        handed += serve_pool_completion(multi, rings, &c, handler)?;
    }
    Ok(handed)
}

/// The oldest completion of the pool not yet served: one left from an earlier poll, else
/// one of a new poll of up to `want` (at most [`POOL_POLL`]), whose others wait in the
/// pool's `pending` queue.
fn next_pool_completion<P: Provider, M: Region, B: Backoff + Clone>(
    multi: &mut MultiChannel<P, B>,
    rings: &mut Rings<M>,
    want: usize,
) -> Result<Option<Completion>, NodeError> {
    let Some(pool) = rings.pool.as_mut() else {
        return Ok(None);
    };
    if let Some(c) = pool.pending.pop_front() {
        return Ok(Some(c));
    }
    let mut wc = [Completion::EMPTY; POOL_POLL];
    let want = want.min(POOL_POLL);
    let (_, chan) = pool_channel(multi, rings)?;
    let n = chan
        .provider_mut()
        .poll_srq(&mut wc[..want])
        .map_err(NodeError::Completions)?;
    let Some(pool) = rings.pool.as_mut() else {
        return Ok(None);
    };
    for c in wc.iter().take(n).skip(1) {
        // Room for all: the queue is empty here and holds a whole poll.
        let _ = pool.pending.push_back(*c);
    }
    Ok((n > 0).then_some(wc[0]))
}

/// Hands out one completion of the pool; returns how many events it handed (0 or 1).
fn serve_pool_completion<P: Provider, M: Region, B: Backoff + Clone>(
    multi: &mut MultiChannel<P, B>,
    rings: &mut Rings<M>,
    c: &Completion,
    handler: &mut impl FnMut(Event<'_>),
) -> Result<usize, NodeError> {
    let Some(pool) = rings.pool.as_mut() else {
        return Ok(0);
    };
    let i = c.wr_id as usize;
    if i >= pool.posted.len() || !pool.posted[i] {
        // Not a receive of ours (or one already handed out): never trusted.
        return Ok(0);
    }
    // The slot leaves the pool before the handler runs, so a panicking handler neither sees
    // it twice nor loses it: `repost` brings it back.
    pool.posted[i] = false;
    pool.repost = Some(i);
    let p = pool.peers.get(c.qp_num).map(|p| p as usize);
    let mut handed = 0;
    let sent = p
        .and_then(|p| multi.by_index(p))
        .map_or(0, |c| c.remote_recvs_used());
    match p {
        Some(p) if c.status.is_success() => {
            rings.heads.peers[p].consumed += 1;
            let info = Done {
                byte_len: c.byte_len,
                imm: c.imm,
                written: c.kind == CompletionKind::RecvWriteImm,
            };
            deliver(rings, (p, sent), i, info, handler);
            handed = 1;
            rings.push_todo(p);
        }
        // A receive the queue pair's failure cut short: the slot is free again, and the
        // peer is reported broken once.
        Some(p) if !rings.heads.peers[p].failure_reported => {
            rings.heads.peers[p].failure_reported = true;
            let rank = rings.heads.peers[p].rank;
            handler(Event::Failed {
                rank,
                error: ChannelError::Broken(WrFailure {
                    rank: Some(rank),
                    wr_id: c.wr_id,
                    status: c.status,
                    vendor_err: c.vendor_err,
                }),
            });
            handed = 1;
        }
        Some(_) | None => {}
    }
    // On failure `repost` keeps the slot for the next call.
    post_pool(multi, rings, i, 1)?;
    if let Some(pool) = rings.pool.as_mut() {
        pool.repost = None;
    }
    Ok(handed)
}
