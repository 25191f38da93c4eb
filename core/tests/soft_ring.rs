//! [`RecvRing`] on the in-memory RC model: receives that stay posted across calls, owned
//! memory, and every way a caller could try to make the device write memory that was freed.
#![allow(clippy::std_instead_of_core)]

use std::time::Duration;

use rverbs_core::channel::{Channel, ChannelConfig, ChannelError, RecvRing};
use rverbs_core::completion::WcStatus;
use rverbs_core::memory::AccessFlags;
use rverbs_core::model::{Side, SoftEnd, SoftFabric, SoftRegion};
use rverbs_core::params::{QpCaps, RetryCount, RnrRetry};
use rverbs_core::poll::StaticClock;
use rverbs_testkit::clock;

const LW: AccessFlags = AccessFlags::LOCAL_WRITE;
const RW: AccessFlags = AccessFlags::LOCAL_WRITE.union(AccessFlags::REMOTE_WRITE);

fn fabric<'m>() -> SoftFabric<'m> {
    let caps = QpCaps::queues(16, 8);
    SoftFabric::new(caps, RnrRetry::Times(2), RetryCount::new(2).unwrap())
}

fn cfg() -> ChannelConfig {
    ChannelConfig::with_timeout(Duration::from_millis(50))
}

/// On `f`: a ring of `slot`-byte slots over `ring_mem` on end A, and on end B `peer_mem`
/// registered with `access` and the end itself; the ring's channel reads `clock`.
fn ring_and_peer<'f, 'm>(
    f: &'f SoftFabric<'m>,
    ring_mem: &'m mut [u8],
    peer_mem: &'m mut [u8],
    access: AccessFlags,
    slot: usize,
    clock: StaticClock,
) -> (
    RecvRing<SoftEnd<'f>, SoftRegion<'f>>,
    SoftRegion<'f>,
    SoftEnd<'f>,
) {
    let ring_mem = f.register(Side::A, ring_mem, LW).unwrap();
    let peer_mem = f.register(Side::B, peer_mem, access).unwrap();
    let (a, b) = f.ends().unwrap();
    let ring = RecvRing::new(Channel::new(a, cfg(), clock), ring_mem, slot).unwrap();
    (ring, peer_mem, b)
}

#[test]
fn a_ring_keeps_its_receives_posted_across_many_messages() {
    let (mut ma, mut mb) = ([0u8; 4 * 32], [0u8; 64]);
    let f = fabric();
    let (mut ring, mb_region, b) = ring_and_peer(&f, &mut ma, &mut mb, LW, 32, clock!());
    assert_eq!((ring.slots(), ring.slot_size()), (4, 32));
    let mut sender = Channel::new(b, cfg(), clock!());
    // More messages than slots, in bursts that fill the ring: every slot comes back.
    for round in 0u8..20 {
        for k in 0..3u8 {
            sender.send_inline(&[round, k, 7]).unwrap();
        }
        for k in 0..3u8 {
            let m = ring.recv().unwrap();
            assert_eq!(m.data, &[round, k, 7]);
            assert_eq!(m.done.byte_len, 3);
            assert!(!m.done.written);
        }
        assert!(ring.try_recv().is_none(), "nothing more arrived");
    }
    drop(mb_region);
}

/// A ring reads its next message straight from the one completion it polls; messages that
/// something else polled first (the channel's own `poll`, a `try_recv`) wait in the
/// channel's results and must come out the same, in order, with their immediates, and the
/// ring must keep re-posting every slot either way.
#[test]
fn messages_polled_before_the_ring_asks_come_out_in_order_like_the_rest() {
    let (mut ma, mut mb) = ([0u8; 4 * 32], [0u8; 64]);
    let f = fabric();
    let (mut ring, mb_region, b) = ring_and_peer(&f, &mut ma, &mut mb, LW, 32, clock!());
    let mut sender = Channel::new(b, cfg(), clock!());
    let mut next = 0u32;
    for round in 0u8..12 {
        for k in 0..3u8 {
            assert!(mb_region.write_from(0, &[round, k]));
            let sge = mb_region.sge(0..2).unwrap();
            sender.send_imm(&[sge], next + u32::from(k)).unwrap();
        }
        // Odd rounds: the channel polls all three first, so the ring finds them in the
        // results table; even rounds: the ring polls each itself.
        if round % 2 == 1 {
            assert_eq!(ring.channel().poll().unwrap(), 3);
        }
        for k in 0..3u8 {
            let m = if k == 1 {
                ring.try_recv().expect("arrived").unwrap()
            } else {
                ring.recv().unwrap()
            };
            assert_eq!(m.data, &[round, k]);
            assert_eq!(
                (m.done.byte_len, m.done.imm),
                (2, Some(next + u32::from(k)))
            );
            assert!(!m.done.written);
        }
        next += 3;
        assert!(ring.try_recv().is_none(), "nothing more arrived");
        let c = ring.channel().counters();
        assert_eq!(c.receives_completed, 36 / 12 * u64::from(round + 1));
        // The empty try_recv gave the last slot lent out back: every slot is posted again.
        assert_eq!(ring.channel().outstanding_recvs(), 4);
    }
    drop(mb_region);
}

