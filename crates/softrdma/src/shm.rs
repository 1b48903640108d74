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

use softrdma_engine::{Qpn, Rkey};
use std::collections::HashMap;
use std::io;
use std::net::{IpAddr, SocketAddr};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::PathBuf;
use std::ptr::NonNull;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};

use crate::linkmsg::{LinkMsg, MSG_LEN};
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
/// A link's segment: the two rings, then the two grant tables.
const SEGMENT_LEN: usize = 2 * RING_LEN + 2 * crate::grant::TABLE_LEN;

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
        let fd = crate::sys::sealed_memfd(c"softrdma-shm", len)?;
        Ok((Self::map(&fd, len)?, fd))
    }

    /// Maps `len` bytes of a memfd at least that long (checked by the caller).
    fn map(fd: &OwnedFd, len: usize) -> io::Result<Mapping> {
        let p = crate::sys::map_shared(fd.as_raw_fd(), len)?;
        let ptr = NonNull::new(p).ok_or_else(|| io::Error::other("mmap returned null"))?;
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

    /// Writes a packet into slot `at` (the published tail, or past packets
    /// written since): the consumer sees it once [`Ring::publish`] moves
    /// the tail past it. False when the ring is full (the packet is
    /// dropped, as a congested wire would; RC retransmits).
    fn write_at(&self, at: u64, src_port: u16, data: &[u8]) -> bool {
        if data.len() > SLOT_DATA {
            return false;
        }
        if at.wrapping_sub(self.head().load(Ordering::Acquire)) >= RING_SLOTS as u64 {
            return false;
        }
        let s = self.slot(at);
        // SAFETY: slot `at` is at or past the published tail, so owned by
        // the producer until it is published; 8 header bytes + data.len()
        // <= SLOT_LEN.
        unsafe {
            std::ptr::write_unaligned(s.cast::<u32>(), data.len() as u32);
            std::ptr::write_unaligned(s.add(4).cast::<u16>(), src_port);
            std::ptr::copy_nonoverlapping(data.as_ptr(), s.add(8), data.len());
        }
        true
    }

    /// Makes the packets written before `tail` visible to the consumer.
    fn publish(&self, tail: u64) {
        self.tail().store(tail, Ordering::Release);
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
    /// This device made the link's segment (it connected); else the peer did.
    created_here: bool,
    /// Grants this device gave the peer, and holds from it.
    out: crate::grant::OutGrants,
    inn: crate::grant::InGrants,
    _map: Mapping,
    tx: Ring,
    rx: Ring,
    /// The peer's wake-up eventfd: `None` on a link this device made until
    /// the peer's welcome arrives (packets already go into the ring).
    peer_wake: Option<EventFd>,
    /// The tail past the packets of the batch being sent, not yet
    /// published (`ShmHub::flush`).
    tx_next: Option<u64>,
    sock: UnixStream,
    dead: bool,
    /// Its socket showed activity in the last poll (a message, or the peer is gone).
    suspect: bool,
}

// SAFETY: the rings point into `_map`, which the link owns; all shared
// accesses are atomics or raw copies under the SPSC protocol.
unsafe impl Send for Link {}

impl Link {
    /// A link over segment `map`, made here or by the peer.
    fn new(
        peer: SocketAddr,
        map: Mapping,
        created_here: bool,
        peer_wake: Option<EventFd>,
        sock: UnixStream,
    ) -> Link {
        let (tx, rx) = ring_pair(&map, created_here);
        // SAFETY: the segment is SEGMENT_LEN bytes: the rings, then both
        // tables; the mapping lives in the link as long as they do.
        let (mine, theirs) =
            unsafe { crate::grant::tables(map.ptr.as_ptr(), 2 * RING_LEN, created_here) };
        Link {
            peer,
            created_here,
            out: crate::grant::OutGrants::new(mine),
            inn: crate::grant::InGrants::new(theirs),
            _map: map,
            tx,
            rx,
            peer_wake,
            tx_next: None,
            sock,
            dead: false,
            suspect: false,
        }
    }

    /// Publishes the packets of the batch being sent, and wakes the peer
    /// if it said it sleeps on this ring; true when it was woken.
    fn publish(&mut self) -> bool {
        let Some(t) = self.tx_next.take() else {
            return false;
        };
        self.tx.publish(t);
        // Store (tail) then load (flag) against the receiver's store (flag)
        // then load (tail): without a full fence each side may miss the
        // other's store and the receiver sleeps on a packet (lost wake-up).
        std::sync::atomic::fence(Ordering::SeqCst);
        self.wake_peer()
    }

    /// Wakes the peer if it said it sleeps on its ring from us.
    fn wake_peer(&self) -> bool {
        let Some(w) = &self.peer_wake else {
            return false;
        };
        if self.tx.sleeping().swap(0, Ordering::AcqRel) != 0 {
            w.signal();
            return true;
        }
        false
    }
}

/// A connection accepted but not yet introduced (its hello not read).
struct PendingAccept {
    sock: UnixStream,
    since: std::time::Instant,
}

/// How long an accepted connection may take to send its hello.
const HELLO_WAIT: std::time::Duration = std::time::Duration::from_secs(2);
/// How long making a link waits for the peer's welcome (see `await_welcome`).
const WELCOME_WAIT: std::time::Duration = std::time::Duration::from_millis(20);
/// How long a peer whose socket could not be connected is reached without
/// shared memory before the next try.
const RETRY_LINK: std::time::Duration = std::time::Duration::from_millis(200);

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
    /// Connections refused: another user, a bad socket file, or a
    /// malformed or incomplete handshake (each is also logged once).
    pub links_refused: u64,
}

