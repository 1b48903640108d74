//! The same-host transport: packets between two softrdma devices on one
//! host travel through a pair of single-producer/single-consumer rings in a
//! shared memory segment (a memfd passed over a Unix socket) instead of UDP.
//!
//! The engine does not know: it still emits and consumes byte-exact RoCEv2
//! packets, so completion semantics, ordering, error statuses and counters
//! are those of the UDP path by construction. What changes is the cost: no
//! system call on the fast path (a sleeping receiver is woken through its
//! eventfd only when it said it sleeps).
//!
//! Rule for "same host": every device listens on a Unix socket named after
//! its address, `$SOFTRDMA_RUN_DIR/dev-<ip>-<port>.sock` (default run dir
//! `/tmp/softrdma-<uid>`). A packet for a peer address that has such a socket
//! goes over shared memory (transport `auto` or `shm`); otherwise over UDP
//! (`auto`, `udp`). `SOFTRDMA_TRANSPORT=udp|shm|auto` chooses; `auto` is the
//! default.

use std::collections::HashMap;
use std::io;
use std::net::{IpAddr, SocketAddr};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::PathBuf;
use std::ptr::NonNull;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};

use crate::sys::EventFd;

/// Bytes of packet a slot holds (4096 payload + headers, rounded).
pub const SLOT_DATA: usize = 4096 + 128;
/// Slots per ring.
pub const RING_SLOTS: usize = 512;
/// How long a sender waits for room in a full ring before dropping.
const RING_FULL_WAIT: std::time::Duration = std::time::Duration::from_millis(5);
const SLOT_LEN: usize = SLOT_DATA + 8;
const HDR_LEN: usize = 192;
const RING_LEN: usize = HDR_LEN + RING_SLOTS * SLOT_LEN;
const SEGMENT_LEN: usize = 2 * RING_LEN;

/// Which transport packets to same-host peers use.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Transport {
    /// Always UDP.
    Udp,
    /// Shared memory; a peer without it is unreachable.
    Shm,
    /// Shared memory when the peer is on this host, UDP otherwise.
    Auto,
}

impl std::str::FromStr for Transport {
    type Err = crate::Error;
    fn from_str(s: &str) -> Result<Self, crate::Error> {
        match s {
            "udp" => Ok(Transport::Udp),
            "shm" => Ok(Transport::Shm),
            "auto" | "" => Ok(Transport::Auto),
            _ => Err(crate::Error::Config(format!(
                "transport {s:?} is not udp, shm or auto"
            ))),
        }
    }
}

fn socket_path(addr: SocketAddr) -> PathBuf {
    let ip = match addr.ip() {
        IpAddr::V4(a) => a.to_string(),
        IpAddr::V6(a) => a.to_string().replace(':', "_"),
    };
    crate::stats::run_dir().join(format!("dev-{ip}-{}.sock", addr.port()))
}

/// A shared mapping of a memfd.
struct Mapping {
    ptr: NonNull<u8>,
    len: usize,
}

// SAFETY: the mapping is shared memory accessed only through atomics and
// raw copies under the ring protocol; it may move between threads.
unsafe impl Send for Mapping {}

impl Mapping {
    fn create(len: usize) -> io::Result<(Mapping, OwnedFd)> {
        // SAFETY: the name is a valid NUL-terminated string; flags are plain.
        let fd = unsafe { libc::memfd_create(c"softrdma-shm".as_ptr(), libc::MFD_CLOEXEC) };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: fd is a fresh descriptor we own.
        let fd = unsafe { OwnedFd::from_raw_fd(fd) };
        // SAFETY: sizing our own memfd.
        if unsafe { libc::ftruncate(fd.as_raw_fd(), len as libc::off_t) } != 0 {
            return Err(io::Error::last_os_error());
        }
        Ok((Self::map(&fd, len)?, fd))
    }

    fn map(fd: &OwnedFd, len: usize) -> io::Result<Mapping> {
        // SAFETY: maps `len` bytes of a memfd at least that long, shared, at
        // an address the kernel picks; the result is checked.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                fd.as_raw_fd(),
                0,
            )
        };
        if p == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        let ptr = NonNull::new(p.cast()).ok_or_else(|| io::Error::from(io::ErrorKind::Other))?;
        Ok(Mapping { ptr, len })
    }
}

