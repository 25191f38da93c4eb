//! Datagram (UD) queue pairs of a net: unicast and multicast, executed inside the calls.
//!
//! [`SoftNet::create_datagram`] gives a node a datagram queue pair with its own send and
//! receive completion queues ([`NetDatagram`], a [`DatagramProvider`]); any number per
//! node. Nodes have GIDs (`::ffff:10.a.b.c`, from the node number: [`SoftNet::gid`]) and
//! LIDs (the node number plus one; none, 0, for nodes past the unicast LIDs), so addresses
//! are made as on a device. Dropping a [`NetDatagram`] destroys its queue pair as a device
//! does: it leaves every group, and datagrams to it are dropped.
//!
//! # Semantics
//! - **Sends execute inside [`DatagramProvider::post_send`]**: the payload (inline bytes
//!   copied at post, or entries resolved by lkey on the sending node) is delivered to every
//!   destination queue pair before the post returns, and the send completes successfully
//!   (if signaled) whether anybody received it or not: UD has no acknowledgements. A send
//!   with more than the caps' entries, an inline payload over `max_inline_data`, or a
//!   payload over the MTU the queue pair was made with is refused at post (`EINVAL`); one
//!   whose entries do not resolve completes with [`WcStatus::LocalProtection`] and moves the
//!   sender to the error state. Count as in the RC model: a send holds its slot until a
//!   completion at or past it has been polled.
//! - **Delivery to a queue pair** happens only if it exists on the node the address names,
//!   is not in the error state, its node is alive, the Q_Key matches and a receive is
//!   posted; otherwise the datagram is dropped silently (counted in the receiving node's
//!   [`SoftStats::datagrams_dropped`](super::super::SoftStats)). The oldest receive takes it:
//!   the 40-byte network header ([`crate::wire::grh`]: the IPv4 form, as SoftRoCE writes it,
//!   when both GIDs are IPv4-mapped, else the IPv6 form), then the payload. Its completion
//!   has `byte_len` = 40 + payload, the sender's queue pair number, and the immediate. A
//!   receive shorter than that completes with [`WcStatus::LocalLength`], one whose entries do
//!   not resolve with [`WcStatus::LocalProtection`] (that one also moves the receiver to the
//!   error state).
//! - **Multicast**: a send to a group address ([`NetAddress::Group`], queue pair number
//!   `0xFF_FFFF`; any other number drops it) is delivered, by the rule above, to every
//!   queue pair that joined the group, in joining order, the sender included if it joined.
//!   One post, one send completion, however many members.
//! - **Error state** ([`DatagramProvider::set_error`], [`SoftNet::kill`]): every posted
//!   receive completes flushed; sends and receives posted later complete flushed at once.
//!
//! Costs: a post is O(requests + members reached); polls are O(completions polled). Setup
//! ([`SoftNet::create_datagram`], [`DatagramProvider::address`],
//! [`DatagramProvider::join_group`]) allocates; nothing else does.

use alloc::boxed::Box;
use alloc::vec::Vec;
use core::cell::RefCell;
use core::fmt;
use core::mem::size_of;

use crate::completion::{Completion, CompletionKind, DatagramCompletion, WcStatus};
use crate::gid::Gid;
use crate::params::{Mtu, QpCaps};
use crate::provider::datagram::{DatagramProvider, Destination};
use crate::provider::{ProviderError, Verb};
use crate::wire::grh::{NetworkHeader, GRH_LEN};
use crate::wr::{DatagramRequest, Opcode, PostFailure, RecvRequest, SendFlags, WorkRequest};

use super::super::entry::{build_send, check_send, completion, poll_into, Count, RawSge, NO_SGE};
use super::super::keys::Reach;
use super::super::spans::{copy_spans, gather, Spans};
use super::super::{AccessFlags, EINVAL, ENOMEM, MAX_SGE};
use super::calls::NetState;
use super::state::RingPos;
use super::world::SoftNet;
use super::NET_MAX_INLINE;

/// Datagram queue pair numbers are the index plus this (apart from the RC ones).
const UD_QPN_BASE: u32 = 0x40_0000;
/// The queue pair number of a multicast send.
const MULTICAST_QPN: u32 = 0x00ff_ffff;

