//! An in-memory network of CM agents on a virtual clock: loss,
//! duplication, delay and targeted drops, all from one seed, so every run
//! replays exactly. A small consumer per node can accept requests and
//! answer DREQs by itself.

#![allow(dead_code)]

use std::time::Duration;

use softrdma_cm::{AcceptParams, AgentConfig, CmAgent, ConnId, Event, Instant, State};
use softrdma_wire::cm::CmMad;
use softrdma_wire::mad::MAD_LEN;

/// A node's address on the test network.
pub type Node = u8;

/// SplitMix64: deterministic choices for the network.
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Self {
        Rng(seed ^ 0x2545_F491_4F6C_DD1D)
    }
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    pub fn chance(&mut self, p: f64) -> bool {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64 > 1.0 - p
    }
    pub fn below(&mut self, n: u64) -> u64 {
        self.next_u64() % n.max(1)
    }
}

/// What the network does to packets.
#[derive(Debug, Clone, Copy)]
pub struct Faults {
    pub loss: f64,
    pub duplicate: f64,
    /// Fixed one-way delay.
    pub delay: Duration,
    /// Extra random delay up to this.
    pub jitter: Duration,
}

impl Default for Faults {
    fn default() -> Self {
        Faults {
            loss: 0.0,
            duplicate: 0.0,
            delay: Duration::from_micros(10),
            jitter: Duration::ZERO,
        }
    }
}

/// How a node's consumer reacts by itself.
#[derive(Debug, Clone, Default)]
pub struct Consumer {
    /// Accept every ConnectRequest / SidrRequest with these.
    pub accept: Option<AcceptParams>,
    /// Answer a peer's DREQ (Disconnected in DreqRcvd) with a DREP at once.
    pub drep: bool,
    /// Disconnect every connection as soon as it is established.
    pub disconnect_established: bool,
}

/// A packet on the wire.
#[derive(Debug, Clone)]
pub struct Sent {
    pub at: Instant,
    pub from: Node,
    pub to: Node,
    pub attr: u16,
}

pub struct Net {
    pub now: Instant,
    pub agents: Vec<CmAgent<Node>>,
    pub consumers: Vec<Consumer>,
    pub faults: Faults,
    rng: Rng,
    /// (deliver at, sequence, from, to, mad)
    flight: Vec<(Instant, u64, Node, Node, [u8; MAD_LEN])>,
    seq: u64,
    /// Events per node with the time they were raised.
    pub events: Vec<Vec<(Instant, Event<Node>)>>,
    /// Every MAD put on the wire (before faults).
    pub sent: Vec<Sent>,
    /// Drops the n-th (0-based) MAD of an attribute: (attr, n).
    pub drop_nth: Vec<(u16, usize)>,
    /// Drops every MAD of these attributes.
    pub drop_all: Vec<u16>,
    /// Every MAD as sent, for replays and mutation.
    pub captured: Vec<[u8; MAD_LEN]>,
}

impl Net {
    pub fn new(nodes: usize, seed: u64, faults: Faults) -> Self {
        let agents = (0..nodes)
            .map(|i| {
                let cfg = AgentConfig {
                    ca_guid: 0x0002_c903_0000_0100 + i as u64,
                    ..AgentConfig::default()
                };
                let mut s = [0u8; 32];
                s[..8].copy_from_slice(&seed.to_le_bytes());
                s[8] = i as u8;
                CmAgent::new(cfg, s)
            })
            .collect();
        Net {
            now: Instant(1_000_000_000),
            agents,
            consumers: vec![Consumer::default(); nodes],
            faults,
            rng: Rng::new(seed),
            flight: Vec::new(),
            seq: 0,
            events: vec![Vec::new(); nodes],
            sent: Vec::new(),
            drop_nth: Vec::new(),
            drop_all: Vec::new(),
            captured: Vec::new(),
        }
    }

    fn attr_of(mad: &[u8; MAD_LEN]) -> u16 {
        u16::from_be_bytes([mad[16], mad[17]])
    }

    /// Moves every queued MAD onto the wire, through the faults.
    fn collect_transmits(&mut self) {
        for from in 0..self.agents.len() {
            while let Some((to, mad)) = self.agents[from].poll_transmit() {
                assert!(CmMad::parse(&mad).is_ok(), "agent sent a bad MAD");
                let attr = Self::attr_of(&mad);
                let nth = self.sent.iter().filter(|s| s.attr == attr).count();
                self.sent.push(Sent {
                    at: self.now,
                    from: from as Node,
                    to,
                    attr,
                });
                self.captured.push(mad);
                if self.drop_all.contains(&attr) || self.drop_nth.contains(&(attr, nth)) {
                    continue;
                }
                if self.rng.chance(self.faults.loss) {
                    continue;
                }
                let copies = if self.rng.chance(self.faults.duplicate) {
                    2
                } else {
                    1
                };
                for _ in 0..copies {
                    let j = self.faults.jitter.as_nanos() as u64;
                    let at =
                        self.now + self.faults.delay + Duration::from_nanos(self.rng.below(j + 1));
                    self.seq += 1;
                    self.flight.push((at, self.seq, from as Node, to, mad));
                }
            }
        }
    }

