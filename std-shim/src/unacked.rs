//! How much of what a process wrote to a TCP connection its peer has not acknowledged yet.
//!
//! `rverbs-bootstrap` uses it when a rank leaves on an error: its goodbye (the reason it gives
//! up) must reach the peers even when this host's link is down at that moment. The kernel
//! keeps retrying a closed socket's bytes on its own, but on a timer that doubles with every
//! failed try (a persist timer at 3.5 s after a 2 s outage, measured across two hosts) and
//! gives up after `tcp_orphan_retries`, so the goodbye lingers: the process waits, bounded,
//! until this count reaches zero, pushing the bytes again as it waits.

use std::io;
use std::os::fd::BorrowedFd;

/// Bytes written to the connected TCP socket `fd` that the peer has not acknowledged yet,
/// sent or not (a shut-down writing side's FIN counts one); 0 once the connection is closed
/// (reset, or given up by the kernel: nothing more will be delivered, so nothing is worth
/// waiting for).
///
/// # Errors
/// The `getsockopt(2)` or `ioctl(2)` error (`fd` is not a TCP socket, say); on systems other
/// than Linux, [`io::ErrorKind::Unsupported`].
#[cfg(target_os = "linux")]
pub fn unacknowledged(fd: BorrowedFd<'_>) -> io::Result<usize> {
    use std::os::fd::AsRawFd;
    /// `TCP_CLOSE` of the kernel's `tcp_states.h`: the first byte of `struct tcp_info`.
    const TCP_CLOSE: u8 = 7;
    let fd = fd.as_raw_fd();
    // The state is the first byte of `struct tcp_info`; the kernel copies at most `len` bytes.
    let mut info = [0u8; 8];
    let mut len = info.len() as libc::socklen_t;
    // SAFETY: `info` is writable for `len` bytes and `len` is a valid, writable length for
    // the whole call; `fd` is borrowed (open) for its duration.
    let r = unsafe {
        libc::getsockopt(
            fd,
            libc::IPPROTO_TCP,
            libc::TCP_INFO,
            info.as_mut_ptr().cast(),
            &mut len,
        )
    };
    if r != 0 {
        return Err(io::Error::last_os_error());
    }
    if info[0] == TCP_CLOSE {
        return Ok(0);
    }
    let mut queued: libc::c_int = 0;
    // SAFETY: SIOCOUTQ (TIOCOUTQ) writes one int to the pointer, which is valid and writable
    // for the call; `fd` is open for its duration.
    let r = unsafe { libc::ioctl(fd, libc::TIOCOUTQ, &mut queued) };
    if r != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(usize::try_from(queued).unwrap_or(0))
}

/// Bytes written to the connected TCP socket `fd` that the peer has not acknowledged yet:
/// not known on this system.
///
/// # Errors
/// Always [`io::ErrorKind::Unsupported`].
#[cfg(not(target_os = "linux"))]
pub fn unacknowledged(_fd: BorrowedFd<'_>) -> io::Result<usize> {
    Err(io::ErrorKind::Unsupported.into())
}

#[cfg(all(test, target_os = "linux"))]
mod tests {
    use super::*;
    use core::time::Duration;
    use std::io::{Read, Write};
    use std::net::{Shutdown, TcpListener, TcpStream};
    use std::os::fd::AsFd;
    use std::time::Instant;

    /// Polls until `fd` has nothing unacknowledged, at most 5 s; the count last read.
    fn settle(s: &TcpStream) -> usize {
        let end = Instant::now() + Duration::from_secs(5);
        loop {
            let n = unacknowledged(s.as_fd()).unwrap();
            if n == 0 || Instant::now() > end {
                return n;
            }
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    #[test]
    fn bytes_and_the_fin_count_until_the_peer_acknowledges_them() {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let mut a = TcpStream::connect(listener.local_addr().unwrap()).unwrap();
        let (mut b, _) = listener.accept().unwrap();
        assert_eq!(unacknowledged(a.as_fd()).unwrap(), 0);
        // The peer's kernel acknowledges what it received, read or not.
        a.write_all(b"goodbye").unwrap();
        a.shutdown(Shutdown::Write).unwrap();
        assert_eq!(settle(&a), 0);
        let mut got = Vec::new();
        b.read_to_end(&mut got).unwrap();
        assert_eq!(got, b"goodbye");
        // A connection the peer reset counts nothing: nothing more will be delivered.
        let mut c = TcpStream::connect(listener.local_addr().unwrap()).unwrap();
        let (d, _) = listener.accept().unwrap();
        c.write_all(b"unread").unwrap();
        std::thread::sleep(Duration::from_millis(50));
        drop(d); // closing with unread bytes resets the connection
        std::thread::sleep(Duration::from_millis(50));
        let _ = c.write_all(b"after the reset");
        assert_eq!(settle(&c), 0);
    }

    #[test]
    fn a_listener_is_not_a_connection() {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        assert!(unacknowledged(listener.as_fd()).is_err());
    }
}
