//! Endpoint exchange on 127.0.0.1, each rank on its own thread, plus fake peers and fake
//! rendezvous that misbehave on purpose, and the session watch that follows an exchange.
//! One test binary of a module per theme: every test drives the same loopback harness
//! (ports, options, fake clients and roots, kept here), and one integration-test binary
//! links and starts once, which keeps the host-test step of CI short.

use core::sync::atomic::{AtomicBool, Ordering};
use core::time::Duration;
use rverbs_bootstrap::ExchangeError;
use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::Arc;
use std::thread;
use std::time::Instant;

use rverbs_bootstrap::wire::{self, FrameKind, Header, HEADER_LEN};
use rverbs_bootstrap::{
    exchange, exchange_at, BootstrapError, ClusterConfig, ExchangeOptions, JobSecret, NodeBlobs,
    RankConfig, Rendezvous, Session, WireError,
};
use rverbs_core::params::{Mtu, Psn};
use rverbs_core::sge::RemoteMemory;
use rverbs_core::wire::node::{node_blob_len, NodeBlob, ADDRESSED_BLOB_LEN};
use rverbs_core::wire::Endpoint;

mod floods;
mod hostile_peers;
mod hostile_root;
mod node_blobs;
mod secrets;
mod watch;
mod worlds;

type Outcome = Result<(Session, Vec<Vec<u8>>), BootstrapError>;

fn quick() -> ExchangeOptions {
    ExchangeOptions {
        job_id: 0x5eed,
        timeout: Duration::from_secs(2),
        io_timeout: Duration::from_secs(1),
        retry_interval: Duration::from_millis(20),
        progress: false,
        ..ExchangeOptions::default()
    }
}

/// Distinct bytes per rank, with varying length (rank 1 has none).
fn blob_of(rank: u32) -> Vec<u8> {
    if rank == 1 {
        return Vec::new();
    }
    (0..(rank as usize * 7 + 3))
        .map(|i| (i as u32 ^ rank.wrapping_mul(0x9e37)) as u8)
        .collect()
}

fn listener() -> (TcpListener, u16) {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    (listener, port)
}

fn at(port: u16) -> Rendezvous {
    Rendezvous::Address {
        host: "127.0.0.1".to_owned(),
        port,
    }
}

/// Runs rank 0 on `listener` and ranks `1..n` (except those in `skip`) on threads.
fn run_ranks(
    n: u32,
    skip: &[u32],
    options: &ExchangeOptions,
    blob: fn(u32) -> Vec<u8>,
) -> Vec<Option<Outcome>> {
    let (listener, port) = listener();
    let mut handles = Vec::new();
    for rank in 0..n {
        if skip.contains(&rank) {
            handles.push(None);
            continue;
        }
        let options = options.clone();
        let rendezvous = rendezvous_of(rank, &listener, port);
        handles.push(Some(thread::spawn(move || {
            exchange_at(rendezvous, rank, n, &blob(rank), &options)
        })));
    }
    drop(listener);
    handles
        .into_iter()
        .map(|handle| handle.map(|handle| handle.join().unwrap()))
        .collect()
}

fn assert_full_exchange(n: u32) -> Vec<Session> {
    let outcomes = run_ranks(n, &[], &quick_long(), blob_of);
    let expected: Vec<Vec<u8>> = (0..n).map(blob_of).collect();
    let mut sessions = Vec::new();
    for (rank, outcome) in outcomes.into_iter().enumerate() {
        let (session, blobs) = outcome.unwrap().unwrap_or_else(|error| panic!("{error}"));
        assert_eq!(session.rank(), rank as u32);
        assert_eq!(session.world_size(), n);
        assert_eq!(blobs, expected, "rank {rank}");
        sessions.push(session);
    }
    sessions
}

/// Generous deadline for the success cases on a loaded 2-core machine.
fn quick_long() -> ExchangeOptions {
    ExchangeOptions {
        timeout: Duration::from_secs(20),
        io_timeout: Duration::from_secs(10),
        ..quick()
    }
}

fn frame(kind: FrameKind, job_id: u64, sender: u32, world: u32, payload: &[u8]) -> Vec<u8> {
    wire::encode_frame(kind, job_id, sender, world, payload).unwrap()
}

/// `bytes` as a client without a secret sends them: after its challenge.
fn from_client(bytes: &[u8]) -> Vec<u8> {
    let mut out = frame(
        FrameKind::Challenge,
        0x5eed,
        1,
        2,
        &[0x17; wire::CHALLENGE_LEN],
    );
    out.extend_from_slice(bytes);
    out
}

/// Reads one frame (without checking its MAC, if it has one), or `None` if the
/// connection ends first.
fn read_frame(stream: &mut TcpStream) -> Option<(Header, Vec<u8>)> {
    read_raw_frame(stream).map(|(header, payload, _)| (header, payload))
}

