//! A rank 0 that misbehaves against a real peer: closing, garbage, a huge table, a table that
//! does not echo the peer or is of the wrong size or job, silence, no rendezvous at all;
//! each ends in an error that names rank 0 and the cause.

use super::*;
use rverbs_bootstrap::ExchangeError;

#[test]
fn a_root_that_closes_without_answering_is_retried_until_the_timeout() {
    // A rank 0 that closes without answering is tried again (it may have shed
    // the connection under load) until the deadline, and the error says so.
    let (err, took) = against_fake_root(|_, _| {}, peer_error);
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
fn a_root_sending_garbage_or_a_wrong_table_is_refused_with_the_cause() {
    let cases = [
        BadRoot {
            case: "a root sending garbage is a protocol error",
            act: |stream, _| stream.write_all(&[0xab; 64]).unwrap(),
            refused: |err| matches!(wire_error(err), Some(WireError::BadMagic { .. })),
        },
        BadRoot {
            case: "a root announcing a huge table is refused before reading it",
            act: |stream, header| {
                let mut head = wire::Header {
                    kind: FrameKind::Table,
                    payload_len: u32::MAX,
                    sender: 0,
                    ..header
                }
                .encode();
                head[24..28].copy_from_slice(&u32::MAX.to_le_bytes());
                stream.write_all(&head).unwrap();
            },
            refused: |err| matches!(wire_error(err), Some(WireError::PayloadTooLarge { .. })),
        },
        BadRoot {
            case: "a root that does not echo our blob is refused",
            act: |stream, header| {
                send_table(stream, header.job_id, &[b"root".as_slice(), b"forged"]);
            },
            refused: |err| matches!(err, BootstrapError::Exchange(ExchangeError::Unexpected { reason, .. }) if reason.contains("echo")),
        },
        BadRoot {
            case: "a table of the wrong size is refused",
            act: |stream, header| send_table(stream, header.job_id, &[b"root".as_slice()]),
            refused: |err| matches!(err, BootstrapError::Exchange(ExchangeError::Unexpected { reason, .. }) if reason.contains("1 entries")),
        },
        BadRoot {
            case: "a table of the wrong job is refused",
            act: |stream, _| send_table(stream, 1, &[b"root".as_slice(), b"one"]),
            refused: |err| {
                matches!(
                    err,
                    BootstrapError::Exchange(ExchangeError::Unexpected { .. })
                )
            },
        },
    ];
    assert_each_refused(&cases, |port| peer_error(port).0);
}

#[test]
fn a_peer_reconnects_when_reset_before_an_answer() {
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
        send_table(&mut second, header.job_id, &[b"root".as_slice(), b"one"]);
    });
    let (_, blobs) = exchange_at(at(port), 1, 2, b"one", &quick()).unwrap();
    assert_eq!(blobs, vec![b"root".to_vec(), b"one".to_vec()]);
    fake.join().unwrap();
}

#[test]
fn a_root_that_never_answers_is_named_in_the_timeout() {
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
fn no_rendezvous_at_the_address_is_a_connect_error_naming_it() {
    let port = listener().1;
    let (err, took) = peer_error(port);
    assert!(
        matches!(&err, BootstrapError::Exchange(ExchangeError::Connect { rank: 1, addr, .. }) if addr == &format!("127.0.0.1:{port}")),
        "{err:?}"
    );
    assert!(took < Duration::from_secs(3), "took {took:?}");
}

#[test]
fn a_root_that_reads_the_hello_slowly_cannot_hold_a_peer_past_its_deadline() {
    // Rank 1's hello carries 16 MiB; the rank 0 it meets reads it at about 640 KB/s, so
    // every write makes progress within io_timeout and the whole would take about 25 s.
    // Rank 1's deadline is 2 s: it must give up by then (plus slack), naming rank 0.
    let (listener, port) = listener();
    let stop = Arc::new(AtomicBool::new(false));
    let fake = thread::spawn({
        let stop = Arc::clone(&stop);
        move || {
            let (mut stream, _) = listener.accept().unwrap();
            stream.write_all(&plain_challenge()).unwrap();
            drain_slowly(stream, &stop, Duration::from_secs(40))
        }
    });
    let options = ExchangeOptions {
        max_blob_size: 32 << 20,
        ..quick_within(Duration::from_secs(2), Duration::from_millis(500))
    };
    let start = Instant::now();
    let outcome = exchange_at(at(port), 1, 2, &vec![0x5a; 16 << 20], &options);
    let took = start.elapsed();
    stop.store(true, Ordering::Relaxed);
    let read = fake.join().unwrap();
    assert!(
        took < Duration::from_secs(4),
        "rank 1 took {took:?} past its 2 s deadline (outcome {:?}; the slow rank 0 read {read} bytes)",
        outcome.as_ref().map(|(_, blobs)| blobs.len())
    );
    let err = outcome.unwrap_err();
    assert!(
        matches!(
            &err,
            BootstrapError::Exchange(ExchangeError::Io {
                rank: 1,
                peer: Some(0),
                op: "send hello",
                ..
            }) | BootstrapError::Exchange(ExchangeError::Timeout { rank: 1, .. })
        ),
        "{err:?}"
    );
}

#[test]
fn a_reject_reason_is_made_safe_to_print() {
    // Rank 0's reason reaches the peer's error message, and so its terminal or log: a rank 0
    // (or whoever answers at its address, without a job secret) must not be able to send
    // escape sequences or forge log lines through it. A goodbye's reason is cleaned the
    // same way (`LastWord::GaveUp`).
    let (err, _) = against_fake_root(
        |stream, _| {
            let reason = "bad\x1b]0;pwned\x07 news\r\nrank 3: all is well\u{9b}2J";
            stream
                .write_all(&frame(FrameKind::Reject, 0x5eed, 0, 2, reason.as_bytes()))
                .unwrap();
        },
        peer_error,
    );
    let shown = err.to_string();
    assert!(
        matches!(
            &err,
            BootstrapError::Exchange(ExchangeError::Rejected { rank: 1, .. })
        ),
        "{err:?}"
    );
    assert!(!shown.chars().any(char::is_control), "{shown:?}");
    assert!(
        shown.contains("bad") && shown.contains("all is well"),
        "{shown:?}"
    );
}
