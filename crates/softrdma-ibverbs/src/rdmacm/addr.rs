//! Socket addresses at the C boundary, and `rdma_getaddrinfo`'s results.

use std::ffi::{c_char, c_int, CStr};
use std::mem::size_of;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};

use super::abi::*;

/// A `sockaddr` (AF_INET or AF_INET6) → SocketAddr; None for NULL or
/// another family.
///
/// # Safety
/// `sa` is NULL or points at a sockaddr of its family's size.
pub unsafe fn from_c(sa: *const libc::sockaddr) -> Option<SocketAddr> {
    // SAFETY: per the contract.
    let family = c_int::from(unsafe { sa.as_ref()?.sa_family });
    match family {
        libc::AF_INET => {
            // SAFETY: an AF_INET sockaddr is a sockaddr_in.
            let sin = unsafe { &*sa.cast::<libc::sockaddr_in>() };
            let ip = Ipv4Addr::from(u32::from_be(sin.sin_addr.s_addr));
            Some(SocketAddr::new(ip.into(), u16::from_be(sin.sin_port)))
        }
        libc::AF_INET6 => {
            // SAFETY: an AF_INET6 sockaddr is a sockaddr_in6.
            let sin6 = unsafe { &*sa.cast::<libc::sockaddr_in6>() };
            let ip = Ipv6Addr::from(sin6.sin6_addr.s6_addr);
            Some(SocketAddr::new(ip.into(), u16::from_be(sin6.sin6_port)))
        }
        _ => None,
    }
}

/// SocketAddr → `sockaddr_storage` (and its length).
pub fn to_c(a: SocketAddr) -> (libc::sockaddr_storage, libc::socklen_t) {
    // SAFETY: all-zero is a valid sockaddr_storage.
    let mut ss: libc::sockaddr_storage = unsafe { std::mem::zeroed() };
    let len = match a {
        SocketAddr::V4(v4) => {
            let sin = libc::sockaddr_in {
                sin_family: libc::AF_INET as libc::sa_family_t,
                sin_port: v4.port().to_be(),
                sin_addr: libc::in_addr {
                    s_addr: u32::from(*v4.ip()).to_be(),
                },
                sin_zero: [0; 8],
            };
            // SAFETY: sockaddr_storage is larger than and aligned for
            // sockaddr_in.
            unsafe { std::ptr::write((&mut ss as *mut libc::sockaddr_storage).cast(), sin) };
            size_of::<libc::sockaddr_in>()
        }
        SocketAddr::V6(v6) => {
            let sin6 = libc::sockaddr_in6 {
                sin6_family: libc::AF_INET6 as libc::sa_family_t,
                sin6_port: v6.port().to_be(),
                sin6_flowinfo: 0,
                sin6_addr: libc::in6_addr {
                    s6_addr: v6.ip().octets(),
                },
                sin6_scope_id: v6.scope_id(),
            };
            // SAFETY: as above, for sockaddr_in6.
            unsafe { std::ptr::write((&mut ss as *mut libc::sockaddr_storage).cast(), sin6) };
            size_of::<libc::sockaddr_in6>()
        }
    };
    (ss, len as libc::socklen_t)
}

/// The GID of an IP address (IPv4-mapped for IPv4), as RoCEv2 names it.
pub fn gid(ip: IpAddr) -> crate::abi::ibv_gid {
    let v6 = match ip {
        IpAddr::V4(v4) => v4.to_ipv6_mapped(),
        IpAddr::V6(v6) => v6,
    };
    crate::abi::ibv_gid::from_raw(v6.octets())
}

/// Sets the route's source and/or destination (and their GIDs).
pub fn set_route(r: &mut rdma_route, src: Option<SocketAddr>, dst: Option<SocketAddr>) {
    if let Some(s) = src {
        r.addr.src_storage = to_c(s).0;
        r.addr.ibaddr.sgid = gid(s.ip());
    }
    if let Some(d) = dst {
        r.addr.dst_storage = to_c(d).0;
        r.addr.ibaddr.dgid = gid(d.ip());
    }
    r.addr.ibaddr.pkey = 0xFFFFu16.to_be();
}

/// The route's source or destination.
pub fn route_addr(r: &rdma_route, dst: bool) -> Option<SocketAddr> {
    let ss = if dst {
        &r.addr.dst_storage
    } else {
        &r.addr.src_storage
    };
    // SAFETY: a sockaddr_storage is readable as any sockaddr it holds.
    unsafe { from_c((ss as *const libc::sockaddr_storage).cast()) }
}

