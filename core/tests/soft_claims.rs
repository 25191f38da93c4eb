//! A node's ring heads claimed from the shared poll (issue #25, sixth round): `progress`
//! delivers a successful receive at the head of its peer's ring straight from the poll's
//! completion, and sends everything else to the channel and the slower path. These tests
//! pin what that fast path must never do: deliver for a channel swapped out, read a slot
//! whose own receive has not completed (a caller's receive posted on a node channel takes a
//! message meant for no ring), lose or repeat a message when a handler panics between
//! claimed heads, hand out more events than the budget, or report a peer's failure twice
//! when its flushed receives come back. Run under Miri in CI (tools/test-all).
#![allow(clippy::std_instead_of_core)]

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::time::Duration;

use rverbs_core::barrier::BarrierAlgorithm;
use rverbs_core::channel::ChannelError;
use rverbs_core::memory::AccessFlags;
use rverbs_core::node::{soft_world_bytes, Event, NodeError};
use rverbs_testkit::clock;
use rverbs_testkit::{net, nodes};

const STEP: Duration = Duration::from_micros(1);
const SLOTS: usize = 4;
const SLOT: usize = 32;

/// `let net, nodes` of `world` ranks with messaging started (rings of [`SLOTS`] slots of
/// [`SLOT`] bytes per peer).
macro_rules! messaging_world {
    (let $net:ident, $nodes:ident = $world:expr) => {
        let world_size: u32 = $world;
        let $net = net(world_size);
        let mut arena = vec![0u8; soft_world_bytes(world_size, 64)];
        let mem_len = (world_size as usize - 1) * SLOTS * SLOT;
        let mut rings = vec![0u8; world_size as usize * mem_len];
        #[allow(unused_mut)]
        let mut $nodes = nodes(&$net, &mut arena, BarrierAlgorithm::default(), clock!(STEP));
        for (n, mem) in $nodes.iter_mut().zip(rings.chunks_mut(mem_len)) {
            let region = $net
                .register(n.rank(), mem, AccessFlags::LOCAL_WRITE)
                .unwrap();
            n.start_messaging_in(region, SLOTS, SLOT).unwrap();
        }
    };
}

/// Everything `progress` hands out over `calls` calls of `budget` (messages as bytes).
#[derive(Debug, Default, PartialEq)]
struct Seen {
    messages: Vec<(u32, Vec<u8>)>,
    failed: Vec<(u32, ChannelError)>,
    per_call: Vec<usize>,
}

fn progress<'n>(
    node: &mut rverbs_core::node::SoftNode<'n, rverbs_core::poll::Spin>,
    budget: usize,
    calls: usize,
    seen: &mut Seen,
) {
    for _ in 0..calls {
        let n = node
            .progress(budget, |ev| match ev {
                Event::Message { rank, data } => seen.messages.push((rank, data.to_vec())),
                Event::Failed { rank, error } => seen.failed.push((rank, error)),
                _ => {}
            })
            .unwrap();
        seen.per_call.push(n);
    }
}

/// A completion of a channel that a caller swapped out of its position (`Node::channel`
/// hands out `&mut Channel`) is never delivered from the ring: the poll offers it only to
/// the channel placed there, and the ring's channel identity no longer matches, so both
/// peers are reported replaced, once each, and no message is read from either ring.
#[test]
fn a_completion_for_a_swapped_channel_is_not_delivered() {
    messaging_world!(let net, nodes = 3);
    // The control: without a swap the message is claimed and delivered.
    nodes[1].post_send_inline(0, b"first").unwrap();
    let mut seen = Seen::default();
    progress(&mut nodes[0], 8, 4, &mut seen);
    assert_eq!(seen.messages, [(1, b"first".to_vec())]);
    // Rank 1's message completes at rank 0 after rank 0 swapped its channels to ranks 1
    // and 2.
    nodes[1].post_send_inline(0, b"second").unwrap();
    {
        let mut chans = nodes[0].multi().channels();
        let (a, b) = (chans.next().unwrap(), chans.next().unwrap());
        std::mem::swap(a, b);
    }
    let mut seen = Seen::default();
    progress(&mut nodes[0], 8, 64, &mut seen);
    assert!(seen.messages.is_empty(), "{seen:?}");
    let mut failed = seen.failed.clone();
    failed.sort_by_key(|f| f.0);
    assert_eq!(
        failed,
        [(1, ChannelError::Replaced), (2, ChannelError::Replaced)],
        "each once"
    );
    // Swapped back, the node frees its rings on drop (a node whose channels were swapped
    // out leaks them, which Miri would report).
    let mut chans = nodes[0].multi().channels();
    let (a, b) = (chans.next().unwrap(), chans.next().unwrap());
    std::mem::swap(a, b);
}

