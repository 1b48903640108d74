//! What one seed simulates: nodes, network impairments, connections, QP
//! attributes, workload shape and link cuts, all drawn from the seed.

use std::time::Duration;

use softrdma_engine::sim::NetConfig;
use softrdma_engine::{local_ack_timeout, Mtu, QpType, Rng};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// No loss, duplication, corruption or cuts (some reordering): no error
    /// completion of any kind may happen.
    Clean,
    /// Random loss up to 20 %, duplication, corruption, jitter.
    Lossy,
    /// Lossy plus links cut for a while and healed.
    Partitions,
    /// Lossy plus one link cut for good.
    PermanentCut,
}

/// One invalid WR a requester posts in the middle of its work, and the
/// status it must complete with (unless retries run out first).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Poison {
    /// WRITE with an rkey nobody has: REM_ACCESS_ERR, target untouched.
    BadRkeyWrite,
    /// READ running past the end of the responder's region: REM_ACCESS_ERR.
    ReadPastTheEnd,
    /// FETCH_ADD on an address that is not 8-byte aligned: REM_INV_REQ_ERR.
    MisalignedAtomic,
    /// WRITE from a buffer with a bad lkey: LOC_PROT_ERR, nothing sent.
    BadLkey,
}

#[derive(Debug, Clone)]
pub struct Conn {
    pub qp_type: QpType,
    /// Node indices of the two ends.
    pub a: usize,
    pub b: usize,
    pub mtu: Mtu,
    pub timeout: u8,
    pub retry_cnt: u8,
    pub rnr_retry: u8,
    pub min_rnr_timer: u8,
    pub rd_atomic: u8,
    pub psn_a: u32,
    pub psn_b: u32,
    /// The b end receives through its node's SRQ.
    pub srq_b: bool,
    /// Largest SEND on this connection (the receive buffers are this big).
    pub send_max: u32,
    /// Receive WQEs the receiver keeps posted.
    pub recv_depth: usize,
    /// Both ends issue work (otherwise only a).
    pub both_ways: bool,
    /// An XRC connection ([`XRC`] set in the seed): a is an XRC initiator,
    /// b an XRC target whose requests land in b's node's XRC SRQ (so
    /// `srq_b` holds and only a issues work).
    pub xrc: bool,
}

/// Links `from`→`to` (and back when `both`) are down in `[start, end)`.
#[derive(Debug, Clone, Copy)]
pub struct Cut {
    pub from: usize,
    pub to: usize,
    pub both: bool,
    pub start: Duration,
    pub end: Option<Duration>,
}

#[derive(Debug, Clone)]
pub struct Scenario {
    pub seed: u64,
    pub mode: Mode,
    pub nodes: usize,
    pub net: NetConfig,
    /// Share of packets delayed by the jitter (see `SimNet::set_jitter_fraction`).
    pub jitter_fraction: f64,
    pub max_inflight: u32,
    pub ack_req_every: u32,
    /// `EngineConfig::ack_delay_ns` of every node.
    pub ack_delay_ns: u64,
    pub conns: Vec<Conn>,
    /// Every node gets a UD QP.
    pub ud: bool,
    pub ud_recv_depth: usize,
    pub srq_cap: u32,
    pub srq_depth: usize,
    /// Work requests to post, over all QPs.
    pub ops: usize,
    /// Allow messages up to 1 MiB.
    pub large: bool,
    /// Probability per harness turn of topping up receive queues.
    pub repost_p: f64,
    pub unsignaled_p: f64,
    pub fence_p: f64,
    /// Probability per turn that a QP posts a burst.
    pub post_p: f64,
    /// Most WRs a QP has outstanding.
    pub max_outstanding: usize,
    pub cuts: Vec<Cut>,
    /// The first RC requester posts this invalid WR halfway through.
    pub poison: Option<Poison>,
    /// Probability per turn that an RC requester drains its send queue
    /// (RTS→SQD, wait for SqDrained, SQD→RTS).
    pub sqd_p: f64,
    /// Every node on one host ([`SAME_HOST`] set in the seed): the device
    /// cores' direct path executes one-sided WRs in the peer's memory.
    pub same_host: bool,
    /// Every node on one switch ([`FABRIC`] set in the seed).
    pub fabric: Option<Fabric>,
    /// Every RC connection negotiated selective repeat
    /// ([`SELECTIVE_REPEAT`] set in the seed).
    pub selective_repeat: bool,
    /// Memory windows in the workload ([`MEMORY_WINDOWS`] set in the seed).
    pub mw: bool,
    /// Every node runs DCQCN ([`DCQCN`] set in the seed).
    pub dcqcn: bool,
    /// XRC connections in the workload ([`XRC`] set in the seed).
    pub xrc: bool,
    /// Every packet crosses softrdma-fabric's model ([`FABRIC_MODEL`] set
    /// in the seed).
    pub fabric_model: Option<FabricModel>,
}

