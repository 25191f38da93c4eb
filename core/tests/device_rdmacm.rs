//! The RDMA connection manager on a real device, between processes: connecting an RC
//! channel by address and port, RDMA writes and sends both ways into the memory each side
//! offered in its connect data, no allocation per transfer on either side once connected,
//! a disconnect from either side seen by the other; a connect to a port nobody listens on
//! refused with a clear error within the timeout, and an accept with nobody connecting
//! ending at its deadline; multicast through `rdma_join_multicast`, one sender and two
//! receivers, every datagram delivered in order, and leaving stopping delivery.
//!
//! The server and the receivers are child processes: this same test binary running the
//! ignored `child` entry point, driven over its stdin and stdout.
#![allow(clippy::std_instead_of_core)] // test code

#[macro_use]
mod support;

use std::io::BufRead;
use std::net::{IpAddr, SocketAddr};
use std::time::{Duration, Instant};

use rverbs_core::channel::{Channel, ChannelConfig, ChannelError, RecvRing};
use rverbs_core::cm::{connect, CmConfig, CmError, CmStep, Connection, Listener};
use rverbs_core::datagram::{
    memory_needed, Datagram, DatagramConfig, Group, SequenceTracker, Sequencer,
};
use rverbs_core::memory::PageMemory;
use rverbs_core::poll::Deadline;
use rverbs_core::provider::verbs_ud::VerbsDatagram;
use rverbs_core::verbs::{AccessFlags, Context, OwnedRegion, Pd, UdConfig};
use support::{allocs, Peer};

#[global_allocator]
static GLOBAL: support::Counting = support::Counting;

/// Lines of the protocol start with this (libtest prints its own lines on the same stdout).
const TAG: &str = "CM ";
const GROUP: [u8; 4] = [239, 1, 2, 5];
/// Ping-pong rounds of writes and sends, counted for allocations.
const ROUNDS: u64 = 500;
/// Bytes each side offers the other to write into.
const WINDOW: usize = 4096;
const SLOT: usize = 64;

/// Spins 64 empty polls, then sleeps 20 us on each further one: the VM has fewer CPUs than
/// busy processes, and the device's kernel threads need one too (the policy README.md
/// recommends there).
#[derive(Debug, Default)]
struct Nap(u32);

impl rverbs_core::poll::Backoff for Nap {
    fn snooze(&mut self) {
        self.0 += 1;
        if self.0 > 64 {
            std::thread::sleep(Duration::from_micros(20));
        }
    }
    fn reset(&mut self) {
        self.0 = 0;
    }
}

type Ring = RecvRing<Connection, OwnedRegion, Nap, 64>;

/// The IPv4 address of the test device's port 1 (its RoCE v2 GID), the one to listen on.
fn device_ip(ctx: &Context) -> IpAddr {
    let gid = ctx.default_route(1).unwrap().gid;
    let v4 = gid
        .ipv4()
        .expect("the test device's default GID has an IPv4 address (RoCE v2)");
    IpAddr::from(v4)
}

fn cm_config(offer: Option<&OwnedRegion>) -> CmConfig {
    let mut c = CmConfig::with_timeout(Duration::from_secs(10));
    if let Some(r) = offer {
        c = c.offering(r.remote());
    }
    c
}

fn region(pd: &Pd, len: usize, access: AccessFlags) -> OwnedRegion {
    pd.register_shared(PageMemory::zeroed(len).unwrap(), access)
        .unwrap()
}

/// The memory a side offers: the peer writes into it.
fn window(pd: &Pd) -> OwnedRegion {
    region(
        pd,
        WINDOW,
        AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE | AccessFlags::REMOTE_READ,
    )
}

/// A channel on a connection, with a ring of receives for the peer's sends.
fn ring(pd: &Pd, conn: Connection) -> Ring {
    let chan = Channel::with_backoff(
        conn,
        ChannelConfig::with_timeout(Duration::from_secs(10)),
        Nap::default(),
        &support::WALL,
    );
    RecvRing::new(chan, region(pd, 16 * SLOT, AccessFlags::LOCAL_WRITE), SLOT).unwrap()
}

/// The 64 bytes written in round `i` by the side `from` (0: client, 1: server).
fn block(i: u64, from: u8) -> [u8; SLOT] {
    let mut b = [0u8; SLOT];
    for (k, x) in b.iter_mut().enumerate() {
        *x = (i as u8).wrapping_mul(7).wrapping_add(k as u8) ^ (from * 0x55);
    }
    b
}

/// Where round `i` writes in a window.
fn at(i: u64) -> u64 {
    (i % (WINDOW / SLOT) as u64) * SLOT as u64
}

/// Starts a child process in `role`, called `name` in failures.
fn start(dev: &str, role: &str, name: &str) -> Peer {
    Peer::start("child", TAG, name, dev, &[("RVERBS_CM_ROLE", role)])
}