impl Drop for Mapping {
    fn drop(&mut self) {
        // SAFETY: unmaps exactly the mapping made in `map`, once.
        unsafe { libc::munmap(self.ptr.as_ptr().cast(), self.len) };
    }
}

/// One direction of a link: a ring of packet slots.
///
/// Header: producer index (tail) at 0, consumer index (head) at 64,
/// consumer-sleeping flag at 128 — on separate cache lines. Slot: u32
/// length, u16 source UDP port, 2 bytes pad, then the packet.
#[derive(Clone, Copy)]
struct Ring {
    base: *mut u8,
}

impl Ring {
    fn tail(&self) -> &AtomicU64 {
        // SAFETY: base points to a live, 64-aligned ring header inside the mapping.
        unsafe { AtomicU64::from_ptr(self.base.cast()) }
    }
    fn head(&self) -> &AtomicU64 {
        // SAFETY: as above, offset 64 is inside the header.
        unsafe { AtomicU64::from_ptr(self.base.add(64).cast()) }
    }
    fn sleeping(&self) -> &AtomicU32 {
        // SAFETY: as above, offset 128 is inside the header.
        unsafe { AtomicU32::from_ptr(self.base.add(128).cast()) }
    }
    fn slot(&self, i: u64) -> *mut u8 {
        // SAFETY: the index is reduced modulo RING_SLOTS, inside the ring.
        unsafe {
            self.base
                .add(HDR_LEN + (i as usize % RING_SLOTS) * SLOT_LEN)
        }
    }

    /// Appends a packet; false when the ring is full (the packet is dropped,
    /// as a congested wire would; RC retransmits).
    fn push(&self, src_port: u16, data: &[u8]) -> bool {
        if data.len() > SLOT_DATA {
            return false;
        }
        let tail = self.tail().load(Ordering::Relaxed);
        if tail.wrapping_sub(self.head().load(Ordering::Acquire)) >= RING_SLOTS as u64 {
            return false;
        }
        let s = self.slot(tail);
        // SAFETY: slot `tail` is owned by the producer until tail is published;
        // 8 header bytes + data.len() <= SLOT_LEN.
        unsafe {
            std::ptr::write_unaligned(s.cast::<u32>(), data.len() as u32);
            std::ptr::write_unaligned(s.add(4).cast::<u16>(), src_port);
            std::ptr::copy_nonoverlapping(data.as_ptr(), s.add(8), data.len());
        }
        self.tail().store(tail.wrapping_add(1), Ordering::Release);
        true
    }

    /// Takes up to `max` packets, handing each to `f`.
    fn pop(&self, max: usize, buf: &mut [u8], mut f: impl FnMut(u16, &[u8])) -> usize {
        let mut head = self.head().load(Ordering::Relaxed);
        let tail = self.tail().load(Ordering::Acquire);
        let mut n = 0;
        while head != tail && n < max {
            let s = self.slot(head);
            // SAFETY: slot `head` was published by the producer (tail > head)
            // and stays ours until head moves past it. The length comes from
            // the peer: it is clamped to the slot so a corrupt value cannot
            // reach outside it.
            let (len, port) = unsafe {
                let len = (std::ptr::read_unaligned(s.cast::<u32>()) as usize)
                    .min(SLOT_DATA)
                    .min(buf.len());
                std::ptr::copy_nonoverlapping(s.add(8), buf.as_mut_ptr(), len);
                (len, std::ptr::read_unaligned(s.add(4).cast::<u16>()))
            };
            head = head.wrapping_add(1);
            self.head().store(head, Ordering::Release);
            f(port, &buf[..len]);
            n += 1;
        }
        n
    }

    fn is_empty(&self) -> bool {
        self.head().load(Ordering::Acquire) == self.tail().load(Ordering::Acquire)
    }
}

/// A connection to one same-host peer device.
struct Link {
    peer: SocketAddr,
    /// The peer's arena (its published tables and allocated regions).
    arena: Option<crate::arena::ArenaMap>,
    _map: Mapping,
    tx: Ring,
    rx: Ring,
    peer_wake: EventFd,
    sock: UnixStream,
    dead: bool,
    /// Its socket showed activity in the last poll (the peer may be gone).
    suspect: bool,
}

// SAFETY: the rings point into `_map`, which the link owns; all shared
// accesses are atomics or raw copies under the SPSC protocol.
unsafe impl Send for Link {}

