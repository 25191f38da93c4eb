//! Peers that misbehave against a real rank 0: foreign bytes, wrong versions, malformed and
//! oversized frames, wrong jobs, stalls, disconnects and duplicate ranks; each is refused or
//! named, and the real ranks still join.

use super::*;
use core::sync::atomic::{AtomicBool, Ordering};
use rverbs_bootstrap::ExchangeError;
use std::sync::Arc;

fn expect_refused(bytes: &[u8], needle: &str) {
    let options = quick_within(Duration::from_secs(1), Duration::from_millis(500));
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
    let options = quick_within(Duration::from_secs(1), Duration::from_millis(500));
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
fn a_wrong_protocol_version_is_refused() {
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
fn a_wrong_job_id_is_rejected_and_the_root_keeps_waiting() {
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

/// The exchange of the real rank `real` failed, rejected by rank 0 with a reason that names
/// `missing`.
fn assert_rejected_naming(real: thread::JoinHandle<Outcome>, missing: &str) {
    let err = real.join().unwrap().unwrap_err();
    assert!(
        matches!(&err, BootstrapError::Exchange(ExchangeError::Rejected { reason, .. }) if reason.contains(missing)),
        "{err:?}"
    );
}

#[test]
fn a_stalled_peer_times_out_naming_the_missing_ranks() {
    let (port, handle) = root(4, quick());
    // Rank 2 is real; a silent client takes a socket; ranks 1 and 3 never come.
    let _silent = TcpStream::connect(("127.0.0.1", port)).unwrap();
    // The real rank waits longer than rank 0, so it hears rank 0's verdict.
    let real = thread::spawn(move || exchange_at(at(port), 2, 4, b"two", &quick_long()));
    let shown = expect_root_timeout(handle, &[1, 3]);
    assert!(shown.contains("[1, 3]"), "{shown}");
    // Rank 0 tells the rank that did join why the exchange failed.
    assert_rejected_naming(real, "[1, 3]");
}

#[test]
fn a_stalled_socket_does_not_block_real_peers() {
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
fn a_peer_disconnecting_mid_frame_is_refused() {
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
fn a_peer_disconnecting_after_its_hello_becomes_missing_again() {
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
    assert_rejected_naming(real, "[2]");
}

#[test]
fn a_duplicate_rank_is_rejected_and_the_first_claim_kept() {
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
fn an_allgather_times_out_naming_the_silent_rank() {
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

#[test]
fn a_peer_that_reads_the_table_slowly_cannot_hold_rank_0_past_its_deadline() {
    // Rank 0's table is 16 MiB (its own blob); rank 1 reads it at about 640 KB/s, so every
    // write makes progress within io_timeout and the whole would take about 25 s. Rank 0's
    // exchange has a 2 s deadline: it must give up by then (plus one io_timeout of slack),
    // not follow the reader for as long as it likes.
    let options = ExchangeOptions {
        max_blob_size: 32 << 20,
        ..quick_within(Duration::from_secs(2), Duration::from_millis(500))
    };
    let (port, handle) = root_with(2, options, vec![0x5a; 16 << 20]);
    let mut slow = TcpStream::connect(("127.0.0.1", port)).unwrap();
    slow.write_all(&from_client(&frame(FrameKind::Hello, 0x5eed, 1, 2, b"one")))
        .unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    let drained = thread::spawn({
        let stop = Arc::clone(&stop);
        move || drain_slowly(slow, &stop, Duration::from_secs(40))
    });
    let (outcome, took) = handle.join().unwrap();
    stop.store(true, Ordering::Relaxed);
    let read = drained.join().unwrap();
    assert!(
        took < Duration::from_secs(4),
        "rank 0 took {took:?} past its 2 s deadline (outcome {:?}; the slow reader drained {read} bytes)",
        outcome.as_ref().map(|(_, blobs)| blobs.len())
    );
    let err = outcome.unwrap_err();
    let shown = err.to_string();
    assert!(
        matches!(
            &err,
            BootstrapError::Exchange(ExchangeError::Io {
                rank: 0,
                peer: Some(1),
                op: "send table",
                ..
            })
        ),
        "{err:?}"
    );
    assert!(shown.contains("deadline"), "{shown}");
}
