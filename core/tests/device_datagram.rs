//! Datagrams on a real device, between processes: UD both ways (inline, staged and
//! MTU-sized payloads, the MTU + 1 refused before posting); multicast from one sender to
//! three receivers, every receiver getting every datagram in order and the device sending one
//! packet per datagram (by its own counter, on rxe); a receiver that joins
//! late getting only what follows; leaving stopping delivery; zero allocations per datagram
//! on both sides; dropping queue pairs and endpoints still joined to groups destroys them
//! (nothing left in the kernel, no destroy refused); and, on the verbs layer, answering a
//! datagram through `ibv_init_ah_from_wc`.
//!
//! The peers are child processes: this same test binary running the ignored `child`
//! entry point, driven over its stdin and stdout (endpoints in their wire encoding, as hex,
//! and one command per line). The parent is the sender.
#![allow(clippy::std_instead_of_core)] // test code

#[macro_use]
mod support;

use std::io::BufRead;
use std::process::Command;
use std::time::{Duration, Instant};

use rverbs_core::completion::DatagramCompletion;
use rverbs_core::datagram::{
    memory_needed, Datagram, DatagramConfig, DatagramError, Group, SequenceTracker, Sequencer,
};
use rverbs_core::memory::PageMemory;
use rverbs_core::provider::verbs_ud::VerbsDatagram;
use rverbs_core::verbs::{
    failed_destroys, AccessFlags, AhAttr, Context, OwnedRegion, Pd, UdConfig, GRH_LEN,
    MULTICAST_QPN,
};
use rverbs_core::wire::DatagramEndpoint;
use rverbs_core::wr::{DatagramRequest, RecvRequest, SendFlags};
use support::{allocs, hex, unhex, Peer};

#[global_allocator]
static GLOBAL: support::Counting = support::Counting;

/// Lines of the protocol start with this (libtest prints its own lines on the same stdout).
const TAG: &str = "DGRAM ";
const GROUP: [u8; 4] = [239, 1, 2, 3];
/// Receive slots: the most datagrams a receiver can fall behind by.
// Enough to absorb a receiver descheduled for 200 ms at the multicast test's rate (the VM is
// emulated, and a loaded host starves it): UD drops what finds no receive posted.
const SLOTS: u32 = 1024;

type Endpoint = Datagram<VerbsDatagram, OwnedRegion, Yield, { SLOTS as usize }>;

/// Gives the core away between empty polls: the VM has fewer CPUs than busy processes.
#[derive(Debug, Default)]
struct Yield;

impl rverbs_core::poll::Backoff for Yield {
    fn snooze(&mut self) {
        std::thread::yield_now();
    }
    fn reset(&mut self) {}
}

fn config() -> DatagramConfig {
    let mut c = DatagramConfig::default();
    c.recv_slots = SLOTS;
    c.send_slots = 16;
    c.timeout = Duration::from_secs(10);
    c
}

/// Page memory for an endpoint of `c` on `qp`, registered on `pd` for local writes.
fn endpoint_memory(pd: &Pd, qp: &VerbsDatagram, c: &DatagramConfig) -> OwnedRegion {
    let need = memory_needed(
        rverbs_core::provider::datagram::DatagramProvider::mtu(qp),
        c,
    );
    pd.register_shared(PageMemory::zeroed(need).unwrap(), AccessFlags::LOCAL_WRITE)
        .unwrap()
}

/// A datagram endpoint on `ctx` with enough receive slots for a burst of `SLOTS`.
fn endpoint(ctx: &Context) -> Endpoint {
    let pd = ctx.alloc_pd().unwrap();
    let mut ud = UdConfig::default();
    ud.max_recv_wr = SLOTS;
    ud.max_send_wr = 64;
    let qp = VerbsDatagram::new(ctx, &pd, &ud).unwrap();
    let c = config();
    let mem = endpoint_memory(&pd, &qp, &c);
    Datagram::with_backoff(qp, mem, c, Yield, &support::WALL).unwrap()
}

/// Starts a child process in `role`, called `name` in failures.
fn start(dev: &str, role: &str, name: &str) -> Peer {
    Peer::start("child", TAG, name, dev, &[("RVERBS_DGRAM_ROLE", role)])
}

