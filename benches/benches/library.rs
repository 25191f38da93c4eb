//! rverbs' own cost per request, against the same work done by hand on raw verbs.
//!
//! Both sides run on the instant device (`rverbs_core::instant`, feature
//! `instant`): a driver behind libibverbs' operations table that completes every request
//! the moment it is posted and never touches memory. So the `rverbs/*` numbers are what the
//! library adds per request (sequence numbers, signaling, scatter/gather checks, building
//! and chaining the `ibv_send_wr` list, taking and converting completions, bookkeeping),
//! plus the driver's own few nanoseconds, which the `raw/*` numbers contain as well: there
//! a hand-written loop builds the same `ibv_send_wr` chains, signals the same requests,
//! posts them through the same `ops.post_send` and polls the same queue with
//! `ops.poll_cq`, as a C program would. The `raw_wr/*` rows post the same requests as a C
//! program on the extended verbs would (`ibv_wr_start`, `wr_id`/`wr_flags`,
//! `ibv_wr_rdma_write`, `ibv_wr_set_sge`/`ibv_wr_set_inline_data`, `ibv_wr_complete`), the
//! entry points rverbs itself posts through on this device. rverbs' overhead over raw verbs
//! is the ratio to the faster of the two.
//!
//! Throughput is in elements of one work request, so every row reads as time per request:
//! - `blocking_write`: one 64-byte write posted and waited for (`Channel::write`);
//! - `unpolled_inline_write`: one 8-byte inline write posted without waiting
//!   (`Channel::post_write_inline`), retired later by a signaled one;
//! - `batch_32`: 32 writes in one post (one doorbell), signaled every 16th and the last,
//!   waited for (`Batch::run`);
//! - `barrier_step`: one barrier of a 2-rank node whose peer has already arrived (the bench
//!   plays the peer's write): one inline notification, one look at the flag;
//! - `progress_idle`: `Node::progress` with nothing to do (one poll of each queue).
//!
//! `cargo bench -p rverbs-benches --bench library`
#![allow(missing_docs)] // criterion_main! generates an undocumented `main`.

use core::hint::black_box;
use core::mem::MaybeUninit;
use core::time::Duration;
use rverbs_core::node::Members;
use rverbs_core::wire::FlagLayout;

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use rverbs_benches::RW;
use rverbs_core::channel::{Channel, ChannelConfig};
use rverbs_core::instant::{InstantDevice, InstantProvider, InstantRegion};
use rverbs_core::memory::AccessFlags;
use rverbs_core::node::Node;
use rverbs_core::params::QpCaps;
use rverbs_core::poll::Spin;
use rverbs_core::provider::shared::SharedCqs;
use rverbs_core::sge::RemoteMemory;
use rverbs_core::verbs::ffi::sys;
use rverbs_std_shim::MONOTONIC;

const MSG: usize = 64;
const BATCH: usize = 32;
/// The channel's default signaling interval, used by both sides.
const SIGNAL_EVERY: u64 = 16;

fn caps() -> QpCaps {
    QpCaps::queues(128, 64)
}

/// A hand-written poster and poller on raw verbs: what a C program does.
struct Raw {
    qp: *mut sys::ibv_qp,
    qpx: *mut sys::ibv_qp_ex,
    cq: *mut sys::ibv_cq,
    chain: [sys::ibv_send_wr; BATCH],
    sge: sys::ibv_sge,
    /// The entry of an inline request (its bytes are copied during the post).
    isge: sys::ibv_sge,
    next: u64,
    done: u64,
}

impl Raw {
    fn new(p: &InstantProvider, sge: (u64, u32, u32)) -> Self {
        // SAFETY: ibv_send_wr is plain C data; zero is a valid value.
        let chain = unsafe { MaybeUninit::zeroed().assume_init() };
        Self {
            qp: p.raw_qp(),
            qpx: p
                .raw_qp_ex()
                .expect("the instant device's QPs are extended"),
            cq: p.raw_send_cq(),
            chain,
            sge: sys::ibv_sge {
                addr: sge.0,
                length: sge.1,
                lkey: sge.2,
            },
            isge: sys::ibv_sge {
                addr: 0,
                length: 0,
                lkey: 0,
            },
            next: 0,
            done: 0,
        }
    }

