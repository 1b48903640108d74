//! The UDP driver: one UDP socket per device carrying byte-exact RoCEv2, and
//! the progress engine that moves packets between it and the sans-I/O
//! [`Engine`].
//!
//! Progress happens in two places. Application calls (`post_*`, `poll_cq`)
//! run it inline under the device lock, so a polling application gets its
//! packets with no thread hand-off. A background thread sleeps in the kernel
//! (`ppoll` on the socket and a wake-up eventfd, with the engine's next
//! timer as timeout) and runs it when packets arrive while the application
//! is not polling, so one-sided operations reach a target that is asleep or
//! busy, and retransmission timers fire. While the application polls, the
//! thread stays out of its way: at most one busy thread per process.

use std::collections::{HashMap, VecDeque};
use std::io;
use std::net::{SocketAddr, UdpSocket};
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, Weak};
use std::thread::JoinHandle;
use std::time::Duration;

use softrdma_engine::{
    AccessFlags, Counters, DirectOp, DirectPlan, Engine, EngineConfig, Event, Instant, Mtu, PeerQp,
    PeerRegion, PeerView, QpState, SendOp, SendWr, SrcPortPolicy, Transmit,
};
use softrdma_pcap::{SharedPcapWriter, Timestamp};
use softrdma_wire::{icrc, Endpoints};

use crate::config::{auto_loopback_candidates, Bind, DeviceConfig};
use crate::fault::FaultInjector;
use crate::segment::{atomic_at, Segment};
use crate::shm::ShmHub;
use crate::sys::{self, EventFd};
use crate::Error;

/// Largest packet: 4096 payload + headers + ICRC, with room to spare.
const BUF_LEN: usize = 4096 + 256;
/// After this many empty reads, inline progress reads the UDP socket only
/// every this many calls (the background thread still wakes on it).
const UDP_IDLE_POLLS: u32 = 64;
/// Datagrams per `recvmmsg`.
const RX_BATCH: usize = 32;
/// Received packets after which progress sends what they produced, even
/// in the middle of a receive batch.
const TX_EARLY: usize = 32;
/// Packets per `sendmmsg`: a whole window (`max_inflight`), so that with
/// GSO a burst leaves in few system calls and few short runs.
const TX_BATCH: usize = 128;
/// The background thread leaves the device to an application that polled this recently.
const APP_ACTIVE: Duration = Duration::from_micros(100);
/// How long the first direct operation on a region waits for its grant.
const GRANT_WAIT: Duration = Duration::from_millis(2);
/// How long a lone ACK may wait for a request to ride out with (`EngineConfig::ack_delay_ns`).
const ACK_DELAY: Duration = Duration::from_micros(32);

/// Counters of the driver itself (the engine counts the protocol).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct DriverCounters {
    /// Datagrams that could not be sent (the engine retransmits RC).
    pub send_errors: u64,
    /// Packets altered or dropped by fault injection.
    pub faults_injected: u64,
    /// Times the background thread ran progress.
    pub background_wakeups: u64,
    /// WRITE/READ/atomics executed directly in a same-host peer's memory.
    pub direct_ops: u64,
    /// Sends that carried several datagrams at once (UDP GSO).
    pub gso_sends: u64,
    /// Received buffers that held several datagrams (UDP GRO).
    pub gro_buffers: u64,
}

/// Completion channel state shared with the device.
#[derive(Debug)]
pub(crate) struct ChannelShared {
    pub fd: EventFd,
    pub ready: Mutex<VecDeque<u32>>,
}

pub(crate) struct State {
    pub engine: Engine,
    rx: sys::RecvBatch,
    tx: TxBatch,
    send_socks: crate::keymap::KeyMap<u16, Option<UdpSocket>>,
    /// Whether sends to loopback peers may use UDP GSO (cleared for good
    /// when the kernel refuses it).
    gso: bool,
    capture: Option<SharedPcapWriter>,
    fault: Option<FaultInjector>,
    pub channels: HashMap<u32, Arc<ChannelShared>>,
    pub async_events: VecDeque<Event>,
    pub driver: DriverCounters,
    pub shm: ShmHub,
    /// Regions of this device a same-host peer may be granted, by rkey.
    pub regions: crate::keymap::KeyMap<u32, SharedRegion>,
    /// Inline progress calls so far, and how many UDP reads in a row found nothing.
    polls: u32,
    udp_idle: u32,
    /// Polls answered from the CQ alone (no progress), for `last_app_poll`.
    app_polls: u32,
    /// Idle polls in a row (see `poll_progress`).
    idle_polls: u32,
    /// What `try_direct` looked up per QP (by QPN modulo their number).
    routes: [Option<DirectRoute>; DIRECT_ROUTES],
    /// Advanced by every use of the state that may change a QP, a local
    /// region or a link (see [`Device::lock`]); a route from another
    /// epoch is looked up again.
    routes_epoch: u64,
}

impl State {
    /// Makes `try_direct` look up every route again (see `routes_epoch`).
    pub fn forget_routes(&mut self) {
        self.routes_epoch = self.routes_epoch.wrapping_add(1);
    }
}

/// Routes `try_direct` keeps (one per QPN modulo this).
const DIRECT_ROUTES: usize = 8;

/// Where a QP's direct operations go, kept between operations: the link
/// to its destination. Valid while the state's `routes_epoch` and the shm
/// hub's `links_gen` are those it was made under. Everything else —
/// the initiator's rules and the grant — is checked on every operation.
#[derive(Clone, Copy)]
struct DirectRoute {
    qpn: u32,
    epoch: u64,
    links_gen: u64,
    /// Index of the link to the QP's destination.
    link: usize,
    /// The engine's last plan on this QP: `Engine::replan_direct` reuses
    /// what it found about the QP and its local region while the epoch
    /// says nothing changed them.
    plan: DirectPlan,
}

