//! The async operations on the software model (host, and under Miri in tools/test-all):
//! every operation moves the bytes; a future dropped at every await point, a forgotten
//! future, `tokio::time::timeout` around an operation, an aborted task and a runtime shut
//! down with operations in flight never release a buffer before the device is done with
//! it; and an operation allocates nothing.
// drop_non_drop: the drops end borrows of the test memory before it is read directly.
#![allow(
    clippy::std_instead_of_core,
    clippy::undocumented_unsafe_blocks,
    clippy::drop_non_drop
)]

use std::cell::Cell;
use std::ops::Range;
use std::pin::Pin;
use std::rc::Rc;
use std::time::Duration;

use rverbs_async::{AsyncChannel, AsyncError, AsyncRing, YieldEvents};
use rverbs_core::channel::{Channel, ChannelConfig, ChannelError, RecvRing};
use rverbs_core::memory::{AccessFlags, Region};
use rverbs_core::params::{QpCaps, RetryCount, RnrRetry};

use rverbs_core::model::{Side, SoftEnd, SoftFabric, SoftRegion};
use rverbs_testkit::{block_on, clock, poll_once, OnDrop};

mod support;

#[global_allocator]
static GLOBAL: rverbs_testkit::Counting = rverbs_testkit::Counting;

const RW: AccessFlags = AccessFlags::LOCAL_WRITE
    .union(AccessFlags::REMOTE_WRITE)
    .union(AccessFlags::REMOTE_READ)
    .union(AccessFlags::REMOTE_ATOMIC);

fn fabric<'m>() -> SoftFabric<'m> {
    let caps = QpCaps::queues(16, 16).with_sges(2);
    SoftFabric::new(caps, RnrRetry::Times(3), RetryCount::new(3).unwrap())
}

/// A region that says when it is dropped (when the async layer released it).
fn tracked(region: SoftRegion<'_>) -> (impl Region + '_, Rc<Cell<bool>>) {
    let dropped = Rc::new(Cell::new(false));
    let flag = dropped.clone();
    (OnDrop::new(region, move |_| flag.set(true)), dropped)
}

/// Memory for atomics: RDMA atomics need 8-aligned words (Miri places plain arrays anywhere).
#[repr(C, align(8))]
struct Aligned([u8; 64]);

fn cfg() -> ChannelConfig {
    ChannelConfig::with_timeout(Duration::from_millis(500))
}

fn bytes(r: &impl Region, range: Range<usize>) -> Vec<u8> {
    let mut b = vec![0; range.len()];
    assert!(r.read_into(range.start, &mut b));
    b
}

#[test]
fn every_operation_moves_the_bytes_and_hands_the_buffer_back() {
    let (mut amem, mut bmem) = (Aligned([0; 64]), Aligned([0; 64]));
    let f = fabric();
    let a_buf = f.register(Side::A, &mut amem.0, RW).unwrap();
    let b_win = f.register(Side::B, &mut bmem.0, RW).unwrap();
    let (ea, eb) = f.ends().unwrap();
    let mut a = AsyncChannel::new(Channel::new(ea, cfg(), clock!()), YieldEvents);
    let mut b: Channel<SoftEnd<'_>> = Channel::new(eb, cfg(), clock!());
    let remote = b_win.remote();

    a_buf.write_from(0, b"async write!");
    let (r, a_buf) = block_on(a.write(a_buf, 0..12, remote));
    r.unwrap();
    assert_eq!(bytes(&b_win, 0..12), b"async write!");

    b_win.write_from(16, b"read me back");
    let (r, a_buf) = block_on(a.read(a_buf, 32..44, remote.slice(16, 12).unwrap()));
    r.unwrap();
    assert_eq!(bytes(&a_buf, 32..44), b"read me back");

    b_win.write_from(48, &7u64.to_le_bytes());
    let word = remote.slice(48, 8).unwrap();
    let (r, a_buf) = block_on(a.fetch_add(a_buf, 56, word, 5));
    assert_eq!(r.unwrap(), 7);
    assert_eq!(b_win.load_u64(48), Some(12));
    let (r, a_buf) = block_on(a.compare_swap(a_buf, 56, word, 12, 99));
    assert_eq!(r.unwrap(), 12);
    assert_eq!(b_win.load_u64(48), Some(99));

    // Two-sided: the peer posts a receive (blocking side), A sends.
    let mut b_recv = b_win;
    let t = {
        let mut s = [b_recv.sge_mut(0..16).unwrap()];
        // SAFETY: the region outlives the wait below, and nothing touches it meanwhile.
        unsafe { b.post_recv(&mut s) }.unwrap()
    };
    a_buf.write_from(0, b"hello via send");
    let (r, a_buf) = block_on(a.send(a_buf, 0..14));
    r.unwrap();
    assert_eq!(b.wait(t).unwrap().byte_len, 14);
    assert_eq!(bytes(&b_recv, 0..14), b"hello via send");

    // A receives what B sends.
    let mut fut = Box::pin(a.recv(a_buf, 0..32));
    assert!(poll_once(fut.as_mut()).is_pending(), "nothing sent yet");
    b_recv.write_from(0, b"reply");
    b.send(&[b_recv.sge(0..5).unwrap()]).unwrap();
    let (r, a_buf) = block_on(fut);
    assert_eq!(r.unwrap().byte_len, 5);
    assert_eq!(bytes(&a_buf, 0..5), b"reply");

    // Refused before posting, the buffer comes back.
    let (r, _a_buf) = block_on(a.write(a_buf, 60..70, remote));
    assert_eq!(
        r.unwrap_err(),
        AsyncError::OutOfBounds {
            start: 60,
            end: 70,
            len: 64
        }
    );
    assert!(!a.has_orphan());
}

