//! Endpoint exchange on 127.0.0.1, each rank on its own thread, plus fake peers
//! and fake rendezvous that misbehave on purpose.
//!
//! One file of about 1500 lines, on purpose: every test drives the same loopback harness
//! (ports, configs, fake clients), and one integration-test binary links and starts once,
//! which keeps the host-test step of CI short.

use core::time::Duration;
use rverbs_bootstrap::ExchangeError;
use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
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
        let rendezvous = if rank == 0 {
            Rendezvous::Listener(listener.try_clone().unwrap())
        } else {
            at(port)
        };
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

#[test]
fn world_of_one_needs_no_socket() {
    let (listener, _) = listener();
    let (mut session, blobs) = exchange_at(
        Rendezvous::Listener(listener),
        0,
        1,
        b"solo",
        &ExchangeOptions::default(),
    )
    .unwrap();
    assert_eq!(blobs, vec![b"solo".to_vec()]);
    assert_eq!(session.allgather(b"x").unwrap(), vec![b"x".to_vec()]);
    session.close().unwrap();
}

#[test]
fn two_ranks() {
    assert_full_exchange(2);
}

#[test]
fn three_ranks_then_allgather_rounds_and_close() {
    let sessions = assert_full_exchange(3);
    let handles: Vec<_> = sessions
        .into_iter()
        .map(|mut session| {
            thread::spawn(move || {
                let rank = session.rank();
                for round in 0..3u8 {
                    let mine = vec![round, rank as u8];
                    let all = session.allgather(&mine).unwrap();
                    let expected: Vec<Vec<u8>> = (0..3u8).map(|r| vec![round, r]).collect();
                    assert_eq!(all, expected);
                }
                session.close().unwrap();
            })
        })
        .collect();
    for handle in handles {
        handle.join().unwrap();
    }
}

#[test]
fn eight_ranks() {
    assert_full_exchange(8);
}

#[test]
fn sixty_four_ranks() {
    let start = Instant::now();
    assert_full_exchange(64);
    eprintln!("64-rank exchange on 127.0.0.1 took {:?}", start.elapsed());
}

#[test]
fn largest_allowed_blobs() {
    fn big(rank: u32) -> Vec<u8> {
        vec![rank as u8 + 1; 64 * 1024]
    }
    let outcomes = run_ranks(3, &[], &quick_long(), big);
    for outcome in outcomes {
        let (_, blobs) = outcome.unwrap().unwrap();
        assert_eq!(blobs, vec![big(0), big(1), big(2)]);
    }
    let (listener, _) = listener();
    let err = exchange_at(
        Rendezvous::Listener(listener),
        0,
        2,
        &[0; 64 * 1024 + 1],
        &quick(),
    )
    .unwrap_err();
    assert!(matches!(
        err,
        BootstrapError::Exchange(ExchangeError::BlobTooLarge { rank: 0, .. })
    ));
}

#[test]
fn config_driven_exchange() {
    // Find a free port, then let rank 0 bind it by itself.
    let port = listener().1;
    let entry = |rank| RankConfig {
        rank,
        host: "127.0.0.1".to_owned(),
        port,
        device: "rxe0".to_owned(),
        ib_port: 1,
        gid_index: Some(1),
        comment: None,
    };
    let config =
        ClusterConfig::new("test", Some("job-a".to_owned()), vec![entry(0), entry(1)]).unwrap();
    let options = ExchangeOptions {
        job_id: config.job_id(),
        ..quick_long()
    };
    let handles: Vec<_> = (0..2)
        .map(|rank| {
            let config = config.clone();
            let options = options.clone();
            thread::spawn(move || exchange(&config, rank, &blob_of(rank + 2), &options))
        })
        .collect();
    for handle in handles {
        let (_, blobs) = handle.join().unwrap().unwrap();
        assert_eq!(blobs, vec![blob_of(2), blob_of(3)]);
    }
}

#[test]
fn argument_errors() {
    let err = exchange_at(at(1), 2, 2, b"", &quick()).unwrap_err();
    assert!(matches!(
        err,
        BootstrapError::Exchange(ExchangeError::RankOutOfRange {
            rank: 2,
            world_size: 2
        })
    ));
    let (listener, _) = listener();
    let err = exchange_at(Rendezvous::Listener(listener), 1, 2, b"", &quick()).unwrap_err();
    assert!(matches!(
        err,
        BootstrapError::Exchange(ExchangeError::InvalidArgument { rank: 1, .. })
    ));
}

// ---- misbehaving peers against a real rank 0 ----

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

fn expect_refused(bytes: &[u8], needle: &str) {
    let options = ExchangeOptions {
        timeout: Duration::from_secs(1),
        io_timeout: Duration::from_millis(500),
        ..quick()
    };
    let (port, handle) = root(2, options);
    let mut fake = TcpStream::connect(("127.0.0.1", port)).unwrap();
    fake.write_all(&from_client(bytes)).unwrap();
    let reason = reject_reason(&mut fake);
    assert!(reason.contains(needle), "{reason}");
    let shown = expect_root_timeout(handle, &[1]);
    assert!(shown.contains(needle), "{shown}");
}