/// Resolves `node` (NULL: the wildcard, or loopback when not passive)
/// and `service` (a port number or a service name) to one address,
/// through the system's resolver.
///
/// # Safety
/// `node` and `service` are NULL or NUL-terminated strings.
pub unsafe fn resolve(
    node: *const c_char,
    service: *const c_char,
    family: c_int,
    passive: bool,
) -> Result<SocketAddr, c_int> {
    // SAFETY: per the contract.
    let port = match unsafe { service.as_ref() } {
        None => 0,
        // SAFETY: per the contract, NUL-terminated.
        Some(_) => match unsafe { CStr::from_ptr(service) }.to_str() {
            Ok(s) => s.parse::<u16>().or_else(|_| service_port(s))?,
            Err(_) => return Err(libc::EINVAL),
        },
    };
    if node.is_null() {
        let ip: IpAddr = match (family == libc::AF_INET6, passive) {
            (false, true) => Ipv4Addr::UNSPECIFIED.into(),
            (false, false) => Ipv4Addr::LOCALHOST.into(),
            (true, true) => Ipv6Addr::UNSPECIFIED.into(),
            (true, false) => Ipv6Addr::LOCALHOST.into(),
        };
        return Ok(SocketAddr::new(ip, port));
    }
    // SAFETY: per the contract.
    let host = unsafe { CStr::from_ptr(node) }
        .to_str()
        .map_err(|_| libc::EINVAL)?;
    if let Ok(ip) = host.parse::<IpAddr>() {
        return Ok(SocketAddr::new(ip, port));
    }
    use std::net::ToSocketAddrs;
    let found = (host, port)
        .to_socket_addrs()
        .map_err(|_| libc::EADDRNOTAVAIL)?
        .find(|a| family != libc::AF_INET6 || a.is_ipv6());
    found.ok_or(libc::EADDRNOTAVAIL)
}

fn service_port(name: &str) -> Result<u16, c_int> {
    let c = std::ffi::CString::new(name).map_err(|_| libc::EINVAL)?;
    // SAFETY: NUL-terminated name; getservbyname returns NULL or a static
    // entry read at once.
    let ent = unsafe { libc::getservbyname(c.as_ptr(), std::ptr::null()) };
    // SAFETY: as above.
    match unsafe { ent.as_ref() } {
        Some(e) => Ok(u16::from_be(e.s_port as u16)),
        None => Err(libc::EINVAL),
    }
}

/// A calloc'ed copy of `a` (freed by `free_info`).
fn c_sockaddr(a: SocketAddr) -> Result<(*mut libc::sockaddr, libc::socklen_t), c_int> {
    let (ss, len) = to_c(a);
    // SAFETY: calloc; checked for NULL.
    let p = unsafe { libc::calloc(1, size_of::<libc::sockaddr_storage>()) };
    if p.is_null() {
        return Err(libc::ENOMEM);
    }
    // SAFETY: a fresh allocation of a sockaddr_storage.
    unsafe { std::ptr::write(p.cast::<libc::sockaddr_storage>(), ss) };
    Ok((p.cast(), len))
}

/// One `rdma_addrinfo`, calloc'ed, with its addresses.
pub fn new_info(
    flags: c_int,
    qp_type: c_int,
    port_space: c_int,
    src: Option<SocketAddr>,
    dst: Option<SocketAddr>,
) -> Result<*mut rdma_addrinfo, c_int> {
    // SAFETY: calloc; checked for NULL.
    let p = unsafe { libc::calloc(1, size_of::<rdma_addrinfo>()) }.cast::<rdma_addrinfo>();
    if p.is_null() {
        return Err(libc::ENOMEM);
    }
    let family = match src.or(dst) {
        Some(SocketAddr::V6(_)) => libc::AF_INET6,
        _ => libc::AF_INET,
    };
    // SAFETY: a fresh, zeroed rdma_addrinfo.
    let info = unsafe { &mut *p };
    info.ai_flags = flags;
    info.ai_family = family;
    info.ai_qp_type = qp_type;
    info.ai_port_space = port_space;
    let fill = |a: Option<SocketAddr>| a.map(c_sockaddr).transpose();
    match (fill(src), fill(dst)) {
        (Ok(s), Ok(d)) => {
            if let Some((sp, sl)) = s {
                info.ai_src_addr = sp;
                info.ai_src_len = sl;
            }
            if let Some((dp, dl)) = d {
                info.ai_dst_addr = dp;
                info.ai_dst_len = dl;
            }
            Ok(p)
        }
        (s, d) => {
            for (sp, _) in [s.ok().flatten(), d.ok().flatten()].into_iter().flatten() {
                // SAFETY: allocated just above by calloc.
                unsafe { libc::free(sp.cast()) };
            }
            // SAFETY: allocated above by calloc.
            unsafe { libc::free(p.cast()) };
            Err(libc::ENOMEM)
        }
    }
}

/// Frees a list made by [`new_info`].
///
/// # Safety
/// `p` is NULL or a list of this module not freed yet.
pub unsafe fn free_info(mut p: *mut rdma_addrinfo) {
    while !p.is_null() {
        // SAFETY: per the contract, a live calloc'ed entry whose pointer
        // fields are NULL or calloc'ed.
        unsafe {
            let next = (*p).ai_next;
            libc::free((*p).ai_src_addr.cast());
            libc::free((*p).ai_dst_addr.cast());
            libc::free((*p).ai_src_canonname.cast());
            libc::free((*p).ai_dst_canonname.cast());
            libc::free((*p).ai_route);
            libc::free((*p).ai_connect);
            libc::free(p.cast());
            p = next;
        }
    }
}