/// A fat-tree of softrdma-fabric (`softrdma_fabric::Carrier`) that carries
/// every packet: its switches, queues and link layer in place of the
/// network's delay and jitter.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FabricModel {
    /// `lossy` (tail drop), `pfc` or `ib_credit`; never lossy on a clean
    /// network, where nothing may be lost.
    pub kind: &'static str,
    pub link_gbps: u64,
    pub cable_ns: u64,
    /// Lossy Ethernet: the most one egress queue holds.
    pub port_queue_bytes: u64,
    /// RED marking on every switch egress queue (ECN-capable packets).
    pub ecn: bool,
}

impl FabricModel {
    /// Drawn from its own generator, as [`Fabric`] is.
    fn from_seed(seed: u64, clean: bool) -> FabricModel {
        let mut r = Rng::new(seed ^ 0xFAB2_0DE1);
        let kinds: &[&'static str] = if clean {
            &["pfc", "ib_credit"]
        } else {
            &["lossy", "lossy", "pfc", "ib_credit"]
        };
        FabricModel {
            kind: pick(&mut r, kinds),
            link_gbps: pick(&mut r, &[10, 25, 100]),
            cable_ns: 50 + r.below(2_000),
            port_queue_bytes: pick(&mut r, &[16 << 10, 64 << 10, 256 << 10]),
            ecn: r.chance(0.5),
        }
    }

    /// The fabric's scenario: a two-tier fat-tree of radix 4 (8 hosts on
    /// 4 leaves and 2 spines); its workload is not used.
    pub fn scenario_json(&self, seed: u64) -> String {
        let ecn = if self.ecn {
            r#", "ecn": {"kmin_bytes": 8000, "kmax_bytes": 64000, "pmax": 0.2}"#
        } else {
            ""
        };
        format!(
            r#"{{"seed": {seed}, "topology": {{"tiers": 2, "k": 4, "link_gbps": {}, "cable_ns": {},
                "switch_ns": 300}},
              "link_layer": {{"kind": "{}", "port_queue_bytes": {}{ecn}}},
              "workload": {{"kind": "permutation", "bytes": 1}}}}"#,
            self.link_gbps, self.cable_ns, self.kind, self.port_queue_bytes
        )
    }
}

/// A star of links (`SimNet::star`) that replaces the network's delay.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Fabric {
    pub rate_bps: u64,
    pub delay: Duration,
    /// The bound of every link's queue (never on a clean network, where
    /// nothing may be lost).
    pub queue_bytes: Option<usize>,
    /// The switch's ports mark every packet CE from this many queued bytes
    /// on, ECN-capable or not, so that the receivers' CE counts are
    /// checked against the marks.
    pub ecn_from: Option<usize>,
}