/// A receive the caller posts on a node's channel (misuse, documented: the node owns the
/// receive queues) sits behind the ring's receives, and the ring's slots are re-posted
/// behind it: a message lands in it. Its completion is the channel's (the caller's ticket),
/// and the node must not take it for the ring's head, whose receive has not completed: the
/// head's slot is read only once the next message completes it, and holds that message.
#[test]
fn a_callers_own_receive_never_makes_the_node_read_an_uncompleted_slot() {
    let mut mine = [0u8; SLOT];
    messaging_world!(let net, nodes = 3);
    let mut region = net
        .register(0, &mut mine, AccessFlags::LOCAL_WRITE)
        .unwrap();
    let ticket = {
        let mut sge = [region.sge_mut(0..SLOT).unwrap()];
        // SAFETY: the region lives until the ticket was waited for below; nothing else
        // reads or writes the buffer meanwhile.
        unsafe { nodes[0].channel(1).unwrap().post_recv(&mut sge) }.unwrap()
    };
    // SLOTS messages fill the ring (each slot re-posted behind the caller's receive), the
    // next lands in the caller's receive, the one after in the ring's head again.
    let mut got = Vec::new();
    let mut sent = 0u32;
    for _ in 0..10_000 {
        if sent < SLOTS as u32 + 2 {
            match nodes[1].post_send_inline(0, &sent.to_le_bytes()) {
                Ok(_) => sent += 1,
                Err(NodeError::WouldBlock { .. }) => {}
                Err(e) => panic!("send {sent}: {e}"),
            }
        }
        nodes[1].progress(8, |_| {}).unwrap();
        nodes[0]
            .progress(8, |ev| {
                if let Event::Message { data, .. } = ev {
                    got.push(u32::from_le_bytes(data.try_into().unwrap()));
                }
            })
            .unwrap();
        if got.len() == SLOTS + 1 {
            break;
        }
    }
    let caller = SLOTS as u32;
    let ring: Vec<u32> = (0..SLOTS as u32 + 2).filter(|&m| m != caller).collect();
    assert_eq!(got, ring, "the caller's message is not the ring's");
    let done = nodes[0].wait(ticket).unwrap();
    assert_eq!(done.byte_len, 4);
    drop(nodes);
    drop(region);
    assert_eq!(&mine[..4], &caller.to_le_bytes());
}

/// Several heads claimed by one poll; the handler panics on the first: it is not delivered
/// again, the others are delivered by the next call, once each and in order, the panicked
/// slot is re-posted, and the ring goes on.
#[test]
fn a_handler_panic_between_claimed_heads_loses_and_repeats_nothing() {
    messaging_world!(let net, nodes = 3);
    for m in [&b"boom"[..], b"two", b"three"] {
        nodes[1].post_send_inline(0, m).unwrap();
    }
    let mut got: Vec<Vec<u8>> = Vec::new();
    let r = catch_unwind(AssertUnwindSafe(|| {
        nodes[0].progress(8, |ev| {
            if let Event::Message { data, .. } = ev {
                if data == b"boom" {
                    panic!("the handler fails");
                }
                got.push(data.to_vec());
            }
        })
    }));
    assert!(r.is_err(), "the first message reached the handler");
    assert!(got.is_empty());
    let mut seen = Seen::default();
    progress(&mut nodes[0], 8, 4, &mut seen);
    let got: Vec<_> = seen.messages.iter().map(|m| m.1.clone()).collect();
    assert_eq!(got, [b"two".to_vec(), b"three".to_vec()]);
    assert_eq!(
        nodes[0].channel(1).unwrap().outstanding_recvs(),
        SLOTS as u64
    );
    // The ring goes on, credits come back.
    let total = 4 * SLOTS;
    let (mut sent, mut delivered) = (0usize, 0usize);
    for _ in 0..10_000 {
        if sent < total {
            match nodes[1].post_send_inline(0, &(sent as u32).to_le_bytes()) {
                Ok(_) => sent += 1,
                Err(NodeError::WouldBlock { .. }) => {}
                Err(e) => panic!("send {sent}: {e}"),
            }
        }
        nodes[1].progress(8, |_| {}).unwrap();
        nodes[0]
            .progress(8, |ev| {
                if let Event::Message { data, .. } = ev {
                    assert_eq!(data, (delivered as u32).to_le_bytes(), "in order");
                    delivered += 1;
                }
            })
            .unwrap();
        if delivered == total {
            break;
        }
    }
    assert_eq!((sent, delivered), (total, total));
}

/// A budget smaller than what one poll claimed: each call hands out at most its budget,
/// the rest follow in order on the next calls (before anything a later poll claims).
#[test]
fn claimed_heads_respect_the_budget_and_keep_their_order() {
    messaging_world!(let net, nodes = 3);
    for m in [&b"a"[..], b"b", b"c"] {
        nodes[1].post_send_inline(0, m).unwrap();
    }
    let mut seen = Seen::default();
    progress(&mut nodes[0], 1, 2, &mut seen);
    assert_eq!(seen.per_call, [1, 1]);
    nodes[1].post_send_inline(0, b"d").unwrap();
    progress(&mut nodes[0], 1, 4, &mut seen);
    let got: Vec<_> = seen.messages.iter().map(|m| m.1.clone()).collect();
    assert_eq!(
        got,
        [b"a".to_vec(), b"b".to_vec(), b"c".to_vec(), b"d".to_vec()]
    );
    assert!(seen.per_call.iter().all(|&n| n <= 1), "{:?}", seen.per_call);
}

/// A peer dies: our send to it fails, its queue pair flushes every ring receive (error
/// completions, never claimed). The node reports the failure once, reads no flushed slot,
/// and the other peer's messages still flow.
#[test]
fn flushed_receives_after_a_peer_failure_report_failed_once() {
    messaging_world!(let net, nodes = 3);
    net.kill(1);
    let _ = nodes[0].post_send_inline(1, b"to the dead");
    let mut seen = Seen::default();
    for _ in 0..2000 {
        progress(&mut nodes[0], 8, 1, &mut seen);
        if !seen.failed.is_empty() && nodes[0].channel(1).unwrap().fault().is_some() {
            break;
        }
    }
    progress(&mut nodes[0], 8, 64, &mut seen);
    assert!(seen.messages.is_empty(), "{seen:?}");
    assert_eq!(seen.failed.len(), 1, "{seen:?}");
    assert_eq!(seen.failed[0].0, 1);
    nodes[2].post_send_inline(0, b"alive").unwrap();
    let mut seen = Seen::default();
    progress(&mut nodes[0], 8, 8, &mut seen);
    assert_eq!(seen.messages, [(2, b"alive".to_vec())]);
    assert!(seen.failed.is_empty());
}