/// The child's next line, which must carry its endpoint.
fn endpoint_of(p: &mut Peer) -> DatagramEndpoint {
    DatagramEndpoint::decode(&unhex(&p.line("endpoint"))).unwrap()
}

/// Packets the device's port 1 sent, by the device's own counter (rxe has it:
/// `hw_counters/sent_pkts`; other devices name theirs differently): a count of what left
/// that does not come from the endpoint.
fn device_sent_packets(dev: &str) -> Option<u64> {
    std::fs::read_to_string(format!(
        "/sys/class/infiniband/{dev}/ports/1/hw_counters/sent_pkts"
    ))
    .ok()?
    .trim()
    .parse()
    .ok()
}

/// Sends datagrams `first..first + n` of `seq`'s stream to `to`, one every `gap`.
fn send_sequenced(
    ep: &mut Endpoint,
    to: &rverbs_core::datagram::Peer<rverbs_core::verbs::AddressHandle>,
    seq: &mut Sequencer,
    n: u64,
    gap: Duration,
) -> u64 {
    let body = [0x5au8; 48];
    let before = allocs();
    let mut next = Instant::now();
    for _ in 0..n {
        while Instant::now() < next {
            std::hint::spin_loop();
        }
        next += gap;
        let h = seq.stamp();
        ep.send_parts(to, &[&h, &body]).unwrap();
    }
    allocs() - before
}

#[test]
fn ud_both_ways_between_processes_without_allocating() {
    let Some(dev) = support::test_device("ud_both_ways_between_processes_without_allocating")
    else {
        return;
    };
    let ctx = support::open("ud").unwrap();
    let mut me = endpoint(&ctx);
    let mut echo = start(&dev, "echo", "the echo process");
    let theirs = endpoint_of(&mut echo);
    echo.say(&format!("endpoint {}", hex(&me.endpoint().encode())));
    let to = me.peer(&theirs).unwrap();
    let mtu = me.mtu() as usize;
    assert!(
        me.caps().max_inline_data < 100,
        "the 100-byte case goes through a send slot"
    );
    // The MTU + 1 is refused before anything is posted.
    assert_eq!(
        me.send(&to, &vec![0u8; mtu + 1]),
        Err(DatagramError::TooLarge {
            max: mtu as u32,
            got: mtu + 1
        })
    );
    assert_eq!(me.stats().sent, 0);
    let sizes = [8usize, 100, mtu];
    let payloads: Vec<Vec<u8>> = sizes
        .iter()
        .map(|&n| support::pattern(n, n as u8))
        .collect();
    let rounds = 600;
    echo.say(&format!("echo {rounds}"));
    echo.line("echoing");
    let before = allocs();
    let t0 = Instant::now();
    for i in 0..rounds {
        let p = &payloads[i % 3];
        me.send(&to, p).unwrap();
        let d = me.recv().unwrap();
        assert_eq!(d.payload, &p[..], "round {i}");
        assert_eq!((d.source.qpn, d.source.gid), (theirs.qpn, theirs.gid));
        assert_eq!(d.source.group, None);
    }
    let mine = allocs() - before;
    let elapsed = t0.elapsed();
    let theirs_allocs: u64 = echo.line("allocs").parse().unwrap();
    eprintln!(
        "{rounds} round trips (8, 100 and {mtu} bytes) in {elapsed:?}: {:.1} us each; \
         allocations: here {mine}, in the echo process {theirs_allocs}",
        elapsed.as_secs_f64() * 1e6 / rounds as f64
    );
    assert_eq!(mine, 0, "the sender allocated");
    assert_eq!(theirs_allocs, 0, "the echo process allocated");
    assert_eq!(me.stats().received, rounds as u64);
    echo.finish();
}

