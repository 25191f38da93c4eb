//! A post the provider refuses with nothing taken leaves the channel as it was: healthy, and
//! with its signaling count unchanged, so the requests posted after it still get a signaled
//! one within every `signal_every` and a later post never waits for room that no completion
//! will free. A datagram post the driver failed after taking the request stays counted.
#![allow(clippy::std_instead_of_core)]

use std::cell::Cell;
use std::rc::Rc;
use std::time::Duration;

use rverbs_core::channel::{Channel, ChannelConfig, ChannelError};
use rverbs_core::completion::Completion;
use rverbs_core::datagram::{memory_needed, Datagram, DatagramConfig, DatagramError, Peer};
use rverbs_core::memory::AccessFlags;
use rverbs_core::model::{
    NetAddress, NetDatagram, NetRegion, Side, SoftEnd, SoftFabric, SoftNet, SoftNetConfig,
};
use rverbs_core::params::{Mtu, QpCaps, RetryCount, RnrRetry};
use rverbs_core::poll::StaticClock;
use rverbs_core::provider::datagram::DatagramProvider;
use rverbs_core::provider::{Provider, ProviderError, QueuePair};
use rverbs_core::wr::{DatagramRequest, PostFailure, WorkRequest};
use rverbs_testkit::clock;

/// The model's end, refusing the next send post (taking nothing, `ENOMEM`) when told to:
/// what a device does with a request it cannot take at the head of a chain.
struct Refusing<'f> {
    end: SoftEnd<'f>,
    refuse: Rc<Cell<bool>>,
}

impl QueuePair for Refusing<'_> {
    rverbs_testkit::forward_queue_pair!(end);
    unsafe fn post_send(&mut self, wrs: &[WorkRequest<'_>]) -> Result<(), PostFailure> {
        if self.refuse.replace(false) {
            return Err(PostFailure {
                posted: 0,
                errno: 12,
            });
        }
        // SAFETY: forwarded posting contract.
        unsafe { self.end.post_send(wrs) }
    }
    fn set_error(&mut self) -> Result<(), ProviderError> {
        self.end.set_error()
    }
}

impl Provider for Refusing<'_> {
    fn poll_send(&mut self, out: &mut [Completion]) -> Result<usize, ProviderError> {
        self.end.poll_send(out)
    }
    fn poll_recv(&mut self, out: &mut [Completion]) -> Result<usize, ProviderError> {
        self.end.poll_recv(out)
    }
}

#[test]
fn a_refused_post_does_not_count_toward_the_signaling_interval() {
    let caps = QpCaps::queues(32, 32);
    let mut mem = [0u8; 64];
    let f = SoftFabric::new(caps, RnrRetry::Times(3), RetryCount::new(3).unwrap());
    let dst = f
        .register(
            Side::B,
            &mut mem,
            AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE,
        )
        .unwrap();
    let (ea, _eb) = f.ends().unwrap();
    let refuse = Rc::new(Cell::new(false));
    let end = Refusing {
        end: ea,
        refuse: refuse.clone(),
    };
    let mut a = Channel::new(
        end,
        ChannelConfig::with_timeout(Duration::from_millis(200)),
        clock!(),
    );
    let k = a.signal_every() as usize;
    let max_post = a.max_post();
    // The geometry this test needs: the unsignaled requests a wrong count lets through
    // (almost 2k) plus a full batch exceed the send queue.
    assert!(2 * (k - 1) + max_post > 31, "k {k}, max_post {max_post}");
    let at = |i: usize| dst.remote().slice((i % 8 * 8) as u64, 8).unwrap();

    // k - 1 unsignaled requests: the next one is signaled.
    for i in 0..k - 1 {
        a.post_write_inline(&[1; 8], at(i)).unwrap();
    }
    // That one is refused, nothing taken: the channel stays healthy.
    refuse.set(true);
    let e = a.post_write_inline(&[2; 8], at(0)).unwrap_err();
    assert_eq!(e, ChannelError::Post { errno: 12 });
    assert_eq!(a.fault(), None);
    assert_eq!(a.outstanding_sends(), (k - 1) as u64);

    // k - 1 more: if the refused one counted as signaled, none of these is.
    for i in 0..k - 1 {
        a.post_write_inline(&[3; 8], at(i)).unwrap();
    }
    // A full batch needs room only a signaled completion frees.
    let data = [4u8; 8];
    let mut batch = a.batch();
    for i in 0..max_post {
        batch.write_inline(&data, at(i)).unwrap();
    }
    batch.run().unwrap();
    a.wait_all().unwrap();
    assert_eq!(a.outstanding_sends(), 0);
    assert_eq!(rverbs_testkit::bytes::<8>(&dst, 0), data);
}

/// A datagram queue pair whose posts, when told, take the request and still fail without
/// naming it: what rxe does when the doorbell system call after its loop fails (the
/// request is in the send queue and the device may run it).
struct TakesButFails<'n> {
    qp: NetDatagram<'n>,
    fail: Rc<Cell<bool>>,
}

