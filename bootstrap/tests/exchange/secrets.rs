//! The job secret: matching secrets connect and prove every round; a wrong secret, a tampered
//! or replayed hello and a tampered table are refused, with the reason said; secrets stay out
//! of debug output.

use super::*;
use rverbs_bootstrap::ExchangeError;

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
            let rendezvous = rendezvous_of(rank, &listener, port);
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
