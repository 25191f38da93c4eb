//! The back-off std programs use: a [`WaitPolicy`] says what a wait does between empty
//! polls, and [`WaitPolicy::backoff`] turns it into the [`StdBackoff`] a channel or node
//! calls.
//!
//! # Which policy to pick
//!
//! | Situation | Policy |
//! |---|---|
//! | Thread pinned to a core nobody else uses (the production setup) | [`WaitPolicy::Spin`]: never give the core away; a yield or a sleep costs microseconds the wait does not have |
//! | The same, and the core's second hardware thread (if any) idle or off | [`WaitPolicy::Busy`]: as `Spin` without the CPU's spin-wait hint, which on x86 can delay seeing a completion by one `pause` (up to about 140 cycles since Skylake) |
//! | Ranks outnumber cores (a laptop, a CI VM, SoftRoCE tests) | [`WaitPolicy::Sleep`] `{ spins: 64, pause: 20 µs }`, the [default](WaitPolicy::default): spin briefly, then give the core to the peer that must make progress |
//! | A core shared with other work, where a sleep's timer slack (Linux sleeps at least about 50 µs) costs too much | [`WaitPolicy::Yield`]: let other runnable threads go first without sleeping; the scheduler may hand the core straight back, so it does not reliably let an oversubscribed peer run |
//! | Ranks outnumber cores and the queues have a completion channel (a node built with completion events, a channel whose back-off was [attached](rverbs_core::poll::Backoff::attach) to its queues' events) | [`WaitPolicy::Block`]: spin briefly, then sleep in the kernel until the NIC raises a completion event or the wait's deadline passes; the rank wakes when its peer's message lands, not at the next timer tick |
//!
//! Why sleep rather than yield when ranks outnumber cores: the rank a wait depends on is
//! runnable but not running, and a yield often returns to the poller at once, so every wait
//! lasts a scheduler slice. A sleep takes the poller off the run queue.
//!
//! The default is the oversubscribed setting because that is where a wrong choice hurts
//! most: sleeping on a dedicated core costs latency, spinning on a shared one stalls every
//! wait behind the scheduler. Set [`WaitPolicy::Spin`] on dedicated cores.
//!
//! `no_std` code that brings its own relax step uses `rverbs_core::poll::SpinThen` instead.

use core::time::Duration;
use std::sync::Arc;

use rverbs_core::poll::{Backoff, Wakeup};

/// What a wait does between empty polls, chosen at run time (from a flag or a config file)
/// as one `Copy` value. [`backoff`](Self::backoff) builds the [`StdBackoff`] that does it.
///
/// The [default](Self::default) is `Sleep { spins: 64, pause: 20 µs }`; the
/// [module docs](self) say which policy fits which machine.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum WaitPolicy {
    /// Spin forever: a pinned thread with a core of its own.
    Spin,
    /// Poll again at once, without the spin-wait hint (`pause`) [`Spin`](Self::Spin) gives
    /// between polls (`rverbs_core::poll::Busy`): a pinned thread that owns a whole core, no
    /// second hardware thread on it, and wants each completion seen the moment it lands.
    Busy,
    /// Spin `spins` empty polls, then yield the CPU on each further one.
    Yield {
        /// Empty polls spent spinning first.
        spins: u32,
    },
    /// Spin `spins` empty polls, then sleep `pause` on each further one: for ranks that
    /// outnumber cores, where a yield may hand the core straight back.
    Sleep {
        /// Empty polls spent spinning first.
        spins: u32,
        /// How long each sleep lasts (Linux sleeps at least about 50 µs, whatever it says).
        pause: Duration,
    },
    /// Spin `spins` empty polls, then arm the queues, poll once more, and sleep on their
    /// completion channel until an event or the wait's deadline. Needs the queues' events
    /// ([`Backoff::attach`]; a node built with completion events attaches them itself);
    /// without them it sleeps [`BLOCK_FALLBACK_PAUSE`] like [`Sleep`](Self::Sleep).
    ///
    /// Only a completion at this end wakes the sleeper. A plain RDMA write into our memory
    /// raises none: a barrier needs `node::Components::barrier_wakeups`, and a wait for a peer's
    /// write (or for messaging credits, which come back as writes) sleeps until its 100 ms
    /// cap. One waiter per set of queues: two threads sleeping on the same events can take
    /// each other's wake-up.
    Block {
        /// Empty polls spent spinning first.
        spins: u32,
    },
}

