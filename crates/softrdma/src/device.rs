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
use std::sync::{Arc, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::Duration;

use softrdma_engine::{Counters, Engine, EngineConfig, Event, Instant, Mtu, SrcPortPolicy};
use softrdma_pcap::{SharedPcapWriter, Timestamp};
use softrdma_wire::{icrc, Endpoints};

use crate::config::{auto_loopback_candidates, Bind, DeviceConfig};
use crate::fault::FaultInjector;
use crate::sys::{self, EventFd};
use crate::Error;

/// Largest packet: 4096 payload + headers + ICRC, with room to spare.
const BUF_LEN: usize = 4096 + 256;
/// Datagrams per `recvmmsg`.
const RX_BATCH: usize = 32;
/// Packets per `sendmmsg`.
const TX_BATCH: usize = 32;
/// The background thread leaves the device to an application that polled this recently.
const APP_ACTIVE: Duration = Duration::from_micros(300);

/// Counters of the driver itself (the engine counts the protocol).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct DriverCounters {
    /// Datagrams that could not be sent (the engine retransmits RC).
    pub send_errors: u64,
    /// Packets altered or dropped by fault injection.
    pub faults_injected: u64,
    /// Times the background thread ran progress.
    pub background_wakeups: u64,
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
    send_socks: HashMap<u16, Option<UdpSocket>>,
    capture: Option<SharedPcapWriter>,
    fault: Option<FaultInjector>,
    pub channels: HashMap<u32, Arc<ChannelShared>>,
    pub async_events: VecDeque<Event>,
    pub driver: DriverCounters,
}

