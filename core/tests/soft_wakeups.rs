//! Sleeping on completion events over shared completion queues, on the software model.
//!
//! The model raises no events, so the test brings a back-off that plays the device's part
//! of the contract (`rverbs_core::poll::Wakeup`): the first blocking step arms the queues
//! and returns (the wait polls once more), the next one sleeps. An armed queue raises an
//! event only for a completion that arrives after the arm; in this one-threaded world
//! nothing arrives while a wait runs, so every completion a sleep finds still queued came
//! before the arm and would never wake the sleeper on a device: a lost wake-up. Runs under
//! Miri.
#![allow(clippy::std_instead_of_core)]

use std::cell::Cell;
use std::rc::Rc;
use std::time::Duration;

use rverbs_core::channel::{Channel, ChannelConfig};
use rverbs_core::completion::Completion;
use rverbs_core::memory::AccessFlags;
use rverbs_core::model::{NetCq, NetQp, SoftNet, SoftNetConfig};
use rverbs_core::params::QpCaps;
use rverbs_core::poll::{Backoff, StaticClock, StepClock};
use rverbs_core::provider::shared::{RoutedQp, SharedCqs};
use rverbs_core::provider::{CompletionQueue, ProviderError};

type Chan<'n> = Channel<RoutedQp<NetQp<'n>, Watched<'n>>, EventModel>;

/// A completion queue of the model that tells, after each poll, how many completions it
/// still holds.
#[derive(Debug)]
struct Watched<'n> {
    cq: NetCq<'n>,
    left: Rc<Cell<u32>>,
}

impl CompletionQueue for Watched<'_> {
    fn poll(&mut self, out: &mut [Completion]) -> Result<usize, ProviderError> {
        let n = self.cq.poll(out);
        self.left.set(self.cq.len());
        n
    }

    fn capacity(&self) -> u32 {
        self.cq.capacity()
    }
}

/// The device's event contract, played against node 0's two completion queues (what they
/// held after their last poll).
#[derive(Debug)]
struct EventModel {
    left: [Rc<Cell<u32>>; 2],
    armed: bool,
    /// Sleeps taken.
    sleeps: u32,
    /// Sleeps taken while a completion that raised no event was queued.
    lost: u32,
}

impl Backoff for EventModel {
    fn snooze(&mut self) {
        self.snooze_within(&mut || Duration::MAX);
    }

    // An event disarms a queue, a reset does not (as `StdBackoff`).
    fn reset(&mut self) {}

    fn snooze_within(&mut self, _left: &mut dyn FnMut() -> Duration) {
        if !self.armed {
            self.armed = true;
            return;
        }
        self.sleeps += 1;
        if self.left.iter().any(|l| l.get() > 0) {
            self.lost += 1;
        }
    }
}

fn caps() -> QpCaps {
    QpCaps::queues(64, 4)
}

/// More completions of other queue pairs than one poll of the shared queue takes, twice
/// over: the arm and the poll after it both go by before the waiter's own completion.
const AHEAD: u32 = 100;

#[test]
fn a_waiter_behind_many_foreign_completions_finds_its_own_before_it_sleeps() {
    static CLOCK: StepClock = StepClock::new(Duration::from_millis(1));
    let clock: StaticClock = &CLOCK;
    let (mut targets, mut src) = ([[0u8; 64]; 3], [0u8; 8]);
    let net = SoftNet::new(SoftNetConfig::new(4, caps()));
    let _src = net.register(0, &mut src, AccessFlags::LOCAL_WRITE).unwrap();
    let remotes: Vec<_> = targets
        .iter_mut()
        .enumerate()
        .map(|(i, t)| {
            net.register(
                i as u32 + 1,
                t,
                AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE,
            )
            .unwrap()
        })
        .collect();
    let left = [Rc::new(Cell::new(0)), Rc::new(Cell::new(0))];
    let watched = |cq, i: usize| Watched {
        cq,
        left: left[i].clone(),
    };
    let shared = SharedCqs::new(
        watched(net.send_cq(0).unwrap(), 0),
        watched(net.recv_cq(0).unwrap(), 1),
        3,
    );
    let mut chans: Vec<Chan<'_>> = (1..=3u32)
        .map(|r| {
            let (qp, _peer) = net.connect(0, r).unwrap();
            let mut cfg = ChannelConfig::with_timeout(Duration::from_secs(3600));
            cfg.rank = Some(r);
            cfg.signal_every = 1;
            let model = EventModel {
                left: left.clone(),
                armed: false,
                sleeps: 0,
                lost: 0,
            };
            let routed = shared.add(qp).map_err(|(_, e)| e).unwrap();
            Channel::with_backoff(routed, cfg, model, clock)
        })
        .collect();

    // Peers 1 and 2 fill node 0's send queue with completions nobody polls yet.
    let mut tickets = Vec::new();
    for i in 0..AHEAD {
        let c = (i % 2) as usize;
        let t = chans[c]
            .post_write_inline(&i.to_le_bytes(), remotes[c].remote().slice(0, 4).unwrap())
            .unwrap();
        tickets.push((c, t));
    }
    assert_eq!(net.stats(0).send_cqes, u64::from(AHEAD));

    // Peer 3's write completes behind all of them; its channel waits for it.
    chans[2]
        .write_inline(b"mine", remotes[2].remote().slice(0, 4).unwrap())
        .unwrap();
    let mut got = [0u8; 4];
    remotes[2].read_into(0, &mut got);
    assert_eq!(&got, b"mine");
    let m = chans[2].backoff();
    assert_eq!(
        m.lost, 0,
        "slept {} times, {} of them with completions queued that raised no event",
        m.sleeps, m.lost
    );

    // The others' completions were kept for them, not lost on the way.
    for (c, t) in tickets {
        chans[c].wait(t).unwrap();
    }
    for c in &chans {
        assert_eq!(c.backoff().lost, 0);
    }
    assert_eq!(left[0].get(), 0);
}
