//! A deterministic simulated network for engines.
//!
//! Several nodes ([`SimNode`]: bare [`Engine`]s by default, or driver cores
//! that run one) are joined by a network that delays, drops,
//! reorders, duplicates and corrupts packets according to a seeded
//! generator, under a virtual clock. The same seed always gives the same run,
//! so a failing seed from the test suite replays exactly. This is the proof
//! harness of the transport (in the manner of TigerBeetle's simulator) and the
//! base of the fabric simulator.
//!
//! # What happens in one instant
//!
//! Links can be cut and healed at scheduled instants
//! ([`SimNet::schedule_link`]); these are events of their own, like
//! deliveries and timers, so the clock never steps over one. Within one
//! instant `t`, [`SimNet::step`] does things in this order:
//!
//! 1. link changes due at `t` take effect;
//! 2. packets due at `t` are delivered, in the order they were sent;
//! 3. engine timers due at `t` fire;
//! 4. every packet the engines then want to send is transmitted at `t`,
//!    seeing the links as they are after step 1.
//!
//! A packet is dropped by a cut link when it is transmitted, not while it
//! is in flight: what was on the wire before the cut is still delivered
//! (the cut is at the sender's port), so an answer can arrive up to two
//! one-way delays after a cut.
//!
//! # The fabric
//!
//! By default a packet takes [`NetConfig::delay`] (plus jitter) and nothing
//! else. A route of links ([`SimNet::set_link`], [`SimNet::set_route`],
//! [`SimNet::star`] for nodes on one switch) replaces that delay: each
//! [`LinkConfig`] has a rate (serialisation of the packet's bytes plus a
//! frame overhead), a propagation delay and an output queue, optionally
//! bounded (a packet that does not fit is dropped at the tail,
//! [`LinkStats::tail_drops`]), and an ECN hook ([`SimNet::set_ecn_hook`])
//! may set the codepoint each packet leaves with; the receiver gets it in
//! [`RxMeta`]. In a packet's life the network's loss, duplication and
//! corruption come first (at transmission), then the links of its route,
//! then jitter. A packet reaching the next link of its route is an event of
//! the network's own, handled with the deliveries of its instant (step 2
//! above), so each queue sees packets in the order they reach it.

use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::rc::Rc;
use std::time::Duration;

use softrdma_wire::{Ecn, Endpoints};

use crate::engine::{Engine, EngineConfig, RxMeta};
use crate::rng::Rng;
use crate::time::Instant;

mod fabric;
mod node;

use fabric::Link;
pub use fabric::{ecn_red, ecn_threshold, EcnHook, LinkConfig, LinkId, LinkStats, QueueState};
pub use node::SimNode;

/// Impairments of the simulated network.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct NetConfig {
    /// Probability a packet is lost.
    pub loss: f64,
    /// Probability a packet is delivered twice.
    pub duplicate: f64,
    /// Probability one bit of a packet is flipped (the ICRC must catch it).
    pub corrupt: f64,
    /// Base one-way delay.
    pub delay: Duration,
    /// Uniform extra delay in `0..jitter`: packets overtake each other.
    pub jitter: Duration,
}

impl NetConfig {
    /// A perfect network with 1 µs delay.
    pub fn perfect() -> Self {
        NetConfig {
            loss: 0.0,
            duplicate: 0.0,
            corrupt: 0.0,
            delay: Duration::from_micros(1),
            jitter: Duration::ZERO,
        }
    }
}

/// A packet on its way: due at `at` at its destination, or (when it has
/// links of its route still ahead) at the next link.
#[derive(Debug)]
struct InFlight {
    at: Instant,
    seq: u64,
    from: usize,
    to: usize,
    src: SocketAddr,
    dst: SocketAddr,
    data: Vec<u8>,
    /// The bit flipped on the way, if any.
    corrupt_bit: Option<u64>,
    /// The ECN codepoint it carries now.
    ecn: Ecn,
    /// Its route (empty: none), and how many of its links it has passed.
    route: Rc<[LinkId]>,
    hops: usize,
}

// Events are ordered by time, then by the order they were made (`seq` is
// unique), which is the order of sending for packets due at one instant.
impl PartialEq for InFlight {
    fn eq(&self, other: &Self) -> bool {
        (self.at, self.seq) == (other.at, other.seq)
    }
}

impl Eq for InFlight {}

impl PartialOrd for InFlight {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for InFlight {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        (self.at, self.seq).cmp(&(other.at, other.seq))
    }
}

