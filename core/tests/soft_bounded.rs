//! Waits end at their deadline while a live peer keeps traffic coming, nothing is lost when
//! a handler panics, and a peer's bytes cannot panic or fool the node: the findings of the
//! second adversarial review (issue 23), each driven on the software model or a stub
//! provider over it.
#![allow(clippy::std_instead_of_core)]

use rverbs_core::wire::FlagLayout;
use std::cell::{Cell, RefCell};
use std::collections::VecDeque;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::time::Duration;

use rverbs_core::barrier::BarrierAlgorithm;
use rverbs_core::channel::{Channel, ChannelConfig};
use rverbs_core::completion::{Completion, DatagramCompletion, WcStatus};
use rverbs_core::datagram::{memory_needed, Datagram, DatagramConfig, DatagramError};
use rverbs_core::gid::Gid;
use rverbs_core::memory::AccessFlags;
use rverbs_core::model::{NetAddress, NetDatagram, NetRegion, SoftFabric, SoftNet, SoftNetConfig};
use rverbs_core::node::{soft_world_bytes, Event, NodeError, Receive};
use rverbs_core::params::{Mtu, QpCaps, RetryCount, RnrRetry};
use rverbs_core::poll::{Deadline, Spin, StaticClock, StepClock};
use rverbs_core::provider::datagram::{DatagramProvider, Destination};
use rverbs_core::provider::shared::{SharedCqError, SharedCqs};
use rverbs_core::provider::ProviderError;
use rverbs_core::wr::{DatagramRequest, PostFailure, RecvRequest};

fn clock() -> StaticClock {
    static CLOCK: StepClock = StepClock::new(Duration::from_micros(1));
    &CLOCK
}

/// A clock that moves 100 us a read, for the waits that are driven past a 1 ms deadline:
/// ten reads end them, so a bounded wait takes a few hundred turns (quick under Miri too).
fn coarse() -> StaticClock {
    static CLOCK: StepClock = StepClock::new(Duration::from_micros(100));
    &CLOCK
}

fn caps() -> QpCaps {
    QpCaps::queues(16, 16)
}

/// Polls a stub may answer before the test calls the wait unbounded (far more than a
/// bounded wait of a millisecond on a 1 us step clock needs).
const POLL_LIMIT: u64 = 200_000;

/// Fills `out` from `next` until either runs out; how many it filled. A stub's poll.
fn fill<T>(out: &mut [T], mut next: impl FnMut() -> Option<T>) -> usize {
    let mut n = 0;
    while n < out.len() {
        let Some(c) = next() else {
            break;
        };
        out[n] = c;
        n += 1;
    }
    n
}

/// A datagram queue pair whose every posted receive completes at once with
/// `IBV_WC_LOC_LEN_ERR`: a publisher with a larger MTU streaming datagrams no slot holds.
struct OversizeFlood<'n> {
    qp: NetDatagram<'n>,
    posted: VecDeque<u64>,
    polls: u64,
    /// After `set_error`: what is held completes flushed.
    flushing: bool,
    /// Sends a stub on top holds (see the send test).
    held_sends: VecDeque<u64>,
}

impl<'n> OversizeFlood<'n> {
    /// Node 0's datagram queue pair of `net` under the stub, nothing posted or held.
    fn on(net: &'n SoftNet<'_>) -> Self {
        Self {
            qp: net.create_datagram(0, 0x1234, Mtu::B256).unwrap(),
            posted: VecDeque::new(),
            polls: 0,
            flushing: false,
            held_sends: VecDeque::new(),
        }
    }
}

/// Datagram settings: `recv_slots` and `send_slots` as given, waits bounded by `timeout`.
fn config((recv_slots, send_slots): (u32, u32), timeout: Duration) -> DatagramConfig {
    let mut cfg = DatagramConfig::default();
    (cfg.recv_slots, cfg.send_slots, cfg.timeout) = (recv_slots, send_slots, timeout);
    cfg
}

