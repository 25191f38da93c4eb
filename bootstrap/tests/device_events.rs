//! Completion events on a real device: a waiter under `WaitPolicy::Block` sleeps in the
//! kernel and the NIC wakes it.
//!
//! - A receiver blocked on its completion channel wakes for a send and for a write with
//!   immediate; the wake-up time (sender's post to receiver's return, one clock) is printed,
//!   and the receiver's CPU time proves it slept rather than spun.
//! - A blocked waiter with nothing coming returns at its deadline.
//! - No lost wake-up: a ping-pong of 50,000 round trips in which both sides block on every
//!   wait (100,000 block/wake cycles); a lost wake-up would show as a sleep that ran to its
//!   limit while the wait's deadline was still seconds away (`BlockedSleeps::expired`).
//!
//! Both channels live in this process, each driven by its own thread.
#![allow(clippy::std_instead_of_core, clippy::std_instead_of_alloc)] // test code

mod support;

use rverbs_core::node::Members;
use std::time::{Duration, Instant};

use rverbs_core::channel::{Channel, ChannelConfig, ChannelError};
use rverbs_core::provider::verbs::{PreparedVerbs, VerbsProvider};
use rverbs_core::verbs::{open_device, AccessFlags, Context, Pd, QpConfig};
use rverbs_std_shim::{BlockedSleeps, StdBackoff, WaitPolicy, MONOTONIC};
use rverbs_testkit::counted;

type Chan = Channel<VerbsProvider, StdBackoff>;

// The blocking waits (arm, sleep, take and acknowledge events) must not allocate: counted
// per thread around them.
#[global_allocator]
static GLOBAL: rverbs_testkit::Counting = rverbs_testkit::Counting;

/// Block at once: every wait that does not find its completion on the first poll sleeps.
const BLOCK: WaitPolicy = WaitPolicy::Block { spins: 0 };

fn open(test: &str) -> Option<Context> {
    let d = support::device()?;
    eprintln!("{test}: on {d}");
    Some(open_device(&d).unwrap_or_else(|e| panic!("{test}: {d}: {e}")))
}

/// [`open`], and a protection domain on the device.
fn open_with_pd(test: &str) -> Option<(Context, Pd)> {
    let ctx = open(test)?;
    let pd = ctx.alloc_pd().unwrap();
    Some((ctx, pd))
}

/// Two connected channels whose queues raise completion events, each waiting with `policy`.
fn pair(ctx: &Context, pd: &Pd, timeout: Duration, policy: WaitPolicy) -> (Chan, Chan) {
    let qp = QpConfig::default();
    let a = PreparedVerbs::with_events(ctx, pd, &qp).unwrap();
    let b = PreparedVerbs::with_events(ctx, pd, &qp).unwrap();
    let (ea, eb) = (a.endpoint(), b.endpoint());
    let a = a.handshake(&eb).unwrap();
    let b = b.handshake(&ea).unwrap();
    assert!(a.events().is_some() && b.events().is_some());
    let cfg = ChannelConfig::with_timeout(timeout);
    let chan = |p| Channel::with_backoff(p, cfg, policy.backoff(), &MONOTONIC);
    let (a, b) = (chan(a), chan(b));
    assert!(a.backoff().has_wakeup() && b.backoff().has_wakeup());
    (a, b)
}

/// CPU time the calling thread has used (`/proc/thread-self/schedstat`, nanoseconds).
fn thread_cpu() -> Duration {
    let s = std::fs::read_to_string("/proc/thread-self/schedstat").expect("schedstat");
    let ns: u64 = s.split_whitespace().next().unwrap().parse().unwrap();
    Duration::from_nanos(ns)
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    sorted[((sorted.len() - 1) as f64 * p).round() as usize]
}

