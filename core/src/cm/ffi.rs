//! The librdmacm bindings, and the few C library calls around them.
//!
//! `build.rs` generates the bindings from the installed `rdma_cma.h` for exactly the
//! `rdma_*` calls and types this module uses; the `ibv_*` types they embed are
//! `ibverbs-sys`'s (imported below), so what `rdma_init_qp_attr` fills is what
//! [`crate::verbs`] hands `ibv_modify_qp`. Only [`crate::cm`] calls into librdmacm, as
//! only [`crate::verbs`] calls into libibverbs.

use core::ffi::c_int;
use core::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, SocketAddrV4, SocketAddrV6};

pub(crate) use crate::verbs::ffi::{errno, set_nonblocking, EAGAIN};

/// The generated bindings.
#[allow(
    non_camel_case_types,
    non_upper_case_globals,
    non_snake_case,
    dead_code,
    missing_docs,
    missing_debug_implementations,
    unreachable_pub,
    unsafe_op_in_unsafe_fn,
    clippy::all,
    clippy::undocumented_unsafe_blocks
)]
pub(crate) mod sys {
    use crate::verbs::ffi::sys::ibv_qp_type::Type as ibv_qp_type;
    use crate::verbs::ffi::sys::{
        ibv_ah_attr, ibv_comp_channel, ibv_context, ibv_cq, ibv_gid, ibv_pd, ibv_qp, ibv_qp_attr,
        ibv_srq,
    };
    include!(concat!(env!("OUT_DIR"), "/rdmacm_bindings.rs"));
}

const AF_INET: u16 = 2;
const AF_INET6: u16 = 10;

/// `struct pollfd`.
#[repr(C)]
struct PollFd {
    fd: c_int,
    events: i16,
    revents: i16,
}

extern "C" {
    /// From the C library: core has no `libc` dependency for one call.
    fn poll(fds: *mut PollFd, nfds: core::ffi::c_ulong, timeout: c_int) -> c_int;
}

/// Waits until `fd` is readable or `timeout_ms` passed (`poll(2)`). `Err(errno)` on failure
/// other than an interrupted wait, which counts as a wake-up.
pub(crate) fn wait_readable(fd: c_int, timeout_ms: c_int) -> Result<(), i32> {
    const POLLIN: i16 = 1;
    use crate::verb::errno::EINTR;
    let mut p = PollFd {
        fd,
        events: POLLIN,
        revents: 0,
    };
    // SAFETY: one valid pollfd, read and written only during the call.
    let rc = unsafe { poll(&mut p, 1, timeout_ms) };
    if rc < 0 && errno() != EINTR {
        return Err(errno());
    }
    Ok(())
}

/// `addr` as a C socket address (IPv4 or IPv6), in storage big enough for either.
pub(crate) fn to_sockaddr(addr: SocketAddr) -> sys::sockaddr_storage {
    // SAFETY: sockaddr_storage is plain C data for which all-zero is valid.
    let mut s: sys::sockaddr_storage = unsafe { core::mem::zeroed() };
    match addr {
        SocketAddr::V4(a) => {
            let sin = sys::sockaddr_in {
                sin_family: AF_INET,
                sin_port: a.port().to_be(),
                sin_addr: sys::in_addr {
                    s_addr: u32::from_ne_bytes(a.ip().octets()),
                },
                sin_zero: [0; 8],
            };
            // SAFETY: sockaddr_storage is larger than and aligned for sockaddr_in.
            unsafe { core::ptr::write((&raw mut s).cast::<sys::sockaddr_in>(), sin) };
        }
        SocketAddr::V6(a) => {
            let sin6 = sys::sockaddr_in6 {
                sin6_family: AF_INET6,
                sin6_port: a.port().to_be(),
                sin6_flowinfo: a.flowinfo().to_be(),
                sin6_addr: sys::in6_addr {
                    __in6_u: sys::in6_addr__bindgen_ty_1 {
                        __u6_addr8: a.ip().octets(),
                    },
                },
                sin6_scope_id: a.scope_id(),
            };
            // SAFETY: sockaddr_storage is larger than and aligned for sockaddr_in6.
            unsafe { core::ptr::write((&raw mut s).cast::<sys::sockaddr_in6>(), sin6) };
        }
    }
    s
}

/// The address a C socket address holds, if it is IPv4 or IPv6.
///
/// # Safety
/// `sa` is null or points to a socket address valid for its family's size (librdmacm's
/// address fields are `sockaddr_storage`-sized unions).
pub(crate) unsafe fn from_sockaddr(sa: *const sys::sockaddr) -> Option<SocketAddr> {
    if sa.is_null() {
        return None;
    }
    // SAFETY: the caller guarantees sa is valid for its family's size.
    unsafe {
        match (*sa).sa_family {
            AF_INET => {
                let sin = &*sa.cast::<sys::sockaddr_in>();
                let ip = Ipv4Addr::from(sin.sin_addr.s_addr.to_ne_bytes());
                Some(SocketAddr::V4(SocketAddrV4::new(
                    ip,
                    u16::from_be(sin.sin_port),
                )))
            }
            AF_INET6 => {
                let sin6 = &*sa.cast::<sys::sockaddr_in6>();
                let ip = Ipv6Addr::from(sin6.sin6_addr.__in6_u.__u6_addr8);
                Some(SocketAddr::V6(SocketAddrV6::new(
                    ip,
                    u16::from_be(sin6.sin6_port),
                    u32::from_be(sin6.sin6_flowinfo),
                    sin6.sin6_scope_id,
                )))
            }
            _ => None,
        }
    }
}

/// `ip` with port 0, as a socket address.
pub(crate) fn ip_sockaddr(ip: IpAddr) -> sys::sockaddr_storage {
    to_sockaddr(SocketAddr::new(ip, 0))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn socket_addresses_round_trip() {
        for a in [
            "192.168.77.1:7471".parse::<SocketAddr>().unwrap(),
            "[fe80::1]:18515".parse().unwrap(),
            "0.0.0.0:0".parse().unwrap(),
        ] {
            let s = to_sockaddr(a);
            // SAFETY: s is a sockaddr_storage we just filled.
            let back = unsafe { from_sockaddr((&raw const s).cast()) };
            assert_eq!(back, Some(a));
        }
        // SAFETY: null is allowed.
        assert_eq!(unsafe { from_sockaddr(core::ptr::null()) }, None);
    }
}