#[test]
fn multicast_to_three_receivers_in_order_late_joiner_and_leave() {
    let Some(dev) = support::test_device("multicast_to_three_receivers_in_order") else {
        return;
    };
    let ctx = support::open("multicast").unwrap();
    let group = Group::ipv4(GROUP).unwrap();
    let mut me = endpoint(&ctx);
    let to_group = me.group_peer(group).unwrap();
    let mut rx: Vec<Peer> = (0..3)
        .map(|i| start(&dev, "member", &format!("receiver {i}")))
        .collect();
    let mut late = start(&dev, "member", "the late receiver");
    for p in rx.iter_mut() {
        endpoint_of(p);
        p.say("join");
        p.line("joined");
    }
    endpoint_of(&mut late);
    let mut seq = Sequencer::new(1);
    // A modest rate: one datagram every 200 us, well inside what the receivers' 1024 slots
    // absorb while they are descheduled.
    let gap = Duration::from_micros(200);
    let t0 = Instant::now();
    let packets0 = device_sent_packets(&dev);

    // Phase 1: 500 datagrams to the three members; the late receiver has not joined.
    for p in rx.iter_mut() {
        p.say("expect 0 500");
        p.line("waiting");
    }
    late.say("silent 0");
    late.line("waiting");
    let mut sender_allocs = send_sequenced(&mut me, &to_group, &mut seq, 500, gap);
    for p in rx.iter_mut() {
        assert_eq!(p.line("got"), "500 0", "{}: count and allocations", p.name);
    }
    assert_eq!(
        late.line("got"),
        "0 0",
        "a receiver that has not joined gets nothing"
    );

    // Phase 2: the late receiver joins; it gets what follows, from 500 on.
    late.say("join");
    late.line("joined");
    for p in rx.iter_mut().chain([&mut late]) {
        p.say("expect 500 500");
        p.line("waiting");
    }
    sender_allocs += send_sequenced(&mut me, &to_group, &mut seq, 500, gap);
    for p in rx.iter_mut().chain([&mut late]) {
        assert_eq!(p.line("got"), "500 0", "{}", p.name);
    }

    // Phase 3: receiver 0 leaves; the others get everything, it nothing.
    rx[0].say("leave");
    rx[0].line("left");
    rx[0].say("silent 1000");
    rx[0].line("waiting");
    for p in rx[1..].iter_mut().chain([&mut late]) {
        p.say("expect 1000 300");
        p.line("waiting");
    }
    sender_allocs += send_sequenced(&mut me, &to_group, &mut seq, 300, gap);
    for p in rx[1..].iter_mut().chain([&mut late]) {
        assert_eq!(p.line("got"), "300 0", "{}", p.name);
    }
    assert_eq!(
        rx[0].line("got"),
        "0 0",
        "delivery stopped when receiver 0 left"
    );

    // Every receiver has confirmed every datagram, so the device has sent them all; nobody
    // else sent anything meanwhile (the receivers only receive).
    let packets = packets0.zip(device_sent_packets(&dev)).map(|(a, b)| b - a);
    eprintln!(
        "1300 datagrams to 3-4 receivers in {:?}: the device sent {}, \
         {sender_allocs} allocations while sending",
        t0.elapsed(),
        packets.map_or("uncounted packets".to_owned(), |p| format!(
            "{p} packets ({:.2} per datagram)",
            p as f64 / 1300.0
        )),
    );
    if dev.starts_with("rxe") {
        assert_eq!(
            packets,
            Some(1300),
            "one packet per datagram, whatever the number of receivers (rxe's sent_pkts)"
        );
    }
    assert_eq!(me.stats().sent, 1300);
    assert_eq!(sender_allocs, 0, "the sender allocated");
    for p in rx.into_iter().chain([late]) {
        p.finish();
    }
}

