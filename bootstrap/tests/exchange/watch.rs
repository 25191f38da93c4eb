//! The session watcher on 127.0.0.1: a rank whose session closes without a goodbye (its
//! process died) is reported at once, on rank 0 and, for rank 0, on every other rank; a rank
//! that closes on purpose is not; rounds still work while a watch runs. With a job secret,
//! only a goodbye whose MAC proves it counts: a forged or stale one is a failure.

use std::sync::mpsc;

use rverbs_bootstrap::wire::{Frame, Seal, MAC_LEN};
use rverbs_bootstrap::Departure;

use super::*;

fn options() -> ExchangeOptions {
    ExchangeOptions {
        job_id: 0x3a7c,
        io_timeout: Duration::from_secs(5),
        ..quick_long()
    }
}

/// A connected world of `n` sessions, by rank.
fn world(n: u32) -> Vec<Session> {
    world_with(n, options())
}

fn secret() -> JobSecret {
    JobSecret::new(b"the secret of the watch tests").unwrap()
}

fn with_secret() -> ExchangeOptions {
    ExchangeOptions {
        secret: Some(secret()),
        ..options()
    }
}

/// A connected world of `n` sessions, by rank, exchanged with `options`.
fn world_with(n: u32, options: ExchangeOptions) -> Vec<Session> {
    let (listener, port) = listener();
    let mut handles = Vec::new();
    for rank in 0..n {
        let rendezvous = rendezvous_of(rank, &listener, port);
        let options = options.clone();
        handles.push(thread::spawn(move || {
            exchange_at(rendezvous, rank, n, &[rank as u8], &options)
                .unwrap()
                .0
        }));
    }
    handles.into_iter().map(|h| h.join().unwrap()).collect()
}

/// A [`world`] of `N` sessions, by rank.
fn sessions<const N: usize>() -> [Session; N] {
    let all = world(u32::try_from(N).expect("a small world"));
    all.try_into()
        .unwrap_or_else(|all: Vec<Session>| panic!("{} sessions, not {N}", all.len()))
}

/// A watch on `session` (it watches until dropped), and what it reports: each lost rank and
/// how it left. (The watch's type is not exported, hence `impl Sized`.)
fn watched(session: &Session) -> (impl Sized, mpsc::Receiver<(u32, Departure)>) {
    let (tx, rx) = mpsc::channel();
    let watch = session
        .watch(move |rank, how| tx.send((rank, how)).unwrap())
        .unwrap();
    (watch, rx)
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
    let (watch0, rx) = watched(&sessions[0]);
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
    assert_eq!(lost, (2, Departure::Crashed), "rank 2 crashed");
    assert!(
        rx.recv_timeout(Duration::from_millis(500)).is_err(),
        "rank 3 said goodbye, and rank 2 is reported once"
    );

    // Rank 1 watches rank 0, which crashes.
    let s1 = rest.pop().unwrap();
    let (tx1, rx1) = mpsc::channel();
    let watch1 = s1
        .watch(move |rank, how| tx1.send((rank, how)).unwrap())
        .unwrap();
    drop(watch0);
    crash(sessions.pop().unwrap());
    assert_eq!(
        rx1.recv_timeout(Duration::from_secs(5)).unwrap(),
        (0, Departure::Crashed)
    );
    drop(watch1);
}

#[test]
fn closing_my_own_session_is_not_a_peer_failure() {
    let mut sessions = world(2);
    let s1 = sessions.pop().unwrap();
    let s0 = sessions.pop().unwrap();
    let (_watch1, rx) = watched(&s1);
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
    race_a_last_round_and_a_goodbye(options());
}

/// As above with a job secret: the goodbye's MAC verifies whichever frames the round has
/// read when the watch peeks.
#[test]
fn a_last_round_and_a_proven_goodbye_race_the_watch_harmlessly() {
    race_a_last_round_and_a_goodbye(with_secret());
}