/// Reads one frame whole: header, payload and MAC, if any.
fn read_raw_frame(stream: &mut TcpStream) -> Option<(Header, Vec<u8>, Vec<u8>)> {
    stream
        .set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    let mut head = [0u8; HEADER_LEN];
    stream.read_exact(&mut head).ok()?;
    let header = wire::decode_header(&head).unwrap();
    let mut payload = vec![0; header.payload_len as usize];
    stream.read_exact(&mut payload).ok()?;
    let mut mac = vec![0; if header.mac { wire::MAC_LEN } else { 0 }];
    stream.read_exact(&mut mac).ok()?;
    let mut whole = head.to_vec();
    whole.extend_from_slice(&payload);
    whole.extend_from_slice(&mac);
    Some((header, payload, whole))
}

/// Rank 0's answer to a client: the next frame after its challenge.
fn answer(stream: &mut TcpStream) -> Option<(Header, Vec<u8>)> {
    loop {
        let (header, payload) = read_frame(stream)?;
        if header.kind != FrameKind::Challenge {
            return Some((header, payload));
        }
    }
}

fn reject_reason(stream: &mut TcpStream) -> String {
    let (header, payload) = answer(stream).expect("a Reject frame");
    assert_eq!(header.kind, FrameKind::Reject);
    String::from_utf8(payload).unwrap()
}

/// Starts rank 0 of a world of `n` on a thread; returns its port and handle.
fn root(n: u32, options: ExchangeOptions) -> (u16, thread::JoinHandle<(Outcome, Duration)>) {
    root_with(n, options, b"root".to_vec())
}

/// As [`root`], with rank 0's blob.
fn root_with(
    n: u32,
    options: ExchangeOptions,
    blob: Vec<u8>,
) -> (u16, thread::JoinHandle<(Outcome, Duration)>) {
    let (listener, port) = listener();
    let handle = thread::spawn(move || {
        let start = Instant::now();
        let outcome = exchange_at(Rendezvous::Listener(listener), 0, n, &blob, &options);
        (outcome, start.elapsed())
    });
    (port, handle)
}

/// Rank 0's outcome must be a timeout naming `missing`, within the deadline.
fn expect_root_timeout(handle: thread::JoinHandle<(Outcome, Duration)>, missing: &[u32]) -> String {
    let (outcome, took) = handle.join().unwrap();
    let err = outcome.unwrap_err();
    match &err {
        BootstrapError::Exchange(ExchangeError::Timeout {
            rank: 0,
            missing: got,
            ..
        }) => assert_eq!(got, missing, "{err}"),
        other => panic!("expected a rank-0 timeout, got {other:?}"),
    }
    assert!(took < Duration::from_secs(5), "took {took:?}");
    err.to_string()
}

/// A challenge without a MAC, as a rank 0 without a secret sends it.
fn plain_challenge() -> Vec<u8> {
    frame(
        FrameKind::Challenge,
        0x5eed,
        0,
        2,
        &[0x42; wire::CHALLENGE_LEN],
    )
}

/// A fake rank 0 (without a secret) that sends its challenge, reads the hello
/// and then runs `act` on the connection.
fn fake_root(
    act: impl FnOnce(&mut TcpStream, Header) + Send + 'static,
) -> (u16, thread::JoinHandle<()>) {
    let (listener, port) = listener();
    let handle = thread::spawn(move || {
        let (mut stream, _) = listener.accept().unwrap();
        stream.write_all(&plain_challenge()).unwrap();
        let (challenge, _) = read_frame(&mut stream).unwrap();
        assert_eq!(challenge.kind, FrameKind::Challenge);
        let (header, _) = read_frame(&mut stream).unwrap();
        assert_eq!(header.kind, FrameKind::Hello);
        act(&mut stream, header);
    });
    (port, handle)
}

/// Writes a table frame of `entries` from rank 0 of 2 under `job_id`: what a fake rank 0
/// answers with.
fn send_table<E: AsRef<[u8]>>(stream: &mut TcpStream, job_id: u64, entries: &[E]) {
    let table = wire::encode_table(entries).unwrap();
    stream
        .write_all(&frame(FrameKind::Table, job_id, 0, 2, &table))
        .unwrap();
}

/// The rendezvous of `rank`: rank 0 listens on (a clone of) `listener`, the others connect
/// to `port`.
fn rendezvous_of(rank: u32, listener: &TcpListener, port: u16) -> Rendezvous {
    if rank == 0 {
        Rendezvous::Listener(listener.try_clone().unwrap())
    } else {
        at(port)
    }
}

/// [`quick`] with a shorter `timeout` and `io_timeout`: for tests that expect one.
fn quick_within(timeout: Duration, io_timeout: Duration) -> ExchangeOptions {
    ExchangeOptions {
        timeout,
        io_timeout,
        ..quick()
    }
}

fn peer_error(port: u16) -> (BootstrapError, Duration) {
    let start = Instant::now();
    let err = exchange_at(at(port), 1, 2, b"one", &quick()).unwrap_err();
    (err, start.elapsed())
}

