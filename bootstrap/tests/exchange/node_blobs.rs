//! Node blobs: each rank receives only what the others made for it (up to 1024 ranks), plain
//! rounds after them, and the blobs and tables a personalized exchange refuses.

use super::*;
use rverbs_bootstrap::ExchangeError;

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
    let options = personalized(quick_within(
        Duration::from_secs(120),
        Duration::from_secs(60),
    ));
    let (listener, port) = listener();
    let handles: Vec<_> = (0..n)
        .map(|rank| {
            let options = options.clone();
            let rendezvous = rendezvous_of(rank, &listener, port);
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
fn node_blobs_among_1024_ranks_give_each_rank_only_what_was_made_for_it() {
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
fn plain_rounds_follow_a_node_blob_exchange() {
    let n = 5;
    let (listener, port) = listener();
    let handles: Vec<_> = (0..n)
        .map(|rank| {
            let rendezvous = rendezvous_of(rank, &listener, port);
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
fn an_oversized_or_mislabelled_node_blob_is_refused() {
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
fn a_personalized_peer_refuses_a_plain_or_oversized_table() {
    let cases = [
        BadRoot {
            // A personalized table leaves rank 1's own entry empty.
            case: "a plain table, rank 1's own entry not empty",
            act: |stream, header| {
                send_table(stream, header.job_id, &[b"root".as_slice(), b"one"]);
            },
            refused: |err| matches!(err, BootstrapError::Exchange(ExchangeError::Unexpected { reason, .. }) if reason.contains("own entry")),
        },
        BadRoot {
            case: "an entry longer than an addressed blob",
            act: |stream, header| {
                send_table(stream, header.job_id, &[node_blob(0, 2), Vec::new()]);
            },
            refused: |err| {
                matches!(
                    wire_error(err),
                    Some(WireError::TableEntryTooLarge {
                        index: 0,
                        limit: ADDRESSED_BLOB_LEN,
                        ..
                    })
                )
            },
        },
        BadRoot {
            case: "a table frame larger than two addressed entries can need",
            act: |stream, header| {
                let mut head = frame(FrameKind::Table, header.job_id, 0, 2, b"");
                head[24..28].copy_from_slice(&4000u32.to_le_bytes());
                stream.write_all(&head).unwrap();
            },
            refused: |err| {
                matches!(
                    err,
                    BootstrapError::Exchange(ExchangeError::Protocol {
                        rank: 1,
                        peer: Some(0),
                        source: WireError::PayloadTooLarge { len: 4000, .. },
                        ..
                    })
                )
            },
        },
    ];
    assert_each_refused(&cases, node_peer_error);
}
