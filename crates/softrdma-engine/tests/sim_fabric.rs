//! The simulator's fabric: links with a rate and a propagation delay,
//! bounded output queues with tail drop, and ECN marking
//! (`softrdma_engine::sim`'s module documentation describes the model).

mod common;
use std::time::Duration;

use common::*;
use softrdma_engine::sim::{LinkConfig, NetConfig, SimNet};
use softrdma_engine::*;
use softrdma_wire::Ecn;

const GBPS: u64 = 1_000_000_000;

fn rc_pair() -> (SimNet, Side, Side) {
    pair(7, NetConfig::perfect(), QpType::Rc, &ConnOpts::default())
}

fn delivered_to(wire: &Wire, node: usize) -> Vec<Pkt> {
    wire.borrow()
        .iter()
        .filter(|p| !p.sent() && p.to == node)
        .cloned()
        .collect()
}

fn sent_by(wire: &Wire, node: usize) -> Vec<Pkt> {
    wire.borrow()
        .iter()
        .filter(|p| p.sent() && p.from == node)
        .cloned()
        .collect()
}

/// A WRITE of several packets sent in one burst over a 1 Gb/s link with a
/// 5 µs delay: packet k arrives when the bytes of packets 0..=k are
/// serialised, plus the delay; the data arrives intact.
#[test]
fn a_rate_limited_link_delivers_at_bytes_over_rate_plus_delay() {
    let (mut net, a, b) = rc_pair();
    let cfg = LinkConfig {
        rate_bps: Some(GBPS),
        delay: Duration::from_micros(5),
        overhead: 66,
        queue_bytes: None,
    };
    net.set_link(0, 1, cfg);
    let wire = sniff(&mut net);
    let data = pattern(3, 4000);
    a.mem.write(0, &data);
    post_ok(&mut net, &a, write_wr(1, &a, 0, 4000, &b, 64));
    let w = wait_wcs(&mut net, &a, 1, LONG);
    assert_eq!(statuses(&w), vec![(1, WcStatus::Success)]);
    assert_eq!(mem(&b, 64, 4000), data);

    let sent = sent_by(&wire, 0);
    let got = delivered_to(&wire, 1);
    assert_eq!(sent.len(), 4, "4000 bytes at MTU 1024");
    assert_eq!(got.len(), sent.len());
    assert!(sent.iter().all(|p| p.now == sent[0].now), "one burst");
    let mut serialised = Duration::ZERO;
    for (s, g) in sent.iter().zip(&got) {
        assert_eq!(s.psn, g.psn, "FIFO");
        serialised += cfg.serialisation(s.bytes.len() + 66);
        assert_eq!(g.now, s.now + serialised + cfg.delay, "psn {}", s.psn);
    }
    // The ACKs go back over the default path: the network's delay alone.
    let acks = delivered_to(&wire, 0);
    let acks_sent = sent_by(&wire, 1);
    assert!(!acks.is_empty());
    for (s, g) in acks_sent.iter().zip(&acks) {
        assert_eq!(g.now, s.now + NetConfig::perfect().delay);
    }
}

/// A queue that holds two full packets drops the rest of a burst at its
/// tail, counts them, and the requester's retransmissions still deliver
/// every byte.
#[test]
fn a_bounded_queue_drops_at_its_tail_and_counts() {
    let (mut net, a, b) = rc_pair();
    let frame = 1024 + 12 + 16 + 4 + 66; // payload, BTH, RETH, ICRC, overhead
    let l = net.set_link(
        0,
        1,
        LinkConfig {
            queue_bytes: Some(2 * frame),
            ..LinkConfig::ethernet(GBPS, Duration::from_micros(2))
        },
    );
    let data = pattern(9, 16 * 1024);
    a.mem.write(0, &data);
    post_ok(&mut net, &a, write_wr(1, &a, 0, 16 * 1024, &b, 0));
    let w = wait_wcs(&mut net, &a, 1, LONG);
    assert_eq!(statuses(&w), vec![(1, WcStatus::Success)]);
    assert_eq!(mem(&b, 0, data.len()), data);

    let st = net.link_stats(l);
    assert!(st.tail_drops > 0, "{st:?}");
    assert_eq!(net.stats.tail_drops, st.tail_drops);
    assert!(st.max_queued_bytes <= 2 * frame, "{st:?}");
    let c = qp_counters(&net, &a);
    assert!(
        c.retransmits > 0,
        "the drops were recovered by retransmission: {c:?}"
    );
}

