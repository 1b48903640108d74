//! The AF_XDP port: RoCEv2 frames in and out of rings this process shares
//! with the kernel (docs/xdp.md). An XDP program on the interface steers
//! UDP to the device's port into the socket's receive ring and passes
//! everything else (ARP, neighbour discovery, TCP) to the kernel. The port
//! builds and parses Ethernet, IPv4/IPv6 and UDP itself (`softrdma-wire`'s
//! `frame`), checksums included; the engine's ICRC is the same as over UDP.
//! Next hops come from the kernel's neighbour table (netlink), which the
//! kernel fills when asked to send to the peer.
//!
//! Receiving costs no system call (the ring is read from memory), so the
//! port is a fast source for the core's inline polls. Sending publishes the
//! frames on the send ring and, in copy mode (veth, generic XDP) or when
//! the kernel asks for it (need-wakeup), makes one `sendto` per batch.

use std::collections::{HashMap, VecDeque};
use std::net::{IpAddr, SocketAddr, UdpSocket};
use std::time::{Duration, Instant as WallInstant};

use softrdma_core::{Outgoing, Port, PortCounters, Received, Sources};
use softrdma_engine::{Instant, RxMeta};
use softrdma_wire::frame::{self, FrameOptions};
use softrdma_wire::Ecn;

use crate::config::XdpConfig;
use crate::xsk::{self, Xsk};

/// How long a resolved neighbour is used before it is looked up again.
const NEIGH_FRESH: Duration = Duration::from_secs(10);
/// How long an unresolved neighbour is not asked for again.
const NEIGH_NEGATIVE: Duration = Duration::from_millis(500);
/// How long one resolution waits for the kernel's answer.
const RESOLVE_WAIT: Duration = Duration::from_millis(300);
/// The largest IP packet a UMEM frame takes: a frame less the kernel's
/// headroom in copy mode (256) and the Ethernet header.
pub const MAX_IP_MTU: u32 = (xsk::FRAME - 256 - frame::ETHERNET_LEN) as u32;

struct Neigh {
    mac: Option<[u8; 6]>,
    at: WallInstant,
}

/// The device's AF_XDP socket and what it knows of the link.
pub(crate) struct XdpPort {
    xsk: Xsk,
    addr: SocketAddr,
    ifindex: u32,
    src_mac: [u8; 6],
    neigh: HashMap<IpAddr, Neigh>,
    /// Send frames not on the rings.
    tx_free: Vec<u64>,
    /// Scratch: receive frames to give back.
    rx_done: Vec<u64>,
    /// Packets to this device itself (a QP connected to one of its own):
    /// they never reach the wire.
    to_self: VecDeque<(SocketAddr, Ecn, Vec<u8>)>,
    busy_poll: bool,
    counters: PortCounters,
    /// Frames received that were not ours or not well formed.
    pub rx_dropped: u64,
    /// The device's UDP socket, bound to keep its address this device's.
    pub reserve: Option<UdpSocket>,
}

impl XdpPort {
    /// Opens the port of a device at `addr` on `cfg`'s interface.
    pub fn open(addr: SocketAddr, cfg: &XdpConfig) -> Result<XdpPort, String> {
        let ifindex =
            xsk::ifindex(&cfg.iface).ok_or_else(|| format!("no interface {:?} here", cfg.iface))?;
        let src_mac = read_mac(&cfg.iface)?;
        let xsk = Xsk::open(ifindex, cfg.queue, addr.port(), cfg.attach, !cfg.busy_poll)
            .map_err(|e| format!("AF_XDP on {}: {e}", cfg.iface))?;
        let busy_poll = cfg.busy_poll && xsk.busy_poll();
        let tx_free = (xsk::FRAMES / 2..xsk::FRAMES)
            .map(|f| (f * xsk::FRAME) as u64)
            .collect();
        Ok(XdpPort {
            xsk,
            addr,
            ifindex,
            src_mac,
            neigh: HashMap::new(),
            tx_free,
            rx_done: Vec::with_capacity(64),
            to_self: VecDeque::new(),
            busy_poll,
            counters: PortCounters::default(),
            rx_dropped: 0,
            reserve: None,
        })
    }

    /// The socket to wait on.
    pub fn fd(&self) -> std::os::fd::RawFd {
        self.xsk.fd()
    }

    /// How the port runs, for logs and `softrdma-devinfo`: e.g. "native
    /// XDP, copy mode, wake-up".
    pub fn mode(&self) -> String {
        let m = self.xsk.mode;
        format!(
            "{} XDP, {}, {}",
            if m.native { "native" } else { "generic" },
            if m.zero_copy {
                "zero-copy"
            } else {
                "copy mode"
            },
            if self.busy_poll {
                "busy-poll"
            } else if m.need_wakeup {
                "wake-up"
            } else {
                "always kicked"
            }
        )
    }

