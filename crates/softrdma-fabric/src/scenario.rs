//! The scenario file (JSON, read with serde): topology, link layer,
//! transport, workload, cost. Every field is documented in docs/fabric.md;
//! unknown fields are refused, so a typo is an error, not a default.

use serde::{Deserialize, Serialize};

use crate::link::{PfcParams, Red};

/// A whole scenario.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Scenario {
    /// A name for the report.
    #[serde(default)]
    pub name: String,
    /// The seed of every random choice (ECMP salt, loss, engine keys).
    #[serde(default = "one")]
    pub seed: u64,
    pub topology: Topology,
    #[serde(default)]
    pub link_layer: LinkLayer,
    #[serde(default)]
    pub transport: Transport,
    pub workload: Workload,
    #[serde(default)]
    pub cost: Cost,
    /// In-network aggregation (SHARP-style), for the `sharp` algorithm.
    #[serde(default)]
    pub sharp: Sharp,
    /// Stop after this much simulated time (µs) whatever is left.
    #[serde(default = "default_limit")]
    pub time_limit_us: u64,
    /// Split the fabric into this many parts (by pod, or by leaf on two
    /// tiers) that run side by side, one per thread (`--threads`). The
    /// results depend on the split (it orders simultaneous events) but not
    /// on the threads. 1 (the default) runs it whole.
    #[serde(default = "one_part")]
    pub partitions: usize,
}

fn one() -> u64 {
    1
}
fn one_part() -> usize {
    1
}
fn default_limit() -> u64 {
    10_000_000
}

/// Routing of packets over equal-cost up-links.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "snake_case")]
pub enum Routing {
    /// Hash of (source, destination, UDP source port): one path per QP.
    #[default]
    Ecmp,
    /// A new hash per packet (per-packet spraying; packets reorder).
    Spray,
}

/// A k-ary fat-tree.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Topology {
    /// 2 (leaf–spine) or 3 (leaf–aggregation–core).
    pub tiers: u8,
    /// Switch radix (even). Two tiers: k leaves of k/2 up-links, k/2 spines
    /// (k²/2 hosts at 1:1). Three tiers: k pods of k/2 leaves and k/2
    /// aggregation switches, (k/2)² cores (k³/4 hosts at 1:1).
    pub k: u32,
    /// Hosts per leaf over leaf up-links (1.0 = non-blocking).
    #[serde(default = "onef")]
    pub oversubscription: f64,
    /// Hosts actually used (default: all the tree has room for).
    #[serde(default)]
    pub hosts: Option<u32>,
    /// GPUs per server; with more than 1 the leaves are rail-optimised:
    /// GPU g of every server of a group sits on leaf g of that group.
    #[serde(default = "one32")]
    pub rails: u32,
    /// Switch-to-switch link speed (Gb/s).
    pub link_gbps: f64,
    /// Host NIC speed (Gb/s; default `link_gbps`).
    #[serde(default)]
    pub host_gbps: Option<f64>,
    /// Propagation delay of every cable (ns).
    #[serde(default = "default_cable")]
    pub cable_ns: f64,
    /// A switch's forwarding latency (ns), added to every hop.
    #[serde(default = "default_switch")]
    pub switch_ns: f64,
    #[serde(default)]
    pub routing: Routing,
}

fn onef() -> f64 {
    1.0
}
fn one32() -> u32 {
    1
}
fn default_cable() -> f64 {
    25.0
}
fn default_switch() -> f64 {
    300.0
}

/// The link layer of every link.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "snake_case")]
pub enum LinkKind {
    /// Ethernet without flow control: tail drop in a shared buffer.
    #[default]
    Lossy,
    /// Ethernet with 802.1Qbb PFC.
    Pfc,
    /// InfiniBand credit-based flow control (per-VL credits).
    IbCredit,
}

