//! The production driver: a [`DeviceCore`] over the device's port (UDP,
//! and shared memory to same-host peers), run inline by application calls
//! and by a background thread, with the clock and the wake-ups.
//!
//! Progress happens in two places. Application calls (`post_*`, `poll_cq`)
//! run it inline under the device lock, so a polling application gets its
//! packets with no thread hand-off. A background thread sleeps in the kernel
//! (`ppoll` on the socket, the same-host links and a wake-up eventfd, with
//! the engine's next timer as timeout) and runs it when packets arrive while
//! the application is not polling, so one-sided operations reach a target
//! that is asleep or busy, and retransmission timers fire. While the
//! application polls, the thread stays out of its way: at most one busy
//! thread per process. A thread blocked on a completion channel
//! (`Device::wait_channel`) does the background thread's work while it
//! waits, so that the completion it waits for wakes it once; while a CQ is
//! armed the background thread watches the sources even if the application
//! polled a moment ago (its program may be asleep on an epoll of the
//! channel's fd). See docs/api.md, "How an event wakes the program".
//! What progress does, and when an inline poll may
//! skip it, is the core's (`softrdma-core`, docs/core.md); this file owns
//! only the threads, the clock and the file descriptors.

use std::collections::{HashMap, VecDeque};
use std::io;
use std::net::SocketAddr;
use std::ops::{Deref, DerefMut};
use std::os::fd::{AsRawFd, RawFd};
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, Weak};
use std::thread::JoinHandle;
use std::time::Duration;

use softrdma_core::{Capture, DeviceCore, Faulty, Port, PortCounters, Received, Sources};
use softrdma_engine::VerbsError as VerbsErrorKind;
use softrdma_engine::{
    Counters, CqHandle, Engine, EngineConfig, Event, Instant, Mtu, Qpn, Rkey, RxMeta, SendOp,
    SendWr, SrcPortPolicy,
};
use softrdma_pcap::SharedPcapWriter;

use crate::config::{auto_loopback_candidates, Bind, DeviceConfig, Net};
use crate::shm::ShmHub;
pub(crate) use crate::shm_port::SharedRegion;
use crate::shm_port::{Routed, ShmPort};
use crate::sys::{self, EventFd};
use crate::udp_port::{bind_socket, UdpPort};
use crate::xdp_port::{NetPort, XdpPort};
use crate::Error;

/// The background thread leaves the device to an application that polled this recently.
const APP_ACTIVE: Duration = Duration::from_micros(100);
/// While the application keeps polling, the background thread checks on
/// it ever less often: each check doubles the wait, up to this. Each check
/// is a wake-up on the poller's CPU (about 13 µs of its time in a VM, a
/// 9 % share at one check per APP_ACTIVE, and the tail of every
/// ping-pong); the price is that a program that stops polling to spin on
/// memory waits up to this long for the thread to take over.
const ACTIVE_CHECK_MAX: Duration = Duration::from_millis(1);
/// After a post, the background thread sleeps at most this long at a time
/// (for `POST_RECENT`), however far off its next timer is. A post arms a
/// retransmission timer; were the thread asleep without a deadline, the post
/// would have to wake it (an eventfd write and two context switches on the
/// poster's CPU, per post of a ping-pong). Timers that must fire sooner than
/// this still wake it.
const POSTING_SLEEP_MAX: Duration = Duration::from_millis(1);
/// Packets one background progress must receive for the stream busy-poll
/// (`Device::progress_and_sleep`): a ping-pong's one or two never start it.
const STREAM_PACKETS: u64 = 4;
/// How long the background thread polls after receiving a stream.
const STREAM_SPIN: Duration = Duration::from_micros(50);
/// How long after the last post the background thread keeps to
/// `POSTING_SLEEP_MAX`; then an idle device sleeps until something happens.
const POST_RECENT: Duration = Duration::from_millis(100);
/// How long after its last completion event a program that sleeps on
/// events is still taken for one (`Device::events_until`): it re-arms
/// within microseconds of waking, and the background thread should not
/// fall back to checking on a poller in between.
const EVENTS_RECENT: Duration = Duration::from_micros(200);
/// The longest the background thread parks while a thread waits in
/// `Device::wait_channel` (which watches the sources and runs progress):
/// it looks again after ACTIVE_CHECK_MAX, then ever less often, up to
/// this, so that a program blocked on its channel for long costs no CPU.
/// A waiter that leaves after the park grew past ACTIVE_CHECK_MAX wakes
/// the thread (`park_long`); one that leaves sooner does not (it is back
/// in verbs calls, and the thread looks again within ACTIVE_CHECK_MAX).
const PARK_MAX: Duration = Duration::from_millis(100);
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
    pub ready: Mutex<VecDeque<CqHandle>>,
}

/// The device's port as configured: capture and fault injection wrap the
/// routed UDP and shared-memory port (faults outside, so a capture records
/// what arrived before the faults). One match per call, statically
/// dispatched inside.
pub(crate) enum DevicePort {
    Plain(Routed),
    Captured(Capture<Routed>),
    Faulty(Faulty<Routed>),
    Both(Faulty<Capture<Routed>>),
}

macro_rules! each {
    ($s:expr, $p:ident => $e:expr) => {
        match $s {
            DevicePort::Plain($p) => $e,
            DevicePort::Captured($p) => $e,
            DevicePort::Faulty($p) => $e,
            DevicePort::Both($p) => $e,
        }
    };
}

