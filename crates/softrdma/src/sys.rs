//! The few system calls std does not wrap: eventfd, ppoll, the IPv4
//! "don't fragment" socket option, and link MTU discovery. All `unsafe` FFI
//! of the UDP driver lives here, each block with its safety argument.

use std::io;
use std::net::{IpAddr, UdpSocket};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::time::Duration;

/// An eventfd: a counter file descriptor used to wake a sleeping thread
/// and as the pollable fd of completion channels.
#[derive(Debug)]
pub struct EventFd(OwnedFd);

impl EventFd {
    /// A non-blocking eventfd (or blocking, for fds applications read directly).
    pub fn new(nonblocking: bool) -> io::Result<Self> {
        let flags = libc::EFD_CLOEXEC | if nonblocking { libc::EFD_NONBLOCK } else { 0 };
        // SAFETY: eventfd has no pointer arguments; the result is checked.
        let fd = unsafe { libc::eventfd(0, flags) };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: fd is a fresh descriptor we exclusively own.
        Ok(EventFd(unsafe { OwnedFd::from_raw_fd(fd) }))
    }

    /// Adds one to the counter (wakes readers and pollers).
    pub fn signal(&self) {
        let one: u64 = 1;
        // SAFETY: writes 8 bytes from a valid u64 to our own fd.
        let _ = unsafe { libc::write(self.0.as_raw_fd(), (&one as *const u64).cast(), 8) };
    }

    /// Reads and clears the counter; 0 if it was zero (non-blocking fds) —
    /// blocks until non-zero for blocking fds.
    pub fn drain(&self) -> u64 {
        let mut v: u64 = 0;
        // SAFETY: reads at most 8 bytes into a valid u64 we own.
        let n = unsafe { libc::read(self.0.as_raw_fd(), (&mut v as *mut u64).cast(), 8) };
        if n == 8 {
            v
        } else {
            0
        }
    }
}

impl AsRawFd for EventFd {
    fn as_raw_fd(&self) -> RawFd {
        self.0.as_raw_fd()
    }
}

/// Waits until one of `fds` is readable or `timeout` passes (None = forever).
/// Returns the readable flags in order.
pub fn wait_readable<const N: usize>(fds: [RawFd; N], timeout: Option<Duration>) -> [bool; N] {
    let mut p = fds.map(|fd| libc::pollfd {
        fd,
        events: libc::POLLIN,
        revents: 0,
    });
    let ts = timeout.map(|d| libc::timespec {
        tv_sec: d.as_secs().min(i64::MAX as u64) as libc::time_t,
        tv_nsec: d.subsec_nanos() as libc::c_long,
    });
    let tsp = ts
        .as_ref()
        .map_or(std::ptr::null(), |t| t as *const libc::timespec);
    // SAFETY: `p` is a valid array of N pollfd for the duration of the call;
    // `tsp` is null or points to a live timespec; no signal mask is passed.
    let _ = unsafe { libc::ppoll(p.as_mut_ptr(), N as libc::nfds_t, tsp, std::ptr::null()) };
    p.map(|q| q.revents & (libc::POLLIN | libc::POLLERR | libc::POLLHUP) != 0)
}