/// A receive future dropped after `polls` polls: its buffer stays with the channel until a
/// message completed it, then is released, and the message is in it.
fn drop_recv_after(polls: usize) {
    let (mut amem, mut bmem) = ([0u8; 32], [0u8; 32]);
    let f = fabric();
    let (a_buf, dropped) = tracked(f.register(Side::A, &mut amem, RW).unwrap());
    let b_buf = f.register(Side::B, &mut bmem, RW).unwrap();
    let (ea, eb) = f.ends().unwrap();
    let mut a = AsyncChannel::new(Channel::new(ea, cfg(), clock!()), YieldEvents);
    let mut b: Channel<SoftEnd<'_>> = Channel::new(eb, cfg(), clock!());
    {
        let mut fut = Box::pin(a.recv(a_buf, 0..32));
        for _ in 0..polls {
            assert!(poll_once(fut.as_mut()).is_pending());
        }
    }
    if polls == 0 {
        // Never polled: nothing was posted, the buffer went with the future.
        assert!(dropped.get() && !a.has_orphan());
        return;
    }
    assert!(
        a.has_orphan(),
        "the posted receive keeps its buffer in the channel"
    );
    assert!(
        !dropped.get(),
        "released while the device may still write it"
    );
    b_buf.write_from(0, b"landed in an orphan");
    b.send(&[b_buf.sge(0..19).unwrap()]).unwrap();
    assert!(!dropped.get());
    block_on(a.settle()).unwrap();
    assert!(dropped.get() && !a.has_orphan());
    drop(a);
    drop(b);
    drop(b_buf);
    drop(f);
    assert_eq!(&amem[..19], b"landed in an orphan");
}

#[test]
fn a_receive_dropped_at_every_await_point_keeps_its_buffer_until_the_message() {
    for polls in 0..4 {
        drop_recv_after(polls);
    }
}

#[test]
fn a_write_dropped_at_every_await_point_is_completed_before_the_next_operation() {
    for polls in 0..4 {
        let (mut amem, mut bmem, mut small) = ([0u8; 32], [0u8; 32], [0u8; 8]);
        let f = fabric();
        let (a_buf, dropped) = tracked(f.register(Side::A, &mut amem, RW).unwrap());
        let (a2, _) = tracked(f.register(Side::A, &mut small, RW).unwrap());
        let b_win = f.register(Side::B, &mut bmem, RW).unwrap();
        let (ea, _eb) = f.ends().unwrap();
        let mut a = AsyncChannel::new(Channel::new(ea, cfg(), clock!()), YieldEvents);
        a_buf.write_from(0, b"written after all");
        {
            let mut fut = Box::pin(a.write(a_buf, 0..17, b_win.remote()));
            for _ in 0..polls {
                if poll_once(fut.as_mut()).is_ready() {
                    break;
                }
            }
        }
        if polls > 0 {
            assert!(a.has_orphan() || dropped.get());
        }
        // The next operation settles the orphan first.
        let (r, _a2) = block_on(a.write(a2, 0..8, b_win.remote().slice(24, 8).unwrap()));
        r.unwrap();
        assert!(dropped.get() && !a.has_orphan());
        if polls > 0 {
            assert_eq!(bytes(&b_win, 0..17), b"written after all");
        }
    }
}

