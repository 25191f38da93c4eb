//! Worlds that work: every rank gets every blob (1 to 64 ranks, the largest blobs
//! allowed, ranks started from a cluster config), rounds after the exchange, and the
//! arguments an exchange refuses.

use super::*;
use rverbs_bootstrap::ExchangeError;

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
fn two_ranks_each_receive_every_blob() {
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
fn eight_ranks_each_receive_every_blob() {
    assert_full_exchange(8);
}

#[test]
fn sixty_four_ranks_each_receive_every_blob() {
    let start = Instant::now();
    assert_full_exchange(64);
    eprintln!("64-rank exchange on 127.0.0.1 took {:?}", start.elapsed());
}

#[test]
fn blobs_of_64_kib_travel_and_one_byte_more_is_refused() {
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
fn ranks_started_from_a_cluster_config_find_each_other() {
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
fn a_rank_out_of_range_or_a_listener_on_rank_1_is_refused() {
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

#[test]
fn the_longest_io_timeout_and_retry_interval_neither_panic_nor_outlast_the_deadline() {
    // `Duration::MAX` is how a caller says "no limit of its own, the deadline decides":
    // every deadline computed from them must saturate, not overflow.
    let options = ExchangeOptions {
        io_timeout: Duration::MAX,
        retry_interval: Duration::MAX,
        ..quick_long()
    };
    let outcomes = run_ranks(3, &[], &options, blob_of);
    let expected: Vec<Vec<u8>> = (0..3).map(blob_of).collect();
    let mut sessions: Vec<Session> = outcomes
        .into_iter()
        .map(|outcome| {
            let (session, blobs) = outcome.unwrap().unwrap_or_else(|error| panic!("{error}"));
            assert_eq!(blobs, expected);
            session
        })
        .collect();
    let handles: Vec<_> = sessions
        .drain(..)
        .map(|mut session| thread::spawn(move || session.allgather(b"again").map(|_| session)))
        .collect();
    for handle in handles {
        handle.join().unwrap().unwrap();
    }
    // A rank 0 whose one peer stalls mid-frame still ends at its deadline.
    let (port, handle) = root(
        2,
        ExchangeOptions {
            io_timeout: Duration::MAX,
            ..quick_within(Duration::from_secs(1), Duration::MAX)
        },
    );
    let mut stalled = TcpStream::connect(("127.0.0.1", port)).unwrap();
    stalled
        .write_all(&from_client(&frame(FrameKind::Hello, 0x5eed, 1, 2, b"x"))[..HEADER_LEN + 6])
        .unwrap();
    expect_root_timeout(handle, &[1]);
}
