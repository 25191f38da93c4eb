//! The device layer on a real device: discovery, port and GID queries, PD, MR, CQ, and two RC
//! queue pairs connected to each other that move 4 KiB by RDMA WRITE.
#![allow(clippy::std_instead_of_core)] // test code: std is the natural vocabulary here

mod support;

use std::time::Duration;

use rverbs_core::completion::WcStatus;
use rverbs_core::verbs::{AccessFlags, DeviceList, LinkLayer, QpConfig};
use rverbs_core::wire::Endpoint;
use rverbs_core::wr::{Opcode, SendFlags, WorkRequest};

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
fn two_connected_qps_rdma_write_4k() {
    let Some(ctx) = support::open("two_connected_qps_rdma_write_4k") else {
        return;
    };
    let pd = ctx.alloc_pd().unwrap();
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
    let dst = vec![0u8; 4096].into_boxed_slice();
    let src_mr = pd.register(&mut src, AccessFlags::LOCAL_WRITE).unwrap();
    let dst_mr = pd
        .register_shared(dst, AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE)
        .unwrap();

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