/// The verbs layer alone: a datagram between two queue pairs of this process, answered with
/// an address made from its completion and network header (`ibv_init_ah_from_wc`).
#[test]
fn an_address_from_a_completion_answers_the_sender() {
    let (ctx, pd) = setup!("an_address_from_a_completion_answers_the_sender");
    let cfg = UdConfig::default();
    let (scq_a, mut rcq_a) = (ctx.create_cq(16).unwrap(), ctx.create_cq(16).unwrap());
    let (scq_b, mut rcq_b) = (ctx.create_cq(16).unwrap(), ctx.create_cq(16).unwrap());
    let mut a = pd.create_ud_qp(&scq_a, &rcq_a, &cfg).unwrap();
    let mut b = pd.create_ud_qp(&scq_b, &rcq_b, &cfg).unwrap();
    let mut mem = pd
        .register_shared(PageMemory::zeroed(8192).unwrap(), AccessFlags::LOCAL_WRITE)
        .unwrap();
    let route = a.route();
    let to_b = pd
        .create_ah(&AhAttr::global(1, b.route().gid, route.gid_index))
        .unwrap();
    assert!(!b.route().gid.is_multicast());
    // A RoCE address without a GID is refused with a clear error.
    if b.link_layer() == rverbs_core::verbs::LinkLayer::Ethernet {
        assert!(pd.create_ah(&AhAttr::lid(1, 1)).is_err());
    }
    let recv = |qp: &mut rverbs_core::verbs::UdQp, mem: &mut OwnedRegion, at: usize| {
        let e = mem.sge_mut(at..at + 256).unwrap();
        let e = recv_entry(&e);
        // SAFETY: the region outlives the receive, which is polled to completion below
        // before the region is read or dropped.
        unsafe {
            qp.post_recv(&[RecvRequest {
                wr_id: at as u64,
                sges: &[e],
            }])
        }
        .unwrap();
    };
    recv(&mut b, &mut mem, 0);
    recv(&mut a, &mut mem, 4096);
    let sge = [inline_entry(b"hello b")];
    let to = (b.qp_num(), b.qkey());
    let req = inline_send(1, &sge, Some(77), &to_b, to);
    // SAFETY: inline: the bytes are copied during the post.
    unsafe { a.post_send(&[req]) }.unwrap();
    let c = poll_one(&mut rcq_b);
    assert!(c.wc.status.is_success(), "{c:?}");
    assert_eq!(
        (c.src_qp, c.wc.imm, c.wc.byte_len),
        (a.qp_num(), Some(77), 40 + 7)
    );
    let mut grh = [0u8; GRH_LEN];
    assert!(mem.read_into(0, &mut grh));
    let mut got = [0u8; 7];
    assert!(mem.read_into(GRH_LEN, &mut got));
    assert_eq!(&got, b"hello b");
    let back = pd.create_ah_from_wc(1, &c, &grh).unwrap();
    let attr = back.attr();
    assert_eq!(
        attr.global.map(|g| g.dgid),
        Some(route.gid),
        "the sender's GID"
    );
    let sge = [inline_entry(b"hello a")];
    let to = (c.src_qp, a.qkey());
    let req = inline_send(2, &sge, None, &back, to);
    // SAFETY: inline, as above.
    unsafe { b.post_send(&[req]) }.unwrap();
    let c = poll_one(&mut rcq_a);
    assert!(c.wc.status.is_success(), "{c:?}");
    assert_eq!(c.src_qp, b.qp_num());
    let mut got = [0u8; 7];
    assert!(mem.read_into(4096 + GRH_LEN, &mut got));
    assert_eq!(&got, b"hello a");
    // Attaching to and detaching from a group; a unicast GID is no group.
    let g = rverbs_core::gid::Gid::ipv4_multicast([239, 4, 4, 4]).unwrap();
    b.attach_mcast(&g, 0).unwrap();
    b.detach_mcast(&g, 0).unwrap();
    assert_eq!(MULTICAST_QPN, 0xff_ffff);
}

/// The UD queue pairs the kernel holds for this process, by `rdma resource show qp`. Its
/// `pid` is the thread that created the queue pair: counted if that thread is one of ours
/// (`Tgid` in `/proc/<pid>/status`) or gone (then whose it was is unknown, and it stays
/// counted the same way across a test).
fn my_ud_qps() -> usize {
    let out = Command::new("rdma")
        .args(["resource", "show", "qp"])
        .output()
        .expect("the `rdma` tool (iproute2) lists the kernel's queue pairs");
    assert!(out.status.success(), "rdma resource show qp: {out:?}");
    let me = std::process::id().to_string();
    let ours = |tid: &str| match std::fs::read_to_string(format!("/proc/{tid}/status")) {
        Ok(status) => status
            .lines()
            .any(|l| l.split_whitespace().collect::<Vec<_>>() == ["Tgid:", me.as_str()]),
        Err(_) => true,
    };
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter(|l| {
            let w: Vec<&str> = l.split_whitespace().collect();
            w.windows(2).any(|p| p == ["type", "UD"])
                && w.windows(2).any(|p| p[0] == "pid" && ours(p[1]))
        })
        .count()
}

