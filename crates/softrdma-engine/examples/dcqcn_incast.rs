//! DCQCN on an ECN-marking bottleneck, in the deterministic simulator
//! (issue 19). Several senders stream RDMA WRITEs to one receiver through
//! one switch (`SimNet::star`, 100 Gb/s links, 1 µs each). The switch's port
//! to the receiver has a 1 MiB queue and marks ECN-capable packets with RED
//! (100 KB to 400 KB, up to 20 %, as the ns-3 HPCC model sets it for
//! 25 Gb/s; `RED` below). Without DCQCN
//! the packets are not ECN-capable and nothing slows the senders: the
//! queue fills, drops at its tail, and go-back-N resends pile up. With
//! DCQCN (ECT(0) on every packet, CNPs from the receiver, rate cuts at the
//! senders) the queue stays short and nothing is dropped.
//!
//! `cargo run --release -p softrdma-engine --example dcqcn_incast [-- SENDERS [MS]]`
//! (defaults: 3 senders, 100 ms of simulated time, the first 5 ms not counted).

mod common;

use std::time::Duration;

use common::{connect, side, write, Side};
use softrdma_engine::sim::{ecn_red, node_addr, LinkConfig, NetConfig, SimNet};
use softrdma_engine::*;

const RATE: u64 = 100_000_000_000;
const MSG: u32 = 64 << 10;
const DEPTH: u64 = 16;
/// RED marking at the bottleneck: from `.0` queued bytes, with a
/// probability rising to `.2` at `.1` (and 1 above it).
const RED: (usize, usize, f64) = (100_000, 400_000, 0.2);

struct Out {
    gbps: Vec<f64>,
    drops: u64,
    max_queue: usize,
    marked: u64,
    retransmits: u64,
    cnps: u64,
    cuts: u64,
    min_rate: u64,
}

fn run(senders: usize, ms: u64, cc: Option<DcqcnParams>) -> Out {
    let dcqcn = cc.is_some();
    let n = senders + 1;
    let rx = senders;
    let cfgs = (0..n).map(|i| {
        let mut c = EngineConfig::new(node_addr(i));
        c.seed = 40 + i as u64;
        if let Some(p) = cc {
            c.congestion = CongestionConfig::dcqcn(p);
        }
        c
    });
    let mut net = SimNet::with_configs(
        cfgs,
        9,
        NetConfig {
            delay: Duration::ZERO,
            ..NetConfig::perfect()
        },
    );
    // A star whose hosts' own queues are unbounded and whose switch ports
    // hold 1 MiB.
    let host = LinkConfig::ethernet(RATE, Duration::from_micros(1));
    let switch = LinkConfig {
        queue_bytes: Some(1 << 20),
        ..host
    };
    let up: Vec<_> = (0..n).map(|_| net.add_link(host)).collect();
    let down: Vec<_> = (0..n).map(|_| net.add_link(switch)).collect();
    for (a, &u) in up.iter().enumerate() {
        for (b, &d) in down.iter().enumerate().filter(|&(b, _)| b != a) {
            net.set_route(a, b, &[u, d]);
        }
    }
    let port = down[rx];
    net.set_ecn_hook(port, Some(ecn_red(RED.0, RED.1, RED.2, 3)));
    let now = net.now;
    let mut pairs: Vec<(Side, Side)> = Vec::new();
    for s in 0..senders {
        let a = side(&mut net.nodes[s], s);
        let b = side(&mut net.nodes[rx], rx);
        connect(&mut net.nodes[s], now, &a, &b, rx);
        connect(&mut net.nodes[rx], now, &b, &a, s);
        pairs.push((a, b));
    }
    let t0 = net.now;
    let warm = t0 + Duration::from_millis(5);
    let end = t0 + Duration::from_millis(ms);
    let mut posted = vec![0u64; senders];
    let mut done = vec![0u64; senders];
    let mut counted = vec![0u64; senders];
    let mut wcs = Vec::new();
    let mut min_rate = u64::MAX;
    let mut drops_at_warm = None;
    let mut max_queue = 0;
    while net.now < end {
        for (s, (a, b)) in pairs.iter().enumerate() {
            while posted[s] - done[s] < DEPTH {
                let wr = write(posted[s], a, b, posted[s] % 32, MSG);
                let now = net.now;
                net.nodes[s].post_send(now, a.qpn, &wr).unwrap();
                posted[s] += 1;
            }
        }
        assert!(net.step(), "the network went idle");
        if net.now >= warm {
            drops_at_warm.get_or_insert(net.link_stats(port).tail_drops);
            max_queue = max_queue.max(net.queued_bytes(port));
        }
        for (s, (a, _)) in pairs.iter().enumerate() {
            wcs.clear();
            net.nodes[s].poll_cq(a.cq, 64, &mut wcs).unwrap();
            for w in &wcs {
                assert_eq!(w.status, WcStatus::Success);
            }
            done[s] += wcs.len() as u64;
            if net.now >= warm {
                counted[s] += wcs.len() as u64;
            }
            if dcqcn && net.now >= warm {
                min_rate = min_rate.min(net.nodes[s].qp_congestion(a.qpn).unwrap().rate_bps);
            }
        }
    }
    let secs = (end - warm).as_secs_f64();
    let stats = net.link_stats(port);
    let mut o = Out {
        gbps: counted
            .iter()
            .map(|&c| (c * u64::from(MSG)) as f64 * 8.0 / secs / 1e9)
            .collect(),
        drops: stats.tail_drops - drops_at_warm.unwrap_or(0),
        max_queue,
        marked: stats.ecn_marked,
        retransmits: 0,
        cnps: net.nodes[rx].counters().cnp_sent,
        cuts: 0,
        min_rate: if dcqcn { min_rate } else { 0 },
    };
    for (s, (a, _)) in pairs.iter().enumerate() {
        o.retransmits += net.nodes[s].qp_counters(a.qpn).unwrap().retransmits;
        o.cuts += net.nodes[s].qp_congestion(a.qpn).unwrap().rate_cuts;
    }
    let _ = stats.packets;
    o
}

