//! The UDP port: one socket per device bound to its address on the RoCE
//! port, `recvmmsg` batches (with GRO), `sendmmsg` batches (with GSO towards
//! loopback peers), and one source-port socket per QP so that each QP is
//! one flow (the ICRC covers the source port).

use std::io;
use std::net::{IpAddr, SocketAddr, UdpSocket};

use softrdma_core::{Outgoing, Port, PortCounters, Received, Sources};
use softrdma_engine::{Instant, RxMeta};
use softrdma_wire::icrc;
#[cfg(test)]
use softrdma_wire::Ecn;

use crate::sys;

/// Datagrams (or GRO buffers) per `recvmmsg`.
const RX_BATCH: usize = 32;

thread_local! {
    /// `send`'s list of datagrams, kept empty between sends so that a send
    /// allocates nothing (a latency-bound sender makes one per message).
    static DGRAMS: std::cell::Cell<Vec<sys::Datagram<'static>>> =
        const { std::cell::Cell::new(Vec::new()) };
}

/// A UDP socket bound to `addr`, with DF set for IPv4 (the ICRC the engine
/// computes over a synthesised header assumes an unfragmented packet).
pub(crate) fn bind_socket(addr: SocketAddr) -> io::Result<UdpSocket> {
    let s = UdpSocket::bind(addr)?;
    if let SocketAddr::V4(a) = addr {
        sys::set_dont_fragment(&s)?;
        // Datagrams to multicast groups leave by the device's interface
        // (best effort: a unicast-only socket works without it).
        let _ = sys::set_multicast_if(&s, *a.ip());
    }
    Ok(s)
}

/// The device's UDP socket, its per-QP sending sockets and receive buffers.
pub(crate) struct UdpPort {
    sock: UdpSocket,
    addr: SocketAddr,
    rx: sys::RecvBatch,
    /// Where the next packet of the last `recvmmsg` is: (buffer, datagram
    /// in it).
    cursor: (usize, usize),
    /// Sockets bound to each QP's source port (`None`: the port is taken
    /// on this host), with the TOS byte they send with.
    send_socks: crate::keymap::KeyMap<u16, Option<(UdpSocket, u8)>>,
    /// The TOS byte the device socket sends with.
    main_tos: u8,
    /// Whether sends to loopback peers may use UDP GSO (cleared for good
    /// when the kernel refuses it).
    gso: bool,
    counters: PortCounters,
    /// A socket per multicast group a QP of this device is attached to:
    /// bound to the group's address and the RoCE port, joined to it on the
    /// device's interface.
    groups: Vec<(IpAddr, UdpSocket)>,
    /// The receive buffer of the group sockets.
    group_buf: Vec<u8>,
}

impl UdpPort {
    /// A port on `sock` (bound, non-blocking) at `addr`.
    pub fn new(sock: UdpSocket, addr: SocketAddr, gso: bool) -> Self {
        UdpPort {
            sock,
            addr,
            rx: sys::RecvBatch::new(RX_BATCH, 65536),
            cursor: (0, 0),
            send_socks: Default::default(),
            main_tos: 0,
            gso,
            counters: PortCounters::default(),
            groups: Vec::new(),
            group_buf: Vec::new(),
        }
    }

    /// Receives exactly the multicast groups in `want`: joins the new ones
    /// (a socket bound to `group:port` with `SO_REUSEADDR`, so that every
    /// device of the host gets its copy, and `IP_ADD_MEMBERSHIP` on the
    /// interface of the device's address), leaves the others (closing
    /// the socket drops the membership).
    pub fn set_groups(&mut self, want: &[IpAddr]) -> io::Result<()> {
        self.groups.retain(|(g, _)| want.contains(g));
        for &g in want {
            if self.groups.iter().any(|(h, _)| *h == g) {
                continue;
            }
            let s = sys::bind_reuse_udp(SocketAddr::new(g, self.addr.port()))?;
            match (g, self.addr.ip()) {
                (IpAddr::V4(g4), IpAddr::V4(local)) => s.join_multicast_v4(&g4, &local)?,
                // An IPv6 device: the interface of the default route.
                (IpAddr::V6(g6), IpAddr::V6(_)) => s.join_multicast_v6(&g6, 0)?,
                _ => {
                    return Err(io::Error::new(
                        io::ErrorKind::InvalidInput,
                        format!(
                            "group {g} is of another IP version than the device's {}",
                            self.addr
                        ),
                    ))
                }
            }
            self.groups.push((g, s));
        }
        if self.group_buf.is_empty() && !self.groups.is_empty() {
            self.group_buf = vec![0; 65536];
        }
        Ok(())
    }