/// The kernel refuses to destroy a queue pair still attached to a multicast group (EBUSY),
/// which would leak it, its completion queues and its protection domain: dropping a `UdQp`
/// detaches it from every group first.
#[test]
fn dropping_an_attached_queue_pair_destroys_it() {
    let Some(ctx) = support::open("dropping_an_attached_queue_pair_destroys_it") else {
        return;
    };
    let (qps, refused) = (my_ud_qps(), failed_destroys());
    {
        let pd = ctx.alloc_pd().unwrap();
        let (s, r) = (ctx.create_cq(16).unwrap(), ctx.create_cq(16).unwrap());
        let mut qp = pd.create_ud_qp(&s, &r, &UdConfig::default()).unwrap();
        for g in [[239, 4, 4, 5], [239, 4, 4, 6], [239, 4, 4, 7]] {
            qp.attach_mcast(&rverbs_core::gid::Gid::ipv4_multicast(g).unwrap(), 0)
                .unwrap();
        }
        // One detached by hand: the drop detaches the other two.
        qp.detach_mcast(
            &rverbs_core::gid::Gid::ipv4_multicast([239, 4, 4, 6]).unwrap(),
            0,
        )
        .unwrap();
        assert_eq!(
            my_ud_qps(),
            qps + 1,
            "the queue pair is listed while it lives"
        );
    }
    assert_eq!(failed_destroys(), refused, "a destroy was refused");
    assert_eq!(
        my_ud_qps(),
        qps,
        "the dropped queue pair is still in the kernel"
    );
}

/// Endpoints joined to groups (attached, and members in the IP layer), some with sends
/// and receives in flight, dropped: no queue pair stays behind, no destroy is refused, and
/// a new endpoint joins the same group and receives on it.
#[test]
fn dropping_joined_endpoints_leaves_no_queue_pair_behind() {
    let Some(ctx) = support::open("dropping_joined_endpoints_leaves_no_queue_pair_behind") else {
        return;
    };
    let group = Group::ipv4([239, 4, 4, 8]).unwrap();
    let (qps, refused) = (my_ud_qps(), failed_destroys());
    for round in 0..4 {
        let mut a = endpoint(&ctx);
        let mut b = endpoint(&ctx);
        a.join(group).unwrap();
        b.join(group).unwrap();
        b.join(Group::ipv4([239, 4, 4, 9]).unwrap()).unwrap();
        assert_eq!(my_ud_qps(), qps + 2, "round {round}");
        if round % 2 == 1 {
            // Work in flight: sends not yet known to have left, receives posted.
            let to = a.group_peer(group).unwrap();
            for _ in 0..3 {
                a.send(&to, &[7u8; 200]).unwrap();
            }
        }
        drop(a);
        drop(b);
        assert_eq!(
            failed_destroys(),
            refused,
            "round {round}: a destroy was refused"
        );
        assert_eq!(
            my_ud_qps(),
            qps,
            "round {round}: a dropped endpoint's queue pair leaked"
        );
    }
    // The group is clean: a new member receives on it.
    let mut rx = endpoint(&ctx);
    let mut tx = endpoint(&ctx);
    rx.join(group).unwrap();
    let to = tx.group_peer(group).unwrap();
    tx.send(&to, b"after").unwrap();
    assert_eq!(rx.recv().unwrap().payload, b"after");
}

/// libibverbs requires a datagram's address handle to come from the queue pair's protection
/// domain: a peer made by an endpoint on another one is refused before posting, by the
/// endpoint with a clear error and by the queue pair itself.
#[test]
fn a_peer_of_another_protection_domain_is_refused() {
    let Some(ctx) = support::open("a_peer_of_another_protection_domain_is_refused") else {
        return;
    };
    // Each endpoint has a protection domain of its own.
    let mut a = endpoint(&ctx);
    let mut b = endpoint(&ctx);
    let to_b = b.peer(&b.endpoint()).unwrap();
    assert_eq!(a.send(&to_b, b"x"), Err(DatagramError::ForeignPeer));
    assert_eq!(a.send(&to_b, &[1u8; 200]), Err(DatagramError::ForeignPeer));
    assert_eq!(a.stats().sent, 0);
    assert!(a.failure().is_none(), "the endpoint goes on");
    let to_b = a.peer(&b.endpoint()).unwrap();
    a.send(&to_b, b"own peer").unwrap();
    assert_eq!(b.recv().unwrap().payload, b"own peer");
    // The queue pair refuses it too.
    let pd = ctx.alloc_pd().unwrap();
    let other = ctx.alloc_pd().unwrap();
    let (s, r) = (ctx.create_cq(16).unwrap(), ctx.create_cq(16).unwrap());
    let mut qp = pd.create_ud_qp(&s, &r, &UdConfig::default()).unwrap();
    let route = qp.route();
    let ah = other
        .create_ah(&AhAttr::global(1, route.gid, route.gid_index))
        .unwrap();
    let sge = [inline_entry(b"no")];
    let to = (qp.qp_num(), qp.qkey());
    let req = inline_send(1, &sge, None, &ah, to);
    // SAFETY: inline: the bytes are copied during the post (which is refused anyway).
    let r = unsafe { qp.post_send(&[req]) };
    assert_eq!(r.map_err(|f| (f.posted, f.errno)), Err((0, 22)));
}