/// The sender posts `n` messages `gap` apart with `post`; the receiver blocks for each with
/// `recv`. Returns the wake-up times and the receiver's CPU time over its waits.
fn wake_ups(
    a: &mut Chan,
    b: &mut Chan,
    n: usize,
    gap: Duration,
    post: impl Fn(&mut Chan, u32) + Send,
    recv: impl Fn(&mut Chan, u32) + Send + Sync,
) -> (Vec<Duration>, Duration, Duration) {
    let (sent, (received, cpu, wall)) = std::thread::scope(|s| {
        let rx = s.spawn(|| {
            let (cpu0, t0) = (thread_cpu(), Instant::now());
            let mut at = Vec::with_capacity(n);
            for i in 0..n {
                recv(b, i as u32);
                at.push(Instant::now());
            }
            (at, thread_cpu() - cpu0, t0.elapsed())
        });
        let mut at = Vec::with_capacity(n);
        for i in 0..n {
            std::thread::sleep(gap);
            at.push(Instant::now());
            post(a, i as u32);
        }
        (at, rx.join().unwrap())
    });
    let mut lat: Vec<Duration> = sent
        .iter()
        .zip(&received)
        .map(|(s, r)| r.saturating_duration_since(*s))
        .collect();
    lat.sort();
    (lat, cpu, wall)
}

/// Wake-ups of each kind the test times.
const N: usize = 200;

/// Reports the `N` wake-ups of `what` ([`report`]), then checks the receiver slept through
/// them. Sleeping, not spinning: waits of about 2 ms each leave the receiver's CPU idle most
/// of the time (a spinning receiver would use all of it); at least half of the waits since
/// `sleeps` counted `woken_before` ended woken, and no sleep outlasted its wake-up.
fn assert_receiver_slept(
    what: &str,
    (lat, cpu, wall): (&[Duration], Duration, Duration),
    sleeps: BlockedSleeps,
    woken_before: u64,
) {
    report(what, lat, cpu, wall, sleeps);
    assert!(
        cpu < wall / 2,
        "{what}: receiver used {cpu:?} of CPU in {wall:?}: it did not sleep"
    );
    assert!(
        sleeps.woken - woken_before >= N as u64 / 2,
        "{what}: {sleeps:?}"
    );
    assert_eq!(sleeps.expired, 0, "{what}: a sleep outlasted its wake-up");
}

fn report(
    what: &str,
    lat: &[Duration],
    cpu: Duration,
    wall: Duration,
    sleeps: impl std::fmt::Debug,
) {
    println!(
        "{what}: {} wake-ups, median {:?}, p99 {:?}, max {:?}; receiver CPU {:?} over {:?} of \
         waiting ({:.1}%); sleeps {sleeps:?}",
        lat.len(),
        percentile(lat, 0.5),
        percentile(lat, 0.99),
        lat[lat.len() - 1],
        cpu,
        wall,
        100.0 * cpu.as_secs_f64() / wall.as_secs_f64()
    );
}

#[test]
fn blocked_receiver_wakes_for_a_send_and_for_a_write_with_immediate() {
    let Some((ctx, pd)) = open_with_pd("blocked_receiver_wakes") else {
        return;
    };
    let (mut a, mut b) = pair(&ctx, &pd, Duration::from_secs(10), BLOCK);
    let mut buf = vec![0u8; 64];
    let mut mr = pd.register(&mut buf, AccessFlags::LOCAL_WRITE).unwrap();
    let target = pd
        .register_shared(
            vec![0u8; 64].into_boxed_slice(),
            AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE,
        )
        .unwrap();
    let remote = target.remote();
    let gap = Duration::from_millis(2);

    // Sends: the payload is the sequence number, checked on arrival.
    let mr_cell = std::sync::Mutex::new(&mut mr);
    let (lat, cpu, wall) = wake_ups(
        &mut a,
        &mut b,
        N,
        gap,
        |a, i| a.send_inline(&i.to_le_bytes()).unwrap(),
        |b, i| {
            let mut mr = mr_cell.lock().unwrap();
            let done = b.recv(&mut [mr.sge_mut(0..64).unwrap()]).unwrap();
            assert_eq!(done.byte_len, 4);
            assert_eq!(&mr.as_slice()[..4], &i.to_le_bytes());
        },
    );
    let sleeps_after_sends = b.backoff().blocked_sleeps();
    assert_receiver_slept("send", (&lat, cpu, wall), sleeps_after_sends, 0);

    // Writes with immediate: the receive carries the immediate, the bytes land in `target`.
    let (lat, cpu, wall) = wake_ups(
        &mut a,
        &mut b,
        N,
        gap,
        |a, i| {
            let t = a
                .post_write_imm_inline(&i.to_le_bytes(), remote.slice(0, 4).unwrap(), i)
                .unwrap();
            a.wait(t).unwrap();
        },
        |b, i| {
            let mut mr = mr_cell.lock().unwrap();
            let done = b.recv(&mut [mr.sge_mut(0..64).unwrap()]).unwrap();
            assert!(done.written);
            assert_eq!(done.imm, Some(i));
        },
    );
    let sleeps = b.backoff().blocked_sleeps();
    assert_receiver_slept(
        "write with immediate",
        (&lat, cpu, wall),
        sleeps,
        sleeps_after_sends.woken,
    );
    let mut last = [0u8; 4];
    target.read_into(0, &mut last);
    assert_eq!(u32::from_le_bytes(last), N as u32 - 1);
}

