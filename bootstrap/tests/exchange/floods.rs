//! Hostile clients at rank 0's port: floods of idle connections and drip-fed hellos do not
//! keep a real rank out, and a drip-fed hello is cut off at the I/O timeout.

use super::*;

/// Rank 1 of 2 joining at `port`, and how long it took.
fn timed_rank_one(port: u16, options: ExchangeOptions) -> thread::JoinHandle<(Outcome, Duration)> {
    thread::spawn(move || {
        let start = Instant::now();
        let outcome = exchange_at(at(port), 1, 2, b"one", &options);
        (outcome, start.elapsed())
    })
}

/// Rank 1's exchange succeeded with both ranks' blobs.
fn assert_rank_one_joined(outcome: Outcome) {
    let (_, blobs) = outcome.unwrap_or_else(|error| panic!("{error}"));
    assert_eq!(blobs, vec![b"root".to_vec(), b"one".to_vec()]);
}

#[test]
fn a_flood_of_idle_connections_does_not_keep_a_real_rank_out() {
    raise_fd_limit();
    // Idle clients would hold their place for io_timeout; the real rank must get
    // in well before that, because rank 0 closes the oldest idle ones for it.
    let options = quick_within(Duration::from_secs(20), Duration::from_secs(3));
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
    assert_rank_one_joined(outcome);
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
    let options = quick_within(Duration::from_secs(20), Duration::from_secs(1));
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
    assert_rank_one_joined(outcome);
    let reconnects = drip.join().unwrap();
    root.join().unwrap().0.unwrap();
    eprintln!("rank 1 joined among 260 drip-feeding clients in {took:?} ({reconnects} reconnects)");
    assert!(took < Duration::from_secs(5), "took {took:?}");
}

#[test]
fn a_drip_fed_hello_is_cut_off_at_io_timeout() {
    let options = quick_within(Duration::from_secs(3), Duration::from_secs(1));
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