/// Where a tapped packet is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TapStage {
    /// Just produced by `from`'s engine, before the network's own loss,
    /// duplication and corruption.
    Transmit,
    /// About to be handed to `to`'s engine (after any corruption).
    Deliver,
}

/// The links of [`SimNet::star`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Star {
    /// `up[i]`: from node i to the switch.
    pub up: Vec<LinkId>,
    /// `down[i]`: the switch's output port to node i.
    pub down: Vec<LinkId>,
}

/// A packet shown to the tap.
#[derive(Debug, Clone, Copy)]
pub struct Tapped<'a> {
    pub stage: TapStage,
    /// Virtual time.
    pub now: Instant,
    /// Sending and receiving node indices.
    pub from: usize,
    pub to: usize,
    pub endpoints: Endpoints,
    /// The UDP payload (BTH to ICRC).
    pub data: &'a [u8],
    /// Deliver stage: the network flipped a bit of this copy.
    pub corrupted: bool,
    /// The ECN codepoint of its IP header (at the deliver stage, after
    /// any marking on the way).
    pub ecn: Ecn,
}

/// What the tap wants done with a packet.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// Let the network handle it as usual.
    Pass,
    /// Drop it (counted as lost).
    Drop,
    /// Transmit stage: send it twice (each copy then meets the network's
    /// impairments). Same as `Pass` at the deliver stage.
    Duplicate,
}

/// A scheduled change of a link's state.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum LinkChange {
    /// Packets from `from` to `to` are dropped from this instant on.
    Cut,
    /// Undoes one earlier [`LinkChange::Cut`] of the same link: cuts nest,
    /// and the link carries packets again once every cut is healed.
    Heal,
}

#[derive(Debug, PartialEq, Eq, PartialOrd, Ord)]
struct ScheduledLink {
    at: Instant,
    seq: u64,
    from: usize,
    to: usize,
    change: LinkChange,
}

/// An observer and filter of every packet, for tests that watch or steer
/// the wire (count READ requests in flight, drop exactly one packet, …).
pub type Tap = Box<dyn FnMut(&Tapped<'_>) -> Verdict>;

/// A packet network that carries the packets between nodes in place of
/// [`SimNet`]'s own delay and links: a packet simulator's topology and
/// link layers (`softrdma_fabric::Carrier` is one: fat-trees, lossy
/// Ethernet, PFC, InfiniBand credits). The network's loss, duplication,
/// corruption, cuts and taps still act as the packet leaves its node; the
/// fabric then decides when (and whether) it arrives, and with which ECN
/// codepoint. It must be deterministic: the same calls give the same
/// answers.
pub trait Fabric {
    /// Packet `token` (`data`, with ECN `ecn`) leaves node `from` for node
    /// `to` at `now`.
    fn send(&mut self, now: Instant, from: usize, to: usize, data: &[u8], ecn: Ecn, token: u64);
    /// When the fabric next has something to do (an arrival, a queue to
    /// serve, a pause to lift), if anything.
    fn next_event(&mut self) -> Option<Instant>;
    /// Runs the fabric up to and including `until`, appending what reached
    /// its destination or was dropped by then to `out`, in the order it
    /// happened.
    fn advance(&mut self, until: Instant, out: &mut Vec<FabricOut>);
}

/// What a [`Fabric`] did with a packet.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FabricOut {
    /// It reached its destination at `at`, carrying `ecn`.
    Arrived { token: u64, at: Instant, ecn: Ecn },
    /// A queue, a buffer or a bad cable dropped it.
    Dropped { token: u64 },
}

/// Nodes on a simulated network.
pub struct SimNet<N: SimNode = Engine> {
    /// The nodes, by index.
    pub nodes: Vec<N>,
    /// The virtual clock.
    pub now: Instant,
    /// Current impairments (may change during a run).
    pub net: NetConfig,
    rng: Rng,
    queue: BinaryHeap<Reverse<InFlight>>,
    seq: u64,
    /// `cuts[a][b]`: how many cuts of the link from a to b are in force;
    /// packets from a to b are dropped while it is not zero.
    cuts: Vec<Vec<u32>>,
    /// Link changes still to come, earliest first.
    link_schedule: BinaryHeap<Reverse<ScheduledLink>>,
    buf: Vec<u8>,
    /// Packets delivered, dropped and corrupted so far.
    pub stats: NetStats,
    tap: Option<Tap>,
    jitter_fraction: f64,
    gather: bool,
    /// The fabric's links, by [`LinkId`].
    links: Vec<Link>,
    /// `routes[a][b]`: the links a packet from a to b passes (empty: it
    /// takes [`NetConfig::delay`], or the [`Fabric`] when there is one).
    routes: Vec<Vec<Rc<[LinkId]>>>,
    /// The fabric that carries unrouted packets, if any, and the packets
    /// it holds, by token.
    fabric: Option<Box<dyn Fabric>>,
    in_fabric: std::collections::HashMap<u64, InFlight>,
    fabric_out: Vec<FabricOut>,
}

