//! Goodput under random loss, go-back-N against selective repeat, in the
//! deterministic simulator (issue 19): two engines joined by 100 Gb/s
//! links with 5 µs of delay each way (10 µs RTT), 4 KiB path MTU, one RC QP
//! streaming 64 KiB RDMA WRITEs, loss applied to every packet both ways.
//! Beside each measured figure: the analytical go-back-N efficiency
//! (1−q)/(1+(W−1)q) for the window W (in packets) and loss rate q.
//!
//! `cargo run --release -p softrdma-engine --example sr_goodput [-- WINDOW [MIB]]`
//! (defaults: a 122-packet window, 64 MiB per run).

mod common;

use std::time::Duration;

use common::{connect, side, write};

use softrdma_engine::sim::{node_addr, LinkConfig, NetConfig, SimNet};
use softrdma_engine::*;

const RATE: u64 = 100_000_000_000;
const MSG: u32 = 64 << 10;
const DEPTH: usize = 32;

struct Run {
    gbps: f64,
    retransmits: u64,
    timeouts: u64,
}

fn run(window: u32, loss: f64, sr: bool, total: u64, seed: u64) -> Run {
    let net_cfg = NetConfig {
        loss,
        delay: Duration::ZERO,
        ..NetConfig::perfect()
    };
    let cfgs = (0..2).map(|i| {
        let mut c = EngineConfig::new(node_addr(i));
        c.seed = seed * 2 + i as u64;
        c.max_inflight = window;
        c
    });
    let mut net = SimNet::with_configs(cfgs, seed, net_cfg);
    let link = LinkConfig::ethernet(RATE, Duration::from_micros(5));
    net.set_link(0, 1, link);
    net.set_link(1, 0, link);
    let now = net.now;
    let a = side(&mut net.nodes[0], 0);
    let b = side(&mut net.nodes[1], 1);
    if sr {
        let agreed = net.nodes[0]
            .query_ece(a.qpn)
            .unwrap()
            .agree(net.nodes[1].query_ece(b.qpn).unwrap());
        net.nodes[0].set_ece(a.qpn, agreed).unwrap();
        net.nodes[1].set_ece(b.qpn, agreed).unwrap();
    }
    connect(&mut net.nodes[0], now, &a, &b, 1);
    connect(&mut net.nodes[1], now, &b, &a, 0);
    let msgs = total / u64::from(MSG);
    let (mut posted, mut done) = (0u64, 0u64);
    let t0 = net.now;
    let mut wcs = Vec::new();
    while done < msgs {
        while posted < msgs && posted - done < DEPTH as u64 {
            let wr = write(posted, &a, &b, posted % 32, MSG);
            let now = net.now;
            net.nodes[0].post_send(now, a.qpn, &wr).unwrap();
            posted += 1;
        }
        if !net.step() {
            panic!("the network went idle with {} of {msgs} WRITEs done", done);
        }
        wcs.clear();
        net.nodes[0].poll_cq(a.cq, 64, &mut wcs).unwrap();
        for w in &wcs {
            assert_eq!(w.status, WcStatus::Success, "loss {loss} sr {sr}");
        }
        done += wcs.len() as u64;
        assert!(net.now - t0 < Duration::from_secs(30), "no progress");
    }
    let secs = (net.now - t0).as_secs_f64();
    let c = *net.nodes[0].qp_counters(a.qpn).unwrap();
    let _ = b.cq;
    Run {
        gbps: (msgs * u64::from(MSG)) as f64 * 8.0 / secs / 1e9,
        retransmits: c.retransmits,
        timeouts: c.timeouts,
    }
}

fn main() {
    let mut args = std::env::args().skip(1);
    let window: u32 = args.next().and_then(|a| a.parse().ok()).unwrap_or(122);
    let mib: u64 = args.next().and_then(|a| a.parse().ok()).unwrap_or(64);
    let total = mib << 20;
    let bdp = RATE as f64 * 10e-6 / 8.0 / 4096.0;
    println!(
        "# RC WRITE goodput, 100 Gb/s links, 10 µs RTT (BDP {bdp:.1} packets of 4 KiB), window {window} packets, {mib} MiB per run"
    );
    println!();
    println!("| loss | go-back-N Gb/s | GBN / lossless | formula (1−q)/(1+(W−1)q) | GBN retransmits (timeouts) | selective repeat Gb/s | SR / lossless | SR retransmits (timeouts) |");
    println!("|---|---|---|---|---|---|---|---|");
    let mut base = (0.0, 0.0);
    for (i, loss) in [0.0, 0.001, 0.01, 0.05].into_iter().enumerate() {
        let g = run(window, loss, false, total, 7);
        let s = run(window, loss, true, total, 7);
        if i == 0 {
            base = (g.gbps, s.gbps);
        }
        let w = f64::from(window);
        let formula = (1.0 - loss) / (1.0 + (w - 1.0) * loss);
        println!(
            "| {:.1} % | {:.2} | {:.3} | {:.3} | {} ({}) | {:.2} | {:.3} | {} ({}) |",
            loss * 100.0,
            g.gbps,
            g.gbps / base.0,
            formula,
            g.retransmits,
            g.timeouts,
            s.gbps,
            s.gbps / base.1,
            s.retransmits,
            s.timeouts
        );
    }
}
