//! The shared-memory port: the [`ShmHub`]'s rings as a packet source and
//! sink without system calls, and its links, grant tables and granted
//! mappings as the direct path's peer memory. Every check of the hub
//! (`shm.rs`, `grant.rs`, `linkmsg.rs`) stays where it is; this file only
//! translates between the hub and the core's traits.

use std::net::SocketAddr;
use std::os::fd::RawFd;
use std::sync::Arc;
use std::time::Duration;

use softrdma_core::{
    GrantAsk, Granted, NotGranted, Outgoing, PeerMemory, Port, Received, Sources, Standing, Window,
};
use softrdma_engine::{GrantFacts, Instant, Qpn, Rkey, RxMeta};

use crate::grant::OutGrant;
use crate::linkmsg::{Grant, GrantRequest};
use crate::segment::Segment;
use crate::shm::{ShmHub, Transport};

/// A region of this device in a segment of its own (`segment.rs`), which a
/// same-host peer may be granted.
#[derive(Debug, Clone)]
pub(crate) struct SharedRegion {
    pub seg: Arc<Segment>,
    /// Where the byte at the region's iova is in the segment.
    pub offset: u64,
}

/// The hub and the regions it may grant.
pub(crate) struct ShmPort {
    pub hub: ShmHub,
    /// Regions of this device a same-host peer may be granted, by rkey.
    pub regions: crate::keymap::KeyMap<Rkey, SharedRegion>,
    /// Kept for `wait_links`.
    fds: Vec<RawFd>,
    ready: Vec<bool>,
}

impl ShmPort {
    pub fn new(hub: ShmHub) -> Self {
        ShmPort {
            hub,
            regions: Default::default(),
            fds: Vec::new(),
            ready: Vec::new(),
        }
    }

    /// Whether the hub carries anything (its transport is not UDP only).
    #[inline]
    pub fn active(&self) -> bool {
        self.hub.mode != Transport::Udp
    }
}

impl Port for ShmPort {
    type Peers = ShmPort;

    fn receive<F>(&mut self, _: Instant, _: Sources, budget: usize, mut rx: F) -> Received
    where
        F: FnMut(SocketAddr, RxMeta, &[u8]),
    {
        // Rings carry no IP header, hence no ECN marks.
        let n = self
            .hub
            .receive(budget, |src, d| rx(src, RxMeta::default(), d));
        Received {
            slow: 0,
            fast: n,
            more: n >= budget,
        }
    }

    /// Takes the packets to same-host peers; the rest stay for UDP.
    fn send(&mut self, _: Instant, out: &mut Outgoing<'_>) {
        let hub = &mut self.hub;
        out.send_each(|ep, _, d| hub.send(ep.src.port(), ep.dst, d));
        hub.flush();
    }

    fn has_fast(&self) -> bool {
        self.hub.has_links()
    }

    fn fast_pending(&self) -> bool {
        self.hub.rx_pending()
    }

    fn maintain(&mut self) {
        self.hub.accept();
        self.hub.check_dead();
    }

    #[inline]
    fn peers(&mut self) -> Option<&mut ShmPort> {
        self.active().then_some(self)
    }
}

fn standing(g: &OutGrant) -> Standing {
    Standing {
        rkey: g.rkey,
        target_qpn: g.target_qpn,
        requester_qpn: g.requester_qpn,
        access: g.access,
        region_access: g.region_access,
        qp_access: g.qp_access,
        slot: g.slot,
    }
}

fn not_granted(e: crate::grant::NotGranted) -> NotGranted {
    match e {
        crate::grant::NotGranted::Missing => NotGranted::Missing,
        crate::grant::NotGranted::Revoked => NotGranted::Revoked,
    }
}

fn request(a: &GrantAsk) -> GrantRequest {
    GrantRequest {
        rkey: a.rkey,
        requester_qpn: a.requester_qpn,
        target_qpn: a.target_qpn,
        access: a.access,
    }
}

impl PeerMemory for ShmPort {
    #[inline]
    fn route(&mut self, dest: SocketAddr) -> Option<usize> {
        self.hub.peer_link(dest)
    }

    #[inline]
    fn routes_gen(&self) -> u64 {
        self.hub.links_gen()
    }

