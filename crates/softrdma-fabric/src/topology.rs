//! Fat-trees: who is wired to whom, and the next hop of a packet.
//!
//! Every cable is two directed links. A switch's links are its up-links
//! (towards the spine or core, chosen among by ECMP or spraying) and its
//! down-links (one per child, the only way down to a given host).

use crate::link::Ps;
use crate::scenario::Topology as Spec;

/// One end of a link.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Node {
    Host(u32),
    Switch(u32),
}

/// A directed link.
#[derive(Debug, Clone)]
pub struct LinkSpec {
    pub src: Node,
    pub dst: Node,
    pub bps: u64,
    pub prop_ps: Ps,
    /// A host's up-link or a leaf's down-link to a host.
    pub host_cable: bool,
}

/// A switch's place in the tree.
#[derive(Debug, Clone)]
pub struct Switch {
    /// 0 leaf, 1 spine (two tiers) or aggregation (three), 2 core.
    pub level: u8,
    /// The pod (three tiers) or 0.
    pub pod: u32,
    pub up: Vec<usize>,
    /// By child: leaf → its hosts' slots; spine → leaf; aggregation → leaf
    /// of its pod; core → pod.
    pub down: Vec<usize>,
}

/// A built fat-tree.
#[derive(Debug, Clone)]
pub struct Tree {
    pub tiers: u8,
    pub hosts: u32,
    pub links: Vec<LinkSpec>,
    pub switches: Vec<Switch>,
    /// Each host's up-link.
    pub host_up: Vec<usize>,
    /// Each host's leaf (switch index) and slot on it.
    pub host_leaf: Vec<u32>,
    pub host_slot: Vec<u32>,
    /// Leaves per pod (three tiers).
    pub leaves_per_pod: u32,
}

impl Tree {
    /// Builds the tree of `spec`.
    pub fn build(spec: &Spec) -> Result<Tree, String> {
        let k = spec.k;
        let half = k / 2;
        let hpl = ((f64::from(half) * spec.oversubscription).round() as u32).max(1);
        let (leaves, leaves_per_pod) = match spec.tiers {
            2 => (k, k),
            _ => (k * half, half),
        };
        let capacity = leaves * hpl;
        let hosts = spec.hosts.unwrap_or(capacity);
        if hosts == 0 || hosts > capacity {
            return Err(format!(
                "topology has room for {capacity} hosts, {hosts} asked for"
            ));
        }
        let rails = spec.rails;
        if rails > 1 && leaves % rails != 0 {
            return Err(format!(
                "{leaves} leaves do not divide into rails of {rails}"
            ));
        }
        let gbps = |g: f64| (g * 1e9) as u64;
        let sw_bps = gbps(spec.link_gbps);
        let host_bps = gbps(spec.host_gbps.unwrap_or(spec.link_gbps));
        let prop = (spec.cable_ns * 1000.0) as Ps;
        let mut t = Tree {
            tiers: spec.tiers,
            hosts,
            links: Vec::new(),
            switches: Vec::new(),
            host_up: vec![0; hosts as usize],
            host_leaf: vec![0; hosts as usize],
            host_slot: vec![0; hosts as usize],
            leaves_per_pod,
        };
        for l in 0..leaves {
            t.switches.push(Switch {
                level: 0,
                pod: l / leaves_per_pod,
                up: Vec::new(),
                down: vec![usize::MAX; hpl as usize],
            });
        }
        // Hosts onto leaves (rail-optimised: GPU g of a server on leaf g
        // of the server's group).
        for h in 0..hosts {
            let (server, gpu) = (h / rails, h % rails);
            let group = server / hpl;
            let leaf = group * rails + gpu;
            let slot = server % hpl;
            t.host_leaf[h as usize] = leaf;
            t.host_slot[h as usize] = slot;
            let up = t.cable(Node::Host(h), Node::Switch(leaf), host_bps, prop, true);
            t.host_up[h as usize] = up.0;
            t.switches[leaf as usize].down[slot as usize] = up.1;
        }
        match spec.tiers {
            2 => {
                let spines: Vec<u32> = (0..half).map(|_| t.add_switch(1, 0, leaves)).collect();
                for l in 0..leaves {
                    for &s in &spines {
                        let (u, d) = t.cable(Node::Switch(l), Node::Switch(s), sw_bps, prop, false);
                        t.switches[l as usize].up.push(u);
                        t.switches[s as usize].down[l as usize] = d;
                    }
                }
            }
            _ => {
                let mut aggs = Vec::new();
                for p in 0..k {
                    let pod_aggs: Vec<u32> = (0..half).map(|_| t.add_switch(1, p, half)).collect();
                    for li in 0..half {
                        let l = p * half + li;
                        for &a in &pod_aggs {
                            let (u, d) =
                                t.cable(Node::Switch(l), Node::Switch(a), sw_bps, prop, false);
                            t.switches[l as usize].up.push(u);
                            t.switches[a as usize].down[li as usize] = d;
                        }
                    }
                    aggs.push(pod_aggs);
                }
                for j in 0..half {
                    for m in 0..half {
                        let c = t.add_switch(2, 0, k);
                        let _ = m;
                        for (p, pod_aggs) in aggs.iter().enumerate() {
                            let a = pod_aggs[j as usize];
                            let (u, d) =
                                t.cable(Node::Switch(a), Node::Switch(c), sw_bps, prop, false);
                            t.switches[a as usize].up.push(u);
                            t.switches[c as usize].down[p] = d;
                        }
                    }
                }
            }
        }
        Ok(t)
    }