/// Counters of the shared-memory transport.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ShmCounters {
    /// Packets sent through rings.
    pub tx_packets: u64,
    /// Packets received from rings.
    pub rx_packets: u64,
    /// Packets dropped because a ring was full.
    pub ring_full: u64,
    /// Wake-ups sent to sleeping peers.
    pub wakeups_sent: u64,
    /// Links set up.
    pub links: u64,
}

/// All same-host links of one device.
pub(crate) struct ShmHub {
    pub mode: Transport,
    local: SocketAddr,
    listener: Option<UnixListener>,
    path: Option<PathBuf>,
    links: Vec<Link>,
    /// Peers tried without success (UDP then).
    no_link: HashMap<SocketAddr, ()>,
    wake_fd: RawFd,
    arena_fd: Option<RawFd>,
    buf: Vec<u8>,
    /// `accept`'s poll set (kept to reuse its allocation).
    pollfds: Vec<libc::pollfd>,
    /// `accept` just polled every link socket (see `check_dead`).
    polled: bool,
    /// Changes whenever `links` does (a link added, replaced, marked dead
    /// or dropped), so a link index remembered elsewhere can be checked.
    links_gen: u64,
    pub counters: ShmCounters,
}

impl ShmHub {
    /// Starts listening (unless the transport is UDP). `wake_fd` is the
    /// device's wake-up eventfd, given to peers so they can wake it.
    pub fn new(
        mode: Transport,
        local: SocketAddr,
        wake_fd: RawFd,
        arena_fd: Option<RawFd>,
    ) -> Self {
        let mut hub = ShmHub {
            mode,
            local,
            listener: None,
            path: None,
            links: Vec::new(),
            no_link: HashMap::new(),
            wake_fd,
            arena_fd,
            buf: vec![0; SLOT_DATA],
            pollfds: Vec::new(),
            polled: false,
            links_gen: 0,
            counters: ShmCounters::default(),
        };
        if mode != Transport::Udp {
            let path = socket_path(local);
            let _ = std::fs::create_dir_all(crate::stats::run_dir());
            let _ = std::fs::remove_file(&path);
            if let Ok(l) = UnixListener::bind(&path) {
                let _ = l.set_nonblocking(true);
                hub.listener = Some(l);
                hub.path = Some(path);
            }
        }
        hub
    }

    /// True when some same-host peer is linked.
    pub fn has_links(&self) -> bool {
        !self.links.is_empty()
    }

    /// True when a ring holds packets not yet received.
    pub fn rx_pending(&self) -> bool {
        self.links.iter().any(|l| !l.rx.is_empty())
    }

    /// The listening socket's fd, to wait on.
    pub fn listen_fd(&self) -> Option<RawFd> {
        self.listener.as_ref().map(|l| l.as_raw_fd())
    }

    /// Accepts peers that connected (non-blocking), and looks for dead ones.
    ///
    /// One `poll` system call covers the listener and every link's socket:
    /// an `accept` on an idle listener would cost the kernel a socket
    /// allocation each time, and a link socket carries nothing after setup,
    /// so it becomes readable or hung up only when the peer is gone. The
    /// [`ShmHub::check_dead`] that follows then peeks only at those.
    pub fn accept(&mut self) {
        let Some(l) = &self.listener else { return };
        self.pollfds.clear();
        self.pollfds.push(libc::pollfd {
            fd: l.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        });
        for link in &self.links {
            self.pollfds.push(libc::pollfd {
                fd: link.sock.as_raw_fd(),
                events: libc::POLLIN | libc::POLLRDHUP,
                revents: 0,
            });
        }
        // SAFETY: polls the live descriptors of `pollfds`, which holds
        // exactly `len` entries, without waiting.
        let r = unsafe {
            libc::poll(
                self.pollfds.as_mut_ptr(),
                self.pollfds.len() as libc::nfds_t,
                0,
            )
        };
        if r < 0 {
            // Unknown: accept and peek as without the poll.
            self.polled = false;
        } else {
            self.polled = true;
            for (link, p) in self.links.iter_mut().zip(&self.pollfds[1..]) {
                link.suspect = p.revents != 0;
            }
            if self.pollfds[0].revents == 0 {
                return;
            }
        }
        while let Ok((s, _)) = l.accept() {
            if let Ok(link) = accept_link(s, self.wake_fd, self.arena_fd) {
                link.rx.sleeping().store(1, Ordering::SeqCst);
                poke(self.wake_fd);
                self.counters.links += 1;
                self.links.retain(|x| x.peer != link.peer);
                self.links.push(link);
                self.links_gen += 1;
            }
        }
    }