impl DatagramProvider for OversizeFlood<'_> {
    type Address = NetAddress;
    rverbs_testkit::forward_datagram_identity!(qp);
    rverbs_testkit::forward_datagram!(qp;
        address, post_send, poll_send, set_error => flushing, join_group, leave_group);
    unsafe fn post_recv(&mut self, wrs: &[RecvRequest<'_>]) -> Result<(), PostFailure> {
        // The stub never writes the buffers: it only answers for them.
        self.posted.extend(wrs.iter().map(|w| w.wr_id));
        Ok(())
    }
    fn poll_recv(&mut self, out: &mut [DatagramCompletion]) -> Result<usize, ProviderError> {
        self.polls += 1;
        assert!(
            self.flushing || self.polls < POLL_LIMIT,
            "the receive never gave up"
        );
        let status = if self.flushing {
            WcStatus::Flushed
        } else {
            WcStatus::LocalLength
        };
        let qp_num = self.qp.qp_num();
        Ok(fill(out, || {
            let mut c = DatagramCompletion::EMPTY;
            (c.wc.wr_id, c.wc.status, c.wc.qp_num) = (self.posted.pop_front()?, status, qp_num);
            Some(c)
        }))
    }
}

#[test]
fn a_datagram_receive_ends_at_its_deadline_while_oversize_datagrams_keep_coming() {
    let cfg = config((8, 2), Duration::from_millis(1));
    let mut mem = vec![0u8; memory_needed(Mtu::B256.bytes(), &cfg)];
    let net = SoftNet::new(SoftNetConfig::new(1, caps()));
    let qp = OversizeFlood::on(&net);
    let region = net.register(0, &mut mem, AccessFlags::LOCAL_WRITE).unwrap();
    let mut ep = Datagram::new(qp, region, cfg, coarse()).unwrap();
    let d = Deadline::after(&coarse(), Duration::from_millis(1));
    assert!(matches!(
        ep.recv_until(d),
        Err(DatagramError::TimedOut { .. })
    ));
    assert!(matches!(ep.recv(), Err(DatagramError::TimedOut { .. })));
    // Two waits of about ten clock reads each: a few hundred polls, not the flood's worth.
    let bound = 2 * 12 * u64::from(rverbs_core::poll::CHECK_EVERY);
    assert!(ep.provider().polls < bound, "{} polls", ep.provider().polls);
    // A receive that does not wait polls once, however many datagrams are thrown away.
    let before = ep.provider().polls;
    assert!(ep.try_recv().is_none());
    assert_eq!(ep.provider().polls, before + 1);
    assert!(ep.stats().receive_errors > 0);
}

/// Two ranks messaging on the model.
macro_rules! world {
    ($net:ident, $arena:ident, $mem:ident, $nodes:ident, $receive:expr, $slots:expr, $slot:expr) => {
        let $net = SoftNet::new(SoftNetConfig::new(2, caps()));
        let mut $arena = vec![0u8; soft_world_bytes(2, 64)];
        let mut $mem = vec![0u8; 2 * $slots * $slot];
        let mut $nodes = rverbs_testkit::nodes(&$net, &mut $arena, $receive, clock());
        for (n, m) in $nodes.iter_mut().zip($mem.chunks_mut($slots * $slot)) {
            let region = $net
                .register(n.rank(), m, AccessFlags::LOCAL_WRITE)
                .unwrap();
            n.start_messaging_in(region, $slots, $slot).unwrap();
        }
    };
}