    fn add_switch(&mut self, level: u8, pod: u32, children: u32) -> u32 {
        self.switches.push(Switch {
            level,
            pod,
            up: Vec::new(),
            down: vec![usize::MAX; children as usize],
        });
        (self.switches.len() - 1) as u32
    }

    /// Both directions of a cable: (a→b, b→a).
    fn cable(&mut self, a: Node, b: Node, bps: u64, prop: Ps, host: bool) -> (usize, usize) {
        self.links.push(LinkSpec {
            src: a,
            dst: b,
            bps,
            prop_ps: prop,
            host_cable: host,
        });
        self.links.push(LinkSpec {
            src: b,
            dst: a,
            bps,
            prop_ps: prop,
            host_cable: host,
        });
        (self.links.len() - 2, self.links.len() - 1)
    }

    /// The link a packet for `dst` leaves switch `sw` on; `hash` picks
    /// among equal-cost up-links.
    pub fn next_link(&self, sw: u32, dst: u32, hash: u64) -> usize {
        let s = &self.switches[sw as usize];
        let leaf = self.host_leaf[dst as usize];
        let up = |h: u64| s.up[(h % s.up.len() as u64) as usize];
        match (self.tiers, s.level) {
            (_, 0) => {
                if leaf == sw {
                    s.down[self.host_slot[dst as usize] as usize]
                } else {
                    up(hash)
                }
            }
            (2, _) => s.down[leaf as usize],
            (_, 1) => {
                let pod = leaf / self.leaves_per_pod;
                if pod == s.pod {
                    s.down[(leaf % self.leaves_per_pod) as usize]
                } else {
                    up(hash >> 20)
                }
            }
            _ => s.down[(leaf / self.leaves_per_pod) as usize],
        }
    }

    /// The number of switch hops from `a` to `b` (for ideal times).
    pub fn hops(&self, a: u32, b: u32) -> u32 {
        let (la, lb) = (self.host_leaf[a as usize], self.host_leaf[b as usize]);
        if la == lb {
            1
        } else if self.tiers == 2 || la / self.leaves_per_pod == lb / self.leaves_per_pod {
            3
        } else {
            5
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(tiers: u8, k: u32) -> Spec {
        serde_json::from_str(&format!(
            r#"{{"tiers": {tiers}, "k": {k}, "link_gbps": 100}}"#
        ))
        .unwrap()
    }

    /// Follows next_link from a's up-link until a host is reached.
    fn walk(t: &Tree, a: u32, b: u32, hash: u64) -> (u32, usize) {
        let mut l = t.host_up[a as usize];
        let mut hops = 0;
        loop {
            match t.links[l].dst {
                Node::Host(h) => return (h, hops),
                Node::Switch(s) => {
                    hops += 1;
                    assert!(hops < 10, "routing loop");
                    l = t.next_link(s, b, hash);
                }
            }
        }
    }

    #[test]
    fn sizes_of_k_ary_trees() {
        let t = Tree::build(&spec(2, 8)).unwrap();
        assert_eq!(t.hosts, 32);
        assert_eq!(t.switches.len(), 8 + 4);
        let t = Tree::build(&spec(3, 16)).unwrap();
        assert_eq!(t.hosts, 1024);
        assert_eq!(t.switches.len(), 128 + 128 + 64);
        assert_eq!(t.links.len(), 2 * (1024 + 128 * 8 + 128 * 8));
        let mut s = spec(2, 8);
        s.oversubscription = 3.0;
        let t = Tree::build(&s).unwrap();
        assert_eq!(t.hosts, 8 * 12, "3:1 puts 12 hosts on 4 up-links");
    }

    #[test]
    fn every_pair_reaches_its_host_by_the_shortest_path() {
        for (tiers, k) in [(2, 4), (3, 4), (3, 6)] {
            let t = Tree::build(&spec(tiers, k)).unwrap();
            for a in 0..t.hosts {
                for b in 0..t.hosts {
                    if a == b {
                        continue;
                    }
                    for hash in [0, 1, 7, 12345, u64::MAX] {
                        let (h, hops) = walk(&t, a, b, hash.wrapping_mul(0x9E37_79B9_7F4A_7C15));
                        assert_eq!(h, b);
                        assert_eq!(hops as u32, t.hops(a, b));
                    }
                }
            }
        }
    }

    #[test]
    fn rails_put_gpu_g_of_every_server_on_leaf_g() {
        let mut s = spec(2, 16);
        s.rails = 8;
        let t = Tree::build(&s).unwrap();
        // Servers of 8 GPUs; 8 hosts per leaf: servers 0..8 form group 0.
        for server in 0..8 {
            for g in 0..8 {
                assert_eq!(t.host_leaf[(server * 8 + g) as usize], g);
            }
        }
        assert_eq!(t.host_leaf[64], 8, "server 8 starts the next group");
        // Same GPU index on two servers of a group: one hop.
        assert_eq!(t.hops(3, 11), 1);
        assert_eq!(t.hops(3, 4), 3);
    }
}