    /// The next hop's MAC for `ip` from the kernel's neighbour table,
    /// asking the kernel to resolve it when it is not there (a datagram to
    /// the discard port makes it send ARP or neighbour solicitation).
    fn resolve(&mut self, ip: IpAddr) -> Option<[u8; 6]> {
        if let Some(n) = self.neigh.get(&ip) {
            let fresh = if n.mac.is_some() {
                NEIGH_FRESH
            } else {
                NEIGH_NEGATIVE
            };
            if n.at.elapsed() < fresh {
                return n.mac;
            }
        }
        let mut mac = lookup_neighbour(self.ifindex, ip);
        if mac.is_none() {
            let _ = UdpSocket::bind(SocketAddr::new(self.addr.ip(), 0))
                .and_then(|s| s.send_to(&[0], SocketAddr::new(ip, 9)));
            let until = WallInstant::now() + RESOLVE_WAIT;
            while mac.is_none() && WallInstant::now() < until {
                std::thread::sleep(Duration::from_millis(5));
                mac = lookup_neighbour(self.ifindex, ip);
            }
            if mac.is_none() {
                eprintln!(
                    "softrdma: AF_XDP port {}: no neighbour entry for {ip} on interface {} \
                     (the peer must be on the link; packets to it are dropped)",
                    self.addr, self.ifindex
                );
            }
        }
        self.neigh.insert(
            ip,
            Neigh {
                mac,
                at: WallInstant::now(),
            },
        );
        mac
    }

    fn reap(&mut self) {
        self.xsk.completions(&mut self.tx_free);
    }
}

impl Port for XdpPort {
    type Peers = softrdma_core::NoPeers;

    fn receive<F>(&mut self, _: Instant, from: Sources, budget: usize, mut rx: F) -> Received
    where
        F: FnMut(SocketAddr, RxMeta, &[u8]),
    {
        let mut got = 0;
        while got < budget {
            let Some((src, ecn, d)) = self.to_self.pop_front() else {
                break;
            };
            rx(src, RxMeta { ecn, group: None }, &d);
            got += 1;
        }
        let mut ready = self.xsk.rx_ready();
        if ready == 0 && from == Sources::All && (self.busy_poll || self.xsk.fill_needs_wakeup()) {
            self.xsk.wake_rx();
            ready = self.xsk.rx_ready();
        }
        let n = ready.min(budget.saturating_sub(got) as u32);
        self.rx_done.clear();
        for k in 0..n {
            let (addr, len) = self.xsk.rx_peek(k);
            self.rx_done.push(addr);
            let Some(f) = self.xsk.frame(addr, len as usize) else {
                self.rx_dropped += 1;
                continue;
            };
            match parse_frame(f, self.addr) {
                Some((src, ecn, payload)) => {
                    rx(src, RxMeta { ecn, group: None }, payload);
                    got += 1;
                }
                None => self.rx_dropped += 1,
            }
        }
        if n > 0 {
            self.xsk.rx_release(n, self.rx_done.drain(..));
        }
        Received {
            slow: 0,
            fast: got,
            more: self.xsk.rx_waiting() || !self.to_self.is_empty(),
        }
    }