/// A send whose `Peer` (and with it, on the caller's side, the last clone of its address
/// handle) is dropped the moment the call returns, as `ep.send(&ep.peer(..)?, ..)` does: the
/// endpoint keeps the handle until the send completed, so every datagram still goes out to
/// the right queue pair (rxe looks the handle up by number when it executes the send, later
/// than the post).
#[test]
fn a_peer_dropped_right_after_its_send_still_gets_every_datagram() {
    let Some(ctx) = support::open("a_peer_dropped_right_after_its_send_still_gets_every_datagram")
    else {
        return;
    };
    let refused = failed_destroys().ah;
    let mut a = endpoint(&ctx);
    let mut b = endpoint(&ctx);
    let theirs = b.endpoint();
    let n = SLOTS as usize / 2;
    for i in 0..n {
        let body = (i as u32).to_le_bytes();
        // A peer of its own: the caller's handle is dropped right after the post.
        let to = a.peer(&theirs).unwrap();
        a.send(&to, &body).unwrap();
        drop(to);
    }
    a.wait_sent().unwrap();
    assert!(a.failure().is_none(), "{:?}", a.failure());
    for i in 0..n {
        let d = b.recv().unwrap();
        assert_eq!(d.payload, (i as u32).to_le_bytes(), "datagram {i}");
    }
    assert_eq!(a.stats().sent, n as u64);
    drop(a);
    assert_eq!(
        failed_destroys().ah,
        refused,
        "an address handle's destroy was refused"
    );
}

/// An IPv4 group's datagrams are IPv4 packets: an endpoint whose queue pair sends from
/// another GID (rxe's link-local IPv6 GID at index 0) would receive nothing, so joining is
/// refused, by the endpoint and by the provider.
#[test]
fn an_ipv4_group_needs_an_ipv4_route() {
    let (ctx, pd) = setup!("an_ipv4_group_needs_an_ipv4_route");
    let mut ud = UdConfig::default();
    ud.gid_index = Some(0);
    let qp = VerbsDatagram::new(&ctx, &pd, &ud).unwrap();
    let local = rverbs_core::provider::datagram::DatagramProvider::gid(&qp);
    assert!(local.ipv4().is_none(), "GID index 0 is IPv6: {local}");
    let mut c = config();
    c.recv_slots = 8;
    let mem = endpoint_memory(&pd, &qp, &c);
    let mut ep: Datagram<_, _> = Datagram::new(qp, mem, c, &support::WALL).unwrap();
    let group = Group::ipv4([239, 4, 4, 10]).unwrap();
    assert_eq!(
        ep.join(group),
        Err(DatagramError::Ipv4GroupWithoutIpv4Route {
            group: group.gid(),
            local
        })
    );
    assert_eq!(ep.groups().count(), 0);
    // The provider itself refuses too.
    let mut qp = VerbsDatagram::new(&ctx, &pd, &ud).unwrap();
    let e = rverbs_core::provider::datagram::DatagramProvider::join_group(&mut qp, group.gid())
        .unwrap_err();
    assert_eq!(e.errno, 97, "EAFNOSUPPORT: {e}");
    assert_eq!(qp.groups().count(), 0);
}

/// A receive entry from a scatter entry of the same region (same layout).
fn recv_entry<'a>(e: &rverbs_core::sge::SgeMut<'a>) -> rverbs_core::sge::Sge<'a> {
    // SAFETY: the entry names memory of a region with local write access that the test
    // keeps alive and does not touch until the receive completed.
    unsafe { rverbs_core::sge::Sge::from_raw(e.addr(), e.len(), e.lkey()) }
}

