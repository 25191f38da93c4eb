//! Faults between separate processes on a real device.
//!
//! - A peer killed with SIGKILL while the survivor is blocked in each kind of wait (a blocking
//!   receive, a ticket of an unpolled send, the end of a scope, a multi-peer gather): the
//!   survivor gets an error naming the dead rank within its channel timeout plus the
//!   transport's retry time, nothing it posted is still in flight, and its buffers are its
//!   own again. A receive only ever learns of the death by its timeout.
//! - A send to a peer that is already dead: the device itself fails it (retries exceeded),
//!   well before the channel's timeout.
//! - Messaging whose handler panics: `start_messaging` with too many slots fails without
//!   posting anything, and after the panic every later message still arrives, in order,
//!   through more messages than the ring has slots.
//!
//! The parent tests start one child process per rank: this same test binary, running the
//! ignored `child_rank` entry point with the scenario in environment variables (as
//! `device_node.rs` does). The parent does the killing, so the victim dies the way a crashed
//! process does: no goodbye, its queue pairs destroyed by the kernel.
#![allow(clippy::std_instead_of_core, clippy::std_instead_of_alloc)] // test code

mod support;
use support::device;

use std::cell::{Cell, RefCell};
use std::os::unix::process::ExitStatusExt;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::Path;
use std::process::{Child, ExitStatus};
use std::time::{Duration, Instant};

use rverbs_bootstrap::{connect, OutOfBand};
use rverbs_core::channel::ChannelError;
use rverbs_core::completion::WcStatus;
use rverbs_core::multi::{MultiError, PeerError};
use rverbs_core::node::{Event, NodeError, SetupError, VerbsNode};
use rverbs_core::params::{RetryCount, RnrRetry};
use rverbs_core::poll::{Clock, Deadline};
use rverbs_core::verbs::AccessFlags;
use rverbs_std_shim::{Monotonic, StdBackoff, WaitPolicy, MONOTONIC};

/// Every channel's wait bound in these worlds (`ChannelConfig::timeout`).
const TIMEOUT: Duration = Duration::from_secs(3);
/// Scheduling slack on top of the bounds: the VM's 2 vCPUs run three processes here.
const SLACK: Duration = Duration::from_secs(2);
/// How long the parent lets the survivor sit in its wait before it kills the victim, so the
/// kill lands while the survivor is blocked, well before its timeout.
const BLOCKED_BEFORE_KILL: Duration = Duration::from_millis(500);
/// The waits `peer_killed_while_survivor_waits` covers, each in a world of its own.
const WAITS: [&str; 5] = ["recv", "wait", "scope", "gather_receive", "send_to_dead"];
/// Receive slots per peer in the messaging test, and the messages of its rounds: the first
/// round meets the panicking handler, the later 20 wrap the ring more than twice.
const SLOTS: usize = 8;
const ROUNDS: [u32; 4] = [5, 8, 8, 4];

/// A child process that is killed if the parent gives up on it (a failed assertion must not
/// leave ranks behind holding ports and queue pairs).
struct Kid {
    rank: u32,
    child: Child,
    status: Option<ExitStatus>,
}

impl Kid {
    fn spawn(scenario: &str, rank: u32, port: u16, dev: &str, mark: &Path) -> Self {
        let child = support::spawn_rank(
            "RVERBS_FAULT_",
            rank,
            port,
            dev,
            mark,
            &[("SCENARIO", scenario)],
        );
        Self {
            rank,
            child,
            status: None,
        }
    }

    /// The exit status if the process has ended.
    fn exited(&mut self) -> Option<ExitStatus> {
        if self.status.is_none() {
            self.status = self.child.try_wait().unwrap();
        }
        self.status
    }