/// What the network did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct NetStats {
    pub sent: u64,
    pub delivered: u64,
    pub lost: u64,
    pub duplicated: u64,
    pub corrupted: u64,
    /// Corrupted copies handed to an engine (the others are still in flight).
    pub corrupted_delivered: u64,
    /// Of those, copies whose flipped bit lies in BTH byte 4 (FECN, BECN,
    /// reserved), which the ICRC masks by design: no receiver can notice them.
    pub corrupted_undetectable: u64,
    /// Copies dropped by a full link queue (not counted in `lost`).
    pub tail_drops: u64,
    /// Copies a link's ECN hook marked CE.
    pub ecn_marked: u64,
}

impl<N: SimNode> std::fmt::Debug for SimNet<N> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SimNet")
            .field("nodes", &self.nodes.len())
            .field("now", &self.now)
            .finish()
    }
}

/// The address of simulated node `i`.
pub fn node_addr(i: usize) -> SocketAddr {
    SocketAddr::new(
        IpAddr::V4(Ipv4Addr::new(127, 0, 10, 1 + i as u8)),
        softrdma_wire::frame::ROCE_PORT,
    )
}

impl SimNet<Engine> {
    /// `n` engines with default configuration, seeded from `seed`.
    pub fn new(n: usize, seed: u64, net: NetConfig) -> Self {
        Self::with_configs(
            (0..n).map(|i| {
                let mut c = EngineConfig::new(node_addr(i));
                c.seed = seed.wrapping_mul(31).wrapping_add(i as u64);
                c
            }),
            seed,
            net,
        )
    }

    /// Engines with the given configurations.
    pub fn with_configs(
        cfgs: impl IntoIterator<Item = EngineConfig>,
        seed: u64,
        net: NetConfig,
    ) -> Self {
        Self::from_nodes(cfgs.into_iter().map(Engine::new).collect(), seed, net)
    }
}

impl<N: SimNode> SimNet<N> {
    /// The given nodes, on a network seeded from `seed`.
    pub fn from_nodes(nodes: Vec<N>, seed: u64, net: NetConfig) -> Self {
        let n = nodes.len();
        SimNet {
            nodes,
            now: Instant(1_000_000),
            net,
            rng: Rng::new(seed),
            queue: BinaryHeap::new(),
            seq: 0,
            cuts: vec![vec![0; n]; n],
            link_schedule: BinaryHeap::new(),
            buf: vec![0u8; 9000],
            stats: NetStats::default(),
            tap: None,
            jitter_fraction: 1.0,
            gather: false,
            links: Vec::new(),
            routes: vec![vec![Rc::from(Vec::new()); n]; n],
            fabric: None,
            in_fabric: std::collections::HashMap::new(),
            fabric_out: Vec::new(),
        }
    }

    /// Hands every packet without a route ([`SimNet::set_route`]) to
    /// `fabric` instead of the network's delay and jitter (the network's
    /// loss, duplication, corruption and cuts still apply as it leaves its
    /// node). Packets the fabric drops count as tail drops; CE marks it
    /// makes, as ECN marks.
    pub fn set_fabric(&mut self, fabric: Box<dyn Fabric>) {
        self.fabric = Some(fabric);
    }

    /// Whether engines build packets with [`Engine::poll_transmit_gather`]
    /// (payloads of regions that offer it left in place, filled in with
    /// [`Engine::copy_payload`] on the way to the wire) instead of
    /// [`Engine::poll_transmit`]: the `gather` of [`SimNode::poll_transmit`].
    /// The bytes on the wire must be the same.
    pub fn set_gather(&mut self, on: bool) {
        self.gather = on;
    }

    /// The share of packets that get the random extra delay of
    /// [`NetConfig::jitter`] (1.0, the default, is all of them). A burst is
    /// sent at one instant, so jitter on every packet scrambles every burst;
    /// a small fraction models occasional reordering on a mostly FIFO path.
    pub fn set_jitter_fraction(&mut self, fraction: f64) {
        self.jitter_fraction = fraction.clamp(0.0, 1.0);
    }