#[test]
fn connect_transfer_both_ways_and_disconnect_from_either_side() {
    let Some(dev) = support::test_device("connect_transfer_both_ways_and_disconnect") else {
        return;
    };
    let ctx = support::open("rdmacm client").unwrap();
    let pd = ctx.alloc_pd().unwrap();
    let ip = device_ip(&ctx);
    let mut server = start(&dev, "server", "the server process");
    let port: u16 = server.line("listening").parse().unwrap();
    let to = SocketAddr::new(ip, port);

    // Connection 1: the client disconnects, the server sees it.
    let mine = window(&pd);
    let t0 = Instant::now();
    let conn = connect(&pd, to, &cm_config(Some(&mine)), &support::WALL).unwrap();
    let connect_time = t0.elapsed();
    assert_eq!(conn.peer_addr(), to);
    assert_eq!(conn.local_addr().ip(), ip);
    let theirs = conn.remote_memory().expect("the server offered its window");
    assert_eq!(theirs.len, WINDOW as u64);
    let mut r = ring(&pd, conn);
    server.line("accepted");

    // A large write through a scatter entry first: the whole window, checked by the server.
    let src = region(&pd, WINDOW, AccessFlags::LOCAL_WRITE);
    let big = support::pattern(WINDOW, 3);
    assert!(src.write_from(0, &big));
    r.channel()
        .write(&[src.sge(0..WINDOW).unwrap()], theirs)
        .unwrap();
    r.channel().send_inline(b"big").unwrap();
    assert_eq!(server.line("big"), "ok");

    // Ping-pong: an inline write into the peer's window and a send telling it, both ways.
    server.say(&format!("rounds {ROUNDS}"));
    server.line("echoing");
    let round = |r: &mut Ring, i: u64| {
        let dst = theirs.slice(at(i), SLOT as u64).unwrap();
        r.channel().write_inline(&block(i, 0), dst).unwrap();
        r.channel().send_inline(&i.to_le_bytes()).unwrap();
        let m = r.recv().unwrap();
        assert_eq!(m.data, &i.to_le_bytes(), "round {i}");
        let mut got = [0u8; SLOT];
        assert!(mine.read_into(at(i) as usize, &mut got));
        assert_eq!(got, block(i, 1), "the server's write of round {i}");
    };
    round(&mut r, 0);
    let before = allocs();
    let t1 = Instant::now();
    for i in 1..ROUNDS {
        round(&mut r, i);
    }
    let mine_allocs = allocs() - before;
    let elapsed = t1.elapsed();
    let server_allocs: u64 = server.line("allocs").parse().unwrap();
    eprintln!(
        "connect took {connect_time:?}; {} rounds (write + send each way) in {elapsed:?}: \
         {:.1} us each; allocations: client {mine_allocs}, server {server_allocs}",
        ROUNDS - 1,
        elapsed.as_secs_f64() * 1e6 / (ROUNDS - 1) as f64
    );
    assert_eq!(mine_allocs, 0, "the client allocated");
    assert_eq!(server_allocs, 0, "the server allocated");

    let t2 = Instant::now();
    r.channel().disconnect().unwrap();
    let disconnect_time = t2.elapsed();
    assert!(matches!(
        r.channel().send_inline(b"late"),
        Err(ChannelError::Disconnected { .. })
    ));
    // Disconnecting twice is fine.
    r.channel().disconnect().unwrap();
    assert_eq!(server.line("peer-disconnected"), "ok");
    eprintln!("disconnect took {disconnect_time:?}");
    drop(r);

    // Connection 2: the server disconnects, the client notices by polling.
    let conn = connect(&pd, to, &cm_config(None), &support::WALL).unwrap();
    assert_eq!(
        conn.remote_memory(),
        Some(theirs),
        "the server offers the same window"
    );
    let mut r = ring(&pd, conn);
    server.line("accepted");
    assert!(!r.channel().peer_disconnected().unwrap());
    server.say("disconnect");
    assert_eq!(server.line("disconnected"), "ok");
    let deadline = Instant::now() + Duration::from_secs(10);
    while !r.channel().peer_disconnected().unwrap() {
        assert!(
            Instant::now() < deadline,
            "the server's disconnect not seen in 10 s"
        );
        std::thread::sleep(Duration::from_millis(1));
    }
    assert!(matches!(r.recv(), Err(ChannelError::Disconnected { .. })));
    server.finish();
}

