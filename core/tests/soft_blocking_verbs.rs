//! Blocking verbs and run batches post one request and wait for its own completion only
//! (the single-request path): these cases check that a wait never ends on another
//! request's completion, never loses one a neighbour needs, and that a post the provider
//! takes and then refuses is accounted for (that one in soft_faults).
#![allow(clippy::std_instead_of_core)]

use rverbs_core::channel::{Channel, ChannelConfig, ChannelError};
use rverbs_core::memory::AccessFlags;
use rverbs_core::model::{Side, SoftFabric, SoftNet, SoftNetConfig};
use rverbs_core::params::{QpCaps, RetryCount, RnrRetry};
use rverbs_core::provider::shared::SharedCqs;

use rverbs_testkit::clock;

const ATOMIC: AccessFlags = AccessFlags::LOCAL_WRITE.union(AccessFlags::REMOTE_ATOMIC);
const RW: AccessFlags = AccessFlags::LOCAL_WRITE
    .union(AccessFlags::REMOTE_WRITE)
    .union(AccessFlags::REMOTE_READ);

#[repr(align(8))]
struct Words<const N: usize>([u8; N]);

fn caps() -> QpCaps {
    QpCaps::queues(16, 16).with_sges(2)
}

fn cfg(k: u32) -> ChannelConfig {
    let mut c = ChannelConfig::default();
    c.signal_every = k;
    c.rank = Some(1);
    c
}

/// Earlier requests' signaled completions sit in the CQ ahead of the atomic's; the first
/// poll (max 1) takes one of them. The atomic must still return only after its own.
#[test]
fn blocking_atomic_behind_unpolled_signaled_requests_gets_its_own_value() {
    let (mut mine, mut theirs, mut wmem) = (Words([0u8; 8]), Words([0u8; 8]), [0u8; 64]);
    let f = SoftFabric::new(caps(), RnrRetry::Times(3), RetryCount::new(3).unwrap());
    let mut res = f
        .register(Side::A, &mut mine.0, AccessFlags::LOCAL_WRITE)
        .unwrap();
    let word = f.register(Side::B, &mut theirs.0, ATOMIC).unwrap();
    let wr = f.register(Side::B, &mut wmem, RW).unwrap();
    let (a, _b) = f.ends().unwrap();
    let mut a = Channel::new(a, cfg(2), clock!());
    for round in 0..40u64 {
        for i in 0..(round % 7) {
            let _ = a
                .post_write_inline(&[round as u8; 8], wr.remote().slice(i * 8, 8).unwrap())
                .unwrap();
        }
        a.fetch_add(&mut res.sge_mut(0..8).unwrap(), word.remote(), 1)
            .unwrap();
        assert_eq!(res.load_u64(0), Some(round), "round {round}");
        assert_eq!(a.outstanding_sends(), 0, "round {round}");
        // A batch of one and of several, behind unpolled requests too.
        let _ = a
            .post_write_inline(&[1; 8], wr.remote().slice(0, 8).unwrap())
            .unwrap();
        let mut b = a.batch();
        b.write_inline(&[2; 8], wr.remote().slice(8, 8).unwrap())
            .unwrap();
        b.run().unwrap();
        assert_eq!(a.outstanding_sends(), 0);
    }
    assert_eq!(word.load_u64(0), Some(40));
    assert!(a.fault().is_none());
}

/// An earlier unsignaled request fails at the peer; the blocking atomic after it must come
/// back (as Broken) only once its own request was flushed.
#[test]
fn blocking_atomic_behind_a_failed_unsignaled_write() {
    let (mut mine, mut theirs, mut ro) = (Words([0xAAu8; 8]), Words([0u8; 8]), [0u8; 16]);
    let f = SoftFabric::new(caps(), RnrRetry::Times(3), RetryCount::new(3).unwrap());
    let mut res = f
        .register(Side::A, &mut mine.0, AccessFlags::LOCAL_WRITE)
        .unwrap();
    let word = f.register(Side::B, &mut theirs.0, ATOMIC).unwrap();
    let no_write = f
        .register(Side::B, &mut ro, AccessFlags::LOCAL_WRITE)
        .unwrap();
    let (a, _b) = f.ends().unwrap();
    let mut a = Channel::new(a, cfg(16), clock!());
    let _ = a
        .post_write_inline(&[1; 8], no_write.remote().slice(0, 8).unwrap())
        .unwrap();
    let r = a.fetch_add(&mut res.sge_mut(0..8).unwrap(), word.remote(), 5);
    match r {
        Err(ChannelError::Broken(w)) => assert_eq!(w.wr_id, 0),
        other => panic!("{other:?}"),
    }
    assert_eq!(a.outstanding_sends(), 0);
    assert_eq!(res.load_u64(0), Some(0xAAAA_AAAA_AAAA_AAAA), "untouched");
    assert_eq!(word.load_u64(0), Some(0), "never executed");
}

