//! DCQCN (issue 19) on an ECN-marking bottleneck in the simulator: two
//! senders write to one receiver through a switch port with a bounded
//! queue and RED marking. With DCQCN every packet is ECN-capable, the
//! receiver answers CE marks with CNPs, the senders cut their rates, and
//! the queue neither fills nor drops; without it the same load drops at
//! the queue's tail. (`examples/dcqcn_incast.rs` prints the figures.)

mod common;
use std::time::Duration;

use common::*;
use softrdma_engine::sim::{ecn_red, node_addr, LinkConfig, NetConfig, SimNet};
use softrdma_engine::*;
use softrdma_wire::Ecn;

const RATE: u64 = 10_000_000_000;

struct Result {
    drops_after_warm: u64,
    max_queue_after_warm: usize,
    cnps: u64,
    cuts: u64,
    completed: Vec<u64>,
    not_ect_requests: u64,
}

/// `ect`: the controller sends ECN-capable packets (DCQCN does, TIMELY not).
fn incast(cc: Option<CongestionConfig>, ect: bool) -> Result {
    let cfgs = (0..3).map(|i| {
        let mut c = EngineConfig::new(node_addr(i));
        c.seed = 77 + i as u64;
        if let Some(cc) = &cc {
            c.congestion = cc.clone();
        }
        c
    });
    let mut net = SimNet::with_configs(
        cfgs,
        5,
        NetConfig {
            delay: Duration::ZERO,
            ..NetConfig::perfect()
        },
    );
    let host = LinkConfig::ethernet(RATE, Duration::from_micros(1));
    let switch = LinkConfig {
        queue_bytes: Some(512 << 10),
        ..host
    };
    let up: Vec<_> = (0..3).map(|_| net.add_link(host)).collect();
    let down: Vec<_> = (0..3).map(|_| net.add_link(switch)).collect();
    for (a, &u) in up.iter().enumerate() {
        for (b, &d) in down.iter().enumerate().filter(|&(b, _)| b != a) {
            net.set_route(a, b, &[u, d]);
        }
    }
    net.set_ecn_hook(down[2], Some(ecn_red(5_000, 200_000, 0.01, 1)));
    let wire = sniff(&mut net);
    let o = ConnOpts {
        mtu: Mtu::Mtu4096,
        timeout: 8,
        ..ConnOpts::default()
    };
    let mut pairs = Vec::new();
    for s in 0..2 {
        let a = make_side(&mut net, s, QpType::Rc);
        let b = make_side(&mut net, 2, QpType::Rc);
        bring_up(&mut net, &a, &b, o.psn_a, o.psn_b, &o, QpType::Rc);
        bring_up(&mut net, &b, &a, o.psn_b, o.psn_a, &o, QpType::Rc);
        pairs.push((a, b));
    }
    let warm = net.now + Duration::from_millis(2);
    let end = net.now + Duration::from_millis(6);
    let (mut posted, mut done) = ([0u64; 2], [0u64; 2]);
    let mut drops_at_warm = None;
    let mut max_queue = 0;
    while net.now < end {
        for (s, (a, b)) in pairs.iter().enumerate() {
            while posted[s] - done[s] < 8 {
                let slot = posted[s] % 8;
                post_ok(
                    &mut net,
                    a,
                    write_wr(posted[s], a, slot * 65536, 65536, b, slot * 65536),
                );
                posted[s] += 1;
            }
        }
        assert!(net.step());
        for (s, (a, _)) in pairs.iter().enumerate() {
            for w in poll(&mut net, a) {
                assert_eq!(w.status, WcStatus::Success);
                done[s] += 1;
            }
        }
        if net.now >= warm {
            drops_at_warm.get_or_insert(net.link_stats(down[2]).tail_drops);
            max_queue = max_queue.max(net.queued_bytes(down[2]));
        }
    }
    // Every packet the QPs sent left ECN-capable (or CE-marked on the way).
    let not_ect_requests = wire
        .borrow()
        .iter()
        .filter(|p| p.sent() && p.ecn == Ecn::NotEct)
        .count() as u64;
    let ce_seen = wire
        .borrow()
        .iter()
        .filter(|p| !p.sent() && p.ecn == Ecn::Ce)
        .count() as u64;
    assert_eq!(ce_seen > 0, ect, "CE marks only on ECN-capable traffic");
    Result {
        drops_after_warm: net.link_stats(down[2]).tail_drops - drops_at_warm.unwrap(),
        max_queue_after_warm: max_queue,
        cnps: net.nodes[2].counters().cnp_sent,
        cuts: (0..2)
            .map(|s| {
                net.nodes[s]
                    .qp_congestion(pairs[s].0.qpn)
                    .unwrap()
                    .rate_cuts
            })
            .sum(),
        completed: done.to_vec(),
        not_ect_requests,
    }
}

#[test]
fn dcqcn_keeps_the_bottleneck_queue_short_and_lossless() {
    let without = incast(None, false);
    let with = incast(Some(CongestionConfig::dcqcn(DcqcnParams::new(RATE))), true);
    assert!(
        without.drops_after_warm > 100,
        "without: {} drops",
        without.drops_after_warm
    );
    assert!(
        without.max_queue_after_warm > 400 << 10,
        "without: queue {}",
        without.max_queue_after_warm
    );
    assert_eq!((without.cnps, without.cuts), (0, 0));
    assert_eq!(with.drops_after_warm, 0);
    assert!(
        with.max_queue_after_warm < 100 << 10,
        "with: queue {}",
        with.max_queue_after_warm
    );
    assert!(
        with.cnps > 0 && with.cuts > 0,
        "with: {} CNPs, {} cuts",
        with.cnps,
        with.cuts
    );
    // Both senders got through, within 20 % of each other.
    let (a, b) = (with.completed[0] as f64, with.completed[1] as f64);
    assert!(a.min(b) / a.max(b) > 0.8, "shares {:?}", with.completed);
    assert_eq!(with.not_ect_requests, 0, "DCQCN sends every packet ECT(0)");
    eprintln!(
        "DCQCN: queue {} B, completed {:?}; without: queue {} B, {} drops, completed {:?}",
        with.max_queue_after_warm,
        with.completed,
        without.max_queue_after_warm,
        without.drops_after_warm,
        without.completed
    );
    assert!(without.not_ect_requests > 0);
}

/// The second controller through the same seam: TIMELY, from RTTs alone,
/// on the same bottleneck (which marks nothing it sends, NotEct).
#[test]
fn timely_keeps_the_bottleneck_queue_short_without_ecn() {
    let without = incast(None, false);
    let p = TimelyParams::new(RATE, Duration::from_micros(10));
    let with = incast(Some(CongestionConfig::timely(p)), false);
    assert!(
        without.drops_after_warm > 100,
        "without: {} drops",
        without.drops_after_warm
    );
    assert_eq!(with.drops_after_warm, 0);
    assert!(
        with.max_queue_after_warm < 200 << 10,
        "with: queue {}",
        with.max_queue_after_warm
    );
    assert!(
        with.cuts > 0 && with.cnps == 0,
        "with: {} cuts, {} CNPs",
        with.cuts,
        with.cnps
    );
    let (a, b) = (with.completed[0] as f64, with.completed[1] as f64);
    assert!(a.min(b) / a.max(b) > 0.8, "shares {:?}", with.completed);
    eprintln!(
        "TIMELY: queue {} B, completed {:?}; without: queue {} B, {} drops, completed {:?}",
        with.max_queue_after_warm,
        with.completed,
        without.max_queue_after_warm,
        without.drops_after_warm,
        without.completed
    );
}