#[test]
fn progress_until_ends_at_its_deadline_while_a_live_peer_keeps_sending() {
    world!(net, arena, mem, nodes, Receive::PerPeer, 4, 16);
    let (a, b) = nodes.split_at_mut(1);
    let (n0, n1) = (&mut a[0], &mut b[0]);
    // Rank 1 sends one message; every message rank 0 handles makes rank 1 send the next:
    // a peer that never lets `progress` come back empty.
    n1.post_send_inline(0, b"ping").unwrap();
    let handled = Cell::new(0u64);
    let peer = RefCell::new(n1);
    // The node's clock moves 1 us a read: a 10 us deadline has passed by the tenth read,
    // which a bounded wait makes within 10 x CHECK_EVERY turns.
    let d = Deadline::after(n0.clock(), Duration::from_micros(10));
    let r = n0.progress_until(
        d,
        |e| {
            if let Event::Message { .. } = e {
                handled.set(handled.get() + 1);
                // The chatter stops after 100 000 messages, so an unbounded wait ends too
                // (and fails the count below) instead of hanging the test.
                if handled.get() < 100_000 {
                    let mut p = peer.borrow_mut();
                    let _ = p.progress(16, |_| {});
                    let _ = p.post_send_inline(0, b"ping");
                }
            }
        },
        || false,
    );
    assert_eq!(r, Err(NodeError::ProgressTimedOut));
    // A message or two a turn, for at most 11 x CHECK_EVERY turns: not the whole stream.
    assert!(
        handled.get() <= 2 * 11 * u64::from(rverbs_core::poll::CHECK_EVERY),
        "{} messages handled in a 10 us wait",
        handled.get()
    );
}

#[test]
fn a_panicking_pool_handler_loses_none_of_the_other_messages_polled_with_its_own() {
    const POOL: usize = 8;
    world!(
        net,
        arena,
        mem,
        nodes,
        Receive::Shared { slots: POOL as u32 },
        POOL,
        16
    );
    let (a, b) = nodes.split_at_mut(1);
    let (n0, n1) = (&mut a[0], &mut b[0]);
    for i in 0..4u8 {
        n1.post_send_inline(0, &[i]).unwrap();
    }
    // The first message's handler panics; the other three were polled with it.
    let r = catch_unwind(AssertUnwindSafe(|| {
        n0.progress(64, |e| {
            if let Event::Message { .. } = e {
                panic!("handler failed");
            }
        })
    }));
    assert!(r.is_err());
    let mut got = Vec::new();
    for _ in 0..8 {
        n0.progress(64, |e| {
            if let Event::Message { data, .. } = e {
                got.push(data[0]);
            }
        })
        .unwrap();
    }
    assert_eq!(got, [1, 2, 3], "messages polled with the one that panicked");
    // And the pool is whole: the sender's credits came back, and a full pool's worth of
    // messages still arrives, every slot re-posted.
    let mut sent = 0u8;
    let mut more = Vec::new();
    for _ in 0..200 {
        if sent < 3 * POOL as u8 && n1.post_send_inline(0, &[100 + sent]).is_ok() {
            sent += 1;
        }
        let _ = n1.progress(16, |_| {});
        n0.progress(64, |e| {
            if let Event::Message { data, .. } = e {
                more.push(data[0]);
            }
        })
        .unwrap();
    }
    assert_eq!(more, (100..100 + 3 * POOL as u8).collect::<Vec<_>>());
}

#[test]
fn a_credit_word_a_peer_forged_neither_panics_nor_buys_credit() {
    const SLOTS: usize = 4;
    world!(net, arena, mem, nodes, Receive::PerPeer, SLOTS, 16);
    let (a, b) = nodes.split_at_mut(1);
    let (n0, n1) = (&mut a[0], &mut b[0]);
    // Rank 1 writes rank 0's credit word for it (flag array slot world + 1) with a count
    // of messages it cannot have consumed.
    let word = n0
        .flags_remote()
        .slice(FlagLayout::new(2).credits(1).unwrap() as u64, 8)
        .unwrap();
    let t = n1
        .channel(0)
        .unwrap()
        .post_write_inline(&(u64::MAX - 1).to_le_bytes(), word)
        .unwrap();
    n1.channel(0).unwrap().wait(t).unwrap();
    // Rank 0 may still send only its credits' worth before rank 1 consumed any.
    let mut posted = 0;
    while n0.post_send_inline(1, b"m").is_ok() {
        posted += 1;
        assert!(posted <= SLOTS, "the forged word bought credit");
    }
    assert_eq!(posted, SLOTS);
    // Rank 1 answers (its messages carry credit returns in their immediates) and rank 0
    // handles them: no overflow, whatever the word said.
    for _ in 0..50 {
        let _ = n1.progress(16, |_| {});
        let _ = n1.post_send_inline(0, b"r");
        n0.progress(16, |_| {}).unwrap();
        let _ = n0.post_send_inline(1, b"m");
    }
    assert!(n0.failure().is_none());
}