    /// Fills request `i` of the chain: a write of our entry (or of `inline` bytes) to `to`,
    /// linked behind request `i - 1`.
    #[inline]
    fn build(&mut self, i: usize, to: RemoteMemory, inline: Option<&[u8]>, signaled: bool) {
        let base = self.chain.as_mut_ptr();
        let sg_list = match inline {
            Some(d) => {
                self.isge.addr = d.as_ptr() as u64;
                self.isge.length = d.len() as u32;
                &raw mut self.isge
            }
            None => &raw mut self.sge,
        };
        let mut flags = if inline.is_some() {
            sys::ibv_send_flags::IBV_SEND_INLINE.0
        } else {
            0
        };
        if signaled {
            flags |= sys::ibv_send_flags::IBV_SEND_SIGNALED.0;
        }
        // SAFETY: i < BATCH (the callers' loops), so i and i - 1 are inside the array, and
        // no reference into it is alive.
        unsafe {
            let w = &mut *base.add(i);
            w.wr_id = self.next;
            w.next = core::ptr::null_mut();
            w.sg_list = sg_list;
            w.num_sge = 1;
            w.opcode = sys::ibv_wr_opcode::IBV_WR_RDMA_WRITE;
            w.send_flags = flags;
            w.wr.rdma.remote_addr = to.addr;
            w.wr.rdma.rkey = to.rkey;
            if i > 0 {
                (*base.add(i - 1)).next = w;
            }
        }
        self.next += 1;
    }

    /// A write of our entry (or of `inline` bytes) to `to` inside an `ibv_wr_*` section: the
    /// id and flags, `ibv_wr_rdma_write`, then the data setter.
    #[inline]
    fn wr_write(&mut self, to: RemoteMemory, inline: Option<&[u8]>, signaled: bool) {
        let mut flags = if inline.is_some() {
            sys::ibv_send_flags::IBV_SEND_INLINE.0
        } else {
            0
        };
        if signaled {
            flags |= sys::ibv_send_flags::IBV_SEND_SIGNALED.0;
        }
        let x = self.qpx;
        // SAFETY: the extended QP lives as long as the provider the bench keeps and has these
        // entry points (the instant device sets them); as verbs.h's inline functions, no
        // check. The inline bytes are read during the call only.
        unsafe {
            (*x).wr_id = self.next;
            (*x).wr_flags = flags;
            ((*x).wr_rdma_write.unwrap_unchecked())(x, to.rkey, to.addr);
            match inline {
                Some(d) => ((*x).wr_set_inline_data.unwrap_unchecked())(
                    x,
                    d.as_ptr().cast_mut().cast(),
                    d.len(),
                ),
                None => ((*x).wr_set_sge.unwrap_unchecked())(
                    x,
                    self.sge.lkey,
                    self.sge.addr,
                    self.sge.length,
                ),
            }
        }
        self.next += 1;
    }

    /// `ibv_wr_start`.
    #[inline]
    fn wr_start(&mut self) {
        // SAFETY: as in wr_write.
        unsafe { ((*self.qpx).wr_start.unwrap_unchecked())(self.qpx) }
    }

    /// `ibv_wr_complete`.
    #[inline]
    fn wr_complete(&mut self) {
        // SAFETY: as in wr_write.
        let rc = unsafe { ((*self.qpx).wr_complete.unwrap_unchecked())(self.qpx) };
        assert_eq!(rc, 0, "ibv_wr_complete");
    }

    /// `ibv_post_send` of the chain's first request.
    #[inline]
    fn post(&mut self) {
        let mut bad = core::ptr::null_mut();
        // SAFETY: the QP and its context live as long as the provider the bench keeps; the
        // chain is built and null-terminated; the instant device touches no memory.
        let rc = unsafe {
            let f = (*(*self.qp).context).ops.post_send.expect("post_send");
            f(self.qp, self.chain.as_mut_ptr(), &mut bad)
        };
        assert_eq!(rc, 0, "ibv_post_send");
    }