#[test]
fn foreign_bytes_are_refused() {
    expect_refused(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n", "bad magic");
}

#[test]
fn a_client_that_does_not_open_with_a_challenge_is_refused() {
    // What a version-1 rank (no challenges) sends.
    let options = ExchangeOptions {
        timeout: Duration::from_secs(1),
        io_timeout: Duration::from_millis(500),
        ..quick()
    };
    let (port, handle) = root(2, options);
    let mut old = TcpStream::connect(("127.0.0.1", port)).unwrap();
    old.write_all(&frame(FrameKind::Hello, 0x5eed, 1, 2, b"x"))
        .unwrap();
    let reason = reject_reason(&mut old);
    assert!(
        reason.contains("expected a Challenge as the first frame, got Hello"),
        "{reason}"
    );
    expect_root_timeout(handle, &[1]);
}

#[test]
fn wrong_version_is_refused() {
    let mut bytes = frame(FrameKind::Hello, 0x5eed, 1, 2, b"x");
    bytes[4] = 9;
    expect_refused(&bytes, "version 9");
}

#[test]
fn oversized_length_prefix_is_refused_without_allocating() {
    let mut bytes = frame(FrameKind::Hello, 0x5eed, 1, 2, b"");
    bytes[24..28].copy_from_slice(&u32::MAX.to_le_bytes());
    expect_refused(&bytes, "exceeds the limit");
    let mut bytes = frame(FrameKind::Hello, 0x5eed, 1, 2, b"");
    bytes[24..28].copy_from_slice(&(64 * 1024 + 1u32).to_le_bytes());
    expect_refused(&bytes, "rank 1 (of 2) announces 65537 bytes");
}

#[test]
fn malformed_frames_are_refused() {
    let mut flags = frame(FrameKind::Hello, 0x5eed, 1, 2, b"x");
    flags[7] = 2;
    let mut kind = frame(FrameKind::Hello, 0x5eed, 1, 2, b"x");
    kind[6] = 77;
    let cases = [
        (flags, "unknown header flags 0x02"),
        (kind, "unknown frame kind 77"),
        (
            frame(FrameKind::Table, 0x5eed, 1, 2, b""),
            "expected a Hello",
        ),
        (frame(FrameKind::Hello, 0x5eed, 2, 2, b""), "out of range"),
        (frame(FrameKind::Hello, 0x5eed, 1, 3, b""), "world size 3"),
    ];
    let handles: Vec<_> = cases
        .into_iter()
        .map(|(bytes, needle)| thread::spawn(move || expect_refused(&bytes, needle)))
        .collect();
    for handle in handles {
        handle.join().unwrap();
    }
}

#[test]
fn public_types_are_send_and_sync() {
    fn check<T: Send + Sync>() {}
    check::<Session>();
    check::<BootstrapError>();
    check::<ClusterConfig>();
    check::<ExchangeOptions>();
}

#[test]
fn wrong_job_id_is_rejected_and_root_keeps_waiting() {
    let (port, handle) = root(2, quick());
    let stale = ExchangeOptions {
        job_id: 0xdead,
        ..quick()
    };
    let err = exchange_at(at(port), 1, 2, b"stale", &stale).unwrap_err();
    match &err {
        BootstrapError::Exchange(ExchangeError::Rejected {
            rank: 1, reason, ..
        }) => {
            assert!(reason.contains("job id 0xdead"), "{reason}")
        }
        other => panic!("expected Rejected, got {other:?}"),
    }
    let shown = expect_root_timeout(handle, &[1]);
    assert!(shown.contains("job id"), "{shown}");
}

#[test]
fn stalled_peer_times_out_naming_missing_ranks() {
    let (port, handle) = root(4, quick());
    // Rank 2 is real; a silent client takes a socket; ranks 1 and 3 never come.
    let _silent = TcpStream::connect(("127.0.0.1", port)).unwrap();
    // The real rank waits longer than rank 0, so it hears rank 0's verdict.
    let real = thread::spawn(move || exchange_at(at(port), 2, 4, b"two", &quick_long()));
    let shown = expect_root_timeout(handle, &[1, 3]);
    assert!(shown.contains("[1, 3]"), "{shown}");
    // Rank 0 tells the rank that did join why the exchange failed.
    let err = real.join().unwrap().unwrap_err();
    assert!(
        matches!(&err, BootstrapError::Exchange(ExchangeError::Rejected { reason, .. }) if reason.contains("[1, 3]")),
        "{err:?}"
    );
}

#[test]
fn stalled_socket_does_not_block_real_peers() {
    let (port, handle) = root(2, quick_long());
    let _silent = TcpStream::connect(("127.0.0.1", port)).unwrap();
    let mut half = TcpStream::connect(("127.0.0.1", port)).unwrap();
    half.write_all(&frame(FrameKind::Hello, 0x5eed, 1, 2, b"x")[..10])
        .unwrap();
    thread::sleep(Duration::from_millis(50));
    let (_, blobs) = exchange_at(at(port), 1, 2, b"one", &quick_long()).unwrap();
    assert_eq!(blobs, vec![b"root".to_vec(), b"one".to_vec()]);
    let (outcome, took) = handle.join().unwrap();
    outcome.unwrap();
    assert!(took < Duration::from_secs(5), "took {took:?}");
}

#[test]
fn peer_disconnecting_mid_frame_is_refused() {
    let (port, handle) = root(2, quick());
    {
        let mut fake = TcpStream::connect(("127.0.0.1", port)).unwrap();
        let bytes = frame(FrameKind::Hello, 0x5eed, 1, 2, b"payload");
        fake.write_all(&from_client(&bytes[..HEADER_LEN + 2]))
            .unwrap();
    }
    let shown = expect_root_timeout(handle, &[1]);
    // The fake never read rank 0's challenge, so its close may arrive as a reset (unread
    // data) rather than an end of stream: either way the connection is named as refused.
    assert!(
        shown.contains("closed the connection") || shown.contains("Connection reset by peer"),
        "{shown}"
    );
}

#[test]
fn peer_disconnecting_after_hello_becomes_missing_again() {
    let (port, handle) = root(3, quick());
    {
        let mut fake = TcpStream::connect(("127.0.0.1", port)).unwrap();
        fake.write_all(&from_client(&frame(FrameKind::Hello, 0x5eed, 2, 3, b"two")))
            .unwrap();
        thread::sleep(Duration::from_millis(100));
    }
    // Give rank 0 time to notice before the last real rank arrives.
    thread::sleep(Duration::from_millis(400));
    let real = thread::spawn(move || exchange_at(at(port), 1, 3, b"one", &quick_long()));
    let shown = expect_root_timeout(handle, &[2]);
    assert!(shown.contains("lost rank 2"), "{shown}");
    let err = real.join().unwrap().unwrap_err();
    assert!(
        matches!(&err, BootstrapError::Exchange(ExchangeError::Rejected { reason, .. }) if reason.contains("[2]")),
        "{err:?}"
    );
}

#[test]
fn duplicate_rank_is_rejected_and_first_claim_kept() {
    let (port, handle) = root(3, quick_long());
    let hello = frame(FrameKind::Hello, 0x5eed, 1, 3, b"first");
    let mut first = TcpStream::connect(("127.0.0.1", port)).unwrap();
    first.write_all(&from_client(&hello)).unwrap();
    thread::sleep(Duration::from_millis(200));
    let mut second = TcpStream::connect(("127.0.0.1", port)).unwrap();
    second
        .write_all(&from_client(&frame(
            FrameKind::Hello,
            0x5eed,
            1,
            3,
            b"second",
        )))
        .unwrap();
    let reason = reject_reason(&mut second);
    assert!(reason.contains("already joined"), "{reason}");
    let (_, blobs) = exchange_at(at(port), 2, 3, b"two", &quick_long()).unwrap();
    assert_eq!(blobs[1], b"first");
    let (header, payload) = answer(&mut first).unwrap();
    assert_eq!(header.kind, FrameKind::Table);
    assert_eq!(
        wire::decode_table(&payload, 64).unwrap(),
        vec![b"root".to_vec(), b"first".to_vec(), b"two".to_vec()]
    );
    handle.join().unwrap().0.unwrap();
}

#[test]
fn allgather_times_out_naming_the_silent_rank() {
    let sessions = assert_full_exchange(3);
    let mut sessions = sessions.into_iter();
    let mut zero = sessions.next().unwrap();
    let mut one = sessions.next().unwrap();
    let _silent_two = sessions.next().unwrap();
    zero.set_timeout(Duration::from_secs(2));
    // Rank 1 outwaits rank 0, so it hears rank 0's verdict.
    one.set_timeout(Duration::from_secs(6));
    assert_eq!(zero.options().timeout, Duration::from_secs(2));
    let peer = thread::spawn(move || one.allgather(b"ready"));
    let start = Instant::now();
    let err = zero.allgather(b"ready").unwrap_err();
    assert!(
        matches!(&err, BootstrapError::Exchange(ExchangeError::Timeout { rank: 0, missing, .. }) if missing == &vec![2]),
        "{err:?}"
    );
    assert!(start.elapsed() < Duration::from_secs(5));
    assert!(matches!(
        zero.allgather(b"again").unwrap_err(),
        BootstrapError::Exchange(ExchangeError::Poisoned { rank: 0 })
    ));
    let err = peer.join().unwrap().unwrap_err();
    assert!(
        matches!(
            &err,
            BootstrapError::Exchange(ExchangeError::Rejected { rank: 1, .. })
        ),
        "{err:?}"
    );
}

// ---- a misbehaving rank 0 against a real peer ----

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

fn peer_error(port: u16) -> (BootstrapError, Duration) {
    let start = Instant::now();
    let err = exchange_at(at(port), 1, 2, b"one", &quick()).unwrap_err();
    (err, start.elapsed())
}

/// As [`peer_error`], for rank 1 of 2 exchanging node blobs.
fn node_peer_error(port: u16) -> BootstrapError {
    exchange_at(at(port), 1, 2, &node_blob(1, 2), &personalized(quick())).unwrap_err()
}

#[test]
fn root_disconnecting_mid_exchange() {
    // A rank 0 that closes without answering is tried again (it may have shed
    // the connection under load) until the deadline, and the error says so.
    let (port, fake) = fake_root(|_, _| {});
    let (err, took) = peer_error(port);
    fake.join().unwrap();
    match &err {
        BootstrapError::Exchange(ExchangeError::Timeout {
            rank: 1,
            missing,
            detail,
            ..
        }) => {
            assert_eq!(missing, &[0]);
            assert!(
                detail.contains("closed the connection before answering")
                    && detail.contains("overloaded"),
                "{err}"
            );
        }
        other => panic!("expected a timeout naming rank 0, got {other:?}"),
    }
    assert!(took < Duration::from_secs(3), "took {took:?}");
}

#[test]
fn root_sending_garbage() {
    let (port, fake) = fake_root(|stream, _| {
        stream.write_all(&[0xab; 64]).unwrap();
    });
    let (err, _) = peer_error(port);
    fake.join().unwrap();
    assert!(
        matches!(
            err,
            BootstrapError::Exchange(ExchangeError::Protocol {
                source: WireError::BadMagic { .. },
                ..
            })
        ),
        "{err:?}"
    );
}

#[test]
fn root_announcing_a_huge_table() {
    let (port, fake) = fake_root(|stream, header| {
        let mut head = wire::Header {
            kind: FrameKind::Table,
            payload_len: u32::MAX,
            sender: 0,
            ..header
        }
        .encode();
        head[24..28].copy_from_slice(&u32::MAX.to_le_bytes());
        stream.write_all(&head).unwrap();
    });
    let (err, _) = peer_error(port);
    fake.join().unwrap();
    assert!(
        matches!(
            err,
            BootstrapError::Exchange(ExchangeError::Protocol {
                source: WireError::PayloadTooLarge { .. },
                ..
            })
        ),
        "{err:?}"
    );
}

#[test]
fn root_not_echoing_our_blob() {
    let (port, fake) = fake_root(|stream, header| {
        let table = wire::encode_table(&[b"root".as_slice(), b"forged"]).unwrap();
        stream
            .write_all(&frame(FrameKind::Table, header.job_id, 0, 2, &table))
            .unwrap();
    });
    let (err, _) = peer_error(port);
    fake.join().unwrap();
    assert!(
        matches!(&err, BootstrapError::Exchange(ExchangeError::Unexpected { reason, .. }) if reason.contains("echo")),
        "{err:?}"
    );
}

#[test]
fn root_with_wrong_table_size_or_job() {
    let (port, fake) = fake_root(|stream, header| {
        let table = wire::encode_table(&[b"root".as_slice()]).unwrap();
        stream
            .write_all(&frame(FrameKind::Table, header.job_id, 0, 2, &table))
            .unwrap();
    });
    let (err, _) = peer_error(port);
    fake.join().unwrap();
    assert!(
        matches!(&err, BootstrapError::Exchange(ExchangeError::Unexpected { reason, .. }) if reason.contains("1 entries")),
        "{err:?}"
    );
    let (port, fake) = fake_root(|stream, _| {
        let table = wire::encode_table(&[b"root".as_slice(), b"one"]).unwrap();
        stream
            .write_all(&frame(FrameKind::Table, 1, 0, 2, &table))
            .unwrap();
    });
    let (err, _) = peer_error(port);
    fake.join().unwrap();
    assert!(
        matches!(
            &err,
            BootstrapError::Exchange(ExchangeError::Unexpected { .. })
        ),
        "{err:?}"
    );
}

#[test]
fn peer_reconnects_when_reset_before_an_answer() {
    let (listener, port) = listener();
    let fake = thread::spawn(move || {
        // Dropping a connection with its hello unread makes the kernel reset it,
        // as it does to connections a flooded listen queue could not keep.
        let (mut first, _) = listener.accept().unwrap();
        first.write_all(&plain_challenge()).unwrap();
        let mut part = [0u8; 10];
        first.read_exact(&mut part).unwrap();
        drop(first);
        let (mut second, _) = listener.accept().unwrap();
        second.write_all(&plain_challenge()).unwrap();
        let (challenge, _) = read_frame(&mut second).unwrap();
        assert_eq!(challenge.kind, FrameKind::Challenge);
        let (header, payload) = read_frame(&mut second).unwrap();
        assert_eq!((header.kind, header.sender), (FrameKind::Hello, 1));
        assert_eq!(payload, b"one");
        let table = wire::encode_table(&[b"root".as_slice(), b"one"]).unwrap();
        second
            .write_all(&frame(FrameKind::Table, header.job_id, 0, 2, &table))
            .unwrap();
    });
    let (_, blobs) = exchange_at(at(port), 1, 2, b"one", &quick()).unwrap();
    assert_eq!(blobs, vec![b"root".to_vec(), b"one".to_vec()]);
    fake.join().unwrap();
}

#[test]
fn root_that_never_answers() {
    let (port, fake) = fake_root(|_, _| thread::sleep(Duration::from_secs(3)));
    let (err, took) = peer_error(port);
    assert!(
        matches!(&err, BootstrapError::Exchange(ExchangeError::Timeout { rank: 1, missing, .. }) if missing == &vec![0]),
        "{err:?}"
    );
    assert!(took < Duration::from_secs(3), "took {took:?}");
    fake.join().unwrap();
}

#[test]
fn no_rendezvous_at_all() {
    let port = listener().1;
    let (err, took) = peer_error(port);
    assert!(
        matches!(&err, BootstrapError::Exchange(ExchangeError::Connect { rank: 1, addr, .. }) if addr == &format!("127.0.0.1:{port}")),
        "{err:?}"
    );
    assert!(took < Duration::from_secs(3), "took {took:?}");
}

// ---- node blobs, each rank receiving only what the others made for it ----

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

/// Checks that `blobs` is what rank `me` of `world` must get, and returns the
/// bytes of the table frame that carried it.
fn check_node_table(me: u32, world: u32, blobs: &[Vec<u8>]) -> usize {
    assert_eq!(blobs.len(), world as usize, "rank {me}");
    assert_eq!(
        blobs[me as usize],
        node_blob(me, world),
        "rank {me}'s own entry"
    );
    let mut wire = HEADER_LEN + 4 + wire::TABLE_ENTRY_OVERHEAD * world as usize;
    for (from, blob) in (0..world).zip(blobs) {
        if from == me {
            continue;
        }
        wire += blob.len();
        let d = NodeBlob::decode(blob).unwrap_or_else(|e| panic!("rank {me}, entry {from}: {e}"));
        assert_eq!(blob.len(), ADDRESSED_BLOB_LEN);
        assert_eq!((d.rank, d.world, d.addressee()), (from, world, Some(me)));
        assert_eq!(
            d.endpoint_for(me),
            Some(endpoint(from, me)),
            "rank {me}, from {from}"
        );
        assert_eq!(d.endpoint_for((me + 1) % world), None);
        assert_eq!(
            (d.flags, d.window),
            (flags_of(from, world), window_of(from))
        );
    }
    wire
}

/// Exchanges node blobs among `n` ranks on threads; every rank checks its table
/// and drops it. Returns the table frame size rank 1 saw.
fn node_exchange(n: u32) -> usize {
    let options = personalized(ExchangeOptions {
        timeout: Duration::from_secs(120),
        io_timeout: Duration::from_secs(60),
        ..quick()
    });
    let (listener, port) = listener();
    let handles: Vec<_> = (0..n)
        .map(|rank| {
            let options = options.clone();
            let rendezvous = if rank == 0 {
                Rendezvous::Listener(listener.try_clone().unwrap())
            } else {
                at(port)
            };
            // Small stacks: a thousand threads of the default 2 MiB reserve 2 GiB.
            thread::Builder::new()
                .stack_size(256 * 1024)
                .spawn(move || {
                    let blob = node_blob(rank, n);
                    let (session, blobs) = exchange_at(rendezvous, rank, n, &blob, &options)
                        .unwrap_or_else(|error| panic!("{error}"));
                    let wire = check_node_table(rank, n, &blobs);
                    drop(session);
                    wire
                })
                .unwrap()
        })
        .collect();
    drop(listener);
    let sizes: Vec<usize> = handles.into_iter().map(|h| h.join().unwrap()).collect();
    sizes[1]
}

#[test]
fn node_blobs_among_1024_ranks() {
    raise_fd_limit();
    let n = 1024;
    let start = Instant::now();
    let received = node_exchange(n);
    let took = start.elapsed();
    eprintln!(
        "{n}-rank node-blob exchange on 127.0.0.1 took {took:?}; each rank received a {received}-byte table ({} bytes per full blob)",
        node_blob_len(n)
    );
    // Each rank gets one addressed blob per peer, not every full blob.
    assert_eq!(
        received,
        HEADER_LEN + 4 + 8 * n as usize + ADDRESSED_BLOB_LEN * (n as usize - 1)
    );
}

#[test]
fn node_blobs_then_plain_rounds() {
    let n = 5;
    let (listener, port) = listener();
    let handles: Vec<_> = (0..n)
        .map(|rank| {
            let rendezvous = if rank == 0 {
                Rendezvous::Listener(listener.try_clone().unwrap())
            } else {
                at(port)
            };
            thread::spawn(move || {
                let options = personalized(quick_long());
                let (mut session, blobs) =
                    exchange_at(rendezvous, rank, n, &node_blob(rank, n), &options).unwrap();
                check_node_table(rank, n, &blobs);
                // Later rounds are plain all-gathers, whatever the exchange was.
                let all = session.allgather(&[rank as u8; 3]).unwrap();
                let expected: Vec<Vec<u8>> = (0..n).map(|r| vec![r as u8; 3]).collect();
                assert_eq!(all, expected);
                session.close().unwrap();
            })
        })
        .collect();
    drop(listener);
    for handle in handles {
        handle.join().unwrap();
    }
}

#[test]
fn node_blob_hello_limit_follows_the_world_size() {
    let world = 4096;
    let full = node_blob_len(world);
    let options = personalized(ExchangeOptions {
        timeout: Duration::from_secs(2),
        ..quick()
    });
    let (port, handle) = root_with(world, options, node_blob(0, world));
    // A real hello at the largest world fits, far over the 64 KiB plain limit...
    let mut fits = TcpStream::connect(("127.0.0.1", port)).unwrap();
    fits.write_all(&from_client(&frame(
        FrameKind::Hello,
        0x5eed,
        1,
        world,
        &node_blob(1, world),
    )))
    .unwrap();
    // ...one byte more does not, and the refusal names the rank...
    let mut over = TcpStream::connect(("127.0.0.1", port)).unwrap();
    let mut head = frame(FrameKind::Hello, 0x5eed, 2, world, b"");
    head[24..28].copy_from_slice(&(full as u32 + 1).to_le_bytes());
    over.write_all(&from_client(&head)).unwrap();
    let reason = reject_reason(&mut over);
    assert!(
        reason.contains(&format!(
            "rank 2 (of 4096) announces {} bytes, which exceeds the limit of {full} bytes",
            full + 1
        )),
        "{reason}"
    );
    // ...and neither does a blob that is not this rank's.
    let mut wrong = TcpStream::connect(("127.0.0.1", port)).unwrap();
    wrong
        .write_all(&from_client(&frame(
            FrameKind::Hello,
            0x5eed,
            3,
            world,
            &node_blob(4, world),
        )))
        .unwrap();
    let reason = reject_reason(&mut wrong);
    assert!(
        reason.contains("rank 3's blob is refused by NodeBlobs: node blob of rank 4 of 4096"),
        "{reason}"
    );
    let (outcome, _) = handle.join().unwrap();
    let err = outcome.unwrap_err();
    match &err {
        BootstrapError::Exchange(ExchangeError::Timeout {
            rank: 0, missing, ..
        }) => assert_eq!(missing, &(2..world).collect::<Vec<_>>()),
        other => panic!("expected a rank-0 timeout, got {other:?}"),
    }
    // Rank 1 was admitted: it hears the timeout, not a refusal.
    let reason = reject_reason(&mut fits);
    assert!(reason.contains("timed out"), "{reason}");
}

#[test]
fn node_blob_argument_errors() {
    let options = personalized(quick());
    let (listener, _) = listener();
    let too_long = vec![0; node_blob_len(2) + 1];
    let err = exchange_at(Rendezvous::Listener(listener), 0, 2, &too_long, &options).unwrap_err();
    assert!(
        matches!(err, BootstrapError::Exchange(ExchangeError::BlobTooLarge { rank: 0, len, limit }) if len == limit + 1 && limit == node_blob_len(2)),
        "{err:?}"
    );
    let err = exchange_at(at(1), 1, 3, &node_blob(1, 2), &options).unwrap_err();
    assert!(
        matches!(&err, BootstrapError::Exchange(ExchangeError::InvalidArgument { rank: 1, reason }) if reason.contains("rank 1 of 2, sent as rank 1 of 3")),
        "{err:?}"
    );
}

#[test]
fn personalized_peer_refuses_a_plain_or_oversized_table() {
    // A personalized table leaves rank 1's own entry empty.
    let (port, fake) = fake_root(|stream, header| {
        let table = wire::encode_table(&[b"root".as_slice(), b"one"]).unwrap();
        stream
            .write_all(&frame(FrameKind::Table, header.job_id, 0, 2, &table))
            .unwrap();
    });
    let err = node_peer_error(port);
    fake.join().unwrap();
    assert!(
        matches!(&err, BootstrapError::Exchange(ExchangeError::Unexpected { reason, .. }) if reason.contains("own entry")),
        "{err:?}"
    );
    // An entry longer than an addressed blob.
    let (port, fake) = fake_root(|stream, header| {
        let table = wire::encode_table(&[node_blob(0, 2), Vec::new()]).unwrap();
        stream
            .write_all(&frame(FrameKind::Table, header.job_id, 0, 2, &table))
            .unwrap();
    });
    let err = node_peer_error(port);
    fake.join().unwrap();
    assert!(
        matches!(
            &err,
            BootstrapError::Exchange(ExchangeError::Protocol {
                source: WireError::TableEntryTooLarge {
                    index: 0,
                    limit: ADDRESSED_BLOB_LEN,
                    ..
                },
                ..
            })
        ),
        "{err:?}"
    );
    // A table frame larger than two addressed entries can need.
    let (port, fake) = fake_root(|stream, header| {
        let mut head = frame(FrameKind::Table, header.job_id, 0, 2, b"");
        head[24..28].copy_from_slice(&4000u32.to_le_bytes());
        stream.write_all(&head).unwrap();
    });
    let err = node_peer_error(port);
    fake.join().unwrap();
    assert!(
        matches!(
            &err,
            BootstrapError::Exchange(ExchangeError::Protocol {
                rank: 1,
                peer: Some(0),
                source: WireError::PayloadTooLarge { len: 4000, .. },
                ..
            })
        ),
        "{err:?}"
    );
}

// ---- hostile clients at rank 0's port ----

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

/// Rank 1 of 2 joining at `port`, and how long it took.
fn timed_rank_one(port: u16, options: ExchangeOptions) -> thread::JoinHandle<(Outcome, Duration)> {
    thread::spawn(move || {
        let start = Instant::now();
        let outcome = exchange_at(at(port), 1, 2, b"one", &options);
        (outcome, start.elapsed())
    })
}

#[test]
fn a_flood_of_idle_connections_does_not_keep_a_real_rank_out() {
    raise_fd_limit();
    // Idle clients would hold their place for io_timeout; the real rank must get
    // in well before that, because rank 0 closes the oldest idle ones for it.
    let options = ExchangeOptions {
        timeout: Duration::from_secs(20),
        io_timeout: Duration::from_secs(3),
        ..quick()
    };
    let (port, root) = root(2, options.clone());
    let (started_tx, started_rx) = std::sync::mpsc::channel();
    let (done_tx, done_rx) = std::sync::mpsc::channel::<()>();
    let flood = thread::spawn(move || {
        let mut idle = Vec::new();
        let start = Instant::now();
        for _ in 0..300 {
            idle.push(TcpStream::connect(("127.0.0.1", port)).unwrap());
        }
        // Rank 0 keeps only one source's share of them (64 of its 256 places)
        // and has closed the older ones, long before their io_timeout.
        let mut closed = closed_by_peer(&idle);
        while closed < 300 - 64 && start.elapsed() < Duration::from_secs(5) {
            thread::sleep(Duration::from_millis(20));
            closed = closed_by_peer(&idle);
        }
        started_tx.send((closed, start.elapsed())).unwrap();
        // Keep coming while the real rank joins, holding every connection, until
        // it is done (once rank 0 has its table it stops listening).
        while done_rx.try_recv().is_err() {
            if let Ok(stream) = TcpStream::connect(("127.0.0.1", port)) {
                idle.push(stream);
            }
            thread::sleep(Duration::from_millis(1));
        }
        idle.len()
    });
    let (closed, after) = started_rx.recv().unwrap();
    if after < Duration::from_millis(2500) {
        assert_eq!(closed, 300 - 64, "idle connections closed to make room");
    } else {
        // A slow machine: the idle connections' own deadline may have come too.
        assert!(closed >= 300 - 64, "{closed} closed after {after:?}");
    }
    let (outcome, took) = timed_rank_one(port, options).join().unwrap();
    done_tx.send(()).unwrap();
    let (_, blobs) = outcome.unwrap_or_else(|error| panic!("{error}"));
    assert_eq!(blobs, vec![b"root".to_vec(), b"one".to_vec()]);
    let flood = flood.join().unwrap();
    root.join().unwrap().0.unwrap();
    eprintln!("rank 1 joined during a flood of {flood} idle connections in {took:?}");
    assert!(took < Duration::from_millis(2500), "took {took:?}");
}

/// How many of `streams` the other end has closed (read to the end without waiting).
fn closed_by_peer(streams: &[TcpStream]) -> usize {
    let mut buf = [0u8; 256];
    streams
        .iter()
        .filter(|stream| {
            stream.set_nonblocking(true).unwrap();
            let closed = loop {
                match (&mut &**stream).read(&mut buf) {
                    Ok(0) => break true,
                    Ok(_) => continue,
                    Err(error) => break error.kind() != std::io::ErrorKind::WouldBlock,
                }
            };
            stream.set_nonblocking(false).unwrap();
            closed
        })
        .count()
}

/// A client that sends a valid challenge and hello one byte at a time.
struct Dripper {
    stream: TcpStream,
    sent: usize,
}

#[test]
fn drip_feeding_clients_do_not_keep_a_real_rank_out() {
    raise_fd_limit();
    // Each client sends one byte of a valid frame every 200 ms, well inside the
    // 1 s that used to be allowed between two bytes; 260 of them held every
    // reader rank 0 had until the exchange timed out.
    let options = ExchangeOptions {
        timeout: Duration::from_secs(20),
        io_timeout: Duration::from_secs(1),
        ..quick()
    };
    let (port, root) = root(2, options.clone());
    let valid = from_client(&frame(FrameKind::Hello, 0x5eed, 1, 2, b"drip"));
    let stop = std::sync::Arc::new(core::sync::atomic::AtomicBool::new(false));
    let (ready_tx, ready_rx) = std::sync::mpsc::channel();
    let drip = {
        let stop = std::sync::Arc::clone(&stop);
        thread::spawn(move || {
            let connect = || Dripper {
                stream: TcpStream::connect(("127.0.0.1", port)).unwrap(),
                sent: 0,
            };
            let mut clients: Vec<Dripper> = (0..260).map(|_| connect()).collect();
            let mut reconnects = 0usize;
            let mut ready = Some(ready_tx);
            while !stop.load(core::sync::atomic::Ordering::Relaxed) {
                for client in &mut clients {
                    let byte = [valid[client.sent % valid.len()]];
                    if client.stream.write_all(&byte).is_ok() {
                        client.sent += 1;
                    } else {
                        // Closed by rank 0: come back, as an attacker would.
                        *client = connect();
                        reconnects += 1;
                    }
                }
                if let Some(ready) = ready.take() {
                    ready.send(()).unwrap();
                }
                thread::sleep(Duration::from_millis(200));
            }
            reconnects
        })
    };
    ready_rx.recv().unwrap();
    let (outcome, took) = timed_rank_one(port, options).join().unwrap();
    stop.store(true, core::sync::atomic::Ordering::Relaxed);
    let (_, blobs) = outcome.unwrap_or_else(|error| panic!("{error}"));
    assert_eq!(blobs, vec![b"root".to_vec(), b"one".to_vec()]);
    let reconnects = drip.join().unwrap();
    root.join().unwrap().0.unwrap();
    eprintln!("rank 1 joined among 260 drip-feeding clients in {took:?} ({reconnects} reconnects)");
    assert!(took < Duration::from_secs(5), "took {took:?}");
}

#[test]
fn a_drip_fed_hello_is_cut_off_at_io_timeout() {
    let options = ExchangeOptions {
        timeout: Duration::from_secs(3),
        io_timeout: Duration::from_secs(1),
        ..quick()
    };
    let (port, handle) = root(2, options);
    let mut client = TcpStream::connect(("127.0.0.1", port)).unwrap();
    let start = Instant::now();
    let mut reader = client.try_clone().unwrap();
    let answer_at = thread::spawn(move || {
        let reason = reject_reason(&mut reader);
        (reason, start.elapsed())
    });
    // One byte every 100 ms: the whole frame would take about 9 s.
    let valid = from_client(&frame(FrameKind::Hello, 0x5eed, 1, 2, b"drip"));
    for byte in &valid {
        if answer_at.is_finished() || client.write_all(&[*byte]).is_err() {
            break;
        }
        thread::sleep(Duration::from_millis(100));
    }
    let (reason, after) = answer_at.join().unwrap();
    assert!(
        reason.contains("sent no complete hello within 1.0s of being accepted"),
        "{reason}"
    );
    assert!(
        // Cut at io_timeout, not at the exchange's 3 s deadline.
        after >= Duration::from_millis(900) && after < Duration::from_millis(2500),
        "cut off after {after:?}"
    );
    let shown = expect_root_timeout(handle, &[1]);
    assert!(shown.contains("no complete hello"), "{shown}");
}

// ---- the job secret ----

fn secret(text: &str) -> JobSecret {
    JobSecret::new(text.as_bytes()).unwrap()
}

fn with_secret(options: ExchangeOptions, text: &str) -> ExchangeOptions {
    ExchangeOptions {
        secret: Some(secret(text)),
        ..options
    }
}

const SECRET: &str = "the job secret of this test run";
const OTHER: &str = "the job secret of some other job";

#[test]
fn matching_secrets_connect_and_prove_every_round() {
    let n = 3;
    let options = with_secret(quick_long(), SECRET);
    let (listener, port) = listener();
    let handles: Vec<_> = (0..n)
        .map(|rank| {
            let rendezvous = if rank == 0 {
                Rendezvous::Listener(listener.try_clone().unwrap())
            } else {
                at(port)
            };
            let options = options.clone();
            thread::spawn(move || {
                let (mut session, blobs) =
                    exchange_at(rendezvous, rank, n, &blob_of(rank), &options).unwrap();
                assert_eq!(blobs, (0..n).map(blob_of).collect::<Vec<_>>());
                for round in 0..3u8 {
                    let all = session.allgather(&[round, rank as u8]).unwrap();
                    assert_eq!(
                        all,
                        (0..n as u8).map(|r| vec![round, r]).collect::<Vec<_>>()
                    );
                }
                session.close().unwrap();
            })
        })
        .collect();
    drop(listener);
    for handle in handles {
        handle.join().unwrap();
    }
}

/// The reason of an authentication failure, or a panic naming what came instead.
fn auth_reason(err: &BootstrapError) -> &str {
    match err {
        BootstrapError::Exchange(ExchangeError::Auth {
            rank: 1,
            peer: Some(0),
            reason,
            ..
        }) => reason,
        other => panic!("expected an authentication error, got {other:?}"),
    }
}

#[test]
fn a_wrong_secret_is_refused_while_the_real_rank_joins() {
    let (port, root) = root(2, with_secret(quick_long(), SECRET));
    let err = exchange_at(at(port), 1, 2, b"impostor", &with_secret(quick(), OTHER)).unwrap_err();
    let reason = auth_reason(&err);
    assert!(
        reason.starts_with("MAC mismatch: wrong job secret"),
        "{err}"
    );
    // Neither secret shows in the error.
    let shown = format!("{err} {err:?}");
    assert!(!shown.contains("job secret of"), "{shown}");
    let (_, blobs) = exchange_at(at(port), 1, 2, b"one", &with_secret(quick_long(), SECRET))
        .unwrap_or_else(|error| panic!("{error}"));
    assert_eq!(blobs, vec![b"root".to_vec(), b"one".to_vec()]);
    let (outcome, _) = root.join().unwrap();
    let (_, blobs) = outcome.unwrap();
    assert_eq!(blobs[1], b"one");
}

#[test]
fn rank_zero_says_why_it_refused_a_secret() {
    let cases = [
        (Some(SECRET), Some(OTHER), "MAC mismatch: wrong job secret"),
        (
            Some(SECRET),
            None,
            "rank 0 requires a job secret and the sender has none",
        ),
        (
            None,
            Some(SECRET),
            "the sender requires a job secret and rank 0 has none",
        ),
    ];
    let handles: Vec<_> = cases
        .into_iter()
        .map(|(at_root, at_peer, needle)| {
            thread::spawn(move || {
                let options = ExchangeOptions {
                    timeout: Duration::from_secs(1),
                    ..quick()
                };
                let secret_of = |options: &ExchangeOptions, text: Option<&str>| match text {
                    Some(text) => with_secret(options.clone(), text),
                    None => options.clone(),
                };
                let (port, handle) = root(2, secret_of(&options, at_root));
                let err =
                    exchange_at(at(port), 1, 2, b"one", &secret_of(&quick(), at_peer)).unwrap_err();
                let shown = expect_root_timeout(handle, &[1]);
                assert!(shown.contains(needle), "{shown}");
                err
            })
        })
        .collect();
    let errors: Vec<BootstrapError> = handles.into_iter().map(|h| h.join().unwrap()).collect();
    // And what the rank itself was told.
    assert!(auth_reason(&errors[0]).starts_with("MAC mismatch: wrong job secret"));
    assert!(
        auth_reason(&errors[1]).starts_with("rank 0 requires a job secret and this rank has none"),
        "{}",
        errors[1]
    );
    assert!(
        auth_reason(&errors[2]).starts_with("this rank requires a job secret and rank 0 has none"),
        "{}",
        errors[2]
    );
}

/// A client that speaks the protocol by hand, with the secret, so it can break it.
struct SealedClient {
    stream: TcpStream,
    seal: wire::Seal,
}

impl SealedClient {
    /// Connects and exchanges challenges as rank `rank` of `world`.
    fn connect(port: u16, secret_text: &str, rank: u32, world: u32) -> Self {
        let secret = secret(secret_text);
        let mut stream = TcpStream::connect(("127.0.0.1", port)).unwrap();
        let mut seal = wire::Seal::peer(Some(&secret), [rank as u8; wire::CHALLENGE_LEN]);
        stream
            .write_all(&seal.challenge_frame(0x5eed, rank, world))
            .unwrap();
        let mut client = Self { stream, seal };
        let (header, _) = client.next().unwrap();
        assert_eq!(header.kind, FrameKind::Challenge);
        client
    }

    /// The next frame from rank 0, opened.
    fn next(&mut self) -> Result<(Header, Vec<u8>), WireError> {
        let (_, _, whole) = read_raw_frame(&mut self.stream).expect("a frame");
        let frame = wire::decode_frame(&whole, wire::MAX_PAYLOAD)?;
        self.seal.open(&frame)?;
        Ok((frame.header, frame.payload.to_vec()))
    }

    /// A sealed hello as rank `rank` of `world`, as sent (not yet sent).
    fn hello(&mut self, rank: u32, world: u32, blob: &[u8]) -> Vec<u8> {
        self.seal
            .encode(FrameKind::Hello, 0x5eed, rank, world, blob)
            .unwrap()
    }

    fn rejected(mut self) -> String {
        let (header, payload) = self.next().expect("rank 0's Reject is sealed");
        assert_eq!(header.kind, FrameKind::Reject);
        String::from_utf8(payload).unwrap()
    }
}

#[test]
fn tampered_and_replayed_hellos_are_refused() {
    let (port, root) = root(3, with_secret(quick_long(), SECRET));
    // A hello with one payload byte changed on the way.
    let mut tampered = SealedClient::connect(port, SECRET, 1, 3);
    let mut hello = tampered.hello(1, 3, b"one");
    hello[HEADER_LEN] ^= 0x01;
    tampered.stream.write_all(&hello).unwrap();
    let reason = tampered.rejected();
    assert!(reason.contains("MAC mismatch"), "{reason}");
    // A good hello for rank 2, recorded with its challenge and sent again on a
    // new connection: rank 0's new challenge does not match it.
    let mut recorded = SealedClient::connect(port, SECRET, 2, 3);
    let mut bytes = wire::Seal::peer(Some(&secret(SECRET)), [2; wire::CHALLENGE_LEN])
        .challenge_frame(0x5eed, 2, 3);
    let hello = recorded.hello(2, 3, b"two");
    bytes.extend_from_slice(&hello);
    recorded.stream.write_all(&hello).unwrap();
    let mut replay = TcpStream::connect(("127.0.0.1", port)).unwrap();
    replay.write_all(&bytes).unwrap();
    let reason = reject_reason(&mut replay);
    assert!(reason.contains("MAC mismatch"), "{reason}");
    // The real rank 1 still joins, and rank 2's first hello counts.
    let (_, blobs) = exchange_at(at(port), 1, 3, b"one", &with_secret(quick_long(), SECRET))
        .unwrap_or_else(|error| panic!("{error}"));
    assert_eq!(blobs[2], b"two");
    let (header, payload) = recorded.next().unwrap();
    assert_eq!(header.kind, FrameKind::Table);
    assert_eq!(wire::decode_table(&payload, 64).unwrap()[1], b"one");
    root.join().unwrap().0.unwrap();
}

#[test]
fn a_tampered_table_is_refused() {
    let (listener, port) = listener();
    let fake = thread::spawn(move || {
        let (mut stream, _) = listener.accept().unwrap();
        let secret = secret(SECRET);
        let mut seal = wire::Seal::root(Some(&secret), [9; wire::CHALLENGE_LEN]);
        stream
            .write_all(&seal.challenge_frame(0x5eed, 0, 2))
            .unwrap();
        for _ in 0..2 {
            let (_, _, whole) = read_raw_frame(&mut stream).unwrap();
            seal.open(&wire::decode_frame(&whole, wire::MAX_PAYLOAD).unwrap())
                .unwrap();
        }
        let table = wire::encode_table(&[b"root".as_slice(), b"one"]).unwrap();
        let mut bytes = seal.encode(FrameKind::Table, 0x5eed, 0, 2, &table).unwrap();
        let last = bytes.len() - 1;
        bytes[last] ^= 0x80; // the MAC itself
        stream.write_all(&bytes).unwrap();
    });
    let err = exchange_at(at(port), 1, 2, b"one", &with_secret(quick(), SECRET)).unwrap_err();
    fake.join().unwrap();
    assert!(
        auth_reason(&err).starts_with("MAC mismatch: wrong job secret"),
        "{err}"
    );
}

#[test]
fn secrets_stay_out_of_debug_output() {
    let options = with_secret(quick(), SECRET);
    let shown = format!("{options:?}");
    assert!(
        shown.contains("secret: Some(JobSecret(<redacted>))"),
        "{shown}"
    );
    assert!(!shown.contains("job secret of"), "{shown}");
}
