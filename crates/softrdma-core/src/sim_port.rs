//! A port over in-memory queues, for simulators: whoever runs the
//! simulation moves packets from one port's outbox to another's inbox
//! (with its own delays, losses and reorderings) and passes the virtual
//! time in. Nothing here reads a clock or waits, so a run is a function of
//! its seed.
//!
//! Same-host mode ([`SimHost`]): ports that join one host reach each
//! other's regions directly, as shared memory does between processes. A
//! region is offered with [`SimPeers::share`] over [`HostMemory`] (memory
//! with real addresses, which the direct path needs); grants follow the
//! same protocol as the shared-memory driver's — asked by the initiator,
//! answered with the engine's rules by the target when its progress runs,
//! revoked when those rules change — with the messages as table entries.

use std::collections::VecDeque;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use softrdma_engine::{GrantFacts, Instant, Qpn, RegionMemory, Rkey, RxMeta};
use softrdma_wire::{Ecn, Endpoints};

use crate::port::{
    GrantAsk, Granted, NotGranted, Outgoing, PeerMemory, Port, Received, Sources, Standing, Window,
};

/// A packet a [`SimPort`] sent.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SimPacket {
    pub endpoints: Endpoints,
    pub ecn: Ecn,
    /// The QP that sent it.
    pub qpn: Qpn,
    pub data: Vec<u8>,
}

/// A port whose wire is two queues.
#[derive(Debug)]
pub struct SimPort {
    inbox: VecDeque<(SocketAddr, RxMeta, Vec<u8>)>,
    outbox: VecDeque<SimPacket>,
    peers: Option<SimPeers>,
}

impl SimPort {
    /// A port with empty queues and no same-host peers.
    pub fn new() -> Self {
        SimPort {
            inbox: VecDeque::new(),
            outbox: VecDeque::new(),
            peers: None,
        }
    }

    /// The port of `local` on `host`: same-host peers reach each other's
    /// shared regions directly.
    pub fn on_host(host: &SimHost, local: SocketAddr) -> Self {
        SimPort {
            peers: Some(host.join(local)),
            ..Self::new()
        }
    }

    /// Queues a packet for the next receive.
    pub fn deliver(&mut self, src: SocketAddr, meta: RxMeta, data: Vec<u8>) {
        self.inbox.push_back((src, meta, data));
    }

    /// The oldest packet sent and not yet taken.
    pub fn take_sent(&mut self) -> Option<SimPacket> {
        self.outbox.pop_front()
    }

    /// Packets waiting to be received.
    pub fn pending(&self) -> usize {
        self.inbox.len()
    }

    /// The same-host side, if on a host.
    pub fn peers_mut(&mut self) -> Option<&mut SimPeers> {
        self.peers.as_mut()
    }
}

impl Default for SimPort {
    fn default() -> Self {
        Self::new()
    }
}

impl Port for SimPort {
    type Peers = SimPeers;

    fn receive<F>(&mut self, _: Instant, _: Sources, budget: usize, mut rx: F) -> Received
    where
        F: FnMut(SocketAddr, RxMeta, &[u8]),
    {
        let mut n = 0;
        while n < budget {
            let Some((src, meta, d)) = self.inbox.pop_front() else {
                break;
            };
            rx(src, meta, &d);
            n += 1;
        }
        Received {
            slow: 0,
            fast: n,
            more: !self.inbox.is_empty(),
        }
    }

    fn send(&mut self, _: Instant, out: &mut Outgoing<'_>) {
        for i in 0..out.len() {
            let (endpoints, ecn, qpn) = (out.endpoints(i), out.ecn(i), out.transmit(i).qpn);
            let data = out.whole(i).to_vec();
            self.outbox.push_back(SimPacket {
                endpoints,
                ecn,
                qpn,
                data,
            });
        }
        out.clear();
    }

    fn peers(&mut self) -> Option<&mut SimPeers> {
        self.peers.as_mut()
    }
}

/// Memory with real addresses for simulated regions that same-host peers
/// may reach directly (and that the engine sends from in place). Reached
/// only by raw copies and atomics, never through references.
#[derive(Debug)]
pub struct HostMemory {
    words: Box<[AtomicU64]>,
    len: usize,
}

impl HostMemory {
    /// `len` zero bytes, 8-aligned.
    pub fn new(len: usize) -> Arc<Self> {
        let words = (0..len.div_ceil(8)).map(|_| AtomicU64::new(0)).collect();
        Arc::new(HostMemory { words, len })
    }

    fn base(&self) -> *mut u8 {
        self.words.as_ptr().cast_mut().cast()
    }

    /// A copy of the bytes.
    pub fn snapshot(&self) -> Vec<u8> {
        let mut v = vec![0; self.len];
        self.read(0, &mut v);
        v
    }
}