    fn link_index(&mut self, dst: SocketAddr) -> Option<usize> {
        if let Some(i) = self.links.iter().position(|l| l.peer == dst && !l.dead) {
            return Some(i);
        }
        if self.mode == Transport::Udp || self.no_link.contains_key(&dst) {
            return None;
        }
        match connect_link(self.local, dst, self.wake_fd, self.arena_fd) {
            Ok(link) => {
                // Our background thread may already be asleep without having
                // marked this new ring: mark it, and wake the thread so it
                // takes the link into account.
                link.rx.sleeping().store(1, Ordering::SeqCst);
                poke(self.wake_fd);
                self.counters.links += 1;
                self.links.retain(|x| x.peer != dst);
                self.links.push(link);
                self.links_gen += 1;
                Some(self.links.len() - 1)
            }
            Err(_) => {
                self.no_link.insert(dst, ());
                None
            }
        }
    }

    /// Sends a packet over shared memory when `dst` is a same-host peer.
    /// Returns false when the packet must go over UDP instead.
    pub fn send(&mut self, src_port: u16, dst: SocketAddr, data: &[u8]) -> bool {
        let Some(i) = self.link_index(dst) else {
            // shm-only mode: no UDP fallback; the packet is lost like on a
            // wire to nowhere (RC reports RETRY_EXC_ERR).
            return self.mode == Transport::Shm;
        };
        let link = &self.links[i];
        // Lossless like a credit-flow-controlled link: a full ring makes the
        // sender wait for the receiver (waking it), for a bounded time, so
        // UC and UD messages are not lost to a momentarily slow receiver.
        // Past the bound the packet is dropped (RC retransmits), so two
        // devices that fill each other's rings cannot deadlock.
        let mut waited: Option<std::time::Instant> = None;
        loop {
            if link.tx.push(src_port, data) {
                self.counters.tx_packets += 1;
                break;
            }
            let start = *waited.get_or_insert_with(std::time::Instant::now);
            if link.dead || start.elapsed() > RING_FULL_WAIT {
                self.counters.ring_full += 1;
                break;
            }
            if link.tx.sleeping().swap(0, Ordering::AcqRel) != 0 {
                link.peer_wake.signal();
                self.counters.wakeups_sent += 1;
            }
            std::thread::yield_now();
        }
        // Store (tail) then load (flag) against the receiver's store (flag)
        // then load (tail): without a full fence each side may miss the
        // other's store and the receiver sleeps on a packet (lost wake-up).
        std::sync::atomic::fence(Ordering::SeqCst);
        if link.tx.sleeping().swap(0, Ordering::AcqRel) != 0 {
            link.peer_wake.signal();
            self.counters.wakeups_sent += 1;
        }
        true
    }

    /// Takes received packets from every link: `f(src, data)`.
    pub fn receive(&mut self, max: usize, mut f: impl FnMut(SocketAddr, &[u8])) -> usize {
        let mut n = 0;
        let buf = &mut self.buf;
        for link in &mut self.links {
            let ip = link.peer.ip();
            n += link
                .rx
                .pop(max, buf, |port, d| f(SocketAddr::new(ip, port), d));
        }
        self.counters.rx_packets += n as u64;
        n
    }

    /// The index of the link to `dst` (made if need be), for
    /// [`ShmHub::arena_at`], when the peer shares an arena.
    pub fn peer_link(&mut self, dst: SocketAddr) -> Option<usize> {
        let i = self.link_index(dst)?;
        self.links[i].arena.is_some().then_some(i)
    }

    /// The arena of link `i`, found by [`ShmHub::peer_link`] while
    /// [`ShmHub::links_gen`] had the same value as now.
    pub fn arena_at(&self, i: usize) -> Option<&crate::arena::ArenaMap> {
        self.links.get(i).filter(|l| !l.dead)?.arena.as_ref()
    }

    /// See the field.
    pub fn links_gen(&self) -> u64 {
        self.links_gen
    }

    /// Says this device is about to sleep; false if a ring already holds packets.
    pub fn prepare_sleep(&mut self) -> bool {
        self.check_dead();
        for l in &self.links {
            l.rx.sleeping().store(1, Ordering::SeqCst);
        }
        // Pairs with the sender's fence in `send`.
        std::sync::atomic::fence(Ordering::SeqCst);
        self.links.iter().all(|l| l.rx.is_empty())
    }