impl DevicePort {
    fn routed(&self) -> &Routed {
        match self {
            DevicePort::Plain(r) => r,
            DevicePort::Captured(c) => c.inner(),
            DevicePort::Faulty(f) => f.inner(),
            DevicePort::Both(b) => b.inner().inner(),
        }
    }
    fn routed_mut(&mut self) -> &mut Routed {
        match self {
            DevicePort::Plain(r) => r,
            DevicePort::Captured(c) => c.inner_mut(),
            DevicePort::Faulty(f) => f.inner_mut(),
            DevicePort::Both(b) => b.inner_mut().inner_mut(),
        }
    }
}

impl Port for DevicePort {
    type Peers = ShmPort;

    #[inline]
    fn receive<F>(&mut self, now: Instant, from: Sources, budget: usize, rx: F) -> Received
    where
        F: FnMut(SocketAddr, RxMeta, &[u8]),
    {
        each!(self, p => p.receive(now, from, budget, rx))
    }
    #[inline]
    fn send(&mut self, now: Instant, out: &mut softrdma_core::Outgoing<'_>) {
        each!(self, p => p.send(now, out))
    }
    #[inline]
    fn has_fast(&self) -> bool {
        each!(self, p => p.has_fast())
    }
    #[inline]
    fn fast_pending(&self) -> bool {
        each!(self, p => p.fast_pending())
    }
    #[inline]
    fn next_due(&self) -> Option<softrdma_engine::Instant> {
        each!(self, p => p.next_due())
    }
    #[inline]
    fn maintain(&mut self) {
        each!(self, p => p.maintain())
    }
    #[inline]
    fn direct_allowed(&self) -> bool {
        each!(self, p => p.direct_allowed())
    }
    #[inline]
    fn peers(&mut self) -> Option<&mut ShmPort> {
        each!(self, p => p.peers())
    }
    #[inline]
    fn counters(&self, c: &mut PortCounters) {
        each!(self, p => p.counters(c))
    }
}

/// Everything behind the device lock: the core (engine and port) and
/// where its events go. Dereferences to the core (`st.engine`,
/// `st.forget_routes()`).
pub(crate) struct State {
    pub core: DeviceCore<DevicePort>,
    pub channels: HashMap<CqHandle, Arc<ChannelShared>>,
    pub async_events: VecDeque<Event>,
    background_wakeups: u64,
    /// Polls answered from the CQ alone (no progress), for `last_app_poll`.
    app_polls: u32,
}

impl Deref for State {
    type Target = DeviceCore<DevicePort>;
    fn deref(&self) -> &Self::Target {
        &self.core
    }
}

impl DerefMut for State {
    fn deref_mut(&mut self) -> &mut Self::Target {
        &mut self.core
    }
}

impl State {
    /// The same-host hub.
    pub fn shm(&self) -> &ShmHub {
        &self.core.port.routed().shm.hub
    }
    /// The same-host hub.
    pub fn shm_mut(&mut self) -> &mut ShmHub {
        &mut self.core.port.routed_mut().shm.hub
    }
    /// Offers region `rkey`, in a segment of its own, to same-host peers
    /// (the engine's rules decide, per request, who is granted it). It is
    /// taken back when the engine deregisters it.
    pub fn share_region(&mut self, rkey: Rkey, r: SharedRegion) {
        self.core.port.routed_mut().shm.regions.insert(rkey, r);
    }
    /// The sockets of the multicast groups the device receives, for the
    /// waits (a datagram to a group wakes a sleeping device).
    pub fn group_fds(&self, out: &mut Vec<RawFd>) {
        self.core.port.routed().udp.group_fds(out)
    }
    /// Makes the port receive exactly the groups the engine's QPs are
    /// attached to.
    fn sync_groups(&mut self) -> std::io::Result<()> {
        let groups: Vec<std::net::IpAddr> = self.core.engine.mcast_groups().collect();
        self.core.port.routed_mut().udp.set_groups(&groups)
    }
}

/// One open device.
pub(crate) struct Device {
    pub name: String,
    pub addr: SocketAddr,
    pub active_mtu: Mtu,
    pub link_mtu: u32,
    state: Mutex<State>,
    /// Whether `try_direct` can ever succeed (not UDP-only, no faults): set
    /// at open, so that a post on a UDP device takes the lock only once.
    direct: bool,
    /// The UDP socket (owned by the port in the state), for the background
    /// thread's wait.
    sock_fd: RawFd,
    wake: EventFd,
    pub async_fd: EventFd,
    /// Signalled when the connection manager has events (`rdma_cm.rs`).
    pub cm_fd: EventFd,
    stop: AtomicBool,
    origin: std::time::Instant,
    last_app_poll: AtomicU64,
    /// When the application last posted a send WR (`POST_RECENT`).
    last_post: AtomicU64,
    sleeping_until: AtomicU64,
    /// Until when the background thread must notice incoming packets at
    /// once, as if the application did not poll (`u64::MAX` while a CQ is
    /// armed, `EVENTS_RECENT` past the last event after): an armed CQ's
    /// program may be asleep on its channel, and its event must not wait
    /// for a poll that does not come (`Device::wants_events`).
    events_until: AtomicU64,
    /// Set while the background thread checks on a poller
    /// (`check_on_poller`), which does not watch the packet sources: an
    /// arm then wakes it (`Device::route_events`).
    checking: AtomicBool,
    /// Threads asleep in `wait_channel`, each watching the packet sources
    /// itself; the background thread leaves the sources to them.
    waiters: AtomicU32,
    /// Where the background thread sleeps while there are waiters.
    park: EventFd,
    /// Set while the background thread parks for longer than
    /// ACTIVE_CHECK_MAX (`PARK_MAX`).
    park_long: AtomicBool,
    /// When the last thread left `wait_channel`: the background thread
    /// stays parked for `EVENTS_RECENT` after, while the program handles
    /// what woke it and comes back to wait (it would only contend with it).
    waiter_left: AtomicU64,
    /// The longest a `wait_channel` polls before it sleeps, in ns
    /// (`DeviceConfig::event_spin`), and how long the next one polls:
    /// halved after each wait whose event came later than the longest
    /// poll (or not at all), reset to it when one came within it.
    spin_max: u64,
    spin_next: AtomicU64,
    thread: Mutex<Option<JoinHandle<()>>>,
}

