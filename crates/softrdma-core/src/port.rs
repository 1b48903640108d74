//! The port trait: what the device core needs from the outside world.
//!
//! A port moves whole RoCEv2 UDP payloads in and out (UDP sockets, shared
//! memory rings, the simulator's queues) and, when it can reach same-host
//! peers' memory, offers it to the direct path through [`PeerMemory`]. The
//! core ([`crate::DeviceCore`]) decides when to receive, what to send and
//! which operations go direct; a port decides only how.
//!
//! Ports compose: [`crate::Capture`] and [`crate::Faulty`] wrap any port,
//! and a driver may route between two (UDP and shared memory) in a port of
//! its own. Every method is called with static dispatch from the core's
//! loops, so a port's fast path costs what its own code costs.

use std::marker::PhantomData;
use std::net::SocketAddr;
use std::time::Duration;

use softrdma_engine::{
    AccessFlags, Engine, GrantFacts, Instant, PdHandle, PeerQp, PeerRegion, PeerView, QpState, Qpn,
    Rkey, RxMeta, Transmit,
};
use softrdma_wire::{Ecn, Endpoints};

/// Room for one packet: 4096 payload + headers + ICRC, with room to spare.
pub const BUF_LEN: usize = 4096 + 256;
/// Packets per send batch: a whole window (`max_inflight`), so that with
/// GSO a burst leaves in few system calls.
pub const TX_BATCH: usize = 128;

/// Which sources a receive reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Sources {
    /// Every source, system calls included.
    All,
    /// Only sources read without a system call (shared-memory rings, the
    /// simulator's queues): an idle UDP socket is not read on every poll.
    Fast,
}

/// What one [`Port::receive`] delivered.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Received {
    /// Packets from sources that cost a system call (UDP).
    pub slow: usize,
    /// Packets from the others.
    pub fast: usize,
    /// More may be waiting: a source filled the budget or kept packets
    /// back for the next call.
    pub more: bool,
}

impl Received {
    /// Adds another source's receive.
    pub fn and(self, o: Received) -> Received {
        Received {
            slow: self.slow + o.slow,
            fast: self.fast + o.fast,
            more: self.more || o.more,
        }
    }
}

/// Counters of ports (the engine counts the protocol, the core the direct
/// path); every wrapper adds its own.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PortCounters {
    /// Packets that could not be sent (the engine retransmits RC).
    pub send_errors: u64,
    /// Packets altered, dropped, duplicated or held back by fault injection.
    pub faults_injected: u64,
    /// Sends that carried several datagrams at once (UDP GSO).
    pub gso_sends: u64,
    /// Received buffers that held several datagrams (UDP GRO).
    pub gro_buffers: u64,
}

/// A way in and out for packets.
pub trait Port {
    /// Same-host peers' memory for the direct path ([`NoPeers`] if none).
    type Peers: PeerMemory;

    /// Delivers received packets to `rx(source, meta, bytes)`, at most
    /// `budget` per source; the rest wait for the next call (`more`).
    fn receive<F>(&mut self, now: Instant, from: Sources, budget: usize, rx: F) -> Received
    where
        F: FnMut(SocketAddr, RxMeta, &[u8]);

    /// Sends the packets of `out`. A port that takes only some (a
    /// same-host route) removes those it sent with
    /// [`Outgoing::send_each`] and leaves the rest for the next port.
    fn send(&mut self, now: Instant, out: &mut Outgoing<'_>);

    /// Whether a source read without system calls is attached (a
    /// same-host peer is linked): only then do inline polls skip the slow
    /// sources while they are idle.
    fn has_fast(&self) -> bool {
        false
    }

    /// Whether a fast source holds packets right now.
    fn fast_pending(&self) -> bool {
        false
    }

    /// When a packet this port holds back (a fault injector's delay) is
    /// due, if any is: the device must poll again by then.
    fn next_due(&self) -> Option<Instant> {
        None
    }

    /// Housekeeping at the slow sources' cadence (new and dead peers);
    /// may make system calls.
    fn maintain(&mut self) {}

    /// Whether operations may bypass the packets (the direct path, and
    /// grants to peers for theirs): not under fault injection, which acts
    /// on packets.
    fn direct_allowed(&self) -> bool {
        true
    }

    /// Same-host peers' memory (routes, grants), if the port has any.
    fn peers(&mut self) -> Option<&mut Self::Peers> {
        None
    }

    /// Adds this port's counters to `c`.
    fn counters(&self, c: &mut PortCounters) {
        let _ = c;
    }
}

/// A grant request of the same-host protocol: the requester's QP wants
/// `access` on the target's region `rkey` through the target's QP.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GrantAsk {
    pub rkey: Rkey,
    /// The requester's QP, which must be the target QP's destination.
    pub requester_qpn: Qpn,
    /// The target's QP the requester is connected to.
    pub target_qpn: Qpn,
    /// The one remote right needed (`AccessFlags` bits).
    pub access: u32,
}