/// A region of this device in a segment of its own (`segment.rs`), which
/// a same-host peer may be granted.
#[derive(Debug, Clone)]
pub(crate) struct SharedRegion {
    pub seg: Arc<Segment>,
    /// Where the byte at the region's iova is in the segment.
    pub offset: u64,
}

/// One open device.
pub(crate) struct Device {
    pub name: String,
    pub addr: SocketAddr,
    pub active_mtu: Mtu,
    pub link_mtu: u32,
    state: Mutex<State>,
    /// Whether `try_direct` can ever succeed (not UDP-only): set at open, so
    /// that a post on a UDP device takes the lock only once.
    direct: bool,
    sock: UdpSocket,
    wake: EventFd,
    pub async_fd: EventFd,
    stop: AtomicBool,
    origin: std::time::Instant,
    last_app_poll: AtomicU64,
    sleeping_until: AtomicU64,
    thread: Mutex<Option<JoinHandle<()>>>,
}

fn bind_socket(addr: SocketAddr) -> io::Result<UdpSocket> {
    let s = UdpSocket::bind(addr)?;
    if addr.is_ipv4() {
        sys::set_dont_fragment(&s)?;
    }
    Ok(s)
}

/// Active MTU for a link MTU: minus 80 bytes of headers, rounded down to an IB MTU.
pub fn active_mtu_for(link_mtu: u32) -> Mtu {
    let room = link_mtu.saturating_sub(80);
    [Mtu::Mtu4096, Mtu::Mtu2048, Mtu::Mtu1024, Mtu::Mtu512]
        .into_iter()
        .find(|m| m.bytes() <= room)
        .unwrap_or(Mtu::Mtu256)
}

fn os_seed() -> u64 {
    let mut b = [0u8; 8];
    if let Ok(mut f) = std::fs::File::open("/dev/urandom") {
        use std::io::Read;
        let _ = f.read_exact(&mut b);
    }
    u64::from_ne_bytes(b)
        ^ std::process::id() as u64
        ^ std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos() as u64)
}

impl Device {
    pub fn open(cfg: &DeviceConfig) -> Result<Arc<Device>, Error> {
        let sock = match &cfg.bind {
            Bind::Addr(a) => bind_socket(*a)
                .map_err(|e| Error::Io(format!("device {}: cannot bind UDP {a}: {e}", cfg.name)))?,
            Bind::AutoLoopback { port } => auto_loopback_candidates(*port)
                .find_map(|a| bind_socket(a).ok())
                .ok_or_else(|| {
                    Error::Io(format!(
                        "device {}: no free address in 127.0.0.1-254 on UDP port {port}",
                        cfg.name
                    ))
                })?,
        };
        sock.set_nonblocking(true)
            .map_err(|e| Error::Io(e.to_string()))?;
        sys::set_buffers(&sock, 8 << 20);
        // Coalesced receives cost nothing when unused; GSO sends only when
        // the kernel knows them and the configuration allows them.
        sys::enable_gro(&sock);
        let gso = cfg.gso && sys::gso_available(&sock);
        let addr = sock.local_addr().map_err(|e| Error::Io(e.to_string()))?;
        let link_mtu = sys::link_mtu(addr.ip());
        let active_mtu = active_mtu_for(link_mtu);
        let mut ec = EngineConfig::new(addr);
        ec.remote_port = addr.port();
        ec.src_port = SrcPortPolicy::PerQp;
        ec.seed = cfg.seed.unwrap_or_else(os_seed);
        // Keys and QPNs from the engine's CSPRNG, seeded by the OS unless a
        // seed is configured (tests that want a repeatable run).
        if cfg.seed.is_none() {
            let mut k = [0u8; 32];
            getrandom::fill(&mut k)
                .map_err(|e| Error::Io(format!("device {}: no OS randomness: {e}", cfg.name)))?;
            ec.key_seed = Some(k);
        }
        ec.active_mtu = active_mtu;
        ec.max_inflight = 128;
        // Peers on a real wire (Linux rxe) send IPv4 with non-zero IDs.
        ec.recover_ipv4_id = true;
        // A ping-pong's ACK rides out with the answer: one send per turn
        // instead of two, and the peer, polling for its send completion,
        // receives the answer in the same batch (an application spinning
        // on memory, like perftest, then needs no background wake-up). The
        // delay stays below any usable ACK timeout (timeout 4 = 65 µs).
        ec.ack_delay_ns = ACK_DELAY.as_nanos() as u64;
        ec.limits.gid_table_len = 1;
        let capture = match &cfg.capture {
            Some(p) => Some(
                SharedPcapWriter::create(p)
                    .map_err(|e| Error::Io(format!("capture {}: {e}", p.display())))?,
            ),
            None => None,
        };
        let io = |e: io::Error| Error::Io(e.to_string());
        let wake = EventFd::new(true).map_err(io)?;
        let shm = match ShmHub::new(cfg.transport, addr, wake.as_raw_fd()) {
            Ok(hub) => hub,
            Err(e) if cfg.transport == crate::shm::Transport::Shm => {
                return Err(Error::Io(format!(
                    "device {}: the same-host transport cannot start: {e}",
                    cfg.name
                )))
            }
            Err(e) => {
                eprintln!(
                    "softrdma: device {}: same-host peers over UDP only: {e}",
                    cfg.name
                );
                ShmHub::udp_only(addr, wake.as_raw_fd())
            }
        };
        let direct = shm.mode != crate::shm::Transport::Udp;
        let dev = Arc::new(Device {
            name: cfg.name.clone(),
            direct,
            addr,
            active_mtu,
            link_mtu,
            state: Mutex::new(State {
                engine: Engine::new(ec),
                rx: sys::RecvBatch::new(RX_BATCH, 65536),
                tx: TxBatch::new(),
                send_socks: Default::default(),
                gso,
                capture,
                fault: cfg.fault.map(FaultInjector::new),
                channels: HashMap::new(),
                async_events: VecDeque::new(),
                driver: DriverCounters::default(),
                shm,
                regions: Default::default(),
                polls: 0,
                udp_idle: 0,
                app_polls: 0,
                idle_polls: 0,
                routes: [None; DIRECT_ROUTES],
                routes_epoch: 0,
            }),
            sock,
            wake,
            async_fd: EventFd::new(true).map_err(io)?,
            stop: AtomicBool::new(false),
            origin: std::time::Instant::now(),
            last_app_poll: AtomicU64::new(0),
            sleeping_until: AtomicU64::new(u64::MAX),
            thread: Mutex::new(None),
        });
        let d = dev.clone();
        let h = std::thread::Builder::new()
            .name(format!("softrdma-{}", cfg.name))
            .spawn(move || d.background())
            .map_err(io)?;
        *dev.thread.lock().unwrap_or_else(|e| e.into_inner()) = Some(h);
        register_for_exit(&dev);
        Ok(dev)
    }

