//! Watching the device's asynchronous events for a connected node: a port that goes down, a
//! queue pair the device moved to the error state, a device that failed become failure news
//! on the node's [alarm](rverbs_core::node::Node::failure_alarm) as soon as the kernel says
//! so, instead of when a wait times out; every event (a port coming back too) is kept in a
//! log with the time it was read.
//!
//! One thread sleeps in `poll(2)` on the context's event descriptor (waking every
//! [`TICK`] to look at its stop flag), reads each event
//! ([`AsyncEvents::poll`](rverbs_core::verbs::AsyncEvents::poll) acknowledges it), asks
//! [`failure_of_event`] what it means for the node and raises that on the alarm, which ends
//! the node's current wait at once (a blocking wait is woken).

use core::sync::atomic::Ordering;
use core::time::Duration;
use std::collections::VecDeque;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use rverbs_core::failure::{Failure, FailureCause};
use rverbs_core::node::failure_of_event;
use rverbs_core::node::FailureAlarm;
use rverbs_core::verbs::{AsyncEvent, AsyncEvents, Context};
use rverbs_std_shim::readable::wait_readable;

use crate::exchange::WatchThread;

/// How often the watcher looks at its stop flag while no event comes.
pub const TICK: Duration = Duration::from_millis(100);
/// Events the log keeps (the oldest are dropped first; [`DeviceWatch::dropped`] counts them).
pub const LOG_LEN: usize = 256;

/// One event the watch read.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SeenEvent {
    /// When it was read.
    pub at: Instant,
    /// The event.
    pub event: AsyncEvent,
    /// The failure news it was raised as, if it is a failure of the node's.
    pub failure: Option<Failure>,
}

#[derive(Debug, Default)]
struct Log {
    events: VecDeque<SeenEvent>,
    dropped: u64,
}

/// A thread that reads a device's asynchronous events and raises those that are failures
/// of one node's on its alarm. Stops (and joins) when dropped.
#[derive(Debug)]
pub struct DeviceWatch {
    log: Arc<Mutex<Log>>,
    _thread: WatchThread,
}

/// What the watch needs to know about the node it speaks for.
#[derive(Clone, Debug)]
pub struct WatchedNode {
    /// The node's rank.
    pub rank: u32,
    /// The port its queue pairs use.
    pub port: u8,
    /// Every channel's queue pair number with the rank it leads to
    /// ([`Node::qp_ranks`](rverbs_core::node::Node::qp_ranks)).
    pub qp_ranks: Vec<(u32, u32)>,
    /// Where failures are raised.
    pub alarm: FailureAlarm,
}

impl DeviceWatch {
    /// Starts watching `events` for `node`; `on_event` is called (on the watch's thread) for
    /// every event read, after a failure it means was raised.
    ///
    /// # Errors
    /// The thread could not start.
    pub fn start(
        events: AsyncEvents,
        node: WatchedNode,
        mut on_event: impl FnMut(&SeenEvent) + Send + 'static,
    ) -> std::io::Result<Self> {
        // Room for the whole log now: the thread runs beside a node that must not allocate
        // once connected, so a logged event never grows it.
        let log = Arc::new(Mutex::new(Log {
            events: VecDeque::with_capacity(LOG_LEN),
            dropped: 0,
        }));
        let log2 = log.clone();
        // Whatever starting a thread allocates happens before `start` returns.
        let thread =
            WatchThread::start(format!("rverbs-device-watch-{}", node.rank), move |stop| {
                let rank_of = |q: u32| node.qp_ranks.iter().find(|e| e.0 == q).map(|e| e.1);
                while !stop.load(Ordering::Acquire) {
                    // The descriptor stays open: `events` holds its context.
                    match wait_readable(events.fd(), TICK) {
                        Ok(true) => {}
                        Ok(false) => continue,
                        // Not a reason to spin: look again a tick later.
                        Err(_) => {
                            std::thread::sleep(TICK);
                            continue;
                        }
                    }
                    // Everything pending now.
                    loop {
                        let event = match events.poll() {
                            Ok(Some(e)) => e,
                            Ok(None) => break,
                            // The device going away: the node's own requests report it. A
                            // descriptor that stays readable with nothing to read must not
                            // make this thread spin.
                            Err(_) => {
                                std::thread::sleep(TICK);
                                break;
                            }
                        };
                        let at = Instant::now();
                        let failure = failure_of_event(&event, node.rank, node.port, rank_of);
                        if let Some(f) = failure {
                            node.alarm.raise(f);
                        }
                        let seen = SeenEvent { at, event, failure };
                        if let Ok(mut l) = log2.lock() {
                            if l.events.len() == LOG_LEN {
                                l.events.pop_front();
                                l.dropped += 1;
                            }
                            l.events.push_back(seen);
                        }
                        on_event(&seen);
                    }
                }
            })?;
        Ok(Self {
            log,
            _thread: thread,
        })
    }

    /// The events read so far (the last [`LOG_LEN`]), oldest first.
    pub fn seen(&self) -> Vec<SeenEvent> {
        self.log
            .lock()
            .map(|l| l.events.iter().copied().collect())
            .unwrap_or_default()
    }

    /// Events dropped from the log because it was full.
    pub fn dropped(&self) -> u64 {
        self.log.lock().map(|l| l.dropped).unwrap_or(0)
    }
}

/// A link probe for a node on `ctx`'s `port` ([`Node::set_link_probe`](rverbs_core::node::Node::set_link_probe)):
/// the port is called down when the network interface under it is no longer running or has
/// no carrier, or the device says the port is not ACTIVE.
///
/// Why the interface first: when a link is taken down, the kernel stops the interface, waits
/// for everyone sending on it to finish (an RCU grace period: milliseconds, longer in a busy
/// VM), and only then tells rxe, which then marks the port down and raises `PortError`.
/// Requests in flight fail at the start of that ("local QP operation error"); a node that
/// polls such a failure in the window and asks only the port is told ACTIVE and blames the
/// peer. The interface's `carrier` file stops reading (EINVAL) at the start.
pub fn link_probe(
    ctx: &Context,
    port: u8,
) -> impl Fn() -> Option<FailureCause> + Send + Sync + 'static {
    let ctx = ctx.clone();
    let carrier = std::fs::read_to_string(format!(
        "/sys/class/infiniband/{}/ports/{port}/gid_attrs/ndevs/0",
        ctx.name()
    ))
    .ok()
    .map(|n| format!("/sys/class/net/{}/carrier", n.trim()));
    move || {
        let interface_down = carrier.as_ref().is_some_and(|path| {
            match std::fs::read_to_string(path) {
                Ok(s) => s.trim() == "0",
                // EINVAL: the interface is not running (being taken down, or down).
                Err(e) => e.raw_os_error() == Some(22),
            }
        });
        let port_down = ctx.query_port(port).is_ok_and(|p| !p.active);
        (interface_down || port_down).then_some(FailureCause::PortDown { port })
    }
}