    #[inline]
    fn enter<R>(
        &self,
        route: usize,
        rkey: Rkey,
        qpn: Qpn,
        f: impl FnOnce(&mut Window<'_>) -> R,
    ) -> Result<R, NotGranted> {
        let inside = self.hub.enter(route, rkey, qpn).map_err(not_granted)?;
        let g = &inside.grant.grant;
        let base = inside.grant.ptr(0, g.len).ok_or(NotGranted::Missing)?;
        let granted = Granted {
            rkey: g.rkey,
            target_qpn: g.target_qpn,
            pd: g.pd,
            access: g.access,
            qp_access: g.qp_access,
            iova: g.iova,
            len: g.len,
        };
        // SAFETY: `base..base + len` is the granted region inside the
        // peer's mapped segment (`InGrant::ptr`, whose bounds `install`
        // checked); `inside` holds the peer's fence until `f` returns, so
        // the peer's revocation waits and the mapping stays. Segments are
        // reached only by raw copies and atomics.
        let mut w = unsafe { Window::new(granted, base) };
        let r = f(&mut w);
        drop(inside);
        Ok(r)
    }

    fn ask_grant(&mut self, route: usize, ask: &GrantAsk) -> bool {
        self.hub.ask_grant(route, request(ask))
    }

    fn grant_refused(&self, route: usize, rkey: Rkey, qpn: Qpn) -> bool {
        self.hub.grant_refused(route, rkey, qpn)
    }

    fn forget_grant(&mut self, route: usize, rkey: Rkey, qpn: Qpn) {
        self.hub.forget_grant(route, rkey, qpn)
    }

    fn wait_links(&mut self, timeout: Duration) {
        self.fds.clear();
        self.hub.wait_fds(&mut self.fds);
        crate::sys::wait_readable_any(&self.fds, Some(timeout), &mut self.ready);
        self.hub.accept();
    }

    fn take_requests(&mut self, out: &mut Vec<(SocketAddr, GrantAsk)>) {
        out.extend(self.hub.take_requests().into_iter().map(|(peer, r)| {
            let ask = GrantAsk {
                rkey: r.rkey,
                requester_qpn: r.requester_qpn,
                target_qpn: r.target_qpn,
                access: r.access,
            };
            (peer, ask)
        }));
    }

    /// Grants a region of this device in a segment of its own with the
    /// engine's `facts`; anything else is refused.
    fn answer(&mut self, peer: SocketAddr, ask: &GrantAsk, facts: Option<GrantFacts>) {
        let grant = facts.and_then(|f| {
            let r = self.regions.get(&ask.rkey)?;
            let g = Grant {
                rkey: ask.rkey,
                target_qpn: ask.target_qpn,
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
        self.hub.answer(peer, request(ask), grant);
    }

    fn standing(&self, out: &mut Vec<(SocketAddr, Standing)>) {
        out.extend(
            self.hub
                .standing_grants()
                .iter()
                .map(|(peer, g)| (*peer, standing(g))),
        );
    }

    fn revoke(&mut self, which: &mut dyn FnMut(SocketAddr, &Standing) -> bool) {
        self.hub.revoke(|peer, g| which(peer, &standing(g)));
    }

    /// Takes back the region's grants and waits (bounded) until no
    /// same-host peer is inside it; the segment, when the last reference
    /// to it goes, punches its memory out.
    fn region_gone(&mut self, rkey: Rkey) {
        if self.regions.remove(&rkey).is_some() {
            self.hub.revoke(|_, g| g.rkey == rkey);
        }
    }
}

/// The device's port: same-host destinations over shared memory (when
/// linked), the rest over UDP or AF_XDP.
pub(crate) struct Routed {
    pub shm: ShmPort,
    pub udp: crate::xdp_port::NetPort,
}

impl Port for Routed {
    type Peers = ShmPort;

    fn receive<F>(&mut self, now: Instant, from: Sources, budget: usize, mut rx: F) -> Received
    where
        F: FnMut(SocketAddr, RxMeta, &[u8]),
    {
        let u = self.udp.receive(now, from, budget, &mut rx);
        let s = if self.shm.active() {
            self.shm.receive(now, from, budget, &mut rx)
        } else {
            Received::default()
        };
        u.and(s)
    }

    fn send(&mut self, now: Instant, out: &mut Outgoing<'_>) {
        if self.shm.active() {
            self.shm.send(now, out);
        }
        if !out.is_empty() {
            self.udp.send(now, out);
        }
    }

    fn has_fast(&self) -> bool {
        self.shm.has_fast() || self.udp.has_fast()
    }

    fn fast_pending(&self) -> bool {
        self.shm.fast_pending() || self.udp.fast_pending()
    }

    fn maintain(&mut self) {
        self.shm.maintain()
    }

    #[inline]
    fn peers(&mut self) -> Option<&mut ShmPort> {
        self.shm.peers()
    }

    fn counters(&self, c: &mut softrdma_core::PortCounters) {
        self.udp.counters(c)
    }
}
