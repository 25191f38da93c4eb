//! Flush and drain: the one routine that makes sure a queue pair can no longer touch memory
//! before the memory goes, shared by every owner of a queue pair (a channel, a datagram
//! endpoint).
//!
//! The queue pair is moved to the error state, so the device completes everything posted
//! with a flush status; one signalled request with no data is posted after them (the verbs
//! "drain" idiom: it completes after everything posted before it, so it also retires
//! unsignalled requests that will never complete on their own); then the owner polls until
//! every request it posted is accounted for. If the queue pair cannot be moved to the error
//! state while requests are in flight, or the flush does not drain within the owner's flush
//! timeout, the process aborts: returning would let the memory be freed while the device
//! may still write it.

use core::fmt;

use super::{Patience, StaticClock};
use crate::verb::ProviderError;

/// What [`flush_and_drain`] needs of a queue pair's owner.
pub(crate) trait Drain {
    /// Moves the queue pair to the error state.
    fn set_error(&mut self) -> Result<(), ProviderError>;
    /// Send and receive requests posted and not yet accounted for.
    fn in_flight(&self) -> (u64, u64);
    /// Posts the signalled request with no data that completes after everything posted
    /// before it (nothing if the post fails: the drain then waits for what is due).
    fn post_drain_request(&mut self);
    /// Polls the completion queues once; how many completions it took.
    fn poll_once(&mut self) -> Result<usize, ProviderError>;
    /// Waits a little between empty polls (the owner's back-off).
    fn snooze(&mut self);
    /// The clock and the longest the drain may take.
    fn flush_limit(&self) -> (StaticClock, core::time::Duration);
}

/// Flushes the queue pair of `q` and polls until nothing it posted is in flight; `who` names
/// it in the abort message ("rank 3", "datagram queue pair 17"). Returns only when the device
/// can no longer touch any buffer named by `q`'s requests; aborts the process otherwise.
pub(crate) fn flush_and_drain<Q: Drain>(q: &mut Q, who: &dyn fmt::Display) {
    let done = |q: &Q| q.in_flight() == (0, 0);
    if let Err(e) = q.set_error() {
        if !done(q) {
            let (sends, recvs) = q.in_flight();
            crate::fatal::abort(format_args!(
                "{who}: {e}: cannot flush {sends} send and {recvs} receive requests in flight"
            ));
        }
        return;
    }
    if q.in_flight().0 > 0 {
        q.post_drain_request();
    }
    let (clock, limit) = q.flush_limit();
    let mut patience = Patience::lazy(limit);
    let mut last_err = None;
    // The drain calls the owner's clock and back-off; if one of them panics, the flush is not
    // drained and the process must not go on (unwinding would free the memory).
    let guard = crate::fatal::AbortOnUnwind("a panic while draining a flushed queue pair");
    while !done(q) {
        if patience.run_out(clock) {
            let (sends, recvs) = q.in_flight();
            crate::fatal::abort(format_args!(
                "{who}: the device did not flush {sends} send and {recvs} receive requests \
                 within {limit:?} (last poll error: {last_err:?})"
            ));
        }
        match q.poll_once() {
            Ok(n) if n > 0 => continue,
            Ok(_) => {}
            // Keep trying until the flush deadline: a poll may fail transiently.
            Err(e) => last_err = Some(e),
        }
        q.snooze();
    }
    core::mem::forget(guard);
}
