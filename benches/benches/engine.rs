//! The posting engine over the in-memory provider: what one operation costs in the engine
//! (sequence numbers, signaling, completion bookkeeping) plus the model's own work.
//!
//! Groups whose throughput is in elements report one element per work request, so the
//! `post32` group shows the per-request price of blocking, unpolled and batched posting
//! side by side. The model executes every request inside the post and copies bytes with
//! volatile loops, so absolute numbers are not device numbers; ratios between posting
//! styles are what to read.
#![allow(missing_docs)] // criterion_main! generates an undocumented `main`.

use core::hint::black_box;

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use rverbs_benches::RW;
use rverbs_core::channel::{Channel, ChannelConfig};
use rverbs_core::model::{Side, SoftEnd, SoftFabric};
use rverbs_core::params::{QpCaps, RetryCount, RnrRetry};
use rverbs_core::sge::{RemoteMemory, Sge};
use rverbs_std_shim::MONOTONIC;

/// Bytes per request.
const MSG: usize = 64;
/// Requests per batch.
const N: usize = 32;
/// Deep enough that a 32-request post fits next to the signaling interval.
const DEPTH: u32 = 64;

fn fabric<'m>() -> SoftFabric<'m> {
    let caps = QpCaps::queues(DEPTH, DEPTH).with_sges(2);
    SoftFabric::new(
        caps,
        RnrRetry::Times(7),
        RetryCount::new(7).expect("7 is a retry count"),
    )
}

/// A writer: end A's channel, an entry naming `MSG` source bytes on A, and B's destination
/// region of `N` messages, handed to `bench` (the model's regions borrow buffers that live
/// here).
fn with_writer(bench: impl FnOnce(&mut Channel<SoftEnd<'_>>, [Sge<'_>; 1], RemoteMemory)) {
    let (mut sbuf, mut dbuf) = ([7u8; MSG], vec![0u8; MSG * N]);
    let f = fabric();
    let src = f.register(Side::A, &mut sbuf, RW).expect("register");
    let dst = f.register(Side::B, &mut dbuf, RW).expect("register");
    let (ea, _eb) = f.ends().unwrap();
    let mut a = Channel::new(ea, ChannelConfig::default(), &MONOTONIC);
    bench(&mut a, [src.sge(0..MSG).expect("in bounds")], dst.remote());
}

fn bench_write(c: &mut Criterion) {
    with_writer(|a, g, remote| {
        let mut group = c.benchmark_group("engine");
        group.throughput(Throughput::Elements(1));
        group.bench_function("write_64B_blocking", |b| {
            b.iter(|| a.write(black_box(&g), remote).expect("write"))
        });
        group.finish();
    });
}

fn bench_post32(c: &mut Criterion) {
    with_writer(|a, g, whole| {
        assert!(a.max_post() >= N, "a {N}-request batch must fit one post");
        let remotes: [_; N] = core::array::from_fn(|i| {
            whole
                .slice((i * MSG) as u64, MSG as u64)
                .expect("inside the region")
        });

        let mut group = c.benchmark_group("post32");
        group.throughput(Throughput::Elements(N as u64));
        // 32 posts of one request, each waited for before the next.
        group.bench_function("blocking_x32", |b| {
            b.iter(|| {
                for r in &remotes {
                    a.write(&g, *r).expect("write");
                }
            })
        });
        // 32 posts (doorbells) of one request each, then one wait for all of them.
        group.bench_function("unpolled_x32", |b| {
            b.iter(|| {
                for r in &remotes {
                    let mut batch = a.batch();
                    batch.write(&g, *r).expect("push");
                    // SAFETY: the source and destination regions live (and are not written by
                    // the CPU) for the whole benchmark, and wait_all below polls every request
                    // before this iteration ends.
                    let t = unsafe { batch.post() }.expect("post");
                    black_box(t);
                }
                a.wait_all().expect("wait_all");
            })
        });
        // One post of 32 requests (one doorbell, signaled every k-th), then one wait.
        group.bench_function("batch_1x32", |b| {
            b.iter(|| rverbs_benches::write_batch(a, &g, &remotes))
        });
        group.finish();
    });
}

fn bench_send_recv(c: &mut Criterion) {
    let (mut sbuf, mut rbuf) = ([7u8; MSG], [0u8; MSG]);
    let f = fabric();
    let src = f.register(Side::A, &mut sbuf, RW).expect("register");
    let mut dst = f.register(Side::B, &mut rbuf, RW).expect("register");
    let (ea, eb) = f.ends().unwrap();
    let (mut a, mut b) = (
        Channel::new(ea, ChannelConfig::default(), &MONOTONIC),
        Channel::new(eb, ChannelConfig::default(), &MONOTONIC),
    );
    let g = [src.sge(0..MSG).expect("in bounds")];

    let mut group = c.benchmark_group("engine");
    group.throughput(Throughput::Elements(1));
    // The receiver posts in a scope, the sender's blocking send completes it, the scope
    // waits for the receive: one message, both ends' engine work.
    group.bench_function("scoped_send_recv_64B", |bch| {
        bch.iter(|| {
            let mut rs = [dst.sge_mut(0..MSG).expect("in bounds")];
            b.scope(|s| {
                let p = s.recv(&mut rs)?;
                a.send(&g)?;
                s.wait(p)
            })
            .expect("scope")
            .expect("message")
        })
    });
    group.finish();
}

criterion_group!(benches, bench_write, bench_post32, bench_send_recv);
criterion_main!(benches);
