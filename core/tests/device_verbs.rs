//! The device layer on a real device: discovery, port and GID queries, PD, MR, CQ, and two RC
//! queue pairs connected to each other that move 4 KiB by RDMA WRITE.
#![allow(clippy::std_instead_of_core)] // test code: std is the natural vocabulary here

#[macro_use]
mod support;

use std::time::Duration;

use rverbs_core::completion::WcStatus;
use rverbs_core::params::{AckTimeout, RetryCount, RnrRetry, RnrTimer};
use rverbs_core::verbs::{
    AccessFlags, DeviceList, LinkLayer, MemoryRegion, Pd, QpConfig, SharedRegion,
};
use rverbs_core::wire::Endpoint;
use rverbs_core::wr::{Opcode, SendFlags, WorkRequest};

/// `src` registered as a write's source, and as many zeros registered for the peer to write.
fn write_regions<'s>(pd: &Pd, src: &'s mut [u8]) -> (MemoryRegion<'s>, SharedRegion<'static>) {
    let dst = vec![0u8; src.len()].into_boxed_slice();
    let src_mr = pd.register(src, AccessFlags::LOCAL_WRITE).unwrap();
    let dst_mr = pd
        .register_shared(dst, AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE)
        .unwrap();
    (src_mr, dst_mr)
}

#[test]
fn device_is_listed_and_port_is_active() {
    let Some(ctx) = support::open("device_is_listed_and_port_is_active") else {
        return;
    };
    let list = DeviceList::new().unwrap();
    assert!(
        list.find(ctx.name()).is_some(),
        "{} not in {list:?}",
        ctx.name()
    );
    let dev = ctx.query_device().unwrap();
    assert!(dev.phys_port_cnt >= 1);
    assert!(dev.max_qp_wr >= 128 && dev.max_sge >= 4, "{dev:?}");
    let port = ctx.query_port(1).unwrap();
    assert!(port.active, "{port:?}");
    assert!(port.gid_table_len > 0);
    let gids: Vec<_> = ctx.gid_table(1).unwrap().map(Result::unwrap).collect();
    assert!(!gids.is_empty(), "empty GID table");
    let route = ctx.default_route(1).unwrap();
    if port.link_layer == LinkLayer::Ethernet {
        assert!(route.global, "RoCE must route by GID");
        assert!(
            route.gid.is_ipv4_mapped(),
            "expected an IPv4-mapped RoCEv2 GID, got {route:?} of {gids:?}"
        );
    }
    eprintln!(
        "device {} port 1 {:?} active MTU {:?}; route {route:?}",
        ctx.name(),
        port.link_layer,
        port.active_mtu
    );
}

#[test]
fn two_connected_queue_pairs_move_4_kib_by_rdma_write() {
    let (ctx, pd) = setup!("two_connected_queue_pairs_move_4_kib_by_rdma_write");
    let mut cq = ctx.create_cq(64).unwrap();
    let cfg = QpConfig::default();
    let a = pd.create_rc_qp(&cq, &cq, &cfg).unwrap();
    let b = pd.create_rc_qp(&cq, &cq, &cfg).unwrap();
    // Endpoints travel as bytes, as they would between hosts.
    let ea = Endpoint::decode(&a.endpoint().encode()).unwrap();
    let eb = Endpoint::decode(&b.endpoint().encode()).unwrap();
    assert!(ea.global, "rxe is RoCE: endpoints must carry a GID");
    let mut a = a.handshake(&eb).unwrap();
    let _b = b.handshake(&ea).unwrap();

    let mut src = vec![0u8; 4096];
    for (i, x) in src.iter_mut().enumerate() {
        *x = (i * 7 + 3) as u8;
    }
    let expected = src.clone();
    let (src_mr, dst_mr) = write_regions(&pd, &mut src);

    let sges = [src_mr.sge(0..4096).unwrap()];
    let wr = WorkRequest {
        wr_id: 42,
        opcode: Opcode::Write,
        flags: SendFlags::SIGNALED,
        sges: &sges,
        remote: dst_mr.remote(),
    };
    // SAFETY: src_mr and dst_mr outlive the poll below, and neither is touched until then.
    unsafe { a.post_send(&[wr]) }.unwrap();
    let wc = support::poll_n(&mut cq, 1, Duration::from_secs(10));
    assert_eq!(wc[0].wr_id, 42);
    assert_eq!(wc[0].status, WcStatus::Success, "{wc:?}");

    let mut got = vec![0u8; 4096];
    assert!(dst_mr.read_into(0, &mut got));
    assert_eq!(
        got, expected,
        "receiving side does not hold the written bytes"
    );
}

