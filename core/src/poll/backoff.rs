//! What a busy-poll loop does between two empty polls.
//!
//! A pinned thread with a core of its own should spin: yielding costs microseconds it does
//! not have. A thread that shares its core (more ranks than cores, as in a test VM) must
//! give the core away, or its peer never runs and every wait lasts a scheduler period.
//! [`Spin`] does the first ([`Busy`] without even the CPU's spin-wait hint); [`SpinThen`] spins a configurable number of rounds, then calls a
//! relax step the caller brings (`no_std` code can neither yield nor sleep).
//!
//! std programs do not build their own: `rverbs_std_shim::WaitPolicy` describes spin, yield
//! or sleep as one `Copy` value, and its `StdBackoff` implements [`Backoff`] here.

use core::time::Duration;

use crate::verb::ProviderError;

/// A waiting policy for busy-poll loops.
pub trait Backoff {
    /// Called after a poll that found nothing.
    fn snooze(&mut self);
    /// Called after a poll that made progress: the next wait starts spinning again.
    fn reset(&mut self);

    /// Called instead of [`snooze`](Self::snooze) by waits that have a deadline: `left`
    /// tells how long remains. A back-off that may block (sleep on completion events) must
    /// return within `left()`; one that does not ignores it, as this default does.
    #[inline]
    fn snooze_within(&mut self, left: &mut dyn FnMut() -> Duration) {
        let _ = left;
        self.snooze();
    }

    /// Hands the back-off the completion events of the queues its waits poll, so it can
    /// sleep until one arrives instead of spinning or sleeping blindly. Called by setup code
    /// (a node, or whoever creates queues with a completion channel) before the first
    /// wait; the default ignores it. Allocates nothing itself; clones share `wakeup`.
    #[cfg(feature = "alloc")]
    fn attach(&mut self, wakeup: &alloc::sync::Arc<dyn Wakeup>) {
        let _ = wakeup;
    }

    /// A waker that ends a blocking sleep of this back-off (and of its clones) at once, from
    /// any thread: what a node's [failure alarm](crate::node::FailureAlarm) wakes, so news
    /// raised elsewhere does not wait for the sleep to run out. `None` (the default) for a
    /// back-off that never sleeps long; ask after [`attach`](Self::attach).
    fn waker(&self) -> Option<core::task::Waker> {
        None
    }
}

impl<B: Backoff + ?Sized> Backoff for &mut B {
    #[inline]
    fn snooze(&mut self) {
        (**self).snooze();
    }
    #[inline]
    fn reset(&mut self) {
        (**self).reset();
    }
    #[inline]
    fn snooze_within(&mut self, left: &mut dyn FnMut() -> Duration) {
        (**self).snooze_within(left);
    }
    #[cfg(feature = "alloc")]
    fn attach(&mut self, wakeup: &alloc::sync::Arc<dyn Wakeup>) {
        (**self).attach(wakeup);
    }
    fn waker(&self) -> Option<core::task::Waker> {
        (**self).waker()
    }
}

/// Completion queues a waiting thread can sleep on: armed, they make a file descriptor
/// readable at their next completion (`rverbs_core::verbs::CqEvents` on a device). Core
/// never blocks; a blocking back-off (`rverbs_std_shim::WaitPolicy::Block`) does:
///
/// 1. [`arm`](Self::arm); if it armed a queue, poll once more before sleeping (a
///    completion that arrived before the arm raised no event);
/// 2. sleep until [`fd`](Self::fd) is readable or the deadline;
/// 3. [`take_events`](Self::take_events), which disarms the queues that fired; after a
///    sleep that no event ended, [`forget_armed`](Self::forget_armed), so the next step arms
///    every queue again.
///
/// # Safety
/// [`fd`](Self::fd) returns the same descriptor for as long as the value lives, and that
/// descriptor stays open until it is dropped: callers hand it to `poll(2)` and borrow it as a
/// `BorrowedFd`. One waiter at a time: events are read by whoever sleeps, so two threads
/// sleeping on one `Wakeup` can take each other's wake-up (each thread gets its own queues
/// and channel).
// An `unsafe trait`: std code borrows the descriptor on its word (`poll` itself stays safe).
#[allow(unsafe_code)]
pub unsafe trait Wakeup: Send + Sync + core::fmt::Debug {
    /// Arms every queue not armed yet; `Ok(true)` if one was, and the caller must poll once
    /// more before it sleeps.
    fn arm(&self) -> Result<bool, ProviderError>;
    /// The descriptor that becomes readable when an armed queue completes something.
    fn fd(&self) -> i32;
    /// Takes and acknowledges every pending event without blocking; returns how many.
    fn take_events(&self) -> Result<u32, ProviderError>;
    /// Forgets which queues are armed, so the next [`arm`](Self::arm) arms all of them again
    /// (arming an armed queue changes nothing) and the caller polls once more. A blocking
    /// back-off calls it after a sleep that ran to its limit: if an event was ever lost (the
    /// kernel drops one it cannot allocate), a queue that believes itself armed would never
    /// raise another, and every later sleep would last to its limit. The default does
    /// nothing.
    fn forget_armed(&self) {}
}

/// Spins forever: the right choice for a thread pinned to a core of its own.
#[derive(Clone, Copy, Debug, Default)]
pub struct Spin;

impl Backoff for Spin {
    #[inline]
    fn snooze(&mut self) {
        core::hint::spin_loop();
    }
    #[inline]
    fn reset(&mut self) {}
}

/// Polls again at once, without the CPU's spin-wait hint that [`Spin`] gives between polls:
/// what perftest's loops do. For a thread that owns a whole core (no second hardware thread
/// on it to hand cycles to), it shortens the time from a completion's arrival to its being
/// seen by at most one hint's latency: on x86 a `pause` takes up to about 140 cycles
/// (Skylake and later), and under QEMU's emulation about 0.14 us. The price: a core that draws more power,
/// and a sibling hardware thread, if there is one, runs slower.
#[derive(Clone, Copy, Debug, Default)]
pub struct Busy;

impl Backoff for Busy {
    #[inline(always)]
    fn snooze(&mut self) {}
    #[inline(always)]
    fn reset(&mut self) {}
}

/// Spins `spins` times, then calls `relax` on every further empty poll (a thread yield or a
/// short sleep, supplied by the caller because `no_std` code cannot do either).
#[derive(Clone, Copy, Debug)]
pub struct SpinThen<R: FnMut()> {
    spins: u32,
    count: u32,
    relax: R,
}

impl<R: FnMut()> SpinThen<R> {
    /// Spin `spins` rounds before calling `relax` on each empty poll.
    pub const fn new(spins: u32, relax: R) -> Self {
        Self {
            spins,
            count: 0,
            relax,
        }
    }
}

impl<R: FnMut()> Backoff for SpinThen<R> {
    #[inline]
    fn snooze(&mut self) {
        if self.count < self.spins {
            self.count += 1;
            core::hint::spin_loop();
        } else {
            (self.relax)();
        }
    }
    #[inline]
    fn reset(&mut self) {
        self.count = 0;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn spins_then_relaxes_then_resets() {
        let mut relaxed = 0u32;
        {
            let mut b = SpinThen::new(3, || relaxed += 1);
            for _ in 0..5 {
                b.snooze();
            }
            b.reset();
            for _ in 0..4 {
                b.snooze();
            }
        }
        assert_eq!(relaxed, 2 + 1);
    }
}