#[test]
fn a_write_with_immediate_is_an_empty_message_with_its_immediate() {
    let (mut ma, mut mt, mut ms) = ([0u8; 64], [0u8; 16], [5u8; 8]);
    let f = fabric();
    let ra = f.register(Side::A, &mut ma, LW).unwrap();
    let target = f.register(Side::A, &mut mt, RW).unwrap();
    let src = f.register(Side::B, &mut ms, LW).unwrap();
    let (a, b) = f.ends().unwrap();
    let mut ring = RecvRing::new(Channel::new(a, cfg(), clock!()), ra, 16).unwrap();
    let mut sender = Channel::new(b, cfg(), clock!());
    let sges = [src.sge(0..8).unwrap()];
    let mut batch = sender.batch();
    batch.write_imm(&sges, target.remote(), 42).unwrap();
    batch.run().unwrap();
    let m = ring.recv().unwrap();
    assert_eq!(m.data, b"", "no payload bytes in the slot");
    assert!(m.done.written);
    assert_eq!((m.done.imm, m.done.byte_len), (Some(42), 8));
    let mut got = [0u8; 8];
    assert!(target.read_into(0, &mut got));
    assert_eq!(got, [5u8; 8]);
}

#[test]
fn memory_a_peer_could_write_is_refused() {
    let mut m = [0u8; 64];
    let f = fabric();
    let r = f.register(Side::A, &mut m, RW).unwrap();
    let (a, _b) = f.ends().unwrap();
    let e = RecvRing::new(Channel::new(a, cfg(), clock!()), r, 16).unwrap_err();
    assert!(matches!(e, ChannelError::InvalidRing { .. }), "{e:?}");
}

#[test]
fn bad_slot_sizes_are_refused() {
    for (len, slot) in [(64usize, 0usize), (16, 32)] {
        let mut m = vec![0u8; len];
        let f = fabric();
        let r = f.register(Side::A, &mut m, LW).unwrap();
        let (a, _b) = f.ends().unwrap();
        let e = RecvRing::new(Channel::new(a, cfg(), clock!()), r, slot).unwrap_err();
        assert!(matches!(e, ChannelError::InvalidRing { .. }), "{e:?}");
    }
}

#[test]
fn the_ring_is_capped_by_the_receive_queue() {
    let mut m = [0u8; 64 * 16];
    let f = fabric();
    let r = f.register(Side::A, &mut m, LW).unwrap();
    let (a, _b) = f.ends().unwrap();
    let ring = RecvRing::new(Channel::new(a, cfg(), clock!()), r, 16).unwrap();
    assert_eq!(ring.slots(), 8, "max_recv_wr is 8");
}

#[test]
fn a_message_longer_than_a_slot_breaks_the_channel_with_a_length_error() {
    let (mut ma, mut mb) = ([0u8; 32], [0u8; 64]);
    let f = fabric();
    let (mut ring, big, b) = ring_and_peer(&f, &mut ma, &mut mb, LW, 16, clock!());
    let mut sender = Channel::new(b, cfg(), clock!());
    let _ = sender.send(&[big.sge(0..40).unwrap()]);
    match ring.recv() {
        Err(ChannelError::Failed(w)) => assert_eq!(w.status, WcStatus::LocalLength),
        other => panic!("expected a length failure, got {other:?}"),
    }
}

#[test]
fn sends_in_a_scope_do_not_wait_for_the_rings_receives() {
    let (mut ma, mut mt) = ([0u8; 64], [0u8; 16]);
    let f = fabric();
    let (mut ring, target, _b) = ring_and_peer(&f, &mut ma, &mut mt, RW, 16, clock!());
    let remote = target.remote();
    // The ring's four receives stay outstanding; the scope waits only for its own write.
    ring.channel()
        .scope(|s| s.write_inline(b"scoped", remote).map(|_| ()))
        .unwrap()
        .unwrap();
    assert!(ring.channel().fault().is_none());
    assert_eq!(&rverbs_testkit::bytes::<6>(&target, 0), b"scoped");
}

#[test]
fn a_swapped_channel_is_noticed_and_its_ring_memory_never_freed_under_it() {
    let (mut ma, mut mb) = ([0u8; 64], [0u8; 8]);
    let f = fabric();
    let (mut ring, src, b) = ring_and_peer(&f, &mut ma, &mut mb, LW, 16, clock!());
    let f2 = fabric();
    let (other, _o) = f2.ends().unwrap();
    let mut other = Channel::new(other, cfg(), clock!());
    std::mem::swap(ring.channel(), &mut other);
    assert_eq!(ring.recv().unwrap_err(), ChannelError::Replaced);
    assert!(matches!(ring.try_recv(), Some(Err(ChannelError::Replaced))));
    // Dropping the ring leaks its region (the displaced channel still has receives in it),
    // so a message that arrives later still lands in registered memory.
    drop(ring);
    let mut sender = Channel::new(b, cfg(), clock!());
    sender.send(&[src.sge(0..8).unwrap()]).unwrap();
    assert_eq!(other.poll(), Ok(1), "the message landed in a ring slot");
}