/// A grant this device made and that stands, as the port's tables hold it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Standing {
    pub rkey: Rkey,
    pub target_qpn: Qpn,
    pub requester_qpn: Qpn,
    /// The right granted.
    pub access: u32,
    /// The region's and the QP's access flags when granted.
    pub region_access: u32,
    pub qp_access: u32,
    /// Where it is in the port's table (identifies it with the peer).
    pub slot: u32,
}

/// Why no operation can enter a region directly.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NotGranted {
    /// No grant for the rkey (ask for one).
    Missing,
    /// The grant was taken back (forget it).
    Revoked,
}

/// What a target granted on a region, as the initiator's copy of the
/// target's rules reads it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Granted {
    pub rkey: Rkey,
    /// The target's QP the grant is for.
    pub target_qpn: Qpn,
    pub pd: PdHandle,
    /// The region's access flags.
    pub access: u32,
    /// The target QP's access flags.
    pub qp_access: u32,
    pub iova: u64,
    pub len: u64,
}

/// A granted region entered by the initiator: its bytes are reachable at
/// `base..base + len` while the window lives.
pub struct Window<'a> {
    granted: Granted,
    base: *mut u8,
    _inside: PhantomData<&'a ()>,
}

impl<'a> Window<'a> {
    /// A window on a granted region mapped at `base`.
    ///
    /// # Safety
    /// `base..base + granted.len` must be memory of this process, valid for
    /// reads, writes and 8-byte atomics for `'a`, that no Rust reference
    /// covers (others may write it at any time: it is reached only by raw
    /// copies and atomics).
    pub unsafe fn new(granted: Granted, base: *mut u8) -> Self {
        Window {
            granted,
            base,
            _inside: PhantomData,
        }
    }

    /// What was granted.
    pub fn granted(&self) -> &Granted {
        &self.granted
    }

    /// The address of `len` bytes at `off` in the region, when inside it.
    pub fn ptr(&self, off: u64, len: u64) -> Option<*mut u8> {
        let end = off.checked_add(len)?;
        if end > self.granted.len {
            return None;
        }
        // `off < end <= granted.len`, inside the mapping (`new`'s contract).
        Some(self.base.wrapping_add(off as usize))
    }
}

/// The target's QP as granted: taking requests while the grant stands (it
/// is revoked when that changes).
impl PeerView for Window<'_> {
    fn qp(&mut self, qpn: Qpn) -> Option<PeerQp> {
        (qpn == self.granted.target_qpn).then_some(PeerQp {
            pd: self.granted.pd,
            access: AccessFlags(self.granted.qp_access),
            state: QpState::Rts,
        })
    }
    fn region(&mut self, rkey: Rkey) -> Option<PeerRegion> {
        (rkey == self.granted.rkey).then_some(PeerRegion {
            pd: self.granted.pd,
            access: AccessFlags(self.granted.access),
            iova: self.granted.iova,
            len: self.granted.len,
        })
    }
}