#[test]
fn a_connect_to_a_port_nobody_listens_on_is_refused_and_waits_end() {
    let (ctx, pd) = setup!("a_connect_to_a_port_nobody_listens_on_is_refused");
    let ip = device_ip(&ctx);
    let cfg = CmConfig::with_timeout(Duration::from_secs(5));
    // A port that was free a moment ago, and that nobody listens on any more.
    let port = {
        let l = Listener::bind(&pd, SocketAddr::new(ip, 0), &cfg, &support::WALL).unwrap();
        let at = l.local_addr();
        assert_eq!(at.ip(), ip);
        assert_ne!(at.port(), 0, "port 0 picks a free port");
        at.port()
    };
    let to = SocketAddr::new(ip, port);
    let t0 = Instant::now();
    let e = connect(&pd, to, &cfg, &support::WALL).unwrap_err();
    let took = t0.elapsed();
    eprintln!("refused in {took:?}: {e}");
    assert_eq!(e, CmError::Refused { peer: to });
    assert_eq!(
        e.to_string(),
        format!("connection refused by {to}: nobody listens on that port")
    );
    assert!(took < Duration::from_secs(5), "refused within the timeout");

    // A listener with nobody connecting: the accept ends at its deadline.
    let l = Listener::bind(&pd, SocketAddr::new(ip, 0), &cfg, &support::WALL).unwrap();
    let t0 = Instant::now();
    let deadline = Deadline::after(&support::WALL, Duration::from_millis(300));
    match l.accept_until(deadline) {
        Err(CmError::TimedOut { addr, step, .. }) => {
            assert_eq!(step, CmStep::ConnectRequest);
            assert_eq!(addr, l.local_addr());
        }
        other => panic!("expected a timeout, got {other:?}"),
    }
    let took = t0.elapsed();
    assert!(
        took >= Duration::from_millis(300) && took < Duration::from_secs(3),
        "{took:?}"
    );
}

/// A datagram endpoint whose joins go through the connection manager.
fn cm_endpoint(ctx: &Context) -> Datagram<VerbsDatagram, OwnedRegion, Nap, 256> {
    let pd = ctx.alloc_pd().unwrap();
    let mut ud = UdConfig::default();
    ud.max_recv_wr = 256;
    ud.max_send_wr = 64;
    let qp = VerbsDatagram::new(ctx, &pd, &ud)
        .unwrap()
        .joining_through_cm(Duration::from_secs(10), &support::WALL)
        .unwrap();
    let mut c = DatagramConfig::default();
    c.recv_slots = 256;
    c.timeout = Duration::from_secs(10);
    let need = memory_needed(
        rverbs_core::provider::datagram::DatagramProvider::mtu(&qp),
        &c,
    );
    let mem = region(&pd, need, AccessFlags::LOCAL_WRITE);
    Datagram::with_backoff(qp, mem, c, Nap::default(), &support::WALL).unwrap()
}

#[test]
fn multicast_joined_through_rdmacm_delivers_to_every_receiver() {
    let Some(dev) = support::test_device("multicast_joined_through_rdmacm") else {
        return;
    };
    let ctx = support::open("rdmacm multicast").unwrap();
    let group = Group::ipv4(GROUP).unwrap();
    let mut me = cm_endpoint(&ctx);
    // The sender joins too: its address of the group is the one the join answered with.
    me.join(group).unwrap();
    let joined = me
        .provider()
        .cm_join(group.gid())
        .expect("joined via rdmacm");
    assert_eq!(joined.global.map(|g| g.dgid), Some(group.gid()));
    let to_group = me.group_peer(group).unwrap();
    assert_eq!(to_group.address().attr(), joined);
    let mut rx: Vec<Peer> = (0..2)
        .map(|i| start(&dev, "member", &format!("receiver {i}")))
        .collect();
    for p in rx.iter_mut() {
        p.say("join");
        p.line("joined");
    }
    let mut seq = Sequencer::new(1);
    let body = [0x5au8; 48];
    let gap = Duration::from_micros(200);
    let mut send = |me: &mut Datagram<_, _, _, 256>, n: u64| {
        let before = allocs();
        let mut next = Instant::now();
        for _ in 0..n {
            while Instant::now() < next {
                std::hint::spin_loop();
            }
            next += gap;
            let h = seq.stamp();
            me.send_parts(&to_group, &[&h, &body]).unwrap();
            // The sender is a member too: take its own copies so its slots stay free.
            while me.try_recv().is_some() {}
        }
        allocs() - before
    };
    for p in rx.iter_mut() {
        p.say("expect 0 300");
        p.line("waiting");
    }
    let mut sender_allocs = send(&mut me, 300);
    for p in rx.iter_mut() {
        assert_eq!(p.line("got"), "300 0", "{}: count and allocations", p.name);
    }
    // Receiver 0 leaves through the connection manager: it gets nothing more.
    rx[0].say("leave");
    rx[0].line("left");
    rx[0].say("silent");
    rx[0].line("waiting");
    rx[1].say("expect 300 200");
    rx[1].line("waiting");
    sender_allocs += send(&mut me, 200);
    assert_eq!(rx[1].line("got"), "200 0", "receiver 1");
    assert_eq!(
        rx[0].line("got"),
        "0 0",
        "delivery stopped when receiver 0 left"
    );
    assert_eq!(sender_allocs, 0, "the sender allocated");
    for p in rx {
        p.finish();
    }
}