impl RegionMemory for HostMemory {
    fn len(&self) -> usize {
        self.len
    }
    fn read(&self, offset: usize, dst: &mut [u8]) {
        assert!(offset + dst.len() <= self.len, "read outside the region");
        // SAFETY: inside the allocation (asserted); its bytes are atomics'
        // storage, reached only by raw copies and atomics.
        unsafe {
            std::ptr::copy_nonoverlapping(self.base().add(offset), dst.as_mut_ptr(), dst.len())
        }
    }
    fn write(&self, offset: usize, src: &[u8]) {
        assert!(offset + src.len() <= self.len, "write outside the region");
        // SAFETY: as in `read`.
        unsafe { std::ptr::copy_nonoverlapping(src.as_ptr(), self.base().add(offset), src.len()) }
    }
    fn compare_swap(&self, offset: usize, compare: u64, swap: u64) -> u64 {
        match self.words[offset / 8].compare_exchange(
            compare,
            swap,
            Ordering::SeqCst,
            Ordering::SeqCst,
        ) {
            Ok(v) | Err(v) => v,
        }
    }
    fn fetch_add(&self, offset: usize, add: u64) -> u64 {
        self.words[offset / 8].fetch_add(add, Ordering::SeqCst)
    }
    fn tx_addr(&self, offset: usize) -> Option<usize> {
        Some(self.base() as usize + offset)
    }
}

/// A grant made on a simulated host.
#[derive(Debug)]
struct HostGrant {
    granter: SocketAddr,
    holder: SocketAddr,
    ask: GrantAsk,
    granted: Granted,
    standing: Standing,
    mem: Arc<HostMemory>,
    revoked: bool,
}

#[derive(Debug, Default)]
struct HostTable {
    /// Bumped when a port joins or leaves.
    gen: u64,
    nodes: Vec<SocketAddr>,
    shared: Vec<(SocketAddr, Rkey, Arc<HostMemory>)>,
    /// Unanswered requests: (target, requester, ask).
    requests: Vec<(SocketAddr, SocketAddr, GrantAsk)>,
    grants: Vec<HostGrant>,
    /// Refused requests: (holder, granter, rkey, target QP).
    refused: Vec<(SocketAddr, SocketAddr, Rkey, Qpn)>,
    next_slot: u32,
}

/// One simulated host: the ports on it are same-host peers.
#[derive(Debug, Clone, Default)]
pub struct SimHost(Arc<Mutex<HostTable>>);

impl SimHost {
    /// A host with no ports yet.
    pub fn new() -> Self {
        Self::default()
    }
    fn join(&self, local: SocketAddr) -> SimPeers {
        let mut t = lock(&self.0);
        t.nodes.push(local);
        t.gen += 1;
        SimPeers {
            host: self.clone(),
            local,
        }
    }
}

fn lock(m: &Mutex<HostTable>) -> MutexGuard<'_, HostTable> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// One port's view of its simulated host.
#[derive(Debug)]
pub struct SimPeers {
    host: SimHost,
    local: SocketAddr,
}

impl SimPeers {
    /// Offers region `rkey` of this port's engine, backed by `mem`, to
    /// same-host peers that the engine's rules let in.
    pub fn share(&mut self, rkey: Rkey, mem: Arc<HostMemory>) {
        lock(&self.host.0).shared.push((self.local, rkey, mem));
    }

    /// Grants this port holds from peers (not revoked).
    pub fn grants_held(&self) -> usize {
        let t = lock(&self.host.0);
        t.grants
            .iter()
            .filter(|g| g.holder == self.local && !g.revoked)
            .count()
    }
}

impl Drop for SimPeers {
    fn drop(&mut self) {
        let me = self.local;
        let mut t = lock(&self.host.0);
        t.nodes.retain(|&n| n != me);
        t.shared.retain(|s| s.0 != me);
        t.grants.retain(|g| g.granter != me && g.holder != me);
        t.gen += 1;
    }
}

impl PeerMemory for SimPeers {
    fn route(&mut self, dest: SocketAddr) -> Option<usize> {
        let t = lock(&self.host.0);
        t.nodes.iter().position(|&n| n == dest && n != self.local)
    }

    fn routes_gen(&self) -> u64 {
        lock(&self.host.0).gen
    }

