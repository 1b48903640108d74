//! Sends by reference (`Engine::poll_transmit_gather`): payloads left in
//! regions that offer it, filled in on the way to the wire. Every scenario
//! runs twice, copying and by reference, on the same seeded network: the
//! bytes on the wire (so every ICRC), the completions and the memory at
//! both ends must be the same, and the by-reference run must really have
//! left payloads in place.

mod common;

use std::time::Duration;

use common::*;
use softrdma_engine::sim::NetConfig;
use softrdma_engine::*;
use softrdma_wire::{icrc, Endpoints};

/// What a run leaves behind.
#[derive(Debug, PartialEq)]
struct Outcome {
    wire: Vec<Vec<u8>>,
    wcs_a: Vec<(u64, WcStatus, u32)>,
    wcs_b: Vec<(u64, WcStatus, u32)>,
    mem_a: Vec<u8>,
    mem_b: Vec<u8>,
    icrc_errors: u64,
}

/// Runs `scenario` on a fresh pair (MTU 1024, so that messages take
/// several packets) and records the outcome.
fn run(
    gather: bool,
    net_cfg: NetConfig,
    scenario: impl FnOnce(&mut SimNetRef<'_>, &Side, &Side),
) -> Outcome {
    let o = ConnOpts::default();
    let (mut net, a, b) = pair_gather(42, net_cfg, QpType::Rc, &o, gather);
    a.mem.fill_from(0, &pattern(1, REGION));
    b.mem.fill_from(0, &pattern(2, REGION));
    let wire = sniff(&mut net);
    scenario(&mut SimNetRef(&mut net), &a, &b);
    let mut wcs_a = Vec::new();
    let mut wcs_b = Vec::new();
    net.run_until(Duration::from_secs(5), |net| {
        net.nodes[a.node].poll_cq(a.cq, 64, &mut wcs_a).unwrap();
        net.nodes[b.node].poll_cq(b.cq, 64, &mut wcs_b).unwrap();
        !net.is_busy()
    });
    // What the last check of the network produced.
    net.nodes[a.node].poll_cq(a.cq, 64, &mut wcs_a).unwrap();
    net.nodes[b.node].poll_cq(b.cq, 64, &mut wcs_b).unwrap();
    let sent: Vec<Vec<u8>> = wire
        .borrow()
        .iter()
        .filter(|p| p.sent())
        .map(|p| p.bytes.clone())
        .collect();
    // (Recorded as sent, before the network corrupts any.)
    for (i, p) in sent.iter().enumerate() {
        assert!(
            icrc::verify(&wire_ep(&wire, i), p).is_ok(),
            "packet {i} on the wire has a bad ICRC"
        );
    }
    let wc = |w: &WorkCompletion| (w.wr_id, w.status, w.byte_len);
    let outcome = Outcome {
        wire: sent,
        wcs_a: wcs_a.iter().map(wc).collect(),
        wcs_b: wcs_b.iter().map(wc).collect(),
        mem_a: a.mem.snapshot(),
        mem_b: b.mem.snapshot(),
        icrc_errors: net.nodes[a.node].counters().icrc_errors
            + net.nodes[b.node].counters().icrc_errors,
    };
    outcome
}

fn wire_ep(wire: &Wire, sent_index: usize) -> Endpoints {
    wire.borrow()
        .iter()
        .filter(|p| p.sent())
        .nth(sent_index)
        .map(|p| p.ep)
        .unwrap()
}

/// The network, for scenarios.
struct SimNetRef<'a>(&'a mut softrdma_engine::sim::SimNet);