/// All same-host links of one device.
pub(crate) struct ShmHub {
    pub mode: Transport,
    local: SocketAddr,
    listener: Option<UnixListener>,
    path: Option<PathBuf>,
    /// The socket file's identity, so that only our own file is removed.
    inode: Option<(u64, u64)>,
    /// Proves the socket's owner alive to sweepers (`rundir::sweep_stale`).
    owner: Option<crate::rundir::OwnerLock>,
    links: Vec<Link>,
    pending: Vec<PendingAccept>,
    /// Peers whose socket could not be connected, and when to try again.
    no_link: HashMap<SocketAddr, std::time::Instant>,
    wake_fd: RawFd,
    /// Grant requests received, for the device to answer with its engine.
    requests: Vec<(SocketAddr, crate::linkmsg::GrantRequest)>,
    buf: Vec<u8>,
    /// `accept`'s poll set (kept to reuse its allocation).
    pollfds: Vec<libc::pollfd>,
    /// `accept` just polled every link socket (see `check_dead`).
    polled: bool,
    /// Changes whenever `links` does (a link added, replaced, marked dead
    /// or dropped), so a link index remembered elsewhere can be checked.
    links_gen: u64,
    /// `send` wrote packets that `flush` has not published yet.
    unpublished: bool,
    pub counters: ShmCounters,
    /// The last refusal, for `Device`'s diagnostics.
    pub last_refusal: Option<String>,
}