    /// `ibv_poll_cq` once; retires through each completion's id.
    #[inline]
    fn poll(&mut self) -> usize {
        let mut wc = [const { MaybeUninit::<sys::ibv_wc>::uninit() }; 16];
        // SAFETY: the CQ lives as long as the provider; wc has room for 16 entries.
        let n = unsafe {
            let f = (*(*self.cq).context).ops.poll_cq.expect("poll_cq");
            f(self.cq, 16, wc.as_mut_ptr().cast())
        };
        assert!(n >= 0, "ibv_poll_cq");
        for e in &wc[..n as usize] {
            // SAFETY: the driver wrote the first n entries.
            let e = unsafe { e.assume_init_ref() };
            assert!(e.error().is_none(), "completion status");
            self.done = self.done.max(e.wr_id() + 1);
        }
        n as usize
    }

    /// Polls until everything up to request `seq` is retired.
    #[inline]
    fn wait(&mut self, seq: u64) {
        while self.done <= seq {
            self.poll();
        }
    }
}

fn library(c: &mut Criterion) {
    let dev = InstantDevice::new();
    let src = dev.region(MSG * BATCH, RW);
    let dst = dev.region(MSG * BATCH, RW);
    let g = [src.sge(0..MSG).expect("in bounds")];
    let to = dst.remote().slice(0, MSG as u64).expect("in bounds");
    let word = dst.remote().slice(0, 8).expect("in bounds");
    let sge = (g[0].addr(), g[0].len(), g[0].lkey());
    let mut chan = Channel::new(dev.provider(caps()), ChannelConfig::default(), &MONOTONIC);
    assert_eq!(u64::from(chan.signal_every()), SIGNAL_EVERY);
    let raw_provider = dev.provider(caps());
    let mut raw = Raw::new(&raw_provider, sge);
    let depth = u64::from(caps().max_send_wr) - 1;

    let mut group = c.benchmark_group("library");
    group.throughput(Throughput::Elements(1));
    group.bench_function("rverbs/blocking_write", |b| {
        b.iter(|| chan.write(black_box(&g), to).expect("write"))
    });
    group.bench_function("raw/blocking_write", |b| {
        b.iter(|| {
            let seq = raw.next;
            raw.build(0, black_box(to), None, true);
            raw.post();
            raw.wait(seq);
        })
    });
    group.bench_function("raw_wr/blocking_write", |b| {
        b.iter(|| {
            let seq = raw.next;
            raw.wr_start();
            raw.wr_write(black_box(to), None, true);
            raw.wr_complete();
            raw.wait(seq);
        })
    });
    let data = 7u64.to_le_bytes();
    group.bench_function("rverbs/unpolled_inline_write", |b| {
        b.iter(|| {
            let t = chan
                .post_write_inline(black_box(&data), word)
                .expect("post");
            black_box(t);
        })
    });
    chan.wait_all().expect("drain");
    group.bench_function("raw/unpolled_inline_write", |b| {
        b.iter(|| {
            // Retire before the queue would overflow, as the channel does.
            while raw.next - raw.done >= depth {
                raw.poll();
            }
            let signaled = (raw.next + 1).is_multiple_of(SIGNAL_EVERY);
            raw.build(0, black_box(word), Some(&data), signaled);
            raw.post();
        })
    });
    group.bench_function("raw_wr/unpolled_inline_write", |b| {
        b.iter(|| {
            while raw.next - raw.done >= depth {
                raw.poll();
            }
            let signaled = (raw.next + 1).is_multiple_of(SIGNAL_EVERY);
            raw.wr_start();
            raw.wr_write(black_box(word), Some(&data), signaled);
            raw.wr_complete();
        })
    });
    group.throughput(Throughput::Elements(BATCH as u64));
    let remotes: [RemoteMemory; BATCH] = core::array::from_fn(|i| {
        dst.remote()
            .slice((i * MSG) as u64, MSG as u64)
            .expect("in bounds")
    });
    group.bench_function("rverbs/batch_32", |b| {
        b.iter(|| rverbs_benches::write_batch(&mut chan, &g, &remotes))
    });
    group.bench_function("raw/batch_32", |b| {
        b.iter(|| {
            // Everything before is retired (signaled last), so the whole chain fits.
            for (i, r) in remotes.iter().enumerate() {
                let signaled = (raw.next + 1).is_multiple_of(SIGNAL_EVERY) || i + 1 == BATCH;
                raw.build(i, black_box(*r), None, signaled);
            }
            let last = raw.next - 1;
            raw.post();
            raw.wait(last);
        })
    });
    group.bench_function("raw_wr/batch_32", |b| {
        b.iter(|| {
            raw.wr_start();
            for (i, r) in remotes.iter().enumerate() {
                let signaled = (raw.next + 1).is_multiple_of(SIGNAL_EVERY) || i + 1 == BATCH;
                raw.wr_write(black_box(*r), None, signaled);
            }
            let last = raw.next - 1;
            raw.wr_complete();
            raw.wait(last);
        })
    });
    group.finish();
    drop(raw_provider);

    let mut group = c.benchmark_group("library_node");
    group.throughput(Throughput::Elements(1));
    let (mut node, hand) = two_rank_node(&dev);
    let mut count = 0u64;
    group.bench_function("rverbs/barrier_step", |b| {
        b.iter(|| {
            count += 1;
            // The peer (rank 1) has arrived: its notification count sits in our flags.
            assert!(hand.store_u64(8, count));
            node.barrier_timeout(Members::World, Duration::from_secs(10))
                .expect("barrier");
        })
    });
    let raw_provider = dev.provider(caps());
    let mut raw = Raw::new(&raw_provider, sge);
    let flag = dev.region(64, RW);
    let flag_hand = flag.peer_hand();
    let mut raw_count = 0u64;
    let note = [0u8; 8];
    group.bench_function("raw/barrier_step", |b| {
        b.iter(|| {
            raw_count += 1;
            assert!(flag_hand.store_u64(8, raw_count));
            // Notify the peer with one inline write (signaled every 16th), then look at its
            // flag and retire what completed.
            while raw.next - raw.done >= depth {
                raw.poll();
            }
            let signaled = (raw.next + 1).is_multiple_of(SIGNAL_EVERY);
            raw.build(0, black_box(word), Some(&note), signaled);
            raw.post();
            while flag.load_u64(8) < Some(raw_count) {
                raw.poll();
            }
            raw.poll();
        })
    });
    node.start_messaging_in(dev.region(2 * 64, AccessFlags::LOCAL_WRITE), 2, 64)
        .expect("messaging");
    group.bench_function("rverbs/progress_idle", |b| {
        b.iter(|| node.progress(64, |_| {}).expect("progress"))
    });
    let recv = dev.provider(caps());
    group.bench_function("raw/progress_idle", |b| {
        b.iter(|| {
            black_box(raw.poll());
            black_box(poll_raw_cq(recv.raw_recv_cq()));
        })
    });
    group.finish();
}