#[test]
fn send_room_for_more_than_can_ever_fit_says_no() {
    let mut mem = [0u8; 8];
    let f = SoftFabric::new(caps(), RnrRetry::Times(3), RetryCount::new(3).unwrap());
    let dst = f
        .register(
            rverbs_core::model::Side::B,
            &mut mem,
            AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE,
        )
        .unwrap();
    let (ea, _eb) = f.ends().unwrap();
    let mut a = Channel::new(ea, ChannelConfig::default(), clock());
    assert!(a.send_room(1));
    // With requests counted already, `next + n` would overflow.
    let t = a.post_write_inline(&[1; 8], dst.remote()).unwrap();
    a.wait(t).unwrap();
    assert!(!a.send_room(usize::MAX));
    assert!(!a.send_room(usize::MAX - 1));
    assert_eq!(a.fault(), None);
}

#[test]
fn a_queue_pair_that_completes_elsewhere_is_refused_by_shared_queues() {
    let net = SoftNet::new(SoftNetConfig::new(3, caps()));
    let shared = SharedCqs::new(net.send_cq(0).unwrap(), net.recv_cq(0).unwrap(), 2);
    let (q0, q1) = net.connect(0, 1).unwrap();
    // Node 1's queue pair completes into node 1's queues, not node 0's.
    let (q1, e) = shared.add(q1).unwrap_err();
    assert_eq!(e, SharedCqError::ForeignQueues);
    let mut routed = shared.add(q0).unwrap();
    // Nor may it take the place of one that does.
    let (_, e) = routed.replace_qp(q1).unwrap_err();
    assert_eq!(e, SharedCqError::ForeignQueues);
    let (q0b, _q2) = net.connect(0, 2).unwrap();
    routed.replace_qp(q0b).unwrap();
}

/// The model's end of a connection whose receive queue, while nothing of its own
/// completes, reports a completion of another queue pair on every poll (a completion queue
/// shared by mistake, or a flood the channel ignores): traffic that is never the awaited
/// work.
struct ForeignFlood<'f> {
    end: rverbs_core::model::SoftEnd<'f>,
    flushing: bool,
    polls: u64,
}

impl rverbs_core::provider::QueuePair for ForeignFlood<'_> {
    rverbs_testkit::forward_queue_pair!(end);
    unsafe fn post_send(
        &mut self,
        wrs: &[rverbs_core::wr::WorkRequest<'_>],
    ) -> Result<(), PostFailure> {
        // SAFETY: forwarded posting contract.
        unsafe { self.end.post_send(wrs) }
    }
    fn set_error(&mut self) -> Result<(), ProviderError> {
        self.flushing = true;
        self.end.set_error()
    }
}

impl rverbs_core::provider::Provider for ForeignFlood<'_> {
    fn poll_send(&mut self, out: &mut [Completion]) -> Result<usize, ProviderError> {
        self.end.poll_send(out)
    }
    fn poll_recv(&mut self, out: &mut [Completion]) -> Result<usize, ProviderError> {
        self.polls += 1;
        assert!(self.polls < POLL_LIMIT, "the wait never gave up");
        let n = self.end.poll_recv(out)?;
        if n > 0 || self.flushing || out.is_empty() {
            return Ok(n);
        }
        let mut c = Completion::EMPTY;
        c.qp_num = rverbs_core::provider::QueuePair::qp_num(&self.end) ^ 0x40;
        c.wr_id = 1 << 63;
        out[0] = c;
        Ok(1)
    }
}