    fn send(&mut self, _: Instant, out: &mut Outgoing<'_>) {
        self.reap();
        let mut queued = 0;
        for i in 0..out.len() {
            let ep = out.endpoints(i);
            let ecn = out.ecn(i);
            if ep.dst.ip() == self.addr.ip() {
                self.to_self.push_back((ep.src, ecn, out.whole(i).to_vec()));
                continue;
            }
            let Some(dst_mac) = self.resolve(ep.dst.ip()) else {
                self.counters.send_errors += 1;
                continue;
            };
            if self.tx_free.is_empty() || self.xsk.tx_free() == 0 {
                // Make room: send what is queued, take what completed.
                self.xsk.tx_submit();
                queued = 0;
                self.reap();
            }
            if self.xsk.tx_free() == 0 {
                self.counters.send_errors += 1;
                continue;
            }
            let Some(addr) = self.tx_free.pop() else {
                self.counters.send_errors += 1;
                continue;
            };
            let Some(buf) = self.xsk.frame_mut(addr) else {
                // Not one of ours (cannot happen): dropped from the pool.
                self.counters.send_errors += 1;
                continue;
            };
            let hdr = frame::frame_header_len(ep.dst.is_ipv6());
            let p = out.parts(i);
            let len = p.head.len() + p.payload.map_or(0, |(_, l)| l) + p.tail.len();
            if hdr + len > buf.len() {
                self.tx_free.push(addr);
                self.counters.send_errors += 1;
                continue;
            }
            let body = &mut buf[hdr..hdr + len];
            body[..p.head.len()].copy_from_slice(p.head);
            let mut at = p.head.len();
            if let Some((ptr, l)) = p.payload {
                // SAFETY: the payload lies in a registered region of this
                // device (process memory valid while registered), and `out`
                // borrows the engine, so no deregistration happens before
                // this copy returns.
                unsafe { xsk::copy_in(&mut body[at..at + l], ptr) };
                at += l;
            }
            body[at..].copy_from_slice(p.tail);
            let opts = FrameOptions {
                src_mac: self.src_mac,
                dst_mac,
                ttl: 64,
                tos: ecn.with_tos(0),
            };
            match frame::emit_frame(buf, ep.src, ep.dst, len, &opts) {
                Ok(n) => {
                    self.xsk.tx_put(addr, n as u32);
                    queued += 1;
                }
                Err(_) => {
                    self.tx_free.push(addr);
                    self.counters.send_errors += 1;
                }
            }
        }
        if queued > 0 {
            self.xsk.tx_submit();
        }
        out.clear();
    }

    fn has_fast(&self) -> bool {
        true
    }

    fn fast_pending(&self) -> bool {
        self.xsk.rx_waiting() || !self.to_self.is_empty()
    }

    fn counters(&self, c: &mut PortCounters) {
        c.send_errors += self.counters.send_errors;
    }
}

impl Drop for XdpPort {
    /// Says what the kernel dropped, if anything: frames lost before the
    /// port saw them (the engine only sees their absence).
    fn drop(&mut self) {
        let Some(st) = self.xsk.statistics() else {
            return;
        };
        let lost = st.rx_dropped + st.rx_ring_full + st.rx_fill_ring_empty_descs;
        if lost + st.rx_invalid_descs + st.tx_invalid_descs + self.rx_dropped > 0 {
            eprintln!(
                "softrdma: AF_XDP port {}: the kernel dropped {} received frames (receive ring \
                 full {}, no fill buffer {}), invalid descriptors rx {} tx {}; {} frames not \
                 for this device or malformed",
                self.addr,
                st.rx_dropped,
                st.rx_ring_full,
                st.rx_fill_ring_empty_descs,
                st.rx_invalid_descs,
                st.tx_invalid_descs,
                self.rx_dropped
            );
        }
    }
}

/// The device's network port: the kernel's UDP, or AF_XDP. The UDP port
/// stays inline (the common case, one allocation of the device either way).
#[allow(clippy::large_enum_variant)]
pub(crate) enum NetPort {
    Udp(crate::udp_port::UdpPort),
    Xdp(Box<XdpPort>),
}

impl NetPort {
    /// The multicast groups the port receives (UDP only: an AF_XDP port
    /// takes only frames addressed to the device).
    pub fn set_groups(&mut self, want: &[std::net::IpAddr]) -> std::io::Result<()> {
        match self {
            NetPort::Udp(p) => p.set_groups(want),
            NetPort::Xdp(_) if want.is_empty() => Ok(()),
            NetPort::Xdp(_) => Err(std::io::Error::new(
                std::io::ErrorKind::Unsupported,
                "multicast is not supported on an AF_XDP device",
            )),
        }
    }

    /// The sockets of the groups, for the device's waits.
    pub fn group_fds(&self, out: &mut Vec<std::os::fd::RawFd>) {
        if let NetPort::Udp(p) = self {
            p.group_fds(out)
        }
    }
}

impl Port for NetPort {
    type Peers = softrdma_core::NoPeers;

    #[inline]
    fn receive<F>(&mut self, now: Instant, from: Sources, budget: usize, rx: F) -> Received
    where
        F: FnMut(SocketAddr, RxMeta, &[u8]),
    {
        match self {
            NetPort::Udp(p) => p.receive(now, from, budget, rx),
            NetPort::Xdp(p) => p.receive(now, from, budget, rx),
        }
    }
    #[inline]
    fn send(&mut self, now: Instant, out: &mut Outgoing<'_>) {
        match self {
            NetPort::Udp(p) => p.send(now, out),
            NetPort::Xdp(p) => p.send(now, out),
        }
    }
    #[inline]
    fn has_fast(&self) -> bool {
        matches!(self, NetPort::Xdp(_))
    }
    #[inline]
    fn fast_pending(&self) -> bool {
        match self {
            NetPort::Udp(_) => false,
            NetPort::Xdp(p) => p.fast_pending(),
        }
    }
    fn counters(&self, c: &mut PortCounters) {
        match self {
            NetPort::Udp(p) => p.counters(c),
            NetPort::Xdp(p) => p.counters(c),
        }
    }
}