    /// The group sockets, for the device's waits.
    pub fn group_fds(&self, out: &mut Vec<std::os::fd::RawFd>) {
        use std::os::fd::AsRawFd;
        out.extend(self.groups.iter().map(|(_, s)| s.as_raw_fd()));
    }

    /// Delivers what the group sockets hold, up to `budget` in all.
    fn receive_groups<F>(&mut self, budget: usize, n: &mut usize, rx: &mut F) -> bool
    where
        F: FnMut(SocketAddr, RxMeta, &[u8]),
    {
        let mut more = false;
        for (g, s) in &self.groups {
            while *n < budget {
                match s.recv_from(&mut self.group_buf) {
                    Ok((len, src)) => {
                        let meta = RxMeta {
                            ecn: Default::default(),
                            group: Some(*g),
                        };
                        rx(src, meta, &self.group_buf[..len]);
                        *n += 1;
                    }
                    Err(_) => break,
                }
            }
            more |= *n >= budget;
        }
        more
    }

    /// Delivers up to `budget` packets of the last `recvmmsg`; true when
    /// its buffers are all delivered. Each buffer is looked up once, and an
    /// exhausted batch (every empty poll) costs one comparison.
    fn deliver<F>(&mut self, budget: usize, n: &mut usize, rx: &mut F) -> bool
    where
        F: FnMut(SocketAddr, RxMeta, &[u8]),
    {
        while self.cursor.0 < self.rx.len() {
            let (i, k) = self.cursor;
            let Some((src, buf, seg)) = self.rx.get(i) else {
                self.cursor = (i + 1, 0);
                continue;
            };
            if k == 0 && seg < buf.len() {
                self.counters.gro_buffers += 1;
            }
            let meta = RxMeta {
                ecn: self.rx.ecn(i),
                group: None,
            };
            // One RoCE packet per datagram, however many GRO coalesced.
            for (j, d) in sys::segments(buf, seg).enumerate().skip(k) {
                if *n >= budget {
                    self.cursor = (i, j);
                    return false;
                }
                rx(src, meta, d);
                *n += 1;
            }
            self.cursor = (i + 1, 0);
        }
        true
    }
}

impl Port for UdpPort {
    type Peers = softrdma_core::NoPeers;

    fn receive<F>(&mut self, _: Instant, from: Sources, budget: usize, mut rx: F) -> Received
    where
        F: FnMut(SocketAddr, RxMeta, &[u8]),
    {
        let mut n = 0;
        // What an earlier read brought in costs no system call: delivered
        // whatever the sources asked for.
        let mut done = self.deliver(budget, &mut n, &mut rx);
        if done && n == 0 && from == Sources::All {
            self.cursor = (0, 0);
            if self.rx.recv(&self.sock) > 0 {
                done = self.deliver(budget, &mut n, &mut rx);
            }
        }
        let mut group_more = false;
        if !self.groups.is_empty() && from == Sources::All && done {
            group_more = self.receive_groups(budget, &mut n, &mut rx);
        }
        Received {
            slow: n,
            fast: 0,
            // Left in the buffers, or a full read: more may be waiting.
            more: !done || (n > 0 && self.rx.full()) || group_more,
        }
    }

    /// Sends the batch, one `sendmmsg` per run of equal source ports.
    ///
    /// A packet whose payload the engine left in its region goes as three
    /// pieces — headers, the payload read in place, pad and ICRC — that
    /// the kernel gathers into one datagram (and, with GSO, into one stream
    /// cut at the segment size, so datagrams stay exactly as built).
    fn send(&mut self, _: Instant, out: &mut Outgoing<'_>) {
        let n = out.len();
        let mut start = 0;
        while start < n {
            // A run shares its socket and, with it, the TOS byte (ECN).
            let (port, ecn) = (out.endpoints(start).src.port(), out.ecn(start));
            let mut end = start + 1;
            while end < n && out.endpoints(end).src.port() == port && out.ecn(end) == ecn {
                end += 1;
            }
            self.send_run(out, start, end, port);
            start = end;
        }
    }

    fn counters(&self, c: &mut PortCounters) {
        c.send_errors += self.counters.send_errors;
        c.gso_sends += self.counters.gso_sends;
        c.gro_buffers += self.counters.gro_buffers;
    }
}