/// Makes the kernel send IPv4 datagrams of this socket with DF set (and so,
/// on an unconnected socket, IP ID 0), as RoCE senders do.
pub fn set_dont_fragment(sock: &UdpSocket) -> io::Result<()> {
    let v: libc::c_int = libc::IP_PMTUDISC_DO;
    // SAFETY: passes a pointer to a live c_int and its size.
    let r = unsafe {
        libc::setsockopt(
            sock.as_raw_fd(),
            libc::IPPROTO_IP,
            libc::IP_MTU_DISCOVER,
            (&v as *const libc::c_int).cast(),
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        )
    };
    if r == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// Sets SO_RCVBUF/SO_SNDBUF (best effort: the kernel caps them).
pub fn set_buffers(sock: &UdpSocket, bytes: usize) {
    let v = bytes.min(i32::MAX as usize) as libc::c_int;
    // The plain options (capped at net.core.[rw]mem_max), then the FORCE
    // variants, which pass that cap when we may (CAP_NET_ADMIN) and fail
    // harmlessly otherwise. Not the other way round: each call replaces
    // the size, so a plain one after FORCE would undo it.
    for opt in [
        libc::SO_RCVBUF,
        libc::SO_SNDBUF,
        libc::SO_RCVBUFFORCE,
        libc::SO_SNDBUFFORCE,
    ] {
        // SAFETY: passes a pointer to a live c_int and its size.
        let _ = unsafe {
            libc::setsockopt(
                sock.as_raw_fd(),
                libc::SOL_SOCKET,
                opt,
                (&v as *const libc::c_int).cast(),
                std::mem::size_of::<libc::c_int>() as libc::socklen_t,
            )
        };
    }
}

/// The name of the network interface that holds `ip`, if any.
pub fn interface_of(ip: IpAddr) -> Option<String> {
    let mut head: *mut libc::ifaddrs = std::ptr::null_mut();
    // SAFETY: getifaddrs writes a list head we free below with freeifaddrs.
    if unsafe { libc::getifaddrs(&mut head) } != 0 {
        return None;
    }
    let mut found = None;
    let mut cur = head;
    while !cur.is_null() {
        // SAFETY: `cur` is a node of the list getifaddrs returned, alive until freeifaddrs.
        let ifa = unsafe { &*cur };
        if !ifa.ifa_addr.is_null() {
            // SAFETY: ifa_addr points to a sockaddr whose family says its real type.
            let fam = i32::from(unsafe { (*ifa.ifa_addr).sa_family });
            let addr = match fam {
                libc::AF_INET => {
                    // SAFETY: family AF_INET means the sockaddr is a sockaddr_in.
                    let sin = unsafe { &*(ifa.ifa_addr as *const libc::sockaddr_in) };
                    Some(IpAddr::from(
                        u32::from_be(sin.sin_addr.s_addr).to_be_bytes(),
                    ))
                }
                libc::AF_INET6 => {
                    // SAFETY: family AF_INET6 means the sockaddr is a sockaddr_in6.
                    let sin6 = unsafe { &*(ifa.ifa_addr as *const libc::sockaddr_in6) };
                    Some(IpAddr::from(sin6.sin6_addr.s6_addr))
                }
                _ => None,
            };
            if addr == Some(ip) {
                // SAFETY: ifa_name is a NUL-terminated string owned by the list.
                let name = unsafe { std::ffi::CStr::from_ptr(ifa.ifa_name) };
                found = Some(name.to_string_lossy().into_owned());
                break;
            }
        }
        cur = ifa.ifa_next;
    }
    // SAFETY: `head` came from getifaddrs and is freed exactly once.
    unsafe { libc::freeifaddrs(head) };
    found
}

/// The MTU of the link that holds `ip`; 65536 for loopback addresses not
/// configured on any interface (127.0.0.0/8 beyond 127.0.0.1).
pub fn link_mtu(ip: IpAddr) -> u32 {
    if let Some(name) = interface_of(ip) {
        if let Ok(s) = std::fs::read_to_string(format!("/sys/class/net/{name}/mtu")) {
            if let Ok(m) = s.trim().parse() {
                return m;
            }
        }
    }
    if ip.is_loopback() {
        65536
    } else {
        1500
    }
}

fn to_sockaddr(a: std::net::SocketAddr) -> (libc::sockaddr_storage, libc::socklen_t) {
    // SAFETY: sockaddr_storage is plain old data; all-zero is a valid value.
    let mut ss: libc::sockaddr_storage = unsafe { std::mem::zeroed() };
    let len = match a {
        std::net::SocketAddr::V4(v4) => {
            // SAFETY: sockaddr_storage is large and aligned enough for sockaddr_in.
            let sin = unsafe {
                &mut *(&mut ss as *mut libc::sockaddr_storage).cast::<libc::sockaddr_in>()
            };
            sin.sin_family = libc::AF_INET as libc::sa_family_t;
            sin.sin_port = v4.port().to_be();
            sin.sin_addr = libc::in_addr {
                s_addr: u32::from_ne_bytes(v4.ip().octets()),
            };
            std::mem::size_of::<libc::sockaddr_in>()
        }
        std::net::SocketAddr::V6(v6) => {
            // SAFETY: sockaddr_storage is large and aligned enough for sockaddr_in6.
            let sin6 = unsafe {
                &mut *(&mut ss as *mut libc::sockaddr_storage).cast::<libc::sockaddr_in6>()
            };
            sin6.sin6_family = libc::AF_INET6 as libc::sa_family_t;
            sin6.sin6_port = v6.port().to_be();
            sin6.sin6_addr = libc::in6_addr {
                s6_addr: v6.ip().octets(),
            };
            sin6.sin6_flowinfo = v6.flowinfo();
            sin6.sin6_scope_id = v6.scope_id();
            std::mem::size_of::<libc::sockaddr_in6>()
        }
    };
    (ss, len as libc::socklen_t)
}

fn from_sockaddr(ss: &libc::sockaddr_storage) -> Option<std::net::SocketAddr> {
    match i32::from(ss.ss_family) {
        libc::AF_INET => {
            // SAFETY: the family says the storage holds a sockaddr_in.
            let sin =
                unsafe { &*(ss as *const libc::sockaddr_storage).cast::<libc::sockaddr_in>() };
            let ip = std::net::Ipv4Addr::from(sin.sin_addr.s_addr.to_ne_bytes());
            Some(std::net::SocketAddr::new(
                ip.into(),
                u16::from_be(sin.sin_port),
            ))
        }
        libc::AF_INET6 => {
            // SAFETY: the family says the storage holds a sockaddr_in6.
            let sin6 =
                unsafe { &*(ss as *const libc::sockaddr_storage).cast::<libc::sockaddr_in6>() };
            let ip = std::net::Ipv6Addr::from(sin6.sin6_addr.s6_addr);
            Some(std::net::SocketAddr::new(
                ip.into(),
                u16::from_be(sin6.sin6_port),
            ))
        }
        _ => None,
    }
}

/// Buffers for receiving many datagrams with one `recvmmsg`.
pub struct RecvBatch {
    data: Vec<u8>,
    slot: usize,
    addrs: Vec<libc::sockaddr_storage>,
    lens: Vec<usize>,
    iov: Vec<libc::iovec>,
    hdrs: Vec<libc::mmsghdr>,
    n: usize,
}

// SAFETY: the raw pointers in `iov` and `hdrs` point into the batch's own
// heap buffers (which never move: they are never resized), so the batch may
// move between threads with them.
unsafe impl Send for RecvBatch {}

impl std::fmt::Debug for RecvBatch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "RecvBatch({} of {})", self.n, self.lens.len())
    }
}