/// Two channels on one shared CQ: a blocking atomic on one must not lose the other's
/// completions (they go to its mailbox), and the other's tickets still complete.
#[test]
fn shared_cq_neighbour_completions_survive_a_blocking_verb() {
    let (mut mine, mut w1, mut w2) = (Words([0u8; 8]), [0u8; 64], Words([0u8; 8]));
    let net = SoftNet::new(SoftNetConfig::new(3, caps()));
    let mut res = net
        .register(0, &mut mine.0, AccessFlags::LOCAL_WRITE)
        .unwrap();
    let t1 = net.register(1, &mut w1, RW).unwrap();
    let t2 = net.register(2, &mut w2.0, ATOMIC).unwrap();
    let cqs = SharedCqs::new(net.send_cq(0).unwrap(), net.recv_cq(0).unwrap(), 2);
    let (q1, _p1) = net.connect(0, 1).unwrap();
    let (q2, _p2) = net.connect(0, 2).unwrap();
    let mut x = Channel::new(cqs.add(q1).map_err(|(_, e)| e).unwrap(), cfg(1), clock!());
    let mut y = Channel::new(cqs.add(q2).map_err(|(_, e)| e).unwrap(), cfg(1), clock!());
    for round in 0..20u64 {
        let ts: Vec<_> = (0..4)
            .map(|i| {
                x.post_write_inline(&[round as u8; 8], t1.remote().slice(i * 8, 8).unwrap())
                    .unwrap()
            })
            .collect();
        y.fetch_add(&mut res.sge_mut(0..8).unwrap(), t2.remote(), 1)
            .unwrap();
        assert_eq!(res.load_u64(0), Some(round));
        for t in ts {
            x.wait(t).unwrap();
        }
        assert_eq!((x.outstanding_sends(), y.outstanding_sends()), (0, 0));
    }
    assert!(x.fault().is_none() && y.fault().is_none());
}

/// The instant device (extended CQ, `drain` with max 1): a blocking write behind unpolled
/// signaled inline writes ends with everything retired and the waited request's time.
#[cfg(feature = "instant")]
#[test]
fn instant_blocking_write_behind_unpolled_signaled_requests() {
    use rverbs_core::instant::InstantDevice;
    use rverbs_core::provider::Provider;
    let dev = InstantDevice::new();
    let src = dev.region(64, AccessFlags::LOCAL_WRITE);
    let peer = dev.region(64, AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE);
    let caps = QpCaps {
        max_send_wr: 16,
        max_recv_wr: 16,
        max_send_sge: 1,
        max_recv_sge: 1,
        max_inline_data: 64,
    };
    let mut chan = Channel::new(dev.provider_with_timestamps(caps), cfg(2), clock!());
    let mut last = 0;
    for round in 0..50u64 {
        for _ in 0..(round % 6) {
            let _ = chan
                .post_write_inline(&[1; 8], peer.remote().slice(0, 8).unwrap())
                .unwrap();
        }
        chan.write(
            &[src.sge(0..8).unwrap()],
            peer.remote().slice(8, 8).unwrap(),
        )
        .unwrap();
        assert_eq!(chan.outstanding_sends(), 0, "round {round}");
        let c = chan.counters();
        assert_eq!(c.requests_posted, c.requests_completed);
        let t = chan.provider().last_send_timestamp().unwrap().get();
        assert!(t > last, "the waited request's time, rising");
        last = t;
        let s = [src.sge(0..8).unwrap()];
        let mut b = chan.batch();
        for i in 0..5 {
            b.write(&s, peer.remote().slice(i * 8, 8).unwrap()).unwrap();
        }
        b.run().unwrap();
        assert_eq!(chan.outstanding_sends(), 0);
    }
}
