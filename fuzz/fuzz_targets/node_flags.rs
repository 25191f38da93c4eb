//! A node whose flag array a hostile peer writes: three ranks on the software model, where
//! rank 0 is the node under test, rank 1 an honest peer, and rank 2 a peer that, between
//! honest moves of its own, RDMA-writes any 8 bytes at any offset of rank 0's flag array
//! (barrier arrival counts, credit words, the failure notice) and sends rank 0 messages
//! with any immediate (a forged credit return).
//!
//! The first byte picks the layout (bit 0: a receive ring per peer or one shared pool) and
//! the barrier algorithm (bits 1-2); the rest is a sequence of operations: hostile writes
//! and sends, rank 0's progress, sends, barrier starts and polls and failure checks, and the
//! honest ranks' progress, replies and barrier moves (they follow one script of barriers,
//! each over {0, 1} or {0, 1, 2}, in the same order, as every member must).
//!
//! The oracle, beyond "nothing panics or overflows" (the fuzz profile has overflow checks
//! on in release):
//! - messages rank 0 sent to rank 1 and rank 1 has not delivered never exceed rank 0's
//!   credits for rank 1, and rank 1 gets them in order, each once;
//! - rank 0 never completes its `k`-th barrier before rank 1 entered its `k`-th, nor one
//!   over all three ranks before rank 2 entered it while rank 2 wrote its own barrier slot
//!   only through barriers (rank 0 waits for every member directly in every algorithm at
//!   three ranks);
//! - a failure rank 0 reports names a rank of the world, and never rank 0 itself.
//!
//! Any peer holds the flag array's key, so the hostile rank can also write rank 1's slots
//! with values rank 1 could have written (a count one ahead, a credit return of everything
//! sent): the node cannot tell those from rank 1's. The first two properties are therefore
//! checked only while the hostile rank has not written over rank 1's barrier slot or credit
//! word (tracked per write); a forged value it could not tell from an honest one is the
//! limit of one key for all peers, not a bug.
#![no_main]

use std::time::Duration;

use libfuzzer_sys::fuzz_target;
use rverbs_core::barrier::{BarrierAlgorithm, BarrierError};
use rverbs_core::channel::ChannelConfig;
use rverbs_core::failure::{Failure, FailureCause};
use rverbs_core::memory::AccessFlags;
use rverbs_core::model::{SoftNet, SoftNetConfig};
use rverbs_core::node::{soft_world_bytes, soft_world_with, Event, NodeError, Receive, SoftNode};
use rverbs_core::params::QpCaps;
use rverbs_core::poll::{Spin, StepClock};
use rverbs_core::wire::flags::{FlagLayout, SLOT_LEN};
use rverbs_core::wire::notice;

const WORLD: u32 = 3;
/// The flag array of three ranks: counts, credit words, notice.
const LAYOUT: FlagLayout = FlagLayout::new(WORLD);
const FLAGS: u64 = LAYOUT.len() as u64;
/// Ring slots per peer (or pool slots per node: 2 credits per sender either way).
const SLOTS: usize = 2;
const POOL: u32 = 4;
const SLOT_SIZE: usize = 16;
const MAX_OPS: usize = 160;
/// Rank 1's barrier slot and credit word in rank 0's flag array.
const SLOT_1: (u64, u64) = slot(LAYOUT.arrivals(1));
/// The hostile rank's own barrier slot.
const SLOT_2: (u64, u64) = slot(LAYOUT.arrivals(2));
const CREDIT_1: (u64, u64) = slot(LAYOUT.credits(1));

/// The byte range `[start, end)` of a slot of a rank of the world.
const fn slot(at: Option<usize>) -> (u64, u64) {
    match at {
        Some(at) => (at as u64, (at + SLOT_LEN) as u64),
        None => panic!("a rank of the world"),
    }
}

/// A clock that moves 1 us on every read (one thread).
static CLOCK: StepClock = StepClock::new(Duration::from_micros(1));
/// Barrier deadline: a few thousand clock reads.
const BARRIER_TIMEOUT: Duration = Duration::from_millis(5);

struct Input<'a> {
    data: &'a [u8],
    pos: usize,
}

impl Input<'_> {
    fn done(&self) -> bool {
        self.pos >= self.data.len()
    }
    fn byte(&mut self) -> u8 {
        let b = self.data.get(self.pos).copied().unwrap_or(0);
        self.pos += 1;
        b
    }
    fn u64(&mut self) -> u64 {
        let mut b = [0u8; 8];
        for x in &mut b {
            *x = self.byte();
        }
        u64::from_le_bytes(b)
    }
}