/// `peer` (rank 1's side, given the port) against a rank 0 that plays `act`; what `peer`
/// returns, once the fake rank 0 has finished.
fn against_fake_root<T>(
    act: impl FnOnce(&mut TcpStream, Header) + Send + 'static,
    peer: impl FnOnce(u16) -> T,
) -> T {
    let (port, fake) = fake_root(act);
    let got = peer(port);
    fake.join().unwrap();
    got
}

/// A rank 0 that breaks the protocol: after reading the peer's hello it plays `act`; the
/// peer's error must be one `refused` accepts.
struct BadRoot {
    /// The case, as a failure names it.
    case: &'static str,
    act: fn(&mut TcpStream, Header),
    refused: fn(&BootstrapError) -> bool,
}

/// Runs `peer` (rank 1's side, given the port) against each bad rank 0 in turn; each must end
/// in the error its case expects, and a failure names the case.
fn assert_each_refused(cases: &[BadRoot], peer: fn(u16) -> BootstrapError) {
    for c in cases {
        let err = against_fake_root(c.act, peer);
        assert!((c.refused)(&err), "{}: {err:?}", c.case);
    }
}

/// The wire error behind `err`, if it is a protocol failure.
fn wire_error(err: &BootstrapError) -> Option<&WireError> {
    match err {
        BootstrapError::Exchange(ExchangeError::Protocol { source, .. }) => Some(source),
        _ => None,
    }
}

/// As [`peer_error`], for rank 1 of 2 exchanging node blobs.
fn node_peer_error(port: u16) -> BootstrapError {
    exchange_at(at(port), 1, 2, &node_blob(1, 2), &personalized(quick())).unwrap_err()
}

fn personalized(options: ExchangeOptions) -> ExchangeOptions {
    ExchangeOptions {
        personalize: Some(&NodeBlobs),
        ..options
    }
}

/// The endpoint rank `from` made for rank `to`: distinct for every pair.
fn endpoint(from: u32, to: u32) -> Endpoint {
    Endpoint {
        qpn: (from << 12) | to,
        psn: Psn::new((to << 12) | from).unwrap(),
        lid: from as u16 + 1,
        gid: [0; 16],
        global: false,
        mtu: Mtu::B4096,
    }
}

fn flags_of(rank: u32, world: u32) -> RemoteMemory {
    RemoteMemory {
        addr: 0x10_0000 * (u64::from(rank) + 1),
        len: 8 * u64::from(world),
        rkey: 2 * rank + 1,
    }
}

fn window_of(rank: u32) -> RemoteMemory {
    RemoteMemory {
        addr: 0x4000_0000 + 0x10_0000 * u64::from(rank),
        len: 1 << 16,
        rkey: 2 * rank + 2,
    }
}

/// Rank `rank`'s full node blob, as `PreparedNode::blob` would make it.
fn node_blob(rank: u32, world: u32) -> Vec<u8> {
    let mut out = vec![0; node_blob_len(world)];
    NodeBlob::encode_into(
        &mut out,
        rank,
        world,
        |to| endpoint(rank, to),
        flags_of(rank, world),
        window_of(rank),
    )
    .unwrap();
    out
}

/// Raises this process's open-file limit to its hard limit: the flood tests hold
/// hundreds of client sockets while rank 0 holds its side of them, and the
/// 1024-rank exchange two sockets per rank, past the soft limit of 1024 that many
/// systems start processes with.
fn raise_fd_limit() {
    let mut limit = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit and setrlimit only read and write the struct passed.
    unsafe {
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) == 0 && limit.rlim_cur < limit.rlim_max
        {
            limit.rlim_cur = limit.rlim_max;
            libc::setrlimit(libc::RLIMIT_NOFILE, &limit);
        }
    }
}

fn secret(text: &str) -> JobSecret {
    JobSecret::new(text.as_bytes()).unwrap()
}

/// Reads from `stream` in 64 KiB gulps, one every 100 ms, until it ends, `stop` is set, or
/// for at most `for_at_most`: a peer that never lets a write stall for a whole `io_timeout`,
/// but takes its time. Returns the bytes it read.
fn drain_slowly(mut stream: TcpStream, stop: &AtomicBool, for_at_most: Duration) -> usize {
    let start = Instant::now();
    let mut buf = vec![0u8; 64 * 1024];
    let mut total = 0;
    stream
        .set_read_timeout(Some(Duration::from_millis(100)))
        .unwrap();
    while start.elapsed() < for_at_most && !stop.load(Ordering::Relaxed) {
        match stream.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => total += n,
            Err(error) if error.kind() == std::io::ErrorKind::WouldBlock => {}
            Err(error) if error.kind() == std::io::ErrorKind::TimedOut => {}
            Err(_) => break,
        }
        thread::sleep(Duration::from_millis(100));
    }
    total
}
