//! The device's asynchronous events on a real device: a port whose link goes down is named
//! by a `PortError` event, and one whose link comes back by `PortActive`, through the
//! pollable descriptor (`poll(2)` on `AsyncEvents::fd`), each acknowledged.
//!
//! Takes the test device's network interface down and up (`ip link`), so it needs root and a
//! device on a netdev (SoftRoCE or a RoCE NIC); inside tools/rxe-vm both hold. It leaves
//! the link up and the port ACTIVE again before it returns, whatever happens.
#![allow(clippy::std_instead_of_core, clippy::undocumented_unsafe_blocks)]

mod support;

use std::os::raw::c_int;
use std::time::{Duration, Instant};

use rverbs_core::verbs::{AsyncEvent, AsyncEvents, Context};
use rverbs_testkit::{ip_link, netdev_of, set_link};

#[repr(C)]
struct PollFd {
    fd: c_int,
    events: i16,
    revents: i16,
}

extern "C" {
    fn poll(fds: *mut PollFd, n: u64, timeout_ms: c_int) -> c_int;
}

/// Sleeps until `events` has an event or `deadline` passes (`poll(2)` on its descriptor, as
/// a user's event loop would), then takes every pending event.
fn wait_events(events: &AsyncEvents, deadline: Instant) -> Vec<(AsyncEvent, Instant)> {
    loop {
        let mut got = Vec::new();
        while let Some(e) = events.poll().expect("ibv_get_async_event") {
            got.push((e, Instant::now()));
        }
        let now = Instant::now();
        if !got.is_empty() || now >= deadline {
            return got;
        }
        let ms = (deadline - now).as_millis().clamp(1, 1000) as c_int;
        let mut fd = PollFd {
            fd: events.fd(),
            events: 1, // POLLIN
            revents: 0,
        };
        // SAFETY: one valid pollfd for the duration of the call.
        let rc = unsafe { poll(&mut fd, 1, ms) };
        assert!(rc >= 0, "poll(2) on the async event descriptor failed");
    }
}

/// Takes events until `want` comes (returning when it was read) or `deadline` passes (a
/// failure naming what came instead); every event taken is added to `seen`.
/// Sets `netdev`'s link `state`, then waits up to `secs` seconds for `want` (adding every
/// event to `seen`): how long the link command took, and how long after it started `want`
/// came.
fn link_event(
    events: &AsyncEvents,
    netdev: &str,
    state: &str,
    want: AsyncEvent,
    secs: u64,
    seen: &mut Vec<AsyncEvent>,
) -> (Duration, Duration) {
    let start = Instant::now();
    set_link(netdev, state);
    let command = start.elapsed();
    let at = wait_for_event(events, want, start + Duration::from_secs(secs), seen);
    (command, at - start)
}

fn wait_for_event(
    events: &AsyncEvents,
    want: AsyncEvent,
    deadline: Instant,
    seen: &mut Vec<AsyncEvent>,
) -> Instant {
    loop {
        let got = wait_events(events, deadline);
        assert!(
            !got.is_empty() || Instant::now() < deadline,
            "no {want:?} before the deadline; saw {seen:?}"
        );
        let hit = got.iter().find(|(e, _)| *e == want).map(|(_, t)| *t);
        seen.extend(got.into_iter().map(|(e, _)| e));
        if let Some(t) = hit {
            return t;
        }
    }
}

/// Brings the link back up however the test ends, and waits (bounded) until the port is
/// ACTIVE again, so the device tests that follow find it as they expect.
struct LinkRestored<'a> {
    ctx: &'a Context,
    netdev: String,
}

impl Drop for LinkRestored<'_> {
    fn drop(&mut self) {
        let _ = ip_link(&self.netdev, "up");
        let deadline = Instant::now() + Duration::from_secs(20);
        while Instant::now() < deadline {
            if self.ctx.query_port(1).is_ok_and(|p| p.active) {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        if !std::thread::panicking() {
            panic!(
                "port 1 did not become ACTIVE within 20 s of {} going up",
                self.netdev
            );
        }
    }
}

#[test]
fn port_down_and_up_are_named_by_events() {
    let Some(ctx) = support::open("port_down_and_up_are_named_by_events") else {
        return;
    };
    assert!(
        ctx.query_port(1).expect("query port").active,
        "port 1 must start ACTIVE"
    );
    let netdev = netdev_of(ctx.name());
    let events = ctx.async_events().expect("async events");
    // Whatever happened before this test (earlier tests) is not its news.
    while events.poll().expect("drain").is_some() {}
    let restore = LinkRestored {
        ctx: &ctx,
        netdev: netdev.clone(),
    };

    let mut seen = Vec::new();
    let port_error = AsyncEvent::PortError { port: 1 };
    let (t_cmd, down_after) = link_event(&events, &netdev, "down", port_error, 5, &mut seen);
    assert!(
        !ctx.query_port(1).expect("query port").active,
        "after PortError the port must not be ACTIVE"
    );

    let port_active = AsyncEvent::PortActive { port: 1 };
    let (_, up_after) = link_event(&events, &netdev, "up", port_active, 10, &mut seen);
    drop(restore);
    assert!(
        seen.iter()
            .all(|e| !matches!(e, AsyncEvent::Unknown { .. })),
        "{seen:?}"
    );
    eprintln!(
        "{netdev} down: PortError after {down_after:?} (ip link itself took {t_cmd:?}); \
         up: PortActive after {up_after:?}; events in order: {}",
        seen.iter()
            .map(|e| e.to_string())
            .collect::<Vec<_>>()
            .join("; ")
    );
}

#[test]
fn poll_without_events_returns_none_at_once() {
    let Some(ctx) = support::open("poll_without_events_returns_none_at_once") else {
        return;
    };
    let events = ctx.async_events().expect("async events");
    while events.poll().expect("drain").is_some() {}
    let t = Instant::now();
    for _ in 0..1000 {
        assert_eq!(events.poll().expect("poll"), None);
    }
    // A blocking descriptor would have waited for an event here: 1000 empty polls are reads
    // that return EAGAIN at once.
    assert!(t.elapsed() < Duration::from_secs(5), "{:?}", t.elapsed());
    assert!(events.fd() >= 0);
}