impl RecvBatch {
    /// Room for `count` datagrams of up to `slot` bytes.
    pub fn new(count: usize, slot: usize) -> Self {
        RecvBatch {
            data: vec![0; count * slot],
            slot,
            // SAFETY: all-zero sockaddr_storage is valid plain data.
            addrs: vec![unsafe { std::mem::zeroed() }; count],
            lens: vec![0; count],
            iov: Vec::new(),
            hdrs: Vec::new(),
            n: 0,
        }
    }

    /// Receives what is waiting (non-blocking); returns how many datagrams.
    pub fn recv(&mut self, sock: &UdpSocket) -> usize {
        let count = self.lens.len();
        if self.hdrs.len() != count {
            self.build(count);
        }
        for h in &mut self.hdrs {
            // The kernel shrinks msg_namelen to the address it wrote.
            h.msg_hdr.msg_namelen =
                std::mem::size_of::<libc::sockaddr_storage>() as libc::socklen_t;
        }
        // SAFETY: hdrs, iov, addrs and data are the batch's own buffers, set
        // up by `build` for `count` slots; MSG_DONTWAIT makes it non-blocking.
        let r = unsafe {
            libc::recvmmsg(
                sock.as_raw_fd(),
                self.hdrs.as_mut_ptr(),
                count as libc::c_uint,
                libc::MSG_DONTWAIT,
                std::ptr::null_mut(),
            )
        };
        self.n = if r > 0 { r as usize } else { 0 };
        for i in 0..self.n {
            self.lens[i] = self.hdrs[i].msg_len as usize;
        }
        self.n
    }