    /// Installs (or with `None` removes) the packet tap.
    pub fn set_tap(&mut self, tap: Option<Tap>) {
        self.tap = tap;
    }

    /// Packets on the wire, not yet delivered.
    pub fn in_flight(&self) -> usize {
        self.queue.len() + self.in_fabric.len()
    }

    /// True when a packet is in flight or an engine has a timer armed.
    pub fn is_busy(&mut self) -> bool {
        self.collect_transmits();
        self.next_event().is_some()
    }

    /// Puts every packet the nodes have ready on the network now, as every
    /// step starts by doing: for a harness that must see on the wire what a
    /// node already sent (a device core sends at the post, into its port).
    pub fn flush(&mut self) {
        self.collect_transmits();
    }

    /// Drops (or restores) packets from `a` to `b` from now on. Restoring
    /// also undoes every cut scheduled with [`SimNet::schedule_link`] that
    /// has taken effect.
    pub fn set_partition(&mut self, a: usize, b: usize, cut: bool) {
        self.cuts[a][b] = u32::from(cut);
    }

    /// Cuts or heals the link from `from` to `to` at instant `at` (at once
    /// if `at` has passed). The change is an event of its own: see the
    /// module documentation for its order against deliveries, timers and
    /// transmissions in the same instant.
    pub fn schedule_link(&mut self, at: Instant, from: usize, to: usize, change: LinkChange) {
        self.seq += 1;
        self.link_schedule.push(Reverse(ScheduledLink {
            at,
            seq: self.seq,
            from,
            to,
            change,
        }));
        self.apply_link_changes();
    }

    /// Whether packets from `from` to `to` are dropped now.
    pub fn is_cut(&self, from: usize, to: usize) -> bool {
        self.cuts[from][to] > 0
    }

    /// Adds a link to the fabric; routes ([`SimNet::set_route`]) use it.
    pub fn add_link(&mut self, cfg: LinkConfig) -> LinkId {
        self.links.push(Link::new(cfg));
        self.links.len() - 1
    }

    /// The links a packet from `from` to `to` passes, in order, instead of
    /// taking [`NetConfig::delay`] (an empty route restores that). Loss,
    /// duplication and corruption happen before the first link, jitter
    /// after the last; packets already on their way keep their route.
    pub fn set_route(&mut self, from: usize, to: usize, route: &[LinkId]) {
        assert!(
            route.iter().all(|&l| l < self.links.len()),
            "no such link in {route:?}"
        );
        self.routes[from][to] = Rc::from(route);
    }

    /// A link of its own from `from` to `to`: [`SimNet::add_link`], then
    /// the route of that one link.
    pub fn set_link(&mut self, from: usize, to: usize, cfg: LinkConfig) -> LinkId {
        let l = self.add_link(cfg);
        self.set_route(from, to, &[l]);
        l
    }

    /// Every node on one switch: node i sends on its own uplink `up[i]`,
    /// and the switch sends to node i on its output port `down[i]` (where
    /// packets from several senders to one receiver queue up). Both have
    /// `cfg`; every pair of nodes is routed through them.
    pub fn star(&mut self, cfg: LinkConfig) -> Star {
        let n = self.nodes.len();
        let up: Vec<LinkId> = (0..n).map(|_| self.add_link(cfg)).collect();
        let down: Vec<LinkId> = (0..n).map(|_| self.add_link(cfg)).collect();
        for (a, &u) in up.iter().enumerate() {
            for (b, &d) in down.iter().enumerate().filter(|&(b, _)| b != a) {
                self.set_route(a, b, &[u, d]);
            }
        }
        Star { up, down }
    }

    /// Installs (or with `None` removes) the ECN marking policy of `link`:
    /// it decides the codepoint of every packet that enters its queue
    /// ([`ecn_threshold`] and [`ecn_red`] are two).
    pub fn set_ecn_hook(&mut self, link: LinkId, hook: Option<EcnHook>) {
        self.links[link].ecn = hook;
    }

    /// What `link` did so far.
    pub fn link_stats(&self, link: LinkId) -> LinkStats {
        self.links[link].stats
    }

    /// The bytes queued on `link` now (the packet in serialisation included).
    pub fn queued_bytes(&mut self, link: LinkId) -> usize {
        self.links[link].queued_bytes(self.now)
    }