fn race_a_last_round_and_a_goodbye(options: ExchangeOptions) {
    let iters = 60;
    let (mut failed, mut reported) = (0, 0);
    for _ in 0..iters {
        let mut sessions = world_with(2, options.clone());
        let mut s1 = sessions.pop().unwrap();
        let mut s0 = sessions.pop().unwrap();
        let (watch1, rx) = watched(&s1);
        let h = thread::spawn(move || {
            s0.allgather(&[7u8; 4000]).unwrap();
            s0.close().unwrap();
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

/// Reads one frame whole, or `None` if the connection ends first.
fn read_raw(stream: &mut TcpStream) -> Option<(wire::Header, Vec<u8>, Option<[u8; MAC_LEN]>)> {
    let mut head = [0u8; HEADER_LEN];
    stream.read_exact(&mut head).ok()?;
    let header = wire::decode_header(&head).unwrap();
    let mut payload = vec![0; header.payload_len as usize];
    stream.read_exact(&mut payload).ok()?;
    let mut mac = [0u8; MAC_LEN];
    if header.mac {
        stream.read_exact(&mut mac).ok()?;
    }
    Some((header, payload, header.mac.then_some(mac)))
}

/// Reads the next frame and checks it with `seal`.
fn open_next(stream: &mut TcpStream, seal: &mut Seal) -> FrameKind {
    let (header, payload, mac) = read_raw(stream).expect("a frame from rank 0");
    seal.open(&Frame {
        header,
        payload: &payload,
        mac: mac.as_ref(),
    })
    .unwrap();
    header.kind
}

/// Rank 0 (real, with the job secret, watching) and a hand-made rank 1 holding the secret:
/// rank 1 joins, then sends `last(seal)` and hangs up. Returns whether rank 0's watch
/// reported rank 1 (as a crash: none of these goodbyes carries a reason).
fn reported_after(last: impl FnOnce(&mut Seal) -> Vec<u8>) -> bool {
    let how = departure_after(last);
    if let Some(how) = &how {
        assert_eq!(*how, Departure::Crashed, "only a crash here");
    }
    how.is_some()
}

/// Rank 0 (real, with the job secret, watching) and a hand-made rank 1 holding the secret:
/// rank 1 joins, then sends `last(seal)` and hangs up. How rank 0's watch reported rank 1,
/// if it did.
fn departure_after(last: impl FnOnce(&mut Seal) -> Vec<u8>) -> Option<Departure> {
    const JOB: u64 = 0x3a7c;
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let root = thread::spawn(move || {
        exchange_at(
            Rendezvous::Listener(listener),
            0,
            2,
            b"zero",
            &with_secret(),
        )
        .unwrap()
        .0
    });
    let mut stream = TcpStream::connect(("127.0.0.1", port)).unwrap();
    stream
        .set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    let mut seal = Seal::peer(Some(&secret()), [0x5a; wire::CHALLENGE_LEN]);
    stream.write_all(&seal.challenge_frame(JOB, 1, 2)).unwrap();
    assert_eq!(open_next(&mut stream, &mut seal), FrameKind::Challenge);
    stream
        .write_all(&seal.encode(FrameKind::Hello, JOB, 1, 2, b"one").unwrap())
        .unwrap();
    assert_eq!(open_next(&mut stream, &mut seal), FrameKind::Table);
    let session = root.join().unwrap();
    let (watch, rx) = watched(&session);
    stream.write_all(&last(&mut seal)).unwrap();
    drop(stream);
    let got = rx.recv_timeout(Duration::from_secs(2));
    drop(watch);
    got.ok().map(|(rank, how)| {
        assert_eq!(rank, 1);
        how
    })
}

#[test]
fn a_rank_that_leaves_on_error_is_reported_with_its_reason_and_a_close_is_not() {
    let [s0, s1, s2] = sessions::<3>();
    let (_watch, rx) = watched(&s0);
    let why = "ping-pong with rank 0: local QP operation error";
    s1.leave_on_error(why).unwrap();
    assert_eq!(
        rx.recv_timeout(Duration::from_secs(5)).unwrap(),
        (1, Departure::GaveUp(why.to_owned()))
    );
    s2.close().unwrap();
    assert!(
        rx.recv_timeout(Duration::from_millis(500)).is_err(),
        "a deliberate close was reported"
    );
}

#[test]
fn a_session_dropped_without_close_is_reported_as_giving_up() {
    let [s0, s1] = sessions::<2>();
    let (_watch, rx) = watched(&s0);
    // What `?` out of `main` does: the session goes out of scope, no panic, no close.
    drop(s1);
    assert_eq!(
        rx.recv_timeout(Duration::from_secs(5)).unwrap(),
        (
            1,
            Departure::GaveUp(rverbs_bootstrap::DROPPED_REASON.to_owned())
        )
    );
}

#[test]
fn a_reason_counts_only_if_the_mac_proves_it_and_is_made_safe_to_print() {
    const JOB: u64 = 0x3a7c;
    let gave_up = |why: &'static [u8]| {
        move |seal: &mut Seal| seal.encode(FrameKind::Bye, JOB, 1, 2, why).unwrap()
    };
    assert_eq!(
        departure_after(gave_up(b"disk full")),
        Some(Departure::GaveUp("disk full".into()))
    );
    // A terminal escape and a line break in a peer's words never reach a log as such.
    assert_eq!(
        departure_after(gave_up(b"\x1b[2Jbad\nnews")),
        Some(Departure::GaveUp("?[2Jbad?news".into()))
    );
    // Someone who changed the reason on the wire: the MAC fails, so it is a crash.
    assert_eq!(
        departure_after(|seal| {
            let mut frame = gave_up(b"disk full")(seal);
            frame[wire::HEADER_LEN] ^= 0x20;
            frame
        }),
        Some(Departure::Crashed)
    );
    // A reason longer than MAX_REASON is cut.
    let long: &'static [u8] = Box::leak(vec![b'x'; 4 * wire::MAX_REASON].into_boxed_slice());
    assert_eq!(
        departure_after(gave_up(long)),
        Some(Departure::GaveUp("x".repeat(wire::MAX_REASON)))
    );
}

#[test]
fn a_goodbye_counts_only_if_its_mac_proves_it() {
    const JOB: u64 = 0x3a7c;
    let bye = |seal: &mut Seal| seal.encode(FrameKind::Bye, JOB, 1, 2, &[]).unwrap();
    // The real thing: a clean leave, not reported.
    assert!(!reported_after(bye), "a proven goodbye was reported");
    // The right header with a MAC that proves nothing: a crash dressed up as a goodbye.
    assert!(
        reported_after(|seal| {
            let mut frame = bye(seal);
            let last = frame.len() - 1;
            frame[last] ^= 1;
            frame
        }),
        "a forged goodbye hid a failure"
    );
    // A goodbye as a rank without the secret sends it: no MAC at all.
    assert!(
        reported_after(|_| wire::encode_frame(FrameKind::Bye, JOB, 1, 2, &[]).unwrap()),
        "a goodbye without a MAC was taken on a connection with a secret"
    );
    // A genuine goodbye from another connection (other challenges): stale here.
    assert!(
        reported_after(|_| {
            let mut other = Seal::peer(Some(&secret()), [0x77; wire::CHALLENGE_LEN]);
            let _ = other.challenge_frame(JOB, 1, 2);
            other.encode(FrameKind::Bye, JOB, 1, 2, &[]).unwrap()
        }),
        "another connection's goodbye was taken"
    );
    // This connection's own goodbye, twice: the second copy stands where the next frame
    // would, and its MAC is for the place before.
    assert!(
        reported_after(|seal| {
            let mut twice = bye(seal);
            twice.extend_from_slice(&twice.clone());
            twice
        }),
        "a goodbye replayed out of its place was taken"
    );
}