/// An ECN hook that marks CE while anything is queued ahead: the receiver
/// counts exactly the marked packets that reached it, and the tap sees the
/// mark on delivery.
#[test]
fn the_ecn_hook_marks_and_the_engine_counts_ce() {
    let (mut net, a, b) = rc_pair();
    let l = net.set_link(0, 1, LinkConfig::ethernet(GBPS, Duration::from_micros(1)));
    net.set_ecn_hook(
        l,
        Some(Box::new(
            |q| {
                if q.queued_packets > 0 {
                    Ecn::Ce
                } else {
                    q.ecn
                }
            },
        )),
    );
    let delivered_ce = std::rc::Rc::new(std::cell::Cell::new(0u64));
    let seen = delivered_ce.clone();
    net.set_tap(Some(Box::new(move |t| {
        if t.stage == softrdma_engine::sim::TapStage::Deliver && t.ecn == Ecn::Ce {
            seen.set(seen.get() + 1);
        }
        softrdma_engine::sim::Verdict::Pass
    })));
    post_ok(&mut net, &a, write_wr(1, &a, 0, 8 * 1024, &b, 0));
    let w = wait_wcs(&mut net, &a, 1, LONG);
    assert_eq!(statuses(&w), vec![(1, WcStatus::Success)]);

    let st = net.link_stats(l);
    assert_eq!(
        st.ecn_marked, 7,
        "8 packets in one burst: all but the first wait"
    );
    assert_eq!(net.stats.ecn_marked, st.ecn_marked);
    assert_eq!(delivered_ce.get(), st.ecn_marked);
    assert_eq!(net.nodes[b.node].counters().ecn_ce_rcvd, st.ecn_marked);
    assert_eq!(net.nodes[a.node].counters().ecn_ce_rcvd, 0, "ACKs unmarked");
}

/// The threshold policy marks only ECN-capable packets (softrdma sends
/// NotEct until congestion control asks for ECT): a queue over the
/// threshold leaves the engine's packets alone.
#[test]
fn threshold_marking_leaves_not_ect_packets_alone() {
    let (mut net, a, b) = rc_pair();
    let l = net.set_link(0, 1, LinkConfig::ethernet(GBPS, Duration::from_micros(1)));
    net.set_ecn_hook(l, Some(softrdma_engine::sim::ecn_threshold(0)));
    post_ok(&mut net, &a, write_wr(1, &a, 0, 8 * 1024, &b, 0));
    let w = wait_wcs(&mut net, &a, 1, LONG);
    assert_eq!(statuses(&w), vec![(1, WcStatus::Success)]);
    assert_eq!(net.link_stats(l).packets, 8);
    assert_eq!(net.link_stats(l).ecn_marked, 0);
    assert_eq!(net.nodes[b.node].counters().ecn_ce_rcvd, 0);
}

/// Two senders write to one receiver through a star: both bursts share
/// the switch's port to the receiver, which serialises every byte of both
/// (the last packet arrives no earlier than that takes), and both writes
/// land intact.
#[test]
fn incast_shares_the_switch_port_of_the_receiver() {
    let mut net = SimNet::new(3, 11, NetConfig::perfect());
    let cfg = LinkConfig::ethernet(10 * GBPS, Duration::from_micros(1));
    let star = net.star(cfg);
    let o = ConnOpts::default();
    let a = make_side(&mut net, 0, QpType::Rc);
    let c = make_side(&mut net, 2, QpType::Rc);
    let b1 = make_side(&mut net, 1, QpType::Rc);
    let b2 = make_side(&mut net, 1, QpType::Rc);
    bring_up(&mut net, &a, &b1, 1, 2, &o, QpType::Rc);
    bring_up(&mut net, &b1, &a, 2, 1, &o, QpType::Rc);
    bring_up(&mut net, &c, &b2, 3, 4, &o, QpType::Rc);
    bring_up(&mut net, &b2, &c, 4, 3, &o, QpType::Rc);
    let wire = sniff(&mut net);
    let (da, dc) = (pattern(1, 32 * 1024), pattern(2, 32 * 1024));
    a.mem.write(0, &da);
    c.mem.write(0, &dc);
    post_ok(&mut net, &a, write_wr(1, &a, 0, 32 * 1024, &b1, 0));
    post_ok(&mut net, &c, write_wr(2, &c, 0, 32 * 1024, &b2, 0));
    assert_eq!(
        statuses(&wait_wcs(&mut net, &a, 1, LONG)),
        vec![(1, WcStatus::Success)]
    );
    assert_eq!(
        statuses(&wait_wcs(&mut net, &c, 1, LONG)),
        vec![(2, WcStatus::Success)]
    );
    assert_eq!(mem(&b1, 0, da.len()), da);
    assert_eq!(mem(&b2, 0, dc.len()), dc);

    let down = net.link_stats(star.down[1]);
    let ups = [net.link_stats(star.up[0]), net.link_stats(star.up[2])];
    assert_eq!(down.packets, ups[0].packets + ups[1].packets);
    assert_eq!(down.packets, 64, "32 packets from each sender");
    assert!(down.max_queued_bytes > 0, "{down:?}");
    let got = delivered_to(&wire, 1);
    let (first, last) = (got[0].now, got[got.len() - 1].now);
    let first_bytes = got[0].bytes.len() + cfg.overhead;
    assert!(
        last - first >= cfg.serialisation(down.bytes as usize - first_bytes),
        "{:?} for {} bytes",
        last - first,
        down.bytes
    );
}