/// Transport settings other than the defaults reach the device and come back from its query
/// unchanged (the check that refuses a device which clamps them reads them with
/// `ibv_query_qp` after RTS): on rxe every code is kept.
#[test]
fn the_device_keeps_the_transport_settings_asked_for() {
    let (ctx, pd) = setup!("the_device_keeps_the_transport_settings_asked_for");
    let cq = ctx.create_cq(16).unwrap();
    let mut cfg = QpConfig::default();
    cfg.ack_timeout = AckTimeout::from_code(18).unwrap();
    cfg.retry_count = RetryCount::new(5).unwrap();
    cfg.rnr_retry = RnrRetry::Times(3);
    cfg.rnr_timer = RnrTimer::from_code(20).unwrap();
    let a = pd.create_rc_qp(&cq, &cq, &cfg).unwrap();
    let b = pd.create_rc_qp(&cq, &cq, &cfg).unwrap();
    let (ea, eb) = (a.endpoint(), b.endpoint());
    let a = a.handshake(&eb);
    let b = b.handshake(&ea);
    assert!(a.is_ok() && b.is_ok(), "{:?} / {:?}", a.err(), b.err());
    // The device answers the query (the check did not pass by being skipped) with the codes
    // asked for.
    let got = a
        .unwrap()
        .transport()
        .unwrap()
        .expect("rxe answers ibv_query_qp");
    assert_eq!(
        (
            got.ack_timeout,
            got.retry_count,
            got.rnr_retry,
            got.rnr_timer
        ),
        (18, 5, 3, 20),
        "{got:?}"
    );
    eprintln!(
        "ack timeout code 18 x 6 tries = {:?}; RNR 3 x code 20 = {:?}",
        cfg.retry_wall_time(),
        cfg.rnr_wall_time()
    );
}

/// Memory that records when it is freed.
struct Tracked {
    mem: Box<[u8]>,
    freed: std::sync::Arc<std::sync::atomic::AtomicBool>,
}

// SAFETY: the boxed slice is owned here, does not move with the struct, and is freed only
// when the struct is dropped.
unsafe impl rverbs_core::memory::OwnedMemory for Tracked {
    fn base(&mut self) -> std::ptr::NonNull<u8> {
        std::ptr::NonNull::from(&mut *self.mem).cast()
    }
    fn size(&self) -> usize {
        self.mem.len()
    }
}

impl Drop for Tracked {
    fn drop(&mut self) {
        self.freed.store(true, std::sync::atomic::Ordering::SeqCst);
    }
}

#[test]
fn remote_access_needs_owned_memory_which_outlives_its_keys() {
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::Arc;
    let Some(ctx) = support::open("remote_access_needs_owned_memory_which_outlives_its_keys")
    else {
        return;
    };
    let pd = ctx.alloc_pd().unwrap();
    // A borrowed slice is for local use only.
    let mut buf = [0u8; 64];
    for remote in [
        AccessFlags::REMOTE_READ,
        AccessFlags::REMOTE_WRITE,
        AccessFlags::REMOTE_ATOMIC,
    ] {
        let e = pd
            .register(&mut buf, AccessFlags::LOCAL_WRITE | remote)
            .unwrap_err();
        assert!(e.to_string().contains("register_shared"), "{e}");
    }
    // Owned memory is freed after its registration is gone, not before.
    let freed = Arc::new(AtomicBool::new(false));
    let mem = Tracked {
        mem: vec![0u8; 4096].into_boxed_slice(),
        freed: freed.clone(),
    };
    let region = pd
        .register_shared(mem, AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE)
        .unwrap();
    assert!(!freed.load(Ordering::SeqCst));
    assert!(region.write_from(0, b"owned"));
    drop(region);
    assert!(
        freed.load(Ordering::SeqCst),
        "dropping the region frees its memory"
    );
    // A leaked region leaks its memory too: the key stays valid over memory nobody reuses.
    let freed2 = Arc::new(AtomicBool::new(false));
    let leaked = pd
        .register_shared(
            Tracked {
                mem: vec![0u8; 4096].into_boxed_slice(),
                freed: freed2.clone(),
            },
            AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE,
        )
        .unwrap();
    std::mem::forget(leaked);
    assert!(!freed2.load(Ordering::SeqCst));
}