    /// Applies every scheduled link change due by now, in schedule order.
    fn apply_link_changes(&mut self) {
        while let Some(Reverse(c)) = self.link_schedule.peek() {
            if c.at > self.now {
                break;
            }
            let Some(Reverse(c)) = self.link_schedule.pop() else {
                break;
            };
            let n = &mut self.cuts[c.from][c.to];
            *n = match c.change {
                LinkChange::Cut => n.saturating_add(1),
                LinkChange::Heal => n.saturating_sub(1),
            };
        }
    }

    fn index_of(&self, addr: SocketAddr) -> Option<usize> {
        self.nodes
            .iter()
            .position(|e| e.local_addr().ip() == addr.ip())
    }

    /// Moves every packet the engines want to send onto the network.
    fn collect_transmits(&mut self) {
        // The clock may have been moved by hand past a scheduled change.
        self.apply_link_changes();
        for i in 0..self.nodes.len() {
            loop {
                let node = &mut self.nodes[i];
                let Some(t) = node.poll_transmit(self.now, &mut self.buf, self.gather) else {
                    break;
                };
                self.stats.sent += 1;
                let Some(to) = self.index_of(t.endpoints.dst) else {
                    continue;
                };
                let verdict = match self.tap.as_mut() {
                    Some(tap) => tap(&Tapped {
                        stage: TapStage::Transmit,
                        now: self.now,
                        from: i,
                        to,
                        endpoints: t.endpoints,
                        data: &self.buf[..t.len],
                        corrupted: false,
                        ecn: t.ecn,
                    }),
                    None => Verdict::Pass,
                };
                let sends = if verdict == Verdict::Duplicate { 2 } else { 1 };
                for _ in 0..sends {
                    if verdict == Verdict::Drop
                        || self.cuts[i][to] > 0
                        || self.rng.chance(self.net.loss)
                    {
                        self.stats.lost += 1;
                        continue;
                    }
                    let copies = if self.rng.chance(self.net.duplicate) {
                        2
                    } else {
                        1
                    };
                    if copies == 2 {
                        self.stats.duplicated += 1;
                    }
                    for _ in 0..copies {
                        let mut data = self.buf[..t.len].to_vec();
                        let mut corrupt_bit = None;
                        if self.rng.chance(self.net.corrupt) {
                            let bit = self.rng.below(data.len() as u64 * 8);
                            data[(bit / 8) as usize] ^= 1 << (bit % 8);
                            self.stats.corrupted += 1;
                            corrupt_bit = Some(bit);
                        }
                        self.forward(InFlight {
                            at: self.now,
                            seq: 0,
                            from: i,
                            to,
                            src: t.endpoints.src,
                            dst: t.endpoints.dst,
                            data,
                            corrupt_bit,
                            ecn: t.ecn,
                            route: self.routes[i][to].clone(),
                            hops: 0,
                        });
                    }
                }
            }
        }
    }

    /// Moves a packet that is at `p.at` on its way: through the next link
    /// of its route (to be handled again when it leaves it, if links are
    /// left), or after the last one (or with no route, after the network's
    /// delay) towards its destination, with the network's jitter.
    fn forward(&mut self, mut p: InFlight) {
        if let Some(&l) = p.route.get(p.hops) {
            let Some((exit, ecn)) = self.links[l].enter(p.at, p.data.len(), p.ecn) else {
                self.stats.tail_drops += 1;
                return;
            };
            if ecn == Ecn::Ce && p.ecn != Ecn::Ce {
                self.stats.ecn_marked += 1;
            }
            (p.at, p.ecn, p.hops) = (exit, ecn, p.hops + 1);
            if p.hops < p.route.len() {
                return self.push(p);
            }
        } else if let Some(f) = self.fabric.as_mut() {
            self.seq += 1;
            let token = self.seq;
            f.send(p.at, p.from, p.to, &p.data, p.ecn, token);
            self.in_fabric.insert(token, p);
            return;
        } else {
            p.at = p.at + self.net.delay;
        }
        let jitter = if self.net.jitter.is_zero()
            || (self.jitter_fraction < 1.0 && !self.rng.chance(self.jitter_fraction))
        {
            0
        } else {
            self.rng.below(self.net.jitter.as_nanos() as u64)
        };
        p.at = p.at + Duration::from_nanos(jitter);
        self.push(p);
    }