/// The background thread's wait state, kept between rounds.
#[derive(Default)]
struct BackgroundWait {
    fds: Vec<RawFd>,
    ready: Vec<bool>,
    /// The same-host sockets, as of the last look while the application polls.
    shm_fds: Vec<RawFd>,
    /// Checks on a polling application in a row (`ACTIVE_CHECK_MAX`).
    active_checks: u32,
    /// Until when the wait polls instead of sleeping (`STREAM_SPIN`).
    spin_until: u64,
}

/// Active MTU for a link MTU: minus 80 bytes of headers, rounded down to an IB MTU.
pub fn active_mtu_for(link_mtu: u32) -> Mtu {
    let room = link_mtu.saturating_sub(80);
    [Mtu::Mtu4096, Mtu::Mtu2048, Mtu::Mtu1024, Mtu::Mtu512]
        .into_iter()
        .find(|m| m.bytes() <= room)
        .unwrap_or(Mtu::Mtu256)
}

/// The CA GUID the CM sends: the node GUID of the address (as
/// `Context::node_guid`).
fn ca_guid_of(addr: SocketAddr) -> u64 {
    crate::verbs::node_guid_of(addr)
}

/// The CM's communication-ID seed: from the OS, or from a configured seed
/// (tests that want a repeatable run).
fn cm_seed(seed: Option<u64>) -> Result<[u8; 32], String> {
    let mut k = [0u8; 32];
    match seed {
        Some(s) => {
            for (i, b) in k.iter_mut().enumerate() {
                *b = (s.rotate_left(i as u32 * 7) ^ 0xC3) as u8;
            }
        }
        None => getrandom::fill(&mut k).map_err(|e| format!("no OS randomness: {e}"))?,
    }
    Ok(k)
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

/// Binds a device's address, waiting up to 2 s while it is in use: a
/// process that exits (a forking server's previous child, say) releases
/// its device's address a moment after its peer has moved on, as a NIC's
/// address outlives the process while here the process owns it.
fn bind_device_socket(a: SocketAddr) -> std::io::Result<std::net::UdpSocket> {
    let give_up = std::time::Instant::now() + Duration::from_secs(2);
    loop {
        match bind_socket(a) {
            Err(e)
                if e.kind() == std::io::ErrorKind::AddrInUse
                    && std::time::Instant::now() < give_up =>
            {
                std::thread::sleep(Duration::from_millis(20));
            }
            r => return r,
        }
    }
}

impl Device {
    pub fn open(cfg: &DeviceConfig) -> Result<Arc<Device>, Error> {
        let sock = match &cfg.bind {
            Bind::Addr(a) => bind_device_socket(*a).map_err(|e| {
                Error::Io(format!(
                    "device {}: cannot bind UDP {a}: {e} (another softrdma device, or \
                     another program, has that address and port)",
                    cfg.name
                ))
            })?,
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
        // Received ECN marks reach the engine (`RxMeta`) when asked for:
        // the control message costs every received datagram.
        let read_ecn = cfg.ecn || cfg.congestion.reads_ecn();
        if read_ecn && !sys::enable_recv_tos(&sock, sock.local_addr().is_ok_and(|a| a.is_ipv6())) {
            eprintln!(
                "softrdma: device {}: received ECN marks cannot be read",
                cfg.name
            );
        }
        let gso = cfg.gso && sys::gso_available(&sock);
        let addr = sock.local_addr().map_err(|e| Error::Io(e.to_string()))?;
        // AF_XDP when configured (the UDP socket stays bound, keeping the
        // address this device's on this host, and receives nothing: the
        // XDP program takes the port's packets before the kernel's stack).
        let xdp = match &cfg.net {
            Net::Udp => None,
            Net::Xdp(x) => match XdpPort::open(addr, x) {
                Ok(p) => {
                    eprintln!(
                        "softrdma: device {}: AF_XDP on {} queue {} ({})",
                        cfg.name,
                        x.iface,
                        x.queue,
                        p.mode()
                    );
                    Some((p, x.iface.clone()))
                }
                Err(e) if x.fallback_udp => {
                    eprintln!(
                        "softrdma: device {}: {e}; falling back to the UDP port",
                        cfg.name
                    );
                    None
                }
                Err(e) => return Err(Error::Io(format!("device {}: {e}", cfg.name))),
            },
        };
        let link_mtu = match &xdp {
            Some((_, iface)) => crate::xdp_port::link_mtu(iface),
            None => sys::link_mtu(addr.ip()),
        };
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
        // Only for a QP that answers: a one-way stream's ACKs (write_bw)
        // each waited out the delay with the sender's window stalled
        // behind them (one ACK per ~57 WRITEs, 33 µs after the last).
        ec.ack_delay_answering_only = true;
        ec.limits.gid_table_len = 1;
        ec.congestion = cfg.congestion.engine_config();
        let capture = match &cfg.capture {
            Some(t) => {
                let p = crate::config::capture_path(t, &cfg.name, addr)?;
                Some(
                    SharedPcapWriter::create(&p)
                        .map_err(|e| Error::Io(format!("capture {}: {e}", p.display())))?,
                )
            }
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
        let (sock_fd, net) = match xdp {
            Some((mut p, _)) => {
                p.reserve = Some(sock);
                (p.fd(), NetPort::Xdp(Box::new(p)))
            }
            None => (
                sock.as_raw_fd(),
                NetPort::Udp(UdpPort::new(sock, addr, gso)),
            ),
        };
        let routed = Routed {
            shm: ShmPort::new(shm),
            udp: net,
        };
        // Engine instant zero in wall-clock time, for capture timestamps.
        let epoch = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default();
        let port = match (capture, cfg.fault) {
            (None, None) => DevicePort::Plain(routed),
            (Some(w), None) => DevicePort::Captured(Capture::new(routed, w, addr, epoch)),
            (None, Some(f)) => DevicePort::Faulty(Faulty::new(routed, f)),
            (Some(w), Some(f)) => {
                DevicePort::Both(Faulty::new(Capture::new(routed, w, addr, epoch), f))
            }
        };
        let direct = port.routed().shm.active() && port.direct_allowed();
        let mut core = DeviceCore::new(Engine::new(ec), port);
        core.enable_cm(softrdma_core::cm::DeviceCm::new(
            ca_guid_of(addr),
            cm_seed(cfg.seed).map_err(|e| Error::Io(format!("device {}: {e}", cfg.name)))?,
            addr.port(),
        ));
        let dev = Arc::new(Device {
            name: cfg.name.clone(),
            direct,
            addr,
            active_mtu,
            link_mtu,
            state: Mutex::new(State {
                core,
                channels: HashMap::new(),
                async_events: VecDeque::new(),
                background_wakeups: 0,
                app_polls: 0,
            }),
            sock_fd,
            wake,
            async_fd: EventFd::new(true).map_err(io)?,
            cm_fd: EventFd::new(true).map_err(io)?,
            stop: AtomicBool::new(false),
            origin: std::time::Instant::now(),
            last_app_poll: AtomicU64::new(0),
            last_post: AtomicU64::new(0),
            sleeping_until: AtomicU64::new(u64::MAX),
            events_until: AtomicU64::new(0),
            checking: AtomicBool::new(false),
            waiters: AtomicU32::new(0),
            park: EventFd::new(true).map_err(io)?,
            park_long: AtomicBool::new(false),
            waiter_left: AtomicU64::new(0),
            spin_max: cfg.event_spin.as_nanos().min(u64::MAX as u128) as u64,
            spin_next: AtomicU64::new(cfg.event_spin.as_nanos().min(u64::MAX as u128) as u64),
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
    /// peers' memory (its transport is not UDP only, and no faults).
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
        st.core.forget_routes();
        st
    }

    /// The device state, for a holder that changes no QP, local region or
    /// link, or that forgets the routes itself when it does.
    fn lock_keeping_routes(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Runs `f` on the engine, then what it set off (`DeviceCore::command`);
    /// wakes the background thread if a timer is now due earlier than it
    /// planned to sleep.
    pub fn with_engine<R>(&self, f: impl FnOnce(&mut Engine, Instant) -> R) -> R {
        let now = self.now();
        let mut st = self.lock();
        let (r, next) = st.core.command(now, f);
        self.route_events(&mut st);
        drop(st);
        if next.map_or(u64::MAX, |t| t.0) < self.sleeping_until.load(Ordering::Acquire) {
            self.wake.signal();
        }
        r
    }

    /// `ibv_attach_mcast` (`attach`) or `ibv_detach_mcast` of QP `qpn` and
    /// group `gid`: the engine's rules and table, then the port joins or
    /// leaves the group's socket. A group the host refuses to join leaves
    /// the QP unattached.
    pub fn mcast(&self, qpn: Qpn, gid: softrdma_engine::Gid, attach: bool) -> crate::Result<()> {
        let mut st = self.lock();
        if attach {
            st.core.engine.attach_mcast(qpn, gid)?;
        } else {
            st.core.engine.detach_mcast(qpn, gid)?;
        }
        let r = st.sync_groups();
        if let Err(e) = r {
            if attach {
                let _ = st.core.engine.detach_mcast(qpn, gid);
                let _ = st.sync_groups();
            }
            return Err(crate::Error::Verbs(match e.kind() {
                std::io::ErrorKind::Unsupported => VerbsErrorKind::NotSupported(e.to_string()),
                _ => VerbsErrorKind::NoMemory(format!("joining multicast group {gid}: {e}")),
            }));
        }
        drop(st);
        // A sleeping background thread waits on the group sockets it had.
        self.wake.signal();
        Ok(())
    }

    /// After a QP is destroyed: its groups are left with it.
    pub fn groups_changed(&self) {
        let mut st = self.lock();
        let _ = st.sync_groups();
        drop(st);
        self.wake.signal();
    }

    /// A send WR posted on QP `qpn` (`f` posts it): its packets may wait
    /// in the engine for a batch while the QP has packets in flight
    /// (`DeviceCore::post`). The background thread is not woken for them:
    /// the ACK of the packets in flight wakes it (or the application's
    /// next poll takes it in), and that progress sends them. Waking it at
    /// once would send them at once, and cost a context switch per burst
    /// on the poster's CPU. It is woken, as for any command, when an
    /// engine timer is now due earlier than it planned to sleep.
    pub fn post<R>(&self, qpn: Qpn, f: impl FnOnce(&mut Engine, Instant) -> R) -> R {
        let now = self.now();
        self.last_post.store(now.0, Ordering::Relaxed);
        let mut st = self.lock();
        let (r, next) = st.core.post(now, qpn, f);
        self.route_events(&mut st);
        drop(st);
        if next.map_or(u64::MAX, |t| t.0) < self.sleeping_until.load(Ordering::Acquire) {
            self.wake.signal();
        }
        r
    }

    /// Inline progress for a polling application, around a poll of its own.
    ///
    /// `pre` runs first: when it finds work already waiting (`Some`), that is
    /// the answer and nothing else runs, as hardware's `poll_cq` only reads
    /// the CQ. Otherwise progress runs — unless the core says nothing can
    /// be pending (`DeviceCore::poll_wanted`: then no clock read and no
    /// system call) — and `post` gives the answer.
    ///
    /// `mark_app` tells the background thread that the application is
    /// polling (`last_app_poll`); the time stored is read at most a few
    /// hundred polls apart, far inside `APP_ACTIVE` while the application
    /// polls in a loop.
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
        if st.core.poll_wanted() {
            let now = self.now();
            if mark_app {
                self.last_app_poll.store(now.0, Ordering::Release);
            }
            st.core.forget_routes();
            st.core.progress(now, false);
            self.route_events(&mut st);
            // A polling application's background thread wakes on its own
            // within the APP_ACTIVE window and runs due timers then; waking
            // it for every held ACK would cost the poller a context switch
            // per message.
            if !mark_app {
                let next = st.core.next_deadline().map_or(u64::MAX, |t| t.0);
                if next < self.sleeping_until.load(Ordering::Acquire) {
                    self.wake.signal();
                }
            }
        }
        post(&mut st, c)
    }

    /// Hands the core's events to where they go: completion channels, and
    /// the async event queue with its fd.
    /// Runs a connection-manager command (`DeviceCore::cm_command`) and
    /// routes what it raised.
    pub fn cm_command<R>(
        &self,
        f: impl FnOnce(&mut softrdma_core::cm::DeviceCm, &mut Engine, Instant) -> R,
    ) -> Option<R> {
        let now = self.now();
        let mut st = self.lock();
        let r = st.core.cm_command(now, f);
        self.route_events(&mut st);
        drop(st);
        self.wake.signal();
        r
    }

    /// The connection manager's next event, if one waits (with inline
    /// progress first, as a poll of a CQ runs it).
    pub fn poll_cm_event(&self) -> Option<softrdma_cm::Event<SocketAddr>> {
        let now = self.now();
        let mut st = self.lock();
        st.core.progress(now, true);
        self.route_events(&mut st);
        st.core
            .cm_command(now, |cm, _, _| cm.poll_event())
            .flatten()
    }

    fn route_events(&self, st: &mut State) {
        let State {
            core,
            channels,
            async_events,
            ..
        } = st;
        if core.has_cm_events() {
            self.cm_fd.signal();
        }
        self.follow_arming(core.engine.armed_cqs() > 0);
        while let Some(ev) = core.poll_event() {
            match ev {
                Event::Completion { cq } => {
                    if let Some(ch) = channels.get(&cq) {
                        ch.ready
                            .lock()
                            .unwrap_or_else(|e| e.into_inner())
                            .push_back(cq);
                        ch.fd.signal();
                    }
                }
                other => {
                    async_events.push_back(other);
                    self.async_fd.signal();
                }
            }
        }
    }

    /// Keeps `events_until` to whether a CQ is armed (called under the
    /// lock after everything that may arm or fire one). An arm while the
    /// background thread checks on a poller wakes it, so that it watches
    /// the packet sources before the completion comes. One relaxed load
    /// when nothing changed.
    #[inline]
    fn follow_arming(&self, armed: bool) {
        let until = self.events_until.load(Ordering::Relaxed);
        if armed == (until == u64::MAX) {
            return;
        }
        if armed {
            // Pairs with `check_on_poller`: it sets `checking`, then reads
            // `events_until`; this stores, then reads `checking`. One of
            // the two sees the other.
            self.events_until.store(u64::MAX, Ordering::SeqCst);
            if self.checking.load(Ordering::SeqCst) {
                self.wake.signal();
            }
        } else {
            let t = self.now().0 + EVENTS_RECENT.as_nanos() as u64;
            self.events_until.store(t, Ordering::Release);
        }
    }

    /// Whether the background thread must notice incoming packets at once:
    /// a CQ is armed, or was until just now (`events_until`).
    fn wants_events(&self, now: Instant) -> bool {
        now.0 < self.events_until.load(Ordering::SeqCst)
    }

    /// Executes an RDMA WRITE, READ or atomic directly in a same-host peer's
    /// memory when that is exactly what the engine would do
    /// (`DeviceCore::try_direct`). Returns false to let the engine handle
    /// the WR instead (which also produces every error completion).
    pub fn try_direct(&self, qpn: Qpn, wr: &SendWr) -> bool {
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
        let mut st = self.lock_keeping_routes();
        let done = st.core.try_direct(qpn, wr);
        if done && st.core.has_events() {
            // An armed CQ's completion event goes out now, not at the next progress.
            self.route_events(&mut st);
        }
        done
    }

    /// After a QP changed (modify, destroy). The core follows the engine's
    /// changes by itself (grants that no longer hold are taken back); this
    /// only makes it do so now.
    pub fn qp_changed(&self, qpn: Qpn) {
        let mut st = self.lock();
        st.core.follow_changes();
        st.core.revalidate_grants(Some(qpn));
    }

    /// Sleeps until channel `ch` has an event or `timeout` passes (true:
    /// an event waits), with this thread doing the background thread's
    /// work meanwhile: it sleeps on the channel, the UDP socket, the
    /// same-host links (their rings marked sleeping, so that a peer's
    /// packet wakes it) and the next timer, and runs progress when one
    /// of them wakes it. So the completion a program waits for wakes the
    /// program itself, once — not the background thread, which then has
    /// to wake the program (two wake-ups, each 5–50 µs on a VM, on the
    /// path of every event-driven message). The background thread stays
    /// off the sources while a thread waits here (`waiters`), so that
    /// one packet does not wake both.
    ///
    /// It polls first, for up to `spin_next`, without marking the rings
    /// sleeping (so a same-host peer need not signal it either): a
    /// completion that comes within that costs neither side a wake-up.
    pub fn wait_channel(&self, ch: &ChannelShared, timeout: Option<Duration>) -> bool {
        let start = self.now().0;
        let end = timeout.map_or(u64::MAX, |t| start.saturating_add(t.as_nanos() as u64));
        let spin_end = start
            .saturating_add(self.spin_next.load(Ordering::Relaxed))
            .min(end);
        self.waiters.fetch_add(1, Ordering::SeqCst);
        let mut fds = Vec::with_capacity(8);
        let mut ready = Vec::with_capacity(8);
        // Whether the channel's fd woke the last wait.
        let mut signalled = false;
        let got = loop {
            let now = self.now();
            let (next, can_sleep) = {
                let mut st = self.lock();
                st.core.progress(now, true);
                self.route_events(&mut st);
                {
                    let q = ch.ready.lock().unwrap_or_else(|e| e.into_inner());
                    if !q.is_empty() {
                        drop(q);
                        self.leave_rings_marked(&mut st);
                        break true;
                    }
                    // Readable with no event (taken since, by another
                    // thread or `CompChannel::take_event`): clear it, under the
                    // queue's lock as `CompChannel::get_event` does, or
                    // this wait would not sleep.
                    if signalled {
                        ch.fd.drain_shared();
                    }
                }
                if now.0 < spin_end {
                    drop(st);
                    std::hint::spin_loop();
                    continue;
                }
                let next = st.core.next_deadline().map_or(u64::MAX, |t| t.0);
                let can_sleep = st.shm_mut().prepare_sleep();
                fds.clear();
                fds.extend([ch.fd.as_raw_fd(), self.sock_fd, self.wake.as_raw_fd()]);
                st.shm().wait_fds(&mut fds);
                st.group_fds(&mut fds);
                (next, can_sleep)
            };
            let now = self.now().0;
            if now >= end {
                self.leave_rings_marked(&mut self.lock_keeping_routes());
                break false;
            }
            if !can_sleep {
                // A ring already holds packets.
                continue;
            }
            let until = next.min(end);
            let left = (until != u64::MAX).then(|| Duration::from_nanos(until.saturating_sub(now)));
            // A command of another thread that sets an earlier timer wakes
            // this one, as it would the background thread.
            self.sleeping_until.store(until, Ordering::Release);
            sys::wait_readable_any(&fds, left, &mut ready);
            signalled = ready[0];
            if ready[2] {
                self.wake.drain();
            }
        };
        let now = self.now().0;
        self.adapt_spin(got && now.saturating_sub(start) <= self.spin_max);
        // The program is back in verbs calls (it polls next): the
        // background thread, parked for at most ACTIVE_CHECK_MAX, checks on
        // it as on any poller, and is not woken for it — unless it parks
        // for longer.
        self.last_app_poll.store(now, Ordering::Release);
        self.waiter_left.store(now, Ordering::Release);
        // Nobody sleeps on the timers now: commands need not signal.
        self.sleeping_until.store(0, Ordering::Release);
        if self.waiters.fetch_sub(1, Ordering::SeqCst) == 1 && self.park_long.load(Ordering::SeqCst)
        {
            self.park.signal();
        }
        got
    }

    /// After a `wait_channel`: the next one polls for as long as the
    /// longest poll when this one's event came within it (polling would
    /// have caught it), for half of this one's poll otherwise.
    fn adapt_spin(&self, caught: bool) {
        let next = if caught {
            self.spin_max
        } else {
            self.spin_next.load(Ordering::Relaxed) / 2
        };
        self.spin_next.store(next, Ordering::Relaxed);
    }

    /// For a thread leaving `wait_channel`: marks the same-host rings
    /// sleeping again. A peer's packet clears the mark of the ring it goes
    /// into when it wakes us, and the waiter that took that wake-up may
    /// leave without sleeping again; the background thread may still be
    /// asleep in `progress_and_sleep`, trusting the marks, and would then
    /// never hear of the next packet. When a ring holds packets already,
    /// the background thread is woken for them.
    fn leave_rings_marked(&self, st: &mut State) {
        if !st.shm_mut().prepare_sleep() {
            self.wake.signal();
        }
    }

    /// Clears the wake-up eventfd after the background thread woke on it.
    /// A same-host peer's packet signals it once (it clears the ring's
    /// sleeping mark): if a thread in `wait_channel` marked the ring, the
    /// signal is its, and is given back, since the background thread
    /// leaves progress to it.
    fn drain_wake(&self) {
        self.wake.drain();
        if self.waiters.load(Ordering::SeqCst) > 0 {
            self.wake.signal();
        }
    }

    fn background(self: Arc<Self>) {
        let mut w = BackgroundWait::default();
        let mut parks = 0u32;
        while !self.stop.load(Ordering::Acquire) {
            let since_waiter = self
                .now()
                .0
                .saturating_sub(self.waiter_left.load(Ordering::Acquire));
            let recent = EVENTS_RECENT.as_nanos() as u64;
            if self.waiters.load(Ordering::SeqCst) > 0 || since_waiter < recent {
                // A waiter watches the sources and runs progress
                // (`wait_channel`), or will again in a moment; park,
                // looking again ever less often.
                let t = if self.waiters.load(Ordering::SeqCst) > 0 {
                    parks += 1;
                    (ACTIVE_CHECK_MAX * (1 << (parks - 1).min(7))).min(PARK_MAX)
                } else {
                    Duration::from_nanos(recent - since_waiter)
                };
                self.park_long.store(t > ACTIVE_CHECK_MAX, Ordering::SeqCst);
                sys::wait_readable([self.park.as_raw_fd()], Some(t));
                self.park_long.store(false, Ordering::SeqCst);
                self.park.drain();
                continue;
            }
            parks = 0;
            let now = self.now();
            let since_poll = now
                .0
                .saturating_sub(self.last_app_poll.load(Ordering::Acquire));
            let window = APP_ACTIVE.as_nanos() as u64;
            // A program that sleeps on completion events polls too (before
            // it arms, and after it wakes), but its next completion must
            // wake it however recently it polled.
            if since_poll < window && !self.wants_events(now) {
                self.check_on_poller(&mut w, window - since_poll);
                continue;
            }
            w.active_checks = 0;
            self.progress_and_sleep(&mut w, now);
        }
    }

    /// While the application polls (it progresses inline): sleeps, then
    /// runs due timers and same-host link messages. Takes over when it has
    /// not polled for the whole window (it may have gone on to spin on
    /// memory instead), looking ever less often (`ACTIVE_CHECK_MAX`).
    fn check_on_poller(&self, w: &mut BackgroundWait, window_left: u64) {
        self.checking.store(true, Ordering::SeqCst);
        if self.wants_events(self.now()) {
            // Armed since the look in `background`.
            self.checking.store(false, Ordering::Relaxed);
            return;
        }
        let base = window_left.max(10_000) << w.active_checks.min(16);
        let left = Duration::from_nanos(base.min(ACTIVE_CHECK_MAX.as_nanos() as u64));
        w.active_checks += 1;
        self.sleeping_until
            .store(self.now().0 + left.as_nanos() as u64, Ordering::Release);
        // Reading the eventfd only when it was signalled: this wait
        // ends on the polling application's CPU, and a read of an empty
        // eventfd is one more system call. It also watches the same-host
        // sockets: an application whose direct operations complete at once
        // never runs full progress, and a peer that dies must still be
        // noticed.
        w.fds.clear();
        w.fds.push(self.wake.as_raw_fd());
        w.fds.extend_from_slice(&w.shm_fds);
        sys::wait_readable_any(&w.fds, Some(left), &mut w.ready);
        self.checking.store(false, Ordering::Relaxed);
        if w.ready[0] {
            self.drain_wake();
        }
        let shm_event = w.ready[1..].iter().any(|&r| r);
        // Timers set by the application's last polls (a held ACK)
        // run even if it went on to do something else meanwhile.
        if let Ok(mut st) = self.state.try_lock() {
            st.core.run_due_timers(self.now());
            if shm_event {
                // A link's socket: a message, a new peer, or one gone.
                st.core.maintain();
            }
            self.route_events(&mut st);
            w.shm_fds.clear();
            st.shm().wait_fds(&mut w.shm_fds);
        }
    }

    /// Progress in the background thread's own right, then a wait for
    /// the socket, the same-host sockets, a wake-up or the next deadline.
    /// While a stream arrives (`STREAM_PACKETS` in one progress) the wait
    /// polls instead of sleeping, for `STREAM_SPIN` after the last such
    /// progress: the sender's next batch then finds it awake, and does not
    /// pay for waking it (on loopback the wake-up runs on the sender's CPU,
    /// 12 % of an 8 B message stream's time). The poll is bounded: on a CPU
    /// it shares with an application that spins, it costs that application
    /// at most `STREAM_SPIN` per stream, and a ping-pong never starts it.
    fn progress_and_sleep(&self, w: &mut BackgroundWait, now: Instant) {
        w.fds.clear();
        w.fds.extend([self.sock_fd, self.wake.as_raw_fd()]);
        let (next, can_sleep) = {
            let mut st = self.lock();
            st.background_wakeups += 1;
            let before = st.core.engine.counters().rx_packets;
            st.core.progress(now, true);
            if st.core.engine.counters().rx_packets - before >= STREAM_PACKETS {
                w.spin_until = now.0 + STREAM_SPIN.as_nanos() as u64;
            }
            let next = st.core.next_deadline();
            self.route_events(&mut st);
            let can_sleep = st.shm_mut().prepare_sleep();
            // The listener, handshakes in progress and links (a peer
            // that dies wakes us, so direct operations stop at once).
            st.shm().wait_fds(&mut w.fds);
            st.group_fds(&mut w.fds);
            (next, can_sleep)
        };
        if !can_sleep {
            return;
        }
        let until = self.sleep_until(next);
        while self.now().0 < w.spin_until.min(until) {
            if self.stop.load(Ordering::Acquire) {
                return;
            }
            sys::wait_readable_any(&w.fds, Some(Duration::ZERO), &mut w.ready);
            if w.ready.iter().any(|&r| r) {
                break;
            }
        }
        self.sleeping_until.store(until, Ordering::Release);
        let timeout =
            (until != u64::MAX).then(|| Duration::from_nanos(until.saturating_sub(self.now().0)));
        sys::wait_readable_any(&w.fds, timeout, &mut w.ready);
        if w.ready[1] {
            self.drain_wake();
        }
    }

    /// Until when the background thread may sleep, given the core's next
    /// deadline (`u64::MAX`: until woken): no longer than `POSTING_SLEEP_MAX`
    /// while the application posts, so that its posts need not wake it.
    fn sleep_until(&self, next: Option<Instant>) -> u64 {
        let now = self.now().0;
        let next = next.map_or(u64::MAX, |t| t.0);
        let since_post = now.saturating_sub(self.last_post.load(Ordering::Relaxed));
        if since_post >= POST_RECENT.as_nanos() as u64 {
            return next;
        }
        next.min(now + POSTING_SLEEP_MAX.as_nanos() as u64)
    }

    /// Stops the background thread (the device closes when the last handle goes).
    pub fn shutdown(&self) {
        // ACKs held back for a ping-pong's next answer still owe the peers
        // their completions.
        {
            let now = self.now();
            self.lock().core.release_held_acks(now);
        }
        self.stop.store(true, Ordering::Release);
        self.wake.signal();
        self.park.signal();
        if let Some(h) = self.thread.lock().unwrap_or_else(|e| e.into_inner()).take() {
            if h.thread().id() != std::thread::current().id() {
                let _ = h.join();
            }
        }
    }

    pub fn counters(&self) -> (Counters, DriverCounters) {
        let st = self.lock();
        let c = st.core.counters();
        let d = DriverCounters {
            send_errors: c.port.send_errors,
            faults_injected: c.port.faults_injected,
            background_wakeups: st.background_wakeups,
            direct_ops: c.direct_ops,
            gso_sends: c.port.gso_sends,
            gro_buffers: c.port.gro_buffers,
        };
        (*st.core.engine.counters(), d)
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

/// At `exit()`: takes in what arrived and sends the ACKs devices still
/// hold back. A program that
/// exits right after its last receive (without closing the device) must
/// not leave its peer retrying a message it got; hardware would have
/// ACKed it already.
///
/// Other threads still run during `exit()` (they end only at its
/// `_exit`), and the device's background thread may hold the device's
/// lock in the middle of a progress: the handler waits for it, briefly.
/// It gives up after `EXIT_LOCK_WAIT` rather than hang an exit whose
/// lock holder cannot finish (a thread that called `exit` while holding
/// it).
extern "C" fn release_at_exit() {
    let until = std::time::Instant::now() + EXIT_LOCK_WAIT;
    let Some(live) = lock_before(&LIVE, until) else {
        return;
    };
    for dev in live.iter().filter_map(Weak::upgrade) {
        if let Some(mut st) = lock_before(&dev.state, until) {
            // What already arrived is taken in and acknowledged too, as
            // an HCA acknowledges what reaches it until the kernel
            // destroys the process's QPs after its exit.
            let now = dev.now();
            st.core.progress(now, true);
            st.core.release_held_acks(now);
        }
    }
}

/// How long `release_at_exit` waits for a device's lock, in all.
const EXIT_LOCK_WAIT: Duration = Duration::from_millis(200);

/// `m` locked (a poisoned lock too), trying until `until`.
fn lock_before<T>(m: &Mutex<T>, until: std::time::Instant) -> Option<MutexGuard<'_, T>> {
    loop {
        match m.try_lock() {
            Ok(g) => return Some(g),
            Err(std::sync::TryLockError::Poisoned(p)) => return Some(p.into_inner()),
            Err(std::sync::TryLockError::WouldBlock) if std::time::Instant::now() < until => {
                std::thread::sleep(Duration::from_micros(50));
            }
            Err(std::sync::TryLockError::WouldBlock) => return None,
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