#[test]
fn a_forgotten_future_leaves_its_buffer_with_the_channel() {
    let (mut amem, mut bmem) = ([0u8; 32], [0u8; 32]);
    let f = fabric();
    let (a_buf, dropped) = tracked(f.register(Side::A, &mut amem, RW).unwrap());
    let b_buf = f.register(Side::B, &mut bmem, RW).unwrap();
    let (ea, eb) = f.ends().unwrap();
    let mut a = AsyncChannel::new(Channel::new(ea, cfg(), clock!()), YieldEvents);
    let mut b: Channel<SoftEnd<'_>> = Channel::new(eb, cfg(), clock!());
    let mut fut = Box::pin(a.recv(a_buf, 0..32));
    assert!(poll_once(fut.as_mut()).is_pending());
    // Forget it: its destructor never runs, its borrow of `a` ends. (The box's memory is
    // reclaimed without dropping the future, as a leak would never, so Miri sees no leak.)
    let boxed = unsafe { Pin::into_inner_unchecked(fut) };
    let layout = std::alloc::Layout::for_value(&*boxed);
    let raw = Box::into_raw(boxed).cast::<u8>();
    assert!(a.has_orphan() && !dropped.get());
    b_buf.write_from(0, b"to the forgotten");
    b.send(&[b_buf.sge(0..16).unwrap()]).unwrap();
    block_on(a.settle()).unwrap();
    assert!(dropped.get());
    unsafe { std::alloc::dealloc(raw, layout) };
    drop(a);
    drop(b);
    drop(b_buf);
    drop(f);
    assert_eq!(&amem[..16], b"to the forgotten");
}

#[test]
fn dropping_the_channel_with_an_orphan_drains_before_the_buffer_goes() {
    let (mut amem, mut bmem) = ([0u8; 32], [0u8; 32]);
    let f = fabric();
    let (a_buf, dropped) = tracked(f.register(Side::A, &mut amem, RW).unwrap());
    let _b_buf = f.register(Side::B, &mut bmem, RW).unwrap();
    let (ea, _eb) = f.ends().unwrap();
    let mut a = AsyncChannel::new(Channel::new(ea, cfg(), clock!()), YieldEvents);
    {
        let mut fut = Box::pin(a.recv(a_buf, 0..32));
        assert!(poll_once(fut.as_mut()).is_pending());
    }
    assert!(!dropped.get());
    // Nobody sends: the drop waits for the receive until the channel's timeout (on the step
    // clock), flushes the queue pair, drains, and only then releases the buffer.
    drop(a);
    assert!(dropped.get());
}

#[test]
fn a_receive_ring_loses_nothing_when_its_receive_is_abandoned() {
    let (mut amem, mut bmem) = ([0u8; 64], [0u8; 64]);
    let f = fabric();
    let a_ring_mem = f
        .register(Side::A, &mut amem, AccessFlags::LOCAL_WRITE)
        .unwrap();
    let b_buf = f.register(Side::B, &mut bmem, RW).unwrap();
    let (ea, eb) = f.ends().unwrap();
    let ring = RecvRing::new(Channel::new(ea, cfg(), clock!()), a_ring_mem, 16).unwrap();
    let mut a = AsyncRing::new(ring, YieldEvents);
    let mut b: Channel<SoftEnd<'_>> = Channel::new(eb, cfg(), clock!());
    for _ in 0..3 {
        let mut fut = Box::pin(a.recv_with(|m| m.data.to_vec()));
        assert!(poll_once(fut.as_mut()).is_pending());
    }
    b_buf.write_from(0, b"kept");
    b.send(&[b_buf.sge(0..4).unwrap()]).unwrap();
    assert_eq!(block_on(a.recv_with(|m| m.data.to_vec())).unwrap(), b"kept");
}

