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

    /// Reads and clears the counter of an fd that applications also hold
    /// (a completion channel's, the CM's); 0 if it was zero. Never blocks,
    /// though the application may have made the fd blocking (`fcntl` acts
    /// on the shared file description, and ibverbs programs switch their
    /// channel fd between modes): there a read of a zero counter would wait
    /// for good, under the channel's event-queue lock. Costs a `poll` more
    /// than [`EventFd::drain`].
    pub fn drain_shared(&self) -> u64 {
        if !wait_readable([self.0.as_raw_fd()], Some(Duration::ZERO))[0] {
            return 0;
        }
        self.drain()
    }

    /// Reads and clears the counter of an fd only softrdma holds (always
    /// non-blocking: made with `new(true)`); 0 if it was zero.
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
    ppoll(&mut p, timeout);
    p.map(|q| q.revents & (libc::POLLIN | libc::POLLERR | libc::POLLHUP) != 0)
}

/// `ppoll` on `p` (no signal mask) until one is ready or `timeout` passes.
fn ppoll(p: &mut [libc::pollfd], timeout: Option<Duration>) {
    let ts = timeout.map(|d| libc::timespec {
        tv_sec: d.as_secs().min(i64::MAX as u64) as libc::time_t,
        tv_nsec: d.subsec_nanos() as libc::c_long,
    });
    let tsp = ts
        .as_ref()
        .map_or(std::ptr::null(), |t| t as *const libc::timespec);
    // SAFETY: `p` is a valid array of `p.len()` pollfd for the duration of
    // the call; `tsp` is null or points to a live timespec; no signal mask.
    let _ = unsafe {
        libc::ppoll(
            p.as_mut_ptr(),
            p.len() as libc::nfds_t,
            tsp,
            std::ptr::null(),
        )
    };
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

/// `SOL_UDP` option: segment a send into datagrams of this size (UDP GSO).
const UDP_SEGMENT: libc::c_int = 103;
/// `SOL_UDP` option and cmsg: receive coalesced datagrams (UDP GRO).
const UDP_GRO: libc::c_int = 104;
/// Most segments the kernel takes in one GSO send (`UDP_MAX_SEGMENTS`).
pub const GSO_MAX_SEGMENTS: usize = 64;
/// Most UDP payload bytes in one GSO send: an IPv4 packet's 65535 bytes
/// minus its 20-byte header and the 8-byte UDP header.
pub const GSO_MAX_BYTES: usize = 65535 - 20 - 8;
/// Room for one `int` control message (the UDP_GRO segment size), as u64s
/// so that the buffer is aligned for `cmsghdr`.
const CMSG_WORDS: usize = 8;

fn set_int_opt(sock: &UdpSocket, level: libc::c_int, opt: libc::c_int, v: libc::c_int) -> bool {
    // SAFETY: passes a pointer to a live c_int and its size.
    let r = unsafe {
        libc::setsockopt(
            sock.as_raw_fd(),
            level,
            opt,
            (&v as *const libc::c_int).cast(),
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        )
    };
    r == 0
}

/// Asks the kernel to hand this socket coalesced datagrams (UDP GRO): one
/// receive may then hold several datagrams of one flow, each `gso_size`
/// bytes but the last, with a UDP_GRO control message giving that size.
/// False when the kernel does not know the option (before 5.0).
pub fn enable_gro(sock: &UdpSocket) -> bool {
    set_int_opt(sock, libc::SOL_UDP, UDP_GRO, 1)
}

/// Asks the kernel for each received datagram's TOS byte (IPv4) or
/// traffic class (IPv6) as a control message: its two low bits are the
/// ECN codepoint ([`RecvBatch::ecn`]). False when refused.
pub fn enable_recv_tos(sock: &UdpSocket, v6: bool) -> bool {
    if v6 {
        // An IPv6 socket may also receive IPv4-mapped traffic.
        let _ = set_int_opt(sock, libc::IPPROTO_IP, libc::IP_RECVTOS, 1);
        set_int_opt(sock, libc::IPPROTO_IPV6, libc::IPV6_RECVTCLASS, 1)
    } else {
        set_int_opt(sock, libc::IPPROTO_IP, libc::IP_RECVTOS, 1)
    }
}

/// Sets the TOS byte (IPv4) or traffic class (IPv6) of what `sock` sends:
/// the ECN codepoint of its packets is its two low bits.
pub fn set_tos(sock: &UdpSocket, v6: bool, tos: u8) -> bool {
    if v6 {
        set_int_opt(sock, libc::IPPROTO_IPV6, libc::IPV6_TCLASS, tos.into())
    } else {
        set_int_opt(sock, libc::IPPROTO_IP, libc::IP_TOS, tos.into())
    }
}

/// True when the kernel knows UDP GSO (`UDP_SEGMENT`, Linux 4.18). Setting
/// the socket-wide default segment size to 0 (no segmentation) changes
/// nothing else; sends then ask for GSO per message with a control message.
/// A device may still refuse GSO at send time (EIO): see [`send_batch`].
pub fn gso_available(sock: &UdpSocket) -> bool {
    set_int_opt(sock, libc::SOL_UDP, UDP_SEGMENT, 0)
}

/// Bytes one `recvmmsg` should bring in at most, roughly: the kernel writes
/// them all before the first is read back (for its ICRC and the copy into
/// the region), so a batch of 32 full GRO buffers (2 MiB) goes cold first;
/// 4 buffers measured faster than 8, 16 or 32.
const RX_BYTES: usize = 256 << 10;
/// Fewest buffers asked for in one `recvmmsg`.
const RX_MIN: usize = 4;
/// Most datagrams in a buffer that a single read may end on: a ping-pong's
/// message and the ACK that rides with it. More is a burst, where the next
/// read follows at once.
const SINGLE_SEGS: usize = 2;
/// Empty reads in a row after which reads go single. A stream's reader
/// (a bandwidth test's target, woken by the socket) finds it empty once
/// before each sleep, and must then read a batch again; a ping-pong's
/// poller finds it empty many times per message.
const SINGLE_AFTER_EMPTY: u32 = 2;

/// Buffers for receiving many datagrams with one `recvmmsg`.
pub struct RecvBatch {
    data: Vec<u8>,
    slot: usize,
    /// Buffers to ask for next time: all of them for single datagrams,
    /// fewer when GRO fills them (see [`RX_BYTES`]).
    want: usize,
    /// Buffers asked for in the last `recv`.
    asked: usize,
    /// Whether the next `recv` reads one buffer with `recvmsg`: latency-bound
    /// traffic (the socket was found empty again and again) pays for no
    /// `recvmmsg`, which costs more than `recvmsg` when empty and tries a
    /// second read after the first datagram.
    single: bool,
    /// Empty reads in a row.
    empty_reads: u32,
    /// Whether more may be waiting after the last `recv` (see [`Self::full`]).
    more: bool,
    addrs: Vec<libc::sockaddr_storage>,
    lens: Vec<usize>,
    /// Segment size of each received buffer (its length when not coalesced).
    segs: Vec<usize>,
    /// TOS byte or traffic class of each received buffer (0 when absent).
    tos: Vec<u8>,
    ctrl: Vec<[u64; CMSG_WORDS]>,
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
    /// Room for `count` datagrams (or GRO-coalesced runs of datagrams) of up
    /// to `slot` bytes.
    pub fn new(count: usize, slot: usize) -> Self {
        RecvBatch {
            data: vec![0; count * slot],
            slot,
            want: count,
            asked: count,
            single: true,
            empty_reads: SINGLE_AFTER_EMPTY,
            more: false,
            // SAFETY: all-zero sockaddr_storage is valid plain data.
            addrs: vec![unsafe { std::mem::zeroed() }; count],
            lens: vec![0; count],
            segs: vec![0; count],
            tos: vec![0; count],
            ctrl: vec![[0; CMSG_WORDS]; count],
            iov: Vec::new(),
            hdrs: Vec::new(),
            n: 0,
        }
    }

    /// Receives what is waiting (non-blocking); returns how many buffers
    /// (each one datagram, or several coalesced by GRO: see [`Self::get`]).
    pub fn recv(&mut self, sock: &UdpSocket) -> usize {
        let count = self.lens.len();
        if self.hdrs.len() != count {
            self.build(count);
        }
        let want = if self.single {
            1
        } else {
            self.want.clamp(1, count)
        };
        for h in &mut self.hdrs[..want] {
            // The kernel shrinks msg_namelen and msg_controllen to what it wrote.
            h.msg_hdr.msg_namelen =
                std::mem::size_of::<libc::sockaddr_storage>() as libc::socklen_t;
            h.msg_hdr.msg_controllen = std::mem::size_of::<[u64; CMSG_WORDS]>() as _;
        }
        self.asked = want;
        let r = if self.single {
            // SAFETY: hdrs[0] points at the batch's own first buffer,
            // address and control slot (set up by `build`); MSG_DONTWAIT
            // makes it non-blocking.
            let r = unsafe {
                libc::recvmsg(
                    sock.as_raw_fd(),
                    &mut self.hdrs[0].msg_hdr,
                    libc::MSG_DONTWAIT,
                )
            };
            if r >= 0 {
                self.hdrs[0].msg_len = r as libc::c_uint;
                1
            } else {
                0
            }
        } else {
            // SAFETY: hdrs, iov, addrs, ctrl and data are the batch's own
            // buffers, set up by `build` for `count` slots (want <= count);
            // MSG_DONTWAIT makes it non-blocking.
            let r = unsafe {
                libc::recvmmsg(
                    sock.as_raw_fd(),
                    self.hdrs.as_mut_ptr(),
                    want as libc::c_uint,
                    libc::MSG_DONTWAIT,
                    std::ptr::null_mut(),
                )
            };
            if r > 0 {
                (r as usize).min(want)
            } else {
                0
            }
        };
        self.n = r;
        let mut largest = 0;
        let mut most_segs = 0;
        for i in 0..self.n {
            let len = (self.hdrs[i].msg_len as usize).min(self.slot);
            self.lens[i] = len;
            largest = largest.max(len);
            self.segs[i] = match gro_segment_size(&self.hdrs[i].msg_hdr) {
                Some(s) if s > 0 && s < len => s,
                _ => len,
            };
            most_segs = most_segs.max(len.div_ceil(self.segs[i].max(1)));
            self.tos[i] = tos_of(&self.hdrs[i].msg_hdr).unwrap_or(0);
        }
        if self.n > 0 {
            self.want = (RX_BYTES / largest.max(1)).clamp(RX_MIN.min(count), count);
        }
        // A datagram after a single read may be the start of a burst: the
        // next read takes a batch. A single read of a small buffer does not
        // say more is waiting: reading again at once would put a system
        // call between a ping-pong's message and its handling (the next
        // progress reads a batch anyway).
        let small = self.n == 1 && most_segs <= SINGLE_SEGS;
        self.more = self.n == self.asked && !(self.single && small);
        self.empty_reads = if self.n == 0 {
            self.empty_reads.saturating_add(1)
        } else {
            0
        };
        self.single = self.empty_reads >= SINGLE_AFTER_EMPTY;
        self.n
    }

    /// Whether the last `recv` filled every buffer it asked for (more may
    /// be waiting).
    pub fn full(&self) -> bool {
        self.n > 0 && self.more
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
        let ctrl = self.ctrl.as_mut_ptr();
        self.hdrs = (0..count)
            .map(|i| {
                // SAFETY: all-zero msghdr is valid; we fill the fields we use.
                let mut h: libc::mmsghdr = unsafe { std::mem::zeroed() };
                // SAFETY: i < count = len of `addrs`, `iov` and `ctrl`.
                h.msg_hdr.msg_name = unsafe { addrs.add(i) }.cast();
                h.msg_hdr.msg_namelen =
                    std::mem::size_of::<libc::sockaddr_storage>() as libc::socklen_t;
                // SAFETY: as above.
                h.msg_hdr.msg_iov = unsafe { iov.add(i) };
                h.msg_hdr.msg_iovlen = 1;
                // SAFETY: as above.
                h.msg_hdr.msg_control = unsafe { ctrl.add(i) }.cast();
                h.msg_hdr.msg_controllen = std::mem::size_of::<[u64; CMSG_WORDS]>() as _;
                h
            })
            .collect();
    }

    /// Buffers the last `recv` filled.
    #[allow(clippy::len_without_is_empty)]
    pub fn len(&self) -> usize {
        self.n
    }

    /// The ECN codepoint buffer `i` of the last `recv` arrived with (every
    /// datagram GRO coalesced into one buffer carried the same).
    pub fn ecn(&self, i: usize) -> softrdma_wire::Ecn {
        softrdma_wire::Ecn::from_tos(self.tos.get(i).copied().unwrap_or(0))
    }

    /// Buffer `i` of the last `recv`: its sender, its bytes, and the size
    /// of the datagrams in it (the last may be shorter; equal to the
    /// length for a single datagram). Use [`segments`] to split it.
    pub fn get(&self, i: usize) -> Option<(std::net::SocketAddr, &[u8], usize)> {
        if i >= self.n {
            return None;
        }
        let src = from_sockaddr(&self.addrs[i])?;
        let at = i * self.slot;
        let data = &self.data[at..at + self.lens[i]];
        Some((src, data, self.segs[i]))
    }
}

/// The datagrams of a received buffer of `seg`-byte datagrams (the last
/// may be shorter). A `seg` of 0 is taken as the whole buffer.
pub fn segments(data: &[u8], seg: usize) -> std::slice::Chunks<'_, u8> {
    data.chunks(if seg == 0 { data.len().max(1) } else { seg })
}