/// One datagram queue pair: its receive queue and its two completion queues.
pub(crate) struct UdState {
    pub(super) node: u32,
    qkey: u32,
    mtu: u32,
    error: bool,
    rq: RingPos,
    sq_count: Count,
    rq_count: Count,
    /// `max_recv_wr` receive ids.
    recv_ids: Box<[u64]>,
    /// `max_recv_wr` × `max_recv_sge` receive entries (unused ones zero-length).
    recv_sges: Box<[RawSge]>,
    /// Send completions and the send-queue position each retires up to.
    scq: Box<[(Completion, u64)]>,
    scq_pos: RingPos,
    rcq: Box<[DatagramCompletion]>,
    rcq_pos: RingPos,
    /// A completion did not fit: every poll fails from now on.
    overflow: bool,
}

impl UdState {
    fn new(node: u32, qkey: u32, mtu: u32, caps: &QpCaps) -> Self {
        let (sw, rw) = (caps.max_send_wr as usize, caps.max_recv_wr as usize);
        Self {
            node,
            qkey,
            mtu,
            error: false,
            rq: RingPos::default(),
            sq_count: Count::ZERO,
            rq_count: Count::ZERO,
            recv_ids: alloc::vec![0; rw].into_boxed_slice(),
            recv_sges: alloc::vec![NO_SGE; rw * caps.max_recv_sge as usize].into_boxed_slice(),
            // One more than the queue for the drain request a flush posts.
            scq: alloc::vec![(Completion::EMPTY, 0); sw + 1].into_boxed_slice(),
            scq_pos: RingPos::default(),
            rcq: alloc::vec![DatagramCompletion::EMPTY; rw].into_boxed_slice(),
            rcq_pos: RingPos::default(),
            overflow: false,
        }
    }

    pub(super) fn heap_bytes(&self) -> usize {
        size_of::<Self>()
            + self.recv_ids.len() * size_of::<u64>()
            + self.recv_sges.len() * size_of::<RawSge>()
            + self.scq.len() * size_of::<(Completion, u64)>()
            + self.rcq.len() * size_of::<DatagramCompletion>()
    }

    fn push_send_cqe(&mut self, wc: Completion, seq: u64) {
        match self.scq_pos.tail(self.scq.len() as u32) {
            Some(i) => {
                self.scq[i] = (wc, seq);
                self.scq_pos.len += 1;
            }
            None => self.overflow = true,
        }
    }

    fn push_recv_cqe(&mut self, wc: DatagramCompletion) {
        match self.rcq_pos.tail(self.rcq.len() as u32) {
            Some(i) => {
                self.rcq[i] = wc;
                self.rcq_pos.len += 1;
            }
            None => self.overflow = true,
        }
    }
}

/// A multicast group of a net and its members.
pub(crate) struct Group {
    gid: Gid,
    members: Vec<u32>,
}

impl Group {
    pub(super) fn heap_bytes(&self) -> usize {
        size_of::<Self>() + self.members.capacity() * size_of::<u32>()
    }
}

/// Where a datagram of the model goes: what [`DatagramProvider::address`] makes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum NetAddress {
    /// A node (its datagram queue pairs are told apart by number).
    Node(u32),
    /// A multicast group.
    Group(Gid),
}

/// The GID of node `n`: `::ffff:10.a.b.c` with `a.b.c` the node number.
const fn node_gid(n: u32) -> Gid {
    Gid::from_ipv4([10, (n >> 16) as u8, (n >> 8) as u8, n as u8])
}

/// The largest unicast LID (above it, InfiniBand LIDs are multicast).
const MAX_UNICAST_LID: u32 = 0xbfff;

/// The LID of node `n`: its number plus one, or 0 (none) for nodes past the unicast LIDs.
const fn node_lid(n: u32) -> u16 {
    if n < MAX_UNICAST_LID {
        (n + 1) as u16
    } else {
        0
    }
}

/// The node whose GID `g` is, if it is one of `nodes`.
fn gid_node(g: &Gid, nodes: usize) -> Option<u32> {
    match g.ipv4()? {
        [10, a, b, c] => {
            let n = u32::from_be_bytes([0, a, b, c]);
            ((n as usize) < nodes).then_some(n)
        }
        _ => None,
    }
}