#[test]
fn tokio_timeout_around_a_receive_then_the_message_arrives() {
    let (mut amem, mut bmem) = ([0u8; 32], [0u8; 32]);
    let f = fabric();
    let (a_buf, dropped) = tracked(f.register(Side::A, &mut amem, RW).unwrap());
    let b_buf = f.register(Side::B, &mut bmem, RW).unwrap();
    let (ea, eb) = f.ends().unwrap();
    // The channel's own bound (on the step clock) is far beyond tokio's 5 ms, so tokio's
    // timeout is what ends the wait.
    let long = ChannelConfig::with_timeout(Duration::from_secs(3600));
    let mut a = AsyncChannel::new(Channel::new(ea, long, clock!()), YieldEvents);
    let mut b: Channel<SoftEnd<'_>> = Channel::new(eb, cfg(), clock!());
    let rt = support::runtime();
    assert!(
        support::tokio_timeout_fires(&rt, a.recv(a_buf, 0..32)),
        "nothing was sent: the timeout fires"
    );
    assert!(a.has_orphan() && !dropped.get());
    b_buf.write_from(0, b"late");
    b.send(&[b_buf.sge(0..4).unwrap()]).unwrap();
    rt.block_on(a.settle()).unwrap();
    assert!(dropped.get());
    drop(a);
    drop(b);
    drop(b_buf);
    drop(f);
    assert_eq!(&amem[..4], b"late");
}

#[test]
fn an_aborted_task_and_a_runtime_shut_down_release_buffers_only_after_the_drain() {
    for shutdown in [false, true] {
        // tokio tasks are 'static: memory and fabric are leaked for the test, and reclaimed
        // at its end.
        let amem: *mut [u8] = Box::into_raw(vec![0u8; 32].into_boxed_slice());
        let bmem: *mut [u8] = Box::into_raw(vec![0u8; 32].into_boxed_slice());
        let fab: *mut SoftFabric<'static> = Box::into_raw(Box::new(fabric()));
        let f: &'static SoftFabric<'static> = unsafe { &*fab };
        let (a_buf, dropped) = tracked(f.register(Side::A, unsafe { &mut *amem }, RW).unwrap());
        let b_buf = f.register(Side::B, unsafe { &mut *bmem }, RW).unwrap();
        let (ea, _eb) = f.ends().unwrap();
        support::end_a_waiting_task(
            shutdown,
            |posted| async move {
                let mut a = AsyncChannel::new(Channel::new(ea, cfg(), clock!()), YieldEvents);
                posted.set(true);
                // Nobody sends: this waits until it is aborted or the runtime goes.
                let _ = a.recv(a_buf, 0..32).await;
            },
            || assert!(!dropped.get(), "in flight"),
        );
        // Dropping the task dropped the channel, which waited for the receive until its
        // timeout, flushed and drained, and only then released the buffer.
        assert!(dropped.get());
        drop(b_buf);
        // SAFETY: every region and end borrowed from these is gone.
        unsafe {
            drop(Box::from_raw(fab));
            drop(Box::from_raw(amem));
            drop(Box::from_raw(bmem));
        }
    }
}

#[test]
fn an_operation_allocates_nothing() {
    let (mut amem, mut bmem) = (Aligned([0; 64]), Aligned([0; 64]));
    let f = fabric();
    let mut a_buf = Some(f.register(Side::A, &mut amem.0, RW).unwrap());
    let b_win = f.register(Side::B, &mut bmem.0, RW).unwrap();
    let (ea, _eb) = f.ends().unwrap();
    let mut a = AsyncChannel::new(Channel::new(ea, cfg(), clock!()), YieldEvents);
    let remote = b_win.remote();
    let mut buf = a_buf.take().unwrap();
    let mut before = 0;
    for i in 0..51 {
        if i == 1 {
            before = rverbs_testkit::allocs(); // after a warm-up round
        }
        let (r, b) = block_on(a.write(buf, 0..32, remote));
        r.unwrap();
        let (r, b) = block_on(a.fetch_add(b, 40, remote.slice(40, 8).unwrap(), 1));
        r.unwrap();
        buf = b;
    }
    assert_eq!(
        rverbs_testkit::allocs() - before,
        0,
        "allocations in 100 operations"
    );
    assert_eq!(b_win.load_u64(40), Some(51));
    let _: Option<ChannelError> = a.channel().fault();
}