/// The UDP_GRO segment size in a received message's control data, if any.
// msg_controllen and cmsg_len are usize with glibc, u32 with musl.
#[allow(clippy::unnecessary_cast)]
fn gro_segment_size(h: &libc::msghdr) -> Option<usize> {
    if h.msg_control.is_null() || (h.msg_controllen as usize) < std::mem::size_of::<libc::cmsghdr>()
    {
        return None;
    }
    // SAFETY: msg_control/msg_controllen describe our own control buffer
    // (an aligned [u64; CMSG_WORDS]) as the kernel filled it; the CMSG_*
    // macros stay within msg_controllen.
    unsafe {
        let mut c = libc::CMSG_FIRSTHDR(h);
        while !c.is_null() {
            let cm = &*c;
            if cm.cmsg_level == libc::SOL_UDP
                && cm.cmsg_type == UDP_GRO
                && cm.cmsg_len as usize
                    >= libc::CMSG_LEN(std::mem::size_of::<libc::c_int>() as u32) as usize
            {
                let v = std::ptr::read_unaligned(libc::CMSG_DATA(c).cast::<libc::c_int>());
                return usize::try_from(v).ok();
            }
            c = libc::CMSG_NXTHDR(h, c);
        }
    }
    None
}

/// The TOS byte (IP_TOS) or traffic class (IPV6_TCLASS) in a received
/// message's control data, if any.
// msg_controllen and cmsg_len are usize with glibc, u32 with musl.
#[allow(clippy::unnecessary_cast)]
fn tos_of(h: &libc::msghdr) -> Option<u8> {
    if h.msg_control.is_null() || (h.msg_controllen as usize) < std::mem::size_of::<libc::cmsghdr>()
    {
        return None;
    }
    // SAFETY: as in `gro_segment_size`: our own control buffer as the kernel
    // filled it, walked with the CMSG_* macros within msg_controllen; each
    // read is checked against the message's length first.
    unsafe {
        let mut c = libc::CMSG_FIRSTHDR(h);
        while !c.is_null() {
            let cm = &*c;
            let room = cm.cmsg_len as usize;
            if cm.cmsg_level == libc::IPPROTO_IP
                && cm.cmsg_type == libc::IP_TOS
                && room >= libc::CMSG_LEN(1) as usize
            {
                return Some(*libc::CMSG_DATA(c));
            }
            if cm.cmsg_level == libc::IPPROTO_IPV6
                && cm.cmsg_type == libc::IPV6_TCLASS
                && room >= libc::CMSG_LEN(std::mem::size_of::<libc::c_int>() as u32) as usize
            {
                let v = std::ptr::read_unaligned(libc::CMSG_DATA(c).cast::<libc::c_int>());
                return Some(v as u8);
            }
            c = libc::CMSG_NXTHDR(h, c);
        }
    }
    None
}