    /// Drops links whose peer process is gone (its socket closed). Right
    /// after [`ShmHub::accept`], only the sockets its poll flagged are
    /// peeked at.
    pub fn check_dead(&mut self) {
        let polled = std::mem::take(&mut self.polled);
        for l in &mut self.links {
            if polled && !l.suspect {
                continue;
            }
            let mut b = [0u8; 1];
            // SAFETY: non-blocking peek of one byte into a live buffer.
            let r = unsafe {
                libc::recv(
                    l.sock.as_raw_fd(),
                    b.as_mut_ptr().cast(),
                    1,
                    libc::MSG_PEEK | libc::MSG_DONTWAIT,
                )
            };
            if r == 0 && !l.dead {
                l.dead = true;
                self.links_gen += 1;
            }
        }
        self.links.retain(|l| !l.dead || !l.rx.is_empty());
    }
}

impl Drop for ShmHub {
    fn drop(&mut self) {
        if let Some(p) = &self.path {
            let _ = std::fs::remove_file(p);
        }
    }
}

/// Signals an eventfd given by its raw descriptor (the device's own wake-up fd).
fn poke(fd: RawFd) {
    let one: u64 = 1;
    // SAFETY: writes 8 bytes from a live u64 to an eventfd the device owns
    // for as long as its hub exists.
    let _ = unsafe { libc::write(fd, (&one as *const u64).cast(), 8) };
}

fn ring_pair(map: &Mapping, creator: bool) -> (Ring, Ring) {
    let a = Ring {
        base: map.ptr.as_ptr(),
    };
    // SAFETY: the second ring starts RING_LEN bytes in, inside the mapping.
    let b = Ring {
        base: unsafe { map.ptr.as_ptr().add(RING_LEN) },
    };
    if creator {
        (a, b)
    } else {
        (b, a)
    }
}

fn addr_bytes(a: SocketAddr) -> [u8; 18] {
    let mut b = [0u8; 18];
    let ip = match a.ip() {
        IpAddr::V4(v4) => v4.to_ipv6_mapped().octets(),
        IpAddr::V6(v6) => v6.octets(),
    };
    b[..16].copy_from_slice(&ip);
    b[16..].copy_from_slice(&a.port().to_be_bytes());
    b
}

fn addr_from(b: &[u8]) -> SocketAddr {
    let mut ip = [0u8; 16];
    ip.copy_from_slice(&b[..16]);
    let v6 = std::net::Ipv6Addr::from(ip);
    let ip = v6.to_ipv4_mapped().map_or(IpAddr::V6(v6), IpAddr::V4);
    SocketAddr::new(ip, u16::from_be_bytes([b[16], b[17]]))
}

fn connect_link(
    local: SocketAddr,
    dst: SocketAddr,
    wake_fd: RawFd,
    arena_fd: Option<RawFd>,
) -> io::Result<Link> {
    let sock = UnixStream::connect(socket_path(dst))?;
    sock.set_read_timeout(Some(std::time::Duration::from_secs(2)))?;
    let (map, memfd) = Mapping::create(SEGMENT_LEN)?;
    let mut msg = [0u8; 18];
    msg.copy_from_slice(&addr_bytes(local));
    let mut fds = vec![memfd.as_raw_fd(), wake_fd];
    fds.extend(arena_fd);
    send_fds(&sock, &msg, &fds)?;
    let mut reply = [0u8; 1];
    let mut fds = recv_fds(&sock, &mut reply, 2)?.into_iter();
    let peer_wake = fds
        .next()
        .ok_or_else(|| io::Error::other("peer sent no eventfd"))?;
    let arena = fds
        .next()
        .and_then(|f| crate::arena::ArenaMap::map(&f, crate::arena::ARENA_LEN).ok());
    let (tx, rx) = ring_pair(&map, true);
    Ok(Link {
        peer: dst,
        arena,
        _map: map,
        tx,
        rx,
        peer_wake: EventFd::from_owned(peer_wake),
        sock,
        dead: false,
        suspect: false,
    })
}