/// Link-layer parameters.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LinkLayer {
    #[serde(default)]
    pub kind: LinkKind,
    /// A switch's shared buffer (bytes).
    #[serde(default = "default_buffer")]
    pub buffer_bytes: u64,
    /// The most one egress queue may hold (bytes, lossy Ethernet).
    #[serde(default = "default_port")]
    pub port_queue_bytes: u64,
    /// PFC thresholds per ingress port and priority.
    #[serde(default = "default_pfc")]
    pub pfc: PfcParams,
    /// IB: the receive buffer each VL of each port advertises (bytes).
    #[serde(default = "default_credits")]
    pub credit_bytes: u64,
    /// RED/ECN marking on every switch egress queue (none: no marking).
    #[serde(default)]
    pub ecn: Option<Red>,
    /// Random loss on links: see [`Loss`].
    #[serde(default)]
    pub loss: Loss,
}

fn default_buffer() -> u64 {
    32 << 20
}
fn default_port() -> u64 {
    2 << 20
}
fn default_pfc() -> PfcParams {
    PfcParams {
        xoff_bytes: 256 << 10,
        xon_bytes: 128 << 10,
        headroom_bytes: 128 << 10,
    }
}
fn default_credits() -> u64 {
    256 << 10
}

impl Default for LinkLayer {
    fn default() -> Self {
        LinkLayer {
            kind: LinkKind::Lossy,
            buffer_bytes: default_buffer(),
            port_queue_bytes: default_port(),
            pfc: default_pfc(),
            credit_bytes: default_credits(),
            ecn: None,
            loss: Loss::default(),
        }
    }
}

/// Which links lose packets at random, and how often.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Loss {
    /// Probability that a data packet crossing a chosen link is lost.
    #[serde(default)]
    pub rate: f64,
    /// Or a bit error rate (turned into a per-packet rate by size).
    #[serde(default)]
    pub ber: f64,
    /// Which links: "all", "host" (host↔leaf cables), or "one" (the first
    /// host's up-link: the seed's single dirty connector).
    #[serde(default = "default_where")]
    pub links: String,
}

fn default_where() -> String {
    "all".into()
}

impl Default for Loss {
    fn default() -> Self {
        Loss {
            rate: 0.0,
            ber: 0.0,
            links: default_where(),
        }
    }
}

/// The RDMA transport at the endpoints (softrdma's engine).
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Transport {
    /// "go_back_n" or "selective_repeat".
    #[serde(default = "default_recovery")]
    pub recovery: String,
    /// DCQCN rate control (with ECN-capable packets).
    #[serde(default)]
    pub dcqcn: bool,
    /// Packets in flight per QP.
    #[serde(default = "default_window")]
    pub window: u32,
    /// The local ACK timeout exponent (4.096 µs × 2^timeout).
    #[serde(default = "default_timeout")]
    pub timeout: u8,
    /// The path MTU (256 … 4096).
    #[serde(default = "default_mtu")]
    pub mtu: u32,
    /// A host's own latency per message (ns): software, doorbell, WQE
    /// fetch and completion, added between what a message waits for and
    /// its post (0: an ideal host).
    #[serde(default)]
    pub host_ns: f64,
}

fn default_recovery() -> String {
    "go_back_n".into()
}
fn default_window() -> u32 {
    256
}
fn default_timeout() -> u8 {
    8
}
fn default_mtu() -> u32 {
    4096
}

impl Default for Transport {
    fn default() -> Self {
        Transport {
            recovery: default_recovery(),
            dcqcn: false,
            window: default_window(),
            timeout: default_timeout(),
            mtu: default_mtu(),
            host_ns: 0.0,
        }
    }
}

/// What the hosts do.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, tag = "kind", rename_all = "snake_case")]
pub enum Workload {
    /// Explicit flows.
    Flows { flows: Vec<Flow> },
    /// Every host sends `bytes` to another, chosen by a seeded derangement.
    Permutation { bytes: u64 },
    /// Every host sends `bytes / n` to every other.
    AllToAll { bytes: u64 },
    /// An all-reduce of `bytes` per host by `algorithm`.
    AllReduce {
        bytes: u64,
        #[serde(default)]
        algorithm: Algorithm,
        /// Repeat this many times back to back.
        #[serde(default = "one32")]
        repeat: u32,
    },
    /// Data-parallel training: `steps` × (compute, then an all-reduce of
    /// the gradients).
    Training {
        steps: u32,
        compute_us: f64,
        gradient_bytes: u64,
        #[serde(default)]
        algorithm: Algorithm,
    },
}