impl DatagramProvider for TakesButFails<'_> {
    type Address = NetAddress;
    rverbs_testkit::forward_datagram_identity!(qp);
    rverbs_testkit::forward_datagram!(qp;
        address, post_recv, poll_send, poll_recv, set_error, join_group, leave_group);
    unsafe fn post_send(
        &mut self,
        wrs: &[DatagramRequest<'_, NetAddress>],
    ) -> Result<(), PostFailure> {
        // SAFETY: forwarded posting contract.
        unsafe { self.qp.post_send(wrs) }?;
        if self.fail.get() {
            return Err(PostFailure {
                posted: wrs.len(),
                errno: 5,
            });
        }
        Ok(())
    }
}

const QKEY: u32 = 0x0123_4567;
const MTU: Mtu = Mtu::B256;
/// A send queue of 16, four times the channel's send slots.
const CAPS: QpCaps = QpCaps::queues(16, 4);

fn config() -> DatagramConfig {
    let mut c = DatagramConfig::default();
    c.recv_slots = 4;
    c.send_slots = 4;
    c.signal_every = 4;
    c.timeout = Duration::from_millis(50);
    c
}

/// Memory for both ends of [`failing_pair`].
fn pair_memory() -> Vec<Vec<u8>> {
    vec![vec![0u8; memory_needed(MTU.bytes(), &config())]; 2]
}

type Failing<'n> = Datagram<TakesButFails<'n>, NetRegion<'n>>;
type Healthy<'n> = Datagram<NetDatagram<'n>, NetRegion<'n>>;

/// Node 0's datagram channel, whose posts fail after taking the request while the switch
/// returned with it is on (it starts as `failing`), and node 1's, healthy.
fn failing_pair<'n, 'm>(
    net: &'n SoftNet<'m>,
    mem: &'m mut [Vec<u8>],
    failing: bool,
    clocks: [StaticClock; 2],
) -> (Failing<'n>, Healthy<'n>, Rc<Cell<bool>>) {
    let fail = Rc::new(Cell::new(failing));
    let (ma, mb) = mem.split_at_mut(1);
    let qp = TakesButFails {
        qp: net.create_datagram(0, QKEY, MTU).unwrap(),
        fail: fail.clone(),
    };
    let region = net
        .register(0, &mut ma[0], AccessFlags::LOCAL_WRITE)
        .unwrap();
    let a = Datagram::new(qp, region, config(), clocks[0]).unwrap();
    let qp = net.create_datagram(1, QKEY, MTU).unwrap();
    let region = net
        .register(1, &mut mb[0], AccessFlags::LOCAL_WRITE)
        .unwrap();
    let b = Datagram::new(qp, region, config(), clocks[1]).unwrap();
    (a, b, fail)
}

/// [`failing_pair`] on a fresh network (its switch starting as `failing`), handed to `test`
/// as node 0's channel, its address of node 1, and the switch.
fn with_failing_pair(
    failing: bool,
    clocks: [StaticClock; 2],
    test: impl FnOnce(&mut Failing<'_>, &Peer<NetAddress>, &Cell<bool>),
) {
    let mut mem = pair_memory();
    let net = SoftNet::new(SoftNetConfig::new(2, CAPS));
    let (mut a, b, fail) = failing_pair(&net, &mut mem, failing, clocks);
    let to_b = a.peer(&b.endpoint()).unwrap();
    test(&mut a, &to_b, &fail);
}

#[test]
fn a_datagram_the_driver_took_while_failing_the_post_stays_counted() {
    with_failing_pair(true, [clock!(), clock!()], |a, to_b, fail| {
        // Twice the send queue, each one in the queue although its post failed.
        for i in 0..2 * CAPS.max_send_wr as u8 {
            assert_eq!(a.send(to_b, &[i; 8]), Err(DatagramError::Post { errno: 5 }));
        }
        // Counted as posted, they left room for the next only as they completed.
        fail.set(false);
        a.send(to_b, &[7; 8]).unwrap();
    });
}

#[test]
fn the_drain_datagram_of_wait_sent_stays_counted_when_its_post_fails_after_taking_it() {
    with_failing_pair(false, [clock!(), clock!()], |a, to_b, fail| {
        // One unsignaled datagram: wait_sent must post a signaled one behind it.
        a.send(to_b, &[1; 8]).unwrap();
        assert_eq!(a.outstanding_sends(), 1);
        // That post is taken and still fails: the request is in the queue, so it counts.
        fail.set(true);
        assert_eq!(a.wait_sent(), Err(DatagramError::Post { errno: 5 }));
        assert_eq!(a.outstanding_sends(), 2);
        // Its completion retires both; nothing is left for another drain request.
        fail.set(false);
        a.wait_sent().unwrap();
        assert_eq!(a.outstanding_sends(), 0);
    });
}