fn flushed(wr_id: u64, qp_num: u32) -> Completion {
    completion(wr_id, WcStatus::Flushed, CompletionKind::Other, qp_num)
}

const fn ud_qpn(u: usize) -> u32 {
    UD_QPN_BASE.wrapping_add(u as u32)
}

impl NetState {
    /// Moves datagram queue pair `u` to the error state and flushes its receives.
    pub(super) fn ud_enter_error(&mut self, u: usize) {
        let cap = self.world.caps.max_recv_wr;
        let Some(d) = self.world.ud.get_mut(u) else {
            return;
        };
        d.error = true;
        let mut flushes = 0;
        while let Some(i) = d.rq.pop(cap) {
            let wr_id = d.recv_ids.get(i).copied().unwrap_or(0);
            d.push_recv_cqe(DatagramCompletion {
                wc: flushed(wr_id, ud_qpn(u)),
                ..DatagramCompletion::EMPTY
            });
            flushes += 1;
        }
        let node = d.node as usize;
        if let Some(n) = self.world.nodes.get_mut(node) {
            n.stats.recv_cqes += flushes;
        }
    }

    /// Resolves `addr..addr+len` by lkey against `node`'s regions.
    fn resolve_local(&self, node: usize, s: &RawSge, need: AccessFlags) -> Option<*mut u8> {
        self.world.resolve_at(node, &Reach::entry(s, need))
    }

    /// Delivers one datagram to queue pair `dst` by the rules of the module docs.
    fn deliver(
        &mut self,
        dst: usize,
        from: usize,
        header: &[u8; GRH_LEN],
        payload: &Spans,
        imm: Option<u32>,
        qkey: u32,
    ) {
        let (nr, cap) = (
            self.world.caps.max_recv_sge as usize,
            self.world.caps.max_recv_wr,
        );
        let Some(d) = self.world.ud.get(dst) else {
            return;
        };
        let node = d.node as usize;
        let alive = self.world.nodes.get(node).is_some_and(|n| !n.dead);
        let Some(i) = d.rq.front().filter(|_| alive && !d.error && d.qkey == qkey) else {
            if let Some(n) = self.world.nodes.get_mut(node) {
                n.stats.datagrams_dropped += 1;
            }
            return;
        };
        let mut rsges = [NO_SGE; MAX_SGE];
        let posted = d.recv_sges.get(i * nr..(i + 1) * nr).unwrap_or(&[]);
        for (r, p) in rsges.iter_mut().zip(posted) {
            *r = *p;
        }
        let wr_id = d.recv_ids.get(i).copied().unwrap_or(0);
        let target = gather(rsges.get(..nr).unwrap_or(&[]), |s| {
            self.resolve_local(node, s, AccessFlags::LOCAL_WRITE)
        });
        let mut wc = DatagramCompletion {
            wc: completion(wr_id, WcStatus::Success, CompletionKind::Recv, ud_qpn(dst)),
            src_qp: ud_qpn(from),
            slid: self.world.ud.get(from).map_or(0, |s| node_lid(s.node)),
            sl: 0,
            path_bits: 0,
            grh: true,
        };
        let need = GRH_LEN as u64 + payload.total;
        let error = match target {
            None => Some(WcStatus::LocalProtection),
            Some(t) if t.total < need => Some(WcStatus::LocalLength),
            Some(t) => {
                let h = Spans::one(header.as_ptr().cast_mut(), GRH_LEN);
                // SAFETY: `t` is a list of live ranges of the receiver's registered memory
                // with local write access (resolved just now), `h` this function's header
                // array, `payload` live ranges of the sender's memory (or the model's copy of
                // an inline payload); the posting contract keeps the buffers valid and
                // unreferenced while the requests are outstanding. Header first, then the
                // payload after it.
                unsafe {
                    copy_spans(h.as_slice(), t.as_slice());
                    copy_spans(payload.as_slice(), t.skip(GRH_LEN as u64).as_slice());
                }
                wc.wc.byte_len = need as u32;
                wc.wc.imm = imm;
                None
            }
        };
        let Some(d) = self.world.ud.get_mut(dst) else {
            return;
        };
        let _ = d.rq.pop(cap);
        if let Some(status) = error {
            wc.wc.status = status;
            wc.wc.kind = CompletionKind::Other;
        }
        d.push_recv_cqe(wc);
        if let Some(n) = self.world.nodes.get_mut(node) {
            n.stats.recv_cqes += 1;
        }
        if error == Some(WcStatus::LocalProtection) {
            self.ud_enter_error(dst);
        }
    }