/// The barrier groups a script entry can name.
const GROUPS: [&[u32]; 2] = [&[0, 1], &[0, 1, 2]];

/// What the test knows of the world, to predict what rank 0 may do.
#[derive(Default)]
struct Shadow {
    /// The barrier script: groups (indexes into `GROUPS`) in the order every member runs them.
    script: Vec<usize>,
    /// Barriers each rank started (rank 2: of those it is a member of, as script indexes).
    started: [usize; 3],
    /// The script index each rank's barrier in progress has (rank 2: position in script).
    pending: [Option<usize>; 3],
    /// Messages rank 0 posted to rank 1, and those rank 1 delivered.
    sent_0_to_1: u64,
    delivered_0_to_1: u64,
    /// Whether the hostile rank wrote over rank 1's barrier slot or credit word, or its own
    /// barrier slot.
    forged_slot_1: bool,
    forged_slot_2: bool,
    forged_credit_1: bool,
}

fn overlaps(at: u64, (a, b): (u64, u64)) -> bool {
    at < b && at + 8 > a
}

fuzz_target!(|data: &[u8]| {
    let mut input = Input { data, pos: 0 };
    let mode = input.byte();
    let pooled = mode & 1 == 1;
    let alg = BarrierAlgorithm::ALL[usize::from(mode >> 1) % 3];
    let receive = if pooled {
        Receive::Shared { slots: POOL }
    } else {
        Receive::PerPeer
    };
    let mut arena = vec![0u8; soft_world_bytes(WORLD, 64)];
    let ring = if pooled {
        POOL as usize
    } else {
        SLOTS * (WORLD as usize - 1)
    };
    let mut mem = vec![0u8; WORLD as usize * ring * SLOT_SIZE];
    let net = SoftNet::new(SoftNetConfig::new(WORLD, QpCaps::queues(16, 16)));
    let mut nodes = soft_world_with(
        &net,
        &mut arena,
        64,
        ChannelConfig::with_timeout(Duration::from_millis(2)),
        (alg, Spin, &CLOCK),
        receive,
    )
    .expect("a world of three builds");
    for (n, m) in nodes.iter_mut().zip(mem.chunks_mut(ring * SLOT_SIZE)) {
        n.set_probe_grace(Duration::from_millis(1));
        let region = net
            .register(n.rank(), m, AccessFlags::LOCAL_WRITE)
            .expect("ring memory registers");
        n.start_messaging_in(
            region,
            if pooled { POOL as usize } else { SLOTS },
            SLOT_SIZE,
        )
        .expect("messaging starts");
    }
    let credits = nodes[0].credits_per_peer() as u64;
    assert_eq!(credits, SLOTS as u64);
    let mut s = Shadow::default();
    let mut ops = 0;
    while !input.done() && ops < MAX_OPS {
        ops += 1;
        match input.byte() % 12 {
            0 => hostile_write(&mut nodes, &mut input, &mut s),
            1 => {
                // A forged credit return in a message's immediate, on the hostile rank's own
                // channel (the immediate counts for that channel only).
                let imm = u32::from(input.byte()) | u32::from(input.byte()) << 24;
                if let Ok(c) = nodes[2].channel(0) {
                    let _ = c.post_send_imm_inline(b"h", imm);
                }
            }
            2 | 3 => {
                let budget = usize::from(input.byte() % 8) + 1;
                let _ = nodes[0].progress(budget, |_| {});
            }
            4 => {
                let seq = s.sent_0_to_1;
                if nodes[0].post_send_inline(1, &seq.to_le_bytes()).is_ok() {
                    s.sent_0_to_1 += 1;
                }
                if !s.forged_credit_1 {
                    let in_flight = s.sent_0_to_1 - s.delivered_0_to_1;
                    assert!(
                        in_flight <= credits,
                        "{in_flight} messages in flight to rank 1 on {credits} credits"
                    );
                }
            }
            5 => {
                let _ = nodes[0].post_send_inline(2, b"to-2");
            }
            6 => honest_progress(&mut nodes, &mut input, &mut s),
            7 => {
                // The hostile rank serves its messages too (or rank 0 would run out of
                // credits for it), and sometimes replies.
                let _ = nodes[2].progress(4, |_| {});
                if input.byte() & 1 == 1 {
                    let _ = nodes[2].post_send_inline(0, b"r2");
                }
            }
            8 => barrier_move(&mut nodes, &mut input, &mut s, 0, alg),
            9 => barrier_move(&mut nodes, &mut input, &mut s, 1, alg),
            10 => barrier_move(&mut nodes, &mut input, &mut s, 2, alg),
            _ => check_failure(&mut nodes),
        }
    }
    check_failure(&mut nodes);
});