/// Copying and by reference give the same outcome.
fn same_both_ways(
    net_cfg: NetConfig,
    scenario: impl Fn(&mut SimNetRef<'_>, &Side, &Side),
) -> Outcome {
    let copied = run(false, net_cfg, &scenario);
    let by_ref = run(true, net_cfg, &scenario);
    if net_cfg.corrupt == 0.0 {
        assert_eq!(copied.icrc_errors, 0);
    }
    assert_eq!(
        by_ref.wire.len(),
        copied.wire.len(),
        "same number of packets"
    );
    for (i, (x, y)) in copied.wire.iter().zip(&by_ref.wire).enumerate() {
        assert_eq!(x, y, "packet {i} differs on the wire");
    }
    assert_eq!(by_ref, copied);
    by_ref
}

#[test]
fn writes_sends_and_reads_are_byte_identical_on_the_wire() {
    let o = same_both_ways(NetConfig::perfect(), |n, a, b| {
        let net = &mut *n.0;
        // Whole MTUs, a pad, a single short packet, a zero-length WRITE.
        post_ok(net, a, write_wr(1, a, 0, 4 * 1024, b, 0x1000));
        post_ok(net, a, write_wr(2, a, 0x3000, 3 * 1024 + 1001, b, 0x8000));
        post_ok(net, a, write_wr(3, a, 0x10, 7, b, 0xF_0000));
        post_ok(net, a, write_wr(4, a, 0, 0, b, 0));
        // Two SGEs: the packet that straddles them is copied.
        let mut w = write_wr(5, a, 0x4_0000, 1500, b, 0x4_0000);
        w.sg_list.push(sge(a, 0x5_0000, 1700));
        post_ok(net, a, w);
        // Inline data is always copied.
        post_ok(
            net,
            a,
            with_flags(write_wr(6, a, 0x100, 40, b, 0x6_0000), SendFlags::INLINE),
        );
        // A SEND into a posted receive, and a READ (its responses are copied).
        recv(net, b, 70, 0x9_0000, 4096);
        post_ok(net, a, send_wr(7, a, 0x7_0000, 2500));
        post_ok(net, a, read_wr(8, a, 0xA_0000, 3000, b, 0xB_0000));
    });
    assert_eq!(o.wcs_a.len(), 8);
    assert!(o.wcs_a.iter().all(|w| w.1 == WcStatus::Success));
    assert_eq!(
        o.mem_b[0x8000..0x8000 + 4073],
        pattern(1, REGION)[0x3000..0x3000 + 4073]
    );
}

#[test]
fn retransmissions_after_loss_are_byte_identical() {
    let mut cfg = NetConfig::perfect();
    cfg.loss = 0.05;
    cfg.duplicate = 0.02;
    cfg.corrupt = 0.02;
    same_both_ways(cfg, |n, a, b| {
        let net = &mut *n.0;
        for i in 0..8u64 {
            post_ok(
                net,
                a,
                write_wr(i, a, i * 0x8000, 20_000 + i as u32, b, i * 0x8000),
            );
        }
    });
}

/// Errors come out as with copies: a bad local key, and a second SGE
/// beyond its region after a first one that is sent by reference.
#[test]
fn local_errors_complete_the_same_way() {
    let o = same_both_ways(NetConfig::perfect(), |n, a, b| {
        let net = &mut *n.0;
        post_ok(net, a, write_wr(1, a, 0, 2048, b, 0));
        let mut w = write_wr(2, a, 0, 3000, b, 0x1000);
        w.sg_list[0].lkey = Lkey::from_raw(w.sg_list[0].lkey.raw() ^ 0x5555);
        post_ok(net, a, w);
    });
    assert_eq!(o.wcs_a[0].1, WcStatus::Success);
    assert_eq!(o.wcs_a[1].1, WcStatus::LocProtErr);
    let o = same_both_ways(NetConfig::perfect(), |n, a, b| {
        let net = &mut *n.0;
        let mut w = write_wr(1, a, 0, 2048, b, 0);
        w.sg_list.push(sge(a, REGION as u64 - 100, 1000));
        post_ok(net, a, w);
    });
    assert_eq!(o.wcs_a[0].1, WcStatus::LocProtErr);
}

/// The by-reference run really leaves payloads in the regions: the packet
/// as built has the payload's bytes missing (still whatever was in the
/// buffer), until `copy_payload` fills them in.
#[test]
fn payloads_are_left_in_place_and_copy_payload_fills_them() {
    let o = ConnOpts::default();
    let (mut net, a, b) = pair_gather(7, NetConfig::perfect(), QpType::Rc, &o, true);
    a.mem.fill_from(0, &pattern(9, 8192));
    let now = net.now;
    net.nodes[a.node]
        .post_send(now, a.qpn, &write_wr(1, &a, 0x100, 3000, &b, 0))
        .unwrap();
    let mut seen = 0;
    let mut buf = vec![0xEEu8; 9000];
    while let Some(t) = net.nodes[a.node].poll_transmit_gather(now, &mut buf) {
        let p = t
            .payload
            .expect("a WRITE packet with a payload sent by reference");
        assert_eq!(p.addr, VEC_MEMORY_TX_BASE + 0x100 + seen * 1024);
        assert_eq!(p.region_offset, 0x100 + seen * 1024);
        assert!(buf[p.offset..p.offset + p.len].iter().all(|&x| x == 0xEE));
        assert!(icrc::verify(&t.endpoints, &buf[..t.len]).is_err());
        assert!(net.nodes[a.node].copy_payload(&t, &mut buf));
        assert_eq!(
            &buf[p.offset..p.offset + p.len],
            &pattern(9, 8192)[p.region_offset..p.region_offset + p.len]
        );
        icrc::verify(&t.endpoints, &buf[..t.len]).unwrap();
        buf.fill(0xEE);
        seen += 1;
    }
    assert_eq!(seen, 3);
}