    /// Whether this device can execute operations directly in same-host
    /// peers' memory (its transport is not UDP only).
    pub fn direct(&self) -> bool {
        self.direct
    }

    /// Engine time now.
    pub fn now(&self) -> Instant {
        Instant(self.origin.elapsed().as_nanos() as u64)
    }

    /// The device state, for anything: what `try_direct` remembered is
    /// forgotten, since the holder may change a QP, a region or a link.
    pub fn lock(&self) -> MutexGuard<'_, State> {
        let mut st = self.lock_keeping_routes();
        st.routes_epoch = st.routes_epoch.wrapping_add(1);
        st
    }

    /// The device state, for a holder that changes no QP, local region or
    /// link, or that advances `routes_epoch` itself when it does.
    fn lock_keeping_routes(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Runs `f` on the engine, then progress; wakes the background thread if
    /// a timer is now due earlier than it planned to sleep.
    pub fn with_engine<R>(&self, f: impl FnOnce(&mut Engine, Instant) -> R) -> R {
        let now = self.now();
        let mut st = self.lock();
        let r = f(&mut st.engine, now);
        // Send what `f` queued first: a read of the socket before it would
        // put a system call between a post and its packet. Then receive as
        // a poll does: a program busy posting consumes its ACKs itself
        // instead of waking the background thread for each of them.
        self.transmit(&mut st, now);
        self.progress(&mut st, now);
        let next = st.engine.poll_timeout().map_or(u64::MAX, |t| t.0);
        drop(st);
        if next < self.sleeping_until.load(Ordering::Acquire) {
            self.wake.signal();
        }
        r
    }

    /// Inline progress for a polling application, around a poll of its own.
    ///
    /// `pre` runs first: when it finds work already waiting (`Some`), that is
    /// the answer and nothing else runs, as hardware's `poll_cq` only reads
    /// the CQ. Otherwise progress runs and `post` gives the answer.
    ///
    /// Progress is cheap when nothing can be pending — a same-host peer is
    /// linked, the UDP socket has been idle (so progress would skip reading
    /// it anyway), no timer is armed, no fault injection, empty rings: the
    /// poll then checks the rings and returns, with no clock read and no
    /// system call. Every `IDLE_FULL_POLLS`-th poll still runs full
    /// progress, reading the UDP socket and looking for new links and dead
    /// peers.
    ///
    /// `mark_app` tells the background thread that the application is
    /// polling (`last_app_poll`); the time stored is read at most
    /// `IDLE_FULL_POLLS` polls apart, far inside `APP_ACTIVE` while the
    /// application polls in a loop.
    pub fn poll_progress<C, R>(
        &self,
        mark_app: bool,
        c: &mut C,
        pre: impl FnOnce(&mut State, &mut C) -> Option<R>,
        post: impl FnOnce(&mut State, &mut C) -> R,
    ) -> R {
        // `pre` and `post` poll a CQ or take events; progress below, which
        // may change a QP or a link, forgets the routes itself.
        let mut st = self.lock_keeping_routes();
        if let Some(r) = pre(&mut st, c) {
            st.app_polls = st.app_polls.wrapping_add(1);
            // Often enough that the background thread, which leaves the
            // device alone for APP_ACTIVE after a mark, never mistakes a
            // program busy collecting completions for an idle one.
            if mark_app && st.app_polls.is_multiple_of(8) {
                self.last_app_poll.store(self.now().0, Ordering::Release);
            }
            return r;
        }
        /// While idle, one poll in this many runs full progress (about
        /// every 10 µs of a polling loop): its system calls (the UDP read,
        /// the listener and peer sockets) took a quarter of an idle
        /// loop's time at one in 64, delaying the notice of a peer's WRITE.
        const IDLE_FULL_POLLS: u32 = 256;
        let idle = st.shm.has_links()
            && st.udp_idle >= UDP_IDLE_POLLS
            && st.fault.is_none()
            && !st.shm.rx_pending()
            && st.engine.poll_timeout().is_none();
        st.idle_polls = if idle {
            st.idle_polls.wrapping_add(1)
        } else {
            0
        };
        if !idle || st.idle_polls.is_multiple_of(IDLE_FULL_POLLS) {
            if idle {
                // Make this progress the one that reads the idle UDP socket.
                st.polls |= UDP_IDLE_POLLS - 1;
            }
            let now = self.now();
            if mark_app {
                self.last_app_poll.store(now.0, Ordering::Release);
            }
            st.forget_routes();
            self.progress(&mut st, now);
            // A polling application's background thread wakes on its own
            // within the APP_ACTIVE window and runs due timers then; waking
            // it for every held ACK would cost the poller a context switch
            // per message.
            if !mark_app {
                let next = st.engine.poll_timeout().map_or(u64::MAX, |t| t.0);
                if next < self.sleeping_until.load(Ordering::Acquire) {
                    self.wake.signal();
                }
            }
        }
        post(&mut st, c)
    }

    /// Receives what is waiting, runs timers, sends what is ready, routes events.
    fn progress(&self, st: &mut State, now: Instant) {
        self.progress_with(st, now, false)
    }

    /// `force_udp` reads the socket even when it has been idle: the
    /// background thread passes it because it wakes on socket readability.
    /// Inline progress skips most reads of an idle socket, so polling a
    /// shared-memory peer costs no system call.
    fn progress_with(&self, st: &mut State, now: Instant, force_udp: bool) {
        let local = self.addr;
        st.polls = st.polls.wrapping_add(1);
        // Skipping reads of an idle socket only pays when a same-host peer is
        // what the application talks to; a UDP-only device always reads.
        let read_udp = force_udp
            || !st.shm.has_links()
            || st.udp_idle < UDP_IDLE_POLLS
            || st.polls.is_multiple_of(UDP_IDLE_POLLS);
        for _ in 0..16 {
            let got = if read_udp { st.rx.recv(&self.sock) } else { 0 };
            let mut since_tx = 0;
            for i in 0..got {
                let State {
                    engine,
                    rx,
                    capture,
                    fault,
                    driver,
                    ..
                } = &mut *st;
                let Some((src, buf, seg)) = rx.get(i) else {
                    continue;
                };
                if seg < buf.len() {
                    driver.gro_buffers += 1;
                }
                // One RoCE packet per datagram, however many GRO coalesced.
                for data in sys::segments(buf, seg) {
                    since_tx += 1;
                    if let Some(c) = capture {
                        let _ = c.write_roce(Timestamp::now(), src, local, data);
                    }
                    match fault {
                        Some(f) => {
                            let before = f.injected;
                            f.apply(src, data, |s, d| {
                                engine.handle_packet(now, Endpoints::new(s, local), d)
                            });
                            driver.faults_injected += f.injected - before;
                        }
                        None => engine.handle_packet(now, Endpoints::new(src, local), data),
                    }
                }
                // A full receive batch can hold a whole window of packets:
                // send what they produced (ACKs, READ responses) as it
                // comes, so the peer's next window overlaps with this one.
                if since_tx >= TX_EARLY && i + 1 < got {
                    since_tx = 0;
                    self.transmit(st, now);
                }
            }
            if got == 0 {
                let State { engine, fault, .. } = &mut *st;
                if let Some(f) = fault {
                    f.flush(|s, d| engine.handle_packet(now, Endpoints::new(s, local), d));
                }
            }
            let shm_got = {
                let State {
                    engine,
                    shm,
                    capture,
                    ..
                } = &mut *st;
                if read_udp {
                    // New same-host peers wait for this; cheap enough at the UDP cadence.
                    shm.accept();
                    shm.check_dead();
                }
                shm.receive(RX_BATCH, |src, d| {
                    if let Some(c) = capture {
                        let _ = c.write_roce(Timestamp::now(), src, local, d);
                    }
                    engine.handle_packet(now, Endpoints::new(src, local), d)
                })
            };
            if got > 0 {
                st.udp_idle = 0;
            } else if read_udp {
                st.udp_idle = st.udp_idle.saturating_add(1);
            }
            if read_udp {
                Self::answer_grants(st);
            }
            st.engine.handle_timeout(now);
            self.transmit(st, now);
            if !(got > 0 && st.rx.full()) && shm_got < RX_BATCH {
                break;
            }
        }
        self.route_events(st);
    }

    fn transmit(&self, st: &mut State, now: Instant) {
        loop {
            let State { engine, tx, .. } = &mut *st;
            while tx.n < TX_BATCH {
                let slot = tx.slot_mut(tx.n);
                // Payloads stay in their regions where possible and go to
                // the kernel from there (see `flush_tx`): one copy fewer.
                let Some(t) = engine.poll_transmit_gather(now, slot) else {
                    break;
                };
                tx.meta[tx.n] = (t.endpoints, t.len);
                tx.tx[tx.n] = t;
                tx.n += 1;
            }
            if tx.n == 0 {
                return;
            }
            let full = tx.n == TX_BATCH;
            self.flush_tx(st);
            if !full {
                return;
            }
        }
    }

    /// Sends the batched packets, one `sendmmsg` per run of equal source ports.
    ///
    /// A packet whose payload the engine left in its region
    /// ([`softrdma_engine::Transmit::payload`]) goes as three pieces —
    /// headers, the payload read in place, pad and ICRC — that the kernel
    /// gathers into one datagram (and, with GSO, into one stream cut at
    /// the segment size, so datagrams stay exactly as built). Paths that
    /// need a packet whole (the shared-memory rings, a capture, resealing
    /// for another source port) first copy the payload into its slot.
    fn flush_tx(&self, st: &mut State) {
        let State {
            engine,
            tx,
            send_socks,
            capture,
            driver,
            shm,
            gso,
            ..
        } = &mut *st;
        let mut n = std::mem::take(&mut tx.n);
        if shm.mode != crate::shm::Transport::Udp {
            // Same-host peers take the shared-memory path; the rest stay for UDP.
            let mut keep = 0;
            for i in 0..n {
                tx.make_whole(engine, i);
                let (ep, len) = tx.meta[i];
                let sent = shm.send(ep.src.port(), ep.dst, &tx.slot_mut(i)[..len]);
                if sent {
                    if let Some(c) = capture {
                        let _ =
                            c.write_roce(Timestamp::now(), ep.src, ep.dst, &tx.slot_mut(i)[..len]);
                    }
                } else {
                    if keep != i {
                        tx.data
                            .copy_within(i * BUF_LEN..i * BUF_LEN + len, keep * BUF_LEN);
                        tx.meta[keep] = tx.meta[i];
                        tx.tx[keep] = tx.tx[i];
                    }
                    keep += 1;
                }
            }
            n = keep;
        }
        let mut start = 0;
        while start < n {
            let port = tx.meta[start].0.src.port();
            let mut end = start + 1;
            while end < n && tx.meta[end].0.src.port() == port {
                end += 1;
            }
            let sock = send_socks
                .entry(port)
                .or_insert_with(|| bind_socket(SocketAddr::new(self.addr.ip(), port)).ok());
            let use_main = sock.is_none();
            if use_main {
                // That source port is taken on this host: send from the
                // device port instead, resealing the ICRC that covers it.
                for i in start..end {
                    tx.make_whole(engine, i);
                    let (mut ep, len) = tx.meta[i];
                    ep.src = self.addr;
                    let _ = icrc::seal(&ep, &mut tx.slot_mut(i)[..len]);
                    tx.meta[i].0 = ep;
                }
            }
            // This thread's kept (empty) list, borrowing `tx` for this send only.
            let mut pkts: Vec<sys::Datagram<'_>> = DGRAMS.take();
            pkts.extend((start..end).map(|i| tx.datagram(i)));
            let s = sock.as_ref().unwrap_or(&self.sock);
            // GSO only towards loopback peers. Where a device splits a GSO
            // send (a NIC, or veth into a socket without GRO), the kernel
            // numbers the IPv4 IDs of the pieces, but the ICRCs were
            // computed for ID 0 (and rxe checks them against the real
            // header); on loopback no receiving socket sees the IP header.
            let lo = pkts.iter().all(|d| d.dst.ip().is_loopback());
            let mut use_gso = *gso && lo;
            let (sent, gso_msgs) = sys::send_batch(s, &pkts, &mut use_gso).unwrap_or((0, 0));
            driver.gso_sends += gso_msgs as u64;
            if lo && !use_gso {
                // The kernel refused: plain sends from now on.
                *gso = false;
            }
            driver.send_errors += (pkts.len() - sent) as u64;
            // Back to an empty list of the longer lifetime: the filter_map
            // changes the lifetime (a filter could not) and, yielding
            // nothing, its collect reuses the allocation in place.
            #[allow(clippy::unnecessary_filter_map)]
            let empty = pkts.into_iter().filter_map(|_| None).collect();
            DGRAMS.set(empty);
            if let Some(c) = capture {
                for i in start..start + sent {
                    tx.make_whole(engine, i);
                    let ep = tx.meta[i].0;
                    let _ = c.write_roce(Timestamp::now(), ep.src, ep.dst, tx.packet(i));
                }
            }
            start = end;
        }
    }

    fn route_events(&self, st: &mut State) {
        while let Some(ev) = st.engine.poll_event() {
            match ev {
                Event::Completion { cq } => {
                    if let Some(ch) = st.channels.get(&cq) {
                        ch.ready
                            .lock()
                            .unwrap_or_else(|e| e.into_inner())
                            .push_back(cq);
                        ch.fd.signal();
                    }
                }
                other => {
                    // A QP or CQ went to error.
                    st.forget_routes();
                    if let Event::QpFatal { qpn } = other {
                        Self::revalidate_grants(st, Some(qpn));
                    }
                    st.async_events.push_back(other);
                    self.async_fd.signal();
                }
            }
        }
    }

    /// Executes an RDMA WRITE, READ or atomic directly in a same-host peer's
    /// memory when that is exactly what the engine would do: the QP is RTS
    /// with nothing outstanding, the local SGEs are in regions of this
    /// device with an address, and the peer granted this QP the target
    /// region (`grant.rs`; the first operations on a region ask for the
    /// grant and go through the engine). Returns false to let the engine
    /// handle the WR instead (which also produces every error completion).
    pub fn try_direct(&self, qpn: u32, wr: &SendWr) -> bool {
        let one_sided = matches!(
            wr.op,
            SendOp::Write { .. }
                | SendOp::Read { .. }
                | SendOp::CompareSwap { .. }
                | SendOp::FetchAdd { .. }
        );
        if !self.direct || !one_sided {
            return false;
        }
        let mut guard_st = self.lock_keeping_routes();
        let st = &mut *guard_st;
        // The initiator's rules, and where the local bytes are: a full plan
        // on a new route, else the last plan's QP and region reused (the
        // route's epoch says nothing changed them). Filled in place:
        // moving a plan just written stalled on store forwarding.
        // Planned in place in the route (a plan is a few hundred bytes:
        // copying it in and out cost more than the lookups it saves).
        let slot = qpn as usize % DIRECT_ROUTES;
        let (epoch, links_gen) = (st.routes_epoch, st.shm.links_gen());
        match &mut st.routes[slot] {
            Some(r) if r.qpn == qpn && r.epoch == epoch && r.links_gen == links_gen => {
                if st.engine.replan_direct(qpn, wr, &mut r.plan).is_err() {
                    return false;
                }
            }
            _ => {
                let mut planned = DirectPlan::new();
                if st.engine.plan_direct_into(qpn, wr, &mut planned).is_err() {
                    return false;
                }
                let Some(r) = Self::look_up_route(st, qpn, &planned) else {
                    return false;
                };
                st.routes[slot] = Some(r);
            }
        }
        let Some(route) = &st.routes[slot] else {
            return false;
        };
        let (link, rkey, dest_qpn) = (route.link, route.plan.rkey(), route.plan.dest_qpn());
        let access = route.plan.access();
        // At most two tries: the second after asking for a missing grant.
        for attempt in 0..2 {
            let State {
                routes,
                shm,
                engine,
                ..
            } = &*st;
            let Some(route) = &routes[slot] else {
                return false;
            };
            let done = match shm.enter(link, rkey, dest_qpn) {
                Ok(inside) => Ok(execute_direct(engine, &inside, &route.plan)),
                Err(e) => Err(e),
            };
            match done {
                Ok(true) => break,
                Ok(false) => return false,
                Err(crate::grant::NotGranted::Missing) if attempt == 0 => {
                    let req = crate::linkmsg::GrantRequest {
                        rkey,
                        requester_qpn: qpn,
                        target_qpn: dest_qpn,
                        access: access.bits(),
                    };
                    if !st.shm.ask_grant(link, req) || !Self::await_grant(st, &req, link) {
                        return false;
                    }
                }
                Err(crate::grant::NotGranted::Missing) => return false,
                Err(crate::grant::NotGranted::Revoked) => {
                    st.shm.forget_grant(link, rkey, dest_qpn);
                    return false;
                }
            }
        }
        let State {
            routes,
            engine,
            driver,
            ..
        } = &mut *st;
        let Some(route) = &routes[slot] else {
            return false;
        };
        driver.direct_ops += 1;
        engine.complete_direct(&route.plan);
        // An armed CQ's completion event goes out now, not at the next progress.
        self.route_events(st);
        true
    }

    /// Waits (bounded by [`GRANT_WAIT`]) for the answer to a grant request
    /// just sent on link `link`, so that the operation that asked can go
    /// direct — without it, a stream that keeps its send queue full would
    /// never find it empty again, and stay on the engine's path. Meanwhile
    /// this device answers its peers' own requests (two devices asking each
    /// other at once do not wait each other out). True when granted.
    fn await_grant(st: &mut State, req: &crate::linkmsg::GrantRequest, link: usize) -> bool {
        let t0 = std::time::Instant::now();
        let mut fds = Vec::new();
        let mut ready = Vec::new();
        while t0.elapsed() < GRANT_WAIT {
            st.shm.accept();
            Self::answer_grants(st);
            match st.shm.enter(link, req.rkey, req.target_qpn) {
                Ok(_) => return true,
                Err(crate::grant::NotGranted::Revoked) => return false,
                Err(crate::grant::NotGranted::Missing) => {}
            }
            if st.shm.grant_refused(link, req.rkey, req.target_qpn) {
                return false;
            }
            fds.clear();
            st.shm.wait_fds(&mut fds);
            sys::wait_readable_any(&fds, Some(Duration::from_micros(100)), &mut ready);
        }
        false
    }

    /// Answers the grant requests same-host peers sent: with the engine's
    /// rules (`Engine::check_grant`), a region of this device in a segment
    /// of its own is granted; anything else is refused.
    fn answer_grants(st: &mut State) {
        for (peer, req) in st.shm.take_requests() {
            let need = AccessFlags(req.access);
            let one_right = [
                AccessFlags::REMOTE_WRITE,
                AccessFlags::REMOTE_READ,
                AccessFlags::REMOTE_ATOMIC,
            ]
            .contains(&need);
            let facts = one_right
                .then(|| {
                    st.engine
                        .check_grant(req.target_qpn, peer.ip(), req.requester_qpn, req.rkey, need)
                        .ok()
                })
                .flatten();
            let grant = facts.and_then(|f| {
                let r = st.regions.get(&req.rkey)?;
                let g = crate::linkmsg::Grant {
                    rkey: req.rkey,
                    target_qpn: req.target_qpn,
                    slot: 0,
                    gen: 0,
                    pd: f.pd,
                    access: f.access.bits(),
                    qp_access: f.qp_access.bits(),
                    iova: f.iova,
                    len: f.len,
                    offset: r.offset,
                };
                Some((g, r.seg.fd()))
            });
            st.shm.answer(peer, req, grant);
        }
    }

    /// Takes back the grants made through QP `qpn` (every QP when `None`)
    /// that the engine's rules no longer allow (the QP changed state or
    /// rights, was destroyed, or the region went away).
    pub(crate) fn revalidate_grants(st: &mut State, qpn: Option<u32>) {
        let standing = st.shm.standing_grants();
        let stale: Vec<(SocketAddr, u32)> = standing
            .into_iter()
            .filter(|(peer, g)| {
                let now = st.engine.check_grant(
                    g.target_qpn,
                    peer.ip(),
                    g.requester_qpn,
                    g.rkey,
                    AccessFlags(g.access),
                );
                qpn.is_none_or(|q| q == g.target_qpn)
                    && !now.is_ok_and(|f| {
                        (f.access.bits(), f.qp_access.bits()) == (g.region_access, g.qp_access)
                    })
            })
            .map(|(peer, g)| (peer, g.slot))
            .collect();
        if !stale.is_empty() {
            st.shm.revoke(|peer, g| stale.contains(&(peer, g.slot)));
        }
    }

    /// The route of a direct operation on QP `qpn` planned as `plan`, if it
    /// can take one: its destination is a same-host peer whose link is up.
    fn look_up_route(st: &mut State, qpn: u32, plan: &DirectPlan) -> Option<DirectRoute> {
        let link = st.shm.peer_link(plan.dest())?;
        Some(DirectRoute {
            qpn,
            epoch: st.routes_epoch,
            links_gen: st.shm.links_gen(),
            link,
            plan: *plan,
        })
    }

    /// After a QP changed (modify, destroy): grants made through it that
    /// no longer hold are taken back.
    pub fn qp_changed(&self, qpn: u32) {
        let mut st = self.lock();
        Self::revalidate_grants(&mut st, Some(qpn));
    }

    fn background(self: Arc<Self>) {
        let sock = self.sock.as_raw_fd();
        let wake = self.wake.as_raw_fd();
        let (mut fds, mut ready) = (Vec::new(), Vec::new());
        let (mut active_fds, mut shm_fds) = (Vec::new(), Vec::new());
        while !self.stop.load(Ordering::Acquire) {
            let now = self.now();
            let since_poll = now
                .0
                .saturating_sub(self.last_app_poll.load(Ordering::Acquire));
            let window = APP_ACTIVE.as_nanos() as u64;
            if since_poll < window {
                // The application is polling and progresses inline; take
                // over exactly when it has not polled for the whole window
                // (it may have gone on to spin on memory instead).
                let left = Duration::from_nanos((window - since_poll).max(10_000));
                self.sleeping_until
                    .store(now.0 + left.as_nanos() as u64, Ordering::Release);
                // Reading the eventfd only when it was signalled: this wait
                // ends every APP_ACTIVE on the polling application's CPU,
                // and a read of an empty eventfd is one more system call.
                // It also watches the same-host sockets: an application whose
                // direct operations complete at once never runs full
                // progress, and a peer that dies must still be noticed.
                active_fds.clear();
                active_fds.push(wake);
                active_fds.extend_from_slice(&shm_fds);
                sys::wait_readable_any(&active_fds, Some(left), &mut ready);
                if ready[0] {
                    self.wake.drain();
                }
                let shm_event = ready[1..].iter().any(|&r| r);
                // Timers set by the application's last polls (a held ACK)
                // run even if it went on to do something else meanwhile.
                if let Ok(mut st) = self.state.try_lock() {
                    let now = self.now();
                    if st.engine.poll_timeout().is_some_and(|t| t <= now) {
                        st.forget_routes();
                        st.engine.handle_timeout(now);
                        self.transmit(&mut st, now);
                    }
                    if shm_event {
                        // A link's socket: a message, a new peer, or one gone.
                        st.forget_routes();
                        st.shm.accept();
                        st.shm.check_dead();
                        Self::answer_grants(&mut st);
                    }
                    shm_fds.clear();
                    st.shm.wait_fds(&mut shm_fds);
                }
                continue;
            }
            fds.clear();
            fds.extend([sock, wake]);
            let (next, can_sleep) = {
                let mut st = self.lock();
                st.driver.background_wakeups += 1;
                self.progress_with(&mut st, now, true);
                let can_sleep = st.shm.prepare_sleep();
                // The listener, handshakes in progress and links (a peer
                // that dies wakes us, so direct operations stop at once).
                st.shm.wait_fds(&mut fds);
                (st.engine.poll_timeout(), can_sleep)
            };
            if !can_sleep {
                continue;
            }
            let until = next.map_or(u64::MAX, |t| t.0);
            self.sleeping_until.store(until, Ordering::Release);
            let timeout = next.map(|t| Duration::from_nanos(t.0.saturating_sub(self.now().0)));
            sys::wait_readable_any(&fds, timeout, &mut ready);
            if ready[1] {
                self.wake.drain();
            }
        }
    }

    /// Stops the background thread (the device closes when the last handle goes).
    pub fn shutdown(&self) {
        // ACKs held back for a ping-pong's next answer still owe the peers
        // their completions.
        {
            let now = self.now();
            let mut st = self.lock();
            st.engine.release_held_acks();
            self.transmit(&mut st, now);
        }
        self.stop.store(true, Ordering::Release);
        self.wake.signal();
        if let Some(h) = self.thread.lock().unwrap_or_else(|e| e.into_inner()).take() {
            if h.thread().id() != std::thread::current().id() {
                let _ = h.join();
            }
        }
    }

    pub fn counters(&self) -> (Counters, DriverCounters) {
        let st = self.lock();
        (*st.engine.counters(), st.driver)
    }
}