impl ShmHub {
    /// Starts listening (unless the transport is UDP). `wake_fd` is the
    /// device's wake-up eventfd, given to peers so they can wake it.
    ///
    /// Fails when the run directory is not this user's alone
    /// (`rundir::prepare`) or the socket cannot be bound: with transport
    /// `shm` that is the device's error; `auto` goes on over UDP only.
    pub fn new(mode: Transport, local: SocketAddr, wake_fd: RawFd) -> Result<Self, String> {
        let mut hub = ShmHub {
            mode,
            local,
            listener: None,
            path: None,
            inode: None,
            owner: None,
            links: Vec::new(),
            pending: Vec::new(),
            no_link: HashMap::new(),
            wake_fd,
            requests: Vec::new(),
            buf: vec![0; SLOT_DATA],
            pollfds: Vec::new(),
            polled: false,
            links_gen: 0,
            unpublished: false,
            counters: ShmCounters::default(),
            last_refusal: None,
        };
        if mode != Transport::Udp {
            crate::rundir::prepare().map_err(|e| e.to_string())?;
            let path = socket_path(local);
            // Locked before the socket exists, for as long as it does: a
            // sweeper never takes a starting or live device's socket.
            hub.owner = crate::rundir::OwnerLock::take(&path);
            let _ = std::fs::remove_file(&path);
            let l = UnixListener::bind(&path)
                .map_err(|e| format!("cannot listen on {}: {e}", path.display()))?;
            {
                use std::os::unix::fs::MetadataExt;
                hub.inode = std::fs::metadata(&path).ok().map(|m| (m.dev(), m.ino()));
            }
            // Only this user may connect; SO_PEERCRED checks it again.
            use std::os::unix::fs::PermissionsExt;
            let _ = std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600));
            l.set_nonblocking(true)
                .map_err(|e| format!("{}: {e}", path.display()))?;
            hub.listener = Some(l);
            hub.path = Some(path);
        }
        Ok(hub)
    }

    /// A hub that never links (UDP only), for when [`ShmHub::new`] failed.
    pub fn udp_only(local: SocketAddr, wake_fd: RawFd) -> Self {
        match Self::new(Transport::Udp, local, wake_fd) {
            Ok(h) => h,
            Err(_) => unreachable!("a UDP-only hub touches nothing that can fail"),
        }
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

    /// Every socket whose readiness needs this hub's attention: the
    /// listener, connections not yet introduced, and the links (a
    /// message, or the peer gone). The background thread sleeps on them.
    pub fn wait_fds(&self, out: &mut Vec<RawFd>) {
        out.extend(self.listen_fd());
        out.extend(self.pending.iter().map(|p| p.sock.as_raw_fd()));
        // A dead link's socket stays readable (end of stream) until the
        // link is dropped: it would wake the waiter again and again.
        out.extend(
            self.links
                .iter()
                .filter(|l| !l.dead)
                .map(|l| l.sock.as_raw_fd()),
        );
    }

    fn refuse(&mut self, why: String) {
        self.counters.links_refused += 1;
        if self.last_refusal.is_none() {
            eprintln!("softrdma: same-host link refused: {why}");
        }
        self.last_refusal = Some(why);
    }

    /// Accepts peers that connected, reads handshakes that arrived, and
    /// looks for dead peers; never blocks.
    ///
    /// One `poll` system call covers the listener, the connections not yet
    /// introduced and every link's socket: an `accept` on an idle listener
    /// would cost the kernel a socket allocation each time, and a link
    /// socket carries only the handshake, so after that it becomes readable
    /// or hung up only when the peer is gone. The [`ShmHub::check_dead`]
    /// that follows then peeks only at those.
    pub fn accept(&mut self) {
        let Some(l) = &self.listener else { return };
        self.pollfds.clear();
        let socks =
            std::iter::once(l.as_raw_fd()).chain(self.links.iter().map(|l| l.sock.as_raw_fd()));
        self.pollfds.extend(socks.map(|fd| libc::pollfd {
            fd,
            events: libc::POLLIN | libc::POLLRDHUP,
            revents: 0,
        }));
        // SAFETY: polls the live descriptors of `pollfds`, which holds
        // exactly `len` entries, without waiting.
        let r = unsafe {
            libc::poll(
                self.pollfds.as_mut_ptr(),
                self.pollfds.len() as libc::nfds_t,
                0,
            )
        };
        let listener_ready = if r < 0 {
            // Unknown: accept and peek as without the poll.
            self.polled = false;
            true
        } else {
            self.polled = true;
            for (link, p) in self.links.iter_mut().zip(&self.pollfds[1..]) {
                link.suspect = p.revents != 0;
            }
            self.pollfds[0].revents != 0
        };
        if listener_ready {
            self.take_connections();
        }
        if !self.pending.is_empty() {
            self.read_hellos();
        }
        self.read_welcomes();
    }

    /// Moves new connections from the listener to `pending`, after the
    /// user check.
    fn take_connections(&mut self) {
        let Some(l) = &self.listener else { return };
        let mut refused = Vec::new();
        while let Ok((s, _)) = l.accept() {
            match check_peer_user(&s).and_then(|()| s.set_nonblocking(true).map_err(Into::into)) {
                Ok(()) => self.pending.push(PendingAccept {
                    sock: s,
                    since: std::time::Instant::now(),
                }),
                Err(e) => refused.push(format!("connection to {}: {e}", self.local)),
            }
        }
        for why in refused {
            self.refuse(why);
        }
    }

    /// Completes every pending connection whose hello arrived.
    fn read_hellos(&mut self) {
        for p in std::mem::take(&mut self.pending) {
            match accept_link(&p.sock, self.local, self.wake_fd) {
                Ok(Some(a)) => {
                    let link = Link::new(a.peer, a.map, false, Some(a.peer_wake), p.sock);
                    // The background thread may be asleep without having
                    // marked this ring: mark it and wake the thread.
                    link.rx.sleeping().store(1, Ordering::SeqCst);
                    poke(self.wake_fd);
                    self.install(link);
                }
                Ok(None) if p.since.elapsed() < HELLO_WAIT => self.pending.push(p),
                Ok(None) => self.refuse(format!(
                    "a peer connected to {} and sent no hello in {HELLO_WAIT:?}",
                    self.local
                )),
                Err(e) => self.refuse(format!("handshake with a peer of {}: {e}", self.local)),
            }
        }
    }

    /// Reads the welcome of each link this device made that awaits one.
    fn read_welcomes(&mut self) {
        let mut failed = Vec::new();
        let mut refusals = Vec::new();
        for (i, link) in self.links.iter_mut().enumerate() {
            if link.dead || (self.polled && !link.suspect) {
                continue;
            }
            if link.peer_wake.is_some() {
                // Grant messages; the end of the stream is `check_dead`'s.
                // Bounded, so a flooding peer cannot hold us here; what
                // is left keeps the socket readable for the next round.
                for _ in 0..32 {
                    match read_msg(&link.sock, 1) {
                        Ok(Some((m, fds))) => {
                            if let Err(e) = link.on_message(m, fds, &mut self.requests) {
                                refusals.push(format!("{}: {e}", link.peer));
                            }
                        }
                        Ok(None) => break,
                        Err(e) => {
                            if !e.refused {
                                link.dead = true;
                                self.links_gen += 1;
                            } else {
                                refusals.push(format!("{}: {e}", link.peer));
                            }
                            break;
                        }
                    }
                }
                continue;
            }
            match read_welcome(&link.sock, link.peer) {
                Ok(Some(wake)) => {
                    link.peer_wake = Some(wake);
                    // Packets sent before it came may wait in the ring.
                    if !link.tx.is_empty() {
                        link.tx.sleeping().store(1, Ordering::SeqCst);
                        link.wake_peer();
                    }
                }
                Ok(None) => {}
                Err(e) => failed.push((i, e)),
            }
        }
        for (i, e) in failed {
            let peer = self.links[i].peer;
            self.links[i].dead = true;
            self.links_gen += 1;
            // A peer that closed is gone (or kept the other of two links
            // made at once); only a bad handshake is a refusal.
            if e.refused {
                self.refuse(format!("handshake with {peer}: {e}"));
            }
        }
        for why in refusals {
            self.refuse(why);
        }
    }

    /// Adds a link, or settles which of two links to the same peer both
    /// sides keep: the one made by the lower address (both devices compare
    /// the same two links the same way). A link replaced is kept, dead,
    /// until what it received is taken.
    fn install(&mut self, link: Link) {
        let maker = |l: &Link, local: SocketAddr| if l.created_here { local } else { l.peer };
        let local = self.local;
        if let Some(old) = self
            .links
            .iter_mut()
            .find(|x| x.peer == link.peer && !x.dead)
        {
            let (m_old, m_new) = (maker(old, local), maker(&link, local));
            // Made by the same side: the newer one is a peer that started over.
            let keep_old = m_old != m_new
                && crate::linkmsg::addr_bytes(m_old) < crate::linkmsg::addr_bytes(m_new);
            if keep_old {
                return; // dropping `link` closes it; the peer drops its copy
            }
            old.dead = true;
        }
        self.counters.links += 1;
        self.links.push(link);
        self.links_gen += 1;
    }

    fn link_index(&mut self, dst: SocketAddr) -> Option<usize> {
        if let Some(i) = self.links.iter().position(|l| l.peer == dst && !l.dead) {
            return Some(i);
        }
        // A device's packets to itself (two contexts of one device in a
        // process, as rdma-core's tests make) loop back through its own UDP
        // socket, like a NIC's internal loopback: no link to oneself.
        if self.mode == Transport::Udp
            || dst == self.local
            || self
                .no_link
                .get(&dst)
                .is_some_and(|t| t.elapsed() < RETRY_LINK)
        {
            return None;
        }
        match connect_link(self.local, dst, self.wake_fd) {
            Ok(link) => {
                self.no_link.remove(&dst);
                // Our background thread may already be asleep without having
                // marked this new ring: mark it, and wake the thread so it
                // takes the link into account.
                link.rx.sleeping().store(1, Ordering::SeqCst);
                poke(self.wake_fd);
                self.install(link);
                self.await_welcome(dst);
                self.links.iter().position(|l| l.peer == dst && !l.dead)
            }
            Err(e) => {
                if e.refused {
                    self.refuse(format!("link to {dst}: {}", e.msg));
                }
                self.no_link.insert(dst, std::time::Instant::now());
                None
            }
        }
    }

    /// Gives a link just made a moment for the peer's welcome, so that what
    /// follows can use the peer's memory directly. Meanwhile this device
    /// answers connections itself: two devices linking to each other at
    /// the same moment each accept the other's while they wait, and settle
    /// on one link at once. Bounded by [`WELCOME_WAIT`]; the link works
    /// without the welcome anyway (packets wait in the ring).
    fn await_welcome(&mut self, dst: SocketAddr) {
        let t0 = std::time::Instant::now();
        while t0.elapsed() < WELCOME_WAIT {
            self.accept();
            let Some(l) = self.links.iter().find(|l| l.peer == dst && !l.dead) else {
                return;
            };
            if l.peer_wake.is_some() {
                return;
            }
            let mut fds = vec![l.sock.as_raw_fd()];
            fds.extend(self.listen_fd());
            let mut ready = Vec::new();
            crate::sys::wait_readable_any(
                &fds,
                Some(std::time::Duration::from_micros(200)),
                &mut ready,
            );
        }
    }

    /// Sends a packet over shared memory when `dst` is a same-host peer.
    /// Returns false when the packet must go over UDP instead.
    pub fn send(&mut self, src_port: u16, dst: SocketAddr, data: &[u8]) -> bool {
        // A datagram to a multicast group goes to the host's IP multicast
        // in every mode: the kernel keeps the group's members (every
        // device of this host joined to it gets a copy over loopback).
        if softrdma_engine::rules::is_multicast_ip(dst.ip()) {
            return false;
        }
        let Some(i) = self.link_index(dst) else {
            // shm-only mode: no UDP fallback; the packet is lost like on a
            // wire to nowhere (RC reports RETRY_EXC_ERR). A packet to this
            // device itself loops back over UDP in every mode.
            return self.mode == Transport::Shm && dst != self.local;
        };
        let link = &mut self.links[i];
        // Lossless like a credit-flow-controlled link: a full ring makes the
        // sender wait for the receiver (waking it), for a bounded time, so
        // UC and UD messages are not lost to a momentarily slow receiver.
        // Past the bound the packet is dropped (RC retransmits), so two
        // devices that fill each other's rings cannot deadlock.
        let mut waited: Option<std::time::Instant> = None;
        loop {
            let at = link
                .tx_next
                .unwrap_or_else(|| link.tx.tail().load(Ordering::Relaxed));
            if link.tx.write_at(at, src_port, data) {
                link.tx_next = Some(at.wrapping_add(1));
                self.unpublished = true;
                self.counters.tx_packets += 1;
                break;
            }
            // Full: what this batch wrote must reach the receiver first.
            if link.publish() {
                self.counters.wakeups_sent += 1;
            }
            let start = *waited.get_or_insert_with(std::time::Instant::now);
            if link.dead || start.elapsed() > RING_FULL_WAIT {
                self.counters.ring_full += 1;
                break;
            }
            if link.wake_peer() {
                self.counters.wakeups_sent += 1;
            }
            std::thread::yield_now();
        }
        true
    }

    /// Publishes the packets [`ShmHub::send`] wrote, link by link, waking
    /// peers that sleep: a batch (a request and the ACK that follows it
    /// out, a burst of posts) reaches the peer whole, in one receive, as
    /// one GSO datagram does over UDP. A receiver that woke on the first
    /// packet of a batch would otherwise take it alone, and see the
    /// completions of one answer in two progress rounds (an event-driven
    /// program that waits for them one by one on one channel, as
    /// perftest's `-e` does, then takes one for the other).
    pub fn flush(&mut self) {
        if !std::mem::take(&mut self.unpublished) {
            return;
        }
        for l in &mut self.links {
            if l.publish() {
                self.counters.wakeups_sent += 1;
            }
        }
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

    /// The index of the link to `dst` (made if need be), for the grant
    /// calls below; valid while [`ShmHub::links_gen`] stays the same.
    pub fn peer_link(&mut self, dst: SocketAddr) -> Option<usize> {
        let i = self.link_index(dst)?;
        self.links[i].peer_wake.is_some().then_some(i)
    }

    /// Enters the region granted under `rkey` through the peer's QP `qpn`
    /// on link `i`.
    pub fn enter(
        &self,
        i: usize,
        rkey: Rkey,
        qpn: Qpn,
    ) -> Result<crate::grant::Inside<'_>, crate::grant::NotGranted> {
        match self.links.get(i).filter(|l| !l.dead) {
            Some(l) => l.inn.enter(rkey, qpn),
            None => Err(crate::grant::NotGranted::Missing),
        }
    }

    /// Forgets a grant found revoked on link `i`.
    pub fn forget_grant(&mut self, i: usize, rkey: Rkey, qpn: Qpn) {
        if let Some(l) = self.links.get_mut(i) {
            l.inn.forget(rkey, qpn);
        }
    }

    /// Asks the peer of link `i` for a grant (unless asked lately); true
    /// when the request went out.
    pub fn ask_grant(&mut self, i: usize, req: crate::linkmsg::GrantRequest) -> bool {
        let Some(l) = self.links.get_mut(i).filter(|l| !l.dead) else {
            return false;
        };
        l.inn.ask(req.rkey, req.target_qpn)
            && send_msg(&l.sock, &crate::linkmsg::LinkMsg::GrantRequest(req), &[]).is_ok()
    }

    /// True when the peer of link `i` refused `rkey` through `qpn` lately.
    pub fn grant_refused(&self, i: usize, rkey: Rkey, qpn: Qpn) -> bool {
        self.links
            .get(i)
            .is_none_or(|l| l.dead || l.inn.was_refused(rkey, qpn))
    }

    /// The grant requests received since the last call.
    pub fn take_requests(&mut self) -> Vec<(SocketAddr, crate::linkmsg::GrantRequest)> {
        std::mem::take(&mut self.requests)
    }

    /// Answers a request from `peer`: grants `fd` (a region's memfd) with
    /// `facts` completed by a slot of the link's table, or refuses (`None`).
    pub fn answer(
        &mut self,
        peer: SocketAddr,
        req: crate::linkmsg::GrantRequest,
        grant: Option<(crate::linkmsg::Grant, RawFd)>,
    ) {
        let Some(l) = self.links.iter_mut().find(|l| l.peer == peer && !l.dead) else {
            return;
        };
        let refuse = crate::linkmsg::LinkMsg::Refuse {
            rkey: req.rkey,
            target_qpn: req.target_qpn,
            access: req.access,
        };
        let Some((mut g, fd)) = grant else {
            let _ = send_msg(&l.sock, &refuse, &[]);
            return;
        };
        let Some(out) = l.out.give(&req, (g.access, g.qp_access)) else {
            let _ = send_msg(&l.sock, &refuse, &[]);
            return;
        };
        (g.slot, g.gen) = (out.slot, out.gen);
        let _ = send_msg(&l.sock, &crate::linkmsg::LinkMsg::Grant(g), &[fd]);
    }

    /// Revokes every grant `which` selects (peer address, grant) on every
    /// link, and waits (bounded) until no operation of a peer is inside
    /// them. False when one still was at the deadline.
    pub fn revoke(
        &mut self,
        mut which: impl FnMut(SocketAddr, &crate::grant::OutGrant) -> bool,
    ) -> bool {
        let mut all = Vec::new();
        for (i, l) in self.links.iter_mut().enumerate() {
            let peer = l.peer;
            let slots = l.out.revoke(|g| which(peer, g));
            if !slots.is_empty() {
                all.push((i, slots));
            }
        }
        let deadline = std::time::Instant::now() + crate::grant::REVOKE_WAIT;
        all.iter()
            .all(|(i, slots)| self.links[*i].dead || self.links[*i].out.wait_left(slots, deadline))
    }

    /// Grants this device holds from peers, over all links.
    #[cfg(test)]
    pub fn grants_held(&self) -> usize {
        self.links.iter().map(|l| l.inn.held()).sum()
    }

    /// The grants standing on every link: (peer, grant).
    pub fn standing_grants(&self) -> Vec<(SocketAddr, crate::grant::OutGrant)> {
        self.links
            .iter()
            .filter(|l| !l.dead)
            .flat_map(|l| l.out.standing().map(move |g| (l.peer, *g)))
            .collect()
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
            let gone = r == 0
                || (r < 0
                    && !matches!(
                        io::Error::last_os_error().kind(),
                        io::ErrorKind::WouldBlock | io::ErrorKind::Interrupted
                    ));
            if gone && !l.dead {
                l.dead = true;
                self.links_gen += 1;
            }
        }
        self.links.retain(|l| !l.dead || !l.rx.is_empty());
    }
}