/// What [`WaitPolicy::Block`] sleeps per empty poll when no completion events are attached
/// (the software model, or queues created without a completion channel).
pub const BLOCK_FALLBACK_PAUSE: Duration = Duration::from_micros(20);

/// The longest one blocking sleep lasts when the wait gave no deadline (a flush drain): the
/// wait then re-polls and sleeps again, so it stays bounded by its own limit.
const MAX_BLOCK: Duration = Duration::from_millis(100);

impl Default for WaitPolicy {
    /// `Sleep { spins: 64, pause: 20 µs }`: right when ranks may outnumber cores, and only
    /// slower, never stalled, on a dedicated core (where [`Spin`](Self::Spin) is better).
    fn default() -> Self {
        Self::Sleep {
            spins: 64,
            pause: Duration::from_micros(20),
        }
    }
}

impl WaitPolicy {
    /// A fresh back-off following this policy. Does not allocate.
    pub const fn backoff(self) -> StdBackoff {
        StdBackoff {
            policy: self,
            count: 0,
            wakeup: None,
            nudge: None,
            sleeps: BlockedSleeps {
                woken: 0,
                expired: 0,
                nudged: 0,
            },
        }
    }
}

/// The [`Backoff`] a [`WaitPolicy`] builds: it counts empty polls since the last
/// [`reset`](Backoff::reset) to know when spinning is over, and holds the completion events
/// [`WaitPolicy::Block`] sleeps on.
///
/// `Clone` and `Send`, so a node clones it into every channel (the clones share the events).
/// Neither [`snooze`](Backoff::snooze) nor [`reset`](Backoff::reset) allocates.
#[derive(Clone, Debug)]
pub struct StdBackoff {
    policy: WaitPolicy,
    count: u32,
    wakeup: Option<Arc<dyn Wakeup>>,
    /// What ends a blocking sleep from another thread ([`Backoff::waker`]); made with the
    /// events, shared by the clones.
    nudge: Option<Arc<Nudge>>,
    sleeps: BlockedSleeps,
}

/// A non-blocking eventfd a [`Waker`](core::task::Waker) writes to, so a failure raised on
/// another thread ends a blocking sleep at once instead of when it runs out.
#[derive(Debug)]
struct Nudge {
    fd: std::os::fd::OwnedFd,
}

impl Nudge {
    fn new() -> Option<Self> {
        // SAFETY: eventfd takes no pointers; a negative return is an error.
        let fd = unsafe { libc::eventfd(0, libc::EFD_NONBLOCK | libc::EFD_CLOEXEC) };
        if fd < 0 {
            return None;
        }
        Some(Self {
            // SAFETY: fd is a fresh descriptor nobody else owns.
            fd: unsafe { std::os::fd::FromRawFd::from_raw_fd(fd) },
        })
    }

    fn raw(&self) -> i32 {
        std::os::fd::AsRawFd::as_raw_fd(&self.fd)
    }

    /// Empties the counter, so the next sleep waits again.
    fn drain(&self) {
        let mut v = 0u64;
        // SAFETY: reads 8 bytes into a valid local from our own non-blocking eventfd; an
        // empty counter fails with EAGAIN, which is fine.
        let _ = unsafe { libc::read(self.raw(), (&mut v as *mut u64).cast(), 8) };
    }
}

impl std::task::Wake for Nudge {
    fn wake(self: Arc<Self>) {
        self.wake_by_ref();
    }