fn main() {
    let mut args = std::env::args().skip(1);
    let senders: usize = args.next().and_then(|a| a.parse().ok()).unwrap_or(3);
    let ms: u64 = args.next().and_then(|a| a.parse().ok()).unwrap_or(100);
    println!(
        "# {senders} senders → 1 receiver, 100 Gb/s links, 1 MiB queue with RED ECN marking ({}–{} KB, {} %), {ms} ms; the first 5 ms not counted (goodput, drops, queue)",
        RED.0 / 1000,
        RED.1 / 1000,
        RED.2 * 100.0
    );
    println!();
    println!("| | per-sender goodput Gb/s | total | min/max share | tail drops | max queue KiB | CE marks | CNPs | rate cuts | lowest rate Gb/s | retransmits |");
    println!("|---|---|---|---|---|---|---|---|---|---|---|");
    let runs = [
        ("no congestion control", None),
        ("DCQCN, paper parameters", Some(DcqcnParams::new(RATE))),
        (
            "DCQCN, ns-3 HPCC parameters",
            Some(DcqcnParams::ns3_hpcc(RATE)),
        ),
    ];
    for (name, cc) in runs {
        let dcqcn = cc.is_some();
        let o = run(senders, ms, cc);
        let total: f64 = o.gbps.iter().sum();
        let max = o.gbps.iter().cloned().fold(0.0, f64::max);
        let min = o.gbps.iter().cloned().fold(f64::MAX, f64::min);
        let per: Vec<String> = o.gbps.iter().map(|g| format!("{g:.2}")).collect();
        println!(
            "| {} | {} | {:.2} | {:.3} | {} | {} | {} | {} | {} | {} | {} |",
            name,
            per.join(" / "),
            total,
            min / max,
            o.drops,
            o.max_queue / 1024,
            o.marked,
            o.cnps,
            o.cuts,
            if dcqcn {
                format!("{:.2}", o.min_rate as f64 / 1e9)
            } else {
                "–".into()
            },
            o.retransmits
        );
    }
}
