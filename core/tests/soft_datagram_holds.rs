//! A datagram endpoint keeps every posted send's address handle until the send has run:
//! random sequences of sends (one address or several, peers dropped and cloned, inline and
//! slot sends, refused posts of both kinds, every signalling interval) against a provider
//! that runs a few queued sends per poll and looks each address up only when it runs one
//! (as rxe does). A send that runs after its address was let go fails the test, naming the
//! seed.
use core::cell::Cell;
use core::time::Duration;
use std::collections::VecDeque;
use std::rc::{Rc, Weak};

use rverbs_core::completion::{Completion, WcStatus};
use rverbs_core::datagram::{memory_needed, Datagram, DatagramConfig};
use rverbs_core::gid::Gid;
use rverbs_core::memory::AccessFlags;
use rverbs_core::model::{NetDatagram, SoftNet, SoftNetConfig};
use rverbs_core::params::{Mtu, QpCaps};
use rverbs_core::poll::{Spin, StaticClock, StepClock};
use rverbs_core::provider::datagram::{DatagramProvider, Destination};
use rverbs_core::provider::ProviderError;
use rverbs_core::wr::{DatagramRequest, PostFailure};

fn clock() -> StaticClock {
    static CLOCK: StepClock = StepClock::new(Duration::from_micros(1));
    &CLOCK
}

struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

thread_local! {
    static BAD: Cell<u64> = const { Cell::new(0) };
}

struct Late<'n> {
    qp: NetDatagram<'n>,
    queued: VecDeque<(u64, bool, Weak<u32>)>,
    flushing: bool,
    rng: Rng,
    refuse_every: u64,
    posts: u64,
}

impl DatagramProvider for Late<'_> {
    type Address = Rc<u32>;
    fn same_address(a: &Rc<u32>, b: &Rc<u32>) -> bool {
        Rc::ptr_eq(a, b)
    }
    rverbs_testkit::forward_datagram_identity!(qp);
    rverbs_testkit::forward_datagram!(qp;
        post_recv, poll_recv, set_error => flushing, join_group, leave_group);
    fn address(&mut self, _to: Destination) -> Result<Rc<u32>, ProviderError> {
        Ok(Rc::new(7))
    }
    unsafe fn post_send(
        &mut self,
        wrs: &[DatagramRequest<'_, Rc<u32>>],
    ) -> Result<(), PostFailure> {
        self.posts += 1;
        let refuse = self.refuse_every > 0 && self.posts.is_multiple_of(self.refuse_every);
        if refuse && self.rng.below(2) == 0 {
            return Err(PostFailure {
                posted: 0,
                errno: 12,
            });
        }
        for w in wrs {
            let signaled = w.flags.contains(rverbs_core::wr::SendFlags::SIGNALED);
            self.queued
                .push_back((w.wr_id, signaled, Rc::downgrade(w.dest)));
        }
        if refuse {
            return Err(PostFailure {
                posted: 1,
                errno: 5,
            });
        }
        Ok(())
    }
    fn poll_send(&mut self, out: &mut [Completion]) -> Result<usize, ProviderError> {
        let qp_num = self.qp.qp_num();
        // Runs a random few queued sends per poll (sometimes none).
        let mut budget = self.rng.below(4);
        let mut n = 0;
        while n < out.len() && budget > 0 {
            let Some((wr_id, signaled, dest)) = self.queued.pop_front() else {
                break;
            };
            budget -= 1;
            let status = if self.flushing {
                WcStatus::Flushed
            } else if dest.upgrade().is_none() {
                BAD.with(|b| b.set(b.get() + 1));
                WcStatus::LocalQpOperation
            } else {
                WcStatus::Success
            };
            if signaled || status != WcStatus::Success {
                let mut c = Completion::EMPTY;
                (c.wr_id, c.status, c.qp_num) = (wr_id, status, qp_num);
                out[n] = c;
                n += 1;
            }
        }
        if self.flushing {
            // drain the rest quickly
            while n < out.len() {
                let Some((wr_id, _s, _d)) = self.queued.pop_front() else {
                    break;
                };
                let mut c = Completion::EMPTY;
                (c.wr_id, c.status, c.qp_num) = (wr_id, WcStatus::Flushed, qp_num);
                out[n] = c;
                n += 1;
            }
        }
        Ok(n)
    }
}

fn run<const N: usize>(seed: u64, send_slots: u32, signal_every: u32, refuse_every: u64) {
    BAD.with(|b| b.set(0));
    let mut cfg = DatagramConfig::default();
    (cfg.recv_slots, cfg.send_slots, cfg.timeout) = (1, send_slots, Duration::from_millis(200));
    cfg.signal_every = signal_every;
    let mut mem = vec![0u8; memory_needed(Mtu::B256.bytes(), &cfg)];
    let net = SoftNet::new(SoftNetConfig::new(2, QpCaps::queues(16, 16)));
    let qp = Late {
        qp: net.create_datagram(0, 0x1234, Mtu::B256).unwrap(),
        queued: VecDeque::new(),
        flushing: false,
        rng: Rng(seed ^ 0x9e37_79b9_7f4a_7c15),
        refuse_every,
        posts: 0,
    };
    let region = net.register(0, &mut mem, AccessFlags::LOCAL_WRITE).unwrap();
    let mut a: Datagram<_, _, Spin, N> =
        Datagram::with_backoff(qp, region, cfg, Spin, clock()).unwrap();
    let them = rverbs_core::wire::DatagramEndpoint {
        gid: Gid::default(),
        global: false,
        lid: 1,
        qpn: 0x99,
        qkey: 0x1234,
        mtu: Mtu::B256,
    };
    let mut rng = Rng(seed.wrapping_mul(0x2545_f491_4f6c_dd1d) | 1);
    let mut peers: Vec<Option<rverbs_core::datagram::Peer<Rc<u32>>>> = vec![None; 5];
    let big = [1u8; 200];
    for _ in 0..400 {
        match rng.below(10) {
            0 => {
                let i = rng.below(5) as usize;
                peers[i] = None; // drop
            }
            1 => {
                let _ = a.try_recv();
            }
            2 if rng.below(8) == 0 => {
                let _ = a.wait_sent();
            }
            _ => {
                let i = rng.below(5) as usize;
                if peers[i].is_none() {
                    peers[i] = Some(a.peer(&them).unwrap());
                }
                let to = if rng.below(4) == 0 {
                    // a fresh Peer clone (same handle), or a clone dropped right away
                    peers[i].clone().unwrap()
                } else {
                    peers[i].clone().unwrap()
                };
                let payload: &[u8] = if rng.below(2) == 0 { &big } else { &big[..8] };
                let _ = a.send(&to, payload);
                if rng.below(3) == 0 {
                    peers[i] = None;
                }
            }
        }
        if let Some(e) = a.failure() {
            assert!(
                refuse_every > 0,
                "seed {seed}: broke with no refusals: {e:?}"
            );
            break;
        }
    }
    drop(peers);
    let r = a.wait_sent();
    if refuse_every == 0 {
        r.unwrap();
    }
    drop(a);
    assert_eq!(
        BAD.with(|b| b.get()),
        0,
        "a send ran after its address was let go: seed {seed}"
    );
}

#[test]
fn random_sequences_never_run_a_send_without_its_address() {
    for seed in 1..300u64 {
        run::<2>(seed, 2, 2, 0);
        run::<2>(seed, 1, 1, 0);
        run::<3>(seed, 3, 3, 0);
        run::<2>(seed, 2, 2, 5);
        run::<4>(seed, 4, 16, 7);
        run::<1>(seed, 1, 1, 3);
    }
}