    /// Waits for the process to end, at most `limit`; `None` if it is still running.
    fn wait_for(&mut self, limit: Duration) -> Option<ExitStatus> {
        let start = Instant::now();
        loop {
            if let Some(st) = self.exited() {
                return Some(st);
            }
            if start.elapsed() > limit {
                return None;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    fn kill(&mut self) {
        if self.exited().is_none() {
            self.child.kill().unwrap();
            self.status = Some(self.child.wait().unwrap());
        }
    }
}

impl Drop for Kid {
    fn drop(&mut self) {
        if self.exited().is_none() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// One world of 2: rank 0 (the survivor) blocks in `wait` on rank 1 (for `send_to_dead`: waits
/// for the kill, then sends); rank 1 (the victim) is killed meanwhile. The survivor checks its
/// own error, timing and buffers and exits 0; here we check that its error came after the
/// kill.
fn kill_peer_during(wait: &str, port: u16, dev: &str) -> Result<(), String> {
    let mark = support::scratch_dir(&format!("device-faults-{port}"));
    let mut survivor = Kid::spawn(wait, 0, port, dev, &mark);
    let mut victim = Kid::spawn(wait, 1, port, dev, &mark);
    let blocked = mark.join("blocked");
    let start = Instant::now();
    // The survivor writes the marker just before it enters the wait.
    while !blocked.exists() {
        for k in [&mut survivor, &mut victim] {
            if let Some(st) = k.exited() {
                return Err(format!(
                    "{wait}: rank {} ended before the survivor blocked: {st}",
                    k.rank
                ));
            }
        }
        if start.elapsed() > Duration::from_secs(120) {
            return Err(format!("{wait}: the survivor never got to its wait"));
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    let seen_blocked = Instant::now();
    std::thread::sleep(BLOCKED_BEFORE_KILL);
    if let Some(st) = survivor.exited() {
        return Err(format!(
            "{wait}: the survivor ended before the kill ({st}): it was not blocked"
        ));
    }
    // On the clock the survivor stamps its error with, to tell whether the error came after
    // the death (and not, say, from retries running out while the victim was still alive).
    let killed_at = MONOTONIC.now();
    let killed = Instant::now();
    victim.kill();
    let victim_status = victim.status.expect("kill waits for the process");
    // The victim is reaped: its queue pairs are gone.
    std::fs::write(mark.join("killed"), b"").unwrap();
    // The survivor's own bound is TIMEOUT + the ack retries + SLACK from the start of its
    // wait; the rest is process teardown.
    let status = survivor.wait_for(TIMEOUT + SLACK + Duration::from_secs(30));
    let failed_at = std::fs::read_to_string(mark.join("failed_at"))
        .ok()
        .and_then(|s| s.parse::<u64>().ok());
    let _ = std::fs::remove_dir_all(&mark);
    let after_kill = failed_at.map(|f| {
        let k = killed_at.as_nanos();
        if f >= k {
            format!("{:?} after", Duration::from_nanos(f - k))
        } else {
            format!("{:?} BEFORE", Duration::from_nanos(k - f))
        }
    });
    eprintln!(
        "{wait}: victim killed {:?} after the survivor blocked; the survivor's error came {} \
         the kill; it exited {:?} after the kill: {status:?}",
        killed.duration_since(seen_blocked),
        after_kill.as_deref().unwrap_or("(not stamped)"),
        killed.elapsed(),
    );
    if victim_status.signal() != Some(9) {
        return Err(format!(
            "{wait}: the victim was not running when it was killed: {victim_status}"
        ));
    }
    match status {
        None => {
            survivor.kill();
            return Err(format!("{wait}: the survivor hung after its peer died"));
        }
        Some(st) if !st.success() => return Err(format!("{wait}: survivor failed: {st}")),
        Some(_) => {}
    }
    match failed_at {
        Some(f) if f >= killed_at.as_nanos() => Ok(()),
        Some(_) => Err(format!(
            "{wait}: the survivor's error came before the victim was killed"
        )),
        None => Err(format!("{wait}: the survivor did not stamp its error")),
    }
}

#[test]
fn peer_killed_while_survivor_waits() {
    let Some(dev) = device() else {
        return;
    };
    let mut failed = Vec::new();
    for (i, wait) in WAITS.iter().enumerate() {
        let t = Instant::now();
        if let Err(e) = kill_peer_during(wait, 22000 + 10 * i as u16, &dev) {
            failed.push(e);
        }
        eprintln!("{wait}: world of 2 took {:?}", t.elapsed());
    }
    assert!(failed.is_empty(), "{failed:#?}");
}

#[test]
fn messaging_survives_a_panicking_handler() {
    let Some(dev) = device() else {
        return;
    };
    let port = 22100;
    let mark = support::scratch_dir(&format!("device-faults-{port}"));
    let start = Instant::now();
    let mut kids: Vec<Kid> = (0..2)
        .map(|r| Kid::spawn("messaging", r, port, &dev, &mark))
        .collect();
    let mut failed = Vec::new();
    for k in &mut kids {
        match k.wait_for(Duration::from_secs(300).saturating_sub(start.elapsed())) {
            Some(st) if st.success() => {}
            Some(st) => failed.push(format!("rank {}: {st}", k.rank)),
            None => failed.push(format!("rank {}: still running after 300 s", k.rank)),
        }
    }
    let _ = std::fs::remove_dir_all(&mark);
    eprintln!("messaging with 2 ranks: {:?}", start.elapsed());
    assert!(failed.is_empty(), "{failed:?}");
}

#[test]
#[ignore = "child-process entry point; the tests above run it"]
fn child_rank() {
    let (scenario, env) = support::scenario_env("RVERBS_FAULT_");
    let (rank, port, mark, dev) = (env.rank, env.port, env.dir, env.dev);
    let (config, mut opts) =
        support::local_options(2, port, &dev, format!("faults-{scenario}-{port}"));
    opts.node.channel.timeout = TIMEOUT;
    opts.wait = WaitPolicy::Sleep {
        spins: 64,
        pause: Duration::from_micros(20),
    };
    if scenario == "wait" {
        // The survivor's send must keep waiting on a victim that posts no receive (as long
        // as it lives) instead of failing on its own. On rxe this holds only with the
        // default retry count, 7, which rxe takes as "retry forever": with a finite count it
        // spends the transport retries during the receiver-not-ready wait and fails the
        // send after about half a second while the victim still lives.
        opts.node.qp.rnr_retry = RnrRetry::Infinite;
    }
    if scenario == "send_to_dead" {
        // rxe takes a retry count of 7 (our default) as "retry forever", so only a lower
        // count shows the device itself failing a request to a dead peer.
        opts.node.qp.retry_count = RetryCount::new(6).unwrap();
    }
    // How long the device retries an unanswered request before it fails it:
    // 4.096 us * 2^code per try, retry_count + 1 tries.
    let qp = opts.node.qp;
    let retries = qp.ack_timeout.duration().expect("a finite ack timeout")
        * (u32::from(qp.retry_count.get()) + 1);
    let c = connect(&config, rank, &opts).unwrap_or_else(|e| panic!("rank {rank}: connect: {e}"));
    let (mut node, mut session, clock) = (c.node, c.session, c.clock);
    match (scenario.as_str(), rank) {
        ("messaging", _) => messaging(&mut node, &mut session, &clock, rank),
        (_, 1) => victim(&mut session),
        (wait, _) => survivor(wait, &mut node, &mut session, &mark, retries),
    }
}

/// Stays connected, posting nothing, until the parent kills this process.
fn victim(session: &mut OutOfBand) {
    session.allgather(b"ready").unwrap();
    std::thread::sleep(Duration::from_secs(120));
    panic!("rank 1 was never killed");
}

/// Whether `e` names `rank` as the peer that failed.
fn names(e: &ChannelError, rank: u32) -> bool {
    match e {
        ChannelError::TimedOut { rank: peer } => *peer == Some(rank),
        ChannelError::Failed(w) | ChannelError::Broken(w) => w.rank == Some(rank),
        _ => false,
    }
}

/// Blocks in `wait` on rank 1, which the parent kills meanwhile, and checks what comes back.
fn survivor(
    wait: &str,
    node: &mut VerbsNode<StdBackoff>,
    session: &mut OutOfBand,
    mark: &Path,
    retries: Duration,
) {
    let pd = node.pd().clone();
    let mut buf = vec![0x11u8; 64];
    let mut mr = pd.register(&mut buf, AccessFlags::LOCAL_WRITE).unwrap();
    // The victim is connected and idle.
    session.allgather(b"ready").unwrap();
    // Tells the parent we are about to block; returns when the wait starts.
    let blocking = || {
        std::fs::write(mark.join("blocked"), b"").unwrap();
        Instant::now()
    };
    let (t, err) = match wait {
        "recv" => {
            let mut sges = [mr.sge_mut(0..64).unwrap()];
            let chan = node.channel(1).unwrap();
            let t = blocking();
            (t, chan.recv(&mut sges).unwrap_err())
        }
        "wait" => {
            let sges = [mr.sge(0..64).unwrap()];
            let chan = node.channel(1).unwrap();
            let mut batch = chan.batch();
            batch.send(&sges).unwrap();
            // SAFETY: `buf` is not touched until `wait` below returned, and `wait` returns
            // (with an error too) only once nothing the channel posted is in flight.
            let ticket = unsafe { batch.post() }.unwrap().expect("one request");
            let t = blocking();
            (t, chan.wait(ticket).unwrap_err())
        }
        "scope" => {
            let mut sges = [mr.sge_mut(0..64).unwrap()];
            let chan = node.channel(1).unwrap();
            let t = blocking();
            let err = chan
                .scope(|s| {
                    // The scope's end waits for this receive.
                    let _ = s.recv(&mut sges).unwrap();
                })
                .unwrap_err();
            (t, err)
        }
        "gather_receive" => {
            let mut sges = [mr.sge_mut(0..64).unwrap()];
            let t = blocking();
            let err = node
                .multi()
                .gather_receive([(1, &mut sges[..])], |p, info| {
                    panic!("rank {p} delivered {info:?} after it was killed")
                })
                .unwrap_err();
            match err {
                MultiError::Peer(PeerError { rank: 1, error }) => (t, error),
                other => panic!("gather_receive: expected a failure of rank 1, got {other}"),
            }
        }
        "send_to_dead" => {
            let sges = [mr.sge(0..64).unwrap()];
            let chan = node.channel(1).unwrap();
            // The parent kills the victim once we are "blocked" here, and says so.
            blocking();
            let killed = mark.join("killed");
            let start = Instant::now();
            while !killed.exists() {
                assert!(
                    start.elapsed() < Duration::from_secs(60),
                    "the parent never killed rank 1"
                );
                std::thread::sleep(Duration::from_millis(5));
            }
            let t = Instant::now();
            (t, chan.send(&sges).unwrap_err())
        }
        other => panic!("unknown wait {other}"),
    };
    let waited = t.elapsed();
    std::fs::write(
        mark.join("failed_at"),
        MONOTONIC.now().as_nanos().to_string(),
    )
    .unwrap();
    eprintln!("rank 0: {wait} returned after {waited:?}: {err}");

    let bound = TIMEOUT + retries + SLACK;
    if wait == "send_to_dead" {
        assert!(
            matches!(err, ChannelError::Failed(w) if w.status == WcStatus::RetryExceeded),
            "send_to_dead: with a finite retry count the device fails the send: {err:?}"
        );
        assert!(
            waited <= retries + SLACK,
            "send_to_dead: failed after {waited:?}, the device retries for {retries:?}"
        );
    }
    match err {
        ChannelError::TimedOut { rank: Some(1) } => assert!(
            waited >= TIMEOUT,
            "{wait}: timed out after {waited:?}, before its {TIMEOUT:?}"
        ),
        ChannelError::Failed(w) if w.rank == Some(1) => assert!(
            w.status == WcStatus::RetryExceeded,
            "{wait}: a dead peer fails a request with retries exceeded: {w}"
        ),
        other => panic!("{wait}: expected a timeout or failure naming rank 1, got {other:?}"),
    }
    assert!(
        waited <= bound,
        "{wait}: returned after {waited:?}, bound {bound:?} (timeout {TIMEOUT:?} + retries \
         {retries:?} + slack {SLACK:?})"
    );

    let chan = node.channel(1).unwrap();
    assert_eq!(
        (chan.outstanding_sends(), chan.outstanding_recvs()),
        (0, 0),
        "{wait}: requests still in flight after the error"
    );
    let failure = chan.fault().expect("the channel is broken");
    assert!(names(&failure, 1), "{wait}: {failure:?}");
    // A broken channel refuses new work at once instead of waiting again.
    let t = Instant::now();
    let again = chan.send_inline(b"anyone?").unwrap_err();
    assert!(names(&again, 1), "{wait}: {again:?}");
    eprintln!(
        "rank 0: {wait}: the next send failed after {:?}: {again}",
        t.elapsed()
    );

    // The buffer is ours again: through its registration, and after it.
    mr.as_mut_slice().fill(0xee);
    assert!(mr.as_slice().iter().all(|&b| b == 0xee));
    drop(mr);
    buf.fill(0x77);
    assert!(buf.iter().all(|&b| b == 0x77));
}

/// Message `seq` of the messaging test: its number, then bytes derived from it, 8 to 48
/// bytes long (under the 64-byte inline limit and slot size).
fn payload(seq: u32) -> Vec<u8> {
    let len = 8 + (seq as usize * 5) % 41;
    let mut m = seq.to_le_bytes().to_vec();
    m.extend((4..len).map(|i| (seq as u8).wrapping_mul(31) ^ i as u8));
    m
}

fn messaging(
    node: &mut VerbsNode<StdBackoff>,
    session: &mut OutOfBand,
    clock: &Monotonic,
    rank: u32,
) {
    let peer = 1 - rank;
    // Too many slots on a fresh node: refused, and nothing posted.
    let cap = node.channel(peer).unwrap().recv_capacity();
    assert_eq!(cap, 64, "a channel holds 64 receives by default");
    match node.start_messaging(cap as usize + 1, 64) {
        Err(SetupError::InvalidArgument { .. }) => {}
        other => panic!("rank {rank}: start_messaging(65, 64) gave {other:?}"),
    }
    assert_eq!(node.channel(peer).unwrap().outstanding_recvs(), 0);
    node.start_messaging(SLOTS, 64)
        .unwrap_or_else(|e| panic!("rank {rank}: start_messaging after a refusal: {e}"));
    assert_eq!(
        node.channel(peer).unwrap().outstanding_recvs(),
        SLOTS as u64
    );
    assert_eq!(
        node.start_messaging(SLOTS, 64),
        Err(SetupError::MessagingStarted)
    );
    // Every ring is posted before anyone sends.
    session.allgather(b"rings").unwrap();
    let t = Instant::now();
    if rank == 0 {
        send_rounds(node, session, clock);
    } else {
        receive_rounds(node, session, clock);
        // Every slot is back on the ring, the one whose handler panicked included.
        assert_eq!(node.channel(0).unwrap().outstanding_recvs(), SLOTS as u64);
    }
    eprintln!(
        "rank {rank}: {} messages through a ring of {SLOTS} slots in {:?}",
        ROUNDS.iter().sum::<u32>(),
        t.elapsed()
    );
    // Nobody tears down its queue pairs while the other may still write to it.
    session.allgather(b"done").unwrap();
}

/// Rank 0: each round's messages, then waits until rank 1 has them all (its completions,
/// then the out-of-band round), so at most one round (never more than `SLOTS`) is in flight.
fn send_rounds(node: &mut VerbsNode<StdBackoff>, session: &mut OutOfBand, clock: &Monotonic) {
    let mut seq = 0;
    for n in ROUNDS {
        let mut last = None;
        for _ in 0..n {
            // Without credit (rank 1 has not returned it yet) the send waits its turn.
            let deadline = Deadline::after(clock, Duration::from_secs(30));
            loop {
                let e = match node.post_send_inline(1, &payload(seq)) {
                    Ok(t) => {
                        last = Some(t);
                        break;
                    }
                    Err(e) => e,
                };
                assert!(
                    matches!(e, NodeError::WouldBlock { rank: 1 }),
                    "rank 0: {e}"
                );
                assert!(!deadline.passed(clock), "rank 0: no credit from rank 1");
                node.progress(64, |ev| {
                    assert!(
                        matches!(ev, Event::SendsCompleted { rank: 1, .. }),
                        "{ev:?}"
                    )
                })
                .unwrap();
            }
            seq += 1;
        }
        // Messages ask for a completion every 16th request: a wait for the round's last one
        // covers the ones after the last signaled (with a signaled zero-length write).
        if let Some(t) = last {
            node.wait(t)
                .unwrap_or_else(|e| panic!("rank 0: the round's last send: {e}"));
        }
        // Counts every send request of the channel, the first barrier's included.
        let chan = node.channel(1).unwrap();
        let target = chan.sends_completed() + chan.outstanding_sends();
        let completed = Cell::new(0u64);
        node.progress_until(
            Deadline::after(clock, Duration::from_secs(30)),
            |ev| match ev {
                Event::SendsCompleted {
                    rank: 1,
                    completed: c,
                } => completed.set(c),
                other => panic!("rank 0: unexpected event {other:?}"),
            },
            || completed.get() >= target,
        )
        .unwrap_or_else(|e| panic!("rank 0: sends up to {seq}: {e}"));
        session.allgather(b"round").unwrap();
    }
}

/// What the panicking handler saw.
#[derive(Debug)]
enum Seen {
    Nothing,
    Message(Vec<u8>),
    Other(String),
}

/// Rank 1: the handler panics on the first message; every later one must still arrive.
fn receive_rounds(node: &mut VerbsNode<StdBackoff>, session: &mut OutOfBand, clock: &Monotonic) {
    let seen = RefCell::new(Seen::Nothing);
    let deadline = Deadline::after(clock, Duration::from_secs(30));
    eprintln!("rank 1: the handler panics on purpose on the first message:");
    loop {
        let r = catch_unwind(AssertUnwindSafe(|| {
            node.progress(64, |ev| match ev {
                Event::Message { rank: 0, data, .. } => {
                    *seen.borrow_mut() = Seen::Message(data.to_vec());
                    panic!("the handler fails on purpose");
                }
                Event::SendsCompleted { .. } => {}
                other => *seen.borrow_mut() = Seen::Other(format!("{other:?}")),
            })
        }));
        let saw = seen.replace(Seen::Nothing);
        match (r, saw) {
            (Err(_), Seen::Message(m)) => {
                assert_eq!(m, payload(0), "the panicking handler saw message 0");
                break;
            }
            (Ok(Ok(_)), Seen::Nothing) => {}
            (_, Seen::Other(ev)) => panic!("rank 1: unexpected event {ev}"),
            (r, s) => panic!(
                "rank 1: progress gave {:?}, handler saw {s:?}",
                r.map_err(|_| "a panic")
            ),
        }
        assert!(!deadline.passed(clock), "rank 1: message 0 never came");
        std::thread::sleep(Duration::from_micros(100));
    }

    // Message 0 died with its handler; all later ones arrive in order.
    let mut seq = 1;
    let mut first = true;
    for n in ROUNDS {
        let want = if first { n - 1 } else { n };
        first = false;
        let got = RefCell::new(Vec::new());
        node.progress_until(
            Deadline::after(clock, Duration::from_secs(30)),
            |ev| match ev {
                Event::Message { rank: 0, data } => got.borrow_mut().push(data.to_vec()),
                Event::SendsCompleted { .. } => {}
                other => panic!("rank 1: unexpected event {other:?}"),
            },
            || got.borrow().len() >= want as usize,
        )
        .unwrap_or_else(|e| panic!("rank 1: waiting for message {seq} and on: {e}"));
        for m in got.into_inner() {
            assert_eq!(m, payload(seq), "rank 1: message {seq}");
            seq += 1;
        }
        session.allgather(b"round").unwrap();
    }
    assert_eq!(seq, ROUNDS.iter().sum::<u32>());
}