    /// Posts (and executes) datagram sends of queue pair `u`.
    ///
    /// # Safety
    /// The posting contract.
    unsafe fn ud_post_send(
        &mut self,
        u: usize,
        wrs: &[DatagramRequest<'_, NetAddress>],
    ) -> Result<(), PostFailure> {
        if wrs.len() > crate::wr::MAX_BATCH {
            return Err(PostFailure {
                posted: 0,
                errno: EINVAL,
            });
        }
        let caps = self.world.caps;
        // The copy of an inline payload, made at post as a device does.
        let mut inline = [0u8; NET_MAX_INLINE as usize];
        let inline_cap = (caps.max_inline_data as usize).min(inline.len());
        for (i, w) in wrs.iter().enumerate() {
            let fail = |errno| Err(PostFailure { posted: i, errno });
            let Some(d) = self.world.ud.get(u) else {
                return fail(EINVAL);
            };
            let (node, mtu) = (d.node as usize, d.mtu);
            let total: u64 = w.sges.iter().map(|s| u64::from(s.len())).sum();
            let as_rc = WorkRequest {
                wr_id: w.wr_id,
                opcode: Opcode::Send,
                flags: w.flags,
                sges: w.sges,
                remote: crate::sge::RemoteMemory::default(),
            };
            if total > u64::from(mtu) {
                return fail(EINVAL);
            }
            if let Err(errno) = check_send(&caps, &as_rc) {
                return fail(errno);
            }
            if d.sq_count.used() >= u64::from(caps.max_send_wr) {
                return fail(ENOMEM);
            }
            let mut sges = [NO_SGE; MAX_SGE];
            // SAFETY: forwarded posting contract (inline entries name readable memory).
            let built = unsafe { build_send(&as_rc, &mut sges, &mut inline[..inline_cap]) };
            let Ok(h) = built else {
                return fail(EINVAL);
            };
            let seq = d.sq_count.posted;
            if let Some(d) = self.world.ud.get_mut(u) {
                d.sq_count.posted += 1;
            }
            if let Some(n) = self.world.nodes.get_mut(node) {
                n.stats.sends_posted += 1;
            }
            let signaled = w.flags.contains(SendFlags::SIGNALED);
            if self.world.ud.get(u).is_none_or(|d| d.error) {
                self.ud_send_cqe(u, flushed(w.wr_id, ud_qpn(u)), seq);
                continue;
            }
            let local = if h.inline {
                let n = usize::from(h.inline_len).min(inline_cap);
                Some(Spans::one(inline.as_mut_ptr(), n))
            } else {
                let n = usize::from(h.nsge).min(MAX_SGE);
                gather(&sges[..n], |s| {
                    self.resolve_local(node, s, AccessFlags::empty())
                })
            };
            let Some(local) = local else {
                let wc = completion(
                    w.wr_id,
                    WcStatus::LocalProtection,
                    CompletionKind::Other,
                    ud_qpn(u),
                );
                self.ud_send_cqe(u, wc, seq);
                self.ud_enter_error(u);
                continue;
            };
            self.route(u, w, &local);
            if signaled {
                let mut wc =
                    completion(w.wr_id, WcStatus::Success, CompletionKind::Send, ud_qpn(u));
                wc.byte_len = local.total as u32;
                self.ud_send_cqe(u, wc, seq);
            }
        }
        Ok(())
    }

    /// Hands a datagram of `u` to its destination queue pair, or to every member of its
    /// group.
    fn route(&mut self, u: usize, w: &DatagramRequest<'_, NetAddress>, payload: &Spans) {
        let src_node = self.world.ud.get(u).map_or(0, |d| d.node);
        let sgid = node_gid(src_node);
        match *w.dest {
            NetAddress::Node(n) => {
                let dst = w.remote_qpn.wrapping_sub(UD_QPN_BASE) as usize;
                if self.world.ud.get(dst).is_some_and(|d| d.node == n) {
                    let h = header(sgid, node_gid(n), payload.total);
                    self.deliver(dst, u, &h, payload, w.imm, w.remote_qkey);
                } else if let Some(node) = self.world.nodes.get_mut(n as usize) {
                    node.stats.datagrams_dropped += 1;
                }
            }
            NetAddress::Group(g) => {
                let Some(gi) = self.world.groups.iter().position(|x| x.gid == g) else {
                    return;
                };
                if w.remote_qpn != MULTICAST_QPN {
                    return;
                }
                let h = header(sgid, g, payload.total);
                let mut k = 0;
                while let Some(&m) = self.world.groups.get(gi).and_then(|x| x.members.get(k)) {
                    self.deliver(m as usize, u, &h, payload, w.imm, w.remote_qkey);
                    k += 1;
                }
            }
        }
    }

    fn ud_send_cqe(&mut self, u: usize, wc: Completion, seq: u64) {
        let Some(d) = self.world.ud.get_mut(u) else {
            return;
        };
        let node = d.node as usize;
        d.push_send_cqe(wc, seq);
        if let Some(n) = self.world.nodes.get_mut(node) {
            n.stats.send_cqes += 1;
        }
    }

    fn ud_post_recv(&mut self, u: usize, wrs: &[RecvRequest<'_>]) -> Result<(), PostFailure> {
        if wrs.len() > crate::wr::MAX_BATCH {
            return Err(PostFailure {
                posted: 0,
                errno: EINVAL,
            });
        }
        let (nr, cap) = (
            self.world.caps.max_recv_sge as usize,
            self.world.caps.max_recv_wr,
        );
        for (i, wr) in wrs.iter().enumerate() {
            let fail = |errno| Err(PostFailure { posted: i, errno });
            let Some(d) = self.world.ud.get_mut(u) else {
                return fail(EINVAL);
            };
            if wr.sges.len() > nr {
                return fail(EINVAL);
            }
            if d.rq_count.used() >= u64::from(cap) {
                return fail(ENOMEM);
            }
            let Some(at) = d.rq.tail(cap) else {
                return fail(ENOMEM);
            };
            let Some(dst) = d.recv_sges.get_mut(at * nr..(at + 1) * nr) else {
                return fail(ENOMEM);
            };
            let mut posted = wr.sges.iter();
            for e in dst {
                *e = posted.next().map_or(NO_SGE, RawSge::of);
            }
            if let Some(id) = d.recv_ids.get_mut(at) {
                *id = wr.wr_id;
            }
            d.rq.len += 1;
            d.rq_count.posted += 1;
            let node = d.node as usize;
            if let Some(n) = self.world.nodes.get_mut(node) {
                n.stats.recvs_posted += 1;
            }
            if self.world.ud.get(u).is_some_and(|d| d.error) {
                // Receives posted in the error state complete flushed.
                self.ud_enter_error(u);
            }
        }
        Ok(())
    }

    fn ud_poll_send(&mut self, u: usize, out: &mut [Completion]) -> Result<usize, ProviderError> {
        let Some(d) = self.world.ud.get_mut(u) else {
            return Ok(0);
        };
        let cap = d.scq.len() as u32;
        poll_into(d.overflow, out, || {
            let (wc, seq) = d.scq[d.scq_pos.pop(cap)?];
            d.sq_count.retire_to(seq);
            Some(wc)
        })
    }

    fn ud_poll_recv(
        &mut self,
        u: usize,
        out: &mut [DatagramCompletion],
    ) -> Result<usize, ProviderError> {
        let Some(d) = self.world.ud.get_mut(u) else {
            return Ok(0);
        };
        let cap = d.rcq.len() as u32;
        poll_into(d.overflow, out, || {
            let c = d.rcq[d.rcq_pos.pop(cap)?];
            d.rq_count.retired += 1;
            Some(c)
        })
    }
}

/// The network header of a datagram from `sgid` to `dgid` with `payload` bytes.
fn header(sgid: Gid, dgid: Gid, payload: u64) -> [u8; GRH_LEN] {
    let len = u32::try_from(payload).unwrap_or(u32::MAX);
    match (sgid.ipv4(), dgid.ipv4()) {
        (Some(s), Some(d)) => NetworkHeader::encode_ipv4(s, d, len, 64, 0),
        _ => NetworkHeader::encode_ipv6(sgid, dgid, len, 64, 0, 0),
    }
}

impl<'m> SoftNet<'m> {
    /// Gives `node` a datagram queue pair with `qkey` whose datagrams carry at most `mtu`
    /// bytes, with the net's caps and send and receive completion queues of its own. `None`
    /// if the node does not exist, or if `qkey` has its high bit set (a controlled Q_Key,
    /// which a device grants only to privileged queue pairs). Allocates.
    pub fn create_datagram(&self, node: u32, qkey: u32, mtu: Mtu) -> Option<NetDatagram<'_>> {
        let mut st = self.state.borrow_mut();
        if node as usize >= st.world.nodes.len() || qkey & 0x8000_0000 != 0 {
            return None;
        }
        let caps = st.world.caps;
        let u = st.world.ud.len();
        if ud_qpn(u) >= MULTICAST_QPN {
            return None;
        }
        st.world
            .ud
            .push(UdState::new(node, qkey, mtu.bytes(), &caps));
        Some(NetDatagram {
            state: &self.state,
            u: u as u32,
            node,
            qkey,
            mtu: mtu.bytes(),
            caps,
        })
    }

    /// The GID of `node`: `::ffff:10.a.b.c`, `a.b.c` the node number's three low bytes.
    pub fn gid(&self, node: u32) -> Gid {
        node_gid(node)
    }

    /// Members of the multicast group `group` (datagram queue pair numbers, joining order).
    pub fn group_members(&self, group: Gid) -> usize {
        let st = self.state.borrow();
        st.world
            .groups
            .iter()
            .find(|g| g.gid == group)
            .map_or(0, |g| g.members.len())
    }
}

/// A datagram queue pair of a [`SoftNet`] node, with its own two completion queues: a
/// [`DatagramProvider`]. See the [module docs](self).
pub struct NetDatagram<'n> {
    state: &'n RefCell<NetState>,
    u: u32,
    node: u32,
    qkey: u32,
    mtu: u32,
    caps: QpCaps,
}