/// One `ibv_poll_cq` of up to 16 completions.
fn poll_raw_cq(cq: *mut sys::ibv_cq) -> i32 {
    let mut wc = [const { MaybeUninit::<sys::ibv_wc>::uninit() }; 16];
    // SAFETY: the CQ lives as long as its provider, which the caller keeps.
    unsafe {
        let f = (*(*cq).context).ops.poll_cq.expect("poll_cq");
        f(cq, 16, wc.as_mut_ptr().cast())
    }
}

type InstantNode = Node<
    rverbs_core::provider::shared::RoutedQp<
        rverbs_core::instant::InstantQp,
        rverbs_core::instant::InstantCq,
    >,
    InstantRegion,
    Spin,
>;

/// Rank 0 of a world of 2 on the instant device, and a hand that writes its flags as rank 1
/// would.
fn two_rank_node(dev: &InstantDevice) -> (InstantNode, rverbs_core::instant::PeerHand) {
    let world = 2;
    // The node's queue pair completes into the shared queues it is routed by.
    let (scq, rcq) = (dev.cq(256), dev.cq(256));
    let qp = dev.qp(&scq, &rcq, caps());
    let shared = SharedCqs::new(scq, rcq, 1);
    let routed = shared.add(qp).map_err(|(_, e)| e).expect("route");
    let mut cfg = ChannelConfig::with_timeout(Duration::from_secs(10));
    cfg.rank = Some(1);
    let flags = dev.region(FlagLayout::new(world).len(), RW);
    let hand = flags.peer_hand();
    let window = dev.region(64, RW);
    let peer_flags = vec![flags.remote(), dev.region(64, RW).remote()];
    let node = rverbs_benches::rank_zero(
        world,
        vec![Channel::with_backoff(routed, cfg, Spin, &MONOTONIC)],
        flags,
        window,
        peer_flags,
        &MONOTONIC,
        cfg.timeout,
    );
    (node, hand)
}

criterion_group!(benches, library);
criterion_main!(benches);