    /// Drains events into the log, letting the consumers react.
    fn collect_events(&mut self) {
        for n in 0..self.agents.len() {
            while let Some(e) = self.agents[n].poll_event() {
                self.react(n, &e);
                self.events[n].push((self.now, e));
            }
        }
    }

    fn react(&mut self, n: usize, e: &Event<Node>) {
        let now = self.now;
        let c = &self.consumers[n];
        match e {
            Event::ConnectRequest { conn, .. } | Event::SidrRequest { conn, .. } => {
                if let Some(p) = c.accept.clone() {
                    self.agents[n].accept(now, *conn, &p).unwrap();
                }
            }
            Event::Disconnected { conn, .. }
                if c.drep && self.agents[n].state(*conn) == Some(State::DreqRcvd) =>
            {
                self.agents[n].disconnect(now, *conn, &[]).unwrap();
            }
            Event::Established { conn } if c.disconnect_established => {
                self.agents[n].disconnect(now, *conn, &[]).unwrap();
            }
            _ => {}
        }
    }

    /// Delivers `mad` to node `to` as if from `from`, now.
    pub fn inject(&mut self, from: Node, to: usize, mad: &[u8]) {
        let now = self.now;
        self.agents[to].on_mad(now, from, mad);
        self.collect_events();
        self.collect_transmits();
    }

    /// Moves the clock by `d` and runs due timers.
    pub fn advance(&mut self, d: Duration) {
        self.now = self.now + d;
        let now = self.now;
        for a in &mut self.agents {
            a.on_timeout(now);
        }
        self.collect_events();
        self.collect_transmits();
    }

    /// One step: deliver what is due, run due timers; false when nothing
    /// is left to happen before `limit` (the clock then stops at `limit`).
    pub fn step(&mut self, limit: Instant) -> bool {
        self.collect_transmits();
        self.collect_events();
        self.collect_transmits();
        let next_packet = self.flight.iter().map(|f| (f.0, f.1)).min();
        let next_timer = self.agents.iter().filter_map(|a| a.next_deadline()).min();
        let next = match (next_packet.map(|p| p.0), next_timer) {
            (Some(p), Some(t)) => p.min(t),
            (Some(p), None) => p,
            (None, Some(t)) => t,
            (None, None) => return false,
        };
        if next > limit {
            self.now = self.now.max(limit);
            return false;
        }
        self.now = self.now.max(next);
        if let Some((_, seq)) = next_packet.filter(|p| p.0 <= self.now) {
            let i = self.flight.iter().position(|f| f.1 == seq).unwrap();
            let (_, _, from, to, mad) = self.flight.swap_remove(i);
            self.agents[to as usize].on_mad(self.now, from, &mad);
        } else {
            for a in &mut self.agents {
                if a.next_deadline().is_some_and(|d| d <= self.now) {
                    a.on_timeout(self.now);
                }
            }
        }
        self.collect_events();
        self.collect_transmits();
        true
    }

    /// Steps until `done` holds or nothing is left, at most `max_steps`
    /// steps and `max_time` of virtual time; true if `done` held.
    pub fn run_until(&mut self, max_time: Duration, mut done: impl FnMut(&Net) -> bool) -> bool {
        let end = self.now + max_time;
        for _ in 0..1_000_000 {
            if done(self) {
                return true;
            }
            if !self.step(end) {
                return done(self);
            }
        }
        panic!("run_until: step bound reached");
    }

    /// Runs until nothing is left to happen (bounded).
    pub fn settle(&mut self) {
        let end = self.now + Duration::from_secs(24 * 3600);
        self.run_until(Duration::from_secs(24 * 3600), |_| false);
        assert!(self.now < end, "still busy after a day of virtual time");
        assert!(self.flight.is_empty(), "packets still in flight");
    }

    /// The first event on `n` matching `f`, with its time.
    pub fn find(
        &self,
        n: usize,
        f: impl Fn(&Event<Node>) -> bool,
    ) -> Option<(Instant, Event<Node>)> {
        self.events[n].iter().find(|(_, e)| f(e)).cloned()
    }

    pub fn count(&self, n: usize, f: impl Fn(&Event<Node>) -> bool) -> usize {
        self.events[n].iter().filter(|(_, e)| f(e)).count()
    }

    /// MADs of `attr` sent by `from`.
    pub fn sent_count(&self, from: Node, attr: u16) -> usize {
        self.sent
            .iter()
            .filter(|s| s.from == from && s.attr == attr)
            .count()
    }
}

/// The event's connection.
pub fn conn_of(e: &Event<Node>) -> ConnId {
    match e {
        Event::ConnectRequest { conn, .. }
        | Event::ConnectResponse { conn, .. }
        | Event::Established { conn }
        | Event::Rejected { conn, .. }
        | Event::Unreachable { conn }
        | Event::MraReceived { conn, .. }
        | Event::Disconnected { conn, .. }
        | Event::TimewaitExit { conn }
        | Event::SidrRequest { conn, .. }
        | Event::SidrResolved { conn, .. } => *conn,
    }
}
