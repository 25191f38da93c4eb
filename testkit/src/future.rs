//! Driving futures by hand, without a runtime: for tests of futures whose events wake at
//! once (the software model's), and of what happens when a future is dropped between polls.

use core::future::Future;
use core::pin::{pin, Pin};
use core::task::{Context, Poll, Waker};

/// Polls `fut` once with a waker that does nothing.
pub fn poll_once<F: Future + ?Sized>(fut: Pin<&mut F>) -> Poll<F::Output> {
    fut.poll(&mut Context::from_waker(Waker::noop()))
}

/// Polls `fut` until it is ready (the model's events wake at once, so polling again is what
/// the waker would ask for); panics after a million polls.
pub fn block_on<F: Future>(fut: F) -> F::Output {
    let mut fut = pin!(fut);
    for _ in 0..1_000_000 {
        if let Poll::Ready(v) = poll_once(fut.as_mut()) {
            return v;
        }
    }
    panic!("the future did not finish within a million polls");
}