#[test]
fn a_channel_receive_ends_at_its_deadline_while_foreign_completions_keep_coming() {
    let mut mem = [0u8; 64];
    let f = SoftFabric::new(caps(), RnrRetry::Times(3), RetryCount::new(3).unwrap());
    let mut buf = f
        .register(
            rverbs_core::model::Side::A,
            &mut mem,
            AccessFlags::LOCAL_WRITE,
        )
        .unwrap();
    let (ea, _eb) = f.ends().unwrap();
    let end = ForeignFlood {
        end: ea,
        flushing: false,
        polls: 0,
    };
    let mut a = Channel::new(end, ChannelConfig::default(), coarse());
    let mut sge = [buf.sge_mut(0..64).unwrap()];
    // Nobody sends: the wait ends at its deadline, with the queue pair flushed.
    let r = a.recv_timeout(&mut sge, Duration::from_millis(1));
    assert!(
        matches!(r, Err(rverbs_core::channel::ChannelError::TimedOut { .. })),
        "{r:?}"
    );
    // 1 ms on a clock that moves 100 us a read, read every CHECK_EVERY-th turn: about ten
    // reads, so at most about 10 x CHECK_EVERY polls (plus the drain's).
    let bound = 12 * u64::from(rverbs_core::poll::CHECK_EVERY);
    assert!(a.provider().polls < bound, "{} polls", a.provider().polls);
}

#[test]
fn a_datagram_send_waiting_for_room_ends_at_its_deadline_while_receives_keep_completing() {
    let mut cfg = config((8, 2), Duration::from_millis(1));
    cfg.signal_every = 1;
    let mut mem = vec![vec![0u8; memory_needed(Mtu::B256.bytes(), &cfg)]; 2];
    let (ma, mb) = mem.split_at_mut(1);
    let mut small = caps();
    small.max_send_wr = 4;
    let net = SoftNet::new(SoftNetConfig::new(2, small));
    // The model completes sends when it runs them; this stub never lets a send complete
    // (a device that stopped sending) while its receives keep completing oversize.
    struct Stuck<'n>(OversizeFlood<'n>);
    impl DatagramProvider for Stuck<'_> {
        type Address = NetAddress;
        rverbs_testkit::forward_datagram_identity!(0);
        rverbs_testkit::forward_datagram!(0;
            address, post_recv, poll_recv, set_error, join_group, leave_group);
        unsafe fn post_send(
            &mut self,
            wrs: &[DatagramRequest<'_, NetAddress>],
        ) -> Result<(), PostFailure> {
            // Taken, never run (until the flush).
            self.0.held_sends.extend(wrs.iter().map(|w| w.wr_id));
            Ok(())
        }
        fn poll_send(&mut self, out: &mut [Completion]) -> Result<usize, ProviderError> {
            if !self.0.flushing {
                return Ok(0);
            }
            let qp_num = self.0.qp_num();
            Ok(fill(out, || {
                let mut c = Completion::EMPTY;
                (c.wr_id, c.status, c.qp_num) =
                    (self.0.held_sends.pop_front()?, WcStatus::Flushed, qp_num);
                Some(c)
            }))
        }
    }
    let qp = Stuck(OversizeFlood::on(&net));
    let region = net
        .register(0, &mut ma[0], AccessFlags::LOCAL_WRITE)
        .unwrap();
    let mut a = Datagram::new(qp, region, cfg, coarse()).unwrap();
    let qp = net.create_datagram(1, 0x1234, Mtu::B256).unwrap();
    let region = net
        .register(1, &mut mb[0], AccessFlags::LOCAL_WRITE)
        .unwrap();
    let b = Datagram::new(qp, region, cfg, coarse()).unwrap();
    let to_b = a.peer(&b.endpoint()).unwrap();
    let mut result = Ok(());
    for _ in 0..8 {
        result = a.send(&to_b, b"x");
        if result.is_err() {
            break;
        }
    }
    assert!(
        matches!(result, Err(DatagramError::SendsStuck { .. })),
        "{result:?}"
    );
}