/// What the target granted, as the engine's rules read a peer: the QP
/// the grant is for (its state taking requests while the grant stands:
/// it is revoked when that changes) and the region.
struct GrantView<'a>(&'a crate::linkmsg::Grant);

impl PeerView for GrantView<'_> {
    fn qp(&mut self, qpn: u32) -> Option<PeerQp> {
        (qpn == self.0.target_qpn).then_some(PeerQp {
            pd: self.0.pd,
            access: AccessFlags(self.0.qp_access),
            state: QpState::Rts,
        })
    }
    fn region(&mut self, rkey: u32) -> Option<PeerRegion> {
        (rkey == self.0.rkey).then_some(PeerRegion {
            pd: self.0.pd,
            access: AccessFlags(self.0.access),
            iova: self.0.iova,
            len: self.0.len,
        })
    }
}

/// Executes a planned WRITE, READ or atomic inside a granted region: the
/// target's rules (`Engine::check_direct_target`) against what it
/// granted, then the copy or the CPU atomic. False when a rule refuses
/// (the engine then handles the WR and gives its completion).
fn execute_direct(engine: &Engine, inside: &crate::grant::Inside<'_>, plan: &DirectPlan) -> bool {
    let Ok(roff) = engine.check_direct_target(plan, &mut GrantView(&inside.grant.grant)) else {
        return false;
    };
    let Some(rp) = inside.grant.ptr(roff, plan.len()) else {
        return false;
    };
    let local = plan.pieces();
    let lp = |a: usize| a as *mut u8;
    match plan.op() {
        DirectOp::Write => {
            let mut r = rp;
            for &(lo, n) in local {
                // SAFETY: the source lies in our own registered region (the
                // engine's local SGE rule), the target in the granted
                // mapping (the target's rule and `ptr` above); distinct
                // mappings.
                unsafe {
                    std::ptr::copy_nonoverlapping(lp(lo), r, n);
                    r = r.add(n);
                }
            }
        }
        DirectOp::Read => {
            let mut r = rp;
            for &(lo, n) in local {
                // SAFETY: as above, with the roles swapped.
                unsafe {
                    std::ptr::copy_nonoverlapping(r, lp(lo), n);
                    r = r.add(n);
                }
            }
        }
        DirectOp::CompareSwap { compare, swap } => {
            // CPU atomics need the word 8-aligned in both mappings.
            let (Some(t), Some(l)) = (atomic_at(rp), atomic_at(lp(local[0].0))) else {
                return false;
            };
            let old = match t.compare_exchange(compare, swap, Ordering::SeqCst, Ordering::SeqCst) {
                Ok(v) | Err(v) => v,
            };
            l.store(old, Ordering::Release);
        }
        DirectOp::FetchAdd { add } => {
            let (Some(t), Some(l)) = (atomic_at(rp), atomic_at(lp(local[0].0))) else {
                return false;
            };
            l.store(t.fetch_add(add, Ordering::SeqCst), Ordering::Release);
        }
    }
    true
}