/// Whether a failed GSO send means "no GSO here" (old kernel, a device
/// without checksum offload, a path MTU below the segment size) rather than
/// a passing error: then the caller stops asking for GSO.
fn gso_refused(e: &io::Error) -> bool {
    matches!(
        e.raw_os_error(),
        Some(libc::EIO | libc::EINVAL | libc::ENOPROTOOPT | libc::EOPNOTSUPP | libc::EMSGSIZE)
    )
}

/// One datagram to send: its destination and its bytes, in up to three
/// pieces that leave as one datagram (the kernel gathers them): a head, a
/// middle given by address (a payload left in registered memory) and a tail.
#[derive(Debug, Clone, Copy)]
pub struct Datagram<'a> {
    /// Where it goes.
    pub dst: std::net::SocketAddr,
    head: &'a [u8],
    mid: *const u8,
    mid_len: usize,
    tail: &'a [u8],
}

impl<'a> Datagram<'a> {
    /// A datagram of `bytes`.
    pub fn new(dst: std::net::SocketAddr, bytes: &'a [u8]) -> Self {
        Datagram {
            dst,
            head: bytes,
            mid: std::ptr::null(),
            mid_len: 0,
            tail: &[],
        }
    }

    /// A datagram of `head`, the `mid_len` bytes at `mid`, then `tail`.
    ///
    /// # Safety
    /// `mid` must stay valid for reads of `mid_len` bytes until the send
    /// that takes this datagram returns (the kernel reads them then; other
    /// threads may write them meanwhile, which changes only the bytes sent).
    pub unsafe fn gathered(
        dst: std::net::SocketAddr,
        head: &'a [u8],
        mid: *const u8,
        mid_len: usize,
        tail: &'a [u8],
    ) -> Self {
        Datagram {
            dst,
            head,
            mid,
            mid_len,
            tail,
        }
    }