impl UdpPort {
    /// Sends packets `start..end` of `out`, all from source port `port`.
    fn send_run(&mut self, out: &mut Outgoing<'_>, start: usize, end: usize, port: u16) {
        let ip = self.addr.ip();
        let sock = self
            .send_socks
            .entry(port)
            .or_insert_with(|| bind_socket(SocketAddr::new(ip, port)).ok().map(|s| (s, 0)));
        if sock.is_none() {
            // That source port is taken on this host: send from the device
            // port instead, resealing the ICRC that covers it.
            for i in start..end {
                let mut ep = out.endpoints(i);
                ep.src = self.addr;
                let _ = icrc::seal(&ep, out.whole(i));
                out.set_endpoints(i, ep);
            }
        }
        // This thread's kept (empty) list, borrowing `out` for this send only.
        // A send during process exit (rdma_cm's exit handler ends the
        // connections) finds the thread's storage gone: a new list then.
        let mut pkts: Vec<sys::Datagram<'_>> = DGRAMS.try_with(|d| d.take()).unwrap_or_default();
        pkts.extend((start..end).map(|i| {
            let dst = out.endpoints(i).dst;
            let p = out.parts(i);
            match p.payload {
                // SAFETY: the payload lies in a registered region of this
                // device (`RegionMemory::tx_addr` of our own region types:
                // process memory valid while registered), and `out` borrows
                // the engine, so no deregistration happens before the send
                // below returns.
                Some((addr, len)) => unsafe {
                    sys::Datagram::gathered(dst, p.head, addr, len, p.tail)
                },
                None => sys::Datagram::new(dst, p.head),
            }
        }));
        let (s, tos) = match sock {
            Some((s, tos)) => (&*s, tos),
            None => (&self.sock, &mut self.main_tos),
        };
        // The ECN codepoint goes in the IP header: set on the socket, and
        // only when it changes (a QP's packets normally all carry the same).
        let want = out.ecn(start).with_tos(0);
        if *tos != want && sys::set_tos(s, ip.is_ipv6(), want) {
            *tos = want;
        }
        // GSO only towards loopback peers. Where a device splits a GSO send
        // (a NIC, or veth into a socket without GRO), the kernel numbers the
        // IPv4 IDs of the pieces, but the ICRCs were computed for ID 0 (and
        // rxe checks them against the real header); on loopback no
        // receiving socket sees the IP header.
        let lo = pkts.iter().all(|d| d.dst.ip().is_loopback());
        let mut use_gso = self.gso && lo;
        let (sent, gso_msgs) = sys::send_batch(s, &pkts, &mut use_gso).unwrap_or((0, 0));
        self.counters.gso_sends += gso_msgs as u64;
        if lo && !use_gso {
            // The kernel refused: plain sends from now on.
            self.gso = false;
        }
        self.counters.send_errors += (pkts.len() - sent) as u64;
        // Back to an empty list of the longer lifetime: the filter_map
        // changes the lifetime (a filter could not) and, yielding nothing,
        // its collect reuses the allocation in place.
        #[allow(clippy::unnecessary_filter_map)]
        let empty = pkts.into_iter().filter_map(|_| None).collect();
        let _ = DGRAMS.try_with(|d| d.set(empty));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The ECN codepoint set on a sending socket (IP_TOS) arrives with the
    /// datagram (IP_RECVTOS) and reaches the engine's `RxMeta`.
    #[test]
    fn ecn_set_on_a_sending_socket_arrives_through_the_udp_port() {
        let any = SocketAddr::from(([127, 0, 0, 1], 0));
        let rx_sock = bind_socket(any).unwrap();
        rx_sock.set_nonblocking(true).unwrap();
        assert!(sys::enable_recv_tos(&rx_sock, false));
        let at = rx_sock.local_addr().unwrap();
        let mut port = UdpPort::new(rx_sock, at, false);
        let tx = bind_socket(any).unwrap();
        let mut got = Vec::new();
        for ecn in [Ecn::Ce, Ecn::Ect0, Ecn::NotEct] {
            assert!(sys::set_tos(&tx, false, ecn.with_tos(0)));
            tx.send_to(&[ecn as u8; 40], at).unwrap();
            let mut r = Received::default();
            for _ in 0..1000 {
                r = port.receive(Instant(0), Sources::All, 32, |src, meta, d| {
                    got.push((src, meta.ecn, d.to_vec()))
                });
                if r.slow > 0 {
                    break;
                }
                std::thread::sleep(std::time::Duration::from_millis(1));
            }
            assert_eq!(r.slow, 1);
        }
        let from = tx.local_addr().unwrap();
        let want: Vec<_> = [Ecn::Ce, Ecn::Ect0, Ecn::NotEct]
            .into_iter()
            .map(|e| (from, e, vec![e as u8; 40]))
            .collect();
        assert_eq!(got, want);
    }
}