thread_local! {
    /// `flush_tx`'s list of datagrams, kept empty between sends so that a
    /// send allocates nothing (a latency-bound sender makes one per message).
    static DGRAMS: std::cell::Cell<Vec<sys::Datagram<'static>>> =
        const { std::cell::Cell::new(Vec::new()) };
}

/// Packets waiting for one `sendmmsg`.
struct TxBatch {
    data: Vec<u8>,
    meta: Vec<(Endpoints, usize)>,
    /// What the engine said about each packet (its payload may be in a region).
    tx: Vec<Transmit>,
    n: usize,
}

impl TxBatch {
    fn new() -> Self {
        let none = Endpoints::new(
            SocketAddr::from(([0, 0, 0, 0], 0)),
            SocketAddr::from(([0, 0, 0, 0], 0)),
        );
        TxBatch {
            data: vec![0; TX_BATCH * BUF_LEN],
            meta: vec![(none, 0); TX_BATCH],
            tx: vec![
                Transmit {
                    len: 0,
                    endpoints: none,
                    qpn: 0,
                    ecn: softrdma_wire::Ecn::NotEct,
                    payload: None,
                };
                TX_BATCH
            ],
            n: 0,
        }
    }

    /// Copies packet `i`'s payload into its slot if the engine left it in
    /// a region: afterwards the slot holds the whole packet.
    fn make_whole(&mut self, engine: &Engine, i: usize) {
        let t = self.tx[i];
        if t.payload.is_some() {
            let slot = &mut self.data[i * BUF_LEN..(i + 1) * BUF_LEN];
            // The region cannot have gone: deregistration takes the device
            // lock, held since the engine built this packet.
            let copied = engine.copy_payload(&t, slot);
            debug_assert!(copied, "payload of a batched packet could not be copied");
            self.tx[i].payload = None;
        }
    }

