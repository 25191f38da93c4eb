//! Waiting for the far end of a connection to hang up, without reading from it.
//!
//! `rverbs-bootstrap` watches the TCP connections its rendezvous left open: when a rank's
//! process dies, the kernel closes its sockets, and the peers see the hang-up at once, while
//! the same sockets stay usable for out-of-band rounds (nothing is consumed).

use core::time::Duration;
use std::io;
use std::os::fd::{AsRawFd, BorrowedFd};

/// The peer shut down its writing side: Linux reports it on its own; elsewhere only the full
/// hang-up (`POLLHUP`) is seen.
#[cfg(target_os = "linux")]
const HALF_CLOSED: libc::c_short = libc::POLLRDHUP;
#[cfg(not(target_os = "linux"))]
const HALF_CLOSED: libc::c_short = 0;

/// Room for the descriptors one [`wait_for_hangup`] call polls, reused from call to call so
/// that a watch that runs for weeks does not allocate.
#[derive(Debug, Default)]
pub struct PollSet {
    polled: Vec<libc::pollfd>,
}

impl PollSet {
    /// Room for `n` descriptors (more grow it on first use).
    pub fn with_capacity(n: usize) -> Self {
        Self {
            polled: Vec::with_capacity(n),
        }
    }
}

/// Waits at most `timeout` until the peer of at least one of `fds` hung up (shut down its
/// writing side, reset the connection, or the socket failed), and sets `hung_up[i]` for each
/// such `i`-th descriptor (other entries are left as they are). Returns how many hung up.
/// Unread data does not count: only the hang-up does (`POLLRDHUP`, `POLLHUP`, `POLLERR`).
/// Does not allocate once `set` has room for `fds`.
///
/// # Errors
/// `poll(2)`'s error, other than an interrupted call (which returns `Ok(0)`).
///
/// # Panics
/// If `hung_up` is shorter than `fds`.
pub fn wait_for_hangup<'a>(
    set: &mut PollSet,
    fds: impl IntoIterator<Item = BorrowedFd<'a>>,
    timeout: Duration,
    hung_up: &mut [bool],
) -> io::Result<usize> {
    let polled = &mut set.polled;
    polled.clear();
    polled.extend(fds.into_iter().map(|fd| libc::pollfd {
        fd: fd.as_raw_fd(),
        events: HALF_CLOSED,
        revents: 0,
    }));
    assert!(hung_up.len() >= polled.len(), "one flag per descriptor");
    let ms = libc::c_int::try_from(timeout.as_millis()).unwrap_or(libc::c_int::MAX);
    // SAFETY: `polled` is a valid array of `polled.len()` pollfd entries for the whole call,
    // and every descriptor in it is borrowed (open) for the call's duration.
    let n = unsafe { libc::poll(polled.as_mut_ptr(), polled.len() as libc::nfds_t, ms) };
    if n < 0 {
        let e = io::Error::last_os_error();
        return if e.kind() == io::ErrorKind::Interrupted {
            Ok(0)
        } else {
            Err(e)
        };
    }
    let mut count = 0;
    for (p, flag) in polled.iter().zip(hung_up.iter_mut()) {
        if p.revents & (HALF_CLOSED | libc::POLLHUP | libc::POLLERR) != 0 {
            *flag = true;
            count += 1;
        }
    }
    Ok(count)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;
    use std::os::fd::AsFd;
    use std::os::unix::net::UnixStream;

    #[test]
    fn a_closed_peer_is_seen_and_unread_data_is_not_a_hangup() {
        let (mut a, b) = UnixStream::pair().unwrap();
        let (c, d) = UnixStream::pair().unwrap();
        a.write_all(b"unread").unwrap();
        let mut set = PollSet::with_capacity(2);
        // How many of b and c hung up within `timeout`, and which.
        let mut wait = |timeout| {
            let mut flags = [false; 2];
            let n = wait_for_hangup(&mut set, [b.as_fd(), c.as_fd()], timeout, &mut flags);
            (n.unwrap(), flags)
        };
        assert_eq!(wait(Duration::from_millis(20)), (0, [false, false]));
        drop(d);
        assert_eq!(wait(Duration::from_secs(5)), (1, [false, true]));
        drop(a);
    }
}