    /// Points the message headers at the batch's buffers (once).
    fn build(&mut self, count: usize) {
        self.iov = (0..count)
            .map(|i| libc::iovec {
                // SAFETY: slot i lies inside `data` (count * slot bytes).
                iov_base: unsafe { self.data.as_mut_ptr().add(i * self.slot) }.cast(),
                iov_len: self.slot,
            })
            .collect();
        let iov = self.iov.as_mut_ptr();
        let addrs = self.addrs.as_mut_ptr();
        self.hdrs = (0..count)
            .map(|i| {
                // SAFETY: all-zero msghdr is valid; we fill the fields we use.
                let mut h: libc::mmsghdr = unsafe { std::mem::zeroed() };
                // SAFETY: i < count = len of `addrs` and `iov`.
                h.msg_hdr.msg_name = unsafe { addrs.add(i) }.cast();
                h.msg_hdr.msg_namelen =
                    std::mem::size_of::<libc::sockaddr_storage>() as libc::socklen_t;
                // SAFETY: as above.
                h.msg_hdr.msg_iov = unsafe { iov.add(i) };
                h.msg_hdr.msg_iovlen = 1;
                h
            })
            .collect();
    }

    /// Datagram `i` of the last `recv`: its sender and bytes.
    pub fn get(&self, i: usize) -> Option<(std::net::SocketAddr, &[u8])> {
        if i >= self.n {
            return None;
        }
        let src = from_sockaddr(&self.addrs[i])?;
        Some((
            src,
            &self.data[i * self.slot..i * self.slot + self.lens[i].min(self.slot)],
        ))
    }
}

/// Sends datagrams with one `sendmmsg` (blocking until the kernel took them
/// or failed). Returns how many were sent.
pub fn send_batch(
    sock: &UdpSocket,
    packets: &[(std::net::SocketAddr, &[u8])],
) -> io::Result<usize> {
    if packets.is_empty() {
        return Ok(0);
    }
    let mut addrs: Vec<(libc::sockaddr_storage, libc::socklen_t)> =
        packets.iter().map(|(a, _)| to_sockaddr(*a)).collect();
    let mut iov: Vec<libc::iovec> = packets
        .iter()
        .map(|(_, d)| libc::iovec {
            iov_base: d.as_ptr() as *mut libc::c_void,
            iov_len: d.len(),
        })
        .collect();
    let mut hdrs: Vec<libc::mmsghdr> = (0..packets.len())
        .map(|i| {
            // SAFETY: all-zero msghdr is valid; we fill the fields we use.
            let mut h: libc::mmsghdr = unsafe { std::mem::zeroed() };
            h.msg_hdr.msg_name = (&mut addrs[i].0 as *mut libc::sockaddr_storage).cast();
            h.msg_hdr.msg_namelen = addrs[i].1;
            h.msg_hdr.msg_iov = &mut iov[i];
            h.msg_hdr.msg_iovlen = 1;
            h
        })
        .collect();
    let mut sent = 0;
    while sent < packets.len() {
        // SAFETY: the headers describe live buffers and addresses for the call's duration.
        let r = unsafe {
            libc::sendmmsg(
                sock.as_raw_fd(),
                hdrs[sent..].as_mut_ptr(),
                (packets.len() - sent) as libc::c_uint,
                0,
            )
        };
        if r < 0 {
            let e = io::Error::last_os_error();
            if e.kind() == io::ErrorKind::WouldBlock {
                wait_writable(sock.as_raw_fd());
                continue;
            }
            if sent == 0 {
                return Err(e);
            }
            break;
        }
        sent += r as usize;
    }
    Ok(sent)
}

fn wait_writable(fd: RawFd) {
    let mut p = [libc::pollfd {
        fd,
        events: libc::POLLOUT,
        revents: 0,
    }];
    // SAFETY: one valid pollfd; 10 ms bound.
    let _ = unsafe { libc::poll(p.as_mut_ptr(), 1, 10) };
}

impl EventFd {
    /// Wraps an eventfd received from another process.
    pub fn from_owned(fd: OwnedFd) -> Self {
        EventFd(fd)
    }
}