impl Drop for ShmHub {
    fn drop(&mut self) {
        // Our socket file only: a device at the same address in another
        // network namespace may have replaced it.
        if let Some(p) = &self.path {
            use std::os::unix::fs::MetadataExt;
            let ours =
                std::fs::symlink_metadata(p).is_ok_and(|m| Some((m.dev(), m.ino())) == self.inode);
            if ours {
                let _ = std::fs::remove_file(p);
            }
        }
        // Then the lock file (OwnerLock's drop), after the socket.
        self.owner.take();
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

// ----- the link handshake -----
//
// The connecting device makes the link's segment (both rings and both
// grant tables) and sends a HELLO with its address and, as SCM_RIGHTS, the
// segment's memfd and its wake-up eventfd. It does not wait: packets go
// into its ring at once. The accepting device answers with a WELCOME
// carrying its address and its eventfd. Messages are `linkmsg`'s, and
// everything in them and every descriptor is checked before use: the peer
// is another process, trusted for nothing.

/// Why a link could not be made.
#[derive(Debug)]
struct LinkError {
    msg: String,
    /// The peer or its socket failed a check (worth reporting), rather
    /// than simply not being there.
    refused: bool,
}

impl From<io::Error> for LinkError {
    fn from(e: io::Error) -> Self {
        LinkError {
            msg: e.to_string(),
            refused: false,
        }
    }
}

impl std::fmt::Display for LinkError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.msg)
    }
}