#[test]
fn blocked_waiter_returns_at_its_deadline() {
    let Some((ctx, pd)) = open_with_pd("blocked_waiter_returns_at_its_deadline") else {
        return;
    };
    let (_a, mut b) = pair(&ctx, &pd, Duration::from_secs(10), BLOCK);
    let mut buf = vec![0u8; 64];
    let mut mr = pd.register(&mut buf, AccessFlags::LOCAL_WRITE).unwrap();
    let limit = Duration::from_millis(300);
    let (cpu0, t0) = (thread_cpu(), Instant::now());
    let r = b.recv_timeout(&mut [mr.sge_mut(0..64).unwrap()], limit);
    let (cpu, waited) = (thread_cpu() - cpu0, t0.elapsed());
    println!(
        "deadline {limit:?}: returned after {waited:?} using {cpu:?} of CPU; sleeps {:?}",
        b.backoff().blocked_sleeps()
    );
    assert!(matches!(r, Err(ChannelError::TimedOut { .. })), "{r:?}");
    assert!(waited >= limit, "returned before its deadline: {waited:?}");
    // The flush after the timeout is quick on rxe; a second of slack covers the VM.
    assert!(
        waited < limit + Duration::from_secs(1),
        "overslept: {waited:?}"
    );
    assert!(
        cpu < waited / 2,
        "used {cpu:?} of CPU in {waited:?}: it did not sleep"
    );
    assert!(b.backoff().blocked_sleeps().expired >= 1);
}

#[test]
fn no_lost_wake_up_in_100_000_block_wake_cycles() {
    let Some((ctx, pd)) = open_with_pd("no_lost_wake_up_in_100_000_block_wake_cycles") else {
        return;
    };
    // Deadlines far beyond any wake-up: a sleep that runs out is a lost wake-up.
    let (mut a, mut b) = pair(&ctx, &pd, Duration::from_secs(30), BLOCK);
    let round_trips: u32 = std::env::var("RVERBS_WAKE_CYCLES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(100_000)
        / 2;
    let mut abuf = vec![0u8; 64];
    let mut bbuf = vec![0u8; 64];
    let mut amr = pd.register(&mut abuf, AccessFlags::LOCAL_WRITE).unwrap();
    let mut bmr = pd.register(&mut bbuf, AccessFlags::LOCAL_WRITE).unwrap();
    // A watchdog: a thread that sleeps 10 ms at a time and counts the sleeps that overran
    // by 60 ms or more (the emulated VM not running its threads for that long). A blocked
    // sleep can also run out when the partner thread is not run for its whole 100 ms cap;
    // only a sleep that ran out while the VM kept running is a lost wake-up.
    let stop = std::sync::atomic::AtomicBool::new(false);
    let stalls = std::sync::atomic::AtomicU64::new(0);
    let t0 = Instant::now();
    let allocations = std::thread::scope(|s| {
        s.spawn(|| {
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                let t = Instant::now();
                std::thread::sleep(Duration::from_millis(10));
                if t.elapsed() >= Duration::from_millis(70) {
                    stalls.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                }
            }
        });
        let ponger = s.spawn(|| {
            counted(|| {
                for i in 0..round_trips {
                    let d = b.recv(&mut [bmr.sge_mut(0..64).unwrap()]).unwrap();
                    assert_eq!(d.byte_len, 4);
                    b.send_inline(&i.to_le_bytes()).unwrap();
                }
            })
            .1
        });
        let ((), pinger) = counted(|| {
            for i in 0..round_trips {
                // Post the receive for the answer first, then ping, then block for the pong.
                let mut scatter = [amr.sge_mut(0..64).unwrap()];
                let got = a
                    .scope(|sc| {
                        let r = sc.recv(&mut scatter).unwrap();
                        sc.send_inline(&i.to_le_bytes()).unwrap();
                        sc.wait(r).unwrap()
                    })
                    .unwrap();
                assert_eq!(got.byte_len, 4);
            }
        });
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
        pinger + ponger.join().expect("the ponger thread")
    });
    let elapsed = t0.elapsed();
    let stalls = stalls.load(std::sync::atomic::Ordering::Relaxed);
    let (sa, sb) = (a.backoff().blocked_sleeps(), b.backoff().blocked_sleeps());
    println!(
        "{round_trips} round trips ({} block/wake cycles) in {elapsed:?} ({:?} per round \
         trip); sleeps: pinger {sa:?}, ponger {sb:?}; VM stalls of 60 ms or more: {stalls}",
        2 * round_trips,
        elapsed / round_trips.max(1)
    );
    // Every sleep that ran out needs a stall to explain it; with none, it is a lost wake-up.
    assert!(
        sa.expired + sb.expired <= stalls,
        "lost wake-ups: {} sleeps ran out, {stalls} VM stalls to explain them: {sa:?} {sb:?}",
        sa.expired + sb.expired
    );
    assert_eq!(
        allocations, 0,
        "blocking waits allocated {allocations} times"
    );
    // The waits did block (rather than always finding their completion already there).
    assert!(
        sa.woken + sb.woken >= u64::from(round_trips),
        "{sa:?} {sb:?}"
    );
}