/// An inline entry for `data` (copied at post time; no lkey).
/// Request `wr_id`: a signaled inline send of `sge` (an [`inline_entry`]), with `imm`, through
/// `dest` to queue pair `to` (its number and qkey).
fn inline_send<'a, A>(
    wr_id: u64,
    sge: &'a [rverbs_core::sge::Sge<'a>],
    imm: Option<u32>,
    dest: &'a A,
    (remote_qpn, remote_qkey): (u32, u32),
) -> DatagramRequest<'a, A> {
    DatagramRequest {
        wr_id,
        flags: SendFlags::SIGNALED | SendFlags::INLINE,
        sges: sge,
        imm,
        dest,
        remote_qpn,
        remote_qkey,
    }
}

fn inline_entry(data: &[u8]) -> rverbs_core::sge::Sge<'_> {
    // SAFETY: posted only with INLINE, which copies the bytes during the post.
    unsafe { rverbs_core::sge::Sge::from_raw(data.as_ptr() as u64, data.len() as u32, 0) }
}

fn poll_one(cq: &mut rverbs_core::verbs::Cq) -> DatagramCompletion {
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut out = [DatagramCompletion::EMPTY; 1];
    loop {
        if cq.poll_datagrams(&mut out).unwrap() == 1 {
            return out[0];
        }
        assert!(Instant::now() < deadline, "no completion within 10 s");
        std::thread::yield_now();
    }
}

/// The other side, in its own process. Roles: `echo` (answers every datagram, counting its
/// allocations), `member` (joins, leaves and checks what arrives when told).
#[test]
#[ignore = "child-process entry point; the tests above run it"]
fn child() {
    let say = |l: &str| support::say(TAG, l);
    let role = std::env::var("RVERBS_DGRAM_ROLE").unwrap();
    let ctx = support::open("child").expect("the parent passes RVERBS_TEST_DEVICE");
    let mut ep = endpoint(&ctx);
    say(&format!("endpoint {}", hex(&ep.endpoint().encode())));
    let group = Group::ipv4(GROUP).unwrap();
    let mut lines = std::io::stdin().lock().lines();
    let mut tracker = SequenceTracker::for_stream(1);
    while let Some(l) = lines.next() {
        let l = l.unwrap();
        let words: Vec<&str> = l.split(' ').collect();
        match (role.as_str(), words.as_slice()) {
            (_, ["quit"]) => break,
            ("echo", ["endpoint", e]) => {
                let peer = DatagramEndpoint::decode(&unhex(e)).unwrap();
                let n: usize = lines.next().unwrap().unwrap()["echo ".len()..]
                    .parse()
                    .unwrap();
                let back = ep.peer(&peer).unwrap();
                let mut copy = vec![0u8; ep.mtu() as usize];
                say("echoing");
                let before = allocs();
                for _ in 0..n {
                    let d = ep.recv().unwrap();
                    assert_eq!(d.source.qpn, peer.qpn);
                    let len = d.payload.len();
                    copy[..len].copy_from_slice(d.payload);
                    ep.send(&back, &copy[..len]).unwrap();
                }
                say(&format!("allocs {}", allocs() - before));
            }
            ("member", ["join"]) => {
                ep.join(group).unwrap();
                say("joined");
            }
            ("member", ["leave"]) => {
                ep.leave(group).unwrap();
                say("left");
            }
            ("member", ["expect", first, n]) => {
                let (first, n): (u64, u64) = (first.parse().unwrap(), n.parse().unwrap());
                say("waiting");
                let allocs = support::receive_in_order(&mut ep, &mut tracker, group, first, n);
                say(&format!("got {n} {allocs}"));
            }
            ("member", ["silent", _]) => {
                // Nothing may arrive while the parent sends a phase: wait for one datagram
                // for 3 s (the phase takes well under that).
                say("waiting");
                let (got, allocs) = support::receive_within(&mut ep, Duration::from_secs(3));
                say(&format!("got {got} {allocs}"));
            }
            (r, w) => panic!("role {r}: unexpected command {w:?}"),
        }
    }
}
