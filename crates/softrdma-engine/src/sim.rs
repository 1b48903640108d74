//! A deterministic simulated network for engines.
//!
//! Several [`Engine`]s are joined by a network that delays, drops,
//! reorders, duplicates and corrupts packets according to a seeded
//! generator, under a virtual clock. The same seed always gives the same run,
//! so a failing seed from the test suite replays exactly. This is the proof
//! harness of the transport (in the manner of TigerBeetle's simulator) and the
//! base of the fabric simulator.

use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::time::Duration;

use softrdma_wire::Endpoints;

use crate::engine::{Engine, EngineConfig};
use crate::rng::Rng;
use crate::time::Instant;

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

#[derive(Debug, PartialEq, Eq, PartialOrd, Ord)]
struct InFlight {
    at: Instant,
    seq: u64,
    to: usize,
    src: SocketAddr,
    dst: SocketAddr,
    data: Vec<u8>,
}

/// Engines on a simulated network.
pub struct SimNet {
    /// The engines, by index.
    pub nodes: Vec<Engine>,
    /// The virtual clock.
    pub now: Instant,
    /// Current impairments (may change during a run).
    pub net: NetConfig,
    rng: Rng,
    queue: BinaryHeap<Reverse<InFlight>>,
    seq: u64,
    /// `partitioned[a][b]`: packets from a to b are dropped.
    partitioned: Vec<Vec<bool>>,
    buf: Vec<u8>,
    /// Packets delivered, dropped and corrupted so far.
    pub stats: NetStats,
}

/// What the network did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct NetStats {
    pub sent: u64,
    pub delivered: u64,
    pub lost: u64,
    pub duplicated: u64,
    pub corrupted: u64,
}

impl std::fmt::Debug for SimNet {
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

impl SimNet {
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
        let nodes: Vec<Engine> = cfgs.into_iter().map(Engine::new).collect();
        let n = nodes.len();
        SimNet {
            nodes,
            now: Instant(1_000_000),
            net,
            rng: Rng::new(seed),
            queue: BinaryHeap::new(),
            seq: 0,
            partitioned: vec![vec![false; n]; n],
            buf: vec![0u8; 9000],
            stats: NetStats::default(),
        }
    }

    /// Drops (or restores) packets from `a` to `b`.
    pub fn set_partition(&mut self, a: usize, b: usize, cut: bool) {
        self.partitioned[a][b] = cut;
    }

    fn index_of(&self, addr: SocketAddr) -> Option<usize> {
        self.nodes
            .iter()
            .position(|e| e.config().local.ip() == addr.ip())
    }

    /// Moves every packet the engines want to send onto the network.
    fn collect_transmits(&mut self) {
        for i in 0..self.nodes.len() {
            while let Some(t) = self.nodes[i].poll_transmit(self.now, &mut self.buf) {
                self.stats.sent += 1;
                let Some(to) = self.index_of(t.endpoints.dst) else {
                    continue;
                };
                if self.partitioned[i][to] || self.rng.chance(self.net.loss) {
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
                    if self.rng.chance(self.net.corrupt) {
                        let bit = self.rng.below(data.len() as u64 * 8);
                        data[(bit / 8) as usize] ^= 1 << (bit % 8);
                        self.stats.corrupted += 1;
                    }
                    let jitter = if self.net.jitter.is_zero() {
                        0
                    } else {
                        self.rng.below(self.net.jitter.as_nanos() as u64)
                    };
                    let at = self.now + self.net.delay + Duration::from_nanos(jitter);
                    self.seq += 1;
                    self.queue.push(Reverse(InFlight {
                        at,
                        seq: self.seq,
                        to,
                        src: t.endpoints.src,
                        dst: t.endpoints.dst,
                        data,
                    }));
                }
            }
        }
    }

    /// The next moment something happens: a delivery or an engine timer.
    fn next_event(&mut self) -> Option<Instant> {
        let mut t = self.queue.peek().map(|Reverse(p)| p.at);
        for e in &mut self.nodes {
            if let Some(d) = e.poll_timeout() {
                t = Some(t.map_or(d, |x: Instant| x.min(d)));
            }
        }
        t
    }

    /// Runs one step: flush transmits, advance the clock to the next event,
    /// deliver packets and fire timers due then. Returns false when nothing is
    /// left to happen.
    pub fn step(&mut self) -> bool {
        self.collect_transmits();
        let Some(t) = self.next_event() else {
            return false;
        };
        if t > self.now {
            self.now = t;
        }
        while let Some(Reverse(p)) = self.queue.peek() {
            if p.at > self.now {
                break;
            }
            let Some(Reverse(p)) = self.queue.pop() else {
                break;
            };
            self.stats.delivered += 1;
            let ep = Endpoints::new(p.src, p.dst);
            self.nodes[p.to].handle_packet(self.now, ep, &p.data);
        }
        for e in &mut self.nodes {
            e.handle_timeout(self.now);
        }
        self.collect_transmits();
        true
    }

    /// Steps until `done` holds, nothing is left to happen, or `limit` of
    /// virtual time passes. Returns whether `done` held.
    pub fn run_until(
        &mut self,
        limit: Duration,
        mut done: impl FnMut(&mut SimNet) -> bool,
    ) -> bool {
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