/// The other side, in its own process. Roles: `server` (listens, accepts, echoes, and
/// disconnects or sees the client's disconnect), `member` (joins and leaves through the
/// connection manager and checks what arrives).
#[test]
#[ignore = "child-process entry point; the tests above run it"]
fn child() {
    let say = |l: &str| support::say(TAG, l);
    let role = std::env::var("RVERBS_CM_ROLE").unwrap();
    let ctx = support::open("child").expect("the parent passes RVERBS_TEST_DEVICE");
    let mut lines = std::io::stdin().lock().lines();
    let mut next = move || lines.next().map(|l| l.unwrap()).unwrap_or_default();
    match role.as_str() {
        "server" => server(&ctx, &say, &mut next),
        "member" => member(&ctx, &say, &mut next),
        r => panic!("unknown role {r}"),
    }
}

fn server(ctx: &Context, say: &dyn Fn(&str), next: &mut dyn FnMut() -> String) {
    let pd = ctx.alloc_pd().unwrap();
    let mine = window(&pd);
    let ip = device_ip(ctx);
    let cfg = cm_config(Some(&mine));
    let l = Listener::bind(&pd, SocketAddr::new(ip, 0), &cfg, &support::WALL).unwrap();
    say(&format!("listening {}", l.local_addr().port()));

    let conn = l.accept().unwrap();
    let theirs = conn.remote_memory().expect("the client offered its window");
    assert_eq!(conn.local_addr().ip(), ip);
    let mut r = ring(&pd, conn);
    say("accepted");
    assert_eq!(r.recv().unwrap().data, b"big");
    let mut got = vec![0u8; WINDOW];
    assert!(mine.read_into(0, &mut got));
    assert_eq!(got, support::pattern(WINDOW, 3), "the client's large write");
    say("big ok");
    let rounds: u64 = next()["rounds ".len()..].parse().unwrap();
    say("echoing");
    let echo = |r: &mut Ring, i: u64| {
        let m = r.recv().unwrap();
        assert_eq!(m.data, &i.to_le_bytes());
        let mut got = [0u8; SLOT];
        assert!(mine.read_into(at(i) as usize, &mut got));
        assert_eq!(got, block(i, 0), "the client's write of round {i}");
        let dst = theirs.slice(at(i), SLOT as u64).unwrap();
        r.channel().write_inline(&block(i, 1), dst).unwrap();
        r.channel().send_inline(&i.to_le_bytes()).unwrap();
    };
    echo(&mut r, 0);
    let before = allocs();
    for i in 1..rounds {
        echo(&mut r, i);
    }
    say(&format!("allocs {}", allocs() - before));
    let deadline = Deadline::after(&support::WALL, Duration::from_secs(10));
    r.channel().wait_disconnect(deadline).unwrap();
    assert!(matches!(
        r.channel().send_inline(b"late"),
        Err(ChannelError::Disconnected { .. })
    ));
    say("peer-disconnected ok");
    drop(r);

    let conn = l.accept().unwrap();
    assert_eq!(
        conn.remote_memory(),
        None,
        "the client offered nothing this time"
    );
    let mut r = ring(&pd, conn);
    say("accepted");
    assert_eq!(next(), "disconnect");
    r.channel().disconnect().unwrap();
    say("disconnected ok");
    assert_eq!(next(), "quit");
}

fn member(ctx: &Context, say: &dyn Fn(&str), next: &mut dyn FnMut() -> String) {
    let group = Group::ipv4(GROUP).unwrap();
    let mut ep = cm_endpoint(ctx);
    let mut tracker = SequenceTracker::for_stream(1);
    loop {
        let l = next();
        let words: Vec<&str> = l.split(' ').collect();
        match words.as_slice() {
            ["quit"] | [""] => break,
            ["join"] => {
                ep.join(group).unwrap();
                assert!(ep.provider().cm_join(group.gid()).is_some());
                say("joined");
            }
            ["leave"] => {
                ep.leave(group).unwrap();
                say("left");
            }
            ["expect", first, n] => {
                let (first, n): (u64, u64) = (first.parse().unwrap(), n.parse().unwrap());
                say("waiting");
                let allocs = support::receive_in_order(&mut ep, &mut tracker, group, first, n);
                say(&format!("got {n} {allocs}"));
            }
            ["silent"] => {
                say("waiting");
                let (got, allocs) = support::receive_within(&mut ep, Duration::from_secs(2));
                say(&format!("got {got} {allocs}"));
            }
            w => panic!("member: unexpected command {w:?}"),
        }
    }
}
