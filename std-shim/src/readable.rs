//! Sleeping until one descriptor is readable, with a timeout: how a thread waits for a
//! device's asynchronous events (`rverbs_core::verbs::AsyncEvents::fd`) without spinning.

use core::time::Duration;
use std::io;
use std::os::fd::RawFd;

/// Waits until `fd` is readable (or reports an error or hang-up, which a read then names)
/// or `timeout` passes. `Ok(true)` if it is, `Ok(false)` on timeout or an interrupted call.
///
/// Takes a raw descriptor (such as `AsyncEvents::fd`, which core hands out as a number): a
/// poll only looks at the number, so a descriptor that is not open is no hazard; it polls as
/// ready (`POLLNVAL`) and the read that follows reports the error.
///
/// # Errors
/// `poll(2)`'s error, other than an interrupted call.
pub fn wait_readable(fd: RawFd, timeout: Duration) -> io::Result<bool> {
    let mut p = libc::pollfd {
        fd,
        events: libc::POLLIN,
        revents: 0,
    };
    let ms = libc::c_int::try_from(timeout.as_millis()).unwrap_or(libc::c_int::MAX);
    // SAFETY: one valid pollfd for the whole call; poll(2) reads no memory through the
    // descriptor number.
    let n = unsafe { libc::poll(&mut p, 1, ms) };
    if n < 0 {
        let e = io::Error::last_os_error();
        return if e.kind() == io::ErrorKind::Interrupted {
            Ok(false)
        } else {
            Err(e)
        };
    }
    Ok(n > 0 && p.revents != 0)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;
    use std::os::fd::AsRawFd;
    use std::os::unix::net::UnixStream;

    #[test]
    fn readable_only_once_bytes_wait() {
        let (mut a, b) = UnixStream::pair().unwrap();
        assert!(!wait_readable(b.as_raw_fd(), Duration::from_millis(10)).unwrap());
        a.write_all(b"x").unwrap();
        assert!(wait_readable(b.as_raw_fd(), Duration::from_secs(5)).unwrap());
    }
}