    /// Length in bytes.
    pub fn len(&self) -> usize {
        self.head.len() + self.mid_len + self.tail.len()
    }

    /// True when it has no bytes.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Its pieces as iovecs (empty pieces left out, at least one).
    fn push_iovecs(&self, out: &mut Vec<libc::iovec>) {
        let start = out.len();
        for (p, n) in [
            (self.head.as_ptr(), self.head.len()),
            (self.mid, self.mid_len),
            (self.tail.as_ptr(), self.tail.len()),
        ] {
            if n > 0 {
                out.push(libc::iovec {
                    iov_base: p as *mut libc::c_void,
                    iov_len: n,
                });
            }
        }
        if out.len() == start {
            out.push(libc::iovec {
                iov_base: self.head.as_ptr() as *mut libc::c_void,
                iov_len: 0,
            });
        }
    }
}

/// Sends datagrams with one `sendmmsg` (blocking until the kernel took them
/// or failed). Returns how many datagrams were sent, and in how many GSO
/// messages of more than one datagram.
///
/// With `*gso` set, each run of consecutive datagrams to one destination
/// whose sizes are equal (the last of a run may be shorter) goes as one
/// message with a UDP_SEGMENT control message: the kernel splits it into
/// exactly those datagrams again (on loopback it hands them to the
/// receiver as one buffer, which a GRO socket splits back; a real device
/// or software GSO splits them on the way out). The iovecs point at the
/// callers' buffers, so nothing is copied. If the kernel refuses GSO,
/// `*gso` is cleared and the rest goes as plain datagrams.
pub fn send_batch(
    sock: &UdpSocket,
    packets: &[Datagram<'_>],
    gso: &mut bool,
) -> io::Result<(usize, usize)> {
    match packets {
        [] => return Ok((0, 0)),
        [d] => return send_one(sock, d).map(|()| (1, 0)),
        _ => {}
    }
    let kept = SEND_SCRATCH.try_with(|cell| {
        let mut scratch = cell.borrow_mut();
        send_batch_with(sock, packets, gso, &mut scratch)
    });
    // During process exit the thread's storage is gone: fresh buffers.
    kept.unwrap_or_else(|_| send_batch_with(sock, packets, gso, &mut SendScratch::default()))
}

/// Per-thread buffers of [`send_batch`], kept between calls so that a send
/// allocates nothing once they have grown (a latency-bound sender makes one
/// call per message). Raw pointers inside are only meaningful during a call.
#[derive(Default)]
struct SendScratch {
    /// Messages: (first packet, packet count, segment size or 0 for none).
    msgs: Vec<(usize, usize, usize)>,
    addrs: Vec<(libc::sockaddr_storage, libc::socklen_t)>,
    iov: Vec<libc::iovec>,
    /// Index of each packet's first iovec (and one past the last).
    iov_at: Vec<usize>,
    ctrl: Vec<[u64; CMSG_WORDS]>,
    hdrs: Vec<libc::mmsghdr>,
}

thread_local! {
    static SEND_SCRATCH: std::cell::RefCell<SendScratch> = std::cell::RefCell::default();
}

fn send_batch_with(
    sock: &UdpSocket,
    packets: &[Datagram<'_>],
    gso: &mut bool,
    scratch: &mut SendScratch,
) -> io::Result<(usize, usize)> {
    let SendScratch {
        msgs,
        addrs,
        iov,
        iov_at,
        ctrl,
        hdrs,
    } = scratch;
    let group = |msgs: &mut Vec<(usize, usize, usize)>, from: usize, use_gso: bool| {
        msgs.clear();
        let mut i = from;
        while i < packets.len() {
            let dst = packets[i].dst;
            let size = packets[i].len();
            let mut n = 1;
            let mut total = size;
            if use_gso && size > 0 {
                while i + n < packets.len()
                    && n < GSO_MAX_SEGMENTS
                    && packets[i + n].dst == dst
                    && !packets[i + n].is_empty()
                    && packets[i + n].len() <= size
                    && total + packets[i + n].len() <= GSO_MAX_BYTES
                {
                    total += packets[i + n].len();
                    n += 1;
                    if packets[i + n - 1].len() < size {
                        break; // a shorter datagram ends the run
                    }
                }
            }
            msgs.push((i, n, if n > 1 { size } else { 0 }));
            i += n;
        }
    };
    group(msgs, 0, *gso);
    addrs.clear();
    addrs.extend(packets.iter().map(|d| to_sockaddr(d.dst)));
    // At most three iovecs per datagram: a GSO message of 64 datagrams
    // stays far below the kernel's 1024 (UIO_MAXIOV).
    iov.clear();
    iov_at.clear();
    for d in packets {
        iov_at.push(iov.len());
        d.push_iovecs(iov);
    }
    iov_at.push(iov.len());
    ctrl.clear();
    ctrl.resize(packets.len(), [0; CMSG_WORDS]);
    let mut sent_pkts = 0;
    let mut gso_msgs = 0;
    'regroup: loop {
        hdrs.clear();
        for (k, &(first, n, seg)) in msgs.iter().enumerate() {
            // SAFETY: all-zero msghdr is valid; we fill the fields we use.
            let mut h: libc::mmsghdr = unsafe { std::mem::zeroed() };
            h.msg_hdr.msg_name = (&addrs[first].0 as *const libc::sockaddr_storage)
                .cast_mut()
                .cast();
            h.msg_hdr.msg_namelen = addrs[first].1;
            let (from, to) = (iov_at[first], iov_at[first + n]);
            h.msg_hdr.msg_iov = iov[from..to].as_mut_ptr();
            h.msg_hdr.msg_iovlen = (to - from) as _;
            if seg > 0 {
                let buf = &mut ctrl[k];
                h.msg_hdr.msg_control = buf.as_mut_ptr().cast();
                // SAFETY: CMSG_SPACE only computes a size.
                let space = unsafe { libc::CMSG_SPACE(std::mem::size_of::<u16>() as u32) };
                h.msg_hdr.msg_controllen = space as _;
                // SAFETY: the control buffer is aligned for cmsghdr and holds
                // CMSG_SPACE(2) bytes (checked by the assertion below), so
                // CMSG_FIRSTHDR is non-null and the header and its 2 data
                // bytes lie inside it.
                unsafe {
                    debug_assert!(space as usize <= std::mem::size_of::<[u64; CMSG_WORDS]>());
                    let c = libc::CMSG_FIRSTHDR(&h.msg_hdr);
                    (*c).cmsg_level = libc::SOL_UDP;
                    (*c).cmsg_type = UDP_SEGMENT;
                    (*c).cmsg_len = libc::CMSG_LEN(std::mem::size_of::<u16>() as u32) as _;
                    std::ptr::write_unaligned(libc::CMSG_DATA(c).cast::<u16>(), seg as u16);
                }
            }
            hdrs.push(h);
        }
        let mut done = 0; // messages
        while done < hdrs.len() {
            // A lone message (a ping-pong's request and held ACK in one GSO
            // send) goes with `sendmsg`, cheaper than `sendmmsg` of one.
            let r = if hdrs.len() - done == 1 {
                // SAFETY: as below, for the one header.
                let r = unsafe { libc::sendmsg(sock.as_raw_fd(), &hdrs[done].msg_hdr, 0) };
                if r < 0 {
                    -1
                } else {
                    1
                }
            } else {
                // SAFETY: the headers describe live buffers, addresses and
                // control data for the call's duration (a gathered datagram's
                // middle by the contract of `Datagram::gathered`).
                unsafe {
                    libc::sendmmsg(
                        sock.as_raw_fd(),
                        hdrs[done..].as_mut_ptr(),
                        (hdrs.len() - done) as libc::c_uint,
                        0,
                    )
                }
            };
            if r < 0 {
                let e = io::Error::last_os_error();
                if e.kind() == io::ErrorKind::WouldBlock {
                    wait_writable(sock.as_raw_fd());
                    continue;
                }
                if e.kind() == io::ErrorKind::Interrupted {
                    continue;
                }
                if msgs[done].2 > 0 && *gso && gso_refused(&e) {
                    // No GSO on this path: the rest as plain datagrams.
                    *gso = false;
                    let from = msgs[done].0;
                    group(msgs, from, false);
                    continue 'regroup;
                }
                if sent_pkts == 0 {
                    return Err(e);
                }
                return Ok((sent_pkts, gso_msgs));
            }
            for m in &msgs[done..done + r as usize] {
                sent_pkts += m.1;
                gso_msgs += usize::from(m.2 > 0);
            }
            done += r as usize;
        }
        return Ok((sent_pkts, gso_msgs));
    }
}

/// One datagram with `sendmsg` (the common case of latency-bound traffic:
/// no grouping, no allocation).
fn send_one(sock: &UdpSocket, d: &Datagram<'_>) -> io::Result<()> {
    let (mut addr, alen) = to_sockaddr(d.dst);
    let mut iov = [libc::iovec {
        iov_base: std::ptr::null_mut(),
        iov_len: 0,
    }; 3];
    let mut n = 0;
    for (p, len) in [
        (d.head.as_ptr(), d.head.len()),
        (d.mid, d.mid_len),
        (d.tail.as_ptr(), d.tail.len()),
    ] {
        if len > 0 {
            iov[n] = libc::iovec {
                iov_base: p as *mut libc::c_void,
                iov_len: len,
            };
            n += 1;
        }
    }
    // SAFETY: all-zero msghdr is valid; we fill the fields we use.
    let mut h: libc::msghdr = unsafe { std::mem::zeroed() };
    h.msg_name = (&mut addr as *mut libc::sockaddr_storage).cast();
    h.msg_namelen = alen;
    h.msg_iov = iov.as_mut_ptr();
    h.msg_iovlen = n.max(1) as _;
    loop {
        // SAFETY: the header points at a live address and buffers for the
        // call (a gathered middle by the contract of `Datagram::gathered`).
        let r = unsafe { libc::sendmsg(sock.as_raw_fd(), &h, 0) };
        if r >= 0 {
            return Ok(());
        }
        let e = io::Error::last_os_error();
        match e.kind() {
            io::ErrorKind::WouldBlock => wait_writable(sock.as_raw_fd()),
            io::ErrorKind::Interrupted => {}
            _ => return Err(e),
        }
    }
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

/// Seals every shared memfd softrdma makes carries: its size can never
/// change, so a peer's mapping of it can never fault (SIGBUS) on a page
/// the owner cut off. Punching holes stays possible.
pub const SIZE_SEALS: libc::c_int = libc::F_SEAL_SHRINK | libc::F_SEAL_GROW;

/// A memfd of `len` bytes (sparse) whose size is sealed ([`SIZE_SEALS`]).
pub fn sealed_memfd(name: &std::ffi::CStr, len: usize) -> io::Result<OwnedFd> {
    // SAFETY: the name is a valid NUL-terminated string; flags are plain.
    let fd =
        unsafe { libc::memfd_create(name.as_ptr(), libc::MFD_CLOEXEC | libc::MFD_ALLOW_SEALING) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: fd is a fresh descriptor we exclusively own.
    let fd = unsafe { OwnedFd::from_raw_fd(fd) };
    // SAFETY: sizing and sealing our own memfd; no pointer arguments.
    unsafe {
        if libc::ftruncate(fd.as_raw_fd(), len as libc::off_t) != 0 {
            return Err(io::Error::last_os_error());
        }
        if libc::fcntl(fd.as_raw_fd(), libc::F_ADD_SEALS, SIZE_SEALS) != 0 {
            return Err(io::Error::last_os_error());
        }
    }
    Ok(fd)
}

/// Maps `len` bytes of the file behind `fd`, shared, read-write, at an
/// address the kernel picks.
pub fn map_shared(fd: RawFd, len: usize) -> io::Result<*mut u8> {
    // SAFETY: a new shared mapping at a kernel-chosen address; the result
    // is checked. Callers make sure the file is at least `len` bytes (or
    // sealed against shrinking after they checked).
    let p = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            len,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_SHARED,
            fd,
            0,
        )
    };
    if p == libc::MAP_FAILED {
        return Err(io::Error::last_os_error());
    }
    Ok(p.cast())
}

/// The size of the file behind `fd`.
pub fn fd_size(fd: RawFd) -> io::Result<u64> {
    // SAFETY: an all-zero stat is a valid value to be overwritten.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: fstat writes into the live `st`.
    if unsafe { libc::fstat(fd, &mut st) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(st.st_size as u64)
}

/// Sets `O_NONBLOCK` on `fd`.
pub fn set_nonblocking(fd: RawFd) -> io::Result<()> {
    // SAFETY: fcntl with integer arguments on a descriptor the caller owns.
    unsafe {
        let fl = libc::fcntl(fd, libc::F_GETFL);
        if fl < 0 || libc::fcntl(fd, libc::F_SETFL, fl | libc::O_NONBLOCK) < 0 {
            return Err(io::Error::last_os_error());
        }
    }
    Ok(())
}

/// The user and process at the other end of a Unix socket (`SO_PEERCRED`).
pub fn peer_cred(fd: RawFd) -> io::Result<(u32, i32)> {
    let mut c = libc::ucred {
        pid: 0,
        uid: u32::MAX,
        gid: u32::MAX,
    };
    let mut len = std::mem::size_of::<libc::ucred>() as libc::socklen_t;
    // SAFETY: getsockopt writes at most `len` bytes into the live `c`.
    let r = unsafe {
        libc::getsockopt(
            fd,
            libc::SOL_SOCKET,
            libc::SO_PEERCRED,
            (&mut c as *mut libc::ucred).cast(),
            &mut len,
        )
    };
    if r != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok((c.uid, c.pid))
}

/// [`wait_readable`] for a list of descriptors known at run time.
pub fn wait_readable_any(fds: &[RawFd], timeout: Option<Duration>, out: &mut Vec<bool>) {
    let mut p: Vec<libc::pollfd> = fds
        .iter()
        .map(|&fd| libc::pollfd {
            fd,
            events: libc::POLLIN | libc::POLLRDHUP,
            revents: 0,
        })
        .collect();
    ppoll(&mut p, timeout);
    out.clear();
    out.extend(p.iter().map(|q| {
        q.revents & (libc::POLLIN | libc::POLLERR | libc::POLLHUP | libc::POLLRDHUP) != 0
    }));
}

/// Multicast from `sock` leaves through the interface that has `local`
/// (`IP_MULTICAST_IF`): without it the kernel picks the interface of the
/// default route, and a device on a loopback address would send its
/// groups' datagrams out of the wrong one. Loopback of multicast to this
/// host's own members (`IP_MULTICAST_LOOP`) is on, the kernel's default.
pub fn set_multicast_if(sock: &UdpSocket, local: std::net::Ipv4Addr) -> io::Result<()> {
    let a = libc::in_addr {
        s_addr: u32::from_ne_bytes(local.octets()),
    };
    // SAFETY: passes a pointer to a live in_addr and its size.
    let r = unsafe {
        libc::setsockopt(
            sock.as_raw_fd(),
            libc::IPPROTO_IP,
            libc::IP_MULTICAST_IF,
            (&a as *const libc::in_addr).cast(),
            std::mem::size_of::<libc::in_addr>() as libc::socklen_t,
        )
    };
    if r != 0 {
        return Err(io::Error::last_os_error());
    }
    sock.set_multicast_loop_v4(true)
}

/// A non-blocking UDP socket bound to `addr` with `SO_REUSEADDR` set
/// before the bind, so that every device of this host (each process) can
/// bind a multicast group's address and port, and each gets a copy.
pub fn bind_reuse_udp(addr: std::net::SocketAddr) -> io::Result<UdpSocket> {
    // The address as the kernel takes it: a sockaddr_in6 is large enough
    // for either family.
    // SAFETY: all-zero is a valid sockaddr_storage.
    let mut ss: libc::sockaddr_storage = unsafe { std::mem::zeroed() };
    let len = match addr {
        std::net::SocketAddr::V4(a) => {
            let sin = libc::sockaddr_in {
                sin_family: libc::AF_INET as libc::sa_family_t,
                sin_port: a.port().to_be(),
                sin_addr: libc::in_addr {
                    s_addr: u32::from_ne_bytes(a.ip().octets()),
                },
                sin_zero: [0; 8],
            };
            // SAFETY: a sockaddr_in fits in a sockaddr_storage, which is
            // aligned for it.
            unsafe { std::ptr::write((&mut ss as *mut libc::sockaddr_storage).cast(), sin) };
            std::mem::size_of::<libc::sockaddr_in>()
        }
        std::net::SocketAddr::V6(a) => {
            let sin6 = libc::sockaddr_in6 {
                sin6_family: libc::AF_INET6 as libc::sa_family_t,
                sin6_port: a.port().to_be(),
                sin6_flowinfo: 0,
                sin6_addr: libc::in6_addr {
                    s6_addr: a.ip().octets(),
                },
                sin6_scope_id: a.scope_id(),
            };
            // SAFETY: as above, for a sockaddr_in6.
            unsafe { std::ptr::write((&mut ss as *mut libc::sockaddr_storage).cast(), sin6) };
            std::mem::size_of::<libc::sockaddr_in6>()
        }
    };
    let family = libc::c_int::from(ss.ss_family);
    // SAFETY: plain system call with constant arguments.
    let fd = unsafe {
        libc::socket(
            family,
            libc::SOCK_DGRAM | libc::SOCK_NONBLOCK | libc::SOCK_CLOEXEC,
            0,
        )
    };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: `fd` is a socket we just made and own alone.
    let sock = unsafe { UdpSocket::from_raw_fd(fd) };
    if !set_int_opt(&sock, libc::SOL_SOCKET, libc::SO_REUSEADDR, 1) {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: the sockaddr lives on this stack frame for the call, and
    // `len` is the size of what was written into it.
    let r = unsafe {
        libc::bind(
            fd,
            (&ss as *const libc::sockaddr_storage).cast(),
            len as libc::socklen_t,
        )
    };
    if r != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(sock)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn segments_split_runs_and_never_panic() {
        let d = [7u8; 10];
        let parts: Vec<usize> = segments(&d, 4).map(<[u8]>::len).collect();
        assert_eq!(parts, [4, 4, 2]);
        assert_eq!(segments(&d, 0).count(), 1);
        assert_eq!(segments(&d, 99).count(), 1);
        assert_eq!(segments(&[], 0).count(), 0);
        assert_eq!(segments(&[], 4).count(), 0);
    }

    /// A run of equal datagrams and a shorter last one leave as one GSO
    /// message and arrive as one GRO buffer that splits back into them.
    #[test]
    fn gso_send_arrives_as_gro_buffer_of_the_same_datagrams() {
        let rx = UdpSocket::bind("127.0.0.1:0").unwrap();
        let tx = UdpSocket::bind("127.0.0.1:0").unwrap();
        if !enable_gro(&rx) || !gso_available(&tx) {
            eprintln!("SKIPPED: no UDP GSO/GRO in this kernel");
            return;
        }
        let dst = rx.local_addr().unwrap();
        let bufs: Vec<Vec<u8>> = (0..5u8)
            .map(|i| vec![i; if i == 4 { 300 } else { 1000 }])
            .collect();
        let pkts: Vec<Datagram<'_>> = bufs.iter().map(|b| Datagram::new(dst, b)).collect();
        let mut gso = true;
        let (sent, msgs) = send_batch(&tx, &pkts, &mut gso).unwrap();
        assert_eq!((sent, msgs), (5, 1));
        assert!(gso);
        let mut batch = RecvBatch::new(4, 65536);
        let mut got: Vec<Vec<u8>> = Vec::new();
        for _ in 0..1000 {
            for i in 0..batch.recv(&rx) {
                let (src, buf, seg) = batch.get(i).unwrap();
                assert_eq!(src, tx.local_addr().unwrap());
                got.extend(segments(buf, seg).map(<[u8]>::to_vec));
            }
            if got.len() >= 5 {
                break;
            }
            std::thread::sleep(Duration::from_millis(1));
        }
        assert_eq!(got, bufs);
    }

    /// Datagrams in three pieces arrive whole, one at a time and as a GSO
    /// run (where the pieces of consecutive datagrams make one stream the
    /// kernel cuts at the segment size).
    #[test]
    fn gathered_datagrams_arrive_whole() {
        let rx = UdpSocket::bind("127.0.0.1:0").unwrap();
        let tx = UdpSocket::bind("127.0.0.1:0").unwrap();
        let gro = enable_gro(&rx);
        let dst = rx.local_addr().unwrap();
        let whole: Vec<Vec<u8>> = (0..6u8)
            .map(|i| {
                (0..if i == 5 { 700 } else { 1000 })
                    .map(|j| (j as u8) ^ i)
                    .collect()
            })
            .collect();
        let mids: Vec<Vec<u8>> = whole.iter().map(|w| w[28..w.len() - 4].to_vec()).collect();
        for batch in [1usize, 6] {
            let pkts: Vec<Datagram<'_>> = (0..batch)
                .map(|i| {
                    let (w, m) = (&whole[i], &mids[i]);
                    // SAFETY: `mids` outlives the send below.
                    unsafe {
                        Datagram::gathered(dst, &w[..28], m.as_ptr(), m.len(), &w[w.len() - 4..])
                    }
                })
                .collect();
            let mut gso = gso_available(&tx) && gro;
            let (sent, _) = send_batch(&tx, &pkts, &mut gso).unwrap();
            assert_eq!(sent, batch);
            let mut rb = RecvBatch::new(8, 65536);
            let mut got: Vec<Vec<u8>> = Vec::new();
            for _ in 0..1000 {
                for i in 0..rb.recv(&rx) {
                    let (_, buf, seg) = rb.get(i).unwrap();
                    got.extend(segments(buf, seg).map(<[u8]>::to_vec));
                }
                if got.len() >= batch {
                    break;
                }
                std::thread::sleep(Duration::from_millis(1));
            }
            assert_eq!(got, whole[..batch].to_vec());
        }
    }

    /// A lone datagram is read with a single `recvmsg`; a burst behind it
    /// with batches, and the reads go single again once the socket stays
    /// empty.
    #[test]
    fn single_reads_for_lone_datagrams_batches_for_bursts() {
        let rx = UdpSocket::bind("127.0.0.1:0").unwrap();
        let tx = UdpSocket::bind("127.0.0.1:0").unwrap();
        let dst = rx.local_addr().unwrap();
        let mut batch = RecvBatch::new(8, 65536);
        let wait_for_data = |batch: &mut RecvBatch| {
            for _ in 0..1000 {
                let n = batch.recv(&rx);
                if n > 0 {
                    return n;
                }
                std::thread::sleep(Duration::from_millis(1));
            }
            panic!("nothing arrived");
        };
        assert!(batch.single);
        tx.send_to(&[1; 40], dst).unwrap();
        assert_eq!(wait_for_data(&mut batch), 1);
        assert_eq!(batch.get(0).unwrap().1, &[1; 40]);
        assert!(
            !batch.full(),
            "a lone small datagram says nothing more waits"
        );
        for i in 0..20u8 {
            tx.send_to(&[i; 100], dst).unwrap();
        }
        std::thread::sleep(Duration::from_millis(20));
        // Batch mode after a datagram: the burst comes in batches of 8.
        let mut got = Vec::new();
        let mut reads = 0;
        while got.len() < 20 {
            let n = batch.recv(&rx);
            reads += 1;
            assert!(reads < 100, "burst not drained");
            got.extend((0..n).map(|i| batch.get(i).unwrap().1[0]));
        }
        assert_eq!(got, (0..20u8).collect::<Vec<_>>());
        assert!(
            reads <= 4,
            "{reads} reads for a burst of 20 in batches of 8"
        );
        assert_eq!(batch.recv(&rx), 0);
        assert!(!batch.single, "one empty read may be a pause in a stream");
        assert_eq!(batch.recv(&rx), 0);
        assert!(batch.single, "empty reads in a row go back to single reads");
    }

    /// Without GSO, the same datagrams go one per message.
    #[test]
    fn plain_sends_when_gso_is_off() {
        let rx = UdpSocket::bind("127.0.0.1:0").unwrap();
        let tx = UdpSocket::bind("127.0.0.1:0").unwrap();
        let dst = rx.local_addr().unwrap();
        let b = [1u8; 500];
        let pkts = [
            Datagram::new(dst, &b),
            Datagram::new(dst, &b),
            Datagram::new(dst, &b),
        ];
        let mut gso = false;
        assert_eq!(send_batch(&tx, &pkts, &mut gso).unwrap(), (3, 0));
    }
}