    fn wake_by_ref(self: &Arc<Self>) {
        let one = 1u64;
        // SAFETY: writes 8 bytes from a valid local to our own eventfd; a full counter
        // (EAGAIN) already wakes the sleeper.
        let _ = unsafe { libc::write(self.raw(), (&one as *const u64).cast(), 8) };
    }
}

/// What the blocking sleeps of one [`StdBackoff`] ended by ([`WaitPolicy::Block`] with
/// completion events attached): a completion event, or the end of the time the wait allowed.
/// A sleep that ran to its limit while the wait's deadline was still far away would be a lost
/// wake-up; tests count them.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct BlockedSleeps {
    /// Sleeps a completion event ended.
    pub woken: u64,
    /// Sleeps that lasted until the wait's deadline (or the 100 ms cap).
    pub expired: u64,
    /// Sleeps the back-off's [waker](Backoff::waker) ended (a failure raised on a node's
    /// alarm).
    pub nudged: u64,
}

/// What one empty poll does; [`StdBackoff::next_step`] decides, [`Backoff::snooze`] acts.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Step {
    Spin,
    Busy,
    Yield,
    Sleep(Duration),
    Block,
}

impl StdBackoff {
    /// The policy this back-off follows.
    pub const fn policy(&self) -> WaitPolicy {
        self.policy
    }

    /// Spins while fewer than `spins` empty polls have passed, then relaxes with `relax`.
    #[inline]
    fn spin_then(&mut self, spins: u32, relax: Step) -> Step {
        if self.count < spins {
            self.count += 1;
            Step::Spin
        } else {
            relax
        }
    }

    #[inline]
    fn next_step(&mut self) -> Step {
        match self.policy {
            WaitPolicy::Spin => Step::Spin,
            WaitPolicy::Busy => Step::Busy,
            WaitPolicy::Yield { spins } => self.spin_then(spins, Step::Yield),
            WaitPolicy::Sleep { spins, pause } => self.spin_then(spins, Step::Sleep(pause)),
            WaitPolicy::Block { spins } => self.spin_then(spins, Step::Block),
        }
    }

    /// Whether completion events are attached ([`WaitPolicy::Block`] sleeps on them).
    pub fn has_wakeup(&self) -> bool {
        self.wakeup.is_some()
    }

    /// How this back-off's blocking sleeps ended so far.
    pub fn blocked_sleeps(&self) -> BlockedSleeps {
        self.sleeps
    }

    /// One blocking step: arm the queues (and return, so the caller polls once more), or,
    /// once they are armed, sleep until an event or `left()`.
    fn block(&mut self, left: &mut dyn FnMut() -> Duration) {
        let Some(w) = &self.wakeup else {
            std::thread::sleep(BLOCK_FALLBACK_PAUSE);
            return;
        };
        match w.arm() {
            // A queue was just armed: a completion that came before the arm raised no event,
            // so the caller must poll again before anyone sleeps.
            Ok(true) => return,
            Ok(false) => {}
            // Arming failed (the device is gone?): the wait's own poll will report it; do
            // not spin hot meanwhile.
            Err(_) => {
                std::thread::sleep(BLOCK_FALLBACK_PAUSE);
                return;
            }
        }
        let limit = left().min(MAX_BLOCK);
        if limit.is_zero() {
            return;
        }
        let nudge = self.nudge.as_ref().map_or(-1, |n| n.raw());
        let (events, nudged) = wait_readable(w.fd(), nudge, limit);
        if nudged {
            self.sleeps.nudged += 1;
            if let Some(n) = &self.nudge {
                n.drain();
            }
        }
        if events {
            self.sleeps.woken += 1;
            // Errors surface in the wait's next poll; the events only tell it to look.
            let _ = w.take_events();
        } else if !nudged {
            self.sleeps.expired += 1;
            // No event came: if one was lost, the queues that raised nothing may not be
            // armed although their flags say so. Arm them all again next time (the caller
            // then polls once more before any further sleep).
            w.forget_armed();
        }
    }
}

