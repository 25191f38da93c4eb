//! The last resort: stop the process rather than hand back memory the device may still use.
//!
//! rverbs never returns a buffer to the caller while a work request naming it could still be
//! executed, and never frees memory a peer can still reach. When the device will not confirm
//! that (a queue pair that cannot be moved to the error state, a flush that does not drain
//! within its bound, a deregistration that fails for memory the caller will free), the only
//! sound way out is to stop the process. `no_std` code has no `abort`, so it panics while a
//! guard's destructor panics too: a panic during unwinding always aborts (and with
//! `panic = "abort"` the first panic already does). The message is printed by the panic
//! handler first.

use core::fmt;

/// Aborts the process after printing `why`. Never returns, never unwinds into the caller.
#[cold]
#[inline(never)]
pub(crate) fn abort(why: fmt::Arguments<'_>) -> ! {
    struct AbortOnUnwind;
    impl Drop for AbortOnUnwind {
        fn drop(&mut self) {
            panic!("rverbs: aborting the process: the device may still use this memory");
        }
    }
    let _guard = AbortOnUnwind;
    panic!("rverbs: {why}");
}

/// Aborts the process if dropped, that is, if the code it guards unwinds; the normal exit
/// `mem::forget`s it.
pub(crate) struct AbortOnUnwind(pub(crate) &'static str);

impl Drop for AbortOnUnwind {
    fn drop(&mut self) {
        abort(format_args!("{}", self.0));
    }
}
