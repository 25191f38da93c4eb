//! The session watcher on 127.0.0.1: a rank whose session closes without a goodbye (its
//! process died) is reported at once, on rank 0 and, for rank 0, on every other rank; a rank
//! that closes on purpose is not; rounds still work while a watch runs.

use core::time::Duration;
use std::net::TcpListener;
use std::sync::mpsc;
use std::thread;

use rverbs_bootstrap::{exchange_at, ExchangeOptions, Rendezvous, Session};

fn options() -> ExchangeOptions {
    ExchangeOptions {
        job_id: 0x3a7c,
        timeout: Duration::from_secs(20),
        io_timeout: Duration::from_secs(5),
        retry_interval: Duration::from_millis(20),
        progress: false,
        ..ExchangeOptions::default()
    }
}

/// A connected world of `n` sessions, by rank.
fn world(n: u32) -> Vec<Session> {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let mut handles = Vec::new();
    for rank in 0..n {
        let rendezvous = if rank == 0 {
            Rendezvous::Listener(listener.try_clone().unwrap())
        } else {
            Rendezvous::Address {
                host: "127.0.0.1".into(),
                port,
            }
        };
        handles.push(thread::spawn(move || {
            exchange_at(rendezvous, rank, n, &[rank as u8], &options())
                .unwrap()
                .0
        }));
    }
    handles.into_iter().map(|h| h.join().unwrap()).collect()
}

/// Drops `session` the way a crash does: during a panic, so no goodbye is sent.
fn crash(session: Session) {
    let r = thread::spawn(move || {
        let _held = session;
        panic!("simulated crash");
    })
    .join();
    assert!(r.is_err());
}

#[test]
fn a_crash_is_reported_and_a_goodbye_is_not() {
    let mut sessions = world(4);
    let s3 = sessions.pop().unwrap();
    let s2 = sessions.pop().unwrap();
    let (tx, rx) = mpsc::channel();
    let watch0 = sessions[0]
        .watch(move |rank| tx.send(rank).unwrap())
        .unwrap();
    // Rounds work while the watch runs.
    let mut rounds: Vec<_> = Vec::new();
    let mut others = vec![s2, s3];
    let s1 = sessions.pop().unwrap();
    others.insert(0, s1);
    for mut s in others.drain(..) {
        rounds.push(thread::spawn(move || {
            let got = s.allgather(&[s.rank() as u8; 3]).unwrap();
            (s, got)
        }));
    }
    let mine = sessions[0].allgather(&[0; 3]).unwrap();
    assert_eq!(mine, (0..4u8).map(|r| vec![r; 3]).collect::<Vec<_>>());
    let mut rest: Vec<Session> = rounds.into_iter().map(|h| h.join().unwrap().0).collect();
    assert!(rx.try_recv().is_err(), "nothing failed yet");

    let s3 = rest.pop().unwrap();
    let s2 = rest.pop().unwrap();
    s3.close().unwrap();
    crash(s2);
    let lost = rx.recv_timeout(Duration::from_secs(5)).unwrap();
    assert_eq!(lost, 2, "rank 2 crashed");
    assert!(
        rx.recv_timeout(Duration::from_millis(500)).is_err(),
        "rank 3 said goodbye, and rank 2 is reported once"
    );

    // Rank 1 watches rank 0, which crashes.
    let s1 = rest.pop().unwrap();
    let (tx1, rx1) = mpsc::channel();
    let watch1 = s1.watch(move |rank| tx1.send(rank).unwrap()).unwrap();
    drop(watch0);
    crash(sessions.pop().unwrap());
    assert_eq!(rx1.recv_timeout(Duration::from_secs(5)).unwrap(), 0);
    drop(watch1);
}

#[test]
fn closing_my_own_session_is_not_a_peer_failure() {
    let mut sessions = world(2);
    let s1 = sessions.pop().unwrap();
    let s0 = sessions.pop().unwrap();
    let (tx, rx) = mpsc::channel();
    let _watch1 = s1.watch(move |rank| tx.send(rank).unwrap()).unwrap();
    s1.close().unwrap();
    let got = rx.recv_timeout(Duration::from_secs(1));
    drop(s0);
    assert!(got.is_err(), "rank 1's watch reported live rank 0: {got:?}");
}

/// Rank 0 runs a last round and leaves right after (goodbye, then close) while rank 1, watched,
/// still reads the round's answer: the watch only peeks, so the round gets every byte and the
/// goodbye is recognised behind it.
#[test]
fn a_last_round_and_a_goodbye_race_the_watch_harmlessly() {
    let iters = 60;
    let (mut failed, mut reported) = (0, 0);
    for _ in 0..iters {
        let mut sessions = world(2);
        let mut s1 = sessions.pop().unwrap();
        let mut s0 = sessions.pop().unwrap();
        let (tx, rx) = mpsc::channel();
        let watch1 = s1.watch(move |rank| tx.send(rank).unwrap()).unwrap();
        let h = thread::spawn(move || {
            s0.allgather(&[7u8; 4000]).unwrap();
            drop(s0);
        });
        if let Err(e) = s1.allgather(&[1u8; 4000]) {
            eprintln!("round failed: {e}");
            failed += 1;
        }
        h.join().unwrap();
        if rx.recv_timeout(Duration::from_millis(200)).is_ok() {
            reported += 1;
        }
        drop(watch1);
    }
    assert_eq!((failed, reported), (0, 0), "of {iters} rounds");
}