/// A point-to-point flow.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Flow {
    pub src: u32,
    pub dst: u32,
    pub bytes: u64,
    /// Start (µs after the run begins).
    #[serde(default)]
    pub start_us: f64,
}

/// All-reduce algorithms, as traffic.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "snake_case")]
pub enum Algorithm {
    /// Reduce-scatter then all-gather around a ring: 2(n−1) steps of bytes/n.
    #[default]
    Ring,
    /// log2(n) steps, each host exchanging all `bytes` with its partner
    /// (htsim's recursive-doubling workload).
    RecursiveDoubling,
    /// Reduce-scatter by recursive halving, all-gather by doubling.
    HalvingDoubling,
    /// NCCL's double binary tree: the data in two halves, each reduced up
    /// one of two binary trees (a host that is a leaf of one is inside
    /// the other) and broadcast back down, pipelined in chunks of at most
    /// 512 KiB.
    DoubleBinaryTree,
    /// In-network aggregation (SHARP-style): every host sends its data
    /// once up an aggregation tree of switches, which reduce and forward;
    /// the root sends the result down, replicated at every branch.
    Sharp,
}

/// The switches' aggregation engines (see docs/fabric.md).
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Sharp {
    /// Time an aggregating switch takes to reduce a chunk once its last
    /// contribution has arrived (ns), on top of `switch_ns`.
    #[serde(default = "default_alu")]
    pub alu_ns: f64,
    /// Chunks one switch can be aggregating at once (its aggregation
    /// buffers); a host keeps at most this many chunks outstanding.
    #[serde(default = "default_slots")]
    pub slots: u32,
}

fn default_alu() -> f64 {
    100.0
}
fn default_slots() -> u32 {
    64
}

impl Default for Sharp {
    fn default() -> Self {
        Sharp {
            alu_ns: default_alu(),
            slots: default_slots(),
        }
    }
}

/// What an idle GPU costs.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Cost {
    /// Price of one GPU-hour (USD).
    #[serde(default = "default_price")]
    pub gpu_hour_usd: f64,
    /// GPUs the result is scaled to (default: the simulated hosts).
    #[serde(default)]
    pub gpus: Option<u32>,
}

fn default_price() -> f64 {
    2.5
}

impl Default for Cost {
    fn default() -> Self {
        Cost {
            gpu_hour_usd: default_price(),
            gpus: None,
        }
    }
}

impl Scenario {
    /// Parses and checks a scenario.
    pub fn from_json(text: &str) -> Result<Scenario, String> {
        let s: Scenario = serde_json::from_str(text).map_err(|e| format!("scenario: {e}"))?;
        s.validate()?;
        Ok(s)
    }