/// Same-host peers: routes to them, the regions they granted this device
/// (initiator side) and the grants this device made (target side). The
/// engine's rules are the core's business; a port keeps the tables and
/// the link messages.
pub trait PeerMemory {
    /// The route (an index the port understands) to `dest` when it is a
    /// same-host peer whose link is up.
    fn route(&mut self, dest: SocketAddr) -> Option<usize>;
    /// Changes whenever a route may have changed (links up or down).
    fn routes_gen(&self) -> u64;
    /// Runs `f` inside the region granted under `rkey` through the peer's QP
    /// `qpn` on `route` (the peer's revocation waits until `f` returns).
    fn enter<R>(
        &self,
        route: usize,
        rkey: Rkey,
        qpn: Qpn,
        f: impl FnOnce(&mut Window<'_>) -> R,
    ) -> Result<R, NotGranted>;
    /// Asks the peer for a grant (unless asked lately); true when asked.
    fn ask_grant(&mut self, route: usize, ask: &GrantAsk) -> bool;
    /// Whether the peer refused `rkey` through `qpn` lately.
    fn grant_refused(&self, route: usize, rkey: Rkey, qpn: Qpn) -> bool;
    /// Forgets a grant found revoked.
    fn forget_grant(&mut self, route: usize, rkey: Rkey, qpn: Qpn);
    /// Waits up to `timeout` for link traffic (a grant answer), taking in
    /// what arrives; a port that cannot wait returns at once.
    fn wait_links(&mut self, timeout: Duration);
    /// Grant requests received since the last call, appended to `out`.
    fn take_requests(&mut self, out: &mut Vec<(SocketAddr, GrantAsk)>);
    /// Answers a request: grants it with the engine's `facts`, or refuses
    /// (`None`, or when the port has no shareable memory for the region).
    fn answer(&mut self, peer: SocketAddr, ask: &GrantAsk, facts: Option<GrantFacts>);
    /// The grants standing, appended to `out`.
    fn standing(&self, out: &mut Vec<(SocketAddr, Standing)>);
    /// Revokes the grants `which` selects, waiting (bounded) until no peer
    /// operation is inside them.
    fn revoke(&mut self, which: &mut dyn FnMut(SocketAddr, &Standing) -> bool);
    /// Region `rkey` was deregistered: its grants go, and its memory is no
    /// longer offered.
    fn region_gone(&mut self, rkey: Rkey);
}

/// The peer memory of a port without any: the direct path is off.
#[derive(Debug)]
pub enum NoPeers {}

impl PeerMemory for NoPeers {
    fn route(&mut self, _: SocketAddr) -> Option<usize> {
        match *self {}
    }
    fn routes_gen(&self) -> u64 {
        match *self {}
    }
    fn enter<R>(
        &self,
        _: usize,
        _: Rkey,
        _: Qpn,
        _: impl FnOnce(&mut Window<'_>) -> R,
    ) -> Result<R, NotGranted> {
        match *self {}
    }
    fn ask_grant(&mut self, _: usize, _: &GrantAsk) -> bool {
        match *self {}
    }
    fn grant_refused(&self, _: usize, _: Rkey, _: Qpn) -> bool {
        match *self {}
    }
    fn forget_grant(&mut self, _: usize, _: Rkey, _: Qpn) {
        match *self {}
    }
    fn wait_links(&mut self, _: Duration) {
        match *self {}
    }
    fn take_requests(&mut self, _: &mut Vec<(SocketAddr, GrantAsk)>) {
        match *self {}
    }
    fn answer(&mut self, _: SocketAddr, _: &GrantAsk, _: Option<GrantFacts>) {
        match *self {}
    }
    fn standing(&self, _: &mut Vec<(SocketAddr, Standing)>) {
        match *self {}
    }
    fn revoke(&mut self, _: &mut dyn FnMut(SocketAddr, &Standing) -> bool) {
        match *self {}
    }
    fn region_gone(&mut self, _: Rkey) {
        match *self {}
    }
}

/// Packets the engine built, waiting to be sent together.
pub struct TxBatch {
    data: Box<[u8]>,
    tx: Vec<Transmit>,
    n: usize,
}

impl std::fmt::Debug for TxBatch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TxBatch").field("n", &self.n).finish()
    }
}

impl Default for TxBatch {
    fn default() -> Self {
        Self::new()
    }
}

impl TxBatch {
    /// An empty batch of [`TX_BATCH`] slots.
    pub fn new() -> Self {
        let none = SocketAddr::from(([0, 0, 0, 0], 0));
        let empty = Transmit {
            len: 0,
            endpoints: Endpoints::new(none, none),
            qpn: Qpn::from_raw(0),
            ecn: Ecn::NotEct,
            payload: None,
        };
        TxBatch {
            data: vec![0; TX_BATCH * BUF_LEN].into_boxed_slice(),
            tx: vec![empty; TX_BATCH],
            n: 0,
        }
    }

    /// Packets in the batch.
    pub fn len(&self) -> usize {
        self.n
    }

    /// Whether it holds none.
    pub fn is_empty(&self) -> bool {
        self.n == 0
    }

    /// Whether every slot is taken.
    pub fn is_full(&self) -> bool {
        self.n == TX_BATCH
    }

    /// Fills free slots from `engine` (payloads left in their regions where
    /// the engine can); false when the engine had nothing more.
    pub fn fill(&mut self, engine: &mut Engine, now: Instant) -> bool {
        while self.n < TX_BATCH {
            let slot = &mut self.data[self.n * BUF_LEN..(self.n + 1) * BUF_LEN];
            let Some(t) = engine.poll_transmit_gather(now, slot) else {
                return false;
            };
            self.tx[self.n] = t;
            self.n += 1;
        }
        true
    }