/// The descriptor of `wakeup` for an event loop's `poll`/`epoll` (arm first, take the
/// events after: see [`Wakeup`]). Borrowed: the completion channel owns and closes it.
pub fn wakeup_fd(wakeup: &dyn Wakeup) -> std::os::fd::BorrowedFd<'_> {
    // SAFETY: `Wakeup` is an unsafe trait whose implementors promise that `fd` stays open
    // while the value lives, which the borrow cannot outlast.
    unsafe { std::os::fd::BorrowedFd::borrow_raw(wakeup.fd()) }
}

/// Sleeps until `fd` or `nudge` (ignored when negative) is readable or `limit` passes;
/// whether each became readable.
fn wait_readable(fd: i32, nudge: i32, limit: Duration) -> (bool, bool) {
    let mut pfd = [
        libc::pollfd {
            fd,
            events: libc::POLLIN,
            revents: 0,
        },
        libc::pollfd {
            fd: nudge,
            events: libc::POLLIN,
            revents: 0,
        },
    ];
    let ts = libc::timespec {
        tv_sec: limit.as_secs().min(i64::MAX as u64) as libc::time_t,
        tv_nsec: libc::c_long::from(limit.subsec_nanos() as i32),
    };
    // SAFETY: pfd (two entries; poll ignores a negative descriptor) and ts are valid for
    // the call; no signal mask is changed (null).
    let n = unsafe { libc::ppoll(pfd.as_mut_ptr(), 2, &ts, core::ptr::null()) };
    // A signal (EINTR) or an error counts as a wake-up: the wait re-polls and checks its
    // deadline, and sleeps again if nothing came.
    if n < 0 {
        return (true, false);
    }
    (pfd[0].revents != 0, pfd[1].revents != 0)
}

impl Backoff for StdBackoff {
    /// Spins, yields or sleeps as the policy says; never allocates. A blocking step without
    /// a deadline sleeps at most 100 ms.
    #[inline]
    fn snooze(&mut self) {
        self.snooze_within(&mut || MAX_BLOCK);
    }

    #[inline]
    fn reset(&mut self) {
        self.count = 0;
    }

    /// As [`snooze`](Backoff::snooze); a blocking step returns within `left()`.
    #[inline]
    fn snooze_within(&mut self, left: &mut dyn FnMut() -> Duration) {
        match self.next_step() {
            Step::Spin => core::hint::spin_loop(),
            Step::Busy => {}
            Step::Yield => std::thread::yield_now(),
            Step::Sleep(pause) => std::thread::sleep(pause),
            Step::Block => self.block(left),
        }
    }

    /// Keeps `wakeup` for [`WaitPolicy::Block`] (the other policies ignore it), and makes
    /// the eventfd its [`waker`](Backoff::waker) writes to. Allocates (setup).
    fn attach(&mut self, wakeup: &Arc<dyn Wakeup>) {
        self.wakeup = Some(wakeup.clone());
        if matches!(self.policy, WaitPolicy::Block { .. }) && self.nudge.is_none() {
            // Without an eventfd (out of descriptors), news waits for the sleep to end: at
            // most 100 ms, or the wait's deadline.
            self.nudge = Nudge::new().map(Arc::new);
        }
    }