fn refused(msg: String) -> LinkError {
    LinkError { msg, refused: true }
}

/// The peer at the other end of `sock` runs as this user.
fn check_peer_user(sock: &UnixStream) -> Result<(), LinkError> {
    let (uid, pid) = crate::sys::peer_cred(sock.as_raw_fd())?;
    let me = crate::rundir::euid();
    if uid != me {
        return Err(refused(format!(
            "the peer (pid {pid}) runs as uid {uid}, not as this user (uid {me}); \
             peers of other users are reached over UDP"
        )));
    }
    Ok(())
}

/// A device socket file: a socket owned by this user.
fn check_socket_file(path: &std::path::Path) -> Result<(), LinkError> {
    use std::os::unix::fs::{FileTypeExt, MetadataExt};
    let m = std::fs::symlink_metadata(path)?;
    if !m.file_type().is_socket() {
        return Err(refused(format!("{} is not a socket", path.display())));
    }
    if m.uid() != crate::rundir::euid() {
        return Err(refused(format!(
            "{} belongs to uid {}, not to this user",
            path.display(),
            m.uid()
        )));
    }
    Ok(())
}

fn connect_link(local: SocketAddr, dst: SocketAddr, wake_fd: RawFd) -> Result<Link, LinkError> {
    let path = socket_path(dst);
    check_socket_file(&path)?;
    let sock = UnixStream::connect(&path)?;
    check_peer_user(&sock)?;
    sock.set_nonblocking(true)?;
    let (map, memfd) = Mapping::create(SEGMENT_LEN)?;
    send_msg(
        &sock,
        &LinkMsg::Hello { addr: local },
        &[memfd.as_raw_fd(), wake_fd],
    )?;
    Ok(Link::new(dst, map, true, None, sock))
}