    /// The batch as a port sends it. `engine` is the one that built it: a
    /// payload left in a region is read from there, and the borrow keeps
    /// the region registered until the send is over.
    pub fn outgoing<'a>(&'a mut self, engine: &'a Engine) -> Outgoing<'a> {
        Outgoing {
            batch: self,
            engine,
        }
    }
}

/// A batch being sent: each packet is a slot, or a slot around a payload
/// still in its registered region ([`Transmit::payload`]).
pub struct Outgoing<'a> {
    batch: &'a mut TxBatch,
    engine: &'a Engine,
}

/// A packet in three pieces for a gathering send: headers, the payload
/// where it lies, pad and ICRC.
#[derive(Debug, Clone, Copy)]
pub struct Parts<'a> {
    pub head: &'a [u8],
    /// Address and length of the payload in a registered region of this
    /// process, valid while the [`Outgoing`] lives (absent: `head` is the
    /// whole packet).
    pub payload: Option<(*const u8, usize)>,
    pub tail: &'a [u8],
}

impl Outgoing<'_> {
    /// Packets left to send.
    pub fn len(&self) -> usize {
        self.batch.n
    }

    /// Whether none is left.
    pub fn is_empty(&self) -> bool {
        self.batch.n == 0
    }

    /// What the engine said about packet `i`.
    pub fn transmit(&self, i: usize) -> &Transmit {
        &self.batch.tx[i]
    }

    /// The UDP endpoints of packet `i`.
    pub fn endpoints(&self, i: usize) -> Endpoints {
        self.batch.tx[i].endpoints
    }

    /// The ECN codepoint packet `i` must carry.
    pub fn ecn(&self, i: usize) -> Ecn {
        self.batch.tx[i].ecn
    }

    /// Sends packet `i` from elsewhere (a port that resealed its ICRC for
    /// another source port).
    pub fn set_endpoints(&mut self, i: usize, ep: Endpoints) {
        self.batch.tx[i].endpoints = ep;
    }

    /// Packet `i` whole in its slot (its payload copied in if the engine
    /// left it in a region), for paths that need it in one piece.
    pub fn whole(&mut self, i: usize) -> &mut [u8] {
        let t = self.batch.tx[i];
        let slot = &mut self.batch.data[i * BUF_LEN..(i + 1) * BUF_LEN];
        if t.payload.is_some() {
            // The region cannot have gone: deregistration needs the engine
            // mutably, and this batch borrows it.
            let copied = self.engine.copy_payload(&t, slot);
            debug_assert!(copied, "payload of a batched packet could not be copied");
            self.batch.tx[i].payload = None;
        }
        &mut slot[..t.len]
    }

    /// Packet `i` in pieces, its payload where it lies.
    pub fn parts(&self, i: usize) -> Parts<'_> {
        let t = &self.batch.tx[i];
        let slot = &self.batch.data[i * BUF_LEN..i * BUF_LEN + t.len];
        match t.payload {
            Some(p) => {
                let (head, rest) = slot.split_at(p.offset);
                Parts {
                    head,
                    payload: Some((p.addr as *const u8, p.len)),
                    tail: &rest[p.len..],
                }
            }
            None => Parts {
                head: slot,
                payload: None,
                tail: &[],
            },
        }
    }

    /// Offers every packet, whole, to `send(endpoints, ecn, bytes)`; those
    /// it takes (true) leave the batch, the others stay in order.
    pub fn send_each(&mut self, mut send: impl FnMut(Endpoints, Ecn, &[u8]) -> bool) {
        let n = self.batch.n;
        let mut keep = 0;
        for i in 0..n {
            let (ep, ecn) = (self.endpoints(i), self.ecn(i));
            if send(ep, ecn, self.whole(i)) {
                continue;
            }
            if keep != i {
                let len = self.batch.tx[i].len;
                self.batch
                    .data
                    .copy_within(i * BUF_LEN..i * BUF_LEN + len, keep * BUF_LEN);
                self.batch.tx[keep] = self.batch.tx[i];
            }
            keep += 1;
        }
        self.batch.n = keep;
    }

    /// Every packet left was dealt with (sent, or counted as an error).
    pub fn clear(&mut self) {
        self.batch.n = 0;
    }
}