fn accept_link(sock: UnixStream, wake_fd: RawFd, arena_fd: Option<RawFd>) -> io::Result<Link> {
    sock.set_nonblocking(false)?;
    sock.set_read_timeout(Some(std::time::Duration::from_secs(2)))?;
    let mut msg = [0u8; 18];
    let mut fds = recv_fds(&sock, &mut msg, 3)?.into_iter();
    let (Some(memfd), Some(peer_wake)) = (fds.next(), fds.next()) else {
        return Err(io::Error::other("peer sent too few descriptors"));
    };
    let arena = fds
        .next()
        .and_then(|f| crate::arena::ArenaMap::map(&f, crate::arena::ARENA_LEN).ok());
    let map = Mapping::map(&memfd, SEGMENT_LEN)?;
    let mut mine = vec![wake_fd];
    mine.extend(arena_fd);
    send_fds(&sock, &[1], &mine)?;
    let (tx, rx) = ring_pair(&map, false);
    Ok(Link {
        peer: addr_from(&msg),
        arena,
        _map: map,
        tx,
        rx,
        peer_wake: EventFd::from_owned(peer_wake),
        sock,
        dead: false,
        suspect: false,
    })
}

fn send_fds(sock: &UnixStream, data: &[u8], fds: &[RawFd]) -> io::Result<()> {
    let mut iov = libc::iovec {
        iov_base: data.as_ptr() as *mut libc::c_void,
        iov_len: data.len(),
    };
    let fd_bytes = std::mem::size_of_val(fds);
    // SAFETY: CMSG_SPACE is a pure computation.
    let space = unsafe { libc::CMSG_SPACE(fd_bytes as u32) } as usize;
    let mut cbuf = vec![0u64; space.div_ceil(8)];
    // SAFETY: all-zero msghdr is valid; we fill the fields used.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    msg.msg_control = cbuf.as_mut_ptr().cast();
    msg.msg_controllen = space;
    // SAFETY: the control buffer is `space` bytes, enough for one header
    // carrying `fds`; CMSG_* navigate within it.
    unsafe {
        let c = libc::CMSG_FIRSTHDR(&msg);
        (*c).cmsg_level = libc::SOL_SOCKET;
        (*c).cmsg_type = libc::SCM_RIGHTS;
        (*c).cmsg_len = libc::CMSG_LEN(fd_bytes as u32) as usize;
        std::ptr::copy_nonoverlapping(fds.as_ptr(), libc::CMSG_DATA(c).cast::<RawFd>(), fds.len());
    }
    // SAFETY: msg describes live buffers.
    if unsafe { libc::sendmsg(sock.as_raw_fd(), &msg, 0) } < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

fn recv_fds(sock: &UnixStream, data: &mut [u8], max_fds: usize) -> io::Result<Vec<OwnedFd>> {
    let mut iov = libc::iovec {
        iov_base: data.as_mut_ptr().cast(),
        iov_len: data.len(),
    };
    let fd_bytes = max_fds * std::mem::size_of::<RawFd>();
    // SAFETY: pure computation.
    let space = unsafe { libc::CMSG_SPACE(fd_bytes as u32) } as usize;
    let mut cbuf = vec![0u64; space.div_ceil(8)];
    // SAFETY: all-zero msghdr is valid; we fill the fields used.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    msg.msg_control = cbuf.as_mut_ptr().cast();
    msg.msg_controllen = space;
    // SAFETY: msg describes live buffers; MSG_CMSG_CLOEXEC marks received fds.
    let n = unsafe { libc::recvmsg(sock.as_raw_fd(), &mut msg, libc::MSG_CMSG_CLOEXEC) };
    if n <= 0 {
        return Err(if n == 0 {
            io::Error::from(io::ErrorKind::UnexpectedEof)
        } else {
            io::Error::last_os_error()
        });
    }
    let mut out = Vec::new();
    // SAFETY: walking the control messages the kernel wrote into cbuf.
    unsafe {
        let mut c = libc::CMSG_FIRSTHDR(&msg);
        while !c.is_null() {
            if (*c).cmsg_level == libc::SOL_SOCKET && (*c).cmsg_type == libc::SCM_RIGHTS {
                let count = ((*c).cmsg_len as usize - libc::CMSG_LEN(0) as usize)
                    / std::mem::size_of::<RawFd>();
                let p = libc::CMSG_DATA(c).cast::<RawFd>();
                for i in 0..count {
                    out.push(OwnedFd::from_raw_fd(std::ptr::read_unaligned(p.add(i))));
                }
            }
            c = libc::CMSG_NXTHDR(&msg, c);
        }
    }
    Ok(out)
}