/// A barrier transport whose peers never arrive while its polls keep finding work.
struct Busy {
    polls: u64,
}

impl rverbs_core::barrier::BarrierTransport for Busy {
    fn notify(
        &mut self,
        _rank: u32,
        _count: u64,
    ) -> Result<(), rverbs_core::barrier::BarrierError> {
        Ok(())
    }
    fn arrived(&self, _rank: u32) -> u64 {
        0
    }
    fn progress(&mut self) -> Result<(), rverbs_core::barrier::BarrierError> {
        self.polls += 1;
        assert!(self.polls < POLL_LIMIT, "the barrier never gave up");
        Ok(())
    }
}

#[test]
fn a_barrier_ends_at_its_deadline_however_busy_its_transport_is() {
    use rverbs_core::barrier::{BarrierError, BarrierState};
    static WAIT_CLOCK: StepClock = StepClock::new(Duration::from_micros(100));
    let mut t = Busy { polls: 0 };
    let mut state = BarrierState::new(0, 2);
    let r = state.run(
        &mut t,
        &[0, 1],
        BarrierAlgorithm::Dissemination,
        &WAIT_CLOCK,
        Duration::from_millis(1),
        &mut Spin,
    );
    assert!(matches!(r, Err(BarrierError::Timeout { .. })), "{r:?}");
    assert!(t.polls < 100, "{} polls", t.polls);
}

/// A datagram queue pair that runs its sends when it is polled, not when they are posted,
/// and looks each one's address up only then, as rxe does (by the handle's number): a send
/// whose address handle was destroyed in between fails (rxe: "unable to find AH").
struct LateLookup<'n> {
    qp: NetDatagram<'n>,
    /// Posted sends not yet run: id, whether signaled, and the address as the device knows
    /// it (alive only while some clone of the handle is).
    queued: VecDeque<(u64, bool, std::rc::Weak<u32>)>,
    flushing: bool,
}

impl DatagramProvider for LateLookup<'_> {
    type Address = std::rc::Rc<u32>;
    // One handle and its clones: a run of sends to one peer keeps one clone.
    fn same_address(a: &std::rc::Rc<u32>, b: &std::rc::Rc<u32>) -> bool {
        std::rc::Rc::ptr_eq(a, b)
    }
    rverbs_testkit::forward_datagram_identity!(qp);
    rverbs_testkit::forward_datagram!(qp;
        post_recv, poll_recv, set_error => flushing, join_group, leave_group);
    fn address(&mut self, _to: Destination) -> Result<std::rc::Rc<u32>, ProviderError> {
        Ok(std::rc::Rc::new(7))
    }
    unsafe fn post_send(
        &mut self,
        wrs: &[DatagramRequest<'_, std::rc::Rc<u32>>],
    ) -> Result<(), PostFailure> {
        for w in wrs {
            let signaled = w.flags.contains(rverbs_core::wr::SendFlags::SIGNALED);
            self.queued
                .push_back((w.wr_id, signaled, std::rc::Rc::downgrade(w.dest)));
        }
        Ok(())
    }
    fn poll_send(&mut self, out: &mut [Completion]) -> Result<usize, ProviderError> {
        let qp_num = self.qp.qp_num();
        // Each send in turn; an unsignaled one that ran well makes no completion.
        Ok(fill(out, || loop {
            let (wr_id, signaled, dest) = self.queued.pop_front()?;
            let status = if self.flushing {
                WcStatus::Flushed
            } else if dest.upgrade().is_none() {
                WcStatus::LocalQpOperation
            } else {
                WcStatus::Success
            };
            if signaled || status != WcStatus::Success {
                let mut c = Completion::EMPTY;
                (c.wr_id, c.status, c.qp_num) = (wr_id, status, qp_num);
                return Some(c);
            }
        }))
    }
}