#[test]
fn two_qps_on_one_shared_receive_queue_take_their_receives_from_it() {
    let Some(ctx) =
        support::open("two_qps_on_one_shared_receive_queue_take_their_receives_from_it")
    else {
        return;
    };
    let dev = ctx.query_device().unwrap();
    assert!(dev.max_srq > 0 && dev.max_srq_wr >= 8, "{dev:?}");
    let pd = ctx.alloc_pd().unwrap();
    // Asking for more than the device allows is clamped, not refused.
    let big = pd.create_srq(u32::MAX, u32::MAX).unwrap();
    assert_eq!(
        (big.max_wr(), big.max_sge()),
        (dev.max_srq_wr, dev.max_srq_sge)
    );
    drop(big);
    let srq = pd.create_srq(8, 1).unwrap();
    assert!(srq.max_wr() >= 8, "{srq:?}");
    srq.set_limit(2).unwrap();
    let probe = srq.probe();
    let mut send_cq = ctx.create_cq(16).unwrap();
    let mut recv_cq = ctx.create_cq(srq.max_wr()).unwrap();
    let cfg = QpConfig::default();
    let (s1, s2) = (
        pd.create_rc_qp(&send_cq, &send_cq, &cfg).unwrap(),
        pd.create_rc_qp(&send_cq, &send_cq, &cfg).unwrap(),
    );
    let (r1, r2) = (
        pd.create_rc_qp_on_srq(&send_cq, &recv_cq, &srq, &cfg)
            .unwrap(),
        pd.create_rc_qp_on_srq(&send_cq, &recv_cq, &srq, &cfg)
            .unwrap(),
    );
    assert_eq!(
        r1.caps().max_recv_wr,
        0,
        "an SRQ's queue pair has no receive queue"
    );
    let (e1, e2, f1, f2) = (s1.endpoint(), s2.endpoint(), r1.endpoint(), r2.endpoint());
    let (mut s1, mut s2) = (s1.handshake(&f1).unwrap(), s2.handshake(&f2).unwrap());
    let (r1, r2) = (r1.handshake(&e1).unwrap(), r2.handshake(&e2).unwrap());
    assert_eq!(r1.srq_max_wr(), srq.max_wr());

    let mut pool = pd
        .register_shared(
            vec![0u8; 4 * 64].into_boxed_slice(),
            AccessFlags::LOCAL_WRITE,
        )
        .unwrap();
    let sges: Vec<_> = (0..4)
        .map(|i| {
            let e = pool.sge_mut(64 * i..64 * i + 64).unwrap();
            // SAFETY: slot i of the pool, which outlives the receives (see below).
            [unsafe { rverbs_core::sge::Sge::from_raw(e.addr(), e.len(), e.lkey()) }]
        })
        .collect();
    let wrs: Vec<_> = sges
        .iter()
        .enumerate()
        .map(|(i, s)| rverbs_core::wr::RecvRequest {
            wr_id: i as u64,
            sges: s,
        })
        .collect();
    // SAFETY: the pool outlives the receives: it is dropped after the QPs and the SRQ, at
    // the end of the test, and read only after the completions were polled.
    unsafe { srq.post_recv(&wrs) }.unwrap();

    let mut src = *b"from-one........from-two........";
    let src_mr = pd.register(&mut src, AccessFlags::LOCAL_WRITE).unwrap();
    for (i, qp) in [&mut s1, &mut s2].into_iter().enumerate() {
        let sges = [src_mr.sge(16 * i..16 * i + 16).unwrap()];
        let wr = WorkRequest {
            wr_id: 100 + i as u64,
            opcode: Opcode::Send,
            flags: SendFlags::SIGNALED,
            sges: &sges,
            remote: Default::default(),
        };
        // SAFETY: src_mr outlives the send, which is polled below.
        unsafe { qp.post_send(&[wr]) }.unwrap();
        let wc = support::poll_n(&mut send_cq, 1, Duration::from_secs(10));
        assert_eq!(wc[0].status, WcStatus::Success, "{wc:?}");
    }
    let wc = support::poll_n(&mut recv_cq, 2, Duration::from_secs(10));
    // The oldest receives, in arrival order, each naming the queue pair it came in on.
    assert_eq!((wc[0].wr_id, wc[0].qp_num), (0, r1.qp_num()), "{wc:?}");
    assert_eq!((wc[1].wr_id, wc[1].qp_num), (1, r2.qp_num()), "{wc:?}");
    let mut got = [0u8; 16];
    assert!(pool.read_into(0, &mut got));
    assert_eq!(&got, b"from-one........");
    assert!(pool.read_into(64, &mut got));
    assert_eq!(&got, b"from-two........");

    // The queue goes with its last user, not with its handle.
    drop(srq);
    assert!(!probe.is_gone(), "the queue pairs still use it");
    drop((r1, r2));
    assert!(probe.is_gone());
}