impl fmt::Debug for NetDatagram<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("NetDatagram")
            .field("qp_num", &ud_qpn(self.u as usize))
            .field("node", &self.node)
            .field("qkey", &self.qkey)
            .finish()
    }
}

impl NetDatagram<'_> {
    /// The node it belongs to.
    pub fn node(&self) -> u32 {
        self.node
    }

    /// Whether it is in the error state.
    pub fn in_error(&self) -> bool {
        self.state
            .borrow()
            .world
            .ud
            .get(self.u as usize)
            .is_none_or(|d| d.error)
    }

    /// Receives posted and not yet taken by a datagram (or flushed).
    pub fn recvs_posted(&self) -> u32 {
        self.state
            .borrow()
            .world
            .ud
            .get(self.u as usize)
            .map_or(0, |d| d.rq.len)
    }
}

impl Drop for NetDatagram<'_> {
    /// Destroys the queue pair: it leaves every group and enters the error state (datagrams
    /// still addressed to it are dropped and counted at its node; receives still posted
    /// complete flushed, into a queue nobody polls).
    fn drop(&mut self) {
        // Never a panic in drop: the state is borrowed only inside calls, so this holds.
        let Ok(mut st) = self.state.try_borrow_mut() else {
            return;
        };
        for g in st.world.groups.iter_mut() {
            g.members.retain(|m| *m != self.u);
        }
        st.ud_enter_error(self.u as usize);
    }
}