/// One open device.
pub(crate) struct Device {
    pub name: String,
    pub addr: SocketAddr,
    pub active_mtu: Mtu,
    pub link_mtu: u32,
    state: Mutex<State>,
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
        let addr = sock.local_addr().map_err(|e| Error::Io(e.to_string()))?;
        let link_mtu = sys::link_mtu(addr.ip());
        let active_mtu = active_mtu_for(link_mtu);
        let mut ec = EngineConfig::new(addr);
        ec.remote_port = addr.port();
        ec.src_port = SrcPortPolicy::PerQp;
        ec.seed = cfg.seed.unwrap_or_else(os_seed);
        ec.active_mtu = active_mtu;
        ec.max_inflight = 128;
        ec.limits.gid_table_len = 1;
        let capture = match &cfg.capture {
            Some(p) => Some(
                SharedPcapWriter::create(p)
                    .map_err(|e| Error::Io(format!("capture {}: {e}", p.display())))?,
            ),
            None => None,
        };
        let io = |e: io::Error| Error::Io(e.to_string());
        let dev = Arc::new(Device {
            name: cfg.name.clone(),
            addr,
            active_mtu,
            link_mtu,
            state: Mutex::new(State {
                engine: Engine::new(ec),
                rx: sys::RecvBatch::new(RX_BATCH, 65536),
                tx: TxBatch::new(),
                send_socks: HashMap::new(),
                capture,
                fault: cfg.fault.map(FaultInjector::new),
                channels: HashMap::new(),
                async_events: VecDeque::new(),
                driver: DriverCounters::default(),
            }),
            sock,
            wake: EventFd::new(true).map_err(io)?,
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
        Ok(dev)
    }

    /// Engine time now.
    pub fn now(&self) -> Instant {
        Instant(self.origin.elapsed().as_nanos() as u64)
    }

    pub fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Runs `f` on the engine, then progress; wakes the background thread if
    /// a timer is now due earlier than it planned to sleep.
    pub fn with_engine<R>(&self, f: impl FnOnce(&mut Engine, Instant) -> R) -> R {
        let now = self.now();
        let mut st = self.lock();
        let r = f(&mut st.engine, now);
        self.progress(&mut st, now);
        let next = st.engine.poll_timeout().map_or(u64::MAX, |t| t.0);
        drop(st);
        if next < self.sleeping_until.load(Ordering::Acquire) {
            self.wake.signal();
        }
        r
    }

    /// Inline progress for a polling application.
    pub fn poll_progress<R>(&self, f: impl FnOnce(&mut State) -> R) -> R {
        let now = self.now();
        self.last_app_poll.store(now.0, Ordering::Release);
        let mut st = self.lock();
        self.progress(&mut st, now);
        f(&mut st)
    }

    /// Receives what is waiting, runs timers, sends what is ready, routes events.
    fn progress(&self, st: &mut State, now: Instant) {
        let local = self.addr;
        for _ in 0..16 {
            let got = {
                let State {
                    engine,
                    rx,
                    capture,
                    fault,
                    driver,
                    ..
                } = &mut *st;
                let got = rx.recv(&self.sock);
                for i in 0..got {
                    let Some((src, data)) = rx.get(i) else {
                        continue;
                    };
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
                if got == 0 {
                    if let Some(f) = fault {
                        f.flush(|s, d| engine.handle_packet(now, Endpoints::new(s, local), d));
                    }
                }
                got
            };
            st.engine.handle_timeout(now);
            self.transmit(st, now);
            if got < RX_BATCH {
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
                let Some(t) = engine.poll_transmit(now, slot) else {
                    break;
                };
                tx.meta[tx.n] = (t.endpoints, t.len);
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
    fn flush_tx(&self, st: &mut State) {
        let State {
            tx,
            send_socks,
            capture,
            driver,
            ..
        } = &mut *st;
        let n = std::mem::take(&mut tx.n);
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
                    let (mut ep, len) = tx.meta[i];
                    ep.src = self.addr;
                    let _ = icrc::seal(&ep, &mut tx.slot_mut(i)[..len]);
                    tx.meta[i].0 = ep;
                }
            }
            let pkts: Vec<(SocketAddr, &[u8])> = (start..end)
                .map(|i| (tx.meta[i].0.dst, tx.packet(i)))
                .collect();
            let s = sock.as_ref().unwrap_or(&self.sock);
            let sent = sys::send_batch(s, &pkts).unwrap_or(0);
            driver.send_errors += (pkts.len() - sent) as u64;
            if let Some(c) = capture {
                for i in start..start + sent {
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
                    st.async_events.push_back(other);
                    self.async_fd.signal();
                }
            }
        }
    }

    fn background(self: Arc<Self>) {
        let sock = self.sock.as_raw_fd();
        let wake = self.wake.as_raw_fd();
        while !self.stop.load(Ordering::Acquire) {
            let now = self.now();
            let app_active = now
                .0
                .saturating_sub(self.last_app_poll.load(Ordering::Acquire))
                < APP_ACTIVE.as_nanos() as u64;
            if app_active {
                // The application is polling and progresses inline; check back later.
                self.sleeping_until
                    .store(now.0 + 1_000_000, Ordering::Release);
                sys::wait_readable([wake], Some(Duration::from_millis(1)));
                self.wake.drain();
                continue;
            }
            let next = {
                let mut st = self.lock();
                st.driver.background_wakeups += 1;
                self.progress(&mut st, now);
                st.engine.poll_timeout()
            };
            let until = next.map_or(u64::MAX, |t| t.0);
            self.sleeping_until.store(until, Ordering::Release);
            let timeout = next.map(|t| Duration::from_nanos(t.0.saturating_sub(self.now().0)));
            sys::wait_readable([sock, wake], timeout);
            self.wake.drain();
        }
    }

    /// Stops the background thread (the device closes when the last handle goes).
    pub fn shutdown(&self) {
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

/// Packets waiting for one `sendmmsg`.
struct TxBatch {
    data: Vec<u8>,
    meta: Vec<(Endpoints, usize)>,
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
            n: 0,
        }
    }
    fn slot_mut(&mut self, i: usize) -> &mut [u8] {
        &mut self.data[i * BUF_LEN..(i + 1) * BUF_LEN]
    }
    fn packet(&self, i: usize) -> &[u8] {
        &self.data[i * BUF_LEN..i * BUF_LEN + self.meta[i].1]
    }
}

/// Lives as long as any user-facing handle of a device: when the last goes,
/// the background thread stops.
pub(crate) struct Lifetime(pub Arc<Device>);

impl Drop for Lifetime {
    fn drop(&mut self) {
        self.0.shutdown();
    }
}