/// rxe offers the extended verbs (rdma-core's providers/rxe: `rxe_create_qp_ex` takes
/// `IBV_QP_INIT_ATTR_SEND_OPS_FLAGS` with every send operation rverbs posts on RC, and sends
/// on UD), so both kinds of queue pair post through `ibv_wr_*`; and through them a one-entry
/// write, an inline write, and a write of two entries (which rverbs hands to `ibv_post_send`:
/// rxe's `wr_set_sge_list` miscounts a list's length) each land the bytes they name.
#[test]
fn rxe_queue_pairs_post_through_the_extended_verbs() {
    use rverbs_core::verbs::{PostPath, UdConfig};

    let Some(ctx) = support::open("rxe_queue_pairs_post_through_the_extended_verbs") else {
        return;
    };
    let pd = ctx.alloc_pd().unwrap();
    let mut cq = ctx.create_cq(64).unwrap();
    let cfg = QpConfig::default();
    let a = pd.create_rc_qp(&cq, &cq, &cfg).unwrap();
    let b = pd.create_rc_qp(&cq, &cq, &cfg).unwrap();
    let (ea, eb) = (a.endpoint(), b.endpoint());
    let mut a = a.handshake(&eb).unwrap();
    let b = b.handshake(&ea).unwrap();
    let ud = pd.create_ud_qp(&cq, &cq, &UdConfig::default()).unwrap();
    eprintln!(
        "{}: RC posts through {}; UD through {}",
        ctx.name(),
        a.post_path(),
        ud.post_path()
    );
    if ctx.name().starts_with("rxe") {
        assert_eq!(a.post_path(), PostPath::Extended);
        assert_eq!(b.post_path(), PostPath::Extended);
        assert_eq!(ud.post_path(), PostPath::Extended);
    }

    let mut src: Vec<u8> = (0..256u32).map(|i| (i * 13 + 1) as u8).collect();
    let expected = src.clone();
    let (src_mr, dst_mr) = write_regions(&pd, &mut src);
    let remote = dst_mr.remote();
    let one = [src_mr.sge(0..64).unwrap()];
    let inline = [src_mr.sge(64..72).unwrap()];
    let two = [src_mr.sge(72..100).unwrap(), src_mr.sge(100..160).unwrap()];
    let wrs = [
        WorkRequest {
            wr_id: 1,
            opcode: Opcode::Write,
            flags: SendFlags::SIGNALED,
            sges: &one,
            remote: remote.slice(0, 64).unwrap(),
        },
        WorkRequest {
            wr_id: 2,
            opcode: Opcode::Write,
            flags: SendFlags::SIGNALED | SendFlags::INLINE,
            sges: &inline,
            remote: remote.slice(64, 8).unwrap(),
        },
    ];
    // SAFETY: src_mr and dst_mr outlive the polls below and are not touched until then.
    unsafe { a.post_send(&wrs) }.unwrap();
    let gathered = [WorkRequest {
        wr_id: 3,
        opcode: Opcode::Write,
        flags: SendFlags::SIGNALED,
        sges: &two,
        remote: remote.slice(72, 88).unwrap(),
    }];
    // SAFETY: as above.
    unsafe { a.post_send(&gathered) }.unwrap();
    let wc = support::poll_n(&mut cq, 3, Duration::from_secs(10));
    let mut ids: Vec<_> = wc.iter().map(|c| c.wr_id).collect();
    ids.sort_unstable();
    assert_eq!(ids, [1, 2, 3]);
    assert!(wc.iter().all(|c| c.status == WcStatus::Success), "{wc:?}");
    let mut got = vec![0u8; 160];
    assert!(dst_mr.read_into(0, &mut got));
    assert_eq!(got, expected[..160], "the written bytes");
    let mut rest = vec![0u8; 96];
    assert!(dst_mr.read_into(160, &mut rest));
    assert!(
        rest.iter().all(|&x| x == 0),
        "nothing past what was written"
    );
}