impl Fabric {
    /// Drawn from its own generator, so that the rest of the scenario is
    /// the one the seed gives without the bit.
    fn from_seed(seed: u64, clean: bool) -> Fabric {
        let mut r = Rng::new(seed ^ 0xFAB1_0C5E);
        Fabric {
            rate_bps: pick(&mut r, &[10, 25, 100]) * 1_000_000_000,
            delay: Duration::from_nanos(500 + r.below(10_000)),
            queue_bytes: if clean {
                None
            } else {
                pick(
                    &mut r,
                    &[None, Some(64 << 10), Some(256 << 10), Some(1 << 20)],
                )
            },
            ecn_from: pick(&mut r, &[None, Some(8 << 10), Some(64 << 10)]),
        }
    }
}

/// Seeds with this bit set put every node on one host. The rest of the
/// seed draws the scenario as for any other seed, except that the links
/// are never cut (same-host peers are joined by memory, not a network).
pub const SAME_HOST: u64 = 1 << 48;

/// Seeds with this bit set put every node on one switch ([`Fabric`]),
/// with links cut for a while but never for good (the oracle bounds what
/// may still arrive after a permanent cut by the network's delay alone).
pub const FABRIC: u64 = 1 << 49;

/// Seeds with this bit set run every RC connection with selective repeat
/// (both ends set the ECE option before RTR); the rest of the scenario is
/// the seed's without the bit.
pub const SELECTIVE_REPEAT: u64 = 1 << 50;

/// Seeds with this bit set run DCQCN on every node (ECT(0) on every
/// packet, CNPs for CE marks, paced rates); the rest of the scenario is
/// the seed's without the bit.
pub const DCQCN: u64 = 1 << 51;

/// Seeds with this bit set use memory windows: every connected QP binds a
/// type-2 window over the area its peer works in (a bind work request on
/// its send queue, the first WR it posts), and once the bind completed the
/// peer sends a share of its WRITEs, READs and atomics through the
/// window's rkey instead of the region's; requesters also rebind (and
/// unbind) a type-1 window of their own now and then, between their other
/// WRs. The rest of the scenario is drawn from the seed as for any other.
pub const MEMORY_WINDOWS: u64 = 1 << 52;

/// Seeds with this bit set turn every RC connection whose receiver uses
/// its node's SRQ into an XRC connection (and the first connection into
/// one when none does): the initiator's WRs name the target node's XRC SRQ
/// in their XRCETH, target QPs of one node share that SRQ and its CQ, and
/// the target issues no work (it has no send queue). Every operation runs
/// on them as on RC, under the same oracle. The rest of the scenario is
/// the seed's without the bit.
pub const XRC: u64 = 1 << 53;

/// Seeds with this bit set carry every packet through softrdma-fabric's
/// model ([`FabricModel`]: a fat-tree with a lossy, PFC or InfiniBand
/// credit link layer, chosen by the seed), with links cut for a while but
/// never for good, as on [`FABRIC`]; the rest of the scenario is the
/// seed's without the bit.
pub const FABRIC_MODEL: u64 = 1 << 54;

fn pick<T: Copy>(r: &mut Rng, xs: &[T]) -> T {
    xs[r.below(xs.len() as u64) as usize]
}