/// Sends one message with its descriptors.
fn send_msg(sock: &UnixStream, m: &LinkMsg, fds: &[RawFd]) -> io::Result<()> {
    send_fds(sock, &m.to_bytes(), fds)
}

/// Reads one message with at most `max_fds` descriptors (`None` when
/// nothing has arrived yet). A malformed message is a refusal.
fn read_msg(
    sock: &UnixStream,
    max_fds: usize,
) -> Result<Option<(LinkMsg, Vec<OwnedFd>)>, LinkError> {
    // Exactly one message per read: the link is a stream socket, so two
    // messages sent back to back (both ends linking at once, as in a
    // bidirectional test) would arrive in one larger read and be refused
    // as "message of 65 bytes". A short read is still refused by `parse`.
    let mut msg = [0u8; MSG_LEN];
    let (n, fds) = match recv_fds(sock, &mut msg, max_fds) {
        Ok(r) => r,
        Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(None),
        // A reset is a close too: the peer closed with our messages
        // unread — it exited, or it dropped its copy of two links made at
        // once (`ShmHub::install`) — and is no refusal to report.
        Err(e)
            if matches!(
                e.kind(),
                io::ErrorKind::UnexpectedEof
                    | io::ErrorKind::ConnectionReset
                    | io::ErrorKind::BrokenPipe
            ) =>
        {
            return Err(LinkError {
                msg: "the peer closed the connection".into(),
                refused: false,
            })
        }
        Err(e) => return Err(refused(e.to_string())),
    };
    let m = LinkMsg::parse(&msg[..n]).map_err(refused)?;
    if fds.len() != m.fds() {
        return Err(refused(format!(
            "message kind {} came with {} descriptors, expected {}",
            m.kind(),
            fds.len(),
            m.fds()
        )));
    }
    Ok(Some((m, fds)))
}