/// The RoCEv2 payload of a received frame for the device at `me`: its
/// source, ECN codepoint and UDP payload, when it is well formed (lengths,
/// checksums) and addressed to `me`.
fn parse_frame(f: &[u8], me: SocketAddr) -> Option<(SocketAddr, Ecn, &[u8])> {
    let ip = frame::ip_of_ethernet(f).ok()?;
    let p = frame::parse_ip(ip).ok()?;
    if p.dst != me || !frame::checksums_valid(p.ip_packet) {
        return None;
    }
    let tos = match ip[0] >> 4 {
        4 => ip[1],
        _ => (ip[0] << 4) | (ip[1] >> 4),
    };
    Some((p.src, Ecn::from_tos(tos), p.udp_payload))
}

/// The MAC address of interface `iface`.
fn read_mac(iface: &str) -> Result<[u8; 6], String> {
    let s = std::fs::read_to_string(format!("/sys/class/net/{iface}/address"))
        .map_err(|e| format!("interface {iface:?}: cannot read its MAC address: {e}"))?;
    parse_mac(s.trim()).ok_or_else(|| format!("interface {iface:?}: MAC address {s:?} unreadable"))
}

fn parse_mac(s: &str) -> Option<[u8; 6]> {
    let mut m = [0u8; 6];
    let mut it = s.split(':');
    for b in &mut m {
        *b = u8::from_str_radix(it.next()?, 16).ok()?;
    }
    it.next().is_none().then_some(m)
}

/// The interface's MTU, capped at what a UMEM frame holds.
pub fn link_mtu(iface: &str) -> u32 {
    let m = std::fs::read_to_string(format!("/sys/class/net/{iface}/mtu"))
        .ok()
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or(1500);
    m.min(MAX_IP_MTU)
}

const NLMSG_ERROR: u16 = 2;
const NLMSG_DONE: u16 = 3;
const RTM_NEWNEIGH: u16 = 28;
/// NUD states whose link address can be used (REACHABLE, STALE, DELAY,
/// PROBE, NOARP, PERMANENT).
const NUD_USABLE: u16 = 0x02 | 0x04 | 0x08 | 0x10 | 0x40 | 0x80;

/// The netlink messages of `buf`: (type, body).
fn nl_messages(buf: &[u8]) -> impl Iterator<Item = (u16, &[u8])> {
    let mut at = 0;
    std::iter::from_fn(move || {
        let h = buf.get(at..at + 16)?;
        let len = u32::from_ne_bytes(h[0..4].try_into().ok()?) as usize;
        let ty = u16::from_ne_bytes(h[4..6].try_into().ok()?);
        if len < 16 || at + len > buf.len() {
            return None;
        }
        let body = &buf[at + 16..at + len];
        at += (len + 3) & !3;
        Some((ty, body))
    })
}

/// Whether a netlink answer holds its end (done or an error).
pub(crate) fn dump_done(buf: &[u8]) -> bool {
    nl_messages(buf).any(|(t, _)| t == NLMSG_DONE || t == NLMSG_ERROR)
}

/// The usable link address for `ip` on `ifindex` in a neighbour dump.
fn find_neighbour(dump: &[u8], ifindex: u32, ip: IpAddr) -> Option<[u8; 6]> {
    let want: Vec<u8> = match ip {
        IpAddr::V4(a) => a.octets().to_vec(),
        IpAddr::V6(a) => a.octets().to_vec(),
    };
    for (ty, body) in nl_messages(dump) {
        if ty != RTM_NEWNEIGH || body.len() < 12 {
            continue;
        }
        let idx = i32::from_ne_bytes(body[4..8].try_into().ok()?);
        let state = u16::from_ne_bytes(body[8..10].try_into().ok()?);
        if idx as u32 != ifindex || state & NUD_USABLE == 0 {
            continue;
        }
        let (mut dst, mut ll) = (None, None);
        let mut at = 12;
        while let Some(h) = body.get(at..at + 4) {
            let len = usize::from(u16::from_ne_bytes([h[0], h[1]]));
            let ty = u16::from_ne_bytes([h[2], h[3]]);
            if len < 4 || at + len > body.len() {
                break;
            }
            let v = &body[at + 4..at + len];
            match ty {
                1 => dst = Some(v),
                2 if v.len() == 6 => ll = v.try_into().ok(),
                _ => {}
            }
            at += (len + 3) & !3;
        }
        if dst == Some(&want[..]) {
            if let Some(m) = ll {
                return Some(m);
            }
        }
    }
    None
}