    /// Under [`WaitPolicy::Block`] with events attached: a waker that ends the current (or
    /// next) blocking sleep of this back-off and its clones at once. Counted in
    /// [`BlockedSleeps::nudged`].
    fn waker(&self) -> Option<core::task::Waker> {
        self.nudge.clone().map(core::task::Waker::from)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Instant;

    /// The steps of `n` empty polls.
    fn steps(b: &mut StdBackoff, n: usize) -> Vec<Step> {
        (0..n).map(|_| b.next_step()).collect()
    }

    #[test]
    fn each_policy_spins_its_count_then_relaxes_and_reset_starts_over() {
        let pause = Duration::from_micros(7);
        for (policy, spins, relax) in [
            (WaitPolicy::Yield { spins: 5 }, 5, Step::Yield),
            (WaitPolicy::Yield { spins: 0 }, 0, Step::Yield),
            (WaitPolicy::Sleep { spins: 3, pause }, 3, Step::Sleep(pause)),
            (WaitPolicy::Sleep { spins: 0, pause }, 0, Step::Sleep(pause)),
        ] {
            let mut b = policy.backoff();
            let mut want = vec![Step::Spin; spins];
            want.extend([relax; 4]);
            assert_eq!(steps(&mut b, spins + 4), want, "{policy:?}");
            b.reset();
            assert_eq!(steps(&mut b, spins + 4), want, "{policy:?} after reset");
        }
    }

    #[test]
    fn spin_policy_never_relaxes() {
        let mut b = WaitPolicy::Spin.backoff();
        assert!(steps(&mut b, 100_000).iter().all(|s| *s == Step::Spin));
    }

    #[test]
    fn busy_policy_never_relaxes_nor_hints() {
        let mut b = WaitPolicy::Busy.backoff();
        assert!(steps(&mut b, 100_000).iter().all(|s| *s == Step::Busy));
    }

    #[test]
    fn default_is_sleep_64_polls_then_20_us() {
        assert_eq!(
            WaitPolicy::default(),
            WaitPolicy::Sleep {
                spins: 64,
                pause: Duration::from_micros(20),
            }
        );
        assert_eq!(
            WaitPolicy::default().backoff().policy(),
            WaitPolicy::default()
        );
    }

    #[test]
    fn policy_is_copy_and_backoff_is_clone_and_send() {
        fn assert_send_copy<T: Send + Copy + 'static>(_: &T) {}
        fn assert_send_clone<T: Send + Clone + 'static>(_: &T) {}
        for p in [
            WaitPolicy::Spin,
            WaitPolicy::Yield { spins: 10 },
            WaitPolicy::Block { spins: 10 },
            WaitPolicy::default(),
        ] {
            assert_send_copy(&p);
            assert_send_clone(&p.backoff());
        }
    }

    #[test]
    fn every_wait_policy_snoozes_and_resets_without_panicking() {
        for p in [
            WaitPolicy::Spin,
            WaitPolicy::Busy,
            WaitPolicy::Yield { spins: 2 },
            WaitPolicy::Sleep {
                spins: 2,
                pause: Duration::from_micros(1),
            },
        ] {
            let mut b = p.backoff();
            for _ in 0..10 {
                b.snooze();
            }
            b.reset();
            b.snooze();
        }
    }

    #[test]
    fn sleep_policy_sleeps_only_after_spinning() {
        let pause = Duration::from_millis(2);
        let mut b = WaitPolicy::Sleep { spins: 1000, pause }.backoff();

        // 1000 spins take microseconds; a sleep among them would take at least `pause`.
        // Not a timing assertion on speed, only on the lower bound a sleep guarantees.
        for _ in 0..1000 {
            b.snooze();
        }
        assert_eq!(b.count, 1000);
        let before = Instant::now();
        b.snooze();
        assert!(before.elapsed() >= pause);

        b.reset();
        assert_eq!(b.count, 0);
    }

    #[test]
    fn zero_spins_sleeps_at_once() {
        let pause = Duration::from_millis(1);
        let mut b = WaitPolicy::Sleep { spins: 0, pause }.backoff();
        let before = Instant::now();
        b.snooze();
        assert!(before.elapsed() >= pause);
    }

    /// A wakeup over a pipe: "armed" once per event; readable when a byte was written.
    #[derive(Debug)]
    struct PipeWakeup {
        fds: [i32; 2],
        arms: core::sync::atomic::AtomicU32,
        armed: core::sync::atomic::AtomicBool,
    }

    impl PipeWakeup {
        fn new() -> Arc<Self> {
            let mut fds = [0; 2];
            // SAFETY: fds has room for the two descriptors pipe2 writes.
            let rc = unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_NONBLOCK) };
            assert_eq!(rc, 0);
            Arc::new(Self {
                fds,
                arms: 0.into(),
                armed: false.into(),
            })
        }
        fn fire(&self) {
            // SAFETY: writes one byte from a valid buffer to our own pipe.
            let n = unsafe { libc::write(self.fds[1], [1u8].as_ptr().cast(), 1) };
            assert_eq!(n, 1);
        }
    }

    impl Drop for PipeWakeup {
        fn drop(&mut self) {
            // SAFETY: closes the descriptors this value owns.
            unsafe {
                libc::close(self.fds[0]);
                libc::close(self.fds[1]);
            }
        }
    }

    // SAFETY: the read end stays open until the value drops.
    unsafe impl Wakeup for PipeWakeup {
        fn arm(&self) -> Result<bool, rverbs_core::provider::ProviderError> {
            use core::sync::atomic::Ordering::SeqCst;
            let newly = !self.armed.swap(true, SeqCst);
            if newly {
                self.arms.fetch_add(1, SeqCst);
            }
            Ok(newly)
        }
        fn fd(&self) -> i32 {
            self.fds[0]
        }
        fn take_events(&self) -> Result<u32, rverbs_core::provider::ProviderError> {
            let mut b = [0u8; 16];
            // SAFETY: reads into a valid local buffer from our own non-blocking pipe.
            let n = unsafe { libc::read(self.fds[0], b.as_mut_ptr().cast(), b.len()) };
            self.armed
                .store(false, core::sync::atomic::Ordering::SeqCst);
            Ok(n.max(0) as u32)
        }
        fn forget_armed(&self) {
            self.armed
                .store(false, core::sync::atomic::Ordering::SeqCst);
        }
    }

    fn blocking(w: &Arc<PipeWakeup>, spins: u32) -> StdBackoff {
        let mut b = WaitPolicy::Block { spins }.backoff();
        let w: Arc<dyn Wakeup> = w.clone();
        b.attach(&w);
        assert!(b.has_wakeup());
        b
    }

    #[test]
    fn block_spins_then_arms_and_returns_before_it_sleeps() {
        let w = PipeWakeup::new();
        let mut b = blocking(&w, 3);
        let t = Instant::now();
        for _ in 0..3 {
            b.snooze_within(&mut || Duration::from_secs(10));
        }
        assert_eq!(
            w.arms.load(core::sync::atomic::Ordering::SeqCst),
            0,
            "armed while spinning"
        );
        // The first blocking step only arms: the caller must poll again before any sleep.
        b.snooze_within(&mut || Duration::from_secs(10));
        assert_eq!(w.arms.load(core::sync::atomic::Ordering::SeqCst), 1);
        assert!(
            t.elapsed() < Duration::from_secs(5),
            "slept before re-polling"
        );
        assert_eq!(b.blocked_sleeps(), BlockedSleeps::default());
    }

    #[test]
    fn block_sleeps_until_the_event() {
        let w = PipeWakeup::new();
        let mut b = blocking(&w, 0);
        b.snooze_within(&mut || Duration::from_secs(10)); // arms
        let fire = {
            let w = w.clone();
            std::thread::spawn(move || {
                std::thread::sleep(Duration::from_millis(50));
                w.fire();
            })
        };
        let t = Instant::now();
        b.snooze_within(&mut || Duration::from_secs(10));
        let slept = t.elapsed();
        fire.join().unwrap();
        assert!(
            slept >= Duration::from_millis(40),
            "did not sleep: {slept:?}"
        );
        assert!(
            slept < Duration::from_secs(5),
            "slept past the event: {slept:?}"
        );
        assert_eq!(
            b.blocked_sleeps(),
            BlockedSleeps {
                woken: 1,
                expired: 0,
                nudged: 0,
            }
        );
        // The event disarmed the queue: the next step arms again instead of sleeping.
        b.snooze_within(&mut || Duration::from_secs(10));
        assert_eq!(w.arms.load(core::sync::atomic::Ordering::SeqCst), 2);
    }

    #[test]
    fn block_returns_at_the_deadline_and_never_past_it() {
        let w = PipeWakeup::new();
        let mut b = blocking(&w, 0);
        b.snooze_within(&mut || Duration::from_secs(10)); // arms
        let t = Instant::now();
        b.snooze_within(&mut || Duration::from_millis(30));
        let slept = t.elapsed();
        assert!(slept >= Duration::from_millis(30), "{slept:?}");
        assert!(slept < Duration::from_secs(5), "{slept:?}");
        assert_eq!(
            b.blocked_sleeps(),
            BlockedSleeps {
                woken: 0,
                expired: 1,
                nudged: 0,
            }
        );
        // A deadline already passed: no sleep at all.
        let t = Instant::now();
        b.snooze_within(&mut || Duration::ZERO);
        assert!(t.elapsed() < Duration::from_secs(1));
        assert_eq!(b.blocked_sleeps().expired, 1);
    }

    #[test]
    fn a_sleep_no_event_ended_rearms_before_the_next_one() {
        let w = PipeWakeup::new();
        let mut b = blocking(&w, 0);
        b.snooze_within(&mut || Duration::from_secs(10)); // arms
                                                          // The queue believes itself armed, but its event never comes (lost).
        b.snooze_within(&mut || Duration::from_millis(20));
        assert_eq!(b.blocked_sleeps().expired, 1);
        // The next step arms again and returns for one more poll instead of sleeping on a
        // queue that may never raise an event.
        let t = Instant::now();
        b.snooze_within(&mut || Duration::from_secs(10));
        assert!(
            t.elapsed() < Duration::from_secs(5),
            "slept without re-arming"
        );
        assert_eq!(w.arms.load(core::sync::atomic::Ordering::SeqCst), 2);
        assert_eq!(b.blocked_sleeps().expired, 1);
    }

    #[test]
    fn the_waker_ends_a_blocking_sleep_and_is_drained_by_it() {
        let w = PipeWakeup::new();
        let mut b = blocking(&w, 0);
        let waker = b
            .waker()
            .expect("a blocking back-off with events has a waker");
        b.snooze_within(&mut || Duration::from_secs(10)); // arms
                                                          // Woken before the sleep starts (news raised between the wait's check and its
                                                          // sleep): the sleep must still end at once.
        waker.wake_by_ref();
        let t = Instant::now();
        b.snooze_within(&mut || Duration::from_secs(10));
        assert!(t.elapsed() < Duration::from_secs(5));
        let s = b.blocked_sleeps();
        assert_eq!((s.nudged, s.woken, s.expired), (1, 0, 0), "{s:?}");
        // Woken from another thread while asleep; a clone shares the waker.
        let mut c = b.clone();
        let fire = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(20));
            waker.wake();
        });
        c.snooze_within(&mut || Duration::from_secs(10));
        fire.join().unwrap();
        let s = c.blocked_sleeps();
        assert_eq!((s.nudged, s.expired), (2, 0), "{s:?}");
        // The wake-up was taken: the next sleep waits for its own end.
        let t = Instant::now();
        c.snooze_within(&mut || Duration::from_millis(30));
        assert!(t.elapsed() >= Duration::from_millis(30));
        // Only a blocking policy with events gets one.
        assert!(WaitPolicy::Block { spins: 0 }.backoff().waker().is_none());
        let mut s = WaitPolicy::default().backoff();
        let any: Arc<dyn Wakeup> = PipeWakeup::new();
        s.attach(&any);
        assert!(s.waker().is_none());
    }

    #[test]
    fn block_without_events_sleeps_like_the_fallback() {
        let mut b = WaitPolicy::Block { spins: 0 }.backoff();
        assert!(!b.has_wakeup());
        let t = Instant::now();
        b.snooze();
        assert!(t.elapsed() >= BLOCK_FALLBACK_PAUSE);
    }
}