impl Link {
    /// Handles a message on an established link.
    fn on_message(
        &mut self,
        m: LinkMsg,
        fds: Vec<OwnedFd>,
        requests: &mut Vec<(SocketAddr, crate::linkmsg::GrantRequest)>,
    ) -> Result<(), String> {
        match m {
            LinkMsg::GrantRequest(r) => {
                // Bounded: a peer asking without end cannot grow this.
                if requests.len() < 1024 {
                    requests.push((self.peer, r));
                }
                Ok(())
            }
            LinkMsg::Grant(g) => match fds.first() {
                Some(fd) => self.inn.install(g, fd),
                None => Err("a grant without its descriptor".into()),
            },
            LinkMsg::Refuse {
                rkey, target_qpn, ..
            } => {
                self.inn.refused(rkey, target_qpn);
                Ok(())
            }
            LinkMsg::Hello { .. } | LinkMsg::Welcome { .. } => {
                Err(format!("a second handshake (kind {})", m.kind()))
            }
        }
    }
}

/// What an accepted link is made of, besides its socket.
struct Accepted {
    peer: SocketAddr,
    map: Mapping,
    peer_wake: EventFd,
}

/// Accepts a link on `sock` if its hello has arrived (`None` if not yet),
/// and answers it.
fn accept_link(
    sock: &UnixStream,
    local: SocketAddr,
    wake_fd: RawFd,
) -> Result<Option<Accepted>, LinkError> {
    let Some((hello, fds)) = read_msg(sock, 2)? else {
        return Ok(None);
    };
    let LinkMsg::Hello { addr: peer } = hello else {
        return Err(refused(format!(
            "the first message is kind {}, not a hello",
            hello.kind()
        )));
    };
    let mut fds = fds.into_iter();
    let (Some(memfd), Some(peer_wake)) = (fds.next(), fds.next()) else {
        return Err(refused(format!(
            "{peer}: the hello carried too few descriptors"
        )));
    };
    check_sealed_memfd(&memfd, SEGMENT_LEN).map_err(|e| refused(format!("{peer}: {e}")))?;
    let peer_wake = check_eventfd(peer_wake).map_err(|e| refused(format!("{peer}: {e}")))?;
    let map = Mapping::map(&memfd, SEGMENT_LEN)?;
    send_msg(sock, &LinkMsg::Welcome { addr: local }, &[wake_fd])?;
    Ok(Some(Accepted {
        peer,
        map,
        peer_wake,
    }))
}