fn lookup_neighbour(ifindex: u32, ip: IpAddr) -> Option<[u8; 6]> {
    let fam = if ip.is_ipv4() {
        libc::AF_INET
    } else {
        libc::AF_INET6
    };
    let dump = xsk::neighbour_dump(fam as u8).ok()?;
    find_neighbour(&dump, ifindex, ip)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn nl(ty: u16, body: &[u8]) -> Vec<u8> {
        let len = 16 + body.len();
        let mut v = Vec::new();
        v.extend_from_slice(&(len as u32).to_ne_bytes());
        v.extend_from_slice(&ty.to_ne_bytes());
        v.extend_from_slice(&[0; 10]);
        v.extend_from_slice(body);
        while v.len() % 4 != 0 {
            v.push(0);
        }
        v
    }

    fn neigh(ifindex: i32, state: u16, dst: &[u8], mac: &[u8]) -> Vec<u8> {
        let mut b = vec![2, 0, 0, 0];
        b.extend_from_slice(&ifindex.to_ne_bytes());
        b.extend_from_slice(&state.to_ne_bytes());
        b.extend_from_slice(&[0, 1]);
        for (ty, v) in [(1u16, dst), (2u16, mac)] {
            b.extend_from_slice(&((4 + v.len()) as u16).to_ne_bytes());
            b.extend_from_slice(&ty.to_ne_bytes());
            b.extend_from_slice(v);
            while b.len() % 4 != 0 {
                b.push(0);
            }
        }
        b
    }

    /// The neighbour dump parser finds the usable entry for the address on
    /// the interface, and nothing in cut-short or foreign entries.
    #[test]
    fn neighbour_dump_parsing() {
        let ip: IpAddr = "10.0.0.2".parse().unwrap();
        let mac = [2, 0, 0, 0, 0, 9];
        let mut d = nl(RTM_NEWNEIGH, &neigh(3, 0x20, &[10, 0, 0, 2], &[1; 6])); // FAILED
        d.extend(nl(RTM_NEWNEIGH, &neigh(4, 0x02, &[10, 0, 0, 2], &[2; 6]))); // other interface
        d.extend(nl(RTM_NEWNEIGH, &neigh(3, 0x04, &[10, 0, 0, 3], &[3; 6]))); // other address
        assert_eq!(find_neighbour(&d, 3, ip), None);
        d.extend(nl(RTM_NEWNEIGH, &neigh(3, 0x04, &[10, 0, 0, 2], &mac)));
        assert!(!dump_done(&d));
        d.extend(nl(NLMSG_DONE, &[0; 4]));
        assert!(dump_done(&d));
        assert_eq!(find_neighbour(&d, 3, ip), Some(mac));
        for cut in 0..d.len() {
            let _ = find_neighbour(&d[..cut], 3, ip);
        }
    }

    #[test]
    fn macs_parse() {
        assert_eq!(
            parse_mac("02:00:0a:4d:01:ff"),
            Some([2, 0, 0x0a, 0x4d, 1, 0xff])
        );
        assert_eq!(parse_mac("02:00:0a:4d:01"), None);
        assert_eq!(parse_mac("02:00:0a:4d:01:ff:00"), None);
        assert_eq!(parse_mac("zz:00:0a:4d:01:ff"), None);
    }

    /// Frames for another address or port, or with a bad checksum, are
    /// not delivered; a good one is, with its ECN codepoint.
    #[test]
    fn received_frames_are_checked() {
        let me: SocketAddr = "10.0.0.2:4791".parse().unwrap();
        let peer: SocketAddr = "10.0.0.1:50000".parse().unwrap();
        let opts = FrameOptions {
            tos: Ecn::Ce.with_tos(0),
            ..FrameOptions::default()
        };
        let f = frame::build_frame(peer, me, &[7; 40], &opts).unwrap();
        assert_eq!(parse_frame(&f, me), Some((peer, Ecn::Ce, &[7u8; 40][..])));
        let other: SocketAddr = "10.0.0.3:4791".parse().unwrap();
        assert_eq!(parse_frame(&f, other), None);
        let mut bad = f.clone();
        bad[14 + 8] ^= 1; // TTL: the header checksum no longer holds
        assert_eq!(parse_frame(&bad, me), None);
        for cut in 0..f.len() {
            assert_eq!(parse_frame(&f[..cut], me), None, "cut at {cut}");
        }
    }
}