    /// Runs the fabric up to now and queues what arrived for delivery in
    /// this instant (in the order the fabric delivered it).
    fn take_from_fabric(&mut self) {
        let Some(f) = self.fabric.as_mut() else {
            return;
        };
        let mut out = std::mem::take(&mut self.fabric_out);
        f.advance(self.now, &mut out);
        for o in out.drain(..) {
            match o {
                FabricOut::Arrived { token, at, ecn } => {
                    let Some(mut p) = self.in_fabric.remove(&token) else {
                        continue;
                    };
                    if ecn == Ecn::Ce && p.ecn != Ecn::Ce {
                        self.stats.ecn_marked += 1;
                    }
                    (p.at, p.ecn) = (at.min(self.now), ecn);
                    self.push(p);
                }
                FabricOut::Dropped { token } => {
                    if self.in_fabric.remove(&token).is_some() {
                        self.stats.tail_drops += 1;
                    }
                }
            }
        }
        self.fabric_out = out;
    }

    fn push(&mut self, mut p: InFlight) {
        self.seq += 1;
        p.seq = self.seq;
        self.queue.push(Reverse(p));
    }

    /// The next moment something happens: a delivery, a link change or an
    /// engine timer.
    fn next_event(&mut self) -> Option<Instant> {
        let delivery = self.queue.peek().map(|Reverse(p)| p.at);
        let link = self.link_schedule.peek().map(|Reverse(c)| c.at);
        let mut t = match (delivery, link) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        };
        if let Some(f) = self.fabric.as_mut().and_then(|f| f.next_event()) {
            t = Some(t.map_or(f, |x: Instant| x.min(f)));
        }
        for e in &mut self.nodes {
            if let Some(d) = e.poll_timeout() {
                t = Some(t.map_or(d, |x: Instant| x.min(d)));
            }
        }
        t
    }

    /// Runs one step: flush transmits, advance the clock to the next event,
    /// then apply the link changes, deliver the packets and fire the timers
    /// due then, and transmit what that produced. Returns false when nothing
    /// is left to happen.
    pub fn step(&mut self) -> bool {
        self.collect_transmits();
        let Some(t) = self.next_event() else {
            return false;
        };
        if t > self.now {
            self.now = t;
        }
        self.apply_link_changes();
        self.take_from_fabric();
        while let Some(Reverse(p)) = self.queue.peek() {
            if p.at > self.now {
                break;
            }
            let Some(Reverse(p)) = self.queue.pop() else {
                break;
            };
            if p.hops < p.route.len() {
                // At a link on the way, not yet at its destination.
                self.forward(p);
                continue;
            }
            let ep = Endpoints::new(p.src, p.dst);
            if let Some(tap) = self.tap.as_mut() {
                let v = tap(&Tapped {
                    stage: TapStage::Deliver,
                    now: self.now,
                    from: p.from,
                    to: p.to,
                    endpoints: ep,
                    data: &p.data,
                    corrupted: p.corrupt_bit.is_some(),
                    ecn: p.ecn,
                });
                if v == Verdict::Drop {
                    self.stats.lost += 1;
                    continue;
                }
            }
            self.stats.delivered += 1;
            if let Some(bit) = p.corrupt_bit {
                self.stats.corrupted_delivered += 1;
                // BTH byte 4 (FECN, BECN, reserved) is replaced by 0xFF in
                // the ICRC computation.
                if bit / 8 == 4 {
                    self.stats.corrupted_undetectable += 1;
                }
            }
            let meta = RxMeta {
                ecn: p.ecn,
                group: None,
            };
            self.nodes[p.to].handle_packet(self.now, ep, meta, &p.data);
        }
        for e in &mut self.nodes {
            e.handle_timeout(self.now);
        }
        self.collect_transmits();
        true
    }

    /// Runs everything due up to `t`, then sets the clock to `t`: unlike
    /// [`SimNet::run_until`], never handles an event later than `t`.
    pub fn advance_to(&mut self, t: Instant) {
        loop {
            self.collect_transmits();
            match self.next_event() {
                Some(e) if e <= t => {
                    self.step();
                }
                _ => break,
            }
        }
        if self.now < t {
            self.now = t;
        }
    }

    /// Steps until `done` holds, nothing is left to happen, or `limit` of
    /// virtual time passes. Returns whether `done` held.
    pub fn run_until(&mut self, limit: Duration, mut done: impl FnMut(&mut Self) -> bool) -> bool {
        let end = self.now + limit;
        loop {
            if done(self) {
                return true;
            }
            if self.now > end || !self.step() {
                return done(self);
            }
        }
    }
}