/// The peer's welcome on a link this device made, if it has arrived: the
/// peer's eventfd.
fn read_welcome(sock: &UnixStream, peer: SocketAddr) -> Result<Option<EventFd>, LinkError> {
    let Some((w, fds)) = read_msg(sock, 1)? else {
        return Ok(None);
    };
    let LinkMsg::Welcome { addr } = w else {
        return Err(refused(format!(
            "the answer is kind {}, not a welcome",
            w.kind()
        )));
    };
    if addr != peer {
        return Err(refused(format!(
            "the device listening for {peer} says it is {addr}"
        )));
    }
    let Some(wake) = fds.into_iter().next() else {
        return Err(refused("the welcome carried no eventfd".into()));
    };
    Ok(Some(check_eventfd(wake).map_err(refused)?))
}

/// A descriptor from a peer that must be a memfd of exactly `len` bytes
/// whose size is sealed (see [`crate::sys::SIZE_SEALS`]).
pub(crate) fn check_sealed_memfd(fd: &OwnedFd, len: usize) -> Result<(), String> {
    // SAFETY: fcntl on a descriptor we own; no pointer arguments.
    let seals = unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_GET_SEALS) };
    if seals < 0 {
        return Err("a shared segment is not a sealable memfd".into());
    }
    if seals & crate::sys::SIZE_SEALS != crate::sys::SIZE_SEALS {
        return Err("a shared segment's size is not sealed (it could shrink under us)".into());
    }
    let size = crate::sys::fd_size(fd.as_raw_fd()).map_err(|e| e.to_string())?;
    if size != len as u64 {
        return Err(format!("a shared segment is {size} bytes, expected {len}"));
    }
    Ok(())
}

/// A descriptor from a peer that must be an eventfd; made non-blocking so
/// that signalling it can never block us.
fn check_eventfd(fd: OwnedFd) -> Result<EventFd, String> {
    let link = std::fs::read_link(format!("/proc/self/fd/{}", fd.as_raw_fd()))
        .map_err(|e| format!("cannot inspect the peer's wake-up descriptor: {e}"))?;
    if link.as_os_str() != "anon_inode:[eventfd]" {
        return Err(format!(
            "the peer's wake-up descriptor is {}, not an eventfd",
            link.display()
        ));
    }
    crate::sys::set_nonblocking(fd.as_raw_fd()).map_err(|e| e.to_string())?;
    Ok(EventFd::from_owned(fd))
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
    // SAFETY: msg describes live buffers. MSG_NOSIGNAL: a peer that is
    // gone gives EPIPE, never SIGPIPE.
    let n = unsafe { libc::sendmsg(sock.as_raw_fd(), &msg, libc::MSG_NOSIGNAL) };
    if n < 0 {
        return Err(io::Error::last_os_error());
    }
    if n as usize != data.len() {
        return Err(io::Error::other("short send of a handshake"));
    }
    Ok(())
}

/// Receives one message and at most `max_fds` descriptors (more are closed,
/// and so are descriptors of a truncated control message). Returns the
/// message length and the descriptors.
fn recv_fds(
    sock: &UnixStream,
    data: &mut [u8],
    max_fds: usize,
) -> io::Result<(usize, Vec<OwnedFd>)> {
    let mut iov = libc::iovec {
        iov_base: data.as_mut_ptr().cast(),
        iov_len: data.len(),
    };
    // Room for more than allowed, so that extra descriptors are received
    // (and closed) rather than left to truncate the message.
    let fd_bytes = (max_fds + 8) * std::mem::size_of::<RawFd>();
    // SAFETY: pure computation.
    let space = unsafe { libc::CMSG_SPACE(fd_bytes as u32) } as usize;
    let mut cbuf = vec![0u64; space.div_ceil(8)];
    // SAFETY: all-zero msghdr is valid; we fill the fields used.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    msg.msg_control = cbuf.as_mut_ptr().cast();
    msg.msg_controllen = space;
    // SAFETY: msg describes live buffers; MSG_CMSG_CLOEXEC marks received
    // fds; MSG_DONTWAIT: the socket may be blocking (a peer's choice is not
    // ours to trust), and this never waits.
    let n = unsafe {
        libc::recvmsg(
            sock.as_raw_fd(),
            &mut msg,
            libc::MSG_CMSG_CLOEXEC | libc::MSG_DONTWAIT,
        )
    };
    if n < 0 {
        return Err(io::Error::last_os_error());
    }
    let mut out = Vec::new();
    // SAFETY: walking the control messages the kernel wrote into cbuf;
    // each SCM_RIGHTS descriptor is a fresh one now owned by us.
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
    if n == 0 && out.is_empty() {
        return Err(io::Error::from(io::ErrorKind::UnexpectedEof));
    }
    if msg.msg_flags & (libc::MSG_CTRUNC | libc::MSG_TRUNC) != 0 || out.len() > max_fds {
        return Err(io::Error::other(
            "a handshake with too many descriptors or too long",
        ));
    }
    Ok((n as usize, out))
}

#[cfg(test)]
#[path = "shm_hostile_tests.rs"]
mod hostile_tests;