/// The hostile rank writes 8 bytes at any offset of rank 0's flag array: raw bytes, a small
/// count, or a well-formed failure notice.
fn hostile_write(nodes: &mut [SoftNode<'_, Spin>], input: &mut Input<'_>, s: &mut Shadow) {
    let at = u64::from(input.byte()) % (FLAGS - 7);
    let word = match input.byte() % 4 {
        0 | 1 => input.u64(),
        2 => u64::from(input.byte()),
        _ => {
            let f = Failure {
                rank: u32::from(input.byte() % 5),
                cause: FailureCause::TimedOut,
                reporter: u32::from(input.byte() % 5),
            };
            notice::encode(&f, input.byte() % 2).unwrap_or(0)
        }
    };
    s.forged_slot_1 |= overlaps(at, SLOT_1);
    s.forged_credit_1 |= overlaps(at, CREDIT_1);
    s.forged_slot_2 |= overlaps(at, SLOT_2);
    let Some(slot) = nodes[0].flags_remote().slice(at, 8) else {
        return;
    };
    let Ok(c) = nodes[2].channel(0) else {
        return;
    };
    if let Ok(t) = c.post_write_inline(&word.to_le_bytes(), slot) {
        let _ = c.wait(t);
    }
}

/// Rank 1 takes its messages (checking those from rank 0 arrive in order, each once) and
/// may reply, which returns credits in the reply's immediate.
fn honest_progress(nodes: &mut [SoftNode<'_, Spin>], input: &mut Input<'_>, s: &mut Shadow) {
    let budget = usize::from(input.byte() % 8) + 1;
    let delivered = &mut s.delivered_0_to_1;
    let _ = nodes[1].progress(budget, |e| {
        if let Event::Message { rank: 0, data } = e {
            let seq = <[u8; 8]>::try_from(data).ok().map(u64::from_le_bytes);
            assert_eq!(
                seq,
                Some(*delivered),
                "rank 0's messages out of order or twice"
            );
            *delivered += 1;
        }
    });
    if input.byte() & 1 == 1 {
        let _ = nodes[1].post_send_inline(0, b"r1");
    }
}

/// Starts or polls the next barrier of `rank` in the script (a new script entry, over a group
/// the input picks, when the rank is the first to reach it).
fn barrier_move(
    nodes: &mut [SoftNode<'_, Spin>],
    input: &mut Input<'_>,
    s: &mut Shadow,
    rank: usize,
    alg: BarrierAlgorithm,
) {
    let pick = usize::from(input.byte() % 2);
    let k = match s.pending[rank] {
        Some(k) => k,
        None => {
            // The next script entry this rank is a member of.
            let mut k = s.started[rank];
            while rank == 2 && k < s.script.len() && GROUPS[s.script[k]].len() < 3 {
                k += 1;
            }
            if k == s.script.len() {
                if rank == 2 {
                    return; // the hostile rank does not pick the script
                }
                s.script.push(pick);
            }
            let g = GROUPS[s.script[k]];
            nodes[rank].set_algorithm(alg);
            let r = nodes[rank].barrier_start_timeout(g, BARRIER_TIMEOUT);
            // A refused start notified nobody; any other answer means this rank entered.
            if matches!(r, Err(NodeError::Barrier(BarrierError::Poisoned))) {
                return;
            }
            s.started[rank] = k + 1;
            if r.is_err() {
                return;
            }
            s.pending[rank] = Some(k);
            k
        }
    };
    // The node polls the members its start named.
    match nodes[rank].barrier_poll() {
        Ok(false) => {}
        Ok(true) => {
            s.pending[rank] = None;
            if rank == 0 && !s.forged_slot_1 {
                assert!(
                    s.started[1] > k,
                    "rank 0 completed barrier {k} before rank 1 entered it"
                );
            }
            if rank == 0 && !s.forged_slot_2 && GROUPS[s.script[k]].len() == 3 {
                assert!(
                    s.started[2] > k,
                    "rank 0 completed barrier {k} before rank 2 entered it"
                );
            }
        }
        Err(_) => s.pending[rank] = None,
    }
}

/// A failure rank 0 knows of names a rank of the world, never rank 0 itself.
fn check_failure(nodes: &mut [SoftNode<'_, Spin>]) {
    if let Some(f) = nodes[0].failure() {
        assert!(f.rank < WORLD && f.rank != 0, "rank 0 believes {f}");
        assert!(f.reporter < WORLD, "{f}");
    }
}