    /// Packet `i` as a datagram for `send_batch`: its slot, or its slot
    /// around a payload read in place.
    fn datagram(&self, i: usize) -> sys::Datagram<'_> {
        let (ep, len) = self.meta[i];
        let slot = &self.data[i * BUF_LEN..i * BUF_LEN + len];
        match self.tx[i].payload {
            Some(p) => {
                let (head, rest) = slot.split_at(p.offset);
                let tail = &rest[p.len..];
                // SAFETY: `p.addr` is where the payload lies in a registered
                // region of this device (`RegionMemory::tx_addr` of our own
                // region types: process memory valid while registered).
                // Deregistration needs the device lock, which the caller
                // holds from building the packet until the send returns.
                unsafe { sys::Datagram::gathered(ep.dst, head, p.addr as *const u8, p.len, tail) }
            }
            None => sys::Datagram::new(ep.dst, slot),
        }
    }
    fn slot_mut(&mut self, i: usize) -> &mut [u8] {
        &mut self.data[i * BUF_LEN..(i + 1) * BUF_LEN]
    }
    fn packet(&self, i: usize) -> &[u8] {
        &self.data[i * BUF_LEN..i * BUF_LEN + self.meta[i].1]
    }
}

/// Devices open in this process, for `release_at_exit`.
static LIVE: Mutex<Vec<Weak<Device>>> = Mutex::new(Vec::new());