/// Failure news raised on a node's alarm (what the session watch does when a rank's
/// connection closes without a goodbye) wakes the node asleep in a barrier at once: the
/// sleep it falls into ends by the alarm's waker, not by running out.
#[test]
fn failure_news_wakes_a_node_asleep_in_a_barrier() {
    use rverbs_core::barrier::BarrierError;
    use rverbs_core::failure::{Failure, FailureCause};
    use rverbs_core::node::{NodeConfig, NodeError};

    let Some(ctx) = open("failure_news_wakes_a_node_asleep_in_a_barrier") else {
        return;
    };
    let mut cfg = NodeConfig::default();
    cfg.completion_events = true;
    let mut nodes = support::loopback_nodes(&ctx, 2, cfg, BLOCK.backoff());
    let mut node = nodes.remove(0);
    let _silent = nodes.remove(0); // rank 1 never joins the barrier
    assert!(node.backoff().has_wakeup());

    let alarm = node.failure_alarm();
    let raise_after = Duration::from_millis(300);
    let timeout = Duration::from_secs(20);
    let t0 = Instant::now();
    let raiser = std::thread::spawn(move || {
        std::thread::sleep(raise_after);
        let raised_at = Instant::now();
        assert!(alarm.raise(Failure {
            rank: 1,
            cause: FailureCause::SessionClosed,
            reporter: 0,
        }));
        raised_at
    });
    let r = node.barrier_timeout(Members::World, timeout);
    let (returned, raised_at) = (Instant::now(), raiser.join().unwrap());
    let sleeps = node.backoff().blocked_sleeps();
    println!(
        "alarm raised {:?} after the barrier started; the barrier returned {:?} after the \
         alarm; sleeps {sleeps:?}",
        raised_at - t0,
        returned.saturating_duration_since(raised_at)
    );
    match r {
        Err(NodeError::Barrier(BarrierError::PeerFailed(f))) => {
            assert_eq!((f.rank, f.cause), (1, FailureCause::SessionClosed), "{f}");
        }
        other => panic!("expected rank 1's failure, got {other:?}"),
    }
    // The node slept (rather than spun) while it waited, and the alarm ended a sleep: a
    // sleep it fell into, or the next one at once (raised between two).
    assert!(sleeps.expired >= 1, "{sleeps:?}");
    assert_eq!(
        sleeps.nudged, 1,
        "the alarm did not end a sleep: {sleeps:?}"
    );
}