    /// Refuses values the simulator cannot run.
    pub fn validate(&self) -> Result<(), String> {
        let t = &self.topology;
        if !(1..=64).contains(&self.partitions) {
            return Err(
                "partitions must be 1..=64 (parts run side by side; 1 runs the fabric whole)"
                    .into(),
            );
        }
        if t.tiers != 2 && t.tiers != 3 {
            return Err("topology.tiers must be 2 or 3".into());
        }
        if t.k < 2 || !t.k.is_multiple_of(2) || t.k > 128 {
            return Err("topology.k must be even, 2..=128".into());
        }
        if !(t.oversubscription >= 1.0 && t.oversubscription <= 16.0) {
            return Err("topology.oversubscription must be in 1..=16".into());
        }
        let speed_ok = |g: f64| (1.0..=1600.0).contains(&g);
        if !speed_ok(t.link_gbps) || !t.host_gbps.is_none_or(speed_ok) {
            return Err("link speeds must be 1..=1600 Gb/s".into());
        }
        if !(0.0..=1e7).contains(&t.cable_ns) || !(0.0..=1e7).contains(&t.switch_ns) {
            return Err("latencies must be 0..=1e7 ns".into());
        }
        if t.rails == 0 || t.rails > 64 {
            return Err("topology.rails must be 1..=64".into());
        }
        let l = &self.link_layer;
        if !(0.0..1.0).contains(&l.loss.rate) || !(0.0..1.0).contains(&l.loss.ber) {
            return Err("loss rates must be in [0, 1)".into());
        }
        if !["all", "host", "one"].contains(&l.loss.links.as_str()) {
            return Err("link_layer.loss.links must be all, host or one".into());
        }
        if l.pfc.xon_bytes > l.pfc.xoff_bytes {
            return Err("pfc.xon_bytes must not exceed xoff_bytes".into());
        }
        if l.credit_bytes < 4200 {
            return Err("credit_bytes must hold one MTU packet".into());
        }
        if let Some(r) = l.ecn {
            if r.kmax_bytes <= r.kmin_bytes || !(0.0..=1.0).contains(&r.pmax) {
                return Err("ecn: kmin < kmax, 0 <= pmax <= 1".into());
            }
        }
        let tr = &self.transport;
        if !["go_back_n", "selective_repeat"].contains(&tr.recovery.as_str()) {
            return Err("transport.recovery must be go_back_n or selective_repeat".into());
        }
        if ![256, 512, 1024, 2048, 4096].contains(&tr.mtu) {
            return Err("transport.mtu must be 256, 512, 1024, 2048 or 4096".into());
        }
        if tr.window == 0 || tr.window > 4096 || tr.timeout > 31 {
            return Err("transport.window 1..=4096, timeout 0..=31".into());
        }
        if !(0.0..=1e7).contains(&tr.host_ns) {
            return Err("transport.host_ns must be 0..=1e7".into());
        }
        if !(0.0..=1e7).contains(&self.sharp.alu_ns) || !(1..=65_536).contains(&self.sharp.slots) {
            return Err("sharp: alu_ns 0..=1e7, slots 1..=65536".into());
        }
        let sharp = match &self.workload {
            Workload::AllReduce { algorithm, .. } | Workload::Training { algorithm, .. } => {
                *algorithm == Algorithm::Sharp
            }
            _ => false,
        };
        if sharp && (l.kind == LinkKind::Lossy || l.loss.rate > 0.0 || l.loss.ber > 0.0) {
            return Err(
                "the sharp algorithm needs a lossless link layer (pfc or ib_credit) and no corruption loss: \
                 the aggregation trees have no retransmission"
                    .into(),
            );
        }
        let max_msg = 1u64 << 31;
        match &self.workload {
            Workload::Flows { flows } => {
                if flows
                    .iter()
                    .any(|f| f.bytes == 0 || f.bytes > max_msg || f.start_us < 0.0)
                {
                    return Err("flow bytes must be 1..=2^31, start_us >= 0".into());
                }
            }
            Workload::Permutation { bytes } | Workload::AllToAll { bytes } => {
                if *bytes == 0 || *bytes > max_msg {
                    return Err("workload.bytes must be 1..=2^31".into());
                }
            }
            Workload::AllReduce { bytes, repeat, .. } => {
                if *bytes == 0 || *bytes > max_msg || *repeat == 0 || *repeat > 10_000 {
                    return Err("all_reduce bytes 1..=2^31, repeat 1..=10000".into());
                }
            }
            Workload::Training {
                steps,
                compute_us,
                gradient_bytes,
                ..
            } => {
                if *steps == 0 || *steps > 10_000 || !(0.0..=1e9).contains(compute_us) {
                    return Err("training: steps 1..=10000, compute_us >= 0".into());
                }
                if *gradient_bytes == 0 || *gradient_bytes > max_msg {
                    return Err("training.gradient_bytes must be 1..=2^31".into());
                }
            }
        }
        if !(0.0..=1e6).contains(&self.cost.gpu_hour_usd) {
            return Err("cost.gpu_hour_usd out of range".into());
        }
        Ok(())
    }
}