/// Rank 0's datagram endpoint of `cfg` over a [`LateLookup`] queue pair (key 0x1234, MTU
/// 256), its memory `mem`, and the address of a peer (queue pair 0x99, same key) to send to.
fn late_lookup_endpoint<'n>(
    net: &'n SoftNet<'n>,
    mem: &'n mut [u8],
    cfg: DatagramConfig,
) -> (
    Datagram<LateLookup<'n>, NetRegion<'n>>,
    rverbs_core::wire::DatagramEndpoint,
) {
    let qp = LateLookup {
        qp: net.create_datagram(0, 0x1234, Mtu::B256).unwrap(),
        queued: VecDeque::new(),
        flushing: false,
    };
    let region = net.register(0, mem, AccessFlags::LOCAL_WRITE).unwrap();
    let a = Datagram::new(qp, region, cfg, clock()).unwrap();
    let them = rverbs_core::wire::DatagramEndpoint {
        gid: Gid::default(),
        global: false,
        lid: 1,
        qpn: 0x99,
        qkey: 0x1234,
        mtu: Mtu::B256,
    };
    (a, them)
}

#[test]
fn an_address_handle_lives_until_the_sends_that_name_it_have_run() {
    let mut cfg = config((4, 2), Duration::from_millis(50));
    cfg.signal_every = 4;
    let mut mem = vec![0u8; memory_needed(Mtu::B256.bytes(), &cfg)];
    let net = SoftNet::new(SoftNetConfig::new(2, caps()));
    let (mut a, them) = late_lookup_endpoint(&net, &mut mem, cfg);
    // Ten peers, each dropped by the caller right after its one send, and one kept for
    // a run of sends: the endpoint holds what the device will look up.
    for i in 0..10u8 {
        let to = a.peer(&them).unwrap();
        a.send(&to, &[i]).unwrap();
        drop(to);
    }
    let kept = a.peer(&them).unwrap();
    for i in 0..6u8 {
        a.send(&kept, &[i]).unwrap();
    }
    a.wait_sent().unwrap();
    assert_eq!(a.failure(), None);
    assert_eq!(a.outstanding_sends(), 0);
    // Once they ran, the endpoint lets go (when it polls their completions): only the
    // caller's clone of `kept` is left, then the one the new send holds beside it.
    assert_eq!(std::rc::Rc::strong_count(kept.address()), 1);
    a.send(&kept, b"last").unwrap();
    assert_eq!(std::rc::Rc::strong_count(kept.address()), 2);
}

#[test]
fn a_send_that_waits_for_its_slot_still_holds_its_address() {
    // Two send slots, a completion every second send: the third large send waits for its
    // slot, and that wait's poll lets go of the run's clone (its sends are done). The send
    // must then hold a clone of its own, or dropping the peer would destroy the handle
    // before the device looks it up.
    let cfg = config((4, 2), Duration::from_millis(50));
    let mut mem = vec![0u8; memory_needed(Mtu::B256.bytes(), &cfg)];
    let net = SoftNet::new(SoftNetConfig::new(2, caps()));
    let (mut a, them) = late_lookup_endpoint(&net, &mut mem, cfg);
    let to = a.peer(&them).unwrap();
    let big = [7u8; 200]; // over the inline limit of 64: through a send slot
    for _ in 0..3 {
        a.send(&to, &big).unwrap();
    }
    assert_eq!(a.stats().sent_inline, 0);
    drop(to);
    a.wait_sent().unwrap();
    assert_eq!(a.failure(), None);
    assert_eq!(a.outstanding_sends(), 0);
}
