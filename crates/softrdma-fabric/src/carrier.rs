//! The fabric as the network of another simulation: [`Carrier`] runs a
//! scenario's topology and link layer (fat-trees; InfiniBand credits,
//! lossy Ethernet, PFC, RED/ECN, corruption loss) with no workload of its
//! own, and carries the packets of a [`softrdma_engine::sim::SimNet`]
//! between its nodes ([`softrdma_engine::sim::Fabric`]). That is how the
//! engine's own deterministic-simulation seeds (softrdma-core's
//! `tests/simulation.rs`, the `FABRIC_MODEL` seeds) run inside this
//! crate's model: every packet of their workloads crosses real queues,
//! switches and link layers, and their oracle still judges every
//! completion and every byte.

use softrdma_engine::sim::{Fabric, FabricOut};
use softrdma_engine::Instant;
use softrdma_wire::Ecn;

use crate::link::Ps;
use crate::sim::{Outside, Sim};
use crate::Scenario;

/// A scenario's fabric carrying an outside simulation's packets.
pub struct Carrier {
    sim: Sim,
    /// The host of each outside node.
    hosts: Vec<u32>,
    /// The outside clock's reading at the fabric's time 0.
    start: Instant,
    /// Scratch for what [`Sim::advance_until`] hands over.
    out: Vec<Outside>,
}

impl Carrier {
    /// `sc`'s fabric for `nodes` outside nodes, node `i` on host
    /// `i × hosts / nodes` (so that nodes sit on different leaves, and
    /// their paths cross the upper tiers), its time 0 at `start` on the
    /// outside clock. `sc.workload` is not used.
    pub fn new(sc: &Scenario, nodes: usize, start: Instant) -> Result<Carrier, String> {
        let sim = Sim::carrier(sc)?;
        let n = sim.tree.hosts as usize;
        if nodes == 0 || nodes > n {
            return Err(format!(
                "the fabric has {n} hosts: it cannot carry {nodes} nodes"
            ));
        }
        let hosts = (0..nodes).map(|i| (i * n / nodes) as u32).collect();
        Ok(Carrier {
            sim,
            hosts,
            start,
            out: Vec::new(),
        })
    }

    /// The simulator underneath (its links' figures, its totals).
    pub fn sim(&self) -> &Sim {
        &self.sim
    }

    fn ps(&self, t: Instant) -> Ps {
        t.0.saturating_sub(self.start.0).saturating_mul(1000)
    }

    /// The first outside instant not before `ps` (the outside clock counts
    /// nanoseconds).
    fn instant(&self, ps: Ps) -> Instant {
        Instant(self.start.0 + ps.div_ceil(1000))
    }
}

impl Fabric for Carrier {
    fn send(&mut self, now: Instant, from: usize, to: usize, data: &[u8], ecn: Ecn, token: u64) {
        let (Some(&a), Some(&b)) = (self.hosts.get(from), self.hosts.get(to)) else {
            return;
        };
        let at = self.ps(now);
        self.sim.inject(at, a, b, data, ecn, token);
    }

    fn next_event(&mut self) -> Option<Instant> {
        let t = self.sim.next_event_at()?;
        Some(self.instant(t))
    }

    fn advance(&mut self, until: Instant, out: &mut Vec<FabricOut>) {
        let until = self.ps(until);
        let mut done = std::mem::take(&mut self.out);
        self.sim.advance_until(until, Some(&mut done));
        for o in done.drain(..) {
            out.push(match o {
                Outside::Arrived { token, at, ecn } => FabricOut::Arrived {
                    token,
                    at: self.instant(at),
                    ecn,
                },
                Outside::Dropped { token } => FabricOut::Dropped { token },
            });
        }
        self.out = done;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn carrier(kind: &str, nodes: usize) -> Carrier {
        let json = format!(
            r#"{{"topology": {{"tiers": 2, "k": 4, "link_gbps": 100, "cable_ns": 100,
                 "switch_ns": 300}}, "link_layer": {{"kind": "{kind}"}},
                 "workload": {{"kind": "permutation", "bytes": 1}}}}"#
        );
        let sc: Scenario = serde_json::from_str(&json).unwrap();
        Carrier::new(&sc, nodes, Instant(1_000_000)).unwrap()
    }

    fn run(c: &mut Carrier) -> Vec<FabricOut> {
        let mut out = Vec::new();
        while let Some(t) = c.next_event() {
            c.advance(t, &mut out);
        }
        out
    }

    /// A packet takes each hop's serialisation (its bytes and the link
    /// layer's 10 bytes of framing at 100 Gb/s), cable delay and, into a
    /// switch, the switch's latency: 2 hops under one leaf, 4 through a
    /// spine; the answer comes at the first nanosecond not before it.
    #[test]
    fn packets_take_the_fabric_s_time_hop_by_hop() {
        let mut c = carrier("ib_credit", 8);
        let data = [0u8; 1000];
        c.send(Instant(1_000_000), 0, 1, &data, Ecn::NotEct, 7);
        c.send(Instant(1_000_000), 2, 7, &data, Ecn::Ect0, 9);
        let out = run(&mut c);
        let hop: f64 = 1010.0 * 8.0 / 100.0 + 100.0; // ns: serialisation + cable
        let near = (2.0 * hop + 300.0).ceil() as u64;
        let far = (4.0 * hop + 3.0 * 300.0).ceil() as u64;
        assert_eq!(
            out,
            vec![
                FabricOut::Arrived {
                    token: 7,
                    at: Instant(1_000_000 + near),
                    ecn: Ecn::NotEct
                },
                FabricOut::Arrived {
                    token: 9,
                    at: Instant(1_000_000 + far),
                    ecn: Ecn::Ect0
                },
            ]
        );
    }

    /// Lossy Ethernet drops what does not fit a queue and says so; the
    /// same burst over InfiniBand credits all arrives, in order.
    #[test]
    fn lossy_queues_drop_and_credits_do_not() {
        for (kind, lossless) in [("lossy", false), ("ib_credit", true)] {
            let mut c = carrier(kind, 8);
            let data = [0u8; 4000];
            // Six senders into one receiver at once: 24,000 packets'
            // worth of bytes queue at its leaf's down-link.
            for t in 0..6_000u64 {
                let from = [0, 2, 3, 4, 5, 6][(t % 6) as usize];
                c.send(Instant(1_000_000), from, 1, &data, Ecn::NotEct, t + 1);
            }
            let out = run(&mut c);
            assert_eq!(out.len(), 6_000, "{kind}: every packet accounted for");
            let dropped = out
                .iter()
                .filter(|o| matches!(o, FabricOut::Dropped { .. }))
                .count();
            assert_eq!(dropped == 0, lossless, "{kind}: {dropped} dropped");
            let times: Vec<Instant> = out
                .iter()
                .filter_map(|o| match o {
                    FabricOut::Arrived { at, .. } => Some(*at),
                    _ => None,
                })
                .collect();
            assert!(times.windows(2).all(|w| w[0] <= w[1]), "{kind}: in order");
        }
    }

    #[test]
    fn more_nodes_than_hosts_is_an_error() {
        let json = r#"{"topology": {"tiers": 2, "k": 4, "link_gbps": 100},
                       "workload": {"kind": "permutation", "bytes": 1}}"#;
        let sc: Scenario = serde_json::from_str(json).unwrap();
        let e = Carrier::new(&sc, 9, Instant(0)).err().unwrap();
        assert!(e.contains("8 hosts"), "{e}");
    }
}