fn register_for_exit(dev: &Arc<Device>) {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        // SAFETY: registers a plain `extern "C" fn()` that lives as long as
        // the program (this library is linked or preloaded, never unloaded).
        unsafe { libc::atexit(release_at_exit) };
    });
    let mut live = LIVE.lock().unwrap_or_else(|e| e.into_inner());
    live.retain(|w| w.strong_count() > 0);
    live.push(Arc::downgrade(dev));
}

/// At `exit()`: sends the ACKs devices still hold back. A program that
/// exits right after its last receive (without closing the device) must
/// not leave its peer retrying a message it got; hardware would have
/// ACKed it already.
extern "C" fn release_at_exit() {
    let Ok(live) = LIVE.try_lock() else { return };
    for dev in live.iter().filter_map(Weak::upgrade) {
        // try_lock: a thread stopped by exit may hold the lock.
        if let Ok(mut st) = dev.state.try_lock() {
            st.forget_routes();
            let now = dev.now();
            st.engine.release_held_acks();
            dev.transmit(&mut st, now);
        }
    }
}

/// Lives as long as any user-facing handle of a device: when the last goes,
/// the background thread stops.
pub(crate) struct Lifetime(pub Arc<Device>);

impl Drop for Lifetime {
    fn drop(&mut self) {
        crate::stats::unpublish(&self.0);
        self.0.shutdown();
    }
}