impl DatagramProvider for NetDatagram<'_> {
    type Address = NetAddress;

    #[inline]
    fn same_address(a: &NetAddress, b: &NetAddress) -> bool {
        a == b
    }

    fn caps(&self) -> QpCaps {
        self.caps
    }

    fn qp_num(&self) -> u32 {
        ud_qpn(self.u as usize)
    }

    fn qkey(&self) -> u32 {
        self.qkey
    }

    fn gid(&self) -> Gid {
        node_gid(self.node)
    }

    fn lid(&self) -> u16 {
        node_lid(self.node)
    }

    fn mtu(&self) -> u32 {
        self.mtu
    }

    /// A node by its GID or LID, or a multicast group by its GID; `EINVAL` (with
    /// [`Verb::CreateAh`]) for anything else.
    fn address(&mut self, to: Destination) -> Result<NetAddress, ProviderError> {
        let nodes = self.state.borrow().world.nodes.len();
        let found = match to {
            Destination::Gid(g) if g.is_multicast() => Some(NetAddress::Group(g)),
            Destination::Gid(g) => gid_node(&g, nodes).map(NetAddress::Node),
            Destination::Lid(l) => u32::from(l)
                .checked_sub(1)
                .filter(|n| *n < MAX_UNICAST_LID && (*n as usize) < nodes)
                .map(NetAddress::Node),
        };
        found.ok_or(ProviderError {
            verb: Verb::CreateAh,
            errno: EINVAL,
        })
    }

    /// Posts and delivers (see [Semantics](self#semantics)). Does not allocate.
    unsafe fn post_send(
        &mut self,
        wrs: &[DatagramRequest<'_, NetAddress>],
    ) -> Result<(), PostFailure> {
        // SAFETY: forwarded posting contract.
        unsafe { self.state.borrow_mut().ud_post_send(self.u as usize, wrs) }
    }

    /// Does not allocate.
    unsafe fn post_recv(&mut self, wrs: &[RecvRequest<'_>]) -> Result<(), PostFailure> {
        self.state.borrow_mut().ud_post_recv(self.u as usize, wrs)
    }

    /// Does not allocate.
    fn poll_send(&mut self, out: &mut [Completion]) -> Result<usize, ProviderError> {
        self.state.borrow_mut().ud_poll_send(self.u as usize, out)
    }

    /// Does not allocate.
    fn poll_recv(&mut self, out: &mut [DatagramCompletion]) -> Result<usize, ProviderError> {
        self.state.borrow_mut().ud_poll_recv(self.u as usize, out)
    }

    fn set_error(&mut self) -> Result<(), ProviderError> {
        self.state.borrow_mut().ud_enter_error(self.u as usize);
        Ok(())
    }

    /// Allocates (the group's member list).
    fn join_group(&mut self, group: Gid) -> Result<(), ProviderError> {
        let refuse = ProviderError {
            verb: Verb::AttachMcast,
            errno: EINVAL,
        };
        if !group.is_multicast() {
            return Err(refuse);
        }
        let mut st = self.state.borrow_mut();
        let groups = &mut st.world.groups;
        let gi = match groups.iter().position(|g| g.gid == group) {
            Some(i) => i,
            None => {
                groups.push(Group {
                    gid: group,
                    members: Vec::new(),
                });
                groups.len() - 1
            }
        };
        let members = &mut groups[gi].members;
        if members.contains(&self.u) {
            return Err(refuse);
        }
        members.push(self.u);
        Ok(())
    }

    fn leave_group(&mut self, group: Gid) -> Result<(), ProviderError> {
        let mut st = self.state.borrow_mut();
        let members = st
            .world
            .groups
            .iter_mut()
            .find(|g| g.gid == group)
            .map(|g| &mut g.members);
        match members.and_then(|m| m.iter().position(|x| *x == self.u).map(|i| (m, i))) {
            Some((m, i)) => {
                m.remove(i);
                Ok(())
            }
            None => Err(ProviderError {
                verb: Verb::DetachMcast,
                errno: EINVAL,
            }),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_node_has_a_unicast_lid_or_none() {
        assert_eq!(node_lid(0), 1);
        assert_eq!(node_lid(0xbffe), 0xbfff);
        for n in [0xbfff, 0xffff, 0x1_0000, u32::MAX] {
            assert_eq!(node_lid(n), 0, "node {n}");
        }
    }
}