impl Scenario {
    pub fn from_seed(seed: u64) -> Scenario {
        let mut r = Rng::new(seed.wrapping_mul(0x2545_F491_4F6C_DD1D) ^ 0x51u64);
        let mode = match r.below(100) {
            0..=14 => Mode::Clean,
            15..=69 => Mode::Lossy,
            70..=84 => Mode::Partitions,
            _ => Mode::PermanentCut,
        };
        let nodes = if r.chance(0.3) { 3 } else { 2 };
        let jitter = Duration::from_micros(pick(&mut r, &[0, 0, 3, 10, 60]));
        let net = if mode == Mode::Clean {
            NetConfig {
                loss: 0.0,
                duplicate: 0.0,
                corrupt: 0.0,
                delay: Duration::from_micros(1 + r.below(20)),
                jitter,
            }
        } else {
            NetConfig {
                loss: r.below(21) as f64 / 100.0,
                duplicate: r.below(4) as f64 / 100.0,
                corrupt: r.below(4) as f64 / 100.0,
                delay: Duration::from_micros(1 + r.below(20)),
                jitter,
            }
        };
        // 1 MiB messages only on a mildly lossy path: go-back-N resends up
        // to a window per loss, which at 20 % loss makes them very slow.
        let large = r.chance(0.06);
        let mut net = net;
        let mut jitter_fraction: f64 = pick(&mut r, &[1.0, 0.2, 0.05, 0.05]);
        if large {
            net.loss = net.loss.min(0.03);
            jitter_fraction = jitter_fraction.min(0.05);
        }
        // A clean network still reorders, but does not scramble every burst:
        // a READ answered by dozens of packets then seldom arrives in order,
        // and each reordering NAK spends a retry, so even a correct requester
        // may give up (the lossy modes cover that, judged by the wire).
        if mode == Mode::Clean {
            jitter_fraction = jitter_fraction.min(0.2);
        }
        let srq_cap = if large {
            1 << 20
        } else {
            pick(&mut r, &[256, 4096, 65536])
        };
        let mut conns = Vec::new();
        let n_rc = 1 + r.below(3) as usize;
        let n_uc = if r.chance(0.4) { 1 } else { 0 };
        for i in 0..n_rc + n_uc {
            let qp_type = if i < n_rc { QpType::Rc } else { QpType::Uc };
            let a = r.below(nodes as u64) as usize;
            let b = (a + 1 + r.below(nodes as u64 - 1) as usize) % nodes;
            let near_wrap = r.chance(0.3);
            let mut psn = || {
                if near_wrap {
                    0xFF_FFFF - r.below(40) as u32
                } else {
                    r.next_u32() & 0xFF_FFFF
                }
            };
            let (psn_a, psn_b) = (psn(), psn());
            let srq_b = qp_type == QpType::Rc && r.chance(0.3);
            let mut send_max = if large && qp_type == QpType::Rc {
                1 << 20
            } else {
                pick(&mut r, &[64, 2048, 16384, 65536])
            };
            if srq_b {
                send_max = send_max.min(srq_cap);
            }
            let recv_depth = if send_max >= 1 << 20 {
                2
            } else {
                1 + r.below(16) as usize
            };
            let rd = 1 + r.below(16) as u8;
            conns.push(Conn {
                qp_type,
                a,
                b,
                mtu: if large {
                    pick(&mut r, &[Mtu::Mtu1024, Mtu::Mtu2048, Mtu::Mtu4096])
                } else {
                    pick(
                        &mut r,
                        &[
                            Mtu::Mtu256,
                            Mtu::Mtu512,
                            Mtu::Mtu1024,
                            Mtu::Mtu2048,
                            Mtu::Mtu4096,
                        ],
                    )
                },
                timeout: 8 + r.below(5) as u8,
                retry_cnt: if mode == Mode::PermanentCut {
                    r.below(8) as u8
                } else {
                    7
                },
                rnr_retry: 7,
                min_rnr_timer: 1 + r.below(12) as u8,
                rd_atomic: rd,
                psn_a,
                psn_b,
                srq_b,
                send_max,
                recv_depth,
                both_ways: r.chance(0.5),
                xrc: false,
            });
        }
        let min_timeout = conns
            .iter()
            .filter(|c| c.qp_type == QpType::Rc)
            .map(|c| local_ack_timeout(c.timeout).unwrap())
            .min()
            .unwrap();
        let mut cuts = Vec::new();
        match mode {
            Mode::Partitions => {
                for _ in 0..1 + r.below(3) {
                    let from = r.below(nodes as u64) as usize;
                    let to = (from + 1 + r.below(nodes as u64 - 1) as usize) % nodes;
                    let start = Duration::from_micros(r.below(20_000));
                    // Mostly shorter than the retry budget; sometimes not.
                    let len = if r.chance(0.8) {
                        min_timeout.mul_f64(0.2 + 2.5 * r.below(1000) as f64 / 1000.0)
                    } else {
                        min_timeout.mul_f64(4.0 + 8.0 * r.below(1000) as f64 / 1000.0)
                    };
                    cuts.push(Cut {
                        from,
                        to,
                        both: r.chance(0.5),
                        start,
                        end: Some(start + len),
                    });
                }
            }
            Mode::PermanentCut => {
                let from = r.below(nodes as u64) as usize;
                let to = (from + 1 + r.below(nodes as u64 - 1) as usize) % nodes;
                cuts.push(Cut {
                    from,
                    to,
                    both: r.chance(0.5),
                    start: Duration::from_micros(r.below(30_000)),
                    end: None,
                });
            }
            _ => {}
        }
        let ud = r.chance(0.5);
        let fields = (
            pick(&mut r, &[8, 32, 256]),
            pick(&mut r, &[1, 4, 32]),
            1 + r.below(16) as usize,
            2 + r.below(16) as usize,
            40 + r.below(120) as usize,
            pick(&mut r, &[1.0, 1.0, 0.5, 0.05]),
            pick(&mut r, &[0.0, 0.3, 0.7]),
            pick(&mut r, &[0.0, 0.1, 0.3]),
            pick(&mut r, &[0.05, 0.3, 1.0]),
            pick(&mut r, &[1, 4, 16, 64]),
        );
        let poison = (mode != Mode::PermanentCut && r.chance(0.12)).then(|| {
            pick(
                &mut r,
                &[
                    Poison::BadRkeyWrite,
                    Poison::ReadPastTheEnd,
                    Poison::MisalignedAtomic,
                    Poison::BadLkey,
                ],
            )
        });
        let sqd_p = if r.chance(0.2) { 0.003 } else { 0.0 };
        let xrc = seed & XRC != 0;
        if xrc {
            make_xrc(&mut conns, srq_cap);
        }
        let same_host = seed & SAME_HOST != 0;
        let fabric = seed & FABRIC != 0;
        let fabric_model = seed & FABRIC_MODEL != 0;
        let mode = match mode {
            Mode::PermanentCut if fabric || fabric_model => {
                cuts.clear();
                for c in &mut conns {
                    c.retry_cnt = 7;
                }
                Mode::Lossy
            }
            Mode::Partitions | Mode::PermanentCut if same_host => {
                cuts.clear();
                for c in &mut conns {
                    c.retry_cnt = 7;
                }
                Mode::Lossy
            }
            m => m,
        };
        Scenario {
            seed,
            mode,
            nodes,
            net,
            jitter_fraction,
            max_inflight: fields.0,
            ack_req_every: fields.1,
            // From the seed, not the scenario's RNG, so that adding it left
            // every other choice of every seed as it was.
            ack_delay_ns: [0, 0, 3_000, 25_000]
                [(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 62) as usize],
            conns,
            ud,
            ud_recv_depth: fields.2,
            srq_cap,
            srq_depth: fields.3,
            ops: fields.4,
            large,
            repost_p: fields.5,
            unsignaled_p: fields.6,
            fence_p: fields.7,
            post_p: fields.8,
            max_outstanding: fields.9,
            cuts,
            poison,
            sqd_p,
            same_host,
            fabric: fabric.then(|| Fabric::from_seed(seed, mode == Mode::Clean)),
            selective_repeat: seed & SELECTIVE_REPEAT != 0,
            dcqcn: seed & DCQCN != 0,
            mw: seed & MEMORY_WINDOWS != 0,
            xrc,
            fabric_model: fabric_model.then(|| FabricModel::from_seed(seed, mode == Mode::Clean)),
        }
    }
}

/// [`XRC`]: the RC connections with an SRQ receiver become XRC, one-way;
/// without any, the first connection (always RC) becomes one.
fn make_xrc(conns: &mut [Conn], srq_cap: u32) {
    if !conns.iter().any(|c| c.srq_b) {
        let c = &mut conns[0];
        c.srq_b = true;
        c.send_max = c.send_max.min(srq_cap);
    }
    for c in conns.iter_mut().filter(|c| c.srq_b) {
        c.xrc = true;
        c.both_ways = false;
    }
}