    fn enter<R>(
        &self,
        route: usize,
        rkey: Rkey,
        qpn: Qpn,
        f: impl FnOnce(&mut Window<'_>) -> R,
    ) -> Result<R, NotGranted> {
        let t = lock(&self.host.0);
        let granter = *t.nodes.get(route).ok_or(NotGranted::Missing)?;
        let g = t
            .grants
            .iter()
            .find(|g| {
                g.holder == self.local
                    && g.granter == granter
                    && (g.ask.rkey, g.ask.target_qpn) == (rkey, qpn)
            })
            .ok_or(NotGranted::Missing)?;
        if g.revoked {
            return Err(NotGranted::Revoked);
        }
        // SAFETY: the grant keeps `mem` alive, and the table lock held until
        // `f` returns keeps the grant; `granted.len` is the region's length,
        // within `mem` (checked when granted). HostMemory is reached only by
        // raw copies and atomics.
        let mut w = unsafe { Window::new(g.granted, g.mem.base()) };
        Ok(f(&mut w))
    }

    fn ask_grant(&mut self, route: usize, ask: &GrantAsk) -> bool {
        let mut t = lock(&self.host.0);
        let Some(&granter) = t.nodes.get(route) else {
            return false;
        };
        let me = self.local;
        let key = (granter, me, *ask);
        if t.requests.contains(&key) {
            return false;
        }
        t.refused
            .retain(|r| *r != (me, granter, ask.rkey, ask.target_qpn));
        t.requests.push(key);
        true
    }

    fn grant_refused(&self, route: usize, rkey: Rkey, qpn: Qpn) -> bool {
        let t = lock(&self.host.0);
        t.nodes
            .get(route)
            .is_none_or(|&g| t.refused.contains(&(self.local, g, rkey, qpn)))
    }

    fn forget_grant(&mut self, route: usize, rkey: Rkey, qpn: Qpn) {
        let mut t = lock(&self.host.0);
        let Some(&granter) = t.nodes.get(route) else {
            return;
        };
        let me = self.local;
        t.grants.retain(|g| {
            !(g.holder == me
                && g.granter == granter
                && (g.ask.rkey, g.ask.target_qpn) == (rkey, qpn))
        });
    }

    /// A simulation never waits: the answer comes when the target's
    /// progress runs, and until then operations take the engine's path.
    fn wait_links(&mut self, _: Duration) {}

    fn take_requests(&mut self, out: &mut Vec<(SocketAddr, GrantAsk)>) {
        let mut t = lock(&self.host.0);
        let me = self.local;
        t.requests.retain(|&(target, from, ask)| {
            if target != me {
                return true;
            }
            out.push((from, ask));
            false
        });
    }

    fn answer(&mut self, peer: SocketAddr, ask: &GrantAsk, facts: Option<GrantFacts>) {
        let mut t = lock(&self.host.0);
        let me = self.local;
        let mem = t
            .shared
            .iter()
            .find(|s| (s.0, s.1) == (me, ask.rkey))
            .map(|s| s.2.clone());
        let (Some(f), Some(mem)) = (facts, mem) else {
            t.refused.push((peer, me, ask.rkey, ask.target_qpn));
            return;
        };
        if f.len > mem.len as u64 {
            t.refused.push((peer, me, ask.rkey, ask.target_qpn));
            return;
        }
        let slot = t.next_slot;
        t.next_slot += 1;
        let granted = Granted {
            rkey: ask.rkey,
            target_qpn: ask.target_qpn,
            pd: f.pd,
            access: f.access.bits(),
            qp_access: f.qp_access.bits(),
            iova: f.iova,
            len: f.len,
        };
        let standing = Standing {
            rkey: ask.rkey,
            target_qpn: ask.target_qpn,
            requester_qpn: ask.requester_qpn,
            access: ask.access,
            region_access: f.access.bits(),
            qp_access: f.qp_access.bits(),
            slot,
        };
        t.grants.push(HostGrant {
            granter: me,
            holder: peer,
            ask: *ask,
            granted,
            standing,
            mem,
            revoked: false,
        });
    }

    fn standing(&self, out: &mut Vec<(SocketAddr, Standing)>) {
        let t = lock(&self.host.0);
        out.extend(
            t.grants
                .iter()
                .filter(|g| g.granter == self.local && !g.revoked)
                .map(|g| (g.holder, g.standing)),
        );
    }

    fn revoke(&mut self, which: &mut dyn FnMut(SocketAddr, &Standing) -> bool) {
        let mut t = lock(&self.host.0);
        for g in t.grants.iter_mut().filter(|g| g.granter == self.local) {
            if !g.revoked && which(g.holder, &g.standing) {
                g.revoked = true;
            }
        }
    }

    fn region_gone(&mut self, rkey: Rkey) {
        let mut t = lock(&self.host.0);
        let me = self.local;
        t.shared.retain(|s| (s.0, s.1) != (me, rkey));
        for g in t.grants.iter_mut() {
            if g.granter == me && g.ask.rkey == rkey {
                g.revoked = true;
            }
        }
    }
}
